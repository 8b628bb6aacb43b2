// kernels/internal/fp8_operand.cuh: exact conversion of FP8 KV codes into the 16-bit MMA operand
// type, shared by the tensor-core kernels over an FP8 cache (kernels/decode_attention_tc_fp8.cu,
// DecodeKernel::kTensorCoreFp8, and kernels/extend_attention_fa2_fp8.cu, ExtendKernel::kFa2Fp8).
// Every E4M3 and E5M2 value is an fp16 and a bf16 value, so nothing rounds: sm_89+ converts two
// codes with one cvt.rn.f16x2.{e4m3,e5m2}x2, older GPUs with fp8.hpp's exact decode; bf16 goes
// through fp32. Internal to pagedkv::cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "pagedkv/device/fp8.hpp"

namespace pagedkv::kernels {

// Two FP8 codes (low byte first) -> two fp16 values (low half first), exact.
template <bool kE5M2>
__device__ __forceinline__ unsigned fp8x2_to_half2(unsigned short codes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  unsigned r;
  if constexpr (kE5M2) {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;\n" : "=r"(r) : "h"(codes));
  } else {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(codes));
  }
  return r;
#else
  // Before sm_89: fp8.hpp's exact decode (every FP8 value is an fp16 value).
  constexpr Fp8Format kFormat = kE5M2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
  const __half2 h =
      __floats2half2_rn(fp8_bits_to_float(kFormat, static_cast<std::uint8_t>(codes & 0xffu)),
                        fp8_bits_to_float(kFormat, static_cast<std::uint8_t>(codes >> 8)));
  return *reinterpret_cast<const unsigned*>(&h);
#endif
}

// Two FP8 codes -> the MMA's 16-bit pair; bf16 through fp32 (every FP8 value is a bf16 value).
template <bool kBf16, bool kE5M2>
__device__ __forceinline__ unsigned fp8x2_to_operand(unsigned short codes) {
  const unsigned h = fp8x2_to_half2<kE5M2>(codes);
  if constexpr (kBf16) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *reinterpret_cast<const unsigned*>(&b);
  } else {
    return h;
  }
}

// Sixteen FP8 codes (one 16-byte chunk, code 0 in the lowest byte) -> sixteen 16-bit operands:
// codes 0..7 in *lo, 8..15 in *hi (two 16-byte chunks of a 16-bit row).
template <bool kBf16, bool kE5M2>
__device__ __forceinline__ void fp8x16_to_operands(const uint4& in, uint4* lo, uint4* hi) {
  lo->x = fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(in.x & 0xffffu));
  lo->y = fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(in.x >> 16));
  lo->z = fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(in.y & 0xffffu));
  lo->w = fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(in.y >> 16));
  hi->x = fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(in.z & 0xffffu));
  hi->y = fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(in.z >> 16));
  hi->z = fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(in.w & 0xffffu));
  hi->w = fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(in.w >> 16));
}

}  // namespace pagedkv::kernels
