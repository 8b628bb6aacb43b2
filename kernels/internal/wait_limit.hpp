// kernels/internal/wait_limit.hpp: the time limit of the sm_90a kernels' barrier waits
// (mbar::wait_parity, kernels/internal/mbarrier.cuh), host and device, so a host test checks the
// rule that decides a wait has lasted too long (tests/device/wait_limit_test.cpp). Internal to
// pagedkv::cuda.
//
// A wait reads %globaltimer once a first try has failed (start) and again after every failed try
// (now), and traps once wait_expired(start, now, limit). The PTX ISA (10.28) describes
// %globaltimer only as "a predefined, 64-bit global nanosecond timer ... intended for use by
// NVIDIA tools. The behavior is target-specific": nothing promises that a later read is never
// smaller. So the elapsed time is now - start taken as a signed 64-bit value: a timer that steps
// back lengthens the wait instead of reading as 2^64 - 1 ns, which would trap an honest wait at
// once.
#pragma once

#include <cstdint>

#include "internal/host_device.hpp"

// Milliseconds one wait may last before the kernel traps; 0: no limit (the CMake cache variable
// PAGEDKV_CUDA_WAIT_LIMIT_MS sets it for the sm_90a objects).
#ifndef PAGEDKV_CUDA_WAIT_LIMIT_MS
#define PAGEDKV_CUDA_WAIT_LIMIT_MS 10000
#endif

namespace pagedkv::kernels::mbar {

inline constexpr std::uint64_t kNsPerMs = 1000000;
inline constexpr std::uint64_t kWaitLimitNs =
    static_cast<std::uint64_t>(PAGEDKV_CUDA_WAIT_LIMIT_MS) * kNsPerMs;

// Whether a wait that began at start_ns (%globaltimer) has, at now_ns, lasted longer than
// limit_ns (<= 2^63 - 1; the configure step caps the limit at an hour).
PAGEDKV_HOST_DEVICE constexpr bool wait_expired(std::uint64_t start_ns, std::uint64_t now_ns,
                                                std::uint64_t limit_ns) {
  return static_cast<std::int64_t>(now_ns - start_ns) > static_cast<std::int64_t>(limit_ns);
}

}  // namespace pagedkv::kernels::mbar
