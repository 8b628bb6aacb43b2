// Tensor-core paged decode attention over an FP8 KV cache (DecodeKernel::kTensorCoreFp8, opt-in;
// contract in include/pagedkv/cuda/decode_attention.hpp, FP8 semantics in
// pagedkv/device/kv_quant.hpp, layouts in kernels/internal/decode_tc_fp8_layout.hpp).
//
// The geometry of the 16-bit tensor-core kernel (kernels/decode_attention_tc.cu): CTA = 4 warps =
// one (sequence, KV head, split); the GQA group's query heads are the 16 M rows of
// mma.sync.m16n8k16 (q's fp16 / bf16, fp32 accumulate), q in A fragments in registers; 64-token
// key tiles, warp w owns keys [16 w, 16 w + 16) of each, with its own cp.async ring and softmax
// state, merged once per CTA at the end; block-table lookups one tile ahead into shared memory.
//
// What differs: the ring holds FP8 codes (16 tokens x head_dim bytes per K or V slice, 16-byte
// copies) and, with per-(token, head) scales, the slice's 16 K and 16 V scales (4-byte copies in
// the same commit groups). After a slice lands, each lane converts the codes it copied itself
// (exactly: cvt.rn.f16x2.{e4m3,e5m2}x2, then fp16 -> fp32 -> bf16 for bf16 q, all exact) into the
// warp's 16-bit slice, in the swizzled layout the 16-bit kernel's ldmatrix(.trans) code reads, and
// the unchanged QK and PV MMAs run on it. K and V take turns in that one 16-bit slice.
// Values are never multiplied by scales before the MMA:
//   - K: score column j is multiplied by k_scale[j] (per tensor: folded into the score scale);
//   - V: the row sum l uses the unscaled probability p; the PV operand is p x v_scale[j] / R,
//     R the largest V scale the warp has seen (per tensor: R = v_scale, the operand is p), and the
//     warp's output is multiplied by R once at the end; when R grows the accumulator is rescaled
//     by R_old / R_new with the softmax's own rescale. Dividing by R keeps the 16-bit operand in
//     [0, 1] (per-row scales can be ~1e-5, which would underflow fp16 as p x v_scale).
// A key past the range, or whose block id is outside the pool, is zero-filled (never read) and
// masked out of the softmax (a per-stage key mask written when its copies are issued), as
// kernels/fp8_attention.cu skips it.
//
// Split-KV: the plan's ranges (decode_tc_layout.hpp's tc_split_range); partial outputs and
// log2-sum-exp2 to the caller's workspace; a merge kernel, one CTA per (sequence, query head),
// parallel over the splits (the design of decode_attention_tc.cu's tc_wide_merge_kernel, copied),
// launched through programmatic dependent launch and triggered early by the attention kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "fp8_kernels.hpp"
#include "internal/cp_async.cuh"
#include "internal/decode_tc_fp8_layout.hpp"
#include "internal/decode_tc_host.hpp"
#include "internal/decode_tc_layout.hpp"
#include "internal/decode_wide_merge.cuh"
#include "internal/fp8_operand.cuh"
#include "internal/mma_sync.cuh"
#include "pagedkv/base/error.hpp"
#include "pagedkv/device/fp8.hpp"

