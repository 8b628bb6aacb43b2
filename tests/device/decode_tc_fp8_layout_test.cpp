// The FP8 tensor-core decode kernel's host-checkable pieces (kernels/internal/
// decode_tc_fp8_layout.hpp), without a GPU:
//   - which layouts it takes: every scaled (NHD / HND) layout and every dense one, at any block
//     size and head count (stride_block is rounded to 16 bytes), and not a layout with 8-byte
//     strides;
//   - the code and scale byte offsets of each token against KVLayout::offset and
//     scale_byte_offset, -1 past the range and for block ids outside the pool;
//   - a host model of one warp's staging and conversion: the global code rows copied by the
//     kernel's copy map into the row-major staging slice, each lane converting its own chunks into
//     the swizzled 16-bit slice, then every (key, dim) read back where the 16-bit kernel's
//     ldmatrix code reads it (swizzled_chunk) must be the code's exact value; and a wrong half map
//     is caught;
//   - the conversion is exact: every E4M3 / E5M2 value is an fp16 and a bf16 value;
//   - the shared-memory budget: regions in order, the merge scratch fits, the CTAs per SM, and
//     scripts/kernel-resources' DYNAMIC_SMEM holds these sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "internal/decode_tc_fp8_layout.hpp"
#include "internal/decode_tc_layout.hpp"
#include "pagedkv/device/fp8.hpp"
#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/device/kv_layout.hpp"

