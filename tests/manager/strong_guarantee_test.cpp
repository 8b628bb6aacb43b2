// The strong guarantee of every mutating KVCacheManager (and so BlockPool) call, under
// std::bad_alloc at every allocation point.
//
// This binary replaces the global operator new with one that can be told to fail its Nth
// allocation (tests/util/nth_alloc_failure.hpp). A random operation stream (new requests with hits,
// chunked prefill, decode steps with lookahead, frees, preemptions, explicit evictions, resets;
// salts and LoRA adapters; single-group and hybrid layouts; verified SHA-256 and xxh3_128) runs on
// two managers in lockstep: a clean one, and one where each call is first made to fail at its 1st,
// 2nd, 3rd, ... allocation until it completes. After every failed attempt the manager's snapshot
// must equal the one taken before the call and check_invariants() must pass; after every completed
// call both managers must have equal snapshots and must have delivered equal events. Each manager's
// event sink checks the manager's invariants at every event: events are delivered only once a
// call's state is complete. (The sink itself must not throw: that is enforced with
// std::terminate, see block_pool_test's death test.)
// The same counter checks that a warm pool's one-block stores allocate nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "nth_alloc_failure.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/hash/request_hasher.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/pool/block_pool.hpp"

namespace pagedkv {
namespace {

struct Counts {
  std::uint64_t ops = 0;
  std::uint64_t injected = 0;
  std::uint64_t events = 0;
};

// A manager whose sink checks invariants at every event and records what it got.
struct Subject {
  KVCacheManager m;
  std::vector<KVEvent> delivered;
  std::vector<Request> running;

