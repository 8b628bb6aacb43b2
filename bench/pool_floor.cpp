// pool_floor: the sequential replay's pool work (docs/traces.md: file order, one request at a time,
// prompt only), done by pagedkv's KVCacheManager and by a minimal pool side by side, in one
// process on the same pre-hashed requests (SHA-256, block size 16, verification on).
//
// The minimal pool has the same semantics and the same kind of data (an LRU free queue of
// intrusive links, ref counts, a linear-probing map of block ids with 4 slots per block, stored
// parent hash and tokens per block, verified hits) and nothing else: no argument checks, no
// strong guarantee, no events, no groups, no statistics. Its time is a floor for that work on
// this machine; pagedkv's distance to it is what its contract and structure cost. Both must
// reproduce the same hit tokens and evictions: an independent check of the manager's figures
// (exit 1 on a mismatch).
//
//   pool_floor --trace FILE --num-blocks N [--limit K] [--rounds R] [--phases]
//
// Prints one JSON object per system and round: CPU ns per prompt block (CLOCK_THREAD_CPUTIME_ID)
// and, with --phases, time-stamp-counter ticks per block by phase (lookup, allocate_slots,
// release for pagedkv; lookup, allocate with eviction, store, free for the floor; 0 where there
// is no counter). Reading the counter can be slow under a hypervisor (on this project's VMs it
// added about 3 ns per block), so --phases is for the split, not for the totals.
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include "pagedkv/manager/kv_cache_manager.hpp"
#include "replay.hpp"

namespace {

using namespace pagedkv;

double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

bool g_phases = false;  // --phases

std::uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return g_phases ? __rdtsc() : 0;
#else
  return 0;
#endif
}

constexpr std::size_t kBlockSize = 16;

class MinimalPool {
 public:
  explicit MinimalPool(std::int32_t num_blocks)
      : n_(num_blocks),
        records_(static_cast<std::size_t>(num_blocks)),
        prev_(static_cast<std::size_t>(num_blocks)),
        next_(static_cast<std::size_t>(num_blocks)),
        parent_(static_cast<std::size_t>(num_blocks)),
        tokens_(static_cast<std::size_t>(num_blocks)) {
    std::size_t capacity = 8;
    while (capacity < 4 * static_cast<std::size_t>(num_blocks)) capacity *= 2;
    slots_.assign(capacity, Slot{-1, 0});
    mask_ = capacity - 1;
    for (std::int32_t i = 1; i < n_; ++i) {  // block 0 is the null block, never queued
      prev_[i] = i > 1 ? i - 1 : -1;
      next_[i] = i + 1 < n_ ? i + 1 : -1;
    }
    head_ = n_ > 1 ? 1 : -1;
    tail_ = n_ > 1 ? n_ - 1 : -1;
  }

  std::uint64_t evictions() const { return evictions_; }
  const std::array<std::uint64_t, 4>& phase_ticks() const { return phase_; }

  // One request: lookup, allocate (evicting), cache its full blocks, free. Returns hit tokens.
  std::size_t run(const Request& r) {
    const auto hashes = r.block_hashes();
    const auto tokens = r.tokens();
    const std::size_t num_tokens = tokens.size();
    static constexpr std::array<std::uint8_t, 32> kRoot{};
    const std::uint64_t t0 = ticks();
    // Lookup: the longest verified prefix, capped at num_tokens - 1.
    const std::size_t limit = std::min((num_tokens - 1) / kBlockSize, hashes.size());
    table_.clear();
    for (std::size_t i = 0; i < limit; ++i) {
      if (i + 8 < limit) __builtin_prefetch(&slots_[tag_of(hashes[i + 8]) & mask_]);
      const std::uint8_t* parent = i > 0 ? hashes[i - 1].padded_bytes().data() : kRoot.data();
      const std::int32_t id = find(hashes[i], parent, tokens.data() + kBlockSize * i);
      if (id < 0) break;
      table_.push_back(id);
    }
    const std::size_t hits = table_.size();
    const std::uint64_t t1 = ticks();
    for (const std::int32_t id : table_) {
      if (records_[id].ref == 0) unlink(id);
      ++records_[id].ref;
    }
    const std::size_t total = (num_tokens + kBlockSize - 1) / kBlockSize;
    for (std::size_t k = hits; k < total; ++k) {
      const std::int32_t id = head_;
      unlink(id);
      if (records_[id].hash.size() != 0) {
        erase(id);
        records_[id].hash = BlockHash();
        ++evictions_;
      }
      records_[id].ref = 1;
      table_.push_back(id);
    }
    const std::uint64_t t2 = ticks();
    const std::size_t full = num_tokens / kBlockSize;
    for (std::size_t i = hits; i < full; ++i) {
      __builtin_prefetch(&slots_[tag_of(hashes[i]) & mask_]);
    }
    for (std::size_t i = hits; i < full; ++i) {
      const std::int32_t id = table_[i];
      records_[id].hash = hashes[i];
      std::memcpy(parent_[id].data(), i > 0 ? hashes[i - 1].padded_bytes().data() : kRoot.data(),
                  32);
      std::memcpy(tokens_[id].data(), tokens.data() + kBlockSize * i, sizeof(tokens_[id]));
      insert(id);
    }
    const std::uint64_t t3 = ticks();
    // Free, tail first: cached blocks to the queue's tail, the rest to its head.
    for (std::size_t k = table_.size(); k-- > 0;) {
      const std::int32_t id = table_[k];
      if (--records_[id].ref == 0) {
        if (records_[id].hash.size() != 0) {
          append(id);
        } else {
          prepend(id);
        }
      }
    }
    const std::uint64_t t4 = ticks();
    phase_[0] += t1 - t0;
    phase_[1] += t2 - t1;
    phase_[2] += t3 - t2;
    phase_[3] += t4 - t3;
    return kBlockSize * hits;
  }

