// kernels/internal/host_device.hpp: PAGEDKV_HOST_DEVICE, the qualifier of the functions that the
// kernels' internal headers share between device code (nvcc) and the host tests that check them
// (the host compiler): __host__ __device__ __forceinline__ under nvcc, inline elsewhere. Internal
// to pagedkv::cuda.
#pragma once

#ifdef __CUDACC__
#define PAGEDKV_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PAGEDKV_HOST_DEVICE inline
#endif
