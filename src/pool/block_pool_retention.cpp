// BlockPool: retention priorities, the pin budget and the non-LRU eviction policies.
//
// A pool keeps this state (ret_) when its policy is not LRU, or once an LRU pool is asked for a
// non-default retention priority. Its free blocks then live in lists of their own instead of the
// LRU queue: list 0 holds the free uncached blocks (handed out first, as at the LRU queue's
// head), and each priority level has kSegs lists (segments) of free cached blocks whose use
// depends on the policy (eviction_policy.hpp): LRU uses segment 0 alone; SLRU: 0 probation,
// 1 protected; S3-FIFO: 0 small, 1 main; lineage: segment r < kRanks the blocks of rank r that
// were not hit (a bitmap of non-empty ranks per level, cleared lazily), segment kRanks the
// protected ones. Eviction takes list 0's head, else a victim of the
// lowest level with a free cached block (a bitmap of levels that may be non-empty, cleared
// lazily: O(1) amortized). Links live in an array by block id (as the LRU queue's), so every
// list operation is O(1) and allocation free.
// Compiled on its own (not in the pool's unity group), so the LRU paths' code is unchanged by it:
// they reach these functions through one test of ret_ per call.

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../base/vector_growth.hpp"
#include "block_pool_internal.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/pool/block_pool.hpp"

namespace pagedkv {

namespace {
// adaptive: two ghost FIFOs of the fingerprints of recently evicted cached blocks (B1: evicted
// without a hit since cached, B2: evicted after one), each holding at most `cap` entries (the
// oldest is dropped past that), and an open-addressing table (linear probing, backward-shift
// deletion, load <= 1/2) with one slot per FIFO entry: a 32-bit tag of its fingerprint and its
// FIFO position. A fingerprint is in at most one entry. An entry leaves its FIFO `cap` records
// into that FIFO after its own, or when taken. take() and record() match tags only: a false match
// (two fingerprints that share their table run and tag) only moves the target by one step.
// Allocated by the constructor only; every operation is O(1) expected and allocation free.
class AdaptiveGhosts {
 public:
  explicit AdaptiveGhosts(std::size_t cap)
      : cap_(static_cast<std::uint32_t>(std::max<std::size_t>(cap, 1))),
        ring_(2 * static_cast<std::size_t>(cap_), 0),
        table_(std::bit_ceil(4 * static_cast<std::size_t>(cap_))),
        mask_(table_.size() - 1) {}

  // A block's fingerprint: 64 bits of its hash mixed with its group; never 0 (an empty entry).
  static std::uint64_t fingerprint(const BlockHash& h, GroupId g) noexcept {
    const std::uint64_t x = h.hash_code() ^ (static_cast<std::uint64_t>(g) * 0x9e3779b97f4a7c15ull);
    return x != 0 ? x : 1;
  }
  // Entries in FIFO `which`.
  std::uint32_t size(int which) const noexcept { return live_[static_cast<std::size_t>(which)]; }
  std::uint32_t capacity() const noexcept { return cap_; }

  // Starts loading what take(fp) reads. Both prefetch functions are always inlined: GCC 12
  // otherwise finds a function whose only effect is a prefetch pure and deletes its calls.
  [[gnu::always_inline]] void prefetch(std::uint64_t fp) const noexcept {
    __builtin_prefetch(&table_[home(fp)]);
  }
  // Starts loading what the k-th next record() into FIFO `which` reads besides fp's run.
  [[gnu::always_inline]] void prefetch_oldest(int which, std::uint32_t k) const noexcept {
    const std::uint32_t pos = (head_[static_cast<std::size_t>(which)] + k) % cap_;
    const std::uint64_t old = ring_[static_cast<std::size_t>(which) * cap_ + pos];
    if (old != 0) __builtin_prefetch(&table_[home(old)]);
  }

  // Records fp as evicted into FIFO `which` (0: B1, 1: B2), in place of an entry of fp in either
  // FIFO (blocks of one hash cached at once: the last eviction counts), dropping that FIFO's
  // oldest entry when it is full.
  void record(int which, std::uint64_t fp) noexcept {
    (void)take(fp);  // fp's table run: the one the insert below probes
    const auto w = static_cast<std::size_t>(which);
    const std::uint32_t at = static_cast<std::uint32_t>(w) * cap_ + head_[w];
    std::uint64_t& entry = ring_[at];
    if (entry != 0) {
      std::size_t i = home(entry);
      const std::uint32_t t = tag(entry);
      while (table_[i].tag != t || table_[i].at != at) i = (i + 1) & mask_;
      erase_at(i);
      --live_[w];
    }
    entry = fp;
    std::size_t i = home(fp);
    while (table_[i].tag != 0) i = (i + 1) & mask_;
    table_[i] = Slot{tag(fp), at};
    ++live_[w];
    head_[w] = head_[w] + 1 == cap_ ? 0 : head_[w] + 1;
  }
  // If fp is in a FIFO, removes it (one entry) and returns the FIFO (0 or 1); else -1.
  int take(std::uint64_t fp) noexcept {
    const std::uint32_t t = tag(fp);
    std::size_t i = home(fp);
    while (table_[i].tag != t) {
      if (table_[i].tag == 0) return -1;
      i = (i + 1) & mask_;
    }
    const std::uint32_t at = table_[i].at;
    const int which = at >= cap_ ? 1 : 0;
    ring_[at] = 0;
    --live_[static_cast<std::size_t>(which)];
    erase_at(i);
    return which;
  }
  void clear() noexcept {
    std::fill(ring_.begin(), ring_.end(), 0);
    std::fill(table_.begin(), table_.end(), Slot{});
    head_ = {0, 0};
    live_ = {0, 0};
  }
  std::size_t memory_bytes() const noexcept {
    return ring_.capacity() * sizeof(std::uint64_t) + table_.capacity() * sizeof(Slot);
  }

 private:
  struct Slot {
    std::uint32_t tag = 0;  // 0: empty
    std::uint32_t at = 0;   // the entry's index in ring_
  };
  // A slot's tag: 32 bits of a mix of the fingerprint, never 0 (an empty slot); its home slot is
  // the tag's low bits, so a slot's home is known without its fingerprint.
  static std::uint32_t tag(std::uint64_t fp) noexcept {
    const auto t = static_cast<std::uint32_t>(fp * 0xff51afd7ed558ccdull >> 32);
    return t != 0 ? t : 1;
  }
  std::size_t home_of(std::uint32_t t) const noexcept { return t & mask_; }
  std::size_t home(std::uint64_t fp) const noexcept { return home_of(tag(fp)); }
  void erase_at(std::size_t i) noexcept {
    // Backward-shift deletion: each later slot of the run moves into the hole unless its home
    // lies cyclically in (hole, slot].
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask_; table_[j].tag != 0; j = (j + 1) & mask_) {
      const std::size_t h = home_of(table_[j].tag);
      if (((j - h) & mask_) >= ((j - hole) & mask_)) {
        table_[hole] = table_[j];
        hole = j;
      }
    }
    table_[hole] = Slot{};
  }

  std::uint32_t cap_;
  TableVector<std::uint64_t> ring_;  // B1 at [0, cap_), B2 at [cap_, 2 cap_); 0: no entry
  TableVector<Slot> table_;
  std::size_t mask_;
  std::array<std::uint32_t, 2> head_{};  // the slot each FIFO writes next (its oldest when full)
  std::array<std::uint32_t, 2> live_{};
};

// adaptive: whether the ghosts track fingerprint fp: the bits of `mask` (the top s bits, for 1 in
// 2^s tracked; none for all) of a mix that neither the ghost table's tag nor its home slot uses
// alone are zero.
bool ghost_sampled(std::uint64_t fp, std::uint64_t mask) noexcept {
  return (fp * 0xc4ceb9fe1a85ec53ull & mask) == 0;
}
}  // namespace