namespace pagedkv::kernels {

namespace {

using detail::kTcRows;
using detail::kTcThreads;
using detail::kTcWarps;
using detail::kTcWarpTokens;
using detail::TcFp8DecodeShape;
using detail::TcFp8DirectShape;

constexpr float kLog2e = 1.4426950408889634f;
constexpr const char* kWho = "paged_decode_attention (CUDA, FP8 tensor cores)";

struct TcFp8Params {
  const std::uint16_t* q;  // [num_seqs, num_q_heads, head_dim]
  std::int64_t q_stride_seq;
  std::int64_t q_stride_head;
  const std::uint8_t* k_cache;
  const std::uint8_t* v_cache;
  detail::TcPageGeometry page;  // bytes; head_offset 0, the kernel adds its KV head's
  std::int64_t stride_head;
  std::int64_t scale_offset;  // > 0: per-(token, head) scales; 0: per tensor
  std::int32_t num_kv_heads;
  std::int32_t num_q_heads;
  std::int32_t group;
  bool e5m2;
  float v_scale;  // per tensor (per-row: unused)
  const std::int32_t* block_table;
  std::int32_t max_blocks_per_seq;
  const std::int32_t* seq_lens;
  std::uint16_t* out;
  std::int64_t out_stride_seq;
  std::int64_t out_stride_head;
  float score_scale;  // sm_scale x log2(e) (soft-cap: sm_scale / cap), x k_scale per tensor
  float cap_log2;     // cap x log2(e) (soft-cap instantiations only)
  std::int32_t window_size;
  std::int32_t num_splits;
  std::int32_t chunk;
  float* partial_out;  // [num_seqs, num_q_heads, num_splits, head_dim]
  float* partial_lse;  // [num_seqs, num_q_heads, num_splits]
};

__device__ __forceinline__ detail::TcSplitRange range_of(const TcFp8Params& p, int seq, int split) {
  const std::int64_t capacity = static_cast<std::int64_t>(p.max_blocks_per_seq) * p.page.block_size;
  return detail::tc_split_range(__ldg(p.seq_lens + seq), capacity, p.window_size, p.num_splits,
                                p.chunk, split);
}

// Converts the lane's own copies of a staged FP8 slice into the swizzled 16-bit slice.
template <bool kBf16, bool kE5M2, int kHeadDim>
__device__ __forceinline__ void convert_slice(const std::uint8_t* codes, uint4* half_slice,
                                              int lane) {
  using S = TcFp8DecodeShape<kHeadDim>;
  // Unrolled by 2, not fully: head_dim 256 then fits 255 registers (bf16: no spill; fp16: 4 bytes).
#pragma unroll 2
  for (int i = 0; i < S::kCopiesPerLane; ++i) {
    const detail::MmaCoord c = detail::fp8_slice_copy(lane, i, S::kFp8Chunks);
    const uint4 in = *reinterpret_cast<const uint4*>(codes + 16 * (lane + 32 * i));
    uint4 lo;
    uint4 hi;
    fp8x16_to_operands<kBf16, kE5M2>(in, &lo, &hi);
    half_slice[detail::fp8_half_chunk(c.row, c.col, 0, S::kChunks)] = lo;
    half_slice[detail::fp8_half_chunk(c.row, c.col, 1, S::kChunks)] = hi;
  }
}

template <bool kBf16, int kHeadDim>
__device__ __forceinline__ void convert_slice(const std::uint8_t* codes, uint4* half_slice,
                                              int lane, bool e5m2) {
  if (e5m2) {
    convert_slice<kBf16, true, kHeadDim>(codes, half_slice, lane);
  } else {
    convert_slice<kBf16, false, kHeadDim>(codes, half_slice, lane);
  }
}

// ---- the pieces both attention kernels share (the 16-bit-slice path and the direct path) ----

// The offsets of the warp's slice of `tile` (its keys from `slice_first`, relative to the range)
// into table slot `slot` of code_table / scale_table ([slot][16]): lanes 0-15, one key each; -1
// past the range, in a block outside the pool, or for a tile past the warp's last (`active` false).
__device__ __forceinline__ void fp8_resolve_slice(
    const TcFp8Params& p, const detail::TcPageGeometry& geo, int kv_head,
    const std::int32_t* table_row, const detail::TcSplitRange& range, bool active, int slice_first,
    int lane, std::int64_t* code_table, std::int64_t* scale_table, int slot) {
  if (lane < kTcWarpTokens) {
    detail::TcFp8TokenOffsets off{-1, -1};
    if (active) {
      off = detail::tc_fp8_token_offsets(geo, p.scale_offset, p.num_kv_heads, kv_head, table_row,
                                         range.begin + slice_first + lane, range.end);
    }
    code_table[slot * kTcWarpTokens + lane] = off.code;
    scale_table[slot * kTcWarpTokens + lane] = off.scale;
  }
}

// The direct kernel's copies of one plane (K or V) of the warp's slice into its stage:
// kCopiesPerLane 16-byte chunks per lane (chunk l + 32 i of the slice, fp8_slice_copy), each
// landing at its fp8_direct_chunk (the ldmatrix layout); with per-row scales lanes 0-15 copy their
// key's scale. Keys without an offset (-1) are zero-filled. (The slice kernel keeps its own copy
// loops, which land row-major: through this function its registers at head_dim 128 went from 186
// to 184, a different schedule, and it is proven as it compiles.)
template <int kCopiesPerLane, int kFp8Chunks>
__device__ __forceinline__ void fp8_issue_plane(const std::uint8_t* cache, std::uint8_t* slice,
                                                float* slice_scales, const std::int64_t* codes,
                                                const std::int64_t* scale_at, bool per_row,
                                                int lane) {
#pragma unroll
  for (int i = 0; i < kCopiesPerLane; ++i) {
    const detail::MmaCoord c = detail::fp8_slice_copy(lane, i, kFp8Chunks);
    const std::int64_t off = codes[c.row];
    const bool fill = off >= 0;
    cp_async_16(slice + 16 * detail::fp8_direct_chunk(c.row, c.col, kFp8Chunks),
                fill ? cache + off + c.col * 16 : cache, fill);
  }
  if (per_row && lane < kTcWarpTokens) {
    const std::int64_t off = scale_at[lane];
    cp_async_4(slice_scales + lane, off >= 0 ? cache + off : cache, off >= 0);
  }
}

// One slice's online-softmax step: the scores s (two 16 x 8 C fragments) times the score scale
// (x the key's K scale with per-row scales), soft-capped, masked (key_mask; in the test-only
// drop-key build also the dropped position), into the log2-domain probabilities `prob`; the row
// maxima m_run move, l_run is rescaled by alpha and gains the row sums of the unscaled p.
// Returns whether this lane saw a row maximum move.
template <bool kSoftCap>
__device__ __forceinline__ bool fp8_softmax_step(const TcFp8Params& p, bool per_row,
                                                 const float* k_scales, unsigned key_mask,
                                                 [[maybe_unused]] int slice_first_key, int lane,
                                                 float (&s)[2][4], float (&m_run)[2],
                                                 float (&l_run)[2], float (&alpha)[2],
                                                 float (&prob)[2][4]) {
  // Scores (x the key's K scale) in the log2 domain, masked; row maxima over the quad.
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int key = t * 8 + detail::mma_c_coord(lane, c).col;
      const float scale = per_row ? k_scales[key] * p.score_scale : p.score_scale;
      float v;
      if constexpr (kSoftCap) {
        v = p.cap_log2 * tanhf(s[t][c] * scale);
      } else {
        v = s[t][c] * scale;
      }
#ifdef PAGEDKV_TEST_DROP_KEY
      // Test-only build (tests/cuda/broken_kernel_test.cpp): one key position left out.
      const bool dropped = slice_first_key + key == PAGEDKV_TEST_DROP_KEY;
#else
      constexpr bool dropped = false;
#endif
      v = ((key_mask >> key) & 1u) != 0 && !dropped ? v : -INFINITY;
      s[t][c] = v;
      tile_max[c >> 1] = fmaxf(tile_max[c >> 1], v);
    }
  }
  float m_use[2];
  bool moved = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    const float m_new = fmaxf(m_run[r], tile_max[r]);
    // Until a valid key is seen m stays -inf; subtracting 0 then keeps exp2f(-inf) = 0.
    m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
    alpha[r] = exp2f(m_run[r] - m_use[r]);  // 1 when the row maximum did not move
    moved = moved || m_new != m_run[r];
    m_run[r] = m_new;
    l_run[r] *= alpha[r];
  }
