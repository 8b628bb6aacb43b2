#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "pagedkv/base/error.hpp"

namespace pagedkv {

std::string_view to_string(HostPolicy policy) noexcept {
  switch (policy) {
    case HostPolicy::kWriteThrough:
      return "write_through";
    case HostPolicy::kWriteThroughSelective:
      return "write_through_selective";
    case HostPolicy::kWriteBack:
      return "write_back";
  }
  return "?";
}

std::optional<HostPolicy> parse_host_policy(std::string_view text) noexcept {
  for (const HostPolicy p :
       {HostPolicy::kWriteThrough, HostPolicy::kWriteThroughSelective, HostPolicy::kWriteBack}) {
    if (text == to_string(p)) return p;
  }
  return std::nullopt;
}

std::int32_t HostTierConfig::blocks_for_bytes(std::uint64_t bytes, std::uint64_t bytes_per_block) {
  if (bytes_per_block == 0) {
    throw Error(ErrorCode::kInvalidArgument, "HostTierConfig::blocks_for_bytes: 0 bytes per block");
  }
  const std::uint64_t n = bytes / bytes_per_block;
  return static_cast<std::int32_t>(std::min<std::uint64_t>(n, 0x7ffffffe));
}

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

KVCacheManagerConfig checked_gpu_config(const KVCacheManagerConfig& gpu,
                                        const HostTierConfig& host) {
  const auto bad = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, "TieredKVCacheManager: " + what);
  };
  if (gpu.groups.size() > 1 ||
      (gpu.groups.size() == 1 && gpu.groups[0].kind != AttentionKind::kFull)) {
    bad("the host tier supports one full-attention KV-cache group");
  }
  if (!gpu.enable_caching) bad("the host tier needs prefix caching on");
  const HashScheme scheme = gpu.hasher ? gpu.hasher->scheme() : gpu.hash_scheme;
  if (scheme == HashScheme::kXxh3_128) {
    bad("xxh3_128 is not collision resistant; host hits identify the content before a host run "
        "by the chained hash, so use sha256 or sha256_cbor_vllm");
  }
  if (host.num_host_blocks < 1 || host.num_host_blocks > 0x7ffffffe) {
    bad("num_host_blocks must be in [1, 2^31 - 2], got " + std::to_string(host.num_host_blocks));
  }
  if (host.policy == HostPolicy::kWriteThroughSelective && host.selective_hits == 0) {
    bad("selective_hits must be at least 1");
  }
  return gpu;
}

BlockPoolConfig host_pool_config(const KVCacheManagerConfig& gpu, const HostTierConfig& host,
                                 const BlockPoolConfig& gpu_pool) {
  BlockPoolConfig c;
  c.num_blocks = host.num_host_blocks + 1;  // slot 0 is the pool's null block, never used
  c.block_size = gpu_pool.block_size;
  c.enable_caching = true;
  c.verify_cache_hits = true;
  c.enable_kv_events = gpu.enable_kv_events;
  // As the GPU pool: with a collision-resistant hasher a block's stored parent hash identifies
  // its prefix, so the host pool needs no table of hash-consed content ids.
  c.chain_hashes_identify_prefix = gpu_pool.chain_hashes_identify_prefix;
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
std::optional<OwnedExtraKeys> owned_extra_keys(const BlockSequence& seq, std::size_t index,
                                               std::vector<MultiModalKey>& scratch) {
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

}  // namespace

TieredKVCacheManager::TieredKVCacheManager(const KVCacheManagerConfig& gpu,
                                           const HostTierConfig& host)
    : host_config_(host),
      manager_(checked_gpu_config(gpu, host)),
      host_(host_pool_config(gpu, host, manager_.block_pool().config())),
      host_chain_(host_.config().chain_hashes_identify_prefix),
      bs_(manager_.block_size()),
      own_records_(!manager_.block_pool().stores_chain_material()),
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
    gpu_tokens_.assign(n * bs_, 0);
  }
  gpu_hits_.assign(n, 0);
  gpu_host_slot_.assign(n, 0);
  gpu_host_epoch_.assign(n, 0);
  const auto m = static_cast<std::size_t>(host_.num_blocks());
  if (!host_chain_) {  // the host pool keeps no parent hashes: the tier does
    host_parent_.resize(m);
    host_first_.assign(m, 0);
  }
  host_slot_epoch_.assign(m, 0);
  host_pins_.assign(m, 0);
  content_tokens_.assign(2 * static_cast<std::size_t>(bs_), 0);
  stats_.host_slots = host.num_host_blocks;
  if (gpu.enable_kv_events) {
    manager_.set_event_sink([this](const KVEvent& e) { forward_event(e, "GPU"); });
    host_.set_event_sink([this](const KVEvent& e) { forward_event(e, "CPU"); });
  }
  manager_.set_eviction_observer(&eviction_forwarder_);
}

TieredKVCacheManager::~TieredKVCacheManager() {
  manager_.set_eviction_observer(nullptr);
}

void TieredKVCacheManager::forward_event(const KVEvent& event, const char* medium) {
  KVEvent e{next_event_seq_++, event.data};
  if (auto* s = std::get_if<BlockStored>(&e.data)) s->medium = medium;
  if (auto* r = std::get_if<BlockRemoved>(&e.data)) r->medium = medium;
  if (sink_) {
    sink_(e);
  } else {
    events_.push_back(std::move(e));
  }
}

std::vector<KVEvent> TieredKVCacheManager::take_events() {
  return std::exchange(events_, {});
}

