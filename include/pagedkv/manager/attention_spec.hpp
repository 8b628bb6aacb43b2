// pagedkv/manager/attention_spec.hpp: what kind of attention a KV-cache group serves, and so which
// cached blocks a request can reuse in it.
//
// A model's layers are split into KV-cache groups of one attention kind each (e.g. the full-
// attention layers and the sliding-window layers of Gemma or gpt-oss); one block pool serves all
// groups, and a block is cached under its group's id. Hit rules (docs/semantics.md):
//  - full attention: the longest prefix of cached blocks, searched left to right;
//  - sliding window W: searched right to left for ceil((W - 1) / B) contiguous cached blocks;
//    the positions before them hold the null block. A shorter run counts only when it reaches the
//    start of the sequence. As a request advances, blocks that leave the window are freed.
// Every group's block size must be a multiple of the smallest one: requests are hashed at the
// smallest size, and a coarser group keys its blocks by the digest of the concatenated fine hashes
// (a fixed-size digest, not the concatenation itself as vLLM's keys are).
//
// Verification (collision safety): full-attention hits compare each block's tokens, extra keys and
// parent content, so a hit is exactly a true prefix. A sliding-window run is searched right to
// left, so its blocks are checked for their own tokens and extra keys and for the chain inside
// the run, and the run's first block's stored parent identity is checked against the identity
// of the request's own blocks before it (BlockPool::cached_after_prefix): a window hit, too, is
// exactly a true prefix (null blocks before the run).
#pragma once

#include <cstdint>
#include <string>

namespace pagedkv {

enum class AttentionKind : std::uint8_t { kFull, kSlidingWindow };

struct AttentionSpec {
  AttentionKind kind = AttentionKind::kFull;
  std::uint32_t block_size = 16;
  std::uint32_t sliding_window = 0;  // tokens a query sees, itself included; kSlidingWindow only

  static AttentionSpec full(std::uint32_t block_size) {
    return {AttentionKind::kFull, block_size, 0};
  }
  static AttentionSpec sliding(std::uint32_t block_size, std::uint32_t window) {
    return {AttentionKind::kSlidingWindow, block_size, window};
  }

  // Contiguous cached blocks a sliding-window hit needs: ceil((window - 1) / block_size), without
  // overflow for any window (0 for block size 0, which KVCacheManager refuses).
  std::uint32_t window_blocks() const noexcept {
    if (sliding_window <= 1 || block_size == 0) return 0;
    const std::uint32_t seen = sliding_window - 1;
    return seen / block_size + (seen % block_size != 0 ? 1 : 0);
  }
  // Tokens at the start of a sequence that a query at position num_computed_tokens no longer
  // sees: max(0, num_computed_tokens - window + 1). Always 0 for full attention.
  std::uint64_t num_skipped_tokens(std::uint64_t num_computed_tokens) const noexcept {
    if (kind != AttentionKind::kSlidingWindow || num_computed_tokens + 1 <= sliding_window)
      return 0;
    return num_computed_tokens + 1 - sliding_window;
  }
  std::string describe() const;
};

}  // namespace pagedkv
