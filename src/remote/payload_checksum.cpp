#include "payload_checksum.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace pagedkv::remote_detail {

std::uint64_t payload_checksum(const void* data, std::size_t size, std::uint64_t seed) noexcept {
#if PAGEDKV_REMOTE_AVX2
  // __builtin_cpu_supports reads what libgcc's constructor found once: no state of ours.
  if (__builtin_cpu_supports("avx2")) return payload_checksum_avx2(data, size, seed);
#endif
  return XXH3_64bits_withSeed(data, size, seed);
}

}  // namespace pagedkv::remote_detail
