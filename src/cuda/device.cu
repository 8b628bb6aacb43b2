#include <cuda_runtime_api.h>

#include "pagedkv/cuda/device.hpp"

namespace pagedkv {

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return count;
}

}  // namespace pagedkv