  explicit Subject(const KVCacheManagerConfig& c) : m(c) {
    m.set_event_sink([this](const KVEvent& e) {
      alloc_failure::Suspend s;
      m.check_invariants();
      delivered.push_back(e);
    });
  }
};

// Runs `call` on the injected subject, failing its 1st, 2nd, ... allocation until it completes;
// checks that every failure left the manager exactly as it was.
template <typename Call>
void with_failures(Subject& s, Counts& counts, Call call) {
  for (long n = 0;; ++n) {
    std::optional<KVCacheManagerSnapshot> before;
    std::size_t delivered_before = 0;
    {
      alloc_failure::Suspend sus;
      before = s.m.snapshot();
      delivered_before = s.delivered.size();
    }
    alloc_failure::fail_at = n;
    bool failed = false;
    try {
      call();
    } catch (const std::bad_alloc&) {
      failed = true;
    }
    const bool fired = failed;
    alloc_failure::fail_at = -1;
    if (!fired) return;
    alloc_failure::Suspend sus;
    ++counts.injected;
    ASSERT_EQ(s.m.snapshot(), *before) << "state changed by a call that failed at allocation " << n;
    ASSERT_EQ(s.delivered.size(), delivered_before) << "a failed call delivered events";
    s.m.check_invariants();
  }
}

KVCacheManagerConfig make_config(int layout) {
  KVCacheManagerConfig c;
  c.num_blocks = 40;
  c.hash_seed = "strong";
  c.enable_kv_events = true;
  c.stats_window = 8;
  if (layout == 0) {
    c.block_size = 4;
  } else if (layout == 1) {
    c.block_size = 4;
    c.hash_scheme = HashScheme::kXxh3_128;
    c.max_model_len = 40;
  } else {
    c.groups = {AttentionSpec::full(4), AttentionSpec::sliding(2, 5)};
    c.hash_scheme = HashScheme::kXxh3_128;
  }
  return c;
}

Counts run_stream(int layout, std::uint32_t seed, int num_ops) {
  const KVCacheManagerConfig cfg = make_config(layout);
  Subject clean(cfg), inj(cfg);
  std::mt19937 rng(seed);
  auto uniform = [&](std::size_t lo, std::size_t hi) {
    return lo + static_cast<std::size_t>(rng() % (hi - lo + 1));
  };
  const std::vector<std::vector<TokenId>> prefixes = {{}, {1, 2, 3, 4, 5, 6, 7}, {9, 9, 9, 9, 9}};
  RequestId next_id = 1;
  Counts counts;

  auto compare = [&] {
    alloc_failure::Suspend s;
    ASSERT_EQ(inj.m.snapshot(), clean.m.snapshot());
    ASSERT_EQ(inj.delivered, clean.delivered);
    inj.m.check_invariants();
  };
  // One allocation step for request i of both subjects (a hit when `first`).
  auto schedule = [&](std::size_t i, bool first, std::size_t n, std::size_t lookahead) {
    std::optional<std::span<const BlockId>> got_clean, got_inj;
    CacheHit hit_clean, hit_inj;
    if (first) {
      hit_clean = clean.m.get_computed_blocks(clean.running[i]);
      with_failures(inj, counts, [&] { hit_inj = inj.m.get_computed_blocks(inj.running[i]); });
      n = std::min(n, clean.running[i].num_tokens() - hit_clean.num_tokens);
    }
    got_clean = clean.m.allocate_slots(clean.running[i], n, hit_clean, lookahead);
    with_failures(inj, counts,
                  [&] { got_inj = inj.m.allocate_slots(inj.running[i], n, hit_inj, lookahead); });
    EXPECT_EQ(got_clean.has_value(), got_inj.has_value());
    if (got_clean) {
      const std::size_t done = clean.running[i].num_computed_tokens() + hit_clean.num_tokens + n;
      clean.running[i].set_num_computed_tokens(done);
      inj.running[i].set_num_computed_tokens(done);
    }
    return got_clean.has_value();
  };
  auto drop = [&](std::size_t i) {
    clean.running.erase(clean.running.begin() + static_cast<std::ptrdiff_t>(i));
    inj.running.erase(inj.running.begin() + static_cast<std::ptrdiff_t>(i));
  };

  for (int op = 0; op < num_ops && !::testing::Test::HasFatalFailure(); ++op) {
    const std::size_t kind = uniform(0, 99);
    if (kind < 30 || clean.running.empty()) {
      std::vector<TokenId> tokens = prefixes[uniform(0, prefixes.size() - 1)];
      for (std::size_t k = uniform(tokens.empty() ? 1 : 0, 14); k > 0; --k) {
        tokens.push_back(static_cast<TokenId>(uniform(0, 3)));
      }
      RequestHashKeys keys;
      if (uniform(0, 3) == 0) keys.cache_salt = "tenant-" + std::to_string(uniform(0, 1));
      if (uniform(0, 4) == 0) keys.lora_name = "adapter";
      const RequestId id = next_id++;
      clean.running.push_back(clean.m.make_request(id, tokens, keys));
      inj.running.push_back(inj.m.make_request(id, tokens, keys));
      const std::size_t i = clean.running.size() - 1;
      // At most what the hit leaves (schedule() clamps).
      if (!schedule(i, true, uniform(1, tokens.size()), 0)) {
        clean.m.free(clean.running[i]);
        with_failures(inj, counts, [&] { inj.m.free(inj.running[i]); });
        drop(i);
      }
    } else {
      const std::size_t i = uniform(0, clean.running.size() - 1);
      Request& rc = clean.running[i];
      Request& ri = inj.running[i];
      if (kind < 60) {
        if (rc.num_computed_tokens() == rc.num_tokens()) {
          const auto t = static_cast<TokenId>(uniform(0, 3));
          rc.append_token(t);
          with_failures(inj, counts, [&] { ri.append_token(t); });
        }
        const std::size_t n = uniform(1, rc.num_tokens() - rc.num_computed_tokens());
        schedule(i, false, n, uniform(0, 3) == 0 ? uniform(1, 6) : 0);
      } else if (kind < 80) {
        clean.m.free(rc);
        with_failures(inj, counts, [&] { inj.m.free(ri); });
        drop(i);
      } else if (kind < 88) {
        clean.m.preempt(rc);
        with_failures(inj, counts, [&] { inj.m.preempt(ri); });
        drop(i);
      } else if (kind < 95) {
        std::vector<BlockId> ids;
        for (std::size_t k = uniform(1, 4); k > 0; --k) {
          ids.push_back(static_cast<BlockId>(uniform(1, 39)));
        }
        clean.m.evict_blocks(ids);
        with_failures(inj, counts, [&] { inj.m.evict_blocks(ids); });
      } else {
        if (uniform(0, 1) == 0) {
          while (!clean.running.empty()) {
            clean.m.free(clean.running.back());
            with_failures(inj, counts, [&] { inj.m.free(inj.running.back()); });
            drop(clean.running.size() - 1);
          }
        }
        const bool a = clean.m.reset_prefix_cache();
        bool b = false;
        with_failures(inj, counts, [&] { b = inj.m.reset_prefix_cache(); });
        EXPECT_EQ(a, b);
      }
    }
    compare();
    ++counts.ops;
  }
  counts.events = clean.delivered.size();
  return counts;
}

TEST(StrongGuarantee, EveryAllocationFailureLeavesTheManagerUnchanged) {
  for (int layout = 0; layout < 3; ++layout) {
    const Counts c = run_stream(layout, 100 + static_cast<std::uint32_t>(layout), 400);
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "layout " << layout;
      return;
    }
    EXPECT_EQ(c.ops, 400u);
    EXPECT_GT(c.injected, 1000u) << "too few failures injected: the test is vacuous";
    EXPECT_GT(c.events, 50u);
    std::printf("layout %d: %llu operations, %llu injected allocation failures, %llu events\n",
                layout, static_cast<unsigned long long>(c.ops),
                static_cast<unsigned long long>(c.injected),
                static_cast<unsigned long long>(c.events));
  }
}

// Guarded chain hashes (xxh3_128): an allocation that evicts cached blocks leaves their records
// behind, so the pool's record table must grow before the commit. Found by review: the manager
// touched the request's hits and only then let each group's get_new_blocks grow the table, so a
// bad_alloc there left the hits pinned with no holder. A request whose hits are followed by more
// new blocks than the table has room for, failed at every allocation; one and two full-attention
// groups, events on and off.
TEST(StrongGuarantee, EvictionsThatGrowTheRecordTableFailBeforeTheCommit) {
  for (const int groups : {1, 2}) {
    for (const bool events : {false, true}) {
      KVCacheManagerConfig c;
      c.num_blocks = 64;
      c.hash_scheme = HashScheme::kXxh3_128;
      c.enable_kv_events = events;
      if (groups == 1) {
        c.block_size = 4;
      } else {
        c.groups = {AttentionSpec::full(4), AttentionSpec::full(4)};
      }
      Subject s(c);
      Counts counts;
      std::vector<TokenId> a(40);
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<TokenId>(i);
      // Fill the pool with cached blocks of distinct prefixes, then free them all: later
      // allocations evict them and leave records.
      for (TokenId fill = 0; fill < 3; ++fill) {
        std::vector<TokenId> t = a;
        t[0] = 1000 + fill;
        Request r = s.m.make_request(100 + static_cast<RequestId>(fill), t);
        ASSERT_TRUE(s.m.allocate_slots(r, t.size(), s.m.get_computed_blocks(r)).has_value());
        r.set_num_computed_tokens(t.size());
        s.m.free(r);
      }
      Request ra = s.m.make_request(1, a);
      ASSERT_TRUE(s.m.allocate_slots(ra, a.size(), s.m.get_computed_blocks(ra)).has_value());
      ra.set_num_computed_tokens(a.size());
      s.m.free(ra);
      std::vector<TokenId> b = a;
      for (TokenId i = 0; i < 48; ++i) b.push_back(2000 + i);
      Request rb = s.m.make_request(2, b);
      const CacheHit hit = s.m.get_computed_blocks(rb);
      ASSERT_EQ(hit.num_tokens, a.size());
      std::optional<std::span<const BlockId>> got;
      with_failures(s, counts,
                    [&] { got = s.m.allocate_slots(rb, b.size() - hit.num_tokens, hit); });
      if (::testing::Test::HasFatalFailure()) {
        ADD_FAILURE() << groups << " group(s), events " << events;
        return;
      }
      ASSERT_TRUE(got.has_value());
      EXPECT_GT(counts.injected, 0u) << "nothing was injected: the test is vacuous";
      s.m.check_invariants();
    }
  }
}

// One-block stores (a host tier caches each stored slot on its own) allocate nothing once warm:
// any allocation in the measured loop fails with bad_alloc here. All three identity kinds.
TEST(StrongGuarantee, SteadyStateOneBlockStoresAllocateNothing) {
  for (const int kind : {0, 1, 2}) {  // chain hashes, content ids, guarded chain hashes
    const bool resistant = kind == 0;
    BlockPoolConfig c;
    c.num_blocks = 9;
    c.block_size = 4;
    c.chain_hashes_identify_prefix = resistant;
    c.guard_chain_hashes = kind == 2;
    BlockPool pool(c);
    RequestBlockHasher seq(
        BlockHasher(kind == 2 ? HashScheme::kXxh3_128 : HashScheme::kSha256, "steady"), 4, {});
    std::vector<TokenId> tokens(4 * 64);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 7 + 1);
    seq.append(tokens);
    const BlockSequence s = seq.sequence();
    std::vector<BlockId> out;
    out.reserve(8);
    const auto round = [&] {
      out.clear();
      ASSERT_TRUE(pool.get_new_blocks(1, out));  // evicts the LRU block once the pool is full
      const BlockId row[2] = {BlockPool::kNoBlock, out[0]};
      pool.cache_full_blocks(s, std::span<const BlockId>(row), 1, 2);  // block 1 of a 2-row
      pool.free_blocks(out);
    };
    for (int i = 0; i < 16; ++i) round();  // warm up: every buffer at its size
    alloc_failure::fail_at = 0;            // the next allocation throws
    try {
      for (int i = 0; i < 200; ++i) round();
    } catch (const std::bad_alloc&) {
      ADD_FAILURE() << "a steady-state one-block store allocated (kind " << kind << ")";
    }
    alloc_failure::fail_at = -1;
    pool.check_invariants();
  }
}

