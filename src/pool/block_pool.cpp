#include "pagedkv/pool/block_pool.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

namespace {

std::vector<KVCacheBlock> make_blocks(const BlockPoolConfig& config) {
  if (config.num_blocks < 2) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockPool: num_blocks must be at least 2 (the null block plus one usable block), "
                "got " +
                    std::to_string(config.num_blocks));
  }
  if (config.block_size == 0) {
    throw Error(ErrorCode::kInvalidArgument, "BlockPool: block_size must be at least 1");
  }
  std::vector<KVCacheBlock> blocks(static_cast<std::size_t>(config.num_blocks));
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].block_id = static_cast<BlockId>(i);
  blocks[kNullBlockId].is_null = true;
  return blocks;
}

std::string id_text(BlockId id) {
  return "block " + std::to_string(id);
}

// The pool's own identity of a prefix (when chain hashes are not collision resistant): SHA-256
// over the parent prefix's identity, the block size, the tokens and the canonical extra keys.
// Every field is fixed-size or length-prefixed, so different material never encodes equally.
// Identities are only ever compared with identities, so a short tag separates them well enough
// from other SHA-256 uses; it keeps a 16-token block's message (4 + 1 + 32 + 4 + 64 + 8 = 113
// bytes) within two SHA-256 compressions (a 23-byte tag made it three). The message is laid out
// on the stack when it fits (always, for blocks without long extra keys), else in `buf`.
BlockHash prefix_identity(const BlockHash& parent, std::span<const TokenId> tokens,
                          const std::string& extra, std::vector<std::uint8_t>& buf) {
  static constexpr std::string_view kDomain = "pkv1";
  const std::size_t size =
      kDomain.size() + 1 + parent.size() + 4 + tokens.size_bytes() + 8 + extra.size();
  alignas(16) std::uint8_t stack[1024];
  std::uint8_t* out = stack;
  if (size > sizeof stack) {
    buf.resize(size);
    out = buf.data();
  }
  std::uint8_t* p = out;
  auto put = [&p](const void* data, std::size_t n) {
    std::memcpy(p, data, n);
    p += n;
  };
  put(kDomain.data(), kDomain.size());
  const auto parent_size = static_cast<std::uint8_t>(parent.size());
  put(&parent_size, 1);
  put(parent.bytes().data(), parent.size());
  const auto n = static_cast<std::uint32_t>(tokens.size());
  put(&n, sizeof(n));
  if (tokens.size() == 16) {  // the usual block: a constant-size copy (no `rep movs`)
    std::memcpy(p, tokens.data(), 16 * sizeof(TokenId));
    p += 16 * sizeof(TokenId);
  } else if (!tokens.empty()) {
    put(tokens.data(), tokens.size_bytes());
  }
  const auto extra_size = static_cast<std::uint64_t>(extra.size());
  put(&extra_size, sizeof(extra_size));
  if (!extra.empty()) put(extra.data(), extra.size());
  return raw_digest(HashScheme::kSha256, std::span<const std::uint8_t>(out, size));
}

}  // namespace

// Interned extra-key encodings: cached blocks store a small id instead of the bytes; equal key
// sets share one entry. Entries are reference counted by the cached blocks (and pending stores)
// that use them. acquire() may throw and then changes nothing; release() and clear() never
// allocate (free_ids always has room for every id).
struct BlockPool::ExtraKeyTable {
  std::unordered_map<std::string, std::uint32_t> ids;  // encoding -> id (ids start at 1)
  std::vector<std::uint32_t> refs{0};                  // by id; refs[0] unused
  std::vector<const std::string*> keys{nullptr};       // by id; the map's key (stable address)
  std::vector<std::uint32_t> free_ids;

  std::uint32_t find(const std::string& encoding) const {
    const auto it = ids.find(encoding);
    return it == ids.end() ? 0 : it->second;
  }
  std::uint32_t acquire(const std::string& encoding) {
    auto it = ids.find(encoding);
    if (it == ids.end()) {
      // Everything that may allocate comes first; from the emplace on nothing throws.
      refs.reserve(refs.size() + 1);
      keys.reserve(keys.size() + 1);
      free_ids.reserve(refs.size() + 1);
      it = ids.emplace(encoding, 0).first;
      if (free_ids.empty()) {
        it->second = static_cast<std::uint32_t>(refs.size());
        refs.push_back(0);
        keys.push_back(&it->first);
      } else {
        it->second = free_ids.back();
        free_ids.pop_back();
        keys[it->second] = &it->first;
      }
    }
    ++refs[it->second];
    return it->second;
  }
  void release(std::uint32_t id) noexcept {
    if (id == 0) return;
    if (--refs[id] == 0) {
      ids.erase(ids.find(*keys[id]));
      keys[id] = nullptr;
      free_ids.push_back(id);  // capacity >= refs.size(): never allocates
    }
  }
  void clear() noexcept {
    ids.clear();
    refs.resize(1);
    refs[0] = 0;
    keys.resize(1);
    free_ids.clear();
  }
};

