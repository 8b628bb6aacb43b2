// kernels/internal/extend_fa2_layout.hpp: the layouts and the work decomposition of the
// FlashAttention-2-style paged extend kernel (ExtendKernel::kFa2, kernels/extend_attention_fa2.cu),
// as plain host/device functions, so the host tests (tests/device/extend_fa2_layout_test.cpp) check
// exactly what the kernel computes with:
//   - the tile shape per head_dim and CTA size (rows per warp, keys per tile, ring depth, shared
//     memory) and the row a lane's accumulator element belongs to;
//   - the ldmatrix addresses of Q (A operand, two m16 blocks per warp), K (QK B operand) and V
//     (PV B operand, .trans) in the swizzled shared layout (16-byte chunk c of row r at
//     c ^ (r mod 8)); the MMA fragment maps themselves are decode_tc_layout.hpp's;
//   - the 3-stage ring schedule: which stage and offset slot a tile uses, when its page offsets are
//     resolved and its copies issued, how many cp.async groups may still be pending;
//   - the split over keys: which key tiles of a query tile each split covers, how many splits a
//     tile really uses, the merge of their partial results, and the number of splits the host picks
//     for a grid that under-fills the GPU;
//   - the work-item order of the grid's z dimension (heaviest query tile first, its splits
//   adjacent).
//
// Pure O(1) functions, no errors (callers pass consistent values); usable from any thread.
// Internal to pagedkv::cuda, not a stable API.
#pragma once

#include <cstddef>
#include <cstdint>

#include "internal/decode_tc_layout.hpp"
#include "internal/extend_attention_tiles.hpp"
#include "internal/host_device.hpp"

