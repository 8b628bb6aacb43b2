// pagedkv-replay --engines K --router kv|round_robin|least_loaded: a cluster of K engines, each
// its own KVCacheManager of --num-blocks blocks, fed by a router. Every engine's KV events are
// encoded on vLLM's wire (pagedkv::events) and applied to a real KVIndexer in-process; the kv
// router scores engines from that index (KVRouter). With --kv-events ENDPOINT each engine also
// publishes its stream on a KVEventPublisher (engine k on ENDPOINT's port + k, vLLM's
// data-parallel convention).
//
// Requests are replayed in file order with sequential-mode semantics (DESIGN.md 7: one request
// at a time, prompt only). An engine's load is the number of the last --load-window requests the
// router sent to it (a time-free stand-in for its running requests).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pagedkv/events/router.hpp"
#include "replay.hpp"
#include "trace.hpp"

namespace pagedkv::replay {

enum class RouterKind { kKv, kRoundRobin, kLeastLoaded };
RouterKind parse_router(const std::string& name);  // throws pagedkv::Error (kParseError)
const char* to_string(RouterKind kind);

struct ClusterOptions {
  std::uint32_t engines = 1;
  RouterKind router = RouterKind::kKv;
  std::uint32_t load_window = 64;
  events::KVRouterConfig weights;
  std::optional<std::string> kv_events;  // publish each engine's stream here (port + k)
};

struct ClusterResult {
  ReplayResult total;                        // summed over engines
  std::vector<ReplayResult> per_engine;
  std::vector<std::uint64_t> requests;       // routed to each engine
  double load_imbalance = 0;                 // max / mean requests per engine
  std::uint64_t events_batches = 0;          // KV event batches through the indexer
  std::uint64_t index_entries = 0;           // (block, engine) entries at the end
  double index_bytes_per_entry = 0;
  std::uint64_t published_dropped = 0;       // --kv-events: batches the publishers dropped
};

ClusterResult run_cluster(const Trace& trace, const ReplayOptions& options,
                          std::int32_t num_blocks, const ClusterOptions& cluster);

std::string to_json(const ClusterResult& r, const ReplayOptions& options,
                    const ClusterOptions& cluster, const Trace& trace);

}  // namespace pagedkv::replay
