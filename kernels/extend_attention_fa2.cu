// FlashAttention-2-style paged extend attention (ExtendKernel::kFa2; contract in
// include/pagedkv/cuda/extend_attention.hpp, layouts and schedules in
// kernels/internal/extend_fa2_layout.hpp, checked on the host by
// tests/device/extend_fa2_layout_test.cpp). Issue 35, step A.
//
// CTA = kWarps warps (4, or 2 for short prompts) = one (query tile, sequence, KV head, split).
// Query rows are packed token-major over the GQA group, as the default kernel's. Each warp owns
// 32 rows (two m16 blocks; 16 at head_dim 256), so every K and V fragment loaded with ldmatrix
// feeds two mma.sync.m16n8k16 (fp16 / bf16 in, fp32 accumulate).
//   Q       loaded once with 16-byte loads into a swizzled shared tile, unscaled: the fp32
//           scores are multiplied by the score scale (sm_scale x log2 e, or sm_scale / cap with a
//           soft-cap) as they leave the MMA. (Folding the scale into Q and rounding it back to 16
//           bits moved the log-sum-exp by about 1e-3, past the tests' tolerance, on the first GPU
//           run.) At head_dim 64 the A fragments then stay in registers; above, they are re-read
//           with ldmatrix.
//   K/V     tiles of kKeys keys stream through a 3-stage cp.async ring (one commit group per
//           tile, one CTA barrier per tile). The page offsets of each key are resolved from the
//           block table two tiles before the tile's copies are issued (one thread per key) into a
//           shared-memory slot, so issuing a copy is a shared load plus an add; a key past the
//           range or with a block id outside the pool is zero-filled, never read.
//   softmax online, in registers, per row; the output rescale is skipped when no row maximum of
//           the warp moved. Only key tiles crossing the causal diagonal or the window edge (or
//           the range's end) are masked. Soft-cap: cap x log2 e x tanh(score).
//   split   over keys (grid z = query tiles x splits, heaviest tile first): split s of a query
//           tile covers a contiguous run of its key tiles; with more than one active split each
//           writes normalized partial rows and their log2-sum-exp2 to the caller's workspace and
//           fa2_merge_kernel combines them (the decode variant's merge formula).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "internal/cp_async.cuh"
#include "internal/extend_fa2_launch.hpp"
#include "internal/extend_fa2_layout.hpp"
#include "internal/extend_fa2_params.cuh"
#include "internal/extend_fa2_tile.cuh"
#include "internal/fast_exp2.cuh"
#include "internal/head_dims.hpp"
#include "internal/mma_sync.cuh"
#include "pagedkv/base/error.hpp"

