// The comparison the GPU attention tests use (testing::check_rows, kv_test_util.hpp) catches one
// missing key where the old whole-batch Frobenius norm does not. Runs on the CPU: the "kernel"
// here is the naive computation with key position 100 left out, rounded to bf16 like a kernel's
// output. tests/cuda_broken_kernel_test.cpp shows the same with kernels built to drop that key.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <vector>

#include "kv_test_util.hpp"

namespace pagedkv {
namespace {

constexpr double kBf16Tolerance = 1e-2;  // the GPU tests' bf16 tolerance
constexpr std::int64_t kDroppedKey = 100;

// The decode matrix test's batch: a 1-token sequence next to a 190-token one.
testing::DecodeShape batch() {
  testing::DecodeShape s;
  s.dtype = KVDtype::kBFloat16;
  s.num_seqs = 3;
  s.num_kv_heads = 2;
  s.num_q_heads = 8;
  s.head_dim = 128;
  s.block_size = 16;
  s.seq_lens = {1, 190, 50};
  return s;
}

std::vector<double> rounded(KVDtype dtype, const std::vector<double>& exact) {
  std::vector<double> out(exact.size());
  for (std::size_t i = 0; i < exact.size(); ++i) {
    out[i] = dtype_bits_to_float(dtype, float_to_dtype_bits(dtype, static_cast<float>(exact[i])));
  }
  return out;
}

TEST(AttentionCheck, PerRowCheckCatchesOneDroppedKeyThatTheBatchNormMisses) {
  const testing::DecodeShape s = batch();
  const auto pb = testing::make_decode_problem(s, 3);
  const std::vector<double> ref = testing::naive_decode(pb);
  const std::vector<double> broken = rounded(s.dtype, testing::naive_decode(pb, kDroppedKey));

  // The old check: one relative Frobenius norm over the batch passes the broken output.
  const double frobenius = testing::relative_error(broken, ref);
  EXPECT_LT(frobenius, kBf16Tolerance);

  // The new one fails it, on exactly the 190-token sequence's rows (8 query heads).
  const testing::RowCheck c = testing::check_rows(broken, ref, 128, kBf16Tolerance);
  std::printf(
      "key %lld dropped: whole-batch Frobenius error %.4g; per-row errors up to %.4g, "
      "%zu of %zu rows over %.0e\n",
      static_cast<long long>(kDroppedKey), frobenius, c.max_row_error, c.bad_rows, c.rows,
      kBf16Tolerance);
  EXPECT_EQ(c.bad_rows, 8u) << "max row error " << c.max_row_error;
  EXPECT_GE(c.worst_row, 8u);
  EXPECT_LT(c.worst_row, 16u);
  EXPECT_GT(c.max_row_error, 5 * kBf16Tolerance);
  EXPECT_FALSE(testing::rows_match(broken, ref, 128, kBf16Tolerance));
}

TEST(AttentionCheck, PerRowCheckPassesACorrectlyRoundedOutput) {
  const testing::DecodeShape s = batch();
  const auto pb = testing::make_decode_problem(s, 3);
  const std::vector<double> ref = testing::naive_decode(pb);
  EXPECT_TRUE(testing::rows_match(rounded(s.dtype, ref), ref, 128, kBf16Tolerance));
  // An unwritten (NaN-poisoned) value fails its row.
  std::vector<double> poisoned = rounded(s.dtype, ref);
  poisoned[5 * 128 + 7] = std::numeric_limits<double>::quiet_NaN();
  const testing::RowCheck c = testing::check_rows(poisoned, ref, 128, kBf16Tolerance);
  EXPECT_EQ(c.bad_rows, 1u);
  EXPECT_EQ(c.worst_row, 5u);
  EXPECT_EQ(c.non_finite, 1u);
}

}  // namespace
}  // namespace pagedkv
