// pagedkv-replay: replays a request trace through the real library (hashing included) and
// reports, per cache size, the prefix-cache hit rate, the prefill saved and the throughput.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "belady.hpp"
#include "flood.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/base/version.hpp"
#include "replay.hpp"
#include "trace.hpp"
#if PAGEDKV_REPLAY_CLUSTER
#include "cluster.hpp"
#endif

namespace {

using namespace pagedkv::replay;

constexpr const char* kUsage =
    "usage: pagedkv-replay (--trace FILE | --generate agents|chat|tenants) --num-blocks N [N ...]\n"
    "                      [options]\n"
    "\n"
    "Prints one JSON object per cache size on stdout (or a table with --table).\n"
    "Each flag is given once (--num-blocks, --kv-memory-gib and --host-blocks take several values\n"
    "and may be repeated); a flag that does not apply to the input or the mode is an error.\n"
    "\n"
    "input:\n"
    "  --trace FILE              a hash-id JSONL trace or an Azure CSV (by extension, or "
    "--format);\n"
    "                            either may be gzip-compressed (FILE.gz, read as it decompresses;\n"
    "                            concatenated members are one stream, other bytes after the\n"
    "                            last member an error)\n"
    "  --format hashids|azure    --trace: the trace's format\n"
    "  --source-block-size S     --trace: tokens per hash id (Mooncake: 512, the default; others:\n"
    "                            64)\n"
    "  --generate W              a built-in workload: agents, chat or tenants\n"
    "  --requests N, --seed S, --tenants T   generator size, seed (flood too) and tenant count\n"
    "                            (--generate tenants only)\n"
    "  --generate flood          a retained system prompt against a flood (flood.hpp):\n"
    "                            a warm-up request with a 10,800-token shared prefix retained at\n"
    "                            priority 90, 5,770 unrelated requests (1,024-3,072 tokens), and\n"
    "                            100 requests reusing the prefix spread through them; reports the\n"
    "                            prefix's hit rate over those 100 and failed allocations\n"
    "                            (sequential semantics; with --eviction <pool policy>)\n"
    "  --no-retention            flood: the same requests without a retention config (plain LRU)\n"
    "  --retention-priority P    flood: the prefix's priority (90)\n"
    "  --retention-duration T    flood: the priority's duration in requests (none)\n"
    "  --limit K                 only the first K requests (a generator makes only those; not\n"
    "                            with flood)\n"
    "  --skip-bad                --trace: skip (and count) malformed lines instead of stopping\n"
    "replay:\n"
    "  --num-blocks N [N ...]    total pool blocks including the null block; several sweep\n"
    "  --block-size B            tokens per block (default 16)\n"
    "  --kv-memory-gib G [G ...] instead of --num-blocks: the pool as KV memory, G GiB each;\n"
    "                            N = floor(G x 2^30 / (B x block size)) blocks, the null block\n"
    "                            included (needs --kv-bytes-per-token)\n"
    "  --kv-bytes-per-token B    KV bytes of one token over all layers (2 x layers x kv_heads x\n"
    "                            (head_dim x bytes per value [+ 4 with per-token-head FP8\n"
    "                            scales]); Llama-3-8B: bf16 131072, fp8 + scales 67584)\n"
    "  --hash S                  sha256 (default), sha256_cbor_vllm or xxh3_128\n"
    "  --no-caching              prefix caching off\n"
    "  --sliding-window W        hybrid model: a second KV-cache group of sliding-window layers\n"
    "                            (W tokens) beside full attention; engine mode reports the KV\n"
    "                            memory freeing out-of-window blocks saves\n"
    "  --window-block-size B     with --sliding-window: the window group's block size, a\n"
    "                            multiple of --block-size (default: the same)\n"
    "  --no-verify               trust hashes without comparing stored key material (SHA-256\n"
    "                            schemes only)\n"
    "  --mode sequential|engine  sequential (default): file order, one request at a time, prompt\n"
    "                            only; engine: timestamps, decoding, batching, preemption\n"
    "  --max-running R, --max-batched-tokens T, --step-ms MS   engine mode (256, 8192, 20)\n"
    "  --schedule fcfs|prefix    engine mode: admit waiting requests first come first served\n"
    "                            (fcfs, the default) or by pagedkv::AdmissionScheduler (prefix:\n"
    "                            longest cached prefix first, same-step shared-prefix deferral,\n"
    "                            aging); adds queue_delay_p50/p99_ms and sim_ttft_p99_ms\n"
    "  --max-passed-over K       --schedule prefix: the aging bound in steps (256)\n"
    "  --max-candidates C        --schedule prefix: the C earliest waiting requests are\n"
    "                            considered each step (128; 0: all)\n"
    "  --arrival-rate-scale X    engine mode: arrivals X times as fast (timestamps divided by X;\n"
    "                            1)\n"
    "  --eviction lru|slru|s3fifo|lineage|adaptive|belady|reuse-oracle|reuse-oracle-mru|\n"
    "             belady-noisy:S\n"
    "                            lru (default): the library's pool;\n"
    "                            slru, s3fifo, lineage, adaptive:\n"
    "                            the library's pool with that eviction policy (BlockPoolConfig::\n"
    "                            eviction_policy); lineage:D: key depth D (lineage_key_depth,\n"
    "                            default 32), lineage:auto: the depth learned (lineage_adaptive_\n"
    "                            depth); belady: the\n"
    "                            clairvoyant bound, simulated in the replay (not the library):\n"
    "                            the cached block used farthest ahead in the trace is evicted;\n"
    "                            an offline reference, not a policy an engine can run;\n"
    "                            reuse-oracle: simulated too, LRU told which blocks will be used\n"
    "                            again (not when): those never used again go first (what a\n"
    "                            perfect prediction of reuse alone would buy LRU);\n"
    "                            reuse-oracle-mru: the same, but of the blocks used again those\n"
    "                            of the request freed last go first (tail first): the\n"
    "                            longest-waiting are kept;\n"
    "                            belady-noisy:S: belady keyed by noisy next uses (each distance\n"
    "                            times exp(S z), z standard normal; S in 0..8): how exactly a\n"
    "                            policy must predict when a block returns\n"
    "                            (all four: sequential mode; no tiers, --engines or --plot)\n"
    "  --adaptive-ghost-sample-shift S   adaptive: its ghosts track 1 in 2^S block fingerprints\n"
    "                            (0: all; -1, the default: by the pool's size; at most 4)\n"
    "  --threads 1|2             sequential mode: 2 (default) hashes requests on a second thread\n"
    "                            ahead of the replay; 1 does everything on one thread\n"
    "cluster (built with pagedkv::events):\n"
    "  --engines K               K engines of --num-blocks blocks each behind a router; their KV\n"
    "                            events flow through a real KVIndexer (sequential semantics)\n"
    "  --router kv|round_robin|least_loaded   how requests are routed (default kv)\n"
    "  --load-window N           an engine's load: its share of the last N requests (64)\n"
    "  --kv-events ENDPOINT      publish each engine's KV events on vLLM's wire (engine k on\n"
    "                            ENDPOINT's port + k), e.g. tcp://127.0.0.1:5557\n"
    "  --host-blocks M           (with --engines) each engine gets a host tier of M blocks\n"
    "  --remote redis://HOST:PORT/NS   a shared remote tier on one Redis (needs --host-blocks M):\n"
    "                            every engine runs a RemoteTier on its own RedisStore; the "
    "cluster\n"
    "                            is replayed twice, without then with the shared tier, and both\n"
    "                            hit rates are reported (without_remote). Payloads are "
    "placeholders\n"
    "                            (see remote_note); use a fresh namespace for each run\n"
    "  --remote-payload-bytes B  placeholder payload per block (64)\n"
    "  --remote-store P          write_through (default: every block cached in a host tier),\n"
    "                            after_hits:K (after K host hits), host_eviction (when the host\n"
    "                            tier evicts it)\n"
    "  --remote-timeout-ms T     each store op completes (or fails) within T ms (1000)\n"
    "  --disk DIR                the remote tier on a local-disk store (DiskStore) in DIR instead\n"
    "                            of Redis (needs --host-blocks M; one engine; reported as\n"
    "                            remote file://DIR); DIR keeps its values across runs: use a\n"
    "                            new or empty one for this run's figures; --remote-* apply\n"
    "  --disk-gib G              the disk store's capacity in GiB (1; fractions allowed): with\n"
    "                            64-byte payloads a slot is 512 bytes, ~2.1 M blocks per GiB\n"
    "  (--remote/--disk with --sliding-window W: every group goes through the remote tier, the\n"
    "  window group only its window at each hit's end; the JSON adds per-group host and remote\n"
    "  loaded/stored blocks and bytes and remote_window_blocks_not_loaded)\n"
    "host tier (sequential and engine mode):\n"
    "  --host-blocks M [M ...]   a host-memory tier of M blocks beside the --num-blocks GPU pool\n"
    "                            (several sweep); adds gpu_hit_tokens, host_hit_tokens,\n"
    "                            host_loaded_blocks, host_stored_blocks and bytes moved; --plot\n"
    "                            draws hit rate against host size\n"
    "  --host-policy P           write_through (default), write_through_selective, write_back\n"
    "  --host-selective-hits K   write_through_selective: hits before a block is stored (2)\n"
    "  --window-store tail|all   with --sliding-window: which window blocks the tier stores:\n"
    "                            all (default) every one, tail those within the\n"
    "                            window of a request's end; the JSON adds per-group loaded\n"
    "                            and stored blocks and bytes (each block half a token's bytes)\n"
    "  --host-gbps G             engine mode: each step's copies (evictions, loads, stores of\n"
    "                            --kv-bytes-per-token bytes a token) take bytes / G GB/s on the\n"
    "                            simulated clock, added to the step (25); reported as\n"
    "                            sim_transfer_ms, included in sim_makespan_ms and sim_ttft_p50_ms\n"
    "  (--kv-bytes-per-token B   also sizes loaded_bytes and stored_bytes of the host tier)\n"
    "output:\n"
    "  --table                   a readable table instead of JSON lines\n"
    "  --csv FILE                also write the results as CSV\n"
    "  --plot FILE.png           plot hit rate against cache size with the unbounded ideal\n"
    "                            (needs gnuplot)\n"
    "  --memory-table            print the PagedAttention memory-utilization comparison\n"
    "  --version, --help\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::cerr << "pagedkv-replay: " << message << "\n\n" << kUsage;
  std::exit(2);
}

