// The K/V ring protocol of the warp-specialized extend kernel (ExtendKernel::kWgmmaWarpSpecialized,
// kernels/extend_attention_wgmma_ws.cu), checked on the host with the kernel's own schedule
// functions (kernels/internal/wgmma_ws_ring.hpp) against a model of mbarrier phases.
//
// The model: one producer and two consumer warpgroups, each an actor that runs the kernel's
// sequence of barrier operations (threads of a warpgroup act alike, so a warpgroup's 128 arrivals
// are one here: the kernel's init counts divided by 128), and again with each consumer warp an
// actor of its own (a warp's 32 arrivals one: the counts divided by 32), since the warps of a
// warpgroup are not kept together between barriers and a lagging warp is where a parity wait could
// see its barrier two phases ahead (ABA). A barrier completes its current phase when its expected
// arrivals have come, then starts the next; wait_parity(P) passes once the phase of parity P has
// completed (a fresh barrier: phase 0 running, so parity 1 passes). The producer's copies land
// asynchronously: filling a stage marks it in flight, and a separate event, taken at a random later
// point, lands it and arrives on full[s]. A random scheduler interleaves the actors and the landing
// events. Checked at every step: a consumer reads a stage only when it holds its tile, landed (for
// the S GEMM of tile t, and for the PV GEMM of tile t - 1 one iteration later); the producer never
// refills a stage a consumer will still read; every run ends (no deadlock) with both consumers
// having read every tile; with ping-pong, the consumers' GEMM issues alternate strictly, consumer 0
// first (per warp: at consumer 0's turn t every warp of consumer 1 has issued exactly t turns, at
// consumer 1's t + 1 every warp of consumer 0). The consumers' loop order (wait full, wait the
// turn, S GEMM of t, PV GEMM of t - 1, hand the turn over, free t - 1; a last PV GEMM in its own
// turn) mirrors the kernel's.
#include "internal/wgmma_ws_ring.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace pagedkv {
namespace {

using detail::kWsStages;

struct Barrier {
  int expected = 1;
  int arrived = 0;
  std::uint32_t phase = 0;  // the running phase

