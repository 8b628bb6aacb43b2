#include "workload.hpp"

#include <random>
#include <stdexcept>

namespace tiny_engine {

void WorkloadOptions::validate() const {
  auto require = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("workload: ") + what);
  };
  require(sessions > 0, "sessions must be positive");
  require(turns > 0, "turns must be positive");
  require(min_message_tokens > 0 && min_message_tokens <= max_message_tokens,
          "message tokens must satisfy 0 < min <= max");
  require(min_new_tokens > 0 && min_new_tokens <= max_new_tokens,
          "new tokens must satisfy 0 < min <= max");
  require(vocab_size > 1, "vocab_size must be at least 2");
}

std::size_t Workload::num_requests() const noexcept {
  std::size_t n = 0;
  for (const Session& s : sessions) n += s.turns.size();
  return n;
}

WorkloadKind parse_workload_kind(const std::string& name) {
  if (name == "agents") return WorkloadKind::kAgents;
  if (name == "chat") return WorkloadKind::kChat;
  throw std::invalid_argument("unknown workload '" + name + "' (expected agents or chat)");
}

Workload make_workload(const WorkloadOptions& options) {
  options.validate();
  // mt19937_64's output sequence is fixed by the standard; only raw draws are used.
  std::mt19937_64 rng(options.seed);
  auto uniform = [&](std::uint32_t lo, std::uint32_t hi) {
    return static_cast<std::uint32_t>(lo + rng() % (std::uint64_t{hi} - lo + 1));
  };
  auto tokens = [&](std::uint32_t n) {
    std::vector<pagedkv::TokenId> v(n);
    for (auto& t : v) t = static_cast<pagedkv::TokenId>(rng() % std::uint64_t(options.vocab_size));
    return v;
  };
  Workload w;
  w.name = options.kind == WorkloadKind::kAgents ? "agents" : "chat";
  w.shared_prefix = tokens(options.system_tokens);
  const std::uint32_t turns = options.kind == WorkloadKind::kAgents ? options.turns : 1;
  for (std::uint32_t s = 0; s < options.sessions; ++s) {
    Session session;
    session.arrival_step = s * options.arrival_interval_steps;
    for (std::uint32_t k = 0; k < turns; ++k) {
      Turn turn;
      turn.message = tokens(uniform(options.min_message_tokens, options.max_message_tokens));
      turn.max_new_tokens = uniform(options.min_new_tokens, options.max_new_tokens);
      session.turns.push_back(std::move(turn));
    }
    w.sessions.push_back(std::move(session));
  }
  return w;
}

}  // namespace tiny_engine