namespace pagedkv::kernels {

namespace {

using detail::Fa2Shape;
using detail::MmaCoord;

using fa2::Fa2Params;
using fa2::kLn2;
using fa2::seq_lens_of;
using fa2::SeqLens;

// kLean (ExtendKernel::kFa2LeanSoftmax, opt-in until a GPU run proves it): the wgmma kernels'
// softmax (kernels/internal/wgmma_extend_rows.cuh) on kFa2's tiles. Without soft-cap the scores
// stay unscaled until the exponential, which takes scale x score - m as one FFMA (needs
// score_scale > 0: extend_kernel_runs sends the rest to kFa2); the mask runs on its own branch,
// only on tiles that need it, not as a select on every score of every tile; exponentials flush
// denormal results (exp2_ftz: one MUFU.EX2 where exp2f takes a range test and two multiplies).
template <bool kBf16, int kHeadDim, int kWarps, bool kSoftCap, bool kLean>
__global__ void __launch_bounds__(Fa2Shape<kHeadDim, kWarps>::kThreads,
                                  Fa2Shape<kHeadDim, kWarps>::kMinCtasPerSm)
    fa2_extend_kernel(const Fa2Params p) {
  using S = Fa2Shape<kHeadDim, kWarps>;
  constexpr int kC = S::kChunks;
  constexpr int kKeys = S::kKeys;
  constexpr int kStages = S::kStages;
  constexpr int kMB = S::kMBlocks;
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kNTiles = kHeadDim / 8;
  constexpr int kKeyTiles = kKeys / 8;
  extern __shared__ uint4 smem[];
  uint4* q_tile = smem;              // [kRows][kC], swizzled
  uint4* ring = smem + S::kQChunks;  // [stage][K: kKeys][kC], [V: kKeys][kC]
  auto* offsets =
      reinterpret_cast<std::int64_t*>(ring + 2 * kStages * S::kKVChunks);  // [slot][kKeys]
  const unsigned q_addr = static_cast<unsigned>(__cvta_generic_to_shared(q_tile));
  const unsigned ring_addr = static_cast<unsigned>(__cvta_generic_to_shared(ring));

  // ---- what this CTA covers ----
  const int kv_head = static_cast<int>(blockIdx.x);
  const int seq = static_cast<int>(blockIdx.y);
  const SeqLens lens = seq_lens_of(p, seq);
  const int num_tiles = detail::extend_num_tiles(lens.q_len, p.group, S::kRows);
  const detail::Fa2WorkItem item =
      detail::fa2_work_item(static_cast<int>(blockIdx.z), num_tiles, p.num_splits);
  if (item.tile < 0) return;  // uniform over the CTA
  const detail::Fa2TileWork work = detail::fa2_tile_work(
      lens.q_len, lens.prefix, p.group, p.window_size, item.tile, S::kRows, kKeys, p.num_splits);
  if (item.split >= work.active) return;
  const detail::Fa2SplitTiles split = detail::fa2_split_tiles(work, item.split);
  const bool direct = work.active == 1;
  const detail::ExtendTileGeometry& geo = work.geo;
  const int key_first = geo.kv_begin + split.first * kKeys;  // first key of the split
  const int tiles = split.last - split.first;

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;

  const fa2::Fa2KeyPages pages = fa2::fa2_key_pages(p, seq, kv_head, key_first, geo.kv_end, tiles);
  // Offsets of tile `t`'s keys into slot fa2_slot(t): one thread per key.
  const auto resolve = [&](int t) { pages.resolve<kKeys, kStages>(offsets, t, tid); };
  // Copies of tile `t` into its stage from its offset slot; always one commit group.
  const auto issue = [&](int t) {
    if (t < tiles) {
      const int stage = detail::fa2_slot(t, kStages);
      uint4* k_dst = ring + stage * 2 * S::kKVChunks;
      uint4* v_dst = k_dst + S::kKVChunks;
      const std::int64_t* slot = offsets + stage * kKeys;
#pragma unroll
      for (int i = 0; i < S::kCopiesPerTile; ++i) {
        const MmaCoord c = detail::fa2_copy(tid, i, kC, S::kRowsPerPass);
        const std::int64_t off = slot[c.row];
        const bool fill = off >= 0;
        const int at = detail::fa2_swizzled(c.row, c.col, kC);
        cp_async_16(k_dst + at, fill ? p.k_cache + off + c.col * 8 : p.k_cache, fill);
        cp_async_16(v_dst + at, fill ? p.v_cache + off + c.col * 8 : p.v_cache, fill);
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int t = 0; t < kStages; ++t) resolve(t);
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) issue(t);

  // Q (overlapping the K/V copies in flight), unscaled.
  fa2_load_q_tile<kHeadDim, kWarps>(q_tile, p, lens, geo.row0, kv_head, tid);
  __syncthreads();
  [[maybe_unused]] unsigned qf[S::kQInRegisters ? kKSteps : 1][kMB][4];
  if constexpr (S::kQInRegisters) fa2_load_q_fragments<kHeadDim, kWarps>(qf, q_addr, warp, lane);

  // ---- per-lane row state: element c of m16 block mb is row fa2_acc_row(warp, mb, lane, c) ----
  int row_pos[kMB][2];  // visible keys are <= row_pos; -1 for padding rows
  fa2_row_positions<kHeadDim, kWarps>(row_pos, geo.row0, p.group, lens, warp, lane);
  float o[kMB][kNTiles][4];
#pragma unroll
  for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) o[mb][n][c] = 0.0f;
    }
  }
  float m_run[kMB][2];
  float l_run[kMB][2];
#pragma unroll
  for (int mb = 0; mb < kMB; ++mb) {
    m_run[mb][0] = m_run[mb][1] = -INFINITY;
    l_run[mb][0] = l_run[mb][1] = 0.0f;
  }

