// The host tier with hybrid models (a sliding-window KV-cache group beside full attention):
// scenarios (every group offloaded and onboarded, a window group loads only its window at the
// hit, the window store rule, events and copies naming their group, misuse) and seeded episodes
// against a content reference independent of pagedkv's hashing: every GPU block and host slot
// holds a tag of (group, the exact token prefix it was computed for), copied as an executor
// would; after every admission each group must hold the right tag at every position the
// request's attention reads (full attention: all of them; a window: the window before the
// computed end). Hashers: sha256, xxh3_128 and weak (2-bit, colliding) sha256 / xxh3_128.
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

TEST(HybridTier, RefusesGroupsOfDifferentBlockSizesAndBadByteCounts) {
  KVCacheManagerConfig c = hybrid_config(64, 9, 0);
  c.groups[1] = AttentionSpec::sliding(2 * kBs, 9);
  EXPECT_THROW(TieredKVCacheManager(c, host_config(64, HostPolicy::kWriteBack)), Error);
  HostTierConfig h = host_config(64, HostPolicy::kWriteBack);
  h.group_bytes_per_block = {1, 2, 3};
  EXPECT_THROW(TieredKVCacheManager(hybrid_config(64, 9, 0), h), Error);
}

// Request A (10 blocks) is evicted from a small GPU pool into the host; A again: every full
// block loads, the window group loads only its window at the hit's end.
void window_scenario(int hashing, HostPolicy policy) {
  SCOPED_TRACE("hashing " + std::to_string(hashing) + " policy " + std::string(to_string(policy)));
  const std::uint32_t window = 2 * kBs + 1;  // window_blocks = 2
  TieredKVCacheManager t(hybrid_config(24, window, hashing), host_config(256, policy));
  const std::vector<TokenId> a = tokens_of(1, 10 * kBs + 2);
  run_request(t, 1, a);
  // Flood: other documents push A's blocks out of the 23-block GPU pool.
  for (std::uint32_t d = 2; d < 8; ++d) run_request(t, d, tokens_of(d, 10 * kBs + 2));
  TierPlan plan;
  const TieredCacheHit hit = run_request(t, 100, a, &plan);
  EXPECT_EQ(hit.gpu.num_tokens, 0u);
  ASSERT_EQ(hit.num_host_tokens, 10u * kBs);  // capped at num_tokens - 1
  ASSERT_EQ(hit.host_other_groups.size(), 1u);
  std::size_t group0 = 0, group1 = 0;
  for (const BlockCopy& c : plan.plan.loads) (c.group == 0 ? group0 : group1) += 1;
  EXPECT_EQ(group0, 10u);
  EXPECT_EQ(group1, 2u);  // only blocks 8 and 9: the window at the hit's end
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(hit.host_other_groups[0][i], 0) << i;
  EXPECT_NE(hit.host_other_groups[0][8], 0);
  EXPECT_NE(hit.host_other_groups[0][9], 0);
  const std::vector<TierGroupStats> gs = t.group_stats();
  EXPECT_EQ(gs[0].loaded_blocks, 10u);
  EXPECT_EQ(gs[1].loaded_blocks, 2u);
  EXPECT_EQ(gs[0].loaded_bytes, 10u * 1000);
  EXPECT_EQ(gs[1].loaded_bytes, 2u * 10);
  EXPECT_EQ(t.stats().loaded_bytes, 10u * 1000 + 2u * 10);
}

TEST(HybridTier, WindowGroupLoadsOnlyItsWindowAtTheHit) {
  for (int hashing = 0; hashing < 4; ++hashing) {
    window_scenario(hashing, HostPolicy::kWriteBack);
    window_scenario(hashing, HostPolicy::kWriteThrough);
  }
}

// kRequestTail stores window blocks near requests' ends only; kAll stores every one. Both give
// the same hits in this workload (conversations continuing their previous turn).
TEST(HybridTier, RequestTailRuleStoresFewerWindowBlocksWithTheSameHits) {
  for (const HostPolicy policy : {HostPolicy::kWriteBack, HostPolicy::kWriteThrough}) {
    std::uint64_t stored[2] = {0, 0}, hits[2] = {0, 0};
    for (int rule = 0; rule < 2; ++rule) {
      TieredKVCacheManager t(
          hybrid_config(48, 2 * kBs + 1, 0),
          host_config(1024, policy,
                      rule == 0 ? WindowStoreRule::kRequestTail : WindowStoreRule::kAll));
      RequestId id = 1;
      for (std::uint32_t turn = 1; turn <= 4; ++turn) {
        for (std::uint32_t d = 1; d <= 6; ++d) {
          const TieredCacheHit h = run_request(t, id++, tokens_of(d, turn * 4 * kBs + 1));
          hits[rule] += h.num_tokens();
        }
      }
      stored[rule] = t.group_stats()[1].stored_blocks;
      if (rule == 0) {
        EXPECT_GT(t.stats().window_stores_skipped, 0u);
      } else {
        EXPECT_EQ(t.stats().window_stores_skipped, 0u);
      }
    }
    EXPECT_LT(stored[0], stored[1]) << to_string(policy);
    EXPECT_EQ(hits[0], hits[1]) << to_string(policy);
    EXPECT_GT(hits[0], 0u);
  }
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