void TieredKVCacheManager::set_event_sink(KVEventSink sink) {
  sink_ = std::move(sink);
}

inline BlockId TieredKVCacheManager::host_match(const BlockSequence& seq, std::size_t index) const {
  // DESIGN.md 5: the parent hash stored with the block must equal the request's.
  if (host_chain_) return host_.match_cached_block_after(seq, index);
  const BlockId slot = host_.match_cached_block_unanchored(seq, index);
  if (slot == BlockPool::kNoBlock) return slot;
  const auto s = static_cast<std::size_t>(slot);
  const bool parent_ok =
      index == 0 ? host_first_[s] != 0
                 : (host_first_[s] == 0 && same_hash(host_parent_[s], seq.block_hashes[index - 1]));
  return parent_ok ? slot : BlockPool::kNoBlock;
}

TieredCacheHit TieredKVCacheManager::get_computed_blocks(const Request& request) {
  TieredCacheHit hit;
  hit.gpu = manager_.get_computed_blocks(request);  // validates the request
  const auto count = [this, &request](const TieredCacheHit& found) noexcept {
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
    constexpr std::size_t kAhead = 4;  // overlap the host map's cache misses
    if (begin < max_blocks) found.reserve(max_blocks - begin);
    for (std::size_t i = begin; i < max_blocks; ++i) {
      if (i + kAhead < max_blocks) host_.prefetch_cached_block(seq.block_hashes[i + kAhead]);
      const BlockId slot = host_match(seq, i);
      if (slot == BlockPool::kNoBlock) break;
      found.push_back(slot);
    }
  }
  hit.host_slots.assign(found.begin(), found.end());
  hit.num_host_tokens = hit.host_slots.size() * bs_;
  hit.host_check = hit_check(hit.host_slots, seq.block_hashes, begin, hit.host_epoch);
  count(hit);  // only now: a lookup that threw counted nothing
  return hit;
}

