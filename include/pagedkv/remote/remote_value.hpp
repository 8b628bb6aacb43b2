// pagedkv/remote/remote_value.hpp: the bytes of one block as a remote store holds them.
//
// A value is a fixed 40-byte header followed by the block's payload (its K/V bytes, as the engine's
// host slot holds them). All header fields are little-endian:
//   offset  0  u32 magic            "PKVB" (0x42564b50)
//   offset  4  u16 format version   kRemoteValueVersion
//   offset  6  u16 header size      40 (readers reject any other)
//   offset  8  u64 layout fingerprint  the engine's (see layout_fingerprint())
//   offset 16  u64 payload length   bytes that follow the header
//   offset 24  u64 payload checksum xxh3_64 of the payload, seed 0
//   offset 32  u64 reserved         0
// A value whose magic, version, header size, fingerprint, length or checksum does not match what
// the reader expects is rejected: it is a miss, and its bytes are never handed to the engine.
//
// Complexity: encoding and checking are O(payload) (one xxh3_64 pass). Thread-safe: free functions
// without state. Errors: none thrown; check_remote_value reports what did not match.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace pagedkv {

inline constexpr std::uint32_t kRemoteValueMagic = 0x42564b50;  // "PKVB" little-endian
inline constexpr std::uint16_t kRemoteValueVersion = 1;
inline constexpr std::size_t kRemoteValueHeaderSize = 40;

using RemoteValueHeader = std::array<std::byte, kRemoteValueHeaderSize>;

// xxh3_64 (seed 0) of bytes: the payload checksum.
std::uint64_t remote_checksum(std::span<const std::byte> bytes) noexcept;

// A 64-bit fingerprint of a layout description the engine writes out (model, KV dtype, layout,
// block size, tensor-parallel rank...): xxh3_64 of the text. Readers and writers that do not agree
// on it never exchange bytes, even under the same namespace.
std::uint64_t layout_fingerprint(std::string_view description) noexcept;

// The header for a payload (computes its checksum).
RemoteValueHeader encode_remote_value_header(std::uint64_t fingerprint,
                                             std::span<const std::byte> payload) noexcept;

enum class RemoteValueCheck : std::uint8_t {
  kOk,
  kTooShort,             // fewer bytes than a header
  kBadMagic,             // not a pagedkv value
  kBadVersion,           // another format version or header size
  kFingerprintMismatch,  // written by an engine with another layout
  kLengthMismatch,       // payload length is not the header's, or not the expected block size
  kChecksumMismatch,     // payload bytes differ from those written
};

std::string_view to_string(RemoteValueCheck check) noexcept;

// Checks a whole value (header + payload) against the reader's fingerprint and the payload size
// it expects. On kOk the payload is value.subspan(kRemoteValueHeaderSize).
RemoteValueCheck check_remote_value(std::span<const std::byte> value, std::uint64_t fingerprint,
                                    std::size_t expected_payload) noexcept;

}  // namespace pagedkv
