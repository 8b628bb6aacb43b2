// Random operation streams against an independent model of the pool's free-block order under
// retention priorities, durations (a fake clock), the pin budget and each eviction policy:
// the model keeps plain std::deque lists and searches them, written from the semantics in
// block_pool.hpp / eviction_policy.hpp / docs/retention.md. After every call: the pool's
// invariants, every block's retention, the free count and the counters; every allocation's
// block order must equal the model's. Rejected calls must leave the snapshot unchanged.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/hash/request_hasher.hpp"
#include "pagedkv/pool/block_pool.hpp"
#include "pagedkv/pool/eviction_policy.hpp"
#include "test_tokens.hpp"

namespace pagedkv {
namespace {

constexpr std::uint32_t kBlockSize = 4;
constexpr int kLevels = kMaxRetentionPriority + 1;

RequestBlockHasher one_block(int key) {
  RequestBlockHasher seq(BlockHasher(HashScheme::kSha256, "test"), kBlockSize, {});
  seq.append(iota_tokens(key * 1000, kBlockSize));
  return seq;
}

// A chain of index + 1 blocks: a head shared by every chain up to the lineage key's depth, then
// block kLineageKeyDepth from one of a few lineages, then blocks unique to `key`. Its block
// `index` is the one a test caches (kLineage's rank depends on the depth and the lineage).
RequestBlockHasher deep_chain(int key, int lineage, std::size_t index) {
  RequestBlockHasher seq(BlockHasher(HashScheme::kSha256, "test"), kBlockSize, {});
  for (std::size_t i = 0; i <= index; ++i) {
    const int base = i < kLineageKeyDepth    ? 7
                     : i == kLineageKeyDepth ? 100 + lineage
                                             : 100000 + key * 100 + static_cast<int>(i);
    seq.append(iota_tokens(base * 1000 + static_cast<int>(i) * kBlockSize, kBlockSize));
  }
  return seq;
}

struct Model {
  struct Block {
    int ref = 0;
    bool cached = false;
    int prio = kDefaultRetentionPriority;
    RetentionTick duration = kNoExpiry, expires = kNoExpiry;
    int hits = 0;
    int rank = 0;           // lineage
    std::int64_t tick = 0;  // lineage: when last queued
  };
  EvictionPolicy policy;
  std::int64_t budget;
  std::vector<Block> b;
  std::deque<BlockId> uncached;
  // Per level: LRU, SLRU, S3-FIFO use segments 0 and 1; lineage: segment r < kLineageRanks is
  // rank r, segment kLineageRanks protected.
  std::array<std::vector<std::deque<BlockId>>, kLevels> lv;
  std::int64_t tick = 0, max_age = 0;
  int cursor = 0;
  std::int64_t retained = 0;
  std::uint64_t refusals = 0, expirations = 0, forced = 0;
  // adaptive: per block the fingerprint of its hash (set when cached), the ghost FIFOs (B1:
  // evicted without a hit since cached, B2: after one; newest at the back: the last ghost_cap
  // evictions into each, 0 for one cached again since), and protected's target share (units of
  // 1 / kAdaptiveScale).
  std::vector<std::uint64_t> fp;
  std::array<std::deque<std::uint64_t>, 2> ghost;
  std::size_t ghost_cap = 1;
  std::int64_t target = kAdaptiveScale * kAdaptiveInitialPercent / 100;
  std::int64_t n_blocks;
  std::array<int, 2> moves{};  // ghost hits in B1, B2
  // adaptive: the ghosts track the fingerprints whose product with 0xc4ceb9fe1a85ec53 has its
  // top ghost_shift bits zero (all of them at 0); each tracked ghost hit counts 2^ghost_shift.
  int ghost_shift = 0;

