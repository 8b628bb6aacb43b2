// RedisStore against real redis-server processes on 127.0.0.1, started and killed by the test
// (tests/util/redis_servers.hpp). Without redis-server every test reports SKIPPED.
#include "pagedkv/remote/redis_store.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "expect_error.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/remote/remote_prefix_probe.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "redis_servers.hpp"
#include "remote_test_util.hpp"

namespace pagedkv {
namespace {

using namespace std::chrono_literals;
using namespace test;  // remote_test_util.hpp: block_bytes, block_key, collect, count_result
using Clock = std::chrono::steady_clock;

class RedisStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::RedisServer::binary().empty()) {
      GTEST_SKIP() << "redis-server not installed (Debian: redis-server): remote tests skipped";
    }
  }

  static RedisStoreConfig config_for(std::uint16_t port, std::string ns = "test/model-a/bf16") {
    RedisStoreConfig c;
    c.port = port;
    c.name_space = std::move(ns);
    c.layout_fingerprint = layout_fingerprint("layer-first,bf16,block16");
    c.op_timeout = 2000ms;
    c.connect_timeout = 500ms;
    return c;
  }

  // Puts blocks [first, first + n) of `size` bytes; returns their completions.
  static std::vector<RemoteCompletion> put_blocks(RedisStore& s, std::uint64_t first, std::size_t n,
                                                  std::size_t size,
                                                  std::vector<std::vector<std::byte>>& keep) {
    std::vector<RemotePut> ops;
    for (std::size_t i = 0; i < n; ++i) {
      keep.push_back(block_bytes(size, first + i));
      ops.push_back({block_key(first + i), keep.back()});
    }
    if (!s.put(ops)) return {};
    return collect(s, n);
  }
};

TEST_F(RedisStoreTest, RoundTripsRealBytesAtSeveralSizes) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  RedisStore store(config_for(server.port()));
  std::uint64_t next = 0;
  std::uint64_t bytes = 0;
  for (std::size_t size : {std::size_t{1}, std::size_t{4096}, std::size_t{65536},
                           std::size_t{1} << 20, (std::size_t{2} << 20) + 17}) {
    const std::size_t n = size >= (1u << 20) ? 3 : 40;
    std::vector<std::vector<std::byte>> keep;
    keep.reserve(n);
    const auto put = put_blocks(store, next, n, size, keep);
    ASSERT_EQ(put.size(), n);
    EXPECT_EQ(count_result(put, RemoteResult::kStored), n) << size;

    std::vector<BlockHash> keys;
    for (std::size_t i = 0; i < n; ++i) keys.push_back(block_key(next + i));
    keys.push_back(block_key(1u << 30));  // never stored
    ASSERT_TRUE(store.exists(keys));
    const auto ex = collect(store, keys.size());
    ASSERT_EQ(ex.size(), keys.size());
    for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(ex[i].result, RemoteResult::kHit);
    EXPECT_EQ(ex.back().result, RemoteResult::kMiss);

    std::vector<std::vector<std::byte>> out(n, std::vector<std::byte>(size, std::byte{0x5a}));
    std::vector<RemoteGet> gets;
    for (std::size_t i = 0; i < n; ++i) gets.push_back({block_key(next + i), out[i]});
    ASSERT_TRUE(store.get(gets));
    const auto got = collect(store, n);
    ASSERT_EQ(got.size(), n);
    for (std::size_t i = 0; i < n; ++i) {
      EXPECT_EQ(got[i].result, RemoteResult::kHit);
      EXPECT_EQ(got[i].kind, RemoteOpKind::kGet);
      EXPECT_EQ(got[i].index, i);
      EXPECT_TRUE(out[i] == keep[i]) << "bytes differ at size " << size << " block " << i;
    }
    next += n;
    bytes += n * size;
  }
  const RemoteStoreStats s = store.stats();
  EXPECT_EQ(s.stored, next);
  EXPECT_EQ(s.hits, next);
  EXPECT_EQ(s.bytes_out, bytes);
  EXPECT_EQ(s.bytes_in, bytes);
  EXPECT_EQ(s.probe_hits, next);
  EXPECT_EQ(s.probes, next + 5);
  EXPECT_EQ(s.errors + s.timeouts + s.checksum_failures + s.header_mismatches, 0u);
  EXPECT_EQ(s.get_latency.count, next);
  EXPECT_GT(s.get_latency.p99_us, 0u);
  EXPECT_GE(s.get_latency.p99_us, s.get_latency.p50_us);
  EXPECT_EQ(store.in_flight(), 0u);
}

