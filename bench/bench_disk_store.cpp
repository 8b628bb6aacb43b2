// bench_disk_store: DiskStore's put and get throughput against plain sequential pwrite/pread of
// the same payload bytes on the same file system, in the same run, rounds alternating (A/B).
//
// Per round and value size: plain pwrite of `blocks` payloads one after another into one file,
// then plain pread of them back (A); DiskStore puts of `blocks` new keys (so from the second round
// on every put evicts the least recently used value, as a full cache does) in batches of `batch`,
// each batch submitted and waited for, then gets of them (B); A then B in even rounds, B then A
// in odd ones. Throughput counts payload bytes only
// (the store also writes its 64-byte record and 144-byte value header, and checksums every
// value). Also timed, in memory alone: the checksum pass and the copy a store get adds to a
// read. Prints the median of each and store/plain ratios, by wall time and by the process's CPU
// time (all threads; on a loaded machine the wall figures also count other processes' turns). No
// fsync on either side: both measure the page cache path (the store's documented policy); the files
// are removed at exit.
//
// Usage: bench_disk_store [--dir DIR] [--rounds N] [--blocks N] [--batch N] [--io-threads 1|2]
//                         [--quick]   (--io-threads: DiskStoreConfig::io_threads, default 1)
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "pagedkv/remote/disk_store.hpp"
#include "pagedkv/remote/remote_value.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

