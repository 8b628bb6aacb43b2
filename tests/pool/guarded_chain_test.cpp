// Guarded chain hashes (BlockPoolConfig::guard_chain_hashes): prefixes identified by their
// chained hashes, kept exact by one content per (hash, group) and by orphan records of evicted
// parents. Without collisions a guarded pool behaves exactly as a content-id pool (checked op by
// op on random workloads); with a weak hash a hit is still only ever a true prefix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/hash/request_hasher.hpp"
#include "pagedkv/pool/block_pool.hpp"
#include "test_tokens.hpp"

namespace pagedkv {
namespace {

constexpr std::uint32_t kBlockSize = 4;

BlockPoolConfig guarded_config(std::int32_t n) {
  BlockPoolConfig c;
  c.num_blocks = n;
  c.block_size = kBlockSize;
  c.enable_kv_events = true;
  c.guard_chain_hashes = true;
  return c;
}

RequestBlockHasher sequence(const std::vector<TokenId>& tokens, const BlockHasher& hasher) {
  RequestBlockHasher seq(hasher, kBlockSize, {});
  seq.append(tokens);
  return seq;
}

std::vector<BlockId> take(BlockPool& pool, std::int32_t n) {
  std::vector<BlockId> out;
  EXPECT_TRUE(pool.get_new_blocks(n, out));
  return out;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Two first blocks p != q whose hashes collide under `weak`, while each one's child with tokens
// `suffix` has another hash (a collision inside one chain would refuse the child).
std::pair<std::vector<TokenId>, std::vector<TokenId>> colliding_pair(
    const BlockHasher& weak, const std::vector<TokenId>& suffix) {
  for (TokenId a = 1; a < 200; ++a) {
    const auto sp = sequence(concat({a, a, a, a}, suffix), weak);
    if (sp.block_hashes()[1] == sp.block_hashes()[0]) continue;
    for (TokenId b = a + 1; b < 200; ++b) {
      const auto sq = sequence(concat({b, b, b, b}, suffix), weak);
      if (sq.block_hashes()[0] == sp.block_hashes()[0]) return {{a, a, a, a}, {b, b, b, b}};
    }
  }
  return {};
}

TEST(GuardedChainHashes, AStoreWhoseHashNamesOtherContentIsNotCached) {
  const BlockHasher weak = BlockHasher::weak_for_testing(HashScheme::kXxh3_128, "g", 4);
  const auto [p, q] = colliding_pair(weak, {5, 5, 5, 5});
  ASSERT_FALSE(q.empty());
  BlockPool pool(guarded_config(16));
  const auto sp = sequence(concat(p, {5, 5, 5, 5}), weak);
  const auto bp = take(pool, 2);
  pool.cache_full_blocks(sp.sequence(), bp, 0, 2);
  (void)pool.take_events();
  // q's first block collides with p's: q is not cached from there on, and no event says it is.
  const auto sq = sequence(concat(q, {5, 5, 5, 5}), weak);
  const auto bq = take(pool, 2);
  pool.cache_full_blocks(sq.sequence(), bq, 0, 2);
  EXPECT_FALSE(pool.block(bq[0]).is_cached());
  EXPECT_FALSE(pool.block(bq[1]).is_cached());
  EXPECT_TRUE(pool.take_events().empty());
  EXPECT_EQ(pool.match_cached_block(sq.sequence(), 0, BlockPool::kNoBlock), BlockPool::kNoBlock);
  EXPECT_EQ(pool.match_cached_block(sp.sequence(), 0, BlockPool::kNoBlock), bp[0]);
  EXPECT_EQ(pool.match_cached_block(sp.sequence(), 1, bp[0]), bp[1]);
  pool.check_invariants();
  // The same content again is a duplicate of the first: cached, and the event names it.
  const auto again = take(pool, 2);
  pool.cache_full_blocks(sp.sequence(), again, 0, 2);
  EXPECT_TRUE(pool.block(again[0]).is_cached());
  EXPECT_TRUE(pool.block(again[1]).is_cached());
  EXPECT_EQ(pool.take_events().size(), 1u);
  pool.check_invariants();
  EXPECT_EQ(pool.snapshot().children[static_cast<std::size_t>(bp[0])], 1u);
  EXPECT_EQ(pool.snapshot().children[static_cast<std::size_t>(again[0])], 1u);
}

TEST(GuardedChainHashes, AConflictInsideAStoreKeepsTheBlocksBeforeIt) {
  const BlockHasher weak = BlockHasher::weak_for_testing(HashScheme::kXxh3_128, "g", 1);
  BlockPool pool(guarded_config(32));
  // Cache many two-block chains until one store's second block collides with a cached one.
  const auto first = sequence({1, 2, 3, 4, 9, 9, 9, 9}, weak);
  pool.cache_full_blocks(first.sequence(), take(pool, 2), 0, 2);
  bool split = false;
  for (TokenId t = 10; t < 40 && !split; ++t) {
    const auto s = sequence({t, t, t, t, t, 0, 0, 0}, weak);
    if (s.block_hashes()[0] == first.block_hashes()[0] ||
        s.block_hashes()[1] != first.block_hashes()[1]) {
      continue;
    }
    const auto blocks = take(pool, 2);
    (void)pool.take_events();
    pool.cache_full_blocks(s.sequence(), blocks, 0, 2);
    EXPECT_TRUE(pool.block(blocks[0]).is_cached());
    EXPECT_FALSE(pool.block(blocks[1]).is_cached());
    const auto events = pool.take_events();
    ASSERT_EQ(events.size(), 1u);
    const auto& stored = std::get<BlockStored>(events[0].data);
    EXPECT_EQ(stored.block_hashes.size(), 1u);
    EXPECT_EQ(stored.token_ids.size(), kBlockSize);
    pool.check_invariants();
    split = true;
  }
  EXPECT_TRUE(split) << "no second-block collision found: the test is vacuous";
}

TEST(GuardedChainHashes, ChildStaysAHitThroughAnOrphanAndTheOrphanGoesWithIt) {
  const BlockHasher hasher(HashScheme::kXxh3_128, "g");
  BlockPool pool(guarded_config(16));
  const auto seq = sequence(iota_tokens(0, 12), hasher);
  const auto chain = take(pool, 3);
  pool.cache_full_blocks(seq.sequence(), chain, 0, 3);
  pool.evict_blocks(std::vector<BlockId>{chain[0], chain[1]});
  EXPECT_EQ(pool.snapshot().orphans.size(), 2u);  // the parents of cached chain[2]
  pool.check_invariants();
  const auto again = take(pool, 2);
  pool.cache_full_blocks(seq.sequence(), again, 0, 2);
  const BlockId a = pool.match_cached_block(seq.sequence(), 0, BlockPool::kNoBlock);
  ASSERT_EQ(a, again[0]);
  ASSERT_EQ(pool.match_cached_block(seq.sequence(), 1, a), again[1]);
  EXPECT_EQ(pool.match_cached_block(seq.sequence(), 2, again[1]), chain[2]);
  pool.check_invariants();
  pool.evict_blocks(std::vector<BlockId>{chain[2]});
  EXPECT_TRUE(pool.snapshot().orphans.empty());
  pool.check_invariants();
}

TEST(GuardedChainHashes, AnOrphanKeepsACollidingParentOut) {
  const BlockHasher weak = BlockHasher::weak_for_testing(HashScheme::kXxh3_128, "g", 4);
  const std::vector<TokenId> suffix = {6, 6, 6, 6};
  const auto [p, q] = colliding_pair(weak, suffix);
  ASSERT_FALSE(q.empty());
  const auto sp = sequence(concat(p, suffix), weak);
  const auto sq = sequence(concat(q, suffix), weak);
  ASSERT_EQ(sp.block_hashes()[1], sq.block_hashes()[1]);  // the children collide too
  BlockPool pool(guarded_config(16));
  const auto bp = take(pool, 2);
  pool.cache_full_blocks(sp.sequence(), bp, 0, 2);
  pool.evict_blocks(std::vector<BlockId>{bp[0]});  // p's record lives on as an orphan
  ASSERT_EQ(pool.snapshot().orphans.size(), 1u);
  // q would otherwise be cached under the same hash, and then p's child would follow it.
  const auto bq = take(pool, 1);
  pool.cache_full_blocks(sq.sequence(), bq, 0, 1);
  EXPECT_FALSE(pool.block(bq[0]).is_cached());
  EXPECT_EQ(pool.match_cached_block(sq.sequence(), 0, BlockPool::kNoBlock), BlockPool::kNoBlock);
  pool.check_invariants();
}

TEST(GuardedChainHashes, AStoreAfterAnUnknownPrefixMakesItsRecordsAndADroppedStoreFreesThem) {
  const BlockHasher hasher(HashScheme::kXxh3_128, "g");
  BlockPool pool(guarded_config(16));
  const auto seq = sequence(iota_tokens(0, 16), hasher);
  const auto blocks = take(pool, 1);
  const BlockPoolSnapshot before = pool.snapshot();
  {
    // Blocks 0..2 are cached nowhere: the store of block 3 makes orphan records of them.
    BlockPool::PendingStore st = pool.prepare_store(seq.sequence(), 3, 4, {});
    EXPECT_EQ(pool.snapshot().orphans.size(), 3u);
  }  // dropped uncommitted: the records go
  EXPECT_EQ(pool.snapshot(), before);
  pool.check_invariants();
  pool.commit_store(pool.prepare_store(seq.sequence(), 3, 4, {}), blocks);
  EXPECT_TRUE(pool.block(blocks[0]).is_cached());
  EXPECT_EQ(pool.snapshot().orphans.size(), 3u);
  pool.check_invariants();
  // Caching the prefix for real finds the orphans: the chain is whole.
  const auto prefix = take(pool, 3);
  pool.cache_full_blocks(seq.sequence(), prefix, 0, 3);
  BlockId parent = BlockPool::kNoBlock;
  for (std::size_t i = 0; i < 3; ++i) {
    parent = pool.match_cached_block(seq.sequence(), i, parent);
    ASSERT_EQ(parent, prefix[i]);
  }
  EXPECT_EQ(pool.match_cached_block(seq.sequence(), 3, parent), blocks[0]);
  pool.check_invariants();
  pool.evict_blocks(std::vector<BlockId>{blocks[0]});
  EXPECT_TRUE(pool.snapshot().orphans.empty());
  pool.check_invariants();
}

TEST(GuardedChainHashes, LookupsAfterAnUnverifiedPrefixAreRefused) {
  const BlockHasher hasher(HashScheme::kXxh3_128, "g");
  BlockPool pool(guarded_config(8));
  const auto seq = sequence(iota_tokens(0, 8), hasher);
  const auto chain = take(pool, 2);
  pool.cache_full_blocks(seq.sequence(), chain, 0, 2);
  std::vector<BlockId> out;
  EXPECT_EQ(pool.match_cached_run_after(seq.sequence(), 0, 2, out), 2u);
  EXPECT_EQ(pool.match_cached_block_after(seq.sequence(), 0), chain[0]);
  try {
    (void)pool.match_cached_run_after(seq.sequence(), 1, 2, out);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidState);
    EXPECT_NE(std::string(e.what()).find("guard_chain_hashes"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)pool.match_cached_block_after(seq.sequence(), 1), Error);
  EXPECT_THROW((void)pool.cached_after_prefix(chain[1], seq.sequence(), 1), Error);
  EXPECT_TRUE(pool.same_content_chain(chain[0], chain[1]));
  // A guard compares whole stored blocks: a store of shorter blocks is refused, nothing changed.
  RequestBlockHasher shorter(hasher, kBlockSize - 1, {});
  shorter.append(iota_tokens(50, 9));
  const BlockPoolSnapshot before = pool.snapshot();
  EXPECT_THROW((void)pool.prepare_store(shorter.sequence(), 0, 3, {}), Error);
  EXPECT_EQ(pool.snapshot(), before);
}

// A random workload: requests over prompts that share prefixes are admitted (verified hit from
// block 0, new blocks, a store, sometimes prepared without the prefix's blocks), freed, and
// their blocks evicted explicitly; after every step the invariants hold and every hit holds the
// prompt's own tokens (the test records what each block was cached with).
struct Workload {
  explicit Workload(BlockHasher h, std::uint32_t seed) : hasher(std::move(h)), rng(seed) {
    for (int d = 0; d < 12; ++d) {
      std::vector<TokenId> doc;
      if (d > 0 && rng() % 3 != 0) {
        const auto& base = docs[rng() % docs.size()];
        doc.assign(base.begin(),
                   base.begin() + static_cast<std::ptrdiff_t>(
                                      kBlockSize * (rng() % (base.size() / kBlockSize + 1))));
      }
      const std::size_t more = kBlockSize * (1 + rng() % 4) + rng() % kBlockSize;
      for (std::size_t k = 0; k < more; ++k) doc.push_back(static_cast<TokenId>(rng() % 5));
      docs.push_back(doc);
    }
  }
  BlockHasher hasher;
  std::mt19937 rng;
  std::vector<std::vector<TokenId>> docs;
};

struct Live {
  std::size_t doc;
  std::vector<BlockId> table;
};

// One step of the workload on `pool`; the random choices come from `choice` so two pools can
// take the same steps. Returns the hit of an admission (empty otherwise).
class Driver {
 public:
  Driver(BlockPool& pool, const Workload& w) : pool_(pool), w_(w) {}

  std::vector<BlockId> step(std::uint32_t choice) {
    const std::uint32_t op = choice % 8;
    std::vector<BlockId> hit;
    if (op < 4 || live_.empty()) {
      const std::size_t d = (choice >> 3) % w_.docs.size();
      const auto seq = sequence(w_.docs[d], w_.hasher);
      const std::size_t full = seq.block_hashes().size();
      BlockId parent = BlockPool::kNoBlock;
      for (std::size_t i = 0; i < full; ++i) {
        parent = pool_.match_cached_block(seq.sequence(), i, parent);
        if (parent == BlockPool::kNoBlock) break;
        hit.push_back(parent);
      }
      for (std::size_t i = 0; i < hit.size(); ++i) {
        const auto it = content_.find(hit[i]);
        EXPECT_TRUE(it != content_.end() &&
                    std::equal(it->second.begin(), it->second.end(), w_.docs[d].begin()) &&
                    it->second.size() == (i + 1) * kBlockSize)
            << "block " << hit[i] << " is a hit for block " << i << " of a prompt it does not hold";
      }
      const std::int32_t need =
          static_cast<std::int32_t>((w_.docs[d].size() + kBlockSize - 1) / kBlockSize - hit.size());
      pool_.touch(hit);  // held first: allocating must not evict them
      std::vector<BlockId> fresh;
      if (!pool_.get_new_blocks(need, fresh)) {  // out of blocks: a normal result
        pool_.free_blocks_reversed(hit);
        pool_.check_invariants();
        return hit;
      }
      Live r{d, hit};
      r.table.insert(r.table.end(), fresh.begin(), fresh.end());
      if (hit.size() < full) {
        const std::span<const BlockId> row(r.table);
        // Sometimes the store is told nothing of the prefix (its records come from the material).
        const bool blind = (choice >> 12) % 4 == 0;
        pool_.commit_store(pool_.prepare_store(seq.sequence(), hit.size(), full,
                                               blind ? row.first(0) : row.first(hit.size())),
                           row.subspan(hit.size(), full - hit.size()));
        for (std::size_t i = hit.size(); i < full; ++i) {
          if (pool_.block(r.table[i]).is_cached()) {
            content_[r.table[i]].assign(
                w_.docs[d].begin(),
                w_.docs[d].begin() + static_cast<std::ptrdiff_t>((i + 1) * kBlockSize));
          } else {
            ++refused_;
          }
        }
      }
      live_.push_back(std::move(r));
    } else if (op < 7) {
      const std::size_t k = (choice >> 3) % live_.size();
      pool_.free_blocks_reversed(live_[k].table);
      live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      std::vector<BlockId> ids;
      for (int k = 0; k < 3; ++k) {
        ids.push_back(static_cast<BlockId>(1 + (choice >> (3 + 5 * k)) % (pool_.num_blocks() - 1)));
      }
      pool_.evict_blocks(ids);
    }
    for (auto it = content_.begin(); it != content_.end();) {
      it = pool_.block(it->first).is_cached() ? std::next(it) : content_.erase(it);
    }
    pool_.check_invariants();
    hits_ += hit.size();
    return hit;
  }
  std::size_t hits() const { return hits_; }
  std::size_t refused() const { return refused_; }

 private:
  BlockPool& pool_;
  const Workload& w_;
  std::vector<Live> live_;
  std::map<BlockId, std::vector<TokenId>> content_;
  std::size_t hits_ = 0;
  std::size_t refused_ = 0;
};

TEST(GuardedChainHashes, WithoutCollisionsEqualsContentIdsStepByStep) {
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    const Workload w(BlockHasher(HashScheme::kXxh3_128, "g"), seed);
    BlockPoolConfig ids_config = guarded_config(20);
    ids_config.guard_chain_hashes = false;
    BlockPool guarded(guarded_config(20));
    BlockPool ids(ids_config);
    Driver a(guarded, w), b(ids, w);
    std::mt19937 rng(seed * 7919);
    for (int s = 0; s < 1500; ++s) {
      const std::uint32_t choice = static_cast<std::uint32_t>(rng());
      ASSERT_EQ(a.step(choice), b.step(choice)) << "seed " << seed << " step " << s;
      const BlockPoolSnapshot x = guarded.snapshot(), y = ids.snapshot();
      ASSERT_EQ(x.ref_cnts, y.ref_cnts) << "seed " << seed << " step " << s;
      ASSERT_EQ(x.block_hashes, y.block_hashes);
      ASSERT_EQ(x.free_queue, y.free_queue);
      ASSERT_EQ(x.hash_map_slots, y.hash_map_slots);
      ASSERT_EQ(x.num_evictions, y.num_evictions);
      ASSERT_EQ(guarded.take_events(), ids.take_events());
    }
    EXPECT_GT(a.hits(), 100u) << "seed " << seed;
    EXPECT_EQ(a.refused(), 0u);
  }
}

TEST(GuardedChainHashes, WeakHashNeverGivesAWrongHit) {
  std::size_t refused = 0, hits = 0;
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    const Workload w(BlockHasher::weak_for_testing(HashScheme::kXxh3_128, "g", 3), seed);
    BlockPool pool(guarded_config(20));
    Driver d(pool, w);
    std::mt19937 rng(seed * 104729);
    for (int s = 0; s < 1500; ++s) d.step(static_cast<std::uint32_t>(rng()));
    refused += d.refused();
    hits += d.hits();
  }
  EXPECT_GT(hits, 100u);
  EXPECT_GT(refused, 0u) << "the weak hash caused no refused store: the test is vacuous";
}

}  // namespace
}  // namespace pagedkv
