// tests/tier/remote_episode.hpp: seeded or fuzz-driven episodes of one or two engines, each a
// TieredKVCacheManager with a RemoteTier over a FaultStore (fault_store.hpp), both stores on one
// FaultBackend (so one engine loads what the other put), checked against a content reference
// independent of pagedkv's hashing. Used by tiered_model_test.cpp and tests/fuzz/tiered_fuzz.cpp.
//
// Every GPU block and host slot holds two words derived from (group, the exact token prefix of the
// block) (hybrid_episode.hpp's tag_of and a mix of it), written by a fake forward pass and moved by
// the engine's copies (which fail at random, leaving garbage) and by the store's gets into host
// slots. The property: zero wrong hits. After every admission each group must hold its own
// prefix's words at every position the request's attention reads (full attention: all; a window:
// the window before the computed end), whatever came from the GPU cache, the host tier or the
// remote store. The episode mixes requests sharing prefixes (a tiny alphabet), every hash scheme
// (sha256, xxh3_128, and the weak test hashers cut to 2 bits, so keys collide across prefixes and
// groups), one-group and hybrid layouts (full + window, groups of different block sizes:
// hybrid_episode.hpp's layouts), every prefetch and store policy, and every fault the store
// contract allows: errors, timeouts, a full store, full queues, completions late and reordered,
// values evicted between probe and get, and hostile values (bytes flipped, values moved under
// other keys, of another length, another layout or KV format).
//
// Also checked: the tier's invariants and its KV event stream (gap-free; per medium exactly the
// blocks each pool caches, fills included: tier_episode.hpp's EventModel) after every operation;
// every hit a multiple of the groups' LCM block size, below the last token, each group's host row
// covering it (a window group: exactly its window); each RemoteTier's ops in flight are its
// store's; a duplicate add_request, a stale host hit and a refused reset_prefix_cache change
// nothing;
// after the final drain every get and put completed and the tier's counters agree with the
// store's (loads = the store's hits, rejected values = the store's kInvalidValue answers, stored
// blocks = the store's stored puts).
//
// A failed check throws RemoteEpisodeFailure naming it; any other exception escaping is a failure
// too (a valid call refused).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fault_store.hpp"
#include "hybrid_episode.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/tier/remote_tier.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"
#include "tier_episode.hpp"

