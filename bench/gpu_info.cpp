// gpu_info: what scripts/gpu-check records about the device before testing it: driver and runtime
// versions and the properties the kernels depend on. Exits 1 when no device is visible (or the
// driver fails), 0 otherwise.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>

#include "pagedkv/cuda/device.hpp"

int main() {
  int count = 0;
  try {
    count = pagedkv::cuda_device_count();
  } catch (const std::exception& e) {
    std::printf("gpu_info: %s\n", e.what());
    return 1;
  }
  int driver = 0;
  int runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  std::printf("CUDA driver API %d.%d, runtime %d.%d, %d device(s)\n", driver / 1000,
              driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10, count);
  if (count == 0) {
    std::printf("gpu_info: no CUDA device visible\n");
    return 1;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    const cudaError_t err = cudaGetDeviceProperties(&p, d);
    if (err != cudaSuccess) {
      std::printf("gpu_info: cudaGetDeviceProperties(%d): %s\n", d, cudaGetErrorString(err));
      return 1;
    }
    int sm_clock_khz = 0;
    int mem_clock_khz = 0;
    int bus_width = 0;
    (void)cudaDeviceGetAttribute(&sm_clock_khz, cudaDevAttrClockRate, d);
    (void)cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, d);
    (void)cudaDeviceGetAttribute(&bus_width, cudaDevAttrGlobalMemoryBusWidth, d);
    std::printf(
        "device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB global memory, L2 %.1f MiB, "
        "shared memory %zu KiB per SM (%zu KiB opt-in per block), %d registers per SM, "
        "max SM clock %.0f MHz, memory clock %.0f MHz, bus %d bits (peak %.0f GB/s), "
        "PCI %04x:%02x:%02x\n",
        d, p.name, p.major, p.minor, p.multiProcessorCount,
        static_cast<double>(p.totalGlobalMem) / (1u << 30),
        static_cast<double>(p.l2CacheSize) / (1u << 20), p.sharedMemPerMultiprocessor / 1024,
        p.sharedMemPerBlockOptin / 1024, p.regsPerMultiprocessor, sm_clock_khz / 1e3,
        mem_clock_khz / 1e3, bus_width, 2.0 * mem_clock_khz * 1e3 * (bus_width / 8) / 1e9,
        p.pciDomainID, p.pciBusID, p.pciDeviceID);
  }
  return 0;
}
