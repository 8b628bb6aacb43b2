// The tier's hooks for a store below the host (tier/remote_tier.hpp uses them): fills of host slots
// (begin_fill + commit), pins (pin_host_slot / unpin_host_slot), the on_cached / on_loaded /
// on_evicted hooks, and their misuse (strong guarantee). No server needed.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv {
namespace {

constexpr std::uint32_t kB = 4;

TieredKVCacheManager make_tier(std::int32_t slots) {
  KVCacheManagerConfig c;
  c.num_blocks = 16;
  c.block_size = kB;
  c.hash_seed = "fill-test";
  HostTierConfig h;
  h.num_host_blocks = slots;
  return TieredKVCacheManager(c, h);
}

std::vector<TokenId> tokens(TokenId first, std::size_t n) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

template <typename Call>
void expect_rejected(TieredKVCacheManager& t, Call call) {
  const TieredSnapshot before = t.snapshot();
  EXPECT_THROW(call(), Error);
  EXPECT_EQ(t.snapshot(), before) << "a rejected call changed the tier";
}

TEST(HostFill, FilledSlotsBecomeHostHitsThatLoad) {
  KVCacheManagerConfig c;
  c.num_blocks = 16;
  c.block_size = kB;
  c.hash_seed = "fill-test";
  HostTierConfig h;
  h.num_host_blocks = 4;
  TieredKVCacheManager t(c, h);
  std::vector<std::pair<BlockId, bool>> cached;
  std::vector<BlockId> loaded;
  HostTierHooks hooks;
  hooks.on_cached = [&](BlockId s, bool from_fill) { cached.emplace_back(s, from_fill); };
  hooks.on_loaded = [&](BlockId s) { loaded.push_back(s); };
  t.set_host_hooks(hooks);

  Request r = t.make_request(1, tokens(0, 13));  // 3 full blocks
  EXPECT_EQ(t.local_prefix_blocks(r), 0u);
  std::vector<HostFill> fills;
  for (std::size_t i = 0; i < 3; ++i) {
    const auto f = t.begin_fill(r, i);
    ASSERT_TRUE(f.has_value());
    fills.push_back(*f);
  }
  t.check_invariants();
  EXPECT_EQ(t.stats().host_slots_storing, 3);
  EXPECT_FALSE(t.host_holds(r, 0));  // not hit-able before the commit
  t.commit(fills[0].id, true);
  t.commit(fills[1].id, false);  // a failed get: the slot is freed
  t.commit(fills[2].id, true);
  t.check_invariants();
  ASSERT_EQ(cached.size(), 2u);
  EXPECT_TRUE(cached[0].second);
  EXPECT_TRUE(t.host_holds(r, 0));
  EXPECT_FALSE(t.host_holds(r, 1));
  EXPECT_TRUE(t.host_holds(r, 2));  // held, but not reachable past the gap
  EXPECT_EQ(t.local_prefix_blocks(r), 1u);
  EXPECT_EQ(t.stats().stored_blocks, 0u);  // fills are not stores from the GPU

  const TieredCacheHit hit = t.get_computed_blocks(r);
  ASSERT_EQ(hit.host_slots.size(), 1u);
  EXPECT_EQ(hit.host_slots[0], fills[0].slot);
  auto a = t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
  ASSERT_TRUE(a.has_value());
  for (TransferId id : a->transfers.load_ids) t.commit(id, true);
  EXPECT_EQ(loaded, std::vector<BlockId>{fills[0].slot});
  t.finish_loads(r);
  t.check_invariants();
}

TEST(HostFill, PinsKeepSlotsAndBlockReset) {
  TieredKVCacheManager t = make_tier(1);
  Request r = t.make_request(1, tokens(0, 9));
  const auto f = t.begin_fill(r, 0);
  ASSERT_TRUE(f.has_value());
  // The only slot is pinned by the fill: another fill finds none (counted, not an error).
  EXPECT_FALSE(t.begin_fill(r, 1).has_value());
  EXPECT_EQ(t.stats().stores_skipped_full, 1u);
  expect_rejected(t, [&] { t.pin_host_slot(f->slot); });  // not cached yet
  t.commit(f->id, true);
  t.pin_host_slot(f->slot);
  t.check_invariants();
  EXPECT_EQ(t.stats().host_slots_pinned, 1);
  EXPECT_FALSE(t.begin_fill(r, 1).has_value());  // a pinned slot is not evicted
  EXPECT_FALSE(t.reset_prefix_cache());
  t.unpin_host_slot(f->slot);
  expect_rejected(t, [&] { t.unpin_host_slot(f->slot); });
  expect_rejected(t, [&] { t.pin_host_slot(0); });
  t.check_invariants();
  EXPECT_TRUE(t.reset_prefix_cache());
}

// on_evicted: called for a cached slot reused by a fill or a store, with that slot, and not for
// a free slot or one freed without a block.
TEST(HostFill, EvictingACachedSlotCallsOnEvicted) {
  TieredKVCacheManager t = make_tier(2);
  std::vector<BlockId> evicted;
  HostTierHooks hooks;
  hooks.on_evicted = [&](BlockId s) { evicted.push_back(s); };
  t.set_host_hooks(hooks);
  Request r = t.make_request(1, tokens(0, 13));  // 3 full blocks
  const auto f0 = t.begin_fill(r, 0);
  const auto f1 = t.begin_fill(r, 1);
  ASSERT_TRUE(f0.has_value() && f1.has_value());
  EXPECT_TRUE(evicted.empty());  // free slots: nothing evicted
  t.commit(f0->id, true);
  t.commit(f1->id, true);
  const auto f2 = t.begin_fill(r, 2);  // both slots hold blocks: the LRU one is evicted
  ASSERT_TRUE(f2.has_value());
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_EQ(evicted[0], f2->slot);
  EXPECT_EQ(t.stats().host_evictions, 1u);
  t.commit(f2->id, false);  // freed without a block
  const auto f3 = t.begin_fill(r, 2);
  ASSERT_TRUE(f3.has_value());
  EXPECT_EQ(evicted.size(), 1u);  // reusing a slot without a block is no eviction
  t.commit(f3->id, true);
  // Write-through stores of a new request's blocks evict both cached host blocks.
  Request q = t.make_request(2, tokens(100, 9));  // 2 full blocks
  const TieredCacheHit hit = t.get_computed_blocks(q);
  auto a = t.allocate_slots(q, q.num_tokens() - hit.num_tokens(), hit);
  ASSERT_TRUE(a.has_value());
  ASSERT_EQ(a->transfers.plan.stores.size(), 2u);
  ASSERT_EQ(evicted.size(), 3u);
  EXPECT_EQ(evicted[1], a->transfers.plan.stores[0].dst);
  EXPECT_EQ(evicted[2], a->transfers.plan.stores[1].dst);
  for (TransferId id : a->transfers.store_ids) t.commit(id, true);
  t.free(q);
  t.check_invariants();
}

TEST(HostFill, RejectsBlocksTheRequestDoesNotHave) {
  TieredKVCacheManager t = make_tier(4);
  Request r = t.make_request(1, tokens(0, 9));  // 2 full blocks
  expect_rejected(t, [&] { t.begin_fill(r, 2); });
  t.check_invariants();
}

}  // namespace
}  // namespace pagedkv
