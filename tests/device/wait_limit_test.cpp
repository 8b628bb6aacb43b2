// The rule that ends an sm_90a kernel's barrier wait in a trap (kernels/internal/wait_limit.hpp),
// on the host: a wait expires only once the global timer has advanced by more than the limit
// since the wait began; a timer that reads smaller than at the start (nothing in the ISA rules it
// out) never expires it, nor does one that wraps around 2^64 within the limit.
#include "internal/wait_limit.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace pagedkv {
namespace {

using kernels::mbar::wait_expired;

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

TEST(WaitLimit, ExpiresOnlyPastTheLimit) {
  const std::uint64_t limit = 10'000'000'000ull;  // 10 s, as an example limit
  for (const std::uint64_t start :
       {std::uint64_t{0}, std::uint64_t{1'700'000'000'000'000'000}, kMax - limit / 2}) {
    EXPECT_FALSE(wait_expired(start, start, limit));
    EXPECT_FALSE(wait_expired(start, start + 1, limit));
    EXPECT_FALSE(wait_expired(start, start + limit, limit));  // wraps for the last start
    EXPECT_TRUE(wait_expired(start, start + limit + 1, limit));
    EXPECT_TRUE(wait_expired(start, start + 2 * limit, limit));
  }
}

TEST(WaitLimit, ATimerThatStepsBackDoesNotExpireTheWait) {
  const std::uint64_t limit = 10'000'000'000ull;
  const std::uint64_t start = 1'700'000'000'000'000'000ull;  // a %globaltimer-like epoch value
  EXPECT_FALSE(wait_expired(start, start - 1, limit)) << "one tick back read as 2^64 - 1 ns";
  EXPECT_FALSE(wait_expired(start, start - 1'000'000, limit));
  EXPECT_FALSE(wait_expired(start, 0, limit));
  // And the wait still expires once the timer has gone past start + limit.
  EXPECT_TRUE(wait_expired(start, start + limit + 1, limit));
}

}  // namespace
}  // namespace pagedkv
