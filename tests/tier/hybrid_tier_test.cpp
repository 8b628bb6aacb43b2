// The host tier with hybrid models (a sliding-window KV-cache group beside full attention):
// scenarios (every group offloaded and onboarded, a window group loads only its window at the
// hit, the window store rule, events and copies naming their group, misuse) and seeded episodes
// against a content reference independent of pagedkv's hashing: every GPU block and host slot
// holds a tag of (group, the exact token prefix it was computed for), copied as an executor
// would; after every admission each group must hold the right tag at every position the
// request's attention reads (full attention: all of them; a window: the window before the
// computed end). Hashers: sha256, xxh3_128 and weak (2-bit, colliding) sha256 / xxh3_128. Groups
// of different block sizes (16 and 32 tokens in the scenarios, hybrid_episode.hpp's layouts in
// the episodes): the hit a multiple of their LCM, each group's loads at its own block size, a
// failed load rolling back to the start of its block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "hybrid_episode.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/remote/disk_store.hpp"
#include "pagedkv/tier/remote_tier.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using hybrid_test::EpisodeResult;
using hybrid_test::host_config;
using hybrid_test::hybrid_config;
using hybrid_test::kBs;

std::vector<TokenId> tokens_of(std::uint32_t doc, std::size_t n) {
  std::vector<TokenId> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>(doc * 1000 + i);
  return t;
}

// Runs one request to completion with every copy done; returns its hit.
TieredCacheHit run_request(TieredKVCacheManager& t, RequestId id, const std::vector<TokenId>& p,
                           TierPlan* loads_out = nullptr) {
  Request r = t.make_request(id, p);
  TieredCacheHit hit = t.get_computed_blocks(r);
  auto a = t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
  if (!a) throw Error(ErrorCode::kInvalidState, "did not fit");
  t.commit(a->transfers.eviction_ids, true);
  t.commit(a->transfers.load_ids, true);
  if (loads_out != nullptr) *loads_out = a->transfers;
  std::vector<TransferId> stores = a->transfers.store_ids;
  if (t.has_unfinished_loads(r.id())) {
    LoadResult lr = t.finish_loads(r);
    stores.insert(stores.end(), lr.transfers.store_ids.begin(), lr.transfers.store_ids.end());
  }
  r.set_num_computed_tokens(r.num_tokens());
  t.commit(stores, true);
  t.free(r);
  t.check_invariants();
  return hit;
}

TEST(HybridTier, ConstructsForSlidingWindowBesideFullAttention) {
  TieredKVCacheManager t(hybrid_config(64, 9, 0), host_config(64, HostPolicy::kWriteBack));
  EXPECT_EQ(t.gpu().num_groups(), 2u);
  EXPECT_EQ(t.group_stats().size(), 2u);
}

TEST(HybridTier, RefusesBadByteCountsAndBlockSizesTheGpuManagerRefuses) {
  HostTierConfig h = host_config(64, HostPolicy::kWriteBack);
  h.group_bytes_per_block = {1, 2, 3};
  EXPECT_THROW(TieredKVCacheManager(hybrid_config(64, 9, 0), h), Error);
  KVCacheManagerConfig c = hybrid_config(64, 9, 0);
  c.groups[1] = AttentionSpec::sliding(kBs + kBs / 2, 9);  // not a multiple of the smallest
  EXPECT_THROW(TieredKVCacheManager(c, host_config(64, HostPolicy::kWriteBack)), Error);
}

// ---- Groups of different block sizes ----

// Full attention at 16 tokens beside a window group at 32 (window_blocks 2), as a model whose
// window layers use larger blocks; group bytes 1000 and 2000 (vLLM's equal page bytes would make
// them equal; the tier only counts them).
KVCacheManagerConfig sizes_config(std::int32_t num_blocks, int hashing,
                                  std::uint32_t window = 2 * 32 + 1) {
  KVCacheManagerConfig c = hybrid_config(num_blocks, window, hashing);
  c.groups = {AttentionSpec::full(16), AttentionSpec::sliding(32, window)};
  return c;
}

HostTierConfig sizes_host(std::int32_t slots, HostPolicy policy) {
  HostTierConfig h = host_config(slots, policy, WindowStoreRule::kAll);
  h.group_bytes_per_block = {1000, 2000};
  return h;
}