long long parse_number(const std::string& text, const std::string& flag, long long min,
                       long long max) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  // strtoll skips leading spaces and takes a '+': a whole number here is digits and a '-'.
  const bool plain = !text.empty() && (text[0] == '-' || (text[0] >= '0' && text[0] <= '9'));
  if (!plain || *end != '\0' || errno != 0 || v < min || v > max) {
    usage_error(flag + ": '" + text + "' is not a whole number in [" + std::to_string(min) + ", " +
                std::to_string(max) + "]");
  }
  return v;
}

// Digits with at most one '.' (a size such as 62.5).
bool is_decimal(const char* s) {
  bool digit = false, dot = false;
  for (; *s; ++s) {
    if (*s == '.' && !dot) {
      dot = true;
    } else if (*s >= '0' && *s <= '9') {
      digit = true;
    } else {
      return false;
    }
  }
  return digit;
}

bool is_number(const char* s) {
  if (*s == '\0') return false;
  for (; *s; ++s) {
    if (*s < '0' || *s > '9') return false;
  }
  return true;
}

void write_table(const std::vector<ReplayResult>& results, const ReplayOptions& o) {
  std::printf("%12s %12s %9s %9s %12s %10s %12s %12s\n", "num_blocks", "cache_tokens", "hit_rate",
              "saved", "evicted", "rejected", "requests/s", "blocks/s");
  for (const ReplayResult& r : results) {
    const double secs = r.hash_seconds + r.pool_seconds;  // per cache size, as blocks/s
    std::printf("%12d %12lld %8.2f%% %8.2f%% %12llu %10llu %12.0f %12.0f\n", r.num_blocks,
                static_cast<long long>(r.num_blocks - 1) * o.block_size, 100 * r.hit_rate(),
                100 * r.prefill_saved_ratio(), (unsigned long long)r.evicted_blocks,
                (unsigned long long)r.rejected, secs > 0 ? double(r.requests) / secs : 0.0,
                r.blocks_per_second());
  }
}

