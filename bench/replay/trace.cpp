#include "trace.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <queue>
#include <random>
#include <string_view>

#include "pagedkv/base/error.hpp"

namespace pagedkv::replay {

namespace {

[[noreturn]] void parse_error(const std::string& path, std::uint64_t line,
                              const std::string& what) {
  throw Error(ErrorCode::kParseError, path + ":" + std::to_string(line) + ": " + what);
}

// A key as quoted in a message: its first 80 bytes, anything but printable ASCII as '?' (a
// decoded "\u001b" must not reach a terminal as an escape).
std::string shown(std::string_view key) {
  std::string out(key.substr(0, 80));
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return out;
}

// A strict reader for one flat JSON object per line.
class JsonLine {
 public:
  JsonLine(std::string_view text, const std::string& path, std::uint64_t line)
      : s_(text), path_(path), line_(line) {}

  [[noreturn]] void fail(const std::string& what) const { parse_error(path_, line_, what); }

  void ws() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\t' || s_[p_] == '\r')) ++p_;
  }
  bool eat(char c) {
    ws();
    if (p_ < s_.size() && s_[p_] == c) {
      ++p_;
      return true;
    }
    return false;
  }
  void expect(char c, const std::string& where) {
    if (!eat(c)) fail(std::string("expected '") + c + "' " + where);
  }
  // A JSON string (a key or an ignored value) with its escapes decoded: \" \\ \/ \b \f \n \r
  // \t, and \uXXXX (a surrogate pair as one code point) as UTF-8, so that "hash\u005fids" is
  // the key hash_ids; any other escape, or a lone surrogate, is malformed. Without escapes the
  // view is into the line; with them, into a buffer the next call reuses.
  std::string_view string() {
    ws();
    if (p_ >= s_.size() || s_[p_] != '"') fail("expected a string");
    const std::size_t start = ++p_;
    while (p_ < s_.size() && s_[p_] != '"' && s_[p_] != '\\') ++p_;
    if (p_ < s_.size() && s_[p_] == '"') return s_.substr(start, p_++ - start);
    decoded_.assign(s_.substr(start, p_ - start));
    while (p_ < s_.size() && s_[p_] != '"') {
      if (s_[p_] != '\\') {
        decoded_ += s_[p_++];
        continue;
      }
      if (++p_ >= s_.size()) break;
      switch (const char e = s_[p_++]) {
        case '"':
        case '\\':
        case '/':
          decoded_ += e;
          break;
        case 'b':
          decoded_ += '\b';
          break;
        case 'f':
          decoded_ += '\f';
          break;
        case 'n':
          decoded_ += '\n';
          break;
        case 'r':
          decoded_ += '\r';
          break;
        case 't':
          decoded_ += '\t';
          break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("a string has a lone low surrogate \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(p_, 2) != "\\u") fail("a string has a lone high surrogate \\u escape");
            p_ += 2;
            const std::uint32_t low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) {
              fail("a string has a lone high surrogate \\u escape");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(cp);
          break;
        }
        default: {
          char shown[8];
          std::snprintf(shown, sizeof shown, e > 0x20 && e < 0x7f ? "%c" : "0x%02X",
                        static_cast<unsigned char>(e));
          fail(std::string("a string has an invalid escape: backslash then '") + shown + "'");
        }
      }
    }
    if (p_ >= s_.size()) fail("unterminated string");
    ++p_;
    return decoded_;
  }
  double number(const std::string& field) {
    ws();
    double v = 0;
    const auto* begin = s_.data() + p_;
    const auto [end, ec] = std::from_chars(begin, s_.data() + s_.size(), v);
    if (ec != std::errc() || !std::isfinite(v)) fail("field '" + field + "': expected a number");
    p_ += static_cast<std::size_t>(end - begin);
    return v;
  }
  std::uint64_t integer(const std::string& field, std::uint64_t max) {
    const double v = number(field);
    if (v < 0 || v != std::floor(v) || v > static_cast<double>(max)) {
      fail("field '" + field + "': expected an integer in [0, " + std::to_string(max) + "]");
    }
    return static_cast<std::uint64_t>(v);
  }
  // A token count: an integer in [1 or 0, kMaxTraceTokens].
  std::uint32_t length(const std::string& field) {
    const double v = number(field);
    if (v < 0 || v != std::floor(v)) fail("field '" + field + "': expected a non-negative integer");
    if (v > kMaxTraceTokens) {
      char text[32];
      std::snprintf(text, sizeof text, "%.0f", v);
      fail("field '" + field + "': " + text + " tokens is more than the limit of " +
           std::to_string(kMaxTraceTokens) + " (kMaxTraceTokens)");
    }
    return static_cast<std::uint32_t>(v);
  }
  // Skips any JSON value (for fields the replay does not use), `depth` arrays and objects deep.
  void skip_value(int depth = 0) {
    ws();
    if (p_ >= s_.size()) fail("missing value");
    const char c = s_[p_];
    if (c == '"') {
      string();
    } else if (c == '[' || c == '{') {
      if (depth >= kMaxTraceJsonDepth) {
        fail("nesting deeper than " + std::to_string(kMaxTraceJsonDepth) + " levels");
      }
      const char close = c == '[' ? ']' : '}';
      ++p_;
      if (eat(close)) return;
      do {
        if (close == '}') {
          string();
          expect(':', "after an object key");
        }
        skip_value(depth + 1);
      } while (eat(','));
      expect(close, "to close a nested value");
    } else if (s_.substr(p_, 4) == "true" || s_.substr(p_, 4) == "null") {
      p_ += 4;
    } else if (s_.substr(p_, 5) == "false") {
      p_ += 5;
    } else {
      number("(ignored)");
    }
  }
  bool at_end() {
    ws();
    return p_ == s_.size();
  }

