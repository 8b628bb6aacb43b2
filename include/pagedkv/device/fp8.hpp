// pagedkv/device/fp8.hpp: exact FP8 conversions for the KV cache (OCP FP8 E4M3FN and E5M2) and
// the two scale modes, as one contract the CPU reference and the CUDA kernels share.
//
// Contract. Every function here is a pure, inline function of its arguments, callable from host
// code and, when the header is compiled by nvcc, from device code (__host__ __device__): no
// allocation, no global state, no errors (noexcept; bad scales are the caller's to reject, with
// check_fp8_scale() on the host). Any number of threads may call them. Decoding is O(1) and exact;
// encoding is O(1); the row helpers are O(n) over the row. The device build computes the same bits
// as the host build (the CPU reference and a kernel quantize to identical bytes): the same integer
// code, and __fdiv_rn / __fmul_rn / __fdiv_rz for the float steps, so nvcc's -prec-div=false or
// FMA contraction cannot change a result. Two flags can: nvcc's -ftz=true (which --use_fast_math
// sets) flushes float subnormals to (signed) zero, which changes a code or a dequantized value
// only when the scale is below 2^-116 (rows with amax below about 2^-107); and host code built with
// -ffast-math may turn x / s into x * (1 / s). Build code that includes this header without them.
//
// Formats (1 sign bit S, then exponent, then mantissa; both as NVIDIA's __nv_fp8_* and vLLM):
//   E4M3 (E4M3FN): 4 exponent bits, bias 7, 3 mantissa bits. No infinities. NaN = S.1111.111
//     (0x7f / 0xff). Largest finite 448 (0x7e), smallest normal 2^-6, smallest subnormal 2^-9.
//   E5M2: 5 exponent bits, bias 15, 2 mantissa bits, IEEE-like: infinity = S.11111.00 (0x7c),
//     NaN = S.11111.{01,10,11}. Largest finite 57344 (0x7b), smallest normal 2^-14, smallest
//     subnormal 2^-16. (An E5M2 code is the top byte of the fp16 with the same value.)
//
// Encoding float -> FP8 (float_to_fp8_*_bits):
//   - rounds to nearest, ties to even (the code whose mantissa is even), subnormals included; a
//     magnitude at or below half the smallest subnormal becomes zero;
//   - saturates: a finite value beyond the largest finite, and +-infinity, become +-largest finite
//     (for E5M2 too: the KV cache never stores infinity; this is cuda_fp8.h's __NV_SATFINITE);
//   - keeps the sign of zero (and of values that round to zero);
//   - maps every NaN, whatever its sign or payload, to the canonical NaN 0x7f (0.1111.111 in
//     E4M3, 0.11111.11 in E5M2), as cuda_fp8.h does.
//   So it is exactly cuda_fp8.h's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, format) on the host:
//   checked on all 2^32 floats by tests/device/fp8_cuda_check.cu (run by hand, needs nvcc). On
//   sm_89+ that function's device code is the cvt.rn.satfinite instruction; that the instruction
//   gives the same bytes is not yet checked on a GPU.
// Decoding FP8 -> float is exact (every FP8 value is a float); E5M2's infinity decodes to infinity,
// every NaN code to a quiet float NaN of the same sign.
//
// Scale modes (x the value, s the float32 scale, q the FP8 code; dequantized value d):
//   - Per tensor (per layer): the engine gives k_scale and v_scale (vLLM's, so existing
//     checkpoints' scales work). q = encode(x / s), d = decode(q) * s, each operation one
//     float32 rounding (IEEE division and product). s must be finite and > 0.
//   - Per (token, KV head): the scale of one row (head_dim values of one token's K or V for one
//     KV head) comes from its largest finite magnitude amax, fp8_row_scale():
//       s = max(RZ(amax / max_finite), FLT_MIN)  when amax > 0, else s = 1,
//     RZ = the float32 division rounded toward zero, so max_finite * s <= amax: the row's largest
//     value gets the largest code and nothing dequantizes to more than amax (never to infinity).
//     NaN and +-inf do not enter amax (NaN stays NaN; +-inf saturates to +-max_finite * s). The
//     FLT_MIN floor keeps s a normal float for tiny rows; an all-zero (or all-NaN) row gets 1.
//
// Error bound (both modes; for per tensor, only while |x| <= max_finite * s, beyond which d is
// +-max_finite * s). For a finite x, with s the stored scale:
//   E4M3: |d - x| <= 2^-4 |x|              when |x| >= 2^-6 s  (the FP8 normal range),
//         |d - x| <= 2^-10 s (1 + 2^-18)    below it             (half the subnormal step);
//   E5M2: |d - x| <= 2^-3 |x|              when |x| >= 2^-14 s,
//         |d - x| <= 2^-17 s (1 + 2^-18)    below it;
//   when s < 2^-100 (rows with amax below about 2^-91), add 2^-149 for float underflow.
// Why: in the normal range round to nearest loses at most half a unit in the last place, relative
// at most 2^-m / (2 + 2^-m) (1/17 for E4M3, 1/9 for E5M2), which leaves room under 2^-4 / 2^-3 for
// the two float32 roundings (x / s and decode * s, 2^-24 each) and for the saturation of a value up
// to 2^-23 above max_finite (the row's amax after the RZ scale); below it the step is constant.
// tests/device/fp8_test.cpp checks the bound on random rows.
//
// Users (issue 36): KVDtype kFp8E4M3 / kFp8E5M2 and KVScaleMode (device/kv_dtype.hpp), KVQuant
// (device/kv_quant.hpp), the scales' place in the block (device/kv_layout.hpp), the CPU
// references (reference/) and the CUDA kernels (kernels/fp8_*.cu); docs/fp8.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <bit>

