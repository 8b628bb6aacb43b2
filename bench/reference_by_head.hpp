// bench/reference_by_head.hpp: the CPU references of paged decode and extend attention
// (pagedkv/reference/decode_attention.hpp, extend_attention.hpp) run one KV head per thread, for
// the kernel benchmarks' checks of long sequences (a 32k-token decode sequence takes about 0.7 s
// on one core of the project's machine). Each thread attends one KV head and its query heads,
// on copies of that head's K/V and q; the results are put back in the reference's order, so the
// outputs equal the single-call reference's bit for bit (the same arithmetic per head; checked by
// tests/tools/reference_by_head_test.cpp).
//
// Requirements (else pagedkv::Error, naming the problem): a 16-bit cache (no FP8), a packed NHD
// layout (KVLayout::nhd's strides), dense q (strides 0). Host only; no CUDA, no shared state:
// callable from any thread. Throws what the reference throws for invalid params.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/device/kv_layout.hpp"
#include "pagedkv/reference/decode_attention.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace bench {

namespace by_head_detail {

template <typename Params>
void require_packed(const Params& p, bool dense_q, const char* who) {
  const pagedkv::KVLayout& l = p.layout;
  const pagedkv::KVLayout packed =
      pagedkv::KVLayout::nhd(l.num_blocks, l.block_size, l.num_kv_heads, l.head_dim);
  if (p.quant.fp8())
    throw pagedkv::Error(pagedkv::ErrorCode::kInvalidArgument,
                         std::string(who) + ": an FP8 cache is not supported");
  if (l.stride_block != packed.stride_block || l.stride_token != packed.stride_token ||
      l.stride_head != packed.stride_head) {
    throw pagedkv::Error(pagedkv::ErrorCode::kInvalidArgument,
                         std::string(who) + ": the layout is not a packed NHD layout");
  }
  if (!dense_q)
    throw pagedkv::Error(pagedkv::ErrorCode::kInvalidArgument,
                         std::string(who) + ": q must be dense (strides 0)");
  if (p.k_cache == nullptr || p.v_cache == nullptr || p.q == nullptr) {
    throw pagedkv::Error(pagedkv::ErrorCode::kInvalidArgument,
                         std::string(who) + ": a k_cache, v_cache or q pointer is null");
  }
  if (l.num_kv_heads <= 0 || p.num_q_heads % l.num_kv_heads != 0 || p.num_q_heads <= 0) {
    throw pagedkv::Error(
        pagedkv::ErrorCode::kInvalidArgument,
        std::string(who) + ": num_q_heads is not a positive multiple of the KV heads");
  }
}

// KV head `head` of a packed NHD plane of 16-bit values: [tokens][1][head_dim].
inline std::vector<std::uint16_t> kv_head_plane(const void* plane, const pagedkv::KVLayout& l,
                                                int head) {
  const auto* values = static_cast<const std::uint16_t*>(plane);
  const auto row = static_cast<std::size_t>(l.head_dim);
  const auto heads = static_cast<std::size_t>(l.num_kv_heads);
  const std::size_t tokens =
      static_cast<std::size_t>(l.num_blocks) * static_cast<std::size_t>(l.block_size);
  std::vector<std::uint16_t> out(tokens * row);
  for (std::size_t t = 0; t < tokens; ++t) {
    std::copy_n(values + (t * heads + static_cast<std::size_t>(head)) * row, row,
                out.data() + t * row);
  }
  return out;
}

// `rows` rows of num_heads x head_dim 16-bit values cut to the heads [first, first + count).
inline std::vector<std::uint16_t> head_slice(const void* q, std::size_t rows, int num_heads,
                                             int head_dim, int first, int count) {
  const auto* values = static_cast<const std::uint16_t*>(q);
  const std::size_t row = static_cast<std::size_t>(num_heads) * static_cast<std::size_t>(head_dim);
  const std::size_t part = static_cast<std::size_t>(count) * static_cast<std::size_t>(head_dim);
  std::vector<std::uint16_t> out(rows * part);
  for (std::size_t r = 0; r < rows; ++r) {
    std::copy_n(
        values + r * row + static_cast<std::size_t>(first) * static_cast<std::size_t>(head_dim),
        part, out.data() + r * part);
  }
  return out;
}

// Runs attend(params of one KV head, its q, k, v) per KV head on its own thread and interleaves
// the [rows][group][head_dim] results into [rows][num_q_heads][head_dim].
template <typename Params, typename Attend>
std::vector<double> by_kv_head(const Params& p, std::size_t q_rows, Attend attend) {
  const int kv_heads = p.layout.num_kv_heads;
  const int group = p.num_q_heads / kv_heads;
  const int head_dim = p.layout.head_dim;
  std::vector<std::future<std::vector<double>>> parts;
  parts.reserve(static_cast<std::size_t>(kv_heads));
  for (int h = 0; h < kv_heads; ++h) {
    parts.push_back(std::async(std::launch::async, [&p, q_rows, h, group, head_dim, &attend] {
      const std::vector<std::uint16_t> k = kv_head_plane(p.k_cache, p.layout, h);
      const std::vector<std::uint16_t> v = kv_head_plane(p.v_cache, p.layout, h);
      const std::vector<std::uint16_t> q =
          head_slice(p.q, q_rows, p.num_q_heads, head_dim, h * group, group);
      Params one = p;
      one.num_q_heads = group;
      one.layout = pagedkv::KVLayout::nhd(p.layout.num_blocks, p.layout.block_size, 1, head_dim);
      one.k_cache = k.data();
      one.v_cache = v.data();
      one.q = q.data();
      one.out = nullptr;
      return attend(one);
    }));
  }
  const std::size_t part = static_cast<std::size_t>(group) * static_cast<std::size_t>(head_dim);
  const std::size_t row = static_cast<std::size_t>(kv_heads) * part;
  std::vector<double> out(q_rows * row);
  for (int h = 0; h < kv_heads; ++h) {
    const std::vector<double> rows = parts[static_cast<std::size_t>(h)].get();
    for (std::size_t r = 0; r < q_rows; ++r) {
      std::copy_n(rows.data() + r * part, part,
                  out.data() + r * row + static_cast<std::size_t>(h) * part);
    }
  }
  return out;
}

}  // namespace by_head_detail

