#include "pagedkv/remote/latency_histogram.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

namespace pagedkv {
namespace {

using std::chrono::microseconds;

TEST(LatencyHistogram, BucketsAreContiguousAndEdgesWithinOneSixteenth) {
  std::size_t prev = 0;
  for (std::uint64_t us = 0; us < (std::uint64_t{1} << 22); us += 1 + us / 64) {
    const std::size_t b = LatencyHistogram::bucket_of(us);
    ASSERT_LT(b, LatencyHistogram::kBuckets);
    ASSERT_GE(b, prev) << us;
    ASSERT_LE(b, prev + 1) << us;  // no bucket skipped
    prev = b;
    const std::uint64_t edge = LatencyHistogram::upper_edge_us(b);
    ASSERT_GE(edge, us) << us;
    ASSERT_LE(static_cast<double>(edge), static_cast<double>(us) * 1.0625 + 1.0) << us;
    ASSERT_EQ(LatencyHistogram::bucket_of(edge), b) << us;
    ASSERT_EQ(LatencyHistogram::bucket_of(edge + 1), b + 1) << us;
  }
  EXPECT_EQ(LatencyHistogram::bucket_of(~std::uint64_t{0}), LatencyHistogram::kBuckets - 1);
}

TEST(LatencyHistogram, PercentilesMatchSortedSamples) {
  LatencyHistogram h;
  EXPECT_EQ(h.snapshot().percentile_us(0.5), 0u);
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> dist(5.0, 1.5);
  std::vector<std::uint64_t> samples;
  for (int i = 0; i < 20000; ++i) {
    const auto us = static_cast<std::uint64_t>(dist(rng));
    samples.push_back(us);
    h.record(microseconds(us));
  }
  std::sort(samples.begin(), samples.end());
  const auto s = h.snapshot();
  EXPECT_EQ(s.total, samples.size());
  for (double q : {0.5, 0.9, 0.99, 1.0}) {
    const std::uint64_t exact = samples[static_cast<std::size_t>(q * samples.size()) - 1];
    const std::uint64_t got = s.percentile_us(q);
    EXPECT_GE(got, exact) << q;
    EXPECT_LE(static_cast<double>(got), static_cast<double>(exact) * 1.0625 + 1.0) << q;
  }
}

TEST(LatencyHistogram, ConcurrentRecordsAllCounted) {
  LatencyHistogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&h, t] {
      for (int i = 0; i < 10000; ++i) h.record(microseconds(t * 1000 + i % 100));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(h.snapshot().total, 40000u);
  EXPECT_EQ(h.snapshot().percentile_us(0.0), 0u);  // smallest sample is 0 us
  // Negative durations (clock skew) count as 0 us.
  h.record(std::chrono::nanoseconds(-5));
  EXPECT_EQ(h.snapshot().total, 40001u);
}

}  // namespace
}  // namespace pagedkv
