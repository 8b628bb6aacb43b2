// The tensor-core decode kernel's layouts and work decomposition (kernels/internal/
// decode_tc_layout.hpp), checked on the host, without a GPU:
//   - the mma.m16n8k16 fragment maps against the PTX ISA tables (spot values) and as bijections;
//   - a host model of one warp's tile: q loaded into A fragments, the K slice written by the
//     kernel's copy map into the swizzled shared layout, ldmatrix(.trans) modelled from its
//     documented per-lane semantics, the MMA modelled from the fragment maps, the score
//     accumulators packed into the PV A operand through pv_a_source, against a reference matmul
//     (and a wrong reuse map is caught, so the comparison can fail);
//   - the swizzle: a bijection per row, conflict-free ldmatrix phases;
//   - split-KV ranges and the warps' 16-key slices cover every key exactly once; the planner with
//     the variant's options fills the GPU with 1.5 to kTcPlanWaves (2) waves;
//   - the page-offset table against KVLayout::offset for every layout kind, and the ring schedule
//     never overwrites an offset slot before its copies are issued.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "internal/decode_tc_layout.hpp"
#include "pagedkv/device/decode_plan.hpp"
#include "pagedkv/device/kv_layout.hpp"

namespace pagedkv {
namespace {

using detail::MmaCoord;

// bf16 rounding (nearest even), as the kernel's inputs and packed probabilities.
float round_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}

TEST(DecodeTcLayout, FragmentMapsMatchThePtxTables) {
  // PTX ISA, mma.m16n8k16 with .f16/.bf16: lane 0 and lane 5 (groupID 1, threadID_in_group 1).
  const MmaCoord a0[8] = {{0, 0}, {0, 1}, {8, 0}, {8, 1}, {0, 8}, {0, 9}, {8, 8}, {8, 9}};
  const MmaCoord a5[8] = {{1, 2}, {1, 3}, {9, 2}, {9, 3}, {1, 10}, {1, 11}, {9, 10}, {9, 11}};
  for (int e = 0; e < 8; ++e) {
    EXPECT_EQ(detail::mma_a_coord(0, e).row, a0[e].row) << e;
    EXPECT_EQ(detail::mma_a_coord(0, e).col, a0[e].col) << e;
    EXPECT_EQ(detail::mma_a_coord(5, e).row, a5[e].row) << e;
    EXPECT_EQ(detail::mma_a_coord(5, e).col, a5[e].col) << e;
  }
  // B (K x N): lane 6 = groupID 1, threadID_in_group 2: b0 (4, 1), b1 (5, 1), b2 (12, 1), b3 (13,
  // 1).
  const MmaCoord b6[4] = {{4, 1}, {5, 1}, {12, 1}, {13, 1}};
  // C: lane 31 = groupID 7, threadID_in_group 3: c0 (7, 6), c1 (7, 7), c2 (15, 6), c3 (15, 7).
  const MmaCoord c31[4] = {{7, 6}, {7, 7}, {15, 6}, {15, 7}};
  for (int e = 0; e < 4; ++e) {
    EXPECT_EQ(detail::mma_b_coord(6, e).row, b6[e].row) << e;
    EXPECT_EQ(detail::mma_b_coord(6, e).col, b6[e].col) << e;
    EXPECT_EQ(detail::mma_c_coord(31, e).row, c31[e].row) << e;
    EXPECT_EQ(detail::mma_c_coord(31, e).col, c31[e].col) << e;
  }
  // ldmatrix: lane 9 holds row 2, columns 2 and 3 (plain); row 2 / 3, column 2 (.trans).
  EXPECT_EQ(detail::ldmatrix_coord(9, 1, false).row, 2);
  EXPECT_EQ(detail::ldmatrix_coord(9, 1, false).col, 3);
  EXPECT_EQ(detail::ldmatrix_coord(9, 1, true).row, 3);
  EXPECT_EQ(detail::ldmatrix_coord(9, 1, true).col, 2);
}

TEST(DecodeTcLayout, FragmentMapsAreBijections) {
  std::set<std::pair<int, int>> a, b, c, l;
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 8; ++e)
      a.insert({detail::mma_a_coord(lane, e).row, detail::mma_a_coord(lane, e).col});
    for (int e = 0; e < 4; ++e) {
      b.insert({detail::mma_b_coord(lane, e).row, detail::mma_b_coord(lane, e).col});
      c.insert({detail::mma_c_coord(lane, e).row, detail::mma_c_coord(lane, e).col});
    }
    for (int h = 0; h < 2; ++h) {
      l.insert(
          {detail::ldmatrix_coord(lane, h, false).row, detail::ldmatrix_coord(lane, h, false).col});
    }
  }
  EXPECT_EQ(a.size(), 256u);
  EXPECT_EQ(b.size(), 128u);
  EXPECT_EQ(c.size(), 128u);
  EXPECT_EQ(l.size(), 64u);
  for (const auto& [r, col] : a) EXPECT_TRUE(r < 16 && col < 16);
  for (const auto& [r, col] : b) EXPECT_TRUE(r < 16 && col < 8);
  for (const auto& [r, col] : c) EXPECT_TRUE(r < 16 && col < 8);
}

