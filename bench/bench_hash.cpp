// Block hashing cost per 16-token block, for every scheme, against the raw digest (SHA-256 or
// XXH3-128) of exactly the same serialized bytes measured in the same run. The ratio
// raw_ns / scheme_ns is what serializing and chaining cost: 1.0 would be free.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/hash/request_hasher.hpp"
#include "test_tokens.hpp"

namespace {

using pagedkv::BlockHash;
using pagedkv::BlockHasher;
using pagedkv::HashScheme;
using pagedkv::random_tokens;
using pagedkv::TokenId;

// Realistic token ids: a 128k vocabulary, so CBOR uses 1-, 3- and 5-byte integers.
HashScheme digest_of(HashScheme scheme) {
  return scheme == HashScheme::kXxh3_128 ? HashScheme::kXxh3_128 : HashScheme::kSha256;
}

// One chained block: parent -> hash_block(parent, 16 tokens).
void BM_HashBlock(benchmark::State& state, HashScheme scheme) {
  const BlockHasher hasher(scheme, "bench");
  const auto tokens = random_tokens(16, 1);
  BlockHash parent = hasher.none_hash();
  for (auto _ : state) {
    parent = hasher.hash_block(parent, tokens);
    benchmark::DoNotOptimize(parent);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["bytes_hashed"] =
      static_cast<double>(hasher.encode_block(hasher.none_hash(), tokens).size());
}

// The raw digest of the same bytes hash_block() feeds it, without serializing: each iteration
// copies the previous digest over the parent field and hashes the buffer, so the raw digest has
// the same serial dependency as a real chain (independent digests would overlap in the CPU).
void BM_RawDigest(benchmark::State& state, HashScheme scheme) {
  const BlockHasher hasher(scheme, "bench");
  const auto tokens = random_tokens(16, 1);
  auto bytes = hasher.encode_block(hasher.none_hash(), tokens);
  // The parent digest sits at offset 0 (pagedkv encoding) or 3 (CBOR: 0x83 0x58 0x20).
  const std::size_t parent_at = scheme == HashScheme::kSha256CborVllm ? 3 : 0;
  BlockHash h = hasher.none_hash();
  for (auto _ : state) {
    std::memcpy(bytes.data() + parent_at, h.bytes().data(), h.size());
    h = pagedkv::raw_digest(digest_of(scheme), bytes);
    benchmark::DoNotOptimize(h);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["bytes_hashed"] = static_cast<double>(bytes.size());
}

// A whole 2,048-token prompt through the incremental request hasher (128 blocks), with a salt.
void BM_RequestPrompt2k(benchmark::State& state, HashScheme scheme) {
  const BlockHasher hasher(scheme, "bench");
  const auto tokens = random_tokens(2048, 2);
  pagedkv::RequestHashKeys keys;
  keys.cache_salt = "tenant";
  for (auto _ : state) {
    pagedkv::RequestBlockHasher request(hasher, 16, keys);
    request.append(tokens);
    benchmark::DoNotOptimize(request.block_hashes().data());
  }
  state.SetItemsProcessed(state.iterations() * 128);  // items = blocks
}

BENCHMARK_CAPTURE(BM_HashBlock, sha256, HashScheme::kSha256);
BENCHMARK_CAPTURE(BM_RawDigest, sha256, HashScheme::kSha256);
BENCHMARK_CAPTURE(BM_HashBlock, sha256_cbor_vllm, HashScheme::kSha256CborVllm);
BENCHMARK_CAPTURE(BM_RawDigest, sha256_cbor_vllm, HashScheme::kSha256CborVllm);
BENCHMARK_CAPTURE(BM_HashBlock, xxh3_128, HashScheme::kXxh3_128);
BENCHMARK_CAPTURE(BM_RawDigest, xxh3_128, HashScheme::kXxh3_128);
BENCHMARK_CAPTURE(BM_RequestPrompt2k, sha256, HashScheme::kSha256);
BENCHMARK_CAPTURE(BM_RequestPrompt2k, sha256_cbor_vllm, HashScheme::kSha256CborVllm);
BENCHMARK_CAPTURE(BM_RequestPrompt2k, xxh3_128, HashScheme::kXxh3_128);

}  // namespace

BENCHMARK_MAIN();
