#include "pagedkv/tier/remote_tier.hpp"

#include <algorithm>
#include <numeric>
#include <string>
#include <thread>
#include <utility>

#include "../base/map_growth.hpp"
#include "../base/vector_growth.hpp"
#include "pagedkv/base/error.hpp"
#include "tiered_kv_cache_manager_internal.hpp"  // host_match (RemoteTier is a friend)

namespace pagedkv {
namespace {

// The KV-cache group of a one-group tier's blocks.
constexpr GroupId kGroup = 0;
// group_key's first token ("GRUP"): with the group and block_size - 1 zeros after it, a
// pseudo-block one token longer than any real block.
constexpr TokenId kGroupKeyTag = 0x47525550;

}  // namespace

RemoteTier::RemoteTier(TieredKVCacheManager& tier, RemoteStore& store,
                       std::span<std::byte> host_buffer, RemoteTierConfig config)
    : tier_(tier), store_(store), host_(host_buffer), config_(config) {
  const std::size_t ng = tier_.gpu().num_groups();
  const std::uint32_t bs = tier_.block_size();
  std::uint32_t max_bs = bs;
  align_ = 1;
  for (std::size_t g = 0; g < ng; ++g) {
    const AttentionSpec& spec = tier_.gpu().group_spec(g);
    if (spec.block_size == 0 || spec.block_size % bs != 0) {  // (the GPU manager refuses these)
      throw Error(ErrorCode::kInvalidArgument,
                  "RemoteTier: group " + std::to_string(g) + " has block size " +
                      std::to_string(spec.block_size) + ", not a multiple of the tier's " +
                      std::to_string(bs));
    }
    window_.push_back(spec.kind == AttentionKind::kSlidingWindow ? spec.window_blocks()
                                                                 : kFullGroup);
    group_bs_.push_back(spec.block_size);
    factor_.push_back(spec.block_size / bs);
    align_ = std::lcm(align_, factor_.back());
    max_bs = std::max(max_bs, spec.block_size);
  }
  hybrid_ = ng > 1 || window_[0] != kFullGroup;
  group_stats_.assign(ng, RemoteTierGroupStats{});
  coarse_.resize(ng);
  views_.resize(ng);
  key_offset_.resize(ng + 1);
  // One token longer than the largest group's block: a length no real block of any group has.
  key_tokens_.assign(static_cast<std::size_t>(max_bs) + 1, 0);
  key_tokens_[0] = kGroupKeyTag;
  if (config_.bytes_per_block == 0) {
    throw Error(ErrorCode::kInvalidArgument, "RemoteTier: bytes_per_block must be > 0");
  }
  // now + timeout (a request's deadline) and now + drain_timeout must not overflow the clock.
  for (const auto& [value, name] :
       {std::pair{config_.timeout, "timeout"}, std::pair{config_.drain_timeout, "drain_timeout"}}) {
    if (value.count() < 0 || value > kMaxRemoteTimeout) {
      throw Error(ErrorCode::kInvalidArgument, std::string("RemoteTier: ") + name + " of " +
                                                   std::to_string(value.count()) +
                                                   " ms must be in [0, 1 day]");
    }
  }
  const auto slots = static_cast<std::size_t>(tier_.host_pool().num_blocks());  // incl. slot 0
  if (host_.size() / config_.bytes_per_block < slots) {
    throw Error(ErrorCode::kInvalidArgument,
                "RemoteTier: the host buffer holds " +
                    std::to_string(host_.size() / config_.bytes_per_block) + " slots of " +
                    std::to_string(config_.bytes_per_block) + " bytes, the tier needs " +
                    std::to_string(slots) + " (num_host_blocks + 1)");
  }
  const bool on_eviction = config_.store_policy == RemoteStorePolicy::kOnHostEviction;
  if (on_eviction && config_.store && config_.eviction_staging_blocks == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "RemoteTier: kOnHostEviction needs eviction_staging_blocks > 0");
  }
  std::size_t table = 2;
  while (table < 2 * slots) table *= 2;
  fetching_.resize(table);
  slot_loads_.assign(slots, 0);
  slot_put_.assign(slots, 0);
  std::size_t staging = 0;
  if (on_eviction && config_.store) {
    staging = config_.eviction_staging_blocks;
    slot_block_.resize(slots);
    staging_.assign(staging * static_cast<std::size_t>(config_.bytes_per_block), std::byte{0});
    staging_block_.resize(staging);
    staging_free_.reserve(staging);
    for (std::size_t i = staging; i-- > 0;) staging_free_.push_back(static_cast<std::uint32_t>(i));
  }
  put_queue_.reserve(config_.max_puts_in_flight + staging);
  HostTierHooks hooks;
  // The hooks never throw (a commit that throws then changed nothing: handle() relies on it): a
  // failure (pinning the slot, hashing its group key) skips the block's put, counted.
  hooks.on_cached = [this](BlockId slot, bool from_fill) {
    try {
      on_cached(slot, from_fill);
    } catch (...) {
      skip_put(slot);
    }
  };
  hooks.on_loaded = [this](BlockId slot) {
    try {
      on_loaded(slot);
    } catch (...) {
      skip_put(slot);
    }
  };
  if (on_eviction && config_.store) {
    hooks.on_evicted = [this](BlockId slot) { on_evicted(slot); };
  }
  tier_.set_host_hooks(std::move(hooks));
}