// ---- a host model of one warp's QK^T and PV over a 16-key slice ----

using Frag = std::vector<std::vector<float>>;  // [lane][element]

// mma.m16n8k16 from the fragment maps: d (C layout) += A x B.
void model_mma(Frag& d, const Frag& a, const Frag& b) {
  float am[16][16] = {};
  float bm[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 8; ++e) {
      const MmaCoord at = detail::mma_a_coord(lane, e);
      am[at.row][at.col] = a[lane][e];
    }
    for (int e = 0; e < 4; ++e) {
      const MmaCoord at = detail::mma_b_coord(lane, e);
      bm[at.row][at.col] = b[lane][e];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 4; ++e) {
      const MmaCoord at = detail::mma_c_coord(lane, e);
      double sum = 0.0;
      for (int k = 0; k < 16; ++k) sum += double{am[at.row][k]} * bm[k][at.col];
      d[lane][e] += static_cast<float>(sum);
    }
  }
}

// ldmatrix.x4 (optionally .trans) from a shared array of 16-byte chunks: lane l supplies the
// chunk index of row l % 8 of matrix l / 8; returns [lane][register j][half].
std::vector<std::vector<std::vector<float>>> model_ldmatrix(const std::vector<float>& smem,
                                                            const int (&chunk_of_lane)[32],
                                                            bool trans) {
  std::vector<std::vector<std::vector<float>>> r(
      32, std::vector<std::vector<float>>(4, std::vector<float>(2)));
  for (int lane = 0; lane < 32; ++lane) {
    for (int j = 0; j < 4; ++j) {
      for (int h = 0; h < 2; ++h) {
        const MmaCoord at = detail::ldmatrix_coord(lane, h, trans);  // (stored row, col)
        r[lane][j][h] = smem[static_cast<std::size_t>(chunk_of_lane[8 * j + at.row]) * 8 +
                             static_cast<std::size_t>(at.col)];
      }
    }
  }
  return r;
}

// The warp's slice of K or V written as the kernel's copies do: copy i of lane l moves row
// slice_copy(l, i).row's 16-byte chunk .col to swizzled_chunk(row, col).
std::vector<float> write_slice(const std::vector<float>& rows, int head_dim) {
  const int chunks = head_dim / 8;
  std::vector<float> smem(rows.size(), std::nanf(""));
  const int copies = detail::kTcWarpTokens * chunks / 32;
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < copies; ++i) {
      const MmaCoord c = detail::slice_copy(lane, i, chunks);
      for (int k = 0; k < 8; ++k) {
        smem[static_cast<std::size_t>(detail::swizzled_chunk(c.row, c.col, chunks)) * 8 + k] =
            rows[static_cast<std::size_t>(c.row * head_dim + c.col * 8 + k)];
      }
    }
  }
  return smem;
}

struct ModelResult {
  double max_score_error = 0.0;
  double max_out_error = 0.0;
};

