#include "pagedkv/manager/kv_cache_manager.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "test_tokens.hpp"

namespace pagedkv {
namespace {

constexpr std::uint32_t kB = 4;

KVCacheManagerConfig config(std::int32_t num_blocks) {
  KVCacheManagerConfig c;
  c.num_blocks = num_blocks;
  c.block_size = kB;
  c.hash_seed = "test";
  c.enable_kv_events = true;
  return c;
}

// Schedules a whole prompt: hit lookup, then one allocation for the rest.
std::optional<CacheHit> admit(KVCacheManager& m, Request& r) {
  CacheHit hit = m.get_computed_blocks(r);
  const auto blocks = m.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit);
  if (!blocks) return std::nullopt;
  r.set_num_computed_tokens(r.num_tokens());
  return hit;
}

template <typename Call>
void expect_rejected(KVCacheManager& m, Call call, const std::string& fragment) {
  const KVCacheManagerSnapshot before = m.snapshot();
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_EQ(m.snapshot(), before) << "state changed by a rejected call";
  m.check_invariants();
}

TEST(KVCacheManager, HitIsCappedAtNumTokensMinusOne) {
  KVCacheManager m(config(32));
  auto a = m.make_request(1, iota_tokens(0, 12));  // exactly 3 full blocks
  ASSERT_TRUE(admit(m, a));
  m.free(a);
  auto b = m.make_request(2, iota_tokens(0, 12));
  const CacheHit hit = m.get_computed_blocks(b);
  EXPECT_EQ(hit.blocks.size(), 2u);  // the last block is recomputed for the last token's logits
  EXPECT_EQ(hit.num_tokens, 8u);
  auto c = m.make_request(3, iota_tokens(0, 13));
  EXPECT_EQ(m.get_computed_blocks(c).blocks.size(), 3u);
  auto d = m.make_request(4, iota_tokens(0, 1));
  EXPECT_TRUE(m.get_computed_blocks(d).blocks.empty());
}

TEST(KVCacheManager, AllocateHitFreeCycle) {
  KVCacheManager m(config(16));
  auto a = m.make_request(1, iota_tokens(0, 10));
  const auto blocks = m.allocate_slots(a, 10);
  ASSERT_TRUE(blocks);
  EXPECT_EQ(std::vector<BlockId>(blocks->begin(), blocks->end()), (std::vector<BlockId>{1, 2, 3}));
  EXPECT_EQ(std::vector<BlockId>(m.block_ids(1).begin(), m.block_ids(1).end()),
            (std::vector<BlockId>{1, 2, 3}));
  a.set_num_computed_tokens(10);
  m.check_invariants();

  auto b = m.make_request(2, iota_tokens(0, 11));
  const CacheHit hit = m.get_computed_blocks(b);
  EXPECT_EQ(hit.blocks, (std::vector<BlockId>{1, 2}));
  const auto nb = m.allocate_slots(b, 3, hit);
  ASSERT_TRUE(nb);
  EXPECT_EQ(std::vector<BlockId>(nb->begin(), nb->end()), (std::vector<BlockId>{4}));
  EXPECT_EQ(m.block_pool().block(1).ref_cnt, 2);
  EXPECT_EQ(m.num_common_prefix_blocks(1), 2u);
  EXPECT_EQ(m.num_requests(), 2u);
  m.check_invariants();

  m.free(a);
  m.free(b);
  EXPECT_EQ(m.num_requests(), 0u);
  EXPECT_DOUBLE_EQ(m.usage(), 0.0);
  m.check_invariants();
  const PrefixCacheStats s = m.stats();
  EXPECT_EQ(s.requests, 1u);  // only b looked up the cache
  EXPECT_EQ(s.queries, 11u);
  EXPECT_EQ(s.hits, 8u);
}

TEST(KVCacheManager, FailedAllocationChangesNothing) {
  KVCacheManager m(config(6));  // 5 usable blocks
  auto a = m.make_request(1, iota_tokens(0, 12));
  ASSERT_TRUE(admit(m, a));
  m.free(a);                                         // blocks 1..3 cached and free
  auto big = m.make_request(2, iota_tokens(0, 29));  // hits 3 blocks, needs 5 more
  const CacheHit hit = m.get_computed_blocks(big);
  ASSERT_EQ(hit.blocks.size(), 3u);
  // 3 free hits (touching consumes free capacity) + 5 new > 5 free.
  const auto before = m.snapshot();
  EXPECT_FALSE(m.allocate_slots(big, 29 - 12, hit).has_value());
  EXPECT_EQ(m.snapshot(), before);
  m.check_invariants();
  // It fits without the tail: 3 hits + 2 new = 5.
  EXPECT_TRUE(m.allocate_slots(big, 8, hit).has_value());
  m.check_invariants();
}

TEST(KVCacheManager, SameSaltHitsOtherSaltNever) {
  KVCacheManager m(config(32));
  RequestHashKeys alice, bob;
  alice.cache_salt = "alice";
  bob.cache_salt = "bob";
  auto a = m.make_request(1, iota_tokens(0, 20), alice);
  ASSERT_TRUE(admit(m, a));
  auto a2 = m.make_request(2, iota_tokens(0, 20), alice);
  EXPECT_EQ(m.get_computed_blocks(a2).blocks.size(), 4u);
  auto b = m.make_request(3, iota_tokens(0, 20), bob);
  EXPECT_TRUE(m.get_computed_blocks(b).blocks.empty());
  auto plain = m.make_request(4, iota_tokens(0, 20));
  EXPECT_TRUE(m.get_computed_blocks(plain).blocks.empty());
}

TEST(KVCacheManager, DecodedTokensAreHashedAndCachedWhenTheirBlockFills) {
  KVCacheManager m(config(32));
  auto a = m.make_request(1, iota_tokens(0, 6));
  ASSERT_TRUE(m.allocate_slots(a, 6));
  a.set_num_computed_tokens(6);
  EXPECT_EQ(a.block_hashes().size(), 1u);
  for (TokenId t : {6, 7, 8}) {  // decode: one token per step
    a.append_token(t);
    ASSERT_TRUE(m.allocate_slots(a, 1));
    a.set_num_computed_tokens(a.num_tokens());
  }
  EXPECT_EQ(a.block_hashes().size(), 2u);
  m.free(a);
  auto b = m.make_request(2, iota_tokens(0, 9));
  EXPECT_EQ(m.get_computed_blocks(b).num_tokens, 8u);  // both blocks, including the decoded one
}

TEST(KVCacheManager, LookaheadSlotsAreAllocatedButNeverCached) {
  KVCacheManager m(config(32));
  auto a = m.make_request(1, iota_tokens(0, 8));
  const auto blocks = m.allocate_slots(a, 8, {}, /*num_lookahead_tokens=*/5);
  ASSERT_TRUE(blocks);
  EXPECT_EQ(blocks->size(), 4u);  // ceil(13 / 4)
  EXPECT_TRUE(m.block_pool().block((*blocks)[1]).is_cached());
  EXPECT_FALSE(m.block_pool().block((*blocks)[2]).is_cached());
  EXPECT_FALSE(m.block_pool().block((*blocks)[3]).is_cached());
}

TEST(KVCacheManager, ResetOnlyWhenIdle) {
  KVCacheManager m(config(16));
  auto a = m.make_request(1, iota_tokens(0, 9));
  ASSERT_TRUE(admit(m, a));
  EXPECT_FALSE(m.reset_prefix_cache());
  m.free(a);
  EXPECT_TRUE(m.reset_prefix_cache());
  auto b = m.make_request(2, iota_tokens(0, 9));
  EXPECT_TRUE(m.get_computed_blocks(b).blocks.empty());
  m.check_invariants();
}

TEST(KVCacheManager, PreemptReleasesAndAllowsRescheduling) {
  KVCacheManager m(config(16));
  auto a = m.make_request(1, iota_tokens(0, 9));
  ASSERT_TRUE(admit(m, a));
  m.preempt(a);
  EXPECT_EQ(a.num_computed_tokens(), 0u);
  EXPECT_EQ(m.num_requests(), 0u);
  const auto hit = admit(m, a);  // rescheduled: its own cached blocks are hits now
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->blocks.size(), 2u);
  m.check_invariants();
}

