#include "replay.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/sched/admission_scheduler.hpp"
#include "pagedkv/sched/prefix_probe.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv::replay {

std::string format(const char* fmt, ...) {
  std::va_list args;
  va_start(args, fmt);
  std::va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string out(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, again);
  va_end(again);
  return out;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string redact_url(std::string_view url) {
  const auto scheme = url.find("://");
  const auto at = url.rfind('@');
  if (scheme == std::string_view::npos || at == std::string_view::npos || at < scheme) {
    return std::string(url);
  }
  const auto colon = url.find(':', scheme + 3);
  if (colon == std::string_view::npos || colon > at) return std::string(url);  // no password
  return std::string(url.substr(0, colon + 1)) + "***" + std::string(url.substr(at));
}

namespace {

// The window group's block size (--window-block-size; --block-size when not given).
std::uint32_t window_block_size(const ReplayOptions& o) {
  return o.window_block_size != 0 ? o.window_block_size : o.block_size;
}

// Pool blocks a prompt of `tokens` needs: a block row per KV-cache group, each at its block size.
std::uint64_t pool_blocks_needed(const ReplayOptions& o, std::uint64_t tokens) {
  const auto blocks = [tokens](std::uint64_t bs) { return (tokens + bs - 1) / bs; };
  return blocks(o.block_size) + (o.sliding_window > 0 ? blocks(window_block_size(o)) : 0);
}

}  // namespace

KVCacheManagerConfig manager_config(const ReplayOptions& o, std::int32_t num_blocks) {
  if (num_blocks < 2) {
    throw Error(ErrorCode::kInvalidArgument,
                "--num-blocks " + std::to_string(num_blocks) + ": at least 2 (null block + 1)");
  }
  KVCacheManagerConfig c;
  c.num_blocks = num_blocks;
  c.block_size = o.block_size;
  c.enable_caching = o.caching;
  c.verify_cache_hits = o.verify_cache_hits;
  c.hash_scheme = o.hash;
  c.hash_seed = "pagedkv-replay";  // the same for every manager of a sweep
  if (o.sliding_window > 0) {
    c.groups = {AttentionSpec::full(o.block_size),
                AttentionSpec::sliding(window_block_size(o), o.sliding_window)};
  }
  c.eviction_policy = o.pool_eviction;
  c.lineage_key_depth = o.lineage_key_depth;
  c.lineage_adaptive_depth = o.lineage_adaptive_depth;
  c.adaptive_ghost_sample_shift = o.adaptive_ghost_sample_shift;
  return c;
}

Eviction parse_eviction(const std::string& name) {
  if (name == "lru") return Eviction::kLru;
  if (name == "belady") return Eviction::kBelady;
  if (name == "reuse-oracle") return Eviction::kReuseOracle;
  if (name == "reuse-oracle-mru") return Eviction::kReuseOracleMru;
  if (name == "belady-noisy") return Eviction::kBeladyNoisy;
  throw Error(ErrorCode::kInvalidArgument,
              "--eviction: lru, belady, reuse-oracle, reuse-oracle-mru or belady-noisy, not '" +
                  name + "'");
}

const char* to_string(Eviction e) noexcept {
  switch (e) {
    case Eviction::kBelady:
      return "belady";
    case Eviction::kReuseOracle:
      return "reuse-oracle";
    case Eviction::kReuseOracleMru:
      return "reuse-oracle-mru";
    case Eviction::kBeladyNoisy:
      return "belady-noisy";
    case Eviction::kLru:
      break;
  }
  return "lru";
}

void parse_eviction(const std::string& name, ReplayOptions& options) {
  if (name == "belady" || name == "reuse-oracle" || name == "reuse-oracle-mru") {
    options.eviction = parse_eviction(name);
    return;
  }
  if (name.rfind("belady-noisy:", 0) == 0) {  // belady-noisy:S, S a decimal sigma
    const std::string v = name.substr(std::string("belady-noisy:").size());
    char* end = nullptr;
    const double sigma = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(sigma >= 0.0 && sigma <= kMaxBeladyNoise)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "--eviction belady-noisy:S needs S a number in 0.." +
                      std::to_string(static_cast<int>(kMaxBeladyNoise)) + ", not '" + v + "'");
    }
    options.eviction = Eviction::kBeladyNoisy;
    options.belady_noise = sigma;
    return;
  }
  // lineage:D (key depth D) or lineage:auto (learned depth).
  const std::size_t colon = name.find(':');
  const std::string policy = name.substr(0, colon);
  std::size_t depth = kLineageKeyDepth;
  bool adaptive = false;
  try {
    options.pool_eviction = parse_eviction_policy(policy);
    if (colon != std::string::npos) {
      const std::string d = name.substr(colon + 1);
      char* end = nullptr;
      const unsigned long long v = std::strtoull(d.c_str(), &end, 10);
      if (options.pool_eviction != EvictionPolicy::kLineage) {
        throw Error(ErrorCode::kInvalidArgument, "only lineage takes :D or :auto");
      }
      if (d == "auto") {
        adaptive = true;
      } else if (d.empty() || d[0] == '-' || *end != '\0' || v > kMaxLineageKeyDepth) {
        throw Error(ErrorCode::kInvalidArgument,
                    "lineage:D needs D in 0.." + std::to_string(kMaxLineageKeyDepth));
      } else {
        depth = static_cast<std::size_t>(v);
      }
    }
  } catch (const Error& e) {
    std::string names = "belady|reuse-oracle|reuse-oracle-mru|belady-noisy:S";
    for (std::uint8_t p = 0; p < kNumEvictionPolicies; ++p) {
      names += std::string("|") + std::string(to_string(static_cast<EvictionPolicy>(p)));
    }
    throw Error(
        ErrorCode::kInvalidArgument,
        "--eviction: " + names + "|lineage:D|lineage:auto, not '" + name + "' (" + e.what() + ")");
  }
  options.lineage_key_depth = depth;
  options.lineage_adaptive_depth = adaptive;
  options.eviction = Eviction::kLru;
}

