// kernels/internal/wgmma_extend_rows.cuh: one warpgroup's 64 query rows of the warpgroup-MMA
// paged extend kernels (kernels/extend_attention_wgmma.cu, ExtendKernel::kWgmma and
// kWgmmaPipelined; kernels/extend_attention_wgmma_ws.cu, kWgmmaWarpSpecialized): the online
// softmax state in registers (O accumulators, running maxima and sums), the two GEMMs of a 64-key
// tile issued on Hopper's wgmma, the softmax on the score accumulators, P packed as the PV GEMM's
// A operand, and the epilogue (the output rows directly, or a split's partial rows for kFa2's
// merge). The kernels own the K/V ring and its synchronization; this holds what a warpgroup does
// with a tile once its K and V are in shared memory. Included only by sources compiled for sm_90a
// alone (the CMake object library pagedkv_cuda_sm90a); internal to pagedkv::cuda.
//
// Layouts (kernels/internal/wgmma_layout.hpp): the CTA's Q tile (128 rows) and each K stage are
// 128-byte-swizzled K-major tiles, each V stage N-major; the warpgroup's rows are 64 g .. 64 g + 63
// of the Q tile. A thread's accumulators follow wgmma's D fragment: its two rows h = 0, 1
// (wgmma_d_coord(wt, 2 h).row), a row's 64 keys spread over the 4 lanes of a quad.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "internal/extend_fa2_params.cuh"
#include "internal/extend_wgmma_grid.cuh"
#include "internal/extend_wgmma_schedule.hpp"
#include "internal/mma_sync.cuh"
#include "internal/wgmma.cuh"
#include "internal/wgmma_layout.hpp"

namespace pagedkv::kernels::wgmma_extend {

inline constexpr int kScores = kKeys / 2;   // score accumulators per thread (m64n64)
inline constexpr int kOut = kHeadDim / 2;   // output accumulators per thread (m64n128)
inline constexpr int kPSteps = kKeys / 16;  // k steps of the PV GEMM
using PFragments = unsigned[kPSteps][4];    // P as the PV GEMM's A operand, per k step

// P's registers pinned around the PV GEMM that reads them (the packing must not move between
// wgmma.fence and the MMA, nor the next packing before the wait: PTX ISA, wgmma.fence).
__device__ __forceinline__ void fence_p(PFragments& pa) {
#pragma unroll
  for (int kk = 0; kk < kPSteps; ++kk) wgmma::reg_fence(pa[kk]);
}

// run_pipelined's turns when the warpgroups do not take turns issuing GEMMs.
struct NoTurns {
  __device__ __forceinline__ void begin(int) const {}
  __device__ __forceinline__ void end(int) const {}
};

template <bool kBf16, bool kSoftCap>
struct Rows {
  const fa2::Fa2Params& p;
  const detail::ExtendTileGeometry& geo;
  int wg;           // warpgroup whose rows these are: rows 64 wg .. 64 wg + 63 of the Q tile
  int wt;           // thread within the warpgroup
  int row_pos[2];   // position of the thread's rows in the sequence, -1 past q_len
  int tile_row[2];  // the rows within the Q tile
  float o[kOut];
  float m_run[2];
  float l_run[2];

