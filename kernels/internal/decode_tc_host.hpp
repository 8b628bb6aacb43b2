// kernels/internal/decode_tc_host.hpp: host-side pieces the tensor-core decode launchers share
// (kernels/decode_attention_tc.cu, kernels/decode_attention_tc_fp8.cu), internal to pagedkv::cuda:
// the (dtype, head_dim, soft-cap) dispatch onto template instantiations, the programmatic
// dependent launch attribute where the device and the kernel's code have it (sm_90+), and a
// kernel's resident CTAs per SM. No device code; errors as CUDA error codes, except an unsupported
// head_dim or one this build leaves out (internal/head_dims.hpp), which throws pagedkv::Error
// (kInvalidArgument) naming `who`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "head_dims.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/device/kv_dtype.hpp"

namespace pagedkv::kernels {

// fn.template operator()<kBf16, kHeadDim, kSoftCap>() for head_dim 64, 128 or 256 (those compiled).
template <typename Fn>
cudaError_t dispatch_tc_decode(KVDtype dtype, int head_dim, bool soft_cap, const char* who,
                               Fn&& fn) {
  const bool bf16 = dtype == KVDtype::kBFloat16;
  const auto by_cap = [&]<bool kBf16, int kHeadDim>() {
    return soft_cap ? fn.template operator()<kBf16, kHeadDim, true>()
                    : fn.template operator()<kBf16, kHeadDim, false>();
  };
  const auto by_dtype = [&]<int kHeadDim>() {
    return bf16 ? by_cap.template operator()<true, kHeadDim>()
                : by_cap.template operator()<false, kHeadDim>();
  };
  switch (head_dim) {
#if PAGEDKV_CUDA_HEAD_DIM_64
    case 64:
      return by_dtype.template operator()<64>();
#endif
#if PAGEDKV_CUDA_HEAD_DIM_128
    case 128:
      return by_dtype.template operator()<128>();
#endif
#if PAGEDKV_CUDA_HEAD_DIM_256
    case 256:
      return by_dtype.template operator()<256>();
#endif
    default:
      throw Error(ErrorCode::kInvalidArgument, std::string(who) + ": " + head_dim_error(head_dim));
  }
}

// Whether every architecture this translation unit is compiled for is sm_90 or newer
// (__CUDA_ARCH_LIST__, nvcc 11.5+), so whatever code a Hopper GPU runs from it has the kernels'
// griddepcontrol.wait: a build that also targets an older architecture may run that code's PTX,
// JIT-compiled, on a newer GPU, where a programmatic launch would not wait for its predecessor.
// Internal linkage (static), like programmatic_launch_attr below: the answer belongs to each
// translation unit (the sm_90a objects are compiled for another list than the rest).
static constexpr bool kCompiledForSm90AndUp = [] {
#ifdef __CUDA_ARCH_LIST__
  constexpr int kArchs[] = {__CUDA_ARCH_LIST__};
  for (const int arch : kArchs) {
    if (arch < 900) return false;
  }
  return true;
#else
  return false;
#endif
}();

// Programmatic stream serialization for a launch on the current device: *attr filled and
// *num_attrs = 1 on an sm_90+ device when kCompiledForSm90AndUp, *num_attrs = 0 otherwise.
static inline cudaError_t programmatic_launch_attr(cudaLaunchAttribute* attr, unsigned* num_attrs) {
  *num_attrs = 0;
  if (!kCompiledForSm90AndUp) return cudaSuccess;
  int device = 0;
  int major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (err != cudaSuccess) return err;
  if (major >= 9) {
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    *num_attrs = 1;
  }
  return cudaSuccess;
}

// CTAs of `kernel` (threads per CTA, dynamic shared memory bytes) resident per SM on the current
// device, at least 1; sets the kernel's dynamic shared memory limit first.
template <typename Kernel>
cudaError_t resident_ctas_per_sm(Kernel kernel, int threads, std::size_t smem_bytes, int* ctas) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem_bytes));
  int resident = 0;
  if (err == cudaSuccess) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, smem_bytes);
  }
  if (err != cudaSuccess) return err;
  *ctas = resident > 0 ? resident : 1;
  return cudaSuccess;
}

}  // namespace pagedkv::kernels
