// The tiny engine with an FP8 KV cache (issue 36): prefix caching on and off give bit-identical
// tokens and logits (also through the host tier, whose copies must carry each block's scales),
// the FP8 path really runs (its logits differ from bf16 KV, within a loose bound), and one
// corrupted cached scale is caught. Per-tensor scales (--kv-scale-mode per_tensor): the same
// identity, the engine's per-layer scales are the calibration's and are really used.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "cli_run.hpp"

#include "calibrate.hpp"
#include "engine.hpp"
#include "model.hpp"
#include "pagedkv/device/kv_dtype.hpp"
#include "workload.hpp"

namespace tiny_engine {
namespace {

const Model& model() {
  static const Model m{ModelConfig{}};
  return m;
}

// Small: 3 sessions of 2 turns. Not small: 4 sessions of 3 turns (the host-tier test's, which a
// 16-block pool cannot hold, so later turns load blocks back from the host tier).
Workload agents(bool small = true) {
  WorkloadOptions o;
  o.kind = WorkloadKind::kAgents;
  o.sessions = small ? 3 : 4;
  o.turns = small ? 2 : 3;
  o.system_tokens = 96;
  if (small) {
    o.min_new_tokens = 4;
    o.max_new_tokens = 8;
  }
  return make_workload(o);
}

RunResult serve(EngineConfig config, bool caching, PrefixHitHook hook = nullptr,
                const RunResult* force = nullptr, bool small = true) {
  config.enable_caching = caching;
  Engine engine(model(), config);
  engine.set_prefix_hit_hook(std::move(hook));
  if (force != nullptr) engine.force_tokens(*force);
  return engine.run(agents(small));
}

EngineConfig fp8(pagedkv::KVDtype dtype) {
  EngineConfig c;
  c.kv_dtype = dtype;
  return c;
}

EngineConfig per_tensor(pagedkv::KVDtype dtype) {
  EngineConfig c = fp8(dtype);
  c.kv_scale_mode = pagedkv::KVScaleMode::kPerTensor;
  return c;
}

void expect_exact(const RunResult& a, const RunResult& b) {
  const Comparison c = compare(a, b);
  EXPECT_TRUE(c.identical_tokens) << c.first_difference;
  EXPECT_TRUE(c.bitwise_identical_logits) << c.first_difference;
}

TEST(TinyEngineFp8, CachingOnAndOffGiveIdenticalTokensAndLogits) {
  for (const pagedkv::KVDtype dtype : {pagedkv::KVDtype::kFp8E4M3, pagedkv::KVDtype::kFp8E5M2}) {
    SCOPED_TRACE(pagedkv::to_string(dtype));
    const RunResult on = serve(fp8(dtype), true);
    const RunResult off = serve(fp8(dtype), false);
    EXPECT_GT(on.stats.hit_tokens, 0u);
    expect_exact(on, off);
  }
}

TEST(TinyEngineFp8, HostTierLoadsCarryTheScales) {
  // A pool too small for the shared prefix and every context: later turns load blocks back
  // from the host tier. A load that dropped or misplaced the per-row scales would change logits.
  EngineConfig c = fp8(pagedkv::KVDtype::kFp8E4M3);
  c.num_blocks = 16;
  c.max_num_seqs = 2;
  const RunResult off = serve(c, false, nullptr, nullptr, false);
  c.num_host_blocks = 64;
  const RunResult on = serve(c, true, nullptr, nullptr, false);
  EXPECT_GT(on.stats.host_hit_tokens, 0u);
  expect_exact(on, off);
}

TEST(TinyEngineFp8, DiffersFromBf16KvWithinABound) {
  const RunResult e4m3 = serve(fp8(pagedkv::KVDtype::kFp8E4M3), true);
  const RunResult bf16 = serve(EngineConfig{}, true, nullptr, &e4m3);  // on E4M3's tokens
  const ForcedComparison f = compare_forced(e4m3, bf16, 1.0);
  ASSERT_TRUE(f.same_streams);
  EXPECT_GT(f.steps, 0u);
  // Quantized K/V change the logits (the FP8 path runs), but not by much: per-row E4M3 scales
  // keep each K/V value within 2^-4 relative. The measured figure is in bench/results/fp8.md.
  EXPECT_GT(f.max_rel_logit_diff, 1e-6);
  EXPECT_LT(f.max_rel_logit_diff, 0.1);
  std::printf(
      "E4M3 vs bf16 KV on the same tokens: %zu steps, max relative logit diff %.3g, "
      "greedy choices differ at %zu steps\n",
      f.steps, f.max_rel_logit_diff, f.argmax_differences);
}

TEST(TinyEngineFp8, CorruptingOneCachedScaleIsCaught) {
  const EngineConfig c = fp8(pagedkv::KVDtype::kFp8E4M3);
  const RunResult off = serve(c, false);
  for (const bool key : {true, false}) {
    bool done = false;
    const RunResult on = serve(c, true, [&](const pagedkv::CacheHit& hit, KVCache& cache) {
      if (done) return;
      done = true;
      auto* bytes = reinterpret_cast<unsigned char*>((key ? cache.k[0] : cache.v[0]).data());
      const auto at =
          static_cast<std::size_t>(cache.layout.scale_byte_offset(hit.blocks.front(), 3, 1));
      float scale;
      std::memcpy(&scale, bytes + at, sizeof scale);
      scale *= 1.5f;
      std::memcpy(bytes + at, &scale, sizeof scale);
    });
    ASSERT_TRUE(done);
    const Comparison cmp = compare(on, off);
    EXPECT_FALSE(cmp.bitwise_identical_logits) << (key ? "K" : "V");
  }
}

// E4M3 here; E5M2 per-tensor through the CLI's --compare below.
TEST(TinyEngineFp8PerTensor, CachingOnAndOffGiveIdenticalTokensAndLogits) {
  const RunResult on = serve(per_tensor(pagedkv::KVDtype::kFp8E4M3), true);
  const RunResult off = serve(per_tensor(pagedkv::KVDtype::kFp8E4M3), false);
  EXPECT_GT(on.stats.hit_tokens, 0u);
  expect_exact(on, off);
}

TEST(TinyEngineFp8PerTensor, ScalesAreTheCalibrationsAndBlocksHoldCodesOnly) {
  const KVScales s = calibrate_kv_scales(model(), pagedkv::Fp8Format::kE4M3);
  ASSERT_EQ(s.k.size(), static_cast<std::size_t>(model().config().num_layers));
  const KVScales again = calibrate_kv_scales(model(), pagedkv::Fp8Format::kE4M3);
  EXPECT_EQ(s.k, again.k);  // a pure function of the model
  EXPECT_EQ(s.v, again.v);
  const KVScales e5m2 = calibrate_kv_scales(model(), pagedkv::Fp8Format::kE5M2);
  for (std::size_t l = 0; l < s.k.size(); ++l) {
    EXPECT_TRUE(pagedkv::fp8_scale_is_valid(s.k[l]) && pagedkv::fp8_scale_is_valid(s.v[l]));
    // The same amax over each format's largest finite value (448 vs 57344 = 128 x 448).
    EXPECT_NEAR(s.k[l] / e5m2.k[l], 128.0, 128.0 * 1e-6) << l;
    EXPECT_NEAR(s.v[l] / e5m2.v[l], 128.0, 128.0 * 1e-6) << l;
  }
  EXPECT_NE(s.k, calibrate_kv_scales(model(), pagedkv::Fp8Format::kE4M3, 64).k);  // depends on it

  Engine engine(model(), per_tensor(pagedkv::KVDtype::kFp8E4M3));
  EXPECT_EQ(engine.config().k_scales, s.k);
  EXPECT_EQ(engine.config().v_scales, s.v);
  bool checked = false;
  engine.set_prefix_hit_hook([&](const pagedkv::CacheHit&, KVCache& cache) {
    checked = true;
    EXPECT_EQ(cache.scale_mode, pagedkv::KVScaleMode::kPerTensor);
    EXPECT_EQ(cache.layout.scale_offset, 0);  // no per-row scales in the blocks
    EXPECT_EQ(cache.k_scales, s.k);
  });
  (void)engine.run(agents());
  EXPECT_TRUE(checked);
}

TEST(TinyEngineFp8PerTensor, GivenScalesAreUsedAndDifferFromPerRow) {
  const RunResult calibrated = serve(per_tensor(pagedkv::KVDtype::kFp8E4M3), true);
  // A per-row run on the same tokens: a different quantization, so different logits.
  const RunResult per_row = serve(fp8(pagedkv::KVDtype::kFp8E4M3), true, nullptr, &calibrated);
  const ForcedComparison rows = compare_forced(calibrated, per_row, 1.0);
  ASSERT_TRUE(rows.same_streams);
  EXPECT_GT(rows.max_rel_logit_diff, 1e-6);
  // Scales given by the engine author replace the calibration: doubling layer 1's V scale
  // changes the logits.
  EngineConfig given = per_tensor(pagedkv::KVDtype::kFp8E4M3);
  const KVScales s = calibrate_kv_scales(model(), pagedkv::Fp8Format::kE4M3);
  given.k_scales = s.k;
  given.v_scales = s.v;
  const RunResult same = serve(given, true);
  expect_exact(same, calibrated);
  given.v_scales[1] *= 2;
  const RunResult changed = serve(given, true, nullptr, &calibrated);
  EXPECT_FALSE(compare(changed, calibrated).bitwise_identical_logits);
  // Bad scales are refused.
  given.v_scales[1] = 0;
  EXPECT_THROW(Engine(model(), given), std::invalid_argument);
  given.v_scales = {1.0f};
  EXPECT_THROW(Engine(model(), given), std::invalid_argument);
}

TEST(TinyEngineFp8PerTensor, DiffersFromBf16KvWithinABound) {
  const RunResult e4m3 = serve(per_tensor(pagedkv::KVDtype::kFp8E4M3), true);
  const RunResult bf16 = serve(EngineConfig{}, true, nullptr, &e4m3);
  const ForcedComparison f = compare_forced(e4m3, bf16, 1.0);
  ASSERT_TRUE(f.same_streams);
  EXPECT_GT(f.steps, 0u);
  EXPECT_GT(f.max_rel_logit_diff, 1e-6);
  EXPECT_LT(f.max_rel_logit_diff, 0.1);
  std::printf(
      "E4M3 per-tensor vs bf16 KV on the same tokens: %zu steps, max relative logit "
      "diff %.3g, greedy choices differ at %zu steps\n",
      f.steps, f.max_rel_logit_diff, f.argmax_differences);
}

int run_cli(const std::string& args, std::string& output) {
  const auto run = pagedkv::test::run_cli(PAGEDKV_TINY_ENGINE, args);
  output += run.output;
  return run.exit_code;
}

TEST(TinyEngineFp8Cli, CompareAndVsBf16) {
  std::string out;
  EXPECT_EQ(run_cli("--kv-dtype fp8_e4m3 --compare --vs-bf16 --json --sessions 2 --turns 2", out),
            0)
      << out;
  for (const char* field : {"\"kv_dtype\":\"fp8_e4m3\"", "\"bitwise_identical_logits\":true",
                            "\"bf16_forced_max_rel_logit_diff\":", "\"pass\":true"}) {
    EXPECT_NE(out.find(field), std::string::npos) << field << " in " << out;
  }
  out.clear();
  EXPECT_EQ(run_cli("--vs-bf16", out), 2) << out;  // needs an FP8 dtype
  out.clear();
  EXPECT_EQ(run_cli("--kv-dtype fp8_e5m3", out), 2) << out;
  out.clear();
  EXPECT_EQ(run_cli("--kv-scale-mode per_tensor", out), 2) << out;  // needs an FP8 dtype
  out.clear();
  EXPECT_EQ(run_cli("--kv-dtype fp8_e4m3 --kv-scale-mode none", out), 2) << out;
}

TEST(TinyEngineFp8Cli, PerTensorCompareAndVsBf16) {
  std::string out;
  EXPECT_EQ(run_cli("--kv-dtype fp8_e5m2 --kv-scale-mode per_tensor --compare --vs-bf16 --json "
                    "--sessions 2 --turns 2",
                    out),
            0)
      << out;
  for (const char* field : {"\"kv_dtype\":\"fp8_e5m2\"", "\"kv_scale_mode\":\"per_tensor\"",
                            "\"bitwise_identical_logits\":true",
                            "\"bf16_forced_max_rel_logit_diff\":", "\"pass\":true"}) {
    EXPECT_NE(out.find(field), std::string::npos) << field << " in " << out;
  }
}

}  // namespace
}  // namespace tiny_engine
