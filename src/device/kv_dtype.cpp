#include "pagedkv/device/kv_dtype.hpp"

#include <bit>
#include <cstdint>
#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

std::string_view to_string(KVDtype dtype) noexcept {
  switch (dtype) {
    case KVDtype::kFloat16:
      return "fp16";
    case KVDtype::kBFloat16:
      return "bf16";
    case KVDtype::kFp8E4M3:
      return "fp8_e4m3";
    case KVDtype::kFp8E5M2:
      return "fp8_e5m2";
  }
  return "unknown";
}

std::string_view to_string(KVScaleMode mode) noexcept {
  switch (mode) {
    case KVScaleMode::kNone:
      return "none";
    case KVScaleMode::kPerTensor:
      return "per_tensor";
    case KVScaleMode::kPerTokenHead:
      return "per_token_head";
  }
  return "unknown";
}

bool parse_kv_dtype(std::string_view name, KVDtype& out) noexcept {
  for (const KVDtype d :
       {KVDtype::kFloat16, KVDtype::kBFloat16, KVDtype::kFp8E4M3, KVDtype::kFp8E5M2}) {
    if (name == to_string(d)) {
      out = d;
      return true;
    }
  }
  return false;
}

bool parse_kv_scale_mode(std::string_view name, KVScaleMode& out) noexcept {
  for (const KVScaleMode m :
       {KVScaleMode::kNone, KVScaleMode::kPerTensor, KVScaleMode::kPerTokenHead}) {
    if (name == to_string(m)) {
      out = m;
      return true;
    }
  }
  return false;
}

void validate_kv_format(KVDtype dtype, KVScaleMode mode, std::string_view who) {
  const auto fail = [&](const std::string& message) {
    throw Error(ErrorCode::kInvalidArgument, std::string(who) + ": " + message);
  };
  const auto d = static_cast<unsigned>(dtype);
  const auto m = static_cast<unsigned>(mode);
  if (d > static_cast<unsigned>(KVDtype::kFp8E5M2)) fail("unknown KV dtype " + std::to_string(d));
  if (m > static_cast<unsigned>(KVScaleMode::kPerTokenHead)) {
    fail("unknown KV scale mode " + std::to_string(m));
  }
  if (is_fp8(dtype) && mode == KVScaleMode::kNone) {
    fail(std::string(to_string(dtype)) + " needs a scale mode (per_tensor or per_token_head)");
  }
  if (!is_fp8(dtype) && mode != KVScaleMode::kNone) {
    fail(std::string(to_string(dtype)) + " takes no scale mode, got " +
         std::string(to_string(mode)));
  }
}

float fp16_bits_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) {
    // Infinity, or NaN with its payload kept and the quiet bit set.
    const std::uint32_t nan_bits = mantissa != 0 ? (0x400000u | (mantissa << 13)) : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | nan_bits);
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

std::uint16_t float_to_fp16_bits(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  const std::uint32_t mantissa = magnitude & 0x7fffffu;
  if (exponent >= 16) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow, infinity
  if (exponent >= -14) {
    // Normal: keep 10 mantissa bits, round the 13 dropped ones to nearest even. A carry out of
    // the mantissa correctly bumps the exponent (up to infinity).
    std::uint32_t half = (static_cast<std::uint32_t>(exponent + 15) << 10) | (mantissa >> 13);
    const std::uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u) != 0)) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  if (exponent < -25) return sign;  // below half the smallest subnormal: rounds to zero
  // Subnormal result: the value is m * 2^(exponent - 23) with the implicit bit in m; in units
  // of 2^-24 that is m >> shift with shift = -(exponent + 1), in 14..24.
  const std::uint32_t m = mantissa | 0x800000u;
  const int shift = -(exponent + 1);
  std::uint32_t half = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (half & 1u) != 0)) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

float bf16_bits_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t float_to_bf16_bits(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // NaN stays NaN (quiet)
  }
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

}  // namespace pagedkv
