// Cluster replay (see cluster.hpp).
#include "cluster.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <deque>
#include <memory>
#include <numeric>
#include <thread>

#include "pagedkv/base/error.hpp"
#include "pagedkv/events/indexer.hpp"
#include "pagedkv/events/publisher.hpp"
#include "pagedkv/events/wire.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"
#if PAGEDKV_REPLAY_REMOTE
#include "pagedkv/remote/disk_store.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "pagedkv/tier/remote_tier.hpp"
#endif
#if PAGEDKV_REPLAY_REDIS
#include "pagedkv/remote/redis_store.hpp"
#endif

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
    case RouterKind::kKv:
      return "kv";
    case RouterKind::kRoundRobin:
      return "round_robin";
    default:
      return "least_loaded";
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
      // Engine k publishes on port + k, which must be a port.
      unsigned long p = 0;
      const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
      if (ec != std::errc() || end != port.data() + port.size() || p + k > 65535) {
        throw Error(ErrorCode::kInvalidArgument, "--kv-events: port " + port + " + engine " +
                                                     std::to_string(k) +
                                                     " is not a TCP port (at most 65535)");
      }
      return endpoint.substr(0, colon + 1) + std::to_string(p + k);
    }
  }
  return endpoint + "_dp" + std::to_string(k);
}

// The placeholder payload of a block: its hash's bytes, mixed with the position.
// A block's placeholder payload: its hash, and its KV-cache group (--sliding-window), spread.
void write_payload(std::span<std::byte> dst, const BlockHash& h, GroupId group = 0) {
  const auto b = h.bytes();
  for (std::size_t i = 0; i < dst.size(); ++i) {
    dst[i] =
        static_cast<std::byte>(b[i % b.size()] ^ static_cast<std::uint8_t>(i * 131u + group * 71u));
  }
}

bool payload_matches(std::span<const std::byte> src, const BlockHash& h, GroupId group = 0) {
  const auto b = h.bytes();
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (src[i] != static_cast<std::byte>(b[i % b.size()] ^
                                         static_cast<std::uint8_t>(i * 131u + group * 71u))) {
      return false;
    }
  }
  return true;
}

// One engine: a plain KVCacheManager, or a TieredKVCacheManager (+ a RemoteTier on a RedisStore
// or a DiskStore).
struct Engine {
  std::unique_ptr<KVCacheManager> plain;
  std::unique_ptr<TieredKVCacheManager> tier;
  std::vector<std::byte> host;  // placeholder payloads, slot s at s * payload bytes
  std::size_t payload = 0;
#if PAGEDKV_REPLAY_REMOTE
  std::unique_ptr<RemoteStore> store;
  std::unique_ptr<RemoteTier> remote;
#endif
  const KVCacheManager& gpu() const {
    return plain ? *plain : tier->gpu();
  }
  std::span<std::byte> slot(BlockId s) {
    return std::span<std::byte>(host).subspan(static_cast<std::size_t>(s) * payload, payload);
  }
  // A store or eviction committed: the slot now holds its block's payload (the engine's copy).
  void commit_store(TransferId id, BlockId s) {
    tier->commit(id, true);
    const KVCacheBlock& b = tier->host_pool().block(s);
    if (b.is_cached()) write_payload(slot(s), b.block_hash, b.group_id);
  }
};

}  // namespace

ClusterResult run_cluster(const Trace& trace, const ReplayOptions& o, std::int32_t num_blocks,
                          const ClusterOptions& c, const TierReplayOptions* tier_opts) {
  if (c.engines == 0 || c.engines > events::BlockIndex::kMaxEngines) {
    throw Error(ErrorCode::kInvalidArgument,
                "--engines: 1.." + std::to_string(events::BlockIndex::kMaxEngines));
  }
  if (num_blocks < 2) {
    throw Error(ErrorCode::kInvalidArgument, "--num-blocks: at least 2 (null block + 1)");
  }
  const bool tiered = tier_opts != nullptr && !tier_opts->host_blocks.empty();
  if (c.remote && !tiered) {
    throw Error(ErrorCode::kInvalidArgument,
                "--remote needs --host-blocks M (remote loads land in host slots)");
  }
  const bool on_disk = c.remote && c.remote->starts_with("file://");
  if (on_disk && c.engines != 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "--disk: one engine (a DiskStore directory belongs to one store; use --remote "
                "redis://... to share a tier between engines)");
  }
