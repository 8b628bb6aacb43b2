// Warpgroup-MMA paged extend attention (ExtendKernel::kWgmma; contract in
// include/pagedkv/cuda/extend_attention.hpp). Issue 35, step B, first cut: Hopper's wgmma on the
// FA2 kernel's tile geometry, without warp specialization yet. Compiled for sm_90a only (the CMake
// object library pagedkv_cuda_sm90a); paged_extend_attention runs it only on compute capability
// 9.0, for 16-bit caches at head_dim 128, and falls back to kFa2 elsewhere. Not yet run on a GPU:
// it is built on the layouts the warpgroup-MMA probe (kernels/wgmma_probe.cu) checks.
//
// CTA = two warpgroups (256 threads) = 128 query rows (token-major over the GQA group, as kFa2)
// of one (sequence, KV head); warpgroup g owns rows 64 g .. 64 g + 63.
//   Q       16-byte loads into a 128-byte-swizzled K-major tile (two 64-element column blocks).
//   K/V     64-key tiles through kFa2's 3-stage cp.async ring (page offsets resolved two tiles
//           ahead, zero-fill past the range or for a block id outside the pool): K K-major (the B
//           operand of S = Q K^T), V N-major (the B operand of O += P V, imm-trans-b 1).
//   S       wgmma.m64n64k16, both operands from shared memory, 8 k steps over head_dim 128.
//   softmax online in registers on the accumulators (whose per-warp layout is mma.sync's C
//           fragment: a row's 64 keys live in the 4 lanes of a quad); output rescale skipped when
//           no row maximum of the warp moved.
//   O       wgmma.m64n128k16, P from registers (the accumulators packed to 16 bits), V from
//           shared memory, 4 k steps.
//   kWgmmaPipelined: the same CTA with a 4-stage ring; iteration t issues tile t's S GEMM, then
//           tile t - 1's PV GEMM, waits for the first only and runs tile t's softmax while the
//           PV GEMM runs (FlashAttention-3's intra-warpgroup overlap); O is rescaled and P
//           packed after the second wait. ptxas would serialize the wgmma if a register it
//           writes were touched in flight: scripts/kernel-resources fails on that advisory.
//   split   over keys as kFa2 (grid z = query tiles x splits, heaviest tile first; the same
//           Fa2TileWork / fa2_split_tiles rules with 128 rows and 64 keys): a query tile with more
//           than one active split writes normalized partial rows and their log2-sum-exp2 to the
//           workspace, and kFa2's merge kernel (fa2_merge_splits) combines them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "internal/cp_async.cuh"
#include "internal/extend_fa2_launch.hpp"
#include "internal/extend_fa2_params.cuh"
#include "internal/extend_wgmma_launch.hpp"
#include "internal/extend_wgmma_schedule.hpp"
#include "internal/mma_sync.cuh"
#include "internal/wgmma.cuh"
#include "internal/wgmma_extend_rows.cuh"
#include "internal/wgmma_layout.hpp"
#include "internal/wgmma_probe.hpp"

