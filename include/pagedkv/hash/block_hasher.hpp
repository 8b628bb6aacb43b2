// pagedkv/hash/block_hasher.hpp: chained block hashing, H(parent hash, block tokens, extra keys).
//
// A BlockHasher is a scheme plus its NONE_HASH (the parent of block 0, derived from a seed). It is
// a small value type: copy it freely. hash_block() is a pure function of its arguments; any number
// of threads may call it on the same hasher at once.
//
// Schemes (see docs/hashing.md):
//   sha256_cbor_vllm  canonical CBOR of [parent, [tokens], extra keys or null], SHA-256;
//   byte-identical
//                     to vLLM's `sha256_cbor`. NONE_HASH = SHA-256(CBOR text string of the seed),
//                     which is what vLLM computes with PYTHONHASHSEED set to that string.
//                     Default seed: "vllm-none-hash".
//   sha256 (default)  pagedkv's canonical encoding with typed, length-prefixed extra keys, so a
//   LoRA
//                     name, a multimodal identifier and a cache salt can never be confused;
//                     SHA-256.
//   xxh3_128          the same encoding hashed with XXH3-128 (fast; not collision resistant).
//   For sha256 and xxh3_128 the engine should set a seed when several processes must agree on
//   hashes (routing, shared stores); without one, each hasher draws a random seed.
//
// Complexity: O(block size + extra key bytes) per block, no heap allocation for blocks that
// serialize to at most 4 KiB. Errors: pagedkv::Error before any work on bad input (empty salt or
// LoRA name, empty multimodal identifier, negative token id, parent of the wrong digest size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/hash/block_hash.hpp"

namespace pagedkv {

// Token ids are 32-bit and non-negative.
using TokenId = std::int32_t;

enum class HashScheme : std::uint8_t {
  kSha256,          // "sha256"
  kSha256CborVllm,  // "sha256_cbor_vllm"
  kXxh3_128,        // "xxh3_128"
};

std::string_view to_string(HashScheme scheme) noexcept;
// Parses "sha256", "sha256_cbor_vllm" or "xxh3_128". Throws pagedkv::Error (kParseError).
HashScheme parse_hash_scheme(std::string_view name);
// 32 for the SHA-256 schemes, 16 for XXH3-128.
std::size_t digest_size(HashScheme scheme) noexcept;

// A multimodal item as it enters one block's key: its identifier (e.g. the hash of an image) and
// where it starts relative to the block's first token (negative when it began in an earlier block).
struct MultiModalKey {
  std::string_view identifier;
  std::int64_t offset = 0;
};

// The extra keys of one block, in vLLM's order: LoRA name, multimodal items, cache salt.
// std::nullopt means "absent"; a present value must not be empty.
struct BlockExtraKeys {
  std::optional<std::string_view> lora_name;
  std::span<const MultiModalKey> mm_items;
  std::optional<std::string_view> cache_salt;  // only ever set for block 0

  bool empty() const noexcept { return !lora_name && mm_items.empty() && !cache_salt; }
};

class BlockHasher {
 public:
  // vLLM's newest default NONE_HASH seed.
  static constexpr std::string_view kVllmDefaultSeed = "vllm-none-hash";

  // Throws pagedkv::Error (kInvalidArgument) for an empty seed. Without a seed: kSha256CborVllm
  // uses kVllmDefaultSeed; kSha256 and kXxh3_128 draw a random one (std::random_device).
  explicit BlockHasher(HashScheme scheme = HashScheme::kSha256,
                       std::optional<std::string_view> seed = std::nullopt);

  HashScheme scheme() const noexcept { return scheme_; }
  // Whether equal block hashes prove equal prefixes (up to SHA-256 collisions): true for the
  // SHA-256 schemes, false for xxh3_128 and for weak_for_testing hashers.
  bool collision_resistant() const noexcept {
    return scheme_ != HashScheme::kXxh3_128 && weak_bits_ == 0;
  }
  // Whether this is a weak_for_testing hasher (digests cut to a few bits: collisions on purpose).
  bool weak() const noexcept { return weak_bits_ != 0; }
  std::size_t digest_size() const noexcept { return none_hash_.size(); }
  // The parent hash of block 0.
  const BlockHash& none_hash() const noexcept { return none_hash_; }

  // The hash of one full block. `parent` is none_hash() for block 0, else the previous block's
  // hash. Throws pagedkv::Error on invalid input (see the file comment); nothing else.
  BlockHash hash_block(const BlockHash& parent, std::span<const TokenId> tokens,
                       const BlockExtraKeys& extra = {}) const;

  // The exact bytes hash_block() feeds to the digest: for tests, tools and benchmarks that compare
  // against the raw digest of the same bytes. Same validation as hash_block().
  std::vector<std::uint8_t> encode_block(const BlockHash& parent, std::span<const TokenId> tokens,
                                         const BlockExtraKeys& extra = {}) const;

  // FOR TESTS ONLY: a hasher whose block digests keep just `bits` (1..8) bits of the real digest
  // (the rest zero), so distinct blocks collide constantly. It exists to prove that cache lookups
  // verify stored key material and never return a wrong hit. Never use it to serve requests.
  static BlockHasher weak_for_testing(HashScheme scheme, std::string_view seed, int bits);

  bool operator==(const BlockHasher& other) const noexcept {
    return scheme_ == other.scheme_ && none_hash_ == other.none_hash_ &&
           weak_bits_ == other.weak_bits_;
  }

 private:
  friend class RequestBlockHasher;  // validates a whole append once, then hashes its blocks
  BlockHash hash_block_impl(const BlockHash& parent, std::span<const TokenId> tokens,
                            const BlockExtraKeys& extra, bool tokens_checked) const;

  HashScheme scheme_;
  BlockHash none_hash_;
  std::uint8_t weak_bits_ = 0;  // 0: full digests (always, outside tests)
};

// The canonical typed encoding of one block's extra keys (the tail of the `sha256` scheme's block
// encoding): key count, then each key as tag, length and bytes. Empty keys encode to "" (no
// bytes), so two key sets are equal iff their encodings are. Replaces the contents of `out`.
void encode_extra_keys(const BlockExtraKeys& extra, std::string& out);

// Free-function form of BlockHasher::hash_block; `parent == nullptr` means block 0.
BlockHash hash_block_tokens(const BlockHasher& hasher, const BlockHash* parent,
                            std::span<const TokenId> tokens, const BlockExtraKeys& extra = {});

// The raw digest of `bytes` under `scheme` (SHA-256 or XXH3-128, canonical big-endian form).
// Throws pagedkv::Error (kInvalidArgument) for a scheme outside the enum.
BlockHash raw_digest(HashScheme scheme, std::span<const std::uint8_t> bytes);

}  // namespace pagedkv
