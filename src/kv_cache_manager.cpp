#include "pagedkv/kv_cache_manager.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "pagedkv/error.hpp"

namespace pagedkv {

namespace {

BlockHasher make_hasher(const KVCacheManagerConfig& config) {
  if (config.hasher) return *config.hasher;
  if (config.hash_scheme == HashScheme::kXxh3_128 && !config.verify_cache_hits) {
    throw Error(ErrorCode::kInvalidArgument,
                "KVCacheManager: xxh3_128 is not collision resistant, so verify_cache_hits "
                "cannot be turned off with it");
  }
  return config.hash_seed ? BlockHasher(config.hash_scheme, *config.hash_seed)
                          : BlockHasher(config.hash_scheme);
}

BlockPoolConfig pool_config(const KVCacheManagerConfig& config) {
  BlockPoolConfig p;
  p.num_blocks = config.num_blocks;
  p.block_size = config.block_size;
  p.enable_caching = config.enable_caching;
  p.verify_cache_hits = config.verify_cache_hits;
  p.enable_kv_events = config.enable_kv_events;
  return p;
}

std::string request_text(const Request& r) {
  return "request " + std::to_string(r.id());
}

std::size_t cdiv(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

}  // namespace

KVCacheManager::KVCacheManager(const KVCacheManagerConfig& config)
    : hasher_(make_hasher(config)),
      pool_(pool_config(config)),
      stats_(config.stats_window),
      max_model_len_(config.max_model_len) {}

Request KVCacheManager::make_request(RequestId id, std::span<const TokenId> prompt,
                                     RequestHashKeys keys) const {
  return Request(id, hasher_, pool_.block_size(), prompt, std::move(keys));
}

void KVCacheManager::check_hashing(const Request& request) const {
  const RequestBlockHasher& seq = request.hashed_tokens();
  if (seq.block_size() != pool_.block_size() || !(seq.hasher() == hasher_)) {
    throw Error(ErrorCode::kInvalidArgument,
                request_text(request) +
                    " is hashed with a different block size, scheme or seed than this manager "
                    "(create requests with KVCacheManager::make_request)");
  }
}

CacheHit KVCacheManager::get_computed_blocks(const Request& request) {
  if (request.is_finished()) {
    throw Error(ErrorCode::kInvalidState,
                "get_computed_blocks: " + request_text(request) + " was already freed");
  }
  check_hashing(request);
  CacheHit hit;
  if (!pool_.config().enable_caching || request.skip_reading_prefix_cache) return hit;

  // The last token is always recomputed: the model needs it to produce logits.
  const std::size_t max_hit_tokens = request.num_tokens() == 0 ? 0 : request.num_tokens() - 1;
  const std::size_t max_blocks =
      std::min(max_hit_tokens / pool_.block_size(), request.block_hashes().size());
  BlockId parent = BlockPool::kNoBlock;
  constexpr std::size_t kPrefetchDistance = 8;
  const auto hashes = request.block_hashes();
  for (std::size_t i = 0; i < std::min(kPrefetchDistance, max_blocks); ++i) {
    pool_.prefetch_cached_block(hashes[i]);
  }
  for (std::size_t i = 0; i < max_blocks; ++i) {
    if (i + kPrefetchDistance < max_blocks)
      pool_.prefetch_cached_block(hashes[i + kPrefetchDistance]);
    const BlockId b = pool_.match_cached_block(request.hashed_tokens(), i, parent);
    if (b == BlockPool::kNoBlock) break;
    hit.blocks.push_back(b);
    parent = b;
  }
  hit.num_tokens = hit.blocks.size() * pool_.block_size();
  stats_.record(request.num_tokens(), hit.num_tokens);
  return hit;
}

std::optional<std::span<const BlockId>> KVCacheManager::allocate_slots(
    Request& request, std::size_t num_new_tokens, const CacheHit& hit,
    std::size_t num_lookahead_tokens) {
  const std::string where = "allocate_slots: " + request_text(request) + ": ";
  if (request.is_finished()) {
    throw Error(ErrorCode::kInvalidState, where + "it was already freed");
  }
  if (num_new_tokens == 0) {
    throw Error(ErrorCode::kInvalidArgument, where + "num_new_tokens must be greater than 0");
  }
  check_hashing(request);
  const std::size_t bs = pool_.block_size();
  const auto it = requests_.find(request.id());
  const std::size_t held = it == requests_.end() ? 0 : it->second.blocks.size();
  if (!hit.blocks.empty() && held != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                where + "a cache hit can only be passed to the first allocation");
  }
  if (hit.num_tokens != hit.blocks.size() * bs) {
    throw Error(ErrorCode::kInvalidArgument,
                where + "the hit's num_tokens " + std::to_string(hit.num_tokens) +
                    " != " + std::to_string(hit.blocks.size()) + " blocks x block size");
  }
  if (!hit.blocks.empty() && request.num_computed_tokens() != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                where + "a cache hit needs a request with no computed tokens");
  }
  for (std::size_t i = 0; i < hit.blocks.size(); ++i) {
    const KVCacheBlock& b = pool_.block(hit.blocks[i]);  // throws when out of range
    if (i >= request.block_hashes().size() || b.block_hash != request.block_hashes()[i]) {
      throw Error(ErrorCode::kInvalidArgument,
                  where + "stale cache hit: block " + std::to_string(b.block_id) +
                      " no longer caches the request's block " + std::to_string(i) +
                      " (call allocate_slots right after get_computed_blocks)");
    }
  }
  const std::size_t num_computed = request.num_computed_tokens() + hit.num_tokens;
  if (num_computed + num_new_tokens > request.num_tokens()) {
    throw Error(ErrorCode::kOutOfRange, where + std::to_string(num_computed) + " computed + " +
                                            std::to_string(num_new_tokens) +
                                            " new tokens exceed its " +
                                            std::to_string(request.num_tokens()) + " known tokens");
  }