struct BlockPool::Retention {
  static constexpr int kRanks = 64;  // lineage: the most ranks (kLineageRanks <= kRanks)
  static constexpr int kSegs = kRanks + 1;
  static constexpr int kProtected = kRanks;  // lineage's protected segment
  static constexpr int kLevels = kMaxRetentionPriority + 1;
  static constexpr int kNumLists = 1 + kLevels * kSegs;
  using ListId = std::uint16_t;
  static constexpr ListId kUncached = 0;
  static constexpr ListId kNone = 0xffff;  // not in a list (held, or the null block)
  static constexpr std::uint8_t kMaxHits = 3;
  static_assert(kNumLists < kNone && kRanks <= 64 && kLineageRanks <= kRanks);
  static_assert(kSegs == BlockPoolSnapshot::kEvictionSegments);

  // size first and 64-bit: a push stores tail and size, which the compiler would otherwise merge
  // into one 8-byte vector store that the next push's 4-byte load of size cannot be forwarded
  // from (perf: most of a release's time was that load).
  struct List {
    std::int64_t size = 0;
    BlockId head = kQueueEnd;
    BlockId tail = kQueueEnd;
  };
  // Per block: its list links and state in one 16-byte record (one cache line per operation).
  struct Node {
    BlockId prev = kNotQueued;
    BlockId next = kNotQueued;
    ListId list = kNone;
    RetentionPriority prio = kDefaultRetentionPriority;
    std::uint8_t hits = 0;  // hits since cached, capped at kMaxHits (S3-FIFO: spent on moves)
    bool timed = false;     // the priority has an expiry (expires[] is read only then)
    std::uint8_t rank = 0;  // lineage: set when the block is cached (lineage_rank())
    // adaptive: set when the block is cached, to whether the ghosts track its fingerprint
    // (ghost_sampled()); stale once it is uncached (readers check is_cached()).
    bool ghost = false;
  };
  static_assert(sizeof(Node) == 16);

  static constexpr ListId list_of(int level, int seg) noexcept {
    return static_cast<ListId>(1 + level * kSegs + seg);
  }
  static constexpr int level_of_list(ListId l) noexcept { return (l - 1) / kSegs; }
  static constexpr int seg_of_list(ListId l) noexcept { return (l - 1) % kSegs; }

  EvictionPolicy policy;
  TableVector<Node> nodes;
  TableVector<RetentionTick> duration;  // kNoExpiry unless timed
  TableVector<RetentionTick> expires;   // kNoExpiry unless timed
  std::array<List, kNumLists> lists{};
  // A bit per level that may hold free cached blocks: set when one of its lists gains its first
  // block, cleared lazily by lowest_level() (a removal writes no per-level count: no chain of
  // read-modify-writes on one counter when many blocks of a level come and go).
  std::array<std::uint64_t, 2> nonempty{};
  // lineage: per level, a bit per rank whose list may be non-empty (set on its first block,
  // cleared lazily by the victim search, as nonempty).
  std::array<std::uint64_t, kLevels> rank_bits{};
  // lineage: per block the tick at which it was last queued (a count of queued cached blocks),
  // the age past which a list's oldest block counts as dead, and the rank the next victim
  // search checks for a dead head (rotating).
  TableVector<std::uint32_t> ticks;
  std::uint32_t tick = 0;
  std::uint32_t max_age = 0;
  int cursor = 0;
  // lineage: the key depth blocks are ranked by, and its learner (lineage_adaptive_depth).
  std::size_t key_depth = kLineageKeyDepth;
  std::unique_ptr<LineageDepthLearner> learner;
  // adaptive: the ghosts, and protected's target share of a level's free cached blocks in
  // units of 1 / kAdaptiveScale (steered by ghost hits: adapt()); step_unit: one block's worth
  // of the pool in those units.
  // The ghosts see only a sample of fingerprints, 1 in 2^ghost_shift (ghost_sampled()), so
  // that a block of the rest costs no table access at its eviction or its store.
  std::unique_ptr<AdaptiveGhosts> ghosts;
  std::int64_t target = 0;
  std::int64_t pool_blocks = 1;
  int ghost_shift = 0;
  std::int32_t free_count = 0;  // blocks in all lists
  RetentionStats stats;
  std::int64_t timed = 0;                 // blocks whose priority has an expiry
  RetentionTick next_expiry = kNoExpiry;  // <= every free timed block's expiry

  Retention(std::size_t n, const BlockPoolConfig& c)
      : policy(c.eviction_policy),
        nodes(n),
        duration(n, kNoExpiry),
        expires(n, kNoExpiry),
        key_depth(c.lineage_key_depth) {
    const EvictionPolicy p = c.eviction_policy;
    if (p == EvictionPolicy::kLineage) {
      if (c.lineage_adaptive_depth) {
        learner = std::make_unique<LineageDepthLearner>(c.lineage_key_depth);
      }
      ticks.assign(n, 0);
      max_age = static_cast<std::uint32_t>(std::min<std::uint64_t>(
          static_cast<std::uint64_t>(kLineageMaxAgePools) * n, 0x7fffffffu));
    }
    if (p == EvictionPolicy::kAdaptive) {
      const std::size_t cap = n * kAdaptiveGhostPercent / 100;
      ghost_shift = c.adaptive_ghost_sample_shift >= 0 ? c.adaptive_ghost_sample_shift
                                                       : pagedkv::adaptive_ghost_sample_shift(cap);
      ghosts = std::make_unique<AdaptiveGhosts>(cap >> ghost_shift);
      target = kAdaptiveScale * kAdaptiveInitialPercent / 100;
      pool_blocks = static_cast<std::int64_t>(std::max<std::size_t>(n, 1));
    }
  }
  // adaptive: a block cached again was in ghost FIFO `which` (0: evicted without a hit since it
  // was cached: keeping such blocks longer would have hit it, so protected's target falls; 1:
  // evicted after a hit: it rises), by ARC's step: the other ghost's size over this one's, at
  // least 1, in blocks of the pool, times 2^ghost_shift (each sampled ghost hit stands for
  // that many).
  void adapt(int which) noexcept {
    const std::int64_t mine = std::max<std::int64_t>(ghosts->size(which), 1);
    const std::int64_t other = ghosts->size(1 - which);
    const std::int64_t blocks = std::max<std::int64_t>(other / mine, 1) << ghost_shift;
    const std::int64_t step = std::max<std::int64_t>(blocks * kAdaptiveScale / pool_blocks, 1);
    target = which == 0 ? std::max<std::int64_t>(target - step, 0)
                        : std::min<std::int64_t>(target + step, kAdaptiveScale);
  }