BlockPool::PendingStore::PendingStore(PendingStore&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      seq_(other.seq_),
      first_(other.first_),
      last_(other.last_),
      group_(other.group_),
      extra_ids_(std::move(other.extra_ids_)),
      parent_idents_(std::move(other.parent_idents_)),
      idents_(std::move(other.idents_)),
      event_(std::move(other.event_)) {}

BlockPool::PendingStore& BlockPool::PendingStore::operator=(PendingStore&& other) noexcept {
  if (this != &other) {
    release();
    pool_ = std::exchange(other.pool_, nullptr);
    seq_ = other.seq_;
    first_ = other.first_;
    last_ = other.last_;
    group_ = other.group_;
    extra_ids_ = std::move(other.extra_ids_);
    parent_idents_ = std::move(other.parent_idents_);
    idents_ = std::move(other.idents_);
    event_ = std::move(other.event_);
  }
  return *this;
}

BlockPool::PendingStore::~PendingStore() {
  release();
}

void BlockPool::PendingStore::release() noexcept {
  if (pool_ != nullptr) {
    for (const std::uint32_t eid : extra_ids_) pool_->extra_keys_->release(eid);
  }
  extra_ids_.clear();
  pool_ = nullptr;
}

BlockPool::BlockPool(const BlockPoolConfig& config)
    : config_(config),
      blocks_(make_blocks(config)),
      free_queue_(blocks_, 1),
      hash_map_(std::span<const KVCacheBlock>(blocks_.data(),
                                              config.enable_caching ? blocks_.size() : 0)),
      extra_keys_(std::make_unique<ExtraKeyTable>()) {
  const std::size_t n = blocks_.size();
  if (config_.enable_caching && config_.verify_cache_hits) {
    block_tokens_.resize(n * config_.block_size);
    stored_.assign(n, Stored{});
    if (!config_.chain_hashes_identify_prefix) ident_.assign(n, BlockHash());
  }
  // free_blocks() never allocates: a call queues each block at most once.
  unhashed_scratch_.reserve(n);
  hashed_scratch_.reserve(n);
}

BlockPool::~BlockPool() = default;

double BlockPool::usage() const noexcept {
  return 1.0 - static_cast<double>(free_queue_.size()) / (config_.num_blocks - 1);
}

const KVCacheBlock& BlockPool::block(BlockId id) const {
  if (id < 0 || id >= config_.num_blocks) {
    throw Error(ErrorCode::kOutOfRange, "BlockPool: " + id_text(id) + " is out of range [0, " +
                                            std::to_string(config_.num_blocks) + ")");
  }
  return blocks_[static_cast<std::size_t>(id)];
}

// ---- events: reserved before a change, recorded during it, delivered after it ----

void BlockPool::reserve_events(std::size_t removals, std::size_t others) {
  if (!config_.enable_kv_events) return;
  while (removed_shells_.size() < removals) {
    KVEvent shell;
    shell.data = BlockRemoved{std::vector<BlockHash>(1), 0};
    removed_shells_.push_back(std::move(shell));
  }
  const std::size_t need = events_.size() + removals + others;
  if (events_.capacity() < need) events_.reserve(std::max(need, 2 * events_.capacity()));
}

void BlockPool::record(KVEvent::Data&& data) noexcept {
  // Capacity was reserved before the change began (reserve_events), so this never allocates.
  events_.push_back(KVEvent{next_event_seq_++, std::move(data)});
}

void BlockPool::record_removed(const BlockHash& hash, GroupId group) noexcept {
  KVEvent event = std::move(removed_shells_.back());
  removed_shells_.pop_back();
  auto& removed = std::get<BlockRemoved>(event.data);
  removed.block_hashes[0] = hash;
  removed.group_id = group;
  event.seq = next_event_seq_++;
  events_.push_back(std::move(event));
}

void BlockPool::deliver_events() noexcept {
  // noexcept enforces the sink's contract: an exception escaping it terminates the program
  // (with the pool consistent) instead of leaving a half-delivered, half-applied step.
  if (!sink_ || delivery_holds_ > 0 || events_.empty()) return;
  for (const KVEvent& event : events_) sink_(event);
  events_.clear();
}

void BlockPool::evict_cached(BlockId id) noexcept {
  KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
  hash_map_.erase(id);
  if (config_.enable_kv_events) record_removed(b.block_hash, b.group_id);
  if (verifying()) {
    const auto i = static_cast<std::size_t>(id);
    extra_keys_->release(stored_[i].extra_id);
    stored_[i] = Stored{};
    if (!ident_.empty()) ident_[i] = BlockHash();
  }
  b.block_hash = BlockHash();
  b.group_id = 0;
  ++num_evictions_;
}

bool BlockPool::get_new_blocks(std::int32_t n, std::vector<BlockId>& out) {
  if (n < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockPool::get_new_blocks: negative block count " + std::to_string(n));
  }
  if (n > free_queue_.size()) return false;
  if (n == 0) return true;  // a decode step that needs no new block
  // Everything that may allocate, before any change.
  out.reserve(out.size() + static_cast<std::size_t>(n));
  if (config_.enable_kv_events) reserve_events(static_cast<std::size_t>(n), 0);
  const std::size_t first = out.size();
  for (std::int32_t i = 0; i < n; ++i) {
    const BlockId id = free_queue_.popleft();
    const KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.is_cached()) {  // evicted below: start loading what evict_cached() touches
      hash_map_.prefetch(b.block_hash, b.group_id);
      if (verifying()) {
        __builtin_prefetch(&stored_[static_cast<std::size_t>(id)], 1);
        if (!ident_.empty()) __builtin_prefetch(&ident_[static_cast<std::size_t>(id)], 1);
      }
    }
    out.push_back(id);
  }
  for (std::size_t i = first; i < out.size(); ++i) {
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(out[i])];
    if (b.is_cached()) evict_cached(out[i]);
    b.ref_cnt = 1;
  }
  if (!events_.empty()) deliver_events();
  return true;
}