namespace pagedkv {
namespace {

using detail::TcFp8DecodeShape;

bool takes(const KVLayout& l) {
  return detail::tc_fp8_strides_ok(l.stride_block, l.stride_token, l.stride_head);
}

TEST(DecodeTcFp8Layout, TakesEveryScaledAndDenseLayout) {
  for (const std::int32_t head_dim : {64, 128, 256}) {
    for (std::int32_t block_size = 1; block_size <= KVLayout::kMaxBlockSize; ++block_size) {
      for (const std::int32_t kv_heads : {1, 2, 3, 8}) {
        SCOPED_TRACE(std::to_string(head_dim) + "/" + std::to_string(block_size) + "/" +
                     std::to_string(kv_heads));
        EXPECT_TRUE(takes(KVLayout::nhd_scaled(4, block_size, kv_heads, head_dim)));
        EXPECT_TRUE(takes(KVLayout::hnd_scaled(4, block_size, kv_heads, head_dim)));
        EXPECT_TRUE(takes(KVLayout::nhd(4, block_size, kv_heads, head_dim)));
        EXPECT_TRUE(takes(KVLayout::hnd(4, block_size, kv_heads, head_dim)));
      }
    }
  }
  KVLayout padded = KVLayout::nhd(4, 16, 2, 64);
  padded.stride_head = 72;
  padded.stride_token = 144;
  padded.stride_block = 16 * 144;
  ASSERT_NO_THROW(padded.validate());
  EXPECT_FALSE(takes(padded));
  padded = KVLayout::nhd(4, 16, 2, 64);
  padded.stride_block += 8;
  EXPECT_FALSE(takes(padded));
}

TEST(DecodeTcFp8Layout, TokenOffsetsMatchTheLayout) {
  for (const bool scaled : {false, true}) {
    for (const bool hnd : {false, true}) {
      for (const std::int32_t block_size : {1, 7, 16, 256}) {
        const std::int32_t kv_heads = 3;
        const std::int64_t num_blocks = 5;
        const KVLayout l = scaled
                               ? (hnd ? KVLayout::hnd_scaled(num_blocks, block_size, kv_heads, 128)
                                      : KVLayout::nhd_scaled(num_blocks, block_size, kv_heads, 128))
                               : (hnd ? KVLayout::hnd(num_blocks, block_size, kv_heads, 128)
                                      : KVLayout::nhd(num_blocks, block_size, kv_heads, 128));
        // Blocks 3, 0, -1, 4, 5 (the last two past / outside the pool as -1 and 5).
        const std::vector<std::int32_t> row = {3, 0, -1, 4, 5};
        detail::TcPageGeometry g{
            l.stride_block, l.stride_token, 0,
            l.num_blocks,   block_size,     detail::tc_block_shift(block_size)};
        for (std::int32_t head = 0; head < kv_heads; ++head) {
          g.head_offset = head * l.stride_head;
          const int end = 5 * block_size - 1;
          for (int t = 0; t < 5 * block_size; ++t) {
            const detail::TcFp8TokenOffsets off =
                detail::tc_fp8_token_offsets(g, l.scale_offset, kv_heads, head, row.data(), t, end);
            const std::int32_t block = row[static_cast<std::size_t>(t / block_size)];
            if (t >= end || block < 0 || block >= num_blocks) {
              EXPECT_EQ(off.code, -1) << t;
              EXPECT_EQ(off.scale, -1) << t;
              continue;
            }
            EXPECT_EQ(off.code, l.offset(block, t % block_size, head)) << t;
            EXPECT_EQ(off.code % 16, 0) << t;
            if (scaled) {
              EXPECT_EQ(off.scale, l.scale_byte_offset(block, t % block_size, head)) << t;
              EXPECT_EQ(off.scale % 4, 0) << t;
            } else {
              EXPECT_EQ(off.scale, -1) << t;
            }
          }
        }
      }
    }
  }
}

std::uint16_t exact_16bit(KVDtype dtype, Fp8Format format, std::uint8_t code) {
  return float_to_dtype_bits(dtype, fp8_bits_to_float(format, code));
}

TEST(DecodeTcFp8Layout, EveryFp8ValueIsExactInFp16AndBf16) {
  for (const Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (int code = 0; code < 256; ++code) {
      const float x = fp8_bits_to_float(format, static_cast<std::uint8_t>(code));
      if (std::isnan(x)) continue;
      for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
        const float back =
            dtype_bits_to_float(dtype, exact_16bit(dtype, format, static_cast<std::uint8_t>(code)));
        EXPECT_EQ(std::memcmp(&back, &x, sizeof x), 0)
            << "code " << code << " " << x << " -> " << back;
      }
    }
  }
}

// One warp's slice through the kernel's maps; `flip` swaps the two halves (a broken map).
template <int kHeadDim>
bool staged_slice_reads_back(Fp8Format format, KVDtype dtype, bool flip, std::uint64_t seed) {
  using S = TcFp8DecodeShape<kHeadDim>;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  // Global code rows (16 keys), e.g. 3 x head_dim apart.
  const std::size_t row_stride = 3 * kHeadDim;
  std::vector<std::uint8_t> global(16 * row_stride);
  for (auto& b : global) b = static_cast<std::uint8_t>(byte(rng));
  // Copies: lane, copy i -> staging bytes [16 idx, 16 idx + 16).
  std::vector<std::uint8_t> staging(static_cast<std::size_t>(S::kSliceBytes), 0);
  std::vector<int> copied(staging.size() / 16, 0);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < S::kCopiesPerLane; ++i) {
      const detail::MmaCoord c = detail::fp8_slice_copy(lane, i, S::kFp8Chunks);
      const std::size_t idx = static_cast<std::size_t>(lane + 32 * i);
      std::memcpy(&staging[16 * idx],
                  &global[static_cast<std::size_t>(c.row) * row_stride + 16 * c.col], 16);
      ++copied[idx];
    }
  }
  for (const int n : copied) {
    if (n != 1) return false;
  }
  // Conversion: each lane its own chunks, into the swizzled 16-bit slice.
  std::vector<std::uint16_t> half(static_cast<std::size_t>(16 * kHeadDim), 0xdead);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < S::kCopiesPerLane; ++i) {
      const detail::MmaCoord c = detail::fp8_slice_copy(lane, i, S::kFp8Chunks);
      const std::uint8_t* in = &staging[16 * static_cast<std::size_t>(lane + 32 * i)];
      for (int h = 0; h < 2; ++h) {
        const int chunk = detail::fp8_half_chunk(c.row, c.col, flip ? 1 - h : h, S::kChunks);
        for (int e = 0; e < 8; ++e) {
          half[static_cast<std::size_t>(chunk) * 8 + static_cast<std::size_t>(e)] =
              exact_16bit(dtype, format, in[8 * h + e]);
        }
      }
    }
  }
  // Read back as the ldmatrix code addresses it: key r, dims 8 c .. 8 c + 7 at swizzled_chunk.
  for (int r = 0; r < 16; ++r) {
    for (int d = 0; d < kHeadDim; ++d) {
      const std::size_t at =
          static_cast<std::size_t>(detail::swizzled_chunk(r, d / 8, S::kChunks)) * 8 +
          static_cast<std::size_t>(d % 8);
      const std::uint8_t code =
          global[static_cast<std::size_t>(r) * row_stride + static_cast<std::size_t>(d)];
      if (half[at] != exact_16bit(dtype, format, code)) return false;
    }
  }
  return true;
}

