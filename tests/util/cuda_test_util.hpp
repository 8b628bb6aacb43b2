// Helpers for the GPU kernel tests: a device buffer (poisoned on allocation), copies, and the
// skip-without-device check.
//
// PAGEDKV_REQUIRE_GPU=1 in the environment (scripts/gpu-check run sets it) turns every skip of
// a GPU test into a failure: no device, or not enough device memory for a case. Without it a
// machine with no GPU skips the device tests; ctest shows them as skipped through the exit code
// of tests/cuda_test_main.cpp. A CUDA driver that is installed but fails is always a failure
// (cuda_device_count throws).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/cuda/device.hpp"

namespace pagedkv::testing {

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

#define PAGEDKV_CUDA_CHECK(call) ::pagedkv::testing::cuda_check((call), #call)

// Byte every fresh DeviceBuffer is filled with: 0xFFFF is a NaN in fp16 and bf16, 0xFFFFFFFF a
// NaN in fp32, so an output element a kernel never wrote is caught by a finiteness check (a fresh
// cudaMalloc often holds zeros, which would pass for "written zeros").
inline constexpr unsigned char kPoisonByte = 0xFF;

// Owns cudaMalloc'ed memory, filled with kPoisonByte.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) {
      PAGEDKV_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
      PAGEDKV_CUDA_CHECK(cudaMemset(ptr_, kPoisonByte, bytes));
      // cudaMemset may still be running; kernels on non-blocking streams would not wait for it.
      PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

template <typename T>
DeviceBuffer upload(std::span<const T> host) {
  DeviceBuffer buffer(host.size_bytes());
  if (!host.empty()) {
    PAGEDKV_CUDA_CHECK(
        cudaMemcpy(buffer.get(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice));
  }
  return buffer;
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& host) {
  return upload(std::span<const T>(host));
}

template <typename T>
std::vector<T> download(const void* device, std::size_t count) {
  std::vector<T> host(count);
  if (count > 0) {
    PAGEDKV_CUDA_CHECK(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost));
  }
  return host;
}

// PAGEDKV_REQUIRE_GPU=1: a GPU test that would skip fails instead.
inline bool gpu_required() {
  const char* value = std::getenv("PAGEDKV_REQUIRE_GPU");
  return value != nullptr && std::string_view(value) == "1";
}

// Skips the current test, or fails it under PAGEDKV_REQUIRE_GPU=1. Use in the test body (it
// returns from the enclosing function).
#define PAGEDKV_GPU_SKIP(message)                                                         \
  do {                                                                                    \
    if (::pagedkv::testing::gpu_required()) {                                             \
      GTEST_FAIL() << "PAGEDKV_REQUIRE_GPU=1, but this GPU test would skip: " << message; \
    }                                                                                     \
    GTEST_SKIP() << message;                                                              \
  } while (false)

// Test fixture base: skips every test when the process sees no CUDA device (fails under
// PAGEDKV_REQUIRE_GPU=1). A driver error throws out of cuda_device_count: the test fails.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) {
      PAGEDKV_GPU_SKIP(
          "no CUDA device visible: GPU kernel checks skipped (they run on a GPU machine, "
          "scripts/gpu-check; the CPU references are tested separately)");
    }
  }
};

}  // namespace pagedkv::testing
