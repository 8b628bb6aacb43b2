// kernels/wgmma_probe.cu: the warpgroup-MMA probe of kernels/internal/wgmma_probe.hpp (issue 35,
// step B groundwork). Compiled for sm_90a only (the CMake object library pagedkv_cuda_sm90a:
// wgmma exists only there); the host code checks the device first. One CTA of one warpgroup
// (128 threads): the threads store A and B into 1,024-byte-aligned swizzled shared tiles with the
// layout functions, make them visible to the tensor core's async proxy, issue the k steps of
// wgmma.mma_async with descriptors built by wgmma_descriptor(), and write D back through
// wgmma_d_coord(). A's register fragments come from global memory through wgmma_a_coord().
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "internal/wgmma.cuh"
#include "internal/wgmma_layout.hpp"
#include "internal/wgmma_probe.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/cuda/device.hpp"

namespace pagedkv::cuda::detail {
namespace {

using pagedkv::detail::MmaCoord;
namespace wgmma = pagedkv::kernels::wgmma;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PAGEDKV_WGMMA_PROBE_DEVICE 1  // the device pass with wgmma (sm_90a)
#endif

constexpr int kThreads = 128;
constexpr int kATileBytes = 64 * 64 * 2;
constexpr int kBTileBytes = 128 * 64 * 2;
constexpr int kSmemBytes = kATileBytes + kBTileBytes + 1024;  // + alignment slack

template <WgmmaProbeCase kCase>
__global__ void __launch_bounds__(kThreads)
    wgmma_probe_kernel(const std::uint16_t* a, const std::uint16_t* b, float* d,
                       int k_groups_in_lbo) {
#ifdef PAGEDKV_WGMMA_PROBE_DEVICE
  using namespace pagedkv::detail;
  // wgmma_probe_shape(kCase) (a host function: checked against these in run_wgmma_probe).
  constexpr bool kMn = kCase == WgmmaProbeCase::kRegAMnMajorB;
  constexpr int kM = 64, kN = kMn ? 128 : 64, kK = kMn ? 32 : 64;
  constexpr int kSteps = kK / 16;
  extern __shared__ unsigned char smem_raw[];
  const auto raw_addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_raw));
  const std::uint32_t pad = (1024u - (raw_addr & 1023u)) & 1023u;
  unsigned char* a_smem = smem_raw + pad;
  unsigned char* b_smem = a_smem + kATileBytes;
  const std::uint32_t a_tile = raw_addr + pad;
  const std::uint32_t b_tile = a_tile + kATileBytes;
  const int t = static_cast<int>(threadIdx.x);

  if constexpr (kCase == WgmmaProbeCase::kSmemAKMajorB) {
    for (int i = t; i < kM * kK; i += kThreads) {
      *reinterpret_cast<std::uint16_t*>(a_smem + sw128_k_major_offset(i / kK, i % kK)) = a[i];
    }
  }
  if constexpr (kCase == WgmmaProbeCase::kRegAMnMajorB) {
    for (int i = t; i < kK * kN; i += kThreads) {
      *reinterpret_cast<std::uint16_t*>(b_smem + sw128_mn_major_offset(i / kN, i % kN, kK)) = b[i];
    }
  } else {
    for (int i = t; i < kN * kK; i += kThreads) {
      *reinterpret_cast<std::uint16_t*>(b_smem + sw128_k_major_offset(i / kK, i % kK)) = b[i];
    }
  }
  // A's fragments (register cases): half e of register e / 2 of thread t at step s.
  unsigned a_frag[kSteps][4] = {};
  if constexpr (kCase != WgmmaProbeCase::kSmemAKMajorB) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const MmaCoord lo = wgmma_a_coord(t, 2 * r);
        const MmaCoord hi = wgmma_a_coord(t, 2 * r + 1);
        a_frag[s][r] = static_cast<unsigned>(a[lo.row * kK + 16 * s + lo.col]) |
                       (static_cast<unsigned>(a[hi.row * kK + 16 * s + hi.col]) << 16);
      }
    }
  }
  wgmma::fence_proxy_async_shared();
  __syncthreads();

  float acc[kN / 2];
#pragma unroll
  for (int j = 0; j < kN / 2; ++j) acc[j] = 0.f;
  wgmma::reg_fence(acc);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) wgmma::reg_fence(a_frag[s]);  // A written before the fence
  wgmma::fence();
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if constexpr (kCase == WgmmaProbeCase::kSmemAKMajorB) {
      const std::uint64_t ad =
          wgmma_descriptor(k_major_step_start(a_tile, s), 16, kKMajorSbo, WgmmaSwizzle::k128B);
      const std::uint64_t bd =
          wgmma_descriptor(k_major_step_start(b_tile, s), 16, kKMajorSbo, WgmmaSwizzle::k128B);
      wgmma::ss_m64n64<true>(acc, ad, bd, s > 0 ? 1 : 0);
    } else if constexpr (kCase == WgmmaProbeCase::kRegAKMajorB) {
      const std::uint64_t bd =
          wgmma_descriptor(k_major_step_start(b_tile, s), 16, kKMajorSbo, WgmmaSwizzle::k128B);
      wgmma::rs_m64n64<true>(acc, a_frag[s], bd, s > 0 ? 1 : 0);
    } else {
      const std::uint64_t bd =
          mn_major_descriptor(mn_major_step_start(b_tile, s), kK, k_groups_in_lbo != 0);
      wgmma::rs_m64n128_trans_b<true>(acc, a_frag[s], bd, s > 0 ? 1 : 0);
    }
  }
  wgmma::commit();
  wgmma::wait_all();
  wgmma::reg_fence(acc);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) wgmma::reg_fence(a_frag[s]);