// Allocations made by `body`, counted (none fails: the budget is far above what it makes).
template <typename Body>
long allocations_in(Body body) {
  constexpr long kBudget = 1L << 40;
  alloc_failure::fail_at = kBudget;
  body();
  const long made = kBudget - alloc_failure::fail_at;
  alloc_failure::fail_at = -1;
  return made;
}

// A long decode grows each row geometrically. Before, allocate_slots reserved the request's row
// exactly (old size + new blocks) and get_new_blocks and append_slot_mapping their output the
// same way: a heap allocation and a copy of the whole row at every new block, quadratic over the
// decode (a 50 M-token output took minutes in pagedkv-replay --memory-table).
TEST(StrongGuarantee, LongDecodeDoesNotAllocatePerBlock) {
  constexpr int kSteps = 4096;
  for (const bool caching : {true, false}) {
    KVCacheManagerConfig c;
    c.num_blocks = kSteps + 64;
    c.block_size = 1;  // a new block at every step
    c.enable_caching = caching;
    c.hash_scheme = HashScheme::kXxh3_128;
    c.hash_seed = "decode";
    KVCacheManager m(c);
    Request r = m.make_request(1, std::vector<TokenId>{1, 2, 3, 4});
    ASSERT_TRUE(m.allocate_slots(r, r.num_tokens()));
    r.set_num_computed_tokens(r.num_tokens());
    const long made = allocations_in([&] {
      for (int i = 0; i < kSteps; ++i) {
        r.append_token(static_cast<TokenId>(i % 1000 + 5));
        ASSERT_TRUE(m.allocate_slots(r, 1));
        r.set_num_computed_tokens(r.num_tokens());
      }
    });
    // Geometric growth: a few dozen reallocations over 4,096 blocks (the row, the request's
    // tokens and hashes, the pool's tables). Per block it was 4,096 and more.
    EXPECT_LT(made, kSteps / 16) << "caching " << caching << ": " << made << " allocations";
    EXPECT_EQ(m.block_ids(1).size(), static_cast<std::size_t>(kSteps + 4));
    m.free(r);
    m.check_invariants();
  }
  // The pool's own output row, grown one block at a time.
  BlockPoolConfig pc;
  pc.num_blocks = kSteps + 1;
  pc.block_size = 1;
  BlockPool pool(pc);
  std::vector<BlockId> row;
  const long pool_made = allocations_in([&] {
    for (int i = 0; i < kSteps; ++i) ASSERT_TRUE(pool.get_new_blocks(1, row));
  });
  EXPECT_LT(pool_made, kSteps / 16) << pool_made << " allocations";
  EXPECT_EQ(row.size(), static_cast<std::size_t>(kSteps));
}