std::string eviction_name(const ReplayOptions& o) {
  if (o.eviction == Eviction::kBeladyNoisy) {
    char sigma[32];
    std::snprintf(sigma, sizeof sigma, "%g", o.belady_noise);
    return std::string(to_string(o.eviction)) + ":" + sigma;
  }
  if (o.eviction != Eviction::kLru) return to_string(o.eviction);
  std::string name(to_string(o.pool_eviction));
  if (o.lineage_adaptive_depth) return name + ":auto";
  if (o.lineage_key_depth != kLineageKeyDepth) name += ":" + std::to_string(o.lineage_key_depth);
  return name;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// CPU time of the calling thread: unlike the wall clock, it does not count the time the thread
// waits for a core, so it stays meaningful on a loaded machine (and is what `openssl speed`
// divides by).
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::uint64_t cdiv(std::uint64_t a, std::uint64_t b) {
  return (a + b - 1) / b;
}

// The value at rank floor(q * (n - 1)) of the sorted values (nearest rank below; reorders v).
double percentile(std::vector<double>& v, double q) {
  const std::size_t k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

RequestHashKeys keys_of(const TraceRequest& r) {
  RequestHashKeys k;
  k.cache_salt = r.cache_salt;
  return k;
}

// Hashes requests ahead of the replay on a second thread (hashing is a pure function of a
// request's tokens and may run anywhere), handing them over in order through a bounded queue.
class HashingPipeline {
 public:
  HashingPipeline(const Trace& trace, BlockHasher hasher, std::uint32_t block_size, bool threaded)
      : trace_(trace), hasher_(std::move(hasher)), block_size_(block_size), threaded_(threaded) {
    if (threaded_) worker_ = std::thread([this] { produce(); });
  }
  ~HashingPipeline() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  // The next request in trace order.
  Request next() {
    if (!threaded_) return make(next_inline_++);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty() || error_; });
    if (queue_.empty()) std::rethrow_exception(error_);
    Request r = std::move(queue_.front());
    queue_.pop_front();
    cv_.notify_all();
    return r;
  }
  // Seconds spent building and hashing requests (on whichever thread did it); the tokens'
  // synthesis from the trace is counted apart (synthesis_seconds), not as hashing.
  double hash_seconds() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hash_seconds_;
  }
  double synthesis_seconds() const {
    std::lock_guard<std::mutex> lock(mu_);
    return synthesis_seconds_;
  }
  double hash_cpu_seconds() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hash_cpu_seconds_;
  }

 private:
  static constexpr std::size_t kDepth = 64;

  Request make(std::size_t i) {
    const auto ts = Clock::now();
    synthesize_prompt(trace_, i, tokens_);
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_seconds();
    Request r(i, hasher_, block_size_, tokens_, keys_of(trace_.requests[i]));
    const double c1 = thread_cpu_seconds();
    const auto t1 = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    hash_cpu_seconds_ += c1 - c0;
    synthesis_seconds_ += std::chrono::duration<double>(t0 - ts).count();
    hash_seconds_ += std::chrono::duration<double>(t1 - t0).count();
    return r;
  }
  void produce() {
    try {
      for (std::size_t i = 0; i < trace_.requests.size(); ++i) {
        Request r = make(i);
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return queue_.size() < kDepth || stop_; });
        if (stop_) return;
        queue_.push_back(std::move(r));
        cv_.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
    }
  }

  const Trace& trace_;
  BlockHasher hasher_;
  std::uint32_t block_size_;
  bool threaded_;
  std::vector<TokenId> tokens_;  // used by one thread only
  std::size_t next_inline_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> queue_;
  std::exception_ptr error_;
  bool stop_ = false;
  double hash_seconds_ = 0;
  double synthesis_seconds_ = 0;
  double hash_cpu_seconds_ = 0;
  std::thread worker_;
};

std::vector<ReplayResult> run_sequential(const Trace& trace, const ReplayOptions& o) {
  std::vector<std::unique_ptr<KVCacheManager>> managers;
  std::vector<ReplayResult> results(o.num_blocks.size());
  for (std::size_t k = 0; k < o.num_blocks.size(); ++k) {
    managers.push_back(std::make_unique<KVCacheManager>(manager_config(o, o.num_blocks[k])));
    results[k].num_blocks = o.num_blocks[k];
  }
  const auto wall = Clock::now();
  HashingPipeline pipeline(trace, managers.front()->hasher(), o.block_size, o.threads > 1);
  for (std::size_t i = 0; i < trace.requests.size(); ++i) {
    Request request = pipeline.next();
    const std::uint64_t num_tokens = request.num_tokens();
    const std::uint64_t blocks_needed = cdiv(num_tokens, o.block_size);
    for (std::size_t k = 0; k < managers.size(); ++k) {
      KVCacheManager& m = *managers[k];
      ReplayResult& res = results[k];
      ++res.requests;
      res.prompt_tokens += num_tokens;
      res.prompt_blocks += blocks_needed;
      if (pool_blocks_needed(o, num_tokens) > static_cast<std::uint64_t>(o.num_blocks[k] - 1)) {
        ++res.rejected;
        continue;
      }
      // Every manager but the last works on a copy (free() finishes a request).
      std::optional<Request> copy;
      if (k + 1 < managers.size()) copy.emplace(request);
      Request& r = copy ? *copy : request;
      const auto t1 = Clock::now();
      const double c1 = thread_cpu_seconds();
      const CacheHit hit = m.get_computed_blocks(r);
      const auto blocks = m.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit);
      if (!blocks) {
        throw Error(ErrorCode::kInvalidState,
                    "replay: request " + std::to_string(i) + " did not fit an idle pool");
      }
      res.peak_usage = std::max(res.peak_usage, m.usage());
      m.free(r);
      res.pool_cpu_seconds += thread_cpu_seconds() - c1;
      res.pool_seconds += seconds_since(t1);
      res.queried_tokens += num_tokens;
      res.hit_tokens += hit.num_tokens;
      res.prefill_tokens_computed += num_tokens - hit.num_tokens;
    }
  }
  const double wall_seconds = seconds_since(wall);
  for (std::size_t k = 0; k < managers.size(); ++k) {
    results[k].hash_seconds = pipeline.hash_seconds();
    results[k].synthesis_seconds = pipeline.synthesis_seconds();
    results[k].hash_cpu_seconds = pipeline.hash_cpu_seconds();
    results[k].wall_seconds = wall_seconds;
    results[k].evicted_blocks = managers[k]->stats().evictions;
  }
  return results;
}

