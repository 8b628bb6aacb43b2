// Tensor-core paged extend attention over an FP8 KV cache (ExtendKernel::kFa2Fp8, opt-in; contract
// in include/pagedkv/cuda/extend_attention.hpp, FP8 semantics in pagedkv/device/kv_quant.hpp,
// layouts in kernels/internal/extend_fa2_fp8_layout.hpp, checked on the host by
// tests/device/extend_fa2_fp8_layout_test.cpp).
//
// The geometry of the 16-bit FlashAttention-2-style kernel (kernels/extend_attention_fa2.cu,
// ExtendKernel::kFa2) with its 4-warp CTA: one (query tile, sequence, KV head, split); 32 query
// rows per warp (16 at head_dim 256) packed token-major over the GQA group; the tile's keys
// streamed through a 3-stage cp.async ring with the page offsets resolved ahead; the same split
// over keys, partial rows and merge kernel (fa2_merge_splits).
//
// What differs: the ring holds FP8 codes (keys x head_dim bytes per K or V tile, 16-byte copies)
// and, with per-(token, head) scales, the tile's K and V scales (4-byte copies in the same commit
// group). Once its copies of tile t have landed, each thread converts exactly the codes it copied
// (exactly: every E4M3 / E5M2 value is an fp16 and a bf16 value; kernels/internal/fp8_operand.cuh)
// into one 16-bit K tile and one 16-bit V tile in kFa2's swizzled layout, and after a CTA barrier
// kFa2's QK and PV GEMMs (kernels/internal/extend_fa2_tile.cuh) run on them unchanged. So a tile
// costs two barriers (ring hand-over, conversion visible), not one.
// Values are never multiplied by scales before the MMA (as DecodeKernel::kTensorCoreFp8):
//   - K: score column j is multiplied by k_scale[j] (per tensor: folded into the score scale);
//   - V: the row sum l uses the unscaled probability p; the PV operand is p x v_scale[j] / R, R the
//     largest V scale the CTA has seen (per tensor: R = v_scale and the operand is p), and the
//     output is multiplied by R once at the end; when R grows, the accumulators are rescaled by
//     R_old / R_new with the softmax's own rescale. Dividing by R keeps the 16-bit operand in
//     [0, 1] (per-row scales can be ~1e-5, which would underflow fp16 as p x v_scale).
// A key past the range, or whose block id is outside the pool, is zero-filled (never read) and
// masked out of the softmax (a per-stage key mask written when its copies are issued), as
// kernels/fp8_attention.cu skips it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "fp8_kernels.hpp"
#include "internal/cp_async.cuh"
#include "internal/decode_tc_fp8_layout.hpp"
#include "internal/decode_tc_host.hpp"
#include "internal/extend_fa2_fp8_layout.hpp"
#include "internal/extend_fa2_launch.hpp"
#include "internal/extend_fa2_layout.hpp"
#include "internal/extend_fa2_params.cuh"
#include "internal/extend_fa2_tile.cuh"
#include "internal/fp8_operand.cuh"
#include "internal/mma_sync.cuh"
#include "pagedkv/base/error.hpp"
#include "pagedkv/device/fp8.hpp"

