// The warpgroup-MMA groundwork of kernels/internal/wgmma_layout.hpp (issue 35 step B), on the
// host, without a GPU (kernels/wgmma_probe.cu checks it against the hardware under
// scripts/gpu-check):
//   - the descriptor's bit fields (start, LBO, SBO, swizzle) and their round trip;
//   - the tiles' swizzled layouts are bijections onto their bytes, with 16-byte chunks whole;
//   - the descriptors the probe issues at every k step address exactly the elements our layouts
//     store (the model of the hardware's addressing in the header), K-major and N-major;
//   - the N-major descriptor encoded one way and read the other addresses other bytes, so the
//     probe's two readings cannot both match;
//   - the accumulator and A-register fragment maps cover their tiles once each.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "internal/wgmma_layout.hpp"

namespace pagedkv {
namespace {

using namespace detail;

TEST(WgmmaLayout, DescriptorFields) {
  const std::uint64_t d = wgmma_descriptor(0x2400, 16, 1024, WgmmaSwizzle::k128B);
  EXPECT_EQ(d, (std::uint64_t{0x2400} >> 4) | (std::uint64_t{1} << 16) | (std::uint64_t{64} << 32) |
                   (std::uint64_t{1} << 62));
  const WgmmaDescriptorFields f = wgmma_descriptor_fields(d);
  EXPECT_EQ(f.start_bytes, 0x2400u);
  EXPECT_EQ(f.lbo_bytes, 16u);
  EXPECT_EQ(f.sbo_bytes, 1024u);
  EXPECT_EQ(f.base_offset, 0u);
  EXPECT_EQ(f.swizzle, 1u);
  // Every field at its largest value stays in its bits.
  const std::uint64_t m = wgmma_descriptor(0x3fff0, 0x3fff0, 0x3fff0, WgmmaSwizzle::k32B);
  EXPECT_EQ(m, 0x3fffull | (0x3fffull << 16) | (0x3fffull << 32) | (3ull << 62));
  EXPECT_EQ(wgmma_descriptor_fields(m).start_bytes, 0x3fff0u);
}

TEST(WgmmaLayout, TilesAreBijections) {
  std::set<std::uint32_t> k_major;
  for (int r = 0; r < 128; ++r) {
    for (int k = 0; k < 64; ++k) {
      const std::uint32_t off = sw128_k_major_offset(r, k);
      ASSERT_EQ(off % 2, 0u);
      ASSERT_LT(off, 128u * 128u);
      // 8 consecutive elements of a chunk stay one 16-byte chunk.
      ASSERT_EQ(off / 16, sw128_k_major_offset(r, k & ~7) / 16);
      k_major.insert(off);
    }
  }
  EXPECT_EQ(k_major.size(), 128u * 64u);
  for (const int keys : {16, 32, 64}) {
    std::set<std::uint32_t> mn;
    for (int k = 0; k < keys; ++k) {
      for (int n = 0; n < 256; ++n) {
        const std::uint32_t off = sw128_mn_major_offset(k, n, keys);
        ASSERT_LT(off, static_cast<std::uint32_t>(keys) * 256u * 2u);
        mn.insert(off);
      }
    }
    EXPECT_EQ(mn.size(), static_cast<std::size_t>(keys) * 256u) << keys;
  }
}

// The probe's K-major descriptors (A and B alike) at every step address our layout.
TEST(WgmmaLayout, KMajorDescriptorsAddressTheTile) {
  for (const std::uint32_t tile : {0x0u, 0x2000u, 0x6400u}) {  // 1,024-byte aligned
    for (int step = 0; step < 4; ++step) {
      const std::uint64_t d =
          wgmma_descriptor(k_major_step_start(tile, step), 16, kKMajorSbo, WgmmaSwizzle::k128B);
      for (int m = 0; m < 128; ++m) {
        for (int k = 0; k < 16; ++k) {
          ASSERT_EQ(model_k_major_address(d, m, k), tile + sw128_k_major_offset(m, 16 * step + k))
              << "tile " << tile << " step " << step << " row " << m << " k " << k;
        }
      }
    }
  }
}

TEST(WgmmaLayout, NMajorDescriptorsAddressTheTileAndTheOtherReadingDoesNot) {
  const std::uint32_t tile = 0x4000;
  for (const int keys : {32, 64}) {
    for (const bool lbo : {true, false}) {
      for (int step = 0; step < keys / 16; ++step) {
        const std::uint64_t d = mn_major_descriptor(mn_major_step_start(tile, step), keys, lbo);
        int other_differs = 0;
        for (int k = 0; k < 16; ++k) {
          for (int n = 0; n < 128; ++n) {
            const std::uint32_t want = tile + sw128_mn_major_offset(16 * step + k, n, keys);
            ASSERT_EQ(model_mn_major_address(d, k, n, lbo), want)
                << "keys " << keys << " lbo " << lbo << " step " << step << " k " << k << " n "
                << n;
            other_differs += model_mn_major_address(d, k, n, !lbo) != want ? 1 : 0;
          }
        }
        EXPECT_GT(other_differs, 0) << "both readings address the same bytes: the probe could "
                                       "not tell them apart";
      }
    }
  }
}

TEST(WgmmaLayout, FragmentMapsCoverTheirTilesOnce) {
  for (const int n : {64, 128, 256}) {
    std::set<std::pair<int, int>> seen;
    for (int t = 0; t < 128; ++t) {
      for (int j = 0; j < n / 2; ++j) {
        const MmaCoord c = wgmma_d_coord(t, j);
        ASSERT_GE(c.row, 0);
        ASSERT_LT(c.row, 64);
        ASSERT_LT(c.col, n);
        seen.insert({c.row, c.col});
      }
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(64 * n)) << n;
  }
  std::set<std::pair<int, int>> a;
  for (int t = 0; t < 128; ++t) {
    for (int e = 0; e < 8; ++e) {
      const MmaCoord c = wgmma_a_coord(t, e);
      ASSERT_LT(c.row, 64);
      ASSERT_LT(c.col, 16);
      // Each warp holds its own 16 rows.
      ASSERT_EQ(c.row / 16, t / 32);
      a.insert({c.row, c.col});
    }
  }
  EXPECT_EQ(a.size(), 64u * 16u);
  // The accumulator of thread t holds, for each 8-column block, the same rows and columns as
  // mma.sync's C fragment of its lane (so P can be re-packed as the A operand of PV, as the FA2
  // kernel does).
  for (int t = 0; t < 128; ++t) {
    for (int j = 0; j < 64; ++j) {
      const MmaCoord c = wgmma_d_coord(t, j);
      const MmaCoord m = mma_c_coord(t & 31, j & 3);
      EXPECT_EQ(c.row, 16 * (t / 32) + m.row);
      EXPECT_EQ(c.col, 8 * (j / 4) + m.col);
    }
  }
}

}  // namespace
}  // namespace pagedkv