// Continuous batching in the style of vLLM's scheduler: running requests first (prefill chunks,
// then one decode token each), then waiting requests FCFS within the step's token budget; when a
// running request's allocation does not fit, the most recently admitted running request is
// preempted (its blocks released, to be recomputed later).
//
// The cache is driven through `d`: PlainCache (a KVCacheManager) or TierCache (a
// TieredKVCacheManager whose copies are charged at --host-gbps, simulated).
struct PlainCache {
  explicit PlainCache(const KVCacheManagerConfig& c) : m(c) {}
  KVCacheManager m;
  const KVCacheManager& gpu() const { return m; }
  PrefixProbe make_probe() const { return PrefixProbe(m); }
  Request make_request(RequestId id, std::span<const TokenId> tokens, RequestHashKeys keys) const {
    return m.make_request(id, tokens, std::move(keys));
  }
  bool allocate(Request& r, std::size_t n) { return m.allocate_slots(r, n).has_value(); }
  // Admits with at most `budget` new tokens: the hit's tokens, or nullopt (nothing changed).
  std::optional<std::size_t> admit(Request& r, std::size_t budget, std::size_t& want) {
    const CacheHit hit = m.get_computed_blocks(r);
    want = std::min(r.num_tokens() - hit.num_tokens, budget);
    if (!m.allocate_slots(r, want, hit)) return std::nullopt;
    return hit.num_tokens;
  }
  void preempt(Request& r) { m.preempt(r); }
  void free(Request& r) { m.free(r); }
  double end_step() { return 0; }  // simulated transfer time of the step (ms)
};

// Every copy of a plan is committed done; evictions and loads at once (before the step's
// forward pass), stores when the step ends. A step's copies take bytes / host_gbps, added to
// the step (not overlapped with compute: an upper bound on the cost).
struct TierCache {
  TierCache(const KVCacheManagerConfig& c, const HostTierConfig& h, double gbps)
      : t(c, h),
        host_gbps(gbps),
        bytes_per_block(h.bytes_per_block),
        group_bytes_per_block(h.group_bytes_per_block) {}
  TieredKVCacheManager t;
  double host_gbps;
  std::uint64_t bytes_per_block;
  std::vector<std::uint64_t> group_bytes_per_block;  // hybrid models: a block's bytes per group
  std::uint64_t step_bytes = 0;
  std::uint64_t gpu_hit_tokens = 0, host_hit_tokens = 0;
  double transfer_ms = 0;
  std::vector<TransferId> stores;  // committed at the end of the step
  const KVCacheManager& gpu() const { return t.gpu(); }
  PrefixProbe make_probe() const { return PrefixProbe(t); }
  Request make_request(RequestId id, std::span<const TokenId> tokens, RequestHashKeys keys) const {
    return t.make_request(id, tokens, std::move(keys));
  }
  void before(const TierPlan& p) {
    for (const TransferId id : p.eviction_ids) t.commit(id, true);
    for (const TransferId id : p.load_ids) t.commit(id, true);
    stores.insert(stores.end(), p.store_ids.begin(), p.store_ids.end());
    if (group_bytes_per_block.empty()) {
      step_bytes += p.plan.num_copies() * bytes_per_block;
      return;
    }
    for (const auto* stage : {&p.plan.evictions, &p.plan.loads, &p.plan.stores}) {
      for (const BlockCopy& c : *stage) step_bytes += group_bytes_per_block[c.group];
    }
  }
  bool allocate(Request& r, std::size_t n) {
    const auto a = t.allocate_slots(r, n);
    if (!a) return false;
    before(a->transfers);
    return true;
  }
  std::optional<std::size_t> admit(Request& r, std::size_t budget, std::size_t& want) {
    const TieredCacheHit hit = t.get_computed_blocks(r);
    want = std::min(r.num_tokens() - hit.num_tokens(), budget);
    const auto a = t.allocate_slots(r, want, hit);
    if (!a) return std::nullopt;
    before(a->transfers);
    if (t.has_unfinished_loads(r.id())) before(t.finish_loads(r).transfers);
    gpu_hit_tokens += hit.gpu.num_tokens;  // admitted requests only, as the replay's hit_tokens
    host_hit_tokens += hit.num_host_tokens;
    return hit.num_tokens();
  }
  void preempt(Request& r) { t.preempt(r); }
  void free(Request& r) { t.free(r); }
  double end_step() {
    for (const TransferId id : stores) t.commit(id, true);
    stores.clear();
    const double ms =
        host_gbps > 0 ? static_cast<double>(step_bytes) / (host_gbps * 1e9) * 1e3 : 0.0;
    step_bytes = 0;
    transfer_ms += ms;
    return ms;
  }
};

