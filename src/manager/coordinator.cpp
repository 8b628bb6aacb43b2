#include "pagedkv/manager/coordinator.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/full_attention.hpp"
#include "pagedkv/manager/sliding_window.hpp"

namespace pagedkv {

namespace {

std::vector<KVCacheGroup> make_groups(const std::vector<AttentionSpec>& specs) {
  if (specs.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "KVCacheManager: at least one KV-cache group");
  }
  if (specs.size() > 255) {
    throw Error(ErrorCode::kInvalidArgument, "KVCacheManager: at most 255 KV-cache groups");
  }
  // Each spec's own fields first: the smallest block size below divides every other one.
  for (std::size_t g = 0; g < specs.size(); ++g) {
    const AttentionSpec& s = specs[g];
    const std::string where = "KVCacheManager: group " + std::to_string(g) + ": ";
    if (s.kind != AttentionKind::kFull && s.kind != AttentionKind::kSlidingWindow) {
      throw Error(ErrorCode::kInvalidArgument,
                  where + "attention kind " + std::to_string(static_cast<int>(s.kind)) +
                      " is neither full attention nor a sliding window");
    }
    if (s.block_size == 0) throw Error(ErrorCode::kInvalidArgument, where + "block size 0");
  }
  std::uint32_t smallest = specs.front().block_size;
  for (const AttentionSpec& s : specs) smallest = std::min(smallest, s.block_size);
  std::vector<KVCacheGroup> groups;
  for (std::size_t g = 0; g < specs.size(); ++g) {
    const AttentionSpec& s = specs[g];
    const std::string where = "KVCacheManager: group " + std::to_string(g) + ": ";
    if (s.block_size % smallest != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  where + "block size " + std::to_string(s.block_size) +
                      " is not a multiple of the smallest group block size " +
                      std::to_string(smallest));
    }
    if (s.kind == AttentionKind::kSlidingWindow && s.sliding_window == 0) {
      throw Error(ErrorCode::kInvalidArgument, where + "a sliding window of 0 tokens");
    }
    groups.push_back(KVCacheGroup{s, static_cast<GroupId>(g), s.block_size / smallest});
  }
  return groups;
}

// The least common multiple of the group block sizes (the hybrid hit alignment). Throws when it
// does not fit a size_t (std::lcm's result would be undefined).
std::size_t block_size_lcm(const std::vector<KVCacheGroup>& groups) {
  std::size_t lcm = 1;
  for (const KVCacheGroup& g : groups) {
    const std::size_t bs = g.spec.block_size;
    std::size_t next = 0;
    if (__builtin_mul_overflow(lcm / std::gcd(lcm, bs), bs, &next)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "KVCacheManager: the least common multiple of the group block sizes overflows "
                  "a 64-bit token count");
    }
    lcm = next;
  }
  return lcm;
}

// Coarse keys are plain digests of fine hashes: SHA-256 for both SHA-256 schemes.
HashScheme digest_scheme(HashScheme scheme) {
  return scheme == HashScheme::kXxh3_128 ? HashScheme::kXxh3_128 : HashScheme::kSha256;
}

}  // namespace

KVCacheCoordinator::KVCacheCoordinator(std::vector<AttentionSpec> specs, HashScheme scheme)
    : groups_(make_groups(specs)),
      digest_scheme_(digest_scheme(scheme)),
      hash_block_size_(groups_.front().spec.block_size / groups_.front().factor),
      alignment_(block_size_lcm(groups_)),
      looked_up_(groups_.size(), false) {}

std::uint32_t KVCacheCoordinator::max_block_size() const noexcept {
  std::uint32_t m = 0;
  for (const KVCacheGroup& g : groups_) m = std::max(m, g.spec.block_size);
  return m;
}

BlockSequence KVCacheCoordinator::group_sequence(const BlockSequence& fine, std::size_t g,
                                                 std::vector<BlockHash>& coarse) const {
  const KVCacheGroup& group = groups_[g];
  if (group.factor == 1) return fine;
  std::vector<std::uint8_t> bytes;
  for (std::size_t j = coarse.size(); j < fine.block_hashes.size() / group.factor; ++j) {
    bytes.clear();
    for (std::size_t k = j * group.factor; k < (j + 1) * group.factor; ++k) {
      const auto b = fine.block_hashes[k].bytes();
      bytes.insert(bytes.end(), b.begin(), b.end());
    }
    coarse.push_back(raw_digest(digest_scheme_, bytes));
  }
  BlockSequence seq = fine;
  seq.block_size = group.spec.block_size;
  seq.block_hashes = coarse;
  return seq;
}

std::size_t KVCacheCoordinator::find_longest_cache_hit(
    const BlockPool& pool, const BlockSequence& fine, std::size_t max_tokens,
    std::vector<std::vector<BlockId>>& per_group) {
  per_group.resize(groups_.size());
  if (groups_.size() == 1 && groups_[0].spec.kind == AttentionKind::kFull) {
    // Unitary (vLLM's UnitaryKVCacheCoordinator): one lookup, nothing to agree on.
    const std::size_t bs = groups_[0].spec.block_size;
    coarse_scratch_.clear();
    find_full_attention_hit(pool, group_sequence(fine, 0, coarse_scratch_), groups_[0].id,
                            max_tokens / bs, bs, per_group[0], &lookup_scratch_);
    return per_group[0].size() * bs;
  }
  looked_up_.assign(groups_.size(), false);
  std::size_t hit_tokens = max_tokens;
  for (;;) {
    std::size_t length = hit_tokens;
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      const KVCacheGroup& group = groups_[g];
      const std::size_t bs = group.spec.block_size;
      if (group.spec.kind == AttentionKind::kFull && looked_up_[g]) {
        per_group[g].resize(std::min(per_group[g].size(), length / bs));
      } else {
        coarse_scratch_.clear();
        const BlockSequence seq = group_sequence(fine, g, coarse_scratch_);
        const std::size_t alignment = groups_.size() == 1 ? bs : alignment_;
        if (group.spec.kind == AttentionKind::kFull) {
          find_full_attention_hit(pool, seq, group.id, length / bs, alignment, per_group[g],
                                  &lookup_scratch_);
        } else {
          // A full-attention hit at the same block size is a verified prefix: it anchors the
          // window's run without a walk of its own (content identities are group-independent).
          std::span<const BlockId> verified;
          for (std::size_t f = 0; f < groups_.size(); ++f) {
            if (looked_up_[f] && groups_[f].spec.kind == AttentionKind::kFull &&
                groups_[f].spec.block_size == bs && per_group[f].size() > verified.size()) {
              verified = per_group[f];
            }
          }
          per_group[g] = find_sliding_window_hit(pool, seq, group.id, group.spec, length / bs,
                                                 alignment, &lookup_scratch_, verified);
        }
        looked_up_[g] = true;
      }
      length = per_group[g].size() * bs;
    }
    if (length >= hit_tokens) break;
    hit_tokens = length;
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    per_group[g].resize(hit_tokens / groups_[g].spec.block_size);
  }
  return hit_tokens;
}

bool KVCacheCoordinator::block_can_hit(std::size_t g, std::size_t block_index) const noexcept {
  const AttentionSpec& spec = groups_[g].spec;
  if (spec.kind != AttentionKind::kSlidingWindow || groups_.size() == 1) return true;
  const std::size_t per_unit = alignment_ / spec.block_size;
  const std::size_t next_end = (block_index / per_unit + 1) * per_unit;
  return next_end <= block_index + spec.window_blocks();
}

}  // namespace pagedkv
