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
//
// With --host-blocks M each engine is a TieredKVCacheManager (M host blocks, --host-policy); its
// copies are committed done at once, as in the single-engine host-tier replay. The kv router
// indexes the GPU-medium events only (what an engine holds in GPU memory).
//
// With --remote redis://HOST:PORT/NS (needs --host-blocks) every engine also gets a RedisStore
// and a RemoteTier (tier/remote_tier.hpp) on that one server: a real shared tier. Block payloads
// are placeholders of --remote-payload-bytes bytes (a function of the block's hash, written into
// the host slot when a block is cached there and checked on every host hit: payload_mismatches),
// not real K/V. Determinism: each request's probe and gets are waited for (kWaitComplete) before
// it is looked up, and every op of its engine (puts included) is completed before the next
// request starts, so the figures do not depend on timing (unless ops time out or fail: counted).
// The namespace must be fresh (unused on the server) for the figures to mean "this run only".
//
// With --disk DIR --disk-gib G (needs --host-blocks, one engine) the remote tier runs on a
// DiskStore (remote/disk_store.hpp) in DIR of G GiB instead (reported as remote "file://DIR");
// the store keeps what it holds across runs (that is its point), so the directory must be new
// or empty for the figures to mean "this run only".
#pragma once

#include <chrono>
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
  std::optional<std::string> kv_events;     // publish each engine's stream here (port + k)
  std::optional<std::string> remote;        // redis://HOST:PORT/NS shared by the engines, or
                                            // file://DIR (--disk DIR): a DiskStore, one engine
  double disk_gib = 1;                      // --disk-gib: the DiskStore's capacity
  std::uint32_t remote_payload_bytes = 64;  // placeholder payload per block
  std::chrono::milliseconds remote_op_timeout{1000};  // each store op completes within this
  std::uint32_t remote_store_min_hits = 0;            // RemoteTierConfig::store_min_hits
  bool remote_store_on_host_eviction = false;         // RemoteStorePolicy::kOnHostEviction
};

// --sliding-window: one KV-cache group's copies, summed over engines (TierGroupStats of the host
// tier; RemoteTierGroupStats of the remote tier, whose bytes are placeholder payload bytes).
struct GroupReplayStats {
  std::uint64_t loaded_blocks = 0, loaded_bytes = 0, stored_blocks = 0, stored_bytes = 0;
  std::uint64_t window_blocks_not_loaded = 0;  // remote: held by the store, not needed
};

// The shared tier's figures, summed over engines (RemoteTierStats and RemoteStoreStats).
struct RemoteReplayStats {
  std::uint64_t probed_blocks = 0, probe_hit_blocks = 0;
  std::uint64_t hit_blocks = 0, hit_tokens = 0;  // loaded from the store into host slots
  std::uint64_t load_misses = 0, fills_no_slot = 0, fills_refused = 0;
  std::uint64_t fills_shared = 0;  // hits served by another request's get in flight (0 here:
                                   // every request's gets complete before the next request)
  std::uint64_t puts = 0, stored_blocks = 0, puts_skipped = 0, puts_failed = 0;
  std::uint64_t puts_skipped_full = 0, eviction_puts = 0;
  std::uint64_t bytes_in = 0, bytes_out = 0;  // payload bytes (each value adds its header)
  std::uint64_t errors = 0, timeouts = 0, checksum_failures = 0, header_mismatches = 0;
  std::uint64_t binding_mismatches = 0;  // values of another block under a key (issue 41)
  std::uint64_t rejected_values = 0;     // gets that found a value that did not check
  std::uint64_t queue_full_drops = 0;
  double wait_seconds = 0;  // waiting for probes, gets and puts to complete (wall)
  // --sliding-window: per KV-cache group (RemoteTier::group_stats; bytes are payload bytes), and
  // the window-group blocks the store held but a hit did not need (not fetched).
  std::vector<GroupReplayStats> groups;
  std::uint64_t window_blocks_not_loaded = 0;
};

struct ClusterResult {
  ReplayResult total;  // summed over engines
  std::vector<ReplayResult> per_engine;
  std::vector<std::uint64_t> requests;  // routed to each engine
  double load_imbalance = 0;            // max / mean requests per engine
  std::uint64_t events_batches = 0;     // KV event batches through the indexer
  std::uint64_t index_entries = 0;      // (block, engine) entries at the end
  double index_bytes_per_entry = 0;
  std::uint64_t published_dropped = 0;  // --kv-events: batches the publishers dropped
  // --host-blocks.
  std::int32_t host_blocks = 0;
  std::string host_policy;
  std::uint64_t gpu_hit_tokens = 0, host_hit_tokens = 0;  // host includes remote-loaded blocks
  std::uint64_t host_evictions = 0;
  std::uint64_t payload_mismatches = 0;       // host hits whose placeholder bytes were wrong
  std::vector<GroupReplayStats> host_groups;  // --sliding-window: the host tier's, per group
  std::uint64_t window_stores_skipped = 0;
  // --remote.
  bool remote = false;
  RemoteReplayStats remote_stats;
};

// `tier`: host tier per engine (host_blocks.front()); nullptr or empty host_blocks: none.
// Throws pagedkv::Error for --remote without a host tier or a remote layer.
ClusterResult run_cluster(const Trace& trace, const ReplayOptions& options, std::int32_t num_blocks,
                          const ClusterOptions& cluster, const TierReplayOptions* tier = nullptr);

// `without_remote`: the same cluster without the shared tier (reported beside it).
std::string to_json(const ClusterResult& r, const ReplayOptions& options,
                    const ClusterOptions& cluster, const Trace& trace,
                    const ClusterResult* without_remote = nullptr);

}  // namespace pagedkv::replay
