#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "pagedkv/base/error.hpp"
#include "tiered_kv_cache_manager_internal.hpp"

namespace pagedkv {

TieredKVCacheManager::TieredKVCacheManager(const KVCacheManagerConfig& gpu,
                                           const HostTierConfig& host)
    : host_config_(host),
      manager_(checked_gpu_config(gpu, host)),
      host_(host_pool_config(gpu, host, manager_.block_pool().config())),
      host_chain_(manager_.block_pool().config().chain_hashes_identify_prefix),
      bs_(manager_.block_size()),
      stride_(manager_.block_pool().config().block_size),
      coarse_keys_(manager_specs(manager_), manager_.hasher().scheme()),
      identity_hasher_(HashScheme::kSha256, std::string_view("pagedkv-prefix-identity")),
      own_records_(!manager_.block_pool().stores_chain_material() || !host_chain_),
      // Differs between tiers alive at once (the address) and, in practice, between tiers built
      // at one address in turn (the clock).
      check_seed_(
          (static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(this)) * kGolden) ^
          static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())) {
  const auto n = static_cast<std::size_t>(manager_.block_pool().num_blocks());
  if (own_records_) {
    gpu_hash_.resize(n);
    gpu_parent_.resize(n);
    gpu_first_.assign(n, 0);
    gpu_tokens_.assign(n * stride_, 0);
  }
  gpu_hits_.assign(n, 0);
  gpu_extra_.resize(n);
  gpu_host_slot_.assign(n, 0);
  gpu_host_epoch_.assign(n, 0);
  const auto m = static_cast<std::size_t>(host_.num_blocks());
  if (!host_chain_) {  // prefix identities
    host_identity_.resize(m);
    gpu_identity_.resize(n);
  }
  host_slot_epoch_.assign(m, 0);
  host_pins_.assign(m, 0);
  content_tokens_.assign(2 * static_cast<std::size_t>(stride_), 0);
  stats_.host_slots = host.num_host_blocks;
  const std::size_t num_groups = manager_.num_groups();
  group_stats_.assign(num_groups, TierGroupStats{});
  for (std::size_t g = 0; g < num_groups; ++g) {
    const AttentionSpec& spec = manager_.group_spec(g);
    window_blocks_.push_back(spec.kind == AttentionKind::kSlidingWindow ? spec.window_blocks()
                                                                        : kFullGroup);
    group_bytes_.push_back(host.group_bytes_per_block.empty() ? host.bytes_per_block
                                                              : host.group_bytes_per_block[g]);
    group_bs_.push_back(spec.block_size);
    factor_.push_back(spec.block_size / bs_);
  }
  align_ = coarse_keys_.alignment() / bs_;
  coarse_scratch_.resize(num_groups);
  // Several groups, or one sliding-window group: the per-group path (tier_hybrid.cpp).
  hybrid_ = num_groups > 1 || window_blocks_[0] != kFullGroup;
  if (hybrid_) {
    gpu_tail_.assign(n, 0);
    group_ahead_from_.assign(num_groups, 0);
    group_extra_ahead_.resize(num_groups);
  }
  if (gpu.enable_kv_events) {
    manager_.set_event_sink([this](const KVEvent& e) { forward_event(e, "GPU"); });
    host_.set_event_sink([this](const KVEvent& e) { forward_event(e, "CPU"); });
  }
  manager_.set_eviction_observer(&eviction_forwarder_);
}

TieredKVCacheManager::~TieredKVCacheManager() {
  manager_.set_eviction_observer(nullptr);
}

