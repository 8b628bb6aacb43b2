// A check run by hand, not part of the build (it needs nvcc, no GPU): pagedkv/device/fp8.hpp
// compiles under nvcc for host and device (the kernel below is compiled, never launched), and its
// encoder and decoder give the same bytes as cuda_fp8.h's host conversions (__NV_SATFINITE) on
// every one of the 2^32 floats and every code. About a minute:
//   nvcc -std=c++20 -O2 -arch=sm_90 -Iinclude tests/device/fp8_cuda_check.cu -o /tmp/fp8_cuda_check
//   /tmp/fp8_cuda_check   # exit 0 and one line of counts when they agree
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include "pagedkv/device/fp8.hpp"

__global__ void quantize_kernel(const float* x, std::uint8_t* q, float* back, float* scales,
                                int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  q[i] = pagedkv::quantize_fp8(pagedkv::Fp8Format::kE4M3, x[i], 0.5f);
  back[i] = pagedkv::dequantize_fp8(pagedkv::Fp8Format::kE5M2, q[i], 0.5f) +
            pagedkv::fp8_e4m3_bits_to_float(q[i]) + pagedkv::float_to_fp8_e5m2_bits(x[i]);
  if (i == 0) {
    std::uint8_t codes[8];
    scales[0] = pagedkv::quantize_fp8_row(pagedkv::Fp8Format::kE4M3, x, 8, codes);
    pagedkv::dequantize_fp8_row(pagedkv::Fp8Format::kE5M2, codes, 8, scales[0], back);
    scales[1] = pagedkv::fp8_row_scale(pagedkv::Fp8Format::kE5M2, x[1]) +
                (pagedkv::fp8_scale_is_valid(x[2]) ? 1.f : 0.f);
  }
}

static float bits_to_float(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

int main() {
  unsigned long long mism[2] = {0, 0}, nan_diff[2] = {0, 0};
  for (std::uint64_t b = 0; b <= 0xffffffffull; ++b) {
    const float x = bits_to_float(static_cast<std::uint32_t>(b));
    const std::uint8_t ours[2] = {pagedkv::float_to_fp8_e4m3_bits(x),
                                  pagedkv::float_to_fp8_e5m2_bits(x)};
    const std::uint8_t nv[2] = {
        static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)),
        static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2))};
    for (int k = 0; k < 2; ++k) {
      if (ours[k] == nv[k]) continue;
      if (std::isnan(x)) ++nan_diff[k];
      if (++mism[k] <= 5) std::printf("fmt %d x %a ours %02x nv %02x\n", k, x, ours[k], nv[k]);
    }
  }
  unsigned dec_mism = 0;
  for (int c = 0; c < 256; ++c) {
    for (int k = 0; k < 2; ++k) {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c),
                                             k == 0 ? __NV_E4M3 : __NV_E5M2);
      const float want = __half2float(__half(h));
      const float got = k == 0 ? pagedkv::fp8_e4m3_bits_to_float(static_cast<std::uint8_t>(c))
                               : pagedkv::fp8_e5m2_bits_to_float(static_cast<std::uint8_t>(c));
      const bool same = (std::isnan(want) && std::isnan(got)) || std::memcmp(&want, &got, 4) == 0;
      if (!same && ++dec_mism <= 5)
        std::printf("decode fmt %d code %02x ours %a nv %a\n", k, c, got, want);
    }
  }
  std::printf(
      "encode, all 2^32 floats: E4M3 mismatches %llu (of them NaN %llu); E5M2 mismatches "
      "%llu (of them NaN %llu); decode, 2 x 256 codes: mismatches %u\n",
      mism[0], nan_diff[0], mism[1], nan_diff[1], dec_mism);
  return (mism[0] || mism[1] || dec_mism) ? 1 : 0;
}
