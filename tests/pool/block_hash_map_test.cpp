#include "pagedkv/pool/block_hash_map.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>
#include <vector>

namespace pagedkv {
namespace {

BlockHash hash_of(std::uint8_t v) {
  std::array<std::uint8_t, 32> bytes{};
  bytes[0] = v;
  return BlockHash(bytes);
}

struct Fixture {
  std::vector<KVCacheBlock> blocks;
  BlockHashMap map;
  explicit Fixture(int n) : blocks(static_cast<std::size_t>(n)), map(blocks) {
    for (int i = 0; i < n; ++i) blocks[static_cast<std::size_t>(i)].block_id = i;
  }
  void cache(BlockId id, std::uint8_t v, GroupId g = 0) {
    blocks[static_cast<std::size_t>(id)].block_hash = hash_of(v);
    blocks[static_cast<std::size_t>(id)].group_id = g;
    map.insert(id);
  }
};

TEST(BlockHashMap, FirstInsertedWinsAndDuplicatesAreKept) {
  Fixture f(8);
  f.cache(3, 7);
  f.cache(1, 7);  // same content in another block
  f.cache(2, 9);
  EXPECT_EQ(f.map.size(), 3u);
  EXPECT_EQ(f.map.find_first(hash_of(7), 0), 3);
  EXPECT_EQ(f.map.find_first(hash_of(9), 0), 2);
  EXPECT_EQ(f.map.find_first(hash_of(8), 0), BlockHashMap::kEmpty);
  // A predicate skips candidates but keeps insertion order.
  EXPECT_EQ(f.map.find_first(hash_of(7), 0, [](BlockId id) { return id != 3; }), 1);
  ASSERT_TRUE(f.map.erase(3));
  EXPECT_EQ(f.map.find_first(hash_of(7), 0), 1);
  EXPECT_FALSE(f.map.erase(3));
}

TEST(BlockHashMap, GroupsSeparateEqualHashes) {
  Fixture f(8);
  f.cache(1, 5, 0);
  f.cache(2, 5, 1);
  EXPECT_EQ(f.map.find_first(hash_of(5), 0), 1);
  EXPECT_EQ(f.map.find_first(hash_of(5), 1), 2);
  EXPECT_EQ(f.map.find_first(hash_of(5), 2), BlockHashMap::kEmpty);
}

// Against a naive model under heavy collisions (4 distinct hashes for 200 blocks): after random
// inserts and erases, lookups still return the first inserted live block of each hash.
TEST(BlockHashMap, MatchesInsertionOrderModelUnderCollisions) {
  constexpr int kBlocks = 200;
  Fixture f(kBlocks);
  std::vector<BlockId> order;  // live entries in insertion order
  std::mt19937 rng(7);
  for (int step = 0; step < 20000; ++step) {
    const BlockId id = static_cast<BlockId>(rng() % kBlocks);
    const bool live = f.blocks[static_cast<std::size_t>(id)].is_cached();
    if (live) {
      ASSERT_TRUE(f.map.erase(id));
      f.blocks[static_cast<std::size_t>(id)].block_hash = BlockHash();
      order.erase(std::find(order.begin(), order.end(), id));
    } else {
      f.cache(id, static_cast<std::uint8_t>(rng() % 4));
      order.push_back(id);
    }
    ASSERT_EQ(f.map.size(), order.size());
    for (std::uint8_t v = 0; v < 4; ++v) {
      BlockId expected = BlockHashMap::kEmpty;
      for (const BlockId o : order) {
        if (f.blocks[static_cast<std::size_t>(o)].block_hash == hash_of(v)) {
          expected = o;
          break;
        }
      }
      ASSERT_EQ(f.map.find_first(hash_of(v), 0), expected) << "step " << step;
    }
  }
}

}  // namespace
}  // namespace pagedkv
