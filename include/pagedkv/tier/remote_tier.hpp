// pagedkv/tier/remote_tier.hpp: a shared remote store (remote/remote_store.hpp, e.g. Redis) below
// a TieredKVCacheManager's host tier, so engines reuse each other's prefixes (LMCache, Mooncake
// Store, SGLang HiCache L3).
//
// Lookup order: GPU prefix, then the host run, then the remote store. The remote part never runs
// on the scheduler's critical path; per request:
//   1. add_request(request) when it arrives: starts a RemotePrefixProbe (one pipelined `exists`
//      batch) for the blocks after its GPU + host hit;
//   2. poll(now) every scheduler step (never blocks): routes the store's completions; when a
//      probe's answer is final, allocates and pins a host slot per remote hit
//      (TieredKVCacheManager::begin_fill) and submits one get batch into those slots; each get
//      that completes kHit commits its fill done (the slot becomes an ordinary host-tier block),
//      any other result commits it failed (the slot is freed; never a wrong byte loaded);
//   3. ready(id, now): the request may be scheduled; then the engine calls the tier's
//      get_computed_blocks() as usual: the filled blocks are host hits that the tier's plan loads
//      to the GPU. Readiness follows the policy (RemotePrefixProbe's, over probe + gets):
//        kBestEffort   ready at once (probes and gets still run, for later requests);
//        kWaitComplete ready when the probe and the gets are complete (each op completes within
//                      the store's op timeout, so this is bounded);
//        kTimeout      as kWaitComplete, or at arrival + config.timeout, whichever is first;
//   4. remove_request(id) once scheduled or dropped; its gets still in flight complete later.
// A missing, failed, timed-out or corrupt remote block (and a host tier without a free slot)
// ends the run there: those blocks are recomputed. Every value is bound to its block
// (remote/remote_value.hpp): a put binds it to the host block's hash, parent hash and group, and
// each get checks it against the request's block and its verified prefix identity (the previous
// block's chained hash, as a host hit does), so a genuine value of another block stored under this
// block's key is rejected, a counted miss (rejected_values), and never loaded.
// Gets are deduplicated by block hash: a remote hit whose block another request's get is fetching
// already is not fetched again; the request waits for that fill instead (its readiness counts it
// as one of its own gets), and finds the block in the host tier once it is committed.
//
// Stores: host-slot bytes go to the store in the background, by store_policy:
//   kWriteThrough    store_min_hits == 0: every block the host tier caches from the GPU (a store
//                    or eviction committed) is put; k >= 1: a host block is put once it was
//                    loaded from the host k times (write-through of blocks hit k times). The slot
//                    stays pinned (not evictable) until its put completes; puts beyond
//                    max_puts_in_flight are skipped and counted.
//   kOnHostEviction  a host block is put when the host tier evicts it to reuse its slot
//                    (HostTierHooks::on_evicted): its bytes are copied, inside the tier call that
//                    evicted it and so before the engine's plan (or a fill) overwrites the slot,
//                    into one of eviction_staging_blocks staging buffers the remote tier owns
//                    (allocated at construction); the put reads the copy. An eviction finding
//                    every staging buffer in use is skipped and counted (puts_skipped). Blocks
//                    evicted by reset_prefix_cache() are not put.
// Blocks that came from the remote store, or were put already, are not put (again). Puts are
// batched and submitted by poll(); a batch the store's queue refuses is skipped and counted; a
// put the store completes other than stored (full, down, timeout) is counted in puts_failed.
//
// Buffers: `host_buffer` is the engine's host-tier buffer, slot s at s * bytes_per_block (as the
// transfer executors address it; slot 0 unused). The remote tier writes a slot only while it pins
// it for a fill, and reads one only while it pins it for a put.
//
// Ownership and order: the remote tier sets the tier's HostTierHooks and is the only caller of
// store.poll(). The tier, the store and the buffer must outlive it. The destructor waits (at most
// drain_timeout) for its ops in flight, commits unfinished fills failed and unpins every slot, and
// clears the hooks; the store's op timeout should be below drain_timeout. Puts from its own
// staging buffers are waited for beyond drain_timeout if need be (the store completes every op
// within its op timeout), so the store never reads a freed buffer.
//
// Hashers that are not collision resistant (xxh3_128): values are still keyed by block hash, and
// each is also bound to its block's prefix identity (TieredKVCacheManager::prefix_identities: a
// SHA-256 chain over the whole prefix's content), which a get checks: a value stored under a
// colliding key by another prefix is a counted miss, never loaded. A request's identities cost
// O(blocks) SHA-256 once per get batch.
//
// Hybrid models (sliding-window KV-cache groups beside full attention, of one block size or of
// different block sizes, each a multiple of the smallest; docs/tiers.md "Remote tier for hybrid
// models"):
//   Keys. A value is stored per (block hash, group): group 0's key is the block hash (as for one
//   group), group g >= 1's is group_key(hash, g), the manager's hasher applied to the block hash
//   as parent and max_block_size + 1 tokens (a tag, g, zeros; the largest group block size + 1):
//   a length no real block has, so with a SHA-256 hasher no group's key equals another group's
//   or another block's. The value's
//   binding names that key, the parent's chained hash and the group, so a value of group g is
//   never loaded for another group (a counted miss, rejected_values) even where keys collide
//   (xxh3_128, weak test hashers).
//   Block sizes. Each group's blocks are at its own block size: a group of f times the smallest
//   keys its block j as the GPU manager does (the digest of the f fine hashes it covers,
//   manager/coordinator.hpp; group_key is applied to that), its value holds its own f x
//   block_size tokens' bytes and is bound to the group's previous block key and (prefix
//   identities) the identity of the fine block it ends with, as the host tier verifies that
//   group's slots. Positions below (G, L, end) count blocks of the smallest size, multiples of
//   the LCM of the group block sizes over it (the GPU manager's clamp); group g's are x / f.
//   Probing. add_request estimates the GPU hit G (the manager's fixed-point rule over the GPU
//   pool's cached blocks: every full-attention group holds [0, G), every window group
//   [G - window_blocks, G)) and submits one exists batch for every group's blocks [G, end)
//   (end: the full blocks below the last token, rounded down to the LCM). When
//   every answer is in (each op completes within the store's op timeout), the run is the host
//   tier's hit rule over "in the host or present in the store": the longest L (a multiple of the
//   LCM) such that every
//   full-attention group has each block of [G, L) and every window group each block of
//   [max(G, L - window_blocks), L). Only those blocks are fetched (the ones the host does not
//   hold), each into a host slot of its group (TieredKVCacheManager::begin_fill(request, i, g)),
//   so the next get_computed_blocks() finds them as host hits. A window group's blocks of
//   [G, L - window_blocks) are never fetched: counted in window_blocks_not_loaded (the store held
//   them; a tier without the window rule would have loaded them).
//   Rollback. A get that does not load (missing, corrupt, bound to another block, timeout)
//   commits its fill failed (the slot is freed): the next get_computed_blocks() finds the longest
//   prefix valid in every group over what landed (for a failed full-attention block at token t,
//   at most the last LCM multiple <= t). Planned once: the window blocks a shorter hit would need
//   are not fetched then (the hit may fall back to the GPU hit).
//   Puts. Every host block of every group is put by the store policy; the host tier decides which
//   window blocks it caches (HostTierConfig::window_store: kRequestTail caches, and so puts, only
//   a request's tail window; its skips are TierStats::window_stores_skipped).
//   Per-group figures: group_stats().
//
//   Cost: add_request O(blocks x groups) (one hash per key of a group g >= 1, one digest per
//   block of a coarser group); the fills once the probe is answered O(blocks x groups) verified
//   host lookups (the coarser groups' keys computed again, once), plus O(blocks) SHA-256 for the
//   prefix identities (xxh3_128).
//
// Errors: the constructor throws pagedkv::Error (kInvalidArgument) for a group block size that is
// not a multiple of the tier's (the GPU manager refuses those first), a buffer smaller than
// (num_host_blocks + 1) * bytes_per_block, a zero bytes_per_block, a timeout or drain_timeout
// outside [0, 1 day], or kOnHostEviction with zero eviction_staging_blocks; add_request for a
// request already added (kInvalidState). Everything else (a store that is down, slow, full or
// returns corrupt values) is a normal outcome counted in stats(), never an exception from poll().
// std::bad_alloc from poll() leaves nothing half-done: no fill begun without its batch, no batch
// the store accepted without its entry (reserved before submitting), and the completions it had not
// handled yet are handled by the next poll (tests/tier/remote_tier_alloc_test.cpp). The host-tier
// hooks it installs never throw (a failure skips that block's put, counted in puts_skipped).
// Complexity: poll is O(completions + requests waiting for a probe); add_request O(blocks).
// Thread-compatible: the scheduler thread calls everything.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagedkv/remote/remote_prefix_probe.hpp"
#include "pagedkv/remote/remote_store.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv {

