// pagedkv/pool/block_pool.hpp: the physical blocks, their reference counts, the LRU free queue and
// the hash -> block map. The pool knows blocks and hashes, never requests (docs/semantics.md).
//
// Semantics follow vLLM's v1 BlockPool (newest upstream):
//  - get_new_blocks(n) pops n blocks from the free queue's head; a popped block that still carries
//    a hash is evicted then (lazy LRU: freed cached blocks stay hit-able until reallocated).
//  - touch() takes hit blocks: a block with ref 0 leaves the free queue; ref += 1.
//  - free_blocks() receives a request's blocks tail first. Blocks reaching ref 0 are queued:
//    unhashed ones at the head as a group in the given order (reused first), hashed ones at the
//    tail in the given order (kept longest), so a chain's tail is evicted before its head.
//  - The map allows duplicates and returns the first inserted block for a hash.
//  - Retention (retention.hpp, docs/retention.md): blocks carry a priority 0..100 (default 35);
//    a free cached block is evicted only once no free cached block of a lower priority is left,
//    and free uncached blocks go first of all. Within a priority, config().eviction_policy picks
//    (LRU: the order above). An LRU pool without retention keeps exactly the code path and order
//    above; a pool with a non-LRU policy, or after its first non-default set_retention(), keeps
//    its free blocks in the retention lists instead (src/pool/block_pool_retention.cpp).
//
// Collision safety (on by default, always on for xxh3_128): a cached block stores its key
// material - its tokens, its extra keys and the identity of its parent's prefix - and a lookup
// only accepts a block whose material equals the request's, so a hash collision is a miss,
// never a wrong hit. A prefix identity is a function of content only, so it survives eviction
// and re-caching. With collision-resistant chain hashes (config chain_hashes_identify_prefix:
// the SHA-256 schemes) a prefix's identity is its chained hash, stored per block with the
// tokens. Otherwise (xxh3_128, test hashers) material is hash-consed: the pool keeps a table of
// content ids, one per distinct (parent content id, block size, tokens, extra keys), so two
// prefixes have equal ids iff their whole content is equal, and a parent check is one integer
// compare (no per-block SHA-256). A content id lives as long as a cached block holds that prefix or
// a live id names it as its parent, so it survives eviction and re-caching: a child stays a hit
// after its parent's content was evicted and cached again in another block (as in vLLM). The table
// starts with one id per block and grows geometrically (inside prepare_store; a failed growth
// changes nothing) when live ids exceed it: ids held by pending stores before the blocks they
// replace are evicted, and ancestors of cached blocks that were evicted first. Its bucket is the
// block's chain hash, so one pool must be fed sequences hashed by one hasher (a second hasher
// would only cause misses, never wrong hits).
// Guarded chain hashes (config guard_chain_hashes; KVCacheManager's choice for xxh3_128 with
// full-attention groups) store the material as the SHA-256 pools do and make the chained hash
// an exact identity by keeping one content per (hash, group): every record of a key (a cached
// block, or an orphan: a parent evicted while cached blocks still name it) holds the same
// tokens, extra keys and parent hash, so by induction from block 0 equal hashes mean equal
// prefixes, and a store that would break that is not cached from its first conflicting block
// on (the first content wins; the later one is a miss, never a wrong hit). Each cached block
// links to its parent's record and counts the records linking to it; a block evicted with
// children becomes an orphan (at most one per key), freed with its last child. Orphans are
// rare in full attention, where a chain's tail is evicted before its head. Lookups that start
// after a prefix nobody verified (window anchors, runs after another tier's prefix) would
// trust a bare hash, so they throw.
//
// Errors: every misuse (ids out of range, a block freed twice or twice in one call, a block
// repeated in cache_full_blocks, caching an already cached block, bad counts, sizes that would
// overflow) throws pagedkv::Error before any state changes. Running out of free blocks is a
// normal result (get_new_blocks returns false), never an error.
// Exception safety: every mutating call has the strong guarantee, std::bad_alloc included: all
// that may throw (validation, allocation, building events) happens before the first change, so
// a call either completes or leaves the pool exactly as it was.
// Events: produced as the state changes, delivered (to the sink, or to the take_events() buffer)
// only once the call has completed and the pool is consistent; see kv_events.hpp.
// Eviction observer (set_eviction_observer): called inside get_new_blocks() / evict_blocks() for
// each evicted block while its record and material are whole; noexcept, reads only.
// Complexity: O(1) per block for every operation, O(block_size) per verified hit; a store whose
// parent is not a known cached block (prefix_row) also visits the blocks before it (content ids:
// table lookups; guarded chain hashes: records found or made).
// Thread safety: mutating calls need exclusive access (one scheduler thread). Const calls only
// read (no mutable scratch), so any number of threads may call them at once while no mutating
// call runs. No allocation per block on the hot path (scratch vectors are sized at
// construction).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "pagedkv/hash/block_sequence.hpp"
#include "pagedkv/pool/block_hash_map.hpp"
#include "pagedkv/pool/eviction_policy.hpp"
#include "pagedkv/pool/free_block_queue.hpp"
#include "pagedkv/pool/kv_cache_block.hpp"
#include "pagedkv/pool/kv_events.hpp"
#include "pagedkv/pool/retention.hpp"
#include "pagedkv/pool/table_allocator.hpp"

