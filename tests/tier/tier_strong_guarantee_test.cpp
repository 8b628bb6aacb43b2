// The tiered manager under std::bad_alloc at every allocation point of every call.
//
// This binary replaces the global operator new with one that can be told to fail its Nth
// allocation. A scripted engine loop (lookups, allocations with GPU and host hits, batch commits
// of stores, evictions and loads, finish_loads, decode steps, frees; requests with a cache salt
// and a LoRA adapter; GPU and host pools small enough that both evict) runs on fresh tiers: for
// every step c and every n, the steps before c run cleanly, then step c's tier call fails at its
// nth allocation. A call either throws bad_alloc and leaves the tier's snapshot exactly as it was
// (and its invariants whole), or completes: a store, eviction, fill or event the tier could no
// longer back out of is then dropped and counted (TierStats::stores_skipped_no_memory,
// events_dropped_no_memory), and the rest of the script must still run (every transfer can be
// committed, every request freed) with the invariants whole. Found by review: allocate_slots
// recorded extra keys and planned stores after the GPU manager had committed, a batch commit
// stopped half-way, and the event forwarding terminated the process.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "nth_alloc_failure.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv {
namespace {

struct Aborted {};  // the injected call threw: the step stops there

struct Ctx {
  TieredKVCacheManager tier;
  std::vector<std::optional<Request>> reqs;
  std::vector<TieredCacheHit> hits;
  std::vector<TransferId> pending;  // every transfer planned and not yet committed
  // The injection of this run: the call to fail (-1: none) and what happened.
  long fail_at = -1;
  bool injected_call = false;
  bool threw = false, absorbed = false;
  std::optional<TieredSnapshot> before;

  Ctx(const KVCacheManagerConfig& c, const HostTierConfig& h) : tier(c, h), reqs(8), hits(8) {}

