// Model-based randomized test of KVCacheManager + BlockPool.
//
// Random operations (requests built from a few shared prefixes and salts; hits, chunked
// allocations, lookahead, decoded tokens, frees, preemptions, resets, explicit evictions) run
// against the library and against a deliberately naive reference model of vLLM's semantics
// (vectors and linear scans). After every operation the two must agree on every block's ref count
// and hash, on the free queue's order and on every hit and allocation, and check_invariants()
// must pass.
//
// A third run uses an 8-bit test hash that collides constantly and checks safety instead: every
// hit is a true prefix of the request (tracked by a shadow copy of each cached block's content).
//
// Flags (after the gtest ones): --pagedkv_ops=N operations per run (default 100000),
// --pagedkv_seconds=S stop a run early after S seconds (default: no limit).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"

namespace pagedkv {
namespace {

std::uint64_t g_ops = 100000;
double g_seconds = 0;  // 0: no limit

// ---- the reference model: vLLM v1 semantics, written for clarity, not speed ----
struct RefModel {
  std::uint32_t bs;
  bool caching;
  std::vector<int> ref;
  std::vector<BlockHash> hash;  // empty: not cached
  std::vector<BlockId> queue;   // head first
  std::vector<BlockId> map;     // cached blocks in insertion order
  struct Req {
    std::vector<BlockId> blocks;
    std::size_t cached = 0;
  };
  std::map<RequestId, Req> reqs;

  RefModel(int n, std::uint32_t block_size, bool enable_caching)
      : bs(block_size), caching(enable_caching), ref(n, 0), hash(n) {
    for (int i = 1; i < n; ++i) queue.push_back(i);
  }

