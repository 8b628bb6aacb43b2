#include "pagedkv/pool/table_allocator.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <new>

namespace pagedkv {
namespace {

TEST(TableAllocator, LargeTablesAreHugePageAligned) {
  // 1 MiB and more: 2 MiB-aligned (so transparent huge pages can back them).
  for (const std::size_t words : {std::size_t{1} << 18, (std::size_t{3} << 19) + 5}) {
    TableVector<std::uint32_t> v(words, 7);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(v.data()) % (std::size_t{2} << 20), 0u) << words;
    EXPECT_EQ(v.front(), 7u);
    EXPECT_EQ(v.back(), 7u);
  }
}

TEST(TableAllocator, SmallAndGrowingTablesKeepTheirValues) {
  TableVector<std::uint64_t> v;
  for (std::uint64_t i = 0; i < (std::uint64_t{1} << 18); ++i) v.push_back(i);  // crosses 1 MiB
  std::uint64_t expected = 0;
  for (const std::uint64_t x : v) EXPECT_EQ(x, expected++);
  TableVector<std::uint64_t> w = v;  // copies use the same allocator
  EXPECT_EQ(w, v);
  w.clear();
  w.shrink_to_fit();
  EXPECT_TRUE(w.empty());
}

TEST(TableAllocator, InstancesAreInterchangeable) {
  EXPECT_TRUE(TableAllocator<std::uint32_t>() == TableAllocator<double>());
  EXPECT_FALSE(TableAllocator<std::uint32_t>() != TableAllocator<std::uint32_t>());
}

TEST(TableAllocator, ImpossibleSizesThrowBadAlloc) {
  TableAllocator<std::uint64_t> a;
  EXPECT_THROW((void)a.allocate(std::numeric_limits<std::size_t>::max() / 4), std::bad_alloc);
}

}  // namespace
}  // namespace pagedkv
