// pagedkv/reference/extend_attention.hpp: paged extend (prefix-hit prefill) attention, its
// parameters and its CPU reference.
//
// A varlen batch: sequence i has q_len_i = q_indptr[i + 1] - q_indptr[i] new tokens (rows
// q_indptr[i] .. q_indptr[i + 1] - 1 of q and out) and seq_lens[i] tokens in the cache, the new
// ones included: their K/V must already be appended (kv_append, pagedkv/reference/cache_ops.hpp).
// The cached prefix is the rest, prefix_i = seq_lens[i] - q_len_i tokens (0 = a plain prefill; the
// prefix-cache hit otherwise); as in vLLM, the prefix length is derived rather than passed, so the
// two lengths can never disagree. The causal mask is aligned bottom-right: new token j (0-based)
// sits at position prefix_i + j and sees every key at positions <= its own (the whole cached
// prefix and new tokens 0..j). With a sliding window W > 0 it sees only positions
// (pos - W, pos], as decode attention's "last W tokens" does for its one token. Query head h reads
// KV head h / (num_q_heads / num_kv_heads) (GQA). For each new token and query head:
//   logit_t = sm_scale x (q . k_t)                  (or cap x tanh(sm_scale x (q . k_t) / cap))
//   out     = sum_t softmax(logit)_t x v_t          over the visible t
//   lse     = log(sum_t exp(logit_t))               (natural log; optional output)
// The log-sum-exp lets partial results over disjoint key sets be merged exactly (shared-prefix /
// cascade attention): out = sum_k exp(lse_k - L) out_k with L = log(sum_k exp(lse_k)).
// With q_len_i = 1 this is decode attention of that token. Cache slots past seq_lens[i] may hold
// anything, NaN included: they are never read.
//
// An FP8 cache (params.quant, pagedkv/device/kv_quant.hpp): each cached value is dequantized
// exactly as the kernels do (fp8.hpp: decode x scale, one float32 rounding) before it enters the
// double computation; q and out stay params.dtype (fp16 / bf16).
//
// PagedExtendParams is a plain description of raw buffers: host buffers for the CPU reference
// here, device buffers for the CUDA kernel (pagedkv/cuda/extend_attention.hpp), with one meaning.
//
// The CPU reference gathers each sequence's keys and values once, then runs an online softmax in
// double per (new token, query head), and checks everything it reads (offsets, lengths, block
// ids). Complexity O(sum_i q_len_i x seq_lens[i] x num_q_heads x head_dim). Thread-compatible:
// concurrent calls are fine on distinct outputs. Errors: pagedkv::Error before any output is
// written.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/device/kv_layout.hpp"
#include "pagedkv/device/paged_kv.hpp"

namespace pagedkv {

// The shared paged-KV fields (cache planes, block table, lengths, scale, soft-cap, window) come
// from PagedKVParams; seq_lens is each sequence's total KV length: cached prefix + new tokens.
struct PagedExtendParams : PagedKVParams {
  // [num_seqs + 1] query row offsets: first 0, non-decreasing; the last is num_q_tokens.
  const std::int32_t* q_indptr = nullptr;
  // At least every sequence's new-token count q_len_i; sizes the CUDA grid without reading
  // device data (rows past it are not computed on the GPU; the reference rejects them).
  std::int32_t max_q_len = 0;

  // [num_q_tokens, num_q_heads, head_dim] queries of the new tokens; strides in elements,
  // 0 = dense.
  const void* q = nullptr;
  std::int64_t q_stride_token = 0;
  std::int64_t q_stride_head = 0;

  // [num_q_tokens, num_q_heads, head_dim] attention output; strides in elements, 0 = dense.
  void* out = nullptr;
  std::int64_t out_stride_token = 0;
  std::int64_t out_stride_head = 0;
  // [num_q_tokens, num_q_heads] float natural-log log-sum-exp of each row's logits, dense;
  // null = not wanted.
  float* lse = nullptr;

  // Strides with the dense defaults applied.
  constexpr std::int64_t q_head_stride() const noexcept {
    return q_stride_head != 0 ? q_stride_head : layout.head_dim;
  }
  constexpr std::int64_t q_token_stride() const noexcept {
    return q_stride_token != 0 ? q_stride_token
                               : static_cast<std::int64_t>(num_q_heads) * layout.head_dim;
  }
  constexpr std::int64_t out_head_stride() const noexcept {
    return out_stride_head != 0 ? out_stride_head : layout.head_dim;
  }
  constexpr std::int64_t out_token_stride() const noexcept {
    return out_stride_token != 0 ? out_stride_token
                                 : static_cast<std::int64_t>(num_q_heads) * layout.head_dim;
  }
};

// Checks everything that does not need to read the buffers: shapes, the layout, strides (not
// negative; a head's row fits before the next token's; the rows of min(num_seqs x max_q_len,
// INT32_MAX) tokens end within 64-bit offsets), pointers present, max_q_len not
// negative, scale and cap finite, window not negative. Throws pagedkv::Error naming the field.
void validate(const PagedExtendParams& params);

// Checks the host copies of a batch's per-sequence data, as an engine builds them before
// uploading (the CUDA kernel cannot read them on the host and trusts them, clamping what it
// must): q_indptr has num_seqs + 1 entries, starts at 0 and never decreases; every sequence's
// new-token count q_len_i = q_indptr[i + 1] - q_indptr[i] is at most max_q_len and at most
// seq_lens[i] (its K/V must be appended first); and every block id the first seq_lens[i]
// tokens use lies in its table row and in [0, num_blocks) (validate_block_table). Throws
// pagedkv::Error naming the sequence: kInvalidArgument for a bad q_indptr or shape, kOutOfRange
// for a length or block id out of range. The CPU reference runs the same checks.
void validate_extend_metadata(std::span<const std::int32_t> q_indptr, std::int32_t max_q_len,
                              std::span<const std::int32_t> seq_lens,
                              std::span<const std::int32_t> block_table,
                              std::int32_t max_blocks_per_seq, std::int32_t block_size,
                              std::int64_t num_blocks);

// The exact (double) results of the CPU reference, dense:
struct ExtendReference {
  std::vector<double> out;  // [num_q_tokens, num_q_heads, head_dim]
  std::vector<double> lse;  // [num_q_tokens, num_q_heads]
};

// CPU reference (host buffers). Also checks the data: q_indptr starts at 0 and never decreases,
// every q_len_i <= max_q_len and <= seq_lens[i], seq_lens fit their table row, and every block id
// it needs lies inside the pool. params.out and params.lse are not touched and may be null.
ExtendReference reference_paged_extend_attention_f64(const PagedExtendParams& params);

// CPU reference writing params.out (the double result rounded to float, then to params.dtype,
// nearest even both times) and, when not null, params.lse (rounded to float).
void reference_paged_extend_attention(const PagedExtendParams& params);

}  // namespace pagedkv
