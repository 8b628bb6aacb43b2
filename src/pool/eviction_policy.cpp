#include "pagedkv/pool/eviction_policy.hpp"

#include <algorithm>
#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

std::string_view to_string(EvictionPolicy policy) noexcept {
  switch (policy) {
    case EvictionPolicy::kLru:
      return "lru";
    case EvictionPolicy::kSlru:
      return "slru";
    case EvictionPolicy::kS3Fifo:
      return "s3fifo";
    case EvictionPolicy::kLineage:
      return "lineage";
    case EvictionPolicy::kAdaptive:
      return "adaptive";
  }
  return "unknown";
}

EvictionPolicy parse_eviction_policy(std::string_view name) {
  for (std::uint8_t i = 0; i < kNumEvictionPolicies; ++i) {
    const auto p = static_cast<EvictionPolicy>(i);
    if (to_string(p) == name) return p;
  }
  throw Error(ErrorCode::kParseError, "unknown eviction policy \"" + std::string(name) +
                                          "\" (expected lru, slru, s3fifo, lineage or adaptive)");
}

int lineage_rank_of_key(const BlockHash& key) noexcept {
  // A fixed 64-bit mix (splitmix64's finalizer) of the key block's leading word.
  std::uint64_t x = key.hash_code();
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<int>(x % static_cast<std::uint64_t>(kLineageRanks));
}

int lineage_rank(std::span<const BlockHash> chain, std::size_t index,
                 std::size_t key_depth) noexcept {
  if (index < key_depth) return kLineageRanks - 1;
  return lineage_rank_of_key(chain[key_depth]);
}

LineageDepthLearner::LineageDepthLearner(std::size_t initial)
    : histogram_(kMaxLineageKeyDepth + 1, 0), depth_(std::min(initial, kMaxLineageKeyDepth)) {
  ref_.reserve(kMaxLineageKeyDepth + 1);
}

void LineageDepthLearner::observe(std::span<const BlockHash> chain) noexcept {
  const std::size_t n = std::min(chain.size(), kMaxLineageKeyDepth + 1);
  const std::size_t m = std::min(n, ref_.size());
  if (m == 0 || chain[m - 1] == ref_[m - 1]) {
    // One extends the other (or the reference is empty): no divergence, a longer reference.
    for (std::size_t i = ref_.size(); i < n; ++i) ref_.push_back(chain[i]);  // reserved
    return;
  }
  // The first depth where they differ: equal at lo - 1 (or lo == 0), different at hi.
  std::size_t lo = 0, hi = m - 1;
  while (lo < hi) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (chain[mid] == ref_[mid]) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  ++histogram_[lo];
  ++samples_;
  ref_.resize(lo);  // shrinks: no allocation
  for (std::size_t i = lo; i < n; ++i) ref_.push_back(chain[i]);
  if (samples_ % kLineageDepthWindow == 0) {
    std::uint64_t below = 0;
    for (std::size_t d = 0; d <= kMaxLineageKeyDepth; ++d) {
      below += histogram_[d];
      if (2 * below >= samples_) {
        depth_ = d;
        break;
      }
    }
  }
}

}  // namespace pagedkv
