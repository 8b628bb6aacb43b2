// python/src/device.cpp: block tables and slot mappings as numpy arrays (device/block_table.hpp),
// and the KV cache's sizing and FP8 facts (device/kv_dtype.hpp, kv_layout.hpp, fp8.hpp): KVDtype,
// KVScaleMode, KVCacheSpec, kv_bytes_per_token / kv_bytes_per_block / num_blocks_for_budget, and
// fp8.hpp's conversions over numpy arrays (the same bytes as the C++ functions, which they call).
// Results are arrays that own the library's output vectors (moved in, never copied).
#include <string>
#include <vector>

#include "common.hpp"
#include "pagedkv/device/block_table.hpp"
#include "pagedkv/device/fp8.hpp"
#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/device/kv_layout.hpp"

namespace pagedkv::python {

namespace {

std::vector<std::int32_t> int32_vector(py::handle obj, const char* what) {
  std::vector<std::int32_t> out;
  for (const std::int64_t v : to_int64_vector(obj, what)) {
    if (v < std::numeric_limits<std::int32_t>::min() ||
        v > std::numeric_limits<std::int32_t>::max()) {
      throw Error(ErrorCode::kOutOfRange,
                  std::string(what) + ": " + std::to_string(v) + " does not fit in 32 bits");
    }
    out.push_back(static_cast<std::int32_t>(v));
  }
  return out;
}

[[noreturn]] void refuse(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, message);
}

// A KVDtype given as pagedkv.KVDtype or its name ("bf16", "fp8_e4m3", ...).
KVDtype dtype_from(py::handle obj, const char* what) {
  if (py::isinstance<py::str>(obj)) {
    KVDtype d{};
    const auto name = obj.cast<std::string>();
    if (!parse_kv_dtype(name, d)) {
      refuse(std::string(what) + ": unknown KV dtype '" + name +
             "' (expected fp16, bf16, fp8_e4m3 or fp8_e5m2)");
    }
    return d;
  }
  try {
    return obj.cast<KVDtype>();
  } catch (const py::cast_error&) {
    refuse(std::string(what) + ": expected pagedkv.KVDtype or its name");
  }
}

KVScaleMode scale_mode_from(py::handle obj, const char* what) {
  if (py::isinstance<py::str>(obj)) {
    KVScaleMode mode{};
    const auto name = obj.cast<std::string>();
    if (!parse_kv_scale_mode(name, mode)) {
      refuse(std::string(what) + ": unknown KV scale mode '" + name +
             "' (expected none, per_tensor or per_token_head)");
    }
    return mode;
  }
  try {
    return obj.cast<KVScaleMode>();
  } catch (const py::cast_error&) {
    refuse(std::string(what) + ": expected pagedkv.KVScaleMode or its name");
  }
}

// The FP8 format of a dtype argument; 16-bit dtypes are refused.
Fp8Format fp8_format_from(py::handle obj, const char* what) {
  const KVDtype d = dtype_from(obj, what);
  if (!is_fp8(d)) {
    refuse(std::string(what) + ": expected an FP8 dtype (fp8_e4m3 or fp8_e5m2), got " +
           std::string(to_string(d)));
  }
  return d == KVDtype::kFp8E5M2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3;
}

std::int32_t int32_arg(py::handle obj, const char* what) {
  return static_cast<std::int32_t>(to_int64(obj, what, std::numeric_limits<std::int32_t>::min(),
                                            std::numeric_limits<std::int32_t>::max()));
}

// A float32 scale: a Python or numpy real number, never a bool (check_fp8_scale checks its
// value).
float scale_arg(py::handle obj, const char* what) {
  if (PyBool_Check(obj.ptr()) || py::isinstance(obj, py::module_::import("numpy").attr("bool_")) ||
      !(PyFloat_Check(obj.ptr()) || PyLong_Check(obj.ptr()) ||
        py::isinstance(obj, py::module_::import("numpy").attr("number")))) {
    refuse(std::string(what) + ": expected a real number, got " + Py_TYPE(obj.ptr())->tp_name);
  }
  const auto scale = static_cast<float>(obj.cast<double>());
  check_fp8_scale(scale, what);
  return scale;
}

// Real values as a C-contiguous float32 array of any shape (rounded to float32 first, as the C++
// functions take floats). numpy float and integer arrays are converted; bool, complex, string and
// object arrays, and sequences holding a bool, are refused.
py::array_t<float> float_values(py::handle obj, const char* what) {
  if (!py::isinstance<py::array>(obj) && (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr()))) {
    for (py::handle item : obj) {
      if (PyBool_Check(item.ptr())) refuse(std::string(what) + ": bools are refused");
    }
  }
  py::array a = py::array::ensure(obj);
  if (!a) {
    PyErr_Clear();
    refuse(std::string(what) + ": expected an array of real numbers");
  }
  const char kind = a.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u' && a.size() != 0) {
    refuse(std::string(what) + ": expected real numbers, got numpy dtype '" +
           py::str(a.dtype()).cast<std::string>() + "' (bools are refused)");
  }
  return py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
}