TEST(HybridTier, ConstructsForGroupsOfDifferentBlockSizes) {
  TieredKVCacheManager t(sizes_config(64, 0), sizes_host(64, HostPolicy::kWriteBack));
  EXPECT_EQ(t.gpu().num_groups(), 2u);
  EXPECT_EQ(t.block_size(), 16u);  // requests are hashed at the smallest
  EXPECT_EQ(t.gpu().group_spec(1).block_size, 32u);
}

// Request A is evicted from a small GPU pool into the host; A again: the hit is a multiple of 32
// (the LCM), group 0 loads every 16-token block of it, the window group only the 32-token blocks
// of its window at the hit's end.
void sizes_scenario(int hashing, HostPolicy policy, std::size_t first_tokens,
                    std::size_t prompt_tokens, std::size_t expect_host_tokens) {
  SCOPED_TRACE("hashing " + std::to_string(hashing) + " policy " + std::string(to_string(policy)) +
               " prompt " + std::to_string(prompt_tokens));
  TieredKVCacheManager t(sizes_config(48, hashing), sizes_host(512, policy));
  const std::vector<TokenId> a = tokens_of(1, first_tokens);
  run_request(t, 1, a);
  for (std::uint32_t d = 2; d < 8; ++d) run_request(t, d, tokens_of(d, first_tokens));
  TierPlan plan;
  const TieredCacheHit hit = run_request(t, 100, tokens_of(1, prompt_tokens), &plan);
  EXPECT_EQ(hit.gpu.num_tokens, 0u);
  ASSERT_EQ(hit.num_host_tokens, expect_host_tokens);
  ASSERT_EQ(hit.host_slots.size(), expect_host_tokens / 16);
  ASSERT_EQ(hit.host_other_groups.size(), 1u);
  const std::vector<BlockId>& window_row = hit.host_other_groups[0];
  ASSERT_EQ(window_row.size(), expect_host_tokens / 32);
  for (std::size_t i = 0; i < window_row.size(); ++i) {
    EXPECT_EQ(window_row[i] != 0, i + 2 >= window_row.size()) << "window block " << i;
  }
  std::size_t group0 = 0, group1 = 0;
  for (const BlockCopy& c : plan.plan.loads) (c.group == 0 ? group0 : group1) += 1;
  EXPECT_EQ(group0, expect_host_tokens / 16);
  EXPECT_EQ(group1, 2u);
  const std::vector<TierGroupStats> gs = t.group_stats();
  EXPECT_EQ(gs[0].loaded_blocks, expect_host_tokens / 16);
  EXPECT_EQ(gs[1].loaded_blocks, 2u);
  EXPECT_EQ(gs[0].loaded_bytes, expect_host_tokens / 16 * 1000);
  EXPECT_EQ(gs[1].loaded_bytes, 2u * 2000);
  EXPECT_EQ(t.stats().loaded_bytes, expect_host_tokens / 16 * 1000 + 2u * 2000);
}

TEST(HybridTier, DifferentBlockSizesLoadEachGroupAtItsBlockSize) {
  for (int hashing = 0; hashing < 4; ++hashing) {
    for (const HostPolicy policy : {HostPolicy::kWriteBack, HostPolicy::kWriteThrough}) {
      // 322 tokens: at most 321 hit, 20 blocks of 16 = 10 of 32.
      sizes_scenario(hashing, policy, 10 * 32 + 2, 10 * 32 + 2, 320);
      // The first 146 of those tokens (all their blocks in the host): at most 145, 9 blocks of 16
      // (144 tokens), clamped to the LCM: 128.
      sizes_scenario(hashing, policy, 10 * 32 + 2, 9 * 16 + 2, 128);
    }
  }
}

