#include "pagedkv/pool/block_pool.hpp"
#include "pagedkv/hash/request_hasher.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "test_tokens.hpp"

namespace pagedkv {
namespace {

constexpr std::uint32_t kBlockSize = 4;

RequestBlockHasher sequence(std::vector<TokenId> tokens, RequestHashKeys keys = {},
                            BlockHasher hasher = BlockHasher(HashScheme::kSha256, "test")) {
  RequestBlockHasher seq(std::move(hasher), kBlockSize, std::move(keys));
  seq.append(tokens);
  return seq;
}

BlockPoolConfig config(std::int32_t n, bool events = true) {
  BlockPoolConfig c;
  c.num_blocks = n;
  c.block_size = kBlockSize;
  c.enable_kv_events = events;
  return c;
}

std::vector<BlockId> take(BlockPool& pool, std::int32_t n) {
  std::vector<BlockId> out;
  EXPECT_TRUE(pool.get_new_blocks(n, out));
  return out;
}

// Expects `call` to throw pagedkv::Error whose message contains `fragment`, with the pool's
// observable state exactly as before.
template <typename Call>
void expect_rejected(BlockPool& pool, Call call, const std::string& fragment) {
  const BlockPoolSnapshot before = pool.snapshot();
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.snapshot(), before) << "state changed by a rejected call";
  pool.check_invariants();
}

TEST(BlockPool, InitialState) {
  BlockPool pool(config(10));
  EXPECT_EQ(pool.num_free_blocks(), 9);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.0);
  EXPECT_TRUE(pool.null_block().is_null);
  EXPECT_FALSE(pool.free_queue().contains(kNullBlockId));
  EXPECT_EQ(pool.free_queue().ids(), (std::vector<BlockId>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  pool.check_invariants();
  EXPECT_THROW(BlockPool(config(1)), Error);
  BlockPoolConfig zero = config(4);
  zero.block_size = 0;
  EXPECT_THROW(BlockPool{zero}, Error);
}

TEST(BlockPool, OutOfBlocksIsAResultNotAnError) {
  BlockPool pool(config(4));
  const auto before = pool.snapshot();
  std::vector<BlockId> out;
  EXPECT_FALSE(pool.get_new_blocks(4, out));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(pool.snapshot(), before);
  EXPECT_TRUE(pool.get_new_blocks(3, out));
  EXPECT_EQ(out, (std::vector<BlockId>{1, 2, 3}));
  EXPECT_DOUBLE_EQ(pool.usage(), 1.0);
  EXPECT_FALSE(pool.get_new_blocks(1, out));
  pool.check_invariants();
}

// Two requests share a 2-block prefix. A: blocks 1 2 3 (cached) + 4 (partial). B: hits 1 2, then
// 5 (cached) + 6 (partial). Freeing A, then B, must give the documented queue order.
TEST(BlockPool, UnhashedBlocksFreedTogetherGoToTheHeadInTheGivenOrder) {
  // One call freeing unhashed and hashed blocks interleaved (and the null block, skipped):
  // the unhashed ones lie at the head as a group in the given order, the hashed ones at the
  // tail in the given order; a block still held stays out of the queue.
  BlockPool pool(config(10));
  const auto seq = sequence(iota_tokens(0, 8));  // 2 full blocks
  const auto blocks = take(pool, 7);
  ASSERT_EQ(blocks, (std::vector<BlockId>{1, 2, 3, 4, 5, 6, 7}));
  pool.cache_full_blocks(seq.sequence(), std::vector<BlockId>{1, 2}, 0, 2);
  pool.touch(std::vector<BlockId>{4});  // held twice: freeing once keeps it out of the queue
  pool.free_blocks(std::vector<BlockId>{6, 2, 5, kNullBlockId, 1, 4, 3, 7});
  EXPECT_EQ(pool.free_queue().ids(), (std::vector<BlockId>{6, 5, 3, 7, 8, 9, 2, 1}));
  EXPECT_EQ(pool.block(4).ref_cnt, 1);
  pool.check_invariants();
  pool.free_blocks(std::vector<BlockId>{4});
  EXPECT_EQ(pool.free_queue().front(), 4);
}

TEST(BlockPool, FreeQueueOrderAfterFreeingTwoRequestsSharingAPrefix) {
  BlockPool pool(config(10));
  const auto a_seq = sequence(iota_tokens(0, 14));  // 3 full + 2
  auto b_tokens = iota_tokens(0, 8);
  for (TokenId t : {100, 101, 102, 103, 104}) b_tokens.push_back(t);  // 3 full + 1
  const auto b_seq = sequence(b_tokens);

  const auto a = take(pool, 4);
  ASSERT_EQ(a, (std::vector<BlockId>{1, 2, 3, 4}));
  pool.cache_full_blocks(a_seq.sequence(), a, 0, 3);
  ASSERT_EQ(pool.match_cached_block(b_seq.sequence(), 0, BlockPool::kNoBlock), 1);
  ASSERT_EQ(pool.match_cached_block(b_seq.sequence(), 1, 1), 2);
  ASSERT_EQ(pool.match_cached_block(b_seq.sequence(), 2, 2), BlockPool::kNoBlock);
  std::vector<BlockId> b = {1, 2};
  pool.touch(b);
  ASSERT_TRUE(pool.get_new_blocks(2, b));
  ASSERT_EQ(b, (std::vector<BlockId>{1, 2, 5, 6}));
  pool.cache_full_blocks(b_seq.sequence(), b, 2, 3);
  pool.check_invariants();

  pool.free_blocks(std::vector<BlockId>{4, 3, 2, 1});  // A, tail first
  EXPECT_EQ(pool.free_queue().ids(), (std::vector<BlockId>{4, 7, 8, 9, 3}));
  pool.free_blocks(std::vector<BlockId>{6, 5, 2, 1});  // B, tail first
  EXPECT_EQ(pool.free_queue().ids(), (std::vector<BlockId>{6, 4, 7, 8, 9, 3, 5, 2, 1}));
  pool.check_invariants();

  // Eviction order: unhashed blocks are reused first; then each chain's tail before its head.
  pool.take_events();
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.get_new_blocks(6, got));
  EXPECT_EQ(got, (std::vector<BlockId>{6, 4, 7, 8, 9, 3}));
  EXPECT_EQ(pool.num_evictions(), 1u);
  EXPECT_FALSE(pool.block(3).is_cached());
  const auto events = pool.take_events();
  ASSERT_EQ(events.size(), 1u);
  ASSERT_TRUE(std::holds_alternative<BlockRemoved>(events[0].data));
  EXPECT_EQ(std::get<BlockRemoved>(events[0].data).block_hashes,
            std::vector<BlockHash>{a_seq.block_hashes()[2]});
  // Block 2 (the shared prefix) is still cached and hit-able: lazy eviction.
  EXPECT_EQ(pool.match_cached_block(a_seq.sequence(), 1, 1), 2);
  EXPECT_EQ(pool.match_cached_block(a_seq.sequence(), 2, 2), BlockPool::kNoBlock);
  pool.check_invariants();
}

TEST(BlockPool, LazyEvictionAndTouchingAFreeCachedBlock) {
  BlockPool pool(config(6));
  const auto seq = sequence(iota_tokens(0, 8));
  const auto blocks = take(pool, 2);
  pool.cache_full_blocks(seq.sequence(), blocks, 0, 2);
  pool.free_blocks(std::vector<BlockId>{blocks[1], blocks[0]});
  // Freed but still cached: still a hit.
  EXPECT_EQ(pool.get_cached_block(seq.block_hashes()[0]), blocks[0]);
  EXPECT_EQ(pool.match_cached_block(seq.sequence(), 0, BlockPool::kNoBlock), blocks[0]);
  EXPECT_TRUE(pool.free_queue().contains(blocks[0]));
  const auto free_before = pool.num_free_blocks();
  pool.touch(std::vector<BlockId>{blocks[0]});
  EXPECT_FALSE(pool.free_queue().contains(blocks[0]));
  EXPECT_EQ(pool.block(blocks[0]).ref_cnt, 1);
  EXPECT_EQ(pool.num_free_blocks(), free_before - 1);
  pool.touch(std::vector<BlockId>{blocks[0]});  // a second holder
  EXPECT_EQ(pool.block(blocks[0]).ref_cnt, 2);
  pool.check_invariants();
}

TEST(BlockPool, BadInputIsRejectedWithStateUnchanged) {
  BlockPool pool(config(6));
  const auto seq = sequence(iota_tokens(0, 8));
  const auto blocks = take(pool, 3);
  pool.cache_full_blocks(seq.sequence(), blocks, 0, 1);

  expect_rejected(
      pool,
      [&] {
        pool.free_blocks(std::vector<BlockId>{blocks[2], 6});
      },
      "block 6 is out of range");
  expect_rejected(
      pool,
      [&] {
        pool.free_blocks(std::vector<BlockId>{blocks[1], -1});
      },
      "out of range");
  expect_rejected(
      pool,
      [&] {
        pool.free_blocks(std::vector<BlockId>{blocks[1], blocks[1]});
      },
      "appears twice");
  expect_rejected(
      pool,
      [&] {
        pool.free_blocks(std::vector<BlockId>{blocks[0], 5});
      },
      "double free");
  expect_rejected(
      pool,
      [&] {
        pool.touch(std::vector<BlockId>{blocks[0], 99});
      },
      "out of range");
  expect_rejected(
      pool,
      [&] {
        pool.evict_blocks(std::vector<BlockId>{blocks[0], 99});
      },
      "out of range");
  expect_rejected(
      pool, [&] { pool.cache_full_blocks(seq.sequence(), blocks, 0, 2); }, "already cached");
  expect_rejected(
      pool, [&] { pool.cache_full_blocks(seq.sequence(), blocks, 1, 3); }, "beyond");
  expect_rejected(
      pool,
      [&] {
        pool.cache_full_blocks(seq.sequence(), std::vector<BlockId>{blocks[0], 5}, 1, 2);
      },
      "not allocated");
  expect_rejected(
      pool,
      [&] {
        pool.cache_full_blocks(seq.sequence(), std::vector<BlockId>{1, 0}, 1, 2);
      },
      "null block");
  expect_rejected(
      pool,
      [&] {
        std::vector<BlockId> out;
        pool.get_new_blocks(-1, out);
      },
      "negative");
  expect_rejected(
      pool, [&] { (void)pool.block(6); }, "out of range");
  RequestBlockHasher other(BlockHasher(HashScheme::kSha256, "test"), 8);
  other.append(iota_tokens(0, 8));
  expect_rejected(
      pool, [&] { pool.cache_full_blocks(other.sequence(), blocks, 1, 1); }, "block size 8");

  // A real double free, after the legitimate one.
  pool.free_blocks(blocks);
  expect_rejected(
      pool, [&] { pool.free_blocks(std::vector<BlockId>{blocks[0]}); }, "double free");
}

TEST(BlockPool, OneBlockFreeIsRejectedWithStateUnchanged) {
  BlockPool pool(config(6));
  const auto blocks = take(pool, 2);
  expect_rejected(
      pool, [&] { pool.free_blocks(std::vector<BlockId>{6}); }, "block 6 is out of range");
  expect_rejected(
      pool, [&] { pool.free_blocks(std::vector<BlockId>{-3}); }, "out of range");
  expect_rejected(
      pool, [&] { pool.free_blocks(std::vector<BlockId>{5}); }, "double free");
  expect_rejected(
      pool, [&] { pool.requeue(6); }, "block 6 is out of range");
  expect_rejected(
      pool, [&] { pool.requeue(-1); }, "out of range");
  pool.free_blocks(std::vector<BlockId>{0});  // the null block is skipped
  pool.free_blocks(std::vector<BlockId>{blocks[1]});
  EXPECT_EQ(pool.free_queue().front(), blocks[1]);  // unhashed: reused first
  pool.check_invariants();
}

// requeue(id) is touch({id}) then free_blocks({id}): same pool, for every block in every state
// (free cached at any queue position, free uncached, held, the null block).
TEST(BlockPool, RequeueEqualsTouchThenFree) {
  auto build = [](BlockPool& pool) {
    const auto seq = sequence(iota_tokens(0, 16));
    const auto blocks = take(pool, 6);
    pool.cache_full_blocks(seq.sequence(), blocks, 0, 4);
    // Cached blocks 0..3 freed (0, 1, 2 free; 3 keeps a second holder); 4 freed uncached.
    pool.touch(std::vector<BlockId>{blocks[3]});
    pool.free_blocks(std::vector<BlockId>{blocks[4], blocks[3], blocks[2], blocks[1], blocks[0]});
  };
  for (const bool events : {false, true}) {
    for (BlockId id = 0; id < 8; ++id) {
      BlockPool a(config(8, events));
      BlockPool b(config(8, events));
      build(a);
      build(b);
      a.requeue(id);
      b.touch(std::vector<BlockId>{id});
      b.free_blocks(std::vector<BlockId>{id});
      EXPECT_EQ(a.snapshot(), b.snapshot()) << "block " << id;
      EXPECT_EQ(a.free_queue().ids(), b.free_queue().ids()) << "block " << id;
      a.check_invariants();
    }
  }
  // A refreshed cached block is evicted last.
  BlockPool pool(config(8));
  build(pool);
  // Queue: blocks[4] (uncached), the never-used block 7, then cached blocks[2], [1], [0].
  const BlockId first = pool.free_queue().ids()[2];  // the oldest cached block
  ASSERT_TRUE(pool.block(first).is_cached());
  ASSERT_NE(pool.free_queue().back(), first);
  pool.requeue(first);
  EXPECT_EQ(pool.free_queue().back(), first);
}

// free_blocks_reversed(t) is free_blocks(t reversed): same pool for a request's table of cached,
// uncached, shared and null blocks, and the same errors with nothing changed.
// free_block(id) is free_blocks({id}): cached blocks to the tail, uncached ones to the head, a
// second holder kept out of the queue, the null block skipped; errors leave the pool as it was.
TEST(BlockPool, FreeBlockEqualsFreeBlocksOfOne) {
  auto build = [](BlockPool& pool) {
    const auto seq = sequence(iota_tokens(0, kBlockSize * 3));
    auto blocks = take(pool, 5);
    pool.cache_full_blocks(seq.sequence(), blocks, 0, 3);
    pool.touch(std::vector<BlockId>{blocks[1]});  // a second holder
    return blocks;                                // cached 0, 1 (held twice), 2, uncached 3, 4
  };
  BlockPool a(config(8, true));
  BlockPool b(config(8, true));
  const auto blocks = build(a);
  ASSERT_EQ(build(b), blocks);
  // The queue expected at the end, written out (free_blocks({id}) itself runs free_block()).
  std::vector<BlockId> expected = {blocks[4], blocks[3]};
  for (const BlockId id : a.free_queue().ids()) expected.push_back(id);
  for (const BlockId id : {blocks[0], blocks[2], blocks[1]}) expected.push_back(id);
  const std::vector<BlockId> order = {blocks[3], blocks[0], blocks[1], kNullBlockId,
                                      blocks[4], blocks[2], blocks[1]};
  for (const BlockId id : order) {
    a.free_block(id);
    b.free_blocks(std::vector<BlockId>{id});
    EXPECT_EQ(a.snapshot(), b.snapshot()) << "after block " << id;
    EXPECT_EQ(a.free_queue().ids(), b.free_queue().ids()) << "after block " << id;
    a.check_invariants();
  }
  // Uncached blocks at the head (reused first), cached ones at the tail in freeing order; the
  // block held twice joins the queue at its second free.
  EXPECT_EQ(a.free_queue().ids(), expected);
  expect_rejected(
      a, [&] { a.free_block(8); }, "block 8 is out of range");
  expect_rejected(
      a, [&] { a.free_block(-1); }, "out of range");
  expect_rejected(
      a, [&] { a.free_block(blocks[0]); }, "double free");
}

TEST(BlockPool, FreeBlocksReversedEqualsFreeingTheReversedTable) {
  auto build = [](BlockPool& pool) {
    const auto seq = sequence(iota_tokens(0, kBlockSize * 5));
    auto blocks = take(pool, 7);
    pool.cache_full_blocks(seq.sequence(), blocks, 0, 5);
    pool.touch(std::vector<BlockId>{blocks[2]});  // a second holder: stays out of the queue
    blocks.insert(blocks.begin() + 3, kNullBlockId);
    return blocks;  // cached 0, 1, 2 (shared), null, cached 3, 4, uncached 5, 6
  };
  for (const bool events : {false, true}) {
    BlockPool a(config(12, events));
    BlockPool b(config(12, events));
    const auto table_a = build(a);
    const auto table_b = build(b);
    ASSERT_EQ(table_a, table_b);
    a.free_blocks_reversed(table_a);
    b.free_blocks(std::vector<BlockId>(table_b.rbegin(), table_b.rend()));
    EXPECT_EQ(a.snapshot(), b.snapshot());
    EXPECT_EQ(a.free_queue().ids(), b.free_queue().ids());
    a.check_invariants();
  }
  BlockPool pool(config(12));
  const auto table = build(pool);
  const BlockId held = table[0];
  expect_rejected(
      pool,
      [&] {
        pool.free_blocks_reversed(std::vector<BlockId>{held, 12});
      },
      "out of range");
  expect_rejected(
      pool,
      [&] {
        pool.free_blocks_reversed(std::vector<BlockId>{held, table[1], held});
      },
      "appears twice");
  expect_rejected(
      pool,
      [&] {
        pool.free_blocks_reversed(std::vector<BlockId>{held, 11});
      },
      "double free");
  pool.free_blocks_reversed(table);
  pool.check_invariants();
}

// commit_store validates every block (one pass, sign marks undone) before any change.
TEST(BlockPool, CommitStoreIsRejectedWithStateUnchanged) {
  for (const bool chain : {false, true}) {
    BlockPoolConfig c = config(8);
    c.chain_hashes_identify_prefix = chain;
    BlockPool pool(c);
    BlockPool other(c);
    const auto seq = sequence(iota_tokens(0, 12));
    const auto s = seq.sequence();
    const auto blocks = take(pool, 4);
    pool.cache_full_blocks(s, blocks, 0, 1);
    const std::vector<BlockId> none;
    auto commit = [&](std::vector<BlockId> ids) {
      pool.commit_store(pool.prepare_store(s, 1, 3, std::vector<BlockId>{blocks[0]}), ids);
    };
    expect_rejected(
        pool,
        [&] {
          commit({blocks[1], blocks[1]});
        },
        "appears twice");
    expect_rejected(
        pool,
        [&] {
          commit({blocks[1], 8});
        },
        "block 8 is out of range");
    expect_rejected(
        pool,
        [&] {
          commit({blocks[1], blocks[0]});
        },
        "already cached");
    expect_rejected(
        pool,
        [&] {
          commit({blocks[1], 6});
        },
        "not allocated");
    expect_rejected(
        pool,
        [&] {
          commit({0, blocks[1]});
        },
        "null block");
    expect_rejected(
        pool, [&] { commit({blocks[1]}); }, "1 blocks for a store of 2");
    expect_rejected(
        pool,
        [&] {
          pool.commit_store(other.prepare_store(s, 1, 3, none),
                            std::vector<BlockId>{blocks[1], blocks[2]});
        },
        "another pool");
    commit({blocks[1], blocks[2]});
    pool.check_invariants();
    EXPECT_EQ(pool.block(blocks[1]).ref_cnt, 1);
    EXPECT_EQ(pool.block(blocks[2]).ref_cnt, 1);
    EXPECT_EQ(pool.match_cached_block(s, 2, blocks[1]), blocks[2]);
  }
}

TEST(BlockPool, ResetOnlyWhenIdle) {
  BlockPool pool(config(6));
  const auto seq = sequence(iota_tokens(0, 8));
  const auto blocks = take(pool, 2);
  pool.cache_full_blocks(seq.sequence(), blocks, 0, 2);
  const auto before = pool.snapshot();
  EXPECT_FALSE(pool.reset_prefix_cache());
  EXPECT_EQ(pool.snapshot(), before);
  pool.free_blocks(std::vector<BlockId>{blocks[1], blocks[0]});
  pool.take_events();
  EXPECT_TRUE(pool.reset_prefix_cache());
  EXPECT_EQ(pool.get_cached_block(seq.block_hashes()[0]), BlockPool::kNoBlock);
  EXPECT_FALSE(pool.block(blocks[0]).is_cached());
  const auto events = pool.take_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(std::holds_alternative<AllBlocksCleared>(events[0].data));
  pool.check_invariants();
}

TEST(BlockPool, EventsCarryTheCachedBlocksInOrderWithGapFreeSequenceNumbers) {
  BlockPool pool(config(8));
  RequestHashKeys keys;
  keys.lora_name = "adapter";
  keys.cache_salt = "tenant";
  keys.mm_items = {{"img", 2, 3}};
  const auto seq = sequence(iota_tokens(10, 12), keys);
  const auto blocks = take(pool, 3);
  pool.cache_full_blocks(seq.sequence(), blocks, 0, 2);
  pool.cache_full_blocks(seq.sequence(), blocks, 2, 3);
  pool.cache_full_blocks(seq.sequence(), blocks, 3, 3);  // nothing new: no event
  pool.evict_blocks(std::vector<BlockId>{blocks[2]});
  const auto events = pool.take_events();
  ASSERT_EQ(events.size(), 3u);
  for (std::size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].seq, i);

