// pagedkv/hash/block_hash.hpp: the digest that names a full block of tokens and its whole prefix.
//
// A BlockHash is a fixed-size value type: 32 bytes for the SHA-256 schemes, 16 for XXH3-128, or
// empty (size 0, "no hash"). It is trivially copyable, compares bytewise (size first), and hashes
// through std::hash by its leading 8 bytes, which are uniformly distributed for every scheme.
//
// Complexity: every operation is O(digest size). Thread-compatible: const calls may run
// concurrently. Errors: constructors and from_hex throw pagedkv::Error on a bad size or bad hex.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace pagedkv {

class BlockHash {
 public:
  static constexpr std::size_t kMaxSize = 32;

  // The empty hash: size() == 0. Blocks that are not full (or not yet cached) carry it.
  constexpr BlockHash() noexcept = default;

  // Copies a 16- or 32-byte digest. Throws pagedkv::Error (kInvalidArgument) on any other size.
  explicit BlockHash(std::span<const std::uint8_t> digest) {
    if (digest.size() != 16 && digest.size() != 32) throw_bad_size(digest.size());
    std::memcpy(bytes_.data(), digest.data(), digest.size());
    size_ = static_cast<std::uint8_t>(digest.size());
  }

  // Parses 32 or 64 lowercase or uppercase hex characters. Throws pagedkv::Error (kParseError).
  static BlockHash from_hex(std::string_view hex);

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  std::span<const std::uint8_t> bytes() const noexcept { return {bytes_.data(), size_}; }
  // All kMaxSize bytes: the digest, then zeros (for fixed-size copies and compares).
  std::span<const std::uint8_t, kMaxSize> padded_bytes() const noexcept { return bytes_; }

  // Lowercase hex, two characters per byte; "" for the empty hash.
  std::string to_hex() const;

  // vLLM's 64-bit form used in KV events: the last 8 bytes read big-endian, unsigned.
  // 0 for the empty hash.
  std::uint64_t event_id() const noexcept;

  // A well-mixed machine word for hash tables: the leading 8 bytes (native order).
  std::size_t hash_code() const noexcept {
    std::uint64_t word = 0;
    std::memcpy(&word, bytes_.data(), sizeof(word));
    return static_cast<std::size_t>(word ^ size_);
  }

  // Both compare all kMaxSize bytes (a constant size, inlined as a few word compares): bytes
  // past size() are zero in every BlockHash, so equal sizes make the extra bytes equal.
  friend bool operator==(const BlockHash& a, const BlockHash& b) noexcept {
    return a.size_ == b.size_ && std::memcmp(a.bytes_.data(), b.bytes_.data(), kMaxSize) == 0;
  }
  friend std::strong_ordering operator<=>(const BlockHash& a, const BlockHash& b) noexcept {
    if (a.size_ != b.size_) return a.size_ <=> b.size_;
    const int c = std::memcmp(a.bytes_.data(), b.bytes_.data(), kMaxSize);
    return c <=> 0;
  }

 private:
  [[noreturn]] static void throw_bad_size(std::size_t size);

  // Unused trailing bytes stay zero, so hash_code() is well defined for 16-byte digests too.
  std::array<std::uint8_t, kMaxSize> bytes_{};
  std::uint8_t size_ = 0;  // 0, 16 or 32
};

}  // namespace pagedkv

template <>
struct std::hash<pagedkv::BlockHash> {
  std::size_t operator()(const pagedkv::BlockHash& h) const noexcept { return h.hash_code(); }
};