void write_csv(const std::string& path, const std::vector<ReplayResult>& results,
               const ReplayOptions& o, std::optional<double> ideal) {
  std::ofstream out(path);
  if (!out) usage_error("--csv/--plot: cannot write '" + path + "'");
  out << "num_blocks,cache_tokens,hit_rate,prefill_saved_ratio,evicted_blocks,ideal_hit_rate\n";
  for (const ReplayResult& r : results) {
    out << r.num_blocks << "," << static_cast<long long>(r.num_blocks - 1) * o.block_size << ","
        << r.hit_rate() << "," << r.prefill_saved_ratio() << "," << r.evicted_blocks << ","
        << (ideal ? *ideal : r.hit_rate()) << "\n";
  }
}

// A gnuplot single-quoted string: a quote inside is written twice, and a control character (a
// newline would end the script line) becomes '?'. Names come from outside (a trace file's name,
// --plot, --csv): quoted this way they stay data, never gnuplot commands.
std::string gnuplot_quoted(std::string_view s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') {
      out += "''";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += '?';
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Runs gnuplot on `script` without a shell (its path is an argument, never a command line).
// 0 when gnuplot ran and succeeded.
int run_gnuplot(const std::string& script) {
  pid_t pid = 0;
  std::string program = "gnuplot";
  char* const args[] = {program.data(), const_cast<char*>(script.c_str()), nullptr};
  const int err = posix_spawnp(&pid, "gnuplot", nullptr, nullptr, args, environ);
  int status = 0;
  const int rc = err != 0                          ? 127
                 : waitpid(pid, &status, 0) != pid ? 1
                 : WIFEXITED(status)               ? WEXITSTATUS(status)
                                                   : 1;
  if (rc != 0) std::cerr << "pagedkv-replay: gnuplot failed (" << rc << "); is it installed?\n";
  return rc;
}

// Writes a gnuplot script; false (and a message) when it cannot be written.
bool write_script(const std::string& script, const std::string& text) {
  std::ofstream gp(script);
  gp << text;
  gp.close();
  if (!gp) std::cerr << "pagedkv-replay: --plot: cannot write '" << script << "'\n";
  return static_cast<bool>(gp);
}

int plot(const std::string& png, const std::string& csv, const std::string& title) {
  const std::string script = png + ".gp";
  const std::string text =
      "set terminal pngcairo size 900,560 noenhanced\nset output " + gnuplot_quoted(png) +
      "\nset datafile separator ','\nset title " + gnuplot_quoted(title) +
      "\nset xlabel 'cache size (tokens)'\nset ylabel 'prefix-cache hit rate (%)'\n"
      "set logscale x\nset key bottom right\nset grid\nplot " +
      gnuplot_quoted(csv) +
      " using 2:($3*100) with linespoints lw 2 pt 7 title 'LRU (pagedkv)', "
      "'' using 2:($6*100) with lines dt 2 lw 2 title 'unbounded cache (ideal)'\n";
  if (!write_script(script, text)) return 1;
  return run_gnuplot(script);
}

// The host-tier sweep: JSON lines, and hit rate against host size.
int run_with_host_tier(const Trace& trace, const ReplayOptions& opt, const TierReplayOptions& tier,
                       const std::optional<std::string>& csv,
                       const std::optional<std::string>& png) {
  const auto results = run_tier_replay(trace, opt, tier);
  for (const TierReplayResult& r : results) std::cout << to_json(r, opt, tier, trace) << "\n";
  const std::string data = csv ? *csv : (png ? *png + ".csv" : std::string());
  if (!data.empty()) {
    std::ofstream out(data);
    if (!out) usage_error("--csv/--plot: cannot write '" + data + "'");
    out << "gpu_blocks,host_blocks,host_tokens,hit_rate,gpu_hit_rate,host_hit_rate\n";
    for (const TierReplayResult& r : results) {
      const double q = r.base.queried_tokens ? double(r.base.queried_tokens) : 1.0;
      out << r.base.num_blocks << "," << r.host_blocks << ","
          << static_cast<long long>(r.host_blocks) * opt.block_size << "," << r.base.hit_rate()
          << "," << double(r.gpu_hit_tokens) / q << "," << double(r.host_hit_tokens) / q << "\n";
    }
  }
  if (png) {
    const std::string script = *png + ".gp";
    const std::string title = trace.name + ": hit rate vs host tier size (" +
                              std::string(pagedkv::to_string(tier.policy)) + ", " +
                              std::to_string(opt.num_blocks.front()) + " GPU blocks)";
    const std::string text =
        "set terminal pngcairo size 900,560 noenhanced\nset output " + gnuplot_quoted(*png) +
        "\nset datafile separator ','\nset title " + gnuplot_quoted(title) +
        "\nset xlabel 'host tier (tokens)'\nset ylabel 'prefix-cache hit rate (%)'\n"
        "set logscale x\nset key top left\nset grid\nplot " +
        gnuplot_quoted(data) +
        " using 3:($4*100) with linespoints lw 2 pt 7 title 'GPU + host', "
        "'' using 3:($6*100) with linespoints lw 2 pt 5 title 'host hits', "
        "'' using 3:($5*100) with linespoints lw 2 pt 9 title 'GPU hits'\n";
    if (!write_script(script, text) || run_gnuplot(script) != 0) return 1;
  }
  return 0;
}

}  // namespace

