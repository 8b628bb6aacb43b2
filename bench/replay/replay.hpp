// The replay engine behind pagedkv-replay: runs a trace through the real KVCacheManager, hashing
// included, and reports hit rate, prefill saved, evictions and throughput.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/tier/host_tier_config.hpp"
#include "trace.hpp"

namespace pagedkv::replay {

// Engine mode: how waiting requests are admitted each step.
enum class Schedule {
  kFcfs,    // arrival order, stopping at the first that does not fit (the original engine mode)
  kPrefix,  // pagedkv::AdmissionScheduler (sched/admission_scheduler.hpp): longest cached prefix
            // first, same-step shared-prefix deferral, aging bound max_passed_over
};

// Which block the prefix cache evicts: kLru is the library (BlockPool's free-block queue, the
// default, every other mode); kBelady is the clairvoyant reference of belady.hpp (sequential
// semantics, simulated in the replay, not the library); kReuseOracle / kReuseOracleMru are told
// which blocks will be used again but not when (belady.hpp): those never used again are evicted
// first, then the others in LRU order / newest free first. Offline references like Belady: what
// a perfect prediction of reuse alone would buy LRU / a policy that keeps the longest-waiting.
// kBeladyNoisy is Belady keyed by noisy next uses (belady.hpp): how exactly a policy would have to
// predict when a block returns to get Belady's hits.
enum class Eviction { kLru, kBelady, kReuseOracle, kReuseOracleMru, kBeladyNoisy };
inline constexpr double kMaxBeladyNoise = 8.0;  // the largest sigma belady-noisy:S takes
// "lru", "belady", "reuse-oracle", "reuse-oracle-mru" or "belady-noisy"; anything else throws
// pagedkv::Error (kInvalidArgument) naming it.
Eviction parse_eviction(const std::string& name);
const char* to_string(Eviction e) noexcept;

enum class Mode {
  kSequential,  // DESIGN.md 7: file order, one request at a time, prompt only
  kEngine,      // timestamps, output lengths, continuous batching with preemption
};

struct ReplayOptions {
  std::uint32_t block_size = 16;
  HashScheme hash = HashScheme::kSha256;
  std::vector<std::int32_t> num_blocks;  // total pool blocks including the null block; a sweep
  bool caching = true;
  bool verify_cache_hits = true;  // store and compare key material (always on for xxh3_128)
  // Hybrid model: > 0 adds a second KV-cache group of sliding-window layers (this many tokens)
  // beside the full-attention group, e.g. half the layers with a 4096-token window.
  std::uint32_t sliding_window = 0;
  // With sliding_window, sequential mode: the window group's block size, a multiple of
  // block_size (0: block_size).
  std::uint32_t window_block_size = 0;
  Mode mode = Mode::kSequential;
  // Sequential mode: 2 hashes requests on a second thread ahead of the replay (pipelined).
  std::uint32_t threads = 2;
  // Engine mode.
  std::uint32_t max_running = 256;          // concurrent requests
  std::uint32_t max_batched_tokens = 8192;  // tokens per step
  double step_ms = 20;                      // simulated duration of one step
  Schedule schedule = Schedule::kFcfs;
  std::uint32_t max_passed_over = 256;  // kPrefix: the aging bound, in steps
  std::uint32_t max_candidates = 128;   // kPrefix: earliest arrivals considered per step (0: all)
  Eviction eviction = Eviction::kLru;   // reported in the JSON; else: run_eviction_replay
  // kLru (the library): the pool's eviction policy (KVCacheManagerConfig::eviction_policy),
  // --eviction lru|slru|...; kLru is the library as it always was.
  EvictionPolicy pool_eviction = EvictionPolicy::kLru;
  // --eviction lineage:D / lineage:auto: KVCacheManagerConfig::lineage_key_depth / adaptive.
  std::size_t lineage_key_depth = kLineageKeyDepth;
  bool lineage_adaptive_depth = false;
  // --adaptive-ghost-sample-shift S: KVCacheManagerConfig::adaptive_ghost_sample_shift (-1: by the
  // pool's size; 0: exact ghosts; 1..kAdaptiveGhostMaxSampleShift: 1 in 2^S fingerprints).
  int adaptive_ghost_sample_shift = -1;
  // --eviction belady-noisy:S: the noise's sigma (Eviction::kBeladyNoisy).
  double belady_noise = 0.0;
};

// --eviction NAME: "belady", "reuse-oracle", "reuse-oracle-mru" or "belady-noisy:S" (S in
// 0..kMaxBeladyNoise; the simulator) or a pool policy's name
// (pagedkv::to_string of an EvictionPolicy: the library with that policy). Throws pagedkv::Error
// (kInvalidArgument) naming anything else.
void parse_eviction(const std::string& name, ReplayOptions& options);
// What the JSON's "eviction" field says: the simulator's rule (to_string(Eviction)) or the pool
// policy's name ("lru", ...).
std::string eviction_name(const ReplayOptions& options);

struct ReplayResult {
  std::int32_t num_blocks = 0;
  std::uint64_t requests = 0;
  std::uint64_t rejected = 0;        // needed more than num_blocks - 1 blocks
  std::uint64_t prompt_tokens = 0;   // all requests' prompt tokens
  std::uint64_t queried_tokens = 0;  // tokens looked up (admissions, incl. after preemption)
  std::uint64_t hit_tokens = 0;
  std::uint64_t prefill_tokens_computed = 0;
  std::uint64_t prompt_blocks = 0;  // ceil(prompt / block size), summed
  std::uint64_t evicted_blocks = 0;
  double peak_usage = 0;
  double hash_seconds = 0;  // building and hashing Requests (not the tokens' synthesis)
  double pool_seconds = 0;
  double synthesis_seconds = 0;  // making the prompt tokens from the trace's hash ids
  // Sequential mode: hashing and pool time as CPU time of the thread that did the work (the
  // *_seconds above are wall-clock time, which a loaded machine inflates).
  double hash_cpu_seconds = 0;
  double pool_cpu_seconds = 0;
  double wall_seconds = 0;  // the whole replay, hashing and pool together (and overlapped)
  // Engine mode.
  std::uint64_t preemptions = 0;
  std::uint64_t steps = 0;
  std::uint64_t decode_tokens = 0;
  // Simulated, not measured: steps x --step-ms (every step is taken to last step_ms), from the
  // first arrival to the last finish, and the median time to first token on that clock.
  double sim_makespan_ms = 0;
  double sim_ttft_p50_ms = 0;
  double sim_ttft_p99_ms = 0;
  // Simulated queueing delay: from arrival to the step that first admits the request.
  double queue_delay_p50_ms = 0;
  double queue_delay_p99_ms = 0;
  std::uint64_t waiting_nonempty_steps = 0;  // steps that began with a request waiting
  std::uint64_t deferred = 0;                // kPrefix: same-step shared-prefix deferrals
  std::uint32_t max_passed_over = 0;         // kPrefix: the most steps a request was passed over
  // Hybrid (sliding_window > 0), engine mode: blocks released as they left the window, and the
  // share of block-steps that freeing them saved (held blocks over what the requests' tables
  // would hold without freeing, summed over steps and running requests).
  std::uint64_t out_of_window_blocks_freed = 0;
  double window_memory_saved_ratio = 0;
  // --eviction belady / reuse-oracle(-mru): the replay's simulator in LRU mode on the same blocks
  // (belady.hpp), which
  // equals the library's LRU (hit_tokens, evicted_blocks) when the simulator is right.
  std::uint64_t sim_lru_hit_tokens = 0;
  std::uint64_t sim_lru_evicted_blocks = 0;

