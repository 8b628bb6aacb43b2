// kernels/internal/decode_tc_layout.hpp: the layouts and the work decomposition of the tensor-core
// paged decode kernel (kernels/decode_attention_tc.cu), as plain host/device functions, so the host
// tests (tests/device/decode_tc_layout_test.cpp) check exactly what the kernel computes with:
//   - the mma.sync.m16n8k16 fragment maps (PTX ISA, "Matrix Fragments for mma.m16n8k16" with
//     .f16 / .bf16 inputs and .f32 accumulators): which (row, col) of A (16x16), B (16x8) and
//     C/D (16x8) element e of lane l holds; and the ldmatrix (.x4, with and without .trans) maps;
//   - the score-to-A reuse: the QK accumulators of two 8-key tiles are, element for element, the
//     A operand of the PV MMA over those 16 keys (pv_a_source);
//   - the shared-memory swizzle of K/V rows (16-byte chunk c of row r at chunk c ^ (r mod 8));
//   - the split-KV token ranges (the same formula as the default kernel and the merge);
//   - the page-offset prefetch table: the element offset of each token's K/V row, or -1 when the
//     token is past the range or its block id is outside the pool.
//
// Pure O(1) functions, no errors (callers pass consistent values); usable from any thread.
// Internal to pagedkv::cuda, not a stable API.
#pragma once

#include <cstddef>
#include <cstdint>

#include "internal/host_device.hpp"

