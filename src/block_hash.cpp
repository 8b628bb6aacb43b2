#include "pagedkv/block_hash.hpp"

#include <string>

#include "pagedkv/error.hpp"
#include "pagedkv/version.hpp"

namespace pagedkv {

std::string_view version() noexcept { return PAGEDKV_VERSION_STRING; }

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kInvalidState: return "invalid state";
    case ErrorCode::kParseError: return "parse error";
    case ErrorCode::kDeviceError: return "device error";
  }
  return "unknown error";
}

void BlockHash::throw_bad_size(std::size_t size) {
  throw Error(ErrorCode::kInvalidArgument,
              "BlockHash: a digest has 16 or 32 bytes, got " + std::to_string(size));
}

namespace {
int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

BlockHash BlockHash::from_hex(std::string_view hex) {
  if (hex.size() != 32 && hex.size() != 64) {
    throw Error(ErrorCode::kParseError, "BlockHash::from_hex: expected 32 or 64 hex characters, got " +
                                            std::to_string(hex.size()));
  }
  std::array<std::uint8_t, kMaxSize> bytes{};
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = hex_value(hex[i]);
    const int lo = hex_value(hex[i + 1]);
    if (hi < 0 || lo < 0) {
      throw Error(ErrorCode::kParseError, "BlockHash::from_hex: character " +
                                              std::to_string(hi < 0 ? i : i + 1) +
                                              " is not a hex digit in '" + std::string(hex) + "'");
    }
    bytes[i / 2] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return BlockHash(std::span<const std::uint8_t>(bytes.data(), hex.size() / 2));
}

std::string BlockHash::to_hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * size_, '\0');
  for (std::size_t i = 0; i < size_; ++i) {
    out[2 * i] = kDigits[bytes_[i] >> 4];
    out[2 * i + 1] = kDigits[bytes_[i] & 0xf];
  }
  return out;
}

std::uint64_t BlockHash::event_id() const noexcept {
  std::uint64_t v = 0;
  if (size_ < 8) return 0;
  for (std::size_t i = size_ - 8; i < size_; ++i) v = (v << 8) | bytes_[i];
  return v;
}

}  // namespace pagedkv
