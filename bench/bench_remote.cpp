// bench_remote: RedisStore get and put throughput (blocks/s, MB/s) and p50/p99 latency per value
// size, against redis-benchmark's own GET/SET of the same value size on the same server in the
// same run (ratio = ours / redis-benchmark, target >= 0.8). Same connections (-c) and pipeline
// depth (-P) for both. Without --port it starts its own redis-server on 127.0.0.1.
//
//   bench_remote [--port P] [--sizes 65536,262144,1048576,2097152] [--bytes-per-size MiB]
//                [--connections C] [--pipeline D] [--repetitions R] [--quick]
//
// Method (robust on a shared machine): each repetition runs pagedkv's puts and gets and
// redis-benchmark's SET and GET back to back, alternating which goes first (even repetitions
// pagedkv first, odd ones redis-benchmark first), and forms the pairwise ratio of that
// repetition; the table gives medians over R repetitions of the rates and of the pairwise ratios
// (with their min-max), plus CPU time per op: the client's (pagedkv: this process, I/O threads
// included; redis-benchmark: the child process) and the server's (INFO cpu, used_cpu_user +
// used_cpu_sys), which a loaded machine perturbs far less than wall-clock rates.
// Exit 0 with a message when no server can be started.
//
//   bench_remote --value-check [--sizes ...] [--repetitions R]
// times the reader's check of one value (no server): version 1's work (magic, version,
// fingerprint and length compares, then xxh3_64 of the payload, seed 0: what check_remote_value
// did before values were bound to their block, reimplemented here) against the current format's
// (version 3) check_remote_value (the same, plus the KV format and 104-byte binding compares and
// a seeded xxh3_64 whose seed hashes the 144-byte header), alternating A and B in each
// repetition, plus the rejection of a
// value bound to another block (stops at the binding compare, before hashing the payload).
#include <sys/resource.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "pagedkv/remote/redis_store.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "redis_servers.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace {

using Clock = std::chrono::steady_clock;
using pagedkv::RemoteCompletion;
using pagedkv::RemoteResult;

struct Options {
  std::uint16_t port = 0;
  std::vector<std::size_t> sizes = {65536, 262144, 1048576, 2097152};
  std::size_t bytes_per_size = 256u << 20;
  unsigned connections = 4;
  std::size_t pipeline = 8;
  int repetitions = 5;
  bool quick = false;
  bool value_check = false;
};

struct PhaseResult {
  double blocks_per_s = 0;
  std::uint64_t p50_us = 0;
  std::uint64_t p99_us = 0;
  std::size_t ok = 0;
  double client_cpu_us = 0;  // per op
  double server_cpu_us = 0;  // per op (nan when the server's INFO cpu could not be read)
};

