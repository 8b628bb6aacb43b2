#include "pagedkv/sched/admission_scheduler.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

namespace {

std::size_t cdiv(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

}  // namespace

// ---- HashSet ----

void AdmissionScheduler::HashSet::clear() noexcept {
  for (const std::size_t i : used_) slots_[i] = BlockHash();
  used_.clear();
}

void AdmissionScheduler::HashSet::reserve(std::size_t n) {
  if (2 * n <= slots_.size()) {
    used_.reserve(n);
    return;
  }
  const std::size_t capacity = std::bit_ceil(std::max<std::size_t>(64, 2 * n));
  std::vector<BlockHash> slots(capacity);
  std::vector<std::size_t> used;
  used.reserve(n);
  const std::size_t mask = capacity - 1;
  for (const std::size_t i : used_) {
    std::size_t k = slots_[i].hash_code() & mask;
    while (!slots[k].empty()) k = (k + 1) & mask;
    slots[k] = slots_[i];
    used.push_back(k);
  }
  slots_.swap(slots);
  used_.swap(used);
  mask_ = mask;
}

void AdmissionScheduler::HashSet::insert(const BlockHash& h) noexcept {
  std::size_t k = h.hash_code() & mask_;
  while (!slots_[k].empty()) {
    if (slots_[k] == h) return;
    k = (k + 1) & mask_;
  }
  slots_[k] = h;
  used_.push_back(k);  // capacity reserved: cannot throw
}

bool AdmissionScheduler::HashSet::contains(const BlockHash& h) const noexcept {
  if (used_.empty()) return false;
  std::size_t k = h.hash_code() & mask_;
  while (!slots_[k].empty()) {
    if (slots_[k] == h) return true;
    k = (k + 1) & mask_;
  }
  return false;
}

// ---- AdmissionScheduler ----

AdmissionScheduler::AdmissionScheduler(PrefixProbe& probe, AdmissionSchedulerConfig config)
    : probe_(probe), config_(config) {
  if (config_.policy != SchedulePolicy::kFcfs && config_.policy != SchedulePolicy::kPrefix) {
    throw Error(ErrorCode::kInvalidArgument, "AdmissionScheduler: unknown policy " +
                                                 std::to_string(static_cast<int>(config_.policy)));
  }
  for (const double w : {config_.host_token_weight, config_.remote_token_weight}) {
    if (!(w >= 0.0 && w <= 1.0)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "AdmissionScheduler: a token weight must be in [0, 1], not " + std::to_string(w));
    }
  }
}