TEST(DecodeTcFp8Layout, StagingAndConversionFeedTheLdmatrixLayout) {
  for (const Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
      EXPECT_TRUE(staged_slice_reads_back<64>(format, dtype, false, 1));
      EXPECT_TRUE(staged_slice_reads_back<128>(format, dtype, false, 2));
      EXPECT_TRUE(staged_slice_reads_back<256>(format, dtype, false, 3));
    }
  }
}

TEST(DecodeTcFp8Layout, AWrongHalfMapIsCaught) {
  EXPECT_FALSE(staged_slice_reads_back<128>(Fp8Format::kE4M3, KVDtype::kFloat16, true, 4));
}

template <int kHeadDim>
void check_budget() {
  using S = TcFp8DecodeShape<kHeadDim>;
  SCOPED_TRACE(kHeadDim);
  EXPECT_GE(S::kStages, 2);
  // Regions in order, no overlap: ring, 16-bit slices, scales, code table, scale table, masks.
  EXPECT_EQ(S::kHalfOffset, S::kRingBytes);
  EXPECT_EQ(S::kScaleOffset, S::kHalfOffset + S::kHalfBytes);
  EXPECT_EQ(S::kCodeTableOffset, S::kScaleOffset + S::kScaleBytes);
  EXPECT_EQ(S::kScaleTableOffset, S::kCodeTableOffset + S::kOffsetBytes);
  EXPECT_EQ(S::kMaskOffset, S::kScaleTableOffset + S::kOffsetBytes);
  EXPECT_GE(S::kMaskBytes, sizeof(std::uint32_t) * detail::kTcWarps * S::kStages);
  EXPECT_LE(S::kSmemBytes, 227u * 1024u);
  EXPECT_LE(S::kScratchBytes, S::kRingBytes + S::kHalfBytes);
  // Each lane copies (and converts) whole 16-byte chunks; the 16 keys x head_dim bytes slice.
  EXPECT_EQ(S::kCopiesPerLane * 32 * 16, detail::kTcWarpTokens * kHeadDim);
}

TEST(DecodeTcFp8Layout, SharedMemoryBudget) {
  check_budget<64>();
  check_budget<128>();
  check_budget<256>();
  // The launch bound: CTAs per SM that shared memory allows.
  EXPECT_EQ(TcFp8DecodeShape<64>::kMinCtasPerSm, 4);
  EXPECT_EQ(TcFp8DecodeShape<128>::kMinCtasPerSm, 2);
  EXPECT_EQ(TcFp8DecodeShape<256>::kMinCtasPerSm, 2);
}

TEST(DecodeTcFp8Layout, KernelResourcesScriptKnowsTheSharedMemory) {
  std::ifstream in(PAGEDKV_KERNEL_RESOURCES_SCRIPT);
  ASSERT_TRUE(in) << PAGEDKV_KERNEL_RESOURCES_SCRIPT;
  std::stringstream text;
  text << in.rdbuf();
  std::ostringstream want;
  want << "\"tc_fp8_decode_kernel\": {64: " << TcFp8DecodeShape<64>::kSmemBytes
       << ", 128: " << TcFp8DecodeShape<128>::kSmemBytes
       << ", 256: " << TcFp8DecodeShape<256>::kSmemBytes << "}";
  EXPECT_NE(text.str().find(want.str()), std::string::npos) << "missing: " << want.str();
}

}  // namespace
}  // namespace pagedkv