  void uncache(BlockId b) {
    map.erase(std::find(map.begin(), map.end(), b));
    hash[b] = BlockHash();
  }
  BlockId lookup(const BlockHash& h) const {
    for (const BlockId b : map) {
      if (hash[b] == h) return b;
    }
    return -1;
  }
  std::vector<BlockId> hit(const Request& r) const {
    std::vector<BlockId> out;
    if (!caching) return out;
    const std::size_t max_blocks = r.num_tokens() == 0 ? 0 : (r.num_tokens() - 1) / bs;
    for (std::size_t i = 0; i < max_blocks && i < r.block_hashes().size(); ++i) {
      const BlockId b = lookup(r.block_hashes()[i]);
      if (b < 0) break;
      out.push_back(b);
    }
    return out;
  }
  std::optional<std::vector<BlockId>> allocate(const Request& r, std::size_t n,
                                               const std::vector<BlockId>& hits,
                                               std::size_t lookahead) {
    Req empty;
    const auto it = reqs.find(r.id());
    const Req& cur = it == reqs.end() ? empty : it->second;
    const std::size_t computed = r.num_computed_tokens() + hits.size() * bs;
    const std::size_t need = (computed + n + lookahead + bs - 1) / bs;
    const std::size_t have = cur.blocks.size() + hits.size();
    const std::size_t alloc = need > have ? need - have : 0;
    std::size_t evictable = 0;
    for (const BlockId b : hits) evictable += ref[b] == 0;
    if (alloc + evictable > queue.size()) return std::nullopt;
    Req& st = reqs[r.id()];
    for (const BlockId b : hits) {
      if (ref[b] == 0) queue.erase(std::find(queue.begin(), queue.end(), b));
      ++ref[b];
      st.blocks.push_back(b);
    }
    if (cur.blocks.empty() && st.blocks.size() == hits.size()) st.cached = hits.size();
    std::vector<BlockId> fresh;
    for (std::size_t i = 0; i < alloc; ++i) {
      const BlockId b = queue.front();
      queue.erase(queue.begin());
      if (!hash[b].empty()) uncache(b);
      ref[b] = 1;
      st.blocks.push_back(b);
      fresh.push_back(b);
    }
    if (caching) {
      const std::size_t full = std::min(computed + n, r.num_tokens()) / bs;
      for (std::size_t i = st.cached; i < full; ++i) {
        hash[st.blocks[i]] = r.block_hashes()[i];
        map.push_back(st.blocks[i]);
      }
      st.cached = std::max(st.cached, full);
    }
    return fresh;
  }
  void release(RequestId id) {
    std::vector<BlockId> unhashed, hashed;
    auto& blocks = reqs.at(id).blocks;
    for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
      if (--ref[*b] == 0) (hash[*b].empty() ? unhashed : hashed).push_back(*b);
    }
    queue.insert(queue.begin(), unhashed.begin(), unhashed.end());
    queue.insert(queue.end(), hashed.begin(), hashed.end());
    reqs.erase(id);
  }
  bool reset() {
    if (queue.size() != ref.size() - 1) return false;
    for (auto& h : hash) h = BlockHash();
    map.clear();
    return true;
  }
  void evict(const std::vector<BlockId>& ids) {
    for (const BlockId b : ids) {
      if (!hash[b].empty()) uncache(b);
    }
  }
};

struct RunConfig {
  int num_blocks = 48;
  bool verify = true;
  bool weak_hash = false;  // 8-bit collisions: check safety, not equality with the model
  bool explicit_evict = false;
  std::uint32_t seed = 1;
};

struct Outcome {
  std::uint64_t ops = 0;
  std::uint64_t hit_blocks = 0;
  std::uint64_t failed_allocations = 0;
  std::uint64_t collisions_rejected = 0;
};

Outcome run(const RunConfig& rc) {
  constexpr std::uint32_t kB = 4;
  std::mt19937 rng(rc.seed);
  auto uniform = [&](std::size_t lo, std::size_t hi) {  // inclusive
    return lo + static_cast<std::size_t>(rng() % (hi - lo + 1));
  };

  KVCacheManagerConfig cfg;
  cfg.num_blocks = rc.num_blocks;
  cfg.block_size = kB;
  cfg.verify_cache_hits = rc.verify;
  cfg.hash_seed = "model";
  if (rc.weak_hash) cfg.hasher = BlockHasher::weak_for_testing(HashScheme::kSha256, "model", 8);
  KVCacheManager m(cfg);
  RefModel ref(rc.num_blocks, kB, true);

  // Shared prefixes (a system prompt, tool definitions, ...) and tenants.
  std::vector<std::vector<TokenId>> prefixes = {{}, {}, {}, {}};
  for (std::size_t p = 1; p < prefixes.size(); ++p) {
    prefixes[p].resize(uniform(3, 30));
    for (auto& t : prefixes[p]) t = static_cast<TokenId>(uniform(0, 5));
  }
  const std::vector<std::optional<std::string>> salts = {std::nullopt, "tenant-a", "tenant-b"};

  std::vector<Request> running;  // allocated at least once
  std::vector<Request> waiting;  // preempted, to be rescheduled
  RequestId next_id = 1;
  // Weak-hash safety: the prefix each cached block was computed for (salt, tokens).
  std::vector<std::vector<TokenId>> shadow(static_cast<std::size_t>(rc.num_blocks));
  std::vector<std::optional<std::string>> shadow_salt(static_cast<std::size_t>(rc.num_blocks));
  Outcome out;

  auto prefix_of = [&](const Request& r, std::size_t blocks) {
    return std::vector<TokenId>(r.tokens().begin(), r.tokens().begin() + blocks * kB);
  };
  auto compare_state = [&]() {
    m.check_invariants();
    if (rc.weak_hash) return;
    const BlockPool& pool = m.block_pool();
    for (BlockId b = 1; b < rc.num_blocks; ++b) {
      ASSERT_EQ(pool.block(b).ref_cnt, ref.ref[b]) << "block " << b;
      ASSERT_EQ(pool.block(b).block_hash, ref.hash[b]) << "block " << b;
    }
    ASSERT_EQ(pool.free_queue().ids(), ref.queue);
  };
  // Runs hit lookup + one allocation in both; returns whether it fit.
  auto schedule = [&](Request& r, bool first) -> bool {
    CacheHit hit;
    if (first) {
      hit = m.get_computed_blocks(r);
      if (rc.weak_hash) {
        const auto& hashes = r.block_hashes();
        if (hit.blocks.size() < hashes.size() &&
            m.block_pool().get_cached_block(hashes[hit.blocks.size()]) != BlockPool::kNoBlock) {
          ++out.collisions_rejected;  // the raw map had a candidate; verification refused it
        }
        for (std::size_t i = 0; i < hit.blocks.size(); ++i) {
          const auto b = static_cast<std::size_t>(hit.blocks[i]);
          EXPECT_EQ(shadow[b], prefix_of(r, i + 1)) << "WRONG HIT: block " << b;
          EXPECT_EQ(shadow_salt[b], r.hashed_tokens().keys().cache_salt) << "WRONG HIT (salt)";
        }
      } else {
        EXPECT_EQ(hit.blocks, ref.hit(r));
      }
      out.hit_blocks += hit.blocks.size();
    }
    const std::size_t computed = r.num_computed_tokens() + hit.num_tokens;
    const std::size_t n = uniform(1, r.num_tokens() - computed);
    const std::size_t lookahead = uniform(0, 4) == 0 ? uniform(1, 5) : 0;
    std::vector<bool> was_cached(static_cast<std::size_t>(rc.num_blocks));
    for (BlockId b = 0; b < rc.num_blocks; ++b) {
      was_cached[static_cast<std::size_t>(b)] = m.block_pool().block(b).is_cached();
    }
    const auto got = m.allocate_slots(r, n, hit, lookahead);
    if (!rc.weak_hash) {
      const auto want = ref.allocate(r, n, hit.blocks, lookahead);
      EXPECT_EQ(got.has_value(), want.has_value());
      if (got && want) {
        EXPECT_EQ(std::vector<BlockId>(got->begin(), got->end()), *want);
      }
    }
    if (!got) {
      ++out.failed_allocations;
      return false;
    }
    if (rc.weak_hash) {  // record what newly cached blocks hold
      const auto blocks = m.block_ids(r.id());
      const std::vector<BlockId> fresh(got->begin(), got->end());
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        const auto b = static_cast<std::size_t>(blocks[i]);
        if (!m.block_pool().block(blocks[i]).is_cached()) continue;
        if (!was_cached[b] || std::count(fresh.begin(), fresh.end(), blocks[i])) {
          shadow[b] = prefix_of(r, i + 1);
          shadow_salt[b] = r.hashed_tokens().keys().cache_salt;
        }
      }
    }
    r.set_num_computed_tokens(computed + n);
    return true;
  };

  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t op = 0; op < g_ops; ++op) {
    if (g_seconds > 0 && (op & 1023) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
            g_seconds) {
      break;
    }
    const std::size_t kind = uniform(0, 99);
    if (kind < 30 || running.empty()) {  // a new request (or a preempted one) arrives
      if (!waiting.empty() && uniform(0, 1) == 0) {
        Request r = std::move(waiting.back());
        waiting.pop_back();
        if (schedule(r, true)) running.push_back(std::move(r));
      } else {
        std::vector<TokenId> tokens = prefixes[uniform(0, prefixes.size() - 1)];
        const std::size_t extra = uniform(tokens.empty() ? 1 : 0, 24);
        for (std::size_t i = 0; i < extra; ++i)
          tokens.push_back(static_cast<TokenId>(uniform(0, 3)));
        RequestHashKeys keys;
        keys.cache_salt = salts[uniform(0, salts.size() - 1)];
        Request r = m.make_request(next_id++, tokens, keys);
        if (schedule(r, true)) running.push_back(std::move(r));
      }
    } else {
      const std::size_t i = uniform(0, running.size() - 1);
      Request& r = running[i];
      if (kind < 55) {  // next prefill chunk, or a decode step
        if (r.num_computed_tokens() == r.num_tokens()) {
          r.append_token(static_cast<TokenId>(uniform(0, 3)));
        }
        schedule(r, false);
      } else if (kind < 80) {  // finished
        m.free(r);
        if (!rc.weak_hash) ref.release(r.id());
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (kind < 88) {  // preempted
        m.preempt(r);
        if (!rc.weak_hash) ref.release(r.id());
        waiting.push_back(std::move(r));
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
        if (waiting.size() > 8) waiting.erase(waiting.begin());
      } else if (kind < 94) {
        if (rc.explicit_evict) {
          std::vector<BlockId> ids;
          for (std::size_t k = uniform(1, 3); k > 0; --k) {
            ids.push_back(
                static_cast<BlockId>(uniform(1, static_cast<std::size_t>(rc.num_blocks) - 1)));
          }
          m.evict_blocks(ids);
          if (!rc.weak_hash) ref.evict(ids);
        }
      } else {  // reset attempt; succeeds only when idle
        const bool all_done = uniform(0, 3) == 0;
        if (all_done) {
          for (Request& q : running) {
            m.free(q);
            if (!rc.weak_hash) ref.release(q.id());
          }
          running.clear();
        }
        const bool reset = m.reset_prefix_cache();
        EXPECT_EQ(reset, rc.weak_hash ? running.empty() : ref.reset());
        if (reset) {
          for (auto& s : shadow) s.clear();
        }
      }
    }
    compare_state();
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "first divergence at operation " << op << " (seed " << rc.seed << ")";
      break;
    }
    ++out.ops;
  }
  return out;
}

