// Randomized model-based test of the host tier with real bytes: seeded episodes of
// tier_episode.hpp (an engine loop that moves K/V through the CPU reference executor, with
// transfers committed late and out of order, failed loads and stores, preemption and misuse,
// checked byte for byte against a reference independent of pagedkv's hashing and pools, the
// tier's invariants after every operation), hybrid episodes (hybrid_episode.hpp), and remote
// episodes (remote_episode.hpp: a RemoteTier below the host tier over a faulty store, zero wrong
// hits under faults, hostile values and colliding keys). tests/fuzz/tiered_fuzz.cpp drives the
// same episodes from fuzz inputs.
//
// Flags (after the gtest ones), for the CI stress stage: --pagedkv_episodes=N episodes (seeds
// 1..N, default 400), --pagedkv_seconds=S a time budget for the whole program (default: none),
// split evenly across the kBudgetedTests tests that take it; the program prints how many
// episodes each ran. The budget never stops a test before the default's seeds
// (kDefaultEpisodes): a budgeted run checks all that the default run checks, and more (CI's
// sanitizer stage runs this program only as the stress run, .ci/run).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "hybrid_episode.hpp"
#include "remote_episode.hpp"
#include "stress_flags.hpp"
#include "tier_episode.hpp"

namespace pagedkv {

constexpr std::uint64_t kDefaultEpisodes = 400;
std::uint64_t g_episodes = kDefaultEpisodes;
double g_seconds = 0;  // 0: no time budget

namespace {

// The tests below that stop at their share of --pagedkv_seconds.
constexpr int kBudgetedTests = 4;

// After seed `seed` of a test whose default run takes seeds 1..default_seeds: only past those.
bool budget_spent(std::chrono::steady_clock::time_point start, std::uint64_t seed,
                  std::uint64_t default_seeds) {
  if (g_seconds <= 0 || seed < default_seeds) return false;
  const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
  return spent.count() >= g_seconds / kBudgetedTests;
}

constexpr int kOpsPerEpisode = 220;

TEST(TieredModel, RandomEpisodesAgainstByteLevelReference) {
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t ran = 0;
  for (std::uint64_t seed = 1; seed <= g_episodes; ++seed) {
    std::mt19937_64 rng(seed);
    ++ran;
    try {
      tier_test::run_tier_episode(rng, kOpsPerEpisode);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "seed " << seed << ": " << e.what();
      break;
    }
    if (budget_spent(start, seed, kDefaultEpisodes)) break;
  }
  std::printf("tiered_model: %llu episodes\n", static_cast<unsigned long long>(ran));
}

// Hybrid models (a sliding-window group beside full attention; hybrid_episode.hpp): the same
// seeds, each with every hashing (sha256, xxh3_128, weak sha256, weak xxh3_128) in turn and the
// three policies by seed.
TEST(TieredModel, HybridEpisodesAgainstContentReference) {
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t ran = 0;
  for (std::uint64_t seed = 1; seed <= g_episodes / 4; ++seed) {
    for (int hashing = 0; hashing < 4; ++hashing) {
      std::mt19937_64 rng(seed * 4 + static_cast<std::uint64_t>(hashing));
      ++ran;
      try {
        hybrid_test::run_hybrid_episode(rng, seed, hashing, static_cast<HostPolicy>(seed % 3));
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        return;
      }
    }
    if (budget_spent(start, seed, kDefaultEpisodes / 4)) break;
  }
  std::printf("tiered_model: %llu hybrid episodes\n", static_cast<unsigned long long>(ran));
}

// Hybrid models of groups of different block sizes (hybrid_episode.hpp's layouts 1-3: 4 and 8
// tokens either way round, and three groups of 8, 4 and 16): the same checks plus the hit a
// multiple of the groups' LCM block size and every group's host row at its own block size; per
// seed each layout with one hashing (rotating) and the policies by seed.
TEST(TieredModel, HybridEpisodesOfDifferentBlockSizesAgainstContentReference) {
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t ran = 0;
  for (std::uint64_t seed = 1; seed <= g_episodes / 4; ++seed) {
    for (int layout = 1; layout < hybrid_test::kLayouts; ++layout) {
      const int hashing = static_cast<int>((seed + static_cast<std::uint64_t>(layout)) % 4);
      std::mt19937_64 rng(seed * 16 + static_cast<std::uint64_t>(layout) + 1000000);
      ++ran;
      try {
        hybrid_test::run_hybrid_episode(rng, seed, hashing, static_cast<HostPolicy>(seed % 3), 60,
                                        layout);
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        return;
      }
    }
    if (budget_spent(start, seed, kDefaultEpisodes / 4)) break;
  }
  std::printf("tiered_model: %llu hybrid episodes of different block sizes\n",
              static_cast<unsigned long long>(ran));
}

// The remote tier below the host tier (remote_episode.hpp): one or two engines, each a tier + a
// RemoteTier over a FaultStore (fault_store.hpp: errors, timeouts, a full store, full queues, late
// and reordered completions, evictions between probe and get, hostile values), both stores on one
// backend. Per seed every layout (one group of two block sizes, full + window, groups of different
// block sizes) with one hashing each (rotating over sha256, xxh3_128 and the weak test hashers
// whose keys collide). Zero wrong hits: every block a request reads after its loads holds its own
// prefix's words. The sums show that the paths were taken: remote loads under every hashing,
// values rejected, fills shared between requests, hostile values injected.
TEST(TieredModel, RemoteTierEpisodesOverAFaultyStore) {
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t ran = 0;
  remote_test::RemoteEpisodeResult sum;
  std::uint64_t loaded_by_hashing[4] = {0, 0, 0, 0};
  std::uint64_t loaded_by_layout[remote_test::kRemoteLayouts] = {};
  for (std::uint64_t seed = 1; seed <= g_episodes / 2; ++seed) {
    for (int layout = 0; layout < remote_test::kRemoteLayouts; ++layout) {
      const int hashing = static_cast<int>((seed + static_cast<std::uint64_t>(layout)) % 4);
      std::mt19937_64 rng(seed * 16 + static_cast<std::uint64_t>(layout) + 2000000);
      ++ran;
      try {
        const remote_test::RemoteEpisodeResult r = remote_test::run_remote_episode(
            rng, hashing, layout, 300, "seed " + std::to_string(seed));
        sum.requests += r.requests;
        sum.loaded_blocks += r.loaded_blocks;
        sum.rejected_values += r.rejected_values;
        sum.fills_shared += r.fills_shared;
        sum.stored_blocks += r.stored_blocks;
        sum.puts_failed += r.puts_failed;
        sum.hostile += r.hostile;
        sum.remote_hit_tokens += r.remote_hit_tokens;
        sum.probed_blocks += r.probed_blocks;
        sum.probe_hit_blocks += r.probe_hit_blocks;
        sum.fills += r.fills;
        sum.fills_refused += r.fills_refused;
        sum.fills_no_slot += r.fills_no_slot;
        sum.host_hit_tokens += r.host_hit_tokens;
        loaded_by_hashing[hashing] += r.loaded_blocks;
        loaded_by_layout[layout] += r.loaded_blocks;
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        return;
      }
    }
    if (budget_spent(start, seed, kDefaultEpisodes / 2)) break;
  }
  std::printf(
      "remote: probed %llu, present %llu, fills %llu, refused %llu, no slot %llu, host hit "
      "tokens %llu\n",
      static_cast<unsigned long long>(sum.probed_blocks),
      static_cast<unsigned long long>(sum.probe_hit_blocks),
      static_cast<unsigned long long>(sum.fills),
      static_cast<unsigned long long>(sum.fills_refused),
      static_cast<unsigned long long>(sum.fills_no_slot),
      static_cast<unsigned long long>(sum.host_hit_tokens));
  std::printf(
      "tiered_model: %llu remote episodes, %llu requests, %llu blocks loaded from the store, "
      "%llu values rejected, %llu fills shared, %llu stored, %llu puts failed, %llu hostile\n",
      static_cast<unsigned long long>(ran), static_cast<unsigned long long>(sum.requests),
      static_cast<unsigned long long>(sum.loaded_blocks),
      static_cast<unsigned long long>(sum.rejected_values),
      static_cast<unsigned long long>(sum.fills_shared),
      static_cast<unsigned long long>(sum.stored_blocks),
      static_cast<unsigned long long>(sum.puts_failed),
      static_cast<unsigned long long>(sum.hostile));
  if (g_episodes / 2 >= 16) {  // enough episodes for every path
    for (int h = 0; h < 4; ++h) EXPECT_GT(loaded_by_hashing[h], 0u) << "hashing " << h;
    for (int l = 0; l < remote_test::kRemoteLayouts; ++l)
      EXPECT_GT(loaded_by_layout[l], 0u) << "layout " << l;
    EXPECT_GT(sum.rejected_values, 0u);
    EXPECT_GT(sum.fills_shared, 0u);
    EXPECT_GT(sum.puts_failed, 0u);
    EXPECT_GT(sum.hostile, 0u);
  }
}

// The checks can fail: when the engine commits stores as done whose bytes it corrupted (a copy
// that "succeeded" but wrote garbage), the byte-level reference must catch a hit on such a slot.
TEST(TieredModel, TheReferenceCatchesStoresThatWroteGarbage) {
  int caught = 0;
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 rng(seed);
    try {
      tier_test::run_tier_episode(rng, kOpsPerEpisode, /*sabotage_stores=*/true);
    } catch (const tier_test::EpisodeFailure& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("K/V") != std::string::npos ||
                  what.find("does not hold") != std::string::npos)
          << "seed " << seed << ": " << what;
      ++caught;
    }
  }
  std::printf("sabotaged stores: %d of 200 episodes caught\n", caught);
  EXPECT_GT(caught, 20) << "corrupted host slots went unnoticed";
}

}  // namespace
}  // namespace pagedkv

int main(int argc, char** argv) {
  return pagedkv::testing_util::run_with_stress_flags(argc, argv, "episodes", pagedkv::g_episodes,
                                                      pagedkv::g_seconds);
}