// When host blocks are put to the remote store (see the file comment).
enum class RemoteStorePolicy : std::uint8_t { kWriteThrough, kOnHostEviction };

struct RemoteTierConfig {
  PrefetchPolicy policy = PrefetchPolicy::kTimeout;
  std::chrono::milliseconds timeout{100};  // kTimeout: longest a request waits for the remote
  std::uint64_t bytes_per_block = 0;       // one host slot's bytes (the value payload size)
  bool load = true;                        // probe and load remote hits
  bool store = true;                       // put host blocks
  RemoteStorePolicy store_policy = RemoteStorePolicy::kWriteThrough;
  std::uint32_t store_min_hits = 0;  // kWriteThrough: 0 put every block cached; k: after k loads
  std::size_t max_puts_in_flight = 1024;     // pinned slots waiting for a put, at most
  std::size_t eviction_staging_blocks = 64;  // kOnHostEviction: copies awaiting their put, at most
  std::chrono::milliseconds drain_timeout{2000};  // destructor's wait for ops in flight
  // The KV format of the payloads (remote_value.hpp): the numeric value of pagedkv::KVDtype and
  // the scale mode (kKVScaleNone, kKVScalePerTensor, kKVScalePerTokenHead). Puts write it; a
  // get of a value of another format is a miss (rejected_values, the store's format_mismatches).
  std::uint8_t kv_dtype = kKVDtypeBFloat16Value;
  std::uint8_t kv_scale_mode = kKVScaleNone;
};

