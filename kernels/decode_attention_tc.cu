// Tensor-core paged decode attention (DecodeKernel::kTensorCore; contract in
// include/pagedkv/cuda/decode_attention.hpp, layouts in kernels/internal/decode_tc_layout.hpp).
//
// CTA = 4 warps = one (sequence, KV head, split), as the default kernel. The GQA group's query
// heads are the M dimension (16 rows, padded with zero rows) of mma.sync.m16n8k16 (fp16 / bf16
// in, fp32 accumulate); q lives in A fragments in registers for the whole kernel. Keys come in
// 64-token tiles; warp w owns keys [16 w, 16 w + 16) of every tile and runs its own pipeline: its
// K and V slices stream through a kStages-deep ring in shared memory (16-byte cp.async, K and V in
// separate commit groups, so QK waits only for K), with no CTA barrier inside the loop. Per tile
// and warp: QK^T = 2 x head_dim / 16 MMAs (K through ldmatrix.x4 from a swizzled slice), the
// scores scaled into the log2 domain (soft-cap: a compile-time branch), the running max / sum
// updated (the output rescale skipped when no row maximum moved), the probabilities packed in
// registers into the A operand of P x V (head_dim / 8 MMAs, V through ldmatrix.x4.trans). Every
// loop bound is a compile-time constant (head_dim, stages, copies per lane). Templates: dtype,
// head_dim, soft-cap on/off. The group size is not a template argument: the MMA always computes
// 16 rows, and the group only decides which rows get q (the rest are zero) and which are written,
// so no loop runs over heads. The block size is not either: block-table lookups happen one tile
// ahead (below), off the copies' critical path.
//
// Several query tokens per sequence (PagedDecodeParams::q_len > 1, speculative decoding;
// template argument kMultiQuery, so the q_len = 1 instantiations are the code they were): the
// group's query heads times the query tokens are the M dimension, row r = token r / group, head
// r % group, group x q_len <= 16 rows. The CTA's key range is the union of the tokens' ranges (the
// window widened by q_len - 1); each row masks the keys after its own position (and before its
// window), so token i sees one key more than token i - 1. A row may see no key of a chunk (the
// last chunk ends before an early token's position, or the first begins after a late token's
// window): its partial result is 0 with log2-sum-exp2 -inf, which every merge weighs 0.
//
// Page offsets: lanes 0..15 of a warp resolve the block-table entries of the warp's slice one
// tile before its copies are issued (and kStages - 1 tiles before it is used) and keep them in a
// shared-memory table, so issuing a copy is a shared load plus an add. A token past the range or
// with a block id outside the pool is zero-filled (never read from global memory) and masked.
//
// At the end each warp's running state (m, l per row, O) goes through shared memory (the K/V ring
// is reused) and the CTA merges the four warps once; the result is written directly (one split)
// or as a normalized partial output + log2-sum-exp2 for the merge kernel (split-KV), which is the
// same formula as kernels/decode_attention.cu's and launched with programmatic dependent launch.
//
// DecodeKernel::kTensorCoreWideMerge (the default) runs the same attention kernel (template
// argument kWideMerge: a griddepcontrol.wait before its first read, since it is itself launched
// with programmatic stream serialization, and a griddepcontrol.launch_dependents right after, so
// the merge grid launches while it runs) with a one-wave plan, and a merge kernel with one CTA
// per (sequence, query head) whose threads split the splits (tc_wide_merge_kernel below): the
// old merge's serial chain of 2 x num_splits dependent loads per thread dominated batch-1 decode
// (H200, batch 1, 4,096 tokens: 22.5 us -> 11.0 us; bench/results/gpu.md).
//
// DecodeKernel::kTensorCoreFusedMerge (opt-in) runs the same attention kernel as the wide merge
// (TcDecodeMerge::kFused: the same programmatic launch and one-wave plan) and no merge kernel:
// after writing its partials each CTA of a split state arrives on the state's counter, and the last
// one merges the group's query heads (kernels/internal/decode_fused_merge.cuh), so the merge
// starts when the state's last chunk ends instead of after the whole grid has drained.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "internal/cp_async.cuh"
#include "internal/decode_fused_merge.cuh"
#include "internal/decode_tc_host.hpp"
#include "internal/decode_tc_launch.hpp"
#include "internal/decode_tc_layout.hpp"
#include "internal/decode_wide_merge.cuh"
#include "internal/mma_sync.cuh"
#include "pagedkv/base/error.hpp"

