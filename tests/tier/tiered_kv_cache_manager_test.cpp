#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"

namespace pagedkv {
namespace {

constexpr std::uint32_t kB = 4;

KVCacheManagerConfig gpu_config(std::int32_t num_blocks) {
  KVCacheManagerConfig c;
  c.num_blocks = num_blocks;
  c.block_size = kB;
  c.hash_seed = "tier-test";
  c.enable_kv_events = true;
  return c;
}

HostTierConfig host_config(std::int32_t slots, HostPolicy policy = HostPolicy::kWriteThrough) {
  HostTierConfig h;
  h.num_host_blocks = slots;
  h.policy = policy;
  h.bytes_per_block = 100;
  return h;
}

std::vector<TokenId> tokens(TokenId first, std::size_t n) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

void commit_all(TieredKVCacheManager& t, const std::vector<TransferId>& ids, bool ok = true) {
  for (const TransferId id : ids) t.commit(id, ok);
}

// Schedules a whole prompt as an engine would: lookup, allocate, before-forward transfers
// committed, loads finished, the "forward pass", after-forward stores committed. Returns the hit.
TieredCacheHit admit(TieredKVCacheManager& t, Request& r) {
  const TieredCacheHit hit = t.get_computed_blocks(r);
  auto a = t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
  EXPECT_TRUE(a.has_value());
  if (!a) return hit;
  commit_all(t, a->transfers.eviction_ids);
  commit_all(t, a->transfers.load_ids);
  if (t.has_unfinished_loads(r.id())) {
    const LoadResult res = t.finish_loads(r);
    EXPECT_FALSE(res.rolled_back);
    EXPECT_EQ(res.num_computed_tokens, hit.num_tokens());
    commit_all(t, res.transfers.store_ids);
  }
  r.set_num_computed_tokens(r.num_tokens());
  commit_all(t, a->transfers.store_ids);
  t.check_invariants();
  return hit;
}

// Fills the GPU pool with unrelated requests so that every earlier cached block is evicted.
void flush_gpu(TieredKVCacheManager& t, RequestId first_id, std::int32_t gpu_blocks) {
  for (std::int32_t i = 0; i < 2; ++i) {
    auto r =
        t.make_request(first_id + static_cast<RequestId>(i),
                       tokens(100000 + i * 10000, static_cast<std::size_t>(gpu_blocks - 1) * kB));
    admit(t, r);
    t.free(r);
  }
}

// Admits `prompt` as request 1, frees it and flushes the GPU pool (gpu_blocks blocks): its
// blocks stay only in the host tier (stored by write-through as cached, by write-back as
// evicted).
void host_only(TieredKVCacheManager& t, std::vector<TokenId> prompt, std::int32_t gpu_blocks,
               RequestHashKeys keys = {}) {
  auto a = t.make_request(1, prompt, std::move(keys));
  admit(t, a);
  t.free(a);
  flush_gpu(t, 100, gpu_blocks);
}

// Allocates r's first step with `hit` (one new token), expects `loads` loads, commits them done
// and finishes them: no rollback.
void load_hit(TieredKVCacheManager& t, Request& r, const TieredCacheHit& hit, std::size_t loads) {
  const auto alloc = t.allocate_slots(r, 1, hit);
  ASSERT_TRUE(alloc);
  EXPECT_EQ(alloc->transfers.plan.loads.size(), loads);
  commit_all(t, alloc->transfers.load_ids);
  EXPECT_FALSE(t.finish_loads(r).rolled_back);
  t.check_invariants();
}

template <typename Call>
void expect_rejected(TieredKVCacheManager& t, Call call, const std::string& fragment) {
  const TieredSnapshot before = t.snapshot();
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.snapshot(), before) << "state changed by a rejected call";
  t.check_invariants();
}

TEST(TieredKVCacheManager, HostHitContinuesTheGpuPrefixAndLoads) {
  TieredKVCacheManager t(gpu_config(8), host_config(64));
  auto a = t.make_request(1, tokens(0, 17));  // 4 full blocks
  admit(t, a);
  EXPECT_EQ(t.stats().stored_blocks, 4u);  // write-through: every cached block
  t.free(a);
  flush_gpu(t, 100, 8);

  auto b = t.make_request(2, tokens(0, 17));
  const TieredCacheHit hit = t.get_computed_blocks(b);
  EXPECT_EQ(hit.gpu.num_tokens, 0u);
  EXPECT_EQ(hit.host_slots.size(), 4u);  // capped at 16 of 17 tokens
  auto alloc = t.allocate_slots(b, 1, hit);
  ASSERT_TRUE(alloc);
  ASSERT_EQ(alloc->transfers.plan.loads.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(alloc->transfers.plan.loads[i].src, hit.host_slots[i]);
    EXPECT_EQ(alloc->transfers.plan.loads[i].dst, t.block_ids(2)[i]);
  }
  // In flight: the loaded blocks are not hit-able, the host slots are pinned.
  auto probe = t.make_request(3, tokens(0, 17));
  EXPECT_EQ(t.get_computed_blocks(probe).gpu.num_tokens, 0u);
  EXPECT_EQ(t.stats().host_slots_pinned, 4);
  t.check_invariants();
  expect_rejected(
      t, [&] { t.free(b); }, "in flight");
  expect_rejected(
      t, [&] { t.finish_loads(b); }, "not committed");
  commit_all(t, alloc->transfers.load_ids);
  expect_rejected(
      t, [&] { t.allocate_slots(b, 1); }, "not finished");
  const LoadResult res = t.finish_loads(b);
  EXPECT_FALSE(res.rolled_back);
  EXPECT_EQ(res.num_computed_tokens, 16u);
  EXPECT_TRUE(res.transfers.plan.empty());  // the loaded blocks are in the host already
  EXPECT_EQ(t.get_computed_blocks(probe).gpu.num_tokens, 16u);
  EXPECT_EQ(t.stats().loaded_blocks, 4u);
  EXPECT_EQ(t.stats().loaded_bytes, 400u);
  t.check_invariants();
  t.free(b);

  // GPU prefix then host: evict only the tail from the GPU.
  const TierStats s = t.stats();
  EXPECT_EQ(s.host_hit_tokens, 32u);
  EXPECT_GE(s.gpu_hit_tokens, 16u);
}

TEST(TieredKVCacheManager, FailedLoadRollsBackToTheBlockBeforeIt) {
  TieredKVCacheManager t(gpu_config(8), host_config(64));
  host_only(t, tokens(0, 17), 8);
  auto b = t.make_request(2, tokens(0, 17));
  const TieredCacheHit hit = t.get_computed_blocks(b);
  ASSERT_EQ(hit.host_slots.size(), 4u);
  auto alloc = t.allocate_slots(b, 1, hit);
  ASSERT_TRUE(alloc);
  const auto& ids = alloc->transfers.load_ids;
  t.commit(ids[0], true);
  t.commit(ids[3], true);
  t.commit(ids[2], false);  // block 2 never arrived
  t.commit(ids[1], true);
  expect_rejected(
      t, [&] { t.commit(ids[1], true); }, "already committed");
  expect_rejected(
      t, [&] { t.commit(ids[1] + (1ull << 40), true); }, "unknown");
  const LoadResult res = t.finish_loads(b);
  EXPECT_TRUE(res.rolled_back);
  EXPECT_EQ(res.num_computed_tokens, 8u);
  EXPECT_EQ(t.stats().load_failures, 1u);
  EXPECT_EQ(t.stats().rollbacks, 1u);
  t.check_invariants();
  // Only blocks 0 and 1 are hit-able on the GPU; the engine recomputes from token 8.
  auto probe = t.make_request(3, tokens(0, 17));
  EXPECT_EQ(t.get_computed_blocks(probe).gpu.num_tokens, 8u);
  b.set_num_computed_tokens(res.num_computed_tokens);
  auto again = t.allocate_slots(b, 9);
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->new_blocks.empty());  // the blocks are held already
  b.set_num_computed_tokens(17);
  EXPECT_EQ(t.get_computed_blocks(probe).gpu.num_tokens, 16u);
  t.check_invariants();
}