  __device__ __forceinline__ Rows(const fa2::Fa2Params& params, const fa2::SeqLens& lens,
                                  const detail::ExtendTileGeometry& g, int warpgroup, int thread)
      : p(params), geo(g), wg(warpgroup), wt(thread) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_row[h] = 64 * wg + detail::wgmma_d_coord(wt, 2 * h).row;
      const int token = (geo.row0 + tile_row[h]) / p.group;
      row_pos[h] = token < lens.q_len ? lens.prefix + token : -1;
    }
#pragma unroll
    for (int j = 0; j < kOut; ++j) o[j] = 0.0f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.0f;
  }

  // S = Q K^T over 8 k steps (two 64-column blocks of 4), issued (no fence, commit or wait).
  // q_addr: the Q tile (q_rows rows); k_addr: the K stage.
  __device__ __forceinline__ void issue_qk(float (&s)[kScores], std::uint32_t q_addr, int q_rows,
                                           std::uint32_t k_addr) const {
    const std::uint64_t q0 = detail::wgmma_kmajor_step_desc(q_addr, q_rows, wg, 0);
    const std::uint64_t k0 = detail::wgmma_kmajor_step_desc(k_addr, kKeys, 0, 0);
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      wgmma::ss_m64n64<kBf16>(s, detail::wgmma_kmajor_step_desc_from(q0, q_rows, ks),
                              detail::wgmma_kmajor_step_desc_from(k0, kKeys, ks), ks > 0 ? 1 : 0);
    }
  }

  // O += P V over 4 k steps of 16 keys, issued. v_addr: the V stage.
  __device__ __forceinline__ void issue_pv(const PFragments& pa, std::uint32_t v_addr) {
    const std::uint64_t v0 = detail::wgmma_v_step_desc(v_addr, kKeys, 0);
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      const std::uint64_t vd = detail::wgmma_v_step_desc_from(v0, kk);
      wgmma::rs_m64n128_trans_b<kBf16>(o, pa[kk], vd, 1);
    }
  }

  // The online softmax of one tile's scores (keys key0 ..): soft-cap, mask, the new row
  // maxima, the rescale factor alpha of what came before, l rescaled (and O too with kRescaleO;
  // a pipelined caller whose O is still being written by the previous tile's PV GEMM rescales
  // it after the wait, rescale_o), s turned into exp2(scale s - m) and added to l. Returns
  // whether any row maximum of the warp moved (O needs the rescale only then). Without soft-cap
  // the scores stay unscaled until the exponential, which takes scale s - m as one FFMA: the row
  // maximum of the raw scores times the scale is the maximum of the scaled ones (rounding is
  // monotonic), so m, alpha and l are those of the scaled scores, one multiply per score fewer.
  // That needs a positive scale (a masked -inf score times 0 is NaN, a negative scale turns the
  // maximum into the minimum): wgmma_extend_runs sends sm_scale <= 0 without soft-cap to kFa2.
  // With soft-cap the scale goes in before the tanh, as the reference has it.
  template <bool kRescaleO>
  __device__ __forceinline__ bool softmax(float (&s)[kScores], int key0, float (&alpha)[2]) {
    const bool need_mask = detail::extend_tile_needs_mask(geo, key0, kKeys, p.window_size) ||
                           key0 + kKeys > geo.kv_end;
    const float scale = kSoftCap ? 1.0f : p.score_scale;  // what the exponential still applies
    if constexpr (kSoftCap) {
#pragma unroll
      for (int j = 0; j < kScores; ++j) s[j] = p.cap_log2 * tanhf(s[j] * p.score_scale);
    }
    // The mask on its own branch (uniform over the warpgroup): a tile with every key visible to
    // every row, most tiles of a long prompt, runs none of its per-score tests.
    if (need_mask) {
#pragma unroll
      for (int j = 0; j < kScores; ++j) {
        const int key = key0 + detail::wgmma_d_coord(wt, j).col;
        if (!detail::extend_key_visible(row_pos[(j >> 1) & 1], key, p.window_size)) {
          s[j] = -INFINITY;
        }
      }
    }
#ifdef PAGEDKV_TEST_DROP_KEY
#pragma unroll
    for (int j = 0; j < kScores; ++j) {
      if (key0 + detail::wgmma_d_coord(wt, j).col == PAGEDKV_TEST_DROP_KEY) s[j] = -INFINITY;
    }
#endif

    float m_use[2];
    bool moved = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        tile_max = fmaxf(tile_max, fmaxf(s[4 * n + 2 * h], s[4 * n + 2 * h + 1]));
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(m_run[h], tile_max * scale);
      m_use[h] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[h] = wgmma::exp2_ftz(m_run[h] - m_use[h]);
      moved = moved || m_new != m_run[h];
      m_run[h] = m_new;
    }
    const bool any_moved = __any_sync(0xffffffffu, moved);
    if (any_moved) {
      l_run[0] *= alpha[0];
      l_run[1] *= alpha[1];
      if constexpr (kRescaleO) rescale_o(alpha);
    }