// Host events of groups of different block sizes: each group's CPU BlockStored events carry its
// block size, its tokens per block and the GPU's keys of that group (an indexer sees one key per
// (group, block) in both tiers).
TEST(HybridTier, DifferentBlockSizesHostEventsCarryTheGroupsBlockSize) {
  KVCacheManagerConfig c = sizes_config(48, 0);
  c.enable_kv_events = true;
  TieredKVCacheManager t(c, sizes_host(256, HostPolicy::kWriteThrough));
  run_request(t, 1, tokens_of(1, 4 * 32 + 1));
  std::map<int, std::vector<BlockHash>> gpu_keys, cpu_keys;
  for (const KVEvent& e : t.take_events()) {
    const auto* st = std::get_if<BlockStored>(&e.data);
    if (st == nullptr) continue;
    const std::uint32_t bs = st->group_id == 0 ? 16 : 32;
    EXPECT_EQ(st->block_size, bs) << st->medium << " group " << int{st->group_id};
    EXPECT_EQ(st->token_ids.size(), st->block_hashes.size() * bs);
    auto& keys = (st->medium == "CPU" ? cpu_keys : gpu_keys)[st->group_id];
    keys.insert(keys.end(), st->block_hashes.begin(), st->block_hashes.end());
  }
  EXPECT_EQ(cpu_keys[0].size(), 8u);  // 128 tokens: 8 blocks of 16
  EXPECT_EQ(cpu_keys[1].size(), 4u);  // 4 of 32
  for (int g = 0; g < 2; ++g) {
    std::vector<BlockHash> gpu = gpu_keys[g], cpu = cpu_keys[g];
    std::sort(gpu.begin(), gpu.end());
    std::sort(cpu.begin(), cpu.end());
    EXPECT_EQ(gpu, cpu) << "group " << g;
  }
}

// A hit changed by hand to a length that is not a multiple of the LCM (32), or whose window row
// is not at the window group's block size, is refused with nothing changed.
TEST(HybridTier, DifferentBlockSizesRefuseAHitOffTheLcm) {
  TieredKVCacheManager t(sizes_config(48, 0), sizes_host(512, HostPolicy::kWriteBack));
  const std::vector<TokenId> a = tokens_of(1, 10 * 32 + 2);
  run_request(t, 1, a);
  for (std::uint32_t d = 2; d < 8; ++d) run_request(t, d, tokens_of(d, 10 * 32 + 2));
  Request r = t.make_request(100, a);
  const TieredCacheHit hit = t.get_computed_blocks(r);
  ASSERT_EQ(hit.num_host_tokens, 320u);
  const TieredSnapshot before = t.snapshot();
  TieredCacheHit odd = hit;  // 19 blocks of 16: 304 tokens
  odd.host_slots.pop_back();
  odd.num_host_tokens -= 16;
  try {
    (void)t.allocate_slots(r, r.num_tokens() - odd.num_tokens(), odd);
    ADD_FAILURE() << "a hit of 304 tokens was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LCM"), std::string::npos) << e.what();
  }
  TieredCacheHit rows = hit;  // the window row one block short
  rows.host_other_groups[0].pop_back();
  EXPECT_THROW((void)t.allocate_slots(r, r.num_tokens() - rows.num_tokens(), rows), Error);
  EXPECT_EQ(t.snapshot(), before);
  t.check_invariants();
  ASSERT_TRUE(t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit).has_value());
}

// A failed load rolls back to the start of the failed block, in tokens: the start of a 32-token
// block of the window group (whose window covers the whole hit, so every block of it loads), or
// of a 16-token block of group 0 in the middle of a 32-token block; the request is recomputed from
// there, and a later request hits the whole prefix again.
void sizes_rollback(int hashing, std::int32_t fail_group, std::size_t fail_block,
                    std::size_t expect_tokens) {
  SCOPED_TRACE("hashing " + std::to_string(hashing) + " group " + std::to_string(fail_group) +
               " block " + std::to_string(fail_block));
  TieredKVCacheManager t(sizes_config(64, hashing, 1000),
                         sizes_host(512, HostPolicy::kWriteThrough));
  const std::vector<TokenId> a = tokens_of(1, 8 * 32 + 1);
  run_request(t, 1, a);
  for (std::uint32_t d = 2; d < 6; ++d) run_request(t, d, tokens_of(d, 8 * 32 + 1));
  Request r = t.make_request(100, a);
  const TieredCacheHit hit = t.get_computed_blocks(r);
  ASSERT_EQ(hit.gpu.num_tokens, 0u);
  ASSERT_EQ(hit.num_host_tokens, 8u * 32);
  auto al = t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
  ASSERT_TRUE(al.has_value());
  const TierPlan& plan = al->transfers;
  ASSERT_EQ(plan.plan.loads.size(), 16u + 8u);  // every block of both groups
  // Group 0's loads come first, then group 1's, each in block order.
  for (std::size_t k = 0; k < plan.plan.loads.size(); ++k) {
    const BlockCopy& c = plan.plan.loads[k];
    const std::size_t block = c.group == 0 ? k : k - 16;
    t.commit(plan.load_ids[k], !(c.group == fail_group && block == fail_block));
  }
  LoadResult lr = t.finish_loads(r);
  EXPECT_TRUE(lr.rolled_back);
  EXPECT_EQ(lr.num_computed_tokens, expect_tokens);
  t.check_invariants();
  EXPECT_EQ(t.stats().rollbacks, 1u);
  // The GPU caches what landed up to there: a probe's GPU hit is that, clamped to the LCM (32).
  Request probe = t.make_request(101, a);
  EXPECT_EQ(t.get_computed_blocks(probe).gpu.num_tokens, expect_tokens / 32 * 32);
  // The engine recomputes from there in the blocks it holds; then everything is hit-able.
  r.set_num_computed_tokens(lr.num_computed_tokens);
  auto again = t.allocate_slots(r, r.num_tokens() - lr.num_computed_tokens);
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->new_blocks.empty());  // the blocks are held already
  EXPECT_TRUE(again->transfers.plan.loads.empty());
  r.set_num_computed_tokens(r.num_tokens());
  std::vector<TransferId> stores = plan.store_ids;
  stores.insert(stores.end(), lr.transfers.store_ids.begin(), lr.transfers.store_ids.end());
  stores.insert(stores.end(), again->transfers.store_ids.begin(), again->transfers.store_ids.end());
  t.commit(stores, true);
  t.free(r);
  t.check_invariants();
  const TieredCacheHit whole = t.get_computed_blocks(probe);
  EXPECT_EQ(whole.num_tokens(), 8u * 32);
}

