// pagedkv/reference/decode_attention.hpp: paged decode attention, its parameters and its CPU
// reference.
//
// Each sequence contributes q_len query tokens (1: the one being decoded; more: speculative
// decoding's draft tokens verified in one step): q[seq][i] of shape [num_q_heads, head_dim] is
// the token at position pos_i = seq_len - q_len + i and attends over the sequence's cached tokens
// up to and including itself (every query token's K/V included: append them first), which it
// finds through its block-table row. Query head h reads KV head h / (num_q_heads / num_kv_heads)
// (grouped-query attention; MQA and MHA are the extreme group sizes). For each query token and
// head:
//   logit_t = sm_scale x (q . k_t)                  (or cap x tanh(sm_scale x (q . k_t) / cap)
//                                                   with a logit soft-cap, as in Gemma 2)
//   out     = sum_t softmax(logit)_t x v_t          over t in [max(0, pos_i + 1 - window), pos_i]
// (with q_len 1: t in [max(0, seq_len - window), seq_len)). A query token with no position
// (seq_len 0, or pos_i < 0 when seq_len < q_len) gets a zero output. Cache slots past seq_len (the
// unused tail of the last block) may hold anything, NaN included: they are never read.
//
// An FP8 cache (params.quant, pagedkv/device/kv_quant.hpp): each cached value is dequantized
// exactly as the kernels do (fp8.hpp: decode x scale, one float32 rounding) before it enters the
// double computation; q and out stay params.dtype (fp16 / bf16).
//
// PagedDecodeParams is a plain description of raw buffers: host buffers for the CPU reference
// here, device buffers for the CUDA kernel (pagedkv/cuda/decode_attention.hpp), with one meaning.
//
// The CPU reference walks each sequence's blocks in order with an online softmax in double and
// checks everything it reads (lengths, block ids). Complexity O(seq_len x num_q_heads x head_dim)
// per sequence. Thread-compatible: concurrent calls are fine on distinct outputs. Errors:
// pagedkv::Error before any output is written.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/device/kv_layout.hpp"
#include "pagedkv/device/paged_kv.hpp"

namespace pagedkv {

// The shared paged-KV fields (cache planes, block table, lengths, scale, soft-cap, window) come
// from PagedKVParams; seq_lens counts each sequence's cached tokens, the current one included.
struct PagedDecodeParams : PagedKVParams {
  // Query tokens per sequence (>= 1, at most kMaxDecodeQueryLen): 1 for plain decode.
  std::int32_t q_len = 1;

  // [num_seqs, q_len, num_q_heads, head_dim] queries; strides in elements, 0 = dense.
  const void* q = nullptr;
  std::int64_t q_stride_seq = 0;
  std::int64_t q_stride_head = 0;
  std::int64_t q_stride_token = 0;  // between query tokens of one sequence (q_len > 1)

  // [num_seqs, q_len, num_q_heads, head_dim] attention output; strides in elements, 0 = dense.
  void* out = nullptr;
  std::int64_t out_stride_seq = 0;
  std::int64_t out_stride_head = 0;
  std::int64_t out_stride_token = 0;

  // Strides with the dense defaults applied (a sequence's default stride is q_len tokens').
  constexpr std::int64_t q_head_stride() const noexcept {
    return q_stride_head != 0 ? q_stride_head : layout.head_dim;
  }
  constexpr std::int64_t q_token_stride() const noexcept {
    return q_stride_token != 0 ? q_stride_token
                               : static_cast<std::int64_t>(num_q_heads) * layout.head_dim;
  }
  constexpr std::int64_t q_seq_stride() const noexcept {
    return q_stride_seq != 0 ? q_stride_seq : static_cast<std::int64_t>(q_len) * q_token_stride();
  }
  constexpr std::int64_t out_head_stride() const noexcept {
    return out_stride_head != 0 ? out_stride_head : layout.head_dim;
  }
  constexpr std::int64_t out_token_stride() const noexcept {
    return out_stride_token != 0 ? out_stride_token
                                 : static_cast<std::int64_t>(num_q_heads) * layout.head_dim;
  }
  constexpr std::int64_t out_seq_stride() const noexcept {
    return out_stride_seq != 0 ? out_stride_seq
                               : static_cast<std::int64_t>(q_len) * out_token_stride();
  }
};

// The most query tokens per sequence PagedDecodeParams accepts (speculative decoding drafts a
// handful; the CUDA kernels take fewer, pagedkv/cuda/decode_attention.hpp).
inline constexpr std::int32_t kMaxDecodeQueryLen = 64;

// Checks everything that does not need to read the buffers: shapes, q_len in [1,
// kMaxDecodeQueryLen], the layout, strides (not negative; a head's row fits before the next, a
// token's heads before the next token, a sequence's tokens before the next sequence; the last
// sequence's last row ends within 64-bit offsets), pointers
// present, scale and cap finite, window not negative. Throws pagedkv::Error naming the field.
void validate(const PagedDecodeParams& params);

// CPU reference (host buffers). Also checks the data: seq_lens in [0, max_blocks_per_seq x
// block_size] and every block id it needs inside the pool. Returns the exact (double) outputs,
// dense [num_seqs, q_len, num_q_heads, head_dim]; params.out is not touched and may be null.
std::vector<double> reference_paged_decode_attention_f64(const PagedDecodeParams& params);

// CPU reference writing params.out: the double result rounded to float, then to params.dtype
// (nearest even both times).
void reference_paged_decode_attention(const PagedDecodeParams& params);

}  // namespace pagedkv
