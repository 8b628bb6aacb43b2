// kernels/internal/fast_exp2.cuh: 2^x for an online softmax, with a denormal result flushed to
// zero (ex2.approx.ftz.f32): one MUFU.EX2. exp2f compiles to ex2.approx.f32, the same
// approximation without the flush, which ptxas surrounds with a range test and two multiplies
// (FSETP, FMUL, MUFU.EX2, FMUL) to produce denormal results. In a softmax whose exponents are
// score - row maximum (<= 0) the flushed values are below 2^-126 of the row's largest term (1):
// they change no sum at float precision. 2^-inf = +0, as exp2f. Any architecture; device code
// only. Internal to pagedkv::cuda.
#pragma once

namespace pagedkv::kernels {

__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace pagedkv::kernels
