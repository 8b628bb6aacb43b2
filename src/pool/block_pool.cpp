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

// Parent content id of a block whose parent was not cached when it was: matches nothing.
constexpr std::uint64_t kOrphan = ~std::uint64_t{0};

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

}  // namespace

// Interned extra-key encodings: cached blocks store a small id instead of the bytes; equal key
// sets share one entry. Entries are reference counted by the cached blocks that use them.
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
    auto [it, inserted] = ids.try_emplace(encoding, 0);
    if (inserted) {
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
  void release(std::uint32_t id) {
    if (id == 0) return;
    if (--refs[id] == 0) {
      ids.erase(ids.find(*keys[id]));
      keys[id] = nullptr;
      free_ids.push_back(id);
    }
  }
  void clear() {
    ids.clear();
    refs.assign(1, 0);
    keys.assign(1, nullptr);
    free_ids.clear();
  }
};

BlockPool::BlockPool(const BlockPoolConfig& config)
    : config_(config),
      blocks_(make_blocks(config)),
      free_queue_(blocks_, 1),
      hash_map_(std::span<const KVCacheBlock>(blocks_.data(),
                                              config.enable_caching ? blocks_.size() : 0)),
      extra_keys_(std::make_unique<ExtraKeyTable>()) {
  if (config_.enable_caching && config_.verify_cache_hits) {
    block_tokens_.resize(blocks_.size() * config_.block_size);
    material_.assign(blocks_.size(), Material{});
  }
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

void BlockPool::emit(KVEvent::Data data) {
  KVEvent event{next_event_seq_++, std::move(data)};
  if (sink_) {
    sink_(event);
  } else {
    events_.push_back(std::move(event));
  }
}

void BlockPool::evict_cached(BlockId id) {
  KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
  hash_map_.erase(id);
  if (config_.enable_kv_events) emit(BlockRemoved{{b.block_hash}, b.group_id});
  if (verifying()) {
    Material& mat = material_[static_cast<std::size_t>(id)];
    extra_keys_->release(mat.extra_id);
    mat = Material{};
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
  out.reserve(out.size() + static_cast<std::size_t>(n));
  const std::size_t first = out.size();
  for (std::int32_t i = 0; i < n; ++i) {
    const BlockId id = free_queue_.popleft();
    const KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.is_cached()) hash_map_.prefetch(b.block_hash, b.group_id);  // evicted below
    out.push_back(id);
  }
  for (std::size_t i = first; i < out.size(); ++i) {
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(out[i])];
    if (b.is_cached()) evict_cached(out[i]);
    b.ref_cnt = 1;
  }
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
  unhashed_scratch_.clear();
  hashed_scratch_.clear();
  unhashed_scratch_.reserve(ordered.size());
  hashed_scratch_.reserve(ordered.size());
  for (const BlockId id : ordered) {
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.is_null) continue;
    if (--b.ref_cnt == 0) (b.is_cached() ? hashed_scratch_ : unhashed_scratch_).push_back(id);
  }
  free_queue_.prepend_n(unhashed_scratch_);
  free_queue_.append_n(hashed_scratch_);
}

std::uint32_t BlockPool::lookup_extra_id(const BlockExtraKeys& extra) const {
  if (extra.empty()) return 0;
  encode_extra_keys(extra, extra_scratch_);
  return extra_keys_->find(extra_scratch_);
}

