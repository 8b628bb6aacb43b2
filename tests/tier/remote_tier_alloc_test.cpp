// RemoteTier under std::bad_alloc at every allocation point of a poll() that submits fills or
// puts, or handles their completions: nothing begun is left behind. A fill begun
// (begin_fill_known: a pinned host slot) is always committed, a batch the store accepted always
// has its entry (its completions are handled, its slots unpinned), a completion that could not
// be handled is handled at the next poll, and the tier drains and destroys cleanly.
//
// This binary replaces the global operator new with one that can be told to fail its Nth
// allocation (as strong_guarantee_test does). The store (fault_store.hpp, no faults, no delay)
// never fails: its calls run with injection suspended, so every injected failure is one of the
// remote tier's or the host tier's.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fault_store.hpp"
#include "hybrid_episode.hpp"
#include "nth_alloc_failure.hpp"
#include "pagedkv/tier/remote_tier.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv {
namespace {

using namespace std::chrono_literals;
using Clock = RemoteTier::Clock;
using Rng = std::mt19937_64;

constexpr std::uint32_t kBs = 4;
constexpr std::int32_t kGpuBlocks = 64;
constexpr std::int32_t kHostBlocks = 48;
constexpr std::size_t kBytes = 64;  // per block: the payloads' bytes do not matter here

// Forwards to a store with allocation failures suspended.
class NoFailStore final : public RemoteStore {
 public:
  explicit NoFailStore(RemoteStore& s) : s_(s) {}
  std::optional<RemoteTicket> exists(std::span<const BlockHash> keys) override {
    alloc_failure::Suspend s;
    return s_.exists(keys);
  }
  std::optional<RemoteTicket> get(std::span<const RemoteGet> ops) override {
    alloc_failure::Suspend s;
    return s_.get(ops);
  }
  std::optional<RemoteTicket> put(std::span<const RemotePut> ops) override {
    alloc_failure::Suspend s;
    return s_.put(ops);
  }
  std::size_t poll(std::vector<RemoteCompletion>& out) override {
    alloc_failure::Suspend s;
    return s_.poll(out);
  }
  std::size_t in_flight() const override { return s_.in_flight(); }
  RemoteStoreStats stats() const override { return s_.stats(); }
  std::string_view name_space() const noexcept override { return s_.name_space(); }

 private:
  RemoteStore& s_;
};

struct Engine {
  // hybrid: a full-attention group and a sliding window of 8 tokens (start_hybrid_fills).
  // host_blocks: the host tier's slots (fewer than a prompt's blocks: fills find no slot).
  Engine(remote_test::FaultBackend& backend, Rng& rng, RemoteStorePolicy policy,
         bool hybrid = false, std::int32_t host_blocks = kHostBlocks)
      : fault(backend, rng, fault_config()), store(fault) {
    KVCacheManagerConfig c;
    c.num_blocks = kGpuBlocks;
    c.block_size = kBs;
    c.hash_seed = "remote-tier-alloc-test";
    HostTierConfig h;
    h.num_host_blocks = host_blocks;
    h.policy = HostPolicy::kWriteThrough;
    h.bytes_per_block = kBytes;
    if (hybrid) {
      c = hybrid_test::hybrid_config(kGpuBlocks, 8, 0);
      h = hybrid_test::host_config(host_blocks, HostPolicy::kWriteThrough, WindowStoreRule::kAll);
      h.bytes_per_block = kBytes;
    }
    tier = std::make_unique<TieredKVCacheManager>(c, h);
    host.assign(static_cast<std::size_t>(host_blocks + 1) * kBytes, std::byte{0});
    RemoteTierConfig rc;
    rc.bytes_per_block = kBytes;
    rc.policy = PrefetchPolicy::kWaitComplete;
    rc.store_policy = policy;
    rc.eviction_staging_blocks = 64;
    rc.drain_timeout = 100ms;
    remote = std::make_unique<RemoteTier>(*tier, store, host, rc);
  }
  static remote_test::FaultConfig fault_config() {
    remote_test::FaultConfig f;
    f.max_value_bytes = kBytes;
    f.queue_capacity = 4096;
    return f;
  }

