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

// ---- the direct path (DecodeKernel::kTensorCoreFp8Direct) ----

// How a model of the direct path can be broken on purpose (each must fail).
enum class DirectBreak {
  kNone,
  kNoQPermutation,    // q's A fragments in natural head_dim order
  kNoSplitPairs,      // V's .trans registers used without the byte permute
  kNoStagingSwizzle,  // copies land row-major, reads still swizzled
  kNaturalPvDims,     // accumulators written as if n-tile 2 c + parity held dims 16 c + 8 parity..
};

// A finite FP8 code (the kernel never sees NaN codes from kv_append; any other value is fine).
std::uint8_t finite_code(Fp8Format format, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (;;) {
    const auto c = static_cast<std::uint8_t>(byte(rng));
    if (std::isfinite(fp8_bits_to_float(format, c))) return c;
  }
}

// ldmatrix.x4 (.trans or not) over a byte array: lane l supplies the byte address of row l % 8 of
// matrix l / 8; returns each lane's four registers (decode_tc_layout.hpp's ldmatrix_coord).
void ldmatrix_model(const std::vector<std::uint8_t>& smem, const int (&addr)[32], bool trans,
                    std::uint32_t (&reg)[32][4]) {
  const auto unit = [&](int matrix, int row, int col16) {
    const std::size_t at = static_cast<std::size_t>(addr[8 * matrix + row] + 2 * col16);
    return static_cast<std::uint32_t>(smem[at]) | (static_cast<std::uint32_t>(smem[at + 1]) << 8);
  };
  for (int lane = 0; lane < 32; ++lane) {
    for (int j = 0; j < 4; ++j) {
      const detail::MmaCoord lo = detail::ldmatrix_coord(lane, 0, trans);
      const detail::MmaCoord hi = detail::ldmatrix_coord(lane, 1, trans);
      reg[lane][j] = unit(j, lo.row, lo.col) | (unit(j, hi.row, hi.col) << 16);
    }
  }
}

