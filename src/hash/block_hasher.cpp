#include "pagedkv/hash/block_hasher.hpp"

#include <array>
#include <bit>
#include <cstring>
#include <random>
#include <string>

#include "pagedkv/base/error.hpp"

// The low-level SHA-256 interface is deprecated in OpenSSL 3 in favour of EVP, but EVP's
// per-call init costs more than hashing a 100-byte block with SHA-NI; the low-level calls run the
// same assembly. Suppress the deprecation in this file only.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pagedkv {

std::string_view to_string(HashScheme scheme) noexcept {
  switch (scheme) {
    case HashScheme::kSha256:
      return "sha256";
    case HashScheme::kSha256CborVllm:
      return "sha256_cbor_vllm";
    case HashScheme::kXxh3_128:
      return "xxh3_128";
  }
  return "unknown";
}

HashScheme parse_hash_scheme(std::string_view name) {
  if (name == "sha256") return HashScheme::kSha256;
  if (name == "sha256_cbor_vllm") return HashScheme::kSha256CborVllm;
  if (name == "xxh3_128") return HashScheme::kXxh3_128;
  throw Error(ErrorCode::kParseError, "unknown hash scheme '" + std::string(name) +
                                          "' (expected sha256, sha256_cbor_vllm or xxh3_128)");
}

std::size_t digest_size(HashScheme scheme) noexcept {
  return scheme == HashScheme::kXxh3_128 ? 16 : 32;
}

namespace {

// Serialized blocks up to this size are built on the stack; larger ones (block sizes in the
// hundreds with long extra keys) fall back to one heap buffer.
constexpr std::size_t kStackBytes = 4096;
// Blocks with no extra keys and at most this many tokens always fit kStackBytes (5 bytes/token).
constexpr std::size_t kFastPathTokens = (kStackBytes - 64) / 5;

// Tags of pagedkv's own encoding. Every extra key is typed and length-prefixed, so no two
// different key sets serialize to the same bytes.
enum : std::uint8_t { kTagLora = 1, kTagMultiModal = 2, kTagSalt = 3 };
constexpr std::string_view kNoneHashDomain = "pagedkv-none-hash-v1";

class Writer {
 public:
  explicit Writer(std::uint8_t* out) noexcept : begin_(out), p_(out) {}
  void byte(std::uint8_t b) noexcept { *p_++ = b; }
  void bytes(const void* data, std::size_t n) noexcept {
    if (n != 0) std::memcpy(p_, data, n);
    p_ += n;
  }
  // bytes() for the sizes of the common block (16- or 32-byte parent digests, 16 tokens): a
  // copy of constant size compiles to a few vector moves, where a variable-size one may become
  // `rep movs` with its start-up cost.
  void common_bytes(const void* data, std::size_t n) noexcept {
    switch (n) {
      case 16:
        std::memcpy(p_, data, 16);
        break;
      case 32:
        std::memcpy(p_, data, 32);
        break;
      case 64:
        std::memcpy(p_, data, 64);
        break;
      default:
        if (n != 0) std::memcpy(p_, data, n);
    }
    p_ += n;
  }
  template <typename T>
  void le(T v) noexcept {
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(p_, &v, sizeof(T));
      p_ += sizeof(T);
    } else {
      for (std::size_t i = 0; i < sizeof(T); ++i) byte(static_cast<std::uint8_t>(v >> (8 * i)));
    }
  }
  void le32(std::uint32_t v) noexcept { le(v); }
  void le64(std::uint64_t v) noexcept { le(v); }
  void be(std::uint64_t v, int n) noexcept {
    for (int i = n - 1; i >= 0; --i) byte(static_cast<std::uint8_t>(v >> (8 * i)));
  }
  // CBOR head: major type in the top 3 bits, argument in shortest form (RFC 8949 3.1).
  void cbor_head(std::uint8_t major, std::uint64_t arg) noexcept {
    const auto m = static_cast<std::uint8_t>(major << 5);
    if (arg < 24) {
      byte(static_cast<std::uint8_t>(m | arg));
    } else if (arg <= 0xff) {
      byte(m | 24);
      be(arg, 1);
    } else if (arg <= 0xffff) {
      byte(m | 25);
      be(arg, 2);
    } else if (arg <= 0xffffffffu) {
      byte(m | 26);
      be(arg, 4);
    } else {
      byte(m | 27);
      be(arg, 8);
    }
  }
  void cbor_int(std::int64_t v) noexcept {
    if (v >= 0) {
      cbor_head(0, static_cast<std::uint64_t>(v));
    } else {
      cbor_head(1, static_cast<std::uint64_t>(-(v + 1)));
    }
  }
  void cbor_text(std::string_view s) noexcept {
    cbor_head(3, s.size());
    bytes(s.data(), s.size());
  }
  std::size_t size() const noexcept { return static_cast<std::size_t>(p_ - begin_); }

