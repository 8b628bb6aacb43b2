// pagedkv/device/kv_dtype.hpp: the element types of the KV cache (fp16, bf16) and their host-side
// conversions to and from float.
//
// Both types are 16-bit; on the host they are carried as their raw bits (std::uint16_t), so the
// core library needs no CUDA header. Conversions are pure functions: float -> 16-bit rounds to
// nearest, ties to even (IEEE 754 default, the same as __float2half_rn / __float2bfloat16_rn),
// overflows to infinity, keeps the sign of zero and maps NaN to a quiet NaN. 16-bit -> float is
// exact. Complexity O(1), no allocation, no errors; any number of threads may call them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pagedkv {

enum class KVDtype : std::uint8_t {
  kFloat16,   // IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits
  kBFloat16,  // bfloat16: 1 sign, 8 exponent, 7 mantissa bits (the top half of a float)
};

// "fp16" or "bf16".
std::string_view to_string(KVDtype dtype) noexcept;

// Bytes of one cached value: 2 for both types.
constexpr std::size_t bytes_per_value(KVDtype /*dtype*/) noexcept {
  return 2;
}

float fp16_bits_to_float(std::uint16_t bits) noexcept;
std::uint16_t float_to_fp16_bits(float value) noexcept;
float bf16_bits_to_float(std::uint16_t bits) noexcept;
std::uint16_t float_to_bf16_bits(float value) noexcept;

// Dispatch on the dtype.
inline float dtype_bits_to_float(KVDtype dtype, std::uint16_t bits) noexcept {
  return dtype == KVDtype::kFloat16 ? fp16_bits_to_float(bits) : bf16_bits_to_float(bits);
}
inline std::uint16_t float_to_dtype_bits(KVDtype dtype, float value) noexcept {
  return dtype == KVDtype::kFloat16 ? float_to_fp16_bits(value) : float_to_bf16_bits(value);
}

}  // namespace pagedkv
