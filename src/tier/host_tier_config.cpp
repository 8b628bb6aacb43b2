#include "pagedkv/tier/host_tier_config.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

std::string_view to_string(HostPolicy policy) noexcept {
  switch (policy) {
    case HostPolicy::kWriteThrough:
      return "write_through";
    case HostPolicy::kWriteThroughSelective:
      return "write_through_selective";
    case HostPolicy::kWriteBack:
      return "write_back";
  }
  return "?";
}

std::optional<HostPolicy> parse_host_policy(std::string_view text) noexcept {
  for (const HostPolicy p :
       {HostPolicy::kWriteThrough, HostPolicy::kWriteThroughSelective, HostPolicy::kWriteBack}) {
    if (text == to_string(p)) return p;
  }
  return std::nullopt;
}

std::int32_t HostTierConfig::blocks_for_bytes(std::uint64_t bytes, std::uint64_t bytes_per_block) {
  if (bytes_per_block == 0) {
    throw Error(ErrorCode::kInvalidArgument, "HostTierConfig::blocks_for_bytes: 0 bytes per block");
  }
  const std::uint64_t n = bytes / bytes_per_block;
  return static_cast<std::int32_t>(std::min<std::uint64_t>(n, 0x7ffffffe));
}

}  // namespace pagedkv
