// pagedkv/device/kv_layout.hpp: how much memory the KV cache needs, and where a cached value lives.
//
// Sizing (docs/kernels.md): each token stores one key and one value vector per layer and per
// KV head, so bytes per token = 2 x layers x kv_heads x head_dim x bytes per value. GQA/MQA models
// have fewer KV heads than query heads, and this is what they save: Llama-2-7B (32 layers, 32 KV
// heads, head_dim 128, fp16) needs 512 KiB per token, Llama-3-8B (32 layers, 8 KV heads) 128 KiB.
//
// Layout: one layer's keys (and, separately, its values) form a *plane* indexed by
// (block, token in block, kv head, dim). KVLayout gives the element strides of the first three
// indices explicitly, in 64-bit arithmetic; dim is always contiguous (stride 1). NHD
// [num_blocks, block_size, num_kv_heads, head_dim] is the default; HND
// [num_blocks, num_kv_heads, block_size, head_dim] and padded or interleaved layouts (e.g. K and
// V of a block side by side) are the same kernels with other strides.
//
// All functions are O(1) pure functions; value types, thread-compatible. Errors: functions that
// validate throw pagedkv::Error (kInvalidArgument) with the offending value in the message.
#pragma once

#include <cstdint>

#include "pagedkv/device/kv_dtype.hpp"

namespace pagedkv {

// The per-model facts that decide KV-cache size.
struct KVCacheSpec {
  std::int32_t num_layers = 0;    // attention layers that keep a KV cache (> 0)
  std::int32_t num_kv_heads = 0;  // KV heads per layer (> 0); fewer than query heads under GQA
  std::int32_t head_dim = 0;      // dims per head (> 0)
  KVDtype dtype = KVDtype::kBFloat16;

  // Throws pagedkv::Error unless every count is positive.
  void validate() const;
};

// 2 x layers x kv_heads x head_dim x bytes per value. Throws like KVCacheSpec::validate().
std::int64_t kv_bytes_per_token(const KVCacheSpec& spec);
// kv_bytes_per_token x block_size: the memory one block id stands for, over all layers.
std::int64_t kv_bytes_per_block(const KVCacheSpec& spec, std::int32_t block_size);
// How many blocks fit in a memory budget (rounded down). Throws for block_size <= 0 or a
// negative budget.
std::int64_t num_blocks_for_budget(const KVCacheSpec& spec, std::int32_t block_size,
                                   std::int64_t budget_bytes);

// The shape and element strides of one K or V plane of one layer.
struct KVLayout {
  std::int64_t num_blocks = 0;    // physical blocks in the pool (> 0)
  std::int32_t block_size = 0;    // tokens per block, 1..kMaxBlockSize
  std::int32_t num_kv_heads = 0;  // (> 0)
  std::int32_t head_dim = 0;      // multiple of 8 (one 16-byte vector of 16-bit values)
  std::int64_t stride_block = 0;  // elements between block b and b + 1
  std::int64_t stride_token = 0;  // elements between token t and t + 1 of one block
  std::int64_t stride_head = 0;   // elements between kv head h and h + 1

  static constexpr std::int32_t kMaxBlockSize = 256;

  // [num_blocks, block_size, num_kv_heads, head_dim], densely packed.
  static KVLayout nhd(std::int64_t num_blocks, std::int32_t block_size, std::int32_t num_kv_heads,
                      std::int32_t head_dim);
  // [num_blocks, num_kv_heads, block_size, head_dim], densely packed.
  static KVLayout hnd(std::int64_t num_blocks, std::int32_t block_size, std::int32_t num_kv_heads,
                      std::int32_t head_dim);

  // Element offset of (block, token, head, dim 0). No checks.
  constexpr std::int64_t offset(std::int64_t block, std::int64_t token,
                                std::int64_t head) const noexcept {
    return block * stride_block + token * stride_token + head * stride_head;
  }
  // Slots (token positions) in the pool: num_blocks x block_size.
  constexpr std::int64_t num_slots() const noexcept { return num_blocks * block_size; }
  // Elements of one block's values: block_size x num_kv_heads x head_dim.
  constexpr std::int64_t block_elements() const noexcept {
    return static_cast<std::int64_t>(block_size) * num_kv_heads * head_dim;
  }
  // Elements a plane's allocation must hold: one past the largest offset used.
  std::int64_t plane_elements() const noexcept;
  // True when every block's values fill one dense range of block_elements() elements starting
  // at offset(block, 0, 0) (NHD and HND; not padded layouts). Block swaps need this.
  bool block_is_contiguous() const noexcept;

  // Throws pagedkv::Error unless: counts positive, block_size <= kMaxBlockSize, head_dim a
  // multiple of 8, strides positive multiples of 8 elements (so every head vector is 16-byte
  // aligned when the plane is), and one block's token/head rows do not overlap each other
  // (stride_token and stride_head each at least head_dim and the two row grids distinct).
  void validate() const;
};

}  // namespace pagedkv