TEST(KVCacheManager, BadInputIsRejectedWithStateUnchanged) {
  KVCacheManager m(config(16));
  auto a = m.make_request(1, iota_tokens(0, 9));
  ASSERT_TRUE(admit(m, a));
  auto b = m.make_request(2, iota_tokens(0, 9));
  const CacheHit hit = m.get_computed_blocks(b);
  ASSERT_EQ(hit.blocks.size(), 2u);

  expect_rejected(
      m, [&] { (void)m.allocate_slots(b, 0, hit); }, "greater than 0");
  expect_rejected(
      m, [&] { (void)m.allocate_slots(b, 9, hit); }, "exceed");
  CacheHit bad = hit;
  bad.num_tokens = 5;
  expect_rejected(
      m, [&] { (void)m.allocate_slots(b, 1, bad); }, "num_tokens");
  bad = hit;
  bad.blocks[1] = 99;
  bad.num_tokens = 8;
  expect_rejected(
      m, [&] { (void)m.allocate_slots(b, 1, bad); }, "out of range");
  bad.blocks[1] = 3;  // a real block, but not the one caching b's block 1
  expect_rejected(
      m, [&] { (void)m.allocate_slots(b, 1, bad); }, "stale cache hit");
  expect_rejected(
      m, [&] { (void)m.allocate_slots(a, 1, hit); }, "first allocation");
  expect_rejected(
      m, [&] { m.preempt(b); }, "unknown");
  expect_rejected(
      m, [&] { (void)m.block_ids(2); }, "unknown");
  auto foreign = Request(3, BlockHasher(HashScheme::kSha256, "other seed"), kB, iota_tokens(0, 9));
  expect_rejected(
      m, [&] { (void)m.allocate_slots(foreign, 9); }, "hashed with a different");
  expect_rejected(
      m, [&] { (void)m.get_computed_blocks(foreign); }, "hashed with a different");

  m.free(a);
  expect_rejected(
      m, [&] { m.free(a); }, "already freed");
  expect_rejected(
      m, [&] { (void)m.allocate_slots(a, 1); }, "already freed");
  expect_rejected(
      m, [&] { (void)m.get_computed_blocks(a); }, "already freed");
  EXPECT_THROW(a.set_num_computed_tokens(10), Error);

  KVCacheManagerConfig xxh = config(8);
  xxh.hash_scheme = HashScheme::kXxh3_128;
  xxh.verify_cache_hits = false;
  EXPECT_THROW(KVCacheManager{xxh}, Error);
  // The same through a hasher the caller built (hasher overrides hash_scheme): refused too.
  KVCacheManagerConfig custom = config(8);
  custom.hasher = BlockHasher(HashScheme::kXxh3_128, "seed");
  custom.verify_cache_hits = false;
  EXPECT_THROW(KVCacheManager{custom}, Error);
  custom.verify_cache_hits = true;
  EXPECT_NO_THROW(KVCacheManager{custom});
  // A weak test hasher may run without verification (wrong hits on purpose).
  custom.hasher = BlockHasher::weak_for_testing(HashScheme::kXxh3_128, "seed", 8);
  custom.verify_cache_hits = false;
  EXPECT_NO_THROW(KVCacheManager{custom});
}