// q [group][head_dim], k and v [16][head_dim] (bf16 values). Reference: S = q k^T, then
// O = round_bf16(S / 64) v (the "probabilities" are any function of S packed to 16 bits).
ModelResult run_model(int head_dim, int group, std::mt19937& rng, bool wrong_reuse) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const auto random_rows = [&](int n) {
    std::vector<float> x(static_cast<std::size_t>(n * head_dim));
    for (float& v : x) v = round_bf16(u(rng));
    return x;
  };
  const std::vector<float> q = random_rows(group);
  const std::vector<float> k = random_rows(16);
  const std::vector<float> v = random_rows(16);
  const int chunks = head_dim / 8;
  const std::vector<float> k_smem = write_slice(k, head_dim);
  const std::vector<float> v_smem = write_slice(v, head_dim);
  for (const float x : k_smem) EXPECT_FALSE(std::isnan(x)) << "the copies cover the K slice";

  // q fragments as the kernel loads them: A register j = elements 2j, 2j + 1; rows >= group zero.
  const int ksteps = head_dim / 16;
  std::vector<Frag> qf(static_cast<std::size_t>(ksteps), Frag(32, std::vector<float>(8)));
  for (int ks = 0; ks < ksteps; ++ks) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int e = 0; e < 8; ++e) {
        const MmaCoord at = detail::mma_a_coord(lane, e);
        qf[ks][lane][e] = at.row < group
                              ? q[static_cast<std::size_t>(at.row * head_dim + ks * 16 + at.col)]
                              : 0.0f;
      }
    }
  }
  // QK^T: two 8-key tiles.
  Frag s[2] = {Frag(32, std::vector<float>(4, 0.0f)), Frag(32, std::vector<float>(4, 0.0f))};
  for (int ks = 0; ks < ksteps; ++ks) {
    int addr[32];
    for (int lane = 0; lane < 32; ++lane) {
      addr[lane] =
          detail::swizzled_chunk(detail::qk_b_key(lane), 2 * ks + detail::qk_b_chunk(lane), chunks);
    }
    const auto r = model_ldmatrix(k_smem, addr, false);
    Frag b0(32, std::vector<float>(4));
    Frag b1(32, std::vector<float>(4));
    for (int lane = 0; lane < 32; ++lane) {
      b0[lane] = {r[lane][0][0], r[lane][0][1], r[lane][1][0], r[lane][1][1]};
      b1[lane] = {r[lane][2][0], r[lane][2][1], r[lane][3][0], r[lane][3][1]};
    }
    model_mma(s[0], qf[ks], b0);
    model_mma(s[1], qf[ks], b1);
  }
  ModelResult res;
  double ref_s[16][16] = {};
  for (int row = 0; row < group; ++row) {
    for (int key = 0; key < 16; ++key) {
      double sum = 0.0;
      for (int d = 0; d < head_dim; ++d) {
        sum += double{q[static_cast<std::size_t>(row * head_dim + d)]} *
               k[static_cast<std::size_t>(key * head_dim + d)];
      }
      ref_s[row][key] = sum;
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int t = 0; t < 2; ++t) {
      for (int e = 0; e < 4; ++e) {
        const MmaCoord at = detail::mma_c_coord(lane, e);
        const double want = at.row < group ? ref_s[at.row][t * 8 + at.col] : 0.0;
        res.max_score_error = std::max(res.max_score_error, std::abs(s[t][lane][e] - want));
      }
    }
  }
  // P packed in registers from the score accumulators (pv_a_source), then PV.
  Frag pa(32, std::vector<float>(8));
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 8; ++e) {
      detail::PvASource src = detail::pv_a_source(e);
      if (wrong_reuse) src.tile = 1 - src.tile;  // a deliberately wrong map
      pa[lane][e] = round_bf16(s[src.tile][lane][src.elem] / 64.0f);
    }
  }
  const int ntiles = head_dim / 8;
  std::vector<Frag> o(static_cast<std::size_t>(ntiles), Frag(32, std::vector<float>(4, 0.0f)));
  for (int dd = 0; dd < head_dim / 16; ++dd) {
    int addr[32];
    for (int lane = 0; lane < 32; ++lane) {
      addr[lane] =
          detail::swizzled_chunk(detail::pv_b_key(lane), 2 * dd + detail::pv_b_chunk(lane), chunks);
    }
    const auto r = model_ldmatrix(v_smem, addr, true);
    Frag b0(32, std::vector<float>(4));
    Frag b1(32, std::vector<float>(4));
    for (int lane = 0; lane < 32; ++lane) {
      b0[lane] = {r[lane][0][0], r[lane][0][1], r[lane][1][0], r[lane][1][1]};
      b1[lane] = {r[lane][2][0], r[lane][2][1], r[lane][3][0], r[lane][3][1]};
    }
    model_mma(o[static_cast<std::size_t>(2 * dd)], pa, b0);
    model_mma(o[static_cast<std::size_t>(2 * dd + 1)], pa, b1);
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int n = 0; n < ntiles; ++n) {
      for (int e = 0; e < 4; ++e) {
        const MmaCoord at = detail::mma_c_coord(lane, e);
        const int col = n * 8 + at.col;
        double want = 0.0;
        if (at.row < group) {
          for (int key = 0; key < 16; ++key) {
            want += double{round_bf16(static_cast<float>(ref_s[at.row][key]) / 64.0f)} *
                    v[static_cast<std::size_t>(key * head_dim + col)];
          }
        }
        res.max_out_error =
            std::max(res.max_out_error, std::abs(o[static_cast<std::size_t>(n)][lane][e] - want));
      }
    }
  }
  return res;
}

