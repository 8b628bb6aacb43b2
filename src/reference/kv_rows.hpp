// Private to the CPU references: one (block, token, KV head) row of a K or V plane as doubles.
// A 16-bit cache converts its bits exactly; an FP8 cache dequantizes each code exactly as the
// kernels do (pagedkv/device/fp8.hpp: decode, then one float32 product with the row's scale),
// and the double holds that float exactly. No checks; O(head_dim).
#pragma once

#include <cstdint>

#include "pagedkv/device/fp8.hpp"
#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/device/kv_quant.hpp"
#include "pagedkv/device/paged_kv.hpp"

namespace pagedkv::reference_detail {

inline void read_kv_row(const PagedKVParams& p, bool value_plane, std::int64_t block,
                        std::int64_t token, std::int64_t head, double* out) {
  const void* plane = value_plane ? p.v_cache : p.k_cache;
  const std::int64_t at = p.layout.offset(block, token, head);
  const std::int32_t dim = p.layout.head_dim;
  if (!p.quant.fp8()) {
    const auto* bits = static_cast<const std::uint16_t*>(plane) + at;
    for (std::int32_t d = 0; d < dim; ++d) {
      out[d] = static_cast<double>(dtype_bits_to_float(p.dtype, bits[d]));
    }
    return;
  }
  const auto* codes = static_cast<const std::uint8_t*>(plane) + at;
  const float scale = kv_row_scale(plane, p.layout, p.quant, value_plane, block, token, head);
  const Fp8Format format = p.quant.format();
  for (std::int32_t d = 0; d < dim; ++d) {
    out[d] = static_cast<double>(dequantize_fp8(format, codes[d], scale));
  }
}

}  // namespace pagedkv::reference_detail