  // Free cached blocks of level lv in segments 0 and 1 (all of them under LRU, SLRU, S3-FIFO).
  std::int64_t level_count(int lv) const noexcept {
    return lists[list_of(lv, 0)].size + lists[list_of(lv, 1)].size;
  }
  // Free cached blocks of level lv, every segment (checks and sweeps only: O(kSegs)).
  std::int64_t level_count_all(int lv) const noexcept {
    std::int64_t n = 0;
    for (int s = 0; s < kSegs; ++s) n += lists[list_of(lv, s)].size;
    return n;
  }
  // Whether level lv has a free cached block.
  bool level_live(int lv) noexcept {
    if (policy != EvictionPolicy::kLineage) return level_count(lv) > 0;
    return lowest_rank(lv) >= 0 || lists[list_of(lv, kProtected)].size > 0;
  }
  // lineage: the lowest rank of level lv with a free block, or -1; clears stale rank bits.
  int lowest_rank(int lv) noexcept {
    std::uint64_t& bits = rank_bits[static_cast<std::size_t>(lv)];
    while (bits != 0) {
      const int rk = std::countr_zero(bits);
      if (lists[list_of(lv, rk)].size > 0) return rk;
      bits &= bits - 1;
    }
    return -1;
  }
  // lineage: free cached blocks of every level (the protected share's base).
  std::int64_t cached_free() const noexcept { return free_count - lists[kUncached].size; }
  // lineage: links a free cached block (already counted free) at its rank list's back or front.
  void link_rank(int lv, BlockId id, bool front) noexcept {
    const int rk = nodes[id].rank;
    const ListId l = list_of(lv, rk);
    mark_level(l);
    if (lists[l].tail == kQueueEnd) {
      rank_bits[static_cast<std::size_t>(lv)] |= std::uint64_t{1} << rk;
    }
    if (front) {
      --free_count;  // push_front counts it again
      push_front(l, id);
    } else {
      link_back(l, id);
    }
  }
  // Call before list l (cached) gains a block.
  void mark_level(ListId l) noexcept {
    if (lists[l].tail == kQueueEnd) {
      const int lv = level_of_list(l);
      nonempty[lv >> 6] |= std::uint64_t{1} << (lv & 63);
    }
  }
  // Raw list operations: links and the list's size only (no level or free counts).
  void link_back(ListId l, BlockId id) noexcept {
    List& q = lists[l];
    Node& k = nodes[id];
    k.prev = q.tail;
    k.next = kQueueEnd;
    if (q.tail == kQueueEnd) {
      q.head = id;
    } else {
      nodes[q.tail].next = id;
    }
    q.tail = id;
    ++q.size;
    k.list = l;
  }
  void unlink(BlockId id) noexcept {
    Node& k = nodes[id];
    List& q = lists[k.list];
    if (k.prev == kQueueEnd) {
      q.head = k.next;
    } else {
      nodes[k.prev].next = k.next;
    }
    if (k.next == kQueueEnd) {
      q.tail = k.prev;
    } else {
      nodes[k.next].prev = k.prev;
    }
    k.prev = kNotQueued;
    k.next = kNotQueued;
    --q.size;
    k.list = kNone;
  }
  // A free cached block (list l != kUncached) in or out.
  void push_back_cached(ListId l, BlockId id) noexcept {
    assert(l != kUncached && nodes[id].list == kNone);
    mark_level(l);
    link_back(l, id);
    ++free_count;
  }
  // A free uncached block at list 0's head (its retention already the default: reset_fast).
  void push_front_uncached(BlockId id) noexcept {
    List& q = lists[kUncached];
    Node& k = nodes[id];
    assert(k.list == kNone);
    k.prev = kQueueEnd;
    k.next = q.head;
    if (q.head == kQueueEnd) {
      q.tail = id;
    } else {
      nodes[q.head].prev = id;
    }
    q.head = id;
    ++q.size;
    k.list = kUncached;
    ++free_count;
  }
  // push_back and push_front repeat link_back's lines (and push_front_uncached push_front's) on
  // purpose: written as calls to link_back / a link_front, BM_PolicyGetNewBlocksAndFree measured
  // 1.24-1.42x slower (2026-12-06, always_inline on the links did not help).
  void push_back(ListId l, BlockId id) noexcept {
    if (l != kUncached) mark_level(l);
    List& q = lists[l];
    Node& k = nodes[id];
    assert(nodes[id].list == kNone);
    k.prev = q.tail;
    k.next = kQueueEnd;
    if (q.tail == kQueueEnd) {
      q.head = id;
    } else {
      nodes[q.tail].next = id;
    }
    q.tail = id;
    ++q.size;
    nodes[id].list = l;
    ++free_count;
  }
  void push_front(ListId l, BlockId id) noexcept {
    if (l != kUncached) mark_level(l);
    List& q = lists[l];
    Node& k = nodes[id];
    assert(nodes[id].list == kNone);
    k.prev = kQueueEnd;
    k.next = q.head;
    if (q.head == kQueueEnd) {
      q.tail = id;
    } else {
      nodes[q.head].prev = id;
    }
    q.head = id;
    ++q.size;
    nodes[id].list = l;
    ++free_count;
  }
  void remove(BlockId id) noexcept {
    assert(nodes[id].list != kNone);
    unlink(id);
    --free_count;
  }
  ListId last_list = 0;
  BlockId pop_front(ListId l) noexcept {
    last_list = l;
    const BlockId id = lists[l].head;
    // The list's next head is loaded by the unlink below; start loading the one after it, which
    // the next pop from this list (usually the next eviction) unlinks: a victim search walks a
    // list in link order, not memory order, and would wait for each node in turn.
    const BlockId next = nodes[id].next;
    if (next != kQueueEnd) {
      const BlockId after = nodes[next].next;
      if (after != kQueueEnd) __builtin_prefetch(&nodes[after]);
    }
    remove(id);
    return id;
  }
  // Moves the head of list `from` to the tail of list `to` (same level: counts unchanged).
  void move_head(ListId from, ListId to) noexcept {
    const BlockId id = lists[from].head;
    unlink(id);
    link_back(to, id);
  }

  // Queues a free cached block at its priority's level, per the policy.
  void enqueue_cached(BlockId id) noexcept {
    switch (policy) {
      case EvictionPolicy::kLru:
        enqueue_cached_p<EvictionPolicy::kLru>(id);
        break;
      case EvictionPolicy::kSlru:
        enqueue_cached_p<EvictionPolicy::kSlru>(id);
        break;
      case EvictionPolicy::kS3Fifo:
        enqueue_cached_p<EvictionPolicy::kS3Fifo>(id);
        break;
      case EvictionPolicy::kLineage:
        enqueue_cached_p<EvictionPolicy::kLineage>(id);
        break;
      case EvictionPolicy::kAdaptive:
        enqueue_cached_p<EvictionPolicy::kAdaptive>(id);
        break;
    }
  }
  // The list a free cached block joins under policy P (lineage also stamps it with tick t). Its
  // level and rank bits are mark_list()'s.
  template <EvictionPolicy P>
  ListId list_for(BlockId id, std::uint32_t t) noexcept {
    const Node& m = nodes[id];
    const int lv = m.prio;
    if constexpr (P == EvictionPolicy::kLru) {
      return list_of(lv, 0);
    } else if constexpr (P == EvictionPolicy::kLineage) {
      ticks[id] = t;
      // Protected's share is enforced when a victim is chosen (victim_at).
      return list_of(lv, m.hits == 0 ? m.rank : kProtected);
    } else {
      // SLRU, adaptive: probation / protected (its share enforced in victim_at); S3-FIFO: small /
      // main.
      return list_of(lv, m.hits == 0 ? 0 : 1);
    }
  }
  // Call before cached list l gains a block: if it is empty, sets its level's bit and (lineage,
  // a rank list) its rank's bit.
  void mark_list(ListId l) noexcept {
    if (lists[l].tail == kQueueEnd) {
      const int lv = level_of_list(l);
      nonempty[lv >> 6] |= std::uint64_t{1} << (lv & 63);
      if (policy == EvictionPolicy::kLineage) {
        const int seg = seg_of_list(l);
        if (seg < kProtected) rank_bits[static_cast<std::size_t>(lv)] |= std::uint64_t{1} << seg;
      }
    }
  }
  // The list a free cached block joins under policy P, marked (mark_list). The caller links it.
  template <EvictionPolicy P>
  ListId target_list(BlockId id) noexcept {
    const ListId l = list_for<P>(id, tick);
    if constexpr (P == EvictionPolicy::kLineage) ++tick;
    mark_list(l);
    return l;
  }
  // Links free cached blocks at list tails with the open list's tail and count in registers (as
  // FreeBlockQueue::Appender): a run of blocks joining one list, as a request's do, makes no
  // round trip through memory per block. The lists and the free count are stale until finish()
  // (or destruction); nothing else may read or change them while it is open. total(): blocks
  // appended since construction.
  class Appender {
   public:
    explicit Appender(Retention& r) noexcept : r_(r), nodes_(r.nodes.data()) {}
    Appender(const Appender&) = delete;
    Appender& operator=(const Appender&) = delete;
    ~Appender() { finish(); }
    [[gnu::always_inline]] void append(ListId l, BlockId id) noexcept {
      if (l != open_) [[unlikely]]
        open(l);
      Node& k = nodes_[id];
      k.prev = tail_;
      k.next = kQueueEnd;
      k.list = l;
      if (tail_ == kQueueEnd) {
        r_.lists[l].head = id;
      } else {
        nodes_[tail_].next = id;
      }
      tail_ = id;
      ++total_;
    }
    std::int64_t total() const noexcept { return total_; }
    void finish() noexcept {
      if (open_ == kNone) return;
      List& q = r_.lists[open_];
      q.tail = tail_;
      q.size += total_ - run_start_;
      r_.free_count += static_cast<std::int32_t>(total_ - run_start_);
      open_ = kNone;
    }