TEST(TieredKVCacheManager, WriteBackStoresWhatTheGpuEvictsBeforeItsNewOwnerRuns) {
  TieredKVCacheManager t(gpu_config(6), host_config(64, HostPolicy::kWriteBack));
  auto a = t.make_request(1, tokens(0, 16));  // 4 blocks
  admit(t, a);
  EXPECT_EQ(t.stats().stored_blocks, 0u);  // nothing stored while the GPU holds it
  t.free(a);
  auto b = t.make_request(2, tokens(500, 16));  // takes 4 blocks: the free one and 3 cached
  const TieredCacheHit hit = t.get_computed_blocks(b);
  auto alloc = t.allocate_slots(b, 16, hit);
  ASSERT_TRUE(alloc);
  ASSERT_EQ(alloc->transfers.plan.evictions.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {  // copied out of the very blocks B now owns
    EXPECT_EQ(alloc->transfers.plan.evictions[i].src, alloc->new_blocks[i + 1]);
  }
  EXPECT_TRUE(alloc->transfers.plan.stores.empty());
  t.check_invariants();
  expect_rejected(
      t, [&] { t.free(b); }, "in flight");
  commit_all(t, alloc->transfers.eviction_ids);
  EXPECT_EQ(t.stats().stored_blocks, 3u);
  t.free(b);
  t.check_invariants();
  // A's chain is evicted tail first: blocks 3, 2, 1 went to the host, block 0 stayed on the GPU,
  // so the hit (capped at 15 tokens) is GPU block 0 + host blocks 1, 2.
  auto c = t.make_request(3, tokens(0, 16));
  const TieredCacheHit hc = t.get_computed_blocks(c);
  EXPECT_EQ(hc.gpu.blocks.size(), 1u);
  EXPECT_EQ(hc.host_slots.size(), 2u);
}

TEST(TieredKVCacheManager, SelectiveStoresABlockOnceItWasHitKTimes) {
  HostTierConfig h = host_config(64, HostPolicy::kWriteThroughSelective);
  h.selective_hits = 2;
  TieredKVCacheManager t(gpu_config(32), h);
  auto a = t.make_request(1, tokens(0, 9));
  admit(t, a);
  t.free(a);
  EXPECT_EQ(t.stats().stored_blocks, 0u);
  auto b = t.make_request(2, tokens(0, 9));
  admit(t, b);  // first hit of blocks 0, 1
  t.free(b);
  EXPECT_EQ(t.stats().stored_blocks, 0u);
  auto c = t.make_request(3, tokens(0, 9));
  admit(t, c);  // second hit: stored
  t.free(c);
  EXPECT_EQ(t.stats().stored_blocks, 2u);
  auto d = t.make_request(4, tokens(0, 9));
  admit(t, d);  // third hit: already there
  EXPECT_EQ(t.stats().stored_blocks, 2u);
}

TEST(TieredKVCacheManager, AFullHostTierSkipsStoresAndCountsThem) {
  TieredKVCacheManager t(gpu_config(32), host_config(2));
  auto a = t.make_request(1, tokens(0, 17));
  const TieredCacheHit hit = t.get_computed_blocks(a);
  auto alloc = t.allocate_slots(a, 17, hit);
  ASSERT_TRUE(alloc);
  EXPECT_EQ(alloc->transfers.plan.stores.size(), 2u);  // two slots, both pinned now
  EXPECT_EQ(t.stats().stores_skipped_full, 2u);
  commit_all(t, alloc->transfers.store_ids, false);  // failed stores free their slots
  EXPECT_EQ(t.stats().store_failures, 2u);
  EXPECT_EQ(t.stats().host_cached_blocks, 0u);
  t.check_invariants();
}

TEST(TieredKVCacheManager, PreemptedRequestResumesByLoading) {
  TieredKVCacheManager t(gpu_config(8), host_config(64, HostPolicy::kWriteBack));
  auto a = t.make_request(1, tokens(0, 20));
  admit(t, a);
  t.preempt(a);
  flush_gpu(t, 100, 8);  // its blocks leave the GPU: write-back stores them
  EXPECT_GE(t.stats().stored_blocks, 4u);
  const TieredCacheHit hit = t.get_computed_blocks(a);
  EXPECT_EQ(hit.num_tokens(), 16u);
  EXPECT_EQ(hit.host_slots.size() + hit.gpu.blocks.size(), 4u);
  EXPECT_GT(hit.host_slots.size(), 0u);
}

TEST(TieredKVCacheManager, EventsCarryTheMediumInOneGapFreeSequence) {
  TieredKVCacheManager t(gpu_config(6), host_config(2, HostPolicy::kWriteBack));
  auto a = t.make_request(1, tokens(0, 16));
  admit(t, a);
  t.free(a);
  auto b = t.make_request(2, tokens(500, 16));
  admit(t, b);  // evicts A's 4 blocks on the GPU; 2 go to the host ...
  t.free(b);
  auto c = t.make_request(3, tokens(900, 16));
  admit(t, c);  // ... and B's evictions push them out of the host
  const std::vector<KVEvent> events = t.take_events();
  std::size_t gpu_stored = 0, cpu_stored = 0, cpu_removed = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq, i);
    if (const auto* s = std::get_if<BlockStored>(&events[i].data)) {
      (s->medium == "CPU" ? cpu_stored : gpu_stored) += s->block_hashes.size();
      EXPECT_TRUE(s->medium == "CPU" || s->medium == "GPU");
    }
    if (const auto* r = std::get_if<BlockRemoved>(&events[i].data)) {
      if (r->medium == "CPU") ++cpu_removed;
    }
  }
  EXPECT_EQ(gpu_stored, 12u);
  EXPECT_EQ(cpu_stored, t.stats().stored_blocks);
  EXPECT_EQ(cpu_removed, t.stats().host_evictions);
  EXPECT_GT(cpu_removed, 0u);
}

