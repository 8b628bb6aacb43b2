// FP8 kv_append and copy_blocks (issue 36; contract in include/pagedkv/cuda/cache_ops.hpp and
// pagedkv/device/kv_quant.hpp). Separate kernels: the 16-bit kernels of cache_ops.cu are unchanged,
// their host entry points hand FP8 parameters to the functions here.
//
// kv_append: one CTA per token, one warp per (KV head, K or V) row. Each lane quantizes
// head_dim / 32 values (rounded up; a row of head_dim 8 uses 8 lanes) with fp8.hpp's device code,
// which gives the bytes of the CPU reference (same integer encode, __fdiv_rn / __fdiv_rz). With
// per-(token, head) scales the warp first reduces the row's largest finite magnitude (a max of
// non-negative floats compared as integers, so the order does not matter), lane 0 stores the
// scale beside the block.
// copy_blocks: one CTA per (pair, plane) copies the block's rows in 8-byte words (a row is
// head_dim bytes, a multiple of 8) and its scales in 4-byte words.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "fp8_kernels.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/device/fp8.hpp"

namespace pagedkv::kernels {

namespace {

constexpr int kAppendWarps = 4;
constexpr int kCopyThreads = 256;

[[noreturn]] void fail(const char* where, const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, std::string(where) + " (CUDA): " + message);
}

struct Fp8AppendParams {
  const std::uint16_t* key;
  const std::uint16_t* value;
  std::int64_t key_stride_token;
  std::int64_t key_stride_head;
  std::int64_t value_stride_token;
  std::int64_t value_stride_head;
  const std::int64_t* slot_mapping;
  std::uint8_t* k_cache;
  std::uint8_t* v_cache;
  KVLayout layout;
  std::int64_t num_slots;
  float k_scale;  // per tensor
  float v_scale;
  bool per_row;  // per-(token, head) scales
  bool bf16;     // the inputs' type (else fp16)
  Fp8Format format;
};

__device__ __forceinline__ float bits_to_float(std::uint16_t bits, bool bf16) {
  return bf16 ? __uint_as_float(static_cast<unsigned>(bits) << 16)
              : __half2float(__ushort_as_half(bits));
}

__global__ void __launch_bounds__(kAppendWarps * 32) fp8_kv_append_kernel(const Fp8AppendParams p) {
  constexpr int kMaxPerLane = 8;  // head_dim <= 256
  const std::int64_t token = blockIdx.x;
  const std::int64_t slot = p.slot_mapping[token];
  if (slot < 0 || slot >= p.num_slots) return;  // skipped, or a bad slot: never write out of bounds
  const std::int64_t block = slot / p.layout.block_size;
  const std::int64_t in_block = slot - block * p.layout.block_size;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int dim = p.layout.head_dim;
  const int per_lane = (dim + 31) / 32;
  for (int row = warp; row < 2 * p.layout.num_kv_heads; row += kAppendWarps) {
    const bool is_value = row % 2 == 1;
    const int head = row / 2;
    const std::uint16_t* src =
        is_value ? p.value + token * p.value_stride_token + head * p.value_stride_head
                 : p.key + token * p.key_stride_token + head * p.key_stride_head;
    float x[kMaxPerLane];
    unsigned amax_bits = 0;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane * per_lane + i;
      x[i] = (i < per_lane && d < dim) ? bits_to_float(src[d], p.bf16) : 0.0f;
      const unsigned magnitude = __float_as_uint(x[i]) & 0x7fffffffu;
      if (magnitude < 0x7f800000u && magnitude > amax_bits) amax_bits = magnitude;
    }
    float scale = is_value ? p.v_scale : p.k_scale;
    if (p.per_row) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        amax_bits = max(amax_bits, __shfl_xor_sync(0xffffffffu, amax_bits, offset));
      }
      scale = fp8_row_scale(p.format, __uint_as_float(amax_bits));
    }
    std::uint8_t* plane = is_value ? p.v_cache : p.k_cache;
    std::uint8_t* codes = plane + fp8_row_offset(p.layout, block, in_block, head);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane * per_lane + i;
      if (i < per_lane && d < dim) codes[d] = quantize_fp8(p.format, x[i], scale);
    }
    if (p.per_row && lane == 0) {
      *reinterpret_cast<float*>(plane + fp8_scale_offset(p.layout, block, in_block, head)) = scale;
    }
  }
}

struct Fp8CopyParams {
  std::uint8_t* planes[kCudaCopyMaxPlanes];
  const BlockPair* pairs;
  KVLayout layout;
};

