// Test servers on 127.0.0.1 for the remote-store tests and bench_remote: redis-server instances
// and a nutcracker (twemproxy) in front of several, each in its own temporary directory, on free
// loopback ports, killed when their object is destroyed (and, through PR_SET_PDEATHSIG, when the
// test process dies). Header-only; POSIX.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace pagedkv::test {

// The absolute path of a program on PATH or in /usr/sbin, /usr/bin; "" when absent.
inline std::string find_program(std::string_view name) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::string_view p(path);
    while (!p.empty()) {
      const auto colon = p.find(':');
      dirs.emplace_back(p.substr(0, colon));
      if (colon == std::string_view::npos) break;
      p.remove_prefix(colon + 1);
    }
  }
  dirs.emplace_back("/usr/sbin");
  dirs.emplace_back("/usr/bin");
  for (const auto& d : dirs) {
    const std::string candidate = d + "/" + std::string(name);
    if (!d.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// A loopback port nobody listens on right now (bound to port 0, read back, released).
inline std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("bind(127.0.0.1:0) failed");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pagedkv-redis-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// One child process; stdout and stderr go to `log`.
class Process {
 public:
  Process() = default;
  ~Process() { kill(); }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  void start(const std::vector<std::string>& argv, const std::filesystem::path& log) {
    kill();
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const std::string log_path = log.string();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    pid_ = pid;
  }

  // SIGKILL and reap: the server vanishes as in a crash.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    return true;
  }

 private:
  pid_t pid_ = -1;
};

// A synchronous client for set-up and tampering (raw SET, CONFIG SET, FLUSHALL).
class Client {
 public:
  // With a password: AUTH password (the default user), or AUTH user password with a user.
  Client(std::uint16_t port, const std::string& password = "", const std::string& user = "") {
    timeval tv{2, 0};
    ctx_ = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (ctx_ == nullptr || ctx_->err != 0) return;
    redisSetTimeout(ctx_, tv);
    if (!password.empty() && user.empty()) command({"AUTH", password});
    if (!password.empty() && !user.empty()) command({"AUTH", user, password});
  }
  ~Client() {
    if (ctx_ != nullptr) redisFree(ctx_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  bool ok() const { return ctx_ != nullptr && ctx_->err == 0; }

  // Runs one command; returns the reply as text (status, error with "ERR:" prefix, string,
  // integer as decimal, "(nil)"), or nullopt on a connection error.
  // The keys matching `pattern` (KEYS: for tests on small servers), sorted; nullopt on a
  // connection error or an error reply.
  std::optional<std::vector<std::string>> keys(const std::string& pattern) {
    if (!ok()) return std::nullopt;
    const char* a[2] = {"KEYS", pattern.c_str()};
    const std::size_t l[2] = {4, pattern.size()};
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx_, 2, a, l));
    if (r == nullptr) return std::nullopt;
    std::optional<std::vector<std::string>> out;
    if (r->type == REDIS_REPLY_ARRAY) {
      out.emplace();
      for (std::size_t i = 0; i < r->elements; ++i) {
        const redisReply* e = r->element[i];
        if (e->type == REDIS_REPLY_STRING) out->emplace_back(e->str, e->len);
      }
      std::sort(out->begin(), out->end());
    }
    freeReplyObject(r);
    return out;
  }

  std::optional<std::string> command(const std::vector<std::string>& argv) {
    if (!ok()) return std::nullopt;
    std::vector<const char*> a;
    std::vector<std::size_t> l;
    for (const auto& s : argv) {
      a.push_back(s.data());
      l.push_back(s.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx_, int(a.size()), a.data(), l.data()));
    if (r == nullptr) return std::nullopt;
    std::string out;
    switch (r->type) {
      case REDIS_REPLY_STRING:
      case REDIS_REPLY_STATUS:
        out.assign(r->str, r->len);
        break;
      case REDIS_REPLY_ERROR:
        out = "ERR:" + std::string(r->str, r->len);
        break;
      case REDIS_REPLY_INTEGER:
        out = std::to_string(r->integer);
        break;
      case REDIS_REPLY_NIL:
        out = "(nil)";
        break;
      default:
        out = "(other)";
    }
    freeReplyObject(r);
    return out;
  }

 private:
  redisContext* ctx_ = nullptr;
};

// Waits until `port` answers `probe` (a command whose reply is not an error), up to `timeout`.
inline bool wait_ready(std::uint16_t port, const std::string& password,
                       const std::vector<std::string>& probe,
                       std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    Client c(port, password);
    const auto r = c.command(probe);
    if (r && r->rfind("ERR:", 0) != 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

class RedisServer {
 public:
  // extra: more redis-server options, e.g. {"--maxmemory", "1mb"}; password: --requirepass.
  explicit RedisServer(std::vector<std::string> extra = {}, std::string password = "")
      : extra_(std::move(extra)), password_(std::move(password)) {}

  static std::string binary() { return find_program("redis-server"); }

  // Starts (or restarts, on the same port) and waits until it answers PING. Tries a few ports
  // the first time (another process may take a free port between our check and the bind).
  bool start() {
    const std::string bin = binary();
    if (bin.empty()) return false;
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (port_ == 0 || (attempt > 0 && !fixed_)) port_ = free_port();
      std::vector<std::string> argv = {bin,
                                       "--port",
                                       std::to_string(port_),
                                       "--bind",
                                       "127.0.0.1",
                                       "--save",
                                       "",
                                       "--appendonly",
                                       "no",
                                       "--dir",
                                       dir_.path().string(),
                                       "--daemonize",
                                       "no"};
      if (!password_.empty()) {
        argv.push_back("--requirepass");
        argv.push_back(password_);
      }
      argv.insert(argv.end(), extra_.begin(), extra_.end());
      process_.start(argv, dir_.path() / "redis.log");
      if (wait_ready(port_, password_, {"PING"})) {
        fixed_ = true;  // a restart keeps the port clients know
        return true;
      }
      process_.kill();
    }
    return false;
  }

  void kill() { process_.kill(); }
  std::uint16_t port() const { return port_; }
  const std::string& password() const { return password_; }

 private:
  std::vector<std::string> extra_;
  std::string password_;
  TempDir dir_;
  Process process_;
  std::uint16_t port_ = 0;
  bool fixed_ = false;
};

// nutcracker (twemproxy) in front of servers on the given ports: ketama over fnv1a_64, Redis
// protocol, no ejection (a dead server gives errors for its keys).
class Twemproxy {
 public:
  explicit Twemproxy(std::vector<std::uint16_t> backends) : backends_(std::move(backends)) {}

  static std::string binary() { return find_program("nutcracker"); }

  bool start(std::chrono::milliseconds server_timeout = std::chrono::milliseconds(500)) {
    const std::string bin = binary();
    if (bin.empty()) return false;
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_port();
      const std::uint16_t stats_port = free_port();
      const auto conf = dir_.path() / "nutcracker.yml";
      {
        std::ofstream out(conf);
        out << "pagedkv:\n"
            << "  listen: 127.0.0.1:" << port_ << "\n"
            << "  hash: fnv1a_64\n  distribution: ketama\n  redis: true\n"
            << "  auto_eject_hosts: false\n"
            << "  timeout: " << server_timeout.count() << "\n"
            << "  servers:\n";
        for (std::uint16_t p : backends_) out << "   - 127.0.0.1:" << p << ":1\n";
      }
      process_.start({bin, "-c", conf.string(), "-s", std::to_string(stats_port), "-a", "127.0.0.1",
                      "-o", (dir_.path() / "nutcracker.log").string()},
                     dir_.path() / "nutcracker.out");
      // Ready when a key round-trips through the proxy.
      if (wait_ready(port_, "", {"SET", "pagedkv-test/ready", "1"})) return true;
      process_.kill();
    }
    return false;
  }

  std::uint16_t port() const { return port_; }

 private:
  std::vector<std::uint16_t> backends_;
  TempDir dir_;
  Process process_;
  std::uint16_t port_ = 0;
};

}  // namespace pagedkv::test
