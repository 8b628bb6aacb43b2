// pool_eviction: the sequential replay (docs/traces.md: requests in file order, one at a time,
// prompt only) driven straight into a BlockPool of each eviction policy, on the same pre-hashed
// requests, in one process. It reports per policy the hit tokens, the evictions and the pool's
// CPU time per prompt block, so policies are compared on the same input in the same run.
//
// The driver does what KVCacheManager does for a full-attention request in the sequential
// replay (the longest verified cached prefix, capped at num_tokens - 1 tokens; touch it;
// allocate the other blocks; cache the full ones; free the table tail first) on a pool
// configured as the manager configures it (guarded chain hashes for xxh3_128, chain-hash
// identities for SHA-256). Because the manager cannot choose a policy yet, the LRU run is
// checked against KVCacheManager itself on the same requests: equal hit tokens and evictions,
// else exit 1. That check is what makes the other policies' figures the library's.
//
//   pool_eviction (--trace FILE | --generate agents|chat|tenants [--requests K] [--seed S])
//                 --num-blocks N [N ...] [--hash sha256|xxh3_128] [--policies lru,slru,...]
//                 [--limit K] [--rounds R]
//
// A policy in --policies is a name (pagedkv::to_string) or, for lineage, lineage:D (key depth D,
// BlockPoolConfig::lineage_key_depth) or lineage:auto (lineage_adaptive_depth).
//
// One JSON object per (num_blocks, round, policy) on stdout. Rounds run the policies in turn
// (lru first, then each other), so timing ratios compare runs taken alternately.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/pool/block_pool.hpp"
#include "pagedkv/pool/eviction_policy.hpp"
#include "replay.hpp"

namespace {

using namespace pagedkv;

double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

constexpr std::uint32_t kBlockSize = 16;

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(
      stderr,
      "pool_eviction: %s\nusage: pool_eviction (--trace FILE | --generate W [--requests "
      "K] [--seed S]) --num-blocks N [N ...] [--hash sha256|xxh3_128] [--policies "
      "lru,slru,s3fifo,lineage,adaptive,lineage:D,lineage:auto] [--limit K] [--rounds R]\n",
      problem.c_str());
  std::exit(2);
}

std::uint64_t number(const std::string& flag, const char* text, std::uint64_t min,
                     std::uint64_t max) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || text[0] == '-' || v < min || v > max) {
    usage(flag + " needs a whole number in " + std::to_string(min) + ".." + std::to_string(max) +
          ", got '" + text + "'");
  }
  return v;
}

struct Outcome {
  std::uint64_t hit_tokens = 0;
  std::uint64_t evictions = 0;
  double seconds = 0;
};

// The sequential replay on one pool.
// `depth`: the pool's lineage key depth at the end (the learned one with adaptive depth).
Outcome run_pool(const BlockPoolConfig& config, const std::vector<Request>& requests,
                 std::size_t& depth) {
  BlockPool pool(config);
  std::vector<BlockId> table;
  table.reserve(static_cast<std::size_t>(config.num_blocks));
  Outcome o;
  const double t0 = cpu_now();
  for (const Request& r : requests) {
    const BlockSequence seq = r.hashed_tokens().sequence();
    const std::size_t n = r.num_tokens();
    const std::size_t full = n / kBlockSize;
    const std::size_t total = (n + kBlockSize - 1) / kBlockSize;
    const std::size_t cap = (n - 1) / kBlockSize;  // hit at most num_tokens - 1 tokens
    table.clear();
    const std::size_t hit = cap == 0 ? 0 : pool.match_cached_run_after(seq, 0, cap, table);
    pool.touch(table);
    if (!pool.get_new_blocks(static_cast<std::int32_t>(total - hit), table)) {
      std::fprintf(stderr, "pool_eviction: request %llu did not fit an idle pool\n",
                   static_cast<unsigned long long>(r.id()));
      std::exit(1);
    }
    if (full > hit) pool.cache_full_blocks(seq, table, hit, full);
    pool.free_blocks_reversed(table);
    o.hit_tokens += hit * kBlockSize;
  }
  o.seconds = cpu_now() - t0;
  o.evictions = pool.num_evictions();
  depth = pool.lineage_key_depth();
  return o;
}