  for (int t = 0; t < tiles; ++t) {
    cp_async_wait<detail::fa2_wait_groups(kStages)>();
    __syncthreads();  // tile t visible to all; every warp is done with tile t - 1's stage
    issue(detail::fa2_issue_tile(t, kStages));
    resolve(detail::fa2_resolve_tile(t, kStages));  // slot of tile t: its copies left long ago
    const int stage = detail::fa2_slot(t, kStages);
    const unsigned k_addr = ring_addr + stage * 2 * S::kKVChunks * 16;
    const unsigned v_addr = k_addr + S::kKVChunks * 16;
    const int key0 = key_first + t * kKeys;

    // S = Q K^T (unscaled; scaled below, in fp32): each K fragment feeds both m16 blocks.
    float s[kMB][kKeyTiles][4];
    fa2_tile_scores<kBf16, kHeadDim, kWarps>(s, qf, q_addr, k_addr, warp, lane);

    // Scale, soft-cap, masks (masks only on tiles that cross the diagonal, the window edge or
    // the end).
    const bool need_mask = detail::extend_tile_needs_mask(geo, key0, kKeys, p.window_size) ||
                           key0 + kKeys > geo.kv_end;
    // What the exponential still multiplies by: the score scale for kLean without soft-cap.
    const float exp_scale = kLean && !kSoftCap ? p.score_scale : 1.0f;
    if constexpr (kLean) {
      fa2_for_each_score<kMB, kKeyTiles>(lane, [&](int mb, int n, int c, int col) {
        if constexpr (kSoftCap) s[mb][n][c] = p.cap_log2 * tanhf(s[mb][n][c] * p.score_scale);
#ifdef PAGEDKV_TEST_DROP_KEY
        // Test-only build (tests/cuda/broken_kernel_test.cpp): one key position left out.
        if (key0 + col == PAGEDKV_TEST_DROP_KEY) s[mb][n][c] = -INFINITY;
#endif
      });
      if (need_mask) {  // uniform over the CTA: most tiles of a long prompt skip every test
        fa2_for_each_score<kMB, kKeyTiles>(lane, [&](int mb, int n, int c, int col) {
          if (!detail::extend_key_visible(row_pos[mb][c >> 1], key0 + col, p.window_size)) {
            s[mb][n][c] = -INFINITY;
          }
        });
      }
    } else {
#pragma unroll
      for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
        for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            float x = s[mb][n][c] * p.score_scale;  // into the log2 domain
            if constexpr (kSoftCap) x = p.cap_log2 * tanhf(x);
            const int key = key0 + n * 8 + detail::mma_c_coord(lane, c).col;
            if (need_mask && !detail::extend_key_visible(row_pos[mb][c >> 1], key, p.window_size)) {
              x = -INFINITY;
            }
#ifdef PAGEDKV_TEST_DROP_KEY
            // Test-only build (tests/cuda/broken_kernel_test.cpp): one key position left out.
            if (key == PAGEDKV_TEST_DROP_KEY) x = -INFINITY;
#endif
            s[mb][n][c] = x;
          }
        }
      }
    }

    // Online softmax.
    float m_use[kMB][2];
    float alpha[kMB][2];
    const bool moved = fa2_softmax_maxima<kLean>(s, m_run, m_use, alpha, exp_scale);
    if (__any_sync(0xffffffffu, moved)) {  // else every alpha of the warp is 1
#pragma unroll
      for (int mb = 0; mb < kMB; ++mb) {
        l_run[mb][0] *= alpha[mb][0];
        l_run[mb][1] *= alpha[mb][1];
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
          for (int c = 0; c < 4; ++c) o[mb][n][c] *= alpha[mb][c >> 1];
        }
      }
    }
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[mb][n][c] = kLean ? exp2_ftz(fmaf(s[mb][n][c], exp_scale, -m_use[mb][c >> 1]))
                              : exp2f(s[mb][n][c] - m_use[mb][c >> 1]);
          l_run[mb][c >> 1] += s[mb][n][c];
        }
      }
    }

    // O += P V: two adjacent 8-key score tiles are the A operand of one k16 step; each V
    // fragment feeds both m16 blocks.
    fa2_tile_pv<kBf16, kHeadDim, kWarps>(o, s, v_addr, lane);
  }
  cp_async_wait<0>();  // nothing may be in flight when the CTA exits

  // ---- epilogue: this lane's rows, directly or as a split partial ----
  fa2_write_rows<kBf16, kHeadDim, kWarps>(p, o, m_run, l_run, 1.0f, geo.row0, lens, seq, kv_head,
                                          item.split, direct, warp, lane);
}

// Combines the split partials of each (sequence, new token, query head) whose query tile used
// more than one split: out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M), lse = M + log2(sum).
// blockDim = (kHeadDim / 4, kMergeRows).
constexpr int kMergeRows = 4;

