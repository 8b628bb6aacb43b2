// kernels/internal/extend_fa2_fp8_layout.hpp: the shared-memory layout and the copy / conversion
// map of the FP8 tensor-core paged extend kernel (kernels/extend_attention_fa2_fp8.cu,
// ExtendKernel::kFa2Fp8), as plain host/device functions, so the host test
// (tests/device/extend_fa2_fp8_layout_test.cpp) checks what the kernel computes with:
//   - the tile: kFa2's 4-warp tile at the same head_dim (Fa2Shape<kHeadDim, 4>: rows, keys per
//     tile, 3-stage ring, swizzle, fragment maps, ring schedule and split over keys unchanged);
//   - the staging map: copy i of thread tid moves 16 FP8 codes (key row r, 16-byte chunk c8) to
//     byte 16 (tid + i x threads) of a plain row-major [keys][head_dim] byte tile; the same thread
//     later converts exactly those codes into the 16-bit chunks 2 c8 and 2 c8 + 1 of row r of the
//     swizzled 16-bit tile kFa2's ldmatrix code reads (fa2_swizzled);
//   - the key mask of a tile (bit j: key j has a page, i.e. is in range and its block id is in
//     the pool);
//   - the per-CTA shared-memory budget (Q tile, 16-bit K and V tiles, code ring, scale ring, two
//     offset tables, masks).
// Which layouts the kernel takes is decode_tc_fp8_layout.hpp's tc_fp8_strides_ok (16-byte rows);
// token offsets are its tc_fp8_token_offsets.
//
// Pure O(1) functions, no errors (callers pass consistent values); usable from any thread.
// Internal to pagedkv::cuda, not a stable API.
#pragma once

#include <cstddef>
#include <cstdint>

#include "internal/decode_tc_layout.hpp"
#include "internal/extend_fa2_layout.hpp"
#include "internal/host_device.hpp"

namespace pagedkv::detail {

// The FP8 variant always runs kFa2's 4-warp CTA (no 2-warp tiles for short prompts).
inline constexpr int kFa2Fp8Warps = 4;

template <int kHeadDim>
struct Fa2Fp8Shape {
  using Tile = Fa2Shape<kHeadDim, kFa2Fp8Warps>;
  static constexpr int kThreads = Tile::kThreads;
  static constexpr int kRows = Tile::kRows;
  static constexpr int kKeys = Tile::kKeys;
  static constexpr int kStages = Tile::kStages;
  static constexpr int kChunks = Tile::kChunks;            // 16-byte chunks of a 16-bit row
  static constexpr int kFp8Chunks = kHeadDim / 16;         // 16-byte chunks of an FP8 row
  static constexpr int kCodeTileBytes = kKeys * kHeadDim;  // one K (or V) tile of codes
  static constexpr int kCodeCopies = kKeys * kFp8Chunks / kThreads;  // per thread and plane
  // Shared memory, in this order: Q tile (16-bit, swizzled); the 16-bit K tile and V tile being
  // computed (swizzled); the code ring [stage][K codes, V codes]; the scale ring [stage][K scales
  // x kKeys, V scales x kKeys] (float32, per-(token, head) scales); the code-offset table and the
  // scale-offset table ([stage][kKeys] int64 byte offsets, -1: no page); the key masks [stage].
  static constexpr std::size_t kQBytes = Tile::kQBytes;
  static constexpr std::size_t kHalfOffset = kQBytes;
  static constexpr std::size_t kHalfBytes = static_cast<std::size_t>(2 * Tile::kKVChunks) * 16u;
  static constexpr std::size_t kRingOffset = kHalfOffset + kHalfBytes;
  static constexpr std::size_t kRingBytes = static_cast<std::size_t>(kStages) * 2 * kCodeTileBytes;
  static constexpr std::size_t kScaleOffset = kRingOffset + kRingBytes;
  static constexpr std::size_t kScaleBytes = sizeof(float) * kStages * 2 * kKeys;
  static constexpr std::size_t kCodeTableOffset = kScaleOffset + kScaleBytes;
  static constexpr std::size_t kTableBytes = sizeof(std::int64_t) * kStages * kKeys;
  static constexpr std::size_t kScaleTableOffset = kCodeTableOffset + kTableBytes;
  static constexpr std::size_t kMaskOffset = kScaleTableOffset + kTableBytes;
  static constexpr std::size_t kMaskBytes = (sizeof(std::uint32_t) * kStages + 15) / 16 * 16;
  static constexpr std::size_t kSmemBytes = kMaskOffset + kMaskBytes;
  static constexpr int kSmemCtasPerSm = static_cast<int>(233472 / (kSmemBytes + 1024));
  static constexpr int kMinCtasPerSm = Tile::kMinCtasPerSm;
  static_assert(kKeys <= 32, "one warp's ballot builds a tile's key mask");
  static_assert(kCodeCopies >= 1 && kKeys * kFp8Chunks == kCodeCopies * kThreads,
                "a code tile is whole copies of every thread");
  static_assert(kHalfOffset % 16 == 0 && kRingOffset % 16 == 0 && kScaleOffset % 16 == 0 &&
                    kCodeTableOffset % 16 == 0 && kScaleTableOffset % 16 == 0 &&
                    kMaskOffset % 16 == 0,
                "16-byte aligned regions");
  static_assert(kSmemCtasPerSm >= 1, "fits one SM");
};

// Copy i of thread tid: FP8 chunk idx = tid + i x threads of the code tile (staged at byte
// 16 idx), key row idx / fp8_chunks_per_row, chunk idx % fp8_chunks_per_row.
PAGEDKV_HOST_DEVICE constexpr MmaCoord fa2_fp8_copy(int tid, int i, int threads,
                                                    int fp8_chunks_per_row) {
  const int idx = tid + i * threads;
  return {idx / fp8_chunks_per_row, idx % fp8_chunks_per_row};
}

// The 16-bit chunk (of the swizzled [keys][head_dim / 8] tile) that half h (0: codes 0..7,
// 1: codes 8..15) of FP8 chunk (row, c8) converts into.
PAGEDKV_HOST_DEVICE constexpr int fa2_fp8_half_chunk(int row, int c8, int h, int chunks_per_row) {
  return fa2_swizzled(row, 2 * c8 + h, chunks_per_row);
}

// Whether key `key` (0 .. keys - 1) of a tile with mask `mask` has a page.
PAGEDKV_HOST_DEVICE constexpr bool fa2_fp8_key_present(std::uint32_t mask, int key) {
  return ((mask >> key) & 1u) != 0;
}

// The mask of a tile whose keys all have pages.
PAGEDKV_HOST_DEVICE constexpr std::uint32_t fa2_fp8_full_mask(int keys) {
  return keys >= 32 ? 0xffffffffu : (1u << keys) - 1u;
}

}  // namespace pagedkv::detail
