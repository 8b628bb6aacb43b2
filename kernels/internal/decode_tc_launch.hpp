// kernels/internal/decode_tc_launch.hpp: host entry points of the tensor-core paged decode kernel
// (kernels/decode_attention_tc.cu), internal to pagedkv::cuda. paged_decode_attention validates
// the parameters (validate_cuda_decode) and hands 16-bit caches to these when the caller chose
// DecodeKernel::kTensorCore or kTensorCoreWideMerge; FP8 caches never reach them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "pagedkv/device/decode_plan.hpp"
#include "pagedkv/reference/decode_attention.hpp"

namespace pagedkv::kernels {

// Validated params (16-bit cache, head_dim 64 / 128 / 256, group <= 16, num_seqs > 0) and plan;
// the workspace as validate_cuda_decode checked it. Enqueues the attention kernel and, with
// split-KV, the merge kernel (programmatic dependent launch on sm_90). wide_merge
// (DecodeKernel::kTensorCoreWideMerge): the attention kernel triggers the merge grid's launch at
// its start and the merge runs one CTA per (sequence, query head), parallel over the splits.
cudaError_t tc_paged_decode(const PagedDecodeParams& params, const DecodePlan& plan,
                            void* workspace, cudaStream_t stream, bool wide_merge);

// CTAs of the attention kernel resident per SM on the current device for this dtype and
// head_dim (the soft-cap-free instantiation; the soft-cap one uses the same shared memory).
cudaError_t tc_decode_ctas_per_sm(KVDtype dtype, int head_dim, int* ctas);

}  // namespace pagedkv::kernels
