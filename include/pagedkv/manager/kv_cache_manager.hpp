// pagedkv/manager/kv_cache_manager.hpp: the scheduler's view of the KV cache.
//
// Full-attention models use one KV-cache group (the default). Hybrid models (full-attention plus
// sliding-window layers, possibly with different block sizes) list their groups in
// KVCacheManagerConfig::groups; one pool serves all of them, and a request's hit is the longest
// length every group accepts (a fixed point over the groups, aligned to the least common multiple
// of their block sizes; full attention is looked up once). Sliding-window groups free the blocks
// that leave the window as the request advances (the later block first) and hold the null block
// in their places. See attention_spec.hpp.
//
// Names and semantics follow vLLM's v1 KVCacheManager. Per scheduling step, for each request:
//   1. hit = get_computed_blocks(request)         longest cached prefix (at most num_tokens - 1
//                                                 tokens: the last token is always recomputed)
//   2. allocate_slots(request, n, hit, lookahead) touch the hits, allocate blocks for n new tokens
//                                                 (+ lookahead/draft slots), cache full blocks;
//                                                 std::nullopt = "does not fit", nothing changed
//   3. the engine runs the model, then request.set_num_computed_tokens(...), appends output tokens
//   4. free(request) when it finishes (or preempt(request) to release and requeue it)
//
// Retention (retention.hpp, docs/retention.md): a request carrying a RetentionConfig
// (Request::set_retention) has its blocks given the config's priorities (BlockPool::set_retention)
// when allocate_slots() allocates or hits them and again when free()/preempt() releases them, a
// duration running from that use on the config's retention_clock (a hit by any request renews it
// in the pool); a block shared by several requests keeps the highest, a request without a config
// counting as asking the default (it lifts a block it hits that another request put below the
// default; an ask below the default lowers only a block the request just allocated or one below
// the default already). Without any config below the default, requests without a config cost
// nothing and change nothing (every block stays at the default priority: LRU exactly). The
// pool's eviction policy and pin budget come from the config (eviction_policy,
// max_retained_fraction); retention_stats() reports per priority class.
//
// Errors (pagedkv::Error, thrown before any state changes): a request that belongs to another
// manager (request.hpp: Ownership; every call taking a request checks it), zero new tokens,
// allocating or freeing a freed request, preempting an unknown request, a request id that is live
// under another Request, a hit that is stale or passed with blocks already allocated, tokens beyond
// the request's known tokens, token counts whose sum overflows, a request hashed differently from
// the manager. Running out of blocks is the std::nullopt result, never an error. Freeing a
// request that holds no blocks (made but never allocated, or preempted and then aborted) is a
// no-op that marks it finished, as aborting a waiting request is in vLLM; freeing it again is
// an error.
//
// Exception safety: every mutating call has the strong guarantee, std::bad_alloc included: it
// prepares everything that may throw (validation, capacity, coarse keys, stored material,
// events) before the first change to the pool or to its tables, so it either completes or
// leaves the manager exactly as it was. KV events of a call are delivered only after the call
// has completed, so a sink sees a consistent manager (it may call const queries).
//
// Complexity: get_computed_blocks is O(hit blocks) (plus O(block_size) per verified hit);
// allocate_slots and free are O(blocks touched), amortized (a request's block row grows
// geometrically: a decode step's new block does not copy the row). Thread safety: one manager per
// scheduler thread for mutating calls. Const calls only read, so several threads may make const
// calls at once while no mutating call runs; a metrics thread that runs beside the scheduler should
// read stats() copies the scheduler thread publishes. make_request() may run on any thread at any
// time (hashing is pure).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagedkv/base/spare_nodes.hpp"
#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/manager/attention_spec.hpp"
#include "pagedkv/manager/coordinator.hpp"
#include "pagedkv/manager/prefix_cache_stats.hpp"
#include "pagedkv/manager/request.hpp"
#include "pagedkv/manager/retention.hpp"
#include "pagedkv/pool/block_pool.hpp"
#include "pagedkv/pool/kv_events.hpp"