  // Hit tokens over tokens looked up; 0 when nothing was looked up (every request rejected).
  double hit_rate() const {
    return queried_tokens ? double(hit_tokens) / double(queried_tokens) : 0;
  }
  double prefill_saved_ratio() const {
    const double total = double(hit_tokens + prefill_tokens_computed);
    return total > 0 ? double(hit_tokens) / total : 0;
  }
  // Prompt blocks over hashing plus pool seconds (CPU time of both, even when overlapped).
  double blocks_per_second() const {
    const double s = hash_seconds + pool_seconds;
    return s > 0 ? double(prompt_blocks) / s : 0;
  }
};

// Host tier: a TieredKVCacheManager with num_blocks GPU blocks and each of these host sizes;
// transfers are committed done (sequential mode: at once, no time; engine mode: evictions and
// loads when planned, stores at the end of the step, and each step's copies charged at
// host_gbps on the simulated clock, reported as sim_transfer_ms).
struct TierReplayOptions {
  std::vector<std::int32_t> host_blocks;
  HostPolicy policy = HostPolicy::kWriteThrough;
  std::uint32_t selective_hits = 2;
  std::uint64_t kv_bytes_per_token = 0;  // bytes moved = blocks x block size x this
  double host_gbps = 25;                 // engine mode: simulated host <-> GPU bandwidth (GB/s)
  // --sliding-window: which window blocks the tier stores (--window-store tail|all).
  WindowStoreRule window_store = WindowStoreRule::kAll;
};

struct TierReplayResult {
  ReplayResult base;  // hit_tokens = gpu + host hits
  std::int32_t host_blocks = 0;
  std::uint64_t gpu_hit_tokens = 0;
  std::uint64_t host_hit_tokens = 0;
  std::uint64_t host_loaded_blocks = 0;
  std::uint64_t host_stored_blocks = 0;
  std::uint64_t host_stores_skipped_full = 0;
  std::uint64_t host_evictions = 0;
  std::uint64_t loaded_bytes = 0;
  std::uint64_t stored_bytes = 0;
  double sim_transfer_ms = 0;  // engine mode: simulated copy time, included in sim_makespan_ms
  // --sliding-window: per KV-cache group (0 full attention, 1 the window), and the window
  // blocks the store rule skipped.
  std::vector<TierGroupStats> groups;
  std::uint64_t window_stores_skipped = 0;
};

// One result per (options.num_blocks, tier.host_blocks) pair, GPU size outer.
std::vector<TierReplayResult> run_tier_replay(const Trace& trace, const ReplayOptions& options,
                                              const TierReplayOptions& tier);
std::string to_json(const TierReplayResult& r, const ReplayOptions& options,
                    const TierReplayOptions& tier, const Trace& trace);

// The KVCacheManager configuration the replay uses for a pool of num_blocks blocks (throws
// pagedkv::Error for num_blocks < 2).
KVCacheManagerConfig manager_config(const ReplayOptions& options, std::int32_t num_blocks);

// One result per options.num_blocks entry, in that order. Sequential mode hashes each request
// once for the whole sweep (hashing does not depend on the cache size).
std::vector<ReplayResult> run_replay(const Trace& trace, const ReplayOptions& options);

// One line of JSON with every field (and the derived rates); parse_seconds is the trace's
// loading (Trace::load_seconds), synthesis_seconds the tokens' synthesis, neither in hash_seconds.
std::string to_json(const ReplayResult& r, const ReplayOptions& options, const Trace& trace);

// The JSON lines' text helpers. format: printf into a string of any length (a line is never cut
// at a fixed buffer). json_string: a JSON string of `s` with its quotes (quotes, backslashes and
// control characters escaped: names come from outside).
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string json_string(std::string_view s);
// A store URL as it may be printed: redis://user:secret@host:port/ns -> redis://user:***@host...
std::string redact_url(std::string_view url);

// Paged allocation measured by running the library: each request (caching off, one at a time)
// allocates its prompt, then appends and allocates its output tokens one by one as an engine
// decodes; `reserved` sums the slots of the blocks it holds when it finishes, `used` its tokens.
struct PagedReservation {
  std::uint64_t used = 0;
  std::uint64_t reserved = 0;
};
PagedReservation measure_paged_reservation(const Trace& trace, std::uint32_t block_size);

// The PagedAttention paper's comparison from lengths (prompt + output): the share of reserved KV
// memory that holds real token states under several reservation policies, as a text table. The
// paged row is measured (measure_paged_reservation); the contiguous rows are arithmetic.
std::string memory_utilization_table(const Trace& trace, std::uint32_t block_size);

// The trace's prompts in file order, synthesized and hashed once by a manager of `config` (for
// in-process replays: bench_block_pool, pool_floor). Empty prompts and, when max_blocks > 0,
// prompts of more than max_blocks blocks are left out (the replay rejects those). `blocks` is set
// to the number of prompt blocks of the requests returned.
std::vector<Request> hash_prompts(const Trace& trace, const KVCacheManagerConfig& config,
                                  std::uint64_t max_blocks, std::uint64_t& blocks);

}  // namespace pagedkv::replay