// One warp's tile through the direct path's maps, in exact arithmetic: the kernel's copies into
// the swizzled staging slice, ldmatrix as addressed by the kernel, the byte permute, the codes'
// values as MMA fragments (mma_a_coord / mma_b_coord / mma_c_coord), q's permuted A fragments,
// and the accumulators' dims: S = Q K^T and O = P V must equal the plain products.
template <int kHeadDim>
bool direct_tile_matches(Fp8Format format, DirectBreak brk, std::uint64_t seed) {
  using S = detail::TcFp8DirectShape<kHeadDim>;
  constexpr int kF = S::kFp8Chunks;
  std::mt19937_64 rng(seed);
  const std::size_t row_stride = 3 * kHeadDim;
  std::vector<std::uint8_t> k_global(16 * row_stride);
  std::vector<std::uint8_t> v_global(16 * row_stride);
  for (auto& b : k_global) b = finite_code(format, rng);
  for (auto& b : v_global) b = finite_code(format, rng);
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<double> q(16 * kHeadDim);
  for (auto& x : q) x = small(rng) / 4.0;
  std::vector<double> prob(16 * 16);
  for (auto& x : prob) x = (small(rng) + 8) / 16.0;
  const auto value = [&](std::uint32_t code) {
    return static_cast<double>(fp8_bits_to_float(format, static_cast<std::uint8_t>(code & 0xffu)));
  };

  // Staging: every chunk copied exactly once, to its swizzled place.
  const auto stage = [&](const std::vector<std::uint8_t>& global) {
    std::vector<std::uint8_t> st(static_cast<std::size_t>(S::kSliceBytes), 0);
    std::vector<int> hits(st.size() / 16, 0);
    for (int lane = 0; lane < 32; ++lane) {
      for (int i = 0; i < S::kCopiesPerLane; ++i) {
        const detail::MmaCoord c = detail::fp8_slice_copy(lane, i, kF);
        const int dst = brk == DirectBreak::kNoStagingSwizzle
                            ? c.row * kF + c.col
                            : detail::fp8_direct_chunk(c.row, c.col, kF);
        std::memcpy(&st[16 * static_cast<std::size_t>(dst)],
                    &global[static_cast<std::size_t>(c.row) * row_stride + 16 * c.col], 16);
        ++hits[static_cast<std::size_t>(dst)];
      }
    }
    for (const int h : hits) EXPECT_EQ(h, 1);
    return st;
  };
  const std::vector<std::uint8_t> k_st = stage(k_global);
  const std::vector<std::uint8_t> v_st = stage(v_global);

  bool ok = true;
  std::vector<double> s(16 * 16, 0.0);
  std::vector<double> o(16 * kHeadDim, 0.0);
  std::vector<int> o_hits(16 * kHeadDim, 0);
  for (int pair = 0; pair < kF / 2; ++pair) {
    int addr[32];
    for (int lane = 0; lane < 32; ++lane) {
      addr[lane] =
          16 * detail::fp8_direct_chunk(detail::fp8_direct_ldsm_key(lane),
                                        2 * pair + detail::fp8_direct_ldsm_chunk(lane), kF);
    }
    std::uint32_t kr[32][4];
    std::uint32_t vr[32][4];
    ldmatrix_model(k_st, addr, false, kr);
    ldmatrix_model(v_st, addr, true, vr);
    for (int h = 0; h < 2; ++h) {
      const int ks = 2 * pair + h;  // also the chunk
      // QK: A = q (permuted), B = register 2 h + t's four codes (b0: bytes 0, 1; b1: bytes 2, 3).
      double a[16][16];
      for (int lane = 0; lane < 32; ++lane) {
        for (int j = 0; j < 4; ++j) {
          const detail::MmaCoord c = detail::mma_a_coord(lane, 2 * j);
          const int d =
              brk == DirectBreak::kNoQPermutation ? c.col : detail::fp8_direct_qk_dim(c.col);
          a[c.row][c.col] = q[static_cast<std::size_t>(c.row * kHeadDim + 16 * ks + d)];
          a[c.row][c.col + 1] = q[static_cast<std::size_t>(c.row * kHeadDim + 16 * ks + d + 1)];
        }
      }
      for (int t = 0; t < 2; ++t) {
        double b[16][8];
        for (int lane = 0; lane < 32; ++lane) {
          for (int e = 0; e < 4; ++e) {
            const detail::MmaCoord c = detail::mma_b_coord(lane, e);
            b[c.row][c.col] = value(kr[lane][2 * h + t] >> (8 * e));
          }
        }
        for (int m = 0; m < 16; ++m) {
          for (int n = 0; n < 8; ++n) {
            for (int k = 0; k < 16; ++k)
              s[static_cast<std::size_t>(m * 16 + 8 * t + n)] += a[m][k] * b[k][n];
          }
        }
      }
      // PV: A = P; B of the even dims from the permuted registers' low halves, odd from high.
      std::uint32_t lo[32];
      std::uint32_t hi[32];
      for (int lane = 0; lane < 32; ++lane) {
        lo[lane] = brk == DirectBreak::kNoSplitPairs
                       ? vr[lane][2 * h]
                       : detail::fp8_direct_split_pairs(vr[lane][2 * h]);
        hi[lane] = brk == DirectBreak::kNoSplitPairs
                       ? vr[lane][2 * h + 1]
                       : detail::fp8_direct_split_pairs(vr[lane][2 * h + 1]);
      }
      for (int parity = 0; parity < 2; ++parity) {
        double b[16][8];
        for (int lane = 0; lane < 32; ++lane) {
          const std::uint32_t b0 = parity != 0 ? lo[lane] >> 16 : lo[lane] & 0xffffu;
          const std::uint32_t b1 = parity != 0 ? hi[lane] >> 16 : hi[lane] & 0xffffu;
          for (int e = 0; e < 4; ++e) {
            const detail::MmaCoord c = detail::mma_b_coord(lane, e);
            b[c.row][c.col] = value((e < 2 ? b0 : b1) >> (8 * (e & 1)));
          }
        }
        for (int lane = 0; lane < 32; ++lane) {
          for (int e = 0; e < 4; ++e) {
            const detail::MmaCoord c = detail::mma_c_coord(lane, e);
            double acc = 0.0;
            for (int k = 0; k < 16; ++k) {
              const detail::MmaCoord at{c.row, k};
              acc += prob[static_cast<std::size_t>(at.row * 16 + at.col)] * b[k][c.col];
            }
            const int d = brk == DirectBreak::kNaturalPvDims
                              ? 16 * ks + 8 * parity + c.col
                              : detail::fp8_direct_pv_dim(ks, parity, lane, e);
            o[static_cast<std::size_t>(c.row * kHeadDim + d)] += acc;
            ++o_hits[static_cast<std::size_t>(c.row * kHeadDim + d)];
          }
        }
      }
    }
  }
  for (const int n : o_hits) ok = ok && n == 1;
  for (int m = 0; m < 16; ++m) {
    for (int key = 0; key < 16; ++key) {
      double want = 0.0;
      for (int d = 0; d < kHeadDim; ++d) {
        want +=
            q[static_cast<std::size_t>(m * kHeadDim + d)] *
            value(
                k_global[static_cast<std::size_t>(key) * row_stride + static_cast<std::size_t>(d)]);
      }
      const double got = s[static_cast<std::size_t>(m * 16 + key)];
      ok = ok && std::fabs(got - want) <= 1e-9 * (1.0 + std::fabs(want));
    }
    for (int d = 0; d < kHeadDim; ++d) {
      double want = 0.0;
      for (int key = 0; key < 16; ++key) {
        want +=
            prob[static_cast<std::size_t>(m * 16 + key)] *
            value(
                v_global[static_cast<std::size_t>(key) * row_stride + static_cast<std::size_t>(d)]);
      }
      const double got = o[static_cast<std::size_t>(m * kHeadDim + d)];
      ok = ok && std::fabs(got - want) <= 1e-9 * (1.0 + std::fabs(want));
    }
  }
  return ok;
}

