#include "pagedkv/pool/block_pool.hpp"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "../base/vector_growth.hpp"
#include "block_pool_internal.hpp"
#include "pagedkv/base/error.hpp"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace pagedkv {

namespace {

TableVector<KVCacheBlock> make_blocks(const BlockPoolConfig& config) {
  if (config.num_blocks < 2) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockPool: num_blocks must be at least 2 (the null block plus one usable block), "
                "got " +
                    std::to_string(config.num_blocks));
  }
  if (config.block_size == 0) {
    throw Error(ErrorCode::kInvalidArgument, "BlockPool: block_size must be at least 1");
  }
  if (!(config.max_retained_fraction >= 0.0 && config.max_retained_fraction <= 1.0)) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockPool: max_retained_fraction must be within 0..1, got " +
                    std::to_string(config.max_retained_fraction));
  }
  if (static_cast<std::uint8_t>(config.eviction_policy) >= kNumEvictionPolicies) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockPool: unknown eviction policy " +
                    std::to_string(static_cast<int>(config.eviction_policy)));
  }
  if (config.lineage_key_depth > kMaxLineageKeyDepth) {
    throw Error(ErrorCode::kInvalidArgument, "BlockPool: lineage_key_depth must be at most " +
                                                 std::to_string(kMaxLineageKeyDepth) + ", got " +
                                                 std::to_string(config.lineage_key_depth));
  }
  if (config.adaptive_ghost_sample_shift < -1 ||
      config.adaptive_ghost_sample_shift > kAdaptiveGhostMaxSampleShift) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockPool: adaptive_ghost_sample_shift must be -1 (chosen by the pool's size) "
                "or 0 .. " +
                    std::to_string(kAdaptiveGhostMaxSampleShift) + ", got " +
                    std::to_string(config.adaptive_ghost_sample_shift));
  }
  TableVector<KVCacheBlock> blocks(static_cast<std::size_t>(config.num_blocks));
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].block_id = static_cast<BlockId>(i);
  blocks[kNullBlockId].is_null = true;
  return blocks;
}

}  // namespace

void BlockPool::throw_double_free(BlockId id) {
  throw Error(ErrorCode::kInvalidState, "BlockPool::free_blocks: " + id_text(id) +
                                            " is already free (ref count 0): double free");
}

namespace {

// Stored tokens of a large pool are written with non-temporal stores: a whole line is written
// without reading it from memory first, and it is not kept in cache. A large pool's lines are
// rarely in cache when a block is cached and rarely still there when it is hit, so the read
// saved is a memory access per cached block; a small pool keeps ordinary stores (its hits find
// the lines in cache). "Large": a token table of 1 MiB or more, the table allocator's bound for
// huge pages (such tables are 2 MiB-aligned, so each block's tokens are whole lines). A call
// that caches fewer than kStreamTokensMinBlocks blocks uses ordinary stores: its fence, which
// waits for the streamed lines, would cost more than the reads it saves.
#if defined(__SSE2__)
constexpr bool kCanStreamTokens = true;
// Copies `n` tokens (a multiple of 16: whole 64-byte lines) to the line-aligned `to`.
inline void stream_block_tokens(TokenId* to, const TokenId* from, std::uint32_t n) noexcept {
  auto* dst = reinterpret_cast<__m128i*>(to);
  const auto* src = reinterpret_cast<const __m128i*>(from);
  if (n == 16) {  // the usual block: one line, four stores and no loop
    _mm_stream_si128(dst, _mm_loadu_si128(src));
    _mm_stream_si128(dst + 1, _mm_loadu_si128(src + 1));
    _mm_stream_si128(dst + 2, _mm_loadu_si128(src + 2));
    _mm_stream_si128(dst + 3, _mm_loadu_si128(src + 3));
    return;
  }
  for (std::uint32_t w = 0; w < n / 4; ++w) _mm_stream_si128(dst + w, _mm_loadu_si128(src + w));
}
// Non-temporal stores are weakly ordered: a fence orders them before the stores that follow
// (and so before whatever publishes the pool to another thread).
inline void stream_fence() noexcept {
  _mm_sfence();
}
#else
constexpr bool kCanStreamTokens = false;
inline void stream_block_tokens(TokenId*, const TokenId*, std::uint32_t) noexcept {}
inline void stream_fence() noexcept {}
#endif
constexpr std::size_t kStreamTokensMinBytes = std::size_t{1} << 20;
// Blocks a commit_store() call must cache to stream them (one fence per call).
constexpr std::size_t kStreamTokensMinBlocks = 8;
// Look-ahead distances, in blocks, of the store's and the eviction's prefetches (tuned on the
// Mooncake replay; bench/results/pool_hash_speed.md, seventh pass).
constexpr std::size_t kStoreAhead = 16;
constexpr std::int32_t kEvictAhead = 8;

}  // namespace

BlockPool::PendingStore::PendingStore(PendingStore&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      resets_(other.resets_),
      seq_(other.seq_),
      first_(other.first_),
      last_(other.last_),
      group_(other.group_),
      content_ids_(std::move(other.content_ids_)),
      event_(std::move(other.event_)),
      parent_link_(other.parent_link_),
      parent_gen_(other.parent_gen_),
      parent_held_(std::exchange(other.parent_held_, false)),
      refused_(other.refused_) {}

BlockPool::PendingStore& BlockPool::PendingStore::operator=(PendingStore&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::exchange(other.pool_, nullptr);
    resets_ = other.resets_;
    seq_ = other.seq_;
    first_ = other.first_;
    last_ = other.last_;
    group_ = other.group_;
    content_ids_ = std::move(other.content_ids_);
    event_ = std::move(other.event_);
    parent_link_ = other.parent_link_;
    parent_gen_ = other.parent_gen_;
    parent_held_ = std::exchange(other.parent_held_, false);
    refused_ = other.refused_;
  }
  return *this;
}

BlockPool::PendingStore::~PendingStore() {
  release();
}

void BlockPool::PendingStore::release() noexcept {
  if (pool_ != nullptr && pool_->resets_ != resets_) {
    pool_ = nullptr;  // stale: the reset dropped every reference this store held
    parent_held_ = false;
  }
  if (pool_ != nullptr && parent_held_) {
    pool_->release_parent(parent_link_, parent_gen_, seq_.block_hashes[first_ - 1], group_);
  }
  parent_held_ = false;
  if (pool_ != nullptr) {
    // Newest first, so a chain is released child before parent.
    for (auto it = content_ids_.rbegin(); it != content_ids_.rend(); ++it) {
      if (pool_->chain_identity_) {
        pool_->extra_keys_->release(*it);
      } else {
        pool_->release_content(*it);
      }
    }
  }
  content_ids_.clear();
  pool_ = nullptr;
}

