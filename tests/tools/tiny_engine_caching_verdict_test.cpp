// The tiny engine's --compare verdict (examples/tiny_engine/caching_verdict.hpp) on synthetic
// runs: each case builds the caching-on, caching-off and forced caching-off results by hand,
// measures them with the engine's own compare() / compare_forced(), and judges them. The exact
// rule (CPU) never takes a divergence; the near-tie aware rule (CUDA) takes one only when the
// forced run followed and every divergence is a near-tie within the tolerance.
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "caching_verdict.hpp"
#include "engine.hpp"

namespace tiny_engine {
namespace {

constexpr double kTolerance = 1e-2;

using Step = std::vector<float>;  // one generated token's logits over a small vocabulary

// A free-running request: each token is its step's argmax (first maximum, as the engine samples).
RequestResult greedy(pagedkv::RequestId id, std::initializer_list<Step> steps) {
  RequestResult r;
  r.id = id;
  for (const Step& s : steps) {
    std::size_t best = 0;
    for (std::size_t j = 1; j < s.size(); ++j) {
      if (s[j] > s[best]) best = j;
    }
    r.output.push_back(static_cast<pagedkv::TokenId>(best));
    r.logits.insert(r.logits.end(), s.begin(), s.end());
  }
  return r;
}

// A teacher-forced request: the tokens are given, the logits are what its model computed.
RequestResult forced_onto(const RequestResult& reference, std::initializer_list<Step> steps) {
  RequestResult r;
  r.id = reference.id;
  r.output = reference.output;
  for (const Step& s : steps) r.logits.insert(r.logits.end(), s.begin(), s.end());
  return r;
}

RunResult run_of(std::initializer_list<RequestResult> requests) {
  RunResult r;
  r.requests = requests;
  return r;
}

// Request 0 agrees everywhere; request 1 meets its second step at a near-tie of tokens 0 and 1
// (caching on chooses 0 by 1e-5 relative).
const Step kStep0{1.0f, 2.0f, 9.0f, 3.0f};  // argmax 2, far from a tie
const Step kOnTie{10.0f, 9.9999f, 0.0f, 1.0f};

struct Runs {
  RunResult on;
  RunResult off;     // free-running caching off
  RunResult forced;  // caching off forced onto on's streams
};

// Diverging runs: at request 1's second step caching on sees `on_tie` and chooses token 0,
// caching off sees `forced_tie`, chooses token 1 and goes its own way.
Runs diverging(const Step& forced_tie, const Step& on_tie = kOnTie) {
  Runs r;
  const RequestResult on1 = greedy(1, {kStep0, on_tie, {0.0f, 5.0f, 1.0f, 2.0f}});
  r.on = run_of({greedy(0, {kStep0, kStep0}), on1});
  // Free-running caching off chose forced_tie's argmax and continued from there.
  r.off = run_of(
      {greedy(0, {kStep0, kStep0}), greedy(1, {kStep0, forced_tie, {7.0f, 1.0f, 0.5f, 2.0f}})});
  r.forced = run_of({forced_onto(r.on.requests[0], {kStep0, kStep0}),
                     forced_onto(on1, {kStep0, forced_tie, {0.0f, 5.0001f, 1.0f, 2.0f}})});
  return r;
}

CachingVerdict judge_runs(CachingRule rule, const Runs& r, double tolerance = kTolerance) {
  const Comparison free_running = compare(r.on, r.off);
  if (!needs_forced_run(rule, free_running)) {
    return judge(rule, tolerance, free_running, nullptr);
  }
  const ForcedComparison f = compare_forced(r.on, r.forced, tolerance);
  return judge(rule, tolerance, free_running, &f);
}

TEST(CachingVerdict, IdenticalStreamsAreJudgedByTheLogitToleranceUnderBothRules) {
  const RunResult on = run_of({greedy(0, {kStep0, {4.0f, 1.0f, 0.0f, 2.0f}})});
  // Within 1e-2 relative of max |logit| 4 (0.03 / 4 = 7.5e-3), same argmax.
  const RunResult near = run_of({greedy(0, {kStep0, {4.0f, 1.03f, 0.0f, 2.0f}})});
  // Beyond it (0.2 / 4 = 5e-2), same argmax.
  const RunResult far = run_of({greedy(0, {kStep0, {4.0f, 1.2f, 0.0f, 2.0f}})});
  for (const CachingRule rule : {CachingRule::kExact, CachingRule::kNearTieAware}) {
    SCOPED_TRACE(to_string(rule));
    const Comparison c_same = compare(on, on);
    EXPECT_FALSE(needs_forced_run(rule, c_same));
    const CachingVerdict same = judge(rule, 0.0, c_same, nullptr);
    EXPECT_TRUE(same.pass) << same.problem;
    EXPECT_EQ(same.decided_by, CachingDecidedBy::kFreeRunning);

    const Comparison c_near = compare(on, near);
    ASSERT_TRUE(c_near.identical_tokens);
    EXPECT_FALSE(needs_forced_run(rule, c_near));
    EXPECT_TRUE(judge(rule, kTolerance, c_near, nullptr).pass);
    // The CPU's 1e-5 rejects the same difference.
    const CachingVerdict strict = judge(rule, 1e-5, c_near, nullptr);
    EXPECT_FALSE(strict.pass);
    EXPECT_FALSE(strict.problem.empty());

    const CachingVerdict v_far = judge(rule, kTolerance, compare(on, far), nullptr);
    EXPECT_FALSE(v_far.pass);
    EXPECT_EQ(v_far.decided_by, CachingDecidedBy::kFreeRunning);
  }
}

TEST(CachingVerdict, ANearTieDivergenceOnTheForcedStreamsPasses) {
  // Caching off prefers token 1 by 1e-4 where caching on chose token 0 by 1e-4: margin 1e-5.
  const Runs r = diverging({9.9999f, 10.0f, 0.0f, 1.0f});
  const Comparison free_running = compare(r.on, r.off);
  ASSERT_FALSE(free_running.identical_tokens);
  ASSERT_TRUE(needs_forced_run(CachingRule::kNearTieAware, free_running));
  const ForcedComparison f = compare_forced(r.on, r.forced, kTolerance);
  EXPECT_TRUE(f.same_streams);
  EXPECT_EQ(f.steps, 5u);
  EXPECT_EQ(f.argmax_differences, 1u);
  EXPECT_GT(f.max_tie_margin, 0.0);
  EXPECT_LE(f.max_tie_margin, 1e-4);
  const CachingVerdict v = judge(CachingRule::kNearTieAware, kTolerance, free_running, &f);
  EXPECT_TRUE(v.pass) << v.problem;
  EXPECT_EQ(v.decided_by, CachingDecidedBy::kForced);
  EXPECT_TRUE(v.problem.empty());
}

TEST(CachingVerdict, ADivergenceAtAClearMarginFails) {
  // Logits off by 10% and a 10% margin: no near-tie.
  const Runs clear = diverging({9.0f, 10.0f, 0.0f, 1.0f});
  const CachingVerdict v = judge_runs(CachingRule::kNearTieAware, clear);
  EXPECT_FALSE(v.pass);
  EXPECT_EQ(v.decided_by, CachingDecidedBy::kForced);
  EXPECT_NE(v.problem.find("forced"), std::string::npos) << v.problem;

  // Every logit within the tolerance (0.8 / 100.8 = 7.9e-3), but the forced run's margin is
  // 1.6 / 100.8 = 1.6e-2: the tie check alone rejects it.
  const Runs margin = diverging({99.2f, 100.8f, 0.0f, 1.0f}, {100.0f, 99.999f, 0.0f, 1.0f});
  const ForcedComparison f = compare_forced(margin.on, margin.forced, kTolerance);
  EXPECT_LE(f.max_rel_logit_diff, kTolerance);
  EXPECT_GT(f.max_tie_margin, kTolerance);
  const CachingVerdict m = judge_runs(CachingRule::kNearTieAware, margin);
  EXPECT_FALSE(m.pass);
  EXPECT_NE(m.problem.find("not the other side's argmax"), std::string::npos) << m.problem;
}

TEST(CachingVerdict, ANearTieWithAnotherStepBeyondTheToleranceFails) {
  Runs r = diverging({9.9999f, 10.0f, 0.0f, 1.0f});
  r.forced.requests[0].logits[5] += 0.5f;  // request 0, step 1, token 1: 0.5 / 9 = 5.6e-2
  const CachingVerdict v = judge_runs(CachingRule::kNearTieAware, r);
  EXPECT_FALSE(v.pass);
  EXPECT_NE(v.problem.find("logits differ"), std::string::npos) << v.problem;
}

TEST(CachingVerdict, AForcedRunThatDidNotFollowFails) {
  Runs r = diverging({9.9999f, 10.0f, 0.0f, 1.0f});
  r.forced.requests[1].output[1] = 1;  // took its own token instead of the forced one
  const ForcedComparison f = compare_forced(r.on, r.forced, kTolerance);
  EXPECT_FALSE(f.same_streams);
  const CachingVerdict v = judge(CachingRule::kNearTieAware, kTolerance, compare(r.on, r.off), &f);
  EXPECT_FALSE(v.pass);
  EXPECT_NE(v.problem.find("did not follow"), std::string::npos) << v.problem;

  // A forced run with a request missing, or with no steps at all.
  Runs fewer = diverging({9.9999f, 10.0f, 0.0f, 1.0f});
  fewer.forced.requests.pop_back();
  EXPECT_FALSE(judge_runs(CachingRule::kNearTieAware, fewer).pass);
  const ForcedComparison empty = compare_forced(r.on, RunResult{}, kTolerance);
  EXPECT_FALSE(judge(CachingRule::kNearTieAware, kTolerance, compare(r.on, r.off), &empty).pass);
}

TEST(CachingVerdict, TheExactRuleNeverTakesADivergence) {
  const Runs r = diverging({9.9999f, 10.0f, 0.0f, 1.0f});  // a near-tie the CUDA rule takes
  const Comparison free_running = compare(r.on, r.off);
  EXPECT_FALSE(needs_forced_run(CachingRule::kExact, free_running));
  for (const double tolerance : {1e-5, kTolerance, 1.0, 1e9}) {
    const CachingVerdict v = judge(CachingRule::kExact, tolerance, free_running, nullptr);
    EXPECT_FALSE(v.pass) << tolerance;
    EXPECT_EQ(v.decided_by, CachingDecidedBy::kFreeRunning);
    EXPECT_NE(v.problem.find("token streams differ"), std::string::npos) << v.problem;
  }
  // Even a passing forced comparison is not taken: handing one to the exact rule is an error.
  const ForcedComparison f = compare_forced(r.on, r.forced, kTolerance);
  ASSERT_TRUE(f.pass(kTolerance)) << f.first_problem;
  EXPECT_THROW(judge(CachingRule::kExact, kTolerance, free_running, &f), std::invalid_argument);
}

TEST(CachingVerdict, RejectsMisuse) {
  const Runs r = diverging({9.9999f, 10.0f, 0.0f, 1.0f});
  const Comparison differ = compare(r.on, r.off);
  const Comparison same = compare(r.on, r.on);
  const ForcedComparison f = compare_forced(r.on, r.forced, kTolerance);
  // The near-tie rule on different streams needs the forced comparison...
  EXPECT_THROW(judge(CachingRule::kNearTieAware, kTolerance, differ, nullptr),
               std::invalid_argument);
  // ...and takes none on identical ones.
  EXPECT_THROW(judge(CachingRule::kNearTieAware, kTolerance, same, &f), std::invalid_argument);
  for (const double bad :
       {-1e-3, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW(judge(CachingRule::kExact, bad, same, nullptr), std::invalid_argument) << bad;
  }
  EXPECT_EQ(to_string(CachingRule::kExact), "exact");
  EXPECT_EQ(to_string(CachingRule::kNearTieAware), "near_tie_aware");
  EXPECT_EQ(to_string(CachingDecidedBy::kFreeRunning), "free_running");
  EXPECT_EQ(to_string(CachingDecidedBy::kForced), "forced");
}

}  // namespace
}  // namespace tiny_engine
