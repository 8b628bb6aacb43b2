#include "pagedkv/pool/table_allocator.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace pagedkv::detail {

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kHugeFrom = std::size_t{1} << 20;  // smaller tables: plain pages
}  // namespace

void* allocate_table(std::size_t bytes) {
  if (bytes < kHugeFrom) return ::operator new(bytes);
  const std::size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = ::operator new (rounded, std::align_val_t{kHugePage});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  (void)madvise(p, rounded, MADV_HUGEPAGE);  // a hint: refused or ignored is fine
#endif
  return p;
}

void deallocate_table(void* p, std::size_t bytes) noexcept {
  if (bytes < kHugeFrom) {
    ::operator delete(p);
  } else {
    ::operator delete (p, std::align_val_t{kHugePage});
  }
}

}  // namespace pagedkv::detail
