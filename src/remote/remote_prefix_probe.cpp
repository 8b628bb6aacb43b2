#include "pagedkv/remote/remote_prefix_probe.hpp"

#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

std::string_view to_string(PrefetchPolicy policy) noexcept {
  switch (policy) {
    case PrefetchPolicy::kBestEffort:
      return "best_effort";
    case PrefetchPolicy::kWaitComplete:
      return "wait_complete";
    case PrefetchPolicy::kTimeout:
      return "timeout";
  }
  return "unknown";
}

PrefetchPolicy parse_prefetch_policy(std::string_view name) {
  if (name == "best_effort") return PrefetchPolicy::kBestEffort;
  if (name == "wait_complete") return PrefetchPolicy::kWaitComplete;
  if (name == "timeout") return PrefetchPolicy::kTimeout;
  throw Error(ErrorCode::kParseError, "unknown prefetch policy '" + std::string(name) +
                                          "' (expected best_effort, wait_complete or timeout)");
}

bool RemotePrefixProbe::start(RemoteStore& store, std::span<const BlockHash> keys,
                              PrefetchPolicy policy, Clock::time_point deadline) {
  if (started_) {
    throw Error(ErrorCode::kInvalidState,
                "RemotePrefixProbe::start: already started; reset() first");
  }
  std::vector<std::uint8_t> state(keys.size(), 0);  // allocated before submitting: strong guarantee
  const auto ticket = store.exists(keys);           // may throw: nothing changed
  state_ = std::move(state);
  run_ = 0;
  completed_ = 0;
  policy_ = policy;
  deadline_ = deadline;
  started_ = true;
  refused_ = !ticket.has_value();
  ticket_ = ticket.value_or(0);
  return ticket.has_value();
}

std::size_t RemotePrefixProbe::absorb(std::span<const RemoteCompletion> completions) noexcept {
  if (!started_ || refused_) return 0;
  std::size_t taken = 0;
  for (const RemoteCompletion& c : completions) {
    if (c.ticket != ticket_ || c.kind != RemoteOpKind::kExists || c.index >= state_.size() ||
        state_[c.index] != 0) {
      continue;
    }
    state_[c.index] = c.result == RemoteResult::kHit ? 1 : 2;
    ++completed_;
    ++taken;
  }
  while (run_ < state_.size() && state_[run_] == 1) ++run_;
  return taken;
}

bool RemotePrefixProbe::ready(Clock::time_point now) const noexcept {
  if (!started_) return false;
  if (complete()) return true;
  // Once the leading run has ended (a miss or failure), later results cannot extend it.
  if (run_ < state_.size() && state_[run_] == 2) return true;
  switch (policy_) {
    case PrefetchPolicy::kBestEffort:
      return true;
    case PrefetchPolicy::kWaitComplete:
      return false;
    case PrefetchPolicy::kTimeout:
      return now >= deadline_;
  }
  return true;
}

void RemotePrefixProbe::reset() noexcept {
  state_.clear();
  run_ = 0;
  completed_ = 0;
  ticket_ = 0;
  started_ = false;
  refused_ = false;
}

}  // namespace pagedkv
