// The work list of the persistent warp-specialized extend kernel
// (kernels/internal/extend_persistent_schedule.hpp, ExtendKernel::kWgmmaWarpSpecializedPersistent),
// on the host: item i is the cell the hardware would have started i-th in the non-persistent grid
// (x = KV head fastest, then sequence, then z = query tile x split), every cell exactly once; for
// alike sequences the items come heaviest first (z = 0 is each sequence's last query tile, the one
// with the most keys), so CTAs drawing them in order schedule greedily longest-first; and the
// launch's CTA count.
#include "internal/extend_persistent_schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <queue>
#include <set>
#include <tuple>
#include <vector>

#include "internal/extend_attention_tiles.hpp"
#include "internal/extend_fa2_layout.hpp"

namespace pagedkv {
namespace {

using detail::PersistentCell;
using detail::PersistentGridShape;

TEST(ExtendPersistentSchedule, ItemsAreTheGridsCellsInLaunchOrder) {
  for (const PersistentGridShape g :
       {PersistentGridShape{1, 1, 1}, PersistentGridShape{8, 3, 5}, PersistentGridShape{3, 7, 2},
        PersistentGridShape{2, 1, 64}, PersistentGridShape{32, 4, 1}}) {
    ASSERT_EQ(detail::persistent_items(g), std::int64_t{g.kv_heads} * g.seqs * g.z);
    std::set<std::tuple<int, int, int>> seen;
    std::int64_t i = 0;
    for (int z = 0; z < g.z; ++z) {
      for (int y = 0; y < g.seqs; ++y) {
        for (int x = 0; x < g.kv_heads; ++x, ++i) {
          const PersistentCell c = detail::persistent_item_cell(g, i);
          EXPECT_EQ(c.x, x) << "item " << i;
          EXPECT_EQ(c.y, y) << "item " << i;
          EXPECT_EQ(c.z, z) << "item " << i;
          seen.insert({c.x, c.y, c.z});
        }
      }
    }
    EXPECT_EQ(static_cast<std::int64_t>(seen.size()), detail::persistent_items(g));
  }
  // The largest grid the launch allows: 65,535 sequences x 65,535 z, many KV heads (64-bit items).
  const PersistentGridShape big{64, 65535, 65535};
  const std::int64_t last = detail::persistent_items(big) - 1;
  EXPECT_GT(last, std::int64_t{1} << 32);
  const PersistentCell c = detail::persistent_item_cell(big, last);
  EXPECT_EQ(c.x, 63);
  EXPECT_EQ(c.y, 65534);
  EXPECT_EQ(c.z, 65534);
}

// The key tiles a cell covers, by the function the kernel's cell_work calls
// (kernels/internal/extend_wgmma_grid.cuh), 128-row query tiles x 64-key tiles; -1 for a cell with
// nothing to do.
int cell_key_tiles(int q_len, int prefix, int group, int window, int num_splits, int z) {
  detail::Fa2CellWork cell{};
  if (!detail::fa2_cell_work(q_len, prefix, group, window, num_splits, z, 128, 64, cell)) {
    return -1;
  }
  return cell.split.last - cell.split.first;
}

// Alike sequences: the work of the items in order never grows (with splits: the work of each
// query tile, its splits adjacent), so the CTAs take the heaviest first.
TEST(ExtendPersistentSchedule, AlikeSequencesComeHeaviestFirst) {
  struct Case {
    int q_len, prefix, group, window, splits, seqs, heads;
  };
  for (const Case& k : {Case{8192, 0, 4, 0, 1, 2, 8}, Case{4096, 4096, 4, 0, 1, 1, 8},
                        Case{1000, 37, 8, 0, 1, 3, 2}, Case{2048, 6000, 1, 0, 3, 2, 2},
                        Case{3000, 0, 4, 700, 1, 2, 4}}) {
    const int tiles = detail::extend_num_tiles(k.q_len, k.group, 128);
    const PersistentGridShape g{k.heads, k.seqs, tiles * k.splits};
    int previous_tile_work = 1 << 30;
    int tile_work = 0;
    for (std::int64_t i = 0; i < detail::persistent_items(g); ++i) {
      const PersistentCell c = detail::persistent_item_cell(g, i);
      const int w = cell_key_tiles(k.q_len, k.prefix, k.group, k.window, k.splits, c.z);
      if (c.x == 0 && c.y == 0) {
        // A new query tile's first split (each z is one (tile, split)): compare whole tiles.
        if (c.z % k.splits == 0 && c.z > 0) {
          EXPECT_LE(tile_work, previous_tile_work) << "query tile ending at z " << c.z - 1;
          previous_tile_work = tile_work;
          tile_work = 0;
        }
        tile_work += std::max(w, 0);
      }
      if (k.splits == 1) {
        const PersistentCell prev =
            detail::persistent_item_cell(g, std::max<std::int64_t>(i - 1, 0));
        EXPECT_LE(w, cell_key_tiles(k.q_len, k.prefix, k.group, k.window, 1, prev.z)) << i;
      }
    }
  }
}

// Greedy CTAs drawing the items in order (each takes the next when it finishes; an item costs
// its key tiles plus one for its prologue and epilogue): within Graham's bound of the busiest
// CTA <= total / CTAs + largest item, and no longer than drawing the same items lightest first.
std::int64_t greedy_makespan(const std::vector<int>& work, int ctas) {
  std::priority_queue<std::int64_t, std::vector<std::int64_t>, std::greater<>> free_at;
  for (int c = 0; c < ctas; ++c) free_at.push(0);
  std::int64_t end = 0;
  for (const int w : work) {
    const std::int64_t t = free_at.top() + w;
    free_at.pop();
    free_at.push(t);
    end = std::max(end, t);
  }
  return end;
}

TEST(ExtendPersistentSchedule, GreedyLongestFirstBalancesACausalPrompt) {
  // One 8k-token prompt, group 4, 8 KV heads, on 132 CTAs: 256 query tiles per KV head.
  const int q_len = 8192;
  const int group = 4;
  const PersistentGridShape g{8, 1, detail::extend_num_tiles(q_len, group, 128)};
  std::vector<int> work;
  for (std::int64_t i = 0; i < detail::persistent_items(g); ++i) {
    const PersistentCell c = detail::persistent_item_cell(g, i);
    const int w = cell_key_tiles(q_len, 0, group, 0, 1, c.z);
    ASSERT_GE(w, 1);
    work.push_back(w + 1);
  }
  const std::int64_t total = std::accumulate(work.begin(), work.end(), std::int64_t{0});
  const int largest = *std::max_element(work.begin(), work.end());
  const std::int64_t ours = greedy_makespan(work, 132);
  EXPECT_LE(ours, total / 132 + largest);
  std::vector<int> lightest_first = work;
  std::reverse(lightest_first.begin(), lightest_first.end());
  EXPECT_LT(ours, greedy_makespan(lightest_first, 132));
  // Close to the ideal: within 3% of an even share.
  EXPECT_LE(static_cast<double>(ours), 1.03 * static_cast<double>(total) / 132.0);
}

TEST(ExtendPersistentSchedule, LaunchCtas) {
  EXPECT_EQ(detail::persistent_grid_ctas(1000, 132), 132);
  EXPECT_EQ(detail::persistent_grid_ctas(5, 132), 5);
  EXPECT_EQ(detail::persistent_grid_ctas(132, 132), 132);
  EXPECT_EQ(detail::persistent_grid_ctas(0, 132), 1);
  EXPECT_EQ(detail::persistent_grid_ctas(7, 0), 1);
  // The counter's bytes keep the split partials after it 16-byte aligned.
  EXPECT_EQ(detail::kPersistentCounterBytes % 16, 0);
  EXPECT_GE(detail::kPersistentCounterBytes, 8);
}

}  // namespace
}  // namespace pagedkv