// xxh3_128 pools guard their chain hashes (no content-id table) when every group is full
// attention of the pool's block size; the SHA-256 schemes trust theirs; a weak test hasher and
// sliding-window groups keep content ids.
TEST(KVCacheManager, PoolIdentityFollowsTheHashAndTheGroups) {
  const auto identity = [](const KVCacheManagerConfig& c) {
    const KVCacheManager m(c);
    const BlockPoolConfig& p = m.block_pool().config();
    return std::pair<bool, bool>{p.chain_hashes_identify_prefix, p.guard_chain_hashes};
  };
  KVCacheManagerConfig c = config(16);
  EXPECT_EQ(identity(c), (std::pair<bool, bool>{true, false}));
  c.hash_scheme = HashScheme::kXxh3_128;
  EXPECT_EQ(identity(c), (std::pair<bool, bool>{false, true}));
  KVCacheManagerConfig two = c;
  two.groups = {AttentionSpec::full(kB), AttentionSpec::full(kB)};
  EXPECT_EQ(identity(two), (std::pair<bool, bool>{false, true}));
  KVCacheManagerConfig window = c;
  window.groups = {AttentionSpec::full(kB), AttentionSpec::sliding(kB, 5)};
  EXPECT_EQ(identity(window), (std::pair<bool, bool>{false, false}));
  KVCacheManagerConfig sizes = c;
  sizes.groups = {AttentionSpec::full(kB), AttentionSpec::full(2 * kB)};
  EXPECT_EQ(identity(sizes), (std::pair<bool, bool>{false, false}));
  KVCacheManagerConfig weak = c;
  weak.hasher = BlockHasher::weak_for_testing(HashScheme::kXxh3_128, "w", 4);
  EXPECT_EQ(identity(weak), (std::pair<bool, bool>{false, false}));
}

