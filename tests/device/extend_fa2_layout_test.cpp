// The FA2-style extend kernel's layouts and work decomposition (kernels/internal/
// extend_fa2_layout.hpp), checked on the host, without a GPU:
//   - a host model of one warp of the kernel (32 query rows = two m16 blocks, or 16 at head_dim
//     256): Q, K and V tiles written by the kernel's copy map into the swizzled shared layout,
//     ldmatrix(.trans) modelled from its documented per-lane semantics at the kernel's addresses,
//     the MMA modelled from the fragment maps, the score accumulators packed into the PV A operand,
//     against a reference matmul, for every warp of a 4-warp CTA;
//   - the swizzle: a bijection per row, conflict-free ldmatrix phases for Q, K and V;
//   - the copy map covers the Q and K/V tiles once; the shapes' shared memory;
//   - the 3-stage ring: every tile computed only after its copies completed, no stage or offset
//     slot overwritten while it is read, every tile's copies issued from its own offsets;
//   - the split over keys covers every visible key of every row exactly once, and merging the
//     splits' partial rows as the merge kernel does equals the full softmax;
//   - the grid's work items: a bijection, heaviest query tile first; the planner's split count.
// Built again with PAGEDKV_TEST_BROKEN_FA2_GEOMETRY = 1, 2, 3, 4 (a swizzle with bank conflicts,
// a ring that computes a tile still in flight, a split that drops a key tile, Q fragments loaded
// from the wrong chunks): those
// builds must fail (ctest WILL_FAIL), so these tests can fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "internal/extend_fa2_layout.hpp"

namespace pagedkv {
namespace {

using detail::MmaCoord;

float round_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}

using Frag = std::vector<std::vector<float>>;  // [lane][element]

// d (C layout) += A x B, from the fragment maps.
void model_mma(Frag& d, const Frag& a, const Frag& b) {
  float am[16][16] = {};
  float bm[16][8] = {};
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 8; ++e) {
      const MmaCoord at = detail::mma_a_coord(lane, e);
      am[at.row][at.col] = a[static_cast<std::size_t>(lane)][static_cast<std::size_t>(e)];
    }
    for (int e = 0; e < 4; ++e) {
      const MmaCoord at = detail::mma_b_coord(lane, e);
      bm[at.row][at.col] = b[static_cast<std::size_t>(lane)][static_cast<std::size_t>(e)];
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 4; ++e) {
      const MmaCoord at = detail::mma_c_coord(lane, e);
      double sum = 0.0;
      for (int k = 0; k < 16; ++k) sum += double{am[at.row][k]} * bm[k][at.col];
      d[static_cast<std::size_t>(lane)][static_cast<std::size_t>(e)] += static_cast<float>(sum);
    }
  }
}

// ldmatrix.x4: lane l supplies the chunk index of row l % 8 of matrix l / 8; the result is
// [lane][register j][half].
std::vector<std::vector<std::vector<float>>> model_ldmatrix(const std::vector<float>& smem,
                                                            const int (&chunk_of_lane)[32],
                                                            bool trans) {
  std::vector<std::vector<std::vector<float>>> r(
      32, std::vector<std::vector<float>>(4, std::vector<float>(2)));
  for (int lane = 0; lane < 32; ++lane) {
    for (int j = 0; j < 4; ++j) {
      for (int h = 0; h < 2; ++h) {
        const MmaCoord at = detail::ldmatrix_coord(lane, h, trans);
        r[static_cast<std::size_t>(lane)][static_cast<std::size_t>(j)]
         [static_cast<std::size_t>(h)] =
             smem[static_cast<std::size_t>(chunk_of_lane[8 * j + at.row]) * 8 +
                  static_cast<std::size_t>(at.col)];
      }
    }
  }
  return r;
}

