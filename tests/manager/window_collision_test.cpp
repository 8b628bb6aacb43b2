// Hash collisions against sliding-window hits and repeated blocks (the two gaps the fuzz harness
// found): with a deliberately weakened hash, a window hit is 0 or exactly the true prefix, and a
// hit never names one block twice.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

constexpr std::uint32_t kBs = 2;

KVCacheManagerConfig weak_config(std::vector<AttentionSpec> groups, HashScheme scheme,
                                 bool verify = true) {
  KVCacheManagerConfig c;
  c.num_blocks = 128;
  c.block_size = kBs;
  c.groups = std::move(groups);
  c.verify_cache_hits = verify;
  c.hasher = BlockHasher::weak_for_testing(scheme, "window-collision", 1);
  return c;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Caches the whole prompt of request `id` and frees it (its blocks stay cached); returns each
// group's block table row.
std::vector<std::vector<BlockId>> cache_prompt(KVCacheManager& m, RequestId id,
                                               const std::vector<TokenId>& tokens) {
  Request r = m.make_request(id, tokens);
  EXPECT_TRUE(m.allocate_slots(r, r.num_tokens(), CacheHit{}).has_value());
  std::vector<std::vector<BlockId>> rows;
  for (std::size_t g = 0; g < m.num_groups(); ++g) {
    rows.emplace_back(m.block_ids(r.id(), g).begin(), m.block_ids(r.id(), g).end());
  }
  m.free(r);
  return rows;
}

// A prefix of `blocks` blocks, with tokens disjoint from `avoid`'s, whose weak hash of the
// following `suffix` block equals that of `target` (1-bit hash: about every second try).
std::vector<TokenId> colliding_prefix(const KVCacheManager& m, std::size_t blocks,
                                      const std::vector<TokenId>& suffix, const BlockHash& target) {
  for (TokenId base = 1000; base < 1100; ++base) {
    std::vector<TokenId> prefix;
    for (std::size_t t = 0; t < blocks * kBs; ++t) prefix.push_back(base + static_cast<TokenId>(t));
    const Request probe = m.make_request(9999, concat(prefix, suffix));
    if (probe.block_hashes()[blocks] == target) return prefix;
  }
  ADD_FAILURE() << "no collision in 100 tries with a 1-bit hash";
  return {};
}

class WindowCollision : public ::testing::TestWithParam<HashScheme> {};

// One window group (block size 2, window 3: a hit needs 1 cached block). A = P + S is cached.
// B = P' + S + 1 token, where P' differs from P everywhere but B's block 3 (S after P') has A's
// block 3's weak hash. The right-to-left search finds A's block 3 by its tokens and hash; it was
// cached after P, not after P', so it is not B's: B's hit is 0. C = P + S + 1 token still hits
// its whole true prefix.
TEST_P(WindowCollision, WindowRunAfterAnotherPrefixIsNoHit) {
  KVCacheManager m(weak_config({AttentionSpec::sliding(kBs, 3)}, GetParam()));
  const std::vector<TokenId> p = {1, 2, 3, 4, 5, 6};
  const std::vector<TokenId> s = {9, 9};
  const auto a_rows = cache_prompt(m, 1, concat(p, s));
  const Request a_probe = m.make_request(9998, concat(p, s));
  const std::vector<TokenId> p2 = colliding_prefix(m, 3, s, a_probe.block_hashes()[3]);
  ASSERT_FALSE(p2.empty());

  Request b = m.make_request(2, concat(concat(p2, s), {0}));
  ASSERT_EQ(b.block_hashes()[3], a_probe.block_hashes()[3]);
  const CacheHit bad = m.get_computed_blocks(b);
  EXPECT_EQ(bad.num_tokens, 0u) << "a window hit on a block cached after another prefix";
  EXPECT_TRUE(m.allocate_slots(b, b.num_tokens(), bad).has_value());
  const std::vector<BlockId> b_row(m.block_ids(b.id(), 0).begin(), m.block_ids(b.id(), 0).end());
  m.free(b);

  Request c = m.make_request(3, concat(concat(p, s), {0}));
  const CacheHit good = m.get_computed_blocks(c);
  ASSERT_EQ(good.num_tokens, 4 * kBs);
  EXPECT_EQ(good.blocks,
            (std::vector<BlockId>{kNullBlockId, kNullBlockId, kNullBlockId, a_rows[0][3]}));
  // With A's block 0 evicted the cached prefix no longer reaches block 3: the identity of C's
  // blocks [0, 3) is chained from C's own tokens, and the true hit stays a hit.
  ASSERT_EQ(m.evict_blocks(std::vector<BlockId>{a_rows[0][0]}), 1u);
  EXPECT_EQ(m.get_computed_blocks(c).blocks, good.blocks);
  // B's own blocks are cached now, after A's colliding block 3: a hit of B is a true prefix,
  // its window on B's own blocks, never on A's (A's block 3, found first by the unanchored
  // lookup, may shadow B's: the hit then ends earlier).
  Request b_again = m.make_request(5, concat(concat(p2, s), {0}));
  const CacheHit again = m.get_computed_blocks(b_again);
  EXPECT_GT(again.num_tokens, 0u);
  for (std::size_t i = 0; i < again.blocks.size(); ++i) {
    if (again.blocks[i] != kNullBlockId) {
      EXPECT_EQ(again.blocks[i], b_row[i]) << i;
    }
  }
  m.check_invariants();
}

// The same collision in a hybrid model (full attention + window): the full group hits B's true
// prefix P + S (A's blocks), but A's window block 3 was evicted and D = P' + S, whose window
// block 3 collides with it, is cached. The window run on D's block is rejected (D's block follows
// P'), so the hit falls back to the longest length both groups really hold: 3 blocks.
TEST_P(WindowCollision, HybridWindowRunAfterAnotherPrefixIsRejected) {
  KVCacheManager m(
      weak_config({AttentionSpec::full(kBs), AttentionSpec::sliding(kBs, 3)}, GetParam()));
  const std::vector<TokenId> p = {1, 2, 3, 4, 5, 6};
  const std::vector<TokenId> s = {9, 9};
  const auto a_rows = cache_prompt(m, 1, concat(p, s));
  const Request a_probe = m.make_request(9998, concat(p, s));
  const std::vector<TokenId> p2 = colliding_prefix(m, 3, s, a_probe.block_hashes()[3]);
  ASSERT_FALSE(p2.empty());
  const auto d_rows = cache_prompt(m, 4, concat(p2, s));
  ASSERT_EQ(m.evict_blocks(std::vector<BlockId>{a_rows[1][3]}), 1u);

  Request b = m.make_request(2, concat(concat(p, s), {0}));
  const CacheHit hit = m.get_computed_blocks(b);
  ASSERT_EQ(hit.num_tokens, 3 * kBs);
  EXPECT_EQ(hit.blocks, (std::vector<BlockId>{a_rows[0][0], a_rows[0][1], a_rows[0][2]}));
  EXPECT_EQ(hit.group(1), (std::vector<BlockId>{kNullBlockId, kNullBlockId, a_rows[1][2]}));
  for (const BlockId id : hit.group(1)) EXPECT_NE(id, d_rows[1][3]);
  EXPECT_TRUE(m.allocate_slots(b, b.num_tokens() - hit.num_tokens, hit).has_value());
  m.free(b);
  m.check_invariants();
}

// Without verification a weak hash may give wrong hits (the documented failure mode), but never
// one naming a block twice: R's blocks 0 and 1 have equal weak hashes and only block 0 is cached,
// so the search would return that block for both positions. The hit is dropped, and R can be
// allocated and freed.
TEST_P(WindowCollision, UnverifiedHitNeverRepeatsABlock) {
  for (const bool window : {false, true}) {
    KVCacheManager m(
        weak_config({window ? AttentionSpec::sliding(kBs, 5) : AttentionSpec::full(kBs)},
                    GetParam(), /*verify=*/false));
    const std::vector<TokenId> first = {7, 7};
    const auto rows = cache_prompt(m, 1, concat(first, {1}));  // caches block 0 only
    std::vector<TokenId> second;
    for (TokenId t = 0; t < 100 && second.empty(); ++t) {
      const Request probe = m.make_request(9999, concat(first, {t, t, 0}));
      if (probe.block_hashes()[1] == probe.block_hashes()[0]) second = {t, t};
    }
    ASSERT_FALSE(second.empty());
    Request r = m.make_request(2, concat(concat(first, second), {0}));
    const CacheHit hit = m.get_computed_blocks(r);
    EXPECT_EQ(hit.num_tokens, 0u) << "window " << window;
    // The hit the search found, given by hand: refused, nothing changes.
    const CacheHit twice{{rows[0][0], rows[0][0]}, 2 * kBs, {}};
    const auto before = m.snapshot();
    EXPECT_THROW(m.allocate_slots(r, 1, twice), Error);
    EXPECT_TRUE(m.snapshot() == before);
    EXPECT_TRUE(m.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit).has_value());
    EXPECT_NO_THROW(m.free(r));
    m.check_invariants();
  }
}

INSTANTIATE_TEST_SUITE_P(WeakHashes, WindowCollision,
                         ::testing::Values(HashScheme::kXxh3_128, HashScheme::kSha256),
                         [](const auto& param_info) {
                           return param_info.param == HashScheme::kXxh3_128
                                      ? std::string("xxh3_128")
                                      : std::string("sha256");
                         });

}  // namespace
}  // namespace pagedkv
