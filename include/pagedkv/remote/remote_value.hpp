// pagedkv/remote/remote_value.hpp: the bytes of one block as a remote store holds them, for every
// store backend (Redis, a disk store): the same header, encoded and checked by the functions here.
//
// A value is a fixed 112-byte header followed by the block's payload (its K/V bytes, as the
// engine's host slot holds them). All header fields are little-endian:
//   offset   0  u32 magic               "PKVB" (0x42564b50)
//   offset   4  u16 format version      kRemoteValueVersion (2)
//   offset   6  u16 header size         112 (readers reject any other)
//   offset   8  u64 layout fingerprint  the engine's (see layout_fingerprint())
//   offset  16  u64 payload length      bytes that follow the header
//   offset  24  u64 checksum            xxh3_64 of the payload, seeded with xxh3_64 of the
//                                       header with this field zeroed: covers every header
//                                       byte (the binding included) and the payload
//   offset  32  u8  block hash size     16 or 32 (the binding: the block this value holds)
//   offset  33  u8  parent hash size    0 (a chain's block 0), 16 or 32
//   offset  34  u8  KV-cache group
//   offset  35  5 bytes reserved        0
//   offset  40  32 bytes block hash     the key's block hash, zero-padded
//   offset  72  32 bytes parent hash    the previous block's chained hash, zero-padded
//   offset 104  u64 reserved            0
//
// Binding. A value is bound to the block it holds (RemoteValueBinding): the block hash it is
// stored under, the verified identity of its prefix - the parent's chained hash, which the host
// tier compares on every host hit - and the KV-cache group. A reader checks the binding against
// the key it asked for, so a genuine value under another block's key (copied there by anyone
// with write access to the namespace, or by a bug) is rejected: kBindingMismatch, a miss. The
// remote tier runs only with collision-resistant (SHA-256) chained hashes, where the block hash
// already identifies the block's tokens, extra keys and whole prefix; the parent hash and group
// repeat what the host tier checks, at no measurable cost. The checksum is not a MAC: the binding
// defends against misplaced values, not against a writer forging headers on purpose (keep such
// writers out with Redis ACLs, see redis_store.hpp).
//
// A value whose magic, version, header size, fingerprint, length, binding or checksum does not
// match what the reader expects is rejected: it is a miss, and its bytes are never handed to the
// engine. Values of format version 1 (40-byte header, no binding) are rejected as kBadVersion.
//
// Complexity: encoding and checking are O(payload) (one xxh3_64 pass over the payload, plus one
// over the 112-byte header); the binding check itself is a compare of 72 bytes (nine words).
// Thread-safe: free functions without state. Errors: none thrown; check_remote_value reports what
// did not match.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "pagedkv/hash/block_hash.hpp"
#include "pagedkv/pool/kv_cache_block.hpp"

namespace pagedkv {

inline constexpr std::uint32_t kRemoteValueMagic = 0x42564b50;  // "PKVB" little-endian
inline constexpr std::uint16_t kRemoteValueVersion = 2;
inline constexpr std::size_t kRemoteValueHeaderSize = 112;
// The binding's bytes in the header: sizes and group (8 bytes), block hash, parent hash.
inline constexpr std::size_t kRemoteValueBindingOffset = 32;
inline constexpr std::size_t kRemoteValueBindingSize = 72;

using RemoteValueHeader = std::array<std::byte, kRemoteValueHeaderSize>;

// The block a value holds (see the file comment). `block` is the key's hash, never empty.
struct RemoteValueBinding {
  BlockHash block{};
  BlockHash parent{};  // empty for a chain's block 0
  GroupId group = 0;

  friend bool operator==(const RemoteValueBinding&, const RemoteValueBinding&) = default;
};

// xxh3_64 (seed 0) of bytes.
std::uint64_t remote_checksum(std::span<const std::byte> bytes) noexcept;

// A 64-bit fingerprint of a layout description the engine writes out (model, KV dtype, layout,
// block size, tensor-parallel rank...): xxh3_64 of the text. Readers and writers that do not agree
// on it never exchange bytes, even under the same namespace.
std::uint64_t layout_fingerprint(std::string_view description) noexcept;

// The header for a payload bound to `binding` (computes its checksum).
RemoteValueHeader encode_remote_value_header(std::uint64_t fingerprint,
                                             const RemoteValueBinding& binding,
                                             std::span<const std::byte> payload) noexcept;

enum class RemoteValueCheck : std::uint8_t {
  kOk,
  kTooShort,             // fewer bytes than a header
  kBadMagic,             // not a pagedkv value
  kBadVersion,           // another format version or header size, or reserved bytes not zero
  kFingerprintMismatch,  // written by an engine with another layout
  kLengthMismatch,       // payload length is not the header's, or not the expected block size
  kBindingMismatch,      // a value of another block (block hash, parent hash or group differ)
  kChecksumMismatch,     // header or payload bytes differ from those written
};

std::string_view to_string(RemoteValueCheck check) noexcept;

// Checks a whole value (header + payload) against the reader's fingerprint, the payload size it
// expects and the block it asked for. On kOk the payload is value.subspan(kRemoteValueHeaderSize).
RemoteValueCheck check_remote_value(std::span<const std::byte> value, std::uint64_t fingerprint,
                                    std::size_t expected_payload,
                                    const RemoteValueBinding& expected) noexcept;

}  // namespace pagedkv
