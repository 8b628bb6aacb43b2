// kernels/internal/decode_fused_merge.cuh: the split-KV merge done inside the attention kernel
// (DecodeKernel::kTensorCoreFusedMerge in kernels/decode_attention_tc.cu), internal to
// pagedkv::cuda.
//
// Protocol. Each CTA of a (sequence, KV head) writes its chunk's partial results (normalized
// output and log2-sum-exp2 per query head of the group), then arrives on the state's counter
// (fused_merge_arrive): the CTA synchronizes, and thread 0 fences and increments the counter with
// atomicInc(counter, n - 1), which wraps to 0 on the n-th arrival. Fence then atomic is a release
// pattern in the PTX memory model, and a fence is cumulative: it also releases the writes other
// threads made before the barrier (CUTLASS's cutlass/barrier.h arrives the same way). The CTA
// whose thread 0 reads n - 1 back is the last one: its atomic then fence is an acquire pattern
// over the chain of the other CTAs' increments, the barrier after it hands that order to the
// CTA's other threads, and they read every other CTA's partials (through L2, below). It merges,
// and the counter is already 0 again for the next launch.
// A counter read back >= n was not zeroed before the first launch (the public contract,
// include/pagedkv/cuda/decode_attention.hpp): the kernel traps instead of merging garbage.
//
// Merge (fused_merge_group): warp w of the last CTA merges query heads w, w + warps, ... of the
// group, one head per warp at a time, no CTA barrier: each lane owns head_dim / 32 columns and
// walks the n chunks with an online rescale (detail::OnlineChunkMerge,
// internal/decode_fused_merge_math.hpp: a running maximum of the chunks' lse, so no separate
// pass for the maximum, and no branch), the loads issued 8 chunks at a time and read through L2
// (ld.global.cg: the partials were written by other SMs after this kernel began, and L1 is not
// coherent). Every chunk that is merged holds at least one key (a 16-bit cache masks no block),
// so each lse is finite and the largest chunk's weight is 1.
// Calls: fused_merge_arrive uniform over the CTA (it synchronizes it); fused_merge_group by
// every thread of the last CTA.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "internal/decode_fused_merge_math.hpp"
#include "internal/mma_sync.cuh"

namespace pagedkv::kernels {

// Arrives on `counter` for a state of n >= 2 active chunks after this CTA's partial writes;
// returns (uniformly) whether this CTA is the last one. `flag`: one word of shared memory that no
// thread reads or writes around the call.
__device__ __forceinline__ bool fused_merge_arrive(unsigned* counter, unsigned n, unsigned* flag) {
  __syncthreads();  // every thread's partial writes, before thread 0's release
  if (threadIdx.x == 0) {
    __threadfence();  // release (cumulative: the CTA's writes ordered before the barrier)
    const unsigned seen = atomicInc(counter, n - 1);
    if (seen >= n) __trap();  // the counters were not zeroed before the first launch
    __threadfence();          // acquire: the other CTAs' writes, before this CTA's reads
    *flag = seen == n - 1 ? 1u : 0u;
  }
  __syncthreads();  // thread 0's acquire, before every thread's reads
  return *flag != 0;
}

// Chunks whose loads one lane issues before it uses any of them.
inline constexpr int kFusedMergeBatch = 8;

// Columns per lane of one warp's merge.
template <int kHeadDim>
struct FusedMergeColumns {
  static constexpr int kPer = kHeadDim / 32;
  static_assert(kPer == 2 || kPer == 4 || kPer == 8, "head_dim 64, 128 or 256");
};

template <int kPer>
__device__ __forceinline__ void load_cg(const float* src, float (&v)[kPer]) {
  if constexpr (kPer == 2) {
    const float2 a = __ldcg(reinterpret_cast<const float2*>(src));
    v[0] = a.x;
    v[1] = a.y;
  } else {
#pragma unroll
    for (int i = 0; i < kPer / 4; ++i) {
      const float4 a = __ldcg(reinterpret_cast<const float4*>(src) + i);
      v[4 * i] = a.x;
      v[4 * i + 1] = a.y;
      v[4 * i + 2] = a.z;
      v[4 * i + 3] = a.w;
    }
  }
}

// Merges the n >= 2 chunks of every query head of (seq, kv_head)'s group into p.out; kWarps: the
// CTA's warps. Params: the kernel's parameters (partial_lse, partial_out, num_splits, num_q_heads,
// group, out, out_stride_seq, out_stride_head; with kMultiQuery also rows = group x q_len, q_len,
// out_stride_token: row r is query token r / group, head r % group, and a chunk the row saw no key
// of has lse -inf and output 0, which add nothing once chunk 0, which holds a key of every row,
// is added).
template <bool kBf16, int kHeadDim, int kWarps, bool kMultiQuery, typename Params>
__device__ __forceinline__ void fused_merge_group(const Params& p, int seq, int kv_head, int n) {
  constexpr int kPer = FusedMergeColumns<kHeadDim>::kPer;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  int num_rows = p.group;
  if constexpr (kMultiQuery) num_rows = p.rows;
  for (int r = warp; r < num_rows; r += kWarps) {
    int token = 0;
    int q_head = kv_head * p.group + r;
    std::int64_t state = static_cast<std::int64_t>(seq) * p.num_q_heads + q_head;
    if constexpr (kMultiQuery) {
      token = r / p.group;
      q_head = kv_head * p.group + r % p.group;
      state = (static_cast<std::int64_t>(seq) * p.q_len + token) * p.num_q_heads + q_head;
    }
    const float* lse = p.partial_lse + state * p.num_splits;
    const float* part = p.partial_out + state * p.num_splits * kHeadDim + lane * kPer;
    detail::OnlineChunkMerge<kPer> merge;
    for (int s0 = 0; s0 < n; s0 += kFusedMergeBatch) {
      // A batch's loads first (all in flight at once), then its arithmetic; chunks past n are
      // padding (lse -inf, output 0), which add nothing after chunk 0.
      float l[kFusedMergeBatch];
      float v[kFusedMergeBatch][kPer];
#pragma unroll
      for (int j = 0; j < kFusedMergeBatch; ++j) {
        const int s = s0 + j;
        l[j] = -INFINITY;
#pragma unroll
        for (int i = 0; i < kPer; ++i) v[j][i] = 0.0f;
        if (s < n) {
          l[j] = __ldcg(lse + s);
          load_cg<kPer>(part + static_cast<std::int64_t>(s) * kHeadDim, v[j]);
        }
      }
#pragma unroll
      for (int j = 0; j < kFusedMergeBatch; ++j) merge.add(l[j], v[j]);
    }
    const float inv = merge.inverse_weight();  // <= 1: the largest chunk has weight 1
    std::uint16_t* dst = p.out + seq * p.out_stride_seq + q_head * p.out_stride_head + lane * kPer;
    if constexpr (kMultiQuery) dst += token * p.out_stride_token;
    unsigned packed[kPer / 2];
#pragma unroll
    for (int i = 0; i < kPer / 2; ++i) {
      packed[i] = MmaOps<kBf16>::pack2(merge.out(2 * i, inv), merge.out(2 * i + 1, inv));
    }
    if constexpr (kPer == 2) {
      *reinterpret_cast<unsigned*>(dst) = packed[0];
    } else if constexpr (kPer == 4) {
      *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
  }
}

}  // namespace pagedkv::kernels
