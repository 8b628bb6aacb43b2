#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>

#include "pagedkv/base/error.hpp"
#include "replay.hpp"
#include "trace.hpp"

namespace pagedkv::replay {
namespace {

// The recorded traces (data/traces, or the folder the CMake cache variable PAGEDKV_TRACES_DIR
// names). Tests that read them are in the suite ReplayTraces, registered as their own ctest test
// (replay_traces), which is reported as skipped when the traces are missing.
const std::string kMooncakeTrace = PAGEDKV_MOONCAKE_TRACE;
const std::string kAzureConvTrace = PAGEDKV_AZURE_CONV_TRACE;

// The message of a test skipped for a missing trace: loud, and says how to run it.
std::string missing_trace(const std::string& path) {
  return "\n*** TRACE NOT FOUND: " + path +
         "\n*** this test did NOT run; reconfigure with -DPAGEDKV_TRACES_DIR=<dir holding "
         "mooncake/ and azure2023/>";
}

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("pagedkv_replay_test_" + name);
  std::ofstream(path) << text;
  return path.string();
}

// "1, 2, ..., n"
std::string many_ids(int n) {
  std::string s;
  for (int i = 1; i <= n; ++i) s += (i > 1 ? ", " : "") + std::to_string(i);
  return s;
}

// A malformed trace line and a fragment of the error it must give.
struct BadLine {
  std::string line, fragment;
};

// Writes `head` (the lines before, each ending in '\n'), `good`, `bad.line` and `good` again to the
// file `name`: loading it fails naming the file, the bad line's number and `bad.fragment`; with
// skip_bad the bad line is skipped and counted and both good lines are read.
void expect_bad_line(Trace (*load)(const std::string&, const LoadOptions&), const std::string& name,
                     const std::string& head, const std::string& good, const BadLine& bad) {
  SCOPED_TRACE(bad.line.substr(0, 200));
  const std::string path = write_temp(name, head + good + "\n" + bad.line + "\n" + good + "\n");
  const auto number = 2 + std::count(head.begin(), head.end(), '\n');
  try {
    load(path, LoadOptions{});
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path + ":" + std::to_string(number) + ": "), std::string::npos) << what;
    EXPECT_NE(what.find(bad.fragment), std::string::npos) << what;
  }
  LoadOptions skip;
  skip.skip_bad = true;
  const Trace t = load(path, skip);
  EXPECT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.skipped_lines, 1u);
}

// data/traces/README.md, "Reference figures for the default replay": first 1,000 requests.
TEST(ReplayTraces, ReproducesTheReferenceFiguresOnTheFirstThousandMooncakeRequests) {
  const std::string& path = kMooncakeTrace;
  if (!std::filesystem::exists(path)) GTEST_SKIP() << missing_trace(path);
  LoadOptions load;
  load.limit = 1000;
  const Trace trace = load_hashid_jsonl(path, load);
  ASSERT_EQ(trace.requests.size(), 1000u);
  for (const HashScheme scheme : {HashScheme::kXxh3_128, HashScheme::kSha256CborVllm}) {
    ReplayOptions o;
    o.hash = scheme;
    o.num_blocks = {1000001, 8193, 32769};
    const auto results = run_replay(trace, o);
    ASSERT_EQ(results.size(), 3u);
    const std::uint64_t hits[] = {2962688, 511488, 534400};
    const std::uint64_t evicted[] = {0, 817691, 791683};
    for (std::size_t k = 0; k < 3; ++k) {
      SCOPED_TRACE("num_blocks " + std::to_string(o.num_blocks[k]));
      EXPECT_EQ(results[k].prompt_tokens, 13732944u);
      EXPECT_EQ(results[k].hit_tokens, hits[k]);
      EXPECT_EQ(results[k].evicted_blocks, evicted[k]);
      EXPECT_EQ(results[k].rejected, 0u);
      EXPECT_EQ(results[k].prefill_tokens_computed + results[k].hit_tokens, 13732944u);
    }
  }
}

TEST(Replay, SingleThreadedAndPipelinedHashingAgree) {
  GeneratorOptions g;
  g.requests = 200;
  const Trace trace = generate(g);
  ReplayOptions o;
  o.num_blocks = {4001, 40001};
  o.threads = 1;
  const auto one = run_replay(trace, o);
  o.threads = 2;
  const auto two = run_replay(trace, o);
  for (std::size_t k = 0; k < one.size(); ++k) {
    EXPECT_EQ(one[k].hit_tokens, two[k].hit_tokens);
    EXPECT_EQ(one[k].evicted_blocks, two[k].evicted_blocks);
  }
  EXPECT_GT(one[1].hit_tokens, 0u);
}

