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
  }
  return "unknown";
}

EvictionPolicy parse_eviction_policy(std::string_view name) {
  for (std::uint8_t i = 0; i < kNumEvictionPolicies; ++i) {
    const auto p = static_cast<EvictionPolicy>(i);
    if (to_string(p) == name) return p;
  }
  throw Error(ErrorCode::kParseError, "unknown eviction policy \"" + std::string(name) +
                                          "\" (expected lru, slru or s3fifo)");
}

}  // namespace pagedkv
