#include "engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

#include "backend.hpp"
#include "calibrate.hpp"
#include "pagedkv/device/fp8.hpp"
#if TINY_ENGINE_HAS_EVENTS
#include "pagedkv/events/publisher.hpp"
#endif
#include "pagedkv/device/block_table.hpp"

namespace tiny_engine {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

void EngineConfig::validate() const {
  auto require = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("engine config: ") + what);
  };
  require(num_blocks >= 2, "num_blocks must be at least 2 (block 0 is the null block)");
  require(block_size > 0 && block_size <= pagedkv::KVLayout::kMaxBlockSize,
          "block_size must be in 1..256");
  require(max_num_batched_tokens > 0, "the token budget must be positive");
  require(max_num_seqs > 0, "max_num_seqs must be positive");
  require(num_host_blocks >= 0, "num_host_blocks must not be negative");
  require(num_host_blocks == 0 || device == Device::kCpu,
          "the host tier runs on the CPU path only");
  require(remote_url.empty() || num_host_blocks > 0, "the remote tier needs a host tier");
  require(kv_scale_mode == pagedkv::KVScaleMode::kPerTokenHead ||
              kv_scale_mode == pagedkv::KVScaleMode::kPerTensor,
          "kv_scale_mode must be per_token_head or per_tensor");
  require(k_scales.size() == v_scales.size(), "k_scales and v_scales must have the same size");
  for (const float s : k_scales) {
    require(pagedkv::fp8_scale_is_valid(s), "k_scales must be finite and > 0");
  }
  for (const float s : v_scales) {
    require(pagedkv::fp8_scale_is_valid(s), "v_scales must be finite and > 0");
  }
  require((decode_kernel >= -1 && decode_kernel <= 3) || decode_kernel == 5,
          "decode_kernel must be -1 (default), 0 (simt), 1 (tensor_core), 2 "
          "(tensor_core_wide_merge), 3 (tensor_core_fp8) or 5 (tensor_core_fp8_direct)");
  require(extend_kernel >= -1 && extend_kernel <= 8,
          "extend_kernel must be -1 (default), 0 (mma16), 1 (fa2), 2 (wgmma), 3 "
          "(wgmma_pipelined), 4 (wgmma_ws), 5 (wgmma_ws_pingpong), 6 (fa2_fp8), 7 "
          "(wgmma_ws_persistent) or 8 (fa2_lean)");
}

// A request in flight: pagedkv's view (tokens, hashes, computed tokens) plus the engine's.
struct Engine::Active {
  Active(pagedkv::Request r, std::uint32_t session_index, std::uint32_t turn_index,
         std::uint32_t max_new, double arrival)
      : request(std::move(r)), max_new_tokens(max_new), arrival_seconds(arrival) {
    result.id = request.id();
    result.session = session_index;
    result.turn = turn_index;
    result.prompt_tokens = request.num_prompt_tokens();
  }

  pagedkv::Request request;
  std::uint32_t max_new_tokens;
  double arrival_seconds;
  bool in_prefill = true;  // until the prompt (or, after preemption, the context) is computed
  RequestResult result;
};

std::string to_string(Device device) {
  return device == Device::kCuda ? "cuda" : "cpu";
}