  const auto& first = std::get<BlockStored>(events[0].data);
  EXPECT_EQ(first.block_hashes,
            (std::vector<BlockHash>{seq.block_hashes()[0], seq.block_hashes()[1]}));
  EXPECT_FALSE(first.parent_block_hash.has_value());
  EXPECT_EQ(first.token_ids, iota_tokens(10, 8));
  EXPECT_EQ(first.block_size, kBlockSize);
  EXPECT_EQ(first.lora_name, std::optional<std::string>("adapter"));
  ASSERT_EQ(first.extra_keys.size(), 2u);
  EXPECT_EQ(first.extra_keys[0].cache_salt, std::optional<std::string>("tenant"));
  EXPECT_EQ(first.extra_keys[0].mm_items,
            (std::vector<std::pair<std::string, std::int64_t>>{{"img", 2}}));
  EXPECT_FALSE(first.extra_keys[1].cache_salt.has_value());
  EXPECT_EQ(first.extra_keys[1].mm_items,
            (std::vector<std::pair<std::string, std::int64_t>>{{"img", -2}}));
  const auto& second = std::get<BlockStored>(events[1].data);
  EXPECT_EQ(second.parent_block_hash, std::optional<BlockHash>(seq.block_hashes()[1]));
  EXPECT_EQ(std::get<BlockRemoved>(events[2].data).block_hashes,
            std::vector<BlockHash>{seq.block_hashes()[2]});
  EXPECT_TRUE(pool.take_events().empty());