void BlockPool::touch(std::span<const BlockId> ids) {
  for (const BlockId id : ids) (void)block(id);  // validate every id first
  for (const BlockId id : ids) {
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.is_null) continue;
    if (b.ref_cnt == 0) free_queue_.remove(id);
    ++b.ref_cnt;
  }
}

void BlockPool::free_blocks(std::span<const BlockId> ordered) {
  // Validate without side effects: a block being freed has ref > 0, so flipping its sign marks
  // it as seen in this call (a second sighting is a duplicate); the marks are undone below.
  auto unmark = [&](std::size_t count) {
    for (std::size_t k = 0; k < count; ++k) {
      KVCacheBlock& b = blocks_[static_cast<std::size_t>(ordered[k])];
      if (b.ref_cnt < 0) b.ref_cnt = -b.ref_cnt;
    }
  };
  for (std::size_t k = 0; k < ordered.size(); ++k) {
    const BlockId id = ordered[k];
    if (id < 0 || id >= config_.num_blocks) {
      unmark(k);
      (void)block(id);  // throws kOutOfRange with the standard message
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
      throw Error(ErrorCode::kInvalidState, "BlockPool::free_blocks: " + id_text(id) +
                                                " is already free (ref count 0): double free");
    }
    b.ref_cnt = -b.ref_cnt;
  }
  unmark(ordered.size());
  // The scratch vectors hold num_blocks ids (reserved at construction): no allocation here.
  unhashed_scratch_.clear();
  hashed_scratch_.clear();
  for (const BlockId id : ordered) {
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.is_null) continue;
    if (--b.ref_cnt == 0) (b.is_cached() ? hashed_scratch_ : unhashed_scratch_).push_back(id);
  }
  free_queue_.prepend_n(unhashed_scratch_);
  free_queue_.append_n(hashed_scratch_);
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
  st.seq_ = seq;
  st.first_ = first;
  st.last_ = last;
  st.group_ = group;
  if (!config_.enable_caching || first == last) return st;
  const std::size_t n = last - first;
  const std::uint32_t bs = seq.block_size;
  const auto hashes = seq.block_hashes;
  if (verifying()) {
    const bool own = !config_.chain_hashes_identify_prefix;
    st.extra_ids_.reserve(n);
    st.parent_idents_.reserve(n);
    if (own) st.idents_.reserve(n);
    st.pool_ = this;         // from here on, st releases the extra keys it acquired if we throw
    BlockHash parent_ident;  // empty: block 0 has no parent
    if (first > 0 && !own) parent_ident = hashes[first - 1];
    if (first > 0 && own) {
      // The nearest cached block of the prefix knows its prefix's identity; the blocks after it
      // (evicted, or skipped by a window) are chained from seq's own material. Usually that is
      // the parent itself; otherwise a few SHA-256 computations, once per cached run.
      std::size_t start = 0;  // root: chain from seq's block 0
      for (std::size_t j = prefix_row.size(); j-- > 0;) {
        const BlockId b = prefix_row[j];
        if (b > 0 && b < config_.num_blocks && blocks_[static_cast<std::size_t>(b)].is_cached()) {
          parent_ident = ident_[static_cast<std::size_t>(b)];
          start = first - prefix_row.size() + j + 1;
          break;
        }
      }
      for (std::size_t p = start; p < first; ++p) {
        const BlockExtraKeys extra = seq.block_extra_keys(p, store_scratch_.mm);
        encode_extra_keys(extra, store_scratch_.extra);
        parent_ident = prefix_identity(parent_ident, seq.tokens.subspan(p * bs, bs),
                                       store_scratch_.extra, ident_scratch_);
      }
    }
    for (std::size_t i = first; i < last; ++i) {
      const BlockExtraKeys extra = seq.block_extra_keys(i, store_scratch_.mm);
      encode_extra_keys(extra, store_scratch_.extra);
      const std::uint32_t eid = extra.empty() ? 0 : extra_keys_->acquire(store_scratch_.extra);
      st.extra_ids_.push_back(eid);  // reserved: cannot throw, so the reference is never lost
      st.parent_idents_.push_back(parent_ident);
      if (own) {
        parent_ident = prefix_identity(parent_ident, seq.tokens.subspan(i * bs, bs),
                                       store_scratch_.extra, ident_scratch_);
        st.idents_.push_back(parent_ident);
      } else {
        parent_ident = hashes[i];
      }
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
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    const BlockId id = blocks[k];
    const char* problem = nullptr;
    if (id < 0 || id >= config_.num_blocks) {
      unmark(k);
      (void)block(id);  // throws kOutOfRange
    }
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    ErrorCode code = ErrorCode::kInvalidState;
    if (b.is_null) {
      problem = " is the null block, which is never cached";
      code = ErrorCode::kInvalidArgument;
    } else if (b.ref_cnt < 0) {
      problem = " appears twice in one call";
      code = ErrorCode::kInvalidArgument;
    } else if (b.is_cached()) {
      problem = " is already cached";
    } else if (b.ref_cnt == 0) {
      problem = " is not allocated";
    }
    if (problem != nullptr) {
      unmark(k);
      throw Error(code, where() + id_text(id) + problem);
    }
    b.ref_cnt = -b.ref_cnt;
  }
  unmark(blocks.size());
  if (st.pool_ == nullptr) return;  // caching off or an empty range
  if (st.pool_ != this) {
    throw Error(ErrorCode::kInvalidArgument, where() + "the store was prepared by another pool");
  }

  // The change: nothing below allocates or throws (the map has room for every block).
  const auto hashes = st.seq_.block_hashes;
  const std::uint32_t bs = st.seq_.block_size;
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    hash_map_.prefetch(hashes[st.first_ + k], st.group_);  // overlap the table's misses
    if (verifying()) {  // and those of the stored material written below
      const auto i = static_cast<std::size_t>(blocks[k]);
      __builtin_prefetch(&stored_[i], 1);
      __builtin_prefetch(&block_tokens_[i * config_.block_size], 1);
      if (!ident_.empty()) __builtin_prefetch(&ident_[i], 1);
    }
  }
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    const BlockId id = blocks[k];
    const auto i = static_cast<std::size_t>(id);
    KVCacheBlock& b = blocks_[i];
    b.block_hash = hashes[st.first_ + k];
    b.group_id = st.group_;
    if (verifying()) {
      stored_[i].extra_id = st.extra_ids_[k];
      stored_[i].parent_ident = st.parent_idents_[k];
      if (!ident_.empty()) ident_[i] = st.idents_[k];
      TokenId* to = &block_tokens_[i * config_.block_size];
      const TokenId* from = st.seq_.tokens.data() + (st.first_ + k) * bs;
      if (bs == 16) {  // the usual block: a constant-size copy
        std::memcpy(to, from, 16 * sizeof(TokenId));
      } else {
        std::memcpy(to, from, bs * sizeof(TokenId));
      }
    }
    hash_map_.insert(id);
  }
  st.extra_ids_.clear();  // the blocks own the references now
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
  static const BlockHash kRoot;  // the parent identity of block 0
  if (index == 0) return match(seq, index, group, &kRoot, scratch);
  if (!verifying()) return match(seq, index, group, nullptr, scratch);
  if (parent == kNoBlock) return kNoBlock;
  const KVCacheBlock& p = block(parent);
  if (!p.is_cached() || p.is_null) return kNoBlock;
  return match(seq, index, group, &identity(parent), scratch);
}

