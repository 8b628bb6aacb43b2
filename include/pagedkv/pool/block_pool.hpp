// pagedkv/pool/block_pool.hpp: the physical blocks, their reference counts, the LRU free queue and the
// hash -> block map. The pool knows blocks and hashes, never requests (DESIGN.md section 3).
//
// Semantics follow vLLM's v1 BlockPool (newest upstream):
//  - get_new_blocks(n) pops n blocks from the free queue's head; a popped block that still carries
//    a hash is evicted then (lazy LRU: freed cached blocks stay hit-able until reallocated).
//  - touch() takes hit blocks: a block with ref 0 leaves the free queue; ref += 1.
//  - free_blocks() receives a request's blocks tail first. Blocks reaching ref 0 are queued:
//    unhashed ones at the head as a group in the given order (reused first), hashed ones at the
//    tail in the given order (kept longest), so a chain's tail is evicted before its head.
//  - The map allows duplicates and returns the first inserted block for a hash.
//
// Collision safety (on by default, always on for xxh3_128): a cached block stores its key
// material (its tokens, its extra keys, and the identity of its parent's content) and a lookup
// only accepts a block whose material equals the request's, so a hash collision is a miss,
// never a wrong hit. Content identity is hash-consed: blocks cached with equal material share a
// content id, so duplicates of a block are interchangeable parents.
//
// Errors: every misuse (ids out of range, a block freed twice or twice in one call, caching an
// already cached block, bad counts) throws pagedkv::Error before any state changes. Running out of
// free blocks is a normal result (get_new_blocks returns false), never an error.
// Complexity: O(1) per block for every operation, O(block_size) per verified hit.
// Thread-compatible: one pool is used by one scheduler thread. No allocation per block on the hot
// path (scratch vectors are reused; the hash map and material arrays are sized at construction).
#pragma once

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
#include "pagedkv/pool/free_block_queue.hpp"
#include "pagedkv/pool/kv_cache_block.hpp"
#include "pagedkv/pool/kv_events.hpp"

namespace pagedkv {

struct BlockPoolConfig {
  std::int32_t num_blocks = 0;    // total, including the null block; >= 2
  std::uint32_t block_size = 16;  // tokens per block; >= 1
  bool enable_caching = true;     // false: no hashing, no map, blocks are never cached
  bool verify_cache_hits = true;  // store key material and compare it on every hit
  bool enable_kv_events = false;  // produce KVEvents (see kv_events.hpp)
};

// Everything observable about a pool's state, for tests: equal snapshots mean equal pools.
struct BlockPoolSnapshot {
  std::vector<std::int32_t> ref_cnts;
  std::vector<BlockHash> block_hashes;
  std::vector<GroupId> group_ids;
  std::vector<BlockId> free_queue;      // head first
  std::vector<BlockId> hash_map_slots;  // raw table, so entry order is compared too
  std::vector<std::uint64_t> content_ids;
  std::uint64_t next_event_seq = 0;
  std::size_t pending_events = 0;
  std::uint64_t num_evictions = 0;

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
  std::int32_t num_free_blocks() const noexcept { return free_queue_.size(); }
  // 1 - free / (num_blocks - 1): the share of usable blocks that are in use.
  double usage() const noexcept;
  // Cached blocks evicted so far (reallocated while hashed, or evict_blocks()).
  std::uint64_t num_evictions() const noexcept { return num_evictions_; }

  const KVCacheBlock& block(BlockId id) const;  // throws on an id out of range
  const KVCacheBlock& null_block() const noexcept { return blocks_[kNullBlockId]; }
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

  // Caches blocks[num_cached_blocks .. num_full_blocks) of `seq` (its block i lives in physical
  // block blocks[i]); emits one BlockStored. Errors: counts beyond blocks or seq's full blocks,
  // a block already cached, the null block in that range.
  void cache_full_blocks(const BlockSequence& seq, std::span<const BlockId> blocks,
                         std::size_t num_cached_blocks, std::size_t num_full_blocks,
                         GroupId group = 0);

  // vLLM's lookup: the first inserted block cached under (hash, group), or kNoBlock. It does
  // not verify key material; KV-cache managers use match_cached_block().
  BlockId get_cached_block(const BlockHash& hash, GroupId group = 0) const noexcept;

