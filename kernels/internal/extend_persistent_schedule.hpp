// kernels/internal/extend_persistent_schedule.hpp: the work list of the persistent warp-specialized
// extend kernel (ExtendKernel::kWgmmaWarpSpecializedPersistent,
// kernels/extend_attention_wgmma_ws.cu), host and device, so host tests check the order and
// coverage the kernel runs (tests/device/extend_persistent_schedule_test.cpp).
//
// The non-persistent kernels launch one CTA per work item on a grid of x = KV head, y = sequence,
// z = query tile x split (fa2_work_item: each sequence's heaviest query tile first), and the
// hardware hands CTAs to SMs in linear order, x fastest. The persistent kernel launches at most
// one CTA per resident slot (SMs x CTAs per SM) and has each take items off a shared counter in
// that same linear order: item i is grid cell persistent_item_cell(shape, i). The heaviest tiles of
// every sequence come first, and a CTA that finishes early takes the next one (greedy list
// scheduling over a longest-first list, exactly so when the sequences are alike; with unlike
// sequences a short one's heaviest tile sits beside a long one's). A cell with nothing to do (past
// its sequence's query tiles, or a split past the active ones) is skipped by the CTA that draws it.
//
// Workspace: the launch zeroes the counter (kPersistentCounterBytes at the start of the caller's
// workspace) before the kernel; any split's partial rows follow it.
//
// Pure O(1) functions, no errors; usable from any thread. Internal to pagedkv::cuda, not a stable
// API.
#pragma once

#include <cstdint>

#include "internal/host_device.hpp"

namespace pagedkv::detail {

// Bytes at the start of the workspace that hold the counter (a 64-bit count, padded so that the
// split partials after it keep the workspace's 16-byte alignment).
inline constexpr std::int64_t kPersistentCounterBytes = 16;

// The grid the items come from: x = KV heads, y = sequences, z = query tiles x splits.
struct PersistentGridShape {
  std::int32_t kv_heads;
  std::int32_t seqs;
  std::int32_t z;
};

struct PersistentCell {
  std::int32_t x;  // KV head
  std::int32_t y;  // sequence
  std::int32_t z;  // query tile x split (fa2_work_item)
};

PAGEDKV_HOST_DEVICE constexpr std::int64_t persistent_items(const PersistentGridShape& g) {
  return static_cast<std::int64_t>(g.kv_heads) * g.seqs * g.z;
}

// Item i (0 <= i < persistent_items(g)) -> its grid cell, x fastest, z slowest: the order in which
// the hardware would have started the non-persistent grid's CTAs.
PAGEDKV_HOST_DEVICE constexpr PersistentCell persistent_item_cell(const PersistentGridShape& g,
                                                                  std::int64_t item) {
  const std::int64_t per_z = static_cast<std::int64_t>(g.kv_heads) * g.seqs;
  const std::int64_t rest = item % per_z;
  return {static_cast<std::int32_t>(rest % g.kv_heads),
          static_cast<std::int32_t>(rest / g.kv_heads), static_cast<std::int32_t>(item / per_z)};
}

// The persistent kernel's argument beside its Fa2Params.
struct PersistentSchedule {
  unsigned long long* counter;  // items drawn so far (zeroed before the launch)
  PersistentGridShape grid;
  std::int64_t items;  // persistent_items(grid)
};

// CTAs the launch starts: the plan's, but never more than there are items (at least 1).
PAGEDKV_HOST_DEVICE constexpr std::int64_t persistent_grid_ctas(std::int64_t items,
                                                                std::int64_t planned_ctas) {
  const std::int64_t c = planned_ctas < items ? planned_ctas : items;
  return c < 1 ? 1 : c;
}

}  // namespace pagedkv::detail
