// kernels/internal/extend_fa2_launch.hpp: host entry points of the FlashAttention-2-style paged
// extend kernel (kernels/extend_attention_fa2.cu), internal to pagedkv::cuda.
// paged_extend_attention validates the parameters (validate_cuda_extend plus the split plan and
// workspace) and hands 16-bit caches to these when the caller chose ExtendKernel::kFa2 or
// kFa2LeanSoftmax (or a kWgmma variant that falls back); FP8 caches
// never reach them.
#pragma once

#include <cuda_runtime_api.h>

#include "internal/extend_fa2_params.cuh"
#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv::kernels {

// Validated params (16-bit cache, head_dim 64 / 128 / 256, num_seqs > 0), num_splits >= 1 and,
// when > 1, a workspace of fa2_workspace_bytes. Enqueues the attention kernel and, with splits,
// the merge kernel. lean_softmax: ExtendKernel::kFa2LeanSoftmax's softmax (needs sm_scale > 0
// or a soft-cap: the caller checks).
cudaError_t fa2_paged_extend(const PagedExtendParams& params, int num_splits, void* workspace,
                             cudaStream_t stream, bool lean_softmax);

// Enqueues the merge of split partials (kp.num_splits > 1, kp.rows and kp.keys those of the
// attention kernel that wrote them, which may be another variant on the same tile rules, as
// kWgmma): each (sequence, new token, query head) whose query tile used more than one split gets
// its output row (and log-sum-exp) from the partials. Nothing for kp.num_splits <= 1.
cudaError_t fa2_merge_splits(const fa2::Fa2Params& kp, bool bf16, int head_dim, int num_seqs,
                             cudaStream_t stream);

// CTAs of the attention kernel resident per SM on the current device for this dtype, head_dim
// and CTA size (warps: 2 or 4), with kFa2LeanSoftmax's softmax or kFa2's.
cudaError_t fa2_extend_ctas_per_sm(KVDtype dtype, int head_dim, int warps, bool lean_softmax,
                                   int* ctas);

}  // namespace pagedkv::kernels
