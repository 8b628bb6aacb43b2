// pagedkv/pool/retention.hpp: retention priorities of cached blocks (the pool's vocabulary).
//
// A block's retention priority (0..100, TensorRT-LLM's range) orders eviction across classes:
// the pool evicts a block of priority p only once no evictable block of a lower priority is left
// (see BlockPool::set_retention and docs/retention.md). Every block starts at, and falls back to,
// kDefaultRetentionPriority. A priority may carry a duration measured on a caller-supplied
// monotonic tick (no global clock: BlockPoolConfig::retention_clock); once it runs out without a
// hit, the block is back at the default priority. Plain values; no allocation, no state.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>

namespace pagedkv {

// 0 (evicted first) .. 100 (kept longest).
using RetentionPriority = std::uint8_t;
// TensorRT-LLM's default retention priority; a block nobody asked about has it.
inline constexpr RetentionPriority kDefaultRetentionPriority = 35;
inline constexpr RetentionPriority kMaxRetentionPriority = 100;

// A monotonic tick (any unit the caller chooses, e.g. nanoseconds), read through the clock the
// pool's config names. kNoExpiry: a priority that never runs out.
using RetentionTick = std::int64_t;
inline constexpr RetentionTick kNoExpiry = std::numeric_limits<RetentionTick>::max();
// Returns the current tick; must be monotonic (never decrease) and must not throw (the pool reads
// it inside noexcept changes, touch() and the frees, where a throw ends the program;
// set_retention() and get_new_blocks() read it before any change, so a throw there changes
// nothing). The const BlockPool::retention() calls it too, so a clock shared by threads that
// read a pool at once must allow concurrent calls (a steady clock does).
using RetentionClock = std::function<RetentionTick()>;

// A block's retention as the pool holds it.
struct BlockRetention {
  RetentionPriority priority = kDefaultRetentionPriority;
  RetentionTick duration = kNoExpiry;    // renewed on every hit; kNoExpiry: none
  RetentionTick expires_at = kNoExpiry;  // the tick at which it falls back to the default
  bool operator==(const BlockRetention&) const = default;
};

// Priority classes for statistics: below, at and above the default priority.
enum class RetentionClass : std::uint8_t { kBelowDefault = 0, kDefault = 1, kAboveDefault = 2 };
inline constexpr std::size_t kNumRetentionClasses = 3;
constexpr RetentionClass retention_class(RetentionPriority p) noexcept {
  return p < kDefaultRetentionPriority    ? RetentionClass::kBelowDefault
         : p == kDefaultRetentionPriority ? RetentionClass::kDefault
                                          : RetentionClass::kAboveDefault;
}

// Per-class counters of a pool (BlockPool::retention_stats()). Index by
// static_cast<std::size_t>(RetentionClass). Hits and evictions are counted once the pool keeps
// retention state (a non-LRU policy from construction; LRU from its first set_retention() that
// names a non-default priority); before that every block is at the default priority and the
// pool's num_evictions() counts them.
struct RetentionStats {
  struct PerClass {
    std::int64_t blocks = 0;      // blocks in this class now (held or free)
    std::uint64_t hits = 0;       // touch() of a cached block of this class
    std::uint64_t evictions = 0;  // cached blocks of this class evicted
    bool operator==(const PerClass&) const = default;
  };
  std::array<PerClass, kNumRetentionClasses> by_class{};
  std::int64_t retained_blocks = 0;    // blocks above the default priority (held or free)
  std::int64_t retained_budget = 0;    // the most that may be: the pin budget in blocks
  std::uint64_t budget_refusals = 0;   // blocks a request asked to raise above the default
                                       // that stayed at the default because the budget was full
  std::uint64_t expirations = 0;       // priorities that ran out and fell back to the default
  std::uint64_t forced_evictions = 0;  // evictions of a block above the default priority (the
                                       // pool had no lower evictable block: never wedged)
  bool operator==(const RetentionStats&) const = default;
};

}  // namespace pagedkv