namespace pagedkv::kernels {

namespace {

using detail::kTcRows;
using detail::kTcThreads;
using detail::kTcWarps;
using detail::kTcWarpTokens;
using detail::TcDecodeShape;

constexpr float kLog2e = 1.4426950408889634f;
constexpr const char* kWho = "paged_decode_attention (CUDA, tensor cores)";

struct TcParams {
  const std::uint16_t* q;  // [num_seqs, q_len, num_q_heads, head_dim]
  std::int64_t q_stride_seq;
  std::int64_t q_stride_head;
  const std::uint16_t* k_cache;
  const std::uint16_t* v_cache;
  detail::TcPageGeometry page;  // head_offset 0; the kernel adds its KV head's
  std::int64_t stride_head;
  std::int32_t num_kv_heads;
  std::int32_t num_q_heads;
  std::int32_t group;
  const std::int32_t* block_table;  // [num_seqs, max_blocks_per_seq]
  std::int32_t max_blocks_per_seq;
  const std::int32_t* seq_lens;
  std::uint16_t* out;
  std::int64_t out_stride_seq;
  std::int64_t out_stride_head;
  float score_scale;         // sm_scale x log2(e); with a soft-cap sm_scale / cap
  float cap_log2;            // cap x log2(e) (soft-cap instantiations only)
  std::int32_t window_size;  // of the CTA's key range: the tokens' window widened by q_len - 1
  std::int32_t num_splits;
  std::int32_t chunk;
  float* partial_out;        // [num_seqs, q_len, num_q_heads, num_splits, head_dim]
  float* partial_lse;        // [num_seqs, q_len, num_q_heads, num_splits]
  unsigned* split_counters;  // [num_seqs, num_kv_heads] (kFused with split-KV only)
  // Several query tokens per sequence (kMultiQuery; last, so that the fields above keep the
  // parameter offsets they had).
  std::int64_t q_stride_token;
  std::int64_t out_stride_token;
  std::int32_t row_window;  // of one query token
  std::int32_t q_len;       // query tokens per sequence (1 unless kMultiQuery)
  std::int32_t rows;        // group x q_len <= 16: the M rows that hold queries
};

__device__ __forceinline__ detail::TcSplitRange range_of(const TcParams& p, int seq, int split) {
  const std::int64_t capacity = static_cast<std::int64_t>(p.max_blocks_per_seq) * p.page.block_size;
  return detail::tc_split_range(__ldg(p.seq_lens + seq), capacity, p.window_size, p.num_splits,
                                p.chunk, split);
}

// kMerge (internal/decode_tc_launch.hpp): kSerial and kWide are merged by a second kernel
// (tc_merge_kernel, tc_wide_merge_kernel), kFused by each state's last CTA; kWide and kFused are
// launched with programmatic stream serialization. kMultiQuery: q_len > 1 (above).
template <bool kBf16, int kHeadDim, bool kSoftCap, TcDecodeMerge kMerge, bool kMultiQuery>
__global__ void __launch_bounds__(kTcThreads, TcDecodeShape<kHeadDim>::kMinCtasPerSm)
    tc_decode_kernel(const TcParams p) {
  constexpr bool kWideMerge = kMerge != TcDecodeMerge::kSerial;  // launched programmatically
  using S = TcDecodeShape<kHeadDim>;
  using Ops = MmaOps<kBf16>;
  constexpr int kChunks = S::kChunks;
  constexpr int kStages = S::kStages;
  constexpr int kKSteps = kHeadDim / 16;  // QK MMAs per key tile of 8, over head_dim
  constexpr int kNTiles = kHeadDim / 8;   // PV output tiles
  extern __shared__ uint4 smem[];

  const std::int64_t item = blockIdx.x;
  const int split = static_cast<int>(item % p.num_splits);
  const std::int64_t seq_head = item / p.num_splits;
  const int kv_head = static_cast<int>(seq_head % p.num_kv_heads);
  const int seq = static_cast<int>(seq_head / p.num_kv_heads);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kWideMerge) {
    // kTensorCoreWideMerge is launched with programmatic stream serialization: the CTAs may be
    // resident before the previous kernel in the stream has finished (its launch latency
    // hidden); nothing it wrote (q, K/V, the block table, seq_lens) is read before this wait.
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
  }
#endif
  const detail::TcSplitRange range = range_of(p, seq, split);
  if (split >= range.num_active_splits) return;  // uniform over the CTA
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kWideMerge) {
    // kTensorCoreWideMerge: let the merge grid launch now (its CTAs wait in griddepcontrol.wait
    // until this grid has completed and its writes are visible), so its launch is not on the
    // critical path; kTensorCoreFusedMerge: the next kernel in the stream, likewise. A CTA that
    // returned above counts as triggered.
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  }
#endif
  const bool direct = range.num_active_splits == 1;
  const int range_len = range.end - range.begin;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int tig = lane & 3;
  uint4* ring = smem + warp * kStages * 2 * S::kSliceChunks;  // [stage][K slice, V slice]
  std::int64_t* offsets =
      reinterpret_cast<std::int64_t*>(smem + kTcWarps * kStages * 2 * S::kSliceChunks) +
      warp * kStages * kTcWarpTokens;  // [stage][16]
  const unsigned ring_addr = static_cast<unsigned>(__cvta_generic_to_shared(ring));