template <bool kBf16, int kHeadDim>
__global__ void __launch_bounds__(kHeadDim / 4 * kMergeRows)
    fa2_merge_kernel(const Fa2Params p, std::int64_t num_rows) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kMergeRows + threadIdx.y;
  if (row >= num_rows) return;
  const int q_head = static_cast<int>(row % p.num_q_heads);
  const std::int64_t seq_token = row / p.num_q_heads;
  const int token = static_cast<int>(seq_token % p.max_q_len);
  const int seq = static_cast<int>(seq_token / p.max_q_len);
  const SeqLens lens = seq_lens_of(p, seq);
  if (token >= lens.q_len) return;
  const int packed = token * p.group + q_head % p.group;
  const detail::Fa2TileWork work =
      detail::fa2_tile_work(lens.q_len, lens.prefix, p.group, p.window_size, packed / p.rows,
                            p.rows, p.keys, p.num_splits);
  if (work.active <= 1) return;  // written directly by the attention kernel
  const std::int64_t state0 =
      detail::fa2_state(seq, token, q_head, 0, p.max_q_len, p.num_q_heads, p.num_splits);
  float m_all = -INFINITY;
  for (int s = 0; s < work.active; ++s)
    m_all = detail::fa2_merge_max(m_all, p.partial_lse[state0 + s]);
  const float m_ref = m_all == -INFINITY ? 0.0f : m_all;
  float weight_sum = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const int d = static_cast<int>(threadIdx.x) * 4;
  for (int s = 0; s < work.active; ++s) {
    const float w = exp2f(p.partial_lse[state0 + s] - m_ref);  // 0 for a split that saw no key
    weight_sum += w;
    const float4 part =
        *reinterpret_cast<const float4*>(p.partial_out + (state0 + s) * kHeadDim + d);
    acc.x = fmaf(w, part.x, acc.x);
    acc.y = fmaf(w, part.y, acc.y);
    acc.z = fmaf(w, part.z, acc.z);
    acc.w = fmaf(w, part.w, acc.w);
  }
  const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
  const std::int64_t q_row = static_cast<std::int64_t>(lens.q_begin) + token;
  uint2 packed2;
  packed2.x = MmaOps<kBf16>::pack2(acc.x * inv, acc.y * inv);
  packed2.y = MmaOps<kBf16>::pack2(acc.z * inv, acc.w * inv);
  *reinterpret_cast<uint2*>(p.out + q_row * p.out_stride_token + q_head * p.out_stride_head + d) =
      packed2;
  if (p.lse != nullptr && d == 0) {
    p.lse[q_row * p.num_q_heads + q_head] =
        weight_sum > 0.0f ? (m_ref + log2f(weight_sum)) * kLn2 : -INFINITY;
  }
}

template <bool kBf16, int kHeadDim>
cudaError_t launch_merge(const Fa2Params& kp, int num_seqs, cudaStream_t stream) {
  const std::int64_t rows = static_cast<std::int64_t>(num_seqs) * kp.max_q_len * kp.num_q_heads;
  cudaLaunchConfig_t merge{};
  merge.gridDim = dim3(static_cast<unsigned>((rows + kMergeRows - 1) / kMergeRows));
  merge.blockDim = dim3(kHeadDim / 4, kMergeRows);
  merge.stream = stream;
  return cudaLaunchKernelEx(&merge, fa2_merge_kernel<kBf16, kHeadDim>, kp, rows);
}

template <bool kBf16, int kHeadDim, int kWarps, bool kSoftCap, bool kLean>
cudaError_t launch(Fa2Params kp, int num_kv_heads, int num_seqs, cudaStream_t stream) {
  using S = Fa2Shape<kHeadDim, kWarps>;
  const auto kernel = fa2_extend_kernel<kBf16, kHeadDim, kWarps, kSoftCap, kLean>;
  // Set on every launch: cheap, per device, and allowed while a graph is being captured.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(S::kSmemBytes));
  if (err != cudaSuccess) return err;
  kp.rows = S::kRows;
  kp.keys = S::kKeys;
  const std::int64_t tiles =
      (static_cast<std::int64_t>(kp.max_q_len) * kp.group + S::kRows - 1) / S::kRows;
  if (tiles == 0) return cudaSuccess;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(num_kv_heads), static_cast<unsigned>(num_seqs),
                        static_cast<unsigned>(tiles * kp.num_splits));
  config.blockDim = dim3(S::kThreads);
  config.dynamicSmemBytes = S::kSmemBytes;
  config.stream = stream;
  err = cudaLaunchKernelEx(&config, kernel, kp);
  if (err != cudaSuccess || kp.num_splits == 1) return err;
  return launch_merge<kBf16, kHeadDim>(kp, num_seqs, stream);
}