template <typename Cache>
ReplayResult run_engine(const Trace& trace, const ReplayOptions& o, std::int32_t num_blocks,
                        Cache& m) {
  ReplayResult res;
  res.num_blocks = num_blocks;
  struct Active {
    std::size_t index;
    Request request;
    std::uint32_t decoded = 0;
    double arrival_ms = 0;
    bool first_token = false;
    bool admitted_once = false;
    std::uint32_t passed_over = 0;  // kPrefix: AdmissionScheduler's aging count
    std::size_t scheduled = 0;      // tokens scheduled in the current step
  };
  std::deque<std::unique_ptr<Active>> waiting;
  std::vector<std::unique_ptr<Active>> running;
  std::vector<double> ttft;
  std::vector<double> queue_delay;
  std::vector<TokenId> tokens;
  // --schedule prefix: the admission helper, reading the cache through a read-only probe.
  std::optional<PrefixProbe> probe;
  std::optional<AdmissionScheduler> scheduler;
  std::vector<WaitingRequest> entries;
  std::vector<unsigned char> taken;
  if (o.schedule == Schedule::kPrefix) {
    probe.emplace(m.make_probe());
    AdmissionSchedulerConfig sc;
    sc.policy = SchedulePolicy::kPrefix;
    sc.max_passed_over = o.max_passed_over;
    sc.max_candidates = o.max_candidates;
    scheduler.emplace(*probe, sc);
  }
  std::size_t next_arrival = 0;
  double now = 0;
  const std::size_t n = trace.requests.size();

  for (std::size_t i = 0; i < n; ++i) {
    res.prompt_tokens += trace.requests[i].input_length;
    res.prompt_blocks += cdiv(trace.requests[i].input_length, o.block_size);
  }
  res.requests = n;
  std::size_t finished = 0;
  double window_held = 0, window_without = 0;
  const auto wall = Clock::now();
  while (finished + res.rejected < n) {
    if (running.empty() && waiting.empty() && next_arrival < n) {
      now = std::max(now, trace.requests[next_arrival].timestamp_ms);
    }
    while (next_arrival < n && trace.requests[next_arrival].timestamp_ms <= now) {
      const TraceRequest& tr = trace.requests[next_arrival];
      if (pool_blocks_needed(o, std::uint64_t{tr.input_length} + tr.output_length) >
          static_cast<std::uint64_t>(num_blocks - 1)) {
        ++res.rejected;
      } else {
        const auto ts = Clock::now();
        synthesize_prompt(trace, next_arrival, tokens);
        const auto t0 = Clock::now();
        res.synthesis_seconds += std::chrono::duration<double>(t0 - ts).count();
        auto a = std::make_unique<Active>(
            Active{next_arrival, m.make_request(next_arrival, tokens, keys_of(tr))});
        res.hash_seconds += seconds_since(t0);
        a->arrival_ms = tr.timestamp_ms;
        waiting.push_back(std::move(a));
      }
      ++next_arrival;
    }

    const auto t1 = Clock::now();
    std::size_t budget = o.max_batched_tokens;
    bool preempted = false;
    for (std::size_t i = 0; i < running.size() && budget > 0; ++i) {
      Active& a = *running[i];
      const std::size_t want =
          std::min(a.request.num_tokens() - a.request.num_computed_tokens(), budget);
      while (true) {
        if (m.allocate(a.request, want)) {
          a.scheduled = want;
          budget -= want;
          break;
        }
        // Preempt the lowest-priority (last admitted) request; possibly `a` itself.
        std::unique_ptr<Active> victim = std::move(running.back());
        running.pop_back();
        m.preempt(victim->request);
        victim->scheduled = 0;
        ++res.preemptions;
        preempted = true;
        const bool self = victim.get() == &a;
        waiting.push_front(std::move(victim));
        if (self) break;
      }
    }
    if (!waiting.empty()) ++res.waiting_nonempty_steps;
    auto on_admit = [&](Active& a, std::size_t hit_tokens, std::size_t want) {
      a.request.set_num_computed_tokens(hit_tokens);
      res.queried_tokens += a.request.num_tokens();
      res.hit_tokens += hit_tokens;
      a.scheduled = want;
      budget -= want;
      if (!a.admitted_once) {
        a.admitted_once = true;
        queue_delay.push_back(now - a.arrival_ms);
      }
    };
    if (!scheduler) {  // fcfs: the original engine mode, unchanged
      while (!preempted && budget > 0 && !waiting.empty() && running.size() < o.max_running) {
        Active& a = *waiting.front();
        std::size_t want = 0;
        const std::optional<std::size_t> hit_tokens = m.admit(a.request, budget, want);
        if (!hit_tokens) break;
        on_admit(a, *hit_tokens, want);
        running.push_back(std::move(waiting.front()));
        waiting.pop_front();
      }
    } else if (!preempted && budget > 0 && !waiting.empty() && running.size() < o.max_running) {
      entries.clear();
      for (const auto& a : waiting) entries.push_back({&a->request, a->index, a->passed_over, 0});
      StepResources step;
      step.token_budget = budget;
      // Blocks the running requests still need to finish their prompts are not free to admit.
      std::size_t outstanding = 0;
      for (const auto& r : running) {
        const std::size_t held = m.gpu().block_ids(r->request.id()).size();
        const std::size_t need = cdiv(r->request.num_tokens(), o.block_size);
        outstanding += need > held ? need - held : 0;
      }
      const auto free_now = static_cast<std::size_t>(m.gpu().block_pool().num_free_blocks());
      step.free_blocks = free_now > outstanding ? free_now - outstanding : 0;
      step.max_admissions = o.max_running - running.size();
      const Proposal& p = scheduler->propose(entries, step);
      res.deferred += p.deferred.size();
      // Admitted in the proposal's order; the manager stays the truth: the first allocation that
      // fails ends the step's admissions.
      taken.assign(waiting.size(), 0);
      std::size_t admitted = 0;
      for (const Admission& ad : p.admissions) {
        Active& a = *waiting[ad.index];
        std::size_t want = 0;
        const std::optional<std::size_t> hit_tokens = m.admit(a.request, budget, want);
        if (!hit_tokens) break;
        on_admit(a, *hit_tokens, want);
        taken[ad.index] = 1;
        ++admitted;
        if (budget == 0) break;
      }
      scheduler->record_step(entries, admitted);
      for (std::size_t k = 0; k < admitted; ++k) {  // running in admission order
        running.push_back(std::move(waiting[p.admissions[k].index]));
      }
      std::size_t kept = 0;
      for (std::size_t i = 0; i < waiting.size(); ++i) {
        if (taken[i]) continue;
        waiting[i]->passed_over = entries[i].passed_over;
        res.max_passed_over = std::max(res.max_passed_over, entries[i].passed_over);
        waiting[kept++] = std::move(waiting[i]);
      }
      waiting.resize(kept);
    }
    res.peak_usage = std::max(res.peak_usage, m.gpu().usage());
    res.pool_seconds += seconds_since(t1);
    if (o.sliding_window > 0) {
      // Group 1 is the window group: its rows hold the null block where blocks were released.
      // Pool blocks of every group hold the same bytes (a coarser group's block covers more
      // tokens of fewer layers), so blocks are the unit.
      const AttentionSpec& window = m.gpu().group_spec(1);
      for (const auto& a : running) {
        const std::size_t full_row = m.gpu().block_ids(a->request.id(), 0).size();
        const std::size_t row = m.gpu().block_ids(a->request.id(), 1).size();
        const std::size_t released = std::min<std::size_t>(
            window.num_skipped_tokens(a->request.num_computed_tokens()) / window.block_size, row);
        window_held += full_row + row - released;
        window_without += full_row + row;
      }
    }

    // The step runs: scheduled tokens are computed; a request whose known tokens are all
    // computed samples its next token.
    now += o.step_ms + m.end_step();
    ++res.steps;
    const auto t2 = Clock::now();
    for (std::size_t i = 0; i < running.size();) {
      Active& a = *running[i];
      if (a.scheduled == 0) {
        ++i;
        continue;
      }
      // A decode step computes exactly the one token sampled last; anything else is prefill
      // (including recomputation after a preemption).
      const bool decode = a.decoded > 0 && a.scheduled == 1 &&
                          a.request.num_computed_tokens() + 1 == a.request.num_tokens();
      const bool prefill = !decode;
      (prefill ? res.prefill_tokens_computed : res.decode_tokens) += a.scheduled;
      a.request.set_num_computed_tokens(a.request.num_computed_tokens() + a.scheduled);
      a.scheduled = 0;
      if (a.request.num_computed_tokens() < a.request.num_tokens()) {
        ++i;
        continue;
      }
      if (!a.first_token) {
        a.first_token = true;
        ttft.push_back(now - a.arrival_ms);
      }
      ++a.decoded;
      if (a.decoded >= trace.requests[a.index].output_length) {
        m.free(a.request);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
        ++finished;
        continue;
      }
      // Tokens appended here are hashed as their blocks fill: hashing time.
      const auto th = Clock::now();
      a.request.append_token(output_token(a.index, a.decoded));
      res.hash_seconds += seconds_since(th);
      ++i;
    }
    res.pool_seconds += seconds_since(t2);
  }
  res.sim_makespan_ms = now;
  res.wall_seconds = seconds_since(wall);
  res.evicted_blocks = m.gpu().stats().evictions;
  res.out_of_window_blocks_freed = m.gpu().num_out_of_window_blocks_freed();
  res.window_memory_saved_ratio = window_without > 0 ? 1.0 - window_held / window_without : 0.0;
  if (!ttft.empty()) {
    std::nth_element(ttft.begin(), ttft.begin() + static_cast<std::ptrdiff_t>(ttft.size() / 2),
                     ttft.end());
    res.sim_ttft_p50_ms = ttft[ttft.size() / 2];
    res.sim_ttft_p99_ms = percentile(ttft, 0.99);
  }
  if (!queue_delay.empty()) {
    res.queue_delay_p50_ms = percentile(queue_delay, 0.50);
    res.queue_delay_p99_ms = percentile(queue_delay, 0.99);
  }
  return res;
}

}  // namespace

