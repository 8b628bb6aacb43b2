// pagedkv/cuda/device.hpp: does this process see a CUDA device? (target pagedkv::cuda)
//
// GPU tests and tools call this to tell three situations apart:
//   - a usable driver and N >= 1 devices: returns N;
//   - no device: no CUDA driver installed at all (libcuda.so.1 cannot be loaded: a CPU-only
//     machine), or a driver that reports no device (cudaErrorNoDevice): returns 0;
//   - a driver that is installed but fails (too old for this runtime, failed initialization, a
//     device that is busy or lost, any other runtime error): throws pagedkv::Error with
//     ErrorCode::kDeviceError naming the CUDA error, so a broken GPU machine fails loudly instead
//     of looking like a machine without a GPU.
// It initializes no more than the CUDA runtime needs to count devices. Thread-safe.
#pragma once

namespace pagedkv {

// Number of CUDA devices visible to the runtime; 0 when there is no driver or no device.
// Throws pagedkv::Error (kDeviceError) when a driver is present but the runtime reports an error.
int cuda_device_count();

}  // namespace pagedkv