// grid = (num_pairs, num_planes): one CTA copies one block (rows and scales) of one plane.
__global__ void __launch_bounds__(kCopyThreads) fp8_copy_blocks_kernel(const Fp8CopyParams p) {
  const BlockPair pair = p.pairs[blockIdx.x];
  const KVLayout& l = p.layout;
  if (pair.src < 0 || pair.src >= l.num_blocks || pair.dst < 0 || pair.dst >= l.num_blocks) return;
  std::uint8_t* plane = p.planes[blockIdx.y];
  const int words_per_row = l.head_dim / 8;
  const int rows = l.block_size * l.num_kv_heads;
  for (int i = static_cast<int>(threadIdx.x); i < rows * words_per_row; i += kCopyThreads) {
    const int row = i / words_per_row;
    const int word = i - row * words_per_row;
    const int token = row / l.num_kv_heads;
    const int head = row - token * l.num_kv_heads;
    const std::int64_t src = fp8_row_offset(l, pair.src, token, head) + word * 8;
    const std::int64_t dst = fp8_row_offset(l, pair.dst, token, head) + word * 8;
    *reinterpret_cast<uint2*>(plane + dst) = *reinterpret_cast<const uint2*>(plane + src);
  }
  if (l.scale_offset != 0) {
    for (int i = static_cast<int>(threadIdx.x); i < rows; i += kCopyThreads) {
      *reinterpret_cast<float*>(plane + fp8_scale_offset(l, pair.dst, 0, 0) + 4 * i) =
          *reinterpret_cast<const float*>(plane + fp8_scale_offset(l, pair.src, 0, 0) + 4 * i);
    }
  }
}

}  // namespace

cudaError_t fp8_kv_append(const KVAppendParams& params, cudaStream_t stream) {
  constexpr const char* kWhere = "kv_append";
  // validate(params) ran in kv_append; the 16-bit inputs need 2-byte alignment only here.
  if (params.num_tokens > std::numeric_limits<std::int32_t>::max()) {
    fail(kWhere, "at most 2^31 - 1 tokens per launch, got " + std::to_string(params.num_tokens));
  }
  if (params.layout.head_dim > 256) fail(kWhere, "FP8: head_dim must be at most 256");
  if (params.layout.has_scales() && reinterpret_cast<std::uintptr_t>(params.k_cache) % 4 != 0) {
    fail(kWhere, "FP8: k_cache and v_cache must be 4-byte aligned (scales)");
  }
  Fp8AppendParams kp{};
  kp.key = static_cast<const std::uint16_t*>(params.key);
  kp.value = static_cast<const std::uint16_t*>(params.value);
  kp.key_stride_token = params.key_token_stride();
  kp.key_stride_head = params.key_head_stride();
  kp.value_stride_token = params.value_token_stride();
  kp.value_stride_head = params.value_head_stride();
  kp.slot_mapping = params.slot_mapping;
  kp.k_cache = static_cast<std::uint8_t*>(params.k_cache);
  kp.v_cache = static_cast<std::uint8_t*>(params.v_cache);
  kp.layout = params.layout;
  kp.num_slots = params.layout.num_slots();
  kp.k_scale = params.quant.k_scale;
  kp.v_scale = params.quant.v_scale;
  kp.per_row = params.quant.mode == KVScaleMode::kPerTokenHead;
  kp.bf16 = params.dtype == KVDtype::kBFloat16;
  kp.format = params.quant.format();
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(params.num_tokens));
  config.blockDim = dim3(kAppendWarps * 32);
  config.stream = stream;
  return cudaLaunchKernelEx(&config, fp8_kv_append_kernel, kp);
}

cudaError_t fp8_copy_blocks(std::span<void* const> planes, const KVLayout& layout,
                            const BlockPair* pairs, std::int64_t num_pairs, cudaStream_t stream) {
  constexpr const char* kWhere = "copy_blocks";
  for (std::size_t i = 0; i < planes.size(); ++i) {
    if (reinterpret_cast<std::uintptr_t>(planes[i]) % 8 != 0) {
      fail(kWhere, "FP8 plane " + std::to_string(i) + " is not 8-byte aligned");
    }
  }
  Fp8CopyParams kp{};
  kp.pairs = pairs;
  kp.layout = layout;
  for (std::size_t first = 0; first < planes.size(); first += kCudaCopyMaxPlanes) {
    const std::size_t count = std::min(kCudaCopyMaxPlanes, planes.size() - first);
    for (std::size_t i = 0; i < count; ++i) {
      kp.planes[i] = static_cast<std::uint8_t*>(planes[first + i]);
    }
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(num_pairs), static_cast<unsigned>(count));
    config.blockDim = dim3(kCopyThreads);
    config.stream = stream;
    const cudaError_t err = cudaLaunchKernelEx(&config, fp8_copy_blocks_kernel, kp);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace pagedkv::kernels