namespace pagedkv {

// BlockPoolConfig's default pin budget (a constant here: a BlockPoolConfig{} temporary in the
// member initializer made GCC 12 -O1 ASan builds warn maybe-uninitialized on every caller's
// hash_seed assignment). request_retention_test checks the two agree.
inline constexpr double kDefaultMaxRetainedFraction = 0.5;

struct KVCacheManagerConfig {
  std::int32_t num_blocks = 0;    // total pool blocks, including the null block
  std::uint32_t block_size = 16;  // the single full-attention group's; ignored when `groups` is set
  // KV-cache groups, in the order the engine's layers use them; empty: one full-attention group
  // of `block_size`. Requests are hashed at the smallest group block size, which must divide all
  // of them.
  std::vector<AttentionSpec> groups;
  bool enable_caching = true;
  HashScheme hash_scheme = HashScheme::kSha256;
  std::optional<std::string> hash_seed;  // see BlockHasher; set it to agree across processes
  // Overrides hash_scheme/hash_seed when set (e.g. BlockHasher::weak_for_testing in tests).
  std::optional<BlockHasher> hasher;
  // Must stay true for xxh3_128 (not collision resistant), from hash_scheme or from `hasher`
  // (kInvalidArgument otherwise); only a weak_for_testing hasher may turn it off with it.
  bool verify_cache_hits = true;
  bool enable_kv_events = false;
  std::size_t stats_window = 1000;           // queries in PrefixCacheStats::recent_hit_rate
  std::optional<std::size_t> max_model_len;  // caps slots allocated for lookahead tokens
  // The pool's free-block queue order (BlockPoolConfig::eviction_policy; kLru: vLLM's, exactly).
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;
  // kLineage's key depth and whether the pool learns it (BlockPoolConfig::lineage_key_depth,
  // lineage_adaptive_depth).
  std::size_t lineage_key_depth = kLineageKeyDepth;
  bool lineage_adaptive_depth = false;
  // kAdaptive's ghost sample (BlockPoolConfig::adaptive_ghost_sample_shift: -1 by the pool's
  // size, 0 every fingerprint, s: 1 in 2^s).
  int adaptive_ghost_sample_shift = -1;
  // The pin budget: the share of the pool's blocks that may be above the default retention
  // priority (BlockPoolConfig::max_retained_fraction); past it, retention requests get the
  // default priority and are counted.
  double max_retained_fraction = kDefaultMaxRetainedFraction;
  // The monotonic tick retention durations run on (BlockPoolConfig::retention_clock; inject a
  // fake one in tests). Empty: a request whose retention config has a duration is refused.
  RetentionClock retention_clock;
};

// The result of get_computed_blocks(): the cached blocks of the request's longest cached prefix.
struct CacheHit {
  std::vector<BlockId> blocks;  // group 0 (the only group of a full-attention model)
  std::size_t num_tokens = 0;   // blocks.size() * group 0's block size
  // Groups 1.. of a hybrid model, each covering the same num_tokens; sliding-window groups hold
  // the null block before their window.
  std::vector<std::vector<BlockId>> other_groups;
  // The pool's eviction count when the lookup ran (a hit built by hand: unknown). With a hash
  // that can collide, allocate_slots looks the hit up again if the pool evicted since: an evicted
  // hit block may hold other content with a colliding hash by then.
  std::uint64_t lookup_evictions = kUnknownEvictions;
  static constexpr std::uint64_t kUnknownEvictions = ~std::uint64_t{0};