  // q as A fragments (rows past the group are zero).
  unsigned qf[kKSteps][4];
  const std::uint16_t* q_base =
      p.q + seq * p.q_stride_seq + static_cast<std::int64_t>(kv_head) * p.group * p.q_stride_head;
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const detail::MmaCoord c = detail::mma_a_coord(lane, 2 * j);
      if constexpr (kMultiQuery) {
        // Row r: query token r / group, head r % group of the KV head's group.
        qf[ks][j] = c.row < p.rows ? __ldg(reinterpret_cast<const unsigned*>(
                                         q_base + (c.row / p.group) * p.q_stride_token +
                                         (c.row % p.group) * p.q_stride_head + ks * 16 + c.col))
                                   : 0u;
      } else {
        qf[ks][j] = c.row < p.group ? __ldg(reinterpret_cast<const unsigned*>(
                                          q_base + c.row * p.q_stride_head + ks * 16 + c.col))
                                    : 0u;
      }
    }
  }
  // kMultiQuery: the keys each of this lane's two rows (lane / 4 and lane / 4 + 8) sees,
  // relative to the range's begin: [row_lo, row_hi). Token i of a sequence of len keys sits at
  // len - q_len + i. Rows past the queries take the last token's keys (they are never written).
  [[maybe_unused]] int row_lo[2] = {0, 0};
  [[maybe_unused]] int row_hi[2] = {range_len, range_len};
  if constexpr (kMultiQuery) {
    const int len =
        detail::tc_clamped_len(__ldg(p.seq_lens + seq),
                               static_cast<std::int64_t>(p.max_blocks_per_seq) * p.page.block_size);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const detail::TcRowKeys keys = detail::tc_row_keys(len, p.q_len, p.group, p.rows,
                                                         p.row_window, (lane >> 2) + 8 * r, range);
      row_lo[r] = keys.lo;
      row_hi[r] = keys.hi;
    }
  }

  float o[kNTiles][4];
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) o[n][c] = 0.0f;
  }
  float m_run[2] = {-INFINITY, -INFINITY};  // rows lane / 4 and lane / 4 + 8
  float l_run[2] = {0.0f, 0.0f};            // this lane's part of the row sums

  detail::TcPageGeometry geo = p.page;
  geo.head_offset = kv_head * p.stride_head;
  const std::int32_t* table_row =
      p.block_table + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;
  const int tiles = detail::tc_warp_tiles(range_len, warp);

  // Offsets of the warp's slice of `tile` into table slot `slot`.
  const auto resolve = [&](int tile, int slot) {
    if (lane < kTcWarpTokens) {
      offsets[slot * kTcWarpTokens + lane] =
          tile < tiles ? detail::tc_token_offset(
                             geo, table_row,
                             range.begin + detail::tc_slice_begin(tile, warp) + lane, range.end)
                       : -1;
    }
  };
  // Copies of the warp's slice of `tile` into `stage` (offsets already in slot `stage`); always
  // commits two groups (K, then V) so the group counts stay uniform.
  const auto issue = [&](int tile, int stage) {
    uint4* k_slice = ring + stage * 2 * S::kSliceChunks;
    uint4* v_slice = k_slice + S::kSliceChunks;
    const std::int64_t* slot = offsets + stage * kTcWarpTokens;
    if (tile < tiles) {
#pragma unroll
      for (int i = 0; i < S::kCopiesPerLane; ++i) {
        const detail::MmaCoord c = detail::slice_copy(lane, i, kChunks);
        const std::int64_t off = slot[c.row];
        const bool fill = off >= 0;
        cp_async_16(k_slice + detail::swizzled_chunk(c.row, c.col, kChunks),
                    fill ? p.k_cache + off + c.col * 8 : p.k_cache, fill);
      }
    }
    cp_async_commit();
    if (tile < tiles) {
#pragma unroll
      for (int i = 0; i < S::kCopiesPerLane; ++i) {
        const detail::MmaCoord c = detail::slice_copy(lane, i, kChunks);
        const std::int64_t off = slot[c.row];
        const bool fill = off >= 0;
        cp_async_16(v_slice + detail::swizzled_chunk(c.row, c.col, kChunks),
                    fill ? p.v_cache + off + c.col * 8 : p.v_cache, fill);
      }
    }
    cp_async_commit();
  };

