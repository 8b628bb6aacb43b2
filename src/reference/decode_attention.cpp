#include "pagedkv/reference/decode_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>

#include "kv_rows.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/device/block_table.hpp"

namespace pagedkv {

namespace {

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "paged decode attention: " + message);
}

}  // namespace

void validate(const PagedDecodeParams& p) {
  validate_paged_kv(p, "paged decode attention");
  if (p.q_len < 1 || p.q_len > kMaxDecodeQueryLen) {
    fail("q_len must be in [1, " + std::to_string(kMaxDecodeQueryLen) + "], got " +
         std::to_string(p.q_len));
  }
  const std::int64_t head_dim = p.layout.head_dim;
  const auto check_strides = [&](const char* name, std::int64_t seq_stride,
                                 std::int64_t token_stride, std::int64_t head_stride) {
    if (seq_stride < 0 || token_stride < 0 || head_stride < 0) {
      fail(std::string(name) + " strides must not be negative");
    }
    // Rows of one token must not overlap, nor run into the next token's rows, nor a sequence's
    // tokens into the next sequence's. Every span is checked for 64-bit overflow first (a
    // wrapped span passed the overlap checks), up to the last sequence's last row.
    const std::int64_t hs = head_stride != 0 ? head_stride : head_dim;
    const std::int64_t ts = token_stride != 0 ? token_stride : p.num_q_heads * head_dim;
    std::int64_t ss = seq_stride;
    std::int64_t token_span = 0;  // one token's heads
    std::int64_t seq_span = 0;    // one sequence's tokens
    std::int64_t extent = 0;      // every sequence's
    if (__builtin_mul_overflow(hs, p.num_q_heads - 1, &token_span) ||
        __builtin_add_overflow(token_span, head_dim, &token_span) ||
        __builtin_mul_overflow(ts, p.q_len - 1, &seq_span) ||
        __builtin_add_overflow(seq_span, token_span, &seq_span) ||
        (ss == 0 && __builtin_mul_overflow(std::int64_t{p.q_len}, ts, &ss)) ||
        __builtin_mul_overflow(ss, std::max(p.num_seqs - 1, 0), &extent) ||
        __builtin_add_overflow(extent, seq_span, &extent)) {
      fail(std::string(name) + " strides (seq " + std::to_string(seq_stride) + ", token " +
           std::to_string(ts) + ", head " + std::to_string(hs) + ") overflow 64-bit offsets");
    }
    if (hs < head_dim || (p.q_len > 1 && ts < token_span) || (p.num_seqs > 1 && ss < seq_span)) {
      fail(std::string(name) + " strides (seq " + std::to_string(ss) + ", token " +
           std::to_string(ts) + ", head " + std::to_string(hs) + ") make rows overlap");
    }
  };
  check_strides("q", p.q_stride_seq, p.q_stride_token, p.q_stride_head);
  check_strides("out", p.out_stride_seq, p.out_stride_token, p.out_stride_head);
  if (p.num_seqs > 0 && p.q == nullptr) fail("q is null");
}

