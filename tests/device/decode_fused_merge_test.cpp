// The arithmetic of kTensorCoreFusedMerge's in-kernel merge (kernels/internal/
// decode_fused_merge_math.hpp), on the host: folding split-KV chunk results one at a time with a
// running maximum gives the two-pass merge out = sum_s 2^(l_s - M) o_s / sum_s 2^(l_s - M),
// M = max_s l_s, whatever order the chunks' lse come in (rising, so every chunk rescales; falling;
// equal; random; spread over +-120, where a weight without the maximum subtracted overflows or
// underflows float), and for 1 to 300 chunks (the kernel merges up to the plan's num_splits);
// padding chunks (lse -inf) after the first change nothing.
#include "internal/decode_fused_merge_math.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

namespace pagedkv {
namespace {

constexpr int kPer = 4;
using Merge = detail::OnlineChunkMerge<kPer>;

struct Chunk {
  float lse;
  float o[kPer];
};

// The two-pass merge in double precision.
std::vector<double> reference(const std::vector<Chunk>& chunks) {
  double m = -INFINITY;
  for (const Chunk& c : chunks) m = std::max(m, static_cast<double>(c.lse));
  double weight_sum = 0.0;
  std::vector<double> acc(kPer, 0.0);
  for (const Chunk& c : chunks) {
    const double w = std::exp2(static_cast<double>(c.lse) - m);
    weight_sum += w;
    for (int i = 0; i < kPer; ++i) acc[static_cast<std::size_t>(i)] += w * c.o[i];
  }
  for (double& a : acc) a /= weight_sum;
  return acc;
}

::testing::AssertionResult merged_matches(const std::vector<Chunk>& chunks) {
  Merge merge;
  for (const Chunk& c : chunks) merge.add(c.lse, c.o);
  const float inv = merge.inverse_weight();
  if (!(inv > 0.0f && inv <= 1.0f)) {
    return ::testing::AssertionFailure() << "1 / weight sum = " << inv << ", outside (0, 1]";
  }
  const std::vector<double> want = reference(chunks);
  for (int i = 0; i < kPer; ++i) {
    const double got = merge.out(i, inv);
    const double w = want[static_cast<std::size_t>(i)];
    if (!(std::fabs(got - w) <= 1e-5 * std::max(1.0, std::fabs(w)))) {
      return ::testing::AssertionFailure() << "column " << i << ": merged " << got << ", two-pass "
                                           << w << " (" << chunks.size() << " chunks)";
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<Chunk> make_chunks(std::size_t n, std::mt19937_64& rng, int order) {
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  std::uniform_real_distribution<float> lse(-30.0f, 30.0f);
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f);
  std::vector<Chunk> chunks(n);
  for (Chunk& c : chunks) {
    c.lse = order == 4 ? wide(rng) : lse(rng);
    for (float& v : c.o) v = value(rng);
  }
  const auto by_lse = [](const Chunk& a, const Chunk& b) { return a.lse < b.lse; };
  if (order == 0) std::sort(chunks.begin(), chunks.end(), by_lse);    // rising: rescale each time
  if (order == 1) std::sort(chunks.rbegin(), chunks.rend(), by_lse);  // falling: never
  if (order == 2) {
    for (Chunk& c : chunks) c.lse = 7.25f;  // equal weights
  }
  return chunks;
}

TEST(DecodeFusedMerge, OnlineMergeEqualsTheTwoPassMergeInEveryOrder) {
  std::mt19937_64 rng(35);
  for (const std::size_t n : {1u, 2u, 3u, 7u, 8u, 9u, 32u, 64u, 257u, 300u}) {
    for (int order = 0; order < 5; ++order) {
      for (int trial = 0; trial < 20; ++trial) {
        EXPECT_TRUE(merged_matches(make_chunks(n, rng, order)))
            << "n " << n << " order " << order << " trial " << trial;
      }
    }
  }
}

TEST(DecodeFusedMerge, OneChunkIsItsOwnOutputAndTheLargestChunkHasWeightOne) {
  Merge one;
  const float o[kPer] = {0.5f, -1.25f, 3.0f, 0.0f};
  one.add(-80.0f, o);  // any finite lse: its weight is 2^0
  EXPECT_EQ(one.inverse_weight(), 1.0f);
  for (int i = 0; i < kPer; ++i) EXPECT_EQ(one.out(i, one.inverse_weight()), o[i]);
  // A smaller chunk after a larger one adds a weight below 1; the sum stays anchored at 1.
  Merge two;
  two.add(10.0f, o);
  two.add(9.0f, o);
  EXPECT_FLOAT_EQ(1.0f / two.inverse_weight(), 1.5f);
  Merge rising;
  rising.add(9.0f, o);
  rising.add(10.0f, o);  // rescales the first chunk's weight from 1 to 1/2
  EXPECT_FLOAT_EQ(1.0f / rising.inverse_weight(), 1.5f);
}

// The kernel pads a batch of 8 chunks past n with lse -inf and zero outputs: after a finite first
// chunk they change nothing, bit for bit.
TEST(DecodeFusedMerge, PaddingChunksAfterTheFirstAddNothing) {
  std::mt19937_64 rng(8);
  for (const std::size_t n : {1u, 5u, 9u, 31u}) {
    const std::vector<Chunk> chunks = make_chunks(n, rng, 3);
    Merge plain;
    Merge padded;
    for (const Chunk& c : chunks) {
      plain.add(c.lse, c.o);
      padded.add(c.lse, c.o);
    }
    const float zero[kPer] = {};
    for (int pad = 0; pad < 7; ++pad) padded.add(-INFINITY, zero);
    EXPECT_EQ(padded.m, plain.m);
    EXPECT_EQ(padded.weight_sum, plain.weight_sum) << n;
    for (int i = 0; i < kPer; ++i) EXPECT_EQ(padded.acc[i], plain.acc[i]) << n << " column " << i;
  }
}

}  // namespace
}  // namespace pagedkv
