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
  struct Case {
    std::string line, fragment;
  };
  const Case cases[] = {
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
  };
  for (const Case& c : cases) {
    const std::string path = write_temp("bad.jsonl", good + "\n" + c.line + "\n" + good + "\n");
    try {
      load_hashid_jsonl(path, LoadOptions{});
      ADD_FAILURE() << "accepted: " << c.line;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path + ":2:"), std::string::npos) << what;
      EXPECT_NE(what.find(c.fragment), std::string::npos) << what;
    }
    LoadOptions skip;
    skip.skip_bad = true;
    const Trace t = load_hashid_jsonl(path, skip);
    EXPECT_EQ(t.requests.size(), 2u);
    EXPECT_EQ(t.skipped_lines, 1u);
  }
  EXPECT_THROW(load_hashid_jsonl("/nonexistent/trace.jsonl", LoadOptions{}), Error);
  // Unknown fields of any JSON type are ignored.
  const std::string extra = write_temp(
      "extra.jsonl", R"({"session": {"id": "a", "t": [1, {"x": null}]}, "timestamp": 1.5, )"
                     R"("input_length": 10, "output_length": 1, "hash_ids": [7], "ok": true})");
  EXPECT_EQ(load_hashid_jsonl(extra, LoadOptions{}).requests.size(), 1u);
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
  // Azure CSV, compressed.
  const std::string csv =
      write_temp_gz("azure.csv.gz", "TIMESTAMP,ContextTokens,GeneratedTokens\nx,17,4\ny,3,9\n");
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
  for (std::size_t i = 0; i < 60; ++i) EXPECT_EQ(a1.requests[i].tokens, a2.requests[i].tokens);
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