TEST(HybridTier, DifferentBlockSizesRollBackToTheFailedBlocksStart) {
  for (int hashing = 0; hashing < 4; ++hashing) {
    sizes_rollback(hashing, 1, 2, 64);  // window group's block 2: tokens 64..95
    sizes_rollback(hashing, 0, 5, 80);  // group 0's block 5: tokens 80..95, inside a 32-block
    sizes_rollback(hashing, 0, 0, 0);
  }
}

// Seeded episodes of hybrid_episode.hpp's layouts of different block sizes: every hashing and
// policy, checked against the content reference.
TEST(HybridTier, DifferentBlockSizeEpisodesNeverHitWrongContent) {
  EpisodeResult total;
  for (int layout = 1; layout < hybrid_test::kLayouts; ++layout) {
    for (int hashing = 0; hashing < 4; ++hashing) {
      for (const HostPolicy policy : {HostPolicy::kWriteBack, HostPolicy::kWriteThrough,
                                      HostPolicy::kWriteThroughSelective}) {
        for (std::uint64_t seed = 1; seed <= 8; ++seed) {
          try {
            std::mt19937_64 rng(seed * 16 + static_cast<std::uint64_t>(layout));
            const EpisodeResult r =
                hybrid_test::run_hybrid_episode(rng, seed, hashing, policy, 60, layout);
            total.host_hit_tokens += r.host_hit_tokens;
            total.loads += r.loads;
            total.rollbacks += r.rollbacks;
          } catch (const std::exception& e) {
            ADD_FAILURE() << "layout " << layout << " hashing " << hashing << " "
                          << to_string(policy) << " seed " << seed << ": " << e.what();
            return;
          }
        }
      }
    }
  }
  std::printf("different block sizes: %llu host hit tokens, %llu loads, %llu rollbacks\n",
              static_cast<unsigned long long>(total.host_hit_tokens),
              static_cast<unsigned long long>(total.loads),
              static_cast<unsigned long long>(total.rollbacks));
  EXPECT_GT(total.host_hit_tokens, 1000u);
  EXPECT_GT(total.rollbacks, 10u);
}

TEST(HybridTier, HostEventsAndSlotsAreKeyedByGroup) {
  KVCacheManagerConfig c = hybrid_config(24, 2 * kBs + 1, 0);
  c.enable_kv_events = true;
  TieredKVCacheManager t(c, host_config(256, HostPolicy::kWriteThrough, WindowStoreRule::kAll));
  run_request(t, 1, tokens_of(1, 4 * kBs + 1));
  std::map<int, std::size_t> cpu_blocks_per_group;
  for (const KVEvent& e : t.take_events()) {
    if (const auto* s = std::get_if<BlockStored>(&e.data); s != nullptr && s->medium == "CPU") {
      cpu_blocks_per_group[s->group_id] += s->block_hashes.size();
    }
  }
  // Four blocks of the same positions in each group: two host slots per position.
  EXPECT_EQ(cpu_blocks_per_group[0], 4u);
  EXPECT_EQ(cpu_blocks_per_group[1], 4u);
  EXPECT_EQ(t.stats().host_cached_blocks, 8u);
}