TEST(Replay, MalformedLinesNameFileLineAndField) {
  const std::string good =
      R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]})";
  const BadLine cases[] = {
      {R"({"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]})",
       "'output_length' is missing"},
      {R"({"timestamp": 0, "input_length": -3, "output_length": 5, "hash_ids": [1]})",
       "'input_length'"},
      {R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2, 3]})",
       "'hash_ids': 3 ids for 600 tokens"},
      {R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, "x"]})",
       "'hash_ids'"},
      {R"({"timestamp": zero, "input_length": 6, "output_length": 5, "hash_ids": [1]})",
       "'timestamp'"},
      {R"({"timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": [1]} x)", "trailing"},
      {R"(not json)", "expected '{'"},
      // An ignored value nested 50,000 deep: refused at 64 levels (it crashed the recursion).
      {R"({"x": )" + std::string(50000, '[') + std::string(50000, ']') +
           R"(, "timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": [1]})",
       "nesting deeper than 64"},
      {R"({"x": )" + std::string(65, '[') + std::string(65, ']') +
           R"(, "timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": [1]})",
       "nesting deeper than 64"},
      // Lengths above kMaxTraceTokens (a prompt is synthesized at 4 bytes a token).
      {R"({"timestamp": 0, "input_length": 1073741824, "output_length": 0, "hash_ids": []})",
       "field 'input_length': 1073741824 tokens is more than the limit of 16777216"},
      {R"({"timestamp": 0, "input_length": 16777217, "output_length": 0, "hash_ids": []})",
       "field 'input_length': 16777217 tokens is more than the limit of 16777216"},
      {R"({"timestamp": 0, "input_length": 16, "output_length": 1073741824, "hash_ids": []})",
       "field 'output_length': 1073741824 tokens is more than the limit of 16777216"},
      // Too many ids is caught while the array is read, before input_length is known: at most
      // 2^24 / 512 = 32,768 ids, so the 32,769th stops the line (before the "x").
      {R"({"timestamp": 0, "hash_ids": [)" + many_ids(32769) +
           R"(, "x"], "input_length": 600, "output_length": 5})",
       "'hash_ids': 32769 ids for at most 16777216 tokens (kMaxTraceTokens)"},
      {R"({"timestamp": 0, "hash_ids": [1, 2, 3], "input_length": 600, "output_length": 5})",
       "'hash_ids': 3 ids for 600 tokens"},
      // A key given twice (the ids would concatenate, a length would silently take the last).
      {R"({"timestamp": 0, "input_length": 32, "output_length": 4, "hash_ids": [1], )"
       R"("hash_ids": [2, 3]})",
       "field 'hash_ids' appears twice"},
      {R"({"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [1], )"
       R"("input_length": 48})",
       "field 'input_length' appears twice"},
      {R"({"timestamp": 0, "timestamp": 1, "input_length": 6, "output_length": 5, "hash_ids": []})",
       "field 'timestamp' appears twice"},
      {R"({"x": 1, "timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": [], )"
       R"("y": 2, "x": [3]})",
       "field 'x' appears twice"},
      // Escaped keys are decoded: "hash\u005fids" is hash_ids (it was an unknown key, ignored),
      // so giving both is a key given twice; a bad escape is malformed, in a key or a value.
      {R"({"timestamp": 0, "input_length": 32, "output_length": 4, "hash_ids": [1], )"
       R"("hash\u005fids": [2, 3]})",
       "field 'hash_ids' appears twice"},
      {R"({"timestamp": 0, "input\u005Flength": 32, "output_length": 4, "hash_ids": [1], )"
       R"("input_length": 16})",
       "field 'input_length' appears twice"},
      {R"({"x\u00e9": 1, "x\u00E9": 2, "timestamp": 0, "input_length": 6, "output_length": 5, )"
       R"("hash_ids": []})",
       "field 'x?"
       "?' appears twice"},
      {R"({"hash\qids": [1], "timestamp": 0, "input_length": 6, "output_length": 5})",
       "invalid escape: backslash then 'q'"},
      {R"({"x": "a\u00g1", "timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": []})",
       "\\u escape without 4 hex digits"},
      {R"({"x\ud800": 1, "timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": []})",
       "lone high surrogate"},
      {R"({"\udc00": 1, "timestamp": 0, "input_length": 6, "output_length": 5, "hash_ids": []})",
       "lone low surrogate"},
      // Timestamps: finite and within kMaxTraceTimestampMs.
      {R"({"timestamp": 1e400, "input_length": 6, "output_length": 5, "hash_ids": [1]})",
       "field 'timestamp'"},
      {R"({"timestamp": 1.7e308, "input_length": 6, "output_length": 5, "hash_ids": [1]})",
       "field 'timestamp': outside [-1e15, 1e15] ms"},
      {R"({"timestamp": -1.7e308, "input_length": 6, "output_length": 5, "hash_ids": [1]})",
       "field 'timestamp': outside [-1e15, 1e15] ms"},
  };
  for (const BadLine& c : cases) expect_bad_line(load_hashid_jsonl, "bad.jsonl", "", good, c);
  EXPECT_THROW(load_hashid_jsonl("/nonexistent/trace.jsonl", LoadOptions{}), Error);
  // Unknown fields of any JSON type are ignored.
  const std::string extra = write_temp(
      "extra.jsonl", R"({"session": {"id": "a", "t": [1, {"x": null}]}, "timestamp": 1.5, )"
                     R"("input_length": 10, "output_length": 1, "hash_ids": [7], "ok": true})");
  EXPECT_EQ(load_hashid_jsonl(extra, LoadOptions{}).requests.size(), 1u);
  // Every key escaped (and escapes in ignored values): read as the plain keys.
  const std::string escaped =
      write_temp("escaped.jsonl",
                 R"({"\u0074imestamp": 2, "input\u005flength": 600, "output\u005Flength": 3, )"
                 R"("hash\u005fids": [7, 8], "note": "tab\t quote\" \\ \/ \ud83d\ude00 \u00e9"})");
  const Trace esc = load_hashid_jsonl(escaped, LoadOptions{});
  ASSERT_EQ(esc.requests.size(), 1u);
  EXPECT_EQ(esc.requests[0].timestamp_ms, 2.0);
  EXPECT_EQ(esc.requests[0].input_length, 600u);
  EXPECT_EQ(esc.requests[0].output_length, 3u);
  EXPECT_EQ(esc.requests[0].hash_ids, (std::vector<std::uint32_t>{7, 8}));
  // The limits themselves are accepted: 64 levels of nesting, kMaxTraceTokens-token lengths, a
  // timestamp of 1e15 ms.
  const std::string edge =
      write_temp("edge.jsonl", R"({"x": )" + std::string(64, '[') + std::string(64, ']') +
                                   R"(, "timestamp": -1e15, "input_length": 16777216, )"
                                   R"("output_length": 16777216, "hash_ids": [1]})");
  const Trace e = load_hashid_jsonl(edge, LoadOptions{});
  ASSERT_EQ(e.requests.size(), 1u);
  EXPECT_EQ(e.requests[0].input_length, kMaxTraceTokens);
  EXPECT_EQ(e.requests[0].output_length, kMaxTraceTokens);
}

