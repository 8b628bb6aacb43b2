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

// An Appender's adds equal append() calls, on an empty queue and on a queue with blocks, and the
// queue is usable as usual once it has finished.
TEST(FreeBlockQueue, AppenderEqualsAppends) {
  for (const std::int32_t kept : {0, 2}) {
    FreeBlockQueue a(9, 1);
    FreeBlockQueue b(9, 1);
    std::vector<BlockId> out_a, out_b;
    a.popleft_n(8 - kept, out_a);  // leaves blocks 7, 8 when kept = 2
    b.popleft_n(8 - kept, out_b);
    {
      FreeBlockQueue::Appender tail(a);
      for (const BlockId id : {4, 1, 6}) tail.add(id);
    }
    for (const BlockId id : {4, 1, 6}) b.append(id);
    EXPECT_EQ(a.ids(), b.ids()) << kept;
    EXPECT_EQ(a.size(), b.size());
    EXPECT_EQ(a.front(), b.front());
    EXPECT_EQ(a.back(), b.back());
    for (BlockId id = 1; id < 9; ++id) {
      EXPECT_EQ(a.contains(id), b.contains(id)) << id;
      if (!a.contains(id)) continue;
      EXPECT_EQ(a.next(id), b.next(id)) << id;
      EXPECT_EQ(a.prev(id), b.prev(id)) << id;
    }
    a.prepend(2);
    a.append(3);
    EXPECT_EQ(a.popleft(), 2);
    EXPECT_EQ(a.back(), 3);
    EXPECT_EQ(a.size(), kept + 4);
  }
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
