#include "pagedkv/manager/retention.hpp"

#include <algorithm>
#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

namespace {

void check_priority(unsigned priority, const std::string& what) {
  if (priority > kMaxRetentionPriority) {
    throw Error(ErrorCode::kInvalidArgument, "retention: " + what + ": priority " +
                                                 std::to_string(priority) + " is above " +
                                                 std::to_string(unsigned{kMaxRetentionPriority}));
  }
}

void check_duration(const std::optional<RetentionTick>& d, const std::string& what) {
  if (d && *d <= 0) {
    throw Error(ErrorCode::kInvalidArgument, "retention: " + what + ": duration " +
                                                 std::to_string(*d) +
                                                 " is not positive (leave it unset for none)");
  }
}

// Merges one contribution into a block's retention: the higher priority wins; at equal
// priority the longer duration (none: for ever).
void merge(RetentionAsk& r, RetentionPriority priority,
           const std::optional<RetentionTick>& duration) noexcept {
  if (priority > r.priority) {
    r.priority = priority;
    r.duration = duration;
  } else if (priority == r.priority && r.duration) {
    r.duration = duration ? std::max(*r.duration, *duration) : duration;
  }
}

}  // namespace

void RetentionConfig::validate(std::size_t num_prompt_tokens) const {
  check_priority(decode_retention_priority, "decode_retention_priority");
  check_duration(decode_duration, "decode_duration");
  std::size_t previous_end = 0;
  for (std::size_t k = 0; k < token_ranges.size(); ++k) {
    const TokenRangeRetention& t = token_ranges[k];
    const std::string what = "token range " + std::to_string(k);
    check_priority(t.priority, what);
    check_duration(t.duration, what);
    const std::size_t end = t.token_end.value_or(num_prompt_tokens);
    if (end > num_prompt_tokens) {
      throw Error(ErrorCode::kOutOfRange, "retention: " + what + " ends at token " +
                                              std::to_string(end) + ", past the prompt's " +
                                              std::to_string(num_prompt_tokens) + " tokens");
    }
    if (t.token_start >= end) {
      throw Error(ErrorCode::kInvalidArgument, "retention: " + what + " [" +
                                                   std::to_string(t.token_start) + ", " +
                                                   std::to_string(end) + ") is empty");
    }
    if (k > 0 && t.token_start < previous_end) {
      throw Error(ErrorCode::kInvalidArgument,
                  "retention: " + what + " starts at token " + std::to_string(t.token_start) +
                      ", before the end " + std::to_string(previous_end) +
                      " of the range before it (ranges must be sorted and not overlap)");
    }
    previous_end = end;
  }
}

RetentionAsk retention_ask(const RetentionConfig& config, std::size_t num_prompt_tokens,
                           std::size_t begin, std::size_t end) noexcept {
  RetentionAsk r;
  r.priority = 0;  // raised by every part below; a block always has at least one part
  bool any = false;
  const std::size_t prompt_end = std::min(end, num_prompt_tokens);
  if (begin < prompt_end) {
    const auto& ranges = config.token_ranges;
    // The first range that may overlap: the last one starting at or before `begin`.
    auto it = std::upper_bound(
        ranges.begin(), ranges.end(), begin,
        [](std::size_t v, const TokenRangeRetention& t) { return v < t.token_start; });
    if (it != ranges.begin()) --it;
    std::size_t covered_to = begin;  // prompt tokens of the block before this are covered
    bool gap = false;
    for (; it != ranges.end() && it->token_start < prompt_end; ++it) {
      const std::size_t rend = it->token_end.value_or(num_prompt_tokens);
      if (rend <= begin) continue;
      if (it->token_start > covered_to) gap = true;
      covered_to = std::max(covered_to, rend);
      if (!any) {
        r.priority = it->priority;
        r.duration = it->duration;
        any = true;
      } else {
        merge(r, it->priority, it->duration);
      }
    }
    if (covered_to < prompt_end) gap = true;
    if (gap) {  // prompt tokens no range names: the default priority, which never decays
      if (!any) {
        r.priority = kDefaultRetentionPriority;
        r.duration.reset();
        any = true;
      } else {
        merge(r, kDefaultRetentionPriority, std::nullopt);
      }
    }
  }
  if (end > num_prompt_tokens) {  // generated tokens
    if (!any) {
      r.priority = config.decode_retention_priority;
      r.duration = config.decode_duration;
    } else {
      merge(r, config.decode_retention_priority, config.decode_duration);
    }
  }
  return r;
}

}  // namespace pagedkv
