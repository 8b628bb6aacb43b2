#include "pagedkv/remote/redis_store.hpp"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "op_queue.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/remote/latency_histogram.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "store_counters.hpp"

namespace pagedkv {
namespace {

using Clock = std::chrono::steady_clock;

// The deepest pipeline accepted: each connection keeps buffers for this many ops (a value
// header, iovecs), and one round trip of more ops gains nothing.
constexpr std::size_t kMaxPipelineDepth = std::size_t{1} << 16;

[[noreturn]] void bad_config(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "RedisStore: " + what);
}

timeval to_timeval(std::chrono::microseconds us) {
  if (us.count() < 1) us = std::chrono::microseconds(1);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(us.count() / 1000000);
  tv.tv_usec = static_cast<suseconds_t>(us.count() % 1000000);
  return tv;
}

using Slot = remote_detail::StoreOp;

using remote_detail::bump;
using Counters = remote_detail::StoreCounters;

void append_decimal(std::string& out, std::size_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

void append_bulk(std::string& out, std::string_view s) {
  out.push_back('$');
  append_decimal(out, s.size());
  out.append("\r\n");
  out.append(s);
  out.append("\r\n");
}

}  // namespace

struct RedisStore::Impl : remote_detail::OpQueue {
  explicit Impl(RedisStoreConfig c) : OpQueue(c.queue_depth), config(std::move(c)) {}

  RedisStoreConfig config;
  // The op queue (remote_detail::OpQueue, the base): its mu also guards stop; done_cv wakes wait().
  std::condition_variable work_cv;  // I/O threads: pending non-empty or stop
  bool stop = false;
  std::vector<std::thread> threads;
  // I/O threads holding a connection. A thread in reconnect backoff leaves queued ops to them
  // rather than failing the ops at once; only when none is connected does it fail them promptly.
  std::atomic<unsigned> connected{0};

  template <class Fill>
  std::optional<RemoteTicket> submit(RemoteOpKind kind, std::size_t n, Fill&& fill) {
    const auto now = Clock::now();
    std::optional<RemoteTicket> ticket;
    {
      std::lock_guard<std::mutex> lock(mu);
      ticket = submit_locked(kind, n, now, config.op_timeout, fill);
    }
    // All: a thread waiting out its reconnect backoff must not absorb the wakeup meant for a
    // connected one.
    if (ticket && n > 0) work_cv.notify_all();
    return ticket;
  }

  // The most ops one pipeline carries: a batch never holds more than the queue does.
  std::size_t batch_limit() const noexcept {
    return std::min(config.pipeline_depth, config.queue_depth);
  }