TEST(DecodeTcFp8Layout, DirectFragmentsGiveTheProducts) {
  for (const Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (std::uint64_t seed = 1; seed <= 3; ++seed) {
      EXPECT_TRUE(direct_tile_matches<64>(format, DirectBreak::kNone, seed));
      EXPECT_TRUE(direct_tile_matches<128>(format, DirectBreak::kNone, seed));
      EXPECT_TRUE(direct_tile_matches<256>(format, DirectBreak::kNone, seed));
    }
  }
}

TEST(DecodeTcFp8Layout, DirectBrokenMapsAreCaught) {
  for (const DirectBreak brk :
       {DirectBreak::kNoQPermutation, DirectBreak::kNoSplitPairs, DirectBreak::kNaturalPvDims}) {
    EXPECT_FALSE(direct_tile_matches<64>(Fp8Format::kE4M3, brk, 7)) << static_cast<int>(brk);
    EXPECT_FALSE(direct_tile_matches<128>(Fp8Format::kE4M3, brk, 7)) << static_cast<int>(brk);
    EXPECT_FALSE(direct_tile_matches<256>(Fp8Format::kE4M3, brk, 7)) << static_cast<int>(brk);
  }
  // Row-major staging read through the swizzle: wrong wherever the swizzle is not the identity.
  EXPECT_FALSE(direct_tile_matches<128>(Fp8Format::kE5M2, DirectBreak::kNoStagingSwizzle, 8));
  EXPECT_FALSE(direct_tile_matches<64>(Fp8Format::kE5M2, DirectBreak::kNoStagingSwizzle, 8));
}