TEST(TieredKVCacheManager, HostHitVerifiesTokensAndParentHash) {
  // A 3-bit hasher: blocks collide all the time. A host block whose hash collides but whose
  // tokens or parent differ must be a miss. Seeds are tried until both cases occur.
  bool parent_case = false, token_case = false;
  for (int seed = 0; seed < 64 && !(parent_case && token_case); ++seed) {
    KVCacheManagerConfig c = gpu_config(16);
    const std::string seed_text(static_cast<std::size_t>(seed) + 1, 'w');
    c.hasher = BlockHasher::weak_for_testing(HashScheme::kSha256, seed_text, 3);
    TieredKVCacheManager t(c, host_config(64));
    auto x = t.make_request(1, std::vector<TokenId>{1, 2, 3, 4, 5, 6, 7, 8, 0});
    admit(t, x);
    t.free(x);
    flush_gpu(t, 100, 16);
    const BlockHash x0 = x.block_hashes()[0];
    const BlockHash x1 = x.block_hashes()[1];
    for (TokenId v = 10; v < 200; ++v) {
      auto y = t.make_request(1000 + static_cast<RequestId>(v),
                              std::vector<TokenId>{v, 2, 3, 4, 5, 6, 7, 8, 0});
      if (!parent_case && y.block_hashes()[1] == x1 && y.block_hashes()[0] != x0) {
        // Same block-1 tokens after another block 0: make y's block 0 a GPU hit.
        auto y0 =
            t.make_request(5000 + static_cast<RequestId>(v), std::vector<TokenId>{v, 2, 3, 4, 0});
        admit(t, y0);
        t.free(y0);
        const TieredCacheHit hit = t.get_computed_blocks(y);
        EXPECT_EQ(hit.gpu.blocks.size(), 1u);
        EXPECT_TRUE(hit.host_slots.empty()) << "a block after a different parent was accepted";
        parent_case = true;
      }
      auto z = t.make_request(2000 + static_cast<RequestId>(v),
                              std::vector<TokenId>{1, 2, 3, 4, v, 6, 7, 8, 0});
      if (!token_case && z.block_hashes()[1] == x1) {
        const TieredCacheHit hit = t.get_computed_blocks(z);
        EXPECT_EQ(hit.host_slots.size() + hit.gpu.blocks.size(), 1u)
            << "different tokens were accepted";
        token_case = true;
      }
    }
  }
  EXPECT_TRUE(parent_case);
  EXPECT_TRUE(token_case);
}

