// pagedkv/tier/host_tier_config.hpp: how big a host-memory tier is, when blocks are copied into
// it, and what it reports. See tiered_kv_cache_manager.hpp for the protocol.
//
// Policies (the three in use in serving engines):
//   kWriteThrough           every block the GPU caches is stored (vLLM's CPU offloading, SGLang
//                           HiCache write_through): stores after the forward pass that wrote it;
//   kWriteThroughSelective  a GPU block is stored once it was hit `selective_hits` times (SGLang
//                           write_through_selective): saves host bandwidth for one-off prefixes;
//   kWriteBack              a block is stored when the GPU evicts it (TensorRT-LLM's secondary
//                           pool): the copy-out is ordered before the block's new owner writes it.
// Plain data; thread-compatible.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "pagedkv/pool/eviction_policy.hpp"
#include "pagedkv/pool/retention.hpp"

namespace pagedkv {

enum class HostPolicy : std::uint8_t { kWriteThrough, kWriteThroughSelective, kWriteBack };

// "write_through", "write_through_selective", "write_back".
std::string_view to_string(HostPolicy policy) noexcept;
// The inverse of to_string; std::nullopt for anything else.
std::optional<HostPolicy> parse_host_policy(std::string_view text) noexcept;

// Hybrid models: which blocks of a sliding-window KV-cache group the tier stores. A hit of L blocks
// needs only the window group's blocks [L - window_blocks, L), so a window block is only worth a
// host slot if some hit can end within window_blocks after it. Full-attention groups store every
// block as the policy says. Measured on the Mooncake conversation trace (docs/tiers.md): kAll
// keeps the hit rate; kRequestTail stores 70% fewer window blocks but loses hits that end where
// conversations branch (not at a request's end): 19.3% instead of 34.4%.
enum class WindowStoreRule : std::uint8_t {
  // Only the blocks within window_blocks of a request's end: write-through and selective store a
  // window block when it lies within the window of the request's tokens known then; write-back
  // stores an evicted window block only if it was within the window of the end of a request that
  // held it when that request was freed or preempted (where its next turn hits). Others are
  // counted in TierStats::window_stores_skipped.
  kRequestTail,
  kAll,  // every window block, as a full-attention block (the default)
};

struct HostTierConfig {
  // Host slots the engine gives the tier (its pinned buffer holds that many blocks); >= 1.
  std::int32_t num_host_blocks = 0;
  HostPolicy policy = HostPolicy::kWriteThrough;
  std::uint32_t selective_hits = 2;  // kWriteThroughSelective: hits before a block is stored; >= 1
  // Bytes one block moves (all layers, K and V); only for the byte counts in TierStats.
  std::uint64_t bytes_per_block = 0;
  // TensorRT-LLM's secondary_offload_min_priority: a GPU block whose retention priority
  // (BlockPool::retention) is below this is not stored in the host tier (counted in
  // TierStats::stores_skipped_priority). 0 (the default): every block, as before; <= 100.
  RetentionPriority secondary_offload_min_priority = 0;
  // The host pool's own eviction policy (BlockPoolConfig::eviction_policy); kLru: as before.
  EvictionPolicy eviction_policy = EvictionPolicy::kLru;
  // Hybrid models: the bytes one block of group g moves (its layers' K and V), for the byte
  // counts; empty: bytes_per_block for every group. Else one entry per group.
  std::vector<std::uint64_t> group_bytes_per_block;
  WindowStoreRule window_store = WindowStoreRule::kAll;

  // The slots a host buffer of `bytes` holds at `bytes_per_block` (0 when it holds none).
  static std::int32_t blocks_for_bytes(std::uint64_t bytes, std::uint64_t bytes_per_block);
};

// Cumulative since construction (reset_prefix_cache() keeps them). A block present in both tiers is
// one logical entry: a lookup counts it once, as a GPU hit.
struct TierStats {
  std::uint64_t requests = 0;         // get_computed_blocks() queries
  std::uint64_t queried_tokens = 0;   // their tokens
  std::uint64_t gpu_hit_tokens = 0;   // hit in GPU memory
  std::uint64_t host_hit_tokens = 0;  // hit in the host tier (to be loaded)
  std::uint64_t loaded_blocks = 0;    // loads committed done
  std::uint64_t load_failures = 0;    // loads committed failed
  std::uint64_t rollbacks = 0;        // finish_loads() that rolled a request back
  std::uint64_t stored_blocks = 0;    // stores and evictions committed done (cached in the host)
  std::uint64_t store_failures = 0;   // stores and evictions committed failed
  std::uint64_t stores_skipped_full = 0;  // no free host slot (every slot pinned): normal
  // GPU blocks not stored: their retention priority was below secondary_offload_min_priority.
  std::uint64_t stores_skipped_priority = 0;
  // Stores, evictions and fills dropped because an allocation failed (std::bad_alloc) once the
  // call that planned or committed them could no longer be undone: the block is simply not
  // cached in the host, as when it is full. KV events dropped the same way (their sequence
  // numbers are skipped, so a consumer sees the gap).
  std::uint64_t stores_skipped_no_memory = 0;
  std::uint64_t events_dropped_no_memory = 0;
  std::uint64_t loaded_bytes = 0;        // loaded_blocks x bytes_per_block
  std::uint64_t stored_bytes = 0;        // stored_blocks x bytes_per_block
  std::uint64_t host_evictions = 0;      // host entries evicted (LRU) for newer ones
  std::int32_t host_slots = 0;           // the configured host blocks
  std::int32_t host_slots_pinned = 0;    // slots with transfers in flight (loading or storing)
  std::int32_t host_slots_storing = 0;   // of those, slots being written (not hit-able yet)
  std::uint64_t host_cached_blocks = 0;  // slots holding a hit-able block
  // Hybrid models: window-group blocks not stored by WindowStoreRule::kRequestTail.
  std::uint64_t window_stores_skipped = 0;

  double hit_rate() const noexcept {
    return queried_tokens == 0 ? 0.0
                               : static_cast<double>(gpu_hit_tokens + host_hit_tokens) /
                                     static_cast<double>(queried_tokens);
  }
  // Slots holding or receiving a block, over all of them.
  double host_usage() const noexcept {
    return host_slots == 0 ? 0.0
                           : static_cast<double>(host_cached_blocks +
                                                 static_cast<std::uint64_t>(host_slots_storing)) /
                                 host_slots;
  }
};

// One KV-cache group's share of the copies (TieredKVCacheManager::group_stats()).
struct TierGroupStats {
  std::uint64_t loaded_blocks = 0, loaded_bytes = 0;  // loads committed done
  std::uint64_t stored_blocks = 0, stored_bytes = 0;  // stores and evictions cached in the host
  std::uint64_t window_stores_skipped = 0;            // WindowStoreRule::kRequestTail's skips
};

}  // namespace pagedkv