#pragma unroll
  for (int t = 0; t < 2; ++t) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      prob[t][c] = exp2f(s[t][c] - m_use[c >> 1]);
      l_run[c >> 1] += prob[t][c];
    }
  }
  return moved;
}

// The PV operand of a slice (its V scales landed): with per-row scales p x v_scale[key] / R (R,
// the largest V scale so far, grows in r_run); the accumulators rescaled when a row maximum moved
// anywhere in the warp or R grew; then P packed into the A fragment (pv_a_source).
template <bool kBf16, int kNTiles>
__device__ __forceinline__ void fp8_pv_operand(bool per_row, const float* v_scales, int tig,
                                               float& r_run, bool moved, const float (&alpha)[2],
                                               float (&prob)[2][4], float (&o)[kNTiles][4],
                                               unsigned (&pa)[4]) {
  using Ops = MmaOps<kBf16>;
  // The V scales: the PV operand is p x v_scale[key] / R (R: the largest V scale so far).
  float rescale = 1.0f;
  if (per_row) {
    float vs[2][2];
    rescale = fp8_v_weights(v_scales, tig, r_run, vs);
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int c = 0; c < 4; ++c) prob[t][c] *= vs[t][c & 1];
    }
  }
  if (__any_sync(0xffffffffu, moved) || rescale != 1.0f) {
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) o[n][c] *= alpha[c >> 1] * rescale;
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const detail::PvASource lo = detail::pv_a_source(2 * j);
    const detail::PvASource hi = detail::pv_a_source(2 * j + 1);
    pa[j] = Ops::pack2(prob[lo.tile][lo.elem], prob[hi.tile][hi.elem]);
  }
}

// The row sums over the quad (each lane held its columns' part).
__device__ __forceinline__ void fp8_reduce_row_sums(float (&l_run)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
}

// The warp's row maxima and sums into ml ([warp][m x 16, l x 16]) for merge_warps (tig: lane % 4).
__device__ __forceinline__ void fp8_store_warp_state(float* ml, int warp, int lane, int tig,
                                                     const float (&m_run)[2],
                                                     const float (&l_run)[2]) {
  if (tig == 0) {
    const int row = lane >> 2;
    ml[warp * 32 + row] = m_run[0];
    ml[warp * 32 + row + 8] = m_run[1];
    ml[warp * 32 + 16 + row] = l_run[0];
    ml[warp * 32 + 16 + row + 8] = l_run[1];
  }
}

// q of the CTA's group (KV head kv_head of sequence seq) as MMA A fragments; rows past the group
// are zero. kPermuted (the direct kernel): head_dim permuted within each 16-dim slice as its K
// fragments are (fp8_direct_qk_dim); elements 2j, 2j + 1 sit at k and k + 1 (k even), which the
// permutation keeps adjacent: one 32-bit load each either way.
template <int kKSteps, bool kPermuted>
__device__ __forceinline__ void fp8_load_q(const TcFp8Params& p, int seq, int kv_head, int lane,
                                           unsigned (&qf)[kKSteps][4]) {
  const std::uint16_t* q_base =
      p.q + seq * p.q_stride_seq + static_cast<std::int64_t>(kv_head) * p.group * p.q_stride_head;
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const detail::MmaCoord c = detail::mma_a_coord(lane, 2 * j);
      qf[ks][j] = c.row < p.group ? __ldg(reinterpret_cast<const unsigned*>(
                                        q_base + c.row * p.q_stride_head + ks * 16 +
                                        (kPermuted ? detail::fp8_direct_qk_dim(c.col) : c.col)))
                                  : 0u;
    }
  }
}

// Zeroes MMA C fragments (accumulators, scores).
template <int kTiles>
__device__ __forceinline__ void fp8_zero(float (&frag)[kTiles][4]) {
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) frag[n][c] = 0.0f;
  }
}

// The warp's ring before its first tile: the offsets of tiles 0..kStages-1 resolved, tiles
// 0..kStages-2 issued (resolve(tile, slot), issue(tile, stage): the kernel's own).
template <int kStages, typename Resolve, typename Issue>
__device__ __forceinline__ void fp8_ring_start(Resolve&& resolve, Issue&& issue) {
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) resolve(t, detail::tc_slot(t, kStages));
  __syncwarp();
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) issue(t, detail::tc_slot(t, kStages));
  resolve(kStages - 1, detail::tc_slot(kStages - 1, kStages));
}

// The top of tile `tile`: waits until its K has landed (the slice kernel reads only its lane's
// own copies, the direct kernel all of them: the __syncwarp after the wait covers both), every
// lane is done with the previous tile's stage, and the offsets resolved last iteration and this
// tile's mask are visible; then issues tile + kStages - 1 and resolves tile + kStages into this
// tile's offset slot (decode_tc_layout.hpp: the tile's copies were issued long ago).
template <int kStages, typename Resolve, typename Issue>
__device__ __forceinline__ void fp8_ring_step(int tile, Resolve&& resolve, Issue&& issue) {
  cp_async_wait<detail::tc_k_wait_groups(kStages)>();
  __syncwarp();
  const int next = detail::tc_issue_tile(tile, kStages);
  issue(next, detail::tc_slot(next, kStages));
  const int ahead = detail::tc_resolve_tile(tile, kStages);
  resolve(ahead, detail::tc_slot(ahead, kStages));
}