TEST(TieredKVCacheManager, HostPoolIdentifiesPrefixesAsTheGpuPoolDoes) {
  // SHA-256 chain hashes identify their prefix: the host pool stores parent hashes, as the GPU
  // pool does, instead of keeping hash-consed content ids. A weak hasher's GPU pool keeps content
  // ids; the host pool still stores parent hashes and tokens (no content-id table), and the tier
  // checks prefix identities instead of the parent hash.
  TieredKVCacheManager strong(gpu_config(8), host_config(4));
  EXPECT_TRUE(strong.gpu().block_pool().config().chain_hashes_identify_prefix);
  EXPECT_TRUE(strong.host_pool().config().chain_hashes_identify_prefix);
  EXPECT_FALSE(strong.uses_prefix_identities());
  KVCacheManagerConfig c = gpu_config(8);
  c.hasher = BlockHasher::weak_for_testing(HashScheme::kSha256, "weak", 3);
  TieredKVCacheManager weak(c, host_config(4));
  EXPECT_FALSE(weak.gpu().block_pool().config().chain_hashes_identify_prefix);
  EXPECT_TRUE(weak.host_pool().stores_chain_material());
  EXPECT_TRUE(weak.uses_prefix_identities());
}

// A forced collision: y's block 0 differs from x's but hashes alike, so y's block 1 (the same
// tokens as x's) has x's block-1 hash and parent hash. With y's block 0 a GPU hit and x's block 1
// only in the host tier, a host hit on it would hand y the K/V of x's prefix. The host tier
// compares the prefix identity (a SHA-256 chain over the whole prefix) and misses; so does
// host_holds (the remote tier's view), and a fill of y's block 1 is kept apart from x's.
void expect_collision_is_a_miss(HashScheme scheme, HostPolicy policy) {
  bool found = false;
  for (int seed = 0; seed < 64 && !found; ++seed) {
    KVCacheManagerConfig c = gpu_config(16);
    const std::string seed_text(static_cast<std::size_t>(seed) + 1, 'c');
    c.hasher = BlockHasher::weak_for_testing(scheme, seed_text, 3);
    TieredKVCacheManager t(c, host_config(64, policy));
    ASSERT_TRUE(t.uses_prefix_identities());
    host_only(t, std::vector<TokenId>{1, 2, 3, 4, 5, 6, 7, 8, 0}, 16);
    auto x = t.make_request(2, std::vector<TokenId>{1, 2, 3, 4, 5, 6, 7, 8, 0});
    const TieredCacheHit xh = t.get_computed_blocks(x);
    ASSERT_EQ(xh.host_slots.size(), 2u) << "x's blocks are in the host tier";
    for (TokenId v = 10; v < 400 && !found; ++v) {
      auto y = t.make_request(1000 + static_cast<RequestId>(v),
                              std::vector<TokenId>{v, 2, 3, 4, 5, 6, 7, 8, 0});
      if (y.block_hashes()[0] != x.block_hashes()[0]) continue;
      ASSERT_EQ(y.block_hashes()[1], x.block_hashes()[1]);
      found = true;
      auto y0 =
          t.make_request(5000 + static_cast<RequestId>(v), std::vector<TokenId>{v, 2, 3, 4, 0});
      admit(t, y0);
      t.free(y0);
      const TieredCacheHit hit = t.get_computed_blocks(y);
      EXPECT_EQ(hit.gpu.blocks.size(), 1u);
      EXPECT_TRUE(hit.host_slots.empty()) << "a host block of another prefix was a hit";
      EXPECT_FALSE(t.host_holds(y, 1));
      EXPECT_TRUE(t.host_holds(x, 1));
      // A hand-made hit naming x's slot for y's block 1 is refused as stale.
      TieredCacheHit forged = hit;
      forged.host_slots = {xh.host_slots[1]};
      forged.num_host_tokens = kB;
      expect_rejected(
          t, [&] { (void)t.allocate_slots(y, 1, forged); }, "stale host hit");
      // y's block 1 arriving from below lands in its own slot; then both hit their own.
      const std::optional<HostFill> fill = t.begin_fill(y, 1);
      ASSERT_TRUE(fill);
      t.commit(fill->id, true);
      t.check_invariants();
      const TieredCacheHit again = t.get_computed_blocks(y);
      // (A twin of another prefix keeps the fill out of the host map: a miss, never x's slot.)
      if (!again.host_slots.empty()) {
        EXPECT_NE(again.host_slots[0], xh.host_slots[1]);
      }
      EXPECT_EQ(t.get_computed_blocks(x).host_slots.size(), 2u);
      std::vector<BlockHash> xi, yi;
      t.prefix_identities(x, 3, xi);
      t.prefix_identities(y, 3, yi);
      ASSERT_EQ(xi.size(), 2u);
      EXPECT_NE(xi[0], yi[0]);
      EXPECT_NE(xi[1], yi[1]);
      EXPECT_EQ(t.host_slot_identity(xh.host_slots[1]), xi[1]);
    }
  }
  EXPECT_TRUE(found) << "no colliding block 0 found";
}

