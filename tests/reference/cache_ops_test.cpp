// CPU references of kv_append, copy_blocks and swap_blocks, checked element by element against
// addresses written out per layout (kv_test_util.hpp), plus run coalescing and bad input.
#include "pagedkv/reference/cache_ops.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "kv_test_util.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/device/block_table.hpp"

namespace pagedkv {
namespace {

using testing::LayoutKind;
using testing::NaiveAddressing;

using testing::expect_error;

constexpr std::uint16_t kSentinel = 0xfbfb;

// K and V planes of one layer in one or two buffers, as kv_test_util lays them out.
struct HostPool {
  LayoutKind kind;
  KVLayout layout;
  NaiveAddressing addressing;
  std::vector<std::uint16_t> k;
  std::vector<std::uint16_t> v;  // empty for kInterleaved

  HostPool(LayoutKind kind_, std::int64_t blocks, std::int32_t block_size, std::int32_t heads,
           std::int32_t dim)
      : kind(kind_),
        layout(testing::make_layout(kind_, blocks, block_size, heads, dim)),
        addressing{kind_, block_size, heads, dim} {
    if (kind == LayoutKind::kInterleaved) {
      k.assign(static_cast<std::size_t>(blocks * 2 * layout.block_elements()), kSentinel);
    } else {
      k.assign(static_cast<std::size_t>(layout.plane_elements()), kSentinel);
      v.assign(static_cast<std::size_t>(layout.plane_elements()), kSentinel);
    }
  }
  std::uint16_t* k_plane() { return k.data(); }
  std::uint16_t* v_plane() {
    return kind == LayoutKind::kInterleaved ? k.data() + layout.block_elements() : v.data();
  }
  std::uint16_t& at(bool is_v, std::int64_t block, std::int64_t token, std::int64_t head,
                    std::int64_t d) {
    auto& buffer = (is_v && kind != LayoutKind::kInterleaved) ? v : k;
    return buffer[static_cast<std::size_t>(addressing.offset(is_v, block, token, head, d))];
  }
};

TEST(KVAppendReference, ScattersRowsToTheirSlots) {
  std::mt19937_64 rng(1);
  for (const LayoutKind kind :
       {LayoutKind::kNhd, LayoutKind::kHnd, LayoutKind::kInterleaved, LayoutKind::kPadded}) {
    for (const std::int32_t block_size : {1, 3, 16}) {
      const std::int32_t heads = 3;
      const std::int32_t dim = 16;
      HostPool pool(kind, 12, block_size, heads, dim);
      // 9 new tokens with key rows 56 elements apart (padded) and dense values.
      const std::int64_t n = 9;
      const auto key =
          testing::random_values(KVDtype::kBFloat16, static_cast<std::size_t>(n * 56), rng);
      const auto value = testing::random_values(KVDtype::kBFloat16,
                                                static_cast<std::size_t>(n * heads * dim), rng);
      std::vector<std::int64_t> slots(static_cast<std::size_t>(n));
      std::vector<std::int64_t> all(static_cast<std::size_t>(pool.layout.num_slots()));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      for (std::int64_t i = 0; i < n; ++i)
        slots[static_cast<std::size_t>(i)] = all[static_cast<std::size_t>(i)];
      slots[4] = kSkipSlot;
      KVAppendParams p;
      p.dtype = KVDtype::kBFloat16;
      p.num_tokens = n;
      p.key = key.data();
      p.key_stride_token = 56;
      p.key_stride_head = 16;
      p.value = value.data();
      p.slot_mapping = slots.data();
      p.k_cache = pool.k_plane();
      p.v_cache = pool.v_plane();
      p.layout = pool.layout;
      reference_kv_append(p);

      HostPool expected(kind, 12, block_size, heads, dim);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t slot = slots[static_cast<std::size_t>(i)];
        if (slot < 0) continue;
        for (std::int32_t h = 0; h < heads; ++h) {
          for (std::int32_t d = 0; d < dim; ++d) {
            expected.at(false, slot / block_size, slot % block_size, h, d) =
                key[static_cast<std::size_t>(i * 56 + h * 16 + d)];
            expected.at(true, slot / block_size, slot % block_size, h, d) =
                value[static_cast<std::size_t>((i * heads + h) * dim + d)];
          }
        }
      }
      EXPECT_EQ(pool.k, expected.k) << testing::to_string(kind) << " block " << block_size;
      EXPECT_EQ(pool.v, expected.v) << testing::to_string(kind) << " block " << block_size;
    }
  }
}

// Three fp16 tokens of `rows` (as key and value) into `pool` at `slots`.
KVAppendParams append_params(HostPool& pool, const std::vector<std::uint16_t>& rows,
                             const std::vector<std::int64_t>& slots) {
  KVAppendParams p;
  p.dtype = KVDtype::kFloat16;
  p.num_tokens = 3;
  p.key = rows.data();
  p.value = rows.data();
  p.slot_mapping = slots.data();
  p.k_cache = pool.k_plane();
  p.v_cache = pool.v_plane();
  p.layout = pool.layout;
  return p;
}

TEST(KVAppendReference, RejectsBadSlotsWithoutWriting) {
  HostPool pool(LayoutKind::kNhd, 4, 16, 2, 8);
  std::vector<std::uint16_t> rows(3 * 2 * 8, 0x3c00);
  std::vector<std::int64_t> slots = {0, 64, 5};  // 64 = 4 x 16 is one past the pool
  KVAppendParams p = append_params(pool, rows, slots);
  expect_error([&] { reference_kv_append(p); }, ErrorCode::kOutOfRange, "token 1 has slot 64");
  slots = {7, 3, 7};
  expect_error([&] { reference_kv_append(p); }, ErrorCode::kInvalidArgument,
               "two tokens write slot 7");
  for (const auto x : pool.k) ASSERT_EQ(x, kSentinel);
  p.slot_mapping = nullptr;
  expect_error([&] { reference_kv_append(p); }, ErrorCode::kInvalidArgument,
               "slot_mapping is null");
  p.slot_mapping = slots.data();
  p.key_stride_head = 4;
  expect_error([&] { reference_kv_append(p); }, ErrorCode::kInvalidArgument, "overlap");
  p.key_stride_head = 0;
  p.num_tokens = -1;
  expect_error([&] { reference_kv_append(p); }, ErrorCode::kInvalidArgument, "num_tokens");
  p.num_tokens = 0;
  p.key = nullptr;
  EXPECT_NO_THROW(reference_kv_append(p));  // nothing to do, nothing read
}

TEST(KVAppendReference, RejectsStridesThatOverflow) {
  // Strides whose spans wrap past INT64_MAX once passed the overlap check (2 heads 2^63 - 8
  // apart made a token's span negative) and the copies read far outside key / value.
  HostPool pool(LayoutKind::kNhd, 4, 16, 2, 8);
  std::vector<std::uint16_t> rows(3 * 2 * 8, 0x3c00);
  std::vector<std::int64_t> slots = {0, 1, 2};
  KVAppendParams p = append_params(pool, rows, slots);
  p.key_stride_head = std::numeric_limits<std::int64_t>::max() - 7;
  expect_error([&] { validate(p); }, ErrorCode::kInvalidArgument, "overflow");
  p.key_stride_head = 0;
  p.value_stride_token = std::int64_t{1} << 62;  // 2 x 2^62 to the third token
  expect_error([&] { validate(p); }, ErrorCode::kInvalidArgument, "overflow");
  p.num_tokens = 2;  // 2^62 to the second token fits
  EXPECT_NO_THROW(validate(p));
  for (const auto x : pool.k) ASSERT_EQ(x, kSentinel);
}

TEST(BlockRuns, CoalesceConsecutivePairs) {
  const std::vector<BlockPair> pairs = {{4, 10}, {5, 11}, {6, 12}, {9, 13},
                                        {10, 2}, {11, 3}, {3, 4}};
  EXPECT_EQ(coalesce_block_runs(pairs),
            (std::vector<BlockRun>{{4, 10, 3}, {9, 13, 1}, {10, 2, 2}, {3, 4, 1}}));
  EXPECT_TRUE(coalesce_block_runs({}).empty());
  const std::vector<BlockPair> descending = {{5, 5}, {4, 4}};
  EXPECT_EQ(coalesce_block_runs(descending), (std::vector<BlockRun>{{5, 5, 1}, {4, 4, 1}}));
}

TEST(BlockRuns, ValidatePairs) {
  const std::vector<BlockPair> good = {{0, 3}, {0, 4}, {1, 5}};  // one source, two forks
  EXPECT_NO_THROW(validate_block_pairs(good, 6, 6, true));
  const std::vector<BlockPair> dup = {{0, 3}, {1, 3}};
  expect_error([&] { validate_block_pairs(dup, 6, 6, true); }, ErrorCode::kInvalidArgument,
               "destination block 3 appears twice");
  const std::vector<BlockPair> chain = {{0, 3}, {3, 4}};
  expect_error([&] { validate_block_pairs(chain, 6, 6, true); }, ErrorCode::kInvalidArgument,
               "block 3 is both a source");
  EXPECT_NO_THROW(validate_block_pairs(chain, 6, 6, false));  // different pools: fine
  const std::vector<BlockPair> out = {{0, 6}};
  expect_error([&] { validate_block_pairs(out, 6, 6, true); }, ErrorCode::kOutOfRange,
               "destination block 6");
  const std::vector<BlockPair> neg = {{-1, 2}};
  expect_error([&] { validate_block_pairs(neg, 6, 6, true); }, ErrorCode::kOutOfRange,
               "source block -1");
}

TEST(CopyBlocksReference, CopiesEveryPlaneAndNothingElse) {
  std::mt19937_64 rng(2);
  for (const LayoutKind kind : {LayoutKind::kNhd, LayoutKind::kHnd, LayoutKind::kPadded}) {
    // Two layers: planes K0, V0, K1, V1.
    std::vector<HostPool> layers;
    for (int layer = 0; layer < 2; ++layer) {
      layers.emplace_back(kind, 6, 3, 2, 8);
      for (auto& x : layers.back().k) x = testing::random_values(KVDtype::kFloat16, 1, rng)[0];
      for (auto& x : layers.back().v) x = testing::random_values(KVDtype::kFloat16, 1, rng)[0];
    }
    const std::vector<HostPool> before = layers;
    std::vector<void*> planes;
    for (auto& l : layers) {
      planes.push_back(l.k_plane());
      planes.push_back(l.v_plane());
    }
    const std::vector<BlockPair> pairs = {{1, 4}, {1, 5}, {2, 0}};
    reference_copy_blocks(planes, layers[0].layout, KVDtype::kFloat16, pairs);
    for (int layer = 0; layer < 2; ++layer) {
      HostPool original = before[static_cast<std::size_t>(layer)];
      HostPool want = original;
      HostPool& got = layers[static_cast<std::size_t>(layer)];
      for (const BlockPair& pair : pairs) {
        for (int is_v = 0; is_v < 2; ++is_v) {
          for (int t = 0; t < 3; ++t) {
            for (int h = 0; h < 2; ++h) {
              for (int d = 0; d < 8; ++d) {
                want.at(is_v, pair.dst, t, h, d) = original.at(is_v, pair.src, t, h, d);
              }
            }
          }
        }
      }
      EXPECT_EQ(got.k, want.k) << testing::to_string(kind);
      EXPECT_EQ(got.v, want.v) << testing::to_string(kind);
    }
    const std::vector<BlockPair> bad = {{1, 4}, {4, 5}};
    expect_error([&] { reference_copy_blocks(planes, layers[0].layout, KVDtype::kFloat16, bad); },
                 ErrorCode::kInvalidArgument, "both a source");
  }
}

TEST(SwapBlocksReference, MovesBlocksBetweenPoolsOfDifferentSizes) {
  std::mt19937_64 rng(3);
  // A 10-block "device" pool (interleaved K/V per block) and a 4-block "host" pool (NHD).
  HostPool device(LayoutKind::kInterleaved, 10, 16, 2, 8);
  HostPool host(LayoutKind::kNhd, 4, 16, 2, 8);
  for (auto& x : device.k) x = testing::random_values(KVDtype::kBFloat16, 1, rng)[0];
  const std::vector<const void*> src = {device.k_plane(), device.v_plane()};
  const std::vector<void*> dst = {host.k_plane(), host.v_plane()};
  const std::vector<BlockPair> pairs = {{7, 0}, {8, 1}, {2, 3}};
  reference_swap_blocks(src, device.layout, dst, host.layout, KVDtype::kBFloat16, pairs);
  for (const BlockPair& pair : pairs) {
    for (int is_v = 0; is_v < 2; ++is_v) {
      for (int t = 0; t < 16; ++t) {
        for (int h = 0; h < 2; ++h) {
          for (int d = 0; d < 8; ++d) {
            ASSERT_EQ(host.at(is_v, pair.dst, t, h, d), device.at(is_v, pair.src, t, h, d));
          }
        }
      }
    }
  }
  for (int t = 0; t < 16; ++t) EXPECT_EQ(host.at(false, 2, t, 0, 0), kSentinel);  // untouched

  // And back: host block 3 -> device block 9.
  const std::vector<const void*> back_src = {host.k_plane(), host.v_plane()};
  const std::vector<void*> back_dst = {device.k_plane(), device.v_plane()};
  const std::vector<BlockPair> back = {{3, 9}};
  reference_swap_blocks(back_src, host.layout, back_dst, device.layout, KVDtype::kBFloat16, back);
  EXPECT_EQ(device.at(true, 9, 15, 1, 7), device.at(true, 2, 15, 1, 7));

  // Mismatched layouts and bad ids are refused.
  HostPool hnd(LayoutKind::kHnd, 4, 16, 2, 8);
  const std::vector<void*> hnd_dst = {hnd.k_plane(), hnd.v_plane()};
  expect_error(
      [&] {
        reference_swap_blocks(src, device.layout, hnd_dst, hnd.layout, KVDtype::kBFloat16, pairs);
      },
      ErrorCode::kInvalidArgument, "same blocks");
  HostPool padded(LayoutKind::kPadded, 4, 16, 2, 8);
  const std::vector<void*> padded_dst = {padded.k_plane(), padded.v_plane()};
  expect_error(
      [&] {
        reference_swap_blocks(src, device.layout, padded_dst, padded.layout, KVDtype::kBFloat16,
                              pairs);
      },
      ErrorCode::kInvalidArgument, "same blocks");
  const std::vector<BlockPair> too_far = {{7, 4}};
  expect_error(
      [&] {
        reference_swap_blocks(src, device.layout, dst, host.layout, KVDtype::kBFloat16, too_far);
      },
      ErrorCode::kOutOfRange, "destination block 4");
  const std::vector<void*> one = {host.k_plane()};
  expect_error(
      [&] {
        reference_swap_blocks(src, device.layout, one, host.layout, KVDtype::kBFloat16, pairs);
      },
      ErrorCode::kInvalidArgument, "same non-zero number");
}

TEST(SwapBlocksReference, PaddedLayoutsAreRefused) {
  HostPool a(LayoutKind::kPadded, 4, 16, 2, 8);
  HostPool b(LayoutKind::kPadded, 4, 16, 2, 8);
  expect_error([&] { validate_swap_layouts(a.layout, b.layout, 2, 2); },
               ErrorCode::kInvalidArgument, "contiguous");
}

}  // namespace
}  // namespace pagedkv