 private:
  struct Slot {
    std::int32_t id;
    std::uint32_t tag;
  };

  static std::uint32_t tag_of(const BlockHash& h) {
    return static_cast<std::uint32_t>((h.hash_code() * 0x9E3779B97F4A7C15ull) >> 32);
  }
  void unlink(std::int32_t id) {
    const std::int32_t p = prev_[id], q = next_[id];
    if (p >= 0) {
      next_[p] = q;
    } else {
      head_ = q;
    }
    if (q >= 0) {
      prev_[q] = p;
    } else {
      tail_ = p;
    }
  }
  void append(std::int32_t id) {
    prev_[id] = tail_;
    next_[id] = -1;
    if (tail_ >= 0) {
      next_[tail_] = id;
    } else {
      head_ = id;
    }
    tail_ = id;
  }
  void prepend(std::int32_t id) {
    next_[id] = head_;
    prev_[id] = -1;
    if (head_ >= 0) {
      prev_[head_] = id;
    } else {
      tail_ = id;
    }
    head_ = id;
  }
  void insert(std::int32_t id) {
    const std::uint32_t tag = tag_of(records_[id].hash);
    std::size_t i = tag & mask_;
    while (slots_[i].id != -1) i = (i + 1) & mask_;
    slots_[i] = Slot{id, tag};
  }
  void erase(std::int32_t id) {  // backward-shift deletion
    std::size_t i = tag_of(records_[id].hash) & mask_;
    while (slots_[i].id != id) i = (i + 1) & mask_;
    std::size_t j = i;
    for (;;) {
      j = (j + 1) & mask_;
      if (slots_[j].id == -1) break;
      const std::size_t home = slots_[j].tag & mask_;
      if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{-1, 0};
  }
  // The first inserted block with this hash whose parent hash and tokens equal the request's.
  std::int32_t find(const BlockHash& h, const std::uint8_t* parent, const TokenId* tokens) const {
    const std::uint32_t tag = tag_of(h);
    for (std::size_t i = tag & mask_; slots_[i].id != -1; i = (i + 1) & mask_) {
      if (slots_[i].tag != tag) continue;
      const std::int32_t id = slots_[i].id;
      if (records_[id].hash == h && std::memcmp(parent_[id].data(), parent, 32) == 0 &&
          std::memcmp(tokens_[id].data(), tokens, sizeof(tokens_[id])) == 0) {
        return id;
      }
    }
    return -1;
  }

  std::int32_t n_;
  struct Record {
    BlockHash hash;  // empty: not cached
    std::int32_t ref = 0;
  };
  std::vector<Record> records_;  // hash and ref count in one place: one line per block
  std::vector<std::int32_t> prev_, next_;
  std::int32_t head_ = -1, tail_ = -1;
  std::vector<std::array<std::uint8_t, 32>> parent_;
  std::vector<std::array<TokenId, kBlockSize>> tokens_;
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::uint64_t evictions_ = 0;
  std::vector<std::int32_t> table_;
  std::array<std::uint64_t, 4> phase_{};
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "pool_floor: %s\nusage: pool_floor --trace FILE --num-blocks N [--limit K] "
               "[--rounds R] [--phases]\n",
               problem.c_str());
  std::exit(2);
}