namespace pagedkv {

struct BlockPoolConfig {
  std::int32_t num_blocks = 0;    // total, including the null block; >= 2
  std::uint32_t block_size = 16;  // tokens per block; >= 1
  bool enable_caching = true;     // false: no hashing, no map, blocks are never cached
  bool verify_cache_hits = true;  // store key material and compare it on every hit
  bool enable_kv_events = false;  // produce KVEvents (see kv_events.hpp)
  // True only when block hashes are collision resistant (SHA-256 schemes, never a test
  // hasher): a parent's chained hash then identifies its whole prefix. False (the safe default)
  // makes the pool keep hash-consed content ids of the cached prefixes.
  bool chain_hashes_identify_prefix = false;
  // With verify_cache_hits and without chain_hashes_identify_prefix: guarded chain hashes. The
  // pool identifies prefixes by their chained hashes as the SHA-256 schemes do (each cached block
  // stores its tokens and parent hash; a hit compares them, no content-id table) and keeps that
  // exact by holding one content per (hash, group): a store whose block hash already names other
  // content in this pool is not cached from that block on (the first content wins; the later one
  // misses, never hits wrongly), and a prefix that cached blocks name as their parent keeps a
  // record (an orphan) after its own block is evicted. For a well-distributed hash such as
  // xxh3_128, where only an adversary makes collisions; a degenerate test hasher would refuse
  // most stores. A left-to-right match from block 0 is verified exactly; lookups that start
  // after an unverified prefix (cached_after_prefix, match_cached_block_after and
  // match_cached_run_after past block 0) throw kInvalidState: sliding-window managers keep
  // content ids.
  bool guard_chain_hashes = false;
  // Which free cached block is evicted first within one retention priority
  // (eviction_policy.hpp). kLru keeps the pool's historical code path and order exactly.
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;
  // kLineage only: the depth (blocks) of the block whose hash keys a lineage, 0 ..
  // kMaxLineageKeyDepth; it must reach past the head that the workload's prompts share
  // (eviction_policy.hpp). With lineage_adaptive_depth the pool learns the depth from the chains
  // it stores (LineageDepthLearner) and uses lineage_key_depth until it has learned one.
  std::size_t lineage_key_depth = kLineageKeyDepth;
  bool lineage_adaptive_depth = false;
  // kAdaptive only: the ghosts track 1 in 2^s fingerprints, s = this value (0 ..
  // kAdaptiveGhostMaxSampleShift; 0: every one), or -1: chosen by the pool's size
  // (adaptive_ghost_sample_shift() in eviction_policy.hpp).
  int adaptive_ghost_sample_shift = -1;
  // Pin budget: the share of usable blocks (num_blocks - 1) that may be above the default
  // retention priority at once, 0..1 (rounded down to whole blocks). Past it, set_retention()
  // leaves a block at the default and counts a budget refusal. 0.5: retention can never take
  // more than half the pool from default traffic, and half a pool is far above any shared
  // prefix an engine pins (a 10,800-token system prompt is 2% of a 32,001-block pool).
  double max_retained_fraction = 0.5;
  // The monotonic tick that retention durations are measured on (retention.hpp); called by the
  // pool only inside set_retention(), retention(), and (while some block's priority has a
  // duration) touch(), get_new_blocks() and the frees. Empty: durations are refused
  // (set_retention() with a duration throws). Must not throw.
  RetentionClock retention_clock;
};

// Everything observable about a pool's state, for tests: equal snapshots mean equal pools.
struct BlockPoolSnapshot {
  std::vector<std::int32_t> ref_cnts;
  std::vector<BlockHash> block_hashes;
  std::vector<GroupId> group_ids;
  std::vector<BlockId> free_queue;      // head first
  std::vector<BlockId> hash_map_slots;  // raw table, so entry order is compared too
  // Stored key material (verify_cache_hits): per block its tokens, extra keys, parent-prefix
  // identity and own-prefix identity (uncached blocks show zeros and empty values). Identities
  // are shown as SHA-256 chains over the material (independent of the internal id numbering).
  std::vector<TokenId> block_tokens;
  std::vector<std::string> extra_keys;  // canonical encoding (encode_extra_keys)
  std::vector<BlockHash> parent_identities;
  std::vector<BlockHash> identities;
  // Guarded chain hashes: per block its child count, and the orphan records as
  // "hash/group/children" in hash order.
  std::vector<std::uint32_t> children;
  std::vector<std::string> orphans;
  std::uint64_t next_event_seq = 0;
  std::size_t pending_events = 0;
  std::uint64_t num_evictions = 0;
  // Pools that keep retention state (a non-LRU policy, or an LRU pool after a non-default
  // set_retention()); empty otherwise. Per block its retention and the policy's hit count; the
  // free blocks' lists, each head first: list 0 the uncached blocks, then priority p's segment g
  // at 1 + p * kEvictionSegments + g (LRU: 0; SLRU: 0 probation, 1 protected; S3-FIFO: 0 small,
  // 1 main; lineage: rank g's blocks not hit, kLineageRanks the protected ones;
  // eviction_policy.hpp). Only up to the last non-empty list: one at or past the end is empty
  // (equal pools still give equal snapshots, and a snapshot does not hold a vector for each of the
  // 6,566 lists).
  static constexpr std::size_t kEvictionSegments = 65;
  std::vector<BlockRetention> retention;
  std::vector<std::uint8_t> policy_hits;
  std::vector<std::vector<BlockId>> eviction_lists;
  RetentionStats retention_stats;