  // With a sink, events go to it as they happen, continuing the sequence.
  std::vector<KVEvent> sunk;
  pool.set_event_sink([&](const KVEvent& e) { sunk.push_back(e); });
  pool.evict_blocks(std::vector<BlockId>{blocks[1]});
  ASSERT_EQ(sunk.size(), 1u);
  EXPECT_EQ(sunk[0].seq, 3u);
  EXPECT_TRUE(pool.take_events().empty());
}

TEST(BlockPool, NoEventsUnlessEnabled) {
  BlockPool pool(config(8, /*events=*/false));
  const auto seq = sequence(iota_tokens(0, 8));
  const auto blocks = take(pool, 2);
  pool.cache_full_blocks(seq.sequence(), blocks, 0, 2);
  EXPECT_TRUE(pool.take_events().empty());
}

// A 1-bit hash makes unrelated blocks collide. The raw map lookup returns the colliding block;
// the verified lookup never does.
// Indices of two sequences whose first block hashes collide (equal indices when none do).
std::pair<std::size_t, std::size_t> colliding_pair(const std::vector<RequestBlockHasher>& seqs) {
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    for (std::size_t j = i + 1; j < seqs.size(); ++j) {
      if (seqs[i].block_hashes()[0] == seqs[j].block_hashes()[0]) return {i, j};
    }
  }
  return {0, 0};
}

TEST(BlockPool, VerifiedLookupTurnsCollisionsIntoMisses) {
  const BlockHasher weak = BlockHasher::weak_for_testing(HashScheme::kSha256, "s", 1);
  BlockPool pool(config(16));
  // Find two different single blocks whose weak hashes collide.
  std::vector<RequestBlockHasher> seqs;
  for (TokenId t = 0; t < 8; ++t) seqs.push_back(sequence(iota_tokens(t * 100, 4), {}, weak));
  const auto [x, y] = colliding_pair(seqs);
  ASSERT_NE(x, y) << "no collision among 8 blocks with a 1-bit hash";
  const auto bx = take(pool, 1);
  pool.cache_full_blocks(seqs[x].sequence(), bx, 0, 1);
  EXPECT_EQ(pool.get_cached_block(seqs[y].block_hashes()[0]), bx[0]);  // raw map: fooled
  EXPECT_EQ(pool.match_cached_block(seqs[y].sequence(), 0, BlockPool::kNoBlock),
            BlockPool::kNoBlock);
  EXPECT_EQ(pool.match_cached_block(seqs[x].sequence(), 0, BlockPool::kNoBlock), bx[0]);
  // Cache y too: now both are found, each by its own content.
  const auto by = take(pool, 1);
  pool.cache_full_blocks(seqs[y].sequence(), by, 0, 1);
  EXPECT_EQ(pool.match_cached_block(seqs[y].sequence(), 0, BlockPool::kNoBlock), by[0]);
  EXPECT_EQ(pool.match_cached_block(seqs[x].sequence(), 0, BlockPool::kNoBlock), bx[0]);
  pool.check_invariants();
}

