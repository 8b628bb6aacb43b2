// pagedkv-replay --generate flood: does a retained shared prefix survive a flood of unrelated
// requests? (issue 38). Part of the tools layer: uses only the public pagedkv API.
//
// The workload (deterministic for equal options), replayed with the sequential semantics (one
// request at a time, prompt only: get_computed_blocks, allocate_slots of the rest, free):
//   1. a warm-up request: a shared prefix of prefix_tokens tokens (a system prompt) and a suffix
//      of its own, the prefix retained at `priority` (RetentionConfig token range [0, prefix));
//   2. flood_requests unrelated requests of random tokens (lengths uniform in
//      [min_flood_tokens, max_flood_tokens]), no retention config;
//   3. reuse_requests requests of the shared prefix and a suffix of their own, each retaining the
//      prefix as the warm-up did. They are spread evenly through the flood: request j comes after
//      flood request floor((j + 1) * flood_requests / reuse_requests) - 1, so the pool overflows
//      between any two uses of the prefix (with --num-blocks small enough: the bursts between
//      reuses must hold more tokens than the pool) and each reuse finds the prefix only if it was
//      retained, never because the previous reuse just cached it again.
// The retention clock (KVCacheManagerConfig::retention_clock) is the request's index in this
// order.
// Reported: the prefix's hit rate over the reuse requests (prefix tokens hit over prefix tokens
// queried), allocations that failed (a request that fits the pool but found no evictable
// blocks: the pool wedged), the usual totals, and the per-class retention counters.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pagedkv/manager/kv_cache_manager.hpp"
#include "replay.hpp"

namespace pagedkv::replay {

struct FloodOptions {
  std::uint32_t prefix_tokens = 10800;
  RetentionPriority priority = 90;
  std::optional<RetentionTick> duration;  // ticks (requests); std::nullopt: no expiry
  std::uint32_t flood_requests = 5770;
  std::uint32_t reuse_requests = 100;
  std::uint32_t min_flood_tokens = 1024;
  std::uint32_t max_flood_tokens = 3072;
  std::uint32_t suffix_tokens = 200;  // each prefix request's own tokens after the prefix
  std::uint32_t seed = 1;
  bool retention = true;  // false: the same requests without a retention config (plain LRU)
};

struct FloodResult {
  ReplayResult base;
  std::uint64_t prefix_queried_tokens = 0;  // reuse_requests x prefix_tokens
  std::uint64_t prefix_hit_tokens = 0;      // of those, found cached
  std::uint64_t failed_allocations = 0;     // allocate_slots returned nullopt in an idle pool
  RetentionStats retention;                 // the manager's counters at the end

  double prefix_hit_rate() const {
    return prefix_queried_tokens ? double(prefix_hit_tokens) / double(prefix_queried_tokens) : 0;
  }
};

// Throws pagedkv::Error (kInvalidArgument) for options that make no workload (no reuse
// requests, an empty prefix, min > max flood tokens, a priority above 100).
void validate(const FloodOptions& flood);

// One result per options.num_blocks entry, in that order (options: block size, hash, policy).
std::vector<FloodResult> run_flood(const ReplayOptions& options, const FloodOptions& flood);

// One line of JSON.
std::string to_json(const FloodResult& r, const ReplayOptions& options, const FloodOptions& flood);

}  // namespace pagedkv::replay