 private:
  // The 4 hex digits of a \uXXXX escape.
  std::uint32_t hex4() {
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k, ++p_) {
      const char c = p_ < s_.size() ? s_[p_] : '\0';
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (d < 0) fail("a string has a \\u escape without 4 hex digits");
      v = v << 4 | static_cast<std::uint32_t>(d);
    }
    return v;
  }
  void append_utf8(std::uint32_t cp) {
    if (cp < 0x80) {
      decoded_ += static_cast<char>(cp);
    } else if (cp < 0x800) {
      decoded_ += static_cast<char>(0xC0 | cp >> 6);
      decoded_ += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      decoded_ += static_cast<char>(0xE0 | cp >> 12);
      decoded_ += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
      decoded_ += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      decoded_ += static_cast<char>(0xF0 | cp >> 18);
      decoded_ += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
      decoded_ += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
      decoded_ += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string decoded_;  // string()'s escapes decoded
  std::string_view s_;
  std::size_t p_ = 0;
  const std::string& path_;
  std::uint64_t line_;
};

TraceRequest parse_hashid_line(std::string_view text, const std::string& path, std::uint64_t line,
                               std::uint32_t source_block_size) {
  JsonLine j(text, path, line);
  TraceRequest r;
  bool has_ts = false, has_in = false, has_out = false, has_ids = false;
  std::vector<std::string> other_keys;  // the ignored ones (decoded), to refuse one given twice
  auto once = [&](bool& seen, const std::string& key) {
    if (seen) j.fail("field '" + key + "' appears twice");
    seen = true;
  };
  // The ids cover min(input_length, ids * S) tokens; more ids than the prompt needs is malformed
  // (checked as the array is read, against the longest prompt while input_length is unknown).
  auto ids_needed = [&](std::uint64_t tokens) {
    return (tokens + source_block_size - 1) / source_block_size;
  };
  auto too_many_ids = [&] {
    j.fail("field 'hash_ids': " + std::to_string(r.hash_ids.size()) + " ids for " +
           (has_in ? std::to_string(r.input_length) + " tokens"
                   : "at most " + std::to_string(kMaxTraceTokens) + " tokens (kMaxTraceTokens)") +
           " at source block size " + std::to_string(source_block_size));
  };
  j.expect('{', "at the start of the line");
  if (!j.eat('}')) {
    do {
      const std::string key(j.string());  // escapes decoded: "hash\u005fids" is hash_ids
      j.expect(':', "after key '" + shown(key) + "'");
      if (key == "timestamp") {
        once(has_ts, key);
        r.timestamp_ms = j.number(key);
        if (std::fabs(r.timestamp_ms) > kMaxTraceTimestampMs) {
          j.fail("field 'timestamp': outside [-1e15, 1e15] ms (kMaxTraceTimestampMs)");
        }
      } else if (key == "input_length") {
        once(has_in, key);
        r.input_length = j.length(key);
        if (r.hash_ids.size() > ids_needed(r.input_length)) too_many_ids();
      } else if (key == "output_length") {
        once(has_out, key);
        r.output_length = j.length(key);
      } else if (key == "hash_ids") {
        once(has_ids, key);
        const std::uint64_t max_ids = ids_needed(has_in ? r.input_length : kMaxTraceTokens);
        j.expect('[', "field 'hash_ids': expected an array");
        if (!j.eat(']')) {
          do {
            r.hash_ids.push_back(static_cast<std::uint32_t>(j.integer("hash_ids", 0xffffffffu)));
            if (r.hash_ids.size() > max_ids) too_many_ids();
          } while (j.eat(','));
          j.expect(']', "field 'hash_ids': expected ',' or ']'");
        }
      } else {
        other_keys.push_back(key);
        j.skip_value();
      }
    } while (j.eat(','));
    j.expect('}', "at the end of the object");
  }
  if (!j.at_end()) j.fail("trailing characters after the object");
  if (!has_ts) j.fail("field 'timestamp' is missing");
  if (!has_in) j.fail("field 'input_length' is missing");
  if (!has_out) j.fail("field 'output_length' is missing");
  if (!has_ids) j.fail("field 'hash_ids' is missing");
  if (r.input_length == 0) j.fail("field 'input_length': a prompt has at least one token");
  if (other_keys.size() > 1) {
    std::sort(other_keys.begin(), other_keys.end());
    const auto twice = std::adjacent_find(other_keys.begin(), other_keys.end());
    if (twice != other_keys.end()) j.fail("field '" + shown(*twice) + "' appears twice");
  }
  return r;
}

// Reads a file line by line: a gzip stream (by its magic bytes, whatever the name) is decompressed
// through zlib's inflate as it is read, in memory, without a temporary file; any other file is read
// as is. Concatenated gzip members are one stream (as gzip -d reads them); bytes after the last
// member that do not start another are an error (zlib's gzread ignored them silently), as is a
// stream cut short.
class LineReader {
 public:
  explicit LineReader(const std::string& path)
      : path_(path), file_(std::fopen(path.c_str(), "rb")) {
    if (file_ == nullptr) {
      throw Error(ErrorCode::kNotFound, "cannot open trace file '" + path + "'");
    }
    fill_input(2);
    gzip_ = starts_member();
    if (gzip_ && inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) {  // 16: a gzip wrapper
      throw Error(ErrorCode::kParseError, "trace file '" + path_ + "': cannot start zlib");
    }
  }
  ~LineReader() {
    if (gzip_) inflateEnd(&z_);
  }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line, line `number` of the file, without its '\n' (a '\r' is kept); false at the
  // end of the file. A line longer than kMaxTraceLineBytes throws: the load stops there.
  bool next(std::string& line, std::uint64_t number) {
    line.clear();
    auto append = [&](const char* begin, std::size_t n) {
      if (n > kMaxTraceLineBytes - line.size()) {
        parse_error(path_, number,
                    "line " + std::to_string(number) + " is longer than " +
                        std::to_string(kMaxTraceLineBytes) +
                        " bytes (kMaxTraceLineBytes); the rest of the file is not read");
      }
      line.append(begin, n);
    };
    while (true) {
      if (pos_ == end_) {
        if (eof_) return !line.empty();
        refill();
        continue;
      }
      const char* begin = buffer_.get() + pos_;
      const void* nl = std::memchr(begin, '\n', end_ - pos_);
      if (nl != nullptr) {
        const std::size_t n = static_cast<std::size_t>(static_cast<const char*>(nl) - begin);
        append(begin, n);
        pos_ += n + 1;
        return true;
      }
      append(begin, end_ - pos_);
      pos_ = end_;
    }
  }

 private:
  static constexpr std::size_t kChunk = std::size_t{1} << 17;
  struct Close {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorCode::kParseError, "trace file '" + path_ + "': " + what);
  }
  // Reads more of the file until at least `want` unread bytes are buffered (fewer at its end).
  void fill_input(std::size_t want) {
    if (in_end_ - in_pos_ >= want || file_eof_) return;
    std::memmove(in_.get(), in_.get() + in_pos_, in_end_ - in_pos_);
    in_offset_ += in_pos_;
    in_end_ -= in_pos_;
    in_pos_ = 0;
    while (in_end_ < want && !file_eof_) {
      const std::size_t n = std::fread(in_.get() + in_end_, 1, kChunk - in_end_, file_.get());
      in_end_ += n;
      if (n == 0) {
        if (std::ferror(file_.get()))
          fail(std::string("cannot read (") + std::strerror(errno) + ")");
        file_eof_ = true;
      }
    }
  }
  // The unread input starts a gzip member (its magic bytes 1f 8b).
  bool starts_member() const {
    return in_end_ - in_pos_ >= 2 && static_cast<unsigned char>(in_[in_pos_]) == 0x1f &&
           static_cast<unsigned char>(in_[in_pos_ + 1]) == 0x8b;
  }
  // Puts the next chunk of the file's text in buffer_ (none: eof_).
  void refill() {
    pos_ = 0;
    end_ = 0;
    if (!gzip_) {
      fill_input(1);
      end_ = in_end_ - in_pos_;
      std::memcpy(buffer_.get(), in_.get() + in_pos_, end_);
      in_pos_ = in_end_;
      eof_ = end_ == 0;
      return;
    }
    while (end_ == 0) {
      if (member_done_) {  // the end of a member: another one, or the end of the file
        fill_input(2);
        if (in_pos_ == in_end_) {
          eof_ = true;
          return;
        }
        if (!starts_member()) {
          fail("the bytes after the gzip stream's end at byte " +
               std::to_string(in_offset_ + in_pos_) +
               " are not gzip data (trailing garbage, or a damaged file)");
        }
        if (inflateReset(&z_) != Z_OK) fail("cannot restart zlib");
        member_done_ = false;
      }
      fill_input(1);
      z_.next_in = reinterpret_cast<Bytef*>(in_.get() + in_pos_);
      z_.avail_in = static_cast<uInt>(in_end_ - in_pos_);
      z_.next_out = reinterpret_cast<Bytef*>(buffer_.get());
      z_.avail_out = static_cast<uInt>(kChunk);
      const int rc = inflate(&z_, Z_NO_FLUSH);
      in_pos_ = in_end_ - z_.avail_in;
      end_ = kChunk - z_.avail_out;
      if (rc == Z_STREAM_END) {
        member_done_ = true;
      } else if (rc == Z_BUF_ERROR || (rc == Z_OK && end_ == 0 && z_.avail_in == 0)) {
        // No progress without more input: at the end of the file, a stream cut short.
        if (file_eof_ && in_pos_ == in_end_) fail("truncated gzip stream");
      } else if (rc != Z_OK) {
        fail(std::string("cannot read (") + (z_.msg != nullptr ? z_.msg : "zlib error") + ")");
      }
    }
  }

  const std::string& path_;
  std::unique_ptr<std::FILE, Close> file_;
  bool gzip_ = false;
  z_stream z_{};
  bool member_done_ = false;                      // inflate reached a member's end
  std::unique_ptr<char[]> in_{new char[kChunk]};  // the file's bytes, read ahead
  std::size_t in_pos_ = 0, in_end_ = 0;
  std::uint64_t in_offset_ = 0;  // the file offset of in_[0]
  bool file_eof_ = false;
  std::unique_ptr<char[]> buffer_{new char[kChunk]};  // the text
  std::size_t pos_ = 0;
  std::size_t end_ = 0;
  bool eof_ = false;
};

// Reads the lines of a trace through parse_line (which throws pagedkv::Error for a malformed
// line: skipped and counted under skip_bad). `header`, if given, checks line 1 (a whole-file
// error, never skipped).
template <typename CheckHeader, typename ParseLine>
Trace read_lines(const std::string& path, const LoadOptions& options, CheckHeader header,
                 ParseLine parse_line) {
  const auto start = std::chrono::steady_clock::now();
  LineReader in(path);
  Trace trace;
  trace.name = path.substr(path.find_last_of('/') + 1);
  std::string line;
  std::uint64_t number = 0;
  while (in.next(line, number + 1)) {
    ++number;
    if (number == 1 && header(line)) continue;
    if (line.empty() || line == "\r") continue;
    try {
      trace.requests.push_back(parse_line(line, number));
    } catch (const Error& e) {
      if (!options.skip_bad) throw;
      ++trace.skipped_lines;
      continue;
    }
    if (options.limit != 0 && trace.requests.size() >= options.limit) break;
  }
  trace.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return trace;
}

// A 31-bit token from a 64-bit key.
TokenId mix_token(std::uint64_t x) {
  return static_cast<TokenId>(splitmix64_mix(x) & 0x7fffffff);
}

}  // namespace

