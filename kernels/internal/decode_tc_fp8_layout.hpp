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
//   - the per-CTA shared-memory budget (ring, 16-bit slice, scales, offset tables, key masks);
//   - the direct path's staging swizzle and fragment maps (DecodeKernel::kTensorCoreFp8Direct:
//     codes read with ldmatrix and converted into MMA fragments in registers, no 16-bit slice).
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

// ---- the direct path (DecodeKernel::kTensorCoreFp8Direct): FP8 codes straight into fragments ----
// No 16-bit slice: the staged code rows are read with ldmatrix as 16-bit units (two codes each),
// and each lane converts what it receives into MMA fragments in registers.
//   - Staging: 16-byte chunk c of code row r (a key) sits at chunk index
//     r x fp8_chunks + (c ^ fp8_direct_swizzle(r, fp8_chunks)); the 8 rows one ldmatrix phase
//     reads (same c, 8 consecutive keys) then land in 8 distinct 16-byte bank groups at every
//     head_dim (fp8_chunks 4, 8 or 16; a row of 4 chunks shares its 128 bytes with the next row).
//   - ldmatrix.x4 of chunk pair (c, c + 1): lane l points at key fp8_direct_ldsm_key(l), chunk
//     c + fp8_direct_ldsm_chunk(l); register j holds matrix j = (keys 8 (j & 1).., chunk c + j /
//     2).
//   - K (no .trans): lane l receives codes 4 (l % 4) .. 4 (l % 4) + 3 of chunk c for key l / 4:
//     converted, they are the QK B fragment of the MMA over head_dim slice 16 c if the MMA's k
//     index runs over head_dim permuted by fp8_direct_qk_dim (k = 2 t + e -> 4 t + e, k = 2 t + 8 +
//     e -> 4 t + 2 + e); Q's A fragment takes the same permutation, so the dot product is the same.
//   - V (.trans): lane l receives, for keys 2 (l % 4) and 2 (l % 4) + 1 of the matrix, the codes of
//     dims 2 (l / 4) and 2 (l / 4) + 1 of chunk c (bytes: key 2t dim 2g, key 2t dim 2g + 1, key
//     2t + 1 dim 2g, key 2t + 1 dim 2g + 1); one byte permute (fp8_direct_split_pairs) gives the
//     two keys' codes of dim 2g (low half) and of dim 2g + 1 (high half): the PV B fragments of an
//     MMA over the chunk's even dims and one over its odd dims. Accumulator n-tile 2 c + parity
//     then holds dims fp8_direct_pv_dim(c, parity, lane, e): four contiguous dims per lane and row.
PAGEDKV_HOST_DEVICE constexpr int fp8_direct_swizzle(int row, int fp8_chunks_per_row) {
  return fp8_chunks_per_row >= 8 ? (row & 7) : ((row >> 1) & 3);
}
PAGEDKV_HOST_DEVICE constexpr int fp8_direct_chunk(int row, int chunk, int fp8_chunks_per_row) {
  return row * fp8_chunks_per_row + (chunk ^ fp8_direct_swizzle(row, fp8_chunks_per_row));
}
PAGEDKV_HOST_DEVICE constexpr int fp8_direct_ldsm_key(int lane) {
  return ((lane >> 3) & 1) * 8 + (lane & 7);
}
PAGEDKV_HOST_DEVICE constexpr int fp8_direct_ldsm_chunk(int lane) {
  return lane >> 4;
}
// The head_dim index (within the MMA's 16-dim slice) of the MMA's k index k (0..15).
PAGEDKV_HOST_DEVICE constexpr int fp8_direct_qk_dim(int k) {
  return 4 * ((k & 7) >> 1) + (k & 1) + 2 * (k >> 3);
}
// The head_dim index of accumulator element e (0..3) of lane `lane` in the PV MMA of chunk c's
// `parity` dims (n-tile 2 c + parity); its row is mma_c_coord(lane, e).row.
PAGEDKV_HOST_DEVICE constexpr int fp8_direct_pv_dim(int chunk, int parity, int lane, int e) {
  return 16 * chunk + 4 * (lane & 3) + 2 * (e & 1) + parity;
}
// The epilogue writes those four contiguous dims of a row as one 16-byte store: component k
// (0..3) of the lane's store for chunk c and row half h (rows lane / 4 + 8 h) is accumulator
// element fp8_direct_epilogue_elem(h, k) of n-tile 2 c + fp8_direct_epilogue_parity(k), at dim
// fp8_direct_pv_dim(c, 0, lane, 0) + k.
PAGEDKV_HOST_DEVICE constexpr int fp8_direct_epilogue_parity(int k) {
  return k & 1;
}
PAGEDKV_HOST_DEVICE constexpr int fp8_direct_epilogue_elem(int h, int k) {
  return 2 * h + (k >> 1);
}
// A .trans register (bytes b0 b1 b2 b3, low first) -> b0 b2 b1 b3: the low 16 bits are the even
// dim's pair of codes (key 2t, key 2t + 1), the high 16 bits the odd dim's.
PAGEDKV_HOST_DEVICE std::uint32_t fp8_direct_split_pairs(std::uint32_t x) {
#ifdef __CUDA_ARCH__
  return __byte_perm(x, 0u, 0x3120u);  // one prmt
#else
  return (x & 0xff0000ffu) | ((x >> 8) & 0x0000ff00u) | ((x << 8) & 0x00ff0000u);
#endif
}

