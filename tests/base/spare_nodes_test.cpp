// SpareNodes: released map entries are reused for new keys (their values as reset() left them),
// up to the bound; a node reset() declines, or one beyond the bound, is dropped.
#include "pagedkv/base/spare_nodes.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace pagedkv {
namespace {

using Map = std::unordered_map<std::uint64_t, std::vector<int>>;

bool clear_value(std::vector<int>& v) noexcept {
  v.clear();
  return true;
}

TEST(SpareNodes, ANewKeyWithoutSparesGetsAnEmptyValue) {
  Map map;
  SpareNodes<Map, 2> spares;
  const auto it = spares.insert_new(map, 7);
  EXPECT_EQ(it->first, 7u);
  EXPECT_TRUE(it->second.empty());
  EXPECT_EQ(map.size(), 1u);
}

TEST(SpareNodes, AGivenEntryLeavesTheMapAndServesTheNextKeyWithItsCapacity) {
  Map map;
  SpareNodes<Map, 2> spares;
  auto it = spares.insert_new(map, 1);
  it->second.assign(100, 5);
  const int* storage = it->second.data();
  spares.give(map, it, clear_value);
  EXPECT_TRUE(map.empty());
  EXPECT_EQ(spares.size(), 1u);

  it = spares.insert_new(map, 2);
  EXPECT_EQ(spares.size(), 0u);
  EXPECT_EQ(it->first, 2u);
  EXPECT_TRUE(it->second.empty());  // as reset() left it
  EXPECT_GE(it->second.capacity(), 100u);
  EXPECT_EQ(it->second.data(), storage);  // the same buffer: nothing allocated
  EXPECT_EQ(map.count(1), 0u);
  EXPECT_EQ(map.at(2).size(), 0u);
}

TEST(SpareNodes, KeepsAtMostNAndNoneThatResetDeclines) {
  Map map;
  SpareNodes<Map, 2> spares;
  for (std::uint64_t k = 0; k < 4; ++k) spares.insert_new(map, k);
  for (std::uint64_t k = 0; k < 4; ++k) spares.give(map, map.find(k), clear_value);
  EXPECT_TRUE(map.empty());
  EXPECT_EQ(spares.size(), 2u);

  spares.insert_new(map, 10);
  spares.insert_new(map, 11);
  spares.insert_new(map, 12);  // none left: a fresh node
  EXPECT_EQ(spares.size(), 0u);
  EXPECT_EQ(map.size(), 3u);

  spares.give(map, map.find(10), [](std::vector<int>&) noexcept { return false; });
  EXPECT_EQ(spares.size(), 0u);
  EXPECT_EQ(map.size(), 2u);
  EXPECT_EQ(map.count(10), 0u);
}

}  // namespace
}  // namespace pagedkv
