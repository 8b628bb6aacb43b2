// KVCacheManager with several KV-cache groups: sliding-window hits, out-of-window freeing, the
// hybrid fixed point, mixed block sizes, and a randomized invariant/safety run.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "test_tokens.hpp"

namespace pagedkv {
namespace {

KVCacheManagerConfig config(std::vector<AttentionSpec> groups, std::int32_t num_blocks = 256) {
  KVCacheManagerConfig c;
  c.num_blocks = num_blocks;
  c.groups = std::move(groups);
  c.hash_seed = "hybrid";
  return c;
}

// Admits a whole prompt in one allocation; returns each group's block table row.
std::vector<std::vector<BlockId>> admit(KVCacheManager& m, Request& r) {
  const CacheHit hit = m.get_computed_blocks(r);
  EXPECT_TRUE(m.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit).has_value());
  r.set_num_computed_tokens(r.num_tokens());
  std::vector<std::vector<BlockId>> rows;
  for (std::size_t g = 0; g < m.num_groups(); ++g) {
    rows.emplace_back(m.block_ids(r.id(), g).begin(), m.block_ids(r.id(), g).end());
  }
  return rows;
}

// Block size 2, window 4: a hit needs ceil(3 / 2) = 2 contiguous cached blocks, searched from the
// right; a shorter run counts only when it starts at block 0. 13 tokens = 6 full blocks, and the
// last token is never a hit, so at most 12 tokens hit.
TEST(SlidingWindow, HitLengthTable) {
  struct Case {
    std::vector<int> evicted;  // block positions of the first request dropped from the cache
    std::size_t hit_tokens;
  };
  const Case cases[] = {
      {{}, 12},    {{0}, 12},      {{5}, 10},      {{4}, 8},          {{4, 5}, 8},
      {{3, 5}, 6}, {{1, 3, 5}, 2}, {{0, 2, 4}, 0}, {{2, 3, 4, 5}, 4}, {{0, 1, 2, 3, 4, 5}, 0},
  };
  for (const Case& c : cases) {
    KVCacheManager m(config({AttentionSpec::sliding(2, 4)}));
    Request a = m.make_request(1, iota_tokens(0, 13));
    const auto rows = admit(m, a);
    m.free(a);
    std::vector<BlockId> drop;
    for (int p : c.evicted) drop.push_back(rows[0][static_cast<std::size_t>(p)]);
    m.evict_blocks(drop);
    Request b = m.make_request(2, iota_tokens(0, 13));
    const CacheHit hit = m.get_computed_blocks(b);
    std::string name = "evicted {";
    for (int p : c.evicted) name += std::to_string(p) + " ";
    SCOPED_TRACE(name + "}");
    EXPECT_EQ(hit.num_tokens, c.hit_tokens);
    ASSERT_EQ(hit.blocks.size(), c.hit_tokens / 2);
    // The run's blocks are the first request's; everything before the window is the null block.
    const std::size_t n = hit.blocks.size();
    for (std::size_t i = 0; i < n; ++i) {
      const bool in_run = n < 2 ? true : i + 2 >= n;
      EXPECT_EQ(hit.blocks[i], in_run ? rows[0][i] : kNullBlockId) << "position " << i;
    }
    ASSERT_TRUE(m.allocate_slots(b, 13 - hit.num_tokens, hit).has_value());
    m.check_invariants();
  }
}

TEST(SlidingWindow, BlocksLeavingTheWindowAreFreedLaterFirst) {
  KVCacheManagerConfig c = config({AttentionSpec::sliding(2, 4)}, 32);
  c.enable_kv_events = true;
  KVCacheManager m(c);
  Request r = m.make_request(1, iota_tokens(0, 12));
  const auto rows = admit(m, r);  // 6 blocks, all cached
  ASSERT_EQ(rows[0].size(), 6u);
  const std::vector<BlockId> queue_before = m.block_pool().free_queue().ids();
  r.append_token(100);
  ASSERT_TRUE(m.allocate_slots(r, 1).has_value());
  // 12 computed tokens, window 4: tokens 0..8 are out of sight, so blocks 0..3 are released,
  // block 3 first; cached blocks go to the free queue's tail in that order.
  const auto row = m.block_ids(1);
  EXPECT_EQ(std::vector<BlockId>(row.begin(), row.begin() + 4),
            std::vector<BlockId>(4, kNullBlockId));
  EXPECT_EQ(row[4], rows[0][4]);
  EXPECT_EQ(m.num_out_of_window_blocks_freed(), 4u);
  const auto queue = m.block_pool().free_queue().ids();
  ASSERT_GE(queue.size(), 4u);
  EXPECT_EQ(std::vector<BlockId>(queue.end() - 4, queue.end()),
            (std::vector<BlockId>{rows[0][3], rows[0][2], rows[0][1], rows[0][0]}));
  m.check_invariants();
  // They stay cached: a new request with the same prefix still hits through them.
  Request again = m.make_request(2, iota_tokens(0, 12));
  EXPECT_EQ(m.get_computed_blocks(again).num_tokens, 10u);
  m.free(r);
  m.check_invariants();
}

TEST(SlidingWindow, ReleasedBlocksCountAsCapacity) {
  // 7 usable blocks; a 14-token prompt takes all of them. The next decode step needs an 8th block:
  // with a window of 4 the blocks that left it make room; with full attention it does not fit.
  for (const bool window : {true, false}) {
    KVCacheManager m(config({window ? AttentionSpec::sliding(2, 4) : AttentionSpec::full(2)}, 8));
    Request r = m.make_request(1, iota_tokens(0, 14));
    admit(m, r);
    r.append_token(99);
    const auto before = m.snapshot();
    const auto got = m.allocate_slots(r, 1);
    EXPECT_EQ(got.has_value(), window);
    if (!window) {
      EXPECT_EQ(m.snapshot(), before);
    }
    m.check_invariants();
  }
}

// Full attention (B = 2) plus a window of 4 (B = 2): the hit is the longest length both accept.
TEST(Hybrid, FixedPointWithEntriesRemovedFromOneGroup) {
  auto run = [](const std::vector<int>& drop_full, const std::vector<int>& drop_window) {
    KVCacheManager m(config({AttentionSpec::full(2), AttentionSpec::sliding(2, 4)}));
    Request a = m.make_request(1, iota_tokens(0, 13));
    const auto rows = admit(m, a);
    m.free(a);
    std::vector<BlockId> drop;
    for (int p : drop_full) drop.push_back(rows[0][static_cast<std::size_t>(p)]);
    for (int p : drop_window) drop.push_back(rows[1][static_cast<std::size_t>(p)]);
    m.evict_blocks(drop);
    Request b = m.make_request(2, iota_tokens(0, 13));
    const CacheHit hit = m.get_computed_blocks(b);
    EXPECT_EQ(hit.blocks.size() * 2, hit.num_tokens);
    EXPECT_EQ(hit.other_groups.at(0).size() * 2, hit.num_tokens);
    EXPECT_TRUE(m.allocate_slots(b, 13 - hit.num_tokens, hit).has_value());
    m.check_invariants();
    return hit.num_tokens;
  };
  EXPECT_EQ(run({}, {}), 12u);
  EXPECT_EQ(run({}, {5}), 10u);       // the window group shortens it
  EXPECT_EQ(run({}, {4}), 8u);        // ... to its next run of 2
  EXPECT_EQ(run({3}, {}), 6u);        // the full group shortens it; the window accepts 6
  EXPECT_EQ(run({3}, {2}), 4u);       // full: 6; the window misses block 2, finds blocks 0-1
  EXPECT_EQ(run({}, {1, 3, 5}), 2u);  // the window alone: the run at block 0
  EXPECT_EQ(run({0}, {}), 0u);
}

// Block sizes 16 (full) and 32 (window 64): requests are hashed at 16, a 32-token block is keyed
// by its two 16-token hashes, and the hit is aligned to lcm(16, 32) = 32 tokens.
TEST(Hybrid, MixedBlockSizes) {
  KVCacheManager m(config({AttentionSpec::full(16), AttentionSpec::sliding(32, 64)}));
  EXPECT_EQ(m.block_size(), 16u);
  auto prompt = iota_tokens(0, 200);
  Request a = m.make_request(1, prompt);
  const auto rows = admit(m, a);
  EXPECT_EQ(rows[0].size(), 13u);  // ceil(200 / 16)
  EXPECT_EQ(rows[1].size(), 7u);   // ceil(200 / 32)
  m.free(a);

  std::vector<TokenId> b_tokens(prompt.begin(), prompt.begin() + 150);
  b_tokens.push_back(9999);
  Request b = m.make_request(2, b_tokens);
  const CacheHit hit = m.get_computed_blocks(b);
  EXPECT_EQ(hit.num_tokens, 128u);  // 150 shared -> 9 full blocks (144) -> aligned down to 128
  EXPECT_EQ(hit.blocks.size(), 8u);
  ASSERT_EQ(hit.other_groups.at(0).size(), 4u);
  EXPECT_EQ(hit.other_groups[0][0], kNullBlockId);  // before the window's 2 blocks
  EXPECT_EQ(hit.other_groups[0][1], kNullBlockId);
  EXPECT_EQ(hit.other_groups[0][2], rows[1][2]);
  EXPECT_EQ(hit.other_groups[0][3], rows[1][3]);
  ASSERT_TRUE(m.allocate_slots(b, b.num_tokens() - hit.num_tokens, hit).has_value());
  m.check_invariants();

  // One different token in the second 16-token block changes the first 32-token block's key.
  auto c_tokens = prompt;
  c_tokens[20] = 77777;
  Request c = m.make_request(3, c_tokens);
  EXPECT_EQ(m.get_computed_blocks(c).num_tokens, 0u);  // full hit 16 -> aligned to 32 -> 0
  EXPECT_THROW(KVCacheManager(config({AttentionSpec::full(16), AttentionSpec::sliding(24, 64)})),
               Error);
}

// Full attention at block size 32 with a 17-token window at block size 16: hits end on multiples of
// 32 tokens and need ceil(16 / 16) = 1 window block, so only the window's odd blocks (the one just
// before each 32-token boundary) can ever be part of a hit, and only they are cached.
TEST(Hybrid, CachesOnlyWindowBlocksAFutureHitCanUse) {
  KVCacheManager m(config({AttentionSpec::full(32), AttentionSpec::sliding(16, 17)}));
  Request a = m.make_request(1, iota_tokens(0, 130));
  const auto rows = admit(m, a);
  ASSERT_EQ(rows[1].size(), 9u);
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(m.block_pool().block(rows[1][i]).is_cached(), i % 2 == 1) << "window block " << i;
  }
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(m.block_pool().block(rows[0][i]).is_cached());
  m.free(a);
  Request b = m.make_request(2, iota_tokens(0, 130));
  const CacheHit hit = m.get_computed_blocks(b);
  EXPECT_EQ(hit.num_tokens, 128u);
  ASSERT_EQ(hit.other_groups.at(0).size(), 8u);
  EXPECT_EQ(hit.other_groups[0][7], rows[1][7]);
  EXPECT_EQ(hit.other_groups[0][6], kNullBlockId);
  ASSERT_TRUE(m.allocate_slots(b, 2, hit).has_value());
  m.check_invariants();
}

