// pagedkv/cuda/extend_attention.hpp: paged extend (prefix-hit prefill) attention on the GPU
// (target pagedkv::cuda).
//
// Same contract as the CPU reference in pagedkv/reference/extend_attention.hpp, on device buffers: fp16
// and bf16 values with fp32 accumulation and softmax; head_dim 64, 128 or 256; any GQA group;
// block sizes 1..256 with any strides KVLayout accepts; 64-bit address arithmetic.
//
// Design (FlashAttention-2 style, tensor cores through mma.sync m16n8k16): one CTA of 4 warps
// per (query tile, sequence, KV head). A query tile is 64 rows of the sequence's
// (new token, query head of the group) pairs, token-major, so the heads of a GQA group share
// every K/V tile the CTA loads; each warp owns 16 rows. K/V tiles of 64 keys (32 for head_dim 256)
// are gathered through the block table with 16-byte cp.async copies into a double-buffered,
// XOR-swizzled shared-memory ring, starting at the tile's first visible key (the cached prefix
// and the new tokens alike: a tile may span the prefix boundary or several blocks). Scores and
// the online softmax stay in registers (log2 domain, exp2f); only tiles that cross the causal
// diagonal or the window edge are masked. Query tiles are scheduled heaviest (most keys) first.
// No workspace: there is no split over keys, so a sequence with few new tokens and a long
// prefix runs on few CTAs (decode attention covers the one-token case with split-KV).
//
// An FP8 cache (params.quant.fp8(); pagedkv/device/kv_quant.hpp) runs kernels/fp8_attention.cu
// instead: one CTA per (new token, KV head) on CUDA cores, codes decoded in registers, the row
// scales applied to the fp32 dot product and softmax weight, fp32 accumulation (correctness
// first; a tensor-core FP8 path is future work).
//
// Stream semantics: everything is enqueued on `stream`; no allocation, no synchronization, no
// host reads of device data (max_q_len sizes the grid), so launches can be captured in a CUDA
// graph.
//
// Errors: argument problems detectable on the host throw pagedkv::Error before anything is
// enqueued; CUDA errors are returned. Device data is trusted but clamped: seq_lens to the table
// row, q_len_i to [0, max_q_len]; a block id outside the pool reads zeros instead of faulting; a
// sequence with q_len_i > seq_lens[i] gets zero rows (lse -inf) for the tokens that would sit
// before position 0. validate_block_table() and the CPU reference check the host copies.
// Thread-safety: any number of host threads may launch concurrently.
#pragma once

#include <cuda_runtime_api.h>

#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv {

// Query rows ((token, head) pairs) per CTA.
inline constexpr int kCudaExtendTileRows = 64;

// The host-side checks paged_extend_attention performs: validate(params), plus head_dim in
// {64, 128, 256}; 16-byte aligned q / k_cache / v_cache / out, 4-byte aligned lse; q and out
// strides multiples of 8 elements; num_seqs and the number of query tiles,
// ceil(max_q_len x group / kCudaExtendTileRows), at most 65535 each. Throws pagedkv::Error.
void validate_cuda_extend(const PagedExtendParams& params);

// Enqueues extend attention for one layer. `params` points to device memory (q_indptr,
// block_table and seq_lens included).
cudaError_t paged_extend_attention(const PagedExtendParams& params, cudaStream_t stream);

}  // namespace pagedkv