TEST(TieredKVCacheManager, CollidingPrefixIsAHostMissWithWeakSha256) {
  expect_collision_is_a_miss(HashScheme::kSha256, HostPolicy::kWriteThrough);
  expect_collision_is_a_miss(HashScheme::kSha256, HostPolicy::kWriteBack);
}

TEST(TieredKVCacheManager, CollidingPrefixIsAHostMissWithWeakXxh3) {
  expect_collision_is_a_miss(HashScheme::kXxh3_128, HostPolicy::kWriteThrough);
  expect_collision_is_a_miss(HashScheme::kXxh3_128, HostPolicy::kWriteBack);
}

// xxh3_128 (the fast scheme): the GPU pool guards its chain hashes, the host tier keeps prefix
// identities; a prefix evicted from the GPU comes back from the host tier, for every policy.
TEST(TieredKVCacheManager, Xxh3HostHitsLoadForEveryPolicy) {
  for (const HostPolicy policy :
       {HostPolicy::kWriteThrough, HostPolicy::kWriteBack, HostPolicy::kWriteThroughSelective}) {
    KVCacheManagerConfig c = gpu_config(8);
    c.hash_scheme = HashScheme::kXxh3_128;
    HostTierConfig h = host_config(64, policy);
    h.selective_hits = 1;
    TieredKVCacheManager t(c, h);
    EXPECT_TRUE(t.uses_prefix_identities());
    EXPECT_TRUE(t.gpu().block_pool().config().guard_chain_hashes);
    const std::vector<TokenId> prompt = tokens(1, 3 * kB + 1);
    if (policy == HostPolicy::kWriteThroughSelective) {  // hit once on the GPU, then stored
      auto a = t.make_request(1, prompt);
      admit(t, a);
      t.free(a);
      auto b = t.make_request(2, prompt);
      admit(t, b);
      t.free(b);
      flush_gpu(t, 100, 8);
    } else {
      host_only(t, prompt, 8);
    }
    auto r = t.make_request(3, prompt);
    const TieredCacheHit hit = admit(t, r);  // loads the host run
    EXPECT_EQ(hit.gpu.blocks.size(), 0u) << to_string(policy);
    EXPECT_EQ(hit.host_slots.size(), 3u) << to_string(policy);
    std::vector<BlockHash> ids;
    t.prefix_identities(r, 3, ids);
    for (std::size_t i = 0; i < hit.host_slots.size(); ++i) {
      EXPECT_EQ(t.host_slot_identity(hit.host_slots[i]), ids[i]);
    }
    EXPECT_EQ(t.stats().loaded_blocks, 3u);
    t.free(r);
    t.check_invariants();
  }
}