std::vector<ReplayResult> run_replay(const Trace& trace, const ReplayOptions& options) {
  if (options.num_blocks.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "replay: no --num-blocks given");
  }
  if (options.block_size == 0)
    throw Error(ErrorCode::kInvalidArgument, "--block-size must be >= 1");
  if (options.mode == Mode::kSequential) return run_sequential(trace, options);
  std::vector<ReplayResult> out;
  for (const std::int32_t n : options.num_blocks) {
    PlainCache cache(manager_config(options, n));
    out.push_back(run_engine(trace, options, n, cache));
  }
  return out;
}

std::string to_json(const ReplayResult& r, const ReplayOptions& o, const Trace& trace) {
  std::string buf;
  buf = format(
      "{\"trace\":%s,\"mode\":\"%s\",\"hash\":\"%s\",\"block_size\":%u,\"caching\":%s,"
      "\"num_blocks\":%d,\"requests\":%llu,\"rejected\":%llu,\"prompt_tokens\":%llu,"
      "\"queried_tokens\":%llu,\"hit_tokens\":%llu,\"hit_rate\":%.6f,"
      "\"prefill_tokens_computed\":%llu,\"prefill_saved_ratio\":%.6f,\"evicted_blocks\":%llu,"
      "\"peak_usage\":%.6f,\"prompt_blocks\":%llu,\"hash_seconds\":%.6f,\"pool_seconds\":%.6f,"
      "\"parse_seconds\":%.6f,\"synthesis_seconds\":%.6f,\"hash_cpu_seconds\":%.6f,"
      "\"pool_cpu_seconds\":%.6f,"
      "\"blocks_per_second\":%.0f,\"requests_per_second\":%.0f,\"wall_seconds\":%.6f,"
      "\"threads\":%u,\"preemptions\":%llu,"
      "\"steps\":%llu,\"decode_tokens\":%llu,\"step_ms\":%.3f,\"sim_makespan_ms\":%.1f,"
      "\"sim_ttft_p50_ms\":%.1f,"
      "\"sliding_window\":%u,\"out_of_window_blocks_freed\":%llu,"
      "\"window_memory_saved_ratio\":%.6f,\"skipped_lines\":%llu}",
      json_string(trace.name).c_str(), o.mode == Mode::kSequential ? "sequential" : "engine",
      std::string(to_string(o.hash)).c_str(), o.block_size, o.caching ? "true" : "false",
      r.num_blocks, (unsigned long long)r.requests, (unsigned long long)r.rejected,
      (unsigned long long)r.prompt_tokens, (unsigned long long)r.queried_tokens,
      (unsigned long long)r.hit_tokens, r.hit_rate(), (unsigned long long)r.prefill_tokens_computed,
      r.prefill_saved_ratio(), (unsigned long long)r.evicted_blocks, r.peak_usage,
      (unsigned long long)r.prompt_blocks, r.hash_seconds, r.pool_seconds, trace.load_seconds,
      r.synthesis_seconds, r.hash_cpu_seconds, r.pool_cpu_seconds, r.blocks_per_second(),
      r.wall_seconds > 0 ? double(r.requests) / r.wall_seconds : 0.0, r.wall_seconds,
      o.mode == Mode::kSequential ? o.threads : 1u, (unsigned long long)r.preemptions,
      (unsigned long long)r.steps, (unsigned long long)r.decode_tokens,
      o.mode == Mode::kEngine ? o.step_ms : 0.0, r.sim_makespan_ms, r.sim_ttft_p50_ms,
      o.sliding_window, (unsigned long long)r.out_of_window_blocks_freed,
      r.window_memory_saved_ratio, (unsigned long long)trace.skipped_lines);
  std::string out = buf;
  if (o.mode == Mode::kEngine) {
    // Admission (--schedule) and the simulated queue: appended, the fields above unchanged.
    out.pop_back();  // the closing brace
    buf = format(
        ",\"schedule\":\"%s\",\"max_passed_over_bound\":%u,\"sim_ttft_p99_ms\":%.1f,"
        "\"queue_delay_p50_ms\":%.1f,\"queue_delay_p99_ms\":%.1f,"
        "\"waiting_nonempty_steps\":%llu,\"waiting_nonempty_ratio\":%.6f,"
        "\"deferred\":%llu,\"max_passed_over\":%u,\"arrival_span_ms\":%.1f}",
        o.schedule == Schedule::kFcfs ? "fcfs" : "prefix", o.max_passed_over, r.sim_ttft_p99_ms,
        r.queue_delay_p50_ms, r.queue_delay_p99_ms, (unsigned long long)r.waiting_nonempty_steps,
        r.steps ? double(r.waiting_nonempty_steps) / double(r.steps) : 0.0,
        (unsigned long long)r.deferred, r.max_passed_over,
        trace.requests.empty()
            ? 0.0
            : trace.requests.back().timestamp_ms - trace.requests.front().timestamp_ms);
    out += buf;
  }
  // The eviction policy (--eviction): appended, the fields above unchanged.
  out.pop_back();
  out += ",\"eviction\":\"" + eviction_name(o) + "\"";
  if (o.eviction != Eviction::kLru) {
    buf = format(
        ",\"sim_lru_hit_tokens\":%llu,\"sim_lru_hit_rate\":%.6f,"
        "\"sim_lru_evicted_blocks\":%llu",
        (unsigned long long)r.sim_lru_hit_tokens,
        r.queried_tokens ? double(r.sim_lru_hit_tokens) / double(r.queried_tokens) : 0.0,
        (unsigned long long)r.sim_lru_evicted_blocks);
    out += buf;
  }
  // --adaptive-ghost-sample-shift (only when given: the fields above unchanged).
  if (o.adaptive_ghost_sample_shift != -1) {
    out += ",\"adaptive_ghost_sample_shift\":" + std::to_string(o.adaptive_ghost_sample_shift);
  }
  // --window-block-size (only when given: the fields above unchanged).
  if (o.window_block_size != 0) {
    out += ",\"window_block_size\":" + std::to_string(o.window_block_size);
  }
  out += "}";
  return out;
}

