// KV router index: memory per (block, engine) entry and lookup cost per block (targets: <= 64
// bytes, <= 100 ns). Figures: bench/results/router.md.
//
// `bench_router --hostile [honest_blocks]`: a KVIndexer with an honest engine holding
// honest_blocks (default 1,000,000) blocks and a hostile engine beside it. Prints the cost of the
// hostile engine's clears and bad batches, and the latency of lookups of the honest engine's
// blocks (match(), another thread) while the hostile engine sends them. Uses only the
// indexer's public calls, so the same program measures older versions of the library.
// Figures: bench/results/hardening.md.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pagedkv/events/block_index.hpp"
#include "pagedkv/events/indexer.hpp"
#include "pagedkv/events/wire.hpp"

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

// --- --hostile ---

using pagedkv::events::KVIndexer;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::vector<std::uint8_t> payload_of(const std::vector<pagedkv::KVEvent>& events) {
  std::string out;
  pagedkv::events::encode_event_batch(events, 0, pagedkv::events::WireOptions{}, out);
  return {out.begin(), out.end()};
}

pagedkv::BlockHash hash_of(std::uint64_t id) {
  std::array<std::uint8_t, 16> digest{};
  for (int i = 0; i < 8; ++i) digest[15 - i] = static_cast<std::uint8_t>(id >> (8 * i));
  return pagedkv::BlockHash(digest);
}

// One BlockStored event of `ids` (one token per block).
std::vector<std::uint8_t> stored(std::span<const std::uint64_t> ids) {
  pagedkv::BlockStored s;
  for (std::uint64_t id : ids) s.block_hashes.push_back(hash_of(id));
  s.block_size = 1;
  s.token_ids.assign(ids.size(), 1);
  s.extra_keys.resize(ids.size());
  pagedkv::KVEvent ev;
  ev.data = std::move(s);
  return payload_of({ev});
}

std::vector<std::uint8_t> clears(int n) {
  std::vector<pagedkv::KVEvent> evs(static_cast<std::size_t>(n));
  for (auto& ev : evs) ev.data = pagedkv::AllBlocksCleared{};
  return payload_of(evs);
}

struct Latency {
  std::size_t n = 0;
  double median_us = 0, p99_us = 0, max_us = 0;
};

