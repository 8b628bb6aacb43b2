// detail::reserve_more_keys (src/base/map_growth.hpp): after it, inserting the keys it made room
// for never rehashes, and a map whose size goes up and down keeps its buckets instead of shrinking
// and regrowing them as reserve(size() + 1) does.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>

#include "base/map_growth.hpp"

namespace pagedkv {
namespace {

using Map = std::unordered_map<std::uint64_t, int>;

// Inserting what was reserved keeps the bucket array (a rehash would change the count): from the
// empty map's single bucket, through growth, at several load factors and batch sizes.
TEST(MapGrowth, InsertingTheReservedKeysNeverRehashes) {
  std::mt19937_64 rng(7);
  for (const float load : {1.0f, 0.5f, 0.75f, 2.0f}) {
    Map m;
    m.max_load_factor(load);
    std::uint64_t key = 0;
    for (int step = 0; step < 4000; ++step) {
      const std::size_t n = 1 + rng() % 4;
      if (rng() % 3 == 0) {
        for (std::size_t i = 0; i < n && !m.empty(); ++i) m.erase(m.begin());
        continue;
      }
      detail::reserve_more_keys(m, n);
      const std::size_t buckets = m.bucket_count();
      for (std::size_t i = 0; i < n; ++i) m.emplace(key++, 0);
      ASSERT_EQ(m.bucket_count(), buckets) << "load factor " << load << ", step " << step;
    }
  }
}

// A map filled to 8 and emptied 1,000 times: its buckets grow a few times and then stay.
// reserve(size() + 1) before each insert rehashes thousands of times (libstdc++ shrinks).
TEST(MapGrowth, AMapThatFillsAndEmptiesKeepsItsBuckets) {
  Map m;
  std::size_t changes = 0;
  std::size_t last = m.bucket_count();
  std::uint64_t key = 0;
  for (int round = 0; round < 1000; ++round) {
    for (int i = 0; i < 8; ++i) {
      detail::reserve_more_keys(m, 1);
      if (m.bucket_count() != last) {
        ++changes;
        last = m.bucket_count();
      }
      m.emplace(key++, 0);
    }
    while (!m.empty()) m.erase(m.begin());
  }
  EXPECT_LE(changes, 4u);
}

// Growth is geometric: 100,000 keys inserted one at a time rehash a logarithmic number of times.
TEST(MapGrowth, GrowthIsGeometric) {
  std::unordered_map<std::string, int> m;
  std::size_t changes = 0;
  std::size_t last = m.bucket_count();
  for (int i = 0; i < 100000; ++i) {
    detail::reserve_more_keys(m, 1);
    if (m.bucket_count() != last) {
      ++changes;
      last = m.bucket_count();
    }
    m.emplace(std::to_string(i), i);
  }
  EXPECT_LE(changes, 20u);
}

}  // namespace
}  // namespace pagedkv
