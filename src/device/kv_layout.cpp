#include "pagedkv/device/kv_layout.hpp"

#include <algorithm>
#include <array>
#include <limits>
#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

namespace {

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, message);
}

void require_positive(const char* where, const char* name, std::int64_t value) {
  if (value <= 0) {
    fail(std::string(where) + ": " + name + " must be positive, got " + std::to_string(value));
  }
}

// a x b, or an error naming the plane size (the factories' strides come from caller counts).
std::int64_t checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) fail("KVLayout: the plane size overflows 64 bits");
  return product;
}

// The counts validate() checks first: positive, block_size <= kMaxBlockSize, head_dim a multiple
// of 8.
void validate_shape(const KVLayout& layout) {
  constexpr const char* kWhere = "KVLayout";
  require_positive(kWhere, "num_blocks", layout.num_blocks);
  require_positive(kWhere, "block_size", layout.block_size);
  require_positive(kWhere, "num_kv_heads", layout.num_kv_heads);
  require_positive(kWhere, "head_dim", layout.head_dim);
  if (layout.block_size > KVLayout::kMaxBlockSize) {
    fail("KVLayout: block_size must be at most " + std::to_string(KVLayout::kMaxBlockSize) +
         ", got " + std::to_string(layout.block_size));
  }
  if (layout.head_dim % 8 != 0) {
    fail("KVLayout: head_dim must be a multiple of 8 (16-byte vectors), got " +
         std::to_string(layout.head_dim));
  }
}

}  // namespace

void KVCacheSpec::validate() const {
  require_positive("KVCacheSpec", "num_layers", num_layers);
  require_positive("KVCacheSpec", "num_kv_heads", num_kv_heads);
  require_positive("KVCacheSpec", "head_dim", head_dim);
  validate_kv_format(dtype, scale_mode, "KVCacheSpec");
}

std::int64_t kv_bytes_per_token(const KVCacheSpec& spec) {
  spec.validate();
  // At most 2 * 2^31 * 2^31 * 2^31 * 2 in theory; real models are far below 2^63, but check.
  const auto per_value = static_cast<std::int64_t>(bytes_per_value(spec.dtype));
  const std::int64_t scale = spec.scale_mode == KVScaleMode::kPerTokenHead ? 4 : 0;
  // head_dim x per_value + scale fits: head_dim < 2^31.
  std::int64_t bytes = 2 * (std::int64_t{spec.head_dim} * per_value + scale);
  for (const std::int64_t factor :
       {std::int64_t{spec.num_layers}, std::int64_t{spec.num_kv_heads}}) {
    if (bytes > std::numeric_limits<std::int64_t>::max() / factor) {
      fail("kv_bytes_per_token: the size overflows 64 bits");
    }
    bytes *= factor;
  }
  return bytes;
}

std::int64_t kv_bytes_per_block(const KVCacheSpec& spec, std::int32_t block_size) {
  require_positive("kv_bytes_per_block", "block_size", block_size);
  const std::int64_t per_token = kv_bytes_per_token(spec);
  if (spec.scale_mode == KVScaleMode::kPerTokenHead) {
    // Per plane (K or V of one layer): the block's codes and scales, padded to 16 bytes.
    const std::int64_t row_bytes = std::int64_t{spec.head_dim} + 4;
    const std::int64_t rows = std::int64_t{block_size} * spec.num_kv_heads;
    if (rows > std::numeric_limits<std::int64_t>::max() / 2 / row_bytes / 2 / spec.num_layers) {
      fail("kv_bytes_per_block: the size overflows 64 bits");
    }
    const std::int64_t plane_block = (rows * row_bytes + 15) / 16 * 16;
    return 2 * std::int64_t{spec.num_layers} * plane_block;
  }
  if (per_token > std::numeric_limits<std::int64_t>::max() / block_size) {
    fail("kv_bytes_per_block: the size overflows 64 bits");
  }
  return per_token * block_size;
}

std::int64_t num_blocks_for_budget(const KVCacheSpec& spec, std::int32_t block_size,
                                   std::int64_t budget_bytes) {
  if (budget_bytes < 0) {
    fail("num_blocks_for_budget: budget_bytes must not be negative, got " +
         std::to_string(budget_bytes));
  }
  return budget_bytes / kv_bytes_per_block(spec, block_size);
}

KVLayout KVLayout::nhd(std::int64_t num_blocks, std::int32_t block_size, std::int32_t num_kv_heads,
                       std::int32_t head_dim) {
  KVLayout layout{num_blocks, block_size, num_kv_heads, head_dim, 0, 0, 0, 0};
  validate_shape(layout);
  layout.stride_head = head_dim;
  layout.stride_token = static_cast<std::int64_t>(num_kv_heads) * head_dim;
  layout.stride_block = checked_mul(layout.stride_token, block_size);
  layout.validate();
  return layout;
}

