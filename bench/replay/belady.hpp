// A replay-only simulator of the prefix cache for pagedkv-replay --eviction: the default
// sequential replay's semantics (docs/traces.md; requests in file order, one at a time, prompt
// only) on an abstract pool of N - 1 blocks, with either the library's LRU free-block queue
// mirrored exactly (Eviction::kLru, to validate the simulator against the library) or the
// clairvoyant Belady choice (Eviction::kBelady): evict the evictable cached block whose next use
// lies farthest ahead in the trace. Belady reads the future, so it is an offline reference for
// other policies, not a policy an engine can run. The library (BlockPool) is not involved.
//
// Semantics per request (both modes): hit = the longest prefix of the request's full blocks that
// is cached, capped at floor((num_tokens - 1) / B) blocks (get_computed_blocks); the hit blocks are
// held, ceil(num_tokens / B) - hit new blocks are allocated (evicting when no empty block is
// left), the new full blocks are cached, then every block is freed (evictable, not dropped). A
// request needing more than N - 1 blocks is rejected (counted, nothing changes).
//  - kLru: the FreeBlockQueue and the duplicate-allowing hash map of docs/semantics.md: new blocks
//    pop from the queue's head; freed blocks go back (tail first; uncached ones at the head,
//    cached ones at the tail); a lookup takes the first-inserted block of a hash.
//  - kBelady: empty blocks are used first; otherwise the evictable cached block (reference count
//    0) with the largest next use is evicted; a block's next use is the trace position (request,
//    block) of the next occurrence of its hash where it could be a hit (block index below the
//    request's cap; rejected requests do not count), or never. A hash is cached in at most one
//    block (content that is already cached is not cached again: the new block stays uncached).
//    Ties are broken by the larger block id. Because a hash's occurrence implies its parent's one
//    position earlier in the same request, a cached parent's next use is always before its
//    children's (or both are never), so this rule evicts leaves before their parents.
//  - kBeladyNoisy: Belady keyed by an estimate of each next use: the distance to it multiplied by
//    exp(sigma z), z standard normal, one draw per request of that next use (a hash of the
//    request's index: deterministic), so every block that request reuses shares the error and a
//    parent stays keyed just before its children; whether a block is used again at all stays
//    exact. How well a policy must predict reuse times to get Belady's hits: sigma = 1 is a
//    predictor off by a factor e at one standard deviation.
//
// Complexity: block_trace() hashes every prompt once (the replay's hashing) and maps each block
// hash to a dense id (memory: one hash map entry per distinct hash, 4 bytes per block). simulate()
// is O(blocks) for kLru and O(blocks log blocks) for kBelady (a max-heap keyed by next use with
// lazy deletion; next uses come from one backward pass over the block sequence), plus O(N) memory.
// Not thread-safe per object; separate calls are independent. Errors: pagedkv::Error for
// num_blocks < 2 or an inconsistent BlockTrace.
#pragma once

#include <cstdint>
#include <vector>

#include "replay.hpp"
#include "trace.hpp"

namespace pagedkv::replay {

// A trace reduced to what the prefix cache sees: per request its prompt length and the dense ids
// of its full blocks' hashes (equal ids exactly when equal block hashes).
struct BlockTrace {
  std::uint32_t block_size = 16;
  std::vector<std::uint64_t> num_tokens;  // per request
  std::vector<std::uint64_t> offsets;     // size requests + 1; request i's ids are
                                          // ids[offsets[i], offsets[i + 1]) = floor(tokens / B)
  std::vector<std::uint32_t> ids;
  std::uint32_t distinct = 0;  // ids are in [0, distinct)

  std::size_t size() const noexcept { return num_tokens.size(); }
  // Appends a request (ids.size() must be num_tokens / block_size; each id < distinct).
  void add(std::uint64_t tokens, const std::vector<std::uint32_t>& block_ids);
};

// Synthesizes and hashes every prompt as the sequential replay does (options.block_size,
// options.hash, cache salts); options.num_blocks is not used.
BlockTrace block_trace(const Trace& trace, const ReplayOptions& options);

// One replay on a pool of num_blocks blocks (including the null block). Fills requests,
// rejected, prompt_tokens, queried_tokens, hit_tokens, prefill_tokens_computed, prompt_blocks,
// evicted_blocks, peak_usage and pool_seconds / pool_cpu_seconds (the simulation's time).
// noise_sigma: kBeladyNoisy's sigma (0..kMaxBeladyNoise; ignored by the other rules).
ReplayResult simulate(const BlockTrace& trace, std::int32_t num_blocks, Eviction eviction,
                      double noise_sigma = 0.0);

// block_trace() once, then simulate() for each options.num_blocks entry with options.eviction,
// and in LRU mode as well (sim_lru_hit_tokens, sim_lru_evicted_blocks: the same pool size and
// blocks, so each line carries the gap); hash_seconds is the shared synthesis and hashing, the
// *_seconds of the pool the options.eviction run only. Sequential semantics only; throws
// pagedkv::Error for another mode, caching off or a sliding window.
std::vector<ReplayResult> run_eviction_replay(const Trace& trace, const ReplayOptions& options);

}  // namespace pagedkv::replay