  bool operator==(const BlockPoolSnapshot&) const = default;
};

class BlockPool {
 public:
  static constexpr BlockId kNoBlock = -1;

  explicit BlockPool(const BlockPoolConfig& config);
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;  // the queue and the map point into the block array
  BlockPool& operator=(const BlockPool&) = delete;

  const BlockPoolConfig& config() const noexcept { return config_; }
  std::int32_t num_blocks() const noexcept { return config_.num_blocks; }
  std::uint32_t block_size() const noexcept { return config_.block_size; }
  std::int32_t num_free_blocks() const noexcept { return free_queue_.size() + ret_free_; }
  // 1 - free / (num_blocks - 1): the share of usable blocks that are in use.
  double usage() const noexcept;
  // Cached blocks evicted so far (reallocated while hashed, or evict_blocks()).
  std::uint64_t num_evictions() const noexcept { return num_evictions_; }

  // Throws kOutOfRange on an id out of range. Inline: managers call it per block.
  const KVCacheBlock& block(BlockId id) const {
    if (static_cast<std::uint32_t>(id) >= static_cast<std::uint32_t>(config_.num_blocks))
        [[unlikely]] {
      throw_out_of_range(id);
    }
    return blocks_[static_cast<std::size_t>(id)];
  }
  const KVCacheBlock& null_block() const noexcept { return blocks_[kNullBlockId]; }
  // The LRU free queue. Empty once the pool keeps retention state (retention_active()): the
  // free blocks then live in the retention lists (snapshot().eviction_lists).
  const FreeBlockQueue& free_queue() const noexcept { return free_queue_; }

  // Pops n blocks from the free queue's head (evicting cached ones), sets ref = 1 and appends
  // their ids to `out`. Returns false and changes nothing when n > num_free_blocks().
  bool get_new_blocks(std::int32_t n, std::vector<BlockId>& out);

  // Hit blocks gain one holder; a block with ref 0 leaves the free queue. The null block is
  // skipped.
  void touch(std::span<const BlockId> ids);

  // Drops one holder from each block, given tail first (see the file comment for queue order).
  // The null block is skipped. Errors: an id out of range, a block with ref 0, an id twice.
  void free_blocks(std::span<const BlockId> ordered);
  // free_blocks() of `blocks` reversed (a request's block table, tail first), without a copy.
  void free_blocks_reversed(std::span<const BlockId> blocks);
  // free_blocks({id}), inline (a tier unpins one host slot per committed transfer). Errors as
  // free_blocks(): an id out of range, a block with ref 0.
  void free_block(BlockId id) {
    (void)block(id);  // throws kOutOfRange
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.is_null) return;
    if (b.ref_cnt <= 0) [[unlikely]] {
      throw_double_free(id);
    }
    if (--b.ref_cnt == 0) {
      if (ret_ != nullptr) [[unlikely]] {
        ret_release_one(id);
        return;
      }
      if (b.is_cached()) {
        free_queue_.append(id);
      } else {
        free_queue_.prepend(id);
      }
    }
  }

  // touch({id}) then free_blocks({id}) in one call, for a holder that releases at once: a free
  // block (ref 0) moves to the queue's tail if cached (its LRU refresh), to the head if not; a
  // held block and the null block stay as they are. Errors: an id out of range.
  void requeue(BlockId id) {
    const KVCacheBlock& b = block(id);
    if (b.is_null || b.ref_cnt != 0) return;  // touch + free leave a held block as it was
    if (ret_ != nullptr) [[unlikely]] {
      ret_requeue(id);
      return;
    }
    if (b.is_cached()) {
      if (free_queue_.back() == id) return;  // already the most recently used
      free_queue_.remove(id);
      free_queue_.append(id);
    } else {
      if (free_queue_.front() == id) return;
      free_queue_.remove(id);
      free_queue_.prepend(id);
    }
  }

  // Caches blocks[num_cached_blocks .. num_full_blocks) of `seq` (its block i lives in physical
  // block blocks[i]); emits one BlockStored. Errors: counts beyond blocks or seq's full blocks,
  // a block already cached, not allocated or repeated in that range, the null block there.
  void cache_full_blocks(const BlockSequence& seq, std::span<const BlockId> blocks,
                         std::size_t num_cached_blocks, std::size_t num_full_blocks,
                         GroupId group = 0);