// A pool too small for every request rejects them all: the rates are 0, never NaN (the JSON
// line must stay valid).
TEST(Replay, EveryRequestRejectedGivesZeroRatesNotNan) {
  const std::string path = write_temp(
      "rejected.jsonl",
      R"({"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]})"
      "\n"
      R"({"timestamp": 1, "input_length": 1000, "output_length": 5, "hash_ids": [1, 3]})");
  const Trace trace = load_hashid_jsonl(path, LoadOptions{});
  ReplayOptions o;
  o.num_blocks = {3};
  const auto results = run_replay(trace, o);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].rejected, 2u);
  EXPECT_EQ(results[0].queried_tokens, 0u);
  EXPECT_EQ(results[0].hit_rate(), 0.0);
  EXPECT_EQ(results[0].prefill_saved_ratio(), 0.0);
}

// Writes `text` gzip-compressed (in `members` gzip members, as concatenated .gz files are).
std::string write_temp_gz(const std::string& name, const std::string& text, int members = 1) {
  const auto path =
      (std::filesystem::temp_directory_path() / ("pagedkv_replay_test_" + name)).string();
  std::remove(path.c_str());
  const std::size_t part = text.size() / static_cast<std::size_t>(members) + 1;
  for (std::size_t at = 0; at < text.size(); at += part) {
    gzFile f = gzopen(path.c_str(), "ab");
    EXPECT_NE(f, nullptr);
    const std::size_t n = std::min(part, text.size() - at);
    EXPECT_EQ(gzwrite(f, text.data() + at, static_cast<unsigned>(n)), static_cast<int>(n));
    EXPECT_EQ(gzclose(f), Z_OK);
  }
  return path;
}

