// pagedkv-tiny-engine: a small real transformer served with pagedkv's paged KV cache and
// automatic prefix caching; --compare proves that caching changes nothing but the work done
// (exactly on the CPU; on CUDA within the kernels' rounding, near-tie aware: caching_verdict.hpp).
#include <sys/sysinfo.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <limits>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "backend.hpp"
#include "caching_verdict.hpp"
#include "engine.hpp"
#include "model.hpp"
#include "pagedkv/device/kv_dtype.hpp"
#include "workload.hpp"

namespace {

constexpr const char* kUsage = R"(usage: pagedkv-tiny-engine [options]

Serves a seeded workload with a small decoder-only transformer (fp32 math, paged KV cache
managed by pagedkv) on the CPU or, with --device cuda, on the GPU through pagedkv's CUDA
kernels, and reports what prefix caching saved.

  --compare              run with prefix caching on and off; exit 1 unless they agree. CPU
                         (rule "exact"): identical greedy token streams and logits within 1e-5
                         relative (bit-identical in practice); a divergence fails. CUDA (rule
                         "near_tie_aware"): logits within 1e-2 relative (a token's K/V comes
                         from the decode kernel when it was generated, from the extend kernel
                         when a later prompt is recomputed without caching; the two round
                         differently); when the free-running streams differ, caching off is
                         served once more forced onto the caching-on streams, and the run passes
                         only if, step by step, logits agree within 1e-2 and each caching-on
                         greedy token is the forced run's argmax or a near-tie within 1e-2
                         (caching_decided_by and caching_forced_* say which rule decided)
  --device NAME          cpu (default: pagedkv's CPU reference kernels) or cuda (weights and KV
                         on the GPU; kv_append, extend and decode attention through pagedkv::cuda;
                         exits 1 with a message when no CUDA device is visible)
  --check-against-cpu    with --device cuda: also serve the workload on the CPU path (same model,
                         same caching), free-running and forced onto the GPU's token streams;
                         exit 1 unless, step by step on the same streams, logits agree within
                         1e-2 relative and each GPU greedy token is the CPU's argmax or a
                         near-tie within 1e-2 (bf16 attention on tensor cores against double
                         references cannot promise identical free-running streams: a rounding
                         difference at a near-tie changes the continuation; both are reported)
  --json                 print one JSON object instead of text
  --no-caching           (without --compare) run with prefix caching off
  --workload NAME        agents (default: multi-turn sessions) or chat (one message each)
  --sessions N           sessions (default 6)
  --turns N              turns per agent session (default 3)
  --system-tokens N      shared system prompt + tools, in tokens (default 160)
  --num-blocks N         KV pool blocks including the null block (default 1024). The pool and
                         the host tier (--host-blocks) must fit in the machine's memory and swap
                         together, else a usage error (exit 2) names the flags and the bytes; an
                         allocation failing anyway exits 1 with "out of memory" and the same figures
  --block-size N         tokens per block (default 16)
  --hash SCHEME          the cache's hash scheme: sha256 (default), sha256_cbor_vllm (vLLM's
                         hashes, so a vLLM router can index them) or xxh3_128
  --kv-events ENDPOINT   publish the KV events on vLLM's ZeroMQ wire, one batch per step
                         (e.g. tcp://*:5557 binds, tcp://127.0.0.1:5557 connects)
  --host-blocks N        host-memory tier of N blocks behind the KV pool (default 0: none; CPU
                         path; with --compare only the caching run has it): hits continue in the
                         host tier and are loaded (K/V copied through the host buffer) instead
                         of recomputed
  --host-policy NAME     write_back (default), write_through or write_through_selective
  --remote URL           redis://[[user]:password@]HOST[:PORT]/NAMESPACE: a shared remote tier
                         on Redis below the host tier (needs --host-blocks; with --compare only
                         the caching run has it). Arriving requests probe Redis for their prefix
                         beyond the GPU and host hits and wait for it at most 1 s; hits are
                         fetched into host slots and loaded from there; every block the host tier
                         caches is written to Redis (--host-policy write_through: every computed
                         block), and the run waits for those puts at exit. A Redis that is down
                         or slow means misses, never a failure. Values carry a fingerprint of
                         the model, KV dtype and block size: another model's blocks are misses
  --disk DIR             the remote tier on a local-disk store (pagedkv::DiskStore) in DIR
                         instead of Redis (same as --remote file://DIR; needs --host-blocks): it
                         survives the process, so a second run on the same DIR loads what the
                         first computed. A damaged file (truncated, flipped bytes) gives counted
                         misses (remote_rejected_values, remote_disk_truncated), never wrong K/V
  --disk-gib G           the disk store's capacity in GiB (default 1; fractions allowed)
  --token-budget N       tokens per scheduler step (default 128)
  --max-seqs N           running requests at most (default 16)
  --kv-dtype NAME        bf16 (default), fp16, fp8_e4m3 or fp8_e5m2 (FP8: 1-byte K/V codes with
                         a per-(token, KV head) scale computed by kv_append and stored in the
                         block; q and attention outputs stay bf16)
  --kv-scale-mode MODE   with an FP8 --kv-dtype: per_token_head (default; as above) or
                         per_tensor: one K and one V scale per layer, fixed by the engine from a
                         calibration pass (256 seeded random tokens through the model in fp32,
                         each layer's largest |K| and |V| / the FP8 largest finite; values beyond
                         saturate); the blocks then hold codes only
  --decode-kernel NAME   with --device cuda: tensor_core_wide_merge, tensor_core, simt,
                         tensor_core_fp8 (FP8 KV on tensor cores; with 16-bit KV, tensor_core)
                         or tensor_core_fp8_direct (the same, codes straight into MMA fragments)
                         (pagedkv::DecodeKernel; default: the library's default,
                         tensor_core_wide_merge);
                         rejected without --device cuda (the CPU path has one implementation,
                         the references)
  --extend-kernel NAME   with --device cuda: mma16, fa2, fa2_lean (fa2 with a leaner softmax),
                         wgmma, wgmma_pipelined, wgmma_ws, wgmma_ws_pingpong,
                         wgmma_ws_persistent or fa2_fp8 (FP8 KV on tensor cores; with 16-bit
                         KV, fa2)
                         (pagedkv::ExtendKernel; default: the library's default, fa2; the
                         wgmma ones fall back to fa2 off sm_90 or at another head_dim than
                         128); rejected without --device cuda
  --vs-bf16              with an FP8 --kv-dtype: also serve the workload with bf16 KV, forced
                         onto the FP8 run's token streams, and report the logit difference
  --head-dim N           attention head size, a multiple of 8 up to 256 (default 32 on the CPU,
                         64 with --device cuda, whose kernels take 64, 128 or 256); the rest of
                         the model (4 layers, d_model 256, 8 query / 2 KV heads) stays
  --model-seed N         weight seed (default 1)
  --workload-seed N      workload seed (default 7)
  --help                 this text
)";

// Relative logit tolerances (max |a - b| over the vocabulary / max |b|, per generated token).
constexpr double kCachingTolerance = 1e-5;  // caching on vs off, CPU (CachingRule::kExact)
// Caching on vs off, CUDA (CachingRule::kNearTieAware, see --help): also the tie tolerance of
// its forced comparison (caching_verdict.hpp says why the two are one figure).
constexpr double kCudaCachingTolerance = 1e-2;
constexpr double kCpuTolerance = 1e-2;  // --check-against-cpu: GPU kernels vs CPU references

struct Options {
  bool compare = false;
  bool json = false;
  bool caching = true;
  bool check_against_cpu = false;
  bool vs_bf16 = false;
  bool kv_scale_mode_given = false;
  bool head_dim_given = false;
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

// The host memory the flags ask for, computed up front in checked 64-bit arithmetic: the CPU
// path's KV pool (--num-blocks blocks, each K and V of every layer: --block-size tokens x KV heads
// x --head-dim values of --kv-dtype, FP8 scales included) and the host tier (--host-blocks + 1
// slots of one block). A run fills both (every byte written), so more than the machine's memory
// and swap together cannot be served; past that, an allocation can still fail (std::bad_alloc:
// other processes, an address-space limit, --compare's second engine), which main reports with
// these figures.
struct Footprint {
  std::uint64_t block_bytes = 0;      // one block of every plane
  std::uint64_t kv_pool_bytes = 0;    // 0 when the pool lives on the GPU (--device cuda)
  std::uint64_t host_tier_bytes = 0;  // 0 without --host-blocks
  bool overflow = false;              // a product past 64 bits
  std::string kv_pool;                // the figures with the flags that set them
  std::string host_tier;
};

// a * b, or nullopt past 64 bits.
std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

std::string gib(std::uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g GiB", static_cast<double>(bytes) / double(1ull << 30));
  return buf;
}

Footprint footprint(const Options& o) {
  Footprint f;
  const tiny_engine::ModelConfig& m = o.model;
  const tiny_engine::EngineConfig& e = o.engine;
  const bool scaled =
      pagedkv::is_fp8(e.kv_dtype) && e.kv_scale_mode == pagedkv::KVScaleMode::kPerTokenHead;
  // One block of one plane, as the engine lays it out (KVLayout::nhd / nhd_scaled).
  const pagedkv::KVLayout layout =
      scaled ? pagedkv::KVLayout::nhd_scaled(1, static_cast<std::int32_t>(e.block_size),
                                             m.num_kv_heads, m.head_dim)
             : pagedkv::KVLayout::nhd(1, static_cast<std::int32_t>(e.block_size), m.num_kv_heads,
                                      m.head_dim);
  const auto planes = 2 * static_cast<std::uint64_t>(m.num_layers);
  std::optional<std::uint64_t> block = checked_mul(static_cast<std::uint64_t>(layout.stride_block),
                                                   pagedkv::bytes_per_value(e.kv_dtype));
  if (block) block = checked_mul(*block, planes);
  std::optional<std::uint64_t> pool, host;
  if (block) {
    pool = checked_mul(static_cast<std::uint64_t>(e.num_blocks), *block);
    host = checked_mul(static_cast<std::uint64_t>(e.num_host_blocks) + 1, *block);
  }
  f.overflow = !pool || !host;
  f.block_bytes = block.value_or(0);
  const bool host_pool = e.device == tiny_engine::Device::kCpu || o.check_against_cpu;
  f.kv_pool_bytes = host_pool ? pool.value_or(0) : 0;
  f.host_tier_bytes = e.num_host_blocks > 0 ? host.value_or(0) : 0;
  const std::string per_block = f.overflow
                                    ? std::string("blocks of more than 2^64 bytes in all")
                                    : "blocks of " + std::to_string(f.block_bytes) + " bytes";
  f.kv_pool = "the KV pool " +
              (f.overflow ? std::string("needs more than 2^64 bytes")
                          : "needs " + std::to_string(pool.value_or(0)) + " bytes (" +
                                gib(pool.value_or(0)) + ")") +
              ": --num-blocks " + std::to_string(e.num_blocks) + " " + per_block +
              " (--block-size " + std::to_string(e.block_size) + ", --head-dim " +
              std::to_string(m.head_dim) + ", --kv-dtype " +
              std::string(pagedkv::to_string(e.kv_dtype)) + "; " + std::to_string(m.num_layers) +
              " layers of K and V, " + std::to_string(m.num_kv_heads) + " KV heads)";
  if (e.num_host_blocks > 0) {
    f.host_tier = "the host tier " +
                  (f.overflow ? std::string("needs more than 2^64 bytes")
                              : "needs " + std::to_string(f.host_tier_bytes) + " bytes (" +
                                    gib(f.host_tier_bytes) + ")") +
                  ": --host-blocks " + std::to_string(e.num_host_blocks) +
                  " + 1 slots of one block";
  }
  return f;
}

std::string describe(const Footprint& f) {
  return f.host_tier.empty() ? f.kv_pool : f.kv_pool + "; " + f.host_tier;
}

// Sizes that cannot be served on this machine, whatever else runs: a usage error (exit 2)
// naming the flags, before anything is allocated.
void check_footprint(const Options& o) {
  const Footprint f = footprint(o);
  if (f.overflow) usage_error(describe(f));
  const auto addressable = static_cast<std::uint64_t>(std::numeric_limits<std::ptrdiff_t>::max());
  if (f.kv_pool_bytes > addressable || f.host_tier_bytes > addressable ||
      f.kv_pool_bytes + f.host_tier_bytes > addressable) {  // each below 2^63: the sum fits
    usage_error(describe(f) + ": more than one process can address");
  }
  const std::uint64_t needed = f.kv_pool_bytes + f.host_tier_bytes;
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return;
  const auto memory =
      checked_mul(static_cast<std::uint64_t>(info.totalram) + info.totalswap, info.mem_unit);
  if (memory && needed > *memory) {
    usage_error(describe(f) + ": more than this machine's " + std::to_string(*memory) + " bytes (" +
                gib(*memory) + ") of memory and swap");
  }
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
    } else if (a == "--check-against-cpu") {
      o.check_against_cpu = true;
    } else if (a == "--device") {
      const std::string v(value());
      if (v == "cpu") {
        o.engine.device = tiny_engine::Device::kCpu;
      } else if (v == "cuda") {
        o.engine.device = tiny_engine::Device::kCuda;
      } else {
        usage_error("--device: expected cpu or cuda, got '" + v + "'");
      }
    } else if (a == "--head-dim") {
      o.model.head_dim = static_cast<std::int32_t>(count(8, 256));
      if (o.model.head_dim % 8 != 0) usage_error("--head-dim: expected a multiple of 8");
      o.head_dim_given = true;
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
    } else if (a == "--host-blocks") {
      o.engine.num_host_blocks = static_cast<std::int32_t>(count(0, 1u << 22));
    } else if (a == "--host-policy") {
      const std::string v(value());
      const auto policy = pagedkv::parse_host_policy(v);
      if (!policy) {
        usage_error(
            "--host-policy: expected write_back, write_through or "
            "write_through_selective, got '" +
            v + "'");
      }
      o.engine.host_policy = *policy;
    } else if (a == "--hash") {
      const std::string v(value());
      try {
        o.engine.hash_scheme = pagedkv::parse_hash_scheme(v);
      } catch (const pagedkv::Error& e) {
        usage_error(std::string("--hash: ") + e.what());
      }
    } else if (a == "--kv-events") {
      o.engine.kv_events_endpoint = std::string(value());
#if !TINY_ENGINE_HAS_EVENTS
      usage_error("--kv-events: this build has no pagedkv::events layer (ZeroMQ)");
#endif
    } else if (a == "--remote") {
      o.engine.remote_url = std::string(value());
      const std::string problem = tiny_engine::RemoteLink::check_url(o.engine.remote_url);
      if (!problem.empty()) usage_error("--remote: " + problem);
    } else if (a == "--disk") {
      const std::string dir(value());
      if (dir.empty()) usage_error("--disk: an empty directory name");
      o.engine.remote_url = "file://" + dir;
    } else if (a == "--disk-gib") {
      const std::string g(value());
      char* end = nullptr;
      const double gib = std::strtod(g.c_str(), &end);
      if (g.empty() || *end != '\0' || !(gib > 0) || gib > 65536) {
        usage_error("--disk-gib: '" + g + "' is not a size in GiB in (0, 65536]");
      }
      o.engine.disk_bytes = static_cast<std::uint64_t>(gib * double(1ull << 30));
    } else if (a == "--token-budget") {
      o.engine.max_num_batched_tokens = static_cast<std::uint32_t>(count(1, 1u << 16));
    } else if (a == "--max-seqs") {
      o.engine.max_num_seqs = static_cast<std::uint32_t>(count(1, 4096));
    } else if (a == "--kv-dtype") {
      const std::string v(value());
      if (!pagedkv::parse_kv_dtype(v, o.engine.kv_dtype)) {
        usage_error("--kv-dtype: expected bf16, fp16, fp8_e4m3 or fp8_e5m2, got '" + v + "'");
      }
    } else if (a == "--kv-scale-mode") {
      const std::string v(value());
      if (!pagedkv::parse_kv_scale_mode(v, o.engine.kv_scale_mode) ||
          o.engine.kv_scale_mode == pagedkv::KVScaleMode::kNone) {
        usage_error("--kv-scale-mode: expected per_token_head or per_tensor, got '" + v + "'");
      }
      o.kv_scale_mode_given = true;
    } else if (a == "--decode-kernel") {
      const std::string v(value());
      if (v == "simt") {
        o.engine.decode_kernel = 0;
      } else if (v == "tensor_core") {
        o.engine.decode_kernel = 1;
      } else if (v == "tensor_core_wide_merge") {
        o.engine.decode_kernel = 2;
      } else if (v == "tensor_core_fp8") {
        o.engine.decode_kernel = 3;
      } else if (v == "tensor_core_fp8_direct") {
        o.engine.decode_kernel = 5;
      } else {
        usage_error(
            "--decode-kernel: expected simt, tensor_core, tensor_core_wide_merge, "
            "tensor_core_fp8 or tensor_core_fp8_direct, got '" +
            v + "'");
      }
    } else if (a == "--extend-kernel") {
      const std::string v(value());
      if (v == "mma16") {
        o.engine.extend_kernel = 0;
      } else if (v == "fa2") {
        o.engine.extend_kernel = 1;
      } else if (v == "wgmma") {
        o.engine.extend_kernel = 2;
      } else if (v == "wgmma_pipelined") {
        o.engine.extend_kernel = 3;
      } else if (v == "wgmma_ws") {
        o.engine.extend_kernel = 4;
      } else if (v == "wgmma_ws_pingpong") {
        o.engine.extend_kernel = 5;
      } else if (v == "fa2_fp8") {
        o.engine.extend_kernel = 6;
      } else if (v == "wgmma_ws_persistent") {
        o.engine.extend_kernel = 7;
      } else if (v == "fa2_lean") {
        o.engine.extend_kernel = 8;
      } else {
        usage_error(
            "--extend-kernel: expected mma16, fa2, fa2_lean, wgmma, wgmma_pipelined, wgmma_ws, "
            "wgmma_ws_pingpong, wgmma_ws_persistent or fa2_fp8, got '" +
            v + "'");
      }
    } else if (a == "--vs-bf16") {
      o.vs_bf16 = true;
    } else if (a == "--model-seed") {
      o.model.seed = count(0, UINT64_MAX);
    } else if (a == "--workload-seed") {
      o.workload.seed = count(0, UINT64_MAX);
    } else {
      usage_error("unknown option '" + std::string(a) + "'");
    }
  }
  if (o.compare && !o.caching) usage_error("--no-caching and --compare exclude each other");
  if (o.kv_scale_mode_given && !pagedkv::is_fp8(o.engine.kv_dtype)) {
    usage_error("--kv-scale-mode needs an FP8 --kv-dtype (fp8_e4m3 or fp8_e5m2)");
  }
  if (o.vs_bf16 && !pagedkv::is_fp8(o.engine.kv_dtype)) {
    usage_error("--vs-bf16 needs an FP8 --kv-dtype (fp8_e4m3 or fp8_e5m2)");
  }
  if (o.engine.device != tiny_engine::Device::kCuda) {
    // The CPU path has one attention implementation (the references): a kernel choice there
    // would be silently ignored.
    if (o.engine.decode_kernel >= 0) usage_error("--decode-kernel needs --device cuda");
    if (o.engine.extend_kernel >= 0) usage_error("--extend-kernel needs --device cuda");
  }
  if (o.check_against_cpu && o.engine.device != tiny_engine::Device::kCuda) {
    usage_error("--check-against-cpu needs --device cuda");
  }
  if (o.engine.num_host_blocks > 0 && o.engine.device != tiny_engine::Device::kCpu) {
    usage_error("--host-blocks runs on the CPU path only (--device cpu)");
  }
  if (o.engine.num_host_blocks > 0 && !o.compare && !o.caching) {
    usage_error("--host-blocks needs prefix caching (drop --no-caching)");
  }
  if (!o.engine.remote_url.empty() && o.engine.num_host_blocks == 0) {
    usage_error("--remote needs a host tier (--host-blocks N)");
  }
  if (!o.head_dim_given && o.engine.device == tiny_engine::Device::kCuda) o.model.head_dim = 64;
  o.workload.vocab_size = o.model.vocab_size;
  return o;
}