pagedkv::BlockHash key_of(std::uint64_t i) {
  std::array<std::uint8_t, 32> b{};
  for (int k = 0; k < 8; ++k) b[k] = static_cast<std::uint8_t>(i >> (8 * k));
  b[31] = 0x42;
  return pagedkv::BlockHash(b);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds of the whole process (every thread: the store's I/O thread included). On a loaded
// machine wall time also counts the time other processes held the cores; CPU time does not.
double cpu_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

struct Figures {
  std::vector<double> plain_write, plain_read, store_put, store_get;  // GB/s per round
  std::vector<double> cpu_plain_write, cpu_plain_read, cpu_store_put, cpu_store_get;  // per CPU s
  std::vector<double> checksum, copy;  // the store's extra passes alone, in memory
};

void wait_all(pagedkv::DiskStore& s, std::size_t n, pagedkv::RemoteResult want,
              std::vector<pagedkv::RemoteCompletion>& buf) {
  std::size_t got = 0;
  while (got < n) {
    buf.clear();
    got += s.wait(buf, std::chrono::milliseconds(100));
    for (const auto& c : buf) {
      if (c.result != want) {
        std::fprintf(stderr, "unexpected result %s\n", std::string(to_string(c.result)).c_str());
        std::exit(1);
      }
    }
  }
}

void run_size(const fs::path& dir, std::size_t value, std::size_t blocks, std::size_t batch,
              int rounds, int io_threads) {
  // Distinct payloads (as many as a batch) so neither side writes one buffer over and over.
  std::vector<std::vector<std::byte>> src(batch, std::vector<std::byte>(value));
  for (std::size_t b = 0; b < batch; ++b) {
    for (std::size_t i = 0; i < value; ++i) src[b][i] = std::byte((i * 131 + b * 7) & 0xff);
  }
  std::vector<std::vector<std::byte>> dst(batch, std::vector<std::byte>(value));

  const fs::path plain = dir / "plain.bin";
  const int fd = ::open(plain.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) die("open plain");
  // Sized up front as the store's slab is (DiskStoreConfig::preallocate), so neither side pays
  // block allocation inside the timed loops.
  if (::posix_fallocate(fd, 0, off_t(value * blocks)) != 0) die("posix_fallocate plain");
  pagedkv::DiskStoreConfig cfg;
  cfg.directory = dir / "store";
  cfg.name_space = "bench";
  cfg.layout_fingerprint = pagedkv::layout_fingerprint("bench");
  cfg.value_bytes = value;
  cfg.capacity_bytes = std::uint64_t(blocks) * pagedkv::DiskStore::slot_bytes_for(value);
  cfg.sync_on_close = false;
  cfg.io_threads = io_threads;
  fs::remove_all(cfg.directory);
  pagedkv::DiskStore store(cfg);
  std::vector<pagedkv::RemoteCompletion> buf;
  std::vector<pagedkv::RemotePut> puts(batch);
  std::vector<pagedkv::RemoteGet> gets(batch);

  Figures f;
  const double gb = double(value) * double(blocks) / 1e9;
  for (int r = 0; r < rounds; ++r) {
    // A: plain sequential pwrite, then pread.
    const auto plain_side = [&] {
      auto t0 = Clock::now();
      double c0 = cpu_now();
      for (std::size_t i = 0; i < blocks; ++i) {
        if (::pwrite(fd, src[i % batch].data(), value, off_t(i * value)) != ssize_t(value)) {
          die("pwrite");
        }
      }
      f.plain_write.push_back(gb / seconds_since(t0));
      f.cpu_plain_write.push_back(gb / (cpu_now() - c0));
      t0 = Clock::now();
      c0 = cpu_now();
      for (std::size_t i = 0; i < blocks; ++i) {
        if (::pread(fd, dst[i % batch].data(), value, off_t(i * value)) != ssize_t(value)) {
          die("pread");
        }
      }
      f.plain_read.push_back(gb / seconds_since(t0));
      f.cpu_plain_read.push_back(gb / (cpu_now() - c0));
    };
    // B: the store, new keys each round.
    const auto store_side = [&] {
      const std::uint64_t first = std::uint64_t(r) * blocks;
      auto t0 = Clock::now();
      double c0 = cpu_now();
      for (std::size_t i = 0; i < blocks; i += batch) {
        const std::size_t n = std::min(batch, blocks - i);
        for (std::size_t k = 0; k < n; ++k) puts[k] = {key_of(first + i + k), src[k], {}, 0};
        if (!store.put(std::span(puts.data(), n))) die("put refused");
        wait_all(store, n, pagedkv::RemoteResult::kStored, buf);
      }
      f.store_put.push_back(gb / seconds_since(t0));
      f.cpu_store_put.push_back(gb / (cpu_now() - c0));
      t0 = Clock::now();
      c0 = cpu_now();
      for (std::size_t i = 0; i < blocks; i += batch) {
        const std::size_t n = std::min(batch, blocks - i);
        for (std::size_t k = 0; k < n; ++k) gets[k] = {key_of(first + i + k), dst[k], {}, 0};
        if (!store.get(std::span(gets.data(), n))) die("get refused");
        wait_all(store, n, pagedkv::RemoteResult::kHit, buf);
      }
      f.store_get.push_back(gb / seconds_since(t0));
      f.cpu_store_get.push_back(gb / (cpu_now() - c0));
    };
    // A then B in even rounds, B then A in odd ones: neither side always runs first.
    if (r % 2 == 0) {
      plain_side();
      store_side();
    } else {
      store_side();
      plain_side();
    }
    // C: the extra work of a store get in memory alone: the value's checksum (the header's
    // xxh3_64 pass over the payload, as a put computes and a get verifies it), one copy.
    std::uint64_t sink = 0;
    const pagedkv::RemoteValueBinding binding{key_of(1), {}, 0};
    auto t0 = Clock::now();
    for (std::size_t i = 0; i < blocks; ++i) {
      sink += std::to_integer<std::uint8_t>(
          pagedkv::encode_remote_value_header(cfg.layout_fingerprint, binding, src[i % batch])[24]);
    }
    f.checksum.push_back(gb / seconds_since(t0));
    t0 = Clock::now();
    for (std::size_t i = 0; i < blocks; ++i) {
      std::memcpy(dst[i % batch].data(), src[(i + 1) % batch].data(), value);
    }
    f.copy.push_back(gb / seconds_since(t0));
    if (sink == 42) std::printf(" ");  // keeps the checksums
  }
  // The last round's gets really returned the bytes put (C copied after them: redo one batch).
  for (std::size_t k = 0; k < std::min(batch, blocks); ++k) {
    gets[k] = {key_of(std::uint64_t(rounds - 1) * blocks + k), dst[k], {}, 0};
  }
  if (!store.get(std::span(gets.data(), std::min(batch, blocks)))) die("get refused");
  wait_all(store, std::min(batch, blocks), pagedkv::RemoteResult::kHit, buf);
  for (std::size_t k = 0; k < std::min(batch, blocks); ++k) {
    if (dst[k] != src[k]) {
      std::fprintf(stderr, "store returned wrong bytes\n");
      std::exit(1);
    }
  }
  ::close(fd);
  const double pw = median(f.plain_write), pr = median(f.plain_read);
  const double sp = median(f.store_put), sg = median(f.store_get);
  std::printf(
      "value %8zu B x %5zu blocks, %d rounds, io_threads %d: write GB/s plain %6.2f store %6.2f "
      "(ratio %.2f) | "
      "read GB/s plain %6.2f store %6.2f (ratio %.2f) | in memory: checksum %6.2f GB/s, memcpy "
      "%6.2f GB/s\n",
      value, blocks, rounds, io_threads, pw, sp, sp / pw, pr, sg, sg / pr, median(f.checksum),
      median(f.copy));
  const double cpw = median(f.cpu_plain_write), cpr = median(f.cpu_plain_read);
  const double csp = median(f.cpu_store_put), csg = median(f.cpu_store_get);
  std::printf(
      "  per CPU second (process): write plain %6.2f store %6.2f (ratio %.2f) | read plain %6.2f "
      "store %6.2f (ratio %.2f)\n",
      cpw, csp, csp / cpw, cpr, csg, csg / cpr);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = fs::temp_directory_path() / ("pagedkv-bench-disk-" + std::to_string(::getpid()));
  int rounds = 7;
  std::size_t total_bytes = std::size_t{256} << 20;  // per value size
  std::size_t batch = 32;
  bool quick = false;
  std::size_t blocks_arg = 0;
  int io_threads = 1;
  std::vector<std::size_t> sizes = {std::size_t{64} << 10, std::size_t{512} << 10,
                                    std::size_t{2} << 20};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--dir")
      dir = next();
    else if (a == "--rounds")
      rounds = std::stoi(next());
    else if (a == "--blocks")
      blocks_arg = std::stoul(next());
    else if (a == "--batch")
      batch = std::stoul(next());
    else if (a == "--io-threads")
      io_threads = std::stoi(next());
    else if (a == "--sizes") {  // comma-separated KiB, e.g. 64,512,2048
      sizes.clear();
      const std::string list = next();
      for (std::size_t p = 0; p < list.size();) {
        const std::size_t c = std::min(list.find(',', p), list.size());
        sizes.push_back(std::stoul(list.substr(p, c - p)) << 10);
        p = c + 1;
      }
    } else if (a == "--quick")
      quick = true;
    else {
      std::fprintf(stderr,
                   "usage: bench_disk_store [--dir DIR] [--rounds N] [--blocks N] [--batch N] "
                   "[--io-threads 1|2] [--quick]\n");
      return 2;
    }
  }
  if (quick) {
    rounds = 1;
    total_bytes = std::size_t{8} << 20;
  }
  if (rounds < 1 || batch < 1) return 2;
  fs::create_directories(dir);
  std::printf("dir %s (file system of the store and the plain file)\n", dir.c_str());
  for (std::size_t value : sizes) {
    const std::size_t blocks =
        blocks_arg != 0 ? blocks_arg : std::max<std::size_t>(1, total_bytes / value);
    run_size(dir, value, blocks, std::min(batch, blocks), rounds, io_threads);
  }
  fs::remove_all(dir);
  return 0;
}
