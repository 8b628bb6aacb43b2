// TieredKVCacheManager: fills from a store below the host tier (what RemoteTier calls: local
// prefix, verified host holdings, fills into pinned host slots). Contract:
// tiered_kv_cache_manager.hpp.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "pagedkv/base/error.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"
#include "tiered_kv_cache_manager_internal.hpp"

namespace pagedkv {

namespace {
[[noreturn]] void throw_hybrid_below(const char* what) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string("TieredKVCacheManager::") + what +
                  ": not supported for hybrid models (RemoteTier computes a hybrid request's "
                  "local hit itself)");
}
}  // namespace

std::size_t TieredKVCacheManager::local_prefix_blocks(const Request& request) const {
  manager_.check_owner(request, "TieredKVCacheManager::local_prefix_blocks");
  if (hybrid_) throw_hybrid_below("local_prefix_blocks");
  if (request.num_tokens() == 0) return 0;
  const BlockSequence seq = request.hashed_tokens().sequence();
  const std::size_t max_blocks =
      std::min((request.num_tokens() - 1) / bs_, seq.block_hashes.size());
  std::size_t i = 0;
  const BlockPool& pool = manager_.block_pool();
  while (i < max_blocks && pool.get_cached_block(seq.block_hashes[i]) != BlockPool::kNoBlock) ++i;
  if (host_chain_) {
    while (i < max_blocks && host_match(seq, i, nullptr) != BlockPool::kNoBlock) ++i;
    return i;
  }
  // As host_holds, the identities computed once (only when a host candidate is found).
  std::vector<BlockHash> ids;
  std::vector<MultiModalKey> scratch;
  while (i < max_blocks && host_.match_cached_block_unanchored(seq, i) != BlockPool::kNoBlock) {
    if (ids.empty()) sequence_identities(seq, i + 1, ids);
    if (ids.size() <= i) ids.push_back(identity_after(&ids.back(), seq, i, scratch));
    if (host_match(seq, i, &ids[i]) == BlockPool::kNoBlock) break;
    ++i;
  }
  return i;
}

bool TieredKVCacheManager::host_holds(const Request& request, std::size_t index,
                                      GroupId group) const {
  manager_.check_owner(request, "TieredKVCacheManager::host_holds");
  check_fill_group(group, "host_holds");
  const BlockSequence fine = request.hashed_tokens().sequence();
  // Group `group`'s view: its own blocks, keyed as the GPU manager keys them.
  const std::size_t f = factor_[group];
  std::vector<std::vector<BlockHash>> coarse(f > 1 ? factor_.size() : 0);
  const BlockSequence seq = group_seq(fine, group, coarse);
  if (index >= seq.block_hashes.size() || (index + 1) * seq.block_size > seq.tokens.size()) {
    return false;
  }
  if (host_chain_) return host_match(seq, index, nullptr, group) != BlockPool::kNoBlock;
  if (host_.match_cached_block_unanchored(seq, index, group) == BlockPool::kNoBlock) return false;
  // The identity of the fine block the group's block ends with (as the tier stores it).
  std::vector<BlockHash> ids;
  sequence_identities(fine, (index + 1) * f, ids);
  return host_match(seq, index, &ids[(index + 1) * f - 1], group) != BlockPool::kNoBlock;
}

void TieredKVCacheManager::check_fill_group(GroupId group, const char* what) const {
  if (static_cast<std::size_t>(group) >= window_blocks_.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string("TieredKVCacheManager::") + what + ": group " + std::to_string(group) +
                    " of a tier with " + std::to_string(window_blocks_.size()) + " groups");
  }
}

bool TieredKVCacheManager::host_verified(const BlockSequence& seq, std::size_t index, BlockId slot,
                                         const BlockHash* identity, GroupId group) const {
  // The verified lookup names this very slot, and the parent hash (or prefix identity) stored
  // with it matches.
  return index < seq.block_hashes.size() && host_match(seq, index, identity, group) == slot;
}

BlockHash TieredKVCacheManager::identity_after(const BlockHash* parent, const BlockSequence& seq,
                                               std::size_t index,
                                               std::vector<MultiModalKey>& scratch) const {
  BlockExtraKeys extra;
  if (seq.has_extra_keys(index)) extra = seq.block_extra_keys(index, scratch);
  return identity_hasher_.hash_block(parent != nullptr ? *parent : identity_hasher_.none_hash(),
                                     seq.tokens.subspan(index * bs_, bs_), extra);
}

void TieredKVCacheManager::sequence_identities(const BlockSequence& seq, std::size_t end,
                                               std::vector<BlockHash>& out) const {
  out.clear();
  end = std::min({end, seq.block_hashes.size(), seq.tokens.size() / bs_});
  out.reserve(end);
  std::vector<MultiModalKey> scratch;
  for (std::size_t i = 0; i < end; ++i) {
    out.push_back(identity_after(i == 0 ? nullptr : &out.back(), seq, i, scratch));
  }
}

