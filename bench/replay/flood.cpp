#include "flood.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "pagedkv/base/error.hpp"

namespace pagedkv::replay {

namespace {

// Token ids: the prefix draws from [0, 2^20), everything else from [2^20, 2^30), so no request's
// own tokens can repeat the prefix's first block.
constexpr TokenId kOwnTokenBase = TokenId{1} << 20;
constexpr TokenId kOwnTokenSpan = (TokenId{1} << 30) - kOwnTokenBase;

void random_tokens(std::mt19937_64& rng, std::size_t n, TokenId base, TokenId span,
                   std::vector<TokenId>& out) {
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(base + static_cast<TokenId>(rng() % static_cast<std::uint64_t>(span)));
  }
}

}  // namespace

void validate(const FloodOptions& f) {
  const auto bad = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, "--generate flood: " + what);
  };
  if (f.prefix_tokens == 0) bad("the shared prefix needs at least one token");
  if (f.reuse_requests == 0) bad("at least one request reusing the prefix");
  if (f.min_flood_tokens == 0 || f.min_flood_tokens > f.max_flood_tokens) {
    bad("flood request lengths need 1 <= min <= max");
  }
  if (f.priority > kMaxRetentionPriority) bad("a retention priority above 100");
  if (f.duration && *f.duration < 0) bad("a negative retention duration");
}

std::vector<FloodResult> run_flood(const ReplayOptions& o, const FloodOptions& f) {
  validate(f);
  std::vector<FloodResult> results;
  std::mt19937_64 prefix_rng(f.seed);
  std::vector<TokenId> prefix;
  random_tokens(prefix_rng, f.prefix_tokens, 0, kOwnTokenBase, prefix);
  RetentionConfig retain;
  retain.token_ranges.push_back(
      TokenRangeRetention{0, std::size_t{f.prefix_tokens}, f.priority, f.duration});

  for (const std::int32_t nb : o.num_blocks) {
    RetentionTick tick = 0;  // the request's index
    KVCacheManagerConfig config = manager_config(o, nb);
    config.retention_clock = [&tick] { return tick; };
    KVCacheManager m(config);
    FloodResult res;
    ReplayResult& base = res.base;
    base.num_blocks = nb;
    std::mt19937_64 rng(f.seed * 0x9E3779B97F4A7C15ull + 1);  // the same requests for every size
    std::vector<TokenId> tokens;
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t index = 0;
    // kind: 0 warm-up, 1 flood, 2 reuse.
    const auto run = [&](int kind) {
      tokens.clear();
      if (kind == 1) {
        const std::uint32_t len =
            f.min_flood_tokens +
            static_cast<std::uint32_t>(rng() % (f.max_flood_tokens - f.min_flood_tokens + 1ull));
        random_tokens(rng, len, kOwnTokenBase, kOwnTokenSpan, tokens);
      } else {
        tokens = prefix;
        random_tokens(rng, f.suffix_tokens, kOwnTokenBase, kOwnTokenSpan, tokens);
      }
      tick = static_cast<RetentionTick>(index);
      Request r = m.make_request(index++, tokens);
      if (kind != 1 && f.retention) r.set_retention(retain);
      ++base.requests;
      base.prompt_tokens += r.num_tokens();
      base.prompt_blocks += (r.num_tokens() + o.block_size - 1) / o.block_size;
      if ((r.num_tokens() + o.block_size - 1) / o.block_size > static_cast<std::uint64_t>(nb - 1)) {
        ++base.rejected;
        return;
      }
      const CacheHit hit = m.get_computed_blocks(r);
      const auto blocks = m.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit);
      if (!blocks) {  // the pool is idle between requests: only a wedged pool refuses
        ++res.failed_allocations;
        m.free(r);
        return;
      }
      base.peak_usage = std::max(base.peak_usage, m.usage());
      m.free(r);
      base.queried_tokens += r.num_tokens();
      base.hit_tokens += hit.num_tokens;
      base.prefill_tokens_computed += r.num_tokens() - hit.num_tokens;
      if (kind == 2) {
        res.prefix_queried_tokens += f.prefix_tokens;
        res.prefix_hit_tokens += std::min<std::uint64_t>(hit.num_tokens, f.prefix_tokens);
      }
    };
    run(0);
    std::uint32_t next_reuse = 0;
    for (std::uint32_t k = 0; k < f.flood_requests; ++k) {
      run(1);
      while (next_reuse < f.reuse_requests &&
             (std::uint64_t{next_reuse} + 1) * f.flood_requests / f.reuse_requests <= k + 1ull) {
        run(2);
        ++next_reuse;
      }
    }
    for (; next_reuse < f.reuse_requests; ++next_reuse) run(2);  // flood_requests == 0
    base.wall_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    base.evicted_blocks = m.stats().evictions;
    res.retention = m.retention_stats();
    m.check_invariants();
    results.push_back(std::move(res));
  }
  return results;
}

