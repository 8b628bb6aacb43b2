// The K/V ring protocol of the warp-specialized extend kernel (ExtendKernel::kWgmmaWarpSpecialized,
// kernels/extend_attention_wgmma_ws.cu), checked on the host with the kernel's own schedule
// functions (kernels/internal/wgmma_ws_ring.hpp) against a model of mbarrier phases.
//
// The model: one producer and two consumer warpgroups, each an actor that runs the kernel's
// sequence of barrier operations (threads of a warpgroup act alike, so a warpgroup's 128 arrivals
// are one here: the kernel's init counts kWsFullArrivals and kWsEmptyArrivals, divided by 128). A
// barrier completes its current phase when its expected arrivals have come, then starts the next;
// wait_parity(P) passes once the phase of parity P has completed (a fresh barrier: phase 0 running,
// so parity 1 passes). The producer's copies land asynchronously: filling a stage marks it in
// flight, and a separate event, taken at a random later point, lands it and arrives on full[s]. A
// random scheduler interleaves the actors and the landing events. Checked at every step: a consumer
// reads a stage only when it holds its tile, landed (for the S GEMM of tile t, and for the PV GEMM
// of tile t - 1 one iteration later); the producer never refills a stage a consumer will still
// read; and every run ends (no deadlock) with both consumers having read every tile. The consumers'
// loop order (wait full, S GEMM of t, PV GEMM of t - 1, free t - 1, a last PV GEMM) mirrors the
// kernel's.
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

// One run: returns "" or what went wrong.
std::string run_protocol(int tiles, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  // The kernel's init counts, in warpgroups (each actor's arrival stands for its 128 threads').
  std::array<Barrier, kWsStages> full{};
  std::array<Barrier, kWsStages> empty{};
  for (auto& b : full) b.expected = detail::kWsFullArrivals / detail::kWsWarpgroupThreads;
  for (auto& b : empty) b.expected = detail::kWsEmptyArrivals / detail::kWsWarpgroupThreads;
  std::array<Stage, kWsStages> stages{};
  std::vector<int> in_flight;  // tiles issued, not landed

  int producer_t = 0;  // the producer's next tile
  // A consumer's position: the tile it is at, and its step within the iteration.
  struct Consumer {
    int t = 0;
    int step = 0;  // 0: wait full(t); 1: S GEMM(t) + PV GEMM(t - 1) + free(t - 1); 2: done
    int last_pv_done = -1;
    std::vector<int> read;  // tiles whose S GEMM it ran
  };
  std::array<Consumer, 2> consumers{};
  if (tiles == 0) {
    for (Consumer& k : consumers) k.step = 2;  // the kernel's consumers skip the loop
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

  for (int guard = 0; guard < 100000; ++guard) {
    // What can move now.
    std::vector<int> movers;  // 0: producer, 1/2: consumers, 3: a landing
    if (producer_t < tiles && empty[static_cast<std::size_t>(detail::ws_stage(producer_t))].passes(
                                  detail::ws_empty_parity(producer_t))) {
      movers.push_back(0);
    }
    for (int c = 0; c < 2; ++c) {
      const Consumer& k = consumers[static_cast<std::size_t>(c)];
      if (k.step == 2) continue;
      if (k.step == 0 && !full[static_cast<std::size_t>(detail::ws_stage(k.t))].passes(
                             detail::ws_full_parity(k.t))) {
        continue;
      }
      movers.push_back(1 + c);
    }
    if (!in_flight.empty()) movers.push_back(3);
    const bool finished = producer_t == tiles && in_flight.empty() && consumers[0].step == 2 &&
                          consumers[1].step == 2;
    if (finished) break;
    if (movers.empty()) {
      return "deadlock: producer at tile " + std::to_string(producer_t) + ", consumers at " +
             std::to_string(consumers[0].t) + " / " + std::to_string(consumers[1].t);
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
    } else if (who == 3) {  // some issued tile's copies land; their completion arrives on full
      const std::size_t i =
          std::uniform_int_distribution<std::size_t>(0, in_flight.size() - 1)(rng);
      const int tile = in_flight[i];
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
      stages[static_cast<std::size_t>(detail::ws_stage(tile))].landed = true;
      full[static_cast<std::size_t>(detail::ws_stage(tile))].arrive();
    } else {
      Consumer& k = consumers[static_cast<std::size_t>(who - 1)];
      if (k.step == 0) {
        k.step = 1;  // full(t) passed
      } else {
        // S GEMM of tile t, PV GEMM of tile t - 1, then free the stage of the tile whose release
        // iteration this is.
        if (std::string e = check_holds(k.t, "S GEMM"); !e.empty()) return e;
        k.read.push_back(k.t);
        if (k.t > 0) {
          if (std::string e = check_holds(k.t - 1, "PV GEMM"); !e.empty()) return e;
          k.last_pv_done = k.t - 1;
        }
        for (int u = 0; u <= k.t; ++u) {  // the stages the schedule frees in this iteration
          if (detail::ws_release_iteration(u) == k.t) {
            empty[static_cast<std::size_t>(detail::ws_stage(u))].arrive();
          }
        }
        if (++k.t == tiles) {  // the last PV GEMM; its stage is never freed
          if (std::string e = check_holds(k.t - 1, "last PV GEMM"); !e.empty()) return e;
          k.last_pv_done = k.t - 1;
          k.step = 2;
        } else {
          k.step = 0;
        }
      }
    }
  }
  for (const Consumer& k : consumers) {
    if (static_cast<int>(k.read.size()) != tiles) return "a consumer did not read every tile";
  }
  return "";
}

TEST(WgmmaWsRing, EveryInterleavingReadsEachTileFromItsStageAndEnds) {
  for (int tiles = 0; tiles <= 13; ++tiles) {
    for (std::uint64_t seed = 1; seed <= 300; ++seed) {
      const std::string e = run_protocol(tiles, seed * 7919 + static_cast<std::uint64_t>(tiles));
      ASSERT_EQ(e, "") << tiles << " tiles, seed " << seed;
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
}

}  // namespace
}  // namespace pagedkv
