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

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
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

// One run: returns "" or what went wrong. items: the key tiles of each work item the CTA runs, in
// order (the non-persistent kernel: exactly one). persistent: the persistent kernel's protocol
// (the items handed from the producer to the consumers through the item slots, ring tiles and
// turns counted over the items, every tile's stage freed); else the single-item kernel's (the
// last tile's stage never freed). ping_pong: the consumers take turns issuing GEMMs on the turn
// barriers. warps: actors per consumer warpgroup (1: the warpgroup acts as one; 4: each warp is
// an actor of its own, as on the hardware, where nothing keeps a warpgroup's warps together
// between barriers, so one warp can lag behind its warpgroup's arrivals: the case in which a
// parity wait could alias a phase two completions ahead).
std::string run_protocol(const std::vector<int>& items, std::uint64_t seed, bool ping_pong,
                         int warps, bool persistent) {
  std::mt19937_64 rng(seed);
  const int num_items = static_cast<int>(items.size());
  std::vector<int> item_base(items.size() + 1, 0);  // ring tiles before each item
  for (std::size_t i = 0; i < items.size(); ++i) item_base[i + 1] = item_base[i] + items[i];
  const int total_tiles = item_base.back();
  int total_turns = 0;
  for (const int tiles : items) total_turns += detail::ws_item_turns(tiles);
  // The kernel's init counts in the model's units: the producer's copies land as one event per
  // tile (kWsFullArrivals / 128); a consumer actor's arrival stands for its 128 / warps threads'.
  const int threads_per_actor = detail::kWsWarpgroupThreads / warps;
  std::array<Barrier, kWsStages> full{};
  std::array<Barrier, kWsStages> empty{};
  std::array<Barrier, 2> turn{};
  std::array<Barrier, detail::kWsItemSlots> item_full{};
  std::array<Barrier, detail::kWsItemSlots> item_empty{};
  for (auto& b : full) b.expected = detail::kWsFullArrivals / detail::kWsWarpgroupThreads;
  for (auto& b : empty) b.expected = detail::kWsEmptyArrivals / threads_per_actor;
  for (auto& b : turn) b.expected = detail::kWsTurnArrivals / threads_per_actor;
  for (auto& b : item_full) b.expected = detail::kWsItemFullArrivals;
  for (auto& b : item_empty) b.expected = detail::kWsItemEmptyArrivals / threads_per_actor;
  std::array<Stage, kWsStages> stages{};
  std::array<int, detail::kWsItemSlots> slot_item{};  // what each item slot holds (-1: none left)
  slot_item.fill(-2);                                 // never written
  struct InFlight {
    int tile;   // ring tile (over the items)
    int stage;  // where the producer put it
  };
  std::vector<InFlight> in_flight;  // tiles issued, not landed

  // The producer: publishes item n (persistent; n == num_items publishes "none left"), then fills
  // its tiles; the single-item kernel starts at its item's tiles.
  int producer_item = 0;
  bool producer_published = !persistent;
  int producer_t = 0;  // within the item
  // The kernel's own counters, reduced as the kernel keeps them (ws_next_ring_base,
  // ws_next_item): every barrier, stage and slot below is chosen from these, and the model's
  // global item and tile numbers only check that it is the right one.
  int producer_ring_base = 0;
  int producer_n = 0;
  // A consumer actor's position: its item, the GEMM-issue point t it is at within it (0 .. tiles:
  // tile t's S GEMM and tile t - 1's PV GEMM; t == tiles only the last PV GEMM, after the loop),
  // and its step there.
  struct Consumer {
    int c = 0;  // its warpgroup: consumer 0 or 1
    int item = 0;
    int t = 0;
    // 0: wait full(t) (t < tiles); 1: wait its turn; 2: issue; 3: done; 4: wait for the item
    // (persistent)
    int step = 0;
    int turns_issued = 0;   // over the items
    int last_pv_done = -1;  // ring tile
    std::vector<int> read;  // ring tiles whose S GEMM it ran
    int ring_base = 0;      // the kernel's reduced counters (ws_next_ring_base, ...)
    int turn_base = 0;
    int n = 0;
  };
  std::vector<Consumer> consumers(static_cast<std::size_t>(2 * warps));
  const auto start_item = [&](Consumer& k) {
    k.t = 0;
    k.step = k.item < num_items && items[static_cast<std::size_t>(k.item)] > 0 ? 0 : 2;
  };
  for (std::size_t i = 0; i < consumers.size(); ++i) {
    consumers[i].c = static_cast<int>(i) / warps;
    if (persistent) {
      consumers[i].step = 4;
    } else if (items[0] == 0) {
      consumers[i].step = 3;  // the kernel's consumers skip the loop
    }
  }
  std::vector<int> issue_order;  // which consumer issued, at every issue point (warps == 1)
  if (ping_pong) {
    for (const Consumer& k : consumers) {
      if (detail::ws_turn_primed(k.c)) turn[0].arrive();  // before the consumers' loops
    }
  }

  // Ring tile `tile` read from the stage the kernel's counters name (position = reduced base + t).
  const auto check_holds = [&](int tile, int position, const char* what) -> std::string {
    const int stage = detail::ws_stage(position);
    const Stage& st = stages[static_cast<std::size_t>(stage)];
    if (st.tile != tile || !st.landed) {
      return std::string(what) + " of tile " + std::to_string(tile) + " found stage " +
             std::to_string(stage) + " holding tile " + std::to_string(st.tile) +
             (st.landed ? " (landed)" : " (in flight)");
    }
    return "";
  };
  const auto release = [&](int position) {
    empty[static_cast<std::size_t>(detail::ws_stage(position))].arrive();
  };
  const int landing = 1 + 2 * warps;  // the mover id of a landing event
  const auto producer_can_move = [&] {
    if (!producer_published) {
      return producer_item <= num_items &&
             item_empty[static_cast<std::size_t>(detail::ws_item_slot(producer_n))].passes(
                 detail::ws_item_empty_parity(producer_n));
    }
    if (producer_item >= num_items) return false;
    if (producer_t >= items[static_cast<std::size_t>(producer_item)]) return true;  // next item
    const int position = producer_ring_base + producer_t;
    return empty[static_cast<std::size_t>(detail::ws_stage(position))].passes(
        detail::ws_empty_parity(position));
  };

  for (int guard = 0; guard < 4000000; ++guard) {
    // What can move now.
    std::vector<int> movers;  // 0: producer, 1 .. 2 warps: consumer actors, then a landing
    if (producer_can_move()) movers.push_back(0);
    bool all_done = true;
    for (std::size_t i = 0; i < consumers.size(); ++i) {
      const Consumer& k = consumers[i];
      if (k.step == 3) continue;
      all_done = false;
      if (k.step == 4 && !item_full[static_cast<std::size_t>(detail::ws_item_slot(k.n))].passes(
                             detail::ws_item_full_parity(k.n))) {
        continue;
      }
      const int tiles = k.item < num_items ? items[static_cast<std::size_t>(k.item)] : 0;
      const int position = k.ring_base + k.t;
      if (k.step == 0 && k.t < tiles &&
          !full[static_cast<std::size_t>(detail::ws_stage(position))].passes(
              detail::ws_full_parity(position))) {
        continue;
      }
      if (k.step == 1 && ping_pong &&
          !turn[static_cast<std::size_t>(k.c)].passes(detail::ws_turn_parity(k.turn_base + k.t))) {
        continue;
      }
      movers.push_back(1 + static_cast<int>(i));
    }
    if (!in_flight.empty()) movers.push_back(landing);
    const bool producer_done = persistent ? producer_item > num_items : producer_item >= num_items;
    if (producer_done && in_flight.empty() && all_done) break;
    if (movers.empty()) {
      return "deadlock: producer at item " + std::to_string(producer_item) + " tile " +
             std::to_string(producer_t) + ", consumer actors at item " +
             std::to_string(consumers.front().item) + " tile " +
             std::to_string(consumers.front().t) + " .. item " +
             std::to_string(consumers.back().item) + " tile " + std::to_string(consumers.back().t);
    }
    const int who = movers[std::uniform_int_distribution<std::size_t>(0, movers.size() - 1)(rng)];
    if (who == 0) {
      if (!producer_published) {  // write item producer_item (or "none left") into its slot
        const std::size_t slot = static_cast<std::size_t>(detail::ws_item_slot(producer_n));
        for (const Consumer& k : consumers) {
          // Every consumer must be done with the item the slot held (read in place until then).
          if (slot_item[slot] >= 0 && k.item <= slot_item[slot] && k.step != 3) {
            return "producer rewrote item slot " + std::to_string(slot) + " (item " +
                   std::to_string(slot_item[slot]) + ") while a consumer still worked on it";
          }
        }
        slot_item[slot] = producer_item < num_items ? producer_item : -1;
        item_full[slot].arrive();
        producer_published = true;
        producer_t = 0;
        if (producer_item == num_items) ++producer_item;  // done
        continue;
      }
      if (producer_t >= items[static_cast<std::size_t>(producer_item)]) {  // the next item
        producer_ring_base = detail::ws_next_ring_base(
            producer_ring_base, items[static_cast<std::size_t>(producer_item)]);
        producer_n = detail::ws_next_item(producer_n);
        ++producer_item;
        producer_published = !persistent;
        producer_t = 0;
        continue;
      }
      // Refill the stage with ring tile g (copies in flight).
      const int g = item_base[static_cast<std::size_t>(producer_item)] + producer_t;
      const int stage = detail::ws_stage(producer_ring_base + producer_t);
      Stage& st = stages[static_cast<std::size_t>(stage)];
      for (const Consumer& k : consumers) {
        // A consumer still needs st.tile if it has not finished that tile's PV GEMM.
        if (st.tile >= 0 && k.last_pv_done < st.tile) {
          return "producer refilled stage " + std::to_string(stage) + " (tile " +
                 std::to_string(st.tile) + ") with tile " + std::to_string(g) +
                 " before a consumer's PV GEMM of it";
        }
      }
      st.tile = g;
      st.landed = false;
      in_flight.push_back({g, stage});
      ++producer_t;
    } else if (who == landing) {  // some issued tile's copies land; their completion arrives
      const std::size_t i =
          std::uniform_int_distribution<std::size_t>(0, in_flight.size() - 1)(rng);
      const InFlight copy = in_flight[i];
      in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
      stages[static_cast<std::size_t>(copy.stage)].landed = true;
      full[static_cast<std::size_t>(copy.stage)].arrive();
    } else {
      Consumer& k = consumers[static_cast<std::size_t>(who - 1)];
      if (k.step == 4) {  // the item slot passed: read it
        const int held = slot_item[static_cast<std::size_t>(detail::ws_item_slot(k.n))];
        const int want = k.item < num_items ? k.item : -1;
        if (held != want) {
          return "consumer read item slot " + std::to_string(detail::ws_item_slot(k.n)) +
                 " for item " + std::to_string(k.item) + " and found " + std::to_string(held);
        }
        if (held < 0) {
          k.step = 3;  // none left
        } else {
          start_item(k);
        }
        continue;
      }
      const int tiles = items[static_cast<std::size_t>(k.item)];
      const int base = item_base[static_cast<std::size_t>(k.item)];
      if (k.step < 2) {
        ++k.step;  // full(t) passed (or none to wait for, at the last PV GEMM); then its turn
        continue;
      }
      if (tiles > 0) {
        // Issue: S GEMM of tile t (t < tiles), PV GEMM of tile t - 1, hand the turn over, then
        // free the stage of the tile whose release iteration this is (the loop's iterations; the
        // persistent kernel frees the item's last tile after its last PV GEMM too).
        const int rb = k.ring_base;
        if (k.t < tiles) {
          if (std::string e = check_holds(base + k.t, rb + k.t, "S GEMM"); !e.empty()) return e;
          k.read.push_back(base + k.t);
        }
        if (k.t > 0) {
          if (std::string e = check_holds(base + k.t - 1, rb + k.t - 1, "PV GEMM"); !e.empty()) {
            return e;
          }
          k.last_pv_done = base + k.t - 1;
        }
        if (ping_pong) {
          // Strict alternation of the warpgroups, consumer 0 first: at consumer 0's turn K (over
          // the items), every actor of consumer 1 has issued exactly K turns; at consumer 1's
          // turn K, every actor of consumer 0 exactly K + 1.
          for (const Consumer& o : consumers) {
            if (o.c == k.c) continue;
            if (o.turns_issued != k.turns_issued + k.c) {
              return "consumer " + std::to_string(k.c) + " issued turn " +
                     std::to_string(k.turns_issued) + " while an actor of consumer " +
                     std::to_string(o.c) + " had issued " + std::to_string(o.turns_issued) +
                     " turns: the warpgroups do not alternate";
            }
          }
        }
        issue_order.push_back(k.c);
        ++k.turns_issued;
        if (ping_pong) turn[static_cast<std::size_t>(1 - k.c)].arrive();
        if (k.t < tiles) {
          for (int u = 0; u <= k.t; ++u) {
            if (detail::ws_release_iteration(u) == k.t) release(rb + u);
          }
        } else if (persistent) {
          release(rb + tiles - 1);
        }
        if (++k.t <= tiles) {
          k.step = 0;
          continue;
        }
      }
      // The item is done.
      if (!persistent) {
        k.step = 3;
        continue;
      }
      item_empty[static_cast<std::size_t>(detail::ws_item_slot(k.n))].arrive();
      k.ring_base = detail::ws_next_ring_base(k.ring_base, tiles);
      k.turn_base = detail::ws_next_turn_base(k.turn_base, tiles);
      k.n = detail::ws_next_item(k.n);
      ++k.item;
      k.step = 4;
    }
  }
  for (const Consumer& k : consumers) {
    if (static_cast<int>(k.read.size()) != total_tiles) return "a consumer did not read every tile";
    for (int g = 0; g < total_tiles; ++g) {
      if (k.read[static_cast<std::size_t>(g)] != g) return "a consumer read the tiles out of order";
    }
    if (k.turns_issued != total_turns) return "a consumer issued a wrong number of turns";
  }
  if (ping_pong && warps == 1) {
    // Strict alternation, consumer 0 first.
    if (issue_order.size() != 2 * static_cast<std::size_t>(total_turns)) {
      return "wrong number of issue points";
    }
    for (std::size_t i = 0; i < issue_order.size(); ++i) {
      if (issue_order[i] != static_cast<int>(i % 2)) {
        return "issue " + std::to_string(i) + " by consumer " + std::to_string(issue_order[i]) +
               ": the consumers do not alternate, consumer 0 first";
      }
    }
  }
  return "";
}