TEST(KVCacheManagerModel, MatchesReferenceWithoutVerification) {
  RunConfig rc;
  rc.verify = false;
  rc.explicit_evict = true;
  rc.seed = 11;
  const Outcome o = run(rc);
  EXPECT_GT(o.hit_blocks, 0u);
  EXPECT_GT(o.failed_allocations, 0u);
  std::printf("no verification: %llu ops, %llu hit blocks, %llu failed allocations\n",
              static_cast<unsigned long long>(o.ops), static_cast<unsigned long long>(o.hit_blocks),
              static_cast<unsigned long long>(o.failed_allocations));
}

TEST(KVCacheManagerModel, MatchesReferenceWithVerification) {
  RunConfig rc;
  rc.verify = true;
  rc.seed = 12;
  const Outcome o = run(rc);
  EXPECT_GT(o.hit_blocks, 0u);
  std::printf("verification: %llu ops, %llu hit blocks\n", static_cast<unsigned long long>(o.ops),
              static_cast<unsigned long long>(o.hit_blocks));
}

TEST(KVCacheManagerModel, WeakHashNeverGivesAWrongHit) {
  RunConfig rc;
  rc.weak_hash = true;
  rc.explicit_evict = true;
  rc.seed = 13;
  const Outcome o = run(rc);
  EXPECT_GT(o.hit_blocks, 0u);
  EXPECT_GT(o.collisions_rejected, 0u) << "the weak hash produced no collisions: test is vacuous";
  std::printf("8-bit hash: %llu ops, %llu verified hit blocks, %llu collisions rejected\n",
              static_cast<unsigned long long>(o.ops), static_cast<unsigned long long>(o.hit_blocks),
              static_cast<unsigned long long>(o.collisions_rejected));
}

}  // namespace
}  // namespace pagedkv

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--pagedkv_ops=", 14) == 0) {
      pagedkv::g_ops = std::strtoull(argv[i] + 14, nullptr, 10);
    } else if (std::strncmp(argv[i], "--pagedkv_seconds=", 18) == 0) {
      pagedkv::g_seconds = std::strtod(argv[i] + 18, nullptr);
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  return RUN_ALL_TESTS();
}
