// The events layer under std::bad_alloc: the publisher's sender thread and publish(), with the
// global operator new replaced (this test binary only) so that a chosen allocation fails: the
// Nth of the armed thread, or any one of at least a given size on any thread.
#include <gtest/gtest.h>

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/events/indexer.hpp"
#include "pagedkv/events/publisher.hpp"
#include "replace_operator_new.hpp"

namespace {

thread_local long t_fail_at = -1;    // this thread's allocations until a failure; -1: none
thread_local long t_fail_from = -1;  // this thread's allocations until all fail; -1: none
std::atomic<std::size_t> g_fail_from_size{std::numeric_limits<std::size_t>::max()};
std::atomic<std::uint64_t> g_big_failures{0};

void* counted_alloc(std::size_t n) {
  if (t_fail_from >= 0) {
    if (t_fail_from == 0) throw std::bad_alloc();
    --t_fail_from;
  }
  if (t_fail_at >= 0) {
    if (t_fail_at == 0) {
      t_fail_at = -1;
      throw std::bad_alloc();
    }
    --t_fail_at;
  }
  if (n >= g_fail_from_size.load(std::memory_order_relaxed)) {
    ++g_big_failures;
    throw std::bad_alloc();
  }
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

void* pagedkv_test_alloc(std::size_t n) {
  return counted_alloc(n);
}

namespace pagedkv::events {
namespace {

using namespace std::chrono_literals;

BlockHash hash_of(std::uint64_t id) {
  std::array<std::uint8_t, 16> d{};
  for (int i = 0; i < 8; ++i) d[15 - i] = static_cast<std::uint8_t>(id >> (8 * i));
  return BlockHash(d);
}

std::vector<KVEvent> stored(std::size_t blocks, std::uint64_t first_id) {
  BlockStored s;
  for (std::size_t i = 0; i < blocks; ++i) s.block_hashes.push_back(hash_of(first_id + i));
  s.token_ids.assign(blocks, 1);
  s.block_size = 1;
  std::vector<KVEvent> ev(1);
  ev[0].data = std::move(s);
  return ev;
}

KVEventPublisherConfig loopback() {
  KVEventPublisherConfig c;
  c.endpoint = "tcp://127.0.0.1:*";
  return c;
}

// Before: an exception on the sender thread (encode_event_batch's bad_alloc) had no handler and
// ended the process. Now the batch is dropped and counted, and the thread goes on.
TEST(KVEventPublisherAlloc, SenderThreadSurvivesAFailedEncode) {
  KVEventPublisher publisher(loopback());
  std::vector<KVEvent> big = stored(100'000, 1);  // a payload of about 2 MB
  std::vector<KVEvent> small = stored(2, 1);
  ASSERT_TRUE(publisher.flush(10s));
  g_big_failures = 0;
  g_fail_from_size = 512 * 1024;  // the encoder's buffer outgrows this; nothing else does
  ASSERT_EQ(publisher.publish(std::move(big)), 0u);
  const bool flushed = publisher.flush(10s);
  g_fail_from_size = std::numeric_limits<std::size_t>::max();
  ASSERT_TRUE(flushed);
  EXPECT_GT(g_big_failures.load(), 0u);
  KVEventPublisherStats st = publisher.stats();
  EXPECT_EQ(st.encode_failures, 1u);
  EXPECT_EQ(st.dropped_batches, 1u);
  EXPECT_EQ(st.sent_batches, 0u);
  // The thread still sends.
  ASSERT_EQ(publisher.publish(std::move(small)), 1u);
  ASSERT_TRUE(publisher.flush(10s));
  st = publisher.stats();
  EXPECT_EQ(st.sent_batches, 1u);
  EXPECT_EQ(st.sent_batches + st.dropped_batches + st.send_failures, st.published_batches);
}

// publish() under bad_alloc at its first allocation (the queue growing a block): before, the
// batch had taken its sequence number (and, with a full queue, dropped the oldest batch) before
// the push that threw, so the next batch's number skipped one and a batch was lost for nothing.
// Now a failed publish() changes nothing.
TEST(KVEventPublisherAlloc, FailedPublishTakesNoNumberAndDropsNothing) {
  KVEventPublisherConfig pc = loopback();
  pc.max_queue_size = 4;
  KVEventPublisher publisher(pc);
  std::uint64_t expected = 0;
  int failures = 0;
  for (int i = 0; i < 200; ++i) {
    std::vector<KVEvent> first = stored(1, 10 + static_cast<std::uint64_t>(i));
    std::vector<KVEvent> again = first;
    const KVEventPublisherStats before = publisher.stats();
    std::uint64_t seq = std::numeric_limits<std::uint64_t>::max();
    bool threw = false;
    t_fail_at = 0;
    try {
      seq = publisher.publish(std::move(first)).value();
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    t_fail_at = -1;
    if (threw) {
      ++failures;
      const KVEventPublisherStats after = publisher.stats();
      EXPECT_EQ(after.published_batches, before.published_batches);
      EXPECT_EQ(after.dropped_batches, before.dropped_batches);
      seq = publisher.publish(std::move(again)).value();
    }
    ASSERT_EQ(seq, expected) << "after " << failures << " failed publish() calls";
    ++expected;
  }
  EXPECT_GT(failures, 0);  // the queue grew (or regrew) a block at least once
  ASSERT_TRUE(publisher.flush(10s));
  const KVEventPublisherStats st = publisher.stats();
  EXPECT_EQ(st.published_batches, expected);
  EXPECT_EQ(st.sent_batches + st.dropped_batches + st.send_failures, st.published_batches);
}

std::string payload_of(const std::vector<KVEvent>& ev) {
  std::string out;
  encode_event_batch(ev, 0, WireOptions{}, out);
  return out;
}

std::span<const std::uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

// apply() with every allocation from the Nth on failing, N = 0, 1, 2, ... until it completes.
// Before: the tables grew in place as stores went (a failed growth or extra-copy count threw
// half-way through the batch, leaving some of its stores and removals applied). Now a failed
// apply() leaves the engine exactly as it was, and a completed one holds the whole batch.
TEST(KVIndexerAlloc, InProcessApplyIsAllOrNothing) {
  KVIndexer indexer;
  const EngineId e = indexer.add_engine("engine");
  indexer.apply(e, 0, bytes_of(payload_of(stored(100, 1))));  // ids 1..100
  // 4,000 new ids (the tables must grow), 11 removed, then 50 extra copies of held ids.
  std::vector<KVEvent> evs = stored(4000, 1000);
  {
    BlockRemoved r;
    for (std::uint64_t id = 60; id <= 70; ++id) r.block_hashes.push_back(hash_of(id));
    evs.emplace_back().data = std::move(r);
  }
  evs.push_back(stored(50, 1)[0]);
  const std::string batch = payload_of(evs);
  std::vector<std::uint64_t> want;
  for (std::uint64_t id = 1; id <= 100; ++id) {
    if (id < 60 || id > 70) want.push_back(id);
  }
  for (std::uint64_t id = 1000; id < 5000; ++id) want.push_back(id);
  const std::vector<std::uint64_t> before = indexer.engine_ids(e, Tier::kGpu);
  const std::size_t entries_before = indexer.num_entries();
  bool done = false;
  int failures = 0;
  for (long n = 0; n < 100'000 && !done; ++n) {
    t_fail_from = n;
    try {
      indexer.apply(e, 1, bytes_of(batch));
      done = true;
    } catch (const std::bad_alloc&) {
    }
    t_fail_from = -1;
    const EngineStatus st = indexer.status(e);
    if (!done) {
      ++failures;
      ASSERT_EQ(indexer.engine_ids(e, Tier::kGpu), before)
          << "a failed apply() at allocation " << n;
      ASSERT_EQ(indexer.num_entries(), entries_before) << n;
      ASSERT_EQ(st.next_seq, 1u) << n;
      ASSERT_EQ(st.batches_applied, 1u) << n;
    } else {
      EXPECT_EQ(indexer.engine_ids(e, Tier::kGpu), want) << "completed at allocation " << n;
      EXPECT_EQ(st.next_seq, 2u);
      EXPECT_EQ(st.batches_applied, 2u);
    }
  }
  EXPECT_TRUE(done);
  EXPECT_GT(failures, 0);
}

// An allocation that fails on the indexer's receiver thread (here: decoding a batch of 100,000
// ids). Before, nothing caught it there: std::terminate. Now the engine's entries are dropped
// and counted (receiver_errors), and the thread goes on with the batches that follow.
TEST(KVIndexerAlloc, ReceiverThreadSurvivesAFailedAllocation) {
  zmq::context_t ctx{1};
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  pub.set(zmq::sockopt::linger, 0);
  pub.bind("tcp://127.0.0.1:*");
  KVIndexer indexer;  // no hasher: no probe
  const EngineId x =
      indexer.connect_engine({"engine", pub.get(zmq::sockopt::last_endpoint), std::nullopt});
  indexer.start();
  const auto until = [](auto pred) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(5ms);
    }
    return true;
  };
  ASSERT_TRUE(until([&] { return indexer.status(x).connected; }));
  const std::string big = payload_of(stored(100'000, 1));
  const std::string small = payload_of(stored(2, 1'000'000));
  auto send = [&](std::uint64_t seq, const std::string& payload) {
    char s[8];
    put_seq(seq, s);
    pub.send(zmq::message_t(), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(s, 8), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(payload), zmq::send_flags::none);
  };
  g_fail_from_size = 512 * 1024;  // the decoded ids (800 KB) fail; nothing else is as large
  const bool failed = until([&] {
    send(0, big);
    return indexer.status(x).receiver_errors > 0;
  });
  g_fail_from_size = std::numeric_limits<std::size_t>::max();
  ASSERT_TRUE(failed);
  EXPECT_EQ(indexer.status(x).gpu_blocks, 0u);
  // The thread still indexes: the next batch is a late join (no replay socket: applied as is).
  // Each try sends the next number (a repeated one would read as a restart), and the engine's ids
  // must come to be the batch's: big batches still queued when the failure was seen may be
  // applied first, and a gap then drops them.
  const std::vector<std::uint64_t> want = {1'000'000, 1'000'001};
  std::uint64_t seq = 5;
  EXPECT_TRUE(until([&] {
    send(seq++, small);
    return indexer.engine_ids(x, Tier::kGpu) == want;
  })) << "engine ids: "
      << indexer.engine_ids(x, Tier::kGpu).size();
  indexer.stop();
}

}  // namespace
}  // namespace pagedkv::events
