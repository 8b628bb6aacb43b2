// kernels/fp8_kernels.hpp: the FP8 KV kernels' host entry points (issue 36), internal to
// pagedkv::cuda. The public functions (kv_append, copy_blocks, paged_decode_attention,
// paged_extend_attention) validate their parameters and hand FP8 ones (quant.fp8() or an FP8
// dtype) to these; the 16-bit kernels are untouched.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/device/decode_plan.hpp"
#include "pagedkv/device/kv_layout.hpp"
#include "pagedkv/reference/decode_attention.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv::kernels {

// Validated params (reference validate()) with params.quant.fp8().
cudaError_t fp8_kv_append(const KVAppendParams& params, cudaStream_t stream);
// Validated layout and pair count > 0, non-null 16-byte aligned planes, an FP8 dtype.
cudaError_t fp8_copy_blocks(std::span<void* const> planes, const KVLayout& layout,
                            const BlockPair* pairs, std::int64_t num_pairs, cudaStream_t stream);

// Validated params (validate_cuda_decode / validate_cuda_extend) with params.quant.fp8():
// head_dim 64, 128 or 256; 1-byte codes, 8-byte loads.
cudaError_t fp8_paged_decode(const PagedDecodeParams& params, cudaStream_t stream);
cudaError_t fp8_paged_extend(const PagedExtendParams& params, cudaStream_t stream);

// DecodeKernel::kTensorCoreFp8 (kernels/decode_attention_tc_fp8.cu): whether the tensor-core FP8
// decode kernel takes this layout (every stride a multiple of 16 bytes; otherwise
// paged_decode_attention runs fp8_paged_decode).
bool tc_fp8_decode_supported(const KVLayout& layout) noexcept;
// Validated params (validate_cuda_decode) with params.quant.fp8() and tc_fp8_decode_supported,
// and plan; the workspace as validate_cuda_decode checked it. Enqueues the attention kernel and,
// with split-KV, the merge kernel (programmatic dependent launch on sm_90). direct: the
// DecodeKernel::kTensorCoreFp8Direct kernel (codes straight into MMA fragments, no 16-bit slice;
// the same layouts, plans, workspace and results up to rounding of the fp32 sums' order).
cudaError_t tc_fp8_paged_decode(const PagedDecodeParams& params, const DecodePlan& plan,
                                void* workspace, cudaStream_t stream, bool direct);
// CTAs of that attention kernel (direct: kTensorCoreFp8Direct's) resident per SM on the current
// device for this q / out dtype and head_dim (the soft-cap-free instantiation; the soft-cap one
// uses the same shared memory).
cudaError_t tc_fp8_decode_ctas_per_sm(KVDtype dtype, int head_dim, int* ctas, bool direct);

// ExtendKernel::kFa2Fp8 (kernels/extend_attention_fa2_fp8.cu): whether the tensor-core FP8 extend
// kernel takes this layout (every stride a multiple of 16 bytes; otherwise paged_extend_attention
// runs fp8_paged_extend).
bool tc_fp8_extend_supported(const KVLayout& layout) noexcept;
// Validated params (validate_cuda_extend and the split plan's checks) with params.quant.fp8() and
// tc_fp8_extend_supported, num_seqs > 0, num_splits >= 1 and, when > 1, a workspace of
// extend_workspace_bytes. Enqueues the attention kernel and, with splits, kFa2's merge kernel.
cudaError_t tc_fp8_paged_extend(const PagedExtendParams& params, int num_splits, void* workspace,
                                cudaStream_t stream);
// CTAs of that attention kernel resident per SM on the current device for this q / out dtype and
// head_dim.
cudaError_t tc_fp8_extend_ctas_per_sm(KVDtype dtype, int head_dim, int* ctas);

#if defined(__CUDACC__)
// Device-side KVLayout addressing (KVLayout's constexpr members are host functions).
__device__ __forceinline__ std::int64_t fp8_row_offset(const KVLayout& l, std::int64_t block,
                                                       std::int64_t token, std::int64_t head) {
  return block * l.stride_block + token * l.stride_token + head * l.stride_head;
}
__device__ __forceinline__ std::int64_t fp8_scale_offset(const KVLayout& l, std::int64_t block,
                                                         std::int64_t token, std::int64_t head) {
  return block * l.stride_block + l.scale_offset + (token * l.num_kv_heads + head) * 4;
}
#endif

}  // namespace pagedkv::kernels
