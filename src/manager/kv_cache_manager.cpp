#include "pagedkv/manager/kv_cache_manager.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "../base/vector_growth.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/sliding_window.hpp"

namespace pagedkv {

namespace {

// xxh3_128 is not collision resistant: verification stays on with it, whether it comes from
// hash_scheme or from a hasher the caller built. Only a weak_for_testing hasher may run without
// (tests that want wrong hits).
BlockHasher make_hasher(const KVCacheManagerConfig& config) {
  const HashScheme scheme = config.hasher ? config.hasher->scheme() : config.hash_scheme;
  const bool weak = config.hasher && config.hasher->weak();
  if (scheme == HashScheme::kXxh3_128 && !weak && !config.verify_cache_hits) {
    throw Error(ErrorCode::kInvalidArgument,
                "KVCacheManager: xxh3_128 is not collision resistant, so verify_cache_hits "
                "cannot be turned off with it");
  }
  if (config.hasher) return *config.hasher;
  return config.hash_seed ? BlockHasher(config.hash_scheme, *config.hash_seed)
                          : BlockHasher(config.hash_scheme);
}

std::vector<AttentionSpec> group_specs(const KVCacheManagerConfig& config) {
  std::vector<AttentionSpec> specs = config.groups;
  if (specs.empty()) specs.push_back(AttentionSpec::full(config.block_size));
  return specs;
}

BlockPoolConfig pool_config(const KVCacheManagerConfig& config,
                            const KVCacheCoordinator& coordinator, const BlockHasher& hasher) {
  BlockPoolConfig p;
  p.num_blocks = config.num_blocks;
  p.block_size = coordinator.max_block_size();  // the pool stores tokens for the largest group
  p.enable_caching = config.enable_caching;
  p.verify_cache_hits = config.verify_cache_hits;
  p.enable_kv_events = config.enable_kv_events;
  p.eviction_policy = config.eviction_policy;
  p.lineage_key_depth = config.lineage_key_depth;
  p.lineage_adaptive_depth = config.lineage_adaptive_depth;
  p.adaptive_ghost_sample_shift = config.adaptive_ghost_sample_shift;
  p.max_retained_fraction = config.max_retained_fraction;
  p.retention_clock = config.retention_clock;
  p.chain_hashes_identify_prefix = hasher.collision_resistant();
  // xxh3_128 (full digests): guarded chain hashes, unless a group searches sliding-window runs
  // (they look up after unverified prefixes) or stores blocks shorter than the pool's (the guard
  // compares whole stored blocks): those keep content ids.
  bool all_full = true;
  for (const KVCacheGroup& g : coordinator.groups()) {
    all_full = all_full && g.spec.kind == AttentionKind::kFull && g.spec.block_size == p.block_size;
  }
  p.guard_chain_hashes = !p.chain_hashes_identify_prefix && !hasher.weak() && all_full;
  return p;
}

std::string request_text(const Request& r) {
  return "request " + std::to_string(r.id());
}

// ceil(a / b) without overflow.
std::size_t cdiv(std::size_t a, std::size_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

std::size_t saturating_add(std::size_t a, std::size_t b) {
  return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

}  // namespace

KVCacheManager::KVCacheManager(const KVCacheManagerConfig& config)
    : hasher_(make_hasher(config)),
      coordinator_(group_specs(config), hasher_.scheme()),
      pool_(pool_config(config, coordinator_, hasher_)),
      stats_(config.stats_window),
      max_model_len_(config.max_model_len),
      seen_bits_((static_cast<std::size_t>(pool_.num_blocks()) + 63) / 64, 0),
      retain_from_(coordinator_.num_groups(), 0),
      retain_new_from_(coordinator_.num_groups(), 0) {}

void KVCacheManager::prepare_retention(const Request& request, const char* what) {
  const std::optional<RetentionConfig>& config = request.retention();
  if (!config) return;
  bool raises = config->decode_retention_priority != kDefaultRetentionPriority;
  bool durations = config->decode_duration.has_value();
  for (const TokenRangeRetention& t : config->token_ranges) {
    raises = raises || t.priority != kDefaultRetentionPriority;
    durations = durations || t.duration.has_value();
  }
  if (durations && !pool_.config().retention_clock) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(what) + ": " + request_text(request) +
                    ": its retention config has a duration but the manager has no "
                    "retention_clock (KVCacheManagerConfig::retention_clock)");
  }
  // The pool's first non-default ask allocates its retention state (and may throw): done here,
  // on no block, before the caller changes anything.
  if (raises && !pool_.retention_active()) {
    pool_.set_retention(std::span<const BlockId>(), kMaxRetentionPriority);
  }
}

void KVCacheManager::apply_retention(const Request& request, const RequestBlocks& state,
                                     std::span<const std::size_t> from,
                                     std::span<const std::size_t> new_from) noexcept {
  const std::optional<RetentionConfig>& config = request.retention();
  if (!config) {
    // A request without a config asks the default for every block: it lifts the blocks it
    // hits that are below the default. Nothing to do unless this manager ever lowered one.
    if (!lowered_) return;
    for (std::size_t g = 0; g < num_groups(); ++g) {
      const std::vector<BlockId>& row = state.groups[g].blocks;
      const std::size_t end = new_from.empty() ? row.size() : std::min(new_from[g], row.size());
      if (from[g] < end) {
        // Ids in range (the manager's own table): cannot throw.
        pool_.raise_to_default(std::span<const BlockId>(row).subspan(from[g], end - from[g]));
      }
    }
    return;
  }
  const std::size_t prompt = request.num_prompt_tokens();
  for (std::size_t g = 0; g < num_groups(); ++g) {
    const std::size_t bs = groups()[g].spec.block_size;
    const std::vector<BlockId>& row = state.groups[g].blocks;
    // Positions from here on hold blocks this call allocated (none at a release).
    const std::size_t fresh = new_from.empty() ? row.size() : new_from[g];
    const auto at = [&](std::size_t i) {
      return retention_ask(*config, prompt, i * bs, (i + 1) * bs);
    };
    std::size_t i = from[g];
    RetentionAsk r = i < row.size() ? at(i) : RetentionAsk{};
    while (i < row.size()) {
      // A run of consecutive blocks with the same retention: one pool call (it skips the null
      // block).
      std::size_t j = i + 1;
      RetentionAsk next{};
      for (; j < row.size(); ++j) {
        next = at(j);
        if (!(next == r)) break;
      }
      const std::span<const BlockId> run = std::span<const BlockId>(row).subspan(i, j - i);
      // Validated (priority <= 100, duration > 0, a clock when there is a duration), ids in
      // range, and the pool keeps retention state (prepare_retention): nothing here throws.
      const RetentionTick duration = r.duration.value_or(kNoExpiry);
      if (r.priority > kDefaultRetentionPriority) {
        pool_.set_retention(run, r.priority, duration);
        // A block the pin budget kept where it was is still lifted to the default if below it.
        if (lowered_) pool_.raise_to_default(run);
      } else if (r.priority == kDefaultRetentionPriority) {
        // The pool treats an ask for the default as none: a shared block below it is lifted.
        if (lowered_) pool_.raise_to_default(run);
      } else {
        // Below the default: a block this call allocated takes it; another one (a hit, or any
        // block at a release) only while it is below the default already, so a block that a
        // request asked the default or more for (or whose low priority ran out) stays up.
        for (std::size_t k = i; k < j; ++k) {
          const BlockId b = row[k];
          if (b == kNullBlockId) continue;
          if (k < fresh && pool_.retention(b).priority >= kDefaultRetentionPriority) continue;
          pool_.set_retention(std::span<const BlockId>(&row[k], 1), r.priority, duration);
          lowered_ = true;
        }
      }
      i = j;
      r = next;
    }
  }
}

BlockId KVCacheManager::repeated_block(std::span<const BlockId> row) noexcept {
  BlockId repeated = BlockPool::kNoBlock;
  std::size_t marked = 0;
  for (; marked < row.size(); ++marked) {
    const BlockId b = row[marked];
    if (b == kNullBlockId) continue;
    const auto id = static_cast<std::size_t>(b);
    const std::uint64_t bit = std::uint64_t{1} << (id % 64);
    if ((seen_bits_[id / 64] & bit) != 0) {
      repeated = b;
      break;
    }
    seen_bits_[id / 64] |= bit;
  }
  for (std::size_t k = 0; k < marked; ++k) {
    const auto id = static_cast<std::size_t>(row[k]);
    seen_bits_[id / 64] &= ~(std::uint64_t{1} << (id % 64));
  }
  return repeated;
}

const AttentionSpec& KVCacheManager::group_spec(std::size_t g) const {
  if (g >= num_groups()) {
    throw Error(ErrorCode::kOutOfRange, "group_spec: group " + std::to_string(g) +
                                            " but the manager has " + std::to_string(num_groups()));
  }
  return groups()[g].spec;
}

Request KVCacheManager::make_request(RequestId id, std::span<const TokenId> prompt,
                                     RequestHashKeys keys) const {
  return Request(id, hasher_, block_size(), prompt, std::move(keys));
}

void KVCacheManager::check_identity(const Request& request, const char* what) const {
  const auto it = requests_.find(request.id());
  if (it != requests_.end() && it->second.identity != request.identity_) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(what) + ": " + request_text(request) +
                    " is live under another Request object (request ids must be unique among "
                    "live requests)");
  }
}