void TieredKVCacheManager::forward_event(const KVEvent& event, const char* medium) noexcept {
  // Called from a pool's event delivery, once the call's state is complete: a copy that cannot
  // be made is dropped and counted (its sequence number skipped: a consumer sees the gap), never
  // thrown out of a call that can no longer be undone. The sink must not throw (noexcept).
  const std::uint64_t seq = next_event_seq_++;
  std::optional<KVEvent> e;
  try {
    e.emplace(KVEvent{seq, event.data});
    if (!sink_ && events_.size() == events_.capacity()) events_.reserve(2 * events_.size() + 8);
  } catch (const std::bad_alloc&) {
    ++stats_.events_dropped_no_memory;
    return;
  }
  if (auto* s = std::get_if<BlockStored>(&e->data)) s->medium = medium;
  if (auto* r = std::get_if<BlockRemoved>(&e->data)) r->medium = medium;
  if (sink_) {
    sink_(*e);
  } else {
    events_.push_back(std::move(*e));  // room reserved above
  }
}

std::vector<KVEvent> TieredKVCacheManager::take_events() {
  return std::exchange(events_, {});
}

void TieredKVCacheManager::set_event_sink(KVEventSink sink) {
  sink_ = std::move(sink);
}

TieredCacheHit TieredKVCacheManager::get_computed_blocks(const Request& request) {
  TieredCacheHit hit;
  // Validates the request. The GPU manager counts the lookup once the host's is done too (it
  // may throw: then nothing is counted anywhere).
  hit.gpu = manager_.find_computed_blocks(request);
  if (hybrid_) [[unlikely]] {
    hybrid_host_hit(request, hit);
    manager_.record_lookup(request, hit.gpu);
    ++stats_.requests;
    stats_.queried_tokens += request.num_tokens();
    stats_.gpu_hit_tokens += hit.gpu.num_tokens;
    stats_.host_hit_tokens += hit.num_host_tokens;
    return hit;
  }
  const auto count = [this, &request](const TieredCacheHit& found) noexcept {
    manager_.record_lookup(request, found.gpu);
    ++stats_.requests;
    stats_.queried_tokens += request.num_tokens();
    stats_.gpu_hit_tokens += found.gpu.num_tokens;
    stats_.host_hit_tokens += found.num_host_tokens;
  };
  if (request.skip_reading_prefix_cache || request.num_tokens() == 0) {
    count(hit);
    return hit;
  }
  const BlockSequence seq = request.hashed_tokens().sequence();
  const std::size_t max_blocks =
      std::min((request.num_tokens() - 1) / bs_, seq.block_hashes.size());
  hit.host_epoch = host_epoch_;
  const std::size_t begin = hit.gpu.blocks.size();
  // Found into a reused buffer, then copied to exact size: a miss allocates nothing.
  std::vector<BlockId>& found = found_slots_;
  found.clear();
  if (host_chain_) {  // one pool call for the run (it overlaps the map's misses)
    host_.match_cached_run_after(seq, begin, max_blocks, found);  // 0 if begin >= end
  } else {
    // Prefix identities: the identity before the run is the GPU hit's last block's (recorded
    // when it was cached: a verified hit holds exactly the request's prefix); each candidate slot
    // (tokens and extra keys verified by the host pool) must then carry the request's identity,
    // computed only for blocks a candidate is found for.
    constexpr std::size_t kAhead = 4;  // overlap the host map's cache misses
    if (begin < max_blocks) found.reserve(max_blocks - begin);
    BlockHash prev;
    bool have_prev = begin == 0;
    for (std::size_t i = begin; i < max_blocks; ++i) {
      if (i + kAhead < max_blocks) host_.prefetch_cached_block(seq.block_hashes[i + kAhead]);
      const BlockId slot = host_.match_cached_block_unanchored(seq, i);
      if (slot == BlockPool::kNoBlock) break;
      if (!have_prev) {
        const auto b = static_cast<std::size_t>(hit.gpu.blocks[begin - 1]);
        if (!gpu_hash_[b].empty()) {
          prev = gpu_identity_[b];
        } else {  // not recorded (cannot happen with verification on): from the content
          sequence_identities(seq, begin, identity_scratch_);
          prev = identity_scratch_.back();
        }
        have_prev = true;
      }
      BlockHash id = identity_after(i == 0 ? nullptr : &prev, seq, i, mm_scratch_);
      if (!same_hash(host_identity_[static_cast<std::size_t>(slot)], id)) break;
      found.push_back(slot);
      prev = id;
    }
  }
  hit.host_slots.assign(found.begin(), found.end());
  hit.num_host_tokens = hit.host_slots.size() * bs_;
  hit.host_check = hit_check(hit.host_slots, seq.block_hashes, begin, hit.host_epoch,
                             host_chain_ ? 0 : request.id());
  count(hit);  // only now: a lookup that threw counted nothing
  return hit;
}

