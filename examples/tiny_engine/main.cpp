// pagedkv-tiny-engine: a small real transformer served with pagedkv's paged KV cache and
// automatic prefix caching; --compare proves that caching changes nothing but the work done.
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

#include "engine.hpp"
#include "model.hpp"
#include "pagedkv/device/kv_dtype.hpp"
#include "workload.hpp"

namespace {

constexpr const char* kUsage = R"(usage: pagedkv-tiny-engine [options]

Serves a seeded workload with a small decoder-only transformer (CPU, fp32 math, paged KV cache
managed by pagedkv) and reports what prefix caching saved.

  --compare              run with prefix caching on and off; exit 1 unless the greedy token
                         streams are identical and logits agree within 1e-5 relative
  --json                 print one JSON object instead of text
  --no-caching           (without --compare) run with prefix caching off
  --workload NAME        agents (default: multi-turn sessions) or chat (one message each)
  --sessions N           sessions (default 6)
  --turns N              turns per agent session (default 3)
  --system-tokens N      shared system prompt + tools, in tokens (default 160)
  --num-blocks N         KV pool blocks including the null block (default 1024)
  --block-size N         tokens per block (default 16)
  --token-budget N       tokens per scheduler step (default 128)
  --max-seqs N           running requests at most (default 16)
  --kv-dtype NAME        bf16 (default) or fp16
  --model-seed N         weight seed (default 1)
  --workload-seed N      workload seed (default 7)
  --help                 this text
)";

struct Options {
  bool compare = false;
  bool json = false;
  bool caching = true;
  tiny_engine::WorkloadOptions workload;
  tiny_engine::EngineConfig engine;
  tiny_engine::ModelConfig model;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "pagedkv-tiny-engine: " << message << "\n(see --help)\n";
  std::exit(2);
}

std::uint64_t parse_count(std::string_view flag, std::string_view text, std::uint64_t min,
                          std::uint64_t max) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < min || v > max) {
    usage_error(std::string(flag) + ": expected an integer in [" + std::to_string(min) + ", " +
                std::to_string(max) + "], got '" + std::string(text) + "'");
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) usage_error(std::string(a) + " needs a value");
      return argv[++i];
    };
    auto count = [&](std::uint64_t min, std::uint64_t max) {
      const std::string_view v = value();
      return parse_count(a, v, min, max);
    };
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--compare") {
      o.compare = true;
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--no-caching") {
      o.caching = false;
    } else if (a == "--workload") {
      const std::string v(value());
      if (v == "agents") {
        o.workload.kind = tiny_engine::WorkloadKind::kAgents;
      } else if (v == "chat") {
        o.workload.kind = tiny_engine::WorkloadKind::kChat;
      } else {
        usage_error("--workload: expected agents or chat, got '" + v + "'");
      }
    } else if (a == "--sessions") {
      o.workload.sessions = static_cast<std::uint32_t>(count(1, 4096));
    } else if (a == "--turns") {
      o.workload.turns = static_cast<std::uint32_t>(count(1, 64));
    } else if (a == "--system-tokens") {
      o.workload.system_tokens = static_cast<std::uint32_t>(count(0, 1u << 16));
    } else if (a == "--num-blocks") {
      o.engine.num_blocks = static_cast<std::int32_t>(count(2, 1u << 22));
    } else if (a == "--block-size") {
      o.engine.block_size = static_cast<std::uint32_t>(count(1, 256));
    } else if (a == "--token-budget") {
      o.engine.max_num_batched_tokens = static_cast<std::uint32_t>(count(1, 1u << 16));
    } else if (a == "--max-seqs") {
      o.engine.max_num_seqs = static_cast<std::uint32_t>(count(1, 4096));
    } else if (a == "--kv-dtype") {
      const std::string v(value());
      if (v == "bf16") {
        o.engine.kv_dtype = pagedkv::KVDtype::kBFloat16;
      } else if (v == "fp16") {
        o.engine.kv_dtype = pagedkv::KVDtype::kFloat16;
      } else {
        usage_error("--kv-dtype: expected bf16 or fp16, got '" + v + "'");
      }
    } else if (a == "--model-seed") {
      o.model.seed = count(0, UINT64_MAX);
    } else if (a == "--workload-seed") {
      o.workload.seed = count(0, UINT64_MAX);
    } else {
      usage_error("unknown option '" + std::string(a) + "'");
    }
  }
  if (o.compare && !o.caching) usage_error("--no-caching and --compare exclude each other");
  o.workload.vocab_size = o.model.vocab_size;
  return o;
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

double ttft_p50(const tiny_engine::RunResult& r) {
  std::vector<double> v;
  for (const auto& q : r.requests) v.push_back(q.ttft_seconds);
  return tiny_engine::percentile(v, 50);
}

std::uint64_t generated(const tiny_engine::RunResult& r) {
  std::uint64_t n = 0;
  for (const auto& q : r.requests) n += q.output.size();
  return n;
}