TEST(DecodeTcFp8Layout, DirectSplitPairsPermutesBytes) {
  EXPECT_EQ(detail::fp8_direct_split_pairs(0x44332211u), 0x44223311u);
  EXPECT_EQ(detail::fp8_direct_split_pairs(0xff000000u), 0xff000000u);
  EXPECT_EQ(detail::fp8_direct_split_pairs(0x00ff0000u), 0x0000ff00u);
  // The k permutation is a bijection on 0..15 that keeps (2 i, 2 i + 1) adjacent.
  int seen = 0;
  for (int k = 0; k < 16; ++k) {
    seen |= 1 << detail::fp8_direct_qk_dim(k);
    if (k % 2 == 0) {
      EXPECT_EQ(detail::fp8_direct_qk_dim(k + 1), detail::fp8_direct_qk_dim(k) + 1);
    }
  }
  EXPECT_EQ(seen, 0xffff);
}

// Shared-memory bank groups (16 bytes of the 128 a phase covers): the 8 rows of every ldmatrix
// matrix and the 8 lanes of every 16-byte copy phase land in 8 distinct groups.
template <int kHeadDim>
void check_direct_banks() {
  using S = detail::TcFp8DirectShape<kHeadDim>;
  constexpr int kF = S::kFp8Chunks;
  SCOPED_TRACE(kHeadDim);
  for (int pair = 0; pair < kF / 2; ++pair) {
    for (int j = 0; j < 4; ++j) {
      int groups = 0;
      for (int lane = 8 * j; lane < 8 * j + 8; ++lane) {
        const int chunk = detail::fp8_direct_chunk(
            detail::fp8_direct_ldsm_key(lane), 2 * pair + detail::fp8_direct_ldsm_chunk(lane), kF);
        groups |= 1 << (chunk % 8);
      }
      EXPECT_EQ(groups, 0xff) << "pair " << pair << " matrix " << j;
    }
  }
  for (int i = 0; i < S::kCopiesPerLane; ++i) {
    for (int phase = 0; phase < 4; ++phase) {
      int groups = 0;
      for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) {
        const detail::MmaCoord c = detail::fp8_slice_copy(lane, i, kF);
        groups |= 1 << (detail::fp8_direct_chunk(c.row, c.col, kF) % 8);
      }
      EXPECT_EQ(groups, 0xff) << "copy " << i << " phase " << phase;
    }
  }
}

TEST(DecodeTcFp8Layout, DirectReadsAndCopiesAreBankConflictFree) {
  check_direct_banks<64>();
  check_direct_banks<128>();
  check_direct_banks<256>();
}

// The direct kernel's epilogue: per chunk c and row half h, each lane stores four contiguous
// dims of one row as a float4 at row x stride + fp8_direct_pv_dim(c, 0, lane, 0). Its components
// must be the accumulator elements that hold those dims (fp8_direct_pv_dim), the stores must
// cover the warp's 16 rows x head_dim once, be 16-byte aligned, and each phase of 8 lanes (a
// 16-byte store takes four) must hit 8 distinct bank groups. Returns whether `stride` (floats per
// scratch row) is conflict-free; coverage and alignment are EXPECTed.
template <int kHeadDim>
bool direct_epilogue_conflict_free(int stride) {
  std::vector<int> written(static_cast<std::size_t>(detail::kTcRows) * kHeadDim, 0);
  bool conflict_free = true;
  for (int c = 0; c < kHeadDim / 16; ++c) {
    for (int h = 0; h < 2; ++h) {
      for (int phase = 0; phase < 4; ++phase) {
        int groups = 0;
        for (int lane = 8 * phase; lane < 8 * phase + 8; ++lane) {
          const int row = detail::mma_c_coord(lane, 2 * h).row;
          const int base = detail::fp8_direct_pv_dim(c, 0, lane, 0);
          const int at = row * stride + base;
          EXPECT_EQ(at % 4, 0) << "16-byte aligned";
          groups |= 1 << ((at / 4) % 8);
          for (int k = 0; k < 4; ++k) {
            const int e = detail::fp8_direct_epilogue_elem(h, k);
            EXPECT_EQ(detail::mma_c_coord(lane, e).row, row);
            EXPECT_EQ(detail::fp8_direct_pv_dim(c, detail::fp8_direct_epilogue_parity(k), lane, e),
                      base + k);
            ++written[static_cast<std::size_t>(row) * kHeadDim + base + k];
          }
        }
        conflict_free = conflict_free && groups == 0xff;
      }
    }
  }
  for (const int w : written) EXPECT_EQ(w, 1);
  return conflict_free;
}