template <typename Fn>
cudaError_t dispatch(KVDtype dtype, int head_dim, int warps, bool soft_cap, bool lean, Fn&& fn) {
  const bool bf16 = dtype == KVDtype::kBFloat16;
  const auto by_lean = [&]<bool kBf16, int kHeadDim, int kWarps, bool kSoftCap>() {
    return lean ? fn.template operator()<kBf16, kHeadDim, kWarps, kSoftCap, true>()
                : fn.template operator()<kBf16, kHeadDim, kWarps, kSoftCap, false>();
  };
  const auto by_cap = [&]<bool kBf16, int kHeadDim, int kWarps>() {
    return soft_cap ? by_lean.template operator()<kBf16, kHeadDim, kWarps, true>()
                    : by_lean.template operator()<kBf16, kHeadDim, kWarps, false>();
  };
  const auto by_warps = [&]<bool kBf16, int kHeadDim>() {
    return warps == 2 ? by_cap.template operator()<kBf16, kHeadDim, 2>()
                      : by_cap.template operator()<kBf16, kHeadDim, 4>();
  };
  const auto by_dtype = [&]<int kHeadDim>() {
    return bf16 ? by_warps.template operator()<true, kHeadDim>()
                : by_warps.template operator()<false, kHeadDim>();
  };
  switch (head_dim) {
#if PAGEDKV_CUDA_HEAD_DIM_64
    case 64:
      return by_dtype.template operator()<64>();
#endif
#if PAGEDKV_CUDA_HEAD_DIM_128
    case 128:
      return by_dtype.template operator()<128>();
#endif
#if PAGEDKV_CUDA_HEAD_DIM_256
    case 256:
      return by_dtype.template operator()<256>();
#endif
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  "paged_extend_attention (CUDA, FA2 variant): " + head_dim_error(head_dim));
  }
}

}  // namespace

cudaError_t fa2_paged_extend(const PagedExtendParams& params, int num_splits, void* workspace,
                             cudaStream_t stream, bool lean_softmax) {
  const KVLayout& layout = params.layout;
  const Fa2Params kp = fa2::make_fa2_params(params, num_splits, workspace);
  return dispatch(params.dtype, layout.head_dim, detail::fa2_warps(params.max_q_len, kp.group),
                  kp.cap_log2 > 0.0f, lean_softmax,
                  [&]<bool kBf16, int kHeadDim, int kWarps, bool kSoftCap, bool kLean>() {
                    return launch<kBf16, kHeadDim, kWarps, kSoftCap, kLean>(
                        kp, layout.num_kv_heads, params.num_seqs, stream);
                  });
}

cudaError_t fa2_merge_splits(const fa2::Fa2Params& kp, bool bf16, int head_dim, int num_seqs,
                             cudaStream_t stream) {
  if (kp.num_splits <= 1 || num_seqs <= 0 || kp.max_q_len <= 0) return cudaSuccess;
  switch (head_dim) {
#if PAGEDKV_CUDA_HEAD_DIM_64
    case 64:
      return bf16 ? launch_merge<true, 64>(kp, num_seqs, stream)
                  : launch_merge<false, 64>(kp, num_seqs, stream);
#endif
#if PAGEDKV_CUDA_HEAD_DIM_128
    case 128:
      return bf16 ? launch_merge<true, 128>(kp, num_seqs, stream)
                  : launch_merge<false, 128>(kp, num_seqs, stream);
#endif
#if PAGEDKV_CUDA_HEAD_DIM_256
    case 256:
      return bf16 ? launch_merge<true, 256>(kp, num_seqs, stream)
                  : launch_merge<false, 256>(kp, num_seqs, stream);
#endif
    default:
      throw Error(ErrorCode::kInvalidArgument, "fa2_merge_splits: " + head_dim_error(head_dim));
  }
}

cudaError_t fa2_extend_ctas_per_sm(KVDtype dtype, int head_dim, int warps, bool lean_softmax,
                                   int* ctas) {
  // The soft-cap instantiation uses the same shared memory and block size.
  return dispatch(dtype, head_dim, warps, false, lean_softmax,
                  [&]<bool kBf16, int kHeadDim, int kWarps, bool kSoftCap, bool kLean>() {
                    using S = Fa2Shape<kHeadDim, kWarps>;
                    const auto kernel = fa2_extend_kernel<kBf16, kHeadDim, kWarps, kSoftCap, kLean>;
                    cudaError_t err =
                        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(S::kSmemBytes));
                    int resident = 0;
                    if (err == cudaSuccess) {
                      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                          &resident, kernel, S::kThreads, S::kSmemBytes);
                    }
                    if (err != cudaSuccess) return err;
                    *ctas = resident > 0 ? resident : 1;
                    return cudaSuccess;
                  });
}

}  // namespace pagedkv::kernels