namespace pagedkv::remote_test {

struct RemoteEpisodeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Layouts: 0 one group of hybrid_test::kBs tokens; 1 one group of 2 * kBs; 2..5 hybrid_episode's
// layouts 0..3 (full + window of one block size; of kBs and 2 * kBs either way round; three groups
// of 2 * kBs, kBs and 4 * kBs).
constexpr int kRemoteLayouts = 6;
constexpr std::size_t kWords = 2;
constexpr std::size_t kPayload = kWords * sizeof(std::uint64_t);  // a block's value payload
constexpr std::uint64_t kFingerprint = 0x52454d4f54450001ull;

using Words = std::array<std::uint64_t, kWords>;

// `format`: the engine's KV format (dtype << 8 | scale mode): the same tokens' K/V in another
// format are other bytes.
inline Words words_of(std::size_t group, const std::vector<TokenId>& tokens, std::size_t block,
                      std::size_t block_size, std::uint64_t format) {
  const std::uint64_t t = hybrid_test::tag_of(group, tokens, block, block_size);
  return {t ^ (format << 48), (t ^ 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull};
}

// Totals of an episode, summed by the test to show that the faults and paths were exercised.
struct RemoteEpisodeResult {
  std::uint64_t requests = 0, loaded_blocks = 0, rejected_values = 0, load_misses = 0,
                fills_shared = 0, fills_no_slot = 0, stored_blocks = 0, puts_failed = 0,
                hostile = 0, remote_hit_tokens = 0, host_hit_tokens = 0, probed_blocks = 0,
                probe_hit_blocks = 0, fills = 0, fills_refused = 0, scheduled = 0, no_gpu_room = 0,
                host_stored = 0, puts = 0, puts_skipped = 0;
};

template <typename R>
class RemoteEpisode {
 public:
  using Clock = RemoteTier::Clock;

  RemoteEpisode(R& rng, int hashing, int layout, std::string label)
      : rng_(rng), hashing_(hashing), layout_(layout), label_(std::move(label)) {}

  RemoteEpisodeResult run(int max_ops) {
    backend_.capacity = 8 + pick(200);
    kv_dtype_ = pick(2) == 0 ? kKVDtypeBFloat16Value : static_cast<std::uint8_t>(1 + pick(4));
    kv_scale_ =
        kv_dtype_ == kKVDtypeBFloat16Value ? kKVScaleNone : static_cast<std::uint8_t>(pick(3));
    window_ = 1 + static_cast<std::uint32_t>(pick(4 * hybrid_test::kBs));
    const bool hostile = pick(4) != 0;
    const std::size_t engines = pick(4) == 0 ? 1 : 2;
    for (std::size_t e = 0; e < engines; ++e) engines_.push_back(make_engine());
    lcm_ = layout_ == 0   ? hybrid_test::kBs
           : layout_ == 1 ? 2 * hybrid_test::kBs
                          : hybrid_test::layout_lcm(layout_ - 2);
    for (auto& d : docs_) {
      for (std::size_t i = 0; i < 6 * hybrid_test::kBs; ++i) d.push_back(tok());
    }
    for (int op = 0; op < max_ops && !exhausted(); ++op) {
      const std::size_t which = pick(engines_.size());
      Engine& e = *engines_[which];
      const std::size_t kind = pick(16);
      // Every scheduler step polls its remote tier first.
      now_ += std::chrono::milliseconds(pick(20));
      e.remote->poll(now_);
      if (kind <= 3) {
        arrive(e);
      } else if (kind <= 5 || (kind >= 13 && !hostile)) {
        // An idle step: the poll only.
      } else if (kind <= 9) {
        schedule(e, pick(8) == 0);
      } else if (kind == 10) {
        if (!e.arrived.empty()) {
          const std::size_t i = pick(e.arrived.size());
          e.remote->remove_request(e.arrived[i].req->id());
          e.arrived.erase(e.arrived.begin() + static_cast<std::ptrdiff_t>(i));
        }
      } else if (kind == 11) {
        // Forgets both tiers' caches (the remote store becomes the only source), or is refused
        // (blocks pinned for fills or puts) with nothing changed.
        const TieredSnapshot before = e.tier->snapshot();
        if (!e.tier->reset_prefix_cache() && !(e.tier->snapshot() == before))
          fail("a refused reset_prefix_cache changed the tier");
      } else if (kind == 12) {
        // The engine restarts cold on the same store (another configuration): its waiting
        // requests dropped, its remote tier destroyed with whatever is in flight.
        // Half the time it drains first (its counters then checked), else its remote tier is
        // destroyed with whatever is in flight.
        if (pick(2) == 0) {
          finish(e);
        } else {
          for (const Arrived& a : e.arrived) e.remote->remove_request(a.req->id());
          e.arrived.clear();
        }
        engines_[which] = make_engine();
      } else if (hostile) {
        switch (pick(5)) {
          case 0:
            backend_.evict(rng_);
            break;
          case 1:
            backend_.flip_byte(rng_);
            break;
          case 2:
            backend_.move_value(rng_);
            break;
          case 3:
            backend_.resize_value(rng_);
            break;
          default:
            // A KV dtype no engine writes (they write 1 to 4).
            backend_.restamp(rng_, kFingerprint, static_cast<std::uint8_t>(0xf0 | pick(16)));
            break;
        }
      }
      for (auto& eng : engines_) check(*eng);
    }
    // Drain: the waiting requests scheduled, every op completed.
    for (auto& eng : engines_) finish(*eng);
    res_.hostile = backend_.hostile;
    return res_;
  }

 private:
  struct Arrived {
    std::unique_ptr<Request> req;
    std::vector<TokenId> prompt;
  };
  struct Engine {
    std::int32_t gpu_blocks = 0, host_slots = 0;
    std::unique_ptr<TieredKVCacheManager> tier;
    std::vector<Words> gpu;
    std::vector<std::byte> host;
    std::unique_ptr<FaultStore<R>> store;
    std::unique_ptr<RemoteTier> remote;  // destroyed before the store and the tier
    std::vector<Arrived> arrived;
    std::size_t ng = 1;
    std::vector<std::size_t> gbs, gwb;
    tier_test::EventModel events;  // the KV event stream, as a router sees it
    std::uint64_t format = 0;      // its KV format (kv_dtype << 8 | kv_scale_mode)
    ~Engine() {
      remote.reset();
      store.reset();
    }
  };
  static constexpr std::size_t kFull = ~std::size_t{0};

  std::size_t pick(std::size_t n) { return static_cast<std::size_t>(rng_() % n); }
  TokenId tok() { return static_cast<TokenId>(pick(3)); }
  bool exhausted() const {
    if constexpr (requires { rng_.exhausted(); }) {
      return rng_.exhausted();
    } else {
      return false;
    }
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw RemoteEpisodeFailure(label_ + " hashing " + std::to_string(hashing_) + " layout " +
                               std::to_string(layout_) + ": " + what);
  }

  std::unique_ptr<Engine> make_engine() {
    auto e = std::make_unique<Engine>();
    e->gpu_blocks = 14 + static_cast<std::int32_t>(pick(16));
    e->host_slots = 2 + static_cast<std::int32_t>(pick(40));
    KVCacheManagerConfig c = hybrid_test::hybrid_config(e->gpu_blocks, window_, hashing_,
                                                        layout_ >= 2 ? layout_ - 2 : 0);
    if (layout_ < 2) c.groups = {AttentionSpec::full(hybrid_test::kBs * (layout_ == 1 ? 2 : 1))};
    c.enable_kv_events = true;
    HostTierConfig h = hybrid_test::host_config(
        e->host_slots, pick(2) == 0 ? HostPolicy::kWriteThrough : static_cast<HostPolicy>(pick(3)),
        pick(2) == 0 ? WindowStoreRule::kRequestTail : WindowStoreRule::kAll,
        layout_ >= 2 ? layout_ - 2 : 0);
    if (layout_ < 2) h.group_bytes_per_block.clear();
    h.bytes_per_block = kPayload;
    e->tier = std::make_unique<TieredKVCacheManager>(c, h);
    e->ng = e->tier->gpu().num_groups();
    e->gbs.resize(e->ng);
    e->gwb.resize(e->ng);
    for (std::size_t g = 0; g < e->ng; ++g) {
      const AttentionSpec& spec = e->tier->gpu().group_spec(g);
      e->gbs[g] = spec.block_size;
      e->gwb[g] = spec.kind == AttentionKind::kSlidingWindow ? spec.window_blocks() : kFull;
    }
    e->gpu.assign(static_cast<std::size_t>(e->gpu_blocks), Words{0, 0});
    e->host.assign(static_cast<std::size_t>(e->host_slots + 1) * kPayload, std::byte{0});
    FaultConfig fc;
    fc.fingerprint = kFingerprint;
    fc.max_value_bytes = kPayload;
    fc.queue_capacity = 4 + pick(60);
    const bool faulty = pick(4) != 0;
    fc.error_percent = faulty ? static_cast<unsigned>(pick(8)) : 0;
    fc.timeout_percent = faulty ? static_cast<unsigned>(pick(8)) : 0;
    fc.refuse_percent = faulty ? static_cast<unsigned>(pick(6)) : 0;
    fc.max_delay = static_cast<unsigned>(pick(4));
    e->store = std::make_unique<FaultStore<R>>(backend_, rng_, fc);
    RemoteTierConfig rc;
    rc.policy = static_cast<PrefetchPolicy>(pick(3));
    rc.timeout = std::chrono::milliseconds(5 + pick(60));
    rc.bytes_per_block = kPayload;
    // The episode's KV format, or (one engine in six) another one writing to the same namespace:
    // its values are never loaded by the others, nor theirs by it (format mismatches).
    rc.kv_dtype = kv_dtype_;
    rc.kv_scale_mode = kv_scale_;
    if (pick(6) == 0) {
      rc.kv_dtype = static_cast<std::uint8_t>(1 + pick(4));
      rc.kv_scale_mode = static_cast<std::uint8_t>(pick(3));
    }
    e->format = std::uint64_t{rc.kv_dtype} << 8 | rc.kv_scale_mode;
    rc.load = pick(8) != 0;
    rc.store = pick(8) != 0;
    rc.store_policy =
        pick(4) == 0 ? RemoteStorePolicy::kOnHostEviction : RemoteStorePolicy::kWriteThrough;
    rc.store_min_hits = static_cast<std::uint32_t>(pick(6) == 0 ? 1 : 0);
    rc.max_puts_in_flight = 1 + pick(32);
    rc.eviction_staging_blocks = 1 + pick(8);
    e->remote = std::make_unique<RemoteTier>(*e->tier, *e->store, e->host, rc);
    return e;
  }

  // Schedules every waiting request, polls until every op completed, and checks the remote tier's
  // counters against its store's.
  void finish(Engine& e) {
    while (!e.arrived.empty()) schedule(e, true);
    for (int i = 0; e.remote->in_flight() > 0 || e.remote->pinned_for_puts() > 0; ++i) {
      if (i > 1000) fail("the remote tier never drained");
      now_ += std::chrono::milliseconds(1);
      e.remote->poll(now_);
    }
    check(e);
    const RemoteTierStats s = e.remote->stats();
    const RemoteStoreStats st = e.store->stats();
    if (s.fills != s.loaded_blocks + s.load_misses) fail("a get never completed");
    if (s.puts != s.stored_blocks + s.puts_failed) fail("a put never completed");
    if (s.loaded_blocks != st.hits) fail("loaded blocks are not the store's hits");
    if (s.rejected_values != e.store->invalid_values())
      fail("rejected values are not the store's invalid values");
    if (s.stored_blocks != st.stored) fail("stored blocks are not the store's stored puts");
    if (s.puts_skipped_full != st.skipped_full) fail("puts skipped full disagree");
    res_.loaded_blocks += s.loaded_blocks;
    res_.rejected_values += s.rejected_values;
    res_.load_misses += s.load_misses;
    res_.fills_shared += s.fills_shared;
    res_.fills_no_slot += s.fills_no_slot;
    res_.stored_blocks += s.stored_blocks;
    res_.puts_failed += s.puts_failed;
    res_.remote_hit_tokens += s.remote_hit_tokens;
    res_.probed_blocks += s.probed_blocks;
    res_.probe_hit_blocks += s.probe_hit_blocks;
    res_.fills += s.fills;
    res_.fills_refused += s.fills_refused;
    res_.puts += s.puts;
    res_.puts_skipped += s.puts_skipped;
    res_.host_stored += e.tier->stats().stored_blocks;
  }

  Words host_words(const Engine& e, BlockId s) const {
    Words w;
    std::memcpy(w.data(), e.host.data() + static_cast<std::size_t>(s) * kPayload, kPayload);
    return w;
  }
  void set_host_words(Engine& e, BlockId s, const Words& w) {
    std::memcpy(e.host.data() + static_cast<std::size_t>(s) * kPayload, w.data(), kPayload);
  }
  Words garbage() { return {static_cast<std::uint64_t>(rng_()) << 1, rng_()}; }

  void check(Engine& e) {
    e.tier->check_invariants();
    try {
      e.events.check(*e.tier);  // gap-free; per medium exactly the blocks each pool caches
    } catch (const tier_test::EpisodeFailure& f) {
      fail(f.what());
    }
    if (e.remote->in_flight() != e.store->in_flight())
      fail("the remote tier's ops in flight are not its store's");
  }

  // A prompt: a prefix of one of the documents. A third of the time the document first forks: a
  // random prefix of it kept, new tokens after (prefixes shared, new blocks to compute).
  std::vector<TokenId> prompt(std::int32_t gpu_blocks) {
    // Room for one request in the smallest GPU pool, every group (as hybrid_episode.hpp).
    const auto room = static_cast<std::size_t>(gpu_blocks - 1) / 2;
    const std::size_t max_len = (room - 2) * hybrid_test::kBs;
    std::vector<TokenId>& doc = docs_[pick(docs_.size())];
    if (pick(3) == 0) {
      doc.resize(pick(doc.size() + 1));
      for (std::size_t i = 0; i < 1 + pick(3 * hybrid_test::kBs); ++i) doc.push_back(tok());
    }
    if (doc.size() > max_len) doc.resize(max_len);
    const std::size_t cut = pick(hybrid_test::kBs * 3);
    std::vector<TokenId> p(doc.begin(),
                           doc.begin() + static_cast<std::ptrdiff_t>(std::max<std::size_t>(
                                             1, doc.size() - std::min(cut, doc.size()))));
    if (pick(4) == 0) p.push_back(tok());
    return p;
  }

  void arrive(Engine& e) {
    if (e.arrived.size() >= 4) return;
    Arrived a;
    // Two times in three a prompt one of the engines ran recently (the other engine's blocks are in
    // the store, or this one's are after a reset), else a new one.
    a.prompt =
        !recent_.empty() && pick(3) != 0 ? recent_[pick(recent_.size())] : prompt(e.gpu_blocks);
    if (a.prompt.size() + 1 >= static_cast<std::size_t>(e.gpu_blocks - 1) / 2 * hybrid_test::kBs)
      a.prompt = prompt(e.gpu_blocks);  // too long for this engine's pool
    a.req = std::make_unique<Request>(e.tier->make_request(next_id_++, a.prompt));
    e.remote->add_request(*a.req, now_);
    ++res_.requests;
    // A duplicate add_request is refused with nothing changed.
    if (pick(6) == 0 && e.remote->config().load) {
      const TieredSnapshot before = e.tier->snapshot();
      const RemoteTierStats stats = e.remote->stats();
      const std::size_t in_flight = e.remote->in_flight();
      const std::size_t store_in_flight = e.store->in_flight();
      bool threw = false;
      try {
        e.remote->add_request(*a.req, now_);
      } catch (const Error& err) {
        threw = err.code() == ErrorCode::kInvalidState;
      }
      if (!threw) fail("a duplicate add_request was accepted");
      const RemoteTierStats after = e.remote->stats();
      if (!(e.tier->snapshot() == before) || std::memcmp(&stats, &after, sizeof(stats)) != 0 ||
          e.remote->in_flight() != in_flight || e.store->in_flight() != store_in_flight) {
        fail("a refused add_request changed the tier");
      }
    }
    e.arrived.push_back(std::move(a));
  }

  // Copies committed in a random order, each failing at random (garbage left at its destination).
  void run_copies(Engine& e, const std::vector<BlockCopy>& copies,
                  const std::vector<TransferId>& ids, bool to_host) {
    std::vector<std::size_t> order(copies.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
    for (std::size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[pick(k)]);
    for (const std::size_t k : order) {
      const bool ok = pick(10) != 0;
      const auto src = copies[k].src;
      const auto dst = copies[k].dst;
      if (to_host) {
        set_host_words(e, dst, ok ? e.gpu[static_cast<std::size_t>(src)] : garbage());
      } else {
        e.gpu[static_cast<std::size_t>(dst)] = ok ? host_words(e, src) : garbage();
      }
      e.tier->commit(ids[k], ok);
    }
  }

  // Schedules one waiting request (the first ready one, or with `force` any) and runs it.
  void schedule(Engine& e, bool force) {
    if (e.arrived.empty()) return;
    std::size_t i = pick(e.arrived.size());
    if (!force && !e.remote->ready(e.arrived[i].req->id(), now_)) return;
    Arrived a = std::move(e.arrived[i]);
    e.arrived.erase(e.arrived.begin() + static_cast<std::ptrdiff_t>(i));
    e.remote->remove_request(a.req->id());
    Request& r = *a.req;
    const std::vector<TokenId>& p = a.prompt;
    TieredKVCacheManager& t = *e.tier;
    const TieredCacheHit hit = t.get_computed_blocks(r);
    if (hit.num_tokens() >= p.size()) fail("the hit covers the last token");
    if (hit.gpu.num_tokens % lcm_ != 0 || hit.num_tokens() % lcm_ != 0)
      fail("a hit that is not a multiple of the groups' LCM block size");
    res_.host_hit_tokens += hit.num_host_tokens;
    // Each group's host row covers the host tokens at its block size: every block for full
    // attention, exactly the window at the hit's end for a window group.
    if (hit.host_other_groups.size() != e.ng - 1) fail("a host hit without a row per group");
    for (std::size_t g = 0; g < e.ng; ++g) {
      const std::vector<BlockId>& row = g == 0 ? hit.host_slots : hit.host_other_groups[g - 1];
      const std::size_t bs = e.gbs[g];
      if (row.size() * bs != hit.num_host_tokens) fail("a group's host row does not cover the hit");
      const std::size_t gg = hit.gpu.num_tokens / bs;
      const std::size_t lg = hit.num_tokens() / bs;
      for (std::size_t k = 0; k < row.size(); ++k) {
        if (e.gwb[g] == kFull ? row[k] == 0 : (row[k] != 0) != (gg + k + e.gwb[g] >= lg))
          fail("group " + std::to_string(g) + "'s host row is not its hit");
      }
    }
    const TieredSnapshot before = t.snapshot();
    // A stale host hit (a slot moved) is refused with nothing changed.
    if (!hit.host_slots.empty() && pick(5) == 0) {
      hybrid_test::expect_stale_hit_refused(t, r, hit, e.host_slots, before,
                                            [this](const std::string& w) { fail(w); });
    }
    auto alloc = t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
    ++res_.scheduled;
    if (!alloc) {
      ++res_.no_gpu_room;
      if (!(t.snapshot() == before)) fail("a failed allocation changed the tier");
      return;
    }
    run_copies(e, alloc->transfers.plan.evictions, alloc->transfers.eviction_ids, true);
    run_copies(e, alloc->transfers.plan.loads, alloc->transfers.load_ids, false);
    std::size_t computed = hit.num_tokens();
    std::vector<TierPlan> after;
    after.push_back(std::move(alloc->transfers));
    if (t.has_unfinished_loads(r.id())) {
      LoadResult lr = t.finish_loads(r);
      computed = lr.num_computed_tokens;
      after.push_back(std::move(lr.transfers));
    }
    t.check_invariants();
    // Zero wrong hits: every position the request's attention reads at `computed` holds its own
    // group's and prefix's words, wherever they came from.
    for (std::size_t g = 0; g < e.ng; ++g) {
      const std::size_t bs = e.gbs[g];
      const std::size_t cb = (computed + bs - 1) / bs;
      const std::span<const BlockId> row = t.gpu().block_ids(r.id(), g);
      const std::size_t from = e.gwb[g] == kFull ? 0 : (cb > e.gwb[g] ? cb - e.gwb[g] : 0);
      for (std::size_t q = from; q < cb; ++q) {
        if (q >= row.size() || row[q] == kNullBlockId) {
          fail("group " + std::to_string(g) + " block " + std::to_string(q) +
               " missing inside the attended range");
        }
        if (e.gpu[static_cast<std::size_t>(row[q])] != words_of(g, p, q, bs, e.format)) {
          fail("wrong K/V (a wrong hit): engine format " + std::to_string(e.format) + " request " +
               std::to_string(r.id()) + " group " + std::to_string(g) + " block " +
               std::to_string(q) + " (GPU hit " + std::to_string(hit.gpu.num_tokens) +
               " tokens, host hit " + std::to_string(hit.num_host_tokens) + ", computed " +
               std::to_string(computed) + ")");
        }
      }
    }
    // The forward pass writes blocks [computed, end) of every group.
    r.set_num_computed_tokens(computed);
    for (std::size_t g = 0; g < e.ng; ++g) {
      const std::size_t bs = e.gbs[g];
      const std::span<const BlockId> row = t.gpu().block_ids(r.id(), g);
      for (std::size_t q = computed / bs; q < p.size() / bs && q < row.size(); ++q) {
        if (row[q] != kNullBlockId)
          e.gpu[static_cast<std::size_t>(row[q])] = words_of(g, p, q, bs, e.format);
      }
    }
    r.set_num_computed_tokens(r.num_tokens());
    for (TierPlan& tp : after) run_copies(e, tp.plan.stores, tp.store_ids, true);
    t.free(r);
    t.check_invariants();
    if (recent_.size() < 8) {
      recent_.push_back(p);
    } else {
      recent_[pick(recent_.size())] = p;
    }
  }

  R& rng_;
  int hashing_, layout_;
  std::string label_;
  FaultBackend backend_;  // outlives the engines (declared first)
  std::vector<std::unique_ptr<Engine>> engines_;
  std::uint32_t window_ = 1;
  std::uint8_t kv_dtype_ = kKVDtypeBFloat16Value, kv_scale_ = kKVScaleNone;
  std::size_t lcm_ = hybrid_test::kBs;
  std::vector<std::vector<TokenId>> docs_ = std::vector<std::vector<TokenId>>(6);
  std::vector<std::vector<TokenId>> recent_;  // prompts run lately
  RequestId next_id_ = 1;
  Clock::time_point now_{};
  RemoteEpisodeResult res_;
};

// One episode of at most max_ops operations (fewer if a fuzz source runs dry), then the drain.
template <typename R>
RemoteEpisodeResult run_remote_episode(R& rng, int hashing, int layout, int max_ops,
                                       const std::string& label) {
  RemoteEpisode<R> episode(rng, hashing, layout, label);
  return episode.run(max_ops);
}

}  // namespace pagedkv::remote_test
