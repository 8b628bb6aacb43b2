#include "pagedkv/remote/remote_value.hpp"

#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "payload_checksum.hpp"

namespace pagedkv {
namespace {

void put_le(std::byte* at, std::uint64_t value, int bytes) noexcept {
  for (int i = 0; i < bytes; ++i) at[i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
}

std::uint64_t get_le(const std::byte* at, int bytes) noexcept {
  std::uint64_t value = 0;
  for (int i = 0; i < bytes; ++i)
    value |= std::uint64_t(std::to_integer<std::uint8_t>(at[i])) << (8 * i);
  return value;
}

// Offsets in the header (remote_value.hpp).
constexpr std::size_t kDtypeAt = 36;
constexpr std::size_t kScaleAt = 37;
constexpr std::size_t kReserved16At = 38;
constexpr std::size_t kReserved64At = 136;

// The binding's bytes (header offsets 32 .. 136), the KV format included.
void encode_binding(std::byte* at, const RemoteValueBinding& b) noexcept {
  std::memset(at, 0, kRemoteValueBindingSize);
  at[0] = static_cast<std::byte>(b.block.size());
  at[1] = static_cast<std::byte>(b.parent.size());
  at[2] = static_cast<std::byte>(b.group);
  at[3] = static_cast<std::byte>(b.identity.size());
  at[kDtypeAt - kRemoteValueBindingOffset] = static_cast<std::byte>(b.kv_dtype);
  at[kScaleAt - kRemoteValueBindingOffset] = static_cast<std::byte>(b.kv_scale_mode);
  std::memcpy(at + 8, b.block.padded_bytes().data(), BlockHash::kMaxSize);
  std::memcpy(at + 8 + BlockHash::kMaxSize, b.parent.padded_bytes().data(), BlockHash::kMaxSize);
  std::memcpy(at + 8 + 2 * BlockHash::kMaxSize, b.identity.padded_bytes().data(),
              BlockHash::kMaxSize);
}

// The checksum's seed: xxh3_64 of the header with its checksum field zeroed.
std::uint64_t header_seed(const std::byte* header) noexcept {
  RemoteValueHeader h;
  std::memcpy(h.data(), header, kRemoteValueHeaderSize);
  std::memset(h.data() + 24, 0, 8);
  return XXH3_64bits(h.data(), h.size());
}

}  // namespace

std::uint64_t remote_checksum(std::span<const std::byte> bytes) noexcept {
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::uint64_t layout_fingerprint(std::string_view description) noexcept {
  return XXH3_64bits(description.data(), description.size());
}

RemoteValueHeader encode_remote_value_header(std::uint64_t fingerprint,
                                             const RemoteValueBinding& binding,
                                             std::span<const std::byte> payload) noexcept {
  RemoteValueHeader h{};
  put_le(h.data() + 0, kRemoteValueMagic, 4);
  put_le(h.data() + 4, kRemoteValueVersion, 2);
  put_le(h.data() + 6, kRemoteValueHeaderSize, 2);
  put_le(h.data() + 8, fingerprint, 8);
  put_le(h.data() + 16, payload.size(), 8);
  encode_binding(h.data() + kRemoteValueBindingOffset, binding);
  const std::uint64_t seed = header_seed(h.data());
  put_le(h.data() + 24, remote_detail::payload_checksum(payload.data(), payload.size(), seed), 8);
  return h;
}

std::string_view to_string(RemoteValueCheck check) noexcept {
  switch (check) {
    case RemoteValueCheck::kOk:
      return "ok";
    case RemoteValueCheck::kTooShort:
      return "too_short";
    case RemoteValueCheck::kBadMagic:
      return "bad_magic";
    case RemoteValueCheck::kBadVersion:
      return "bad_version";
    case RemoteValueCheck::kFingerprintMismatch:
      return "fingerprint_mismatch";
    case RemoteValueCheck::kLengthMismatch:
      return "length_mismatch";
    case RemoteValueCheck::kFormatMismatch:
      return "format_mismatch";
    case RemoteValueCheck::kBindingMismatch:
      return "binding_mismatch";
    case RemoteValueCheck::kChecksumMismatch:
      return "checksum_mismatch";
  }
  return "unknown";
}

RemoteValueCheck check_remote_value(std::span<const std::byte> value, std::uint64_t fingerprint,
                                    std::size_t expected_payload,
                                    const RemoteValueBinding& expected) noexcept {
  if (value.size() < kRemoteValueHeaderSize) return RemoteValueCheck::kTooShort;
  return check_remote_value(value.first(kRemoteValueHeaderSize),
                            value.subspan(kRemoteValueHeaderSize), fingerprint, expected_payload,
                            expected);
}

RemoteValueCheck check_remote_value(std::span<const std::byte> header,
                                    std::span<const std::byte> payload, std::uint64_t fingerprint,
                                    std::size_t expected_payload,
                                    const RemoteValueBinding& expected) noexcept {
  if (header.size() != kRemoteValueHeaderSize) return RemoteValueCheck::kTooShort;
  const std::byte* h = header.data();
  if (get_le(h, 4) != kRemoteValueMagic) return RemoteValueCheck::kBadMagic;
  if (get_le(h + 4, 2) != kRemoteValueVersion || get_le(h + 6, 2) != kRemoteValueHeaderSize ||
      get_le(h + kReserved16At, 2) != 0 || get_le(h + kReserved64At, 8) != 0) {
    return RemoteValueCheck::kBadVersion;
  }
  if (get_le(h + 8, 8) != fingerprint) return RemoteValueCheck::kFingerprintMismatch;
  const std::uint64_t length = get_le(h + 16, 8);
  if (length != payload.size() || length != expected_payload) {
    return RemoteValueCheck::kLengthMismatch;
  }
  // The KV format, then the binding: a compare of 100 bytes against the block asked for (the
  // format bytes and the reserved ones, checked above, left out).
  if (get_le(h + kDtypeAt, 1) != expected.kv_dtype ||
      get_le(h + kScaleAt, 1) != expected.kv_scale_mode) {
    return RemoteValueCheck::kFormatMismatch;
  }
  std::array<std::byte, kRemoteValueBindingSize> want;
  encode_binding(want.data(), expected);
  const std::byte* got = h + kRemoteValueBindingOffset;
  if (std::memcmp(got, want.data(), 4) != 0 ||
      std::memcmp(got + 8, want.data() + 8, want.size() - 8) != 0) {
    return RemoteValueCheck::kBindingMismatch;
  }
  if (get_le(h + 24, 8) !=
      remote_detail::payload_checksum(payload.data(), payload.size(), header_seed(h))) {
    return RemoteValueCheck::kChecksumMismatch;
  }
  return RemoteValueCheck::kOk;
}

}  // namespace pagedkv