// Large values through deep pipelines: every write and read of the socket is partial (a 2 MiB
// value is larger than what loopback takes in one call), so a slip in resuming a write inside an
// iovec or a reply across reads shows as a corrupted value, a protocol error or a timeout. Gets
// whose destination has another size skip the value as it streams in (kInvalidValue, untouched)
// and the replies after them in the same pipeline must still be read in step.
TEST_F(RedisStoreTest, LargeValuesThroughDeepPipelinesArriveByteExact) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  auto cfg = config_for(server.port());
  cfg.pipeline_depth = 16;
  cfg.num_connections = 2;
  cfg.op_timeout = 30000ms;  // a loaded 2-core machine moves these 64 MiB pipelines slowly
  RedisStore store(cfg);
  const std::size_t size = (std::size_t{2} << 20) + 17;  // odd: the payload ends mid-word
  const std::size_t n = 32;
  for (int round = 0; round < 2; ++round) {
    const std::uint64_t first = 1000 + round * n;
    std::vector<std::vector<std::byte>> keep;
    keep.reserve(n);
    const auto put = put_blocks(store, first, n, size, keep);
    ASSERT_EQ(put.size(), n);
    ASSERT_EQ(count_result(put, RemoteResult::kStored), n);

    std::vector<std::vector<std::byte>> out;
    std::vector<RemoteGet> gets;
    for (std::size_t i = 0; i < n; ++i) {
      const bool wrong_size = i % 5 == 2;  // a 2 MiB value skipped mid-pipeline
      out.emplace_back(wrong_size ? size - 1 : size, std::byte{0x5a});
    }
    for (std::size_t i = 0; i < n; ++i) gets.push_back({block_key(first + i), out[i]});
    ASSERT_TRUE(store.get(gets));
    const auto got = collect(store, n);
    ASSERT_EQ(got.size(), n);
    for (const auto& c : got) {
      const std::size_t i = c.index;
      ASSERT_LT(i, n);
      if (i % 5 == 2) {
        EXPECT_EQ(c.result, RemoteResult::kInvalidValue) << i;
        EXPECT_TRUE(std::all_of(out[i].begin(), out[i].end(),
                                [](std::byte b) { return b == std::byte{0x5a}; }))
            << "a skipped value was written to its destination, block " << i;
      } else {
        EXPECT_EQ(c.result, RemoteResult::kHit) << i;
        EXPECT_TRUE(out[i] == keep[i]) << "bytes differ, block " << i;
      }
    }
  }
  const auto s = store.stats();
  EXPECT_EQ(s.errors + s.timeouts + s.checksum_failures, 0u);
  const std::size_t skipped = 6;  // i % 5 == 2 for i = 2, 7, ..., 27: 6 of 32, per round
  EXPECT_EQ(s.header_mismatches, 2 * skipped);
  EXPECT_EQ(s.hits, 2 * (n - skipped));
  EXPECT_EQ(s.bytes_out, 2u * n * size);
}

TEST_F(RedisStoreTest, TwoEnginesShareBlocksAndAPrefixProbeFindsTheRun) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  RedisStore engine_a(config_for(server.port()));
  RedisStore engine_b(config_for(server.port()));
  std::vector<std::vector<std::byte>> keep;
  ASSERT_EQ(count_result(put_blocks(engine_a, 100, 6, 32768, keep), RemoteResult::kStored), 6u);

  // Engine B's request: blocks 100..105 cached by A, then 999 (never stored), then 101 again.
  std::vector<BlockHash> chain;
  for (int i = 0; i < 6; ++i) chain.push_back(block_key(100 + i));
  chain.push_back(block_key(999));
  chain.push_back(block_key(101));
  RemotePrefixProbe probe;
  ASSERT_TRUE(probe.start(engine_b, chain, PrefetchPolicy::kWaitComplete, Clock::now()));
  std::vector<RemoteCompletion> buf;
  const auto end = Clock::now() + 10s;
  while (!probe.ready(Clock::now()) && Clock::now() < end) {
    buf.clear();
    engine_b.poll(buf);  // the scheduler thread only polls
    probe.absorb(buf);
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(probe.ready(Clock::now()));
  EXPECT_EQ(probe.hit_blocks(), 6u);                 // decided at the first miss (key 6)
  while (!probe.complete() && Clock::now() < end) {  // drain the rest of the batch
    buf.clear();
    engine_b.wait(buf, 20ms);
    probe.absorb(buf);
  }
  ASSERT_TRUE(probe.complete());
  EXPECT_EQ(probe.hit_blocks(), 6u);  // key 7 is present but after the miss

  std::vector<std::vector<std::byte>> out(6, std::vector<std::byte>(32768));
  std::vector<RemoteGet> gets;
  for (int i = 0; i < 6; ++i) gets.push_back({block_key(100 + i), out[i]});
  ASSERT_TRUE(engine_b.get(gets));
  EXPECT_EQ(count_result(collect(engine_b, 6), RemoteResult::kHit), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(out[i] == keep[i]);
  EXPECT_EQ(engine_b.stats().bytes_in, 6u * 32768);
}

TEST_F(RedisStoreTest, WrongNamespaceOrLayoutIsAMissNeverALoad) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  RedisStore writer(config_for(server.port(), "test/model-a/bf16"));
  std::vector<std::vector<std::byte>> keep;
  ASSERT_EQ(count_result(put_blocks(writer, 0, 4, 4096, keep), RemoteResult::kStored), 4u);

  RedisStore other_ns(config_for(server.port(), "test/model-a/fp8"));
  std::vector<BlockHash> keys;
  for (int i = 0; i < 4; ++i) keys.push_back(block_key(i));
  ASSERT_TRUE(other_ns.exists(keys));
  EXPECT_EQ(count_result(collect(other_ns, 4), RemoteResult::kMiss), 4u);
  std::vector<std::byte> out(4096, std::byte{7});
  const RemoteGet g{block_key(0), out};
  ASSERT_TRUE(other_ns.get(std::span(&g, 1)));
  EXPECT_EQ(collect(other_ns, 1).at(0).result, RemoteResult::kMiss);
  EXPECT_EQ(other_ns.stats().misses, 1u);

  // Same namespace, another layout fingerprint: present, but rejected, counted, not loaded.
  auto cfg = config_for(server.port(), "test/model-a/bf16");
  cfg.layout_fingerprint ^= 1;
  RedisStore other_layout(cfg);
  ASSERT_TRUE(other_layout.get(std::span(&g, 1)));
  EXPECT_EQ(collect(other_layout, 1).at(0).result, RemoteResult::kInvalidValue);
  EXPECT_EQ(other_layout.stats().header_mismatches, 1u);
  EXPECT_EQ(other_layout.stats().misses, 1u);
  // And a reader expecting another block size.
  std::vector<std::byte> small(2048, std::byte{7});
  const RemoteGet gs{block_key(0), small};
  ASSERT_TRUE(writer.get(std::span(&gs, 1)));
  EXPECT_EQ(collect(writer, 1).at(0).result, RemoteResult::kInvalidValue);
  for (std::byte b : out) ASSERT_EQ(b, std::byte{7});
  for (std::byte b : small) ASSERT_EQ(b, std::byte{7});
}

