// kernels/internal/extend_wgmma_launch.hpp: host entry points of the warpgroup-MMA paged extend
// kernel (kernels/extend_attention_wgmma.cu, ExtendKernel::kWgmma, sm_90a), internal to
// pagedkv::cuda. Declared only where the build has sm_90a code (PAGEDKV_HAS_SM90A); the caller
// validates the parameters first.
#pragma once

#include <cuda_runtime_api.h>

#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv::kernels {

// Whether the kernel runs these (validated) params on the current device: a 16-bit cache,
// head_dim 128, compute capability 9.0. Never throws (false on any error).
bool wgmma_extend_runs(const PagedExtendParams& params) noexcept;

// Validated params for which wgmma_extend_runs() holds, num_seqs > 0. Enqueues the kernel (no
// split over keys).
cudaError_t wgmma_paged_extend(const PagedExtendParams& params, cudaStream_t stream);

}  // namespace pagedkv::kernels
