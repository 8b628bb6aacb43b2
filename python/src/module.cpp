// python/src/module.cpp: the pagedkv._pagedkv extension module, its error type and argument
// conversions. See common.hpp for the conventions.
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "common.hpp"
#include "pagedkv/base/version.hpp"

namespace pagedkv::python {

namespace {

// The pagedkv.Error type object, created once per interpreter when the module is imported (an
// extension module's type, like every pybind11 exception type; the library keeps no state).
PyObject* g_error_type = nullptr;

[[noreturn]] void bad_argument(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, message);
}

std::string at_index(std::size_t i) {
  return " at index " + std::to_string(i);
}

// numpy's bool scalar (numpy.bool_, numpy.bool in numpy 2) implements __index__ in numpy 1.x.
bool is_bool(PyObject* o) {
  if (PyBool_Check(o)) return true;
  const char* name = Py_TYPE(o)->tp_name;
  return std::strcmp(name, "numpy.bool_") == 0 || std::strcmp(name, "numpy.bool") == 0;
}

// One Python integer (int, numpy integer or any __index__ but bool) as int64 (negative) or
// uint64 (non-negative); false for anything else (float, bool, str, ...).
struct Wide {
  bool negative = false;
  std::int64_t i = 0;   // when negative
  std::uint64_t u = 0;  // when not
};

bool read_integer(PyObject* o, Wide& out, bool& too_big) {
  too_big = false;
  if (is_bool(o) || !PyIndex_Check(o)) return false;
  py::object n = py::reinterpret_steal<py::object>(PyNumber_Index(o));
  if (!n) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(n.ptr(), &overflow);
  if (overflow == 0) {
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    out.negative = v < 0;
    out.i = v;
    out.u = static_cast<std::uint64_t>(v);
    return true;
  }
  if (overflow > 0) {
    const unsigned long long u = PyLong_AsUnsignedLongLong(n.ptr());
    if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      too_big = true;
      return true;
    }
    out.negative = false;
    out.u = u;
    return true;
  }
  too_big = true;  // below INT64_MIN
  out.negative = true;
  return true;
}

// A 1-D array with an integer dtype, or a numpy conversion of `obj` that is one.
py::array integer_ndarray(py::handle obj, const char* what) {
  py::array a = py::array::ensure(obj);
  if (!a) {
    PyErr_Clear();
    bad_argument(std::string(what) + ": expected a 1-D sequence of integers");
  }
  if (a.ndim() != 1) {
    bad_argument(std::string(what) + ": expected a 1-D sequence of integers, got " +
                 std::to_string(a.ndim()) + " dimensions");
  }
  const char kind = a.dtype().kind();
  // An empty Python sequence arrives as float64: accept it, it holds no values.
  if (kind != 'i' && kind != 'u' && a.size() != 0) {
    bad_argument(std::string(what) + ": expected integers, got numpy dtype '" +
                 py::str(a.dtype()).cast<std::string>() +
                 "' (floats and bools are refused, never truncated)");
  }
  return a;
}

// w as a T within [lo, hi]; false when it is not.
template <class T>
bool narrow(const Wide& w, T lo, T hi, T& out) {
  if constexpr (std::is_signed_v<T>) {
    if (!w.negative && w.u > static_cast<std::uint64_t>(std::numeric_limits<T>::max())) {
      return false;
    }
    out = w.negative ? w.i : static_cast<T>(w.u);
  } else {
    if (w.negative) return false;
    out = w.u;
  }
  return out >= lo && out <= hi;
}

template <class T>
std::string range_text(const Wide& w, T lo, T hi) {
  return (w.negative ? std::to_string(w.i) : std::to_string(w.u)) +
         (w.negative && lo >= 0
              ? " is negative"
              : " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

std::string refused_type(PyObject* o) {
  return std::string("expected integers, got ") + Py_TYPE(o)->tp_name +
         " (floats and bools are refused, never truncated)";
}

// See common.hpp (checked integer arguments).
template <class T>
std::vector<T> checked_integers(py::handle obj, const char* what, T lo, T hi) {
  static_assert(std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t>);
  std::vector<T> out;
  const auto put = [&](const Wide& w, std::size_t i) {
    T v{};
    if (!narrow(w, lo, hi, v)) {
      bad_argument(std::string(what) + ": value " + range_text(w, lo, hi) + at_index(i));
    }
    out.push_back(v);
  };
  if (!py::isinstance<py::array>(obj) && (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr()))) {
    // Element by element: numpy would make [True, 2] int64 and [2**63, 1] float64.
    out.reserve(static_cast<std::size_t>(PySequence_Fast_GET_SIZE(obj.ptr())));
    // An item's __index__ may change the list: the size is read again and the item held.
    for (std::size_t i = 0; i < static_cast<std::size_t>(PySequence_Fast_GET_SIZE(obj.ptr()));
         ++i) {
      const py::object held = py::reinterpret_borrow<py::object>(
          PySequence_Fast_GET_ITEM(obj.ptr(), static_cast<py::ssize_t>(i)));
      PyObject* item = held.ptr();
      Wide w;
      bool too_big = false;
      if (!read_integer(item, w, too_big)) {
        bad_argument(std::string(what) + ": " + refused_type(item) + at_index(i));
      }
      if (too_big) {
        bad_argument(std::string(what) + ": value " + py::repr(item).cast<std::string>() +
                     at_index(i) + " does not fit in 64 bits");
      }
      put(w, i);
    }
    return out;
  }
  const py::array a = integer_ndarray(obj, what);
  const auto n = static_cast<std::size_t>(a.size());
  out.reserve(n);
  if (n == 0) return out;
  if (a.dtype().kind() == 'u') {  // widened to uint64 (never narrowed)
    const auto u = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    for (std::size_t i = 0; i < n; ++i) put(Wide{false, 0, u.data()[i]}, i);
  } else {  // widened to int64
    const auto v = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t x = v.data()[i];
      put(Wide{x < 0, x, static_cast<std::uint64_t>(x)}, i);
    }
  }
  return out;
}

