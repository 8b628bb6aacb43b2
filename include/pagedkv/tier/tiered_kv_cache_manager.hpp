// pagedkv/tier/tiered_kv_cache_manager.hpp: a KVCacheManager with a host-memory tier beside it,
// so the prefix cache outgrows the GPU (vLLM's offloading connector, TensorRT-LLM's secondary
// pool, SGLang's HiCache L2).
//
// The engine owns the host buffer (pinned memory, num_host_blocks slots of one block each: every
// layer's K and V, see base/transfer_plan.hpp) and its streams; the tier decides which slot holds
// which block. The host tier is a second BlockPool: LRU with lazy eviction, verified lookups.
//
// Per scheduling step, for each request:
//   1. hit = get_computed_blocks(request)   the GPU prefix, then the longest run of following
//                                           blocks in the host tier (capped at num_tokens - 1)
//   2. a = allocate_slots(request, n, hit)  GPU blocks for the host-hit part and n new tokens, and
//                                           a TransferPlan: evictions and loads to run before the
//                                           forward pass, stores to run after it
//   3. the engine runs a->plan's kBeforeForward stage on its stream, then commit()s every
//      eviction and load (done or failed; one call per id, or commit(ids) per batch); if the
//      request had loads, finish_loads(request) says how many tokens truly have K/V (a failed load
//      rolls the request back to the block before it; the engine recomputes from there) and may add
//      stores; the forward pass runs; the kAfterForward stage runs and its stores are committed
//   4. free(request) / preempt(request) once none of its transfers is in flight
// A transfer pins what it touches until committed: a loading or storing host slot cannot be
// evicted or reused, and loaded GPU blocks are not cached (not hit-able) until finish_loads(). A
// store's host slot becomes hit-able only when the store is committed done.
//
// Verification (pool/block_pool.hpp, docs/hashing.md, docs/tiers.md): a host block is a hit when
// its hash, tokens and extra keys equal the request's block (the host pool's verified lookup)
// and the identity of the prefix before it matches the request's. With a SHA-256 hasher that
// identity is the chained hash: the host pool, like the GPU pool, stores each slot's parent hash
// and checks it in its lookup (match_cached_block_after). With a hasher that is not collision
// resistant (xxh3_128, which an adversary can make collide, and test hashers) a chained hash
// proves nothing about the prefix, so the tier keeps a prefix identity: the SHA-256 chain over
// the tokens and extra keys of every block up to and including this one (prefix_identities()).
// Every cached GPU block records its identity when the tier sees it cached (from its verified
// predecessor's, so one SHA-256 per cached block), every store and fill carries one into its host
// slot, and a host hit compares the slot's identity with the request's (computed for the host
// run only: the GPU hit's last block gives the start). A collision is then a miss, never a wrong
// hit, in both tiers and in the remote values (tier/remote_tier.hpp binds them to it).
//
// What the tier knows of GPU blocks: for write-back it needs an evicted block's content (hash,
// parent hash, tokens, extra keys) after the GPU pool reused the block. It registers itself as the
// GPU pool's eviction observer (BlockPool::EvictionObserver) and reads the content there, from
// the pool's stored material (verify_cache_hits with SHA-256 chain hashes); otherwise (prefix
// identities, verification off) it records each newly cached block's content itself. Evicted
// blocks whose host copy the tier knows (a slot remembered at load or lookup, its epoch
// unchanged) are refreshed in the host LRU on the spot; the others are looked up and stored once
// allocate_slots has pinned its hit.
//
// Hybrid models (sliding-window groups beside full attention, of one or of different block
// sizes, each a multiple of the smallest, as the GPU manager takes them): every group is
// offloaded and onboarded; host slots are keyed by (block hash, group), so two groups' blocks of
// one position never alias, and a group's block keys are the GPU manager's at that group's block
// size (a coarser group's block j: the digest of the fine hashes it covers, manager/
// coordinator.hpp). A hit is the GPU manager's fixed-point hit of G tokens, then the longest
// L > G, a multiple of the least common multiple of the group block sizes (as the GPU manager
// clamps), such that every full-attention group holds its blocks of tokens [G, L) in the host and
// every window group, in its own blocks of L / block_size, holds
// [max(G_g, L_g - window_blocks), L_g) (its blocks before that, back to L_g - window_blocks, are
// in the GPU hit); a window group loads only those, its other positions of the host part are not
// loaded (their GPU blocks hold no K/V and are never cached: finish_loads drops them from the GPU
// cache, and the manager releases them as out of window). Each copy names its group
// (BlockCopy::group) and moves one block of that group. Which window blocks are stored:
// HostTierConfig::window_store. A failed load rolls back to the longest prefix still valid in
// every group: the start of the earliest failed block of any group (a token count, a multiple of
// the smallest block size), or G when a window group's window there reaches into blocks it
// never loaded.
// Host slot bytes: a host slot holds one block of one group, so the engine's host buffer has
// num_host_blocks slots of one stride, at least the largest group's block bytes
// (HostTierConfig::group_bytes_per_block, max over groups); a copy of group g moves
// group_bytes_per_block[g] bytes at the slot's start, and the byte counts (TierStats,
// group_stats()) count those. vLLM chooses block sizes so that every group's block has the same
// bytes (then nothing is wasted); otherwise a smaller group's slots leave their tail unused.
// Below the host tier (RemoteTier): begin_fill and host_holds take the group and an index in that
// group's own blocks (a coarser group's block j covers tokens [j * its block size, ...), keyed and
// verified as the host tier's slots of that group). Not yet for hybrid models:
// local_prefix_blocks (kInvalidArgument; RemoteTier computes a hybrid request's local hit itself).
// Errors (pagedkv::Error, nothing changed): misuse of the manager calls as in KVCacheManager; a
// request that belongs to another manager (manager/request.hpp: Ownership; every call taking a
// request checks it before anything else, the tier's own state included); a stale host hit;
// allocating for a request whose loads are not finished; committing an unknown or already
// committed transfer; finish_loads with loads in flight; freeing or preempting a request with
// transfers in flight. A full host tier is normal: stores are skipped and counted. Strong
// guarantee, std::bad_alloc included: a call that throws changed nothing. Once the GPU manager
// has committed a call's change, what cannot be undone is best effort instead: a store or fill
// that cannot be planned or cached for memory, and an event that cannot be copied, are dropped
// and counted (TierStats::stores_skipped_no_memory, events_dropped_no_memory).
// Complexity: O(1) per block for lookups, plans and commits (plus O(block_size) per verified
// host hit; with prefix identities one SHA-256 of a block per cached GPU block and per block a
// host run tries; hybrid models with groups of a larger block size: the request's keys at that
// size, one digest per block of it, per lookup as the GPU manager's and once per allocation).
// Thread-compatible: one scheduler thread. Not copyable or movable (the pools' event sinks point
// at it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "pagedkv/base/spare_nodes.hpp"
#include "pagedkv/base/transfer_plan.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/pool/block_pool.hpp"
#include "pagedkv/pool/kv_events.hpp"
#include "pagedkv/tier/host_tier_config.hpp"

