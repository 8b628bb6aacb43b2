// python/src/common.hpp: helpers shared by the pagedkv Python bindings (not installed).
//
// Conventions of the bindings:
//  - pagedkv::Error becomes pagedkv.Error (a RuntimeError subclass) with the same message and a
//    .code attribute (pagedkv.ErrorCode); argument conversion problems the bindings detect
//    themselves are reported the same way.
//  - Integer arguments (token ids, request, block and transfer ids, positions, counts) are
//    converted only by the checked helpers below, never by a bare cast or a forcecast array:
//    an array is a 1-D numpy array of an integer dtype, a list or tuple of Python (or numpy)
//    ints, or anything numpy turns into an integer array (a range); floats, bools, strings and
//    objects are refused, never truncated, and values outside the argument's range (a negative
//    id) are refused, never wrapped: pagedkv.Error (INVALID_ARGUMENT) naming the argument and,
//    in an array, the index. Each binding converts all its arguments before its first call into
//    the library, so a refused argument changes nothing. Token arrays: a C-contiguous numpy
//    int32 array is read in place (no copy), anything else is converted once.
//  - Calls whose work grows with tokens or blocks release the GIL (most only for large inputs,
//    objects.hpp kReleaseGilAbove). An object whose call runs
//    without the GIL is marked busy: a second thread reaching the same manager or request at that
//    moment gets pagedkv.Error (INVALID_STATE) instead of a data race, since managers and requests
//    belong to one scheduler thread (as in C++).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/hash/block_hash.hpp"
#include "pagedkv/hash/block_hasher.hpp"

namespace pagedkv::python {

namespace py = pybind11;

// Marks an object as in use for the duration of a call; see the file comment.
class BusyGuard {
 public:
  BusyGuard(std::atomic<bool>& flag, const char* what) : flag_(flag) {
    if (flag_.exchange(true, std::memory_order_acquire)) {
      throw Error(
          ErrorCode::kInvalidState,
          std::string(what) + " is in use by another thread (it belongs to one scheduler thread)");
    }
  }
  ~BusyGuard() { flag_.store(false, std::memory_order_release); }
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;

 private:
  std::atomic<bool>& flag_;
};

// A read-only view of a 1-D integer sequence as int32 token ids. Keeps the numpy array it reads
// alive; `scratch` holds converted values when the input was not already int32.
class TokenView {
 public:
  TokenView(py::handle obj, const char* what);
  std::span<const TokenId> span() const noexcept { return span_; }

 private:
  py::object keep_;
  std::vector<TokenId> scratch_;
  std::span<const TokenId> span_;
};

// Checked integer arguments (see the file comment); `what` names the argument in errors.
// A 1-D integer sequence as int64 values (ids, positions, counts), each in [lo, hi].
std::vector<std::int64_t> to_int64_vector(
    py::handle obj, const char* what, std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
    std::int64_t hi = std::numeric_limits<std::int64_t>::max());
// A 1-D integer sequence of unsigned ids (transfer ids): negative values refused.
std::vector<std::uint64_t> to_uint64_vector(py::handle obj, const char* what);
// One integer (a Python int or numpy integer; not a bool or float) in [lo, hi].
std::int64_t to_int64(py::handle obj, const char* what,
                      std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                      std::int64_t hi = std::numeric_limits<std::int64_t>::max());
// One unsigned id (request id, transfer id) or count, at most `hi`: negative values refused.
std::uint64_t to_uint64(py::handle obj, const char* what,
                        std::uint64_t hi = std::numeric_limits<std::uint64_t>::max());

// One integer argument of type T (a count, size, id or flag value of a constructor or call):
// a Python int or numpy integer in T's range; bools, floats and values out of range are refused.
template <class T>
T to_integer(py::handle obj, const char* what) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if constexpr (std::is_signed_v<T>) {
    return static_cast<T>(
        to_int64(obj, what, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
  } else {
    const std::uint64_t v = to_uint64(obj, what, std::numeric_limits<T>::max());
    return static_cast<T>(v);
  }
}

// The same for an optional argument: None is std::nullopt.
template <class T>
std::optional<T> to_optional_integer(py::handle obj, const char* what) {
  if (obj.is_none()) return std::nullopt;
  return to_integer<T>(obj, what);
}

// Digests: Python bytes of 16 or 32 bytes.
BlockHash hash_from_bytes(py::handle obj, const char* what);
py::bytes hash_to_bytes(const BlockHash& h);

// A hash scheme given as pagedkv.HashScheme or its name ("sha256", ...).
HashScheme scheme_from(py::handle obj);

// A new numpy array owning `v` (no copy: the vector moves into a capsule the array holds).
template <class T>
py::array_t<T> array_owning(std::vector<T>&& v, std::vector<py::ssize_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(shape, heap->data(), owner);
}

// A new numpy array holding a copy of `s`.
template <class T>
py::array_t<T> array_copy(std::span<const T> s) {
  py::array_t<T> a(static_cast<py::ssize_t>(s.size()));
  if (!s.empty()) std::memcpy(a.mutable_data(), s.data(), s.size() * sizeof(T));
  return a;
}

// Registration, one per source file.
void bind_errors(py::module_& m);
void bind_hashing(py::module_& m);
void bind_manager(py::module_& m);
void bind_retention(py::module_& m);
void bind_device(py::module_& m);
void bind_tier(py::module_& m);
void bind_sched(py::module_& m);
void bind_publisher(py::module_& m);  // only with PAGEDKV_PYTHON_HAS_EVENTS

}  // namespace pagedkv::python