// A [rows x head_dim] tile written as the kernel's threads copy it (fa2_copy, fa2_swizzled).
std::vector<float> write_tile(const std::vector<float>& rows, int num_rows, int head_dim,
                              int threads) {
  const int chunks = head_dim / 8;
  const int per_pass = threads / chunks;
  std::vector<float> smem(rows.size(), std::nanf(""));
  for (int tid = 0; tid < threads; ++tid) {
    for (int i = 0; i < num_rows / per_pass; ++i) {
      const MmaCoord c = detail::fa2_copy(tid, i, chunks, per_pass);
      for (int k = 0; k < 8; ++k) {
        smem[static_cast<std::size_t>(detail::fa2_swizzled(c.row, c.col, chunks)) * 8 +
             static_cast<std::size_t>(k)] =
            rows[static_cast<std::size_t>(c.row * head_dim + c.col * 8 + k)];
      }
    }
  }
  return smem;
}

struct ModelError {
  double score = 0.0;
  double out = 0.0;
};

// One warp of a kWarps CTA: S = Q K^T over the tile's kKeys keys, then O = P V with
// P = round(S / 64) packed from the accumulators; against double reference matmuls.
template <int kHeadDim, int kWarps>
ModelError run_warp_model(int warp, std::mt19937& rng) {
  using S = detail::Fa2Shape<kHeadDim, kWarps>;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const auto random_rows = [&](int n) {
    std::vector<float> x(static_cast<std::size_t>(n * kHeadDim));
    for (float& v : x) v = round_bf16(u(rng));
    return x;
  };
  const std::vector<float> q = random_rows(S::kRows);
  const std::vector<float> k = random_rows(S::kKeys);
  const std::vector<float> v = random_rows(S::kKeys);
  const std::vector<float> q_smem = write_tile(q, S::kRows, kHeadDim, S::kThreads);
  const std::vector<float> k_smem = write_tile(k, S::kKeys, kHeadDim, S::kThreads);
  const std::vector<float> v_smem = write_tile(v, S::kKeys, kHeadDim, S::kThreads);
  for (const float x : q_smem) EXPECT_FALSE(std::isnan(x)) << "the copies cover the Q tile";
  for (const float x : k_smem) EXPECT_FALSE(std::isnan(x)) << "the copies cover the K tile";
  constexpr int kC = S::kChunks;
  constexpr int kMB = S::kMBlocks;
  constexpr int kKeyTiles = S::kKeys / 8;
  const auto regs = [](const std::vector<std::vector<std::vector<float>>>& r, int lane, int j0,
                       int j1) {
    const auto& l = r[static_cast<std::size_t>(lane)];
    return std::vector<float>{
        l[static_cast<std::size_t>(j0)][0], l[static_cast<std::size_t>(j0)][1],
        l[static_cast<std::size_t>(j1)][0], l[static_cast<std::size_t>(j1)][1]};
  };

  std::vector<std::vector<Frag>> s(
      kMB, std::vector<Frag>(kKeyTiles, Frag(32, std::vector<float>(4, 0.0f))));
  for (int ks = 0; ks < kHeadDim / 16; ++ks) {
    std::vector<Frag> a(kMB, Frag(32, std::vector<float>(8)));
    for (int mb = 0; mb < kMB; ++mb) {
      int addr[32];
      for (int lane = 0; lane < 32; ++lane) {
        addr[lane] = detail::fa2_swizzled(detail::fa2_q_row(S::kRowsPerWarp, warp, mb, lane),
                                          detail::fa2_q_chunk(ks, lane), kC);
      }
      const auto r = model_ldmatrix(q_smem, addr, false);
      for (int lane = 0; lane < 32; ++lane) {
        for (int j = 0; j < 4; ++j) {
          a[static_cast<std::size_t>(mb)][static_cast<std::size_t>(lane)]
           [static_cast<std::size_t>(2 * j)] =
               r[static_cast<std::size_t>(lane)][static_cast<std::size_t>(j)][0];
          a[static_cast<std::size_t>(mb)][static_cast<std::size_t>(lane)]
           [static_cast<std::size_t>(2 * j + 1)] =
               r[static_cast<std::size_t>(lane)][static_cast<std::size_t>(j)][1];
        }
      }
    }
    for (int nn = 0; nn < S::kKeys / 16; ++nn) {
      int addr[32];
      for (int lane = 0; lane < 32; ++lane) {
        addr[lane] = detail::fa2_swizzled(nn * 16 + detail::qk_b_key(lane),
                                          2 * ks + detail::qk_b_chunk(lane), kC);
      }
      const auto r = model_ldmatrix(k_smem, addr, false);
      Frag b0(32), b1(32);
      for (int lane = 0; lane < 32; ++lane) {
        b0[static_cast<std::size_t>(lane)] = regs(r, lane, 0, 1);
        b1[static_cast<std::size_t>(lane)] = regs(r, lane, 2, 3);
      }
      for (int mb = 0; mb < kMB; ++mb) {
        model_mma(s[static_cast<std::size_t>(mb)][static_cast<std::size_t>(2 * nn)],
                  a[static_cast<std::size_t>(mb)], b0);
        model_mma(s[static_cast<std::size_t>(mb)][static_cast<std::size_t>(2 * nn + 1)],
                  a[static_cast<std::size_t>(mb)], b1);
      }
    }
  }
  const auto ref_score = [&](int row, int key) {
    double sum = 0.0;
    for (int d = 0; d < kHeadDim; ++d) {
      sum += double{q[static_cast<std::size_t>(row * kHeadDim + d)]} *
             k[static_cast<std::size_t>(key * kHeadDim + d)];
    }
    return sum;
  };
  ModelError err;
  for (int mb = 0; mb < kMB; ++mb) {
    for (int n = 0; n < kKeyTiles; ++n) {
      for (int lane = 0; lane < 32; ++lane) {
        for (int c = 0; c < 4; ++c) {
          const int row = detail::fa2_acc_row(S::kRowsPerWarp, warp, mb, lane, c);
          const int key = n * 8 + detail::mma_c_coord(lane, c).col;
          err.score = std::max(
              err.score, std::abs(s[static_cast<std::size_t>(mb)][static_cast<std::size_t>(n)]
                                   [static_cast<std::size_t>(lane)][static_cast<std::size_t>(c)] -
                                  ref_score(row, key)));
        }
      }
    }
  }
  // O = P V, P packed from the score accumulators through pv_a_source.
  constexpr int kNTiles = kHeadDim / 8;
  std::vector<std::vector<Frag>> o(
      kMB, std::vector<Frag>(kNTiles, Frag(32, std::vector<float>(4, 0.0f))));
  for (int kk = 0; kk < S::kKeys / 16; ++kk) {
    std::vector<Frag> pa(kMB, Frag(32, std::vector<float>(8)));
    for (int mb = 0; mb < kMB; ++mb) {
      for (int lane = 0; lane < 32; ++lane) {
        for (int e = 0; e < 8; ++e) {
          const detail::PvASource src = detail::pv_a_source(e);
          pa[static_cast<std::size_t>(mb)][static_cast<std::size_t>(lane)]
            [static_cast<std::size_t>(e)] = round_bf16(
                s[static_cast<std::size_t>(mb)][static_cast<std::size_t>(2 * kk + src.tile)]
                 [static_cast<std::size_t>(lane)][static_cast<std::size_t>(src.elem)] /
                64.0f);
        }
      }
    }
    for (int dd = 0; dd < kHeadDim / 16; ++dd) {
      int addr[32];
      for (int lane = 0; lane < 32; ++lane) {
        addr[lane] = detail::fa2_swizzled(kk * 16 + detail::pv_b_key(lane),
                                          2 * dd + detail::pv_b_chunk(lane), kC);
      }
      const auto r = model_ldmatrix(v_smem, addr, true);
      Frag b0(32), b1(32);
      for (int lane = 0; lane < 32; ++lane) {
        b0[static_cast<std::size_t>(lane)] = regs(r, lane, 0, 1);
        b1[static_cast<std::size_t>(lane)] = regs(r, lane, 2, 3);
      }
      for (int mb = 0; mb < kMB; ++mb) {
        model_mma(o[static_cast<std::size_t>(mb)][static_cast<std::size_t>(2 * dd)],
                  pa[static_cast<std::size_t>(mb)], b0);
        model_mma(o[static_cast<std::size_t>(mb)][static_cast<std::size_t>(2 * dd + 1)],
                  pa[static_cast<std::size_t>(mb)], b1);
      }
    }
  }
  for (int mb = 0; mb < kMB; ++mb) {
    for (int n = 0; n < kNTiles; ++n) {
      for (int lane = 0; lane < 32; ++lane) {
        for (int c = 0; c < 4; ++c) {
          const int row = detail::fa2_acc_row(S::kRowsPerWarp, warp, mb, lane, c);
          const int col = n * 8 + detail::mma_c_coord(lane, c).col;
          double want = 0.0;
          for (int key = 0; key < S::kKeys; ++key) {
            want += double{round_bf16(static_cast<float>(ref_score(row, key)) / 64.0f)} *
                    v[static_cast<std::size_t>(key * kHeadDim + col)];
          }
          err.out = std::max(
              err.out, std::abs(o[static_cast<std::size_t>(mb)][static_cast<std::size_t>(n)]
                                 [static_cast<std::size_t>(lane)][static_cast<std::size_t>(c)] -
                                want));
        }
      }
    }
  }
  return err;
}