  // cache_full_blocks() in two halves, for managers that compose several pool calls into one
  // step with the strong guarantee. prepare_store() does everything that may throw (validation
  // of `seq` and the range, identities, interned extra keys, the BlockStored event) and changes
  // nothing observable. `prefix_row` holds the physical blocks of seq's blocks
  // [first - prefix_row.size(), first) as far as known (any id that is not a cached block, e.g.
  // kNoBlock or the null block, or a block caching other content, means unknown); the parent
  // prefix's identity comes from the nearest cached one, or is computed from seq's material.
  // commit_store() then caches `blocks` (one per block of the range; validated first, before any
  // change) and cannot fail for valid blocks. A PendingStore that is never committed releases
  // what it holds. Use it within one step: no PendingStore may outlive its pool. One prepared
  // before a successful reset_prefix_cache() is stale: its commit throws kInvalidState, and
  // dropping it releases nothing (the reset dropped every reference).
  class PendingStore {
   public:
    PendingStore() = default;
    PendingStore(PendingStore&& other) noexcept;
    PendingStore& operator=(PendingStore&& other) noexcept;
    ~PendingStore();
    std::size_t size() const noexcept { return last_ - first_; }

   private:
    friend class BlockPool;
    void release() noexcept;
    BlockPool* pool_ = nullptr;  // null: empty or committed
    std::uint64_t resets_ = 0;   // pool_'s resets_ when prepared (stale once they differ)
    BlockSequence seq_;
    std::size_t first_ = 0, last_ = 0;
    GroupId group_ = 0;
    // One per block, each holding a reference: a content id (own identities) or an extra-key
    // id (chain_hashes_identify_prefix).
    std::vector<std::uint32_t> content_ids_;
    std::optional<KVEvent> event_;  // BlockStored, when events are on
    // Guarded chain hashes: the reference on the parent prefix's record (see Guard) the first
    // block will take over, held while parent_held_; refused_: a record of the store's prefix
    // holds other content, so nothing is cached.
    BlockId parent_link_ = -1;
    std::uint32_t parent_gen_ = 0;
    bool parent_held_ = false;
    bool refused_ = false;
  };
  PendingStore prepare_store(const BlockSequence& seq, std::size_t first, std::size_t last,
                             std::span<const BlockId> prefix_row, GroupId group = 0);
  void commit_store(PendingStore&& store, std::span<const BlockId> blocks);

  // Ensures the next `removals` evictions and `others` other events can be recorded without
  // allocating (managers call it before composing several pool calls). May throw bad_alloc;
  // changes nothing observable.
  void reserve_events(std::size_t removals, std::size_t others);
  // Ensures the next `evictions` evictions (through get_new_blocks, in one or several calls) and
  // `other_events` other events need no allocation: room for their events when events are on,
  // and for the records an eviction leaves behind under guarded chain hashes (a manager calls it
  // in its prepare phase before composing several get_new_blocks calls). May throw bad_alloc;
  // changes nothing observable.
  void reserve_evictions(std::size_t evictions, std::size_t other_events);

  // While a hold is alive, events are buffered and not delivered to the sink; its destruction
  // delivers them (a manager holds delivery until its own state is consistent).
  class EventDeliveryHold {
   public:
    explicit EventDeliveryHold(BlockPool& pool) noexcept : pool_(pool) { ++pool_.delivery_holds_; }
    ~EventDeliveryHold() {
      if (--pool_.delivery_holds_ == 0 && !pool_.events_.empty()) pool_.deliver_events();
    }
    EventDeliveryHold(const EventDeliveryHold&) = delete;
    EventDeliveryHold& operator=(const EventDeliveryHold&) = delete;

   private:
    BlockPool& pool_;
  };

  // vLLM's lookup: the first inserted block cached under (hash, group), or kNoBlock. It does
  // not verify key material; KV-cache managers use match_cached_block().
  BlockId get_cached_block(const BlockHash& hash, GroupId group = 0) const noexcept;

  // A hint: starts loading what a lookup of (hash, group) will read. Managers issue it a few
  // blocks ahead of match_cached_block() so that the table's cache misses overlap.
  void prefetch_cached_block(const BlockHash& hash, GroupId group = 0) const noexcept;

  // Reusable buffers for verified lookups of blocks with extra keys. Optional: without one a
  // lookup builds its own (an allocation for long extra keys). One per thread.
  struct LookupScratch {
    std::string extra;
    std::vector<MultiModalKey> mm;
  };

  // Verified lookup of seq's block `index`: the first inserted cached block with its hash whose
  // stored material equals seq's (tokens, extra keys, and - for index > 0 - the identity of the
  // prefix held by `parent`, the block that matched index - 1). kNoBlock on a miss. Without
  // verify_cache_hits, the same as get_cached_block().
  BlockId match_cached_block(const BlockSequence& seq, std::size_t index, BlockId parent,
                             GroupId group = 0, LookupScratch* scratch = nullptr) const;

