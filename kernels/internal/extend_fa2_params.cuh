// kernels/internal/extend_fa2_params.cuh: the kernel parameters of the paged extend kernels built
// on the FA2 tile geometry (kernels/extend_attention_fa2.cu, ExtendKernel::kFa2, and
// kernels/extend_attention_wgmma.cu, ExtendKernel::kWgmma): the flat struct a launch passes by
// value, the clamped lengths of a sequence (the default kernel's rules), and its construction from
// validated PagedExtendParams, and where a CTA's keys live (Fa2KeyPages: the page offsets its
// K/V ring is filled from). Internal to pagedkv::cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "internal/decode_tc_layout.hpp"
#include "internal/extend_fa2_layout.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv::kernels::fa2 {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

struct Fa2Params {
  const std::uint16_t* q;  // [num_q_tokens, num_q_heads, head_dim]
  std::int64_t q_stride_token;
  std::int64_t q_stride_head;
  const std::uint16_t* k_cache;
  const std::uint16_t* v_cache;
  detail::TcPageGeometry page;  // head_offset 0; the kernel adds its KV head's
  std::int64_t stride_head;
  std::int32_t num_q_heads;
  std::int32_t group;
  const std::int32_t* q_indptr;
  std::int32_t max_q_len;
  const std::int32_t* block_table;
  std::int32_t max_blocks_per_seq;
  const std::int32_t* seq_lens;
  std::uint16_t* out;
  std::int64_t out_stride_token;
  std::int64_t out_stride_head;
  float* lse;         // natural log, [num_q_tokens, num_q_heads] or null
  float score_scale;  // times the fp32 scores: sm_scale x log2(e); with a soft-cap sm_scale / cap
  float cap_log2;     // cap x log2(e); 0 = no soft-cap
  std::int32_t window_size;
  std::int32_t num_splits;
  std::int32_t rows;   // query rows per CTA (Fa2Shape::kRows of the launched kernel)
  std::int32_t keys;   // keys per K/V tile
  float* partial_out;  // [states][head_dim]
  float* partial_lse;  // [states], log2
};

// The sequence's clamped lengths (the default kernel's rules).
struct SeqLens {
  int q_begin;
  int q_len;
  int prefix;
};
__device__ __forceinline__ SeqLens seq_lens_of(const Fa2Params& p, int seq) {
  SeqLens s{};
  s.q_begin = __ldg(p.q_indptr + seq);
  const std::int64_t raw_q = static_cast<std::int64_t>(__ldg(p.q_indptr + seq + 1)) - s.q_begin;
  s.q_len = static_cast<int>(raw_q < 0 ? 0 : (raw_q > p.max_q_len ? p.max_q_len : raw_q));
  const std::int64_t capacity = static_cast<std::int64_t>(p.max_blocks_per_seq) * p.page.block_size;
  const std::int64_t raw_kv = __ldg(p.seq_lens + seq);
  const int kv_len = static_cast<int>(raw_kv < 0 ? 0 : (raw_kv > capacity ? capacity : raw_kv));
  s.prefix = kv_len - s.q_len;
  return s;
}

// Where a CTA's keys live: its (sequence, KV head) page geometry and block-table row, and its
// split's keys (key_first + t x keys + i of key tile t, up to kv_end).
struct Fa2KeyPages {
  detail::TcPageGeometry page;
  const std::int32_t* table_row;
  int key_first;
  int kv_end;
  int tiles;  // key tiles of the split

  // The element offsets of tile t's keys into slot fa2_slot(t, kStages) of `offsets`
  // ([kStages][kKeys]): thread tid < kKeys resolves key tid; -1 (zero-fill) for a tile past the
  // split, a key past kv_end or a block id outside the pool.
  template <int kKeys, int kStages>
  __device__ __forceinline__ void resolve(std::int64_t* offsets, int t, int tid) const {
    if (tid < kKeys) {
      offsets[detail::fa2_slot(t, kStages) * kKeys + tid] =
          t < tiles ? detail::tc_token_offset(page, table_row, key_first + t * kKeys + tid, kv_end)
                    : -1;
    }
  }
};
__device__ __forceinline__ Fa2KeyPages fa2_key_pages(const Fa2Params& p, int seq, int kv_head,
                                                     int key_first, int kv_end, int tiles) {
  detail::TcPageGeometry page = p.page;
  page.head_offset = static_cast<std::int64_t>(kv_head) * p.stride_head;
  return {page, p.block_table + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq, key_first,
          kv_end, tiles};
}

// Validated params (16-bit cache); num_splits >= 1 and, when > 1, a workspace of
// fa2_workspace_bytes. rows and keys are the launch's to set.
inline Fa2Params make_fa2_params(const PagedExtendParams& params, int num_splits, void* workspace) {
  const KVLayout& layout = params.layout;
  Fa2Params kp{};
  kp.q = static_cast<const std::uint16_t*>(params.q);
  kp.q_stride_token = params.q_token_stride();
  kp.q_stride_head = params.q_head_stride();
  kp.k_cache = static_cast<const std::uint16_t*>(params.k_cache);
  kp.v_cache = static_cast<const std::uint16_t*>(params.v_cache);
  kp.page.stride_block = layout.stride_block;
  kp.page.stride_token = layout.stride_token;
  kp.page.head_offset = 0;
  kp.page.num_blocks = layout.num_blocks;
  kp.page.block_size = layout.block_size;
  kp.page.block_shift = detail::tc_block_shift(layout.block_size);
  kp.stride_head = layout.stride_head;
  kp.num_q_heads = params.num_q_heads;
  kp.group = params.group_size();
  kp.q_indptr = params.q_indptr;
  kp.max_q_len = params.max_q_len;
  kp.block_table = params.block_table;
  kp.max_blocks_per_seq = params.max_blocks_per_seq;
  kp.seq_lens = params.seq_lens;
  kp.out = static_cast<std::uint16_t*>(params.out);
  kp.out_stride_token = params.out_token_stride();
  kp.out_stride_head = params.out_head_stride();
  kp.lse = params.lse;
  if (params.logits_soft_cap > 0.0f) {
    kp.score_scale = params.sm_scale / params.logits_soft_cap;
    kp.cap_log2 = params.logits_soft_cap * kLog2e;
  } else {
    kp.score_scale = params.sm_scale * kLog2e;
    kp.cap_log2 = 0.0f;
  }
  kp.window_size = params.window_size;
  kp.num_splits = num_splits < 1 ? 1 : num_splits;
  if (kp.num_splits > 1) {
    const std::int64_t states =
        detail::fa2_states(params.num_seqs, params.max_q_len, params.num_q_heads, kp.num_splits);
    auto* base = static_cast<unsigned char*>(workspace);
    kp.partial_out = reinterpret_cast<float*>(base);
    kp.partial_lse = reinterpret_cast<float*>(base + states * layout.head_dim * 4);
  }
  return kp;
}

}  // namespace pagedkv::kernels::fa2
