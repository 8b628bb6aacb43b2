// TieredKVCacheManager for hybrid models (sliding-window KV-cache groups beside full attention):
// the host hit valid in every group, the per-group loads of allocate_slots, finish_loads and the
// window groups' store rule. Contract: tiered_kv_cache_manager.hpp; design: docs/tiers.md.
//
// A hit is the GPU manager's fixed-point hit of G blocks (every group agrees on it), extended to
// the longest L such that each full-attention group finds blocks [G, L) in the host and each
// window group finds [max(G, L - window_blocks), L) (every group has one block size, so the
// groups' LCM alignment is one block). Host lookups are keyed by (hash, group) and verified as
// for one group: the chained parent hash (SHA-256) or the slot's prefix identity (xxh3_128 and
// weak hashers), which is the same for every group at one position (it covers tokens and extra
// keys only). A window group's host-part positions before L - window_blocks get GPU blocks from
// the manager that are never written: finish_loads caches around them (cache_blocks'
// first_to_cache) and the manager releases them as the request advances past its window.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "pagedkv/base/error.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"
#include "tiered_kv_cache_manager_internal.hpp"

namespace pagedkv {

bool TieredKVCacheManager::window_store_allowed(std::size_t g, std::size_t index,
                                                std::size_t num_tokens) const noexcept {
  if (host_config_.window_store == WindowStoreRule::kAll) return true;
  const std::size_t wb = window_blocks_[g];
  return index + wb >= num_tokens / bs_;  // within the window of the request's known end
}

void TieredKVCacheManager::hybrid_identities(const BlockSequence& seq, RequestState& st,
                                             std::size_t end) {
  end = std::min({end, seq.block_hashes.size(), seq.tokens.size() / bs_});
  if (st.identities.size() >= end) return;
  st.identities.reserve(end);
  while (st.identities.size() < end) {
    const std::size_t i = st.identities.size();
    BlockHash id = identity_after(i == 0 ? nullptr : &st.identities.back(), seq, i, mm_scratch_);
    st.identities.push_back(id);
  }
}

std::uint64_t TieredKVCacheManager::hybrid_hit_check(const TieredCacheHit& hit,
                                                     std::span<const BlockHash> hashes,
                                                     std::uint64_t request_salt) const noexcept {
  const std::size_t begin = hit.gpu.blocks.size();
  std::uint64_t x = hit_check(hit.host_slots, hashes, begin, hit.host_epoch, request_salt);
  for (std::size_t g = 1; g < window_blocks_.size(); ++g) {
    const std::vector<BlockId>& row = hit.host_other_groups[g - 1];
    x = (x * kGolden) ^ hit_check(row, hashes, begin, hit.host_epoch, request_salt + g * kGolden);
  }
  return x;
}

void TieredKVCacheManager::hybrid_host_hit(const Request& request, TieredCacheHit& hit) {
  const std::size_t ng = window_blocks_.size();
  hit.host_other_groups.assign(ng - 1, {});
  if (request.skip_reading_prefix_cache || request.num_tokens() == 0) return;
  const BlockSequence seq = request.hashed_tokens().sequence();
  const std::size_t max_blocks =
      std::min((request.num_tokens() - 1) / bs_, seq.block_hashes.size());
  const std::size_t G = hit.gpu.blocks.size();
  hit.host_epoch = host_epoch_;
  if (G >= max_blocks) return;
  bool has_full = false;
  for (std::size_t g = 0; g < ng; ++g) has_full = has_full || !is_window(g);
  // rows[g][i - G]: group g's verified host slot of block i (0: none), scanned from G until a
  // full-attention group misses (no hit can pass it).
  std::vector<std::vector<BlockId>> rows(ng);
  BlockHash prev;  // identity of block i - 1 (prefix identities)
  if (!host_chain_ && G > 0) {
    bool have = false;
    for (std::size_t g = 0; g < ng && !have; ++g) {
      const auto b = static_cast<std::size_t>(hit.gpu.group(g)[G - 1]);
      if (b != 0 && own_records_ && !gpu_hash_[b].empty()) {
        prev = gpu_identity_[b];
        have = true;
      }
    }
    if (!have) {
      sequence_identities(seq, G, identity_scratch_);
      prev = identity_scratch_.back();
    }
  }
  std::size_t end = G;  // blocks scanned: [G, end)
  for (std::size_t i = G; i < max_blocks; ++i) {
    BlockHash id;
    if (!host_chain_) id = identity_after(i == 0 ? nullptr : &prev, seq, i, mm_scratch_);
    bool full_missed = false;
    for (std::size_t g = 0; g < ng; ++g) {
      const auto group = static_cast<GroupId>(g);
      const BlockId slot = host_match(seq, i, host_chain_ ? nullptr : &id, group);
      rows[g].push_back(slot == BlockPool::kNoBlock ? 0 : slot);
      if (!is_window(g) && slot == BlockPool::kNoBlock) full_missed = true;
    }
    if (!host_chain_) prev = id;
    if (full_missed) break;
    end = i + 1;
  }
  (void)has_full;
  // The longest L in (G, end] that every window group accepts: its blocks [max(G, L - wb), L)
  // in the host (and [max(0, L - wb), G) in the GPU hit, which a fixed-point hit holds).
  std::size_t L = G;
  for (std::size_t cand = end; cand > G && L == G; --cand) {
    bool ok = true;
    for (std::size_t g = 0; g < ng && ok; ++g) {
      if (!is_window(g)) continue;
      const std::size_t wb = window_blocks_[g];
      const std::size_t from = cand > wb ? cand - wb : 0;
      for (std::size_t p = std::max(from, G); p < cand && ok; ++p) ok = rows[g][p - G] != 0;
      for (std::size_t p = from; p < G && ok; ++p) ok = hit.gpu.group(g)[p] != kNullBlockId;
    }
    if (ok) L = cand;
  }
  const std::size_t h = L - G;
  if (h == 0) return;
  for (std::size_t g = 0; g < ng; ++g) {
    std::vector<BlockId>& out = g == 0 ? hit.host_slots : hit.host_other_groups[g - 1];
    out.assign(rows[g].begin(), rows[g].begin() + static_cast<std::ptrdiff_t>(h));
    if (is_window(g)) {
      const std::size_t wb = window_blocks_[g];
      const std::size_t from = L > wb ? L - wb : 0;
      for (std::size_t p = G; p < from; ++p) out[p - G] = 0;  // before the window: not loaded
    }
  }
  hit.num_host_tokens = h * bs_;
  hit.host_check = hybrid_hit_check(hit, seq.block_hashes, host_chain_ ? 0 : request.id());
}

std::optional<TierAllocation> TieredKVCacheManager::hybrid_allocate_slots(
    Request& request, std::size_t num_new_tokens, const TieredCacheHit& hit,
    std::size_t num_lookahead_tokens) {
  const auto where = [&request] {
    return "TieredKVCacheManager::allocate_slots: request " + std::to_string(request.id()) + ": ";
  };
  const RequestMap::iterator found = checked_allocation_state(request, hit);
  const std::size_t ng = window_blocks_.size();
  const std::size_t h = hit.host_slots.size();
  const std::size_t G = hit.gpu.blocks.size();
  std::size_t num_loads = 0;
  if (h > 0) {
    if (found != requests_.end() || request.num_computed_tokens() != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  where() + "a cache hit can only be passed to the first allocation");
    }
    if (hit.host_other_groups.size() != ng - 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  where() + "the host hit has " + std::to_string(hit.host_other_groups.size() + 1) +
                      " groups, the tier " + std::to_string(ng));
    }
    const std::span<const BlockHash> hashes = request.block_hashes();
    const std::size_t L = G + h;
    if (L > hashes.size()) {
      throw Error(ErrorCode::kInvalidArgument, where() + "stale host hit: " + std::to_string(L) +
                                                   " blocks but the request has " +
                                                   std::to_string(hashes.size()));
    }
    // Each group's slots: every position for full attention, exactly the window at L for a
    // window group, each a real slot.
    for (std::size_t g = 0; g < ng; ++g) {
      if (g > 0 && hit.host_other_groups[g - 1].size() != h) {
        throw Error(ErrorCode::kInvalidArgument,
                    where() + "the host hit's group " + std::to_string(g) + " has " +
                        std::to_string(hit.host_other_groups[g - 1].size()) + " slots, not " +
                        std::to_string(h));
      }
      const std::size_t from =
          is_window(g) ? std::max(G, L > window_blocks_[g] ? L - window_blocks_[g] : 0) : G;
      for (std::size_t i = 0; i < h; ++i) {
        const BlockId slot = hit_slot(hit, g, i);
        const bool wanted = G + i >= from;
        if (wanted != (slot != 0) || (wanted && (slot < 1 || slot >= host_.num_blocks()))) {
          throw Error(ErrorCode::kInvalidArgument,
                      where() + "stale host hit: group " + std::to_string(g) + " slot " +
                          std::to_string(slot) + " at block " + std::to_string(G + i) +
                          (wanted ? " is out of range" : " lies before the window"));
        }
        if (wanted) ++num_loads;
      }
    }
    if (hit.host_epoch != host_epoch_ ||
        hit.host_check != hybrid_hit_check(hit, hashes, host_chain_ ? 0 : request.id())) {
      const BlockSequence seq = request.hashed_tokens().sequence();
      if (!host_chain_) sequence_identities(seq, L, identity_scratch_);
      for (std::size_t g = 0; g < ng; ++g) {
        for (std::size_t i = 0; i < h; ++i) {
          const BlockId slot = hit_slot(hit, g, i);
          if (slot == 0) continue;
          const BlockHash* id = host_chain_ ? nullptr : &identity_scratch_[G + i];
          if (!host_verified(seq, G + i, slot, id, static_cast<GroupId>(g))) {
            throw Error(ErrorCode::kInvalidArgument,
                        where() + "stale host hit: slot " + std::to_string(slot) +
                            " no longer holds the request's block " + std::to_string(G + i) +
                            " of group " + std::to_string(g) +
                            " (call allocate_slots right after get_computed_blocks)");
          }
        }
      }
    }
  }
  // Everything that may allocate happens before the manager changes state.
  const std::size_t per_group =
      h + 2 * ((request.num_tokens() + num_lookahead_tokens) / bs_ + 2) + G;
  const std::size_t bound = per_group * ng;
  reserve_transfers(bound);
  const HostPolicy policy = host_config_.policy;
  const std::size_t max_evictions = policy == HostPolicy::kWriteBack ? bound : 0;
  const std::size_t max_stores = policy == HostPolicy::kWriteThrough ? (h == 0 ? bound : 0)
                                 : policy == HostPolicy::kWriteThroughSelective ? G * ng
                                                                                : 0;
  TierAllocation out;
  out.transfers.plan.loads.reserve(num_loads);
  out.transfers.load_ids.reserve(num_loads);
  reserve_copies(max_evictions, max_stores);
  if (policy == HostPolicy::kWriteBack) {
    reserve_room(evicted_, bound);
    reserve_room(evicted_group_, bound);
    if (!own_records_) {
      reserve_room(evicted_hash_, bound);
      reserve_room(evicted_parent_, bound);
      reserve_room(evicted_tokens_, bound * bs_);
    }
  }
  std::vector<BlockId>& pins = found_slots_;
  pins.clear();
  pins.reserve(num_loads);
  for (std::size_t g = 0; g < ng && h > 0; ++g) {
    for (std::size_t i = 0; i < h; ++i) {
      if (const BlockId slot = hit_slot(hit, g, i); slot != 0) pins.push_back(slot);
    }
  }
  auto it = found;
  const bool inserted = it == requests_.end();
  if (inserted) {
    it = spare_requests_.insert_new(requests_, request.id());
    it->second.id = request.id();
  }
  RequestState& st = it->second;
  const std::size_t old_scanned_groups = st.scanned_groups.size();
  try {
    if (st.scanned_groups.size() != ng) st.scanned_groups.assign(ng, st.scanned);
    if (!host_chain_ && own_records_) {
      st.identities.reserve(std::min(request.block_hashes().size(),
                                     (request.num_tokens() + num_lookahead_tokens) / bs_ + 1));
    }
  } catch (...) {
    if (inserted) release_state(it);
    throw;
  }
  std::optional<std::span<const BlockId>> blocks;
  try {
    blocks = manager_.allocate_slots(request, h * bs_ + num_new_tokens, hit.gpu,
                                     num_lookahead_tokens, /*delay_cache_blocks=*/h > 0);
  } catch (...) {
    if (inserted)
      release_state(it);
    else if (old_scanned_groups != ng)
      st.scanned_groups.clear();
    throw;
  }
  if (!blocks) {
    if (inserted) release_state(it);
    return std::nullopt;
  }
  out.new_blocks = *blocks;
  if (!pins.empty()) host_.touch(pins);
  if (!evicted_.empty()) store_evicted(st, copies_);
  if (inserted) {
    st.scanned = G;
    st.scanned_groups.assign(ng, G);  // (capacity reserved above: no allocation)
  }
  if (inserted && policy == HostPolicy::kWriteThroughSelective) {
    const BlockSequence seq = request.hashed_tokens().sequence();
    for (std::size_t g = 0; g < ng; ++g) {
      const std::vector<BlockId>& row = hit.gpu.group(g);
      for (std::size_t i = 0; i < row.size(); ++i) {
        const BlockId b = row[i];
        if (b == kNullBlockId) continue;
        if (++gpu_hits_[static_cast<std::size_t>(b)] != host_config_.selective_hits) continue;
        if (is_window(g) && !window_store_allowed(g, i, request.num_tokens())) {
          ++stats_.window_stores_skipped;
          ++group_stats_[g].window_stores_skipped;
          continue;
        }
        schedule_store(b, seq, i, st, copies_, static_cast<GroupId>(g));
      }
    }
  }
  if (h > 0) {
    for (std::size_t g = 0; g < ng; ++g) {
      const std::span<const BlockId> row = manager_.block_ids(request.id(), g);
      for (std::size_t i = 0; i < h; ++i) {
        const BlockId slot = hit_slot(hit, g, i);
        if (slot == 0) continue;
        const BlockId block = row[G + i];
        const TransferId id =
            open_transfer(Kind::kLoad, &st, block, slot, static_cast<std::uint32_t>(i));
        transfers_[static_cast<std::size_t>(id & kIndexMask)].group = static_cast<GroupId>(g);
        out.transfers.plan.loads.push_back({slot, block, static_cast<std::int32_t>(g)});
        out.transfers.load_ids.push_back(id);
        const auto b = static_cast<std::size_t>(block);
        gpu_host_slot_[b] = slot;
        gpu_host_epoch_[b] = host_slot_epoch_[static_cast<std::size_t>(slot)];
      }
    }
    st.loading = true;
    st.hit_begin = G;
    st.num_loads = h;
    st.first_failed = h;
    st.cache_upto = std::min((G + h) * bs_ + num_new_tokens, request.num_tokens());
    st.hit_end = G + h;
  } else {
    hybrid_record_new_blocks(request, st, copies_);
  }
  hand_over_copies(out.transfers);
  return out;
}

