// kv_append, copy_blocks and swap_blocks (see include/pagedkv/cuda/cache_ops.hpp).
// Both kernels move 16-bit values as raw 16-byte vectors, so one instantiation serves fp16 and
// bf16. FP8 parameters go to kernels/fp8_cache_ops.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fp8_kernels.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/cuda/cache_ops.hpp"

namespace pagedkv {

namespace {

constexpr int kAppendThreads = 128;
constexpr int kCopyThreads = 256;
constexpr int kCopyUnroll = 4;  // 16-byte loads in flight per thread

[[noreturn]] void fail(const char* where, const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, std::string(where) + " (CUDA): " + message);
}

bool aligned16(const void* ptr) {
  return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
}

// ---- kv_append ----

struct AppendKernelParams {
  const std::uint16_t* key;
  const std::uint16_t* value;
  std::int64_t key_stride_token;
  std::int64_t key_stride_head;
  std::int64_t value_stride_token;
  std::int64_t value_stride_head;
  const std::int64_t* slot_mapping;
  std::uint16_t* k_cache;
  std::uint16_t* v_cache;
  std::int64_t stride_block;
  std::int64_t stride_token;
  std::int64_t stride_head;
  std::int64_t num_slots;
  std::int32_t block_size;
  std::int32_t num_kv_heads;
  std::int32_t vecs_per_row;  // head_dim / 8
};

// One CTA per token; thread i copies 16-byte vector i of the token's K and V rows.
__global__ void __launch_bounds__(kAppendThreads) kv_append_kernel(const AppendKernelParams p) {
  const std::int64_t token = blockIdx.x;
  const std::int64_t slot = p.slot_mapping[token];
  if (slot < 0 || slot >= p.num_slots) return;  // skipped, or a bad slot: never write out of bounds
  const std::int64_t block = slot / p.block_size;
  const std::int64_t in_block = slot - block * p.block_size;
  const std::int64_t dst_base = block * p.stride_block + in_block * p.stride_token;
  const int vecs = p.num_kv_heads * p.vecs_per_row;
  for (int i = static_cast<int>(threadIdx.x); i < vecs; i += kAppendThreads) {
    const int head = i / p.vecs_per_row;
    const int v = i - head * p.vecs_per_row;
    const uint4 k = __ldg(reinterpret_cast<const uint4*>(p.key + token * p.key_stride_token +
                                                         head * p.key_stride_head + v * 8));
    const uint4 val = __ldg(reinterpret_cast<const uint4*>(p.value + token * p.value_stride_token +
                                                           head * p.value_stride_head + v * 8));
    const std::int64_t dst = dst_base + head * p.stride_head + v * 8;
    *reinterpret_cast<uint4*>(p.k_cache + dst) = k;
    *reinterpret_cast<uint4*>(p.v_cache + dst) = val;
  }
}

// ---- copy_blocks ----

struct CopyKernelParams {
  std::uint16_t* planes[kCudaCopyMaxPlanes];
  const BlockPair* pairs;
  std::int64_t num_blocks;
  std::int64_t stride_block;
  std::int64_t stride_token;
  std::int64_t stride_head;
  std::int32_t num_kv_heads;
  std::int32_t vecs_per_row;  // head_dim / 8
  std::int64_t block_vecs;    // 16-byte vectors per block
  bool contiguous;            // a block is one dense range: copy it flat
};

// grid = (num_pairs, num_planes): one CTA copies one block of one plane.
__global__ void __launch_bounds__(kCopyThreads) copy_blocks_kernel(const CopyKernelParams p) {
  const BlockPair pair = p.pairs[blockIdx.x];
  if (pair.src < 0 || pair.src >= p.num_blocks || pair.dst < 0 || pair.dst >= p.num_blocks) return;
  std::uint16_t* plane = p.planes[blockIdx.y];
  const std::uint16_t* src = plane + pair.src * p.stride_block;
  std::uint16_t* dst = plane + pair.dst * p.stride_block;
  // Element offset of vector i of a block (row-major over token, head, vector).
  const auto offset = [&](std::int64_t i) -> std::int64_t {
    if (p.contiguous) return i * 8;
    const std::int64_t row = i / p.vecs_per_row;
    const std::int64_t v = i - row * p.vecs_per_row;
    const std::int64_t token = row / p.num_kv_heads;
    const std::int64_t head = row - token * p.num_kv_heads;
    return token * p.stride_token + head * p.stride_head + v * 8;
  };
  for (std::int64_t base = threadIdx.x; base < p.block_vecs;
       base += static_cast<std::int64_t>(kCopyThreads) * kCopyUnroll) {
    uint4 data[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const std::int64_t i = base + static_cast<std::int64_t>(u) * kCopyThreads;
      if (i < p.block_vecs) data[u] = *reinterpret_cast<const uint4*>(src + offset(i));
    }
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const std::int64_t i = base + static_cast<std::int64_t>(u) * kCopyThreads;
      if (i < p.block_vecs) *reinterpret_cast<uint4*>(dst + offset(i)) = data[u];
    }
  }
}

}  // namespace

