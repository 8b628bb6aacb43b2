// BlockIndex against a brute-force model under random operations, and the router's score.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "pagedkv/base/error.hpp"
#include "pagedkv/events/block_index.hpp"
#include "pagedkv/events/router.hpp"

namespace pagedkv::events {
namespace {

TEST(BlockIndex, MatchesAModelUnderRandomOperations) {
  BlockIndex index;
  // (id, engine, tier) -> copies
  std::map<std::tuple<std::uint64_t, std::size_t, Tier>, int> model;
  std::mt19937_64 rng(7);
  constexpr std::size_t kEngines = 5;
  auto rand_id = [&] { return rng() % 3000 * 0x100000001ull; };  // clustered, collides often
  for (int step = 0; step < 200000; ++step) {
    const std::uint64_t id = rand_id();
    const std::size_t e = rng() % kEngines;
    const Tier t = rng() % 4 == 0 ? Tier::kCpu : Tier::kGpu;
    const int op = static_cast<int>(rng() % 100);
    if (op < 55) {
      index.add(id, e, t);
      ++model[{id, e, t}];
    } else if (op < 99) {
      index.remove(id, e, t);
      auto it = model.find({id, e, t});
      if (it != model.end() && --it->second == 0) model.erase(it);
    } else if (op == 99 && step % 2 == 0) {
      index.clear_engine(e);
      std::erase_if(model, [&](const auto& kv) { return std::get<1>(kv.first) == e; });
    } else {
      // A clear in small steps, with the index resized (or shrunk) as a KVIndexer does; the next
      // add or remove of the engine finishes it.
      if (!index.clear_engine_some(e, 1 + rng() % 8)) (void)index.clear_engine_some(e, 3);
      std::erase_if(model, [&](const auto& kv) { return std::get<1>(kv.first) == e; });
    }
    if (step % 97 == 0) {
      const std::size_t adds = rng() % 3 == 0 ? rng() % 5000 : 0;
      if (index.resize_needed(e, adds)) index.adopt(index.plan_resize(e, adds));
    }
  }
  // Finishes any clear left in steps (an operation on the engine does).
  for (std::size_t e = 0; e < kEngines; ++e) index.remove(1, e, Tier::kGpu);
  std::size_t entries = 0;
  for (std::size_t e = 0; e < kEngines; ++e) {
    for (Tier t : {Tier::kGpu, Tier::kCpu}) {
      std::vector<std::uint64_t> want;
      for (const auto& [k, n] : model) {
        if (std::get<1>(k) == e && std::get<2>(k) == t) want.push_back(std::get<0>(k));
      }
      std::sort(want.begin(), want.end());
      EXPECT_EQ(index.engine_ids(e, t), want);
      entries += want.size();
    }
  }
  EXPECT_EQ(index.num_entries(), entries);
  // Every id's masks agree with the model.
  for (std::uint64_t k = 0; k < 3000; ++k) {
    const std::uint64_t id = k * 0x100000001ull;
    std::uint32_t gpu = 0, cpu = 0;
    for (std::size_t e = 0; e < kEngines; ++e) {
      if (model.count({id, e, Tier::kGpu})) gpu |= 1u << e;
      if (model.count({id, e, Tier::kCpu})) cpu |= 1u << e;
    }
    const auto m = index.find(id);
    ASSERT_EQ(m.gpu, gpu) << id;
    ASSERT_EQ(m.cpu, cpu) << id;
  }
}

TEST(BlockIndex, LongestPrefixesPerEngineAndMedium) {
  BlockIndex index;
  const std::vector<std::uint64_t> ids{11, 12, 13, 14};
  index.add(11, 0, Tier::kGpu);
  index.add(12, 0, Tier::kGpu);
  index.add(13, 0, Tier::kCpu);  // engine 0: 2 on GPU, then a third block on CPU
  index.add(11, 1, Tier::kGpu);
  index.add(13, 1, Tier::kGpu);                               // engine 1: hole at 12 -> prefix 1
  for (std::uint64_t id : ids) index.add(id, 2, Tier::kGpu);  // engine 2: everything
  index.add(12, 3, Tier::kGpu);                               // engine 3: not block 0 -> 0
  std::vector<PrefixMatch> out(5);
  index.longest_prefixes(ids, out);
  EXPECT_EQ(out[0].prefix_blocks, 3u);
  EXPECT_EQ(out[0].gpu_prefix_blocks, 2u);
  EXPECT_EQ(out[1].prefix_blocks, 1u);
  EXPECT_EQ(out[1].gpu_prefix_blocks, 1u);
  EXPECT_EQ(out[2].prefix_blocks, 4u);
  EXPECT_EQ(out[2].gpu_prefix_blocks, 4u);
  EXPECT_EQ(out[3].prefix_blocks, 0u);
  EXPECT_EQ(out[4].prefix_blocks, 0u);
  EXPECT_THROW(index.add(1, BlockIndex::kMaxEngines, Tier::kGpu), Error);
}

TEST(BlockIndex, DuplicateCopiesLeaveWithTheLastOne) {
  BlockIndex index;
  index.add(5, 0, Tier::kGpu);
  index.add(5, 0, Tier::kGpu);
  index.remove(5, 0, Tier::kGpu);
  EXPECT_EQ(index.find(5).gpu, 1u);
  index.remove(5, 0, Tier::kGpu);
  EXPECT_EQ(index.find(5).gpu, 0u);
  index.remove(5, 0, Tier::kGpu);  // absent: no-op
  EXPECT_EQ(index.num_ids(), 0u);
}

TEST(BlockIndex, PerEngineCountsAndIdZero) {
  BlockIndex index;
  index.add(0, 3, Tier::kGpu);  // id 0 is a valid id (the engine's set keeps it aside)
  index.add(0, 3, Tier::kCpu);
  index.add(7, 3, Tier::kCpu);
  index.add(7, 4, Tier::kGpu);
  EXPECT_EQ(index.engine_entries(3, Tier::kGpu), 1u);
  EXPECT_EQ(index.engine_entries(3, Tier::kCpu), 2u);
  EXPECT_EQ(index.engine_ids(3, Tier::kCpu), (std::vector<std::uint64_t>{0, 7}));
  index.clear_engine(3);
  EXPECT_EQ(index.find(0).gpu, 0u);
  EXPECT_EQ(index.find(7).cpu, 0u);
  EXPECT_EQ(index.find(7).gpu, 1u << 4);
  EXPECT_EQ(index.num_entries(), 1u);
  EXPECT_EQ(index.engine_entries(3, Tier::kCpu), 0u);
}

// Issue 41: the table's memory comes back when entries go (before, a table only ever grew).
TEST(BlockIndex, MemoryShrinksWhenEntriesGo) {
  BlockIndex index;
  for (std::uint64_t id = 1; id <= 100; ++id) index.add(id * 977, 0, Tier::kGpu);
  const std::size_t small = index.memory_bytes();
  for (std::uint64_t id = 1; id <= 200000; ++id) index.add(id * 7919, 1, Tier::kGpu);
  const std::size_t big = index.memory_bytes();
  EXPECT_GT(big, 20 * small);
  index.clear_engine(1);
  EXPECT_LE(index.memory_bytes(), 2 * small) << "after the clear: " << index.memory_bytes();
  // Removals one by one: the caller resizes between steps (as KVIndexer does after a batch).
  for (std::uint64_t id = 1; id <= 200000; ++id) index.add(id * 7919, 1, Tier::kGpu);
  for (std::uint64_t id = 1; id <= 200000; ++id) index.remove(id * 7919, 1, Tier::kGpu);
  ASSERT_TRUE(index.resize_needed(1, 0));
  index.adopt(index.plan_resize(1, 0));
  EXPECT_LE(index.memory_bytes(), 2 * small);
  EXPECT_EQ(index.engine_ids(0, Tier::kGpu).size(), 100u);
  for (std::uint64_t id = 1; id <= 100; ++id) EXPECT_EQ(index.find(id * 977).gpu, 1u);
  // Hysteresis: at the size just resized to, a few adds and removes resize nothing.
  EXPECT_FALSE(index.resize_needed(0, 0));
  EXPECT_FALSE(index.resize_needed(0, 10));
  // A plan made before a change is not installed.
  BlockIndex::Resize stale = index.plan_resize(0, 100000);
  index.add(5, 0, Tier::kGpu);
  const std::size_t now = index.memory_bytes();
  index.adopt(std::move(stale));
  EXPECT_EQ(index.memory_bytes(), now);
  EXPECT_EQ(index.find(5).gpu, 1u);
}

// Ids chosen so that id * 0x9E3779B97F4A7C15 (the unkeyed slot hash this table once used) are
// consecutive numbers: they all had one home slot, one probe run as long as the table held them
// (an honest engine's lookup waited for the run). With the keyed mix they spread like random ids.
std::vector<std::uint64_t> ids_colliding_under_the_unkeyed_hash(std::size_t n) {
  const std::uint64_t c = 0x9E3779B97F4A7C15ull;
  std::uint64_t inv = c;  // c^-1 mod 2^64 (Newton's iteration)
  for (int i = 0; i < 6; ++i) inv *= 2 - c * inv;
  std::vector<std::uint64_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = inv * (0x4000000000000000ull + i);
  return ids;
}

TEST(BlockIndex, CraftedIdsDoNotShareOneProbeRun) {
  const auto ids = ids_colliding_under_the_unkeyed_hash(20000);
  for (const std::uint64_t key : {std::uint64_t{0}, std::uint64_t{12345}, ~std::uint64_t{0}}) {
    BlockIndex index(key);
    for (const std::uint64_t id : ids) index.add(id, 1, Tier::kGpu);
    // Random ids at a load of at most 0.7 give runs of tens of slots; the unkeyed hash gave 20000.
    EXPECT_LT(index.max_probe_length(), 200u) << "key " << key;
    EXPECT_EQ(index.engine_entries(1, Tier::kGpu), ids.size());
    for (const std::uint64_t id : ids) index.remove(id, 1, Tier::kGpu);
    EXPECT_EQ(index.num_ids(), 0u);
  }
  BlockIndex random_key;  // the default: a key from std::random_device
  for (const std::uint64_t id : ids) random_key.add(id, 0, Tier::kGpu);
  EXPECT_LT(random_key.max_probe_length(), 200u);
}

TEST(BlockIndex, MaxProbeLengthCountsARun) {
  BlockIndex index(7);
  EXPECT_EQ(index.max_probe_length(), 0u);
  index.add(42, 0, Tier::kGpu);
  EXPECT_EQ(index.max_probe_length(), 1u);
}

TEST(KVRouter, ScorePrefersLongerGpuPrefixThenLoadThenRotates) {
  KVIndexer indexer;
  KVRouter router(indexer, {.prefix_weight = 1.0, .cpu_weight = 0.5, .load_weight = 0.5});
  // 10 blocks: engine 0 holds 8 on CPU (score 0.4), engine 1 holds 5 on GPU (0.5).
  std::vector<PrefixMatch> m{{8, 0}, {5, 5}, {0, 0}};
  const std::vector<double> idle{0, 0, 0};
  std::vector<double> scores;
  EXPECT_EQ(router.pick(m, 10, idle, &scores), 1u);
  EXPECT_DOUBLE_EQ(scores[0], 0.4);
  EXPECT_DOUBLE_EQ(scores[1], 0.5);
  // Load: engine 1 at the maximum load loses 0.5 and falls behind engine 0.
  EXPECT_EQ(router.pick(m, 10, std::vector<double>{0, 4, 0}), 0u);
  // No cache anywhere, equal loads: round-robin over the engines.
  const std::vector<PrefixMatch> none(3);
  std::set<EngineId> seen;
  for (int i = 0; i < 3; ++i) seen.insert(router.pick(none, 10, idle));
  EXPECT_EQ(seen.size(), 3u);
  // No cache, unequal loads: the least loaded.
  EXPECT_EQ(router.pick(none, 10, std::vector<double>{3, 1, 2}), 1u);
  EXPECT_THROW(router.pick(m, 10, std::vector<double>{0}), Error);
}

// Before: a match with gpu_prefix_blocks > prefix_blocks wrapped the 32-bit difference (the engine
// scored ~2^31 blocks of CPU credit and won), and NaN or infinite loads were accepted.
TEST(KVRouter, PickRefusesInconsistentMatchesAndNonFiniteLoads) {
  KVIndexer indexer;
  KVRouter router(indexer);
  const std::vector<double> idle{0, 0};
  auto code_of = [&](std::span<const PrefixMatch> m, std::span<const double> loads) {
    try {
      (void)router.pick(m, 10, loads);
    } catch (const Error& e) {
      return std::optional<ErrorCode>(e.code());
    }
    return std::optional<ErrorCode>();
  };
  const std::vector<PrefixMatch> bad{{2, 5}, {3, 3}};  // engine 0: 5 on GPU, 2 on any medium
  EXPECT_EQ(code_of(bad, idle), ErrorCode::kInvalidArgument);
  const std::vector<PrefixMatch> ok{{2, 2}, {3, 3}};
  for (const double load : {std::nan(""), std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(), -1.0}) {
    EXPECT_EQ(code_of(ok, std::vector<double>{0, load}), ErrorCode::kInvalidArgument) << load;
  }
  EXPECT_EQ(router.pick(ok, 10, idle), 1u);
}

}  // namespace
}  // namespace pagedkv::events