template <int kHeadDim, int kWarps>
void expect_warp_models(std::mt19937& rng) {
  for (int warp = 0; warp < kWarps; ++warp) {
    const ModelError e = run_warp_model<kHeadDim, kWarps>(warp, rng);
    EXPECT_LT(e.score, 1e-3) << "head_dim " << kHeadDim << " warps " << kWarps << " warp " << warp;
    EXPECT_LT(e.out, 2e-2) << "head_dim " << kHeadDim << " warps " << kWarps << " warp " << warp;
  }
}

TEST(ExtendFa2Layout, WarpModelMatchesReferenceMatmul) {
  std::mt19937 rng(11);
  expect_warp_models<64, 4>(rng);
  expect_warp_models<64, 2>(rng);
  expect_warp_models<128, 4>(rng);
  expect_warp_models<128, 2>(rng);
  expect_warp_models<256, 4>(rng);
}

TEST(ExtendFa2Layout, AccumulatorRowsPartitionTheTile) {
  for (const int rows_per_warp : {16, 32}) {
    for (const int warps : {2, 4}) {
      std::vector<int> seen(static_cast<std::size_t>(rows_per_warp * warps), 0);
      for (int w = 0; w < warps; ++w) {
        for (int mb = 0; mb < rows_per_warp / 16; ++mb) {
          for (int lane = 0; lane < 32; lane += 4) {  // a quad shares its rows
            for (const int c : {0, 2}) {
              ++seen[static_cast<std::size_t>(detail::fa2_acc_row(rows_per_warp, w, mb, lane, c))];
            }
          }
        }
      }
      for (const int n : seen) EXPECT_EQ(n, 1);
    }
  }
}