namespace pagedkv::detail {

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 fragments ----
// groupID = lane / 4, threadID_in_group = lane % 4. A holds 8 16-bit values in 4 registers
// (element e in register e / 2, low half first), B holds 4 in 2 registers, C/D 4 floats.

struct MmaCoord {
  int row;
  int col;
};

// A (16 x 16, M x K), element e in 0..7.
PAGEDKV_HOST_DEVICE constexpr MmaCoord mma_a_coord(int lane, int e) {
  const int group = lane >> 2;
  const int tig = lane & 3;
  const int row = group + (((e >> 1) & 1) != 0 ? 8 : 0);  // a0,a2: group; a1,a3: group + 8
  const int col = tig * 2 + (e & 1) + (e >= 4 ? 8 : 0);
  return {row, col};
}

// B (16 x 8, K x N), element e in 0..3: row = k, col = n.
PAGEDKV_HOST_DEVICE constexpr MmaCoord mma_b_coord(int lane, int e) {
  return {(lane & 3) * 2 + (e & 1) + (e >= 2 ? 8 : 0), lane >> 2};
}

// C / D (16 x 8, M x N), element e in 0..3.
PAGEDKV_HOST_DEVICE constexpr MmaCoord mma_c_coord(int lane, int e) {
  return {(lane >> 2) + (e >= 2 ? 8 : 0), (lane & 3) * 2 + (e & 1)};
}

// ldmatrix.sync.aligned.m8n8.x4.b16: lane l supplies the address of row l % 8 of matrix l / 8;
// afterwards register j of lane l holds elements (l / 4, 2 (l % 4)) and (l / 4, 2 (l % 4) + 1) of
// matrix j (as stored: row, col). With .trans it holds the transposed matrix's: elements
// (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4) of the stored matrix.
PAGEDKV_HOST_DEVICE constexpr MmaCoord ldmatrix_coord(int lane, int half, bool trans) {
  return trans ? MmaCoord{(lane & 3) * 2 + half, lane >> 2}
               : MmaCoord{lane >> 2, (lane & 3) * 2 + half};
}

// The score-to-A reuse. QK^T for 16 keys k0..k0+15 is two m16n8 tiles (keys k0..k0+7, then
// k0+8..k0+15), accumulated in C fragments. The PV MMA over those keys needs P (16 rows x 16 keys)
// as its A operand. Element e of A comes from element c of tile t: {t, c} = pv_a_source(e). The
// kernel packs A register j from the C elements pv_a_source(2j) and pv_a_source(2j + 1) of the same
// lane, so no value leaves its lane (no shuffle, no shared memory).
struct PvASource {
  int tile;  // 0: keys k0..k0+7, 1: keys k0+8..k0+15
  int elem;  // C element 0..3
};
PAGEDKV_HOST_DEVICE constexpr PvASource pv_a_source(int e) {
  return {e >= 4 ? 1 : 0, ((e >> 1) & 1) * 2 + (e & 1)};
}

// QK^T B operand (K: keys x head_dim, row-major in shared memory) through ldmatrix.x4 (no trans):
// for the 16 keys k0.. and head_dim slice d0..d0+15, lane l points at key k0 + qk_b_key(l), 16-byte
// chunk d0 / 8 + qk_b_chunk(l). Registers 0, 1 are B of key tile 0 (d0.., d0+8..), 2, 3 of tile 1.
PAGEDKV_HOST_DEVICE constexpr int qk_b_key(int lane) {
  return (lane >> 4) * 8 + (lane & 7);
}
PAGEDKV_HOST_DEVICE constexpr int qk_b_chunk(int lane) {
  return (lane >> 3) & 1;
}

// PV B operand (V: keys x head_dim, row-major) through ldmatrix.x4.trans: for the 16 keys k0.. and
// the head_dim columns d0..d0+15 (two n-tiles), lane l points at key k0 + pv_b_key(l), chunk
// d0 / 8 + pv_b_chunk(l). Registers 0, 1 are B of columns d0..d0+7, registers 2, 3 of d0+8...
PAGEDKV_HOST_DEVICE constexpr int pv_b_key(int lane) {
  return ((lane >> 3) & 1) * 8 + (lane & 7);
}
PAGEDKV_HOST_DEVICE constexpr int pv_b_chunk(int lane) {
  return lane >> 4;
}

// ---- shared-memory layout of a warp's K or V slice: [kWarpTokens rows][head_dim / 8 chunks] ----
// 16-byte chunk c of row r sits at chunk index r x chunks + (c ^ (r mod 8)); with chunks a multiple
// of 8 this is a bijection on each row, and the 8 rows one ldmatrix phase reads (same c, 8
// consecutive rows) land in 8 distinct 16-byte bank groups.
PAGEDKV_HOST_DEVICE constexpr int swizzled_chunk(int row, int chunk, int chunks_per_row) {
  return row * chunks_per_row + (chunk ^ (row & 7));
}

// ---- tile geometry ----
inline constexpr int kTcWarps = 4;
inline constexpr int kTcThreads = kTcWarps * 32;
inline constexpr int kTcWarpTokens = 16;                        // keys per warp per tile
inline constexpr int kTcTileTokens = kTcWarps * kTcWarpTokens;  // 64 keys per CTA tile
inline constexpr int kTcRows = 16;                              // MMA M: the group's query heads

template <int kHeadDim>
struct TcDecodeShape {
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kStages = kHeadDim >= 256 ? 2 : 3;
  static constexpr int kSliceChunks = kTcWarpTokens * kChunks;  // one warp's K (or V) slice
  static constexpr int kCopiesPerLane = kSliceChunks / 32;
  // Per warp and stage: K slice, V slice (16-byte chunks); then the page-offset table.
  static constexpr std::size_t kStageBytes = 2u * kSliceChunks * 16u;
  static constexpr std::size_t kKvBytes = kTcWarps * kStages * kStageBytes;
  static constexpr std::size_t kOffsetBytes =
      sizeof(std::int64_t) * kTcWarps * kStages * kTcWarpTokens;
  static constexpr std::size_t kSmemBytes = kKvBytes + kOffsetBytes;
  // End-of-kernel merge scratch (reuses the K/V buffers): per warp O (16 x (head_dim + 4)
  // floats), m and l (2 x 16 floats).
  static constexpr int kScratchStride = kHeadDim + 4;
  static constexpr std::size_t kScratchBytes =
      sizeof(float) * kTcWarps * (kTcRows * kScratchStride + 2 * kTcRows);
  // Minimum resident CTAs per SM implied by shared memory on sm_90 (227 KiB per CTA, 228 KiB per
  // SM with 1 KiB reserved per CTA); the kernel's __launch_bounds__.
  static constexpr int kMinCtasPerSm = static_cast<int>(233472 / (kSmemBytes + 1024));
  static_assert(kChunks % 8 == 0, "swizzle needs a multiple of 8 chunks per row");
  static_assert(kSliceChunks % 32 == 0, "whole copies per lane");
  static_assert(kScratchBytes <= kKvBytes, "merge scratch fits in the K/V buffers");
  static_assert(kMinCtasPerSm >= 1, "fits one SM");
};

// Which tokens of a warp's slice lane l copies: copy i (0 <= i < kCopiesPerLane) of lane l is
// chunk index idx = l + 32 i of the slice, i.e. row idx / chunks, chunk idx % chunks.
PAGEDKV_HOST_DEVICE constexpr MmaCoord slice_copy(int lane, int i, int chunks_per_row) {
  const int idx = lane + 32 * i;
  return {idx / chunks_per_row, idx % chunks_per_row};
}

// ---- split-KV ranges (the same formula as kernels/decode_attention.cu and the merge) ----
struct TcSplitRange {
  int begin;
  int end;
  int num_active_splits;  // >= 1
};

// A sequence's length as the kernels use it: seq_lens' value clamped to [0, capacity] (the keys
// its table row can hold).
PAGEDKV_HOST_DEVICE constexpr int tc_clamped_len(std::int64_t raw_len, std::int64_t capacity) {
  return static_cast<int>(raw_len < 0 ? 0 : (raw_len > capacity ? capacity : raw_len));
}

// Sequence of raw length `raw_len` (tc_clamped_len), sliding window (0 = none), a grid of
// num_splits chunks of `chunk` tokens; the range of `split` (< num_active_splits to be used).
PAGEDKV_HOST_DEVICE constexpr TcSplitRange tc_split_range(std::int64_t raw_len,
                                                          std::int64_t capacity, int window,
                                                          int num_splits, int chunk, int split) {
  const int len = tc_clamped_len(raw_len, capacity);
  const int first = window > 0 && len > window ? len - window : 0;
  TcSplitRange r{first, len, 1};
  if (num_splits > 1) {
    const std::int64_t attended = len - first;
    const std::int64_t needed = (attended + chunk - 1) / chunk;
    r.num_active_splits =
        needed < 1 ? 1 : (needed < num_splits ? static_cast<int>(needed) : num_splits);
    r.begin = first + split * chunk;
    r.end = split == r.num_active_splits - 1 ? len : r.begin + chunk;
  }
  return r;
}

// ---- several query tokens per sequence (q_len > 1; kernels/decode_attention_tc.cu) ----
// The window of the CTA's key range: the union of the tokens' ranges, each token's window ending
// one key after the previous token's (0 = none). Pass it to tc_split_range.
PAGEDKV_HOST_DEVICE constexpr int tc_union_window(int window, int q_len) {
  return window > 0 ? window + q_len - 1 : 0;
}

// The keys MMA row `row` sees in `range` (a tc_split_range of the union window), relative to the
// range's begin: [lo, hi), hi <= the range's length, empty when hi <= lo. Row r holds query token
// r / group (rows >= `rows` = group x q_len hold no query: the last token's keys); token i sits
// at len - q_len + i (len: tc_clamped_len) and sees the keys up to itself within
// `row_window` (0 = none).
struct TcRowKeys {
  int lo;
  int hi;
};
PAGEDKV_HOST_DEVICE constexpr TcRowKeys tc_row_keys(int len, int q_len, int group, int rows,
                                                    int row_window, int row,
                                                    const TcSplitRange& range) {
  const int token = row < rows ? row / group : q_len - 1;
  const int end = len - (q_len - 1 - token);  // one past the token's position
  const int lo = row_window > 0 && end - row_window > 0 ? end - row_window : 0;
  const int range_len = range.end - range.begin;
  const int hi = end - range.begin;
  return {lo - range.begin, hi < range_len ? hi : range_len};
}

// Tiles a warp visits in a range: those whose 16-key slice holds at least one key.
PAGEDKV_HOST_DEVICE constexpr int tc_warp_tiles(int range_len, int warp) {
  const int rest = range_len - warp * kTcWarpTokens;
  return rest <= 0 ? 0 : (rest + kTcTileTokens - 1) / kTcTileTokens;
}

// First key of warp `warp`'s slice of tile `tile` (relative to the range's begin).
PAGEDKV_HOST_DEVICE constexpr int tc_slice_begin(int tile, int warp) {
  return tile * kTcTileTokens + warp * kTcWarpTokens;
}

// ---- the per-warp pipeline schedule (kStages slots, K/V ring and offset table alike) ----
// Prologue: offsets of tiles 0 .. kStages - 1 resolved, copies of tiles 0 .. kStages - 2 issued.
// Iteration i (computing tile i): issues the copies of tc_issue_tile(i) into slot
// tc_slot(that tile), reading the offsets resolved one iteration earlier, then resolves
// tc_resolve_tile(i) into its slot, which is the slot of tile i (whose copies were issued
// kStages - 1 iterations earlier and whose data stays in the K/V ring, not the offset table).
PAGEDKV_HOST_DEVICE constexpr int tc_slot(int tile, int stages) {
  return tile % stages;
}
PAGEDKV_HOST_DEVICE constexpr int tc_issue_tile(int iteration, int stages) {
  return iteration + stages - 1;
}
PAGEDKV_HOST_DEVICE constexpr int tc_resolve_tile(int iteration, int stages) {
  return iteration + stages;
}
// cp.async groups (K then V per tile, two per tile, always committed) still allowed in flight
// when iteration i needs K of tile i (before its own issue) and V of tile i (after it).
PAGEDKV_HOST_DEVICE constexpr int tc_k_wait_groups(int stages) {
  return 2 * stages - 3;
}
PAGEDKV_HOST_DEVICE constexpr int tc_v_wait_groups(int stages) {
  return 2 * stages - 2;
}

// Split-KV planning: decode_plan_options_for_current_device(..., kTensorCore) reports
// kTcPlanWaves x the variant's occupancy as ctas_per_sm, so the planner's one-wave target is
// kTcPlanWaves waves of this kernel ...
inline constexpr int kTcPlanWaves = 2;
// kTensorCoreWideMerge plans one wave: a CTA's tiles then share one pipeline fill instead of
// paying it once per wave (batch 1 at 4,096 tokens: 32 chunks of 128 tokens, not 64 of 64).
inline constexpr int kTcWideMergePlanWaves = 1;
// ... and min_chunk_tokens = one 64-token tile (a CTA's fixed cost is one pipeline fill), so a
// single 4k-token sequence can still fill the GPU.
inline constexpr int kTcMinChunkTokens = kTcTileTokens;

// ---- page-offset table ----
struct TcPageGeometry {
  std::int64_t stride_block;
  std::int64_t stride_token;
  std::int64_t head_offset;  // kv_head x stride_head
  std::int64_t num_blocks;
  int block_size;
  int block_shift;  // log2(block_size) when a power of two, else -1
};

// Element offset of token t's K/V row (head `kv_head` folded into head_offset), or -1 when t is
// at or past `end` or its block id is outside [0, num_blocks). table_row: the sequence's row.
PAGEDKV_HOST_DEVICE std::int64_t tc_token_offset(const TcPageGeometry& g,
                                                 const std::int32_t* table_row, int t, int end) {
  if (t >= end) return -1;
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
  if (block < 0 || block >= g.num_blocks) return -1;
  return block * g.stride_block + in_block * g.stride_token + g.head_offset;
}

// tc_token_offset in two steps, so a kernel can load a block id ahead of its use: the block id
// of token t (-1 at or past `end`; not yet checked against the pool), then t's offset in it (-1
// for a block id of -1 or outside [0, num_blocks)). tc_token_block_offset(g, t,
// tc_token_block(g, table_row, t, end)) == tc_token_offset(g, table_row, t, end).
PAGEDKV_HOST_DEVICE std::int64_t tc_token_block(const TcPageGeometry& g,
                                                const std::int32_t* table_row, int t, int end) {
  if (t >= end) return -1;
  const int block_index = g.block_shift >= 0 ? t >> g.block_shift : t / g.block_size;
#ifdef __CUDA_ARCH__
  return __ldg(table_row + block_index);
#else
  return table_row[block_index];
#endif
}
PAGEDKV_HOST_DEVICE std::int64_t tc_token_block_offset(const TcPageGeometry& g, int t,
                                                       std::int64_t block) {
  if (block < 0 || block >= g.num_blocks) return -1;
  const int in_block =
      g.block_shift >= 0 ? t & (g.block_size - 1) : t - (t / g.block_size) * g.block_size;
  return block * g.stride_block + in_block * g.stride_token + g.head_offset;
}

PAGEDKV_HOST_DEVICE constexpr int tc_block_shift(int block_size) {
  for (int shift = 0; shift < 31; ++shift) {
    if ((1 << shift) == block_size) return shift;
  }
  return -1;
}

}  // namespace pagedkv::detail
