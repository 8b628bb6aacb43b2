// KV router index: memory per (block, engine) entry and lookup cost per block (targets: <= 64
// bytes, <= 100 ns). Figures: bench/results/router.md.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "pagedkv/events/block_index.hpp"

namespace {

using pagedkv::events::BlockIndex;
using pagedkv::events::PrefixMatch;
using pagedkv::events::Tier;

// `engines` engines each caching `blocks` blocks in chains of 64; `shared` of every engine's
// chains are common to all engines (a system prompt), the rest its own.
struct Cluster {
  BlockIndex index;
  std::vector<std::vector<std::uint64_t>> chains;  // request block ids to look up
};

Cluster build(std::size_t engines, std::size_t blocks, double shared) {
  Cluster c;
  std::mt19937_64 rng(1);
  const std::size_t chain = 64;
  const std::size_t shared_chains = static_cast<std::size_t>(shared * double(blocks / chain));
  std::vector<std::vector<std::uint64_t>> common(shared_chains);
  for (auto& ch : common) {
    for (std::size_t i = 0; i < chain; ++i) ch.push_back(rng());
  }
  for (std::size_t e = 0; e < engines; ++e) {
    for (const auto& ch : common) {
      for (std::uint64_t id : ch) c.index.add(id, e, Tier::kGpu);
    }
    for (std::size_t k = shared_chains; k < blocks / chain; ++k) {
      std::vector<std::uint64_t> ch;
      for (std::size_t i = 0; i < chain; ++i) {
        ch.push_back(rng());
        c.index.add(ch.back(), e, Tier::kGpu);
      }
      if (c.chains.size() < 4096) c.chains.push_back(std::move(ch));
    }
  }
  return c;
}

// Memory: counters report bytes per (block, engine) entry.
void BM_IndexMemory(benchmark::State& state) {
  const std::size_t engines = static_cast<std::size_t>(state.range(0));
  const double shared = static_cast<double>(state.range(1)) / 100.0;
  for (auto _ : state) {
    Cluster c = build(engines, 32000, shared);
    state.counters["bytes_per_entry"] =
        double(c.index.memory_bytes()) / double(c.index.num_entries());
    state.counters["entries"] = double(c.index.num_entries());
  }
}
BENCHMARK(BM_IndexMemory)->Args({4, 0})->Args({4, 50})->Args({16, 0})->Args({32, 50})
    ->Unit(benchmark::kMillisecond)->Iterations(1);

// Lookup: the longest prefix of a 64-block request on every engine; time per block looked up.
void BM_LongestPrefix(benchmark::State& state) {
  const std::size_t engines = static_cast<std::size_t>(state.range(0));
  Cluster c = build(engines, 32000, 0.0);
  std::vector<PrefixMatch> out(engines);
  std::size_t i = 0;
  std::uint64_t blocks = 0;
  for (auto _ : state) {
    const auto& ch = c.chains[i++ % c.chains.size()];
    c.index.longest_prefixes(ch, out);
    benchmark::DoNotOptimize(out.data());
    blocks += ch.size();
  }
  state.counters["ns_per_block"] =
      benchmark::Counter(double(blocks), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_LongestPrefix)->Arg(4)->Arg(32);

}  // namespace

BENCHMARK_MAIN();