TEST(KVCacheManager, EventsAndStatsThroughAWholeWorkload) {
  KVCacheManager m(config(5));  // 4 usable blocks
  auto a = m.make_request(1, iota_tokens(0, 8));
  ASSERT_TRUE(admit(m, a));
  m.free(a);
  auto b = m.make_request(2, iota_tokens(100, 16));  // needs all 4 blocks: evicts a's 2
  ASSERT_TRUE(admit(m, b));
  m.free(b);
  const auto events = m.take_events();
  ASSERT_EQ(events.size(), 4u);  // stored(a), removed, removed, stored(b)
  for (std::size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].seq, i);
  EXPECT_TRUE(std::holds_alternative<BlockStored>(events[0].data));
  // a's chain tail (block 2) is evicted before its head (block 1).
  EXPECT_EQ(std::get<BlockRemoved>(events[1].data).block_hashes[0], a.block_hashes()[1]);
  EXPECT_EQ(std::get<BlockRemoved>(events[2].data).block_hashes[0], a.block_hashes()[0]);
  EXPECT_EQ(std::get<BlockStored>(events[3].data).block_hashes.size(), 4u);
  const PrefixCacheStats s = m.stats();
  EXPECT_EQ(s.requests, 2u);
  EXPECT_EQ(s.queries, 24u);
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.evictions, 2u);
}

TEST(KVCacheManager, CachingDisabled) {
  KVCacheManagerConfig c = config(16);
  c.enable_caching = false;
  KVCacheManager m(c);
  auto a = m.make_request(1, iota_tokens(0, 9));
  ASSERT_TRUE(admit(m, a));
  m.free(a);
  auto b = m.make_request(2, iota_tokens(0, 9));
  EXPECT_TRUE(m.get_computed_blocks(b).blocks.empty());
  EXPECT_TRUE(m.take_events().empty());
  EXPECT_FALSE(m.block_pool().block(1).is_cached());
  m.check_invariants();
}

// vLLM hits A and B when A was evicted (B stayed cached) and a later request recomputed A into
// another block: B's stored parent identity is content, not the evicted physical block.
TEST(KVCacheManager, ChildOfARecomputedParentIsStillAHit) {
  for (const HashScheme scheme : {HashScheme::kSha256, HashScheme::kXxh3_128}) {
    KVCacheManagerConfig c = config(16);
    c.hash_scheme = scheme;
    KVCacheManager m(c);
    Request a = m.make_request(1, iota_tokens(0, 9));  // blocks A, B + 1 token
    ASSERT_TRUE(admit(m, a));
    const BlockId block_a = m.block_ids(1)[0];
    const BlockId block_b = m.block_ids(1)[1];
    m.free(a);
    ASSERT_EQ(m.evict_blocks(std::vector<BlockId>{block_a}), 1u);
    Request b = m.make_request(2, iota_tokens(0, 5));  // recomputes A
    ASSERT_TRUE(admit(m, b));
    EXPECT_EQ(m.get_computed_blocks(m.make_request(9, iota_tokens(0, 5))).num_tokens, 4u);
    m.free(b);
    Request c3 = m.make_request(3, iota_tokens(0, 9));
    const CacheHit hit = m.get_computed_blocks(c3);
    EXPECT_EQ(hit.num_tokens, 8u) << to_string(scheme);
    ASSERT_EQ(hit.blocks.size(), 2u);
    EXPECT_NE(hit.blocks[0], block_a);
    EXPECT_EQ(hit.blocks[1], block_b);
    m.check_invariants();
  }
}

