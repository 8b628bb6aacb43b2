// tests/tier/tier_episode.hpp: one random episode of an engine driving a TieredKVCacheManager with
// real bytes, checked against a byte-level reference. Shared by the model-based test
// (tiered_model_test.cpp: seeded std::mt19937_64) and the libFuzzer harness (tests/fuzz/
// tiered_fuzz.cpp: the fuzz input's bytes as the random source).
//
// The engine loop moves K/V through the CPU reference executor, with transfers committed late and
// out of order, failed loads and stores, preemption, blocks arriving from below the host tier
// (begin_fill, as RemoteTier does), host slots pinned by a store below (their bytes must not
// change while pinned) and misuse. The KV event stream is checked too: gap-free, and per medium
// exactly the blocks each pool holds cached. The reference is independent of
// pagedkv's hashing and pools: a token's "K/V" is an FNV-1a digest of the tokens up to it, written
// by a fake forward pass; so every hit (GPU or host) and every load is checked byte for byte
// against what the request's prefix must hold, and a rolled-back request's computed length against
// the failures the episode itself injected. After every operation the tier's invariants are
// checked; every misuse must throw pagedkv::Error and leave the tier's snapshot as it was.
//
// A failed check throws EpisodeFailure naming what broke. Any other exception escaping
// run_tier_episode() is a failure too (a valid call the tier refused).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/reference/transfer.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv::tier_test {

struct EpisodeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void require(bool ok, const std::string& what) {
  if (!ok) throw EpisodeFailure(what);
}

constexpr std::size_t kLayers = 2;

struct Running {
  std::unique_ptr<Request> req;
  std::vector<std::uint64_t> value;  // per token: the reference K/V
  TierPlan pending;                  // plans whose stores run after the forward pass
  std::vector<TierPlan> after;       // finish_loads plans (stores) to run after the forward
  bool loading = false;
  std::size_t hit_tokens = 0;
  std::size_t gpu_hit_blocks = 0;
  std::size_t expected_first_failed = 0;  // the lowest chain index the episode failed
  std::size_t num_loads = 0;
  bool forwarded = false;
};

struct PendingCommit {
  TransferId id;
  bool ok;
  RequestId request;
};

inline std::vector<std::uint64_t> reference_values(std::span<const TokenId> tokens) {
  std::vector<std::uint64_t> v(tokens.size());
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    h = (h ^ static_cast<std::uint64_t>(tokens[i])) * 1099511628211ull;
    v[i] = h;
  }
  return v;
}

// The call must throw pagedkv::Error and change nothing observable.
template <typename Call>
void expect_rejected(TieredKVCacheManager& t, const char* what, Call call) {
  const TieredSnapshot before = t.snapshot();
  bool threw = false;
  try {
    call();
  } catch (const Error&) {
    threw = true;
  }
  require(threw, std::string("misuse accepted: ") + what);
  require(t.snapshot() == before, std::string("a rejected call changed the tier: ") + what);
}

// The KV event stream, as a router sees it: gap-free sequence numbers, and, applied per medium,
// exactly the hashes each pool holds cached ("GPU": the manager's pool, "CPU": the host tier's).
class EventModel {
 public:
  void check(TieredKVCacheManager& t) {
    for (const KVEvent& e : t.take_events()) {
      require(e.seq == next_seq_,
              "event seq " + std::to_string(e.seq) + ", expected " + std::to_string(next_seq_));
      ++next_seq_;
      if (const auto* s = std::get_if<BlockStored>(&e.data)) {
        for (const BlockHash& h : s->block_hashes) medium(s->medium).insert(h);
      } else if (const auto* r = std::get_if<BlockRemoved>(&e.data)) {
        std::multiset<BlockHash>& m = medium(r->medium);
        for (const BlockHash& h : r->block_hashes) {
          const auto it = m.find(h);
          require(it != m.end(), "BlockRemoved (" + r->medium + ") of a block never stored");
          m.erase(it);
        }
      } else {
        gpu_.clear();
        host_.clear();
      }
    }
    require(gpu_ == cached(t.gpu().block_pool()),
            "the GPU events disagree with the GPU pool's cached blocks");
    require(host_ == cached(t.host_pool()),
            "the CPU events disagree with the host tier's cached blocks");
  }

