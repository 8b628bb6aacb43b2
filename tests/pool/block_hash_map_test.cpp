#include "pagedkv/pool/block_hash_map.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
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
  explicit Fixture(int n, std::size_t slots_per_block = 2)
      : blocks(static_cast<std::size_t>(n)), map(blocks, slots_per_block) {
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

// insert_tagged_if_new_tag() inserts exactly when no entry of the key's probe run carries the
// same tag (so never beside an entry of the same key), and changes nothing otherwise.
TEST(BlockHashMap, InsertIfNewTagRefusesAnyEntryWithTheTag) {
  Fixture f(8);
  f.cache(1, 7);
  f.blocks[2].block_hash = hash_of(7);  // the same key as block 1
  EXPECT_FALSE(f.map.insert_tagged_if_new_tag(2, BlockHashMap::key_tag(hash_of(7), 0)));
  EXPECT_EQ(f.map.size(), 1u);
  EXPECT_EQ(f.map.find_first(hash_of(7), 0, [](BlockId id) { return id != 1; }),
            BlockHashMap::kEmpty);
  f.blocks[3].block_hash = hash_of(7);  // same hash, another group: another tag
  f.blocks[3].group_id = 1;
  EXPECT_TRUE(f.map.insert_tagged_if_new_tag(3, BlockHashMap::key_tag(hash_of(7), 1)));
  f.blocks[4].block_hash = hash_of(9);
  EXPECT_TRUE(f.map.insert_tagged_if_new_tag(4, BlockHashMap::key_tag(hash_of(9), 0)));
  EXPECT_EQ(f.map.size(), 3u);
  EXPECT_EQ(f.map.find_first(hash_of(7), 1), 3);
  EXPECT_EQ(f.map.find_first(hash_of(9), 0), 4);
  // A refused insert leaves every entry where it was: erasing finds each.
  EXPECT_TRUE(f.map.erase(1));
  EXPECT_TRUE(f.map.erase(3));
  EXPECT_TRUE(f.map.erase(4));
  EXPECT_EQ(f.map.size(), 0u);
}

// insert_tagged() with the key's tag is insert(): the same entries, found the same way, erased
// the same way (in a second map, so that the two layouts can be compared slot by slot through
// lookups in insertion order).
TEST(BlockHashMap, InsertTaggedEqualsInsert) {
  Fixture a(16), b(16);
  const std::uint8_t values[] = {7, 7, 9, 3, 7, 200, 9, 1};
  for (BlockId id = 1; id <= 8; ++id) {
    const std::uint8_t v = values[id - 1];
    const GroupId g = id % 3 == 0 ? 1 : 0;
    a.cache(id, v, g);
    b.blocks[static_cast<std::size_t>(id)].block_hash = hash_of(v);
    b.blocks[static_cast<std::size_t>(id)].group_id = g;
    b.map.insert_tagged(id, BlockHashMap::key_tag(hash_of(v), g));
  }
  EXPECT_EQ(b.map.size(), a.map.size());
  for (const std::uint8_t v : values) {
    for (const GroupId g : {GroupId{0}, GroupId{1}}) {
      std::vector<BlockId> in_a, in_b;
      (void)a.map.find_first(hash_of(v), g, [&](BlockId id) {
        in_a.push_back(id);
        return false;
      });
      (void)b.map.find_first(hash_of(v), g, [&](BlockId id) {
        in_b.push_back(id);
        return false;
      });
      EXPECT_EQ(in_b, in_a) << int{v} << " group " << int{g};
    }
  }
  for (BlockId id = 1; id <= 8; ++id) {
    ASSERT_TRUE(b.map.erase(id));
    ASSERT_TRUE(a.map.erase(id));
    EXPECT_EQ(b.map.find_first(hash_of(values[id - 1]), id % 3 == 0 ? 1 : 0),
              a.map.find_first(hash_of(values[id - 1]), id % 3 == 0 ? 1 : 0));
  }
  EXPECT_EQ(b.map.size(), 0u);
}

// Against a naive model under heavy collisions (4 distinct hashes for 200 blocks): after random
// inserts and erases, lookups still return the first inserted live block of each hash.
// Both erase() paths: the windowed backward shift (2 slots per block, load up to 0.5) and the
// plain loop (4 slots per block).
class BlockHashMapLoad : public ::testing::TestWithParam<std::size_t> {};
INSTANTIATE_TEST_SUITE_P(SlotsPerBlock, BlockHashMapLoad, ::testing::Values(2, 4));

TEST_P(BlockHashMapLoad, MatchesInsertionOrderModelUnderCollisions) {
  constexpr int kBlocks = 200;
  Fixture f(kBlocks, GetParam());
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

// Distinct random hashes, the table filled nearly to its bound (load ~0.45 at 2 slots per block,
// the windowed shift's runs spanning several windows): after every insert or erase each cached
// block is found and no other, and the size matches.
TEST_P(BlockHashMapLoad, EveryLiveBlockIsFoundAfterRandomChurn) {
  constexpr int kBlocks = 256;
  Fixture f(kBlocks, GetParam());
  std::mt19937_64 rng(11);
  std::vector<char> live(kBlocks, 0);
  std::size_t count = 0;
  for (int step = 0; step < 20000; ++step) {
    const auto id = static_cast<BlockId>(1 + rng() % (kBlocks - 1));
    KVCacheBlock& b = f.blocks[static_cast<std::size_t>(id)];
    if (live[static_cast<std::size_t>(id)]) {
      if (rng() % 10 != 0) continue;  // erase rarely: about 90% of the blocks stay cached
      ASSERT_TRUE(f.map.erase(id));
      b.block_hash = BlockHash();
      live[static_cast<std::size_t>(id)] = 0;
      --count;
    } else {
      std::array<std::uint8_t, 32> bytes{};
      for (std::size_t k = 0; k < bytes.size(); k += 8) {
        const std::uint64_t x = rng();
        std::memcpy(bytes.data() + k, &x, 8);
      }
      b.block_hash = BlockHash(bytes);
      b.group_id = static_cast<GroupId>(rng() % 2);
      f.map.insert(id);
      live[static_cast<std::size_t>(id)] = 1;
      ++count;
    }
    ASSERT_EQ(f.map.size(), count);
    if (step % 16 != 0) continue;
    for (BlockId c = 1; c < kBlocks; ++c) {
      const KVCacheBlock& cb = f.blocks[static_cast<std::size_t>(c)];
      if (!live[static_cast<std::size_t>(c)]) continue;
      ASSERT_EQ(f.map.find_first(cb.block_hash, cb.group_id, [&](BlockId x) { return x == c; }), c)
          << "step " << step;
    }
  }
  // Erasing what is absent changes nothing.
  for (BlockId c = 1; c < kBlocks; ++c) {
    if (!live[static_cast<std::size_t>(c)]) {
      f.blocks[static_cast<std::size_t>(c)].block_hash = hash_of(1);
      EXPECT_FALSE(f.map.erase(c));
      f.blocks[static_cast<std::size_t>(c)].block_hash = BlockHash();
    }
  }
  EXPECT_EQ(f.map.size(), count);
}

}  // namespace
}  // namespace pagedkv