// Lookups of the honest chains on another thread while `attack` runs (called in a loop for
// `seconds`); returns their latency and sets *rounds to the attack's calls.
Latency lookups_during(const KVIndexer& indexer,
                       const std::vector<std::vector<std::uint64_t>>& chains,
                       const std::function<void()>& attack, double seconds, std::size_t* rounds,
                       bool* all_found) {
  std::atomic<bool> done{false};
  std::vector<double> us;
  us.reserve(1 << 22);
  bool found = true;
  std::thread reader([&] {
    std::vector<pagedkv::events::PrefixMatch> out(2);
    std::size_t i = 0;
    while (!done.load(std::memory_order_relaxed)) {
      const auto& ch = chains[i++ % chains.size()];
      const auto t0 = Clock::now();
      indexer.match(ch, out);
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      found = found && out[0].gpu_prefix_blocks == ch.size();
    }
  });
  const auto t0 = Clock::now();
  std::size_t k = 0;
  while (ms_since(t0) < seconds * 1000) {
    if (attack) {
      attack();
      ++k;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  done = true;
  reader.join();
  *rounds = k;
  *all_found = found;
  Latency l;
  l.n = us.size();
  if (us.empty()) return l;
  std::sort(us.begin(), us.end());
  l.median_us = us[us.size() / 2];
  l.p99_us = us[us.size() * 99 / 100];
  l.max_us = us.back();
  return l;
}

int run_hostile(std::size_t honest_blocks) {
  KVIndexer indexer;
  const auto honest = indexer.add_engine("honest");
  const auto hostile = indexer.add_engine("hostile");
  std::mt19937_64 rng(1);
  std::vector<std::vector<std::uint64_t>> chains;  // the honest engine's, 64 blocks each
  std::uint64_t seq_h = 0, seq_x = 0;
  auto t0 = Clock::now();
  for (std::size_t done = 0; done < honest_blocks; done += 64) {
    std::vector<std::uint64_t> ch(64);
    for (auto& id : ch) id = rng();
    indexer.apply(honest, seq_h++, stored(ch));
    if (chains.size() < 4096) chains.push_back(std::move(ch));
  }
  std::printf("honest engine: %zu blocks indexed in %.0f ms, index %.1f MB\n",
              indexer.num_entries(), ms_since(t0), double(indexer.memory_bytes()) / 1e6);
  auto apply_x = [&](const std::vector<std::uint8_t>& p) { indexer.apply(hostile, seq_x++, p); };
  auto median_ms = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };

  // Costs of one hostile batch (medians of 3).
  const auto clear20 = clears(20);
  const std::vector<std::uint8_t> junk = {0x93, 0xc1, 0xc1, 0xc1};  // 0xc1: never used
  std::vector<std::uint64_t> fake(100'000);
  std::vector<double> c20, cjunk, cfill, cclear;
  for (int r = 0; r < 3; ++r) {
    t0 = Clock::now();
    apply_x(clear20);
    c20.push_back(ms_since(t0));
    t0 = Clock::now();
    apply_x(junk);
    cjunk.push_back(ms_since(t0));
    for (auto& id : fake) id = rng();
    const auto fill = stored(fake);
    t0 = Clock::now();
    apply_x(fill);
    cfill.push_back(ms_since(t0));
    t0 = Clock::now();
    apply_x(clears(1));
    cclear.push_back(ms_since(t0));
  }
  std::printf("hostile batch of 20 AllBlocksCleared (engine empty): %.3f ms\n", median_ms(c20));
  std::printf("hostile undecodable payload (4 bytes): %.3f ms\n", median_ms(cjunk));
  std::printf("hostile stores 100,000 ids (one batch): %.3f ms; then one clear: %.3f ms\n",
              median_ms(cfill), median_ms(cclear));

  // Lookup latency of the honest chains, quiet and under attack.
  auto report = [&](const char* what, const std::function<void()>& attack) {
    std::size_t rounds = 0;
    bool all = false;
    const Latency l = lookups_during(indexer, chains, attack, 3.0, &rounds, &all);
    std::printf(
        "%-44s lookups %8zu  median %7.2f us  p99 %9.2f us  max %10.1f us  "
        "(attack rounds %zu)%s\n",
        what, l.n, l.median_us, l.p99_us, l.max_us, rounds, all ? "" : "  HONEST PREFIX NOT FOUND");
  };
  report("quiet", nullptr);
  report("hostile: batches of 20 clears", [&] { apply_x(clear20); });
  report("hostile: undecodable payloads", [&] { apply_x(junk); });
  report("hostile: store 100k ids, clear, repeat", [&] {
    for (auto& id : fake) id = rng();
    apply_x(stored(fake));
    apply_x(clears(1));
  });

  // Memory: the hostile engine claims 1M fake blocks (10 batches), then clears them.
  std::vector<std::vector<std::uint8_t>> big;
  for (int b = 0; b < 10; ++b) {
    for (auto& id : fake) id = rng();
    big.push_back(stored(fake));
  }
  const double before = double(indexer.memory_bytes()) / 1e6;
  for (const auto& p : big) apply_x(p);
  const double full = double(indexer.memory_bytes()) / 1e6;
  t0 = Clock::now();
  apply_x(clears(1));
  const double clear_big = ms_since(t0);
  std::printf(
      "memory: %.1f MB, %.1f MB with 1M hostile ids, %.1f MB after their clear "
      "(%.1f ms); %zu entries left\n",
      before, full, double(indexer.memory_bytes()) / 1e6, clear_big, indexer.num_entries());
  report("hostile: store 1M ids, clear, repeat", [&] {
    for (const auto& p : big) apply_x(p);
    apply_x(clears(1));
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--hostile") == 0) {
    return run_hostile(argc >= 3 ? std::stoul(argv[2]) : 1'000'000);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