// match_cached_block_after() checks the stored parent hash against the sequence's own previous
// block (the root for block 0), without the parent's block; a pool of content ids refuses it.
// Two chains p and q whose first blocks differ in hash and whose second blocks (same tokens,
// `suffix`) collide, also with the suffix hashed as a chain's first block. (With 1 bit, first
// blocks have two hash values; suffixes are tried until all three hashes are equal.) Empty
// vectors when none is found.
struct ParentCollision {
  std::vector<TokenId> p, q, suffix;
};
ParentCollision find_parent_collision(const BlockHasher& weak) {
  for (TokenId a = 1; a < 40; ++a) {
    for (TokenId b = a + 1; b < 40; ++b) {
      for (TokenId t = 50; t < 90; ++t) {
        const auto sp = sequence({a, a, a, a, t, t, t, t}, {}, weak);
        const auto sq = sequence({b, b, b, b, t, t, t, t}, {}, weak);
        const auto alone = sequence({t, t, t, t}, {}, weak);  // the suffix as a first block
        if (sp.block_hashes()[0] != sq.block_hashes()[0] &&
            sp.block_hashes()[1] == sq.block_hashes()[1] &&
            alone.block_hashes()[0] == sp.block_hashes()[1]) {
          return {{a, a, a, a, t, t, t, t}, {b, b, b, b, t, t, t, t}, {t, t, t, t}};
        }
      }
    }
  }
  return {};
}

TEST(BlockPool, MatchAfterChecksTheStoredParentHash) {
  const BlockHasher weak = BlockHasher::weak_for_testing(HashScheme::kSha256, "after", 1);
  BlockPoolConfig c = config(16);
  c.chain_hashes_identify_prefix = true;  // trusted here only to reach the parent check
  BlockPool pool(c);
  const auto [p, q, suffix] = find_parent_collision(weak);
  ASSERT_FALSE(q.empty());
  const auto sp = sequence(p, {}, weak);
  const auto sq = sequence(q, {}, weak);
  const auto bp = take(pool, 2);
  pool.cache_full_blocks(sp.sequence(), bp, 0, 2);
  EXPECT_EQ(pool.match_cached_block_after(sp.sequence(), 0), bp[0]);
  EXPECT_EQ(pool.match_cached_block_after(sp.sequence(), 1), bp[1]);
  // q's block 1: same tokens and hash, another parent. Unanchored it is found; after q's own
  // block 0 it is a miss.
  EXPECT_EQ(pool.match_cached_block_unanchored(sq.sequence(), 1), bp[1]);
  EXPECT_EQ(pool.match_cached_block_after(sq.sequence(), 1), BlockPool::kNoBlock);
  // The suffix as a chain's first block (same hash and tokens): block 1 was cached after a
  // parent, not at the root.
  const auto root = sequence(suffix, {}, weak);
  EXPECT_EQ(pool.match_cached_block_after(root.sequence(), 0), BlockPool::kNoBlock);
  EXPECT_THROW((void)pool.match_cached_block_after(sp.sequence(), 2), Error);  // no block 2
  pool.check_invariants();

  BlockPool ids(config(16));  // content ids: no parent hashes to compare
  const auto bi = take(ids, 2);
  ids.cache_full_blocks(sp.sequence(), bi, 0, 2);
  expect_rejected(
      ids, [&] { (void)ids.match_cached_block_after(sp.sequence(), 1); }, "content ids");
  BlockPoolConfig raw = config(16);
  raw.verify_cache_hits = false;
  BlockPool trusting(raw);  // no verification: the map's first block for the hash
  const auto bt = take(trusting, 2);
  trusting.cache_full_blocks(sp.sequence(), bt, 0, 2);
  EXPECT_EQ(trusting.match_cached_block_after(sq.sequence(), 1), bt[1]);
}

// match_cached_run_after() is match_cached_block_after() block by block, stopping at the first
// miss: a run broken by an evicted block, a wrong parent or a colliding hash ends there.
// The eviction observer sees every eviction (get_new_blocks, evict_blocks) while the block is
// whole: its hash, its stored parent hash and tokens are still readable then.
TEST(BlockPool, EvictionObserverSeesEachEvictedBlockWhole) {
  struct Seen {
    BlockId id;
    BlockHash hash, parent;
    std::vector<TokenId> tokens;
  };
  struct Observer final : BlockPool::EvictionObserver {
    std::vector<Seen> seen;
    void on_evict(const BlockPool& pool, BlockId id) noexcept override {
      const TokenId* t = pool.stored_tokens(id);
      seen.push_back({id, pool.block(id).block_hash, pool.stored_parent_hash(id),
                      std::vector<TokenId>(t, t + pool.block_size())});
    }
  };
  BlockPoolConfig c = config(8);
  c.chain_hashes_identify_prefix = true;
  BlockPool pool(c);
  ASSERT_TRUE(pool.stores_chain_material());
  EXPECT_FALSE(BlockPool(config(8)).stores_chain_material());  // content ids: no chain material
  Observer obs;
  pool.set_eviction_observer(&obs);
  std::vector<TokenId> tokens(3 * kBlockSize);
  std::iota(tokens.begin(), tokens.end(), 500);
  const auto s = sequence(tokens);
  const auto blocks = take(pool, 3);
  pool.cache_full_blocks(s.sequence(), blocks, 0, 3);
  pool.free_blocks_reversed(blocks);  // queued tail first: block 2, 1, 0 after the free ones
  EXPECT_TRUE(obs.seen.empty());
  (void)take(pool, 4);  // the 4 uncached blocks: no eviction
  EXPECT_TRUE(obs.seen.empty());
  (void)take(pool, 2);  // evicts the chain's blocks 2 and 1, in that order
  ASSERT_EQ(obs.seen.size(), 2u);
  for (std::size_t k = 0; k < 2; ++k) {
    const std::size_t i = 2 - k;
    EXPECT_EQ(obs.seen[k].id, blocks[i]);
    EXPECT_EQ(obs.seen[k].hash, s.block_hashes()[i]);
    EXPECT_EQ(obs.seen[k].parent, s.block_hashes()[i - 1]);
    EXPECT_EQ(obs.seen[k].tokens, std::vector<TokenId>(tokens.begin() + i * kBlockSize,
                                                       tokens.begin() + (i + 1) * kBlockSize));
    EXPECT_FALSE(pool.block(blocks[i]).is_cached());
  }
  ASSERT_EQ(pool.evict_blocks(std::span<const BlockId>(&blocks[0], 1)), 1u);
  ASSERT_EQ(obs.seen.size(), 3u);
  EXPECT_EQ(obs.seen[2].id, blocks[0]);
  EXPECT_EQ(obs.seen[2].hash, s.block_hashes()[0]);
  EXPECT_TRUE(obs.seen[2].parent.empty());  // a chain's block 0 has no parent
  pool.set_eviction_observer(nullptr);
  pool.check_invariants();
}

TEST(BlockPool, MatchRunAfterEqualsBlockByBlockLookups) {
  BlockPoolConfig c = config(64);
  c.chain_hashes_identify_prefix = true;
  BlockPool pool(c);
  std::vector<TokenId> tokens(12 * kBlockSize);
  std::iota(tokens.begin(), tokens.end(), 100);
  const auto s = sequence(tokens);
  const auto blocks = take(pool, 12);
  pool.cache_full_blocks(s.sequence(), blocks, 0, 12);
  // Another chain sharing blocks 0-5, then diverging (block 6 differs: 7-11 have other hashes).
  std::vector<TokenId> other = tokens;
  other[6 * kBlockSize] = 1;
  const auto o = sequence(other);
  ASSERT_NE(o.block_hashes()[7], s.block_hashes()[7]);
  // Evict block 4: runs through it end there.
  ASSERT_EQ(pool.evict_blocks(std::span<const BlockId>(&blocks[4], 1)), 1u);
  const auto one_by_one = [&](const BlockSequence& seq, std::size_t begin, std::size_t end) {
    std::vector<BlockId> want = {-7};  // run results are appended after what is there
    for (std::size_t i = begin; i < end; ++i) {
      const BlockId b = pool.match_cached_block_after(seq, i);
      if (b == BlockPool::kNoBlock) break;
      want.push_back(b);
    }
    return want;
  };
  for (const RequestBlockHasher* r : {&s, &o}) {
    const BlockSequence seq = r->sequence();
    for (std::size_t begin = 0; begin <= 12; ++begin) {
      for (std::size_t end = begin; end <= 12; ++end) {
        std::vector<BlockId> got = {-7};
        const std::size_t n = pool.match_cached_run_after(seq, begin, end, got);
        const std::vector<BlockId> want = one_by_one(seq, begin, end);
        EXPECT_EQ(got, want) << "blocks [" << begin << ", " << end << ")";
        EXPECT_EQ(n, want.size() - 1);
      }
    }
  }
  // Spot checks of what the loop compares against.
  std::vector<BlockId> got;
  EXPECT_EQ(pool.match_cached_run_after(s.sequence(), 0, 12, got), 4u);  // block 4 evicted
  EXPECT_EQ(pool.match_cached_run_after(s.sequence(), 5, 12, got), 7u);  // after it: to the end
  EXPECT_EQ(pool.match_cached_run_after(o.sequence(), 5, 12, got), 1u);  // o's block 6 differs
  EXPECT_EQ(got, (std::vector<BlockId>{blocks[0], blocks[1], blocks[2], blocks[3], blocks[5],
                                       blocks[6], blocks[7], blocks[8], blocks[9], blocks[10],
                                       blocks[11], blocks[5]}));
  // Errors (nothing appended, nothing changed): blocks beyond the sequence, a content-id pool.
  got.assign({3});
  expect_rejected(
      pool, [&] { (void)pool.match_cached_run_after(s.sequence(), 0, 13, got); }, "13");
  EXPECT_EQ(got, (std::vector<BlockId>{3}));
  BlockPool ids(config(16));
  expect_rejected(
      ids, [&] { (void)ids.match_cached_run_after(s.sequence(), 0, 2, got); }, "content ids");
  EXPECT_EQ(got, (std::vector<BlockId>{3}));
  pool.check_invariants();
}

