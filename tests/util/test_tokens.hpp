// tests/util/test_tokens.hpp: the token sequences tests and benchmarks build prompts from (shared
// here once instead of copied into each file). Test-only; never installed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "pagedkv/hash/block_hasher.hpp"

namespace pagedkv {

// first, first + 1, ..., first + n - 1.
inline std::vector<TokenId> iota_tokens(TokenId first, std::size_t n) {
  std::vector<TokenId> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// n token ids drawn uniformly from a Llama-3-sized vocabulary [0, 128255], reproducibly per seed.
inline std::vector<TokenId> random_tokens(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<TokenId> dist(0, 128255);
  std::vector<TokenId> v(n);
  for (auto& t : v) t = dist(rng);
  return v;
}

}  // namespace pagedkv