void KVCacheManager::throw_foreign(const Request& request, const char* what) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string(what) + ": " + request_text(request) +
                  " belongs to another manager (the one whose allocate_slots first took it; "
                  "give another manager a copy of the request)");
}

void KVCacheManager::check_hashing(const Request& request) const {
  const RequestBlockHasher& seq = request.hashed_tokens();
  if (seq.block_size() != block_size() || !(seq.hasher() == hasher_)) {
    throw Error(ErrorCode::kInvalidArgument,
                request_text(request) +
                    " is hashed with a different block size, scheme or seed than this manager "
                    "(create requests with KVCacheManager::make_request)");
  }
}

CacheHit KVCacheManager::get_computed_blocks(const Request& request) {
  CacheHit hit = find_computed_blocks(request);
  record_lookup(request, hit);
  return hit;
}

void KVCacheManager::record_lookup(const Request& request, const CacheHit& hit) noexcept {
  if (!pool_.config().enable_caching || request.skip_reading_prefix_cache) return;
  stats_.record(request.num_tokens(), hit.num_tokens);
}

CacheHit KVCacheManager::find_computed_blocks(const Request& request) {
  check_owner(request, "get_computed_blocks");
  if (request.is_finished()) {
    throw Error(ErrorCode::kInvalidState,
                "get_computed_blocks: " + request_text(request) + " was already freed");
  }
  check_hashing(request);
  check_identity(request, "get_computed_blocks");
  CacheHit hit;
  hit.other_groups.resize(num_groups() - 1);
  hit.lookup_evictions = pool_.num_evictions();
  if (!pool_.config().enable_caching || request.skip_reading_prefix_cache) return hit;

  // The last token is always recomputed: the model needs it to produce logits.
  std::size_t hit_tokens = request.num_tokens() == 0 ? 0 : request.num_tokens() - 1;
  // Found into reused rows, then copied to exact size: a miss allocates nothing.
  std::vector<std::vector<BlockId>>& per_group = hit_rows_;
  hit_tokens = coordinator_.find_longest_cache_hit(pool_, request.hashed_tokens().sequence(),
                                                   hit_tokens, per_group);
  // One physical block holds one position's KV, so a hit naming a block twice is wrong. Without
  // verification a hash collision between two of the request's own blocks yields one (verified
  // searches anchor every block to its own prefix and never do; SHA-256 chained hashes of two
  // positions never collide): no hit, then.
  if (!pool_.config().verify_cache_hits && !hasher_.collision_resistant()) {
    for (const std::vector<BlockId>& row : per_group) {
      if (repeated_block(row) != BlockPool::kNoBlock) {
        hit_tokens = 0;
        for (std::vector<BlockId>& r : per_group) r.clear();
        break;
      }
    }
  }
  hit.num_tokens = hit_tokens;
  hit.blocks.assign(per_group[0].begin(), per_group[0].end());
  for (std::size_t g = 1; g < num_groups(); ++g) {
    hit.other_groups[g - 1].assign(per_group[g].begin(), per_group[g].end());
  }
  return hit;
}

