// pagedkv/device/kv_quant.hpp: how a kernel reads and writes an FP8 KV cache (issue 36): the FP8
// type, the scale mode and the per-tensor scales, as one plain value the kernel parameters carry
// (KVAppendParams, PagedKVParams).
//
// With mode kNone (the default) the cache holds 16-bit values of the parameters' own dtype and
// nothing here applies. Otherwise the K / V planes hold 1-byte codes of `dtype` (E4M3 or E5M2):
//   kPerTensor     value = decode(code) x k_scale (v_scale for V); the engine gives the scales
//                  (vLLM's k_scale / v_scale); the layout has no scale_offset.
//   kPerTokenHead  value = decode(code) x s, s the float32 at layout.scale_byte_offset(block,
//   token,
//                  head) of the same plane (pagedkv/device/kv_layout.hpp), written by kv_append as
//                  fp8_row_scale(amax of the row) (pagedkv/device/fp8.hpp).
// Quantizing and dequantizing use exactly fp8.hpp's functions, on the CPU and on the GPU.
//
// Trivially copyable (kernels take it by value). validate_kv_quant throws pagedkv::Error
// (kInvalidArgument) naming `who` and the problem; the inline readers do no checks. O(1).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "pagedkv/device/fp8.hpp"
#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/device/kv_layout.hpp"

namespace pagedkv {

struct KVQuant {
  KVScaleMode mode = KVScaleMode::kNone;  // kNone: a 16-bit cache
  KVDtype dtype = KVDtype::kFp8E4M3;      // the codes' type when mode != kNone
  float k_scale = 1.0f;                   // kPerTensor: finite, > 0
  float v_scale = 1.0f;

  constexpr bool fp8() const noexcept { return mode != KVScaleMode::kNone; }
  constexpr Fp8Format format() const noexcept {
    return dtype == KVDtype::kFp8E5M2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
  }
  // The cache's element type: `dtype` for FP8, else the 16-bit type the caller uses.
  constexpr KVDtype cache_dtype(KVDtype value_dtype) const noexcept {
    return fp8() ? dtype : value_dtype;
  }
};

// With `value_dtype` the 16-bit type of the kernel's inputs / outputs: mode kNone needs a 16-bit
// value_dtype and a layout without scales; an FP8 mode needs an FP8 dtype, a 16-bit value_dtype,
// valid scales (kPerTensor, fp8_scale_is_valid, and no scale_offset) or a layout with scales
// (kPerTokenHead). Throws pagedkv::Error.
void validate_kv_quant(const KVQuant& quant, KVDtype value_dtype, const KVLayout& layout,
                       std::string_view who);

// The scale of row (block, token, head) of a plane (host code; no checks).
inline float kv_row_scale(const void* plane, const KVLayout& layout, const KVQuant& quant,
                          bool value_plane, std::int64_t block, std::int64_t token,
                          std::int64_t head) noexcept {
  if (quant.mode == KVScaleMode::kPerTensor) return value_plane ? quant.v_scale : quant.k_scale;
  float scale;
  std::memcpy(
      &scale,
      static_cast<const std::uint8_t*>(plane) + layout.scale_byte_offset(block, token, head),
      sizeof scale);
  return scale;
}

}  // namespace pagedkv