void BlockPool::cache_full_blocks(const BlockSequence& seq, std::span<const BlockId> blocks,
                                  std::size_t num_cached_blocks, std::size_t num_full_blocks,
                                  GroupId group) {
  // Built only when an error is thrown: this runs at every allocation that fills a block.
  const auto where = [] { return std::string("BlockPool::cache_full_blocks: "); };
  if (seq.block_size == 0 || seq.block_size > config_.block_size) {
    throw Error(ErrorCode::kInvalidArgument, where() + "the request is hashed with block size " +
                                                 std::to_string(seq.block_size) +
                                                 ", not within the pool's 1.." +
                                                 std::to_string(config_.block_size));
  }
  if (num_cached_blocks > num_full_blocks || num_full_blocks > blocks.size() ||
      num_full_blocks > seq.block_hashes.size()) {
    throw Error(ErrorCode::kOutOfRange,
                where() + "blocks [" + std::to_string(num_cached_blocks) + ", " +
                    std::to_string(num_full_blocks) + ") are not within the request's " +
                    std::to_string(blocks.size()) + " blocks and " +
                    std::to_string(seq.block_hashes.size()) + " full blocks");
  }
  for (std::size_t i = num_cached_blocks; i < num_full_blocks; ++i) {
    const KVCacheBlock& b = block(blocks[i]);
    if (b.is_null)
      throw Error(ErrorCode::kInvalidArgument, where() + "cannot cache the null block");
    if (b.is_cached()) {
      throw Error(ErrorCode::kInvalidState, where() + id_text(b.block_id) + " is already cached");
    }
    if (b.ref_cnt == 0) {
      throw Error(ErrorCode::kInvalidState, where() + id_text(b.block_id) + " is not allocated");
    }
  }
  if (!config_.enable_caching || num_cached_blocks == num_full_blocks) return;

  const auto hashes = seq.block_hashes;
  const std::uint32_t bs = seq.block_size;
  for (std::size_t i = num_cached_blocks; i < num_full_blocks; ++i) {
    hash_map_.prefetch(hashes[i], group);  // overlap the table misses of the whole batch
  }
  for (std::size_t i = num_cached_blocks; i < num_full_blocks; ++i) {
    const BlockId id = blocks[i];
    KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    b.block_hash = hashes[i];
    b.group_id = group;
    if (verifying()) {
      std::uint64_t parent_cid = 0;
      if (i > 0) {
        const KVCacheBlock& p = blocks_[static_cast<std::size_t>(blocks[i - 1])];
        parent_cid = p.is_cached() && !p.is_null
                         ? material_[static_cast<std::size_t>(p.block_id)].content_id
                         : kOrphan;
      }
      const BlockExtraKeys extra = seq.block_extra_keys(i, mm_scratch_);
      encode_extra_keys(extra, extra_scratch_);
      const std::span<const TokenId> tokens = seq.tokens.subspan(i * bs, bs);
      const std::uint32_t eid = extra.empty() ? 0 : extra_keys_->find(extra_scratch_);
      // Hash-consing: a block whose material equals a cached block's shares its content id.
      // (Extra keys that are not interned yet belong to no cached block: no twin.)
      const BlockId twin = !extra.empty() && eid == 0
                               ? BlockHashMap::kEmpty
                               : hash_map_.find_first(b.block_hash, group, [&](BlockId c) {
                                   return material_matches(c, parent_cid, eid, tokens.data(), bs);
                                 });
      Material& mat = material_[static_cast<std::size_t>(id)];
      mat.content_id = twin != BlockHashMap::kEmpty
                           ? material_[static_cast<std::size_t>(twin)].content_id
                           : next_content_id_++;
      mat.parent_content_id = parent_cid;
      mat.extra_id = extra.empty() ? 0 : extra_keys_->acquire(extra_scratch_);
      std::memcpy(&block_tokens_[static_cast<std::size_t>(id) * config_.block_size], tokens.data(),
                  tokens.size_bytes());
    }
    hash_map_.insert(id);
  }

  if (config_.enable_kv_events) {
    BlockStored stored;
    stored.block_hashes.assign(hashes.begin() + static_cast<std::ptrdiff_t>(num_cached_blocks),
                               hashes.begin() + static_cast<std::ptrdiff_t>(num_full_blocks));
    if (num_cached_blocks > 0) stored.parent_block_hash = hashes[num_cached_blocks - 1];
    const auto tokens =
        seq.tokens.subspan(num_cached_blocks * bs, (num_full_blocks - num_cached_blocks) * bs);
    stored.token_ids.assign(tokens.begin(), tokens.end());
    stored.block_size = bs;
    if (const auto lora = seq.lora_name()) stored.lora_name = std::string(*lora);
    stored.group_id = group;
    for (std::size_t i = num_cached_blocks; i < num_full_blocks; ++i) {
      const BlockExtraKeys extra = seq.block_extra_keys(i, mm_scratch_);
      OwnedExtraKeys owned;
      if (extra.lora_name) owned.lora_name = std::string(*extra.lora_name);
      for (const MultiModalKey& mm : extra.mm_items) {
        owned.mm_items.emplace_back(std::string(mm.identifier), mm.offset);
      }
      if (extra.cache_salt) owned.cache_salt = std::string(*extra.cache_salt);
      stored.extra_keys.push_back(std::move(owned));
    }
    emit(std::move(stored));
  }
}

void BlockPool::prefetch_cached_block(const BlockHash& hash, GroupId group) const noexcept {
  if (config_.enable_caching) hash_map_.prefetch(hash, group);
}

BlockId BlockPool::get_cached_block(const BlockHash& hash, GroupId group) const noexcept {
  if (!config_.enable_caching) return kNoBlock;
  return hash_map_.find_first(hash, group);
}

BlockId BlockPool::match_cached_block(const BlockSequence& seq, std::size_t index, BlockId parent,
                                      GroupId group) const {
  if (index > 0 && verifying()) {
    if (parent == kNoBlock) return kNoBlock;
    const KVCacheBlock& p = block(parent);
    if (!p.is_cached() || p.is_null) return kNoBlock;
  }
  return match(seq, index, group,
               index == 0    ? std::optional<std::uint64_t>(0)
               : verifying() ? std::optional<std::uint64_t>(
                                   material_[static_cast<std::size_t>(parent)].content_id)
                             : std::nullopt);
}

BlockId BlockPool::match_cached_block_unanchored(const BlockSequence& seq, std::size_t index,
                                                 GroupId group) const {
  return match(seq, index, group,
               index == 0 ? std::optional<std::uint64_t>(0) : std::optional<std::uint64_t>());
}

