// Retention priorities, expiry (a fake clock), the pin budget, wedge freedom and the eviction
// policies' order, on BlockPool directly.
#include <gtest/gtest.h>
#include <cstdio>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/hash/request_hasher.hpp"
#include "pagedkv/pool/block_pool.hpp"
#include "pagedkv/pool/eviction_policy.hpp"
#include "pagedkv/pool/retention.hpp"
#include "test_tokens.hpp"

namespace pagedkv {
namespace {

constexpr std::uint32_t kBlockSize = 4;

struct FakeClock {
  std::shared_ptr<RetentionTick> now = std::make_shared<RetentionTick>(0);
  RetentionClock fn() const {
    return [t = now] { return *t; };
  }
  void set(RetentionTick t) { *now = t; }
};

BlockPoolConfig config(std::int32_t n, EvictionPolicy policy = EvictionPolicy::kLru,
                       double budget = 1.0, RetentionClock clock = {}) {
  BlockPoolConfig c;
  c.num_blocks = n;
  c.block_size = kBlockSize;
  c.enable_kv_events = true;
  c.eviction_policy = policy;
  c.max_retained_fraction = budget;
  c.retention_clock = std::move(clock);
  return c;
}

// A one-block sequence per key.
RequestBlockHasher one_block(int key) {
  RequestBlockHasher seq(BlockHasher(HashScheme::kSha256, "test"), kBlockSize, {});
  seq.append(iota_tokens(key * 1000, kBlockSize));
  return seq;
}

// Allocates a block, caches key's content in it and returns it, held (ref 1).
BlockId store(BlockPool& pool, int key) {
  std::vector<BlockId> out;
  EXPECT_TRUE(pool.get_new_blocks(1, out));
  const auto seq = one_block(key);
  pool.cache_full_blocks(seq.sequence(), out, 0, 1);
  return out[0];
}

// Whether key's content is still cached.
bool cached(const BlockPool& pool, int key) {
  const auto seq = one_block(key);
  return pool.match_cached_block(seq.sequence(), 0, BlockPool::kNoBlock) != BlockPool::kNoBlock;
}

void free1(BlockPool& pool, BlockId id) {
  pool.free_blocks(std::vector<BlockId>{id});
}

void hit(BlockPool& pool, BlockId id) {
  pool.touch(std::vector<BlockId>{id});
  free1(pool, id);
}

// Allocates one block and returns the key whose content it evicted (-1: none cached was
// evicted); `keys` maps block ids to stored keys.
std::vector<BlockId> allocate(BlockPool& pool, std::int32_t n) {
  std::vector<BlockId> out;
  EXPECT_TRUE(pool.get_new_blocks(n, out));
  pool.check_invariants();
  return out;
}

template <typename Call>
void expect_rejected(BlockPool& pool, Call call, const std::string& fragment) {
  const BlockPoolSnapshot before = pool.snapshot();
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.snapshot(), before) << "state changed by a rejected call";
  pool.check_invariants();
}

TEST(EvictionPolicy, NamesRoundTripAndBadNamesAreNamed) {
  for (std::uint8_t i = 0; i < kNumEvictionPolicies; ++i) {
    const auto p = static_cast<EvictionPolicy>(i);
    EXPECT_EQ(parse_eviction_policy(to_string(p)), p);
  }
  EXPECT_EQ(to_string(EvictionPolicy::kLru), "lru");
  try {
    (void)parse_eviction_policy("lfu-ish");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kParseError);
    EXPECT_NE(std::string(e.what()).find("lfu-ish"), std::string::npos);
  }
}

TEST(Retention, ConfigIsValidated) {
  for (const double f : {-0.1, 1.5, std::nan("")}) {
    EXPECT_THROW(BlockPool(config(8, EvictionPolicy::kLru, f)), Error) << f;
  }
  BlockPoolConfig c = config(8);
  c.eviction_policy = static_cast<EvictionPolicy>(kNumEvictionPolicies);
  EXPECT_THROW(BlockPool{c}, Error);
  EXPECT_EQ(BlockPoolConfig{}.max_retained_fraction, 0.5);
  EXPECT_EQ(BlockPoolConfig{}.eviction_policy, EvictionPolicy::kLru);
}

TEST(Retention, LruPoolStartsWithoutRetentionState) {
  BlockPool pool(config(8));
  EXPECT_FALSE(pool.retention_active());
  const BlockId a = store(pool, 1);
  EXPECT_EQ(pool.retention(a), BlockRetention{});
  pool.set_retention(std::vector<BlockId>{a}, kDefaultRetentionPriority);  // changes nothing
  EXPECT_FALSE(pool.retention_active());
  const RetentionStats s = pool.retention_stats();
  EXPECT_EQ(s.by_class[1].blocks, 7);
  EXPECT_EQ(s.retained_budget, 7);
  pool.set_retention(std::vector<BlockId>{a}, 90);
  EXPECT_TRUE(pool.retention_active());
  EXPECT_EQ(pool.retention(a).priority, 90);
  EXPECT_TRUE(pool.free_queue().empty());
  pool.check_invariants();
}

