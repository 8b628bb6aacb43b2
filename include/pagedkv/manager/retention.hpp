// pagedkv/manager/retention.hpp: how long a request's blocks should stay cached (TensorRT-LLM's
// KvCacheRetentionConfig, per request).
//
// A request may carry a RetentionConfig: retention priorities (0..100, the pool's
// RetentionPriority; kDefaultRetentionPriority for tokens no range names) for token ranges of its
// prompt, each with an optional duration after which the blocks fall back to the default
// priority, and a priority (and duration) for the blocks of generated tokens. The manager applies
// it to the request's blocks (kv_cache_manager.hpp): a block takes the highest priority of the
// tokens it holds (a range, the default for prompt tokens no range covers, the decode priority
// for tokens past the prompt), and of those parts at that priority the longest duration (none:
// for ever). Durations count ticks of the manager's clock (KVCacheManagerConfig::retention_clock)
// from the block's last use: its allocation, any hit (the pool renews it) and the request's
// release. Blocks of higher priority are evicted only after every evictable block of lower
// priority (the pool's rule, pool/retention.hpp). A block shared by requests takes the highest
// priority they asked for, a request without a config asking the default (kv_cache_manager.hpp,
// docs/retention.md "Shared blocks").
//
// Errors: validate() throws pagedkv::Error (kInvalidArgument / kOutOfRange) naming the problem: a
// priority above 100, a duration that is not positive, an empty range, ranges unsorted or
// overlapping, a range past the prompt. Plain data otherwise; thread-compatible. O(ranges) to
// validate, O(log ranges + ranges a block overlaps) per block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "pagedkv/pool/retention.hpp"

namespace pagedkv {

// TensorRT-LLM's TokenRangeRetentionConfig: prompt tokens [token_start, token_end).
struct TokenRangeRetention {
  std::size_t token_start = 0;
  std::optional<std::size_t> token_end;  // exclusive; std::nullopt: the end of the prompt
  RetentionPriority priority = kDefaultRetentionPriority;
  std::optional<RetentionTick> duration;  // ticks; std::nullopt: never decays

  bool operator==(const TokenRangeRetention&) const = default;
};

struct RetentionConfig {
  // Sorted by token_start, not overlapping, inside the prompt.
  std::vector<TokenRangeRetention> token_ranges;
  RetentionPriority decode_retention_priority = kDefaultRetentionPriority;  // generated tokens
  std::optional<RetentionTick> decode_duration;

  bool operator==(const RetentionConfig&) const = default;
  // Throws pagedkv::Error naming the first problem (see the file comment) for a request with
  // num_prompt_tokens prompt tokens.
  void validate(std::size_t num_prompt_tokens) const;
};

// What the manager asks the pool for one block: a priority, and a duration (std::nullopt: no
// expiry). (The pool's own record of a block is BlockRetention, pool/retention.hpp.)
struct RetentionAsk {
  RetentionPriority priority = kDefaultRetentionPriority;
  std::optional<RetentionTick> duration;

  bool operator==(const RetentionAsk&) const = default;
};

// The retention of the block holding tokens [begin, end) of a request with num_prompt_tokens
// prompt tokens under a validated `config` (the rule of the file comment). noexcept.
RetentionAsk retention_ask(const RetentionConfig& config, std::size_t num_prompt_tokens,
                           std::size_t begin, std::size_t end) noexcept;

}  // namespace pagedkv
