// pagedkv/pool/block_hash_map.hpp: (block hash, group) -> cached blocks, first inserted first.
//
// An open-addressing table of block ids (linear probing, backward-shift deletion) whose keys are
// read from the pool's block array: a block's own `block_hash` and `group_id` are its key. Each
// slot also keeps a 32-bit tag of the key, from which its home slot is derived, so probing and
// deletion compare tags and only touch a block on a tag match. An entry costs 8 bytes of table
// and no allocation. Capacity is fixed at construction to a power of two >= slots_per_block x
// the number of blocks (2 or more; a block is in the map at most once, so load stays <= 0.5 and
// the table never grows). 4 slots per block (load <= 0.25) costs 16 bytes more per block and
// makes eviction-heavy workloads markedly faster: probe runs and backward shifts are about half
// as long (bench/results/pool_hash_speed.md, fourth pass).
//
// Duplicates are allowed: the same content may be cached in several physical blocks (block tables
// are append-only, so a block's id never changes). Entries with equal keys stay in insertion order
// (insertion appends to the probe run; backward-shift deletion preserves relative order), so
// lookups return the first inserted block, as vLLM's dict-of-dicts does.
//
// Complexity: expected O(1) per operation for well-distributed hashes; every probe loop is
// bounded by the capacity. Thread-compatible (const calls may run concurrently).
// Errors: insert() into a full table throws pagedkv::Error (kInvalidState) and changes nothing;
// it never loops. Preconditions (checked by BlockPool, asserted here in debug builds): insert()
// takes a hashed block not already in the map; erase() a block that is in it.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/pool/kv_cache_block.hpp"
#include "pagedkv/pool/table_allocator.hpp"

namespace pagedkv {

class BlockHashMap {
 public:
  static constexpr BlockId kEmpty = -1;

  explicit BlockHashMap(std::span<const KVCacheBlock> blocks, std::size_t slots_per_block = 2)
      : blocks_(blocks) {
    std::size_t capacity = 8;
    while (capacity < std::max<std::size_t>(slots_per_block, 2) * blocks.size()) capacity *= 2;
    slots_.assign(capacity, Slot{kEmpty, 0});
    mask_ = capacity - 1;
  }

  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return slots_.size(); }

  void insert(BlockId id) {
    const KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    assert(b.is_cached());
    // A full table has no empty slot to end the probe: refuse instead of looping. (BlockPool
    // sizes the table to at least twice its blocks and inserts each block at most once, so this
    // fires on misuse of the map itself.)
    if (size_ + 1 >= slots_.size()) throw_full();
    place(id, tag_of(b.block_hash, b.group_id));
  }
  // insert() with the block's tag (key_tag of its block_hash and group_id) computed by the
  // caller from where it copied the hash from, so the probe does not wait for the record's store.
  void insert_tagged(BlockId id, std::uint32_t tag) {
    assert(blocks_[static_cast<std::size_t>(id)].is_cached());
    assert(tag == tag_of(blocks_[static_cast<std::size_t>(id)].block_hash,
                         blocks_[static_cast<std::size_t>(id)].group_id));
    if (size_ + 1 >= slots_.size()) throw_full();
    place(id, tag);
  }

  // insert_tagged() when no entry of the probe run has the same tag (then true); false and
  // nothing changed when one has (it may hold the same key: the caller decides, see
  // insert_tagged_unless()). The tag compare is all a pool refusing a second content per key
  // adds to an insert in the usual case.
  bool insert_tagged_if_new_tag(BlockId id, std::uint32_t tag) {
    assert(blocks_[static_cast<std::size_t>(id)].is_cached());
    assert(tag == tag_of(blocks_[static_cast<std::size_t>(id)].block_hash,
                         blocks_[static_cast<std::size_t>(id)].group_id));
    if (size_ + 1 >= slots_.size()) throw_full();
    std::size_t i = tag & mask_;
    for (; slots_[i].id != kEmpty; i = (i + 1) & mask_) {
      if (slots_[i].tag == tag) return false;
    }
    slots_[i] = Slot{id, tag};
    ++size_;
    return true;
  }

