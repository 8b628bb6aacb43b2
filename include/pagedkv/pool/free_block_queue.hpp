// pagedkv/pool/free_block_queue.hpp: the LRU queue of free blocks, intrusive and allocation free.
//
// A doubly linked list over block ids whose links live in a compact array of their own (8 bytes
// per block, indexed by id, allocated once at construction), so popping a run of blocks chases
// links through a dense array instead of the blocks' metadata. The head is allocated (and so
// evicted) next; the tail is kept longest. Every operation is O(1) per block moved; membership
// is O(1) through the links (kNotQueued when absent). Thread-compatible. Preconditions (a block
// being absent for append/prepend, present for remove) are the caller's (BlockPool validates before
// calling); they are checked with assert in debug builds only, since this is the pool's innermost
// loop.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/pool/kv_cache_block.hpp"
#include "pagedkv/pool/table_allocator.hpp"

namespace pagedkv {

class FreeBlockQueue {
  struct Link {                      // by block id
    BlockId prev_free = kNotQueued;  // previous block, kQueueEnd at the head
    BlockId next_free = kNotQueued;  // next block, kQueueEnd at the tail
  };

 public:
  // Queues blocks first..num_blocks-1 in id order (first = 1 skips the null block).
  FreeBlockQueue(std::int32_t num_blocks, BlockId first)
      : links_(static_cast<std::size_t>(std::max(num_blocks, 0))) {
    for (BlockId id = first; id < num_blocks; ++id) append(id);
  }

  std::int32_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  BlockId front() const noexcept { return head_; }  // kQueueEnd when empty
  BlockId back() const noexcept { return tail_; }
  BlockId next(BlockId id) const noexcept { return links_[id].next_free; }
  BlockId prev(BlockId id) const noexcept { return links_[id].prev_free; }
  bool contains(BlockId id) const noexcept { return links_[id].prev_free != kNotQueued; }
  // Starts loading block id's links (a pop or removal of it soon will not stall on memory).
  void prefetch(BlockId id) const noexcept { __builtin_prefetch(&links_[id]); }

  // Removes and returns the head. Precondition: !empty().
  BlockId popleft() noexcept {
    assert(size_ > 0);
    const BlockId id = head_;
    Link& b = links_[id];
    const BlockId next = b.next_free;
    head_ = next;
    if (next == kQueueEnd) {
      tail_ = kQueueEnd;
    } else {
      links_[next].prev_free = kQueueEnd;
    }
    b.prev_free = kNotQueued;
    b.next_free = kNotQueued;
    --size_;
    return id;
  }

  // Removes the first n blocks and appends their ids to `out`. Precondition: n <= size().
  void popleft_n(std::int32_t n, std::vector<BlockId>& out) {
    assert(n <= size_);
    for (std::int32_t i = 0; i < n; ++i) out.push_back(popleft());
  }

  // Unlinks a block from anywhere in the queue. Precondition: contains(id).
  void remove(BlockId id) noexcept {
    Link& b = links_[id];
    assert(contains(id));
    if (b.prev_free == kQueueEnd) {
      head_ = b.next_free;
    } else {
      links_[b.prev_free].next_free = b.next_free;
    }
    if (b.next_free == kQueueEnd) {
      tail_ = b.prev_free;
    } else {
      links_[b.next_free].prev_free = b.prev_free;
    }
    b.prev_free = kNotQueued;
    b.next_free = kNotQueued;
    --size_;
  }

  // Adds a block at the tail. Precondition: !contains(id).
  void append(BlockId id) noexcept {
    Link& b = links_[id];
    assert(!contains(id));
    b.prev_free = tail_;
    b.next_free = kQueueEnd;
    if (tail_ == kQueueEnd) {
      head_ = id;
    } else {
      links_[tail_].next_free = id;
    }
    tail_ = id;
    ++size_;
  }

  // Adds a block at the head. Precondition: !contains(id).
  void prepend(BlockId id) noexcept {
    Link& b = links_[id];
    assert(!contains(id));
    b.prev_free = kQueueEnd;
    b.next_free = head_;
    if (head_ == kQueueEnd) {
      tail_ = id;
    } else {
      links_[head_].prev_free = id;
    }
    head_ = id;
    ++size_;
  }

  // Adds blocks at the tail in the given order.
  void append_n(std::span<const BlockId> ids) noexcept {
    for (const BlockId id : ids) append(id);
  }

  // Appends blocks one at a time, like append(), with the tail and the count kept in registers
  // until finish() (or destruction) writes them back: a loop of appends then carries no
  // dependency through memory. Nothing else may change the queue while an Appender is open.
  class Appender {
   public:
    explicit Appender(FreeBlockQueue& q) noexcept
        : q_(q), links_(q.links_.data()), tail_(q.tail_) {}
    Appender(const Appender&) = delete;
    Appender& operator=(const Appender&) = delete;
    ~Appender() { finish(); }

    // Precondition: !contains(id).
    void add(BlockId id) noexcept {
      Link& b = links_[id];
      assert(b.prev_free == kNotQueued);
      b.prev_free = tail_;
      b.next_free = kQueueEnd;
      if (tail_ == kQueueEnd) {
        q_.head_ = id;
      } else {
        links_[tail_].next_free = id;
      }
      tail_ = id;
      ++added_;
    }
    void finish() noexcept {
      q_.tail_ = tail_;
      q_.size_ += added_;
      added_ = 0;
    }

   private:
    FreeBlockQueue& q_;
    Link* links_;
    BlockId tail_;
    std::int32_t added_ = 0;
  };

  // Adds blocks at the head as a group, in the given order: ids[0] becomes the new head.
  void prepend_n(std::span<const BlockId> ids) noexcept {
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) prepend(*it);
  }

  // Bytes of link storage (8 per block).
  std::size_t memory_bytes() const noexcept { return links_.capacity() * sizeof(Link); }

  // All queued ids, head first. O(size); for tests and debugging.
  std::vector<BlockId> ids() const {
    std::vector<BlockId> out;
    out.reserve(static_cast<std::size_t>(size_));
    for (BlockId id = head_; id != kQueueEnd; id = links_[id].next_free) out.push_back(id);
    return out;
  }

 private:
  TableVector<Link> links_;   // by block id
  BlockId head_ = kQueueEnd;  // allocated next
  BlockId tail_ = kQueueEnd;  // allocated last
  std::int32_t size_ = 0;     // number of queued blocks
};

}  // namespace pagedkv