// FP8 codes: a numpy integer array of any shape (uint8 is read as is; others are checked to lie in
// 0..255) or a 1-D sequence of ints; floats and bools are refused, never truncated.
py::array_t<std::uint8_t> fp8_codes(py::handle obj, const char* what) {
  if (py::isinstance<py::array>(obj)) {
    auto a = py::reinterpret_borrow<py::array>(obj);
    if (a.dtype().kind() == 'u' && a.itemsize() == 1) {
      return py::array_t<std::uint8_t, py::array::c_style | py::array::forcecast>::ensure(a);
    }
    std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
    auto v = to_int64_vector(a.attr("reshape")(-1), what, 0, 255);
    std::vector<std::uint8_t> codes(v.begin(), v.end());
    return array_owning(std::move(codes), std::move(shape));
  }
  auto v = to_int64_vector(obj, what, 0, 255);
  std::vector<std::uint8_t> codes(v.begin(), v.end());
  const auto n = static_cast<py::ssize_t>(codes.size());
  return array_owning(std::move(codes), {n});
}

std::vector<py::ssize_t> shape_of(const py::array& a) {
  return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

// Element counts from which a conversion releases the GIL while it runs (below it the release
// and re-acquire cost more than the loop).
constexpr std::size_t kReleaseGilFrom = std::size_t{1} << 14;

// f is applied with the GIL released for large arrays: it touches only the two buffers, which
// `in` and `out` keep alive (another Python thread writing into `in` meanwhile races, as with
// numpy's own ufuncs).
template <class Out, class In, class F>
py::array_t<Out> map_array(const py::array_t<In>& in, F f) {
  std::vector<Out> out(static_cast<std::size_t>(in.size()));
  const In* src = in.data();
  const auto loop = [&] {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = f(src[i]);
  };
  if (out.size() >= kReleaseGilFrom) {
    py::gil_scoped_release nogil;
    loop();
  } else {
    loop();
  }
  return array_owning(std::move(out), shape_of(in));
}

std::string describe(const KVCacheSpec& s) {
  return "KVCacheSpec(num_layers=" + std::to_string(s.num_layers) +
         ", num_kv_heads=" + std::to_string(s.num_kv_heads) +
         ", head_dim=" + std::to_string(s.head_dim) + ", dtype='" +
         std::string(to_string(s.dtype)) + "', scale_mode='" +
         std::string(to_string(s.scale_mode)) + "')";
}

void bind_kv_format(py::module_& m) {
  py::enum_<KVDtype>(m, "KVDtype",
                     "Element type of the KV cache (docs/fp8.md); values as in the tiers' header.")
      .value("FLOAT16", KVDtype::kFloat16)
      .value("BFLOAT16", KVDtype::kBFloat16)
      .value("FP8_E4M3", KVDtype::kFp8E4M3)
      .value("FP8_E5M2", KVDtype::kFp8E5M2)
      .def_property_readonly("dtype_name", [](KVDtype d) { return std::string(to_string(d)); })
      .def_property_readonly("is_fp8", [](KVDtype d) { return is_fp8(d); })
      .def_property_readonly("bytes_per_value", [](KVDtype d) { return bytes_per_value(d); });
  py::enum_<KVScaleMode>(m, "KVScaleMode", "How an FP8 cache's values are scaled (docs/fp8.md).")
      .value("NONE", KVScaleMode::kNone)
      .value("PER_TENSOR", KVScaleMode::kPerTensor)
      .value("PER_TOKEN_HEAD", KVScaleMode::kPerTokenHead)
      .def_property_readonly("mode_name", [](KVScaleMode s) { return std::string(to_string(s)); });

  py::class_<KVCacheSpec>(m, "KVCacheSpec",
                          "The per-model facts that decide KV-cache size; immutable, validated "
                          "on construction.")
      .def(py::init([](py::object num_layers, py::object num_kv_heads, py::object head_dim,
                       py::object dtype, py::object scale_mode) {
             KVCacheSpec s;
             s.num_layers = int32_arg(num_layers, "KVCacheSpec: num_layers");
             s.num_kv_heads = int32_arg(num_kv_heads, "KVCacheSpec: num_kv_heads");
             s.head_dim = int32_arg(head_dim, "KVCacheSpec: head_dim");
             s.dtype = dtype_from(dtype, "KVCacheSpec: dtype");
             s.scale_mode = scale_mode_from(scale_mode, "KVCacheSpec: scale_mode");
             s.validate();
             return s;
           }),
           py::arg("num_layers"), py::arg("num_kv_heads"), py::arg("head_dim"),
           py::arg("dtype") = "bf16", py::arg("scale_mode") = "none")
      .def_readonly("num_layers", &KVCacheSpec::num_layers)
      .def_readonly("num_kv_heads", &KVCacheSpec::num_kv_heads)
      .def_readonly("head_dim", &KVCacheSpec::head_dim)
      .def_readonly("dtype", &KVCacheSpec::dtype)
      .def_readonly("scale_mode", &KVCacheSpec::scale_mode)
      .def("__eq__",
           [](const KVCacheSpec& a, const KVCacheSpec& b) {
             return a.num_layers == b.num_layers && a.num_kv_heads == b.num_kv_heads &&
                    a.head_dim == b.head_dim && a.dtype == b.dtype && a.scale_mode == b.scale_mode;
           })
      .def("__repr__", &describe);

  m.def("kv_bytes_per_token", &kv_bytes_per_token, py::arg("spec"),
        "2 x layers x kv_heads x (head_dim x bytes per value + 4 for a per-(token, head) scale).");
  m.def(
      "kv_bytes_per_block",
      [](const KVCacheSpec& spec, py::object block_size) {
        return kv_bytes_per_block(spec, int32_arg(block_size, "kv_bytes_per_block: block_size"));
      },
      py::arg("spec"), py::arg("block_size"),
      "Bytes one block id stands for over all layers (per-(token, head) scales and the 16-byte "
      "padding of each block included).");
  m.def(
      "num_blocks_for_budget",
      [](const KVCacheSpec& spec, py::object block_size, py::object budget_bytes) {
        return num_blocks_for_budget(spec,
                                     int32_arg(block_size, "num_blocks_for_budget: block_size"),
                                     to_int64(budget_bytes, "num_blocks_for_budget: budget_bytes"));
      },
      py::arg("spec"), py::arg("block_size"), py::arg("budget_bytes"),
      "How many blocks fit in budget_bytes (rounded down; the null block is one of them).");

  // ---- FP8 conversions (fp8.hpp) ----
  m.def(
      "float_to_fp8_bits",
      [](py::object values, py::object dtype) {
        const Fp8Format f = fp8_format_from(dtype, "float_to_fp8_bits: dtype");
        const auto in = float_values(values, "float_to_fp8_bits: values");
        return map_array<std::uint8_t>(in, [f](float x) { return float_to_fp8_bits(f, x); });
      },
      py::arg("values"), py::arg("dtype"),
      "uint8 FP8 codes of float32 values (round to nearest even, saturating, NaN -> 0x7f).");
  m.def(
      "fp8_bits_to_float",
      [](py::object codes, py::object dtype) {
        const Fp8Format f = fp8_format_from(dtype, "fp8_bits_to_float: dtype");
        const auto in = fp8_codes(codes, "fp8_bits_to_float: codes");
        return map_array<float>(in, [f](std::uint8_t c) { return fp8_bits_to_float(f, c); });
      },
      py::arg("codes"), py::arg("dtype"), "The exact float32 values of FP8 codes.");
  m.def(
      "quantize_fp8",
      [](py::object values, py::object dtype, py::object scale) {
        const Fp8Format f = fp8_format_from(dtype, "quantize_fp8: dtype");
        const float s = scale_arg(scale, "quantize_fp8: scale");
        const auto in = float_values(values, "quantize_fp8: values");
        return map_array<std::uint8_t>(in, [f, s](float x) { return quantize_fp8(f, x, s); });
      },
      py::arg("values"), py::arg("dtype"), py::arg("scale"),
      "Per-tensor quantization (kv_append with k_scale / v_scale): codes of values / scale.");
  m.def(
      "dequantize_fp8",
      [](py::object codes, py::object dtype, py::object scale) {
        const Fp8Format f = fp8_format_from(dtype, "dequantize_fp8: dtype");
        const float s = scale_arg(scale, "dequantize_fp8: scale");
        const auto in = fp8_codes(codes, "dequantize_fp8: codes");
        return map_array<float>(in, [f, s](std::uint8_t c) { return dequantize_fp8(f, c, s); });
      },
      py::arg("codes"), py::arg("dtype"), py::arg("scale"),
      "float32 decode(code) x scale, as the kernels dequantize.");
  m.def(
      "quantize_fp8_rows",
      [](py::object values, py::object dtype) {
        const Fp8Format f = fp8_format_from(dtype, "quantize_fp8_rows: dtype");
        const auto in = float_values(values, "quantize_fp8_rows: values");
        if (in.ndim() == 0) refuse("quantize_fp8_rows: values must have at least one dimension");
        const auto row = static_cast<std::size_t>(in.shape(in.ndim() - 1));
        std::size_t rows = 1;
        for (py::ssize_t i = 0; i + 1 < in.ndim(); ++i) {
          rows *= static_cast<std::size_t>(in.shape(i));
        }
        std::vector<std::uint8_t> codes(static_cast<std::size_t>(in.size()));
        std::vector<float> scales(rows);
        const float* src = in.data();
        const auto loop = [&] {
          for (std::size_t r = 0; r < rows; ++r) {
            scales[r] = quantize_fp8_row(f, src + r * row, row, codes.data() + r * row);
          }
        };
        if (codes.size() >= kReleaseGilFrom) {
          py::gil_scoped_release nogil;
          loop();
        } else {
          loop();
        }
        std::vector<py::ssize_t> scale_shape(in.shape(), in.shape() + in.ndim() - 1);
        return py::make_tuple(array_owning(std::move(codes), shape_of(in)),
                              array_owning(std::move(scales), std::move(scale_shape)));
      },
      py::arg("values"), py::arg("dtype"),
      "Per-(token, KV head) quantization along the last axis, as kv_append does: (uint8 codes of "
      "the same shape, float32 scales of shape values.shape[:-1]).");
}

}  // namespace