#pragma unroll
  for (int j = 0; j < kN / 2; ++j) {
    const MmaCoord c = wgmma_d_coord(t, j);
    d[c.row * kN + c.col] = acc[j];
  }
#else
  (void)a;
  (void)b;
  (void)d;
  (void)k_groups_in_lbo;
  __trap();  // built for sm_90a only; the host checks the device before launching
#endif
}

void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  throw Error(ErrorCode::kDeviceError, std::string("run_wgmma_probe: ") + what + ": " +
                                           cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                                           ")");
}

// Device buffers freed on every path.
struct DeviceBuffers {
  void* p[3] = {nullptr, nullptr, nullptr};
  ~DeviceBuffers() {
    for (void* q : p) (void)cudaFree(q);
  }
};

}  // namespace

bool wgmma_probe_supported() {
  if (cuda_device_count() == 0) return false;
  int dev = 0;
  int major = 0;
  int minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

void run_wgmma_probe(WgmmaProbeCase c, bool k_groups_in_lbo, const std::uint16_t* a,
                     const std::uint16_t* b, float* d) {
  if (!wgmma_probe_supported()) {
    throw Error(ErrorCode::kInvalidState,
                "run_wgmma_probe: needs a device of compute capability 9.0 (sm_90a code)");
  }
  const WgmmaProbeShape s = wgmma_probe_shape(c);
  static_assert(wgmma_probe_shape(WgmmaProbeCase::kRegAMnMajorB).n == 128 &&
                    wgmma_probe_shape(WgmmaProbeCase::kRegAMnMajorB).k == 32 &&
                    wgmma_probe_shape(WgmmaProbeCase::kSmemAKMajorB).n == 64 &&
                    wgmma_probe_shape(WgmmaProbeCase::kSmemAKMajorB).k == 64,
                "the kernel's shapes (wgmma_probe_kernel) are the header's");
  const std::size_t a_bytes = static_cast<std::size_t>(s.m) * static_cast<std::size_t>(s.k) * 2u;
  const std::size_t b_bytes = static_cast<std::size_t>(s.n) * static_cast<std::size_t>(s.k) * 2u;
  const std::size_t d_bytes = static_cast<std::size_t>(s.m) * static_cast<std::size_t>(s.n) * 4u;
  DeviceBuffers buf;
  check(cudaMalloc(&buf.p[0], a_bytes), "cudaMalloc");
  check(cudaMalloc(&buf.p[1], b_bytes), "cudaMalloc");
  check(cudaMalloc(&buf.p[2], d_bytes), "cudaMalloc");
  check(cudaMemcpy(buf.p[0], a, a_bytes, cudaMemcpyHostToDevice), "cudaMemcpy A");
  check(cudaMemcpy(buf.p[1], b, b_bytes, cudaMemcpyHostToDevice), "cudaMemcpy B");
  check(cudaMemset(buf.p[2], 0xff, d_bytes), "cudaMemset D");  // NaN: unwritten shows
  const auto* da = static_cast<const std::uint16_t*>(buf.p[0]);
  const auto* db = static_cast<const std::uint16_t*>(buf.p[1]);
  auto* dd = static_cast<float*>(buf.p[2]);
  const int lbo = k_groups_in_lbo ? 1 : 0;
  switch (c) {
    case WgmmaProbeCase::kSmemAKMajorB:
      wgmma_probe_kernel<WgmmaProbeCase::kSmemAKMajorB>
          <<<1, kThreads, kSmemBytes>>>(da, db, dd, lbo);
      break;
    case WgmmaProbeCase::kRegAKMajorB:
      wgmma_probe_kernel<WgmmaProbeCase::kRegAKMajorB>
          <<<1, kThreads, kSmemBytes>>>(da, db, dd, lbo);
      break;
    case WgmmaProbeCase::kRegAMnMajorB:
      wgmma_probe_kernel<WgmmaProbeCase::kRegAMnMajorB>
          <<<1, kThreads, kSmemBytes>>>(da, db, dd, lbo);
      break;
  }
  check(cudaGetLastError(), "launch");
  check(cudaDeviceSynchronize(), "kernel");
  check(cudaMemcpy(d, dd, d_bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D");
}

}  // namespace pagedkv::cuda::detail
