// kernels/internal/fp8_operand.cuh: exact conversion of FP8 KV codes into the 16-bit MMA operand
// type, and the V-scale weights of the probability operand, shared by the tensor-core kernels over
// an FP8 cache (kernels/decode_attention_tc_fp8.cu, DecodeKernel::kTensorCoreFp8, and
// kernels/extend_attention_fa2_fp8.cu, ExtendKernel::kFa2Fp8). Every E4M3 and E5M2 value is an fp16
// and a bf16 value, so nothing rounds: sm_89+ converts two codes with one
// cvt.rn.f16x2.{e4m3,e5m2}x2, older GPUs with fp8.hpp's exact decode; bf16 goes through fp32.
// Internal to pagedkv::cuda.
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

// The V-scale weights of a key tile with per-(token, head) scales (the tensor-core FP8 kernels'
// PV operand is p x v_scale / R, R the largest V scale magnitude seen so far, kept in r_run): R
// grows to cover this tile's scales; w[n][e] = the V scale of key 8 n + 2 quad_col + e over the
// new R, in [-1, 1] (kv_append writes no negative scale, but a cache filled elsewhere may hold
// one: as the reference, decode(code) x s keeps its sign; with R the largest signed scale, a
// sequence whose first scales were all negative kept R = 0 and lost their values);
// returns R_old / R_new when R grew (0 while R_old was 0, nothing accumulated yet), else 1: the
// factor for the output accumulated so far. v_scales: the tile's kKeyTiles x 8 V scales in shared
// memory. Every quad of the warp holds columns of all of the tile's keys, so the result is uniform
// over the warp.
template <int kKeyTiles>
__device__ __forceinline__ float fp8_v_weights(const float* v_scales, int quad_col, float& r_run,
                                               float (&w)[kKeyTiles][2]) {
  float tile_r = 0.0f;
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      w[n][e] = v_scales[n * 8 + quad_col * 2 + e];
      tile_r = fmaxf(tile_r, fabsf(w[n][e]));
    }
  }
  tile_r = fmaxf(tile_r, __shfl_xor_sync(0xffffffffu, tile_r, 1));
  tile_r = fmaxf(tile_r, __shfl_xor_sync(0xffffffffu, tile_r, 2));
  const float r_new = fmaxf(r_run, tile_r);
  const float inv_r = r_new > 0.0f ? 1.0f / r_new : 0.0f;
  float rescale = 1.0f;
  if (r_new != r_run) rescale = r_run * inv_r;
  r_run = r_new;
#pragma unroll
  for (int n = 0; n < kKeyTiles; ++n) {
    w[n][0] *= inv_r;
    w[n][1] *= inv_r;
  }
  return rescale;
}

}  // namespace pagedkv::kernels