BlockPool::BlockPool(const BlockPoolConfig& config)
    : config_(config),
      blocks_(make_blocks(config)),
      free_queue_(config.num_blocks, 1),
      hash_map_(
          std::span<const KVCacheBlock>(blocks_.data(), config.enable_caching ? blocks_.size() : 0),
          kMapSlotsPerBlock),
      extra_keys_(std::make_unique<ExtraKeyTable>()) {
  const std::size_t n = blocks_.size();
  if (config_.enable_caching && config_.verify_cache_hits) {
    verifying_ = true;
    if (config_.chain_hashes_identify_prefix || config_.guard_chain_hashes) {
      chain_identity_ = true;
      if (!config_.chain_hashes_identify_prefix) {
        guarded_ = true;
        guards_.assign(n, Guard{});
        orphans_ = std::make_unique<OrphanTable>(config_.block_size);
      }
      stored_.assign(n, Stored{});
      block_tokens_.resize(n * config_.block_size);
      stream_tokens_ = kCanStreamTokens && config_.block_size % 16 == 0 &&
                       block_tokens_.size() * sizeof(TokenId) >= kStreamTokensMinBytes &&
                       reinterpret_cast<std::uintptr_t>(block_tokens_.data()) % 64 == 0;
    } else {
      // One entry per cacheable block (ids start at 1): enough unless cached blocks outlive
      // evicted ancestors, or stores are prepared before the blocks they replace are evicted.
      contents_ = std::make_unique<ContentTable>(config_.block_size, n);
    }
  }
  // free_blocks() never allocates: a call queues each block at most once.
  if (config_.eviction_policy != EvictionPolicy::kLru) ret_enable();
}

BlockPool::~BlockPool() = default;

double BlockPool::usage() const noexcept {
  return 1.0 - static_cast<double>(num_free_blocks()) / (config_.num_blocks - 1);
}

void BlockPool::throw_out_of_range(BlockId id) const {
  throw Error(ErrorCode::kOutOfRange, "BlockPool: " + id_text(id) + " is out of range [0, " +
                                          std::to_string(config_.num_blocks) + ")");
}

[[gnu::always_inline]] inline void BlockPool::evict_cached(BlockId id) noexcept {
  const KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
  evict_cached(id, BlockHashMap::key_tag(b.block_hash, b.group_id));
}

[[gnu::always_inline]] inline void BlockPool::evict_cached(BlockId id, std::uint32_t tag) noexcept {
  KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
  if (observer_ != nullptr) observer_->on_evict(*this, id);
  hash_map_.erase_tagged(id, tag);
  if (config_.enable_kv_events) record_removed(b.block_hash, b.group_id);
  if (guarded_) {
    Guard& g = guards_[static_cast<std::size_t>(id)];
    if (g.children == 0) [[likely]] {
      // The usual eviction (a chain's tail): one child fewer at its parent's record.
      release_link(id);
      if (const std::uint32_t eid = b.content_id & kExtraIdMask; eid != 0) {
        extra_keys_->release(eid);
      }
    } else {
      evict_guarded(id);  // becomes (or joins) an orphan
      g.children = 0;
    }
    ++g.gen;  // links to this block now resolve to the orphan (or nothing)
    b.content_id = 0;
  } else if (chain_identity_) {
    // The stored parent hash stays (stale, never read; the next store overwrites it): clearing
    // it cost a write to one more random line per eviction.
    if (const std::uint32_t eid = b.content_id & kExtraIdMask; eid != 0) extra_keys_->release(eid);
    b.content_id = 0;
  } else if (verifying()) {
    release_content(b.content_id);
    b.content_id = 0;
  }
  b.block_hash = BlockHash();
  b.group_id = 0;
  ++num_evictions_;
}

// Starts loading what evicting block id (if cached) reads: its map slot and, in a pool with
// content ids, the content entry it releases with that entry's index slot; a guarded pool's
// child count and link (the parent's usually is the next eviction's own).
[[gnu::always_inline]] inline std::uint32_t BlockPool::prefetch_eviction(
    BlockId id) const noexcept {
  const KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
  if (!b.is_cached()) return 0;
  const std::uint32_t tag = BlockHashMap::key_tag(b.block_hash, b.group_id);
  hash_map_.prefetch_tagged(tag);
  if (guarded_) __builtin_prefetch(&guards_[static_cast<std::size_t>(id)], 1);
  if (!chain_identity_ && verifying()) {
    __builtin_prefetch(contents_->entry(b.content_id), 1);
    contents_->prefetch(ContentTable::tag_of(b.block_hash));
  }
  return tag;
}

// For the retention paths (another translation unit): evicts the cached ones of `ids` and sets
// every ref count to 1. Prefetches as get_new_blocks() does: block records 2 x kEvictAhead ahead,
// what an eviction reads kEvictAhead ahead.
[[gnu::noinline]] void BlockPool::take_popped(std::span<const BlockId> ids) noexcept {
  constexpr std::size_t kAhead = static_cast<std::size_t>(kEvictAhead);
  constexpr std::size_t kTagRing = 16;  // a power of two above kEvictAhead
  static_assert(kTagRing > kAhead);
  std::uint32_t tags[kTagRing];
  const std::size_t n = ids.size();
  for (std::size_t k = 0; k < std::min(n, 2 * kAhead); ++k) {
    __builtin_prefetch(&blocks_[static_cast<std::size_t>(ids[k])]);
  }
  for (std::size_t k = 0; k < std::min(n, kAhead); ++k)
    tags[k % kTagRing] = prefetch_eviction(ids[k]);
  for (std::size_t i = 0; i < n; ++i) {
    if (i + 2 * kAhead < n)
      __builtin_prefetch(&blocks_[static_cast<std::size_t>(ids[i + 2 * kAhead])]);
    if (i + kAhead < n) tags[(i + kAhead) % kTagRing] = prefetch_eviction(ids[i + kAhead]);
    const BlockId id = ids[i];
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.is_cached()) evict_cached(id, tags[i % kTagRing]);
    b.ref_cnt = 1;
  }
}