template <int kHeadDim>
struct TcFp8DirectShape {
  static constexpr int kFp8Chunks = kHeadDim / 16;  // 16-byte chunks of an FP8 row
  // No 16-bit slice frees 16 KiB (head_dim 128): 4 stages at 64 / 128 (3 CTAs per SM at 128),
  // 3 at 256 (2 CTAs per SM, as the slice path's 2 stages).
  static constexpr int kStages = kHeadDim >= 256 ? 3 : 4;
  static constexpr int kSliceBytes = kTcWarpTokens * kHeadDim;
  static constexpr int kCopiesPerLane = kSliceBytes / 16 / 32;
  static constexpr std::size_t kRingBytes =
      static_cast<std::size_t>(kTcWarps) * kStages * 2 * kSliceBytes;
  static constexpr std::size_t kScaleBytes = sizeof(float) * kTcWarps * kStages * 2 * kTcWarpTokens;
  static constexpr std::size_t kOffsetBytes =
      sizeof(std::int64_t) * kTcWarps * kStages * kTcWarpTokens;
  static constexpr std::size_t kMaskBytes =
      (sizeof(std::uint32_t) * kTcWarps * kStages + 15) / 16 * 16;
  static constexpr std::size_t kScaleOffset = kRingBytes;
  static constexpr std::size_t kCodeTableOffset = kScaleOffset + kScaleBytes;
  static constexpr std::size_t kScaleTableOffset = kCodeTableOffset + kOffsetBytes;
  static constexpr std::size_t kMaskOffset = kScaleTableOffset + kOffsetBytes;
  static constexpr std::size_t kPipelineBytes = kMaskOffset + kMaskBytes;
  // End-of-kernel merge scratch (from offset 0, after every copy has landed and every warp is
  // done): per warp O (16 x (head_dim + 16) floats), m and l (2 x 16 floats). Rows 16 floats
  // apart mod 32 banks: the epilogue's 16-byte stores (two rows x four lanes per phase) are then
  // free of bank conflicts.
  static constexpr int kScratchStride = kHeadDim + 16;
  static constexpr std::size_t kScratchBytes =
      sizeof(float) * kTcWarps * (kTcRows * kScratchStride + 2 * kTcRows);
  static constexpr std::size_t kSmemBytes =
      kPipelineBytes > kScratchBytes ? kPipelineBytes : kScratchBytes;
  // The launch bound: what shared memory allows, at most 4 (head_dim 64: 5 by shared memory would
  // cap registers at 96 and spill).
  static constexpr int kMinCtasPerSm = static_cast<int>(233472 / (kSmemBytes + 1024)) < 4
                                           ? static_cast<int>(233472 / (kSmemBytes + 1024))
                                           : 4;
  static_assert(kFp8Chunks % 2 == 0, "ldmatrix.x4 reads chunk pairs");
  static_assert(kCopiesPerLane >= 1 && kSliceBytes % (16 * 32) == 0, "whole copies per lane");
  static_assert(kScaleOffset % 16 == 0 && kCodeTableOffset % 16 == 0 && kMaskOffset % 16 == 0,
                "16-byte aligned regions");
  static_assert(kMinCtasPerSm >= 1, "fits one SM");
};

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