namespace pagedkv::detail {

// Query rows per CTA of the kernel with `warps` warps at this head_dim (Fa2Shape::kRows).
PAGEDKV_HOST_DEVICE constexpr int fa2_tile_rows(int head_dim, int warps) {
  return warps * (head_dim >= 256 ? 16 : 32);
}

// ---- tile shape ----
// kWarps = 4 (the default) or 2 (query tiles of half the rows, for short prompts x small groups).
template <int kHeadDim, int kWarps>
struct Fa2Shape {
  static constexpr int kThreads = kWarps * 32;
  // 32 rows (two m16 blocks) per warp, so every K/V fragment feeds two MMAs; at head_dim 256 the
  // output accumulators of 32 rows alone would be 256 registers, so 16 rows there.
  static constexpr int kRowsPerWarp = kHeadDim >= 256 ? 16 : 32;
  static constexpr int kMBlocks = kRowsPerWarp / 16;
  static constexpr int kRows = kWarps * kRowsPerWarp;  // query rows per CTA
  // Keys per K/V tile: the score accumulators (kMBlocks x kKeys / 8 x 4 floats) plus the output
  // ones (kMBlocks x kHeadDim / 8 x 4) stay under the register budget without spills.
  static constexpr int kKeys = kHeadDim <= 128 ? 32 : 16;
  static constexpr int kStages = 3;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  // Q (scaled) lives in A fragments for the whole kernel at head_dim 64; from 128 on, 32 rows of
  // Q fragments would take 64+ registers beside 128 of output accumulators, so Q is re-read with
  // ldmatrix from shared memory for every key tile (FlashAttention-2's default).
  static constexpr bool kQInRegisters = kHeadDim <= 64;
  // The QK loop over head_dim is unrolled fully when the Q fragments are registers (indexed by
  // the step), else by 2: fully unrolled, ptxas hoists every K fragment load of the tile and the
  // kernel spills at head_dim 128.
  static constexpr int kKStepUnroll = kQInRegisters ? kHeadDim / 16 : 2;
  static constexpr int kRowsPerPass = kThreads / kChunks;      // rows one pass of copies covers
  static constexpr int kCopiesPerTile = kKeys / kRowsPerPass;  // per thread, for K and for V
  static constexpr int kQCopies = kRows / kRowsPerPass;
  static constexpr int kQChunks = kRows * kChunks;
  static constexpr int kKVChunks = kKeys * kChunks;
  // Shared memory: Q tile, then per stage a K tile and a V tile, then the page-offset table
  // (kStages slots of kKeys int64 element offsets; -1 = zero-fill).
  static constexpr std::size_t kQBytes = static_cast<std::size_t>(kQChunks) * 16u;
  static constexpr std::size_t kRingBytes = static_cast<std::size_t>(2 * kStages * kKVChunks) * 16u;
  static constexpr std::size_t kOffsetBytes = sizeof(std::int64_t) * kStages * kKeys;
  static constexpr std::size_t kSmemBytes = kQBytes + kRingBytes + kOffsetBytes;
  // CTAs per SM that shared memory allows on sm_90 (228 KiB per SM, 1 KiB reserved per CTA).
  static constexpr int kSmemCtasPerSm = static_cast<int>(233472 / (kSmemBytes + 1024));
  static_assert(kChunks % 8 == 0, "the swizzle permutes groups of 8 chunks");
  static_assert(kKeys % 16 == 0, "QK and PV work on 16 keys at a time");
  static_assert(kThreads % kChunks == 0 && kKeys % kRowsPerPass == 0 && kRows % kRowsPerPass == 0,
                "tiles are covered by whole passes of copies");
  static_assert(kKeys <= kThreads, "one thread resolves each key's page offset");
  static_assert(kSmemCtasPerSm >= 1, "fits one SM");
  // __launch_bounds__ minimum CTAs per SM (caps the registers at 65536 / (kMinCtasPerSm x
  // kThreads)): FA2_MIN_CTAS_OVERRIDE for experiments, else what shared memory allows, at most
  // kMaxMinCtas.
#ifdef PAGEDKV_FA2_MIN_CTAS
  static constexpr int kMaxMinCtas = PAGEDKV_FA2_MIN_CTAS;
#else
  static constexpr int kMaxMinCtas = 1;  // a cap of 168 registers (3 CTAs) spills at head_dim 64
#endif
  static constexpr int kMinCtasPerSm = kSmemCtasPerSm < kMaxMinCtas ? kSmemCtasPerSm : kMaxMinCtas;
  static_assert(kRows == fa2_tile_rows(kHeadDim, kWarps), "the host's tile count is the kernel's");
};

// Packed query row (token x group + head) of accumulator element `c` (C layout) of m16 block `mb`
// of lane `lane` in warp `warp`, relative to the tile's first row.
PAGEDKV_HOST_DEVICE constexpr int fa2_acc_row(int rows_per_warp, int warp, int mb, int lane,
                                              int c) {
  return warp * rows_per_warp + mb * 16 + mma_c_coord(lane, c).row;
}

// ldmatrix.x4 (no .trans) of the Q A operand: m16 block `mb` of warp `warp`, head_dim slice
// [16 ks, 16 ks + 16): lane l points at tile row fa2_q_row(...) and 16-byte chunk fa2_q_chunk(...).
// Matrices 0..3 = (rows 0-7, cols 0-7), (rows 8-15, cols 0-7), (rows 0-7, cols 8-15),
// (rows 8-15, cols 8-15) of the block: exactly A registers a0..a3.
PAGEDKV_HOST_DEVICE constexpr int fa2_q_row(int rows_per_warp, int warp, int mb, int lane) {
  return warp * rows_per_warp + mb * 16 + (lane & 15);
}
PAGEDKV_HOST_DEVICE constexpr int fa2_q_chunk(int ks, int lane) {
#if defined(PAGEDKV_TEST_BROKEN_FA2_GEOMETRY) && PAGEDKV_TEST_BROKEN_FA2_GEOMETRY == 4
  return 2 * ks + ((lane >> 3) & 1);  // test-only: the K operand's chunk map used for Q
#else
  return 2 * ks + (lane >> 4);
#endif
}

// Shared-memory swizzle (the same as the decode variant's and the default extend kernel's).
PAGEDKV_HOST_DEVICE constexpr int fa2_swizzled(int row, int chunk, int chunks_per_row) {
#if defined(PAGEDKV_TEST_BROKEN_FA2_GEOMETRY) && PAGEDKV_TEST_BROKEN_FA2_GEOMETRY == 1
  return row * chunks_per_row + (chunk ^ (row & 3));  // test-only: a swizzle with bank conflicts
#else
  return row * chunks_per_row + (chunk ^ (row & 7));
#endif
}

// Which (row, chunk) of a tile thread `tid` copies in pass `i` (rows_per_pass = threads / chunks).
PAGEDKV_HOST_DEVICE constexpr MmaCoord fa2_copy(int tid, int i, int chunks_per_row,
                                                int rows_per_pass) {
  return {tid / chunks_per_row + i * rows_per_pass, tid % chunks_per_row};
}

// ---- the ring schedule (kStages K/V stages and kStages offset slots) ----
// Prologue: offsets of tiles 0 .. kStages - 1 resolved (one thread per key), a CTA barrier, the
// copies of tiles 0 .. kStages - 2 issued (one commit group each). Iteration i (computing tile i):
// wait until at most fa2_wait_groups() groups are pending (tile i complete), a CTA barrier (tile i
// visible to all; every warp done with tile i - 1, whose stage is the one written next), issue the
// copies of fa2_issue_tile(i) into its stage from its offset slot (always one commit, possibly
// empty), resolve the offsets of fa2_resolve_tile(i) into its slot, which is tile i's: tile i's
// copies were issued kStages - 1 iterations ago, and the slot is next read after the next barrier.
PAGEDKV_HOST_DEVICE constexpr int fa2_slot(int tile, int stages) {
  return tile % stages;
}
PAGEDKV_HOST_DEVICE constexpr int fa2_issue_tile(int iteration, int stages) {
  return iteration + stages - 1;
}
PAGEDKV_HOST_DEVICE constexpr int fa2_resolve_tile(int iteration, int stages) {
  return iteration + stages;
}
PAGEDKV_HOST_DEVICE constexpr int fa2_wait_groups(int stages) {
#if defined(PAGEDKV_TEST_BROKEN_FA2_GEOMETRY) && PAGEDKV_TEST_BROKEN_FA2_GEOMETRY == 2
  return stages - 1;  // test-only: computes a tile whose copies may still be in flight
#else
  return stages - 2;
#endif
}

// ---- the split over keys ----
// A query tile sees key positions [kv_begin, kv_end): num_kv_tiles tiles of `keys` keys. With
// num_splits > 1, split s covers key tiles [s x chunk, min((s + 1) x chunk, num_kv_tiles)) with
// chunk = ceil(num_kv_tiles / num_splits); only the first `active` = ceil(num_kv_tiles / chunk)
// splits hold a key tile (at least 1, even for a tile that sees no key). A tile with one active
// split writes its output directly; the others write normalized partial outputs and log2-sum-exp2
// per row, which fa2 merge combines.
struct Fa2TileWork {
  ExtendTileGeometry geo;
  int num_kv_tiles;  // key tiles of the whole query tile
  int chunk_tiles;   // key tiles per split
  int active;        // splits holding a key tile (>= 1)
};

PAGEDKV_HOST_DEVICE Fa2TileWork fa2_tile_work(int q_len, int prefix, int group, int window,
                                              int tile, int rows, int keys, int num_splits) {
  Fa2TileWork w{};
  w.geo = extend_tile_geometry(q_len, prefix, group, window, tile, rows);
  w.num_kv_tiles = (w.geo.kv_end - w.geo.kv_begin + keys - 1) / keys;
  const int splits = num_splits < 1 ? 1 : num_splits;
  w.chunk_tiles = (w.num_kv_tiles + splits - 1) / splits;
  if (w.chunk_tiles < 1) w.chunk_tiles = 1;
  w.active = (w.num_kv_tiles + w.chunk_tiles - 1) / w.chunk_tiles;
  if (w.active < 1) w.active = 1;
  return w;
}

// Key tiles [first, last) of split `split` (first == last for a split past `active`).
struct Fa2SplitTiles {
  int first;
  int last;
};
PAGEDKV_HOST_DEVICE Fa2SplitTiles fa2_split_tiles(const Fa2TileWork& w, int split) {
#if defined(PAGEDKV_TEST_BROKEN_FA2_GEOMETRY) && PAGEDKV_TEST_BROKEN_FA2_GEOMETRY == 3
  int first = split * w.chunk_tiles + (split > 0 ? 1 : 0);  // test-only: drops a key tile
#else
  int first = split * w.chunk_tiles;
#endif
  int last = first + w.chunk_tiles;
  if (first > w.num_kv_tiles) first = w.num_kv_tiles;
  if (last > w.num_kv_tiles) last = w.num_kv_tiles;
  return {first, last};
}

// Grid z index -> (query tile, split): heaviest tile (the last: most keys) first, a tile's splits
// adjacent. num_tiles: the sequence's query tiles; z >= num_tiles x num_splits is idle.
struct Fa2WorkItem {
  int tile;
  int split;
};
PAGEDKV_HOST_DEVICE constexpr Fa2WorkItem fa2_work_item(int z, int num_tiles, int num_splits) {
  return {num_tiles - 1 - z / num_splits, z % num_splits};
}

// What grid cell z of a sequence (q_len new tokens after `prefix` cached ones) covers with query
// tiles of `rows` rows and key tiles of `keys` keys: its (query tile, split), the tile's work and
// the split's key tiles. false (out partly set) when the cell has nothing to do: past the
// sequence's query tiles, or a split past the active ones. (The warpgroup-MMA kernels' cells and
// the persistent schedule's host test; kFa2's and kFa2Fp8's kernels compose the same steps.)
struct Fa2CellWork {
  Fa2WorkItem item;
  Fa2TileWork work;
  Fa2SplitTiles split;
};
PAGEDKV_HOST_DEVICE bool fa2_cell_work(int q_len, int prefix, int group, int window, int num_splits,
                                       int z, int rows, int keys, Fa2CellWork& out) {
  out.item = fa2_work_item(z, extend_num_tiles(q_len, group, rows), num_splits);
  if (out.item.tile < 0) return false;
  out.work = fa2_tile_work(q_len, prefix, group, window, out.item.tile, rows, keys, num_splits);
  if (out.item.split >= out.work.active) return false;
  out.split = fa2_split_tiles(out.work, out.item.split);
  return true;
}

// Merge of split partials for one row: running (m, sum) over the log2-sum-exp2 values lse_s of
// the splits; weight(lse_s) = 2^(lse_s - m). A split that saw no key has lse -inf, weight 0.
PAGEDKV_HOST_DEVICE float fa2_merge_max(float m, float lse) {
  return lse > m ? lse : m;
}

// Splits the host picks: 1 when the grid of query tiles x sequences x KV heads already fills
// `target_ctas` (SMs x resident CTAs per SM x waves), else enough to fill it, at most max_splits
// and so that tiles x splits stays within the grid's z limit.
inline constexpr int kFa2MaxSplits = 16;
inline constexpr int kFa2PlanWaves = 2;
PAGEDKV_HOST_DEVICE constexpr int fa2_num_splits(std::int64_t ctas, std::int64_t tiles,
                                                 std::int64_t target_ctas, int max_splits) {
  if (ctas <= 0 || ctas >= target_ctas) return 1;
  std::int64_t s = (target_ctas + ctas - 1) / ctas;
  if (s > max_splits) s = max_splits;
  if (tiles > 0 && s * tiles > 65535) s = 65535 / tiles;
  return s < 1 ? 1 : static_cast<int>(s);
}

// CTA size for a launch: 2 warps (64-row tiles for head_dim <= 128) when a sequence's rows fit
// in one such tile, else 4.
PAGEDKV_HOST_DEVICE constexpr int fa2_warps(int max_q_len, int group) {
  return static_cast<std::int64_t>(max_q_len) * group <= 64 ? 2 : 4;
}

// Workspace state index of (sequence, token, query head, split) and the workspace's size: float
// partial outputs [states][head_dim], then float log2-sum-exp2 [states], 16-byte aligned.
PAGEDKV_HOST_DEVICE constexpr std::int64_t fa2_state(int seq, int token, int q_head, int split,
                                                     int max_q_len, int num_q_heads,
                                                     int num_splits) {
  return ((static_cast<std::int64_t>(seq) * max_q_len + token) * num_q_heads + q_head) *
             num_splits +
         split;
}
PAGEDKV_HOST_DEVICE constexpr std::int64_t fa2_states(int num_seqs, int max_q_len, int num_q_heads,
                                                      int num_splits) {
  return static_cast<std::int64_t>(num_seqs) * max_q_len * num_q_heads * num_splits;
}
PAGEDKV_HOST_DEVICE constexpr std::size_t fa2_workspace_bytes(int num_seqs, int max_q_len,
                                                              int num_q_heads, int head_dim,
                                                              int num_splits) {
  if (num_splits <= 1) return 0;
  const std::int64_t states = fa2_states(num_seqs, max_q_len, num_q_heads, num_splits);
  const std::int64_t out_bytes = states * head_dim * 4;
  const std::int64_t lse_bytes = (states * 4 + 15) / 16 * 16;
  return static_cast<std::size_t>(out_bytes + lse_bytes);
}

}  // namespace pagedkv::detail
