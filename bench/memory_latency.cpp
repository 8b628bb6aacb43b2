// memory_latency: the latency of a dependent random walk over 64-byte lines, per buffer size.
//
// The pool's per-block tables are read at random, so whether a pool of N blocks runs from cache
// or from memory depends on how much of it the machine's caches hold. This prints, for buffers
// of 1 to 64 MiB, the nanoseconds per step of a pointer chain through a random permutation of
// the buffer's lines (2 MiB-aligned, marked for transparent huge pages like the pool's tables):
// the load-to-use latency of a line at that working-set size (bench/results/pool_hash_speed.md).
// usage: memory_latency [STEPS (default 20000000)]
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

struct alignas(64) Line {
  Line* next;
  char pad[64 - sizeof(Line*)];
};

}  // namespace

int main(int argc, char** argv) {
  std::size_t steps = 20'000'000;
  if (argc == 2) {  // digits only, 1 .. 10^12
    const std::string arg = argv[1];
    const bool digits = !arg.empty() && arg.size() <= 12 &&
                        arg.find_first_not_of("0123456789") == std::string::npos;
    steps = digits ? std::stoull(arg) : 0;
  }
  if (argc > 2 || steps == 0) {
    std::fprintf(stderr, "usage: memory_latency [STEPS (a positive integer, at most 12 digits)]\n");
    return 2;
  }
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  std::printf("buffer_mib ns_per_step\n");
  for (const std::size_t mib : {1, 2, 3, 4, 6, 8, 16, 64}) {
    const std::size_t bytes = mib << 20;
    const std::size_t n = bytes / sizeof(Line);
    const std::size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
    auto* lines = static_cast<Line*>(std::aligned_alloc(kHuge, rounded));
    if (lines == nullptr) return 1;
#if defined(__linux__)
    madvise(lines, rounded, MADV_HUGEPAGE);  // a hint, as for the pool's tables
#endif
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin() + 1, order.end(), std::mt19937_64(1));
    for (std::size_t i = 0; i < n; ++i) lines[order[i]].next = &lines[order[(i + 1) % n]];
    const Line* p = &lines[0];
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < steps; ++i) p = p->next;
    const auto t1 = std::chrono::steady_clock::now();
    const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / steps;
    // Printing p keeps the walk from being optimized away.
    std::printf("%zu %.1f%s\n", mib, ns, p == nullptr ? " (null)" : "");
    std::free(lines);
  }
  return 0;
}
