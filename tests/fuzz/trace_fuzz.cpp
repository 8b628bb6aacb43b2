// Fuzz harness: bytes -> a trace file for pagedkv-replay's readers (bench/replay/trace.cpp), a
// hash-id JSONL or an Azure CSV, plain or gzip-compressed (one member or two, or with bytes that
// are not gzip after the stream), loaded strict, with --skip-bad and with --limit.
//
// The first byte chooses: bit 0 the format (JSONL, CSV), bit 1 gzip, bit 2 (gzip) two members
// split at a point the second byte chooses, bit 3 (gzip) trailing bytes that are not gzip, bits
// 4-5 the source block size (1, 16, 64, 512), bits 6-7 the limit (none, 1, 2, 5). The rest is the
// file's text. The harness checks:
//  - a reader returns a trace or throws pagedkv::Error; nothing else (sanitizers catch memory
//    errors);
//  - gzip: the same trace as the plain text, or the same error; trailing bytes that are not gzip
//    are always an error;
//  - strict success: --skip-bad gives the same requests and skips nothing; a --skip-bad failure
//    (a whole-file error) means strict fails too; with --skip-bad every request it keeps parsed
//    on its own line, so no more requests than non-empty lines;
//  - --limit L: the first L requests of the whole load (when strict loading succeeds);
//  - every request is within the documented limits (docs/tools.md, "Trace files: limits"): prompt
//    and output lengths <= kMaxTraceTokens, a prompt of at least one token, at most
//    ceil(input_length / source block size) hash ids, a finite timestamp within
//    kMaxTraceTimestampMs; and synthesize_prompt gives input_length tokens.
//
// Built two ways, like kv_cache_manager_fuzz: a libFuzzer target (PAGEDKV_LIBFUZZER) and a plain
// program replaying files, directories or `--random N` inputs (ctest: tests/fuzz/trace_corpus).
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_replay_main.hpp"
#include "pagedkv/base/error.hpp"
#include "trace.hpp"

namespace {

using namespace pagedkv;
using namespace pagedkv::replay;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "trace_fuzz: %s\n", what.c_str());
  std::abort();
}

// One gzip member holding `text`.
std::string gzip(std::string_view text) {
  z_stream z{};
  if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) fail("deflateInit2");
  std::string out(deflateBound(&z, static_cast<uLong>(text.size())) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) fail("deflate");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// The harness's file, one per process, removed at exit.
struct TempFile {
  std::string path;
  TempFile() {
    char name[] = "/tmp/pagedkv-trace-fuzz-XXXXXX";
    const int fd = mkstemp(name);
    if (fd < 0) fail("mkstemp");
    close(fd);
    path = name;
  }
  ~TempFile() { std::remove(path.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  void write(std::string_view bytes) const {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) fail("cannot write " + path);
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
      fail("short write");
    }
    std::fclose(f);
  }
};

// A load's outcome: the trace, or the error's message without the file's name (the plain and
// gzip loads read the same path, so the messages are comparable as they are).
struct Outcome {
  std::optional<Trace> trace;
  std::string error;
};

Outcome load(const TempFile& file, bool csv, std::uint32_t source_block_size, bool skip_bad,
             std::uint64_t limit) {
  LoadOptions o;
  o.source_block_size = source_block_size;
  o.skip_bad = skip_bad;
  o.limit = limit;
  Outcome out;
  try {
    out.trace = csv ? load_azure_csv(file.path, o) : load_hashid_jsonl(file.path, o);
  } catch (const Error& e) {
    out.error = e.what();
    if (out.error.empty()) fail("an error without a message");
  } catch (const std::exception& e) {
    fail(std::string("a reader threw something other than pagedkv::Error: ") + e.what());
  }
  return out;
}

bool same_request(const TraceRequest& a, const TraceRequest& b) {
  return a.timestamp_ms == b.timestamp_ms && a.input_length == b.input_length &&
         a.output_length == b.output_length && a.hash_ids == b.hash_ids && a.tokens == b.tokens &&
         a.cache_salt == b.cache_salt;
}

// The first n requests of a and b are equal.
bool same_prefix(const Trace& a, const Trace& b, std::size_t n) {
  if (a.requests.size() < n || b.requests.size() < n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    if (!same_request(a.requests[i], b.requests[i])) return false;
  }
  return true;
}