 private:
  std::multiset<BlockHash>& medium(const std::string& name) {
    require(name == "GPU" || name == "CPU", "an event with medium \"" + name + "\"");
    return name == "GPU" ? gpu_ : host_;
  }
  static std::multiset<BlockHash> cached(const BlockPool& pool) {
    std::multiset<BlockHash> m;
    for (BlockId b = 0; b < pool.num_blocks(); ++b) {
      const KVCacheBlock& blk = pool.block(b);
      if (!blk.is_null && blk.is_cached()) m.insert(blk.block_hash);
    }
    return m;
  }

  std::uint64_t next_seq_ = 0;
  std::multiset<BlockHash> gpu_, host_;
};

// The engine's buffers and the tier. R: a uniform random bit generator.
template <typename R>
class Sim {
 public:
  Sim(R& rng, std::uint32_t bs, std::int32_t gpu_blocks, std::int32_t host_blocks,
      HostPolicy policy, std::uint32_t selective_hits, bool layer_first, bool gpu_verify,
      int hashing = 0)
      : rng_(rng), bs_(bs), gpu_blocks_(gpu_blocks), host_blocks_(host_blocks) {
    KVCacheManagerConfig c;
    c.num_blocks = gpu_blocks;
    c.block_size = bs;
    c.hash_seed = "model";
    // 0: sha256; 1: xxh3_128 (prefix identities in the host tier); 2, 3: weak test hashers
    // (sha256, xxh3_128 cut to 2 bits: forced collisions everywhere; a wrong hit, GPU or host,
    // is caught by the byte-level reference).
    if (hashing == 1) c.hash_scheme = HashScheme::kXxh3_128;
    if (hashing >= 2) {
      c.hasher = BlockHasher::weak_for_testing(
          hashing == 2 ? HashScheme::kSha256 : HashScheme::kXxh3_128, "model", 2);
    }
    // Without verification the GPU pool keeps no material and the tier records each cached
    // block's content itself; with it, the tier reads the pool's material when it evicts.
    c.verify_cache_hits = gpu_verify;
    c.enable_kv_events = true;
    HostTierConfig h;
    h.num_host_blocks = host_blocks;
    h.policy = policy;
    h.selective_hits = selective_hits;
    tier_ = std::make_unique<TieredKVCacheManager>(c, h);
    const std::size_t chunk = bs * sizeof(std::uint64_t);
    layout_ = layer_first ? TransferLayout::layer_first(kLayers, chunk,
                                                        static_cast<std::size_t>(gpu_blocks))
                          : TransferLayout::block_first(kLayers, chunk);
    device_.assign(static_cast<std::size_t>(gpu_blocks) * layout_.block_bytes(), std::byte{0});
    host_.assign(static_cast<std::size_t>(host_blocks + 1) * layout_.block_bytes(), std::byte{0});
  }

  TieredKVCacheManager& tier() { return *tier_; }

  // Token p's value in layer l of GPU block b / host slot s.
  std::uint64_t* dev(BlockId b, std::size_t l, std::size_t off) {
    return reinterpret_cast<std::uint64_t*>(device_.data() + b * layout_.device_block_stride +
                                            l * layout_.device_layer_stride) +
           off;
  }
  std::uint64_t* hst(BlockId s, std::size_t l, std::size_t off) {
    return reinterpret_cast<std::uint64_t*>(host_.data() + s * layout_.block_bytes() +
                                            l * layout_.chunk_bytes) +
           off;
  }
  // A failed copy leaves garbage where it wrote (never the value the reference expects: it is
  // flipped from what was there).
  void corrupt_device(BlockId b) {
    for (std::size_t l = 0; l < kLayers; ++l)
      for (std::size_t o = 0; o < bs_; ++o)
        *dev(b, l, o) ^= 1 | (static_cast<std::uint64_t>(rng_()) << 1);
  }
  void corrupt_host(BlockId s) {
    for (std::size_t l = 0; l < kLayers; ++l)
      for (std::size_t o = 0; o < bs_; ++o)
        *hst(s, l, o) ^= 1 | (static_cast<std::uint64_t>(rng_()) << 1);
  }

  void execute(TransferPlan& plan, TransferStage stage) {
    reference::execute_transfer_plan(plan, stage, layout_, device_,
                                     static_cast<std::size_t>(gpu_blocks_), host_,
                                     static_cast<std::size_t>(host_blocks_ + 1));
  }