// `s` as a JSON string, quotes included: '"' and '\\' escaped, control characters (and DEL) as
// \u00XX, and a byte that does not start a valid UTF-8 sequence as \ufffd (JSON text is Unicode;
// --remote's namespace is whatever the user typed).
std::string json_string(std::string_view s) {
  std::string out = "\"";
  const auto byte = [&s](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto continuation = [&](std::size_t i) { return i < s.size() && (byte(i) & 0xC0) == 0x80; };
  for (std::size_t i = 0; i < s.size();) {
    const unsigned char c = byte(i);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      ++i;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
    } else {
      // A well-formed sequence (no overlong forms, no surrogates, at most U+10FFFF) is copied.
      std::size_t n = 0;
      unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
      if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
      } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      }
      bool ok = n > 0 && i + 1 < s.size() && byte(i + 1) >= lo && byte(i + 1) <= hi;
      for (std::size_t k = 2; ok && k < n; ++k) ok = continuation(i + k);
      if (ok) {
        out.append(s, i, n);
        i += n;
      } else {
        out += "\\ufffd";
        ++i;
      }
    }
  }
  out += '"';
  return out;
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

// FNV-1a over every request's id, greedy tokens and logits' bits: two runs (two processes) with
// equal digests produced the same tokens and bitwise-identical logits.
std::string results_digest(const tiny_engine::RunResult& r) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto mix = [&h](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  };
  for (const auto& q : r.requests) {
    mix(&q.id, sizeof q.id);
    mix(q.output.data(), q.output.size() * sizeof(q.output[0]));
    mix(q.logits.data(), q.logits.size() * sizeof(float));
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
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
    << ",\"kv_event_batches" << sfx << "\":" << s.kv_event_batches << ",\"max_running" << sfx
    << "\":" << s.max_running;
  if (s.host) {
    j << ",\"host_hit_tokens" << sfx << "\":" << s.host_hit_tokens << ",\"host_loaded_blocks" << sfx
      << "\":" << s.host->loaded_blocks << ",\"host_stored_blocks" << sfx
      << "\":" << s.host->stored_blocks << ",\"host_loaded_bytes" << sfx
      << "\":" << s.host->loaded_bytes << ",\"host_stored_bytes" << sfx
      << "\":" << s.host->stored_bytes << ",\"host_evictions" << sfx
      << "\":" << s.host->host_evictions;
  }
  if (s.remote) {
    const tiny_engine::RemoteRunStats& m = *s.remote;
    j << ",\"remote_namespace" << sfx << "\":" << json_string(m.name_space)
      << ",\"remote_probed_blocks" << sfx << "\":" << m.probed_blocks << ",\"remote_hit_blocks"
      << sfx << "\":" << m.loaded_blocks << ",\"remote_hit_tokens" << sfx
      << "\":" << m.remote_hit_tokens << ",\"remote_loaded_bytes" << sfx << "\":" << m.loaded_bytes
      << ",\"remote_load_misses" << sfx << "\":" << m.load_misses << ",\"remote_stored_blocks"
      << sfx << "\":" << m.stored_blocks << ",\"remote_stored_bytes" << sfx
      << "\":" << m.stored_bytes << ",\"remote_puts_skipped" << sfx << "\":" << m.puts_skipped
      << ",\"remote_puts_failed" << sfx << "\":" << m.puts_failed << ",\"remote_store_errors" << sfx
      << "\":" << m.store_errors << ",\"remote_store_timeouts" << sfx << "\":" << m.store_timeouts
      << ",\"remote_rejected_values" << sfx << "\":" << m.rejected_values
      << ",\"remote_binding_mismatches" << sfx << "\":" << m.binding_mismatches
      << ",\"remote_ready_by_timeout" << sfx << "\":" << m.ready_by_timeout << ",\"remote_drained"
      << sfx << "\":" << (m.drained ? "true" : "false");
    if (m.disk) {
      j << ",\"remote_disk_recovered" << sfx << "\":" << m.disk_recovered
        << ",\"remote_disk_invalid" << sfx << "\":" << m.disk_invalid << ",\"remote_disk_truncated"
        << sfx << "\":" << m.disk_truncated;
    }
  }
  j << ",\"results_digest" << sfx << "\":" << json_string(results_digest(r));
}