  // shift: BlockPoolConfig::adaptive_ghost_sample_shift (-1: the pool's choice by its size).
  Model(int n, EvictionPolicy p, double fraction, int shift = -1)
      : policy(p),
        budget(static_cast<std::int64_t>(fraction * (n - 1))),
        b(n),
        fp(static_cast<std::size_t>(n)),
        n_blocks(n) {
    const std::size_t cap = static_cast<std::size_t>(n) * kAdaptiveGhostPercent / 100;
    ghost_shift = shift >= 0 ? shift : adaptive_ghost_sample_shift(cap);
    ghost_cap = std::max<std::size_t>(cap >> ghost_shift, 1);
    if (p == EvictionPolicy::kLineage) max_age = std::int64_t{kLineageMaxAgePools} * n;
    for (auto& segs : lv) segs.resize(p == EvictionPolicy::kLineage ? kLineageRanks + 1 : 2);
    for (BlockId id = 1; id < n; ++id) uncached.push_back(id);
  }
  std::size_t level_size(int l) const {
    std::size_t n = 0;
    for (const auto& seg : lv[l]) n += seg.size();
    return n;
  }
  std::size_t cached_free() const { return static_cast<std::size_t>(num_free()) - uncached.size(); }
  std::int32_t num_free() const {
    std::size_t n = uncached.size();
    for (int l = 0; l < kLevels; ++l) n += level_size(l);
    return static_cast<std::int32_t>(n);
  }
  static void erase(std::deque<BlockId>& q, BlockId id) {
    q.erase(std::find(q.begin(), q.end(), id));
  }
  bool tracked(std::uint64_t f) const {
    return ghost_shift == 0 || (f * 0xc4ceb9fe1a85ec53ull) >> (64 - ghost_shift) == 0;
  }
  // Removes a free block from wherever it is.
  void unlist(BlockId id) {
    if (!b[id].cached) {
      erase(uncached, id);
      return;
    }
    for (auto& seg : lv[b[id].prio]) {
      if (std::find(seg.begin(), seg.end(), id) != seg.end()) {
        erase(seg, id);
        return;
      }
    }
    ADD_FAILURE() << "model: block " << id << " not listed";
  }
  void set(BlockId id, int p, RetentionTick d, RetentionTick e) {
    retained += (p > kDefaultRetentionPriority) - (b[id].prio > kDefaultRetentionPriority);
    b[id].prio = p;
    b[id].duration = d;
    b[id].expires = e;
  }
  void reset(BlockId id) {
    set(id, kDefaultRetentionPriority, kNoExpiry, kNoExpiry);
    b[id].hits = 0;
  }
  bool expired(BlockId id, RetentionTick now) const {
    return b[id].expires != kNoExpiry && now >= b[id].expires;
  }
  void expire(BlockId id) {
    ++expirations;
    set(id, kDefaultRetentionPriority, kNoExpiry, kNoExpiry);
  }
  void enqueue(BlockId id) {
    const int l = b[id].prio;
    switch (policy) {
      case EvictionPolicy::kLru:
        lv[l][0].push_back(id);
        break;
      case EvictionPolicy::kSlru:
      case EvictionPolicy::kAdaptive:
        lv[l][b[id].hits == 0 ? 0 : 1].push_back(id);
        break;
      case EvictionPolicy::kS3Fifo:
        lv[l][b[id].hits == 0 ? 0 : 1].push_back(id);
        break;
      case EvictionPolicy::kLineage: {
        b[id].tick = tick++;
        if (b[id].hits == 0) {
          lv[l][b[id].rank].push_back(id);
          break;
        }
        lv[l][kLineageRanks].push_back(id);
        break;
      }
    }
  }
  void queue_cached(BlockId id, RetentionTick now) {
    if (expired(id, now)) expire(id);
    enqueue(id);
  }
  void hit(BlockId id, RetentionTick now) {
    b[id].hits = std::min(b[id].hits + 1, 3);
    if (b[id].expires != kNoExpiry) {
      if (expired(id, now)) {
        expire(id);
      } else {
        b[id].expires = now + b[id].duration;
      }
    }
  }
  void release(BlockId id, RetentionTick now) {  // ref reached 0
    if (b[id].cached) {
      queue_cached(id, now);
    } else {
      reset(id);
      uncached.push_front(id);
    }
  }
  BlockId victim_at(int l) {
    auto& s0 = lv[l][0];
    auto& s1 = lv[l][1];
    BlockId id = 0;
    if (policy == EvictionPolicy::kLineage) {
      auto& segs = lv[l];
      const auto pop = [&](int seg) {
        const BlockId v = segs[seg].front();
        segs[seg].pop_front();
        return v;
      };
      // Protected's share first: its oldest back to their rank while it is over it.
      auto& prot = segs[kLineageRanks];
      while (prot.size() * 100 > cached_free() * kLineageProtectedPercent) {
        const BlockId old = prot.front();
        prot.pop_front();
        segs[b[old].rank].push_back(old);
      }
      // One rank in turn (the first non-empty at or after the cursor, wrapping), then
      // protected: a head queued more than max_age ago is dead and goes first.
      int turn = -1;
      for (int k = 0; k < kLineageRanks && turn < 0; ++k) {
        const int rk = (cursor + k) % kLineageRanks;
        if (!segs[rk].empty()) turn = rk;
      }
      if (turn >= 0) {
        cursor = turn + 1;
        if (tick - b[segs[turn].front()].tick > max_age) return pop(turn);
      }
      if (!segs[kLineageRanks].empty() && tick - b[segs[kLineageRanks].front()].tick > max_age) {
        return pop(kLineageRanks);
      }
      for (int rk = 0; rk < kLineageRanks; ++rk) {
        if (!segs[rk].empty()) return pop(rk);
      }
      return pop(kLineageRanks);
    }
    const bool slru = policy == EvictionPolicy::kSlru || policy == EvictionPolicy::kAdaptive;
    if (policy == EvictionPolicy::kSlru) {
      // Protected holds at most 80% of the level when a victim is chosen.
      while (s1.size() * 5 > level_size(l) * 4) {
        s0.push_back(s1.front());
        s1.pop_front();
      }
    }
    if (policy == EvictionPolicy::kAdaptive) {
      // Protected holds at most the target share of the level when a victim is chosen.
      while (static_cast<std::int64_t>(s1.size()) * kAdaptiveScale >
             static_cast<std::int64_t>(level_size(l)) * target) {
        s0.push_back(s1.front());
        s1.pop_front();
      }
    }
    if (policy == EvictionPolicy::kLru || (slru && !s0.empty())) {
      id = s0.front();
      s0.pop_front();
    } else if (slru) {
      id = s1.front();
      s1.pop_front();
    } else {
      for (;;) {
        if (s1.empty() || (!s0.empty() && s0.size() * 10 >= level_size(l))) {
          id = s0.front();
          s0.pop_front();
          break;
        }
        const BlockId m = s1.front();
        s1.pop_front();
        if (b[m].hits == 0) {
          id = m;
          break;
        }
        --b[m].hits;
        s1.push_back(m);
      }
    }
    return id;
  }
  std::vector<BlockId> take(int n, RetentionTick now) {
    // Every free block whose priority ran out: to the default level's front (lists in order).
    for (int l = 0; l < kLevels; ++l) {
      if (l == kDefaultRetentionPriority) continue;
      for (std::size_t s = 0; s < lv[l].size(); ++s) {
        // Lineage has 6,565 lists, nearly all empty: copying an empty std::deque allocates.
        if (lv[l][s].empty()) continue;
        const std::deque<BlockId> copy = lv[l][s];
        for (const BlockId id : copy) {
          if (expired(id, now)) {
            erase(lv[l][s], id);
            expire(id);
            // Lineage: the front of its rank at the default level; else probation's front.
            const int seg = policy == EvictionPolicy::kLineage ? b[id].rank : 0;
            lv[kDefaultRetentionPriority][seg].push_front(id);
          }
        }
      }
    }
    std::vector<BlockId> out;
    for (int i = 0; i < n; ++i) {
      BlockId id = 0;
      if (!uncached.empty()) {
        id = uncached.front();
        uncached.pop_front();
      } else {
        int l = 0;
        while (level_size(l) == 0) ++l;
        if (l > kDefaultRetentionPriority) ++forced;
        id = victim_at(l);
        if (policy == EvictionPolicy::kAdaptive &&
            tracked(fp[static_cast<std::size_t>(id)])) {  // into a ghost, its oldest out past
                                                          // capacity
          // One entry per fingerprint: an earlier one (a block of the same hash) leaves.
          const std::uint64_t f = fp[static_cast<std::size_t>(id)];
          for (auto& q : ghost) std::replace(q.begin(), q.end(), f, std::uint64_t{0});
          auto& g = ghost[b[id].hits > 0 ? 1 : 0];
          g.push_back(f);
          if (g.size() > ghost_cap) g.pop_front();
        }
        b[id].cached = false;
      }
      reset(id);
      b[id].ref = 1;
      out.push_back(id);
    }
    return out;
  }
  // adaptive: block id is cached under hash h (group 0): a ghost entry of it moves the target
  // (B1: down, B2: up) by max(1, |other ghost| / |its ghost|) blocks of the pool (at least one
  // unit), clamped to [0, kAdaptiveScale].
  void cached(BlockId id, const BlockHash& h) {
    b[id].cached = true;
    if (policy != EvictionPolicy::kAdaptive) return;
    std::uint64_t f = h.hash_code();
    if (f == 0) f = 1;
    fp[static_cast<std::size_t>(id)] = f;
    if (!tracked(f)) return;
    for (int w = 0; w < 2; ++w) {
      auto& g = ghost[static_cast<std::size_t>(w)];
      const auto it = std::find(g.begin(), g.end(), f);
      if (it == g.end()) continue;
      *it = 0;  // a hole: the entries after it still leave after ghost_cap records each
      const auto live = [](const std::deque<std::uint64_t>& q) {
        return static_cast<std::int64_t>(q.size()) - std::count(q.begin(), q.end(), 0);
      };
      const auto mine = std::max<std::int64_t>(live(g), 1);
      const auto other = live(ghost[static_cast<std::size_t>(1 - w)]);
      const std::int64_t step = std::max<std::int64_t>(
          (std::max<std::int64_t>(other / mine, 1) << ghost_shift) * kAdaptiveScale / n_blocks, 1);
      target = w == 0 ? std::max<std::int64_t>(target - step, 0)
                      : std::min(target + step, kAdaptiveScale);
      ++moves[static_cast<std::size_t>(w)];
      return;
    }
  }
  void set_retention(const std::vector<BlockId>& ids, int p, RetentionTick d, RetentionTick now) {
    if (p == kDefaultRetentionPriority) return;
    const RetentionTick exp = d == kNoExpiry ? kNoExpiry : now + d;
    for (const BlockId id : ids) {
      Block& k = b[id];
      const bool free = k.ref == 0;
      if (free && !k.cached) continue;
      int cur = k.prio;
      const bool lapsed = expired(id, now);
      if (lapsed) cur = kDefaultRetentionPriority;
      int np = cur;
      RetentionTick nd = lapsed ? kNoExpiry : k.duration, ne = lapsed ? kNoExpiry : k.expires;
      if (cur == kDefaultRetentionPriority || p > cur) {
        const std::int64_t others = retained - (k.prio > kDefaultRetentionPriority ? 1 : 0);
        if (p > kDefaultRetentionPriority && cur <= kDefaultRetentionPriority && others >= budget) {
          ++refusals;
        } else {
          np = p;
          nd = d;
          ne = exp;
        }
      } else if (p == cur && ne != kNoExpiry) {
        nd = std::max(nd, d);
        ne = std::max(ne, exp);
      }
      if (!lapsed && np == cur && nd == k.duration && ne == k.expires) continue;
      if (free) unlist(id);
      if (lapsed) expire(id);
      set(id, np, nd, ne);
      if (free) queue_cached(id, now);
    }
  }
};

// kLineage's key depth as the pool should learn it (LineageDepthLearner's contract, written
// independently: a linear scan for the divergence, a sorted copy for the median).
struct NaiveDepth {
  std::vector<BlockHash> ref;
  std::vector<std::size_t> samples;
  std::size_t depth;
  explicit NaiveDepth(std::size_t initial) : depth(initial) {}
  void observe(std::span<const BlockHash> chain) {
    const std::size_t n = std::min(chain.size(), kMaxLineageKeyDepth + 1);
    const std::size_t m = std::min(n, ref.size());
    std::size_t l = 0;
    while (l < m && chain[l] == ref[l]) ++l;
    if (l == m) {  // one extends the other
      if (n > ref.size()) ref.assign(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(n));
      return;
    }
    samples.push_back(l);
    ref.assign(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(n));
    if (samples.size() % kLineageDepthWindow == 0) {
      std::vector<std::size_t> sorted = samples;
      std::sort(sorted.begin(), sorted.end());
      depth = sorted[(sorted.size() - 1) / 2];
    }
  }
};

// One random stream. key_depth / adaptive: BlockPoolConfig::lineage_key_depth and
// lineage_adaptive_depth (kLineage only).
// ghost_shift: BlockPoolConfig::adaptive_ghost_sample_shift (kAdaptive only).
void run_stream(EvictionPolicy policy, std::uint32_t seed, std::size_t key_depth = kLineageKeyDepth,
                bool adaptive = false, int steps = 600, std::size_t* samples = nullptr,
                std::array<int, 2>* ghost_hits = nullptr, int ghost_shift = -1) {
  const int kBlocks = seed % 3 == 0 ? 40 : 14;
  auto now = std::make_shared<RetentionTick>(0);
  BlockPoolConfig c;
  c.num_blocks = kBlocks;
  c.block_size = kBlockSize;
  c.enable_kv_events = seed % 2 == 0;
  c.eviction_policy = policy;
  c.max_retained_fraction = (seed % 4) * 0.25;
  c.retention_clock = [now] { return *now; };
  c.lineage_key_depth = key_depth;
  c.lineage_adaptive_depth = adaptive;
  c.adaptive_ghost_sample_shift = ghost_shift;
  BlockPool pool(c);
  NaiveDepth depth(key_depth);
  // An LRU pool keeps retention state from its first non-default ask (here: none raised), so
  // every policy runs its retention lists from the start.
  if (policy == EvictionPolicy::kLru) pool.set_retention(std::vector<BlockId>{}, 90);
  Model m(kBlocks, policy, c.max_retained_fraction, ghost_shift);
  ASSERT_EQ(pool.adaptive_ghost_sample_shift(),
            policy == EvictionPolicy::kAdaptive ? m.ghost_shift : -1);
  std::mt19937 rng(seed);
  const auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint32_t>(n)); };
  std::vector<BlockId> held;  // one entry per reference
  int next_key = 0;
  std::vector<int> key_of(static_cast<std::size_t>(kBlocks), -1);  // one_block key cached
  std::vector<int> evicted_keys;  // keys of single blocks an allocation evicted, in order
  const std::array<int, 7> prios = {0, 10, 35, 50, 60, 90, 100};
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " step " + std::to_string(step));
    const int op = pick(10);
    if (op == 0) {  // allocate
      const int n = 1 + pick(3);
      std::vector<BlockId> got;
      const bool ok = pool.get_new_blocks(n, got);
      ASSERT_EQ(ok, n <= m.num_free());
      if (ok) {
        ASSERT_EQ(got, m.take(n, *now));
        for (const BlockId id : got) {
          held.push_back(id);
          if (key_of[static_cast<std::size_t>(id)] >= 0) {
            evicted_keys.push_back(key_of[static_cast<std::size_t>(id)]);
            key_of[static_cast<std::size_t>(id)] = -1;
          }
        }
      }
    } else if (op == 1 && !held.empty()) {  // cache a held uncached block
      const BlockId id = held[pick(static_cast<int>(held.size()))];
      if (!m.b[id].cached) {
        // adaptive: mostly the key of a recently evicted single block again, when no block
        // caches it now (so that evicted blocks come back: the ghosts' signal).
        int again = -1;
        if (policy == EvictionPolicy::kAdaptive && !evicted_keys.empty() && pick(4) != 0) {
          const int k = evicted_keys[evicted_keys.size() - 1 -
                                     static_cast<std::size_t>(pick(
                                         std::min<int>(static_cast<int>(evicted_keys.size()), 6)))];
          bool cached_now = false;
          for (BlockId o = 1; o < kBlocks; ++o) cached_now |= m.b[o].cached && key_of[o] == k;
          if (!cached_now) again = k;
        }
        BlockHash hash;
        if (again >= 0 || pick(2) == 0) {
          const int key = again >= 0 ? again : next_key++;
          const auto seq = one_block(key);
          pool.cache_full_blocks(seq.sequence(), std::vector<BlockId>{id}, 0, 1);
          if (adaptive) depth.observe(seq.block_hashes());
          m.b[id].rank = lineage_rank(seq.block_hashes(), 0, depth.depth);
          hash = seq.block_hashes()[0];
          key_of[id] = key;
        } else {  // block `index` of a deep chain (the blocks before it: the null block)
          const std::size_t index = kLineageKeyDepth - 1 + static_cast<std::size_t>(pick(4));
          const auto seq = deep_chain(next_key++, pick(5), index);
          std::vector<BlockId> row(index, kNullBlockId);
          row.push_back(id);
          pool.cache_full_blocks(seq.sequence(), row, index, index + 1);
          if (adaptive) depth.observe(seq.block_hashes());
          m.b[id].rank = lineage_rank(seq.block_hashes(), index, depth.depth);
          hash = seq.block_hashes()[index];
          key_of[id] = -1;
        }
        if (policy == EvictionPolicy::kLineage) {
          ASSERT_EQ(pool.lineage_key_depth(), depth.depth);
        }
        m.cached(id, hash);
        ASSERT_EQ(pool.adaptive_protected_target(),
                  policy == EvictionPolicy::kAdaptive ? m.target : -1);
      }
    } else if ((op == 2 || op == 3) && !held.empty()) {  // free one or a few (distinct) refs
      const int n = std::min<int>(1 + pick(3), static_cast<int>(held.size()));
      std::vector<BlockId> ids;
      for (int k = 0; k < n; ++k) {
        const std::size_t i = static_cast<std::size_t>(pick(static_cast<int>(held.size())));
        if (std::find(ids.begin(), ids.end(), held[i]) != ids.end()) continue;
        ids.push_back(held[i]);
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      }
      pool.free_blocks(ids);
      // Cached ones reaching 0 in order; uncached ones at the head in the given order.
      std::vector<BlockId> uncached;
      for (const BlockId id : ids) {
        if (--m.b[id].ref == 0) {
          if (m.b[id].cached) {
            m.queue_cached(id, *now);
          } else {
            uncached.push_back(id);
          }
        }
      }
      for (auto it = uncached.rbegin(); it != uncached.rend(); ++it) m.release(*it, *now);
    } else if (op == 4) {  // touch a cached or held block
      const BlockId id = static_cast<BlockId>(1 + pick(kBlocks - 1));
      if (m.b[id].ref == 0 && !m.b[id].cached) continue;
      pool.touch(std::vector<BlockId>{id});
      if (m.b[id].ref == 0) m.unlist(id);
      if (m.b[id].cached) m.hit(id, *now);
      ++m.b[id].ref;
      held.push_back(id);
    } else if (op == 5) {  // requeue
      const BlockId id = static_cast<BlockId>(1 + pick(kBlocks - 1));
      pool.requeue(id);
      if (m.b[id].ref == 0) {
        m.unlist(id);
        if (m.b[id].cached) {
          m.hit(id, *now);
          m.queue_cached(id, *now);
        } else {
          m.uncached.push_front(id);
        }
      }
    } else if (op == 6 || op == 7) {  // set_retention
      std::vector<BlockId> ids;
      for (int k = pick(4); k >= 0; --k) ids.push_back(static_cast<BlockId>(pick(kBlocks)));
      const int p = prios[static_cast<std::size_t>(pick(static_cast<int>(prios.size())))];
      const RetentionTick d = pick(3) == 0 ? kNoExpiry : 1 + pick(40);
      pool.set_retention(ids, static_cast<RetentionPriority>(p), d);
      ids.erase(std::remove(ids.begin(), ids.end(), 0), ids.end());
      m.set_retention(ids, p, d, *now);
    } else if (op == 8) {  // the clock moves
      *now += pick(15);
    } else {  // evict_blocks, or a rejected call
      if (pick(2) == 0) {
        const BlockId id = static_cast<BlockId>(1 + pick(kBlocks - 1));
        pool.evict_blocks(std::vector<BlockId>{id});
        if (m.b[id].cached) {
          const bool free = m.b[id].ref == 0;
          if (free) m.unlist(id);
          m.b[id].cached = false;
          m.reset(id);
          if (free) m.uncached.push_front(id);
        }
      } else {
        const BlockPoolSnapshot before = pool.snapshot();
        EXPECT_THROW(pool.set_retention(std::vector<BlockId>{1, kBlocks}, 90), Error);
        EXPECT_THROW(pool.set_retention(std::vector<BlockId>{1}, 101), Error);
        EXPECT_THROW(pool.set_retention(std::vector<BlockId>{1}, 90, -5), Error);
        ASSERT_EQ(pool.snapshot(), before);
      }
    }
    pool.check_invariants();
    ASSERT_EQ(pool.num_free_blocks(), m.num_free());
    for (BlockId id = 1; id < kBlocks; ++id) {
      const BlockRetention r = pool.retention(id);
      const bool lapsed = m.expired(id, *now);
      ASSERT_EQ(r.priority, lapsed ? kDefaultRetentionPriority : m.b[id].prio) << "block " << id;
      ASSERT_EQ(r.expires_at, lapsed ? kNoExpiry : m.b[id].expires) << "block " << id;
      ASSERT_EQ(pool.block(id).ref_cnt, m.b[id].ref);
      ASSERT_EQ(pool.block(id).is_cached(), m.b[id].cached);
    }
    const RetentionStats s = pool.retention_stats();
    ASSERT_EQ(s.retained_blocks, m.retained);
    ASSERT_LE(s.retained_blocks, s.retained_budget);
    ASSERT_EQ(s.budget_refusals, m.refusals);
    ASSERT_EQ(s.expirations, m.expirations);
    ASSERT_EQ(s.forced_evictions, m.forced);
  }
  if (samples != nullptr) *samples = depth.samples.size();
  if (ghost_hits != nullptr) *ghost_hits = m.moves;
}

