// The events layer under std::bad_alloc: the publisher's sender thread and publish(), with the
// global operator new replaced (this test binary only) so that a chosen allocation fails: the
// Nth of the armed thread, or any one of at least a given size on any thread.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <new>
#include <optional>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/events/publisher.hpp"

namespace {

thread_local long t_fail_at = -1;  // this thread's allocations until a failure; -1: none
std::atomic<std::size_t> g_fail_from_size{std::numeric_limits<std::size_t>::max()};
std::atomic<std::uint64_t> g_big_failures{0};

void* counted_alloc(std::size_t n) {
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

void* operator new(std::size_t n) {
  return counted_alloc(n);
}
void* operator new[](std::size_t n) {
  return counted_alloc(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
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

}  // namespace
}  // namespace pagedkv::events
