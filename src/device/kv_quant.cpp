#include "pagedkv/device/kv_quant.hpp"

#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

void validate_kv_quant(const KVQuant& q, KVDtype value_dtype, const KVLayout& layout,
                       std::string_view who) {
  const auto fail = [&](const std::string& message) {
    throw Error(ErrorCode::kInvalidArgument, std::string(who) + ": " + message);
  };
  if (is_fp8(value_dtype) || static_cast<unsigned>(value_dtype) > 3) {
    fail("dtype (of the 16-bit inputs and outputs) must be fp16 or bf16, got " +
         std::string(to_string(value_dtype)));
  }
  if (!q.fp8()) {
    validate_kv_format(value_dtype, q.mode, who);
    if (layout.has_scales()) fail("a 16-bit cache's layout has no scales (scale_offset 0)");
    return;
  }
  validate_kv_format(q.dtype, q.mode, who);
  if (q.mode == KVScaleMode::kPerTensor) {
    check_fp8_scale(q.k_scale, std::string(who) + " k_scale");
    check_fp8_scale(q.v_scale, std::string(who) + " v_scale");
    if (layout.has_scales()) fail("per-tensor scales take a layout without scale_offset");
  } else if (!layout.has_scales()) {
    fail("per-(token, head) scales need a layout with scale_offset (KVLayout::nhd_scaled)");
  }
}

}  // namespace pagedkv
