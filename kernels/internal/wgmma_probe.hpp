// kernels/internal/wgmma_probe.hpp: a probe of Hopper's warpgroup MMA as pagedkv's future sm_90a
// kernels will drive it (issue 35, step B), run by tests/cuda/wgmma_probe_test.cpp under
// scripts/gpu-check: one warpgroup computes D = A x B^T (or A x B) with wgmma.mma_async from
// the layouts and descriptors of kernels/internal/wgmma_layout.hpp, so a GPU run confirms (or
// refutes) the descriptor encoding, the 128-byte swizzle, the k-step address advance and the
// register fragment maps before an attention kernel is built on them. Not an attention kernel and
// not used by one.
//
// Cases (16-bit bf16 operands given as raw bits, fp32 results, row-major host arrays):
//   kSmemAKMajorB: A (64 x 64) and B (64 x 64, n-major rows of k: the K operand of QK^T) both in
//     shared memory, K-major; D = A x B^T (64 x 64), four k steps.
//   kRegAKMajorB: the same with A's fragments in registers (the P operand of PV).
//   kRegAMnMajorB: A (64 x 32) in registers, B (32 x 128, k rows of n: V as PV's B operand)
//     in shared memory N-major (imm-trans-b 1) over two 64-wide atom columns; D = A x B (64 x
//     128), two k steps; `k_groups_in_lbo` picks which descriptor offset carries the stride
//     between 8-key groups (kMnMajorKGroupsInLbo is the one the header asserts).
// Errors: pagedkv::Error (kDeviceError) for a CUDA failure, (kInvalidState) when the device is not
// compute capability 9.0 (check wgmma_probe_supported() first). Blocking; not thread-safe against
// other work on the current device's default stream. Internal to pagedkv::cuda.
#pragma once

#include <cstdint>

namespace pagedkv::cuda::detail {

enum class WgmmaProbeCase { kSmemAKMajorB, kRegAKMajorB, kRegAMnMajorB };

struct WgmmaProbeShape {
  int m, n, k;
};
constexpr WgmmaProbeShape wgmma_probe_shape(WgmmaProbeCase c) {
  return c == WgmmaProbeCase::kRegAMnMajorB ? WgmmaProbeShape{64, 128, 32}
                                            : WgmmaProbeShape{64, 64, 64};
}

// Whether the current device can run the probe (compute capability 9.0: the sm_90a code).
bool wgmma_probe_supported();

// a: m x k; b: n x k for the K-major cases, k x n for kRegAMnMajorB; d: m x n (host arrays).
void run_wgmma_probe(WgmmaProbeCase c, bool k_groups_in_lbo, const std::uint16_t* a,
                     const std::uint16_t* b, float* d);

}  // namespace pagedkv::cuda::detail