template <int kHeadDim, int kWarps>
void expect_conflict_free() {
  using S = detail::Fa2Shape<kHeadDim, kWarps>;
  constexpr int kC = S::kChunks;
  std::vector<int> seen(static_cast<std::size_t>(S::kRows * kC), 0);
  for (int row = 0; row < S::kRows; ++row) {
    for (int c = 0; c < kC; ++c) {
      const int at = detail::fa2_swizzled(row, c, kC);
      ASSERT_GE(at, row * kC);
      ASSERT_LT(at, (row + 1) * kC);
      ++seen[static_cast<std::size_t>(at)];
    }
  }
  for (const int n : seen) EXPECT_EQ(n, 1);
  // Each 8-lane phase of an ldmatrix.x4 touches 8 distinct 16-byte bank groups (rows are
  // multiples of 128 bytes, so a chunk's bank group is its index mod 8).
  for (int step = 0; step < kHeadDim / 16; ++step) {
    for (int phase = 0; phase < 4; ++phase) {
      for (int warp = 0; warp < kWarps; ++warp) {
        for (int mb = 0; mb < S::kMBlocks; ++mb) {
          std::set<int> qa;
          for (int l = 8 * phase; l < 8 * phase + 8; ++l) {
            qa.insert(detail::fa2_swizzled(detail::fa2_q_row(S::kRowsPerWarp, warp, mb, l),
                                           detail::fa2_q_chunk(step, l), kC) %
                      8);
          }
          EXPECT_EQ(qa.size(), 8u) << "Q, head_dim " << kHeadDim;
        }
      }
      for (int kk = 0; kk < S::kKeys / 16; ++kk) {
        std::set<int> kb, vb;
        for (int l = 8 * phase; l < 8 * phase + 8; ++l) {
          kb.insert(detail::fa2_swizzled(kk * 16 + detail::qk_b_key(l),
                                         2 * step + detail::qk_b_chunk(l), kC) %
                    8);
          vb.insert(detail::fa2_swizzled(kk * 16 + detail::pv_b_key(l),
                                         2 * step + detail::pv_b_chunk(l), kC) %
                    8);
        }
        EXPECT_EQ(kb.size(), 8u) << "K, head_dim " << kHeadDim;
        EXPECT_EQ(vb.size(), 8u) << "V, head_dim " << kHeadDim;
      }
    }
  }
}

