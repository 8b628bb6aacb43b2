// Compiled with -mavx2 (CMakeLists.txt): xxHash inlined here (XXH_INLINE_ALL: every function
// static to this unit, so no AVX2 code leaks into another unit through the linker) selects its
// AVX2 path. Called only after a run-time check (payload_checksum.cpp).
#include "payload_checksum.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace pagedkv::remote_detail {

std::uint64_t payload_checksum_avx2(const void* data, std::size_t size,
                                    std::uint64_t seed) noexcept {
  return XXH3_64bits_withSeed(data, size, seed);
}

}  // namespace pagedkv::remote_detail
