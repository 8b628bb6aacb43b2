// kernels/mbarrier_probe.cu: the shared-memory barrier probe of
// kernels/internal/mbarrier_probe.hpp. Compiled for sm_90a only (the CMake object library
// pagedkv_cuda_sm90a, as the kernels whose protocol it checks); the host code checks the device
// first.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>

#include "internal/mbarrier.cuh"
#include "internal/mbarrier_probe.hpp"
#include "internal/wgmma_probe.hpp"
#include "pagedkv/base/error.hpp"

namespace pagedkv::cuda::detail {
namespace {

namespace mbar = pagedkv::kernels::mbar;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PAGEDKV_MBARRIER_PROBE_DEVICE 1
#endif

constexpr int kThreads = 128;
using mbar::kNsPerMs;

template <MbarrierProbeCase kCase>
__global__ void __launch_bounds__(kThreads) mbarrier_probe_kernel(int* passed) {
#ifdef PAGEDKV_MBARRIER_PROBE_DEVICE
  __shared__ std::uint64_t bar;
  const int t = static_cast<int>(threadIdx.x);
  const std::uint32_t addr = mbar::smem_addr(&bar);
  if (t == 0) {
    constexpr std::uint32_t kCount = kCase == MbarrierProbeCase::kParityProtocol   ? kThreads
                                     : kCase == MbarrierProbeCase::kNeverCompletes ? 2
                                                                                   : 1;
    mbar::init(&bar, kCount);
    mbar::fence_init();
  }
  __syncthreads();
  if constexpr (kCase == MbarrierProbeCase::kParityProtocol) {
    if (t == 0) {
      passed[0] = mbar::try_wait_parity(addr, 0) ? 1 : 0;
      passed[1] = mbar::try_wait_parity(addr, 1) ? 1 : 0;
    }
    __syncthreads();  // thread 0's tries before anyone arrives
    mbar::arrive(&bar);
    mbar::wait_parity<kCompletingLimitMs * kNsPerMs>(&bar, 0);
    if (t == 0) {
      passed[2] = mbar::try_wait_parity(addr, 0) ? 1 : 0;
      passed[3] = mbar::try_wait_parity(addr, 1) ? 1 : 0;
    }
  } else if constexpr (kCase == MbarrierProbeCase::kLateArrival) {
    if (t == 32) {
      const std::uint64_t start = mbar::global_timer_ns();
      while (mbar::global_timer_ns() - start < kLateArrivalMs * kNsPerMs) {
      }
      mbar::arrive(&bar);
    } else if (t < 32) {
      mbar::wait_parity<kCompletingLimitMs * kNsPerMs>(&bar, 0);
      if (t == 0) passed[0] = 1;
    }
  } else {
    if (t == 0) mbar::arrive(&bar);  // one of the two arrivals the phase needs
    mbar::wait_parity<kDeadlockLimitMs * kNsPerMs>(&bar, 0);
    if (t == 0) passed[0] = 1;  // never reached: the wait traps
  }
#else
  (void)passed;
  __trap();  // built for sm_90a only; the host checks the device before launching
#endif
}

}  // namespace

// The device check of every sm_90a object (compute capability 9.0), as the extend kernels use it.
bool mbarrier_probe_supported() {
  return wgmma_probe_supported();
}

MbarrierProbeResult run_mbarrier_probe(MbarrierProbeCase c) {
  if (!mbarrier_probe_supported()) {
    throw Error(ErrorCode::kInvalidState,
                "run_mbarrier_probe: needs a device of compute capability 9.0 (sm_90a code)");
  }
  MbarrierProbeResult r;
  int* flags = nullptr;
  r.status = cudaMalloc(&flags, sizeof(r.passed));
  if (r.status != cudaSuccess) return r;
  r.status = cudaMemcpy(flags, r.passed, sizeof(r.passed), cudaMemcpyHostToDevice);
  const auto start = std::chrono::steady_clock::now();
  if (r.status == cudaSuccess) {
    switch (c) {
      case MbarrierProbeCase::kParityProtocol:
        mbarrier_probe_kernel<MbarrierProbeCase::kParityProtocol><<<1, kThreads>>>(flags);
        break;
      case MbarrierProbeCase::kLateArrival:
        mbarrier_probe_kernel<MbarrierProbeCase::kLateArrival><<<1, kThreads>>>(flags);
        break;
      case MbarrierProbeCase::kNeverCompletes:
        mbarrier_probe_kernel<MbarrierProbeCase::kNeverCompletes><<<1, kThreads>>>(flags);
        break;
    }
    r.status = cudaGetLastError();
    if (r.status == cudaSuccess) r.status = cudaDeviceSynchronize();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (r.status == cudaSuccess) {
    r.status = cudaMemcpy(r.passed, flags, sizeof(r.passed), cudaMemcpyDeviceToHost);
  }
  (void)cudaFree(flags);  // fails after a trap (the context is gone): nothing more to free
  return r;
}

}  // namespace pagedkv::cuda::detail