namespace pagedkv {

// Names one in-flight copy; unique for the tier's lifetime.
using TransferId = std::uint64_t;

// get_computed_blocks(): the GPU hit and the host slots continuing it.
struct TieredCacheHit {
  CacheHit gpu;
  // Host slot of the request's block gpu.blocks.size() + i (of group 0, at its block size).
  std::vector<BlockId> host_slots;
  // Hybrid models: groups 1.. (group g at [g - 1]), as host_slots at group g's block size (block
  // gpu.group(g).size() + i); 0 where the group loads nothing (a window group's positions before
  // its window at the hit's end). Empty otherwise.
  std::vector<std::vector<BlockId>> host_other_groups;
  std::size_t num_host_tokens = 0;  // host_slots.size() * group 0's block size
  // The tier's host epoch when the slots were verified: allocate_slots() trusts that
  // verification only while no host slot has been reassigned since, and verifies every slot
  // again otherwise (0, as in a hit built by hand: always verified again).
  std::uint64_t host_epoch = 0;
  // A digest binding host_slots to the request's block hashes they were found for and to this
  // tier: allocate_slots() trusts the lookup only when it matches (else it verifies every slot
  // again, as for a hit built by hand).
  std::uint64_t host_check = 0;

  std::size_t num_tokens() const noexcept { return gpu.num_tokens + num_host_tokens; }
};

// A plan and the id of each of its copies, to commit.
struct TierPlan {
  TransferPlan plan;
  std::vector<TransferId> eviction_ids;  // parallel to plan.evictions
  std::vector<TransferId> load_ids;      // parallel to plan.loads
  std::vector<TransferId> store_ids;     // parallel to plan.stores
};

struct TierAllocation {
  // The request's newly allocated GPU blocks (valid until the next call on the tier); the
  // host-hit part's blocks come first, in chain order.
  std::span<const BlockId> new_blocks;
  TierPlan transfers;
};

struct LoadResult {
  // Tokens of the hit whose K/V is in place: the whole hit, or up to the block before the first
  // failed load. The engine continues (or, when rolled_back, recomputes) from there.
  std::size_t num_computed_tokens = 0;
  bool rolled_back = false;
  TierPlan transfers;  // stores of blocks this finish cached (kAfterForward stage)
};

// A host slot receiving a block from below the host tier (begin_fill()).
struct HostFill {
  TransferId id = 0;  // commit(id, ok) once the slot's bytes are in place (or failed)
  BlockId slot = 0;   // the engine's host slot to write the block's bytes into
};

// Callbacks into a tier below the host (tier/remote_tier.hpp). Called on the scheduler thread at
// the end of commit(); they may call pin_host_slot() / unpin_host_slot(), nothing else.
struct HostTierHooks {
  // `slot` became hit-able (a store, eviction or fill committed done); from_fill: by a fill.
  std::function<void(BlockId slot, bool from_fill)> on_cached;
  // A load from `slot` was committed done (the slot is still cached).
  std::function<void(BlockId slot)> on_loaded;
  // The host tier evicted the block cached in `slot` to reuse the slot (for a store, an eviction
  // or a fill). Called inside the allocate_slots(), finish_loads() or begin_fill() call that
  // evicted it, once the slot's new use is recorded. The slot's bytes still hold the evicted
  // block until the engine runs the returned plan (or the fill writes it): a hook that needs
  // them copies them now. It must not throw and may call nothing on the tier.
  std::function<void(BlockId slot)> on_evicted;
};

// Everything observable about a tier's state, for tests: equal snapshots mean equal tiers.
struct TieredSnapshot {
  KVCacheManagerSnapshot gpu;
  BlockPoolSnapshot host;
  std::vector<std::uint64_t> live_transfers;  // sorted ids
  std::uint64_t next_event_seq = 0;
  std::uint64_t requests = 0, queried_tokens = 0, gpu_hit_tokens = 0, host_hit_tokens = 0;