 private:
  std::uint8_t* begin_;
  std::uint8_t* p_;
};

void validate_extra(const BlockExtraKeys& extra);

void validate(const BlockHasher& hasher, const BlockHash& parent, std::span<const TokenId> tokens,
              const BlockExtraKeys& extra, bool tokens_checked = false) {
  if (parent.size() != hasher.digest_size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "hash_block: parent hash has " + std::to_string(parent.size()) +
                    " bytes, but scheme " + std::string(to_string(hasher.scheme())) + " makes " +
                    std::to_string(hasher.digest_size()) + "-byte digests");
  }
  if (tokens.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "hash_block: a block has at least one token");
  }
  if (tokens_checked) return validate_extra(extra);
  // Branch-free scan first (vectorizes); the per-token search runs only to name the culprit.
  std::uint32_t sign_bits = 0;
  for (const TokenId t : tokens) sign_bits |= static_cast<std::uint32_t>(t);
  if ((sign_bits >> 31) == 0) return validate_extra(extra);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "hash_block: token id " + std::to_string(tokens[i]) + " at position " +
                      std::to_string(i) + " is negative; token ids are non-negative 32-bit");
    }
  }
}

void validate_extra(const BlockExtraKeys& extra) {
  if (extra.lora_name && extra.lora_name->empty()) {
    throw Error(ErrorCode::kInvalidArgument, "hash_block: LoRA name is present but empty");
  }
  if (extra.cache_salt && extra.cache_salt->empty()) {
    throw Error(ErrorCode::kInvalidArgument, "hash_block: cache_salt is present but empty");
  }
  for (std::size_t i = 0; i < extra.mm_items.size(); ++i) {
    if (extra.mm_items[i].identifier.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "hash_block: multimodal item " + std::to_string(i) + " has an empty identifier");
    }
  }
}

std::size_t encoded_bound(HashScheme scheme, std::span<const TokenId> tokens,
                          const BlockExtraKeys& extra) noexcept {
  // Generous for both encodings: 9-byte heads/prefixes everywhere, 5 bytes per token.
  std::size_t n = 16 + BlockHash::kMaxSize + 9 + 5 * tokens.size() + 9;
  if (extra.lora_name) n += 9 + extra.lora_name->size();
  if (extra.cache_salt) n += 9 + extra.cache_salt->size();
  for (const MultiModalKey& mm : extra.mm_items) n += 1 + 9 + mm.identifier.size() + 9;
  (void)scheme;
  return n;
}

// vLLM's sha256_cbor input: cbor2.dumps((parent, tuple(tokens), extra_keys or None),
// canonical=True).
std::size_t encode_cbor_vllm(Writer& w, const BlockHash& parent, std::span<const TokenId> tokens,
                             const BlockExtraKeys& extra) noexcept {
  w.byte(0x83);
  w.cbor_head(2, parent.size());
  w.common_bytes(parent.bytes().data(), parent.size());
  w.cbor_head(4, tokens.size());
  for (const TokenId t : tokens) w.cbor_head(0, static_cast<std::uint32_t>(t));
  if (extra.empty()) {
    w.byte(0xf6);
  } else {
    const std::size_t count =
        (extra.lora_name ? 1 : 0) + extra.mm_items.size() + (extra.cache_salt ? 1 : 0);
    w.cbor_head(4, count);
    if (extra.lora_name) w.cbor_text(*extra.lora_name);
    for (const MultiModalKey& mm : extra.mm_items) {
      w.byte(0x82);
      w.cbor_text(mm.identifier);
      w.cbor_int(mm.offset);
    }
    if (extra.cache_salt) w.cbor_text(*extra.cache_salt);
  }
  return w.size();
}

