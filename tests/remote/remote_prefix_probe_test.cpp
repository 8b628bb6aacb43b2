// RemotePrefixProbe against a scripted in-memory store: the policies' readiness and the leading
// run, deterministic (no network). The real-server path is covered in redis_store_test.
#include "pagedkv/remote/remote_prefix_probe.hpp"

#include <gtest/gtest.h>

#include <array>

#include "pagedkv/base/error.hpp"

namespace pagedkv {
namespace {

using Clock = RemotePrefixProbe::Clock;

BlockHash key(int i) {
  std::array<std::uint8_t, 16> b{};
  b[0] = static_cast<std::uint8_t>(i + 1);
  return BlockHash(b);
}

// Accepts exists batches up to a capacity; the test completes them by hand.
class ScriptedStore final : public RemoteStore {
 public:
  explicit ScriptedStore(std::size_t capacity) : capacity_(capacity) {}
  std::optional<RemoteTicket> exists(std::span<const BlockHash> keys) override {
    if (keys.size() > capacity_) {
      ++drops_;
      return std::nullopt;
    }
    last_keys_.assign(keys.begin(), keys.end());
    return ++ticket_;
  }
  std::optional<RemoteTicket> get(std::span<const RemoteGet>) override { return std::nullopt; }
  std::optional<RemoteTicket> put(std::span<const RemotePut>) override { return std::nullopt; }
  std::size_t poll(std::vector<RemoteCompletion>&) override { return 0; }
  std::size_t in_flight() const override { return 0; }
  RemoteStoreStats stats() const override {
    RemoteStoreStats s;
    s.queue_full_drops = drops_;
    return s;
  }
  std::string_view name_space() const noexcept override { return "scripted"; }