namespace pagedkv::kernels {

namespace {

using detail::Fa2Fp8Shape;
using detail::MmaCoord;

using fa2::Fa2Params;
using fa2::seq_lens_of;
using fa2::SeqLens;

struct Fa2Fp8Params {
  Fa2Params base;  // page geometry in bytes; score_scale x k_scale per tensor
  const std::uint8_t* k_codes;
  const std::uint8_t* v_codes;
  std::int64_t scale_offset;  // > 0: per-(token, head) scales; 0: per tensor
  std::int32_t num_kv_heads;
  float v_scale;  // per tensor: R, the output's factor (per row: unused)
  bool e5m2;
};

// Converts thread tid's own copies of a code tile (K or V) into the swizzled 16-bit tile.
template <bool kBf16, bool kE5M2, int kHeadDim>
__device__ __forceinline__ void convert_own(const std::uint8_t* codes, uint4* half_tile, int tid) {
  using S = Fa2Fp8Shape<kHeadDim>;
#pragma unroll
  for (int i = 0; i < S::kCodeCopies; ++i) {
    const MmaCoord c = detail::fa2_fp8_copy(tid, i, S::kThreads, S::kFp8Chunks);
    const uint4 in = *reinterpret_cast<const uint4*>(codes + 16 * (tid + i * S::kThreads));
    uint4 lo;
    uint4 hi;
    fp8x16_to_operands<kBf16, kE5M2>(in, &lo, &hi);
    // The 8 threads of a store phase hold chunks c8 .. c8 + 7 of a row (4 + 4 rows apart at
    // head_dim 64): those with bit 2 of c8 set store their odd chunk first, so one phase's 8
    // chunks fall into 8 different 16-byte bank groups after the swizzle (2-way conflicts else).
    const int first = (c.col >> 2) & 1;
    half_tile[detail::fa2_fp8_half_chunk(c.row, c.col, first, S::kChunks)] = first ? hi : lo;
    half_tile[detail::fa2_fp8_half_chunk(c.row, c.col, 1 - first, S::kChunks)] = first ? lo : hi;
  }
}

template <bool kBf16, int kHeadDim>
__device__ __forceinline__ void convert_own(const std::uint8_t* codes, uint4* half_tile, int tid,
                                            bool e5m2) {
  if (e5m2) {
    convert_own<kBf16, true, kHeadDim>(codes, half_tile, tid);
  } else {
    convert_own<kBf16, false, kHeadDim>(codes, half_tile, tid);
  }
}

template <bool kBf16, int kHeadDim, bool kSoftCap>
__global__ void __launch_bounds__(Fa2Fp8Shape<kHeadDim>::kThreads,
                                  Fa2Fp8Shape<kHeadDim>::kMinCtasPerSm)
    fa2_fp8_extend_kernel(const Fa2Fp8Params fp) {
  using S = Fa2Fp8Shape<kHeadDim>;
  using T = typename S::Tile;
  constexpr int kWarps = detail::kFa2Fp8Warps;
  constexpr int kKeys = S::kKeys;
  constexpr int kStages = S::kStages;
  constexpr int kMB = T::kMBlocks;
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kNTiles = kHeadDim / 8;
  constexpr int kKeyTiles = kKeys / 8;
  const Fa2Params& p = fp.base;
  extern __shared__ uint4 smem[];
  auto* const bytes = reinterpret_cast<unsigned char*>(smem);
  uint4* q_tile = smem;                                             // [kRows][kC], swizzled
  auto* k_half = reinterpret_cast<uint4*>(bytes + S::kHalfOffset);  // [kKeys][kC], swizzled
  uint4* v_half = k_half + T::kKVChunks;
  std::uint8_t* code_ring = bytes + S::kRingOffset;                      // [stage][K, V codes]
  auto* scale_ring = reinterpret_cast<float*>(bytes + S::kScaleOffset);  // [stage][K, V]
  auto* code_table = reinterpret_cast<std::int64_t*>(bytes + S::kCodeTableOffset);
  auto* scale_table = reinterpret_cast<std::int64_t*>(bytes + S::kScaleTableOffset);
  auto* masks = reinterpret_cast<std::uint32_t*>(bytes + S::kMaskOffset);
  const unsigned q_addr = static_cast<unsigned>(__cvta_generic_to_shared(q_tile));
  const unsigned k_addr = static_cast<unsigned>(__cvta_generic_to_shared(k_half));
  const unsigned v_addr = static_cast<unsigned>(__cvta_generic_to_shared(v_half));

  // ---- what this CTA covers (kFa2's work items) ----
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
  const int key_first = geo.kv_begin + split.first * kKeys;
  const int tiles = split.last - split.first;
  const bool per_row = fp.scale_offset > 0;

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int quad_col = lane & 3;

  const fa2::Fa2KeyPages pages = fa2::fa2_key_pages(p, seq, kv_head, key_first, geo.kv_end, tiles);
  // Code and scale offsets of tile t's keys into slot fa2_slot(t): one thread per key.
  const auto resolve = [&](int t) {
    if (tid < kKeys) {
      detail::TcFp8TokenOffsets off{-1, -1};
      if (t < tiles) {
        off =
            detail::tc_fp8_token_offsets(pages.page, fp.scale_offset, fp.num_kv_heads, kv_head,
                                         pages.table_row, key_first + t * kKeys + tid, geo.kv_end);
      }
      const int at = detail::fa2_slot(t, kStages) * kKeys + tid;
      code_table[at] = off.code;
      scale_table[at] = off.scale;
    }
  };
  // Copies of tile t's codes (and scales) into its stage, and its key mask; one commit group.
  const auto issue = [&](int t) {
    if (t < tiles) {
      const int stage = detail::fa2_slot(t, kStages);
      std::uint8_t* k_dst = code_ring + stage * 2 * S::kCodeTileBytes;
      std::uint8_t* v_dst = k_dst + S::kCodeTileBytes;
      const std::int64_t* codes = code_table + stage * kKeys;
#pragma unroll
      for (int i = 0; i < S::kCodeCopies; ++i) {
        const MmaCoord c = detail::fa2_fp8_copy(tid, i, S::kThreads, S::kFp8Chunks);
        const std::int64_t off = codes[c.row];
        const bool fill = off >= 0;
        const int at = 16 * (tid + i * S::kThreads);
        cp_async_16(k_dst + at, fill ? fp.k_codes + off + c.col * 16 : fp.k_codes, fill);
        cp_async_16(v_dst + at, fill ? fp.v_codes + off + c.col * 16 : fp.v_codes, fill);
      }
      if (per_row && tid < kKeys) {
        const std::int64_t off = scale_table[stage * kKeys + tid];
        float* k_scales = scale_ring + stage * 2 * kKeys;
        cp_async_4(k_scales + tid, off >= 0 ? fp.k_codes + off : fp.k_codes, off >= 0);
        cp_async_4(k_scales + kKeys + tid, off >= 0 ? fp.v_codes + off : fp.v_codes, off >= 0);
      }
      if (warp == 0) {  // kKeys <= 32: warp 0's lanes cover the tile's keys
        const unsigned mask = __ballot_sync(0xffffffffu, lane < kKeys && codes[lane] >= 0);
        if (lane == 0) masks[stage] = mask;
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int t = 0; t < kStages; ++t) resolve(t);
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) issue(t);

  // Q (overlapping the copies in flight), unscaled.
  fa2_load_q_tile<kHeadDim, kWarps>(q_tile, p, lens, geo.row0, kv_head, tid);
  __syncthreads();
  [[maybe_unused]] unsigned qf[T::kQInRegisters ? kKSteps : 1][kMB][4];
  if constexpr (T::kQInRegisters) fa2_load_q_fragments<kHeadDim, kWarps>(qf, q_addr, warp, lane);

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
  // The V scale reference R (see the top): per tensor fixed, per row the running maximum.
  float r_run = per_row ? 0.0f : fp.v_scale;

  for (int t = 0; t < tiles; ++t) {
    cp_async_wait<detail::fa2_wait_groups(kStages)>();  // this thread's copies of tile t landed
    // Every thread's copies of tile t landed (and its scales and mask are visible); every warp is
    // done with tile t - 1 (its 16-bit tiles, scales and mask; its stage is written next).
    __syncthreads();
    issue(detail::fa2_issue_tile(t, kStages));
    resolve(detail::fa2_resolve_tile(t, kStages));  // slot of tile t: its copies left long ago
    const int stage = detail::fa2_slot(t, kStages);
    const std::uint8_t* k_codes = code_ring + stage * 2 * S::kCodeTileBytes;
    convert_own<kBf16, kHeadDim>(k_codes, k_half, tid, fp.e5m2);
    convert_own<kBf16, kHeadDim>(k_codes + S::kCodeTileBytes, v_half, tid, fp.e5m2);
    __syncthreads();  // the 16-bit tiles visible to every warp
    const float* k_scales = scale_ring + stage * 2 * kKeys;
    const float* v_scales = k_scales + kKeys;
    const std::uint32_t key_mask = masks[stage];
    const int key0 = key_first + t * kKeys;

    float s[kMB][kKeyTiles][4];
    fa2_tile_scores<kBf16, kHeadDim, kWarps>(s, qf, q_addr, k_addr, warp, lane);

    // Scale (x the key's K scale), soft-cap, masks (causal / window / end on the tiles that cross
    // them; keys without a page on the tiles that have one).
    float col_scale[kKeyTiles][2];
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        col_scale[n][e] =
            per_row ? k_scales[n * 8 + quad_col * 2 + e] * p.score_scale : p.score_scale;
      }
    }
    const bool need_mask = detail::extend_tile_needs_mask(geo, key0, kKeys, p.window_size) ||
                           key0 + kKeys > geo.kv_end ||
                           key_mask != detail::fa2_fp8_full_mask(kKeys);
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float x = s[mb][n][c] * col_scale[n][c & 1];  // into the log2 domain
          if constexpr (kSoftCap) x = p.cap_log2 * tanhf(x);
          const int in_tile = n * 8 + detail::mma_c_coord(lane, c).col;
          const int key = key0 + in_tile;
          if (need_mask && (!detail::extend_key_visible(row_pos[mb][c >> 1], key, p.window_size) ||
                            !detail::fa2_fp8_key_present(key_mask, in_tile))) {
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

    // Online softmax.
    float m_use[kMB][2];
    float alpha[kMB][2];
    const bool moved = fa2_softmax_maxima(s, m_run, m_use, alpha);
    // The V scales of this lane's columns over R; R_old / R_new when R grew (uniform over the
    // CTA: every quad sees all of the tile's keys).
    float v_weight[kKeyTiles][2];
    const float rescale = per_row ? fp8_v_weights(v_scales, quad_col, r_run, v_weight) : 1.0f;
    if (__any_sync(0xffffffffu, moved) || rescale != 1.0f) {
#pragma unroll
      for (int mb = 0; mb < kMB; ++mb) {
        l_run[mb][0] *= alpha[mb][0];
        l_run[mb][1] *= alpha[mb][1];
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
          for (int c = 0; c < 4; ++c) o[mb][n][c] *= alpha[mb][c >> 1] * rescale;
        }
      }
    }
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float prob = exp2f(s[mb][n][c] - m_use[mb][c >> 1]);
          l_run[mb][c >> 1] += prob;
          s[mb][n][c] = per_row ? prob * v_weight[n][c & 1] : prob;
        }
      }
    }

    // O += (P x V scale / R) V.
    fa2_tile_pv<kBf16, kHeadDim, kWarps>(o, s, v_addr, lane);
  }
  cp_async_wait<0>();  // nothing may be in flight when the CTA exits

  // ---- epilogue: this lane's rows (x R), directly or as a split partial ----
  fa2_write_rows<kBf16, kHeadDim, kWarps>(p, o, m_run, l_run, r_run, geo.row0, lens, seq, kv_head,
                                          item.split, direct, warp, lane);
}

