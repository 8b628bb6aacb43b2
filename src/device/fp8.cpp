#include "pagedkv/device/fp8.hpp"

#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

std::string_view to_string(Fp8Format format) noexcept {
  switch (format) {
    case Fp8Format::kE4M3:
      return "fp8_e4m3";
    case Fp8Format::kE5M2:
      return "fp8_e5m2";
  }
  return "unknown";
}

void check_fp8_scale(float scale, std::string_view what) {
  if (fp8_scale_is_valid(scale)) return;
  throw Error(ErrorCode::kInvalidArgument, "pagedkv: FP8 scale " + std::string(what) +
                                               " must be finite and > 0, got " +
                                               std::to_string(scale));
}

}  // namespace pagedkv
