// TieredKVCacheManager: the engine's commits of finished transfers (one or a batch), and of
// fills received from below. Contract: tiered_kv_cache_manager.hpp.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "pagedkv/base/error.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"
#include "tiered_kv_cache_manager_internal.hpp"

namespace pagedkv {

inline void TieredKVCacheManager::commit_load(std::size_t idx, Transfer& t, bool ok) {
  RequestState& st = *t.state;
  host_.free_block(t.host);  // unpinned; back at the LRU tail
  if (ok) {
    ++stats_.loaded_blocks;
    stats_.loaded_bytes += group_bytes_[t.group];
    ++group_stats_[t.group].loaded_blocks;
    group_stats_[t.group].loaded_bytes += group_bytes_[t.group];
  } else {
    ++stats_.load_failures;
    st.first_failed = std::min<std::size_t>(st.first_failed, t.chain_index);
  }
  --st.loads_in_flight;
  --st.transfers_in_flight;
  close_transfer(t, idx);
}

// One id without the batch's marking pass and hook list: a per-copy commit stays as cheap as it
// was (through the batch it cost about 2 ns more per block in BM_HostHitWriteBackPerIdCommit).
void TieredKVCacheManager::commit(TransferId id, bool ok) {
  const auto idx = static_cast<std::size_t>(id & kIndexMask);
  if (idx >= transfers_.size() || !transfers_[idx].live ||
      transfers_[idx].generation != static_cast<std::uint32_t>(id >> 32)) [[unlikely]] {
    throw_unknown(id);
  }
  Transfer& t = transfers_[idx];
  const BlockId host_slot = t.host;
  if (t.kind != Kind::kLoad) {
    const bool from_fill = t.kind == Kind::kFill;
    if (commit_receive(idx, t, ok) && hooks_.on_cached) hooks_.on_cached(host_slot, from_fill);
    return;
  }
  commit_load(idx, t, ok);
  if (ok && hooks_.on_loaded) hooks_.on_loaded(host_slot);
}

void TieredKVCacheManager::commit(std::span<const TransferId> ids, bool ok) {
  // Check every id, marking each checked one not live so that a repeat fails; undo on error.
  for (std::size_t k = 0; k < ids.size(); ++k) {
    const TransferId id = ids[k];
    const auto idx = static_cast<std::size_t>(id & kIndexMask);
    if (idx >= transfers_.size() || !transfers_[idx].live ||
        transfers_[idx].generation != static_cast<std::uint32_t>(id >> 32)) [[unlikely]] {
      for (std::size_t j = 0; j < k; ++j) transfers_[ids[j] & kIndexMask].live = true;
      throw_unknown(id);
    }
    transfers_[idx].live = false;
  }
  const bool hooked = hooks_.on_loaded || hooks_.on_cached;
  if (hooked) {
    hook_scratch_.clear();
    try {
      hook_scratch_.reserve(ids.size());
    } catch (...) {
      for (const TransferId id : ids) transfers_[id & kIndexMask].live = true;
      throw;
    }
  }
  // Nothing below throws until the hooks. A load is committed as commit_load() does, with its
  // counts kept in registers: per request for a run of one request's loads, and for the stats and
  // the live count until the end (0.35 ns per block less than commit_load() per id).
  RequestState* run = nullptr;  // the request of the loads counted in run_loads
  std::uint32_t run_loads = 0;
  std::uint64_t loads = 0;
  std::uint64_t hybrid_bytes = 0;  // hybrid models: the loads' bytes, per group's block
  const auto end_run = [&] {
    if (run == nullptr) return;
    run->loads_in_flight -= run_loads;
    run->transfers_in_flight -= run_loads;
    run = nullptr;
    run_loads = 0;
  };
  for (const TransferId id : ids) {
    const auto idx = static_cast<std::size_t>(id & kIndexMask);
    Transfer& t = transfers_[idx];
    const BlockId host_slot = t.host;
    if (t.kind == Kind::kLoad) [[likely]] {
      host_.free_block(host_slot);  // unpinned; back at the LRU tail
      if (t.state != run) {
        end_run();
        run = t.state;
      }
      ++run_loads;
      if (!ok) run->first_failed = std::min<std::size_t>(run->first_failed, t.chain_index);
      ++loads;
      if (hybrid_) [[unlikely]] {
        hybrid_bytes += group_bytes_[t.group];
        if (ok) {
          ++group_stats_[t.group].loaded_blocks;
          group_stats_[t.group].loaded_bytes += group_bytes_[t.group];
        }
      }
      ++t.generation;  // closed (live was cleared by the check)
      free_transfers_.push_back(static_cast<std::uint32_t>(idx));  // capacity: transfers_'s
      if (hooked && ok) hook_scratch_.emplace_back(host_slot, std::uint8_t{0});
    } else {
      end_run();
      const bool from_fill = t.kind == Kind::kFill;
      if (commit_receive(idx, t, ok) && hooked) {
        hook_scratch_.emplace_back(host_slot, static_cast<std::uint8_t>(from_fill ? 2 : 1));
      }
    }
  }
  end_run();
  num_live_ -= loads;
  if (ok) {
    stats_.loaded_blocks += loads;
    stats_.loaded_bytes += hybrid_ ? hybrid_bytes : loads * host_config_.bytes_per_block;
    if (!hybrid_) {
      group_stats_[0].loaded_blocks += loads;
      group_stats_[0].loaded_bytes += loads * host_config_.bytes_per_block;
    }
  } else {
    stats_.load_failures += loads;
  }
  if (!hooked) return;
  for (const auto& [slot, what] : hook_scratch_) {
    if (what == 0) {
      if (hooks_.on_loaded) hooks_.on_loaded(slot);
    } else if (hooks_.on_cached) {
      hooks_.on_cached(slot, what == 2);
    }
  }
}

void TieredKVCacheManager::throw_unknown(TransferId id) {
  throw Error(ErrorCode::kNotFound, "TieredKVCacheManager::commit: transfer " + std::to_string(id) +
                                        " is unknown or already committed, or given twice");
}

inline void TieredKVCacheManager::close_transfer(Transfer& t, std::size_t idx) {
  t.live = false;
  ++t.generation;
  free_transfers_.push_back(static_cast<std::uint32_t>(idx));  // capacity: transfers_'s
  --num_live_;
}

bool TieredKVCacheManager::commit_receive(std::size_t idx, Transfer& t, bool ok) {
  // A store, eviction or fill: the slot receives a block.
  bool became_cached = false;
  if (ok) {
    const bool first = transfer_first_[idx] != 0;
    const ContentSource extra(transfer_extra_[idx].get(), first ? 0 : 1);
    const std::uint32_t gbs = group_bs_[t.group];
    copy_block_tokens(content_tokens_.data() + gbs, transfer_tokens_.data() + idx * stride_, gbs);
    content_hashes_[0] = transfer_parent_[idx];
    content_hashes_[1] = transfer_hash_[idx];
    const BlockSequence seq =
        content_sequence(content_tokens_, content_hashes_, first, &extra, gbs);
    const std::size_t index = first ? 0 : 1;
    // The lookup and the caching may allocate (extra keys, events), each throwing before it
    // changes anything: a block that cannot be cached for memory is dropped (counted), so a
    // batch commit never stops half-way (the transfers before it are committed already).
    try {
      // (With prefix identities a twin of another prefix, a collision, keeps its slot: this
      // block is not cached, a miss later, never a wrong hit.)
      const BlockId twin = host_.match_cached_block_unanchored(seq, index, t.group);
      if (twin == BlockPool::kNoBlock) {  // a concurrent store of the same block may have won
        const BlockId blocks[2] = {kNullBlockId, t.host};
        host_.cache_full_blocks(seq,
                                std::span<const BlockId>(blocks + (first ? 1 : 0), first ? 1 : 2),
                                index, index + 1, t.group);
        became_cached = true;
      }
    } catch (const std::bad_alloc&) {
      ++stats_.stores_skipped_no_memory;
    }
    if (became_cached) {
      // (The host pool stored the parent hash: the view's block 0.)
      const auto s = static_cast<std::size_t>(t.host);
      if (!host_chain_) host_identity_[s] = transfer_identity_[idx];
      ++host_cached_ever_;
      if (t.kind != Kind::kFill) {
        ++stats_.stored_blocks;
        stats_.stored_bytes += group_bytes_[t.group];
        ++group_stats_[t.group].stored_blocks;
        group_stats_[t.group].stored_bytes += group_bytes_[t.group];
      }
    }
  } else {
    ++stats_.store_failures;
  }
  host_.free_block(t.host);  // cached: LRU tail; else reused first
  --host_storing_;
  transfer_extra_[idx].reset();
  if (t.state != nullptr) --t.state->transfers_in_flight;
  close_transfer(t, idx);
  return became_cached;
}

}  // namespace pagedkv