bool BlockPool::same_content_chain(BlockId parent, BlockId child) const noexcept {
  if (!verifying()) return true;
  return material_[static_cast<std::size_t>(child)].parent_content_id ==
         material_[static_cast<std::size_t>(parent)].content_id;
}

inline bool BlockPool::material_matches(BlockId candidate,
                                        std::optional<std::uint64_t> parent_content_id,
                                        std::uint32_t extra_id, const TokenId* tokens,
                                        std::uint32_t block_size) const noexcept {
  const Material& mat = material_[static_cast<std::size_t>(candidate)];
  return (!parent_content_id || mat.parent_content_id == *parent_content_id) &&
         mat.extra_id == extra_id &&
         std::memcmp(&block_tokens_[static_cast<std::size_t>(candidate) * config_.block_size],
                     tokens, block_size * sizeof(TokenId)) == 0;
}

BlockId BlockPool::match(const BlockSequence& seq, std::size_t index, GroupId group,
                         std::optional<std::uint64_t> parent_cid) const {
  if (index >= seq.block_hashes.size()) {
    throw Error(ErrorCode::kOutOfRange, "BlockPool::match_cached_block: block index " +
                                            std::to_string(index) + " but the request has " +
                                            std::to_string(seq.block_hashes.size()) +
                                            " full blocks");
  }
  if (seq.block_size == 0 || seq.block_size > config_.block_size) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockPool::match_cached_block: block size " + std::to_string(seq.block_size) +
                    " not within the pool's 1.." + std::to_string(config_.block_size));
  }
  if (!config_.enable_caching) return kNoBlock;
  const BlockHash& hash = seq.block_hashes[index];
  if (!verifying()) return hash_map_.find_first(hash, group);

  std::uint32_t eid = 0;  // most blocks have no extra keys: skip building and interning them
  if (seq.has_extra_keys(index)) {
    const BlockExtraKeys extra = seq.block_extra_keys(index, mm_scratch_);
    eid = lookup_extra_id(extra);
    if (!extra.empty() && eid == 0) return kNoBlock;  // no cached block has these extra keys
  }
  const TokenId* tokens = seq.tokens.data() + index * seq.block_size;
  return hash_map_.find_first(hash, group, [&](BlockId c) {
    if (parent_cid && material_[static_cast<std::size_t>(c)].parent_content_id != *parent_cid) {
      return false;
    }
    return material_matches(c, std::nullopt, eid, tokens, seq.block_size);
  });
}

std::size_t BlockPool::evict_blocks(std::span<const BlockId> ids) {
  for (const BlockId id : ids) (void)block(id);
  std::size_t evicted = 0;
  for (const BlockId id : ids) {
    if (blocks_[static_cast<std::size_t>(id)].is_cached()) {
      evict_cached(id);
      ++evicted;
    }
  }
  return evicted;
}

bool BlockPool::reset_prefix_cache() {
  if (free_queue_.size() != config_.num_blocks - 1) return false;
  for (KVCacheBlock& b : blocks_) {
    b.block_hash = BlockHash();
    b.group_id = 0;
  }
  hash_map_.clear();
  if (verifying()) {
    std::fill(material_.begin(), material_.end(), Material{});
    extra_keys_->clear();
  }
  if (config_.enable_kv_events) emit(AllBlocksCleared{});
  return true;
}

std::vector<KVEvent> BlockPool::take_events() {
  return std::exchange(events_, {});
}

void BlockPool::set_event_sink(KVEventSink sink) {
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
      if (verifying() && material_[static_cast<std::size_t>(b.block_id)].content_id == 0) {
        fail(id_text(b.block_id) + " is cached without a content id");
      }
    } else if (verifying() && (material_[static_cast<std::size_t>(b.block_id)].content_id != 0 ||
                               material_[static_cast<std::size_t>(b.block_id)].extra_id != 0)) {
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
    for (const Material& mat : material_) {
      const std::uint32_t eid = mat.extra_id;
      if (eid >= refs.size()) fail("extra-key id out of range");
      if (eid != 0) ++refs[eid];
    }
    for (std::size_t i = 1; i < refs.size(); ++i) {
      if (refs[i] != extra_keys_->refs[i]) fail("extra-key reference count mismatch");
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
  for (const Material& mat : material_) s.content_ids.push_back(mat.content_id);
  s.next_event_seq = next_event_seq_;
  s.pending_events = events_.size();
  s.num_evictions = num_evictions_;
  return s;
}

double BlockPool::metadata_bytes_per_block() const noexcept {
  const double bytes = static_cast<double>(
      blocks_.size() * sizeof(KVCacheBlock) + 2 * hash_map_.capacity() * sizeof(BlockId) +
      block_tokens_.size() * sizeof(TokenId) + material_.size() * sizeof(Material));
  return bytes / static_cast<double>(blocks_.size());
}

}  // namespace pagedkv
