// A failing GPU extend-attention case, saved for study without the GPU: the case's shape and seed
// (testing::make_extend_problem regenerates its inputs and reference exactly), the kernel variant
// and plan, and the output and log-sum-exp the GPU wrote. The GPU tests write one when their
// per-row check fails and the environment names a folder (kDumpDirVariable; scripts/gpu-check run
// sets it and brings the folder back as dumps.tgz); tests/reference/extend_dump_inspect.cpp reads
// one, recomputes the reference on the CPU and prints the check and its fingerprint
// (attention_fingerprint.hpp).
//
// File: text lines "key value" (the shape's float fields as hexadecimal floats, exact), a line
// "data", then the output as little-endian uint16 (dtype bits) and the log-sum-exp as
// little-endian float32, their counts given in the header. read_extend_dump checks every field
// and count and throws std::runtime_error naming what is wrong.
//
// Host-only, header-only test code; checked by tests/reference/attention_fingerprint_test.cpp.
#pragma once

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <istream>
#include <limits>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attention_fingerprint.hpp"
#include "kv_test_util.hpp"

namespace pagedkv::testing {

static_assert(std::endian::native == std::endian::little, "dumps are written little-endian");

// The environment variable naming the folder failing cases are written to (tests only).
inline constexpr const char* kDumpDirVariable = "PAGEDKV_TEST_DUMP_DIR";
// At most this many dumps per test process, each with at most this many output bytes (a larger
// case is named in the failure message, not written).
inline constexpr int kMaxDumpsPerProcess = 4;
inline constexpr std::size_t kMaxDumpOutputBytes = std::size_t{4} << 20;

struct ExtendDump {
  std::string test;  // e.g. CudaExtendAttention.SlidingWindowAndSoftCap/Wgmma
  std::string plan;  // free text: kernel, splits, persistent CTAs
  ExtendShape shape;
  std::uint64_t seed = 0;
  std::vector<std::uint16_t> out;  // [num_q_tokens, num_q_heads, head_dim] dtype bits
  std::vector<float> lse;          // [num_q_tokens, num_q_heads] (empty: not written)
};

namespace detail {

// One line of at most kMaxDumpLine characters (false at the end of the file or past the limit,
// which `too_long` then says).
inline constexpr std::size_t kMaxDumpLine = 4096;
inline bool read_line(std::istream& f, std::string& line, bool& too_long) {
  line.clear();
  too_long = false;
  for (int c = f.get(); c != std::char_traits<char>::eof(); c = f.get()) {
    if (c == '\n') return true;
    if (line.size() == kMaxDumpLine) {
      too_long = true;
      return false;
    }
    line.push_back(static_cast<char>(c));
  }
  return !line.empty();
}

inline std::string hex_float(float x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", static_cast<double>(x));
  return buf;
}

inline std::string join(const std::vector<std::int32_t>& v) {
  // A stream, not string concatenation: GCC 12 at -O3 reports a false -Wstringop-overflow on
  // `"," + std::to_string(...)` (as describe() in kv_test_util.hpp notes).
  std::ostringstream s;
  for (std::size_t i = 0; i < v.size(); ++i) s << (i > 0 ? "," : "") << v[i];
  return s.str();
}

[[noreturn]] inline void dump_error(const std::string& path, const std::string& what) {
  throw std::runtime_error("extend dump " + path + ": " + what);
}

inline std::int64_t parse_int(const std::string& path, const std::string& key,
                              const std::string& text, std::int64_t lo, std::int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const bool digits_first = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) ||
                                              (text[0] == '-' && text.size() > 1));
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (!digits_first || end != text.c_str() + text.size() || errno != 0 || v < lo || v > hi) {
    dump_error(path, key + " must be an integer in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "], got '" + text + "'");
  }
  return v;
}

inline float parse_float(const std::string& path, const std::string& key, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(v) ||
      v < 0 || v > 1e6) {
    dump_error(path, key + " must be a finite number in [0, 1e6], got '" + text + "'");
  }
  return static_cast<float>(v);
}

inline std::vector<std::int32_t> parse_list(const std::string& path, const std::string& key,
                                            const std::string& text, std::size_t count) {
  std::vector<std::int32_t> v;
  std::size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    v.push_back(static_cast<std::int32_t>(
        parse_int(path, key, text.substr(start, comma - start), 0, 1 << 20)));
    start = comma + 1;
  }
  if (v.size() != count) {
    dump_error(path, key + " must list " + std::to_string(count) + " values, got " +
                         std::to_string(v.size()));
  }
  return v;
}

}  // namespace detail

