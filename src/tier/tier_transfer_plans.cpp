// TieredKVCacheManager: the transfer plans of allocate_slots (host slots taken and refreshed,
// stores of new and evicted blocks, loads of a host hit). Contract: tiered_kv_cache_manager.hpp.
#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "pagedkv/base/error.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"
#include "tiered_kv_cache_manager_internal.hpp"

namespace pagedkv {

void TieredKVCacheManager::reserve_copies(std::size_t evictions, std::size_t stores) {
  copies_.plan.evictions.clear();
  copies_.eviction_ids.clear();
  copies_.plan.stores.clear();
  copies_.store_ids.clear();
  reserve_room(copies_.plan.evictions, evictions);
  reserve_room(copies_.eviction_ids, evictions);
  reserve_room(copies_.plan.stores, stores);
  reserve_room(copies_.store_ids, stores);
}

void TieredKVCacheManager::hand_over_copies(TierPlan& out) noexcept {
  if (!copies_.plan.evictions.empty()) {
    out.plan.evictions.swap(copies_.plan.evictions);
    out.eviction_ids.swap(copies_.eviction_ids);
  }
  if (!copies_.plan.stores.empty()) {
    out.plan.stores.swap(copies_.plan.stores);
    out.store_ids.swap(copies_.store_ids);
  }
}

void TieredKVCacheManager::release_state(RequestMap::iterator it) noexcept {
  spare_requests_.give(requests_, it, [](RequestState& st) noexcept {
    st = RequestState{};
    return true;
  });
}

void TieredKVCacheManager::reserve_transfers(std::size_t more) {
  const std::size_t want = transfers_.size() + more;
  reserve_room(transfers_, want);
  reserve_room(free_transfers_, want);
  reserve_room(transfer_tokens_, want * stride_);
  reserve_room(transfer_hash_, want);
  reserve_room(transfer_parent_, want);
  reserve_room(transfer_first_, want);
  if (!host_chain_) reserve_room(transfer_identity_, want);
  reserve_room(transfer_extra_, want);
}

std::uint32_t TieredKVCacheManager::grow_transfers() {
  const auto idx = static_cast<std::uint32_t>(transfers_.size());
  transfers_.emplace_back();
  transfer_tokens_.resize(transfer_tokens_.size() + stride_);
  transfer_hash_.emplace_back();
  transfer_parent_.emplace_back();
  transfer_first_.push_back(0);
  if (!host_chain_) transfer_identity_.emplace_back();
  transfer_extra_.emplace_back();
  return idx;
}

BlockSequence TieredKVCacheManager::content_sequence(const std::vector<TokenId>& tokens,
                                                     const BlockHash* hashes, bool first,
                                                     const ContentSource* extra,
                                                     std::uint32_t block_size) const {
  // Block 1 of a two-block view (block 0 stands for the parent: its hash, dummy tokens), or a
  // one-block view of a chain's first block.
  BlockSequence seq;
  seq.block_size = block_size;
  seq.extra_keys = extra;
  if (first) {
    seq.tokens = std::span<const TokenId>(tokens).subspan(block_size, block_size);
    seq.block_hashes = std::span<const BlockHash>(hashes + 1, 1);
  } else {
    seq.tokens = std::span<const TokenId>(tokens).first(2 * static_cast<std::size_t>(block_size));
    seq.block_hashes = std::span<const BlockHash>(hashes, 2);
  }
  return seq;
}

std::optional<BlockId> TieredKVCacheManager::take_host_slot(bool& evicted) {
  slot_scratch_.clear();
  const std::uint64_t evictions = host_.num_evictions();
  if (!host_.get_new_blocks(1, slot_scratch_)) return std::nullopt;
  const BlockId slot = slot_scratch_[0];
  ++host_slot_epoch_[static_cast<std::size_t>(slot)];
  evicted = host_.num_evictions() != evictions;
  if (evicted) ++host_epoch_;  // a cached slot lost its content
  return slot;
}

inline void TieredKVCacheManager::refresh(BlockId slot) {
  // An unpinned cached slot that was just in use: back to the LRU tail.
  host_.requeue(slot);
}

inline bool TieredKVCacheManager::host_has(BlockId gpu_block, const BlockSequence& seq,
                                           std::size_t index, GroupId group) {
  const auto b = static_cast<std::size_t>(gpu_block);
  if (remembered_valid(b)) {
    // Verified when the block was loaded from it; the slot has not been reassigned since.
    const BlockId known = gpu_host_slot_[b];
    if (host_.block(known).ref_cnt == 0) refresh(known);
    return true;
  }
  const BlockId slot = host_match(seq, index, host_chain_ ? nullptr : &gpu_identity_[b], group);
  if (slot == BlockPool::kNoBlock) return false;
  if (host_.block(slot).ref_cnt == 0) refresh(slot);
  gpu_host_slot_[b] = slot;
  gpu_host_epoch_[b] = host_slot_epoch_[static_cast<std::size_t>(slot)];
  return true;
}

inline void TieredKVCacheManager::schedule_store(BlockId gpu_block, const BlockSequence& seq,
                                                 std::size_t index, RequestState& state,
                                                 TierPlan& out, GroupId group) {
  // Runs after the GPU manager changed state: a lookup or a host slot that cannot be had for
  // memory (both throw before changing anything) skips this store, as a full host does.
  try {
    if (!host_has(gpu_block, seq, index, group))
      store_block(gpu_block, seq, index, state, Kind::kStore, out, group);
  } catch (const std::bad_alloc&) {
    ++stats_.stores_skipped_no_memory;
  }
}

void TieredKVCacheManager::store_block(BlockId gpu_block, const BlockSequence& view,
                                       std::size_t index, RequestState& state, Kind kind,
                                       TierPlan& out, GroupId group) {
  // secondary_offload_min_priority (host_tier_config.hpp): a GPU block below it is not stored.
  // Write-back blocks are filtered in on_evict, while the evicted block's retention is whole.
  const RetentionPriority min_priority = host_config_.secondary_offload_min_priority;
  if (min_priority > 0 && kind == Kind::kStore &&
      manager_.block_pool().retention(gpu_block).priority < min_priority) {
    ++stats_.stores_skipped_priority;
    return;
  }
  // Nothing below allocates but the host slot's take (which then changes nothing): the plan's
  // vectors and the slab have room, and the block's extra keys are the GPU record's (view's
  // block `index` is the content cached in gpu_block), shared.
  SharedExtraKeys extra = gpu_extra_[static_cast<std::size_t>(gpu_block)];
  bool evicted = false;  // the slot held a cached block, evicted now
  const std::optional<BlockId> taken = take_host_slot(evicted);
  if (!taken) {
    ++stats_.stores_skipped_full;
    return;
  }
  const BlockId slot = *taken;
  const TransferId id = open_transfer(kind, &state, gpu_block, slot, 0);
  const auto idx = static_cast<std::size_t>(id & kIndexMask);
  transfers_[idx].group = group;
  const std::uint32_t vbs = view.block_size;  // the group's block size
  copy_block_tokens(transfer_tokens_.data() + idx * stride_, view.tokens.data() + index * vbs, vbs);
  transfer_hash_[idx] = view.block_hashes[index];
  transfer_parent_[idx] = index == 0 ? BlockHash() : view.block_hashes[index - 1];
  transfer_first_[idx] = index == 0 ? 1 : 0;
  if (!host_chain_) transfer_identity_[idx] = gpu_identity_[static_cast<std::size_t>(gpu_block)];
  transfer_extra_[idx] = std::move(extra);
  ++host_storing_;
  if (kind == Kind::kEviction) {
    out.plan.evictions.push_back({gpu_block, slot, group});
    out.eviction_ids.push_back(id);
  } else {
    out.plan.stores.push_back({gpu_block, slot, group});
    out.store_ids.push_back(id);
  }
  if (evicted && hooks_.on_evicted) hooks_.on_evicted(slot);
}

void TieredKVCacheManager::on_evict(const BlockPool& pool, BlockId id) noexcept {
  // The hot path (write-back, the host copy known: an LRU refresh) saves no registers; the rest
  // is out of line.
  const auto k = static_cast<std::size_t>(id);
  const bool known = remembered_valid(k);
  const BlockId slot = gpu_host_slot_[k];
  gpu_host_slot_[k] = 0;  // the block's content goes; new content learns its slot anew
  if (hybrid_) [[unlikely]] {
    // finish_loads dropping a window block that was never loaded: it holds no K/V to store.
    // WindowStoreRule::kRequestTail: a window block not at a request's end is not stored.
    const bool tail = gpu_tail_[k] != 0;
    gpu_tail_[k] = 0;
    const GroupId group = pool.block(id).group_id;
    if (dropping_) {
      forget_evicted(pool, id, /*keep=*/false);
      return;
    }
    if (host_config_.policy == HostPolicy::kWriteBack && !known && is_window(group) &&
        host_config_.window_store == WindowStoreRule::kRequestTail && !tail) {
      ++stats_.window_stores_skipped;
      ++group_stats_[group].window_stores_skipped;
      forget_evicted(pool, id, /*keep=*/false);
      return;
    }
  }
  if (host_config_.policy == HostPolicy::kWriteBack && known) {
    // The host holds the block: its LRU refresh is the whole write-back (a pinned slot stays as
    // it is: requeue leaves it).
    refresh(slot);
    if (own_records_ || num_gpu_extra_ != 0) forget_evicted(pool, id, /*keep=*/false);
    return;
  }
  bool keep = host_config_.policy == HostPolicy::kWriteBack;
  if (keep && host_config_.secondary_offload_min_priority > 0 &&
      pool.retention(id).priority < host_config_.secondary_offload_min_priority) {
    keep = false;  // below secondary_offload_min_priority: not stored in the host tier
    ++stats_.stores_skipped_priority;
  }
  forget_evicted(pool, id, keep);
}

void TieredKVCacheManager::forget_evicted(const BlockPool& pool, BlockId id, bool keep) noexcept {
  const auto k = static_cast<std::size_t>(id);
  if (host_config_.policy == HostPolicy::kWriteThroughSelective) gpu_hits_[k] = 0;
  if (keep) {
    // Write-back, the host copy unknown: looked up, and stored if missing, by allocate_slots once
    // its hit is pinned (capacity reserved there); the records and extra keys are forgotten then.
    evicted_.push_back(id);
    if (hybrid_) evicted_group_.push_back(pool.block(id).group_id);
    if (!own_records_) {
      evicted_hash_.push_back(pool.block(id).block_hash);
      evicted_parent_.push_back(pool.stored_parent_hash(id));
      const TokenId* tokens = pool.stored_tokens(id);
      evicted_tokens_.insert(evicted_tokens_.end(), tokens, tokens + stride_);  // (pool's size)
    }
    return;
  }
  if (own_records_) gpu_hash_[k] = BlockHash();
  if (num_gpu_extra_ != 0) set_gpu_extra(id, nullptr);
}

void TieredKVCacheManager::store_evicted(RequestState& state, TierPlan& out) {
  for (std::size_t e = 0; e < evicted_.size(); ++e) {
    const BlockId b = evicted_[e];
    const auto k = static_cast<std::size_t>(b);
    const bool first = own_records_ ? gpu_first_[k] != 0 : evicted_parent_[e].empty();
    const GroupId group = hybrid_ ? evicted_group_[e] : GroupId{0};
    const std::uint32_t gbs = group_bs_[group];
    copy_block_tokens(
        content_tokens_.data() + gbs,
        own_records_ ? gpu_tokens_.data() + k * stride_ : evicted_tokens_.data() + e * stride_,
        gbs);
    content_hashes_[0] = own_records_ ? gpu_parent_[k] : evicted_parent_[e];
    content_hashes_[1] = own_records_ ? gpu_hash_[k] : evicted_hash_[e];
    const ContentSource extra(gpu_extra_[k].get(), first ? 0 : 1);
    const BlockSequence view =
        content_sequence(content_tokens_, content_hashes_, first, &extra, gbs);
    const std::size_t index = first ? 0 : 1;
    // After the GPU manager changed state: a lookup or host slot that cannot be had for memory
    // (both throw before changing anything) skips the store, as a full host does.
    try {
      const BlockId slot =
          host_match(view, index, host_chain_ ? nullptr : &gpu_identity_[k], group);
      if (slot == BlockPool::kNoBlock) {
        store_block(b, view, index, state, Kind::kEviction, out, group);
      } else if (host_.block(slot).ref_cnt == 0) {
        refresh(slot);
      }
    } catch (const std::bad_alloc&) {
      ++stats_.stores_skipped_no_memory;
    }
    if (own_records_) gpu_hash_[k] = BlockHash();
    set_gpu_extra(b, nullptr);
  }
  evicted_.clear();
  evicted_hash_.clear();
  evicted_parent_.clear();
  evicted_tokens_.clear();
  evicted_group_.clear();
}

void TieredKVCacheManager::record_new_blocks(Request& request, RequestState& state, TierPlan& out) {
  if (hybrid_) {
    hybrid_record_new_blocks(request, state, out);
    return;
  }
  const BlockSequence seq = request.hashed_tokens().sequence();
  const bool write_through = host_config_.policy == HostPolicy::kWriteThrough;
  // With the GPU pool's material the tier keeps nothing per block but extra keys.
  if (!own_records_ && !write_through && seq.extra_keys == nullptr) return;
  const std::span<const BlockId> ids = manager_.block_ids(request.id());
  const BlockPool& pool = manager_.block_pool();
  const std::size_t end = std::min(ids.size(), seq.block_hashes.size());
  std::size_t i = state.scanned;
  for (; i < end; ++i) {
    const BlockId b = ids[i];
    if (!pool.block(b).is_cached()) break;
    // Overlap the host map's misses of write-through's verified lookups (host_has): only for
    // blocks with no remembered slot (a loaded block has one).
    if (write_through && i + kHostAhead < end &&
        gpu_host_slot_[static_cast<std::size_t>(ids[i + kHostAhead])] == 0) {
      host_.prefetch_cached_block(seq.block_hashes[i + kHostAhead]);
    }
    const auto k = static_cast<std::size_t>(b);
    // What prepare_records computed before the GPU manager changed state (nothing below
    // allocates); a block it did not reach (never, by its bounds) is computed here.
    const std::size_t a = i - ahead_from_;  // wraps when i < ahead_from_: not prepared
    if (own_records_) {
      gpu_hash_[k] = seq.block_hashes[i];
      gpu_first_[k] = i == 0 ? 1 : 0;
      gpu_parent_[k] = i == 0 ? BlockHash() : seq.block_hashes[i - 1];
      copy_block_tokens(gpu_tokens_.data() + k * stride_, seq.tokens.data() + i * bs_, bs_);
      if (!host_chain_) {
        // The block holds exactly the request's prefix up to it (computed or verified), and its
        // predecessor in the request's table is cached and recorded (recorded first).
        assert(a < identity_ahead_.size());
        gpu_identity_[k] =
            a < identity_ahead_.size()
                ? identity_ahead_[a]
                : identity_after(
                      i == 0 ? nullptr : &gpu_identity_[static_cast<std::size_t>(ids[i - 1])], seq,
                      i, mm_scratch_);
      }
    }
    if (seq.extra_keys != nullptr) {
      assert(a < extra_ahead_.size());
      SharedExtraKeys keys =
          a < extra_ahead_.size() ? extra_ahead_[a] : shared_extra_keys(seq, i, mm_scratch_);
      if (keys != nullptr) set_gpu_extra(b, std::move(keys));
    }
    if (write_through) schedule_store(b, seq, i, state, out);
  }
  state.scanned = i;
  extra_ahead_.clear();  // (keeps the capacity)
  identity_ahead_.clear();
}

void TieredKVCacheManager::prepare_records(const Request& request, std::size_t from, std::size_t to,
                                           std::span<const BlockId> row) {
  extra_ahead_.clear();
  identity_ahead_.clear();
  ahead_from_ = from;
  const BlockSequence seq = request.hashed_tokens().sequence();
  to = std::min(to, seq.block_hashes.size());
  if (to <= from) return;
  if (seq.extra_keys != nullptr) shared_extra_keys_of(seq, from, to, extra_ahead_, mm_scratch_);
  if (own_records_ && !host_chain_) {
    // The chain's parent: the recorded identity of the block before (missing, or an invalid id,
    // which the GPU manager will refuse: nothing is prepared).
    const BlockId before = from > 0 && from <= row.size() ? row[from - 1] : kNullBlockId;
    if (from > 0 && (before <= 0 || before >= manager_.block_pool().num_blocks())) return;
    identity_ahead_.reserve(to - from);
    for (std::size_t i = from; i < to; ++i) {
      const BlockHash* parent = i > from    ? &identity_ahead_.back()
                                : from == 0 ? nullptr
                                            : &gpu_identity_[static_cast<std::size_t>(before)];
      identity_ahead_.push_back(identity_after(parent, seq, i, mm_scratch_));
    }
  }
}

void TieredKVCacheManager::forget_loaded_slots(const Request& request, const RequestState& state,
                                               std::size_t from) {
  // (Counts of blocks of bs_: group g's blocks are factor_[g] of them. A block of a coarser group
  // that straddles hit_begin + from did not land whole: forgotten too.)
  for (std::size_t g = 0; g < manager_.num_groups(); ++g) {
    const std::span<const BlockId> ids = manager_.block_ids(request.id(), g);
    const std::size_t f = factor_[g];
    const std::size_t end = std::min(ids.size(), (state.hit_begin + state.num_loads) / f);
    for (std::size_t i = (state.hit_begin + from) / f; i < end; ++i) {
      gpu_host_slot_[static_cast<std::size_t>(ids[i])] = 0;  // (the null block's: unused)
    }
  }
}

TieredKVCacheManager::RequestMap::iterator TieredKVCacheManager::checked_allocation_state(
    const Request& request, const TieredCacheHit& hit) {
  const auto where = [&request] {
    return "TieredKVCacheManager::allocate_slots: request " + std::to_string(request.id()) + ": ";
  };
  const RequestMap::iterator found = requests_.find(request.id());
  if (found != requests_.end() && found->second.loading) {
    throw Error(ErrorCode::kInvalidState,
                where() + "its loads are not finished (commit them, then call finish_loads)");
  }
  const std::size_t h = hit.host_slots.size();
  if (hit.num_host_tokens != h * group_bs_[0]) {
    throw Error(ErrorCode::kInvalidArgument,
                where() + "the hit's num_host_tokens " + std::to_string(hit.num_host_tokens) +
                    " != " + std::to_string(h) + " slots x group 0's block size");
  }
  return found;
}

std::optional<TierAllocation> TieredKVCacheManager::allocate_slots(
    Request& request, std::size_t num_new_tokens, const TieredCacheHit& hit,
    std::size_t num_lookahead_tokens) {
  const auto where = [&request] {
    return "TieredKVCacheManager::allocate_slots: request " + std::to_string(request.id()) + ": ";
  };
  manager_.check_owner(request, "TieredKVCacheManager::allocate_slots");
  if (hybrid_) return hybrid_allocate_slots(request, num_new_tokens, hit, num_lookahead_tokens);
  const RequestMap::iterator found = checked_allocation_state(request, hit);
  const std::size_t h = hit.host_slots.size();
  const std::size_t g = hit.gpu.blocks.size();
  if (h > 0) {
    if (found != requests_.end() || request.num_computed_tokens() != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  where() + "a cache hit can only be passed to the first allocation");
    }
    const std::span<const BlockHash> hashes = request.block_hashes();
    const auto stale = [&](std::size_t i) {
      throw Error(ErrorCode::kInvalidArgument,
                  where() + "stale host hit: slot " + std::to_string(hit.host_slots[i]) +
                      " no longer holds the request's block " + std::to_string(g + i) +
                      " (call allocate_slots right after get_computed_blocks)");
    };
    const std::int32_t num_slots = host_.num_blocks();
    // One branch-free pass (every slot in 1 .. num_slots - 1); the first bad one is found only
    // to name it.
    const auto last_slot = static_cast<std::uint32_t>(num_slots - 1);
    std::uint32_t bad = g + h > hashes.size() ? 1 : 0;
    for (std::size_t i = 0; i < h; ++i) {
      bad |= static_cast<std::uint32_t>(static_cast<std::uint32_t>(hit.host_slots[i]) - 1u >=
                                        last_slot);
    }
    if (bad != 0) [[unlikely]] {
      for (std::size_t i = 0; i < h; ++i) {
        if (hit.host_slots[i] < 1 || hit.host_slots[i] >= num_slots || g + i >= hashes.size()) {
          stale(i);
        }
      }
    }
    // The lookup verified these slots for these blocks and no host slot was reassigned since:
    // they still hold them. Otherwise (a hit from before a reassignment, from another request
    // or tier, or changed by hand) every slot is verified again.
    if (hit.host_epoch != host_epoch_ ||
        hit.host_check !=
            hit_check(hit.host_slots, hashes, g, hit.host_epoch, host_chain_ ? 0 : request.id())) {
      const BlockSequence seq = request.hashed_tokens().sequence();
      if (!host_chain_) sequence_identities(seq, g + h, identity_scratch_);
      for (std::size_t i = 0; i < h; ++i) {
        const BlockHash* id = host_chain_ ? nullptr : &identity_scratch_[g + i];
        if (!host_verified(seq, g + i, hit.host_slots[i], id)) stale(i);
      }
    }
  }
  // Everything that may allocate happens before the manager changes state.
  const std::size_t bound = h + 2 * ((request.num_tokens() + num_lookahead_tokens) / bs_ + 2) + g;
  reserve_transfers(bound);
  const HostPolicy policy = host_config_.policy;
  // Evictions are write-back's; stores are write-through's (of the computed blocks, recorded
  // below only without a host hit) and selective's (of GPU-hit blocks).
  const std::size_t max_evictions = policy == HostPolicy::kWriteBack ? bound : 0;
  const std::size_t max_stores = policy == HostPolicy::kWriteThrough ? (h == 0 ? bound : 0)
                                 : policy == HostPolicy::kWriteThroughSelective ? g
                                                                                : 0;
  TierAllocation out;
  out.transfers.plan.loads.resize(h);  // written in place below
  out.transfers.load_ids.resize(h);
  // Evictions and stores go to copies_ (reused), handed over at the end only if there are any.
  reserve_copies(max_evictions, max_stores);
  if (policy == HostPolicy::kWriteBack) {  // on_evict's room (cannot allocate there)
    reserve_room(evicted_, bound);
    if (!own_records_) {
      reserve_room(evicted_hash_, bound);
      reserve_room(evicted_parent_, bound);
      reserve_room(evicted_tokens_, bound * stride_);
    }
  }
  if (h == 0) {
    // record_new_blocks' records of the blocks this call caches (at most its known tokens').
    const std::size_t from = found == requests_.end() ? g : found->second.scanned;
    const std::size_t known = request.num_computed_tokens() + hit.gpu.num_tokens;
    const std::size_t upto =
        known > request.num_tokens() || num_new_tokens > request.num_tokens() - known
            ? request.num_tokens()
            : known + num_new_tokens;
    // The blocks before `from`: a new request's GPU hit, or the request's row.
    prepare_records(request, from, upto / bs_,
                    found == requests_.end() ? std::span<const BlockId>(hit.gpu.blocks)
                                             : manager_.block_ids(request.id()));
  }
  auto it = found;  // requests_ has not changed since
  const bool inserted = it == requests_.end();
  if (inserted) {
    it = spare_requests_.insert_new(requests_, request.id());
    it->second.id = request.id();
  }
  std::optional<std::span<const BlockId>> blocks;
  try {
    blocks = manager_.allocate_slots(request, h * bs_ + num_new_tokens, hit.gpu,
                                     num_lookahead_tokens, /*delay_cache_blocks=*/h > 0);
  } catch (...) {
    if (inserted) release_state(it);
    throw;
  }
  if (!blocks) {
    if (inserted) release_state(it);
    return std::nullopt;
  }
  RequestState& st = it->second;
  out.new_blocks = *blocks;
  // Pin the hit's host slots first: the stores below must not evict them.
  if (h > 0) host_.touch(hit.host_slots);
  // Write-back: the blocks the allocation evicted (on_evict refreshed those the host is known to
  // hold) are looked up in the host and stored there if missing.
  if (!evicted_.empty()) store_evicted(st, copies_);
  if (inserted) st.scanned = g;  // the GPU hit's blocks were cached (and recorded) before
  if (inserted && policy == HostPolicy::kWriteThroughSelective) {
    const BlockSequence seq = request.hashed_tokens().sequence();
    for (std::size_t i = 0; i < g; ++i) {
      const BlockId b = hit.gpu.blocks[i];
      if (++gpu_hits_[static_cast<std::size_t>(b)] == host_config_.selective_hits) {
        schedule_store(b, seq, i, st, copies_);
      }
    }
  }
  if (h > 0) {
    // One load per hit slot, into the hit part's GPU blocks (open_transfer, counted once). Slab
    // entries come off the free list's back in the order h pops would take them, then new ones
    // (room reserved). Every array is read through a local pointer: the loop's stores cannot
    // make the compiler reload them.
    const BlockId* const gpu = out.new_blocks.data();  // the hit part's h blocks come first
    const std::size_t spare = std::min(h, free_transfers_.size());
    const std::size_t first_new = transfers_.size();
    for (std::size_t k = spare; k < h; ++k) grow_transfers();
    const std::uint32_t* const spare_top = free_transfers_.data() + free_transfers_.size();
    Transfer* const slab = transfers_.data();
    const BlockId* const slots = hit.host_slots.data();
    BlockId* const noted_slot = gpu_host_slot_.data();
    std::uint64_t* const noted_epoch = gpu_host_epoch_.data();
    const std::uint64_t* const slot_epoch = host_slot_epoch_.data();
    RequestState* const state = &st;
    BlockCopy* const loads = out.transfers.plan.loads.data();
    TransferId* const load_ids = out.transfers.load_ids.data();
    for (std::size_t i = 0; i < h; ++i) {
      const BlockId slot = slots[i];
      const BlockId block = gpu[i];
      const auto idx = static_cast<std::uint32_t>(
          i < spare ? spare_top[-1 - static_cast<std::ptrdiff_t>(i)] : first_new + (i - spare));
      Transfer& t = slab[idx];
      t.state = state;
      t.live = true;
      t.kind = Kind::kLoad;
      t.gpu = block;
      t.host = slot;
      t.chain_index = static_cast<std::uint32_t>(i);
      loads[i] = {slot, block, 0};
      load_ids[i] = (static_cast<TransferId>(t.generation) << 32) | idx;
      // The block will hold the slot's (verified) content; kept if the load succeeds.
      const auto b = static_cast<std::size_t>(block);
      noted_slot[b] = slot;
      noted_epoch[b] = slot_epoch[static_cast<std::size_t>(slot)];
    }
    free_transfers_.resize(free_transfers_.size() - spare);
    num_live_ += h;
    st.transfers_in_flight += static_cast<std::uint32_t>(h);
    st.loads_in_flight += static_cast<std::uint32_t>(h);
    st.loading = true;
    st.hit_begin = g;
    st.num_loads = h;
    st.first_failed = h;
    st.cache_upto = std::min((g + h) * bs_ + num_new_tokens, request.num_tokens());
    st.scanned = g;
  } else {
    record_new_blocks(request, st, copies_);
  }
  hand_over_copies(out.transfers);
  return out;
}

}  // namespace pagedkv
