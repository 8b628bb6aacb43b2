// kernels/internal/extend_attention_tiles.hpp: the work decomposition of the CUDA extend attention
// kernel (which query rows a CTA owns, which keys it must visit, which key tiles need a mask), as
// plain host/device functions so the host tests can check it exhaustively without a GPU.
//
// Query rows of one (sequence, KV head) are packed token-major over the GQA group:
// row r = token x group + head_in_group. Tile t covers rows [t x rows, (t + 1) x rows). New token
// j sits at position prefix + j and sees key positions (pos - window, pos] (window > 0) or
// [0, pos] (window 0): the bottom-right causal mask of pagedkv/reference/extend_attention.hpp.
//
// Pure O(1) functions, no errors (callers pass consistent values; negative positions simply see
// nothing); usable from any thread. Internal to pagedkv::cuda, not a stable API.
#pragma once

#include "internal/host_device.hpp"

namespace pagedkv::detail {

struct ExtendTileGeometry {
  int row0;      // first packed row of the tile
  int pos_lo;    // position of the tile's first token
  int pos_hi;    // position of the tile's last token (a valid one, < q_len)
  int kv_begin;  // first key any row of the tile can see
  int kv_end;    // one past the last (<= prefix + q_len); kv_begin <= kv_end
};

// Query tiles of a sequence with q_len new tokens; the CUDA grid's z extent is the maximum.
PAGEDKV_HOST_DEVICE int extend_num_tiles(int q_len, int group, int rows) {
  return (q_len * group + rows - 1) / rows;
}

// Geometry of tile `tile` (0 <= tile < extend_num_tiles(q_len, group, rows)).
PAGEDKV_HOST_DEVICE ExtendTileGeometry extend_tile_geometry(int q_len, int prefix, int group,
                                                            int window, int tile, int rows) {
  ExtendTileGeometry g{};
  g.row0 = tile * rows;
  const int last_row_token = (g.row0 + rows - 1) / group;
  g.pos_lo = prefix + g.row0 / group;
  g.pos_hi = prefix + (last_row_token < q_len - 1 ? last_row_token : q_len - 1);
  g.kv_end = g.pos_hi + 1 > 0 ? g.pos_hi + 1 : 0;
  int begin = 0;
  if (window > 0) {
    begin = g.pos_lo - window + 1;
    begin = begin < 0 ? 0 : (begin > g.kv_end ? g.kv_end : begin);
  }
  g.kv_begin = begin;
  return g;
}

// Whether key position `key` is visible from query position `pos`.
PAGEDKV_HOST_DEVICE bool extend_key_visible(int pos, int key, int window) {
  return key <= pos && (window <= 0 || key > pos - window);
}

// False only when every key of [key0, key0 + keys) is visible from every position in
// [g.pos_lo, g.pos_hi]: such a key tile needs no per-element mask.
PAGEDKV_HOST_DEVICE bool extend_tile_needs_mask(const ExtendTileGeometry& g, int key0, int keys,
                                                int window) {
  return key0 + keys - 1 > g.pos_lo || (window > 0 && key0 <= g.pos_hi - window);
}

}  // namespace pagedkv::detail