TEST(TieredKVCacheManager, RejectsWhatItCannotServe) {
  KVCacheManagerConfig x = gpu_config(8);
  x.hash_scheme = HashScheme::kXxh3_128;
  EXPECT_NO_THROW(TieredKVCacheManager(x, host_config(4)));  // prefix identities
  KVCacheManagerConfig hybrid = gpu_config(8);
  hybrid.groups = {AttentionSpec::full(4), AttentionSpec::sliding(4, 8)};
  EXPECT_NO_THROW(TieredKVCacheManager(hybrid, host_config(4)));  // hybrid_tier_test
  // Two block sizes (hybrid_tier_test).
  hybrid.groups = {AttentionSpec::full(4), AttentionSpec::sliding(8, 8)};
  EXPECT_NO_THROW(TieredKVCacheManager(hybrid, host_config(4)));
  hybrid.groups = {AttentionSpec::sliding(4, 8)};  // a window alone: the hybrid path
  EXPECT_NO_THROW(TieredKVCacheManager(hybrid, host_config(4)));
  EXPECT_THROW(TieredKVCacheManager(gpu_config(8), host_config(0)), Error);
  HostTierConfig sel = host_config(4, HostPolicy::kWriteThroughSelective);
  sel.selective_hits = 0;
  EXPECT_THROW(TieredKVCacheManager(gpu_config(8), sel), Error);
  EXPECT_EQ(HostTierConfig::blocks_for_bytes(1000, 300), 3);
  EXPECT_EQ(parse_host_policy("write_back"), HostPolicy::kWriteBack);
  EXPECT_FALSE(parse_host_policy("lru"));
}

// A block loaded from a host slot remembers the slot, so that write-back need not look it up
// again when the GPU evicts it; once the slot was reused for other content, the eviction must
// store the block again (a trusted stale slot would skip the store and lose the block).
TEST(TieredKVCacheManager, WriteBackStoresALoadedBlockAgainOnceItsSlotWasReused) {
  TieredKVCacheManager t(gpu_config(8), host_config(64, HostPolicy::kWriteBack));
  host_only(t, tokens(0, 17), 8);  // a's blocks are evicted from the GPU: stored in the host
  auto b = t.make_request(2, tokens(0, 17));
  EXPECT_EQ(admit(t, b).host_slots.size(), 4u);  // loaded back into the GPU
  t.free(b);
  const std::uint64_t stored = t.stats().stored_blocks;
  // Reuse every host slot for other content (fills from below), a's slots included.
  auto other = t.make_request(3, tokens(500000, 64 * kB + 1));
  for (std::size_t i = 0; i < 64; ++i) {
    const auto fill = t.begin_fill(other, i);
    ASSERT_TRUE(fill);
    t.commit(fill->id, true);
  }
  t.check_invariants();
  auto c = t.make_request(4, tokens(0, 17));
  EXPECT_EQ(t.get_computed_blocks(c).num_host_tokens, 0u);  // only the GPU holds a's blocks
  EXPECT_EQ(t.get_computed_blocks(c).gpu.num_tokens, 16u);
  flush_gpu(t, 200, 8);  // evicts them from the GPU: write-back must store all 4 again
  EXPECT_GE(t.stats().stored_blocks, stored + 4);
  const TieredCacheHit hit = t.get_computed_blocks(c);
  EXPECT_EQ(hit.gpu.num_tokens, 0u);
  EXPECT_EQ(hit.host_slots.size(), 4u);
  t.check_invariants();
}

// A hit whose host slots were reassigned between the lookup and the allocation is verified
// again: the same content in a reused slot is accepted, a slot now holding other content is not.
TEST(TieredKVCacheManager, HitAfterAHostReassignmentIsVerifiedAgain) {
  TieredKVCacheManager t(gpu_config(8), host_config(12, HostPolicy::kWriteBack));
  host_only(t, tokens(0, 17),
            8);  // the host holds a's 4 blocks and 7 of the flush's, 1 slot is free
  auto b = t.make_request(2, tokens(0, 17));
  const TieredCacheHit hit = t.get_computed_blocks(b);
  ASSERT_EQ(hit.host_slots.size(), 4u);
  for (const BlockId s : hit.host_slots) {  // to the LRU tail: the fills below evict others
    t.pin_host_slot(s);
    t.unpin_host_slot(s);
  }
  // Two fills take the free slot and evict one cached slot: the hit's epoch is now old.
  const std::uint64_t evictions = t.stats().host_evictions;
  auto other = t.make_request(3, tokens(500000, 8 * kB + 1));
  for (std::size_t i = 0; i < 2; ++i) {
    const auto fill = t.begin_fill(other, i);
    ASSERT_TRUE(fill);
    t.commit(fill->id, true);
  }
  ASSERT_EQ(t.stats().host_evictions, evictions + 1);
  load_hit(t, b, hit, 4);  // the slots still hold b's blocks: verified, loads
}