Engine::Engine(const Model& model, const EngineConfig& config)
    : model_(model), config_(config), batch_(std::make_unique<ForwardBatch>()) {
  config_.validate();
  const ModelConfig& m = model_.config();
  cache_.dtype = config_.kv_dtype;
  const bool fp8 = pagedkv::is_fp8(config_.kv_dtype);
  cache_.scale_mode = fp8 ? config_.kv_scale_mode : pagedkv::KVScaleMode::kNone;
  if (cache_.scale_mode == pagedkv::KVScaleMode::kPerTensor) {
    // The engine's per-layer scales: given, or from a calibration pass (calibrate.hpp). The CUDA
    // backend reads them from config_.
    if (config_.k_scales.empty()) {
      KVScales s = calibrate_kv_scales(model_, config_.kv_dtype == pagedkv::KVDtype::kFp8E5M2
                                                   ? pagedkv::Fp8Format::kE5M2
                                                   : pagedkv::Fp8Format::kE4M3);
      config_.k_scales = std::move(s.k);
      config_.v_scales = std::move(s.v);
    }
    if (config_.k_scales.size() != static_cast<std::size_t>(m.num_layers)) {
      throw std::invalid_argument("engine config: k_scales / v_scales need one scale per layer");
    }
    cache_.k_scales = config_.k_scales;
    cache_.v_scales = config_.v_scales;
  }
  // FP8 KV (issue 36): 1-byte codes, with per-tensor scales (the engine's, above) or with
  // per-(token, KV head) scales after each block's codes.
  cache_.layout = cache_.scale_mode == pagedkv::KVScaleMode::kPerTokenHead
                      ? pagedkv::KVLayout::nhd_scaled(config_.num_blocks,
                                                      static_cast<std::int32_t>(config_.block_size),
                                                      m.num_kv_heads, m.head_dim)
                      : pagedkv::KVLayout::nhd(config_.num_blocks,
                                               static_cast<std::int32_t>(config_.block_size),
                                               m.num_kv_heads, m.head_dim);
  cache_.layout.validate();
  if (config_.device == Device::kCuda) {
    backend_ = make_cuda_backend(model_, config_);
    return;
  }
  // Planes in 16-bit storage units (an FP8 plane's bytes are a multiple of 16).
  const auto plane = static_cast<std::size_t>(cache_.layout.plane_elements()) *
                     pagedkv::bytes_per_value(cache_.dtype) / sizeof(std::uint16_t);
  cache_.storage.assign(2 * static_cast<std::size_t>(m.num_layers) * plane, 0);
  for (std::size_t l = 0; l < static_cast<std::size_t>(m.num_layers); ++l) {
    cache_.k.emplace_back(cache_.storage.data() + 2 * l * plane, plane);
    cache_.v.emplace_back(cache_.storage.data() + (2 * l + 1) * plane, plane);
  }
  backend_ = make_cpu_backend(model_, config_, cache_);
}

Engine::~Engine() = default;

void Engine::force_tokens(const RunResult& reference) {
  forced_.clear();
  for (const RequestResult& r : reference.requests) forced_[r.id] = r.output;
}

void Engine::forward(std::span<const Segment> segments, Kind kind) {
  const auto block_size = static_cast<std::int32_t>(config_.block_size);
  ForwardBatch& b = *batch_;
  b.decode = kind == Kind::kDecode;
  b.tokens.clear();
  b.positions.clear();
  b.slots.clear();
  b.seq_lens.clear();
  b.q_indptr.assign(1, 0);
  b.max_q_len = 0;
  b.sample_rows.clear();
  std::vector<std::vector<std::int32_t>> table_rows;
  for (const Segment& s : segments) {
    const std::span<const pagedkv::BlockId> ids = manager_->block_ids(s.request->request.id());
    pagedkv::append_slot_mapping(b.slots, ids, block_size, s.first, s.count);
    table_rows.emplace_back(ids.begin(), ids.end());
    b.seq_lens.push_back(static_cast<std::int32_t>(s.first + s.count));  // new tokens included
    b.q_indptr.push_back(b.q_indptr.back() + static_cast<std::int32_t>(s.count));
    b.max_q_len = std::max(b.max_q_len, static_cast<std::int32_t>(s.count));
    const auto tokens = s.request->request.tokens();
    for (std::int64_t i = 0; i < s.count; ++i) {
      const std::int64_t pos = s.first + i;
      b.positions.push_back(pos);
      b.tokens.push_back(tokens[static_cast<std::size_t>(pos)]);
    }
    if (s.sample) b.sample_rows.push_back(b.tokens.size() - 1);
  }
  if (b.tokens.empty()) return;
  b.table = pagedkv::make_block_table(table_rows);
  backend_->forward(b, logits_);

  // Greedy sampling (first maximum on ties) of each sampling segment's last token.
  const auto vocab = static_cast<std::size_t>(model_.config().vocab_size);
  std::size_t sampled = 0;
  for (const Segment& s : segments) {
    if (!s.sample) continue;
    const auto first = logits_.begin() + static_cast<std::ptrdiff_t>(sampled * vocab);
    const auto last = first + static_cast<std::ptrdiff_t>(vocab);
    const auto best = std::max_element(first, last) - first;
    RequestResult& result = s.request->result;
    result.logits.insert(result.logits.end(), first, last);
    auto token = static_cast<pagedkv::TokenId>(best);
    if (const auto it = forced_.find(result.id);
        it != forced_.end() && result.output.size() < it->second.size()) {
      token = it->second[result.output.size()];
    }
    result.output.push_back(token);
    ++sampled;
  }
}

