#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <string>

#include "pagedkv/base/error.hpp"
#include "pagedkv/cuda/device.hpp"

namespace pagedkv {

namespace {

// Whether the CUDA driver library can be loaded at all. The runtime reports a missing driver
// and a driver too old for it with the same code (cudaErrorInsufficientDriver); only the first
// means "a machine without a GPU".
bool driver_installed() {
  void* handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (handle == nullptr) return false;
  (void)dlclose(handle);
  return true;
}

}  // namespace

int cuda_device_count() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err == cudaSuccess) return count;
  (void)cudaGetLastError();  // clear the error so later calls start clean
  if (err == cudaErrorNoDevice) return 0;
  if (err == cudaErrorInsufficientDriver && !driver_installed()) return 0;
  throw Error(ErrorCode::kDeviceError,
              std::string("cuda_device_count: the CUDA driver is installed but cudaGetDeviceCount "
                          "failed: ") +
                  cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace pagedkv
