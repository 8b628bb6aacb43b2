// src/remote/op_queue.hpp: the bounded queue of ops in flight that every RemoteStore backend
// keeps (RedisStore, DiskStore), with the counters and latencies of finished ops. Private to
// src/remote/; not installed.
//
// An op lives in one of `queue_depth` records from submission to poll, moving between three
// FIFOs of record indices: free_ops -> pending (submitted, deadlines ascending) -> taken by an
// I/O thread (in no ring) -> completed (done, not yet polled) -> free_ops. Nothing allocates after
// construction except drain_locked()'s reserve of the caller's vector (before anything is taken).
// Thread safety: the rings, the records' ownership and next_ticket are guarded by `mu` (the
// *_locked calls require it held; the backend also guards its own stop flag with it); account()
// touches only the op it is given and relaxed atomics, so it runs on any thread; poll(), wait()
// and in_flight() lock mu themselves. Whoever pushes to `completed` notifies done_cv. Errors: none
// (a full queue is a nullopt and a counted drop).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "../base/vector_growth.hpp"
#include "pagedkv/remote/latency_histogram.hpp"
#include "pagedkv/remote/remote_store.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "store_counters.hpp"

namespace pagedkv::remote_detail {

// A fixed-capacity FIFO of record indices; never allocates after construction. Callers never
// push more than its capacity (one entry per record).
class IndexRing {
 public:
  explicit IndexRing(std::size_t capacity) : buf_(capacity) {}
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  std::uint32_t front() const noexcept { return buf_[head_]; }
  void push(std::uint32_t v) noexcept {
    buf_[(head_ + size_) % buf_.size()] = v;
    ++size_;
  }
  std::uint32_t pop() noexcept {
    const std::uint32_t v = buf_[head_];
    head_ = (head_ + 1) % buf_.size();
    --size_;
    return v;
  }

 private:
  std::vector<std::uint32_t> buf_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

using OpClock = std::chrono::steady_clock;

// One op in flight.
struct StoreOp {
  RemoteOpKind kind = RemoteOpKind::kExists;
  RemoteResult result = RemoteResult::kError;
  std::uint32_t index = 0;  // in its batch
  RemoteTicket ticket = 0;
  RemoteValueBinding id;     // id.block: the key; a get checks the value against all of it
  std::byte* buf = nullptr;  // get: destination; put: source (never written)
  std::size_t len = 0;       // payload bytes (0 for exists)
  OpClock::time_point submitted{};
  OpClock::time_point deadline{};
};

class OpQueue {
 public:
  explicit OpQueue(std::size_t depth)
      : ops(depth), free_ops(depth), pending(depth), completed(depth) {
    for (std::size_t i = 0; i < depth; ++i) free_ops.push(static_cast<std::uint32_t>(i));
  }

  // Records `r` as op `s`'s result and counts it (any thread).
  void account(StoreOp& s, RemoteResult r, OpClock::time_point now) noexcept {
    s.result = r;
    if (r == RemoteResult::kTimeout) bump(counters.timeouts);
    if (r == RemoteResult::kError) bump(counters.errors);
    switch (s.kind) {
      case RemoteOpKind::kExists:
        bump(counters.probes);
        if (r == RemoteResult::kHit) bump(counters.probe_hits);
        exists_latency.record(now - s.submitted);
        break;
      case RemoteOpKind::kGet:
        bump(counters.gets);
        if (r == RemoteResult::kHit) {
          bump(counters.hits);
          bump(counters.bytes_in, s.len);
        }
        if (r == RemoteResult::kMiss || r == RemoteResult::kInvalidValue) bump(counters.misses);
        get_latency.record(now - s.submitted);
        break;
      case RemoteOpKind::kPut:
        bump(counters.puts);
        if (r == RemoteResult::kStored) {
          bump(counters.stored);
          bump(counters.bytes_out, s.len);
        }
        if (r == RemoteResult::kSkippedFull) bump(counters.skipped_full);
        put_latency.record(now - s.submitted);
        break;
    }
  }