  bool operator==(const TieredSnapshot&) const = default;
};

class TieredKVCacheManager {
 public:
  // Throws pagedkv::Error (kInvalidArgument) for the GPU manager's refusals, caching off,
  // fewer than 1 host block, selective_hits 0 or group_bytes_per_block not one per group.
  TieredKVCacheManager(const KVCacheManagerConfig& gpu, const HostTierConfig& host);
  ~TieredKVCacheManager();
  TieredKVCacheManager(const TieredKVCacheManager&) = delete;
  TieredKVCacheManager& operator=(const TieredKVCacheManager&) = delete;

  const KVCacheManager& gpu() const noexcept { return manager_; }
  const BlockPool& host_pool() const noexcept { return host_; }
  const HostTierConfig& host_config() const noexcept { return host_config_; }
  // The block size requests are hashed at (the smallest group block size).
  std::uint32_t block_size() const noexcept { return manager_.block_size(); }

  Request make_request(RequestId id, std::span<const TokenId> prompt,
                       RequestHashKeys keys = {}) const {
    return manager_.make_request(id, prompt, std::move(keys));
  }

  // The GPU prefix, then the longest run in the host tier; records stats. Changes no state but
  // stats: pass the result to allocate_slots() before any other call.
  TieredCacheHit get_computed_blocks(const Request& request);

  // Allocates GPU slots for the hit's host part and num_new_tokens tokens after the hit (plus
  // lookahead slots), pins the hit's host slots and returns the plan; std::nullopt when the GPU
  // blocks do not fit (nothing changed). Loaded blocks and the new tokens' blocks are cached by
  // finish_loads(); without a host hit, as KVCacheManager::allocate_slots does.
  std::optional<TierAllocation> allocate_slots(Request& request, std::size_t num_new_tokens,
                                               const TieredCacheHit& hit = {},
                                               std::size_t num_lookahead_tokens = 0);

  // Commits one copy as done (ok) or failed. A done store makes its host slot hit-able (unless
  // caching it fails for memory: then it is freed, counted in stores_skipped_no_memory); a failed
  // one frees it. Errors: an unknown or already committed id (kNotFound).
  void commit(TransferId id, bool ok);
  // commit(id, ok) for each of `ids` in order, in one call (an engine's batch of copies that ran
  // on one stream, e.g. a plan's load_ids): every id is checked before anything changes, and the
  // host hooks (on_loaded, on_cached) run once every copy is committed, in the order of `ids`.
  // Errors (nothing changed): an unknown or already committed id, or an id given twice
  // (kNotFound); bad_alloc (before any commit: a commit never stops half-way).
  void commit(std::span<const TransferId> ids, bool ok);

  // Once every load of the request is committed: caches the blocks whose K/V is in place (the
  // loaded run up to the first failure and, without failure, the new tokens' blocks) and returns
  // where the request stands. Errors: no loads to finish (kInvalidState), loads in flight
  // (kInvalidState).
  LoadResult finish_loads(Request& request);
  bool has_unfinished_loads(RequestId id) const noexcept;
  // Transfers not yet committed (all requests).
  std::size_t num_in_flight() const noexcept { return num_live_; }