template <typename BlockAt>
void KVCacheManager::prepare_runs(const Request& request, std::size_t g, std::size_t first,
                                  std::size_t full, std::vector<BlockHash>& coarse,
                                  const BlockAt& block_at) {
  const KVCacheGroup& group = groups()[g];
  const BlockSequence seq = group_sequence(request, g, coarse);
  const auto cacheable = [&](std::size_t i) {
    return block_at(i) != kNullBlockId && coordinator_.block_can_hit(g, i);
  };
  // A full-attention group holds no null block and each of its blocks can be part of a hit: its
  // range is one run, found without a test per block.
  const bool one_run = group.spec.kind == AttentionKind::kFull;
  std::size_t i = first;
  while (i < full) {
    if (!one_run && !cacheable(i)) {
      ++i;
      continue;
    }
    std::size_t j = one_run ? full : i;
    while (j < full && cacheable(j)) ++j;
    // The blocks before the run, as they will be: usually just the cached parent; the whole
    // prefix when the parent is not cached (evicted or skipped), so the pool finds the nearest
    // cached ancestor.
    prefix_scratch_.clear();
    const BlockId parent = i > 0 ? block_at(i - 1) : BlockPool::kNoBlock;
    if (i > 0 && parent > 0 && pool_.block(parent).is_cached()) {
      prefix_scratch_.push_back(parent);
    } else {
      for (std::size_t k = 0; k < i; ++k) prefix_scratch_.push_back(block_at(k));
    }
    run_scratch_.push_back(PendingRun{g, i, j, {}});
    run_scratch_.back().store = pool_.prepare_store(seq, i, j, prefix_scratch_, group.id);
    i = j;
  }
}

