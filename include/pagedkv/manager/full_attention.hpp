// pagedkv/manager/full_attention.hpp: the cache-hit search of a full-attention KV-cache group
// (vLLM's FullAttentionManager.find_longest_cache_hit).
//
// Left to right: block i hits only when blocks 0..i-1 hit and its stored material proves it was
// cached after the same content (see BlockPool::match_cached_block), so a hit is exactly a true
// prefix. The table's cache misses overlap through prefetches a few blocks ahead.
//
// Complexity: O(hit blocks), plus O(block_size) per verified block. Reads the pool only.
#pragma once

#include <cstddef>
#include <vector>

#include "pagedkv/hash/block_sequence.hpp"
#include "pagedkv/pool/block_pool.hpp"

namespace pagedkv {

// The longest run of cached blocks of `seq` from block 0, at most `max_blocks`, trimmed so that
// the hit's token count is a multiple of `alignment` (a hybrid model's common block size).
// `scratch` (optional) holds the buffers of verified lookups, so the search allocates nothing.
std::vector<BlockId> find_full_attention_hit(const BlockPool& pool, const BlockSequence& seq,
                                             GroupId group, std::size_t max_blocks,
                                             std::size_t alignment,
                                             BlockPool::LookupScratch* scratch = nullptr);
// The same into `hit` (cleared first; its capacity is reused, so a search that finds no more
// blocks than a previous one allocates nothing). On an exception `hit` is left empty or partial.
void find_full_attention_hit(const BlockPool& pool, const BlockSequence& seq, GroupId group,
                             std::size_t max_blocks, std::size_t alignment,
                             std::vector<BlockId>& hit,
                             BlockPool::LookupScratch* scratch = nullptr);

}  // namespace pagedkv