PagedReservation measure_paged_reservation(const Trace& trace, std::uint32_t block_size) {
  if (block_size == 0) throw Error(ErrorCode::kInvalidArgument, "--block-size must be >= 1");
  std::uint64_t max_blocks = 1;
  for (const TraceRequest& r : trace.requests) {
    max_blocks =
        std::max(max_blocks, cdiv(std::uint64_t{r.input_length} + r.output_length, block_size));
  }
  if (max_blocks + 1 > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
    throw Error(ErrorCode::kOutOfRange, "memory table: a request needs too many blocks");
  }
  KVCacheManagerConfig c;
  c.num_blocks = static_cast<std::int32_t>(max_blocks + 1);
  c.block_size = block_size;
  c.enable_caching = false;  // reservation only; token values do not matter
  c.hash_scheme = HashScheme::kXxh3_128;
  c.hash_seed = "pagedkv-replay";
  KVCacheManager m(c);
  PagedReservation out;
  std::vector<TokenId> prompt;
  for (std::size_t i = 0; i < trace.requests.size(); ++i) {
    const TraceRequest& tr = trace.requests[i];
    prompt.assign(tr.input_length, 0);
    Request r = m.make_request(i, prompt);
    std::size_t to_compute = r.num_tokens();  // the prompt, then one sampled token at a time
    for (std::uint32_t k = 0; k <= tr.output_length; ++k) {
      if (k > 0) {
        r.append_token(0);
        to_compute = 1;
      }
      if (to_compute == 0) continue;  // an empty prompt: nothing to allocate yet
      if (!m.allocate_slots(r, to_compute)) {
        throw Error(ErrorCode::kInvalidState,
                    "memory table: request " + std::to_string(i) + " did not fit an idle pool");
      }
      r.set_num_computed_tokens(r.num_tokens());
    }
    out.used += r.num_tokens();
    if (r.num_tokens() > 0) {
      out.reserved += std::uint64_t{m.block_ids(r.id()).size()} * block_size;
      m.free(r);
    }
  }
  return out;
}