namespace pagedkv::kernels {

namespace {

using fa2::Fa2Params;

using wgmma_extend::fence_p;
using wgmma_extend::kHeadDim;
using wgmma_extend::kKeys;
using wgmma_extend::kScores;
using wgmma_extend::PFragments;
constexpr int kThreads = 256;  // two warpgroups
constexpr int kRows = kWgmmaExtendRows;
constexpr int kChunks = kHeadDim / 8;                     // 16-byte chunks per row
constexpr std::uint32_t kQBytes = kRows * kHeadDim * 2;   // 32 KiB
constexpr std::uint32_t kKVBytes = kKeys * kHeadDim * 2;  // K or V of one stage, 16 KiB
constexpr std::uint32_t kStageBytes = 2 * kKVBytes;
static_assert(kThreads * 8 == kRows * kChunks && kThreads * 4 == kKeys * kChunks,
              "Q: 8 chunks per thread; K and V: 4 each");

// The ring (internal/extend_wgmma_schedule.hpp; tests/device/extend_wgmma_schedule_test.cpp
// replays this kernel's schedule on it): kFa2's distances for 3 stages (iteration t waits for tile
// t with one group pending, issues tile t + 2 and resolves tile t + 3's offsets). The pipelined
// kernel runs tile t - 1's PV GEMM during iteration t, so tile t - 1's stage is still read while
// tile t + 2 is issued: it needs a 4th stage, with the same issue and resolve distances.
constexpr int kRingStages = detail::kWgmmaRingDistances;
template <bool kPipelined>
constexpr int kStagesOf = detail::wgmma_extend_stages(kPipelined);
// Q, the K/V stages, their offset slots and the 1 KiB the base is aligned up by.
constexpr std::uint32_t smem_bytes(int stages) {
  return kQBytes + static_cast<std::uint32_t>(stages) * kStageBytes +
         static_cast<std::uint32_t>(sizeof(std::int64_t) * stages * kKeys) + 1024;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PAGEDKV_WGMMA_EXTEND_DEVICE 1  // the device pass with wgmma (sm_90a)
#endif

// kPipelined (ExtendKernel::kWgmmaPipelined): iteration t issues tile t's S GEMM and then tile
// t - 1's PV GEMM, waits for the first only, runs tile t's softmax while the PV GEMM runs on the
// tensor cores, then waits for it, rescales O and packs P (FlashAttention-3's intra-warpgroup
// overlap). Otherwise each tile's S GEMM, softmax and PV GEMM run in sequence.
template <bool kBf16, bool kSoftCap, bool kPipelined>
__global__ void __launch_bounds__(kThreads, 1) wgmma_extend_kernel(const Fa2Params p) {
#ifdef PAGEDKV_WGMMA_EXTEND_DEVICE
  using namespace pagedkv::detail;
  constexpr int kStages = kStagesOf<kPipelined>;
  extern __shared__ unsigned char smem_raw[];
  const auto raw_addr = static_cast<std::uint32_t>(__cvta_generic_to_shared(smem_raw));
  const std::uint32_t pad = (1024u - (raw_addr & 1023u)) & 1023u;
  unsigned char* const smem = smem_raw + pad;
  const std::uint32_t q_addr = raw_addr + pad;
  const std::uint32_t ring_addr = q_addr + kQBytes;
  unsigned char* const ring = smem + kQBytes;
  auto* offsets = reinterpret_cast<std::int64_t*>(ring + kStages * kStageBytes);

  // ---- what this CTA covers ----
  const int kv_head = static_cast<int>(blockIdx.x);
  const int seq = static_cast<int>(blockIdx.y);
  const fa2::SeqLens lens = fa2::seq_lens_of(p, seq);
  const int num_tiles = extend_num_tiles(lens.q_len, p.group, kRows);
  const Fa2WorkItem item = fa2_work_item(static_cast<int>(blockIdx.z), num_tiles, p.num_splits);
  if (item.tile < 0) return;  // uniform over the CTA
  const Fa2TileWork work = fa2_tile_work(lens.q_len, lens.prefix, p.group, p.window_size, item.tile,
                                         kRows, kKeys, p.num_splits);
  if (item.split >= work.active) return;
  const Fa2SplitTiles split = fa2_split_tiles(work, item.split);
  const bool direct = work.active == 1;
  const ExtendTileGeometry& geo = work.geo;
  const int key_first = geo.kv_begin + split.first * kKeys;
  const int tiles = split.last - split.first;

  const int tid = static_cast<int>(threadIdx.x);
  const int wg = tid / 128;  // warpgroup
  const int wt = tid % 128;  // thread within the warpgroup

  const fa2::Fa2KeyPages pages = fa2::fa2_key_pages(p, seq, kv_head, key_first, geo.kv_end, tiles);
  const auto resolve = [&](int t) { pages.resolve<kKeys, kStages>(offsets, t, tid); };
  // Copies of tile `t`: chunk (key, c) of K to its K-major place, of V to its N-major place.
  const auto issue = [&](int t) {
    if (t < tiles) {
      const int stage = fa2_slot(t, kStages);
      unsigned char* k_dst = ring + stage * kStageBytes;
      unsigned char* v_dst = k_dst + kKVBytes;
      const std::int64_t* slot = offsets + stage * kKeys;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int chunk = tid + i * kThreads;
        const int key = chunk / kChunks;
        const int c = chunk % kChunks;
        const std::int64_t off = slot[key];
        const bool fill = off >= 0;
        const std::uint32_t k_at = wgmma_kmajor_chunk_offset(key, c, kKeys);
        const std::uint32_t v_at = wgmma_v_chunk_offset(key, c, kKeys);
        cp_async_16(k_dst + k_at, fill ? p.k_cache + off + c * 8 : p.k_cache, fill);
        cp_async_16(v_dst + v_at, fill ? p.v_cache + off + c * 8 : p.v_cache, fill);
      }
    }
    cp_async_commit();
  };

  // Prologue: offsets of tiles 0 .. 2, copies of tiles 0 and 1 (the ring's distances).
#pragma unroll
  for (int t = 0; t < kRingStages; ++t) resolve(t);
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kRingStages - 1; ++t) issue(t);