// The number of log-sum-exp values (one per new token and query head) and output values of
// `shape`'s problem.
inline std::size_t extend_lse_values(const ExtendShape& shape) {
  std::size_t tokens = 0;
  for (const std::int32_t n : shape.q_lens) tokens += static_cast<std::size_t>(n);
  return tokens * static_cast<std::size_t>(shape.cache.num_q_heads);
}
inline std::size_t extend_output_values(const ExtendShape& shape) {
  return extend_lse_values(shape) * static_cast<std::size_t>(shape.cache.head_dim);
}

// Writes `d` to `path` (overwritten); throws std::runtime_error when it cannot.
inline void write_extend_dump(const std::string& path, const ExtendDump& d) {
  const DecodeShape& c = d.shape.cache;
  if (d.out.size() != extend_output_values(d.shape) ||
      (!d.lse.empty() && d.lse.size() != extend_lse_values(d.shape))) {
    detail::dump_error(path, "output or log-sum-exp size does not match the shape");
  }
  std::ostringstream h;
  h << "pagedkv-extend-dump 1\n";
  h << "test " << d.test << "\n";
  h << "plan " << d.plan << "\n";
  h << "seed " << d.seed << "\n";
  h << "dtype " << static_cast<int>(c.dtype) << "\n";
  h << "num_seqs " << c.num_seqs << "\n";
  h << "num_q_heads " << c.num_q_heads << "\n";
  h << "num_kv_heads " << c.num_kv_heads << "\n";
  h << "head_dim " << c.head_dim << "\n";
  h << "block_size " << c.block_size << "\n";
  h << "layout " << static_cast<int>(c.kind) << "\n";
  h << "window_size " << c.window_size << "\n";
  h << "soft_cap " << detail::hex_float(c.soft_cap) << "\n";
  h << "value_range " << detail::hex_float(c.value_range) << "\n";
  h << "shuffle_blocks " << (c.shuffle_blocks ? 1 : 0) << "\n";
  h << "extra_table_columns " << c.extra_table_columns << "\n";
  h << "extra_max_q_len " << d.shape.extra_max_q_len << "\n";
  h << "seq_lens " << detail::join(c.seq_lens) << "\n";
  h << "q_lens " << detail::join(d.shape.q_lens) << "\n";
  h << "out " << d.out.size() << "\n";
  h << "lse " << d.lse.size() << "\n";
  h << "data\n";
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  const std::string header = h.str();
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(d.out.data()),
          static_cast<std::streamsize>(d.out.size() * sizeof(std::uint16_t)));
  f.write(reinterpret_cast<const char*>(d.lse.data()),
          static_cast<std::streamsize>(d.lse.size() * sizeof(float)));
  f.close();
  if (!f) detail::dump_error(path, "could not be written");
}

