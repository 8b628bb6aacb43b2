// pagedkv/remote/latency_histogram.hpp: a fixed-size latency histogram for remote operations.
//
// Log-linear buckets over microseconds: values below 16 us have one bucket each; above, every
// power of two is split into 16 buckets, so a reported percentile is the upper edge of the bucket
// holding it, at most 1/16 (6.25%) above the true value. Values above ~2^27 us (134 s) land in
// the last bucket. The bucket array is sized at compile time: recording never allocates.
//
// Thread safety: record() may run concurrently on any threads (relaxed atomic counters);
// snapshot() may run concurrently with record() and sees some consistent-enough mix (each bucket
// is read once). Complexity: record O(1); percentile O(buckets).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace pagedkv {

class LatencyHistogram {
 public:
  static constexpr int kSubBits = 4;  // 16 buckets per power of two
  static constexpr int kMaxPow = 27;  // values up to 2^27 us
  static constexpr std::size_t kBuckets = (kMaxPow - kSubBits + 2) << kSubBits;

  // A copy of the counts, from which percentiles are read.
  struct Snapshot {
    std::array<std::uint64_t, kBuckets> counts{};
    std::uint64_t total = 0;
    // The smallest bucket upper edge (in microseconds) below or at which a fraction q of the
    // recorded values lie; 0 when nothing was recorded. q in [0, 1].
    std::uint64_t percentile_us(double q) const noexcept;
  };

  void record(std::chrono::nanoseconds latency) noexcept;
  Snapshot snapshot() const noexcept;

  // Bucket arithmetic (public for tests).
  static std::size_t bucket_of(std::uint64_t us) noexcept;
  static std::uint64_t upper_edge_us(std::size_t bucket) noexcept;

 private:
  std::array<std::atomic<std::uint64_t>, kBuckets> counts_{};
};

}  // namespace pagedkv