void print_run_text(const char* title, const tiny_engine::RunResult& r) {
  const tiny_engine::RunStats& s = r.stats;
  std::cout << title << ": " << s.steps << " steps, " << s.prefill_tokens
            << " prefill tokens computed (" << s.hit_tokens
            << " taken from the prefix cache, hit rate " << num(s.cache.hit_rate()) << "), "
            << s.decode_tokens << " decode tokens, " << s.preemptions << " preemptions\n  prefill "
            << num(s.prefill_seconds) << " s, decode " << num(s.decode_seconds) << " s, total "
            << num(s.total_seconds) << " s, TTFT p50 " << num(ttft_p50(r)) << " s\n";
  if (s.host) {
    std::cout << "  host tier: " << s.host_hit_tokens << " hit tokens loaded from it, "
              << s.host->loaded_blocks << " blocks loaded (" << s.host->loaded_bytes << " bytes), "
              << s.host->stored_blocks << " stored (" << s.host->stored_bytes << " bytes), "
              << s.host->host_evictions << " host evictions\n";
  }
  if (s.remote) {
    const tiny_engine::RemoteRunStats& m = *s.remote;
    std::cout << "  remote tier (" << m.name_space << "): " << m.loaded_blocks
              << " remote hit blocks (" << m.remote_hit_tokens << " tokens, " << m.loaded_bytes
              << " bytes) of " << m.probed_blocks << " probed, " << m.load_misses
              << " load misses; " << m.stored_blocks << " blocks stored (" << m.stored_bytes
              << " bytes), " << m.puts_skipped + m.puts_failed << " puts skipped or failed; "
              << m.store_errors << " store errors, " << m.store_timeouts << " timeouts, "
              << m.rejected_values << " rejected values (" << m.binding_mismatches
              << " of another block)" << (m.drained ? "" : "; puts still in flight at exit")
              << "\n";
  }
}