TEST(DecodeTcLayout, WarpTileModelMatchesReferenceMatmul) {
  std::mt19937 rng(7);
  for (const int head_dim : {64, 128, 256}) {
    for (const int group : {1, 3, 8, 16}) {
      const ModelResult r = run_model(head_dim, group, rng, false);
      // Scores: fp32 sums of bf16 products (the model sums in double); outputs: the same
      // probabilities rounded from float scores, so tiny differences only.
      EXPECT_LT(r.max_score_error, 1e-3) << "head_dim " << head_dim << " group " << group;
      EXPECT_LT(r.max_out_error, 1e-2) << "head_dim " << head_dim << " group " << group;
    }
  }
}

TEST(DecodeTcLayout, AWrongScoreReuseMapIsCaught) {
  std::mt19937 rng(8);
  const ModelResult r = run_model(128, 16, rng, true);
  EXPECT_GT(r.max_out_error, 0.1);
}

TEST(DecodeTcLayout, PvASourceKeepsRowAndKey) {
  // Element e of the PV A operand (row, key) equals C element src.elem of tile src.tile at
  // (row, key - 8 src.tile), in the same lane.
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 8; ++e) {
      const MmaCoord a = detail::mma_a_coord(lane, e);
      const detail::PvASource src = detail::pv_a_source(e);
      const MmaCoord c = detail::mma_c_coord(lane, src.elem);
      EXPECT_EQ(a.row, c.row) << lane << " " << e;
      EXPECT_EQ(a.col, src.tile * 8 + c.col) << lane << " " << e;
    }
  }
}

TEST(DecodeTcLayout, SwizzleIsABijectionAndLdmatrixPhasesAreConflictFree) {
  for (const int chunks : {8, 16, 32}) {
    std::vector<int> seen(static_cast<std::size_t>(detail::kTcWarpTokens * chunks), 0);
    for (int row = 0; row < detail::kTcWarpTokens; ++row) {
      for (int c = 0; c < chunks; ++c) {
        const int at = detail::swizzled_chunk(row, c, chunks);
        ASSERT_GE(at, row * chunks);
        ASSERT_LT(at, (row + 1) * chunks);
        ++seen[static_cast<std::size_t>(at)];
      }
    }
    for (const int n : seen) EXPECT_EQ(n, 1);
    // Each 8-lane phase of the kernel's ldmatrix calls: 8 distinct 16-byte bank groups (a row is
    // a multiple of 128 bytes, so the group is the chunk index mod 8).
    for (int step = 0; step < chunks / 2; ++step) {
      for (int phase = 0; phase < 4; ++phase) {
        std::set<int> qk, pv;
        for (int l = 8 * phase; l < 8 * phase + 8; ++l) {
          qk.insert(detail::swizzled_chunk(detail::qk_b_key(l), 2 * step + detail::qk_b_chunk(l),
                                           chunks) %
                    8);
          pv.insert(detail::swizzled_chunk(detail::pv_b_key(l), 2 * step + detail::pv_b_chunk(l),
                                           chunks) %
                    8);
        }
        EXPECT_EQ(qk.size(), 8u);
        EXPECT_EQ(pv.size(), 8u);
      }
    }
  }
}

