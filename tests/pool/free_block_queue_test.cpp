#include "pagedkv/pool/free_block_queue.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace pagedkv {
namespace {

TEST(FreeBlockQueue, StartsInIdOrderAndPopsFromTheHead) {
  FreeBlockQueue q(6, 1);
  EXPECT_EQ(q.size(), 5);
  EXPECT_EQ(q.ids(), (std::vector<BlockId>{1, 2, 3, 4, 5}));
  EXPECT_FALSE(q.contains(0));
  EXPECT_EQ(q.popleft(), 1);
  std::vector<BlockId> out;
  q.popleft_n(2, out);
  EXPECT_EQ(out, (std::vector<BlockId>{2, 3}));
  EXPECT_EQ(q.ids(), (std::vector<BlockId>{4, 5}));
  EXPECT_FALSE(q.contains(2));
}

TEST(FreeBlockQueue, RemoveFromAnywhere) {
  FreeBlockQueue q(6, 1);
  q.remove(3);  // middle
  q.remove(1);  // head
  q.remove(5);  // tail
  EXPECT_EQ(q.ids(), (std::vector<BlockId>{2, 4}));
  EXPECT_EQ(q.front(), 2);
  EXPECT_EQ(q.back(), 4);
  q.remove(2);
  q.remove(4);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.front(), kQueueEnd);
  EXPECT_EQ(q.back(), kQueueEnd);
}

TEST(FreeBlockQueue, AppendAndPrependGroupsKeepTheirOrder) {
  FreeBlockQueue q(8, 1);
  std::vector<BlockId> all;
  q.popleft_n(7, all);
  q.append_n(std::vector<BlockId>{3, 1});
  q.prepend_n(std::vector<BlockId>{5, 2});  // 5 becomes the head, then 2
  q.append_n(std::vector<BlockId>{7});
  q.prepend_n(std::vector<BlockId>{6});
  EXPECT_EQ(q.ids(), (std::vector<BlockId>{6, 5, 2, 3, 1, 7}));
  EXPECT_EQ(q.size(), 6);
  // Links stay consistent both ways.
  BlockId prev = kQueueEnd;
  for (BlockId id = q.front(); id != kQueueEnd; id = q.next(id)) {
    EXPECT_EQ(q.prev(id), prev);
    prev = id;
  }
  EXPECT_EQ(prev, q.back());
}

}  // namespace
}  // namespace pagedkv