std::string memory_utilization_table(const Trace& trace, std::uint32_t block_size) {
  struct Policy {
    const char* name;
    std::uint64_t reserved = 0, used = 0, too_long = 0;
  };
  Policy paged{"paged (pagedkv, measured)"}, max2k{"contiguous, max 2048 (arith.)"},
      max4k{"contiguous, max 4096 (arith.)"}, pow2{"contiguous, power of 2 (arith.)"},
      oracle{"contiguous, oracle (arith.)"};
  paged.name = block_size == 16 ? "paged, block 16 (measured)" : "paged (pagedkv, measured)";
  const PagedReservation measured = measure_paged_reservation(trace, block_size);
  paged.used = measured.used;
  paged.reserved = measured.reserved;
  for (const TraceRequest& r : trace.requests) {
    const std::uint64_t len = std::uint64_t{r.input_length} + r.output_length;
    for (Policy* p : {&max2k, &max4k}) {
      const std::uint64_t cap = p == &max2k ? 2048 : 4096;
      if (len > cap) {
        ++p->too_long;  // would not fit the reservation: excluded
        continue;
      }
      p->used += len;
      p->reserved += cap;
    }
    std::uint64_t p2 = 1;
    while (p2 < len) p2 <<= 1;
    pow2.used += len;
    pow2.reserved += p2;
    oracle.used += len;
    oracle.reserved += len;
  }
  std::ostringstream out;
  out << "KV memory holding real token states (" << trace.requests.size()
      << " requests, prompt + output lengths)\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-32s %10s %14s\n", "policy", "utilized",
                "excluded (too long)");
  out << line;
  for (const Policy* p : {&paged, &max2k, &max4k, &pow2, &oracle}) {
    std::snprintf(line, sizeof line, "%-32s %9.1f%% %14llu\n", p->name,
                  p->reserved ? 100.0 * double(p->used) / double(p->reserved) : 0.0,
                  (unsigned long long)p->too_long);
    out << line;
  }
  out << "PagedAttention (SOSP'23): prior systems 20.4%-38.2%; paged allocation >= 96%.\n"
         "measured: KVCacheManager run on every request (prompt, then one decode token at a\n"
         "time), blocks held at its end. arith.: computed from the lengths; internal\n"
         "fragmentation and over-reservation only (external fragmentation of contiguous\n"
         "allocators is not modelled), so the contiguous figures are upper bounds.\n";
  return out.str();
}

std::vector<TierReplayResult> run_tier_replay(const Trace& trace, const ReplayOptions& o,
                                              const TierReplayOptions& tier) {
  if (!o.caching) throw Error(ErrorCode::kInvalidArgument, "--host-blocks: caching on");
  const std::uint64_t groups = o.sliding_window > 0 ? 2 : 1;  // each group holds its own blocks
  if (o.num_blocks.empty()) throw Error(ErrorCode::kInvalidArgument, "replay: no --num-blocks");
  std::vector<TierReplayResult> out;
  for (const std::int32_t n : o.num_blocks) {
    for (const std::int32_t m : tier.host_blocks) {
      HostTierConfig h;
      h.num_host_blocks = m;
      h.policy = tier.policy;
      h.selective_hits = tier.selective_hits;
      h.bytes_per_block = tier.kv_bytes_per_token * o.block_size;
      if (groups == 2) {
        // A hybrid model's layers split evenly between the two groups: a block of either group
        // holds half the bytes of its tokens' K/V.
        h.group_bytes_per_block = {h.bytes_per_block / 2,
                                   tier.kv_bytes_per_token * window_block_size(o) / 2};
        h.window_store = tier.window_store;
      }
      if (o.mode == Mode::kEngine) {
        TierCache cache(manager_config(o, n), h, tier.host_gbps);
        TierReplayResult res;
        res.base = run_engine(trace, o, n, cache);
        res.host_blocks = m;
        const TierStats s = cache.t.stats();
        res.gpu_hit_tokens = cache.gpu_hit_tokens;
        res.host_hit_tokens = cache.host_hit_tokens;
        res.host_loaded_blocks = s.loaded_blocks;
        res.host_stored_blocks = s.stored_blocks;
        res.host_stores_skipped_full = s.stores_skipped_full;
        res.host_evictions = s.host_evictions;
        res.loaded_bytes = s.loaded_bytes;
        res.stored_bytes = s.stored_bytes;
        res.sim_transfer_ms = cache.transfer_ms;
        if (groups > 1) {
          res.groups = cache.t.group_stats();
          res.window_stores_skipped = s.window_stores_skipped;
          res.base.out_of_window_blocks_freed = cache.gpu().num_out_of_window_blocks_freed();
        }
        out.push_back(res);
        continue;
      }
      TieredKVCacheManager t(manager_config(o, n), h);
      TierReplayResult res;
      res.base.num_blocks = n;
      res.host_blocks = m;
      const auto wall = Clock::now();
      HashingPipeline pipeline(trace, t.gpu().hasher(), o.block_size, o.threads > 1);
      for (std::size_t i = 0; i < trace.requests.size(); ++i) {
        Request r = pipeline.next();
        const std::uint64_t num_tokens = r.num_tokens();
        ++res.base.requests;
        res.base.prompt_tokens += num_tokens;
        res.base.prompt_blocks += cdiv(num_tokens, o.block_size);
        if (pool_blocks_needed(o, num_tokens) > static_cast<std::uint64_t>(n - 1)) {
          ++res.base.rejected;
          continue;
        }
        const auto t1 = Clock::now();
        const TieredCacheHit hit = t.get_computed_blocks(r);
        auto alloc = t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
        if (!alloc) {
          throw Error(ErrorCode::kInvalidState,
                      "replay: request " + std::to_string(i) + " did not fit an idle pool");
        }
        // The engine's copies, all done: evictions and loads before the forward pass, then
        // the stores after it.
        for (const TransferId id : alloc->transfers.eviction_ids) t.commit(id, true);
        for (const TransferId id : alloc->transfers.load_ids) t.commit(id, true);
        if (t.has_unfinished_loads(r.id())) {
          const LoadResult lr = t.finish_loads(r);
          for (const TransferId id : lr.transfers.store_ids) t.commit(id, true);
        }
        for (const TransferId id : alloc->transfers.store_ids) t.commit(id, true);
        res.base.peak_usage = std::max(res.base.peak_usage, t.gpu().usage());
        t.free(r);
        res.base.pool_seconds += seconds_since(t1);
        res.base.queried_tokens += num_tokens;
        res.base.hit_tokens += hit.num_tokens();
        res.gpu_hit_tokens += hit.gpu.num_tokens;
        res.host_hit_tokens += hit.num_host_tokens;
        res.base.prefill_tokens_computed += num_tokens - hit.num_tokens();
      }
      res.base.hash_seconds = pipeline.hash_seconds();
      res.base.synthesis_seconds = pipeline.synthesis_seconds();
      res.base.wall_seconds = seconds_since(wall);
      res.base.evicted_blocks = t.gpu().stats().evictions;
      const TierStats s = t.stats();
      res.host_loaded_blocks = s.loaded_blocks;
      res.host_stored_blocks = s.stored_blocks;
      res.host_stores_skipped_full = s.stores_skipped_full;
      res.host_evictions = s.host_evictions;
      res.loaded_bytes = s.loaded_bytes;
      res.stored_bytes = s.stored_bytes;
      if (groups > 1) {
        res.groups = t.group_stats();
        res.window_stores_skipped = s.window_stores_skipped;
        res.base.out_of_window_blocks_freed = t.gpu().num_out_of_window_blocks_freed();
      }
      out.push_back(res);
    }
  }
  return out;
}

