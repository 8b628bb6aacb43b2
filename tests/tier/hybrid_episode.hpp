// tests/tier/hybrid_episode.hpp: seeded or fuzz-driven episodes of the host tier with a hybrid
// model (a sliding-window group beside full attention, of one block size or of different ones:
// kLayouts), checked against a content reference
// independent of pagedkv's hashing: every GPU block and host slot holds a tag of (group, the exact
// token prefix it was computed for), copied as an executor would (copies fail at random); after
// every admission each group must hold the right tag at every position the request's attention
// reads (full attention: all; the window: the window before the computed end), a window group's
// host slots must be exactly its window at the hit's end, every group's host row must cover the
// hit's host tokens at its block size, a hit of groups of different block sizes must be a
// multiple of their least common multiple, a stale host hit must be refused with
// nothing changed, and the tier's invariants must hold. Used by hybrid_tier_test.cpp and
// tests/fuzz/tiered_fuzz.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv::hybrid_test {

// Misuse: `hit` with its first host slot moved to another slot (a stale hit) must be refused
// with the tier exactly as `before`. Calls fail(message) otherwise (fail must not return).
template <class Fail>
void expect_stale_hit_refused(TieredKVCacheManager& t, Request& r, const TieredCacheHit& hit,
                              std::int32_t host_slots, const TieredSnapshot& before, Fail&& fail) {
  TieredCacheHit bad = hit;
  bad.host_slots[0] = bad.host_slots[0] % host_slots + 1;
  bad.host_check = 0;
  bool threw = false;
  try {
    (void)t.allocate_slots(r, r.num_tokens() - bad.num_tokens(), bad);
  } catch (const Error&) {
    threw = true;
  }
  if (!threw) fail("a stale host hit was accepted");
  if (!(t.snapshot() == before)) fail("a refused allocation changed the tier");
}

constexpr std::uint32_t kBs = 4;

// The groups of an episode's model. Layout 0: full attention and a window group, both of kBs
// (the original episodes). Groups of different block sizes (each a multiple of the smallest, as
// 16 and 32): 1: full attention at kBs, the window at 2 * kBs (LCM 2 * kBs); 2: full attention at
// 2 * kBs, the window at kBs (group 0 is not the smallest); 3: full attention at 2 * kBs, a window
// at kBs and one at 4 * kBs (LCM 4 * kBs).
constexpr int kLayouts = 4;

inline std::vector<AttentionSpec> hybrid_groups(std::uint32_t window, int layout) {
  switch (layout) {
    case 1:
      return {AttentionSpec::full(kBs), AttentionSpec::sliding(2 * kBs, window)};
    case 2:
      return {AttentionSpec::full(2 * kBs), AttentionSpec::sliding(kBs, window)};
    case 3:
      return {AttentionSpec::full(2 * kBs), AttentionSpec::sliding(kBs, window),
              AttentionSpec::sliding(4 * kBs, window)};
    default:
      return {AttentionSpec::full(kBs), AttentionSpec::sliding(kBs, window)};
  }
}

// The least common multiple of the layout's block sizes.
inline std::size_t layout_lcm(int layout) {
  return layout == 0 ? kBs : layout == 3 ? 4 * kBs : 2 * kBs;
}

inline KVCacheManagerConfig hybrid_config(std::int32_t num_blocks, std::uint32_t window,
                                          int hashing, int layout = 0) {
  KVCacheManagerConfig c;
  c.num_blocks = num_blocks;
  c.groups = hybrid_groups(window, layout);
  c.hash_seed = "hybrid-tier-test";
  if (hashing == 1) c.hash_scheme = HashScheme::kXxh3_128;
  if (hashing >= 2) {
    c.hasher = BlockHasher::weak_for_testing(
        hashing == 2 ? HashScheme::kSha256 : HashScheme::kXxh3_128, "model", 2);
  }
  return c;
}

inline HostTierConfig host_config(std::int32_t slots, HostPolicy policy,
                                  WindowStoreRule rule = WindowStoreRule::kRequestTail,
                                  int layout = 0) {
  HostTierConfig h;
  h.num_host_blocks = slots;
  h.policy = policy;
  h.group_bytes_per_block = {1000, 10};
  if (layout == 3) h.group_bytes_per_block.push_back(40);
  h.window_store = rule;
  return h;
}

inline std::uint64_t tag_of(std::size_t group, const std::vector<TokenId>& tokens,
                            std::size_t block, std::size_t block_size = kBs) {
  // FNV-1a over (group, tokens of blocks 0 .. block): the exact prefix, no pagedkv hashing.
  std::uint64_t h = 1469598103934665603ull ^ (group + 1);
  for (std::size_t i = 0; i < (block + 1) * block_size; ++i) {
    h = (h ^ static_cast<std::uint64_t>(tokens[i])) * 1099511628211ull;
  }
  return h | 1;  // never 0 (0: nothing written)
}