  // Runs io_loop; an exception escaping it (bad_alloc setting up the connection's buffers: the
  // ops of a batch taken are failed inside io_loop) is counted as a failed connection attempt,
  // and the thread starts over after reconnect_backoff_min: an I/O thread never dies of one.
  void io_thread() noexcept;
  void io_loop();
};

namespace {

// One I/O thread's connection and scratch buffers.
class Connection {
 public:
  // `depth`: the most ops a pipeline carries (Impl::batch_limit).
  Connection(const RedisStoreConfig& config, std::size_t depth, Counters& counters,
             std::atomic<unsigned>& live)
      : config_(config), counters_(counters), live_(live), in_(kInitialRead) {
    segments_.reserve(3 * depth + 1);
    iov_.reserve(3 * depth + 1);
    headers_.resize(depth);
  }
  ~Connection() { drop(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  bool connected() const noexcept { return ctx_ != nullptr; }
  void drop() noexcept {
    if (ctx_ != nullptr) redisFree(ctx_);
    ctx_ = nullptr;
    if (counted_) live_.fetch_sub(1, std::memory_order_acq_rel);
    counted_ = false;
    rpos_ = wpos_ = discard_ = 0;
  }

  // Connects and authenticates within connect_timeout (+ one AUTH round trip bounded by it).
  bool connect() {
    drop();
    ctx_ = redisConnectWithTimeout(config_.host.c_str(), config_.port,
                                   to_timeval(config_.connect_timeout));
    if (ctx_ == nullptr) return false;
    if (ctx_->err != 0 || redisSetTimeout(ctx_, to_timeval(config_.connect_timeout)) != REDIS_OK) {
      drop();
      return false;
    }
    if (!config_.password.empty()) {
      const char* argv[3] = {"AUTH", nullptr, nullptr};
      std::size_t lens[3] = {4, 0, 0};
      int argc = 1;
      if (!config_.username.empty()) {
        argv[argc] = config_.username.data();
        lens[argc++] = config_.username.size();
      }
      argv[argc] = config_.password.data();
      lens[argc++] = config_.password.size();
      auto* reply = static_cast<redisReply*>(redisCommandArgv(ctx_, argc, argv, lens));
      const bool ok = reply != nullptr && reply->type == REDIS_REPLY_STATUS;
      if (reply != nullptr) freeReplyObject(reply);
      if (!ok) {
        drop();
        return false;
      }
    }
    // From here on the socket is non-blocking: every read and write follows a poll() bounded by
    // the ops' deadline, so no syscall waits past it (hiredis' own timeout stays as a backstop).
    const int flags = fcntl(ctx_->fd, F_GETFL);
    if (redisSetTimeout(ctx_, to_timeval(config_.op_timeout)) != REDIS_OK || flags < 0 ||
        fcntl(ctx_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
      drop();
      return false;
    }
    live_.fetch_add(1, std::memory_order_acq_rel);
    counted_ = true;
    return true;
  }

  // Runs one pipeline; sets every op's result (accounting is the caller's). Drops the connection
  // on a timeout or an I/O error. Returns true when the connection failed with an I/O error
  // before any reply arrived (a connection gone stale while idle, e.g. the server restarted):
  // every op is kError and none is known to have run, so the caller may rerun the batch once on
  // a fresh connection (GET, EXISTS and SET of the same value are idempotent).
  //
  // The pipeline is written with sendmsg from an iovec list (a put's payload is sent from the
  // caller's buffer in place: RemoteStore keeps it valid until the op completes) and the replies
  // are parsed here from one reusable read buffer: a get's value is checked there and copied
  // once into its destination, which stays untouched unless the value checks out.
  bool run(std::span<const std::uint32_t> batch, std::vector<Slot>& slots,
           std::vector<RemoteResult>& results) {
    Clock::time_point deadline = Clock::time_point::max();
    for (std::uint32_t i : batch) deadline = std::min(deadline, slots[i].deadline);
    results.assign(batch.size(), RemoteResult::kError);

    build_iovecs(batch, slots);
    // Write the whole pipeline, each wait bounded by the deadline.
    std::size_t first = 0;  // first iovec not completely written
    while (first < iov_.size()) {
      const int ready = wait_fd(POLLOUT, deadline);
      if (ready <= 0) {
        fail_from(0, batch.size(), ready == 0, results);
        return ready < 0;
      }
      msghdr msg{};
      msg.msg_iov = iov_.data() + first;
      msg.msg_iovlen = std::min<std::size_t>(iov_.size() - first, kMaxIov);
      const ssize_t n = ::sendmsg(ctx_->fd, &msg, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        const bool timed_out = Clock::now() >= deadline;
        fail_from(0, batch.size(), timed_out, results);
        return !timed_out;
      }
      std::size_t left = static_cast<std::size_t>(n);
      while (left > 0 && left >= iov_[first].iov_len) left -= iov_[first++].iov_len;
      if (left > 0) {  // a partial write inside iov_[first]
        iov_[first].iov_base = static_cast<char*>(iov_[first].iov_base) + left;
        iov_[first].iov_len -= left;
      }
    }
    // Read one reply per op, in order.
    for (std::size_t k = 0; k < batch.size(); ++k) {
      while (true) {
        const int parsed = parse_reply(slots[batch[k]], results[k]);
        if (parsed < 0) {
          fail_from(k, batch.size(), false, results);  // a protocol error: never rerun
          return false;
        }
        if (parsed > 0) break;
        const int ready = wait_fd(POLLIN, deadline);
        if (ready <= 0) {
          fail_from(k, batch.size(), ready == 0, results);
          return ready < 0 && k == 0;
        }
        if (!read_some()) {
          const bool timed_out = Clock::now() >= deadline;
          fail_from(k, batch.size(), timed_out, results);
          return !timed_out && k == 0;
        }
      }
    }
    return false;
  }

 private:
  // > 0 ready, 0 deadline passed, < 0 error.
  int wait_fd(short events, Clock::time_point deadline) {
    while (true) {
      const auto now = Clock::now();
      if (now >= deadline) return 0;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
      pollfd p{ctx_->fd, events, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
      if (r > 0) return (p.revents & (events | POLLHUP | POLLERR)) ? 1 : -1;
      if (r == 0) continue;  // re-check the clock (poll rounds to milliseconds)
      if (errno != EINTR) return -1;
    }
  }

  void fail_from(std::size_t k, std::size_t n, bool timed_out, std::vector<RemoteResult>& results) {
    for (; k < n; ++k) results[k] = timed_out ? RemoteResult::kTimeout : RemoteResult::kError;
    drop();
  }

  void format_key(const BlockHash& hash) {
    key_.assign(config_.name_space);
    key_.push_back('/');
    static constexpr char kHex[] = "0123456789abcdef";
    for (std::uint8_t b : hash.bytes()) {
      key_.push_back(kHex[b >> 4]);
      key_.push_back(kHex[b & 15]);
    }
  }

  // Appends to the scratch text, extending the last segment when it is scratch too.
  void add_scratch(std::string_view text) {
    const std::size_t off = scratch_.size();
    scratch_.append(text);
    if (!segments_.empty() && segments_.back().ext == nullptr) {
      segments_.back().len += text.size();
    } else {
      segments_.push_back({nullptr, off, text.size()});
    }
  }
  void add_external(const void* data, std::size_t len) {
    if (len > 0) segments_.push_back({static_cast<const char*>(data), 0, len});
  }

  // The pipeline as iovecs: per op its RESP prefix and key (scratch; consecutive scratch runs
  // merge into one iovec), and for a put the value header, the caller's payload in place and the
  // closing "\r\n".
  void build_iovecs(std::span<const std::uint32_t> batch, const std::vector<Slot>& slots) {
    scratch_.clear();
    segments_.clear();
    if (headers_.size() < batch.size()) headers_.resize(batch.size());
    for (std::size_t k = 0; k < batch.size(); ++k) {
      const Slot& s = slots[batch[k]];
      format_key(s.id.block);
      line_.clear();
      switch (s.kind) {
        case RemoteOpKind::kExists:
          line_.append("*2\r\n$6\r\nEXISTS\r\n");
          append_bulk(line_, key_);
          add_scratch(line_);
          break;
        case RemoteOpKind::kGet:
          line_.append("*2\r\n$3\r\nGET\r\n");
          append_bulk(line_, key_);
          add_scratch(line_);
          break;
        case RemoteOpKind::kPut: {
          const std::span<const std::byte> payload(s.buf, s.len);
          headers_[k] = encode_remote_value_header(config_.layout_fingerprint, s.id, payload);
          line_.append("*3\r\n$3\r\nSET\r\n");
          append_bulk(line_, key_);
          line_.push_back('$');
          append_decimal(line_, headers_[k].size() + payload.size());
          line_.append("\r\n");
          add_scratch(line_);
          add_external(headers_[k].data(), headers_[k].size());
          add_external(payload.data(), payload.size());
          add_scratch("\r\n");
          break;
        }
      }
    }
    iov_.clear();
    for (const Segment& g : segments_) {
      const char* base = g.ext != nullptr ? g.ext : scratch_.data() + g.off;
      iov_.push_back(iovec{const_cast<char*>(base), g.len});  // only read by sendmsg
    }
  }

  // Reads what the socket has into the read buffer. False on an I/O error or end of stream.
  bool read_some() {
    if (rpos_ == wpos_) rpos_ = wpos_ = 0;
    if (wpos_ == in_.size()) {
      compact();
      if (wpos_ == in_.size()) in_.resize(2 * in_.size());
    }
    while (true) {
      const ssize_t n = ::recv(ctx_->fd, in_.data() + wpos_, in_.size() - wpos_, 0);
      if (n > 0) {
        wpos_ += static_cast<std::size_t>(n);
        return true;
      }
      if (n == 0) return false;  // the server closed the connection
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;  // nothing yet: poll again
    }
  }

  void compact() noexcept {
    if (rpos_ == 0) return;
    std::memmove(in_.data(), in_.data() + rpos_, wpos_ - rpos_);
    wpos_ -= rpos_;
    rpos_ = 0;
  }

  // Room for a reply of `total` bytes starting at rpos_ (a value of the size a get expects:
  // bounded by max_value_bytes). Twice that, so that a read running into the next reply seldom
  // needs a move.
  void ensure_room(std::size_t total) {
    if (rpos_ + total <= in_.size()) return;
    compact();
    if (total > in_.size()) in_.resize(std::max(2 * total, 2 * in_.size()));
  }

  // Parses the reply to `s` from the read buffer into `out`: 1 done, 0 more bytes needed, -1 a
  // protocol error. Only what GET, SET and EXISTS answer is expected: +status, -error,
  // :integer, $bulk and $-1 (nil); anything else is a protocol error. A bulk of another length
  // than a get expects (or any bulk for EXISTS / SET) is skipped as it streams in, never
  // buffered whole.
  int parse_reply(const Slot& s, RemoteResult& out) {
    if (discard_ > 0) {
      const std::size_t take = std::min(discard_, wpos_ - rpos_);
      rpos_ += take;
      discard_ -= take;
      if (discard_ > 0) return 0;
      out = discard_result_;
      return 1;
    }
    const char* begin = in_.data() + rpos_;
    const std::size_t avail = wpos_ - rpos_;
    const auto* nl = static_cast<const char*>(std::memchr(begin, '\n', avail));
    if (nl == nullptr) return avail > kMaxLine ? -1 : 0;
    if (nl - begin < 2 || nl[-1] != '\r') return -1;
    const std::string_view body(begin + 1, static_cast<std::size_t>(nl - 1 - (begin + 1)));
    const std::size_t line = static_cast<std::size_t>(nl + 1 - begin);
    const auto parse_int = [&](long long& v) {
      const auto r = std::from_chars(body.data(), body.data() + body.size(), v);
      return r.ec == std::errc() && r.ptr == body.data() + body.size();
    };
    switch (begin[0]) {
      case '+':
        out = s.kind == RemoteOpKind::kPut ? RemoteResult::kStored : RemoteResult::kError;
        rpos_ += line;
        return 1;
      case '-':
        out = s.kind == RemoteOpKind::kPut && body.substr(0, 3) == "OOM"
                  ? RemoteResult::kSkippedFull
                  : RemoteResult::kError;
        rpos_ += line;
        return 1;
      case ':': {
        long long v = 0;
        if (!parse_int(v)) return -1;
        out = s.kind != RemoteOpKind::kExists ? RemoteResult::kError
              : v > 0                         ? RemoteResult::kHit
                                              : RemoteResult::kMiss;
        rpos_ += line;
        return 1;
      }
      case '$': {
        long long v = 0;
        if (!parse_int(v) || v < -1) return -1;
        if (v == -1) {
          out = s.kind == RemoteOpKind::kGet ? RemoteResult::kMiss : RemoteResult::kError;
          rpos_ += line;
          return 1;
        }
        const auto len = static_cast<std::size_t>(v);
        if (s.kind != RemoteOpKind::kGet || len != kRemoteValueHeaderSize + s.len) {
          // Not a value this get can take: a length mismatch (never a checksum failure).
          if (s.kind == RemoteOpKind::kGet) {
            bump(counters_.header_mismatches);
            discard_result_ = RemoteResult::kInvalidValue;
          } else {
            discard_result_ = RemoteResult::kError;
          }
          rpos_ += line;
          discard_ = len + 2;
          return parse_reply(s, out);
        }
        if (avail < line + len + 2) {
          ensure_room(line + len + 2);
          return 0;
        }
        const char* data = begin + line;
        if (data[len] != '\r' || data[len + 1] != '\n') return -1;
        const std::span<const std::byte> value(reinterpret_cast<const std::byte*>(data), len);
        const RemoteValueCheck check =
            check_remote_value(value, config_.layout_fingerprint, s.len, s.id);
        if (check == RemoteValueCheck::kChecksumMismatch) {
          bump(counters_.checksum_failures);
          out = RemoteResult::kInvalidValue;
        } else if (check == RemoteValueCheck::kBindingMismatch) {
          bump(counters_.binding_mismatches);
          out = RemoteResult::kInvalidValue;
        } else if (check == RemoteValueCheck::kFormatMismatch) {
          bump(counters_.format_mismatches);
          out = RemoteResult::kInvalidValue;
        } else if (check != RemoteValueCheck::kOk) {
          bump(counters_.header_mismatches);
          out = RemoteResult::kInvalidValue;
        } else {
          std::memcpy(s.buf, value.data() + kRemoteValueHeaderSize, s.len);
          out = RemoteResult::kHit;
        }
        rpos_ += line + len + 2;
        return 1;
      }
      default:
        return -1;
    }
  }

  struct Segment {
    const char* ext;  // external bytes (value header, payload), or nullptr: scratch_ + off
    std::size_t off;
    std::size_t len;
  };

  static constexpr std::size_t kInitialRead = 256 << 10;
  static constexpr std::size_t kMaxIov = 1024;      // Linux UIO_MAXIOV: iovecs per sendmsg
  static constexpr std::size_t kMaxLine = 1 << 16;  // longest status / error / length line

  const RedisStoreConfig& config_;
  Counters& counters_;
  std::atomic<unsigned>& live_;  // Impl::connected
  bool counted_ = false;         // this connection is counted in live_
  redisContext* ctx_ = nullptr;  // hiredis connects and authenticates; I/O is done here
  std::string key_;              // scratch: the current op's key
  std::string line_;             // scratch: the current op's RESP text
  std::string scratch_;          // the pipeline's RESP text (prefixes, keys, "\r\n")
  std::vector<Segment> segments_;
  std::vector<RemoteValueHeader> headers_;  // the pipeline's put headers, by batch position
  std::vector<iovec> iov_;
  std::vector<char> in_;  // read buffer: replies from rpos_ to wpos_
  std::size_t rpos_ = 0;
  std::size_t wpos_ = 0;
  std::size_t discard_ = 0;  // bytes of a skipped bulk still to come
  RemoteResult discard_result_ = RemoteResult::kError;
};

}  // namespace

void RedisStore::Impl::io_thread() noexcept {
  while (true) {
    try {
      io_loop();
      return;
    } catch (...) {
      bump(counters.connect_failures);
    }
    std::unique_lock<std::mutex> lock(mu);
    work_cv.wait_for(lock, config.reconnect_backoff_min, [&] { return stop; });
    if (stop) return;
  }
}

void RedisStore::Impl::io_loop() {
  const std::size_t depth = batch_limit();
  Connection conn(config, depth, counters, connected);
  std::vector<std::uint32_t> batch;
  batch.reserve(depth);
  std::vector<RemoteResult> results;
  results.reserve(depth);
  std::chrono::milliseconds backoff{0};
  Clock::time_point next_attempt{};

  // A reconnect (connect, then AUTH when a password is set: each bounded by connect_timeout) ends
  // before the batch's earliest deadline: only then is a batch rerun on a fresh connection.
  const auto connect_bound =
      config.password.empty() ? config.connect_timeout : 2 * config.connect_timeout;
  const auto reconnect_fits = [&] {
    Clock::time_point earliest = Clock::time_point::max();
    for (std::uint32_t i : batch) earliest = std::min(earliest, ops[i].deadline);
    return earliest - Clock::now() > connect_bound;
  };

  const auto try_connect = [&] {
    if (conn.connect()) {
      bump(counters.connects);
      backoff = std::chrono::milliseconds(0);
      return true;
    }
    bump(counters.connect_failures);
    backoff = backoff.count() == 0 ? config.reconnect_backoff_min
                                   : std::min(2 * backoff, config.reconnect_backoff_max);
    next_attempt = Clock::now() + backoff;
    return false;
  };

  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu);
      while (true) {
        if (stop) return;
        if (!pending.empty()) {
          // Take work when connected, when a reconnect is due, or when no connection is up
          // (then the ops fail at once: prompt misses while the store is down). In backoff
          // while another connection is up, leave the ops to it until the backoff ends.
          if (conn.connected() || Clock::now() >= next_attempt ||
              connected.load(std::memory_order_acquire) == 0) {
            break;
          }
          work_cv.wait_until(lock, next_attempt);
          continue;
        }
        work_cv.wait(lock);
      }
    }
    if (!conn.connected() && Clock::now() >= next_attempt && !try_connect() &&
        connected.load(std::memory_order_acquire) > 0) {
      continue;  // the reconnect failed but another connection is up: leave the ops to it
    }
    batch.clear();
    {
      std::lock_guard<std::mutex> lock(mu);
      const auto now = Clock::now();
      if (expire_locked(now)) done_cv.notify_all();
      while (!pending.empty() && batch.size() < depth) batch.push_back(pending.pop());
    }
    if (batch.empty()) continue;
    try {
      if (conn.connected()) {
        // A connection that went stale while idle (the server restarted) fails before any reply:
        // rerun the batch once on a fresh connection instead of failing ops a live server would
        // answer - when the reconnect fits before the ops' deadline (a slow one would complete
        // them up to two connect timeouts late; they fail kError now, the next batch reconnects).
        if (conn.run(batch, ops, results) && reconnect_fits() && try_connect()) {
          conn.run(batch, ops, results);
        }
        if (!conn.connected() && backoff.count() == 0) {
          next_attempt = Clock::now();  // dropped: retry at once next time
        }
      } else {
        results.assign(batch.size(), RemoteResult::kError);  // no connection up: fail at once
      }
    } catch (...) {  // bad_alloc building a pipeline or growing the read buffer: fail the batch
      conn.drop();   // its reply stream is out of step
      results.resize(batch.size());  // within the capacity reserved: no allocation
      std::fill(results.begin(), results.end(), RemoteResult::kError);
    }
    const auto now = Clock::now();
    for (std::size_t k = 0; k < batch.size(); ++k) account(ops[batch[k]], results[k], now);
    {
      // Under mu: a thread waiting out its backoff either saw `connected` before this thread's
      // drop and is now waiting (woken below), or sees the new count.
      std::lock_guard<std::mutex> lock(mu);
      for (std::uint32_t i : batch) completed.push(i);
    }
    done_cv.notify_all();
    if (!conn.connected()) work_cv.notify_all();
  }
}

RedisStoreConfig RedisStoreConfig::from_url(std::string_view url) {
  const auto fail = [&](const std::string& why) -> RedisStoreConfig {
    throw Error(ErrorCode::kParseError,
                "bad Redis URL '" + std::string(url) + "': " + why +
                    " (expected redis://[[user]:password@]host[:port]/namespace)");
  };
  constexpr std::string_view kScheme = "redis://";
  if (url.substr(0, kScheme.size()) != kScheme) return fail("scheme is not redis://");
  std::string_view rest = url.substr(kScheme.size());
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos) return fail("no /namespace");
  std::string_view authority = rest.substr(0, slash);
  const std::string_view ns = rest.substr(slash + 1);
  if (ns.empty()) return fail("empty namespace");
  RedisStoreConfig config;
  config.name_space = std::string(ns);
  const auto at = authority.rfind('@');
  if (at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const auto colon = userinfo.find(':');
    if (colon == std::string_view::npos) return fail("credentials without ':'");
    config.username = std::string(userinfo.substr(0, colon));
    config.password = std::string(userinfo.substr(colon + 1));
    if (config.password.empty()) return fail("empty password");
  }
  const auto colon = authority.rfind(':');
  std::string_view host = authority;
  if (colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    const std::string_view port = authority.substr(colon + 1);
    unsigned value = 0;
    const auto r = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || r.ec != std::errc() || r.ptr != port.data() + port.size() || value == 0 ||
        value > 65535) {
      return fail("bad port '" + std::string(port) + "'");
    }
    config.port = static_cast<std::uint16_t>(value);
  }
  if (host.empty()) return fail("empty host");
  config.host = std::string(host);
  return config;
}

