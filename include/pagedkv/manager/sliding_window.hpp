// pagedkv/manager/sliding_window.hpp: the cache-hit search and the out-of-window release of a
// sliding-window KV-cache group (vLLM's SlidingWindowManager).
//
// A hit needs only the last window_blocks() blocks before its end: the search runs right to left
// for that many contiguous cached blocks whose chain is consistent (each block cached after the
// content of its left neighbour) and whose first block was cached after exactly the request's
// own blocks before it (with verification; a run found by a hash collision is skipped), so a hit
// is a true prefix; the positions before the run hold the null block. A shorter run counts only
// when it reaches block 0. As a request advances, blocks wholly before its window are released
// and the null block takes their place.
//
// Complexity: O(blocks searched) per hit, plus, to anchor a run starting at block i > 0: O(1)
// with chain hashes that identify the prefix (SHA-256 schemes) or a caller's verified prefix
// covering [0, i) (a hybrid model's full-attention hit); otherwise a verified left-to-right
// match of the cached prefix (as full attention) and SHA-256 over the blocks of [0, i) it does
// not reach. O(blocks released) per release. Reads the pool only.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "pagedkv/hash/block_sequence.hpp"
#include "pagedkv/manager/attention_spec.hpp"
#include "pagedkv/pool/block_pool.hpp"

namespace pagedkv {

// The hit of a window group over the first `max_blocks` blocks of `seq`: a block table row (null
// blocks before the run) of the longest length the window accepts. A run starting anywhere but
// block 0 must end on a multiple of `alignment` tokens. `verified_prefix` (optional): cached
// blocks known to hold exactly seq's blocks [0, verified_prefix.size()) - another group's
// full-attention hit at the same block size - which anchor a run starting within it in O(1).
std::vector<BlockId> find_sliding_window_hit(const BlockPool& pool, const BlockSequence& seq,
                                             GroupId group, const AttentionSpec& spec,
                                             std::size_t max_blocks, std::size_t alignment,
                                             BlockPool::LookupScratch* scratch = nullptr,
                                             std::span<const BlockId> verified_prefix = {});

// Blocks of the table row `row` that lie wholly before the window of a request with
// `num_computed_tokens` computed tokens and are still held, counted back from the last such block
// to the first null block. With `count_freeable`, only those that releasing returns to the free
// queue (ref count 1). Always 0 for full attention.
std::size_t num_out_of_window_blocks(const BlockPool& pool, const AttentionSpec& spec,
                                     std::span<const BlockId> row, std::size_t num_computed_tokens,
                                     bool count_freeable);

}  // namespace pagedkv