// Cumulative since construction.
struct RemoteTierStats {
  std::uint64_t requests = 0;          // add_request() calls with load on
  std::uint64_t probed_blocks = 0;     // keys probed
  std::uint64_t probe_hit_blocks = 0;  // leading keys found present (hybrid: the run's blocks
                                       // the host lacked, to fetch or wait for)
  std::uint64_t ready_by_timeout = 0;  // requests made ready by kTimeout's deadline
  std::uint64_t fills = 0;             // gets submitted into pinned host slots
  std::uint64_t fills_no_slot = 0;     // remote hits dropped: no free host slot (hybrid: runs
                                       // ended there, one each)
  std::uint64_t fills_refused = 0;     // gets refused by the store's full queue
  std::uint64_t fills_shared = 0;      // remote hits another request's get in flight was fetching
                                       // already: waited for, not fetched again
  std::uint64_t loaded_blocks = 0;     // gets that loaded a checked value (fill done)
  std::uint64_t load_misses = 0;       // gets that did not (miss, corrupt, timeout, error)
  std::uint64_t rejected_values = 0;   // of load_misses: a value was there but did not check
                                       // (another block's, another layout or version, corrupt)
  std::uint64_t loaded_bytes = 0;      // loaded_blocks x bytes_per_block
  std::uint64_t puts = 0;              // puts submitted
  std::uint64_t stored_blocks = 0;     // puts stored
  std::uint64_t stored_bytes = 0;      // stored_blocks x bytes_per_block
  std::uint64_t puts_skipped = 0;   // puts not submitted (in-flight cap, staging full, queue full)
  std::uint64_t eviction_puts = 0;  // of puts: blocks evicted from the host (kOnHostEviction)
  std::uint64_t puts_failed = 0;    // puts completed other than stored (full, timeout, error)
  std::uint64_t puts_skipped_full = 0;  // of puts_failed: the store was full
  std::uint64_t remote_hit_tokens = 0;  // tokens of the loaded blocks (one per position and group)
  // Hybrid models: window-group blocks the store held inside a remote run but before the window
  // at its end: not fetched (a tier without the window rule would have).
  std::uint64_t window_blocks_not_loaded = 0;
};

