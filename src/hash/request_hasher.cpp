#include "pagedkv/hash/request_hasher.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <string>
#include <utility>

#include "../base/vector_growth.hpp"
#include "pagedkv/base/error.hpp"

namespace pagedkv {

namespace {

void validate_keys(const RequestHashKeys& keys) {
  if (keys.lora_name && keys.lora_name->empty()) {
    throw Error(ErrorCode::kInvalidArgument, "request hash keys: LoRA name is present but empty");
  }
  if (keys.cache_salt && keys.cache_salt->empty()) {
    throw Error(ErrorCode::kInvalidArgument, "request hash keys: cache_salt is present but empty");
  }
  for (std::size_t i = 0; i < keys.mm_items.size(); ++i) {
    const MultiModalItem& item = keys.mm_items[i];
    const std::string where = "multimodal item " + std::to_string(i) + ": ";
    if (item.identifier.empty()) {
      throw Error(ErrorCode::kInvalidArgument, where + "empty identifier");
    }
    if (item.offset < 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  where + "negative offset " + std::to_string(item.offset));
    }
    if (item.length <= 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  where + "length " + std::to_string(item.length) + " (must be positive)");
    }
    if (item.length > std::numeric_limits<std::int64_t>::max() - item.offset) {
      throw Error(ErrorCode::kInvalidArgument, where + "offset " + std::to_string(item.offset) +
                                                   " + length " + std::to_string(item.length) +
                                                   " overflows a 64-bit token position");
    }
    if (i > 0) {
      const MultiModalItem& prev = keys.mm_items[i - 1];
      if (item.offset < prev.offset + prev.length) {
        throw Error(ErrorCode::kInvalidArgument,
                    where + "starts at " + std::to_string(item.offset) +
                        ", before the previous item ends at " +
                        std::to_string(prev.offset + prev.length) +
                        " (items must be sorted by offset and must not overlap)");
      }
    }
  }
}

}  // namespace

RequestBlockHasher::RequestBlockHasher(BlockHasher hasher, std::uint32_t block_size,
                                       RequestHashKeys keys)
    : hasher_(std::move(hasher)), block_size_(block_size), keys_(std::move(keys)) {
  if (block_size_ == 0) {
    throw Error(ErrorCode::kInvalidArgument, "RequestBlockHasher: block size must be at least 1");
  }
  validate_keys(keys_);
}

BlockExtraKeys block_extra_keys(const RequestHashKeys& keys, std::size_t block_index,
                                std::uint32_t block_size, std::vector<MultiModalKey>& scratch) {
  BlockExtraKeys extra;
  if (keys.lora_name) extra.lora_name = *keys.lora_name;
  if (block_index == 0 && keys.cache_salt) extra.cache_salt = *keys.cache_salt;
  scratch.clear();
  if (!keys.mm_items.empty()) {
    const auto start = static_cast<std::int64_t>(block_index) * block_size;
    const std::int64_t end = start + block_size;
    // Items are sorted and disjoint, so their ends are sorted too: skip those ending by `start`.
    auto it = std::partition_point(
        keys.mm_items.begin(), keys.mm_items.end(),
        [start](const MultiModalItem& item) { return item.offset + item.length <= start; });
    for (; it != keys.mm_items.end() && it->offset < end; ++it) {
      scratch.push_back(MultiModalKey{it->identifier, it->offset - start});
    }
    extra.mm_items = scratch;
  }
  return extra;
}

void RequestBlockHasher::append(std::span<const TokenId> tokens) {
  // Appending our own tokens (or part of them): copy first, since the insert below may
  // reallocate the storage `tokens` points into.
  const std::less<const TokenId*> before;
  if (!tokens.empty() && !before(tokens.data(), tokens_.data()) &&
      before(tokens.data(), tokens_.data() + tokens_.size())) {
    const std::vector<TokenId> copy(tokens.begin(), tokens.end());
    append(copy);
    return;
  }
  // Every token is checked once, here (a vectorizable OR); the hasher then skips its own check.
  std::uint32_t sign_bits = 0;
  for (const TokenId t : tokens) sign_bits |= static_cast<std::uint32_t>(t);
  if ((sign_bits >> 31) != 0) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0) {
        throw Error(ErrorCode::kInvalidArgument,
                    "RequestBlockHasher::append: token id " + std::to_string(tokens[i]) +
                        " at position " + std::to_string(i) +
                        " is negative; token ids are non-negative 32-bit");
      }
    }
  }
  const std::size_t old_tokens = tokens_.size();
  const std::size_t old_blocks = block_hashes_.size();
  try {
    tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
    const std::size_t full_blocks = tokens_.size() / block_size_;
    // Geometric growth: a decode loop appending one token at a time must not reallocate at
    // every new block.
    detail::reserve_more(block_hashes_, full_blocks - old_blocks);
    // Without a LoRA name and multimodal items, only block 0 can have extra keys (the salt):
    // the other blocks skip building them.
    const bool plain = !keys_.lora_name && keys_.mm_items.empty();
    for (std::size_t b = old_blocks; b < full_blocks; ++b) {
      const BlockHash& parent = b == 0 ? hasher_.none_hash() : block_hashes_[b - 1];
      const std::span<const TokenId> block(tokens_.data() + b * block_size_, block_size_);
      block_hashes_.push_back(hasher_.hash_block_impl(parent, block,
                                                      plain && (b > 0 || !keys_.cache_salt)
                                                          ? BlockExtraKeys{}
                                                          : block_extra_keys(b, mm_scratch_),
                                                      /*tokens_checked=*/true));
    }
  } catch (...) {
    tokens_.resize(old_tokens);
    block_hashes_.resize(old_blocks);
    throw;
  }
}

std::vector<BlockHash> hash_request_blocks(const BlockHasher& hasher, std::uint32_t block_size,
                                           std::span<const TokenId> tokens,
                                           const RequestHashKeys& keys) {
  RequestBlockHasher request(hasher, block_size, keys);
  request.append(tokens);
  const auto hashes = request.block_hashes();
  return {hashes.begin(), hashes.end()};
}

}  // namespace pagedkv
