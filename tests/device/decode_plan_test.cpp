#include "pagedkv/device/decode_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "pagedkv/base/error.hpp"

namespace pagedkv {
namespace {

// An H100/H200-like GPU: 132 SMs, 4 decode CTAs each -> 528 CTAs per wave.
DecodePlanOptions h100() {
  DecodePlanOptions o;
  o.num_sms = 132;
  o.ctas_per_sm = 4;
  return o;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// CTAs that do work under a plan (empty sequences still take one).
std::int64_t working_ctas(const std::vector<std::int32_t>& lens, std::int32_t kv_heads,
                          const DecodePlan& plan, std::int32_t window = 0) {
  std::int64_t total = 0;
  for (std::int32_t len : lens) {
    if (window > 0) len = std::min(len, window);
    const std::int64_t chunks =
        plan.split_kv() ? std::min<std::int64_t>(plan.num_splits, ceil_div(len, plan.kv_chunk_size))
                        : 1;
    total += std::max<std::int64_t>(1, chunks) * kv_heads;
  }
  return total;
}

TEST(DecodePlan, LargeBatchesDoNotSplit) {
  // Batch 64 x 8 KV heads = 512 CTAs, already about one wave.
  const std::vector<std::int32_t> lens(64, 32768);
  EXPECT_FALSE(plan_paged_decode(lens, 8, h100()).split_kv());
  const std::vector<std::int32_t> lens256(256, 4096);
  EXPECT_FALSE(plan_paged_decode(lens256, 8, h100()).split_kv());
}

TEST(DecodePlan, SmallBatchLongContextSplitsToFillOneWave) {
  const std::vector<std::int32_t> lens = {32768};
  const DecodePlan plan = plan_paged_decode(lens, 8, h100());
  ASSERT_TRUE(plan.split_kv());
  // 528 / 8 = 66 chunks at most -> the smallest 64-aligned chunk is 512 tokens, 64 splits.
  EXPECT_EQ(plan.kv_chunk_size, 512);
  EXPECT_EQ(plan.num_splits, 64);
  EXPECT_EQ(working_ctas(lens, 8, plan), 512);

  // Batch 8 at 4k: 64 units, 8 chunks of 512 each.
  const std::vector<std::int32_t> lens8(8, 4096);
  const DecodePlan plan8 = plan_paged_decode(lens8, 8, h100());
  EXPECT_EQ(plan8.kv_chunk_size, 512);
  EXPECT_EQ(plan8.num_splits, 8);
}

TEST(DecodePlan, ShortContextsDoNotSplit) {
  const std::vector<std::int32_t> lens = {200, 256, 3};
  EXPECT_FALSE(plan_paged_decode(lens, 8, h100()).split_kv());  // <= min_chunk_tokens
  EXPECT_FALSE(plan_paged_decode(std::vector<std::int32_t>{}, 8, h100()).split_kv());
  EXPECT_FALSE(plan_paged_decode(std::vector<std::int32_t>{0, 0}, 8, h100()).split_kv());
}

TEST(DecodePlan, SlidingWindowCapsTheAttendedLength) {
  const std::vector<std::int32_t> lens = {32768};
  DecodePlanOptions o = h100();
  o.window_size = 4096;
  const DecodePlan plan = plan_paged_decode(lens, 8, o);
  ASSERT_TRUE(plan.split_kv());
  EXPECT_EQ(plan.kv_chunk_size, 256);  // min chunk: 16 chunks x 8 heads = 128 CTAs <= 528
  EXPECT_EQ(plan.num_splits, 16);
  o.window_size = 200;
  EXPECT_FALSE(plan_paged_decode(lens, 8, o).split_kv());
}

TEST(DecodePlan, OptionsBoundTheSplit) {
  const std::vector<std::int32_t> lens = {100000};
  DecodePlanOptions o = h100();
  o.allow_split = false;
  EXPECT_FALSE(plan_paged_decode(lens, 8, o).split_kv());
  o = h100();
  o.max_splits = 10;
  const DecodePlan capped = plan_paged_decode(lens, 8, o);
  EXPECT_LE(capped.num_splits, 10);
  EXPECT_GE(static_cast<std::int64_t>(capped.num_splits) * capped.kv_chunk_size, 100000);
  o = h100();
  o.min_chunk_tokens = 4000;
  const DecodePlan coarse = plan_paged_decode(lens, 8, o);
  EXPECT_GE(coarse.kv_chunk_size, 4000);
  EXPECT_EQ(coarse.kv_chunk_size % kDecodeChunkAlign, 0);
}

// Properties on random batches: chunk aligned and >= the minimum; the grid covers the longest
// sequence; the working CTAs fit in one wave; and the chunk is the smallest that does.
TEST(DecodePlan, RandomBatchesSatisfyTheHeuristic) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> batch_dist(1, 80);
  std::uniform_int_distribution<int> heads_dist(1, 16);
  std::uniform_int_distribution<int> len_dist(0, 70000);
  std::uniform_int_distribution<int> sms_dist(8, 140);
  int splits_seen = 0;
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::int32_t> lens(static_cast<std::size_t>(batch_dist(rng)));
    for (auto& len : lens) len = len_dist(rng) >> (rng() % 8);
    const std::int32_t kv_heads = heads_dist(rng);
    DecodePlanOptions o;
    o.num_sms = sms_dist(rng);
    o.ctas_per_sm = 1 + static_cast<std::int32_t>(rng() % 4);
    const DecodePlan plan = plan_paged_decode(lens, kv_heads, o);
    const std::int64_t target = static_cast<std::int64_t>(o.num_sms) * o.ctas_per_sm;
    const std::int32_t max_len = *std::max_element(lens.begin(), lens.end());
    const std::int64_t units = static_cast<std::int64_t>(lens.size()) * kv_heads;
    // The smallest chunk the options allow (minimum size, at most max_splits chunks).
    const std::int64_t lo =
        ceil_div(std::max<std::int64_t>(256, ceil_div(max_len, o.max_splits)), 64) * 64;
    if (!plan.split_kv()) {
      EXPECT_EQ(plan.num_splits, 1);
      // Not splitting is right when the batch fills a wave, or when every allowed chunk shorter
      // than the longest sequence would overflow one wave.
      if (units < target) {
        const std::int64_t below = (max_len - 1) / 64 * 64;  // largest aligned chunk < max_len
        if (below >= lo) {
          EXPECT_GT(working_ctas(lens, kv_heads,
                                 DecodePlan{static_cast<std::int32_t>(ceil_div(max_len, below)),
                                            static_cast<std::int32_t>(below)}),
                    target)
              << i;
        }
      }
      continue;
    }
    ++splits_seen;
    EXPECT_LT(units, target) << i;
    EXPECT_EQ(plan.kv_chunk_size % kDecodeChunkAlign, 0) << i;
    EXPECT_GE(plan.kv_chunk_size, 256) << i;
    EXPECT_LE(plan.num_splits, o.max_splits) << i;
    EXPECT_EQ(plan.num_splits, ceil_div(max_len, plan.kv_chunk_size)) << i;
    EXPECT_LE(working_ctas(lens, kv_heads, plan), target) << i;
    if (plan.kv_chunk_size - kDecodeChunkAlign >= lo) {
      DecodePlan smaller = plan;
      smaller.kv_chunk_size -= kDecodeChunkAlign;
      smaller.num_splits = static_cast<std::int32_t>(ceil_div(max_len, smaller.kv_chunk_size));
      EXPECT_GT(working_ctas(lens, kv_heads, smaller), target) << i;
    }
  }
  EXPECT_GT(splits_seen, 100);
}

TEST(DecodePlan, WorkspaceSize) {
  EXPECT_EQ(decode_workspace_bytes(DecodePlan{}, 64, 32, 128), 0u);
  const DecodePlan plan{64, 512};
  const DecodeWorkspaceLayout layout = decode_workspace_layout(plan, 1, 32, 128);
  EXPECT_EQ(layout.partial_out_offset, 0u);
  EXPECT_EQ(layout.partial_lse_offset, 32u * 64 * 128 * 4);
  EXPECT_EQ(layout.total_bytes, 32u * 64 * 128 * 4 + 32 * 64 * 4);
  EXPECT_EQ(decode_workspace_bytes(plan, 1, 32, 128), layout.total_bytes);
  // Parts are 256-byte aligned.
  const DecodeWorkspaceLayout odd = decode_workspace_layout(DecodePlan{3, 64}, 1, 1, 64);
  EXPECT_EQ(odd.partial_lse_offset, 768u);
  EXPECT_EQ(odd.total_bytes, 1024u);
  // q_len query tokens per sequence: q_len times the states.
  const DecodeWorkspaceLayout four = decode_workspace_layout(plan, 1, 32, 128, 4);
  EXPECT_EQ(four.partial_lse_offset, 4u * 32 * 64 * 128 * 4);
  EXPECT_EQ(four.total_bytes, 4u * (32 * 64 * 128 * 4 + 32 * 64 * 4));
  EXPECT_EQ(decode_workspace_bytes(plan, 3, 32, 128, 4), decode_workspace_bytes(plan, 12, 32, 128));
}

template <typename Fn>
void expect_error(Fn&& fn, const std::string& fragment) {
  testing::expect_error(fn, ErrorCode::kInvalidArgument, fragment);
}

TEST(DecodePlan, RejectsBadInput) {
  const std::vector<std::int32_t> lens = {100};
  expect_error([&] { (void)plan_paged_decode(lens, 8, DecodePlanOptions{}); }, "num_sms");
  expect_error([&] { (void)plan_paged_decode(lens, 0, h100()); }, "num_kv_heads");
  DecodePlanOptions o = h100();
  o.max_splits = 0;
  expect_error([&] { (void)plan_paged_decode(lens, 8, o); }, "max_splits");
  o = h100();
  o.window_size = -1;
  expect_error([&] { (void)plan_paged_decode(lens, 8, o); }, "window_size");
  const std::vector<std::int32_t> negative = {5, -3};
  expect_error([&] { (void)plan_paged_decode(negative, 8, h100()); },
               "sequence 1 has negative length -3");
  expect_error([] { (void)decode_workspace_bytes(DecodePlan{0, 0}, 1, 1, 64); }, "num_splits");
  expect_error([] { (void)decode_workspace_bytes(DecodePlan{4, 0}, 1, 1, 64); }, "kv_chunk_size");
  expect_error([] { (void)decode_workspace_bytes(DecodePlan{4, 64}, 1, 0, 64); }, "bad shape");
  expect_error([] { (void)decode_workspace_bytes(DecodePlan{4, 64}, 1, 1, 64, 0); }, "q_len 0");
  // Products past 64 bits (2^64 states: the size wrapped to 0 before the checked products) and
  // sizes just past what the round-ups leave.
  expect_error(
      [] {
        (void)decode_workspace_bytes(DecodePlan{65536, 256}, 65536, 65536, 128, 65536);
      },
      "overflows");
  expect_error(
      [] {
        (void)decode_workspace_bytes(DecodePlan{1 << 30, 256}, 1 << 30, 1 << 30, 1 << 30, 1 << 30);
      },
      "overflows");
  expect_error(
      [] {
        (void)decode_workspace_bytes(DecodePlan{1 << 30, 256}, 1 << 30, 1 << 20, 128);
      },
      "overflows");
  // The largest accepted sizes are exact.
  EXPECT_EQ(decode_workspace_bytes(DecodePlan{1 << 20, 256}, 1 << 10, 1 << 10, 128),
            (std::size_t{1} << 40) * 129 * 4);
}

}  // namespace
}  // namespace pagedkv
