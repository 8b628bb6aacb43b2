// pagedkv/reference/cache_ops.hpp: writing and moving KV-cache blocks (kv_append, copy_blocks,
// swap_blocks): their parameters, the run coalescing swaps use, and CPU references.
//
//   kv_append    scatter the new tokens' K and V rows [num_tokens, num_kv_heads, head_dim] of one
//                layer into their slots (pagedkv/device/block_table.hpp); a negative slot is
//                skipped. (vLLM: reshape_and_cache.)
//   copy_blocks  copy block src to block dst in every plane (K and V of every layer) of one pool:
//                copy-on-write when a forked sequence writes into a shared last block.
//   swap_blocks  copy blocks between two pools of the same block shape, typically GPU memory
//                and pinned host memory (preemption by swapping, CPU offload); runs of pairs
//                with consecutive src and dst ids are moved as one transfer.
//
// Ids are int64 pairs, laid out like vLLM's block_mapping tensor [num_pairs, 2]. In one call the
// destination ids must be distinct and, for copy_blocks, no destination may also be a source
// (otherwise the result would depend on the order of copies).
//
// FP8 (issue 36): kv_append with params.quant.fp8() quantizes the 16-bit K / V rows into the
// planes' 1-byte codes, exactly with pagedkv/device/fp8.hpp (round to nearest even, saturating,
// NaN stays NaN): per tensor with the engine's k_scale / v_scale, or per (token, KV head) with a
// scale computed from each row's amax and stored in the block (layout.scale_byte_offset).
// copy_blocks and swap_blocks with an FP8 dtype move 1-byte codes and, when the layout has them,
// each block's scales: the destination's bytes equal the source's.
//
// The CPU references take host pointers, check all ids before writing anything and throw
// pagedkv::Error on bad input. Complexity: linear in the bytes moved. Thread-compatible.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/device/kv_layout.hpp"
#include "pagedkv/device/kv_quant.hpp"

namespace pagedkv {

struct KVAppendParams {
  KVDtype dtype = KVDtype::kBFloat16;  // of key and value, and of the cache unless quant.fp8()
  KVQuant quant;                       // an FP8 cache (pagedkv/device/kv_quant.hpp); default none
  std::int64_t num_tokens = 0;

  // [num_tokens, num_kv_heads, head_dim] new keys and values; strides in elements, 0 = dense.
  const void* key = nullptr;
  std::int64_t key_stride_token = 0;
  std::int64_t key_stride_head = 0;
  const void* value = nullptr;
  std::int64_t value_stride_token = 0;
  std::int64_t value_stride_head = 0;

  // [num_tokens] destination slot of each token (block_id x block_size + offset); < 0 = skip.
  const std::int64_t* slot_mapping = nullptr;

  // One layer's key and value planes, both described by `layout`.
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  KVLayout layout;

  constexpr std::int64_t key_token_stride() const noexcept {
    return key_stride_token != 0 ? key_stride_token
                                 : static_cast<std::int64_t>(layout.num_kv_heads) * layout.head_dim;
  }
  constexpr std::int64_t key_head_stride() const noexcept {
    return key_stride_head != 0 ? key_stride_head : layout.head_dim;
  }
  constexpr std::int64_t value_token_stride() const noexcept {
    return value_stride_token != 0
               ? value_stride_token
               : static_cast<std::int64_t>(layout.num_kv_heads) * layout.head_dim;
  }
  constexpr std::int64_t value_head_stride() const noexcept {
    return value_stride_head != 0 ? value_stride_head : layout.head_dim;
  }
};

// Shapes, layout, strides (rows of one token must not overlap, nor a token's rows the next
// token's; the last token's rows end within 64-bit offsets) and pointers. Throws.
void validate(const KVAppendParams& params);

// CPU reference. Also throws (kOutOfRange) for a slot >= layout.num_slots(), and
// (kInvalidArgument) when two tokens target the same slot, before writing anything.
void reference_kv_append(const KVAppendParams& params);

// One block copy; the memory layout of an array of these is int64 [num_pairs, 2].
struct BlockPair {
  std::int64_t src = 0;
  std::int64_t dst = 0;

  friend bool operator==(const BlockPair&, const BlockPair&) = default;
};

// `count` blocks src .. src + count - 1 go to dst .. dst + count - 1.
struct BlockRun {
  std::int64_t src = 0;
  std::int64_t dst = 0;
  std::int64_t count = 0;

  friend bool operator==(const BlockRun&, const BlockRun&) = default;
};

// Merges consecutive pairs whose src and dst both advance by one into runs, in order. Pairs are
// not reordered (the caller may sort them by src first to find more runs). No validation.
std::vector<BlockRun> coalesce_block_runs(std::span<const BlockPair> pairs);

// Checks ids against pools of src_blocks and dst_blocks blocks, distinct destinations and (when
// same_pool) no destination that is also a source. Throws pagedkv::Error naming the pair.
void validate_block_pairs(std::span<const BlockPair> pairs, std::int64_t src_blocks,
                          std::int64_t dst_blocks, bool same_pool);

// CPU reference of copy_blocks: `planes` are the K and V planes of every layer of one pool, all
// laid out by `layout`, holding `dtype` values (an FP8 dtype: 1-byte codes, and the block's
// scales when layout.has_scales()). Validates the pairs first.
void reference_copy_blocks(std::span<void* const> planes, const KVLayout& layout, KVDtype dtype,
                           std::span<const BlockPair> pairs);

// Throws unless the two layouts hold the same blocks (block_size, heads, head_dim, token and head
// strides) and each block is one contiguous range in both (KVLayout::block_is_contiguous), and
// the plane lists have the same, non-zero length.
void validate_swap_layouts(const KVLayout& src_layout, const KVLayout& dst_layout,
                           std::size_t num_src_planes, std::size_t num_dst_planes);

// CPU reference of swap_blocks: block pair.src of src_planes[i] -> block pair.dst of
// dst_planes[i], for every plane i. Validates layouts and pairs first.
void reference_swap_blocks(std::span<const void* const> src_planes, const KVLayout& src_layout,
                           std::span<void* const> dst_planes, const KVLayout& dst_layout,
                           KVDtype dtype, std::span<const BlockPair> pairs);

}  // namespace pagedkv