TEST(ExtendFa2Layout, SwizzleIsABijectionAndLdmatrixPhasesAreConflictFree) {
  expect_conflict_free<64, 4>();
  expect_conflict_free<64, 2>();
  expect_conflict_free<128, 4>();
  expect_conflict_free<128, 2>();
  expect_conflict_free<256, 4>();
  expect_conflict_free<256, 2>();
}

template <int kHeadDim, int kWarps>
void expect_copies_cover() {
  using S = detail::Fa2Shape<kHeadDim, kWarps>;
  for (const auto& [rows, passes] :
       {std::pair{S::kRows, S::kQCopies}, std::pair{S::kKeys, S::kCopiesPerTile}}) {
    std::vector<int> seen(static_cast<std::size_t>(rows * S::kChunks), 0);
    for (int tid = 0; tid < S::kThreads; ++tid) {
      for (int i = 0; i < passes; ++i) {
        const MmaCoord c = detail::fa2_copy(tid, i, S::kChunks, S::kRowsPerPass);
        ASSERT_LT(c.row, rows);
        ++seen[static_cast<std::size_t>(c.row * S::kChunks + c.col)];
      }
    }
    for (const int n : seen) EXPECT_EQ(n, 1) << "head_dim " << kHeadDim << " warps " << kWarps;
  }
  EXPECT_EQ(S::kSmemBytes, S::kQBytes + S::kRingBytes + S::kOffsetBytes);
  EXPECT_EQ(S::kRingBytes, 2u * S::kStages * S::kKeys * kHeadDim * 2u);
  EXPECT_LE(S::kSmemBytes, 227u * 1024u);
}

TEST(ExtendFa2Layout, CopiesCoverEveryChunkOnceAndSharedMemoryFits) {
  expect_copies_cover<64, 4>();
  expect_copies_cover<64, 2>();
  expect_copies_cover<128, 4>();
  expect_copies_cover<128, 2>();
  expect_copies_cover<256, 4>();
  expect_copies_cover<256, 2>();
  // The tile rows the host uses for the grid are the kernel's.
  EXPECT_EQ((detail::Fa2Shape<128, 4>::kRows), 128);
  EXPECT_EQ((detail::Fa2Shape<64, 2>::kRows), 64);
  EXPECT_EQ((detail::Fa2Shape<256, 4>::kRows), 64);
}