constexpr const char* kWho = "paged_extend_attention (CUDA, FP8 tensor cores)";

template <bool kBf16, int kHeadDim, bool kSoftCap>
cudaError_t launch(Fa2Fp8Params fp, int num_kv_heads, int num_seqs, cudaStream_t stream) {
  using S = Fa2Fp8Shape<kHeadDim>;
  const auto kernel = fa2_fp8_extend_kernel<kBf16, kHeadDim, kSoftCap>;
  // Set on every launch: cheap, per device, and allowed while a graph is being captured.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(S::kSmemBytes));
  if (err != cudaSuccess) return err;
  fp.base.rows = S::kRows;
  fp.base.keys = S::kKeys;
  const std::int64_t tiles =
      (static_cast<std::int64_t>(fp.base.max_q_len) * fp.base.group + S::kRows - 1) / S::kRows;
  if (tiles == 0) return cudaSuccess;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(num_kv_heads), static_cast<unsigned>(num_seqs),
                        static_cast<unsigned>(tiles * fp.base.num_splits));
  config.blockDim = dim3(S::kThreads);
  config.dynamicSmemBytes = S::kSmemBytes;
  config.stream = stream;
  err = cudaLaunchKernelEx(&config, kernel, fp);
  if (err != cudaSuccess) return err;
  return fa2_merge_splits(fp.base, kBf16, kHeadDim, num_seqs, stream);
}

}  // namespace