// allocate_slots trusts a lookup's slots without reading them only for the blocks they were
// found for (TieredCacheHit::host_check): a hit whose slots were changed, or one passed to a
// request with other content, is verified again and refused; a correct hit with a changed digest
// is verified again and accepted.
TEST(TieredKVCacheManager, StaleHostHitIsRejected) {
  TieredKVCacheManager t(gpu_config(8), host_config(64));
  host_only(t, tokens(0, 17), 8);
  auto b = t.make_request(2, tokens(0, 17));
  const TieredCacheHit hit = t.get_computed_blocks(b);
  ASSERT_EQ(hit.host_slots.size(), 4u);
  for (std::size_t p = 0; p < hit.host_slots.size(); ++p) {  // a slot changed at any place
    TieredCacheHit changed = hit;
    changed.host_slots[p] = hit.host_slots[(p + 1) % hit.host_slots.size()];
    expect_rejected(
        t, [&] { t.allocate_slots(b, 1, changed); }, "stale host hit");
  }
  for (const BlockId bad : {0, -3, 100000}) {  // not a host slot at all
    TieredCacheHit out_of_range = hit;
    out_of_range.host_slots[2] = bad;
    expect_rejected(
        t, [&] { t.allocate_slots(b, 1, out_of_range); },
        "stale host hit: slot " + std::to_string(bad));
  }
  auto odd = t.make_request(4, tokens(0, 3 * kB + 1));  // an odd run: its last slot changed
  TieredCacheHit odd_changed = t.get_computed_blocks(odd);
  ASSERT_EQ(odd_changed.host_slots.size(), 3u);
  odd_changed.host_slots[2] = hit.host_slots[3];
  expect_rejected(
      t, [&] { t.allocate_slots(odd, 1, odd_changed); }, "stale host hit");
  auto other = t.make_request(3, tokens(1000, 17));  // same length, other content
  expect_rejected(
      t, [&] { t.allocate_slots(other, 1, hit); }, "stale host hit");
  TieredCacheHit swapped = hit;
  std::swap(swapped.host_slots[1], swapped.host_slots[2]);
  swapped.host_check ^= 1;
  expect_rejected(
      t, [&] { t.allocate_slots(b, 1, swapped); }, "stale host hit");
  TieredCacheHit digest_changed = hit;
  digest_changed.host_check ^= 1;
  load_hit(t, b, digest_changed, 4);
}

// Write-back stores an evicted block from its content as the GPU pool held it: read from the
// pool's material when the pool keeps it (verify_cache_hits), from the tier's own records when it
// does not. Extra keys (a LoRA name) go with the block: a request with the same adapter hits the
// host, one without does not.
TEST(TieredKVCacheManager, WriteBackStoresEvictedBlocksWithTheirExtraKeysInBothRecordModes) {
  for (const bool gpu_verify : {true, false}) {
    SCOPED_TRACE(gpu_verify ? "GPU pool keeps material" : "tier keeps records");
    KVCacheManagerConfig c = gpu_config(6);
    c.verify_cache_hits = gpu_verify;
    TieredKVCacheManager t(c, host_config(64, HostPolicy::kWriteBack));
    RequestHashKeys keys;
    keys.lora_name = "adapter";
    host_only(t, tokens(0, 17), 6, keys);  // 4 full blocks, stored to the host as evicted
    EXPECT_GE(t.stats().stored_blocks, 4u);
    auto same = t.make_request(2, tokens(0, 17), keys);
    const TieredCacheHit hit = t.get_computed_blocks(same);
    EXPECT_EQ(hit.gpu.blocks.size(), 0u);
    EXPECT_EQ(hit.host_slots.size(), 4u);
    auto plain = t.make_request(3, tokens(0, 17));
    EXPECT_EQ(t.get_computed_blocks(plain).num_tokens(), 0u);
    // Loading it back and evicting it again stores nothing new: the host still holds it.
    admit(t, same);
    t.free(same);
    const std::uint64_t stored = t.stats().stored_blocks;
    flush_gpu(t, 200, 6);
    EXPECT_EQ(t.stats().stored_blocks, stored) << "blocks the host holds were stored again";
    auto again = t.make_request(4, tokens(0, 17), keys);
    EXPECT_EQ(t.get_computed_blocks(again).host_slots.size(), 4u);
    t.check_invariants();
  }
}

TEST(TieredKVCacheManager, BatchCommitCommitsEachIdOrNothing) {
  TieredKVCacheManager t(gpu_config(6), host_config(64, HostPolicy::kWriteBack));
  host_only(t, tokens(0, 17), 6);
  auto b = t.make_request(2, tokens(0, 17));
  const TieredCacheHit hit = t.get_computed_blocks(b);
  ASSERT_EQ(hit.host_slots.size(), 4u);
  auto alloc = t.allocate_slots(b, 1, hit);
  ASSERT_TRUE(alloc);
  commit_all(t, alloc->transfers.eviction_ids);
  std::vector<TransferId> ids = alloc->transfers.load_ids;
  ASSERT_EQ(ids.size(), 4u);
  // An id twice, an unknown id: refused, nothing committed.
  std::vector<TransferId> twice = {ids[0], ids[1], ids[0]};
  expect_rejected(
      t, [&] { t.commit(std::span<const TransferId>(twice), true); }, "given twice");
  std::vector<TransferId> unknown = {ids[2], ids[3] + (1ull << 32)};
  expect_rejected(
      t, [&] { t.commit(std::span<const TransferId>(unknown), true); }, "unknown");
  EXPECT_EQ(t.num_in_flight(), 4u);
  // Hooks run once every copy is committed, in order.
  std::vector<BlockId> loaded;
  HostTierHooks hooks;
  hooks.on_loaded = [&](BlockId slot) {
    EXPECT_EQ(t.num_in_flight(), 1u);  // ids[3] is committed by the next call, not this one
    loaded.push_back(slot);
  };
  t.set_host_hooks(hooks);
  t.commit(std::span<const TransferId>(ids).first(3), true);
  EXPECT_EQ(loaded, std::vector<BlockId>(hit.host_slots.begin(), hit.host_slots.begin() + 3));
  loaded.clear();
  hooks.on_loaded = [&](BlockId slot) { loaded.push_back(slot); };
  t.set_host_hooks(hooks);
  t.commit(std::span<const TransferId>(ids).subspan(3), false);  // the last load failed
  EXPECT_TRUE(loaded.empty());
  EXPECT_EQ(t.stats().load_failures, 1u);
  expect_rejected(
      t, [&] { t.commit(std::span<const TransferId>(ids).first(1), true); }, "already committed");
  const LoadResult res = t.finish_loads(b);
  EXPECT_TRUE(res.rolled_back);
  EXPECT_EQ(res.num_computed_tokens, 3 * kB);
  t.check_invariants();
}