std::vector<double> reference_paged_decode_attention_f64(const PagedDecodeParams& p) {
  validate(p);
  const std::int32_t num_seqs = p.num_seqs;
  const std::int32_t head_dim = p.layout.head_dim;
  const std::int32_t block_size = p.layout.block_size;
  const std::size_t cells =
      static_cast<std::size_t>(num_seqs) * static_cast<std::size_t>(p.max_blocks_per_seq);
  if (num_seqs > 0) {
    validate_block_table(
        std::span<const std::int32_t>(p.block_table, cells), num_seqs, p.max_blocks_per_seq,
        std::span<const std::int32_t>(p.seq_lens, static_cast<std::size_t>(num_seqs)), block_size,
        p.layout.num_blocks);
  }

  const auto* q = static_cast<const std::uint16_t*>(p.q);
  const auto value = [&](const std::uint16_t* base, std::int64_t index) {
    return static_cast<double>(dtype_bits_to_float(p.dtype, base[index]));
  };
  const std::int32_t group = p.group_size();
  const double cap = p.logits_soft_cap;

  const std::int32_t q_len = p.q_len;
  std::vector<double> out(static_cast<std::size_t>(num_seqs) * static_cast<std::size_t>(q_len) *
                          static_cast<std::size_t>(p.num_q_heads) *
                          static_cast<std::size_t>(head_dim));
  std::vector<double> qh(static_cast<std::size_t>(head_dim));
  std::vector<double> acc(static_cast<std::size_t>(head_dim));
  std::vector<double> kv_row(static_cast<std::size_t>(head_dim));
  for (std::int32_t s = 0; s < num_seqs; ++s) {
    const std::int32_t* row = p.block_table + static_cast<std::int64_t>(s) * p.max_blocks_per_seq;
    for (std::int32_t i = 0; i < q_len; ++i) {
      // Query token i sees the keys up to its own position seq_len - q_len + i (none if negative).
      const std::int32_t len = std::max(0, p.seq_lens[s] - (q_len - 1 - i));
      const std::int32_t first = p.window_size > 0 ? std::max(0, len - p.window_size) : 0;
      for (std::int32_t h = 0; h < p.num_q_heads; ++h) {
        const std::int32_t kv_head = h / group;
        for (std::int32_t d = 0; d < head_dim; ++d) {
          qh[static_cast<std::size_t>(d)] =
              value(q, s * p.q_seq_stride() + i * p.q_token_stride() + h * p.q_head_stride() + d);
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        double m = -std::numeric_limits<double>::infinity();
        double l = 0.0;
        for (std::int32_t t = first; t < len; ++t) {
          const std::int64_t block = row[t / block_size];
          reference_detail::read_kv_row(p, /*value_plane=*/false, block, t % block_size, kv_head,
                                        kv_row.data());
          double dot = 0.0;
          for (std::int32_t d = 0; d < head_dim; ++d) {
            dot += qh[static_cast<std::size_t>(d)] * kv_row[static_cast<std::size_t>(d)];
          }
          double logit = static_cast<double>(p.sm_scale) * dot;
          if (cap > 0) logit = cap * std::tanh(logit / cap);
          // Online softmax: rescale what was accumulated under the old maximum.
          const double m_new = std::max(m, logit);
          const double alpha = std::exp(m - m_new);  // exp(-inf) = 0 on the first token
          const double weight = std::exp(logit - m_new);
          l = l * alpha + weight;
          reference_detail::read_kv_row(p, /*value_plane=*/true, block, t % block_size, kv_head,
                                        kv_row.data());
          for (std::int32_t d = 0; d < head_dim; ++d) {
            auto& a = acc[static_cast<std::size_t>(d)];
            a = a * alpha + weight * kv_row[static_cast<std::size_t>(d)];
          }
          m = m_new;
        }
        double* o = out.data() + ((static_cast<std::size_t>(s) * static_cast<std::size_t>(q_len) +
                                   static_cast<std::size_t>(i)) *
                                      static_cast<std::size_t>(p.num_q_heads) +
                                  static_cast<std::size_t>(h)) *
                                     static_cast<std::size_t>(head_dim);
        for (std::int32_t d = 0; d < head_dim; ++d) {
          o[d] = l > 0 ? acc[static_cast<std::size_t>(d)] / l : 0.0;
        }
      }
    }
  }
  return out;
}

void reference_paged_decode_attention(const PagedDecodeParams& p) {
  const std::vector<double> exact = reference_paged_decode_attention_f64(p);
  if (p.num_seqs > 0 && p.out == nullptr) fail("out is null");
  auto* out = static_cast<std::uint16_t*>(p.out);
  const std::int32_t head_dim = p.layout.head_dim;
  const double* o = exact.data();  // dense [num_seqs, q_len, num_q_heads, head_dim]
  for (std::int32_t s = 0; s < p.num_seqs; ++s) {
    for (std::int32_t i = 0; i < p.q_len; ++i) {
      for (std::int32_t h = 0; h < p.num_q_heads; ++h) {
        for (std::int32_t d = 0; d < head_dim; ++d) {
          out[s * p.out_seq_stride() + i * p.out_token_stride() + h * p.out_head_stride() + d] =
              float_to_dtype_bits(p.dtype, static_cast<float>(*o++));
        }
      }
    }
  }
}

}  // namespace pagedkv
