// tests/util/nth_alloc_failure.hpp: a test program's allocations, failed on request, for the
// strong-guarantee tests. alloc_failure::fail_at = n makes the (n + 1)th allocation from then on
// throw std::bad_alloc, once (fired records that it did; fail_at is -1 again); Suspend turns the
// injection off for the test's own bookkeeping while it lives. Single-threaded use. Defines the
// program's replacement operator new (replace_operator_new.hpp): include it in exactly one source
// file of a program.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

#include "replace_operator_new.hpp"

namespace alloc_failure {

inline long fail_at = -1;  // allocations until the injected failure; -1: none
inline bool fired = false;
inline bool suspended = false;

// No injected failure while alive.
struct Suspend {
  bool was = suspended;
  Suspend() { suspended = true; }
  ~Suspend() { suspended = was; }
  Suspend(const Suspend&) = delete;
  Suspend& operator=(const Suspend&) = delete;
};

}  // namespace alloc_failure

void* pagedkv_test_alloc(std::size_t n) {
  if (alloc_failure::fail_at >= 0 && !alloc_failure::suspended) {
    if (alloc_failure::fail_at == 0) {
      alloc_failure::fail_at = -1;
      alloc_failure::fired = true;
      throw std::bad_alloc();
    }
    --alloc_failure::fail_at;
  }
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
