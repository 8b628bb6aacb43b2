// RedisStore's I/O thread under std::bad_alloc, against a real redis-server on 127.0.0.1
// (tests/util/redis_servers.hpp; without redis-server the test reports SKIPPED). An exception in
// an I/O thread never kills it (redis_store.hpp, "Threads"): one while a batch is in hand fails
// that batch kError (counted in stats().errors) and drops the connection; one setting up the
// thread's buffers is counted in stats().connect_failures and the thread starts over after
// reconnect_backoff_min. Either way the store goes on serving: the next ops store and load.
//
// This binary replaces the global operator new with one that fails the Nth allocation made on a
// thread other than the test's own (the store's I/O thread: the test's thread, which submits,
// waits and checks, is never failed), for N = 0, 1, ... until a round makes fewer allocations.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "pagedkv/remote/redis_store.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "redis_servers.hpp"
#include "remote_test_util.hpp"
#include "replace_operator_new.hpp"

namespace alloc_failure {

// The thread that runs static initialization: main, the test's.
const std::thread::id test_thread = std::this_thread::get_id();
std::atomic<long> fail_at{-1};  // other threads' allocations until the failure; -1: none
std::atomic<bool> fired{false};

}  // namespace alloc_failure

void* pagedkv_test_alloc(std::size_t n) {
  if (alloc_failure::fail_at.load(std::memory_order_relaxed) >= 0 &&
      std::this_thread::get_id() != alloc_failure::test_thread) {
    // The (fail_at + 1)th allocation throws, once: the thread that takes the count to -1.
    if (alloc_failure::fail_at.fetch_sub(1) == 0) {
      alloc_failure::fired = true;
      throw std::bad_alloc();
    }
  }
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

namespace pagedkv {
namespace {

using namespace std::chrono_literals;
using namespace test;  // remote_test_util.hpp: block_bytes, block_key, collect, count_result

// Puts and gets of values larger than the I/O thread's first read buffer (256 KiB), so that
// sending, reading and growing the read buffer all allocate on it.
constexpr std::size_t kValue = 300 << 10;
constexpr std::size_t kOps = 2;

TEST(RedisStoreAlloc, AnIoThreadSurvivesAFailedAllocationAnywhereAndKeepsServing) {
  if (test::RedisServer::binary().empty()) {
    GTEST_SKIP() << "redis-server not installed (Debian: redis-server): remote tests skipped";
  }
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  std::vector<std::vector<std::byte>> values;
  for (std::size_t i = 0; i < kOps; ++i) values.push_back(block_bytes(kValue, i + 1));

  std::size_t batch_failures = 0;  // rounds whose failure hit a batch in hand
  std::size_t setup_failures = 0;  // ... the thread's set-up
  long k = 0;
  for (bool fired = true; fired; ++k) {
    SCOPED_TRACE("failure at the I/O thread's allocation " + std::to_string(k));
    RedisStoreConfig c;
    c.port = server.port();
    c.name_space = "alloc/" + std::to_string(k);  // each round its own keys
    c.layout_fingerprint = layout_fingerprint("layer-first,bf16,block16");
    c.num_connections = 1;
    c.queue_depth = 64;
    c.pipeline_depth = 8;
    c.op_timeout = 5000ms;
    c.connect_timeout = 1000ms;
    c.reconnect_backoff_min = 10ms;
    std::vector<RemotePut> puts;
    std::vector<std::vector<std::byte>> dest(kOps, std::vector<std::byte>(kValue));
    std::vector<RemoteGet> gets;
    for (std::size_t i = 0; i < kOps; ++i) {
      puts.push_back(RemotePut{block_key(i), values[i], {}, 0});
      gets.push_back(RemoteGet{block_key(i), dest[i], {}, 0});
    }

    alloc_failure::fired = false;
    alloc_failure::fail_at = k;
    RedisStore store(c);  // its I/O thread starts here: its set-up allocations count
    // A put batch, then a get batch: each completes whole, stored (loaded) or failed kError.
    ASSERT_TRUE(store.put(puts).has_value());
    const auto put_done = collect(store, kOps);
    ASSERT_EQ(put_done.size(), kOps);
    ASSERT_TRUE(store.get(gets).has_value());
    const auto get_done = collect(store, kOps);
    ASSERT_EQ(get_done.size(), kOps);
    alloc_failure::fail_at = -1;
    fired = alloc_failure::fired;

    const std::size_t stored = count_result(put_done, RemoteResult::kStored);
    const std::size_t hits = count_result(get_done, RemoteResult::kHit);
    const std::size_t put_errors = count_result(put_done, RemoteResult::kError);
    const std::size_t get_errors = count_result(get_done, RemoteResult::kError);
    const RemoteStoreStats s = store.stats();
    if (!fired) {
      EXPECT_EQ(stored, kOps);
      EXPECT_EQ(hits, kOps);
    } else if (put_errors + get_errors > 0) {
      // In a batch: that batch failed whole, counted; nothing else failed.
      ++batch_failures;
      EXPECT_TRUE(put_errors == kOps || get_errors == kOps)
          << "put errors " << put_errors << ", get errors " << get_errors;
      EXPECT_EQ(s.errors, put_errors + get_errors);
      EXPECT_EQ(s.connect_failures, 0u);
    } else {
      // In the set-up: counted as a failed connection attempt, and the thread started over.
      ++setup_failures;
      EXPECT_EQ(stored, kOps);
      EXPECT_EQ(hits, kOps);
      EXPECT_EQ(s.connect_failures, 1u);
      EXPECT_EQ(s.errors, 0u);
    }
    for (std::size_t i = 0; i < kOps && hits == kOps; ++i) EXPECT_EQ(dest[i], values[i]) << i;

    // The store keeps serving: a put and a get, now without failures, store and load.
    std::fill(dest[0].begin(), dest[0].end(), std::byte{0});
    ASSERT_TRUE(store.put(std::span(puts).first(1)).has_value());
    const auto again_put = collect(store, 1);
    ASSERT_EQ(again_put.size(), 1u);
    EXPECT_EQ(again_put[0].result, RemoteResult::kStored);
    ASSERT_TRUE(store.get(std::span(gets).first(1)).has_value());
    const auto again_get = collect(store, 1);
    ASSERT_EQ(again_get.size(), 1u);
    EXPECT_EQ(again_get[0].result, RemoteResult::kHit);
    EXPECT_EQ(dest[0], values[0]);
    EXPECT_EQ(store.stats().connect_failures, s.connect_failures);
    ASSERT_FALSE(HasFailure());
  }
  // The rounds failed both the thread's set-up and batches in hand.
  EXPECT_GT(setup_failures, 0u);
  EXPECT_GT(batch_failures, 0u);
  EXPECT_GT(k, 8);
}

}  // namespace
}  // namespace pagedkv
