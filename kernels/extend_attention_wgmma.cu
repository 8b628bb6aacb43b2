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
#include "internal/decode_tc_host.hpp"
#include "internal/extend_fa2_params.cuh"
#include "internal/extend_wgmma_grid.cuh"
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
using wgmma_extend::kRows;
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
  wgmma_extend::CtaWork cw;
  if (!wgmma_extend::cta_work(p, cw)) return;  // uniform over the CTA
  const int kv_head = cw.kv_head;
  const int seq = cw.seq;
  const fa2::SeqLens& lens = cw.lens;
  const ExtendTileGeometry& geo = cw.work.geo;
  const int key_first = cw.key_first;
  const int tiles = cw.tiles;

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
    *reinterpret_cast<uint4*>(smem + wgmma_kmajor_chunk_offset(row, c, kRows)) =
        wgmma_extend::q_chunk(p, lens, geo, kv_head, row, c);
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
  rows.epilogue(lens, seq, kv_head, cw.direct, cw.item.split);
#else
  (void)p;
  __trap();  // built for sm_90a only; the host checks the device before launching
#endif
}

}  // namespace

bool wgmma_extend_runs(const PagedExtendParams& params) noexcept {
  if (params.quant.fp8() || params.layout.head_dim != kHeadDim || !head_dim_compiled(kHeadDim)) {
    return false;  // (a build without head_dim 128 refuses it before any launch anyway)
  }
  // Without soft-cap the kernels' softmax takes the row maximum of the unscaled scores and
  // applies the scale in the exponential (Rows::softmax): right only for a positive scale. A zero
  // or negative sm_scale (finite, so valid, and of no use in a model) runs kFa2, which scales
  // each score first.
  if (!(params.logits_soft_cap > 0.0f) && !(params.sm_scale > 0.0f)) return false;
  try {
    return cuda::detail::wgmma_probe_supported();  // compute capability 9.0: the sm_90a code
  } catch (...) {
    return false;
  }
}

cudaError_t wgmma_extend_ctas_per_sm(bool pipelined, int* ctas) {
  return pipelined ? resident_ctas_per_sm(wgmma_extend_kernel<true, false, true>, kThreads,
                                          smem_bytes(kStagesOf<true>), ctas)
                   : resident_ctas_per_sm(wgmma_extend_kernel<true, false, false>, kThreads,
                                          smem_bytes(kStagesOf<false>), ctas);
}

cudaError_t wgmma_paged_extend(const PagedExtendParams& params, bool pipelined, int num_splits,
                               void* workspace, cudaStream_t stream) {
  const int heads = params.layout.num_kv_heads;
  const auto go = [&]<bool kPipelined>() {
    return wgmma_extend::dispatch(
        params, num_splits, workspace, [&]<bool kBf16, bool kSoftCap>(const Fa2Params& kp) {
          return wgmma_extend::launch_grid(wgmma_extend_kernel<kBf16, kSoftCap, kPipelined>,
                                           kThreads, smem_bytes(kStagesOf<kPipelined>), kp, kBf16,
                                           heads, params.num_seqs, stream);
        });
  };
  return pipelined ? go.template operator()<true>() : go.template operator()<false>();
}

}  // namespace pagedkv::kernels