TEST(Replay, ReadsGzipCompressedTraces) {
  // Enough lines that the decompressed text spans several of the reader's 128 KiB chunks, with
  // lines cut across chunk (and gzip member) boundaries.
  std::string text;
  for (int i = 0; i < 6000; ++i) {
    text += R"({"timestamp": )" + std::to_string(i) + R"(, "input_length": )" +
            std::to_string(100 + i % 900) + R"(, "output_length": 3, "hash_ids": [)" +
            std::to_string(i % 37) + (i % 3 ? ", 5" : "") + "]}\n";
  }
  const std::string plain = write_temp("plain.jsonl", text);
  LoadOptions options;
  options.source_block_size = 64;
  const Trace a = load_hashid_jsonl(plain, options);
  ASSERT_EQ(a.requests.size(), 6000u);
  for (const int members : {1, 3}) {
    const std::string gz = write_temp_gz("trace.jsonl.gz", text, members);
    ASSERT_LT(std::filesystem::file_size(gz), text.size() / 4);  // really compressed
    const Trace b = load_hashid_jsonl(gz, options);
    ASSERT_EQ(b.requests.size(), a.requests.size());
    for (std::size_t i = 0; i < a.requests.size(); ++i) {
      EXPECT_EQ(b.requests[i].timestamp_ms, a.requests[i].timestamp_ms);
      EXPECT_EQ(b.requests[i].input_length, a.requests[i].input_length);
      EXPECT_EQ(b.requests[i].hash_ids, a.requests[i].hash_ids);
    }
    EXPECT_EQ(b.name, "pagedkv_replay_test_trace.jsonl.gz");
  }
  // The last line without a newline, and a malformed line named by its decompressed line number.
  const std::string bad = write_temp_gz(
      "bad.jsonl.gz", text.substr(0, 200) + "\n{\"timestamp\": 1}\n" + text.substr(0, 90));
  try {
    load_hashid_jsonl(bad, options);
    ADD_FAILURE() << "accepted a malformed compressed line";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ":"), std::string::npos) << e.what();
  }
  // A truncated stream is an error, not a silently shorter trace.
  const std::string whole = write_temp_gz("whole.jsonl.gz", text);
  std::string bytes;
  {
    std::ifstream in(whole, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string cut = write_temp("cut.jsonl.gz", bytes.substr(0, bytes.size() / 2));
  EXPECT_THROW(load_hashid_jsonl(cut, options), Error);
  // Cut anywhere, even just before the 8-byte trailer (every line complete), a truncated stream
  // is named as such, also under --skip-bad (a whole-file error).
  LoadOptions skip = options;
  skip.skip_bad = true;
  for (const std::size_t keep : {bytes.size() - 8, bytes.size() - 1, bytes.size() / 3}) {
    const std::string t = write_temp("trunc.jsonl.gz", bytes.substr(0, keep));
    for (const LoadOptions& o : {options, skip}) {
      try {
        load_hashid_jsonl(t, o);
        ADD_FAILURE() << "accepted a gzip stream cut at " << keep << " of " << bytes.size();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("trace file '" + t + "': truncated gzip stream"),
                  std::string::npos)
            << e.what();
      }
    }
  }
  // Bytes after the last member that do not start another one are an error naming the file
  // (zlib's gzread ignored them silently), also under --skip-bad; more members are read on.
  const std::string member =
      write_temp_gz("member.jsonl.gz", text.substr(0, text.find("\n", 2000) + 1));
  std::string member_bytes;
  {
    std::ifstream in(member, std::ios::binary);
    member_bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string two = write_temp("two.jsonl.gz", bytes + member_bytes);
  EXPECT_GT(load_hashid_jsonl(two, options).requests.size(), a.requests.size() + 10);
  const std::string end = "the bytes after the gzip stream's end at byte ";
  const std::string after_first = end + std::to_string(bytes.size()) + " are not gzip data";
  const std::pair<std::string, std::string> junk_cases[] = {
      {bytes + "junk\n", after_first},
      {bytes + std::string(1, '\x1f'), after_first},
      {bytes + std::string(3, '\0'), after_first},
      {bytes + std::string(300000, 'x'), after_first},
      {bytes + member_bytes + "{\"timestamp\": 1}\n",
       end + std::to_string(bytes.size() + member_bytes.size()) + " are not gzip data"},
      // Another member's magic bytes, then junk: that member is damaged.
      {bytes + "\x1f\x8bjunk", "cannot read ("},
  };
  for (const auto& [content, fragment] : junk_cases) {
    const std::string t = write_temp("junk.jsonl.gz", content);
    for (const LoadOptions& o : {options, skip}) {
      try {
        load_hashid_jsonl(t, o);
        ADD_FAILURE() << "accepted a gzip stream with trailing bytes: " << fragment;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("trace file '" + t + "': " + fragment),
                  std::string::npos)
            << e.what();
      }
    }
  }
  // Azure CSV, compressed.
  const std::string csv =
      write_temp_gz("azure.csv.gz",
                    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,17,4\n2023-11-16 18:15:50,3,9\n");
  const Trace c = load_azure_csv(csv, LoadOptions{});
  ASSERT_EQ(c.requests.size(), 2u);
  EXPECT_EQ(c.requests[1].input_length, 3u);
  EXPECT_EQ(c.requests[1].output_length, 9u);
}

TEST(Replay, TokenSynthesisFollowsHashIds) {
  Trace t;
  t.source_block_size = 4;
  TraceRequest a, b;
  a.input_length = 10;
  a.hash_ids = {5, 6, 7};
  b.input_length = 9;
  b.hash_ids = {5, 6, 8};
  t.requests = {a, b};
  std::vector<TokenId> ta, tb;
  synthesize_prompt(t, 0, ta);
  synthesize_prompt(t, 1, tb);
  ASSERT_EQ(ta.size(), 10u);
  ASSERT_EQ(tb.size(), 9u);
  EXPECT_TRUE(std::equal(ta.begin(), ta.begin() + 8, tb.begin()));  // ids 5, 6 shared
  EXPECT_NE(ta[8], tb[8]);                                          // ids 7 vs 8
  TraceRequest c;  // ids cover 4 of 7 tokens; the rest is unique to the request
  c.input_length = 7;
  c.hash_ids = {5};
  t.requests.push_back(c);
  t.requests.push_back(c);
  std::vector<TokenId> tc, td;
  synthesize_prompt(t, 2, tc);
  synthesize_prompt(t, 3, td);
  EXPECT_TRUE(std::equal(tc.begin(), tc.begin() + 4, ta.begin()));
  EXPECT_NE(tc[4], td[4]);
  for (TokenId x : tc) EXPECT_GE(x, 0);
}

TEST(Replay, GeneratorsAreDeterministicAndTenantsShareNothing) {
  GeneratorOptions g;
  g.workload = Workload::kAgents;
  g.requests = 60;
  const Trace a1 = generate(g), a2 = generate(g);
  ASSERT_EQ(a1.requests.size(), 60u);
  for (std::size_t i = 0; i < 60; ++i) {
    std::vector<TokenId> t1, t2;
    synthesize_prompt(a1, i, t1);
    synthesize_prompt(a2, i, t2);
    EXPECT_EQ(t1, t2);
    EXPECT_EQ(t1.size(), a1.requests[i].input_length);
  }
  // Agents: a session's later turn extends an earlier turn's whole context, so hits are high.
  ReplayOptions o;
  o.num_blocks = {200001};
  EXPECT_GT(run_replay(a1, o)[0].hit_rate(), 0.5);

  // Tenants: each tenant replays the same prompts under its own salt. With no eviction, the
  // total hit count must be exactly tenants x one tenant's own hits: nothing crosses tenants.
  g.workload = Workload::kTenants;
  g.requests = 200;
  g.tenants = 4;
  const Trace all = generate(g);
  Trace one = all;
  one.requests.clear();
  for (const auto& r : all.requests) {
    if (r.cache_salt == std::optional<std::string>("tenant-0")) one.requests.push_back(r);
  }
  ASSERT_EQ(one.requests.size(), 50u);
  const auto hits_all = run_replay(all, o)[0].hit_tokens;
  const auto hits_one = run_replay(one, o)[0].hit_tokens;
  EXPECT_GT(hits_one, 0u);
  EXPECT_EQ(hits_all, 4 * hits_one);
  // Without salts the same prompts would be shared across tenants.
  Trace unsalted = all;
  for (auto& r : unsalted.requests) r.cache_salt.reset();
  EXPECT_GT(run_replay(unsalted, o)[0].hit_tokens, hits_all);
}

// --generate W --limit K generates only the first K requests (it used to generate them all and
// then drop the rest): the same K requests as the whole trace's first K, prompts included.
TEST(Replay, GeneratorLimitGeneratesOnlyTheFirstRequests) {
  for (const Workload w : {Workload::kAgents, Workload::kChat, Workload::kTenants}) {
    GeneratorOptions g;
    g.workload = w;
    g.requests = 500;
    g.tenants = 3;
    g.seed = 11;
    const Trace whole = generate(g);
    ASSERT_EQ(whole.requests.size(), w == Workload::kTenants ? 498u : 500u);
    for (const std::uint64_t k :
         {1ull, 2ull, 7ull, 250ull, 497ull, 498ull, 499ull, 500ull, 9000ull}) {
      SCOPED_TRACE(whole.name + " --limit " + std::to_string(k));
      g.limit = k;
      const Trace first = generate(g);
      ASSERT_EQ(first.requests.size(), std::min<std::size_t>(k, whole.requests.size()));
      std::vector<TokenId> a, b;
      for (std::size_t i = 0; i < first.requests.size(); ++i) {
        const TraceRequest& x = first.requests[i];
        const TraceRequest& y = whole.requests[i];
        EXPECT_EQ(x.timestamp_ms, y.timestamp_ms);
        EXPECT_EQ(x.input_length, y.input_length);
        EXPECT_EQ(x.output_length, y.output_length);
        EXPECT_EQ(x.cache_salt, y.cache_salt);
        synthesize_prompt(first, i, a);
        synthesize_prompt(whole, i, b);
        ASSERT_EQ(a, b) << "request " << i;
      }
    }
  }
}

// The generators keep a request's prompt as a prefix of its session's runs of fresh token ids,
// shared across the session's turns and the tenants' copies: memory per request, not per prompt
// token (20,000 agents requests took 1.85 GB when every request copied its whole context). The
// prompts are those the generators always gave (FNV-1a of every prompt, length, timestamp and
// salt, recorded before the change).
TEST(Replay, GeneratedTracesShareTheirPromptStorage) {
  struct Case {
    Workload workload;
    std::uint64_t fnv;
  };
  for (const Case c : {Case{Workload::kAgents, 0x6133ffe37d589b25ull},
                       Case{Workload::kChat, 0xb343c1d73c2a06b9ull},
                       Case{Workload::kTenants, 0x92bc617cd5f8cf6bull}}) {
    GeneratorOptions g;
    g.workload = c.workload;
    g.requests = 2000;
    g.seed = 7;
    const Trace t = generate(g);
    ASSERT_EQ(t.requests.size(), 2000u);
    std::uint64_t h = 1469598103934665603ull, prompt_tokens = 0, stored_words = 0;
    auto mix = [&](std::uint64_t x) {
      h ^= x;
      h *= 1099511628211ull;
    };
    std::vector<const std::vector<TokenRun>*> runs;
    std::vector<TokenId> out;
    for (std::size_t i = 0; i < t.requests.size(); ++i) {
      const TraceRequest& r = t.requests[i];
      synthesize_prompt(t, i, out);
      ASSERT_EQ(out.size(), r.input_length);
      for (const TokenId x : out) mix(static_cast<std::uint32_t>(x));
      mix(r.input_length);
      mix(r.output_length);
      mix(static_cast<std::uint64_t>(r.timestamp_ms));
      if (r.cache_salt) {
        for (const char ch : *r.cache_salt) mix(static_cast<unsigned char>(ch));
      }
      prompt_tokens += r.input_length;
      stored_words += r.tokens.size();
      runs.push_back(r.runs.get());
    }
    EXPECT_EQ(h, c.fnv);
    std::sort(runs.begin(), runs.end());
    runs.erase(std::unique(runs.begin(), runs.end()), runs.end());
    for (const auto* v : runs) stored_words += v == nullptr ? 0 : 2 * v->size();
    EXPECT_LT(stored_words * 100, prompt_tokens) << "prompt tokens stored per request";
  }
}

TEST(Replay, EngineModeDecodesAndPreempts) {
  GeneratorOptions g;
  g.workload = Workload::kChat;
  g.requests = 120;
  const Trace trace = generate(g);
  ReplayOptions o;
  o.mode = Mode::kEngine;
  o.num_blocks = {100001, 400};
  const auto r = run_replay(trace, o);
  std::uint64_t expected_decode = 0;
  for (const auto& q : trace.requests) expected_decode += q.output_length - 1;
  // A large pool: no preemption, every output token after the first is one decode step.
  EXPECT_EQ(r[0].preemptions, 0u);
  EXPECT_EQ(r[0].decode_tokens, expected_decode);
  EXPECT_EQ(r[0].prefill_tokens_computed + r[0].hit_tokens, r[0].prompt_tokens);
  EXPECT_GT(r[0].hit_tokens, 0u);
  // A small pool forces preemptions; every request still finishes.
  EXPECT_GT(r[1].preemptions, 0u);
  EXPECT_EQ(r[1].rejected, 0u);
  EXPECT_GE(r[1].prefill_tokens_computed + r[1].hit_tokens, r[1].prompt_tokens);
  EXPECT_GT(r[1].sim_makespan_ms, r[0].sim_makespan_ms);
  // Times derived from --step-ms are labelled simulated in the JSON; the step length is printed.
  const std::string json = to_json(r[0], o, trace);
  EXPECT_NE(json.find("\"sim_makespan_ms\":"), std::string::npos) << json;
  EXPECT_NE(json.find("\"sim_ttft_p50_ms\":"), std::string::npos) << json;
  EXPECT_NE(json.find("\"step_ms\":20.000"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"makespan_ms\""), std::string::npos) << json;
  EXPECT_EQ(json.find("\"ttft_p50_ms\""), std::string::npos) << json;
}

// Hybrid model: half the layers with a sliding window. Without eviction the window group hits
// wherever the full group does; in engine mode blocks that leave the window are released.
TEST(Replay, HybridSlidingWindow) {
  GeneratorOptions g;
  g.requests = 120;
  const Trace trace = generate(g);
  ReplayOptions full;
  full.num_blocks = {400001};
  ReplayOptions hybrid = full;
  hybrid.sliding_window = 1024;
  const auto f = run_replay(trace, full)[0];
  const auto h = run_replay(trace, hybrid)[0];
  EXPECT_GT(f.hit_tokens, 0u);
  EXPECT_EQ(h.hit_tokens, f.hit_tokens);
  EXPECT_EQ(h.out_of_window_blocks_freed, 0u);  // prompt only: nothing advances past a window

  hybrid.mode = Mode::kEngine;
  const auto e = run_replay(trace, hybrid)[0];
  EXPECT_GT(e.out_of_window_blocks_freed, 0u);
  EXPECT_GT(e.window_memory_saved_ratio, 0.05);
  EXPECT_LT(e.window_memory_saved_ratio, 0.5);  // at most the window group's half
  EXPECT_EQ(e.rejected, 0u);
}

TEST(ReplayTraces, PagedAttentionMemoryTable) {
  const std::string& path = kAzureConvTrace;
  if (!std::filesystem::exists(path)) GTEST_SKIP() << missing_trace(path);
  const Trace t = load_azure_csv(path, LoadOptions{});
  EXPECT_EQ(t.requests.size(), 19366u);
  const std::string table = memory_utilization_table(t, 16);
  EXPECT_NE(table.find("paged, block 16"), std::string::npos) << table;
}

// The paged row of the memory table comes from running the library: on a generated trace it
// equals the block arithmetic (prompt + output rounded up to whole blocks), for two block sizes.
TEST(Replay, PagedReservationIsMeasuredByTheLibrary) {
  GeneratorOptions g;
  g.workload = Workload::kChat;
  g.requests = 80;
  Trace trace = generate(g);
  trace.requests[3].output_length = 0;  // prompt only
  for (const std::uint32_t bs : {16u, 7u}) {
    std::uint64_t used = 0, reserved = 0;
    for (const auto& r : trace.requests) {
      const std::uint64_t len = std::uint64_t{r.input_length} + r.output_length;
      used += len;
      reserved += (len + bs - 1) / bs * bs;
    }
    const PagedReservation m = measure_paged_reservation(trace, bs);
    EXPECT_EQ(m.used, used);
    EXPECT_EQ(m.reserved, reserved);
    EXPECT_GT(m.reserved, m.used);
  }
  const std::string table = memory_utilization_table(trace, 16);
  EXPECT_NE(table.find("paged, block 16 (measured)"), std::string::npos) << table;
  EXPECT_NE(table.find("contiguous, max 2048 (arith.)"), std::string::npos) << table;
}

TEST(Replay, AzureCsvErrorsNameFileAndLine) {
  const std::string bad = write_temp("bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nx,1\n");
  try {
    load_azure_csv(bad, LoadOptions{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad + ":2:"), std::string::npos) << e.what();
  }
  // Line-level problems: named by line and field, skipped under --skip-bad.
  const std::string good = "2023-11-16 18:15:46.6805900,374,44";
  const BadLine cases[] = {
      {"0,4294967295,0",
       "field 'ContextTokens': 4294967295 tokens is more than the limit of "
       "16777216"},
      {"0,16777217,0", "field 'ContextTokens': 16777217 tokens is more than the limit"},
      {"0,100,4294967295", "field 'GeneratedTokens': 4294967295 tokens is more than the limit"},
      {"0,99999999999999999999999,10", "field 'ContextTokens': expected a count"},
      {",100,10", "field 'TIMESTAMP' is empty"},
      {"not-a-time,100,10", "field 'TIMESTAMP': expected a date and time"},
      {"inf,100,10", "field 'TIMESTAMP'"},
      {"1e999,100,10", "field 'TIMESTAMP'"},
      {"2023-11-16,100,10", "field 'TIMESTAMP'"},
      {"2023-11-16 18:15:46.,100,10", "field 'TIMESTAMP'"},
  };
  for (const BadLine& c : cases) {
    expect_bad_line(load_azure_csv, "bad_line.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n",
                    good, c);
  }
  // The limits and other timestamp forms are accepted.
  const std::string ok = write_temp("ok.csv",
                                    " timestamp , contexttokens,GENERATEDTOKENS\r\n"
                                    "12.5,16777216,16777216\r\n2023-11-16T18:15:46,1,0\n");
  const Trace t = load_azure_csv(ok, LoadOptions{});
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.requests[0].input_length, kMaxTraceTokens);
  EXPECT_EQ(t.requests[0].output_length, kMaxTraceTokens);
  // Line 1 must be the header (it used to be dropped unread): a whole-file error, not skipped.
  for (const std::string& first : {std::string("0,100,10"), std::string("TIMESTAMP,ContextTokens"),
                                   std::string(""), std::string("\x1b]0;title\x07\xff,1,2")}) {
    const std::string path = write_temp("nohdr.csv", first + "\n1,200,10\n2,300,10\n");
    for (const bool skip_bad : {false, true}) {
      LoadOptions o;
      o.skip_bad = skip_bad;
      try {
        load_azure_csv(path, o);
        ADD_FAILURE() << "accepted a CSV starting with '" << first << "'";
      } catch (const Error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(path + ":1: expected the header 'TIMESTAMP,ContextTokens,"
                                   "GeneratedTokens'"),
                  std::string::npos)
            << what;
        // The line is quoted with control bytes (a terminal escape here) and non-ASCII as '?'.
        EXPECT_TRUE(std::all_of(what.begin(), what.end(), [](char c) {
          return c >= 0x20 && c <= 0x7e;
        })) << what;
      }
    }
  }
}