  // Sliding-window lookups search right to left, before the block's left neighbour is known:
  // the same as match_cached_block() without the parent check. Callers verify the chain inside a
  // run of hits with same_content_chain().
  BlockId match_cached_block_unanchored(const BlockSequence& seq, std::size_t index,
                                        GroupId group = 0, LookupScratch* scratch = nullptr) const;
  // Verified lookup of seq's block `index` whose stored parent is seq's own block index - 1 (by
  // its chained hash; the root for index 0): match_cached_block()'s parent check without the
  // parent's block, for a pool that holds a run of a chain whose earlier blocks live elsewhere
  // (a host tier). Needs chain_hashes_identify_prefix when verifying (else kInvalidState);
  // without verify_cache_hits, the same as get_cached_block(). Errors as match_cached_block().
  BlockId match_cached_block_after(const BlockSequence& seq, std::size_t index, GroupId group = 0,
                                   LookupScratch* scratch = nullptr) const;
  // match_cached_block_after() for seq's blocks [begin, end) in order, stopping at the first
  // miss: appends the matched blocks to `out` and returns how many matched. One call per run:
  // the sequence is checked once and the table's misses of the blocks ahead overlap. Errors as
  // match_cached_block_after() (for block end - 1), and bad_alloc from growing `out`; on any
  // error nothing is appended. O(end - begin) lookups.
  std::size_t match_cached_run_after(const BlockSequence& seq, std::size_t begin, std::size_t end,
                                     std::vector<BlockId>& out, GroupId group = 0,
                                     LookupScratch* scratch = nullptr) const;
  // Whether `child` was cached as the successor of the prefix `parent` holds (true without
  // verify_cache_hits). Both must be cached (else the answer is unspecified: the sliding-window
  // search calls it per block, so only what memory safety needs is checked). Errors: an id out
  // of range (kOutOfRange).
  bool same_content_chain(BlockId parent, BlockId child) const;
  // Whether cached block `child` was cached right after exactly seq's blocks [0, index): its
  // stored parent identity equals the identity of that prefix (the root for index 0), so a
  // window run starting with `child` at `index` is anchored to the request's own prefix. True
  // without verify_cache_hits. `anchor`, unless kNoBlock, is a cached block the caller verified
  // to hold exactly seq's blocks [0, anchor_end) (the last block of a verified left-to-right
  // match); the blocks after it are looked up from seq's material. Cost: O(1) with
  // chain_hashes_identify_prefix (the identity is seq's hash of block index - 1), else
  // O(index - anchor_end) content-table lookups (no allocation with `scratch`). Errors: `child`
  // or `anchor` out of range or not cached, anchor_end > index, index beyond seq's blocks.
  bool cached_after_prefix(BlockId child, const BlockSequence& seq, std::size_t index,
                           BlockId anchor = kNoBlock, std::size_t anchor_end = 0,
                           LookupScratch* scratch = nullptr) const;

  // Drops the cache entries of these blocks (they stay allocated or queued where they are).
  // Returns how many were cached. Errors: an id out of range (nothing evicted).
  std::size_t evict_blocks(std::span<const BlockId> ids);

  // Told of every eviction (get_new_blocks(), evict_blocks()) while the evicted block is still
  // whole: block(id) still carries its hash and group, and stored_parent_hash(id) /
  // stored_tokens(id) its material. A tier below the pool copies what it needs then (the block
  // may receive new content later in the same manager call). on_evict must not throw, and may
  // call only the pool's const members; the pool is mid-call, so it may read nothing but block
  // id's record, material and retention(id) (the victim's priority, before it falls back to the
  // default). One observer at a time (nullptr: none); the pool does not own it.
  class EvictionObserver {
   public:
    virtual void on_evict(const BlockPool& pool, BlockId id) noexcept = 0;

   protected:
    ~EvictionObserver() = default;
  };
  void set_eviction_observer(EvictionObserver* observer) noexcept { observer_ = observer; }

  // Whether cached blocks keep their material readable below (verify_cache_hits with chain-hash
  // identities: chain_hashes_identify_prefix or guard_chain_hashes).
  bool stores_chain_material() const noexcept { return chain_identity_; }
  // A cached block's stored material, when stores_chain_material(): the parent's chained hash
  // (empty for a chain's block 0) and block_size() tokens. Unspecified (stale) for a block not
  // cached (except inside on_evict for the evicted one). Errors: an id out of range
  // (kOutOfRange), a pool that does not store chain material (kInvalidState).
  BlockHash stored_parent_hash(BlockId id) const {
    check_material_read(id);
    return stored_parent(static_cast<std::size_t>(id));
  }
  const TokenId* stored_tokens(BlockId id) const {
    check_material_read(id);
    return &block_tokens_[static_cast<std::size_t>(id) * config_.block_size];
  }