void check_limits(const Trace& t, std::uint32_t source_block_size) {
  std::vector<TokenId> prompt;
  for (std::size_t i = 0; i < t.requests.size(); ++i) {
    const TraceRequest& r = t.requests[i];
    if (r.input_length == 0) fail("a request with an empty prompt");
    if (r.input_length > kMaxTraceTokens || r.output_length > kMaxTraceTokens) {
      fail("a length past kMaxTraceTokens");
    }
    const std::uint64_t ids =
        (std::uint64_t{r.input_length} + source_block_size - 1) / source_block_size;
    if (r.hash_ids.size() > ids) fail("more hash ids than the prompt's source blocks");
    if (!std::isfinite(r.timestamp_ms) || std::fabs(r.timestamp_ms) > kMaxTraceTimestampMs) {
      fail("a timestamp outside the limits");
    }
    if (r.input_length <= (1u << 16)) {  // larger prompts: checked above, not synthesized
      synthesize_prompt(t, i, prompt);
      if (prompt.size() != r.input_length) fail("synthesize_prompt: wrong length");
    }
  }
}

void run_one(const std::uint8_t* data, std::size_t size) {
  static const TempFile file;
  if (size < 2) return;
  const std::uint8_t flags = data[0];
  const std::uint8_t split_at = data[1];
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const bool csv = (flags & 1) != 0;
  const bool gz = (flags & 2) != 0;
  const bool two_members = gz && (flags & 4) != 0;
  const bool junk = gz && (flags & 8) != 0;
  constexpr std::uint32_t kSourceBlockSizes[] = {1, 16, 64, 512};
  const std::uint32_t sbs = kSourceBlockSizes[(flags >> 4) & 3];
  constexpr std::uint64_t kLimits[] = {0, 1, 2, 5};
  const std::uint64_t limit = kLimits[(flags >> 6) & 3];

  // The plain text: strict, --skip-bad, --limit.
  file.write(text);
  const Outcome strict = load(file, csv, sbs, false, 0);
  const Outcome lenient = load(file, csv, sbs, true, 0);
  if (strict.trace) {
    check_limits(*strict.trace, sbs);
    if (!lenient.trace) fail("--skip-bad failed where the strict load did not: " + lenient.error);
    if (lenient.trace->skipped_lines != 0 ||
        lenient.trace->requests.size() != strict.trace->requests.size() ||
        !same_prefix(*strict.trace, *lenient.trace, strict.trace->requests.size())) {
      fail("--skip-bad changed a trace that loads strict");
    }
    if (limit != 0) {
      const Outcome limited = load(file, csv, sbs, false, limit);
      const std::size_t n = std::min<std::size_t>(limit, strict.trace->requests.size());
      if (!limited.trace || limited.trace->requests.size() != n ||
          !same_prefix(*limited.trace, *strict.trace, n)) {
        fail("--limit did not give the first requests");
      }
    }
  }
  if (lenient.trace) {
    check_limits(*lenient.trace, sbs);
    std::uint64_t lines = 0;
    for (const char c : text) lines += c == '\n';
    if (lenient.trace->requests.size() + lenient.trace->skipped_lines > lines + 1) {
      fail("more requests and skipped lines than lines");
    }
  } else if (strict.trace) {
    fail("unreachable");
  }
  if (!gz) return;

  // The same text gzip-compressed: the same outcome (errors included), unless junk follows.
  std::string bytes;
  if (two_members) {
    const std::size_t cut = text.empty() ? 0 : split_at % (text.size() + 1);
    bytes = gzip(text.substr(0, cut)) + gzip(text.substr(cut));
  } else {
    bytes = gzip(text);
  }
  if (junk) {
    // Not the start of a member: never 0x1f first.
    const std::uint8_t first = split_at == 0x1f ? 0x20 : split_at;
    bytes.push_back(static_cast<char>(first));
    bytes.append(text.substr(0, std::min<std::size_t>(text.size(), 16)));
  }
  file.write(bytes);
  const Outcome gz_strict = load(file, csv, sbs, false, 0);
  const Outcome gz_lenient = load(file, csv, sbs, true, 0);
  if (junk) {
    if (gz_lenient.trace) fail("bytes after the gzip stream were not refused");
    if (gz_strict.trace) fail("bytes after the gzip stream were not refused (strict)");
    return;
  }
  for (const auto& [plain, packed] : {std::pair{&strict, &gz_strict}, {&lenient, &gz_lenient}}) {
    if (plain->trace.has_value() != packed->trace.has_value()) {
      fail("gzip changed whether the trace loads: '" + plain->error + "' against '" +
           packed->error + "'");
    }
    if (plain->trace) {
      if (plain->trace->requests.size() != packed->trace->requests.size() ||
          plain->trace->skipped_lines != packed->trace->skipped_lines ||
          !same_prefix(*plain->trace, *packed->trace, plain->trace->requests.size())) {
        fail("gzip changed the trace");
      }
    } else if (plain->error != packed->error) {
      fail("gzip changed the error: '" + plain->error + "' against '" + packed->error + "'");
    }
  }
}

}  // namespace

PAGEDKV_FUZZ_ENTRY_POINTS("trace_fuzz", run_one, 512)