// CPU seconds (user + system) of this process (who = RUSAGE_SELF) or of its waited-for children
// (RUSAGE_CHILDREN).
double cpu_seconds(int who) {
  rusage u{};
  ::getrusage(who, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// The server's CPU seconds so far (INFO cpu: used_cpu_user + used_cpu_sys); negative on failure.
double server_cpu_seconds(std::uint16_t port) {
  pagedkv::test::Client c(port);
  const auto info = c.command({"INFO", "cpu"});
  if (!info) return -1;
  const auto read = [&](const std::string& name) {
    const auto at = info->find(name + ":");
    return at == std::string::npos ? -1.0 : std::atof(info->c_str() + at + name.size() + 1);
  };
  const double user = read("used_cpu_user"), sys = read("used_cpu_sys");
  return user < 0 || sys < 0 ? -1 : user + sys;
}

double per_op_us(double before, double after, std::size_t n) {
  return before < 0 || after < 0 ? std::nan("") : (after - before) * 1e6 / static_cast<double>(n);
}

pagedkv::BlockHash key_of(std::size_t i) {
  std::array<std::uint8_t, 32> b{};
  for (int k = 0; k < 8; ++k) b[k] = static_cast<std::uint8_t>(i >> (8 * k));
  b[31] = 0x5b;
  return pagedkv::BlockHash(b);
}

// Runs n puts (or gets) of `size` bytes with at most `window` batches of `pipeline` ops in flight.
PhaseResult run_phase(const Options& o, bool put, std::size_t size, std::size_t n) {
  pagedkv::RedisStoreConfig c;
  c.port = o.port;
  c.name_space = "bench/remote/" + std::to_string(size);
  c.num_connections = o.connections;
  c.pipeline_depth = o.pipeline;
  c.op_timeout = std::chrono::milliseconds(20000);
  c.connect_timeout = std::chrono::milliseconds(2000);
  const std::size_t batches_in_flight = 2 * o.connections;
  c.queue_depth = batches_in_flight * o.pipeline;
  pagedkv::RedisStore store(c);

  std::vector<std::byte> src(size);
  for (std::size_t i = 0; i < size; ++i) src[i] = std::byte(static_cast<std::uint8_t>(i * 7 + 3));
  // One set of destination buffers per batch slot; a slot is reused once its batch completed.
  std::vector<std::vector<std::byte>> dest(put ? 0 : batches_in_flight * o.pipeline,
                                           std::vector<std::byte>(size));
  std::vector<pagedkv::RemoteTicket> slot_ticket(batches_in_flight, 0);
  std::vector<std::size_t> slot_left(batches_in_flight, 0);
  std::vector<pagedkv::RemotePut> puts;
  std::vector<pagedkv::RemoteGet> gets;
  std::vector<RemoteCompletion> buf;

  // Warm the connections (not timed).
  {
    const auto k = key_of(0);
    store.exists(std::span(&k, 1));
    while (store.in_flight() > 0) {
      buf.clear();
      store.wait(buf, std::chrono::milliseconds(100));
    }
  }
  PhaseResult r;
  std::size_t submitted = 0;
  std::size_t completed = 0;
  const double server0 = server_cpu_seconds(o.port);
  const double cpu0 = cpu_seconds(RUSAGE_SELF);
  const auto t0 = Clock::now();
  while (completed < n) {
    for (std::size_t s = 0; s < batches_in_flight && submitted < n; ++s) {
      if (slot_left[s] != 0) continue;
      const std::size_t m = std::min(o.pipeline, n - submitted);
      std::optional<pagedkv::RemoteTicket> t;
      if (put) {
        puts.clear();
        for (std::size_t k = 0; k < m; ++k) puts.push_back({key_of(submitted + k), src});
        t = store.put(puts);
      } else {
        gets.clear();
        for (std::size_t k = 0; k < m; ++k) {
          gets.push_back({key_of(submitted + k), dest[s * o.pipeline + k]});
        }
        t = store.get(gets);
      }
      if (!t) break;
      slot_ticket[s] = *t;
      slot_left[s] = m;
      submitted += m;
    }
    buf.clear();
    store.wait(buf, std::chrono::milliseconds(50));
    for (const auto& done : buf) {
      ++completed;
      r.ok += done.result == (put ? RemoteResult::kStored : RemoteResult::kHit);
      for (std::size_t s = 0; s < batches_in_flight; ++s) {
        if (slot_left[s] != 0 && slot_ticket[s] == done.ticket) {
          --slot_left[s];
          break;
        }
      }
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  r.client_cpu_us = per_op_us(cpu0, cpu_seconds(RUSAGE_SELF), n);
  r.server_cpu_us = per_op_us(server0, server_cpu_seconds(o.port), n);
  r.blocks_per_s = static_cast<double>(n) / secs;
  const auto s = store.stats();
  r.p50_us = put ? s.put_latency.p50_us : s.get_latency.p50_us;
  r.p99_us = put ? s.put_latency.p99_us : s.get_latency.p99_us;
  return r;
}

// redis-benchmark's requests per second for `op` ("set" or "get") of `size`-byte values, with
// its own CPU time and the server's per op.
std::optional<PhaseResult> redis_benchmark(const Options& o, const char* op, std::size_t size,
                                           std::size_t n) {
  const std::string bin = pagedkv::test::find_program("redis-benchmark");
  if (bin.empty()) return std::nullopt;
  std::ostringstream cmd;
  cmd << bin << " -h 127.0.0.1 -p " << o.port << " -t " << op << " -d " << size << " -n " << n
      << " -c " << o.connections << " -P " << o.pipeline << " --csv 2>/dev/null";
  const double server0 = server_cpu_seconds(o.port);
  const double cpu0 = cpu_seconds(RUSAGE_CHILDREN);
  FILE* p = ::popen(cmd.str().c_str(), "r");
  if (p == nullptr) return std::nullopt;
  PhaseResult r;
  char line[512];
  while (std::fgets(line, sizeof(line), p) != nullptr) {
    std::string s(line);
    const auto field = [&](std::size_t i) {
      std::size_t pos = 0;
      for (std::size_t k = 0; k < i; ++k) pos = s.find(',', pos) + 1;
      std::string f = s.substr(pos, s.find(',', pos) - pos);
      f.erase(std::remove(f.begin(), f.end(), '"'), f.end());
      return f;
    };
    if (s.rfind("\"SET\"", 0) == 0 || s.rfind("\"GET\"", 0) == 0) {
      r.blocks_per_s = std::atof(field(1).c_str());
    }
  }
  ::pclose(p);  // waits: the child's CPU time is in RUSAGE_CHILDREN now
  r.client_cpu_us = per_op_us(cpu0, cpu_seconds(RUSAGE_CHILDREN), n);
  r.server_cpu_us = per_op_us(server0, server_cpu_seconds(o.port), n);
  if (r.blocks_per_s <= 0) return std::nullopt;
  r.ok = n;
  return r;
}

// The median (the mean of the middle two for an even count); nan for none. NaNs are dropped.
double median(std::vector<double> v) {
  std::erase_if(v, [](double x) { return std::isnan(x); });
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::uint64_t median_u(std::vector<std::uint64_t> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::uint64_t le64(const std::byte* p) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, sizeof(v));  // x86-64 and aarch64 Linux: little-endian
  return v;
}

// Version 1's reader check (magic, version and header size, fingerprint, length, then xxh3_64 of
// the payload), run on a version 3 value's fields: the work the reader did before the binding.
bool check_v1_work(std::span<const std::byte> v, std::uint64_t fp, std::size_t expected) {
  if (v.size() < pagedkv::kRemoteValueHeaderSize) return false;
  const std::byte* h = v.data();
  std::uint32_t magic = 0;
  std::memcpy(&magic, h, 4);
  if (magic != pagedkv::kRemoteValueMagic) return false;
  if (std::to_integer<unsigned>(h[4]) != pagedkv::kRemoteValueVersion ||
      std::to_integer<unsigned>(h[6]) != pagedkv::kRemoteValueHeaderSize) {
    return false;
  }
  if (le64(h + 8) != fp) return false;
  const std::uint64_t len = le64(h + 16);
  if (len != v.size() - pagedkv::kRemoteValueHeaderSize || len != expected) return false;
  const auto payload = v.subspan(pagedkv::kRemoteValueHeaderSize);
  return XXH3_64bits(payload.data(), payload.size()) != le64(h + 24);  // (never equal: seeded)
}

// ns per check of a value of each size: v1's work vs check_remote_value, and a rejection.
int value_check_bench(const Options& o) {
  std::printf(
      "bench_remote --value-check: ns per value checked, medians over 64 x %d rounds (A/B "
      "alternating)\n\n| payload bytes | v1 work ns | v%u check_remote_value ns | ratio v%u/v1 "
      "(median of pairs) | wrong block rejected ns |\n|---|---|---|---|---|\n",
      o.repetitions, unsigned{pagedkv::kRemoteValueVersion},
      unsigned{pagedkv::kRemoteValueVersion});
  const pagedkv::RemoteValueBinding block{key_of(5), key_of(4), 0};
  const pagedkv::RemoteValueBinding other{key_of(6), key_of(5), 0};
  const std::uint64_t fp = 42;
  volatile std::size_t sink = 0;
  for (std::size_t size : o.sizes) {
    std::vector<std::byte> payload(size);
    for (std::size_t i = 0; i < size; ++i) payload[i] = std::byte(static_cast<std::uint8_t>(i));
    const auto h = pagedkv::encode_remote_value_header(fp, block, payload);
    std::vector<std::byte> value(h.begin(), h.end());
    value.insert(value.end(), payload.begin(), payload.end());
    // Many short rounds (about 1 MiB hashed per timed span, at least 20 checks), A and B
    // alternating within each round and their order alternating between rounds: a drift of the
    // shared machine's speed hits both alike. The barrier keeps the compiler from hoisting the
    // (inlined) v1 hash of unchanged bytes out of the loop.
    const std::size_t iters = std::max<std::size_t>(20, (1u << 20) / (size + 1));
    const auto time_ns = [&](auto&& f) {
      const auto t0 = Clock::now();
      for (std::size_t i = 0; i < iters; ++i) {
        asm volatile("" : : "r"(value.data()) : "memory");
        sink = sink + f();
      }
      return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
             static_cast<double>(iters);
    };
    const auto v1 = [&] { return std::size_t{check_v1_work(value, fp, size)}; };
    const auto v2 = [&] {
      return std::size_t(pagedkv::check_remote_value(value, fp, size, block) ==
                         pagedkv::RemoteValueCheck::kOk);
    };
    const auto wrong = [&] {
      return std::size_t(pagedkv::check_remote_value(value, fp, size, other) ==
                         pagedkv::RemoteValueCheck::kBindingMismatch);
    };
    std::vector<double> a, b, ratio, rej;
    const int rounds = 64 * o.repetitions;
    for (int r = 0; r < rounds; ++r) {
      double x = 0, y = 0;
      if (r % 2 == 0) {
        x = time_ns(v1);
        y = time_ns(v2);
      } else {
        y = time_ns(v2);
        x = time_ns(v1);
      }
      a.push_back(x);
      b.push_back(y);
      ratio.push_back(y / x);
      if (r % 8 == 0) rej.push_back(time_ns(wrong));
    }
    std::printf("| %zu | %.1f | %.1f | %.3f | %.1f |\n", size, median(a), median(b), median(ratio),
                median(rej));
  }
  return 0;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "bench_remote: %s\n", why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--port") {
      o.port = static_cast<std::uint16_t>(std::stoul(next()));
    } else if (a == "--sizes") {
      o.sizes.clear();
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) o.sizes.push_back(std::stoul(item));
    } else if (a == "--bytes-per-size") {
      o.bytes_per_size = std::stoul(next()) << 20;
    } else if (a == "--connections") {
      o.connections = static_cast<unsigned>(std::stoul(next()));
    } else if (a == "--pipeline") {
      o.pipeline = std::stoul(next());
    } else if (a == "--repetitions") {
      o.repetitions = std::stoi(next());
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--value-check") {
      o.value_check = true;
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  if (o.quick) {
    o.sizes = {65536};
    o.bytes_per_size = 4u << 20;
    o.repetitions = 1;
  }
  if (o.sizes.empty() || o.connections == 0 || o.pipeline == 0 || o.repetitions < 1) {
    usage("bad options");
  }

  if (o.value_check) return value_check_bench(o);

  std::optional<pagedkv::test::RedisServer> own;
  if (o.port == 0) {
    if (pagedkv::test::RedisServer::binary().empty()) {
      std::printf("bench_remote: redis-server not installed; nothing measured\n");
      return 0;
    }
    own.emplace();
    if (!own->start()) {
      std::printf("bench_remote: could not start redis-server; nothing measured\n");
      return 0;
    }
    o.port = own->port();
  }
  std::printf(
      "bench_remote: 127.0.0.1:%u, %u connections, pipeline %zu, %d repetitions (medians)\n\n",
      o.port, o.connections, o.pipeline, o.repetitions);
  std::printf(
      "| value | blocks | op | pagedkv blocks/s | pagedkv MB/s | p50 us | p99 us | "
      "redis-benchmark req/s | ratio (median of pairs) | ratio min-max | client CPU us/op "
      "pagedkv / redis-benchmark | server CPU us/op pagedkv / redis-benchmark |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  bool all_ok = true;
  for (std::size_t size : o.sizes) {
    const std::size_t n = std::max<std::size_t>(o.bytes_per_size / size, 4 * o.pipeline);
    struct Series {
      std::vector<double> rate, theirs, ratio, cpu, their_cpu, server, their_server;
      std::vector<std::uint64_t> p50, p99;
    } put_s, get_s;
    const auto record = [](Series& s, const PhaseResult& ours,
                           const std::optional<PhaseResult>& theirs) {
      s.rate.push_back(ours.blocks_per_s);
      s.p50.push_back(ours.p50_us);
      s.p99.push_back(ours.p99_us);
      s.cpu.push_back(ours.client_cpu_us);
      s.server.push_back(ours.server_cpu_us);
      if (theirs) {
        s.theirs.push_back(theirs->blocks_per_s);
        s.ratio.push_back(ours.blocks_per_s / theirs->blocks_per_s);
        s.their_cpu.push_back(theirs->client_cpu_us);
        s.their_server.push_back(theirs->server_cpu_us);
      }
    };
    for (int rep = 0; rep < o.repetitions; ++rep) {
      // Alternate the order so that a drift in the machine's load hits both sides alike.
      PhaseResult p, g;
      std::optional<PhaseResult> rs, rg;
      if (rep % 2 == 0) {
        p = run_phase(o, true, size, n);
        g = run_phase(o, false, size, n);
        rs = redis_benchmark(o, "set", size, n);
        rg = redis_benchmark(o, "get", size, n);
      } else {
        rs = redis_benchmark(o, "set", size, n);
        rg = redis_benchmark(o, "get", size, n);
        p = run_phase(o, true, size, n);
        g = run_phase(o, false, size, n);
      }
      all_ok = all_ok && p.ok == n && g.ok == n;
      record(put_s, p, rs);
      record(get_s, g, rg);
    }
    {
      pagedkv::test::Client c(o.port);
      c.command({"FLUSHALL"});
    }
    const auto row = [&](const char* op, const Series& s) {
      const double rate = median(s.rate);
      const double mbps = rate * static_cast<double>(size) / 1e6;
      std::printf("| %zu KiB | %zu | %s | %.0f | %.0f | %llu | %llu | ", size / 1024, n, op, rate,
                  mbps, (unsigned long long)median_u(s.p50), (unsigned long long)median_u(s.p99));
      if (s.ratio.empty()) {
        std::printf("n/a | n/a | n/a | %.1f / n/a | %.1f / n/a |\n", median(s.cpu),
                    median(s.server));
      } else {
        std::printf("%.0f | %.2f | %.2f-%.2f | %.1f / %.1f | %.1f / %.1f |\n", median(s.theirs),
                    median(s.ratio), *std::min_element(s.ratio.begin(), s.ratio.end()),
                    *std::max_element(s.ratio.begin(), s.ratio.end()), median(s.cpu),
                    median(s.their_cpu), median(s.server), median(s.their_server));
      }
    };
    row("put (SET)", put_s);
    row("get (GET)", get_s);
    std::fflush(stdout);
  }
  if (!all_ok) {
    std::printf("\nbench_remote: some operations did not succeed (see stats)\n");
    return 1;
  }
  return 0;
}
