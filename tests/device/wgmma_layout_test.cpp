// The warpgroup-MMA groundwork of kernels/internal/wgmma_layout.hpp (issue 35 step B), on the
// host, without a GPU (kernels/wgmma_probe.cu checks it against the hardware under
// scripts/gpu-check):
//   - the descriptor's bit fields (start, LBO, SBO, swizzle) and their round trip;
//   - the tiles' swizzled layouts are bijections onto their bytes, with 16-byte chunks whole;
//   - the descriptors the probe issues at every k step address exactly the elements our layouts
//     store (the model of the hardware's addressing in the header), K-major and N-major;
//   - the header's model of the hardware's addressing is the ISA's canonical layouts of the
//     128-byte swizzle, written here as the ISA writes them (CuTe shapes and strides);
//   - the N-major descriptor encoded the other way (LBO and SBO swapped) addresses other bytes, so
//     the probe's two readings cannot both match;
//   - the accumulator and A-register fragment maps cover their tiles once each, and P's repacking
//     into A registers (wgmma_p_source) keeps every score at its row and key;
//   - ExtendKernel::kWgmma's tiles (head_dim 128): Q, K and V stored chunk by chunk with the
//     kernel's offsets and read back through the kernel's descriptors at every k step (the
//     model's addressing) give S = Q K^T and O = P V exactly, for both warpgroups.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
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

// The ISA's canonical layouts of the 128-byte swizzle for 16-bit elements (PTX ISA
// 9.7.15.5.1.2.1.3, T = 128 / 16 = 8), in elements, the descriptor's fields decoded from their bits
// (9.7.15.5.1.2.2), Swizzle<3,4,3> applied to the byte address: written apart from the header's
// model, which must agree with them.
struct IsaFields {
  std::uint32_t start, lbo, sbo;
};
IsaFields isa_fields(std::uint64_t desc) {
  return {static_cast<std::uint32_t>(desc & 0x3fffu) << 4,
          static_cast<std::uint32_t>((desc >> 16) & 0x3fffu) << 4,
          static_cast<std::uint32_t>((desc >> 32) & 0x3fffu) << 4};
}
std::uint32_t isa_swizzle_343(std::uint32_t x) {
  return x ^ ((x & (7u << 7)) >> 3);
}
// K-major: ((8,m),(T,2k)):((8T,SBO),(1,T)) over (row, k).
std::uint32_t isa_k_major(std::uint64_t desc, int row, int k) {
  constexpr std::uint32_t t = 8;
  const IsaFields f = isa_fields(desc);
  const auto r = static_cast<std::uint32_t>(row);
  const auto c = static_cast<std::uint32_t>(k);
  const std::uint32_t elem = (r % 8) * 8 * t + (r / 8) * (f.sbo / 2) + (c % t) + (c / t) * t;
  return isa_swizzle_343(f.start + 2 * elem);
}
// MN-major: ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) over (n, k).
std::uint32_t isa_mn_major(std::uint64_t desc, int k, int n) {
  constexpr std::uint32_t t = 8;
  const IsaFields f = isa_fields(desc);
  const auto c = static_cast<std::uint32_t>(k);
  const auto nn = static_cast<std::uint32_t>(n);
  const std::uint32_t elem = (nn % t) + (nn / t % 8) * t + (nn / (8 * t)) * (f.lbo / 2) +
                             (c % 8) * 8 * t + (c / 8) * (f.sbo / 2);
  return isa_swizzle_343(f.start + 2 * elem);
}

TEST(WgmmaLayout, ModelIsTheIsaCanonicalLayout) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> unit(1, 1023);  // 16-byte units
  for (int trial = 0; trial < 64; ++trial) {
    const std::uint32_t tile = 1024u * (unit(rng) % 128u);
    const std::uint32_t lbo = 16u * unit(rng);
    const std::uint32_t sbo = 16u * unit(rng);
    for (int step = 0; step < 4; ++step) {
      const std::uint64_t kd =
          wgmma_descriptor(k_major_step_start(tile, step), lbo, sbo, WgmmaSwizzle::k128B);
      for (int m = 0; m < 64; ++m) {
        for (int k = 0; k < 16; ++k) {
          ASSERT_EQ(model_k_major_address(kd, m, k), isa_k_major(kd, m, k))
              << "K-major tile " << tile << " sbo " << sbo << " step " << step;
        }
      }
    }
    const std::uint64_t nd = wgmma_descriptor(tile, lbo, sbo, WgmmaSwizzle::k128B);
    for (int k = 0; k < 16; ++k) {
      for (int n = 0; n < 256; ++n) {
        ASSERT_EQ(model_mn_major_address(nd, k, n), isa_mn_major(nd, k, n))
            << "MN-major tile " << tile << " lbo " << lbo << " sbo " << sbo << " k " << k << " n "
            << n;
      }
    }
  }
}

