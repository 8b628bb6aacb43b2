// TieredKVCacheManager: stats, invariant checks and snapshots (tests and tools; not hot).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "pagedkv/base/error.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"
#include "tiered_kv_cache_manager_internal.hpp"

namespace pagedkv {

TierStats TieredKVCacheManager::stats() const noexcept {
  TierStats s = stats_;
  s.host_evictions = host_.num_evictions();
  s.host_slots_pinned = host_config_.num_host_blocks - host_.num_free_blocks();
  s.host_slots_storing = host_storing_;
  s.host_cached_blocks = host_cached_ever_ - host_.num_evictions();
  return s;
}

void TieredKVCacheManager::check_invariants() const {
  const auto fail = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidState, "TieredKVCacheManager invariant broken: " + what);
  };
  manager_.check_invariants();
  host_.check_invariants();
  const BlockPool& pool = manager_.block_pool();
  std::vector<std::int32_t> host_refs(static_cast<std::size_t>(host_.num_blocks()), 0);
  std::unordered_map<RequestId, std::pair<std::uint32_t, std::uint32_t>> counts;
  // A transfer names its request by state pointer: known only if it is one of requests_'.
  std::unordered_map<const RequestState*, RequestId> owners;
  for (const auto& [id, st] : requests_) {
    if (st.id != id) fail("request " + std::to_string(id) + "'s state names another id");
    owners.emplace(&st, id);
  }
  std::size_t live = 0;
  std::int32_t storing = 0;
  for (const Transfer& t : transfers_) {
    if (!t.live) continue;
    ++live;
    ++host_refs[static_cast<std::size_t>(t.host)];
    if (t.kind == Kind::kFill) {
      ++storing;
      if (host_.block(t.host).is_cached()) fail("a filling host slot is already hit-able");
      continue;
    }
    const auto owner = owners.find(t.state);
    if (owner == owners.end()) fail("a transfer of an unknown request");
    auto& c = counts[owner->second];
    ++c.second;
    // (Any group's row: an eviction's block now serves its new owner, perhaps in another group.)
    bool held = false;
    for (std::size_t g = 0; g < manager_.num_groups() && !held; ++g) {
      const std::span<const BlockId> row = manager_.block_ids(owner->second, g);
      held = std::find(row.begin(), row.end(), t.gpu) != row.end();
    }
    if (!held) {
      fail("a transfer's GPU block " + std::to_string(t.gpu) + " is not held by its request");
    }
    if (t.kind == Kind::kLoad) {
      ++c.first;
      if (pool.block(t.gpu).is_cached()) fail("a loading GPU block is already hit-able");
      if (!host_.block(t.host).is_cached()) fail("a loading host slot is not cached");
    } else {
      ++storing;
      if (host_.block(t.host).is_cached()) fail("a storing host slot is already hit-able");
    }
  }
  if (live != num_live_) fail("live transfer count");
  if (storing != host_storing_) fail("storing slot count");
  std::uint64_t cached = 0;
  std::int32_t pins = 0;
  for (BlockId s = 1; s < host_.num_blocks(); ++s) {
    const std::uint32_t p = host_pins_[static_cast<std::size_t>(s)];
    pins += static_cast<std::int32_t>(p);
    host_refs[static_cast<std::size_t>(s)] += static_cast<std::int32_t>(p);
    if (p > 0 && !host_.block(s).is_cached()) fail("a pinned host slot is not cached");
    const KVCacheBlock& b = host_.block(s);
    if (b.ref_cnt != host_refs[static_cast<std::size_t>(s)]) {
      fail("host slot " + std::to_string(s) + " has ref " + std::to_string(b.ref_cnt) + " but " +
           std::to_string(host_refs[static_cast<std::size_t>(s)]) +
           " transfers in flight (a slot in use is free-queued or pinned)");
    }
    if (b.is_cached()) {
      ++cached;
      if (!host_chain_ && host_identity_[static_cast<std::size_t>(s)].empty()) {
        fail("cached host slot " + std::to_string(s) + " has no prefix identity");
      }
    }
  }
  if (cached != host_cached_ever_ - host_.num_evictions()) fail("host cached block count");
  if (pins != num_host_pins_) fail("host pin count");
  for (const auto& [id, st] : requests_) {
    const auto c = counts.find(id);
    const std::uint32_t loads = c == counts.end() ? 0 : c->second.first;
    const std::uint32_t all = c == counts.end() ? 0 : c->second.second;
    if (st.loads_in_flight != loads || st.transfers_in_flight != all) {
      fail("request " + std::to_string(id) + "'s in-flight counts");
    }
    if (st.loads_in_flight > 0 && !st.loading) fail("loads in flight of a finished request");
  }
  for (const auto& [id, c] : counts) {
    if (requests_.find(id) == requests_.end()) fail("a transfer of an unknown request");
  }
  if (!evicted_.empty()) fail("evictions left unprocessed");
  for (BlockId b = 1; b < pool.num_blocks(); ++b) {
    if (!own_records_) break;
    const KVCacheBlock& blk = pool.block(b);
    const BlockHash& rec = gpu_hash_[static_cast<std::size_t>(b)];
    if (blk.is_cached() != !rec.empty() || (blk.is_cached() && blk.block_hash != rec)) {
      fail("GPU block " + std::to_string(b) + "'s recorded content differs from the pool's");
    }
    if (!host_chain_ && blk.is_cached() && gpu_identity_[static_cast<std::size_t>(b)].empty()) {
      fail("cached GPU block " + std::to_string(b) + " has no prefix identity");
    }
  }
  std::size_t with_extra = 0;
  for (std::size_t b = 0; b < gpu_extra_.size(); ++b) {
    if (gpu_extra_[b] == nullptr) continue;
    ++with_extra;
    if (!pool.block(static_cast<BlockId>(b)).is_cached()) {
      fail("extra keys of GPU block " + std::to_string(b) + ", which is not cached");
    }
  }
  if (with_extra != num_gpu_extra_) {
    fail("GPU blocks with extra keys: " + std::to_string(with_extra) + " but the count says " +
         std::to_string(num_gpu_extra_));
  }
  // A remembered host slot (host_has and on_evict trust it without a lookup) must be the one a
  // verified lookup of the GPU block's content finds.
  std::vector<TokenId> tokens(2 * static_cast<std::size_t>(stride_), 0);
  for (BlockId b = 1; b < pool.num_blocks(); ++b) {
    const auto k = static_cast<std::size_t>(b);
    const BlockId slot = gpu_host_slot_[k];
    if (!pool.block(b).is_cached() || !remembered_valid(k)) continue;
    const std::uint32_t gbs = group_bs_[pool.block(b).group_id];
    BlockHash hashes[2];
    bool first = false;
    if (own_records_) {
      std::memcpy(tokens.data() + gbs, gpu_tokens_.data() + k * stride_, gbs * sizeof(TokenId));
      hashes[0] = gpu_parent_[k];
      hashes[1] = gpu_hash_[k];
      first = gpu_first_[k] != 0;
    } else {
      std::memcpy(tokens.data() + gbs, pool.stored_tokens(b), gbs * sizeof(TokenId));
      hashes[0] = pool.stored_parent_hash(b);
      hashes[1] = pool.block(b).block_hash;
      first = hashes[0].empty();
    }
    const ContentSource extra(gpu_extra_[k].get(), first ? 0 : 1);
    const BlockSequence seq = content_sequence(tokens, hashes, first, &extra, gbs);
    if (!host_verified(seq, first ? 0 : 1, slot, host_chain_ ? nullptr : &gpu_identity_[k],
                       pool.block(b).group_id)) {
      fail("GPU block " + std::to_string(b) + " remembers host slot " + std::to_string(slot) +
           ", which does not hold its content");
    }
  }
}

TieredSnapshot TieredKVCacheManager::snapshot() const {
  TieredSnapshot s;
  s.gpu = manager_.snapshot();
  s.host = host_.snapshot();
  for (std::size_t i = 0; i < transfers_.size(); ++i) {
    if (transfers_[i].live) {
      s.live_transfers.push_back((static_cast<std::uint64_t>(transfers_[i].generation) << 32) | i);
    }
  }
  s.next_event_seq = next_event_seq_;
  s.requests = stats_.requests;
  s.queried_tokens = stats_.queried_tokens;
  s.gpu_hit_tokens = stats_.gpu_hit_tokens;
  s.host_hit_tokens = stats_.host_hit_tokens;
  return s;
}

}  // namespace pagedkv