// The end of both attention kernels: merges the four warps' states (scratch: [warp][16 rows]
// [kScratchStride] unnormalized outputs x R; ml: [warp][m x 16, l x 16]) and writes the output
// (direct) or the split's partial output and log2-sum-exp2. Work item = (query head of the group,
// 8 columns).
template <bool kBf16, int kHeadDim, int kScratchStride>
__device__ __forceinline__ void merge_warps(const TcFp8Params& p, const float* scratch,
                                            const float* ml, int seq, int kv_head, int split,
                                            bool direct) {
  using Ops = MmaOps<kBf16>;
  constexpr int kChunks = kHeadDim / 8;
  for (int w_item = static_cast<int>(threadIdx.x); w_item < p.group * kChunks;
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
      const float* src = scratch + (w * kTcRows + row) * kScratchStride + d0;
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] = fmaf(weight, src[k], acc[k]);
    }
    const int q_head = kv_head * p.group + row;
    if (direct) {
      const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;
      uint4 packed;
      packed.x = Ops::pack2(acc[0] * inv, acc[1] * inv);
      packed.y = Ops::pack2(acc[2] * inv, acc[3] * inv);
      packed.z = Ops::pack2(acc[4] * inv, acc[5] * inv);
      packed.w = Ops::pack2(acc[6] * inv, acc[7] * inv);
      *reinterpret_cast<uint4*>(p.out + seq * p.out_stride_seq + q_head * p.out_stride_head + d0) =
          packed;
    } else {
      // l_all = 0 only when every key of the chunk was masked (block ids outside the pool):
      // the chunk then gets weight 0 in the merge (lse -inf), and a zero output.
      const std::int64_t state =
          (static_cast<std::int64_t>(seq) * p.num_q_heads + q_head) * p.num_splits + split;
      const float inv = l_all > 0.0f ? 1.0f / l_all : 0.0f;
      float4* dst = reinterpret_cast<float4*>(p.partial_out + state * kHeadDim + d0);
      dst[0] = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
      dst[1] = make_float4(acc[4] * inv, acc[5] * inv, acc[6] * inv, acc[7] * inv);
      if (d0 == 0) p.partial_lse[state] = l_all > 0.0f ? m_all + log2f(l_all) : -INFINITY;
    }
  }
}

template <bool kBf16, int kHeadDim, bool kSoftCap>
__global__ void __launch_bounds__(kTcThreads, TcFp8DecodeShape<kHeadDim>::kMinCtasPerSm)
    tc_fp8_decode_kernel(const TcFp8Params p) {
  using S = TcFp8DecodeShape<kHeadDim>;
  using Ops = MmaOps<kBf16>;
  constexpr int kChunks = S::kChunks;
  constexpr int kStages = S::kStages;
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kNTiles = kHeadDim / 8;
  extern __shared__ uint4 smem[];

  const std::int64_t item = blockIdx.x;
  const int split = static_cast<int>(item % p.num_splits);
  const std::int64_t seq_head = item / p.num_splits;
  const int kv_head = static_cast<int>(seq_head % p.num_kv_heads);
  const int seq = static_cast<int>(seq_head / p.num_kv_heads);
  const detail::TcSplitRange range = range_of(p, seq, split);
  if (split >= range.num_active_splits) return;  // uniform over the CTA
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Let the merge grid launch now; its CTAs wait in griddepcontrol.wait until this grid has
  // completed and its writes are visible. A CTA that returned above counts as triggered.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const bool direct = range.num_active_splits == 1;
  const int range_len = range.end - range.begin;
  const bool per_row = p.scale_offset > 0;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int tig = lane & 3;
  auto* const smem_bytes = reinterpret_cast<unsigned char*>(smem);
  std::uint8_t* ring = smem_bytes + static_cast<std::size_t>(warp) * kStages * 2 * S::kSliceBytes;
  uint4* half_slice =
      reinterpret_cast<uint4*>(smem_bytes + S::kHalfOffset + warp * 2 * S::kSliceBytes);
  float* scales = reinterpret_cast<float*>(smem_bytes + S::kScaleOffset) +
                  warp * kStages * 2 * kTcWarpTokens;  // [stage][K x 16, V x 16]
  std::int64_t* code_table = reinterpret_cast<std::int64_t*>(smem_bytes + S::kCodeTableOffset) +
                             warp * kStages * kTcWarpTokens;  // [stage][16]
  std::int64_t* scale_table = reinterpret_cast<std::int64_t*>(smem_bytes + S::kScaleTableOffset) +
                              warp * kStages * kTcWarpTokens;
  std::uint32_t* masks =
      reinterpret_cast<std::uint32_t*>(smem_bytes + S::kMaskOffset) + warp * kStages;
  const unsigned half_addr = static_cast<unsigned>(__cvta_generic_to_shared(half_slice));

  unsigned qf[kKSteps][4];
  fp8_load_q<kKSteps, false>(p, seq, kv_head, lane, qf);
  float o[kNTiles][4];
  fp8_zero(o);
  float m_run[2] = {-INFINITY, -INFINITY};  // rows lane / 4 and lane / 4 + 8
  float l_run[2] = {0.0f, 0.0f};            // this lane's part of the row sums
  // The V scale reference R (see the top): per tensor fixed, per row the warp's running maximum.
  float r_run = per_row ? 0.0f : p.v_scale;

  detail::TcPageGeometry geo = p.page;
  geo.head_offset = kv_head * p.stride_head;
  const std::int32_t* table_row =
      p.block_table + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;
  const int tiles = detail::tc_warp_tiles(range_len, warp);

  // Offsets of the warp's slice of `tile` into table slot `slot`.
  const auto resolve = [&](int tile, int slot) {
    fp8_resolve_slice(p, geo, kv_head, table_row, range, tile < tiles,
                      detail::tc_slice_begin(tile, warp), lane, code_table, scale_table, slot);
  };
  // Copies of the warp's slice of `tile` into `stage` (offsets already in slot `stage`), and its
  // key mask; always commits two groups (K, then V) so the group counts stay uniform.
  const auto issue = [&](int tile, int stage) {
    std::uint8_t* k_slice = ring + stage * 2 * S::kSliceBytes;
    std::uint8_t* v_slice = k_slice + S::kSliceBytes;
    float* k_scales = scales + stage * 2 * kTcWarpTokens;
    float* v_scales = k_scales + kTcWarpTokens;
    const std::int64_t* codes = code_table + stage * kTcWarpTokens;
    const std::int64_t* scale_at = scale_table + stage * kTcWarpTokens;
    if (tile < tiles) {
      const unsigned mask = __ballot_sync(0xffffffffu, lane < kTcWarpTokens && codes[lane] >= 0);
      if (lane == 0) masks[stage] = mask;
#pragma unroll
      for (int i = 0; i < S::kCopiesPerLane; ++i) {
        const detail::MmaCoord c = detail::fp8_slice_copy(lane, i, S::kFp8Chunks);
        const std::int64_t off = codes[c.row];
        const bool fill = off >= 0;
        cp_async_16(k_slice + 16 * (lane + 32 * i), fill ? p.k_cache + off + c.col * 16 : p.k_cache,
                    fill);
      }
      if (per_row && lane < kTcWarpTokens) {
        const std::int64_t off = scale_at[lane];
        cp_async_4(k_scales + lane, off >= 0 ? p.k_cache + off : p.k_cache, off >= 0);
      }
    }
    cp_async_commit();
    if (tile < tiles) {
#pragma unroll
      for (int i = 0; i < S::kCopiesPerLane; ++i) {
        const detail::MmaCoord c = detail::fp8_slice_copy(lane, i, S::kFp8Chunks);
        const std::int64_t off = codes[c.row];
        const bool fill = off >= 0;
        cp_async_16(v_slice + 16 * (lane + 32 * i), fill ? p.v_cache + off + c.col * 16 : p.v_cache,
                    fill);
      }
      if (per_row && lane < kTcWarpTokens) {
        const std::int64_t off = scale_at[lane];
        cp_async_4(v_scales + lane, off >= 0 ? p.v_cache + off : p.v_cache, off >= 0);
      }
    }
    cp_async_commit();
  };

  fp8_ring_start<kStages>(resolve, issue);

  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = detail::tc_slot(tile, kStages);
    // K of `tile` landed (the lane's own copies; its V and later tiles may be in flight); every
    // lane is done with the previous tile's stage and 16-bit slice.
    fp8_ring_step<kStages>(tile, resolve, issue);

    const std::uint8_t* k_codes = ring + stage * 2 * S::kSliceBytes;
    const std::uint8_t* v_codes = k_codes + S::kSliceBytes;
    const float* k_scales = scales + stage * 2 * kTcWarpTokens;
    const float* v_scales = k_scales + kTcWarpTokens;
    const unsigned key_mask = masks[stage];

    convert_slice<kBf16, kHeadDim>(k_codes, half_slice, lane, p.e5m2);
    __syncwarp();

    // S = Q K^T for the slice's 16 keys: two 16 x 8 tiles.
    float s[2][4];
    fp8_zero(s);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      unsigned b[4];
      ldmatrix_x4(
          b, half_addr + 16 * detail::swizzled_chunk(detail::qk_b_key(lane),
                                                     2 * ks + detail::qk_b_chunk(lane), kChunks));
      Ops::mma(s[0], qf[ks], b[0], b[1]);
      Ops::mma(s[1], qf[ks], b[2], b[3]);
    }

    float alpha[2];
    float prob[2][4];
    const bool moved = fp8_softmax_step<kSoftCap>(p, per_row, k_scales, key_mask,
                                                  range.begin + detail::tc_slice_begin(tile, warp),
                                                  lane, s, m_run, l_run, alpha, prob);

    // V of `tile` landed (and its scales); every lane is done reading K from the 16-bit slice.
    cp_async_wait<detail::tc_v_wait_groups(kStages)>();
    __syncwarp();
    convert_slice<kBf16, kHeadDim>(v_codes, half_slice, lane, p.e5m2);

    unsigned pa[4];
    fp8_pv_operand<kBf16, kNTiles>(per_row, v_scales, tig, r_run, moved, alpha, prob, o, pa);
    __syncwarp();  // the converted V slice visible to every lane

    // O += P V.