 private:
  R& rng_;
  std::uint32_t bs_;
  std::int32_t gpu_blocks_, host_blocks_;
  std::unique_ptr<TieredKVCacheManager> tier_;
  TransferLayout layout_;
  std::vector<std::byte> device_, host_;
};

// Whether the random source has run dry (a fuzz input's end); a PRNG never does.
template <typename R>
bool source_exhausted(const R& rng) {
  if constexpr (requires { rng.exhausted(); }) {
    return rng.exhausted();
  } else {
    return false;
  }
}

// Runs one episode of at most max_ops operations (fewer if the source runs dry), then drains:
// every transfer committed, every request freed. Throws EpisodeFailure on a failed check.
// sabotage_stores (to show that the checks can fail): stores and evictions committed done have
// their host slots corrupted, as by a copy that wrote garbage and reported success.
template <typename R>
void run_tier_episode(R& rng, int max_ops, bool sabotage_stores = false) {
  const std::uint32_t bs = 1 + static_cast<std::uint32_t>(rng() % 4);
  const auto gpu_blocks = static_cast<std::int32_t>(6 + rng() % 12);
  const auto host_blocks = static_cast<std::int32_t>(1 + rng() % 24);
  const auto policy = static_cast<HostPolicy>(rng() % 3);
  const auto selective_hits = 1 + static_cast<std::uint32_t>(rng() % 2);
  const bool layer_first = rng() % 2 == 0;
  // Hashing: sha256 half the time, else xxh3_128 or a weak (colliding) test hasher; those
  // always verify GPU hits (an unverified weak hasher would hit wrongly by design).
  const int hashing = rng() % 2 == 0 ? 0 : 1 + static_cast<int>(rng() % 3);
  const bool gpu_verify = hashing != 0 || rng() % 4 != 0;
  // Some requests carry extra keys (a LoRA name): the tier keeps them for its stores.
  const bool with_keys = rng() % 3 == 0;
  Sim<R> sim(rng, bs, gpu_blocks, host_blocks, policy, selective_hits, layer_first, gpu_verify,
             hashing);
  TieredKVCacheManager& t = sim.tier();

  // A few shared prefixes, so that hits are common.
  std::vector<std::vector<TokenId>> prefixes(3);
  for (auto& p : prefixes) {
    p.resize(bs * (1 + rng() % 4));
    for (auto& tok : p) tok = static_cast<TokenId>(rng() % 5);
  }
  std::map<RequestId, Running> running;
  std::vector<PendingCommit> pending;  // request 0: a fill (no request's)
  struct Pinned {
    BlockId slot;
    std::vector<std::uint64_t> bytes;  // the slot's K/V when pinned: must not change
  };
  std::vector<Pinned> pinned;  // pin_host_slot() (a store below the host reads the slot)
  auto slot_bytes = [&](BlockId s) {
    std::vector<std::uint64_t> v;
    for (std::size_t l = 0; l < kLayers; ++l)
      for (std::size_t o = 0; o < bs; ++o) v.push_back(*sim.hst(s, l, o));
    return v;
  };
  RequestId next_fill_id = 1000000;
  EventModel events;
  std::vector<TransferId> committed;
  RequestId next_id = 1;
  const unsigned fail_percent = (rng() % 3 == 0) ? 0 : 15;
  auto fails = [&] { return rng() % 100 < fail_percent; };

  // Schedules the commits of copies the engine has run.
  auto queue_commits = [&](const std::vector<TransferId>& ids, const std::vector<BlockCopy>& copies,
                           bool host_dst, RequestId r) {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const bool ok = !fails();
      if (!ok || (sabotage_stores && host_dst)) {
        if (host_dst)
          sim.corrupt_host(copies[i].dst);
        else
          sim.corrupt_device(copies[i].dst);
      }
      pending.push_back({ids[i], ok, r});
    }
  };

  // A plan's stage run a second time must be refused.
  auto expect_stage_refused = [&](TransferPlan& plan, TransferStage stage) {
    bool threw = false;
    try {
      sim.execute(plan, stage);
    } catch (const Error&) {
      threw = true;
    }
    require(threw, "a plan's stage executed twice was accepted");
  };
  // A prompt: one of the shared prefixes, then up to 2 blocks + 1 tokens of its own.
  auto random_prompt = [&] {
    std::vector<TokenId> prompt = prefixes[rng() % prefixes.size()];
    const std::size_t extra = rng() % (2 * bs + 2);
    for (std::size_t i = 0; i < extra; ++i) prompt.push_back(static_cast<TokenId>(rng() % 5));
    return prompt;
  };

  // The forward pass: writes the K/V of tokens [num_computed, upto) and checks every earlier one.
  auto forward = [&](Running& run, std::size_t upto) {
    Request& r = *run.req;
    const auto table = t.block_ids(r.id());
    for (std::size_t p = 0; p < upto; ++p) {
      const BlockId b = table[p / bs];
      for (std::size_t l = 0; l < kLayers; ++l) {
        std::uint64_t* slot = sim.dev(b, l, p % bs);
        if (p < r.num_computed_tokens()) {
          require(*slot == (run.value[p] ^ l), "token " + std::to_string(p) + " of request " +
                                                   std::to_string(r.id()) +
                                                   " holds K/V it was never given");
        } else {
          *slot = run.value[p] ^ l;
        }
      }
    }
    r.set_num_computed_tokens(upto);
    sim.execute(run.pending.plan, TransferStage::kAfterForward);
    queue_commits(run.pending.store_ids, run.pending.plan.stores, true, r.id());
    for (TierPlan& p : run.after) {
      sim.execute(p.plan, TransferStage::kAfterForward);
      queue_commits(p.store_ids, p.plan.stores, true, r.id());
      expect_stage_refused(p.plan, TransferStage::kAfterForward);
    }
    run.after.clear();
    run.forwarded = true;
  };

  for (int op = 0; op < max_ops && !source_exhausted(rng); ++op) {
    const int kind = static_cast<int>(rng() % 13);
    if (kind <= 2) {  // admit a new request
      std::vector<TokenId> prompt = random_prompt();
      if (prompt.empty()) prompt.push_back(1);
      Running run;
      RequestHashKeys keys;
      if (with_keys && rng() % 2 == 0) keys.lora_name = rng() % 2 == 0 ? "a" : "b";
      run.req = std::make_unique<Request>(t.make_request(next_id++, prompt, std::move(keys)));
      run.value = reference_values(prompt);
      Request& r = *run.req;
      const TieredCacheHit hit = t.get_computed_blocks(r);
      require(hit.num_tokens() <= r.num_tokens() - 1, "the hit is not capped at num_tokens - 1");
      // Every host hit names a slot holding exactly that block's K/V.
      for (std::size_t i = 0; i < hit.host_slots.size(); ++i) {
        const std::size_t blk = hit.gpu.blocks.size() + i;
        for (std::size_t l = 0; l < kLayers; ++l)
          for (std::size_t o = 0; o < bs; ++o)
            require(*sim.hst(hit.host_slots[i], l, o) == (run.value[blk * bs + o] ^ l),
                    "host slot " + std::to_string(hit.host_slots[i]) +
                        " is a hit for content it does not hold");
      }
      auto alloc = t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
      t.check_invariants();
      if (!alloc) continue;
      sim.execute(alloc->transfers.plan, TransferStage::kBeforeForward);
      expect_stage_refused(alloc->transfers.plan, TransferStage::kBeforeForward);
      queue_commits(alloc->transfers.eviction_ids, alloc->transfers.plan.evictions, true, r.id());
      run.num_loads = hit.host_slots.size();
      run.expected_first_failed = run.num_loads;
      for (std::size_t i = 0; i < alloc->transfers.load_ids.size(); ++i) {
        const bool ok = !fails();
        if (!ok) {
          sim.corrupt_device(alloc->transfers.plan.loads[i].dst);
          run.expected_first_failed = std::min(run.expected_first_failed, i);
        }
        pending.push_back({alloc->transfers.load_ids[i], ok, r.id()});
      }
      run.loading = run.num_loads > 0;
      run.gpu_hit_blocks = hit.gpu.blocks.size();
      run.hit_tokens = hit.num_tokens();
      run.pending = std::move(alloc->transfers);
      const RequestId id = r.id();
      running.emplace(id, std::move(run));
      Running& placed = running.at(id);
      if (!placed.loading) {
        placed.req->set_num_computed_tokens(placed.hit_tokens);
        forward(placed, placed.req->num_tokens());
      }
    } else if (kind <= 5 && !pending.empty()) {  // commit one transfer, any order
      const std::size_t i = rng() % pending.size();
      const PendingCommit pc = pending[i];
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      t.commit(pc.id, pc.ok);
      committed.push_back(pc.id);
    } else if (kind == 6) {          // finish loads of a request whose loads are all committed
      for (auto& entry : running) {  // (no structured bindings: lambdas capture these)
        const RequestId id = entry.first;
        Running& run = entry.second;
        if (!run.loading) continue;
        const bool in_flight = std::any_of(pending.begin(), pending.end(), [&](const auto& p) {
          return p.request == id && t.has_unfinished_loads(id) &&
                 std::find(run.pending.load_ids.begin(), run.pending.load_ids.end(), p.id) !=
                     run.pending.load_ids.end();
        });
        if (in_flight) {
          expect_rejected(t, "finish_loads with loads in flight",
                          [&] { t.finish_loads(*run.req); });
          continue;
        }
        LoadResult res = t.finish_loads(*run.req);
        const std::size_t expect =
            (run.gpu_hit_blocks + run.expected_first_failed) * static_cast<std::size_t>(bs);
        require(res.num_computed_tokens == expect, "rollback point " +
                                                       std::to_string(res.num_computed_tokens) +
                                                       ", expected " + std::to_string(expect));
        require(res.rolled_back == (run.expected_first_failed < run.num_loads),
                "rolled_back disagrees with the failures injected");
        run.loading = false;
        {  // A request scheduled now hits only written K/V: never a block whose load failed.
          // (Without a failure, this request's new-token blocks are cached before the forward
          // pass that writes them, as in vLLM: the same batch writes them first.)
          Request probe = t.make_request(100000 + id, run.req->tokens());
          const TieredCacheHit ph = t.get_computed_blocks(probe);
          const auto table = t.block_ids(id);
          for (std::size_t j = 0; j < ph.gpu.blocks.size(); ++j) {
            const bool own_unwritten =
                j * bs >= expect && j < table.size() && table[j] == ph.gpu.blocks[j];
            if (own_unwritten) {
              require(!res.rolled_back, "a block after a failed load is hit-able");
              continue;
            }
            for (std::size_t o = 0; o < bs; ++o) {
              require(*sim.dev(ph.gpu.blocks[j], 0, o) == run.value[j * bs + o],
                      "GPU hit block " + std::to_string(j) + " holds the wrong K/V");
            }
          }
        }
        run.req->set_num_computed_tokens(res.num_computed_tokens);
        run.after.push_back(std::move(res.transfers));
        if (res.rolled_back) {  // recompute from the failure: one more allocation, no hit
          auto again = t.allocate_slots(*run.req, run.req->num_tokens() - expect);
          require(again.has_value(), "the recompute after a rollback found no room");
          require(again->new_blocks.empty(), "the recompute allocated blocks it already holds");
          sim.execute(again->transfers.plan, TransferStage::kBeforeForward);
          queue_commits(again->transfers.eviction_ids, again->transfers.plan.evictions, true, id);
          run.after.push_back(std::move(again->transfers));
        }
        forward(run, run.req->num_tokens());
        break;
      }
    } else if (kind <= 8 && !running.empty()) {  // free or preempt a running request
      auto it = running.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % running.size()));
      const RequestId id = it->first;
      // Stores planned for after a forward pass that has not run are in flight too.
      bool busy = std::any_of(pending.begin(), pending.end(),
                              [&](const auto& p) { return p.request == id; });
      if (!it->second.forwarded) {
        busy = busy || !it->second.pending.store_ids.empty();
        for (const TierPlan& p : it->second.after) busy = busy || !p.store_ids.empty();
      }
      if (busy) {
        expect_rejected(t, "free with transfers in flight", [&] { t.free(*it->second.req); });
        expect_rejected(t, "preempt with transfers in flight", [&] { t.preempt(*it->second.req); });
        continue;
      }
      if (rng() % 2) {
        t.free(*it->second.req);
      } else {
        t.preempt(*it->second.req);
      }
      running.erase(it);
    } else if (kind == 9 && !committed.empty()) {  // misuse: commit twice
      const TransferId id = committed[rng() % committed.size()];
      expect_rejected(t, "a transfer committed twice", [&] { t.commit(id, true); });
    } else if (kind == 10) {  // misuse: unknown ids, calls out of order
      const auto which = rng() % 3;
      if (which == 0) {  // a transfer id never handed out (generation far ahead)
        const TransferId id = (TransferId{0x7fff0000u + rng() % 7} << 32) | (rng() % 64);
        expect_rejected(t, "an unknown transfer id", [&] { t.commit(id, rng() % 2 == 0); });
      } else if (!running.empty()) {
        auto it = running.begin();
        std::advance(it, static_cast<std::ptrdiff_t>(rng() % running.size()));
        Running& run = it->second;
        if (run.loading) {  // allocating again before the loads are finished
          expect_rejected(t, "allocate_slots with loads unfinished",
                          [&] { (void)t.allocate_slots(*run.req, 1); });
        } else {  // no loads to finish
          expect_rejected(t, "finish_loads without loads", [&] { (void)t.finish_loads(*run.req); });
        }
      }
    } else if (kind == 11) {  // a block arriving from below the host tier (a remote fill)
      std::vector<TokenId> prompt = random_prompt();
      const std::size_t full = prompt.size() / bs;
      const Request src = t.make_request(next_fill_id++, prompt);
      if (full == 0 || rng() % 8 == 0) {  // misuse: not a full block of the request
        expect_rejected(t, "begin_fill of a block the request does not have",
                        [&] { (void)t.begin_fill(src, full); });
      } else {
        const std::size_t index = rng() % full;
        const std::optional<HostFill> fill = t.begin_fill(src, index);
        if (fill) {  // (std::nullopt: every host slot pinned, a normal outcome)
          // The engine writes the block's K/V into the slot, then commits (late).
          const std::vector<std::uint64_t> value = reference_values(prompt);
          for (std::size_t l = 0; l < kLayers; ++l)
            for (std::size_t o = 0; o < bs; ++o)
              *sim.hst(fill->slot, l, o) = value[index * bs + o] ^ l;
          const bool ok = !fails();
          if (!ok || sabotage_stores) sim.corrupt_host(fill->slot);
          pending.push_back({fill->id, ok, 0});
        }
      }
    } else if (kind == 12) {  // pin a cached host slot, or unpin one
      if (!pinned.empty() && rng() % 2 == 0) {
        const std::size_t i = rng() % pinned.size();
        require(slot_bytes(pinned[i].slot) == pinned[i].bytes,
                "pinned host slot " + std::to_string(pinned[i].slot) + " was overwritten");
        t.unpin_host_slot(pinned[i].slot);
        pinned.erase(pinned.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        const auto slot = static_cast<BlockId>(1 + rng() % static_cast<std::uint64_t>(host_blocks));
        const bool ours = std::any_of(pinned.begin(), pinned.end(),
                                      [&](const Pinned& p) { return p.slot == slot; });
        if (!ours && rng() % 4 == 0) {
          expect_rejected(t, "unpinning a slot that is not pinned",
                          [&] { t.unpin_host_slot(slot); });
        } else if (t.host_pool().block(slot).is_cached()) {
          t.pin_host_slot(slot);
          pinned.push_back({slot, slot_bytes(slot)});
        } else {
          expect_rejected(t, "pinning a slot that holds no cached block",
                          [&] { t.pin_host_slot(slot); });
        }
      }
    }
    t.check_invariants();
    events.check(t);
  }
  // Drain: every transfer committed, every request freed, every pin released; the host keeps
  // what it was given.
  for (const auto& pc : pending) t.commit(pc.id, pc.ok);
  // A request whose forward pass never ran abandons the stores planned after it (their copies
  // never ran: committed as failed).
  for (auto& [id, run] : running) {
    if (run.loading) {
      LoadResult res = t.finish_loads(*run.req);
      for (const TransferId s : res.transfers.store_ids) t.commit(s, false);
    }
    if (!run.forwarded) {
      for (const TransferId s : run.pending.store_ids) t.commit(s, false);
      for (const TierPlan& p : run.after)
        for (const TransferId s : p.store_ids) t.commit(s, false);
    }
    t.free(*run.req);
  }
  for (const Pinned& p : pinned) {
    require(slot_bytes(p.slot) == p.bytes,
            "pinned host slot " + std::to_string(p.slot) + " was overwritten");
    t.unpin_host_slot(p.slot);
  }
  t.check_invariants();
  events.check(t);
  require(t.num_in_flight() == 0, "transfers in flight after the drain");
  require(t.stats().host_slots_pinned == 0, "host slots pinned after the drain");
}

}  // namespace pagedkv::tier_test
