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
//    block is cached it gets a rank, a pure function of its chain and the key depth d
//    (lineage_rank() below): the blocks of one lineage (every block at depth >= d under the same
//    block at depth d) share one rank, drawn by a fixed hash of that block's hash; the shallow
//    blocks above it get the top rank. A block freed without a hit since it was cached goes to its
//    rank's list; one that was hit goes to a protected list, which holds at most
//    kLineageProtectedPercent of the pool's free cached blocks (its oldest go back to the tail
//    of their rank's list past that). Eviction takes the lowest non-empty rank's oldest block
//    (a bitmap of ranks per priority level), protected last, except that a list's oldest block
//    queued more than kLineageMaxAgePools pools' worth of queued blocks ago is evicted first
//    (checked at one rank per eviction, in turn, and at protected: O(1)). So the pool keeps
//    whole lineages of the highest ranks that fit, the same ones over time, instead of the most
//    recent blocks. The key depth (BlockPoolConfig::lineage_key_depth, default kLineageKeyDepth:
//    32 blocks of 16 tokens, the Mooncake trace's shared 512-token head) must be at least the
//    length of the head that the workload's prompts share: with a longer shared head every
//    lineage gets one rank and the policy falls back to LRU's order. With
//    BlockPoolConfig::lineage_adaptive_depth the pool learns it (LineageDepthLearner below).
//  - kAdaptive: SLRU whose protected share is a target p adapted online, ARC-style, between LRU
//    (p = 0) and SLRU-like behaviour. Two ghost FIFOs hold the 64-bit fingerprints of recently
//    evicted cached blocks (B1: evicted without a hit since cached, B2: after one), each the last
//    kAdaptiveGhostPercent of the pool's block count evictions into it. When the pool caches a
//    block whose fingerprint is in B1, p falls; in B2, p rises; by ARC's step (max(1, |other
//    ghost| / |its ghost|) blocks of the pool), clamped to [0, kAdaptiveScale]. In pools
//    large enough, the ghosts keep a fixed sample of fingerprints only (1 in 2^s, s <= 4: see
//    adaptive_ghost_sample_shift) and each sampled ghost hit moves p 2^s steps, so most blocks
//    cost no ghost-table access. Lookups change nothing. Eviction as kSlru with share p instead
//    of 80% (BlockPool::adaptive_protected_target() reports p). O(1) expected per block; the
//    ghosts are allocated at pool construction (12 to 20 bytes per block, divided by 2^s).
// Free uncached blocks are handed out before any cached one under every policy; retention
// priorities order eviction across classes before the policy orders it within one.
// Errors: parse_eviction_policy throws pagedkv::Error (kParseError) naming the bad string.
// Thread safety: plain values and pure functions, except LineageDepthLearner (not thread safe).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "pagedkv/hash/block_hash.hpp"