TEST(KVCacheManager, ResetKeepsCumulativeStatsMonotonic) {
  KVCacheManager m(config(16));
  Request a = m.make_request(1, iota_tokens(0, 9));
  ASSERT_TRUE(admit(m, a));
  m.free(a);
  Request b = m.make_request(2, iota_tokens(0, 9));
  ASSERT_TRUE(admit(m, b));
  m.free(b);
  const PrefixCacheStats before = m.stats();
  ASSERT_EQ(before.requests, 2u);
  ASSERT_EQ(before.hits, 8u);
  ASSERT_TRUE(m.reset_prefix_cache());
  const PrefixCacheStats after = m.stats();
  EXPECT_EQ(after.requests, before.requests);
  EXPECT_EQ(after.queries, before.queries);
  EXPECT_EQ(after.hits, before.hits);
  EXPECT_EQ(after.evictions, before.evictions);
  EXPECT_EQ(after.recent_requests, 0u);  // only the hit-rate window restarts
  EXPECT_EQ(after.recent_hit_rate, 0.0);
}

TEST(KVCacheManager, ALiveIdUnderAnotherRequestIsRefused) {
  KVCacheManager m(config(16));
  Request a = m.make_request(1, iota_tokens(0, 9));
  ASSERT_TRUE(admit(m, a));
  Request impostor = m.make_request(1, iota_tokens(100, 9));
  Request copy = a;  // a copy is another Request too
  for (Request* r : {&impostor, &copy}) {
    expect_rejected(
        m, [&] { (void)m.allocate_slots(*r, 1); }, "another Request");
    expect_rejected(
        m, [&] { (void)m.get_computed_blocks(*r); }, "another Request");
    expect_rejected(
        m, [&] { m.free(*r); }, "another Request");
    expect_rejected(
        m, [&] { m.preempt(*r); }, "another Request");
  }
  m.free(a);
  // Once the id is free, a new Request may use it.
  EXPECT_TRUE(admit(m, impostor));
  m.free(impostor);
  m.check_invariants();
}

TEST(KVCacheManager, FreeingARequestThatHoldsNoBlocksIsANoOp) {
  KVCacheManager m(config(16));
  Request waiting = m.make_request(1, iota_tokens(0, 9));
  const KVCacheManagerSnapshot before = m.snapshot();
  m.free(waiting);  // aborted before it was ever scheduled
  EXPECT_EQ(m.snapshot(), before);
  EXPECT_TRUE(waiting.is_finished());
  expect_rejected(
      m, [&] { m.free(waiting); }, "already freed");
  // Preempted, then aborted while waiting: the same.
  Request r = m.make_request(2, iota_tokens(0, 9));
  ASSERT_TRUE(admit(m, r));
  m.preempt(r);
  m.free(r);
  EXPECT_TRUE(r.is_finished());
  EXPECT_EQ(m.num_requests(), 0u);
  m.check_invariants();
}

TEST(KVCacheManager, CountsThatWouldOverflowAreErrors) {
  KVCacheManager m(config(16));
  Request a = m.make_request(1, iota_tokens(0, 9));
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  expect_rejected(
      m, [&] { (void)m.allocate_slots(a, 5, {}, kMax); }, "overflow");
  expect_rejected(
      m, [&] { (void)m.allocate_slots(a, 5, {}, kMax - 4); }, "overflow");
  expect_rejected(
      m, [&] { (void)m.allocate_slots(a, kMax); }, "exceed");
  ASSERT_TRUE(m.allocate_slots(a, 5));
  a.set_num_computed_tokens(5);
  expect_rejected(
      m, [&] { (void)m.allocate_slots(a, kMax - 2); }, "exceed");
  expect_rejected(
      m, [&] { (void)m.allocate_slots(a, 4, {}, kMax - 8); }, "overflow");
  // A huge but representable lookahead simply does not fit.
  EXPECT_FALSE(m.allocate_slots(a, 4, {}, kMax / 2).has_value());
  m.check_invariants();
}

TEST(KVCacheManager, AppendingARequestsOwnTokensWorks) {
  KVCacheManager m(config(16));
  Request a = m.make_request(1, iota_tokens(0, 6));
  a.append_tokens(a.tokens());  // aliases the request's own storage
  a.append_tokens(a.tokens().subspan(2, 3));
  std::vector<TokenId> want = iota_tokens(0, 6);
  const std::vector<TokenId> first = want;
  want.insert(want.end(), first.begin(), first.end());
  want.insert(want.end(), want.begin() + 2, want.begin() + 5);
  EXPECT_EQ(std::vector<TokenId>(a.tokens().begin(), a.tokens().end()), want);
  const Request b = m.make_request(2, want);
  EXPECT_EQ(std::vector<BlockHash>(a.block_hashes().begin(), a.block_hashes().end()),
            std::vector<BlockHash>(b.block_hashes().begin(), b.block_hashes().end()));
}

