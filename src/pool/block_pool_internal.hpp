// src/pool/block_pool_internal.hpp: what the pool's source files share and nothing else sees.
//
// BlockPool's implementation is split by concept: block_pool.cpp (allocation, free, touch, store,
// lookup, eviction: the hot paths), block_pool_guards.cpp (content identities of prefixes and the
// guarded chain hashes' records), block_pool_events.cpp (KV event buffering and delivery),
// block_pool_check.cpp (invariants, snapshots, metadata size). This header holds the private
// tables those files share (extra-key interning, content ids, orphan records) and the small
// helpers they inline. The helpers keep internal linkage (an unnamed namespace; [[maybe_unused]]
// where a file does not call one): each source file compiles its own copies, as when they sat in
// one file, so the hot paths' code is unchanged by
// the split (bench/codegen_diff.py checks that; bench/results/block_pool.md).
// Not installed; included only from src/pool/.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "../base/vector_growth.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/pool/block_pool.hpp"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace pagedkv {

namespace {

[[maybe_unused]] bool encode_present_extra_keys(const BlockSequence& seq, std::size_t p,
                                                BlockPool::LookupScratch& sc);

// Encodes seq's block `p`'s extra keys (canonical form) into sc.extra; false when it has none
// (most blocks: then nothing is built, and the check is inlined).
[[gnu::always_inline]] inline bool encode_block_extra_keys(const BlockSequence& seq, std::size_t p,
                                                           BlockPool::LookupScratch& sc) {
  return seq.has_extra_keys(p) && encode_present_extra_keys(seq, p, sc);
}

bool encode_present_extra_keys(const BlockSequence& seq, std::size_t p,
                               BlockPool::LookupScratch& sc) {
  const BlockExtraKeys extra = seq.block_extra_keys(p, sc.mm);
  if (extra.empty()) return false;
  encode_extra_keys(extra, sc.extra);
  return true;
}

// Map slots per block: 4 (load <= 0.25; eviction-heavy replays run markedly faster than at 2:
// bench/results/pool_hash_speed.md, fourth and fifth passes).
constexpr std::size_t kMapSlotsPerBlock = 4;

// Chain-hash identities: the material word kept in KVCacheBlock::content_id (block_pool.hpp).
constexpr std::uint32_t kExtraIdBits = 30;
constexpr std::uint32_t kExtraIdMask = (std::uint32_t{1} << kExtraIdBits) - 1;
// Extra-key ids fit the word's low bits (ExtraKeyTable refuses more live ids).
constexpr std::uint32_t kMaxExtraIds = kExtraIdMask;

[[maybe_unused]] std::uint32_t parent_size_code(const BlockHash& h) noexcept {
  return h.size() == 0 ? 0 : h.size() <= 16 ? 1 : 2;
}
[[maybe_unused]] std::uint32_t material_word(std::uint32_t extra_id,
                                             const BlockHash& parent) noexcept {
  return (parent_size_code(parent) << kExtraIdBits) | extra_id;
}
// Equality of 16 * k bytes (k = 2: a padded hash; k = 4: a 16-token block), the compares of
// every verified hit: 16-byte SSE2 compares and one mask test, fewer instructions than an
// inlined memcmp.
template <std::size_t k>
inline bool equal_16k_bytes(const void* a, const void* b) noexcept {
#if defined(__SSE2__)
  const auto* x = static_cast<const __m128i*>(a);
  const auto* y = static_cast<const __m128i*>(b);
  __m128i eq = _mm_cmpeq_epi8(_mm_loadu_si128(x), _mm_loadu_si128(y));
  for (std::size_t w = 1; w < k; ++w) {
    eq = _mm_and_si128(eq, _mm_cmpeq_epi8(_mm_loadu_si128(x + w), _mm_loadu_si128(y + w)));
  }
  return _mm_movemask_epi8(eq) == 0xffff;
#else
  return std::memcmp(a, b, 16 * k) == 0;
#endif
}
static_assert(BlockHash::kMaxSize == 32 && sizeof(TokenId) == 4);

// Whether a block's stored tokens equal the request's `bs` tokens.
inline bool same_block_tokens(const TokenId* stored, const TokenId* tokens,
                              std::uint32_t bs) noexcept {
  if (bs == 16) return equal_16k_bytes<4>(stored, tokens);  // the usual block
  return std::memcmp(stored, tokens, bs * sizeof(TokenId)) == 0;
}

// The parent hash of a chain's first block (size code 0).
constexpr BlockHash kRootHash{};

// Whether a block's stored parent (its bytes, and the size code in its material word) is `want`.
inline bool same_parent(const std::uint8_t* stored, std::uint32_t word,
                        const BlockHash& want) noexcept {
  return (word >> kExtraIdBits) == parent_size_code(want) &&
         equal_16k_bytes<2>(stored, want.padded_bytes().data());
}

[[maybe_unused]] std::string id_text(BlockId id) {
  return "block " + std::to_string(id);
}

[[maybe_unused]] [[noreturn]] [[gnu::cold]] void throw_unverified_prefix(const char* where) {
  throw Error(ErrorCode::kInvalidState,
              std::string(where) +
                  ": the pool guards its chain hashes (guard_chain_hashes), which identify a "
                  "prefix only when matched from block 0, not after an unverified prefix");
}

[[maybe_unused]] [[noreturn]] [[gnu::cold]] void throw_no_parent_hashes() {
  throw Error(ErrorCode::kInvalidState,
              "BlockPool::match_cached_block_after: the pool identifies prefixes by content ids "
              "(chain_hashes_identify_prefix is off), not by parent hashes");
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
      if (free_ids.empty() && refs.size() > kMaxExtraIds) {
        throw Error(ErrorCode::kOutOfRange, "BlockPool: more than " + std::to_string(kMaxExtraIds) +
                                                " distinct extra keys cached at once");
      }
      // Everything that may allocate comes first; from the emplace on nothing throws.
      detail::reserve_more(refs, 1);
      detail::reserve_more(keys, 1);
      if (free_ids.capacity() < refs.size() + 1) detail::grow_to(free_ids, refs.size() + 1);
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

// Hash-consed prefix contents: entry id -> (parent id, block size, extra-key id, tokens), at
// most one entry per distinct content, so equal ids mean equal whole prefixes (by induction over
// the parent ids). Id 0 is the empty prefix (the root) and never stored. Entries are reference
// counted by the cached blocks (and pending stores) holding them and by their children; an
// entry holds one reference on its parent and one on its extra keys. An open-addressing index
// (linear probing, backward-shift deletion) keyed by the block's chain hash finds an entry by
// content; freed ids form a list threaded through the entries. reserve() is the only call that
// allocates; insert() and erase() never do.
struct BlockPool::ContentTable {
  static constexpr std::size_t kParent = 0, kSize = 1, kExtra = 2, kRefs = 3, kTag = 4,
                               kChildren = 5, kHeader = 6;
  struct Slot {
    std::uint32_t id;  // 0: empty
    std::uint32_t tag;
  };
  std::size_t stride;                   // words per entry: kHeader + max tokens per block
  TableVector<std::uint32_t> words;     // entry id * stride; entry 0 unused
  std::uint32_t next = 1;               // ids [1, next) have been handed out
  std::vector<std::uint32_t> free_ids;  // a stack; capacity >= capacity(): never allocates
  TableVector<Slot> slots;
  std::size_t mask = 0;
  std::size_t live = 0;
  std::size_t num_entries = 0;  // words.size() / stride, kept (no division per block)

  ContentTable(std::size_t max_tokens, std::size_t entries) : stride(kHeader + max_tokens) {
    words.assign(std::max<std::size_t>(entries, 2) * stride, 0);
    num_entries = words.size() / stride;
    free_ids.reserve(capacity());
    slots.assign(slot_count(capacity()), Slot{0, 0});
    mask = slots.size() - 1;
  }
  std::size_t capacity() const noexcept { return num_entries; }
  static std::size_t slot_count(std::size_t entries) noexcept {
    std::size_t n = 8;
    while (n < 2 * entries) n *= 2;
    return n;
  }
  static std::uint32_t tag_of(const BlockHash& hash) noexcept {
    const std::uint64_t x = static_cast<std::uint64_t>(hash.hash_code()) * 0x9E3779B97F4A7C15ull;
    return static_cast<std::uint32_t>(x >> 32);
  }
  std::uint32_t* entry(std::uint32_t id) noexcept { return &words[id * stride]; }
  const std::uint32_t* entry(std::uint32_t id) const noexcept { return &words[id * stride]; }
  std::size_t room() const noexcept { return free_ids.size() + (capacity() - next); }
  // Starts loading the entry that the k-th next insert() will write (when no lookup hits in
  // between): the top of the free stack, then the fresh ids.
  void prefetch_insert(std::size_t k) const noexcept {
    if (k < free_ids.size()) {
      __builtin_prefetch(entry(free_ids[free_ids.size() - 1 - k]), 1);
    } else if (next + (k - free_ids.size()) < capacity()) {
      __builtin_prefetch(entry(static_cast<std::uint32_t>(next + (k - free_ids.size()))), 1);
    }
  }

  // Makes room for k more entries. May throw bad_alloc and then changes nothing.
  void reserve(std::size_t k) {
    if (room() >= k) return;
    std::size_t cap = capacity();
    while (free_ids.size() + (cap - next) < k) cap += cap / 2;  // geometric: amortised O(1)
    TableVector<std::uint32_t> w(cap * stride, 0);
    TableVector<Slot> s(slot_count(cap), Slot{0, 0});
    free_ids.reserve(cap);
    // Nothing below throws.
    std::copy(words.begin(), words.end(), w.begin());
    const std::size_t m = s.size() - 1;
    for (const Slot& slot : slots) {
      if (slot.id == 0) continue;
      std::size_t i = slot.tag & m;
      while (s[i].id != 0) i = (i + 1) & m;
      s[i] = slot;
    }
    words.swap(w);
    slots.swap(s);
    mask = m;
    num_entries = cap;
  }

  template <typename Match>
  std::uint32_t find(std::uint32_t tag, Match&& match) const noexcept {
    for (std::size_t i = tag & mask; slots[i].id != 0; i = (i + 1) & mask) {
      if (slots[i].tag == tag && match(entry(slots[i].id))) return slots[i].id;
    }
    return 0;
  }
  void prefetch(std::uint32_t tag) const noexcept { __builtin_prefetch(&slots[tag & mask]); }

  // Writes a new entry with one reference at `e` (the header, then `size` tokens).
  static void fill(std::uint32_t* e, std::uint32_t tag, std::uint32_t parent, std::uint32_t size,
                   std::uint32_t extra, const TokenId* tokens) noexcept {
    e[kParent] = parent;
    e[kSize] = size;
    e[kExtra] = extra;
    e[kRefs] = 1;
    e[kTag] = tag;
    e[kChildren] = 0;
    static_assert(sizeof(TokenId) == sizeof(std::uint32_t));
    if (size == 16) {  // the usual block: a constant-size copy
      std::memcpy(e + kHeader, tokens, 16 * sizeof(TokenId));
    } else {
      std::memcpy(e + kHeader, tokens, size * sizeof(TokenId));
    }
  }
  // Puts id into the first empty slot of tag's probe run.
  static void place(Slot* index, std::size_t m, std::uint32_t id, std::uint32_t tag) noexcept {
    std::size_t i = tag & m;
    while (index[i].id != 0) i = (i + 1) & m;
    index[i] = Slot{id, tag};
  }

  // A new entry with one reference. Precondition: room() > 0.
  std::uint32_t insert(std::uint32_t tag, std::uint32_t parent, std::uint32_t size,
                       std::uint32_t extra, const TokenId* tokens) noexcept {
    std::uint32_t id = 0;
    if (free_ids.empty()) {
      id = next++;
    } else {
      id = free_ids.back();
      free_ids.pop_back();
    }
    fill(entry(id), tag, parent, size, extra, tokens);
    place(slots.data(), mask, id, tag);
    ++live;
    return id;
  }

  // insert() of a fresh chain: entry k (k = 0 .. n - 1) gets tag tags(k), the tokens at
  // tokens + k * size and, as parent, `parent` for k = 0 and entry k - 1's id after it (each
  // parent gaining a reference and a child), no extra keys; the ids go to `out` in order.
  // Equivalent to n insert()s with those parent updates, but the table's fields stay in
  // registers across the run (stores into the entries may alias `next`, so a loop of insert()s
  // reloads them per entry). Precondition: room() >= n.
  template <typename Tags>
  void insert_chain(std::uint32_t parent, std::uint32_t size, const TokenId* tokens, std::size_t n,
                    Tags&& tags, std::uint32_t* out) noexcept {
    std::uint32_t* const base = words.data();
    const std::size_t step = stride;
    Slot* const index = slots.data();
    const std::size_t m = mask;
    std::uint32_t fresh = next;
    std::size_t spare = free_ids.size();
    const std::uint32_t* const stack = free_ids.data();
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint32_t id = spare > 0 ? stack[--spare] : fresh++;
      const std::uint32_t tag = tags(k);
      fill(base + id * step, tag, parent, size, 0, tokens + k * size);
      place(index, m, id, tag);
      if (parent != 0) {
        std::uint32_t* pe = base + parent * step;
        ++pe[kRefs];
        ++pe[kChildren];
      }
      out[k] = id;
      parent = id;
    }
    free_ids.resize(spare);  // shrinks: never allocates
    next = fresh;
    live += n;
  }

  // Removes a live entry from the index and frees its id.
  void erase(std::uint32_t id) noexcept {
    std::size_t i = entry(id)[kTag] & mask;
    while (slots[i].id != id) i = (i + 1) & mask;  // present: ends
    std::size_t j = i;
    for (;;) {
      j = (j + 1) & mask;
      if (slots[j].id == 0) break;
      const std::size_t k = slots[j].tag & mask;
      const bool movable = i <= j ? (k <= i || k > j) : (k <= i && k > j);
      if (movable) {
        slots[i] = slots[j];
        i = j;
      }
    }
    slots[i] = Slot{0, 0};
    entry(id)[kRefs] = 0;
    free_ids.push_back(id);  // capacity >= capacity(): never allocates
    --live;
  }

  void clear() noexcept {
    std::fill(slots.begin(), slots.end(), Slot{0, 0});
    std::fill(words.begin(), words.end(), 0);
    free_ids.clear();
    next = 1;
    live = 0;
  }
};

// Guarded chain hashes: records of prefixes that no cached block holds any more but that cached
// blocks, other orphans or pending stores name as their parent (Guard::children > 0 when the
// block was evicted). At most one per (hash, group), found by an open-addressing index (linear
// probing, backward-shift deletion). Rare in a full-attention workload (a chain's tail is evicted
// before its head); reserve() is the only call that allocates.
struct BlockPool::OrphanTable {
  struct Entry {
    BlockHash hash;    // the prefix's chained hash: the key, with group
    BlockHash parent;  // its parent's chained hash (empty: block 0)
    BlockId link = kRootLink;
    std::uint32_t link_gen = 0;
    std::uint32_t extra = 0;  // interned extra-key id (one reference)
    std::uint32_t children = 0;
    GroupId group = 0;
  };
  std::size_t stride;                // tokens per entry (the pool's block size)
  std::vector<Entry> entries;        // by index
  std::vector<TokenId> tokens;       // stride per entry
  std::vector<std::uint32_t> free;   // free entry indices (a stack)
  std::vector<std::uint32_t> slots;  // index + 1, 0: empty (none before the first reserve)
  std::size_t mask = 0;
  std::size_t live = 0;

