// The failure fingerprint and the failing-case dumps of the GPU extend tests
// (tests/util/attention_fingerprint.hpp, attention_dump.hpp), on the CPU: rows placed as the
// kernels pack them, each of the fingerprint's breakdowns shown an output wrong in one known way
// (counts worked out by hand for the shape), dumps written and read back exactly, malformed dumps
// refused by name, the per-process budget, and extend_dump_inspect on a dump of a wrong output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "attention_dump.hpp"
#include "attention_fingerprint.hpp"
#include "cli_run.hpp"
#include "kv_test_util.hpp"

namespace pagedkv {
namespace {

using testing::ExtendShape;

constexpr double kTolerance = 1e-2;  // bf16

// One sequence, one KV head, group 4: 48 new tokens are 192 packed rows, a full 128-row tile and
// a second of 64 (tile rows 0-63). 100 cached keys: new token i sees 101 + i keys (2 or 3 tiles).
ExtendShape one_head_shape() {
  return testing::make_extend_shape(KVDtype::kBFloat16, 64, 1, 4, 16, {100}, {48});
}

std::vector<double> rounded(KVDtype dtype, const std::vector<double>& exact) {
  std::vector<double> out(exact.size());
  for (std::size_t i = 0; i < exact.size(); ++i) {
    out[i] = dtype_bits_to_float(dtype, float_to_dtype_bits(dtype, static_cast<float>(exact[i])));
  }
  return out;
}

// The line of `text` starting with `prefix` (after leading spaces), or "".
std::string line_of(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, prefix.size(), prefix) == 0) return line;
  }
  return {};
}

// The numbers after "(8 each):" on the column line.
std::vector<double> column_errors(const std::string& text) {
  const std::string line = line_of(text, "relative error of the wrong rows");
  std::vector<double> v;
  const std::size_t colon = line.find("):");
  if (colon == std::string::npos) return v;
  std::istringstream in(line.substr(colon + 2));
  std::string word;
  while (in >> word) {
    if (word == "|") continue;
    v.push_back(std::stod(word));
  }
  return v;
}

std::string site_text(const testing::RowSite& s) {
  std::ostringstream text;
  text << "seq " << s.seq << " token " << s.token << " q_head " << s.q_head << " kv_head "
       << s.kv_head << " row " << s.tile_row << " keys " << s.visible_keys << " last "
       << s.last_key;
  return text.str();
}

TEST(ExtendRowSites, PlaceRowsAsTheKernelsPackThem) {
  ExtendShape s = testing::make_extend_shape(KVDtype::kBFloat16, 64, 2, 4, 16, {10, 200}, {40, 3});
  const auto pb = testing::make_extend_problem(s, 1);
  const auto sites = testing::extend_row_sites(pb);
  ASSERT_EQ(sites.size(), 43u * 8u);
  // Sequence 0, new token 33, query head 5: KV head 1, packed row 33 x 4 + 1 = 133, tile row 5;
  // it sees 10 + 33 + 1 keys, the last at position 43.
  EXPECT_EQ(site_text(sites[33 * 8 + 5]),
            "seq 0 token 33 q_head 5 kv_head 1 row 5 keys 44 last 43");
  // Sequence 1, new token 2 (output token 42), query head 7: packed row 2 x 4 + 3 = 11.
  EXPECT_EQ(site_text(sites[42 * 8 + 7]),
            "seq 1 token 2 q_head 7 kv_head 1 row 11 keys 203 last 202");
  // A window caps the keys seen, not the last one.
  s.cache.window_size = 17;
  const auto windowed = testing::extend_row_sites(testing::make_extend_problem(s, 1));
  EXPECT_EQ(windowed[33 * 8 + 5].visible_keys, 17);
  EXPECT_EQ(windowed[33 * 8 + 5].last_key, 43);
  EXPECT_EQ(windowed[0].visible_keys, 11);  // token 0 of sequence 0 sees all of its 11
}

