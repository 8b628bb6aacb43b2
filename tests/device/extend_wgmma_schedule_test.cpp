// The K/V ring and GEMM schedule of the warpgroup-MMA extend kernels
// (kernels/internal/extend_wgmma_schedule.hpp, kernels/extend_attention_wgmma.cu), checked on the
// host without a GPU: the kernel's loop (prologue, begin_tile, the plain loop, the pipelined
// kernel's peeled first tile, its loop and its last PV GEMM) replayed as events on a model of the
// CTA, with the kernel's own stage count, distances, slots and PV tile, for 0 .. 20 key tiles:
//   - cp.async groups complete as late as cp.async.wait_group allows; wgmma groups complete in
//     commit order as late as wgmma.wait_group allows (PTX ISA: "wait until only N or fewer of the
//     most recent wgmma-groups are pending and all the prior wgmma-groups committed by the
//     executing threads are complete"); everything a thread completes is visible to the other
//     threads (both warpgroups) only after the next CTA barrier;
//   - a GEMM reads a stage only when it holds the tile the GEMM wants, copied and made visible;
//   - a stage is written (issue) only when no GEMM of either warpgroup still reads it, an offset
//     slot (resolve, also for tiles past the end: -1) only when no thread still reads it, and an
//     issue reads offsets resolved behind a barrier;
//   - the softmax of a tile reads finished scores; O is rescaled and P packed only with no PV GEMM
//     in flight and O holding exactly the tiles before (the online softmax's order); a PV GEMM
//     reads a packed P; every tile gets its S and its PV GEMM once, in order; nothing is left in
//     flight at the end; in the pipelined kernel every softmax but the first overlaps a PV GEMM.
// Built again with PAGEDKV_TEST_BROKEN_WGMMA_SCHEDULE = 1 (the pipelined kernel with 3 stages)
// and 2 (its PV GEMM two tiles behind): those builds must fail (ctest WILL_FAIL).
#include <gtest/gtest.h>

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "internal/extend_fa2_layout.hpp"
#include "internal/extend_wgmma_schedule.hpp"

namespace pagedkv {
namespace {

constexpr int kNever = 1 << 30;

class CtaModel {
 public:
  CtaModel(int tiles, bool pipelined, int stages)
      : tiles_(tiles),
        pipelined_(pipelined),
        stages_(stages),
        slot_tile_(static_cast<std::size_t>(stages_), -1),
        slot_written_(static_cast<std::size_t>(stages_), -1),
        slot_read_(static_cast<std::size_t>(stages_), -1),
        stage_tile_(static_cast<std::size_t>(stages_), -1),
        stage_landed_(static_cast<std::size_t>(stages_), kNever),
        stage_readers_(static_cast<std::size_t>(stages_), 0),
        stage_read_done_(static_cast<std::size_t>(stages_), -1),
        s_issued_(static_cast<std::size_t>(tiles), 0),
        s_done_(static_cast<std::size_t>(tiles), 0),
        pv_issued_(static_cast<std::size_t>(tiles), 0),
        pv_done_(static_cast<std::size_t>(tiles), 0),
        packed_(static_cast<std::size_t>(tiles), 0) {}

  int stages() const { return stages_; }
  const std::vector<std::string>& hazards() const { return hazards_; }

  void barrier() { ++epoch_; }

  // Thread tid < keys writes tile t's offsets (-1 past the end) into its slot.
  void resolve(int t) {
    const std::size_t slot = at(detail::fa2_slot(t, stages_));
    expect(slot_read_[slot] < epoch_, "resolve of tile " + std::to_string(t) +
                                          " overwrites offsets an issue reads without a barrier");
    slot_tile_[slot] = t;
    slot_written_[slot] = epoch_;
  }

  // Every thread copies its chunks of tile t from the tile's offsets into its stage; one commit.
  void issue(int t) {
    if (t < tiles_) {
      const std::size_t stage = at(detail::fa2_slot(t, stages_));
      expect(slot_tile_[stage] == t, "issue of tile " + std::to_string(t) +
                                         " reads the offsets of " +
                                         std::to_string(slot_tile_[stage]));
      expect(slot_written_[stage] < epoch_,
             "issue of tile " + std::to_string(t) + " reads offsets resolved without a barrier");
      slot_read_[stage] = epoch_;
      expect(stage_readers_[stage] == 0 && stage_read_done_[stage] < epoch_,
             "issue of tile " + std::to_string(t) + " overwrites stage " + std::to_string(stage) +
                 " (tile " + std::to_string(stage_tile_[stage]) + ") while a GEMM may read it");
      stage_tile_[stage] = t;
      stage_landed_[stage] = kNever;
    }
    cp_groups_.push_back(t < tiles_ ? t : -1);
  }