void encode_canonical_keys(Writer& w, const BlockExtraKeys& extra) noexcept;

// pagedkv's canonical encoding (schemes sha256 and xxh3_128):
//   parent digest | u32le token count | u32le tokens | u32le key count | keys
//   key = u8 tag | u32le byte length | bytes [| i64le offset, multimodal only]
std::size_t encode_canonical(Writer& w, const BlockHash& parent, std::span<const TokenId> tokens,
                             const BlockExtraKeys& extra) noexcept {
  w.common_bytes(parent.bytes().data(), parent.size());
  w.le32(static_cast<std::uint32_t>(tokens.size()));
  if constexpr (std::endian::native == std::endian::little) {
    w.common_bytes(tokens.data(), tokens.size_bytes());
  } else {
    for (const TokenId t : tokens) w.le32(static_cast<std::uint32_t>(t));
  }
  if (extra.empty()) {
    w.le32(0);  // the common case: no extra keys
  } else {
    encode_canonical_keys(w, extra);
  }
  return w.size();
}

void encode_canonical_keys(Writer& w, const BlockExtraKeys& extra) noexcept {
  const std::size_t count =
      (extra.lora_name ? 1 : 0) + extra.mm_items.size() + (extra.cache_salt ? 1 : 0);
  w.le32(static_cast<std::uint32_t>(count));
  auto key = [&w](std::uint8_t tag, std::string_view value) {
    w.byte(tag);
    w.le32(static_cast<std::uint32_t>(value.size()));
    w.bytes(value.data(), value.size());
  };
  if (extra.lora_name) key(kTagLora, *extra.lora_name);
  for (const MultiModalKey& mm : extra.mm_items) {
    key(kTagMultiModal, mm.identifier);
    w.le64(static_cast<std::uint64_t>(mm.offset));
  }
  if (extra.cache_salt) key(kTagSalt, *extra.cache_salt);
}

std::size_t encode(HashScheme scheme, std::uint8_t* out, const BlockHash& parent,
                   std::span<const TokenId> tokens, const BlockExtraKeys& extra) noexcept {
  Writer w(out);
  return scheme == HashScheme::kSha256CborVllm ? encode_cbor_vllm(w, parent, tokens, extra)
                                               : encode_canonical(w, parent, tokens, extra);
}

BlockHash digest(HashScheme scheme, const std::uint8_t* data, std::size_t size) {
  if (scheme == HashScheme::kXxh3_128) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits(data, size));
    return BlockHash(std::span<const std::uint8_t>(canonical.digest, 16));
  }
  std::array<std::uint8_t, SHA256_DIGEST_LENGTH> md;
  SHA256_CTX ctx;
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, data, size);
  SHA256_Final(md.data(), &ctx);
  return BlockHash(md);
}