std::uint64_t TieredKVCacheManager::hit_check(std::span<const BlockId> slots,
                                              std::span<const BlockHash> hashes, std::size_t begin,
                                              std::uint64_t epoch) const noexcept {
  // The blocks: the chained hash of the run's last block names the whole prefix up to it (the
  // tier takes SHA-256 chains only), so its 32 bytes and the run's place bind the hit to that
  // content. The slots: a sum of independent mixes of (two slots, their place), each a multiply
  // (a bijection), so no chain runs through the loop. The caller checked the bounds.
  const auto mix = [](std::uint64_t v) {
    v *= kGolden;
    return v ^ (v >> 31);
  };
  std::uint64_t x = mix(check_seed_ ^ (epoch * kGolden) ^
                        (static_cast<std::uint64_t>(begin) << 32) ^ slots.size());
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

void TieredKVCacheManager::reserve_copies(std::size_t evictions, std::size_t stores) {
  copies_.plan.evictions.clear();
  copies_.eviction_ids.clear();
  copies_.plan.stores.clear();
  copies_.store_ids.clear();
  reserve_room(copies_.plan.evictions, evictions);
  reserve_room(copies_.eviction_ids, evictions);
  reserve_room(copies_.plan.stores, stores);
  reserve_room(copies_.store_ids, stores);
}

void TieredKVCacheManager::hand_over_copies(TierPlan& out) noexcept {
  if (!copies_.plan.evictions.empty()) {
    out.plan.evictions.swap(copies_.plan.evictions);
    out.eviction_ids.swap(copies_.eviction_ids);
  }
  if (!copies_.plan.stores.empty()) {
    out.plan.stores.swap(copies_.plan.stores);
    out.store_ids.swap(copies_.store_ids);
  }
}

void TieredKVCacheManager::release_state(RequestMap::iterator it) noexcept {
  spare_requests_.give(requests_, it, [](RequestState& st) noexcept {
    st = RequestState{};
    return true;
  });
}

void TieredKVCacheManager::reserve_transfers(std::size_t more) {
  const std::size_t want = transfers_.size() + more;
  reserve_room(transfers_, want);
  reserve_room(free_transfers_, want);
  reserve_room(transfer_tokens_, want * bs_);
  reserve_room(transfer_hash_, want);
  reserve_room(transfer_parent_, want);
  reserve_room(transfer_first_, want);
}

std::uint32_t TieredKVCacheManager::grow_transfers() {
  const auto idx = static_cast<std::uint32_t>(transfers_.size());
  transfers_.emplace_back();
  transfer_tokens_.resize(transfer_tokens_.size() + bs_);
  transfer_hash_.emplace_back();
  transfer_parent_.emplace_back();
  transfer_first_.push_back(0);
  return idx;
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
  ++num_live_;
  if (state != nullptr) {  // a fill belongs to no request's allocation
    ++state->transfers_in_flight;
    if (kind == Kind::kLoad) ++state->loads_in_flight;
  }
  return (static_cast<TransferId>(t.generation) << 32) | idx;
}

BlockSequence TieredKVCacheManager::content_sequence(const std::vector<TokenId>& tokens,
                                                     const BlockHash* hashes, bool first,
                                                     const ContentSource* extra) const {
  // Block 1 of a two-block view (block 0 stands for the parent: its hash, dummy tokens), or a
  // one-block view of a chain's first block.
  BlockSequence seq;
  seq.block_size = bs_;
  seq.extra_keys = extra;
  if (first) {
    seq.tokens = std::span<const TokenId>(tokens).subspan(bs_, bs_);
    seq.block_hashes = std::span<const BlockHash>(hashes + 1, 1);
  } else {
    seq.tokens = std::span<const TokenId>(tokens).first(2 * static_cast<std::size_t>(bs_));
    seq.block_hashes = std::span<const BlockHash>(hashes, 2);
  }
  return seq;
}

std::optional<BlockId> TieredKVCacheManager::take_host_slot(bool& evicted) {
  slot_scratch_.clear();
  const std::uint64_t evictions = host_.num_evictions();
  if (!host_.get_new_blocks(1, slot_scratch_)) return std::nullopt;
  const BlockId slot = slot_scratch_[0];
  ++host_slot_epoch_[static_cast<std::size_t>(slot)];
  evicted = host_.num_evictions() != evictions;
  if (evicted) ++host_epoch_;  // a cached slot lost its content
  return slot;
}

inline void TieredKVCacheManager::refresh(BlockId slot) {
  // An unpinned cached slot that was just in use: back to the LRU tail.
  host_.requeue(slot);
}

inline bool TieredKVCacheManager::remembered_valid(std::size_t b) const noexcept {
  const BlockId known = gpu_host_slot_[b];
  return known != 0 && host_slot_epoch_[static_cast<std::size_t>(known)] == gpu_host_epoch_[b] &&
         host_.block(known).is_cached();
}

inline bool TieredKVCacheManager::host_has(BlockId gpu_block, const BlockSequence& seq,
                                           std::size_t index) {
  const auto b = static_cast<std::size_t>(gpu_block);
  if (remembered_valid(b)) {
    // Verified when the block was loaded from it; the slot has not been reassigned since.
    const BlockId known = gpu_host_slot_[b];
    if (host_.block(known).ref_cnt == 0) refresh(known);
    return true;
  }
  const BlockId slot = host_match(seq, index);
  if (slot == BlockPool::kNoBlock) return false;
  if (host_.block(slot).ref_cnt == 0) refresh(slot);
  gpu_host_slot_[b] = slot;
  gpu_host_epoch_[b] = host_slot_epoch_[static_cast<std::size_t>(slot)];
  return true;
}

inline void TieredKVCacheManager::schedule_store(BlockId gpu_block, const BlockSequence& seq,
                                                 std::size_t index, RequestState& state,
                                                 TierPlan& out) {
  if (!host_has(gpu_block, seq, index))
    store_block(gpu_block, seq, index, state, Kind::kStore, out);
}

void TieredKVCacheManager::store_block(BlockId gpu_block, const BlockSequence& view,
                                       std::size_t index, RequestState& state, Kind kind,
                                       TierPlan& out) {
  // Everything that may allocate first (the plan's vectors and the slab have room).
  std::optional<OwnedExtraKeys> owned = owned_extra_keys(view, index, mm_scratch_);
  bool evicted = false;  // the slot held a cached block, evicted now
  const std::optional<BlockId> taken = take_host_slot(evicted);
  if (!taken) {
    ++stats_.stores_skipped_full;
    return;
  }
  const BlockId slot = *taken;
  const TransferId id = open_transfer(kind, &state, gpu_block, slot, 0);
  const auto idx = static_cast<std::size_t>(id & kIndexMask);
  copy_block_tokens(transfer_tokens_.data() + idx * bs_, view.tokens.data() + index * bs_, bs_);
  transfer_hash_[idx] = view.block_hashes[index];
  transfer_parent_[idx] = index == 0 ? BlockHash() : view.block_hashes[index - 1];
  transfer_first_[idx] = index == 0 ? 1 : 0;
  if (owned) transfer_extra_[static_cast<std::uint32_t>(idx)] = std::move(*owned);
  ++host_storing_;
  if (kind == Kind::kEviction) {
    out.plan.evictions.push_back({gpu_block, slot});
    out.eviction_ids.push_back(id);
  } else {
    out.plan.stores.push_back({gpu_block, slot});
    out.store_ids.push_back(id);
  }
  if (evicted && hooks_.on_evicted) hooks_.on_evicted(slot);
}

void TieredKVCacheManager::on_evict(const BlockPool& pool, BlockId id) noexcept {
  // The hot path (write-back, the host copy known: an LRU refresh) saves no registers; the rest
  // is out of line.
  const auto k = static_cast<std::size_t>(id);
  const bool known = remembered_valid(k);
  const BlockId slot = gpu_host_slot_[k];
  gpu_host_slot_[k] = 0;  // the block's content goes; new content learns its slot anew
  if (host_config_.policy == HostPolicy::kWriteBack && known) {
    // The host holds the block: its LRU refresh is the whole write-back (a pinned slot stays as
    // it is: requeue leaves it).
    refresh(slot);
    if (own_records_ || !gpu_extra_.empty()) forget_evicted(pool, id, /*keep=*/false);
    return;
  }
  forget_evicted(pool, id, host_config_.policy == HostPolicy::kWriteBack);
}

void TieredKVCacheManager::forget_evicted(const BlockPool& pool, BlockId id, bool keep) noexcept {
  const auto k = static_cast<std::size_t>(id);
  if (host_config_.policy == HostPolicy::kWriteThroughSelective) gpu_hits_[k] = 0;
  if (keep) {
    // Write-back, the host copy unknown: looked up, and stored if missing, by allocate_slots once
    // its hit is pinned (capacity reserved there); the records and extra keys are forgotten then.
    evicted_.push_back(id);
    if (!own_records_) {
      evicted_hash_.push_back(pool.block(id).block_hash);
      evicted_parent_.push_back(pool.stored_parent_hash(id));
      const TokenId* tokens = pool.stored_tokens(id);
      evicted_tokens_.insert(evicted_tokens_.end(), tokens, tokens + bs_);
    }
    return;
  }
  if (own_records_) gpu_hash_[k] = BlockHash();
  if (!gpu_extra_.empty()) gpu_extra_.erase(id);
}

void TieredKVCacheManager::store_evicted(RequestState& state, TierPlan& out) {
  for (std::size_t e = 0; e < evicted_.size(); ++e) {
    const BlockId b = evicted_[e];
    const auto k = static_cast<std::size_t>(b);
    const bool first = own_records_ ? gpu_first_[k] != 0 : evicted_parent_[e].empty();
    copy_block_tokens(
        content_tokens_.data() + bs_,
        own_records_ ? gpu_tokens_.data() + k * bs_ : evicted_tokens_.data() + e * bs_, bs_);
    content_hashes_[0] = own_records_ ? gpu_parent_[k] : evicted_parent_[e];
    content_hashes_[1] = own_records_ ? gpu_hash_[k] : evicted_hash_[e];
    const auto ex = gpu_extra_.find(b);
    const ContentSource extra(ex == gpu_extra_.end() ? nullptr : &ex->second, first ? 0 : 1);
    const BlockSequence view = content_sequence(content_tokens_, content_hashes_, first, &extra);
    const std::size_t index = first ? 0 : 1;
    const BlockId slot = host_match(view, index);
    if (slot == BlockPool::kNoBlock) {
      store_block(b, view, index, state, Kind::kEviction, out);
    } else if (host_.block(slot).ref_cnt == 0) {
      refresh(slot);
    }
    if (own_records_) gpu_hash_[k] = BlockHash();
    if (ex != gpu_extra_.end()) gpu_extra_.erase(ex);
  }
  evicted_.clear();
  evicted_hash_.clear();
  evicted_parent_.clear();
  evicted_tokens_.clear();
}

void TieredKVCacheManager::record_new_blocks(Request& request, RequestState& state, TierPlan& out) {
  const BlockSequence seq = request.hashed_tokens().sequence();
  const bool write_through = host_config_.policy == HostPolicy::kWriteThrough;
  // With the GPU pool's material the tier keeps nothing per block but extra keys.
  if (!own_records_ && !write_through && seq.extra_keys == nullptr) return;
  const std::span<const BlockId> ids = manager_.block_ids(request.id());
  const BlockPool& pool = manager_.block_pool();
  const std::size_t end = std::min(ids.size(), seq.block_hashes.size());
  std::size_t i = state.scanned;
  for (; i < end; ++i) {
    const BlockId b = ids[i];
    if (!pool.block(b).is_cached()) break;
    // Overlap the host map's misses of write-through's verified lookups (host_has): only for
    // blocks with no remembered slot (a loaded block has one).
    if (write_through && i + kHostAhead < end &&
        gpu_host_slot_[static_cast<std::size_t>(ids[i + kHostAhead])] == 0) {
      host_.prefetch_cached_block(seq.block_hashes[i + kHostAhead]);
    }
    const auto k = static_cast<std::size_t>(b);
    if (own_records_) {
      gpu_hash_[k] = seq.block_hashes[i];
      gpu_first_[k] = i == 0 ? 1 : 0;
      gpu_parent_[k] = i == 0 ? BlockHash() : seq.block_hashes[i - 1];
      copy_block_tokens(gpu_tokens_.data() + k * bs_, seq.tokens.data() + i * bs_, bs_);
    }
    if (std::optional<OwnedExtraKeys> owned = owned_extra_keys(seq, i, mm_scratch_)) {
      gpu_extra_[b] = std::move(*owned);
    }
    if (write_through) schedule_store(b, seq, i, state, out);
  }
  state.scanned = i;
}

void TieredKVCacheManager::forget_loaded_slots(const Request& request, const RequestState& state,
                                               std::size_t from) {
  const std::span<const BlockId> ids = manager_.block_ids(request.id());
  const std::size_t end = std::min(ids.size(), state.hit_begin + state.num_loads);
  for (std::size_t i = state.hit_begin + from; i < end; ++i) {
    gpu_host_slot_[static_cast<std::size_t>(ids[i])] = 0;
  }
}

std::optional<TierAllocation> TieredKVCacheManager::allocate_slots(
    Request& request, std::size_t num_new_tokens, const TieredCacheHit& hit,
    std::size_t num_lookahead_tokens) {
  const auto where = [&request] {
    return "TieredKVCacheManager::allocate_slots: request " + std::to_string(request.id()) + ": ";
  };
  manager_.check_owner(request, "TieredKVCacheManager::allocate_slots");
  const RequestMap::iterator found = requests_.find(request.id());
  if (found != requests_.end() && found->second.loading) {
    throw Error(ErrorCode::kInvalidState,
                where() + "its loads are not finished (commit them, then call finish_loads)");
  }
  const std::size_t h = hit.host_slots.size();
  if (hit.num_host_tokens != h * bs_) {
    throw Error(ErrorCode::kInvalidArgument,
                where() + "the hit's num_host_tokens " + std::to_string(hit.num_host_tokens) +
                    " != " + std::to_string(h) + " slots x block size");
  }
  const std::size_t g = hit.gpu.blocks.size();
  if (h > 0) {
    if (found != requests_.end() || request.num_computed_tokens() != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  where() + "a cache hit can only be passed to the first allocation");
    }
    const std::span<const BlockHash> hashes = request.block_hashes();
    const auto stale = [&](std::size_t i) {
      throw Error(ErrorCode::kInvalidArgument,
                  where() + "stale host hit: slot " + std::to_string(hit.host_slots[i]) +
                      " no longer holds the request's block " + std::to_string(g + i) +
                      " (call allocate_slots right after get_computed_blocks)");
    };
    const std::int32_t num_slots = host_.num_blocks();
    // One branch-free pass (every slot in 1 .. num_slots - 1); the first bad one is found only
    // to name it.
    const auto last_slot = static_cast<std::uint32_t>(num_slots - 1);
    std::uint32_t bad = g + h > hashes.size() ? 1 : 0;
    for (std::size_t i = 0; i < h; ++i) {
      bad |= static_cast<std::uint32_t>(static_cast<std::uint32_t>(hit.host_slots[i]) - 1u >=
                                        last_slot);
    }
    if (bad != 0) [[unlikely]] {
      for (std::size_t i = 0; i < h; ++i) {
        if (hit.host_slots[i] < 1 || hit.host_slots[i] >= num_slots || g + i >= hashes.size()) {
          stale(i);
        }
      }
    }
    // The lookup verified these slots for these blocks and no host slot was reassigned since:
    // they still hold them. Otherwise (a hit from before a reassignment, from another request
    // or tier, or changed by hand) every slot is verified again.
    if (hit.host_epoch != host_epoch_ ||
        hit.host_check != hit_check(hit.host_slots, hashes, g, hit.host_epoch)) {
      const BlockSequence seq = request.hashed_tokens().sequence();
      for (std::size_t i = 0; i < h; ++i) {
        if (!host_verified(seq, g + i, hit.host_slots[i])) stale(i);
      }
    }
  }
  // Everything that may allocate happens before the manager changes state.
  const std::size_t bound = h + 2 * ((request.num_tokens() + num_lookahead_tokens) / bs_ + 2) + g;
  reserve_transfers(bound);
  const HostPolicy policy = host_config_.policy;
  // Evictions are write-back's; stores are write-through's (of the computed blocks, recorded
  // below only without a host hit) and selective's (of GPU-hit blocks).
  const std::size_t max_evictions = policy == HostPolicy::kWriteBack ? bound : 0;
  const std::size_t max_stores = policy == HostPolicy::kWriteThrough ? (h == 0 ? bound : 0)
                                 : policy == HostPolicy::kWriteThroughSelective ? g
                                                                                : 0;
  TierAllocation out;
  out.transfers.plan.loads.resize(h);  // written in place below
  out.transfers.load_ids.resize(h);
  // Evictions and stores go to copies_ (reused), handed over at the end only if there are any.
  reserve_copies(max_evictions, max_stores);
  if (policy == HostPolicy::kWriteBack) {  // on_evict's room (cannot allocate there)
    reserve_room(evicted_, bound);
    if (!own_records_) {
      reserve_room(evicted_hash_, bound);
      reserve_room(evicted_parent_, bound);
      reserve_room(evicted_tokens_, bound * bs_);
    }
  }
  auto it = found;  // requests_ has not changed since
  const bool inserted = it == requests_.end();
  if (inserted) {
    it = spare_requests_.insert_new(requests_, request.id());
    it->second.id = request.id();
  }
  std::optional<std::span<const BlockId>> blocks;
  try {
    blocks = manager_.allocate_slots(request, h * bs_ + num_new_tokens, hit.gpu,
                                     num_lookahead_tokens, /*delay_cache_blocks=*/h > 0);
  } catch (...) {
    if (inserted) release_state(it);
    throw;
  }
  if (!blocks) {
    if (inserted) release_state(it);
    return std::nullopt;
  }
  RequestState& st = it->second;
  out.new_blocks = *blocks;
  // Pin the hit's host slots first: the stores below must not evict them.
  if (h > 0) host_.touch(hit.host_slots);
  // Write-back: the blocks the allocation evicted (on_evict refreshed those the host is known to
  // hold) are looked up in the host and stored there if missing.
  if (!evicted_.empty()) store_evicted(st, copies_);
  if (inserted) st.scanned = g;  // the GPU hit's blocks were cached (and recorded) before
  if (inserted && policy == HostPolicy::kWriteThroughSelective) {
    const BlockSequence seq = request.hashed_tokens().sequence();
    for (std::size_t i = 0; i < g; ++i) {
      const BlockId b = hit.gpu.blocks[i];
      if (++gpu_hits_[static_cast<std::size_t>(b)] == host_config_.selective_hits) {
        schedule_store(b, seq, i, st, copies_);
      }
    }
  }
  if (h > 0) {
    // One load per hit slot, into the hit part's GPU blocks (open_transfer, counted once). Slab
    // entries come off the free list's back in the order h pops would take them, then new ones
    // (room reserved). Every array is read through a local pointer: the loop's stores cannot
    // make the compiler reload them.
    const BlockId* const gpu = out.new_blocks.data();  // the hit part's h blocks come first
    const std::size_t spare = std::min(h, free_transfers_.size());
    const std::size_t first_new = transfers_.size();
    for (std::size_t k = spare; k < h; ++k) grow_transfers();
    const std::uint32_t* const spare_top = free_transfers_.data() + free_transfers_.size();
    Transfer* const slab = transfers_.data();
    const BlockId* const slots = hit.host_slots.data();
    BlockId* const noted_slot = gpu_host_slot_.data();
    std::uint64_t* const noted_epoch = gpu_host_epoch_.data();
    const std::uint64_t* const slot_epoch = host_slot_epoch_.data();
    RequestState* const state = &st;
    BlockCopy* const loads = out.transfers.plan.loads.data();
    TransferId* const load_ids = out.transfers.load_ids.data();
    for (std::size_t i = 0; i < h; ++i) {
      const BlockId slot = slots[i];
      const BlockId block = gpu[i];
      const auto idx = static_cast<std::uint32_t>(
          i < spare ? spare_top[-1 - static_cast<std::ptrdiff_t>(i)] : first_new + (i - spare));
      Transfer& t = slab[idx];
      t.state = state;
      t.live = true;
      t.kind = Kind::kLoad;
      t.gpu = block;
      t.host = slot;
      t.chain_index = static_cast<std::uint32_t>(i);
      loads[i] = {slot, block};
      load_ids[i] = (static_cast<TransferId>(t.generation) << 32) | idx;
      // The block will hold the slot's (verified) content; kept if the load succeeds.
      const auto b = static_cast<std::size_t>(block);
      noted_slot[b] = slot;
      noted_epoch[b] = slot_epoch[static_cast<std::size_t>(slot)];
    }
    free_transfers_.resize(free_transfers_.size() - spare);
    num_live_ += h;
    st.transfers_in_flight += static_cast<std::uint32_t>(h);
    st.loads_in_flight += static_cast<std::uint32_t>(h);
    st.loading = true;
    st.hit_begin = g;
    st.num_loads = h;
    st.first_failed = h;
    st.cache_upto = std::min((g + h) * bs_ + num_new_tokens, request.num_tokens());
    st.scanned = g;
  } else {
    record_new_blocks(request, st, copies_);
  }
  hand_over_copies(out.transfers);
  return out;
}

