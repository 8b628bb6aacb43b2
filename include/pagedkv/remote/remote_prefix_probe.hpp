// pagedkv/remote/remote_prefix_probe.hpp: how much of a request's prefix a remote store holds,
// found without ever blocking the scheduler thread.
//
// When a request arrives, start() submits one pipelined `exists` batch for all its block keys (the
// blocks after its GPU/host hit). The scheduler keeps polling the store as usual and hands the
// completions to absorb(); ready() says whether the request may be scheduled now and with how many
// leading remote blocks: the longest run from the first key whose exists came back kHit (any miss,
// error, timeout or still-unknown key ends the run). Readiness follows SGLang HiCache's prefetch
// policies:
//   kBestEffort    never waits: ready at once, with whatever is known at that moment;
//   kWaitComplete  ready when every exists has completed (each completes within the store's op
//                  timeout, so this is bounded too);
//   kTimeout       ready when every exists has completed or the deadline has passed, whichever
//                  comes first, with whatever is known then.
// Under every policy a probe is also ready as soon as its answer can no longer change (the run
// has been ended by a key that came back absent or failed).
// A batch the store refuses (queue full) makes the probe ready at once with 0 blocks (counted by
// the store). Presence is not validity: a present value may still fail its checks on get, and the
// caller then treats that block and those after it as misses.
//
// Complexity: start O(keys), absorb O(1) per completion, ready O(1) (the leading run is advanced
// incrementally). Thread-compatible: one probe belongs to one thread (the scheduler's). The probe
// does not own the store, which must outlive the probe's use of it. Memory: one byte per key,
// allocated by start().
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "pagedkv/remote/remote_store.hpp"

namespace pagedkv {

enum class PrefetchPolicy : std::uint8_t { kBestEffort, kWaitComplete, kTimeout };

std::string_view to_string(PrefetchPolicy policy) noexcept;
// "best_effort", "wait_complete", "timeout" (HiCache's names). Throws pagedkv::Error (kParseError).
PrefetchPolicy parse_prefetch_policy(std::string_view name);

class RemotePrefixProbe {
 public:
  using Clock = std::chrono::steady_clock;

  RemotePrefixProbe() = default;

  // Submits exists for every key. Returns false (probe ready with 0 blocks) when the store's queue
  // refused the batch. Throws pagedkv::Error (kInvalidState) when this probe was already started
  // and not reset, or as the store's exists() throws; either way nothing changes.
  bool start(RemoteStore& store, std::span<const BlockHash> keys, PrefetchPolicy policy,
             Clock::time_point deadline);

  // Takes the completions of this probe's batch; ignores all others. Returns how many it took.
  std::size_t absorb(std::span<const RemoteCompletion> completions) noexcept;

  // Whether the request may be scheduled now under the policy (see the file comment).
  bool ready(Clock::time_point now) const noexcept;

  // The leading run of keys known present now (capped at the keys given to start()).
  std::size_t hit_blocks() const noexcept { return run_; }
  // Every exists has completed (or the batch was refused).
  bool complete() const noexcept { return completed_ == state_.size() || refused_; }
  bool started() const noexcept { return started_; }
  RemoteTicket ticket() const noexcept { return ticket_; }
  std::size_t num_keys() const noexcept { return state_.size(); }

  // Forget the batch so the probe can start again. Completions of the old batch arriving later are
  // ignored by the new one (their ticket differs).
  void reset() noexcept;

 private:
  // Per key: 0 unknown, 1 present, 2 absent or failed.
  std::vector<std::uint8_t> state_;
  std::size_t run_ = 0;        // leading keys with state 1
  std::size_t completed_ = 0;  // keys with state != 0
  RemoteTicket ticket_ = 0;
  PrefetchPolicy policy_ = PrefetchPolicy::kBestEffort;
  Clock::time_point deadline_{};
  bool started_ = false;
  bool refused_ = false;
};

}  // namespace pagedkv