  // As KVCacheManager's, refused (kInvalidState) while the request has transfers in flight. A
  // preempted request's cached blocks survive in the host tier: resuming it is a load.
  void free(Request& request);
  void preempt(Request& request);

  std::span<const BlockId> block_ids(RequestId id) const { return manager_.block_ids(id); }
  // Forgets every cached block in both tiers when no request holds blocks and nothing is in
  // flight; false (nothing done) otherwise.
  bool reset_prefix_cache();

  // ---- Below the host tier (tier/remote_tier.hpp drives these) ----
  // Leading blocks of the request held by the GPU (by hash) and then the host tier (verified as
  // get_computed_blocks does), capped as a hit is. A hint: changes nothing, records no stats.
  std::size_t local_prefix_blocks(const Request& request) const;
  // Whether the host tier holds block `index` of the request in KV-cache group `group` (verified,
  // parent hash checked; `index` in the group's own blocks, at its block size: false past its
  // full blocks). With prefix identities O(index x factor) SHA-256 blocks. Errors
  // (kInvalidArgument): a group the tier does not have.
  bool host_holds(const Request& request, std::size_t index, GroupId group = 0) const;
  // Whether the tier keeps prefix identities (the hasher is not collision resistant; see
  // Verification in the file comment).
  bool uses_prefix_identities() const noexcept { return !host_chain_; }
  // The prefix identities of the request's blocks [0, end) (end capped at its full hashed
  // blocks), into `out` (replaced): out[i] is the SHA-256 chain over the tokens and extra keys of
  // blocks 0 .. i. Empty when !uses_prefix_identities(). O(end) SHA-256 blocks; no state changes.
  void prefix_identities(const Request& request, std::size_t end,
                         std::vector<BlockHash>& out) const;
  // The prefix identity and parent hash stored with cached host slot `slot` (as a remote value is
  // bound to them). The identity is empty when !uses_prefix_identities(). Undefined for a slot not
  // cached.
  const BlockHash& host_slot_identity(BlockId slot) const noexcept;
  BlockHash host_slot_parent(BlockId slot) const noexcept;
  // Allocates and pins a free host slot to receive block `index` of the request (a full block)
  // from below; the block's identity (hash, parent hash, tokens, extra keys, prefix identity) is
  // copied now, so the request may change or go before the commit. With prefix identities it
  // costs O(index) SHA-256 blocks (the identity is computed from the request's content). commit(id,
  // true) makes the slot hit-able, as a store's commit does; commit(id, false) frees it.
  // std::nullopt (counted in stores_skipped_full) when every host slot is pinned. Hybrid models:
  // the slot receives group `group`'s block `index` (in that group's own blocks: a coarser
  // group's key, its own block size of tokens, its previous block's key as parent and the prefix
  // identity of the fine block it ends with; cached under (key, group) on commit). Errors
  // (kInvalidArgument, nothing changed): index not a full block of the request in that group, a
  // group the tier does not have.
  std::optional<HostFill> begin_fill(const Request& request, std::size_t index, GroupId group = 0);
  // Keeps a cached host slot from eviction and reuse until unpin_host_slot() (a store below the
  // host reads it meanwhile). Errors (kInvalidArgument): a slot out of range or not cached (pin),
  // not pinned (unpin).
  void pin_host_slot(BlockId slot);
  void unpin_host_slot(BlockId slot);
  void set_host_hooks(HostTierHooks hooks) { hooks_ = std::move(hooks); }

  TierStats stats() const noexcept;
  // Per KV-cache group: loaded and stored blocks and bytes (HostTierConfig's per-group bytes).
  std::vector<TierGroupStats> group_stats() const { return group_stats_; }
  // KV events of both tiers in one gap-free sequence, BlockStored/BlockRemoved carrying medium
  // "GPU" or "CPU". Enabled by KVCacheManagerConfig::enable_kv_events. (An event whose copy
  // fails for memory once its call has committed is dropped, its sequence number skipped: the
  // gap shows the loss; TierStats::events_dropped_no_memory counts it.)
  std::vector<KVEvent> take_events();
  void set_event_sink(KVEventSink sink);

  // Both pools' invariants plus the tier's: every pinned host slot's ref count equals its live
  // transfers, a storing slot is not cached, every cached host slot has its parent hash, with
  // own records every cached GPU block has a record of its content (and only those), a GPU
  // block's remembered host slot holds its content, transfer counts per request.
  void check_invariants() const;
  TieredSnapshot snapshot() const;

