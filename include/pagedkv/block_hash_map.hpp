// pagedkv/block_hash_map.hpp: (block hash, group) -> cached blocks, first inserted first.
//
// An open-addressing table of block ids (linear probing, backward-shift deletion) whose keys are
// read from the pool's block array: a block's own `block_hash` and `group_id` are its key, so an
// entry costs 4 bytes of table and no allocation. Capacity is fixed at construction to a power of
// two >= 2x the number of blocks (a block is in the map at most once, so load stays <= 0.5 and the
// table never grows).
//
// Duplicates are allowed: the same content may be cached in several physical blocks (block tables
// are append-only, so a block's id never changes). Entries with equal keys stay in insertion order
// (insertion appends to the probe run; backward-shift deletion preserves relative order), so
// lookups return the first inserted block, as vLLM's dict-of-dicts does.
//
// Complexity: expected O(1) per operation for well-distributed hashes. Thread-compatible.
// Preconditions (checked by BlockPool, asserted here in debug builds): insert() takes a hashed
// block not already in the map; erase() a block that is in it.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/kv_cache_block.hpp"

namespace pagedkv {

class BlockHashMap {
 public:
  static constexpr BlockId kEmpty = -1;

  explicit BlockHashMap(std::span<const KVCacheBlock> blocks) : blocks_(blocks) {
    std::size_t capacity = 8;
    while (capacity < 2 * blocks.size()) capacity *= 2;
    slots_.assign(capacity, kEmpty);
    mask_ = capacity - 1;
  }

  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return slots_.size(); }

  void insert(BlockId id) noexcept {
    const KVCacheBlock& b = blocks_[id];
    assert(b.is_cached());
    std::size_t i = home(b.block_hash, b.group_id);
    while (slots_[i] != kEmpty) i = (i + 1) & mask_;
    slots_[i] = id;
    ++size_;
  }

  // Removes block `id`'s entry; its block_hash and group_id must still be the ones it was
  // inserted with. Returns false (and changes nothing) when it is not in the map.
  bool erase(BlockId id) noexcept {
    const KVCacheBlock& b = blocks_[id];
    std::size_t i = home(b.block_hash, b.group_id);
    while (slots_[i] != id) {
      if (slots_[i] == kEmpty) return false;
      i = (i + 1) & mask_;
    }
    // Backward shift: pull later entries of the run into the hole when their home allows it.
    std::size_t j = i;
    for (;;) {
      j = (j + 1) & mask_;
      if (slots_[j] == kEmpty) break;
      const KVCacheBlock& m = blocks_[slots_[j]];
      const std::size_t k = home(m.block_hash, m.group_id);
      // Movable iff its home k is not cyclically within (i, j].
      const bool movable = i <= j ? (k <= i || k > j) : (k <= i && k > j);
      if (movable) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = kEmpty;
    --size_;
    return true;
  }

  // The first inserted block with this key for which accept(id) is true; kEmpty if none.
  template <typename Accept>
  BlockId find_first(const BlockHash& hash, GroupId group, Accept&& accept) const {
    for (std::size_t i = home(hash, group); slots_[i] != kEmpty; i = (i + 1) & mask_) {
      const BlockId id = slots_[i];
      const KVCacheBlock& b = blocks_[id];
      if (b.group_id == group && b.block_hash == hash && accept(id)) return id;
    }
    return kEmpty;
  }

  BlockId find_first(const BlockHash& hash, GroupId group) const {
    return find_first(hash, group, [](BlockId) { return true; });
  }

  void clear() noexcept {
    std::fill(slots_.begin(), slots_.end(), kEmpty);
    size_ = 0;
  }

  // Raw table, for invariant checks and snapshots.
  std::span<const BlockId> slots() const noexcept { return slots_; }

 private:
  std::size_t home(const BlockHash& hash, GroupId group) const noexcept {
    // Fibonacci mix: the leading hash bytes are uniform for real schemes; the multiply also
    // spreads weak test hashes and separates groups.
    const std::uint64_t x =
        (static_cast<std::uint64_t>(hash.hash_code()) ^ group) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(x >> 17) & mask_;
  }

  std::span<const KVCacheBlock> blocks_;  // the pool's array; keys are read from it
  std::vector<BlockId> slots_;            // kEmpty or a block id
  std::size_t mask_ = 0;                  // capacity - 1
  std::size_t size_ = 0;                  // number of entries
};

}  // namespace pagedkv