std::uint64_t TieredKVCacheManager::hit_check(std::span<const BlockId> slots,
                                              std::span<const BlockHash> hashes, std::size_t begin,
                                              std::uint64_t epoch,
                                              std::uint64_t request_salt) const noexcept {
  // The blocks: the chained hash of the run's last block names the whole prefix up to it (the
  // tier takes SHA-256 chains only), so its 32 bytes and the run's place bind the hit to that
  // content. The slots: a sum of independent mixes of (two slots, their place), each a multiply
  // (a bijection), so no chain runs through the loop. The caller checked the bounds.
  // (With prefix identities the last block's hash names its prefix only up to collisions; a hit
  // is still bound to the request it was found for: request_salt is its id.)
  const auto mix = [](std::uint64_t v) {
    v *= kGolden;
    return v ^ (v >> 31);
  };
  std::uint64_t x = mix(check_seed_ ^ (epoch * kGolden) ^
                        (static_cast<std::uint64_t>(begin) << 32) ^ slots.size());
  x = mix(x ^ request_salt);
  if (!slots.empty()) {
    const BlockHash& last = hashes[begin + slots.size() - 1];
    const std::uint8_t* bytes = last.padded_bytes().data();
    for (std::size_t w = 0; w < BlockHash::kMaxSize / 8; ++w) {
      std::uint64_t word = 0;
      std::memcpy(&word, bytes + 8 * w, sizeof(word));
      x = mix(x ^ word);
    }
    x = mix(x ^ last.size());
  }
  std::uint64_t sum = 0;
  const std::size_t pairs = slots.size() / 2;
  for (std::size_t j = 0; j < pairs; ++j) {
    std::uint64_t two = 0;  // slots 2j and 2j + 1
    std::memcpy(&two, slots.data() + 2 * j, sizeof(two));
    sum += mix(two ^ (j * kGolden));
  }
  if (slots.size() % 2 != 0) {
    sum += mix((static_cast<std::uint64_t>(static_cast<std::uint32_t>(slots.back())) << 32) ^
               ~(pairs * kGolden));
  }
  return x ^ sum;
}

bool TieredKVCacheManager::has_unfinished_loads(RequestId id) const noexcept {
  const auto it = requests_.find(id);
  return it != requests_.end() && it->second.loading;
}

LoadResult TieredKVCacheManager::finish_loads(Request& request) {
  manager_.check_owner(request, "TieredKVCacheManager::finish_loads");
  const auto it = requests_.find(request.id());
  const auto who = [&request] {
    return "TieredKVCacheManager::finish_loads: request " + std::to_string(request.id());
  };
  if (it == requests_.end() || !it->second.loading) {
    throw Error(ErrorCode::kInvalidState, who() + " has no loads to finish");
  }
  RequestState& st = it->second;
  if (st.loads_in_flight > 0) {
    throw Error(ErrorCode::kInvalidState,
                who() + " has " + std::to_string(st.loads_in_flight) + " loads not committed");
  }
  if (hybrid_) return hybrid_finish_loads(request, st);
  LoadResult result;
  result.rolled_back = st.first_failed < st.num_loads;
  const std::size_t valid_blocks = st.hit_begin + st.first_failed;
  result.num_computed_tokens = valid_blocks * bs_;
  const std::size_t bound = 2 * (request.num_tokens() / bs_ + 2);
  reserve_transfers(bound);
  // record_new_blocks stores (write-through), into copies_.
  reserve_copies(0, host_config_.policy == HostPolicy::kWriteThrough ? bound : 0);
  const std::size_t cache_to = result.rolled_back ? result.num_computed_tokens : st.cache_upto;
  // record_new_blocks' records of the blocks cached below (building them allocates).
  prepare_records(request, st.scanned, cache_to / bs_, manager_.block_ids(request.id()));
  manager_.cache_blocks(request, cache_to);
  st.loading = false;
  if (result.rolled_back) {
    ++stats_.rollbacks;
    forget_loaded_slots(request, st, st.first_failed);
  }
  record_new_blocks(request, st, copies_);
  hand_over_copies(result.transfers);
  return result;
}

