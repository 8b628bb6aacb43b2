// Helpers for the GPU kernel tests: a device buffer, copies, and the skip-without-device check.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "pagedkv/cuda/device.hpp"

namespace pagedkv::testing {

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

#define PAGEDKV_CUDA_CHECK(call) ::pagedkv::testing::cuda_check((call), #call)

// Owns cudaMalloc'ed memory.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (bytes > 0) PAGEDKV_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
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

// Test fixture base: skips every test when the process sees no CUDA device.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) {
      GTEST_SKIP() << "no CUDA device visible: GPU kernel checks skipped (they run on a GPU "
                      "machine; the CPU references are tested separately)";
    }
  }
};

}  // namespace pagedkv::testing
