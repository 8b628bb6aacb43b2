// pagedkv-replay --engines K --remote redis://...: a cluster of engines sharing one redis-server
// (started by the test on 127.0.0.1, tests/util/redis_servers.hpp) through RemoteTier. On a small
// generated workload whose engines share prefixes: the cluster hit rate with the shared tier is
// at least the one without it (reported by the same run), remote hits are > 0, every placeholder
// payload read back is right, and two runs on fresh namespaces give the same figures (each
// request's remote work is completed before the next). With nothing listening on the port the
// replay completes with 0 remote hits and counted errors. Without redis-server: SKIPPED.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "cli_run.hpp"
#include "redis_servers.hpp"

namespace {

// 200 agent requests (shared system prompts and growing contexts) over 4 engines round robin:
// an engine sees other engines' prefixes only through the shared tier.
constexpr const char* kCluster =
    "--generate agents --requests 200 --num-blocks 3000 --engines 4 --router round_robin";

using Cli = pagedkv::test::CliRun;
using pagedkv::test::json_number;

Cli run_replay(const std::string& args) {
  return pagedkv::test::run_cli(PAGEDKV_REPLAY, args);
}
double number(const std::string& json, const std::string& name, std::size_t from = 0) {
  return json_number(json, name, from);
}

// The figures of the cluster without the shared tier (the "without_remote" object).
double without(const std::string& json, const std::string& name) {
  const auto at = json.find("\"without_remote\":");
  return at == std::string::npos ? std::nan("") : number(json, name, at);
}

// By default a generous op timeout: a loaded CI machine must not turn a slow reply into a miss.
// (Each flag once: pagedkv-replay refuses a single-value flag given twice.)
std::string remote_args(std::uint16_t port, const std::string& ns, int host_blocks = 1000,
                        int timeout_ms = 5000) {
  return std::string(kCluster) + " --host-blocks " + std::to_string(host_blocks) +
         " --remote redis://127.0.0.1:" + std::to_string(port) + "/" + ns +
         " --remote-timeout-ms " + std::to_string(timeout_ms);
}

class ReplayRemote : public ::testing::Test {
 protected:
  void SetUp() override {
    if (pagedkv::test::RedisServer::binary().empty()) {
      GTEST_SKIP() << "redis-server not installed (Debian: redis-server): remote tests skipped";
    }
  }
};

TEST_F(ReplayRemote, SharedTierRaisesTheClusterHitRateReproducibly) {
  pagedkv::test::RedisServer server;
  ASSERT_TRUE(server.start());
  const Cli a = run_replay(remote_args(server.port(), "replay-a"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string& j = a.output;
  EXPECT_NE(j.find("\"remote_payload_bytes\":64"), std::string::npos) << j;
  EXPECT_NE(j.find("placeholders"), std::string::npos) << j;
  EXPECT_EQ(number(j, "requests"), 200) << j;
  const double with_rate = number(j, "hit_rate");
  const double without_rate = without(j, "hit_rate");
  ASSERT_FALSE(std::isnan(with_rate) || std::isnan(without_rate)) << j;
  EXPECT_GE(with_rate, without_rate) << j;
  EXPECT_GT(number(j, "remote_hit_blocks"), 0) << j;
  EXPECT_EQ(number(j, "remote_hit_tokens"), 16 * number(j, "remote_hit_blocks")) << j;
  EXPECT_GT(number(j, "remote_puts"), 0) << j;
  EXPECT_EQ(number(j, "remote_stored_blocks"), number(j, "remote_puts")) << j;
  EXPECT_EQ(number(j, "remote_bytes_out"), 64 * number(j, "remote_stored_blocks")) << j;
  EXPECT_EQ(number(j, "remote_bytes_in"), 64 * number(j, "remote_hit_blocks")) << j;
  EXPECT_EQ(number(j, "remote_errors"), 0) << j;
  EXPECT_EQ(number(j, "remote_timeouts"), 0) << j;
  EXPECT_EQ(number(j, "remote_load_misses"), 0) << j;
  // Each request's gets complete before the next request: no fill is shared (NaN if absent).
  EXPECT_EQ(number(j, "remote_fills_shared"), 0) << j;
  EXPECT_EQ(number(j, "payload_mismatches"), 0) << j;  // bytes read back from Redis checked
  EXPECT_EQ(without(j, "payload_mismatches"), 0) << j;
  // A host hit that came from Redis is counted in host_hit_tokens.
  EXPECT_GE(number(j, "host_hit_tokens"), number(j, "remote_hit_tokens")) << j;

  // The same replay on a fresh namespace: the same figures (deterministic completion policy).
  const Cli b = run_replay(remote_args(server.port(), "replay-b"));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  for (const char* f : {"hit_tokens", "remote_hit_blocks", "remote_puts", "remote_probed_blocks",
                        "host_evictions", "gpu_hit_tokens"}) {
    EXPECT_EQ(number(b.output, f), number(j, f)) << f << "\n" << j << "\n" << b.output;
  }
}

// --remote-store host_eviction: blocks reach Redis only when a host tier evicts them; other
// engines still load them.
TEST_F(ReplayRemote, StoreOnHostEvictionSharesEvictedBlocks) {
  pagedkv::test::RedisServer server;
  ASSERT_TRUE(server.start());
  const Cli a =
      run_replay(remote_args(server.port(), "replay-ev", 200) + " --remote-store host_eviction");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string& j = a.output;
  EXPECT_NE(j.find("\"remote_store\":\"host_eviction\""), std::string::npos) << j;
  EXPECT_GT(number(j, "remote_eviction_puts"), 0) << j;
  EXPECT_EQ(number(j, "remote_eviction_puts"), number(j, "remote_puts")) << j;
  EXPECT_GT(number(j, "remote_hit_blocks"), 0) << j;
  EXPECT_GE(number(j, "hit_rate"), without(j, "hit_rate")) << j;
  EXPECT_EQ(number(j, "payload_mismatches"), 0) << j;
  EXPECT_EQ(number(j, "remote_errors"), 0) << j;
}

TEST_F(ReplayRemote, RedisDownCompletesWithNoRemoteHitsAndCountedErrors) {
  const std::uint16_t port = pagedkv::test::free_port();  // nobody listens there
  const Cli a = run_replay(remote_args(port, "replay-down", 1000, 200));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string& j = a.output;
  EXPECT_EQ(number(j, "remote_hit_blocks"), 0) << j;
  EXPECT_EQ(number(j, "remote_stored_blocks"), 0) << j;
  EXPECT_GT(number(j, "remote_errors") + number(j, "remote_timeouts"), 0) << j;
  EXPECT_GT(number(j, "remote_puts"), 0) << j;
  EXPECT_EQ(number(j, "remote_puts_failed"), number(j, "remote_puts")) << j;
  // Without the shared tier's hits the cluster is the one without it.
  EXPECT_EQ(number(j, "hit_tokens"), without(j, "hit_tokens")) << j;
  EXPECT_EQ(number(j, "payload_mismatches"), 0) << j;
}

}  // namespace