// reference_paged_decode_attention_f64(params), one KV head per thread: [num_seqs, q_len,
// num_q_heads, head_dim].
inline std::vector<double> decode_reference_by_kv_head(const pagedkv::PagedDecodeParams& params) {
  by_head_detail::require_packed(
      params, params.q_stride_seq == 0 && params.q_stride_token == 0 && params.q_stride_head == 0,
      "decode_reference_by_kv_head");
  pagedkv::validate(params);
  return by_head_detail::by_kv_head(
      params, static_cast<std::size_t>(params.num_seqs) * static_cast<std::size_t>(params.q_len),
      [](const pagedkv::PagedDecodeParams& one) {
        return pagedkv::reference_paged_decode_attention_f64(one);
      });
}

// reference_paged_extend_attention_f64(params).out, one KV head per thread: [num_q_tokens,
// num_q_heads, head_dim]. params.q_indptr is read on the calling thread (its last entry is the
// number of query rows).
inline std::vector<double> extend_reference_by_kv_head(const pagedkv::PagedExtendParams& params) {
  by_head_detail::require_packed(params, params.q_stride_token == 0 && params.q_stride_head == 0,
                                 "extend_reference_by_kv_head");
  pagedkv::validate(params);
  if (params.q_indptr == nullptr) {
    throw pagedkv::Error(pagedkv::ErrorCode::kInvalidArgument,
                         "extend_reference_by_kv_head: q_indptr is null");
  }
  const std::int32_t rows = params.q_indptr[params.num_seqs];
  if (rows < 0) {
    throw pagedkv::Error(pagedkv::ErrorCode::kInvalidArgument,
                         "extend_reference_by_kv_head: q_indptr's last entry is negative");
  }
  return by_head_detail::by_kv_head(params, static_cast<std::size_t>(rows),
                                    [](const pagedkv::PagedExtendParams& one) {
                                      return pagedkv::reference_paged_extend_attention_f64(one).out;
                                    });
}

}  // namespace bench
