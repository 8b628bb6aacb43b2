// kernels/internal/decode_tc_launch.hpp: host entry points of the tensor-core paged decode kernel
// (kernels/decode_attention_tc.cu), internal to pagedkv::cuda. paged_decode_attention validates
// the parameters (validate_cuda_decode) and hands 16-bit caches to these when the caller chose
// DecodeKernel::kTensorCore, kTensorCoreWideMerge or kTensorCoreFusedMerge; FP8 caches never
// reach them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "pagedkv/device/decode_plan.hpp"
#include "pagedkv/reference/decode_attention.hpp"

namespace pagedkv::kernels {

// How the split-KV chunks are merged: kSerial (DecodeKernel::kTensorCore) a merge kernel with one
// thread looping over the splits; kWide (kTensorCoreWideMerge) the attention kernel triggers the
// merge grid's launch at its start and the merge runs one CTA per (sequence, query head),
// parallel over the splits; kFused (kTensorCoreFusedMerge) no merge kernel: each state's last CTA
// merges, counting arrivals in split_counters.
enum class TcDecodeMerge { kSerial, kWide, kFused };

// Validated params (16-bit cache, head_dim 64 / 128 / 256, group <= 16, num_seqs > 0) and plan;
// the workspace as validate_cuda_decode checked it; with kFused and split-KV, split_counters
// holds num_seqs x num_kv_heads counters (checked by the caller). Enqueues the attention kernel
// and, with split-KV and kSerial or kWide, the merge kernel (programmatic dependent launch on
// sm_90).
cudaError_t tc_paged_decode(const PagedDecodeParams& params, const DecodePlan& plan,
                            void* workspace, cudaStream_t stream, TcDecodeMerge merge,
                            std::uint32_t* split_counters);

// CTAs of the attention kernel resident per SM on the current device for this dtype and
// head_dim (the soft-cap-free instantiation; the soft-cap one uses the same shared memory).
cudaError_t tc_decode_ctas_per_sm(KVDtype dtype, int head_dim, int* ctas);

}  // namespace pagedkv::kernels
