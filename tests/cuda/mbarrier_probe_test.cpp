// The shared-memory barrier probe (kernels/internal/mbarrier_probe.hpp) on a GPU of compute
// capability 9.0: the parity protocol of kernels/internal/wgmma_ws_ring.hpp (a fresh barrier
// passes parity 1 at once, a completed phase flips both answers), a slow but honest wait that
// must not trap, and a deadlock that must end the kernel with an error within its limit instead
// of hanging. One ctest entry per case (VARIANTS in tests/CMakeLists.txt): the deadlock's trap
// leaves the process's CUDA context unusable, so it runs alone.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cuda_test_util.hpp"
#include "internal/mbarrier_probe.hpp"

namespace pagedkv {
namespace {

using cuda::detail::MbarrierProbeCase;
using cuda::detail::MbarrierProbeResult;
using cuda::detail::run_mbarrier_probe;

class CudaMbarrierProbe : public testing::GpuTest,
                          public ::testing::WithParamInterface<MbarrierProbeCase> {
 protected:
  void SetUp() override {
    testing::GpuTest::SetUp();
    if (IsSkipped()) return;
    if (!cuda::detail::mbarrier_probe_supported()) {
      PAGEDKV_GPU_SKIP("the device is not compute capability 9.0: no sm_90a code to probe");
    }
  }
};

std::string status_text(const MbarrierProbeResult& r) {
  return std::string(cudaGetErrorName(r.status)) + " after " + std::to_string(r.seconds) + " s";
}

TEST_P(CudaMbarrierProbe, RunsAsTheProtocolSays) {
  const MbarrierProbeResult r = run_mbarrier_probe(GetParam());
  std::printf("status %s, passed %d %d %d %d\n", status_text(r).c_str(), r.passed[0], r.passed[1],
              r.passed[2], r.passed[3]);
  switch (GetParam()) {
    case MbarrierProbeCase::kParityProtocol:
      ASSERT_EQ(r.status, cudaSuccess) << status_text(r);
      EXPECT_EQ(r.passed[0], 0) << "parity 0 passed before any arrival";
      EXPECT_EQ(r.passed[1], 1)
          << "a fresh barrier did not pass parity 1: the ring's first empty[s] waits would hang";
      EXPECT_EQ(r.passed[2], 1) << "parity 0 pending after its phase completed";
      EXPECT_EQ(r.passed[3], 0) << "parity 1 passed while the second phase is pending";
      break;
    case MbarrierProbeCase::kLateArrival:
      ASSERT_EQ(r.status, cudaSuccess)
          << "a " << cuda::detail::kLateArrivalMs << " ms wait trapped: " << status_text(r);
      EXPECT_EQ(r.passed[0], 1);
      EXPECT_GE(r.seconds, cuda::detail::kLateArrivalMs / 1000.0) << "the arrival was not late";
      break;
    case MbarrierProbeCase::kNeverCompletes:
      EXPECT_NE(r.status, cudaSuccess) << "a barrier that never completes returned";
      EXPECT_NE(r.passed[0], 1);
      // It waited about the limit (not trapped at the first failed try), and not much longer.
      EXPECT_GE(r.seconds, cuda::detail::kDeadlockLimitMs / 1000.0) << status_text(r);
      EXPECT_LT(r.seconds, 60.0) << status_text(r);
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(Mbarrier, CudaMbarrierProbe,
                         ::testing::Values(MbarrierProbeCase::kParityProtocol,
                                           MbarrierProbeCase::kLateArrival,
                                           MbarrierProbeCase::kNeverCompletes),
                         [](const ::testing::TestParamInfo<MbarrierProbeCase>& case_info) {
                           switch (case_info.param) {
                             case MbarrierProbeCase::kParityProtocol:
                               return std::string("ParityProtocol");
                             case MbarrierProbeCase::kLateArrival:
                               return std::string("LateArrival");
                             case MbarrierProbeCase::kNeverCompletes:
                               return std::string("Deadlock");
                           }
                           return std::string("Unknown");
                         });

}  // namespace
}  // namespace pagedkv
