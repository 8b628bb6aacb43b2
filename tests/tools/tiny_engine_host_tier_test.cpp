// The tiny engine with a host-memory tier (examples/tiny_engine/kv_driver.hpp): with a KV pool too
// small for the workload's shared prefixes, the host tier saves more prefill tokens than the pool
// alone while greedy tokens and logits stay bit-identical to caching off; the loads really copy
// K/V through the host buffer (corrupting one host byte of a loaded slot changes a logit).
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "cli_run.hpp"

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

// Four agent sessions of three turns share a 96-token system prompt; 15 usable blocks of 16
// tokens cannot keep it and every session's context, so the pool evicts blocks that later turns
// need again.
Workload agents() {
  WorkloadOptions o;
  o.kind = WorkloadKind::kAgents;
  o.sessions = 4;
  o.turns = 3;
  o.system_tokens = 96;
  return make_workload(o);
}

EngineConfig small_pool(bool caching, std::int32_t host_blocks, pagedkv::HostPolicy policy) {
  EngineConfig c;
  c.num_blocks = 16;
  c.max_num_seqs = 2;
  c.enable_caching = caching;
  c.num_host_blocks = host_blocks;
  c.host_policy = policy;
  return c;
}

RunResult serve(const EngineConfig& config, HostLoadHook hook = nullptr) {
  Engine engine(model(), config);
  engine.set_host_load_hook(std::move(hook));
  return engine.run(agents());
}

const RunResult& caching_off() {
  static const RunResult r = serve(small_pool(false, 0, pagedkv::HostPolicy::kWriteBack));
  return r;
}

const RunResult& gpu_only() {
  static const RunResult r = serve(small_pool(true, 0, pagedkv::HostPolicy::kWriteBack));
  return r;
}

void expect_exact(const RunResult& a, const RunResult& b) {
  const Comparison c = compare(a, b);
  EXPECT_TRUE(c.identical_tokens) << c.first_difference;
  EXPECT_TRUE(c.bitwise_identical_logits) << c.first_difference;
  EXPECT_EQ(c.max_rel_logit_diff, 0.0) << c.first_difference;
}

class HostTier : public ::testing::TestWithParam<pagedkv::HostPolicy> {};

TEST_P(HostTier, SavesMorePrefillTokensWithIdenticalResults) {
  const RunResult tiered = serve(small_pool(true, 64, GetParam()));
  const RunResult& off = caching_off();
  expect_exact(tiered, off);
  expect_exact(gpu_only(), off);
  ASSERT_TRUE(tiered.stats.host.has_value());
  EXPECT_FALSE(gpu_only().stats.host.has_value());
  const pagedkv::TierStats& h = *tiered.stats.host;
  if (GetParam() == pagedkv::HostPolicy::kWriteThroughSelective) {
    // A block is stored only after two GPU hits: whatever it adds, the results stay exact.
    EXPECT_LE(tiered.stats.prefill_tokens, off.stats.prefill_tokens);
    return;
  }
  EXPECT_GT(gpu_only().stats.cache.evictions, 0u);  // the pool alone is too small
  EXPECT_GT(tiered.stats.host_hit_tokens, 0u);
  EXPECT_GT(h.loaded_blocks, 0u);
  EXPECT_EQ(h.loaded_blocks * 16, tiered.stats.host_hit_tokens);
  EXPECT_GT(h.stored_blocks, 0u);
  EXPECT_EQ(h.load_failures, 0u);
  // One block: 4 layers x (K and V) x 16 tokens x 2 KV heads x 32 dims x 2 bytes.
  EXPECT_EQ(h.loaded_bytes, h.loaded_blocks * 4 * 2 * 16 * 2 * 32 * 2);
  // The host tier saves prefill work beyond the GPU pool alone.
  EXPECT_LT(tiered.stats.prefill_tokens, gpu_only().stats.prefill_tokens);
}