// Issue 41: a value is bound to its block. A genuine value copied under another key, or read as
// the block of another prefix (parent) or group, is kInvalidValue - a counted miss, the buffer
// untouched - and a version 1 value (no binding) is a counted header mismatch.
TEST_F(RedisStoreTest, AValueUnderAnotherKeyOrPrefixIsRejectedAndCounted) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  RedisStore store(config_for(server.port()));
  std::vector<std::vector<std::byte>> keep;
  keep.push_back(block_bytes(4096, 1));
  keep.push_back(block_bytes(4096, 2));
  // Block 1 (parent block 0) and block 2 (parent block 1) of one chain.
  const RemotePut puts[] = {{block_key(1), keep[0], block_key(0), 0},
                            {block_key(2), keep[1], block_key(1), 0}};
  ASSERT_TRUE(store.put(puts));
  ASSERT_EQ(count_result(collect(store, 2), RemoteResult::kStored), 2u);

  test::Client raw(server.port());
  const auto v1 = raw.command({"GET", store.key_of(block_key(1))});
  ASSERT_TRUE(v1.has_value());
  ASSERT_EQ(v1->size(), kRemoteValueHeaderSize + 4096);
  // Block 1's value under block 2's key, and under a key never written.
  ASSERT_EQ(raw.command({"SET", store.key_of(block_key(2)), *v1}), "OK");
  ASSERT_EQ(raw.command({"SET", store.key_of(block_key(9)), *v1}), "OK");
  // A version 1 value: the old 40-byte header in front of the payload.
  std::string old = v1->substr(0, 40) + v1->substr(kRemoteValueHeaderSize);
  old[4] = 1;
  old[6] = 40;
  ASSERT_EQ(raw.command({"SET", store.key_of(block_key(10)), old}), "OK");

  std::vector<std::vector<std::byte>> out(6, std::vector<std::byte>(4096, std::byte{0x33}));
  const RemoteGet gets[] = {
      {block_key(1), out[0], block_key(0), 0},   // its own key: a hit
      {block_key(2), out[1], block_key(1), 0},   // block 1's value under block 2's key
      {block_key(9), out[2], block_key(8), 0},   // ... under a key never written
      {block_key(1), out[3], block_key(7), 0},   // block 1 read as the child of another prefix
      {block_key(1), out[4], block_key(0), 1},   // ... of another KV-cache group
      {block_key(10), out[5], block_key(9), 0},  // a version 1 value
  };
  ASSERT_TRUE(store.get(gets));
  const auto done = collect(store, 6);
  ASSERT_EQ(done.size(), 6u);
  EXPECT_EQ(done[0].result, RemoteResult::kHit);
  EXPECT_TRUE(out[0] == keep[0]);
  for (std::size_t i = 1; i < 6; ++i) {
    EXPECT_EQ(done[i].result, RemoteResult::kInvalidValue) << i;
    for (std::byte b : out[i]) ASSERT_EQ(b, std::byte{0x33}) << i;
  }
  const RemoteStoreStats s = store.stats();
  EXPECT_EQ(s.binding_mismatches, 4u);
  EXPECT_EQ(s.header_mismatches, 1u);
  EXPECT_EQ(s.checksum_failures, 0u);
  EXPECT_EQ(s.misses, 5u);
  EXPECT_EQ(s.hits, 1u);
}