bool BlockPool::get_new_blocks(std::int32_t n, std::vector<BlockId>& out) {
  if (n < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockPool::get_new_blocks: negative block count " + std::to_string(n));
  }
  if (ret_ != nullptr) [[unlikely]] {
    return ret_get_new_blocks(n, out);
  }
  if (n > free_queue_.size()) return false;
  if (n == 0) return true;  // a decode step that needs no new block
  // Everything that may allocate, before any change.
  detail::reserve_more(out, static_cast<std::size_t>(n));
  if (config_.enable_kv_events) reserve_events(static_cast<std::size_t>(n), 0);
  if (guarded_) orphans_->reserve(static_cast<std::size_t>(n));  // an eviction makes <= 1
  // The blocks to pop are the queue's first n. For more than a few, two walkers run ahead of the
  // pops: `far` loads a block's record 2 x kEvictAhead pops ahead, `near` reads it kEvictAhead
  // pops ahead and loads what its eviction will read (map slot, content entry), so an eviction
  // finds its data in cache. A decode step's block or a few need no look-ahead.
  const bool ahead = n > 2 * kEvictAhead;
  BlockId far = free_queue_.front(), near = far;
  std::int32_t far_left = ahead ? n : 0, near_left = far_left;
  const auto step_far = [&] {
    if (far_left == 0) return;
    __builtin_prefetch(&blocks_[static_cast<std::size_t>(far)]);
    far = free_queue_.next(far);
    --far_left;
  };
  // The map tags the near walker computed, by pop index (kept until the pop).
  constexpr std::int32_t kTagRing = 16;  // a power of two above kEvictAhead
  static_assert(kTagRing > kEvictAhead);
  std::uint32_t tags[kTagRing];
  std::int32_t near_index = 0;
  const auto step_near = [&] {
    if (near_left == 0) return;
    tags[near_index++ % kTagRing] = prefetch_eviction(near);
    near = free_queue_.next(near);
    --near_left;
  };
  if (ahead) {
    for (std::int32_t k = 0; k < 2 * kEvictAhead; ++k) step_far();
    for (std::int32_t k = 0; k < kEvictAhead; ++k) step_near();
  }
  for (std::int32_t i = 0; i < n; ++i) {
    step_far();
    step_near();
    const BlockId id = free_queue_.popleft();
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.is_cached()) {
      if (ahead) {
        evict_cached(id, tags[i % kTagRing]);
      } else {
        evict_cached(id);
      }
    }
    b.ref_cnt = 1;
    out.push_back(id);  // reserved above: cannot throw
  }
  if (!events_.empty()) deliver_events();
  return true;
}

void BlockPool::touch(std::span<const BlockId> ids) {
  for (const BlockId id : ids) (void)block(id);  // validate every id first
  if (ret_ != nullptr) [[unlikely]] {
    ret_touch(ids);
    return;
  }
  for (const BlockId id : ids) {
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.is_null) continue;
    if (b.ref_cnt == 0) free_queue_.remove(id);
    ++b.ref_cnt;
  }
}

// The change of a free: a pass in order drops one reference per appearance (undoing the
// checking pass's marks when kMarked) and puts hashed blocks reaching ref 0 at the tail in order;
// a pass in reverse puts unhashed ones reaching ref 0 at the head, so they lie there as a group
// in the given order. No scratch memory.
template <bool kReverse, bool kMarked>
[[gnu::always_inline]] inline void BlockPool::release_in(std::span<const BlockId> given) noexcept {
  if (ret_ != nullptr) [[unlikely]] {
    ret_release(given, kReverse, kMarked);
    return;
  }
  const std::size_t count = given.size();
  const auto ordered = [given, count](std::size_t k) {
    return given[kReverse ? count - 1 - k : k];
  };
  std::size_t first_unhashed = count, end_unhashed = 0;  // the range to pass again
  {
    FreeBlockQueue::Appender tail(free_queue_);  // tail and count in registers
    KVCacheBlock* const records = blocks_.data();
    for (std::size_t k = 0; k < count; ++k) {
      const BlockId id = ordered(k);
      assert(static_cast<std::uint32_t>(id) < static_cast<std::uint32_t>(config_.num_blocks));
      KVCacheBlock& b = records[static_cast<std::size_t>(id)];
      if (b.is_null) continue;
      assert(kMarked ? b.ref_cnt < 0 : b.ref_cnt > 0);
      b.ref_cnt = kMarked ? -b.ref_cnt - 1 : b.ref_cnt - 1;
      if (b.ref_cnt == 0) {
        if (b.is_cached()) {
          tail.add(id);
        } else {
          first_unhashed = std::min(first_unhashed, k);
          end_unhashed = k + 1;
        }
      }
    }
  }
  for (std::size_t k = end_unhashed; k-- > first_unhashed;) {
    const BlockId id = ordered(k);
    const KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    // Every uncached block at ref 0 here reached it in this call (each id appears once).
    if (!b.is_null && b.ref_cnt == 0 && !b.is_cached()) {
      assert(!free_queue_.contains(id));
      free_queue_.prepend(id);
    }
  }
}

void BlockPool::free_blocks(std::span<const BlockId> ordered) {
  free_blocks_in<false>(ordered);
}

void BlockPool::free_blocks_reversed(std::span<const BlockId> blocks) {
  free_blocks_in<true>(blocks);
}

// free_blocks() of `given` in its order (kReverse false) or reversed, without a reversed copy.
template <bool kReverse>
void BlockPool::free_blocks_in(std::span<const BlockId> given) {
  const std::size_t count = given.size();
  const auto ordered = [given, count](std::size_t k) {
    return given[kReverse ? count - 1 - k : k];
  };
  if (count == 1) {  // one block: no duplicate to look for
    free_block(ordered(0));
    return;
  }
  // Validate without side effects: a block being freed has ref > 0, so flipping its sign marks
  // it as seen in this call (a second sighting is a duplicate); the marks are undone below.
  auto unmark = [&](std::size_t seen) {
    for (std::size_t k = 0; k < seen; ++k) {
      KVCacheBlock& b = blocks_[static_cast<std::size_t>(ordered(k))];
      if (b.ref_cnt < 0) b.ref_cnt = -b.ref_cnt;
    }
  };
  for (std::size_t k = 0; k < count; ++k) {
    const BlockId id = ordered(k);
    if (static_cast<std::uint32_t>(id) >= static_cast<std::uint32_t>(config_.num_blocks)) {
      unmark(k);
      throw_out_of_range(id);
    }
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.is_null) continue;
    if (b.ref_cnt <= 0) {
      const bool duplicate = b.ref_cnt < 0;
      unmark(k);
      if (duplicate) {
        throw Error(ErrorCode::kInvalidArgument,
                    "BlockPool::free_blocks: " + id_text(id) + " appears twice in one call");
      }
      throw_double_free(id);
    }
    b.ref_cnt = -b.ref_cnt;
  }
  release_in<kReverse, true>(given);
}

