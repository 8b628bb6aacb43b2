// src/tier/tiered_kv_cache_manager_internal.hpp: what the tier's source files share, nothing else.
//
// TieredKVCacheManager's implementation is split by concept: tiered_kv_cache_manager.cpp
// (construction, events, lookup, finishing loads, free and preempt), tier_transfer_plans.cpp (host
// slots, stores, evictions and loads planned by allocate_slots), tier_commits.cpp (the engine's
// commits of finished transfers), tier_fills.cpp (fills from a store below: the remote tier's
// interface), tier_check.cpp (stats, invariants, snapshots); host_tier_config.cpp holds the
// configuration's helpers. This header holds what several of them inline: the owned extra-key
// source, small helpers (internal linkage, as when they sat in one file) and the inline members
// used by more than one file. Not installed; included only from src/tier/.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "pagedkv/base/error.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv {

// The extra keys of one block, answered from an owned copy (the request may be gone).
class TieredKVCacheManager::ContentSource final : public BlockExtraKeySource {
 public:
  ContentSource(const OwnedExtraKeys* keys, std::size_t index) : keys_(keys), index_(index) {}
  bool has_extra_keys(std::size_t i) const noexcept override {
    return keys_ != nullptr && i == index_;
  }
  BlockExtraKeys block_extra_keys(std::size_t i, std::uint32_t,
                                  std::vector<MultiModalKey>& scratch) const override {
    BlockExtraKeys e;
    if (keys_ == nullptr || i != index_) return e;
    if (keys_->lora_name) e.lora_name = *keys_->lora_name;
    scratch.clear();
    for (const auto& [identifier, offset] : keys_->mm_items)
      scratch.push_back({identifier, offset});
    e.mm_items = scratch;
    if (keys_->cache_salt) e.cache_salt = *keys_->cache_salt;
    return e;
  }
  std::optional<std::string_view> lora_name() const noexcept override {
    if (keys_ == nullptr || !keys_->lora_name) return std::nullopt;
    return std::string_view(*keys_->lora_name);
  }

 private:
  const OwnedExtraKeys* keys_;
  std::size_t index_;
};

namespace {

[[maybe_unused]] KVCacheManagerConfig checked_gpu_config(const KVCacheManagerConfig& gpu,
                                                         const HostTierConfig& host) {
  const auto bad = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, "TieredKVCacheManager: " + what);
  };
  if (!host.group_bytes_per_block.empty() &&
      host.group_bytes_per_block.size() != std::max<std::size_t>(1, gpu.groups.size())) {
    bad("group_bytes_per_block has " + std::to_string(host.group_bytes_per_block.size()) +
        " entries for " + std::to_string(std::max<std::size_t>(1, gpu.groups.size())) +
        " KV-cache groups");
  }
  if (!gpu.enable_caching) bad("the host tier needs prefix caching on");
  if (host.num_host_blocks < 1 || host.num_host_blocks > 0x7ffffffe) {
    bad("num_host_blocks must be in [1, 2^31 - 2], got " + std::to_string(host.num_host_blocks));
  }
  if (host.policy == HostPolicy::kWriteThroughSelective && host.selective_hits == 0) {
    bad("selective_hits must be at least 1");
  }
  if (host.secondary_offload_min_priority > kMaxRetentionPriority) {
    bad("secondary_offload_min_priority " +
        std::to_string(unsigned{host.secondary_offload_min_priority}) + " is above 100");
  }
  return gpu;
}

// The GPU manager's KV-cache groups (the tier's copy of its coordinator keys coarser groups).
[[maybe_unused]] std::vector<AttentionSpec> manager_specs(const KVCacheManager& manager) {
  std::vector<AttentionSpec> specs;
  for (std::size_t g = 0; g < manager.num_groups(); ++g) specs.push_back(manager.group_spec(g));
  return specs;
}

[[maybe_unused]] BlockPoolConfig host_pool_config(const KVCacheManagerConfig& gpu,
                                                  const HostTierConfig& host,
                                                  const BlockPoolConfig& gpu_pool) {
  BlockPoolConfig c;
  c.num_blocks = host.num_host_blocks + 1;  // slot 0 is the pool's null block, never used
  c.block_size = gpu_pool.block_size;
  c.enable_caching = true;
  c.verify_cache_hits = true;
  c.enable_kv_events = gpu.enable_kv_events;
  // The host pool stores each slot's parent hash and tokens and keeps no table of hash-consed
  // content ids. With a collision-resistant hasher (as the GPU pool: gpu_pool's
  // chain_hashes_identify_prefix) a stored parent hash identifies the prefix and the pool checks
  // it (match_cached_block_after). Otherwise the tier never asks the pool for a parent check: it
  // looks up by tokens and extra keys (match_cached_block_unanchored) and compares the slot's
  // prefix identity itself, so the pool's parent hashes are only the remote values' binding.
  (void)gpu_pool;
  c.chain_hashes_identify_prefix = true;
  c.eviction_policy = host.eviction_policy;
  return c;
}