  void cp_wait(int pending) {
    while (static_cast<int>(cp_groups_.size()) > pending) {
      const int t = cp_groups_.front();
      cp_groups_.pop_front();
      if (t >= 0) stage_landed_[at(detail::fa2_slot(t, stages_))] = epoch_;
    }
  }

  void gemm(bool pv, int t) {
    const std::string what = std::string(pv ? "PV" : "S") + " GEMM of tile " + std::to_string(t);
    if (t < 0 || t >= tiles_) {
      expect(false, what + ": no such tile");
      return;
    }
    const std::size_t stage = at(detail::fa2_slot(t, stages_));
    expect(stage_tile_[stage] == t, what + " reads stage " + std::to_string(stage) +
                                        " holding tile " + std::to_string(stage_tile_[stage]));
    expect(stage_landed_[stage] < epoch_, what + " reads copies not landed behind a barrier");
    auto& issued = pv ? pv_issued_ : s_issued_;
    expect(issued[at(t)] == 0, what + " issued twice");
    expect(t == 0 || issued[at(t - 1)] == 1, what + " before the previous tile's");
    issued[at(t)] = 1;
    if (pv) expect(packed_[at(t)] == 1, what + " reads P before it is packed");
    ++stage_readers_[stage];
    uncommitted_.push_back({pv, t});
  }

  void commit() {
    wg_groups_.push_back(uncommitted_);
    uncommitted_.clear();
  }

  void wait(int pending) {
    while (static_cast<int>(wg_groups_.size()) > pending) {
      for (const Mma& m : wg_groups_.front()) {
        const std::size_t stage = at(detail::fa2_slot(m.tile, stages_));
        --stage_readers_[stage];
        stage_read_done_[stage] = epoch_;
        (m.pv ? pv_done_ : s_done_)[at(m.tile)] = 1;
      }
      wg_groups_.pop_front();
    }
  }

  // Scale, mask, row maxima, exp2 of tile t's scores (and l), in registers.
  void softmax(int t) {
    expect(s_done_[at(t)] == 1, "softmax of tile " + std::to_string(t) + " reads scores in flight");
    if (pipelined_ && t > 0) {
      expect(pv_in_flight(), "softmax of tile " + std::to_string(t) + " overlaps no PV GEMM");
    }
  }

  // O *= alpha_t (O must hold exactly P_u V_u for u < t, none in flight) and P_t packed.
  void rescale_and_pack(int t) {
    expect(!pv_in_flight(), "O rescaled or P packed while a PV GEMM is in flight");
    for (int u = 0; u < tiles_; ++u) {
      expect((pv_done_[at(u)] == 1) == (u < t), "O rescaled by tile " + std::to_string(t) +
                                                    "'s alpha " + (u < t ? "without" : "with") +
                                                    " tile " + std::to_string(u) + "'s P V");
    }
    packed_[at(t)] = 1;
  }

  void finish() {
    expect(cp_groups_.empty(), "copies in flight at the exit");
    expect(wg_groups_.empty() && uncommitted_.empty(), "wgmma in flight at the exit");
    for (int t = 0; t < tiles_; ++t) {
      expect(s_done_[at(t)] == 1 && pv_done_[at(t)] == 1,
             "tile " + std::to_string(t) + " missing from S or O");
    }
  }

 private:
  struct Mma {
    bool pv;
    int tile;
  };
  static std::size_t at(int i) { return static_cast<std::size_t>(i); }
  bool pv_in_flight() const {
    for (const auto& g : wg_groups_) {
      for (const Mma& m : g) {
        if (m.pv) return true;
      }
    }
    for (const Mma& m : uncommitted_) {
      if (m.pv) return true;
    }
    return false;
  }
  void expect(bool ok, const std::string& what) {
    if (!ok) hazards_.push_back("[barrier " + std::to_string(epoch_) + "] " + what);
  }

