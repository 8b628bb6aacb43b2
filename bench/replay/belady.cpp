#include "belady.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"

namespace pagedkv::replay {

namespace {

using Clock = std::chrono::steady_clock;

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

constexpr std::uint32_t kNone = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

std::uint64_t cdiv(std::uint64_t a, std::uint64_t b) {
  return (a + b - 1) / b;
}

// The library's structures, mirrored: FreeBlockQueue (block 0, the null block, never queued,
// serves as the list's sentinel) and the hash map with duplicates in insertion order.
class LruPool {
 public:
  LruPool(std::uint32_t n, std::uint32_t distinct)
      : prev_(n),
        next_(n),
        ref_(n, 0),
        hash_(n, kNone),
        dup_prev_(n, kNone),
        dup_next_(n, kNone),
        first_(distinct, kNone),
        last_(distinct, kNone),
        free_(n - 1) {
    // Initially blocks 1..n-1 in id order.
    for (std::uint32_t b = 0; b < n; ++b) {
      next_[b] = b + 1 < n ? b + 1 : 0;
      prev_[b] = b == 0 ? n - 1 : b - 1;
    }
  }

  std::uint32_t lookup(std::uint32_t id) const { return first_[id]; }
  std::uint32_t num_free() const { return free_; }

  void touch(std::uint32_t b) {
    if (ref_[b]++ == 0) unlink(b);
  }
  // Pops the head; evicts it when it is cached (returns true then).
  bool pop(std::uint32_t& b) {
    b = next_[0];
    unlink(b);
    ref_[b] = 1;
    if (hash_[b] == kNone) return false;
    uncache(b);
    return true;
  }
  void cache(std::uint32_t b, std::uint32_t id) {
    hash_[b] = id;
    dup_prev_[b] = last_[id];
    dup_next_[b] = kNone;
    if (last_[id] == kNone) {
      first_[id] = b;
    } else {
      dup_next_[last_[id]] = b;
    }
    last_[id] = b;
  }
  // free_blocks(blocks) with `blocks` already in the order the manager passes them (tail first).
  void free(const std::vector<std::uint32_t>& blocks) {
    std::uint32_t group_last = 0;  // uncached ones go to the head as a group, in the given order
    for (const std::uint32_t b : blocks) {
      if (--ref_[b] != 0) continue;
      if (hash_[b] == kNone) {
        insert_after(group_last, b);
        group_last = b;
      } else {
        insert_after(prev_[0], b);  // the tail
      }
    }
  }

 private:
  void unlink(std::uint32_t b) {
    next_[prev_[b]] = next_[b];
    prev_[next_[b]] = prev_[b];
    --free_;
  }
  void insert_after(std::uint32_t at, std::uint32_t b) {
    prev_[b] = at;
    next_[b] = next_[at];
    prev_[next_[at]] = b;
    next_[at] = b;
    ++free_;
  }
  void uncache(std::uint32_t b) {
    const std::uint32_t id = hash_[b];
    if (dup_prev_[b] == kNone) {
      first_[id] = dup_next_[b];
    } else {
      dup_next_[dup_prev_[b]] = dup_next_[b];
    }
    if (dup_next_[b] == kNone) {
      last_[id] = dup_prev_[b];
    } else {
      dup_prev_[dup_next_[b]] = dup_prev_[b];
    }
    hash_[b] = kNone;
  }