// Reads a dump written by write_extend_dump; throws std::runtime_error naming the first problem
// (unknown format, a missing, repeated or out-of-range field, counts that do not match the shape,
// a short or long file).
inline ExtendDump read_extend_dump(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) detail::dump_error(path, "cannot be opened");
  std::string line;
  bool too_long = false;
  if (!detail::read_line(f, line, too_long) || line != "pagedkv-extend-dump 1") {
    detail::dump_error(path, "not an extend dump (first line '" + line.substr(0, 40) + "')");
  }
  std::vector<std::pair<std::string, std::string>> fields;
  bool data = false;
  while (detail::read_line(f, line, too_long)) {
    if (line == "data") {
      data = true;
      break;
    }
    const std::size_t space = line.find(' ');
    fields.emplace_back(line.substr(0, space),
                        space == std::string::npos ? std::string() : line.substr(space + 1));
    if (fields.size() > 64) detail::dump_error(path, "too many header lines");
  }
  if (too_long) detail::dump_error(path, "a header line is over 4096 characters");
  if (!data) detail::dump_error(path, "no 'data' line");
  const auto get = [&](const std::string& key) -> std::string {
    const std::string* found = nullptr;
    for (const auto& [k, v] : fields) {
      if (k != key) continue;
      if (found != nullptr) detail::dump_error(path, key + " given twice");
      found = &v;
    }
    if (found == nullptr) detail::dump_error(path, "no " + key + " line");
    return *found;
  };
  using detail::parse_int;
  ExtendDump d;
  d.test = get("test");
  d.plan = get("plan");
  const std::string seed = get("seed");
  errno = 0;
  char* end = nullptr;
  d.seed = std::strtoull(seed.c_str(), &end, 10);
  if (seed.empty() || !std::isdigit(static_cast<unsigned char>(seed[0])) ||
      end != seed.c_str() + seed.size() || errno != 0) {
    detail::dump_error(path, "seed must be an unsigned integer, got '" + seed + "'");
  }
  DecodeShape& c = d.shape.cache;
  const auto dtype = parse_int(path, "dtype", get("dtype"), 0, 255);
  if (dtype != static_cast<int>(KVDtype::kFloat16) &&
      dtype != static_cast<int>(KVDtype::kBFloat16)) {
    detail::dump_error(path, "dtype must be fp16 or bf16, got " + std::to_string(dtype));
  }
  c.dtype = static_cast<KVDtype>(dtype);
  c.num_seqs = static_cast<std::int32_t>(parse_int(path, "num_seqs", get("num_seqs"), 0, 4096));
  c.num_kv_heads =
      static_cast<std::int32_t>(parse_int(path, "num_kv_heads", get("num_kv_heads"), 1, 256));
  c.num_q_heads =
      static_cast<std::int32_t>(parse_int(path, "num_q_heads", get("num_q_heads"), 1, 4096));
  if (c.num_q_heads % c.num_kv_heads != 0) {
    detail::dump_error(path, "num_q_heads must be a multiple of num_kv_heads");
  }
  c.head_dim = static_cast<std::int32_t>(parse_int(path, "head_dim", get("head_dim"), 1, 1024));
  c.block_size =
      static_cast<std::int32_t>(parse_int(path, "block_size", get("block_size"), 1, 4096));
  c.kind = static_cast<LayoutKind>(parse_int(path, "layout", get("layout"), 0, 3));
  c.window_size =
      static_cast<std::int32_t>(parse_int(path, "window_size", get("window_size"), 0, 1 << 24));
  c.soft_cap = detail::parse_float(path, "soft_cap", get("soft_cap"));
  c.value_range = detail::parse_float(path, "value_range", get("value_range"));
  c.shuffle_blocks = parse_int(path, "shuffle_blocks", get("shuffle_blocks"), 0, 1) == 1;
  c.extra_table_columns = static_cast<std::int32_t>(
      parse_int(path, "extra_table_columns", get("extra_table_columns"), 0, 1024));
  d.shape.extra_max_q_len = static_cast<std::int32_t>(
      parse_int(path, "extra_max_q_len", get("extra_max_q_len"), 0, 1 << 20));
  const auto seqs = static_cast<std::size_t>(c.num_seqs);
  c.seq_lens = detail::parse_list(path, "seq_lens", get("seq_lens"), seqs);
  d.shape.q_lens = detail::parse_list(path, "q_lens", get("q_lens"), seqs);
  for (std::size_t i = 0; i < seqs; ++i) {
    if (d.shape.q_lens[i] > c.seq_lens[i]) {
      detail::dump_error(path, "q_lens[" + std::to_string(i) + "] exceeds seq_lens");
    }
  }
  const std::size_t out_values = extend_output_values(d.shape);
  const std::size_t lse_values = extend_lse_values(d.shape);
  if (out_values * sizeof(std::uint16_t) > (std::size_t{1} << 30)) {
    detail::dump_error(path, "the shape's output is over 1 GiB");
  }
  // What regenerating the case would cost: the pool it fills (both planes, padded rows) and the
  // reference's multiply-adds (every query head against every key it sees, K and V), bounded so
  // that a hostile header cannot make the inspect tool allocate or compute without end.
  double pool = 0;
  double work = 0;
  for (std::size_t i = 0; i < seqs; ++i) {
    pool += (std::ceil(static_cast<double>(c.seq_lens[i]) / c.block_size) + 3) * c.block_size;
    work += static_cast<double>(d.shape.q_lens[i]) * c.seq_lens[i];
  }
  pool *= 2.0 * c.num_kv_heads * (c.head_dim + 8);
  work *= 2.0 * c.num_q_heads * c.head_dim;
  if (pool > static_cast<double>(std::size_t{1} << 28)) {
    detail::dump_error(path, "the shape's KV pool is over 2^28 values");
  }
  if (work > static_cast<double>(std::size_t{1} << 36)) {
    detail::dump_error(path, "the shape's reference is over 2^36 multiply-adds");
  }
  const auto out_count = static_cast<std::size_t>(
      parse_int(path, "out", get("out"), 0, std::numeric_limits<std::int32_t>::max()));
  const auto lse_count = static_cast<std::size_t>(
      parse_int(path, "lse", get("lse"), 0, std::numeric_limits<std::int32_t>::max()));
  if (out_count != out_values) {
    detail::dump_error(path, "out holds " + std::to_string(out_count) + " values, the shape has " +
                                 std::to_string(out_values));
  }
  if (lse_count != 0 && lse_count != lse_values) {
    detail::dump_error(path, "lse holds " + std::to_string(lse_count) + " values, the shape has " +
                                 std::to_string(lse_values));
  }
  const std::streampos here = f.tellg();
  f.seekg(0, std::ios::end);
  const std::streamoff left = f.tellg() - here;
  f.seekg(here);
  const auto expected =
      static_cast<std::streamoff>(out_count * sizeof(std::uint16_t) + lse_count * sizeof(float));
  if (left < expected) detail::dump_error(path, "shorter than its header says");
  if (left > expected) detail::dump_error(path, "longer than its header says");
  d.out.resize(out_count);
  d.lse.resize(lse_count);
  f.read(reinterpret_cast<char*>(d.out.data()),
         static_cast<std::streamsize>(out_count * sizeof(std::uint16_t)));
  f.read(reinterpret_cast<char*>(d.lse.data()),
         static_cast<std::streamsize>(lse_count * sizeof(float)));
  if (!f) detail::dump_error(path, "shorter than its header says");
  if (f.peek() != std::char_traits<char>::eof()) {
    detail::dump_error(path, "longer than its header says");
  }
  return d;
}

