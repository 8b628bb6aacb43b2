#include "pagedkv/cuda/device.hpp"

#include <gtest/gtest.h>

#include "cuda_test_util.hpp"

// Runs everywhere pagedkv::cuda is built: without a GPU (no driver, or no device) the count is 0
// and nothing throws; a driver that is installed but fails throws pagedkv::Error, which fails
// this test.
TEST(CudaDevice, CountIsNonNegative) {
  const int count = pagedkv::cuda_device_count();
  EXPECT_GE(count, 0);
  if (count == 0) PAGEDKV_GPU_SKIP("no CUDA device visible; GPU checks skipped");
  EXPECT_EQ(pagedkv::cuda_device_count(), count);  // stable across calls
  cudaDeviceProp prop{};
  PAGEDKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  EXPECT_GT(prop.multiProcessorCount, 0);
}
