// pagedkv-tiny-engine --remote redis://...: two engine processes run one after the other on the
// same workload against one redis-server started on 127.0.0.1 (tests/util/redis_servers.hpp). The
// first computes the prefill and writes its blocks through to Redis; the second loads them
// instead: far fewer prefill tokens computed, remote hits, and its greedy tokens and logits are
// still bit-identical to caching off (--compare). A Redis that is down (nothing listens on the
// port) is a run with misses: it completes, with 0 remote hits and the same bits. Without
// redis-server the tests report themselves skipped.
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_run.hpp"
#include "engine.hpp"
#include "redis_servers.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// A small agents workload: 4 sessions of 2 turns sharing a 96-token system prompt.
constexpr const char* kWorkload = "--sessions 4 --turns 2 --system-tokens 96";

using Cli = pagedkv::test::CliRun;

Cli run_engine(const std::string& args) {
  return pagedkv::test::run_cli(PAGEDKV_TINY_ENGINE, args);
}
long long field(const std::string& json, const std::string& name) {
  return pagedkv::test::json_uint(json, name);
}
bool has(const std::string& json, const std::string& text) {
  return pagedkv::test::contains(json, text);
}

std::string engine_args(std::uint16_t port, const std::string& ns) {
  return std::string("--compare --json ") + kWorkload +
         " --host-blocks 256 --host-policy write_through --remote redis://127.0.0.1:" +
         std::to_string(port) + "/" + ns;
}

class TinyEngineRemote : public ::testing::Test {
 protected:
  void SetUp() override {
    if (pagedkv::test::RedisServer::binary().empty()) {
      GTEST_SKIP() << "redis-server not installed (Debian: redis-server): remote tests skipped";
    }
  }
};

TEST_F(TinyEngineRemote, SecondProcessLoadsTheFirstOnesBlocksWithIdenticalResults) {
  pagedkv::test::RedisServer server;
  ASSERT_TRUE(server.start());
  const std::string args = engine_args(server.port(), "tiny-engine-test");

  const Cli first = run_engine(args);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const Cli second = run_engine(args);
  ASSERT_EQ(second.exit_code, 0) << second.output;

  for (const Cli* run : {&first, &second}) {
    const std::string& j = run->output;
    EXPECT_TRUE(has(j, "\"identical_tokens\":true")) << j;
    EXPECT_TRUE(has(j, "\"bitwise_identical_logits\":true")) << j;
    EXPECT_TRUE(has(j, "\"pass\":true")) << j;
    EXPECT_TRUE(has(j, "\"remote_namespace_on\":\"tiny-engine-test\"")) << j;
    EXPECT_TRUE(has(j, "\"remote_drained_on\":true")) << j;
    EXPECT_EQ(field(j, "remote_rejected_values_on"), 0) << j;
  }
  // The first process wrote its blocks through to Redis.
  EXPECT_GT(field(first.output, "remote_stored_blocks_on"), 0) << first.output;
  // The second loaded them: remote hits, and less than half the first one's prefill computed.
  const long long p1 = field(first.output, "prefill_tokens_computed_on");
  const long long p2 = field(second.output, "prefill_tokens_computed_on");
  ASSERT_GT(p1, 0) << first.output;
  ASSERT_GE(p2, 0) << second.output;
  EXPECT_LT(2 * p2, p1) << "first " << p1 << ", second " << p2 << "\n" << second.output;
  EXPECT_GT(field(second.output, "remote_hit_blocks_on"), 0) << second.output;
  EXPECT_GT(field(second.output, "remote_hit_tokens_on"), 0) << second.output;
  // Caching off computes every prompt token in both: the comparison baseline is the same.
  EXPECT_EQ(field(first.output, "prefill_tokens_computed_off"),
            field(second.output, "prefill_tokens_computed_off"));
}