 private:
  friend class RemoteTier;  // begin_fill_known: the identities it computed for its gets
  // begin_fill() with the block's prefix identity given (prefix_identities(request)[j] for the
  // fine block j the group's block `index` ends with, (index + 1) x factor - 1; computed by the
  // caller for the whole run; nullptr: computed here) and, optionally, the group's view of the
  // request (group_seq's: its keys at its block size; nullptr: computed here, O(blocks)).
  std::optional<HostFill> begin_fill_known(const Request& request, std::size_t index,
                                           const BlockHash* known_identity, GroupId group = 0,
                                           const BlockSequence* group_view = nullptr);
  void check_fill_group(GroupId group, const char* what) const;  // kInvalidArgument
  enum class Kind : std::uint8_t { kLoad, kEviction, kStore, kFill };
  struct RequestState;
  struct Transfer {
    RequestState* state = nullptr;  // the owning request's (stable map node); null for a fill
    std::uint32_t generation = 0;
    bool live = false;
    Kind kind = Kind::kLoad;
    BlockId gpu = 0;
    BlockId host = 0;
    std::uint32_t chain_index = 0;  // kLoad: index in the request's host run
    GroupId group = 0;              // the KV-cache group of the block copied
  };
  struct RequestState {
    RequestId id = 0;
    std::uint32_t loads_in_flight = 0;
    std::uint32_t transfers_in_flight = 0;
    bool loading = false;          // allocated with a host hit; finish_loads() not yet called
    std::size_t hit_begin = 0;     // first loaded block (the GPU hit's length in blocks)
    std::size_t num_loads = 0;     // loaded blocks
    std::size_t first_failed = 0;  // lowest failed load's chain index; num_loads when none
    std::size_t cache_upto = 0;    // tokens to cache when every load is done
    std::size_t scanned = 0;       // leading blocks whose caching the tier has recorded
    // Hybrid models: the hit's end, and per group the leading blocks recorded (its own blocks).
    // hit_begin, hit_end, num_loads and first_failed count blocks of the smallest block size
    // (bs_; one group's blocks when every group has one size).
    std::size_t hit_end = 0;
    std::vector<std::size_t> scanned_groups;
    std::vector<BlockHash> identities;  // prefix identities of the request's blocks (hybrid)
    // Groups of a larger block size than bs_: the request's block keys at that size (empty for
    // the others), extended before the manager changes state (no allocation after it).
    std::vector<std::vector<BlockHash>> coarse;
  };
  class ContentSource;
  using SharedExtraKeys = std::shared_ptr<const OwnedExtraKeys>;

  // gpu_extra_[b] = keys (null: none), num_gpu_extra_ kept. No allocation.
  void set_gpu_extra(BlockId b, SharedExtraKeys keys) noexcept;
  // Computes what record_new_blocks will record for the request's blocks from .. to (capped at
  // its hashed blocks) into extra_ahead_ / identity_ahead_: called before the GPU manager changes
  // state, since it allocates. `row`: GPU blocks of the request's first positions, at least up to
  // from - 1 (that block's identity is the chain's parent; unused when from is 0).
  void prepare_records(const Request& request, std::size_t from, std::size_t to,
                       std::span<const BlockId> row);
  void forward_event(const KVEvent& event, const char* medium) noexcept;
  // The GPU pool evicts a block (inside manager_.allocate_slots): forgets what the tier knew of
  // its content; write-back refreshes the host copy it knows, or keeps the content (evicted_)
  // for allocate_slots to look up and store once the hit is pinned.
  void on_evict(const BlockPool& pool, BlockId id) noexcept;
  // on_evict() but for write-back's refresh of a known host copy: forgets the block's records
  // (selective hits, own records, extra keys), or with `keep` keeps it in evicted_.
  [[gnu::noinline]] void forget_evicted(const BlockPool& pool, BlockId id, bool keep) noexcept;
  class EvictionForwarder final : public BlockPool::EvictionObserver {
   public:
    explicit EvictionForwarder(TieredKVCacheManager& tier) noexcept : tier_(tier) {}
    void on_evict(const BlockPool& pool, BlockId id) noexcept override { tier_.on_evict(pool, id); }