  // insert_tagged() unless an entry with the block's key makes conflict(entry) true: then that
  // entry's block is returned and nothing changes (else kEmpty, inserted). One pass over the
  // probe run, for a pool that refuses a key already holding other content.
  template <typename Conflict>
  BlockId insert_tagged_unless(BlockId id, std::uint32_t tag, Conflict&& conflict) {
    const KVCacheBlock& nb = blocks_[static_cast<std::size_t>(id)];
    assert(nb.is_cached());
    assert(tag == tag_of(nb.block_hash, nb.group_id));
    if (size_ + 1 >= slots_.size()) throw_full();
    std::size_t i = tag & mask_;
    for (; slots_[i].id != kEmpty; i = (i + 1) & mask_) {
      if (slots_[i].tag != tag) continue;
      const BlockId other = slots_[i].id;
      const KVCacheBlock& b = blocks_[static_cast<std::size_t>(other)];
      if (b.group_id == nb.group_id && b.block_hash == nb.block_hash && conflict(other)) {
        return other;
      }
    }
    slots_[i] = Slot{id, tag};
    ++size_;
    return kEmpty;
  }

  // Removes block `id`'s entry; its block_hash and group_id must still be the ones it was
  // inserted with. Returns false (and changes nothing) when it is not in the map.
  bool erase(BlockId id) noexcept {
    const KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    return erase_tagged(id, tag_of(b.block_hash, b.group_id));
  }
  // erase() with the block's tag (key_tag of its block_hash and group_id) computed by the
  // caller, who computed it already to prefetch the slot.
  [[gnu::always_inline]] bool erase_tagged(BlockId id, std::uint32_t tag) noexcept {
    assert(tag == tag_of(blocks_[static_cast<std::size_t>(id)].block_hash,
                         blocks_[static_cast<std::size_t>(id)].group_id));
    std::size_t i = tag & mask_;
    while (slots_[i].id != id) {  // ends: the table always keeps an empty slot
      if (slots_[i].id == kEmpty) return false;
      i = (i + 1) & mask_;
    }
    // Backward shift: pull later entries of the run into the hole when their home allows it.
    // Homes come from the stored tags, so this never touches the block array. An entry is
    // movable iff its home is not cyclically within (hole, its slot], i.e. it is at least as
    // far from home as from the hole.
    std::size_t j = i;
    // The path follows the load now (not the table's bound): at load <= 0.25 runs are short and
    // a plain loop is cheapest, also in a 2-slot table that is not full.
    if (4 * size_ <= slots_.size()) {
      for (;;) {
        j = (j + 1) & mask_;
        if (slots_[j].id == kEmpty) break;
        const std::size_t k = slots_[j].tag & mask_;  // its home
        if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
          slots_[i] = slots_[j];
          i = j;
        }
      }
      slots_[i] = Slot{kEmpty, 0};
      --size_;
      return true;
    }
    // Load above 0.25 (up to 0.5): the run is walked kWindow slots at a time without
    // data-dependent branches inside a window (a loop that exits at the run's end mispredicted
    // about twice per erase, which cost more than the whole shift). Entries past the run's end,
    // and those that stay, are stored back unchanged.
    for (;;) {
      std::size_t ended = 0;  // 1 from the run's end on
      for (std::size_t w = 0; w < kWindow; ++w) {
        j = (j + 1) & mask_;
        const Slot s = slots_[j];
        ended |= static_cast<std::size_t>(s.id == kEmpty);
        const std::size_t from_home = (j - (s.tag & mask_)) & mask_;
        const std::size_t from_hole = (j - i) & mask_;
        // All ones iff movable; selects by masking (the compiler keeps this branch free).
        const std::size_t move =
            std::size_t{0} - ((ended ^ 1) & static_cast<std::size_t>(from_home >= from_hole));
        const std::size_t to = j ^ ((i ^ j) & move);
        slots_[to] = s;
        i ^= (i ^ j) & move;
      }
      if (ended != 0) break;  // almost always after the first window
    }
    slots_[i] = Slot{kEmpty, 0};
    --size_;
    return true;
  }

  // The first inserted block with this key for which accept(id) is true; kEmpty if none.
  template <typename Accept>
  BlockId find_first(const BlockHash& hash, GroupId group, Accept&& accept) const {
    return find_first_tagged(tag_of(hash, group), hash, group, std::forward<Accept>(accept));
  }
  // find_first() with the key's tag (key_tag(hash, group)) computed by the caller, who may
  // have computed it already to prefetch (prefetch_tagged).
  template <typename Accept>
  BlockId find_first_tagged(std::uint32_t tag, const BlockHash& hash, GroupId group,
                            Accept&& accept) const {
    for (std::size_t i = tag & mask_; slots_[i].id != kEmpty; i = (i + 1) & mask_) {
      if (slots_[i].tag != tag) continue;  // most mismatches end here, without a block access
      const BlockId id = slots_[i].id;
      const KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
      if (b.group_id == group && b.block_hash == hash && accept(id)) return id;
    }
    return kEmpty;
  }

  // Starts loading the home slot of a key, so a later operation on it does not stall on memory.
  void prefetch(const BlockHash& hash, GroupId group) const noexcept {
    prefetch_tagged(tag_of(hash, group));
  }
  void prefetch_tagged(std::uint32_t tag) const noexcept {
    __builtin_prefetch(&slots_[tag & mask_]);
  }
  // A key's tag: its home slot and the first compare of a probe.
  static std::uint32_t key_tag(const BlockHash& hash, GroupId group) noexcept {
    return tag_of(hash, group);
  }

  BlockId find_first(const BlockHash& hash, GroupId group) const {
    return find_first(hash, group, [](BlockId) { return true; });
  }

  void clear() noexcept {
    std::fill(slots_.begin(), slots_.end(), Slot{kEmpty, 0});
    size_ = 0;
  }

  // The table's block ids in slot order (kEmpty for free slots), for invariant checks and
  // snapshots. O(capacity).
  std::vector<BlockId> slot_ids() const {
    std::vector<BlockId> ids(slots_.size());
    for (std::size_t i = 0; i < slots_.size(); ++i) ids[i] = slots_[i].id;
    return ids;
  }

 private:
  [[noreturn]] void throw_full() const {
    throw Error(ErrorCode::kInvalidState, "BlockHashMap::insert: the table is full (" +
                                              std::to_string(size_) + " entries, capacity " +
                                              std::to_string(slots_.size()) +
                                              "); a block was inserted more than once");
  }

  struct Slot {
    BlockId id;         // kEmpty or a cached block
    std::uint32_t tag;  // tag_of(its hash, group): home slot = tag & mask_
  };
  static constexpr std::size_t kWindow = 4;  // slots examined per step of erase()'s shift

  void place(BlockId id, std::uint32_t tag) noexcept {
    std::size_t i = tag & mask_;
    while (slots_[i].id != kEmpty) i = (i + 1) & mask_;
    slots_[i] = Slot{id, tag};
    ++size_;
  }
  static std::uint32_t tag_of(const BlockHash& hash, GroupId group) noexcept {
    // Fibonacci mix: the leading hash bytes are uniform for real schemes; the multiply also
    // spreads weak test hashes and separates groups.
    const std::uint64_t x =
        (static_cast<std::uint64_t>(hash.hash_code()) ^ group) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::uint32_t>(x >> 32);
  }

  std::span<const KVCacheBlock> blocks_;  // the pool's array; keys are read from it
  TableVector<Slot> slots_;
  std::size_t mask_ = 0;  // capacity - 1; capacity <= 2^32, so tags address every slot
  std::size_t size_ = 0;  // number of entries
};

}  // namespace pagedkv