// A run lookup of a chain-identity pool compares the stored tokens: a block whose hash and
// parent hash collide with the request's but whose tokens differ ends the run (block sizes 4
// and 16: the compare has a path of its own for 16 tokens).
TEST(BlockPool, MatchRunAfterComparesTheTokens) {
  const BlockHasher weak = BlockHasher::weak_for_testing(HashScheme::kSha256, "run", 1);
  for (const std::uint32_t bs : {4u, 16u}) {
    SCOPED_TRACE("block size " + std::to_string(bs));
    const auto one_block = [&](TokenId first) {
      RequestBlockHasher seq(weak, bs, {});
      seq.append(iota_tokens(first, first + static_cast<TokenId>(bs)));
      return seq;
    };
    // Two different single blocks whose (1-bit) hashes collide: both at the root.
    std::vector<RequestBlockHasher> seqs;
    for (TokenId t = 0; t < 8; ++t) seqs.push_back(one_block(t * 100));
    const auto [x, y] = colliding_pair(seqs);
    ASSERT_NE(x, y) << "no collision among 8 blocks with a 1-bit hash";
    BlockPoolConfig c = config(16, false);
    c.block_size = bs;
    c.chain_hashes_identify_prefix = true;
    BlockPool pool(c);
    const auto bx = take(pool, 1);
    pool.cache_full_blocks(seqs[x].sequence(), bx, 0, 1);
    std::vector<BlockId> got;
    EXPECT_EQ(pool.match_cached_run_after(seqs[y].sequence(), 0, 1, got), 0u);
    EXPECT_TRUE(got.empty());
    EXPECT_EQ(pool.match_cached_run_after(seqs[x].sequence(), 0, 1, got), 1u);
    EXPECT_EQ(got, bx);
  }
}

// The parent check of a run is the sequence's own previous chained hash, as in
// match_cached_block_after(): a colliding block cached after another parent, or at the root, ends
// the run; a pool that does not verify finds it by hash alone.
TEST(BlockPool, MatchRunAfterChecksTheStoredParentHash) {
  const BlockHasher weak = BlockHasher::weak_for_testing(HashScheme::kSha256, "after", 1);
  const auto [p, q, suffix] = find_parent_collision(weak);
  ASSERT_FALSE(q.empty());
  const auto sp = sequence(p, {}, weak);
  const auto sq = sequence(q, {}, weak);
  const auto root = sequence(suffix, {}, weak);
  BlockPoolConfig c = config(16);
  c.chain_hashes_identify_prefix = true;
  BlockPool pool(c);
  const auto bp = take(pool, 2);
  pool.cache_full_blocks(sp.sequence(), bp, 0, 2);
  std::vector<BlockId> got;
  EXPECT_EQ(pool.match_cached_run_after(sp.sequence(), 0, 2, got), 2u);
  EXPECT_EQ(got, bp);
  got.clear();
  EXPECT_EQ(pool.match_cached_run_after(sq.sequence(), 1, 2, got), 0u);    // another parent
  EXPECT_EQ(pool.match_cached_run_after(root.sequence(), 0, 1, got), 0u);  // not at the root
  EXPECT_TRUE(got.empty());
  BlockPoolConfig raw = config(16);
  raw.verify_cache_hits = false;
  BlockPool trusting(raw);
  const auto bt = take(trusting, 2);
  trusting.cache_full_blocks(sp.sequence(), bt, 0, 2);
  EXPECT_EQ(trusting.match_cached_run_after(sq.sequence(), 1, 2, got), 1u);
  EXPECT_EQ(got, (std::vector<BlockId>{bt[1]}));
}

// Parents are compared by content identity, not by (possibly colliding) parent hash: a child
// cached after prefix P must not be a hit after a different prefix P' with the same weak hash.
TEST(BlockPool, ChildOfACollidingParentIsAMiss) {
  const BlockHasher weak = BlockHasher::weak_for_testing(HashScheme::kSha256, "s", 1);
  BlockPool pool(config(16));
  std::vector<TokenId> suffix = {7, 7, 7, 7};
  // Find two first blocks p, q with equal weak hashes.
  std::vector<TokenId> p, q;
  for (TokenId a = 1; a < 20 && q.empty(); ++a) {
    for (TokenId b = a + 1; b < 20; ++b) {
      const auto sp = sequence({a, a, a, a}, {}, weak);
      const auto sq = sequence({b, b, b, b}, {}, weak);
      if (sp.block_hashes()[0] == sq.block_hashes()[0]) {
        p = {a, a, a, a};
        q = {b, b, b, b};
        break;
      }
    }
  }
  ASSERT_FALSE(q.empty());
  auto with_suffix = [&](std::vector<TokenId> v) {
    v.insert(v.end(), suffix.begin(), suffix.end());
    return sequence(v, {}, weak);
  };
  const auto sp = with_suffix(p);
  const auto sq = with_suffix(q);
  ASSERT_EQ(sp.block_hashes()[1], sq.block_hashes()[1]);  // children collide too
  const auto bp = take(pool, 2);
  pool.cache_full_blocks(sp.sequence(), bp, 0, 2);
  const auto bq0 = take(pool, 1);
  pool.cache_full_blocks(sq.sequence(), bq0, 0, 1);
  const BlockId q0 = pool.match_cached_block(sq.sequence(), 0, BlockPool::kNoBlock);
  ASSERT_EQ(q0, bq0[0]);
  EXPECT_EQ(pool.match_cached_block(sq.sequence(), 1, q0), BlockPool::kNoBlock);
  EXPECT_EQ(pool.match_cached_block(sp.sequence(), 1, bp[0]), bp[1]);
}

// cached_after_prefix: a block is anchored only after exactly the prefix it was cached after,
// whichever way the prefix's identity is obtained (the chained hash, the pool's own chain from
// the root, or from a verified anchor block).
TEST(BlockPool, CachedAfterPrefixAnchorsToTheExactPrefix) {
  for (const bool resistant : {true, false}) {
    BlockPoolConfig c = config(16);
    c.chain_hashes_identify_prefix = resistant;
    BlockPool pool(c);
    RequestHashKeys keys;
    keys.cache_salt = "tenant";  // block 0 carries extra keys
    const auto seq = sequence(iota_tokens(0, 16), keys);
    const auto blocks = take(pool, 4);
    pool.cache_full_blocks(seq.sequence(), blocks, 0, 4);
    const BlockSequence s = seq.sequence();
    EXPECT_TRUE(pool.cached_after_prefix(blocks[0], s, 0)) << resistant;
    EXPECT_FALSE(pool.cached_after_prefix(blocks[1], s, 0)) << resistant;
    EXPECT_TRUE(pool.cached_after_prefix(blocks[3], s, 3)) << resistant;
    EXPECT_TRUE(pool.cached_after_prefix(blocks[3], s, 3, blocks[0], 1)) << resistant;
    EXPECT_TRUE(pool.cached_after_prefix(blocks[3], s, 3, blocks[2], 3)) << resistant;
    EXPECT_FALSE(pool.cached_after_prefix(blocks[3], s, 2)) << resistant;  // another position
    EXPECT_FALSE(pool.cached_after_prefix(blocks[0], s, 1)) << resistant;
    // The same tokens after another salt, or after other tokens: not this prefix.
    const auto unsalted = sequence(iota_tokens(0, 16));
    EXPECT_FALSE(pool.cached_after_prefix(blocks[2], unsalted.sequence(), 2)) << resistant;
    std::vector<TokenId> other = iota_tokens(0, 16);
    other[1] = 99;
    const auto changed = sequence(other, keys);
    EXPECT_FALSE(pool.cached_after_prefix(blocks[2], changed.sequence(), 2)) << resistant;
    // Misuse: an uncached block, a bad anchor range, an index beyond the sequence.
    const auto loose = take(pool, 1);
    expect_rejected(
        pool, [&] { (void)pool.cached_after_prefix(loose[0], s, 1); }, "not cached");
    expect_rejected(
        pool, [&] { (void)pool.cached_after_prefix(blocks[1], s, 1, blocks[1], 2); }, "anchor");
    expect_rejected(
        pool, [&] { (void)pool.cached_after_prefix(blocks[1], s, 1, BlockPool::kNoBlock, 1); },
        "anchor");
    expect_rejected(
        pool, [&] { (void)pool.cached_after_prefix(blocks[1], s, 5); }, "beyond");
  }
  // Without verification there is nothing to compare: always true.
  BlockPoolConfig c = config(16);
  c.verify_cache_hits = false;
  BlockPool pool(c);
  const auto seq = sequence(iota_tokens(0, 8));
  const auto blocks = take(pool, 2);
  pool.cache_full_blocks(seq.sequence(), blocks, 0, 2);
  EXPECT_TRUE(pool.cached_after_prefix(blocks[1], seq.sequence(), 0));
}

