#include "pagedkv/manager/prefix_cache_stats.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

TEST(PrefixCacheStats, TotalsAndWindow) {
  PrefixCacheStatsRecorder r(2);
  EXPECT_EQ(r.stats(0).hit_rate(), 0.0);
  EXPECT_EQ(r.stats(0).recent_hit_rate, 0.0);
  r.record(100, 50);
  r.record(100, 0);
  r.record(200, 200);  // the first query leaves the 2-query window
  const PrefixCacheStats s = r.stats(7);
  EXPECT_EQ(s.requests, 3u);
  EXPECT_EQ(s.queries, 400u);
  EXPECT_EQ(s.hits, 250u);
  EXPECT_EQ(s.evictions, 7u);
  EXPECT_DOUBLE_EQ(s.hit_rate(), 250.0 / 400.0);
  EXPECT_EQ(s.recent_requests, 2u);
  EXPECT_DOUBLE_EQ(s.recent_hit_rate, 200.0 / 300.0);
  r.reset();
  EXPECT_EQ(r.stats(0).requests, 0u);
  EXPECT_EQ(r.stats(0).recent_requests, 0u);
  EXPECT_THROW(PrefixCacheStatsRecorder(0), Error);
}

// A window too large for any ring buffer (a KVCacheManagerConfig::stats_window from outside) is a
// pagedkv::Error naming it, not std::vector's length_error.
TEST(PrefixCacheStats, HugeWindowIsAnError) {
  try {
    PrefixCacheStatsRecorder r(SIZE_MAX);
    ADD_FAILURE() << "no error for a window of SIZE_MAX";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("window"), std::string::npos) << e.what();
  }
  KVCacheManagerConfig c;
  c.num_blocks = 8;
  c.stats_window = SIZE_MAX;
  EXPECT_THROW(KVCacheManager{c}, Error);
}

}  // namespace
}  // namespace pagedkv