// The same replay through KVCacheManager (LRU: the library as engines use it).
Outcome run_manager(const KVCacheManagerConfig& c, std::vector<Request>& requests) {
  auto m = std::make_unique<KVCacheManager>(c);
  Outcome o;
  for (Request& r : requests) {
    const CacheHit h = m->get_computed_blocks(r);
    if (!m->allocate_slots(r, r.num_tokens() - h.num_tokens, h)) {
      std::fprintf(stderr, "pool_eviction: request %llu did not fit an idle manager\n",
                   static_cast<unsigned long long>(r.id()));
      std::exit(1);
    }
    m->preempt(r);  // releases like free() and lets the request be replayed again
    o.hit_tokens += h.num_tokens;
  }
  o.evictions = m->stats().evictions;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::string trace_path, generate, hash = "xxh3_128", policies_arg = "lru,slru,s3fifo,lineage";
  std::vector<std::uint64_t> sizes;
  std::uint64_t limit = 0, rounds = 1;
  replay::GeneratorOptions gen;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    if (flag == "--num-blocks") {
      while (i + 1 < argc && argv[i + 1][0] != '-') {
        sizes.push_back(number(flag, argv[++i], 2, 1u << 30));
      }
      continue;
    }
    const char* value = argv[++i];
    if (flag == "--trace") {
      trace_path = value;
    } else if (flag == "--generate") {
      generate = value;
    } else if (flag == "--requests") {
      gen.requests = static_cast<std::uint32_t>(number(flag, value, 1, 1u << 24));
    } else if (flag == "--seed") {
      gen.seed = static_cast<std::uint32_t>(number(flag, value, 0, UINT32_MAX));
    } else if (flag == "--hash") {
      hash = value;
    } else if (flag == "--policies") {
      policies_arg = value;
    } else if (flag == "--limit") {
      limit = number(flag, value, 1, UINT64_MAX);
    } else if (flag == "--rounds") {
      rounds = number(flag, value, 1, 1000);
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (trace_path.empty() == generate.empty()) usage("give exactly one of --trace and --generate");
  if (sizes.empty()) usage("--num-blocks is required");
  struct Policy {
    std::string name;
    EvictionPolicy policy = EvictionPolicy::kLru;
    std::size_t key_depth = kLineageKeyDepth;
    bool adaptive = false;
  };
  std::vector<Policy> policies;
  try {
    std::stringstream ss(policies_arg);
    for (std::string name; std::getline(ss, name, ',');) {
      Policy p{name};
      const std::size_t colon = name.find(':');
      p.policy = parse_eviction_policy(name.substr(0, colon));
      if (colon != std::string::npos) {
        const std::string depth = name.substr(colon + 1);
        if (p.policy != EvictionPolicy::kLineage) usage("only lineage takes :D or :auto");
        if (depth == "auto") {
          p.adaptive = true;
        } else {
          p.key_depth = number("--policies lineage:", depth.c_str(), 0, kMaxLineageKeyDepth);
        }
      }
      policies.push_back(p);
    }
    replay::Trace trace;
    if (!trace_path.empty()) {
      replay::LoadOptions load;
      load.limit = limit;
      trace = replay::load_hashid_jsonl(trace_path, load);
    } else {
      gen.workload = replay::parse_workload(generate);
      trace = replay::generate(gen);
    }
    KVCacheManagerConfig c;
    c.block_size = kBlockSize;
    c.hash_scheme = parse_hash_scheme(hash);
    c.hash_seed = "pagedkv-replay";
    for (const std::uint64_t num_blocks : sizes) {
      c.num_blocks = static_cast<std::int32_t>(num_blocks);
      std::uint64_t blocks = 0;
      std::vector<Request> requests = replay::hash_prompts(trace, c, num_blocks - 1, blocks);
      if (blocks == 0) usage("no request fits " + std::to_string(num_blocks) + " blocks");
      std::uint64_t prompt_tokens = 0;
      for (const Request& r : requests) prompt_tokens += r.num_tokens();
      // The pool as KVCacheManager configures it for one full-attention group.
      BlockPoolConfig p;
      p.num_blocks = c.num_blocks;
      p.block_size = kBlockSize;
      p.chain_hashes_identify_prefix = c.hash_scheme != HashScheme::kXxh3_128;
      p.guard_chain_hashes = c.hash_scheme == HashScheme::kXxh3_128;
      const Outcome lib = run_manager(c, requests);
      for (std::uint64_t round = 1; round <= rounds; ++round) {
        for (const Policy& spec : policies) {
          const EvictionPolicy policy = spec.policy;
          p.eviction_policy = policy;
          p.lineage_key_depth = spec.key_depth;
          p.lineage_adaptive_depth = spec.adaptive;
          std::size_t depth = 0;
          const Outcome o = run_pool(p, requests, depth);
          const bool checked = policy == EvictionPolicy::kLru;
          const bool agrees = o.hit_tokens == lib.hit_tokens && o.evictions == lib.evictions;
          std::printf(
              "{\"num_blocks\":%llu,\"round\":%llu,\"eviction\":\"%s\",\"requests\":%zu,"
              "\"prompt_tokens\":%llu,\"hit_tokens\":%llu,\"hit_rate\":%.6f,\"evictions\":%llu,"
              "\"ns_per_block\":%.2f%s%s}\n",
              static_cast<unsigned long long>(num_blocks), static_cast<unsigned long long>(round),
              spec.name.c_str(), requests.size(), static_cast<unsigned long long>(prompt_tokens),
              static_cast<unsigned long long>(o.hit_tokens),
              static_cast<double>(o.hit_tokens) / static_cast<double>(prompt_tokens),
              static_cast<unsigned long long>(o.evictions),
              o.seconds / static_cast<double>(blocks) * 1e9,
              !checked ? ""
              : agrees ? ",\"manager_check\":\"equal\""
                       : ",\"manager_check\":\"differs\"",
              policy != EvictionPolicy::kLineage
                  ? ""
                  : (",\"lineage_key_depth\":" + std::to_string(depth)).c_str());
          std::fflush(stdout);
          if (checked && !agrees) {
            std::fprintf(stderr,
                         "pool_eviction: the LRU pool driver and KVCacheManager disagree: %llu / "
                         "%llu hit tokens, %llu / %llu evictions\n",
                         static_cast<unsigned long long>(o.hit_tokens),
                         static_cast<unsigned long long>(lib.hit_tokens),
                         static_cast<unsigned long long>(o.evictions),
                         static_cast<unsigned long long>(lib.evictions));
            return 1;
          }
        }
      }
    }
  } catch (const Error& e) {
    usage(e.what());
  }
  return 0;
}