    // Q, unscaled; rows past q_len are zero.
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int chunk = tid + i * kThreads;
    const int row = chunk / kChunks;
    const int c = chunk % kChunks;
    const int packed = geo.row0 + row;
    const int token = packed / p.group;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (token < lens.q_len) {
      const std::int64_t at =
          (static_cast<std::int64_t>(lens.q_begin) + token) * p.q_stride_token +
          static_cast<std::int64_t>(kv_head * p.group + packed % p.group) * p.q_stride_head + c * 8;
      v = __ldg(reinterpret_cast<const uint4*>(p.q + at));
    }
    *reinterpret_cast<uint4*>(smem + wgmma_kmajor_chunk_offset(row, c, kRows)) = v;
  }

  wgmma_extend::Rows<kBf16, kSoftCap> rows(p, lens, geo, wg, wt);

  // Copies of tile t done and visible (its stage, to the async proxy too); the next copies and
  // offsets issued. The barrier also means every warpgroup is done with the stage issued into.
  const auto begin_tile = [&](int t) {
    cp_async_wait<fa2_wait_groups(kRingStages)>();
    wgmma::fence_proxy_async_shared();  // this thread's copies (and Q stores) before the async
                                        // proxy
    __syncthreads();  // tile t visible to all; every warpgroup is done with the stage issued next
    issue(fa2_issue_tile(t, kRingStages));
    resolve(fa2_resolve_tile(t, kRingStages));
  };
  const auto k_addr_of = [&](int t) {
    return ring_addr + static_cast<std::uint32_t>(fa2_slot(t, kStages)) * kStageBytes;
  };

  if constexpr (!kPipelined) {
    for (int t = 0; t < tiles; ++t) {
      begin_tile(t);
      const std::uint32_t k_addr = k_addr_of(t);
      float s[kScores];
      wgmma::reg_fence(s);
      wgmma::fence();
      rows.issue_qk(s, q_addr, kRows, k_addr);
      wgmma::commit();
      wgmma::wait_all();
      wgmma::reg_fence(s);
      float alpha[2];
      (void)rows.template softmax<true>(s, key_first + t * kKeys, alpha);  // O rescaled in it
      PFragments pa;
      rows.pack_p(s, pa);
      wgmma::reg_fence(rows.o);
      fence_p(pa);
      wgmma::fence();
      rows.issue_pv(pa, k_addr_of(wgmma_pv_tile(t, false)) + kKVBytes);
      wgmma::commit();
      wgmma::wait_all();
      wgmma::reg_fence(rows.o);
      fence_p(pa);
    }
  } else {
    rows.run_pipelined(tiles, key_first, q_addr, kRows, kKVBytes, begin_tile, k_addr_of,
                       [](int) {});  // the CTA barrier of begin_tile hands stages back
  }
  cp_async_wait<0>();