#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) resolve(t, detail::tc_slot(t, kStages));
  __syncwarp();
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) issue(t, detail::tc_slot(t, kStages));
  resolve(kStages - 1, detail::tc_slot(kStages - 1, kStages));

  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = detail::tc_slot(tile, kStages);
    // K of `tile` landed (its V and the later tiles may still be in flight); the previous
    // tile's stage is no longer read by any lane; the offsets resolved last iteration visible.
    cp_async_wait<detail::tc_k_wait_groups(kStages)>();
    __syncwarp();
    const int next = detail::tc_issue_tile(tile, kStages);
    issue(next, detail::tc_slot(next, kStages));
    const int ahead = detail::tc_resolve_tile(tile, kStages);
    resolve(ahead, detail::tc_slot(ahead, kStages));  // == stage: tile's copies left long ago

    const unsigned k_addr = ring_addr + stage * 2 * S::kSliceChunks * 16;
    const unsigned v_addr = k_addr + S::kSliceChunks * 16;

    // S = Q K^T for the slice's 16 keys: two 16 x 8 tiles.
    float s[2][4];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int c = 0; c < 4; ++c) s[t][c] = 0.0f;
    }
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      unsigned b[4];
      ldmatrix_x4(b,
                  k_addr + 16 * detail::swizzled_chunk(detail::qk_b_key(lane),
                                                       2 * ks + detail::qk_b_chunk(lane), kChunks));
      Ops::mma(s[0], qf[ks], b[0], b[1]);
      Ops::mma(s[1], qf[ks], b[2], b[3]);
    }

    // Scores in the log2 domain, masked past the range; row maxima over the quad.
    const int valid = range_len - detail::tc_slice_begin(tile, warp);
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int key = t * 8 + detail::mma_c_coord(lane, c).col;
        float v;
        if constexpr (kSoftCap) {
          v = p.cap_log2 * tanhf(s[t][c] * p.score_scale);
        } else {
          v = s[t][c] * p.score_scale;
        }
#ifdef PAGEDKV_TEST_DROP_KEY
        // Test-only build (tests/cuda/broken_kernel_test.cpp): one key position left out.
        const bool dropped =
            range.begin + detail::tc_slice_begin(tile, warp) + key == PAGEDKV_TEST_DROP_KEY;
#else
        constexpr bool dropped = false;
