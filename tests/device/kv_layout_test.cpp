#include "pagedkv/device/kv_layout.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <string>

#include "expect_error.hpp"
#include "pagedkv/base/error.hpp"

namespace pagedkv {
namespace {

template <typename Fn>
void expect_error(Fn&& fn, const std::string& fragment) {
  testing::expect_error(fn, ErrorCode::kInvalidArgument, fragment);
}

TEST(KVSizing, PublishedModels) {
  // Llama-2-7B: 32 layers, 32 KV heads (MHA), head_dim 128, fp16 -> 512 KiB per token.
  const KVCacheSpec llama2_7b{32, 32, 128, KVDtype::kFloat16};
  EXPECT_EQ(kv_bytes_per_token(llama2_7b), 512 * 1024);
  // Llama-3-8B: 32 layers, 8 KV heads for 32 query heads (GQA), bf16 -> 128 KiB per token.
  const KVCacheSpec llama3_8b{32, 8, 128, KVDtype::kBFloat16};
  EXPECT_EQ(kv_bytes_per_token(llama3_8b), 128 * 1024);
  EXPECT_EQ(kv_bytes_per_block(llama3_8b, 16), 2 * 1024 * 1024);
  // 40 GiB of HBM holds 20480 blocks of 16 tokens of Llama-3-8B.
  EXPECT_EQ(num_blocks_for_budget(llama3_8b, 16, std::int64_t{40} << 30), 20480);
  EXPECT_EQ(num_blocks_for_budget(llama3_8b, 16, (std::int64_t{2} << 20) - 1), 0);
}

TEST(KVSizing, RejectsBadSpecs) {
  expect_error([] { (void)kv_bytes_per_token(KVCacheSpec{0, 8, 128}); }, "num_layers");
  expect_error([] { (void)kv_bytes_per_token(KVCacheSpec{32, -1, 128}); }, "num_kv_heads");
  expect_error([] { (void)kv_bytes_per_block(KVCacheSpec{32, 8, 128}, 0); }, "block_size");
  expect_error([] { (void)num_blocks_for_budget(KVCacheSpec{32, 8, 128}, 16, -1); }, "budget");
  expect_error(
      [] {
        (void)kv_bytes_per_block(KVCacheSpec{1 << 30, 1 << 30, 1 << 20}, 16);
      },
      "overflows");
}

TEST(KVLayout, NhdAndHndStrides) {
  const KVLayout nhd = KVLayout::nhd(10, 16, 8, 128);
  EXPECT_EQ(nhd.stride_head, 128);
  EXPECT_EQ(nhd.stride_token, 8 * 128);
  EXPECT_EQ(nhd.stride_block, 16 * 8 * 128);
  EXPECT_EQ(nhd.offset(2, 3, 5), 2 * 16384 + 3 * 1024 + 5 * 128);
  EXPECT_EQ(nhd.plane_elements(), 10 * 16384);
  EXPECT_EQ(nhd.num_slots(), 160);
  EXPECT_EQ(nhd.block_elements(), 16384);
  EXPECT_TRUE(nhd.block_is_contiguous());

  const KVLayout hnd = KVLayout::hnd(10, 16, 8, 128);
  EXPECT_EQ(hnd.stride_token, 128);
  EXPECT_EQ(hnd.stride_head, 16 * 128);
  EXPECT_EQ(hnd.stride_block, 16 * 8 * 128);
  EXPECT_EQ(hnd.offset(2, 3, 5), 2 * 16384 + 5 * 2048 + 3 * 128);
  EXPECT_EQ(hnd.plane_elements(), 10 * 16384);
  EXPECT_TRUE(hnd.block_is_contiguous());
}

// Every (block, token, head) row of a valid layout is distinct and inside plane_elements().
TEST(KVLayout, RowsAreDisjointAndInsideThePlane) {
  for (const KVLayout& layout :
       {KVLayout::nhd(5, 3, 2, 8), KVLayout::hnd(5, 3, 2, 8), KVLayout::nhd(4, 1, 3, 16),
        KVLayout{4, 3, 2, 8, 2 * 48, 16, 8, 0} /* interleaved K/V blocks */,
        KVLayout{4, 3, 2, 8, 96, 32, 16, 0} /* padded rows */}) {
    layout.validate();
    std::set<std::int64_t> elements;
    for (std::int64_t b = 0; b < layout.num_blocks; ++b) {
      for (std::int32_t t = 0; t < layout.block_size; ++t) {
        for (std::int32_t h = 0; h < layout.num_kv_heads; ++h) {
          for (std::int32_t d = 0; d < layout.head_dim; ++d) {
            const std::int64_t e = layout.offset(b, t, h) + d;
            EXPECT_LT(e, layout.plane_elements());
            EXPECT_TRUE(elements.insert(e).second) << "overlap at " << e;
          }
        }
      }
    }
  }
  EXPECT_FALSE((KVLayout{4, 3, 2, 8, 96, 32, 16, 0}.block_is_contiguous()));
  EXPECT_TRUE((KVLayout{4, 3, 2, 8, 96, 16, 8, 0}.block_is_contiguous()));  // interleaved K/V
}

TEST(KVLayout, LargePoolsUse64BitOffsets) {
  // 2^31 elements and beyond: 140000 blocks of 16 x 8 x 128.
  const KVLayout layout = KVLayout::nhd(140000, 16, 8, 128);
  EXPECT_GT(layout.plane_elements(), std::int64_t{1} << 31);
  EXPECT_EQ(layout.offset(139999, 15, 7), 139999LL * 16384 + 15 * 1024 + 7 * 128);
}

TEST(KVLayout, RejectsBadLayouts) {
  expect_error([] { (void)KVLayout::nhd(0, 16, 8, 128); }, "num_blocks");
  expect_error([] { (void)KVLayout::nhd(1, 0, 8, 128); }, "block_size");
  expect_error([] { (void)KVLayout::nhd(1, 257, 8, 128); }, "at most 256");
  expect_error([] { (void)KVLayout::nhd(1, 16, 8, 100); }, "multiple of 8");
  expect_error([] { (void)KVLayout::nhd(1, 16, 0, 128); }, "num_kv_heads");
  KVLayout layout = KVLayout::nhd(4, 16, 8, 128);
  layout.stride_head = 64;  // heads overlap
  expect_error([&] { layout.validate(); }, "overlap");
  layout = KVLayout::nhd(4, 16, 8, 128);
  layout.stride_block = 1024;  // blocks overlap
  expect_error([&] { layout.validate(); }, "overlap");
  layout = KVLayout::nhd(4, 16, 8, 128);
  layout.stride_token = 1028;
  expect_error([&] { layout.validate(); }, "multiple of 8 elements");
  layout = KVLayout::nhd(4, 16, 8, 128);
  layout.stride_token = 0;
  expect_error([&] { layout.validate(); }, "stride_token must be positive");
  EXPECT_NO_THROW(KVLayout::nhd(1, 256, 1, 8));
}

TEST(KVLayout, RejectsSizesThatOverflow) {
  // The factories' stride products once wrapped (signed overflow) before validate() saw them:
  // stride_block came out 0 and the error blamed it instead of the sizes.
  expect_error([] { (void)KVLayout::nhd(1, 256, 1 << 30, 1 << 30); }, "overflows 64 bits");
  expect_error([] { (void)KVLayout::hnd(1, 256, 1 << 30, 1 << 30); }, "overflows 64 bits");
  expect_error([] { (void)KVLayout::nhd_scaled(1, 256, 1 << 30, 1 << 30); }, "overflows 64 bits");
  // A scale_offset whose scales end past INT64_MAX: scale_offset + block_scale_bytes() wrapped,
  // so the room check passed and plane_elements() overflowed.
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max() - 7;
  for (const std::int64_t blocks : {1, 2}) {
    KVLayout layout = KVLayout::nhd(blocks, 16, 1, 8);
    layout.scale_offset = huge;
    expect_error([&] { layout.validate(); }, "overflows 64 bits");
  }
  // The largest scale_offset that fits is accepted.
  KVLayout fits = KVLayout::nhd(1, 16, 1, 8);
  fits.scale_offset = (std::numeric_limits<std::int64_t>::max() - 16 * 4) / 8 * 8;
  EXPECT_NO_THROW(fits.validate());
  EXPECT_LE(fits.plane_elements(), std::numeric_limits<std::int64_t>::max());
  EXPECT_GT(fits.plane_elements(), 0);
}

TEST(KVSizing, Fp8CountsCodesAndScales) {
  // Llama-3-8B with FP8 KV: 1 byte per value; per-(token, head) scales add 4 bytes per row.
  const KVCacheSpec bf16{32, 8, 128, KVDtype::kBFloat16};
  const KVCacheSpec tensor{32, 8, 128, KVDtype::kFp8E4M3, KVScaleMode::kPerTensor};
  const KVCacheSpec rows{32, 8, 128, KVDtype::kFp8E5M2, KVScaleMode::kPerTokenHead};
  EXPECT_EQ(kv_bytes_per_token(tensor), 64 * 1024);
  EXPECT_EQ(kv_bytes_per_token(rows), 2 * 32 * 8 * (128 + 4));  // 67584
  EXPECT_EQ(kv_bytes_per_block(tensor, 16), 1024 * 1024);
  EXPECT_EQ(kv_bytes_per_block(rows, 16), 2 * 32 * 16 * 8 * 132);
  // The block bytes are what the layout's planes hold per block: 2 x layers x stride_block.
  EXPECT_EQ(kv_bytes_per_block(rows, 16),
            2 * 32 * KVLayout::nhd_scaled(4, 16, 8, 128).stride_block);
  // Padding to 16 bytes: 1 token x 1 head x (8 + 4) = 12 -> 16 per plane.
  const KVCacheSpec tiny{1, 1, 8, KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead};
  EXPECT_EQ(kv_bytes_per_block(tiny, 1), 2 * 16);
  EXPECT_EQ(KVLayout::nhd_scaled(3, 1, 1, 8).stride_block, 16);
  // Twice the blocks in the same memory (per tensor), 1.94x with per-row scales.
  const std::int64_t budget = std::int64_t{40} << 30;
  EXPECT_EQ(num_blocks_for_budget(bf16, 16, budget), 20480);
  EXPECT_EQ(num_blocks_for_budget(tensor, 16, budget), 40960);
  EXPECT_EQ(num_blocks_for_budget(rows, 16, budget), budget / (2 * 32 * 16 * 8 * 132));
  // A format that is not a cache format.
  expect_error(
      [] {
        (void)kv_bytes_per_token(KVCacheSpec{32, 8, 128, KVDtype::kFp8E4M3});
      },
      "needs a scale mode");
  expect_error(
      [] {
        (void)kv_bytes_per_token(
            KVCacheSpec{32, 8, 128, KVDtype::kBFloat16, KVScaleMode::kPerTensor});
      },
      "takes no scale mode");
}

TEST(KVLayout, ScaledLayoutsPutEachBlocksScalesAfterItsCodes) {
  const KVLayout nhd = KVLayout::nhd_scaled(10, 16, 8, 128);
  EXPECT_EQ(nhd.scale_offset, 16 * 8 * 128);
  EXPECT_EQ(nhd.stride_block, 16 * 8 * 128 + 16 * 8 * 4);
  EXPECT_EQ(nhd.block_scale_bytes(), 512);
  EXPECT_EQ(nhd.block_span(), nhd.stride_block);
  EXPECT_EQ(nhd.offset(2, 3, 5), 2 * nhd.stride_block + 3 * 1024 + 5 * 128);
  EXPECT_EQ(nhd.scale_byte_offset(2, 3, 5), 2 * nhd.stride_block + 16384 + (3 * 8 + 5) * 4);
  EXPECT_EQ(nhd.plane_elements(), 10 * nhd.stride_block);
  EXPECT_TRUE(nhd.block_is_contiguous());
  const KVLayout hnd = KVLayout::hnd_scaled(10, 16, 8, 128);
  EXPECT_EQ(hnd.offset(2, 3, 5), 2 * hnd.stride_block + 5 * 2048 + 3 * 128);
  EXPECT_EQ(hnd.scale_byte_offset(2, 3, 5), nhd.scale_byte_offset(2, 3, 5));
  // Every scale of every block is distinct and lies past its block's codes, before the next.
  std::set<std::int64_t> seen;
  const KVLayout small = KVLayout::nhd_scaled(3, 5, 3, 8);
  for (std::int64_t b = 0; b < 3; ++b) {
    for (std::int64_t t = 0; t < 5; ++t) {
      for (std::int64_t h = 0; h < 3; ++h) {
        const std::int64_t at = small.scale_byte_offset(b, t, h);
        EXPECT_TRUE(seen.insert(at).second);
        EXPECT_GE(at, small.offset(b, 4, 2) + 8);
        EXPECT_LE(at + 4, (b + 1) * small.stride_block);
        EXPECT_EQ(at % 4, 0);
      }
    }
  }
  EXPECT_EQ(small.stride_block % 16, 0);
  EXPECT_FALSE(KVLayout::nhd(4, 16, 8, 128).has_scales());
  KVLayout bad = nhd;
  bad.scale_offset = 16 * 8 * 128 - 8;  // on the last row
  expect_error([&] { bad.validate(); }, "scale_offset");
  bad = nhd;
  bad.scale_offset = 16 * 8 * 128 + 4;  // not a multiple of 8
  expect_error([&] { bad.validate(); }, "scale_offset");
  bad = nhd;
  bad.stride_block = 16 * 8 * 128 + 256;  // no room for the scales
  expect_error([&] { bad.validate(); }, "no room");
  bad = nhd;
  bad.scale_offset = -8;
  expect_error([&] { bad.validate(); }, "scale_offset");
  bad = nhd;
  bad.scale_offset += 16;  // padded: valid, but not one dense range
  bad.stride_block += 16;
  EXPECT_NO_THROW(bad.validate());
  EXPECT_FALSE(bad.block_is_contiguous());
}

}  // namespace
}  // namespace pagedkv