   private:
    TieredKVCacheManager& tier_;
  };
  void record_new_blocks(Request& request, RequestState& state, TierPlan& out);
  // ---- Hybrid models (tier_hybrid.cpp) ----
  void hybrid_host_hit(const Request& request, TieredCacheHit& hit);
  std::optional<TierAllocation> hybrid_allocate_slots(Request& request, std::size_t num_new_tokens,
                                                      const TieredCacheHit& hit,
                                                      std::size_t num_lookahead_tokens);
  LoadResult hybrid_finish_loads(Request& request, RequestState& st);
  void hybrid_record_new_blocks(Request& request, RequestState& state, TierPlan& out);
  // Marks the last window_blocks cached blocks of each window group's row (write-back's
  // WindowStoreRule::kRequestTail) before the request releases them.
  void hybrid_mark_tail(const Request& request);
  // Whether a window group's block at `index` of a request with `num_tokens` tokens is stored
  // (write-through and selective).
  bool window_store_allowed(std::size_t g, std::size_t index,
                            std::size_t num_tokens) const noexcept;
  // st.identities extended to the request's first `end` blocks (capped at its full blocks).
  void hybrid_identities(const BlockSequence& seq, RequestState& st, std::size_t end);
  // prepare_records() for hybrid_record_new_blocks: each group's blocks from `from[g]` (or
  // st.scanned_groups[g] when from is empty) up to `upto` tokens; st.coarse already extended.
  void hybrid_prepare_records(const Request& request, RequestState& st, std::size_t upto,
                              std::span<const std::size_t> from);
  // Group g's view of the request's key material `fine` (hashed at bs_): `fine` itself, or for a
  // coarser group the same tokens keyed at its block size (coarse[g] extended in place; coarse is
  // only indexed for a coarser group).
  BlockSequence group_seq(const BlockSequence& fine, std::size_t g,
                          std::vector<std::vector<BlockHash>>& coarse) const {
    return factor_[g] == 1 ? fine : coarse_keys_.group_sequence(fine, g, coarse[g]);
  }
  // st.coarse extended to every full block of `fine` in each coarser group.
  void hybrid_coarse(const BlockSequence& fine, RequestState& st);
  std::uint64_t hybrid_hit_check(const TieredCacheHit& hit, std::span<const BlockHash> hashes,
                                 std::uint64_t request_salt) const noexcept;
  // Group g's host slot of the hit's position i (0 when none).
  static BlockId hit_slot(const TieredCacheHit& hit, std::size_t g, std::size_t i) noexcept {
    return g == 0 ? hit.host_slots[i] : hit.host_other_groups[g - 1][i];
  }
  bool is_window(std::size_t g) const noexcept { return window_blocks_[g] != kFullGroup; }
  static constexpr std::size_t kFullGroup = ~std::size_t{0};
  // Write-through and selective: stores seq's block `index`, cached in GPU block gpu_block, in a
  // free host slot unless the host holds it (host_has).
  void schedule_store(BlockId gpu_block, const BlockSequence& seq, std::size_t index,
                      RequestState& state, TierPlan& out, GroupId group = 0);
  // A store (kind kStore or kEviction) of view's block `index` from GPU block gpu_block into a
  // free host slot; the content is copied now. Skipped and counted when every slot is pinned.
  void store_block(BlockId gpu_block, const BlockSequence& view, std::size_t index,
                   RequestState& state, Kind kind, TierPlan& out, GroupId group = 0);
  // Whether the host holds seq's block `index`, cached in GPU block gpu_block (refreshing the
  // slot's LRU place): the remembered slot when still valid, else a verified lookup (then
  // remembered).
  bool host_has(BlockId gpu_block, const BlockSequence& seq, std::size_t index, GroupId group = 0);
  // Whether gpu_host_slot_[b] names a slot that still holds the block's content.
  bool remembered_valid(std::size_t b) const noexcept;
  // Write-back's evictions kept by on_evict: verified lookup, else store.
  void store_evicted(RequestState& state, TierPlan& out);
  // commit() of a store, eviction or fill; returns whether the slot became hit-able (the caller
  // runs on_cached).
  bool commit_receive(std::size_t idx, Transfer& t, bool ok);
  void close_transfer(Transfer& t, std::size_t idx);  // back to the free list
  // commit() of a load, without its hook.
  void commit_load(std::size_t idx, Transfer& t, bool ok);
  [[noreturn]] static void throw_unknown(TransferId id);  // either commit()
  void refresh(BlockId slot);
  // A free host slot for a store or fill, its epoch bumped; evicted: it held a cached block.
  std::optional<BlockId> take_host_slot(bool& evicted);
  // Whether `slot` is the one a verified lookup of seq's block `index` finds (identity: that
  // block's prefix identity; unused with chained-hash identities).
  bool host_verified(const BlockSequence& seq, std::size_t index, BlockId slot,
                     const BlockHash* identity, GroupId group = 0) const;
  // The prefix identity of seq's block `index` after the identity `parent` of block index - 1
  // (nullptr for block 0).
  BlockHash identity_after(const BlockHash* parent, const BlockSequence& seq, std::size_t index,
                           std::vector<MultiModalKey>& scratch) const;
  void sequence_identities(const BlockSequence& seq, std::size_t end,
                           std::vector<BlockHash>& out) const;
  // TieredCacheHit::host_check of slots found for hashes[begin ..] at host epoch `epoch`.
  std::uint64_t hit_check(std::span<const BlockId> slots, std::span<const BlockHash> hashes,
                          std::size_t begin, std::uint64_t epoch,
                          std::uint64_t request_salt) const noexcept;
  // The host slot holding seq's block `index` after seq's own previous block (verified, the
  // parent hash checked; with prefix identities, the slot's identity equal to *identity, the
  // request's identity of block `index`), or kNoBlock.
  BlockId host_match(const BlockSequence& seq, std::size_t index, const BlockHash* identity,
                     GroupId group = 0) const;
  // Forgets a request's loaded blocks from `from` (chain index) on: their loads did not land, so
  // the slots noted for them name content they do not hold.
  void forget_loaded_slots(const Request& request, const RequestState& state, std::size_t from);
  // A one- or two-block view of one stored block of `block_size` tokens (at tokens[block_size]).
  BlockSequence content_sequence(const std::vector<TokenId>& tokens, const BlockHash* hashes,
                                 bool first, const ContentSource* extra,
                                 std::uint32_t block_size) const;
  TransferId open_transfer(Kind kind, RequestState* state, BlockId gpu, BlockId host,
                           std::uint32_t chain_index);
  // A slab entry for a new transfer (reserve_transfers made room); grow_transfers: a new one.
  std::uint32_t take_transfer();
  std::uint32_t grow_transfers();
  void reserve_transfers(std::size_t more);
  // Room in copies_ for this call's evictions and stores (cleared first). hand_over_copies moves
  // them into the call's result: a plan with none allocates nothing for them.
  void reserve_copies(std::size_t evictions, std::size_t stores);
  void hand_over_copies(TierPlan& out) noexcept;

