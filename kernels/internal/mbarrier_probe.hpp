// kernels/internal/mbarrier_probe.hpp: a probe of the shared-memory barrier protocol the
// warp-specialized extend kernel relies on (kernels/internal/mbarrier.cuh,
// kernels/internal/wgmma_ws_ring.hpp), run by tests/cuda/mbarrier_probe_test.cpp under
// scripts/gpu-check, so a GPU run confirms the parity semantics and the wait's time limit on the
// hardware before (and apart from) the kernel that needs them. Not used by any attention kernel.
//
// Cases (one CTA of 128 threads each):
//   kParityProtocol: a barrier of 128 arrivals; thread 0 tries parity 0 and 1 before any arrival
//     (expected: 0 pending, 1 passes: the ring's round 0 on empty[s]), every thread arrives and
//     waits for parity 0, then thread 0 tries both again (expected: 0 passes, 1 pending).
//   kLateArrival: one thread arrives after spinning kLateArrivalMs on the global timer while a
//     warp waits (limit kCompletingLimitMs): the wait returns; no trap on a slow but honest wait.
//   kNeverCompletes: a barrier of 2 arrivals gets one; the waits (limit kDeadlockLimitMs) trap.
// Errors: pagedkv::Error (kInvalidState) when the device is not compute capability 9.0 (check
// mbarrier_probe_supported() first); every CUDA status is returned, not thrown (after
// kNeverCompletes's trap, the process's context is unusable: run that case alone, last). Blocking;
// not thread-safe against other work on the current device. Internal to pagedkv::cuda.
#pragma once

#include <cuda_runtime.h>

namespace pagedkv::cuda::detail {

enum class MbarrierProbeCase { kParityProtocol, kLateArrival, kNeverCompletes };

inline constexpr int kLateArrivalMs = 50;
inline constexpr int kCompletingLimitMs = 5000;
inline constexpr int kDeadlockLimitMs = 200;

struct MbarrierProbeResult {
  cudaError_t status = cudaSuccess;  // the launch's, then the synchronization's
  double seconds = 0;                // wall time of launch and synchronization
  // kParityProtocol, 1 where the try passed: parity 0 / 1 before the arrivals, then after.
  int passed[4] = {-1, -1, -1, -1};
};

// Whether the current device can run the probe (compute capability 9.0: the sm_90a code).
bool mbarrier_probe_supported();

MbarrierProbeResult run_mbarrier_probe(MbarrierProbeCase c);

}  // namespace pagedkv::cuda::detail