TEST(BlockPool, DuplicatesShareContentIdentity) {
  BlockPool pool(config(16));
  const auto seq = sequence(iota_tokens(0, 8));
  const auto first = take(pool, 2);
  pool.cache_full_blocks(seq.sequence(), first, 0, 2);
  // The same content computed again in other blocks (e.g. the last block of a fully cached
  // prompt is always recomputed): both copies are cached, the first inserted is returned, and a
  // child of either copy is reachable.
  const auto second = take(pool, 2);
  pool.cache_full_blocks(seq.sequence(), second, 0, 2);
  EXPECT_EQ(pool.match_cached_block(seq.sequence(), 0, BlockPool::kNoBlock), first[0]);
  EXPECT_EQ(pool.match_cached_block(seq.sequence(), 1, second[0]), first[1]);
  pool.evict_blocks(std::vector<BlockId>{first[0], first[1]});
  EXPECT_EQ(pool.match_cached_block(seq.sequence(), 0, BlockPool::kNoBlock), second[0]);
  EXPECT_EQ(pool.match_cached_block(seq.sequence(), 1, second[0]), second[1]);
  pool.check_invariants();
}

TEST(BlockPool, MetadataBytesPerBlockAtBlockSize16) {
  BlockPoolConfig c;
  c.num_blocks = 1 << 16;
  c.block_size = 16;
  // Stored material: tokens, extra-key id, parent identity and (without collision-resistant
  // chain hashes) the pool's own prefix identity.
  EXPECT_LE(BlockPool(c).metadata_bytes_per_block(), 200.0);
  c.chain_hashes_identify_prefix = true;
  EXPECT_LE(BlockPool(c).metadata_bytes_per_block(), 184.0);
  c.chain_hashes_identify_prefix = false;
  c.guard_chain_hashes = true;  // 16 bytes more per block (links and child counts)
  EXPECT_LE(BlockPool(c).metadata_bytes_per_block(), 200.0);
}

// Pools with chain-hash identities store each cached block's tokens and parent hash; large
// ones (a token table of 1 MiB or more) write the tokens with non-temporal stores on x86 when a
// call caches 8 blocks or more (the 300-block stores here; the one-block stores are copied).
// Small and large pools, block sizes 16 and 32, and sequences of a shorter block size (10 tokens
// in a 16-token block: copied, not streamed), caching new content over the same physical blocks:
// the stored tokens and parent hashes are exactly the block's, every block is a verified hit after
// its own parent and a miss after another block, and a block whose (weak) hash collides is a miss.
TEST(BlockPool, StoredMaterialOfSmallAndLargePoolsIsExact) {
  const BlockHasher strong(HashScheme::kSha256, "test");
  const BlockHasher weak = BlockHasher::weak_for_testing(HashScheme::kSha256, "s", 1);
  struct Sizes {
    std::uint32_t pool, seq;  // block sizes of the pool and of the sequences
  };
  for (const Sizes sizes : {Sizes{16, 16}, Sizes{32, 32}, Sizes{16, 10}}) {
    const std::uint32_t bs = sizes.seq;
    for (const std::int32_t n : {1'000, 40'000}) {
      SCOPED_TRACE("block size " + std::to_string(sizes.pool) + ", sequences' " +
                   std::to_string(bs) + ", " + std::to_string(n) + " blocks");
      BlockPoolConfig c;
      c.num_blocks = n;
      c.block_size = sizes.pool;
      c.chain_hashes_identify_prefix = true;
      BlockPool pool(c);
      // Three rounds in the same physical blocks: each later round takes them back, evicts
      // them and caches other content over the stored material.
      std::vector<BlockId> blocks;
      ASSERT_TRUE(pool.get_new_blocks(301, blocks));
      const BlockId lone = blocks.back();  // holds a one-block sequence of the weak hasher
      blocks.pop_back();
      for (std::uint32_t round = 0; round < 3; ++round) {
        RequestBlockHasher seq(strong, bs);
        seq.append(random_tokens(300 * bs, round + 1));
        RequestBlockHasher one(weak, bs);
        one.append(random_tokens(bs, round + 100));
        if (round > 0) {
          pool.touch(blocks);
          pool.touch({&lone, 1});
          EXPECT_EQ(pool.evict_blocks(blocks), 300u);
          EXPECT_EQ(pool.evict_blocks({&lone, 1}), 1u);
        }
        pool.cache_full_blocks(seq.sequence(), blocks, 0, 300);
        pool.cache_full_blocks(one.sequence(), {&lone, 1}, 0, 1);
        const BlockPoolSnapshot snap = pool.snapshot();
        BlockId parent = BlockPool::kNoBlock;
        for (std::size_t i = 0; i < 300; ++i) {
          const auto id = static_cast<std::size_t>(blocks[i]);
          ASSERT_TRUE(
              std::equal(seq.tokens().begin() + static_cast<std::ptrdiff_t>(i * bs),
                         seq.tokens().begin() + static_cast<std::ptrdiff_t>((i + 1) * bs),
                         snap.block_tokens.begin() + static_cast<std::ptrdiff_t>(id * sizes.pool)))
              << "block " << i;
          ASSERT_EQ(snap.parent_identities[id], i > 0 ? seq.block_hashes()[i - 1] : BlockHash())
              << "block " << i;
          if (i >= 2) {  // after another block than its parent: a miss
            ASSERT_EQ(pool.match_cached_block(seq.sequence(), i, blocks[i - 2]),
                      BlockPool::kNoBlock)
                << "block " << i;
          }
          parent = pool.match_cached_block(seq.sequence(), i, parent);
          ASSERT_EQ(parent, blocks[i]) << "block " << i;
        }
        // A one-block sequence whose weak hash equals `one`'s but whose tokens differ.
        EXPECT_EQ(pool.match_cached_block(one.sequence(), 0, BlockPool::kNoBlock), lone);
        for (std::uint32_t seed = 1000;; ++seed) {
          RequestBlockHasher other(weak, bs);
          other.append(random_tokens(bs, seed));
          if (other.block_hashes()[0] != one.block_hashes()[0]) continue;
          EXPECT_EQ(pool.get_cached_block(other.block_hashes()[0]), lone);  // map: fooled
          EXPECT_EQ(pool.match_cached_block(other.sequence(), 0, BlockPool::kNoBlock),
                    BlockPool::kNoBlock);
          break;
        }
        pool.check_invariants();
        pool.free_blocks(blocks);
        pool.free_blocks({&lone, 1});
      }
    }
  }
}

// A block id repeated in one cache_full_blocks call is misuse, like in free_blocks: rejected
// with nothing changed (it used to corrupt the map, and with many copies hang it).
TEST(BlockPool, RepeatedBlockInCacheFullBlocksIsRejected) {
  BlockPool pool(config(10));
  const auto seq = sequence(iota_tokens(0, 80));  // 20 full blocks
  const auto blocks = take(pool, 1);
  for (const std::size_t copies : {2u, 3u, 20u}) {
    const std::vector<BlockId> repeated(copies, blocks[0]);
    expect_rejected(
        pool, [&] { pool.cache_full_blocks(seq.sequence(), repeated, 0, copies); }, "twice");
  }
  const std::vector<BlockId> two = {blocks[0], take(pool, 1)[0]};
  pool.cache_full_blocks(seq.sequence(), two, 0, 2);
  pool.check_invariants();
}