#if defined(__CUDACC__)
#define PAGEDKV_FP8_HD __host__ __device__ __forceinline__
#else
#define PAGEDKV_FP8_HD inline
#endif

namespace pagedkv {

enum class Fp8Format : std::uint8_t {
  kE4M3,  // OCP E4M3FN: bias 7, no infinities, max finite 448
  kE5M2,  // OCP E5M2: bias 15, IEEE-like, max finite 57344
};

// "fp8_e4m3" or "fp8_e5m2".
std::string_view to_string(Fp8Format format) noexcept;

inline constexpr float kFp8E4M3MaxFinite = 448.0f;
inline constexpr float kFp8E5M2MaxFinite = 57344.0f;
inline constexpr std::uint8_t kFp8E4M3MaxFiniteCode = 0x7e;
inline constexpr std::uint8_t kFp8E5M2MaxFiniteCode = 0x7b;
inline constexpr std::uint8_t kFp8E5M2InfinityCode = 0x7c;
inline constexpr std::uint8_t kFp8CanonicalNaNCode = 0x7f;  // both formats; what encoding gives

namespace fp8_detail {

PAGEDKV_FP8_HD std::uint32_t float_to_bits(float value) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  return std::bit_cast<std::uint32_t>(value);
#endif
}

PAGEDKV_FP8_HD float bits_to_float(std::uint32_t bits) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

// One format's parameters: kExponentBits, kMantissaBits, kBias, kMaxFiniteCode, kHasInfinity.
struct E4M3 {
  static constexpr int kMantissaBits = 3;
  static constexpr int kBias = 7;
  static constexpr std::uint32_t kMaxFiniteCode = 0x7e;
  static constexpr bool kHasInfinity = false;
};
struct E5M2 {
  static constexpr int kMantissaBits = 2;
  static constexpr int kBias = 15;
  static constexpr std::uint32_t kMaxFiniteCode = 0x7b;
  static constexpr bool kHasInfinity = true;
};

template <class F>
PAGEDKV_FP8_HD std::uint8_t encode(float value) noexcept {
  constexpr int kDropped = 23 - F::kMantissaBits;  // float mantissa bits below the FP8 ones
  const std::uint32_t bits = float_to_bits(value);
  const std::uint32_t sign = (bits >> 24) & 0x80u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0x7f;  // every NaN: the canonical NaN, sign dropped
  const int exponent = static_cast<int>(magnitude >> 23) - 127;  // -127 for zero / subnormal
  const std::uint32_t mantissa = magnitude & 0x7fffffu;
  std::uint32_t code;
  if (exponent > F::kBias + 1) {
    code = F::kMaxFiniteCode;  // above every finite code's binade (and +-infinity): saturate
  } else if (exponent >= 1 - F::kBias) {
    // FP8 normal: keep the top mantissa bits and round the dropped ones to nearest even. A carry
    // out of the mantissa correctly bumps the exponent; past the largest finite it saturates.
    code = (static_cast<std::uint32_t>(exponent + F::kBias) << F::kMantissaBits) |
           (mantissa >> kDropped);
    const std::uint32_t rest = mantissa & ((1u << kDropped) - 1u);
    const std::uint32_t half = 1u << (kDropped - 1);
    if (rest > half || (rest == half && (code & 1u) != 0)) ++code;
    if (code > F::kMaxFiniteCode) code = F::kMaxFiniteCode;
  } else {
    // FP8 subnormal (or zero): the value is m * 2^(exponent - 23) with the implicit bit in m; in
    // units of the smallest subnormal 2^(1 - bias - mantissa bits) that is m >> shift. A float
    // subnormal (exponent -127, no implicit bit) is far below half the smallest FP8 subnormal.
    const int shift = (23 + 1 - F::kBias - F::kMantissaBits) - exponent;
    if (exponent == -127 || shift > 24) {
      code = 0;  // below half the smallest subnormal (shift 24 with m == 2^23: a tie, to 0)
    } else {
      const std::uint32_t m = mantissa | 0x800000u;
      code = m >> shift;
      const std::uint32_t rest = m & ((1u << shift) - 1u);
      const std::uint32_t half = 1u << (shift - 1);
      if (rest > half || (rest == half && (code & 1u) != 0)) ++code;  // may become the min normal
    }
  }
  return static_cast<std::uint8_t>(sign | code);
}

template <class F>
PAGEDKV_FP8_HD float decode(std::uint8_t code) noexcept {
  constexpr std::uint32_t kMantissaMask = (1u << F::kMantissaBits) - 1u;
  constexpr std::uint32_t kExponentMask = 0x7fu >> F::kMantissaBits;
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
  const std::uint32_t exponent = (code >> F::kMantissaBits) & kExponentMask;
  const std::uint32_t mantissa = code & kMantissaMask;
  if constexpr (F::kHasInfinity) {
    if (exponent == kExponentMask) {
      return bits_to_float(sign | 0x7f800000u | (mantissa != 0 ? 0x400000u : 0u));  // inf / NaN
    }
  } else {
    if ((code & 0x7fu) == 0x7fu) return bits_to_float(sign | 0x7fc00000u);  // the only NaN
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * smallest subnormal, exact in float.
    const float magnitude =
        static_cast<float>(mantissa) *
        bits_to_float(static_cast<std::uint32_t>(127 + 1 - F::kBias - F::kMantissaBits) << 23);
    return sign != 0 ? -magnitude : magnitude;
  }
  return bits_to_float(sign | ((exponent + static_cast<std::uint32_t>(127 - F::kBias)) << 23) |
                       (mantissa << (23 - F::kMantissaBits)));
}

PAGEDKV_FP8_HD float divide_rn(float x, float y) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(x, y);
#else
  return x / y;
#endif
}