// Several query tokens per sequence: over the chunks of the union window's split, every MMA row
// sees exactly its token's keys (the reference's [max(0, pos + 1 - window), pos], none when
// pos < 0), each once, through the warp slices the kernel visits; rows past group x q_len see the
// last token's; with chunks of at least 16 tokens chunk 0 holds a key of every token that has
// one (the serial and fused merges need a finite first chunk).
TEST(DecodeTcLayout, SeveralQueryTokensRowsSeeTheirOwnKeys) {
  const int capacity = 3000;
  int checked = 0;
  for (const int raw_len : {0, 1, 2, 5, 15, 16, 17, 40, 64, 65, 129, 700, 2999, 3000}) {
    for (const auto& [group, q_len] :
         std::vector<std::pair<int, int>>{{1, 2}, {1, 16}, {2, 8}, {3, 5}, {4, 4}, {16, 1}}) {
      for (const int window : {0, 1, 5, 40}) {
        for (const auto& [splits, chunk] :
             std::vector<std::pair<int, int>>{{1, 0}, {5, 37}, {300, 16}, {3, 64}}) {
          const int rows = group * q_len;
          const int union_window = detail::tc_union_window(window, q_len);
          const int len = std::clamp(raw_len, 0, capacity);
          const detail::TcSplitRange r0 =
              detail::tc_split_range(raw_len, capacity, union_window, splits, chunk, 0);
          for (int row = 0; row < detail::kTcRows; ++row) {
            const int token = row < rows ? row / group : q_len - 1;
            const int pos = len - q_len + token;
            std::vector<int> seen(static_cast<std::size_t>(capacity), 0);
            bool in_chunk0 = false;
            for (int split = 0; split < r0.num_active_splits; ++split) {
              const detail::TcSplitRange r =
                  detail::tc_split_range(raw_len, capacity, union_window, splits, chunk, split);
              const detail::TcRowKeys keys =
                  detail::tc_row_keys(len, q_len, group, rows, window, row, r);
              const int range_len = r.end - r.begin;
              ASSERT_LE(keys.hi, range_len);
              // The kernel's mask, over the keys its warps visit.
              for (int w = 0; w < detail::kTcWarps; ++w) {
                for (int t = 0; t < detail::tc_warp_tiles(range_len, w); ++t) {
                  const int b = detail::tc_slice_begin(t, w);
                  for (int rel = b; rel < std::min(range_len, b + detail::kTcWarpTokens); ++rel) {
                    if (rel < keys.hi && rel >= keys.lo) {
                      ++seen[static_cast<std::size_t>(r.begin + rel)];
                      in_chunk0 = in_chunk0 || split == 0;
                    }
                  }
                }
              }
            }
            const int first = window > 0 ? std::max(0, pos + 1 - window) : 0;
            for (int key = 0; key < capacity; ++key) {
              const int want = pos >= 0 && key >= first && key <= pos ? 1 : 0;
              ASSERT_EQ(seen[static_cast<std::size_t>(key)], want)
                  << "len " << raw_len << " group " << group << " q_len " << q_len << " window "
                  << window << " splits " << splits << "x" << chunk << " row " << row << " key "
                  << key;
            }
            if (pos >= 0 && r0.num_active_splits > 1 && chunk >= 16) {
              EXPECT_TRUE(in_chunk0) << "row " << row << " sees no key of chunk 0 (len " << raw_len
                                     << ", window " << window << ")";
            }
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 14 * 6 * 4 * 4 * 16);
}

TEST(DecodeTcLayout, SplitsAndWarpSlicesCoverEveryKeyOnce) {
  for (const int capacity : {5000}) {
    for (const int raw_len : {0, 1, 15, 16, 17, 63, 64, 65, 100, 1000, 4097, 6000, -3}) {
      for (const int window : {0, 1, 33, 500}) {
        for (const auto& [splits, chunk] :
             std::vector<std::pair<int, int>>{{1, 0}, {5, 37}, {8, 64}, {3, 1000}, {64, 512}}) {
          std::vector<int> count(static_cast<std::size_t>(capacity), 0);
          const detail::TcSplitRange r0 =
              detail::tc_split_range(raw_len, capacity, window, splits, chunk, 0);
          for (int split = 0; split < r0.num_active_splits; ++split) {
            const detail::TcSplitRange r =
                detail::tc_split_range(raw_len, capacity, window, splits, chunk, split);
            ASSERT_EQ(r.num_active_splits, r0.num_active_splits);
            const int len = r.end - r.begin;
            if (r.num_active_splits > 1) {
              ASSERT_GT(len, 0) << "no empty chunk when splitting";
            }
            for (int w = 0; w < detail::kTcWarps; ++w) {
              const int tiles = detail::tc_warp_tiles(len, w);
              for (int t = 0; t < tiles; ++t) {
                const int b = detail::tc_slice_begin(t, w);
                ASSERT_LT(b, len) << "a visited slice holds a key";
                for (int key = b; key < std::min(len, b + detail::kTcWarpTokens); ++key) {
                  ++count[static_cast<std::size_t>(r.begin + key)];
                }
              }
              // The first unvisited tile of the warp holds none of the range's keys.
              EXPECT_GE(detail::tc_slice_begin(tiles, w), len);
            }
          }
          const int len = std::clamp(raw_len, 0, capacity);
          const int first = window > 0 && len > window ? len - window : 0;
          for (int t = 0; t < capacity; ++t) {
            ASSERT_EQ(count[static_cast<std::size_t>(t)], t >= first && t < len ? 1 : 0)
                << "key " << t << " len " << raw_len << " window " << window << " splits " << splits
                << " chunk " << chunk;
          }
        }
      }
    }
  }
}

TEST(DecodeTcLayout, PlannedGridFillsBetweenOneAndAHalfAndTwoWaves) {
  // An H200: 132 SMs; the variant's resident CTAs at head_dim 128 (shared memory bound).
  const int resident = detail::TcDecodeShape<128>::kMinCtasPerSm;
  ASSERT_GE(resident, 1);
  DecodePlanOptions o;
  o.num_sms = 132;
  o.ctas_per_sm = detail::kTcPlanWaves * resident;  // what the variant's options report
  o.min_chunk_tokens = detail::kTcMinChunkTokens;
  const std::int64_t wave = std::int64_t{132} * resident;
  for (const auto& [batch, len] : std::vector<std::pair<int, int>>{
           {1, 4096}, {1, 32768}, {4, 8192}, {8, 4096}, {8, 16384}, {16, 8192}}) {
    const std::vector<std::int32_t> lens(static_cast<std::size_t>(batch), len);
    const DecodePlan plan = plan_paged_decode(lens, 8, o);
    std::int64_t ctas = 0;
    for (const std::int32_t l : lens) {
      ctas +=
          8 *
          detail::tc_split_range(l, l, 0, plan.num_splits, plan.kv_chunk_size, 0).num_active_splits;
    }
    if (std::int64_t{batch} * 8 >= detail::kTcPlanWaves * wave) continue;
    ASSERT_TRUE(plan.split_kv()) << batch << " x " << len;
    // The planner stays within its target, so the grid is just under kTcPlanWaves waves
    // (512 of 528 CTAs on these shapes): at least 1.5 waves, at most 2.
    EXPECT_GE(2 * ctas, 3 * wave) << batch << " x " << len << ": at least 1.5 waves";
    EXPECT_LE(ctas, detail::kTcPlanWaves * wave) << batch << " x " << len;
  }
}

TEST(DecodeTcLayout, PageOffsetTableMatchesTheLayout) {
  std::mt19937 rng(3);
  for (const int block_size : {1, 3, 16, 64, 100, 256}) {
    const std::int64_t num_blocks = 40;
    for (int kind = 0; kind < 3; ++kind) {
      KVLayout layout = kind == 0   ? KVLayout::nhd(num_blocks, block_size, 4, 128)
                        : kind == 1 ? KVLayout::hnd(num_blocks, block_size, 4, 128)
                                    : KVLayout::nhd(num_blocks, block_size, 4, 128);
      if (kind == 2) {  // padded: a token row wider than its heads, blocks further apart
        layout.stride_token = 4 * 128 + 64;
        layout.stride_block = layout.stride_token * block_size + 256;
      }
      std::vector<std::int32_t> row(static_cast<std::size_t>(num_blocks));
      std::iota(row.begin(), row.end(), 0);
      std::shuffle(row.begin(), row.end(), rng);
      row[2] = static_cast<std::int32_t>(num_blocks);  // outside the pool
      row[3] = -1;
      const int end = std::min<int>(static_cast<int>(num_blocks) * block_size, 1000);
      for (int head = 0; head < 4; ++head) {
        detail::TcPageGeometry g{
            layout.stride_block, layout.stride_token, head * layout.stride_head,
            layout.num_blocks,   block_size,          detail::tc_block_shift(block_size)};
        for (int t = 0; t < end + 20; ++t) {
          const int block_index = t / block_size;
          std::int64_t want = -1;
          if (t < end && block_index != 2 && block_index != 3) {
            want = layout.offset(row[static_cast<std::size_t>(block_index)], t % block_size, head);
          }
          ASSERT_EQ(detail::tc_token_offset(g, row.data(), t, end), want)
              << "block size " << block_size << " kind " << kind << " head " << head << " t " << t;
          // The two-step form (block id loaded ahead, offset later) gives the same offset.
          ASSERT_EQ(
              detail::tc_token_block_offset(g, t, detail::tc_token_block(g, row.data(), t, end)),
              want)
              << "two-step: block size " << block_size << " kind " << kind << " t " << t;
        }
      }
    }
  }
  EXPECT_EQ(detail::tc_block_shift(64), 6);
  EXPECT_EQ(detail::tc_block_shift(100), -1);
  EXPECT_EQ(detail::tc_block_shift(1), 0);
}

TEST(DecodeTcLayout, RingScheduleIssuesEveryTileFromItsOwnOffsets) {
  for (const int stages : {2, 3, 4}) {
    for (const int tiles : {0, 1, 2, 3, 7, 20}) {
      std::vector<int> slot_holds(static_cast<std::size_t>(stages), -1);  // offset table
      std::vector<int> ring(static_cast<std::size_t>(stages), -1);        // K/V stages
      std::vector<int> issued;
      std::vector<int> resolved_at(static_cast<std::size_t>(tiles + stages + 1), -2);
      const auto resolve = [&](int tile, int iteration) {
        slot_holds[static_cast<std::size_t>(detail::tc_slot(tile, stages))] = tile;
        resolved_at[static_cast<std::size_t>(tile)] = iteration;
      };
      const auto issue = [&](int tile, int iteration) {
        const int slot = detail::tc_slot(tile, stages);
        ASSERT_EQ(slot_holds[static_cast<std::size_t>(slot)], tile) << "offsets of the tile";
        // Resolved at least one iteration (a __syncwarp) earlier, or in the prologue.
        ASSERT_LT(resolved_at[static_cast<std::size_t>(tile)], iteration);
        ring[static_cast<std::size_t>(slot)] = tile;
        issued.push_back(tile);
      };
      for (int t = 0; t < stages - 1; ++t) resolve(t, -1);
      for (int t = 0; t < stages - 1; ++t) issue(t, 0);
      resolve(stages - 1, -1);
      int groups = 2 * (stages - 1);
      for (int i = 0; i < tiles; ++i) {
        // K of tile i complete: groups after it are at most tc_k_wait_groups.
        EXPECT_EQ(groups - (2 * i + 1), detail::tc_k_wait_groups(stages));
        ASSERT_EQ(ring[static_cast<std::size_t>(detail::tc_slot(i, stages))], i);
        issue(detail::tc_issue_tile(i, stages), i);
        groups += 2;
        resolve(detail::tc_resolve_tile(i, stages), i);
        EXPECT_EQ(detail::tc_slot(detail::tc_resolve_tile(i, stages), stages),
                  detail::tc_slot(i, stages));
        // The ring stage of tile i still holds tile i while it is computed.
        ASSERT_EQ(ring[static_cast<std::size_t>(detail::tc_slot(i, stages))], i);
        EXPECT_EQ(groups - (2 * i + 2), detail::tc_v_wait_groups(stages));
      }
      for (int i = 0; i < tiles; ++i) {
        EXPECT_NE(std::find(issued.begin(), issued.end(), i), issued.end()) << i;
      }
    }
  }
}

// scripts/kernel-resources computes the variant's occupancy with its dynamic shared memory, which
// ptxas does not report: its DYNAMIC_SMEM line must hold the header's sizes.
TEST(DecodeTcLayout, KernelResourcesScriptKnowsTheSharedMemory) {
  std::ifstream in(PAGEDKV_KERNEL_RESOURCES_SCRIPT);
  ASSERT_TRUE(in) << PAGEDKV_KERNEL_RESOURCES_SCRIPT;
  std::stringstream text;
  text << in.rdbuf();
  std::ostringstream want;
  want << "\"tc_decode_kernel\": {64: " << detail::TcDecodeShape<64>::kSmemBytes
       << ", 128: " << detail::TcDecodeShape<128>::kSmemBytes
       << ", 256: " << detail::TcDecodeShape<256>::kSmemBytes << "}";
  EXPECT_NE(text.str().find(want.str()), std::string::npos) << "missing: " << want.str();
  // The launch bound's CTAs per SM are what shared memory allows (sm_90: 228 KiB per SM).
  EXPECT_EQ(detail::TcDecodeShape<64>::kMinCtasPerSm, 4);
  EXPECT_EQ(detail::TcDecodeShape<128>::kMinCtasPerSm, 2);
  EXPECT_EQ(detail::TcDecodeShape<256>::kMinCtasPerSm, 1);
}

}  // namespace
}  // namespace pagedkv