TEST(RetentionModel, Lru) {
  for (std::uint32_t seed = 1; seed <= 40; ++seed) run_stream(EvictionPolicy::kLru, seed);
}
TEST(RetentionModel, Slru) {
  for (std::uint32_t seed = 1; seed <= 40; ++seed) run_stream(EvictionPolicy::kSlru, seed);
}
TEST(RetentionModel, S3Fifo) {
  for (std::uint32_t seed = 1; seed <= 40; ++seed) run_stream(EvictionPolicy::kS3Fifo, seed);
}
TEST(RetentionModel, Adaptive) {
  std::array<int, 2> total{};
  for (std::uint32_t seed = 1; seed <= 40; ++seed) {
    std::array<int, 2> hits{};
    run_stream(EvictionPolicy::kAdaptive, seed, kLineageKeyDepth, false, 600, nullptr, &hits);
    total[0] += hits[0];
    total[1] += hits[1];
  }
  // The streams moved the target both ways (so the model checked the adaptation).
  EXPECT_GE(total[0], 20);
  EXPECT_GE(total[1], 20);
}
// The ghosts tracking a sample of fingerprints (1 in 2, 1 in 4), as large pools do.
TEST(RetentionModel, AdaptiveSampledGhosts) {
  for (const int shift : {1, 2}) {
    SCOPED_TRACE("sample shift " + std::to_string(shift));
    std::array<int, 2> total{};
    // Fewer fingerprints tracked, fewer ghost hits: more streams at 1 in 4.
    const std::uint32_t seeds = shift == 1 ? 40 : 80;
    for (std::uint32_t seed = 1; seed <= seeds; ++seed) {
      std::array<int, 2> hits{};
      run_stream(EvictionPolicy::kAdaptive, seed, kLineageKeyDepth, false, 600, nullptr, &hits,
                 shift);
      total[0] += hits[0];
      total[1] += hits[1];
    }
    std::printf("sample shift %d: ghost hits %d in B1, %d in B2\n", shift, total[0], total[1]);
    EXPECT_GE(total[0], 5);
    EXPECT_GE(total[1], 5);
  }
}
TEST(RetentionModel, Lineage) {
  for (std::uint32_t seed = 1; seed <= 40; ++seed) run_stream(EvictionPolicy::kLineage, seed);
}
// Key depth 33: the chains' blocks 31 and 32 take the top rank, blocks 33 and 34 the rank of
// their own block 33.
TEST(RetentionModel, LineageKeyDepth33) {
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    run_stream(EvictionPolicy::kLineage, seed, 33);
  }
}
// The learned depth (from 0 until the first kLineageDepthWindow samples: longer streams).
TEST(RetentionModel, LineageAdaptiveDepth) {
  std::size_t most = 0;
  for (std::uint32_t seed = 1; seed <= 6; ++seed) {
    std::size_t samples = 0;
    run_stream(EvictionPolicy::kLineage, seed, 0, true, 3000, &samples);
    most = std::max(most, samples);
  }
  EXPECT_GE(most, 2 * kLineageDepthWindow);  // the depth was learned (and learned again)
}

}  // namespace
}  // namespace pagedkv