namespace {

KVLayout with_scales(KVLayout layout) {
  layout.scale_offset = layout.block_elements();
  std::int64_t end = 0;
  if (__builtin_add_overflow(layout.scale_offset,
                             4 * std::int64_t{layout.block_size} * layout.num_kv_heads + 15,
                             &end)) {
    fail("KVLayout: the plane size overflows 64 bits");
  }
  layout.stride_block = end / 16 * 16;
  layout.validate();
  return layout;
}

}  // namespace

KVLayout KVLayout::nhd_scaled(std::int64_t num_blocks, std::int32_t block_size,
                              std::int32_t num_kv_heads, std::int32_t head_dim) {
  return with_scales(nhd(num_blocks, block_size, num_kv_heads, head_dim));
}

KVLayout KVLayout::hnd_scaled(std::int64_t num_blocks, std::int32_t block_size,
                              std::int32_t num_kv_heads, std::int32_t head_dim) {
  return with_scales(hnd(num_blocks, block_size, num_kv_heads, head_dim));
}

KVLayout KVLayout::hnd(std::int64_t num_blocks, std::int32_t block_size, std::int32_t num_kv_heads,
                       std::int32_t head_dim) {
  KVLayout layout{num_blocks, block_size, num_kv_heads, head_dim, 0, 0, 0, 0};
  validate_shape(layout);
  layout.stride_token = head_dim;
  layout.stride_head = static_cast<std::int64_t>(block_size) * head_dim;
  layout.stride_block = checked_mul(layout.stride_head, num_kv_heads);
  layout.validate();
  return layout;
}

std::int64_t KVLayout::block_span() const noexcept {
  const std::int64_t rows =
      (block_size - 1) * stride_token + (num_kv_heads - 1) * stride_head + head_dim;
  return has_scales() ? std::max(rows, scale_offset + block_scale_bytes()) : rows;
}

std::int64_t KVLayout::plane_elements() const noexcept {
  return (num_blocks - 1) * stride_block + block_span();
}

bool KVLayout::block_is_contiguous() const noexcept {
  const std::int64_t extent =
      (block_size - 1) * stride_token + (num_kv_heads - 1) * stride_head + head_dim;
  return extent == block_elements() && (!has_scales() || scale_offset == block_elements());
}

void KVLayout::validate() const {
  constexpr const char* kWhere = "KVLayout";
  validate_shape(*this);
  const std::array<std::pair<const char*, std::int64_t>, 3> strides = {
      {{"stride_block", stride_block},
       {"stride_token", stride_token},
       {"stride_head", stride_head}}};
  for (const auto& [name, stride] : strides) {
    require_positive(kWhere, name, stride);
    if (stride % 8 != 0) {
      fail(std::string("KVLayout: ") + name + " must be a multiple of 8 elements, got " +
           std::to_string(stride));
    }
  }
  // Distinct (block, token, head) rows must not overlap: sorted by stride, each index's rows
  // must fit inside one step of the next (a nested layout). Indices of extent 1 never move.
  struct Axis {
    std::int64_t stride;
    std::int64_t extent;
  };
  std::array<Axis, 3> axes = {
      {{stride_block, num_blocks}, {stride_token, block_size}, {stride_head, num_kv_heads}}};
  std::sort(axes.begin(), axes.end(),
            [](const Axis& a, const Axis& b) { return a.stride < b.stride; });
  std::int64_t footprint = head_dim;  // elements spanned by the axes handled so far
  for (const Axis& axis : axes) {
    if (axis.extent == 1) continue;
    if (axis.stride < footprint) {
      fail("KVLayout: strides make different (block, token, head) rows overlap (stride " +
           std::to_string(axis.stride) + " < " + std::to_string(footprint) + " elements)");
    }
    if (axis.stride > std::numeric_limits<std::int64_t>::max() / axis.extent) {
      fail("KVLayout: the plane size overflows 64 bits");
    }
    footprint = axis.stride * (axis.extent - 1) + footprint;
  }
  if (scale_offset < 0) {
    fail("KVLayout: scale_offset must not be negative, got " + std::to_string(scale_offset));
  }
  if (has_scales()) {
    const std::int64_t rows =
        (block_size - 1) * stride_token + (num_kv_heads - 1) * stride_head + head_dim;
    if (scale_offset % 8 != 0 || scale_offset < rows) {
      fail("KVLayout: scale_offset must be a multiple of 8 at or past the block's rows (" +
           std::to_string(rows) + " elements), got " + std::to_string(scale_offset));
    }
    if (scale_offset > std::numeric_limits<std::int64_t>::max() - block_scale_bytes()) {
      fail("KVLayout: scale_offset " + std::to_string(scale_offset) +
           " + the block's scales overflows 64 bits");
    }
    if (num_blocks > 1 && stride_block < scale_offset + block_scale_bytes()) {
      fail("KVLayout: stride_block " + std::to_string(stride_block) +
           " leaves no room for the block's scales (scale_offset " + std::to_string(scale_offset) +
           " + " + std::to_string(block_scale_bytes()) + ")");
    }
  }
}

}  // namespace pagedkv
