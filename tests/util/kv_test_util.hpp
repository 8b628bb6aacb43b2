// Test helpers for the KV-cache data and kernel tests: random problems on the host, NaN-poisoned
// pools, independent naive decode and extend attention (gather, then dense attention), error
// norms, and the per-row check the GPU tests compare with.
// Header-only; shared by the CPU tests and the GPU tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pagedkv/base/error.hpp"
#include "pagedkv/device/block_table.hpp"
#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/device/kv_layout.hpp"
#include "pagedkv/reference/cache_ops.hpp"
#include "pagedkv/reference/decode_attention.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv::testing {

inline std::uint16_t nan_bits(KVDtype dtype) {
  return dtype == KVDtype::kFloat16 ? std::uint16_t{0x7e00} : std::uint16_t{0x7fc0};
}

inline std::vector<std::uint16_t> random_values(KVDtype dtype, std::size_t n, std::mt19937_64& rng,
                                                float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<std::uint16_t> v(n);
  for (auto& x : v) x = float_to_dtype_bits(dtype, dist(rng));
  return v;
}

// How the K and V planes of the test pool are laid out. The element offset of (block, token,
// head) is written out per kind below, independently of KVLayout::offset.
enum class LayoutKind {
  kNhd,          // [blocks, block_size, heads, dim] per plane, K and V in separate planes
  kHnd,          // [blocks, heads, block_size, dim] per plane
  kInterleaved,  // one buffer [blocks, 2, block_size, heads, dim]: K then V of each block
  kPadded,       // NHD with each head row padded by 8 elements
};

inline std::string to_string(LayoutKind kind) {
  switch (kind) {
    case LayoutKind::kNhd:
      return "nhd";
    case LayoutKind::kHnd:
      return "hnd";
    case LayoutKind::kInterleaved:
      return "interleaved";
    case LayoutKind::kPadded:
      return "padded";
  }
  return "?";
}

inline KVLayout make_layout(LayoutKind kind, std::int64_t num_blocks, std::int32_t block_size,
                            std::int32_t heads, std::int32_t dim) {
  const std::int64_t block_elems = static_cast<std::int64_t>(block_size) * heads * dim;
  switch (kind) {
    case LayoutKind::kNhd:
      return KVLayout::nhd(num_blocks, block_size, heads, dim);
    case LayoutKind::kHnd:
      return KVLayout::hnd(num_blocks, block_size, heads, dim);
    case LayoutKind::kInterleaved: {
      KVLayout layout = KVLayout::nhd(num_blocks, block_size, heads, dim);
      layout.stride_block = 2 * block_elems;
      layout.validate();
      return layout;
    }
    case LayoutKind::kPadded: {
      KVLayout layout{num_blocks, block_size, heads, dim, 0, 0, 0};
      layout.stride_head = dim + 8;
      layout.stride_token = static_cast<std::int64_t>(heads) * (dim + 8);
      layout.stride_block = layout.stride_token * block_size;
      layout.validate();
      return layout;
    }
  }
  return {};
}

// Offsets written out per layout kind: the naive computation never uses KVLayout.
struct NaiveAddressing {
  LayoutKind kind;
  std::int64_t block_size;
  std::int64_t heads;
  std::int64_t dim;

  // Offset of element d of (block, token, head) of the K (v = false) or V plane, within the
  // buffer that holds that plane (for kInterleaved both planes share one buffer).
  std::int64_t offset(bool v, std::int64_t block, std::int64_t token, std::int64_t head,
                      std::int64_t d) const {
    switch (kind) {
      case LayoutKind::kNhd:
        return ((block * block_size + token) * heads + head) * dim + d;
      case LayoutKind::kHnd:
        return ((block * heads + head) * block_size + token) * dim + d;
      case LayoutKind::kInterleaved:
        return (((block * 2 + (v ? 1 : 0)) * block_size + token) * heads + head) * dim + d;
      case LayoutKind::kPadded:
        return ((block * block_size + token) * heads + head) * (dim + 8) + d;
    }
    return 0;
  }
};