  int tiles_;
  bool pipelined_;
  int stages_;
  int epoch_ = 0;                  // CTA barriers so far
  std::vector<int> slot_tile_;     // offsets slot: tile whose offsets it holds
  std::vector<int> slot_written_;  // epoch of its last write
  std::vector<int> slot_read_;     // epoch of its last read (issue)
  std::vector<int> stage_tile_;    // K/V stage: tile last issued into it
  std::vector<int> stage_landed_;  // epoch its copies completed (kNever: in flight)
  std::vector<int> stage_readers_;
  std::vector<int> stage_read_done_;  // epoch its last GEMM read completed
  std::vector<int> s_issued_, s_done_, pv_issued_, pv_done_, packed_;
  std::deque<int> cp_groups_;  // pending cp.async groups, oldest first (tile or -1)
  std::vector<Mma> uncommitted_;
  std::deque<std::vector<Mma>> wg_groups_;  // pending wgmma groups, oldest first
  std::vector<std::string> hazards_;
};

// kernels/extend_attention_wgmma.cu's wgmma_extend_kernel, its ring and GEMM events in order (keep
// in step with the kernel's loop: a change of its order is made here too)
// (pv_tile: which tile's PV GEMM an iteration issues, the kernel's unless a test says otherwise).
using PvTile = int (*)(int iteration, bool pipelined);
void run_kernel(CtaModel& m, int tiles, bool pipelined, PvTile pv_tile = detail::wgmma_pv_tile) {
  constexpr int kD = detail::kWgmmaRingDistances;
  for (int t = 0; t < kD; ++t) m.resolve(t);  // prologue
  m.barrier();
  for (int t = 0; t < kD - 1; ++t) m.issue(t);
  const auto begin_tile = [&](int t) {
    m.cp_wait(detail::fa2_wait_groups(kD));
    m.barrier();
    m.issue(detail::fa2_issue_tile(t, kD));
    m.resolve(detail::fa2_resolve_tile(t, kD));
  };
  if (!pipelined) {
    for (int t = 0; t < tiles; ++t) {
      begin_tile(t);
      m.gemm(false, t);
      m.commit();
      m.wait(0);
      m.softmax(t);
      m.rescale_and_pack(t);
      m.gemm(true, pv_tile(t, false));
      m.commit();
      m.wait(0);
    }
  } else if (tiles > 0) {
    begin_tile(0);  // the peeled first tile
    m.gemm(false, 0);
    m.commit();
    m.wait(0);
    m.softmax(0);
    m.rescale_and_pack(0);
    for (int t = 1; t < tiles; ++t) {
      begin_tile(t);
      m.gemm(false, t);
      m.commit();
      m.gemm(true, pv_tile(t, true));
      m.commit();
      m.wait(1);
      m.softmax(t);
      m.wait(0);
      m.rescale_and_pack(t);
    }
    m.gemm(true, pv_tile(tiles, true));  // the last tile's, after the loop
    m.commit();
    m.wait(0);
  }
  m.cp_wait(0);
  m.finish();
}

std::vector<std::string> hazards_of(int tiles, bool pipelined, int stages,
                                    PvTile pv_tile = detail::wgmma_pv_tile) {
  CtaModel m(tiles, pipelined, stages);
  run_kernel(m, tiles, pipelined, pv_tile);
  return m.hazards();
}

TEST(ExtendWgmmaSchedule, RingAndGemmsHaveNoHazardForAnyTileCount) {
  for (const bool pipelined : {false, true}) {
    const int stages = detail::wgmma_extend_stages(pipelined);
    for (int tiles = 0; tiles <= 20; ++tiles) {
      const std::vector<std::string> hazards = hazards_of(tiles, pipelined, stages);
      std::string all;
      for (const std::string& h : hazards) all += "\n  " + h;
      EXPECT_TRUE(hazards.empty()) << (pipelined ? "kWgmmaPipelined" : "kWgmma") << ", " << tiles
                                   << " key tiles, " << stages << " stages:" << all;
    }
  }
}

// The model finds what it is for, whatever the header says. The pipelined schedule on 3 stages:
// iteration t issues tile t + 2 into stage (t + 2) mod 3 = (t - 1) mod 3 and then its PV GEMM reads
// tile t - 1's V there, first at t = 1 with 4 tiles or more (with 3 or fewer, tile t + 2 >= tiles
// is never copied). The plain one on 2 stages: the prologue resolves tile 2's offsets over tile
// 0's before tile 0 is issued. A PV GEMM two tiles behind: O rescaled without the previous tile.
TEST(ExtendWgmmaSchedule, ModelFindsBrokenSchedules) {
  const PvTile two_behind = [](int iteration, bool pipelined) {
    return pipelined ? iteration - 2 : iteration;
  };
  for (int tiles = 0; tiles <= 3; ++tiles) EXPECT_TRUE(hazards_of(tiles, true, 3).empty());
  for (int tiles = 4; tiles <= 8; ++tiles) {
    const std::vector<std::string> h = hazards_of(tiles, true, 3);
    ASSERT_FALSE(h.empty()) << tiles << " tiles";
    EXPECT_NE(h.front().find("PV GEMM of tile 0 reads stage 0 holding tile 3"), std::string::npos)
        << h.front();
  }
  for (int tiles = 1; tiles <= 8; ++tiles) {
    EXPECT_FALSE(hazards_of(tiles, false, 2).empty()) << tiles << " tiles";
    EXPECT_FALSE(hazards_of(tiles, true, 4, two_behind).empty()) << tiles << " tiles";
  }
}

}  // namespace
}  // namespace pagedkv