TEST(Retention, ErrorsChangeNothing) {
  FakeClock clock;
  BlockPool pool(config(8, EvictionPolicy::kLru, 1.0, clock.fn()));
  const BlockId a = store(pool, 1);
  pool.set_retention(std::vector<BlockId>{a}, 60);
  expect_rejected(
      pool, [&] { pool.set_retention(std::vector<BlockId>{a}, 101); }, "priority 101");
  expect_rejected(
      pool, [&] { pool.set_retention(std::vector<BlockId>{a}, 90, 0); }, "duration 0");
  expect_rejected(
      pool,
      [&] {
        pool.set_retention(std::vector<BlockId>{a, 8}, 90);
      },
      "out of range");
  BlockPool no_clock(config(8));
  const BlockId b = store(no_clock, 1);
  expect_rejected(
      no_clock, [&] { no_clock.set_retention(std::vector<BlockId>{b}, 90, 10); },
      "retention_clock");
  EXPECT_THROW((void)pool.retention(-1), Error);
}

// The clock is a caller's callback: one that throws in set_retention() (the first ask of an LRU
// pool, with a duration) leaves the pool as it was. The pool used to move its free queue into
// the retention lists first and read the clock after, so a throw left it keeping retention
// state.
TEST(Retention, ThrowingClockInTheFirstAskChangesNothing) {
  auto fail = std::make_shared<bool>(false);
  BlockPool pool(config(8, EvictionPolicy::kLru, 1.0, [fail]() -> RetentionTick {
    if (*fail) throw std::runtime_error("clock failed");
    return 5;
  }));
  const BlockId a = store(pool, 1);
  pool.free_blocks(std::vector<BlockId>{a});
  const BlockPoolSnapshot before = pool.snapshot();
  *fail = true;
  EXPECT_THROW(pool.set_retention(std::vector<BlockId>{a}, 90, 10), std::runtime_error);
  EXPECT_FALSE(pool.retention_active());
  EXPECT_EQ(pool.snapshot(), before) << "state changed by a call whose clock threw";
  pool.check_invariants();
  *fail = false;
  pool.set_retention(std::vector<BlockId>{a}, 90, 10);
  EXPECT_EQ(pool.retention(a), (BlockRetention{90, 10, 15}));
  pool.check_invariants();
}

class EachPolicy : public ::testing::TestWithParam<EvictionPolicy> {};

// Below-default blocks go first, then default ones, then retained ones (lowest, then oldest):
// allocation never fails while blocks are free, whatever their priority.
TEST_P(EachPolicy, HigherPrioritiesAreEvictedLastAndThePoolNeverWedges) {
  BlockPool pool(config(7, GetParam()));
  std::vector<BlockId> ids;
  for (int k = 0; k < 6; ++k) ids.push_back(store(pool, k));
  pool.set_retention(std::vector<BlockId>{ids[0]}, 90);
  pool.set_retention(std::vector<BlockId>{ids[1]}, 60);
  pool.set_retention(std::vector<BlockId>{ids[2]}, 90);
  pool.set_retention(std::vector<BlockId>{ids[3]}, 10);
  // ids[4], ids[5]: default.
  for (const BlockId id : ids) free1(pool, id);
  pool.check_invariants();
  const std::vector<BlockId> order = allocate(pool, 6);
  EXPECT_EQ(order, (std::vector<BlockId>{ids[3], ids[4], ids[5], ids[1], ids[0], ids[2]}));
  const RetentionStats s = pool.retention_stats();
  EXPECT_EQ(s.by_class[0].evictions, 1u);
  EXPECT_EQ(s.by_class[1].evictions, 2u);
  EXPECT_EQ(s.by_class[2].evictions, 3u);
  EXPECT_EQ(s.forced_evictions, 3u);
  EXPECT_EQ(s.retained_blocks, 0);
  EXPECT_EQ(pool.num_evictions(), 6u);
}

// The eviction observer sees each victim's priority (a tier's minimum priority to store reads
// it there), whether get_new_blocks() or evict_blocks() evicts; afterwards it is the default.
TEST_P(EachPolicy, EvictionObserverSeesTheVictimsPriority) {
  struct Seen final : BlockPool::EvictionObserver {
    std::vector<std::pair<BlockId, RetentionPriority>> seen;
    void on_evict(const BlockPool& pool, BlockId id) noexcept override {
      seen.emplace_back(id, pool.retention(id).priority);
    }
  } observer;
  BlockPool pool(config(5, GetParam()));
  pool.set_eviction_observer(&observer);
  std::vector<BlockId> ids;
  for (int k = 0; k < 4; ++k) ids.push_back(store(pool, k));
  pool.set_retention(std::vector<BlockId>{ids[0]}, 90);
  pool.set_retention(std::vector<BlockId>{ids[1]}, 10);
  pool.set_retention(std::vector<BlockId>{ids[2]}, 60);
  for (const BlockId id : ids) free1(pool, id);
  (void)allocate(pool, 3);  // ids[1] (10), ids[3] (default), ids[2] (60)
  EXPECT_EQ(pool.evict_blocks(std::vector<BlockId>{ids[0]}), 1u);
  using P = std::pair<BlockId, RetentionPriority>;
  EXPECT_EQ(observer.seen,
            (std::vector<P>{
                {ids[1], 10}, {ids[3], kDefaultRetentionPriority}, {ids[2], 60}, {ids[0], 90}}));
  for (const BlockId id : ids) EXPECT_EQ(pool.retention(id).priority, kDefaultRetentionPriority);
  pool.check_invariants();
}

