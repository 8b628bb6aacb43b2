// Per-request retention in KVCacheManager (issue 38): the config's validation, the per-block
// rule, a pinned system prompt surviving a flood (and not without retention), durations on a
// fake clock, the pin budget, a pool that never wedges, shared blocks, generated tokens, hybrid
// models, and the strong guarantee.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/manager/retention.hpp"
#include "test_tokens.hpp"

namespace pagedkv {
namespace {

constexpr std::uint32_t kB = 4;
constexpr std::size_t kPrompt = 16;  // the system prompt: 4 blocks

KVCacheManagerConfig config(std::int32_t num_blocks, RetentionTick* clock = nullptr) {
  KVCacheManagerConfig c;
  c.num_blocks = num_blocks;
  c.block_size = kB;
  c.hash_seed = "retention";
  c.max_retained_fraction = 1.0;
  if (clock != nullptr) c.retention_clock = [clock] { return *clock; };
  return c;
}

RetentionConfig pin(std::size_t tokens, RetentionPriority priority = 90,
                    std::optional<RetentionTick> duration = std::nullopt) {
  RetentionConfig r;
  r.token_ranges.push_back({0, tokens, priority, duration});
  return r;
}

// The system prompt (tokens 0..15) and `own` tokens of the request's own.
std::vector<TokenId> with_system_prompt(RequestId id, std::size_t own = 3) {
  std::vector<TokenId> t = iota_tokens(0, kPrompt);
  const std::vector<TokenId> rest = iota_tokens(static_cast<TokenId>(1000 + 100 * id), own);
  t.insert(t.end(), rest.begin(), rest.end());
  return t;
}

// Runs a whole prompt: hit, allocation, free. Returns the hit's tokens.
std::size_t run(KVCacheManager& m, RequestId id, const std::vector<TokenId>& tokens,
                const std::optional<RetentionConfig>& retention = std::nullopt) {
  Request r = m.make_request(id, tokens);
  r.set_retention(retention);
  const CacheHit hit = m.get_computed_blocks(r);
  EXPECT_TRUE(m.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit).has_value())
      << "request " << id << " did not fit";
  m.free(r);
  m.check_invariants();
  return hit.num_tokens;
}

// `n` unrelated requests of 5 blocks each (unique tokens): flushes an LRU pool many times over.
void flood(KVCacheManager& m, RequestId first, int n) {
  for (int k = 0; k < n; ++k) {
    const RequestId id = first + static_cast<RequestId>(k);
    run(m, id, iota_tokens(static_cast<TokenId>(100000 + 1000 * id), 5 * kB));
  }
}

template <typename Call>
void expect_error(Call call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(RetentionConfig, TheManagersDefaultPinBudgetIsThePools) {
  EXPECT_EQ(KVCacheManagerConfig{}.max_retained_fraction, BlockPoolConfig{}.max_retained_fraction);
  EXPECT_EQ(KVCacheManagerConfig{}.eviction_policy, EvictionPolicy::kLru);
}

TEST(RetentionConfig, ValidationNamesTheProblemAndKeepsThePreviousConfig) {
  KVCacheManager m(config(16));
  Request r = m.make_request(1, iota_tokens(0, 20));
  const RetentionConfig good = pin(8);
  r.set_retention(good);
  const auto bad = [&](RetentionConfig c, const std::string& fragment) {
    expect_error([&] { r.set_retention(c); }, fragment);
    EXPECT_EQ(r.retention(), good) << fragment;
  };
  RetentionConfig c;
  c.token_ranges = {{0, 8, 101, std::nullopt}};
  bad(c, "priority 101 is above 100");
  c.token_ranges = {{0, 8, 90, -5}};
  bad(c, "duration -5 is not positive");
  c.token_ranges = {{0, 8, 90, 0}};
  bad(c, "duration 0 is not positive");
  c.token_ranges = {{4, 4, 90, std::nullopt}};
  bad(c, "[4, 4) is empty");
  c.token_ranges = {{0, 21, 90, std::nullopt}};
  bad(c, "ends at token 21, past the prompt's 20 tokens");
  c.token_ranges = {{0, 8, 90, std::nullopt}, {6, 12, 50, std::nullopt}};
  bad(c, "token range 1 starts at token 6, before the end 8");
  c.token_ranges = {{8, 12, 90, std::nullopt}, {0, 4, 50, std::nullopt}};
  bad(c, "token range 1 starts at token 0, before the end 12");
  c.token_ranges = {{25, std::nullopt, 90, std::nullopt}};
  bad(c, "is empty");
  c.token_ranges.clear();
  c.decode_retention_priority = 200;
  bad(c, "decode_retention_priority: priority 200");
  c.decode_retention_priority = 90;
  c.decode_duration = -1;
  bad(c, "decode_duration: duration -1");
  // Valid: adjacent ranges, an open end, the default decode priority.
  RetentionConfig ok;
  ok.token_ranges = {{0, 8, 90, 3}, {8, std::nullopt, 10, std::nullopt}};
  r.set_retention(ok);
  EXPECT_EQ(r.retention(), ok);
  r.set_retention(std::nullopt);
  EXPECT_FALSE(r.retention().has_value());
}

TEST(RetentionConfig, ABlockTakesTheHighestPartAndItsLongestDuration) {
  RetentionConfig c;
  c.token_ranges = {{0, 6, 90, 5}, {6, 10, 50, std::nullopt}};
  c.decode_retention_priority = 20;
  c.decode_duration = 7;
  const std::size_t prompt = 12;
  using A = RetentionAsk;
  EXPECT_EQ(retention_ask(c, prompt, 0, 4), (A{90, 5}));
  EXPECT_EQ(retention_ask(c, prompt, 4, 8), (A{90, 5}));               // spans 90 and 50
  EXPECT_EQ(retention_ask(c, prompt, 8, 12), (A{50, std::nullopt}));   // 50 and a default gap
  EXPECT_EQ(retention_ask(c, prompt, 12, 16), (A{20, 7}));             // generated tokens only
  EXPECT_EQ(retention_ask(c, prompt, 10, 14), (A{35, std::nullopt}));  // default beats 20
  RetentionConfig d;
  d.token_ranges = {{0, 4, 90, 5}, {4, 8, 90, 9}, {8, 12, 90, std::nullopt}};
  EXPECT_EQ(retention_ask(d, 12, 2, 6), (A{90, 9}));              // equal: the longer
  EXPECT_EQ(retention_ask(d, 12, 6, 10), (A{90, std::nullopt}));  // none beats any
  RetentionConfig low;
  low.token_ranges = {{0, 4, 10, std::nullopt}};
  EXPECT_EQ(retention_ask(low, 8, 0, 4), (A{10, std::nullopt}));  // below the default
  EXPECT_EQ(retention_ask(low, 8, 2, 6), (A{35, std::nullopt}));  // a default part wins
}

TEST(Retention, PinnedSystemPromptSurvivesAFloodAndLruDoesNot) {
  for (const bool retain : {true, false}) {
    SCOPED_TRACE(retain ? "retained" : "plain LRU");
    KVCacheManager m(config(64));
    const std::optional<RetentionConfig> r =
        retain ? std::optional<RetentionConfig>(pin(kPrompt)) : std::nullopt;
    EXPECT_EQ(run(m, 1, with_system_prompt(1), r), 0u);
    flood(m, 10, 60);  // 300 blocks through a 63-block pool
    EXPECT_GT(m.stats().evictions, 200u);
    EXPECT_EQ(run(m, 2, with_system_prompt(2), r), retain ? kPrompt : 0u);
    if (retain) {
      const RetentionStats s = m.retention_stats();
      EXPECT_EQ(s.retained_blocks, 4);
      EXPECT_EQ(s.forced_evictions, 0u);
      EXPECT_EQ(s.by_class[static_cast<std::size_t>(RetentionClass::kAboveDefault)].evictions, 0u);
      EXPECT_GT(s.by_class[static_cast<std::size_t>(RetentionClass::kDefault)].evictions, 200u);
    } else {
      // Requests without a config leave the pool on its LRU path.
      EXPECT_FALSE(m.block_pool().retention_active());
    }
  }
}

TEST(Retention, DurationsExpireOnTheClockAndHitsRenewThem) {
  RetentionTick now = 0;
  KVCacheManager m(config(64, &now));
  run(m, 1, with_system_prompt(1), pin(kPrompt, 90, 10));  // retained until tick 10
  now = 5;
  flood(m, 10, 60);
  now = 8;  // a hit by a request without a config renews the duration: until tick 18
  EXPECT_EQ(run(m, 2, with_system_prompt(2)), kPrompt);
  now = 15;
  flood(m, 100, 60);
  EXPECT_EQ(run(m, 3, with_system_prompt(3)), kPrompt);  // renewed again at 15: until 25
  now = 40;  // expired: back at the default priority, flushed by the next flood
  flood(m, 200, 60);
  EXPECT_EQ(run(m, 4, with_system_prompt(4)), 0u);
  EXPECT_GE(m.retention_stats().expirations, 4u);
}

TEST(Retention, TheReleaseRestartsTheDuration) {
  RetentionTick now = 0;
  KVCacheManager m(config(64, &now));
  Request a = m.make_request(1, with_system_prompt(1));
  a.set_retention(pin(kPrompt, 90, 10));
  ASSERT_TRUE(m.allocate_slots(a, a.num_tokens()));
  now = 50;  // held long past its duration; the release counts from here: until tick 60
  m.free(a);
  now = 55;
  flood(m, 10, 60);
  EXPECT_EQ(run(m, 2, with_system_prompt(2)), kPrompt);
}

TEST(Retention, ADurationNeedsAClock) {
  KVCacheManager m(config(64));  // no retention_clock
  Request a = m.make_request(1, with_system_prompt(1));
  a.set_retention(pin(kPrompt, 90, 10));
  const KVCacheManagerSnapshot before = m.snapshot();
  expect_error([&] { (void)m.allocate_slots(a, a.num_tokens()); }, "no retention_clock");
  EXPECT_EQ(m.snapshot(), before);
  m.check_invariants();
}

TEST(Retention, ThePinBudgetCapsRetainedBlocksAndCountsRefusals) {
  KVCacheManagerConfig c = config(41);  // 40 usable blocks
  c.max_retained_fraction = 0.1;        // 4 of them
  KVCacheManager m(c);
  std::vector<TokenId> prompt = iota_tokens(0, 8 * kB);  // 8 blocks asked for
  prompt.push_back(7777);
  run(m, 1, prompt, pin(8 * kB));
  RetentionStats s = m.retention_stats();
  EXPECT_EQ(s.retained_budget, 4);
  EXPECT_EQ(s.retained_blocks, 4);
  EXPECT_GE(s.budget_refusals, 4u);  // asked at the allocation and again at the release
  flood(m, 10, 40);
  // The first 4 blocks were retained (asked in token order): the hit is exactly them.
  std::vector<TokenId> again = iota_tokens(0, 8 * kB);
  again.push_back(8888);
  EXPECT_EQ(run(m, 2, again), 4 * kB);
  s = m.retention_stats();
  EXPECT_LE(s.retained_blocks, s.retained_budget);
}

TEST(Retention, APoolOfRetainedBlocksNeverWedges) {
  KVCacheManager m(config(17));  // 16 usable blocks, budget: all of them
  // Every usable block cached and retained at 90, then free.
  std::vector<TokenId> all = iota_tokens(0, 16 * kB);
  run(m, 1, all, pin(16 * kB));
  EXPECT_EQ(m.retention_stats().retained_blocks, 16);
  // An unrelated request still gets its blocks: the lowest, oldest retained ones go.
  EXPECT_EQ(run(m, 2, iota_tokens(50000, 3 * kB)), 0u);
  EXPECT_EQ(m.retention_stats().forced_evictions, 3u);
}

TEST(Retention, ASharedBlockKeepsTheHighestPriority) {
  KVCacheManager m(config(64));
  Request high = m.make_request(1, with_system_prompt(1));
  high.set_retention(pin(kPrompt, 90));
  ASSERT_TRUE(m.allocate_slots(high, high.num_tokens()));
  const std::vector<BlockId> rows(m.block_ids(1).begin(), m.block_ids(1).end());
  // A low-priority request shares the prefix and releases first, then the high one.
  Request low = m.make_request(2, with_system_prompt(2));
  low.set_retention(pin(kPrompt, 10));
  const CacheHit hit = m.get_computed_blocks(low);
  ASSERT_EQ(hit.num_tokens, kPrompt);
  ASSERT_TRUE(m.allocate_slots(low, low.num_tokens() - hit.num_tokens, hit));
  const std::vector<BlockId> low_own(m.block_ids(2).begin() + 4, m.block_ids(2).end());
  m.free(low);
  m.free(high);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(m.block_retention(rows[i]).priority, 90);
  // The low request's own block (tokens 16..18, past its range) is at the default.
  for (const BlockId b : low_own) EXPECT_EQ(m.block_retention(b).priority, 35);
  m.check_invariants();
}

// A block's priority is the highest any request asked for it, and a request without a config
// asks the default: a block one request asked to keep below the default (10) is at the default
// once a request without a config shares it, whichever came first, so ordinary LRU order
// applies to it among the default blocks (issue 38: "a block shared by requests of different
// priorities takes the highest").
class SharedBelowDefault : public ::testing::TestWithParam<EvictionPolicy> {
 protected:
  KVCacheManagerConfig cfg(std::int32_t n, RetentionTick* clock = nullptr) const {
    KVCacheManagerConfig c = config(n, clock);
    c.eviction_policy = GetParam();
    return c;
  }
};

// a (its 4 prompt blocks at 10) and then b (3 default blocks) run; then c, without a config,
// hits a's prompt. 6 new blocks: the 3 uncached ones and 3 evictions, which must be b's (the
// oldest default blocks), not a's (shared by a default request, used last).
TEST_P(SharedBelowDefault, ADefaultRequestHittingTheBlockLiftsIt) {
  KVCacheManager m(cfg(11));  // 10 usable blocks
  std::vector<TokenId> a = iota_tokens(0, 4 * kB);
  a.push_back(1);
  run(m, 1, a, pin(4 * kB, 10));
  std::vector<TokenId> b = iota_tokens(500, 3 * kB);
  b.push_back(2);
  run(m, 2, b);
  Request c = m.make_request(3, a);
  const CacheHit hit = m.get_computed_blocks(c);
  ASSERT_EQ(hit.num_tokens, 4 * kB);
  ASSERT_TRUE(m.allocate_slots(c, c.num_tokens() - hit.num_tokens, hit));
  for (const BlockId id : hit.blocks) {
    EXPECT_EQ(m.block_retention(id), BlockRetention{}) << "block " << id << " of the shared prompt";
  }
  m.free(c);
  m.check_invariants();
  EXPECT_EQ(m.retention_stats().by_class[0].blocks, 0);
  EXPECT_EQ(run(m, 4, iota_tokens(900, 6 * kB)), 0u);
  EXPECT_EQ(run(m, 5, a), 4 * kB);  // a's prompt survived
  std::vector<TokenId> b_again = iota_tokens(500, 3 * kB);
  b_again.push_back(3);
  EXPECT_EQ(run(m, 6, b_again), 0u);  // b's went
}

// The other order: the default request cached the blocks; a request asking 10 for them hits
// them (and releases them last): they stay at the default.
TEST_P(SharedBelowDefault, ALowRequestHittingADefaultBlockDoesNotLowerIt) {
  KVCacheManager m(cfg(64));
  std::vector<TokenId> a = iota_tokens(0, 4 * kB);
  a.push_back(1);
  Request plain = m.make_request(1, a);
  ASSERT_TRUE(m.allocate_slots(plain, plain.num_tokens()));
  const std::vector<BlockId> row(m.block_ids(1).begin(), m.block_ids(1).end());
  Request low = m.make_request(2, a);
  low.set_retention(pin(4 * kB, 10));
  const CacheHit hit = m.get_computed_blocks(low);
  ASSERT_EQ(hit.num_tokens, 4 * kB);
  ASSERT_TRUE(m.allocate_slots(low, low.num_tokens() - hit.num_tokens, hit));
  m.free(plain);
  m.free(low);  // its release asks 10 again: still the default
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(m.block_retention(row[i]).priority, 35) << i;
  m.check_invariants();
}

// Shared while both hold it: the low request asked 10 for its new blocks, a default request
// hits them before the low one is released; the release does not lower them again. Durations:
// the lift is for ever (the default never runs out), and expiry counts nothing for it.
TEST_P(SharedBelowDefault, ASharerLiftsTheBlocksForGoodAndDurationsStayCorrect) {
  RetentionTick now = 0;
  KVCacheManager m(cfg(64, &now));
  std::vector<TokenId> a = iota_tokens(0, 4 * kB);
  a.push_back(1);
  Request low = m.make_request(1, a);
  low.set_retention(pin(4 * kB, 10, 5));
  ASSERT_TRUE(m.allocate_slots(low, low.num_tokens()));
  const std::vector<BlockId> row(m.block_ids(1).begin(), m.block_ids(1).end());
  EXPECT_EQ(m.block_retention(row[0]), (BlockRetention{10, 5, 5}));
  now = 2;
  Request plain = m.make_request(2, a);
  const CacheHit hit = m.get_computed_blocks(plain);
  ASSERT_EQ(hit.num_tokens, 4 * kB);
  ASSERT_TRUE(m.allocate_slots(plain, plain.num_tokens() - hit.num_tokens, hit));
  now = 3;
  m.free(low);
  m.free(plain);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(m.block_retention(row[i]), BlockRetention{}) << i;
  now = 100;
  // A later low request hitting them: still the default (a default request asked for them).
  std::vector<TokenId> a2 = iota_tokens(0, 4 * kB);
  a2.push_back(2);
  run(m, 3, a2, pin(4 * kB, 10, 5));
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(m.block_retention(row[i]), BlockRetention{}) << i;
  EXPECT_EQ(m.retention_stats().expirations, 0u);
  EXPECT_EQ(m.retention_stats().by_class[0].blocks, 0);
  m.check_invariants();
}

// Among requests below the default the highest wins; a config whose block is partly unnamed
// asks the default for it (and lifts it); generated tokens' blocks follow the same rule.
TEST_P(SharedBelowDefault, RangesAndGeneratedTokensFollowTheSameRule) {
  KVCacheManager m(cfg(64));
  std::vector<TokenId> a = iota_tokens(0, 4 * kB);
  a.push_back(1);
  Request low = m.make_request(1, a);
  low.set_retention(pin(4 * kB, 10));
  ASSERT_TRUE(m.allocate_slots(low, low.num_tokens()));
  const std::vector<BlockId> row(m.block_ids(1).begin(), m.block_ids(1).end());
  m.free(low);
  std::vector<TokenId> a2 = a;
  a2.back() = 2;
  run(m, 2, a2, pin(kB, 20));     // block 0 at 20; blocks 1..3 asked the default
  run(m, 3, a2, pin(4 * kB, 5));  // lower than all: changes nothing
  EXPECT_EQ(m.block_retention(row[0]).priority, 20);
  for (std::size_t i = 1; i < 4; ++i) EXPECT_EQ(m.block_retention(row[i]).priority, 35) << i;
  // Generated tokens at 10, then a request without a config whose prompt is that whole text.
  Request gen = m.make_request(4, iota_tokens(3000, 4));
  RetentionConfig c;
  c.decode_retention_priority = 10;
  gen.set_retention(c);
  ASSERT_TRUE(m.allocate_slots(gen, 4));
  gen.set_num_computed_tokens(4);
  gen.append_tokens(iota_tokens(4000, 8));
  ASSERT_TRUE(m.allocate_slots(gen, 8));
  gen.set_num_computed_tokens(12);
  const std::vector<BlockId> grow(m.block_ids(4).begin(), m.block_ids(4).end());
  m.free(gen);
  EXPECT_EQ(m.block_retention(grow[1]).priority, 10);
  std::vector<TokenId> text(gen.tokens().begin(), gen.tokens().end());
  text.push_back(9);
  EXPECT_EQ(run(m, 5, text), 3 * kB);
  for (std::size_t i = 1; i < 3; ++i) EXPECT_EQ(m.block_retention(grow[i]).priority, 35) << i;
  m.check_invariants();
}

// A request asking 90 for a block below the default while the pin budget is full: the raise is
// refused (and counted), but the block still takes the default, the most the budget allows.
TEST_P(SharedBelowDefault, ARaiseRefusedByTheBudgetStillLiftsToTheDefault) {
  KVCacheManagerConfig c = cfg(64);
  c.max_retained_fraction = 0;  // no block may be above the default
  KVCacheManager m(c);
  std::vector<TokenId> a = iota_tokens(0, 4 * kB);
  a.push_back(1);
  Request low = m.make_request(1, a);
  low.set_retention(pin(4 * kB, 10));
  ASSERT_TRUE(m.allocate_slots(low, low.num_tokens()));
  const std::vector<BlockId> row(m.block_ids(1).begin(), m.block_ids(1).end());
  m.free(low);
  std::vector<TokenId> a2 = a;
  a2.back() = 2;
  EXPECT_EQ(run(m, 2, a2, pin(4 * kB, 90)), 4 * kB);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(m.block_retention(row[i]), BlockRetention{}) << i;
  EXPECT_GE(m.retention_stats().budget_refusals, 4u);
  m.check_invariants();
}

INSTANTIATE_TEST_SUITE_P(Policies, SharedBelowDefault,
                         ::testing::Values(EvictionPolicy::kLru, EvictionPolicy::kSlru,
                                           EvictionPolicy::kS3Fifo, EvictionPolicy::kLineage,
                                           EvictionPolicy::kAdaptive),
                         [](const auto& p) { return std::string(to_string(p.param)); });

TEST(Retention, BelowDefaultBlocksAreEvictedFirst) {
  for (const bool retain : {true, false}) {
    SCOPED_TRACE(retain ? "retained" : "plain LRU");
    KVCacheManager m(config(11));                       // 10 usable blocks
    std::vector<TokenId> b = iota_tokens(500, 3 * kB);  // 3 cached blocks at the default
    b.push_back(2);
    run(m, 2, b);
    std::vector<TokenId> a = iota_tokens(0, 4 * kB);  // 4 cached blocks, freed later
    a.push_back(1);
    run(m, 1, a, retain ? std::optional<RetentionConfig>(pin(4 * kB, 10)) : std::nullopt);
    // 6 blocks: the 3 uncached ones, then 3 evictions. LRU takes b's (freed first); priority
    // 10 takes a's first.
    EXPECT_EQ(run(m, 3, iota_tokens(900, 6 * kB)), 0u);
    std::vector<TokenId> b_again = iota_tokens(500, 3 * kB);
    b_again.push_back(3);
    EXPECT_EQ(run(m, 4, b_again), retain ? 3 * kB : 0u);
  }
}

TEST(Retention, GeneratedTokensTakeTheDecodePriority) {
  KVCacheManager m(config(64));
  Request r = m.make_request(1, iota_tokens(0, 8));  // 2 prompt blocks
  RetentionConfig c;
  c.decode_retention_priority = 80;
  r.set_retention(c);
  ASSERT_TRUE(m.allocate_slots(r, 8));
  r.set_num_computed_tokens(8);
  r.append_tokens(iota_tokens(100, 8));  // 2 blocks of generated tokens
  ASSERT_TRUE(m.allocate_slots(r, 8));
  r.set_num_computed_tokens(16);
  const std::vector<BlockId> row(m.block_ids(1).begin(), m.block_ids(1).end());
  ASSERT_EQ(row.size(), 4u);
  m.free(r);
  EXPECT_EQ(m.block_retention(row[0]).priority, kDefaultRetentionPriority);
  EXPECT_EQ(m.block_retention(row[1]).priority, kDefaultRetentionPriority);
  EXPECT_EQ(m.block_retention(row[2]).priority, 80);
  EXPECT_EQ(m.block_retention(row[3]).priority, 80);
  m.check_invariants();
}

TEST(Retention, HybridModelRetainsEveryGroupsBlocks) {
  for (const bool retain : {true, false}) {
    SCOPED_TRACE(retain ? "retained" : "plain LRU");
    KVCacheManagerConfig c = config(128);
    c.groups = {AttentionSpec::full(kB), AttentionSpec::sliding(kB, 8)};
    KVCacheManager m(c);
    const std::optional<RetentionConfig> r =
        retain ? std::optional<RetentionConfig>(pin(kPrompt)) : std::nullopt;
    run(m, 1, with_system_prompt(1), r);
    flood(m, 10, 60);  // 2 groups x 5 blocks per request
    EXPECT_EQ(run(m, 2, with_system_prompt(2), r), retain ? kPrompt : 0u);
  }
}

TEST(Retention, RejectedAndRefusedCallsChangeNothing) {
  KVCacheManager m(config(8));  // 7 usable blocks
  run(m, 1, with_system_prompt(1), pin(kPrompt));
  Request big = m.make_request(2, iota_tokens(7000, 8 * kB));  // 8 blocks: does not fit
  big.set_retention(pin(8 * kB));
  const KVCacheManagerSnapshot before = m.snapshot();
  EXPECT_FALSE(m.allocate_slots(big, big.num_tokens()).has_value());
  EXPECT_EQ(m.snapshot(), before);
  // A pool that keeps no retention state yet is not switched by a refused allocation either.
  KVCacheManager fresh(config(8));
  const KVCacheManagerSnapshot fresh_before = fresh.snapshot();
  Request big2 = fresh.make_request(2, iota_tokens(7000, 8 * kB));
  big2.set_retention(pin(8 * kB));
  EXPECT_FALSE(fresh.allocate_slots(big2, big2.num_tokens()).has_value());
  EXPECT_EQ(fresh.snapshot(), fresh_before);
  EXPECT_FALSE(fresh.block_pool().retention_active());
}

}  // namespace
}  // namespace pagedkv
