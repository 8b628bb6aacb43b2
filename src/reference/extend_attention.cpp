#include "pagedkv/reference/extend_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>

#include "kv_rows.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/device/block_table.hpp"

namespace pagedkv {

namespace {

[[noreturn]] void fail(ErrorCode code, const std::string& message) {
  throw Error(code, "paged extend attention: " + message);
}
[[noreturn]] void fail(const std::string& message) {
  fail(ErrorCode::kInvalidArgument, message);
}

// Rows of one token (num_q_heads heads of head_dim values, head_stride apart) must not overlap
// each other nor the next token's rows. The spans are checked for 64-bit overflow first (a
// wrapped one passed the overlap check), up to the last row of the most tokens the batch can have
// (num_seqs x max_q_len, and q_indptr is int32).
void check_row_strides(const char* name, const PagedExtendParams& p, std::int64_t token_stride,
                       std::int64_t head_stride) {
  const std::int64_t head_dim = p.layout.head_dim;
  const std::int64_t max_tokens = std::min<std::int64_t>(std::int64_t{p.num_seqs} * p.max_q_len,
                                                         std::numeric_limits<std::int32_t>::max());
  std::int64_t token_span = 0;
  std::int64_t extent = 0;
  if (__builtin_mul_overflow(head_stride, p.num_q_heads - 1, &token_span) ||
      __builtin_add_overflow(token_span, head_dim, &token_span) ||
      __builtin_mul_overflow(token_stride, std::max<std::int64_t>(max_tokens - 1, 0), &extent) ||
      __builtin_add_overflow(extent, token_span, &extent)) {
    fail(std::string(name) + " strides (token " + std::to_string(token_stride) + ", head " +
         std::to_string(head_stride) + ") overflow 64-bit offsets");
  }
  if (head_stride < head_dim || token_stride < token_span) {
    fail(std::string(name) + " strides (token " + std::to_string(token_stride) + ", head " +
         std::to_string(head_stride) + ") make rows overlap");
  }
}

}  // namespace

void validate(const PagedExtendParams& p) {
  validate_paged_kv(p, "paged extend attention");
  if (p.max_q_len < 0) fail("max_q_len must not be negative, got " + std::to_string(p.max_q_len));
  if (p.q_stride_token < 0 || p.q_stride_head < 0 || p.out_stride_token < 0 ||
      p.out_stride_head < 0) {
    fail("q and out strides must not be negative");
  }
  check_row_strides("q", p, p.q_token_stride(), p.q_head_stride());
  check_row_strides("out", p, p.out_token_stride(), p.out_head_stride());
  if (p.num_seqs == 0) return;
  if (p.q_indptr == nullptr) fail("q_indptr is null");
  if (p.q == nullptr && p.max_q_len > 0) fail("q is null");
}

void validate_extend_metadata(std::span<const std::int32_t> q_indptr, std::int32_t max_q_len,
                              std::span<const std::int32_t> seq_lens,
                              std::span<const std::int32_t> block_table,
                              std::int32_t max_blocks_per_seq, std::int32_t block_size,
                              std::int64_t num_blocks) {
  if (q_indptr.empty()) fail("q_indptr needs num_seqs + 1 entries, got none");
  const auto num_seqs = static_cast<std::int64_t>(q_indptr.size()) - 1;
  if (num_seqs > std::numeric_limits<std::int32_t>::max()) fail("too many sequences");
  if (static_cast<std::int64_t>(seq_lens.size()) != num_seqs) {
    fail("seq_lens has " + std::to_string(seq_lens.size()) + " entries for " +
         std::to_string(num_seqs) + " sequences (q_indptr has " + std::to_string(q_indptr.size()) +
         ")");
  }
  if (max_q_len < 0) fail("max_q_len must not be negative, got " + std::to_string(max_q_len));
  if (q_indptr[0] != 0) fail("q_indptr[0] must be 0, got " + std::to_string(q_indptr[0]));
  for (std::size_t s = 0; s < seq_lens.size(); ++s) {
    const std::int64_t q_len = static_cast<std::int64_t>(q_indptr[s + 1]) - q_indptr[s];
    const std::string which = "sequence " + std::to_string(s);
    if (q_len < 0) fail(which + ": q_indptr decreases (" + std::to_string(q_len) + " new tokens)");
    if (q_len > max_q_len) {
      fail(ErrorCode::kOutOfRange,
           which + " has " + std::to_string(q_len) +
               " new tokens, more than max_q_len = " + std::to_string(max_q_len) +
               " (the CUDA kernel would leave the rows past max_q_len unwritten)");
    }
    if (q_len > seq_lens[s]) {
      fail(ErrorCode::kOutOfRange,
           which + " has " + std::to_string(q_len) + " new tokens but a KV length of only " +
               std::to_string(seq_lens[s]) +
               " (seq_lens counts the new tokens too: append the new K/V first)");
    }
  }
  validate_block_table(block_table, static_cast<std::int32_t>(num_seqs), max_blocks_per_seq,
                       seq_lens, block_size, num_blocks);
}

ExtendReference reference_paged_extend_attention_f64(const PagedExtendParams& p) {
  validate(p);
  ExtendReference result;
  if (p.num_seqs == 0) return result;
  const std::int32_t num_seqs = p.num_seqs;
  const auto seqs = static_cast<std::size_t>(num_seqs);

  // The data the launch geometry relies on: offsets, then lengths, then block ids.
  validate_extend_metadata(
      std::span<const std::int32_t>(p.q_indptr, seqs + 1), p.max_q_len,
      std::span<const std::int32_t>(p.seq_lens, seqs),
      std::span<const std::int32_t>(p.block_table,
                                    seqs * static_cast<std::size_t>(p.max_blocks_per_seq)),
      p.max_blocks_per_seq, p.layout.block_size, p.layout.num_blocks);

  const auto num_tokens = static_cast<std::size_t>(p.q_indptr[num_seqs]);
  const auto heads = static_cast<std::size_t>(p.num_q_heads);
  const auto dim = static_cast<std::size_t>(p.layout.head_dim);
  result.out.assign(num_tokens * heads * dim, 0.0);
  result.lse.assign(num_tokens * heads, -std::numeric_limits<double>::infinity());

  const auto to_double = [&](const void* base, std::int64_t index) {
    return static_cast<double>(
        dtype_bits_to_float(p.dtype, static_cast<const std::uint16_t*>(base)[index]));
  };
  const std::int32_t group = p.group_size();
  const std::int32_t block_size = p.layout.block_size;
  const double scale = p.sm_scale;
  const double cap = p.logits_soft_cap;
  std::vector<double> keys;    // [seq_len, head_dim] of one (sequence, KV head)
  std::vector<double> values;  // likewise
  std::vector<double> query(dim);
  std::vector<double> acc(dim);
  for (std::int32_t s = 0; s < num_seqs; ++s) {
    const std::int32_t kv_len = p.seq_lens[s];
    const std::int32_t q_begin = p.q_indptr[s];
    const std::int32_t q_len = p.q_indptr[s + 1] - q_begin;
    const std::int32_t prefix = kv_len - q_len;
    const std::int32_t* row = p.block_table + static_cast<std::int64_t>(s) * p.max_blocks_per_seq;
    keys.resize(static_cast<std::size_t>(kv_len) * dim);
    values.resize(static_cast<std::size_t>(kv_len) * dim);
    for (std::int32_t kv_head = 0; kv_head < p.layout.num_kv_heads; ++kv_head) {
      for (std::int32_t t = 0; t < kv_len; ++t) {
        const std::int64_t block = row[t / block_size];
        reference_detail::read_kv_row(p, /*value_plane=*/false, block, t % block_size, kv_head,
                                      keys.data() + static_cast<std::size_t>(t) * dim);
        reference_detail::read_kv_row(p, /*value_plane=*/true, block, t % block_size, kv_head,
                                      values.data() + static_cast<std::size_t>(t) * dim);
      }
      for (std::int32_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
        for (std::int32_t j = 0; j < q_len; ++j) {
          const std::int64_t token = q_begin + j;
          for (std::size_t d = 0; d < dim; ++d) {
            query[d] = to_double(p.q, token * p.q_token_stride() + h * p.q_head_stride() +
                                          static_cast<std::int64_t>(d));
          }
          // Bottom-right causal alignment: new token j is at position prefix + j.
          const std::int32_t pos = prefix + j;
          const std::int32_t first = p.window_size > 0 ? std::max(0, pos - p.window_size + 1) : 0;
          double running_max = -std::numeric_limits<double>::infinity();
          double denominator = 0.0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (std::int32_t t = first; t <= pos; ++t) {
            const double* k = keys.data() + static_cast<std::size_t>(t) * dim;
            double logit = 0.0;
            for (std::size_t d = 0; d < dim; ++d) logit += query[d] * k[d];
            logit *= scale;
            if (cap > 0) logit = cap * std::tanh(logit / cap);
            // Online softmax: rescale the sums kept under the previous maximum.
            const double new_max = std::max(running_max, logit);
            const double rescale = std::exp(running_max - new_max);  // 0 for the first key
            const double weight = std::exp(logit - new_max);
            denominator = denominator * rescale + weight;
            const double* v = values.data() + static_cast<std::size_t>(t) * dim;
            for (std::size_t d = 0; d < dim; ++d) acc[d] = acc[d] * rescale + weight * v[d];
            running_max = new_max;
          }
          const std::size_t out_row =
              static_cast<std::size_t>(token) * heads + static_cast<std::size_t>(h);
          // Every new token sees at least itself; NaN read from the cache propagates.
          for (std::size_t d = 0; d < dim; ++d) {
            result.out[out_row * dim + d] = acc[d] / denominator;
          }
          result.lse[out_row] = running_max + std::log(denominator);
        }
      }
    }
  }
  return result;
}

void reference_paged_extend_attention(const PagedExtendParams& p) {
  const ExtendReference exact = reference_paged_extend_attention_f64(p);
  if (p.num_seqs == 0) return;
  const auto num_tokens = static_cast<std::int64_t>(p.q_indptr[p.num_seqs]);
  if (num_tokens > 0 && p.out == nullptr) fail("out is null");
  auto* out = static_cast<std::uint16_t*>(p.out);
  const std::int64_t heads = p.num_q_heads;
  const std::int64_t dim = p.layout.head_dim;
  for (std::int64_t token = 0; token < num_tokens; ++token) {
    for (std::int64_t h = 0; h < heads; ++h) {
      const auto row = static_cast<std::size_t>(token * heads + h);
      std::uint16_t* dst = out + token * p.out_token_stride() + h * p.out_head_stride();
      for (std::int64_t d = 0; d < dim; ++d) {
        dst[d] = float_to_dtype_bits(
            p.dtype,
            static_cast<float>(
                exact.out[row * static_cast<std::size_t>(dim) + static_cast<std::size_t>(d)]));
      }
      if (p.lse != nullptr) p.lse[row] = static_cast<float>(exact.lse[row]);
    }
  }
}

}  // namespace pagedkv
