// kernels/internal/extend_fa2_tile.cuh: the two GEMMs of one key tile of the FlashAttention-2-style
// paged extend kernels, shared by the 16-bit kernel (kernels/extend_attention_fa2.cu,
// ExtendKernel::kFa2) and the FP8 one (kernels/extend_attention_fa2_fp8.cu, ExtendKernel::kFa2Fp8,
// whose K and V tiles are the 16-bit conversions of the codes in the same swizzled layout):
//   - fa2_tile_scores: S = Q K^T of a warp's rows against the tile's keys (unscaled fp32), each K
//     fragment loaded with ldmatrix feeding every m16 block of the warp;
//   - fa2_tile_pv: O += P V, two adjacent 8-key score tiles packed as the A operand of one k16
//     step (decode_tc_layout.hpp's pv_a_source), each V fragment (ldmatrix .trans) feeding every
//     m16 block.
// Layouts and fragment maps are extend_fa2_layout.hpp's (host-tested). Internal to pagedkv::cuda.
#pragma once

#include "internal/decode_tc_layout.hpp"
#include "internal/extend_fa2_layout.hpp"
#include "internal/mma_sync.cuh"

namespace pagedkv::kernels {

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

}  // namespace pagedkv::kernels