#endif
        if constexpr (kMultiQuery) {
          const int rel = detail::tc_slice_begin(tile, warp) + key;
          v = rel < row_hi[c >> 1] && rel >= row_lo[c >> 1] && !dropped ? v : -INFINITY;
        } else {
          v = key < valid && !dropped ? v : -INFINITY;
        }
        s[t][c] = v;
        tile_max[c >> 1] = fmaxf(tile_max[c >> 1], v);
      }
    }
    float m_use[2];
    bool moved = false;
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m_run[r], tile_max[r]);
      // Until a valid key is seen m stays -inf; subtracting 0 then keeps exp2f(-inf) = 0.
      m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = exp2f(m_run[r] - m_use[r]);
      moved = moved || m_new != m_run[r];
      m_run[r] = m_new;
    }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int r = 0; r < 2; ++r) l_run[r] *= alpha[r];
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
        for (int c = 0; c < 4; ++c) o[n][c] *= alpha[c >> 1];
      }
    }
    // P = 2^(S - m), packed in registers into the PV A operand (decode_tc_layout.hpp).
    float prob[2][4];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        prob[t][c] = exp2f(s[t][c] - m_use[c >> 1]);
        l_run[c >> 1] += prob[t][c];
      }
    }
    unsigned pa[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const detail::PvASource lo = detail::pv_a_source(2 * j);
      const detail::PvASource hi = detail::pv_a_source(2 * j + 1);
      pa[j] = Ops::pack2(prob[lo.tile][lo.elem], prob[hi.tile][hi.elem]);
    }

    // O += P V.
    cp_async_wait<detail::tc_v_wait_groups(kStages)>();
    __syncwarp();
#pragma unroll
    for (int dd = 0; dd < kHeadDim / 16; ++dd) {
      unsigned b[4];
      ldmatrix_x4_trans(
          b, v_addr + 16 * detail::swizzled_chunk(detail::pv_b_key(lane),
                                                  2 * dd + detail::pv_b_chunk(lane), kChunks));
      Ops::mma(o[2 * dd], pa, b[0], b[1]);
      Ops::mma(o[2 * dd + 1], pa, b[2], b[3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring: reused as merge scratch below

  // Row sums over the quad, then each warp's state to shared memory.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  float* scratch = reinterpret_cast<float*>(smem);               // [warp][16][kScratchStride]
  float* ml = scratch + kTcWarps * kTcRows * S::kScratchStride;  // [warp][m x 16, l x 16]
  float* own = scratch + warp * kTcRows * S::kScratchStride;
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const detail::MmaCoord at = detail::mma_c_coord(lane, c);
      own[at.row * S::kScratchStride + n * 8 + at.col] = o[n][c];
    }
  }
  if (tig == 0) {
    const int row = lane >> 2;
    ml[warp * 32 + row] = m_run[0];
    ml[warp * 32 + row + 8] = m_run[1];
    ml[warp * 32 + 16 + row] = l_run[0];
    ml[warp * 32 + 16 + row + 8] = l_run[1];
  }
  __syncthreads();

  // Merge the four warps: work item = (row: query head of the group, times query token with
  // kMultiQuery; 8 columns).
  const int num_rows = kMultiQuery ? p.rows : p.group;
  for (int w_item = static_cast<int>(threadIdx.x); w_item < num_rows * kChunks;
       w_item += kTcThreads) {
    const int row = w_item / kChunks;
    const int d0 = (w_item % kChunks) * 8;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < kTcWarps; ++w) m_all = fmaxf(m_all, ml[w * 32 + row]);
    const float m_ref = m_all == -INFINITY ? 0.0f : m_all;
    float l_all = 0.0f;
    float acc[8] = {};
#pragma unroll
    for (int w = 0; w < kTcWarps; ++w) {
      const float weight = exp2f(ml[w * 32 + row] - m_ref);
      l_all = fmaf(weight, ml[w * 32 + 16 + row], l_all);
      const float* src = scratch + (w * kTcRows + row) * S::kScratchStride + d0;
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] = fmaf(weight, src[k], acc[k]);
    }
    [[maybe_unused]] const int token = kMultiQuery ? row / p.group : 0;
    const int q_head = kv_head * p.group + (kMultiQuery ? row % p.group : row);
    if (direct) {
      const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;
      uint4 packed;
      packed.x = Ops::pack2(acc[0] * inv, acc[1] * inv);
      packed.y = Ops::pack2(acc[2] * inv, acc[3] * inv);
      packed.z = Ops::pack2(acc[4] * inv, acc[5] * inv);
      packed.w = Ops::pack2(acc[6] * inv, acc[7] * inv);
      std::uint16_t* dst = p.out + seq * p.out_stride_seq + q_head * p.out_stride_head + d0;
      if constexpr (kMultiQuery) dst += token * p.out_stride_token;
      *reinterpret_cast<uint4*>(dst) = packed;
    } else if constexpr (kMultiQuery) {
      // A row may see no key of this chunk (l_all 0): output 0, lse -inf, weight 0 in the merge.
      const std::int64_t state =
          ((static_cast<std::int64_t>(seq) * p.q_len + token) * p.num_q_heads + q_head) *
              p.num_splits +
          split;
      const bool any = l_all > 0.0f;
      const float inv = any ? 1.0f / l_all : 0.0f;
      float4* dst = reinterpret_cast<float4*>(p.partial_out + state * kHeadDim + d0);
      dst[0] = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
      dst[1] = make_float4(acc[4] * inv, acc[5] * inv, acc[6] * inv, acc[7] * inv);
      if (d0 == 0) p.partial_lse[state] = any ? m_all + log2f(l_all) : -INFINITY;
    } else {
      // A non-empty chunk: its maximum key has weight 1, so l_all >= 1.
      const std::int64_t state =
          (static_cast<std::int64_t>(seq) * p.num_q_heads + q_head) * p.num_splits + split;
      const float inv = 1.0f / l_all;
      float4* dst = reinterpret_cast<float4*>(p.partial_out + state * kHeadDim + d0);
      dst[0] = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
      dst[1] = make_float4(acc[4] * inv, acc[5] * inv, acc[6] * inv, acc[7] * inv);
      if (d0 == 0) p.partial_lse[state] = m_all + log2f(l_all);
    }
  }
  if constexpr (kMerge == TcDecodeMerge::kFused) {
    if (!direct) {
      // The first word of `scratch` serves as the arrival's flag: the merge loop's reads of it
      // are done at the arrival's first barrier, before thread 0 writes it.
      unsigned* flag = reinterpret_cast<unsigned*>(smem);
      if (fused_merge_arrive(p.split_counters + seq_head,
                             static_cast<unsigned>(range.num_active_splits), flag)) {
        fused_merge_group<kBf16, kHeadDim, kTcWarps, kMultiQuery>(p, seq, kv_head,
                                                                  range.num_active_splits);
      }
    }
  }
}