const Proposal& AdmissionScheduler::propose(std::span<const WaitingRequest> waiting,
                                            const StepResources& resources) {
  // Validation first: nothing changes on bad input.
  arrivals_.clear();
  arrivals_.reserve(waiting.size());
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    const WaitingRequest& w = waiting[i];
    if (w.request == nullptr || w.request->num_tokens() == 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "AdmissionScheduler::propose: waiting entry " + std::to_string(i) +
                      (w.request == nullptr ? " has no request" : " has no tokens"));
    }
    arrivals_.push_back(w.request->id());
  }
  // One request waiting twice would be admitted twice in one proposal. (The scratch holds the
  // request ids here, the arrival ranks from below on.)
  std::sort(arrivals_.begin(), arrivals_.end());
  if (const auto twice = std::adjacent_find(arrivals_.begin(), arrivals_.end());
      twice != arrivals_.end()) {
    throw Error(ErrorCode::kInvalidArgument, "AdmissionScheduler::propose: request " +
                                                 std::to_string(*twice) + " is waiting twice");
  }
  arrivals_.clear();
  for (const WaitingRequest& w : waiting) arrivals_.push_back(w.arrival);
  std::sort(arrivals_.begin(), arrivals_.end());
  if (const auto twice = std::adjacent_find(arrivals_.begin(), arrivals_.end());
      twice != arrivals_.end()) {
    throw Error(ErrorCode::kInvalidArgument,
                "AdmissionScheduler::propose: two waiting requests share arrival rank " +
                    std::to_string(*twice));
  }
  const bool prefix = config_.policy == SchedulePolicy::kPrefix;
  candidates_.clear();
  candidates_.reserve(waiting.size());
  const std::uint64_t last_candidate =
      config_.max_candidates != 0 && waiting.size() > config_.max_candidates
          ? arrivals_[config_.max_candidates - 1]
          : std::numeric_limits<std::uint64_t>::max();
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    const WaitingRequest& w = waiting[i];
    if (w.arrival > last_candidate) continue;
    const CachedPrefix c = probe_.probe(*w.request);
    const double key = static_cast<double>(c.gpu_tokens) +
                       config_.host_token_weight * static_cast<double>(c.host_tokens) +
                       config_.remote_token_weight * static_cast<double>(w.remote_tokens);
    candidates_.push_back({i, c, key, prefix && w.passed_over >= config_.max_passed_over});
  }
  const auto arrival = [&](const Candidate& c) { return waiting[c.index].arrival; };
  if (prefix) {
    std::sort(candidates_.begin(), candidates_.end(), [&](const Candidate& a, const Candidate& b) {
      if (a.urgent != b.urgent) return a.urgent;
      if (!a.urgent && a.key != b.key) return a.key > b.key;
      return arrival(a) < arrival(b);
    });
  } else {
    std::sort(candidates_.begin(), candidates_.end(),
              [&](const Candidate& a, const Candidate& b) { return arrival(a) < arrival(b); });
  }

  proposal_.admissions.clear();
  proposal_.deferred.clear();
  proposal_.tokens_charged = 0;
  proposal_.blocks_taken = 0;
  proposal_.blocks_reserved = 0;
  proposed_for_ = waiting.size();
  in_step_.clear();
  pending_.clear();
  try {
    fill_proposal(waiting, resources);
  } catch (...) {  // bad_alloc growing a buffer: an empty proposal, not a partial one
    proposal_.admissions.clear();
    proposal_.deferred.clear();
    proposal_.tokens_charged = proposal_.blocks_taken = proposal_.blocks_reserved = 0;
    throw;
  }
  return proposal_;
}