  const std::vector<BlockId>& group(std::size_t g) const {
    return g == 0 ? blocks : other_groups[g - 1];
  }
};

// Everything observable about a manager's state, for tests.
struct KVCacheManagerSnapshot {
  BlockPoolSnapshot pool;
  // Per request (sorted by id), per group: the block table row and its cached-block count.
  std::vector<std::pair<RequestId, std::vector<std::vector<BlockId>>>> request_blocks;
  std::vector<std::pair<RequestId, std::vector<std::size_t>>> num_cached_blocks;
  std::uint64_t stats_requests = 0;
  std::uint64_t stats_queries = 0;
  std::uint64_t stats_hits = 0;

  bool operator==(const KVCacheManagerSnapshot&) const = default;
};

class KVCacheManager {
 public:
  explicit KVCacheManager(const KVCacheManagerConfig& config);

  const BlockHasher& hasher() const noexcept { return hasher_; }
  // The block size requests are hashed at (the smallest group block size).
  std::uint32_t block_size() const noexcept { return coordinator_.hash_block_size(); }
  std::size_t num_groups() const noexcept { return coordinator_.num_groups(); }
  // Throws pagedkv::Error (kOutOfRange) for a group the manager does not have.
  const AttentionSpec& group_spec(std::size_t g) const;
  const BlockPool& block_pool() const noexcept { return pool_; }

  // A request hashed the way this manager's cache is keyed.
  Request make_request(RequestId id, std::span<const TokenId> prompt,
                       RequestHashKeys keys = {}) const;

  // Longest cached prefix, capped at num_tokens - 1 tokens; records prefix-cache stats. Changes
  // no reference counts: pass the result to allocate_slots() before any other allocation.
  CacheHit get_computed_blocks(const Request& request);
  // get_computed_blocks() in two parts: the lookup, which counts nothing in stats(), and the
  // count (nothing when caching is off or the request skips reading the cache, as there). A
  // caller whose own work after the lookup may throw (a tiered manager's host lookup) counts it
  // once that work is done, so a call that fails leaves the stats as they were.
  CacheHit find_computed_blocks(const Request& request);
  void record_lookup(const Request& request, const CacheHit& hit) noexcept;

  // Allocates slots for num_new_tokens tokens after the request's computed tokens and the hit,
  // plus num_lookahead_tokens draft slots (never cached). Sliding-window groups first release the
  // blocks that left the window. Returns group 0's newly allocated blocks (valid until the next
  // call on this manager; other groups: block_ids(id, g)), or std::nullopt when the blocks do not
  // fit, with nothing changed.
  std::optional<std::span<const BlockId>> allocate_slots(Request& request,
                                                         std::size_t num_new_tokens,
                                                         const CacheHit& hit = {},
                                                         std::size_t num_lookahead_tokens = 0,
                                                         bool delay_cache_blocks = false);

  // delay_cache_blocks (vLLM's flag): allocate_slots caches none of the request's new blocks;
  // their K/V arrives later (e.g. loaded from a host tier), and a block must not be a hit before
  // it is written. cache_blocks() then caches the request's full blocks up to num_tokens (the
  // tokens whose K/V is in place), in every group. Errors: an unknown or freed request,
  // num_tokens beyond the request's known tokens or its allocated slots, first_to_cache not one
  // entry per group. first_to_cache (optional, one entry per group): group g's blocks before
  // first_to_cache[g] that are not cached yet are never cached (counted as done): their K/V was
  // not written (a host tier's window blocks it did not load, outside the window at the hit).
  void cache_blocks(Request& request, std::size_t num_tokens,
                    std::span<const std::size_t> first_to_cache = {});

  // Releases a finished request's blocks (tail first, so its chain's tail is evicted first) and
  // marks it finished. A request holding no blocks: only marked finished (see the file comment).
  void free(Request& request);
  // Releases a running request's blocks so it can be rescheduled from scratch (its cached blocks
  // stay hit-able); sets its num_computed_tokens to 0.
  void preempt(Request& request);

