// kernels/internal/extend_wgmma_schedule.hpp: the K/V ring and GEMM schedule of the warpgroup-MMA
// paged extend kernels (kernels/extend_attention_wgmma.cu, ExtendKernel::kWgmma and
// kWgmmaPipelined), as plain constexpr functions, so the host test
// (tests/device/extend_wgmma_schedule_test.cpp) checks the ring the kernel runs:
//   - the ring's distances are kFa2's for 3 stages (extend_fa2_layout.hpp: iteration t waits for
//     tile t with fa2_wait_groups(3) = 1 cp.async group pending, issues tile fa2_issue_tile(t, 3)
//     = t + 2 and resolves tile fa2_resolve_tile(t, 3) = t + 3's page offsets);
//   - the stages (K/V stages and offset slots, tile t in fa2_slot(t, stages)): 3 for kWgmma; 4 for
//     kWgmmaPipelined, whose iteration t still reads tile t - 1's V (its PV GEMM) after the barrier
//     behind which tile t + 2 is issued;
//   - which tile's PV GEMM iteration t issues: t (kWgmma, after tile t's softmax) or t - 1
//     (kWgmmaPipelined, beside tile t's S GEMM; the last tile's after the loop).
//
// Pure O(1) functions, no errors; usable from any thread. Internal to pagedkv::cuda, not a stable
// API.
#pragma once

#include "internal/extend_fa2_layout.hpp"
#include "internal/host_device.hpp"

namespace pagedkv::detail {

// The ring's distances: those of kFa2's 3-stage ring (pass it as `stages` to fa2_issue_tile,
// fa2_resolve_tile and fa2_wait_groups).
inline constexpr int kWgmmaRingDistances = 3;

// K/V stages and offset slots of the kernel.
PAGEDKV_HOST_DEVICE constexpr int wgmma_extend_stages(bool pipelined) {
#if defined(PAGEDKV_TEST_BROKEN_WGMMA_SCHEDULE) && PAGEDKV_TEST_BROKEN_WGMMA_SCHEDULE == 1
  (void)pipelined;
  return 3;  // test-only: the pipelined kernel without its 4th stage
#else
  return pipelined ? 4 : 3;
#endif
}

// The tile whose PV GEMM iteration `iteration` issues (-1: none; the pipelined kernel issues the
// last tile's after the loop).
PAGEDKV_HOST_DEVICE constexpr int wgmma_pv_tile(int iteration, bool pipelined) {
#if defined(PAGEDKV_TEST_BROKEN_WGMMA_SCHEDULE) && PAGEDKV_TEST_BROKEN_WGMMA_SCHEDULE == 2
  return pipelined ? iteration - 2 : iteration;  // test-only: P V two tiles behind
#else
  return pipelined ? iteration - 1 : iteration;
#endif
}

static_assert(fa2_issue_tile(0, kWgmmaRingDistances) == 2 &&
                  fa2_resolve_tile(0, kWgmmaRingDistances) == 3,
              "the distances the stage counts are sized for");

}  // namespace pagedkv::detail