// A line longer than kMaxTraceLineBytes (here 64 MiB of spaces without a newline, sent
// compressed as a decompression bomb would be) stops the load, also under --skip-bad: it is not
// read into memory whole.
TEST(Replay, OverlongLineStopsTheLoad) {
  const std::string good =
      R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]})";
  const std::string path = write_temp_gz(
      "long.jsonl.gz", good + "\n" + std::string(kMaxTraceLineBytes + 1, ' ') + "\n" + good + "\n");
  ASSERT_LT(std::filesystem::file_size(path), 1u << 20);
  for (const bool skip_bad : {false, true}) {
    LoadOptions o;
    o.skip_bad = skip_bad;
    try {
      load_hashid_jsonl(path, o);
      ADD_FAILURE() << "accepted a line of " << kMaxTraceLineBytes + 1 << " bytes";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path + ":2: line 2 is longer than 67108864 bytes"),
                std::string::npos)
          << e.what();
    }
  }
  // A line of exactly the limit is read (and here refused as malformed, then skipped).
  const std::string edge = write_temp_gz(
      "edge_long.jsonl.gz", good + "\n" + std::string(kMaxTraceLineBytes - 1, ' ') + "x\n" + good);
  LoadOptions skip;
  skip.skip_bad = true;
  const Trace t = load_hashid_jsonl(edge, skip);
  EXPECT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.skipped_lines, 1u);
  EXPECT_THROW(load_hashid_jsonl(edge, LoadOptions{}), Error);
}