   private:
    void open(ListId l) noexcept {
      finish();
      r_.mark_list(l);
      open_ = l;
      tail_ = r_.lists[l].tail;
      run_start_ = total_;
    }
    Retention& r_;
    Node* const nodes_;
    ListId open_ = kNone;
    BlockId tail_ = kQueueEnd;
    std::int64_t total_ = 0;
    std::int64_t run_start_ = 0;  // total_ when the open list was opened
  };
  template <EvictionPolicy P>
  void enqueue_cached_p(BlockId id) noexcept {
    link_back(target_list<P>(id), id);
    ++free_count;
  }

  // Removes and returns the block to evict from level lv (level_count(lv) > 0).
  BlockId victim_at(int lv) noexcept {
    const ListId s0 = list_of(lv, 0), s1 = list_of(lv, 1);
    switch (policy) {
      case EvictionPolicy::kLineage: {
        // Protected holds at most kLineageProtectedPercent of the free cached blocks when a
        // victim is chosen: past that its oldest go back to their rank's tail first.
        const ListId prot = list_of(lv, kProtected);
        while (lists[prot].size * 100 > cached_free() * kLineageProtectedPercent) {
          const BlockId old = lists[prot].head;
          unlink(old);
          link_rank(lv, old, false);
        }
        if (max_age != 0) {
          // A dead lineage: the oldest block of the next rank in turn, or of protected, queued
          // more than max_age ticks ago.
          // The turn goes to the first non-empty rank at or after the cursor (wrapping).
          std::uint64_t& bits = rank_bits[static_cast<std::size_t>(lv)];
          while (bits != 0) {
            const std::uint64_t later = cursor >= 64 ? 0 : bits & (~std::uint64_t{0} << cursor);
            const int rk = std::countr_zero(later != 0 ? later : bits);
            const ListId l = list_of(lv, rk);
            if (lists[l].size == 0) {  // a stale bit
              bits &= ~(std::uint64_t{1} << rk);
              continue;
            }
            cursor = rk + 1;
            if (tick - ticks[lists[l].head] > max_age) return pop_front(l);
            break;
          }
          if (lists[prot].size > 0 && tick - ticks[lists[prot].head] > max_age) {
            return pop_front(prot);
          }
        }
        const int rk = lowest_rank(lv);
        return pop_front(rk >= 0 ? list_of(lv, rk) : list_of(lv, kProtected));
      }
      case EvictionPolicy::kLru:
        return pop_front(s0);
      case EvictionPolicy::kSlru:
        // Protected holds at most 80% of the level when a victim is chosen: past that its
        // oldest go back to probation's tail first.
        while (lists[s1].size * 5 > level_count(lv) * 4) move_head(s1, s0);
        return pop_front(lists[s0].size > 0 ? s0 : s1);
      case EvictionPolicy::kAdaptive:
        // As SLRU, with protected's share the adapted target.
        while (lists[s1].size * kAdaptiveScale > level_count(lv) * target) move_head(s1, s0);
        return pop_front(lists[s0].size > 0 ? s0 : s1);
      case EvictionPolicy::kS3Fifo:
        for (;;) {
          if (lists[s1].size == 0 ||
              (lists[s0].size > 0 && lists[s0].size * 10 >= level_count(lv))) {
            return pop_front(s0);
          }
          const BlockId id = lists[s1].head;
          if (nodes[id].hits == 0) return pop_front(s1);
          --nodes[id].hits;  // one more round in main per hit
          move_head(s1, s1);
        }
    }
    return pop_front(s0);
  }

  // The lowest level with a free cached block (precondition: there is one); clears the bits of
  // the levels below it that emptied since.
  int lowest_level() noexcept {
    for (;;) {
      const int w = nonempty[0] != 0 ? 0 : 1;
      assert(nonempty[w] != 0);
      const int lv = 64 * w + std::countr_zero(nonempty[w]);
      if (level_live(lv)) return lv;
      nonempty[w] &= ~(std::uint64_t{1} << (lv & 63));
    }
  }

  // Removes and returns the next block get_new_blocks() hands out. Precondition: free_count > 0.
  BlockId pop_victim() noexcept {
    if (lists[kUncached].size > 0) return pop_front(kUncached);
    return victim_at(lowest_level());
  }
  // Sets block id's priority and expiry (counts per class, the budget's count, timed blocks).
  // The block must not be in a level list (the caller requeues it).
  void set(BlockId id, RetentionPriority p, RetentionTick dur, RetentionTick exp) noexcept {
    Node& m = nodes[id];
    assert(m.list == kNone || m.list == kUncached);
    const RetentionPriority old = m.prio;
    if (old != p) {
      --stats.by_class[static_cast<std::size_t>(retention_class(old))].blocks;
      ++stats.by_class[static_cast<std::size_t>(retention_class(p))].blocks;
      stats.retained_blocks +=
          (p > kDefaultRetentionPriority ? 1 : 0) - (old > kDefaultRetentionPriority ? 1 : 0);
      m.prio = p;
    }
    const bool t = exp != kNoExpiry;
    if (t || m.timed) {
      timed += (t ? 1 : 0) - (m.timed ? 1 : 0);
      m.timed = t;
      duration[id] = dur;
      expires[id] = exp;
    }
  }
  void reset(BlockId id) noexcept {
    set(id, kDefaultRetentionPriority, kNoExpiry, kNoExpiry);
    nodes[id].hits = 0;
  }
  // reset(), with set() entered only when it would change something.
  void reset_fast(BlockId id) noexcept {
    Node& m = nodes[id];
    if (m.prio != kDefaultRetentionPriority || m.timed) [[unlikely]] {
      set(id, kDefaultRetentionPriority, kNoExpiry, kNoExpiry);
    }
    m.hits = 0;
  }
  bool expired(BlockId id, RetentionTick now) const noexcept {
    return nodes[id].timed && now >= expires[id];
  }
  void expire(BlockId id) noexcept {
    ++stats.expirations;
    set(id, kDefaultRetentionPriority, kNoExpiry, kNoExpiry);
  }
  void note_expiry(BlockId id) noexcept { next_expiry = std::min(next_expiry, expires[id]); }

  // Queues a block that reached ref 0 while cached: an expired priority falls back first.
  void queue_cached(BlockId id, RetentionTick now) noexcept {
    check_expiry(id, now);
    enqueue_cached(id);
  }
  void check_expiry(BlockId id, RetentionTick now) noexcept {
    if (nodes[id].timed) [[unlikely]] {
      if (expired(id, now)) {
        expire(id);
      } else {
        note_expiry(id);
      }
    }
  }

  // A hit on cached block id (held or free; if free the caller has removed it from its list).
  void hit(BlockId id, RetentionTick now) noexcept {
    Node& m = nodes[id];
    ++stats.by_class[static_cast<std::size_t>(retention_class(m.prio))].hits;
    if (m.hits < kMaxHits) ++m.hits;
    renew(id, now);
  }
  // A hit's expiry part: an expired priority falls back, else it runs from now again.
  void renew(BlockId id, RetentionTick now) noexcept {
    if (nodes[id].timed) [[unlikely]] {
      if (expired(id, now)) {
        expire(id);
      } else {
        const RetentionTick d = duration[id];
        expires[id] = now > kNoExpiry - d ? kNoExpiry - 1 : now + d;
      }
    }
  }

