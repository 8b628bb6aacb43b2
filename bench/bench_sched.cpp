// Admission scheduling CPU cost (Google Benchmark; bench/results/sched.md).
//
// BM_Probe/L: PrefixProbe::probe() of 512 waiting requests whose prompts start with one of 8
// cached prefixes of L blocks (16 tokens, SHA-256, verified hits) then 100 uncached tokens;
// items_per_second counts requests, so 1e9 / items_per_second is ns per request.
// BM_GetComputedBlocks/L: the same requests through get_computed_blocks() (the mutating lookup
// an admission makes; it records stats), for comparison.
// BM_Propose/W: AdmissionScheduler::propose() over W such waiting requests (L = 256, every one a
// candidate), a step budget of 8,192 tokens; items_per_second counts waiting requests.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/sched/admission_scheduler.hpp"
#include "pagedkv/sched/prefix_probe.hpp"
#include "test_tokens.hpp"

namespace {

using namespace pagedkv;

constexpr std::uint32_t kBlockSize = 16;
constexpr std::size_t kPrefixes = 8;

struct Setup {
  explicit Setup(std::size_t prefix_blocks, std::size_t waiting) {
    KVCacheManagerConfig c;
    c.num_blocks = static_cast<std::int32_t>(kPrefixes * (prefix_blocks + 2) + 64);
    c.block_size = kBlockSize;
    c.hash_seed = "bench";
    m = std::make_unique<KVCacheManager>(c);
    std::vector<std::vector<TokenId>> prefixes;
    for (std::size_t p = 0; p < kPrefixes; ++p) {
      prefixes.push_back(random_tokens(prefix_blocks * kBlockSize, 1000 + p));
      auto warm_tokens = prefixes.back();
      warm_tokens.push_back(1);
      Request r = m->make_request(p, warm_tokens);
      if (!m->allocate_slots(r, r.num_tokens())) std::abort();
      r.set_num_computed_tokens(r.num_tokens());
      m->free(r);  // cached, in the free queue
    }
    for (std::size_t i = 0; i < waiting; ++i) {
      auto tokens = prefixes[i % kPrefixes];
      const auto tail = random_tokens(100, 5000 + i);
      tokens.insert(tokens.end(), tail.begin(), tail.end());
      requests.push_back(std::make_unique<Request>(m->make_request(100 + i, tokens)));
    }
  }
  std::unique_ptr<KVCacheManager> m;
  std::vector<std::unique_ptr<Request>> requests;
};

void BM_Probe(benchmark::State& state) {
  Setup s(static_cast<std::size_t>(state.range(0)), 512);
  PrefixProbe probe(*s.m);
  std::size_t tokens = 0;
  for (auto _ : state) {
    for (const auto& r : s.requests) tokens += probe.probe(*r).gpu_tokens;
  }
  benchmark::DoNotOptimize(tokens);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * s.requests.size()));
}
BENCHMARK(BM_Probe)->Arg(0)->Arg(16)->Arg(64)->Arg(256)->Arg(1024);

void BM_GetComputedBlocks(benchmark::State& state) {
  Setup s(static_cast<std::size_t>(state.range(0)), 512);
  std::size_t tokens = 0;
  for (auto _ : state) {
    for (const auto& r : s.requests) tokens += s.m->get_computed_blocks(*r).num_tokens;
  }
  benchmark::DoNotOptimize(tokens);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * s.requests.size()));
}
BENCHMARK(BM_GetComputedBlocks)->Arg(0)->Arg(16)->Arg(64)->Arg(256)->Arg(1024);

void BM_Propose(benchmark::State& state) {
  const auto w = static_cast<std::size_t>(state.range(0));
  Setup s(256, w);
  PrefixProbe probe(*s.m);
  AdmissionSchedulerConfig c;
  c.max_candidates = 0;
  AdmissionScheduler sched(probe, c);
  std::vector<WaitingRequest> waiting;
  for (std::size_t i = 0; i < w; ++i) waiting.push_back({s.requests[i].get(), i});
  StepResources res;
  res.token_budget = 8192;
  res.free_blocks = static_cast<std::size_t>(s.m->block_pool().num_free_blocks());
  res.max_admissions = 256;
  std::size_t admitted = 0;
  for (auto _ : state) admitted += sched.propose(waiting, res).admissions.size();
  benchmark::DoNotOptimize(admitted);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * w));
}
BENCHMARK(BM_Propose)->Arg(128)->Arg(512);

}  // namespace

BENCHMARK_MAIN();
