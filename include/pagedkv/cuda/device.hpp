// pagedkv/cuda/device.hpp: does this process see a CUDA device? (target pagedkv::cuda)
//
// GPU tests and tools call this to skip cleanly on machines without a GPU or driver. It never
// throws and never initializes more than the CUDA runtime needs to count devices.
#pragma once

namespace pagedkv {

// Number of CUDA devices visible to the runtime; 0 when there is no device, no driver, or the
// runtime reports any error.
int cuda_device_count() noexcept;

}  // namespace pagedkv