  // A hint: starts loading what a lookup of (hash, group) will read. Managers issue it a few
  // blocks ahead of match_cached_block() so that the table's cache misses overlap.
  void prefetch_cached_block(const BlockHash& hash, GroupId group = 0) const noexcept;

  // Verified lookup of seq's block `index`: the first inserted cached block with its hash whose
  // stored material equals seq's (tokens, extra keys, and - for index > 0 - a parent with the
  // same content as `parent`, the block that matched index - 1). kNoBlock on a miss. Without
  // verify_cache_hits, the same as get_cached_block().
  BlockId match_cached_block(const BlockSequence& seq, std::size_t index, BlockId parent,
                             GroupId group = 0) const;

  // Sliding-window lookups search right to left, before the block's left neighbour is known:
  // the same as match_cached_block() without the parent check. Callers verify the chain inside a
  // run of hits with same_content_chain().
  BlockId match_cached_block_unanchored(const BlockSequence& seq, std::size_t index,
                                        GroupId group = 0) const;
  // Whether `child` was cached as the successor of content equal to `parent`'s (true without
  // verify_cache_hits). Both must be cached.
  bool same_content_chain(BlockId parent, BlockId child) const noexcept;

  // Drops the cache entries of these blocks (they stay allocated or queued where they are).
  // Returns how many were cached. Errors: an id out of range (nothing evicted).
  std::size_t evict_blocks(std::span<const BlockId> ids);

  // Forgets every cached hash when no block but the null block is in use; returns false (and
  // does nothing) otherwise. Emits AllBlocksCleared on success.
  bool reset_prefix_cache();

  // KV events (when enabled): buffered until taken, or delivered to the sink if one is set.
  std::vector<KVEvent> take_events();
  void set_event_sink(KVEventSink sink);

  // Throws pagedkv::Error (kInvalidState) naming the first broken invariant: queue links,
  // queue membership iff ref 0, counts, map entries, content ids, extra-key references.
  void check_invariants() const;
  BlockPoolSnapshot snapshot() const;

  // Bytes of metadata this pool holds per block (block array, map slots, stored material).
  double metadata_bytes_per_block() const noexcept;

 private:
  struct ExtraKeyTable;  // interned extra-key encodings with reference counts (block_pool.cpp)

  struct Material {
    std::uint64_t content_id = 0;         // 0 when not cached; shared by equal-content blocks
    std::uint64_t parent_content_id = 0;  // 0 for block 0 of a chain; kOrphan if unknown
    std::uint32_t extra_id = 0;           // interned extra keys; 0 when none
  };

  bool verifying() const noexcept { return !material_.empty(); }
  // parent_content_id: the required parent content, or std::nullopt to skip that check.
  bool material_matches(BlockId candidate, std::optional<std::uint64_t> parent_content_id,
                        std::uint32_t extra_id, const TokenId* tokens,
                        std::uint32_t block_size) const noexcept;
  BlockId match(const BlockSequence& seq, std::size_t index, GroupId group,
                std::optional<std::uint64_t> parent_cid) const;
  void evict_cached(BlockId id);
  void emit(KVEvent::Data data);
  std::uint32_t lookup_extra_id(const BlockExtraKeys& extra) const;

  BlockPoolConfig config_;
  std::vector<KVCacheBlock> blocks_;  // blocks_[i].block_id == i; never resized
  FreeBlockQueue free_queue_;
  BlockHashMap hash_map_;
  std::uint64_t num_evictions_ = 0;

  // Stored key material, per block (only with verify_cache_hits).
  std::vector<TokenId> block_tokens_;  // block_size tokens per block
  std::vector<Material> material_;     // per block
  std::unique_ptr<ExtraKeyTable> extra_keys_;
  std::uint64_t next_content_id_ = 1;

  // Events.
  std::uint64_t next_event_seq_ = 0;
  std::vector<KVEvent> events_;
  KVEventSink sink_;

  // Reused scratch (no allocation in steady state).
  std::vector<BlockId> unhashed_scratch_;
  std::vector<BlockId> hashed_scratch_;
  mutable std::string extra_scratch_;
  mutable std::vector<MultiModalKey> mm_scratch_;
};

}  // namespace pagedkv