INSTANTIATE_TEST_SUITE_P(Policies, HostTier,
                         ::testing::Values(pagedkv::HostPolicy::kWriteBack,
                                           pagedkv::HostPolicy::kWriteThrough,
                                           pagedkv::HostPolicy::kWriteThroughSelective),
                         [](const auto& p) { return std::string(pagedkv::to_string(p.param)); });

// Flips one bit of the high byte (sign and exponent) of one non-zero K or V value in the first
// loaded host slot, just before the load runs: the loaded K/V comes from the host buffer, so a
// logit must change. Without the flip (same hook, nothing changed) the results stay exact.
void corrupt_first_load(std::size_t chunk, bool flip) {
  bool done = false;
  const RunResult r =
      serve(small_pool(true, 64, pagedkv::HostPolicy::kWriteBack),
            [&](const pagedkv::TransferPlan& plan, std::span<std::byte> host,
                const pagedkv::TransferLayout& layout) {
              if (done) return;
              done = true;
              ASSERT_FALSE(plan.loads.empty());
              const std::size_t at =
                  static_cast<std::size_t>(plan.loads.front().src) * layout.block_bytes() +
                  chunk * layout.chunk_bytes + 2 * 37;  // one bf16 value
              std::uint16_t bits = 0;
              std::memcpy(&bits, host.data() + at, 2);
              ASSERT_NE(bits & 0x7fff, 0) << "pick a non-zero value";
              if (flip) host[at + 1] ^= std::byte{0x01};  // little-endian: the high byte
            });
  ASSERT_TRUE(done);
  const Comparison c = compare(r, caching_off());
  if (!flip) {
    EXPECT_TRUE(c.bitwise_identical_logits) << c.first_difference;
    return;
  }
  EXPECT_FALSE(c.bitwise_identical_logits);
  EXPECT_GT(c.max_rel_logit_diff, 0.0);
  EXPECT_FALSE(c.first_difference.empty());
}

TEST(HostTierProof, UntouchedHostBufferKeepsTheResultsExact) {
  corrupt_first_load(1, false);
}
TEST(HostTierProof, CorruptingOneHostByteOfALoadedValueIsCaught) {
  corrupt_first_load(1, true);  // V of layer 0
}
TEST(HostTierProof, CorruptingOneHostByteOfALoadedKeyIsCaught) {
  corrupt_first_load(6, true);  // K of layer 3
}

TEST(HostTierConfig, RejectsTheCudaPathAndNegativeSizes) {
  EngineConfig c;
  c.num_host_blocks = 8;
  c.device = Device::kCuda;
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.device = Device::kCpu;
  c.num_host_blocks = -1;
  EXPECT_THROW(c.validate(), std::invalid_argument);
}

int run_cli(const std::string& args, std::string& output) {
  const auto run = pagedkv::test::run_cli(PAGEDKV_TINY_ENGINE, args);
  output += run.output;
  return run.exit_code;
}

TEST(HostTierCli, FlagsAndJson) {
  std::string out;
  EXPECT_EQ(run_cli("--host-blocks 8 --device cuda", out), 2) << out;
  EXPECT_EQ(run_cli("--host-blocks 8 --no-caching", out), 2) << out;
  EXPECT_EQ(run_cli("--host-policy lru", out), 2) << out;
  EXPECT_EQ(run_cli("--host-blocks x", out), 2) << out;
  out.clear();
  ASSERT_EQ(run_cli("--compare --json --sessions 4 --turns 3 --system-tokens 96 --num-blocks 16 "
                    "--max-seqs 2 --host-blocks 64 --host-policy write_back",
                    out),
            0)
      << out;
  for (const char* field :
       {"\"host_blocks\":64", "\"host_policy\":\"write_back\"", "\"host_hit_tokens_on\":",
        "\"host_loaded_blocks_on\":", "\"bitwise_identical_logits\":true", "\"pass\":true"}) {
    EXPECT_NE(out.find(field), std::string::npos) << field << " missing from " << out;
  }
  EXPECT_EQ(out.find("\"host_hit_tokens_on\":0,"), std::string::npos) << out;
}

}  // namespace
}  // namespace tiny_engine