std::uint64_t number(const char* flag, const char* text, std::uint64_t min, std::uint64_t max) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || text[0] == '-' || v < min || v > max) {
    usage(std::string(flag) + " needs a whole number in " + std::to_string(min) + ".." +
          std::to_string(max) + ", got '" + text + "'");
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string trace_path;
  std::uint64_t num_blocks = 0, limit = 0, rounds = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--phases") {
      g_phases = true;
      continue;
    }
    if (i + 1 >= argc) usage(flag + " needs a value");
    const char* value = argv[++i];
    if (flag == "--trace") {
      trace_path = value;
    } else if (flag == "--num-blocks") {
      num_blocks = number("--num-blocks", value, 2, 1u << 30);
    } else if (flag == "--limit") {
      limit = number("--limit", value, 1, UINT64_MAX);
    } else if (flag == "--rounds") {
      rounds = number("--rounds", value, 1, 1000);
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (trace_path.empty() || num_blocks == 0) usage("--trace and --num-blocks are required");
  replay::LoadOptions load;
  load.limit = limit;
  const replay::Trace trace = replay::load_hashid_jsonl(trace_path, load);
  KVCacheManagerConfig c;
  c.num_blocks = static_cast<std::int32_t>(num_blocks);
  c.block_size = kBlockSize;
  c.hash_scheme = HashScheme::kSha256;
  c.hash_seed = "pagedkv-replay";
  std::uint64_t blocks = 0;
  std::vector<Request> requests = replay::hash_prompts(trace, c, num_blocks - 1, blocks);
  if (blocks == 0) usage("no request of the trace fits " + std::to_string(num_blocks) + " blocks");
  const auto per_block = [blocks](std::uint64_t v) { return static_cast<double>(v) / blocks; };
  int status = 0;
  for (std::uint64_t round = 1; round <= rounds; ++round) {
    auto m = std::make_unique<KVCacheManager>(c);
    std::uint64_t hit = 0;
    std::array<std::uint64_t, 3> phase{};
    double t0 = cpu_now();
    for (Request& r : requests) {
      const std::uint64_t a = ticks();
      const CacheHit h = m->get_computed_blocks(r);
      const std::uint64_t b = ticks();
      if (!m->allocate_slots(r, r.num_tokens() - h.num_tokens, h)) {
        std::fprintf(stderr, "pool_floor: request %llu did not fit an idle pool\n",
                     static_cast<unsigned long long>(r.id()));
        return 1;
      }
      const std::uint64_t d = ticks();
      m->preempt(r);  // releases like free() and lets the request be replayed next round
      const std::uint64_t e = ticks();
      hit += h.num_tokens;
      phase[0] += b - a;
      phase[1] += d - b;
      phase[2] += e - d;
    }
    const double pagedkv_ns = (cpu_now() - t0) / static_cast<double>(blocks) * 1e9;
    const std::uint64_t pagedkv_evictions = m->stats().evictions;
    m.reset();
    std::printf(
        "{\"system\":\"pagedkv\",\"round\":%llu,\"num_blocks\":%llu,\"prompt_blocks\":%llu,"
        "\"ns_per_block\":%.2f,\"ticks_per_block\":{\"lookup\":%.1f,\"allocate_slots\":%.1f,"
        "\"release\":%.1f},\"hit_tokens\":%llu,\"evictions\":%llu}\n",
        static_cast<unsigned long long>(round), static_cast<unsigned long long>(num_blocks),
        static_cast<unsigned long long>(blocks), pagedkv_ns, per_block(phase[0]),
        per_block(phase[1]), per_block(phase[2]), static_cast<unsigned long long>(hit),
        static_cast<unsigned long long>(pagedkv_evictions));
    auto f = std::make_unique<MinimalPool>(static_cast<std::int32_t>(num_blocks));
    std::uint64_t floor_hit = 0;
    t0 = cpu_now();
    for (const Request& r : requests) floor_hit += f->run(r);
    const double floor_ns = (cpu_now() - t0) / static_cast<double>(blocks) * 1e9;
    const auto& fp = f->phase_ticks();
    std::printf(
        "{\"system\":\"floor\",\"round\":%llu,\"num_blocks\":%llu,\"prompt_blocks\":%llu,"
        "\"ns_per_block\":%.2f,\"ticks_per_block\":{\"lookup\":%.1f,\"allocate\":%.1f,"
        "\"store\":%.1f,\"free\":%.1f},\"hit_tokens\":%llu,\"evictions\":%llu}\n",
        static_cast<unsigned long long>(round), static_cast<unsigned long long>(num_blocks),
        static_cast<unsigned long long>(blocks), floor_ns, per_block(fp[0]), per_block(fp[1]),
        per_block(fp[2]), per_block(fp[3]), static_cast<unsigned long long>(floor_hit),
        static_cast<unsigned long long>(f->evictions()));
    std::fflush(stdout);
    if (floor_hit != hit || f->evictions() != pagedkv_evictions) {
      std::fprintf(stderr,
                   "pool_floor: the minimal pool and pagedkv disagree: %llu / %llu hit tokens, "
                   "%llu / %llu evictions\n",
                   static_cast<unsigned long long>(floor_hit), static_cast<unsigned long long>(hit),
                   static_cast<unsigned long long>(f->evictions()),
                   static_cast<unsigned long long>(pagedkv_evictions));
      status = 1;
    }
  }
  return status;
}
