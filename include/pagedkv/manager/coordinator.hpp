// pagedkv/manager/coordinator.hpp: a model's KV-cache groups and the cache hit every group
// accepts (vLLM's KVCacheCoordinator: unitary for one group, hybrid for several).
//
// Requests are hashed once, at the smallest group block size. A coarser group (block size a
// multiple `factor` of the smallest) keys its block j by the digest of fine hashes
// [j * factor, (j + 1) * factor) concatenated. A hybrid hit is a fixed point: each group shortens
// the length to what it accepts until none shortens it, every length a multiple of the least
// common multiple of the group block sizes; full attention is looked up once, then trimmed.
//
// Errors: the constructor throws pagedkv::Error for an invalid group list (no or too many groups,
// an attention kind outside the enum, block size 0, a block size that is not a multiple of the
// smallest, a window of 0 tokens, block sizes whose least common multiple overflows 64 bits).
// Thread-compatible; find_longest_cache_hit uses scratch buffers of this object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/hash/block_sequence.hpp"
#include "pagedkv/manager/attention_spec.hpp"
#include "pagedkv/pool/block_pool.hpp"

namespace pagedkv {

struct KVCacheGroup {
  AttentionSpec spec;
  GroupId id = 0;
  std::uint32_t factor = 1;  // block size / hash block size
};

class KVCacheCoordinator {
 public:
  // `specs` in the order the engine's layers use them; `scheme` keys the coarse groups.
  KVCacheCoordinator(std::vector<AttentionSpec> specs, HashScheme scheme);

  std::span<const KVCacheGroup> groups() const noexcept { return groups_; }
  std::size_t num_groups() const noexcept { return groups_.size(); }
  // The block size requests are hashed at (the smallest group block size).
  std::uint32_t hash_block_size() const noexcept { return hash_block_size_; }
  // Least common multiple of the group block sizes: every hybrid hit is a multiple of it.
  std::size_t alignment() const noexcept { return alignment_; }
  // The largest group block size (the pool stores that many tokens per block).
  std::uint32_t max_block_size() const noexcept;

  // Group g's view of a request's key material `fine` (hashed at hash_block_size()): `fine`
  // itself, or for a coarse group the same tokens keyed by `coarse`, which is extended in place
  // to every coarse block `fine` completes.
  BlockSequence group_sequence(const BlockSequence& fine, std::size_t g,
                               std::vector<BlockHash>& coarse) const;

  // The longest hit of at most `max_tokens` tokens that every group accepts; fills `per_group`
  // (one block table row per group, each covering the returned number of tokens).
  std::size_t find_longest_cache_hit(const BlockPool& pool, const BlockSequence& fine,
                                     std::size_t max_tokens,
                                     std::vector<std::vector<BlockId>>& per_group);

  // Whether block `block_index` of group g can ever be part of a hit. A hybrid hit ends on a
  // multiple of the alignment, so a window group's block is only used when it lies within
  // window_blocks() before such an end; the others are never cached (they would only take map
  // entries). Always true for full attention and for a single group.
  bool block_can_hit(std::size_t g, std::size_t block_index) const noexcept;

 private:
  std::vector<KVCacheGroup> groups_;
  HashScheme digest_scheme_;
  std::uint32_t hash_block_size_;
  std::size_t alignment_;
  std::vector<BlockHash> coarse_scratch_;
  std::vector<bool> looked_up_;
  BlockPool::LookupScratch lookup_scratch_;
};

}  // namespace pagedkv
