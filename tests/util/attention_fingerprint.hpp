// What a failing attention output got wrong, by where the wrong rows sit: a text "fingerprint"
// the GPU tests print when their per-row check fails (testing::check_rows, kv_test_util.hpp), so
// that a failure seen in a short GPU run can be reasoned about afterwards without the GPU.
//
// Each output row (one query head of one query token) is placed by the kernels' geometry: its
// sequence, its new-token index, its query and KV head, its row within the 128-row query tile of
// the kernels' CTAs (rows of one KV head packed token x group + head, as kFa2 and the sm_90a
// kernels pack them; rows 0-63 are the first consumer warpgroup's, 64-127 the second's), how many
// keys it sees, and where its last visible key falls within a 64-key tile. The fingerprint counts
// the rows over the tolerance by each of these, gives the relative error of each group of 8
// head_dim columns over the wrong rows (a wrong operand layout shows as whole column groups), and
// counts the wrong rows that are all zero or hold non-finite values.
//
// Host-only, header-only test code; checked by tests/reference/attention_fingerprint_test.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kv_test_util.hpp"

namespace pagedkv::testing {

// Where one output row sits in the kernels' geometry.
struct RowSite {
  std::int32_t seq = 0;
  std::int32_t token = 0;  // new-token index within its sequence (decode: query position)
  std::int32_t q_head = 0;
  std::int32_t kv_head = 0;
  std::int32_t tile_row = 0;      // row within its CTA's query tile
  std::int32_t visible_keys = 0;  // keys the row attends to (0: none, a zero row)
  std::int32_t last_key = -1;     // position of its last visible key (-1: none)
};

inline constexpr std::int32_t kFingerprintTileRows = 128;  // the extend kernels' query tile
inline constexpr std::int32_t kFingerprintKeyTile = 64;    // the sm_90a kernels' key tile

// The sites of an extend problem's output rows, in the output's order (token x num_q_heads +
// query head): a KV head's rows packed new token x group + head, cut into tiles of `tile_rows`.
inline std::vector<RowSite> extend_row_sites(const HostExtendProblem& pb,
                                             std::int32_t tile_rows = kFingerprintTileRows) {
  const DecodeShape& c = pb.shape.cache;
  const std::int32_t group = c.num_q_heads / c.num_kv_heads;
  std::vector<RowSite> sites;
  sites.reserve(static_cast<std::size_t>(pb.num_q_tokens()) *
                static_cast<std::size_t>(c.num_q_heads));
  for (std::int32_t seq = 0; seq < c.num_seqs; ++seq) {
    const std::int32_t prefix = pb.prefix_len(seq);
    const std::int32_t q_len = pb.shape.q_lens[static_cast<std::size_t>(seq)];
    for (std::int32_t i = 0; i < q_len; ++i) {
      const std::int32_t pos = prefix + i;
      const std::int32_t visible = c.window_size > 0 ? std::min(pos + 1, c.window_size) : pos + 1;
      for (std::int32_t qh = 0; qh < c.num_q_heads; ++qh) {
        RowSite s;
        s.seq = seq;
        s.token = i;
        s.q_head = qh;
        s.kv_head = qh / group;
        s.tile_row = (i * group + qh % group) % tile_rows;
        s.visible_keys = visible;
        s.last_key = pos;
        sites.push_back(s);
      }
    }
  }
  return sites;
}

// The sites of a decode problem's output rows (sequence x num_q_heads + query head): one query
// token per sequence, a KV head's group of query heads in one tile of `tile_rows` (the
// tensor-core decode kernels' 16-row MMA tile). Several query tokens per sequence (q_len > 1):
// extend_row_sites of the problem with that tile.
inline constexpr std::int32_t kFingerprintDecodeTileRows = 16;
inline std::vector<RowSite> decode_row_sites(const HostDecodeProblem& pb,
                                             std::int32_t tile_rows = kFingerprintDecodeTileRows) {
  const DecodeShape& c = pb.shape;
  const std::int32_t group = c.num_q_heads / c.num_kv_heads;
  std::vector<RowSite> sites;
  for (std::int32_t seq = 0; seq < c.num_seqs; ++seq) {
    const std::int32_t len = c.seq_lens[static_cast<std::size_t>(seq)];
    for (std::int32_t qh = 0; qh < c.num_q_heads; ++qh) {
      RowSite s;
      s.seq = seq;
      s.q_head = qh;
      s.kv_head = qh / group;
      s.tile_row = (qh % group) % tile_rows;
      s.visible_keys = c.window_size > 0 ? std::min(len, c.window_size) : len;
      s.last_key = len - 1;
      sites.push_back(s);
    }
  }
  return sites;
}

namespace detail {

// "label bad/total" counts over buckets, in bucket order, skipping empty buckets.
struct BucketCounts {
  std::vector<std::string> labels;
  std::vector<std::size_t> bad;
  std::vector<std::size_t> total;
  explicit BucketCounts(std::vector<std::string> l)
      : labels(std::move(l)), bad(labels.size(), 0), total(labels.size(), 0) {}
  void add(std::size_t bucket, bool is_bad) {
    ++total[bucket];
    if (is_bad) ++bad[bucket];
  }
  std::string line(const std::string& title) const {
    std::ostringstream text;
    text << "  " << title << ":";
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (total[i] == 0) continue;
      text << " " << labels[i] << " " << bad[i] << "/" << total[i] << ";";
    }
    return text.str();
  }
};

// Labels "0-15", "16-31", ... of the buckets of `step` values covering 0 .. total - 1.
inline std::vector<std::string> range_labels(std::int32_t total, std::int32_t step) {
  std::vector<std::string> labels;
  for (std::int32_t b = 0; b * step < total; ++b) {
    labels.push_back(std::to_string(b * step) + "-" +
                     std::to_string(std::min(total, (b + 1) * step) - 1));
  }
  return labels;
}

// Buckets of visible keys, counted in key tiles of `key_tile`: none, 1 tile, 2, 3-4, 5-8, 9-16,
// 17 or more.
inline std::size_t visible_bucket(std::int32_t visible, std::int32_t key_tile) {
  if (visible <= 0) return 0;
  const std::int32_t tiles = (visible + key_tile - 1) / key_tile;
  if (tiles == 1) return 1;
  if (tiles == 2) return 2;
  if (tiles <= 4) return 3;
  if (tiles <= 8) return 4;
  if (tiles <= 16) return 5;
  return 6;
}

}  // namespace detail

