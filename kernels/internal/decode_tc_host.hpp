// kernels/internal/decode_tc_host.hpp: host-side pieces the tensor-core decode launchers share
// (kernels/decode_attention_tc.cu, kernels/decode_attention_tc_fp8.cu), internal to pagedkv::cuda:
// the (dtype, head_dim, soft-cap) dispatch onto template instantiations, the programmatic
// dependent launch attribute where the device and the kernel's code have it (sm_90+), and a
// kernel's resident CTAs per SM. No device code; errors as CUDA error codes, except an unsupported
// head_dim, which throws pagedkv::Error (kInvalidArgument) naming `who`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "pagedkv/base/error.hpp"
#include "pagedkv/device/kv_dtype.hpp"

namespace pagedkv::kernels {

// fn.template operator()<kBf16, kHeadDim, kSoftCap>() for head_dim 64, 128 or 256.
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
    case 64:
      return by_dtype.template operator()<64>();
    case 128:
      return by_dtype.template operator()<128>();
    case 256:
      return by_dtype.template operator()<256>();
    default:
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(who) + ": head_dim must be 64, 128 or 256");
  }
}

// Programmatic stream serialization for a launch of `kernel` on the current device: *attr
// filled and *num_attrs = 1 on an sm_90+ device running code compiled for sm_90+ (the kernels'
// griddepcontrol.wait exists only there: a build for an older architecture, JIT-compiled on a
// Hopper GPU, must not be launched programmatically), *num_attrs = 0 otherwise.
template <typename Kernel>
cudaError_t programmatic_launch_attr(Kernel kernel, cudaLaunchAttribute* attr,
                                     unsigned* num_attrs) {
  int device = 0;
  int major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  cudaFuncAttributes compiled{};
  if (err == cudaSuccess && major >= 9) {
    err = cudaFuncGetAttributes(&compiled, kernel);
  }
  if (err != cudaSuccess) return err;
  *num_attrs = 0;
  if (major >= 9 && compiled.ptxVersion >= 90) {
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