TEST(BlockHashMap, InsertIntoAFullTableIsAnErrorNotAHang) {
  // A misused map (the same block inserted again and again) fills up: the insert that would
  // take the last empty slot throws instead of probing forever.
  std::vector<KVCacheBlock> blocks(2);
  blocks[1].block_id = 1;
  blocks[1].block_hash = BlockHash::from_hex("00112233445566778899aabbccddeeff");
  BlockHashMap map(blocks);
  std::size_t inserted = 0;
  EXPECT_THROW(
      {
        for (int i = 0; i < 64; ++i) {
          map.insert(1);
          ++inserted;
        }
      },
      Error);
  EXPECT_EQ(inserted, map.capacity() - 1);
  EXPECT_EQ(map.size(), map.capacity() - 1);
}

// vLLM hits A and B after A was evicted and recomputed into another block: the child's stored
// parent identity is a function of content, not of the physical block that held it.
TEST(BlockPool, ChildStaysAHitAfterItsParentIsEvictedAndCachedAgain) {
  for (const bool resistant : {false, true}) {
    BlockPoolConfig c = config(16);
    c.chain_hashes_identify_prefix = resistant;
    BlockPool pool(c);
    const auto seq = sequence(iota_tokens(0, 8));
    const auto chain = take(pool, 2);
    pool.cache_full_blocks(seq.sequence(), chain, 0, 2);
    pool.evict_blocks(std::vector<BlockId>{chain[0]});
    const auto again = take(pool, 1);
    pool.cache_full_blocks(seq.sequence(), again, 0, 1);
    const BlockId a = pool.match_cached_block(seq.sequence(), 0, BlockPool::kNoBlock);
    ASSERT_EQ(a, again[0]);
    EXPECT_EQ(pool.match_cached_block(seq.sequence(), 1, a), chain[1]) << resistant;
    pool.check_invariants();
  }
}

// Const calls only read: several threads may look up (with and without their own scratch, for
// blocks with extra keys) at once and get the single-threaded answers. Under a sanitizer build
// (ThreadSanitizer in particular) a write to shared scratch would be reported.
TEST(BlockPool, ConcurrentConstLookupsAreSafe) {
  BlockPool pool(config(64));
  RequestHashKeys keys;
  keys.lora_name = "a-rather-long-adapter-name-that-does-not-fit-small-strings";
  keys.cache_salt = "tenant";
  keys.mm_items = {{"image-0", 2, 5}};
  const auto seq = sequence(iota_tokens(0, 40), keys);
  const auto blocks = take(pool, 10);
  pool.cache_full_blocks(seq.sequence(), blocks, 0, 10);
  std::vector<BlockId> expected;
  BlockId parent = BlockPool::kNoBlock;
  for (std::size_t i = 0; i < 10; ++i) {
    parent = pool.match_cached_block(seq.sequence(), i, parent);
    expected.push_back(parent);
  }
  ASSERT_EQ(expected, blocks);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      BlockPool::LookupScratch scratch;
      for (int round = 0; round < 300; ++round) {
        BlockId p = BlockPool::kNoBlock;
        for (std::size_t i = 0; i < 10; ++i) {
          p = pool.match_cached_block(seq.sequence(), i, p, 0, t % 2 == 0 ? &scratch : nullptr);
          mismatches[static_cast<std::size_t>(t)] += p != expected[i];
          mismatches[static_cast<std::size_t>(t)] +=
              pool.match_cached_block_unanchored(seq.sequence(), i) != expected[i];
        }
        (void)pool.snapshot();
        pool.check_invariants();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// Events reach the sink only once the call's change is complete: the sink sees a consistent
// pool with every event's effect applied.
TEST(BlockPool, SinkSeesAConsistentPoolAfterEachChange) {
  BlockPool pool(config(6));
  std::vector<KVEvent> seen;
  pool.set_event_sink([&](const KVEvent& e) {
    pool.check_invariants();
    if (const auto* stored = std::get_if<BlockStored>(&e.data)) {
      for (const BlockHash& h : stored->block_hashes) EXPECT_NE(pool.get_cached_block(h), -1);
    }
    if (const auto* removed = std::get_if<BlockRemoved>(&e.data)) {
      EXPECT_EQ(pool.get_cached_block(removed->block_hashes[0]), -1);
    }
    seen.push_back(e);
  });
  const auto seq = sequence(iota_tokens(0, 20));
  auto blocks = take(pool, 5);
  pool.cache_full_blocks(seq.sequence(), blocks, 0, 5);
  std::vector<BlockId> reversed(blocks.rbegin(), blocks.rend());
  pool.free_blocks(reversed);
  (void)take(pool, 3);  // evicts three cached blocks
  ASSERT_EQ(seen.size(), 4u);
  for (std::size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i].seq, i);
  EXPECT_TRUE(pool.take_events().empty());
}

// The sink must not throw; the pool enforces it (delivery is noexcept), so a throwing sink ends
// the program with the pool consistent rather than leaving a half-applied step behind.
TEST(BlockPoolDeathTest, ThrowingSinkTerminates) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        BlockPool pool(config(6));
        pool.set_event_sink([](const KVEvent&) { throw std::runtime_error("sink failed"); });
        const auto seq = sequence(iota_tokens(0, 4));
        const auto blocks = take(pool, 1);
        pool.cache_full_blocks(seq.sequence(), blocks, 0, 1);
      },
      "");
}

}  // namespace
}  // namespace pagedkv