// The fingerprint of `out` against `ref` (rows of `row_len` values, sites[r] placing row r), rows
// over `tolerance` as check_rows counts them. Several lines, no trailing newline.
inline std::string error_fingerprint(std::span<const double> out, std::span<const double> ref,
                                     std::size_t row_len, double tolerance,
                                     std::span<const RowSite> sites,
                                     std::int32_t tile_rows = kFingerprintTileRows,
                                     std::int32_t key_tile = kFingerprintKeyTile) {
  std::ostringstream text;
  const std::size_t rows = row_len == 0 ? 0 : ref.size() / row_len;
  if (out.size() != ref.size() || sites.size() != rows || tile_rows <= 0 || key_tile <= 0) {
    text << "fingerprint: not computed (" << out.size() << " values against " << ref.size() << ", "
         << sites.size() << " row sites for " << rows << " rows)";
    return text.str();
  }
  constexpr std::int32_t kRowBucket = 16;
  detail::BucketCounts by_row(detail::range_labels(tile_rows, kRowBucket));
  detail::BucketCounts by_half({"0-63", "64-127"});
  const std::string tile_word = std::to_string(key_tile);
  detail::BucketCounts by_visible(
      {"none", "1 tile", "2 tiles", "3-4 tiles", "5-8 tiles", "9-16 tiles", ">16 tiles"});
  constexpr std::int32_t kKeyBucket = 8;
  detail::BucketCounts by_last_key(detail::range_labels(key_tile, kKeyBucket));
  std::int32_t kv_heads = 0;
  std::int32_t seqs = 0;
  for (const RowSite& s : sites) {
    kv_heads = std::max(kv_heads, s.kv_head + 1);
    seqs = std::max(seqs, s.seq + 1);
  }
  std::vector<std::string> head_labels;
  for (std::int32_t h = 0; h < kv_heads; ++h) head_labels.push_back(std::to_string(h));
  detail::BucketCounts by_kv_head(head_labels);
  constexpr std::int32_t kShownSeqs = 12;
  std::vector<std::string> seq_labels;
  for (std::int32_t q = 0; q < std::min(seqs, kShownSeqs); ++q) {
    seq_labels.push_back(std::to_string(q));
  }
  if (seqs > kShownSeqs) seq_labels.push_back(">=" + std::to_string(kShownSeqs));
  detail::BucketCounts by_seq(seq_labels);

  constexpr std::size_t kColumnGroup = 8;
  const std::size_t column_groups = (row_len + kColumnGroup - 1) / kColumnGroup;
  std::vector<double> column_diff(column_groups, 0.0);
  std::vector<double> column_norm(column_groups, 0.0);
  std::size_t bad_rows = 0;
  std::size_t zero_rows = 0;
  std::size_t non_finite_rows = 0;
  double worst_error = -1.0;
  std::size_t worst = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const auto o = out.subspan(r * row_len, row_len);
    const auto f = ref.subspan(r * row_len, row_len);
    double diff = 0.0;
    double norm = 0.0;
    bool finite = true;
    bool zero = true;
    for (std::size_t i = 0; i < row_len; ++i) {
      if (!std::isfinite(o[i])) {
        finite = false;
        continue;
      }
      if (o[i] != 0.0) zero = false;
      diff += (o[i] - f[i]) * (o[i] - f[i]);
      norm += f[i] * f[i];
    }
    const double error = !finite    ? std::numeric_limits<double>::infinity()
                         : norm > 0 ? std::sqrt(diff / norm)
                                    : std::sqrt(diff);
    const bool bad = !(error <= tolerance);
    const RowSite& s = sites[r];
    by_row.add(static_cast<std::size_t>(std::clamp(s.tile_row, 0, tile_rows - 1) / kRowBucket),
               bad);
    if (tile_rows == kFingerprintTileRows) by_half.add(s.tile_row < 64 ? 0 : 1, bad);
    by_visible.add(detail::visible_bucket(s.visible_keys, key_tile), bad);
    if (s.last_key >= 0) {
      by_last_key.add(static_cast<std::size_t>((s.last_key % key_tile) / kKeyBucket), bad);
    }
    by_kv_head.add(static_cast<std::size_t>(std::clamp(s.kv_head, 0, kv_heads - 1)), bad);
    by_seq.add(static_cast<std::size_t>(std::min(s.seq, kShownSeqs)), bad);
    if (!bad) continue;
    ++bad_rows;
    if (!finite) {
      ++non_finite_rows;
    } else if (zero) {
      ++zero_rows;
    }
    if (error > worst_error) {
      worst_error = error;
      worst = r;
    }
    for (std::size_t i = 0; i < row_len; ++i) {
      const double d = std::isfinite(o[i]) ? o[i] - f[i] : std::numeric_limits<double>::infinity();
      column_diff[i / kColumnGroup] += d * d;
      column_norm[i / kColumnGroup] += f[i] * f[i];
    }
  }
  text << "fingerprint: " << bad_rows << " of " << rows << " rows over " << tolerance << " ("
       << zero_rows << " of them all zero, " << non_finite_rows << " with non-finite values)";
  if (bad_rows == 0) return text.str();
  text << "\n" << by_row.line("by row of the " + std::to_string(tile_rows) + "-row query tile");
  if (tile_rows == kFingerprintTileRows) text << "\n" << by_half.line("by half of the tile");
  text << "\n" << by_visible.line("by keys visible (" + tile_word + "-key tiles)");
  text << "\n" << by_last_key.line("by last visible key mod " + tile_word);
  text << "\n" << by_kv_head.line("by KV head");
  text << "\n" << by_seq.line("by sequence");
  text << "\n  relative error of the wrong rows by head_dim columns (8 each):";
  for (std::size_t g = 0; g < column_groups; ++g) {
    const double e =
        column_norm[g] > 0 ? std::sqrt(column_diff[g] / column_norm[g]) : std::sqrt(column_diff[g]);
    char buf[32];
    std::snprintf(buf, sizeof buf, " %.2g", e);
    text << (g % 8 == 0 ? " |" : "") << buf;
  }
  const RowSite& w = sites[worst];
  text << "\n  worst: row " << worst << " (sequence " << w.seq << ", new token " << w.token
       << ", query head " << w.q_head << ", KV head " << w.kv_head << ", tile row " << w.tile_row
       << ", " << w.visible_keys << " keys visible, last key " << w.last_key << "), relative error "
       << worst_error;
  return text.str();
}

}  // namespace pagedkv::testing