// Issue 41: between the two processes every stored value is moved to another block's key (each
// key holds a genuine value, header and checksum intact). The second process must not compute
// with those bytes: every get of a misplaced value is a counted rejection, and its tokens and
// logits stay bit-identical to caching off.
TEST_F(TinyEngineRemote, ValuesRotatedAmongKeysBetweenProcessesAreRejected) {
  pagedkv::test::RedisServer server;
  ASSERT_TRUE(server.start());
  const std::string args = engine_args(server.port(), "rotated");
  const Cli first = run_engine(args);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_GT(field(first.output, "remote_stored_blocks_on"), 1) << first.output;

  pagedkv::test::Client client(server.port());
  const auto keys = client.keys("rotated/*");
  ASSERT_TRUE(keys.has_value());
  ASSERT_GT(keys->size(), 1u);
  std::vector<std::string> values;
  for (const std::string& k : *keys) {
    const auto v = client.command({"GET", k});
    ASSERT_TRUE(v.has_value() && *v != "(nil)") << k;
    values.push_back(*v);
  }
  for (std::size_t i = 0; i < keys->size(); ++i) {
    ASSERT_EQ(client.command({"SET", (*keys)[i], values[(i + 1) % keys->size()]}), "OK");
  }

  const Cli second = run_engine(args);
  const std::string& j = second.output;
  ASSERT_EQ(second.exit_code, 0) << j;
  EXPECT_TRUE(has(j, "\"identical_tokens\":true")) << j;
  EXPECT_TRUE(has(j, "\"bitwise_identical_logits\":true")) << j;
  EXPECT_TRUE(has(j, "\"pass\":true")) << j;
  EXPECT_GT(field(j, "remote_probed_blocks_on"), 0) << j;
  EXPECT_EQ(field(j, "remote_hit_blocks_on"), 0) << j;
  EXPECT_GT(field(j, "remote_rejected_values_on"), 0) << j;
  EXPECT_EQ(field(j, "remote_binding_mismatches_on"), field(j, "remote_rejected_values_on")) << j;
}

TEST_F(TinyEngineRemote, ANamespaceIsSeparate) {
  pagedkv::test::RedisServer server;
  ASSERT_TRUE(server.start());
  const Cli first = run_engine(engine_args(server.port(), "ns-a"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const Cli other = run_engine(engine_args(server.port(), "ns-b"));
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_EQ(field(other.output, "remote_hit_blocks_on"), 0) << other.output;
  // No saving from the other namespace's blocks (admission timing may move a few GPU hits).
  EXPECT_GE(2 * field(other.output, "prefill_tokens_computed_on"),
            field(first.output, "prefill_tokens_computed_on"))
      << other.output;
}

TEST_F(TinyEngineRemote, RedisDownCompletesWithMissesAndIdenticalResults) {
  // A port nobody listens on: every connect is refused.
  const std::uint16_t port = pagedkv::test::free_port();
  const Cli run = run_engine(engine_args(port, "nobody-home"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string& j = run.output;
  EXPECT_TRUE(has(j, "\"bitwise_identical_logits\":true")) << j;
  EXPECT_TRUE(has(j, "\"pass\":true")) << j;
  EXPECT_EQ(field(j, "remote_hit_blocks_on"), 0) << j;
  EXPECT_EQ(field(j, "remote_stored_blocks_on"), 0) << j;
  EXPECT_GT(field(j, "remote_store_errors_on") + field(j, "remote_puts_failed_on") +
                field(j, "remote_puts_skipped_on"),
            0)
      << j;
  // No hang: each request waits at most RemoteLink::kTimeout (1 s) and the exit drain at most
  // 10 s; the whole process stays far below what 8 requests x 1 s + 10 s would allow to add up to.
  EXPECT_LT(run.seconds, 60.0) << j;
}

TEST(TinyEngineRemoteConfig, NeedsAHostTier) {
  tiny_engine::EngineConfig c;
  c.remote_url = "redis://127.0.0.1:6379/x";
  EXPECT_THROW(c.validate(), std::invalid_argument);
  c.num_host_blocks = 8;
  EXPECT_NO_THROW(c.validate());
}

TEST(TinyEngineRemoteCli, Flags) {
  EXPECT_EQ(run_engine("--remote redis://127.0.0.1:1/x").exit_code, 2);  // needs --host-blocks
  EXPECT_EQ(run_engine("--host-blocks 8 --remote http://127.0.0.1/x").exit_code, 2);
  EXPECT_EQ(run_engine("--host-blocks 8 --remote redis://127.0.0.1:6379").exit_code, 2);
}

}  // namespace