PAGEDKV_FP8_HD float multiply_rn(float x, float y) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, y);
#else
  return x * y;
#endif
}

// x / y rounded toward zero, for finite x >= 0 and finite y > 0.
PAGEDKV_FP8_HD float divide_rz(float x, float y) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rz(x, y);
#else
  // The nearest quotient is within one unit of the truncated one; step down if it rounded up.
  // q * y is exact in double (24 + 24 significant bits), so the comparison is exact.
  const float q = x / y;
  if (static_cast<double>(q) * static_cast<double>(y) > static_cast<double>(x)) {
    return bits_to_float(float_to_bits(q) - 1u);
  }
  return q;
#endif
}

}  // namespace fp8_detail

// ---- conversions ----

PAGEDKV_FP8_HD std::uint8_t float_to_fp8_e4m3_bits(float value) noexcept {
  return fp8_detail::encode<fp8_detail::E4M3>(value);
}
PAGEDKV_FP8_HD float fp8_e4m3_bits_to_float(std::uint8_t code) noexcept {
  return fp8_detail::decode<fp8_detail::E4M3>(code);
}
PAGEDKV_FP8_HD std::uint8_t float_to_fp8_e5m2_bits(float value) noexcept {
  return fp8_detail::encode<fp8_detail::E5M2>(value);
}
PAGEDKV_FP8_HD float fp8_e5m2_bits_to_float(std::uint8_t code) noexcept {
  return fp8_detail::decode<fp8_detail::E5M2>(code);
}

