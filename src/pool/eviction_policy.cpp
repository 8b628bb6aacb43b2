#include "pagedkv/pool/eviction_policy.hpp"

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
  }
  return "unknown";
}

EvictionPolicy parse_eviction_policy(std::string_view name) {
  for (std::uint8_t i = 0; i < kNumEvictionPolicies; ++i) {
    const auto p = static_cast<EvictionPolicy>(i);
    if (to_string(p) == name) return p;
  }
  throw Error(ErrorCode::kParseError, "unknown eviction policy \"" + std::string(name) +
                                          "\" (expected lru, slru, s3fifo or lineage)");
}

int lineage_rank(std::span<const BlockHash> chain, std::size_t index) noexcept {
  if (index < kLineageKeyDepth) return kLineageRanks - 1;
  // A fixed 64-bit mix (splitmix64's finalizer) of the key block's leading word.
  std::uint64_t x = chain[kLineageKeyDepth].hash_code();
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<int>(x % static_cast<std::uint64_t>(kLineageRanks));
}

}  // namespace pagedkv