// out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M) for each (sequence, query head) that used
// >= 2 splits (kMultiQuery: each (sequence, query token, query head); a chunk a row saw no key of
// has lse -inf, weight 0, and at least the first chunk holds a key). blockDim = (kHeadDim / 4,
// kMergeHeads).
constexpr int kMergeHeads = 4;

template <bool kBf16, int kHeadDim, bool kMultiQuery>
__global__ void __launch_bounds__(kHeadDim / 4 * kMergeHeads)
    tc_merge_kernel(const TcParams p, std::int64_t num_states) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched with programmatic stream serialization: wait for the attention grid's writes.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const std::int64_t state = static_cast<std::int64_t>(blockIdx.x) * kMergeHeads + threadIdx.y;
  if (state >= num_states) return;
  const std::int64_t seq_token = state / p.num_q_heads;
  const int seq = static_cast<int>(kMultiQuery ? seq_token / p.q_len : seq_token);
  const int q_head = static_cast<int>(state % p.num_q_heads);
  const int n = range_of(p, seq, 0).num_active_splits;
  if (n <= 1) return;  // written directly by the attention kernel
  const float* lse = p.partial_lse + state * p.num_splits;
  float m_all = -INFINITY;
  for (int s = 0; s < n; ++s) m_all = fmaxf(m_all, lse[s]);
  float weight_sum = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const int d = static_cast<int>(threadIdx.x) * 4;
  for (int s = 0; s < n; ++s) {
    const float w = exp2f(lse[s] - m_all);
    weight_sum += w;
    const float4 part =
        *reinterpret_cast<const float4*>(p.partial_out + (state * p.num_splits + s) * kHeadDim + d);
    acc.x = fmaf(w, part.x, acc.x);
    acc.y = fmaf(w, part.y, acc.y);
    acc.z = fmaf(w, part.z, acc.z);
    acc.w = fmaf(w, part.w, acc.w);
  }
  const float inv = 1.0f / weight_sum;
  uint2 packed;
  packed.x = MmaOps<kBf16>::pack2(acc.x * inv, acc.y * inv);
  packed.y = MmaOps<kBf16>::pack2(acc.z * inv, acc.w * inv);
  std::uint16_t* dst = p.out + seq * p.out_stride_seq + q_head * p.out_stride_head + d;
  if constexpr (kMultiQuery) dst += (seq_token % p.q_len) * p.out_stride_token;
  *reinterpret_cast<uint2*>(dst) = packed;
}

