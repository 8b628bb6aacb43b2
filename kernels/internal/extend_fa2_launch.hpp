// kernels/internal/extend_fa2_launch.hpp: host entry points of the FlashAttention-2-style paged
// extend kernel (kernels/extend_attention_fa2.cu), internal to pagedkv::cuda.
// paged_extend_attention validates the parameters (validate_cuda_extend plus the split plan and
// workspace) and hands 16-bit caches to these when the caller chose ExtendKernel::kFa2; FP8 caches
// never reach them.
#pragma once

#include <cuda_runtime_api.h>

#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv::kernels {

// Validated params (16-bit cache, head_dim 64 / 128 / 256, num_seqs > 0), num_splits >= 1 and,
// when > 1, a workspace of fa2_workspace_bytes. Enqueues the attention kernel and, with splits,
// the merge kernel.
cudaError_t fa2_paged_extend(const PagedExtendParams& params, int num_splits, void* workspace,
                             cudaStream_t stream);

// CTAs of the attention kernel resident per SM on the current device for this dtype, head_dim
// and CTA size (warps: 2 or 4).
cudaError_t fa2_extend_ctas_per_sm(KVDtype dtype, int head_dim, int warps, int* ctas);

}  // namespace pagedkv::kernels
