// pagedkv/cuda/head_dims.hpp: which head dimensions this build of pagedkv::cuda has kernels for
// (target pagedkv::cuda).
//
// The kernels support head_dim 64, 128 and 256. A build compiles all three by default; the CMake
// setting PAGEDKV_CUDA_HEAD_DIMS (a list, for example "128") compiles only those named, for an
// engine that serves models of one head dimension (128 alone: a static library of 6.5 MB instead
// of 15.2 MB, a fifth less compile CPU time, nvcc 13, sm_90). The installed package tells which
// (pagedkv_CUDA_HEAD_DIMS after find_package). Decode and extend attention, their validation and
// their planners refuse a head_dim left out of the build before anything is enqueued, with
// pagedkv::Error (kInvalidArgument) that names the head dimension and the ones compiled
// (decode_kernel_runs / extend_kernel_runs answer for parameters that validate). The cache
// operations (kv_append, copy / swap of blocks) take any head_dim. pagedkv's own test suite
// expects all three. Constant time, no allocation, thread-safe.
#pragma once

namespace pagedkv {

// Whether this build's CUDA kernels cover head_dim (false for anything but 64, 128 or 256).
bool cuda_head_dim_compiled(int head_dim) noexcept;

}  // namespace pagedkv