constexpr std::uint32_t kIndexMask = 0xffffffffu;
// 2^64 / golden ratio, odd: a multiply by it is a bijection that spreads the low bits upward.
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;
// Blocks ahead whose host map slot a loop of verified host lookups starts loading.
constexpr std::size_t kHostAhead = 4;

// BlockHash equality inline (operator== calls memcmp with a run-time size); a hash is 0, 16 or
// 32 bytes.
inline bool same_hash(const BlockHash& a, const BlockHash& b) noexcept {
  const std::size_t n = a.size();
  if (n != b.size()) return false;
  const std::uint8_t* x = a.bytes().data();
  const std::uint8_t* y = b.bytes().data();
#if defined(__SSE2__)
  if (n == 32) {
    const auto load = [](const std::uint8_t* p) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    };
    const __m128i eq =
        _mm_and_si128(_mm_cmpeq_epi8(load(x), load(y)), _mm_cmpeq_epi8(load(x + 16), load(y + 16)));
    return _mm_movemask_epi8(eq) == 0xffff;
  }
#endif
  if (n == 32) return std::memcmp(x, y, 32) == 0;
  if (n == 16) return std::memcmp(x, y, 16) == 0;
  return std::memcmp(x, y, n) == 0;
}

// Copies one block's tokens: a constant-size copy for the usual 16-token block (a run-time size
// calls memcpy).
inline void copy_block_tokens(TokenId* to, const TokenId* from, std::uint32_t bs) noexcept {
  if (bs == 16) {
    std::memcpy(to, from, 16 * sizeof(TokenId));
  } else {
    std::memcpy(to, from, bs * sizeof(TokenId));
  }
}

// v.reserve(n) without the call when v has the room (the usual case: the tier's buffers are
// reserved on every allocation and rarely grow). The growth stays out of line: inlined into
// allocate_slots it cost its hot loops registers (3 ns per block at 64-block requests).
template <typename Vector>
[[gnu::noinline]] void grow_room(Vector& v, std::size_t n) {
  v.reserve(n);
}
template <typename Vector>
inline void reserve_room(Vector& v, std::size_t n) {
  if (v.capacity() < n) [[unlikely]]
    grow_room(v, n);
}

// An owned copy of seq's block `index` extra keys (it outlives the request); nullopt when the
// block has none.
[[maybe_unused]] std::optional<OwnedExtraKeys> owned_extra_keys(
    const BlockSequence& seq, std::size_t index, std::vector<MultiModalKey>& scratch) {
  if (!seq.has_extra_keys(index)) return std::nullopt;
  const BlockExtraKeys extra = seq.block_extra_keys(index, scratch);
  if (extra.empty()) return std::nullopt;
  OwnedExtraKeys owned;
  if (extra.lora_name) owned.lora_name = std::string(*extra.lora_name);
  for (const MultiModalKey& mm : extra.mm_items) {
    owned.mm_items.emplace_back(std::string(mm.identifier), mm.offset);
  }
  if (extra.cache_salt) owned.cache_salt = std::string(*extra.cache_salt);
  return owned;
}

// Whether `owned` holds exactly the keys `extra`.
[[maybe_unused]] bool same_extra_keys(const OwnedExtraKeys& owned, const BlockExtraKeys& extra) {
  const auto same = [](const std::optional<std::string>& a,
                       const std::optional<std::string_view>& b) {
    return a.has_value() == b.has_value() && (!a || std::string_view(*a) == *b);
  };
  if (!same(owned.lora_name, extra.lora_name) || !same(owned.cache_salt, extra.cache_salt) ||
      owned.mm_items.size() != extra.mm_items.size()) {
    return false;
  }
  for (std::size_t i = 0; i < extra.mm_items.size(); ++i) {
    if (owned.mm_items[i].first != extra.mm_items[i].identifier ||
        owned.mm_items[i].second != extra.mm_items[i].offset) {
      return false;
    }
  }
  return true;
}

