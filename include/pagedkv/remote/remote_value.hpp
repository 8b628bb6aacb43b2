// pagedkv/remote/remote_value.hpp: the bytes of one block as a remote store holds them, for every
// store backend (Redis, a disk store): the same header, encoded and checked by the functions here.
//
// A value is a fixed 144-byte header followed by the block's payload (its K/V bytes, as the
// engine's host slot holds them). All header fields are little-endian:
//   offset   0  u32 magic               "PKVB" (0x42564b50)
//   offset   4  u16 format version      kRemoteValueVersion (3)
//   offset   6  u16 header size         144 (readers reject any other)
//   offset   8  u64 layout fingerprint  the engine's (see layout_fingerprint())
//   offset  16  u64 payload length      bytes that follow the header
//   offset  24  u64 checksum            xxh3_64 of the payload, seeded with xxh3_64 of the
//                                       header with this field zeroed: covers every header
//                                       byte (the binding included) and the payload
//   offset  32  u8  block hash size     16 or 32 (the binding: the block this value holds)
//   offset  33  u8  parent hash size    0 (a chain's block 0), 16 or 32
//   offset  34  u8  KV-cache group
//   offset  35  u8  prefix identity size  0 (none: SHA-256 chained hashes) or 32
//   offset  36  u8  KV dtype            the numeric value of pagedkv::KVDtype (the KV format)
//   offset  37  u8  KV scale mode       0 none (16-bit), 1 per tensor, 2 per (token, head)
//   offset  38  2 bytes reserved        0
//   offset  40  32 bytes block hash     the key's block hash, zero-padded
//   offset  72  32 bytes parent hash    the previous block's chained hash, zero-padded
//   offset 104  32 bytes prefix identity  SHA-256 identity of the block's whole prefix (itself
//                                       included), zero-padded; see below
//   offset 136  u64 reserved            0
//
// Binding. A value is bound to the block it holds (RemoteValueBinding): the block hash it is
// stored under, the parent's chained hash, the KV-cache group and, when the block hashes are not
// collision resistant (xxh3_128), the verified identity of the block's whole prefix: a SHA-256
// chain over the tokens and extra keys of every block up to it (TieredKVCacheManager's prefix
// identity, the one its host hits compare). A reader checks the binding against the key it asked
// for, so a genuine value under another block's key (copied there by anyone with write access to
// the namespace, by a bug, or stored under a colliding xxh3_128 hash by another prefix) is
// rejected: kBindingMismatch, a miss. With SHA-256 chained hashes the block hash already
// identifies the block's tokens, extra keys and whole prefix; the identity is then empty (size
// 0). The checksum is not a MAC: the binding defends against misplaced values, not against a
// writer forging headers on purpose (keep such writers out with Redis ACLs, see
// redis_store.hpp).
//
// KV format. The dtype and scale mode of the payload (from the remote tier's configuration;
// default bf16, no scales): a value of another format is kFormatMismatch, a miss, never loaded.
//
// A value whose magic, version, header size, fingerprint, length, format, binding or checksum
// does not match what the reader expects is rejected: it is a miss, and its bytes are never
// handed to the engine. Values of format versions 1 (40-byte header, no binding) and 2 (112-byte
// header, no prefix identity or KV format) are rejected as kBadVersion.
//
// Complexity: encoding and checking are O(payload) (one xxh3_64 pass over the payload, plus one
// over the 144-byte header); the binding check itself is a compare of 100 bytes.
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
inline constexpr std::uint16_t kRemoteValueVersion = 3;
inline constexpr std::size_t kRemoteValueHeaderSize = 144;
// The binding's bytes in the header: sizes, group and KV format (8 bytes), block hash, parent
// hash, prefix identity.
inline constexpr std::size_t kRemoteValueBindingOffset = 32;
inline constexpr std::size_t kRemoteValueBindingSize = 104;
// KV scale modes (the header's byte 37): the numeric values of pagedkv::KVScaleMode
// (device/kv_dtype.hpp, a layer this one cannot include).
inline constexpr std::uint8_t kKVScaleNone = 0;          // 16-bit KV, no scales
inline constexpr std::uint8_t kKVScalePerTensor = 1;     // one scale per tensor
inline constexpr std::uint8_t kKVScalePerTokenHead = 2;  // a scale per (token, head)
// The numeric value of pagedkv::KVDtype::kBFloat16 (device/kv_dtype.hpp; this layer cannot
// include it): the default KV dtype of a value.
inline constexpr std::uint8_t kKVDtypeBFloat16Value = 1;

using RemoteValueHeader = std::array<std::byte, kRemoteValueHeaderSize>;

// The block a value holds (see the file comment). `block` is the key's hash, never empty.
struct RemoteValueBinding {
  BlockHash block{};
  BlockHash parent{};  // empty for a chain's block 0
  GroupId group = 0;
  // SHA-256 identity of the block's whole prefix (32 bytes), or empty when the block hash is
  // collision resistant (see the file comment).
  BlockHash identity{};
  // The payload's KV format (not part of the block's identity: a mismatch is kFormatMismatch).
  std::uint8_t kv_dtype = kKVDtypeBFloat16Value;
  std::uint8_t kv_scale_mode = kKVScaleNone;

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
  kFormatMismatch,       // the payload's KV dtype or scale mode is not the reader's
  kBindingMismatch,      // a value of another block (block hash, parent hash, group or prefix
                         // identity differ)
  kChecksumMismatch,     // header or payload bytes differ from those written
};

std::string_view to_string(RemoteValueCheck check) noexcept;

// Checks a whole value (header + payload) against the reader's fingerprint, the payload size it
// expects and the block it asked for. On kOk the payload is value.subspan(kRemoteValueHeaderSize).
RemoteValueCheck check_remote_value(std::span<const std::byte> value, std::uint64_t fingerprint,
                                    std::size_t expected_payload,
                                    const RemoteValueBinding& expected) noexcept;
// The same check of a value whose header (kRemoteValueHeaderSize bytes; any other size is
// kTooShort) and payload lie in separate buffers (e.g. read by one preadv into two).
RemoteValueCheck check_remote_value(std::span<const std::byte> header,
                                    std::span<const std::byte> payload, std::uint64_t fingerprint,
                                    std::size_t expected_payload,
                                    const RemoteValueBinding& expected) noexcept;

}  // namespace pagedkv
