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
// FP8 (issue 36): with KVScaleMode::kPerTokenHead each block of a plane carries its own scales
// right after its codes: a block is [codes: block_size x num_kv_heads x head_dim bytes, laid out
// by the strides][scales: float32 [block_size][num_kv_heads] at scale_offset][padding to 16
// bytes]. The scale of (block, token, head) is the float at byte scale_byte_offset(...). So a
// block's codes and scales are one range of stride_block bytes (NHD / HND), and everything that
// moves a block as bytes (copy_blocks, swap_blocks, the host / remote tiers' chunks of
// stride_block bytes) moves its scales with it, byte-exact. Sizing counts them: for one token
// 2 x layers x kv_heads x (head_dim x 1 + 4) bytes (Llama-3-8B: 66 KiB, vs 128 KiB in bf16), and
// one block 2 x layers x round_up(block_size x kv_heads x (head_dim + 4), 16) bytes. With
// kPerTensor an FP8 block is just its codes (1 byte per value) and the two scales per layer are
// the engine's.
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
  KVScaleMode scale_mode = KVScaleMode::kNone;  // kPerTensor / kPerTokenHead for the FP8 dtypes

  // Throws pagedkv::Error unless every count is positive and (dtype, scale_mode) is a cache
  // format (validate_kv_format).
  void validate() const;
};

// 2 x layers x kv_heads x (head_dim x bytes per value + 4 for a kPerTokenHead scale). Throws like
// KVCacheSpec::validate().
std::int64_t kv_bytes_per_token(const KVCacheSpec& spec);
// The memory one block id stands for, over all layers: kv_bytes_per_token x block_size, except
// with kPerTokenHead scales, 2 x layers x round_up(block_size x kv_heads x (head_dim + 4), 16)
// (KVLayout::nhd_scaled's stride_block per plane).
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
  // FP8 with per-(token, KV head) scales only (1-byte elements): elements (bytes) from a block's
  // start to its float32 scales [block_size][num_kv_heads]; 0 = the block has no scales.
  std::int64_t scale_offset = 0;

  static constexpr std::int32_t kMaxBlockSize = 256;

  // [num_blocks, block_size, num_kv_heads, head_dim], densely packed.
  static KVLayout nhd(std::int64_t num_blocks, std::int32_t block_size, std::int32_t num_kv_heads,
                      std::int32_t head_dim);
  // [num_blocks, num_kv_heads, block_size, head_dim], densely packed.
  static KVLayout hnd(std::int64_t num_blocks, std::int32_t block_size, std::int32_t num_kv_heads,
                      std::int32_t head_dim);

  // FP8 codes NHD / HND with each block's scales after its codes (see the top): scale_offset =
  // block_size x num_kv_heads x head_dim, stride_block = round_up(scale_offset + 4 x block_size x
  // num_kv_heads, 16). Elements are bytes.
  static KVLayout nhd_scaled(std::int64_t num_blocks, std::int32_t block_size,
                             std::int32_t num_kv_heads, std::int32_t head_dim);
  static KVLayout hnd_scaled(std::int64_t num_blocks, std::int32_t block_size,
                             std::int32_t num_kv_heads, std::int32_t head_dim);

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
  // Byte offset of the float32 scale of (block, token, head) in a plane with scales. No checks.
  constexpr std::int64_t scale_byte_offset(std::int64_t block, std::int64_t token,
                                           std::int64_t head) const noexcept {
    return block * stride_block + scale_offset + (token * num_kv_heads + head) * 4;
  }
  constexpr bool has_scales() const noexcept { return scale_offset != 0; }
  // Bytes of one block's scales: 4 x block_size x num_kv_heads, or 0 without scales.
  constexpr std::int64_t block_scale_bytes() const noexcept {
    return has_scales() ? static_cast<std::int64_t>(block_size) * num_kv_heads * 4 : 0;
  }
  // Elements one block occupies from offset(block, 0, 0): its rows, and its scales if any.
  std::int64_t block_span() const noexcept;
  // Elements a plane's allocation must hold: one past the largest offset used (scales included).
  std::int64_t plane_elements() const noexcept;
  // True when every block's values fill one dense range of block_elements() elements starting
  // at offset(block, 0, 0) (NHD and HND; not padded layouts), followed directly by its scales
  // when it has them (a range of block_span() elements). Block swaps need this.
  bool block_is_contiguous() const noexcept;

  // Throws pagedkv::Error unless: counts positive, block_size <= kMaxBlockSize, head_dim a
  // multiple of 8, strides positive multiples of 8 elements (so every head vector is 16-byte
  // aligned when the plane is), and one block's token/head rows do not overlap each other
  // (stride_token and stride_head each at least head_dim and the two row grids distinct); with
  // scales, scale_offset a multiple of 8 at or past the block's rows and stride_block at least
  // scale_offset + block_scale_bytes() (scale_offset < 0 is rejected too).
  void validate() const;
};

}  // namespace pagedkv