  void arrive() {
    if (++arrived == expected) {
      arrived = 0;
      ++phase;
    }
  }
  // The phase of parity `parity` has completed: the running phase has the other parity.
  bool passes(std::uint32_t parity) const { return (phase & 1u) != parity; }
};

struct Stage {
  int tile = -1;        // the tile whose copies were issued into it last
  bool landed = false;  // those copies have completed
};

// One run: returns "" or what went wrong. ping_pong: the consumers take turns issuing GEMMs on
// the turn barriers (kWgmmaWarpSpecializedPingPong's kernel; kWgmmaWarpSpecialized's without).
// warps: actors per
// consumer warpgroup (1: the warpgroup acts as one; 4: each warp is an actor of its own, as on
// the hardware, where nothing keeps a warpgroup's warps together between barriers, so one warp
// can lag behind its warpgroup's arrivals: the case in which a parity wait could alias a phase
// two completions ahead).
std::string run_protocol(int tiles, std::uint64_t seed, bool ping_pong, int warps) {
  std::mt19937_64 rng(seed);
  // The kernel's init counts in the model's units: the producer's copies land as one event per
  // tile (kWsFullArrivals / 128); a consumer actor's arrival stands for its 128 / warps threads'.
  const int threads_per_actor = detail::kWsWarpgroupThreads / warps;
  std::array<Barrier, kWsStages> full{};
  std::array<Barrier, kWsStages> empty{};
  std::array<Barrier, 2> turn{};
  for (auto& b : full) b.expected = detail::kWsFullArrivals / detail::kWsWarpgroupThreads;
  for (auto& b : empty) b.expected = detail::kWsEmptyArrivals / threads_per_actor;
  for (auto& b : turn) b.expected = detail::kWsTurnArrivals / threads_per_actor;
  std::array<Stage, kWsStages> stages{};
  std::vector<int> in_flight;  // tiles issued, not landed

  int producer_t = 0;  // the producer's next tile
  // A consumer actor's position: the GEMM-issue point t it is at (0 .. tiles: tile t's S GEMM and
  // tile t - 1's PV GEMM; t == tiles only the last PV GEMM, after the loop), and its step there.
  struct Consumer {
    int c = 0;  // its warpgroup: consumer 0 or 1
    int t = 0;
    int step = 0;  // 0: wait full(t) (t < tiles); 1: wait its turn; 2: issue; 3: done
    int last_pv_done = -1;
    std::vector<int> read;  // tiles whose S GEMM it ran
  };
  std::vector<Consumer> consumers(static_cast<std::size_t>(2 * warps));
  for (std::size_t i = 0; i < consumers.size(); ++i) {
    consumers[i].c = static_cast<int>(i) / warps;
    if (tiles == 0) consumers[i].step = 3;  // the kernel's consumers skip the loop
  }
  std::vector<int> issue_order;  // which consumer issued, at every issue point (warps == 1)
  if (ping_pong) {
    for (const Consumer& k : consumers) {
      if (detail::ws_turn_primed(k.c)) turn[0].arrive();  // before the consumers' loops
    }
  }

  const auto check_holds = [&](int tile, const char* what) -> std::string {
    const Stage& st = stages[static_cast<std::size_t>(detail::ws_stage(tile))];
    if (st.tile != tile || !st.landed) {
      return std::string(what) + " of tile " + std::to_string(tile) + " found stage " +
             std::to_string(detail::ws_stage(tile)) + " holding tile " + std::to_string(st.tile) +
             (st.landed ? " (landed)" : " (in flight)");
    }
    return "";
  };
  const int landing = 1 + 2 * warps;  // the mover id of a landing event

  for (int guard = 0; guard < 1000000; ++guard) {
    // What can move now.
    std::vector<int> movers;  // 0: producer, 1 .. 2 warps: consumer actors, then a landing
    if (producer_t < tiles && empty[static_cast<std::size_t>(detail::ws_stage(producer_t))].passes(
                                  detail::ws_empty_parity(producer_t))) {
      movers.push_back(0);
    }
    bool all_done = true;
    for (std::size_t i = 0; i < consumers.size(); ++i) {
      const Consumer& k = consumers[i];
      if (k.step == 3) continue;
      all_done = false;
      if (k.step == 0 && k.t < tiles &&
          !full[static_cast<std::size_t>(detail::ws_stage(k.t))].passes(
              detail::ws_full_parity(k.t))) {
        continue;
      }
      if (k.step == 1 && ping_pong &&
          !turn[static_cast<std::size_t>(k.c)].passes(detail::ws_turn_parity(k.t))) {
        continue;
      }
      movers.push_back(1 + static_cast<int>(i));
    }
    if (!in_flight.empty()) movers.push_back(landing);
    if (producer_t == tiles && in_flight.empty() && all_done) break;
    if (movers.empty()) {
      return "deadlock: producer at tile " + std::to_string(producer_t) + ", consumer actors at " +
             std::to_string(consumers.front().t) + " .. " + std::to_string(consumers.back().t);
    }
    const int who = movers[std::uniform_int_distribution<std::size_t>(0, movers.size() - 1)(rng)];
    if (who == 0) {  // refill the stage with tile producer_t (copies in flight)
      Stage& st = stages[static_cast<std::size_t>(detail::ws_stage(producer_t))];
      for (const Consumer& k : consumers) {
        // A consumer still needs st.tile if it has not finished that tile's PV GEMM.
        if (st.tile >= 0 && k.last_pv_done < st.tile) {
          return "producer refilled stage " + std::to_string(detail::ws_stage(producer_t)) +
                 " (tile " + std::to_string(st.tile) + ") with tile " + std::to_string(producer_t) +
                 " before a consumer's PV GEMM of it";
        }
      }
      st.tile = producer_t;
      st.landed = false;
      in_flight.push_back(producer_t);
      ++producer_t;
    } else if (who == landing) {  // some issued tile's copies land; their completion arrives
      const std::size_t i =
          std::uniform_int_distribution<std::size_t>(0, in_flight.size() - 1)(rng);
      const int tile = in_flight[i];
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
      stages[static_cast<std::size_t>(detail::ws_stage(tile))].landed = true;
      full[static_cast<std::size_t>(detail::ws_stage(tile))].arrive();
    } else {
      Consumer& k = consumers[static_cast<std::size_t>(who - 1)];
      if (k.step < 2) {
        ++k.step;  // full(t) passed (or none to wait for, at the last PV GEMM); then its turn
        continue;
      }
      // Issue: S GEMM of tile t (t < tiles), PV GEMM of tile t - 1, hand the turn over, then free
      // the stage of the tile whose release iteration this is (the loop's iterations only: the
      // last tile's stage is never freed).
      if (k.t < tiles) {
        if (std::string e = check_holds(k.t, "S GEMM"); !e.empty()) return e;
        k.read.push_back(k.t);
      }
      if (k.t > 0) {
        if (std::string e = check_holds(k.t - 1, "PV GEMM"); !e.empty()) return e;
        k.last_pv_done = k.t - 1;
      }
      if (ping_pong) {
        // Strict alternation of the warpgroups, consumer 0 first: at consumer 0's turn t, every
        // actor of consumer 1 has issued exactly t turns (0 .. t - 1); at consumer 1's turn t,
        // every actor of consumer 0 exactly t + 1.
        for (const Consumer& o : consumers) {
          if (o.c == k.c) continue;
          const int issued = o.step == 3 ? tiles + 1 : o.t;
          if (issued != k.t + k.c) {
            return "consumer " + std::to_string(k.c) + " issued turn " + std::to_string(k.t) +
                   " while an actor of consumer " + std::to_string(o.c) + " had issued " +
                   std::to_string(issued) + " turns: the warpgroups do not alternate";
          }
        }
      }
      issue_order.push_back(k.c);
      if (ping_pong) turn[static_cast<std::size_t>(1 - k.c)].arrive();
      if (k.t < tiles) {
        for (int u = 0; u <= k.t; ++u) {
          if (detail::ws_release_iteration(u) == k.t) {
            empty[static_cast<std::size_t>(detail::ws_stage(u))].arrive();
          }
        }
      }
      k.step = ++k.t > tiles ? 3 : 0;
    }
  }
  for (const Consumer& k : consumers) {
    if (static_cast<int>(k.read.size()) != tiles) return "a consumer did not read every tile";
  }
  if (ping_pong && warps == 1) {
    // Strict alternation, consumer 0 first: tiles + 1 issue points each.
    const std::size_t points = tiles == 0 ? 0 : 2 * static_cast<std::size_t>(tiles + 1);
    if (issue_order.size() != points) return "wrong number of issue points";
    for (std::size_t i = 0; i < issue_order.size(); ++i) {
      if (issue_order[i] != static_cast<int>(i % 2)) {
        return "issue " + std::to_string(i) + " by consumer " + std::to_string(issue_order[i]) +
               ": the consumers do not alternate, consumer 0 first";
      }
    }
  }
  return "";
}

TEST(WgmmaWsRing, EveryInterleavingReadsEachTileFromItsStageAndEnds) {
  for (const bool ping_pong : {true, false}) {
    for (int tiles = 0; tiles <= 13; ++tiles) {
      for (std::uint64_t seed = 1; seed <= 300; ++seed) {
        const std::string e =
            run_protocol(tiles, seed * 7919 + static_cast<std::uint64_t>(tiles), ping_pong, 1);
        ASSERT_EQ(e, "") << tiles << " tiles, seed " << seed << ", ping-pong " << ping_pong;
      }
    }
  }
}

// The same with every consumer warp an actor of its own (the warps of a warpgroup drift apart
// between barriers): no deadlock, no stage read early or refilled late, and the warpgroups still
// take strict turns, so no parity wait ever sees its barrier two phases ahead.
TEST(WgmmaWsRing, EveryInterleavingOfTheConsumerWarpsAlternatesAndEnds) {
  constexpr int kWarps = detail::kWsWarpgroupThreads / 32;
  for (const bool ping_pong : {true, false}) {
    for (int tiles = 0; tiles <= 9; ++tiles) {
      for (std::uint64_t seed = 1; seed <= 200; ++seed) {
        const std::string e = run_protocol(tiles, seed * 104729 + static_cast<std::uint64_t>(tiles),
                                           ping_pong, kWarps);
        ASSERT_EQ(e, "") << tiles << " tiles, seed " << seed << ", ping-pong " << ping_pong;
      }
    }
  }
}

TEST(WgmmaWsRing, ScheduleFunctions) {
  // Stage, round parities and the offset slot of the first tiles (kWsStages = 4).
  EXPECT_EQ(kWsStages, 4);
  for (int t = 0; t < 24; ++t) {
    EXPECT_EQ(detail::ws_stage(t), t % 4);
    EXPECT_EQ(detail::ws_full_parity(t), static_cast<std::uint32_t>((t / 4) % 2));
    EXPECT_NE(detail::ws_full_parity(t), detail::ws_empty_parity(t));
    EXPECT_EQ(detail::ws_offset_slot(t), t % 2);
    EXPECT_NE(detail::ws_offset_slot(t), detail::ws_offset_slot(t + 1));
    EXPECT_GT(detail::ws_release_iteration(t), t);  // never before its own S GEMM
  }
  // A fresh barrier (phase 0 running) lets the producer fill round 0 at once, not a consumer.
  Barrier fresh;
  EXPECT_TRUE(fresh.passes(detail::ws_empty_parity(0)));
  EXPECT_FALSE(fresh.passes(detail::ws_full_parity(0)));
  // Turns: a consumer's first turn (parity 0) needs an arrival, so exactly one consumer is primed.
  EXPECT_FALSE(fresh.passes(detail::ws_turn_parity(0)));
  EXPECT_NE(detail::ws_turn_primed(0), detail::ws_turn_primed(1));
  for (int k = 0; k < 8; ++k) EXPECT_NE(detail::ws_turn_parity(k), detail::ws_turn_parity(k + 1));
}

}  // namespace
}  // namespace pagedkv
