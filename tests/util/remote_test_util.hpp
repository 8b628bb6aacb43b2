// Helpers for RedisStore tests: deterministic block bytes, keys, and collecting completions.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagedkv/remote/redis_store.hpp"

namespace pagedkv::test {

inline BlockHash block_key(std::uint64_t i, std::uint8_t salt = 0) {
  std::array<std::uint8_t, 32> b{};
  for (int k = 0; k < 8; ++k) b[k] = static_cast<std::uint8_t>(i >> (8 * k));
  b[8] = salt;
  b[31] = 0xa5;
  return BlockHash(b);
}

inline std::vector<std::byte> block_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<std::byte>(x & 0xff);
  }
  return v;
}

// Waits (RedisStore::wait) until n completions arrived or `limit` passed; sorted by ticket, index.
inline std::vector<RemoteCompletion> collect(
    RedisStore& store, std::size_t n,
    std::chrono::milliseconds limit = std::chrono::milliseconds(20000)) {
  std::vector<RemoteCompletion> all;
  std::vector<RemoteCompletion> buf;
  const auto end = std::chrono::steady_clock::now() + limit;
  while (all.size() < n && std::chrono::steady_clock::now() < end) {
    buf.clear();
    store.wait(buf, std::chrono::milliseconds(20));
    all.insert(all.end(), buf.begin(), buf.end());
  }
  std::sort(all.begin(), all.end(), [](const RemoteCompletion& a, const RemoteCompletion& b) {
    return a.ticket != b.ticket ? a.ticket < b.ticket : a.index < b.index;
  });
  return all;
}

inline std::size_t count_result(const std::vector<RemoteCompletion>& c, RemoteResult r) {
  return static_cast<std::size_t>(
      std::count_if(c.begin(), c.end(), [r](const RemoteCompletion& x) { return x.result == r; }));
}

}  // namespace pagedkv::test