// A host tier adds hits beyond a small GPU pool: GPU + host never falls below the GPU alone,
// write-back comes within 95% of one pool of both sizes, and the per-tier counts add up.
TEST(Replay, HostTierAddsHitsBeyondTheGpu) {
  GeneratorOptions g;
  g.requests = 300;
  const Trace trace = generate(g);
  ReplayOptions o;
  o.num_blocks = {2001};
  const double gpu_only = run_replay(trace, o)[0].hit_rate();
  o.num_blocks = {2001 + 20000};
  const double one_pool = run_replay(trace, o)[0].hit_rate();
  o.num_blocks = {2001};
  for (const HostPolicy p :
       {HostPolicy::kWriteThrough, HostPolicy::kWriteThroughSelective, HostPolicy::kWriteBack}) {
    TierReplayOptions t;
    t.host_blocks = {20000};
    t.policy = p;
    t.kv_bytes_per_token = 10;
    const auto r = run_tier_replay(trace, o, t);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].gpu_hit_tokens + r[0].host_hit_tokens, r[0].base.hit_tokens);
    EXPECT_GE(r[0].base.hit_rate(), gpu_only);
    EXPECT_EQ(r[0].loaded_bytes, r[0].host_loaded_blocks * 16 * 10);
    EXPECT_EQ(r[0].host_loaded_blocks * 16, r[0].host_hit_tokens);
    if (p == HostPolicy::kWriteBack) {
      EXPECT_GT(r[0].host_hit_tokens, 0u);
      EXPECT_GE(r[0].base.hit_rate(), 0.95 * one_pool);
    }
  }
}

