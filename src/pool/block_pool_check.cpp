// BlockPool: invariant checks, snapshots and the metadata size (tests and tools; not hot).

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "block_pool_internal.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/hash/block_hash.hpp"
#include "pagedkv/pool/block_pool.hpp"

namespace pagedkv {

namespace {

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

void BlockPool::check_invariants() const {
  auto fail = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidState, "BlockPool invariant broken: " + what +
                                              " (a bug in pagedkv or memory corruption; try a "
                                              "sanitizer build)");
  };
  const KVCacheBlock& null = blocks_[kNullBlockId];
  if (!null.is_null || free_queue_.contains(kNullBlockId) || null.is_cached() ||
      null.ref_cnt != 0) {
    fail("the null block is queued, hashed or referenced");
  }
  // Walk the queue: links consistent, each block once, only ref 0 blocks.
  std::vector<char> seen(blocks_.size(), 0);
  std::int32_t count = 0;
  BlockId prev = kQueueEnd;
  for (BlockId id = free_queue_.front(); id != kQueueEnd; id = free_queue_.next(id)) {
    if (id < 0 || id >= config_.num_blocks) fail("free queue link out of range");
    if (seen[id]) fail(id_text(id) + " is in the free queue twice (or the queue has a cycle)");
    seen[id] = 1;
    if (free_queue_.prev(id) != prev) fail(id_text(id) + " has a wrong prev link");
    if (blocks_[id].ref_cnt != 0) fail(id_text(id) + " is queued with ref count > 0");
    prev = id;
    ++count;
  }
  if (prev != free_queue_.back()) fail("the free queue's tail is not its last block");
  if (count != free_queue_.size()) fail("the free queue's size does not match its length");
  if (ret_ != nullptr) {
    ret_check(seen);  // the retention lists, marking their blocks as queued
  } else if (ret_free_ != 0) {
    fail("free blocks counted in retention lists that do not exist");
  }
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
      if (verifying() && !chain_identity_) {
        const std::uint32_t c = b.content_id;
        if (c == 0 || c >= contents_->next || contents_->entry(c)[ContentTable::kRefs] == 0) {
          fail(id_text(b.block_id) + " is cached without a live content id");
        }
        if (contents_->entry(c)[ContentTable::kTag] != ContentTable::tag_of(b.block_hash)) {
          fail(id_text(b.block_id) + "'s content id was filed under another hash");
        }
      }
    } else if (b.content_id != 0) {
      // (An uncached block's stored parent hash and tokens are stale and never read: only
      // cached blocks are reachable through the map, and a store overwrites both.)
      fail(id_text(b.block_id) + " is not cached but keeps a content id");
    }
    if (chain_identity_ && b.is_cached()) {
      const std::uint32_t code = b.content_id >> kExtraIdBits;
      const auto& parent = stored_[static_cast<std::size_t>(b.block_id)].parent;
      const std::size_t size = code == 0 ? 0 : code == 1 ? 16 : 32;
      if (code > 2 || std::any_of(parent.begin() + static_cast<std::ptrdiff_t>(size), parent.end(),
                                  [](std::uint8_t x) { return x != 0; })) {
        fail(id_text(b.block_id) + "'s stored parent hash is malformed");
      }
    }
    if (!verifying() && b.content_id != 0) fail(id_text(b.block_id) + " has a content id");
  }
  if (count + ret_free_ + in_use + 1 != config_.num_blocks)
    fail("free + in use + null != total blocks");
  if (hash_map_.size() != cached) fail("hash map size differs from the number of hashed blocks");
  for (const BlockId id : hash_map_.slot_ids()) {
    if (id != BlockHashMap::kEmpty && !blocks_[id].is_cached()) {
      fail("hash map entry " + id_text(id) + " points to a block without a hash");
    }
  }
  if (verifying()) {
    std::vector<std::uint32_t> refs(extra_keys_->refs.size(), 0);
    if (chain_identity_) {
      for (const KVCacheBlock& b : blocks_) {
        const std::uint32_t eid = b.content_id & kExtraIdMask;
        if (eid >= refs.size()) fail("extra-key id out of range");
        if (eid != 0) ++refs[eid];
      }
      if (guarded_) check_guards(refs);
    } else {
      // Content ids: every live id is indexed once, referenced exactly by the cached blocks
      // naming it and by its live children, and its parent is live; ids are unique per content.
      const ContentTable& t = *contents_;
      std::vector<std::uint32_t> crefs(t.next, 0);
      std::vector<std::uint32_t> children(t.next, 0);
      std::vector<char> free_id(t.next, 0);
      for (const std::uint32_t id : t.free_ids) {
        if (id == 0 || id >= t.next || free_id[id] || t.entry(id)[ContentTable::kRefs] != 0) {
          fail("content free list is corrupt");
        }
        free_id[id] = 1;
      }
      if (t.free_ids.size() + t.live + 1 != t.next) fail("content ids leaked");
      if (t.free_ids.capacity() < t.capacity()) fail("the content free list could allocate");
      std::size_t indexed = 0;
      for (std::size_t k = 0; k < t.slots.size(); ++k) {
        const std::uint32_t id = t.slots[k].id;
        if (id == 0) continue;
        ++indexed;
        if (id >= t.next || free_id[id]) fail("the content index names a free id");
        if (t.find(t.slots[k].tag, [&](const std::uint32_t* e) { return e == t.entry(id); }) !=
            id) {
          fail("content id " + std::to_string(id) + " is not reachable in its index");
        }
      }
      if (indexed != t.live) fail("the content index size differs from the live ids");
      for (const KVCacheBlock& b : blocks_) {
        if (b.content_id != 0) ++crefs[b.content_id];
      }
      for (std::uint32_t id = 1; id < t.next; ++id) {
        if (free_id[id]) continue;
        const std::uint32_t* e = t.entry(id);
        const std::uint32_t parent = e[ContentTable::kParent];
        if (parent >= t.next || (parent != 0 && free_id[parent])) {
          fail("content id " + std::to_string(id) + " has a dead parent");
        }
        if (parent != 0) {
          ++crefs[parent];
          ++children[parent];
        }
        const std::uint32_t eid = e[ContentTable::kExtra];
        if (eid >= refs.size()) fail("extra-key id out of range");
        if (eid != 0) ++refs[eid];
        const std::uint32_t others = t.find(e[ContentTable::kTag], [&](const std::uint32_t* o) {
          return o != e && o[ContentTable::kParent] == parent &&
                 o[ContentTable::kSize] == e[ContentTable::kSize] &&
                 o[ContentTable::kExtra] == eid &&
                 std::memcmp(o + ContentTable::kHeader, e + ContentTable::kHeader,
                             e[ContentTable::kSize] * sizeof(TokenId)) == 0;
        });
        if (others != 0) fail("two content ids hold the same content");
      }
      for (std::uint32_t id = 1; id < t.next; ++id) {
        if (!free_id[id] && crefs[id] != t.entry(id)[ContentTable::kRefs]) {
          fail("content id " + std::to_string(id) + " has a wrong reference count");
        }
        if (!free_id[id] && children[id] != t.entry(id)[ContentTable::kChildren]) {
          fail("content id " + std::to_string(id) + " has a wrong child count");
        }
      }
    }
    for (std::size_t i = 1; i < refs.size(); ++i) {
      if (refs[i] != extra_keys_->refs[i]) fail("extra-key reference count mismatch");
    }
    if (extra_keys_->free_ids.capacity() + 1 < extra_keys_->refs.size()) {
      fail("the extra-key table's free list could allocate on release");
    }
  }
}

