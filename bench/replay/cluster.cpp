// Cluster replay (see cluster.hpp).
#include "cluster.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>
#include <numeric>

#include "pagedkv/base/error.hpp"
#include "pagedkv/events/indexer.hpp"
#include "pagedkv/events/publisher.hpp"
#include "pagedkv/events/wire.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"

namespace pagedkv::replay {

RouterKind parse_router(const std::string& name) {
  if (name == "kv") return RouterKind::kKv;
  if (name == "round_robin") return RouterKind::kRoundRobin;
  if (name == "least_loaded") return RouterKind::kLeastLoaded;
  throw Error(ErrorCode::kParseError,
              "--router: kv, round_robin or least_loaded, not '" + name + "'");
}

const char* to_string(RouterKind kind) {
  switch (kind) {
    case RouterKind::kKv: return "kv";
    case RouterKind::kRoundRobin: return "round_robin";
    default: return "least_loaded";
  }
}

namespace {

// tcp://host:port -> tcp://host:(port + k); other endpoints get a suffix (vLLM's DP offset).
std::string offset_endpoint(const std::string& endpoint, std::uint32_t k) {
  if (k == 0 || endpoint.ends_with(":*")) return endpoint;  // ephemeral ports: each its own
  const auto colon = endpoint.rfind(':');
  if (endpoint.starts_with("tcp://") && colon != std::string::npos) {
    const std::string port = endpoint.substr(colon + 1);
    if (!port.empty() && std::all_of(port.begin(), port.end(), ::isdigit)) {
      return endpoint.substr(0, colon + 1) + std::to_string(std::stoi(port) + static_cast<int>(k));
    }
  }
  return endpoint + "_dp" + std::to_string(k);
}

}  // namespace

ClusterResult run_cluster(const Trace& trace, const ReplayOptions& o, std::int32_t num_blocks,
                          const ClusterOptions& c) {
  if (c.engines == 0 || c.engines > events::BlockIndex::kMaxEngines) {
    throw Error(ErrorCode::kInvalidArgument,
                "--engines: 1.." + std::to_string(events::BlockIndex::kMaxEngines));
  }
  if (num_blocks < 2) {
    throw Error(ErrorCode::kInvalidArgument, "--num-blocks: at least 2 (null block + 1)");
  }
  KVCacheManagerConfig mc;
  mc.num_blocks = num_blocks;
  mc.block_size = o.block_size;
  mc.enable_caching = o.caching;
  mc.verify_cache_hits = o.verify_cache_hits;
  mc.hash_scheme = o.hash;
  mc.hash_seed = "pagedkv-replay";  // engines and router hash alike
  mc.enable_kv_events = true;

  std::vector<std::unique_ptr<KVCacheManager>> engines;
  std::vector<std::unique_ptr<events::KVEventPublisher>> publishers;
  events::KVIndexer indexer;
  for (std::uint32_t k = 0; k < c.engines; ++k) {
    engines.push_back(std::make_unique<KVCacheManager>(mc));
    indexer.add_engine("engine" + std::to_string(k));
    if (c.kv_events) {
      events::KVEventPublisherConfig pc;
      pc.endpoint = offset_endpoint(*c.kv_events, k);
      pc.probe_hasher = engines.back()->hasher();
      publishers.push_back(std::make_unique<events::KVEventPublisher>(pc));
      std::fprintf(stderr, "pagedkv-replay: engine %u publishes KV events on %s\n", k,
                   publishers.back()->endpoint().c_str());
    }
  }
  events::KVRouter router(indexer, c.weights);
  const events::WireOptions wire;

  ClusterResult res;
  res.per_engine.resize(c.engines);
  res.requests.assign(c.engines, 0);
  std::vector<std::uint64_t> seq(c.engines, 0);
  std::vector<double> loads(c.engines, 0);
  std::deque<std::uint32_t> window;
  std::vector<TokenId> tokens;
  std::vector<std::uint64_t> ids;
  std::vector<events::PrefixMatch> matches(c.engines);
  std::string payload;
  std::uint32_t rr = 0;
  const auto wall = std::chrono::steady_clock::now();

  for (std::size_t i = 0; i < trace.requests.size(); ++i) {
    synthesize_prompt(trace, i, tokens);
    RequestHashKeys keys;
    keys.cache_salt = trace.requests[i].cache_salt;
    Request request = engines[0]->make_request(static_cast<RequestId>(i), tokens, keys);
    std::uint32_t e = 0;
    switch (c.router) {
      case RouterKind::kRoundRobin: e = rr++ % c.engines; break;
      case RouterKind::kLeastLoaded: {
        const std::vector<events::PrefixMatch> none(c.engines);
        e = static_cast<std::uint32_t>(router.pick(none, 1, loads));
        break;
      }
      case RouterKind::kKv: {
        ids.clear();
        for (const BlockHash& h : request.block_hashes()) ids.push_back(h.event_id());
        indexer.match(ids, matches);
        e = static_cast<std::uint32_t>(router.pick(matches, ids.size(), loads));
        break;
      }
    }
    ++res.requests[e];
    window.push_back(e);
    loads[e] += 1;
    if (window.size() > c.load_window) {
      loads[window.front()] -= 1;
      window.pop_front();
    }

    KVCacheManager& m = *engines[e];
    ReplayResult& r = res.per_engine[e];
    const std::uint64_t n = request.num_tokens();
    ++r.requests;
    r.prompt_tokens += n;
    r.prompt_blocks += (n + o.block_size - 1) / o.block_size;
    if ((n + o.block_size - 1) / o.block_size > static_cast<std::uint64_t>(num_blocks - 1)) {
      ++r.rejected;
      continue;
    }
    const CacheHit hit = m.get_computed_blocks(request);
    if (!m.allocate_slots(request, n - hit.num_tokens, hit)) {
      throw Error(ErrorCode::kInvalidState,
                  "replay: request " + std::to_string(i) + " did not fit an idle pool");
    }
    m.free(request);
    r.queried_tokens += n;
    r.hit_tokens += hit.num_tokens;
    r.prefill_tokens_computed += n - hit.num_tokens;

    std::vector<KVEvent> evs = m.take_events();
    if (evs.empty()) continue;
    payload.clear();
    events::encode_event_batch(evs, 0, wire, payload);
    indexer.apply(e, seq[e]++, {reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size()});
    ++res.events_batches;
    if (!publishers.empty()) publishers[e]->publish(std::move(evs));
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
  for (std::uint32_t k = 0; k < c.engines; ++k) {
    ReplayResult& r = res.per_engine[k];
    r.num_blocks = num_blocks;
    r.evicted_blocks = engines[k]->stats().evictions;
    r.wall_seconds = wall_s;
    ReplayResult& t = res.total;
    t.requests += r.requests;
    t.rejected += r.rejected;
    t.prompt_tokens += r.prompt_tokens;
    t.prompt_blocks += r.prompt_blocks;
    t.queried_tokens += r.queried_tokens;
    t.hit_tokens += r.hit_tokens;
    t.prefill_tokens_computed += r.prefill_tokens_computed;
    t.evicted_blocks += r.evicted_blocks;
  }
  res.total.num_blocks = num_blocks;
  res.total.wall_seconds = wall_s;
  const double mean = double(trace.requests.size()) / double(c.engines);
  res.load_imbalance =
      mean > 0 ? double(*std::max_element(res.requests.begin(), res.requests.end())) / mean : 0;
  res.index_entries = indexer.num_entries();
  res.index_bytes_per_entry =
      res.index_entries ? double(indexer.memory_bytes()) / double(res.index_entries) : 0;
  for (auto& p : publishers) {
    p->flush(std::chrono::seconds(10));
    res.published_dropped += p->stats().dropped_batches;
  }
  return res;
}

std::string to_json(const ClusterResult& r, const ReplayOptions& o, const ClusterOptions& c,
                    const Trace& trace) {
  std::string per = "[";
  for (std::size_t k = 0; k < r.requests.size(); ++k) {
    if (k) per += ",";
    per += std::to_string(r.requests[k]);
  }
  per += "]";
  char buf[1024];
  std::snprintf(
      buf, sizeof(buf),
      "{\"trace\":\"%s\",\"engines\":%u,\"router\":\"%s\",\"num_blocks_per_engine\":%d,"
      "\"block_size\":%u,\"hash\":\"%s\",\"requests\":%llu,\"rejected\":%llu,"
      "\"hit_rate\":%.6f,\"prefill_saved\":%.6f,\"hit_tokens\":%llu,\"prefill_tokens_computed\":%llu,"
      "\"requests_per_engine\":%s,\"load_imbalance_max_over_mean\":%.4f,"
      "\"event_batches\":%llu,\"index_entries\":%llu,\"index_bytes_per_entry\":%.2f,"
      "\"published_dropped\":%llu,\"wall_seconds\":%.3f}",
      trace.name.c_str(), c.engines, to_string(c.router), r.total.num_blocks, o.block_size,
      std::string(pagedkv::to_string(o.hash)).c_str(), (unsigned long long)r.total.requests,
      (unsigned long long)r.total.rejected, r.total.hit_rate(), r.total.prefill_saved_ratio(),
      (unsigned long long)r.total.hit_tokens, (unsigned long long)r.total.prefill_tokens_computed,
      per.c_str(), r.load_imbalance, (unsigned long long)r.events_batches,
      (unsigned long long)r.index_entries, r.index_bytes_per_entry,
      (unsigned long long)r.published_dropped, r.total.wall_seconds);
  return buf;
}

}  // namespace pagedkv::replay