// Two groups of block size 1 and a lookahead up to SIZE_MAX slots: the blocks needed saturate,
// and the hit blocks waiting in the free queue added after that must not wrap the count back to
// a small number (found by review: the capacity check passed and a reserve threw
// std::length_error). It simply does not fit.
TEST(KVCacheManager, SaturatedBlockCountPlusFreeHitsDoesNotFit) {
  KVCacheManagerConfig c;
  c.num_blocks = 32;
  c.groups = {AttentionSpec::full(1), AttentionSpec::full(1)};
  KVCacheManager m(c);
  Request a = m.make_request(1, iota_tokens(0, 5));
  ASSERT_TRUE(m.allocate_slots(a, 5, m.get_computed_blocks(a)).has_value());
  a.set_num_computed_tokens(5);
  m.free(a);
  Request b = m.make_request(2, iota_tokens(0, 8));
  const CacheHit hit = m.get_computed_blocks(b);
  ASSERT_EQ(hit.num_tokens, 5u);  // its blocks wait in the free queue (ref count 0)
  const KVCacheManagerSnapshot before = m.snapshot();
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  std::optional<std::span<const BlockId>> got;
  EXPECT_NO_THROW(got = m.allocate_slots(b, 3, hit, kMax - 8));
  EXPECT_FALSE(got.has_value());
  EXPECT_EQ(m.snapshot(), before);
  m.check_invariants();
}

// A hash that collides (a 1-bit test hasher; xxh3_128 for an adversary): request B looks up A's
// cached block X, then request C's allocation evicts X and caches in it a first block whose hash
// collides with A's. B's hit still names a block with the right hash, but X no longer holds B's
// prefix: allocate_slots must refuse it as stale (found by review: it checked the hash alone and
// B would have shared C's K/V), and change nothing.
TEST(KVCacheManager, HitBlockEvictedAndReCachedUnderACollidingHashIsStale) {
  KVCacheManagerConfig c;
  c.num_blocks = 2;  // one usable block: X
  c.block_size = kB;
  c.hasher = BlockHasher::weak_for_testing(HashScheme::kXxh3_128, "stale-collision", 1);
  KVCacheManager m(c);
  const std::vector<TokenId> a = iota_tokens(0, kB);
  // C's first block: other tokens, the same (1-bit) hash.
  std::vector<TokenId> other;
  for (TokenId base = 1000;; base += 100) {
    other = iota_tokens(base, kB);
    if (c.hasher->hash_block(c.hasher->none_hash(), other) ==
        c.hasher->hash_block(c.hasher->none_hash(), a)) {
      break;
    }
  }
  Request ra = m.make_request(1, a);
  ASSERT_TRUE(admit(m, ra).has_value());
  m.free(ra);  // X cached, in the free queue
  std::vector<TokenId> b = a;
  b.push_back(7);
  Request rb = m.make_request(2, b);
  const CacheHit hit = m.get_computed_blocks(rb);
  ASSERT_EQ(hit.num_tokens, kB);
  Request rc = m.make_request(3, other);
  ASSERT_TRUE(admit(m, rc).has_value());  // evicts X and caches C's block in it
  ASSERT_EQ(hit.blocks, std::vector<BlockId>(m.block_ids(3).begin(), m.block_ids(3).end()));
  expect_rejected(
      m, [&] { (void)m.allocate_slots(rb, 1, hit); }, "stale cache hit");
  m.free(rc);
  // A fresh lookup finds nothing of B's now.
  EXPECT_EQ(m.get_computed_blocks(rb).num_tokens, 0u);
  m.check_invariants();
}

TEST(KVCacheManager, MultimodalItemWhoseEndOverflowsIsRejected) {
  KVCacheManager m(config(16));
  RequestHashKeys keys;
  keys.mm_items = {{"img", std::numeric_limits<std::int64_t>::max() - 2, 5}};
  EXPECT_THROW((void)m.make_request(1, iota_tokens(0, 8), keys), Error);
  keys.mm_items = {{"img", 2, std::numeric_limits<std::int64_t>::max()}};
  EXPECT_THROW((void)m.make_request(1, iota_tokens(0, 8), keys), Error);
}