TEST_F(RedisStoreTest, CorruptedValueIsDetectedCountedAndNotLoaded) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  RedisStore store(config_for(server.port()));
  std::vector<std::vector<std::byte>> keep;
  ASSERT_EQ(count_result(put_blocks(store, 0, 3, 65536, keep), RemoteResult::kStored), 3u);

  test::Client raw(server.port());
  // Block 0: one payload byte flipped in place. Block 1: garbage that is not a pagedkv value.
  auto value = raw.command({"GET", store.key_of(block_key(0))});
  ASSERT_TRUE(value.has_value());
  ASSERT_EQ(value->size(), kRemoteValueHeaderSize + 65536);
  (*value)[kRemoteValueHeaderSize + 30000] ^= 0x01;
  ASSERT_EQ(raw.command({"SET", store.key_of(block_key(0)), *value}), "OK");
  ASSERT_EQ(raw.command({"SET", store.key_of(block_key(1)), "not a block"}), "OK");

  std::vector<std::vector<std::byte>> out(3, std::vector<std::byte>(65536, std::byte{0x33}));
  std::vector<RemoteGet> gets;
  for (int i = 0; i < 3; ++i) gets.push_back({block_key(i), out[i]});
  ASSERT_TRUE(store.get(gets));
  const auto got = collect(store, 3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].result, RemoteResult::kInvalidValue);
  EXPECT_EQ(got[1].result, RemoteResult::kInvalidValue);
  EXPECT_EQ(got[2].result, RemoteResult::kHit);
  for (std::byte b : out[0]) ASSERT_EQ(b, std::byte{0x33});
  for (std::byte b : out[1]) ASSERT_EQ(b, std::byte{0x33});
  EXPECT_TRUE(out[2] == keep[2]);
  const auto s = store.stats();
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.header_mismatches, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.hits, 1u);
}

TEST_F(RedisStoreTest, ServerKilledMidRunCompletesWithinTheTimeoutThenReconnects) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  auto cfg = config_for(server.port());
  cfg.op_timeout = 300ms;
  cfg.connect_timeout = 200ms;
  cfg.reconnect_backoff_min = 10ms;
  cfg.reconnect_backoff_max = 80ms;
  cfg.pipeline_depth = 4;
  RedisStore store(cfg);
  std::vector<std::vector<std::byte>> keep;
  ASSERT_EQ(count_result(put_blocks(store, 0, 8, 262144, keep), RemoteResult::kStored), 8u);

  // Many gets in flight, then the server dies.
  std::vector<std::vector<std::byte>> out(64, std::vector<std::byte>(262144));
  std::vector<RemoteGet> gets;
  for (int i = 0; i < 64; ++i) gets.push_back({block_key(i % 8), out[i]});
  const auto t0 = Clock::now();
  ASSERT_TRUE(store.get(gets));
  server.kill();
  std::vector<BlockHash> keys = {block_key(0), block_key(1)};
  ASSERT_TRUE(store.exists(keys));  // submitted after the kill
  const auto done = collect(store, 66, 5000ms);
  const auto took = Clock::now() - t0;
  ASSERT_EQ(done.size(), 66u) << "every op completes";
  EXPECT_LT(took, cfg.op_timeout + 700ms) << "bounded by the op timeout (+ scheduling slack)";
  EXPECT_EQ(done[64].result == RemoteResult::kHit, false);
  EXPECT_EQ(done[65].result == RemoteResult::kHit, false);
  const std::size_t failed =
      count_result(done, RemoteResult::kError) + count_result(done, RemoteResult::kTimeout);
  EXPECT_GE(failed, 2u);
  EXPECT_EQ(failed + count_result(done, RemoteResult::kHit), 66u);

  // While it is down: prompt errors, counted, never exceptions.
  const auto t1 = Clock::now();
  ASSERT_TRUE(store.exists(keys));
  const auto down = collect(store, 2, 5000ms);
  EXPECT_EQ(count_result(down, RemoteResult::kError) + count_result(down, RemoteResult::kTimeout),
            2u);
  EXPECT_LT(Clock::now() - t1, cfg.op_timeout + 700ms);
  const auto before = store.stats();
  EXPECT_GE(before.errors + before.timeouts, failed + 2);
  EXPECT_GE(before.connect_failures, 1u);

  // Restarted (empty, same port): the store reconnects with backoff and works again.
  ASSERT_TRUE(server.start());
  bool back = false;
  const auto end = Clock::now() + 5s;
  while (!back && Clock::now() < end) {
    keep.clear();
    back = count_result(put_blocks(store, 0, 1, 4096, keep), RemoteResult::kStored) == 1;
    if (!back) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(back) << "no reconnect within 5 s";
  std::vector<std::byte> one(4096);
  const RemoteGet g{block_key(0), one};
  ASSERT_TRUE(store.get(std::span(&g, 1)));
  EXPECT_EQ(collect(store, 1).at(0).result, RemoteResult::kHit);
  EXPECT_TRUE(one == keep[0]);
  EXPECT_GE(store.stats().connects, before.connects + 1);
}