// A block shared by asks of different priorities keeps the highest.
TEST_P(EachPolicy, SharedBlockTakesTheHighestPriority) {
  BlockPool pool(config(8, GetParam()));
  const BlockId a = store(pool, 1);
  pool.set_retention(std::vector<BlockId>{a}, 80);
  pool.set_retention(std::vector<BlockId>{a}, 50);
  EXPECT_EQ(pool.retention(a).priority, 80);
  pool.set_retention(std::vector<BlockId>{a}, 90);
  EXPECT_EQ(pool.retention(a).priority, 90);
  pool.set_retention(std::vector<BlockId>{a}, 10);  // lower than 90: nothing
  EXPECT_EQ(pool.retention(a).priority, 90);
  const BlockId b = store(pool, 2);
  pool.set_retention(std::vector<BlockId>{b}, 10);  // nobody asked before: 10
  EXPECT_EQ(pool.retention(b).priority, 10);
  pool.set_retention(std::vector<BlockId>{b}, 20);
  EXPECT_EQ(pool.retention(b).priority, 20);
  pool.check_invariants();
}

// raise_to_default() lifts blocks below the default to it (no expiry; a free one to the default
// priority's most recently used end) and leaves the others alone; set_retention() with the
// default does not.
TEST_P(EachPolicy, RaiseToDefaultLiftsOnlyBlocksBelowIt) {
  FakeClock clock;
  BlockPool pool(config(8, GetParam(), 1.0, clock.fn()));
  const BlockId low = store(pool, 1);
  const BlockId timed = store(pool, 2);
  const BlockId high = store(pool, 3);
  const BlockId plain = store(pool, 4);
  const BlockId lapsed = store(pool, 5);
  pool.raise_to_default(std::vector<BlockId>{low});  // nothing below the default: no-op
  pool.set_retention(std::vector<BlockId>{low}, 10);
  pool.set_retention(std::vector<BlockId>{timed}, 20, 50);
  pool.set_retention(std::vector<BlockId>{high}, 90);
  pool.set_retention(std::vector<BlockId>{lapsed}, 5, 10);
  pool.set_retention(std::vector<BlockId>{low}, kDefaultRetentionPriority);  // not a raise
  EXPECT_EQ(pool.retention(low).priority, 10);
  for (const BlockId id : {low, plain, lapsed}) free1(pool, id);  // low: free, below
  clock.set(20);  // lapsed ran out (counted once, when raised)
  pool.raise_to_default(std::vector<BlockId>{0, low, timed, high, plain, lapsed});
  pool.check_invariants();
  for (const BlockId id : {low, timed, plain, lapsed})
    EXPECT_EQ(pool.retention(id), BlockRetention{}) << id;
  EXPECT_EQ(pool.retention(high).priority, 90);
  RetentionStats s = pool.retention_stats();
  EXPECT_EQ(s.by_class[0].blocks, 0);
  EXPECT_EQ(s.expirations, 1u);
  EXPECT_THROW(pool.raise_to_default(std::vector<BlockId>{8}), Error);
  // low, then lapsed, moved to the default's most recently used end: after plain.
  (void)allocate(pool, 2);  // the 2 uncached blocks
  EXPECT_EQ(allocate(pool, 3), (std::vector<BlockId>{plain, low, lapsed}));
  // Out of range: refused, nothing changed, while some block is below the default.
  free1(pool, timed);
  pool.set_retention(std::vector<BlockId>{timed}, 10);
  expect_rejected(
      pool,
      [&] {
        pool.raise_to_default(std::vector<BlockId>{timed, 8});
      },
      "8");
  EXPECT_EQ(pool.retention(timed).priority, 10);
  s = pool.retention_stats();
  EXPECT_EQ(s.by_class[0].blocks, 1);
}

// A duration runs on the fake clock; a hit renews it; once run out the block is back at the
// default, first among the default blocks.
TEST_P(EachPolicy, ExpiryOnAFakeClockAndRenewalOnHit) {
  FakeClock clock;
  BlockPool pool(config(6, GetParam(), 1.0, clock.fn()));
  const BlockId a = store(pool, 1);
  const BlockId b = store(pool, 2);
  const BlockId c = store(pool, 3);
  pool.set_retention(std::vector<BlockId>{a}, 90, 100);  // expires at 100
  EXPECT_EQ(pool.retention(a), (BlockRetention{90, 100, 100}));
  free1(pool, b);
  free1(pool, c);
  free1(pool, a);
  clock.set(50);
  hit(pool, a);  // renewed: 150
  EXPECT_EQ(pool.retention(a).expires_at, 150);
  clock.set(149);
  EXPECT_EQ(pool.retention(a).priority, 90);
  // Before it runs out, a is kept past the default blocks.
  auto got = allocate(pool, 2);  // the two uncached blocks
  got = allocate(pool, 1);
  EXPECT_EQ(got[0], b);
  clock.set(150);
  EXPECT_EQ(pool.retention(a), BlockRetention{});
  got = allocate(pool, 1);  // a ran out: first among the default blocks (c)
  EXPECT_EQ(got[0], a);
  const RetentionStats s = pool.retention_stats();
  EXPECT_EQ(s.expirations, 1u);
  EXPECT_EQ(s.forced_evictions, 0u);
  EXPECT_EQ(s.by_class[2].evictions, 0u);
  EXPECT_EQ(s.by_class[2].hits, 1u);
  EXPECT_EQ(s.retained_blocks, 0);
}

