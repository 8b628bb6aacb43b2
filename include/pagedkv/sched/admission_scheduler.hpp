// pagedkv/sched/admission_scheduler.hpp: cache-aware admission of waiting requests.
//
// An engine's scheduler calls propose() once per step, after it has scheduled its running
// requests, with the waiting requests (already hashed), the blocks admissions may take, the
// compute tokens left in the step and the running slots left. The proposal is the admission
// order and each admitted request's prefill chunk; the engine admits in that order
// (get_computed_blocks + allocate_slots as usual, which remain the truth) and, if an allocation
// fails, stops there. It then calls record_step() with how many it admitted, which ages the
// requests that were passed over.
//
// Policies:
//   kFcfs    arrival order; stops at the first request that does not fit (vLLM's default).
//   kPrefix  longest cached prefix first (cached tokens, ties by arrival), with
//            - cached tokens free: a request is charged only the tokens it computes, so the budget
//              admits more requests when their prefixes are cached;
//            - same-step deferral: a request whose next uncached block an earlier admission of this
//              step computes beyond its chunk (a shared uncached prefix) waits a step, to hit it
//              then instead of computing it twice; blocks an earlier admission computes within its
//              chunk count as cached (allocate_slots caches them when it allocates them);
//            - aging: a request is "passed over" in a step when it stays waiting while a request
//              that arrived after it is admitted. After max_passed_over such steps it is urgent:
//              urgent requests go first, in arrival order, are never deferred, and when one does
//              not fit nothing that arrived after it is admitted that step. So no request is ever
//              passed over more than max_passed_over steps (its FCFS turn, plus that bound).
//
// Load cost (host and remote tiers): loaded tokens are not computed, so they are not charged to
// the compute budget; they are charged to a per-step load budget instead, one per tier
// (host_load_tokens_per_step, remote_load_tokens_per_step; 0: unlimited), the tokens the link
// moves while the step computes. A request whose loads exceed what is left waits, unless it is the
// step's first load of that tier (a load longer than a step still goes through, alone). For the
// order, a loaded token counts as host_token_weight / remote_token_weight of a GPU-cached token.
//
// Free blocks: a request needs ceil((cached + chunk) / block_size) - (GPU hit blocks) new blocks,
// plus its GPU hit blocks that sit in the free queue (allocate_slots' capacity rule); with
// reserve_whole_prompt (default) its whole prompt's blocks are counted instead of the chunk's.
// The proposal never counts more than StepResources::free_blocks, never charges more than
// token_budget and never admits more than max_admissions. (A free hit block shared by two
// admissions is counted for both: conservative.)
//
// Cost: propose() probes every candidate (up to max_candidates, the earliest arrivals) once
// (prefix_probe.hpp: O(cached prefix blocks) read-only lookups each), sorts them (O(W log W)) and,
// per admission, records its uncached blocks in a flat hash set (O(prompt blocks)). No allocation
// once its buffers have grown. Thread-compatible: one scheduler thread; the manager behind the
// probe must not change during propose(). Errors (pagedkv::Error kInvalidArgument, nothing
// changed): a null request, two waiting entries with the same arrival rank, one request (id)
// waiting twice, a request with no tokens, a proposal index out of range in record_step(). A
// bad_alloc in propose() propagates and leaves no partial proposal: the previous one when it came
// while probing the candidates, an empty one when it came while filling the new proposal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/hash/block_hash.hpp"
#include "pagedkv/manager/request.hpp"
#include "pagedkv/sched/prefix_probe.hpp"