void TieredKVCacheManager::free(Request& request) {
  // Before the tier's own state: another tier's request may share an id with one of ours.
  manager_.check_owner(request, "TieredKVCacheManager::free");
  const auto it = requests_.find(request.id());
  if (it != requests_.end() && it->second.transfers_in_flight > 0) {
    throw Error(ErrorCode::kInvalidState,
                "TieredKVCacheManager::free: request " + std::to_string(request.id()) + " has " +
                    std::to_string(it->second.transfers_in_flight) + " transfers in flight");
  }
  // Blocks loaded but never cached (finish_loads not called) lose their noted slots (a hint:
  // forgetting it is always safe, even if the call below refuses).
  if (it != requests_.end() && it->second.loading) forget_loaded_slots(request, it->second, 0);
  // Hybrid, write-back: the window groups' last blocks, marked once the release succeeded.
  if (hybrid_ && it != requests_.end()) hybrid_mark_tail(request);
  manager_.free(request);
  if (hybrid_ && !slot_scratch_.empty()) {
    for (const BlockId b : slot_scratch_) gpu_tail_[static_cast<std::size_t>(b)] = 1;
    slot_scratch_.clear();
  }
  if (it != requests_.end()) release_state(it);
}

void TieredKVCacheManager::preempt(Request& request) {
  manager_.check_owner(request, "TieredKVCacheManager::preempt");
  const auto it = requests_.find(request.id());
  if (it != requests_.end() && it->second.transfers_in_flight > 0) {
    throw Error(ErrorCode::kInvalidState,
                "TieredKVCacheManager::preempt: request " + std::to_string(request.id()) + " has " +
                    std::to_string(it->second.transfers_in_flight) + " transfers in flight");
  }
  // Blocks loaded but never cached (finish_loads not called) lose their noted slots (a hint:
  // forgetting it is always safe, even if the call below refuses).
  if (it != requests_.end() && it->second.loading) forget_loaded_slots(request, it->second, 0);
  // Hybrid, write-back: the window groups' last blocks, marked once the release succeeded.
  if (hybrid_ && it != requests_.end()) hybrid_mark_tail(request);
  manager_.preempt(request);
  if (hybrid_ && !slot_scratch_.empty()) {
    for (const BlockId b : slot_scratch_) gpu_tail_[static_cast<std::size_t>(b)] = 1;
    slot_scratch_.clear();
  }
  if (it != requests_.end()) release_state(it);
}

bool TieredKVCacheManager::reset_prefix_cache() {
  if (num_live_ > 0 || num_host_pins_ > 0 || !manager_.reset_prefix_cache()) return false;
  if (!host_.reset_prefix_cache()) {
    throw Error(ErrorCode::kInvalidState,
                "TieredKVCacheManager: internal error: a host slot is pinned with nothing in "
                "flight (a bug in pagedkv)");
  }
  std::fill(gpu_hash_.begin(), gpu_hash_.end(), BlockHash());
  std::fill(gpu_identity_.begin(), gpu_identity_.end(), BlockHash());
  std::fill(gpu_hits_.begin(), gpu_hits_.end(), 0u);
  std::fill(gpu_host_slot_.begin(), gpu_host_slot_.end(), 0);
  std::fill(gpu_tail_.begin(), gpu_tail_.end(), std::uint8_t{0});
  std::fill(gpu_extra_.begin(), gpu_extra_.end(), nullptr);
  num_gpu_extra_ = 0;
  ++host_epoch_;  // every host slot lost its content
  host_cached_ever_ = host_.num_evictions();
  return true;
}

}  // namespace pagedkv