// check_invariants() for guarded chain hashes: links resolve to records of the parent, child
// counts are exact, orphans are indexed and referenced, and each (hash, group) has one content.
// Adds the orphans' extra-key references to `refs`.
void BlockPool::check_guards(std::vector<std::uint32_t>& refs) const {
  auto fail = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidState, "BlockPool invariant broken: " + what);
  };
  const OrphanTable& t = *orphans_;
  const std::size_t stride = config_.block_size;
  std::vector<std::uint32_t> kids(blocks_.size(), 0);
  std::vector<std::uint32_t> orphan_kids(t.entries.size(), 0);
  const auto resolve = [&](BlockId link, std::uint32_t gen, const BlockHash& parent, GroupId g,
                           const std::string& who) {
    if (link == kRootLink) {
      if (!parent.empty()) fail(who + " links to the root but has a parent hash");
      return;
    }
    if (parent.empty()) fail(who + " has no parent hash but links to a parent");
    if (link >= 0 && link < config_.num_blocks &&
        guards_[static_cast<std::size_t>(link)].gen == gen) {
      const KVCacheBlock& p = blocks_[static_cast<std::size_t>(link)];
      if (!p.is_cached() || p.block_hash != parent || p.group_id != g) {
        fail(who + "'s parent link names a block that does not hold its parent");
      }
      ++kids[static_cast<std::size_t>(link)];
      return;
    }
    const std::uint32_t idx = t.find(parent, g);
    if (idx == OrphanTable::kNone) fail(who + "'s parent prefix has no record");
    ++orphan_kids[idx];
  };
  std::size_t live = 0;
  std::vector<char> indexed(t.entries.size(), 0);
  for (const std::uint32_t v : t.slots) {
    if (v == 0) continue;
    if (v - 1 >= t.entries.size() || indexed[v - 1]) fail("the orphan index is corrupt");
    indexed[v - 1] = 1;
    ++live;
  }
  if (live != t.live || live + t.free.size() != t.entries.size()) fail("orphan entries leaked");
  for (std::uint32_t idx = 0; idx < t.entries.size(); ++idx) {
    if (!indexed[idx]) continue;
    const OrphanTable::Entry& e = t.entries[idx];
    const std::string who = "orphan " + e.hash.to_hex();
    if (t.find(e.hash, e.group) != idx) fail(who + " is not reachable in its index");
    if (e.extra >= refs.size()) fail("extra-key id out of range");
    if (e.extra != 0) ++refs[e.extra];
    resolve(e.link, e.link_gen, e.parent, e.group, who);
  }
  for (const KVCacheBlock& b : blocks_) {
    const auto i = static_cast<std::size_t>(b.block_id);
    if (!b.is_cached()) {
      if (guards_[i].children != 0) fail(id_text(b.block_id) + " is not cached but has children");
      continue;
    }
    const BlockHash parent = stored_parent(i);
    resolve(guards_[i].link, guards_[i].link_gen, parent, b.group_id, id_text(b.block_id));
    // One content per (hash, group): every other record of the key holds the same material
    // (guarded pools store whole blocks only).
    const std::uint32_t eid = b.content_id & kExtraIdMask;
    const TokenId* tokens = &block_tokens_[i * stride];
    const auto bs = static_cast<std::uint32_t>(stride);
    const BlockId other = hash_map_.find_first(b.block_hash, b.group_id, [&](BlockId c) {
      return !stored_material_is(static_cast<std::size_t>(c), tokens, bs, eid, parent);
    });
    if (other != BlockHashMap::kEmpty) {
      fail(id_text(b.block_id) + " and " + id_text(other) +
           " hold different content under one hash");
    }
    if (const std::uint32_t idx = t.find(b.block_hash, b.group_id);
        idx != OrphanTable::kNone && !orphan_material_is(idx, tokens, bs, eid, parent)) {
      fail(id_text(b.block_id) + " and its hash's orphan hold different content");
    }
  }
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    if (kids[i] != guards_[i].children)
      fail(id_text(static_cast<BlockId>(i)) + " has a wrong child count");
  }
  for (std::uint32_t idx = 0; idx < t.entries.size(); ++idx) {
    if (!indexed[idx]) continue;
    if (orphan_kids[idx] != t.entries[idx].children || orphan_kids[idx] == 0) {
      fail("orphan " + t.entries[idx].hash.to_hex() + " has a wrong child count");
    }
  }
}