// The sink runs once the manager's whole step is done: it may call const queries and finds the
// manager consistent, with each stored block cached and each removed block gone.
TEST(KVCacheManager, SinkSeesAConsistentManager) {
  KVCacheManager m(config(8));
  std::size_t events = 0;
  m.set_event_sink([&](const KVEvent&) {
    m.check_invariants();
    ++events;
  });
  for (RequestId id = 1; id <= 6; ++id) {
    Request r = m.make_request(id, iota_tokens(static_cast<TokenId>(id * 100), 13));
    ASSERT_TRUE(admit(m, r));
    m.free(r);
  }
  EXPECT_GT(events, 6u);
  EXPECT_TRUE(m.take_events().empty());
}

// delay_cache_blocks: the allocation caches nothing (its K/V arrives later); cache_blocks() then
// caches exactly the tokens the engine says are in place.
TEST(KVCacheManager, DelayCacheBlocksThenCacheBlocks) {
  KVCacheManager m(config(32));
  auto a = m.make_request(1, iota_tokens(0, 17));  // 4 full blocks + 1 token
  ASSERT_TRUE(m.allocate_slots(a, 17, {}, 0, /*delay_cache_blocks=*/true));
  for (const BlockId b : m.block_ids(1)) EXPECT_FALSE(m.block_pool().block(b).is_cached());
  auto probe = m.make_request(2, iota_tokens(0, 17));
  EXPECT_EQ(m.get_computed_blocks(probe).num_tokens, 0u);
  (void)m.take_events();

  m.cache_blocks(a, 9);  // blocks 0 and 1 hold K/V; block 2 does not
  EXPECT_EQ(m.get_computed_blocks(probe).num_tokens, 8u);
  m.check_invariants();
  m.cache_blocks(a, 9);  // idempotent
  m.cache_blocks(a, 17);
  EXPECT_EQ(m.get_computed_blocks(probe).num_tokens, 16u);
  m.check_invariants();
  const auto events = m.take_events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(std::get<BlockStored>(events[0].data).block_hashes.size(), 2u);
  EXPECT_EQ(std::get<BlockStored>(events[0].data).medium, "GPU");

  expect_rejected(
      m, [&] { m.cache_blocks(a, 18); }, "exceed");
  expect_rejected(
      m, [&] { m.cache_blocks(probe, 4); }, "unknown");
  auto c = m.make_request(3, iota_tokens(100, 8));
  ASSERT_TRUE(m.allocate_slots(c, 4, {}, 0, true));
  expect_rejected(
      m, [&] { m.cache_blocks(c, 8); }, "allocated slots");
  m.free(a);
  expect_rejected(
      m, [&] { m.cache_blocks(a, 4); }, "freed");
}