// One KV-cache group's share (RemoteTier::group_stats(); one entry for a one-group model).
struct RemoteTierGroupStats {
  std::uint64_t probed_blocks = 0;             // keys of this group probed
  std::uint64_t fills = 0;                     // gets submitted
  std::uint64_t loaded_blocks = 0;             // gets that loaded a checked value
  std::uint64_t loaded_bytes = 0;              // loaded_blocks x bytes_per_block
  std::uint64_t stored_blocks = 0;             // puts stored
  std::uint64_t stored_bytes = 0;              // stored_blocks x bytes_per_block
  std::uint64_t window_blocks_not_loaded = 0;  // see RemoteTierStats
};

class RemoteTier {
 public:
  using Clock = std::chrono::steady_clock;

  RemoteTier(TieredKVCacheManager& tier, RemoteStore& store, std::span<std::byte> host_buffer,
             RemoteTierConfig config);
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  // The request arrived (it must stay alive, its prompt unchanged, until remove_request()).
  void add_request(const Request& request, Clock::time_point now);
  void poll(Clock::time_point now);
  // Unknown ids are ready (nothing to wait for).
  bool ready(RequestId id, Clock::time_point now) const;
  void remove_request(RequestId id) noexcept;

  // Ops of this remote tier not yet completed.
  std::size_t in_flight() const noexcept { return in_flight_; }
  std::size_t pinned_for_puts() const noexcept { return put_pins_; }
  RemoteTierStats stats() const noexcept { return stats_; }
  std::vector<RemoteTierGroupStats> group_stats() const { return group_stats_; }
  const RemoteTierConfig& config() const noexcept { return config_; }
  // The store key of group `group`'s block `hash` (see Hybrid models): `hash` for group 0.
  BlockHash group_key(const BlockHash& hash, GroupId group) const;

 private:
  enum class Phase : std::uint8_t { kProbing, kLoading, kDone };
  struct Pending {
    const Request* request = nullptr;
    RemotePrefixProbe probe;
    std::size_t start = 0;  // first probed block
    Phase phase = Phase::kProbing;
    Clock::time_point deadline{};
    RemoteTicket get_ticket = 0;   // its own gets in flight (0: none)
    std::size_t shared_waits = 0;  // fills of other requests' gets it waits for
    std::uint64_t serial = 0;      // tells this request from a later one with the same id
    bool timed_out = false;        // counted in ready_by_timeout
    // Hybrid models: the probe of every group's blocks [start, end) (group-major keys), each
    // key's answer (0 unknown, 1 present, 2 absent or failed).
    std::size_t end = 0;
    RemoteTicket hybrid_ticket = 0;
    std::vector<BlockHash> keys;
    std::vector<std::uint8_t> present;
    std::size_t answered = 0;
  };
  // A request waiting for fill `index` of another request's get batch.
  struct Waiter {
    std::uint32_t index = 0;
    RequestId request = 0;
    std::uint64_t serial = 0;
  };
  struct GetBatch {
    RequestId request = 0;
    bool request_gone = false;
    std::size_t outstanding = 0;
    std::vector<HostFill> fills;
    std::vector<BlockHash> keys;  // by fill
    std::vector<GroupId> groups;  // by fill
    std::vector<Waiter> waiters;
  };
  // Fills in flight by block hash: an open-addressing table (linear probing, backward-shift
  // erase) sized at construction to twice the host slots, which bound the fills in flight (each
  // pins one), so it never fills up and never allocates.
  struct FetchEntry {
    BlockHash key;
    RemoteTicket ticket = 0;  // 0: empty
    std::uint32_t index = 0;  // fill index in that get batch
  };
  FetchEntry* fetch_find(const BlockHash& key) noexcept;
  void fetch_insert(const BlockHash& key, RemoteTicket ticket, std::uint32_t index) noexcept;
  void fetch_erase(const BlockHash& key) noexcept;
  void release_waiter(const Waiter& w) noexcept;

