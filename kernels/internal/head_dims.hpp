// kernels/internal/head_dims.hpp: the head dimensions this build of pagedkv::cuda compiles
// kernels for, internal to pagedkv::cuda.
//
// The CMake setting PAGEDKV_CUDA_HEAD_DIMS (default "64;128;256") defines
// PAGEDKV_CUDA_HEAD_DIM_<d>=0 for each of 64, 128 and 256 it leaves out; every kernel source's
// head_dim switch compiles `case <d>` only under `#if PAGEDKV_CUDA_HEAD_DIM_<d>`, so a build for
// models of one head_dim compiles a third of the instantiations (128 alone: 42% of the library's
// bytes, 80% of its compile CPU time). A macro not defined means "compiled", so a translation unit
// that is not told compiles everything. Host code only: constexpr queries and the refusal every
// entry point's validation makes (before any launch) for a head_dim outside {64, 128, 256} or left
// out of this build (head_dim_error: the message, which each caller throws as pagedkv::Error,
// kInvalidArgument, with its own name).
#pragma once

#include <string>

#ifndef PAGEDKV_CUDA_HEAD_DIM_64
#define PAGEDKV_CUDA_HEAD_DIM_64 1
#endif
#ifndef PAGEDKV_CUDA_HEAD_DIM_128
#define PAGEDKV_CUDA_HEAD_DIM_128 1
#endif
#ifndef PAGEDKV_CUDA_HEAD_DIM_256
#define PAGEDKV_CUDA_HEAD_DIM_256 1
#endif

static_assert(PAGEDKV_CUDA_HEAD_DIM_64 || PAGEDKV_CUDA_HEAD_DIM_128 || PAGEDKV_CUDA_HEAD_DIM_256,
              "pagedkv::cuda needs at least one head_dim (PAGEDKV_CUDA_HEAD_DIMS)");

namespace pagedkv::kernels {

// Whether head_dim is one the kernels support at all.
constexpr bool head_dim_supported(int head_dim) noexcept {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

// Whether this build compiled the kernels for head_dim.
constexpr bool head_dim_compiled(int head_dim) noexcept {
  switch (head_dim) {
    case 64:
      return PAGEDKV_CUDA_HEAD_DIM_64 != 0;
    case 128:
      return PAGEDKV_CUDA_HEAD_DIM_128 != 0;
    case 256:
      return PAGEDKV_CUDA_HEAD_DIM_256 != 0;
    default:
      return false;
  }
}

// The compiled head dimensions as text: "64, 128, 256" for the default build.
inline std::string compiled_head_dims_text() {
  std::string text;
  for (const int d : {64, 128, 256}) {
    if (!head_dim_compiled(d)) continue;
    if (!text.empty()) text += ", ";
    text += std::to_string(d);
  }
  return text;
}

// The message for a head_dim this build cannot run: unsupported, or left out of the build.
inline std::string head_dim_error(int head_dim) {
  if (!head_dim_supported(head_dim)) {
    return "head_dim must be 64, 128 or 256, got " + std::to_string(head_dim);
  }
  return "head_dim " + std::to_string(head_dim) +
         " is not compiled into this build of pagedkv::cuda (PAGEDKV_CUDA_HEAD_DIMS: " +
         compiled_head_dims_text() + ")";
}

}  // namespace pagedkv::kernels