// The folder dumps go to: the environment's kDumpDirVariable, empty when unset.
inline std::string dump_dir() {
  const char* dir = std::getenv(kDumpDirVariable);
  return dir == nullptr ? std::string() : std::string(dir);
}

// How many dumps a test process has written (one per process, owned by the test program).
struct DumpBudget {
  int written = 0;
};

// Writes `d` into dump_dir() when set, within `budget` (kMaxDumpsPerProcess dumps of at most
// kMaxDumpOutputBytes output bytes each). Returns what happened, for the failure message: ""
// when no folder is set.
inline std::string maybe_dump_extend(const ExtendDump& d, DumpBudget& budget) {
  int& written = budget.written;
  const std::string dir = dump_dir();
  if (dir.empty()) return {};
  if (d.out.size() * sizeof(std::uint16_t) > kMaxDumpOutputBytes) {
    return "not dumped: its output is " + std::to_string(d.out.size() * 2) + " bytes, over " +
           std::to_string(kMaxDumpOutputBytes);
  }
  if (written >= kMaxDumpsPerProcess) {
    return "not dumped: this process already wrote " + std::to_string(written) + " dumps";
  }
  std::string name = d.test;
  for (char& ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '.' || ch == '-';
    if (!ok) ch = '_';
  }
  const std::string path = dir + "/" + name + "-seed" + std::to_string(d.seed) + "-" +
                           std::to_string(written) + ".pkvdump";
  try {
    write_extend_dump(path, d);
  } catch (const std::exception& e) {
    return std::string("not dumped: ") + e.what();
  }
  ++written;
  return "dumped to " + path;
}

// The extend GPU tests' per-row tolerance for a dtype (tests/cuda/extend_attention_test.cpp uses
// it), so that a dump is inspected as its test checked it.
inline double extend_row_tolerance(KVDtype dtype) {
  return dtype == KVDtype::kBFloat16 ? 1e-2 : 2e-3;
}

// Regenerates `d`'s problem, computes its reference on the CPU and writes to `os` the case, the
// per-row check's fingerprint of the dumped output and the log-sum-exp values off by more than
// 1e-3. True when the output and the log-sum-exp pass.
inline bool inspect_extend_dump(const ExtendDump& d, std::ostream& os) {
  const HostExtendProblem pb = make_extend_problem(d.shape, d.seed);
  const ExtendReference ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  const DecodeShape& c = d.shape.cache;
  const double tolerance = extend_row_tolerance(c.dtype);
  os << d.test << " (" << d.plan << "), seed " << d.seed << "\n  " << describe(d.shape) << "\n";
  const std::vector<double> out = to_doubles(c.dtype, d.out);
  const RowCheck check = check_rows(out, ref.out, static_cast<std::size_t>(c.head_dim), tolerance);
  os << error_fingerprint(out, ref.out, static_cast<std::size_t>(c.head_dim), tolerance,
                          extend_row_sites(pb))
     << "\n";
  std::size_t lse_bad = 0;
  std::size_t first_bad = 0;
  for (std::size_t i = 0; i < d.lse.size(); ++i) {
    const double got = d.lse[i];
    const bool both_empty = std::isinf(ref.lse[i]) && ref.lse[i] < 0 && got == ref.lse[i];
    if (!both_empty && !(std::abs(got - ref.lse[i]) <= 1e-3)) {
      if (lse_bad++ == 0) first_bad = i;
    }
  }
  if (d.lse.empty()) {
    os << "log-sum-exp: not dumped\n";
  } else if (lse_bad == 0) {
    os << "log-sum-exp: all " << d.lse.size() << " within 1e-3\n";
  } else {
    os << "log-sum-exp: " << lse_bad << " of " << d.lse.size() << " off by more than 1e-3 (first: ["
       << first_bad << "] = " << d.lse[first_bad] << ", reference " << ref.lse[first_bad] << ")\n";
  }
  return check.bad_rows == 0 && lse_bad == 0;
}

}  // namespace pagedkv::testing
