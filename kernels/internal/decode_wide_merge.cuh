// kernels/internal/decode_wide_merge.cuh: the split-KV merge of the tensor-core decode kernels
// (DecodeKernel::kTensorCoreWideMerge in kernels/decode_attention_tc.cu, kTensorCoreFp8 in
// kernels/decode_attention_tc_fp8.cu), internal to pagedkv::cuda.
//
// One CTA of kWideMergeThreads threads merges one (sequence, query head) state's n >= 2 chunk
// results: out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M), M the largest lse. The threads
// first reduce M (thread t reads chunks t, t + 256, ...), then thread (row, lane) accumulates
// lane's 4 columns over chunks row, row + kRows, ... (independent loads, unrolled by 4), and row 0
// sums the rows and writes the 16-bit output. Its serial chain is a few loads long, where a merge
// in which one thread loops over every chunk pays 2 x n dependent loads.
//
// kMaybeEmpty: a chunk whose keys were all masked (FP8: block ids outside the pool) has lse -inf
// and weight 0, and when every chunk is so the output is 0; without it every chunk holds at least
// one key (the largest has weight 1). Calls: uniform over the CTA (it synchronizes the CTA).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "internal/mma_sync.cuh"

namespace pagedkv::kernels {

inline constexpr int kWideMergeThreads = 256;

// Merges state (sequence seq, query head q_head) of n >= 2 chunks; Params: the kernel's parameters
// (partial_lse, partial_out, num_splits, out, out_stride_seq, out_stride_head). out_offset: added
// to the output row's offset (a query token's, with several per sequence).
template <bool kBf16, int kHeadDim, bool kMaybeEmpty, typename Params>
__device__ __forceinline__ void wide_merge_state(const Params& p, std::int64_t state, int seq,
                                                 int q_head, int n, std::int64_t out_offset = 0) {
  constexpr int kLanes = kHeadDim / 4;  // float4 columns
  constexpr int kRows = kWideMergeThreads / kLanes;
  constexpr int kWarpsHere = kWideMergeThreads / 32;
  static_assert(kRows * kLanes == kWideMergeThreads, "rows x lanes cover the CTA");
  __shared__ float4 row_acc[kRows][kLanes];
  __shared__ float row_weight[kRows];
  __shared__ float warp_max[kWarpsHere];

  const int t = static_cast<int>(threadIdx.x);
  const float* lse = p.partial_lse + state * p.num_splits;
  float m = -INFINITY;
  for (int s = t; s < n; s += kWideMergeThreads) m = fmaxf(m, lse[s]);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  }
  if (t % 32 == 0) warp_max[t / 32] = m;
  __syncthreads();
  float m_all = warp_max[0];
#pragma unroll
  for (int w = 1; w < kWarpsHere; ++w) m_all = fmaxf(m_all, warp_max[w]);
  if constexpr (kMaybeEmpty) m_all = m_all == -INFINITY ? 0.0f : m_all;

  const int row = t / kLanes;
  const int lane = t % kLanes;
  const float* part = p.partial_out + state * p.num_splits * kHeadDim + lane * 4;
  float weight_sum = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int s = row; s < n; s += kRows) {
    const float w = exp2f(lse[s] - m_all);
    const float4 v =
        *reinterpret_cast<const float4*>(part + static_cast<std::int64_t>(s) * kHeadDim);
    weight_sum += w;
    acc.x = fmaf(w, v.x, acc.x);
    acc.y = fmaf(w, v.y, acc.y);
    acc.z = fmaf(w, v.z, acc.z);
    acc.w = fmaf(w, v.w, acc.w);
  }
  row_acc[row][lane] = acc;
  if (lane == 0) row_weight[row] = weight_sum;
  __syncthreads();
  if (row != 0) return;
  float total_weight = row_weight[0];
#pragma unroll
  for (int r = 1; r < kRows; ++r) {
    const float4 v = row_acc[r][lane];
    total_weight += row_weight[r];
    acc.x += v.x;
    acc.y += v.y;
    acc.z += v.z;
    acc.w += v.w;
  }
  float inv;
  if constexpr (kMaybeEmpty) {
    inv = total_weight > 0.0f ? 1.0f / total_weight : 0.0f;
  } else {
    inv = 1.0f / total_weight;  // the largest chunk has weight 1
  }
  uint2 packed;
  packed.x = MmaOps<kBf16>::pack2(acc.x * inv, acc.y * inv);
  packed.y = MmaOps<kBf16>::pack2(acc.z * inv, acc.w * inv);
  *reinterpret_cast<uint2*>(p.out + seq * p.out_stride_seq + q_head * p.out_stride_head +
                            out_offset + lane * 4) = packed;
}

}  // namespace pagedkv::kernels