std::optional<std::span<const BlockId>> KVCacheManager::allocate_slots(
    Request& request, std::size_t num_new_tokens, const CacheHit& hit,
    std::size_t num_lookahead_tokens, bool delay_cache_blocks) {
  // Error messages are built only when thrown: this runs for every request at every step.
  const auto where = [&request] { return "allocate_slots: " + request_text(request) + ": "; };
  check_owner(request, "allocate_slots");
  if (request.is_finished()) {
    throw Error(ErrorCode::kInvalidState, where() + "it was already freed");
  }
  if (num_new_tokens == 0) {
    throw Error(ErrorCode::kInvalidArgument, where() + "num_new_tokens must be greater than 0");
  }
  check_hashing(request);
  const auto it = requests_.find(request.id());
  const bool known = it != requests_.end();
  if (known && it->second.identity != request.identity_) check_identity(request, "allocate_slots");
  // The hit's blocks per group; a default CacheHit{} means no hit in any group.
  static const std::vector<BlockId> kNoBlocks;
  std::vector<const std::vector<BlockId>*>& hits = hit_scratch_;  // reused: no allocation
  hits.assign(num_groups(), &kNoBlocks);
  hits[0] = &hit.blocks;
  if (hit.other_groups.size() + 1 == num_groups()) {
    for (std::size_t g = 1; g < num_groups(); ++g) hits[g] = &hit.other_groups[g - 1];
  } else if (!hit.other_groups.empty() || (num_groups() > 1 && !hit.blocks.empty())) {
    throw Error(ErrorCode::kInvalidArgument,
                where() + "the hit has " + std::to_string(hit.other_groups.size() + 1) +
                    " groups, the manager " + std::to_string(num_groups()));
  }
  const bool has_hit =
      std::any_of(hits.begin(), hits.end(), [](const auto* v) { return !v->empty(); });
  if (has_hit && known) {
    throw Error(ErrorCode::kInvalidArgument,
                where() + "a cache hit can only be passed to the first allocation");
  }
  if (has_hit && request.num_computed_tokens() != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                where() + "a cache hit needs a request with no computed tokens");
  }
  // Coarse-group keys: a known request extends its own (derived data, safe to grow before the
  // capacity check); a new one fills these and hands them over below.
  std::vector<std::vector<BlockHash>>& fresh_coarse = coarse_scratch_;  // reused
  if (!known) {
    fresh_coarse.resize(num_groups());
    for (std::vector<BlockHash>& keys : fresh_coarse) keys.clear();
  }
  auto coarse = [&](std::size_t g) -> std::vector<BlockHash>& {
    return known ? it->second.groups[g].coarse_hashes : fresh_coarse[g];
  };
  for (std::size_t g = 0; g < num_groups(); ++g) {
    const std::vector<BlockId>& blocks = *hits[g];
    const std::size_t bs = groups()[g].spec.block_size;
    if (blocks.size() > request.num_tokens() / bs || hit.num_tokens != blocks.size() * bs) {
      throw Error(ErrorCode::kInvalidArgument,
                  where() + "the hit's num_tokens " + std::to_string(hit.num_tokens) +
                      " != group " + std::to_string(g) + "'s " + std::to_string(blocks.size()) +
                      " blocks x block size " + std::to_string(bs) +
                      " (or more blocks than the request has)");
    }
    if (blocks.empty()) continue;
    const BlockSequence seq = group_sequence(request, g, coarse(g));
    // A window group's hit holds the null block only where the window no longer looks.
    const std::size_t null_end =
        groups()[g].spec.kind == AttentionKind::kSlidingWindow
            ? static_cast<std::size_t>(groups()[g].spec.num_skipped_tokens(hit.num_tokens)) / bs
            : 0;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const KVCacheBlock& b = pool_.block(blocks[i]);  // throws when out of range
      if (b.is_null && i < null_end) continue;
      if (b.is_null && groups()[g].spec.kind == AttentionKind::kSlidingWindow) {
        throw Error(ErrorCode::kInvalidArgument,
                    where() + "the hit holds the null block at block " + std::to_string(i) +
                        " of group " + std::to_string(g) + ", inside its sliding window");
      }
      if (i >= seq.block_hashes.size() || b.block_hash != seq.block_hashes[i] ||
          b.group_id != groups()[g].id) {
        throw Error(ErrorCode::kInvalidArgument,
                    where() + "stale cache hit: block " + std::to_string(b.block_id) +
                        " no longer caches the request's block " + std::to_string(i) +
                        " of group " + std::to_string(g) +
                        " (call allocate_slots right after get_computed_blocks)");
      }
    }
    // Equal hashes at two positions (only after a hash collision; never with SHA-256 chained
    // hashes) would let one block serve both; the request could then never release it
    // (free_blocks refuses a repeated block).
    if (const BlockId twice =
            hasher_.collision_resistant() ? BlockPool::kNoBlock : repeated_block(blocks);
        twice != BlockPool::kNoBlock) {
      throw Error(ErrorCode::kInvalidArgument, where() + "the hit lists block " +
                                                   std::to_string(twice) + " twice in group " +
                                                   std::to_string(g));
    }
  }
  // A hash that can collide (xxh3_128, weak test hashers): equal hashes do not show that a hit
  // block still holds what the lookup verified once the pool has evicted anything since (the
  // block may have been evicted and cached again with other content under a colliding hash).
  // Then the lookup runs again and must find these very blocks. (SHA-256 chain hashes prove it;
  // an engine that allocates right after its lookup evicts nothing in between.)
  if (has_hit && !hasher_.collision_resistant() && hit.lookup_evictions != pool_.num_evictions()) {
    std::vector<std::vector<BlockId>>& again = hit_rows_;
    const std::size_t found = coordinator_.find_longest_cache_hit(
        pool_, request.hashed_tokens().sequence(), hit.num_tokens, again);
    for (std::size_t g = 0; g < num_groups(); ++g) {
      if (found == hit.num_tokens && again[g] == *hits[g]) continue;
      throw Error(ErrorCode::kInvalidArgument,
                  where() + "stale cache hit: the pool evicted blocks since the lookup and group " +
                      std::to_string(g) +
                      "'s hit blocks no longer hold the request's prefix (call allocate_slots "
                      "right after get_computed_blocks)");
    }
  }
  // Checked arithmetic on the caller's counts: a sum that would wrap is an error.
  const std::size_t num_computed = request.num_computed_tokens() + hit.num_tokens;
  if (num_computed > request.num_tokens() || num_new_tokens > request.num_tokens() - num_computed) {
    throw Error(ErrorCode::kOutOfRange, where() + std::to_string(num_computed) + " computed + " +
                                            std::to_string(num_new_tokens) +
                                            " new tokens exceed its " +
                                            std::to_string(request.num_tokens()) + " known tokens");
  }
  const std::size_t known_end = num_computed + num_new_tokens;  // <= num_tokens()
  if (num_lookahead_tokens > SIZE_MAX - known_end) {
    throw Error(ErrorCode::kOutOfRange, where() + std::to_string(num_lookahead_tokens) +
                                            " lookahead tokens after " + std::to_string(known_end) +
                                            " tokens overflow the slot count");
  }
  std::size_t need_slots = known_end + num_lookahead_tokens;
  if (max_model_len_) need_slots = std::min(need_slots, std::max(*max_model_len_, known_end));
  // Capacity: new blocks plus hits sitting in the free queue, against the free blocks plus those
  // that leaving the window releases.
  std::vector<std::size_t>& to_allocate = alloc_scratch_;
  to_allocate.assign(num_groups(), 0);
  std::vector<std::size_t>& skips = skip_scratch_;
  skips.assign(num_groups(), 0);
  std::size_t needed = 0, releasable = 0;
  for (std::size_t g = 0; g < num_groups(); ++g) {
    const std::vector<BlockId>& hb = *hits[g];
    const std::size_t held = known ? it->second.groups[g].blocks.size() : 0;
    const std::size_t required = cdiv(need_slots, groups()[g].spec.block_size);
    to_allocate[g] = required > held + hb.size() ? required - held - hb.size() : 0;
    needed = saturating_add(needed, to_allocate[g]);
    std::size_t free_hits = 0;  // (at most the pool's blocks)
    for (const BlockId b : hb)
      free_hits += (b != kNullBlockId && pool_.block(b).ref_cnt == 0) ? 1 : 0;
    needed = saturating_add(needed, free_hits);  // a saturated count must not wrap back
    if (known && groups()[g].spec.kind == AttentionKind::kSlidingWindow) {
      releasable += num_out_of_window_blocks(pool_, groups()[g].spec, it->second.groups[g].blocks,
                                             request.num_computed_tokens(),
                                             /*count_freeable=*/true);
      skips[g] = num_out_of_window_blocks(pool_, groups()[g].spec, it->second.groups[g].blocks,
                                          request.num_computed_tokens(), false);
    }
  }
  if (needed > static_cast<std::size_t>(pool_.num_free_blocks()) + releasable) return std::nullopt;

  // ---- Prepare: everything that may throw (allocation included), before any change ----
  // Events recorded below reach the sink only when this call has completed.
  BlockPool::EventDeliveryHold hold(pool_);
  const bool inserted = !known;
  RequestBlocks& state =
      known ? it->second : spare_requests_.insert_new(requests_, request.id())->second;
  struct Undo {  // if anything below throws: a new entry goes, prepared stores are released
    std::unordered_map<RequestId, RequestBlocks>& map;
    std::vector<PendingRun>& runs;
    RequestId id;
    bool active;
    ~Undo() {
      runs.clear();
      if (active) map.erase(id);
    }
  } undo{requests_, run_scratch_, request.id(), inserted};
  if (inserted) state.groups.resize(num_groups());
  // The caching plan (vLLM): tokens to cache rounded down to a multiple of the common block size
  // of all groups; each group caches its full blocks up to there, except null blocks and window
  // blocks that can never be part of a hit, in runs of consecutive blocks.
  std::size_t cache_tokens = known_end;
  if (num_groups() > 1) cache_tokens -= cache_tokens % coordinator_.alignment();
  std::vector<PendingRun>& runs = run_scratch_;  // empty: Undo clears it on every exit
  std::size_t max_skip = 0;
  for (std::size_t g = 0; g < num_groups(); ++g) {
    const KVCacheGroup& group = groups()[g];
    GroupBlocks& gs = state.groups[g];
    const std::vector<BlockId>& hb = *hits[g];
    const std::size_t old_size = gs.blocks.size();
    retain_from_[g] = old_size;  // sized at construction: no allocation
    retain_new_from_[g] = old_size + hb.size();
    detail::reserve_more(gs.blocks, hb.size() + to_allocate[g]);  // geometric: no copy per block
    max_skip = std::max(max_skip, skips[g]);
    if (!pool_.config().enable_caching || delay_cache_blocks) continue;
    const std::size_t skip_end =
        skips[g] == 0
            ? 0
            : std::min<std::size_t>(group.spec.num_skipped_tokens(request.num_computed_tokens()) /
                                        group.spec.block_size,
                                    old_size);
    // The block at position i once this call's changes are made (kNoBlock: a new block).
    const auto block_at = [&](std::size_t i) -> BlockId {
      if (i < old_size)
        return i + skips[g] >= skip_end && i < skip_end ? kNullBlockId : gs.blocks[i];
      if (i < old_size + hb.size()) return hb[i - old_size];
      return BlockPool::kNoBlock;
    };
    const std::size_t cached_before = has_hit ? hb.size() : gs.num_cached_blocks;
    const std::size_t full = cache_tokens / group.spec.block_size;
    if (full <= cached_before) continue;
    prepare_runs(request, g, cached_before, full, coarse(g), block_at);
  }
  if (max_skip > 0) free_scratch_.reserve(max_skip);
  {
    // Every group's allocation may evict: room for the events and, under guarded chain hashes,
    // the records evictions leave behind, before the commit (get_new_blocks reserves only its own
    // call's, after earlier groups have changed state).
    std::size_t total_allocations = 0;
    for (const std::size_t n : to_allocate) total_allocations += n;
    pool_.reserve_evictions(total_allocations, runs.size());
  }
  prepare_retention(request, "allocate_slots");  // last: nothing after it throws

  // ---- Commit: nothing below allocates or throws ----
  // Blocks that left a window go first (the later block first), in every group before any
  // allocation: the capacity check counted them, and they may be reused right away.
  for (std::size_t g = 0; g < num_groups(); ++g) {
    if (skips[g] == 0) continue;
    const KVCacheGroup& group = groups()[g];
    GroupBlocks& gs = state.groups[g];
    const std::size_t end = std::min<std::size_t>(
        group.spec.num_skipped_tokens(request.num_computed_tokens()) / group.spec.block_size,
        gs.blocks.size());
    free_scratch_.clear();
    for (std::size_t i = end; i-- > end - skips[g];) {
      free_scratch_.push_back(gs.blocks[i]);
      gs.blocks[i] = kNullBlockId;
    }
    pool_.free_blocks(free_scratch_);
    out_of_window_freed_ += skips[g];
  }
  // Every group takes its hits before any group allocates: a hit sitting in the free queue must
  // not be popped (and evicted) by another group's allocation.
  for (std::size_t g = 0; g < num_groups(); ++g) {
    GroupBlocks& gs = state.groups[g];
    if (!known) gs.coarse_hashes.swap(fresh_coarse[g]);  // the scratch keeps a cleared one
    if (!has_hit) continue;
    const std::vector<BlockId>& hb = *hits[g];
    pool_.touch(hb);
    gs.blocks.insert(gs.blocks.end(), hb.begin(), hb.end());
    gs.num_cached_blocks = hb.size();
  }
  std::size_t result_first = 0;
  for (std::size_t g = 0; g < num_groups(); ++g) {
    GroupBlocks& gs = state.groups[g];
    if (g == 0) result_first = gs.blocks.size();
    if (!pool_.get_new_blocks(static_cast<std::int32_t>(to_allocate[g]), gs.blocks)) {
      throw Error(ErrorCode::kInvalidState,
                  "allocate_slots: internal error: the capacity check passed but group " +
                      std::to_string(g) + " could not get its blocks (a bug in pagedkv)");
    }
  }
  for (PendingRun& run : runs) {
    GroupBlocks& gs = state.groups[run.group];
    pool_.commit_table_store(std::move(run.store), std::span<const BlockId>(gs.blocks).subspan(
                                                       run.first, run.last - run.first));
  }
  runs.clear();
  if (pool_.config().enable_caching && !delay_cache_blocks) {
    for (std::size_t g = 0; g < num_groups(); ++g) {
      const std::size_t full = cache_tokens / groups()[g].spec.block_size;
      GroupBlocks& gs = state.groups[g];
      gs.num_cached_blocks = std::max(gs.num_cached_blocks, full);
    }
  }
  // The hits (renewed) and the new blocks; a request without a config lifts its hits that are
  // below the default priority.
  apply_retention(request, state, retain_from_, retain_new_from_);
  state.identity = request.identity_;  // noexcept (shared_ptr copies)
  if (request.owner_ == nullptr) [[unlikely]]
    request.owner_ = token_;  // its first allocation
  undo.active = false;
  return std::span<const BlockId>(state.groups[0].blocks).subspan(result_first);
}