  // Moves every free block whose priority ran out to the head of the default level (it went a
  // whole duration without a hit: first among the default blocks), and recomputes next_expiry.
  void sweep(RetentionTick now) noexcept {
    RetentionTick next = kNoExpiry;
    for (int lv = 0; lv < kLevels; ++lv) {
      if (lv == kDefaultRetentionPriority || level_count_all(lv) == 0) continue;
      for (int s = 0; s < kSegs; ++s) {
        BlockId id = lists[list_of(lv, s)].head;
        while (id != kQueueEnd) {
          const BlockId nx = nodes[id].next;
          if (nodes[id].timed) {
            if (expired(id, now)) {
              remove(id);
              expire(id);
              if (policy == EvictionPolicy::kLineage) {
                ++free_count;
                link_rank(kDefaultRetentionPriority, id, true);
              } else {
                push_front(list_of(kDefaultRetentionPriority, 0), id);
              }
            } else {
              next = std::min(next, expires[id]);
            }
          }
          id = nx;
        }
      }
    }
    next_expiry = next;
  }
};

void BlockPool::RetentionDeleter::operator()(Retention* r) const noexcept {
  delete r;
}

namespace {
// adaptive: how many records or takes ahead the ghost table is prefetched, and how many sampled
// fingerprints a chunk holds.
constexpr std::size_t kGhostAhead = 8;
constexpr std::size_t kGhostChunk = 64;

RetentionTick read_clock(const RetentionClock& clock) {
  return clock ? clock() : 0;
}
}  // namespace

void BlockPool::ret_enable() {
  if (ret_ != nullptr) return;
  auto r = std::unique_ptr<Retention, RetentionDeleter>(new Retention(blocks_.size(), config_));
  const std::int64_t usable = config_.num_blocks - 1;
  r->stats.by_class[static_cast<std::size_t>(RetentionClass::kDefault)].blocks = usable;
  r->stats.by_class[static_cast<std::size_t>(RetentionClass::kDefault)].evictions = num_evictions_;
  r->stats.retained_budget = static_cast<std::int64_t>(
      std::floor(config_.max_retained_fraction * static_cast<double>(usable)));
  // Nothing below throws: move the LRU queue in, in its order (uncached blocks to list 0).
  while (!free_queue_.empty()) {
    const BlockId id = free_queue_.popleft();
    if (blocks_[static_cast<std::size_t>(id)].is_cached()) {
      r->enqueue_cached(id);
    } else {
      r->push_back(Retention::kUncached, id);
    }
  }
  ret_ = std::move(r);
  ret_free_ = ret_->free_count;
}

void BlockPool::ret_release_one(BlockId id) noexcept {
  Retention& r = *ret_;
  if (blocks_[static_cast<std::size_t>(id)].is_cached()) {
    r.queue_cached(id, r.timed > 0 ? read_clock(config_.retention_clock) : 0);
  } else {
    r.reset_fast(id);
    r.push_front_uncached(id);
  }
  ret_free_ = r.free_count;
}

void BlockPool::ret_requeue(BlockId id) noexcept {
  Retention& r = *ret_;
  r.remove(id);
  if (blocks_[static_cast<std::size_t>(id)].is_cached()) {
    const RetentionTick now = r.timed > 0 ? read_clock(config_.retention_clock) : 0;
    r.hit(id, now);
    r.queue_cached(id, now);
  } else {
    r.push_front(Retention::kUncached, id);
  }
  ret_free_ = r.free_count;
}

namespace {
// ret_touch()'s pass for pools with or without timed priorities (kTimed: r.timed > 0). Without
// one no block can expire or renew, so the loop makes no call and keeps its counts in registers.
template <bool kTimed, typename R>
void touch_lists(R& r, KVCacheBlock* records, std::span<const BlockId> ids,
                 RetentionTick now) noexcept {
  auto* const nodes = r.nodes.data();
  // Counts kept in locals and added once (hit(), call by call: the same figures).
  std::int32_t taken = 0;
  std::uint64_t hits = 0, below = 0, above = 0;
  for (const BlockId id : ids) {
    KVCacheBlock& b = records[static_cast<std::size_t>(id)];
    if (b.is_null) continue;
    auto& m = nodes[id];
    if (b.ref_cnt == 0) {
      r.unlink(id);
      ++taken;
    }
    if (b.is_cached()) {
      const RetentionPriority p = m.prio;
      ++hits;
      if (p != kDefaultRetentionPriority) [[unlikely]] {
        below += p < kDefaultRetentionPriority ? 1 : 0;
        above += p > kDefaultRetentionPriority ? 1 : 0;
      }
      if (m.hits < R::kMaxHits) ++m.hits;
      if constexpr (kTimed) r.renew(id, now);
    }
    ++b.ref_cnt;
  }
  auto& by = r.stats.by_class;
  by[static_cast<std::size_t>(RetentionClass::kBelowDefault)].hits += below;
  by[static_cast<std::size_t>(RetentionClass::kDefault)].hits += hits - below - above;
  by[static_cast<std::size_t>(RetentionClass::kAboveDefault)].hits += above;
  r.free_count -= taken;
}
}  // namespace

void BlockPool::ret_touch(std::span<const BlockId> ids) noexcept {
  Retention& r = *ret_;
  if (r.timed > 0) {
    touch_lists<true>(r, blocks_.data(), ids, read_clock(config_.retention_clock));
  } else {
    touch_lists<false>(r, blocks_.data(), ids, 0);
  }
  ret_free_ = r.free_count;
}

namespace {
// ret_release()'s two passes for one policy, order and timing (kTimed: some block has a timed
// priority; without one no block can expire, so the pass makes no call): no branch on any of
// them per block.
template <EvictionPolicy P, bool kReverse, bool kMarked, bool kTimed, typename R>
void release_lists(R& r, KVCacheBlock* records, std::span<const BlockId> given,
                   RetentionTick now) noexcept {
  const std::size_t count = given.size();
  const auto ordered = [given, count](std::size_t k) {
    return given[kReverse ? count - 1 - k : k];
  };
  std::size_t first_unhashed = count, end_unhashed = 0;
  const std::uint32_t tick = r.tick;  // lineage: the k-th block queued here gets tick + k
  {
    typename R::Appender tail(r);
    for (std::size_t k = 0; k < count; ++k) {
      const BlockId id = ordered(k);
      KVCacheBlock& b = records[static_cast<std::size_t>(id)];
      if (b.is_null) continue;
      b.ref_cnt = kMarked ? -b.ref_cnt - 1 : b.ref_cnt - 1;
      if (b.ref_cnt == 0) {
        if (b.is_cached()) {
          if constexpr (kTimed) r.check_expiry(id, now);
          tail.append(r.template list_for<P>(id, tick + static_cast<std::uint32_t>(tail.total())),
                      id);
        } else {
          first_unhashed = std::min(first_unhashed, k);
          end_unhashed = k + 1;
        }
      }
    }
    if constexpr (P == EvictionPolicy::kLineage)
      r.tick = tick + static_cast<std::uint32_t>(tail.total());
  }
  for (std::size_t k = end_unhashed; k-- > first_unhashed;) {
    const BlockId id = ordered(k);
    const KVCacheBlock& b = records[static_cast<std::size_t>(id)];
    if (!b.is_null && b.ref_cnt == 0 && !b.is_cached()) {
      r.reset_fast(id);
      r.push_front_uncached(id);
    }
  }
}

template <EvictionPolicy P, bool kTimed, typename R>
void release_lists_t(R& r, KVCacheBlock* records, std::span<const BlockId> given, bool reverse,
                     bool marked, RetentionTick now) noexcept {
  if (reverse) {
    if (marked) {
      release_lists<P, true, true, kTimed>(r, records, given, now);
    } else {
      release_lists<P, true, false, kTimed>(r, records, given, now);
    }
  } else if (marked) {
    release_lists<P, false, true, kTimed>(r, records, given, now);
  } else {
    release_lists<P, false, false, kTimed>(r, records, given, now);
  }
}

template <EvictionPolicy P, typename R>
void release_lists_p(R& r, KVCacheBlock* records, std::span<const BlockId> given, bool reverse,
                     bool marked, RetentionTick now) noexcept {
  if (r.timed > 0) {
    release_lists_t<P, true>(r, records, given, reverse, marked, now);
  } else {
    release_lists_t<P, false>(r, records, given, reverse, marked, now);
  }
}
}  // namespace