// owned_extra_keys() as one shared copy; `previous` is handed back when it holds the same keys
// (a run of blocks of one LoRA adapter shares one copy).
[[maybe_unused]] std::shared_ptr<const OwnedExtraKeys> shared_extra_keys(
    const BlockSequence& seq, std::size_t index, std::vector<MultiModalKey>& scratch,
    const std::shared_ptr<const OwnedExtraKeys>& previous = nullptr) {
  if (!seq.has_extra_keys(index)) return nullptr;
  const BlockExtraKeys extra = seq.block_extra_keys(index, scratch);
  if (extra.empty()) return nullptr;
  if (previous != nullptr && same_extra_keys(*previous, extra)) return previous;
  auto owned = std::make_shared<OwnedExtraKeys>();
  if (extra.lora_name) owned->lora_name = std::string(*extra.lora_name);
  for (const MultiModalKey& mm : extra.mm_items) {
    owned->mm_items.emplace_back(std::string(mm.identifier), mm.offset);
  }
  if (extra.cache_salt) owned->cache_salt = std::string(*extra.cache_salt);
  return owned;
}

// out = the extra keys of seq's blocks from .. to - 1 (reserved first), equal neighbours sharing
// one copy.
[[maybe_unused]] void shared_extra_keys_of(const BlockSequence& seq, std::size_t from,
                                           std::size_t to,
                                           std::vector<std::shared_ptr<const OwnedExtraKeys>>& out,
                                           std::vector<MultiModalKey>& scratch) {
  out.clear();
  if (to <= from) return;
  out.reserve(to - from);
  std::shared_ptr<const OwnedExtraKeys> previous;
  for (std::size_t i = from; i < to; ++i) {
    std::shared_ptr<const OwnedExtraKeys> keys = shared_extra_keys(seq, i, scratch, previous);
    if (keys != nullptr) previous = keys;
    out.push_back(std::move(keys));
  }
}

}  // namespace

inline void TieredKVCacheManager::set_gpu_extra(BlockId b, SharedExtraKeys keys) noexcept {
  SharedExtraKeys& slot = gpu_extra_[static_cast<std::size_t>(b)];
  num_gpu_extra_ +=
      static_cast<std::size_t>(keys != nullptr) - static_cast<std::size_t>(slot != nullptr);
  slot = std::move(keys);
}

inline BlockId TieredKVCacheManager::host_match(const BlockSequence& seq, std::size_t index,
                                                const BlockHash* identity, GroupId group) const {
  // docs/hashing.md: the parent hash stored with the block must equal the request's.
  if (host_chain_) return host_.match_cached_block_after(seq, index, group);
  // Prefix identities: the slot's must be the request's (a chained hash proves nothing here).
  if (identity == nullptr) return BlockPool::kNoBlock;  // (callers always give one)
  const BlockId slot = host_.match_cached_block_unanchored(seq, index, group);
  if (slot == BlockPool::kNoBlock) return slot;
  return same_hash(host_identity_[static_cast<std::size_t>(slot)], *identity) ? slot
                                                                              : BlockPool::kNoBlock;
}

inline std::uint32_t TieredKVCacheManager::take_transfer() {
  if (free_transfers_.empty()) return grow_transfers();
  const std::uint32_t idx = free_transfers_.back();
  free_transfers_.pop_back();
  return idx;
}

inline TransferId TieredKVCacheManager::open_transfer(Kind kind, RequestState* state, BlockId gpu,
                                                      BlockId host, std::uint32_t chain_index) {
  const std::uint32_t idx = take_transfer();
  Transfer& t = transfers_[idx];
  t.state = state;
  t.live = true;
  t.kind = kind;
  t.gpu = gpu;
  t.host = host;
  t.chain_index = chain_index;
  t.group = 0;
  ++num_live_;
  if (state != nullptr) {  // a fill belongs to no request's allocation
    ++state->transfers_in_flight;
    if (kind == Kind::kLoad) ++state->loads_in_flight;
  }
  return (static_cast<TransferId>(t.generation) << 32) | idx;
}

inline bool TieredKVCacheManager::remembered_valid(std::size_t b) const noexcept {
  const BlockId known = gpu_host_slot_[b];
  return known != 0 && host_slot_epoch_[static_cast<std::size_t>(known)] == gpu_host_epoch_[b] &&
         host_.block(known).is_cached();
}

}  // namespace pagedkv
