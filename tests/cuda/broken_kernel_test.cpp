// The GPU tests' per-row comparison fails kernels that are wrong by one key. This program links
// pagedkv_cuda_drop_key: the decode and extend kernels built with PAGEDKV_TEST_DROP_KEY=100, so
// key position 100 of every sequence is left out (tests/CMakeLists.txt); the decode check runs
// for both decode variants (kernels/decode_attention.cu and kernels/decode_attention_tc.cu), the
// extend check for both extend variants (kernels/extend_attention.cu and
// kernels/extend_attention_fa2.cu, the latter also with a split over keys). It
// passes only when the check the real GPU tests use (testing::check_rows, 1e-2 per row for bf16,
// 2e-3 for fp16) rejects exactly the rows that should see key 100 and accepts the others; the
// whole-batch Frobenius error the tests used before is printed for comparison (for the bf16 decode
// batch it stays under 1e-2, i.e. the old check passed this broken kernel).
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "cuda_attention_test_util.hpp"
#include "cuda_test_util.hpp"
#include "kv_test_util.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/extend_attention.hpp"

namespace pagedkv {
namespace {

double tolerance(KVDtype dtype) {
  return dtype == KVDtype::kBFloat16 ? 1e-2 : 2e-3;
}

class CudaBrokenKernel : public testing::GpuTest {};

// Every decode variant (kSimt, kTensorCore and kTensorCoreWideMerge, the default) is built
// broken.
TEST_F(CudaBrokenKernel, PerRowCheckRejectsDecodeWithoutKey100) {
  for (const DecodeKernel kernel :
       {DecodeKernel::kSimt, DecodeKernel::kTensorCore, DecodeKernel::kTensorCoreWideMerge}) {
    for (const KVDtype dtype : {KVDtype::kBFloat16, KVDtype::kFloat16}) {
      for (const DecodePlan plan : {DecodePlan{}, DecodePlan{5, 37}}) {
        testing::DecodeShape s;
        s.dtype = dtype;
        s.num_seqs = 3;
        s.num_kv_heads = 2;
        s.num_q_heads = 8;
        s.head_dim = 128;
        s.block_size = 16;
        s.seq_lens = {1, 190, 50};  // only the 190-token sequence has a key 100
        const auto pb = testing::make_decode_problem(s, 3);
        const auto ref = reference_paged_decode_attention_f64(pb.params(nullptr));
        testing::DeviceDecodeProblem dev(pb);
        const std::size_t ws_bytes = decode_workspace_bytes(plan, 3, 8, 128);
        testing::DeviceBuffer workspace(ws_bytes);
        PAGEDKV_CUDA_CHECK(paged_decode_attention(dev.params(pb), plan, workspace.get(), ws_bytes,
                                                  nullptr, kernel));
        const auto out = testing::to_doubles(
            dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
        const double tol = tolerance(dtype);
        const testing::RowCheck all = testing::check_rows(out, ref, 128, tol);
        std::printf(
            "decode %s %s splits=%d: whole-batch Frobenius error %.4g (old check: %s), worst "
            "row %.4g, %zu of %zu rows rejected\n",
            kernel == DecodeKernel::kSimt         ? "simt"
            : kernel == DecodeKernel::kTensorCore ? "tensor-core"
                                                  : "tensor-core-wide-merge",
            std::string(to_string(dtype)).c_str(), plan.num_splits, all.frobenius,
            all.frobenius < tol ? "passed" : "failed", all.max_row_error, all.bad_rows, all.rows);
        const std::span<const double> o(out);
        const std::span<const double> r(ref);
        EXPECT_TRUE(testing::rows_match(o.subspan(0, 1024), r.subspan(0, 1024), 128, tol));
        EXPECT_TRUE(testing::rows_match(o.subspan(2048, 1024), r.subspan(2048, 1024), 128, tol));
        const testing::RowCheck broken =
            testing::check_rows(o.subspan(1024, 1024), r.subspan(1024, 1024), 128, tol);
        EXPECT_GT(broken.bad_rows, 0u) << "the per-row check missed the dropped key";
      }
    }
  }
}

// Both extend variants are built broken: the default and ExtendKernel::kFa2, without and with a
// split over keys (3 splits: the dropped key sits in one split's partial rows).
TEST_F(CudaBrokenKernel, PerRowCheckRejectsExtendWithoutKey100) {
  for (const int variant : {0, 1, 3}) {
    for (const KVDtype dtype : {KVDtype::kBFloat16, KVDtype::kFloat16}) {
      // Sequence 1's new tokens sit at positions 150..189 and see key 100; the others do not.
      const testing::ExtendShape s =
          testing::make_extend_shape(dtype, 128, 2, 4, 16, {0, 150, 30}, {1, 40, 20});
      const auto pb = testing::make_extend_problem(s, 5);
      const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
      testing::DeviceExtendProblem dev(pb);
      ExtendSplitPlan plan;
      plan.num_splits = variant == 3 ? 3 : 1;
      const testing::DeviceBuffer workspace(extend_workspace_bytes(dev.params(pb), plan));
      PAGEDKV_CUDA_CHECK(paged_extend_attention(
          dev.params(pb), nullptr, variant == 0 ? ExtendKernel::kMma16 : ExtendKernel::kFa2, plan,
          workspace.get(), workspace.bytes()));
      PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
      const auto out =
          testing::to_doubles(dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
      const double tol = tolerance(dtype);
      const testing::RowCheck all = testing::check_rows(out, ref.out, 128, tol);
      std::printf(
          "extend (%s, %d splits) %s: whole-batch Frobenius error %.4g, worst row %.4g, %zu of %zu "
          "rows "
          "rejected\n",
          variant == 0 ? "default" : "fa2", plan.num_splits, std::string(to_string(dtype)).c_str(),
          all.frobenius, all.max_row_error, all.bad_rows, all.rows);
      const std::size_t row = 8 * 128;  // one token's heads
      const std::span<const double> o(out);
      const std::span<const double> r(ref.out);
      EXPECT_TRUE(testing::rows_match(o.subspan(0, row), r.subspan(0, row), 128, tol));
      EXPECT_TRUE(testing::rows_match(o.subspan(41 * row, 20 * row), r.subspan(41 * row, 20 * row),
                                      128, tol));
      const testing::RowCheck broken =
          testing::check_rows(o.subspan(row, 40 * row), r.subspan(row, 40 * row), 128, tol);
      EXPECT_GT(broken.bad_rows, 0u)
          << "the per-row check missed the dropped key (variant " << variant << ")";
    }
  }
}

}  // namespace
}  // namespace pagedkv