// Every I/O thread holds a connection when the server restarts: each connection is stale, and
// the first op on each must still be answered (rerun on a fresh connection), not failed.
TEST_F(RedisStoreTest, StaleConnectionsAfterARestartAreReplacedWithoutFailingOps) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  auto cfg = config_for(server.port());
  cfg.num_connections = 4;
  cfg.pipeline_depth = 1;
  cfg.reconnect_backoff_min = 3000ms;  // a failed op would not be retried within this test
  cfg.reconnect_backoff_max = 3000ms;
  RedisStore store(cfg);
  std::vector<std::vector<std::byte>> keep;
  keep.reserve(4096);
  const auto end = Clock::now() + 10s;
  while (store.stats().connects < 4 && Clock::now() < end) {
    ASSERT_EQ(count_result(put_blocks(store, 0, 64, 1024, keep), RemoteResult::kStored), 64u);
  }
  ASSERT_EQ(store.stats().connects, 4u) << "every I/O thread connected";

  server.kill();
  ASSERT_TRUE(server.start());  // same port, empty
  const auto before = store.stats();
  // Ops one at a time: each lands on some thread, every one of them stale.
  for (std::uint64_t i = 0; i < 16; ++i) {
    const auto done = put_blocks(store, 1000 + i, 1, 512, keep);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].result, RemoteResult::kStored) << "op " << i;
  }
  std::vector<BlockHash> keys;
  for (std::uint64_t i = 0; i < 16; ++i) keys.push_back(block_key(1000 + i));
  ASSERT_TRUE(store.exists(keys));
  EXPECT_EQ(count_result(collect(store, keys.size()), RemoteResult::kHit), keys.size());
  const auto after = store.stats();
  EXPECT_EQ(after.errors, before.errors);
  EXPECT_GE(after.connects, before.connects + 1);
}

// One thread in reconnect backoff while another is connected leaves the ops to the connected one
// instead of failing them.
TEST_F(RedisStoreTest, AThreadInBackoffLeavesOpsToAConnectedThread) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  const std::uint16_t port = server.port();
  server.kill();
  auto cfg = config_for(port);
  cfg.num_connections = 2;
  cfg.pipeline_depth = 1;
  cfg.reconnect_backoff_min = 2500ms;
  cfg.reconnect_backoff_max = 2500ms;
  cfg.op_timeout = 4000ms;
  RedisStore store(cfg);
  // Down: both threads fail to connect and enter a long backoff, the second about 1.2 s after the
  // first, so their backoffs end at different times; meanwhile ops fail at once.
  const std::vector<BlockHash> key = {block_key(1)};
  ASSERT_TRUE(store.exists(key));
  EXPECT_EQ(collect(store, 1, 5000ms).at(0).result, RemoteResult::kError);
  std::this_thread::sleep_for(1200ms);
  auto end = Clock::now() + 1s;
  while (store.stats().connect_failures < 2 && Clock::now() < end) {
    ASSERT_TRUE(store.exists(key));
    EXPECT_EQ(collect(store, 1, 5000ms).at(0).result, RemoteResult::kError);
  }
  ASSERT_GE(store.stats().connect_failures, 2u);
  ASSERT_TRUE(server.start());
  // The first thread whose backoff ends reconnects; from then on every op must succeed even while
  // the other thread is still in backoff.
  std::vector<std::vector<std::byte>> keep;
  keep.reserve(256);
  end = Clock::now() + 8s;
  bool up = false;
  while (!up && Clock::now() < end) {
    up = count_result(put_blocks(store, 0, 1, 256, keep), RemoteResult::kStored) == 1;
    if (!up) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(up);
  const auto before = store.stats();
  for (std::uint64_t i = 0; i < 32; ++i) {
    const auto done = put_blocks(store, 100 + i, 1, 256, keep);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].result, RemoteResult::kStored) << "op " << i;
  }
  EXPECT_EQ(store.stats().errors, before.errors);
}

// A thread whose reconnect attempt fails while another connection is up goes back to waiting
// and leaves the queued ops to the live one (it used to take a pipeline's worth and fail them
// kError). A server taking one client (maxclients 1) and requiring AUTH: the first thread to
// connect holds the only slot, the other's AUTH gets "max number of clients reached" at every
// attempt (a short backoff: it tries often).
TEST_F(RedisStoreTest, AFailedReconnectLeavesOpsToALiveConnection) {
  test::RedisServer server({"--maxclients", "1"}, "secret");
  ASSERT_TRUE(server.start());
  auto cfg = config_for(server.port());
  cfg.password = "secret";
  cfg.num_connections = 2;
  cfg.pipeline_depth = 4;
  cfg.reconnect_backoff_min = 1ms;
  cfg.reconnect_backoff_max = 2ms;
  RedisStore store(cfg);
  // Until one thread holds the connection (before that, ops fail at once: none is up).
  std::vector<BlockHash> keys;
  for (std::uint64_t i = 0; i < 16; ++i) keys.push_back(block_key(i));
  const auto end = Clock::now() + 10s;
  bool up = false;
  while (!up && Clock::now() < end) {
    ASSERT_TRUE(store.exists(keys));
    up = count_result(collect(store, keys.size()), RemoteResult::kMiss) == keys.size();
  }
  ASSERT_TRUE(up);
  ASSERT_EQ(store.stats().connects, 1u);
  const auto before = store.stats();
  std::size_t misses = 0;
  for (int round = 0; round < 200; ++round) {
    for (int b = 0; b < 8; ++b) ASSERT_TRUE(store.exists(keys));
    misses += count_result(collect(store, 8 * keys.size()), RemoteResult::kMiss);
  }
  const auto after = store.stats();
  EXPECT_GT(after.connect_failures, before.connect_failures) << "the second thread kept trying";
  EXPECT_EQ(after.connects, 1u);
  EXPECT_EQ(after.errors, before.errors);
  EXPECT_EQ(misses, 200u * 8 * keys.size());
}

