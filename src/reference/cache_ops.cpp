#include "pagedkv/reference/cache_ops.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_set>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

namespace {

[[noreturn]] void fail(const char* where, const std::string& message,
                       ErrorCode code = ErrorCode::kInvalidArgument) {
  throw Error(code, std::string(where) + ": " + message);
}

// Copies one block's rows (every token and head) between two planes with the same row grid,
// and its scales when the layouts have them; `elem` bytes per value.
void copy_block_rows(const void* src_plane, const KVLayout& src_layout, std::int64_t src_block,
                     void* dst_plane, const KVLayout& dst_layout, std::int64_t dst_block,
                     std::size_t elem) {
  const auto* src = static_cast<const std::uint8_t*>(src_plane);
  auto* dst = static_cast<std::uint8_t*>(dst_plane);
  const auto row_bytes = static_cast<std::size_t>(src_layout.head_dim) * elem;
  const auto at = [elem](std::int64_t element) { return static_cast<std::size_t>(element) * elem; };
  for (std::int32_t t = 0; t < src_layout.block_size; ++t) {
    for (std::int32_t h = 0; h < src_layout.num_kv_heads; ++h) {
      std::memcpy(dst + at(dst_layout.offset(dst_block, t, h)),
                  src + at(src_layout.offset(src_block, t, h)), row_bytes);
    }
  }
  if (src_layout.has_scales()) {
    std::memcpy(dst + dst_layout.scale_byte_offset(dst_block, 0, 0),
                src + src_layout.scale_byte_offset(src_block, 0, 0),
                static_cast<std::size_t>(src_layout.block_scale_bytes()));
  }
}

// Bytes per value of a plane, and the check that scales go with an FP8 dtype.
std::size_t element_bytes(const char* where, KVDtype dtype, const KVLayout& layout) {
  if (static_cast<unsigned>(dtype) > static_cast<unsigned>(KVDtype::kFp8E5M2)) {
    fail(where, "unknown dtype " + std::to_string(static_cast<unsigned>(dtype)));
  }
  if (layout.has_scales() && !is_fp8(dtype)) {
    fail(where, "a layout with scales needs an FP8 dtype, got " + std::string(to_string(dtype)));
  }
  return bytes_per_value(dtype);
}

// One token's row of `head_dim` 16-bit values as floats.
void row_to_floats(KVDtype dtype, const std::uint16_t* bits, std::int32_t n, float* out) {
  for (std::int32_t d = 0; d < n; ++d) out[d] = dtype_bits_to_float(dtype, bits[d]);
}

}  // namespace

void validate(const KVAppendParams& p) {
  constexpr const char* kWhere = "kv_append";
  if (p.num_tokens < 0) {
    fail(kWhere, "num_tokens must not be negative, got " + std::to_string(p.num_tokens));
  }
  p.layout.validate();
  const std::int64_t head_dim = p.layout.head_dim;
  const auto check_strides = [&](const char* name, std::int64_t token_stride,
                                 std::int64_t head_stride) {
    if (token_stride < 0 || head_stride < 0) {
      fail(kWhere, std::string(name) + " strides must not be negative");
    }
    const std::int64_t hs = head_stride != 0 ? head_stride : head_dim;
    const std::int64_t ts = token_stride != 0 ? token_stride : p.layout.num_kv_heads * head_dim;
    // The spans are checked for 64-bit overflow first (a wrapped one passed the overlap check),
    // up to the last token's last row.
    std::int64_t token_span = 0;
    std::int64_t extent = 0;
    if (__builtin_mul_overflow(hs, p.layout.num_kv_heads - 1, &token_span) ||
        __builtin_add_overflow(token_span, head_dim, &token_span) ||
        __builtin_mul_overflow(ts, std::max<std::int64_t>(p.num_tokens - 1, 0), &extent) ||
        __builtin_add_overflow(extent, token_span, &extent)) {
      fail(kWhere, std::string(name) + " strides (token " + std::to_string(ts) + ", head " +
                       std::to_string(hs) + ") overflow 64-bit offsets");
    }
    if (hs < head_dim || (p.num_tokens > 1 && ts < token_span)) {
      fail(kWhere, std::string(name) + " strides (token " + std::to_string(ts) + ", head " +
                       std::to_string(hs) + ") make rows overlap");
    }
  };
  validate_kv_quant(p.quant, p.dtype, p.layout, kWhere);
  check_strides("key", p.key_stride_token, p.key_stride_head);
  check_strides("value", p.value_stride_token, p.value_stride_head);
  if (p.num_tokens > 0) {
    if (p.key == nullptr || p.value == nullptr) fail(kWhere, "key or value is null");
    if (p.slot_mapping == nullptr) fail(kWhere, "slot_mapping is null");
    if (p.k_cache == nullptr || p.v_cache == nullptr) fail(kWhere, "k_cache or v_cache is null");
  }
}