  // Whether `request` belongs to another manager (request.hpp: Ownership): a pointer compare.
  bool is_foreign(const Request& request) const noexcept {
    return request.owner_ != nullptr && request.owner_ != token_;
  }
  // Throws pagedkv::Error (kInvalidArgument, naming `what` and the request) when
  // is_foreign(request). Every call here that takes a request checks it first; a layer above
  // (tier/tiered_kv_cache_manager.hpp) checks before touching its own state.
  void check_owner(const Request& request, const char* what) const {
    if (is_foreign(request)) [[unlikely]]
      throw_foreign(request, what);
  }

  // A request's block table row in group g (null blocks where a window skipped them). Throws for
  // an unknown id or group.
  std::span<const BlockId> block_ids(RequestId id, std::size_t group = 0) const;
  // Blocks released early because they left a sliding window, since construction.
  std::uint64_t num_out_of_window_blocks_freed() const noexcept { return out_of_window_freed_; }
  // Leading blocks of this request held by every request the manager tracks (the shared prefix
  // for cascade attention).
  std::size_t num_common_prefix_blocks(RequestId id) const;
  std::size_t num_requests() const noexcept { return requests_.size(); }

  double usage() const noexcept { return pool_.usage(); }
  PrefixCacheStats stats() const noexcept { return stats_.stats(pool_.num_evictions()); }
  // Drops the cache entries of these blocks (e.g. a KV connector found their contents invalid);
  // they stay allocated or queued. Returns how many were cached. See BlockPool::evict_blocks.
  std::size_t evict_blocks(std::span<const BlockId> ids) { return pool_.evict_blocks(ids); }
  // Forgets all cached blocks if no request holds any; false (nothing done) otherwise. The
  // stats' cumulative totals stay; only their recent window restarts.
  bool reset_prefix_cache();
  std::vector<KVEvent> take_events() { return pool_.take_events(); }
  void set_event_sink(KVEventSink sink) { pool_.set_event_sink(std::move(sink)); }
  // The pool's eviction observer (BlockPool::EvictionObserver): a tier below the GPU pool reads
  // each evicted block's content there, inside allocate_slots(), before the block is reused.
  void set_eviction_observer(BlockPool::EvictionObserver* observer) noexcept {
    pool_.set_eviction_observer(observer);
  }

  // Per priority class (below, at, above the default): blocks, hits, evictions; retained blocks
  // against the pin budget, budget refusals, expirations, forced evictions (BlockPool's counters,
  // pool/retention.hpp). O(1).
  RetentionStats retention_stats() const { return pool_.retention_stats(); }
  // A block's retention now (an expired priority reads as the default). Throws for an id out of
  // range.
  BlockRetention block_retention(BlockId id) const { return pool_.retention(id); }

  // Pool invariants plus: every block's ref count equals the number of requests holding it.
  void check_invariants() const;
  KVCacheManagerSnapshot snapshot() const;

 private:
  struct GroupBlocks {
    std::vector<BlockId> blocks;           // the block table row, in token order
    std::size_t num_cached_blocks = 0;     // leading blocks already cached (or null)
    std::vector<BlockHash> coarse_hashes;  // factor > 1: this group's block keys
  };
  struct RequestBlocks {
    std::vector<GroupBlocks> groups;
    std::shared_ptr<const char> identity;  // the Request object that holds this id
  };
  // One cache_full_blocks() of allocate_slots, prepared before any change.
  struct PendingRun {
    std::size_t group = 0;
    std::size_t first = 0, last = 0;
    BlockPool::PendingStore store;
  };

