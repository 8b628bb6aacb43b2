// tiny_engine/kv_driver.hpp: the engine's side of pagedkv's cache managers (internal to the tiny
// engine). Without a host tier it forwards to a KVCacheManager; with one (EngineConfig::
// num_host_blocks > 0, CPU path) it drives a TieredKVCacheManager the way an engine does:
//   admit()           get_computed_blocks (GPU prefix, then the host run), allocate_slots, then
//                     the plan's kBeforeForward stage (write-back evictions, loads) executed at
//                     once with pagedkv's CPU reference executor between the engine's KV planes
//                     and an engine-owned host buffer, every copy committed, finish_loads();
//   allocate_slots()  a running request's next tokens; evictions executed and committed at once;
//   after_forward()   the step's kAfterForward stores (write-through), executed and committed.
// The host buffer holds num_host_blocks + 1 slots (slot 0 is the host pool's null block) of one
// block's K and V for every layer, so a load really moves the K/V bytes through host memory.
// The engine's KV storage is one buffer of 2 x num_layers planes (K0, V0, K1, V1, ...), which is
// TransferLayout's layer-first device layout with 2 x num_layers chunks per block.
// Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "pagedkv/base/transfer_plan.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace tiny_engine {

struct KVCache;

// Called before a plan with loads is executed: tests corrupt one host byte of a loaded slot and
// check that the logits change (the loaded K/V really comes from the host buffer).
using HostLoadHook =
    std::function<void(const pagedkv::TransferPlan& plan, std::span<std::byte> host,
                       const pagedkv::TransferLayout& layout)>;

struct Admission {
  pagedkv::CacheHit gpu_hit;    // the GPU part of the hit
  std::size_t hit_tokens = 0;   // GPU + host tokens whose K/V is in place (computed)
  std::size_t host_tokens = 0;  // of those, loaded from the host tier
  std::size_t new_tokens = 0;   // tokens to compute in this step
};

class KVDriver {
 public:
  // num_host_blocks 0: a plain KVCacheManager. Otherwise `cache` must be the CPU path's KV.
  KVDriver(const pagedkv::KVCacheManagerConfig& config, std::int32_t num_host_blocks,
           pagedkv::HostPolicy policy, KVCache& cache, HostLoadHook hook);
  ~KVDriver();
  KVDriver(const KVDriver&) = delete;
  KVDriver& operator=(const KVDriver&) = delete;

  pagedkv::Request make_request(pagedkv::RequestId id,
                                std::span<const pagedkv::TokenId> prompt) const {
    return gpu().make_request(id, prompt);
  }
  // Admits a waiting request with at most `budget` new tokens: std::nullopt when its blocks do
  // not fit (nothing changed). Sets the request's computed tokens to the hit.
  std::optional<Admission> admit(pagedkv::Request& request, std::size_t budget);
  bool allocate_slots(pagedkv::Request& request, std::size_t num_new_tokens);
  void after_forward();  // runs and commits the stores planned in this step
  void preempt(pagedkv::Request& request);
  void free(pagedkv::Request& request);

  const pagedkv::KVCacheManager& gpu() const noexcept;
  // The host tier, its buffer and one slot's bytes, for the remote tier (remote_link.hpp);
  // nullptr / empty / 0 without a host tier.
  pagedkv::TieredKVCacheManager* tier() noexcept { return tier_.get(); }
  std::span<std::byte> host_buffer() noexcept { return host_; }
  std::uint64_t host_block_bytes() const noexcept { return tier_ ? layout_.block_bytes() : 0; }
  std::optional<pagedkv::TierStats> tier_stats() const;
  // The KV events since the last call (both tiers', with their medium), when events are enabled.
  std::vector<pagedkv::KVEvent> take_events();
  void check_invariants() const;

 private:
  void run_before(pagedkv::TierPlan& t);

  std::unique_ptr<pagedkv::KVCacheManager> plain_;
  std::unique_ptr<pagedkv::TieredKVCacheManager> tier_;
  KVCache& cache_;
  HostLoadHook hook_;
  pagedkv::TransferLayout layout_;
  std::vector<std::byte> host_;
  std::size_t num_host_slots_ = 0;
  std::vector<pagedkv::TierPlan> after_;  // plans whose stores run after this step's forward
};

}  // namespace tiny_engine