  void start_fills(RequestId id, Pending& p);
  // Hybrid models (see the file comment).
  void add_hybrid(const Request& request, Pending& p);
  void group_views(const Request& request);              // views_ of the request
  void key_offsets(std::size_t start, std::size_t end);  // key_offset_ of a Pending's keys
  void start_hybrid_fills(RequestId id, Pending& p);
  // Commits the fills of `batch` failed when destroyed armed: a start_fills that throws leaves no
  // fill begun (submit_fills disarms it once nothing can throw before the store takes them).
  struct FillGuard {
    FillGuard(TieredKVCacheManager& t, GetBatch& b) noexcept : tier(t), batch(b) {}
    FillGuard(const FillGuard&) = delete;
    FillGuard& operator=(const FillGuard&) = delete;
    ~FillGuard();
    TieredKVCacheManager& tier;
    GetBatch& batch;
    bool armed = true;
  };
  // Room for n fills in `batch`, get_ops_ and shared_ (cleared): recording a fill allocates
  // nothing.
  void reserve_fills(GetBatch& batch, std::size_t n);
  // What starting a request's fills counts (with window_skipped_): added to the stats by
  // submit_fills once nothing can throw, so a start that throws and is retried at the next poll
  // counts its blocks once.
  struct FillCounts {
    std::uint64_t hit_blocks = 0;  // stats_.probe_hit_blocks
    std::uint64_t no_slot = 0;     // stats_.fills_no_slot
  };
  // Submits `batch` (gets in get_ops_) and the waits in shared_ for request `id`; marks the
  // request's probe done and adds `counts` and window_skipped_ to the stats. Throwing (bad_alloc
  // before the store saw the batch), nothing of the request or the stats changed and `guard`
  // commits the batch's fills failed.
  void submit_fills(RequestId id, Pending& p, GetBatch&& batch, FillGuard& guard,
                    const FillCounts& counts);
  void on_cached(BlockId slot, bool from_fill);
  void on_loaded(BlockId slot);
  void skip_put(BlockId slot) noexcept;  // a hook failed: the slot's block is never put
  void on_evicted(BlockId slot) noexcept;
  void queue_put(BlockId slot);
  void submit_puts();
  void handle(const RemoteCompletion& c);
  std::span<std::byte> slot_bytes(BlockId slot) const;
  // The block a cached host slot holds, as its remote value is bound.
  RemoteValueBinding slot_binding(BlockId slot) const;