// Per-run fields, suffixed "_on" / "_off" in --compare (no suffix for a single run).
void run_fields(std::ostringstream& j, const tiny_engine::RunResult& r, const std::string& sfx) {
  const tiny_engine::RunStats& s = r.stats;
  j << ",\"prefill_seconds" << sfx << "\":" << num(s.prefill_seconds) << ",\"decode_seconds" << sfx
    << "\":" << num(s.decode_seconds) << ",\"total_seconds" << sfx << "\":" << num(s.total_seconds)
    << ",\"ttft_p50" << sfx << "\":" << num(ttft_p50(r)) << ",\"prefill_tokens_computed" << sfx
    << "\":" << s.prefill_tokens << ",\"decode_tokens" << sfx << "\":" << s.decode_tokens
    << ",\"prefix_hit_tokens" << sfx << "\":" << s.hit_tokens << ",\"hit_rate" << sfx
    << "\":" << num(s.cache.hit_rate()) << ",\"preemptions" << sfx << "\":" << s.preemptions
    << ",\"evictions" << sfx << "\":" << s.cache.evictions << ",\"steps" << sfx << "\":" << s.steps
    << ",\"max_running" << sfx << "\":" << s.max_running;
}

void print_run_text(const char* title, const tiny_engine::RunResult& r) {
  const tiny_engine::RunStats& s = r.stats;
  std::cout << title << ": " << s.steps << " steps, " << s.prefill_tokens
            << " prefill tokens computed (" << s.hit_tokens
            << " taken from the prefix cache, hit rate " << num(s.cache.hit_rate()) << "), "
            << s.decode_tokens << " decode tokens, " << s.preemptions << " preemptions\n  prefill "
            << num(s.prefill_seconds) << " s, decode " << num(s.decode_seconds) << " s, total "
            << num(s.total_seconds) << " s, TTFT p50 " << num(ttft_p50(r)) << " s\n";
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    const tiny_engine::Model model(o.model);
    const tiny_engine::Workload workload = tiny_engine::make_workload(o.workload);
    tiny_engine::EngineConfig config = o.engine;

    std::ostringstream j;
    j << "{\"workload\":\"" << workload.name << "\",\"requests\":" << workload.num_requests()
      << ",\"model\":\"" << model.describe() << "\",\"kv_dtype\":\""
      << pagedkv::to_string(config.kv_dtype) << "\",\"num_blocks\":" << config.num_blocks
      << ",\"block_size\":" << config.block_size
      << ",\"token_budget\":" << config.max_num_batched_tokens
      << ",\"attention\":\"pagedkv CPU references: extend attention (prefill), decode attention "
         "(decode)\"";

    if (!o.compare) {
      config.enable_caching = o.caching;
      tiny_engine::Engine engine(model, config);
      const tiny_engine::RunResult r = engine.run(workload);
      if (o.json) {
        j << ",\"caching\":" << (o.caching ? "true" : "false")
          << ",\"generated_tokens\":" << generated(r);
        run_fields(j, r, "");
        std::cout << j.str() << "}\n";
      } else {
        std::cout << "model: " << model.describe() << "\nworkload: " << workload.name << ", "
                  << workload.num_requests() << " requests, " << generated(r)
                  << " tokens generated\n";
        print_run_text(o.caching ? "prefix caching on" : "prefix caching off", r);
      }
      return 0;
    }

    config.enable_caching = true;
    const tiny_engine::RunResult on = tiny_engine::Engine(model, config).run(workload);
    config.enable_caching = false;
    const tiny_engine::RunResult off = tiny_engine::Engine(model, config).run(workload);
    const tiny_engine::Comparison c = tiny_engine::compare(on, off);
    const bool pass = c.identical_tokens && c.max_rel_logit_diff <= 1e-5;
    const auto saved = static_cast<std::int64_t>(off.stats.prefill_tokens) -
                       static_cast<std::int64_t>(on.stats.prefill_tokens);
    if (o.json) {
      j << ",\"identical_tokens\":" << (c.identical_tokens ? "true" : "false")
        << ",\"bitwise_identical_logits\":" << (c.bitwise_identical_logits ? "true" : "false")
        << ",\"max_rel_logit_diff\":" << num(c.max_rel_logit_diff)
        << ",\"generated_tokens\":" << generated(on) << ",\"prefill_tokens_saved\":" << saved;
      run_fields(j, on, "_on");
      run_fields(j, off, "_off");
      j << ",\"prefill_speedup\":"
        << num(on.stats.prefill_seconds > 0 ? off.stats.prefill_seconds / on.stats.prefill_seconds
                                            : 0)
        << ",\"pass\":" << (pass ? "true" : "false") << "}";
      std::cout << j.str() << "\n";
    } else {
      std::cout << "model: " << model.describe() << "\nworkload: " << workload.name << ", "
                << workload.num_requests() << " requests, " << generated(on)
                << " tokens generated\n";
      print_run_text("prefix caching on ", on);
      print_run_text("prefix caching off", off);
      std::cout << "identical greedy tokens: " << (c.identical_tokens ? "yes" : "NO")
                << "; max relative logit difference " << num(c.max_rel_logit_diff)
                << (c.bitwise_identical_logits ? " (bitwise identical)" : "") << "\n"
                << "prefill tokens saved: " << saved << "; prefill "
                << num(off.stats.prefill_seconds) << " s -> " << num(on.stats.prefill_seconds)
                << " s; TTFT p50 " << num(ttft_p50(off)) << " s -> " << num(ttft_p50(on)) << " s\n"
                << (pass ? "PASS" : "FAIL: " + c.first_difference) << "\n";
    }
    return pass ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "pagedkv-tiny-engine: " << e.what() << "\n";
    return 1;
  }
}
