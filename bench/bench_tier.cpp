// Host tier CPU cost per host-hit block (Google Benchmark): lookup (GPU prefix, then the host
// run, verified), allocate_slots with its load plan, the commits of the plan's copies (one
// commit(ids) call per kind; *PerIdCommit: one call per copy), finish_loads (caching
// the loaded blocks in the GPU pool) and preempt. items_per_second counts host-hit blocks, so
// 1e9 / items_per_second is ns per block. Hashing is excluded (requests are hashed once).
//
// Two requests of `blocks` blocks alternate on a GPU pool that holds one of them, so every
// admission misses on the GPU and hits the host for all but the last block.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"
#include "test_tokens.hpp"

namespace {

using namespace pagedkv;

constexpr std::uint32_t kBlockSize = 16;
using Clock = std::chrono::steady_clock;

// A GPU pool that holds one request of `blocks` full blocks plus its partial one.
KVCacheManagerConfig gpu_config(std::size_t blocks) {
  KVCacheManagerConfig c;
  c.num_blocks = static_cast<std::int32_t>(blocks) + 2;
  c.block_size = kBlockSize;
  c.hash_seed = "bench";
  return c;
}

// Commits a plan's copies of one kind: in one call (as an engine does when a stream's batch of
// copies completes), or one call per copy (per_id).
void commit_all(TieredKVCacheManager& t, const std::vector<TransferId>& ids, bool per_id) {
  if (per_id) {
    for (const TransferId id : ids) t.commit(id, true);
  } else if (!ids.empty()) {
    t.commit(ids, true);
  }
}

void admit(TieredKVCacheManager& t, Request& r, std::uint64_t& host_blocks, bool per_id) {
  const TieredCacheHit hit = t.get_computed_blocks(r);
  auto alloc = t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
  if (!alloc) std::abort();  // the pool holds one request: cannot happen
  commit_all(t, alloc->transfers.eviction_ids, per_id);
  commit_all(t, alloc->transfers.load_ids, per_id);
  if (t.has_unfinished_loads(r.id())) {
    const LoadResult res = t.finish_loads(r);
    commit_all(t, res.transfers.store_ids, per_id);
  }
  commit_all(t, alloc->transfers.store_ids, per_id);
  host_blocks += hit.host_slots.size();
  t.preempt(r);  // releases the blocks; the request can be admitted again
}

// The timed body, not inlined so that a profiler can count it alone:
//   valgrind --tool=callgrind --toggle-collect='*timed_admit_pair*' bench_tier ...
[[gnu::noinline]] void timed_admit_pair(TieredKVCacheManager& t, Request& a, Request& b,
                                        std::uint64_t& host_blocks, bool per_id) {
  admit(t, a, host_blocks, per_id);
  admit(t, b, host_blocks, per_id);
}

// Two requests of `blocks` full blocks (plus one token, so the hit covers every full block) on
// a tier whose GPU pool holds one of them, warmed up so that both requests' blocks are on the
// host: each admission then misses on the GPU and hits the host.
struct Alternating {
  Alternating(std::size_t blocks, HostPolicy policy)
      : t(gpu_config(blocks), host_config(blocks, policy)),
        a(t.make_request(1, random_tokens(blocks * kBlockSize + 1, 1))),
        b(t.make_request(2, random_tokens(blocks * kBlockSize + 1, 2))) {
    std::uint64_t warm = 0;
    for (int i = 0; i < 4; ++i) {
      admit(t, a, warm, false);
      admit(t, b, warm, false);
    }
  }
  static HostTierConfig host_config(std::size_t blocks, HostPolicy policy) {
    HostTierConfig h;
    h.num_host_blocks = static_cast<std::int32_t>(4 * blocks);
    h.policy = policy;
    return h;
  }
  TieredKVCacheManager t;
  Request a, b;
};

// items_per_second counts host-hit blocks; fails the run unless every block of every timed
// admission was one.
void count_host_hits(benchmark::State& state, std::size_t blocks, std::uint64_t host_blocks) {
  if (host_blocks < 2 * blocks * state.iterations()) {
    state.SkipWithError("not every block was a host hit");
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(host_blocks));
}

// allocate_slots of an alternating admission: loads only (every block the allocation evicts is
// on the host already).
TierAllocation plan_loads(TieredKVCacheManager& t, Request& r, const TieredCacheHit& hit) {
  auto alloc = t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
  if (!alloc || !alloc->transfers.eviction_ids.empty() || !alloc->transfers.store_ids.empty()) {
    std::abort();
  }
  return std::move(*alloc);
}

// finish_loads of an alternating admission (nothing to store), then preempt.
void finish_and_release(TieredKVCacheManager& t, Request& r) {
  if (!t.finish_loads(r).transfers.store_ids.empty()) std::abort();
  t.preempt(r);
}

void run(benchmark::State& state, HostPolicy policy, bool per_id = false) {
  const auto blocks = static_cast<std::size_t>(state.range(0));
  Alternating s(blocks, policy);
  std::uint64_t host_blocks = 0;
  for (auto _ : state) timed_admit_pair(s.t, s.a, s.b, host_blocks, per_id);
  count_host_hits(state, blocks, host_blocks);
}

void BM_HostHitWriteThrough(benchmark::State& state) {
  run(state, HostPolicy::kWriteThrough);
}
void BM_HostHitWriteBack(benchmark::State& state) {
  run(state, HostPolicy::kWriteBack);
}
// The same, committing each copy by its own commit(id, ok) call.
void BM_HostHitWriteBackPerIdCommit(benchmark::State& state) {
  run(state, HostPolicy::kWriteBack, /*per_id=*/true);
}

// Where the time of BM_HostHitWriteBack (WriteThrough) goes, phase by phase: each call is timed on
// its own (steady_clock around it; about 29 ns per reading here, against about 60 us per
// admission), and the counters are ns per host-hit block: lookup_ns (get_computed_blocks: the GPU
// prefix, then the verified host run), plan_ns (allocate_slots: GPU blocks, evicting the other
// request's, the write-back of the evicted blocks, the pins and the load plan), commit_ns
// (commit(load_ids)), finish_ns (finish_loads: caching the loaded blocks in the GPU pool;
// write-through: the LRU refresh of their host copies) and release_ns (preempt: the GPU blocks back
// to the free queue).
void phases(benchmark::State& state, HostPolicy policy) {
  const auto blocks = static_cast<std::size_t>(state.range(0));
  Alternating s(blocks, policy);
  TieredKVCacheManager& t = s.t;
  std::uint64_t host_blocks = 0;
  double phase_ns[5] = {0, 0, 0, 0, 0};
  const auto phased_admit = [&](Request& r) {
    const Clock::time_point t0 = Clock::now();
    const TieredCacheHit hit = t.get_computed_blocks(r);
    const Clock::time_point t1 = Clock::now();
    const TierAllocation alloc = plan_loads(t, r, hit);
    const Clock::time_point t2 = Clock::now();
    t.commit(alloc.transfers.load_ids, true);
    const Clock::time_point t3 = Clock::now();
    const LoadResult res = t.finish_loads(r);
    const Clock::time_point t4 = Clock::now();
    if (!res.transfers.store_ids.empty()) std::abort();
    t.preempt(r);
    const Clock::time_point t5 = Clock::now();
    const Clock::time_point at[6] = {t0, t1, t2, t3, t4, t5};
    for (int p = 0; p < 5; ++p) {
      phase_ns[p] += std::chrono::duration<double, std::nano>(at[p + 1] - at[p]).count();
    }
    host_blocks += hit.host_slots.size();
  };
  for (auto _ : state) {
    phased_admit(s.a);
    phased_admit(s.b);
  }
  count_host_hits(state, blocks, host_blocks);
  const double n = static_cast<double>(std::max<std::uint64_t>(host_blocks, 1));
  const char* names[5] = {"lookup_ns", "plan_ns", "commit_ns", "finish_ns", "release_ns"};
  for (int p = 0; p < 5; ++p) state.counters[names[p]] = phase_ns[p] / n;
}

// Exactly what the target names: lookup + plan + commit of each admission (the same calls
// as the first three phases above) as one span, with two clock readings per admission instead of
// six (a reading costs about 29 ns here: 0.45 ns per block at 64 blocks). finish_loads and
// preempt run outside the span. Manual time: items_per_second is host-hit blocks per second of
// the spans, so 1e9 / items_per_second is the cost per host-hit block.
void lookup_plan_commit(benchmark::State& state, HostPolicy policy) {
  const auto blocks = static_cast<std::size_t>(state.range(0));
  Alternating s(blocks, policy);
  TieredKVCacheManager& t = s.t;
  std::uint64_t host_blocks = 0;
  const auto admit_timed = [&](Request& r) {
    const Clock::time_point t0 = Clock::now();
    const TieredCacheHit hit = t.get_computed_blocks(r);
    const TierAllocation alloc = plan_loads(t, r, hit);
    t.commit(alloc.transfers.load_ids, true);
    const Clock::time_point t1 = Clock::now();
    finish_and_release(t, r);
    host_blocks += hit.host_slots.size();
    return std::chrono::duration<double>(t1 - t0).count();
  };
  for (auto _ : state) {
    double seconds = admit_timed(s.a);
    seconds += admit_timed(s.b);
    state.SetIterationTime(seconds);
  }
  count_host_hits(state, blocks, host_blocks);
}
void BM_HostHitLookupPlanCommitWriteBack(benchmark::State& state) {
  lookup_plan_commit(state, HostPolicy::kWriteBack);
}
void BM_HostHitLookupPlanCommitWriteThrough(benchmark::State& state) {
  lookup_plan_commit(state, HostPolicy::kWriteThrough);
}

void BM_HostHitPhasesWriteBack(benchmark::State& state) {
  phases(state, HostPolicy::kWriteBack);
}
void BM_HostHitPhasesWriteThrough(benchmark::State& state) {
  phases(state, HostPolicy::kWriteThrough);
}

// The same two requests on the same GPU pool without a host tier: every admission misses and
// allocates, evicts, caches and frees its blocks (what the GPU pool spends per block anyway; the
// host-hit figures above include this work). items_per_second counts the blocks a tier would
// have loaded, so the two figures compare per block.
void BM_GpuMissWithoutTier(benchmark::State& state) {
  const auto blocks = static_cast<std::size_t>(state.range(0));
  KVCacheManager m(gpu_config(blocks));
  Request a = m.make_request(1, random_tokens(blocks * kBlockSize + 1, 1));
  Request b = m.make_request(2, random_tokens(blocks * kBlockSize + 1, 2));
  std::uint64_t missed = 0;
  const auto admit_gpu = [&](Request& r) {
    const CacheHit hit = m.get_computed_blocks(r);
    if (!hit.blocks.empty()) std::abort();  // the other request evicted every block
    if (!m.allocate_slots(r, r.num_tokens(), hit)) std::abort();
    missed += blocks;
    m.preempt(r);
  };
  for (int i = 0; i < 4; ++i) {
    admit_gpu(a);
    admit_gpu(b);
  }
  missed = 0;
  for (auto _ : state) {
    admit_gpu(a);
    admit_gpu(b);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(missed));
}

BENCHMARK(BM_HostHitWriteThrough)->Arg(64)->Arg(1024);
BENCHMARK(BM_GpuMissWithoutTier)->Arg(64)->Arg(1024);
BENCHMARK(BM_HostHitWriteBack)->Arg(64)->Arg(1024);
BENCHMARK(BM_HostHitWriteBackPerIdCommit)->Arg(64)->Arg(1024);
BENCHMARK(BM_HostHitPhasesWriteBack)->Arg(64)->Arg(1024);
BENCHMARK(BM_HostHitPhasesWriteThrough)->Arg(64)->Arg(1024);
BENCHMARK(BM_HostHitLookupPlanCommitWriteBack)
    ->Arg(16)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->UseManualTime();
BENCHMARK(BM_HostHitLookupPlanCommitWriteThrough)
    ->Arg(16)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->UseManualTime();
// A fixed count for instruction counts: 8 timed pairs = 16,384 host-hit blocks, so that
//   valgrind --tool=callgrind --toggle-collect='*timed_admit_pair*' bench_tier
//     --benchmark_filter='WriteBack/1024/iterations:8'
// collects exactly those (instructions per block = total Ir / 16,384).
BENCHMARK(BM_HostHitWriteThrough)->Arg(1024)->Iterations(8);
BENCHMARK(BM_HostHitWriteBack)->Arg(1024)->Iterations(8);

}  // namespace

BENCHMARK_MAIN();