Trace load_hashid_jsonl(const std::string& path, const LoadOptions& options) {
  if (options.source_block_size == 0) {
    throw Error(ErrorCode::kInvalidArgument, "source block size must be at least 1");
  }
  Trace t = read_lines(
      path, options, [](const std::string&) { return false; },
      [&](const std::string& line, std::uint64_t number) {
        return parse_hashid_line(line, path, number, options.source_block_size);
      });
  t.source_block_size = options.source_block_size;
  return t;
}

namespace {

// The Azure CSV header, compared case-insensitively with spaces (and a '\r') left out.
bool is_azure_header(std::string_view line) {
  constexpr std::string_view kHeader = "timestamp,contexttokens,generatedtokens";
  std::size_t k = 0;
  for (const char c : line) {
    if (c == ' ' || c == '\t' || c == '\r') continue;
    if (k == kHeader.size() || (c | 0x20) != kHeader[k]) return false;
    ++k;
  }
  return k == kHeader.size();
}

// An Azure TIMESTAMP: a date and time, "YYYY-MM-DD HH:MM:SS" with optional fractional seconds
// (the published traces), or a finite number.
bool is_azure_timestamp(std::string_view v) {
  double x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (!v.empty() && ec == std::errc() && end == v.data() + v.size()) return std::isfinite(x);
  constexpr std::string_view kPattern = "0000-00-00 00:00:00";
  if (v.size() < kPattern.size()) return false;
  for (std::size_t i = 0; i < kPattern.size(); ++i) {
    const bool digit = v[i] >= '0' && v[i] <= '9';
    if (kPattern[i] == '0' ? !digit : (v[i] != kPattern[i] && !(i == 10 && v[i] == 'T'))) {
      return false;
    }
  }
  v.remove_prefix(kPattern.size());
  if (v.empty()) return true;
  if (v.size() < 2 || v[0] != '.') return false;
  return std::all_of(v.begin() + 1, v.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

Trace load_azure_csv(const std::string& path, const LoadOptions& options) {
  auto header = [&](const std::string& line) {
    if (!is_azure_header(line)) {
      // Quoted in the message: its first 80 bytes, anything but printable ASCII as '?'.
      std::string found = line.substr(0, 80);
      for (char& c : found) {
        if (c < 0x20 || c > 0x7e) c = '?';
      }
      parse_error(path, 1,
                  "expected the header 'TIMESTAMP,ContextTokens,GeneratedTokens' (an Azure LLM "
                  "inference trace), found '" +
                      found + "'");
    }
    return true;
  };
  return read_lines(path, options, header, [&](const std::string& line, std::uint64_t number) {
    // TIMESTAMP,ContextTokens,GeneratedTokens
    const std::size_t a = line.find(',');
    const std::size_t b = a == std::string::npos ? a : line.find(',', a + 1);
    if (b == std::string::npos || line.find(',', b + 1) != std::string::npos) {
      parse_error(path, number, "expected 3 comma-separated fields");
    }
    auto trim = [](std::string_view v) {
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == '\r' || v.back() == ' ' || v.back() == '\t')) {
        v.remove_suffix(1);
      }
      return v;
    };
    const std::string_view ts = trim(std::string_view(line.data(), a));
    if (ts.empty()) parse_error(path, number, "field 'TIMESTAMP' is empty");
    if (!is_azure_timestamp(ts)) {
      parse_error(path, number,
                  "field 'TIMESTAMP': expected a date and time (YYYY-MM-DD HH:MM:SS[.fff]) or a "
                  "finite number");
    }
    auto field = [&](std::size_t from, std::size_t to, const char* name) {
      const std::string_view v = trim(std::string_view(line.data() + from, to - from));
      std::uint64_t x = 0;
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      if (ec != std::errc() || end != v.data() + v.size()) {
        parse_error(path, number, std::string("field '") + name + "': expected a count");
      }
      if (x > kMaxTraceTokens) {
        parse_error(path, number,
                    std::string("field '") + name + "': " + std::to_string(x) +
                        " tokens is more than the limit of " + std::to_string(kMaxTraceTokens) +
                        " (kMaxTraceTokens)");
      }
      return static_cast<std::uint32_t>(x);
    };
    TraceRequest r;
    r.input_length = field(a + 1, b, "ContextTokens");
    r.output_length = field(b + 1, line.size(), "GeneratedTokens");
    if (r.input_length == 0) parse_error(path, number, "field 'ContextTokens': must be positive");
    r.timestamp_ms = static_cast<double>(number);  // arrival order; the replay uses file order
    return r;
  });
}

void synthesize_prompt(const Trace& trace, std::size_t index, std::vector<TokenId>& out) {
  const TraceRequest& r = trace.requests[index];
  if (!r.tokens.empty()) {
    out = r.tokens;
    return;
  }
  if (r.runs != nullptr) {
    out.resize(r.input_length);
    std::size_t pos = 0;
    for (std::size_t k = 0; k < r.runs->size() && pos < out.size(); ++k) {
      const TokenRun& run = (*r.runs)[k];
      for (std::uint32_t i = 0; i < run.count && pos < out.size(); ++i) {
        out[pos++] = run.first + static_cast<TokenId>(i);
      }
    }
    out.resize(pos);  // runs shorter than input_length (never, as generated)
    return;
  }
  out.resize(r.input_length);
  std::size_t pos = 0;
  const std::uint64_t s = trace.source_block_size;
  for (std::size_t j = 0; j < r.hash_ids.size() && pos < out.size(); ++j) {
    const std::uint64_t base = std::uint64_t{r.hash_ids[j]} * s;
    const std::size_t end = std::min<std::size_t>(out.size(), pos + s);
    for (std::size_t i = 0; pos < end; ++i, ++pos) {
      const std::uint64_t v = base + i;
      // Injective while ids * S < 2^30 (Mooncake: 182,789 x 512 < 2^27); beyond that, mixed.
      out[pos] = v < (1u << 30) ? static_cast<TokenId>(v) : mix_token(v) | (1 << 30);
    }
  }
  for (std::size_t i = 0; pos < out.size(); ++pos, ++i) {  // unique to this request
    out[pos] = mix_token((std::uint64_t{index} << 32) | i) | (1 << 30);
  }
}

TokenId output_token(std::size_t index, std::uint32_t i) {
  return mix_token((std::uint64_t{index} << 32) | (0x80000000u | i)) | (1 << 30);
}

Workload parse_workload(const std::string& name) {
  if (name == "agents") return Workload::kAgents;
  if (name == "chat") return Workload::kChat;
  if (name == "tenants") return Workload::kTenants;
  throw Error(ErrorCode::kParseError,
              "unknown workload '" + name + "' (expected agents, chat or tenants)");
}

Trace generate(const GeneratorOptions& options) {
  std::mt19937_64 rng(options.seed);
  auto uniform = [&](std::uint32_t lo, std::uint32_t hi) {
    return static_cast<std::uint32_t>(lo + rng() % (hi - lo + 1));
  };
  // Fresh content: every generated token id is new, so n fresh tokens are one run of ids. A
  // request's prompt is a prefix of its session's runs (shared, not copied: memory grows with the
  // number of requests, not with their prompt tokens).
  TokenId next_token = 1;
  auto fresh = [&](std::uint32_t n) {
    const TokenRun run{next_token, n};
    next_token += static_cast<TokenId>(n);
    return run;
  };
  using Runs = std::vector<TokenRun>;
  // --limit K: the first K requests only. Each workload draws its requests in output order (the
  // tenants' copies follow the base requests they copy), so stopping early leaves the first K
  // exactly as the whole trace has them.
  const std::uint32_t count = options.limit != 0 && options.limit < options.requests
                                  ? static_cast<std::uint32_t>(options.limit)
                                  : options.requests;
  Trace trace;
  trace.name = options.workload == Workload::kAgents ? "agents"
               : options.workload == Workload::kChat ? "chat"
                                                     : "tenants";
  if (options.workload == Workload::kAgents) {
    const TokenRun system = fresh(2000);  // system prompt
    const TokenRun tools = fresh(3000);   // tool definitions
    struct Session {
      std::shared_ptr<Runs> context;  // read by the requests only up to their input_length
      std::uint64_t tokens = 0;
      double time_ms = 0;
      void start(TokenRun system, TokenRun tools) {
        context = std::make_shared<Runs>(Runs{system, tools});
        tokens = std::uint64_t{system.count} + tools.count;
      }
      void append(TokenRun run) {
        context->push_back(run);
        tokens += run.count;
      }
    };
    std::vector<Session> sessions(std::max<std::uint32_t>(1, options.requests / 12));
    for (std::size_t i = 0; i < sessions.size(); ++i) {
      sessions[i].start(system, tools);
      sessions[i].time_ms = static_cast<double>(i) * 2000.0;
    }
    // The session whose next turn comes first (the lowest index among equal times): turns
    // interleave across sessions in time. A heap, not a scan of every session per request.
    using Next = std::pair<double, std::size_t>;
    std::priority_queue<Next, std::vector<Next>, std::greater<>> next;
    for (std::size_t i = 0; i < sessions.size(); ++i) next.emplace(sessions[i].time_ms, i);
    while (trace.requests.size() < count) {
      Session* it = &sessions[next.top().second];
      next.pop();
      it->append(fresh(uniform(50, 800)));  // the user's message or tool results
      TraceRequest r;
      r.timestamp_ms = it->time_ms;
      r.runs = it->context;
      r.input_length = static_cast<std::uint32_t>(it->tokens);
      r.output_length = uniform(20, 600);
      it->append(fresh(r.output_length));  // the answer: the next turn's context includes it
      it->time_ms += uniform(3000, 30000);
      if (it->tokens > 60000) it->start(system, tools);  // the session ends; a new one starts
      next.emplace(it->time_ms, static_cast<std::size_t>(it - sessions.data()));
      trace.requests.push_back(std::move(r));
    }
  } else {
    const TokenRun system = fresh(600);
    const std::uint32_t tenants =
        options.workload == Workload::kTenants ? std::max(1u, options.tenants) : 1;
    const std::uint32_t per_tenant = std::max<std::uint32_t>(1, options.requests / tenants);
    // Request k is base request k / tenants: the first `count` need only the first
    // ceil(count / tenants) base requests (drawn first, so the same as in the whole trace).
    const std::uint32_t base_needed = std::min<std::uint32_t>(
        per_tenant, static_cast<std::uint32_t>((std::uint64_t{count} + tenants - 1) / tenants));
    std::vector<TraceRequest> base;
    for (std::uint32_t i = 0; i < base_needed; ++i) {
      TraceRequest r;
      const TokenRun message = fresh(uniform(20, 1200));
      r.runs = std::make_shared<const Runs>(Runs{system, message});
      r.input_length = system.count + message.count;
      r.output_length = uniform(20, 500);
      r.timestamp_ms = static_cast<double>(i) * 250.0;
      base.push_back(std::move(r));
    }
    for (std::uint32_t i = 0; i < base_needed && trace.requests.size() < count; ++i) {
      for (std::uint32_t t = 0; t < tenants && trace.requests.size() < count; ++t) {
        TraceRequest r = base[i];
        if (options.workload == Workload::kTenants) r.cache_salt = "tenant-" + std::to_string(t);
        trace.requests.push_back(std::move(r));
      }
    }
  }
  return trace;
}

}  // namespace pagedkv::replay
