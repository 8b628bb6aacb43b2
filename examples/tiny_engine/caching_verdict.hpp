// tiny_engine/caching_verdict.hpp: the verdict of --compare, prefix caching on against caching
// off on the same workload, from the comparisons the engine measured (a pure function: no run,
// no I/O, so the rule itself is unit-tested on synthetic results).
//
// Two rules:
//   kExact (the CPU path): caching on and off are expected bit-identical there (both walk one
//     query's keys in position order in double), so the greedy token streams must be identical
//     and every step's logits within the tolerance (1e-5 relative). A divergence fails, whatever
//     else was measured.
//   kNearTieAware (the CUDA path): a token's K/V comes from the decode kernel when it was
//     generated and from the extend kernel when caching off recomputes it, and the two round
//     differently (logits within 1e-2, measured up to 8.8e-4 bf16 on an H200). Greedy decoding
//     turns such a difference at a near-tie of the top two logits into a different continuation,
//     after which the free-running runs compare different texts. So:
//       - identical free-running streams: as kExact (logits within the tolerance), no more run;
//       - different streams: caching off is served once more, forced onto the caching-on run's
//         streams (Engine::force_tokens), and the verdict is compare_forced(on, forced_off,
//         tolerance).pass(tolerance): the forced run followed every stream, every step's logits
//         are within the tolerance, and every greedy choice of the caching-on run is the forced
//         run's argmax or within the tolerance of it (a near-tie).
//     The tie tolerance is the logit tolerance (the same single tolerance --check-against-cpu
//     uses). At a step whose logits differ by at most d (relative to max |logit|), the
//     caching-on argmax c and the forced run's argmax b satisfy off[b] - off[c] <=
//     (off[b] - on[b]) + (on[c] - off[c]) <= 2d: a flip the logit tolerance allows has a margin
//     of at most twice it, so a tie tolerance of 2 x tolerance or more would add nothing to the
//     logit check, and one equal to it still rejects flips at margins in (tolerance,
//     2 x tolerance]. A smaller figure would have no basis: the measured rounding (up to 8.8e-4
//     on an H200) can flip a choice at a margin up to twice that, which such a figure could
//     reject although every step agrees within the tolerance.
//
// A forced comparison must be given exactly when needs_forced_run() says so; judge() throws
// std::invalid_argument otherwise, or for a tolerance that is not finite and >= 0. Pure
// functions: thread-safe, no state.
#pragma once

#include <string>

#include "engine.hpp"

namespace tiny_engine {

enum class CachingRule {
  kExact,         // the CPU path: identical streams, logits within the tolerance
  kNearTieAware,  // the CUDA path: as kExact, or a forced run showing only near-tie divergences
};
std::string to_string(CachingRule rule);  // "exact", "near_tie_aware"

// Which comparison decided the verdict.
enum class CachingDecidedBy {
  kFreeRunning,  // the free-running on / off comparison (identical streams, or kExact)
  kForced,       // the caching-off run forced onto the caching-on run's streams
};
std::string to_string(CachingDecidedBy by);  // "free_running", "forced"

struct CachingVerdict {
  bool pass = false;
  CachingDecidedBy decided_by = CachingDecidedBy::kFreeRunning;
  std::string problem;  // why it failed; empty when pass
};

// Whether judge() needs the forced comparison: kNearTieAware and the free-running streams differ.
bool needs_forced_run(CachingRule rule, const Comparison& free_running);

// `free_running`: compare(on, off). `forced`: compare_forced(on, off forced onto on, tolerance),
// non-null exactly when needs_forced_run(rule, free_running).
CachingVerdict judge(CachingRule rule, double tolerance, const Comparison& free_running,
                     const ForcedComparison* forced);

}  // namespace tiny_engine