void BlockPool::ret_release(std::span<const BlockId> given, bool reverse, bool marked) noexcept {
  Retention& r = *ret_;
  const RetentionTick now = r.timed > 0 ? read_clock(config_.retention_clock) : 0;
  KVCacheBlock* const records = blocks_.data();
  switch (r.policy) {
    case EvictionPolicy::kLru:
      release_lists_p<EvictionPolicy::kLru>(r, records, given, reverse, marked, now);
      break;
    case EvictionPolicy::kSlru:
      release_lists_p<EvictionPolicy::kSlru>(r, records, given, reverse, marked, now);
      break;
    case EvictionPolicy::kS3Fifo:
      release_lists_p<EvictionPolicy::kS3Fifo>(r, records, given, reverse, marked, now);
      break;
    case EvictionPolicy::kLineage:
      release_lists_p<EvictionPolicy::kLineage>(r, records, given, reverse, marked, now);
      break;
    case EvictionPolicy::kAdaptive:
      release_lists_p<EvictionPolicy::kAdaptive>(r, records, given, reverse, marked, now);
      break;
  }
  ret_free_ = r.free_count;
}

bool BlockPool::ret_get_new_blocks(std::int32_t n, std::vector<BlockId>& out) {
  Retention& r = *ret_;
  if (n > r.free_count) return false;
  if (n == 0) return true;
  // Everything that may throw, before any change (the clock must not).
  detail::reserve_more(out, static_cast<std::size_t>(n));
  if (config_.enable_kv_events) reserve_events(static_cast<std::size_t>(n), 0);
  if (guarded_) orphans_->reserve(static_cast<std::size_t>(n));
  if (r.timed > 0) {
    const RetentionTick now = read_clock(config_.retention_clock);
    if (now >= r.next_expiry) r.sweep(now);
  }
  // Pass 1: choose the victims (the lists and per-block state only); pass 2 (take_popped, with
  // the LRU path's look-ahead prefetches) evicts them and hands them out.
  // Free uncached blocks first, in list 0's order: their retention is the default already and
  // they evict nothing, so they are handed out straight from the list.
  Retention::List& u = r.lists[Retention::kUncached];
  const auto from_uncached = static_cast<std::int32_t>(std::min<std::int64_t>(n, u.size));
  if (from_uncached > 0) {
    BlockId id = u.head;
    for (std::int32_t i = 0; i < from_uncached; ++i) {
      Retention::Node& k = r.nodes[id];
      assert(k.list == Retention::kUncached && k.prio == kDefaultRetentionPriority && !k.timed);
      const BlockId next = k.next;
      k.prev = kNotQueued;
      k.next = kNotQueued;
      k.list = Retention::kNone;
      k.hits = 0;
      blocks_[static_cast<std::size_t>(id)].ref_cnt = 1;
      out.push_back(id);  // reserved above: cannot throw
      id = next;
    }
    u.head = id;
    if (id == kQueueEnd) {
      u.tail = kQueueEnd;
    } else {
      r.nodes[id].prev = kQueueEnd;
    }
    u.size -= from_uncached;
    r.free_count -= from_uncached;
    r.last_list = Retention::kUncached;
  }
  const std::size_t first = out.size();
  for (std::int32_t i = from_uncached; i < n; ++i) {
    const BlockId id = r.pop_victim();
    if (r.last_list != Retention::kUncached) {
      const RetentionPriority p = r.nodes[id].prio;
      ++r.stats.by_class[static_cast<std::size_t>(retention_class(p))].evictions;
      if (p > kDefaultRetentionPriority) ++r.stats.forced_evictions;
    }
    out.push_back(id);  // reserved above: cannot throw
  }
  if (r.ghosts != nullptr) ret_record_ghosts(std::span<const BlockId>(out).subspan(first));
  // The eviction observer (inside take_popped) still sees each victim's retention (a tier's
  // minimum priority to store reads it); it falls back to the default afterwards.
  take_popped(std::span<const BlockId>(out).subspan(first));
  for (std::size_t i = first; i < out.size(); ++i) r.reset_fast(out[i]);
  ret_free_ = r.free_count;
  if (!events_.empty()) deliver_events();
  return true;
}

void BlockPool::ret_stored(std::span<const BlockHash> chain, std::size_t first,
                           std::span<const BlockId> blocks) noexcept {
  Retention& r = *ret_;
  if (r.ghosts != nullptr) {
    // adaptive: a block cached again after its eviction steers protected's target. Only
    // sampled fingerprints touch the table: in chunks, a scan marks each block's node and keeps
    // them, then each is taken with its table run loaded kGhostAhead takes ahead (each is a
    // cache miss, mostly). The blocks hold chain[first ..] and one group (a store's).
    if (blocks.empty()) return;
    AdaptiveGhosts& g = *r.ghosts;
    // ghost_sampled()'s mask: the top ghost_shift bits.
    const std::uint64_t mask = r.ghost_shift == 0 ? 0 : ~std::uint64_t{0} << (64 - r.ghost_shift);
    const GroupId group = blocks_[static_cast<std::size_t>(blocks[0])].group_id;
    const BlockHash* hashes = chain.data() + first;
    Retention::Node* nodes = r.nodes.data();
    std::array<std::uint64_t, kGhostChunk> fps;
    std::size_t k = 0;
    while (k < blocks.size()) {
      std::size_t m = 0;
      for (; k < blocks.size() && m < kGhostChunk; ++k) {
        const std::uint64_t f = AdaptiveGhosts::fingerprint(hashes[k], group);
        const bool tracked = ghost_sampled(f, mask);
        nodes[blocks[k]].ghost = tracked;
        fps[m] = f;
        m += tracked ? 1 : 0;
      }
      for (std::size_t j = 0; j < std::min(m, kGhostAhead); ++j) g.prefetch(fps[j]);
      for (std::size_t j = 0; j < m; ++j) {
        if (j + kGhostAhead < m) g.prefetch(fps[j + kGhostAhead]);
        const int which = g.take(fps[j]);
        if (which >= 0) r.adapt(which);
      }
    }
    return;
  }
  if (r.policy != EvictionPolicy::kLineage || blocks.empty()) return;
  if (r.learner != nullptr) {
    r.learner->observe(chain.first(first + blocks.size()));
    r.key_depth = r.learner->depth();
  }
  // lineage_rank() for every block: the top rank above the key depth, the key's rank below it
  // (computed once).
  const std::size_t depth = r.key_depth;
  const std::size_t end = first + blocks.size();
  const auto top = static_cast<std::uint8_t>(kLineageRanks - 1);
  const auto keyed =
      end > depth ? static_cast<std::uint8_t>(lineage_rank_of_key(chain[depth])) : top;
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    r.nodes[blocks[k]].rank = first + k < depth ? top : keyed;
  }
}

