#include "pagedkv/device/decode_plan.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

namespace {

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, message);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}
std::int64_t round_up(std::int64_t a, std::int64_t b) {
  return ceil_div(a, b) * b;
}
std::size_t round_up_256(std::size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

void validate(const DecodePlan& plan) {
  if (plan.num_splits < 1) {
    fail("DecodePlan: num_splits must be at least 1, got " + std::to_string(plan.num_splits));
  }
  if (plan.num_splits > 1 && plan.kv_chunk_size <= 0) {
    fail("DecodePlan: kv_chunk_size must be positive when splitting, got " +
         std::to_string(plan.kv_chunk_size));
  }
}

DecodePlan plan_paged_decode(std::span<const std::int32_t> seq_lens, std::int32_t num_kv_heads,
                             const DecodePlanOptions& options) {
  const auto positive = [](const char* name, std::int64_t value) {
    if (value <= 0) {
      fail(std::string("plan_paged_decode: ") + name + " must be positive, got " +
           std::to_string(value));
    }
  };
  positive("num_kv_heads", num_kv_heads);
  positive("options.num_sms", options.num_sms);
  positive("options.ctas_per_sm", options.ctas_per_sm);
  positive("options.min_chunk_tokens", options.min_chunk_tokens);
  positive("options.max_splits", options.max_splits);
  if (options.window_size < 0) {
    fail("plan_paged_decode: options.window_size must not be negative, got " +
         std::to_string(options.window_size));
  }
  std::int64_t max_len = 0;
  for (std::size_t i = 0; i < seq_lens.size(); ++i) {
    if (seq_lens[i] < 0) {
      fail("plan_paged_decode: sequence " + std::to_string(i) + " has negative length " +
           std::to_string(seq_lens[i]));
    }
    max_len = std::max<std::int64_t>(max_len, seq_lens[i]);
  }
  if (options.window_size > 0) max_len = std::min<std::int64_t>(max_len, options.window_size);

  const DecodePlan no_split{};
  if (!options.allow_split || seq_lens.empty()) return no_split;
  const auto kv_heads = static_cast<std::int64_t>(num_kv_heads);
  const std::int64_t units = static_cast<std::int64_t>(seq_lens.size()) * kv_heads;
  const std::int64_t target = static_cast<std::int64_t>(options.num_sms) * options.ctas_per_sm;
  if (units >= target) return no_split;

  // CTAs the grid does work in for a chunk size (empty sequences still take one CTA).
  const auto ctas = [&](std::int64_t chunk) {
    std::int64_t total = 0;
    for (const std::int32_t len : seq_lens) {
      std::int64_t attended = len;
      if (options.window_size > 0) attended = std::min<std::int64_t>(attended, options.window_size);
      total += std::max<std::int64_t>(1, ceil_div(attended, chunk)) * kv_heads;
    }
    return total;
  };
  const std::int64_t lo = round_up(
      std::max<std::int64_t>(options.min_chunk_tokens, ceil_div(max_len, options.max_splits)),
      kDecodeChunkAlign);
  const std::int64_t hi = round_up(max_len, kDecodeChunkAlign);
  if (lo >= hi) return no_split;  // one chunk already holds the longest sequence
  // ctas() is non-increasing in the chunk size and ctas(hi) == units < target: find the smallest
  // aligned chunk in [lo, hi] that fits in one wave.
  std::int64_t lo_k = lo / kDecodeChunkAlign;
  std::int64_t hi_k = hi / kDecodeChunkAlign;
  while (lo_k < hi_k) {
    const std::int64_t mid = lo_k + (hi_k - lo_k) / 2;
    if (ctas(mid * kDecodeChunkAlign) <= target) {
      hi_k = mid;
    } else {
      lo_k = mid + 1;
    }
  }
  const std::int64_t chunk = lo_k * kDecodeChunkAlign;
  const std::int64_t splits = ceil_div(max_len, chunk);
  if (splits <= 1) return no_split;
  return DecodePlan{static_cast<std::int32_t>(splits), static_cast<std::int32_t>(chunk)};
}

DecodeWorkspaceLayout decode_workspace_layout(const DecodePlan& plan, std::int32_t num_seqs,
                                              std::int32_t num_q_heads, std::int32_t head_dim,
                                              std::int32_t q_len) {
  validate(plan);
  if (num_seqs < 0 || num_q_heads <= 0 || head_dim <= 0 || q_len <= 0) {
    fail("decode_workspace_layout: bad shape (num_seqs " + std::to_string(num_seqs) +
         ", num_q_heads " + std::to_string(num_q_heads) + ", head_dim " + std::to_string(head_dim) +
         ", q_len " + std::to_string(q_len) + ")");
  }
  DecodeWorkspaceLayout layout;
  if (!plan.split_kv()) return layout;
  // Four 31-bit factors can exceed 64 bits: every product is checked, and the byte sizes below
  // keep room for the two 256-byte round-ups.
  std::size_t states = static_cast<std::size_t>(num_seqs);
  bool overflow = false;
  for (const std::int32_t factor : {q_len, num_q_heads, plan.num_splits}) {
    overflow |= __builtin_mul_overflow(states, static_cast<std::size_t>(factor), &states);
  }
  if (overflow || states > (std::numeric_limits<std::size_t>::max() - 512) / sizeof(float) /
                               (static_cast<std::size_t>(head_dim) + 1)) {
    fail("decode_workspace_layout: the workspace size overflows (num_seqs " +
         std::to_string(num_seqs) + " x q_len " + std::to_string(q_len) + " x num_q_heads " +
         std::to_string(num_q_heads) + " x num_splits " + std::to_string(plan.num_splits) +
         " states of head_dim " + std::to_string(head_dim) + " floats)");
  }
  layout.partial_out_offset = 0;
  layout.partial_lse_offset =
      round_up_256(states * static_cast<std::size_t>(head_dim) * sizeof(float));
  layout.total_bytes = layout.partial_lse_offset + round_up_256(states * sizeof(float));
  return layout;
}

std::size_t decode_workspace_bytes(const DecodePlan& plan, std::int32_t num_seqs,
                                   std::int32_t num_q_heads, std::int32_t head_dim,
                                   std::int32_t q_len) {
  return decode_workspace_layout(plan, num_seqs, num_q_heads, head_dim, q_len).total_bytes;
}

}  // namespace pagedkv
