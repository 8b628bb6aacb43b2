// Links only pagedkv::hash (a router needs hashing alone) and checks a known vLLM block hash.
#include <pagedkv/hash/block_hasher.hpp>

#include <numeric>
#include <vector>

int main() {
  std::vector<pagedkv::TokenId> tokens(16);
  std::iota(tokens.begin(), tokens.end(), 0);
  const pagedkv::BlockHasher hasher(pagedkv::HashScheme::kSha256CborVllm);
  const auto hash = pagedkv::hash_block_tokens(hasher, nullptr, tokens);
  return hash.to_hex() == "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749" ? 0
                                                                                               : 1;
}