  // Completes queued ops whose deadline has passed; true if any. Requires the backend's mutex.
  bool expire_locked(OpClock::time_point now) noexcept {
    bool any = false;
    while (!pending.empty() && ops[pending.front()].deadline <= now) {
      const std::uint32_t i = pending.pop();
      account(ops[i], RemoteResult::kTimeout, now);
      completed.push(i);
      any = true;
    }
    return any;
  }

  // Moves every completed op into `out` and frees its record. Requires the backend's mutex.
  std::size_t drain_locked(std::vector<RemoteCompletion>& out) {
    detail::reserve_more(out, completed.size());  // may throw: nothing taken yet
    const std::size_t n = completed.size();
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint32_t i = completed.pop();
      const StoreOp& s = ops[i];
      out.push_back(RemoteCompletion{s.ticket, s.index, s.kind, s.result});
      free_ops.push(i);
    }
    return n;
  }

  // Queues a batch of `n` ops, each set up by fill(op, k), under a new ticket; nullopt (nothing
  // queued, the drop counted) when fewer than n records are free. Expires overdue ops first.
  // Requires the backend's mutex; the caller wakes its I/O threads after releasing it.
  template <class Fill>
  std::optional<RemoteTicket> submit_locked(RemoteOpKind kind, std::size_t n,
                                            OpClock::time_point now, OpClock::duration timeout,
                                            Fill&& fill) {
    expire_locked(now);
    if (free_ops.size() < n) {
      bump(counters.queue_full_drops, n);
      return std::nullopt;
    }
    const RemoteTicket ticket = next_ticket++;
    for (std::size_t k = 0; k < n; ++k) {
      const std::uint32_t i = free_ops.pop();
      StoreOp& s = ops[i];
      s.kind = kind;
      s.index = static_cast<std::uint32_t>(k);
      s.ticket = ticket;
      s.submitted = now;
      s.deadline = now + timeout;
      fill(s, k);
      pending.push(i);
    }
    return ticket;
  }

  // RemoteStore::poll, wait and in_flight (remote_store.hpp).
  std::size_t poll(std::vector<RemoteCompletion>& out) {
    std::lock_guard<std::mutex> lock(mu);
    expire_locked(OpClock::now());
    return drain_locked(out);
  }
  // A max_wait too large to add to the clock (microseconds::max()) waits until a completion.
  std::size_t wait(std::vector<RemoteCompletion>& out, std::chrono::microseconds max_wait) {
    const auto end = saturating_add(OpClock::now(), max_wait);
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      const auto now = OpClock::now();
      expire_locked(now);
      if (!completed.empty() || now >= end) return drain_locked(out);
      auto until = end;
      if (!pending.empty()) until = std::min(until, ops[pending.front()].deadline);
      if (until == OpClock::time_point::max()) {
        done_cv.wait(lock);
      } else {
        done_cv.wait_until(lock, until);
      }
    }
  }
  // t + d, or time_point::max() where that would overflow (d is compared in its own unit:
  // converting microseconds::max() to the clock's nanoseconds overflows too).
  static OpClock::time_point saturating_add(OpClock::time_point t,
                                            std::chrono::microseconds d) noexcept {
    const auto room =
        std::chrono::duration_cast<std::chrono::microseconds>(OpClock::time_point::max() - t);
    return d >= room ? OpClock::time_point::max() : t + d;
  }
  std::size_t in_flight() const {
    std::lock_guard<std::mutex> lock(mu);
    return ops.size() - free_ops.size();
  }

  RemoteStoreStats stats() const {
    return stats_of(counters, exists_latency, get_latency, put_latency);
  }

  std::vector<StoreOp> ops;  // sized at construction: one per op in flight
  IndexRing free_ops;        // records not in use
  IndexRing pending;         // submitted, not yet taken by an I/O thread (FIFO: deadlines ascend)
  IndexRing completed;       // done, not yet polled
  RemoteTicket next_ticket = 1;
  mutable std::mutex mu;            // guards the above (and the backend's stop flag)
  std::condition_variable done_cv;  // wait(): completed non-empty
  StoreCounters counters;
  LatencyHistogram exists_latency, get_latency, put_latency;
};

}  // namespace pagedkv::remote_detail
