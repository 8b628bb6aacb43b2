// The test double of the remote store (fault_store.hpp) keeps the RemoteStore contract the remote
// episodes rely on: every op of an accepted batch completes exactly once (ticket, index), no later
// than max_delay + 1 polls; a batch the bounded queue cannot take whole is refused with nothing
// submitted and counted; misuse throws before anything is submitted; a get loads only a value
// that check_remote_value accepts for its binding, and each hostile mutation makes the value
// rejected (kInvalidValue), never loaded.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "fault_store.hpp"
#include "pagedkv/base/error.hpp"

namespace pagedkv {
namespace {

using remote_test::FaultBackend;
using remote_test::FaultConfig;
using remote_test::FaultStore;

constexpr std::uint64_t kFp = 0x1234;
constexpr std::size_t kBytes = 16;

BlockHash key(std::uint8_t n) {
  std::vector<std::uint8_t> b(32, 0);
  b[0] = n;
  b[31] = 0x5a;
  return BlockHash(b);
}

FaultConfig config(unsigned max_delay = 0, std::size_t queue = 64) {
  FaultConfig c;
  c.fingerprint = kFp;
  c.max_value_bytes = kBytes;
  c.queue_capacity = queue;
  c.max_delay = max_delay;
  return c;
}

// Polls until `n` completions arrived (at most `polls` polls).
std::vector<RemoteCompletion> drain(RemoteStore& s, std::size_t n, int polls = 100) {
  std::vector<RemoteCompletion> out;
  for (int i = 0; i < polls && out.size() < n; ++i) s.poll(out);
  return out;
}

TEST(FaultStore, EveryOpCompletesExactlyOnceWithinItsDelay) {
  std::mt19937_64 rng(7);
  FaultBackend backend;
  FaultStore<std::mt19937_64> store(backend, rng, config(3));
  std::vector<BlockHash> keys;
  for (std::uint8_t i = 0; i < 20; ++i) keys.push_back(key(i));
  const auto t1 = store.exists(keys);
  const auto t2 = store.exists(std::span<const BlockHash>(keys).first(5));
  ASSERT_TRUE(t1 && t2);
  EXPECT_NE(*t1, *t2);
  EXPECT_EQ(store.in_flight(), 25u);
  std::vector<RemoteCompletion> out;
  for (int i = 0; i < 4; ++i) store.poll(out);  // max_delay 3: every op due by the 4th poll
  ASSERT_EQ(out.size(), 25u);
  EXPECT_EQ(store.in_flight(), 0u);
  std::map<std::pair<RemoteTicket, std::uint32_t>, int> seen;
  for (const RemoteCompletion& c : out) ++seen[{c.ticket, c.index}];
  EXPECT_EQ(seen.size(), 25u);
  for (const auto& [op, n] : seen) EXPECT_EQ(n, 1);
  EXPECT_EQ(store.poll(out), 0u);
}

TEST(FaultStore, AFullQueueRefusesTheWholeBatchAndMisuseThrowsBeforeSubmitting) {
  std::mt19937_64 rng(1);
  FaultBackend backend;
  FaultStore<std::mt19937_64> store(backend, rng, config(0, 4));
  std::vector<BlockHash> keys = {key(1), key(2), key(3)};
  ASSERT_TRUE(store.exists(keys));
  EXPECT_FALSE(store.exists(keys));  // 3 + 3 > 4: nothing submitted
  EXPECT_EQ(store.in_flight(), 3u);
  EXPECT_EQ(store.stats().queue_full_drops, 3u);
  std::vector<std::byte> big(kBytes + 1);
  const RemotePut too_big{key(1), big};
  EXPECT_THROW((void)store.put(std::span<const RemotePut>(&too_big, 1)), Error);
  const RemoteGet empty_dest{key(1), {}};
  EXPECT_THROW((void)store.get(std::span<const RemoteGet>(&empty_dest, 1)), Error);
  const BlockHash none;
  EXPECT_THROW((void)store.exists(std::span<const BlockHash>(&none, 1)), Error);
  EXPECT_EQ(store.in_flight(), 3u);
}

// Puts one value of `key(n)`, then runs `mutate` on the backend and gets it back.
template <typename Mutate>
RemoteResult round_trip(std::uint8_t n, Mutate mutate, std::vector<std::byte>* got = nullptr) {
  std::mt19937_64 rng(n);
  FaultBackend backend;
  FaultStore<std::mt19937_64> store(backend, rng, config());
  std::vector<std::byte> src(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) src[i] = static_cast<std::byte>(i * 7 + n);
  const RemotePut put{key(n), src, key(static_cast<std::uint8_t>(n + 100)), 1};
  EXPECT_TRUE(store.put(std::span<const RemotePut>(&put, 1)));
  EXPECT_EQ(drain(store, 1).at(0).result, RemoteResult::kStored);
  mutate(backend, rng);
  std::vector<std::byte> dest(kBytes);
  const RemoteGet get{key(n), dest, key(static_cast<std::uint8_t>(n + 100)), 1};
  EXPECT_TRUE(store.get(std::span<const RemoteGet>(&get, 1)));
  const RemoteResult r = drain(store, 1).at(0).result;
  if (r == RemoteResult::kHit) {
    EXPECT_EQ(std::memcmp(dest.data(), src.data(), kBytes), 0);
  }
  if (got != nullptr) *got = dest;
  return r;
}

TEST(FaultStore, AGetLoadsOnlyACheckedValueAndEveryHostileMutationIsRejected) {
  const auto none = [](FaultBackend&, std::mt19937_64&) {};
  EXPECT_EQ(round_trip(1, none), RemoteResult::kHit);
  for (std::uint8_t n = 1; n < 40; ++n) {
    EXPECT_EQ(round_trip(n, [](FaultBackend& b, std::mt19937_64& r) { b.flip_byte(r); }),
              RemoteResult::kInvalidValue);
    EXPECT_EQ(round_trip(n, [](FaultBackend& b, std::mt19937_64& r) { b.resize_value(r); }),
              RemoteResult::kInvalidValue);
    EXPECT_EQ(round_trip(n,
                         [](FaultBackend& b, std::mt19937_64& r) {
                           b.restamp(r, kFp, 0xf0);
                           b.restamp(r, kFp, 0xf1);  // twice: never back to a valid value
                         }),
              RemoteResult::kInvalidValue);
    EXPECT_EQ(round_trip(n, [](FaultBackend& b, std::mt19937_64& r) { b.evict(r); }),
              RemoteResult::kMiss);
  }
}

// A genuine value of another block moved under a key (FaultBackend::move_value's fault) is a
// binding mismatch, never loaded.
TEST(FaultStore, AValueMovedUnderAnotherKeyIsABindingMismatch) {
  std::mt19937_64 rng(5);
  FaultBackend backend;
  FaultStore<std::mt19937_64> store(backend, rng, config());
  std::vector<std::byte> a(kBytes, std::byte{1}), b(kBytes, std::byte{2});
  const std::vector<RemotePut> puts = {{key(1), a}, {key(2), b}};
  ASSERT_TRUE(store.put(puts));
  ASSERT_EQ(drain(store, 2).size(), 2u);
  *backend.find(key(1)) = *backend.find(key(2));
  std::vector<std::byte> dest(kBytes);
  const RemoteGet get{key(1), dest};
  ASSERT_TRUE(store.get(std::span<const RemoteGet>(&get, 1)));
  EXPECT_EQ(drain(store, 1).at(0).result, RemoteResult::kInvalidValue);
  EXPECT_EQ(store.stats().binding_mismatches, 1u);
  EXPECT_EQ(store.invalid_values(), 1u);
}

TEST(FaultStore, FaultsAreNormalOutcomesCounted) {
  std::mt19937_64 rng(3);
  FaultBackend backend;
  backend.capacity = 2;
  FaultConfig c = config();
  FaultStore<std::mt19937_64> store(backend, rng, c);
  std::vector<std::byte> src(kBytes);
  std::vector<RemotePut> puts;
  for (std::uint8_t i = 0; i < 4; ++i) puts.push_back({key(i), src});
  ASSERT_TRUE(store.put(puts));
  std::size_t stored = 0, full = 0;
  for (const RemoteCompletion& x : drain(store, 4)) {
    stored += x.result == RemoteResult::kStored;
    full += x.result == RemoteResult::kSkippedFull;
  }
  EXPECT_EQ(stored, 2u);  // the backend's capacity
  EXPECT_EQ(full, 2u);
  EXPECT_EQ(store.stats().skipped_full, 2u);

  FaultConfig f = config();
  f.error_percent = 50;
  f.timeout_percent = 50;
  FaultStore<std::mt19937_64> down(backend, rng, f);
  std::vector<BlockHash> keys = {key(0), key(1), key(2), key(3)};
  ASSERT_TRUE(down.exists(keys));
  for (const RemoteCompletion& x : drain(down, 4)) {
    EXPECT_TRUE(x.result == RemoteResult::kError || x.result == RemoteResult::kTimeout);
  }
  EXPECT_EQ(down.stats().errors + down.stats().timeouts, 4u);
}

}  // namespace
}  // namespace pagedkv
