// Request traces for pagedkv-replay: loading (hash-id JSONL, Azure CSV), token synthesis, and
// seeded workload generators. Part of the tools layer: uses only the public pagedkv API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagedkv/hash/block_hasher.hpp"

namespace pagedkv::replay {

// SplitMix64's finalizer: a fixed, portable 64-bit mix (token synthesis, the replay's seeded
// draws).
constexpr std::uint64_t splitmix64_mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Limits on what a trace file may ask for (docs/tools.md, "Trace files: limits"). A line beyond
// one of them is malformed (skipped under --skip-bad), except an over-long line, which ends the
// load: the reader cannot find where the next line starts without reading the rest of this one.
//  - a prompt (input_length, ContextTokens) and an output (output_length, GeneratedTokens) have at
//    most kMaxTraceTokens tokens each (16 M: far above any model's context; synthesizing a prompt
//    allocates 4 bytes a token);
//  - a line has at most kMaxTraceLineBytes bytes (64 MiB), after decompression;
//  - an ignored JSON value nests at most kMaxTraceJsonDepth arrays and objects;
//  - a JSONL timestamp lies in [-kMaxTraceTimestampMs, kMaxTraceTimestampMs] (about 31,700 years
//    of milliseconds: epoch milliseconds fit; a double still resolves 0.125 ms there).
inline constexpr std::uint32_t kMaxTraceTokens = 1u << 24;
inline constexpr std::size_t kMaxTraceLineBytes = std::size_t{64} << 20;
inline constexpr int kMaxTraceJsonDepth = 64;
inline constexpr double kMaxTraceTimestampMs = 1e15;

// A run of consecutive token ids: first, first + 1, ..., first + count - 1.
struct TokenRun {
  TokenId first = 0;
  std::uint32_t count = 0;
};

struct TraceRequest {
  double timestamp_ms = 0;
  std::uint32_t input_length = 0;   // prompt tokens
  std::uint32_t output_length = 0;  // tokens to decode (engine mode)
  // Hash-id traces: one id per source block of `source_block_size` tokens (DESIGN.md 7).
  std::vector<std::uint32_t> hash_ids;
  // Or the prompt tokens directly (hash_ids empty).
  std::vector<TokenId> tokens;
  // Generated workloads: the prompt is the first input_length tokens of these runs, shared by the
  // requests of a session (each turn extends the previous one's) so that a trace costs memory per
  // request, not per prompt token (hash_ids and tokens empty).
  std::shared_ptr<const std::vector<TokenRun>> runs;
  std::optional<std::string> cache_salt;
};

struct Trace {
  std::string name;
  std::uint32_t source_block_size = 0;  // 0 when the trace carries tokens or lengths only
  std::vector<TraceRequest> requests;
  std::uint64_t skipped_lines = 0;  // malformed lines skipped with --skip-bad
  double load_seconds = 0;          // reading (and decompressing) and parsing the file
};

// Loading options shared by the readers.
struct LoadOptions {
  std::uint32_t source_block_size = 512;  // hash-id traces
  std::uint64_t limit = 0;                // 0: every request
  bool skip_bad = false;                  // count and skip malformed lines instead of failing
};

// Hash-id JSONL: one object per line with timestamp, input_length, output_length, hash_ids
// (other fields are ignored). Either reader takes the file gzip-compressed as well (FILE.gz,
// recognised by its magic bytes), decompressing it as it reads: concatenated gzip members are one
// stream; a truncated stream, or bytes after the last member that are not gzip, throw
// pagedkv::Error naming the file (a whole-file error, even with skip_bad). A malformed line throws
// pagedkv::Error naming file, line and field, unless skip_bad.
Trace load_hashid_jsonl(const std::string& path, const LoadOptions& options);
// Azure LLM inference CSV: TIMESTAMP, ContextTokens, GeneratedTokens (lengths only).
Trace load_azure_csv(const std::string& path, const LoadOptions& options);

// Writes the prompt tokens of request `index` into `out` (replacing its contents). Hash-id
// requests: source block j with id h contributes tokens f(h, i) for its i-th token, so equal ids
// give equal tokens and different ids different tokens; tokens past the ids are unique to the
// request. Length-only requests get tokens unique to the request.
void synthesize_prompt(const Trace& trace, std::size_t index, std::vector<TokenId>& out);
// Output token `i` of request `index`: unique to the request.
TokenId output_token(std::size_t index, std::uint32_t i);

enum class Workload { kAgents, kChat, kTenants };
Workload parse_workload(const std::string& name);

struct GeneratorOptions {
  Workload workload = Workload::kAgents;
  std::uint32_t requests = 1000;
  std::uint32_t seed = 1;
  std::uint32_t tenants = 4;  // kTenants
  // 0: every request; K: only the first K of the `requests` (--limit), the same K requests the
  // whole trace starts with, generated without generating the rest.
  std::uint64_t limit = 0;
};

// Deterministic for equal options:
//  agents  a long shared system prompt and tool definitions, then multi-turn sessions where each
//          turn's prompt is the previous turn's whole context (prompt + output) plus a new message;
//  chat    a shared system prompt, then one independent user message per request;
//  tenants the chat workload replayed by every tenant under its own cache_salt (the same prompts,
//          which must share nothing across tenants).
Trace generate(const GeneratorOptions& options);

}  // namespace pagedkv::replay