LoadResult TieredKVCacheManager::hybrid_finish_loads(Request& request, RequestState& st) {
  const std::size_t ng = window_blocks_.size();
  const std::size_t G = st.hit_begin;
  const std::size_t L = st.hit_end;
  LoadResult result;
  result.rolled_back = st.first_failed < st.num_loads;
  std::size_t valid_blocks = L;
  // Per group: blocks of the host part that were not loaded (a window group's positions before
  // its window at L) are never cached.
  std::vector<std::size_t> first_to_cache(ng, 0);
  for (std::size_t g = 0; g < ng; ++g) {
    if (!is_window(g)) continue;
    const std::size_t wb = window_blocks_[g];
    const std::size_t from = L > wb ? L - wb : 0;
    first_to_cache[g] = std::max(from, G);
  }
  if (result.rolled_back) {
    // The longest prefix valid in every group: up to the first failed load, unless a window
    // group's window there reaches into blocks it never loaded (then the GPU hit, whose window
    // is in place).
    valid_blocks = G + st.first_failed;
    for (std::size_t g = 0; g < ng; ++g) {
      if (is_window(g) && window_blocks_[g] > 0 && first_to_cache[g] > G) valid_blocks = G;
    }
  }
  result.num_computed_tokens = valid_blocks * bs_;
  const std::size_t bound = ng * (2 * (request.num_tokens() / bs_ + 2));
  reserve_transfers(bound);
  reserve_copies(0, host_config_.policy == HostPolicy::kWriteThrough ? bound : 0);
  const std::size_t upto = result.rolled_back ? result.num_computed_tokens : st.cache_upto;
  if (result.rolled_back) {
    // Recomputed from valid_blocks on: those blocks are written again, and cached then.
    for (std::size_t& f : first_to_cache) f = std::min(f, valid_blocks);
  }
  manager_.cache_blocks(request, upto, first_to_cache);
  st.loading = false;
  if (result.rolled_back) {
    ++stats_.rollbacks;
    forget_loaded_slots(request, st, valid_blocks - G);
    st.hit_end = G;  // every block from valid_blocks on is recomputed (and then cached)
  }
  hybrid_record_new_blocks(request, st, copies_);
  hand_over_copies(result.transfers);
  return result;
}

