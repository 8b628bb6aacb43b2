// pagedkv/base/error.hpp: the one exception type the library throws.
//
// Contract: every public call that detects misuse (bad arguments, unknown ids, double frees,
// malformed input) throws pagedkv::Error *before* changing any state, so catching it leaves the
// object exactly as it was. Normal outcomes such as "not enough free blocks" are return values,
// never exceptions. std::bad_alloc may still propagate from allocations.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace pagedkv {

enum class ErrorCode {
  kInvalidArgument,  // a value outside its documented domain (block size 0, negative token id)
  kOutOfRange,       // an index or id outside the object's range
  kNotFound,         // an unknown id (request, block) where a known one is required
  kInvalidState,     // a call not allowed in the object's current state (double free, reset in use)
  kParseError,       // malformed external input (trace lines, hex digests, command-line values)
  kDeviceError,      // the CUDA driver or runtime failed (pagedkv::cuda only; not a usage error)
};

std::string_view to_string(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}

  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace pagedkv
