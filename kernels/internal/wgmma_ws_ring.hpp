// kernels/internal/wgmma_ws_ring.hpp: the K/V ring schedule of the warp-specialized extend kernel
// (kernels/extend_attention_wgmma_ws.cu, ExtendKernel::kWgmmaWarpSpecialized), host and device,
// so host tests can check the protocol the kernel runs (tests/device/wgmma_ws_ring_test.cpp).
// Internal to pagedkv::cuda.
//
// Tile t of a CTA's keys lives in stage ws_stage(t); its round is t / kWsStages (how many times
// the ring has come back to that stage). full[s] (one arrival per producer thread, each triggered
// by the completion of its copies) completes one phase per round; a consumer waits for tile t with
// parity ws_full_parity(t). empty[s] (one arrival per consumer thread) completes one phase each
// time both consumer warpgroups have freed the stage; the producer waits before refilling it for
// tile t with parity ws_empty_parity(t), which a fresh barrier passes at once (round 0). A consumer
// frees tile t's stage at iteration ws_release_iteration(t) of its loop, once tile t's PV GEMM,
// issued in that iteration, has completed; the last tile's stage is never freed (nothing waits
// for it). The producer reads tile t's page offsets from slot ws_offset_slot(t) of a 2-slot table
// it writes one tile ahead.
//
// Ping-pong (ExtendKernel::kWgmmaWarpSpecializedPingPong): the consumers take turns issuing their
// GEMMs, so one warpgroup's softmax runs while the other's GEMMs occupy the tensor cores
// (FlashAttention-3's inter-warpgroup overlap). A consumer issues GEMMs at tiles + 1 points (turn
// 0: tile 0's S GEMM; turn k, 0 < k < tiles: tile k's S GEMM and tile k - 1's PV GEMM; turn tiles:
// the last PV GEMM). Consumer c's turn k waits on turn[c] for parity ws_turn_parity(k), and once
// its GEMMs are issued, arrives on turn[1 - c] (kWsTurnArrivals: its 128 threads). Before anything
// else, consumer 1 arrives once on turn[0] (ws_turn_primed), so consumer 0 goes first: the issues
// alternate 0, 1, 0, 1, ...; the last arrival completes a phase of turn[0] that nobody waits for.
//
// Persistent (ExtendKernel::kWgmmaWarpSpecializedPersistent): one CTA runs work item after work
// item (kernels/internal/extend_persistent_schedule.hpp) on one ring, so tile indices above are
// the CTA's running count of tiles over its items (an item's tile t is ring tile base + t, base
// the tiles of the items before it), every tile's stage is freed, the last of an item too (after
// the item's last PV GEMM completes: the producer refills it for a later item), and turn indices
// run on over the items (an item with tiles > 0 has ws_item_turns(tiles) of them; consumer 1 is
// primed once, before the first item). The items themselves go from the producer to the consumers
// through kWsItemSlots shared-memory slots: for its n-th item, the producer's elected thread waits
// on item_empty[ws_item_slot(n)] with parity ws_item_empty_parity(n) (a fresh barrier passes:
// round 0), writes the item and what it covers (or "none left"), and arrives on item_full[]
// (kWsItemFullArrivals); each consumer thread waits on item_full[] with parity
// ws_item_full_parity(n), reads the slot in place while it works on the item (nothing of it held
// in registers), and arrives on item_empty[] (kWsItemEmptyArrivals) once the item is done. A slot
// is rewritten only after both consumers are done with its item (so the producer runs at most one
// item ahead: it fills item n + 1's tiles while the consumers finish item n), and a consumer reads
// a slot only once its item was written.
#pragma once

#include <cstdint>

#include "internal/host_device.hpp"