RedisStore::RedisStore(RedisStoreConfig config) {
  if (config.host.empty()) bad_config("empty host");
  if (config.port == 0) bad_config("port 0");
  if (config.name_space.empty()) bad_config("empty namespace (set model, dtype, layout, ...)");
  if (config.num_connections == 0) bad_config("num_connections is 0");
  if (config.queue_depth == 0 || config.queue_depth > (std::size_t{1} << 31)) {
    bad_config("queue_depth must be in [1, 2^31]");
  }
  if (config.pipeline_depth == 0 || config.pipeline_depth > kMaxPipelineDepth) {
    bad_config("pipeline_depth " + std::to_string(config.pipeline_depth) + " must be in [1, " +
               std::to_string(kMaxPipelineDepth) + "]");
  }
  const auto check_duration = [](std::chrono::milliseconds d, const char* name) {
    if (d.count() <= 0 || d > kMaxRemoteTimeout) {
      bad_config(std::string(name) + " of " + std::to_string(d.count()) +
                 " ms must be in [1 ms, 1 day]");
    }
  };
  check_duration(config.connect_timeout, "connect_timeout");
  check_duration(config.op_timeout, "op_timeout");
  check_duration(config.reconnect_backoff_min, "reconnect_backoff_min");
  check_duration(config.reconnect_backoff_max, "reconnect_backoff_max");
  if (config.reconnect_backoff_min > config.reconnect_backoff_max) {
    bad_config("reconnect backoff must satisfy 0 < min <= max");
  }
  if (config.max_value_bytes == 0) bad_config("max_value_bytes is 0");
  impl_ = std::make_unique<Impl>(std::move(config));
  try {
    for (unsigned t = 0; t < impl_->config.num_connections; ++t) {
      impl_->threads.emplace_back([impl = impl_.get()] { impl->io_thread(); });
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->stop = true;
    }
    impl_->work_cv.notify_all();
    for (auto& t : impl_->threads) t.join();
    throw;
  }
}