// The N-major descriptors (kMnMajorKGroupsInLbo's encoding) at every step address our layout;
// encoded the other way they do not.
TEST(WgmmaLayout, NMajorDescriptorsAddressTheTileAndTheOtherReadingDoesNot) {
  const std::uint32_t tile = 0x4000;
  for (const int keys : {32, 64}) {
    for (int step = 0; step < keys / 16; ++step) {
      const std::uint32_t start = mn_major_step_start(tile, step);
      const std::uint64_t d = mn_major_descriptor(start, keys, kMnMajorKGroupsInLbo);
      const std::uint64_t other = mn_major_descriptor(start, keys, !kMnMajorKGroupsInLbo);
      int other_differs = 0;
      for (int k = 0; k < 16; ++k) {
        for (int n = 0; n < 128; ++n) {
          const std::uint32_t want = tile + sw128_mn_major_offset(16 * step + k, n, keys);
          ASSERT_EQ(model_mn_major_address(d, k, n), want)
              << "keys " << keys << " step " << step << " k " << k << " n " << n;
          other_differs += model_mn_major_address(other, k, n) != want ? 1 : 0;
        }
      }
      EXPECT_GT(other_differs, 0) << "both readings address the same bytes: the probe could "
                                     "not tell them apart";
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

TEST(WgmmaLayout, PRepackKeepsRowAndKey) {
  for (int t = 0; t < 128; ++t) {
    for (int kk = 0; kk < 4; ++kk) {
      for (int r = 0; r < 4; ++r) {
        for (int e = 0; e < 2; ++e) {
          const MmaCoord a = wgmma_a_coord(t, 2 * r + e);
          const MmaCoord d = wgmma_d_coord(t, wgmma_p_source(kk, r, e));
          ASSERT_EQ(a.row, d.row) << t << " " << kk << " " << r << " " << e;
          ASSERT_EQ(16 * kk + a.col, d.col) << t << " " << kk << " " << r << " " << e;
        }
      }
    }
  }
}

// The kernel's tiles in a byte array (16-bit values as small integers held in int16).
struct Tile {
  std::vector<std::int16_t> bytes;  // indexed by byte offset / 2
  explicit Tile(std::size_t size) : bytes(size / 2, 0) {}
  void put(std::uint32_t off, int v) { bytes[off / 2] = static_cast<std::int16_t>(v); }
  int at(std::uint32_t off) const { return bytes[off / 2]; }
};

// Each step's descriptor advanced from step 0's (one 32-bit add, what the kernels issue) is the
// one built for the step, for every 1,024-byte-aligned tile in shared memory (228 KiB) whose
// steps stay in it, tiles of 64 to 256 rows (keys) and either warpgroup's rows; and the advance
// never touches the high word. Past 2^18 bytes it would differ (the start field wraps in the
// built one), which no shared address reaches.
TEST(WgmmaLayout, AdvancedDescriptorsEqualBuiltOnes) {
  constexpr std::uint32_t kSmem = 228u * 1024u;
  long checked = 0;
  for (std::uint32_t tile = 0; tile < kSmem; tile += 1024u) {
    for (int rows : {64, 128, 192, 256}) {
      for (int g = 0; g < rows / 64; ++g) {
        const std::uint64_t step0 = wgmma_kmajor_step_desc(tile, rows, g, 0);
        for (int ks = 0; ks < 16; ++ks) {
          if (k_major_step_start(tile + g * 64u * kSw128RowBytes, 0) +
                  wgmma_kmajor_step_offset(rows, ks) + 32u >
              kSmem) {
            continue;
          }
          ASSERT_EQ(wgmma_kmajor_step_desc_from(step0, rows, ks),
                    wgmma_kmajor_step_desc(tile, rows, g, ks))
              << "tile " << tile << " rows " << rows << " g " << g << " ks " << ks;
          ++checked;
        }
      }
      const std::uint64_t v0 = wgmma_v_step_desc(tile, rows, 0);
      for (int kk = 0; kk < rows / 16; ++kk) {
        if (mn_major_step_start(tile, kk) + 2u * kSw128AtomBytes > kSmem) continue;
        ASSERT_EQ(wgmma_v_step_desc_from(v0, kk), wgmma_v_step_desc(tile, rows, kk))
            << "V tile " << tile << " keys " << rows << " kk " << kk;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 5000);
  // The last 16-byte step below 2^18: the start field full, LBO, SBO and swizzle untouched.
  EXPECT_EQ(
      wgmma_descriptor_advance(wgmma_descriptor(0x3fc00u, 16, 1024, WgmmaSwizzle::k128B), 0x300u),
      wgmma_descriptor(0x3ff00u, 16, 1024, WgmmaSwizzle::k128B));
}

TEST(WgmmaLayout, ExtendKernelTilesGiveQKAndPV) {
  constexpr int kD = 128, kRows = 128, kKeys = 64;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> v(-9, 9);
  std::vector<int> q(kRows * kD), k(kKeys * kD), val(kKeys * kD), p(kRows * kKeys);
  for (int& x : q) x = v(rng);
  for (int& x : k) x = v(rng);
  for (int& x : val) x = v(rng);
  for (int& x : p) x = v(rng);
  // Stored as the kernel stores them: chunk (r, c) at its offset, 8 elements each.
  const std::uint32_t q_base = 0, k_base = 0x10000, v_base = 0x20000;
  Tile smem(0x30000);
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < kD / 8; ++c) {
      for (int e = 0; e < 8; ++e) {
        smem.put(q_base + wgmma_kmajor_chunk_offset(r, c, kRows) + 2u * e, q[r * kD + 8 * c + e]);
      }
    }
  }
  for (int key = 0; key < kKeys; ++key) {
    for (int c = 0; c < kD / 8; ++c) {
      for (int e = 0; e < 8; ++e) {
        smem.put(k_base + wgmma_kmajor_chunk_offset(key, c, kKeys) + 2u * e,
                 k[key * kD + 8 * c + e]);
        smem.put(v_base + wgmma_v_chunk_offset(key, c, kKeys) + 2u * e, val[key * kD + 8 * c + e]);
      }
    }
  }
  EXPECT_LE(wgmma_kmajor_chunk_offset(kRows - 1, kD / 8 - 1, kRows) + 16u, 0x10000u);
  EXPECT_LE(wgmma_v_chunk_offset(kKeys - 1, kD / 8 - 1, kKeys) + 16u, 0x4000u);
  for (int g = 0; g < 2; ++g) {
    // S through the descriptors: 8 k steps of 16 columns.
    for (int m = 0; m < 64; ++m) {
      for (int n = 0; n < kKeys; ++n) {
        long got = 0, want = 0;
        // From step 0's descriptors, as the kernels' issue_qk builds them.
        const std::uint64_t q0 = wgmma_kmajor_step_desc(q_base, kRows, g, 0);
        const std::uint64_t k0 = wgmma_kmajor_step_desc(k_base, kKeys, 0, 0);
        for (int ks = 0; ks < kD / 16; ++ks) {
          const std::uint64_t qd = wgmma_kmajor_step_desc_from(q0, kRows, ks);
          const std::uint64_t kd = wgmma_kmajor_step_desc_from(k0, kKeys, ks);
          for (int kk = 0; kk < 16; ++kk) {
            got += static_cast<long>(smem.at(model_k_major_address(qd, m, kk))) *
                   smem.at(model_k_major_address(kd, n, kk));
          }
        }
        for (int d = 0; d < kD; ++d)
          want += static_cast<long>(q[(64 * g + m) * kD + d]) * k[n * kD + d];
        ASSERT_EQ(got, want) << "warpgroup " << g << " row " << m << " key " << n;
      }
    }
    // O = P V through the V descriptors: 4 k steps of 16 keys.
    for (int m = 0; m < 64; ++m) {
      for (int d = 0; d < kD; ++d) {
        long got = 0, want = 0;
        const std::uint64_t v0 = wgmma_v_step_desc(v_base, kKeys, 0);
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          const std::uint64_t vd = wgmma_v_step_desc_from(v0, kk);
          for (int key = 0; key < 16; ++key) {
            got += static_cast<long>(p[(64 * g + m) * kKeys + 16 * kk + key]) *
                   smem.at(model_mn_major_address(vd, key, d));
          }
        }
        for (int key = 0; key < kKeys; ++key) {
          want += static_cast<long>(p[(64 * g + m) * kKeys + key]) * val[key * kD + d];
        }
        ASSERT_EQ(got, want) << "warpgroup " << g << " row " << m << " dim " << d;
      }
    }
  }
}

}  // namespace
}  // namespace pagedkv