namespace pagedkv {

enum class SchedulePolicy { kFcfs, kPrefix };

struct AdmissionSchedulerConfig {
  SchedulePolicy policy = SchedulePolicy::kPrefix;
  std::uint32_t max_passed_over = 256;  // aging bound, in steps (kPrefix)
  bool defer_shared_prefix = true;      // same-step deferral (kPrefix)
  // Only the max_candidates earliest arrivals are probed and considered in a step (0: all); the
  // others wait (they arrived after every candidate, so none is passed over). Bounds propose()'s
  // cost on a long queue, as SGLang bounds its longest-prefix policy to short queues.
  std::size_t max_candidates = 128;
  // Blocks are reserved for the request's whole prompt, not only this step's chunk, so that a
  // long prompt admitted in chunks does not run out of blocks halfway and preempt others (whose
  // recomputation costs more than the hits gained). StepResources::free_blocks should then leave
  // out the blocks running requests still need for their own prompts.
  bool reserve_whole_prompt = true;
  // The most tokens one admission computes in a step (vLLM's long_prefill_token_threshold), so
  // several requests share a step's budget; 0: only the budget cuts a chunk. (Without a cap, a
  // chunk ends before the prompt only when it takes the rest of the budget, so no later request
  // of the step can be deferred behind it: deferral matters with a cap.)
  std::size_t max_chunk_tokens = 0;
  std::size_t host_load_tokens_per_step = 0;    // 0: unlimited
  std::size_t remote_load_tokens_per_step = 0;  // 0: unlimited
  double host_token_weight = 1.0;    // in [0, 1]: a host-loaded token's worth in the order
  double remote_token_weight = 1.0;  // in [0, 1]
};

// One waiting request, as the engine sees it this step.
struct WaitingRequest {
  const Request* request = nullptr;  // hashed; not running
  std::uint64_t arrival = 0;         // FCFS rank: smaller arrived first; unique in a call
  std::uint32_t passed_over = 0;     // steps passed over so far (saturates); record_step() keeps it
  // Tokens after the local (GPU + host) prefix that a store below the host holds (e.g. counted
  // with RemotePrefixProbe); loaded, not computed. 0 when there is no remote tier.
  std::size_t remote_tokens = 0;
};

struct StepResources {
  std::size_t token_budget = 0;    // compute tokens left in this step
  std::size_t free_blocks = 0;     // blocks admissions may take (keep any reserve out of it)
  std::size_t max_admissions = 0;  // running slots left
};

struct Admission {
  std::size_t index = 0;            // into the waiting span given to propose()
  CachedPrefix cached;              // the probe's answer
  std::size_t in_step_tokens = 0;   // after cached.gpu_tokens: blocks an earlier admission caches
  std::size_t remote_tokens = 0;    // loaded from below the host
  std::size_t chunk_tokens = 0;     // computed this step (charged to the budget), >= 1
  std::size_t new_blocks = 0;       // taken from the free blocks by this step's allocation
  std::size_t reserved_blocks = 0;  // counted against the free blocks (>= new_blocks)

  // Tokens the request starts from without computing them.
  std::size_t cached_tokens() const noexcept {
    return cached.gpu_tokens + in_step_tokens + cached.host_tokens + remote_tokens;
  }
};

struct Proposal {
  std::vector<Admission> admissions;  // in admission order
  std::vector<std::size_t> deferred;  // waiting indices deferred for a same-step shared prefix
  std::size_t tokens_charged = 0;     // sum of chunk_tokens
  std::size_t blocks_taken = 0;       // sum of new_blocks
  std::size_t blocks_reserved = 0;    // sum of reserved_blocks, <= StepResources::free_blocks
};

class AdmissionScheduler {
 public:
  // Errors: a weight outside [0, 1], a policy that is not kFcfs or kPrefix (kInvalidArgument).
  AdmissionScheduler(PrefixProbe& probe, AdmissionSchedulerConfig config);

  const AdmissionSchedulerConfig& config() const noexcept { return config_; }

  // The step's proposal (valid until the next propose()). Reads the cache through the probe only.
  const Proposal& propose(std::span<const WaitingRequest> waiting, const StepResources& resources);

  // The engine admitted the first `num_admitted` admissions of the last proposal (for `waiting`,
  // the same requests at the same indices as in propose()): every other waiting request that
  // arrived before the latest-arriving admitted one is passed over once more. Errors:
  // num_admitted beyond the proposal, a span of another size (kInvalidArgument; nothing changed).
  void record_step(std::span<WaitingRequest> waiting, std::size_t num_admitted);

 private:
  // Open addressing over block hashes, cleared each step (no allocation once grown).
  class HashSet {
   public:
    void clear() noexcept;
    void reserve(std::size_t n);
    void insert(const BlockHash& h) noexcept;  // after reserve() for every insert of the step
    bool contains(const BlockHash& h) const noexcept;

   private:
    std::vector<BlockHash> slots_;   // empty hash: a free slot (full blocks never hash empty)
    std::vector<std::size_t> used_;  // the occupied slots, to clear them in O(size)
    std::size_t mask_ = 0;           // slots_.size() - 1 (a power of two), or 0 when empty
  };
  // propose()'s admission loop over candidates_ (sorted), into proposal_.
  void fill_proposal(std::span<const WaitingRequest> waiting, const StepResources& resources);
  struct Candidate {
    std::size_t index;
    CachedPrefix cached;
    double key;  // cached tokens, loaded ones weighted
    bool urgent;
  };

  PrefixProbe& probe_;
  AdmissionSchedulerConfig config_;
  Proposal proposal_;
  std::size_t proposed_for_ = 0;         // waiting.size() of the last propose()
  std::vector<Candidate> candidates_;    // propose(): the waiting requests in proposal order
  std::vector<std::uint64_t> arrivals_;  // propose(): sorted request ids, then arrival ranks
                                         // (uniqueness checks)
  std::vector<unsigned char> admitted_;  // record_step(): 1 for each admitted waiting index
  HashSet in_step_;  // blocks this step's admissions compute within their chunks
  HashSet pending_;  // blocks they compute in later steps
};

}  // namespace pagedkv