void TieredKVCacheManager::hybrid_record_new_blocks(Request& request, RequestState& st,
                                                    TierPlan& out) {
  const BlockSequence seq = request.hashed_tokens().sequence();
  const bool write_through = host_config_.policy == HostPolicy::kWriteThrough;
  if (!own_records_ && !write_through && seq.extra_keys == nullptr) return;
  const std::size_t ng = window_blocks_.size();
  if (st.scanned_groups.size() != ng) st.scanned_groups.assign(ng, st.scanned);
  const BlockPool& pool = manager_.block_pool();
  for (std::size_t g = 0; g < ng; ++g) {
    const std::span<const BlockId> ids = manager_.block_ids(request.id(), g);
    const std::size_t end = std::min(ids.size(), seq.block_hashes.size());
    // A window group's never-loaded blocks of the host part (never cached): passed over.
    std::size_t skip_end = 0;
    if (is_window(g) && st.hit_end > st.hit_begin) {
      const std::size_t wb = window_blocks_[g];
      skip_end = st.hit_end > wb ? st.hit_end - wb : 0;
    }
    std::size_t i = st.scanned_groups[g];
    for (; i < end; ++i) {
      const BlockId b = ids[i];
      if (b == kNullBlockId) continue;  // released from the window
      if (!pool.block(b).is_cached()) {
        if (i < skip_end) continue;
        break;
      }
      const auto k = static_cast<std::size_t>(b);
      if (own_records_) {
        gpu_hash_[k] = seq.block_hashes[i];
        gpu_first_[k] = i == 0 ? 1 : 0;
        gpu_parent_[k] = i == 0 ? BlockHash() : seq.block_hashes[i - 1];
        copy_block_tokens(gpu_tokens_.data() + k * bs_, seq.tokens.data() + i * bs_, bs_);
        if (!host_chain_) {
          hybrid_identities(seq, st, i + 1);
          gpu_identity_[k] = st.identities[i];
        }
      }
      if (std::optional<OwnedExtraKeys> owned = owned_extra_keys(seq, i, mm_scratch_)) {
        gpu_extra_[b] = std::move(*owned);
      }
      if (!write_through) continue;
      if (is_window(g) && !window_store_allowed(g, i, request.num_tokens())) {
        ++stats_.window_stores_skipped;
        ++group_stats_[g].window_stores_skipped;
        continue;
      }
      schedule_store(b, seq, i, st, out, static_cast<GroupId>(g));
    }
    st.scanned_groups[g] = i;
  }
}

void TieredKVCacheManager::hybrid_mark_tail(const Request& request) {
  slot_scratch_.clear();
  if (host_config_.policy != HostPolicy::kWriteBack ||
      host_config_.window_store != WindowStoreRule::kRequestTail) {
    return;
  }
  const BlockPool& pool = manager_.block_pool();
  for (std::size_t g = 0; g < window_blocks_.size(); ++g) {
    if (!is_window(g)) continue;
    const std::span<const BlockId> row = manager_.block_ids(request.id(), g);
    // The window before the end of the row's cached blocks.
    std::size_t end = row.size();
    while (end > 0 && (row[end - 1] == kNullBlockId || !pool.block(row[end - 1]).is_cached())) {
      --end;
    }
    const std::size_t wb = window_blocks_[g];
    for (std::size_t p = end > wb ? end - wb : 0; p < end; ++p) {
      if (row[p] != kNullBlockId && pool.block(row[p]).is_cached()) slot_scratch_.push_back(row[p]);
    }
  }
}

}  // namespace pagedkv
