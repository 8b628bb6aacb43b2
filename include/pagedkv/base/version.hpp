// pagedkv/base/version.hpp: the library's version, at compile time and at run time.
//
// PAGEDKV_VERSION_{MAJOR,MINOR,PATCH} describe the headers being compiled against; version()
// reports the library actually linked. A mismatch means headers and library come from different
// installs. CMake reads the numbers from this file: it is the single source of the version.
#pragma once

#include <string_view>

#define PAGEDKV_VERSION_MAJOR 0
#define PAGEDKV_VERSION_MINOR 1
#define PAGEDKV_VERSION_PATCH 0
#define PAGEDKV_VERSION_STRING "0.1.0"
// Single integer for preprocessor comparisons: MAJOR * 10000 + MINOR * 100 + PATCH.
#define PAGEDKV_VERSION \
  (PAGEDKV_VERSION_MAJOR * 10000 + PAGEDKV_VERSION_MINOR * 100 + PAGEDKV_VERSION_PATCH)

namespace pagedkv {

// The version of the linked library, e.g. "0.1.0". Thread-safe, never throws.
std::string_view version() noexcept;

}  // namespace pagedkv