// Held blocks expire when freed; an ask at the same priority extends the expiry.
TEST_P(EachPolicy, HeldBlocksExpireWhenFreedAndEqualAsksExtend) {
  FakeClock clock;
  BlockPool pool(config(6, GetParam(), 1.0, clock.fn()));
  const BlockId a = store(pool, 1);
  pool.set_retention(std::vector<BlockId>{a}, 70, 10);
  pool.set_retention(std::vector<BlockId>{a}, 70, 30);
  EXPECT_EQ(pool.retention(a), (BlockRetention{70, 30, 30}));
  pool.set_retention(std::vector<BlockId>{a}, 70, 5);  // earlier: the later expiry stays
  EXPECT_EQ(pool.retention(a), (BlockRetention{70, 30, 30}));
  clock.set(40);
  free1(pool, a);
  pool.check_invariants();
  EXPECT_EQ(pool.snapshot().retention[static_cast<std::size_t>(a)], BlockRetention{});
  EXPECT_EQ(pool.retention_stats().expirations, 1u);
}

// Past the pin budget, asks to go above the default are refused and counted; the budget comes
// back when a retained block is evicted or runs out.
TEST_P(EachPolicy, PinBudget) {
  BlockPool pool(config(9, GetParam(), 0.25));  // 8 usable: 2 may be above the default
  std::vector<BlockId> ids;
  for (int k = 0; k < 4; ++k) ids.push_back(store(pool, k));
  pool.set_retention(ids, 90);
  RetentionStats s = pool.retention_stats();
  EXPECT_EQ(s.retained_budget, 2);
  EXPECT_EQ(s.retained_blocks, 2);
  EXPECT_EQ(s.budget_refusals, 2u);
  EXPECT_EQ(pool.retention(ids[0]).priority, 90);
  EXPECT_EQ(pool.retention(ids[2]).priority, kDefaultRetentionPriority);
  pool.set_retention(std::vector<BlockId>{ids[2]}, 10);  // below the default: no budget
  EXPECT_EQ(pool.retention(ids[2]).priority, 10);
  pool.set_retention(std::vector<BlockId>{ids[0]}, 95);  // already above: no new budget
  EXPECT_EQ(pool.retention(ids[0]).priority, 95);
  EXPECT_EQ(pool.retention_stats().budget_refusals, 2u);
  EXPECT_EQ(pool.evict_blocks(std::vector<BlockId>{ids[1]}), 1u);
  EXPECT_EQ(pool.retention(ids[1]), BlockRetention{});
  pool.set_retention(std::vector<BlockId>{ids[3]}, 90);
  EXPECT_EQ(pool.retention(ids[3]).priority, 90);
  s = pool.retention_stats();
  EXPECT_EQ(s.retained_blocks, 2);
  EXPECT_EQ(s.by_class[0].blocks, 1);
  EXPECT_EQ(s.by_class[2].blocks, 2);
  EXPECT_EQ(s.by_class[1].blocks, 5);
  pool.check_invariants();
}

// Retention ends when a block is handed out again, or freed uncached.
TEST_P(EachPolicy, RetentionEndsWithTheContent) {
  BlockPool pool(config(4, GetParam()));
  std::vector<BlockId> out;
  ASSERT_TRUE(pool.get_new_blocks(1, out));
  pool.set_retention(out, 90);  // held, uncached
  EXPECT_EQ(pool.retention(out[0]).priority, 90);
  pool.free_blocks(out);
  EXPECT_EQ(pool.retention(out[0]), BlockRetention{});
  const BlockId a = store(pool, 1);
  pool.set_retention(std::vector<BlockId>{a}, 90);
  free1(pool, a);
  pool.set_retention(std::vector<BlockId>{}, 90);
  EXPECT_TRUE(pool.reset_prefix_cache());
  EXPECT_EQ(pool.retention(a), BlockRetention{});
  EXPECT_EQ(pool.retention_stats().retained_blocks, 0);
  pool.check_invariants();
}

INSTANTIATE_TEST_SUITE_P(Policies, EachPolicy,
                         ::testing::Values(EvictionPolicy::kLru, EvictionPolicy::kSlru,
                                           EvictionPolicy::kS3Fifo, EvictionPolicy::kLineage,
                                           EvictionPolicy::kAdaptive),
                         [](const auto& p) { return std::string(to_string(p.param)); });

// Each policy's order on the same stream: 4 blocks stored and hit once, then a scan of new
// blocks. LRU evicts the hit blocks once the scan passes them; SLRU and S3-FIFO keep them.
std::vector<int> survivors_after_scan(EvictionPolicy policy) {
  BlockPool pool(config(9, policy));
  std::vector<BlockId> hot;
  for (int k = 0; k < 4; ++k) hot.push_back(store(pool, k));
  for (const BlockId id : hot) free1(pool, id);
  for (const BlockId id : hot) hit(pool, id);
  for (int k = 10; k < 16; ++k) free1(pool, store(pool, k));  // a scan of 6 new blocks
  std::vector<int> kept;
  for (int k = 0; k < 4; ++k) {
    if (cached(pool, k)) kept.push_back(k);
  }
  pool.check_invariants();
  return kept;
}

