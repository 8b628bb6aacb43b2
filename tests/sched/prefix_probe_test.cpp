// PrefixProbe: the same hit as get_computed_blocks (GPU, and GPU + host for a tier), without
// changing anything observable (snapshots equal before and after, stats included).
#include "pagedkv/sched/prefix_probe.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"
#include "test_tokens.hpp"

namespace pagedkv {
namespace {

KVCacheManagerConfig config(std::int32_t blocks) {
  KVCacheManagerConfig c;
  c.num_blocks = blocks;
  c.block_size = 4;
  c.hash_scheme = HashScheme::kSha256;
  return c;
}

std::vector<TokenId> prompt(std::mt19937& rng, const std::vector<std::vector<TokenId>>& prefixes) {
  auto t = prefixes[rng() % prefixes.size()];
  t.resize(rng() % (t.size() + 1));  // a prefix of a shared prefix
  const auto tail = random_tokens(rng() % 20, rng());
  t.insert(t.end(), tail.begin(), tail.end());
  if (t.empty()) t.push_back(7);
  return t;
}

TEST(PrefixProbe, EqualsGetComputedBlocksAndChangesNothing) {
  std::mt19937 rng(5);
  KVCacheManager m(config(60));
  PrefixProbe probe(m);
  std::vector<std::vector<TokenId>> prefixes;
  for (int i = 0; i < 5; ++i) prefixes.push_back(random_tokens(40, 100 + i));
  std::vector<std::unique_ptr<Request>> live;
  std::size_t hits = 0;
  for (RequestId id = 0; id < 400; ++id) {
    Request r = m.make_request(id, prompt(rng, prefixes));
    const KVCacheManagerSnapshot before = m.snapshot();
    const CachedPrefix c = probe.probe(r);
    EXPECT_EQ(m.snapshot(), before);  // no touch, no LRU change, no stats
    const CacheHit hit = m.get_computed_blocks(r);
    ASSERT_EQ(c.gpu_tokens, hit.num_tokens) << "request " << id;
    EXPECT_EQ(c.host_tokens, 0u);
    std::size_t free_hits = 0;
    for (const BlockId b : hit.blocks) free_hits += m.block_pool().block(b).ref_cnt == 0;
    EXPECT_EQ(c.gpu_free_hit_blocks, free_hits);
    hits += hit.num_tokens > 0;
    if (m.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit)) {
      r.set_num_computed_tokens(r.num_tokens());
      live.push_back(std::make_unique<Request>(std::move(r)));
    }
    while (!live.empty() && (live.size() > 4 || rng() % 2 == 0)) {
      m.free(*live.front());
      live.erase(live.begin());
    }
  }
  EXPECT_GT(hits, 50u);
}

TEST(PrefixProbe, TierAddsTheHostRunAndChangesNothing) {
  HostTierConfig h;
  h.num_host_blocks = 200;
  TieredKVCacheManager t(config(24), h);
  PrefixProbe probe(t);
  std::mt19937 rng(9);
  std::vector<std::vector<TokenId>> prefixes;
  for (int i = 0; i < 4; ++i) prefixes.push_back(random_tokens(60, 300 + i));
  std::size_t host_hits = 0;
  for (RequestId id = 0; id < 200; ++id) {
    Request r = t.make_request(id, prompt(rng, prefixes));
    const TieredSnapshot before = t.snapshot();
    const CachedPrefix c = probe.probe(r);
    EXPECT_EQ(t.snapshot(), before);
    const TieredCacheHit hit = t.get_computed_blocks(r);
    ASSERT_EQ(c.gpu_tokens, hit.gpu.num_tokens) << "request " << id;
    ASSERT_EQ(c.host_tokens, hit.num_host_tokens) << "request " << id;
    host_hits += hit.num_host_tokens > 0;
    auto a = t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
    if (!a) continue;
    for (const TransferId x : a->transfers.eviction_ids) t.commit(x, true);
    for (const TransferId x : a->transfers.load_ids) t.commit(x, true);
    if (t.has_unfinished_loads(r.id())) {
      const LoadResult lr = t.finish_loads(r);
      for (const TransferId x : lr.transfers.store_ids) t.commit(x, true);
    }
    for (const TransferId x : a->transfers.store_ids) t.commit(x, true);
    t.free(r);
  }
  EXPECT_GT(host_hits, 10u);
}

TEST(PrefixProbe, CachingOffSkipReadingAndHybridManagers) {
  KVCacheManagerConfig off = config(20);
  off.enable_caching = false;
  KVCacheManager m(off);
  PrefixProbe p(m);
  EXPECT_EQ(p.probe(m.make_request(1, iota_tokens(1, 12))).tokens(), 0u);

  KVCacheManager on(config(40));
  Request warm = on.make_request(1, iota_tokens(1, 12));
  ASSERT_TRUE(on.allocate_slots(warm, 12));
  warm.set_num_computed_tokens(12);
  on.free(warm);
  PrefixProbe q(on);
  Request r = on.make_request(2, iota_tokens(1, 12));
  EXPECT_EQ(q.probe(r).gpu_tokens, 8u);  // capped at num_tokens - 1, whole blocks
  r.skip_reading_prefix_cache = true;
  EXPECT_EQ(q.probe(r).gpu_tokens, 0u);
  // A request hashed by another manager (another block size) is refused.
  KVCacheManagerConfig other = config(40);
  other.block_size = 8;
  KVCacheManager o(other);
  EXPECT_THROW(q.probe(o.make_request(3, iota_tokens(1, 12))), Error);

  KVCacheManagerConfig hybrid = config(40);
  hybrid.groups = {AttentionSpec::full(4), AttentionSpec::sliding(4, 8)};
  KVCacheManager hm(hybrid);
  EXPECT_THROW(PrefixProbe{hm}, Error);
}

}  // namespace
}  // namespace pagedkv