  RemoteTicket ticket_ = 0;
  std::size_t capacity_;
  std::uint64_t drops_ = 0;
  std::vector<BlockHash> last_keys_;
};

RemoteCompletion exists_done(RemoteTicket t, std::uint32_t i, RemoteResult r) {
  return RemoteCompletion{t, i, RemoteOpKind::kExists, r};
}

std::vector<BlockHash> keys(int n) {
  std::vector<BlockHash> k;
  for (int i = 0; i < n; ++i) k.push_back(key(i));
  return k;
}

TEST(RemotePrefixProbe, LeadingRunGrowsAsCompletionsArriveInAnyOrder) {
  ScriptedStore store(100);
  RemotePrefixProbe probe;
  const auto t0 = Clock::now();
  const auto k = keys(5);
  ASSERT_TRUE(probe.start(store, k, PrefetchPolicy::kWaitComplete, t0));
  EXPECT_EQ(store.last_keys_, k);
  EXPECT_FALSE(probe.ready(t0 + std::chrono::hours(1)));  // wait_complete ignores the deadline
  const RemoteTicket t = probe.ticket();
  std::vector<RemoteCompletion> c = {exists_done(t, 2, RemoteResult::kHit),
                                     exists_done(t + 1, 0, RemoteResult::kHit),  // other batch
                                     exists_done(t, 1, RemoteResult::kHit)};
  EXPECT_EQ(probe.absorb(c), 2u);
  EXPECT_EQ(probe.hit_blocks(), 0u);  // key 0 still unknown
  c = {exists_done(t, 0, RemoteResult::kHit), exists_done(t, 0, RemoteResult::kMiss)};
  EXPECT_EQ(probe.absorb(c), 1u);  // a duplicate completion is ignored
  EXPECT_EQ(probe.hit_blocks(), 3u);
  EXPECT_FALSE(probe.ready(t0));
  c = {exists_done(t, 4, RemoteResult::kHit), exists_done(t, 3, RemoteResult::kHit)};
  probe.absorb(c);
  EXPECT_TRUE(probe.complete());
  EXPECT_TRUE(probe.ready(t0));
  EXPECT_EQ(probe.hit_blocks(), 5u);
}

TEST(RemotePrefixProbe, AMissErrorOrTimeoutEndsTheRunAndDecidesEarly) {
  for (RemoteResult end : {RemoteResult::kMiss, RemoteResult::kError, RemoteResult::kTimeout}) {
    ScriptedStore store(100);
    RemotePrefixProbe probe;
    const auto t0 = Clock::now();
    ASSERT_TRUE(probe.start(store, keys(6), PrefetchPolicy::kWaitComplete, t0));
    const RemoteTicket t = probe.ticket();
    std::vector<RemoteCompletion> c = {
        exists_done(t, 0, RemoteResult::kHit), exists_done(t, 1, RemoteResult::kHit),
        exists_done(t, 2, end), exists_done(t, 3, RemoteResult::kHit)};
    probe.absorb(c);
    EXPECT_EQ(probe.hit_blocks(), 2u) << to_string(end);
    EXPECT_FALSE(probe.complete());
    EXPECT_TRUE(probe.ready(t0)) << "the answer cannot change any more";
  }
}

TEST(RemotePrefixProbe, PoliciesDecideWhenAnIncompleteProbeIsReady) {
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::milliseconds(50);
  for (PrefetchPolicy p :
       {PrefetchPolicy::kBestEffort, PrefetchPolicy::kWaitComplete, PrefetchPolicy::kTimeout}) {
    ScriptedStore store(100);
    RemotePrefixProbe probe;
    EXPECT_FALSE(probe.ready(t0));  // not started
    ASSERT_TRUE(probe.start(store, keys(3), p, deadline));
    const RemoteTicket t = probe.ticket();
    const std::vector<RemoteCompletion> c = {exists_done(t, 0, RemoteResult::kHit),
                                             exists_done(t, 2, RemoteResult::kHit)};
    probe.absorb(c);
    EXPECT_EQ(probe.hit_blocks(), 1u);
    const bool before = probe.ready(t0);
    const bool after = probe.ready(deadline);
    switch (p) {
      case PrefetchPolicy::kBestEffort:
        EXPECT_TRUE(before);
        EXPECT_TRUE(after);
        break;
      case PrefetchPolicy::kWaitComplete:
        EXPECT_FALSE(before);
        EXPECT_FALSE(after);
        break;
      case PrefetchPolicy::kTimeout:
        EXPECT_FALSE(before);
        EXPECT_TRUE(after);
        break;
    }
    const std::vector<RemoteCompletion> last = {exists_done(t, 1, RemoteResult::kHit)};
    probe.absorb(last);
    EXPECT_TRUE(probe.ready(t0)) << to_string(p);
    EXPECT_EQ(probe.hit_blocks(), 3u);
  }
}

TEST(RemotePrefixProbe, RefusedBatchIsReadyWithNothingAndCounted) {
  ScriptedStore store(2);
  RemotePrefixProbe probe;
  EXPECT_FALSE(probe.start(store, keys(3), PrefetchPolicy::kWaitComplete, Clock::now()));
  EXPECT_TRUE(probe.ready(Clock::now()));
  EXPECT_EQ(probe.hit_blocks(), 0u);
  EXPECT_EQ(store.stats().queue_full_drops, 1u);
  const std::vector<RemoteCompletion> c = {exists_done(0, 0, RemoteResult::kHit)};
  EXPECT_EQ(probe.absorb(c), 0u);
}

TEST(RemotePrefixProbe, StartTwiceThrowsAndChangesNothing_ResetAllowsRestart) {
  ScriptedStore store(100);
  RemotePrefixProbe probe;
  ASSERT_TRUE(probe.start(store, keys(2), PrefetchPolicy::kBestEffort, Clock::now()));
  const RemoteTicket first = probe.ticket();
  try {
    probe.start(store, keys(4), PrefetchPolicy::kBestEffort, Clock::now());
    FAIL() << "expected pagedkv::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidState);
  }
  EXPECT_EQ(probe.ticket(), first);
  EXPECT_EQ(probe.num_keys(), 2u);
  EXPECT_EQ(store.ticket_, first);  // nothing submitted
  probe.reset();
  ASSERT_TRUE(probe.start(store, keys(4), PrefetchPolicy::kBestEffort, Clock::now()));
  const std::vector<RemoteCompletion> stale = {exists_done(first, 0, RemoteResult::kHit)};
  EXPECT_EQ(probe.absorb(stale), 0u);
  EXPECT_EQ(probe.num_keys(), 4u);
}

TEST(RemotePrefixProbe, EmptyKeysAreCompleteAtOnce) {
  ScriptedStore store(100);
  RemotePrefixProbe probe;
  ASSERT_TRUE(probe.start(store, {}, PrefetchPolicy::kWaitComplete, Clock::now()));
  EXPECT_TRUE(probe.ready(Clock::now()));
  EXPECT_EQ(probe.hit_blocks(), 0u);
}

TEST(RemotePrefixProbe, PolicyNames) {
  EXPECT_EQ(parse_prefetch_policy("best_effort"), PrefetchPolicy::kBestEffort);
  EXPECT_EQ(parse_prefetch_policy("wait_complete"), PrefetchPolicy::kWaitComplete);
  EXPECT_EQ(parse_prefetch_policy("timeout"), PrefetchPolicy::kTimeout);
  EXPECT_EQ(to_string(PrefetchPolicy::kTimeout), "timeout");
  EXPECT_THROW(parse_prefetch_policy("eventually"), Error);
}

}  // namespace
}  // namespace pagedkv
