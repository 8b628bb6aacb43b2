// pagedkv/device/kv_dtype.hpp: the element types of the KV cache (fp16, bf16, and the FP8 formats
// E4M3 / E5M2 with their scale modes) and the 16-bit types' host-side conversions to and from
// float.
//
// fp16 and bf16 are 16-bit; on the host they are carried as their raw bits (std::uint16_t), so the
// core library needs no CUDA header. The FP8 types are 1-byte codes whose value needs a scale
// (KVScaleMode; conversions and scales in pagedkv/device/fp8.hpp). Queries and attention outputs
// are always 16-bit: an FP8 cache is read by kernels whose q and out are fp16 or bf16.
// The numeric values of KVDtype and KVScaleMode are part of the tiers' value header: never
// renumber them. Conversions are pure functions: float -> 16-bit rounds to
// nearest, ties to even (IEEE 754 default, the same as __float2half_rn / __float2bfloat16_rn),
// overflows to infinity, keeps the sign of zero and maps NaN to a quiet NaN. 16-bit -> float is
// exact. Complexity O(1), no allocation, no errors; any number of threads may call them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pagedkv {

enum class KVDtype : std::uint8_t {
  kFloat16 = 0,   // IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits
  kBFloat16 = 1,  // bfloat16: 1 sign, 8 exponent, 7 mantissa bits (the top half of a float)
  kFp8E4M3 = 2,   // OCP FP8 E4M3FN codes (1 byte), with a scale (pagedkv/device/fp8.hpp)
  kFp8E5M2 = 3,   // OCP FP8 E5M2 codes (1 byte), with a scale
};

// How an FP8 cache's values are scaled (value = decode(code) x scale).
enum class KVScaleMode : std::uint8_t {
  kNone = 0,          // no scale: a 16-bit cache (fp16 / bf16)
  kPerTensor = 1,     // one float32 scale per layer for K and one for V, given by the engine
                      // (vLLM's k_scale / v_scale)
  kPerTokenHead = 2,  // one float32 scale per (token, KV head) row of K and of V, computed by
                      // kv_append (amax / fp8 max) and stored in the block (kv_layout.hpp)
};

// "fp16", "bf16", "fp8_e4m3" or "fp8_e5m2".
std::string_view to_string(KVDtype dtype) noexcept;
// "none", "per_tensor" or "per_token_head".
std::string_view to_string(KVScaleMode mode) noexcept;
// The inverse of to_string; false (and `out` untouched) for any other name.
bool parse_kv_dtype(std::string_view name, KVDtype& out) noexcept;
bool parse_kv_scale_mode(std::string_view name, KVScaleMode& out) noexcept;

constexpr bool is_fp8(KVDtype dtype) noexcept {
  return dtype == KVDtype::kFp8E4M3 || dtype == KVDtype::kFp8E5M2;
}

// Bytes of one cached value: 2 for fp16 and bf16, 1 for the FP8 types (scales not included).
constexpr std::size_t bytes_per_value(KVDtype dtype) noexcept {
  return is_fp8(dtype) ? 1 : 2;
}

// Throws pagedkv::Error (kInvalidArgument) naming `who` unless the pair is a cache format: a
// 16-bit dtype with kNone, or an FP8 dtype with kPerTensor or kPerTokenHead (and known values).
void validate_kv_format(KVDtype dtype, KVScaleMode mode, std::string_view who);

float fp16_bits_to_float(std::uint16_t bits) noexcept;
std::uint16_t float_to_fp16_bits(float value) noexcept;
float bf16_bits_to_float(std::uint16_t bits) noexcept;
std::uint16_t float_to_bf16_bits(float value) noexcept;

// Dispatch on a 16-bit dtype (fp16, or bf16 for any other value; FP8 codes go through fp8.hpp).
inline float dtype_bits_to_float(KVDtype dtype, std::uint16_t bits) noexcept {
  return dtype == KVDtype::kFloat16 ? fp16_bits_to_float(bits) : bf16_bits_to_float(bits);
}
inline std::uint16_t float_to_dtype_bits(KVDtype dtype, float value) noexcept {
  return dtype == KVDtype::kFloat16 ? float_to_fp16_bits(value) : float_to_bf16_bits(value);
}

}  // namespace pagedkv