// Random item lists for the persistent kernel: 1-6 items of 0-9 tiles (an item without keys
// included), so items wrap the ring at every offset.
std::vector<int> random_items(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> items(std::uniform_int_distribution<std::size_t>(1, 6)(rng));
  for (int& t : items) t = std::uniform_int_distribution<int>(0, 9)(rng);
  return items;
}

// The unsigned stage, slot and parity arithmetic is the signed one on every index the kernels
// use (non-negative), up to the largest int.
TEST(WgmmaWsRing, StagesAndParitiesOfEveryIndex) {
  const auto check = [](int i) {
    ASSERT_EQ(detail::ws_stage(i), i % detail::kWsStages) << i;
    ASSERT_EQ(detail::ws_full_parity(i), static_cast<std::uint32_t>((i / detail::kWsStages) & 1))
        << i;
    ASSERT_EQ(detail::ws_empty_parity(i),
              static_cast<std::uint32_t>(((i / detail::kWsStages) & 1) ^ 1))
        << i;
    ASSERT_EQ(detail::ws_item_slot(i), i % detail::kWsItemSlots) << i;
    ASSERT_EQ(detail::ws_item_full_parity(i),
              static_cast<std::uint32_t>((i / detail::kWsItemSlots) & 1))
        << i;
    ASSERT_EQ(detail::ws_item_empty_parity(i),
              static_cast<std::uint32_t>(((i / detail::kWsItemSlots) & 1) ^ 1))
        << i;
  };
  for (int i = 0; i < 100000; ++i) check(i);
  for (int i = std::numeric_limits<int>::max() - 1000;; ++i) {
    check(i);
    if (i == std::numeric_limits<int>::max()) break;
  }
}

