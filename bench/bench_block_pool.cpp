// Pool and manager costs per block (Google Benchmark). items_per_second counts blocks, so
// 1e9 / items_per_second is ns per block. Hashing is excluded unless the name says otherwise.
#include <benchmark/benchmark.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/hash/request_hasher.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/pool/block_pool.hpp"
#include "replay.hpp"
#include "test_tokens.hpp"

// Counting allocator for BM_MetadataBytesPerBlock: while g_counting is set, every operator new
// and delete of this program adds or subtracts the bytes malloc really handed out
// (malloc_usable_size), so a live-bytes delta covers every container the library allocates.
// Outside the measurement it costs one branch per allocation.
namespace {
bool g_counting = false;
long long g_live_bytes = 0;

void* counted_new(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  if (g_counting) g_live_bytes += static_cast<long long>(malloc_usable_size(p));
  return p;
}
void counted_delete(void* p) noexcept {
  if (p != nullptr && g_counting) g_live_bytes -= static_cast<long long>(malloc_usable_size(p));
  std::free(p);
}
}  // namespace

void* operator new(std::size_t n) {
  return counted_new(n);
}
void* operator new[](std::size_t n) {
  return counted_new(n);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_new(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept {
  counted_delete(p);
}
void operator delete[](void* p) noexcept {
  counted_delete(p);
}
void operator delete(void* p, std::size_t) noexcept {
  counted_delete(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  counted_delete(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  counted_delete(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  counted_delete(p);
}
// The aligned forms (the pool's large tables are 2 MiB-aligned: table_allocator.hpp).
void* operator new(std::size_t n, std::align_val_t al) {
  const auto a = static_cast<std::size_t>(al);
  void* p = std::aligned_alloc(a, (std::max<std::size_t>(n, 1) + a - 1) / a * a);
  if (p == nullptr) throw std::bad_alloc();
  if (g_counting) g_live_bytes += static_cast<long long>(malloc_usable_size(p));
  return p;
}
void* operator new[](std::size_t n, std::align_val_t al) {
  return operator new(n, al);
}
void operator delete(void* p, std::align_val_t) noexcept {
  counted_delete(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  counted_delete(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  counted_delete(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  counted_delete(p);
}

namespace {

using namespace pagedkv;

constexpr std::uint32_t kBlockSize = 16;

// Resident set size in bytes (/proc/self/statm), a cross-check of the counted bytes.
long long rss_bytes() {
  long long pages_total = 0, pages_resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lld %lld", &pages_total, &pages_resident) != 2) pages_resident = 0;
    std::fclose(f);
  }
  return pages_resident * sysconf(_SC_PAGESIZE);
}

// get_new_blocks(n) then free_blocks(n), unhashed blocks: the allocator's raw cost.
void BM_GetNewBlocksAndFree(benchmark::State& state) {
  BlockPoolConfig c;
  c.num_blocks = 1 << 16;
  c.block_size = kBlockSize;
  BlockPool pool(c);
  const auto n = static_cast<std::int32_t>(state.range(0));
  std::vector<BlockId> blocks;
  blocks.reserve(static_cast<std::size_t>(n));
  for (auto _ : state) {
    blocks.clear();
    pool.get_new_blocks(n, blocks);
    std::reverse(blocks.begin(), blocks.end());
    pool.free_blocks(blocks);
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_GetNewBlocksAndFree)->Arg(1)->Arg(16)->Arg(256);

// touch() of free cached blocks (a prefix hit taking its blocks) then free_blocks() again.
void BM_TouchAndFree(benchmark::State& state) {
  BlockPoolConfig c;
  c.num_blocks = 1 << 14;
  c.block_size = kBlockSize;
  BlockPool pool(c);
  RequestBlockHasher seq(BlockHasher(HashScheme::kSha256, "bench"), kBlockSize);
  seq.append(random_tokens(256 * kBlockSize, 1));
  std::vector<BlockId> hit;
  pool.get_new_blocks(256, hit);
  pool.cache_full_blocks(seq.sequence(), hit, 0, 256);
  const std::vector<BlockId> reversed(hit.rbegin(), hit.rend());
  pool.free_blocks(reversed);  // cached and free: what a prefix hit finds
  for (auto _ : state) {
    pool.touch(hit);
    pool.free_blocks(reversed);
  }
  state.SetItemsProcessed(state.iterations() * 256);
}
BENCHMARK(BM_TouchAndFree);

// get_computed_blocks() on a fully cached 32k-token prompt: 2,048 verified hits (or not).
// Caches a 32k-token (2,048-block) prompt with a first request, then times get_computed_blocks()
// of a second request with the same tokens; the hit row must have 2,048 entries.
void time_lookup_of_cached_32k(benchmark::State& state, const KVCacheManagerConfig& c) {
  KVCacheManager m(c);
  const auto tokens = random_tokens(2048 * kBlockSize + 1, 2);
  Request warm = m.make_request(1, tokens);
  m.allocate_slots(warm, tokens.size());
  m.free(warm);
  const Request r = m.make_request(2, tokens);
  std::size_t hit_blocks = 0;
  for (auto _ : state) {
    const CacheHit hit = m.get_computed_blocks(r);
    hit_blocks = hit.blocks.size();
    benchmark::DoNotOptimize(hit.blocks.data());
  }
  if (hit_blocks != 2048) state.SkipWithError("expected a 2048-block hit row");
}

void BM_GetComputedBlocks32k(benchmark::State& state) {
  KVCacheManagerConfig c;
  c.num_blocks = 4096;
  c.block_size = kBlockSize;
  c.hash_seed = "bench";
  c.verify_cache_hits = state.range(0) != 0;
  time_lookup_of_cached_32k(state, c);
  state.SetItemsProcessed(state.iterations() * 2048);
  state.counters["verify"] = static_cast<double>(state.range(0));
}
BENCHMARK(BM_GetComputedBlocks32k)->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);

// get_computed_blocks() on a fully cached 32k-token prompt in one sliding-window group (window
// 4,096 tokens: a 256-block run ending at block 2,047, searched right to left), verified. Arg:
// 0 = sha256 (chain hashes identify the prefix), 1 = xxh3_128 (the pool's own prefix
// identities), 2 = xxh3_128 in a hybrid model (a full-attention group, then the window group:
// 2,048 + 256 blocks looked up). Items = the 256 blocks of the run.
void BM_GetComputedBlocksWindow32k(benchmark::State& state) {
  KVCacheManagerConfig c;
  c.num_blocks = 4096;
  c.groups = {AttentionSpec::sliding(kBlockSize, 4096)};
  if (state.range(0) == 2) {
    c.groups = {AttentionSpec::full(kBlockSize), AttentionSpec::sliding(kBlockSize, 4096)};
    c.num_blocks = 8192;
  }
  c.hash_scheme = state.range(0) != 0 ? HashScheme::kXxh3_128 : HashScheme::kSha256;
  c.hash_seed = "bench";
  time_lookup_of_cached_32k(state, c);
  state.SetItemsProcessed(state.iterations() * 256);
  state.counters["xxh3"] = state.range(0) != 0 ? 1 : 0;
  state.counters["hybrid"] = state.range(0) == 2 ? 1 : 0;
}
BENCHMARK(BM_GetComputedBlocksWindow32k)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);

// The whole request cycle: get_computed_blocks, allocate_slots (hit 64 shared blocks, allocate
// and cache 64 new ones, evicting old cached blocks), free. 64 pre-hashed requests share a
// 64-block prefix and differ in a 64-block suffix; the pool holds 4,096 blocks, so suffixes
// evict each other. Items = 128 prompt blocks per request.
void BM_RequestCycle(benchmark::State& state) {
  KVCacheManagerConfig c;
  c.num_blocks = 4096;
  c.block_size = kBlockSize;
  c.hash_seed = "bench";
  KVCacheManager m(c);
  const auto prefix = random_tokens(64 * kBlockSize, 3);
  std::vector<std::vector<TokenId>> prompts;
  std::vector<Request> requests;
  for (std::uint32_t i = 0; i < 64; ++i) {
    auto p = prefix;
    const auto suffix = random_tokens(64 * kBlockSize + 1, 100 + i);
    p.insert(p.end(), suffix.begin(), suffix.end());
    prompts.push_back(p);
    requests.push_back(m.make_request(i + 1, p));
  }
  const bool hash_each_time = state.range(0) != 0;
  std::size_t i = 0;
  RequestId next_id = 1000;
  for (auto _ : state) {
    const std::size_t k = i++ % requests.size();
    if (hash_each_time) requests[k] = m.make_request(next_id++, prompts[k]);
    Request& r = requests[k];
    const CacheHit hit = m.get_computed_blocks(r);
    const auto blocks = m.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit);
    benchmark::DoNotOptimize(blocks);
    m.preempt(r);  // releases like free() but lets the pre-hashed request be reused
  }
  state.SetItemsProcessed(state.iterations() * 128);
  state.counters["hashing"] = hash_each_time ? 1 : 0;
  state.counters["metadata_bytes_per_block"] = m.block_pool().metadata_bytes_per_block();
}
BENCHMARK(BM_RequestCycle)->Arg(0)->Arg(1);

// The fixed cost of one decode step's allocate_slots() when the request's blocks already hold
// the slot (15 of every 16 steps at block size 16): validation and bookkeeping only.
void BM_DecodeStepNoNewBlock(benchmark::State& state) {
  KVCacheManagerConfig c;
  c.num_blocks = 1024;
  c.block_size = kBlockSize;
  c.hash_seed = "bench";
  KVCacheManager m(c);
  const auto tokens = random_tokens(100 * kBlockSize + 8, 4);  // the last block has room
  Request r = m.make_request(1, tokens);
  m.allocate_slots(r, tokens.size());
  for (auto _ : state) {
    r.set_num_computed_tokens(tokens.size() - 1);
    benchmark::DoNotOptimize(m.allocate_slots(r, 1));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DecodeStepNoNewBlock);

// Metadata bytes per block, measured by the counting allocator (not the pool's own formula,
// BlockPool::metadata_bytes_per_block(), reported beside it). A manager of range(0) blocks at
// block size 16, verification on, sha256; requests of 64 blocks each fill the whole pool, each
// with its own cache_salt (so the extra-key table holds one entry per request: its worst case).
// Counters, in bytes per pool block:
//   pool_empty      what constructing the manager allocates (block array, hash table, material)
//   held            everything the manager holds while requests hold every block, all cached:
//                   the pool, the extra-key table and the per-request block tables
//   cached_idle     the same after every request is freed (blocks stay cached)
//   formula         the pool's own figure
//   request_side    the engine's Request objects (tokens and block hashes): not the manager's
//   rss_pool_empty  the resident-set growth of constructing the manager (a cross-check)
void BM_MetadataBytesPerBlock(benchmark::State& state) {
  const auto num_blocks = static_cast<std::int32_t>(state.range(0));
  constexpr std::size_t kRequestBlocks = 64;
  for (auto _ : state) {
    g_counting = true;
    g_live_bytes = 0;
    const long long rss0 = rss_bytes();
    KVCacheManagerConfig c;
    c.num_blocks = num_blocks;
    c.block_size = kBlockSize;
    c.hash_seed = "bench";
    auto m = std::make_unique<KVCacheManager>(c);
    const long long constructed = g_live_bytes;
    const long long rss_constructed = rss_bytes() - rss0;

    std::vector<Request> requests;
    const std::size_t n = static_cast<std::size_t>(num_blocks - 1) / kRequestBlocks;
    requests.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto tokens =
          random_tokens(kRequestBlocks * kBlockSize, static_cast<std::uint32_t>(1000 + i));
      RequestHashKeys keys;
      keys.cache_salt = "tenant-" + std::to_string(i);
      requests.push_back(m->make_request(i + 1, tokens, std::move(keys)));
    }
    const long long with_requests = g_live_bytes;
    for (Request& r : requests) {
      if (!m->allocate_slots(r, r.num_tokens())) state.SkipWithError("a request did not fit");
    }
    const long long held = g_live_bytes;
    for (Request& r : requests) m->free(r);
    const long long idle = g_live_bytes;
    const double formula = m->block_pool().metadata_bytes_per_block();
    m.reset();
    requests.clear();
    g_counting = false;

    const double per = 1.0 / num_blocks;
    state.counters["pool_empty"] = static_cast<double>(constructed) * per;
    state.counters["held"] = static_cast<double>(constructed + held - with_requests) * per;
    state.counters["cached_idle"] = static_cast<double>(constructed + idle - with_requests) * per;
    state.counters["formula"] = formula;
    state.counters["request_side"] = static_cast<double>(with_requests - constructed) * per;
    state.counters["rss_pool_empty"] = static_cast<double>(rss_constructed) * per;
  }
}
BENCHMARK(BM_MetadataBytesPerBlock)->Arg(1 << 20)->Iterations(1)->Unit(benchmark::kMillisecond);

// The Mooncake conversation trace replayed in process, so that a pool regression shows here and
// not only in the whole replay: the first 1,000 requests (docs/traces.md: file order, one request
// at a time, prompt only), block size 16, a pool of 32,769 blocks (nearly every block is evicted
// once), verification on, range(0) = the hash scheme (0 xxh3_128, 1 sha256). Requests are hashed
// once, before timing; each iteration replays them on a fresh manager (get_computed_blocks,
// allocate_slots, release) and times only that: pool time. Items = prompt blocks, so
// 1e9 / items_per_second is pool ns per block. The replay's figures for this slice (ctest replay:
// 534,400 hit tokens, 791,683 evictions) are checked every iteration: a mismatch fails the run.
// The trace is mooncake/conversation_trace.jsonl(.gz) under $PAGEDKV_TRACES_DIR when that is set,
// else the bundled data/traces one (CMake: PAGEDKV_MOONCAKE_TRACE); without it the benchmark is
// not registered and the program says so.
std::string g_trace;

void BM_MooncakeReplaySlice(benchmark::State& state) {
  using namespace pagedkv::replay;
  LoadOptions load;
  load.limit = 1000;
  const Trace trace = load_hashid_jsonl(g_trace, load);
  KVCacheManagerConfig c;
  c.num_blocks = 32769;
  c.block_size = kBlockSize;
  c.hash_scheme = state.range(0) == 0 ? HashScheme::kXxh3_128 : HashScheme::kSha256;
  c.hash_seed = "pagedkv-replay";
  std::uint64_t blocks = 0;
  std::vector<Request> requests = hash_prompts(trace, c, 0, blocks);
  std::uint64_t hit_tokens = 0, evictions = 0;
  std::vector<Request> run;
  for (auto _ : state) {
    state.PauseTiming();
    auto m = std::make_unique<KVCacheManager>(c);
    // Fresh copies each iteration: a request belongs to the first manager that allocated for
    // it (request.hpp: Ownership), and a copy belongs to none.
    run = requests;
    hit_tokens = 0;
    state.ResumeTiming();
    for (Request& r : run) {
      const CacheHit hit = m->get_computed_blocks(r);
      const auto got = m->allocate_slots(r, r.num_tokens() - hit.num_tokens, hit);
      benchmark::DoNotOptimize(got);
      hit_tokens += hit.num_tokens;
      m->preempt(r);  // releases like free(), as the benchmark always did
    }
    state.PauseTiming();
    evictions = m->stats().evictions;
    m.reset();
    state.ResumeTiming();
    if (hit_tokens != 534400 || evictions != 791683) {
      state.SkipWithError(("replay figures changed: " + std::to_string(hit_tokens) +
                           " hit tokens, " + std::to_string(evictions) + " evictions")
                              .c_str());
      break;
    }
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * blocks));
  state.counters["hit_tokens"] = static_cast<double>(hit_tokens);
  state.counters["evictions"] = static_cast<double>(evictions);
}

// ---- Eviction policies (issue 38): the same pool work under each BlockPoolConfig::
// eviction_policy, range(0) = the policy (0 lru, 1 slru, 2 s3fifo, 3 lineage), registered side
// by side so one run compares them. LRU here is the pool's own path (no retention state).

BlockPoolConfig policy_config(std::int32_t num_blocks, std::int64_t policy) {
  BlockPoolConfig c;
  c.num_blocks = num_blocks;
  c.block_size = kBlockSize;
  c.eviction_policy = static_cast<EvictionPolicy>(policy);
  return c;
}

// get_new_blocks(256) then free_blocks(256), unhashed blocks.
void BM_PolicyGetNewBlocksAndFree(benchmark::State& state) {
  BlockPool pool(policy_config(1 << 16, state.range(0)));
  std::vector<BlockId> blocks;
  blocks.reserve(256);
  for (auto _ : state) {
    blocks.clear();
    pool.get_new_blocks(256, blocks);
    std::reverse(blocks.begin(), blocks.end());
    pool.free_blocks(blocks);
  }
  state.SetItemsProcessed(state.iterations() * 256);
}
BENCHMARK(BM_PolicyGetNewBlocksAndFree)->Arg(0)->Arg(1)->Arg(2)->Arg(3)->Arg(4);

// touch() of 256 free cached blocks then free_blocks() again (hits).
void BM_PolicyTouchAndFree(benchmark::State& state) {
  BlockPool pool(policy_config(1 << 14, state.range(0)));
  RequestBlockHasher seq(BlockHasher(HashScheme::kSha256, "bench"), kBlockSize);
  seq.append(random_tokens(256 * kBlockSize, 1));
  std::vector<BlockId> hit;
  pool.get_new_blocks(256, hit);
  pool.cache_full_blocks(seq.sequence(), hit, 0, 256);
  const std::vector<BlockId> reversed(hit.rbegin(), hit.rend());
  pool.free_blocks(reversed);
  for (auto _ : state) {
    pool.touch(hit);
    pool.free_blocks(reversed);
  }
  state.SetItemsProcessed(state.iterations() * 256);
}
BENCHMARK(BM_PolicyTouchAndFree)->Arg(0)->Arg(1)->Arg(2)->Arg(3)->Arg(4);

// The eviction-heavy request cycle on a 32,769-block pool: a 1,024-block prompt whose first 64
// blocks are a shared prefix (a verified hit, touched) and the rest new (960 blocks allocated,
// evicting as many cached ones, then cached), freed tail first. 64 distinct prompts in turn, so
// the pool is full and every allocation evicts. Items: the 1,024 prompt blocks.
void BM_PolicyEvictingCycle(benchmark::State& state) {
  BlockPoolConfig c = policy_config(32769, state.range(0));
  c.guard_chain_hashes = true;  // as KVCacheManager configures a pool for xxh3_128
  BlockPool pool(c);
  constexpr std::size_t kPrompts = 64, kBlocks = 1024, kShared = 64;
  const auto shared = random_tokens(kShared * kBlockSize, 7);
  std::vector<RequestBlockHasher> prompts;
  for (std::size_t i = 0; i < kPrompts; ++i) {
    RequestBlockHasher seq(BlockHasher(HashScheme::kXxh3_128, "bench"), kBlockSize);
    seq.append(shared);
    seq.append(
        random_tokens((kBlocks - kShared) * kBlockSize, static_cast<std::uint32_t>(100 + i)));
    prompts.push_back(std::move(seq));
  }
  std::vector<BlockId> table;
  table.reserve(kBlocks);
  std::size_t i = 0;
  for (auto _ : state) {
    const BlockSequence seq = prompts[i++ % kPrompts].sequence();
    table.clear();
    const std::size_t hit = pool.match_cached_run_after(seq, 0, kBlocks - 1, table);
    pool.touch(table);
    pool.get_new_blocks(static_cast<std::int32_t>(kBlocks - hit), table);
    pool.cache_full_blocks(seq, table, hit, kBlocks);
    pool.free_blocks_reversed(table);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kBlocks));
  state.counters["evictions"] = static_cast<double>(pool.num_evictions());
}
BENCHMARK(BM_PolicyEvictingCycle)->Arg(0)->Arg(1)->Arg(2)->Arg(3)->Arg(4);

// The first 1,000 Mooncake requests (xxh3_128, 32,769 blocks) replayed sequentially straight
// into a BlockPool of each policy (bench/pool_eviction.cpp's driver); each iteration a fresh
// pool. Items: prompt blocks, so 1e9 / items_per_second is pool ns per block.
void BM_PolicyMooncakeSlice(benchmark::State& state) {
  using namespace pagedkv::replay;
  LoadOptions load;
  load.limit = 1000;
  const Trace trace = load_hashid_jsonl(g_trace, load);
  KVCacheManagerConfig mc;
  mc.num_blocks = 32769;
  mc.block_size = kBlockSize;
  mc.hash_scheme = HashScheme::kXxh3_128;
  mc.hash_seed = "pagedkv-replay";
  std::uint64_t blocks = 0;
  const std::vector<Request> requests = hash_prompts(trace, mc, 0, blocks);
  BlockPoolConfig c = policy_config(mc.num_blocks, state.range(0));
  c.guard_chain_hashes = true;
  std::vector<BlockId> table;
  std::uint64_t hit_tokens = 0, evictions = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto pool = std::make_unique<BlockPool>(c);
    hit_tokens = 0;
    state.ResumeTiming();
    for (const Request& r : requests) {
      const BlockSequence seq = r.hashed_tokens().sequence();
      const std::size_t n = r.num_tokens();
      const std::size_t cap = (n - 1) / kBlockSize;
      table.clear();
      const std::size_t hit = cap == 0 ? 0 : pool->match_cached_run_after(seq, 0, cap, table);
      pool->touch(table);
      pool->get_new_blocks(static_cast<std::int32_t>((n + kBlockSize - 1) / kBlockSize - hit),
                           table);
      if (n / kBlockSize > hit) pool->cache_full_blocks(seq, table, hit, n / kBlockSize);
      pool->free_blocks_reversed(table);
      hit_tokens += hit * kBlockSize;
    }
    state.PauseTiming();
    evictions = pool->num_evictions();
    pool.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * blocks));
  state.counters["hit_tokens"] = static_cast<double>(hit_tokens);
  state.counters["evictions"] = static_cast<double>(evictions);
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("PAGEDKV_TRACES_DIR");
  g_trace = PAGEDKV_MOONCAKE_TRACE;
  if (env != nullptr && *env != '\0') {
    const std::string name = std::string(env) + "/mooncake/conversation_trace.jsonl";
    g_trace = std::filesystem::exists(name + ".gz") || !std::filesystem::exists(name) ? name + ".gz"
                                                                                      : name;
  }
  const std::string& trace = g_trace;
  if (std::filesystem::exists(trace)) {
    benchmark::RegisterBenchmark("BM_MooncakeReplaySlice", BM_MooncakeReplaySlice)
        ->Arg(0)
        ->Arg(1)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_PolicyMooncakeSlice", BM_PolicyMooncakeSlice)
        ->Arg(0)
        ->Arg(1)
        ->Arg(2)
        ->Arg(3)
        ->Arg(4)
        ->Unit(benchmark::kMillisecond);
  } else {
    std::fprintf(stderr,
                 "bench_block_pool: BM_MooncakeReplaySlice skipped: %s not found (set "
                 "PAGEDKV_TRACES_DIR to the directory holding mooncake/)\n",
                 trace.c_str());
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