  HostTierConfig host_config_;
  KVCacheManager manager_;
  BlockPool host_;
  // The host pool stores each slot's parent hash and tokens. host_chain_ (SHA-256 hashers: chain
  // hashes identify their prefix): it checks the parent hash in match_cached_block_after(). Else
  // (prefix identities) the tier looks up by tokens and extra keys and compares host_identity_.
  bool host_chain_;
  std::uint32_t bs_;  // the smallest group block size (requests are hashed at it)
  // Tokens kept per recorded block (GPU records, transfers, evictions): the largest group block
  // size (bs_ when every group has one size).
  std::uint32_t stride_;
  // Per group: its block size and that over bs_; the groups' LCM block size over bs_ (a hybrid
  // hit's length is a multiple of it, in blocks of bs_); the coarser groups' keys (a copy of the
  // GPU manager's coordinator: the same keys).
  std::vector<std::uint32_t> group_bs_;
  std::vector<std::size_t> factor_;
  std::size_t align_ = 1;
  KVCacheCoordinator coarse_keys_;
  // Prefix identities (!host_chain_): the SHA-256 hasher of the chain, each cached GPU block's
  // identity (with own records: set with gpu_hash_), each cached host slot's, each store's.
  BlockHasher identity_hasher_;
  std::vector<BlockHash> gpu_identity_;
  std::vector<BlockHash> host_identity_;
  std::vector<BlockHash> transfer_identity_;
  std::vector<BlockHash> identity_scratch_;  // allocate_slots: a hit verified again

  // What each cached GPU block holds, for write-back's store after the pool evicted it. A GPU
  // pool that keeps chain material (verify_cache_hits with SHA-256 chain hashes) holds it
  // already: on_evict reads it there (own_records_ false; the four vectors below stay empty).
  // Otherwise (prefix identities, verification off) the tier records it, with the block's prefix
  // identity, when it sees the block cached: gpu_hash_[b] empty means block b is not cached.
  bool own_records_;
  std::vector<BlockHash> gpu_hash_;
  std::vector<BlockHash> gpu_parent_;    // previous block's hash; unused for a chain's first block
  std::vector<std::uint8_t> gpu_first_;  // 1: block 0 of its chain
  std::vector<TokenId> gpu_tokens_;      // block_size tokens per GPU block
  std::vector<std::uint32_t> gpu_hits_;  // hits since cached (kWriteThroughSelective)
  // Per GPU block: the extra keys of a cached block that has some (shared: runs of blocks with
  // equal keys, a LoRA adapter's, hold one copy, and a store takes it without allocating);
  // num_gpu_extra_ counts the set ones.
  std::vector<SharedExtraKeys> gpu_extra_;
  std::size_t num_gpu_extra_ = 0;
  // What record_new_blocks (non-hybrid) records for the request's blocks ahead_from_ .. : each
  // block's extra keys and, with prefix identities, its identity, computed by prepare_records
  // before the GPU manager changes state (building them allocates).
  std::size_t ahead_from_ = 0;
  std::vector<SharedExtraKeys> extra_ahead_;
  std::vector<BlockHash> identity_ahead_;
  // Hybrid models: per group, the extra keys of its blocks group_ahead_from_[g] .. (the
  // identities go to RequestState::identities ahead).
  std::vector<std::size_t> group_ahead_from_;
  std::vector<std::vector<SharedExtraKeys>> group_extra_ahead_;
  std::vector<std::size_t> group_from_scratch_;
  // Per GPU block: a host slot verified to hold the block's content, trusted only while the
  // slot's epoch is the one noted and the slot is cached; 0 when none is known. Spares the second
  // verified lookup when the block is later stored or evicted (host_has, on_evict). Noted when a
  // load is planned (forgotten if that load does not land) and by host_has's lookup; forgotten
  // when the GPU pool evicts the block.
  std::vector<BlockId> gpu_host_slot_;
  std::vector<std::uint64_t> gpu_host_epoch_;
  // Write-back: blocks the GPU pool evicted during manager_.allocate_slots whose host copy is not
  // known, in eviction order, and (without own records) their content copied in on_evict.
  std::vector<BlockId> evicted_;
  std::vector<BlockHash> evicted_hash_, evicted_parent_;
  std::vector<TokenId> evicted_tokens_;
  std::vector<GroupId> evicted_group_;  // hybrid models: each evicted block's group
  EvictionForwarder eviction_forwarder_{*this};