// A batch that meets a stale connection is rerun on a fresh one only when the reconnect fits
// before its deadline: here the server is gone and its port answers TCP but never AUTH (a
// listening socket that never accepts), so a reconnect takes connect_timeout (2 s) - far past the
// ops' 300 ms op_timeout. The op fails at once instead of ~2 s late.
TEST_F(RedisStoreTest, AStaleConnectionIsNotRetriedPastTheOpsDeadline) {
  test::RedisServer server({}, "secret");
  ASSERT_TRUE(server.start());
  const std::uint16_t port = server.port();
  auto cfg = config_for(port);
  cfg.password = "secret";
  cfg.num_connections = 1;
  cfg.op_timeout = 300ms;
  cfg.connect_timeout = 2000ms;
  auto store = std::make_unique<RedisStore>(cfg);
  std::vector<std::vector<std::byte>> keep;
  keep.reserve(4);
  ASSERT_EQ(count_result(put_blocks(*store, 0, 1, 256, keep), RemoteResult::kStored), 1u);

  server.kill();
  const int hole = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(hole, 0);
  const int on = 1;
  ::setsockopt(hole, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(hole, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(hole, 16), 0);

  const std::vector<BlockHash> key = {block_key(0)};
  const auto t0 = Clock::now();
  ASSERT_TRUE(store->exists(key));
  const auto done = collect(*store, 1, 10000ms);
  const auto took = Clock::now() - t0;
  ASSERT_EQ(done.size(), 1u);
  EXPECT_NE(done[0].result, RemoteResult::kHit);
  EXPECT_LT(took, 1500ms) << "completed "
                          << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                          << " ms after submission (op_timeout 300 ms)";
  store.reset();  // (waits for a reconnect attempt in flight: at most connect + AUTH)
  ::close(hole);
}

TEST_F(RedisStoreTest, SlowServerGivesTimeoutsWithinTheOpTimeout) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  auto cfg = config_for(server.port());
  cfg.op_timeout = 200ms;
  RedisStore store(cfg);
  std::vector<std::vector<std::byte>> keep;
  ASSERT_EQ(count_result(put_blocks(store, 0, 2, 1024, keep), RemoteResult::kStored), 2u);
  test::Client admin(server.port());
  ASSERT_EQ(admin.command({"CLIENT", "PAUSE", "1500"}), "OK");  // the server stalls every client
  std::vector<BlockHash> keys = {block_key(0), block_key(1), block_key(2)};
  const auto t0 = Clock::now();
  ASSERT_TRUE(store.exists(keys));
  const auto done = collect(store, 3, 5000ms);
  const auto took = Clock::now() - t0;
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(count_result(done, RemoteResult::kTimeout), 3u);
  EXPECT_GE(took, cfg.op_timeout - 5ms);
  EXPECT_LT(took, cfg.op_timeout + 500ms);
  EXPECT_EQ(store.stats().timeouts, 3u);
  EXPECT_GE(store.stats().exists_latency.p50_us, 150000u);
  // After the pause the store is usable again (a new connection replaces the timed-out one).
  std::this_thread::sleep_for(1500ms);
  ASSERT_TRUE(store.exists(keys));
  const auto after = collect(store, 3, 5000ms);
  EXPECT_EQ(count_result(after, RemoteResult::kHit), 2u);
  EXPECT_EQ(count_result(after, RemoteResult::kMiss), 1u);
}

TEST_F(RedisStoreTest, FullStoreSkipsStoresAndCountsThem) {
  test::RedisServer server({"--maxmemory", "1mb", "--maxmemory-policy", "noeviction"});
  ASSERT_TRUE(server.start());
  RedisStore store(config_for(server.port()));
  std::vector<std::vector<std::byte>> keep;
  const auto put = put_blocks(store, 0, 40, 65536, keep);  // 2.5 MiB into a 1 MiB server
  ASSERT_EQ(put.size(), 40u);
  const std::size_t stored = count_result(put, RemoteResult::kStored);
  const std::size_t skipped = count_result(put, RemoteResult::kSkippedFull);
  EXPECT_EQ(stored + skipped, 40u);
  EXPECT_GE(skipped, 20u);
  const auto s = store.stats();
  EXPECT_EQ(s.skipped_full, skipped);
  EXPECT_EQ(s.stored, stored);
  EXPECT_EQ(s.errors, 0u);
  EXPECT_EQ(s.bytes_out, stored * 65536);
  // What was stored still loads.
  for (std::size_t i = 0; i < put.size(); ++i) {
    if (put[i].result != RemoteResult::kStored) continue;
    std::vector<std::byte> out(65536);
    const RemoteGet g{block_key(i), out};
    ASSERT_TRUE(store.get(std::span(&g, 1)));
    EXPECT_EQ(collect(store, 1).at(0).result, RemoteResult::kHit);
    EXPECT_TRUE(out == keep[i]);
  }
}

