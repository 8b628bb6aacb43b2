// BlockPool: content identities of prefixes (content ids) and the guarded chain hashes' records
// (links, orphans, guarded inserts). Contract: block_pool.hpp ("Verification"); shared tables:
// block_pool_internal.hpp.

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "block_pool_internal.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/pool/block_pool.hpp"

namespace pagedkv {

bool BlockPool::same_content_chain(BlockId parent, BlockId child) const {
  // Ids in range only: the sliding-window search calls this per run block, and a test of the
  // blocks' hashes too cost 4% of its lookup (bench_block_pool, BM_GetComputedBlocksWindow32k/0).
  const auto n = static_cast<std::uint32_t>(config_.num_blocks);
  if (static_cast<std::uint32_t>(parent) >= n || static_cast<std::uint32_t>(child) >= n)
      [[unlikely]] {
    throw_out_of_range(static_cast<std::uint32_t>(parent) >= n ? parent : child);
  }
  const KVCacheBlock& p = blocks_[static_cast<std::size_t>(parent)];
  if (!verifying()) return true;
  if (chain_identity_) {
    const auto c = static_cast<std::size_t>(child);
    return same_parent(stored_[c].parent.data(), blocks_[c].content_id, p.block_hash);
  }
  const std::uint32_t c = blocks_[static_cast<std::size_t>(child)].content_id;
  return contents_->entry(c)[ContentTable::kParent] == p.content_id;
}

void BlockPool::throw_no_chain_material() {
  throw Error(ErrorCode::kInvalidState,
              "BlockPool: this pool stores no chain material (stores_chain_material() is false: "
              "verify_cache_hits with chain_hashes_identify_prefix or guard_chain_hashes)");
}

std::uint32_t BlockPool::find_content(std::uint32_t parent, const BlockSequence& seq, std::size_t p,
                                      LookupScratch& scratch) const {
  std::uint32_t eid = 0;
  if (encode_block_extra_keys(seq, p, scratch)) {
    eid = extra_keys_->find(scratch.extra);
    if (eid == 0) return 0;  // no id has these extra keys
  }
  const std::uint32_t bs = seq.block_size;
  const TokenId* tokens = seq.tokens.data() + p * bs;
  return contents_->find(ContentTable::tag_of(seq.block_hashes[p]), [&](const std::uint32_t* e) {
    return e[ContentTable::kParent] == parent && e[ContentTable::kSize] == bs &&
           e[ContentTable::kExtra] == eid &&
           std::memcmp(e + ContentTable::kHeader, tokens, bs * sizeof(TokenId)) == 0;
  });
}

std::uint32_t BlockPool::acquire_content(std::uint32_t parent, const BlockSequence& seq,
                                         std::size_t p) {
  // An id without children has no child content to find: a run of new blocks skips the search.
  const std::uint32_t found = parent != 0 && contents_->entry(parent)[ContentTable::kChildren] == 0
                                  ? 0
                                  : find_content(parent, seq, p, store_scratch_);
  if (found != 0) {
    ++contents_->entry(found)[ContentTable::kRefs];
    return found;
  }
  contents_->reserve(1);  // may throw: nothing changed yet
  // acquire() may throw: nothing changed yet.
  const std::uint32_t eid = encode_block_extra_keys(seq, p, store_scratch_)
                                ? extra_keys_->acquire(store_scratch_.extra)
                                : 0;
  // Nothing below throws.
  const std::uint32_t bs = seq.block_size;
  const std::uint32_t id = contents_->insert(ContentTable::tag_of(seq.block_hashes[p]), parent, bs,
                                             eid, seq.tokens.data() + p * bs);
  if (parent != 0) {
    ++contents_->entry(parent)[ContentTable::kRefs];
    ++contents_->entry(parent)[ContentTable::kChildren];
  }
  return id;
}

void BlockPool::release_content(std::uint32_t id) noexcept {
  while (id != 0) {
    std::uint32_t* e = contents_->entry(id);
    if (--e[ContentTable::kRefs] != 0) return;
    const std::uint32_t parent = e[ContentTable::kParent];
    extra_keys_->release(e[ContentTable::kExtra]);
    if (parent != 0) --contents_->entry(parent)[ContentTable::kChildren];
    contents_->erase(id);
    id = parent;
  }
}

BlockHash BlockPool::stored_parent(std::size_t i) const noexcept {
  const std::uint32_t code = blocks_[i].content_id >> kExtraIdBits;
  if (code == 0) return BlockHash();
  return BlockHash(std::span<const std::uint8_t>(stored_[i].parent.data(), code == 1 ? 16 : 32));
}

void BlockPool::release_parent(BlockId link, std::uint32_t link_gen, BlockHash parent_hash,
                               GroupId group) noexcept {
  while (!release_block_link(link, link_gen)) {
    OrphanTable& t = *orphans_;
    const std::uint32_t idx = t.find(parent_hash, group);
    assert(idx != OrphanTable::kNone);
    if (idx == OrphanTable::kNone) return;  // a broken invariant (check_invariants names it)
    OrphanTable::Entry& e = t.entries[idx];
    if (--e.children != 0) return;
    link = e.link;
    link_gen = e.link_gen;
    parent_hash = e.parent;
    extra_keys_->release(e.extra);
    t.erase(idx);
  }
}

void BlockPool::evict_guarded(BlockId id) noexcept {
  const auto i = static_cast<std::size_t>(id);
  const KVCacheBlock& b = blocks_[i];
  const Guard& g = guards_[i];
  const std::uint32_t eid = b.content_id & kExtraIdMask;
  OrphanTable& t = *orphans_;
  if (const std::uint32_t have = t.find(b.block_hash, b.group_id); have != OrphanTable::kNone) {
    // The orphan of this very content (one per hash) takes the children.
    t.entries[have].children += g.children;
    extra_keys_->release(eid);
    release_link(id);
    return;
  }
  // Cached blocks name this prefix as their parent: it stays as an orphan (room reserved by the
  // evicting call), which takes over the extra keys and the parent reference.
  const std::uint32_t idx = t.insert(b.block_hash, b.group_id);
  OrphanTable::Entry& e = t.entries[idx];
  e.parent = stored_parent(i);
  e.link = g.link;
  e.link_gen = g.link_gen;
  e.extra = eid;
  e.children = g.children;
  std::memcpy(&t.tokens[idx * t.stride], &block_tokens_[i * config_.block_size],
              config_.block_size * sizeof(TokenId));
}

[[gnu::noinline]] BlockId BlockPool::insert_guarded_slow(BlockId id, std::uint32_t tag,
                                                         const BlockSequence& seq, std::size_t p,
                                                         std::uint32_t eid) {
  const TokenId* tokens = seq.tokens.data() + p * seq.block_size;
  const BlockHash& parent = p > 0 ? seq.block_hashes[p - 1] : kRootHash;
  return hash_map_.insert_tagged_unless(id, tag, [&](BlockId c) {
    return !stored_material_is(static_cast<std::size_t>(c), tokens, seq.block_size, eid, parent);
  });
}

// Whether block i's stored material (extra-key id, parent hash, tokens) is the given one.
bool BlockPool::stored_material_is(std::size_t i, const TokenId* tokens, std::uint32_t bs,
                                   std::uint32_t eid, const BlockHash& parent) const noexcept {
  const std::uint32_t word = blocks_[i].content_id;
  return (word & kExtraIdMask) == eid && same_parent(stored_[i].parent.data(), word, parent) &&
         same_block_tokens(&block_tokens_[i * config_.block_size], tokens, bs);
}

// The same for orphan entry idx.
bool BlockPool::orphan_material_is(std::uint32_t idx, const TokenId* tokens, std::uint32_t bs,
                                   std::uint32_t eid, const BlockHash& parent) const noexcept {
  const OrphanTable& t = *orphans_;
  const OrphanTable::Entry& e = t.entries[idx];
  return e.extra == eid && e.parent == parent &&
         std::memcmp(&t.tokens[idx * t.stride], tokens, bs * sizeof(TokenId)) == 0;
}

bool BlockPool::orphan_conflicts(const BlockSequence& seq, std::size_t p, std::uint32_t eid,
                                 GroupId group) const noexcept {
  const std::uint32_t idx = orphans_->find(seq.block_hashes[p], group);
  return idx != OrphanTable::kNone &&
         !orphan_material_is(idx, seq.tokens.data() + p * seq.block_size, seq.block_size, eid,
                             p > 0 ? seq.block_hashes[p - 1] : kRootHash);
}

bool BlockPool::conflicts(const BlockHash& hash, GroupId group, const BlockSequence& seq,
                          std::size_t p, std::uint32_t eid, const BlockHash& parent, BlockId* found,
                          std::uint32_t* orphan) const noexcept {
  const std::uint32_t bs = seq.block_size;
  const TokenId* tokens = seq.tokens.data() + p * bs;
  const BlockId other = hash_map_.find_first(hash, group, [&](BlockId c) {
    const bool same = stored_material_is(static_cast<std::size_t>(c), tokens, bs, eid, parent);
    if (same && found != nullptr && *found == kNoBlock) *found = c;
    return !same;
  });
  if (other != BlockHashMap::kEmpty) return true;
  const std::uint32_t idx = orphans_->find(hash, group);
  if (idx == OrphanTable::kNone) return false;
  const bool same = orphan_material_is(idx, tokens, bs, eid, parent);
  if (same && orphan != nullptr) *orphan = idx;
  return !same;
}

void BlockPool::acquire_guarded_parent(PendingStore& st, const BlockSequence& seq,
                                       std::span<const BlockId> prefix_row) {
  const std::size_t first = st.first_;
  const GroupId group = st.group_;
  const auto hashes = seq.block_hashes;
  // The nearest cached block of the prefix holds seq's block there (prefix_row's contract, as
  // with content ids); its hash and group are checked.
  BlockId link = kRootLink;
  std::uint32_t gen = 0;
  std::size_t start = 0;  // blocks [start, first) of seq need a record
  for (std::size_t j = prefix_row.size(); j-- > 0;) {
    const BlockId b = prefix_row[j];
    const std::size_t level = first - prefix_row.size() + j;
    if (b <= 0 || b >= config_.num_blocks) continue;
    const KVCacheBlock& pb = blocks_[static_cast<std::size_t>(b)];
    if (pb.is_cached() && pb.group_id == group && pb.block_hash == hashes[level]) {
      link = b;
      gen = guards_[static_cast<std::size_t>(b)].gen;
      start = level + 1;
      break;
    }
  }
  // Takes a reference on the record `link` names (of seq's block level, the root below 0).
  const auto take = [&](std::size_t level) {
    if (link == kRootLink) return;
    if (link >= 0) {
      ++guards_[static_cast<std::size_t>(link)].children;
    } else {
      ++orphans_->entries[orphans_->find(hashes[level], group)].children;
    }
  };
  if (start < first) {
    // Rare (the parent is not a known cached block): find or make a record of each block in
    // between, from seq's material. Everything that may throw comes first.
    std::vector<std::uint32_t>& eids = walk_eids_;  // one reference each: an orphan's or released
    eids.clear();
    eids.reserve(first - start);
    orphans_->reserve(first - start);
    try {
      for (std::size_t k = start; k < first; ++k) {
        eids.push_back(encode_block_extra_keys(seq, k, store_scratch_)
                           ? extra_keys_->acquire(store_scratch_.extra)
                           : 0);
      }
    } catch (...) {
      for (const std::uint32_t e : eids) extra_keys_->release(e);
      eids.clear();
      throw;
    }
    // Nothing below throws.
    const auto release_eids = [&] {
      for (const std::uint32_t e : eids) extra_keys_->release(e);
      eids.clear();
    };
    bool made = false;  // made orphans for blocks [.., k): the newest has no children yet
    for (std::size_t k = start; k < first; ++k) {
      const BlockHash& parent = k > 0 ? hashes[k - 1] : kRootHash;
      BlockId found = kNoBlock;
      std::uint32_t orphan = OrphanTable::kNone;
      if (conflicts(hashes[k], group, seq, k, eids[k - start], parent, &found, &orphan)) {
        if (made) {  // free the orphans made here (the newest first, through its parents)
          ++orphans_->entries[orphans_->find(parent, group)].children;
          release_parent(kOrphanLink, 0, parent, group);
        }
        release_eids();
        st.refused_ = true;
        return;
      }
      if (found != kNoBlock) {
        link = found;
        gen = guards_[static_cast<std::size_t>(found)].gen;
      } else if (orphan != OrphanTable::kNone) {
        link = kOrphanLink;
        gen = 0;
      } else {
        if (k > 0) take(k - 1);
        const std::uint32_t idx = orphans_->insert(hashes[k], group);
        OrphanTable::Entry& e = orphans_->entries[idx];
        e.parent = parent;
        e.link = link;
        e.link_gen = gen;
        e.extra = std::exchange(eids[k - start], 0);
        TokenId* to = &orphans_->tokens[idx * orphans_->stride];
        std::fill(to, to + orphans_->stride, 0);
        std::memcpy(to, seq.tokens.data() + k * seq.block_size, seq.block_size * sizeof(TokenId));
        link = kOrphanLink;
        gen = 0;
        made = true;
      }
    }
    release_eids();
  }
  take(first - 1);
  st.parent_link_ = link;
  st.parent_gen_ = gen;
  st.parent_held_ = true;
}

bool BlockPool::cached_after_prefix(BlockId child, const BlockSequence& seq, std::size_t index,
                                    BlockId anchor, std::size_t anchor_end,
                                    LookupScratch* scratch) const {
  const auto where = [] { return std::string("BlockPool::cached_after_prefix: "); };
  if (!block(child).is_cached()) {  // block() throws when out of range
    throw Error(ErrorCode::kInvalidArgument, where() + id_text(child) + " is not cached");
  }
  if (anchor != kNoBlock && !block(anchor).is_cached()) {
    throw Error(ErrorCode::kInvalidArgument,
                where() + "anchor " + id_text(anchor) + " is not cached");
  }
  if (anchor_end > index || (anchor == kNoBlock) != (anchor_end == 0)) {
    throw Error(ErrorCode::kInvalidArgument, where() + "anchor end " + std::to_string(anchor_end) +
                                                 " for block " + std::to_string(index) +
                                                 (anchor == kNoBlock ? " without an anchor" : ""));
  }
  validate_sequence(seq, index, "BlockPool::cached_after_prefix");
  if (!verifying()) return true;
  if (guarded_ && index > 0) throw_unverified_prefix("BlockPool::cached_after_prefix");
  if (chain_identity_) {  // the chained hash of seq's block index - 1 names that prefix
    const auto c = static_cast<std::size_t>(child);
    return same_parent(stored_[c].parent.data(), blocks_[c].content_id,
                       index == 0 ? kRootHash : seq.block_hashes[index - 1]);
  }
  // Content ids: walk seq's blocks after the anchor (or the root) through the content table.
  // Every ancestor of a live id is live, so if seq's prefix is the child's parent prefix, each
  // of its blocks is found.
  const std::uint32_t want =
      contents_->entry(blocks_[static_cast<std::size_t>(child)].content_id)[ContentTable::kParent];
  LookupScratch local;
  LookupScratch& sc = scratch != nullptr ? *scratch : local;
  std::uint32_t id = anchor == kNoBlock ? 0 : blocks_[static_cast<std::size_t>(anchor)].content_id;
  for (std::size_t p = anchor_end; p < index; ++p) {
    id = find_content(id, seq, p, sc);
    if (id == 0) return false;
  }
  return id == want;
}

}  // namespace pagedkv
