// kernels/internal/extend_fa2_tile.cuh: the per-CTA pieces of the FlashAttention-2-style paged
// extend kernels shared by the 16-bit kernel (kernels/extend_attention_fa2.cu, ExtendKernel::kFa2)
// and the FP8 one (kernels/extend_attention_fa2_fp8.cu, ExtendKernel::kFa2Fp8, whose K and V tiles
// are the 16-bit conversions of the codes in the same swizzled layout), for a tile of
// Fa2Shape<kHeadDim, kWarps>:
//   - fa2_load_q_tile / fa2_load_q_fragments: the query tile into shared memory (and, at head_dim
//     64, into A fragments held for the whole kernel);
//   - fa2_row_positions: the position each lane's accumulator rows attend up to;
//   - fa2_tile_scores: S = Q K^T of a warp's rows against the tile's keys (unscaled fp32), each K
//     fragment loaded with ldmatrix feeding every m16 block of the warp;
//   - fa2_softmax_maxima: the online softmax's new row maxima and rescale factors;
//   - fa2_tile_pv: O += P V, two adjacent 8-key score tiles packed as the A operand of one k16
//     step (decode_tc_layout.hpp's pv_a_source), each V fragment (ldmatrix .trans) feeding every
//     m16 block;
//   - fa2_write_rows: the epilogue, a lane's rows written directly or as split partials.
// Layouts and fragment maps are extend_fa2_layout.hpp's (host-tested). Internal to pagedkv::cuda.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "internal/decode_tc_layout.hpp"
#include "internal/extend_fa2_layout.hpp"
#include "internal/extend_fa2_params.cuh"
#include "internal/fast_exp2.cuh"
#include "internal/mma_sync.cuh"

namespace pagedkv::kernels {

// Q rows [row0, row0 + kRows) of the tile (packed token-major over the group) into the swizzled
// shared tile with 16-byte loads, unscaled; rows past q_len are zero.
template <int kHeadDim, int kWarps>
__device__ __forceinline__ void fa2_load_q_tile(uint4* q_tile, const fa2::Fa2Params& p,
                                                const fa2::SeqLens& lens, int row0, int kv_head,
                                                int tid) {
  using S = detail::Fa2Shape<kHeadDim, kWarps>;
#pragma unroll
  for (int i = 0; i < S::kQCopies; ++i) {
    const detail::MmaCoord c = detail::fa2_copy(tid, i, S::kChunks, S::kRowsPerPass);
    const int packed = row0 + c.row;
    const int token = packed / p.group;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (token < lens.q_len) {
      const std::int64_t at =
          (static_cast<std::int64_t>(lens.q_begin) + token) * p.q_stride_token +
          static_cast<std::int64_t>(kv_head * p.group + packed % p.group) * p.q_stride_head +
          c.col * 8;
      v = __ldg(reinterpret_cast<const uint4*>(p.q + at));
    }
    q_tile[detail::fa2_swizzled(c.row, c.col, S::kChunks)] = v;
  }
}

// The Q A fragments of warp `warp` for every head_dim step, from the Q tile at q_addr (used when
// S::kQInRegisters).
template <int kHeadDim, int kWarps, typename QFrag>
__device__ __forceinline__ void fa2_load_q_fragments(QFrag& qf, unsigned q_addr, int warp,
                                                     int lane) {
  using S = detail::Fa2Shape<kHeadDim, kWarps>;
#pragma unroll
  for (int ks = 0; ks < kHeadDim / 16; ++ks) {
#pragma unroll
    for (int mb = 0; mb < S::kMBlocks; ++mb) {
      ldmatrix_x4(qf[ks][mb], q_addr + 16 * detail::fa2_swizzled(
                                                detail::fa2_q_row(S::kRowsPerWarp, warp, mb, lane),
                                                detail::fa2_q_chunk(ks, lane), S::kChunks));
    }
  }
}

// row_pos[mb][h]: the last key position the rows of accumulator elements 2h, 2h + 1 of m16 block
// mb see (their token's position); -1 for padding rows past q_len.
template <int kHeadDim, int kWarps>
__device__ __forceinline__ void fa2_row_positions(
    int (&row_pos)[detail::Fa2Shape<kHeadDim, kWarps>::kMBlocks][2], int row0, int group,
    const fa2::SeqLens& lens, int warp, int lane) {
  using S = detail::Fa2Shape<kHeadDim, kWarps>;
#pragma unroll
  for (int mb = 0; mb < S::kMBlocks; ++mb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int token =
          (row0 + detail::fa2_acc_row(S::kRowsPerWarp, warp, mb, lane, 2 * h)) / group;
      row_pos[mb][h] = token < lens.q_len ? lens.prefix + token : -1;
    }
  }
}