// xxh3_128 of a block without extra keys on a little-endian machine: the same bytes as
// encode_canonical() (16-byte parent | u32 count | tokens | u32 0), laid out with fixed-size
// copies in the common case (16 tokens) and hashed in one XXH3 pass.
BlockHash xxh3_no_extra_keys(const BlockHash& parent, std::span<const TokenId> tokens) noexcept {
  constexpr std::size_t kCommon = 16;  // the usual block size
  alignas(16) std::uint8_t buf[16 + 4 + 4 * kFastPathTokens + 4];
  std::memcpy(buf, parent.bytes().data(), 16);
  const auto count = static_cast<std::uint32_t>(tokens.size());
  std::memcpy(buf + 16, &count, 4);
  if (tokens.size() == kCommon) {
#if defined(__SSE2__)
    // Four 16-byte moves: GCC 12 compiles this 64-byte memcpy (to offset 20) to `rep movsl`,
    // whose start-up cost was about 4 ns of a 31 ns block hash (bench_hash, BM_HashBlock).
    const auto* from = reinterpret_cast<const __m128i*>(tokens.data());
    auto* to = reinterpret_cast<__m128i*>(buf + 20);
    for (int k = 0; k < 4; ++k) _mm_storeu_si128(to + k, _mm_loadu_si128(from + k));
#else
    std::memcpy(buf + 20, tokens.data(), kCommon * sizeof(TokenId));
#endif
  } else {
    std::memcpy(buf + 20, tokens.data(), tokens.size_bytes());
  }
  const std::size_t n = 20 + tokens.size_bytes();
  std::memset(buf + n, 0, 4);
  const XXH128_hash_t h = XXH3_128bits(buf, n + 4);
  // XXH128_canonicalFromHash: high half then low half, each big-endian.
  std::array<std::uint8_t, 16> digest;
  const std::uint64_t hi = __builtin_bswap64(h.high64), lo = __builtin_bswap64(h.low64);
  std::memcpy(digest.data(), &hi, 8);
  std::memcpy(digest.data() + 8, &lo, 8);
  return BlockHash(std::span<const std::uint8_t>(digest));
}

// Test-only digest weakening (BlockHasher::weak_for_testing); a no-op when bits == 0.
BlockHash weaken(const BlockHash& h, std::uint8_t bits) {
  if (bits == 0) return h;
  std::array<std::uint8_t, BlockHash::kMaxSize> bytes{};
  bytes[0] = static_cast<std::uint8_t>(h.bytes()[0] & ((1u << bits) - 1));
  return BlockHash(std::span<const std::uint8_t>(bytes.data(), h.size()));
}

// A scheme cast from an int outside the enum: refused, never hashed as some default.
void check_scheme(HashScheme scheme, const char* where) {
  if (scheme != HashScheme::kSha256 && scheme != HashScheme::kSha256CborVllm &&
      scheme != HashScheme::kXxh3_128) [[unlikely]] {
    throw Error(ErrorCode::kInvalidArgument, std::string(where) + ": unknown hash scheme value " +
                                                 std::to_string(static_cast<int>(scheme)));
  }
}

std::string random_seed() {
  std::random_device device;
  std::string seed;
  for (int i = 0; i < 8; ++i) {
    const std::uint32_t word = device();
    static constexpr char kDigits[] = "0123456789abcdef";
    for (int nibble = 7; nibble >= 0; --nibble)
      seed.push_back(kDigits[(word >> (4 * nibble)) & 0xf]);
  }
  return seed;
}

}  // namespace

BlockHasher::BlockHasher(HashScheme scheme, std::optional<std::string_view> seed)
    : scheme_(scheme) {
  if (seed && seed->empty()) {
    throw Error(ErrorCode::kInvalidArgument, "BlockHasher: the seed is present but empty");
  }
  check_scheme(scheme, "BlockHasher");
  std::vector<std::uint8_t> buf;
  if (scheme == HashScheme::kSha256CborVllm) {
    // vLLM: NONE_HASH = sha256_cbor(seed string) when PYTHONHASHSEED is set to the seed.
    const std::string_view s = seed ? *seed : kVllmDefaultSeed;
    buf.resize(9 + s.size());
    Writer w(buf.data());
    w.cbor_text(s);
    buf.resize(w.size());
  } else {
    const std::string owned = seed ? std::string(*seed) : random_seed();
    buf.resize(kNoneHashDomain.size() + 4 + owned.size());
    Writer w(buf.data());
    w.bytes(kNoneHashDomain.data(), kNoneHashDomain.size());
    w.le32(static_cast<std::uint32_t>(owned.size()));
    w.bytes(owned.data(), owned.size());
  }
  none_hash_ = digest(scheme, buf.data(), buf.size());
}

BlockHash BlockHasher::hash_block(const BlockHash& parent, std::span<const TokenId> tokens,
                                  const BlockExtraKeys& extra) const {
  return hash_block_impl(parent, tokens, extra, /*tokens_checked=*/false);
}