#pragma unroll
    for (int dd = 0; dd < kHeadDim / 16; ++dd) {
      unsigned b[4];
      ldmatrix_x4_trans(
          b, half_addr + 16 * detail::swizzled_chunk(detail::pv_b_key(lane),
                                                     2 * dd + detail::pv_b_chunk(lane), kChunks));
      Ops::mma(o[2 * dd], pa, b[0], b[1]);
      Ops::mma(o[2 * dd + 1], pa, b[2], b[3]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring and slices: reused as merge scratch below

  fp8_reduce_row_sums(l_run);
  float* scratch = reinterpret_cast<float*>(smem);               // [warp][16][kScratchStride]
  float* ml = scratch + kTcWarps * kTcRows * S::kScratchStride;  // [warp][m x 16, l x 16]
  float* own = scratch + warp * kTcRows * S::kScratchStride;
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const detail::MmaCoord at = detail::mma_c_coord(lane, c);
      own[at.row * S::kScratchStride + n * 8 + at.col] = o[n][c] * r_run;
    }
  }
  fp8_store_warp_state(ml, warp, lane, tig, m_run, l_run);
  __syncthreads();

  merge_warps<kBf16, kHeadDim, S::kScratchStride>(p, scratch, ml, seq, kv_head, split, direct);
}