struct DecodeShape {
  KVDtype dtype = KVDtype::kBFloat16;
  std::int32_t num_seqs = 1;
  std::int32_t num_q_heads = 1;
  std::int32_t num_kv_heads = 1;
  std::int32_t head_dim = 64;
  std::int32_t block_size = 16;
  LayoutKind kind = LayoutKind::kNhd;
  std::int32_t window_size = 0;
  float soft_cap = 0.0f;
  std::vector<std::int32_t> seq_lens;
  bool shuffle_blocks = true;
  std::int32_t extra_table_columns = 0;  // padding columns past the longest sequence
  float value_range = 1.0f;              // q, K, V values uniform in [-range, range]
};

inline std::string describe(const DecodeShape& s) {
  // A stream rather than string concatenation: GCC 12 reports a false -Wrestrict on
  // `"," + std::to_string(...)` once this is inlined into large test functions.
  std::ostringstream text;
  text << to_string(s.dtype) << " seqs=" << s.num_seqs << " q_heads=" << s.num_q_heads
       << " kv_heads=" << s.num_kv_heads << " dim=" << s.head_dim << " block=" << s.block_size
       << " layout=" << to_string(s.kind) << " window=" << s.window_size << " cap=" << s.soft_cap
       << " lens=[";
  for (std::size_t i = 0; i < s.seq_lens.size() && i < 8; ++i) {
    text << (i > 0 ? "," : "") << s.seq_lens[i];
  }
  text << (s.seq_lens.size() > 8 ? ",...]" : "]");
  return text.str();
}

// A decode problem in host memory. Every cache slot that no sequence uses holds NaN (the tail of
// each last block, the blocks nobody owns, and the poison block the table's padding points to),
// so reading past seq_len shows up as NaN in the output.
struct HostDecodeProblem {
  DecodeShape shape;
  KVLayout layout;
  NaiveAddressing addressing;
  std::vector<std::uint16_t> k_buffer;  // holds the K plane (and V too for kInterleaved)
  std::vector<std::uint16_t> v_buffer;  // holds the V plane (empty for kInterleaved)
  std::size_t v_plane_offset = 0;       // offset of the V plane in its buffer
  std::vector<std::vector<std::int32_t>> seq_blocks;
  BlockTable table;
  std::int32_t poison_block = 0;
  std::vector<std::uint16_t> q;  // dense [num_seqs, num_q_heads, head_dim]
  float sm_scale = 0.0f;

  const std::uint16_t* k_plane() const { return k_buffer.data(); }
  const std::uint16_t* v_plane() const {
    return (shape.kind == LayoutKind::kInterleaved ? k_buffer.data() : v_buffer.data()) +
           v_plane_offset;
  }
  std::uint16_t value(bool v, std::int64_t block, std::int64_t token, std::int64_t head,
                      std::int64_t d) const {
    const auto& buffer = (v && shape.kind != LayoutKind::kInterleaved) ? v_buffer : k_buffer;
    return buffer[static_cast<std::size_t>(addressing.offset(v, block, token, head, d))];
  }

  // Parameters over the host buffers; `out` is dense [num_seqs, num_q_heads, head_dim].
  PagedDecodeParams params(void* out) const {
    PagedDecodeParams p;
    p.dtype = shape.dtype;
    p.num_seqs = shape.num_seqs;
    p.num_q_heads = shape.num_q_heads;
    p.q = q.data();
    p.k_cache = k_plane();
    p.v_cache = v_plane();
    p.layout = layout;
    p.block_table = table.block_ids.data();
    p.max_blocks_per_seq = table.max_blocks_per_seq;
    p.seq_lens = shape.seq_lens.data();
    p.out = out;
    p.sm_scale = sm_scale;
    p.logits_soft_cap = shape.soft_cap;
    p.window_size = shape.window_size;
    return p;
  }
};