namespace pagedkv {
namespace {

// Content ids outlive their blocks while a descendant is cached: with every ancestor evicted,
// the table grows past its initial size (one id per block) and the chain still hits once its
// content is cached again, block by block, as in vLLM.
TEST(BlockPool, ContentIdsOfEvictedAncestorsKeepADeepChainExact) {
  BlockPool pool(config(4));  // 3 usable blocks, room for 3 ids at first
  const auto seq = sequence(iota_tokens(0, 8 * kBlockSize));
  const auto s = seq.sequence();
  const auto head = take(pool, 3);
  pool.cache_full_blocks(s, head, 0, 3);
  pool.evict_blocks(std::vector<BlockId>{head[0], head[1]});  // ids of blocks 0, 1 stay alive
  pool.free_blocks(std::vector<BlockId>{head[1], head[0]});
  // Blocks 3 and 4 of seq after cached block 2: 5 live ids in a table made for 3.
  const auto tail = take(pool, 2);
  auto store = pool.prepare_store(s, 3, 5, std::vector<BlockId>{head[2]});
  pool.commit_store(std::move(store), tail);
  pool.check_invariants();
  EXPECT_EQ(pool.match_cached_block(s, 0, BlockPool::kNoBlock), BlockPool::kNoBlock);
  pool.free_blocks(std::vector<BlockId>{tail[1], tail[0], head[2]});
  // Cache blocks 0 and 1 again (evicting the LRU blocks tail[1] and tail[0], whose ids go).
  const auto again = take(pool, 2);
  EXPECT_EQ(again, (std::vector<BlockId>{tail[1], tail[0]}));
  pool.cache_full_blocks(s, again, 0, 2);
  pool.check_invariants();
  BlockId parent = BlockPool::kNoBlock;
  for (std::size_t i = 0; i < 3; ++i) {
    parent = pool.match_cached_block(s, i, parent);
    EXPECT_EQ(parent, i < 2 ? again[i] : head[2]) << i;
  }
  EXPECT_EQ(pool.match_cached_block(s, 3, parent), BlockPool::kNoBlock);  // evicted
  // The same content under another parent is another id: a lookup through it misses.
  const auto other = sequence(iota_tokens(100, 100 + 3 * kBlockSize));
  EXPECT_FALSE(pool.cached_after_prefix(head[2], other.sequence(), 2));
  EXPECT_TRUE(pool.cached_after_prefix(head[2], s, 2));
  EXPECT_FALSE(pool.cached_after_prefix(head[2], s, 1));
  EXPECT_TRUE(pool.cached_after_prefix(again[0], s, 0));
  EXPECT_FALSE(pool.cached_after_prefix(again[1], s, 0));
  pool.check_invariants();
}

// A content-id pool stores a run of new content in one pass: after the first block whose
// parent id has no children, every later block is new. Storing a chain in one call must equal
// storing it one block per call, with and without a cached prefix shared with another chain
// (whose ids the first blocks find).
TEST(BlockPool, ChainStoredInOneCallEqualsOneBlockPerCall) {
  constexpr std::int32_t kBlocks = 12;
  std::vector<TokenId> other_tokens = iota_tokens(0, kBlocks * kBlockSize);
  for (std::size_t t = 4 * kBlockSize; t < other_tokens.size(); ++t) other_tokens[t] += 1000;
  const auto a = sequence(iota_tokens(0, kBlocks * kBlockSize));
  const auto b = sequence(other_tokens);  // a's first 4 blocks, then other content
  for (const bool shared_prefix : {false, true}) {
    SCOPED_TRACE(shared_prefix ? "b shares a cached prefix" : "b alone");
    BlockPool one(config(40, false)), each(config(40, false));
    for (BlockPool* pool : {&one, &each}) {
      if (shared_prefix) pool->cache_full_blocks(a.sequence(), take(*pool, kBlocks), 0, kBlocks);
    }
    one.cache_full_blocks(b.sequence(), take(one, kBlocks), 0, kBlocks);
    const auto blocks = take(each, kBlocks);
    for (std::size_t i = 0; i < kBlocks; ++i)
      each.cache_full_blocks(b.sequence(), blocks, i, i + 1);
    one.check_invariants();
    each.check_invariants();
    EXPECT_EQ(one.snapshot(), each.snapshot());
    BlockId parent = BlockPool::kNoBlock;
    for (std::size_t i = 0; i < kBlocks; ++i) {
      parent = one.match_cached_block(b.sequence(), i, parent);
      ASSERT_NE(parent, BlockPool::kNoBlock) << i;
    }
  }
}

// cached_after_prefix() compares with the request's own content even where the request's
// previous blocks are not cached anywhere (a sliding window's run start).
TEST(BlockPool, ParentMatchesPrefixChecksTheWholePrefixContent) {
  BlockPool pool(config(8));
  const auto a = sequence(iota_tokens(0, 3 * kBlockSize));
  auto tokens = iota_tokens(0, 3 * kBlockSize);
  tokens[1] = 999;  // differs in block 0 only
  const auto b = sequence(tokens);
  const auto blocks = take(pool, 3);
  pool.cache_full_blocks(a.sequence(), blocks, 0, 3);
  pool.evict_blocks(std::vector<BlockId>{blocks[0], blocks[1]});
  EXPECT_TRUE(pool.cached_after_prefix(blocks[2], a.sequence(), 2));
  EXPECT_FALSE(pool.cached_after_prefix(blocks[2], b.sequence(), 2));
  EXPECT_THROW((void)pool.cached_after_prefix(blocks[0], a.sequence(), 0), Error);  // not cached
  EXPECT_THROW((void)pool.cached_after_prefix(blocks[2], a.sequence(), 4), Error);
  EXPECT_THROW((void)pool.cached_after_prefix(99, a.sequence(), 1), Error);
}

// A caller's BlockSequence is hostile input too: a block hash that is empty (a default
// BlockHash, the "no hash" value) would be inserted into the map while the block reads as
// uncached, so the block would be reused without leaving the map (a dangling entry). Refused,
// by commit_store() and cache_full_blocks(), with nothing changed.
TEST(BlockPool, EmptyBlockHashInASequenceIsRejected) {
  for (const bool chain : {false, true}) {
    BlockPoolConfig c = config(8);
    c.chain_hashes_identify_prefix = chain;
    BlockPool pool(c);
    const auto seq = sequence(iota_tokens(0, 12));
    std::vector<BlockHash> hashes(seq.block_hashes().begin(), seq.block_hashes().end());
    hashes[1] = BlockHash();
    BlockSequence bad = seq.sequence();
    bad.block_hashes = hashes;
    const auto blocks = take(pool, 3);
    expect_rejected(
        pool, [&] { pool.cache_full_blocks(bad, blocks, 0, 3); },
        "block 1 of the sequence has no hash");
    expect_rejected(
        pool,
        [&] {
          pool.commit_store(pool.prepare_store(bad, 1, 2, std::vector<BlockId>{}),
                            std::vector<BlockId>{blocks[1]});
        },
        "block 1 of the sequence has no hash");
    // The blocks before the empty hash are fine.
    pool.cache_full_blocks(bad, blocks, 0, 1);
    pool.free_blocks(blocks);
    pool.check_invariants();
    (void)take(pool, 7);  // every block reallocated: block 0's cached one is evicted
    pool.check_invariants();
  }
}

// Queries that take a caller's block ids check them: same_content_chain() read the records of
// ids out of range, stored_parent_hash() / stored_tokens() read past their tables, or an empty
// token table in a pool that stores no chain material.
TEST(BlockPool, ChainQueriesCheckTheirIds) {
  const auto expect_error = [](ErrorCode code, auto call, const std::string& fragment) {
    try {
      (void)call();
      ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  for (const bool chain : {false, true}) {
    SCOPED_TRACE(chain ? "chain hashes" : "content ids");
    BlockPoolConfig c = config(8);
    c.chain_hashes_identify_prefix = chain;
    BlockPool pool(c);
    const auto seq = sequence(iota_tokens(0, 8));
    const auto blocks = take(pool, 4);
    pool.cache_full_blocks(seq.sequence(), blocks, 0, 2);
    EXPECT_TRUE(pool.same_content_chain(blocks[0], blocks[1]));
    expect_error(
        ErrorCode::kOutOfRange, [&] { return pool.same_content_chain(blocks[0], 99); },
        "out of range");
    expect_error(
        ErrorCode::kOutOfRange, [&] { return pool.same_content_chain(-5, blocks[1]); },
        "out of range");
    if (chain) {
      EXPECT_EQ(pool.stored_parent_hash(blocks[1]), seq.block_hashes()[0]);
      EXPECT_EQ(pool.stored_tokens(blocks[1])[0], 4);
      expect_error(
          ErrorCode::kOutOfRange, [&] { return pool.stored_parent_hash(8); }, "out of range");
      expect_error(
          ErrorCode::kOutOfRange, [&] { return pool.stored_tokens(-1); }, "out of range");
    } else {
      expect_error(
          ErrorCode::kInvalidState, [&] { return pool.stored_tokens(blocks[1]); },
          "no chain material");
      expect_error(
          ErrorCode::kInvalidState, [&] { return pool.stored_parent_hash(blocks[1]); },
          "no chain material");
    }
  }
}

// The parent identity of a store comes from the nearest cached block of prefix_row only when
// that block holds seq's block there (its hash and group, as guarded pools check): a caller's
// cached block of other content used to give the new block another prefix's content id, so the
// request's own chain missed it and a colliding chain through that other prefix could hit it.
TEST(BlockPool, PrefixRowBlockOfOtherContentIsNotTheParent) {
  BlockPool pool(config(8));  // content ids
  const auto a = sequence(iota_tokens(0, 8));
  const auto b = sequence(iota_tokens(100, 8));
  const auto rows_a = take(pool, 2);
  const auto rows_b = take(pool, 1);
  pool.cache_full_blocks(a.sequence(), rows_a, 0, 1);
  pool.cache_full_blocks(b.sequence(), rows_b, 0, 1);
  // rows_b[0] holds b's block 0, not a's: it is no parent of a's block 1.
  pool.cache_full_blocks(a.sequence(), std::vector<BlockId>{rows_b[0], rows_a[1]}, 1, 2);
  pool.check_invariants();
  EXPECT_EQ(pool.match_cached_block(a.sequence(), 1, rows_a[0]), rows_a[1]);
  auto b_then_a = sequence(iota_tokens(100, 4));
  b_then_a.append(iota_tokens(4, 4));
  EXPECT_EQ(pool.match_cached_block(b_then_a.sequence(), 1, rows_b[0]), BlockPool::kNoBlock);
}

// A PendingStore prepared before reset_prefix_cache() holds references into tables the reset
// cleared: committing it used to cache blocks under dangling content ids, and destroying it
// released ids that no longer existed. Its commit is now refused and its release is a no-op.
TEST(BlockPool, StorePreparedBeforeAResetIsStale) {
  for (const bool chain : {false, true}) {
    SCOPED_TRACE(chain ? "chain hashes" : "content ids");
    BlockPoolConfig c = config(8);
    c.chain_hashes_identify_prefix = chain;
    BlockPool pool(c);
    RequestHashKeys keys;
    keys.lora_name = "adapter";  // extra keys: interned ids too
    const auto seq = sequence(iota_tokens(0, 8), keys);
    {
      auto stale = pool.prepare_store(seq.sequence(), 0, 2, std::vector<BlockId>{});
      ASSERT_TRUE(pool.reset_prefix_cache());
      pool.check_invariants();
      (void)pool.take_events();
      const auto blocks = take(pool, 2);
      expect_rejected(
          pool, [&] { pool.commit_store(std::move(stale), blocks); }, "reset_prefix_cache");
      pool.free_blocks(blocks);
    }
    {
      auto dropped = pool.prepare_store(seq.sequence(), 0, 2, std::vector<BlockId>{});
      ASSERT_TRUE(pool.reset_prefix_cache());
    }  // destroyed after the reset: releases nothing
    pool.check_invariants();
    // The pool works on: a fresh store caches, and a lookup hits it.
    const auto blocks = take(pool, 2);
    pool.cache_full_blocks(seq.sequence(), blocks, 0, 2);
    pool.check_invariants();
    EXPECT_EQ(pool.match_cached_block(seq.sequence(), 0, BlockPool::kNoBlock), blocks[0]);
    EXPECT_EQ(pool.match_cached_block(seq.sequence(), 1, blocks[0]), blocks[1]);
  }
}

}  // namespace
}  // namespace pagedkv