// A request belongs to the manager whose allocate_slots first took it. Another manager (hashing
// the same way, so nothing else tells them apart) refuses every call with it and changes nothing,
// in either manager: the owner can still preempt and free it, its blocks return and the id is
// reusable. Before the check, b.free(r) marked r finished, so a.free(r) failed and a's blocks
// leaked with the id taken.
TEST(KVCacheManager, AnotherManagersRequestIsRefusedAndTheOwnerKeepsIt) {
  KVCacheManager a(config(16));
  KVCacheManager b(config(16));
  auto r = a.make_request(1, iota_tokens(0, 10));
  ASSERT_TRUE(admit(a, r));
  auto own = b.make_request(1, iota_tokens(50, 6));  // b's own request with the same id
  ASSERT_TRUE(admit(b, own));
  const KVCacheManagerSnapshot a_before = a.snapshot();
  const std::string foreign = "request 1 belongs to another manager";
  expect_rejected(
      b, [&] { b.free(r); }, "free: " + foreign);
  expect_rejected(
      b, [&] { b.preempt(r); }, "preempt: " + foreign);
  expect_rejected(
      b, [&] { (void)b.allocate_slots(r, 1); }, "allocate_slots: " + foreign);
  expect_rejected(
      b, [&] { (void)b.get_computed_blocks(r); }, "get_computed_blocks: " + foreign);
  expect_rejected(
      b, [&] { b.cache_blocks(r, 4); }, "cache_blocks: " + foreign);
  EXPECT_FALSE(r.is_finished());
  EXPECT_EQ(r.num_computed_tokens(), 10u);
  EXPECT_EQ(a.snapshot(), a_before);

  // Preempted, it is still a's: b cannot take it up.
  a.preempt(r);
  expect_rejected(
      b, [&] { (void)b.allocate_slots(r, 10); }, "allocate_slots: " + foreign);
  expect_rejected(
      b, [&] { b.free(r); }, "free: " + foreign);
  ASSERT_TRUE(admit(a, r));
  r.append_token(7);
  ASSERT_TRUE(a.allocate_slots(r, 1));
  a.free(r);
  EXPECT_TRUE(r.is_finished());
  EXPECT_EQ(a.num_requests(), 0u);
  EXPECT_EQ(a.block_pool().num_free_blocks(), 15);  // every block back (the null block aside)
  a.check_invariants();
  auto again = a.make_request(1, iota_tokens(0, 10));  // the id is free again
  EXPECT_TRUE(admit(a, again));
  a.free(again);

  // b's own request was never touched.
  b.free(own);
  EXPECT_EQ(b.num_requests(), 0u);
  EXPECT_EQ(b.block_pool().num_free_blocks(), 15);
  b.check_invariants();

  // Until its first allocation a request belongs to no manager (made by a, run by b: a cluster
  // routing requests), then to that one; a copy belongs to none.
  auto routed = a.make_request(2, iota_tokens(0, 9));
  ASSERT_TRUE(admit(b, routed));
  expect_rejected(
      a, [&] { a.free(routed); }, "free: request 2 belongs to another manager");
  Request copy(routed);
  expect_rejected(
      b, [&] { (void)b.allocate_slots(copy, 1); }, "live under another Request");
  b.free(routed);
  copy.set_num_computed_tokens(0);
  ASSERT_TRUE(admit(a, copy));
  a.free(copy);
  a.check_invariants();
  b.check_invariants();
}

// A request that fails to fit stays unowned: the scheduler may offer it to another manager, and
// from then on only that one takes it.
TEST(KVCacheManager, ARequestThatDoesNotFitBelongsToNoManager) {
  KVCacheManager small(config(3));
  KVCacheManager big(config(16));
  auto r = small.make_request(1, iota_tokens(0, 12));
  EXPECT_FALSE(small.allocate_slots(r, 12));
  ASSERT_TRUE(admit(big, r));
  expect_rejected(
      small, [&] { small.free(r); }, "free: request 1 belongs to another manager");
  expect_rejected(
      small, [&] { (void)small.allocate_slots(r, 1); }, "belongs to another manager");
  big.free(r);
  EXPECT_EQ(big.num_requests(), 0u);
  big.check_invariants();
}

// Every group spec is checked before any arithmetic on it: a zero block size in a later group
// (the smallest size then is 0: it used to divide by it), an attention kind cast from an int
// outside the enum (it used to run as a sliding window of 0 tokens), and block sizes whose least
// common multiple overflows 64 bits (std::lcm's result was then undefined).
TEST(KVCacheManager, MalformedGroupSpecsAreRejected) {
  const auto expect_invalid = [](std::vector<AttentionSpec> groups, const std::string& what) {
    KVCacheManagerConfig c = config(16);
    c.groups = std::move(groups);
    try {
      KVCacheManager m(c);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_invalid({AttentionSpec::full(16), AttentionSpec::full(0)}, "block size 0");
  expect_invalid({AttentionSpec::full(16), AttentionSpec::sliding(0, 8)}, "block size 0");
  AttentionSpec bad_kind = AttentionSpec::full(16);
  bad_kind.kind = static_cast<AttentionKind>(7);
  expect_invalid({bad_kind}, "attention kind 7");
  expect_invalid({AttentionSpec::full(16), bad_kind}, "attention kind 7");
  // Block sizes 1 and the primes up to 53: each is small, their product has 65 bits.
  std::vector<AttentionSpec> primes = {AttentionSpec::full(1)};
  for (const std::uint32_t p : {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53}) {
    primes.push_back(AttentionSpec::full(p));
  }
  expect_invalid(primes, "least common multiple");
  primes.pop_back();  // up to 47: 61 bits, fine
  KVCacheManagerConfig fits = config(16);
  fits.groups = primes;
  EXPECT_EQ(KVCacheManager(fits).block_size(), 1u);
}

}  // namespace
}  // namespace pagedkv