// A request belongs to the tier whose allocate_slots first took it. Another tier (configured
// the same way, holding its own request of the same id with loads in flight) refuses every call
// with it while its loads are in flight, before touching either tier's state; the owner then
// commits, finishes, frees, gets every block back and reuses the id. Before the check, b.free(r)
// marked r finished: a could then neither finish its loads nor free r, and its blocks and pinned
// host slots stayed taken.
TEST(TieredKVCacheManager, AnotherTiersRequestIsRefusedWhileItsLoadsAreInFlight) {
  TieredKVCacheManager a(gpu_config(8), host_config(64));
  TieredKVCacheManager b(gpu_config(8), host_config(64));
  host_only(a, tokens(0, 17), 8);
  host_only(b, tokens(0, 17), 8);
  auto r = a.make_request(2, tokens(0, 17));
  const TieredCacheHit hit = a.get_computed_blocks(r);
  ASSERT_EQ(hit.host_slots.size(), 4u);
  const auto alloc = a.allocate_slots(r, 1, hit);
  ASSERT_TRUE(alloc);
  ASSERT_EQ(alloc->transfers.load_ids.size(), 4u);
  auto own = b.make_request(2, tokens(0, 17));  // b's own request 2, loading too
  const TieredCacheHit own_hit = b.get_computed_blocks(own);
  const auto own_alloc = b.allocate_slots(own, 1, own_hit);
  ASSERT_TRUE(own_alloc);
  ASSERT_TRUE(b.has_unfinished_loads(2));

  const TieredSnapshot a_before = a.snapshot();
  const std::string foreign = "request 2 belongs to another manager";
  expect_rejected(
      b, [&] { b.free(r); }, "free: " + foreign);
  expect_rejected(
      b, [&] { b.preempt(r); }, "preempt: " + foreign);
  expect_rejected(
      b, [&] { (void)b.finish_loads(r); }, "finish_loads: " + foreign);
  expect_rejected(
      b, [&] { (void)b.allocate_slots(r, 1); }, "allocate_slots: " + foreign);
  expect_rejected(
      b, [&] { (void)b.get_computed_blocks(r); }, "get_computed_blocks: " + foreign);
  expect_rejected(
      b, [&] { (void)b.local_prefix_blocks(r); }, "local_prefix_blocks: " + foreign);
  expect_rejected(
      b, [&] { (void)b.host_holds(r, 0); }, "host_holds: " + foreign);
  expect_rejected(
      b, [&] { (void)b.begin_fill(r, 0); }, "begin_fill: " + foreign);
  EXPECT_FALSE(r.is_finished());
  EXPECT_EQ(a.snapshot(), a_before);

  // The owner goes on as if nothing happened.
  commit_all(a, alloc->transfers.load_ids);
  const LoadResult res = a.finish_loads(r);
  EXPECT_FALSE(res.rolled_back);
  EXPECT_EQ(res.num_computed_tokens, 16u);
  commit_all(a, res.transfers.store_ids);
  commit_all(a, alloc->transfers.store_ids);
  a.free(r);
  EXPECT_TRUE(r.is_finished());
  EXPECT_EQ(a.gpu().num_requests(), 0u);
  EXPECT_EQ(a.num_in_flight(), 0u);
  EXPECT_EQ(a.gpu().block_pool().num_free_blocks(), 7);
  EXPECT_EQ(a.stats().host_slots_pinned, 0);
  a.check_invariants();
  auto again = a.make_request(2, tokens(0, 17));  // the id is free again
  admit(a, again);
  a.free(again);
  a.check_invariants();

  // So does the other tier with its own request.
  commit_all(b, own_alloc->transfers.load_ids);
  EXPECT_FALSE(b.finish_loads(own).rolled_back);
  b.free(own);
  EXPECT_EQ(b.num_in_flight(), 0u);
  EXPECT_EQ(b.gpu().num_requests(), 0u);
  b.check_invariants();
}

}  // namespace
}  // namespace pagedkv