void KVCacheManager::cache_blocks(Request& request, std::size_t num_tokens,
                                  std::span<const std::size_t> first_to_cache) {
  const auto where = [&request] { return "cache_blocks: " + request_text(request) + ": "; };
  check_owner(request, "cache_blocks");
  if (request.is_finished()) {
    throw Error(ErrorCode::kInvalidState, where() + "it was already freed");
  }
  check_hashing(request);
  const auto it = requests_.find(request.id());
  if (it == requests_.end()) {
    throw Error(ErrorCode::kNotFound, where() + "it holds no blocks (unknown to this manager)");
  }
  if (it->second.identity != request.identity_) check_identity(request, "cache_blocks");
  if (num_tokens > request.num_tokens()) {
    throw Error(ErrorCode::kOutOfRange, where() + std::to_string(num_tokens) +
                                            " tokens exceed its " +
                                            std::to_string(request.num_tokens()) + " known tokens");
  }
  if (!first_to_cache.empty() && first_to_cache.size() != num_groups()) {
    throw Error(ErrorCode::kInvalidArgument,
                where() + "first_to_cache has " + std::to_string(first_to_cache.size()) +
                    " entries for " + std::to_string(num_groups()) + " groups");
  }
  RequestBlocks& state = it->second;
  for (std::size_t g = 0; g < num_groups(); ++g) {
    const std::size_t slots = state.groups[g].blocks.size() * groups()[g].spec.block_size;
    if (num_tokens > slots) {
      throw Error(ErrorCode::kOutOfRange, where() + std::to_string(num_tokens) +
                                              " tokens exceed group " + std::to_string(g) + "'s " +
                                              std::to_string(slots) + " allocated slots");
    }
  }
  if (!pool_.config().enable_caching) return;
  // As allocate_slots: rounded down to the common block size of all groups.
  std::size_t cache_tokens = num_tokens;
  if (num_groups() > 1) cache_tokens -= cache_tokens % coordinator_.alignment();

  // ---- Prepare (may throw; changes nothing but derived coarse keys) ----
  BlockPool::EventDeliveryHold hold(pool_);
  struct ClearRuns {
    std::vector<PendingRun>& runs;
    ~ClearRuns() { runs.clear(); }
  } clear_runs{run_scratch_};
  for (std::size_t g = 0; g < num_groups(); ++g) {
    GroupBlocks& gs = state.groups[g];
    const std::size_t full = cache_tokens / groups()[g].spec.block_size;
    const std::size_t from = std::max(
        gs.num_cached_blocks, first_to_cache.empty() ? 0 : std::min(first_to_cache[g], full));
    if (full <= from) continue;
    prepare_runs(request, g, from, full, gs.coarse_hashes,
                 [&gs](std::size_t i) { return gs.blocks[i]; });
  }
  if (pool_.config().enable_kv_events) pool_.reserve_events(0, run_scratch_.size());

  // ---- Commit (nothing below throws) ----
  for (PendingRun& run : run_scratch_) {
    GroupBlocks& gs = state.groups[run.group];
    pool_.commit_table_store(std::move(run.store), std::span<const BlockId>(gs.blocks).subspan(
                                                       run.first, run.last - run.first));
  }
  for (std::size_t g = 0; g < num_groups(); ++g) {
    GroupBlocks& gs = state.groups[g];
    gs.num_cached_blocks =
        std::max(gs.num_cached_blocks, cache_tokens / groups()[g].spec.block_size);
  }
}