template <class T>
T checked_integer(py::handle obj, const char* what, T lo, T hi) {
  Wide w;
  bool too_big = false;
  if (!read_integer(obj.ptr(), w, too_big)) {
    bad_argument(std::string(what) + ": expected an integer, got " + Py_TYPE(obj.ptr())->tp_name +
                 " (floats and bools are refused, never truncated)");
  }
  T v{};
  if (too_big || !narrow(w, lo, hi, v)) {
    bad_argument(std::string(what) + ": " +
                 (too_big ? py::repr(obj).cast<std::string>() + " does not fit in 64 bits"
                          : range_text(w, lo, hi)));
  }
  return v;
}

}  // namespace

TokenView::TokenView(py::handle obj, const char* what) {
  if (py::isinstance<py::array_t<TokenId>>(obj)) {
    auto a = py::reinterpret_borrow<py::array_t<TokenId>>(obj);
    if (a.ndim() == 1 && (a.flags() & py::array::c_style)) {
      keep_ = a;
      span_ = std::span<const TokenId>(a.data(), static_cast<std::size_t>(a.shape(0)));
      return;
    }
  }
  // Negative ids are the library's to refuse (Request, BlockHasher), as for int32 input.
  const std::vector<std::int64_t> v = to_int64_vector(
      obj, what, std::numeric_limits<TokenId>::min(), std::numeric_limits<TokenId>::max());
  scratch_.assign(v.begin(), v.end());  // every value fits (checked)
  span_ = scratch_;
}

std::vector<std::int64_t> to_int64_vector(py::handle obj, const char* what, std::int64_t lo,
                                          std::int64_t hi) {
  return checked_integers<std::int64_t>(obj, what, lo, hi);
}

std::vector<std::uint64_t> to_uint64_vector(py::handle obj, const char* what) {
  return checked_integers<std::uint64_t>(obj, what, 0, std::numeric_limits<std::uint64_t>::max());
}

std::int64_t to_int64(py::handle obj, const char* what, std::int64_t lo, std::int64_t hi) {
  return checked_integer<std::int64_t>(obj, what, lo, hi);
}

std::uint64_t to_uint64(py::handle obj, const char* what, std::uint64_t hi) {
  return checked_integer<std::uint64_t>(obj, what, 0, hi);
}

BlockHash hash_from_bytes(py::handle obj, const char* what) {
  if (!py::isinstance<py::bytes>(obj)) {
    bad_argument(std::string(what) + ": expected bytes (a 16- or 32-byte digest)");
  }
  const std::string s = py::reinterpret_borrow<py::bytes>(obj);
  return BlockHash(
      std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size()));
}

py::bytes hash_to_bytes(const BlockHash& h) {
  const auto b = h.bytes();
  return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

HashScheme scheme_from(py::handle obj) {
  if (py::isinstance<py::str>(obj)) return parse_hash_scheme(obj.cast<std::string>());
  try {
    return obj.cast<HashScheme>();
  } catch (const py::cast_error&) {
    bad_argument(
        "hash scheme: expected pagedkv.HashScheme or one of 'sha256', "
        "'sha256_cbor_vllm', 'xxh3_128'");
  }
}

void bind_errors(py::module_& m) {
  py::enum_<ErrorCode>(m, "ErrorCode", "What kind of misuse a pagedkv.Error reports.")
      .value("INVALID_ARGUMENT", ErrorCode::kInvalidArgument)
      .value("OUT_OF_RANGE", ErrorCode::kOutOfRange)
      .value("NOT_FOUND", ErrorCode::kNotFound)
      .value("INVALID_STATE", ErrorCode::kInvalidState)
      .value("PARSE_ERROR", ErrorCode::kParseError);

  py::dict attrs;
  attrs["code"] = py::none();
  g_error_type = PyErr_NewExceptionWithDoc(
      "pagedkv.Error",
      "Misuse of pagedkv (bad argument, unknown id, double free, ...). Raised before any state "
      "changes; .code is a pagedkv.ErrorCode, str(e) the library's message.",
      PyExc_RuntimeError, attrs.ptr());
  if (g_error_type == nullptr) throw py::error_already_set();
  m.add_object("Error", py::handle(g_error_type));

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object type = py::reinterpret_borrow<py::object>(g_error_type);
      py::object exc = type(py::str(e.what()));
      exc.attr("code") = py::cast(e.code());
      PyErr_SetObject(g_error_type, exc.ptr());
    }
  });
}

}  // namespace pagedkv::python

PYBIND11_MODULE(_pagedkv, m) {
  namespace pp = pagedkv::python;
  m.doc() = "pagedkv: paged KV cache with automatic prefix caching (vLLM v1 semantics).";
  m.attr("__version__") = std::string(pagedkv::version());
  pp::bind_errors(m);
  pp::bind_hashing(m);
  pp::bind_retention(m);
  pp::bind_manager(m);
  pp::bind_device(m);
  pp::bind_tier(m);
  pp::bind_sched(m);
#ifdef PAGEDKV_PYTHON_HAS_EVENTS
  pp::bind_publisher(m);
  m.attr("HAS_EVENTS") = true;
#else
  m.attr("HAS_EVENTS") = false;
#endif
}