// A run lookup whose blocks carry extra keys builds each block's encoding (allocating without a
// scratch): a failure at any of those allocations, mid-run, appends nothing.
TEST(StrongGuarantee, RunLookupFailureAppendsNothing) {
  BlockPoolConfig c;
  c.num_blocks = 16;
  c.block_size = 4;
  c.chain_hashes_identify_prefix = true;
  BlockPool pool(c);
  RequestHashKeys keys;
  keys.lora_name = "an-adapter-name-longer-than-the-small-string-buffer";
  RequestBlockHasher seq(BlockHasher(HashScheme::kSha256, "run"), 4, keys);
  std::vector<TokenId> tokens(4 * 8);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 3 + 2);
  seq.append(tokens);
  std::vector<BlockId> blocks;
  ASSERT_TRUE(pool.get_new_blocks(8, blocks));
  pool.cache_full_blocks(seq.sequence(), blocks, 0, 8);
  std::vector<BlockId> want = {-1};
  want.insert(want.end(), blocks.begin(), blocks.end());
  long failures = 0;
  for (long n = 0;; ++n) {
    std::vector<BlockId> out = {-1};
    alloc_failure::fail_at = n;
    bool failed = false;
    try {
      EXPECT_EQ(pool.match_cached_run_after(seq.sequence(), 0, 8, out), 8u);
    } catch (const std::bad_alloc&) {
      failed = true;
    }
    alloc_failure::fail_at = -1;
    if (!failed) {
      EXPECT_EQ(out, want);
      break;
    }
    ++failures;
    EXPECT_EQ(out, std::vector<BlockId>{-1}) << "failure at allocation " << n << " appended";
  }
  EXPECT_GT(failures, 8) << "expected the blocks' extra-key encodings to allocate";
  pool.check_invariants();
}

}  // namespace
}  // namespace pagedkv