  // ---- Retention priorities (retention.hpp, docs/retention.md) ----
  // Asks for `priority` on blocks `ids` (the null block is skipped), optionally for `duration`
  // ticks of config().retention_clock after which the block falls back to the default priority
  // unless hit; each hit (touch(), requeue()) renews it to hit tick + duration. A block's
  // priority is the highest non-default priority asked for it (the default if none): an ask for
  // a lower priority than the block holds changes nothing, an equal one extends the expiry to
  // the later of the two, an ask for the default priority changes nothing. Raising a block above
  // the default takes one block of the pin budget (config().max_retained_fraction); with the
  // budget full the block stays where it was and budget_refusals counts it. A block's retention
  // ends (back to the default, budget returned) when its priority expires, when its cached
  // content is evicted, when it reaches ref 0 uncached, or when get_new_blocks() hands it out.
  // A free block whose priority changes moves to its new priority's most recently used end.
  // The first ask for a non-default priority in an LRU pool makes it keep retention state: one
  // O(free blocks) move of the free queue into the retention lists, in the same order, and
  // 28 bytes per block more (it may throw bad_alloc then, changing nothing).
  // Errors (nothing changes): an id out of range, priority > kMaxRetentionPriority, a duration
  // <= 0, a duration without a retention_clock.
  // Complexity: O(ids.size()), plus that one move.
  void set_retention(std::span<const BlockId> ids, RetentionPriority priority,
                     RetentionTick duration = kNoExpiry);
  // Lifts blocks `ids` that are below the default priority (an expired priority is the default
  // already) to the default priority, with no expiry: what a request that asks the default for a
  // block it shares means (set_retention() treats an ask for the default as no ask). Blocks at or
  // above the default, the null block and free uncached blocks are left as they are; a free
  // block that moves goes to the default priority's most recently used end. Changes nothing
  // when no block is below the default (no retention state, or none asked below it).
  // Errors (nothing changes): an id out of range. Complexity: O(ids.size()).
  void raise_to_default(std::span<const BlockId> ids);
  // Block id's retention now (an expired priority reads as the default). Errors: out of range.
  BlockRetention retention(BlockId id) const;
  // Per-class counters (retention.hpp). O(1).
  RetentionStats retention_stats() const;
  // kLineage: the key depth that blocks cached now are ranked by (config().lineage_key_depth,
  // or the learned depth with lineage_adaptive_depth); other policies: config().lineage_key_depth.
  std::size_t lineage_key_depth() const noexcept;
  // kAdaptive: protected's target share of a level's free cached blocks now, in units of
  // 1 / kAdaptiveScale (0 .. kAdaptiveScale); other policies: -1. O(1).
  std::int64_t adaptive_protected_target() const noexcept;
  // kAdaptive: the sample shift s in use (the ghosts track 1 in 2^s fingerprints); other
  // policies: -1. O(1).
  int adaptive_ghost_sample_shift() const noexcept;
  // Whether the pool keeps retention state (a non-LRU policy, or retention asked for).
  bool retention_active() const noexcept { return ret_ != nullptr; }

  // Forgets every cached hash when no block but the null block is in use; returns false (and
  // does nothing) otherwise. Emits AllBlocksCleared on success.
  bool reset_prefix_cache();

  // KV events (when enabled): buffered until taken, or delivered to the sink if one is set.
  std::vector<KVEvent> take_events() noexcept;
  // With a sink, every completed call hands it all buffered events (older ones first).
  void set_event_sink(KVEventSink sink) noexcept;

  // Throws pagedkv::Error (kInvalidState) naming the first broken invariant: queue links,
  // queue membership iff ref 0, counts, map entries, content ids, extra-key references.
  void check_invariants() const;
  BlockPoolSnapshot snapshot() const;

  // Bytes of metadata this pool holds per block (block array, map slots, stored material).
  double metadata_bytes_per_block() const noexcept;

 private:
  struct ExtraKeyTable;  // interned extra-key encodings, reference counted (src/pool/*internal.hpp)
  struct ContentTable;   // hash-consed prefix content ids, reference counted (same file)
  struct OrphanTable;    // guarded chain hashes: records of evicted parents (same file)
  struct Retention;      // retention lists and priorities (block_pool_retention.cpp)

  // Guarded chain hashes, per block. A cached block is a record of its prefix; `link` names the
  // record of its parent prefix as it was when the block was cached: kRootLink (block 0), or a
  // block id that still holds it while that block's `gen` equals `link_gen`, else the orphan
  // filed under the block's parent hash and group. `children` counts the cached blocks, orphans
  // and pending stores whose link resolves to this block; a block evicted with children becomes
  // an orphan, so every named parent keeps a record. `gen` grows at each eviction.
  struct Guard {
    std::uint32_t children = 0;
    std::uint32_t gen = 0;
    BlockId link = -1;
    std::uint32_t link_gen = 0;
  };
  static constexpr BlockId kRootLink = -1;
  static constexpr BlockId kOrphanLink = -2;