BlockId BlockPool::match_cached_block_unanchored(const BlockSequence& seq, std::size_t index,
                                                 GroupId group, LookupScratch* scratch) const {
  static const BlockHash kRoot;
  return match(seq, index, group, index == 0 ? &kRoot : nullptr, scratch);
}

bool BlockPool::same_content_chain(BlockId parent, BlockId child) const noexcept {
  if (!verifying()) return true;
  return stored_[static_cast<std::size_t>(child)].parent_ident == identity(parent);
}

bool BlockPool::cached_after_prefix(BlockId child, const BlockSequence& seq, std::size_t index,
                                    BlockId anchor, std::size_t anchor_end,
                                    LookupScratch* scratch) const {
  const auto where = [] { return std::string("BlockPool::cached_after_prefix: "); };
  if (!block(child).is_cached()) {  // block() throws when out of range
    throw Error(ErrorCode::kInvalidArgument, where() + id_text(child) + " is not cached");
  }
  if (anchor != kNoBlock && !block(anchor).is_cached()) {
    throw Error(ErrorCode::kInvalidArgument, where() + "anchor " + id_text(anchor) +
                                                 " is not cached");
  }
  if (anchor_end > index || (anchor == kNoBlock) != (anchor_end == 0)) {
    throw Error(ErrorCode::kInvalidArgument,
                where() + "anchor end " + std::to_string(anchor_end) + " for block " +
                    std::to_string(index) + (anchor == kNoBlock ? " without an anchor" : ""));
  }
  validate_sequence(seq, index, "BlockPool::cached_after_prefix");
  if (!verifying()) return true;
  const BlockHash& stored = stored_[static_cast<std::size_t>(child)].parent_ident;
  if (index == 0) return stored.empty();
  if (config_.chain_hashes_identify_prefix) return stored == seq.block_hashes[index - 1];
  // The pool's own identities: chained from the anchor (or the root) over seq's material, as
  // prepare_store() does.
  LookupScratch local;
  LookupScratch& sc = scratch != nullptr ? *scratch : local;
  BlockHash ident = anchor == kNoBlock ? BlockHash() : identity(anchor);
  const std::uint32_t bs = seq.block_size;
  for (std::size_t p = anchor_end; p < index; ++p) {
    sc.extra.clear();
    if (seq.has_extra_keys(p)) encode_extra_keys(seq.block_extra_keys(p, sc.mm), sc.extra);
    ident = prefix_identity(ident, seq.tokens.subspan(p * bs, bs), sc.extra, sc.bytes);
  }
  return stored == ident;
}