  explicit OrphanTable(std::size_t block_size) : stride(block_size) {}

  static std::uint32_t tag(const BlockHash& hash, GroupId group) noexcept {
    return BlockHashMap::key_tag(hash, group);
  }
  // Room for k more entries. May throw bad_alloc and then changes nothing.
  void reserve(std::size_t k) {
    if (free.size() >= k) return;
    const std::size_t cap = std::max({2 * entries.size(), live + k, std::size_t{8}});
    std::vector<Entry> e(entries);
    e.resize(cap);
    std::vector<TokenId> t(tokens);
    t.resize(cap * stride);
    std::vector<std::uint32_t> f(free);
    f.reserve(cap);
    std::size_t n = 8;
    while (n < 2 * cap) n *= 2;
    std::vector<std::uint32_t> sl(n, 0);
    // Nothing below throws.
    for (std::size_t i = cap; i-- > entries.size();) f.push_back(static_cast<std::uint32_t>(i));
    const std::size_t m = n - 1;
    for (const std::uint32_t v : slots) {
      if (v == 0) continue;
      std::size_t i = tag(e[v - 1].hash, e[v - 1].group) & m;
      while (sl[i] != 0) i = (i + 1) & m;
      sl[i] = v;
    }
    entries.swap(e);
    tokens.swap(t);
    free.swap(f);
    slots.swap(sl);
    mask = m;
  }
  static constexpr std::uint32_t kNone = 0xffffffffu;
  std::uint32_t find(const BlockHash& hash, GroupId group) const noexcept {
    if (live == 0) return kNone;
    for (std::size_t i = tag(hash, group) & mask; slots[i] != 0; i = (i + 1) & mask) {
      const Entry& e = entries[slots[i] - 1];
      if (e.group == group && e.hash == hash) return slots[i] - 1;
    }
    return kNone;
  }
  // A new entry for (hash, group), indexed. Precondition: reserve() made room.
  std::uint32_t insert(const BlockHash& hash, GroupId group) noexcept {
    const std::uint32_t idx = free.back();
    free.pop_back();
    Entry& e = entries[idx];
    e = Entry{};
    e.hash = hash;
    e.group = group;
    std::size_t i = tag(hash, group) & mask;
    while (slots[i] != 0) i = (i + 1) & mask;
    slots[i] = idx + 1;
    ++live;
    return idx;
  }
  void erase(std::uint32_t idx) noexcept {
    std::size_t i = tag(entries[idx].hash, entries[idx].group) & mask;
    while (slots[i] != idx + 1) i = (i + 1) & mask;  // present: ends
    std::size_t j = i;
    for (;;) {
      j = (j + 1) & mask;
      if (slots[j] == 0) break;
      const Entry& o = entries[slots[j] - 1];
      const std::size_t k = tag(o.hash, o.group) & mask;
      if (i <= j ? (k <= i || k > j) : (k <= i && k > j)) {
        slots[i] = slots[j];
        i = j;
      }
    }
    slots[i] = 0;
    entries[idx] = Entry{};
    free.push_back(idx);  // capacity: every entry
    --live;
  }
  void clear() noexcept {
    std::fill(slots.begin(), slots.end(), 0);
    free.clear();
    for (std::size_t i = entries.size(); i-- > 0;) {
      entries[i] = Entry{};
      free.push_back(static_cast<std::uint32_t>(i));
    }
    live = 0;
  }
};

// Whether the record a link names is a block still holding it (then one child fewer there) or
// the root; false: it is the orphan filed under the link's parent hash.
inline bool BlockPool::release_block_link(BlockId link, std::uint32_t link_gen) noexcept {
  if (link == kRootLink) return true;
  if (link < 0) return false;
  Guard& p = guards_[static_cast<std::size_t>(link)];
  if (p.gen != link_gen) return false;  // evicted since: its record moved to an orphan
  assert(p.children > 0);
  --p.children;
  return true;
}

inline void BlockPool::release_link(BlockId id) noexcept {
  const auto i = static_cast<std::size_t>(id);
  const Guard& g = guards_[i];
  if (!release_block_link(g.link, g.link_gen)) {
    release_parent(kOrphanLink, 0, stored_parent(i),
                   blocks_[i].group_id);  // reads stored_ only now
  }
}

}  // namespace pagedkv
