// kernels/internal/extend_wgmma_grid.cuh: the grid of the warpgroup-MMA paged extend kernels
// (kernels/extend_attention_wgmma.cu, kernels/extend_attention_wgmma_ws.cu), host and device:
// what one CTA covers (cta_work: KV head x sequence x query tile x split, kFa2's tile rules with
// 128 rows and 64-key tiles), the launch with the split's merge and the dispatch over dtype and
// soft-cap (the occupancy query is decode_tc_host.hpp's resident_ctas_per_sm). Included only by
// sources compiled for sm_90a alone (the CMake object library pagedkv_cuda_sm90a); internal to
// pagedkv::cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "internal/extend_fa2_launch.hpp"
#include "internal/extend_fa2_layout.hpp"
#include "internal/extend_fa2_params.cuh"
#include "internal/extend_persistent_schedule.hpp"
#include "internal/extend_wgmma_launch.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv::kernels::wgmma_extend {

inline constexpr int kHeadDim = 128;            // the only head_dim the kernels take
inline constexpr int kRows = kWgmmaExtendRows;  // query rows per CTA (two warpgroups of 64)
inline constexpr int kKeys = 64;                // keys per K/V tile

// What this CTA covers: grid x = KV head, y = sequence, z = query tile x split (heaviest tile
// first), as kFa2 with 128-row query tiles.
struct CtaWork {
  int kv_head;
  int seq;
  fa2::SeqLens lens;
  detail::Fa2WorkItem item;
  detail::Fa2TileWork work;
  bool direct;    // the query tile has one active split: rows written directly, no merge
  int key_first;  // the split's first key
  int tiles;      // the split's key tiles (0 for a tile that sees no key)
};

// Fills w for grid cell (kv_head, seq, z); false when the cell has nothing to do (past its
// sequence's query tiles, or a split past the active ones). Uniform over the CTA, so a kernel
// returns (or a persistent one draws the next cell) before any barrier.
__device__ __forceinline__ bool cell_work(const fa2::Fa2Params& p, int kv_head, int seq, int z,
                                          CtaWork& w) {
  w.kv_head = kv_head;
  w.seq = seq;
  w.lens = fa2::seq_lens_of(p, w.seq);
  detail::Fa2CellWork cell;
  if (!detail::fa2_cell_work(w.lens.q_len, w.lens.prefix, p.group, p.window_size, p.num_splits, z,
                             kRows, kKeys, cell)) {
    return false;
  }
  w.item = cell.item;
  w.work = cell.work;
  w.direct = cell.work.active == 1;
  w.key_first = cell.work.geo.kv_begin + cell.split.first * kKeys;
  w.tiles = cell.split.last - cell.split.first;
  return true;
}

// The 16-byte chunk `col` of row `row` of the Q tile at geo (the tile's packed (token, query head
// of kv_head's group) rows), unscaled; zeros for a row past the sequence's q_len.
__device__ __forceinline__ uint4 q_chunk(const fa2::Fa2Params& p, const fa2::SeqLens& lens,
                                         const detail::ExtendTileGeometry& geo, int kv_head,
                                         int row, int col) {
  const int packed = geo.row0 + row;
  const int token = packed / p.group;
  if (token >= lens.q_len) return make_uint4(0u, 0u, 0u, 0u);
  const std::int64_t at =
      (static_cast<std::int64_t>(lens.q_begin) + token) * p.q_stride_token +
      static_cast<std::int64_t>(kv_head * p.group + packed % p.group) * p.q_stride_head + col * 8;
  return __ldg(reinterpret_cast<const uint4*>(p.q + at));
}

// The cell of this CTA in the non-persistent grid.
__device__ __forceinline__ bool cta_work(const fa2::Fa2Params& p, CtaWork& w) {
  return cell_work(p, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                   static_cast<int>(blockIdx.z), w);
}

// Query tiles of kp's launch (kRows rows each).
inline std::int64_t grid_query_tiles(const fa2::Fa2Params& kp) {
  return (static_cast<std::int64_t>(kp.max_q_len) * kp.group + kRows - 1) / kRows;
}

