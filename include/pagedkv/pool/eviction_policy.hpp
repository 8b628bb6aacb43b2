// pagedkv/pool/eviction_policy.hpp: the free-block queue's eviction policy (BlockPoolConfig).
//
// kLru (the default) is the pool's historical behaviour, bit for bit: a free cached block goes to
// the queue's tail and the head is evicted first. The others are online, O(1) per block, and
// keep a block that was hit longer than one that was only stored (docs/retention.md):
//  - kSlru: segmented LRU. A block freed without a hit since it was cached enters a probation
//    segment; one that was hit enters a protected segment, which holds at most 80% of the free
//    cached blocks of its priority (its oldest block moves back to probation's tail past that).
//    Probation is evicted first, each segment in LRU order.
//  - kS3Fifo: S3-FIFO adapted to a free-block queue. Blocks freed without a hit enter a small
//    FIFO (10% of the free cached blocks of their priority); hit blocks enter the main FIFO and
//    carry a 2-bit hit count. Eviction takes the small FIFO's oldest while it holds 10% or more
//    (or main is empty), else main's oldest, which is moved to main's tail with one hit less
//    while its count is above 0 (at most 3 moves per hit: O(1) amortized). Without S3-FIFO's
//    ghost queue: a ghost of recently evicted block hashes (re-stored blocks entering main) was
//    measured and made the Mooncake replay worse (bench/results/eviction.md).
// Free uncached blocks are handed out before any cached one under every policy; retention
// priorities order eviction across classes before the policy orders it within one.
// Errors: parse_eviction_policy throws pagedkv::Error (kParseError) naming the bad string.
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string_view>

namespace pagedkv {

enum class EvictionPolicy : std::uint8_t { kLru = 0, kSlru = 1, kS3Fifo = 2 };
inline constexpr std::uint8_t kNumEvictionPolicies = 3;

// "lru", "slru", "s3fifo".
std::string_view to_string(EvictionPolicy policy) noexcept;
// The policy named by to_string(). Throws pagedkv::Error (kParseError) naming `name` otherwise.
EvictionPolicy parse_eviction_policy(std::string_view name);

}  // namespace pagedkv