TEST(ErrorFingerprint, ACorrectlyRoundedOutputHasNoWrongRow) {
  const auto pb = testing::make_extend_problem(one_head_shape(), 2);
  const auto ref = testing::naive_extend(pb);
  const std::string f = testing::error_fingerprint(rounded(KVDtype::kBFloat16, ref.out), ref.out,
                                                   64, kTolerance, testing::extend_row_sites(pb));
  EXPECT_EQ(f,
            "fingerprint: 0 of 192 rows over 0.01 (0 of them all zero, 0 with non-finite values)");
}

TEST(ErrorFingerprint, TheSecondConsumerHalfOfEachTileWrong) {
  const auto pb = testing::make_extend_problem(one_head_shape(), 3);
  const auto ref = testing::naive_extend(pb);
  std::vector<double> out = rounded(KVDtype::kBFloat16, ref.out);
  // Packed row = token x 4 + head; rows 64-127 of the first tile are tokens 16..31.
  for (std::size_t token = 16; token < 32; ++token) {
    for (std::size_t i = token * 4 * 64; i < (token + 1) * 4 * 64; ++i) out[i] = -out[i];
  }
  const std::string f =
      testing::error_fingerprint(out, ref.out, 64, kTolerance, testing::extend_row_sites(pb));
  EXPECT_EQ(line_of(f, "fingerprint:"),
            "fingerprint: 64 of 192 rows over 0.01 (0 of them all zero, 0 with non-finite values)")
      << f;
  EXPECT_EQ(line_of(f, "by half of the tile"), "  by half of the tile: 0-63 0/128; 64-127 64/64;")
      << f;
  EXPECT_EQ(line_of(f, "by row of the 128-row query tile"),
            "  by row of the 128-row query tile: 0-15 0/32; 16-31 0/32; 32-47 0/32; 48-63 0/32; "
            "64-79 16/16; 80-95 16/16; 96-111 16/16; 112-127 16/16;")
      << f;
  // Tokens 16..31 see 117..132 keys: 2 tiles up to 128 keys (token 27), 3 after.
  EXPECT_EQ(line_of(f, "by keys visible"),
            "  by keys visible (64-key tiles): 2 tiles 48/112; 3-4 tiles 16/80;")
      << f;
  EXPECT_EQ(line_of(f, "by KV head"), "  by KV head: 0 64/192;") << f;
  // Every column group of the wrong rows is wrong (relative error 2: the negated rows).
  const auto cols = column_errors(f);
  ASSERT_EQ(cols.size(), 8u) << f;
  for (const double e : cols) EXPECT_NEAR(e, 2.0, 0.05) << f;
}

TEST(ErrorFingerprint, OneColumnGroupWrong) {
  const auto pb = testing::make_extend_problem(one_head_shape(), 4);
  const auto ref = testing::naive_extend(pb);
  std::vector<double> out = rounded(KVDtype::kBFloat16, ref.out);
  // Columns 40-47 (group 5) of every row replaced by the next row's.
  const std::size_t rows = out.size() / 64;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t d = 40; d < 48; ++d) out[r * 64 + d] = 3.0 + static_cast<double>(d);
  }
  const std::string f =
      testing::error_fingerprint(out, ref.out, 64, kTolerance, testing::extend_row_sites(pb));
  EXPECT_EQ(line_of(f, "fingerprint:"),
            "fingerprint: 192 of 192 rows over 0.01 (0 of them all zero, 0 with non-finite values)")
      << f;
  const auto cols = column_errors(f);
  ASSERT_EQ(cols.size(), 8u) << f;
  for (std::size_t g = 0; g < cols.size(); ++g) {
    if (g == 5) {
      EXPECT_GT(cols[g], 1.0) << f;
    } else {
      EXPECT_LT(cols[g], 1e-2) << "column group " << g << "\n" << f;
    }
  }
}