  // ---- epilogue: this thread's two rows, directly or as a split partial ----
  rows.epilogue(lens, seq, kv_head, direct, item.split);
#else
  (void)p;
  __trap();  // built for sm_90a only; the host checks the device before launching
#endif
}

template <bool kBf16, bool kSoftCap, bool kPipelined>
cudaError_t launch(Fa2Params kp, int num_kv_heads, int num_seqs, cudaStream_t stream) {
  const auto kernel = wgmma_extend_kernel<kBf16, kSoftCap, kPipelined>;
  constexpr std::uint32_t kSmemBytes = smem_bytes(kStagesOf<kPipelined>);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmemBytes));
  if (err != cudaSuccess) return err;
  kp.rows = kRows;
  kp.keys = kKeys;
  const std::int64_t tiles =
      (static_cast<std::int64_t>(kp.max_q_len) * kp.group + kRows - 1) / kRows;
  if (tiles == 0) return cudaSuccess;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(num_kv_heads), static_cast<unsigned>(num_seqs),
                        static_cast<unsigned>(tiles * kp.num_splits));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  err = cudaLaunchKernelEx(&config, kernel, kp);
  if (err != cudaSuccess || kp.num_splits == 1) return err;
  return fa2_merge_splits(kp, kBf16, kHeadDim, num_seqs, stream);
}

template <bool kPipelined>
cudaError_t ctas_per_sm(int* ctas) {
  const auto kernel = wgmma_extend_kernel<true, false, kPipelined>;  // dtype, cap: same size
  constexpr std::uint32_t kSmemBytes = smem_bytes(kStagesOf<kPipelined>);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmemBytes));
  int resident = 0;
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, kSmemBytes);
  }
  if (err != cudaSuccess) return err;
  *ctas = resident > 0 ? resident : 1;
  return cudaSuccess;
}

template <bool kPipelined>
cudaError_t dispatch(const PagedExtendParams& params, int num_splits, void* workspace,
                     cudaStream_t stream) {
  const Fa2Params kp = fa2::make_fa2_params(params, num_splits, workspace);
  const bool bf16 = params.dtype == KVDtype::kBFloat16;
  const bool cap = kp.cap_log2 > 0.0f;
  const int heads = params.layout.num_kv_heads;
  if (bf16) {
    return cap ? launch<true, true, kPipelined>(kp, heads, params.num_seqs, stream)
               : launch<true, false, kPipelined>(kp, heads, params.num_seqs, stream);
  }
  return cap ? launch<false, true, kPipelined>(kp, heads, params.num_seqs, stream)
             : launch<false, false, kPipelined>(kp, heads, params.num_seqs, stream);
}

}  // namespace

bool wgmma_extend_runs(const PagedExtendParams& params) noexcept {
  if (params.quant.fp8() || params.layout.head_dim != kHeadDim) return false;
  try {
    return cuda::detail::wgmma_probe_supported();  // compute capability 9.0: the sm_90a code
  } catch (...) {
    return false;
  }
}

cudaError_t wgmma_extend_ctas_per_sm(bool pipelined, int* ctas) {
  return pipelined ? ctas_per_sm<true>(ctas) : ctas_per_sm<false>(ctas);
}

cudaError_t wgmma_paged_extend(const PagedExtendParams& params, bool pipelined, int num_splits,
                               void* workspace, cudaStream_t stream) {
  return pipelined ? dispatch<true>(params, num_splits, workspace, stream)
                   : dispatch<false>(params, num_splits, workspace, stream);
}

}  // namespace pagedkv::kernels
