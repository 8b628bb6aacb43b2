// AdmissionScheduler: ordering, same-step deferral, the budget and free-block bounds, and the
// aging bound in random streams driven through a real KVCacheManager.
#include "pagedkv/sched/admission_scheduler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/sched/prefix_probe.hpp"
#include "test_tokens.hpp"

namespace pagedkv {
namespace {

constexpr std::uint32_t kBs = 4;

KVCacheManagerConfig config(std::int32_t blocks) {
  KVCacheManagerConfig c;
  c.num_blocks = blocks;
  c.block_size = kBs;
  c.hash_scheme = HashScheme::kSha256;
  return c;
}

// Runs a request's whole prompt through the manager and frees it: its full blocks stay cached.
void warm(KVCacheManager& m, RequestId id, const std::vector<TokenId>& tokens) {
  Request r = m.make_request(id, tokens);
  const CacheHit hit = m.get_computed_blocks(r);
  ASSERT_TRUE(m.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit));
  r.set_num_computed_tokens(r.num_tokens());
  m.free(r);
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(AdmissionScheduler, LongestCachedPrefixFirstTiesByArrival) {
  KVCacheManager m(config(200));
  const auto shared_long = iota_tokens(1000, 40);  // 10 blocks
  const auto shared_short = iota_tokens(2000, 8);  // 2 blocks
  warm(m, 1, concat(shared_long, iota_tokens(9000, 3)));
  warm(m, 2, concat(shared_short, iota_tokens(9100, 3)));
  Request cold = m.make_request(10, iota_tokens(5000, 20));
  Request short_hit = m.make_request(11, concat(shared_short, iota_tokens(5100, 20)));
  Request long_hit = m.make_request(12, concat(shared_long, iota_tokens(5200, 20)));
  Request cold2 = m.make_request(13, iota_tokens(5300, 20));
  std::vector<WaitingRequest> w = {{&cold, 0}, {&short_hit, 1}, {&long_hit, 2}, {&cold2, 3}};
  PrefixProbe probe(m);
  AdmissionScheduler s(probe, {});
  const Proposal& p = s.propose(w, {1000, 199, 10});
  ASSERT_EQ(p.admissions.size(), 4u);
  EXPECT_EQ(p.admissions[0].index, 2u);
  EXPECT_EQ(p.admissions[0].cached.gpu_tokens, 40u);
  EXPECT_EQ(p.admissions[0].chunk_tokens, 20u);  // cached tokens are not charged
  EXPECT_EQ(p.admissions[1].index, 1u);
  EXPECT_EQ(p.admissions[2].index, 0u);  // equal (no) hits: arrival order
  EXPECT_EQ(p.admissions[3].index, 3u);
  EXPECT_EQ(p.tokens_charged, 20u + 20u + 20u + 20u);

  AdmissionSchedulerConfig fcfs;
  fcfs.policy = SchedulePolicy::kFcfs;
  AdmissionScheduler f(probe, fcfs);
  const Proposal& q = f.propose(w, {1000, 199, 10});
  ASSERT_EQ(q.admissions.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(q.admissions[i].index, i);
}

TEST(AdmissionScheduler, SharedUncachedPrefixWaitsOneStepThenHits) {
  KVCacheManager m(config(400));
  const auto shared = iota_tokens(1, 100);  // 25 uncached blocks both requests share
  Request a = m.make_request(1, concat(shared, iota_tokens(500, 10)));
  Request b = m.make_request(2, concat(shared, iota_tokens(600, 10)));
  std::vector<WaitingRequest> w = {{&a, 0}, {&b, 1}};
  PrefixProbe probe(m);
  AdmissionSchedulerConfig capped;
  capped.max_chunk_tokens = 60;
  AdmissionScheduler s(probe, capped);
  // a's chunk covers 60 of the 100 shared tokens: b would compute the other 40 again.
  const Proposal& p = s.propose(w, {200, 399, 10});
  ASSERT_EQ(p.admissions.size(), 1u);
  EXPECT_EQ(p.admissions[0].index, 0u);
  EXPECT_EQ(p.admissions[0].chunk_tokens, 60u);
  ASSERT_EQ(p.deferred.size(), 1u);
  EXPECT_EQ(p.deferred[0], 1u);
  // Deferral off: b is admitted (hitting a's 60 in-step tokens) and computes the 40 tokens a
  // computes next step.
  AdmissionSchedulerConfig off = capped;
  off.defer_shared_prefix = false;
  AdmissionScheduler s2(probe, off);
  const Proposal& p2 = s2.propose(w, {200, 399, 10});
  ASSERT_EQ(p2.admissions.size(), 2u);
  EXPECT_EQ(p2.admissions[1].in_step_tokens, 60u);
  EXPECT_TRUE(p2.deferred.empty());
  AdmissionScheduler s3(probe, {});

  // When a's chunk covers the shared prefix, b hits what a's allocation caches, in the same step.
  const Proposal& p3 = s3.propose(w, {1000, 399, 10});
  ASSERT_EQ(p3.admissions.size(), 2u);
  EXPECT_EQ(p3.admissions[1].index, 1u);
  EXPECT_EQ(p3.admissions[1].in_step_tokens, 100u);
  EXPECT_EQ(p3.admissions[1].chunk_tokens, 10u);
  // And the engine sees the same: allocate a, then b's lookup hits the 25 shared blocks.
  const CacheHit ha = m.get_computed_blocks(a);
  ASSERT_TRUE(m.allocate_slots(a, p3.admissions[0].chunk_tokens, ha));
  EXPECT_EQ(m.get_computed_blocks(b).num_tokens, 100u);
}

TEST(AdmissionScheduler, UrgentRequestIsNeverPassedAndNeverDeferred) {
  KVCacheManager m(config(400));
  warm(m, 1, concat(iota_tokens(1, 80), iota_tokens(900, 2)));
  Request old_cold = m.make_request(10, iota_tokens(5000, 40));
  Request hot = m.make_request(11, concat(iota_tokens(1, 80), iota_tokens(7000, 4)));
  PrefixProbe probe(m);
  AdmissionSchedulerConfig c;
  c.max_passed_over = 2;
  AdmissionScheduler s(probe, c);
  std::vector<WaitingRequest> w = {{&old_cold, 0, 1}, {&hot, 1}};
  EXPECT_EQ(s.propose(w, {1000, 399, 10}).admissions[0].index, 1u);  // not urgent yet
  w[0].passed_over = 2;
  const Proposal& p = s.propose(w, {1000, 399, 10});
  EXPECT_EQ(p.admissions[0].index, 0u);  // urgent: first
  // It does not fit the free blocks: nothing that arrived after it is admitted either, not even
  // `hot`, which would fit (its hit is held by a running request, so it needs one new block).
  Request holder = m.make_request(2, concat(iota_tokens(1, 80), iota_tokens(800, 2)));
  const CacheHit held = m.get_computed_blocks(holder);
  ASSERT_EQ(held.num_tokens, 80u);
  ASSERT_TRUE(m.allocate_slots(holder, 2, held));
  const Proposal& q = s.propose(w, {1000, 5, 10});
  EXPECT_TRUE(q.admissions.empty());
  w[0].passed_over = 1;  // not urgent: hot passes it
  const Proposal& r = s.propose(w, {1000, 5, 10});
  ASSERT_EQ(r.admissions.size(), 1u);
  EXPECT_EQ(r.admissions[0].index, 1u);
  EXPECT_EQ(r.admissions[0].reserved_blocks, 1u);
}

TEST(AdmissionScheduler, RecordStepCountsPassedOverOnlyForEarlierArrivals) {
  KVCacheManager m(config(400));
  warm(m, 1, concat(iota_tokens(1, 80), iota_tokens(900, 2)));
  Request a = m.make_request(10, iota_tokens(5000, 40));
  Request hot = m.make_request(11, concat(iota_tokens(1, 80), iota_tokens(7000, 4)));
  Request c = m.make_request(12, iota_tokens(6000, 40));
  PrefixProbe probe(m);
  AdmissionScheduler s(probe, {});
  std::vector<WaitingRequest> w = {{&a, 0}, {&hot, 1}, {&c, 2}};
  const Proposal& p = s.propose(w, {4, 399, 10});  // budget: hot's 4 uncached tokens only
  ASSERT_EQ(p.admissions.size(), 1u);
  ASSERT_EQ(p.admissions[0].index, 1u);
  s.record_step(w, 1);
  EXPECT_EQ(w[0].passed_over, 1u);  // arrived before the admitted one
  EXPECT_EQ(w[1].passed_over, 0u);
  EXPECT_EQ(w[2].passed_over, 0u);  // arrived after it: not passed over
  EXPECT_THROW(s.record_step(w, 2), Error);
  std::vector<WaitingRequest> shorter(w.begin(), w.begin() + 2);
  EXPECT_THROW(s.record_step(shorter, 1), Error);
  EXPECT_EQ(w[0].passed_over, 1u);
}

// Before: passed_over wrapped from UINT32_MAX to 0 (an urgent request lost its urgency), and
// local_end + remote_tokens wrapped for a huge remote count, which then loaded nothing.
TEST(AdmissionScheduler, PassedOverAndRemoteTokensSaturate) {
  KVCacheManager m(config(400));
  warm(m, 1, concat(iota_tokens(1, 80), iota_tokens(900, 2)));
  Request a = m.make_request(10, iota_tokens(5000, 40));
  Request hot = m.make_request(11, concat(iota_tokens(1, 80), iota_tokens(7000, 4)));
  PrefixProbe probe(m);
  AdmissionSchedulerConfig lax;
  lax.max_passed_over = std::numeric_limits<std::uint32_t>::max();
  AdmissionScheduler s(probe, lax);
  std::vector<WaitingRequest> w = {{&a, 0}, {&hot, 1}};
  w[0].passed_over = std::numeric_limits<std::uint32_t>::max() - 1;  // not yet urgent
  const Proposal& p = s.propose(w, {4, 399, 10});  // budget: hot's 4 uncached tokens only
  ASSERT_EQ(p.admissions.size(), 1u);
  ASSERT_EQ(p.admissions[0].index, 1u);
  s.record_step(w, 1);
  EXPECT_EQ(w[0].passed_over, std::numeric_limits<std::uint32_t>::max());
  s.record_step(w, 1);
  EXPECT_EQ(w[0].passed_over, std::numeric_limits<std::uint32_t>::max());
  // Remote tokens: hot has 80 tokens cached on the GPU of 84; cap 83 (the last token is
  // computed), so whatever the remote count past 3, 3 tokens are loaded and 1 computed.
  AdmissionSchedulerConfig fcfs;
  fcfs.policy = SchedulePolicy::kFcfs;
  for (const std::size_t remote : {std::size_t{1} << 40, std::numeric_limits<std::size_t>::max(),
                                   std::numeric_limits<std::size_t>::max() - 70}) {
    std::vector<WaitingRequest> one = {{&hot, 0}};
    one[0].remote_tokens = remote;
    AdmissionScheduler u(probe, fcfs);
    const Proposal& r = u.propose(one, {1000, 399, 10});
    ASSERT_EQ(r.admissions.size(), 1u);
    EXPECT_EQ(r.admissions[0].cached.gpu_tokens, 80u);
    EXPECT_EQ(r.admissions[0].remote_tokens, 3u) << remote;
    EXPECT_EQ(r.admissions[0].chunk_tokens, 1u) << remote;
  }
}

TEST(AdmissionScheduler, RejectsBadInput) {
  KVCacheManager m(config(100));
  Request a = m.make_request(1, iota_tokens(1, 10));
  PrefixProbe probe(m);
  AdmissionScheduler s(probe, {});
  std::vector<WaitingRequest> dup = {{&a, 3}, {&a, 3}};
  EXPECT_THROW(s.propose(dup, {10, 10, 10}), Error);
  std::vector<WaitingRequest> null = {{nullptr, 0}};
  EXPECT_THROW(s.propose(null, {10, 10, 10}), Error);
  AdmissionSchedulerConfig bad;
  bad.host_token_weight = 1.5;
  EXPECT_THROW(AdmissionScheduler(probe, bad), Error);
}

TEST(AdmissionScheduler, RejectsARequestWaitingTwice) {
  // One request under two arrival ranks (or two requests with one id) was admitted twice in one
  // proposal, its blocks and tokens counted twice.
  KVCacheManager m(config(100));
  Request a = m.make_request(1, iota_tokens(1, 10));
  Request b = m.make_request(2, iota_tokens(100, 10));
  Request a_again = m.make_request(1, iota_tokens(200, 10));
  PrefixProbe probe(m);
  AdmissionScheduler s(probe, {});
  const std::vector<WaitingRequest> ok = {{&a, 3}, {&b, 4}};
  ASSERT_EQ(s.propose(ok, {100, 100, 10}).admissions.size(), 2u);
  for (const Request* twice : {&a, &a_again}) {
    const std::vector<WaitingRequest> dup = {{&a, 3}, {&b, 4}, {twice, 5}};
    testing::expect_error(
        [&] {
          (void)s.propose(dup, {100, 100, 10});
        },
        ErrorCode::kInvalidArgument, "request 1 is waiting twice");
  }
  // Nothing changed: the last proposal stands and record_step() still takes its waiting span.
  std::vector<WaitingRequest> kept = ok;
  EXPECT_NO_THROW(s.record_step(kept, 2));
}

TEST(AdmissionScheduler, RejectsAnUnknownPolicy) {
  // An out-of-range policy value once ran as kFcfs.
  KVCacheManager m(config(100));
  PrefixProbe probe(m);
  for (const int value : {2, -1, 255}) {
    AdmissionSchedulerConfig bad;
    bad.policy = static_cast<SchedulePolicy>(value);
    testing::expect_error([&] { AdmissionScheduler(probe, bad); }, ErrorCode::kInvalidArgument,
                          "unknown policy " + std::to_string(value));
  }
}

// A random engine: sessions of shared prefixes arrive, the proposal is admitted through the
// manager (stopping at the first allocation that fails), running requests finish at random. The
// test counts, independently of the scheduler, the steps each request waited while a later one
// was admitted, and checks the bound; and that no proposal exceeds its budget or free blocks.
TEST(AdmissionScheduler, AgingBoundAndResourceBoundsHoldInRandomStreams) {
  for (const std::uint32_t bound : {0u, 1u, 3u, 8u}) {
    for (const std::uint32_t seed : {1u, 2u, 3u}) {
      std::mt19937 rng(seed * 100 + bound);
      KVCacheManager m(config(120));
      PrefixProbe probe(m);
      AdmissionSchedulerConfig c;
      c.max_passed_over = bound;
      c.max_candidates = (seed % 2) ? 0 : 6;
      AdmissionScheduler s(probe, c);
      std::vector<std::vector<TokenId>> prefixes;
      for (int i = 0; i < 4; ++i) prefixes.push_back(random_tokens(4 * kBs + rng() % 40, rng()));
      struct W {
        std::unique_ptr<Request> r;
        std::uint64_t arrival;
        std::uint32_t passed = 0;  // the scheduler's count
        std::uint32_t truth = 0;   // the test's own count
      };
      std::vector<W> waiting;
      std::vector<std::unique_ptr<Request>> running;
      std::uint64_t next = 0;
      std::uint32_t worst = 0;
      for (int step = 0; step < 400; ++step) {
        for (int k = rng() % 3; k > 0; --k) {
          auto tokens = prefixes[rng() % prefixes.size()];
          const auto tail = random_tokens(1 + rng() % 30, rng());
          tokens.insert(tokens.end(), tail.begin(), tail.end());
          waiting.push_back({std::make_unique<Request>(m.make_request(next, tokens)), next});
          ++next;
        }
        for (std::size_t i = 0; i < running.size();) {  // finish some
          if (rng() % 3 == 0) {
            m.free(*running[i]);
            running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
          } else {
            ++i;
          }
        }
        std::vector<WaitingRequest> entries;
        for (const W& w : waiting) entries.push_back({w.r.get(), w.arrival, w.passed});
        StepResources res;
        res.token_budget = 20 + rng() % 80;
        res.free_blocks = static_cast<std::size_t>(m.block_pool().num_free_blocks());
        res.max_admissions = 1 + rng() % 4;
        const Proposal& p = s.propose(entries, res);
        std::size_t charged = 0, reserved = 0;
        for (const Admission& a : p.admissions) {
          EXPECT_GE(a.chunk_tokens, 1u);
          EXPECT_GE(a.reserved_blocks, a.new_blocks);
          charged += a.chunk_tokens;
          reserved += a.reserved_blocks;
        }
        ASSERT_LE(charged, res.token_budget);
        ASSERT_LE(reserved, res.free_blocks);
        ASSERT_LE(p.admissions.size(), res.max_admissions);
        // The engine admits in order; an allocation may still fail (then it stops).
        std::size_t admitted = 0;
        std::vector<bool> taken(waiting.size());
        for (const Admission& a : p.admissions) {
          Request& r = *waiting[a.index].r;
          const CacheHit hit = m.get_computed_blocks(r);
          if (!m.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit)) break;
          r.set_num_computed_tokens(r.num_tokens());
          taken[a.index] = true;
          ++admitted;
        }
        s.record_step(entries, admitted);
        std::uint64_t latest = 0;
        for (std::size_t i = 0; i < waiting.size(); ++i) {
          if (taken[i]) latest = std::max(latest, waiting[i].arrival);
        }
        std::vector<W> still;
        for (std::size_t i = 0; i < waiting.size(); ++i) {
          if (taken[i]) {
            running.push_back(std::move(waiting[i].r));
            continue;
          }
          W w = std::move(waiting[i]);
          w.passed = entries[i].passed_over;
          if (w.arrival < latest) ++w.truth;
          EXPECT_EQ(w.truth, w.passed);
          ASSERT_LE(w.truth, bound) << "request " << w.arrival << " seed " << seed;
          worst = std::max(worst, w.truth);
          still.push_back(std::move(w));
        }
        waiting = std::move(still);
      }
      m.check_invariants();
      if (bound > 0) {
        EXPECT_GT(worst, 0u) << "the stream never reordered anything";
      }
    }
  }
}

}  // namespace
}  // namespace pagedkv