// s = Q K^T for tile rows of warp `warp` (S = Fa2Shape<kHeadDim, kWarps>). qf: the Q A fragments
// when S::kQInRegisters, else unused (re-read from the Q tile at q_addr). k_addr: the shared
// address of the swizzled [kKeys][kChunks] K tile.
template <bool kBf16, int kHeadDim, int kWarps, typename QFrag>
__device__ __forceinline__ void fa2_tile_scores(
    float (&s)[detail::Fa2Shape<kHeadDim, kWarps>::kMBlocks]
              [detail::Fa2Shape<kHeadDim, kWarps>::kKeys / 8][4],
    const QFrag& qf, unsigned q_addr, unsigned k_addr, int warp, int lane) {
  using S = detail::Fa2Shape<kHeadDim, kWarps>;
  using O = MmaOps<kBf16>;
  constexpr int kC = S::kChunks;
  constexpr int kMB = S::kMBlocks;
#pragma unroll
  for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
    for (int n = 0; n < S::kKeys / 8; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) s[mb][n][c] = 0.0f;
    }
  }
#pragma unroll S::kKStepUnroll
  for (int ks = 0; ks < kHeadDim / 16; ++ks) {
    unsigned a[kMB][4];
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
      if constexpr (S::kQInRegisters) {
#pragma unroll
        for (int j = 0; j < 4; ++j) a[mb][j] = qf[ks][mb][j];
      } else {
        ldmatrix_x4(a[mb], q_addr + 16 * detail::fa2_swizzled(
                                             detail::fa2_q_row(S::kRowsPerWarp, warp, mb, lane),
                                             detail::fa2_q_chunk(ks, lane), kC));
      }
    }
#pragma unroll
    for (int nn = 0; nn < S::kKeys / 16; ++nn) {
      unsigned b[4];
      ldmatrix_x4(b, k_addr + 16 * detail::fa2_swizzled(nn * 16 + detail::qk_b_key(lane),
                                                        2 * ks + detail::qk_b_chunk(lane), kC));
#pragma unroll
      for (int mb = 0; mb < kMB; ++mb) {
        O::mma(s[mb][2 * nn], a[mb], b[0], b[1]);
        O::mma(s[mb][2 * nn + 1], a[mb], b[2], b[3]);
      }
    }
  }
}

// Calls fn(mb, n, c, col) for each score element s[mb][n][c] a lane holds, col its key's column
// in the tile (n * 8 + the element's C-fragment column).
template <int kMB, int kKeyTiles, typename Fn>
__device__ __forceinline__ void fa2_for_each_score(int lane, Fn&& fn) {
#pragma unroll
  for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
    for (int n = 0; n < kKeyTiles; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) fn(mb, n, c, n * 8 + detail::mma_c_coord(lane, c).col);
    }
  }
}

// The online softmax's maxima for a tile of masked log2-domain scores s: a row's columns live in
// the 4 lanes of its quad. Updates m_run, sets m_use (the maximum to subtract: 0 while a row has
// seen no visible key, so exp2f(-inf) stays 0) and alpha (2^(m_old - m_new), the factor for what
// was accumulated); returns whether any of this lane's row maxima moved.
// kLean (ExtendKernel::kFa2LeanSoftmax): the scores are not yet multiplied by `scale` (> 0, or 1
// where they are), so the tile maximum is scaled once per row here (the maximum of the scaled
// scores: rounding is monotonic), and alpha is exp2_ftz's.
template <bool kLean = false, int kMB, int kKeyTiles>
__device__ __forceinline__ bool fa2_softmax_maxima(const float (&s)[kMB][kKeyTiles][4],
                                                   float (&m_run)[kMB][2], float (&m_use)[kMB][2],
                                                   float (&alpha)[kMB][2], float scale = 1.0f) {
  bool moved = false;
#pragma unroll
  for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeyTiles; ++n) {
        tile_max = fmaxf(tile_max, fmaxf(s[mb][n][2 * h], s[mb][n][2 * h + 1]));
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(m_run[mb][h], kLean ? tile_max * scale : tile_max);
      m_use[mb][h] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[mb][h] =
          kLean ? exp2_ftz(m_run[mb][h] - m_use[mb][h]) : exp2f(m_run[mb][h] - m_use[mb][h]);
      moved = moved || m_new != m_run[mb][h];
      m_run[mb][h] = m_new;
    }
  }
  return moved;
}

