#include "pagedkv/manager/prefix_cache_stats.hpp"

#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

PrefixCacheStatsRecorder::PrefixCacheStatsRecorder(std::size_t window) {
  if (window == 0) {
    throw Error(ErrorCode::kInvalidArgument, "PrefixCacheStatsRecorder: window must be >= 1");
  }
  if (window > ring_.max_size()) {  // a length_error from assign() would name nothing
    throw Error(ErrorCode::kInvalidArgument, "PrefixCacheStatsRecorder: window " +
                                                 std::to_string(window) +
                                                 " exceeds the largest ring buffer of " +
                                                 std::to_string(ring_.max_size()) + " entries");
  }
  ring_.assign(window, {0, 0});
}

void PrefixCacheStatsRecorder::record(std::uint64_t num_tokens, std::uint64_t num_hits) noexcept {
  ++requests_;
  queries_ += num_tokens;
  hits_ += num_hits;
  auto& slot = ring_[next_];
  if (filled_ == ring_.size()) {  // the oldest entry leaves the window
    window_queries_ -= slot.first;
    window_hits_ -= slot.second;
  } else {
    ++filled_;
  }
  slot = {num_tokens, num_hits};
  window_queries_ += num_tokens;
  window_hits_ += num_hits;
  next_ = (next_ + 1) % ring_.size();
}

PrefixCacheStats PrefixCacheStatsRecorder::stats(std::uint64_t evictions) const noexcept {
  PrefixCacheStats s;
  s.requests = requests_;
  s.queries = queries_;
  s.hits = hits_;
  s.evictions = evictions;
  s.recent_requests = filled_;
  s.recent_hit_rate = window_queries_ == 0 ? 0.0
                                           : static_cast<double>(window_hits_) /
                                                 static_cast<double>(window_queries_);
  return s;
}

void PrefixCacheStatsRecorder::reset() noexcept {
  requests_ = queries_ = hits_ = 0;
  reset_window();
}

void PrefixCacheStatsRecorder::reset_window() noexcept {
  for (auto& slot : ring_) slot = {0, 0};
  next_ = filled_ = 0;
  window_queries_ = window_hits_ = 0;
}

}  // namespace pagedkv