void reference_kv_append(const KVAppendParams& p) {
  constexpr const char* kWhere = "reference_kv_append";
  validate(p);
  std::vector<std::int64_t> used;
  used.reserve(static_cast<std::size_t>(p.num_tokens));
  for (std::int64_t i = 0; i < p.num_tokens; ++i) {
    const std::int64_t slot = p.slot_mapping[i];
    if (slot < 0) continue;
    if (slot >= p.layout.num_slots()) {
      fail(kWhere,
           "token " + std::to_string(i) + " has slot " + std::to_string(slot) +
               ", outside the pool's " + std::to_string(p.layout.num_slots()) + " slots",
           ErrorCode::kOutOfRange);
    }
    used.push_back(slot);
  }
  std::sort(used.begin(), used.end());
  const auto dup = std::adjacent_find(used.begin(), used.end());
  if (dup != used.end()) fail(kWhere, "two tokens write slot " + std::to_string(*dup));

  const auto* key = static_cast<const std::uint16_t*>(p.key);
  const auto* value = static_cast<const std::uint16_t*>(p.value);
  if (p.quant.fp8()) {
    // Quantize each (token, head) row of K and of V into its slot (and its scale beside it).
    const Fp8Format format = p.quant.format();
    const bool per_row = p.quant.mode == KVScaleMode::kPerTokenHead;
    const auto dim = static_cast<std::size_t>(p.layout.head_dim);
    std::vector<float> row(dim);
    const auto put = [&](const std::uint16_t* src, void* plane, float tensor_scale,
                         std::int64_t block, std::int64_t offset, std::int32_t h) {
      auto* base = static_cast<std::uint8_t*>(plane);
      row_to_floats(p.dtype, src, p.layout.head_dim, row.data());
      std::uint8_t* codes = base + p.layout.offset(block, offset, h);
      if (per_row) {
        const float scale = quantize_fp8_row(format, row.data(), dim, codes);
        std::memcpy(base + p.layout.scale_byte_offset(block, offset, h), &scale, sizeof scale);
      } else {
        for (std::size_t d = 0; d < dim; ++d) {
          codes[d] = quantize_fp8(format, row[d], tensor_scale);
        }
      }
    };
    for (std::int64_t i = 0; i < p.num_tokens; ++i) {
      const std::int64_t slot = p.slot_mapping[i];
      if (slot < 0) continue;
      const std::int64_t block = slot / p.layout.block_size;
      const std::int64_t offset = slot % p.layout.block_size;
      for (std::int32_t h = 0; h < p.layout.num_kv_heads; ++h) {
        put(key + i * p.key_token_stride() + h * p.key_head_stride(), p.k_cache, p.quant.k_scale,
            block, offset, h);
        put(value + i * p.value_token_stride() + h * p.value_head_stride(), p.v_cache,
            p.quant.v_scale, block, offset, h);
      }
    }
    return;
  }
  auto* k_cache = static_cast<std::uint16_t*>(p.k_cache);
  auto* v_cache = static_cast<std::uint16_t*>(p.v_cache);
  const auto row_bytes = static_cast<std::size_t>(p.layout.head_dim) * sizeof(std::uint16_t);
  for (std::int64_t i = 0; i < p.num_tokens; ++i) {
    const std::int64_t slot = p.slot_mapping[i];
    if (slot < 0) continue;
    const std::int64_t block = slot / p.layout.block_size;
    const std::int64_t offset = slot % p.layout.block_size;
    for (std::int32_t h = 0; h < p.layout.num_kv_heads; ++h) {
      const std::int64_t dst = p.layout.offset(block, offset, h);
      std::memcpy(k_cache + dst, key + i * p.key_token_stride() + h * p.key_head_stride(),
                  row_bytes);
      std::memcpy(v_cache + dst, value + i * p.value_token_stride() + h * p.value_head_stride(),
                  row_bytes);
    }
  }
}

std::vector<BlockRun> coalesce_block_runs(std::span<const BlockPair> pairs) {
  std::vector<BlockRun> runs;
  for (const BlockPair& pair : pairs) {
    if (!runs.empty()) {
      BlockRun& last = runs.back();
      if (pair.src == last.src + last.count && pair.dst == last.dst + last.count) {
        ++last.count;
        continue;
      }
    }
    runs.push_back(BlockRun{pair.src, pair.dst, 1});
  }
  return runs;
}

