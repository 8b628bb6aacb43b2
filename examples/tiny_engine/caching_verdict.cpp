#include "caching_verdict.hpp"

#include <cmath>
#include <stdexcept>

namespace tiny_engine {

std::string to_string(CachingRule rule) {
  return rule == CachingRule::kExact ? "exact" : "near_tie_aware";
}

std::string to_string(CachingDecidedBy by) {
  return by == CachingDecidedBy::kFreeRunning ? "free_running" : "forced";
}

bool needs_forced_run(CachingRule rule, const Comparison& free_running) {
  return rule == CachingRule::kNearTieAware && !free_running.identical_tokens;
}

CachingVerdict judge(CachingRule rule, double tolerance, const Comparison& free_running,
                     const ForcedComparison* forced) {
  if (!std::isfinite(tolerance) || tolerance < 0) {
    throw std::invalid_argument("caching verdict: the tolerance must be finite and >= 0");
  }
  if ((forced != nullptr) != needs_forced_run(rule, free_running)) {
    throw std::invalid_argument(
        forced != nullptr
            ? "caching verdict: a forced comparison given where the rule does not use one"
            : "caching verdict: the streams differ and the near-tie rule needs the forced "
              "comparison");
  }
  CachingVerdict v;
  if (forced == nullptr) {
    v.decided_by = CachingDecidedBy::kFreeRunning;
    v.pass = free_running.identical_tokens && free_running.max_rel_logit_diff <= tolerance;
    if (!v.pass) {
      v.problem = free_running.first_difference.empty() ? "logits differ beyond the tolerance"
                                                        : free_running.first_difference;
      if (!free_running.identical_tokens) v.problem += " (the exact rule takes no divergence)";
    }
    return v;
  }
  v.decided_by = CachingDecidedBy::kForced;
  v.pass = forced->pass(tolerance);
  if (!v.pass) {
    v.problem = "caching off forced onto the caching-on streams: " +
                (forced->first_problem.empty() ? std::string("outside the tolerance")
                                               : forced->first_problem);
  }
  return v;
}

}  // namespace tiny_engine
