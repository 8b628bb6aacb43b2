#include "pagedkv/manager/full_attention.hpp"

#include <algorithm>

namespace pagedkv {

std::vector<BlockId> find_full_attention_hit(const BlockPool& pool, const BlockSequence& seq,
                                             GroupId group, std::size_t max_blocks,
                                             std::size_t alignment,
                                             BlockPool::LookupScratch* scratch) {
  max_blocks = std::min(max_blocks, seq.block_hashes.size());
  std::vector<BlockId> hit;
  // Each hit's parent is the previous hit. The table's misses overlap through prefetches a few
  // blocks ahead.
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
  while (!hit.empty() && (hit.size() * seq.block_size) % alignment != 0) hit.pop_back();
  return hit;
}

}  // namespace pagedkv