inline void TieredKVCacheManager::commit_load(std::size_t idx, Transfer& t, bool ok) {
  RequestState& st = *t.state;
  host_.free_block(t.host);  // unpinned; back at the LRU tail
  if (ok) {
    ++stats_.loaded_blocks;
    stats_.loaded_bytes += host_config_.bytes_per_block;
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
    stats_.loaded_bytes += loads * host_config_.bytes_per_block;
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
    const auto ex = transfer_extra_.find(static_cast<std::uint32_t>(idx));
    const bool first = transfer_first_[idx] != 0;
    const ContentSource extra(ex == transfer_extra_.end() ? nullptr : &ex->second, first ? 0 : 1);
    copy_block_tokens(content_tokens_.data() + bs_, transfer_tokens_.data() + idx * bs_, bs_);
    content_hashes_[0] = transfer_parent_[idx];
    content_hashes_[1] = transfer_hash_[idx];
    const BlockSequence seq = content_sequence(content_tokens_, content_hashes_, first, &extra);
    const std::size_t index = first ? 0 : 1;
    const BlockId twin = host_.match_cached_block_unanchored(seq, index);
    const auto s = static_cast<std::size_t>(t.host);
    if (twin == BlockPool::kNoBlock) {  // a concurrent store of the same block may have won
      const BlockId blocks[2] = {kNullBlockId, t.host};
      host_.cache_full_blocks(
          seq, std::span<const BlockId>(blocks + (first ? 1 : 0), first ? 1 : 2), index, index + 1);
      if (!host_chain_) {  // else the host pool stored the parent hash (the view's block 0)
        host_parent_[s] = first ? BlockHash() : transfer_parent_[idx];
        host_first_[s] = first ? 1 : 0;
      }
      ++host_cached_ever_;
      became_cached = true;
      if (t.kind != Kind::kFill) {
        ++stats_.stored_blocks;
        stats_.stored_bytes += host_config_.bytes_per_block;
      }
    }
  } else {
    ++stats_.store_failures;
  }
  host_.free_block(t.host);  // cached: LRU tail; else reused first
  --host_storing_;
  if (!transfer_extra_.empty()) transfer_extra_.erase(static_cast<std::uint32_t>(idx));
  if (t.state != nullptr) --t.state->transfers_in_flight;
  close_transfer(t, idx);
  return became_cached;
}