void bind_device(py::module_& m) {
  bind_kv_format(m);
  m.attr("SKIP_SLOT") = kSkipSlot;
  m.def(
      "make_block_table",
      [](py::object seq_block_ids, py::handle max_blocks_per_seq, py::handle pad_block_id) {
        std::vector<std::vector<std::int32_t>> rows;
        for (py::handle r : seq_block_ids) rows.push_back(int32_vector(r, "make_block_table"));
        BlockTable t = make_block_table(
            rows,
            to_integer<std::int32_t>(max_blocks_per_seq, "make_block_table: max_blocks_per_seq"),
            to_integer<std::int32_t>(pad_block_id, "make_block_table: pad_block_id"));
        return array_owning(std::move(t.block_ids), {t.num_seqs, t.max_blocks_per_seq});
      },
      py::arg("seq_block_ids"), py::arg("max_blocks_per_seq") = 0, py::arg("pad_block_id") = 0,
      "Dense int32 [num_seqs, max_blocks_per_seq] block table from each sequence's block ids.");
  m.def(
      "slot_of",
      [](py::object block_ids, py::handle block_size, py::handle position) {
        const auto ids = int32_vector(block_ids, "slot_of");
        return slot_of(ids, to_integer<std::int32_t>(block_size, "slot_of: block_size"),
                       to_integer<std::int64_t>(position, "slot_of: position"));
      },
      py::arg("block_ids"), py::arg("block_size"), py::arg("position"),
      "The slot (block_id * block_size + offset) of one token of a sequence.");
  m.def(
      "slot_mapping",
      [](py::object block_ids, py::handle block_size, py::handle first_position,
         py::handle num_tokens) {
        const auto ids = int32_vector(block_ids, "slot_mapping");
        const auto bs = to_integer<std::int32_t>(block_size, "slot_mapping: block_size");
        const auto first = to_integer<std::int64_t>(first_position, "slot_mapping: first_position");
        const auto n = to_integer<std::int64_t>(num_tokens, "slot_mapping: num_tokens");
        std::vector<std::int64_t> slots;
        append_slot_mapping(slots, ids, bs, first, n);
        const auto len = static_cast<py::ssize_t>(slots.size());
        return array_owning(std::move(slots), {len});
      },
      py::arg("block_ids"), py::arg("block_size"), py::arg("first_position"), py::arg("num_tokens"),
      "int64 slots of tokens [first_position, first_position + num_tokens).");
  m.def(
      "validate_block_table",
      [](py::object table_obj, py::object seq_lens, py::handle block_size_obj,
         py::handle num_blocks_obj) {
        const auto block_size =
            to_integer<std::int32_t>(block_size_obj, "validate_block_table: block_size");
        const auto num_blocks =
            to_integer<std::int64_t>(num_blocks_obj, "validate_block_table: num_blocks");
        // 2-D: a C-contiguous int32 array is read in place; any other integer table is checked
        // row-major through the 1-D conversion (no float, bool or out-of-range entry).
        py::array table = py::array::ensure(table_obj);
        if (!table || table.ndim() != 2) {
          PyErr_Clear();
          throw Error(ErrorCode::kInvalidArgument,
                      "validate_block_table: table must be a 2-D integer array");
        }
        std::vector<std::int32_t> converted;
        std::span<const std::int32_t> cells;
        if (py::isinstance<py::array_t<std::int32_t>>(table) &&
            (table.flags() & py::array::c_style)) {
          cells = std::span<const std::int32_t>(static_cast<const std::int32_t*>(table.data()),
                                                static_cast<std::size_t>(table.size()));
        } else {
          converted = int32_vector(table.attr("reshape")(-1), "validate_block_table: table");
          cells = converted;
        }
        const auto lens = int32_vector(seq_lens, "validate_block_table: seq_lens");
        validate_block_table(cells, static_cast<std::int32_t>(table.shape(0)),
                             static_cast<std::int32_t>(table.shape(1)), lens, block_size,
                             num_blocks);
      },
      py::arg("table"), py::arg("seq_lens"), py::arg("block_size"), py::arg("num_blocks"),
      "Raises pagedkv.Error when a sequence's blocks fall outside its row or the pool.");
}

}  // namespace pagedkv::python
