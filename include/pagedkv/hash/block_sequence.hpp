// pagedkv/hash/block_sequence.hpp: the key material of a run of full blocks - their tokens, their
// chained hashes and their extra keys - as the block pool caches and compares it. The pool sees
// this view, never a request: where the extra keys come from (a request's LoRA adapter,
// multimodal items and cache salt, see request_hasher.hpp) is the source's business.
//
// A view: valid while the objects it points into live and do not grow. Thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "pagedkv/hash/block_hash.hpp"
#include "pagedkv/hash/block_hasher.hpp"

namespace pagedkv {

// The per-block extra keys of a sequence. Implementations answer from data they own; none of
// these calls may change the source.
class BlockExtraKeySource {
 public:
  virtual ~BlockExtraKeySource() = default;
  // Whether block `block_index` has any extra key. Called for every block a lookup visits, so it
  // must be cheap; false lets the pool skip building and comparing extra keys.
  virtual bool has_extra_keys(std::size_t block_index) const noexcept = 0;
  // The extra keys of block `block_index` when the tokens are cut into blocks of `block_size`;
  // the returned views point into the source and `scratch`, and live as long as both.
  virtual BlockExtraKeys block_extra_keys(std::size_t block_index, std::uint32_t block_size,
                                          std::vector<MultiModalKey>& scratch) const = 0;
  // The sequence's LoRA adapter, which KV events report once per batch of stored blocks.
  virtual std::optional<std::string_view> lora_name() const noexcept = 0;
};

struct BlockSequence {
  std::uint32_t block_size = 0;
  std::span<const TokenId> tokens;
  std::span<const BlockHash> block_hashes;            // block i covers tokens [i * block_size, ...)
  const BlockExtraKeySource* extra_keys = nullptr;  // nullptr: no block has extra keys

  bool has_extra_keys(std::size_t block_index) const noexcept {
    return extra_keys != nullptr && extra_keys->has_extra_keys(block_index);
  }
  BlockExtraKeys block_extra_keys(std::size_t block_index,
                                  std::vector<MultiModalKey>& scratch) const {
    return extra_keys != nullptr ? extra_keys->block_extra_keys(block_index, block_size, scratch)
                                 : BlockExtraKeys{};
  }
  std::optional<std::string_view> lora_name() const noexcept {
    return extra_keys != nullptr ? extra_keys->lora_name() : std::nullopt;
  }
};

}  // namespace pagedkv