void BlockPool::release_table(std::span<const BlockId> table) noexcept {
  release_in<true, false>(table);
}

void BlockPool::validate_sequence(const BlockSequence& seq, std::size_t last,
                                  const char* where) const {
  if (seq.block_size == 0 || seq.block_size > config_.block_size) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(where) + ": the sequence is hashed with block size " +
                    std::to_string(seq.block_size) + ", not within the pool's 1.." +
                    std::to_string(config_.block_size));
  }
  if (last > seq.block_hashes.size() || last > seq.tokens.size() / seq.block_size) {
    throw Error(ErrorCode::kOutOfRange,
                std::string(where) + ": block " + std::to_string(last) + " is beyond the " +
                    std::to_string(seq.block_hashes.size()) + " hashes and " +
                    std::to_string(seq.tokens.size()) + " tokens of the sequence");
  }
}

inline void BlockPool::check_sequence(const BlockSequence& seq, std::size_t last,
                                      const char* where) const {
  std::size_t end_token = 0;  // a multiply, not validate_sequence's division
  if (seq.block_size == 0 || seq.block_size > config_.block_size ||
      __builtin_mul_overflow(last, std::size_t{seq.block_size}, &end_token) ||
      end_token > seq.tokens.size()) [[unlikely]] {
    validate_sequence(seq, last, where);  // throws
  }
}

void BlockPool::cache_full_blocks(const BlockSequence& seq, std::span<const BlockId> blocks,
                                  std::size_t num_cached_blocks, std::size_t num_full_blocks,
                                  GroupId group) {
  // Built only when an error is thrown: this runs at every allocation that fills a block.
  const auto where = [] { return std::string("BlockPool::cache_full_blocks: "); };
  if (num_cached_blocks > num_full_blocks || num_full_blocks > blocks.size()) {
    throw Error(ErrorCode::kOutOfRange, where() + "blocks [" + std::to_string(num_cached_blocks) +
                                            ", " + std::to_string(num_full_blocks) +
                                            ") are not within the request's " +
                                            std::to_string(blocks.size()) + " blocks");
  }
  validate_sequence(seq, num_full_blocks, "BlockPool::cache_full_blocks");
  const auto range = blocks.subspan(num_cached_blocks, num_full_blocks - num_cached_blocks);
  commit_store(prepare_store(seq, num_cached_blocks, num_full_blocks,
                             blocks.subspan(0, num_cached_blocks), group),
               range);
}

BlockPool::PendingStore BlockPool::prepare_store(const BlockSequence& seq, std::size_t first,
                                                 std::size_t last,
                                                 std::span<const BlockId> prefix_row,
                                                 GroupId group) {
  if (first > last) {
    throw Error(ErrorCode::kOutOfRange, "BlockPool::prepare_store: first block " +
                                            std::to_string(first) + " > last " +
                                            std::to_string(last));
  }
  validate_sequence(seq, last, "BlockPool::prepare_store");
  if (prefix_row.size() > first) {
    throw Error(ErrorCode::kOutOfRange,
                "BlockPool::prepare_store: " + std::to_string(prefix_row.size()) +
                    " prefix blocks before block " + std::to_string(first));
  }
  PendingStore st;
  st.resets_ = resets_;
  st.seq_ = seq;
  st.first_ = first;
  st.last_ = last;
  st.group_ = group;
  if (!config_.enable_caching || first == last) return st;
  if (guarded_ && seq.block_size != config_.block_size) {
    // A guard compares whole stored blocks: shorter ones would leave stale tokens in the compare.
    throw Error(ErrorCode::kInvalidArgument,
                "BlockPool::prepare_store: a pool with guard_chain_hashes stores blocks of its own "
                "size " +
                    std::to_string(config_.block_size) + ", not " + std::to_string(seq.block_size));
  }
  const std::size_t n = last - first;
  const std::uint32_t bs = seq.block_size;
  const auto hashes = seq.block_hashes;
  st.content_ids_ = std::move(spare_content_ids_);  // empty; its capacity is reused
  if (chain_identity_) {
    st.content_ids_.reserve(n);
    st.pool_ = this;  // from here on, st releases the extra keys it acquired if we throw
    if (seq.extra_keys == nullptr) {  // no block has extra keys
      st.content_ids_.resize(n, 0);   // reserved: cannot throw
    } else {
      for (std::size_t i = first; i < last; ++i) {
        const std::uint32_t eid = encode_block_extra_keys(seq, i, store_scratch_)
                                      ? extra_keys_->acquire(store_scratch_.extra)
                                      : 0;
        st.content_ids_.push_back(eid);  // reserved: cannot throw, so the reference is kept
      }
    }
    if (guarded_ && first > 0) acquire_guarded_parent(st, seq, prefix_row);
  } else if (verifying()) {
    // The nearest cached block of the prefix names its prefix's content id. Usually that is the
    // parent itself; otherwise (evicted, or skipped by a window) the blocks after it are chained
    // from seq's own material through the table. A block caching other content than seq's
    // block there (its hash and group, as a guarded pool checks) is no parent: unknown.
    std::uint32_t parent = 0;  // the root: chain from seq's block 0
    std::size_t start = 0;
    for (std::size_t j = prefix_row.size(); j-- > 0;) {
      const BlockId b = prefix_row[j];
      if (b <= 0 || b >= config_.num_blocks) continue;
      const KVCacheBlock& pb = blocks_[static_cast<std::size_t>(b)];
      const std::size_t level = first - prefix_row.size() + j;
      if (pb.is_cached() && pb.group_id == group && pb.block_hash == hashes[level]) {
        parent = pb.content_id;
        start = level + 1;
        break;
      }
    }
    // Everything that may allocate, except extra-key interning, before the first reference.
    st.content_ids_.reserve(n);
    // Overlap the misses: the index slots of the range, and the entries new ids will fill.
    for (std::size_t i = first; i < last; ++i) {
      contents_->prefetch(ContentTable::tag_of(hashes[i]));
    }
    constexpr std::size_t kAhead = 8;
    for (std::size_t k = 0; k < std::min(n, kAhead); ++k) contents_->prefetch_insert(k);
    st.pool_ = this;          // from here on, st releases the ids it holds if we throw
    std::uint32_t owned = 0;  // an ancestor id whose reference we hold while chaining
    try {
      for (std::size_t p = start; p < first; ++p) {
        const std::uint32_t id = acquire_content(parent, seq, p);
        if (owned != 0) release_content(owned);  // the child holds its parent now
        parent = owned = id;
      }
      std::size_t i = first;
      for (; i < last; ++i) {
        // Past a block whose id has no children (one just created, say) the rest of the range
        // is new content: one insert_chain() for it, when no block has extra keys.
        if (owned == 0 && parent != 0 && seq.extra_keys == nullptr &&
            contents_->entry(parent)[ContentTable::kChildren] == 0) {
          break;
        }
        contents_->prefetch_insert(kAhead);
        const std::uint32_t id = acquire_content(parent, seq, i);
        st.content_ids_.push_back(id);  // reserved: cannot throw, so the reference is kept
        if (owned != 0) {
          release_content(owned);
          owned = 0;
        }
        parent = id;
      }
      if (i < last) {
        contents_->reserve(last - i);  // may throw: st releases the ids taken so far
        const std::size_t done = st.content_ids_.size();
        st.content_ids_.resize(done + (last - i));  // reserved: cannot throw
        contents_->insert_chain(
            parent, bs, seq.tokens.data() + i * bs, last - i,
            [&hashes, i](std::size_t k) { return ContentTable::tag_of(hashes[i + k]); },
            st.content_ids_.data() + done);
      }
    } catch (...) {
      if (owned != 0) release_content(owned);
      throw;
    }
  }
  st.pool_ = this;
  if (config_.enable_kv_events) {
    BlockStored stored;
    stored.block_hashes.assign(hashes.begin() + static_cast<std::ptrdiff_t>(first),
                               hashes.begin() + static_cast<std::ptrdiff_t>(last));
    if (first > 0) stored.parent_block_hash = hashes[first - 1];
    const auto tokens = seq.tokens.subspan(first * bs, n * bs);
    stored.token_ids.assign(tokens.begin(), tokens.end());
    stored.block_size = bs;
    if (const auto lora = seq.lora_name()) stored.lora_name = std::string(*lora);
    stored.group_id = group;
    stored.extra_keys.reserve(n);
    for (std::size_t i = first; i < last; ++i) {
      const BlockExtraKeys extra = seq.block_extra_keys(i, store_scratch_.mm);
      OwnedExtraKeys owned;
      if (extra.lora_name) owned.lora_name = std::string(*extra.lora_name);
      for (const MultiModalKey& mm : extra.mm_items) {
        owned.mm_items.emplace_back(std::string(mm.identifier), mm.offset);
      }
      if (extra.cache_salt) owned.cache_salt = std::string(*extra.cache_salt);
      stored.extra_keys.push_back(std::move(owned));
    }
    st.event_.emplace(KVEvent{0, std::move(stored)});
    reserve_events(0, 1);
  }
  return st;
}

