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

// Copies one block's rows (every token and head) between two planes with the same row grid.
void copy_block_rows(const std::uint16_t* src, const KVLayout& src_layout, std::int64_t src_block,
                     std::uint16_t* dst, const KVLayout& dst_layout, std::int64_t dst_block) {
  const auto row_bytes = static_cast<std::size_t>(src_layout.head_dim) * sizeof(std::uint16_t);
  for (std::int32_t t = 0; t < src_layout.block_size; ++t) {
    for (std::int32_t h = 0; h < src_layout.num_kv_heads; ++h) {
      std::memcpy(dst + dst_layout.offset(dst_block, t, h),
                  src + src_layout.offset(src_block, t, h), row_bytes);
    }
  }
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
    if (hs < head_dim || (p.num_tokens > 1 && ts < hs * (p.layout.num_kv_heads - 1) + head_dim)) {
      fail(kWhere, std::string(name) + " strides (token " + std::to_string(ts) + ", head " +
                       std::to_string(hs) + ") make rows overlap");
    }
  };
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
  (void)dtype;  // both dtypes are 16-bit values, copied as bits
  layout.validate();
  validate_block_pairs(pairs, layout.num_blocks, layout.num_blocks, /*same_pool=*/true);
  for (std::size_t i = 0; i < planes.size(); ++i) {
    if (planes[i] == nullptr && !pairs.empty()) {
      fail("reference_copy_blocks", "plane " + std::to_string(i) + " is null");
    }
  }
  for (void* const plane : planes) {
    auto* base = static_cast<std::uint16_t*>(plane);
    for (const BlockPair& pair : pairs)
      copy_block_rows(base, layout, pair.src, base, layout, pair.dst);
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
      src_layout.stride_head != dst_layout.stride_head) {
    fail(kWhere,
         "source and destination layouts must hold the same blocks (block_size, num_kv_heads, "
         "head_dim, stride_token, stride_head)");
  }
  if (!src_layout.block_is_contiguous() || !dst_layout.block_is_contiguous()) {
    fail(kWhere, "each block must be one contiguous range (NHD or HND without padding)");
  }
}

void reference_swap_blocks(std::span<const void* const> src_planes, const KVLayout& src_layout,
                           std::span<void* const> dst_planes, const KVLayout& dst_layout,
                           KVDtype dtype, std::span<const BlockPair> pairs) {
  (void)dtype;  // both dtypes are 16-bit values, copied as bits
  validate_swap_layouts(src_layout, dst_layout, src_planes.size(), dst_planes.size());
  validate_block_pairs(pairs, src_layout.num_blocks, dst_layout.num_blocks, /*same_pool=*/false);
  for (std::size_t i = 0; i < src_planes.size(); ++i) {
    if ((src_planes[i] == nullptr || dst_planes[i] == nullptr) && !pairs.empty()) {
      fail("reference_swap_blocks", "plane " + std::to_string(i) + " is null");
    }
  }
  for (std::size_t i = 0; i < src_planes.size(); ++i) {
    const auto* src = static_cast<const std::uint16_t*>(src_planes[i]);
    auto* dst = static_cast<std::uint16_t*>(dst_planes[i]);
    for (const BlockPair& pair : pairs) {
      copy_block_rows(src, src_layout, pair.src, dst, dst_layout, pair.dst);
    }
  }
}

}  // namespace pagedkv