  std::vector<std::uint32_t> prev_, next_, ref_, hash_, dup_prev_, dup_next_, first_, last_;
  std::uint32_t free_;
};

// A standard normal value that depends only on `key` (SplitMix64, then Box-Muller): the same
// request gets the same draw in every run and at every use.
double normal_of(std::uint64_t key) {
  const std::uint64_t a = splitmix64_mix(key);
  const std::uint64_t b = splitmix64_mix(a);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Belady: empty blocks first, then the evictable cached block with the largest next use. The
// reuse oracles rank by whether a block is used again, not when: blocks never used again first,
// oldest free first; then the others, oldest free first (kReuseOracle: LRU) or newest free first
// (kReuseOracleMru: the blocks waiting longest for their next use are kept).
class BeladyPool {
 public:
  BeladyPool(std::uint32_t n, std::uint32_t distinct, Eviction rule, double noise_sigma,
             const std::vector<std::uint64_t>& offsets)
      : ref_(n, 0),
        hash_(n, kNone),
        key_(n, kNever),
        stamp_(n, 0),
        freed_at_(n, 0),
        request_freed_at_(n, 0),
        cached_(distinct, kNone),
        n_(n),
        rule_(rule),
        sigma_(noise_sigma),
        offsets_(offsets) {
    for (std::uint32_t b = n - 1; b >= 1; --b) empty_.push_back(b);  // block 1 used first
  }

  std::uint32_t lookup(std::uint32_t id) const { return cached_[id]; }
  std::uint32_t num_free() const { return static_cast<std::uint32_t>(empty_.size()) + evictable_; }

  void touch(std::uint32_t b) {
    if (ref_[b]++ == 0) {
      ++stamp_[b];  // leaves the evictable set (its heap entries go stale)
      --evictable_;
    }
  }
  bool pop(std::uint32_t& b) {
    if (!empty_.empty()) {
      b = empty_.back();
      empty_.pop_back();
      ref_[b] = 1;
      return false;
    }
    for (;;) {
      if (heap_.empty()) throw Error(ErrorCode::kInvalidState, "belady: no evictable block");
      std::pop_heap(heap_.begin(), heap_.end());
      const Entry e = heap_.back();
      heap_.pop_back();
      if (e.stamp != stamp_[e.block]) continue;  // stale
      b = e.block;
      break;
    }
    ++stamp_[b];
    --evictable_;
    cached_[hash_[b]] = kNone;
    hash_[b] = kNone;
    ref_[b] = 1;
    return true;
  }
  // The block `b` (held) gets the hash `id` unless it is cached already; either way the cached
  // block's next use becomes `next_use` (the block is at trace position `pos`; kBeladyNoisy keys
  // it by a noisy estimate of that next use instead).
  void use(std::uint32_t b, std::uint32_t id, std::uint64_t next_use, std::uint64_t pos) {
    if (rule_ == Eviction::kBeladyNoisy) next_use = noisy(next_use, pos);
    const std::uint32_t c = cached_[id];
    if (c == kNone) {
      cached_[id] = b;
      hash_[b] = id;
      key_[b] = next_use;
      return;
    }
    key_[c] = next_use;
    if (ref_[c] == 0) push(c);  // an evictable copy (its parent was missing): re-keyed
  }
  void free(const std::vector<std::uint32_t>& blocks) {
    ++requests_freed_;
    std::uint32_t k = 0;  // the block's place in this free (the table's tail first)
    for (const std::uint32_t b : blocks) {
      ++k;
      if (--ref_[b] != 0) continue;
      if (hash_[b] == kNone) {
        empty_.push_back(b);
      } else {
        ++evictable_;
        freed_at_[b] = ++clock_;
        request_freed_at_[b] = (requests_freed_ << 32) | (0xffffffffu - k);
        push(b);
      }
    }
  }

 private:
  struct Entry {
    std::uint64_t key;
    std::uint32_t block;
    std::uint32_t stamp;
    bool operator<(const Entry& o) const { return key != o.key ? key < o.key : block < o.block; }
  };
  // The heap's key (the largest is evicted): the next use (Belady); for the reuse oracles 2^63
  // plus (2^63 - 1 - the free's number) for a block never used again, and for the others that
  // (LRU: the oldest free first) or the request's free number and then the place in it (MRU:
  // the most recent request's blocks first, its table's tail first, so that a parent never goes
  // before its children).
  // kBeladyNoisy: the next use's distance from pos multiplied by exp(sigma z), z standard normal
  // (log-normal noise: a predictor off by a factor e^sigma at one standard deviation), at least 1;
  // "never used again" stays exact. z belongs to the request of the next use (one draw per
  // request, from its index): a predictor errs on when a request comes, and every block that
  // request will reuse shares the error, so a parent stays keyed just before its children (an
  // independent draw per block would evict random blocks inside a chain and cut it).
  std::uint64_t noisy(std::uint64_t next_use, std::uint64_t pos) const {
    if (next_use == kNever || sigma_ == 0.0) return next_use;
    const auto at = std::upper_bound(offsets_.begin(), offsets_.end(), next_use);
    const auto request = static_cast<std::uint64_t>(at - offsets_.begin() - 1);
    const double d = static_cast<double>(next_use - pos) * std::exp(sigma_ * normal_of(request));
    constexpr double kFar = 1e18;  // below kNever: a block used again is never keyed "never"
    return pos + static_cast<std::uint64_t>(std::clamp(std::llround(std::min(d, kFar)), 1LL,
                                                       static_cast<long long>(kFar)));
  }
  std::uint64_t rank(std::uint32_t b) const {
    constexpr std::uint64_t kUnused = std::uint64_t{1} << 63;
    const std::uint64_t oldest_first = kUnused - 1 - freed_at_[b];
    switch (rule_) {
      case Eviction::kReuseOracle:
        return key_[b] == kNever ? kUnused + oldest_first : oldest_first;
      case Eviction::kReuseOracleMru:
        return key_[b] == kNever ? kUnused + oldest_first : request_freed_at_[b];
      case Eviction::kBelady:
      case Eviction::kBeladyNoisy:
      case Eviction::kLru:
        break;
    }
    return key_[b];
  }
  void push(std::uint32_t b) {
    ++stamp_[b];
    heap_.push_back(Entry{rank(b), b, stamp_[b]});
    std::push_heap(heap_.begin(), heap_.end());
    if (heap_.size() > 4 * static_cast<std::size_t>(n_) + 1024) compact();
  }
  void compact() {
    std::erase_if(heap_, [&](const Entry& e) { return e.stamp != stamp_[e.block]; });
    std::make_heap(heap_.begin(), heap_.end());
  }

  std::vector<std::uint32_t> ref_, hash_;
  std::vector<std::uint64_t> key_;
  std::vector<std::uint32_t> stamp_;
  std::vector<std::uint64_t> freed_at_;  // the reuse oracle's LRU order: the number of the free
  std::vector<std::uint64_t> request_freed_at_;  // its MRU order (requests_freed_ << 32 | 2^32-1-k)
  std::vector<std::uint32_t> cached_, empty_;
  std::vector<Entry> heap_;
  std::uint32_t evictable_ = 0;
  std::uint32_t n_;
  std::uint64_t clock_ = 0;           // frees of cached blocks so far
  std::uint64_t requests_freed_ = 0;  // free() calls so far (one per request)
  Eviction rule_;                     // kBelady, kBeladyNoisy, kReuseOracle or kReuseOracleMru
  double sigma_;                      // kBeladyNoisy: the log-normal noise's sigma
  const std::vector<std::uint64_t>& offsets_;  // the trace's: position -> request
};

// next[p]: the position of the next occurrence of ids[p]'s hash after p that could be a hit
// (block index below its request's cap, request not rejected), or kNever. One backward pass.
std::vector<std::uint64_t> next_uses(const BlockTrace& t, std::uint64_t usable) {
  std::vector<std::uint64_t> next(t.ids.size());
  std::vector<std::uint64_t> seen(t.distinct, kNever);
  for (std::size_t i = t.size(); i-- > 0;) {
    const std::uint64_t tokens = t.num_tokens[i];
    const bool rejected = cdiv(tokens, t.block_size) > usable;
    const std::uint64_t cap = tokens == 0 ? 0 : (tokens - 1) / t.block_size;
    for (std::uint64_t p = t.offsets[i + 1]; p-- > t.offsets[i];) {
      const std::uint32_t id = t.ids[p];
      next[p] = seen[id];
      if (!rejected && p - t.offsets[i] < cap) seen[id] = p;
    }
  }
  return next;
}

template <typename Pool>
void run(const BlockTrace& t, std::uint32_t n, Pool& pool, const std::vector<std::uint64_t>* next,
         ReplayResult& res) {
  const std::uint64_t usable = n - 1;
  const std::uint64_t bs = t.block_size;
  std::vector<std::uint32_t> table, reversed;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::uint64_t tokens = t.num_tokens[i];
    const std::uint64_t need = cdiv(tokens, bs);
    ++res.requests;
    res.prompt_tokens += tokens;
    res.prompt_blocks += need;
    if (need > usable) {
      ++res.rejected;
      continue;
    }
    const std::uint64_t base = t.offsets[i];
    const std::uint64_t full = t.offsets[i + 1] - base;
    const std::uint64_t cap = tokens == 0 ? 0 : std::min<std::uint64_t>((tokens - 1) / bs, full);
    table.clear();
    while (table.size() < cap) {
      const std::uint32_t b = pool.lookup(t.ids[base + table.size()]);
      if (b == kNone) break;
      table.push_back(b);
    }
    const std::uint64_t hit = table.size();
    for (const std::uint32_t b : table) pool.touch(b);
    for (std::uint64_t j = hit; j < need; ++j) {
      std::uint32_t b = 0;
      if (pool.pop(b)) ++res.evicted_blocks;
      table.push_back(b);
    }
    res.peak_usage = std::max(res.peak_usage, 1.0 - double(pool.num_free()) / double(usable));
    for (std::uint64_t j = 0; j < full; ++j) {
      if constexpr (std::is_same_v<Pool, BeladyPool>) {
        pool.use(table[j], t.ids[base + j], (*next)[base + j], base + j);
      } else if (j >= hit) {
        pool.cache(table[j], t.ids[base + j]);
      }
    }
    reversed.assign(table.rbegin(), table.rend());
    pool.free(reversed);
    res.queried_tokens += tokens;
    res.hit_tokens += hit * bs;
    res.prefill_tokens_computed += tokens - hit * bs;
  }
}

}  // namespace

void BlockTrace::add(std::uint64_t tokens, const std::vector<std::uint32_t>& block_ids) {
  if (block_size == 0 || block_ids.size() != tokens / block_size) {
    throw Error(ErrorCode::kInvalidArgument,
                "BlockTrace::add: " + std::to_string(block_ids.size()) + " ids for " +
                    std::to_string(tokens) + " tokens of block size " + std::to_string(block_size));
  }
  for (const std::uint32_t id : block_ids) {
    if (id >= distinct) throw Error(ErrorCode::kInvalidArgument, "BlockTrace::add: id >= distinct");
  }
  if (offsets.empty()) offsets.push_back(0);
  num_tokens.push_back(tokens);
  ids.insert(ids.end(), block_ids.begin(), block_ids.end());
  offsets.push_back(ids.size());
}

BlockTrace block_trace(const Trace& trace, const ReplayOptions& options) {
  const KVCacheManager m(manager_config(options, 2));
  BlockTrace t;
  t.block_size = options.block_size;
  t.offsets.push_back(0);
  std::unordered_map<BlockHash, std::uint32_t> dense;
  std::vector<TokenId> tokens;
  for (std::size_t i = 0; i < trace.requests.size(); ++i) {
    synthesize_prompt(trace, i, tokens);
    RequestHashKeys keys;
    keys.cache_salt = trace.requests[i].cache_salt;
    const Request r = m.make_request(i, tokens, std::move(keys));
    for (const BlockHash& h : r.block_hashes()) {
      const auto [it, inserted] = dense.try_emplace(h, static_cast<std::uint32_t>(dense.size()));
      t.ids.push_back(it->second);
    }
    t.num_tokens.push_back(r.num_tokens());
    t.offsets.push_back(t.ids.size());
  }
  t.distinct = static_cast<std::uint32_t>(dense.size());
  return t;
}

ReplayResult simulate(const BlockTrace& t, std::int32_t num_blocks, Eviction eviction,
                      double noise_sigma) {
  if (num_blocks < 2) {
    throw Error(ErrorCode::kInvalidArgument,
                "--num-blocks " + std::to_string(num_blocks) + ": at least 2 (null block + 1)");
  }
  if (!(noise_sigma >= 0.0 && noise_sigma <= kMaxBeladyNoise)) {
    throw Error(ErrorCode::kInvalidArgument, "simulate: noise sigma " +
                                                 std::to_string(noise_sigma) + " outside 0.." +
                                                 std::to_string(kMaxBeladyNoise));
  }
  if (t.offsets.size() != t.size() + 1 || t.block_size == 0) {
    throw Error(ErrorCode::kInvalidArgument, "simulate: inconsistent BlockTrace");
  }
  ReplayResult res;
  res.num_blocks = num_blocks;
  const auto n = static_cast<std::uint32_t>(num_blocks);
  const auto t0 = Clock::now();
  const double c0 = thread_cpu_seconds();
  if (eviction == Eviction::kLru) {
    LruPool pool(n, t.distinct);
    run(t, n, pool, nullptr, res);
  } else {
    const std::vector<std::uint64_t> next = next_uses(t, n - 1);
    BeladyPool pool(n, t.distinct, eviction, noise_sigma, t.offsets);
    run(t, n, pool, &next, res);
  }
  res.pool_cpu_seconds = thread_cpu_seconds() - c0;
  res.pool_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return res;
}

std::vector<ReplayResult> run_eviction_replay(const Trace& trace, const ReplayOptions& options) {
  if (options.mode != Mode::kSequential || !options.caching || options.sliding_window != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string("--eviction ") + to_string(options.eviction) +
                    ": sequential mode, caching on, one full-attention group");
  }
  const auto t0 = Clock::now();
  const double c0 = thread_cpu_seconds();
  const BlockTrace bt = block_trace(trace, options);
  const double hash_cpu = thread_cpu_seconds() - c0;
  const double hash_wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<ReplayResult> out;
  for (const std::int32_t n : options.num_blocks) {
    ReplayResult r = simulate(bt, n, options.eviction, options.belady_noise);
    const ReplayResult lru = simulate(bt, n, Eviction::kLru);
    r.sim_lru_hit_tokens = lru.hit_tokens;
    r.sim_lru_evicted_blocks = lru.evicted_blocks;
    r.hash_seconds = hash_wall;  // synthesis, hashing and the dense ids together
    r.hash_cpu_seconds = hash_cpu;
    r.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    out.push_back(r);
  }
  return out;
}

}  // namespace pagedkv::replay