void BlockPool::commit_store(PendingStore&& store, std::span<const BlockId> blocks) {
  if (guarded_) {
    commit_store_in<true, true>(std::move(store), blocks);
  } else {
    commit_store_in<true, false>(std::move(store), blocks);
  }
}

void BlockPool::commit_table_store(PendingStore&& store, std::span<const BlockId> blocks) {
  if (guarded_) {
    commit_store_in<false, true>(std::move(store), blocks);
  } else {
    commit_store_in<false, false>(std::move(store), blocks);
  }
}

// commit_store() (kChecked) or commit_table_store(): the same change, the latter without the
// checking pass over the blocks' records.
template <bool kChecked, bool kGuarded>
void BlockPool::commit_store_in(PendingStore&& store, std::span<const BlockId> blocks) {
  PendingStore st = std::move(store);  // released on any exit
  const auto where = [] { return std::string("BlockPool::cache_full_blocks: "); };
  if (blocks.size() != st.size()) {
    throw Error(ErrorCode::kInvalidArgument, where() + std::to_string(blocks.size()) +
                                                 " blocks for a store of " +
                                                 std::to_string(st.size()));
  }
  // Validate without side effects; a repeated id is found by flipping the sign of its (positive)
  // ref count, undone before returning or throwing.
  auto unmark = [&](std::size_t count) {
    for (std::size_t k = 0; k < count; ++k) {
      KVCacheBlock& b = blocks_[static_cast<std::size_t>(blocks[k])];
      if (b.ref_cnt < 0) b.ref_cnt = -b.ref_cnt;
    }
  };
  if (st.pool_ != nullptr && st.pool_ != this) {
    throw Error(ErrorCode::kInvalidArgument, where() + "the store was prepared by another pool");
  }
  if (st.pool_ != nullptr && st.resets_ != resets_) {
    throw Error(ErrorCode::kInvalidState,
                where() + "the store was prepared before reset_prefix_cache() (stale)");
  }
  const bool storing = st.pool_ != nullptr;  // false: caching off or an empty range
  const auto hashes = st.seq_.block_hashes;
  const std::size_t bs = config_.block_size;
  const std::uint32_t seq_bs = st.seq_.block_size;
  // Streamed only when the call stores enough blocks to pay for its fence: a fence waits for
  // the streamed lines to reach memory, which costs more than a one-block store (a host tier's)
  // saves.
  const bool stream = stream_tokens_ && seq_bs == bs && blocks.size() >= kStreamTokensMinBlocks;
  // The map tags of blocks k to k + kStoreAhead in the change, for their inserts: the first
  // kStoreAhead from the checking pass, the rest from the change's own look-ahead (which computes
  // them again for its second request rather than keeping one per block of the store).
  constexpr std::size_t kTagRing = 32;  // a power of two above kStoreAhead
  static_assert(kTagRing > kStoreAhead);
  std::uint32_t tags[kTagRing];
  // Starts loading the stored material the change writes for blocks[k]. The checking pass does
  // so for the first kStoreAhead blocks, the change kStoreAhead blocks ahead. The map slots are
  // all requested by the checking pass, before any is written (a large pool's slots are DRAM
  // misses), and requested again kStoreAhead blocks ahead of their insert: of a long store's
  // early requests many have left the L1 (or were never served) by the time the insert comes,
  // and the second request took 10 ns per block off the N = 6,000,001 replay
  // (bench/results/pool_hash_speed.md, eleventh pass).
  const auto prefetch_store = [&](std::size_t k) {
    if (chain_identity_) {
      const auto i = static_cast<std::size_t>(blocks[k]);
      __builtin_prefetch(&stored_[i], 1);
      if (!stream) __builtin_prefetch(&block_tokens_[i * bs], 1);
    }
  };
  // The checking pass (kChecked) also starts loading what the change writes (the map's slots,
  // the stored material), so the change finds them in cache; unchecked, it only does that
  // (commit_table_store's blocks are asserted instead).
  for (std::size_t k = 0; k < blocks.size() && (kChecked || storing); ++k) {
    if constexpr (kChecked) {
      const BlockId id = blocks[k];
      if (static_cast<std::uint32_t>(id) >= static_cast<std::uint32_t>(config_.num_blocks)) {
        unmark(k);
        throw_out_of_range(id);
      }
      KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
      // One test for the usual case (an allocated, uncached, ordinary block seen once); the
      // problem is told apart only when there is one.
      if (b.is_null || b.ref_cnt <= 0 || b.is_cached()) [[unlikely]] {
        const char* problem = " is not allocated";
        ErrorCode code = ErrorCode::kInvalidState;
        if (b.is_null) {
          problem = " is the null block, which is never cached";
          code = ErrorCode::kInvalidArgument;
        } else if (b.ref_cnt < 0) {
          problem = " appears twice in one call";
          code = ErrorCode::kInvalidArgument;
        } else if (b.is_cached()) {
          problem = " is already cached";
        }
        unmark(k);
        throw Error(code, where() + id_text(id) + problem);
      }
      // The caller's hashes (KVCacheManager's, unchecked, come from its hasher): an empty one
      // would enter the map on a block that reads as uncached (is_cached() tests the hash),
      // which would then be reused without leaving the map.
      if (storing && hashes[st.first_ + k].empty()) [[unlikely]] {
        unmark(k);
        throw Error(ErrorCode::kInvalidArgument,
                    where() + "block " + std::to_string(st.first_ + k) +
                        " of the sequence has no hash (an empty BlockHash cannot be cached)");
      }
      b.ref_cnt = -b.ref_cnt;
    } else {
      assert(!storing || !hashes[st.first_ + k].empty());
      assert(blocks[k] > 0 && blocks[k] < config_.num_blocks);
      assert(blocks_[static_cast<std::size_t>(blocks[k])].ref_cnt > 0);
      assert(!blocks_[static_cast<std::size_t>(blocks[k])].is_cached());
    }
    if (!storing) continue;
    const std::uint32_t tag = BlockHashMap::key_tag(hashes[st.first_ + k], st.group_);
    hash_map_.prefetch_tagged(tag);
    if (k < kStoreAhead) {
      tags[k] = tag;
      prefetch_store(k);
    }
  }
  if (!storing) {
    if (kChecked) unmark(blocks.size());
    return;
  }

  // The change: nothing below allocates or throws (the map has room for every block). It undoes
  // the checking marks as it goes (kChecked).
  // Guarded: the blocks before a conflict (none for a store refused when prepared). Orphans
  // are made by evictions only, so whether any exists holds for the whole loop.
  std::size_t cached = kGuarded && st.refused_ ? 0 : blocks.size();
  const bool check_orphans = kGuarded && orphans_->live != 0;
  for (std::size_t k = 0; k < cached; ++k) {
    const BlockId id = blocks[k];
    const auto i = static_cast<std::size_t>(id);
    if (k + kStoreAhead < blocks.size()) {
      prefetch_store(k + kStoreAhead);
      const std::uint32_t tag =
          BlockHashMap::key_tag(hashes[st.first_ + k + kStoreAhead], st.group_);
      tags[(k + kStoreAhead) % kTagRing] = tag;
      hash_map_.prefetch_tagged(tag);
    }
    KVCacheBlock& b = blocks_[i];
    if (check_orphans && orphan_conflicts(st.seq_, st.first_ + k, st.content_ids_[k], st.group_))
        [[unlikely]] {
      cached = k;  // this block and the rest stay uncached
      break;
    }
    if (kChecked) b.ref_cnt = -b.ref_cnt;
    b.block_hash = hashes[st.first_ + k];
    b.group_id = st.group_;
    if (chain_identity_) {
      const std::size_t index = st.first_ + k;
      const BlockHash& parent = index > 0 ? hashes[index - 1] : kRootHash;
      b.content_id = material_word(st.content_ids_[k], parent);
      std::memcpy(stored_[i].parent.data(), parent.padded_bytes().data(), BlockHash::kMaxSize);
      TokenId* to = &block_tokens_[i * bs];
      const TokenId* from = st.seq_.tokens.data() + index * seq_bs;
      if (stream) {  // whole lines (a shorter block is copied)
        stream_block_tokens(to, from, seq_bs);
      } else if (seq_bs == 16) {  // the usual block: a constant-size copy
        std::memcpy(to, from, 16 * sizeof(TokenId));
      } else {
        std::memcpy(to, from, seq_bs * sizeof(TokenId));
      }
    } else if (verifying()) {
      b.content_id = st.content_ids_[k];
    }
    const std::uint32_t tag = tags[k % kTagRing];
    if constexpr (!kGuarded) {
      hash_map_.insert_tagged(id, tag);
      continue;
    }
    // Guarded: another cached block of this key must hold the same material.
    const std::size_t index = st.first_ + k;
    if (!hash_map_.insert_tagged_if_new_tag(id, tag) &&
        insert_guarded_slow(id, tag, st.seq_, index, st.content_ids_[k]) != BlockHashMap::kEmpty)
        [[unlikely]] {
      b.block_hash = BlockHash();  // uncached again (its stored material is stale, never read)
      b.group_id = 0;
      b.content_id = 0;
      cached = k;
      break;
    }
    Guard& g = guards_[i];
    if (k == 0) {
      g.link = st.parent_held_ ? st.parent_link_ : kRootLink;
      g.link_gen = st.parent_gen_;
      st.parent_held_ = false;  // the block holds the reference now
    } else {
      const auto pb = static_cast<std::size_t>(blocks[k - 1]);
      g.link = blocks[k - 1];
      g.link_gen = guards_[pb].gen;
      ++guards_[pb].children;
    }
  }
  if (stream) stream_fence();  // the streamed tokens are ordered before later stores
  if (kGuarded && cached < blocks.size()) [[unlikely]] {
    if (kChecked) {  // restore the checking marks of the blocks the loop did not reach
      for (std::size_t r = cached; r < blocks.size(); ++r) {
        KVCacheBlock& u = blocks_[static_cast<std::size_t>(blocks[r])];
        if (u.ref_cnt < 0) u.ref_cnt = -u.ref_cnt;
      }
    }
    // Guarded, stopped by a conflict: drop what the uncached blocks held, and their part of
    // the event (shrinking a vector does not allocate).
    for (std::size_t k = cached; k < st.content_ids_.size(); ++k) {
      extra_keys_->release(st.content_ids_[k]);
    }
    if (st.parent_held_) {  // no block took the parent reference
      release_parent(st.parent_link_, st.parent_gen_, hashes[st.first_ - 1], st.group_);
      st.parent_held_ = false;
    }
    if (st.event_) {
      if (cached == 0) {
        st.event_.reset();
      } else {
        const auto at = [](auto& v, std::size_t n) {
          return v.begin() + static_cast<std::ptrdiff_t>(n);
        };
        auto& stored = std::get<BlockStored>(st.event_->data);
        stored.block_hashes.erase(at(stored.block_hashes, cached), stored.block_hashes.end());
        stored.token_ids.erase(at(stored.token_ids, cached * seq_bs), stored.token_ids.end());
        stored.extra_keys.erase(at(stored.extra_keys, cached), stored.extra_keys.end());
      }
    }
  }
  if (ret_ != nullptr) [[unlikely]] {
    ret_stored(hashes, st.first_, blocks.first(cached));
  }
  st.content_ids_.clear();  // the blocks own the references now
  spare_content_ids_ = std::move(st.content_ids_);
  if (st.event_) record(std::move(st.event_->data));
  st.pool_ = nullptr;
  deliver_events();
}

