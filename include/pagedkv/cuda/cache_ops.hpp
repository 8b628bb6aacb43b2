// pagedkv/cuda/cache_ops.hpp: kv_append, copy_blocks and swap_blocks on the GPU (target
// pagedkv::cuda). Same meaning as the CPU references in pagedkv/reference/cache_ops.hpp.
//
//   kv_append    one CTA per new token; 16-byte loads and stores; head_dim any multiple of 8.
//   copy_blocks  one launch for every plane (K and V of every layer, up to kCudaCopyMaxPlanes per
//                launch; more are split into several launches) and every pair: 16-byte copies,
//                four in flight per thread. Pairs live in device memory.
//   swap_blocks  cudaMemcpyAsync / cudaMemcpy2DAsync between two pools (device and pinned host
//                memory), one transfer per plane and run of consecutive blocks: pairs are
//                sorted by source id, then runs with consecutive source and destination ids are
//                coalesced (pagedkv::coalesce_block_runs). Pairs live in host memory.
//
// FP8 (issue 36; params.quant.fp8() or an FP8 dtype): kv_append quantizes each (token, head) row
// in one warp (kernels/fp8_cache_ops.cu) and writes the CPU reference's bytes, codes and scales;
// copy_blocks copies 8-byte words of codes and each block's scales; swap_blocks moves whole
// blocks (codes + scales, KVLayout::block_span bytes). head_dim up to 256 for FP8 kv_append.
//
// All calls enqueue on `stream` without allocating device memory or synchronizing, so they can
// be captured in a CUDA graph (swap_blocks only with pinned host memory, as CUDA requires).
// Errors: host-detectable argument problems throw pagedkv::Error before anything is enqueued
// (bad layout or shapes, misaligned pointers or strides, and for swap_blocks bad or duplicate
// ids); CUDA errors are returned. Device data is trusted: a kv_append slot or a copy_blocks id
// outside the pool is skipped rather than written out of bounds; duplicate destinations are a
// caller error the GPU cannot detect (the result is then unspecified).
// Thread-safety: any number of host threads may launch concurrently.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "pagedkv/reference/cache_ops.hpp"

namespace pagedkv {

inline constexpr std::size_t kCudaCopyMaxPlanes = 256;

// Scatters params.num_tokens rows of K and V (device memory) into their slots. Requires 16-byte
// aligned key, value, k_cache, v_cache and strides that are multiples of 8 elements.
cudaError_t kv_append(const KVAppendParams& params, cudaStream_t stream);

// planes: host array of device pointers (16-byte aligned), the K and V planes of every layer,
// all laid out by `layout`. pairs: device array [num_pairs] (int64 [num_pairs, 2]).
cudaError_t copy_blocks(std::span<void* const> planes, const KVLayout& layout, KVDtype dtype,
                        const BlockPair* pairs, std::int64_t num_pairs, cudaStream_t stream);

// src_planes[i] and dst_planes[i] are the same plane in two pools (device or pinned host
// pointers); pairs are host memory, checked before anything is enqueued.
cudaError_t swap_blocks(std::span<const void* const> src_planes, const KVLayout& src_layout,
                        std::span<void* const> dst_planes, const KVLayout& dst_layout,
                        KVDtype dtype, std::span<const BlockPair> pairs, cudaStream_t stream);

}  // namespace pagedkv