BlockId BlockPool::match(const BlockSequence& seq, std::size_t index, GroupId group,
                         const BlockHash* parent_ident, LookupScratch* scratch) const {
  if (index >= seq.block_hashes.size()) {
    throw Error(ErrorCode::kOutOfRange, "BlockPool::match_cached_block: block index " +
                                            std::to_string(index) + " but the request has " +
                                            std::to_string(seq.block_hashes.size()) +
                                            " full blocks");
  }
  std::size_t end_token = 0;  // a multiply, not validate_sequence's division: once per block
  if (seq.block_size == 0 || seq.block_size > config_.block_size ||
      __builtin_mul_overflow(index + 1, std::size_t{seq.block_size}, &end_token) ||
      end_token > seq.tokens.size()) {
    validate_sequence(seq, index + 1, "BlockPool::match_cached_block");  // throws
  }
  if (!config_.enable_caching) return kNoBlock;
  const BlockHash& hash = seq.block_hashes[index];
  if (!verifying()) return hash_map_.find_first(hash, group);

  std::uint32_t eid = 0;  // most blocks have no extra keys: skip building and interning them
  if (seq.has_extra_keys(index)) {
    LookupScratch local;  // const calls write nothing shared: the caller's buffers or our own
    LookupScratch& sc = scratch != nullptr ? *scratch : local;
    const BlockExtraKeys extra = seq.block_extra_keys(index, sc.mm);
    if (!extra.empty()) {
      encode_extra_keys(extra, sc.extra);
      eid = extra_keys_->find(sc.extra);
      if (eid == 0) return kNoBlock;  // no cached block has these extra keys
    }
  }
  const TokenId* tokens = seq.tokens.data() + index * seq.block_size;
  const std::size_t bytes = seq.block_size * sizeof(TokenId);
  return hash_map_.find_first(hash, group, [&](BlockId c) {
    const auto i = static_cast<std::size_t>(c);
    const Stored& m = stored_[i];
    // Whole-object compare (a fixed 33 bytes, inlined): unused digest bytes are always zero.
    static_assert(sizeof(BlockHash) == BlockHash::kMaxSize + 1);
    return (parent_ident == nullptr ||
            std::memcmp(&m.parent_ident, parent_ident, sizeof(BlockHash)) == 0) &&
           m.extra_id == eid &&
           std::memcmp(&block_tokens_[i * config_.block_size], tokens, bytes) == 0;
  });
}

