// kernels/internal/decode_tc_fp8_layout.hpp: the shared-memory layout, copy / conversion maps and
// page addressing of the FP8 tensor-core paged decode kernel (kernels/decode_attention_tc_fp8.cu,
// DecodeKernel::kTensorCoreFp8), as plain host/device functions so the host tests
// (tests/device/decode_tc_fp8_layout_test.cpp) check what the kernel computes with:
//   - which layouts the kernel takes: every KVLayout stride a multiple of 16 bytes (16-byte
//     cp.async of FP8 rows); other layouts fall back to kernels/fp8_attention.cu;
//   - the byte offsets of a token's code row and of its float32 scale in a plane (or -1 when the
//     token is past the range or its block id is outside the pool);
//   - the staging map: copy i of a lane moves 16 FP8 codes (row r, 16-byte chunk c8) into a plain
//     row-major [16][head_dim] byte slice; the same lane later converts exactly those codes into
//     the 16-bit chunks 2 c8 and 2 c8 + 1 of row r of the swizzled slice the ldmatrix code of the
//     16-bit kernel reads (decode_tc_layout.hpp's swizzled_chunk);
//   - the per-CTA shared-memory budget (ring, 16-bit slice, scales, offset tables, key masks).
// Everything else (fragment maps, split ranges, ring schedule) is decode_tc_layout.hpp's.
//
// Pure O(1) functions, no errors (callers pass consistent values). Internal to pagedkv::cuda.
#pragma once

#include <cstddef>
#include <cstdint>

#include "decode_tc_layout.hpp"
#include "internal/host_device.hpp"