// DecodeKernel::kTensorCoreFp8Direct (opt-in, beside the kernel above): the same CTA, tiles,
// pipeline, scales, masks, split and merge, but no 16-bit slice. The staged code rows (swizzled for
// ldmatrix, decode_tc_fp8_layout.hpp's fp8_direct_chunk) are read with ldmatrix as 16-bit units
// and each lane converts what it receives straight into MMA fragments:
//   - K: ldmatrix (no .trans) gives a lane four codes of one key; converted they are the B
//     fragment of the MMA over a 16-dim slice whose k index runs over head_dim permuted
//     (fp8_direct_qk_dim); q's A fragments are loaded with the same permutation;
//   - V: ldmatrix.trans gives a lane two dims of two keys; one byte permute
//     (fp8_direct_split_pairs) gives the B fragments of an MMA over the slice's even dims and one
//     over its odd dims; the accumulators then hold four contiguous dims per lane
//     (fp8_direct_pv_dim), written so by the epilogue.
// Per code: one shared load (ldmatrix, half as many as the slice path's) and a conversion in
// registers, instead of a shared load, a conversion, a shared store and an ldmatrix; and the 16-bit
// slice's shared memory goes to a deeper ring.
// One instantiation per FP8 format (kE5M2; p.e5m2 is ignored): the conversions are compile-time,
// and one tile loop per kernel leaves the registers to one loop (with both formats' loops in one
// kernel, head_dim 256 spilled 112 bytes, against 4-12 with one).
template <bool kBf16, bool kE5M2, int kHeadDim, bool kSoftCap>
__global__ void __launch_bounds__(kTcThreads, TcFp8DirectShape<kHeadDim>::kMinCtasPerSm)
    tc_fp8_direct_decode_kernel(const TcFp8Params p) {
  using S = TcFp8DirectShape<kHeadDim>;
  using Ops = MmaOps<kBf16>;
  constexpr int kFp8Chunks = S::kFp8Chunks;
  constexpr int kStages = S::kStages;
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kNTiles = kHeadDim / 8;
  extern __shared__ uint4 smem[];

  const std::int64_t item = blockIdx.x;
  const int split = static_cast<int>(item % p.num_splits);
  const std::int64_t seq_head = item / p.num_splits;
  const int kv_head = static_cast<int>(seq_head % p.num_kv_heads);
  const int seq = static_cast<int>(seq_head / p.num_kv_heads);
  const detail::TcSplitRange range = range_of(p, seq, split);
  if (split >= range.num_active_splits) return;  // uniform over the CTA
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const bool direct = range.num_active_splits == 1;
  const int range_len = range.end - range.begin;
  const bool per_row = p.scale_offset > 0;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int tig = lane & 3;
  auto* const smem_bytes = reinterpret_cast<unsigned char*>(smem);
  std::uint8_t* ring = smem_bytes + static_cast<std::size_t>(warp) * kStages * 2 * S::kSliceBytes;
  float* scales = reinterpret_cast<float*>(smem_bytes + S::kScaleOffset) +
                  warp * kStages * 2 * kTcWarpTokens;  // [stage][K x 16, V x 16]
  std::int64_t* code_table = reinterpret_cast<std::int64_t*>(smem_bytes + S::kCodeTableOffset) +
                             warp * kStages * kTcWarpTokens;  // [stage][16]
  std::int64_t* scale_table = reinterpret_cast<std::int64_t*>(smem_bytes + S::kScaleTableOffset) +
                              warp * kStages * kTcWarpTokens;
  std::uint32_t* masks =
      reinterpret_cast<std::uint32_t*>(smem_bytes + S::kMaskOffset) + warp * kStages;
  const unsigned ring_addr = static_cast<unsigned>(__cvta_generic_to_shared(ring));
  // The lane's ldmatrix row within a chunk pair (the same for K and V, every tile and stage).
  const int ldsm_key = detail::fp8_direct_ldsm_key(lane);
  const int ldsm_chunk = detail::fp8_direct_ldsm_chunk(lane);

  unsigned qf[kKSteps][4];
  fp8_load_q<kKSteps, true>(p, seq, kv_head, lane, qf);  // head_dim permuted as K's fragments
  float o[kNTiles][4];
  fp8_zero(o);
  float m_run[2] = {-INFINITY, -INFINITY};   // rows lane / 4 and lane / 4 + 8
  float l_run[2] = {0.0f, 0.0f};             // this lane's part of the row sums
  float r_run = per_row ? 0.0f : p.v_scale;  // the V scale reference R

  detail::TcPageGeometry geo = p.page;
  geo.head_offset = kv_head * p.stride_head;
  const std::int32_t* table_row =
      p.block_table + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;
  const int tiles = detail::tc_warp_tiles(range_len, warp);

  const auto resolve = [&](int tile, int slot) {
    fp8_resolve_slice(p, geo, kv_head, table_row, range, tile < tiles,
                      detail::tc_slice_begin(tile, warp), lane, code_table, scale_table, slot);
  };
  const auto issue = [&](int tile, int stage) {
    std::uint8_t* k_slice = ring + stage * 2 * S::kSliceBytes;
    float* k_scales = scales + stage * 2 * kTcWarpTokens;
    const std::int64_t* codes = code_table + stage * kTcWarpTokens;
    const std::int64_t* scale_at = scale_table + stage * kTcWarpTokens;
    if (tile < tiles) {
      const unsigned mask = __ballot_sync(0xffffffffu, lane < kTcWarpTokens && codes[lane] >= 0);
      if (lane == 0) masks[stage] = mask;
      fp8_issue_plane<S::kCopiesPerLane, kFp8Chunks>(p.k_cache, k_slice, k_scales, codes, scale_at,
                                                     per_row, lane);
    }
    cp_async_commit();
    if (tile < tiles) {
      fp8_issue_plane<S::kCopiesPerLane, kFp8Chunks>(p.v_cache, k_slice + S::kSliceBytes,
                                                     k_scales + kTcWarpTokens, codes, scale_at,
                                                     per_row, lane);
    }
    cp_async_commit();
  };

  fp8_ring_start<kStages>(resolve, issue);

  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = detail::tc_slot(tile, kStages);
    // K of `tile` landed (every lane's copies: the warp reads them all).
    fp8_ring_step<kStages>(tile, resolve, issue);

    const unsigned k_addr = ring_addr + stage * 2 * S::kSliceBytes;
    const unsigned v_addr = k_addr + S::kSliceBytes;
    const float* k_scales = scales + stage * 2 * kTcWarpTokens;
    const float* v_scales = k_scales + kTcWarpTokens;
    const unsigned key_mask = masks[stage];

    // S = Q K^T for the slice's 16 keys: two 16 x 8 tiles; one ldmatrix.x4 per 32 dims.
    float s[2][4];
    fp8_zero(s);
#pragma unroll
    for (int pair = 0; pair < kFp8Chunks / 2; ++pair) {
      unsigned r[4];
      ldmatrix_x4(
          r, k_addr + 16 * detail::fp8_direct_chunk(ldsm_key, 2 * pair + ldsm_chunk, kFp8Chunks));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int ks = 2 * pair + h;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const unsigned codes = r[2 * h + t];
          Ops::mma(s[t], qf[ks],
                   fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(codes & 0xffffu)),
                   fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(codes >> 16)));
        }
      }
    }

    float alpha[2];
    float prob[2][4];
    const bool moved = fp8_softmax_step<kSoftCap>(p, per_row, k_scales, key_mask,
                                                  range.begin + detail::tc_slice_begin(tile, warp),
                                                  lane, s, m_run, l_run, alpha, prob);

    // V of `tile` landed (every lane's copies, and its scales).
    cp_async_wait<detail::tc_v_wait_groups(kStages)>();
    __syncwarp();
    unsigned pa[4];
    fp8_pv_operand<kBf16, kNTiles>(per_row, v_scales, tig, r_run, moved, alpha, prob, o, pa);

    // O += P V: per chunk, one MMA over its even dims (n-tile 2 c) and one over its odd dims.
