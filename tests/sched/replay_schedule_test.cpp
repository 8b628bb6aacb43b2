// The replay's --schedule: fcfs reproduces the engine-mode figures of the code before the
// scheduler existed, and prefix admits through AdmissionScheduler within its aging bound.
#include <gtest/gtest.h>

#include <string>

#include "replay.hpp"
#include "trace.hpp"

namespace pagedkv::replay {
namespace {

// Figures printed by pagedkv-replay at a0e487d (before --schedule; its engine mode was the fcfs
// path), with `--mode engine` and the arguments named in each test.
struct Figures {
  std::uint64_t hit_tokens, queried_tokens, prefill_tokens_computed, preemptions, steps,
      decode_tokens, evicted_blocks;
  double sim_makespan_ms, sim_ttft_p50_ms;
};

void expect_figures(const ReplayResult& r, const Figures& f) {
  EXPECT_EQ(r.hit_tokens, f.hit_tokens);
  EXPECT_EQ(r.queried_tokens, f.queried_tokens);
  EXPECT_EQ(r.prefill_tokens_computed, f.prefill_tokens_computed);
  EXPECT_EQ(r.preemptions, f.preemptions);
  EXPECT_EQ(r.steps, f.steps);
  EXPECT_EQ(r.decode_tokens, f.decode_tokens);
  EXPECT_EQ(r.evicted_blocks, f.evicted_blocks);
  EXPECT_EQ(r.sim_makespan_ms, f.sim_makespan_ms);
  EXPECT_EQ(r.sim_ttft_p50_ms, f.sim_ttft_p50_ms);
  EXPECT_EQ(r.rejected, 0u);
}

TEST(ReplaySchedule, FcfsReproducesTheEngineModeFigures) {
  GeneratorOptions g;  // --generate agents --requests 300 --num-blocks 4001
  g.workload = Workload::kAgents;
  g.requests = 300;
  ReplayOptions o;
  o.mode = Mode::kEngine;
  o.schedule = Schedule::kFcfs;
  o.num_blocks = {4001};
  expect_figures(run_replay(generate(g), o).front(),
                 {2170912, 3525766, 1125688, 51, 11820, 90112, 71836, 236400.0, 36.0});

  GeneratorOptions chat;  // --generate chat --requests 200 --num-blocks 400
  chat.workload = Workload::kChat;
  chat.requests = 200;
  o.num_blocks = {400};
  expect_figures(run_replay(generate(chat), o).front(),
                 {198416, 332767, 134351, 84, 8160, 54570, 11284, 163200.0, 47750.0});
}

TEST(ReplaySchedule, PrefixStaysWithinItsAgingBoundAndFinishesEverything) {
  GeneratorOptions chat;
  chat.workload = Workload::kChat;
  chat.requests = 200;
  const Trace trace = generate(chat);
  ReplayOptions o;
  o.mode = Mode::kEngine;
  o.num_blocks = {400};
  const ReplayResult fcfs = run_replay(trace, o).front();
  o.schedule = Schedule::kPrefix;
  o.max_passed_over = 4;
  const ReplayResult prefix = run_replay(trace, o).front();
  EXPECT_LE(prefix.max_passed_over, 4u);
  EXPECT_EQ(prefix.rejected, 0u);
  // Decode steps: at most one per output token after the first (fewer after a preemption, whose
  // recomputation counts as prefill).
  std::uint64_t outputs = 0;
  for (const auto& q : trace.requests) outputs += q.output_length - 1;
  EXPECT_LE(prefix.decode_tokens, outputs);
  EXPECT_GT(prefix.decode_tokens, outputs / 2);
  EXPECT_EQ(fcfs.requests, prefix.requests);
  EXPECT_GE(prefix.prefill_tokens_computed + prefix.hit_tokens, prefix.prompt_tokens);
  EXPECT_GT(prefix.queue_delay_p99_ms, 0.0);
  EXPECT_GE(prefix.queue_delay_p99_ms, prefix.queue_delay_p50_ms);
  const std::string json = to_json(prefix, o, trace);
  for (const char* field : {"\"schedule\":\"prefix\"", "\"queue_delay_p99_ms\":",
                            "\"queue_delay_p50_ms\":", "\"sim_ttft_p99_ms\":"}) {
    EXPECT_NE(json.find(field), std::string::npos) << field << " in " << json;
  }
}

}  // namespace
}  // namespace pagedkv::replay