RunResult Engine::run(const Workload& workload) {
  pagedkv::KVCacheManagerConfig mc;
  mc.num_blocks = config_.num_blocks;
  mc.block_size = config_.block_size;
  mc.enable_caching = config_.enable_caching;
  mc.hash_seed = "pagedkv-tiny-engine";
  mc.hash_scheme = config_.hash_scheme;
  mc.enable_kv_events = !config_.kv_events_endpoint.empty();
  if (hit_hook_ && config_.device != Device::kCpu) {
    throw std::logic_error("the prefix-hit hook works on the CPU path only");
  }
  KVDriver manager(mc, config_.enable_caching ? config_.num_host_blocks : 0, config_.host_policy,
                   cache_, host_load_hook_);
  manager_ = &manager.gpu();
  std::unique_ptr<RemoteLink> remote;  // declared after `manager`: destroyed (drained) first
  if (!config_.remote_url.empty() && config_.enable_caching) {
    remote = RemoteLink::open(config_, model_.config(), manager);
  }
#if TINY_ENGINE_HAS_EVENTS
  std::unique_ptr<pagedkv::events::KVEventPublisher> publisher;
  if (!config_.kv_events_endpoint.empty()) {
    pagedkv::events::KVEventPublisherConfig pc;
    pc.endpoint = config_.kv_events_endpoint;
    pc.probe_hasher = manager.gpu().hasher();
    publisher = std::make_unique<pagedkv::events::KVEventPublisher>(pc);
  }
  const auto publish = [&](RunStats& st) {
    if (!publisher) return;
    std::vector<pagedkv::KVEvent> events = manager.take_events();
    if (!events.empty() && publisher->publish(std::move(events))) ++st.kv_event_batches;
  };
#else
  if (!config_.kv_events_endpoint.empty()) {
    throw std::invalid_argument("--kv-events: this build has no pagedkv::events layer");
  }
  const auto publish = [](RunStats&) {};
#endif
  backend_->reset_cache();
  for (const Session& s : workload.sessions) {
    for (const Turn& t : s.turns) {
      for (const pagedkv::TokenId tok : t.message) {
        if (tok < 0 || tok >= model_.config().vocab_size)
          throw std::invalid_argument("workload token outside the model's vocabulary");
      }
    }
  }

  // Request ids number the sessions' turns in workload order.
  std::vector<pagedkv::RequestId> first_id;
  pagedkv::RequestId next = 0;
  for (const Session& s : workload.sessions) {
    first_id.push_back(next);
    next += s.turns.size();
  }
  // Sessions join in arrival order (stable for equal steps).
  std::vector<std::uint32_t> arrival_order(workload.sessions.size());
  for (std::uint32_t i = 0; i < arrival_order.size(); ++i) arrival_order[i] = i;
  std::stable_sort(arrival_order.begin(), arrival_order.end(), [&](auto a, auto b) {
    return workload.sessions[a].arrival_step < workload.sessions[b].arrival_step;
  });

  RunResult out;
  RunStats& stats = out.stats;
  std::vector<std::unique_ptr<Active>> live;
  std::deque<Active*> waiting;
  std::vector<Active*> running;
  const Clock::time_point start = Clock::now();

  auto arrive = [&](std::uint32_t session, std::uint32_t turn,
                    std::vector<pagedkv::TokenId> context) {
    const Turn& t = workload.sessions[session].turns[turn];
    context.insert(context.end(), t.message.begin(), t.message.end());
    live.push_back(std::make_unique<Active>(manager.make_request(first_id[session] + turn, context),
                                            session, turn, t.max_new_tokens, seconds_since(start)));
    waiting.push_back(live.back().get());
    if (remote) remote->add_request(live.back()->request);  // its remote prefix is probed
  };

  const std::size_t total = workload.num_requests();
  std::size_t next_session = 0;
  std::uint64_t step = 0;
  std::vector<Segment> decode, prefill;
  while (out.requests.size() < total) {
    while (next_session < arrival_order.size() &&
           workload.sessions[arrival_order[next_session]].arrival_step <= step) {
      arrive(arrival_order[next_session++], 0, workload.shared_prefix);
    }
    if (waiting.empty() && running.empty()) {  // idle: jump to the next arrival
      step = workload.sessions[arrival_order[next_session]].arrival_step;
      continue;
    }
    if (remote) remote->poll();
    decode.clear();
    prefill.clear();
    bool held = false;  // the head of the queue waits for its remote prefix
    std::uint32_t budget = config_.max_num_batched_tokens;
    bool preempted = false;

    // 1. Running requests, oldest first; preempt from the newest end when the pool is full.
    for (std::size_t i = 0; i < running.size() && budget > 0; ++i) {
      Active* a = running[i];
      const std::size_t remaining = a->request.num_tokens() - a->request.num_computed_tokens();
      const std::size_t n = std::min<std::size_t>(remaining, budget);
      bool scheduled = false;
      while (true) {
        if (manager.allocate_slots(a->request, n)) {
          scheduled = true;
          break;
        }
        Active* victim = running.back();
        running.pop_back();
        manager.preempt(victim->request);
        victim->in_prefill = true;
        ++victim->result.preemptions;
        ++stats.preemptions;
        waiting.push_front(victim);
        preempted = true;
        if (victim == a) break;
      }
      if (!scheduled) break;
      const Segment seg{a, static_cast<std::int64_t>(a->request.num_computed_tokens()),
                        static_cast<std::int64_t>(n),
                        a->request.num_computed_tokens() + n == a->request.num_tokens()};
      (a->in_prefill ? prefill : decode).push_back(seg);
      budget -= static_cast<std::uint32_t>(n);
    }

    // 2. Waiting requests, first come first served, unless this step had to preempt.
    while (!preempted && !waiting.empty() && budget > 0 && running.size() < config_.max_num_seqs) {
      Active* a = waiting.front();
      if (remote && !remote->ready(a->request.id())) {
        held = true;
        break;
      }
      const std::optional<Admission> admitted = manager.admit(a->request, budget);
      if (!admitted) {
        if (running.empty()) {
          throw std::runtime_error("request " + std::to_string(a->request.id()) + " (" +
                                   std::to_string(a->request.num_tokens()) +
                                   " tokens) does not fit in a pool of " +
                                   std::to_string(config_.num_blocks) + " blocks of " +
                                   std::to_string(config_.block_size) + " tokens even alone");
        }
        break;
      }
      const pagedkv::CacheHit& hit = admitted->gpu_hit;
      const std::size_t hit_tokens = admitted->hit_tokens;
      const std::size_t n = admitted->new_tokens;
      a->result.hit_tokens += hit_tokens;
      stats.hit_tokens += hit_tokens;
      stats.host_hit_tokens += admitted->host_tokens;
      if (!hit.blocks.empty() && hit_hook_) hit_hook_(hit, cache_);
      if (remote) remote->remove_request(a->request.id());
      waiting.pop_front();
      running.push_back(a);
      prefill.push_back(Segment{a, static_cast<std::int64_t>(hit_tokens),
                                static_cast<std::int64_t>(n),
                                hit_tokens + n == a->request.num_tokens()});
      budget -= static_cast<std::uint32_t>(n);
    }
    stats.max_running = std::max<std::uint64_t>(stats.max_running, running.size());
    if (decode.empty() && prefill.empty() && held) {  // bounded by RemoteLink::kTimeout
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    if (decode.empty() && prefill.empty()) {
      if (!preempted) throw std::logic_error("scheduler made no progress");
      ++step;
      continue;
    }

    // 3. The model: decodes first (a prefill of this step may hit a block a decode completes).
    Clock::time_point t0 = Clock::now();
    forward(decode, Kind::kDecode);
    stats.decode_seconds += seconds_since(t0);
    t0 = Clock::now();
    forward(prefill, Kind::kPrefill);
    stats.prefill_seconds += seconds_since(t0);
    manager.after_forward();  // the host tier's stores of blocks this step wrote
    const double now = seconds_since(start);

    // 4. Book-keeping: computed tokens, sampled tokens, finished requests, next turns.
    for (const auto* segs : {&decode, &prefill}) {
      for (const Segment& s : *segs) {
        Active* a = s.request;
        (segs == &decode ? stats.decode_tokens : stats.prefill_tokens) +=
            static_cast<std::uint64_t>(s.count);
        a->request.set_num_computed_tokens(static_cast<std::size_t>(s.first + s.count));
        if (!s.sample) continue;
        a->in_prefill = false;
        RequestResult& r = a->result;
        if (r.output.size() == 1) r.ttft_seconds = now - a->arrival_seconds;
        a->request.append_token(r.output.back());
        if (r.output.size() < a->max_new_tokens) continue;
        r.latency_seconds = now - a->arrival_seconds;
        manager.free(a->request);
        running.erase(std::find(running.begin(), running.end(), a));
        const std::uint32_t session = r.session;
        const std::uint32_t turn = r.turn + 1;
        const auto context = a->request.tokens();
        out.requests.push_back(std::move(r));
        if (turn < workload.sessions[session].turns.size()) {
          arrive(session, turn, std::vector<pagedkv::TokenId>(context.begin(), context.end()));
        }
      }
    }
    publish(stats);  // this step's KV events, one batch
    ++stats.steps;
    ++step;
  }
  if (remote) stats.remote = remote->finish();  // waits for the puts in flight
  publish(stats);
#if TINY_ENGINE_HAS_EVENTS
  if (publisher) publisher->flush(std::chrono::seconds(5));
#endif
  stats.total_seconds = seconds_since(start);
  stats.cache = manager.gpu().stats();
  stats.host = manager.tier_stats();
  manager.check_invariants();
  manager_ = nullptr;
  std::sort(out.requests.begin(), out.requests.end(),
            [](const RequestResult& a, const RequestResult& b) { return a.id < b.id; });
  return out;
}

Comparison compare(const RunResult& on, const RunResult& off) {
  Comparison c;
  c.identical_tokens = on.requests.size() == off.requests.size();
  c.bitwise_identical_logits = c.identical_tokens;
  if (!c.identical_tokens) c.first_difference = "different numbers of finished requests";
  for (std::size_t i = 0; i < std::min(on.requests.size(), off.requests.size()); ++i) {
    const RequestResult& a = on.requests[i];
    const RequestResult& b = off.requests[i];
    if (a.id != b.id || a.output != b.output) {
      if (c.first_difference.empty())
        c.first_difference = "request " + std::to_string(a.id) + ": token streams differ";
      c.identical_tokens = false;
    }
    if (a.logits.size() != b.logits.size()) {
      c.bitwise_identical_logits = false;
      c.max_rel_logit_diff = std::numeric_limits<double>::infinity();
      continue;
    }
    const std::size_t vocab = a.output.empty() ? 0 : a.logits.size() / a.output.size();
    for (std::size_t t = 0; t < a.output.size(); ++t) {
      double scale = 0, diff = 0;
      for (std::size_t j = t * vocab; j < (t + 1) * vocab; ++j) {
        scale = std::max(scale, std::fabs(static_cast<double>(b.logits[j])));
        diff = std::max(diff, std::fabs(static_cast<double>(a.logits[j]) - b.logits[j]));
        if (a.logits[j] != b.logits[j] || std::isnan(a.logits[j])) {
          c.bitwise_identical_logits = false;
          if (std::isnan(a.logits[j]) || std::isnan(b.logits[j]))
            diff = std::numeric_limits<double>::infinity();
        }
      }
      const double rel = scale > 0 ? diff / scale : diff;
      if (rel > c.max_rel_logit_diff) c.max_rel_logit_diff = rel;
      if (rel > 0 && c.first_difference.empty()) {
        c.first_difference = "request " + std::to_string(a.id) + " token " + std::to_string(t) +
                             ": logits differ (relative " + std::to_string(rel) + ")";
      }
    }
  }
  return c;
}

ForcedComparison compare_forced(const RunResult& run, const RunResult& forced, double tolerance) {
  ForcedComparison c;
  c.same_streams = run.requests.size() == forced.requests.size();
  const auto problem = [&](const std::string& what) {
    if (c.first_problem.empty()) c.first_problem = what;
  };
  if (!c.same_streams) problem("different numbers of finished requests");
  for (std::size_t i = 0; i < std::min(run.requests.size(), forced.requests.size()); ++i) {
    const RequestResult& a = run.requests[i];
    const RequestResult& b = forced.requests[i];
    const std::string which = "request " + std::to_string(a.id);
    if (a.id != b.id || a.output != b.output || a.logits.size() != b.logits.size()) {
      c.same_streams = false;
      problem(which + ": the forced run did not follow the token stream");
      continue;
    }
    const std::size_t vocab = a.output.empty() ? 0 : a.logits.size() / a.output.size();
    for (std::size_t t = 0; t < a.output.size(); ++t) {
      ++c.steps;
      const float* x = a.logits.data() + t * vocab;
      const float* y = b.logits.data() + t * vocab;
      double scale = 0;
      double diff = 0;
      std::size_t y_best = 0;
      for (std::size_t j = 0; j < vocab; ++j) {
        scale = std::max(scale, std::fabs(static_cast<double>(y[j])));
        const double d = std::fabs(static_cast<double>(x[j]) - y[j]);
        diff = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(diff, d);
        if (y[j] > y[y_best]) y_best = j;
      }
      const double rel = scale > 0 ? diff / scale : diff;
      c.max_rel_logit_diff = std::max(c.max_rel_logit_diff, rel);
      if (rel > tolerance) {
        problem(which + " token " + std::to_string(t) + ": logits differ by " +
                std::to_string(rel) + " relative");
      }
      const auto chosen = static_cast<std::size_t>(a.output[t]);
      if (chosen != y_best) {
        ++c.argmax_differences;
        const double margin = scale > 0 ? (static_cast<double>(y[y_best]) - y[chosen]) / scale
                                        : std::numeric_limits<double>::infinity();
        c.max_tie_margin = std::max(c.max_tie_margin, margin);
        if (margin > tolerance) {
          problem(which + " token " + std::to_string(t) + ": greedy choice " +
                  std::to_string(chosen) + " is not the other side's argmax " +
                  std::to_string(y_best) + " (margin " + std::to_string(margin) + " relative)");
        }
      }
    }
  }
  if (c.steps == 0) problem("no generated tokens to compare");
  return c;
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  const auto index = static_cast<std::size_t>(std::max(1.0, rank)) - 1;
  return values[std::min(index, values.size() - 1)];
}

}  // namespace tiny_engine