inline HostDecodeProblem make_decode_problem(const DecodeShape& shape, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostDecodeProblem pb;
  pb.shape = shape;
  const std::int32_t bs = shape.block_size;
  std::int64_t needed = 0;
  for (const std::int32_t len : shape.seq_lens) needed += (len + bs - 1) / bs;
  // Some spare blocks nobody owns, plus the poison block for the table's padding.
  const std::int64_t num_blocks = needed + 3;
  pb.layout = make_layout(shape.kind, num_blocks, bs, shape.num_kv_heads, shape.head_dim);
  pb.addressing = NaiveAddressing{shape.kind, bs, shape.num_kv_heads, shape.head_dim};
  const std::uint16_t nan = nan_bits(shape.dtype);
  if (shape.kind == LayoutKind::kInterleaved) {
    pb.k_buffer.assign(static_cast<std::size_t>(num_blocks * 2 * pb.layout.block_elements()), nan);
    pb.v_plane_offset = static_cast<std::size_t>(pb.layout.block_elements());
  } else {
    pb.k_buffer.assign(static_cast<std::size_t>(pb.layout.plane_elements()), nan);
    pb.v_buffer.assign(static_cast<std::size_t>(pb.layout.plane_elements()), nan);
  }

  std::vector<std::int32_t> ids(static_cast<std::size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  if (shape.shuffle_blocks) std::shuffle(ids.begin(), ids.end(), rng);
  pb.poison_block = ids.back();
  std::size_t next = 0;
  std::uniform_real_distribution<float> dist(-shape.value_range, shape.value_range);
  for (const std::int32_t len : shape.seq_lens) {
    std::vector<std::int32_t> blocks;
    for (std::int32_t b = 0; b < (len + bs - 1) / bs; ++b) blocks.push_back(ids[next++]);
    for (std::int32_t t = 0; t < len; ++t) {
      for (std::int32_t h = 0; h < shape.num_kv_heads; ++h) {
        for (std::int32_t d = 0; d < shape.head_dim; ++d) {
          const std::int64_t block = blocks[static_cast<std::size_t>(t / bs)];
          const auto k_at =
              static_cast<std::size_t>(pb.addressing.offset(false, block, t % bs, h, d));
          const auto v_at =
              static_cast<std::size_t>(pb.addressing.offset(true, block, t % bs, h, d));
          pb.k_buffer[k_at] = float_to_dtype_bits(shape.dtype, dist(rng));
          auto& v_buffer = shape.kind == LayoutKind::kInterleaved ? pb.k_buffer : pb.v_buffer;
          v_buffer[v_at] = float_to_dtype_bits(shape.dtype, dist(rng));
        }
      }
    }
    pb.seq_blocks.push_back(std::move(blocks));
  }
  std::size_t longest = 0;
  for (const auto& b : pb.seq_blocks) longest = std::max(longest, b.size());
  pb.table = make_block_table(pb.seq_blocks,
                              static_cast<std::int32_t>(longest) + shape.extra_table_columns,
                              pb.poison_block);
  if (pb.table.max_blocks_per_seq == 0) {
    // make_block_table treats 0 as "longest": keep one padding column so pointers are non-null.
    pb.table = make_block_table(pb.seq_blocks, 1, pb.poison_block);
  }
  pb.q.resize(static_cast<std::size_t>(shape.num_seqs) *
              static_cast<std::size_t>(shape.num_q_heads) *
              static_cast<std::size_t>(shape.head_dim));
  for (auto& x : pb.q) x = float_to_dtype_bits(shape.dtype, dist(rng));
  pb.sm_scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  return pb;
}

// The independent computation: gather each sequence's K and V into dense [len, heads, dim]
// arrays, then plain two-pass softmax attention per query head. Double throughout.
// drop_position >= 0 leaves that key position out of every sequence (a deliberately wrong
// result, for showing that a comparison catches one missing key).
inline std::vector<double> naive_decode(const HostDecodeProblem& pb,
                                        std::int64_t drop_position = -1) {
  const DecodeShape& s = pb.shape;
  const std::size_t dim = static_cast<std::size_t>(s.head_dim);
  const std::size_t kv_heads = static_cast<std::size_t>(s.num_kv_heads);
  std::vector<double> out(
      static_cast<std::size_t>(s.num_seqs) * static_cast<std::size_t>(s.num_q_heads) * dim, 0.0);
  const auto f = [&](std::uint16_t bits) {
    return static_cast<double>(dtype_bits_to_float(s.dtype, bits));
  };
  for (std::int32_t seq = 0; seq < s.num_seqs; ++seq) {
    const std::int32_t len = s.seq_lens[static_cast<std::size_t>(seq)];
    const auto n = static_cast<std::size_t>(len);
    std::vector<double> k(n * kv_heads * dim);
    std::vector<double> v(n * kv_heads * dim);
    for (std::size_t t = 0; t < n; ++t) {
      const std::int64_t block =
          pb.seq_blocks[static_cast<std::size_t>(seq)][t / static_cast<std::size_t>(s.block_size)];
      const auto offset = static_cast<std::int64_t>(t % static_cast<std::size_t>(s.block_size));
      for (std::size_t h = 0; h < kv_heads; ++h) {
        for (std::size_t d = 0; d < dim; ++d) {
          k[(t * kv_heads + h) * dim + d] = f(pb.value(
              false, block, offset, static_cast<std::int64_t>(h), static_cast<std::int64_t>(d)));
          v[(t * kv_heads + h) * dim + d] = f(pb.value(
              true, block, offset, static_cast<std::int64_t>(h), static_cast<std::int64_t>(d)));
        }
      }
    }
    const std::size_t first = s.window_size > 0 && len > s.window_size
                                  ? static_cast<std::size_t>(len - s.window_size)
                                  : 0;
    const std::int32_t group = s.num_q_heads / s.num_kv_heads;
    for (std::int32_t qh = 0; qh < s.num_q_heads; ++qh) {
      const std::size_t h = static_cast<std::size_t>(qh / group);
      const std::uint16_t* qv =
          pb.q.data() + (static_cast<std::size_t>(seq) * static_cast<std::size_t>(s.num_q_heads) +
                         static_cast<std::size_t>(qh)) *
                            dim;
      std::vector<double> logits;
      for (std::size_t t = first; t < n; ++t) {
        double dot = 0.0;
        for (std::size_t d = 0; d < dim; ++d) dot += f(qv[d]) * k[(t * kv_heads + h) * dim + d];
        double logit = static_cast<double>(pb.sm_scale) * dot;
        if (s.soft_cap > 0) logit = s.soft_cap * std::tanh(logit / s.soft_cap);
        if (static_cast<std::int64_t>(t) == drop_position) {
          logit = -std::numeric_limits<double>::infinity();
        }
        logits.push_back(logit);
      }
      if (logits.empty()) continue;  // zero output
      const double mx = *std::max_element(logits.begin(), logits.end());
      double sum = 0.0;
      for (double& x : logits) sum += (x = std::exp(x - mx));
      double* o =
          out.data() + (static_cast<std::size_t>(seq) * static_cast<std::size_t>(s.num_q_heads) +
                        static_cast<std::size_t>(qh)) *
                           dim;
      for (std::size_t i = 0; i < logits.size(); ++i) {
        const std::size_t t = first + i;
        for (std::size_t d = 0; d < dim; ++d)
          o[d] += logits[i] / sum * v[(t * kv_heads + h) * dim + d];
      }
    }
  }
  return out;
}

// ---- extend (prefix-hit prefill) problems ----

struct ExtendShape {
  DecodeShape cache;                 // cache.seq_lens: total KV lengths (prefix + new tokens)
  std::vector<std::int32_t> q_lens;  // new tokens per sequence, each <= its total length
  std::int32_t extra_max_q_len = 0;  // slack in max_q_len past the longest q_len
};

// A varlen batch: sequence i has prefix_lens[i] cached tokens and q_lens[i] new ones. Two
// padding columns in the block table name the all-NaN poison block.
inline ExtendShape make_extend_shape(KVDtype dtype, std::int32_t head_dim, std::int32_t kv_heads,
                                     std::int32_t group, std::int32_t block_size,
                                     const std::vector<std::int32_t>& prefix_lens,
                                     const std::vector<std::int32_t>& q_lens) {
  ExtendShape s;
  s.cache.dtype = dtype;
  s.cache.num_seqs = static_cast<std::int32_t>(q_lens.size());
  s.cache.num_kv_heads = kv_heads;
  s.cache.num_q_heads = kv_heads * group;
  s.cache.head_dim = head_dim;
  s.cache.block_size = block_size;
  s.cache.extra_table_columns = 2;
  for (std::size_t i = 0; i < q_lens.size(); ++i) {
    s.cache.seq_lens.push_back(prefix_lens[i] + q_lens[i]);
  }
  s.q_lens = q_lens;
  return s;
}

// Per sequence "prefix+new" (cached prefix and new-token counts), e.g. "37+19".
inline std::string describe(const ExtendShape& s) {
  const DecodeShape& c = s.cache;
  std::ostringstream text;
  text << to_string(c.dtype) << " q_heads=" << c.num_q_heads << " kv_heads=" << c.num_kv_heads
       << " dim=" << c.head_dim << " block=" << c.block_size << " layout=" << to_string(c.kind)
       << " window=" << c.window_size << " cap=" << c.soft_cap
       << " max_q_len+=" << s.extra_max_q_len << " seqs=[";
  for (std::size_t i = 0; i < s.q_lens.size() && i < 8; ++i) {
    text << (i > 0 ? " " : "") << c.seq_lens[i] - s.q_lens[i] << '+' << s.q_lens[i];
  }
  text << (s.q_lens.size() > 8 ? " ...]" : "]");
  return text.str();
}

// An extend problem in host memory. The pool comes from make_decode_problem over the total
// lengths (unused slots NaN); the new tokens' slots are then poisoned with NaN too and refilled by
// reference_kv_append from new_k / new_v, the way an engine appends before attending.
struct HostExtendProblem {
  ExtendShape shape;
  HostDecodeProblem cache;
  std::vector<std::int32_t> q_indptr;  // [num_seqs + 1]
  std::int32_t max_q_len = 0;
  std::vector<std::uint16_t> q;            // dense [num_q_tokens, num_q_heads, head_dim]
  std::vector<std::uint16_t> new_k;        // dense [num_q_tokens, num_kv_heads, head_dim]
  std::vector<std::uint16_t> new_v;        // likewise
  std::vector<std::int64_t> slot_mapping;  // [num_q_tokens]

  std::int32_t num_q_tokens() const { return q_indptr.back(); }
  // The same problem as decode with several query tokens per sequence (PagedDecodeParams::q_len,
  // speculative decoding): every sequence's new tokens are its q_len query tokens, host buffers,
  // no output. Needs the same q_len for every sequence (throws std::invalid_argument otherwise).
  PagedDecodeParams decode_params() const {
    const std::int32_t q_len = shape.q_lens.empty() ? 1 : shape.q_lens.front();
    for (const std::int32_t n : shape.q_lens) {
      if (n != q_len) throw std::invalid_argument("decode_params: q_lens differ");
    }
    PagedDecodeParams d = cache.params(nullptr);
    d.q = q.data();  // [num_seqs x q_len tokens, num_q_heads, head_dim]
    d.q_len = q_len;
    return d;
  }
  std::int32_t prefix_len(std::int32_t seq) const {
    const auto s = static_cast<std::size_t>(seq);
    return shape.cache.seq_lens[s] - shape.q_lens[s];
  }

  // kv_append of the new tokens over the host pool; `k_cache` / `v_cache` default to it.
  KVAppendParams append_params(void* k_cache = nullptr, void* v_cache = nullptr) {
    KVAppendParams a;
    a.dtype = shape.cache.dtype;
    a.num_tokens = num_q_tokens();
    a.key = new_k.data();
    a.value = new_v.data();
    a.slot_mapping = slot_mapping.data();
    auto& v_buffer = shape.cache.kind == LayoutKind::kInterleaved ? cache.k_buffer : cache.v_buffer;
    a.k_cache = k_cache != nullptr ? k_cache : cache.k_buffer.data();
    a.v_cache = v_cache != nullptr ? v_cache : v_buffer.data() + cache.v_plane_offset;
    a.layout = cache.layout;
    return a;
  }

  // Parameters over the host buffers; `out` dense [num_q_tokens, num_q_heads, head_dim], `lse`
  // dense [num_q_tokens, num_q_heads] or null.
  PagedExtendParams params(void* out, float* lse = nullptr) const {
    const PagedDecodeParams d = cache.params(nullptr);
    PagedExtendParams p;
    p.dtype = d.dtype;
    p.num_seqs = d.num_seqs;
    p.num_q_heads = d.num_q_heads;
    p.q_indptr = q_indptr.data();
    p.max_q_len = max_q_len;
    p.q = q.data();
    p.k_cache = d.k_cache;
    p.v_cache = d.v_cache;
    p.layout = d.layout;
    p.block_table = d.block_table;
    p.max_blocks_per_seq = d.max_blocks_per_seq;
    p.seq_lens = d.seq_lens;
    p.out = out;
    p.lse = lse;
    p.sm_scale = d.sm_scale;
    p.logits_soft_cap = d.logits_soft_cap;
    p.window_size = d.window_size;
    return p;
  }
};

// `append` = false leaves the new tokens' slots NaN (for a device-side kv_append).
inline HostExtendProblem make_extend_problem(const ExtendShape& shape, std::uint64_t seed,
                                             bool append = true) {
  HostExtendProblem pb;
  pb.shape = shape;
  pb.cache = make_decode_problem(shape.cache, seed);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  const DecodeShape& c = shape.cache;
  pb.q_indptr.push_back(0);
  for (std::int32_t s = 0; s < c.num_seqs; ++s) {
    const std::int32_t q_len = shape.q_lens[static_cast<std::size_t>(s)];
    pb.q_indptr.push_back(pb.q_indptr.back() + q_len);
    pb.max_q_len = std::max(pb.max_q_len, q_len);
    append_slot_mapping(pb.slot_mapping, pb.cache.seq_blocks[static_cast<std::size_t>(s)],
                        c.block_size, pb.prefix_len(s), q_len);
  }
  pb.max_q_len += shape.extra_max_q_len;
  const auto tokens = static_cast<std::size_t>(pb.num_q_tokens());
  const auto kv_row =
      static_cast<std::size_t>(c.num_kv_heads) * static_cast<std::size_t>(c.head_dim);
  const float r = c.value_range;
  pb.q = random_values(
      c.dtype,
      tokens * static_cast<std::size_t>(c.num_q_heads) * static_cast<std::size_t>(c.head_dim), rng,
      -r, r);
  pb.new_k = random_values(c.dtype, tokens * kv_row, rng, -r, r);
  pb.new_v = random_values(c.dtype, tokens * kv_row, rng, -r, r);
  // Poison the new tokens' slots: whatever reads them before the append sees NaN.
  const std::uint16_t nan = nan_bits(c.dtype);
  for (const std::int64_t slot : pb.slot_mapping) {
    for (std::int32_t h = 0; h < c.num_kv_heads; ++h) {
      for (std::int32_t d = 0; d < c.head_dim; ++d) {
        for (const bool v : {false, true}) {
          auto& buffer =
              (v && c.kind != LayoutKind::kInterleaved) ? pb.cache.v_buffer : pb.cache.k_buffer;
          buffer[static_cast<std::size_t>(
              pb.cache.addressing.offset(v, slot / c.block_size, slot % c.block_size, h, d))] = nan;
        }
      }
    }
  }
  if (append) reference_kv_append(pb.append_params());
  return pb;
}

struct NaiveExtend {
  std::vector<double> out;  // [num_q_tokens, num_q_heads, head_dim]
  std::vector<double> lse;  // [num_q_tokens, num_q_heads]
};

// The independent computation: for each sequence, dense K/V rows by position (the cached prefix
// read from the pool with NaiveAddressing, the new tokens taken from new_k / new_v directly, so
// a misplaced append shows), then per (new token, query head) the explicit list of visible
// positions and a two-pass softmax. Double throughout.
inline NaiveExtend naive_extend(const HostExtendProblem& pb) {
  const DecodeShape& s = pb.shape.cache;
  const auto dim = static_cast<std::size_t>(s.head_dim);
  const auto kv_heads = static_cast<std::size_t>(s.num_kv_heads);
  const auto q_heads = static_cast<std::size_t>(s.num_q_heads);
  const auto tokens = static_cast<std::size_t>(pb.num_q_tokens());
  NaiveExtend result;
  result.out.assign(tokens * q_heads * dim, 0.0);
  result.lse.assign(tokens * q_heads, -std::numeric_limits<double>::infinity());
  const auto f = [&](std::uint16_t bits) {
    return static_cast<double>(dtype_bits_to_float(s.dtype, bits));
  };
  const std::int32_t group = s.num_q_heads / s.num_kv_heads;
  for (std::int32_t seq = 0; seq < s.num_seqs; ++seq) {
    const auto total = static_cast<std::size_t>(s.seq_lens[static_cast<std::size_t>(seq)]);
    const auto prefix = static_cast<std::size_t>(pb.prefix_len(seq));
    const auto first_row = static_cast<std::size_t>(pb.q_indptr[static_cast<std::size_t>(seq)]);
    // kv[pos][head][dim] for K (index 0) and V (index 1).
    std::vector<double> kv[2];
    for (int which = 0; which < 2; ++which) {
      kv[which].resize(total * kv_heads * dim);
      for (std::size_t pos = 0; pos < total; ++pos) {
        for (std::size_t h = 0; h < kv_heads; ++h) {
          for (std::size_t d = 0; d < dim; ++d) {
            double x = 0.0;
            if (pos < prefix) {
              const std::int64_t block =
                  pb.cache.seq_blocks[static_cast<std::size_t>(seq)]
                                     [pos / static_cast<std::size_t>(s.block_size)];
              x = f(pb.cache.value(
                  which == 1, block,
                  static_cast<std::int64_t>(pos % static_cast<std::size_t>(s.block_size)),
                  static_cast<std::int64_t>(h), static_cast<std::int64_t>(d)));
            } else {
              const auto& rows = which == 0 ? pb.new_k : pb.new_v;
              x = f(rows[((first_row + pos - prefix) * kv_heads + h) * dim + d]);
            }
            kv[which][(pos * kv_heads + h) * dim + d] = x;
          }
        }
      }
    }
    for (std::size_t j = 0; j < total - prefix; ++j) {
      const std::size_t pos = prefix + j;
      std::vector<std::size_t> visible;
      for (std::size_t t = 0; t <= pos; ++t) {
        if (s.window_size == 0 || t + static_cast<std::size_t>(s.window_size) > pos) {
          visible.push_back(t);
        }
      }
      for (std::size_t qh = 0; qh < q_heads; ++qh) {
        const std::size_t h = qh / static_cast<std::size_t>(group);
        const std::size_t row = (first_row + j) * q_heads + qh;
        std::vector<double> logits;
        for (const std::size_t t : visible) {
          double dot = 0.0;
          for (std::size_t d = 0; d < dim; ++d) {
            dot += f(pb.q[row * dim + d]) * kv[0][(t * kv_heads + h) * dim + d];
          }
          double logit = static_cast<double>(pb.cache.sm_scale) * dot;
          if (s.soft_cap > 0) logit = s.soft_cap * std::tanh(logit / s.soft_cap);
          logits.push_back(logit);
        }
        const double mx = *std::max_element(logits.begin(), logits.end());
        double sum = 0.0;
        for (const double x : logits) sum += std::exp(x - mx);
        for (std::size_t i = 0; i < visible.size(); ++i) {
          const double weight = std::exp(logits[i] - mx) / sum;
          for (std::size_t d = 0; d < dim; ++d) {
            result.out[row * dim + d] += weight * kv[1][(visible[i] * kv_heads + h) * dim + d];
          }
        }
        result.lse[row] = mx + std::log(sum);
      }
    }
  }
  return result;
}

// ||a - ref|| / ||ref|| (Frobenius); NaN if any element of a is NaN.
inline double relative_error(std::span<const double> a, std::span<const double> ref) {
  double diff = 0.0;
  double norm = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    diff += (a[i] - ref[i]) * (a[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  if (norm == 0.0) return std::sqrt(diff);
  return std::sqrt(diff / norm);
}

// ---- per-row comparison (what the GPU tests check) ----
//
// A single norm over a whole batch lets one sequence's rows hide behind another's: with a
// 1-token sequence (output = its value row, norm ~ |v|) next to a 190-token one (output norm
// ~ |v| / sqrt(190)), dropping one key of the long sequence shifts its rows by ~10% and the
// batch norm by < 1% (tests/attention_check_test.cpp shows it). So the GPU tests check every
// output row (one query head of one token, `row_len` = head_dim values) on its own:
//   row error = ||out_row - ref_row|| / ||ref_row||   (||out_row|| when ref_row is all zeros)
// and every row must be within the tolerance; a non-finite output value fails its row.
struct RowCheck {
  std::size_t rows = 0;
  std::size_t bad_rows = 0;    // rows over the tolerance (non-finite ones included)
  std::size_t non_finite = 0;  // output values that are NaN or infinite
  double max_row_error = 0.0;  // worst row (infinity when non-finite)
  std::size_t worst_row = 0;
  double frobenius = 0.0;  // the old whole-batch norm, for comparison in messages
};

inline RowCheck check_rows(std::span<const double> out, std::span<const double> ref,
                           std::size_t row_len, double tolerance) {
  RowCheck c;
  c.rows = row_len == 0 ? 0 : ref.size() / row_len;
  double diff_all = 0.0;
  double norm_all = 0.0;
  for (std::size_t r = 0; r < c.rows; ++r) {
    double diff = 0.0;
    double norm = 0.0;
    bool finite = true;
    for (std::size_t i = r * row_len; i < (r + 1) * row_len; ++i) {
      if (!std::isfinite(out[i])) {
        finite = false;
        ++c.non_finite;
        continue;
      }
      diff += (out[i] - ref[i]) * (out[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
    diff_all += diff;
    norm_all += norm;
    const double error = !finite    ? std::numeric_limits<double>::infinity()
                         : norm > 0 ? std::sqrt(diff / norm)
                                    : std::sqrt(diff);
    if (!(error <= tolerance)) ++c.bad_rows;
    if (!(error <= c.max_row_error)) {
      c.max_row_error = error;
      c.worst_row = r;
    }
  }
  c.frobenius = c.non_finite > 0 ? std::numeric_limits<double>::infinity()
                : norm_all > 0   ? std::sqrt(diff_all / norm_all)
                                 : std::sqrt(diff_all);
  return c;
}

// gtest form: EXPECT_TRUE(rows_match(out, ref, head_dim, tol)) << context. Rows are numbered
// token x num_heads + head for dense [tokens, heads, head_dim] outputs.
inline ::testing::AssertionResult rows_match(std::span<const double> out,
                                             std::span<const double> ref, std::size_t row_len,
                                             double tolerance) {
  if (out.size() != ref.size()) {
    return ::testing::AssertionFailure()
           << "output has " << out.size() << " values, reference " << ref.size();
  }
  const RowCheck c = check_rows(out, ref, row_len, tolerance);
  if (c.bad_rows == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << c.bad_rows << " of " << c.rows << " rows over the per-row tolerance " << tolerance
         << " (worst: row " << c.worst_row << ", relative error " << c.max_row_error << "; "
         << c.non_finite << " non-finite values; whole-batch Frobenius error " << c.frobenius
         << ")";
}

inline std::vector<double> to_doubles(KVDtype dtype, std::span<const std::uint16_t> bits) {
  std::vector<double> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) out[i] = dtype_bits_to_float(dtype, bits[i]);
  return out;
}

// The rejections every paged attention kernel shares (PagedKVParams, validated by
// validate_paged_kv): `run(params)` must throw pagedkv::Error (kInvalidArgument) naming the field
// for each broken copy of `good`. Used by the decode and extend reference tests alike.
template <typename Params, typename Run>
void expect_rejects_bad_paged_kv(const Params& good, const Run& run) {
  const auto expect = [&](const Params& p, const std::string& fragment) {
    try {
      run(p);
      ADD_FAILURE() << "expected pagedkv::Error containing '" << fragment << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  Params p = good;
  p.num_q_heads = 3;
  expect(p, "multiple of layout.num_kv_heads");
  p = good;
  p.num_seqs = -1;
  expect(p, "num_seqs");
  p = good;
  p.k_cache = nullptr;
  expect(p, "k_cache");
  p = good;
  p.v_cache = nullptr;
  expect(p, "v_cache");
  p = good;
  p.seq_lens = nullptr;
  expect(p, "seq_lens is null");
  p = good;
  p.block_table = nullptr;
  expect(p, "block_table is null");
  p = good;
  p.max_blocks_per_seq = -1;
  expect(p, "max_blocks_per_seq");
  p = good;
  p.sm_scale = std::nanf("");
  expect(p, "sm_scale");
  p = good;
  p.logits_soft_cap = -1.0f;
  expect(p, "logits_soft_cap");
  p = good;
  p.window_size = -2;
  expect(p, "window_size");
  p = good;
  p.layout.head_dim = 60;
  expect(p, "multiple of 8");
  p = good;
  p.layout.block_size = 0;
  expect(p, "block_size");
}

}  // namespace pagedkv::testing