// o += P V with P = s (the probabilities, rounded to the 16-bit type here). v_addr: the shared
// address of the swizzled [kKeys][kChunks] V tile.
template <bool kBf16, int kHeadDim, int kWarps>
__device__ __forceinline__ void fa2_tile_pv(
    float (&o)[detail::Fa2Shape<kHeadDim, kWarps>::kMBlocks][kHeadDim / 8][4],
    const float (&s)[detail::Fa2Shape<kHeadDim, kWarps>::kMBlocks]
                    [detail::Fa2Shape<kHeadDim, kWarps>::kKeys / 8][4],
    unsigned v_addr, int lane) {
  using S = detail::Fa2Shape<kHeadDim, kWarps>;
  using O = MmaOps<kBf16>;
  constexpr int kC = S::kChunks;
  constexpr int kMB = S::kMBlocks;
#pragma unroll
  for (int kk = 0; kk < S::kKeys / 16; ++kk) {
    unsigned pa[kMB][4];
#pragma unroll
    for (int mb = 0; mb < kMB; ++mb) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const detail::PvASource lo = detail::pv_a_source(2 * j);
        const detail::PvASource hi = detail::pv_a_source(2 * j + 1);
        pa[mb][j] = O::pack2(s[mb][2 * kk + lo.tile][lo.elem], s[mb][2 * kk + hi.tile][hi.elem]);
      }
    }
#pragma unroll
    for (int dd = 0; dd < kHeadDim / 16; ++dd) {
      unsigned b[4];
      ldmatrix_x4_trans(b,
                        v_addr + 16 * detail::fa2_swizzled(kk * 16 + detail::pv_b_key(lane),
                                                           2 * dd + detail::pv_b_chunk(lane), kC));
#pragma unroll
      for (int mb = 0; mb < kMB; ++mb) {
        O::mma(o[mb][2 * dd], pa[mb], b[0], b[1]);
        O::mma(o[mb][2 * dd + 1], pa[mb], b[2], b[3]);
      }
    }
  }
}

// The epilogue: this lane's rows of the tile, o x out_scale / l (0 for a row that saw no key),
// written to out (and lse, natural log) when the query tile used one split (direct), else as the
// split's normalized partial rows and log2-sum-exp2 in the workspace for the merge kernel.
template <bool kBf16, int kHeadDim, int kWarps>
__device__ __forceinline__ void fa2_write_rows(
    const fa2::Fa2Params& p,
    const float (&o)[detail::Fa2Shape<kHeadDim, kWarps>::kMBlocks][kHeadDim / 8][4],
    const float (&m_run)[detail::Fa2Shape<kHeadDim, kWarps>::kMBlocks][2],
    const float (&l_run)[detail::Fa2Shape<kHeadDim, kWarps>::kMBlocks][2], float out_scale,
    int row0, const fa2::SeqLens& lens, int seq, int kv_head, int split, bool direct, int warp,
    int lane) {
  using S = detail::Fa2Shape<kHeadDim, kWarps>;
  constexpr int kNTiles = kHeadDim / 8;
  const int quad_col = lane & 3;
#pragma unroll
  for (int mb = 0; mb < S::kMBlocks; ++mb) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mb][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int packed = row0 + detail::fa2_acc_row(S::kRowsPerWarp, warp, mb, lane, 2 * h);
      const int token = packed / p.group;
      if (token >= lens.q_len) continue;
      const int head = kv_head * p.group + packed % p.group;
      const float inv = l > 0.0f ? out_scale / l : 0.0f;
      const float lse2 = l > 0.0f ? m_run[mb][h] + log2f(l) : -INFINITY;
      if (direct) {
        const std::int64_t q_row = static_cast<std::int64_t>(lens.q_begin) + token;
        std::uint16_t* dst =
            p.out + q_row * p.out_stride_token + head * p.out_stride_head + quad_col * 2;
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
          *reinterpret_cast<unsigned*>(dst + n * 8) =
              MmaOps<kBf16>::pack2(o[mb][n][2 * h] * inv, o[mb][n][2 * h + 1] * inv);
        }
        if (p.lse != nullptr && quad_col == 0) {
          p.lse[q_row * p.num_q_heads + head] = l > 0.0f ? lse2 * fa2::kLn2 : -INFINITY;
        }
      } else {
        const std::int64_t state =
            detail::fa2_state(seq, token, head, split, p.max_q_len, p.num_q_heads, p.num_splits);
        float* dst = p.partial_out + state * kHeadDim + quad_col * 2;
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
          *reinterpret_cast<float2*>(dst + n * 8) =
              make_float2(o[mb][n][2 * h] * inv, o[mb][n][2 * h + 1] * inv);
        }
        if (quad_col == 0) p.partial_lse[state] = lse2;
      }
    }
  }
}

}  // namespace pagedkv::kernels