#pragma unroll
    for (int pair = 0; pair < kFp8Chunks / 2; ++pair) {
      unsigned r[4];
      ldmatrix_x4_trans(
          r, v_addr + 16 * detail::fp8_direct_chunk(ldsm_key, 2 * pair + ldsm_chunk, kFp8Chunks));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int c = 2 * pair + h;
        const unsigned lo = detail::fp8_direct_split_pairs(r[2 * h]);      // keys 0-7
        const unsigned hi = detail::fp8_direct_split_pairs(r[2 * h + 1]);  // keys 8-15
        Ops::mma(o[2 * c], pa,
                 fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(lo & 0xffffu)),
                 fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(hi & 0xffffu)));
        Ops::mma(o[2 * c + 1], pa,
                 fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(lo >> 16)),
                 fp8x2_to_operand<kBf16, kE5M2>(static_cast<unsigned short>(hi >> 16)));
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring: reused as merge scratch below

  fp8_reduce_row_sums(l_run);
  float* scratch = reinterpret_cast<float*>(smem);               // [warp][16][kScratchStride]
  float* ml = scratch + kTcWarps * kTcRows * S::kScratchStride;  // [warp][m x 16, l x 16]
  float* own = scratch + warp * kTcRows * S::kScratchStride;
  // Four contiguous dims per lane and row: one 16-byte store each (decode_tc_fp8_layout.hpp).
#pragma unroll
  for (int c = 0; c < kFp8Chunks; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto elem = [&](int k) {
        return o[2 * c + detail::fp8_direct_epilogue_parity(k)]
                [detail::fp8_direct_epilogue_elem(h, k)] *
               r_run;
      };
      const int row = detail::mma_c_coord(lane, 2 * h).row;
      *reinterpret_cast<float4*>(own + row * S::kScratchStride +
                                 detail::fp8_direct_pv_dim(c, 0, lane, 0)) =
          make_float4(elem(0), elem(1), elem(2), elem(3));
    }
  }
  fp8_store_warp_state(ml, warp, lane, tig, m_run, l_run);
  __syncthreads();
  merge_warps<kBf16, kHeadDim, S::kScratchStride>(p, scratch, ml, seq, kv_head, split, direct);
}

// The split-KV merge: one CTA per (sequence, query head) that used >= 2 splits, parallel over the
// splits (kernels/internal/decode_wide_merge.cuh). A split whose keys were all masked has lse
// -inf and weight 0; when every split is so, the output is 0.

template <bool kBf16, int kHeadDim>
__global__ void __launch_bounds__(kWideMergeThreads) tc_fp8_merge_kernel(const TcFp8Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const std::int64_t state = blockIdx.x;
  const int seq = static_cast<int>(state / p.num_q_heads);
  const int q_head = static_cast<int>(state % p.num_q_heads);
  const int n = range_of(p, seq, 0).num_active_splits;
  if (n <= 1) return;  // written directly by the attention kernel; uniform over the CTA
  wide_merge_state<kBf16, kHeadDim, true>(p, state, seq, q_head, n);
}

// The attention kernel of a path (kDirect: kTensorCoreFp8Direct) and its dynamic shared memory.
// kE5M2: the direct kernel's format (the slice kernel takes p.e5m2 at run time).
template <bool kBf16, int kHeadDim, bool kSoftCap, bool kDirect, bool kE5M2>
constexpr auto attention_kernel() {
  if constexpr (kDirect) {
    return tc_fp8_direct_decode_kernel<kBf16, kE5M2, kHeadDim, kSoftCap>;
  } else {
    return tc_fp8_decode_kernel<kBf16, kHeadDim, kSoftCap>;
  }
}
template <int kHeadDim, bool kDirect>
constexpr std::size_t attention_smem() {
  return kDirect ? TcFp8DirectShape<kHeadDim>::kSmemBytes : TcFp8DecodeShape<kHeadDim>::kSmemBytes;
}