  [[noreturn]] void throw_out_of_range(BlockId id) const;
  // stored_parent_hash() / stored_tokens()'s checks: the id in range, chain material stored.
  void check_material_read(BlockId id) const {
    (void)block(id);  // throws kOutOfRange
    if (!chain_identity_) [[unlikely]]
      throw_no_chain_material();
  }
  [[noreturn]] static void throw_no_chain_material();
  [[noreturn]] static void throw_double_free(BlockId id);
  bool verifying() const noexcept { return verifying_; }
  // The parent check of a lookup: none, the root (block 0), or the prefix a cached block holds.
  struct ParentCheck {
    // nullptr: no parent check. Else the chained hash of the parent prefix (the empty hash: the
    // root), which chain-hash identities compare with the stored parent hash.
    const BlockHash* hash = nullptr;
    // Content ids: the cached block holding the parent prefix; nullptr (with a hash): the root.
    const KVCacheBlock* block = nullptr;
  };
  BlockId match(const BlockSequence& seq, std::size_t index, GroupId group, ParentCheck parent,
                LookupScratch* scratch) const;
  // match_cached_run_after()'s scan for chain identities without extra keys (checked, reserved).
  std::size_t match_chain_run(const BlockSequence& seq, std::size_t begin, std::size_t end,
                              std::vector<BlockId>& out, GroupId group) const;
  // match() once seq is known to hold block `index` (hash and tokens) of a valid block size.
  // Defined (inline) in block_pool.cpp, its only user.
  inline BlockId match_checked(const BlockSequence& seq, std::size_t index, GroupId group,
                               ParentCheck parent, LookupScratch* scratch) const;
  // The content id of seq's block p whose parent prefix has content id `parent`, taking one
  // reference (creating the id, with a reference on `parent` and on its extra keys, when new).
  // May throw (extra-key interning) and then changes nothing; the table must have room.
  std::uint32_t acquire_content(std::uint32_t parent, const BlockSequence& seq, std::size_t p);
  // The content id of seq's block p under `parent` if it exists, else 0. No change.
  std::uint32_t find_content(std::uint32_t parent, const BlockSequence& seq, std::size_t p,
                             LookupScratch& scratch) const;
  void release_content(std::uint32_t id) noexcept;
  // Guarded chain hashes: drops one reference on the parent record a link names (an orphan
  // reaching no children is freed, dropping its own parent reference in turn).
  void release_parent(BlockId link, std::uint32_t link_gen, BlockHash parent_hash,
                      GroupId group) noexcept;
  // release_parent()'s first step: true when the link names the root or a block still holding
  // the record (one child fewer there), false when the record is an orphan.
  bool release_block_link(BlockId link, std::uint32_t link_gen) noexcept;
  // Drops the reference cached block id holds on its parent's record (its stored parent hash is
  // read only when that record is an orphan).
  void release_link(BlockId id) noexcept;
  // Evicts block id's record while it has children: into an orphan, or into the orphan of the
  // same content. The caller clears the children and advances the generation.
  void evict_guarded(BlockId id) noexcept;
  // Whether block i's (orphan idx's) stored material is the given extra-key id, parent hash and
  // bs tokens.
  bool stored_material_is(std::size_t i, const TokenId* tokens, std::uint32_t bs, std::uint32_t eid,
                          const BlockHash& parent) const noexcept;
  bool orphan_material_is(std::uint32_t idx, const TokenId* tokens, std::uint32_t bs,
                          std::uint32_t eid, const BlockHash& parent) const noexcept;
  // The parent hash stored with cached block i (kRootHash-like empty hash for block 0).
  BlockHash stored_parent(std::size_t i) const noexcept;
  // Whether a record of (hash, group) holds other material than seq's block p (tokens, extra-key
  // id eid, parent hash `parent`): then caching seq's block p would break one content per hash.
  bool conflicts(const BlockHash& hash, GroupId group, const BlockSequence& seq, std::size_t p,
                 std::uint32_t eid, const BlockHash& parent, BlockId* found = nullptr,
                 std::uint32_t* orphan = nullptr) const noexcept;
  // A guarded store's insert of block id (seq's block p, extra-key id eid) when an entry of
  // its probe run has the same tag: inserted (kEmpty) unless a cached block of the key holds
  // other material (returned; nothing changed). Out of line: the usual insert finds no tag.
  BlockId insert_guarded_slow(BlockId id, std::uint32_t tag, const BlockSequence& seq,
                              std::size_t p, std::uint32_t eid);
  // conflicts() against the orphans only (a store checks the cached blocks as it inserts).
  bool orphan_conflicts(const BlockSequence& seq, std::size_t p, std::uint32_t eid,
                        GroupId group) const noexcept;
  // prepare_store()'s parent reference for a guarded pool (see PendingStore).
  void acquire_guarded_parent(PendingStore& st, const BlockSequence& seq,
                              std::span<const BlockId> prefix_row);
  void check_guards(std::vector<std::uint32_t>& refs) const;
  void validate_sequence(const BlockSequence& seq, std::size_t last, const char* where) const;
  // validate_sequence() for the lookups, which run per block: a multiply and compares, calling
  // validate_sequence() (to throw) only when something is wrong.
  inline void check_sequence(const BlockSequence& seq, std::size_t last, const char* where) const;
  // Evicts cached block id; tag: its map tag (BlockHashMap::key_tag of its hash and group).
  void evict_cached(BlockId id, std::uint32_t tag) noexcept;
  void evict_cached(BlockId id) noexcept;
  // Starts loading what evicting block id will read; returns its map tag (0 if not cached).
  std::uint32_t prefetch_eviction(BlockId id) const noexcept;
  template <bool kReverse>
  void free_blocks_in(std::span<const BlockId> given);
  // free_blocks_in()'s change, after its checks (kMarked: every given block's ref count is
  // negated, as the checking pass leaves it) or without them.
  template <bool kReverse, bool kMarked>
  void release_in(std::span<const BlockId> given) noexcept;
  // free_blocks_reversed() of a block table that KVCacheManager built from this pool's
  // get_new_blocks() and touch(): every id is in range, held, and appears once (a hit naming a
  // block twice is dropped by get_computed_blocks), so nothing can be wrong and there is no
  // checking pass (one pass over the table instead of two; asserted in builds with assertions).
  // Only KVCacheManager calls it (its release of a request); everyone else frees through
  // free_blocks_reversed(), which checks.
  void release_table(std::span<const BlockId> table) noexcept;
  // commit_store() of blocks that KVCacheManager allocated for the store's range (in range,
  // held, uncached, distinct): no checking pass over their records. Errors as commit_store()'s
  // for the store itself (a count mismatch, another pool's store). Only KVCacheManager calls it.
  void commit_table_store(PendingStore&& store, std::span<const BlockId> blocks);
  template <bool kChecked, bool kGuarded>
  void commit_store_in(PendingStore&& store, std::span<const BlockId> blocks);
  friend class KVCacheManager;
  // Retention state paths (src/pool/block_pool_retention.cpp), taken when ret_ is set; the LRU
  // pool's paths test ret_ once per call and never enter them.
  void ret_enable();  // allocates and moves the LRU queue in; may throw, then changes nothing
  void ret_release_one(BlockId id) noexcept;  // a block reached ref 0
  void ret_requeue(BlockId id) noexcept;
  void ret_touch(std::span<const BlockId> ids) noexcept;  // ids validated
  // release_in() with retention state: the same two passes and order.
  void ret_release(std::span<const BlockId> given, bool reverse, bool marked) noexcept;
  bool ret_get_new_blocks(std::int32_t n, std::vector<BlockId>& out);
  // commit_store() cached blocks (chain's blocks first .. first + blocks.size() - 1).
  void ret_stored(std::span<const BlockHash> chain, std::size_t first,
                  std::span<const BlockId> blocks) noexcept;
  void ret_record_ghosts(std::span<const BlockId> victims) noexcept;  // adaptive: the ghosts
  void ret_after_evict(BlockId id) noexcept;  // evict_blocks() evicted block id
  void ret_reset() noexcept;                  // reset_prefix_cache() cleared every hash
  void ret_check(std::vector<char>& seen) const;
  void ret_snapshot(BlockPoolSnapshot& s) const;
  std::size_t ret_memory_bytes() const noexcept;
  // Evicts the cached ones of blocks `ids` (just taken from the retention lists) and sets every
  // one's ref count to 1, with get_new_blocks()'s look-ahead prefetches.
  void take_popped(std::span<const BlockId> ids) noexcept;
  void record(KVEvent::Data&& data) noexcept;
  void record_removed(const BlockHash& hash, GroupId group) noexcept;
  void deliver_events() noexcept;

