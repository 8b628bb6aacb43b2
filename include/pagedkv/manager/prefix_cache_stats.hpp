// pagedkv/manager/prefix_cache_stats.hpp: how much prefill the prefix cache saves.
//
// Records one entry per get_computed_blocks() query: the request's tokens (queries) and the tokens
// found cached (hits). Totals are cumulative and never decrease (counters for metrics systems);
// the recent hit rate covers the last `window` queries (a ring buffer, so it reflects the
// current workload rather than the whole history). reset_window() empties only the window, as
// vLLM does on a prefix-cache reset.
// O(1) per record, no allocation after construction. Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace pagedkv {

struct PrefixCacheStats {
  std::uint64_t requests = 0;         // get_computed_blocks() queries recorded
  std::uint64_t queries = 0;          // tokens looked up (the requests' full lengths)
  std::uint64_t hits = 0;             // tokens found cached
  std::uint64_t evictions = 0;        // cached blocks evicted
  std::uint64_t recent_requests = 0;  // queries in the window (<= window size)
  double recent_hit_rate = 0.0;       // hits / queries over the window; 0 when empty

  double hit_rate() const noexcept {
    return queries == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(queries);
  }
};

class PrefixCacheStatsRecorder {
 public:
  // `window` >= 1 recent queries enter recent_hit_rate. Throws pagedkv::Error for 0.
  explicit PrefixCacheStatsRecorder(std::size_t window = 1000);

  void record(std::uint64_t num_tokens, std::uint64_t num_hits) noexcept;  // (no allocation)
  // `evictions` is the pool's cumulative eviction count, copied into the result.
  PrefixCacheStats stats(std::uint64_t evictions) const noexcept;
  // Empties the recent window; the cumulative totals stay.
  void reset_window() noexcept;
  // Zeroes everything (a new recorder).
  void reset() noexcept;

 private:
  std::uint64_t requests_ = 0;
  std::uint64_t queries_ = 0;
  std::uint64_t hits_ = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ring_;  // (queries, hits) per query
  std::size_t next_ = 0;                                       // ring slot written next
  std::size_t filled_ = 0;                                     // valid ring slots
  std::uint64_t window_queries_ = 0;
  std::uint64_t window_hits_ = 0;
};

}  // namespace pagedkv