// What every launch of a kernel over kp's batch sets: the kernel's dynamic shared memory (set on
// every launch: cheap, per device, and allowed while a graph is being captured), kp.rows /
// kp.keys, and config's block, shared memory and stream.
template <typename Kernel>
cudaError_t prepare_launch(Kernel kernel, int threads, std::uint32_t smem_bytes, fa2::Fa2Params& kp,
                           cudaStream_t stream, cudaLaunchConfig_t& config) {
  kp.rows = kRows;
  kp.keys = kKeys;
  config = cudaLaunchConfig_t{};
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem_bytes));
}

// After the kernel's launch: with a split over keys, kFa2's merge of the partial rows.
inline cudaError_t merge_after(cudaError_t launched, const fa2::Fa2Params& kp, bool bf16,
                               int num_seqs, cudaStream_t stream) {
  if (launched != cudaSuccess || kp.num_splits == 1) return launched;
  return fa2_merge_splits(kp, bf16, kHeadDim, num_seqs, stream);
}

// Launches `kernel` (threads per CTA, dynamic shared memory; arguments kp, then `extra`) over the
// grid of kp's batch (one CTA per cell) and, with a split over keys, the merge.
template <typename Kernel, typename... Extra>
cudaError_t launch_grid(Kernel kernel, int threads, std::uint32_t smem_bytes, fa2::Fa2Params kp,
                        bool bf16, int num_kv_heads, int num_seqs, cudaStream_t stream,
                        Extra... extra) {
  cudaLaunchConfig_t config;
  const cudaError_t err = prepare_launch(kernel, threads, smem_bytes, kp, stream, config);
  const std::int64_t tiles = grid_query_tiles(kp);
  if (err != cudaSuccess || tiles == 0) return err;
  config.gridDim = dim3(static_cast<unsigned>(num_kv_heads), static_cast<unsigned>(num_seqs),
                        static_cast<unsigned>(tiles * kp.num_splits));
  return merge_after(cudaLaunchKernelEx(&config, kernel, kp, extra...), kp, bf16, num_seqs, stream);
}

// The persistent launch of `kernel` (arguments kp and a detail::PersistentSchedule): the grid's
// cells become the items of extend_persistent_schedule.hpp, drawn by at most planned_ctas CTAs
// off the counter at `counter` (kPersistentCounterBytes, zeroed here on the stream first); then
// the merge, as launch_grid.
template <typename Kernel>
cudaError_t launch_persistent(Kernel kernel, int threads, std::uint32_t smem_bytes,
                              fa2::Fa2Params kp, bool bf16, int num_kv_heads, int num_seqs,
                              std::int64_t planned_ctas, void* counter, cudaStream_t stream) {
  cudaLaunchConfig_t config;
  cudaError_t err = prepare_launch(kernel, threads, smem_bytes, kp, stream, config);
  const std::int64_t tiles = grid_query_tiles(kp);
  if (err != cudaSuccess || tiles == 0) return err;
  detail::PersistentSchedule sched{};
  sched.counter = static_cast<unsigned long long*>(counter);
  sched.grid = {num_kv_heads, num_seqs, static_cast<std::int32_t>(tiles * kp.num_splits)};
  sched.items = detail::persistent_items(sched.grid);
  err = cudaMemsetAsync(counter, 0, sizeof(unsigned long long), stream);
  if (err != cudaSuccess) return err;
  config.gridDim =
      dim3(static_cast<unsigned>(detail::persistent_grid_ctas(sched.items, planned_ctas)));
  return merge_after(cudaLaunchKernelEx(&config, kernel, kp, sched), kp, bf16, num_seqs, stream);
}

// Validated params, num_splits >= 1 (a workspace of extend_workspace_bytes when > 1): calls
// launch.template operator()<kBf16, kSoftCap>(kp) with the kernel parameters.
template <typename Launch>
cudaError_t dispatch(const PagedExtendParams& params, int num_splits, void* workspace,
                     Launch&& launch) {
  const fa2::Fa2Params kp = fa2::make_fa2_params(params, num_splits, workspace);
  const bool cap = kp.cap_log2 > 0.0f;
  if (params.dtype == KVDtype::kBFloat16) {
    return cap ? launch.template operator()<true, true>(kp)
               : launch.template operator()<true, false>(kp);
  }
  return cap ? launch.template operator()<false, true>(kp)
             : launch.template operator()<false, false>(kp);
}

}  // namespace pagedkv::kernels::wgmma_extend