  BlockPoolConfig config_;
  TableVector<KVCacheBlock> blocks_;  // blocks_[i].block_id == i; never resized
  FreeBlockQueue free_queue_;
  BlockHashMap hash_map_;
  std::uint64_t num_evictions_ = 0;
  std::uint64_t resets_ = 0;  // successful reset_prefix_cache() calls (PendingStore staleness)
  EvictionObserver* observer_ = nullptr;
  struct RetentionDeleter {
    void operator()(Retention* r) const noexcept;
  };
  std::unique_ptr<Retention, RetentionDeleter> ret_;  // null: the LRU queue alone
  std::int32_t ret_free_ = 0;                         // free blocks in ret_'s lists (0 without it)

  // Stored key material (only with verify_cache_hits). Own identities: each cached block names
  // its content id (KVCacheBlock::content_id); the table holds the material. Chain-hash
  // identities (chain_hashes_identify_prefix): per block its tokens (block_tokens_), its
  // parent's chained hash (stored_: 32 raw bytes, zero past the hash's size; both stale once
  // the block is evicted, never read then) and, in
  // KVCacheBlock::content_id, a material word: its interned extra keys' id in the low 30 bits
  // and the parent hash's size code above them (0: no parent, block 0; 1: 16 bytes; 2: 32).
  // 32 + 64 bytes per 16-token block, so that the map can have 4 slots per block within the
  // metadata bound (bench/results/pool_hash_speed.md, fifth pass).
  bool verifying_ = false;
  bool chain_identity_ = false;  // verifying with chain_hashes_identify_prefix or guarded
  bool guarded_ = false;         // verifying with guard_chain_hashes (chain_identity_ too)
  bool stream_tokens_ = false;   // block_tokens_ written with non-temporal stores (block_pool.cpp)
  std::unique_ptr<ContentTable> contents_;
  struct Stored {
    std::array<std::uint8_t, BlockHash::kMaxSize> parent{};  // the parent's chained hash
  };
  TableVector<Stored> stored_;         // per block (chain-hash identities)
  TableVector<TokenId> block_tokens_;  // block_size per block (chain-hash identities)
  std::unique_ptr<ExtraKeyTable> extra_keys_;
  TableVector<Guard> guards_;             // per block (guarded chain hashes)
  std::unique_ptr<OrphanTable> orphans_;  // guarded chain hashes

  // Events: recorded in events_ (capacity reserved before any change), delivered when no
  // EventDeliveryHold is alive.
  std::uint64_t next_event_seq_ = 0;
  std::vector<KVEvent> events_;
  std::vector<KVEvent> removed_shells_;  // prebuilt BlockRemoved events (1 hash each)
  KVEventSink sink_;
  int delivery_holds_ = 0;

  // Reused scratch (no allocation in steady state).
  LookupScratch store_scratch_;  // mutating calls only
  // The id list of the last committed store, kept for the next prepare_store (a store of one
  // block, as a host tier's, then allocates nothing).
  std::vector<std::uint32_t> spare_content_ids_;
  // Guarded chain hashes: the extra-key ids of a store's record walk (acquire_guarded_parent).
  std::vector<std::uint32_t> walk_eids_;
};

}  // namespace pagedkv