  // Per host slot: bumped whenever the slot is taken from the free queue (it is evicted and
  // receives other content). The tier's host epoch (TieredCacheHit::host_epoch): bumped when a
  // cached slot is evicted and by reset_prefix_cache(); 0 never names a state.
  std::vector<std::uint64_t> host_slot_epoch_;
  std::uint64_t host_epoch_ = 1;
  std::uint64_t check_seed_;  // random per tier: a hit's host_check names the tier it came from

  // In-flight transfers: a slab indexed by the id's low 32 bits, the generation in the high ones.
  std::vector<Transfer> transfers_;
  std::vector<std::uint32_t> free_transfers_;
  // Stores' content (copied when planned: the GPU block may be reused before the commit).
  std::vector<TokenId> transfer_tokens_;  // block_size per slab entry
  std::vector<BlockHash> transfer_hash_, transfer_parent_;
  std::vector<std::uint8_t> transfer_first_;
  std::vector<SharedExtraKeys> transfer_extra_;  // per slab entry; null: none
  std::size_t num_live_ = 0;
  std::int32_t host_storing_ = 0;

  using RequestMap = std::unordered_map<RequestId, RequestState>;
  RequestMap requests_;
  SpareNodes<RequestMap, 16> spare_requests_;  // released entries, reused (no node to allocate)
  void release_state(RequestMap::iterator it) noexcept;  // erases it, keeping the node spare
  // allocate_slots' checks for one group and hybrid alike (kInvalidState while the request's
  // loads are unfinished, kInvalidArgument when the hit's host tokens are not its slots' count);
  // returns the request's state entry, end() when it has none.
  RequestMap::iterator checked_allocation_state(const Request& request, const TieredCacheHit& hit);
  // Below the host tier: pins per host slot (pin_host_slot) and the hooks.
  std::vector<std::uint32_t> host_pins_;
  std::int32_t num_host_pins_ = 0;
  HostTierHooks hooks_;
  TierStats stats_;
  std::vector<TierGroupStats> group_stats_;  // one per group
  // Hybrid models (several groups): per group its window in blocks (kFullGroup: full attention),
  // block bytes, and per GPU block whether WindowStoreRule::kRequestTail stores it (write-back).
  bool hybrid_ = false;
  std::vector<std::size_t> window_blocks_;
  std::vector<std::uint64_t> group_bytes_;
  std::vector<std::uint8_t> gpu_tail_;
  bool dropping_ = false;  // finish_loads drops unloaded window blocks: on_evict ignores them
  std::uint64_t host_cached_ever_ = 0;  // stores cached; minus host evictions = cached now

  // Events.
  std::uint64_t next_event_seq_ = 0;
  std::vector<KVEvent> events_;
  KVEventSink sink_;

  // Scratch (no allocation in steady state).
  std::vector<BlockId> slot_scratch_;
  std::vector<BlockId> found_slots_;                    // get_computed_blocks: the host run
  std::vector<std::vector<BlockHash>> coarse_scratch_;  // hybrid get_computed_blocks: per group
  std::vector<TokenId> content_tokens_;
  TierPlan copies_;  // allocate_slots, finish_loads: the evictions and stores planned (no loads)
  BlockHash content_hashes_[2];
  std::vector<MultiModalKey> mm_scratch_;
  // The batch commit's hook calls (slot; 0: on_loaded, 1: on_cached by a store, 2: by a fill).
  std::vector<std::pair<BlockId, std::uint8_t>> hook_scratch_;
};

}  // namespace pagedkv
