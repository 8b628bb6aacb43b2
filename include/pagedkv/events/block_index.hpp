// pagedkv/events/block_index.hpp: block id -> the engines holding it, per medium.
//
// A flat open-addressing table (linear probing, backward-shift deletion) of 16-byte slots:
// {64-bit block id, 32-bit GPU engine mask, 32-bit CPU engine mask}. One slot serves every engine
// holding the block. Beside it, each engine has its own set of the ids it holds (8-byte slots,
// same scheme), so that what concerns one engine (its entries, clearing them) costs in proportion
// to that engine's entries, never the whole table. An engine may hold the same id twice (two
// blocks with equal hashes); the extra copies are counted in a per-engine side map, so an id
// leaves an engine only when its last copy is removed. Memory per (block, engine) entry: at most
// 16 / load (shared table) + 8 / load (engine's set), load between 0.125 and 0.7 once a table
// has grown past its first size; bench/bench_router.cpp measures it.
//
// longest_prefixes() walks a request's block ids once, one probe of the shared table per block,
// and stops as soon as no engine continues the prefix.
//
// Sizing: add() grows a table that would pass the maximum load (0.7) itself; removals never
// resize. A caller that must not rebuild a table in place (KVIndexer: readers share the index)
// asks resize_needed() / plan_resize(), which builds the new tables from a const index (so
// readers may keep reading it meanwhile), and adopt()s the result in O(1). A grow at least
// doubles a table; a table shrinks when its load falls under 0.125, to a load of at most 0.35
// (hysteresis: it cannot grow and shrink back without about as many operations as it holds
// ids); an engine that holds nothing frees its set.
//
// Hostile ids: a slot is taken from the id mixed with a per-index random key (drawn from
// std::random_device at construction; a fixed one may be given for tests) by a murmur3-style
// finalizer, so ids chosen to share a probe run in one index (or in the unkeyed multiplicative
// hash this table once used) are spread like random ones in any other. max_probe_length() reports
// the longest run (tests).
//
// Thread-compatible (KVIndexer adds the locking). Complexity: add/remove/find O(1) expected;
// clear_engine / clear_engine_some O(the engine's entries); engine_ids O(n log n) in the
// engine's entries; engine_entries O(1); plan_resize O(ids of the tables it rebuilds).
// Errors: an engine index >= kMaxEngines throws pagedkv::Error (kOutOfRange); removing what is
// not there is a no-op (streams can start mid-way). Every call gives the strong guarantee (an
// allocation that fails in add() or plan_resize() leaves the index as it was).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace pagedkv::events {

enum class Tier : std::uint8_t { kGpu, kCpu };

struct PrefixMatch {
  std::uint32_t prefix_blocks = 0;      // longest prefix cached on the engine, any medium
  std::uint32_t gpu_prefix_blocks = 0;  // longest prefix cached on its GPU
};

class BlockIndex {
 private:
  struct Slot {
    std::uint64_t id;
    std::uint32_t gpu;  // 0 and cpu 0: empty
    std::uint32_t cpu;
  };
  static_assert(sizeof(Slot) == 16);

 public:
  static constexpr std::size_t kMaxEngines = 32;

  BlockIndex();                            // a random key
  explicit BlockIndex(std::uint64_t key);  // a fixed key (tests: reproducible slots)

  void add(std::uint64_t id, std::size_t engine, Tier tier);
  void remove(std::uint64_t id, std::size_t engine, Tier tier);
  void clear_engine(std::size_t engine);  // every id of this engine, both media
  // Removes up to about `budget` of the engine's ids (both media; budget >= 1); true when the
  // engine holds none any more. Between calls the engine is partly cleared (lookups see a subset
  // of its entries); an add() or remove() for it first finishes the clear.
  bool clear_engine_some(std::size_t engine, std::size_t budget);

  struct Masks {
    std::uint32_t gpu = 0;
    std::uint32_t cpu = 0;
  };
  Masks find(std::uint64_t id) const noexcept;

  // out[e] for e < out.size() (<= kMaxEngines): the engine's longest cached prefix of `ids`.
  void longest_prefixes(std::span<const std::uint64_t> ids, std::span<PrefixMatch> out) const;

  // Ids an engine holds on a medium, sorted (tests compare them with the engine's pool).
  std::vector<std::uint64_t> engine_ids(std::size_t engine, Tier tier) const;
  // How many ids the engine holds on the medium (extra copies not counted).
  std::size_t engine_entries(std::size_t engine, Tier tier) const;

