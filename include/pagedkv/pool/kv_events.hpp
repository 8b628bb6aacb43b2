// pagedkv/pool/kv_events.hpp: what the cache tells the outside world (routers, KV stores).
//
// The pool emits one event per change to the set of cached blocks, each with a sequence number
// that starts at 0 and increases by exactly 1 per event (gap-free), in the order of the changes:
//   BlockStored       one per cache_full_blocks() call that caches at least one block;
//   BlockRemoved      one per cached block evicted (reallocated, evict_blocks());
//   AllBlocksCleared  one per successful reset_prefix_cache().
// Events carry full digests; BlockHash::event_id() gives vLLM's 64-bit form.
// BlockStored and BlockRemoved name the medium holding the block ("GPU" for a device pool, "CPU"
// for a host tier: pagedkv::TieredKVCacheManager sets it), so a router sees every tier.
// Events are produced only when enabled in the pool's configuration. They are recorded as the
// state changes and delivered only once the call that made them has completed (a KV-cache
// manager holds delivery until its own whole call has completed): to a sink callback if one is
// set, or else buffered until take_events(). A call that fails (pagedkv::Error or bad_alloc)
// changed nothing and delivers nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "pagedkv/hash/block_hash.hpp"
#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/pool/kv_cache_block.hpp"

namespace pagedkv {

// One block's extra keys, owned (BlockExtraKeys holds views).
struct OwnedExtraKeys {
  std::optional<std::string> lora_name;
  std::vector<std::pair<std::string, std::int64_t>> mm_items;  // (identifier, offset in block)
  std::optional<std::string> cache_salt;

  bool operator==(const OwnedExtraKeys&) const = default;
};

struct BlockStored {
  std::vector<BlockHash> block_hashes;         // the newly cached blocks, in chain order
  std::optional<BlockHash> parent_block_hash;  // hash of the block before the first; none at 0
  std::vector<TokenId> token_ids;              // block_size tokens per cached block
  std::uint32_t block_size = 0;
  std::optional<std::string> lora_name;
  std::vector<OwnedExtraKeys> extra_keys;  // one per cached block
  GroupId group_id = 0;
  std::string medium = "GPU";  // vLLM's field: "GPU", or "CPU" for a host tier's blocks

  bool operator==(const BlockStored&) const = default;
};

struct BlockRemoved {
  std::vector<BlockHash> block_hashes;
  GroupId group_id = 0;
  std::string medium = "GPU";  // as BlockStored::medium

  bool operator==(const BlockRemoved&) const = default;
};

struct AllBlocksCleared {
  bool operator==(const AllBlocksCleared&) const = default;
};

struct KVEvent {
  using Data = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;
  std::uint64_t seq = 0;  // 0, 1, 2, ... with no gaps
  Data data;

  bool operator==(const KVEvent&) const = default;
};

// Called synchronously, on the thread mutating the pool, once per event, in sequence order, after
// the call that made the events has completed: the pool (and its manager) are consistent, and
// the sink may call their const queries but never their mutating calls. The sink must not throw
// (catch inside it, e.g. a full queue is a counted loss): delivery is noexcept, so an exception
// escaping the sink calls std::terminate.
using KVEventSink = std::function<void(const KVEvent&)>;

}  // namespace pagedkv
