// Private to src/remote: the payload checksum of a remote value (remote_value.hpp: xxh3_64 of the
// payload, seeded by the header), on the fastest code path the CPU has. xxHash's AVX2 path gives
// the same 64 bits as its SSE2 and scalar paths (one algorithm, several vector widths); the AVX2
// one is compiled in its own translation unit (payload_checksum_avx2.cpp, -mavx2) and chosen at
// run time when the CPU reports AVX2, so the library still runs on any x86-64 (or other) CPU.
// Thread-safe, no state; O(bytes).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pagedkv::remote_detail {

std::uint64_t payload_checksum(const void* data, std::size_t size, std::uint64_t seed) noexcept;

// The AVX2 build of the same function (payload_checksum_avx2.cpp); call only when the CPU has
// AVX2. Defined only where PAGEDKV_REMOTE_AVX2 is set (x86-64 with GCC or Clang).
std::uint64_t payload_checksum_avx2(const void* data, std::size_t size,
                                    std::uint64_t seed) noexcept;

}  // namespace pagedkv::remote_detail