  std::span<const KVCacheGroup> groups() const noexcept { return coordinator_.groups(); }
  void check_hashing(const Request& request) const;
  // False when the request holds no blocks; throws for a freed request or a foreign one.
  bool release(Request& request, const char* what);
  // Appends to run_scratch_ the stores that cache group g's blocks [first, full) in runs of
  // consecutive blocks, skipping null blocks and window blocks that can never be part of a hit;
  // block_at(i) is the block at position i once the calling operation's changes are made.
  template <typename BlockAt>
  void prepare_runs(const Request& request, std::size_t g, std::size_t first, std::size_t full,
                    std::vector<BlockHash>& coarse, const BlockAt& block_at);
  void check_identity(const Request& request, const char* what) const;
  // Throws pagedkv::Error when the request's retention config cannot be applied (a duration
  // without a retention clock), and makes the pool keep retention state if the config asks for a
  // non-default priority (the one step of set_retention() that may throw): after it,
  // apply_retention() cannot fail. Changes nothing observable but the pool's representation.
  void prepare_retention(const Request& request, const char* what);
  // Gives the request's blocks at positions [from[g], end) of each group the retention its
  // config names, durations from the current tick; positions from new_from[g] on hold blocks
  // this call allocated (new_from empty: none, as at a release). An ask for the default (every
  // block of a request without a config) lifts a block below the default to it; an ask below
  // the default lowers only a block allocated by this call or one below the default already
  // (docs/retention.md, "Shared blocks"). Needs prepare_retention() first; cannot fail then.
  void apply_retention(const Request& request, const RequestBlocks& state,
                       std::span<const std::size_t> from,
                       std::span<const std::size_t> new_from) noexcept;
  [[noreturn]] static void throw_foreign(const Request& request, const char* what);
  // A block (other than the null block) that `row` lists twice, or BlockPool::kNoBlock. Ids must
  // be in range. O(row) with a bitmap over the pool's blocks (sized at construction, cleared
  // again before returning): no allocation.
  BlockId repeated_block(std::span<const BlockId> row) noexcept;
  BlockSequence group_sequence(const Request& request, std::size_t g,
                               std::vector<BlockHash>& coarse) const {
    return coordinator_.group_sequence(request.hashed_tokens().sequence(), g, coarse);
  }

  BlockHasher hasher_;
  KVCacheCoordinator coordinator_;
  BlockPool pool_;
  PrefixCacheStatsRecorder stats_;
  std::optional<std::size_t> max_model_len_;
  using RequestMap = std::unordered_map<RequestId, RequestBlocks>;
  RequestMap requests_;
  // Released requests' entries, reused by new ones (no node, table row or group vector to
  // allocate per admission): at most kSpareRequests, each row up to kSpareBlocks blocks.
  static constexpr std::size_t kSpareRequests = 16;
  static constexpr std::size_t kSpareBlocks = std::size_t{1} << 14;
  SpareNodes<RequestMap, kSpareRequests> spare_requests_;
  std::vector<BlockId> free_scratch_;
  std::vector<const std::vector<BlockId>*> hit_scratch_;  // allocate_slots: each group's hit
  std::vector<std::size_t> alloc_scratch_;                // allocate_slots: blocks per group
  std::vector<std::size_t> skip_scratch_;                 // allocate_slots: leaving the window
  std::vector<PendingRun> run_scratch_;                   // allocate_slots: blocks to cache
  std::vector<std::vector<BlockHash>> coarse_scratch_;    // allocate_slots: a new request's keys
  std::vector<std::vector<BlockId>> hit_rows_;            // get_computed_blocks: per group
  std::vector<BlockId> prefix_scratch_;                   // allocate_slots: blocks before a run
  std::vector<std::uint64_t> seen_bits_;                  // repeated_block: one bit per block
  std::vector<std::size_t> retain_from_;                  // allocate_slots: first new position
  std::vector<std::size_t> retain_new_from_;  // allocate_slots: first newly allocated position
  // Whether this manager ever asked the pool for a priority below the default: until then no
  // block is below it, and a request without a retention config costs nothing.
  bool lowered_ = false;
  std::uint64_t out_of_window_freed_ = 0;
  // This manager's identity in the requests it owns (Request::owner_); requests keep it alive,
  // so a later manager never reuses its address.
  std::shared_ptr<const char> token_ = std::make_shared<const char>('\0');
};

}  // namespace pagedkv