// kTensorCoreWideMerge's merge, the same formula as tc_merge_kernel with the splits in parallel:
// one CTA per (sequence, query head) that used >= 2 splits
// (kernels/internal/decode_wide_merge.cuh).

template <bool kBf16, int kHeadDim, bool kMultiQuery>
__global__ void __launch_bounds__(kWideMergeThreads) tc_wide_merge_kernel(const TcParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  // The next kernel in the stream, if launched with programmatic serialization (the next
  // layer's decode attention), may become resident now; it waits for this grid's completion.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const std::int64_t state = blockIdx.x;
  const std::int64_t seq_token = state / p.num_q_heads;
  const int seq = static_cast<int>(kMultiQuery ? seq_token / p.q_len : seq_token);
  const int q_head = static_cast<int>(state % p.num_q_heads);
  const int n = range_of(p, seq, 0).num_active_splits;
  if (n <= 1) return;  // written directly by the attention kernel; uniform over the CTA
  if constexpr (kMultiQuery) {
    // A chunk a row saw no key of has lse -inf (weight 0); the first chunk holds one.
    wide_merge_state<kBf16, kHeadDim, true>(p, state, seq, q_head, n,
                                            (seq_token % p.q_len) * p.out_stride_token);
  } else {
    wide_merge_state<kBf16, kHeadDim, false>(p, state, seq, q_head, n);
  }
}

template <bool kBf16, int kHeadDim, bool kSoftCap, TcDecodeMerge kMerge, bool kMultiQuery>
cudaError_t launch(const TcParams& kp, std::int64_t num_seqs, cudaStream_t stream) {
  using S = TcDecodeShape<kHeadDim>;
  constexpr bool kWideMerge = kMerge != TcDecodeMerge::kSerial;
  const auto kernel = tc_decode_kernel<kBf16, kHeadDim, kSoftCap, kMerge, kMultiQuery>;
  // Set on every launch: cheap, per device, and allowed while a graph is being captured.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(S::kSmemBytes));
  if (err != cudaSuccess) return err;
  const std::int64_t ctas = num_seqs * kp.num_kv_heads * kp.num_splits;
  if (ctas == 0) return cudaSuccess;
  // Programmatic dependent launch (sm_90): the merge after the attention kernel, and with the
  // wide merge the attention kernel after whatever precedes it (it waits in griddepcontrol.wait).
  cudaLaunchAttribute pdl[1];
  unsigned num_pdl = 0;
  err = programmatic_launch_attr(pdl, &num_pdl);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(ctas));
  config.blockDim = dim3(kTcThreads);
  config.dynamicSmemBytes = S::kSmemBytes;
  config.stream = stream;
  if constexpr (kWideMerge) {
    config.attrs = pdl;
    config.numAttrs = num_pdl;
  }
  err = cudaLaunchKernelEx(&config, kernel, kp);
  if constexpr (kMerge == TcDecodeMerge::kFused) return err;  // each state's last CTA merges
  if (err != cudaSuccess || kp.num_splits == 1) return err;

  const std::int64_t states = num_seqs * kp.q_len * kp.num_q_heads;
  cudaLaunchConfig_t merge{};
  if constexpr (kWideMerge) {
    merge.gridDim = dim3(static_cast<unsigned>(states));
    merge.blockDim = dim3(kWideMergeThreads);
  } else {
    merge.gridDim = dim3(static_cast<unsigned>((states + kMergeHeads - 1) / kMergeHeads));
    merge.blockDim = dim3(kHeadDim / 4, kMergeHeads);
  }
  merge.stream = stream;
  merge.attrs = pdl;
  merge.numAttrs = num_pdl;
  if constexpr (kWideMerge) {
    return cudaLaunchKernelEx(&merge, tc_wide_merge_kernel<kBf16, kHeadDim, kMultiQuery>, kp);
  } else {
    return cudaLaunchKernelEx(&merge, tc_merge_kernel<kBf16, kHeadDim, kMultiQuery>, kp, states);
  }
}

}  // namespace