BlockPoolSnapshot BlockPool::snapshot() const {
  BlockPoolSnapshot s;
  // Each per-block vector allocated once (harnesses take a snapshot per operation; under ASan
  // every allocation is filled and quarantined).
  const std::size_t n = blocks_.size();
  s.ref_cnts.reserve(n);
  s.block_hashes.reserve(n);
  s.group_ids.reserve(n);
  if (chain_identity_ || verifying()) {
    s.block_tokens.reserve(n * config_.block_size);
    s.extra_keys.reserve(n);
    s.parent_identities.reserve(n);
    s.identities.reserve(n);
  }
  for (const KVCacheBlock& b : blocks_) {
    s.ref_cnts.push_back(b.ref_cnt);
    s.block_hashes.push_back(b.block_hash);
    s.group_ids.push_back(b.group_id);
  }
  s.free_queue = free_queue_.ids();
  s.hash_map_slots = hash_map_.slot_ids();
  if (chain_identity_) {
    const std::size_t bs = config_.block_size;
    for (const KVCacheBlock& b : blocks_) {
      const auto i = static_cast<std::size_t>(b.block_id);
      const bool cached = b.is_cached();
      for (std::size_t t = 0; t < bs; ++t) {
        s.block_tokens.push_back(cached ? block_tokens_[i * bs + t] : 0);
      }
      const std::uint32_t eid = b.content_id & kExtraIdMask;
      s.extra_keys.push_back(eid == 0 ? std::string() : *extra_keys_->keys[eid]);
      const std::uint32_t code = b.content_id >> kExtraIdBits;
      s.parent_identities.push_back(code == 0
                                        ? BlockHash()
                                        : BlockHash(std::span<const std::uint8_t>(
                                              stored_[i].parent.data(), code == 1 ? 16 : 32)));
      s.identities.push_back(b.block_hash);
    }
    if (guarded_) {
      s.children.reserve(guards_.size());
      for (const Guard& g : guards_) s.children.push_back(g.children);
      for (const OrphanTable::Entry& e : orphans_->entries) {
        if (e.children == 0) continue;  // a free entry
        s.orphans.push_back(e.hash.to_hex() + "/" + std::to_string(e.group) + "/" +
                            std::to_string(e.children));
      }
      std::sort(s.orphans.begin(), s.orphans.end());
    }
  } else if (verifying()) {
    // Identities as SHA-256 chains over the material: equal for equal content whatever the
    // internal ids (a pool that rolled back a failed call may number them differently).
    const ContentTable& t = *contents_;
    std::vector<std::optional<BlockHash>> canon(t.next);
    std::vector<std::uint8_t> buf;
    std::vector<std::uint32_t> stack;
    const auto identity_of = [&](std::uint32_t id) -> BlockHash {
      for (std::uint32_t c = id; c != 0 && !canon[c]; c = t.entry(c)[ContentTable::kParent]) {
        stack.push_back(c);
      }
      while (!stack.empty()) {
        const std::uint32_t c = stack.back();
        stack.pop_back();
        const std::uint32_t* e = t.entry(c);
        const std::uint32_t parent = e[ContentTable::kParent];
        const std::uint32_t eid = e[ContentTable::kExtra];
        canon[c] = prefix_identity(
            parent == 0 ? BlockHash() : *canon[parent],
            std::span<const TokenId>(reinterpret_cast<const TokenId*>(e + ContentTable::kHeader),
                                     e[ContentTable::kSize]),
            eid == 0 ? std::string() : *extra_keys_->keys[eid], buf);
      }
      return id == 0 ? BlockHash() : *canon[id];
    };
    const std::size_t bs = config_.block_size;
    for (const KVCacheBlock& b : blocks_) {
      const std::uint32_t c = b.content_id;
      const std::uint32_t* e = c == 0 ? nullptr : t.entry(c);
      for (std::size_t k = 0; k < bs; ++k) {
        s.block_tokens.push_back(e != nullptr && k < e[ContentTable::kSize]
                                     ? static_cast<TokenId>(e[ContentTable::kHeader + k])
                                     : 0);
      }
      const std::uint32_t eid = e == nullptr ? 0 : e[ContentTable::kExtra];
      s.extra_keys.push_back(eid == 0 ? std::string() : *extra_keys_->keys[eid]);
      s.parent_identities.push_back(e == nullptr ? BlockHash()
                                                 : identity_of(e[ContentTable::kParent]));
      s.identities.push_back(identity_of(c));
    }
  }
  s.next_event_seq = next_event_seq_;
  s.pending_events = events_.size();
  s.num_evictions = num_evictions_;
  if (ret_ != nullptr) ret_snapshot(s);
  return s;
}

double BlockPool::metadata_bytes_per_block() const noexcept {
  const double bytes = static_cast<double>(
      blocks_.size() * sizeof(KVCacheBlock) + free_queue_.memory_bytes() +
      2 * hash_map_.capacity() * sizeof(BlockId) + stored_.size() * sizeof(Stored) +
      block_tokens_.size() * sizeof(TokenId) + guards_.size() * sizeof(Guard) +
      (orphans_
           ? orphans_->entries.capacity() * sizeof(OrphanTable::Entry) +
                 orphans_->tokens.capacity() * sizeof(TokenId) +
                 (orphans_->free.capacity() + orphans_->slots.capacity()) * sizeof(std::uint32_t)
           : 0) +
      (contents_ ? contents_->words.size() * sizeof(std::uint32_t) +
                       contents_->slots.size() * sizeof(ContentTable::Slot) +
                       contents_->free_ids.capacity() * sizeof(std::uint32_t)
                 : 0) +
      ret_memory_bytes());
  return bytes / static_cast<double>(blocks_.size());
}

}  // namespace pagedkv
