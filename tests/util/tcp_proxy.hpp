// tests/util/tcp_proxy.hpp: a loopback TCP forwarder whose connections a test can cut, to make a
// network blip between two processes that both stay up (e.g. a ZeroMQ SUB and its PUB).
//
// TcpProxy(target_port) listens on 127.0.0.1 (a port the system chooses, port()) and forwards
// each accepted connection to 127.0.0.1:target_port, bytes both ways, on one thread. cut() closes
// every open connection; while refuse(true) holds, new connections are accepted and closed at once
// (the client sees a peer that hangs up, and retries). Only ever touches 127.0.0.1.
// Thread safety: cut(), refuse() and accepted() may be called from any thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace pagedkv::testing {

class TcpProxy {
 public:
  explicit TcpProxy(std::uint16_t target_port) : target_port_(target_port) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listener_ < 0) throw std::runtime_error("TcpProxy: socket failed");
    sockaddr_in addr = loopback(0);
    socklen_t len = sizeof addr;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ::close(listener_);
      throw std::runtime_error("TcpProxy: cannot listen on 127.0.0.1");
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~TcpProxy() {
    stop_ = true;
    thread_.join();
    for (auto& [a, b] : pairs_) close_pair(a, b);
    ::close(listener_);
  }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  std::uint16_t port() const { return port_; }
  std::string endpoint() const { return "tcp://127.0.0.1:" + std::to_string(port_); }
  void cut() { cuts_requested_.fetch_add(1); }
  void refuse(bool on) { refusing_ = on; }
  int accepted() const { return accepted_.load(); }

 private:
  static sockaddr_in loopback(std::uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }
  static void close_pair(int a, int b) {
    ::close(a);
    ::close(b);
  }
  // Copies what `from` has to `to`; false when either side is done.
  static bool pump(int from, int to) {
    char buf[65536];
    const ssize_t n = ::recv(from, buf, sizeof buf, 0);
    if (n <= 0) return false;
    for (ssize_t off = 0; off < n;) {
      const ssize_t w = ::send(to, buf + off, static_cast<std::size_t>(n - off), MSG_NOSIGNAL);
      if (w <= 0) return false;
      off += w;
    }
    return true;
  }

  void run() {
    int cuts_done = 0;
    while (!stop_) {
      if (const int c = cuts_requested_.load(); c != cuts_done) {
        for (auto& [a, b] : pairs_) close_pair(a, b);
        pairs_.clear();
        cuts_done = c;
      }
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      for (const auto& [a, b] : pairs_) {
        fds.push_back({a, POLLIN, 0});
        fds.push_back({b, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
      std::vector<bool> dead(pairs_.size(), false);
      for (std::size_t i = 0; i < pairs_.size(); ++i) {
        const auto [a, b] = pairs_[i];
        if ((fds[1 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR)) && !pump(a, b)) dead[i] = true;
        if (!dead[i] && (fds[2 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR)) && !pump(b, a)) {
          dead[i] = true;
        }
      }
      std::vector<std::pair<int, int>> alive;
      for (std::size_t i = 0; i < pairs_.size(); ++i) {
        if (dead[i]) {
          close_pair(pairs_[i].first, pairs_[i].second);
        } else {
          alive.push_back(pairs_[i]);
        }
      }
      pairs_ = std::move(alive);
      if (fds[0].revents & POLLIN) {
        const int client = ::accept(listener_, nullptr, nullptr);
        if (client < 0) continue;
        ++accepted_;
        if (refusing_) {
          ::close(client);
          continue;
        }
        const int server = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in to = loopback(target_port_);
        if (server < 0 || ::connect(server, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
          if (server >= 0) ::close(server);
          ::close(client);
          continue;
        }
        pairs_.emplace_back(client, server);
      }
    }
  }

  std::uint16_t target_port_;
  std::uint16_t port_ = 0;
  int listener_ = -1;
  std::vector<std::pair<int, int>> pairs_;  // (client, server); proxy thread only after start
  std::atomic<bool> stop_{false};
  std::atomic<bool> refusing_{false};
  std::atomic<int> cuts_requested_{0};
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

}  // namespace pagedkv::testing
