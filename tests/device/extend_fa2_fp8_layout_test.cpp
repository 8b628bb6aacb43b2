// The FP8 tensor-core extend kernel's host-checkable pieces (kernels/internal/
// extend_fa2_fp8_layout.hpp), without a GPU:
//   - its tile is kFa2's 4-warp tile at each head_dim (rows, keys, stages; the host's tile count
//     and split plan use those rows);
//   - a host model of one CTA's staging and conversion of a K (or V) tile: every thread copies its
//     chunks of the tile's code rows (the kernel's copy map) into the row-major staging tile, then
//     converts exactly the chunks it copied into the swizzled 16-bit tile (the half map); every
//     (key, dim) read back where kFa2's ldmatrix code reads it (fa2_swizzled of row key, chunk
//     dim / 8) must be that key's code for that dim, and every staging chunk is written once;
//     wrong maps (rows and chunks swapped, halves swapped, another thread's chunk converted) fail;
//   - the key mask helpers;
//   - the shared-memory budget: regions in order and aligned, whole copies per thread, the CTAs
//     per SM, and scripts/kernel-resources' DYNAMIC_SMEM holds these sizes.
// The conversion's exactness (every E4M3 / E5M2 value is an fp16 and a bf16 value) is
// tests/device/decode_tc_fp8_layout_test.cpp's; the model here moves codes, not values.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "internal/extend_fa2_fp8_layout.hpp"
#include "internal/extend_fa2_layout.hpp"