void AdmissionScheduler::fill_proposal(std::span<const WaitingRequest> waiting,
                                       const StepResources& resources) {
  const bool prefix = config_.policy == SchedulePolicy::kPrefix;
  const std::size_t bs = probe_.block_size();
  std::size_t budget = resources.token_budget;
  std::size_t free = resources.free_blocks;
  std::size_t slots = resources.max_admissions;
  std::size_t host_left = config_.host_load_tokens_per_step;
  std::size_t remote_left = config_.remote_load_tokens_per_step;
  bool host_loading = false, remote_loading = false;
  std::size_t inserted = 0;
  // Once an urgent request does not fit, nothing that arrived after it is admitted this step.
  std::uint64_t limit = std::numeric_limits<std::uint64_t>::max();
  for (const Candidate& c : candidates_) {
    if (budget == 0 || slots == 0) break;
    const WaitingRequest& w = waiting[c.index];
    if (w.arrival > limit) continue;
    const Request& r = *w.request;
    const std::span<const BlockHash> hashes = r.block_hashes();
    const std::size_t cap = r.num_tokens() - 1;  // the last token is always computed
    const std::size_t max_blocks = std::min(cap / bs, hashes.size());
    const std::size_t gpu_blocks = c.cached.gpu_tokens / bs;
    // Blocks an earlier admission of this step caches when it is allocated: hits by then.
    std::size_t j = gpu_blocks;
    while (j < max_blocks && in_step_.contains(hashes[j])) ++j;
    const std::size_t start = j * bs;
    const std::size_t local_end = c.cached.gpu_tokens + c.cached.host_tokens;
    // min(cap, local_end + remote_tokens), saturating: a huge remote count (the caller's) once
    // wrapped the sum and silently loaded nothing.
    const std::size_t remote_end =
        local_end >= cap || w.remote_tokens >= cap - local_end ? cap : local_end + w.remote_tokens;
    const std::size_t host = local_end > start ? local_end - start : 0;
    const std::size_t from = std::max(start, local_end);
    const std::size_t remote = remote_end > from ? remote_end - from : 0;
    const std::size_t cached = start + host + remote;

    // A shared uncached prefix: an earlier admission computes this request's next block in a
    // later step. Wait for it (urgent requests never wait).
    const std::size_t next = cached / bs;
    if (prefix && config_.defer_shared_prefix && !c.urgent && next < hashes.size() &&
        pending_.contains(hashes[next])) {
      proposal_.deferred.push_back(c.index);
      continue;
    }
    std::size_t chunk = std::min(r.num_tokens() - cached, budget);
    if (config_.max_chunk_tokens != 0) chunk = std::min(chunk, config_.max_chunk_tokens);
    const std::size_t new_blocks = cdiv(cached + chunk, bs) - j + c.cached.gpu_free_hit_blocks;
    const std::size_t reserved =
        config_.reserve_whole_prompt
            ? std::max(new_blocks, cdiv(r.num_tokens(), bs) - j + c.cached.gpu_free_hit_blocks)
            : new_blocks;
    const bool loads_fit = (host == 0 || config_.host_load_tokens_per_step == 0 || !host_loading ||
                            host <= host_left) &&
                           (remote == 0 || config_.remote_load_tokens_per_step == 0 ||
                            !remote_loading || remote <= remote_left);
    if (reserved > free || !loads_fit) {
      if (!prefix) break;               // FCFS: nobody passes the head of the queue
      if (c.urgent) limit = w.arrival;  // nobody younger passes an urgent request
      continue;
    }

    // Admitted: record the blocks it computes, this step (hits for later admissions) and after.
    const std::size_t computed_end = (cached + chunk) / bs;  // full blocks cached at allocation
    const std::size_t first = cached / bs;
    const std::size_t known = hashes.size();
    inserted += known > first ? known - first : 0;
    in_step_.reserve(inserted);
    pending_.reserve(inserted);
    for (std::size_t b = first; b < known; ++b) {
      (b < computed_end ? in_step_ : pending_).insert(hashes[b]);
    }
    Admission a;
    a.index = c.index;
    a.cached = c.cached;
    a.in_step_tokens = start - c.cached.gpu_tokens;
    a.remote_tokens = remote;
    a.chunk_tokens = chunk;
    a.new_blocks = new_blocks;
    a.reserved_blocks = reserved;
    proposal_.admissions.push_back(a);
    proposal_.tokens_charged += chunk;
    proposal_.blocks_taken += new_blocks;
    proposal_.blocks_reserved += reserved;
    budget -= chunk;
    free -= reserved;
    --slots;
    if (host > 0) {
      host_loading = true;
      host_left -= std::min(host_left, host);
    }
    if (remote > 0) {
      remote_loading = true;
      remote_left -= std::min(remote_left, remote);
    }
  }
}

void AdmissionScheduler::record_step(std::span<WaitingRequest> waiting, std::size_t num_admitted) {
  if (waiting.size() != proposed_for_ || num_admitted > proposal_.admissions.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "AdmissionScheduler::record_step: " + std::to_string(num_admitted) + " of " +
                    std::to_string(proposal_.admissions.size()) + " admissions for " +
                    std::to_string(waiting.size()) + " waiting requests (proposed for " +
                    std::to_string(proposed_for_) + ")");
  }
  if (num_admitted == 0) return;
  admitted_.assign(waiting.size(), 0);
  std::uint64_t latest = 0;
  for (std::size_t k = 0; k < num_admitted; ++k) {
    const std::size_t i = proposal_.admissions[k].index;
    admitted_[i] = 1;
    latest = std::max(latest, waiting[i].arrival);
  }
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    // Saturating: a wrap to 0 would take an urgent request's urgency away.
    if (admitted_[i] == 0 && waiting[i].arrival < latest &&
        waiting[i].passed_over < std::numeric_limits<std::uint32_t>::max()) {
      ++waiting[i].passed_over;
    }
  }
}

}  // namespace pagedkv
