// The base layer's out-of-line definitions: the linked library's version and error-code names.
#include <string_view>

#include "pagedkv/base/error.hpp"
#include "pagedkv/base/version.hpp"

namespace pagedkv {

std::string_view version() noexcept { return PAGEDKV_VERSION_STRING; }

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kInvalidState: return "invalid state";
    case ErrorCode::kParseError: return "parse error";
    case ErrorCode::kDeviceError: return "device error";
  }
  return "unknown error";
}

}  // namespace pagedkv