namespace pagedkv::detail {

inline constexpr int kWsStages = 4;
inline constexpr int kWsWarpgroupThreads = 128;
// Expected arrivals per phase: full[s] one per producer thread (its copies' completion), empty[s]
// one per thread of the two consumer warpgroups.
inline constexpr int kWsFullArrivals = kWsWarpgroupThreads;
inline constexpr int kWsEmptyArrivals = 2 * kWsWarpgroupThreads;

inline constexpr int kWsTurnArrivals = kWsWarpgroupThreads;

PAGEDKV_HOST_DEVICE constexpr std::uint32_t ws_turn_parity(int turn) {
  return static_cast<std::uint32_t>(turn & 1);
}
// Whether consumer c arrives on turn[0] before its first turn (consumer 1 only).
PAGEDKV_HOST_DEVICE constexpr bool ws_turn_primed(int consumer) {
  return consumer == 1;
}

// Tile and item indices are never negative: the stage and round are taken unsigned, a mask and a
// shift (signed % and / cost the kernel a sign fix-up each, in the consumer loop on every tile).
PAGEDKV_HOST_DEVICE constexpr std::uint32_t ws_round(int index, int slots) {
  return static_cast<std::uint32_t>(index) / static_cast<std::uint32_t>(slots);
}
PAGEDKV_HOST_DEVICE constexpr int ws_stage(int tile) {
  return static_cast<int>(static_cast<std::uint32_t>(tile) % static_cast<std::uint32_t>(kWsStages));
}
PAGEDKV_HOST_DEVICE constexpr std::uint32_t ws_full_parity(int tile) {
  return ws_round(tile, kWsStages) & 1u;
}
PAGEDKV_HOST_DEVICE constexpr std::uint32_t ws_empty_parity(int tile) {
  return (ws_round(tile, kWsStages) & 1u) ^ 1u;
}
PAGEDKV_HOST_DEVICE constexpr int ws_release_iteration(int tile) {
  return tile + 1;
}
PAGEDKV_HOST_DEVICE constexpr int ws_offset_slot(int tile) {
  return tile & 1;
}

// ---- the persistent kernel's item slots ----
inline constexpr int kWsItemSlots = 2;
inline constexpr int kWsItemFullArrivals = 1;                         // the producer's writer
inline constexpr int kWsItemEmptyArrivals = 2 * kWsWarpgroupThreads;  // every consumer thread

PAGEDKV_HOST_DEVICE constexpr int ws_item_slot(int n) {
  return static_cast<int>(static_cast<std::uint32_t>(n) % static_cast<std::uint32_t>(kWsItemSlots));
}
PAGEDKV_HOST_DEVICE constexpr std::uint32_t ws_item_full_parity(int n) {
  return ws_round(n, kWsItemSlots) & 1u;
}
PAGEDKV_HOST_DEVICE constexpr std::uint32_t ws_item_empty_parity(int n) {
  return (ws_round(n, kWsItemSlots) & 1u) ^ 1u;
}
// GEMM-issue points (turns) of an item with `tiles` key tiles: tile 0's S GEMM, then tile t's S
// GEMM with tile t - 1's PV GEMM, then the last PV GEMM; none for an item without keys.
PAGEDKV_HOST_DEVICE constexpr int ws_item_turns(int tiles) {
  return tiles > 0 ? tiles + 1 : 0;
}

// The persistent loops keep their counters reduced, so that they stay small however many items a
// CTA runs (an int counting every tile would overflow past 2^31): a ring tile's stage and
// parities repeat every 2 x kWsStages tiles, a turn's parity every 2 turns, an item slot and its
// parities every 2 x kWsItemSlots items. The ring base after an item of `tiles` key tiles:
PAGEDKV_HOST_DEVICE constexpr int ws_next_ring_base(int base, int tiles) {
  return (base + tiles) % (2 * kWsStages);
}
// The turn base after an item of `tiles` key tiles:
PAGEDKV_HOST_DEVICE constexpr int ws_next_turn_base(int base, int tiles) {
  return (base + ws_item_turns(tiles)) % 2;
}
// The item number after item n:
PAGEDKV_HOST_DEVICE constexpr int ws_next_item(int n) {
  return (n + 1) % (2 * kWsItemSlots);
}

}  // namespace pagedkv::detail