void validate_block_pairs(std::span<const BlockPair> pairs, std::int64_t src_blocks,
                          std::int64_t dst_blocks, bool same_pool) {
  constexpr const char* kWhere = "block pairs";
  std::unordered_set<std::int64_t> destinations;
  destinations.reserve(pairs.size());
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const BlockPair& pair = pairs[i];
    if (pair.src < 0 || pair.src >= src_blocks) {
      fail(kWhere,
           "pair " + std::to_string(i) + " has source block " + std::to_string(pair.src) +
               ", outside the " + std::to_string(src_blocks) + " source blocks",
           ErrorCode::kOutOfRange);
    }
    if (pair.dst < 0 || pair.dst >= dst_blocks) {
      fail(kWhere,
           "pair " + std::to_string(i) + " has destination block " + std::to_string(pair.dst) +
               ", outside the " + std::to_string(dst_blocks) + " destination blocks",
           ErrorCode::kOutOfRange);
    }
    if (!destinations.insert(pair.dst).second) {
      fail(kWhere, "destination block " + std::to_string(pair.dst) + " appears twice (pair " +
                       std::to_string(i) + ")");
    }
  }
  if (same_pool) {
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      if (destinations.contains(pairs[i].src)) {
        fail(kWhere, "block " + std::to_string(pairs[i].src) + " is both a source (pair " +
                         std::to_string(i) + ") and a destination");
      }
    }
  }
}

void reference_copy_blocks(std::span<void* const> planes, const KVLayout& layout, KVDtype dtype,
                           std::span<const BlockPair> pairs) {
  layout.validate();
  const std::size_t elem = element_bytes("reference_copy_blocks", dtype, layout);
  validate_block_pairs(pairs, layout.num_blocks, layout.num_blocks, /*same_pool=*/true);
  for (std::size_t i = 0; i < planes.size(); ++i) {
    if (planes[i] == nullptr && !pairs.empty()) {
      fail("reference_copy_blocks", "plane " + std::to_string(i) + " is null");
    }
  }
  for (void* const plane : planes) {
    for (const BlockPair& pair : pairs)
      copy_block_rows(plane, layout, pair.src, plane, layout, pair.dst, elem);
  }
}

void validate_swap_layouts(const KVLayout& src_layout, const KVLayout& dst_layout,
                           std::size_t num_src_planes, std::size_t num_dst_planes) {
  constexpr const char* kWhere = "swap_blocks";
  src_layout.validate();
  dst_layout.validate();
  if (num_src_planes != num_dst_planes || num_src_planes == 0) {
    fail(kWhere, "need the same non-zero number of source and destination planes, got " +
                     std::to_string(num_src_planes) + " and " + std::to_string(num_dst_planes));
  }
  if (src_layout.block_size != dst_layout.block_size ||
      src_layout.num_kv_heads != dst_layout.num_kv_heads ||
      src_layout.head_dim != dst_layout.head_dim ||
      src_layout.stride_token != dst_layout.stride_token ||
      src_layout.stride_head != dst_layout.stride_head ||
      src_layout.scale_offset != dst_layout.scale_offset) {
    fail(kWhere,
         "source and destination layouts must hold the same blocks (block_size, num_kv_heads, "
         "head_dim, stride_token, stride_head, scale_offset)");
  }
  if (!src_layout.block_is_contiguous() || !dst_layout.block_is_contiguous()) {
    fail(kWhere, "each block must be one contiguous range (NHD or HND without padding)");
  }
}

void reference_swap_blocks(std::span<const void* const> src_planes, const KVLayout& src_layout,
                           std::span<void* const> dst_planes, const KVLayout& dst_layout,
                           KVDtype dtype, std::span<const BlockPair> pairs) {
  validate_swap_layouts(src_layout, dst_layout, src_planes.size(), dst_planes.size());
  const std::size_t elem = element_bytes("reference_swap_blocks", dtype, src_layout);
  validate_block_pairs(pairs, src_layout.num_blocks, dst_layout.num_blocks, /*same_pool=*/false);
  for (std::size_t i = 0; i < src_planes.size(); ++i) {
    if ((src_planes[i] == nullptr || dst_planes[i] == nullptr) && !pairs.empty()) {
      fail("reference_swap_blocks", "plane " + std::to_string(i) + " is null");
    }
  }
  for (std::size_t i = 0; i < src_planes.size(); ++i) {
    for (const BlockPair& pair : pairs) {
      copy_block_rows(src_planes[i], src_layout, pair.src, dst_planes[i], dst_layout, pair.dst,
                      elem);
    }
  }
}

}  // namespace pagedkv