void BlockPool::ret_record_ghosts(std::span<const BlockId> victims) noexcept {
  // adaptive: each cached victim's fingerprint, if sampled, into B1 (evicted without a hit since
  // cached) or B2 (after one). The victims still hold their hashes and hit counts (take_popped
  // follows). In chunks: a scan of the victims' nodes (just popped: in cache) keeps the tracked
  // ones and loads their block records (cold: the oldest blocks); then their fingerprints; then
  // the records into the table, each record's table run and its FIFO's dropped entry loaded
  // kGhostAhead records ahead. An untracked victim costs a node read.
  Retention& r = *ret_;
  AdaptiveGhosts& g = *r.ghosts;
  const std::size_t n = victims.size();
  std::array<BlockId, kGhostChunk> ids;
  std::array<std::uint64_t, kGhostChunk> fps;
  std::array<std::uint8_t, kGhostChunk> fifos;
  std::size_t k = 0;
  while (k < n) {
    std::size_t m = 0;
    for (; k < n && m < kGhostChunk; ++k) {
      const BlockId id = victims[k];
      if (!r.nodes[id].ghost) continue;
      __builtin_prefetch(&blocks_[static_cast<std::size_t>(id)]);
      ids[m++] = id;
    }
    std::size_t t = 0;
    for (std::size_t j = 0; j < m; ++j) {
      const KVCacheBlock& b = blocks_[static_cast<std::size_t>(ids[j])];
      fps[t] = AdaptiveGhosts::fingerprint(b.block_hash, b.group_id);
      fifos[t] = r.nodes[ids[j]].hits > 0 ? 1 : 0;
      t += b.is_cached() ? 1 : 0;
    }
    std::array<std::uint32_t, 2> ahead{};  // records into each FIFO before the prefetched one
    const auto prefetch = [&](std::size_t j) {
      g.prefetch(fps[j]);
      g.prefetch_oldest(fifos[j], ahead[fifos[j]]++);
    };
    for (std::size_t j = 0; j < std::min(t, kGhostAhead); ++j) prefetch(j);
    for (std::size_t j = 0; j < t; ++j) {
      if (j + kGhostAhead < t) prefetch(j + kGhostAhead);
      --ahead[fifos[j]];
      g.record(fifos[j], fps[j]);
    }
  }
}

std::int64_t BlockPool::adaptive_protected_target() const noexcept {
  return ret_ != nullptr && ret_->ghosts != nullptr ? ret_->target : -1;
}

int BlockPool::adaptive_ghost_sample_shift() const noexcept {
  return ret_ != nullptr && ret_->ghosts != nullptr ? ret_->ghost_shift : -1;
}

std::size_t BlockPool::lineage_key_depth() const noexcept {
  return ret_ != nullptr && ret_->policy == EvictionPolicy::kLineage ? ret_->key_depth
                                                                     : config_.lineage_key_depth;
}

void BlockPool::ret_after_evict(BlockId id) noexcept {
  Retention& r = *ret_;
  ++r.stats.by_class[static_cast<std::size_t>(retention_class(r.nodes[id].prio))].evictions;
  const bool queued = r.nodes[id].list != Retention::kNone;
  if (queued) r.remove(id);
  r.reset(id);
  if (queued) r.push_front(Retention::kUncached, id);
  ret_free_ = r.free_count;
}

void BlockPool::ret_reset() noexcept {
  Retention& r = *ret_;
  // Every block is free and now uncached: splice the lists, in eviction order, into list 0.
  Retention::List& u = r.lists[Retention::kUncached];
  for (int l = 1; l < Retention::kNumLists; ++l) {
    Retention::List& q = r.lists[static_cast<std::size_t>(l)];
    if (q.size == 0) continue;
    if (u.tail == kQueueEnd) {
      u.head = q.head;
    } else {
      r.nodes[u.tail].next = q.head;
      r.nodes[q.head].prev = u.tail;
    }
    u.tail = q.tail;
    u.size += q.size;
    q = Retention::List{};
  }
  r.nonempty.fill(0);
  r.rank_bits.fill(0);
  for (BlockId id = u.head; id != kQueueEnd; id = r.nodes[id].next) {
    r.nodes[id].list = Retention::kUncached;
    r.reset(id);
  }
  r.next_expiry = kNoExpiry;
  if (r.ghosts != nullptr) r.ghosts->clear();  // no hash is cached any more, nor comes back
  ret_free_ = r.free_count;
}

void BlockPool::set_retention(std::span<const BlockId> ids, RetentionPriority priority,
                              RetentionTick duration) {
  for (const BlockId id : ids) (void)block(id);  // throws kOutOfRange
  if (priority > kMaxRetentionPriority) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockPool::set_retention: priority " + std::to_string(priority) +
                    " is above the maximum " + std::to_string(kMaxRetentionPriority));
  }
  if (duration <= 0) {
    throw Error(ErrorCode::kInvalidArgument, "BlockPool::set_retention: duration " +
                                                 std::to_string(duration) + " must be positive");
  }
  if (duration != kNoExpiry && !config_.retention_clock) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockPool::set_retention: a duration needs BlockPoolConfig::retention_clock");
  }
  if (priority == kDefaultRetentionPriority) return;  // changes nothing (see the header)
  // The clock (a caller's callback) is read before the first change: ret_enable() moves an LRU
  // pool's free queue into the retention lists.
  const RetentionTick now = duration != kNoExpiry || (ret_ != nullptr && ret_->timed > 0)
                                ? read_clock(config_.retention_clock)
                                : 0;
  ret_enable();  // may throw bad_alloc; nothing has changed yet
  Retention& r = *ret_;
  const RetentionTick exp = duration == kNoExpiry        ? kNoExpiry
                            : now > kNoExpiry - duration ? kNoExpiry - 1
                                                         : now + duration;
  for (const BlockId id : ids) {
    const KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
    if (b.is_null) continue;
    const Retention::ListId list = r.nodes[id].list;
    if (list == Retention::kUncached) continue;  // free and uncached: nothing to keep
    const bool free = list != Retention::kNone;
    RetentionPriority cur = r.nodes[id].prio;
    const bool lapsed = r.expired(id, now);
    if (lapsed) cur = kDefaultRetentionPriority;
    RetentionPriority p = cur;
    RetentionTick d = lapsed ? kNoExpiry : r.duration[id];
    RetentionTick e = lapsed ? kNoExpiry : r.expires[id];
    if (cur == kDefaultRetentionPriority || priority > cur) {
      if (priority > kDefaultRetentionPriority && cur <= kDefaultRetentionPriority &&
          r.stats.retained_blocks - (r.nodes[id].prio > kDefaultRetentionPriority ? 1 : 0) >=
              r.stats.retained_budget) {
        ++r.stats.budget_refusals;
      } else {
        p = priority;
        d = duration;
        e = exp;
      }
    } else if (priority == cur && e != kNoExpiry) {
      d = std::max(d, duration);
      e = std::max(e, exp);
    }
    if (!lapsed && p == cur && d == r.duration[id] && e == r.expires[id]) continue;
    if (free) r.remove(id);
    if (lapsed) r.expire(id);
    r.set(id, p, d, e);
    if (free) r.queue_cached(id, now);
  }
  ret_free_ = r.free_count;
}

void BlockPool::raise_to_default(std::span<const BlockId> ids) {
  for (const BlockId id : ids) (void)block(id);  // throws kOutOfRange
  if (ret_ == nullptr) return;
  Retention& r = *ret_;
  if (r.stats.by_class[static_cast<std::size_t>(RetentionClass::kBelowDefault)].blocks == 0) return;
  const RetentionTick now = r.timed > 0 ? read_clock(config_.retention_clock) : 0;
  for (const BlockId id : ids) {
    if (blocks_[static_cast<std::size_t>(id)].is_null) continue;
    const Retention::ListId list = r.nodes[id].list;
    if (r.nodes[id].prio >= kDefaultRetentionPriority || list == Retention::kUncached) continue;
    const bool free = list != Retention::kNone;
    if (free) r.remove(id);
    if (r.expired(id, now)) {
      r.expire(id);
    } else {
      r.set(id, kDefaultRetentionPriority, kNoExpiry, kNoExpiry);
    }
    if (free) r.queue_cached(id, now);
  }
  ret_free_ = r.free_count;
}

BlockRetention BlockPool::retention(BlockId id) const {
  (void)block(id);
  if (ret_ == nullptr) return BlockRetention{};
  const Retention& r = *ret_;
  if (r.expires[id] != kNoExpiry && read_clock(config_.retention_clock) >= r.expires[id]) {
    return BlockRetention{};
  }
  return BlockRetention{r.nodes[id].prio, r.duration[id], r.expires[id]};
}