RemoteTier::~RemoteTier() {
  config_.load = false;  // no new fills while draining
  const auto end = Clock::now() + config_.drain_timeout;
  for (PutItem& item : put_queue_) release(item);
  put_queue_.clear();
  // Staged puts read this object's buffers: wait for them whatever drain_timeout says (the
  // store completes each op within its op timeout).
  while (in_flight_ > 0 && (Clock::now() < end || staged_in_flight_ > 0)) {
    // First what a poll that threw left unhandled, then the store's new completions.
    if (next_completion_ == completions_.size()) {
      completions_.clear();
      next_completion_ = 0;
    }
    try {
      store_.poll(completions_);
    } catch (...) {  // bad_alloc growing completions_: try again
    }
    if (next_completion_ == completions_.size()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    while (next_completion_ < completions_.size()) {
      const RemoteCompletion c = completions_[next_completion_++];
      try {
        handle(c);
      } catch (...) {  // its fill stays uncommitted: committed failed below
      }
    }
  }
  // Whatever did not complete in time: fills fail, put slots are released.
  for (auto& [ticket, batch] : gets_) {
    for (HostFill& f : batch.fills) {
      if (f.slot != kNullBlockId) tier_.commit(f.id, false);
    }
  }
  for (auto& [ticket, batch] : puts_) {
    for (PutItem& item : batch.items) release(item);
  }
  tier_.set_host_hooks({});
}

std::span<std::byte> RemoteTier::staging_bytes(std::uint32_t index) {
  const auto bpb = static_cast<std::size_t>(config_.bytes_per_block);
  return std::span<std::byte>(staging_).subspan(static_cast<std::size_t>(index) * bpb, bpb);
}

void RemoteTier::release(PutItem& item) noexcept {
  if (item.done) return;
  item.done = true;
  if (item.slot != kNullBlockId) {
    tier_.unpin_host_slot(item.slot);
    --put_pins_;
  }
  if (item.staging != kNoStaging) staging_free_.push_back(item.staging);
}

RemoteValueBinding RemoteTier::slot_binding(BlockId slot) const {
  const BlockPool& host = tier_.host_pool();
  const KVCacheBlock& b = host.block(slot);
  return RemoteValueBinding{group_key(b.block_hash, b.group_id),
                            tier_.host_slot_parent(slot),
                            b.group_id,
                            tier_.host_slot_identity(slot),
                            config_.kv_dtype,
                            config_.kv_scale_mode};
}

BlockHash RemoteTier::group_key(const BlockHash& hash, GroupId group) const {
  if (group == 0) return hash;
  key_tokens_[1] = static_cast<TokenId>(group);
  return tier_.gpu().hasher().hash_block(hash, key_tokens_);
}

std::span<std::byte> RemoteTier::slot_bytes(BlockId slot) const {
  const auto bpb = static_cast<std::size_t>(config_.bytes_per_block);
  return host_.subspan(static_cast<std::size_t>(slot) * bpb, bpb);
}

void RemoteTier::add_request(const Request& request, Clock::time_point now) {
  if (!config_.load) return;
  if (pending_.count(request.id()) != 0) {
    throw Error(ErrorCode::kInvalidState, "RemoteTier::add_request: request " +
                                              std::to_string(request.id()) + " was already added");
  }
  Pending p;
  p.request = &request;
  p.deadline = now + config_.timeout;
  if (hybrid_) {
    add_hybrid(request, p);
    p.serial = next_serial_++;
    ++stats_.requests;
    pending_.emplace(request.id(), std::move(p));
    return;
  }
  const std::size_t bs = tier_.block_size();
  const std::span<const BlockHash> hashes = request.block_hashes();
  const std::size_t max_blocks =
      request.num_tokens() == 0 ? 0 : std::min((request.num_tokens() - 1) / bs, hashes.size());
  const std::size_t start = std::min(tier_.local_prefix_blocks(request), max_blocks);
  p.start = start;
  p.serial = next_serial_++;
  ++stats_.requests;
  if (start < max_blocks) {
    const auto keys = hashes.subspan(start, max_blocks - start);
    if (p.probe.start(store_, keys, PrefetchPolicy::kWaitComplete, p.deadline)) {
      probes_.emplace(p.probe.ticket(), std::make_pair(request.id(), keys.size()));
      in_flight_ += keys.size();
      stats_.probed_blocks += keys.size();
      group_stats_[0].probed_blocks += keys.size();
    }
  } else {
    p.phase = Phase::kDone;
  }
  pending_.emplace(request.id(), std::move(p));
}

void RemoteTier::start_fills(RequestId id, Pending& p) {
  const std::size_t run = p.probe.hit_blocks();
  if (run == 0 || !config_.load) {
    stats_.probe_hit_blocks += run;
    p.phase = Phase::kDone;
    return;
  }
  // What may throw comes first (the request then stays probing and is started again at the next
  // poll): no allocation between a fill's begin and its record in the batch.
  GetBatch batch;
  batch.request = id;
  reserve_fills(batch, run);
  const std::span<const BlockHash> hashes = p.request->block_hashes();
  // Prefix identities (a hasher that is not collision resistant): each get is bound to its
  // block's, so a value another prefix stored under a colliding key is rejected.
  tier_.prefix_identities(*p.request, p.start + run, identities_);
  window_skipped_.clear();  // (one group: no window)
  FillCounts counts;
  counts.hit_blocks = run;
  FillGuard guard(tier_, batch);  // begin_fill_known throwing: the fills begun are committed failed
  for (std::size_t i = p.start; i < p.start + run; ++i) {
    if (tier_.host_holds(*p.request, i)) continue;  // e.g. stored meanwhile by another request
    // (An entry always names a batch in gets_: it is erased when its fill commits.)
    if (const FetchEntry* e = fetch_find(hashes[i]); e != nullptr && gets_.count(e->ticket) != 0) {
      shared_.emplace_back(e->ticket, e->index);  // another request's get is fetching it
      continue;
    }
    const std::optional<HostFill> fill =
        tier_.begin_fill_known(*p.request, i, identities_.empty() ? nullptr : &identities_[i]);
    if (!fill) {
      counts.no_slot = p.start + run - i;
      break;
    }
    batch.fills.push_back(*fill);
    batch.keys.push_back(hashes[i]);
    batch.groups.push_back(kGroup);
    // Bound to the block and its verified prefix: the previous block's chained hash.
    get_ops_.push_back({hashes[i], slot_bytes(fill->slot), i > 0 ? hashes[i - 1] : BlockHash(),
                        kGroup, identities_.empty() ? BlockHash() : identities_[i],
                        config_.kv_dtype, config_.kv_scale_mode});
  }
  submit_fills(id, p, std::move(batch), guard, counts);
}

void RemoteTier::reserve_fills(GetBatch& batch, std::size_t n) {
  get_ops_.clear();
  shared_.clear();
  batch.fills.reserve(n);
  batch.keys.reserve(n);
  batch.groups.reserve(n);
  get_ops_.reserve(n);
  shared_.reserve(n);
}

RemoteTier::FillGuard::~FillGuard() {
  if (!armed) return;
  for (const HostFill& f : batch.fills) {
    try {
      tier.commit(f.id, false);
    } catch (...) {  // (a failed fill's commit runs no hook and allocates nothing)
    }
  }
}

void RemoteTier::submit_fills(RequestId id, Pending& p, GetBatch&& batch, FillGuard& guard,
                              const FillCounts& counts) {
  // Everything that allocates before anything changes: the waiters' room, and the batch's entry
  // of gets_ (a node made now, keyed by the ticket once the store accepts the batch: nothing
  // allocates after the store holds the batch's buffers). Throwing, the guard commits the fills
  // begun failed.
  for (const auto& [ticket, index] : shared_) {
    std::vector<Waiter>& waiters = gets_.find(ticket)->second.waiters;
    detail::reserve_more(waiters, shared_.size());
  }
  GetMap::node_type node;
  if (!batch.fills.empty()) {
    detail::reserve_more_keys(gets_, 1);
    GetMap made;
    made.emplace(RemoteTicket{0}, GetBatch{});  // batch moved in only once nothing can throw
    node = made.extract(made.begin());
  }
  guard.armed = false;
  stats_.probe_hit_blocks += counts.hit_blocks;
  stats_.fills_no_slot += counts.no_slot;
  for (std::size_t g = 0; g < window_skipped_.size(); ++g) {
    stats_.window_blocks_not_loaded += window_skipped_[g];
    group_stats_[g].window_blocks_not_loaded += window_skipped_[g];
  }
  if (!node.empty()) node.mapped() = std::move(batch);
  p.phase = Phase::kDone;
  p.hybrid_ticket = 0;
  for (const auto& [ticket, index] : shared_) {
    gets_.find(ticket)->second.waiters.push_back(Waiter{index, id, p.serial});
  }
  stats_.fills_shared += shared_.size();
  p.shared_waits = shared_.size();
  if (p.shared_waits > 0) p.phase = Phase::kLoading;
  if (node.empty()) return;
  GetBatch& own = node.mapped();
  RemoteTicket ticket = 0;  // tickets start at 1
  try {
    ticket = store_.get(get_ops_).value_or(0);
  } catch (const Error&) {  // a value size the store does not accept: as a refusal
    ticket = 0;
  } catch (...) {  // bad_alloc in the store: nothing submitted
    for (const HostFill& f : own.fills) tier_.commit(f.id, false);
    throw;
  }
  if (ticket == 0) {
    stats_.fills_refused += own.fills.size();
    for (const HostFill& f : own.fills) tier_.commit(f.id, false);
    return;
  }
  stats_.fills += own.fills.size();
  for (const GroupId g : own.groups) ++group_stats_[g].fills;
  own.outstanding = own.fills.size();
  in_flight_ += own.fills.size();
  p.phase = Phase::kLoading;
  p.get_ticket = ticket;
  for (std::size_t k = 0; k < own.keys.size(); ++k) {
    fetch_insert(own.keys[k], ticket, static_cast<std::uint32_t>(k));
  }
  node.key() = ticket;
  gets_.insert(std::move(node));  // room reserved: no rehash, no allocation
}

void RemoteTier::group_views(const Request& request) {
  const BlockSequence fine = request.hashed_tokens().sequence();
  for (std::size_t g = 0; g < window_.size(); ++g) {
    if (factor_[g] > 1) coarse_[g].clear();
    views_[g] = tier_.group_seq(fine, g, coarse_);
  }
}

void RemoteTier::key_offsets(std::size_t G, std::size_t end) {
  // Group-major keys: group g's blocks [G / f, end / f) (f: its factor) from key_offset_[g].
  key_offset_[0] = 0;
  for (std::size_t g = 0; g < window_.size(); ++g) {
    key_offset_[g + 1] = key_offset_[g] + (end - G) / factor_[g];
  }
}

void RemoteTier::add_hybrid(const Request& request, Pending& p) {
  const std::size_t bs = tier_.block_size();
  const std::size_t ng = window_.size();
  const std::span<const BlockHash> hashes = request.block_hashes();
  // Positions in blocks of the smallest block size; a hit ends on a multiple of align_ (the
  // groups' LCM block size over it), so `end` is one. Group g's block q covers positions
  // [q * f, (q + 1) * f) (f = factor_[g]) and is keyed as the GPU manager keys it (views_).
  const std::size_t max_blocks =
      request.num_tokens() == 0 ? 0 : std::min((request.num_tokens() - 1) / bs, hashes.size());
  const std::size_t end = max_blocks / align_ * align_;
  group_views(request);
  // The GPU hit G (a hint, the manager's fixed-point rule over the pool's cached blocks, at a
  // multiple of align_): every full-attention group holds its blocks [0, G_g), every window group
  // [G_g - window, G_g) (x_g = x / f). last_gap_[g]: the window group's last block below the
  // scanned end that the GPU does not hold, plus one (0: none).
  const BlockPool& pool = tier_.gpu().block_pool();
  last_gap_.assign(ng, 0);
  std::size_t G = 0;
  for (std::size_t c = 0; c <= end; c += align_) {
    bool ok = true;
    for (std::size_t g = 0; g < ng && ok; ++g) {
      if (window_[g] == kFullGroup) continue;
      const std::size_t cg = c / factor_[g];
      const std::size_t from = cg > window_[g] ? cg - window_[g] : 0;
      ok = last_gap_[g] <= from;
    }
    if (ok) G = c;
    if (c == end) break;
    bool full_held = true;
    for (std::size_t g = 0; g < ng; ++g) {
      const std::size_t f = factor_[g];
      for (std::size_t q = c / f; q < (c + align_) / f; ++q) {
        const bool held = pool.get_cached_block(views_[g].block_hashes[q],
                                                static_cast<GroupId>(g)) != BlockPool::kNoBlock;
        if (window_[g] == kFullGroup) {
          full_held = full_held && held;
        } else if (!held) {
          last_gap_[g] = q + 1;
        }
      }
    }
    if (!full_held) break;
  }
  p.start = G;
  p.end = end;
  if (G >= end) {
    p.phase = Phase::kDone;
    return;
  }
  key_offsets(G, end);
  p.keys.reserve(key_offset_[ng]);
  for (std::size_t g = 0; g < ng; ++g) {
    const std::size_t f = factor_[g];
    for (std::size_t q = G / f; q < end / f; ++q) {
      p.keys.push_back(group_key(views_[g].block_hashes[q], static_cast<GroupId>(g)));
    }
  }
  p.present.assign(p.keys.size(), 0);
  const std::optional<RemoteTicket> ticket = store_.exists(p.keys);
  if (!ticket) {  // the store's queue refused the batch: nothing from the store
    p.phase = Phase::kDone;
    return;
  }
  p.hybrid_ticket = *ticket;
  probes_.emplace(*ticket, std::make_pair(request.id(), p.keys.size()));
  in_flight_ += p.keys.size();
  stats_.probed_blocks += p.keys.size();
  for (std::size_t g = 0; g < ng; ++g) {
    group_stats_[g].probed_blocks += key_offset_[g + 1] - key_offset_[g];
  }
}

void RemoteTier::start_hybrid_fills(RequestId id, Pending& p) {
  if (!config_.load) {
    p.phase = Phase::kDone;
    p.hybrid_ticket = 0;
    return;
  }
  // As start_fills: what may throw first (the request then stays probing, started again at the
  // next poll), no allocation between a fill's begin and its record in the batch.
  const Request& request = *p.request;
  const std::size_t ng = window_.size();
  // Positions in blocks of the smallest block size (see add_hybrid); G and end multiples of
  // align_; group g's blocks x / f.
  const std::size_t G = p.start;
  const std::size_t end = p.end;
  group_views(request);
  key_offsets(G, end);
  tier_.prefix_identities(request, end, identities_);
  // A group's block carries the prefix identity of the fine block it ends with.
  const auto identity = [this](std::size_t g, std::size_t q) {
    return identities_.empty() ? nullptr : &identities_[(q + 1) * factor_[g] - 1];
  };
  const auto key_index = [this, G](std::size_t g, std::size_t q) {
    return key_offset_[g] + (q - G / factor_[g]);
  };
  // What the host holds now (verified as its hits are), per key.
  held_.assign(key_offset_[ng], 0);
  for (std::size_t g = 0; g < ng; ++g) {
    const std::size_t f = factor_[g];
    for (std::size_t q = G / f; q < end / f; ++q) {
      held_[key_index(g, q)] = tier_.host_match(views_[g], q, identity(g, q),
                                                static_cast<GroupId>(g)) != BlockPool::kNoBlock
                                   ? 1
                                   : 0;
    }
  }
  const auto usable = [&](std::size_t g, std::size_t q) {
    const std::size_t k = key_index(g, q);
    return held_[k] != 0 || p.present[k] == 1;
  };
  // The host tier's hit rule over "in the host or in the store": the longest L, a multiple of
  // align_ past G, such that full-attention groups have every block of [G_g, L_g), window groups
  // every block of [max(G_g, L_g - window), L_g). last_gap_[g]: for candidate L, the last
  // unusable block of window group g in [G_g, L_g), + 1.
  std::size_t L = G;
  last_gap_.assign(ng, 0);
  for (std::size_t g = 0; g < ng; ++g) last_gap_[g] = G / factor_[g];
  for (std::size_t c = G + align_; c <= end; c += align_) {
    bool full_ok = true;
    for (std::size_t g = 0; g < ng && full_ok; ++g) {
      if (window_[g] != kFullGroup) continue;
      const std::size_t f = factor_[g];
      for (std::size_t q = (c - align_) / f; q < c / f && full_ok; ++q) full_ok = usable(g, q);
    }
    if (!full_ok) break;
    bool ok = true;
    for (std::size_t g = 0; g < ng; ++g) {
      if (window_[g] == kFullGroup) continue;
      const std::size_t f = factor_[g];
      const std::size_t cg = c / f;
      for (std::size_t q = (c - align_) / f; q < cg; ++q) {
        if (!usable(g, q)) last_gap_[g] = q + 1;
      }
      const std::size_t from = std::max(G / f, cg > window_[g] ? cg - window_[g] : 0);
      ok = ok && last_gap_[g] <= from;
    }
    if (ok) L = c;
  }
  // Per group, its first block to fetch: G_g, or a window group's window at L.
  const auto first_needed = [this, G, L](std::size_t g) {
    const std::size_t f = factor_[g];
    const std::size_t Lg = L / f;
    return window_[g] == kFullGroup ? G / f
                                    : std::max(G / f, Lg > window_[g] ? Lg - window_[g] : 0);
  };
  GetBatch batch;
  batch.request = id;
  reserve_fills(batch, key_offset_[ng]);  // at most one fill per key
  FillCounts counts;
  window_skipped_.assign(ng, 0);
  for (std::size_t g = 0; g < ng; ++g) {
    if (window_[g] == kFullGroup) continue;
    const std::size_t from = first_needed(g);
    for (std::size_t q = G / factor_[g]; q < from; ++q) {
      const std::size_t k = key_index(g, q);
      if (held_[k] == 0 && p.present[k] == 1) ++window_skipped_[g];
    }
  }
  // Fills in position order, each group's block at the position it starts (a missing slot ends
  // the run there for every group).
  FillGuard guard(tier_, batch);  // begin_fill_known throwing: the fills begun are committed failed
  for (std::size_t i = G; i < L; ++i) {
    bool stop = false;
    for (std::size_t g = 0; g < ng && !stop; ++g) {
      const std::size_t f = factor_[g];
      if (i % f != 0) continue;
      const std::size_t q = i / f;
      const std::size_t k = key_index(g, q);
      if (q < first_needed(g) || held_[k] != 0) continue;
      ++counts.hit_blocks;
      const auto group = static_cast<GroupId>(g);
      const BlockHash& key = p.keys[k];
      if (const FetchEntry* e = fetch_find(key); e != nullptr && gets_.count(e->ticket) != 0) {
        shared_.emplace_back(e->ticket, e->index);  // another request's get is fetching it
        continue;
      }
      if (tier_.host_match(views_[g], q, identity(g, q), group) != BlockPool::kNoBlock) continue;
      const std::optional<HostFill> fill =
          tier_.begin_fill_known(request, q, identity(g, q), group, &views_[g]);
      if (!fill) {
        counts.no_slot = 1;
        stop = true;
        break;
      }
      batch.fills.push_back(*fill);
      batch.keys.push_back(key);
      batch.groups.push_back(group);
      // Bound to the block's group key, its group, the group's previous block (the parent its
      // host slot stores) and its verified prefix.
      const std::span<const BlockHash> own = views_[g].block_hashes;
      get_ops_.push_back({key, slot_bytes(fill->slot), q > 0 ? own[q - 1] : BlockHash(), group,
                          identities_.empty() ? BlockHash() : *identity(g, q), config_.kv_dtype,
                          config_.kv_scale_mode});
    }
    if (stop) break;
  }
  submit_fills(id, p, std::move(batch), guard, counts);
}

RemoteTier::FetchEntry* RemoteTier::fetch_find(const BlockHash& key) noexcept {
  const std::size_t mask = fetching_.size() - 1;
  for (std::size_t i = std::hash<BlockHash>{}(key)&mask;; i = (i + 1) & mask) {
    if (fetching_[i].ticket == 0) return nullptr;
    if (fetching_[i].key == key) return &fetching_[i];
  }
}

void RemoteTier::fetch_insert(const BlockHash& key, RemoteTicket ticket,
                              std::uint32_t index) noexcept {
  const std::size_t mask = fetching_.size() - 1;
  std::size_t i = std::hash<BlockHash>{}(key)&mask;
  while (fetching_[i].ticket != 0) i = (i + 1) & mask;
  fetching_[i] = FetchEntry{key, ticket, index};
}

void RemoteTier::fetch_erase(const BlockHash& key) noexcept {
  FetchEntry* e = fetch_find(key);
  if (e == nullptr) return;
  const std::size_t mask = fetching_.size() - 1;
  auto hole = static_cast<std::size_t>(e - fetching_.data());
  // Backward shift: move each later entry of the run whose home is not between the hole and it.
  for (std::size_t j = (hole + 1) & mask; fetching_[j].ticket != 0; j = (j + 1) & mask) {
    const std::size_t home = std::hash<BlockHash>{}(fetching_[j].key) & mask;
    const bool stays = hole < j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (stays) continue;
    fetching_[hole] = fetching_[j];
    hole = j;
  }
  fetching_[hole].ticket = 0;
}

void RemoteTier::release_waiter(const Waiter& w) noexcept {
  const auto it = pending_.find(w.request);
  if (it == pending_.end() || it->second.serial != w.serial) return;  // removed meanwhile
  Pending& p = it->second;
  if (p.shared_waits > 0 && --p.shared_waits == 0 && p.get_ticket == 0) p.phase = Phase::kDone;
}

void RemoteTier::handle(const RemoteCompletion& c) {
  if (const auto it = probes_.find(c.ticket); it != probes_.end()) {
    --in_flight_;
    const auto p = pending_.find(it->second.first);
    if (p != pending_.end() && p->second.hybrid_ticket == c.ticket) {
      Pending& q = p->second;
      if (c.index < q.present.size() && q.present[c.index] == 0) {
        q.present[c.index] = c.kind == RemoteOpKind::kExists && c.result == RemoteResult::kHit
                                 ? std::uint8_t{1}
                                 : std::uint8_t{2};
        ++q.answered;
      }
    } else if (p != pending_.end() && p->second.probe.ticket() == c.ticket) {
      p->second.probe.absorb(std::span<const RemoteCompletion>(&c, 1));
    }
    if (--it->second.second == 0) probes_.erase(it);
    return;
  }
  if (const auto it = gets_.find(c.ticket); it != gets_.end()) {
    GetBatch& batch = it->second;
    if (c.index < batch.fills.size() && batch.fills[c.index].slot != kNullBlockId) {
      const bool ok = c.result == RemoteResult::kHit;
      // First: throwing (bad_alloc; the hooks never throw), it changed nothing and poll() hands
      // this completion to handle() again.
      tier_.commit(batch.fills[c.index].id, ok);
      batch.fills[c.index].slot = kNullBlockId;  // committed
      fetch_erase(batch.keys[c.index]);
      for (const Waiter& w : batch.waiters) {
        if (w.index == c.index) release_waiter(w);
      }
      if (ok) {
        ++stats_.loaded_blocks;
        stats_.loaded_bytes += config_.bytes_per_block;
        stats_.remote_hit_tokens += group_bs_[batch.groups[c.index]];
        RemoteTierGroupStats& gs = group_stats_[batch.groups[c.index]];
        ++gs.loaded_blocks;
        gs.loaded_bytes += config_.bytes_per_block;
      } else {
        ++stats_.load_misses;
        if (c.result == RemoteResult::kInvalidValue) ++stats_.rejected_values;
      }
    }
    --in_flight_;
    if (--batch.outstanding == 0) {
      if (!batch.request_gone) {
        const auto p = pending_.find(batch.request);
        if (p != pending_.end() && p->second.get_ticket == c.ticket) {
          p->second.get_ticket = 0;
          if (p->second.shared_waits == 0) p->second.phase = Phase::kDone;
        }
      }
      gets_.erase(it);
    }
    return;
  }
  if (const auto it = puts_.find(c.ticket); it != puts_.end()) {
    --in_flight_;
    std::vector<PutItem>& items = it->second.items;
    if (c.index < items.size() && !items[c.index].done) {
      if (items[c.index].staging != kNoStaging) --staged_in_flight_;
      release(items[c.index]);
      if (c.result == RemoteResult::kStored) {
        ++stats_.stored_blocks;
        stats_.stored_bytes += config_.bytes_per_block;
        RemoteTierGroupStats& gs = group_stats_[items[c.index].group];
        ++gs.stored_blocks;
        gs.stored_bytes += config_.bytes_per_block;
      } else {
        ++stats_.puts_failed;
        if (c.result == RemoteResult::kSkippedFull) ++stats_.puts_skipped_full;
      }
    }
    if (--it->second.outstanding == 0) puts_.erase(it);
  }
  // Anything else is not ours (or of a batch already forgotten): ignored.
}

void RemoteTier::poll(Clock::time_point now) {
  // A completion whose handling threw (its commit, e.g. bad_alloc, changed nothing) stays, with
  // those after it, for the next poll: one throw never loses the others.
  if (next_completion_ == completions_.size()) {
    completions_.clear();
    next_completion_ = 0;
  }
  store_.poll(completions_);
  while (next_completion_ < completions_.size()) {
    handle(completions_[next_completion_]);
    ++next_completion_;
  }
  completions_.clear();
  next_completion_ = 0;
  for (auto& [id, p] : pending_) {
    if (p.phase == Phase::kProbing) {
      if (hybrid_) {
        // Every answer in (each op completes within the store's op timeout).
        if (p.answered == p.present.size()) start_hybrid_fills(id, p);
      } else if (p.probe.ready(now)) {
        start_fills(id, p);
      }
    }
    if (p.phase != Phase::kDone && !p.timed_out && now >= p.deadline &&
        config_.policy == PrefetchPolicy::kTimeout) {
      p.timed_out = true;
      ++stats_.ready_by_timeout;
    }
  }
  submit_puts();
}

bool RemoteTier::ready(RequestId id, Clock::time_point now) const {
  const auto it = pending_.find(id);
  if (it == pending_.end() || it->second.phase == Phase::kDone) return true;
  switch (config_.policy) {
    case PrefetchPolicy::kBestEffort:
      return true;
    case PrefetchPolicy::kWaitComplete:
      return false;
    case PrefetchPolicy::kTimeout:
      return now >= it->second.deadline;
  }
  return true;
}

void RemoteTier::remove_request(RequestId id) noexcept {
  const auto it = pending_.find(id);
  if (it == pending_.end()) return;
  if (it->second.phase == Phase::kLoading) {
    if (const auto g = gets_.find(it->second.get_ticket); g != gets_.end()) {
      g->second.request_gone = true;
    }
  }
  pending_.erase(it);
}

void RemoteTier::on_cached(BlockId slot, bool from_fill) {
  const auto s = static_cast<std::size_t>(slot);
  slot_loads_[s] = 0;
  slot_put_[s] = from_fill ? 1 : 0;  // a block that came from the store is not put back
  if (!config_.store) return;
  if (config_.store_policy == RemoteStorePolicy::kOnHostEviction) {
    slot_block_[s] = slot_binding(slot);  // put when evicted
    return;
  }
  if (!from_fill && config_.store_min_hits == 0) queue_put(slot);
}

void RemoteTier::skip_put(BlockId slot) noexcept {
  const auto s = static_cast<std::size_t>(slot);
  if (slot_put_[s] != 0) return;  // queued already (or from the store)
  slot_put_[s] = 1;
  if (!slot_block_.empty()) slot_block_[s].block = BlockHash();
  ++stats_.puts_skipped;
}

void RemoteTier::on_loaded(BlockId slot) {
  const auto s = static_cast<std::size_t>(slot);
  if (!config_.store || config_.store_policy != RemoteStorePolicy::kWriteThrough ||
      config_.store_min_hits == 0 || slot_put_[s] != 0) {
    return;
  }
  if (++slot_loads_[s] >= config_.store_min_hits) queue_put(slot);
}

void RemoteTier::on_evicted(BlockId slot) noexcept {
  const auto s = static_cast<std::size_t>(slot);
  if (slot_put_[s] != 0 || slot_block_[s].block.empty()) return;  // from the store, or put
  const RemoteValueBinding block = slot_block_[s];
  slot_block_[s].block = BlockHash();
  slot_put_[s] = 1;
  if (staging_free_.empty()) {
    ++stats_.puts_skipped;
    return;
  }
  const std::uint32_t index = staging_free_.back();
  staging_free_.pop_back();
  // The slot still holds the evicted block: the tier call that evicted it has not returned, so
  // neither the engine's plan nor a fill has written it yet.
  const std::span<const std::byte> src = slot_bytes(slot);
  std::copy(src.begin(), src.end(), staging_bytes(index).begin());
  staging_block_[index] = block;
  PutItem item;
  item.staging = index;
  item.group = block.group;
  put_queue_.push_back(item);  // capacity reserved: no allocation
}

void RemoteTier::queue_put(BlockId slot) {
  if (put_pins_ >= config_.max_puts_in_flight) {
    ++stats_.puts_skipped;
    return;
  }
  tier_.pin_host_slot(slot);
  ++put_pins_;
  slot_put_[static_cast<std::size_t>(slot)] = 1;
  PutItem item;
  item.slot = slot;
  item.group = tier_.host_pool().block(slot).group_id;
  put_queue_.push_back(item);
}

void RemoteTier::submit_puts() {
  if (put_queue_.empty()) return;
  put_ops_.clear();
  std::size_t staged = 0;
  for (const PutItem& item : put_queue_) {
    if (item.staging != kNoStaging) {
      const RemoteValueBinding& b = staging_block_[item.staging];
      put_ops_.push_back({b.block, staging_bytes(item.staging), b.parent, b.group, b.identity,
                          b.kv_dtype, b.kv_scale_mode});
      ++staged;
    } else {
      const RemoteValueBinding b = slot_binding(item.slot);
      put_ops_.push_back({b.block, slot_bytes(item.slot), b.parent, b.group, b.identity, b.kv_dtype,
                          b.kv_scale_mode});
    }
  }
  // The batch's entry of puts_ before the store holds the buffers (a copy: put_queue_ keeps its
  // reserved room for on_evicted, which must not allocate). Throwing, nothing changed: the queue
  // is submitted at the next poll.
  detail::reserve_more_keys(puts_, 1);
  PutMap made;
  made.emplace(RemoteTicket{0}, PutBatch{put_queue_, put_queue_.size()});
  PutMap::node_type node = made.extract(made.begin());
  RemoteTicket ticket = 0;  // tickets start at 1
  try {
    ticket = store_.put(put_ops_).value_or(0);
  } catch (const Error&) {  // a value size the store does not accept: as a refusal
    ticket = 0;
  }
  if (ticket == 0) {
    stats_.puts_skipped += put_queue_.size();
    for (PutItem& item : put_queue_) release(item);
    put_queue_.clear();
    return;
  }
  stats_.puts += put_queue_.size();
  stats_.eviction_puts += staged;
  staged_in_flight_ += staged;
  in_flight_ += put_queue_.size();
  node.key() = ticket;
  puts_.insert(std::move(node));  // room reserved: no rehash, no allocation
  put_queue_.clear();
}

}  // namespace pagedkv