cudaError_t tc_paged_decode(const PagedDecodeParams& params, const DecodePlan& plan,
                            void* workspace, cudaStream_t stream, TcDecodeMerge merge,
                            std::uint32_t* split_counters) {
  const KVLayout& layout = params.layout;
  TcParams kp{};
  kp.q = static_cast<const std::uint16_t*>(params.q);
  kp.q_stride_seq = params.q_seq_stride();
  kp.q_stride_head = params.q_head_stride();
  kp.q_stride_token = params.q_token_stride();
  kp.k_cache = static_cast<const std::uint16_t*>(params.k_cache);
  kp.v_cache = static_cast<const std::uint16_t*>(params.v_cache);
  kp.page.stride_block = layout.stride_block;
  kp.page.stride_token = layout.stride_token;
  kp.page.head_offset = 0;
  kp.page.num_blocks = layout.num_blocks;
  kp.page.block_size = layout.block_size;
  kp.page.block_shift = detail::tc_block_shift(layout.block_size);
  kp.stride_head = layout.stride_head;
  kp.num_kv_heads = layout.num_kv_heads;
  kp.num_q_heads = params.num_q_heads;
  kp.group = params.group_size();
  kp.block_table = params.block_table;
  kp.max_blocks_per_seq = params.max_blocks_per_seq;
  kp.seq_lens = params.seq_lens;
  kp.out = static_cast<std::uint16_t*>(params.out);
  kp.out_stride_seq = params.out_seq_stride();
  kp.out_stride_head = params.out_head_stride();
  kp.out_stride_token = params.out_token_stride();
  const bool soft_cap = params.logits_soft_cap > 0.0f;
  if (soft_cap) {
    kp.score_scale = params.sm_scale / params.logits_soft_cap;
    kp.cap_log2 = params.logits_soft_cap * kLog2e;
  } else {
    kp.score_scale = params.sm_scale * kLog2e;
    kp.cap_log2 = 0.0f;
  }
  // The CTA's keys: the union of the query tokens' ranges (each token's window ends one key after
  // the previous token's).
  kp.q_len = params.q_len;
  kp.rows = params.group_size() * params.q_len;
  kp.row_window = params.window_size;
  kp.window_size = detail::tc_union_window(params.window_size, params.q_len);
  kp.num_splits = plan.num_splits;
  kp.chunk = plan.split_kv() ? plan.kv_chunk_size : 0;
  if (plan.split_kv()) {
    const DecodeWorkspaceLayout ws = decode_workspace_layout(
        plan, params.num_seqs, params.num_q_heads, layout.head_dim, params.q_len);
    auto* base = static_cast<unsigned char*>(workspace);
    kp.partial_out = reinterpret_cast<float*>(base + ws.partial_out_offset);
    kp.partial_lse = reinterpret_cast<float*>(base + ws.partial_lse_offset);
    kp.split_counters = split_counters;
  }
  const bool multi_query = params.q_len > 1;
  return dispatch_tc_decode(
      params.dtype, layout.head_dim, soft_cap, kWho,
      [&]<bool kBf16, int kHeadDim, bool kSoftCap>() {
        const auto by_merge = [&]<bool kMultiQuery>() {
          switch (merge) {
            case TcDecodeMerge::kWide:
              return launch<kBf16, kHeadDim, kSoftCap, TcDecodeMerge::kWide, kMultiQuery>(
                  kp, params.num_seqs, stream);
            case TcDecodeMerge::kFused:
              return launch<kBf16, kHeadDim, kSoftCap, TcDecodeMerge::kFused, kMultiQuery>(
                  kp, params.num_seqs, stream);
            case TcDecodeMerge::kSerial:
              break;
          }
          return launch<kBf16, kHeadDim, kSoftCap, TcDecodeMerge::kSerial, kMultiQuery>(
              kp, params.num_seqs, stream);
        };
        return multi_query ? by_merge.template operator()<true>()
                           : by_merge.template operator()<false>();
      });
}

cudaError_t tc_decode_ctas_per_sm(KVDtype dtype, int head_dim, int* ctas) {
  return dispatch_tc_decode(
      dtype, head_dim, false, kWho, [&]<bool kBf16, int kHeadDim, bool kSoftCap>() {
        return resident_ctas_per_sm(
            tc_decode_kernel<kBf16, kHeadDim, kSoftCap, TcDecodeMerge::kSerial, false>, kTcThreads,
            TcDecodeShape<kHeadDim>::kSmemBytes, ctas);
      });
}

}  // namespace pagedkv::kernels
