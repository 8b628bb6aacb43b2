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

PAGEDKV_HOST_DEVICE constexpr int ws_stage(int tile) {
  return tile % kWsStages;
}
PAGEDKV_HOST_DEVICE constexpr std::uint32_t ws_full_parity(int tile) {
  return static_cast<std::uint32_t>((tile / kWsStages) & 1);
}
PAGEDKV_HOST_DEVICE constexpr std::uint32_t ws_empty_parity(int tile) {
  return static_cast<std::uint32_t>(((tile / kWsStages) & 1) ^ 1);
}
PAGEDKV_HOST_DEVICE constexpr int ws_release_iteration(int tile) {
  return tile + 1;
}
PAGEDKV_HOST_DEVICE constexpr int ws_offset_slot(int tile) {
  return tile & 1;
}

}  // namespace pagedkv::detail