cudaError_t kv_append(const KVAppendParams& params, cudaStream_t stream) {
  constexpr const char* kWhere = "kv_append";
  validate(params);
  if (params.num_tokens == 0) return cudaSuccess;
  if (params.quant.fp8()) return kernels::fp8_kv_append(params, stream);  // fp8_cache_ops.cu
  if (!aligned16(params.key) || !aligned16(params.value) || !aligned16(params.k_cache) ||
      !aligned16(params.v_cache)) {
    fail(kWhere, "key, value, k_cache and v_cache must be 16-byte aligned");
  }
  for (const std::int64_t stride : {params.key_token_stride(), params.key_head_stride(),
                                    params.value_token_stride(), params.value_head_stride()}) {
    if (stride % 8 != 0) fail(kWhere, "key and value strides must be multiples of 8 elements");
  }
  if (params.num_tokens > std::numeric_limits<std::int32_t>::max()) {
    fail(kWhere, "at most 2^31 - 1 tokens per launch, got " + std::to_string(params.num_tokens));
  }
  const KVLayout& layout = params.layout;
  AppendKernelParams kp{};
  kp.key = static_cast<const std::uint16_t*>(params.key);
  kp.value = static_cast<const std::uint16_t*>(params.value);
  kp.key_stride_token = params.key_token_stride();
  kp.key_stride_head = params.key_head_stride();
  kp.value_stride_token = params.value_token_stride();
  kp.value_stride_head = params.value_head_stride();
  kp.slot_mapping = params.slot_mapping;
  kp.k_cache = static_cast<std::uint16_t*>(params.k_cache);
  kp.v_cache = static_cast<std::uint16_t*>(params.v_cache);
  kp.stride_block = layout.stride_block;
  kp.stride_token = layout.stride_token;
  kp.stride_head = layout.stride_head;
  kp.num_slots = layout.num_slots();
  kp.block_size = layout.block_size;
  kp.num_kv_heads = layout.num_kv_heads;
  kp.vecs_per_row = layout.head_dim / 8;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(params.num_tokens));
  config.blockDim = dim3(kAppendThreads);
  config.stream = stream;
  return cudaLaunchKernelEx(&config, kv_append_kernel, kp);
}