bool tc_fp8_extend_supported(const KVLayout& layout) noexcept {
  return detail::tc_fp8_strides_ok(layout.stride_block, layout.stride_token, layout.stride_head);
}

cudaError_t tc_fp8_paged_extend(const PagedExtendParams& params, int num_splits, void* workspace,
                                cudaStream_t stream) {
  const KVLayout& layout = params.layout;
  Fa2Fp8Params fp{};
  fp.base = fa2::make_fa2_params(params, num_splits, workspace);
  fp.k_codes = static_cast<const std::uint8_t*>(params.k_cache);
  fp.v_codes = static_cast<const std::uint8_t*>(params.v_cache);
  const bool per_row = params.quant.mode == KVScaleMode::kPerTokenHead;
  fp.scale_offset = per_row ? layout.scale_offset : 0;
  fp.num_kv_heads = layout.num_kv_heads;
  fp.v_scale = per_row ? 1.0f : params.quant.v_scale;
  fp.e5m2 = params.quant.format() == Fp8Format::kE5M2;
  if (!per_row) fp.base.score_scale *= params.quant.k_scale;
  return dispatch_tc_decode(params.dtype, layout.head_dim, fp.base.cap_log2 > 0.0f, kWho,
                            [&]<bool kBf16, int kHeadDim, bool kSoftCap>() {
                              return launch<kBf16, kHeadDim, kSoftCap>(fp, layout.num_kv_heads,
                                                                       params.num_seqs, stream);
                            });
}

cudaError_t tc_fp8_extend_ctas_per_sm(KVDtype dtype, int head_dim, int* ctas) {
  // The soft-cap instantiation uses the same shared memory and block size.
  return dispatch_tc_decode(
      dtype, head_dim, false, kWho, [&]<bool kBf16, int kHeadDim, bool kSoftCap>() {
        return resident_ctas_per_sm(fa2_fp8_extend_kernel<kBf16, kHeadDim, kSoftCap>,
                                    Fa2Fp8Shape<kHeadDim>::kThreads,
                                    Fa2Fp8Shape<kHeadDim>::kSmemBytes, ctas);
      });
}

}  // namespace pagedkv::kernels