TEST(WgmmaWsRing, EveryInterleavingReadsEachTileFromItsStageAndEnds) {
  for (const bool ping_pong : {true, false}) {
    for (int tiles = 0; tiles <= 13; ++tiles) {
      for (std::uint64_t seed = 1; seed <= 300; ++seed) {
        const std::string e = run_protocol({tiles}, seed * 7919 + static_cast<std::uint64_t>(tiles),
                                           ping_pong, 1, false);
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
        const std::string e = run_protocol(
            {tiles}, seed * 104729 + static_cast<std::uint64_t>(tiles), ping_pong, kWarps, false);
        ASSERT_EQ(e, "") << tiles << " tiles, seed " << seed << ", ping-pong " << ping_pong;
      }
    }
  }
}

// The persistent kernel (ExtendKernel::kWgmmaWarpSpecializedPersistent): items handed over
// through the item slots, the ring and the turns carried from item to item; with the warpgroups
// as actors and with every consumer warp one.
TEST(WgmmaWsRing, PersistentItemsCarryTheRingAndTheTurns) {
  constexpr int kWarps = detail::kWsWarpgroupThreads / 32;
  for (const bool ping_pong : {true, false}) {
    for (const int warps : {1, kWarps}) {
      for (std::uint64_t seed = 1; seed <= 400; ++seed) {
        const std::vector<int> items = random_items(seed);
        const std::string e = run_protocol(items, seed * 31337 + 5, ping_pong, warps, true);
        ASSERT_EQ(e, "") << items.size() << " items, seed " << seed << ", ping-pong " << ping_pong
                         << ", warps " << warps;
      }
    }
  }
  // No item at all: the consumers read "none left" at once.
  EXPECT_EQ(run_protocol({}, 1, true, 1, true), "");
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