TEST(ErrorFingerprint, ZeroAndNonFiniteRowsAndTheLastKeyInItsTile) {
  const auto pb = testing::make_extend_problem(one_head_shape(), 5);
  const auto ref = testing::naive_extend(pb);
  std::vector<double> out = rounded(KVDtype::kBFloat16, ref.out);
  // Token 20 (last key 120: 56 in its tile) zeroed; token 40 (last key 140: 12) one NaN per row.
  for (std::size_t i = 20 * 4 * 64; i < 21 * 4 * 64; ++i) out[i] = 0.0;
  for (std::size_t h = 0; h < 4; ++h) {
    out[(40 * 4 + h) * 64 + 9] = std::numeric_limits<double>::quiet_NaN();
  }
  const std::string f =
      testing::error_fingerprint(out, ref.out, 64, kTolerance, testing::extend_row_sites(pb));
  EXPECT_EQ(line_of(f, "fingerprint:"),
            "fingerprint: 8 of 192 rows over 0.01 (4 of them all zero, 4 with non-finite values)")
      << f;
  // Last keys 100..147 mod 64: 36..63 (tokens 0..27) then 0..19 (tokens 28..47).
  EXPECT_EQ(
      line_of(f, "by last visible key mod 64"),
      "  by last visible key mod 64: 0-7 0/32; 8-15 4/32; 16-23 0/16; 32-39 0/16; 40-47 0/32; "
      "48-55 0/32; 56-63 4/32;")
      << f;
  EXPECT_NE(f.find("relative error inf"), std::string::npos) << f;  // the worst is a NaN row
  EXPECT_NE(f.find("new token 40"), std::string::npos) << f;
}

TEST(ErrorFingerprint, MismatchedSizesAreNamedNotComputed) {
  const std::vector<double> a(128, 0.0);
  const std::vector<double> b(64, 0.0);
  const std::vector<testing::RowSite> sites(1);
  const std::string f = testing::error_fingerprint(a, b, 64, kTolerance, sites);
  EXPECT_EQ(f.rfind("fingerprint: not computed", 0), 0u) << f;
}

class ExtendDumpFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pagedkv_dump_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    ::unsetenv(testing::kDumpDirVariable);
    std::filesystem::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A dump of `shape` (seed 7) whose output is the reference rounded, rows of tokens 16..31
  // negated, and the exact log-sum-exp.
  testing::ExtendDump wrong_dump(const ExtendShape& shape) const {
    const auto pb = testing::make_extend_problem(shape, 7);
    const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
    testing::ExtendDump d;
    d.test = "CudaExtendAttention.Case/WgmmaWarpSpecialized";
    d.plan = "kWgmmaWarpSpecialized splits 1";
    d.shape = shape;
    d.seed = 7;
    const std::size_t dim = static_cast<std::size_t>(shape.cache.head_dim);
    const std::size_t heads = static_cast<std::size_t>(shape.cache.num_q_heads);
    for (std::size_t i = 0; i < ref.out.size(); ++i) {
      const std::size_t token = i / dim / heads;
      const double x = token >= 16 && token < 32 ? -ref.out[i] : ref.out[i];
      d.out.push_back(float_to_dtype_bits(shape.cache.dtype, static_cast<float>(x)));
    }
    for (const double x : ref.lse) d.lse.push_back(static_cast<float>(x));
    return d;
  }

  std::filesystem::path dir_;
};