TEST(Hybrid, RejectsHitsOfTheWrongShape) {
  KVCacheManager m(config({AttentionSpec::full(2), AttentionSpec::sliding(2, 4)}));
  Request a = m.make_request(1, iota_tokens(0, 9));
  admit(m, a);
  Request b = m.make_request(2, iota_tokens(0, 9));
  CacheHit hit = m.get_computed_blocks(b);
  ASSERT_EQ(hit.num_tokens, 8u);
  CacheHit one_group = hit;
  one_group.other_groups.clear();
  const auto before = m.snapshot();
  EXPECT_THROW((void)m.allocate_slots(b, 1, one_group), Error);
  CacheHit short_window = hit;
  short_window.other_groups[0].pop_back();
  EXPECT_THROW((void)m.allocate_slots(b, 1, short_window), Error);
  EXPECT_EQ(m.snapshot(), before);
  EXPECT_THROW((void)m.block_ids(1, 2), Error);
}

// Random workload on a hybrid model: invariants after every operation, and every hit block, in
// every group, holds exactly the request's prefix.
class HybridRandomized : public ::testing::TestWithParam<std::vector<AttentionSpec>> {};

TEST_P(HybridRandomized, InvariantsAndHitSafety) {
  KVCacheManager m(config(GetParam(), 40));
  std::mt19937 rng(5);
  auto uniform = [&](std::size_t lo, std::size_t hi) { return lo + rng() % (hi - lo + 1); };
  std::vector<std::vector<TokenId>> prefixes(3);
  for (auto& p : prefixes) {
    p.resize(uniform(4, 40));
    for (auto& t : p) t = static_cast<TokenId>(uniform(0, 3));
  }
  std::vector<Request> running;
  std::map<BlockId, std::vector<TokenId>> shadow;  // what a cached block holds: its whole prefix
  std::uint64_t hit_blocks = 0;
  RequestId next = 1;
  auto record = [&](const Request& r) {
    for (std::size_t g = 0; g < m.num_groups(); ++g) {
      const std::size_t bs = m.group_spec(g).block_size;
      const auto row = m.block_ids(r.id(), g);
      for (std::size_t i = 0; i < row.size(); ++i) {
        if (row[i] == kNullBlockId || !m.block_pool().block(row[i]).is_cached()) continue;
        if ((i + 1) * bs > r.num_tokens()) continue;
        shadow[row[i]] =
            std::vector<TokenId>(r.tokens().begin(), r.tokens().begin() + (i + 1) * bs);
      }
    }
  };
  for (int op = 0; op < 20000; ++op) {
    const std::size_t kind = uniform(0, 9);
    if (kind < 4 || running.empty()) {
      auto tokens = prefixes[uniform(0, 2)];
      for (std::size_t i = uniform(1, 30); i > 0; --i)
        tokens.push_back(static_cast<TokenId>(uniform(0, 3)));
      Request r = m.make_request(next++, tokens);
      const CacheHit hit = m.get_computed_blocks(r);
      for (std::size_t g = 0; g < m.num_groups(); ++g) {
        const std::size_t bs = m.group_spec(g).block_size;
        const auto& blocks = hit.group(g);
        ASSERT_EQ(blocks.size() * bs, hit.num_tokens);
        for (std::size_t i = 0; i < blocks.size(); ++i) {
          if (blocks[i] == kNullBlockId) continue;
          ++hit_blocks;
          ASSERT_EQ(shadow.at(blocks[i]),
                    std::vector<TokenId>(r.tokens().begin(), r.tokens().begin() + (i + 1) * bs))
              << "wrong hit in group " << g << " at block " << i << ", op " << op;
        }
      }
      const std::size_t n = uniform(1, r.num_tokens() - hit.num_tokens);
      if (m.allocate_slots(r, n, hit)) {
        r.set_num_computed_tokens(hit.num_tokens + n);
        record(r);
        running.push_back(std::move(r));
      }
    } else {
      const std::size_t i = uniform(0, running.size() - 1);
      Request& r = running[i];
      if (kind < 7) {
        if (r.num_computed_tokens() == r.num_tokens())
          r.append_token(static_cast<TokenId>(uniform(0, 3)));
        const std::size_t n = uniform(1, r.num_tokens() - r.num_computed_tokens());
        if (m.allocate_slots(r, n)) {
          r.set_num_computed_tokens(r.num_computed_tokens() + n);
          record(r);
        } else {
          m.preempt(r);
          running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
        }
      } else if (kind < 9) {
        m.free(r);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        m.evict_blocks(std::vector<BlockId>{static_cast<BlockId>(uniform(1, 39))});
      }
    }
    m.check_invariants();
  }
  EXPECT_GT(hit_blocks, 1000u);
  EXPECT_GT(m.num_out_of_window_blocks_freed(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Groups, HybridRandomized,
    ::testing::Values(
        // window block coarser than the full group's
        std::vector<AttentionSpec>{AttentionSpec::full(4), AttentionSpec::sliding(8, 12)},
        // window block finer than the alignment: only blocks before 8-token ends are cached
        std::vector<AttentionSpec>{AttentionSpec::full(8), AttentionSpec::sliding(4, 5)},
        // two windows and full attention, all at one block size
        std::vector<AttentionSpec>{AttentionSpec::sliding(4, 9), AttentionSpec::full(4),
                                   AttentionSpec::sliding(4, 17)}));

// vLLM's case: window 4, block size 2. A block that left the first request's window is evicted
// while the request still holds the next one; another request caches the same content again;
// a later request's hit runs through the re-cached block and the old next one: 12 tokens.
TEST(SlidingWindow, RunThroughARecachedBlockIsAHit) {
  for (const HashScheme scheme : {HashScheme::kSha256, HashScheme::kXxh3_128}) {
    KVCacheManagerConfig c = config({AttentionSpec::sliding(2, 4)});
    c.hash_scheme = scheme;
    KVCacheManager m(c);
    Request a = m.make_request(1, iota_tokens(0, 14));
    const auto rows = admit(m, a);
    ASSERT_EQ(rows[0].size(), 7u);
    a.append_token(99);
    ASSERT_TRUE(m.allocate_slots(a, 1));  // blocks 0..4 leave the window
    ASSERT_EQ(m.block_ids(1)[4], kNullBlockId);
    ASSERT_EQ(m.evict_blocks(std::vector<BlockId>{rows[0][4]}), 1u);
    Request b = m.make_request(2, iota_tokens(0, 11));  // hits blocks 2, 3; recomputes 4
    admit(m, b);
    Request d = m.make_request(3, iota_tokens(0, 13));
    EXPECT_EQ(m.get_computed_blocks(d).num_tokens, 12u) << to_string(scheme);
    m.check_invariants();
  }
}

// Mixed block sizes: vLLM rounds the tokens to cache down to a multiple of the LCM of the group
// block sizes (32 here) before each group caches its full blocks. A 112-token request caches 3
// full-attention blocks and 6 (not 7) window blocks; the uncached window block is freed to the
// head of the free queue.
TEST(Hybrid, CachingIsClampedToTheCommonBlockSize) {
  KVCacheManagerConfig c = config({AttentionSpec::full(32), AttentionSpec::sliding(16, 32)}, 64);
  c.enable_kv_events = true;
  KVCacheManager m(c);
  Request r = m.make_request(1, iota_tokens(0, 112));
  const auto rows = admit(m, r);
  ASSERT_EQ(rows[0].size(), 4u);
  ASSERT_EQ(rows[1].size(), 7u);
  const auto events = m.take_events();
  std::map<GroupId, std::size_t> stored;
  for (const KVEvent& e : events) {
    if (const auto* s = std::get_if<BlockStored>(&e.data))
      stored[s->group_id] += s->block_hashes.size();
  }
  EXPECT_EQ(stored[0], 3u);
  EXPECT_EQ(stored[1], 6u);
  EXPECT_FALSE(m.block_pool().block(rows[1][6]).is_cached());
  m.free(r);
  EXPECT_EQ(m.block_pool().free_queue().front(), rows[1][6]);
  m.check_invariants();
}

// A window near 2^32 tokens needs every block a request has: window_blocks() used to compute
// ceil((window - 1) / block_size) in 32 bits, where window - 1 + block_size - 1 wrapped to a
// small number, so a hit kept only its last block and put the null block where the window still
// needs the KV.
TEST(SlidingWindow, AHugeWindowNeedsEveryBlock) {
  constexpr std::uint32_t kWindow = std::numeric_limits<std::uint32_t>::max();
  EXPECT_EQ(AttentionSpec::sliding(4, kWindow).window_blocks(), 1073741824u);  // ceil((2^32-2)/4)
  EXPECT_EQ(AttentionSpec::sliding(1, kWindow).window_blocks(), kWindow - 1);
  EXPECT_EQ(AttentionSpec::sliding(4, 5).window_blocks(), 1u);
  EXPECT_EQ(AttentionSpec::sliding(4, 6).window_blocks(), 2u);
  KVCacheManager m(config({AttentionSpec::sliding(4, kWindow)}));
  Request a = m.make_request(1, iota_tokens(0, 13));
  const auto rows = admit(m, a);
  m.free(a);
  Request b = m.make_request(2, iota_tokens(0, 13));
  const CacheHit hit = m.get_computed_blocks(b);
  ASSERT_EQ(hit.num_tokens, 12u);
  ASSERT_EQ(hit.blocks.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(hit.blocks[i], rows[0][i]) << "position " << i;
}

// A hit's null blocks in a sliding-window group may stand only where the window no longer looks
// (positions before the hit's last window_blocks() blocks): a hit with the null block inside the
// window used to be taken, and the request's window then read the null block's KV.
TEST(Hybrid, HitWithTheNullBlockInsideTheWindowIsRejected) {
  KVCacheManager m(config({AttentionSpec::full(2), AttentionSpec::sliding(2, 4)}));
  Request a = m.make_request(1, iota_tokens(0, 9));
  admit(m, a);
  Request b = m.make_request(2, iota_tokens(0, 9));
  const CacheHit hit = m.get_computed_blocks(b);
  ASSERT_EQ(hit.num_tokens, 8u);
  ASSERT_EQ(hit.other_groups[0],
            (std::vector<BlockId>{kNullBlockId, kNullBlockId, hit.other_groups[0][2],
                                  hit.other_groups[0][3]}));
  const auto before = m.snapshot();
  for (const std::size_t p : {2, 3}) {
    CacheHit bad = hit;
    bad.other_groups[0][p] = kNullBlockId;
    try {
      (void)m.allocate_slots(b, 1, bad);
      ADD_FAILURE() << "a null block at window position " << p << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("inside its sliding window"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(m.snapshot(), before);
  }
  ASSERT_TRUE(m.allocate_slots(b, 1, hit).has_value());
  m.check_invariants();
}

}  // namespace
}  // namespace pagedkv