  std::size_t need_slots = num_computed + num_new_tokens + num_lookahead_tokens;
  if (max_model_len_)
    need_slots = std::min(need_slots, std::max(*max_model_len_, num_computed + num_new_tokens));
  const std::size_t have = held + hit.blocks.size();
  const std::size_t required = cdiv(need_slots, bs);
  const std::size_t to_allocate = required > have ? required - have : 0;
  // Touching a hit that sits in the free queue consumes free capacity too.
  std::size_t evictable_hits = 0;
  for (const BlockId b : hit.blocks) evictable_hits += pool_.block(b).ref_cnt == 0 ? 1 : 0;
  if (to_allocate + evictable_hits > static_cast<std::size_t>(pool_.num_free_blocks())) {
    return std::nullopt;
  }

  RequestBlocks& state = requests_[request.id()];  // may allocate: before any pool change
  state.blocks.reserve(have + to_allocate);
  pool_.touch(hit.blocks);
  state.blocks.insert(state.blocks.end(), hit.blocks.begin(), hit.blocks.end());
  if (held == 0) state.num_cached_blocks = hit.blocks.size();
  const std::size_t first_new = state.blocks.size();
  pool_.get_new_blocks(static_cast<std::int32_t>(to_allocate), state.blocks);

  if (pool_.config().enable_caching) {
    // Cache every full block of known tokens; lookahead (draft) slots are never cached.
    const std::size_t num_full = std::min(num_computed + num_new_tokens, request.num_tokens()) / bs;
    if (num_full > state.num_cached_blocks) {
      pool_.cache_full_blocks(request.hashed_tokens(), state.blocks, state.num_cached_blocks,
                              num_full);
      state.num_cached_blocks = num_full;
    }
  }
  return std::span<const BlockId>(state.blocks).subspan(first_new);
}

void KVCacheManager::release(Request& request, const char* what) {
  if (request.is_finished()) {
    throw Error(ErrorCode::kInvalidState,
                std::string(what) + ": " + request_text(request) + " was already freed");
  }
  const auto it = requests_.find(request.id());
  if (it == requests_.end()) {
    throw Error(ErrorCode::kNotFound, std::string(what) + ": " + request_text(request) +
                                          " holds no blocks (unknown to this manager)");
  }
  free_scratch_.assign(it->second.blocks.rbegin(), it->second.blocks.rend());  // tail first
  pool_.free_blocks(free_scratch_);
  requests_.erase(it);
}

void KVCacheManager::free(Request& request) {
  release(request, "free");
  request.finished_ = true;
}

void KVCacheManager::preempt(Request& request) {
  release(request, "preempt");
  request.num_computed_tokens_ = 0;
}

std::span<const BlockId> KVCacheManager::block_ids(RequestId id) const {
  const auto it = requests_.find(id);
  if (it == requests_.end()) {
    throw Error(ErrorCode::kNotFound, "block_ids: request " + std::to_string(id) + " is unknown");
  }
  return it->second.blocks;
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
  stats_.reset();
  return true;
}

void KVCacheManager::check_invariants() const {
  pool_.check_invariants();
  std::vector<std::int32_t> holders(static_cast<std::size_t>(pool_.num_blocks()), 0);
  for (const auto& [id, state] : requests_) {
    if (state.num_cached_blocks > state.blocks.size()) {
      throw Error(ErrorCode::kInvalidState, "KVCacheManager invariant broken: request " +
                                                std::to_string(id) +
                                                " has more cached than held blocks");
    }
    for (const BlockId b : state.blocks) {
      if (b != kNullBlockId) ++holders[static_cast<std::size_t>(b)];
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
    s.request_blocks.emplace_back(id, state.blocks);
    s.num_cached_blocks.emplace_back(id, state.num_cached_blocks);
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
