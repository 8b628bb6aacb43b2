// tiny_engine/workload.hpp: the requests the tiny engine serves.
//
// The shapes of pagedkv-replay's generators (bench/replay/trace.hpp), scaled down so that a CPU
// model serves them in seconds, and closed-loop, as a real conversation is:
//  agents  a shared system prompt and tool definitions, then sessions of several turns; turn k+1
//          arrives when turn k finishes, and its prompt is turn k's whole context (prompt plus the
//          tokens *the model generated*) followed by a new message, so later turns hit blocks
//          written by decode steps, not only by prefills;
//  chat    the shared system prompt, then one independent user message per session.
// Token ids are drawn below the model's vocabulary (the replay generators' ids are unbounded;
// they would be mapped modulo the vocabulary the same way). Deterministic for equal options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedkv/hash/block_hasher.hpp"

namespace tiny_engine {

enum class WorkloadKind { kAgents, kChat };

struct WorkloadOptions {
  WorkloadKind kind = WorkloadKind::kAgents;
  std::uint32_t sessions = 6;
  std::uint32_t turns = 3;               // agents: turns per session (chat: always 1)
  std::uint32_t system_tokens = 160;     // shared prefix (system prompt + tool definitions)
  std::uint32_t min_message_tokens = 8;  // each turn's new message
  std::uint32_t max_message_tokens = 40;
  std::uint32_t min_new_tokens = 6;  // tokens to generate per turn
  std::uint32_t max_new_tokens = 14;
  std::uint32_t arrival_interval_steps = 2;  // session i's first turn arrives at step i x this
  std::int32_t vocab_size = 4096;
  std::uint64_t seed = 7;

  // Throws std::invalid_argument naming the first bad field.
  void validate() const;
};

struct Turn {
  std::vector<pagedkv::TokenId> message;  // appended to the context before the turn runs
  std::uint32_t max_new_tokens = 0;       // greedy tokens generated (no stop token)
};

struct Session {
  std::uint32_t arrival_step = 0;  // scheduler step at which turn 0 arrives
  std::vector<Turn> turns;
};

struct Workload {
  std::string name;
  std::vector<pagedkv::TokenId> shared_prefix;  // every session's context starts with it
  std::vector<Session> sessions;

  std::size_t num_requests() const noexcept;
};

WorkloadKind parse_workload_kind(const std::string& name);  // throws std::invalid_argument
Workload make_workload(const WorkloadOptions& options);

}  // namespace tiny_engine
