// RedisStore through nutcracker (twemproxy) in front of three redis-server processes, all on
// 127.0.0.1 and started by the test. Without redis-server or nutcracker every test reports SKIPPED.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "pagedkv/remote/redis_store.hpp"
#include "pagedkv/remote/remote_prefix_probe.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "redis_servers.hpp"
#include "remote_test_util.hpp"

namespace pagedkv {
namespace {

using namespace std::chrono_literals;
using namespace test;  // remote_test_util.hpp: block_bytes, block_key, collect, count_result
using Clock = std::chrono::steady_clock;

class TwemproxyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::RedisServer::binary().empty() || test::Twemproxy::binary().empty()) {
      GTEST_SKIP() << "redis-server or nutcracker not installed (Debian: redis-server, "
                      "nutcracker): twemproxy tests skipped";
    }
    for (int i = 0; i < 3; ++i) {
      servers_.push_back(std::make_unique<test::RedisServer>());
      ASSERT_TRUE(servers_.back()->start());
    }
    proxy_ = std::make_unique<test::Twemproxy>(
        std::vector<std::uint16_t>{servers_[0]->port(), servers_[1]->port(), servers_[2]->port()});
    ASSERT_TRUE(proxy_->start());
  }

  RedisStoreConfig config(std::string ns = "test/proxy/bf16") const {
    RedisStoreConfig c;
    c.port = proxy_->port();
    c.name_space = std::move(ns);
    c.layout_fingerprint = layout_fingerprint("block-first,fp16,block32");
    c.op_timeout = 2000ms;
    return c;
  }

  std::vector<std::unique_ptr<test::RedisServer>> servers_;
  std::unique_ptr<test::Twemproxy> proxy_;
};

TEST_F(TwemproxyTest, RoundTripsSpreadOverThreeServersAndTwoEnginesShare) {
  RedisStore engine_a(config());
  RedisStore engine_b(config());
  constexpr std::size_t kBlocks = 60;
  std::vector<std::vector<std::byte>> keep;
  std::vector<RemotePut> puts;
  for (std::size_t i = 0; i < kBlocks; ++i) {
    keep.push_back(block_bytes(size_t{65536} + i, i));  // sizes differ: every length is checked
  }
  for (std::size_t i = 0; i < kBlocks; ++i) puts.push_back({block_key(i), keep[i]});
  ASSERT_TRUE(engine_a.put(puts));
  EXPECT_EQ(count_result(collect(engine_a, kBlocks), RemoteResult::kStored), kBlocks);

  // Keys landed on every server (twemproxy shards by key).
  std::size_t total = 0;
  for (const auto& s : servers_) {
    test::Client c(s->port());
    const auto n = std::stoul(c.command({"DBSIZE"}).value_or("0"));
    EXPECT_GT(n, 0u) << "server " << s->port() << " got no key";
    total += n;
  }
  EXPECT_GE(total, kBlocks);

  std::vector<std::vector<std::byte>> out(kBlocks);
  std::vector<RemoteGet> gets;
  for (std::size_t i = 0; i < kBlocks; ++i) {
    out[i].resize(keep[i].size());
    gets.push_back({block_key(i), out[i]});
  }
  ASSERT_TRUE(engine_b.get(gets));
  EXPECT_EQ(count_result(collect(engine_b, kBlocks), RemoteResult::kHit), kBlocks);
  for (std::size_t i = 0; i < kBlocks; ++i) EXPECT_TRUE(out[i] == keep[i]) << i;

  // A prefix probe through the proxy: blocks 0..59 present, then a miss.
  std::vector<BlockHash> chain;
  for (std::size_t i = 0; i < kBlocks; ++i) chain.push_back(block_key(i));
  chain.push_back(block_key(5000));
  RemotePrefixProbe probe;
  ASSERT_TRUE(probe.start(engine_b, chain, PrefetchPolicy::kTimeout, Clock::now() + 5s));
  std::vector<RemoteCompletion> buf;
  while (!probe.complete() && !probe.ready(Clock::now())) {
    buf.clear();
    engine_b.wait(buf, 10ms);
    probe.absorb(buf);
  }
  EXPECT_EQ(probe.hit_blocks(), kBlocks);
}

TEST_F(TwemproxyTest, WrongNamespaceMissesAndCorruptionIsDetected) {
  RedisStore store(config());
  std::vector<std::byte> block = block_bytes(8192, 1);
  const RemotePut p{block_key(1), block};
  ASSERT_TRUE(store.put(std::span(&p, 1)));
  ASSERT_EQ(collect(store, 1).at(0).result, RemoteResult::kStored);

  RedisStore other(config("test/proxy/fp8"));
  std::vector<std::byte> out(8192, std::byte{9});
  const RemoteGet g{block_key(1), out};
  ASSERT_TRUE(other.get(std::span(&g, 1)));
  EXPECT_EQ(collect(other, 1).at(0).result, RemoteResult::kMiss);

  test::Client raw(proxy_->port());
  auto value = raw.command({"GET", store.key_of(block_key(1))});
  ASSERT_TRUE(value.has_value());
  ASSERT_EQ(value->size(), kRemoteValueHeaderSize + 8192);
  value->back() ^= 0x40;
  ASSERT_EQ(raw.command({"SET", store.key_of(block_key(1)), *value}), "OK");
  ASSERT_TRUE(store.get(std::span(&g, 1)));
  EXPECT_EQ(collect(store, 1).at(0).result, RemoteResult::kInvalidValue);
  EXPECT_EQ(store.stats().checksum_failures, 1u);
  for (std::byte b : out) ASSERT_EQ(b, std::byte{9});
}

TEST_F(TwemproxyTest, OneServerKilledGivesBoundedFailuresForItsKeysOnly) {
  auto cfg = config();
  cfg.op_timeout = 1000ms;
  RedisStore store(cfg);
  constexpr std::size_t kBlocks = 30;
  std::vector<std::vector<std::byte>> keep;
  std::vector<RemotePut> puts;
  for (std::size_t i = 0; i < kBlocks; ++i) keep.push_back(block_bytes(4096, i));
  for (std::size_t i = 0; i < kBlocks; ++i) puts.push_back({block_key(i), keep[i]});
  ASSERT_TRUE(store.put(puts));
  ASSERT_EQ(count_result(collect(store, kBlocks), RemoteResult::kStored), kBlocks);

  servers_[1]->kill();
  std::vector<BlockHash> keys;
  for (std::size_t i = 0; i < kBlocks; ++i) keys.push_back(block_key(i));
  const auto t0 = Clock::now();
  ASSERT_TRUE(store.exists(keys));
  const auto done = collect(store, kBlocks, 10000ms);
  ASSERT_EQ(done.size(), kBlocks);
  EXPECT_LT(Clock::now() - t0, cfg.op_timeout + 1000ms);
  const std::size_t hits = count_result(done, RemoteResult::kHit);
  EXPECT_GT(hits, 0u) << "the two live servers still answer";
  EXPECT_LT(hits, kBlocks) << "the dead server's keys cannot hit";
  EXPECT_EQ(
      hits + count_result(done, RemoteResult::kError) + count_result(done, RemoteResult::kTimeout),
      kBlocks);
}

}  // namespace
}  // namespace pagedkv