std::size_t TieredKVCacheManager::local_prefix_blocks(const Request& request) const {
  manager_.check_owner(request, "TieredKVCacheManager::local_prefix_blocks");
  if (request.num_tokens() == 0) return 0;
  const BlockSequence seq = request.hashed_tokens().sequence();
  const std::size_t max_blocks =
      std::min((request.num_tokens() - 1) / bs_, seq.block_hashes.size());
  std::size_t i = 0;
  const BlockPool& pool = manager_.block_pool();
  while (i < max_blocks && pool.get_cached_block(seq.block_hashes[i]) != BlockPool::kNoBlock) ++i;
  while (i < max_blocks && host_match(seq, i) != BlockPool::kNoBlock) ++i;  // as host_holds
  return i;
}

bool TieredKVCacheManager::host_holds(const Request& request, std::size_t index) const {
  manager_.check_owner(request, "TieredKVCacheManager::host_holds");
  const BlockSequence seq = request.hashed_tokens().sequence();
  if (index >= seq.block_hashes.size()) return false;
  return host_match(seq, index) != BlockPool::kNoBlock;
}

bool TieredKVCacheManager::host_verified(const BlockSequence& seq, std::size_t index,
                                         BlockId slot) const {
  // The verified lookup names this very slot, and the parent hash stored with it matches.
  return index < seq.block_hashes.size() && host_match(seq, index) == slot;
}

