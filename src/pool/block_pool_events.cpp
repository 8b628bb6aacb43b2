// BlockPool: KV events, reserved before a change, recorded during it, delivered after it.

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../base/vector_growth.hpp"
#include "block_pool_internal.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/pool/block_pool.hpp"

namespace pagedkv {

void BlockPool::reserve_events(std::size_t removals, std::size_t others) {
  if (!config_.enable_kv_events) return;
  while (removed_shells_.size() < removals) {
    KVEvent shell;
    shell.data = BlockRemoved{std::vector<BlockHash>(1), 0};
    removed_shells_.push_back(std::move(shell));
  }
  detail::reserve_more(events_, removals + others);
}

void BlockPool::reserve_evictions(std::size_t evictions, std::size_t other_events) {
  reserve_events(evictions, other_events);
  if (guarded_) orphans_->reserve(evictions);  // an eviction leaves at most one record
}

void BlockPool::record(KVEvent::Data&& data) noexcept {
  // Capacity was reserved before the change began (reserve_events), so this never allocates.
  events_.push_back(KVEvent{next_event_seq_++, std::move(data)});
}

void BlockPool::record_removed(const BlockHash& hash, GroupId group) noexcept {
  KVEvent event = std::move(removed_shells_.back());
  removed_shells_.pop_back();
  auto& removed = std::get<BlockRemoved>(event.data);
  removed.block_hashes[0] = hash;
  removed.group_id = group;
  event.seq = next_event_seq_++;
  events_.push_back(std::move(event));
}

void BlockPool::deliver_events() noexcept {
  // noexcept enforces the sink's contract: an exception escaping it terminates the program
  // (with the pool consistent) instead of leaving a half-delivered, half-applied step.
  if (!sink_ || delivery_holds_ > 0 || events_.empty()) return;
  for (const KVEvent& event : events_) sink_(event);
  events_.clear();
}

std::vector<KVEvent> BlockPool::take_events() noexcept {
  return std::exchange(events_, {});
}

void BlockPool::set_event_sink(KVEventSink sink) noexcept {
  sink_ = std::move(sink);
}

}  // namespace pagedkv