TEST_F(ExtendDumpFiles, WrittenAndReadBackExactly) {
  ExtendShape s = one_head_shape();
  s.cache.window_size = 70;
  s.cache.soft_cap = 30.0f;
  s.cache.value_range = 3.0f;
  s.cache.kind = testing::LayoutKind::kHnd;
  s.cache.shuffle_blocks = false;
  s.cache.extra_table_columns = 1;
  s.extra_max_q_len = 5;
  const testing::ExtendDump d = wrong_dump(s);
  testing::write_extend_dump(path("a.pkvdump"), d);
  const testing::ExtendDump r = testing::read_extend_dump(path("a.pkvdump"));
  EXPECT_EQ(r.test, d.test);
  EXPECT_EQ(r.plan, d.plan);
  EXPECT_EQ(r.seed, 7u);
  EXPECT_EQ(testing::describe(r.shape), testing::describe(s));
  EXPECT_EQ(r.shape.cache.soft_cap, 30.0f);
  EXPECT_EQ(r.shape.cache.value_range, 3.0f);
  EXPECT_EQ(r.shape.cache.kind, testing::LayoutKind::kHnd);
  EXPECT_FALSE(r.shape.cache.shuffle_blocks);
  EXPECT_EQ(r.shape.cache.extra_table_columns, 1);
  EXPECT_EQ(r.shape.extra_max_q_len, 5);
  EXPECT_EQ(r.out, d.out);
  EXPECT_EQ(r.lse, d.lse);
  // The regenerated problem is the dumped one: same inputs, so the same reference.
  EXPECT_EQ(testing::make_extend_problem(r.shape, r.seed).q, testing::make_extend_problem(s, 7).q);
}

TEST_F(ExtendDumpFiles, InspectPrintsTheFingerprintOfTheDumpedOutput) {
  const testing::ExtendDump d = wrong_dump(one_head_shape());
  std::ostringstream text;
  EXPECT_FALSE(testing::inspect_extend_dump(d, text));
  EXPECT_EQ(line_of(text.str(), "by half of the tile"),
            "  by half of the tile: 0-63 0/128; 64-127 64/64;")
      << text.str();
  EXPECT_NE(text.str().find("log-sum-exp: all 192 within 1e-3"), std::string::npos) << text.str();
  // The tool on the file: the same lines, exit 0; a missing file: exit 2, named.
  testing::write_extend_dump(path("b.pkvdump"), d);
  const auto run = test::run_cli(PAGEDKV_EXTEND_DUMP_INSPECT, path("b.pkvdump"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("  by half of the tile: 0-63 0/128; 64-127 64/64;"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("verdict: the dumped output fails the check"), std::string::npos)
      << run.output;
  const auto missing = test::run_cli(PAGEDKV_EXTEND_DUMP_INSPECT, path("none.pkvdump"));
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("none.pkvdump: cannot be opened"), std::string::npos)
      << missing.output;
  // A correct output passes.
  testing::ExtendDump good = d;
  const auto pb = testing::make_extend_problem(d.shape, d.seed);
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    good.out[i] = float_to_dtype_bits(KVDtype::kBFloat16, static_cast<float>(ref.out[i]));
  }
  std::ostringstream good_text;
  EXPECT_TRUE(testing::inspect_extend_dump(good, good_text)) << good_text.str();
}

