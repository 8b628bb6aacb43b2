// pagedkv/manager/request.hpp: what the KV-cache manager needs to know about one request.
//
// A Request holds its token ids (prompt, then decoded tokens), its hash keys (cache_salt, LoRA
// name, multimodal items) and the chained hashes of its full blocks, computed incrementally as
// tokens are appended (each block exactly once; the partial tail never). The engine advances
// num_computed_tokens as its model runs; the manager reads it in allocate_slots().
// Create requests with KVCacheManager::make_request() so their hashing matches the manager's.
//
// Thread-compatible. Errors: pagedkv::Error before any change (negative token ids, bad keys,
// num_computed_tokens beyond the known tokens).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/hash/request_hasher.hpp"

namespace pagedkv {

using RequestId = std::uint64_t;

class Request {
 public:
  Request(RequestId id, BlockHasher hasher, std::uint32_t block_size,
          std::span<const TokenId> prompt, RequestHashKeys keys = {});

  RequestId id() const noexcept { return id_; }
  std::span<const TokenId> tokens() const noexcept { return seq_.tokens(); }
  std::size_t num_tokens() const noexcept { return seq_.num_tokens(); }
  std::size_t num_prompt_tokens() const noexcept { return num_prompt_tokens_; }
  std::span<const BlockHash> block_hashes() const noexcept { return seq_.block_hashes(); }
  const RequestBlockHasher& hashed_tokens() const noexcept { return seq_; }

  // Decoded (or otherwise known) tokens; hashes every block they complete.
  void append_tokens(std::span<const TokenId> tokens) { seq_.append(tokens); }
  void append_token(TokenId token) { seq_.append(token); }

  // Tokens whose KV is computed (or loaded from the cache) so far.
  std::size_t num_computed_tokens() const noexcept { return num_computed_tokens_; }
  // Throws pagedkv::Error when n > num_tokens().
  void set_num_computed_tokens(std::size_t n);

  // When true, get_computed_blocks() returns no hit (e.g. prompt logprobs need every position).
  bool skip_reading_prefix_cache = false;

  // True once KVCacheManager::free() released it; it cannot be allocated again.
  bool is_finished() const noexcept { return finished_; }

 private:
  friend class KVCacheManager;

  RequestId id_;
  RequestBlockHasher seq_;
  std::size_t num_prompt_tokens_;
  std::size_t num_computed_tokens_ = 0;
  bool finished_ = false;
};

}  // namespace pagedkv