struct HybridEpisodeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct EpisodeResult {
  std::uint64_t host_hit_tokens = 0, loads = 0, rollbacks = 0;
};

// One episode: `requests` admissions drawn from rng (any uniform random bit generator: seeded in
// the test, the fuzz input's bytes in tests/fuzz/tiered_fuzz.cpp). Throws HybridEpisodeFailure
// naming the first broken check; a valid call that throws escapes as itself.
template <typename Rng>
EpisodeResult run_hybrid_episode(Rng& rng, std::uint64_t seed, int hashing, HostPolicy policy,
                                 int requests = 60, int layout = 0) {
  const auto pick = [&rng](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  const std::uint32_t window = 1 + static_cast<std::uint32_t>(pick(4 * kBs));  // wb 0..4
  const std::int32_t gpu_blocks = 20 + static_cast<std::int32_t>(pick(20));
  const std::int32_t host_slots = 8 + static_cast<std::int32_t>(pick(80));
  TieredKVCacheManager t(
      hybrid_config(gpu_blocks, window, hashing, layout),
      host_config(host_slots, policy,
                  pick(2) == 0 ? WindowStoreRule::kRequestTail : WindowStoreRule::kAll, layout));
  const std::size_t ng = t.gpu().num_groups();
  const std::size_t lcm = layout_lcm(layout);
  // Per group: block size and window in blocks (kFull: full attention).
  constexpr std::size_t kFull = ~std::size_t{0};
  std::vector<std::size_t> gbs(ng), gwb(ng);
  for (std::size_t g = 0; g < ng; ++g) {
    const AttentionSpec& spec = t.gpu().group_spec(g);
    gbs[g] = spec.block_size;
    gwb[g] = spec.kind == AttentionKind::kSlidingWindow ? spec.window_blocks() : kFull;
  }
  std::vector<std::uint64_t> gpu(static_cast<std::size_t>(gpu_blocks), 0);
  std::vector<std::uint64_t> host(static_cast<std::size_t>(host_slots) + 1, 0);
  // Prompts: a few documents (tiny alphabet: colliding contents under weak hashers) grown turn
  // by turn, plus random suffixes.
  std::vector<std::vector<TokenId>> docs(4);
  for (auto& d : docs) {
    for (int i = 0; i < 6 * static_cast<int>(kBs); ++i) d.push_back(static_cast<TokenId>(pick(3)));
  }
  EpisodeResult res;
  const auto fail = [&](const std::string& what) {
    throw HybridEpisodeFailure("seed " + std::to_string(seed) + " hashing " +
                               std::to_string(hashing) + " " + std::string(to_string(policy)) +
                               (layout == 0 ? "" : " layout " + std::to_string(layout)) + ": " +
                               what);
  };
  const auto run_copies = [&](const std::vector<BlockCopy>& copies,
                              const std::vector<TransferId>& ids, bool to_host, double fail_rate) {
    // Committed in a random order (the executor's completion order is the engine's).
    std::vector<std::size_t> order(copies.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
    for (std::size_t k = order.size(); k > 1; --k) std::swap(order[k - 1], order[pick(k)]);
    for (const std::size_t k : order) {
      const bool ok = static_cast<double>(rng() % 1000) >= fail_rate * 1000;
      if (ok) {
        if (to_host) {
          host[static_cast<std::size_t>(copies[k].dst)] =
              gpu[static_cast<std::size_t>(copies[k].src)];
        } else {
          gpu[static_cast<std::size_t>(copies[k].dst)] =
              host[static_cast<std::size_t>(copies[k].src)];
        }
      }
      t.commit(ids[k], ok);
    }
  };
  for (RequestId id = 1; id <= static_cast<RequestId>(requests); ++id) {
    std::vector<TokenId>& doc = docs[pick(docs.size())];
    if (pick(3) == 0) {
      for (std::size_t i = 0; i < 1 + pick(3 * kBs); ++i)
        doc.push_back(static_cast<TokenId>(pick(3)));
    }
    std::vector<TokenId> prompt(
        doc.begin(), doc.begin() + static_cast<std::ptrdiff_t>(
                                       std::max<std::size_t>(1, doc.size() - pick(kBs * 3))));
    if (pick(4) == 0) prompt.push_back(static_cast<TokenId>(pick(3)));
    if (prompt.size() / kBs + 2 > static_cast<std::size_t>(gpu_blocks - 1) / 2) {
      prompt.resize((static_cast<std::size_t>(gpu_blocks - 1) / 2 - 2) * kBs);
    }
    Request r = t.make_request(id, prompt);
    const TieredCacheHit hit = t.get_computed_blocks(r);
    const std::size_t G = hit.gpu.blocks.size();
    const std::size_t h = hit.host_slots.size();
    if (hit.num_tokens() >= prompt.size() && !prompt.empty()) fail("hit covers the last token");
    // Every hit is a multiple of the groups' LCM block size (as the GPU manager clamps it).
    if (hit.gpu.num_tokens % lcm != 0 || hit.num_tokens() % lcm != 0) {
      fail("hit of " + std::to_string(hit.gpu.num_tokens) + " + " +
           std::to_string(hit.num_host_tokens) + " tokens is not a multiple of " +
           std::to_string(lcm));
    }
    if (hit.host_other_groups.size() != ng - 1) fail("host hit without a row per group");
    // Each group's host row covers the host tokens at its block size; loads must be every block
    // for full attention and exactly the window for a window group.
    for (std::size_t g = 0; g < ng; ++g) {
      const std::vector<BlockId>& row = g == 0 ? hit.host_slots : hit.host_other_groups[g - 1];
      const std::size_t bs = gbs[g];
      if (row.size() * bs != hit.num_host_tokens) {
        fail("group " + std::to_string(g) + "'s host row has " + std::to_string(row.size()) +
             " blocks of " + std::to_string(bs) + " for " + std::to_string(hit.num_host_tokens) +
             " host tokens");
      }
      const std::size_t Gg = hit.gpu.num_tokens / bs;
      const std::size_t Lg = hit.num_tokens() / bs;
      for (std::size_t i = 0; i < row.size(); ++i) {
        if (gwb[g] == kFull) {
          if (row[i] == 0) fail("full group without a slot");
        } else if ((row[i] != 0) != (Gg + i + gwb[g] >= Lg)) {
          fail("window slots are not the window");
        }
      }
    }
    const TieredSnapshot before = t.snapshot();
    // Misuse: a stale hit (a host slot moved) is refused with nothing changed.
    if (h > 0 && pick(5) == 0) expect_stale_hit_refused(t, r, hit, host_slots, before, fail);
    auto a = t.allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
    if (!a) {
      if (!(t.snapshot() == before)) fail("a failed allocation changed the tier");
      continue;
    }
    t.check_invariants();  // with the plan's transfers in flight
    res.host_hit_tokens += hit.num_host_tokens;
    res.loads += a->transfers.plan.loads.size();
    run_copies(a->transfers.plan.evictions, a->transfers.eviction_ids, true, 0.1);
    run_copies(a->transfers.plan.loads, a->transfers.load_ids, false, 0.1);
    std::size_t computed = hit.num_tokens();
    std::vector<TierPlan> after;
    after.push_back(std::move(a->transfers));
    if (t.has_unfinished_loads(r.id())) {
      LoadResult lr = t.finish_loads(r);
      computed = lr.num_computed_tokens;
      t.check_invariants();
      if (lr.rolled_back) ++res.rollbacks;
      after.push_back(std::move(lr.transfers));
    }
    // Every position the request's attention reads at `computed` holds its content (a block of
    // a larger block size that holds tokens on both sides of `computed`, after a rollback, too:
    // its first tokens are read).
    for (std::size_t g = 0; g < ng; ++g) {
      const std::size_t bs = gbs[g];
      const std::size_t cb = (computed + bs - 1) / bs;
      const std::span<const BlockId> row = t.gpu().block_ids(r.id(), g);
      const std::size_t from = gwb[g] == kFull ? 0 : (cb > gwb[g] ? cb - gwb[g] : 0);
      for (std::size_t p = from; p < cb; ++p) {
        if (row[p] == kNullBlockId)
          fail("group " + std::to_string(g) + " block " + std::to_string(p) +
               " is null inside the window");
        if (gpu[static_cast<std::size_t>(row[p])] != tag_of(g, prompt, p, bs)) {
          fail("wrong K/V: group " + std::to_string(g) + " block " + std::to_string(p) +
               " (GPU hit " + std::to_string(G) + ", host hit " + std::to_string(h) + ")");
        }
      }
    }
    // The forward pass: blocks [computed, end) of every group written.
    r.set_num_computed_tokens(computed);
    for (std::size_t g = 0; g < ng; ++g) {
      const std::size_t bs = gbs[g];
      const std::span<const BlockId> row = t.gpu().block_ids(r.id(), g);
      for (std::size_t p = computed / bs; p < prompt.size() / bs && p < row.size(); ++p) {
        if (row[p] != kNullBlockId) {
          gpu[static_cast<std::size_t>(row[p])] = tag_of(g, prompt, p, bs);
        }
      }
    }
    r.set_num_computed_tokens(r.num_tokens());
    for (TierPlan& p : after) run_copies(p.plan.stores, p.store_ids, true, 0.1);
    t.free(r);
    t.check_invariants();
  }
  return res;
}

}  // namespace pagedkv::hybrid_test