// The ring as the kernel runs it: per thread-independent events (resolve, barrier, issue, wait,
// compute), with cp.async groups completing as late as the wait allows.
TEST(ExtendFa2Layout, RingScheduleComputesOnlyLandedTilesAndNeverOverwritesLiveData) {
  constexpr int kStages = 3;
  for (const int tiles : {0, 1, 2, 3, 4, 7, 20}) {
    std::vector<int> slot_holds(kStages, -1);   // offset table: which tile's offsets
    std::vector<int> stage_holds(kStages, -1);  // K/V ring: which tile's copies were issued there
    std::vector<int> groups;                    // committed groups, oldest first (tile or -1)
    std::vector<int> resolved_at(static_cast<std::size_t>(tiles + 2 * kStages), -100);
    std::vector<int> last_read(kStages, -100);  // iteration that last read the stage
    int barrier = -1;                           // iteration of the last CTA barrier
    const auto resolve = [&](int tile, int iteration) {
      slot_holds[static_cast<std::size_t>(detail::fa2_slot(tile, kStages))] = tile;
      resolved_at[static_cast<std::size_t>(tile)] = iteration;
    };
    const auto issue = [&](int tile, int iteration) {
      if (tile < tiles) {
        const int stage = detail::fa2_slot(tile, kStages);
        ASSERT_EQ(slot_holds[static_cast<std::size_t>(stage)], tile) << "the tile's own offsets";
        // Resolved before a barrier that precedes this issue.
        ASSERT_LT(resolved_at[static_cast<std::size_t>(tile)], barrier + (iteration < 0 ? 1 : 0));
        // No warp still reads the stage: its last reader finished before this iteration's barrier.
        ASSERT_LT(last_read[static_cast<std::size_t>(stage)], iteration);
        stage_holds[static_cast<std::size_t>(stage)] = tile;
      }
      groups.push_back(tile < tiles ? tile : -1);
    };
    for (int t = 0; t < kStages; ++t) resolve(t, -2);
    barrier = -1;
    for (int t = 0; t < kStages - 1; ++t) issue(t, -1);
    for (int i = 0; i < tiles; ++i) {
      // cp.async.wait_group N: all but the newest N groups are complete.
      const int pending = detail::fa2_wait_groups(kStages);
      std::set<int> in_flight;
      for (std::size_t g = groups.size() - std::min<std::size_t>(groups.size(), pending);
           g < groups.size(); ++g) {
        in_flight.insert(groups[g]);
      }
      ASSERT_EQ(in_flight.count(i), 0u)
          << "tile " << i << " computed while its copies may be in flight";
      barrier = i;
      issue(detail::fa2_issue_tile(i, kStages), i);
      const int ahead = detail::fa2_resolve_tile(i, kStages);
      // The slot written now is not the one the next issue reads before the next barrier... and
      // the tile whose offsets it held has been issued already.
      const int slot = detail::fa2_slot(ahead, kStages);
      ASSERT_NE(slot, detail::fa2_slot(detail::fa2_issue_tile(i, kStages), kStages));
      if (slot_holds[static_cast<std::size_t>(slot)] >= 0 &&
          slot_holds[static_cast<std::size_t>(slot)] < tiles) {
        ASSERT_NE(
            std::find(groups.begin(), groups.end(), slot_holds[static_cast<std::size_t>(slot)]),
            groups.end());
      }
      resolve(ahead, i);
      const int stage = detail::fa2_slot(i, kStages);
      ASSERT_EQ(stage_holds[static_cast<std::size_t>(stage)], i) << "the stage holds the tile";
      last_read[static_cast<std::size_t>(stage)] = i;
    }
    for (int t = 0; t < tiles; ++t) {
      EXPECT_NE(std::find(groups.begin(), groups.end(), t), groups.end()) << "tile " << t;
    }
  }
}