namespace pagedkv {

enum class EvictionPolicy : std::uint8_t {
  kLru = 0,
  kSlru = 1,
  kS3Fifo = 2,
  kLineage = 3,
  kAdaptive = 4
};
inline constexpr std::uint8_t kNumEvictionPolicies = 5;

// kLineage's parameters (bench/results/eviction.md, 2026-12-04: tuned on the first 2,000
// Mooncake requests).
inline constexpr std::size_t kLineageKeyDepth = 32;
inline constexpr int kLineageRanks = 64;
inline constexpr int kLineageProtectedPercent = 50;
// A list's oldest block queued more than this many pools' worth of queued blocks ago counts as
// dead (its lineage stopped coming back): one rank's head (in turn) and protected's head are
// checked at each eviction and evicted first if dead.
inline constexpr int kLineageMaxAgePools = 8;

// kAdaptive's parameters (bench/results/eviction.md, 2026-12-04 evening: tuned on the first
// 2,000 Mooncake requests and the agents workload): protected's target share starts at
// kAdaptiveInitialPercent of a level's free cached blocks and moves in units of
// 1 / kAdaptiveScale of it; each ghost FIFO holds kAdaptiveGhostPercent of the pool's blocks.
inline constexpr std::int64_t kAdaptiveScale = std::int64_t{1} << 24;
inline constexpr std::int64_t kAdaptiveInitialPercent = 80;
inline constexpr std::size_t kAdaptiveGhostPercent = 25;
// The ghosts track a fixed sample of fingerprints, 1 in 2^s, with s the largest value up to
// kAdaptiveGhostMaxSampleShift that leaves each FIFO at least kAdaptiveGhostMinSampled entries
// (0 for small pools: every fingerprint). Each sampled ghost hit moves the target 2^s steps.
inline constexpr std::size_t kAdaptiveGhostMinSampled = 512;
inline constexpr int kAdaptiveGhostMaxSampleShift = 4;
// kAdaptive's sample shift s for ghost FIFOs of `cap` entries (see above).
constexpr int adaptive_ghost_sample_shift(std::size_t cap) noexcept {
  int s = 0;
  while (s < kAdaptiveGhostMaxSampleShift && (cap >> (s + 1)) >= kAdaptiveGhostMinSampled) ++s;
  return s;
}

// The largest lineage key depth a pool accepts or learns (blocks).
inline constexpr std::size_t kMaxLineageKeyDepth = 1024;

// kLineage's rank of the block at `index` of a chain whose block hashes are `chain` (index <
// chain.size()) for key depth `key_depth`: kLineageRanks - 1 when index < key_depth, else a
// fixed hash of chain[key_depth] mapped to 0 .. kLineageRanks - 1 (rank 0 is evicted first).
int lineage_rank(std::span<const BlockHash> chain, std::size_t index,
                 std::size_t key_depth = kLineageKeyDepth) noexcept;
// The rank of every block at depth >= key_depth of a chain whose block at key_depth hashes to
// `key` (lineage_rank() is this for index >= key_depth).
int lineage_rank_of_key(const BlockHash& key) noexcept;

// Learns kLineage's key depth from the chains a pool stores: the depth at which prompts diverge.
// Each observed chain is compared with the last one that diverged from its predecessor (a chain
// that extends it or that it extends, as a request's next decode block or a conversation's next
// turn, is no sample: it only extends the reference). The sample is the first depth at which the
// two differ (found by binary search: chain hashes are prefix hashes, so equal hashes at a depth
// mean equal prefixes up to it). Every kLineageDepthWindow samples the depth becomes the median of
// all samples so far (capped at kMaxLineageKeyDepth); until the first window it is `initial`.
// Complexity: observe() is O(log kMaxLineageKeyDepth) plus O(the blocks it copies into the
// reference, at most kMaxLineageKeyDepth + 1), and O(kMaxLineageKeyDepth) once per window.
// Memory: allocated by the constructor only (observe() never allocates).
// Thread safety: none (the pool's).
inline constexpr std::uint32_t kLineageDepthWindow = 64;
class LineageDepthLearner {
 public:
  explicit LineageDepthLearner(std::size_t initial);
  void observe(std::span<const BlockHash> chain) noexcept;
  std::size_t depth() const noexcept { return depth_; }
  std::uint64_t samples() const noexcept { return samples_; }

 private:
  std::vector<BlockHash> ref_;            // up to kMaxLineageKeyDepth + 1 hashes (reserved)
  std::vector<std::uint64_t> histogram_;  // samples by divergence depth, 0..kMaxLineageKeyDepth
  std::uint64_t samples_ = 0;
  std::size_t depth_;
};

// "lru", "slru", "s3fifo", "lineage", "adaptive".
std::string_view to_string(EvictionPolicy policy) noexcept;
// The policy named by to_string(). Throws pagedkv::Error (kParseError) naming `name` otherwise.
EvictionPolicy parse_eviction_policy(std::string_view name);

}  // namespace pagedkv
