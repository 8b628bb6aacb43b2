// The tiny engine (examples/tiny_engine): prefix caching changes the work done, never the result.
// Each test serves a small seeded workload twice and compares greedy tokens and logits bit for
// bit; tampering with one cached value must be caught, so the comparison is not vacuous.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "cli_run.hpp"

#include "engine.hpp"
#include "model.hpp"
#ifdef TINY_ENGINE_HAS_CUDA
#include "pagedkv/cuda/device.hpp"
#endif
#include "pagedkv/device/kv_dtype.hpp"
#include "workload.hpp"

namespace tiny_engine {
namespace {

const Model& model() {
  static const Model m{ModelConfig{}};  // the default 4-layer model the CLI serves
  return m;
}

Workload small_agents() {
  WorkloadOptions o;
  o.kind = WorkloadKind::kAgents;
  o.sessions = 3;
  o.turns = 2;
  o.system_tokens = 96;
  o.min_new_tokens = 4;
  o.max_new_tokens = 8;
  return make_workload(o);
}

RunResult serve(const Workload& w, EngineConfig config, bool caching,
                PrefixHitHook hook = nullptr) {
  config.enable_caching = caching;
  Engine engine(model(), config);
  engine.set_prefix_hit_hook(std::move(hook));
  return engine.run(w);
}

// Caching off with an ample pool: the baseline every other run must reproduce.
const RunResult& baseline() {
  static const RunResult r = serve(small_agents(), EngineConfig{}, false);
  return r;
}

std::size_t generated_tokens(const RunResult& r) {
  std::size_t n = 0;
  for (const RequestResult& q : r.requests) n += q.output.size();
  return n;
}

void expect_exact(const RunResult& a, const RunResult& b) {
  const Comparison c = compare(a, b);
  EXPECT_TRUE(c.identical_tokens) << c.first_difference;
  EXPECT_TRUE(c.bitwise_identical_logits) << c.first_difference;
  EXPECT_LE(c.max_rel_logit_diff, 1e-5) << c.first_difference;
}

TEST(TinyEngine, CachingOnAndOffGiveIdenticalTokensAndLogits) {
  const Workload w = small_agents();
  const RunResult on = serve(w, EngineConfig{}, true);
  const RunResult& off = baseline();
  expect_exact(on, off);

  ASSERT_EQ(on.requests.size(), w.num_requests());
  for (const RequestResult& r : on.requests) {
    const Turn& turn = w.sessions[r.session].turns[r.turn];
    EXPECT_EQ(r.output.size(), turn.max_new_tokens);
    EXPECT_EQ(r.logits.size(), r.output.size() * static_cast<std::size_t>(4096));
  }
  // The hit prefix was not recomputed: exactly the hit tokens were saved.
  EXPECT_EQ(off.stats.hit_tokens, 0u);
  EXPECT_GT(on.stats.hit_tokens, 0u);
  EXPECT_EQ(on.stats.prefill_tokens + on.stats.hit_tokens, off.stats.prefill_tokens);
  EXPECT_EQ(on.stats.decode_tokens, off.stats.decode_tokens);
  EXPECT_EQ(on.stats.preemptions, 0u);
  // A second turn hits past its first turn's prompt: blocks completed by decode steps were
  // cached and reused, not only the shared system prompt.
  bool hit_decoded_block = false;
  for (const RequestResult& r : on.requests) {
    if (r.turn == 0) continue;
    const RequestResult& previous = on.requests[r.id - 1];
    ASSERT_EQ(previous.session, r.session);
    if (r.hit_tokens > previous.prompt_tokens) hit_decoded_block = true;
  }
  EXPECT_TRUE(hit_decoded_block);
}

TEST(TinyEngine, PreemptionUnderASmallPoolKeepsTheStreamsExact) {
  EngineConfig small;
  // 14 usable blocks for three sessions of 7-11-block contexts: both runs must preempt (the
  // workload and scheduler are deterministic; 16 blocks would spare the caching run).
  small.num_blocks = 15;
  const RunResult on = serve(small_agents(), small, true);
  const RunResult off = serve(small_agents(), small, false);
  EXPECT_GT(on.stats.preemptions, 0u);
  EXPECT_GT(off.stats.preemptions, 0u);
  EXPECT_GT(on.stats.cache.evictions, 0u);
  expect_exact(on, baseline());
  expect_exact(off, baseline());
}

TEST(TinyEngine, ARequestLargerThanThePoolIsAClearError) {
  EngineConfig tiny;
  tiny.num_blocks = 11;  // 10 usable blocks; the longest context needs 11
  try {
    serve(small_agents(), tiny, true);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
}

TEST(TinyEngine, ChunkedPrefillGivesTheSameResult) {
  EngineConfig chunked;
  chunked.max_num_batched_tokens = 7;  // prompts run 7 tokens per step, unaligned to blocks
  const RunResult on = serve(small_agents(), chunked, true);
  EXPECT_GT(on.stats.steps, baseline().stats.steps * 2);
  expect_exact(on, baseline());
}

TEST(TinyEngine, Fp16CacheAndChatWorkload) {
  WorkloadOptions o;
  o.kind = WorkloadKind::kChat;
  o.sessions = 4;
  o.system_tokens = 64;
  o.min_new_tokens = 3;
  o.max_new_tokens = 5;
  const Workload w = make_workload(o);
  EngineConfig fp16;
  fp16.kv_dtype = pagedkv::KVDtype::kFloat16;
  const RunResult on = serve(w, fp16, true);
  const RunResult off = serve(w, fp16, false);
  EXPECT_GT(on.stats.hit_tokens, 0u);
  expect_exact(on, off);
}

// Adds `delta` to one cached value of the first block of the first hit: the comparison must
// fail, or it would not be evidence of anything.
void corrupt_first_hit(bool key, float delta) {
  bool done = false;
  const RunResult on = serve(
      small_agents(), EngineConfig{}, true, [&](const pagedkv::CacheHit& hit, KVCache& cache) {
        if (done) return;
        done = true;
        auto& plane = key ? cache.k[0] : cache.v[0];
        const auto at = static_cast<std::size_t>(cache.layout.offset(hit.blocks.front(), 3, 1) + 5);
        const float x = pagedkv::dtype_bits_to_float(cache.dtype, plane[at]);
        plane[at] = pagedkv::float_to_dtype_bits(cache.dtype, x + delta);
      });
  ASSERT_TRUE(done);
  const Comparison c = compare(on, baseline());
  EXPECT_FALSE(c.bitwise_identical_logits);
  EXPECT_GT(c.max_rel_logit_diff, 1e-5);
  EXPECT_FALSE(c.first_difference.empty());
}

TEST(TinyEngine, CorruptingOneCachedKeyIsCaught) {
  corrupt_first_hit(true, 0.5f);
}
TEST(TinyEngine, CorruptingOneCachedValueIsCaught) {
  corrupt_first_hit(false, 0.5f);
}

// compare_forced (how the CUDA path is checked against this one): a run forced onto its own
// streams agrees exactly; a run whose model step differs (one corrupted cached value) is caught
// step by step although it follows the same tokens.
TEST(TinyEngine, ForcedComparisonAgreesWithItselfAndCatchesADifferentStep) {
  const Workload w = small_agents();
  Engine forced_engine(model(), EngineConfig{});
  forced_engine.force_tokens(baseline());
  const RunResult forced = forced_engine.run(w);
  const ForcedComparison same = compare_forced(baseline(), forced, 1e-5);
  EXPECT_TRUE(same.pass(1e-5)) << same.first_problem;
  EXPECT_EQ(same.steps, generated_tokens(baseline()));
  EXPECT_EQ(same.max_rel_logit_diff, 0.0);
  EXPECT_EQ(same.argmax_differences, 0u);

  bool done = false;
  Engine corrupted(model(), EngineConfig{});
  corrupted.force_tokens(baseline());
  corrupted.set_prefix_hit_hook([&](const pagedkv::CacheHit& hit, KVCache& cache) {
    if (done) return;
    done = true;
    auto& plane = cache.v[0];
    const auto at = static_cast<std::size_t>(cache.layout.offset(hit.blocks.front(), 3, 1) + 5);
    plane[at] = pagedkv::float_to_dtype_bits(
        cache.dtype, pagedkv::dtype_bits_to_float(cache.dtype, plane[at]) + 0.5f);
  });
  const RunResult bad = corrupted.run(w);
  ASSERT_TRUE(done);
  const ForcedComparison differs = compare_forced(baseline(), bad, 1e-5);
  EXPECT_TRUE(differs.same_streams);  // forced: the same tokens...
  EXPECT_FALSE(differs.pass(1e-5));   // ...but not the same model step
  EXPECT_GT(differs.max_rel_logit_diff, 1e-5);
  EXPECT_FALSE(differs.first_problem.empty());
}

int exit_code(const std::string& args) {
  const std::string command = std::string(PAGEDKV_TINY_ENGINE) + " " + args + " >/dev/null 2>&1";
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(TinyEngineCli, RejectsBadFlagsWithExitCode2) {
  EXPECT_EQ(exit_code("--help"), 0);
  EXPECT_EQ(exit_code("--bogus"), 2);
  EXPECT_EQ(exit_code("--workload nope"), 2);
  EXPECT_EQ(exit_code("--num-blocks 1"), 2);
  EXPECT_EQ(exit_code("--num-blocks x"), 2);
  EXPECT_EQ(exit_code("--kv-dtype fp8"), 2);
  EXPECT_EQ(exit_code("--sessions"), 2);
  EXPECT_EQ(exit_code("--compare --no-caching"), 2);
  EXPECT_EQ(exit_code("--device gpu"), 2);
  EXPECT_EQ(exit_code("--check-against-cpu"), 2);  // needs --device cuda
  EXPECT_EQ(exit_code("--head-dim 12"), 2);
  EXPECT_EQ(exit_code("--head-dim 264"), 2);
  // The attention-kernel flags (their messages: tiny_engine_cli_rejects_*_kernel_* ctests).
  EXPECT_EQ(exit_code("--decode-kernel foo"), 2);
  EXPECT_EQ(exit_code("--extend-kernel foo"), 2);
  EXPECT_EQ(exit_code("--device cuda --extend-kernel foo"), 2);
  EXPECT_EQ(exit_code("--decode-kernel"), 2);
  EXPECT_EQ(exit_code("--extend-kernel"), 2);
  EXPECT_EQ(exit_code("--decode-kernel simt"), 2);  // the CPU path: needs --device cuda
  EXPECT_EQ(exit_code("--extend-kernel fa2 --device cpu"), 2);
}

// EngineConfig's kernel variants are pagedkv::DecodeKernel / ExtendKernel values (every one the
// library has: the CUDA path casts them) or -1; anything else is refused with a message.
TEST(TinyEngineConfig, KernelVariantValues) {
  for (const int decode : {-1, 0, 1, 2, 3, 5}) {
    EngineConfig c;
    c.decode_kernel = decode;
    EXPECT_NO_THROW(c.validate()) << "decode_kernel " << decode;
  }
  for (const int extend : {-1, 0, 1, 2, 3, 4, 5, 6, 7, 8}) {
    EngineConfig c;
    c.extend_kernel = extend;
    EXPECT_NO_THROW(c.validate()) << "extend_kernel " << extend;
  }
  // Decode: 4 (kTensorCoreFusedMerge needs split counters the engine does not keep) and 6 (past
  // the range); extend's first value past its range is 9.
  for (const int bad : {-2, 4, 6}) {
    EngineConfig c;
    c.decode_kernel = bad;
    try {
      c.validate();
      ADD_FAILURE() << "decode_kernel " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("tensor_core_fp8"), std::string::npos) << e.what();
    }
    EngineConfig x;
    x.extend_kernel = bad >= 4 ? 9 : bad;
    try {
      x.validate();
      ADD_FAILURE() << "extend_kernel " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("fa2_lean"), std::string::npos) << e.what();
    }
  }
}

// Runs the CLI, returns its exit status and its stdout + stderr.
int run_cli(const std::string& args, std::string& output) {
  const auto run = pagedkv::test::run_cli(PAGEDKV_TINY_ENGINE, args);
  output += run.output;
  return run.exit_code;
}

// Without a GPU (or in a build without CUDA) --device cuda fails at once with a message that
// says why, and a non-zero exit. On a GPU machine the CUDA path itself is tested by
// tiny_engine_cuda_test (label gpu) and scripts/gpu-check.
TEST(TinyEngineCli, DeviceCudaWithoutAGpuFailsClearly) {
#ifdef TINY_ENGINE_HAS_CUDA
  if (pagedkv::cuda_device_count() > 0) {
    GTEST_SKIP() << "a CUDA device is visible: --device cuda runs here (see tiny_engine_cuda_test)";
  }
  const char* expected = "no CUDA device is visible";
#else
  const char* expected = "no CUDA support";
#endif
  for (const char* args : {"--device cuda", "--device cuda --compare --check-against-cpu --json"}) {
    std::string output;
    EXPECT_EQ(run_cli(args, output), 1) << output;
    EXPECT_NE(output.find("pagedkv-tiny-engine: --device cuda: "), std::string::npos) << output;
    EXPECT_NE(output.find(expected), std::string::npos) << output;
  }
}

// The CPU path runs the model shape the CUDA kernels take (--head-dim 64): same proof.
TEST(TinyEngineCli, HeadDim64OnTheCpu) {
  std::string output;
  EXPECT_EQ(run_cli("--compare --json --head-dim 64 --workload chat --sessions 2 "
                    "--system-tokens 32",
                    output),
            0)
      << output;
  EXPECT_NE(output.find("KV heads of 64"), std::string::npos) << output;
  EXPECT_NE(output.find("\"device\":\"cpu\""), std::string::npos) << output;
  EXPECT_NE(output.find("\"pass\":true"), std::string::npos) << output;
}

TEST(TinyEngineCli, CompareJsonReportsTheProof) {
  const auto run = pagedkv::test::run_cli(
      PAGEDKV_TINY_ENGINE, "--compare --json --workload chat --sessions 3 --system-tokens 48");
  const std::string& out = run.output;
  EXPECT_EQ(run.exit_code, 0) << out;
  for (const char* field :
       {"\"identical_tokens\":true", "\"max_rel_logit_diff\":0,", "\"caching_rule\":\"exact\"",
        "\"caching_decided_by\":\"free_running\"", "\"caching_pass\":true",
        "\"caching_forced_run\":false", "\"prefill_tokens_saved\":", "\"prefill_seconds_on\":",
        "\"prefill_seconds_off\":", "\"ttft_p50_on\":", "\"ttft_p50_off\":", "\"pass\":true"}) {
    EXPECT_NE(out.find(field), std::string::npos) << field << " missing from " << out;
  }
  // The CPU rule is exact: no forced run, so no forced figures.
  EXPECT_EQ(out.find("caching_forced_steps"), std::string::npos) << out;
  EXPECT_EQ(out.front(), '{');
  EXPECT_EQ(out.find('\n'), out.size() - 1);  // one line, one object
}

}  // namespace
}  // namespace tiny_engine