  remote_test::FaultStore<Rng> fault;
  NoFailStore store;
  std::unique_ptr<TieredKVCacheManager> tier;
  std::vector<std::byte> host;
  std::unique_ptr<RemoteTier> remote;  // destroyed first (declared last)
  Clock::time_point now{};
};

std::vector<TokenId> prompt_of(std::uint32_t seed, std::size_t n) {
  std::vector<TokenId> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>((seed * 7919 + i * 31) % 1000);
  return t;
}

// Runs a request's prefill (no bytes moved: the payloads do not matter) and frees it: its blocks
// are cached in the host tier (and queued for puts, write-through).
void run(Engine& e, RequestId id, const std::vector<TokenId>& prompt) {
  Request req = e.tier->make_request(id, prompt);
  e.remote->add_request(req, e.now);
  for (int i = 0; i < 100 && !e.remote->ready(id, e.now); ++i) {
    e.now += 1ms;
    e.remote->poll(e.now);
  }
  ASSERT_TRUE(e.remote->ready(id, e.now));
  e.remote->remove_request(id);
  const TieredCacheHit hit = e.tier->get_computed_blocks(req);
  auto a = e.tier->allocate_slots(req, prompt.size() - hit.num_tokens(), hit);
  ASSERT_TRUE(a.has_value());
  TierPlan plan = std::move(a->transfers);
  for (TransferId t : plan.eviction_ids) e.tier->commit(t, true);
  for (TransferId t : plan.load_ids) e.tier->commit(t, true);
  std::vector<TierPlan> after;
  if (!plan.load_ids.empty()) after.push_back(e.tier->finish_loads(req).transfers);
  for (TransferId t : plan.store_ids) e.tier->commit(t, true);
  for (TierPlan& p : after) {
    for (TransferId t : p.store_ids) e.tier->commit(t, true);
  }
  e.tier->free(req);
}

// Polls until every op completed and no slot is pinned for a put; false if that never happens.
bool drain(Engine& e) {
  for (int i = 0; i < 200; ++i) {
    if (e.remote->in_flight() == 0 && e.remote->pinned_for_puts() == 0) return true;
    e.now += 1ms;
    e.remote->poll(e.now);
  }
  return false;
}

// After an injected failure (or none): the tier drains, no transfer is left live, and the remote
// tier is destroyed (not when it never drained: its destructor would wait for ever on a staged
// put whose batch it lost).
void finish(Engine& e, long k) {
  const bool drained = drain(e);
  EXPECT_TRUE(drained) << "failure at allocation " << k << ": ops never completed (in flight "
                       << e.remote->in_flight() << ", pinned " << e.remote->pinned_for_puts()
                       << ")";
  e.tier->check_invariants();
  EXPECT_EQ(e.tier->num_in_flight(), 0u)
      << "failure at allocation " << k << ": a fill begun was never committed";
  if (drained) {
    e.remote.reset();
  } else {
    (void)e.remote.release();  // leaked on purpose: see above
  }
}

// Three polls (the probe's completions, the fills, their completions) with the (k + 1)th
// allocation failing; whether it did fail (the poll threw std::bad_alloc).
bool poll_failing_at(Engine& b, long k) {
  bool threw = false;
  alloc_failure::fail_at = k;
  try {
    for (int i = 0; i < 3; ++i) {
      b.now += 1ms;
      b.remote->poll(b.now);
    }
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  alloc_failure::fail_at = -1;
  return threw;
}

const std::vector<TokenId> kPrompt = prompt_of(1, 42);  // 10 full blocks to share

// Engine A, which ran kPrompt and stored its blocks in `backend` (write-through); null (with a
// failure recorded) when they were not all stored. Kept alive beside engine B, as the store's.
std::unique_ptr<Engine> store_prompt(remote_test::FaultBackend& backend, Rng& rng, bool hybrid) {
  auto a = std::make_unique<Engine>(backend, rng, RemoteStorePolicy::kWriteThrough, hybrid);
  run(*a, 1, kPrompt);
  if (::testing::Test::HasFailure() || !drain(*a) || a->remote->stats().stored_blocks < 10) {
    ADD_FAILURE() << "engine A did not store the prompt's blocks";
    return nullptr;
  }
  return a;
}

// Engine B loads what engine A stored; its polls that start the fills and handle their
// completions fail at their 1st, 2nd, ... allocation.
TEST(RemoteTierAlloc, FillsSurviveAFailedAllocationAnywhereInPoll) {
  for (const bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "hybrid" : "one group");
    long k = 0;
    for (bool threw = true; threw; ++k) {
      Rng rng(1);
      remote_test::FaultBackend backend;
      backend.capacity = 1024;
      const std::unique_ptr<Engine> a = store_prompt(backend, rng, hybrid);
      ASSERT_TRUE(a);

      Engine b(backend, rng, RemoteStorePolicy::kWriteThrough, hybrid);
      Request req = b.tier->make_request(7, kPrompt);
      b.remote->add_request(req, b.now);
      threw = poll_failing_at(b, k);
      if (!threw) {
        EXPECT_GE(b.remote->stats().loaded_blocks, 2u);  // the fills did load
      }
      finish(b, k);
      ASSERT_FALSE(HasFailure()) << "failure injected at allocation " << k;
    }
    EXPECT_GT(k, 3);  // the loop did inject failures
  }
}

// The fill counters of a request whose fills start after a failed try (the request stays probing
// and its fills are started again at the next poll) equal those of a run without the failure:
// blocks skipped (a window group's blocks outside its window at the hit, hybrid), hits dropped for
// want of a host slot (engine B's host tier holds fewer blocks than the hit) and the hit run are
// each counted once. They used to be counted when computed, before what may throw, and so again
// at the retry.
TEST(RemoteTierAlloc, FillCountersCountOnceWhenStartingFillsIsRetried) {
  constexpr std::int32_t kFewHostBlocks = 6;
  struct Counts {
    std::uint64_t probe_hit_blocks, fills_no_slot, window_blocks_not_loaded, fills, loaded;
    std::vector<std::uint64_t> group_window;
    bool operator==(const Counts&) const = default;
  };
  const auto counts_of = [](const RemoteTier& r) {
    const RemoteTierStats s = r.stats();
    Counts c{s.probe_hit_blocks,
             s.fills_no_slot,
             s.window_blocks_not_loaded,
             s.fills,
             s.loaded_blocks,
             {}};
    for (const RemoteTierGroupStats& g : r.group_stats()) {
      c.group_window.push_back(g.window_blocks_not_loaded);
    }
    return c;
  };
  const auto print = [](const Counts& c) {
    std::ostringstream s;
    s << "probe_hit_blocks " << c.probe_hit_blocks << ", fills_no_slot " << c.fills_no_slot
      << ", window_blocks_not_loaded " << c.window_blocks_not_loaded << ", fills " << c.fills
      << ", loaded " << c.loaded << ", per group window_blocks_not_loaded";
    for (const std::uint64_t w : c.group_window) s << ' ' << w;
    return s.str();
  };
  for (const bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "hybrid" : "one group");
    std::optional<Counts> reference;  // of the run without a failure (fail_at -1 first)
    long k = -1;
    for (bool threw = true; threw; ++k) {
      Rng rng(3);
      remote_test::FaultBackend backend;
      backend.capacity = 1024;
      const std::unique_ptr<Engine> a = store_prompt(backend, rng, hybrid);
      ASSERT_TRUE(a);

      Engine b(backend, rng, RemoteStorePolicy::kWriteThrough, hybrid, kFewHostBlocks);
      Request req = b.tier->make_request(7, kPrompt);
      b.remote->add_request(req, b.now);
      threw = poll_failing_at(b, k);
      // The failed step again (and the rest): the request's fills start and complete.
      for (int i = 0; i < 100 && !b.remote->ready(7, b.now); ++i) {
        b.now += 1ms;
        b.remote->poll(b.now);
      }
      ASSERT_TRUE(b.remote->ready(7, b.now)) << "failure at allocation " << k;
      ASSERT_TRUE(drain(b)) << "failure at allocation " << k;
      const Counts c = counts_of(*b.remote);
      if (!reference) {
        ASSERT_FALSE(threw);
        reference = c;
        // The case the test is about: hits dropped for want of a slot, and (hybrid) window
        // blocks not loaded.
        EXPECT_GT(c.fills_no_slot, 0u) << print(c);
        if (hybrid) {
          EXPECT_GT(c.window_blocks_not_loaded, 0u) << print(c);
        }
        threw = true;  // go on with fail_at 0
      } else {
        EXPECT_EQ(c, *reference) << "failure at allocation " << k << ": " << print(c)
                                 << "; without a failure: " << print(*reference);
      }
      b.remote->remove_request(7);
      finish(b, k);
      ASSERT_FALSE(HasFailure()) << "failure injected at allocation " << k;
    }
    EXPECT_GT(k, 3);  // the loop did inject failures
  }
}

