// TieredKVCacheManager for hybrid models (sliding-window KV-cache groups beside full attention):
// the host hit valid in every group, the per-group loads of allocate_slots, finish_loads and the
// window groups' store rule. Contract: tiered_kv_cache_manager.hpp; design: docs/tiers.md.
//
// Positions: requests are hashed at the smallest group block size bs_; group g's block i covers
// blocks [i * factor_[g], (i + 1) * factor_[g]) of bs_ and is keyed as the GPU manager keys it
// (the coordinator's digest of those fine hashes; the fine hashes themselves when factor_ is 1).
// The tier's request-wide counts (a hit's G and L, a failed load's place) are in blocks of bs_;
// each group's rows and tables are in its own blocks.
//
// A hit is the GPU manager's fixed-point hit of G (every group agrees on it), extended to the
// longest L, a multiple of align_ (the groups' LCM block size over bs_: the GPU manager's clamp),
// such that each full-attention group finds its blocks [G_g, L_g) in the host and each window
// group finds [max(G_g, L_g - window_blocks), L_g) (x_g = x / factor_[g]). Host lookups are keyed
// by (hash, group) and verified as for one group: the chained parent hash (SHA-256) or the slot's
// prefix identity (xxh3_128 and weak hashers): the identity of the fine block a group's block
// ends with (it covers tokens and extra keys only, so it is the same for every group whose
// block ends there). A window group's host-part positions before L_g - window_blocks get GPU
// blocks from the manager that are never written: finish_loads caches around them
// (cache_blocks' first_to_cache) and the manager releases them as the request advances past its
// window.
#include <algorithm>
#include <cassert>
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
  return index + wb >= num_tokens / group_bs_[g];  // within the window of the request's known end
}