RedisStore::~RedisStore() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->work_cv.notify_all();
  for (auto& t : impl_->threads) t.join();
}

namespace {
void check_key(const BlockHash& key, const char* op) {
  if (key.empty()) {
    throw Error(ErrorCode::kInvalidArgument, std::string("RedisStore::") + op + ": empty key");
  }
}
}  // namespace

std::optional<RemoteTicket> RedisStore::exists(std::span<const BlockHash> keys) {
  for (const auto& k : keys) check_key(k, "exists");
  return impl_->submit(RemoteOpKind::kExists, keys.size(), [&](Slot& s, std::size_t k) {
    s.id = RemoteValueBinding{keys[k], BlockHash(), 0};
    s.buf = nullptr;
    s.len = 0;
  });
}

std::optional<RemoteTicket> RedisStore::get(std::span<const RemoteGet> ops) {
  for (const auto& op : ops) {
    check_key(op.key, "get");
    if (op.dest.empty()) throw Error(ErrorCode::kInvalidArgument, "RedisStore::get: empty dest");
    if (op.dest.size() > impl_->config.max_value_bytes) {
      throw Error(ErrorCode::kInvalidArgument, "RedisStore::get: dest of " +
                                                   std::to_string(op.dest.size()) +
                                                   " bytes exceeds max_value_bytes " +
                                                   std::to_string(impl_->config.max_value_bytes));
    }
  }
  return impl_->submit(RemoteOpKind::kGet, ops.size(), [&](Slot& s, std::size_t k) {
    s.id = binding_of(ops[k]);
    s.buf = ops[k].dest.data();
    s.len = ops[k].dest.size();
  });
}