// Anything but a pagedkv::Error (out of memory for a pool or trace this large, a system error):
// a message and exit 1, never an abort.
static int failed(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    std::cerr << "pagedkv-replay: out of memory (the trace, --num-blocks, --host-blocks or "
                 "--requests is larger than this machine holds)\n";
  } else {
    std::cerr << "pagedkv-replay: " << e.what() << "\n";
  }
  return 1;
}

int main(int argc, char** argv) {
  std::optional<std::string> trace_path, format, generate, csv, png;
  LoadOptions load;
  GeneratorOptions gen;
  ReplayOptions opt;
  TierReplayOptions tier;
  bool table = false, memory_table = false;
  std::vector<double> kv_memory_gib;  // --kv-memory-gib (issue 36)
  long long kv_bytes_per_token = 0;
  double arrival_rate_scale = 1;
  FloodOptions flood;
#if PAGEDKV_REPLAY_CLUSTER
  std::optional<ClusterOptions> cluster;
  auto cluster_opt = [&]() -> ClusterOptions& {
    if (!cluster) cluster.emplace();
    return *cluster;
  };
#endif

  // The flags given, each once: a single-value flag given twice is refused (it used to keep the
  // last value silently); the list flags (--num-blocks, --kv-memory-gib, --host-blocks) append.
  std::set<std::string, std::less<>> given;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("--") && !given.insert(arg).second && arg != "--num-blocks" &&
        arg != "--kv-memory-gib" && arg != "--host-blocks") {
      usage_error(arg +
                  " given twice (give a flag once; only --num-blocks, --kv-memory-gib and "
                  "--host-blocks take several values)");
    }
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      // "--trace --num-blocks 10": the next flag is not this one's value.
      if (std::string_view(argv[i + 1]).starts_with("--")) {
        usage_error(arg + " needs a value (got the flag '" + argv[i + 1] + "')");
      }
      return argv[++i];
    };
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--version") {
      std::cout << "pagedkv-replay " << pagedkv::version() << "\n";
      return 0;