bool KVCacheManager::release(Request& request, const char* what) {
  check_owner(request, what);
  if (request.is_finished()) {
    throw Error(ErrorCode::kInvalidState,
                std::string(what) + ": " + request_text(request) + " was already freed");
  }
  check_identity(request, what);
  const auto it = requests_.find(request.id());
  if (it == requests_.end()) return false;
  BlockPool::EventDeliveryHold hold(pool_);
  if (request.retention()) {  // the release is the blocks' last use: their durations restart
    prepare_retention(request, what);
    std::fill(retain_from_.begin(), retain_from_.end(), 0);
    apply_retention(request, it->second, retain_from_, {});
  }
  for (const GroupBlocks& gs : it->second.groups)
    pool_.release_table(gs.blocks);  // tail first; the tables are the manager's own
  spare_requests_.give(requests_, it, [](RequestBlocks& r) noexcept {
    r.identity.reset();
    bool keep = true;
    for (GroupBlocks& gs : r.groups) {
      keep = keep && gs.blocks.capacity() <= kSpareBlocks &&
             gs.coarse_hashes.capacity() <= kSpareBlocks;
      gs.blocks.clear();
      gs.num_cached_blocks = 0;
      gs.coarse_hashes.clear();
    }
    return keep;
  });
  return true;
}