std::size_t BlockPool::evict_blocks(std::span<const BlockId> ids) {
  std::size_t cached = 0;
  for (const BlockId id : ids) cached += block(id).is_cached() ? 1 : 0;
  reserve_events(cached, 0);
  std::size_t evicted = 0;
  for (const BlockId id : ids) {
    if (blocks_[static_cast<std::size_t>(id)].is_cached()) {
      evict_cached(id);
      ++evicted;
    }
  }
  deliver_events();
  return evicted;
}

bool BlockPool::reset_prefix_cache() {
  if (free_queue_.size() != config_.num_blocks - 1) return false;
  reserve_events(0, 1);
  for (KVCacheBlock& b : blocks_) {
    b.block_hash = BlockHash();
    b.group_id = 0;
  }
  hash_map_.clear();
  if (verifying()) {
    std::fill(stored_.begin(), stored_.end(), Stored{});
    std::fill(ident_.begin(), ident_.end(), BlockHash());
    extra_keys_->clear();
  }
  if (config_.enable_kv_events) record(AllBlocksCleared{});
  deliver_events();
  return true;
}

std::vector<KVEvent> BlockPool::take_events() noexcept {
  return std::exchange(events_, {});
}

void BlockPool::set_event_sink(KVEventSink sink) noexcept {
  sink_ = std::move(sink);
}