  // Runs one tier call, failing its fail_at-th allocation when this is the injected call.
  template <typename F>
  void call(F&& f) {
    if (!injected_call) {
      f();
      return;
    }
    injected_call = false;
    before = tier.snapshot();
    alloc_failure::fired = false;
    alloc_failure::fail_at = fail_at;
    try {
      f();
    } catch (const std::bad_alloc&) {
      alloc_failure::fail_at = -1;
      threw = true;
      throw Aborted{};
    }
    alloc_failure::fail_at = -1;
    absorbed = alloc_failure::fired;
  }
  void take(const TierPlan& p) {
    pending.insert(pending.end(), p.load_ids.begin(), p.load_ids.end());
    pending.insert(pending.end(), p.store_ids.begin(), p.store_ids.end());
    pending.insert(pending.end(), p.eviction_ids.begin(), p.eviction_ids.end());
  }
};

using Step = std::function<void(Ctx&)>;

std::vector<TokenId> tokens(TokenId base, std::size_t n) {
  std::vector<TokenId> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = base + static_cast<TokenId>(i * 7 % 31);
  return t;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The script: request k's lookup, allocation (of everything the hit leaves), commits, loads'
// finish, decode steps and free.
std::vector<Step> script() {
  RequestHashKeys salted;
  salted.cache_salt = "tenant";
  RequestHashKeys adapter;
  adapter.lora_name = "an-adapter-name-longer-than-the-small-string-buffer";
  const std::vector<TokenId> a = tokens(1, 22);
  const auto lookup = [](std::size_t k, std::vector<TokenId> prompt, RequestHashKeys keys) {
    return [k, prompt, keys](Ctx& x) {
      if (!x.reqs[k])
        x.reqs[k].emplace(x.tier.make_request(static_cast<RequestId>(k + 1), prompt, keys));
      x.call([&] { x.hits[k] = x.tier.get_computed_blocks(*x.reqs[k]); });
    };
  };
  const auto allocate = [](std::size_t k) {
    return [k](Ctx& x) {
      Request& r = *x.reqs[k];
      const TieredCacheHit& hit = x.hits[k];
      const std::size_t n = r.num_tokens() - hit.gpu.num_tokens - hit.num_host_tokens;
      std::optional<TierAllocation> got;
      x.call([&] { got = x.tier.allocate_slots(r, n, hit); });
      if (!got) return;  // out of blocks: a normal outcome
      x.take(got->transfers);
      if (got->transfers.load_ids.empty()) r.set_num_computed_tokens(r.num_tokens());
      x.hits[k] = TieredCacheHit{};
    };
  };
  const auto commit_all = [](bool ok) {
    return [ok](Ctx& x) {
      if (x.pending.empty()) return;
      x.call([&] { x.tier.commit(x.pending, ok); });
      x.pending.clear();
    };
  };
  const auto finish = [](std::size_t k) {
    return [k](Ctx& x) {
      Request& r = *x.reqs[k];
      if (!x.tier.has_unfinished_loads(r.id())) return;
      LoadResult got;
      x.call([&] { got = x.tier.finish_loads(r); });
      x.take(got.transfers);
      r.set_num_computed_tokens(got.rolled_back ? got.num_computed_tokens : r.num_tokens());
    };
  };
  const auto decode = [](std::size_t k) {
    return [k](Ctx& x) {
      Request& r = *x.reqs[k];
      if (r.num_computed_tokens() != r.num_tokens()) return;  // (a rolled-back request)
      r.append_token(5);  // (the caller's request, not the tier's state)
      std::optional<TierAllocation> got;
      x.call([&] { got = x.tier.allocate_slots(r, 1, TieredCacheHit{}); });
      if (!got) return;
      x.take(got->transfers);
      r.set_num_computed_tokens(r.num_tokens());
    };
  };
  const auto free = [](std::size_t k) {
    return [k](Ctx& x) {
      x.call([&] { x.tier.free(*x.reqs[k]); });
      x.reqs[k].reset();
    };
  };
  return {lookup(0, a, salted),
          allocate(0),
          commit_all(true),
          decode(0),
          commit_all(true),
          free(0),
          lookup(1, concat(a, tokens(40, 10)), salted),
          allocate(1),
          commit_all(true),
          lookup(2, tokens(90, 30), adapter),
          allocate(2),
          commit_all(false),
          free(1),
          free(2),
          lookup(3, tokens(200, 40), {}),
          allocate(3),
          commit_all(true),
          free(3),
          lookup(6, tokens(300, 44), {}),
          allocate(6),
          commit_all(true),
          free(6),
          lookup(4, concat(a, tokens(40, 10)), salted),
          allocate(4),
          commit_all(true),
          finish(4),
          commit_all(true),
          decode(4),
          commit_all(true),
          free(4),
          lookup(5, concat(tokens(90, 30), tokens(7, 9)), adapter),
          allocate(5),
          commit_all(true),
          finish(5),
          commit_all(true),
          free(5)};
}

struct Counts {
  std::uint64_t threw = 0, absorbed = 0, skipped = 0, events_dropped = 0;
};

void run_config(const KVCacheManagerConfig& c, const HostTierConfig& h, Counts& counts,
                bool small_host) {
  const std::vector<Step> steps = script();
  {
    // The script reaches what it means to: host hits loaded, blocks stored in the host, and
    // both pools evicting.
    Ctx x(c, h);
    for (const Step& step : steps) step(x);
    x.tier.check_invariants();
    const TierStats s = x.tier.stats();
    std::printf("clean run: %llu loaded, %llu stored, %llu host evictions, %llu GPU evictions\n",
                static_cast<unsigned long long>(s.loaded_blocks),
                static_cast<unsigned long long>(s.stored_blocks),
                static_cast<unsigned long long>(s.host_evictions),
                static_cast<unsigned long long>(x.tier.gpu().stats().evictions));
    if (small_host) {
      // (Selective stores only the blocks hit on the GPU: too few to fill even a small host.)
      if (h.policy != HostPolicy::kWriteThroughSelective) {
        EXPECT_GT(s.host_evictions, 0u);
      }
    } else {
      EXPECT_GT(s.loaded_blocks, 0u);
    }
    EXPECT_GT(s.stored_blocks, 0u);
    EXPECT_GT(x.tier.gpu().stats().evictions, 0u);
  }
  for (std::size_t s = 0; s < steps.size(); ++s) {
    for (long n = 0;; ++n) {
      Ctx x(c, h);
      for (std::size_t k = 0; k < s; ++k) steps[k](x);
      x.fail_at = n;
      x.injected_call = true;
      try {
        steps[s](x);
      } catch (const Aborted&) {
      }
      if (x.injected_call) break;  // the step made no tier call
      const std::string where = "step " + std::to_string(s) + ", allocation " + std::to_string(n);
      if (x.threw) {
        ++counts.threw;
        ASSERT_TRUE(x.tier.snapshot() == *x.before) << where << ": a failed call changed the tier";
        ASSERT_NO_THROW(x.tier.check_invariants()) << where;
        continue;
      }
      ASSERT_NO_THROW(x.tier.check_invariants()) << where;
      if (!x.absorbed) break;  // completed before the nth allocation: every point was tried
      ++counts.absorbed;
      // A dropped store or event: the rest of the engine loop still runs.
      ASSERT_NO_THROW({
        for (std::size_t k = s + 1; k < steps.size(); ++k) steps[k](x);
      }) << where;
      ASSERT_NO_THROW(x.tier.check_invariants()) << where << ", after the rest of the script";
      EXPECT_EQ(x.tier.stats().host_slots_pinned, 0) << where;
      counts.skipped += x.tier.stats().stores_skipped_no_memory;
      counts.events_dropped += x.tier.stats().events_dropped_no_memory;
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

class TierStrongGuarantee
    : public ::testing::TestWithParam<std::tuple<HostPolicy, HashScheme, bool>> {};

TEST_P(TierStrongGuarantee, EveryAllocationFailureLeavesTheTierUnchangedOrCompletes) {
  const auto [policy, scheme, hybrid] = GetParam();
  KVCacheManagerConfig c;
  c.num_blocks = 24;
  c.hash_scheme = scheme;
  c.hash_seed = "tier-strong";
  c.enable_kv_events = true;
  if (hybrid) {
    c.groups = {AttentionSpec::full(4), AttentionSpec::sliding(4, 9)};
  } else {
    c.block_size = 4;
  }
  HostTierConfig h;
  h.policy = policy;
  h.selective_hits = 1;
  h.bytes_per_block = 64;
  Counts counts;
  // A host that evicts (small) and one that keeps what it is given (the loads of host hits).
  for (const bool small_host : {true, false}) {
    h.num_host_blocks = small_host ? (hybrid ? 30 : 14) : (hybrid ? 100 : 40);
    run_config(c, h, counts, small_host);
    if (::testing::Test::HasFatalFailure()) return;
  }
  std::printf("%llu failed calls unchanged, %llu completed dropping %llu stores, %llu events\n",
              static_cast<unsigned long long>(counts.threw),
              static_cast<unsigned long long>(counts.absorbed),
              static_cast<unsigned long long>(counts.skipped),
              static_cast<unsigned long long>(counts.events_dropped));
  EXPECT_GT(counts.threw, 100u) << "too few failures injected: the test is vacuous";
}

INSTANTIATE_TEST_SUITE_P(
    Tiers, TierStrongGuarantee,
    ::testing::Combine(::testing::Values(HostPolicy::kWriteThrough, HostPolicy::kWriteBack,
                                         HostPolicy::kWriteThroughSelective),
                       ::testing::Values(HashScheme::kSha256, HashScheme::kXxh3_128),
                       ::testing::Bool()),
    [](const auto& param_info) {
      const HostPolicy p = std::get<0>(param_info.param);
      std::string name = p == HostPolicy::kWriteThrough ? "WriteThrough"
                         : p == HostPolicy::kWriteBack  ? "WriteBack"
                                                        : "Selective";
      name += std::get<1>(param_info.param) == HashScheme::kSha256 ? "Sha256" : "Xxh3";
      if (std::get<2>(param_info.param)) name += "Hybrid";
      return name;
    });

}  // namespace
}  // namespace pagedkv