TEST_F(ExtendDumpFiles, MalformedDumpsAreRefusedByName) {
  const testing::ExtendDump d = wrong_dump(one_head_shape());
  testing::write_extend_dump(path("good.pkvdump"), d);
  std::string good;
  {
    std::ifstream f(path("good.pkvdump"), std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  const auto expect_refused = [&](const std::string& bytes, const std::string& fragment) {
    {
      std::ofstream f(path("bad.pkvdump"), std::ios::binary | std::ios::trunc);
      f << bytes;
    }
    try {
      testing::read_extend_dump(path("bad.pkvdump"));
      ADD_FAILURE() << "accepted; expected an error containing '" << fragment << "'";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  const auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const std::size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  expect_refused("not a dump\n", "not an extend dump");
  expect_refused(good.substr(0, good.find("\ndata\n") + 1), "no 'data' line");
  // One header line replaced: {from, to, what the error must say}.
  const std::vector<std::array<std::string, 3>> edits = {
      {"seed 7\n", "", "no seed line"},
      {"seed 7\n", "seed 7\nseed 8\n", "seed given twice"},
      {"seed 7\n", "seed -7\n", "seed must be an unsigned integer"},
      {"seed 7\n", "seed +7\n", "seed must be an unsigned integer"},
      {"head_dim 64\n", "head_dim 6x4\n", "head_dim must be an integer"},
      {"head_dim 64\n", "head_dim  64\n", "head_dim must be an integer"},
      {"num_kv_heads 1\n", "num_kv_heads 3\n", "multiple of num_kv_heads"},
      {"dtype 1\n", "dtype 2\n", "dtype must be fp16 or bf16"},
      {"q_lens 48\n", "q_lens 48,1\n", "q_lens must list 1 values, got 2"},
      {"q_lens 48\n", "q_lens 149\n", "q_lens[0] exceeds seq_lens"},
      {"soft_cap 0x0p+0\n", "soft_cap nan\n", "soft_cap must be a finite"},
      {"out 12288\n", "out 12289\n", "out holds 12289 values"},
      {"num_q_heads 4\n", "num_q_heads 4096\n", "out holds 12288 values"},
  };
  for (const auto& [from, to, fragment] : edits) expect_refused(replaced(from, to), fragment);
  {
    // 4 KV heads over 2^20 positions: a pool of over 2^28 values to fill.
    std::string big = replaced("num_kv_heads 1\n", "num_kv_heads 4\n");
    big.replace(big.find("seq_lens 148\n"), 13, "seq_lens 1048576\n");
    expect_refused(big, "the shape's KV pool is over 2^28 values");
  }
  {
    // 4,096 query heads against 3,000 keys: a small pool, over 2^36 multiply-adds to check.
    std::string big = replaced("num_q_heads 4\n", "num_q_heads 4096\n");
    big.replace(big.find("seq_lens 148\n"), 13, "seq_lens 3000\n");
    expect_refused(big, "the shape's reference is over 2^36 multiply-adds");
  }
  expect_refused("pagedkv-extend-dump 1\ntest " + std::string(5000, 'x') + "\ndata\n",
                 "a header line is over 4096 characters");
  expect_refused(good.substr(0, good.size() - 1), "shorter than its header says");
  expect_refused(good + "x", "longer than its header says");
  // And the file itself was fine.
  EXPECT_NO_THROW(testing::read_extend_dump(path("good.pkvdump")));
}

TEST_F(ExtendDumpFiles, WrittenOnlyWhenAFolderIsNamedAndWithinTheBudget) {
  const testing::ExtendDump d = wrong_dump(one_head_shape());
  testing::DumpBudget budget;
  ::unsetenv(testing::kDumpDirVariable);
  EXPECT_EQ(testing::maybe_dump_extend(d, budget), "");
  ::setenv(testing::kDumpDirVariable, dir_.c_str(), 1);
  const std::string first = testing::maybe_dump_extend(d, budget);
  ASSERT_EQ(first.rfind("dumped to ", 0), 0u) << first;
  const std::string file = first.substr(10);
  EXPECT_EQ(std::filesystem::path(file).filename().string(),
            "CudaExtendAttention.Case_WgmmaWarpSpecialized-seed7-0.pkvdump");
  EXPECT_EQ(testing::read_extend_dump(file).out, d.out);
  // An output over the size limit is named, not written.
  ExtendShape big = testing::make_extend_shape(KVDtype::kBFloat16, 256, 8, 8, 16, {0}, {1100});
  testing::ExtendDump large;
  large.shape = big;
  large.out.assign(testing::extend_output_values(big), 0);
  ASSERT_GT(large.out.size() * 2, testing::kMaxDumpOutputBytes);
  EXPECT_EQ(testing::maybe_dump_extend(large, budget).rfind("not dumped: its output is", 0), 0u);
  // The process's budget: kMaxDumpsPerProcess in all (one written above).
  for (int i = 1; i < testing::kMaxDumpsPerProcess; ++i) {
    EXPECT_EQ(testing::maybe_dump_extend(d, budget).rfind("dumped to ", 0), 0u);
  }
  EXPECT_EQ(
      testing::maybe_dump_extend(d, budget).rfind("not dumped: this process already wrote", 0), 0u);
}

}  // namespace
}  // namespace pagedkv