#if PAGEDKV_REPLAY_CLUSTER
    } else if (arg == "--engines") {
      cluster_opt().engines = static_cast<std::uint32_t>(parse_number(value(), arg, 1, 32));
    } else if (arg == "--router") {
      try {
        cluster_opt().router = parse_router(value());
      } catch (const pagedkv::Error& e) {
        usage_error(e.what());
      }
    } else if (arg == "--load-window") {
      cluster_opt().load_window =
          static_cast<std::uint32_t>(parse_number(value(), arg, 1, 1 << 20));
    } else if (arg == "--kv-events") {
      cluster_opt().kv_events = value();
    } else if (arg == "--remote") {
      cluster_opt().remote = value();
    } else if (arg == "--remote-payload-bytes") {
      cluster_opt().remote_payload_bytes =
          static_cast<std::uint32_t>(parse_number(value(), arg, 1, 1 << 26));
    } else if (arg == "--remote-timeout-ms") {
      cluster_opt().remote_op_timeout =
          std::chrono::milliseconds(parse_number(value(), arg, 1, 600000));
    } else if (arg == "--remote-store") {
      const std::string p = value();
      if (p == "write_through") {
        cluster_opt().remote_store_min_hits = 0;
      } else if (p == "host_eviction") {
        cluster_opt().remote_store_on_host_eviction = true;
      } else if (p.starts_with("after_hits:")) {
        cluster_opt().remote_store_min_hits =
            static_cast<std::uint32_t>(parse_number(p.substr(11), arg, 1, 1 << 20));
      } else {
        usage_error("--remote-store: write_through, after_hits:K or host_eviction, not '" + p +
                    "'");
      }
    } else if (arg == "--disk") {
      const std::string dir = value();
      if (dir.empty()) usage_error("--disk: an empty directory name");
      cluster_opt().remote = "file://" + dir;
    } else if (arg == "--disk-gib") {
      char* end = nullptr;
      const std::string g = value();
      const double gib = std::strtod(g.c_str(), &end);
      if (g.empty() || *end != '\0' || !(gib > 0) || gib > 65536) {
        usage_error("--disk-gib: '" + g + "' is not a size in GiB in (0, 65536]");
      }
      cluster_opt().disk_gib = gib;
#endif
    } else if (arg == "--trace") {
      trace_path = value();
    } else if (arg == "--format") {
      format = value();
      if (*format != "hashids" && *format != "azure") usage_error("--format: hashids or azure");
    } else if (arg == "--source-block-size") {
      load.source_block_size = static_cast<std::uint32_t>(parse_number(value(), arg, 1, 1 << 20));
    } else if (arg == "--generate") {
      generate = value();
    } else if (arg == "--requests") {
      gen.requests = static_cast<std::uint32_t>(parse_number(value(), arg, 1, 10000000));
    } else if (arg == "--seed") {
      gen.seed = static_cast<std::uint32_t>(parse_number(value(), arg, 0, 0xffffffffll));
    } else if (arg == "--tenants") {
      gen.tenants = static_cast<std::uint32_t>(parse_number(value(), arg, 1, 1000));
    } else if (arg == "--no-retention") {
      flood.retention = false;
    } else if (arg == "--retention-priority") {
      flood.priority = static_cast<pagedkv::RetentionPriority>(parse_number(value(), arg, 0, 100));
    } else if (arg == "--retention-duration") {
      flood.duration = parse_number(value(), arg, 1, 1ll << 40);
    } else if (arg == "--limit") {
      load.limit = static_cast<std::uint64_t>(parse_number(value(), arg, 1, 1ll << 40));
    } else if (arg == "--skip-bad") {
      load.skip_bad = true;
    } else if (arg == "--num-blocks") {
      if (i + 1 >= argc || !is_number(argv[i + 1]))
        usage_error("--num-blocks needs at least one N");
      while (i + 1 < argc && is_number(argv[i + 1])) {
        opt.num_blocks.push_back(
            static_cast<std::int32_t>(parse_number(argv[++i], arg, 2, 2000000000)));
      }
    } else if (arg == "--kv-memory-gib") {
      if (i + 1 >= argc || !is_decimal(argv[i + 1])) {
        usage_error("--kv-memory-gib needs at least one G");
      }
      while (i + 1 < argc && is_decimal(argv[i + 1])) {
        const std::string v = argv[++i];
        char* end = nullptr;
        const double g = std::strtod(v.c_str(), &end);
        if (end != v.c_str() + v.size() || !(g > 0) || g > 1e6) {
          usage_error("--kv-memory-gib: expected a size in GiB in (0, 1e6], got '" + v + "'");
        }
        kv_memory_gib.push_back(g);
      }
    } else if (arg == "--kv-bytes-per-token") {
      // Sizes the pool with --kv-memory-gib, and the host tier's loaded/stored bytes.
      // 16 MiB a token is 30x a 405B-parameter model's; larger would wrap the byte counters.
      kv_bytes_per_token = parse_number(value(), arg, 0, 1ll << 24);
      tier.kv_bytes_per_token = static_cast<std::uint64_t>(kv_bytes_per_token);
    } else if (arg == "--block-size") {
      opt.block_size = static_cast<std::uint32_t>(parse_number(value(), arg, 1, 4096));
    } else if (arg == "--hash") {
      try {
        opt.hash = pagedkv::parse_hash_scheme(value());
      } catch (const pagedkv::Error& e) {
        usage_error(std::string("--hash: ") + e.what());
      }
    } else if (arg == "--no-caching") {
      opt.caching = false;
    } else if (arg == "--sliding-window") {
      opt.sliding_window = static_cast<std::uint32_t>(parse_number(value(), arg, 1, 1 << 30));
    } else if (arg == "--window-block-size") {
      opt.window_block_size = static_cast<std::uint32_t>(parse_number(value(), arg, 1, 1 << 20));
    } else if (arg == "--no-verify") {
      opt.verify_cache_hits = false;
    } else if (arg == "--mode") {
      const std::string m = value();
      if (m == "sequential") {
        opt.mode = Mode::kSequential;
      } else if (m == "engine") {
        opt.mode = Mode::kEngine;
      } else {
        usage_error("--mode: sequential or engine, not '" + m + "'");
      }
    } else if (arg == "--max-running") {
      opt.max_running = static_cast<std::uint32_t>(parse_number(value(), arg, 1, 1 << 20));
    } else if (arg == "--max-batched-tokens") {
      opt.max_batched_tokens = static_cast<std::uint32_t>(parse_number(value(), arg, 1, 1 << 24));
    } else if (arg == "--step-ms") {
      opt.step_ms = static_cast<double>(parse_number(value(), arg, 1, 1000000));
    } else if (arg == "--schedule") {
      const std::string v = value();
      if (v == "fcfs") {
        opt.schedule = Schedule::kFcfs;
      } else if (v == "prefix") {
        opt.schedule = Schedule::kPrefix;
      } else {
        usage_error("--schedule: fcfs or prefix, not '" + v + "'");
      }
    } else if (arg == "--max-candidates") {
      opt.max_candidates = static_cast<std::uint32_t>(parse_number(value(), arg, 0, 1 << 30));
    } else if (arg == "--max-passed-over") {
      opt.max_passed_over = static_cast<std::uint32_t>(parse_number(value(), arg, 0, 1 << 30));
    } else if (arg == "--arrival-rate-scale") {
      const std::string v = value();
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size() || !(x >= 1e-6) || x > 1e6) {
        usage_error("--arrival-rate-scale: a number in [1e-6, 1e6], not '" + v + "'");
      }
      arrival_rate_scale = x;
    } else if (arg == "--eviction") {
      try {
        parse_eviction(value(), opt);
      } catch (const pagedkv::Error& e) {
        usage_error(e.what());
      }
    } else if (arg == "--adaptive-ghost-sample-shift") {
      opt.adaptive_ghost_sample_shift =
          static_cast<int>(parse_number(value(), arg, -1, pagedkv::kAdaptiveGhostMaxSampleShift));
    } else if (arg == "--threads") {
      opt.threads = static_cast<std::uint32_t>(parse_number(value(), arg, 1, 2));
    } else if (arg == "--host-blocks") {
      if (i + 1 >= argc || !is_number(argv[i + 1]))
        usage_error("--host-blocks needs at least one M");
      while (i + 1 < argc && is_number(argv[i + 1])) {
        tier.host_blocks.push_back(
            static_cast<std::int32_t>(parse_number(argv[++i], arg, 1, 2000000000)));
      }
    } else if (arg == "--host-policy") {
      const std::string p = value();
      const auto policy = pagedkv::parse_host_policy(p);
      if (!policy) {
        usage_error("--host-policy: write_through, write_through_selective or write_back, not '" +
                    p + "'");
      }
      tier.policy = *policy;
    } else if (arg == "--window-store") {
      const std::string w = value();
      if (w == "tail") {
        tier.window_store = pagedkv::WindowStoreRule::kRequestTail;
      } else if (w == "all") {
        tier.window_store = pagedkv::WindowStoreRule::kAll;
      } else {
        usage_error("--window-store: tail or all, not '" + w + "'");
      }
    } else if (arg == "--host-selective-hits") {
      tier.selective_hits = static_cast<std::uint32_t>(parse_number(value(), arg, 1, 1 << 20));
    } else if (arg == "--host-gbps") {
      const std::string v = value();
      char* end = nullptr;
      const double g = std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size() || !(g > 0) || g > 1e6) {
        usage_error("--host-gbps: a positive number of GB/s, not '" + v + "'");
      }
      tier.host_gbps = g;
    } else if (arg == "--table") {
      table = true;
    } else if (arg == "--csv") {
      csv = value();
    } else if (arg == "--plot") {
      png = value();
    } else if (arg == "--memory-table") {
      memory_table = true;
    } else {
      usage_error("unknown argument '" + arg + "'");
    }
  }
  if (trace_path.has_value() == generate.has_value())
    usage_error("give exactly one of --trace and --generate");
  // A flag that does not apply to this run's input or mode is refused, naming both (it used to
  // be ignored silently).
  auto refuse = [&](std::initializer_list<std::string_view> flags, const std::string& why) {
    for (const std::string_view f : flags) {
      if (given.contains(f)) usage_error(std::string(f) + ": " + why);
    }
  };
  const bool flood_run = generate && *generate == "flood";
  const std::string input = trace_path ? "--trace" : "--generate " + *generate;
  if (generate) {
    refuse({"--format", "--source-block-size", "--skip-bad"},
           "applies to --trace only, not to " + input);
  } else {
    refuse({"--requests", "--seed", "--tenants"}, "applies to --generate only, not to --trace");
  }
  if (generate && *generate != "tenants") {
    refuse({"--tenants"}, "applies to --generate tenants only, not to " + input);
  }
  if (flood_run) {
    refuse({"--requests", "--limit"},
           "does not apply to --generate flood (its requests are fixed: flood.hpp)");
  } else {
    refuse({"--no-retention", "--retention-priority", "--retention-duration"},
           "applies to --generate flood only, not to " + input);
  }
  if (opt.mode != Mode::kEngine) {
    refuse({"--max-running", "--max-batched-tokens", "--step-ms", "--schedule", "--host-gbps",
            "--arrival-rate-scale"},
           "engine mode only (--mode engine), not --mode sequential");
  } else {
    refuse({"--threads"}, "sequential mode only, not --mode engine");
  }
  if (opt.schedule != Schedule::kPrefix) {
    refuse({"--max-passed-over", "--max-candidates"},
           "only with --schedule prefix (--mode engine), not --schedule fcfs");
  }
  if (!kv_memory_gib.empty()) {
    // The pool as memory (issue 36: bf16 vs FP8 at the same GPU memory).
    if (kv_bytes_per_token == 0) usage_error("--kv-memory-gib needs --kv-bytes-per-token");
    if (!opt.num_blocks.empty()) usage_error("give --num-blocks or --kv-memory-gib, not both");
    const long double block_bytes =
        static_cast<long double>(kv_bytes_per_token) * static_cast<long double>(opt.block_size);
    for (const double g : kv_memory_gib) {
      const long double blocks =
          std::floor(static_cast<long double>(g) * 1073741824.0L / block_bytes);
      if (blocks < 2 || blocks > 2000000000) {
        usage_error("--kv-memory-gib " + std::to_string(g) + " holds " +
                    std::to_string(static_cast<long long>(blocks)) +
                    " blocks; need 2 .. 2000000000");
      }
      opt.num_blocks.push_back(static_cast<std::int32_t>(blocks));
      std::cerr << "pagedkv-replay: " << g << " GiB / (" << kv_bytes_per_token << " B x "
                << opt.block_size << " tokens) = " << static_cast<long long>(blocks) << " blocks\n";
    }
  }
  if (opt.num_blocks.empty() && !memory_table) usage_error("--num-blocks is required");
  if (opt.schedule == Schedule::kPrefix && opt.mode != Mode::kEngine) {
    usage_error("--schedule prefix: engine mode only (--mode engine)");
  }
  if (opt.window_block_size != 0 &&
      (opt.sliding_window == 0 || opt.window_block_size % opt.block_size != 0)) {
    usage_error("--window-block-size: with --sliding-window, a multiple of --block-size");
  }
  if (opt.schedule == Schedule::kPrefix && opt.sliding_window > 0) {
    usage_error("--schedule prefix: one full-attention group (no --sliding-window)");
  }
  if (opt.eviction != Eviction::kLru) {  // the replay's simulator (belady.hpp)
    const std::string name = to_string(opt.eviction);
    if (opt.mode != Mode::kSequential || !opt.caching || opt.sliding_window > 0 ||
        !tier.host_blocks.empty() || png) {
      usage_error("--eviction " + name +
                  ": sequential mode only, with caching, without "
                  "--sliding-window, --host-blocks or --plot");
    }
#if PAGEDKV_REPLAY_CLUSTER
    if (cluster) usage_error("--eviction " + name + ": not with --engines");
#endif
  }
  if (opt.adaptive_ghost_sample_shift != -1 &&
      (opt.eviction != Eviction::kLru || opt.pool_eviction != pagedkv::EvictionPolicy::kAdaptive)) {
    usage_error("--adaptive-ghost-sample-shift: only with --eviction adaptive");
  }
  if (generate && *generate == "flood") {
    if (opt.mode != Mode::kSequential || opt.eviction != Eviction::kLru ||
        !tier.host_blocks.empty() || opt.sliding_window > 0 || png || csv || table) {
      usage_error(
          "--generate flood: sequential mode, a pool policy (not a simulated one), without "
          "--host-blocks, --sliding-window, --plot, --csv or --table");
    }
#if PAGEDKV_REPLAY_CLUSTER
    if (cluster) usage_error("--generate flood: not with --engines");
#endif
    try {
      flood.seed = gen.seed;
      for (const FloodResult& r : run_flood(opt, flood)) {
        std::cout << to_json(r, opt, flood) << "\n";
      }
      return 0;
    } catch (const pagedkv::Error& e) {
      std::cerr << "pagedkv-replay: " << e.what() << "\n";
      return 1;
    } catch (const std::exception& e) {
      return failed(e);
    }
  }
  try {
    Trace trace;
    if (generate) {
      gen.workload = parse_workload(*generate);
      gen.limit = load.limit;  // only the first K are generated
      trace = pagedkv::replay::generate(gen);
    } else {
      std::string_view name = *trace_path;  // FILE.csv.gz is a compressed CSV
      if (name.size() >= 3 && name.substr(name.size() - 3) == ".gz") name.remove_suffix(3);
      const bool azure =
          format ? *format == "azure" : name.size() >= 4 && name.substr(name.size() - 4) == ".csv";
      trace = azure ? load_azure_csv(*trace_path, load) : load_hashid_jsonl(*trace_path, load);
    }
    if (arrival_rate_scale != 1) {
      for (TraceRequest& r : trace.requests) r.timestamp_ms /= arrival_rate_scale;
    }
    if (trace.skipped_lines != 0) {
      std::cerr << "pagedkv-replay: skipped " << trace.skipped_lines << " malformed lines\n";
    }
    if (trace.requests.empty()) {  // an empty file, or one whose every line was skipped
      std::cerr << "pagedkv-replay: " << (generate ? std::string("the generator") : *trace_path)
                << ": no requests to replay\n";
      return 1;
    }
    if (memory_table) std::cout << memory_utilization_table(trace, opt.block_size);
    if (opt.num_blocks.empty()) return 0;
#if PAGEDKV_REPLAY_CLUSTER
    if (cluster) {
      if (opt.schedule != Schedule::kFcfs) usage_error("--schedule prefix: not with --engines");
      if (tier.host_blocks.size() > 1) usage_error("--engines: one --host-blocks size");
      if (cluster->remote && tier.host_blocks.empty()) {
        usage_error("--remote needs --host-blocks M (remote loads land in host slots)");
      }
      for (const std::int32_t nb : opt.num_blocks) {
        if (cluster->remote) {  // the same cluster without the shared tier, then with it
          ClusterOptions local = *cluster;
          local.remote.reset();
          const ClusterResult without = run_cluster(trace, opt, nb, local, &tier);
          const ClusterResult with = run_cluster(trace, opt, nb, *cluster, &tier);
          std::cout << to_json(with, opt, *cluster, trace, &without) << "\n";
        } else {
          std::cout << to_json(run_cluster(trace, opt, nb, *cluster, &tier), opt, *cluster, trace)
                    << "\n";
        }
      }
      return 0;
    }
#endif

    if (!tier.host_blocks.empty()) return run_with_host_tier(trace, opt, tier, csv, png);
    const auto results =
        opt.eviction != Eviction::kLru ? run_eviction_replay(trace, opt) : run_replay(trace, opt);
    if (table) {
      write_table(results, opt);
    } else {
      for (const ReplayResult& r : results) std::cout << to_json(r, opt, trace) << "\n";
    }
    std::optional<double> ideal;
    if (png) {  // the unbounded cache: every prompt block fits, nothing is ever evicted
      std::uint64_t blocks = 1;
      for (const auto& r : trace.requests)
        blocks += (r.input_length + opt.block_size - 1) / opt.block_size;
      ReplayOptions unbounded = opt;
      unbounded.mode = Mode::kSequential;
      unbounded.num_blocks = {
          static_cast<std::int32_t>(std::min<std::uint64_t>(blocks, 2000000000))};
      ideal = run_replay(trace, unbounded).front().hit_rate();
    }
    if (csv) write_csv(*csv, results, opt, ideal);
    if (png) {
      const std::string data = csv ? *csv : *png + ".csv";
      if (!csv) write_csv(data, results, opt, ideal);
      if (plot(*png, data, trace.name + ": hit rate vs cache size") != 0) return 1;
    }
    return 0;
  } catch (const pagedkv::Error& e) {
    std::cerr << "pagedkv-replay: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    return failed(e);
  }
}