// Engine mode with a host tier: hits beyond the GPU alone, per-tier counts that add up, and the
// copies charged on the simulated clock at --host-gbps (half the bandwidth, twice the time),
// labelled sim_ in the JSON.
TEST(Replay, HostTierInEngineModeChargesSimulatedTransferTime) {
  GeneratorOptions g;
  g.requests = 200;
  const Trace trace = generate(g);
  ReplayOptions o;
  o.mode = Mode::kEngine;
  o.num_blocks = {1001};
  const ReplayResult gpu_only = run_replay(trace, o)[0];
  TierReplayOptions t;
  t.host_blocks = {20000};
  t.policy = HostPolicy::kWriteBack;
  t.kv_bytes_per_token = 131072;
  t.host_gbps = 50;
  const TierReplayResult fast = run_tier_replay(trace, o, t).at(0);
  t.host_gbps = 25;
  const TierReplayResult slow = run_tier_replay(trace, o, t).at(0);
  EXPECT_EQ(fast.gpu_hit_tokens + fast.host_hit_tokens, fast.base.hit_tokens);
  EXPECT_GT(fast.host_hit_tokens, 0u);
  EXPECT_GT(fast.base.hit_tokens, gpu_only.hit_tokens);
  EXPECT_LT(fast.base.prefill_tokens_computed, gpu_only.prefill_tokens_computed);
  EXPECT_EQ(fast.loaded_bytes, fast.host_loaded_blocks * 16 * 131072);
  // Every copy is charged: bytes / bandwidth (stored_bytes counts the copies that were cached).
  const double bytes = static_cast<double>(fast.loaded_bytes + fast.stored_bytes);
  EXPECT_GT(fast.sim_transfer_ms, 0.0);
  EXPECT_GE(fast.sim_transfer_ms * (1 + 1e-9), bytes / 50e9 * 1e3);
  EXPECT_LE(fast.sim_transfer_ms, 1.01 * bytes / 50e9 * 1e3);
  // Half the bandwidth: about twice the copy time (arrivals fall into other steps, so the
  // schedules differ slightly) and a longer simulated run.
  EXPECT_NEAR(slow.sim_transfer_ms / fast.sim_transfer_ms, 2.0, 0.05);
  EXPECT_GT(slow.base.sim_makespan_ms, fast.base.sim_makespan_ms);
  t.host_gbps = 50;
  const std::string json = to_json(fast, o, t, trace);
  EXPECT_NE(json.find("\"sim_host_gbps\":50.000"), std::string::npos) << json;
  EXPECT_NE(json.find("\"sim_transfer_ms\":"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"transfer_ms\""), std::string::npos) << json;
  EXPECT_EQ(json.back(), '}');
}

}  // namespace
}  // namespace pagedkv::replay