TEST(DecodeTcFp8Layout, DirectEpilogueStoresAreWholeAndBankConflictFree) {
  EXPECT_TRUE(direct_epilogue_conflict_free<64>(detail::TcFp8DirectShape<64>::kScratchStride));
  EXPECT_TRUE(direct_epilogue_conflict_free<128>(detail::TcFp8DirectShape<128>::kScratchStride));
  EXPECT_TRUE(direct_epilogue_conflict_free<256>(detail::TcFp8DirectShape<256>::kScratchStride));
  // The slice kernel's stride (head_dim + 4) would put two rows of a phase in the same banks.
  EXPECT_FALSE(direct_epilogue_conflict_free<128>(128 + 4));
}

template <int kHeadDim>
void check_direct_budget() {
  using S = detail::TcFp8DirectShape<kHeadDim>;
  SCOPED_TRACE(kHeadDim);
  EXPECT_GE(S::kStages, 2);
  EXPECT_EQ(S::kScaleOffset, S::kRingBytes);
  EXPECT_EQ(S::kCodeTableOffset, S::kScaleOffset + S::kScaleBytes);
  EXPECT_EQ(S::kScaleTableOffset, S::kCodeTableOffset + S::kOffsetBytes);
  EXPECT_EQ(S::kMaskOffset, S::kScaleTableOffset + S::kOffsetBytes);
  EXPECT_GE(S::kMaskBytes, sizeof(std::uint32_t) * detail::kTcWarps * S::kStages);
  EXPECT_GE(S::kSmemBytes, S::kPipelineBytes);
  EXPECT_GE(S::kSmemBytes, S::kScratchBytes);
  EXPECT_LE(S::kSmemBytes, 227u * 1024u);
  EXPECT_EQ(S::kCopiesPerLane * 32 * 16, detail::kTcWarpTokens * kHeadDim);
  // No 16-bit slice: at least as deep a ring, paid for by the slice's bytes.
  using Slice = TcFp8DecodeShape<kHeadDim>;
  EXPECT_GE(S::kStages, Slice::kStages);
  EXPECT_LE(S::kRingBytes - Slice::kRingBytes, Slice::kHalfBytes);
  if (S::kStages == Slice::kStages) {
    EXPECT_LT(S::kSmemBytes, Slice::kSmemBytes);
  }
  // The launch bound, within what shared memory allows.
  EXPECT_LE(S::kMinCtasPerSm * (S::kSmemBytes + 1024), 233472u);
}

TEST(DecodeTcFp8Layout, DirectSharedMemoryBudget) {
  check_direct_budget<64>();
  check_direct_budget<128>();
  check_direct_budget<256>();
  EXPECT_EQ(detail::TcFp8DirectShape<64>::kMinCtasPerSm, 4);
  EXPECT_EQ(detail::TcFp8DirectShape<128>::kMinCtasPerSm, 3);
  EXPECT_EQ(detail::TcFp8DirectShape<256>::kMinCtasPerSm, 2);
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
  std::ostringstream direct;
  direct << "\"tc_fp8_direct_decode_kernel\": {64: " << detail::TcFp8DirectShape<64>::kSmemBytes
         << ", 128: " << detail::TcFp8DirectShape<128>::kSmemBytes
         << ", 256: " << detail::TcFp8DirectShape<256>::kSmemBytes << "}";
  EXPECT_NE(text.str().find(direct.str()), std::string::npos) << "missing: " << direct.str();
}

}  // namespace
}  // namespace pagedkv