void BlockPool::check_invariants() const {
  auto fail = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidState, "BlockPool invariant broken: " + what +
                                              " (a bug in pagedkv or memory corruption; try a "
                                              "sanitizer build)");
  };
  const KVCacheBlock& null = blocks_[kNullBlockId];
  if (!null.is_null || null.in_free_queue() || null.is_cached() || null.ref_cnt != 0) {
    fail("the null block is queued, hashed or referenced");
  }
  // Walk the queue: links consistent, each block once, only ref 0 blocks.
  std::vector<char> seen(blocks_.size(), 0);
  std::int32_t count = 0;
  BlockId prev = kQueueEnd;
  for (BlockId id = free_queue_.front(); id != kQueueEnd; id = blocks_[id].next_free) {
    if (id < 0 || id >= config_.num_blocks) fail("free queue link out of range");
    if (seen[id]) fail(id_text(id) + " is in the free queue twice (or the queue has a cycle)");
    seen[id] = 1;
    if (blocks_[id].prev_free != prev) fail(id_text(id) + " has a wrong prev link");
    if (blocks_[id].ref_cnt != 0) fail(id_text(id) + " is queued with ref count > 0");
    prev = id;
    ++count;
  }
  if (prev != free_queue_.back()) fail("the free queue's tail is not its last block");
  if (count != free_queue_.size()) fail("the free queue's size does not match its length");
  std::int32_t in_use = 0;
  std::size_t cached = 0;
  for (const KVCacheBlock& b : blocks_) {
    if (b.is_null) continue;
    const auto i = static_cast<std::size_t>(b.block_id);
    if (b.ref_cnt < 0) fail(id_text(b.block_id) + " has a negative ref count");
    if ((b.ref_cnt == 0) != static_cast<bool>(seen[b.block_id])) {
      fail(id_text(b.block_id) + ": in the free queue iff ref count 0 does not hold");
    }
    if (b.ref_cnt > 0) ++in_use;
    if (b.is_cached()) {
      ++cached;
      if (!config_.enable_caching) fail(id_text(b.block_id) + " is hashed with caching off");
      if (hash_map_.find_first(b.block_hash, b.group_id,
                               [&](BlockId c) { return c == b.block_id; }) != b.block_id) {
        fail(id_text(b.block_id) + " is hashed but not reachable in the hash map");
      }
      if (!ident_.empty() && ident_[i].empty()) {
        fail(id_text(b.block_id) + " is cached without a prefix identity");
      }
    } else if (verifying() && (stored_[i].extra_id != 0 || !stored_[i].parent_ident.empty() ||
                               (!ident_.empty() && !ident_[i].empty()))) {
      fail(id_text(b.block_id) + " is not cached but keeps key material");
    }
  }
  if (count + in_use + 1 != config_.num_blocks) fail("free + in use + null != total blocks");
  if (hash_map_.size() != cached) fail("hash map size differs from the number of hashed blocks");
  for (const BlockId id : hash_map_.slot_ids()) {
    if (id != BlockHashMap::kEmpty && !blocks_[id].is_cached()) {
      fail("hash map entry " + id_text(id) + " points to a block without a hash");
    }
  }
  if (verifying()) {
    std::vector<std::uint32_t> refs(extra_keys_->refs.size(), 0);
    for (const Stored& m : stored_) {
      const std::uint32_t eid = m.extra_id;
      if (eid >= refs.size()) fail("extra-key id out of range");
      if (eid != 0) ++refs[eid];
    }
    for (std::size_t i = 1; i < refs.size(); ++i) {
      if (refs[i] != extra_keys_->refs[i]) fail("extra-key reference count mismatch");
    }
    if (extra_keys_->free_ids.capacity() + 1 < extra_keys_->refs.size()) {
      fail("the extra-key table's free list could allocate on release");
    }
  }
}

BlockPoolSnapshot BlockPool::snapshot() const {
  BlockPoolSnapshot s;
  for (const KVCacheBlock& b : blocks_) {
    s.ref_cnts.push_back(b.ref_cnt);
    s.block_hashes.push_back(b.block_hash);
    s.group_ids.push_back(b.group_id);
  }
  s.free_queue = free_queue_.ids();
  s.hash_map_slots = hash_map_.slot_ids();
  if (verifying()) {
    const std::size_t bs = config_.block_size;
    for (const KVCacheBlock& b : blocks_) {
      const auto i = static_cast<std::size_t>(b.block_id);
      const bool cached = b.is_cached();
      for (std::size_t t = 0; t < bs; ++t) {
        s.block_tokens.push_back(cached ? block_tokens_[i * bs + t] : 0);
      }
      const std::uint32_t eid = stored_[i].extra_id;
      s.extra_keys.push_back(eid == 0 ? std::string() : *extra_keys_->keys[eid]);
      s.parent_identities.push_back(stored_[i].parent_ident);
      if (!ident_.empty()) s.identities.push_back(ident_[i]);
    }
  }
  s.next_event_seq = next_event_seq_;
  s.pending_events = events_.size();
  s.num_evictions = num_evictions_;
  return s;
}

double BlockPool::metadata_bytes_per_block() const noexcept {
  const double bytes = static_cast<double>(
      blocks_.size() * sizeof(KVCacheBlock) + 2 * hash_map_.capacity() * sizeof(BlockId) +
      block_tokens_.size() * sizeof(TokenId) + stored_.size() * sizeof(Stored) +
      ident_.size() * sizeof(BlockHash) +
      (unhashed_scratch_.capacity() + hashed_scratch_.capacity()) * sizeof(BlockId));
  return bytes / static_cast<double>(blocks_.size());
}

}  // namespace pagedkv