  TieredKVCacheManager& tier_;
  RemoteStore& store_;
  std::span<std::byte> host_;
  RemoteTierConfig config_;
  RemoteTierStats stats_;
  std::vector<RemoteTierGroupStats> group_stats_;  // one per group
  // Hybrid models: per group its window in blocks (kFullGroup: full attention).
  static constexpr std::size_t kFullGroup = ~std::size_t{0};
  // Per group its block size and that over the tier's (the smallest); align_: the groups' LCM
  // block size over the smallest (a hybrid hit ends on a multiple of it).
  bool hybrid_ = false;
  std::vector<std::size_t> window_;
  std::vector<std::uint32_t> group_bs_;
  std::vector<std::size_t> factor_;
  std::size_t align_ = 1;
  mutable std::vector<TokenId> key_tokens_;  // group_key's pseudo-block
  // Scratch (hybrid): each group's view of a request (its own blocks and keys, coarse_ holding a
  // coarser group's), and the first key of each group in a Pending's keys.
  std::vector<std::vector<BlockHash>> coarse_;
  std::vector<BlockSequence> views_;
  std::vector<std::size_t> key_offset_;

  std::unordered_map<RequestId, Pending> pending_;
  std::uint64_t next_serial_ = 1;
  std::vector<FetchEntry> fetching_;                            // size a power of two
  std::vector<std::pair<RemoteTicket, std::uint32_t>> shared_;  // scratch: start_fills' waits
  // One put: a pinned host slot, or a staging buffer holding an evicted block's copy.
  static constexpr std::uint32_t kNoStaging = ~std::uint32_t{0};
  struct PutItem {
    BlockId slot = kNullBlockId;         // pinned host slot (kNullBlockId: none)
    std::uint32_t staging = kNoStaging;  // staging buffer index (kNoStaging: none)
    GroupId group = 0;                   // the block's KV-cache group
    bool done = false;                   // completed (released)
  };
  struct PutBatch {
    std::vector<PutItem> items;
    std::size_t outstanding = 0;
  };
  void release(PutItem& item) noexcept;
  std::span<std::byte> staging_bytes(std::uint32_t index);
  std::unordered_map<RemoteTicket, std::pair<RequestId, std::size_t>> probes_;  // id, outstanding
  // A batch's entry is made (a node, buckets reserved) before the store is given the batch and
  // inserted, allocating nothing, once it accepts it.
  using GetMap = std::unordered_map<RemoteTicket, GetBatch>;
  using PutMap = std::unordered_map<RemoteTicket, PutBatch>;
  GetMap gets_;
  PutMap puts_;
  std::size_t in_flight_ = 0;  // ops submitted, completion not yet handled
  std::size_t put_pins_ = 0;   // slots pinned for puts (queued or in flight)

  std::vector<std::uint32_t> slot_loads_;  // loads per host slot since it was cached
  std::vector<std::uint8_t> slot_put_;     // 1: the slot's current block was queued for a put
  std::vector<PutItem> put_queue_;         // pinned slots / staged copies, not yet submitted
  // kOnHostEviction: the block cached in each host slot (recorded when cached; empty block hash:
  // none), the staging buffers, the free ones, and the block each staged copy is put as.
  std::vector<RemoteValueBinding> slot_block_;
  std::vector<std::byte> staging_;
  std::vector<std::uint32_t> staging_free_;
  std::vector<RemoteValueBinding> staging_block_;
  std::size_t staged_in_flight_ = 0;  // staged puts submitted, not yet completed
  // The store's completions being handled: [next_completion_, size) are not handled yet (left by
  // a handle() that threw: the next poll handles them first).
  std::vector<RemoteCompletion> completions_;
  std::size_t next_completion_ = 0;
  // Scratch.
  std::vector<BlockHash> keys_;
  std::vector<BlockHash> identities_;  // start_fills: the request's prefix identities
  std::vector<std::uint8_t> held_;     // start_hybrid_fills: per key, the host holds it
  std::vector<std::size_t> last_gap_;  // start_hybrid_fills: per window group
  // start_hybrid_fills: per group, its blocks in the store not loaded (outside the window at the
  // hit); empty for start_fills. Counted by submit_fills.
  std::vector<std::uint64_t> window_skipped_;
  std::vector<RemoteGet> get_ops_;
  std::vector<RemotePut> put_ops_;
};

}  // namespace pagedkv