std::optional<HostFill> TieredKVCacheManager::begin_fill(const Request& request,
                                                         std::size_t index) {
  manager_.check_owner(request, "TieredKVCacheManager::begin_fill");
  const BlockSequence seq = request.hashed_tokens().sequence();
  if (index >= seq.block_hashes.size() || (index + 1) * bs_ > seq.tokens.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "TieredKVCacheManager::begin_fill: request " + std::to_string(request.id()) +
                    " has no full hashed block " + std::to_string(index));
  }
  std::optional<OwnedExtraKeys> owned = owned_extra_keys(seq, index, mm_scratch_);
  reserve_transfers(1);
  bool evicted = false;  // the slot held a cached block, evicted now
  const std::optional<BlockId> taken = take_host_slot(evicted);
  if (!taken) {
    ++stats_.stores_skipped_full;
    return std::nullopt;
  }
  const BlockId slot = *taken;
  const TransferId id = open_transfer(Kind::kFill, nullptr, kNullBlockId, slot, 0);
  const auto idx = static_cast<std::size_t>(id & kIndexMask);
  std::memcpy(transfer_tokens_.data() + idx * bs_, seq.tokens.data() + index * bs_,
              bs_ * sizeof(TokenId));
  transfer_hash_[idx] = seq.block_hashes[index];
  transfer_parent_[idx] = index == 0 ? BlockHash() : seq.block_hashes[index - 1];
  transfer_first_[idx] = index == 0 ? 1 : 0;
  if (owned) transfer_extra_[static_cast<std::uint32_t>(idx)] = std::move(*owned);
  ++host_storing_;
  if (evicted && hooks_.on_evicted) hooks_.on_evicted(slot);
  return HostFill{id, slot};
}

