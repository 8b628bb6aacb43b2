// kernels/internal/decode_fused_merge_math.hpp: the arithmetic of kTensorCoreFusedMerge's merge
// (kernels/internal/decode_fused_merge.cuh), shared by the kernel and its host test
// (tests/device/decode_fused_merge_test.cpp), internal to pagedkv::cuda.
//
// OnlineChunkMerge folds split-KV chunk results one at a time: chunk s has a normalized output
// o_s (kPer columns here) and a log2-sum-exp2 l_s, and the merge is
// out = sum_s 2^(l_s - M) o_s / sum_s 2^(l_s - M), M = max_s l_s. Instead of a first pass for M,
// it keeps a running maximum m and rescales its sums by 2^(m_old - m_new) whenever a chunk raises
// it (the online softmax applied to chunk results). The first chunk must hold a key (l_0
// finite); later ones may be padding (l = -inf, o = 0). The largest chunk's weight is 1, so the
// weight sum is >= 1. O(kPer) per chunk, no allocation.
#pragma once

#include <cmath>

#include "internal/host_device.hpp"

namespace pagedkv::detail {

template <int kPer>
struct OnlineChunkMerge {
  float m = -INFINITY;      // largest l_s folded so far
  float weight_sum = 0.0f;  // sum_s 2^(l_s - m)
  float acc[kPer] = {};     // sum_s 2^(l_s - m) o_s

  // Branch-free, so a caller's loads of the next chunks can be scheduled ahead of it. l = -inf
  // (a padding chunk, o = 0) adds nothing once a finite chunk has been added.
  PAGEDKV_HOST_DEVICE void add(float l, const float (&o)[kPer]) {
    const float m_new = fmaxf(m, l);
    const float scale = exp2f(m - m_new);  // 1 unless l raised the maximum; 0 for the first chunk
    const float w = exp2f(l - m_new);
    weight_sum = fmaf(weight_sum, scale, w);
    for (int i = 0; i < kPer; ++i) acc[i] = fmaf(w, o[i], acc[i] * scale);
    m = m_new;
  }

  // Column i of the merged output (after at least one add()).
  PAGEDKV_HOST_DEVICE float out(int i, float inv) const { return acc[i] * inv; }
  PAGEDKV_HOST_DEVICE float inverse_weight() const { return 1.0f / weight_sum; }
};

}  // namespace pagedkv::detail
