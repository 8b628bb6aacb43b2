#include "pagedkv/remote/latency_histogram.hpp"

#include <bit>
#include <cmath>

namespace pagedkv {

std::size_t LatencyHistogram::bucket_of(std::uint64_t us) noexcept {
  constexpr std::uint64_t kLinear = std::uint64_t{1} << kSubBits;
  if (us < kLinear) return static_cast<std::size_t>(us);
  const int pow = std::bit_width(us) - 1;  // >= kSubBits
  if (pow > kMaxPow) return kBuckets - 1;
  const std::uint64_t sub = (us >> (pow - kSubBits)) & (kLinear - 1);
  return static_cast<std::size_t>(kLinear + (std::uint64_t(pow - kSubBits) << kSubBits) + sub);
}

std::uint64_t LatencyHistogram::upper_edge_us(std::size_t bucket) noexcept {
  constexpr std::uint64_t kLinear = std::uint64_t{1} << kSubBits;
  if (bucket < kLinear) return bucket;
  const std::uint64_t pow = kSubBits + (bucket - kLinear) / kLinear;
  const std::uint64_t sub = (bucket - kLinear) % kLinear;
  return ((kLinear + sub + 1) << (pow - kSubBits)) - 1;
}

void LatencyHistogram::record(std::chrono::nanoseconds latency) noexcept {
  const auto ns = latency.count();
  const std::uint64_t us = ns <= 0 ? 0 : static_cast<std::uint64_t>(ns) / 1000;
  counts_[bucket_of(us)].fetch_add(1, std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::snapshot() const noexcept {
  Snapshot s;
  for (std::size_t i = 0; i < kBuckets; ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.total += s.counts[i];
  }
  return s;
}

std::uint64_t LatencyHistogram::Snapshot::percentile_us(double q) const noexcept {
  if (total == 0) return 0;
  if (!(q > 0)) q = 0;
  if (q > 1) q = 1;
  // The rank-th smallest value (1-based), rank >= 1.
  std::uint64_t rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total)));
  if (rank == 0) rank = 1;
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < kBuckets; ++i) {
    seen += counts[i];
    if (seen >= rank) return upper_edge_us(i);
  }
  return upper_edge_us(kBuckets - 1);
}

}  // namespace pagedkv