// A model of one sliding-window group: its host hit is the window at the longest end found.
TEST(HybridTier, ASlidingWindowGroupAloneLoadsItsWindow) {
  KVCacheManagerConfig c;
  c.num_blocks = 24;
  c.groups = {AttentionSpec::sliding(kBs, 2 * kBs + 1)};
  HostTierConfig h = host_config(256, HostPolicy::kWriteBack, WindowStoreRule::kAll);
  h.group_bytes_per_block.clear();
  TieredKVCacheManager t(c, h);
  const std::vector<TokenId> a = tokens_of(1, 10 * kBs + 2);
  run_request(t, 1, a);
  for (std::uint32_t d = 2; d < 8; ++d) run_request(t, d, tokens_of(d, 10 * kBs + 2));
  TierPlan plan;
  const TieredCacheHit hit = run_request(t, 100, a, &plan);
  EXPECT_EQ(hit.num_tokens(), 10u * kBs);
  EXPECT_EQ(plan.plan.loads.size(), 2u);
}

// Below the host tier: begin_fill and host_holds take the group (one the tier has);
// local_prefix_blocks is refused (RemoteTier computes a hybrid request's local hit itself).
TEST(HybridTier, BelowHostCallsTakeTheGroup) {
  TieredKVCacheManager t(hybrid_config(24, 9, 0), host_config(16, HostPolicy::kWriteBack));
  Request r = t.make_request(1, tokens_of(1, 3 * kBs));
  EXPECT_THROW(t.begin_fill(r, 0, 2), Error);
  EXPECT_THROW((void)t.local_prefix_blocks(r), Error);
  EXPECT_THROW((void)t.host_holds(r, 0, 2), Error);
  EXPECT_FALSE(t.host_holds(r, 0, 1));
  const std::optional<HostFill> f = t.begin_fill(r, 0, 1);
  ASSERT_TRUE(f.has_value());
  t.commit(f->id, true);
  EXPECT_TRUE(t.host_holds(r, 0, 1));  // cached under (hash, group 1) only
  EXPECT_FALSE(t.host_holds(r, 0, 0));
  t.check_invariants();
}

// The remote tier serves hybrid models (tests/tier/remote_tier_hybrid_test.cpp).
TEST(HybridTier, RemoteTierAcceptsAHybridTier) {
  TieredKVCacheManager t(hybrid_config(24, 9, 0), host_config(16, HostPolicy::kWriteBack));
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("pagedkv-hybrid-remote-" +
       std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
       std::to_string(reinterpret_cast<std::uintptr_t>(&t)));
  {
    DiskStoreConfig dc;
    dc.directory = dir;
    dc.name_space = "hybrid-test";
    dc.value_bytes = 64;
    dc.capacity_bytes = 1 << 20;
    dc.preallocate = false;
    DiskStore store(dc);
    std::vector<std::byte> buffer(17 * 64);
    RemoteTierConfig rc;
    rc.bytes_per_block = 64;
    EXPECT_NO_THROW(RemoteTier(t, store, buffer, rc));
  }
  std::filesystem::remove_all(dir);
}

TEST(HybridTier, EpisodesNeverHitWrongContentInAnyGroup) {
  EpisodeResult total;
  for (int hashing = 0; hashing < 4; ++hashing) {
    for (const HostPolicy policy :
         {HostPolicy::kWriteBack, HostPolicy::kWriteThrough, HostPolicy::kWriteThroughSelective}) {
      for (std::uint64_t seed = 1; seed <= 25; ++seed) {
        try {
          std::mt19937_64 rng(seed);
          const EpisodeResult r = hybrid_test::run_hybrid_episode(rng, seed, hashing, policy);
          total.host_hit_tokens += r.host_hit_tokens;
          total.loads += r.loads;
          total.rollbacks += r.rollbacks;
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
          return;
        }
      }
    }
  }
  std::printf("hybrid episodes: %llu host hit tokens, %llu loads, %llu rollbacks\n",
              static_cast<unsigned long long>(total.host_hit_tokens),
              static_cast<unsigned long long>(total.loads),
              static_cast<unsigned long long>(total.rollbacks));
  EXPECT_GT(total.host_hit_tokens, 1000u);
  EXPECT_GT(total.rollbacks, 10u);
}

}  // namespace
}  // namespace pagedkv