#pragma unroll
    for (int j = 0; j < kScores; ++j) {
      s[j] = wgmma::exp2_ftz(fmaf(s[j], scale, -m_use[(j >> 1) & 1]));
      l_run[(j >> 1) & 1] += s[j];
    }
    return any_moved;
  }

  __device__ __forceinline__ void rescale_o(const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < kOut; ++j) o[j] *= alpha[(j >> 1) & 1];
  }

  // P (16-bit) as the A operand of the PV GEMM, from the exponentiated scores.
  __device__ __forceinline__ static void pack_p(const float (&s)[kScores], PFragments& pa) {
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        pa[kk][r] = MmaOps<kBf16>::pack2(s[detail::wgmma_p_source(kk, r, 0)],
                                         s[detail::wgmma_p_source(kk, r, 1)]);
      }
    }
  }

  // The pipelined loop (ExtendKernel::kWgmmaPipelined and the consumers of kWgmmaWarpSpecialized)
  // over a CTA's `tiles` key tiles, keys key_first ..: iteration t issues tile t's S GEMM and then
  // the PV GEMM of tile wgmma_pv_tile(t, true) (t - 1), waits for the first only, runs tile t's
  // softmax while the PV GEMM runs, waits for it, rescales O and packs P; the last tile's PV GEMM
  // after the loop. The kernels differ only in how a tile becomes readable and its stage is handed
  // back: begin_tile(t) runs before tile t's S GEMM (the CTA ring's wait, barrier and next copies;
  // or the wait on the stage's full barrier), release(u) once this warpgroup's reads of tile u's
  // stage are complete (after its PV GEMM; never for the last tile). k_addr_of(t): tile t's K stage
  // (V at + v_offset). turns.begin(k) / turns.end(k) bracket the k-th of the tiles + 1 points
  // where GEMMs are issued (the warp-specialized kernel's ping-pong between its consumers,
  // kernels/internal/wgmma_ws_ring.hpp; NoTurns elsewhere). Uniform over the warpgroup;
  // tiles == 0 does nothing.
  template <typename BeginTile, typename StageAddr, typename Release, typename Turns = NoTurns>
  __device__ __forceinline__ void run_pipelined(int tiles, int key_first, std::uint32_t q_addr,
                                                int q_rows, std::uint32_t v_offset,
                                                BeginTile&& begin_tile, StageAddr&& k_addr_of,
                                                Release&& release, Turns&& turns = Turns{}) {
    if (tiles <= 0) return;
    float s[kScores];
    PFragments pa;  // P of the tile before the one being scored
    float alpha[2];
    begin_tile(0);
    turns.begin(0);
    wgmma::reg_fence(s);
    wgmma::fence();
    issue_qk(s, q_addr, q_rows, k_addr_of(0));
    wgmma::commit();
    turns.end(0);
    wgmma::wait_all();
    wgmma::reg_fence(s);
    (void)softmax<false>(s, key_first, alpha);  // O is still zero
    pack_p(s, pa);
    for (int t = 1; t < tiles; ++t) {
      begin_tile(t);
      turns.begin(t);
      wgmma::reg_fence(s);
      wgmma::reg_fence(o);
      fence_p(pa);
      wgmma::fence();
      issue_qk(s, q_addr, q_rows, k_addr_of(t));
      wgmma::commit();
      const int pv_tile = detail::wgmma_pv_tile(t, true);
      issue_pv(pa, k_addr_of(pv_tile) + v_offset);
      wgmma::commit();
      turns.end(t);
      wgmma::wait<1>();  // S of tile t done; the PV GEMM may still run
      wgmma::reg_fence(s);
      const bool any_moved = softmax<false>(s, key_first + t * kKeys, alpha);
      // The exponentials under the PV GEMM, not after its wait (ptxas would sink them).
      wgmma::compute_before_wait(l_run[0] + l_run[1], q_addr);
      wgmma::wait<0>();
      wgmma::reg_fence(o);
      fence_p(pa);
      release(pv_tile);  // its K (S GEMM, an iteration ago) and V (PV GEMM, just now) are read
      if (any_moved) rescale_o(alpha);
      pack_p(s, pa);
    }
    turns.begin(tiles);
    wgmma::reg_fence(o);
    fence_p(pa);
    wgmma::fence();
    issue_pv(pa, k_addr_of(detail::wgmma_pv_tile(tiles, true)) + v_offset);
    wgmma::commit();
    turns.end(tiles);
    wgmma::wait_all();
    wgmma::reg_fence(o);
  }

  // The thread's two rows: written directly (direct: the query tile had one active split), or as
  // split `split`'s normalized partial rows and log2-sum-exp2 for fa2_merge_splits.
  __device__ __forceinline__ void epilogue(const fa2::SeqLens& lens, int seq, int kv_head,
                                           bool direct, int split) {
    const int quad_col = wt & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int packed = geo.row0 + tile_row[h];
      const int token = packed / p.group;
      if (token >= lens.q_len) continue;
      const int head = kv_head * p.group + packed % p.group;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const float lse2 = l > 0.0f ? m_run[h] + log2f(l) : -INFINITY;
      if (direct) {
        const std::int64_t q_row = static_cast<std::int64_t>(lens.q_begin) + token;
        std::uint16_t* dst =
            p.out + q_row * p.out_stride_token + head * p.out_stride_head + quad_col * 2;
#pragma unroll
        for (int n = 0; n < kHeadDim / 8; ++n) {
          *reinterpret_cast<unsigned*>(dst + n * 8) =
              MmaOps<kBf16>::pack2(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
        }
        if (p.lse != nullptr && quad_col == 0) {
          p.lse[q_row * p.num_q_heads + head] = l > 0.0f ? lse2 * fa2::kLn2 : -INFINITY;
        }
      } else {
        const std::int64_t state =
            detail::fa2_state(seq, token, head, split, p.max_q_len, p.num_q_heads, p.num_splits);
        float* dst = p.partial_out + state * kHeadDim + quad_col * 2;
#pragma unroll
        for (int n = 0; n < kHeadDim / 8; ++n) {
          *reinterpret_cast<float2*>(dst + n * 8) =
              make_float2(o[4 * n + 2 * h] * inv, o[4 * n + 2 * h + 1] * inv);
        }
        if (quad_col == 0) p.partial_lse[state] = lse2;
      }
    }
  }
};

}  // namespace pagedkv::kernels::wgmma_extend