std::string to_json(const FloodResult& r, const ReplayOptions& o, const FloodOptions& f) {
  const ReplayResult& b = r.base;
  std::string buf;
  buf = format(
      "{\"trace\":\"flood\",\"mode\":\"sequential\",\"hash\":\"%s\",\"block_size\":%u,"
      "\"num_blocks\":%d,\"cache_tokens\":%lld,\"eviction\":\"%s\",\"retention\":%s,"
      "\"prefix_tokens\":%u,\"prefix_priority\":%u,\"prefix_duration\":%lld,"
      "\"flood_requests\":%u,\"reuse_requests\":%u,\"flood_tokens_min\":%u,"
      "\"flood_tokens_max\":%u,\"seed\":%u,\"requests\":%llu,\"rejected\":%llu,"
      "\"prompt_tokens\":%llu,\"queried_tokens\":%llu,\"hit_tokens\":%llu,\"hit_rate\":%.6f,"
      "\"evicted_blocks\":%llu,\"peak_usage\":%.6f,\"prefix_queried_tokens\":%llu,"
      "\"prefix_hit_tokens\":%llu,\"prefix_hit_rate\":%.6f,\"failed_allocations\":%llu,"
      "\"retained_blocks\":%lld,\"retained_budget\":%lld,\"budget_refusals\":%llu,"
      "\"expirations\":%llu,\"forced_evictions\":%llu,\"evictions_above_default\":%llu,"
      "\"wall_seconds\":%.3f}",
      std::string(to_string(o.hash)).c_str(), o.block_size, b.num_blocks,
      static_cast<long long>(b.num_blocks - 1) * o.block_size, eviction_name(o).c_str(),
      f.retention ? "true" : "false", f.prefix_tokens, unsigned{f.priority},
      f.duration ? static_cast<long long>(*f.duration) : -1ll, f.flood_requests, f.reuse_requests,
      f.min_flood_tokens, f.max_flood_tokens, f.seed, (unsigned long long)b.requests,
      (unsigned long long)b.rejected, (unsigned long long)b.prompt_tokens,
      (unsigned long long)b.queried_tokens, (unsigned long long)b.hit_tokens, b.hit_rate(),
      (unsigned long long)b.evicted_blocks, b.peak_usage,
      (unsigned long long)r.prefix_queried_tokens, (unsigned long long)r.prefix_hit_tokens,
      r.prefix_hit_rate(), (unsigned long long)r.failed_allocations,
      (long long)r.retention.retained_blocks, (long long)r.retention.retained_budget,
      (unsigned long long)r.retention.budget_refusals, (unsigned long long)r.retention.expirations,
      (unsigned long long)r.retention.forced_evictions,
      (unsigned long long)r.retention
          .by_class[static_cast<std::size_t>(RetentionClass::kAboveDefault)]
          .evictions,
      b.wall_seconds);
  return buf;
}

}  // namespace pagedkv::replay
