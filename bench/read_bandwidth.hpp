// bench/read_bandwidth.hpp: a read-only streaming baseline for the decode benchmark (decode only
// reads K/V, so a device-to-device copy, which also writes, is not its whole ceiling).
// Benchmarks only. read_only_stream enqueues one kernel on `stream` that reads `bytes` (a
// multiple of 64) from `data` with 16-byte loads (grid-stride, 4 loads in flight per thread)
// and writes nothing unless the XOR of everything it read equals a 32-bit key no random data
// hits in practice (so the loads cannot be optimized away); `sink` (>= 1 unsigned) receives it.
// Returns the launch's CUDA error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace bench {

cudaError_t read_only_stream(const void* data, std::size_t bytes, unsigned* sink,
                             cudaStream_t stream);

}  // namespace bench