BlockHash BlockHasher::hash_block_impl(const BlockHash& parent, std::span<const TokenId> tokens,
                                       const BlockExtraKeys& extra, bool tokens_checked) const {
  if (weak_bits_ != 0) [[unlikely]] {  // tests only: the full digest, then weakened
    BlockHasher full = *this;
    full.weak_bits_ = 0;
    return weaken(full.hash_block_impl(parent, tokens, extra, tokens_checked), weak_bits_);
  }
  // Fast path for the common block (no extra keys, fits the stack buffer): the token sign check
  // is one vectorizable OR over the tokens instead of a separate validation pass, and none at
  // all when the caller has checked the tokens already.
  if (extra.empty() && !tokens.empty() && tokens.size() <= kFastPathTokens &&
      parent.size() == none_hash_.size()) {
    std::uint32_t sign_bits = 0;
    if (!tokens_checked) {
      for (const TokenId t : tokens) sign_bits |= static_cast<std::uint32_t>(t);
    }
    if ((sign_bits >> 31) == 0) {
      if constexpr (std::endian::native == std::endian::little) {
        if (scheme_ == HashScheme::kXxh3_128) return xxh3_no_extra_keys(parent, tokens);
      }
      std::array<std::uint8_t, kStackBytes> buf;  // uninitialized on purpose: fully overwritten
      const std::size_t n = encode(scheme_, buf.data(), parent, tokens, extra);
      return digest(scheme_, buf.data(), n);
    }
  }
  validate(*this, parent, tokens, extra, tokens_checked);
  const std::size_t bound = encoded_bound(scheme_, tokens, extra);
  if (bound <= kStackBytes) {
    std::array<std::uint8_t, kStackBytes> buf;  // uninitialized on purpose: fully overwritten
    const std::size_t n = encode(scheme_, buf.data(), parent, tokens, extra);
    return digest(scheme_, buf.data(), n);
  }
  std::vector<std::uint8_t> buf(bound);
  const std::size_t n = encode(scheme_, buf.data(), parent, tokens, extra);
  return digest(scheme_, buf.data(), n);
}

std::vector<std::uint8_t> BlockHasher::encode_block(const BlockHash& parent,
                                                    std::span<const TokenId> tokens,
                                                    const BlockExtraKeys& extra) const {
  validate(*this, parent, tokens, extra);
  std::vector<std::uint8_t> buf(encoded_bound(scheme_, tokens, extra));
  buf.resize(encode(scheme_, buf.data(), parent, tokens, extra));
  return buf;
}

BlockHasher BlockHasher::weak_for_testing(HashScheme scheme, std::string_view seed, int bits) {
  if (bits < 1 || bits > 8) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockHasher::weak_for_testing: bits must be 1..8, got " + std::to_string(bits));
  }
  BlockHasher hasher(scheme, seed);
  hasher.weak_bits_ = static_cast<std::uint8_t>(bits);
  return hasher;
}

void encode_extra_keys(const BlockExtraKeys& extra, std::string& out) {
  out.clear();
  if (extra.empty()) return;
  validate_extra(extra);
  std::size_t bound = 4 + (extra.lora_name ? 5 + extra.lora_name->size() : 0) +
                      (extra.cache_salt ? 5 + extra.cache_salt->size() : 0);
  for (const MultiModalKey& mm : extra.mm_items) bound += 13 + mm.identifier.size();
  out.resize(bound);
  Writer w(reinterpret_cast<std::uint8_t*>(out.data()));
  encode_canonical_keys(w, extra);
  out.resize(w.size());
}

BlockHash hash_block_tokens(const BlockHasher& hasher, const BlockHash* parent,
                            std::span<const TokenId> tokens, const BlockExtraKeys& extra) {
  return hasher.hash_block(parent != nullptr ? *parent : hasher.none_hash(), tokens, extra);
}

BlockHash raw_digest(HashScheme scheme, std::span<const std::uint8_t> bytes) {
  check_scheme(scheme, "raw_digest");
  return digest(scheme, bytes.data(), bytes.size());
}

}  // namespace pagedkv
