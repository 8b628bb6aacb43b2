// pagedkv-replay --eviction (bench/replay/belady.hpp): the replay-only prefix-cache simulator in
// LRU mode equals the library's sequential replay (hit tokens, evictions, rejections, peak usage);
// Belady's and the reuse oracle's choices on hand-made traces; both against LRU on generated
// traces. The tests that
// read the recorded Mooncake trace are in the suite EvictionTraces (ctest: replay_eviction_traces,
// skipped when the trace is missing).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "belady.hpp"
#include "pagedkv/base/error.hpp"
#include "replay.hpp"
#include "trace.hpp"

namespace pagedkv::replay {
namespace {

const std::string kMooncakeTrace = PAGEDKV_MOONCAKE_TRACE;

void expect_same(const ReplayResult& lib, const ReplayResult& sim) {
  EXPECT_EQ(sim.requests, lib.requests);
  EXPECT_EQ(sim.rejected, lib.rejected);
  EXPECT_EQ(sim.prompt_tokens, lib.prompt_tokens);
  EXPECT_EQ(sim.queried_tokens, lib.queried_tokens);
  EXPECT_EQ(sim.prompt_blocks, lib.prompt_blocks);
  EXPECT_EQ(sim.hit_tokens, lib.hit_tokens);
  EXPECT_EQ(sim.prefill_tokens_computed, lib.prefill_tokens_computed);
  EXPECT_EQ(sim.evicted_blocks, lib.evicted_blocks);
  EXPECT_DOUBLE_EQ(sim.peak_usage, lib.peak_usage);
}

// Generated traces and pool sizes with heavy eviction, a little, none, and rejections.
TEST(EvictionSim, LruModeEqualsTheLibraryReplayOnGeneratedTraces) {
  for (const Workload w : {Workload::kAgents, Workload::kChat, Workload::kTenants}) {
    GeneratorOptions g;
    g.workload = w;
    g.requests = 150;
    g.seed = 7;
    const Trace trace = generate(g);
    ReplayOptions o;
    o.hash = HashScheme::kXxh3_128;
    o.num_blocks = {300, 1001, 3001, 20001, 1000001};
    const auto lib = run_replay(trace, o);
    const BlockTrace bt = block_trace(trace, o);
    ASSERT_EQ(bt.size(), trace.requests.size());
    bool evicted = false;
    for (std::size_t k = 0; k < o.num_blocks.size(); ++k) {
      SCOPED_TRACE(trace.name + " num_blocks " + std::to_string(o.num_blocks[k]));
      expect_same(lib[k], simulate(bt, o.num_blocks[k], Eviction::kLru));
      evicted = evicted || lib[k].evicted_blocks > 0;
    }
    EXPECT_TRUE(evicted) << trace.name;  // the comparison covers evictions
  }
}

// A trace whose prompts are whole blocks (the last-token cap recomputes a fully cached last
// block, which the library caches a second time: a duplicate) and 1-token prompts.
TEST(EvictionSim, LruModeEqualsTheLibraryWithDuplicatesAndTinyPrompts) {
  Trace trace;
  trace.name = "dups";
  for (std::uint32_t i = 0; i < 60; ++i) {
    TraceRequest r;
    const std::uint32_t len = (i % 3 == 0) ? 1 : 16 * (1 + (i * 7) % 9);
    for (std::uint32_t t = 0; t < len; ++t)
      r.tokens.push_back(static_cast<TokenId>(t + 100 * (i % 4)));
    r.input_length = len;
    trace.requests.push_back(r);
  }
  ReplayOptions o;
  o.num_blocks = {3, 10, 12, 20, 1000};
  const auto lib = run_replay(trace, o);
  const BlockTrace bt = block_trace(trace, o);
  for (std::size_t k = 0; k < o.num_blocks.size(); ++k) {
    SCOPED_TRACE("num_blocks " + std::to_string(o.num_blocks[k]));
    expect_same(lib[k], simulate(bt, o.num_blocks[k], Eviction::kLru));
  }
}

// Block size 1: a prompt of k tokens has k full blocks and can hit at most k - 1 of them.
BlockTrace tiny(std::uint32_t distinct, const std::vector<std::vector<std::uint32_t>>& prompts) {
  BlockTrace t;
  t.block_size = 1;
  t.distinct = distinct;
  for (const auto& p : prompts) t.add(p.size(), p);
  return t;
}

// Four usable blocks. A, u0 | B, u1 | C, u2 | A, u3 (u*: unique last tokens, never hit). LRU
// evicts A (the oldest) for C's request; Belady evicts blocks never used again and keeps A, whose
// next use is the last request.
TEST(EvictionSim, BeladyKeepsTheBlockUsedSoonest) {
  enum : std::uint32_t { A, B, C, u0, u1, u2, u3, kIds };
  const BlockTrace t = tiny(kIds, {{A, u0}, {B, u1}, {C, u2}, {A, u3}});
  const ReplayResult lru = simulate(t, 5, Eviction::kLru);
  const ReplayResult opt = simulate(t, 5, Eviction::kBelady);
  EXPECT_EQ(lru.hit_tokens, 0u);
  EXPECT_EQ(lru.evicted_blocks, 4u);  // A, u0 for C's request; B, u1 for the last one
  EXPECT_EQ(opt.hit_tokens, 1u);      // A
  EXPECT_EQ(opt.evicted_blocks, 3u);  // two of u0, B, u1 for C's request; one more for u3
}

// Prefix dependencies: a chain P1 -> P2 -> P3 is reused at the end, and single blocks X, Y, Z are
// each reused once, sooner. With three usable blocks after the chain's request (which needs 4),
// Belady evicts by next use: the chain's deepest blocks first (a child's next use is never before
// its parent's), never making a cached block unreachable while its children stay.
TEST(EvictionSim, BeladyEvictsTheFarthestAndLeavesBeforeParents) {
  enum : std::uint32_t { P1, P2, P3, X, Y, u0, u1, u2, u3, u4, kIds };
  // Requests: [P1 P2 P3 u0], [X u1], [X Y u2], [Y u3], [P1 P2 P3 u4]; 4 usable blocks.
  const BlockTrace t =
      tiny(kIds, {{P1, P2, P3, u0}, {X, u1}, {X, Y, u2}, {Y, u3}, {P1, P2, P3, u4}});
  const ReplayResult opt = simulate(t, 5, Eviction::kBelady);
  // [X u1]: 2 new blocks; cached P1 P2 P3 u0 (u0 never again: evicted first, then P3, the
  // farthest). [X Y u2]: X hits; Y, u2 need 2: u1 (never), then P2 (farther than P1). [Y u3]:
  // Y hits; u3 takes a block never used again (X or u2), P1 stays. [P1 P2 P3 u4]: P1 hits,
  // 3 new blocks evict the 3 others.
  EXPECT_EQ(opt.hit_tokens, 1u + 1u + 1u);
  EXPECT_EQ(opt.evicted_blocks, 2u + 2u + 1u + 3u);
  // LRU evicts u0 and P3, then P2 and P1 (the chain is the oldest): X and Y hit, the chain not.
  const ReplayResult lru = simulate(t, 5, Eviction::kLru);
  EXPECT_EQ(lru.hit_tokens, 2u);
}

// The reuse oracle knows whether a block is used again, not when. On the trace of
// BeladyKeepsTheBlockUsedSoonest it evicts the blocks never used again (u0, u1 for C's request; B,
// the oldest of those left, for the last one) and keeps A: Belady's hit. Both evict 3 blocks.
TEST(EvictionSim, ReuseOracleEvictsBlocksNeverUsedAgainFirst) {
  enum : std::uint32_t { A, B, C, u0, u1, u2, u3, kIds };
  const BlockTrace t = tiny(kIds, {{A, u0}, {B, u1}, {C, u2}, {A, u3}});
  const ReplayResult oracle = simulate(t, 5, Eviction::kReuseOracle);
  EXPECT_EQ(oracle.hit_tokens, 1u);  // A; LRU gets 0
  EXPECT_EQ(oracle.evicted_blocks, 3u);
  EXPECT_EQ(simulate(t, 5, Eviction::kLru).hit_tokens, 0u);
}

// Between blocks that are both used again the oracle evicts the older (LRU), where Belady evicts
// the one used later. Three usable blocks: [A u0] [B u1] [C u2] [A u3] [D E u4] [B u5]. C's
// request evicts u1 (never used again) and then A (older than B) under the oracle, B (used after
// A) under Belady; [D E u4] needs the whole pool, so B, kept by the oracle, is evicted before its
// use, while Belady's A hits at [A u3].
TEST(EvictionSim, ReuseOracleEvictsTheLeastRecentlyUsedOfTheBlocksUsedAgain) {
  enum : std::uint32_t { A, B, C, D, E, u0, u1, u2, u3, u4, u5, kIds };
  const BlockTrace t = tiny(kIds, {{A, u0}, {B, u1}, {C, u2}, {A, u3}, {D, E, u4}, {B, u5}});
  const ReplayResult oracle = simulate(t, 4, Eviction::kReuseOracle);
  const ReplayResult opt = simulate(t, 4, Eviction::kBelady);
  EXPECT_EQ(oracle.hit_tokens, 0u);
  // u0 | u1, A | u2, C | B, A, u3 (all three for D E u4) | two of D, E, u4.
  EXPECT_EQ(oracle.evicted_blocks, 1u + 2u + 2u + 3u + 2u);
  EXPECT_EQ(opt.hit_tokens, 1u);  // A
  EXPECT_EQ(opt.evicted_blocks, 1u + 2u + 1u + 3u + 2u);
}

// The MRU variant keeps the blocks used again that were freed first: on the trace above it keeps
// A (freed before B) for C's request, as Belady does, and A hits.
TEST(EvictionSim, ReuseOracleMruKeepsTheLongestWaitingOfTheBlocksUsedAgain) {
  enum : std::uint32_t { A, B, C, D, E, u0, u1, u2, u3, u4, u5, kIds };
  const BlockTrace t = tiny(kIds, {{A, u0}, {B, u1}, {C, u2}, {A, u3}, {D, E, u4}, {B, u5}});
  const ReplayResult mru = simulate(t, 4, Eviction::kReuseOracleMru);
  EXPECT_EQ(mru.hit_tokens, 1u);  // A
  EXPECT_EQ(mru.evicted_blocks, 1u + 2u + 1u + 3u + 2u);
  // Blocks never used again still go first, oldest first (the trace of the first oracle test).
  enum : std::uint32_t { P, Q, R, v0, v1, v2, v3, kIds2 };
  const BlockTrace t2 = tiny(kIds2, {{P, v0}, {Q, v1}, {R, v2}, {P, v3}});
  EXPECT_EQ(simulate(t2, 5, Eviction::kReuseOracleMru).hit_tokens, 1u);
  // Within one request's blocks the table's tail goes first: [P1 P2 u0] [Z Y u1] [P1 P2 u2] with
  // four usable blocks. [Z Y u1] evicts u0 and then one of the chain: P2 (P1 first would leave
  // P2 unreachable). [P1 P2 u2] hits P1 and evicts u1, Y (never used again, oldest first).
  enum : std::uint32_t { P1, P2, Z, Y, w0, w1, w2, kIds3 };
  const BlockTrace t3 = tiny(kIds3, {{P1, P2, w0}, {Z, Y, w1}, {P1, P2, w2}});
  const ReplayResult chain = simulate(t3, 5, Eviction::kReuseOracleMru);
  EXPECT_EQ(chain.hit_tokens, 1u);
  EXPECT_EQ(chain.evicted_blocks, 4u);
}

// belady-noisy keys each block by its next use's distance times exp(sigma z), with z drawn per
// request of the next use: every block one request will reuse shares the error, so a chain stays
// keyed parent before child and is evicted tail first whatever sigma is. Seven usable blocks:
// [P1..P6 u0] fills them; [X Y u1] needs 3: u0 (never used again), then P6 and P5 (the chain's
// tail); [P1..P6 u2] hits P1..P4. A draw per block would evict inside the chain for some sigma.
TEST(EvictionSim, BeladyNoisyEvictsAChainTailFirstAtAnySigma) {
  enum : std::uint32_t { P1, P2, P3, P4, P5, P6, X, Y, u0, u1, u2, kIds };
  const BlockTrace t =
      tiny(kIds, {{P1, P2, P3, P4, P5, P6, u0}, {X, Y, u1}, {P1, P2, P3, P4, P5, P6, u2}});
  const ReplayResult opt = simulate(t, 8, Eviction::kBelady);
  EXPECT_EQ(opt.hit_tokens, 4u);
  for (int i = 0; i <= 32; ++i) {
    const double sigma = 0.25 * i;
    SCOPED_TRACE("sigma " + std::to_string(sigma));
    const ReplayResult noisy = simulate(t, 8, Eviction::kBeladyNoisy, sigma);
    EXPECT_EQ(noisy.hit_tokens, opt.hit_tokens);
    EXPECT_EQ(noisy.evicted_blocks, opt.evicted_blocks);
  }
}

// At sigma 0 belady-noisy is Belady exactly; noise costs hits on real reuse patterns, and a
// replay is deterministic (the draws come from request indices, not a running generator).
TEST(EvictionSim, BeladyNoisyAtZeroIsBeladyAndNoiseCostsHits) {
  GeneratorOptions g;
  g.workload = Workload::kAgents;  // reuse under pressure at these sizes (chat's 300 do not)
  g.requests = 300;
  const Trace trace = generate(g);
  ReplayOptions o;
  o.hash = HashScheme::kXxh3_128;
  const BlockTrace bt = block_trace(trace, o);
  std::uint64_t lost = 0;
  for (const std::int32_t n : {1001, 3001}) {
    SCOPED_TRACE("num_blocks " + std::to_string(n));
    const ReplayResult opt = simulate(bt, n, Eviction::kBelady);
    const ReplayResult zero = simulate(bt, n, Eviction::kBeladyNoisy, 0.0);
    EXPECT_EQ(zero.hit_tokens, opt.hit_tokens);
    EXPECT_EQ(zero.evicted_blocks, opt.evicted_blocks);
    const ReplayResult noisy = simulate(bt, n, Eviction::kBeladyNoisy, 4.0);
    const ReplayResult again = simulate(bt, n, Eviction::kBeladyNoisy, 4.0);
    EXPECT_EQ(again.hit_tokens, noisy.hit_tokens);
    EXPECT_EQ(again.evicted_blocks, noisy.evicted_blocks);
    EXPECT_EQ(noisy.queried_tokens, opt.queried_tokens);
    EXPECT_LE(noisy.hit_tokens, opt.hit_tokens);  // checked on these traces, not a theorem
    lost += opt.hit_tokens - noisy.hit_tokens;
  }
  EXPECT_GT(lost, 0u) << "sigma 4 changed nothing: the noise does not reach the ranking";
  EXPECT_THROW(simulate(bt, 1001, Eviction::kBeladyNoisy, -0.5), Error);
  EXPECT_THROW(simulate(bt, 1001, Eviction::kBeladyNoisy, kMaxBeladyNoise + 1), Error);
}

TEST(EvictionSim, WithoutEvictionBeladyAndLruAgree) {
  GeneratorOptions g;
  g.requests = 200;
  const Trace trace = generate(g);
  ReplayOptions o;
  o.hash = HashScheme::kXxh3_128;
  const BlockTrace bt = block_trace(trace, o);
  const ReplayResult lru = simulate(bt, 2000001, Eviction::kLru);
  const ReplayResult opt = simulate(bt, 2000001, Eviction::kBelady);
  EXPECT_EQ(lru.evicted_blocks, 0u);
  EXPECT_EQ(opt.evicted_blocks, 0u);
  EXPECT_EQ(opt.hit_tokens, lru.hit_tokens);
}

// Not a theorem (requests hold blocks together and a miss ends the prefix, so Belady is a
// heuristic reference here): checked on these traces and sizes only. The reuse oracle between.
TEST(EvictionSim, BeladyHitsAtLeastLruOnGeneratedTraces) {
  for (const Workload w : {Workload::kAgents, Workload::kChat, Workload::kTenants}) {
    for (const std::uint32_t seed : {1u, 2u, 3u}) {
      GeneratorOptions g;
      g.workload = w;
      g.requests = 200;
      g.seed = seed;
      const Trace trace = generate(g);
      ReplayOptions o;
      o.hash = HashScheme::kXxh3_128;
      const BlockTrace bt = block_trace(trace, o);
      for (const std::int32_t n : {300, 1001, 3001, 10001, 30001}) {
        SCOPED_TRACE(trace.name + " seed " + std::to_string(seed) + " num_blocks " +
                     std::to_string(n));
        const ReplayResult lru = simulate(bt, n, Eviction::kLru);
        const ReplayResult opt = simulate(bt, n, Eviction::kBelady);
        const ReplayResult oracle = simulate(bt, n, Eviction::kReuseOracle);
        const ReplayResult mru = simulate(bt, n, Eviction::kReuseOracleMru);
        EXPECT_EQ(opt.rejected, lru.rejected);
        EXPECT_EQ(mru.queried_tokens, lru.queried_tokens);
        EXPECT_LE(mru.hit_tokens, opt.hit_tokens);
        EXPECT_EQ(opt.queried_tokens, lru.queried_tokens);
        EXPECT_EQ(oracle.queried_tokens, lru.queried_tokens);
        EXPECT_GE(opt.hit_tokens, lru.hit_tokens);
        EXPECT_GE(oracle.hit_tokens, lru.hit_tokens);
        EXPECT_LE(oracle.hit_tokens, opt.hit_tokens);
      }
    }
  }
}

TEST(EvictionSim, OptionsAndJson) {
  EXPECT_EQ(parse_eviction("lru"), Eviction::kLru);
  EXPECT_EQ(parse_eviction("belady"), Eviction::kBelady);
  EXPECT_EQ(parse_eviction("reuse-oracle"), Eviction::kReuseOracle);
  EXPECT_STREQ(to_string(Eviction::kReuseOracle), "reuse-oracle");
  EXPECT_EQ(parse_eviction("reuse-oracle-mru"), Eviction::kReuseOracleMru);
  EXPECT_STREQ(to_string(Eviction::kReuseOracleMru), "reuse-oracle-mru");
  EXPECT_EQ(parse_eviction("belady-noisy"), Eviction::kBeladyNoisy);
  EXPECT_STREQ(to_string(Eviction::kBeladyNoisy), "belady-noisy");
  {
    ReplayOptions no;
    parse_eviction("belady-noisy:1.5", no);
    EXPECT_EQ(no.eviction, Eviction::kBeladyNoisy);
    EXPECT_DOUBLE_EQ(no.belady_noise, 1.5);
    EXPECT_EQ(eviction_name(no), "belady-noisy:1.5");
    parse_eviction("belady-noisy:0", no);
    EXPECT_EQ(no.belady_noise, 0.0);
    for (const char* bad :
         {"belady-noisy:", "belady-noisy:-1", "belady-noisy:8.5", "belady-noisy:abc",
          "belady-noisy:1x", "belady-noisy:nan", "belady-noisy:inf"}) {
      ReplayOptions b2;
      EXPECT_THROW(parse_eviction(bad, b2), Error) << bad;
      EXPECT_EQ(b2.eviction, Eviction::kLru) << bad;  // nothing changed
    }
  }
  EXPECT_THROW(parse_eviction("foo"), Error);
  EXPECT_THROW(parse_eviction("reuse"), Error);
  EXPECT_THROW(parse_eviction(""), Error);
  GeneratorOptions g;
  g.workload = Workload::kChat;
  g.requests = 100;
  const Trace trace = generate(g);
  ReplayOptions o;
  o.num_blocks = {301};
  const auto lib = run_replay(trace, o);
  const std::string json = to_json(lib[0], o, trace);
  EXPECT_NE(json.find(",\"eviction\":\"lru\"}"), std::string::npos) << json;
  o.eviction = Eviction::kBelady;
  const auto opt = run_eviction_replay(trace, o);
  ASSERT_EQ(opt.size(), 1u);
  EXPECT_EQ(opt[0].num_blocks, 301);
  // Each Belady line carries the simulator's LRU on the same blocks, which equals the library's.
  EXPECT_EQ(opt[0].sim_lru_hit_tokens, lib[0].hit_tokens);
  EXPECT_EQ(opt[0].sim_lru_evicted_blocks, lib[0].evicted_blocks);
  EXPECT_GT(lib[0].evicted_blocks, 0u);
  const std::string bj = to_json(opt[0], o, trace);
  EXPECT_NE(bj.find(",\"eviction\":\"belady\",\"sim_lru_hit_tokens\":" +
                    std::to_string(lib[0].hit_tokens) + ","),
            std::string::npos)
      << bj;
  EXPECT_EQ(json.find("sim_lru"), std::string::npos) << json;  // lru lines: only the field added
  ReplayOptions ro = o;
  parse_eviction("reuse-oracle", ro);
  EXPECT_EQ(ro.eviction, Eviction::kReuseOracle);
  EXPECT_EQ(eviction_name(ro), "reuse-oracle");
  const auto ora = run_eviction_replay(trace, ro);
  ASSERT_EQ(ora.size(), 1u);
  EXPECT_EQ(ora[0].sim_lru_hit_tokens, lib[0].hit_tokens);
  EXPECT_GE(ora[0].hit_tokens, lib[0].hit_tokens);
  EXPECT_LE(ora[0].hit_tokens, opt[0].hit_tokens);
  EXPECT_NE(
      to_json(ora[0], ro, trace).find(",\"eviction\":\"reuse-oracle\",\"sim_lru_hit_tokens\":"),
      std::string::npos);
  o.mode = Mode::kEngine;
  EXPECT_THROW(run_eviction_replay(trace, o), Error);
  EXPECT_THROW(simulate(block_trace(trace, ReplayOptions{}), 1, Eviction::kBelady), Error);
  BlockTrace bad;
  bad.block_size = 16;
  bad.distinct = 1;
  EXPECT_THROW(bad.add(33, {0}), Error);  // 2 full blocks need 2 ids
  EXPECT_THROW(bad.add(16, {1}), Error);  // id >= distinct
}

// --adaptive-ghost-sample-shift reaches the pool: at 8,001 blocks each ghost FIFO holds 2,000
// entries, so the pool's own choice (-1) is 1 (the largest shift leaving 512 or more); the same
// replay with 1 set gives the same hits, 0 (exact ghosts) and 4 other ones. The JSON names the
// setting only when it is given.
TEST(ReplayPolicy, AdaptiveGhostSampleShiftReachesThePool) {
  GeneratorOptions g;
  g.workload = Workload::kAgents;
  g.requests = 1000;
  const Trace trace = generate(g);
  ReplayOptions o;
  o.hash = HashScheme::kXxh3_128;
  o.num_blocks = {8001};
  parse_eviction("adaptive", o);
  std::uint64_t hits[6] = {};
  for (int s = -1; s <= 4; ++s) {
    o.adaptive_ghost_sample_shift = s;
    const auto r = run_replay(trace, o);
    ASSERT_EQ(r.size(), 1u);
    hits[s + 1] = r[0].hit_tokens;
    const std::string json = to_json(r[0], o, trace);
    EXPECT_EQ(json.find("adaptive_ghost_sample_shift") == std::string::npos, s == -1) << json;
  }
  EXPECT_EQ(hits[0], hits[2]);  // -1 chose 1
  EXPECT_NE(hits[1], hits[2]);  // 0 is not 1
  EXPECT_NE(hits[1], hits[5]);  // 0 is not 4
}

// data/traces/README.md, reference figures (first 1,000 requests), and the library replay.
TEST(EvictionTraces, LruModeEqualsTheLibraryOnTheFirstThousandMooncakeRequests) {
  if (!std::filesystem::exists(kMooncakeTrace)) GTEST_SKIP() << "missing " << kMooncakeTrace;
  LoadOptions load;
  load.limit = 1000;
  const Trace trace = load_hashid_jsonl(kMooncakeTrace, load);
  ReplayOptions o;
  o.hash = HashScheme::kXxh3_128;
  o.num_blocks = {8193, 32769, 1000001};
  const auto lib = run_replay(trace, o);
  const BlockTrace bt = block_trace(trace, o);
  const std::uint64_t hits[] = {511488, 534400, 2962688};
  const std::uint64_t evicted[] = {817691, 791683, 0};
  for (std::size_t k = 0; k < o.num_blocks.size(); ++k) {
    SCOPED_TRACE("num_blocks " + std::to_string(o.num_blocks[k]));
    const ReplayResult sim = simulate(bt, o.num_blocks[k], Eviction::kLru);
    expect_same(lib[k], sim);
    EXPECT_EQ(sim.hit_tokens, hits[k]);
    EXPECT_EQ(sim.evicted_blocks, evicted[k]);
    const ReplayResult opt = simulate(bt, o.num_blocks[k], Eviction::kBelady);
    EXPECT_GE(opt.hit_tokens, sim.hit_tokens);  // checked on this trace, not a theorem
    EXPECT_LE(opt.hit_tokens, hits[2]);         // never above the unbounded cache
    const ReplayResult oracle = simulate(bt, o.num_blocks[k], Eviction::kReuseOracle);
    EXPECT_GE(oracle.hit_tokens, sim.hit_tokens);  // checked on this trace, not a theorem
    EXPECT_LE(oracle.hit_tokens, opt.hit_tokens);
  }
}

}  // namespace
}  // namespace pagedkv::replay