TEST(ExtendFa2Layout, SplitsCoverEveryVisibleKeyOfEveryRowOnce) {
  int checked = 0;
  for (const int rows : {32, 64, 128}) {
    for (const int keys : {16, 32, 64}) {
      for (const int group : {1, 3, 8}) {
        for (const int window : {0, 5, 100}) {
          for (const int q_len : {1, 7, 130}) {
            for (const int prefix : {0, 33, 1000}) {
              for (const int splits : {1, 2, 3, 16}) {
                const int tiles = detail::extend_num_tiles(q_len, group, rows);
                for (int tile = 0; tile < tiles; ++tile) {
                  const detail::Fa2TileWork w =
                      detail::fa2_tile_work(q_len, prefix, group, window, tile, rows, keys, splits);
                  ASSERT_GE(w.active, 1);
                  ASSERT_LE(w.active, splits);
                  std::vector<int> covered(static_cast<std::size_t>(w.num_kv_tiles), 0);
                  for (int s = 0; s < splits; ++s) {
                    const detail::Fa2SplitTiles st = detail::fa2_split_tiles(w, s);
                    if (s < w.active && w.num_kv_tiles > 0) {
                      EXPECT_LT(st.first, st.last);
                    }
                    if (s >= w.active) {
                      EXPECT_EQ(st.first, st.last);
                    }
                    for (int t = st.first; t < st.last; ++t) ++covered[static_cast<std::size_t>(t)];
                  }
                  for (const int n : covered)
                    ASSERT_EQ(n, 1) << "a key tile covered " << n << " times";
                  // Every visible key of every row of the tile lies in the tile's key tiles.
                  for (int r = tile * rows; r < std::min((tile + 1) * rows, q_len * group); ++r) {
                    const int pos = prefix + r / group;
                    for (int key = 0; key <= pos; ++key) {
                      if (!detail::extend_key_visible(pos, key, window)) continue;
                      ASSERT_GE(key, w.geo.kv_begin);
                      ASSERT_LT(key, w.geo.kv_begin + w.num_kv_tiles * keys);
                    }
                  }
                  ++checked;
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// Partial rows as the kernel writes them (per split: the max m, l = sum 2^(s - m), o = sum 2^(s -
// m) v / l, lse2 = m + log2 l, or -inf and zeros for a split that saw no key), merged as
// fa2_merge_kernel does, against the full softmax in double.
TEST(ExtendFa2Layout, MergedSplitsEqualTheFullSoftmax) {
  std::mt19937 rng(5);
  std::normal_distribution<float> score(0.0f, 3.0f);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 200; ++trial) {
    const int keys = 16;
    const int num_kv_tiles = 1 + trial % 13;
    const int splits = 1 + trial % 7;
    const int n = num_kv_tiles * keys;
    std::vector<float> s(static_cast<std::size_t>(n));
    std::vector<float> v(static_cast<std::size_t>(n));
    // Some rows see only a prefix (causal): keys past `visible` are masked, possibly whole splits.
    const int visible = trial % 3 == 0 ? n / 3 : n;
    for (int i = 0; i < n; ++i) {
      s[static_cast<std::size_t>(i)] = i < visible ? score(rng) : ninf;
      v[static_cast<std::size_t>(i)] = val(rng);
    }
    detail::Fa2TileWork w{};
    w.num_kv_tiles = num_kv_tiles;
    w.chunk_tiles = (num_kv_tiles + splits - 1) / splits;
    w.active = (num_kv_tiles + w.chunk_tiles - 1) / w.chunk_tiles;
    std::vector<float> lse2;
    std::vector<float> part;
    for (int sp = 0; sp < w.active; ++sp) {
      const detail::Fa2SplitTiles st = detail::fa2_split_tiles(w, sp);
      float m = ninf;
      for (int i = st.first * keys; i < st.last * keys; ++i)
        m = std::max(m, s[static_cast<std::size_t>(i)]);
      const float m_use = m == ninf ? 0.0f : m;
      double l = 0.0;
      double o = 0.0;
      for (int i = st.first * keys; i < st.last * keys; ++i) {
        const double p = std::exp2(double{s[static_cast<std::size_t>(i)]} - m_use);
        l += p;
        o += p * v[static_cast<std::size_t>(i)];
      }
      lse2.push_back(l > 0.0 ? static_cast<float>(m + std::log2(l)) : ninf);
      part.push_back(l > 0.0 ? static_cast<float>(o / l) : 0.0f);
    }
    float m_all = ninf;
    for (const float x : lse2) m_all = detail::fa2_merge_max(m_all, x);
    const float m_ref = m_all == ninf ? 0.0f : m_all;
    double wsum = 0.0;
    double acc = 0.0;
    for (std::size_t i = 0; i < lse2.size(); ++i) {
      const double wt = std::exp2(double{lse2[i]} - m_ref);
      wsum += wt;
      acc += wt * part[i];
    }
    double full_m = -1e300;
    for (int i = 0; i < visible; ++i)
      full_m = std::max(full_m, double{s[static_cast<std::size_t>(i)]});
    double full_l = 0.0;
    double full_o = 0.0;
    for (int i = 0; i < visible; ++i) {
      const double p = std::exp2(s[static_cast<std::size_t>(i)] - full_m);
      full_l += p;
      full_o += p * v[static_cast<std::size_t>(i)];
    }
    EXPECT_NEAR(acc / wsum, full_o / full_l, 1e-5) << "trial " << trial;
    EXPECT_NEAR(m_ref + std::log2(wsum), full_m + std::log2(full_l), 1e-5) << "trial " << trial;
  }
}

TEST(ExtendFa2Layout, WorkItemsAreABijectionHeaviestTileFirst) {
  for (const int tiles : {1, 2, 5, 9}) {
    for (const int splits : {1, 2, 4}) {
      std::set<std::pair<int, int>> seen;
      int previous_kv_end = 1 << 30;
      for (int z = 0; z < tiles * splits; ++z) {
        const detail::Fa2WorkItem it = detail::fa2_work_item(z, tiles, splits);
        ASSERT_GE(it.tile, 0);
        ASSERT_LT(it.tile, tiles);
        ASSERT_LT(it.split, splits);
        seen.insert({it.tile, it.split});
        const detail::ExtendTileGeometry g =
            detail::extend_tile_geometry(tiles * 64, 500, 2, 0, it.tile, 128);
        EXPECT_LE(g.kv_end, previous_kv_end) << "heavier tiles first";
        previous_kv_end = g.kv_end;
      }
      EXPECT_EQ(seen.size(), static_cast<std::size_t>(tiles * splits));
      EXPECT_LT(detail::fa2_work_item(tiles * splits, tiles, splits).tile, 0) << "idle z";
    }
  }
}

TEST(ExtendFa2Layout, PlannerSplitsOnlyUnderfilledGrids) {
  const std::int64_t target = 132 * 2 * detail::kFa2PlanWaves;
  EXPECT_EQ(detail::fa2_num_splits(target, 4, target, 16), 1);
  EXPECT_EQ(detail::fa2_num_splits(10 * target, 4, target, 16), 1);
  // A heavily cached prompt: one query tile x 8 KV heads x 1 sequence.
  const int s = detail::fa2_num_splits(8, 1, target, 16);
  EXPECT_EQ(s, 16);
  for (const std::int64_t ctas : {1, 7, 33, 100, 263}) {
    const int n = detail::fa2_num_splits(ctas, 1, target, 64);
    if (n < 64) {
      EXPECT_GE(ctas * n, target) << ctas;  // fills the target (unless capped)
    }
    EXPECT_LT(ctas * (n - 1), target) << ctas;  // and not more than needed
  }
  EXPECT_LE(detail::fa2_num_splits(100, 60000, 1 << 30, 16) * 60000, 65535);
  EXPECT_EQ(detail::fa2_warps(64, 1), 2);
  EXPECT_EQ(detail::fa2_warps(16, 4), 2);
  EXPECT_EQ(detail::fa2_warps(65, 1), 4);
  EXPECT_EQ(detail::fa2_workspace_bytes(2, 10, 8, 128, 1), 0u);
  EXPECT_EQ(detail::fa2_workspace_bytes(2, 10, 8, 128, 4), 2u * 10 * 8 * 4 * (128 * 4 + 4));
  EXPECT_EQ(detail::fa2_state(1, 2, 3, 1, 10, 8, 4), ((1 * 10 + 2) * 8 + 3) * 4 + 1);
}

#ifdef PAGEDKV_KERNEL_RESOURCES_SCRIPT
// scripts/kernel-resources computes the variant's occupancy with its dynamic shared memory, which
// ptxas does not report: its DYNAMIC_SMEM line must hold the header's sizes.
TEST(ExtendFa2Layout, KernelResourcesScriptKnowsTheSharedMemory) {
  std::ifstream in(PAGEDKV_KERNEL_RESOURCES_SCRIPT);
  ASSERT_TRUE(in) << PAGEDKV_KERNEL_RESOURCES_SCRIPT;
  std::stringstream text;
  text << in.rdbuf();
  std::ostringstream want;
  want << "\"fa2_extend_kernel\": {(64, 4): " << detail::Fa2Shape<64, 4>::kSmemBytes
       << ", (64, 2): " << detail::Fa2Shape<64, 2>::kSmemBytes
       << ", (128, 4): " << detail::Fa2Shape<128, 4>::kSmemBytes
       << ", (128, 2): " << detail::Fa2Shape<128, 2>::kSmemBytes
       << ", (256, 4): " << detail::Fa2Shape<256, 4>::kSmemBytes
       << ", (256, 2): " << detail::Fa2Shape<256, 2>::kSmemBytes << "}";
  EXPECT_NE(text.str().find(want.str()), std::string::npos) << "missing: " << want.str();
}
#endif

}  // namespace
}  // namespace pagedkv
