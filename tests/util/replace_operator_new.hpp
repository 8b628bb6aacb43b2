// tests/util/replace_operator_new.hpp: replaces a test program's global operator new and delete
// (malloc / free; the nothrow forms too) so that every allocation goes through
// pagedkv_test_alloc(n), which the program defines (nth_alloc_failure.hpp does; a test with its
// own rule defines its own). The replacement functions are defined here: include this header in
// exactly one source file of a program.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

// Returns n bytes (at least one) or throws std::bad_alloc.
void* pagedkv_test_alloc(std::size_t n);

void* operator new(std::size_t n) {
  return pagedkv_test_alloc(n);
}
void* operator new[](std::size_t n) {
  return pagedkv_test_alloc(n);
}
// The nothrow forms too (libraries such as libzmq use them): as the standard's, the throwing
// form with its bad_alloc caught, so that every form pairs with the free below (a sanitizer's
// own nothrow new would not).
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return pagedkv_test_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return pagedkv_test_alloc(n);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