TEST(EvictionPolicyOrder, ScanResistance) {
  EXPECT_EQ(survivors_after_scan(EvictionPolicy::kLru), (std::vector<int>{2, 3}));
  // SLRU enforces protected's share at eviction: 4 protected of 8 free cached is within it.
  EXPECT_EQ(survivors_after_scan(EvictionPolicy::kSlru), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(survivors_after_scan(EvictionPolicy::kS3Fifo), (std::vector<int>{0, 1, 2, 3}));
}

// SLRU: protected holds at most 80% of a level's free cached blocks when a victim is chosen;
// its oldest go back to probation first (so a hit block is evicted once it is the oldest
// protected past that share). Between evictions protected may hold more.
TEST(EvictionPolicyOrder, SlruProtectedShare) {
  BlockPool pool(config(6, EvictionPolicy::kSlru));
  std::vector<BlockId> ids;
  for (int k = 0; k < 5; ++k) ids.push_back(store(pool, k));
  for (const BlockId id : ids) free1(pool, id);
  for (const BlockId id : ids) hit(pool, id);  // all five hit: all protected until an eviction
  const BlockPoolSnapshot s = pool.snapshot();
  // Lists: uncached, then per priority level its segments (0: probation, 1: protected), up to
  // the last non-empty one.
  const std::size_t prob = 1 + BlockPoolSnapshot::kEvictionSegments * kDefaultRetentionPriority;
  const std::size_t prot = prob + 1;
  ASSERT_EQ(s.eviction_lists.size(), prot + 1);
  EXPECT_EQ(s.eviction_lists[prob], (std::vector<BlockId>{}));
  EXPECT_EQ(s.eviction_lists[prot], (std::vector<BlockId>{ids[0], ids[1], ids[2], ids[3], ids[4]}));
  // First victim: 5 of 5 protected is over 80%: ids[0] back to probation, evicted; second:
  // 4 of 4, ids[1] likewise.
  EXPECT_EQ(allocate(pool, 2), (std::vector<BlockId>{ids[0], ids[1]}));
  const BlockPoolSnapshot t = pool.snapshot();
  ASSERT_EQ(t.eviction_lists.size(), prot + 1);
  EXPECT_EQ(t.eviction_lists[prob], (std::vector<BlockId>{}));
  EXPECT_EQ(t.eviction_lists[prot], (std::vector<BlockId>{ids[2], ids[3], ids[4]}));
  // Every block held: no list is left.
  EXPECT_EQ(allocate(pool, 3), (std::vector<BlockId>{ids[2], ids[3], ids[4]}));
  EXPECT_EQ(pool.snapshot().eviction_lists, (std::vector<std::vector<BlockId>>{}));
}

// Requests key's block: a hit (touched and freed) if it is cached, else stored and freed.
bool request(BlockPool& pool, int key) {
  const auto seq = one_block(key);
  const BlockId id = pool.match_cached_block(seq.sequence(), 0, BlockPool::kNoBlock);
  if (id != BlockPool::kNoBlock) {
    hit(pool, id);
    return true;
  }
  free1(pool, store(pool, key));
  return false;
}

// Hit rates of the second half of each phase on one pool of 101 blocks: a recency phase (each
// new block comes back once, 16 steps later: blocks that were hit never come back), then a
// frequency phase (60 hot blocks, each stored and hit once, then requested in turn, each
// followed by 3 new blocks that never come back), then the recency phase again.
struct PhaseRates {
  double recency = 0, frequency = 0, recency_again = 0;
  std::int64_t target_after_recency = 0;
};
PhaseRates phases(EvictionPolicy policy) {
  BlockPool pool(config(101, policy));
  int next = 1000;
  constexpr int kSteps = 800, kGap = 16, kHot = 60, kScan = 3;
  const auto recency = [&] {
    const int base = next;
    next += kSteps;
    int hits = 0;
    for (int t = 0; t < kSteps; ++t) {
      (void)request(pool, base + t);
      if (t >= kGap && request(pool, base + t - kGap) && t >= kSteps / 2) ++hits;
    }
    return hits / static_cast<double>(kSteps / 2);
  };
  const auto frequency = [&] {
    const int hot = next;
    next += kHot;
    for (int k = 0; k < kHot; ++k) {  // each hot block stored and hit once
      (void)request(pool, hot + k);
      (void)request(pool, hot + k);
    }
    int hits = 0;
    for (int t = 0; t < kSteps; ++t) {
      if (request(pool, hot + t % kHot) && t >= kSteps / 2) ++hits;
      for (int k = 0; k < kScan; ++k) (void)request(pool, next++);
    }
    return hits / static_cast<double>(kSteps / 2);
  };
  PhaseRates r;
  r.recency = recency();
  r.target_after_recency = pool.adaptive_protected_target();
  r.frequency = frequency();
  r.recency_again = recency();
  pool.check_invariants();
  return r;
}

// kAdaptive follows the better of LRU and SLRU on both kinds of workload, in turn on one pool:
// protected's target falls while blocks evicted without a hit come back (the frequency phase
// then keeps its hot blocks at the lower share; the model test checks the rise on B2 hits).
TEST(EvictionPolicyOrder, AdaptiveFollowsTheBetterOfLruAndSlru) {
  const PhaseRates lru = phases(EvictionPolicy::kLru);
  const PhaseRates slru = phases(EvictionPolicy::kSlru);
  const PhaseRates ad = phases(EvictionPolicy::kAdaptive);
  // The workloads do what they are for: LRU wins the recency phases, SLRU the frequency one.
  EXPECT_GT(lru.recency, slru.recency + 0.3);
  EXPECT_GT(lru.recency_again, slru.recency_again + 0.3);
  EXPECT_GT(slru.frequency, lru.frequency + 0.3);
  EXPECT_GE(ad.recency, lru.recency - 0.05);
  EXPECT_GE(ad.frequency, slru.frequency - 0.05);
  EXPECT_GE(ad.recency_again, lru.recency_again - 0.05);
  EXPECT_LT(ad.target_after_recency, kAdaptiveScale * kAdaptiveInitialPercent / 100);
  EXPECT_EQ(lru.target_after_recency, -1);
  std::printf(
      "recency / frequency / recency hit rates: lru %.3f %.3f %.3f, slru %.3f %.3f %.3f, "
      "adaptive %.3f %.3f %.3f (target after the first recency phase %.3f)\n",
      lru.recency, lru.frequency, lru.recency_again, slru.recency, slru.frequency,
      slru.recency_again, ad.recency, ad.frequency, ad.recency_again,
      static_cast<double>(ad.target_after_recency) / kAdaptiveScale);
}

// S3-FIFO: main's oldest block is moved to main's tail once per hit it has left.
TEST(EvictionPolicyOrder, S3FifoSpendsHitsInMain) {
  BlockPool pool(config(4, EvictionPolicy::kS3Fifo));
  const BlockId a = store(pool, 1);
  const BlockId b = store(pool, 2);
  const BlockId c = store(pool, 3);
  free1(pool, a);
  free1(pool, b);
  free1(pool, c);
  hit(pool, a);
  hit(pool, a);  // a: 2 hits
  hit(pool, b);  // b: 1 hit; main = a, b; small = c
  // small (1 of 3 >= 10%) goes first, then main: a spends a hit, b spends its hit, a spends its
  // second, b (0 left) is evicted, then a.
  EXPECT_EQ(allocate(pool, 3), (std::vector<BlockId>{c, b, a}));
}

// With every priority at the default, an LRU pool that keeps retention state hands out blocks
// in exactly the order of one that does not, on a random stream of frees, hits and allocations.
TEST(Retention, LruWithRetentionStateKeepsTheLruOrder) {
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    BlockPool plain(config(33));
    BlockPool kept(config(33));
    kept.set_retention(std::vector<BlockId>{}, 90);  // keeps retention state, no block raised
    ASSERT_TRUE(kept.retention_active());
    std::mt19937 rng(seed);
    std::vector<std::vector<BlockId>> held;
    int key = 0;
    for (int step = 0; step < 400; ++step) {
      const int op = static_cast<int>(rng() % 4);
      if (op == 0 && !held.empty()) {
        const std::size_t i = rng() % held.size();
        plain.free_blocks_reversed(held[i]);
        kept.free_blocks_reversed(held[i]);
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (op == 1) {
        // Hit a cached free-or-held block of an earlier key.
        const int k = static_cast<int>(rng() % static_cast<std::uint32_t>(key + 1));
        const auto seq = one_block(k);
        const BlockId id = plain.match_cached_block(seq.sequence(), 0, BlockPool::kNoBlock);
        ASSERT_EQ(kept.match_cached_block(seq.sequence(), 0, BlockPool::kNoBlock), id);
        if (id != BlockPool::kNoBlock) {
          plain.requeue(id);
          kept.requeue(id);
        }
      } else {
        const std::int32_t n = 1 + static_cast<std::int32_t>(rng() % 3);
        std::vector<BlockId> a, b;
        const bool ok = plain.get_new_blocks(n, a);
        ASSERT_EQ(kept.get_new_blocks(n, b), ok);
        ASSERT_EQ(a, b) << "seed " << seed << " step " << step;
        if (!ok) continue;
        // Cache the first block (one-block sequences), keep the rest uncached.
        const auto seq = one_block(++key);
        plain.cache_full_blocks(seq.sequence(), std::span<const BlockId>(a).first(1), 0, 1);
        kept.cache_full_blocks(seq.sequence(), std::span<const BlockId>(b).first(1), 0, 1);
        held.push_back(a);
      }
      ASSERT_EQ(plain.num_evictions(), kept.num_evictions());
      ASSERT_EQ(plain.num_free_blocks(), kept.num_free_blocks());
    }
    kept.check_invariants();
    plain.check_invariants();
  }
}

// A cyclic workload larger than the pool: 24 lineages (a shared head of `head` blocks, then `own`
// blocks of their own) requested in turn, for `rounds` rounds, through a pool of head + 10 * own
// + 1 blocks (room for the head and about 10 lineages). Each lineage comes back after 23 others'
// 23 * own blocks, so LRU has lost it every time (0 hits past the head); kLineage with a key
// depth past the head keeps the lineages of its highest ranks and hits them every round (the
// same ones: a stable subset). Returns the hits past the head in rounds `from` to rounds - 1
// and, per lineage, the rounds among those in which it was hit; `depth` gets the pool's key
// depth at the end. (A round queues 24 * (head + own) blocks, the head's again each time: it
// must stay under kLineageMaxAgePools pools' worth, or the kept lineages count as dead.)
struct CycleResult {
  std::size_t own = 0;
  std::int64_t hits = 0;
  std::vector<int> rounds_hit;
  std::size_t depth = 0;
};
CycleResult cyclic_rounds(EvictionPolicy policy, std::size_t head = kLineageKeyDepth,
                          std::size_t key_depth = kLineageKeyDepth, bool adaptive = false,
                          int rounds = 10, int from = 1, std::size_t own = 8) {
  constexpr int kLineages = 24;
  const std::size_t len = head + own;
  BlockPoolConfig c = config(static_cast<std::int32_t>(head + 10 * own + 1), policy);
  c.lineage_key_depth = key_depth;
  c.lineage_adaptive_depth = adaptive;
  BlockPool pool(c);
  CycleResult res;
  res.own = own;
  res.rounds_hit.assign(kLineages, 0);
  for (int round = 0; round < rounds; ++round) {
    for (int l = 0; l < kLineages; ++l) {
      RequestBlockHasher seq(BlockHasher(HashScheme::kSha256, "test"), kBlockSize, {});
      for (std::size_t i = 0; i < len; ++i) {
        const int base = i < head ? 0 : 1000 + l;
        seq.append(iota_tokens(base * 100000 + static_cast<int>(i) * kBlockSize, kBlockSize));
      }
      // The longest cached prefix, touched; the rest allocated, cached, then all freed.
      std::vector<BlockId> table;
      BlockId parent = BlockPool::kNoBlock;
      for (std::size_t i = 0; i < len; ++i) {
        const BlockId id = pool.match_cached_block(seq.sequence(), i, parent);
        if (id == BlockPool::kNoBlock) break;
        table.push_back(id);
        parent = id;
      }
      pool.touch(table);
      const std::size_t hit = table.size();
      if (hit > head && round >= from) {
        res.hits += static_cast<std::int64_t>(hit - head);
        ++res.rounds_hit[static_cast<std::size_t>(l)];
      }
      std::vector<BlockId> fresh;
      EXPECT_TRUE(pool.get_new_blocks(static_cast<std::int32_t>(len - hit), fresh));
      table.insert(table.end(), fresh.begin(), fresh.end());
      pool.cache_full_blocks(seq.sequence(), table, hit, len);
      pool.free_blocks_reversed(table);
      pool.check_invariants();
    }
  }
  res.depth = pool.lineage_key_depth();
  return res;
}

// Stable: at least 5 lineages hit in every one of the 9 counted rounds, and at least 45 of the
// 24 * 9 lineage returns hit in all.
void expect_stable_subset(const CycleResult& r) {
  const auto every_round = std::count(r.rounds_hit.begin(), r.rounds_hit.end(), 9);
  EXPECT_GE(every_round, 5);
  EXPECT_GE(r.hits, 45 * static_cast<std::int64_t>(r.own));
}

TEST(EvictionPolicyOrder, LineageKeepsAStableSubsetOfACycleLargerThanThePool) {
  const CycleResult lru = cyclic_rounds(EvictionPolicy::kLru);
  EXPECT_EQ(lru.hits, 0);
  const CycleResult lin = cyclic_rounds(EvictionPolicy::kLineage);
  expect_stable_subset(lin);
  EXPECT_EQ(lin.depth, kLineageKeyDepth);
}

// A shared head of 48 blocks (lineages of 24 blocks of their own) defeats the default key depth
// (32: inside the head, so every lineage gets one rank and the order is LRU's: no hit past the
// head); a configured depth of 48 keeps a stable subset, and so does the learned depth
// (adaptive: 48 after its first window of samples, so rounds 5 to 13 are counted).
TEST(EvictionPolicyOrder, LineageKeyDepthPastALongerSharedHead) {
  constexpr std::size_t kHead = 48, kOwn = 24;
  const CycleResult def =
      cyclic_rounds(EvictionPolicy::kLineage, kHead, kLineageKeyDepth, false, 10, 1, kOwn);
  EXPECT_EQ(def.hits, 0);
  EXPECT_EQ(def.depth, kLineageKeyDepth);
  const CycleResult set = cyclic_rounds(EvictionPolicy::kLineage, kHead, kHead, false, 10, 1, kOwn);
  expect_stable_subset(set);
  EXPECT_EQ(set.depth, kHead);
  const CycleResult learned =
      cyclic_rounds(EvictionPolicy::kLineage, kHead, kLineageKeyDepth, true, 14, 5, kOwn);
  EXPECT_EQ(learned.depth, kHead);
  expect_stable_subset(learned);
  // The default depth over the same 14 rounds: still nothing past the head.
  const CycleResult def14 =
      cyclic_rounds(EvictionPolicy::kLineage, kHead, kLineageKeyDepth, false, 14, 5, kOwn);
  EXPECT_EQ(def14.hits, 0);
}

// Chains of block hashes: `shared` blocks common to all, then blocks of their own (`key`).
std::vector<BlockHash> hash_chain(std::size_t shared, std::size_t len, int key) {
  RequestBlockHasher seq(BlockHasher(HashScheme::kSha256, "test"), kBlockSize, {});
  for (std::size_t i = 0; i < len; ++i) {
    const int base = i < shared ? 0 : 1000 + key;
    seq.append(iota_tokens(base * 100000 + static_cast<int>(i) * kBlockSize, kBlockSize));
  }
  const auto h = seq.block_hashes();
  return std::vector<BlockHash>(h.begin(), h.end());
}

TEST(LineageDepthLearner, LearnsTheMedianDivergenceDepth) {
  LineageDepthLearner learner(32);
  EXPECT_EQ(learner.depth(), 32u);
  // Every fifth chain shares 20 blocks with the others, the rest 70: of the samples (the depth
  // where a chain leaves its predecessor) 2 in 5 are 20 and 3 in 5 are 70, the median 70.
  int key = 0;
  for (int i = 0; i < 100; ++i) {
    const std::size_t shared = i % 5 == 0 ? 20 : 70;
    learner.observe(hash_chain(shared, 90, key++));
  }
  // The first chain is no sample (nothing to diverge from): 99 samples, the depth set at 64.
  EXPECT_EQ(learner.samples(), 99u);
  EXPECT_EQ(learner.depth(), 70u);
}

TEST(LineageDepthLearner, ExtensionsAreNoSamples) {
  LineageDepthLearner learner(32);
  // One request's chain stored block by block (decode) and a longer next turn: no divergence.
  const auto chain = hash_chain(10, 200, 1);
  for (std::size_t n = 1; n <= 120; ++n) {
    learner.observe(std::span<const BlockHash>(chain).first(n));
  }
  learner.observe(chain);
  EXPECT_EQ(learner.samples(), 0u);
  EXPECT_EQ(learner.depth(), 32u);
  // 64 chains that diverge from their predecessor at block 10 set the depth to 10.
  for (int k = 2; k < 66; ++k) learner.observe(hash_chain(10, 30, k));
  EXPECT_EQ(learner.samples(), 64u);
  EXPECT_EQ(learner.depth(), 10u);
}

TEST(LineageDepthLearner, CapsTheDepth) {
  LineageDepthLearner learner(kMaxLineageKeyDepth + 5);
  EXPECT_EQ(learner.depth(), kMaxLineageKeyDepth);
  // Chains sharing more than the cap diverge, as far as the learner sees, at the cap.
  int key = 0;
  for (std::uint32_t i = 0; i <= kLineageDepthWindow; ++i) {
    learner.observe(hash_chain(kMaxLineageKeyDepth + 10, kMaxLineageKeyDepth + 20, key++));
  }
  EXPECT_EQ(learner.samples(), 0u);  // equal up to the cap: extensions
  EXPECT_EQ(learner.depth(), kMaxLineageKeyDepth);
}

TEST(EvictionPolicyOrder, LineageKeyDepthIsValidated) {
  BlockPoolConfig c = config(64, EvictionPolicy::kLineage);
  c.lineage_key_depth = kMaxLineageKeyDepth + 1;
  EXPECT_THROW(BlockPool{c}, Error);
  c.lineage_key_depth = kMaxLineageKeyDepth;
  BlockPool pool(c);
  EXPECT_EQ(pool.lineage_key_depth(), kMaxLineageKeyDepth);
  c.lineage_key_depth = 0;
  c.lineage_adaptive_depth = true;
  BlockPool adaptive(c);
  EXPECT_EQ(adaptive.lineage_key_depth(), 0u);
}

// kAdaptive's ghost sample: the largest shift up to the maximum that leaves each ghost FIFO
// kAdaptiveGhostMinSampled entries; pools choose it by their size unless configured; a bad
// shift is refused, naming the setting.
TEST(EvictionPolicyOrder, AdaptiveGhostSampleShift) {
  constexpr std::size_t kMin = kAdaptiveGhostMinSampled;
  EXPECT_EQ(adaptive_ghost_sample_shift(0), 0);
  EXPECT_EQ(adaptive_ghost_sample_shift(2 * kMin - 1), 0);
  EXPECT_EQ(adaptive_ghost_sample_shift(2 * kMin), 1);
  EXPECT_EQ(adaptive_ghost_sample_shift(8 * kMin - 1), 2);
  EXPECT_EQ(adaptive_ghost_sample_shift(8 * kMin), 3);
  EXPECT_EQ(adaptive_ghost_sample_shift(std::size_t{1} << 40), kAdaptiveGhostMaxSampleShift);

  // A 32,769-block pool: ghost FIFOs of 8,192 entries before sampling.
  BlockPoolConfig c = config(32769, EvictionPolicy::kAdaptive);
  EXPECT_EQ(BlockPool(c).adaptive_ghost_sample_shift(),
            adaptive_ghost_sample_shift(32769 * kAdaptiveGhostPercent / 100));
  EXPECT_EQ(BlockPool(config(64, EvictionPolicy::kAdaptive)).adaptive_ghost_sample_shift(), 0);
  EXPECT_EQ(BlockPool(config(64, EvictionPolicy::kSlru)).adaptive_ghost_sample_shift(), -1);
  c.adaptive_ghost_sample_shift = 0;
  EXPECT_EQ(BlockPool(c).adaptive_ghost_sample_shift(), 0);
  c.adaptive_ghost_sample_shift = kAdaptiveGhostMaxSampleShift;
  EXPECT_EQ(BlockPool(c).adaptive_ghost_sample_shift(), kAdaptiveGhostMaxSampleShift);
  for (const int bad : {-2, kAdaptiveGhostMaxSampleShift + 1}) {
    c.adaptive_ghost_sample_shift = bad;
    try {
      BlockPool pool(c);
      ADD_FAILURE() << "shift " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("adaptive_ghost_sample_shift"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace pagedkv