void BlockPool::prefetch_cached_block(const BlockHash& hash, GroupId group) const noexcept {
  if (config_.enable_caching) hash_map_.prefetch(hash, group);
}

BlockId BlockPool::get_cached_block(const BlockHash& hash, GroupId group) const noexcept {
  if (!config_.enable_caching) return kNoBlock;
  return hash_map_.find_first(hash, group);
}

BlockId BlockPool::match_cached_block(const BlockSequence& seq, std::size_t index, BlockId parent,
                                      GroupId group, LookupScratch* scratch) const {
  if (index == 0) return match(seq, index, group, ParentCheck{&kRootHash, nullptr}, scratch);
  if (!verifying()) return match(seq, index, group, ParentCheck{}, scratch);
  if (parent == kNoBlock) return kNoBlock;
  const KVCacheBlock& p = block(parent);
  if (!p.is_cached() || p.is_null) return kNoBlock;
  return match(seq, index, group, ParentCheck{&p.block_hash, &p}, scratch);
}

BlockId BlockPool::match_cached_block_after(const BlockSequence& seq, std::size_t index,
                                            GroupId group, LookupScratch* scratch) const {
  if (verifying() && !chain_identity_) [[unlikely]] {
    throw_no_parent_hashes();
  }
  if (guarded_ && index > 0) [[unlikely]] {
    throw_unverified_prefix("BlockPool::match_cached_block_after");
  }
  // An index beyond the hashes is match()'s error; the parent hash is read only below it.
  const BlockHash* parent =
      index > 0 && index < seq.block_hashes.size() ? &seq.block_hashes[index - 1] : &kRootHash;
  return match(seq, index, group, ParentCheck{parent, nullptr}, scratch);
}

