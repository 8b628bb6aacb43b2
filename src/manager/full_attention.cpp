#include "pagedkv/manager/full_attention.hpp"

#include <algorithm>

namespace pagedkv {

namespace {

// Block by block, each hit's parent being the previous hit (pools whose parent identity is a
// content id). The table's misses overlap through prefetches a few blocks ahead.
void find_with_parents(const BlockPool& pool, const BlockSequence& seq, GroupId group,
                       std::size_t max_blocks, BlockPool::LookupScratch* scratch,
                       std::vector<BlockId>& hit) {
  constexpr std::size_t kPrefetchDistance = 8;
  for (std::size_t i = 0; i < std::min(kPrefetchDistance, max_blocks); ++i) {
    pool.prefetch_cached_block(seq.block_hashes[i], group);
  }
  BlockId parent = BlockPool::kNoBlock;
  for (std::size_t i = 0; i < max_blocks; ++i) {
    if (i + kPrefetchDistance < max_blocks) {
      pool.prefetch_cached_block(seq.block_hashes[i + kPrefetchDistance], group);
    }
    const BlockId b = pool.match_cached_block(seq, i, parent, group, scratch);
    if (b == BlockPool::kNoBlock) break;
    hit.push_back(b);
    parent = b;
  }
}

}  // namespace

void find_full_attention_hit(const BlockPool& pool, const BlockSequence& seq, GroupId group,
                             std::size_t max_blocks, std::size_t alignment,
                             std::vector<BlockId>& hit, BlockPool::LookupScratch* scratch) {
  max_blocks = std::min(max_blocks, seq.block_hashes.size());
  hit.clear();
  const BlockPoolConfig& c = pool.config();
  if (!c.verify_cache_hits || c.chain_hashes_identify_prefix || c.guard_chain_hashes) {
    // The parent check of a hit at i compares its stored parent hash with the request's own hash
    // of block i - 1, which the previous hit matched in full: the pool's run lookup gives the
    // same blocks as the block-by-block search, in one call.
    pool.match_cached_run_after(seq, 0, max_blocks, hit, group, scratch);
  } else {
    find_with_parents(pool, seq, group, max_blocks, scratch, hit);
  }
  while (!hit.empty() && (hit.size() * seq.block_size) % alignment != 0) hit.pop_back();
}

std::vector<BlockId> find_full_attention_hit(const BlockPool& pool, const BlockSequence& seq,
                                             GroupId group, std::size_t max_blocks,
                                             std::size_t alignment,
                                             BlockPool::LookupScratch* scratch) {
  std::vector<BlockId> hit;
  find_full_attention_hit(pool, seq, group, max_blocks, alignment, hit, scratch);
  return hit;
}

}  // namespace pagedkv