// Where two runs' greedy token streams first differ, or "" when they do not.
std::string first_token_divergence(const tiny_engine::RunResult& a,
                                   const tiny_engine::RunResult& b) {
  for (std::size_t i = 0; i < std::min(a.requests.size(), b.requests.size()); ++i) {
    const auto& x = a.requests[i].output;
    const auto& y = b.requests[i].output;
    for (std::size_t t = 0; t < std::min(x.size(), y.size()); ++t) {
      if (x[t] != y[t]) {
        return "request " + std::to_string(a.requests[i].id) + " token " + std::to_string(t) +
               ": " + std::to_string(x[t]) + " vs " + std::to_string(y[t]);
      }
    }
    if (x.size() != y.size()) return "request " + std::to_string(a.requests[i].id) + ": lengths";
  }
  return a.requests.size() == b.requests.size() ? "" : "different numbers of requests";
}

void print_comparison(const char* what, const tiny_engine::Comparison& c, double tolerance) {
  std::cout << what << ": identical greedy tokens: " << (c.identical_tokens ? "yes" : "NO")
            << "; max relative logit difference " << num(c.max_rel_logit_diff)
            << (c.bitwise_identical_logits ? " (bitwise identical)" : "") << " (tolerance "
            << num(tolerance) << ")\n";
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  check_footprint(o);
  try {
    const tiny_engine::Model model(o.model);
    const tiny_engine::Workload workload = tiny_engine::make_workload(o.workload);
    tiny_engine::EngineConfig config = o.engine;
    const bool cuda = config.device == tiny_engine::Device::kCuda;
    // The primary run: caching as asked (on for --compare). Built first, so that a missing GPU
    // fails before anything is printed.
    config.enable_caching = o.compare || o.caching;
    tiny_engine::Engine primary_engine(model, config);

    std::ostringstream j;
    j << "{\"workload\":" << json_string(workload.name)
      << ",\"requests\":" << workload.num_requests()
      << ",\"model\":" << json_string(model.describe())
      << ",\"device\":" << json_string(to_string(config.device))
      << ",\"kv_dtype\":" << json_string(pagedkv::to_string(config.kv_dtype));
    if (pagedkv::is_fp8(config.kv_dtype)) {
      j << ",\"kv_scale_mode\":" << json_string(pagedkv::to_string(config.kv_scale_mode));
    }
    j << ",\"num_blocks\":" << config.num_blocks << ",\"block_size\":" << config.block_size
      << ",\"token_budget\":" << config.max_num_batched_tokens
      << ",\"host_blocks\":" << config.num_host_blocks
      << ",\"host_policy\":" << json_string(pagedkv::to_string(config.host_policy))
      << ",\"attention\":"
      << json_string(
             cuda
                 ? "pagedkv::cuda kernels: kv_append, paged extend attention (prefill), paged "
                   "decode attention (decode)"
                 : "pagedkv CPU references: extend attention (prefill), decode attention (decode)");
    if (!o.json) {
      std::cout << "model: " << model.describe() << "\ndevice: " << to_string(config.device)
                << ", KV " << pagedkv::to_string(config.kv_dtype);
      if (pagedkv::is_fp8(config.kv_dtype)) {
        std::cout << ", " << pagedkv::to_string(config.kv_scale_mode) << " scales";
        const tiny_engine::EngineConfig& used = primary_engine.config();
        for (std::size_t l = 0; l < used.k_scales.size(); ++l) {
          std::cout << (l == 0 ? " (calibrated per layer: " : ", ") << "L" << l << " k "
                    << num(used.k_scales[l]) << " v " << num(used.v_scales[l]);
        }
        if (!used.k_scales.empty()) std::cout << ")";
      }
      std::cout << "\n";
    }

    const tiny_engine::RunResult primary = primary_engine.run(workload);
    bool pass = true;
    if (o.json) {
      j << ",\"generated_tokens\":" << generated(primary);
    } else {
      std::cout << "workload: " << workload.name << ", " << workload.num_requests() << " requests, "
                << generated(primary) << " tokens generated\n";
    }

    if (!o.compare) {
      if (o.json) {
        j << ",\"caching\":" << (config.enable_caching ? "true" : "false");
        run_fields(j, primary, "");
      } else {
        print_run_text(config.enable_caching ? "prefix caching on" : "prefix caching off", primary);
      }
    } else {
      config.enable_caching = false;
      const tiny_engine::RunResult off = tiny_engine::Engine(model, config).run(workload);
      const tiny_engine::Comparison c = tiny_engine::compare(primary, off);
      const tiny_engine::CachingRule rule =
          cuda ? tiny_engine::CachingRule::kNearTieAware : tiny_engine::CachingRule::kExact;
      const double tolerance = cuda ? kCudaCachingTolerance : kCachingTolerance;
      // Different free-running streams on CUDA: caching off once more, on caching on's tokens.
      std::optional<tiny_engine::ForcedComparison> forced;
      if (tiny_engine::needs_forced_run(rule, c)) {
        tiny_engine::Engine forced_engine(model, config);
        forced_engine.force_tokens(primary);
        forced = tiny_engine::compare_forced(primary, forced_engine.run(workload), tolerance);
      }
      const tiny_engine::CachingVerdict verdict =
          tiny_engine::judge(rule, tolerance, c, forced ? &*forced : nullptr);
      const bool ok = verdict.pass;
      pass = pass && ok;
      const auto saved = static_cast<std::int64_t>(off.stats.prefill_tokens) -
                         static_cast<std::int64_t>(primary.stats.prefill_tokens);
      if (o.json) {
        j << ",\"identical_tokens\":" << (c.identical_tokens ? "true" : "false")
          << ",\"bitwise_identical_logits\":" << (c.bitwise_identical_logits ? "true" : "false")
          << ",\"max_rel_logit_diff\":" << num(c.max_rel_logit_diff)
          << ",\"logit_tolerance\":" << num(tolerance)
          << ",\"caching_rule\":" << json_string(to_string(rule))
          << ",\"caching_decided_by\":" << json_string(to_string(verdict.decided_by))
          << ",\"caching_pass\":" << (ok ? "true" : "false")
          << ",\"caching_forced_run\":" << (forced ? "true" : "false");
        if (forced) {
          j << ",\"caching_forced_same_streams\":" << (forced->same_streams ? "true" : "false")
            << ",\"caching_forced_steps\":" << forced->steps
            << ",\"caching_forced_max_rel_logit_diff\":" << num(forced->max_rel_logit_diff)
            << ",\"caching_forced_argmax_differences\":" << forced->argmax_differences
            << ",\"caching_forced_max_tie_margin\":" << num(forced->max_tie_margin)
            << ",\"caching_tie_tolerance\":" << num(tolerance);
        }
        j << ",\"prefill_tokens_saved\":" << saved;
        run_fields(j, primary, "_on");
        run_fields(j, off, "_off");
        j << ",\"prefill_speedup\":"
          << num(primary.stats.prefill_seconds > 0
                     ? off.stats.prefill_seconds / primary.stats.prefill_seconds
                     : 0);
      } else {
        print_run_text("prefix caching on ", primary);
        print_run_text("prefix caching off", off);
        print_comparison("caching on vs off", c, tolerance);
        if (!c.identical_tokens) {
          std::cout << "caching on vs off: free-running streams first differ at "
                    << first_token_divergence(primary, off) << "\n";
        }
        if (forced) {
          std::cout << "caching on vs off, caching off forced onto the caching-on tokens: "
                    << (forced->same_streams ? "" : "DID NOT FOLLOW; ") << forced->steps
                    << " steps, max relative logit difference " << num(forced->max_rel_logit_diff)
                    << ", greedy choices differ at " << forced->argmax_differences
                    << " steps (largest margin " << num(forced->max_tie_margin)
                    << ", a near-tie when within the tolerance " << num(tolerance) << ")\n";
        }
        std::cout << "caching on vs off: rule " << to_string(rule) << ", decided by the "
                  << (verdict.decided_by == tiny_engine::CachingDecidedBy::kForced
                          ? "forced comparison"
                          : "free-running comparison")
                  << ": " << (ok ? "pass" : "FAIL") << "\n";
        std::cout << "prefill tokens saved: " << saved << "; prefill "
                  << num(off.stats.prefill_seconds) << " s -> "
                  << num(primary.stats.prefill_seconds) << " s; TTFT p50 " << num(ttft_p50(off))
                  << " s -> " << num(ttft_p50(primary)) << " s\n";
        if (!ok) std::cout << "caching on vs off: FAIL: " << verdict.problem << "\n";
      }
    }

    if (o.check_against_cpu) {
      tiny_engine::EngineConfig cpu = config;
      cpu.device = tiny_engine::Device::kCpu;
      cpu.enable_caching = o.compare || o.caching;
      const tiny_engine::RunResult free_run = tiny_engine::Engine(model, cpu).run(workload);
      tiny_engine::Engine forced_engine(model, cpu);
      forced_engine.force_tokens(primary);
      const tiny_engine::RunResult forced = forced_engine.run(workload);
      const tiny_engine::Comparison c = tiny_engine::compare(primary, free_run);
      const tiny_engine::ForcedComparison f =
          tiny_engine::compare_forced(primary, forced, kCpuTolerance);
      const bool ok = f.pass(kCpuTolerance);
      pass = pass && ok;
      if (o.json) {
        j << ",\"cpu_free_running_identical_tokens\":" << (c.identical_tokens ? "true" : "false")
          << ",\"cpu_forced_steps\":" << f.steps
          << ",\"cpu_forced_max_rel_logit_diff\":" << num(f.max_rel_logit_diff)
          << ",\"cpu_forced_argmax_differences\":" << f.argmax_differences
          << ",\"cpu_forced_max_tie_margin\":" << num(f.max_tie_margin)
          << ",\"cpu_logit_tolerance\":" << num(kCpuTolerance)
          << ",\"cpu_total_seconds\":" << num(free_run.stats.total_seconds);
      } else {
        std::cout << "GPU vs CPU path, free-running: identical greedy tokens: "
                  << (c.identical_tokens
                          ? "yes"
                          : "no (first at " + first_token_divergence(primary, free_run) + ")")
                  << "\n"
                  << "GPU vs CPU path, CPU forced onto the GPU's tokens: " << f.steps
                  << " steps, max relative logit difference " << num(f.max_rel_logit_diff)
                  << ", greedy choices differ at " << f.argmax_differences
                  << " near-ties (largest margin " << num(f.max_tie_margin) << ") (tolerance "
                  << num(kCpuTolerance) << ")\n"
                  << "  CPU path: total " << num(free_run.stats.total_seconds) << " s\n";
        if (!ok) std::cout << "GPU vs CPU path: FAIL: " << f.first_problem << "\n";
      }
    }

    if (o.vs_bf16) {
      // The same model with bf16 KV, on the FP8 run's token streams: the logit difference FP8 KV
      // makes (reported, not judged: FP8 is lossy by design).
      tiny_engine::EngineConfig bf16 = config;
      bf16.kv_dtype = pagedkv::KVDtype::kBFloat16;
      bf16.enable_caching = o.compare || o.caching;
      const tiny_engine::RunResult free_run = tiny_engine::Engine(model, bf16).run(workload);
      tiny_engine::Engine forced_engine(model, bf16);
      forced_engine.force_tokens(primary);
      const tiny_engine::RunResult forced = forced_engine.run(workload);
      const tiny_engine::Comparison c = tiny_engine::compare(primary, free_run);
      const tiny_engine::ForcedComparison f = tiny_engine::compare_forced(primary, forced, 1.0);
      if (o.json) {
        j << ",\"bf16_free_running_identical_tokens\":" << (c.identical_tokens ? "true" : "false")
          << ",\"bf16_forced_steps\":" << f.steps
          << ",\"bf16_forced_max_rel_logit_diff\":" << num(f.max_rel_logit_diff)
          << ",\"bf16_forced_argmax_differences\":" << f.argmax_differences
          << ",\"bf16_forced_max_tie_margin\":" << num(f.max_tie_margin);
      } else {
        std::cout << pagedkv::to_string(config.kv_dtype)
                  << " vs bf16 KV, free-running: identical greedy tokens: "
                  << (c.identical_tokens
                          ? "yes"
                          : "no (first at " + first_token_divergence(primary, free_run) + ")")
                  << "\n"
                  << pagedkv::to_string(config.kv_dtype)
                  << " vs bf16 KV, bf16 forced onto the FP8 run's tokens: " << f.steps
                  << " steps, max relative logit difference " << num(f.max_rel_logit_diff)
                  << ", greedy choices differ at " << f.argmax_differences
                  << " steps (largest margin " << num(f.max_tie_margin) << ")\n";
      }
    }

    if (o.json) {
      if (o.compare || o.check_against_cpu) j << ",\"pass\":" << (pass ? "true" : "false");
      std::cout << j.str() << "}\n";
    } else if (o.compare || o.check_against_cpu) {
      std::cout << (pass ? "PASS" : "FAIL") << "\n";
    }
    return pass ? 0 : 1;
  } catch (const std::bad_alloc&) {
    // In range and below the machine's memory (check_footprint), yet not allocatable now.
    std::cerr << "pagedkv-tiny-engine: out of memory (std::bad_alloc): " << describe(footprint(o))
              << (o.compare || o.check_against_cpu || o.vs_bf16
                      ? "; --compare, --check-against-cpu and --vs-bf16 build further engines"
                      : "")
              << "; lower --num-blocks or --host-blocks\n";
    return 1;
  } catch (const tiny_engine::NoCudaDevice& e) {
    std::cerr << "pagedkv-tiny-engine: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "pagedkv-tiny-engine: " << e.what() << "\n";
    return 1;
  }
}