std::size_t BlockPool::match_cached_run_after(const BlockSequence& seq, std::size_t begin,
                                              std::size_t end, std::vector<BlockId>& out,
                                              GroupId group, LookupScratch* scratch) const {
  if (verifying() && !chain_identity_) [[unlikely]] {
    throw_no_parent_hashes();
  }
  if (guarded_ && begin > 0) [[unlikely]] {
    throw_unverified_prefix("BlockPool::match_cached_run_after");
  }
  if (begin >= end) return 0;
  // The checks of match() for the run's last block cover every block before it.
  if (end > seq.block_hashes.size()) {
    throw Error(ErrorCode::kOutOfRange, "BlockPool::match_cached_run_after: blocks up to " +
                                            std::to_string(end) + " but the request has " +
                                            std::to_string(seq.block_hashes.size()) +
                                            " full blocks");
  }
  check_sequence(seq, end, "BlockPool::match_cached_run_after");
  if (!config_.enable_caching) return 0;
  detail::reserve_more(out, end - begin);  // out grows here only, before any change
  if (chain_identity_ && seq.extra_keys == nullptr)
    return match_chain_run(seq, begin, end, out, group);
  constexpr std::size_t kAhead = 4;  // overlap the table's misses of the blocks ahead
  for (std::size_t i = begin; i < std::min(end, begin + kAhead); ++i) {
    hash_map_.prefetch(seq.block_hashes[i], group);
  }
  const auto scan = [&] {
    std::size_t i = begin;
    for (; i < end; ++i) {
      if (i + kAhead < end) hash_map_.prefetch(seq.block_hashes[i + kAhead], group);
      const BlockHash* parent = i > 0 ? &seq.block_hashes[i - 1] : &kRootHash;
      const BlockId id = match_checked(seq, i, group, ParentCheck{parent, nullptr}, scratch);
      if (id == kNoBlock) break;
      out.push_back(id);  // reserved: cannot throw
    }
    return i - begin;
  };
  if (seq.extra_keys == nullptr) return scan();  // no extra keys to build: nothing can throw
  const std::size_t old_size = out.size();
  try {
    return scan();
  } catch (...) {  // bad_alloc building a block's extra keys (without a scratch)
    out.resize(old_size);
    throw;
  }
}