RetentionStats BlockPool::retention_stats() const {
  if (ret_ != nullptr) return ret_->stats;
  RetentionStats s;
  const std::int64_t usable = config_.num_blocks - 1;
  s.by_class[static_cast<std::size_t>(RetentionClass::kDefault)].blocks = usable;
  s.by_class[static_cast<std::size_t>(RetentionClass::kDefault)].evictions = num_evictions_;
  s.retained_budget = static_cast<std::int64_t>(
      std::floor(config_.max_retained_fraction * static_cast<double>(usable)));
  return s;
}

void BlockPool::ret_check(std::vector<char>& seen) const {
  const auto fail = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidState, "BlockPool invariant broken (retention): " + what);
  };
  const Retention& r = *ret_;
  if (!free_queue_.empty()) fail("the LRU queue is not empty while the retention lists are used");
  if (ret_free_ != r.free_count) fail("the pool's free count differs from the lists'");
  std::int32_t total = 0;
  std::array<std::int32_t, Retention::kLevels> level{};
  for (int l = 0; l < Retention::kNumLists; ++l) {
    const Retention::List& q = r.lists[static_cast<std::size_t>(l)];
    BlockId prev = kQueueEnd;
    std::int32_t n = 0;
    for (BlockId id = q.head; id != kQueueEnd; id = r.nodes[id].next) {
      if (id <= 0 || id >= config_.num_blocks) fail("a list link is out of range");
      if (seen[id]) fail(id_text(id) + " is in a list twice (or a list has a cycle)");
      seen[id] = 1;
      if (r.nodes[id].prev != prev) fail(id_text(id) + " has a wrong prev link");
      if (r.nodes[id].list != l) fail(id_text(id) + " names another list than its own");
      const KVCacheBlock& b = blocks_[static_cast<std::size_t>(id)];
      if (b.ref_cnt != 0) fail(id_text(id) + " is listed with ref count > 0");
      if ((l == Retention::kUncached) == b.is_cached()) {
        fail(id_text(id) + ": in list 0 iff uncached does not hold");
      }
      if (l != Retention::kUncached) {
        const auto list = static_cast<Retention::ListId>(l);
        const int lv = Retention::level_of_list(list);
        const int seg = Retention::seg_of_list(list);
        if (lv != r.nodes[id].prio) fail(id_text(id) + " is listed at another priority");
        if (config_.eviction_policy == EvictionPolicy::kLru && seg != 0) {
          fail(id_text(id) + " is in a second segment under LRU");
        }
        if (config_.eviction_policy == EvictionPolicy::kLineage) {
          if (seg != Retention::kProtected) {
            if (seg != r.nodes[id].rank) fail(id_text(id) + " is listed at another rank");
            if (((r.rank_bits[static_cast<std::size_t>(lv)] >> seg) & 1) == 0) {
              fail(id_text(id) + "'s rank list has no bit");
            }
          } else if (r.nodes[id].hits == 0) {
            fail(id_text(id) + " is protected without a hit");
          }
        } else if (seg > 1) {
          fail(id_text(id) + " is in a segment its policy does not use");
        }
        ++level[static_cast<std::size_t>(lv)];
        if (r.expires[id] != kNoExpiry && r.expires[id] < r.next_expiry) {
          fail(id_text(id) + " expires before the recorded next expiry");
        }
      } else if (r.nodes[id].prio != kDefaultRetentionPriority || r.expires[id] != kNoExpiry) {
        fail(id_text(id) + " is free and uncached but keeps a retention");
      }
      prev = id;
      ++n;
    }
    if (prev != q.tail) fail("a list's tail is not its last block");
    if (n != q.size) fail("a list's size does not match its length");
    total += n;
  }
  if (total != r.free_count) fail("the free count does not match the lists");
  for (int lv = 0; lv < Retention::kLevels; ++lv) {
    if (level[static_cast<std::size_t>(lv)] != r.level_count_all(lv)) {
      fail("level " + std::to_string(lv) + "'s size is wrong");
    }
    const bool bit = (r.nonempty[static_cast<std::size_t>(lv >> 6)] >> (lv & 63)) & 1;
    if (!bit && level[static_cast<std::size_t>(lv)] > 0) {  // a set bit may be stale (lazy)
      fail("level " + std::to_string(lv) + " has free blocks but no bit");
    }
  }
  std::array<std::int64_t, kNumRetentionClasses> by_class{};
  std::int64_t retained = 0, timed = 0;
  for (std::size_t i = 1; i < blocks_.size(); ++i) {
    const Retention::Node& m = r.nodes[i];
    if (m.timed != (r.expires[i] != kNoExpiry)) {
      fail(id_text(static_cast<BlockId>(i)) + ": the timed flag disagrees with the expiry");
    }
    if (m.prio > kMaxRetentionPriority) fail(id_text(static_cast<BlockId>(i)) + ": bad priority");
    if (m.hits > Retention::kMaxHits) fail(id_text(static_cast<BlockId>(i)) + ": bad hit count");
    if (m.list == Retention::kNone && blocks_[i].ref_cnt == 0) {
      fail(id_text(static_cast<BlockId>(i)) + " is free but in no list");
    }
    ++by_class[static_cast<std::size_t>(retention_class(m.prio))];
    if (m.prio > kDefaultRetentionPriority) ++retained;
    if (r.expires[i] != kNoExpiry) {
      ++timed;
      if (m.prio == kDefaultRetentionPriority) fail("a default priority with an expiry");
    }
    if ((r.expires[i] == kNoExpiry) != (r.duration[i] == kNoExpiry)) {
      fail(id_text(static_cast<BlockId>(i)) + ": an expiry without a duration or back");
    }
  }
  if (r.nodes[0].list != Retention::kNone) fail("the null block is listed");
  if (r.ghosts != nullptr) {
    if (r.target < 0 || r.target > kAdaptiveScale) fail("adaptive's target is out of range");
    for (int w = 0; w < 2; ++w) {
      if (r.ghosts->size(w) > r.ghosts->capacity()) fail("a ghost FIFO holds too many entries");
    }
  }
  for (std::size_t c = 0; c < kNumRetentionClasses; ++c) {
    if (by_class[c] != r.stats.by_class[c].blocks) fail("a class's block count is wrong");
  }
  if (retained != r.stats.retained_blocks) fail("the retained block count is wrong");
  if (retained > r.stats.retained_budget) fail("more blocks retained than the pin budget");
  if (timed != r.timed) fail("the timed block count is wrong");
}

void BlockPool::ret_snapshot(BlockPoolSnapshot& s) const {
  const Retention& r = *ret_;
  s.retention.reserve(blocks_.size());
  s.policy_hits.reserve(blocks_.size());
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    s.retention.push_back(BlockRetention{r.nodes[i].prio, r.duration[i], r.expires[i]});
    s.policy_hits.push_back(r.nodes[i].hits);
  }
  // Up to the last non-empty list (block_pool.hpp): one vector per list would be 6,566 of them.
  std::size_t n = r.lists.size();
  while (n > 0 && r.lists[n - 1].head == kQueueEnd) --n;
  s.eviction_lists.resize(n);  // empty lists allocate nothing
  for (std::size_t l = 0; l < n; ++l) {
    for (BlockId id = r.lists[l].head; id != kQueueEnd; id = r.nodes[id].next) {
      s.eviction_lists[l].push_back(id);
    }
  }
  s.retention_stats = r.stats;
}

std::size_t BlockPool::ret_memory_bytes() const noexcept {
  if (ret_ == nullptr) return 0;
  const Retention& r = *ret_;
  return sizeof(Retention) + r.nodes.capacity() * sizeof(Retention::Node) +
         r.ticks.capacity() * sizeof(std::uint32_t) +
         (r.duration.capacity() + r.expires.capacity()) * sizeof(RetentionTick) +
         (r.ghosts != nullptr ? sizeof(AdaptiveGhosts) + r.ghosts->memory_bytes() : 0) +
         (r.learner != nullptr
              ? sizeof(LineageDepthLearner) +
                    (kMaxLineageKeyDepth + 1) * (sizeof(BlockHash) + sizeof(std::uint64_t))
              : 0);
}

}  // namespace pagedkv