template <bool kBf16, int kHeadDim, bool kSoftCap, bool kDirect, bool kE5M2>
cudaError_t launch(const TcFp8Params& kp, std::int64_t num_seqs, cudaStream_t stream) {
  constexpr std::size_t kSmem = attention_smem<kHeadDim, kDirect>();
  const auto kernel = attention_kernel<kBf16, kHeadDim, kSoftCap, kDirect, kE5M2>();
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kSmem));
  if (err != cudaSuccess) return err;
  const std::int64_t ctas = num_seqs * kp.num_kv_heads * kp.num_splits;
  if (ctas == 0) return cudaSuccess;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(ctas));
  config.blockDim = dim3(kTcThreads);
  config.dynamicSmemBytes = kSmem;
  config.stream = stream;
  err = cudaLaunchKernelEx(&config, kernel, kp);
  if (err != cudaSuccess || kp.num_splits == 1) return err;

  cudaLaunchConfig_t merge{};
  merge.gridDim = dim3(static_cast<unsigned>(num_seqs * kp.num_q_heads));
  merge.blockDim = dim3(kWideMergeThreads);
  merge.stream = stream;
  cudaLaunchAttribute attr[1];
  unsigned num_attrs = 0;
  err = programmatic_launch_attr(attr, &num_attrs);
  if (err != cudaSuccess) return err;
  merge.attrs = attr;
  merge.numAttrs = num_attrs;
  return cudaLaunchKernelEx(&merge, tc_fp8_merge_kernel<kBf16, kHeadDim>, kp);
}

}  // namespace

bool tc_fp8_decode_supported(const KVLayout& layout) noexcept {
  return detail::tc_fp8_strides_ok(layout.stride_block, layout.stride_token, layout.stride_head);
}

cudaError_t tc_fp8_paged_decode(const PagedDecodeParams& params, const DecodePlan& plan,
                                void* workspace, cudaStream_t stream, bool direct) {
  const KVLayout& layout = params.layout;
  TcFp8Params kp{};
  kp.q = static_cast<const std::uint16_t*>(params.q);
  kp.q_stride_seq = params.q_seq_stride();
  kp.q_stride_head = params.q_head_stride();
  kp.k_cache = static_cast<const std::uint8_t*>(params.k_cache);
  kp.v_cache = static_cast<const std::uint8_t*>(params.v_cache);
  kp.page.stride_block = layout.stride_block;
  kp.page.stride_token = layout.stride_token;
  kp.page.head_offset = 0;
  kp.page.num_blocks = layout.num_blocks;
  kp.page.block_size = layout.block_size;
  kp.page.block_shift = detail::tc_block_shift(layout.block_size);
  kp.stride_head = layout.stride_head;
  const bool per_row = params.quant.mode == KVScaleMode::kPerTokenHead;
  kp.scale_offset = per_row ? layout.scale_offset : 0;
  kp.num_kv_heads = layout.num_kv_heads;
  kp.num_q_heads = params.num_q_heads;
  kp.group = params.group_size();
  kp.e5m2 = params.quant.format() == Fp8Format::kE5M2;
  kp.v_scale = per_row ? 1.0f : params.quant.v_scale;
  kp.block_table = params.block_table;
  kp.max_blocks_per_seq = params.max_blocks_per_seq;
  kp.seq_lens = params.seq_lens;
  kp.out = static_cast<std::uint16_t*>(params.out);
  kp.out_stride_seq = params.out_seq_stride();
  kp.out_stride_head = params.out_head_stride();
  const bool soft_cap = params.logits_soft_cap > 0.0f;
  const float k_scale = per_row ? 1.0f : params.quant.k_scale;
  if (soft_cap) {
    kp.score_scale = params.sm_scale / params.logits_soft_cap * k_scale;
    kp.cap_log2 = params.logits_soft_cap * kLog2e;
  } else {
    kp.score_scale = params.sm_scale * kLog2e * k_scale;
    kp.cap_log2 = 0.0f;
  }
  kp.window_size = params.window_size;
  kp.num_splits = plan.num_splits;
  kp.chunk = plan.split_kv() ? plan.kv_chunk_size : 0;
  if (plan.split_kv()) {
    const DecodeWorkspaceLayout ws =
        decode_workspace_layout(plan, params.num_seqs, params.num_q_heads, layout.head_dim);
    auto* base = static_cast<unsigned char*>(workspace);
    kp.partial_out = reinterpret_cast<float*>(base + ws.partial_out_offset);
    kp.partial_lse = reinterpret_cast<float*>(base + ws.partial_lse_offset);
  }
  return dispatch_tc_decode(
      params.dtype, layout.head_dim, soft_cap, kWho,
      [&]<bool kBf16, int kHeadDim, bool kSoftCap>() {
        if (!direct) {
          return launch<kBf16, kHeadDim, kSoftCap, false, false>(kp, params.num_seqs, stream);
        }
        return kp.e5m2
                   ? launch<kBf16, kHeadDim, kSoftCap, true, true>(kp, params.num_seqs, stream)
                   : launch<kBf16, kHeadDim, kSoftCap, true, false>(kp, params.num_seqs, stream);
      });
}

cudaError_t tc_fp8_decode_ctas_per_sm(KVDtype dtype, int head_dim, int* ctas, bool direct) {
  return dispatch_tc_decode(
      dtype, head_dim, false, kWho, [&]<bool kBf16, int kHeadDim, bool kSoftCap>() {
        // The direct kernel: the fewer of its two formats' instantiations (the same shared
        // memory and bounds; their registers may differ).
        if (direct) {
          int e4m3 = 0;
          int e5m2 = 0;
          cudaError_t err =
              resident_ctas_per_sm(attention_kernel<kBf16, kHeadDim, kSoftCap, true, false>(),
                                   kTcThreads, attention_smem<kHeadDim, true>(), &e4m3);
          if (err == cudaSuccess) {
            err = resident_ctas_per_sm(attention_kernel<kBf16, kHeadDim, kSoftCap, true, true>(),
                                       kTcThreads, attention_smem<kHeadDim, true>(), &e5m2);
          }
          if (err == cudaSuccess) *ctas = e4m3 < e5m2 ? e4m3 : e5m2;
          return err;
        }
        return resident_ctas_per_sm(attention_kernel<kBf16, kHeadDim, kSoftCap, false, false>(),
                                    kTcThreads, attention_smem<kHeadDim, false>(), ctas);
      });
}

}  // namespace pagedkv::kernels
