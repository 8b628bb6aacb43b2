// pagedkv/events/block_index.hpp: block id -> the engines holding it, per medium.
//
// A flat open-addressing table (linear probing, backward-shift deletion) of 16-byte slots:
// {64-bit block id, 32-bit GPU engine mask, 32-bit CPU engine mask}. One slot serves every engine
// holding the block, so memory per (block, engine) entry is at most 16 / load factor (<= 0.7)
// bytes, and less when engines share blocks (bench/bench_router.cpp measures it). An engine may
// hold the same id twice (two blocks with equal hashes); the extra copies are counted in a side
// map, so an id leaves an engine only when its last copy is removed.
//
// longest_prefixes() walks a request's block ids once, one probe per block, and stops as soon as
// no engine continues the prefix.
//
// Thread-compatible (KVIndexer adds the locking). Complexity: add/remove/find O(1) expected;
// clear_engine O(capacity). Errors: an engine index >= kMaxEngines throws pagedkv::Error
// (kOutOfRange); removing what is not there is a no-op (streams can start mid-way).
#pragma once

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
 public:
  static constexpr std::size_t kMaxEngines = 32;

  BlockIndex();

  void add(std::uint64_t id, std::size_t engine, Tier tier);
  void remove(std::uint64_t id, std::size_t engine, Tier tier);
  void clear_engine(std::size_t engine);  // every id of this engine, both media

  struct Masks {
    std::uint32_t gpu = 0;
    std::uint32_t cpu = 0;
  };
  Masks find(std::uint64_t id) const noexcept;

  // out[e] for e < out.size() (<= kMaxEngines): the engine's longest cached prefix of `ids`.
  void longest_prefixes(std::span<const std::uint64_t> ids, std::span<PrefixMatch> out) const;

  // Ids an engine holds on a medium, sorted (tests compare them with the engine's pool).
  std::vector<std::uint64_t> engine_ids(std::size_t engine, Tier tier) const;

  std::size_t num_ids() const noexcept { return size_; }
  std::size_t num_entries() const noexcept { return entries_; }  // (id, engine, medium) triples
  std::size_t memory_bytes() const noexcept;                     // table + duplicate counts

 private:
  struct Slot {
    std::uint64_t id;
    std::uint32_t gpu;  // 0 and cpu 0: empty
    std::uint32_t cpu;
  };
  static_assert(sizeof(Slot) == 16);

  std::size_t home(std::uint64_t id) const noexcept {
    return static_cast<std::size_t>((id * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  std::size_t probe(std::uint64_t id) const noexcept;  // its slot, or the empty slot ending the run
  void erase_slot(std::size_t i) noexcept;
  void grow();

  std::vector<Slot> slots_;  // power-of-two size
  unsigned shift_ = 0;       // 64 - log2(slots_.size())
  std::size_t size_ = 0;     // occupied slots
  std::size_t entries_ = 0;
  // Extra copies beyond the first, keyed by (id, engine, medium) mixed into one word with the
  // engine and medium in a second word: rare (two blocks cached with one hash).
  struct DupKey {
    std::uint64_t id;
    std::uint32_t engine_tier;
    bool operator==(const DupKey&) const = default;
  };
  struct DupHash {
    std::size_t operator()(const DupKey& k) const noexcept {
      return static_cast<std::size_t>((k.id ^ (std::uint64_t(k.engine_tier) << 56)) *
                                      0x9E3779B97F4A7C15ull);
    }
  };
  std::unordered_map<DupKey, std::uint32_t, DupHash> extra_copies_;
};

}  // namespace pagedkv::events