void KVCacheManager::free(Request& request) {
  (void)release(request, "free");  // holding no blocks: nothing to release (an abort)
  request.finished_ = true;
}

void KVCacheManager::preempt(Request& request) {
  if (!release(request, "preempt")) {
    throw Error(ErrorCode::kNotFound,
                "preempt: " + request_text(request) + " holds no blocks (unknown to this manager)");
  }
  request.num_computed_tokens_ = 0;
}

std::span<const BlockId> KVCacheManager::block_ids(RequestId id, std::size_t group) const {
  const auto it = requests_.find(id);
  if (it == requests_.end()) {
    throw Error(ErrorCode::kNotFound, "block_ids: request " + std::to_string(id) + " is unknown");
  }
  if (group >= num_groups()) {
    throw Error(ErrorCode::kOutOfRange, "block_ids: group " + std::to_string(group) +
                                            " but the manager has " + std::to_string(num_groups()));
  }
  return it->second.groups[group].blocks;
}

std::size_t KVCacheManager::num_common_prefix_blocks(RequestId id) const {
  std::size_t n = 0;
  for (const BlockId b : block_ids(id)) {
    if (static_cast<std::size_t>(pool_.block(b).ref_cnt) != requests_.size()) break;
    ++n;
  }
  return n;
}

bool KVCacheManager::reset_prefix_cache() {
  if (!pool_.reset_prefix_cache()) return false;
  stats_.reset_window();  // cumulative totals stay monotonic, as in vLLM
  return true;
}