// Dispatch on the format.
PAGEDKV_FP8_HD std::uint8_t float_to_fp8_bits(Fp8Format format, float value) noexcept {
  return format == Fp8Format::kE4M3 ? float_to_fp8_e4m3_bits(value) : float_to_fp8_e5m2_bits(value);
}
PAGEDKV_FP8_HD float fp8_bits_to_float(Fp8Format format, std::uint8_t code) noexcept {
  return format == Fp8Format::kE4M3 ? fp8_e4m3_bits_to_float(code) : fp8_e5m2_bits_to_float(code);
}
PAGEDKV_FP8_HD float fp8_max_finite(Fp8Format format) noexcept {
  return format == Fp8Format::kE4M3 ? kFp8E4M3MaxFinite : kFp8E5M2MaxFinite;
}

// ---- scales ----

// A usable scale: finite and > 0 (NaN, infinities, zero, negatives and -0 are not).
PAGEDKV_FP8_HD bool fp8_scale_is_valid(float scale) noexcept {
  const std::uint32_t bits = fp8_detail::float_to_bits(scale);
  return bits != 0 && bits < 0x7f800000u;  // sign clear, not zero, exponent not all ones
}

// Host: throws pagedkv::Error (kInvalidArgument) naming `what` unless fp8_scale_is_valid(scale).
void check_fp8_scale(float scale, std::string_view what);

// Quantize / dequantize one value with a scale (either mode): encode(x / s), decode(q) * s.
PAGEDKV_FP8_HD std::uint8_t quantize_fp8(Fp8Format format, float value, float scale) noexcept {
  return float_to_fp8_bits(format, fp8_detail::divide_rn(value, scale));
}
PAGEDKV_FP8_HD float dequantize_fp8(Fp8Format format, std::uint8_t code, float scale) noexcept {
  return fp8_detail::multiply_rn(fp8_bits_to_float(format, code), scale);
}

// The largest finite magnitude of a row (NaN and +-infinity skipped); 0 for an empty row.
PAGEDKV_FP8_HD float fp8_row_amax(const float* row, std::size_t n) noexcept {
  std::uint32_t amax_bits = 0;  // non-negative floats order as their bits
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t magnitude = fp8_detail::float_to_bits(row[i]) & 0x7fffffffu;
    if (magnitude < 0x7f800000u && magnitude > amax_bits) amax_bits = magnitude;
  }
  return fp8_detail::bits_to_float(amax_bits);
}

// The per-(token, KV head) scale of a row whose largest finite magnitude is amax (see the top):
// max(RZ(amax / max_finite), FLT_MIN) for a finite amax > 0, else 1.
PAGEDKV_FP8_HD float fp8_row_scale(Fp8Format format, float amax) noexcept {
  if (!fp8_scale_is_valid(amax)) return 1.0f;
  const float scale = fp8_detail::divide_rz(amax, fp8_max_finite(format));
  const float kFloatMin = fp8_detail::bits_to_float(0x00800000u);  // FLT_MIN, 2^-126
  return scale < kFloatMin ? kFloatMin : scale;
}

// Quantizes a row of n values with its own scale: codes[i] = quantize_fp8(x[i], s); returns s,
// the float32 scale to store beside the row.
PAGEDKV_FP8_HD float quantize_fp8_row(Fp8Format format, const float* row, std::size_t n,
                                      std::uint8_t* codes) noexcept {
  const float scale = fp8_row_scale(format, fp8_row_amax(row, n));
  for (std::size_t i = 0; i < n; ++i) codes[i] = quantize_fp8(format, row[i], scale);
  return scale;
}

// Dequantizes a row: out[i] = dequantize_fp8(codes[i], scale).
PAGEDKV_FP8_HD void dequantize_fp8_row(Fp8Format format, const std::uint8_t* codes, std::size_t n,
                                       float scale, float* out) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = dequantize_fp8(format, codes[i], scale);
}

}  // namespace pagedkv

#undef PAGEDKV_FP8_HD