void TieredKVCacheManager::prefix_identities(const Request& request, std::size_t end,
                                             std::vector<BlockHash>& out) const {
  manager_.check_owner(request, "TieredKVCacheManager::prefix_identities");
  if (host_chain_) {
    out.clear();
    return;
  }
  std::vector<BlockHash> ids;  // built aside: `out` is replaced only on success
  sequence_identities(request.hashed_tokens().sequence(), end, ids);
  out.swap(ids);
}

const BlockHash& TieredKVCacheManager::host_slot_identity(BlockId slot) const noexcept {
  static const BlockHash kNone;
  return host_chain_ ? kNone : host_identity_[static_cast<std::size_t>(slot)];
}

BlockHash TieredKVCacheManager::host_slot_parent(BlockId slot) const noexcept {
  return host_.stored_parent_hash(slot);
}

std::optional<HostFill> TieredKVCacheManager::begin_fill(const Request& request, std::size_t index,
                                                         GroupId group) {
  return begin_fill_known(request, index, nullptr, group);
}

std::optional<HostFill> TieredKVCacheManager::begin_fill_known(const Request& request,
                                                               std::size_t index,
                                                               const BlockHash* known_identity,
                                                               GroupId group,
                                                               const BlockSequence* group_view) {
  manager_.check_owner(request, "TieredKVCacheManager::begin_fill");
  check_fill_group(group, "begin_fill");
  const BlockSequence fine = request.hashed_tokens().sequence();
  // Group `group`'s view: its own blocks, keyed as the GPU manager keys them.
  // (RemoteTier passes the view it computed once per request: no O(blocks) keys per fill.)
  const std::size_t f = factor_[group];
  std::vector<std::vector<BlockHash>> coarse(f > 1 && group_view == nullptr ? factor_.size() : 0);
  const BlockSequence seq = group_view != nullptr ? *group_view : group_seq(fine, group, coarse);
  const std::uint32_t gbs = seq.block_size;
  if (index >= seq.block_hashes.size() || (index + 1) * gbs > seq.tokens.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "TieredKVCacheManager::begin_fill: request " + std::to_string(request.id()) +
                    " has no full hashed block " + std::to_string(index) +
                    (f > 1 ? " of group " + std::to_string(group) + " (block size " +
                                 std::to_string(gbs) + ")"
                           : std::string()));
  }
  SharedExtraKeys extra = shared_extra_keys(seq, index, mm_scratch_);
  // The prefix identity of the fine block the group's block ends with (as the tier stores it).
  BlockHash identity;
  if (!host_chain_ && known_identity != nullptr) {
    identity = *known_identity;
  } else if (!host_chain_) {
    std::vector<BlockHash> ids;
    sequence_identities(fine, (index + 1) * f, ids);
    identity = ids[(index + 1) * f - 1];
  }
  reserve_transfers(1);
  bool evicted = false;  // the slot held a cached block, evicted now
  const std::optional<BlockId> taken = take_host_slot(evicted);
  if (!taken) {
    ++stats_.stores_skipped_full;
    return std::nullopt;
  }
  const BlockId slot = *taken;
  const TransferId id = open_transfer(Kind::kFill, nullptr, kNullBlockId, slot, 0);
  const auto idx = static_cast<std::size_t>(id & kIndexMask);
  transfers_[idx].group = group;  // the slot is cached under (hash, group) when committed
  std::memcpy(transfer_tokens_.data() + idx * stride_, seq.tokens.data() + index * gbs,
              gbs * sizeof(TokenId));
  transfer_hash_[idx] = seq.block_hashes[index];
  transfer_parent_[idx] = index == 0 ? BlockHash() : seq.block_hashes[index - 1];
  transfer_first_[idx] = index == 0 ? 1 : 0;
  if (!host_chain_) transfer_identity_[idx] = identity;
  transfer_extra_[idx] = std::move(extra);  // (the slab entry's room: no allocation)
  ++host_storing_;
  if (evicted && hooks_.on_evicted) hooks_.on_evicted(slot);
  return HostFill{id, slot};
}

void TieredKVCacheManager::pin_host_slot(BlockId slot) {
  if (slot < 1 || slot >= host_.num_blocks() || !host_.block(slot).is_cached()) {
    throw Error(ErrorCode::kInvalidArgument, "TieredKVCacheManager::pin_host_slot: slot " +
                                                 std::to_string(slot) + " holds no cached block");
  }
  host_.touch(std::span<const BlockId>(&slot, 1));
  ++host_pins_[static_cast<std::size_t>(slot)];
  ++num_host_pins_;
}

void TieredKVCacheManager::unpin_host_slot(BlockId slot) {
  if (slot < 1 || slot >= host_.num_blocks() || host_pins_[static_cast<std::size_t>(slot)] == 0) {
    throw Error(ErrorCode::kInvalidArgument, "TieredKVCacheManager::unpin_host_slot: slot " +
                                                 std::to_string(slot) + " is not pinned");
  }
  --host_pins_[static_cast<std::size_t>(slot)];
  --num_host_pins_;
  host_.free_block(slot);
}

}  // namespace pagedkv