  std::size_t num_ids() const noexcept { return size_; }
  std::size_t num_entries() const noexcept { return entries_; }  // (id, engine, medium) triples
  std::size_t memory_bytes() const noexcept;                     // tables + duplicate counts
  // The most slots a lookup of a present id visits in the shared table (O(table size); tests).
  std::size_t max_probe_length() const noexcept;

  // The slot hash: the id plus the key, through murmur3's 64-bit finalizer.
  static std::uint64_t mix(std::uint64_t id, std::uint64_t key) noexcept {
    std::uint64_t x = id + key;
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
  }

  // Resizing in two steps. resize_needed(): whether the shared table or the engine's set must
  // grow for `adds` more ids, or may shrink (O(1)). plan_resize(): the resized tables, built
  // without changing this index. adopt(): installs them (O(1), noexcept) and leaves the replaced
  // tables in `plan` (freed with it, when the caller likes); a plan made before another change to
  // the index is not installed.
  class Resize {
   private:
    friend class BlockIndex;
    std::uint64_t version = 0;
    bool main = false;
    std::vector<Slot> slots;
    unsigned shift = 0;
    std::size_t engine = kMaxEngines;  // < kMaxEngines: `ids` replaces its set
    std::vector<std::uint64_t> ids;
    unsigned ids_shift = 0;
  };
  bool resize_needed(std::size_t engine, std::size_t adds) const;
  Resize plan_resize(std::size_t engine, std::size_t adds) const;
  void adopt(Resize&& plan) noexcept;

 private:
  // An engine's ids: open addressing on 8-byte keys, 0 marks an empty slot (id 0 is `has_zero`).
  struct IdSet {
    std::vector<std::uint64_t> slots;  // power-of-two size, or empty
    unsigned shift = 64;
    std::size_t size = 0;  // ids in slots (id 0 not counted)
    bool has_zero = false;
    std::uint64_t key = 0;  // the index's key

    std::size_t home(std::uint64_t id) const noexcept {
      return static_cast<std::size_t>(mix(id, key) >> shift);
    }
    std::size_t probe(std::uint64_t id) const noexcept;
    void insert(std::uint64_t id);  // absent ids only
    void erase(std::uint64_t id) noexcept;
    std::size_t count() const noexcept { return size + (has_zero ? 1 : 0); }
  };
  struct DupKey {
    std::uint64_t id;
    Tier tier;
    bool operator==(const DupKey&) const = default;
  };
  struct DupHash {
    DupHash() noexcept : key(0) {}
    explicit DupHash(std::uint64_t k) noexcept : key(k) {}
    std::uint64_t key;  // the index's key
    std::size_t operator()(const DupKey& k) const noexcept {
      return static_cast<std::size_t>(mix(k.id ^ (std::uint64_t(k.tier) << 63), key));
    }
  };
  using DupMap = std::unordered_map<DupKey, std::uint32_t, DupHash>;
  struct EngineIds {
    IdSet ids;
    std::size_t gpu = 0;  // entries per medium
    std::size_t cpu = 0;
    std::size_t clear_pos = 0;  // a clear in progress: slots at and above it are done
    bool clearing = false;
    // Extra copies beyond the first: rare (two blocks cached with one hash).
    DupMap extra_copies;
  };

  std::size_t home(std::uint64_t id) const noexcept {
    return static_cast<std::size_t>(mix(id, key_) >> shift_);
  }
  void reset_engine_state(EngineIds& en) const;        // an empty set and map, keyed
  std::size_t probe(std::uint64_t id) const noexcept;  // its slot, or the empty slot ending the run
  void erase_slot(std::size_t i) noexcept;
  void grow();
  // Drops the engine's bits for `id` from the shared table (a clear).
  void drop_from_table(std::uint64_t id, std::size_t engine) noexcept;
  void finish_clear(std::size_t engine) noexcept;

  std::vector<Slot> slots_;  // power-of-two size
  unsigned shift_ = 0;       // 64 - log2(slots_.size())
  std::size_t size_ = 0;     // occupied slots
  std::size_t entries_ = 0;
  std::uint64_t version_ = 0;  // counts changes (a stale Resize is not adopted)
  std::uint64_t key_ = 0;      // the slot hash's secret (mix())
  std::array<EngineIds, kMaxEngines> engines_;
};

}  // namespace pagedkv::events