namespace pagedkv::detail {

// The FP8 kernel reads code rows with 16-byte copies: the plane is 16-byte aligned
// (validate_cuda_decode) and every stride must keep each row so (KVLayout only guarantees 8).
// Scales need 4-byte alignment, which scale_offset's multiple of 8 gives.
PAGEDKV_HOST_DEVICE constexpr bool tc_fp8_strides_ok(std::int64_t stride_block,
                                                     std::int64_t stride_token,
                                                     std::int64_t stride_head) {
  return stride_block % 16 == 0 && stride_token % 16 == 0 && stride_head % 16 == 0;
}

template <int kHeadDim>
struct TcFp8DecodeShape {
  static constexpr int kChunks = kHeadDim / 8;      // 16-byte chunks of a 16-bit row
  static constexpr int kFp8Chunks = kHeadDim / 16;  // 16-byte chunks of an FP8 row
  static constexpr int kStages = kHeadDim >= 256 ? 2 : 4;
  static constexpr int kSliceBytes = kTcWarpTokens * kHeadDim;  // one warp's FP8 K (or V) slice
  static constexpr int kCopiesPerLane = kSliceBytes / 16 / 32;
  // Per CTA: [warp][stage][K codes, V codes]; [warp] 16-bit slice (K, then V, of the tile being
  // computed; swizzled); [warp][stage][K scales x 16, V scales x 16] floats; [warp][stage][16]
  // code offsets, then scale offsets (int64); [warp][stage] key masks (uint32).
  static constexpr std::size_t kRingBytes =
      static_cast<std::size_t>(kTcWarps) * kStages * 2 * kSliceBytes;
  static constexpr std::size_t kHalfBytes = static_cast<std::size_t>(kTcWarps) * kSliceBytes * 2;
  static constexpr std::size_t kScaleBytes = sizeof(float) * kTcWarps * kStages * 2 * kTcWarpTokens;
  static constexpr std::size_t kOffsetBytes =
      sizeof(std::int64_t) * kTcWarps * kStages * kTcWarpTokens;  // one table
  static constexpr std::size_t kMaskBytes =
      (sizeof(std::uint32_t) * kTcWarps * kStages + 15) / 16 * 16;
  static constexpr std::size_t kHalfOffset = kRingBytes;
  static constexpr std::size_t kScaleOffset = kHalfOffset + kHalfBytes;
  static constexpr std::size_t kCodeTableOffset = kScaleOffset + kScaleBytes;
  static constexpr std::size_t kScaleTableOffset = kCodeTableOffset + kOffsetBytes;
  static constexpr std::size_t kMaskOffset = kScaleTableOffset + kOffsetBytes;
  static constexpr std::size_t kSmemBytes = kMaskOffset + kMaskBytes;
  // End-of-kernel merge scratch, the 16-bit kernel's (reuses the ring and the 16-bit slices).
  static constexpr int kScratchStride = kHeadDim + 4;
  static constexpr std::size_t kScratchBytes =
      sizeof(float) * kTcWarps * (kTcRows * kScratchStride + 2 * kTcRows);
  static constexpr int kMinCtasPerSm = static_cast<int>(233472 / (kSmemBytes + 1024));
  static_assert(kChunks % 8 == 0, "swizzle needs a multiple of 8 chunks per row");
  static_assert(kCopiesPerLane >= 1 && kSliceBytes % (16 * 32) == 0, "whole copies per lane");
  static_assert(kScratchBytes <= kRingBytes + kHalfBytes, "merge scratch fits");
  static_assert(kHalfOffset % 16 == 0 && kScaleOffset % 16 == 0 && kCodeTableOffset % 16 == 0 &&
                    kMaskOffset % 16 == 0,
                "16-byte aligned regions");
  static_assert(kMinCtasPerSm >= 1, "fits one SM");
};

// Copy i of lane l: FP8 chunk idx = l + 32 i of the slice, row idx / fp8_chunks, chunk idx %
// fp8_chunks; its 16 codes land at byte 16 idx of the row-major staging slice.
PAGEDKV_HOST_DEVICE constexpr MmaCoord fp8_slice_copy(int lane, int i, int fp8_chunks_per_row) {
  const int idx = lane + 32 * i;
  return {idx / fp8_chunks_per_row, idx % fp8_chunks_per_row};
}

// The 16-bit chunk (of the swizzled [16][head_dim / 8] slice) that half h (0: codes 0..7, 1: codes
// 8..15) of FP8 chunk (row, c8) converts into.
PAGEDKV_HOST_DEVICE constexpr int fp8_half_chunk(int row, int c8, int h, int chunks_per_row) {
  return swizzled_chunk(row, 2 * c8 + h, chunks_per_row);
}

// Byte offsets of token t's code row and float32 scale (scale: -1 without scale_offset), both -1
// when t >= end or its block id is outside [0, num_blocks). geometry: decode_tc_layout.hpp's, in
// bytes (head_offset = kv_head x stride_head); scale_offset and num_kv_heads from the layout.
struct TcFp8TokenOffsets {
  std::int64_t code;
  std::int64_t scale;
};
PAGEDKV_HOST_DEVICE TcFp8TokenOffsets tc_fp8_token_offsets(const TcPageGeometry& g,
                                                           std::int64_t scale_offset,
                                                           int num_kv_heads, int kv_head,
                                                           const std::int32_t* table_row, int t,
                                                           int end) {
  if (t >= end) return {-1, -1};
  int block_index;
  int in_block;
  if (g.block_shift >= 0) {
    block_index = t >> g.block_shift;
    in_block = t & (g.block_size - 1);
  } else {
    block_index = t / g.block_size;
    in_block = t - block_index * g.block_size;
  }
#ifdef __CUDA_ARCH__
  const std::int64_t block = __ldg(table_row + block_index);
#else
  const std::int64_t block = table_row[block_index];
#endif
  if (block < 0 || block >= g.num_blocks) return {-1, -1};
  const std::int64_t base = block * g.stride_block;
  return {base + in_block * g.stride_token + g.head_offset,
          scale_offset > 0 ? base + scale_offset +
                                 (static_cast<std::int64_t>(in_block) * num_kv_heads + kv_head) * 4
                           : -1};
}

}  // namespace pagedkv::detail
