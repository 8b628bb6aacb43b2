// pagedkv/sched/prefix_probe.hpp: how much of a waiting request's prompt is cached, read-only.
//
// A scheduler ranks its waiting queue by cached prefix every step, for hundreds of requests, and
// must not disturb the cache while it looks: get_computed_blocks() records prefix-cache stats
// (and is meant to be followed by allocate_slots()), so it is the wrong call here. The probe runs
// the same verified left-to-right search (full_attention.hpp's find_full_attention_hit over the
// manager's const block_pool()), then, for a tiered manager, the tier's const host_holds() for
// the blocks after the GPU run - exactly the hit get_computed_blocks() would return, capped at
// num_tokens - 1 tokens, without touching a block, the LRU order, the stats or the events. (One
// difference: with verification off and a hasher that is not collision resistant,
// get_computed_blocks drops a hit that names one block twice after a hash collision; the probe
// does not look for that.)
//
// Cost per request: O(cached prefix blocks + 1) hash-table lookups (each verified lookup also
// compares the block's block_size stored tokens), plus one host lookup per host block; no
// allocation once the scratch row has grown to the longest hit. Measured in bench/bench_sched.cpp.
//
// Scope: one full-attention KV-cache group (the tier's scope too). A hybrid (sliding-window)
// manager is refused at construction (pagedkv::Error kInvalidArgument): its hit is a fixed point
// over groups that this probe does not compute.
//
// Thread safety: probe() reads the manager only (const calls), and uses the probe's own scratch:
// one probe per thread, while no mutating call runs on the manager. The probe keeps a reference
// to the manager, which must outlive it. Errors: those of the const lookups (a request hashed
// differently from the manager: kInvalidArgument), thrown before anything is returned.
#pragma once

#include <cstddef>
#include <vector>

#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/manager/request.hpp"
#include "pagedkv/pool/block_pool.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv {

// What a waiting request would hit now.
struct CachedPrefix {
  std::size_t gpu_tokens = 0;   // leading tokens whose blocks the GPU pool holds (whole blocks)
  std::size_t host_tokens = 0;  // the host tier's run right after them (whole blocks)
  // GPU hit blocks held by no request (ref count 0, in the free queue): admitting the request
  // takes them out of the free count, as new blocks do (allocate_slots' capacity rule).
  std::size_t gpu_free_hit_blocks = 0;

  std::size_t tokens() const noexcept { return gpu_tokens + host_tokens; }
  bool operator==(const CachedPrefix&) const = default;
};

class PrefixProbe {
 public:
  // Errors: a hybrid manager (kInvalidArgument).
  explicit PrefixProbe(const KVCacheManager& gpu);
  explicit PrefixProbe(const TieredKVCacheManager& tier);

  // The request's cached prefix in the GPU pool (and the host tier). Caching off or
  // skip_reading_prefix_cache: nothing.
  CachedPrefix probe(const Request& request);

  std::uint32_t block_size() const noexcept { return block_size_; }

 private:
  const KVCacheManager& gpu_;
  const TieredKVCacheManager* tier_ = nullptr;  // null: GPU only
  std::uint32_t block_size_;
  std::vector<BlockId> hit_;          // the GPU hit's blocks; reused across probes
  BlockPool::LookupScratch scratch_;  // verified lookups of blocks with extra keys
};

}  // namespace pagedkv
