// python/src/module.cpp: the pagedkv._pagedkv extension module, its error type and argument
// conversions. See common.hpp for the conventions.
#include <limits>
#include <string>

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

py::array as_1d_integer_array(py::handle obj, const char* what) {
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
  // An empty Python list arrives as float64: accept it, it holds no values.
  if (kind != 'i' && kind != 'u' && a.size() != 0) {
    bad_argument(std::string(what) + ": expected integers, got numpy dtype kind '" +
                 std::string(1, kind) + "'");
  }
  return a;
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
  py::array a = as_1d_integer_array(obj, what);
  const auto values = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(
      a.dtype().kind() == 'u' ? a.attr("astype")("int64", py::arg("casting") = "unsafe") : a);
  const bool unsigned_input = a.dtype().kind() == 'u' && a.dtype().itemsize() == 8;
  scratch_.resize(static_cast<std::size_t>(values.size()));
  const std::int64_t* p = values.data();
  for (std::size_t i = 0; i < scratch_.size(); ++i) {
    // uint64 values above INT64_MAX wrap to negative here; they are out of range either way.
    if (p[i] > std::numeric_limits<TokenId>::max() || (unsigned_input && p[i] < 0)) {
      bad_argument(std::string(what) + ": token id at index " + std::to_string(i) +
                   " does not fit in 32 bits");
    }
    if (p[i] < std::numeric_limits<TokenId>::min()) {
      bad_argument(std::string(what) + ": token id " + std::to_string(p[i]) + " at index " +
                   std::to_string(i) + " is negative");
    }
    scratch_[i] = static_cast<TokenId>(p[i]);
  }
  span_ = scratch_;
}

std::vector<std::int64_t> to_int64_vector(py::handle obj, const char* what) {
  py::array a = as_1d_integer_array(obj, what);
  if (a.dtype().kind() == 'u' && a.dtype().itemsize() == 8) {
    const auto u = py::array_t<std::uint64_t, py::array::c_style>::ensure(a);
    for (py::ssize_t i = 0; i < u.size(); ++i) {
      if (u.data()[i] > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        bad_argument(std::string(what) + ": value at index " + std::to_string(i) +
                     " does not fit in 64 bits");
      }
    }
  }
  const auto v = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
  return std::vector<std::int64_t>(v.data(), v.data() + v.size());
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
  pp::bind_manager(m);
  pp::bind_device(m);
  pp::bind_tier(m);
#ifdef PAGEDKV_PYTHON_HAS_EVENTS
  pp::bind_publisher(m);
  m.attr("HAS_EVENTS") = true;
#else
  m.attr("HAS_EVENTS") = false;
#endif
}
