#include "pagedkv/pool/block_pool.hpp"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

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
  TableVector<KVCacheBlock> blocks(static_cast<std::size_t>(config.num_blocks));
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].block_id = static_cast<BlockId>(i);
  blocks[kNullBlockId].is_null = true;
  return blocks;
}

bool encode_present_extra_keys(const BlockSequence& seq, std::size_t p,
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

std::uint32_t parent_size_code(const BlockHash& h) noexcept {
  return h.size() == 0 ? 0 : h.size() <= 16 ? 1 : 2;
}
std::uint32_t material_word(std::uint32_t extra_id, const BlockHash& parent) noexcept {
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

std::string id_text(BlockId id) {
  return "block " + std::to_string(id);
}

[[noreturn]] [[gnu::cold]] void throw_unverified_prefix(const char* where) {
  throw Error(ErrorCode::kInvalidState,
              std::string(where) +
                  ": the pool guards its chain hashes (guard_chain_hashes), which identify a "
                  "prefix only when matched from block 0, not after an unverified prefix");
}

[[noreturn]] [[gnu::cold]] void throw_no_parent_hashes() {
  throw Error(ErrorCode::kInvalidState,
              "BlockPool::match_cached_block_after: the pool identifies prefixes by content ids "
              "(chain_hashes_identify_prefix is off), not by parent hashes");
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
      if (free_ids.empty() && refs.size() > kMaxExtraIds) {
        throw Error(ErrorCode::kOutOfRange, "BlockPool: more than " + std::to_string(kMaxExtraIds) +
                                                " distinct extra keys cached at once");
      }
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

BlockPool::PendingStore::PendingStore(PendingStore&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
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
}

BlockPool::~BlockPool() = default;

double BlockPool::usage() const noexcept {
  return 1.0 - static_cast<double>(free_queue_.size()) / (config_.num_blocks - 1);
}

void BlockPool::throw_out_of_range(BlockId id) const {
  throw Error(ErrorCode::kOutOfRange, "BlockPool: " + id_text(id) + " is out of range [0, " +
                                          std::to_string(config_.num_blocks) + ")");
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
    // from seq's own material through the table.
    std::uint32_t parent = 0;  // the root: chain from seq's block 0
    std::size_t start = 0;
    for (std::size_t j = prefix_row.size(); j-- > 0;) {
      const BlockId b = prefix_row[j];
      if (b > 0 && b < config_.num_blocks && blocks_[static_cast<std::size_t>(b)].is_cached()) {
        parent = blocks_[static_cast<std::size_t>(b)].content_id;
        start = first - prefix_row.size() + j + 1;
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
      b.ref_cnt = -b.ref_cnt;
    } else {
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
  out.reserve(out.size() + (end - begin));  // out grows here only, before any change
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

bool BlockPool::same_content_chain(BlockId parent, BlockId child) const noexcept {
  if (!verifying()) return true;
  const KVCacheBlock& p = blocks_[static_cast<std::size_t>(parent)];
  if (chain_identity_) {
    const auto c = static_cast<std::size_t>(child);
    return same_parent(stored_[c].parent.data(), blocks_[c].content_id, p.block_hash);
  }
  const std::uint32_t c = blocks_[static_cast<std::size_t>(child)].content_id;
  return contents_->entry(c)[ContentTable::kParent] == p.content_id;
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
  if (count + in_use + 1 != config_.num_blocks) fail("free + in use + null != total blocks");
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
                 : 0));
  return bytes / static_cast<double>(blocks_.size());
}

}  // namespace pagedkv