// Engine A's polls that submit its puts (write-through, and staged copies of evicted blocks) and
// handle their completions fail at their 1st, 2nd, ... allocation.
TEST(RemoteTierAlloc, PutsSurviveAFailedAllocationAnywhereInPoll) {
  for (const RemoteStorePolicy policy :
       {RemoteStorePolicy::kWriteThrough, RemoteStorePolicy::kOnHostEviction}) {
    long k = 0;
    for (bool threw = true; threw; ++k) {
      Rng rng(2);
      remote_test::FaultBackend backend;
      backend.capacity = 1024;
      Engine a(backend, rng, policy);
      // Enough prompts to evict host blocks (kOnHostEviction puts only evicted ones).
      for (RequestId id = 1; id <= 8; ++id) {
        run(a, id, prompt_of(static_cast<std::uint32_t>(id), 42));
        if (id < 8) {
          ASSERT_TRUE(drain(a));
        }
      }
      threw = false;
      alloc_failure::fail_at = k;
      try {
        for (int i = 0; i < 3; ++i) {  // submit the puts, handle their completions
          a.now += 1ms;
          a.remote->poll(a.now);
        }
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      alloc_failure::fail_at = -1;
      finish(a, k);
      ASSERT_FALSE(HasFailure()) << "policy " << static_cast<int>(policy)
                                 << ", failure injected at allocation " << k;
    }
    EXPECT_GT(k, 1);
  }
}

}  // namespace
}  // namespace pagedkv