std::string to_json(const TierReplayResult& r, const ReplayOptions& o,
                    const TierReplayOptions& tier, const Trace& trace) {
  std::string base = to_json(r.base, o, trace);
  base.pop_back();  // the closing brace
  std::string buf;
  buf = format(
      ",\"host_blocks\":%d,\"host_policy\":\"%s\",\"gpu_hit_tokens\":%llu,"
      "\"host_hit_tokens\":%llu,\"host_loaded_blocks\":%llu,"
      "\"host_stored_blocks\":%llu,\"host_stores_skipped_full\":%llu,"
      "\"host_evictions\":%llu,\"kv_bytes_per_token\":%llu,\"loaded_bytes\":%llu,"
      "\"stored_bytes\":%llu",
      r.host_blocks, std::string(to_string(tier.policy)).c_str(),
      (unsigned long long)r.gpu_hit_tokens, (unsigned long long)r.host_hit_tokens,
      (unsigned long long)r.host_loaded_blocks, (unsigned long long)r.host_stored_blocks,
      (unsigned long long)r.host_stores_skipped_full, (unsigned long long)r.host_evictions,
      (unsigned long long)tier.kv_bytes_per_token, (unsigned long long)r.loaded_bytes,
      (unsigned long long)r.stored_bytes);
  base += buf;
  if (!r.groups.empty()) {
    // Per KV-cache group (0: full attention, 1: the sliding window), each block half a token's
    // K/V bytes (the layers split evenly).
    const auto list = [&r](auto field) {
      std::string s = "[";
      for (std::size_t g = 0; g < r.groups.size(); ++g) {
        s += (g ? "," : "") + std::to_string(field(r.groups[g]));
      }
      return s + "]";
    };
    base += ",\"window_store\":\"";
    base += tier.window_store == WindowStoreRule::kAll ? "all" : "tail";
    base += "\",\"group_loaded_blocks\":" +
            list([](const TierGroupStats& g) { return g.loaded_blocks; });
    base +=
        ",\"group_loaded_bytes\":" + list([](const TierGroupStats& g) { return g.loaded_bytes; });
    base +=
        ",\"group_stored_blocks\":" + list([](const TierGroupStats& g) { return g.stored_blocks; });
    base +=
        ",\"group_stored_bytes\":" + list([](const TierGroupStats& g) { return g.stored_bytes; });
    base += ",\"window_stores_skipped\":" + std::to_string(r.window_stores_skipped);
  }
  if (o.mode == Mode::kEngine) {
    // Simulated: the step's copies at --host-gbps, added to its --step-ms (sim_makespan_ms and
    // sim_ttft_p50_ms include them).
    buf = format(",\"sim_host_gbps\":%.3f,\"sim_transfer_ms\":%.1f", tier.host_gbps,
                 r.sim_transfer_ms);
    base += buf;
  }
  return base + "}";
}

std::vector<Request> hash_prompts(const Trace& trace, const KVCacheManagerConfig& config,
                                  std::uint64_t max_blocks, std::uint64_t& blocks) {
  KVCacheManager hasher(config);
  const std::uint64_t bs = hasher.block_size();
  std::vector<Request> requests;
  std::vector<TokenId> tokens;
  blocks = 0;
  for (std::size_t i = 0; i < trace.requests.size(); ++i) {
    synthesize_prompt(trace, i, tokens);
    const std::uint64_t need = (tokens.size() + bs - 1) / bs;
    if (need == 0 || (max_blocks > 0 && need > max_blocks)) continue;
    requests.push_back(hasher.make_request(i, tokens));
    blocks += need;
  }
  return requests;
}

}  // namespace pagedkv::replay
