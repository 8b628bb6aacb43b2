// pagedkv/device/decode_plan.hpp: the host-side planner of paged decode attention (split-KV or
// not).
//
// Decode attention gives each (sequence, KV head) one CTA. With few sequences that is too few
// CTAs to keep every SM streaming K/V, so the planner splits each sequence's keys into chunks of
// kv_chunk_size tokens (flash-decoding): one CTA per (sequence, KV head, chunk), each writing a
// partial output and its log-sum-exp to a caller-owned workspace, then a merge kernel combines
// the chunks of each sequence. Sequence i uses min(num_splits, ceil(len_i / kv_chunk_size))
// chunks (at least one); a sequence that needs a single chunk is written directly, unmerged.
//
// Heuristic (FlashInfer-like): let target = num_sms x ctas_per_sm, the CTAs the GPU runs at once.
// If sequences x KV heads already reach it, or no sequence is longer than min_chunk_tokens, do not
// split. Otherwise take the smallest chunk (a multiple of kDecodeChunkAlign, at least
// min_chunk_tokens, and large enough that no sequence needs more than max_splits chunks) for
// which kv_heads x sum_i ceil(len_i / chunk) <= target: as many CTAs as fit in one wave, each
// with as much work as the longest sequence forces. Lengths are the attended lengths, so a
// sliding window caps them.
//
// A plan is valid for any batch of the same number of sequences: it only sizes the grid and the
// workspace. A sequence longer than num_splits x kv_chunk_size is still attended in full (its last
// chunk takes the rest), only less evenly. So one plan made for the longest length a CUDA graph
// will see can be captured once and replayed as sequences grow.
//
// Complexity: O(num_seqs x log(max_len)). Pure functions; thread-compatible.
// Errors: pagedkv::Error (kInvalidArgument) on bad options or lengths, before any work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace pagedkv {

// Split chunks are multiples of this many tokens (a multiple of every decode tile).
inline constexpr std::int32_t kDecodeChunkAlign = 64;

struct DecodePlanOptions {
  std::int32_t num_sms = 0;             // multiprocessors of the GPU (> 0)
  std::int32_t ctas_per_sm = 4;         // decode CTAs resident per SM (the kernel's occupancy)
  std::int32_t min_chunk_tokens = 256;  // never split into chunks shorter than this
  std::int32_t max_splits = 256;        // at most this many chunks per sequence (workspace bound)
  std::int32_t window_size = 0;         // sliding window (attend the last N tokens); 0 = none
  bool allow_split = true;              // false: always one CTA per (sequence, KV head)
};

struct DecodePlan {
  std::int32_t num_splits = 1;     // chunks per (sequence, KV head) in the grid; 1 = no split-KV
  std::int32_t kv_chunk_size = 0;  // tokens per chunk when num_splits > 1 (> 0), else unused

  constexpr bool split_kv() const noexcept { return num_splits > 1; }
};

DecodePlan plan_paged_decode(std::span<const std::int32_t> seq_lens, std::int32_t num_kv_heads,
                             const DecodePlanOptions& options);

// Where the split-KV partial results live in the workspace (byte offsets; 256-byte aligned):
//   partial_out  float [num_seqs, q_len, num_q_heads, num_splits, head_dim]  (normalized chunk
//                                                                          outputs)
//   partial_lse  float [num_seqs, q_len, num_q_heads, num_splits]            (log2-sum-exp2)
// q_len: query tokens per sequence (PagedDecodeParams::q_len; 1 for plain decode).
struct DecodeWorkspaceLayout {
  std::size_t partial_out_offset = 0;
  std::size_t partial_lse_offset = 0;
  std::size_t total_bytes = 0;  // 0 without split-KV
};

// Throws for a plan with num_splits < 1 (or no chunk size when splitting) or non-positive shapes
// (num_seqs may be 0).
DecodeWorkspaceLayout decode_workspace_layout(const DecodePlan& plan, std::int32_t num_seqs,
                                              std::int32_t num_q_heads, std::int32_t head_dim,
                                              std::int32_t q_len = 1);

// Workspace bytes paged_decode_attention needs for this plan: 0 without split-KV, else about
// num_seqs x q_len x num_q_heads x num_splits x (head_dim + 1) floats. Throws like the layout.
std::size_t decode_workspace_bytes(const DecodePlan& plan, std::int32_t num_seqs,
                                   std::int32_t num_q_heads, std::int32_t head_dim,
                                   std::int32_t q_len = 1);

// Throws pagedkv::Error unless num_splits >= 1 and, when splitting, kv_chunk_size > 0.
void validate(const DecodePlan& plan);

}  // namespace pagedkv