TEST_F(RedisStoreTest, AuthPasswordAndAclUserWorkWrongCredentialsGiveErrors) {
  test::RedisServer server({}, "s3cret");
  ASSERT_TRUE(server.start());
  auto cfg = config_for(server.port());
  cfg.password = "s3cret";
  {
    RedisStore store(cfg);
    std::vector<std::vector<std::byte>> keep;
    EXPECT_EQ(count_result(put_blocks(store, 0, 2, 1000, keep), RemoteResult::kStored), 2u);
  }
  test::Client admin(server.port(), "s3cret");
  ASSERT_EQ(admin.command({"ACL", "SETUSER", "engine", "on", ">pw", "~*", "+@all"}), "OK");
  {
    auto acl = cfg;
    acl.username = "engine";
    acl.password = "pw";
    RedisStore store(acl);
    std::vector<BlockHash> keys = {block_key(0), block_key(1)};
    ASSERT_TRUE(store.exists(keys));
    EXPECT_EQ(count_result(collect(store, 2), RemoteResult::kHit), 2u);
  }
  for (const auto& [user, pass] :
       {std::pair<std::string, std::string>{"", "wrong"}, {"engine", "wrong"}, {"", ""}}) {
    auto bad = cfg;
    bad.username = user;
    bad.password = pass;
    RedisStore store(bad);
    std::vector<BlockHash> keys = {block_key(0), block_key(1)};
    ASSERT_TRUE(store.exists(keys));
    const auto done = collect(store, 2, 5000ms);
    ASSERT_EQ(done.size(), 2u);
    EXPECT_EQ(count_result(done, RemoteResult::kError), 2u) << user << ":" << pass;
    EXPECT_EQ(store.stats().errors, 2u);
    if (!pass.empty()) {
      EXPECT_GE(store.stats().connect_failures, 1u);
    }
  }
}

TEST_F(RedisStoreTest, QueueFullRefusesWholeBatchesAndCountsThem) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  auto cfg = config_for(server.port());
  cfg.queue_depth = 8;
  RedisStore store(cfg);
  std::vector<BlockHash> keys;
  for (int i = 0; i < 9; ++i) keys.push_back(block_key(i));
  EXPECT_FALSE(store.exists(keys));
  EXPECT_EQ(store.stats().queue_full_drops, 9u);
  EXPECT_EQ(store.in_flight(), 0u);
  const auto t = store.exists(std::span(keys).first(8));
  ASSERT_TRUE(t);
  EXPECT_FALSE(store.exists(std::span(keys).first(1)));  // 8 in flight until polled
  EXPECT_EQ(store.stats().queue_full_drops, 10u);
  const auto done = collect(store, 8);
  ASSERT_EQ(done.size(), 8u);
  for (const auto& c : done) EXPECT_EQ(c.ticket, *t);
  EXPECT_EQ(store.in_flight(), 0u);
  EXPECT_TRUE(store.exists(std::span(keys).first(8)));
  collect(store, 8);
}

TEST_F(RedisStoreTest, NoServerAtAllGivesPromptErrors) {
  auto cfg = config_for(test::free_port());  // nobody listens there
  cfg.op_timeout = 300ms;
  RedisStore store(cfg);
  std::vector<BlockHash> keys = {block_key(0), block_key(1), block_key(2)};
  const auto t0 = Clock::now();
  ASSERT_TRUE(store.exists(keys));
  const auto done = collect(store, 3, 5000ms);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(count_result(done, RemoteResult::kError) + count_result(done, RemoteResult::kTimeout),
            3u);
  EXPECT_LT(Clock::now() - t0, cfg.op_timeout + 500ms);
}

TEST_F(RedisStoreTest, DestructionWithOpsInFlightIsPrompt) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  std::vector<std::vector<std::byte>> bufs(32, std::vector<std::byte>(1 << 20));
  const auto t0 = Clock::now();
  {
    RedisStore store(config_for(server.port()));
    std::vector<RemotePut> puts;
    for (int i = 0; i < 32; ++i) puts.push_back({block_key(i), bufs[i]});
    ASSERT_TRUE(store.put(puts));
  }
  EXPECT_LT(Clock::now() - t0, 5s);
}

