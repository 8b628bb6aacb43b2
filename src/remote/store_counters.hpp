// src/remote/store_counters.hpp: the counters every RemoteStore backend keeps, and their snapshot
// as RemoteStoreStats. Private to src/remote/ (RedisStore, DiskStore); not installed.
//
// Thread-safe: relaxed atomic counters, bumped by any thread, read without a lock (a snapshot is
// a set of counts each exact on its own, not one instant). Errors: none.
#pragma once

#include <atomic>
#include <cstdint>

#include "pagedkv/remote/latency_histogram.hpp"
#include "pagedkv/remote/remote_store.hpp"

namespace pagedkv::remote_detail {

struct StoreCounters {
  std::atomic<std::uint64_t> probes{0}, probe_hits{0}, gets{0}, hits{0}, misses{0}, puts{0},
      stored{0}, skipped_full{0}, bytes_in{0}, bytes_out{0}, timeouts{0}, errors{0},
      checksum_failures{0}, header_mismatches{0}, binding_mismatches{0}, format_mismatches{0},
      queue_full_drops{0}, connects{0},
      connect_failures{0};  // the last two: backends with connections
};

inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.fetch_add(n, std::memory_order_relaxed);
}

inline RemoteLatency latency_of(const LatencyHistogram& h) {
  const auto s = h.snapshot();
  return {s.total, s.percentile_us(0.50), s.percentile_us(0.99)};
}

inline RemoteStoreStats stats_of(const StoreCounters& c, const LatencyHistogram& exists,
                                 const LatencyHistogram& get, const LatencyHistogram& put) {
  const auto ld = [](const std::atomic<std::uint64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  RemoteStoreStats s;
  s.probes = ld(c.probes);
  s.probe_hits = ld(c.probe_hits);
  s.gets = ld(c.gets);
  s.hits = ld(c.hits);
  s.misses = ld(c.misses);
  s.puts = ld(c.puts);
  s.stored = ld(c.stored);
  s.skipped_full = ld(c.skipped_full);
  s.bytes_in = ld(c.bytes_in);
  s.bytes_out = ld(c.bytes_out);
  s.timeouts = ld(c.timeouts);
  s.errors = ld(c.errors);
  s.checksum_failures = ld(c.checksum_failures);
  s.header_mismatches = ld(c.header_mismatches);
  s.binding_mismatches = ld(c.binding_mismatches);
  s.format_mismatches = ld(c.format_mismatches);
  s.queue_full_drops = ld(c.queue_full_drops);
  s.connects = ld(c.connects);
  s.connect_failures = ld(c.connect_failures);
  s.exists_latency = latency_of(exists);
  s.get_latency = latency_of(get);
  s.put_latency = latency_of(put);
  return s;
}

}  // namespace pagedkv::remote_detail