namespace pagedkv {
namespace {

using detail::Fa2Fp8Shape;
using detail::MmaCoord;

template <int kHeadDim>
void check_tile() {
  using S = Fa2Fp8Shape<kHeadDim>;
  using T = detail::Fa2Shape<kHeadDim, 4>;
  SCOPED_TRACE(kHeadDim);
  EXPECT_EQ(S::kThreads, 128);
  EXPECT_EQ(S::kRows, T::kRows);
  EXPECT_EQ(S::kKeys, T::kKeys);
  EXPECT_EQ(S::kStages, T::kStages);
  EXPECT_EQ(S::kRows, detail::fa2_tile_rows(kHeadDim, detail::kFa2Fp8Warps));
  EXPECT_LE(S::kKeys, 32);  // warp 0's ballot covers the tile's keys
}

TEST(ExtendFa2Fp8Layout, TheTileIsKFa2sFourWarpTile) {
  check_tile<64>();
  check_tile<128>();
  check_tile<256>();
}

using CopyMap = std::function<MmaCoord(int tid, int i, int threads, int fp8_chunks)>;
using HalfMap = std::function<int(int row, int c8, int h, int chunks)>;
using OwnChunk =
    std::function<int(int tid, int i, int threads)>;  // staging chunk a thread converts

// The model of one tile's copy and conversion (see the top). Codes are stored as 16-bit values
// code + 1 (0 = never written), so a read-back compares which code landed where.
template <int kHeadDim>
bool staged_tile_reads_back(const CopyMap& copy, const HalfMap& half_map, const OwnChunk& own,
                            std::uint64_t seed) {
  using S = Fa2Fp8Shape<kHeadDim>;
  constexpr std::size_t kRowStride = kHeadDim + 48;  // a token row's stride in the plane (bytes)
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> global(static_cast<std::size_t>(S::kKeys) * kRowStride);
  for (auto& b : global) b = static_cast<std::uint8_t>(rng());
  const int chunks = S::kKeys * S::kFp8Chunks;
  std::vector<std::uint8_t> staging(static_cast<std::size_t>(chunks) * 16, 0);
  std::vector<int> written(static_cast<std::size_t>(chunks), 0);
  for (int tid = 0; tid < S::kThreads; ++tid) {
    for (int i = 0; i < S::kCodeCopies; ++i) {
      const MmaCoord c = copy(tid, i, S::kThreads, S::kFp8Chunks);
      if (c.row < 0 || c.row >= S::kKeys || c.col < 0 || c.col >= S::kFp8Chunks) return false;
      const int at = tid + i * S::kThreads;
      std::memcpy(&staging[16 * static_cast<std::size_t>(at)],
                  &global[static_cast<std::size_t>(c.row) * kRowStride + 16 * c.col], 16);
      ++written[static_cast<std::size_t>(at)];
    }
  }
  for (const int n : written) {
    if (n != 1) return false;
  }
  std::vector<std::uint16_t> half(static_cast<std::size_t>(S::kKeys) * kHeadDim, 0);
  for (int tid = 0; tid < S::kThreads; ++tid) {
    for (int i = 0; i < S::kCodeCopies; ++i) {
      const MmaCoord c = copy(tid, i, S::kThreads, S::kFp8Chunks);
      const int at = own(tid, i, S::kThreads);
      const std::uint8_t* in = &staging[16 * static_cast<std::size_t>(at)];
      for (int h = 0; h < 2; ++h) {
        const int chunk = half_map(c.row, c.col, h, S::kChunks);
        for (int e = 0; e < 8; ++e) {
          half[static_cast<std::size_t>(chunk) * 8 + static_cast<std::size_t>(e)] =
              static_cast<std::uint16_t>(in[8 * h + e] + 1);
        }
      }
    }
  }
  for (int r = 0; r < S::kKeys; ++r) {
    for (int d = 0; d < kHeadDim; ++d) {
      const std::size_t at =
          static_cast<std::size_t>(detail::fa2_swizzled(r, d / 8, S::kChunks)) * 8 +
          static_cast<std::size_t>(d % 8);
      const auto code =
          global[static_cast<std::size_t>(r) * kRowStride + static_cast<std::size_t>(d)];
      if (half[at] != code + 1) return false;
    }
  }
  return true;
}

const CopyMap kCopy = [](int tid, int i, int threads, int fp8_chunks) {
  return detail::fa2_fp8_copy(tid, i, threads, fp8_chunks);
};
const HalfMap kHalf = [](int row, int c8, int h, int chunks) {
  return detail::fa2_fp8_half_chunk(row, c8, h, chunks);
};
const OwnChunk kOwn = [](int tid, int i, int threads) { return tid + i * threads; };

TEST(ExtendFa2Fp8Layout, StagingAndConversionFeedTheLdmatrixLayout) {
  EXPECT_TRUE(staged_tile_reads_back<64>(kCopy, kHalf, kOwn, 1));
  EXPECT_TRUE(staged_tile_reads_back<128>(kCopy, kHalf, kOwn, 2));
  EXPECT_TRUE(staged_tile_reads_back<256>(kCopy, kHalf, kOwn, 3));
}

TEST(ExtendFa2Fp8Layout, WrongMapsAreCaught) {
  const CopyMap swapped = [](int tid, int i, int threads, int fp8_chunks) {
    const MmaCoord c = detail::fa2_fp8_copy(tid, i, threads, fp8_chunks);
    return MmaCoord{c.col, c.row};
  };
  const HalfMap halves_swapped = [](int row, int c8, int h, int chunks) {
    return detail::fa2_fp8_half_chunk(row, c8, 1 - h, chunks);
  };
  const HalfMap unswizzled = [](int row, int c8, int h, int chunks) {
    return row * chunks + 2 * c8 + h;
  };
  const OwnChunk neighbour = [](int tid, int i, int threads) {
    return (tid + 1) % threads + i * threads;
  };
  EXPECT_FALSE(staged_tile_reads_back<128>(swapped, kHalf, kOwn, 4));
  EXPECT_FALSE(staged_tile_reads_back<128>(kCopy, halves_swapped, kOwn, 5));
  EXPECT_FALSE(staged_tile_reads_back<128>(kCopy, unswizzled, kOwn, 6));
  EXPECT_FALSE(staged_tile_reads_back<64>(kCopy, kHalf, neighbour, 7));
}

TEST(ExtendFa2Fp8Layout, KeyMasks) {
  EXPECT_EQ(detail::fa2_fp8_full_mask(32), 0xffffffffu);
  EXPECT_EQ(detail::fa2_fp8_full_mask(16), 0xffffu);
  EXPECT_EQ(detail::fa2_fp8_full_mask(1), 1u);
  for (int key = 0; key < 32; ++key) {
    EXPECT_TRUE(detail::fa2_fp8_key_present(0xffffffffu, key));
    EXPECT_FALSE(detail::fa2_fp8_key_present(0u, key));
    EXPECT_EQ(detail::fa2_fp8_key_present(0xa5a5a5a5u, key), ((0xa5a5a5a5u >> key) & 1u) != 0);
  }
}

template <int kHeadDim>
void check_budget() {
  using S = Fa2Fp8Shape<kHeadDim>;
  SCOPED_TRACE(kHeadDim);
  // Regions in order, no overlap: Q, 16-bit K and V tiles, code ring, scales, the two offset
  // tables, masks.
  EXPECT_EQ(S::kHalfOffset, S::kQBytes);
  EXPECT_EQ(S::kQBytes, static_cast<std::size_t>(S::kRows) * S::kChunks * 16);
  EXPECT_EQ(S::kHalfBytes, 2u * S::kKeys * S::kChunks * 16);
  EXPECT_EQ(S::kRingOffset, S::kHalfOffset + S::kHalfBytes);
  EXPECT_EQ(S::kRingBytes, static_cast<std::size_t>(S::kStages) * 2 * S::kKeys * kHeadDim);
  EXPECT_EQ(S::kScaleOffset, S::kRingOffset + S::kRingBytes);
  EXPECT_EQ(S::kScaleBytes, sizeof(float) * S::kStages * 2 * S::kKeys);
  EXPECT_EQ(S::kCodeTableOffset, S::kScaleOffset + S::kScaleBytes);
  EXPECT_EQ(S::kScaleTableOffset, S::kCodeTableOffset + S::kTableBytes);
  EXPECT_EQ(S::kTableBytes, sizeof(std::int64_t) * S::kStages * S::kKeys);
  EXPECT_EQ(S::kMaskOffset, S::kScaleTableOffset + S::kTableBytes);
  EXPECT_GE(S::kMaskBytes, sizeof(std::uint32_t) * S::kStages);
  EXPECT_EQ(S::kSmemBytes, S::kMaskOffset + S::kMaskBytes);
  EXPECT_LE(S::kSmemBytes, 227u * 1024u);
  // Each thread copies (and converts) whole 16-byte chunks of every K and V tile.
  EXPECT_EQ(S::kCodeCopies * S::kThreads * 16, S::kKeys * kHeadDim);
}

TEST(ExtendFa2Fp8Layout, SharedMemoryBudget) {
  check_budget<64>();
  check_budget<128>();
  check_budget<256>();
  // CTAs per SM that shared memory allows (registers allow 2 at about 255 per thread).
  EXPECT_EQ(Fa2Fp8Shape<64>::kSmemCtasPerSm, 5);
  EXPECT_EQ(Fa2Fp8Shape<128>::kSmemCtasPerSm, 3);
  EXPECT_EQ(Fa2Fp8Shape<256>::kSmemCtasPerSm, 3);
}

TEST(ExtendFa2Fp8Layout, KernelResourcesScriptKnowsTheSharedMemory) {
  std::ifstream in(PAGEDKV_KERNEL_RESOURCES_SCRIPT);
  ASSERT_TRUE(in) << PAGEDKV_KERNEL_RESOURCES_SCRIPT;
  std::stringstream text;
  text << in.rdbuf();
  std::ostringstream want;
  want << "\"fa2_fp8_extend_kernel\": {64: " << Fa2Fp8Shape<64>::kSmemBytes
       << ", 128: " << Fa2Fp8Shape<128>::kSmemBytes << ", 256: " << Fa2Fp8Shape<256>::kSmemBytes
       << "}";
  EXPECT_NE(text.str().find(want.str()), std::string::npos) << "missing: " << want.str();
}

}  // namespace
}  // namespace pagedkv