// match_cached_run_after()'s scan for a verifying chain-identity pool and a sequence without
// extra keys: each block's tag is computed once (for the prefetch kAhead blocks before its
// lookup, kept in a ring), and the stored material word must equal the parent's size code with
// extra-key id 0 (one compare). The same blocks as match_checked() block by block.
std::size_t BlockPool::match_chain_run(const BlockSequence& seq, std::size_t begin, std::size_t end,
                                       std::vector<BlockId>& out, GroupId group) const {
  constexpr std::size_t kAhead = 8;  // overlap the table's misses of the blocks ahead
  constexpr std::size_t kRing = 16;  // a power of two above kAhead
  const std::span<const BlockHash> hashes = seq.block_hashes;
  const std::uint32_t bs = seq.block_size;
  const std::size_t stride = config_.block_size;
  std::uint32_t tags[kRing];
  const auto ahead = [&](std::size_t i) {
    const std::uint32_t tag = BlockHashMap::key_tag(hashes[i], group);
    tags[i % kRing] = tag;
    hash_map_.prefetch_tagged(tag);
  };
  for (std::size_t i = begin; i < std::min(end, begin + kAhead); ++i) ahead(i);
  std::size_t i = begin;
  for (; i < end; ++i) {
    if (i + kAhead < end) ahead(i + kAhead);
    const BlockHash& want = i > 0 ? hashes[i - 1] : kRootHash;
    const std::uint32_t want_word = material_word(0, want);
    const TokenId* tokens = seq.tokens.data() + i * bs;
    const BlockId id =
        hash_map_.find_first_tagged(tags[i % kRing], hashes[i], group, [&](BlockId c) {
          const auto k = static_cast<std::size_t>(c);
          return blocks_[k].content_id == want_word &&
                 equal_16k_bytes<2>(stored_[k].parent.data(), want.padded_bytes().data()) &&
                 same_block_tokens(&block_tokens_[k * stride], tokens, bs);
        });
    if (id == BlockHashMap::kEmpty) break;
    out.push_back(id);  // reserved: cannot throw
  }
  return i - begin;
}

BlockId BlockPool::match_cached_block_unanchored(const BlockSequence& seq, std::size_t index,
                                                 GroupId group, LookupScratch* scratch) const {
  return match(seq, index, group, ParentCheck{index == 0 ? &kRootHash : nullptr, nullptr}, scratch);
}
BlockId BlockPool::match(const BlockSequence& seq, std::size_t index, GroupId group,
                         ParentCheck parent, LookupScratch* scratch) const {
  if (index >= seq.block_hashes.size()) {
    throw Error(ErrorCode::kOutOfRange, "BlockPool::match_cached_block: block index " +
                                            std::to_string(index) + " but the request has " +
                                            std::to_string(seq.block_hashes.size()) +
                                            " full blocks");
  }
  check_sequence(seq, index + 1, "BlockPool::match_cached_block");
  return match_checked(seq, index, group, parent, scratch);
}

[[gnu::always_inline]] inline BlockId BlockPool::match_checked(const BlockSequence& seq,
                                                               std::size_t index, GroupId group,
                                                               ParentCheck parent,
                                                               LookupScratch* scratch) const {
  if (!config_.enable_caching) return kNoBlock;
  const BlockHash& hash = seq.block_hashes[index];
  if (!verifying()) return hash_map_.find_first(hash, group);

  std::uint32_t eid = 0;  // most blocks have no extra keys: skip building and interning them
  if (seq.has_extra_keys(index)) {
    LookupScratch local;  // const calls write nothing shared: the caller's buffers or our own
    LookupScratch& sc = scratch != nullptr ? *scratch : local;
    if (encode_block_extra_keys(seq, index, sc)) {
      eid = extra_keys_->find(sc.extra);
      if (eid == 0) return kNoBlock;  // no cached block has these extra keys
    }
  }
  const std::uint32_t bs = seq.block_size;
  const TokenId* tokens = seq.tokens.data() + index * bs;
  const auto same_tokens = [bs, tokens](const TokenId* stored) {
    return same_block_tokens(stored, tokens, bs);
  };
  if (chain_identity_) {
    const BlockHash* want = parent.hash;  // nullptr: no parent check
    return hash_map_.find_first(hash, group, [&](BlockId c) {
      const auto i = static_cast<std::size_t>(c);
      const std::uint32_t word = blocks_[i].content_id;  // on the line find_first just read
      return (word & kExtraIdMask) == eid &&
             (want == nullptr || same_parent(stored_[i].parent.data(), word, *want)) &&
             same_tokens(&block_tokens_[i * config_.block_size]);
    });
  }
  const std::uint32_t want = parent.block != nullptr ? parent.block->content_id : 0;
  const ContentTable& table = *contents_;
  return hash_map_.find_first(hash, group, [&](BlockId c) {
    const std::uint32_t* e = table.entry(blocks_[static_cast<std::size_t>(c)].content_id);
    if (parent.hash != nullptr && e[ContentTable::kParent] != want) return false;
    if (e[ContentTable::kSize] != bs || e[ContentTable::kExtra] != eid) return false;
    return same_tokens(reinterpret_cast<const TokenId*>(e + ContentTable::kHeader));
  });
}

std::size_t BlockPool::evict_blocks(std::span<const BlockId> ids) {
  std::size_t cached = 0;
  for (const BlockId id : ids) cached += block(id).is_cached() ? 1 : 0;
  reserve_events(cached, 0);
  if (guarded_) orphans_->reserve(cached);
  std::size_t evicted = 0;
  for (const BlockId id : ids) {
    if (blocks_[static_cast<std::size_t>(id)].is_cached()) {
      evict_cached(id);
      if (ret_ != nullptr) ret_after_evict(id);
      ++evicted;
    }
  }
  deliver_events();
  return evicted;
}

bool BlockPool::reset_prefix_cache() {
  if (num_free_blocks() != config_.num_blocks - 1) return false;
  reserve_events(0, 1);
  for (KVCacheBlock& b : blocks_) {
    b.block_hash = BlockHash();
    b.group_id = 0;
  }
  hash_map_.clear();
  if (chain_identity_) {
    std::fill(stored_.begin(), stored_.end(), Stored{});
    for (KVCacheBlock& b : blocks_) b.content_id = 0;
    extra_keys_->clear();
    if (guarded_) {
      for (Guard& g : guards_) {
        g.children = 0;
        ++g.gen;  // no link names a block any more
      }
      orphans_->clear();
    }
  } else if (verifying()) {
    for (KVCacheBlock& b : blocks_) b.content_id = 0;
    contents_->clear();
    extra_keys_->clear();
  }
  if (ret_ != nullptr) ret_reset();
  ++resets_;  // pending stores prepared before now are stale
  if (config_.enable_kv_events) record(AllBlocksCleared{});
  deliver_events();
  return true;
}
}  // namespace pagedkv