void TieredKVCacheManager::pin_host_slot(BlockId slot) {
  if (slot < 1 || slot >= host_.num_blocks() || !host_.block(slot).is_cached()) {
    throw Error(ErrorCode::kInvalidArgument, "TieredKVCacheManager::pin_host_slot: slot " +
                                                 std::to_string(slot) + " holds no cached block");
  }
  host_.touch(std::span<const BlockId>(&slot, 1));
  ++host_pins_[static_cast<std::size_t>(slot)];
  ++num_host_pins_;
}

void TieredKVCacheManager::unpin_host_slot(BlockId slot) {
  if (slot < 1 || slot >= host_.num_blocks() || host_pins_[static_cast<std::size_t>(slot)] == 0) {
    throw Error(ErrorCode::kInvalidArgument, "TieredKVCacheManager::unpin_host_slot: slot " +
                                                 std::to_string(slot) + " is not pinned");
  }
  --host_pins_[static_cast<std::size_t>(slot)];
  --num_host_pins_;
  host_.free_block(slot);
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
  LoadResult result;
  result.rolled_back = st.first_failed < st.num_loads;
  const std::size_t valid_blocks = st.hit_begin + st.first_failed;
  result.num_computed_tokens = valid_blocks * bs_;
  const std::size_t bound = 2 * (request.num_tokens() / bs_ + 2);
  reserve_transfers(bound);
  // record_new_blocks stores (write-through), into copies_.
  reserve_copies(0, host_config_.policy == HostPolicy::kWriteThrough ? bound : 0);
  manager_.cache_blocks(request, result.rolled_back ? result.num_computed_tokens : st.cache_upto);
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
  manager_.free(request);
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
  manager_.preempt(request);
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
  std::fill(gpu_hits_.begin(), gpu_hits_.end(), 0u);
  std::fill(gpu_host_slot_.begin(), gpu_host_slot_.end(), 0);
  gpu_extra_.clear();
  ++host_epoch_;  // every host slot lost its content
  host_cached_ever_ = host_.num_evictions();
  return true;
}

TierStats TieredKVCacheManager::stats() const noexcept {
  TierStats s = stats_;
  s.host_evictions = host_.num_evictions();
  s.host_slots_pinned = host_config_.num_host_blocks - host_.num_free_blocks();
  s.host_slots_storing = host_storing_;
  s.host_cached_blocks = host_cached_ever_ - host_.num_evictions();
  return s;
}