void KVCacheManager::check_invariants() const {
  pool_.check_invariants();
  std::vector<std::int32_t> holders(static_cast<std::size_t>(pool_.num_blocks()), 0);
  std::vector<int> holder_group(static_cast<std::size_t>(pool_.num_blocks()), -1);
  for (const auto& [id, state] : requests_) {
    if (state.groups.size() != num_groups()) {
      throw Error(ErrorCode::kInvalidState, "KVCacheManager invariant broken: request " +
                                                std::to_string(id) + " has the wrong group count");
    }
    for (std::size_t g = 0; g < num_groups(); ++g) {
      const GroupBlocks& gs = state.groups[g];
      if (gs.num_cached_blocks > gs.blocks.size()) {
        throw Error(ErrorCode::kInvalidState,
                    "KVCacheManager invariant broken: request " + std::to_string(id) + " has " +
                        std::to_string(gs.num_cached_blocks) + " cached but " +
                        std::to_string(gs.blocks.size()) + " held blocks in group " +
                        std::to_string(g));
      }
      for (const BlockId b : gs.blocks) {
        if (b == kNullBlockId) {
          if (groups()[g].spec.kind != AttentionKind::kSlidingWindow) {
            throw Error(ErrorCode::kInvalidState,
                        "KVCacheManager invariant broken: a full-attention table holds the null "
                        "block (request " +
                            std::to_string(id) + ")");
          }
          continue;
        }
        ++holders[static_cast<std::size_t>(b)];
        // A physical block serves one group at a time, and a cached one is keyed by that group.
        int& owner = holder_group[static_cast<std::size_t>(b)];
        const KVCacheBlock& blk = pool_.block(b);
        if ((owner != -1 && owner != static_cast<int>(g)) ||
            (blk.is_cached() && blk.group_id != groups()[g].id)) {
          throw Error(ErrorCode::kInvalidState,
                      "KVCacheManager invariant broken: block " + std::to_string(b) +
                          " is held in group " + std::to_string(g) + " but also in group " +
                          std::to_string(owner) + " or cached for group " +
                          std::to_string(blk.group_id));
        }
        owner = static_cast<int>(g);
      }
    }
  }
  for (BlockId b = 1; b < pool_.num_blocks(); ++b) {
    if (pool_.block(b).ref_cnt != holders[static_cast<std::size_t>(b)]) {
      throw Error(ErrorCode::kInvalidState,
                  "KVCacheManager invariant broken: block " + std::to_string(b) + " has ref " +
                      std::to_string(pool_.block(b).ref_cnt) + " but " +
                      std::to_string(holders[static_cast<std::size_t>(b)]) + " holders");
    }
  }
}

KVCacheManagerSnapshot KVCacheManager::snapshot() const {
  KVCacheManagerSnapshot s;
  s.pool = pool_.snapshot();
  for (const auto& [id, state] : requests_) {
    std::vector<std::vector<BlockId>> blocks;
    std::vector<std::size_t> cached;
    for (const GroupBlocks& gs : state.groups) {
      blocks.push_back(gs.blocks);
      cached.push_back(gs.num_cached_blocks);
    }
    s.request_blocks.emplace_back(id, std::move(blocks));
    s.num_cached_blocks.emplace_back(id, std::move(cached));
  }
  std::sort(s.request_blocks.begin(), s.request_blocks.end());
  std::sort(s.num_cached_blocks.begin(), s.num_cached_blocks.end());
  const PrefixCacheStats st = stats();
  s.stats_requests = st.requests;
  s.stats_queries = st.queries;
  s.stats_hits = st.hits;
  return s;
}

}  // namespace pagedkv
