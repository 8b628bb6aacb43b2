// pagedkv/pool/table_allocator.hpp: the allocator of a pool's large flat tables.
//
// The pool's per-block arrays (block records, queue links, hash-map slots, stored material) are
// read at random, one or two cache lines per block, so with 4 KiB pages nearly every access of a
// large pool also misses the TLB. Tables of 1 MiB or more are therefore allocated 2 MiB-aligned,
// rounded up to whole 2 MiB pages, and marked for transparent huge pages (Linux
// madvise(MADV_HUGEPAGE): a hint the kernel may ignore; elsewhere nothing is marked). Smaller
// tables come from plain operator new. Allocation goes through (aligned) operator new, so
// replacement allocators see it.
//
// Complexity: one allocation per call. Thread safe (stateless). Errors: std::bad_alloc (or
// std::bad_array_new_length) on failure, as std::allocator.
#pragma once

#include <cstddef>
#include <limits>
#include <new>
#include <vector>

namespace pagedkv {

namespace detail {
void* allocate_table(std::size_t bytes);
void deallocate_table(void* p, std::size_t bytes) noexcept;
}  // namespace detail

template <typename T>
struct TableAllocator {
  using value_type = T;
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);

  TableAllocator() noexcept = default;
  template <typename U>
  TableAllocator(const TableAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit

  T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(detail::allocate_table(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept { detail::deallocate_table(p, n * sizeof(T)); }
};

// Stateless: every instance frees what any other allocated.
template <typename T, typename U>
bool operator==(const TableAllocator<T>&, const TableAllocator<U>&) noexcept {
  return true;
}

// A flat table of the pool.
template <typename T>
using TableVector = std::vector<T, TableAllocator<T>>;

}  // namespace pagedkv