std::optional<RemoteTicket> RedisStore::put(std::span<const RemotePut> ops) {
  for (const auto& op : ops) {
    check_key(op.key, "put");
    if (op.src.size() > impl_->config.max_value_bytes) {
      throw Error(ErrorCode::kInvalidArgument, "RedisStore::put: value of " +
                                                   std::to_string(op.src.size()) +
                                                   " bytes exceeds max_value_bytes " +
                                                   std::to_string(impl_->config.max_value_bytes));
    }
  }
  return impl_->submit(RemoteOpKind::kPut, ops.size(), [&](Slot& s, std::size_t k) {
    s.id = binding_of(ops[k]);
    // The source is only read (format()); the slot's pointer is shared with gets.
    s.buf = const_cast<std::byte*>(ops[k].src.data());
    s.len = ops[k].src.size();
  });
}

std::size_t RedisStore::poll(std::vector<RemoteCompletion>& out) {
  return impl_->poll(out);
}

std::size_t RedisStore::wait(std::vector<RemoteCompletion>& out,
                             std::chrono::microseconds max_wait) {
  return impl_->wait(out, max_wait);
}

std::size_t RedisStore::in_flight() const {
  return impl_->in_flight();
}

RemoteStoreStats RedisStore::stats() const {
  return impl_->stats();
}

std::string_view RedisStore::name_space() const noexcept {
  return impl_->config.name_space;
}

const RedisStoreConfig& RedisStore::config() const noexcept {
  return impl_->config;
}

std::string RedisStore::key_of(const BlockHash& hash) const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string key = impl_->config.name_space;
  key.push_back('/');
  for (std::uint8_t b : hash.bytes()) {
    key.push_back(kHex[b >> 4]);
    key.push_back(kHex[b & 15]);
  }
  return key;
}

}  // namespace pagedkv
