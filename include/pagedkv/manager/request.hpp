// pagedkv/manager/request.hpp: what the KV-cache manager needs to know about one request.
//
// A Request holds its token ids (prompt, then decoded tokens), its hash keys (cache_salt, LoRA
// name, multimodal items) and the chained hashes of its full blocks, computed incrementally as
// tokens are appended (each block exactly once; the partial tail never). The engine advances
// num_computed_tokens as its model runs; the manager reads it in allocate_slots().
// Create requests with KVCacheManager::make_request() so their hashing matches the manager's.
//
// Identity: every Request object has its own identity (a copy gets a new one; a move carries it),
// and the manager remembers which identity holds each live id, so a second Request with the id
// of a live one - a copy included - is refused instead of being taken for the first.
//
// Ownership: a request belongs to the manager whose allocate_slots() first succeeded for it, for
// the rest of its life (preempted included); every other manager refuses it (pagedkv::Error,
// nothing changed), so one manager cannot free, preempt or allocate another's request. Until
// then it belongs to no manager and any may take it. A copy belongs to no manager (a request
// replayed through several managers is copied); a move carries the owner.
//
// Retention (retention.hpp): an optional RetentionConfig the manager applies to the request's
// blocks; set_retention() validates it against the prompt first (nothing changes on an error).
//
// Thread-compatible. Errors: pagedkv::Error before any change (negative token ids, bad keys,
// num_computed_tokens beyond the known tokens, an invalid retention config).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/hash/request_hasher.hpp"
#include "pagedkv/manager/retention.hpp"

namespace pagedkv {

using RequestId = std::uint64_t;

class Request {
 public:
  Request(RequestId id, BlockHasher hasher, std::uint32_t block_size,
          std::span<const TokenId> prompt, RequestHashKeys keys = {});
  // A copy has the same tokens, keys and progress but an identity of its own (e.g. one request
  // replayed through several managers).
  Request(const Request& other);
  Request& operator=(const Request& other);
  Request(Request&&) noexcept = default;
  Request& operator=(Request&&) noexcept = default;

  RequestId id() const noexcept { return id_; }
  std::span<const TokenId> tokens() const noexcept { return seq_.tokens(); }
  std::size_t num_tokens() const noexcept { return seq_.num_tokens(); }
  std::size_t num_prompt_tokens() const noexcept { return num_prompt_tokens_; }
  std::span<const BlockHash> block_hashes() const noexcept { return seq_.block_hashes(); }
  const RequestBlockHasher& hashed_tokens() const noexcept { return seq_; }

  // Decoded (or otherwise known) tokens; hashes every block they complete. `tokens` may alias
  // this request's own tokens().
  void append_tokens(std::span<const TokenId> tokens) { seq_.append(tokens); }
  void append_token(TokenId token) { seq_.append(token); }

  // Tokens whose KV is computed (or loaded from the cache) so far.
  std::size_t num_computed_tokens() const noexcept { return num_computed_tokens_; }
  // Throws pagedkv::Error when n > num_tokens().
  void set_num_computed_tokens(std::size_t n);

  // TensorRT-LLM's kv_cache_retention_config. std::nullopt (the default): every block of the
  // request gets the default priority (the manager does nothing for it). Throws pagedkv::Error
  // for a config that RetentionConfig::validate() refuses, keeping the previous one. A change
  // applies to the blocks the request allocates, hits or releases afterwards.
  void set_retention(std::optional<RetentionConfig> config);
  const std::optional<RetentionConfig>& retention() const noexcept { return retention_; }

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
  std::optional<RetentionConfig> retention_;  // validated against num_prompt_tokens_
  std::shared_ptr<const char> identity_;      // unique per object; compared by address
  std::shared_ptr<const char> owner_;         // the owning manager's token; null: none yet
  bool finished_ = false;
};

}  // namespace pagedkv
