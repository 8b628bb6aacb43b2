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
//  - kLineage: keeps a stable subset of prefix lineages (for reuse that comes back after more
//    than a pool's worth of other blocks, where recency and hit counts carry no signal). When a
//    block is cached it gets a rank, a pure function of its chain (lineage_rank() below): the
//    blocks of one lineage (every block at depth >= kLineageKeyDepth under the same block at
//    that depth) share one rank, drawn by a fixed hash of that block's hash; the shallow blocks
//    above it get the top rank. A block freed without a hit since it was cached goes to its
//    rank's list; one that was hit goes to a protected list, which holds at most
//    kLineageProtectedPercent of the pool's free cached blocks (its oldest go back to the tail
//    of their rank's list past that). Eviction takes the lowest non-empty rank's oldest block
//    (a bitmap of ranks per priority level), protected last, except that a list's oldest block
//    queued more than kLineageMaxAgePools pools' worth of queued blocks ago is evicted first
//    (checked at one rank per eviction, in turn, and at protected: O(1)). So the pool keeps
//    whole lineages of the highest ranks that fit, the same ones over time, instead of the most
//    recent blocks. kLineageKeyDepth (32 blocks of 16 tokens) is the Mooncake trace's shared
//    512-token head; a workload whose shared head is longer puts every lineage in the top rank.
// Free uncached blocks are handed out before any cached one under every policy; retention
// priorities order eviction across classes before the policy orders it within one.
// Errors: parse_eviction_policy throws pagedkv::Error (kParseError) naming the bad string.
// Thread safety: plain values and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "pagedkv/hash/block_hash.hpp"

namespace pagedkv {

enum class EvictionPolicy : std::uint8_t { kLru = 0, kSlru = 1, kS3Fifo = 2, kLineage = 3 };
inline constexpr std::uint8_t kNumEvictionPolicies = 4;

// kLineage's parameters (bench/results/eviction.md, 2026-12-04: tuned on the first 2,000
// Mooncake requests).
inline constexpr std::size_t kLineageKeyDepth = 32;
inline constexpr int kLineageRanks = 64;
inline constexpr int kLineageProtectedPercent = 50;
// A list's oldest block queued more than this many pools' worth of queued blocks ago counts as
// dead (its lineage stopped coming back): one rank's head (in turn) and protected's head are
// checked at each eviction and evicted first if dead.
inline constexpr int kLineageMaxAgePools = 8;

// kLineage's rank of the block at `index` of a chain whose block hashes are `chain` (index <
// chain.size()): kLineageRanks - 1 when index < kLineageKeyDepth, else a fixed hash of
// chain[kLineageKeyDepth] mapped to 0 .. kLineageRanks - 1 (rank 0 is evicted first).
int lineage_rank(std::span<const BlockHash> chain, std::size_t index) noexcept;

// "lru", "slru", "s3fifo", "lineage".
std::string_view to_string(EvictionPolicy policy) noexcept;
// The policy named by to_string(). Throws pagedkv::Error (kParseError) naming `name` otherwise.
EvictionPolicy parse_eviction_policy(std::string_view name);

}  // namespace pagedkv
