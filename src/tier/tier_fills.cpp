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

std::size_t TieredKVCacheManager::local_prefix_blocks(const Request& request) const {
  manager_.check_owner(request, "TieredKVCacheManager::local_prefix_blocks");
  if (request.num_tokens() == 0) return 0;
  const BlockSequence seq = request.hashed_tokens().sequence();
  const std::size_t max_blocks =
      std::min((request.num_tokens() - 1) / bs_, seq.block_hashes.size());
  std::size_t i = 0;
  const BlockPool& pool = manager_.block_pool();
  while (i < max_blocks && pool.get_cached_block(seq.block_hashes[i]) != BlockPool::kNoBlock) ++i;
  while (i < max_blocks && host_match(seq, i) != BlockPool::kNoBlock) ++i;  // as host_holds
  return i;
}

bool TieredKVCacheManager::host_holds(const Request& request, std::size_t index) const {
  manager_.check_owner(request, "TieredKVCacheManager::host_holds");
  const BlockSequence seq = request.hashed_tokens().sequence();
  if (index >= seq.block_hashes.size()) return false;
  return host_match(seq, index) != BlockPool::kNoBlock;
}

bool TieredKVCacheManager::host_verified(const BlockSequence& seq, std::size_t index,
                                         BlockId slot) const {
  // The verified lookup names this very slot, and the parent hash stored with it matches.
  return index < seq.block_hashes.size() && host_match(seq, index) == slot;
}

std::optional<HostFill> TieredKVCacheManager::begin_fill(const Request& request,
                                                         std::size_t index) {
  manager_.check_owner(request, "TieredKVCacheManager::begin_fill");
  const BlockSequence seq = request.hashed_tokens().sequence();
  if (index >= seq.block_hashes.size() || (index + 1) * bs_ > seq.tokens.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "TieredKVCacheManager::begin_fill: request " + std::to_string(request.id()) +
                    " has no full hashed block " + std::to_string(index));
  }
  std::optional<OwnedExtraKeys> owned = owned_extra_keys(seq, index, mm_scratch_);
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
  std::memcpy(transfer_tokens_.data() + idx * bs_, seq.tokens.data() + index * bs_,
              bs_ * sizeof(TokenId));
  transfer_hash_[idx] = seq.block_hashes[index];
  transfer_parent_[idx] = index == 0 ? BlockHash() : seq.block_hashes[index - 1];
  transfer_first_[idx] = index == 0 ? 1 : 0;
  if (owned) transfer_extra_[static_cast<std::uint32_t>(idx)] = std::move(*owned);
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