#if !PAGEDKV_REPLAY_REDIS
  if (c.remote && !on_disk) {
    throw Error(ErrorCode::kInvalidArgument,
                "--remote: this build has no RedisStore (configure with libhiredis-dev installed)");
  }
#endif
  if (tiered && !o.caching) {
    throw Error(ErrorCode::kInvalidArgument, "--host-blocks: caching on");
  }
  KVCacheManagerConfig mc;
  mc.num_blocks = num_blocks;
  mc.block_size = o.block_size;
  mc.enable_caching = o.caching;
  mc.verify_cache_hits = o.verify_cache_hits;
  mc.hash_scheme = o.hash;
  mc.hash_seed = "pagedkv-replay";  // engines and router hash alike
  mc.enable_kv_events = true;
  // The window group's block size (--window-block-size; --block-size when not given).
  const std::uint32_t window_bs = o.window_block_size != 0 ? o.window_block_size : o.block_size;
  if (o.sliding_window > 0) {  // a hybrid model: full attention + a sliding-window group
    mc.groups = {AttentionSpec::full(o.block_size),
                 AttentionSpec::sliding(window_bs, o.sliding_window)};
  }
  HostTierConfig hc;
  if (tiered) {
    hc.num_host_blocks = tier_opts->host_blocks.front();
    hc.policy = tier_opts->policy;
    hc.selective_hits = tier_opts->selective_hits;
    hc.bytes_per_block = tier_opts->kv_bytes_per_token * o.block_size;
    if (o.sliding_window > 0) {  // the layers split evenly between the groups (as replay.cpp)
      hc.group_bytes_per_block = {hc.bytes_per_block / 2,
                                  tier_opts->kv_bytes_per_token * window_bs / 2};
      hc.window_store = tier_opts->window_store;
    }
  }

  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::unique_ptr<events::KVEventPublisher>> publishers;
  events::KVIndexer indexer;
  for (std::uint32_t k = 0; k < c.engines; ++k) {
    auto eng = std::make_unique<Engine>();
    if (tiered) {
      eng->tier = std::make_unique<TieredKVCacheManager>(mc, hc);
      eng->payload = c.remote ? c.remote_payload_bytes : 8;
      eng->host.assign(static_cast<std::size_t>(hc.num_host_blocks + 1) * eng->payload,
                       std::byte{0});
#if PAGEDKV_REPLAY_REMOTE
      if (c.remote) {
        const std::uint64_t fingerprint = layout_fingerprint(
            "pagedkv-replay placeholder payload, " + std::to_string(eng->payload) + " bytes");
        if (on_disk) {  // --disk DIR --disk-gib G
          DiskStoreConfig dc;
          dc.directory = c.remote->substr(7);
          dc.name_space = "pagedkv-replay";
          dc.layout_fingerprint = fingerprint;
          dc.value_bytes = eng->payload;
          dc.capacity_bytes = static_cast<std::uint64_t>(c.disk_gib * double(1ull << 30));
          dc.op_timeout = c.remote_op_timeout;
          dc.queue_depth = 1u << 20;  // a whole request's probe or put batch (no refusals)
          dc.sync_on_close = false;   // a benchmark: the page cache is enough
          eng->store = std::make_unique<DiskStore>(dc);
        } else {
#if PAGEDKV_REPLAY_REDIS
          RedisStoreConfig sc = RedisStoreConfig::from_url(*c.remote);
          sc.layout_fingerprint = fingerprint;
          sc.op_timeout = c.remote_op_timeout;
          sc.queue_depth = 1u << 20;  // a whole request's probe or put batch (no refusals)
          eng->store = std::make_unique<RedisStore>(sc);
#endif
        }
        RemoteTierConfig rc;
        rc.policy = PrefetchPolicy::kWaitComplete;
        rc.bytes_per_block = eng->payload;
        rc.store_min_hits = c.remote_store_min_hits;
        if (c.remote_store_on_host_eviction) {
          rc.store_policy = RemoteStorePolicy::kOnHostEviction;
          rc.eviction_staging_blocks = static_cast<std::size_t>(hc.num_host_blocks);
        }
        rc.max_puts_in_flight = static_cast<std::size_t>(hc.num_host_blocks);
        rc.drain_timeout = c.remote_op_timeout * 4;
        eng->remote = std::make_unique<RemoteTier>(*eng->tier, *eng->store, eng->host, rc);
      }
#endif
    } else {
      eng->plain = std::make_unique<KVCacheManager>(mc);
    }
    engines.push_back(std::move(eng));
    indexer.add_engine("engine" + std::to_string(k));
    if (c.kv_events) {
      events::KVEventPublisherConfig pc;
      pc.endpoint = offset_endpoint(*c.kv_events, k);
      pc.probe_hasher = engines.back()->gpu().hasher();
      publishers.push_back(std::make_unique<events::KVEventPublisher>(pc));
      std::fprintf(stderr, "pagedkv-replay: engine %u publishes KV events on %s\n", k,
                   publishers.back()->endpoint().c_str());
    }
  }
  // Each group's block keys at its block size (the replay's payload check of host hits).
  std::vector<AttentionSpec> specs;
  std::vector<std::uint32_t> group_bs;
  for (std::size_t g = 0; g < engines[0]->gpu().num_groups(); ++g) {
    specs.push_back(engines[0]->gpu().group_spec(g));
    group_bs.push_back(specs.back().block_size);
  }
  const KVCacheCoordinator group_keys(specs, engines[0]->gpu().hasher().scheme());
  std::vector<BlockHash> coarse_keys;
  events::KVRouter router(indexer, c.weights);
  const events::WireOptions wire;

  ClusterResult res;
  res.per_engine.resize(c.engines);
  res.requests.assign(c.engines, 0);
  res.host_blocks = tiered ? hc.num_host_blocks : 0;
  res.host_policy = std::string(pagedkv::to_string(hc.policy));
  res.remote = c.remote.has_value();
  std::vector<std::uint64_t> seq(c.engines, 0);
  std::vector<double> loads(c.engines, 0);
  std::deque<std::uint32_t> window;
  std::vector<TokenId> tokens;
  std::vector<std::uint64_t> ids;
  std::vector<events::PrefixMatch> matches(c.engines);
  std::string payload;
  std::uint32_t rr = 0;
  const auto wall = std::chrono::steady_clock::now();
  using WaitClock [[maybe_unused]] = std::chrono::steady_clock;  // the remote tier's waits

  for (std::size_t i = 0; i < trace.requests.size(); ++i) {
    synthesize_prompt(trace, i, tokens);
    RequestHashKeys keys;
    keys.cache_salt = trace.requests[i].cache_salt;
    Request request = engines[0]->gpu().make_request(static_cast<RequestId>(i), tokens, keys);
    std::uint32_t e = 0;
    switch (c.router) {
      case RouterKind::kRoundRobin:
        e = rr++ % c.engines;
        break;
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

    Engine& eng = *engines[e];
    ReplayResult& r = res.per_engine[e];
    const std::uint64_t n = request.num_tokens();
    ++r.requests;
    r.prompt_tokens += n;
    r.prompt_blocks += (n + o.block_size - 1) / o.block_size;
    // Each group holds its own blocks, at its block size.
    const std::uint64_t needed = (n + o.block_size - 1) / o.block_size +
                                 (o.sliding_window > 0 ? (n + window_bs - 1) / window_bs : 0);
    if (needed > static_cast<std::uint64_t>(num_blocks - 1)) {
      ++r.rejected;
      continue;
    }
    std::size_t hit_tokens = 0;
    if (eng.plain) {
      KVCacheManager& m = *eng.plain;
      const CacheHit hit = m.get_computed_blocks(request);
      if (!m.allocate_slots(request, n - hit.num_tokens, hit)) {
        throw Error(ErrorCode::kInvalidState,
                    "replay: request " + std::to_string(i) + " did not fit an idle pool");
      }
      m.free(request);
      hit_tokens = hit.num_tokens;
    } else {
      TieredKVCacheManager& t = *eng.tier;
#if PAGEDKV_REPLAY_REMOTE
      // The request's remote prefix: probed and loaded into host slots before it is looked
      // up (kWaitComplete; every op completes within the store's op timeout).
      if (eng.remote) {
        const auto t0 = WaitClock::now();
        eng.remote->add_request(request, t0);
        for (;;) {
          const auto now = WaitClock::now();
          eng.remote->poll(now);
          if (eng.remote->ready(request.id(), now)) break;
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        eng.remote->remove_request(request.id());
        res.remote_stats.wait_seconds +=
            std::chrono::duration<double>(WaitClock::now() - t0).count();
      }
#endif
      const TieredCacheHit hit = t.get_computed_blocks(request);
      // Each group's host slots hold that group's blocks at its block size: checked against
      // the group's key of the block (a coarser group's: the GPU manager's digest).
      const BlockSequence fine = request.hashed_tokens().sequence();
      for (std::size_t grp = 0; grp < group_bs.size(); ++grp) {
        const std::vector<BlockId>& row =
            grp == 0 ? hit.host_slots : hit.host_other_groups[grp - 1];
        if (row.empty()) continue;
        coarse_keys.clear();
        const BlockSequence view = group_keys.group_sequence(fine, grp, coarse_keys);
        const std::size_t g = hit.gpu.num_tokens / group_bs[grp];
        for (std::size_t j = 0; j < row.size(); ++j) {
          const BlockId s = row[j];  // 0: a window group loads nothing
          if (s != 0 &&
              !payload_matches(eng.slot(s), view.block_hashes[g + j], static_cast<GroupId>(grp))) {
            ++res.payload_mismatches;
          }
        }
      }
      auto alloc = t.allocate_slots(request, n - hit.num_tokens(), hit);
      if (!alloc) {
        throw Error(ErrorCode::kInvalidState,
                    "replay: request " + std::to_string(i) + " did not fit an idle pool");
      }
      const TierPlan& p = alloc->transfers;
      for (std::size_t j = 0; j < p.eviction_ids.size(); ++j) {
        eng.commit_store(p.eviction_ids[j], p.plan.evictions[j].dst);
      }
      for (const TransferId id : p.load_ids) t.commit(id, true);
      if (t.has_unfinished_loads(request.id())) {
        const LoadResult lr = t.finish_loads(request);
        for (std::size_t j = 0; j < lr.transfers.store_ids.size(); ++j) {
          eng.commit_store(lr.transfers.store_ids[j], lr.transfers.plan.stores[j].dst);
        }
      }
      for (std::size_t j = 0; j < p.store_ids.size(); ++j) {
        eng.commit_store(p.store_ids[j], p.plan.stores[j].dst);
      }
      t.free(request);
      hit_tokens = hit.num_tokens();
      res.gpu_hit_tokens += hit.gpu.num_tokens;
      res.host_hit_tokens += hit.num_host_tokens;
#if PAGEDKV_REPLAY_REMOTE
      // Every op of this engine (its puts included) completes before the next request.
      if (eng.remote) {
        const auto t0 = WaitClock::now();
        for (;;) {
          eng.remote->poll(WaitClock::now());
          if (eng.remote->in_flight() == 0 && eng.remote->pinned_for_puts() == 0) break;
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        res.remote_stats.wait_seconds +=
            std::chrono::duration<double>(WaitClock::now() - t0).count();
      }
#endif
    }
    r.queried_tokens += n;
    r.hit_tokens += hit_tokens;
    r.prefill_tokens_computed += n - hit_tokens;

    std::vector<KVEvent> evs = eng.plain ? eng.plain->take_events() : eng.tier->take_events();
    if (eng.tier) {  // the router indexes what engines hold in GPU memory
      std::erase_if(evs, [](const KVEvent& ev) {
        if (const auto* s = std::get_if<BlockStored>(&ev.data)) return s->medium != "GPU";
        if (const auto* rm = std::get_if<BlockRemoved>(&ev.data)) return rm->medium != "GPU";
        return false;
      });
    }
    if (evs.empty()) continue;
    payload.clear();
    events::encode_event_batch(evs, 0, wire, payload);
    indexer.apply(e, seq[e]++,
                  {reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size()});
    ++res.events_batches;
    if (!publishers.empty()) publishers[e]->publish(std::move(evs));
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
  for (std::uint32_t k = 0; k < c.engines; ++k) {
    ReplayResult& r = res.per_engine[k];
    r.num_blocks = num_blocks;
    r.evicted_blocks = engines[k]->gpu().stats().evictions;
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
    if (engines[k]->tier) {
      res.host_evictions += engines[k]->tier->stats().host_evictions;
      res.window_stores_skipped += engines[k]->tier->stats().window_stores_skipped;
      const std::vector<TierGroupStats> tg = engines[k]->tier->group_stats();
      res.host_groups.resize(std::max(res.host_groups.size(), tg.size()));
      for (std::size_t g = 0; g < tg.size(); ++g) {
        res.host_groups[g].loaded_blocks += tg[g].loaded_blocks;
        res.host_groups[g].loaded_bytes += tg[g].loaded_bytes;
        res.host_groups[g].stored_blocks += tg[g].stored_blocks;
        res.host_groups[g].stored_bytes += tg[g].stored_bytes;
      }
    }
#if PAGEDKV_REPLAY_REMOTE
    if (engines[k]->remote) {
      const RemoteTierStats s = engines[k]->remote->stats();
      const RemoteStoreStats st = engines[k]->store->stats();
      RemoteReplayStats& x = res.remote_stats;
      x.probed_blocks += s.probed_blocks;
      x.probe_hit_blocks += s.probe_hit_blocks;
      x.hit_blocks += s.loaded_blocks;
      x.hit_tokens += s.remote_hit_tokens;
      x.load_misses += s.load_misses;
      x.fills_no_slot += s.fills_no_slot;
      x.fills_refused += s.fills_refused;
      x.fills_shared += s.fills_shared;
      x.puts += s.puts;
      x.stored_blocks += s.stored_blocks;
      x.puts_skipped += s.puts_skipped;
      x.puts_failed += s.puts_failed;
      x.puts_skipped_full += s.puts_skipped_full;
      x.eviction_puts += s.eviction_puts;
      x.bytes_in += st.bytes_in;
      x.bytes_out += st.bytes_out;
      x.errors += st.errors;
      x.timeouts += st.timeouts;
      x.checksum_failures += st.checksum_failures;
      x.header_mismatches += st.header_mismatches;
      x.binding_mismatches += st.binding_mismatches;
      x.rejected_values += s.rejected_values;
      x.queue_full_drops += st.queue_full_drops;
      x.window_blocks_not_loaded += s.window_blocks_not_loaded;
      const std::vector<RemoteTierGroupStats> gs = engines[k]->remote->group_stats();
      x.groups.resize(std::max(x.groups.size(), gs.size()));
      for (std::size_t g = 0; g < gs.size(); ++g) {
        x.groups[g].loaded_blocks += gs[g].loaded_blocks;
        x.groups[g].loaded_bytes += gs[g].loaded_bytes;
        x.groups[g].stored_blocks += gs[g].stored_blocks;
        x.groups[g].stored_bytes += gs[g].stored_bytes;
        x.groups[g].window_blocks_not_loaded += gs[g].window_blocks_not_loaded;
      }
    }
#endif
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
                    const Trace& trace, const ClusterResult* without) {
  std::string per = "[";
  for (std::size_t k = 0; k < r.requests.size(); ++k) {
    if (k) per += ",";
    per += std::to_string(r.requests[k]);
  }
  per += "]";
  std::string buf;
  buf = format(
      "{\"trace\":%s,\"engines\":%u,\"router\":\"%s\",\"num_blocks_per_engine\":%d,"
      "\"block_size\":%u,\"hash\":\"%s\",\"requests\":%llu,\"rejected\":%llu,"
      "\"hit_rate\":%.6f,\"prefill_saved\":%.6f,\"hit_tokens\":%llu,\"prefill_tokens_computed\":%"
      "llu,"
      "\"requests_per_engine\":%s,\"load_imbalance_max_over_mean\":%.4f,"
      "\"event_batches\":%llu,\"index_entries\":%llu,\"index_bytes_per_entry\":%.2f,"
      "\"published_dropped\":%llu,\"wall_seconds\":%.3f}",
      json_string(trace.name).c_str(), c.engines, to_string(c.router), r.total.num_blocks,
      o.block_size, std::string(pagedkv::to_string(o.hash)).c_str(),
      (unsigned long long)r.total.requests, (unsigned long long)r.total.rejected,
      r.total.hit_rate(), r.total.prefill_saved_ratio(), (unsigned long long)r.total.hit_tokens,
      (unsigned long long)r.total.prefill_tokens_computed, per.c_str(), r.load_imbalance,
      (unsigned long long)r.events_batches, (unsigned long long)r.index_entries,
      r.index_bytes_per_entry, (unsigned long long)r.published_dropped, r.total.wall_seconds);
  std::string out = buf;
  if (r.host_blocks > 0) {
    out.pop_back();  // the closing brace
    buf = format(
        ",\"host_blocks_per_engine\":%d,\"host_policy\":\"%s\",\"gpu_hit_tokens\":%llu,"
        "\"host_hit_tokens\":%llu,\"host_evictions\":%llu,\"payload_mismatches\":%llu}",
        r.host_blocks, r.host_policy.c_str(), (unsigned long long)r.gpu_hit_tokens,
        (unsigned long long)r.host_hit_tokens, (unsigned long long)r.host_evictions,
        (unsigned long long)r.payload_mismatches);
    out += buf;
    if (o.sliding_window > 0) {  // per KV-cache group (0 full attention, 1 the window)
      const auto list = [](const auto& v, auto field) {
        std::string l = "[";
        for (std::size_t g = 0; g < v.size(); ++g)
          l += (g ? "," : "") + std::to_string(field(v[g]));
        return l + "]";
      };
      out.pop_back();
      out += ",\"sliding_window\":" + std::to_string(o.sliding_window);
      if (o.window_block_size != 0) {  // only when given: the fields above unchanged
        out += ",\"window_block_size\":" + std::to_string(o.window_block_size);
      }
      out += ",\"host_group_loaded_blocks\":" +
             list(r.host_groups, [](const GroupReplayStats& g) { return g.loaded_blocks; });
      out += ",\"host_group_loaded_bytes\":" +
             list(r.host_groups, [](const GroupReplayStats& g) { return g.loaded_bytes; });
      out += ",\"host_group_stored_blocks\":" +
             list(r.host_groups, [](const GroupReplayStats& g) { return g.stored_blocks; });
      out += ",\"window_stores_skipped\":" + std::to_string(r.window_stores_skipped);
      if (r.remote) {
        const std::vector<GroupReplayStats>& x = r.remote_stats.groups;
        out += ",\"remote_group_loaded_blocks\":" +
               list(x, [](const GroupReplayStats& g) { return g.loaded_blocks; });
        out += ",\"remote_group_loaded_bytes\":" +
               list(x, [](const GroupReplayStats& g) { return g.loaded_bytes; });
        out += ",\"remote_group_stored_blocks\":" +
               list(x, [](const GroupReplayStats& g) { return g.stored_blocks; });
        out += ",\"remote_group_stored_bytes\":" +
               list(x, [](const GroupReplayStats& g) { return g.stored_bytes; });
        out += ",\"remote_window_blocks_not_loaded\":" +
               std::to_string(r.remote_stats.window_blocks_not_loaded);
      }
      out += "}";
    }
  }
  if (r.remote) {
    const RemoteReplayStats& x = r.remote_stats;
    out.pop_back();
    buf = format(
        ",\"remote\":%s,\"remote_payload_bytes\":%u,"
        "\"remote_note\":\"block payloads are placeholders of remote_payload_bytes bytes (plus "
        "the value header), not real K/V; probes and gets are waited for per request and every op "
        "completes before the next request (deterministic)\",\"remote_store\":\"%s\","
        "\"remote_hit_tokens\":%llu,\"remote_hit_blocks\":%llu,\"remote_probed_blocks\":%llu,"
        "\"remote_probe_hit_blocks\":%llu,\"remote_load_misses\":%llu,"
        "\"remote_fills_no_slot\":%llu,\"remote_fills_refused\":%llu,\"remote_fills_shared\":%llu,"
        "\"remote_puts\":%llu,"
        "\"remote_stored_blocks\":%llu,\"remote_eviction_puts\":%llu,"
        "\"remote_puts_skipped\":%llu,\"remote_puts_failed\":%llu,"
        "\"remote_puts_skipped_full\":%llu,\"remote_bytes_in\":%llu,\"remote_bytes_out\":%llu,"
        "\"remote_errors\":%llu,\"remote_timeouts\":%llu,\"remote_checksum_failures\":%llu,"
        "\"remote_header_mismatches\":%llu,\"remote_binding_mismatches\":%llu,"
        "\"remote_rejected_values\":%llu,\"remote_queue_full_drops\":%llu,"
        "\"remote_wait_seconds\":%.3f}",
        json_string(redact_url(*c.remote)).c_str(), c.remote_payload_bytes,
        c.remote_store_on_host_eviction
            ? "host_eviction"
            : (c.remote_store_min_hits == 0 ? "write_through" : "after_hits"),
        (unsigned long long)x.hit_tokens, (unsigned long long)x.hit_blocks,
        (unsigned long long)x.probed_blocks, (unsigned long long)x.probe_hit_blocks,
        (unsigned long long)x.load_misses, (unsigned long long)x.fills_no_slot,
        (unsigned long long)x.fills_refused, (unsigned long long)x.fills_shared,
        (unsigned long long)x.puts, (unsigned long long)x.stored_blocks,
        (unsigned long long)x.eviction_puts, (unsigned long long)x.puts_skipped,
        (unsigned long long)x.puts_failed, (unsigned long long)x.puts_skipped_full,
        (unsigned long long)x.bytes_in, (unsigned long long)x.bytes_out,
        (unsigned long long)x.errors, (unsigned long long)x.timeouts,
        (unsigned long long)x.checksum_failures, (unsigned long long)x.header_mismatches,
        (unsigned long long)x.binding_mismatches, (unsigned long long)x.rejected_values,
        (unsigned long long)x.queue_full_drops, x.wait_seconds);
    out += buf;
  }
  if (without != nullptr) {
    out.pop_back();
    buf = format(
        ",\"without_remote\":{\"hit_rate\":%.6f,\"hit_tokens\":%llu,"
        "\"gpu_hit_tokens\":%llu,\"host_hit_tokens\":%llu,"
        "\"prefill_tokens_computed\":%llu,\"payload_mismatches\":%llu,"
        "\"wall_seconds\":%.3f}}",
        without->total.hit_rate(), (unsigned long long)without->total.hit_tokens,
        (unsigned long long)without->gpu_hit_tokens, (unsigned long long)without->host_hit_tokens,
        (unsigned long long)without->total.prefill_tokens_computed,
        (unsigned long long)without->payload_mismatches, without->total.wall_seconds);
    out += buf;
  }
  return out;
}

}  // namespace pagedkv::replay
