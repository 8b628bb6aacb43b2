// pagedkv/pool/kv_cache_block.hpp: the metadata of one physical KV-cache block.
//
// Blocks live in one flat array owned by a BlockPool and are named by their index (BlockId).
// Block 0 is the permanent null block: a placeholder for skipped positions (sliding window); it is
// never in the free queue, never hashed, never reference counted, and always counted as used.
// The free queue keeps its links in an array of its own (see free_block_queue.hpp).
// Thread-compatible (owned and mutated by its pool only).
#pragma once

#include <cstdint>

#include "pagedkv/hash/block_hash.hpp"

namespace pagedkv {

// Index of a block in its pool, 0 .. num_blocks - 1.
using BlockId = std::int32_t;
// KV-cache group (one per attention type/layer group in hybrid models); 0 for a single group.
using GroupId = std::uint8_t;

inline constexpr BlockId kNullBlockId = 0;
// Link value of a block that is not in the free queue.
inline constexpr BlockId kNotQueued = -2;
// Link value at either end of the free queue.
inline constexpr BlockId kQueueEnd = -1;

struct KVCacheBlock {
  BlockId block_id = 0;      // index in the pool's array; never changes
  std::int32_t ref_cnt = 0;  // number of requests holding the block; 0 for the null block
  // Pool-internal identity word, 0 when not cached (verify_cache_hits). Pools with content ids:
  // the content id of the prefix this block holds (an index into the hash-consed content table,
  // equal for equal prefix content). Pools with chain-hash identities: the interned id of its
  // extra keys and the size of its parent's hash (see BlockPool's stored material).
  std::uint32_t content_id = 0;
  BlockHash block_hash;  // empty unless the block is full and cached (in the hash map)
  GroupId group_id = 0;  // the group the hash was cached under; meaningful when hashed
  bool is_null = false;  // true only for block 0

  bool is_cached() const noexcept { return !block_hash.empty(); }
};

}  // namespace pagedkv
