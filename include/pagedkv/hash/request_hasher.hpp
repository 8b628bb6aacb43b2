// pagedkv/hash/request_hasher.hpp: the block hashes of a growing token sequence, each computed once.
//
// A RequestBlockHasher owns a request's token ids and the chained hashes of its full blocks. As
// tokens are appended (the prompt, then decoded tokens) every block is hashed exactly once, at the
// moment it becomes full; the partial tail block is never hashed. Appending a prompt in one call or
// one token at a time gives identical hashes.
//
// Extra keys per block follow vLLM: the LoRA name on every block; each multimodal item that
// overlaps the block, as (identifier, item offset - block start); the cache salt on block 0 only.
//
// Complexity: append() is O(tokens appended + blocks completed x block size); amortized O(1)
// memory growth. Thread-compatible. Errors: the constructor and append() throw pagedkv::Error
// before changing anything (block size 0, a malformed or unsorted multimodal item, an empty salt or
// LoRA name, a negative token id).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <string>
#include <vector>

#include "pagedkv/hash/block_hash.hpp"
#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/hash/block_sequence.hpp"

namespace pagedkv {

// A multimodal item's placeholder tokens in the request: [offset, offset + length).
struct MultiModalItem {
  std::string identifier;   // e.g. the content hash of an image; must not be empty
  std::int64_t offset = 0;  // first placeholder token, >= 0
  std::int64_t length = 0;  // number of placeholder tokens, > 0
};

// Everything besides the tokens that a request's block hashes depend on.
struct RequestHashKeys {
  std::optional<std::string> lora_name;   // absent: no LoRA adapter
  std::optional<std::string> cache_salt;  // absent: the shared namespace
  std::vector<MultiModalItem> mm_items;   // sorted by offset, non-overlapping
};

// The extra keys of block `block_index` of a request hashed at `block_size` (vLLM's rule, see
// the file comment). The returned views point into `keys` and `scratch`.
BlockExtraKeys block_extra_keys(const RequestHashKeys& keys, std::size_t block_index,
                                std::uint32_t block_size, std::vector<MultiModalKey>& scratch);

// A request's tokens and full-block hashes, and the source of its blocks' extra keys.
class RequestBlockHasher final : public BlockExtraKeySource {
 public:
  // Validates block_size (>= 1) and keys; see the file comment.
  RequestBlockHasher(BlockHasher hasher, std::uint32_t block_size, RequestHashKeys keys = {});

  // Appends tokens and hashes every block they complete. Strong guarantee: on an exception
  // (invalid token id, or bad_alloc) nothing was appended.
  void append(std::span<const TokenId> tokens);
  void append(TokenId token) { append(std::span<const TokenId>(&token, 1)); }

  std::span<const TokenId> tokens() const noexcept { return tokens_; }
  std::size_t num_tokens() const noexcept { return tokens_.size(); }
  // One hash per full block, block i covering tokens [i * block_size, (i + 1) * block_size).
  std::span<const BlockHash> block_hashes() const noexcept { return block_hashes_; }
  std::uint32_t block_size() const noexcept { return block_size_; }
  const BlockHasher& hasher() const noexcept { return hasher_; }
  const RequestHashKeys& keys() const noexcept { return keys_; }

  // The extra keys of block `block_index`, as hash_block() receives them. The returned views point
  // into this object's keys and `scratch`, and live as long as both.
  BlockExtraKeys block_extra_keys(std::size_t block_index,
                                  std::vector<MultiModalKey>& scratch) const {
    return pagedkv::block_extra_keys(keys_, block_index, block_size_, scratch);
  }
  // The key material of the full blocks, as the block pool takes it (a view of this object).
  BlockSequence sequence() const noexcept {
    const bool any_keys = keys_.lora_name || keys_.cache_salt || !keys_.mm_items.empty();
    return BlockSequence{block_size_, tokens_, block_hashes_, any_keys ? this : nullptr};
  }

  // BlockExtraKeySource: vLLM's rule (see the file comment) at any block size.
  bool has_extra_keys(std::size_t block_index) const noexcept override {
    return keys_.lora_name || !keys_.mm_items.empty() || (block_index == 0 && keys_.cache_salt);
  }
  BlockExtraKeys block_extra_keys(std::size_t block_index, std::uint32_t block_size,
                                  std::vector<MultiModalKey>& scratch) const override {
    return pagedkv::block_extra_keys(keys_, block_index, block_size, scratch);
  }
  std::optional<std::string_view> lora_name() const noexcept override {
    if (!keys_.lora_name) return std::nullopt;
    return std::string_view(*keys_.lora_name);
  }

 private:
  BlockHasher hasher_;
  std::uint32_t block_size_;
  RequestHashKeys keys_;
  std::vector<TokenId> tokens_;
  std::vector<BlockHash> block_hashes_;
  std::vector<MultiModalKey> mm_scratch_;  // reused per block: no allocation in steady state
};

// One-shot form: the hashes of every full block of `tokens`.
std::vector<BlockHash> hash_request_blocks(const BlockHasher& hasher, std::uint32_t block_size,
                                           std::span<const TokenId> tokens,
                                           const RequestHashKeys& keys = {});

}  // namespace pagedkv