void TieredKVCacheManager::hybrid_coarse(const BlockSequence& fine, RequestState& st) {
  if (align_ == 1) return;  // every group of one block size: no coarser keys
  const std::size_t ng = factor_.size();
  if (st.coarse.size() != ng) st.coarse.resize(ng);
  for (std::size_t g = 0; g < ng; ++g) {
    if (factor_[g] > 1) (void)group_seq(fine, g, st.coarse);
  }
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

void TieredKVCacheManager::hybrid_prepare_records(const Request& request, RequestState& st,
                                                  std::size_t upto,
                                                  std::span<const std::size_t> from) {
  const BlockSequence fine = request.hashed_tokens().sequence();
  const std::size_t ng = window_blocks_.size();
  upto = std::min(upto, request.num_tokens());
  if (own_records_ && !host_chain_) hybrid_identities(fine, st, upto / bs_);
  group_ahead_from_.resize(ng);
  group_extra_ahead_.resize(ng);
  for (std::size_t g = 0; g < ng; ++g) {
    std::vector<SharedExtraKeys>& ahead = group_extra_ahead_[g];
    ahead.clear();
    const std::size_t begin = from.empty() ? st.scanned_groups[g] : from[g];
    group_ahead_from_[g] = begin;
    if (fine.extra_keys == nullptr) continue;
    const BlockSequence seq = group_seq(fine, g, st.coarse);  // (extended: no allocation)
    shared_extra_keys_of(seq, begin, std::min(upto / group_bs_[g], seq.block_hashes.size()), ahead,
                         mm_scratch_);
  }
}

std::uint64_t TieredKVCacheManager::hybrid_hit_check(const TieredCacheHit& hit,
                                                     std::span<const BlockHash> hashes,
                                                     std::uint64_t request_salt) const noexcept {
  // Each group's slots bound to the fine hash of the hit's last block (hashes[L - 1]; the caller
  // checked L <= hashes.size()): hit_check reads hashes[begin + slots - 1].
  const std::size_t L = (hit.gpu.blocks.size() + hit.host_slots.size()) * factor_[0];
  std::uint64_t x =
      hit_check(hit.host_slots, hashes, L - hit.host_slots.size(), hit.host_epoch, request_salt);
  for (std::size_t g = 1; g < window_blocks_.size(); ++g) {
    const std::vector<BlockId>& row = hit.host_other_groups[g - 1];
    x = (x * kGolden) ^
        hit_check(row, hashes, L - row.size(), hit.host_epoch, request_salt + g * kGolden);
  }
  return x;
}

void TieredKVCacheManager::hybrid_host_hit(const Request& request, TieredCacheHit& hit) {
  const std::size_t ng = window_blocks_.size();
  hit.host_other_groups.assign(ng - 1, {});
  if (request.skip_reading_prefix_cache || request.num_tokens() == 0) return;
  const BlockSequence fine = request.hashed_tokens().sequence();
  // Blocks of bs_ from here on; x_g = x / factor_[g] is group g's block count.
  const std::size_t max_blocks =
      std::min((request.num_tokens() - 1) / bs_, fine.block_hashes.size());
  const std::size_t G = hit.gpu.blocks.size() * factor_[0];
  hit.host_epoch = host_epoch_;
  if (G + align_ > max_blocks) return;
  // Each group's view at its own block size (a coarser group keyed as the GPU manager keys it).
  std::vector<BlockSequence> seqs(ng);
  for (std::size_t g = 0; g < ng; ++g) {
    if (factor_[g] > 1) coarse_scratch_[g].clear();
    seqs[g] = group_seq(fine, g, coarse_scratch_);
  }
  // rows[g][p - G_g]: group g's verified host slot of its block p (0: none), scanned from G one
  // LCM unit at a time until a full-attention group misses (no hit can pass it).
  std::vector<std::vector<BlockId>> rows(ng);
  // Prefix identities: ids[j - G] of fine block j (a group's block carries the identity of the
  // fine block it ends with); prev: fine block G - 1's, the GPU hit's last block's in any group.
  std::vector<BlockHash> ids;
  BlockHash prev;
  if (!host_chain_ && G > 0) {
    bool have = false;
    for (std::size_t g = 0; g < ng && !have; ++g) {
      const auto b = static_cast<std::size_t>(hit.gpu.group(g).back());
      if (b != 0 && own_records_ && !gpu_hash_[b].empty()) {
        prev = gpu_identity_[b];
        have = true;
      }
    }
    if (!have) {
      sequence_identities(fine, G, identity_scratch_);
      prev = identity_scratch_.back();
    }
  }
  std::size_t end = G;  // scanned and every full-attention group found: [G, end)
  for (std::size_t cand = G + align_; cand <= max_blocks; cand += align_) {
    while (!host_chain_ && G + ids.size() < cand) {
      const std::size_t j = G + ids.size();
      const BlockHash* parent = j == 0 ? nullptr : ids.empty() ? &prev : &ids.back();
      BlockHash id = identity_after(parent, fine, j, mm_scratch_);
      ids.push_back(id);
    }
    bool full_missed = false;
    for (std::size_t g = 0; g < ng; ++g) {
      const std::size_t f = factor_[g];
      const auto group = static_cast<GroupId>(g);
      for (std::size_t p = G / f + rows[g].size(); p < cand / f; ++p) {
        const BlockHash* id = host_chain_ ? nullptr : &ids[(p + 1) * f - 1 - G];
        const BlockId slot = host_match(seqs[g], p, id, group);
        rows[g].push_back(slot == BlockPool::kNoBlock ? 0 : slot);
        if (!is_window(g) && slot == BlockPool::kNoBlock) full_missed = true;
      }
    }
    if (full_missed) break;
    end = cand;
  }
  // The longest L in (G, end], a multiple of align_ past G, that every window group accepts: its
  // blocks [max(G_g, L_g - wb), L_g) in the host (and [max(0, L_g - wb), G_g) in the GPU hit,
  // which a fixed-point hit holds).
  std::size_t L = G;
  for (std::size_t cand = end; cand > G && L == G; cand -= align_) {
    bool ok = true;
    for (std::size_t g = 0; g < ng && ok; ++g) {
      if (!is_window(g)) continue;
      const std::size_t f = factor_[g];
      const std::size_t wb = window_blocks_[g];
      const std::size_t Gg = G / f;
      const std::size_t cg = cand / f;
      const std::size_t from = cg > wb ? cg - wb : 0;
      for (std::size_t p = std::max(from, Gg); p < cg && ok; ++p) ok = rows[g][p - Gg] != 0;
      for (std::size_t p = from; p < Gg && ok; ++p) ok = hit.gpu.group(g)[p] != kNullBlockId;
    }
    if (ok) L = cand;
  }
  if (L == G) return;
  for (std::size_t g = 0; g < ng; ++g) {
    const std::size_t f = factor_[g];
    const std::size_t Gg = G / f;
    const std::size_t Lg = L / f;
    std::vector<BlockId>& out = g == 0 ? hit.host_slots : hit.host_other_groups[g - 1];
    out.assign(rows[g].begin(), rows[g].begin() + static_cast<std::ptrdiff_t>(Lg - Gg));
    if (is_window(g)) {
      const std::size_t wb = window_blocks_[g];
      const std::size_t from = Lg > wb ? Lg - wb : 0;
      for (std::size_t p = Gg; p < from; ++p) out[p - Gg] = 0;  // before the window: not loaded
    }
  }
  hit.num_host_tokens = hit.host_slots.size() * group_bs_[0];
  hit.host_check = hybrid_hit_check(hit, fine.block_hashes, host_chain_ ? 0 : request.id());
}

std::optional<TierAllocation> TieredKVCacheManager::hybrid_allocate_slots(
    Request& request, std::size_t num_new_tokens, const TieredCacheHit& hit,
    std::size_t num_lookahead_tokens) {
  const auto where = [&request] {
    return "TieredKVCacheManager::allocate_slots: request " + std::to_string(request.id()) + ": ";
  };
  const RequestMap::iterator found = checked_allocation_state(request, hit);
  const std::size_t ng = window_blocks_.size();
  // Blocks of bs_: the GPU hit G, the host part H (group g: x_g = x / factor_[g] of its blocks).
  const std::size_t G = hit.gpu.blocks.size() * factor_[0];
  const std::size_t H = hit.host_slots.size() * factor_[0];
  std::size_t num_loads = 0;
  if (H > 0) {
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
    const std::size_t L = G + H;
    if (L > hashes.size()) {
      throw Error(ErrorCode::kInvalidArgument,
                  where() + "stale host hit: " + std::to_string(L * bs_) +
                      " tokens but the request has " + std::to_string(hashes.size() * bs_) +
                      " in full blocks");
    }
    if (G % align_ != 0 || H % align_ != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  where() + "the hit's " + std::to_string(G * bs_) + " GPU and " +
                      std::to_string(H * bs_) + " host tokens are not multiples of " +
                      std::to_string(align_ * bs_) + " (the groups' LCM block size)");
    }
    // Each group's slots: every position for full attention, exactly the window at L for a
    // window group, each a real slot.
    for (std::size_t g = 0; g < ng; ++g) {
      const std::size_t f = factor_[g];
      const std::size_t Gg = G / f;
      const std::size_t Lg = L / f;
      const std::size_t hg = Lg - Gg;
      if (g > 0 && hit.host_other_groups[g - 1].size() != hg) {
        throw Error(ErrorCode::kInvalidArgument,
                    where() + "the host hit's group " + std::to_string(g) + " has " +
                        std::to_string(hit.host_other_groups[g - 1].size()) + " slots, not " +
                        std::to_string(hg));
      }
      const std::size_t from =
          is_window(g) ? std::max(Gg, Lg > window_blocks_[g] ? Lg - window_blocks_[g] : 0) : Gg;
      for (std::size_t i = 0; i < hg; ++i) {
        const BlockId slot = hit_slot(hit, g, i);
        const bool wanted = Gg + i >= from;
        if (wanted != (slot != 0) || (wanted && (slot < 1 || slot >= host_.num_blocks()))) {
          throw Error(ErrorCode::kInvalidArgument,
                      where() + "stale host hit: group " + std::to_string(g) + " slot " +
                          std::to_string(slot) + " at block " + std::to_string(Gg + i) +
                          (wanted ? " is out of range" : " lies before the window"));
        }
        if (wanted) ++num_loads;
      }
    }
    if (hit.host_epoch != host_epoch_ ||
        hit.host_check != hybrid_hit_check(hit, hashes, host_chain_ ? 0 : request.id())) {
      const BlockSequence fine = request.hashed_tokens().sequence();
      if (!host_chain_) sequence_identities(fine, L, identity_scratch_);
      std::vector<std::vector<BlockHash>> coarse(ng);
      for (std::size_t g = 0; g < ng; ++g) {
        const std::size_t f = factor_[g];
        const BlockSequence seq = group_seq(fine, g, coarse);
        for (std::size_t i = 0; i < (L - G) / f; ++i) {
          const BlockId slot = hit_slot(hit, g, i);
          if (slot == 0) continue;
          const std::size_t p = G / f + i;
          const BlockHash* id = host_chain_ ? nullptr : &identity_scratch_[(p + 1) * f - 1];
          if (!host_verified(seq, p, slot, id, static_cast<GroupId>(g))) {
            throw Error(ErrorCode::kInvalidArgument,
                        where() + "stale host hit: slot " + std::to_string(slot) +
                            " no longer holds the request's block " + std::to_string(p) +
                            " of group " + std::to_string(g) +
                            " (call allocate_slots right after get_computed_blocks)");
          }
        }
      }
    }
  }
  // Everything that may allocate happens before the manager changes state.
  const std::size_t per_group =
      H + 2 * ((request.num_tokens() + num_lookahead_tokens) / bs_ + 2) + G;
  const std::size_t bound = per_group * ng;
  reserve_transfers(bound);
  const HostPolicy policy = host_config_.policy;
  const std::size_t max_evictions = policy == HostPolicy::kWriteBack ? bound : 0;
  const std::size_t max_stores = policy == HostPolicy::kWriteThrough ? (H == 0 ? bound : 0)
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
      reserve_room(evicted_tokens_, bound * stride_);
    }
  }
  std::vector<BlockId>& pins = found_slots_;
  pins.clear();
  pins.reserve(num_loads);
  for (std::size_t g = 0; g < ng && H > 0; ++g) {
    for (std::size_t i = 0; i < H / factor_[g]; ++i) {
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
  const BlockSequence fine = request.hashed_tokens().sequence();
  try {
    if (st.scanned_groups.size() != ng) st.scanned_groups.assign(ng, st.scanned);
    if (!host_chain_ && own_records_) {
      st.identities.reserve(std::min(request.block_hashes().size(),
                                     (request.num_tokens() + num_lookahead_tokens) / bs_ + 1));
    }
    hybrid_coarse(fine, st);  // the coarser groups' keys of every full block
    if (H == 0) {
      // hybrid_record_new_blocks' records of the blocks this call caches (at most its known
      // tokens'); a new request's groups start after the GPU hit.
      const std::size_t known = request.num_computed_tokens() + hit.gpu.num_tokens;
      const std::size_t upto =
          known > request.num_tokens() || num_new_tokens > request.num_tokens() - known
              ? request.num_tokens()
              : known + num_new_tokens;
      std::size_t* from = nullptr;
      if (inserted) {
        group_from_scratch_.resize(ng);
        for (std::size_t g = 0; g < ng; ++g) group_from_scratch_[g] = G / factor_[g];
        from = group_from_scratch_.data();
      }
      hybrid_prepare_records(request, st, upto,
                             std::span<const std::size_t>(from, from == nullptr ? 0 : ng));
    }
  } catch (...) {
    if (inserted)
      release_state(it);
    else if (old_scanned_groups != ng)
      st.scanned_groups.clear();
    throw;
  }
  std::optional<std::span<const BlockId>> blocks;
  try {
    blocks = manager_.allocate_slots(request, H * bs_ + num_new_tokens, hit.gpu,
                                     num_lookahead_tokens, /*delay_cache_blocks=*/H > 0);
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
    // (capacity reserved above: no allocation)
    for (std::size_t g = 0; g < ng; ++g) st.scanned_groups[g] = G / factor_[g];
  }
  if (inserted && policy == HostPolicy::kWriteThroughSelective) {
    for (std::size_t g = 0; g < ng; ++g) {
      const BlockSequence seq = group_seq(fine, g, st.coarse);
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
  if (H > 0) {
    for (std::size_t g = 0; g < ng; ++g) {
      const std::size_t f = factor_[g];
      const std::span<const BlockId> row = manager_.block_ids(request.id(), g);
      for (std::size_t i = 0; i < H / f; ++i) {
        const BlockId slot = hit_slot(hit, g, i);
        if (slot == 0) continue;
        const BlockId block = row[G / f + i];
        // chain_index: where the block starts in the host part, in blocks of bs_ (a failed load
        // invalidates the tokens from there).
        const TransferId id =
            open_transfer(Kind::kLoad, &st, block, slot, static_cast<std::uint32_t>(i * f));
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
    st.num_loads = H;
    st.first_failed = H;
    st.cache_upto = std::min((G + H) * bs_ + num_new_tokens, request.num_tokens());
    st.hit_end = G + H;
  } else {
    hybrid_record_new_blocks(request, st, copies_);
  }
  hand_over_copies(out.transfers);
  return out;
}

LoadResult TieredKVCacheManager::hybrid_finish_loads(Request& request, RequestState& st) {
  const std::size_t ng = window_blocks_.size();
  // Blocks of bs_ (group g: x / factor_[g] of its own).
  const std::size_t G = st.hit_begin;
  const std::size_t L = st.hit_end;
  LoadResult result;
  result.rolled_back = st.first_failed < st.num_loads;
  std::size_t valid_blocks = L;
  // Per group (its blocks): blocks of the host part that were not loaded (a window group's
  // positions before its window at L) are never cached.
  std::vector<std::size_t> first_to_cache(ng, 0);
  for (std::size_t g = 0; g < ng; ++g) {
    if (!is_window(g)) continue;
    const std::size_t wb = window_blocks_[g];
    const std::size_t Lg = L / factor_[g];
    const std::size_t from = Lg > wb ? Lg - wb : 0;
    first_to_cache[g] = std::max(from, G / factor_[g]);
  }
  if (result.rolled_back) {
    // The longest prefix valid in every group: up to the start of the first failed block (of
    // any group), unless a window group's window there reaches into blocks it never loaded
    // (then the GPU hit, whose window is in place).
    valid_blocks = G + st.first_failed;
    for (std::size_t g = 0; g < ng; ++g) {
      if (is_window(g) && window_blocks_[g] > 0 && first_to_cache[g] > G / factor_[g]) {
        valid_blocks = G;
      }
    }
  }
  result.num_computed_tokens = valid_blocks * bs_;
  const std::size_t bound = ng * (2 * (request.num_tokens() / bs_ + 2));
  reserve_transfers(bound);
  reserve_copies(0, host_config_.policy == HostPolicy::kWriteThrough ? bound : 0);
  hybrid_coarse(request.hashed_tokens().sequence(), st);  // (done by allocate_slots: no-op)
  const std::size_t upto = result.rolled_back ? result.num_computed_tokens : st.cache_upto;
  if (result.rolled_back) {
    // Recomputed from valid_blocks on: those blocks are written again, and cached then (a
    // coarser group's block that straddles valid_blocks too: it is not whole).
    for (std::size_t g = 0; g < ng; ++g) {
      first_to_cache[g] = std::min(first_to_cache[g], valid_blocks / factor_[g]);
    }
  }
  hybrid_prepare_records(request, st, upto, {});
  manager_.cache_blocks(request, upto, first_to_cache);
  st.loading = false;
  if (result.rolled_back) {
    ++stats_.rollbacks;
    // The GPU manager caches a hybrid request's blocks only up to a multiple of the LCM: loaded
    // blocks past the last one below valid_blocks stay uncached until a later allocation caches
    // them (their K/V is in place), or are released uncached; their noted slots go.
    forget_loaded_slots(request, st, valid_blocks / align_ * align_ - G);
    st.hit_end = G;  // every block from valid_blocks on is recomputed (and then cached)
  }
  hybrid_record_new_blocks(request, st, copies_);
  hand_over_copies(result.transfers);
  return result;
}

void TieredKVCacheManager::hybrid_record_new_blocks(Request& request, RequestState& st,
                                                    TierPlan& out) {
  const BlockSequence fine = request.hashed_tokens().sequence();
  const bool write_through = host_config_.policy == HostPolicy::kWriteThrough;
  if (!own_records_ && !write_through && fine.extra_keys == nullptr) return;
  const std::size_t ng = window_blocks_.size();
  if (st.scanned_groups.size() != ng) st.scanned_groups.assign(ng, st.scanned);
  const BlockPool& pool = manager_.block_pool();
  for (std::size_t g = 0; g < ng; ++g) {
    const std::size_t f = factor_[g];
    const std::uint32_t gbs = group_bs_[g];
    // (Coarser groups' keys were extended by allocate_slots / finish_loads: no allocation.)
    const BlockSequence seq = group_seq(fine, g, st.coarse);
    const std::span<const BlockId> ids = manager_.block_ids(request.id(), g);
    const std::size_t end = std::min(ids.size(), seq.block_hashes.size());
    // A window group's never-loaded blocks of the host part (never cached): passed over.
    std::size_t skip_end = 0;
    if (is_window(g) && st.hit_end > st.hit_begin) {
      const std::size_t wb = window_blocks_[g];
      const std::size_t Lg = st.hit_end / f;
      skip_end = Lg > wb ? Lg - wb : 0;
    }
    std::size_t i = st.scanned_groups[g];
    for (; i < end; ++i) {
      const BlockId b = ids[i];
      if (b == kNullBlockId) continue;  // released from the window
      if (!pool.block(b).is_cached()) {
        // Passed over: a never-loaded block, or one the GPU manager never caches (a window
        // block that no hit at a multiple of the LCM can use: coordinator.hpp's block_can_hit).
        if (i < skip_end || !coarse_keys_.block_can_hit(g, i)) continue;
        break;
      }
      const auto k = static_cast<std::size_t>(b);
      if (own_records_) {
        gpu_hash_[k] = seq.block_hashes[i];
        gpu_first_[k] = i == 0 ? 1 : 0;
        gpu_parent_[k] = i == 0 ? BlockHash() : seq.block_hashes[i - 1];
        copy_block_tokens(gpu_tokens_.data() + k * stride_, seq.tokens.data() + i * gbs, gbs);
        if (!host_chain_) {
          // The identity of the fine block this block ends with (computed ahead by
          // hybrid_prepare_records: then no allocation here).
          assert(st.identities.size() >= (i + 1) * f);
          hybrid_identities(fine, st, (i + 1) * f);
          gpu_identity_[k] = st.identities[(i + 1) * f - 1];
        }
      }
      if (fine.extra_keys != nullptr) {
        // Computed ahead by hybrid_prepare_records (a block it did not reach, never by its
        // bounds, is computed here).
        const std::size_t a = i - group_ahead_from_[g];  // wraps when not prepared
        const std::vector<SharedExtraKeys>& ahead = group_extra_ahead_[g];
        assert(a < ahead.size());
        SharedExtraKeys keys = a < ahead.size() ? ahead[a] : shared_extra_keys(seq, i, mm_scratch_);
        if (keys != nullptr) set_gpu_extra(b, std::move(keys));
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
    group_extra_ahead_[g].clear();  // (keeps the capacity)
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