TEST_F(RedisStoreTest, MisuseThrowsBeforeSubmitting) {
  RedisStoreConfig ok;
  ok.name_space = "ns";
  ok.port = test::free_port();
  const auto rejects = [&](auto mutate) {
    auto c = ok;
    mutate(c);
    try {
      RedisStore s(c);
    } catch (const Error& e) {
      return e.code() == ErrorCode::kInvalidArgument;
    }
    return false;
  };
  EXPECT_TRUE(rejects([](RedisStoreConfig& c) { c.name_space.clear(); }));
  EXPECT_TRUE(rejects([](RedisStoreConfig& c) { c.host.clear(); }));
  EXPECT_TRUE(rejects([](RedisStoreConfig& c) { c.port = 0; }));
  EXPECT_TRUE(rejects([](RedisStoreConfig& c) { c.num_connections = 0; }));
  EXPECT_TRUE(rejects([](RedisStoreConfig& c) { c.queue_depth = 0; }));
  EXPECT_TRUE(rejects([](RedisStoreConfig& c) { c.pipeline_depth = 0; }));
  EXPECT_TRUE(rejects([](RedisStoreConfig& c) { c.op_timeout = 0ms; }));
  EXPECT_TRUE(rejects([](RedisStoreConfig& c) { c.reconnect_backoff_min = 2000ms; }));

  ok.max_value_bytes = 1024;
  RedisStore store(ok);
  std::vector<std::byte> big(2048);
  const RemotePut p{block_key(0), big};
  EXPECT_THROW(store.put(std::span(&p, 1)), Error);
  const RemoteGet g{block_key(0), big};
  EXPECT_THROW(store.get(std::span(&g, 1)), Error);
  const RemoteGet empty{block_key(0), {}};
  EXPECT_THROW(store.get(std::span(&empty, 1)), Error);
  const BlockHash none;
  EXPECT_THROW(store.exists(std::span(&none, 1)), Error);
  EXPECT_EQ(store.in_flight(), 0u);
  EXPECT_TRUE(store.exists({}));  // an empty batch is accepted
}

// Config values the store cannot work with are refused by name in the constructor, on the
// caller's thread (no redis-server needed: nothing connects). A pipeline_depth of SIZE_MAX ("no
// limit") used to be accepted and made each I/O thread's buffer reserve throw length_error:
// std::terminate. Timeouts above a day overflowed deadlines.
TEST(RedisStoreConfigCheck, RefusesPipelineDepthsAndTimeoutsItCannotHold) {
  RedisStoreConfig c;
  c.name_space = "ns";
  c.port = test::free_port();
  for (const std::size_t depth : {SIZE_MAX, SIZE_MAX / 3, (std::size_t{1} << 16) + 1}) {
    c.pipeline_depth = depth;
    testing::expect_error([&] { RedisStore s(c); }, ErrorCode::kInvalidArgument, "pipeline_depth");
  }
  c.pipeline_depth = 32;
  // Timeouts and backoffs meant as "never" overflowed now + timeout: above a day is refused.
  const auto refused = [&](auto mutate, const char* name) {
    auto bad = c;
    mutate(bad, std::chrono::milliseconds::max());
    testing::expect_error([&] { RedisStore s(bad); }, ErrorCode::kInvalidArgument, name);
    bad = c;
    mutate(bad, std::chrono::milliseconds(86400001));
    testing::expect_error([&] { RedisStore s(bad); }, ErrorCode::kInvalidArgument, name);
  };
  refused([](RedisStoreConfig& x, auto t) { x.op_timeout = t; }, "op_timeout");
  refused([](RedisStoreConfig& x, auto t) { x.connect_timeout = t; }, "connect_timeout");
  refused([](RedisStoreConfig& x, auto t) { x.reconnect_backoff_max = t; },
          "reconnect_backoff_max");
  refused(
      [](RedisStoreConfig& x, auto t) {
        x.reconnect_backoff_min = t;
        x.reconnect_backoff_max = t;
      },
      "reconnect_backoff_min");

  c.pipeline_depth = std::size_t{1} << 16;  // the largest accepted; deeper than the queue
  c.op_timeout = std::chrono::hours(24);    // the longest accepted
  c.queue_depth = 64;
  RedisStore s(c);
  std::this_thread::sleep_for(50ms);  // the I/O threads have set up their buffers by now
  const BlockHash k = test::block_key(1);
  ASSERT_TRUE(s.exists(std::span(&k, 1)).has_value());  // nothing listens: fails promptly
  const auto done = test::collect(s, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_NE(done[0].result, RemoteResult::kHit);
}

TEST(RedisStoreConfigUrl, ParsesAndRejects) {
  auto c = RedisStoreConfig::from_url("redis://10.0.0.5:6380/llama3-8b/bf16/tp0");
  EXPECT_EQ(c.host, "10.0.0.5");
  EXPECT_EQ(c.port, 6380);
  EXPECT_EQ(c.name_space, "llama3-8b/bf16/tp0");
  EXPECT_TRUE(c.password.empty());
  c = RedisStoreConfig::from_url("redis://:pw@cache/ns");
  EXPECT_EQ(c.host, "cache");
  EXPECT_EQ(c.port, 6379);
  EXPECT_EQ(c.password, "pw");
  EXPECT_TRUE(c.username.empty());
  c = RedisStoreConfig::from_url("redis://engine:p@ss@127.0.0.1:7000/x");
  EXPECT_EQ(c.username, "engine");
  EXPECT_EQ(c.password, "p@ss");
  for (const char* bad :
       {"http://h/ns", "redis://h", "redis://h/", "redis://:7000/ns", "redis://h:0/ns",
        "redis://h:70000/ns", "redis://h:x/ns", "redis://user@h/ns", "redis://u:@h/ns"}) {
    try {
      RedisStoreConfig::from_url(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kParseError) << bad;
    }
  }
}

}  // namespace
}  // namespace pagedkv
