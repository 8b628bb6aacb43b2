#include "pagedkv/manager/sliding_window.hpp"

#include <algorithm>

namespace pagedkv {

namespace {

// Whether a run whose first block `first` sits at block `index` continues the request's own
// prefix: `first` was matched by its own material only (the search runs right to left), so its
// stored parent identity must be the identity of seq's blocks [0, index). Block 0's parent (the
// root) was already checked by the lookup. Chain hashes that identify the prefix answer in O(1);
// otherwise the pool walks seq's blocks through its content table (one lookup per block, cheaper
// than a verified left-to-right match), from the end of a caller's verified prefix row (another
// group's hit; O(1) when it covers [0, index)) or from the root.
bool anchored_to_prefix(const BlockPool& pool, const BlockSequence& seq, BlockId first,
                        std::size_t index, std::span<const BlockId> verified_prefix,
                        BlockPool::LookupScratch* scratch) {
  if (index == 0 || !pool.config().verify_cache_hits) return true;
  if (pool.config().chain_hashes_identify_prefix) {
    return pool.cached_after_prefix(first, seq, index, BlockPool::kNoBlock, 0, scratch);
  }
  const std::size_t anchored = std::min(index, verified_prefix.size());
  return pool.cached_after_prefix(
      first, seq, index, anchored == 0 ? BlockPool::kNoBlock : verified_prefix[anchored - 1],
      anchored, scratch);
}

}  // namespace

std::vector<BlockId> find_sliding_window_hit(const BlockPool& pool, const BlockSequence& seq,
                                             GroupId group, const AttentionSpec& spec,
                                             std::size_t max_blocks, std::size_t alignment,
                                             BlockPool::LookupScratch* scratch,
                                             std::span<const BlockId> verified_prefix) {
  max_blocks = std::min(max_blocks, seq.block_hashes.size());
  const std::size_t bs = spec.block_size;
  const std::size_t needed = spec.window_blocks();
  std::vector<BlockId> hit(max_blocks, kNullBlockId);
  std::size_t run = 0;
  for (std::size_t i = max_blocks; i-- > 0;) {
    const BlockId b = pool.match_cached_block_unanchored(seq, i, group, scratch);
    if (b == BlockPool::kNoBlock) {
      run = 0;
      continue;
    }
    const bool extends = run > 0 && pool.same_content_chain(b, hit[i + 1]);
    if (!extends) {
      // A run starts here: its end must be aligned for the hybrid hit length.
      run = 0;
      if (bs != alignment && ((i + 1) * bs) % alignment != 0) continue;
    }
    hit[i] = b;
    ++run;
    if (run >= needed) {
      // Every block of the run descends from its first block's parent: check that it is the
      // request's own prefix. If not, no run through block i is the request's (each would hold
      // this same block there): go on left of it.
      if (!anchored_to_prefix(pool, seq, b, i, verified_prefix, scratch)) {
        run = 0;
        continue;
      }
      hit.resize(i + run);
      return hit;
    }
  }
  hit.resize(run);  // the run that reaches block 0, possibly empty
  return hit;
}

std::size_t num_out_of_window_blocks(const BlockPool& pool, const AttentionSpec& spec,
                                     std::span<const BlockId> row, std::size_t num_computed_tokens,
                                     bool count_freeable) {
  const std::size_t skipped = std::min<std::size_t>(
      spec.num_skipped_tokens(num_computed_tokens) / spec.block_size, row.size());
  std::size_t n = 0;
  for (std::size_t i = skipped; i-- > 0;) {
    const BlockId b = row[i];
    if (b == kNullBlockId) break;  // everything before it was released earlier
    if (!count_freeable || pool.block(b).ref_cnt == 1) ++n;
  }
  return n;
}

}  // namespace pagedkv