void TieredKVCacheManager::check_invariants() const {
  const auto fail = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidState, "TieredKVCacheManager invariant broken: " + what);
  };
  manager_.check_invariants();
  host_.check_invariants();
  const BlockPool& pool = manager_.block_pool();
  std::vector<std::int32_t> host_refs(static_cast<std::size_t>(host_.num_blocks()), 0);
  std::unordered_map<RequestId, std::pair<std::uint32_t, std::uint32_t>> counts;
  // A transfer names its request by state pointer: known only if it is one of requests_'.
  std::unordered_map<const RequestState*, RequestId> owners;
  for (const auto& [id, st] : requests_) {
    if (st.id != id) fail("request " + std::to_string(id) + "'s state names another id");
    owners.emplace(&st, id);
  }
  std::size_t live = 0;
  std::int32_t storing = 0;
  for (const Transfer& t : transfers_) {
    if (!t.live) continue;
    ++live;
    ++host_refs[static_cast<std::size_t>(t.host)];
    if (t.kind == Kind::kFill) {
      ++storing;
      if (host_.block(t.host).is_cached()) fail("a filling host slot is already hit-able");
      continue;
    }
    const auto owner = owners.find(t.state);
    if (owner == owners.end()) fail("a transfer of an unknown request");
    auto& c = counts[owner->second];
    ++c.second;
    const std::span<const BlockId> held = manager_.block_ids(owner->second);
    if (std::find(held.begin(), held.end(), t.gpu) == held.end()) {
      fail("a transfer's GPU block " + std::to_string(t.gpu) + " is not held by its request");
    }
    if (t.kind == Kind::kLoad) {
      ++c.first;
      if (pool.block(t.gpu).is_cached()) fail("a loading GPU block is already hit-able");
      if (!host_.block(t.host).is_cached()) fail("a loading host slot is not cached");
    } else {
      ++storing;
      if (host_.block(t.host).is_cached()) fail("a storing host slot is already hit-able");
    }
  }
  if (live != num_live_) fail("live transfer count");
  if (storing != host_storing_) fail("storing slot count");
  std::uint64_t cached = 0;
  std::int32_t pins = 0;
  for (BlockId s = 1; s < host_.num_blocks(); ++s) {
    const std::uint32_t p = host_pins_[static_cast<std::size_t>(s)];
    pins += static_cast<std::int32_t>(p);
    host_refs[static_cast<std::size_t>(s)] += static_cast<std::int32_t>(p);
    if (p > 0 && !host_.block(s).is_cached()) fail("a pinned host slot is not cached");
    const KVCacheBlock& b = host_.block(s);
    if (b.ref_cnt != host_refs[static_cast<std::size_t>(s)]) {
      fail("host slot " + std::to_string(s) + " has ref " + std::to_string(b.ref_cnt) + " but " +
           std::to_string(host_refs[static_cast<std::size_t>(s)]) +
           " transfers in flight (a slot in use is free-queued or pinned)");
    }
    if (b.is_cached()) {
      ++cached;
      if (!host_chain_ && host_first_[static_cast<std::size_t>(s)] == 0 &&
          host_parent_[static_cast<std::size_t>(s)].empty()) {
        fail("cached host slot " + std::to_string(s) + " has no parent hash");
      }
    }
  }
  if (cached != host_cached_ever_ - host_.num_evictions()) fail("host cached block count");
  if (pins != num_host_pins_) fail("host pin count");
  for (const auto& [id, st] : requests_) {
    const auto c = counts.find(id);
    const std::uint32_t loads = c == counts.end() ? 0 : c->second.first;
    const std::uint32_t all = c == counts.end() ? 0 : c->second.second;
    if (st.loads_in_flight != loads || st.transfers_in_flight != all) {
      fail("request " + std::to_string(id) + "'s in-flight counts");
    }
    if (st.loads_in_flight > 0 && !st.loading) fail("loads in flight of a finished request");
  }
  for (const auto& [id, c] : counts) {
    if (requests_.find(id) == requests_.end()) fail("a transfer of an unknown request");
  }
  if (!evicted_.empty()) fail("evictions left unprocessed");
  for (BlockId b = 1; b < pool.num_blocks(); ++b) {
    if (!own_records_) break;
    const KVCacheBlock& blk = pool.block(b);
    const BlockHash& rec = gpu_hash_[static_cast<std::size_t>(b)];
    if (blk.is_cached() != !rec.empty() || (blk.is_cached() && blk.block_hash != rec)) {
      fail("GPU block " + std::to_string(b) + "'s recorded content differs from the pool's");
    }
  }
  for (const auto& [b, keys] : gpu_extra_) {
    if (!pool.block(b).is_cached()) fail("extra keys of a GPU block not cached");
  }
  // A remembered host slot (host_has and on_evict trust it without a lookup) must be the one a
  // verified lookup of the GPU block's content finds.
  std::vector<TokenId> tokens(2 * static_cast<std::size_t>(bs_), 0);
  for (BlockId b = 1; b < pool.num_blocks(); ++b) {
    const auto k = static_cast<std::size_t>(b);
    const BlockId slot = gpu_host_slot_[k];
    if (!pool.block(b).is_cached() || !remembered_valid(k)) continue;
    BlockHash hashes[2];
    bool first = false;
    if (own_records_) {
      std::memcpy(tokens.data() + bs_, gpu_tokens_.data() + k * bs_, bs_ * sizeof(TokenId));
      hashes[0] = gpu_parent_[k];
      hashes[1] = gpu_hash_[k];
      first = gpu_first_[k] != 0;
    } else {
      std::memcpy(tokens.data() + bs_, pool.stored_tokens(b), bs_ * sizeof(TokenId));
      hashes[0] = pool.stored_parent_hash(b);
      hashes[1] = pool.block(b).block_hash;
      first = hashes[0].empty();
    }
    const auto ex = gpu_extra_.find(b);
    const ContentSource extra(ex == gpu_extra_.end() ? nullptr : &ex->second, first ? 0 : 1);
    const BlockSequence seq = content_sequence(tokens, hashes, first, &extra);
    if (!host_verified(seq, first ? 0 : 1, slot)) {
      fail("GPU block " + std::to_string(b) + " remembers host slot " + std::to_string(slot) +
           ", which does not hold its content");
    }
  }
}

TieredSnapshot TieredKVCacheManager::snapshot() const {
  TieredSnapshot s;
  s.gpu = manager_.snapshot();
  s.host = host_.snapshot();
  for (std::size_t i = 0; i < transfers_.size(); ++i) {
    if (transfers_[i].live) {
      s.live_transfers.push_back((static_cast<std::uint64_t>(transfers_[i].generation) << 32) | i);
    }
  }
  s.next_event_seq = next_event_seq_;
  s.requests = stats_.requests;
  s.queried_tokens = stats_.queried_tokens;
  s.gpu_hit_tokens = stats_.gpu_hit_tokens;
  s.host_hit_tokens = stats_.host_hit_tokens;
  return s;
}

}  // namespace pagedkv
