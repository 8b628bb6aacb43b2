// Fuzz harness of the host tier: the fuzz input's bytes are the random source of one episode of
// tests/tier/tier_episode.hpp (the tier's configuration, then an engine loop of admissions with
// GPU and host hits, plans executed by the CPU reference executor on real buffers, commits late,
// out of order and failed, finish_loads with rollbacks, free/preempt, and misuse), checked byte
// for byte against a reference independent of pagedkv's hashing and pools, with the tier's
// invariants after every operation and every misuse required to throw pagedkv::Error and change
// nothing. The episode runs until the input ends (at most 4,096 operations), then drains. The
// same bytes then drive two hybrid episodes of tests/tier/hybrid_episode.hpp: a sliding-window
// group beside full attention of one block size, then groups of different block sizes, then a
// remote episode of tests/tier/remote_episode.hpp (a RemoteTier below the host tier of one or two
// engines over a faulty store, fault_store.hpp: zero wrong hits under faults, hostile values and
// colliding keys).
//
// Any failed check, or an exception escaping the episode (a valid call the tier refused), aborts
// with what broke.
//
// Built two ways, as kv_cache_manager_fuzz.cpp: a libFuzzer target with clang's -fsanitize=fuzzer
// (PAGEDKV_LIBFUZZER defined), and a plain program that replays files and directories given on the
// command line, or `--random N` seeded random inputs; ctest runs the latter on
// tests/fuzz/tier_corpus.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <string>

#include "../tier/hybrid_episode.hpp"
#include "../tier/remote_episode.hpp"
#include "../tier/tier_episode.hpp"
#include "fuzz_replay_main.hpp"

namespace {

// A uniform random bit generator reading the input two bytes at a time (zeros once it ends).
class FuzzBytes {
 public:
  using result_type = std::uint16_t;
  FuzzBytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }
  result_type operator()() {
    result_type v = 0;
    for (int k = 0; k < 2; ++k) {
      v = static_cast<result_type>(v << 8);
      if (pos_ < size_) v = static_cast<result_type>(v | data_[pos_++]);
    }
    return v;
  }
  bool exhausted() const { return pos_ >= size_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

constexpr int kMaxOps = 4096;

void run_one(const std::uint8_t* data, std::size_t size) {
  FuzzBytes in(data, size);
  try {
    pagedkv::tier_test::run_tier_episode(in, kMaxOps);
    FuzzBytes hybrid(data, size);
    const int hashing = static_cast<int>(hybrid() % 4);
    const auto policy = static_cast<pagedkv::HostPolicy>(hybrid() % 3);
    pagedkv::hybrid_test::run_hybrid_episode(
        hybrid, 0, hashing, policy, static_cast<int>(std::min<std::size_t>(size / 8, 200)));
    // Then groups of different block sizes (hybrid_episode.hpp's layouts 1-3), from the input
    // read again (the episodes above are unchanged).
    FuzzBytes sizes(data, size);
    const int layout = 1 + static_cast<int>(sizes() % (pagedkv::hybrid_test::kLayouts - 1));
    const int sizes_hashing = static_cast<int>(sizes() % 4);
    const auto sizes_policy = static_cast<pagedkv::HostPolicy>(sizes() % 3);
    pagedkv::hybrid_test::run_hybrid_episode(sizes, 0, sizes_hashing, sizes_policy,
                                             static_cast<int>(std::min<std::size_t>(size / 8, 200)),
                                             layout);
    // Then the remote tier below the host tier over a faulty store (remote_episode.hpp): one or
    // two engines, a layout (one group or hybrid) and a hashing (sha256, xxh3_128, weak) chosen
    // by the input read once more.
    FuzzBytes remote(data, size);
    const int remote_layout = static_cast<int>(remote() % pagedkv::remote_test::kRemoteLayouts);
    const int remote_hashing = static_cast<int>(remote() % 4);
    pagedkv::remote_test::run_remote_episode(remote, remote_hashing, remote_layout,
                                             static_cast<int>(std::min<std::size_t>(size / 4, 400)),
                                             "fuzz");
  } catch (const pagedkv::remote_test::RemoteEpisodeFailure& e) {
    std::fprintf(stderr, "tiered_fuzz: remote check failed: %s\n", e.what());
    std::abort();
  } catch (const pagedkv::hybrid_test::HybridEpisodeFailure& e) {
    std::fprintf(stderr, "tiered_fuzz: hybrid check failed: %s\n", e.what());
    std::abort();
  } catch (const pagedkv::tier_test::EpisodeFailure& e) {
    std::fprintf(stderr, "tiered_fuzz: check failed: %s\n", e.what());
    std::abort();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tiered_fuzz: a valid call threw: %s\n", e.what());
    std::abort();
  }
}

}  // namespace

PAGEDKV_FUZZ_ENTRY_POINTS("tiered_fuzz", run_one, 4096)