cudaError_t copy_blocks(std::span<void* const> planes, const KVLayout& layout, KVDtype dtype,
                        const BlockPair* pairs, std::int64_t num_pairs, cudaStream_t stream) {
  constexpr const char* kWhere = "copy_blocks";
  layout.validate();
  if (layout.has_scales() && !is_fp8(dtype)) {
    fail(kWhere, "a layout with scales needs an FP8 dtype");
  }
  if (num_pairs < 0) fail(kWhere, "num_pairs must not be negative");
  if (num_pairs > std::numeric_limits<std::int32_t>::max()) {
    fail(kWhere, "at most 2^31 - 1 pairs per call, got " + std::to_string(num_pairs));
  }
  if (num_pairs == 0 || planes.empty()) return cudaSuccess;
  if (pairs == nullptr) fail(kWhere, "pairs is null");
  for (std::size_t i = 0; i < planes.size(); ++i) {
    if (planes[i] == nullptr || !aligned16(planes[i])) {
      fail(kWhere, "plane " + std::to_string(i) + " is null or not 16-byte aligned");
    }
  }
  // FP8 codes (and each block's scales): fp8_cache_ops.cu. 16-bit values are copied as bits.
  if (is_fp8(dtype)) return kernels::fp8_copy_blocks(planes, layout, pairs, num_pairs, stream);
  CopyKernelParams kp{};
  kp.pairs = pairs;
  kp.num_blocks = layout.num_blocks;
  kp.stride_block = layout.stride_block;
  kp.stride_token = layout.stride_token;
  kp.stride_head = layout.stride_head;
  kp.num_kv_heads = layout.num_kv_heads;
  kp.vecs_per_row = layout.head_dim / 8;
  kp.block_vecs = layout.block_elements() / 8;
  // NHD and HND blocks are one dense range with the same arrangement in src and dst: copy flat.
  kp.contiguous = layout.block_is_contiguous();
  for (std::size_t first = 0; first < planes.size(); first += kCudaCopyMaxPlanes) {
    const std::size_t count = std::min(kCudaCopyMaxPlanes, planes.size() - first);
    for (std::size_t i = 0; i < count; ++i) {
      kp.planes[i] = static_cast<std::uint16_t*>(planes[first + i]);
    }
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(num_pairs), static_cast<unsigned>(count));
    config.blockDim = dim3(kCopyThreads);
    config.stream = stream;
    const cudaError_t err = cudaLaunchKernelEx(&config, copy_blocks_kernel, kp);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t swap_blocks(std::span<const void* const> src_planes, const KVLayout& src_layout,
                        std::span<void* const> dst_planes, const KVLayout& dst_layout,
                        KVDtype dtype, std::span<const BlockPair> pairs, cudaStream_t stream) {
  constexpr const char* kWhere = "swap_blocks";
  validate_swap_layouts(src_layout, dst_layout, src_planes.size(), dst_planes.size());
  if (src_layout.has_scales() && !is_fp8(dtype)) {
    fail(kWhere, "a layout with scales needs an FP8 dtype");
  }
  validate_block_pairs(pairs, src_layout.num_blocks, dst_layout.num_blocks, /*same_pool=*/false);
  if (pairs.empty()) return cudaSuccess;
  for (std::size_t i = 0; i < src_planes.size(); ++i) {
    if (src_planes[i] == nullptr || dst_planes[i] == nullptr) {
      fail(kWhere, "plane " + std::to_string(i) + " is null");
    }
  }
  // Destinations are distinct and the pools differ, so the order of copies does not matter:
  // sort by source to find the longest runs.
  std::vector<BlockPair> sorted(pairs.begin(), pairs.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const BlockPair& a, const BlockPair& b) { return a.src < b.src; });
  const std::vector<BlockRun> runs = coalesce_block_runs(sorted);

  const std::size_t value_bytes = bytes_per_value(dtype);
  // An FP8 block with per-row scales is its codes followed by its scales (block_span bytes).
  const std::size_t block_bytes =
      static_cast<std::size_t>(is_fp8(dtype) ? src_layout.block_span()
                                             : src_layout.block_elements()) *
      value_bytes;
  const std::size_t src_pitch = static_cast<std::size_t>(src_layout.stride_block) * value_bytes;
  const std::size_t dst_pitch = static_cast<std::size_t>(dst_layout.stride_block) * value_bytes;
  // cudaMemcpy2DAsync rows per call; larger runs are issued in pieces.
  constexpr std::int64_t kMaxRows = 1 << 15;
  for (std::size_t plane = 0; plane < src_planes.size(); ++plane) {
    const auto* src = static_cast<const unsigned char*>(src_planes[plane]);
    auto* dst = static_cast<unsigned char*>(dst_planes[plane]);
    for (const BlockRun& run : runs) {
      for (std::int64_t done = 0; done < run.count; done += kMaxRows) {
        const std::int64_t rows = std::min(kMaxRows, run.count - done);
        const unsigned char* from = src + static_cast<std::size_t>(run.src + done) * src_pitch;
        unsigned char* to = dst + static_cast<std::size_t>(run.dst + done) * dst_pitch;
        cudaError_t err;
        if (src_pitch == block_bytes && dst_pitch == block_bytes) {
          err = cudaMemcpyAsync(to, from, block_bytes * static_cast<std::size_t>(rows),
                                cudaMemcpyDefault, stream);
        } else {
          err = cudaMemcpy2DAsync(to, dst_pitch, from, src_pitch, block_bytes,
                                  static_cast<std::size_t>(rows), cudaMemcpyDefault, stream);
        }
        if (err != cudaSuccess) return err;
      }
    }
  }
  return cudaSuccess;
}

}  // namespace pagedkv
