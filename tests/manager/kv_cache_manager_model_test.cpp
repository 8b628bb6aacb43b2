// Model-based randomized test of KVCacheManager + BlockPool.
//
// Random operations (requests built from a few shared prefixes and salts; hits, chunked
// allocations, lookahead, decoded tokens, frees, preemptions, resets, explicit evictions) run
// against the library and against a deliberately naive reference model of vLLM's semantics
// (vectors and linear scans). After every operation the two must agree on every block's ref count
// and hash, on the free queue's order and on every hit and allocation, and check_invariants()
// must pass.
//
// A third run uses an 8-bit test hash that collides constantly and checks safety instead: every
// hit is a true prefix of the request (tracked by a shadow copy of each cached block's content).
//
// The reference covers caching off, max_model_len (lookahead capped), the exact KV event stream
// (every BlockStored / BlockRemoved / AllBlocksCleared, compared field by field), explicit
// evictions (which make parents leave the cache while children stay, then be cached again), and
// hybrid layouts (full attention + sliding windows, one block size): hybrid hits are compared
// for equality, group by group, with the reference's fixed point.
//
// Retention runs (issue 38) add random retention configs (token ranges at priorities below, at
// and above the default, with and without durations on a fake clock, generated-token
// priorities), a pin budget and each eviction policy. The reference then keeps its own model of
// every block's retention (the pool's rules: the highest ask wins, an equal one extends the
// expiry, the budget refuses raises, durations run out and hits renew them; and the manager's
// rule for shared blocks: a request without a config asks the default, which lifts a block
// below it; an ask below the default lowers only a block the request just allocated or one below
// the default already) and compares, after every operation, every block's retention and the
// retention statistics (per class blocks, hits and evictions; budget refusals, expirations,
// forced evictions). The pool's choice of victims is checked, not copied: uncached blocks first,
// then never a block of a higher priority while a lower one is free (and, under LRU, the oldest
// of the lowest priority); the pin budget is never exceeded; and every block a request holds is
// at least at the lower of its ask and the default.
//
// Flags (after the gtest ones): --pagedkv_ops=N operations per run (default 100000; retention
// runs 1/4 of it),
// --pagedkv_seconds=S a time budget for the whole program, split evenly among its runs (default:
// no limit). The budget never stops a run before the default's operations (kDefaultOps): a run
// is its seed's stream, so a budgeted run with more operations checks all that the default run
// checks, and more (CI's sanitizer stage runs this program only as the stress run, .ci/run).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "stress_flags.hpp"

namespace pagedkv {
namespace {

constexpr std::uint64_t kDefaultOps = 100000;
std::uint64_t g_ops = kDefaultOps;
double g_seconds = 0;  // 0: no limit; else the whole program's budget, split evenly by the runs
constexpr int kNumRuns = 16;  // run() calls of the TESTs below

// ---- the reference model: vLLM v1 semantics, written for clarity, not speed ----
// One pool shared by KV-cache groups of one block size (full attention and sliding windows):
// vectors and linear scans, events built as vLLM emits them.
struct RefModel {
  std::uint32_t bs;
  bool caching;
  bool events_on;
  std::optional<std::size_t> max_model_len;
  std::vector<AttentionSpec> groups;
  std::vector<int> ref;
  std::vector<BlockHash> hash;  // empty: not cached
  std::vector<GroupId> grp;     // the group a cached block is keyed by
  std::vector<BlockId> queue;   // head first
  std::vector<BlockId> map;     // cached blocks in insertion order
  std::vector<KVEvent> events;
  std::uint64_t next_seq = 0;
  struct Req {
    std::vector<std::vector<BlockId>> rows;  // per group
    std::vector<std::size_t> cached;         // per group
  };
  std::map<RequestId, Req> reqs;

  // ---- retention (ret_on): the model's own record of every block's retention ----
  struct Ret {
    int prio = kDefaultRetentionPriority;
    RetentionTick dur = kNoExpiry;  // kNoExpiry unless timed
    RetentionTick exp = kNoExpiry;  // kNoExpiry unless timed
    std::int64_t key = 0;           // a free cached block's place in its priority's queue
  };
  bool ret_on = false;
  bool active = false;  // the pool keeps retention state (non-LRU, or after a non-default ask)
  EvictionPolicy policy = EvictionPolicy::kLru;
  const RetentionTick* now = nullptr;
  std::vector<Ret> ret;
  std::int64_t back_key = 0, front_key = 0;
  RetentionStats rs;
  std::uint64_t lifts = 0;    // blocks lifted to the default by a default ask
  std::uint64_t lowered = 0;  // blocks asked below the default that took it
  std::uint64_t kept_up = 0;  // asks below the default left out (block at or above it)

  RefModel(int n, std::uint32_t block_size, bool enable_caching, bool with_events,
           std::optional<std::size_t> max_len, std::vector<AttentionSpec> specs)
      : bs(block_size),
        caching(enable_caching),
        events_on(with_events),
        max_model_len(max_len),
        groups(std::move(specs)),
        ref(n, 0),
        hash(n),
        grp(n, 0) {
    for (int i = 1; i < n; ++i) queue.push_back(i);
  }

  void emit(KVEvent::Data data) {
    if (events_on) events.push_back(KVEvent{next_seq++, std::move(data)});
  }
  void enable_retention(EvictionPolicy p, double fraction, const RetentionTick* clock) {
    ret_on = true;
    policy = p;
    now = clock;
    active = p != EvictionPolicy::kLru;
    ret.assign(ref.size(), Ret{});
    const std::int64_t usable = static_cast<std::int64_t>(ref.size()) - 1;
    rs.by_class[1].blocks = usable;
    rs.retained_budget =
        static_cast<std::int64_t>(std::floor(fraction * static_cast<double>(usable)));
  }
  static std::size_t cls(int p) {
    return p < kDefaultRetentionPriority ? 0 : p == kDefaultRetentionPriority ? 1 : 2;
  }
  bool expired(BlockId b) const { return ret[b].exp != kNoExpiry && *now >= ret[b].exp; }
  void set_ret(BlockId b, int p, RetentionTick d, RetentionTick e) {
    Ret& k = ret[b];
    --rs.by_class[cls(k.prio)].blocks;
    ++rs.by_class[cls(p)].blocks;
    rs.retained_blocks += (p > kDefaultRetentionPriority) - (k.prio > kDefaultRetentionPriority);
    k.prio = p;
    k.dur = d;
    k.exp = e;
  }
  void reset_ret(BlockId b) { set_ret(b, kDefaultRetentionPriority, kNoExpiry, kNoExpiry); }
  void expire(BlockId b) {
    ++rs.expirations;
    reset_ret(b);
  }
  // A block that reached ref 0 while cached (or a free one whose priority changed).
  void queue_cached(BlockId b) {
    if (expired(b)) expire(b);
    ret[b].key = ++back_key;
  }
  BlockRetention effective(BlockId b) const {
    if (!active || expired(b)) return BlockRetention{};
    const Ret& k = ret[b];
    return BlockRetention{static_cast<RetentionPriority>(k.prio), k.dur, k.exp};
  }
  // A hit (touch) on cached block b.
  void hit_ret(BlockId b) {
    if (active) ++rs.by_class[cls(ret[b].prio)].hits;
    if (ret[b].exp != kNoExpiry) {
      if (expired(b)) {
        expire(b);
      } else {
        ret[b].exp = *now + ret[b].dur;
      }
    }
  }
  void evicted(BlockId b) {  // b's cached content goes
    ++rs.by_class[cls(ret[b].prio)].evictions;
    reset_ret(b);
  }
  // BlockPool::set_retention on one block (its documented rule, written out).
  void ask_pool(BlockId b, int p, RetentionTick d) {
    if (p == kDefaultRetentionPriority) return;
    const RetentionTick e = d == kNoExpiry ? kNoExpiry : *now + d;
    if (ref[b] == 0 && hash[b].empty()) return;
    Ret& k = ret[b];
    const bool lapsed = expired(b);
    const int cur = lapsed ? kDefaultRetentionPriority : k.prio;
    int np = cur;
    RetentionTick nd = lapsed ? kNoExpiry : k.dur, ne = lapsed ? kNoExpiry : k.exp;
    if (cur == kDefaultRetentionPriority || p > cur) {
      const std::int64_t others = rs.retained_blocks - (k.prio > kDefaultRetentionPriority ? 1 : 0);
      if (p > kDefaultRetentionPriority && cur <= kDefaultRetentionPriority &&
          others >= rs.retained_budget) {
        ++rs.budget_refusals;
      } else {
        np = p;
        nd = d;
        ne = e;
      }
    } else if (p == cur && ne != kNoExpiry) {
      nd = std::max(nd, d);
      ne = std::max(ne, e);
    }
    if (!lapsed && np == cur && nd == k.dur && ne == k.exp) return;
    if (lapsed) expire(b);
    set_ret(b, np, nd, ne);
    if (ref[b] == 0) queue_cached(b);
  }
  // BlockPool::raise_to_default on one block.
  void raise(BlockId b) {
    if (!active || rs.by_class[0].blocks == 0 || ret[b].prio >= kDefaultRetentionPriority) return;
    if (ref[b] == 0 && hash[b].empty()) return;
    ++lifts;
    if (expired(b)) {
      expire(b);
    } else {
      reset_ret(b);
    }
    if (ref[b] == 0) queue_cached(b);
  }
  // What request r asks for its block at position i (block size bs): the highest priority of
  // its tokens (a range's, the default for prompt tokens no range names, the decode priority
  // past the prompt), of those the longest duration (kNoExpiry: none). Token by token.
  static std::pair<int, RetentionTick> ask_of(const Request& r, std::size_t i, std::size_t bs) {
    const RetentionConfig& c = *r.retention();
    int p = -1;
    RetentionTick d = 0;
    for (std::size_t t = i * bs; t < (i + 1) * bs; ++t) {
      int tp = kDefaultRetentionPriority;
      RetentionTick td = kNoExpiry;
      if (t >= r.num_prompt_tokens()) {
        tp = c.decode_retention_priority;
        td = c.decode_duration.value_or(kNoExpiry);
      } else {
        for (const TokenRangeRetention& range : c.token_ranges) {
          if (t >= range.token_start && t < range.token_end.value_or(r.num_prompt_tokens())) {
            tp = range.priority;
            td = range.duration.value_or(kNoExpiry);
          }
        }
      }
      if (tp > p) {
        p = tp;
        d = td;
      } else if (tp == p) {
        d = std::max(d, td);
      }
    }
    return {p, d};
  }
  static bool raises(const Request& r) {
    if (!r.retention()) return false;
    bool any = r.retention()->decode_retention_priority != kDefaultRetentionPriority;
    for (const auto& range : r.retention()->token_ranges)
      any = any || range.priority != kDefaultRetentionPriority;
    return any;
  }
  // The manager's asks for request r's blocks at positions [from[g], end); positions from
  // fresh[g] on were allocated by this call (fresh empty: none, a release).
  void apply_asks(const Request& r, const std::vector<std::size_t>& from,
                  const std::vector<std::size_t>& fresh) {
    if (!ret_on) return;
    const Req& q = reqs.at(r.id());
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const std::size_t new_from = fresh.empty() ? q.rows[g].size() : fresh[g];
      for (std::size_t i = from[g]; i < q.rows[g].size(); ++i) {
        const BlockId b = q.rows[g][i];
        if (b == kNullBlockId) continue;
        if (!r.retention()) {  // a request without a config asks the default: its hits
          if (i < new_from) raise(b);
          continue;
        }
        const auto [p, d] = ask_of(r, i, bs);
        if (p > kDefaultRetentionPriority) {
          ask_pool(b, p, d);
          raise(b);  // refused by the budget: still at least the default
        } else if (p == kDefaultRetentionPriority) {
          raise(b);
        } else if (i >= new_from || effective(b).priority < kDefaultRetentionPriority) {
          ++lowered;
          ask_pool(b, p, d);
        } else {
          ++kept_up;
        }
      }
    }
  }
  // Before a release: a config's asks again (the release restarts durations).
  void release_asks(const Request& r) {
    if (!ret_on || !r.retention()) return;
    if (raises(r)) active = true;
    apply_asks(r, std::vector<std::size_t>(groups.size(), 0), {});
  }
  // Free blocks whose priority ran out: to the default's front (get_new_blocks' sweep).
  void sweep() {
    std::vector<BlockId> due;
    for (const BlockId b : queue) {
      if (!hash[b].empty() && expired(b)) due.push_back(b);
    }
    std::sort(due.begin(), due.end(), [&](BlockId x, BlockId y) {
      return std::pair(ret[x].prio, ret[x].key) < std::pair(ret[y].prio, ret[y].key);
    });
    for (const BlockId b : due) {
      expire(b);
      ret[b].key = --front_key;
    }
  }
  // Checks the pool's victims `v` (in its order) against the free blocks, then takes them.
  void take_victims(const std::vector<BlockId>& v) {
    sweep();
    std::vector<BlockId> free_cached;
    std::size_t uncached = 0;
    for (const BlockId b : queue) {
      if (hash[b].empty()) {
        ++uncached;
      } else {
        free_cached.push_back(b);
      }
    }
    std::sort(free_cached.begin(), free_cached.end(), [&](BlockId x, BlockId y) {
      return std::pair(ret[x].prio, ret[x].key) < std::pair(ret[y].prio, ret[y].key);
    });
    std::size_t taken_uncached = 0, c = 0;
    for (std::size_t k = 0; k < v.size(); ++k) {
      const BlockId b = v[k];
      ASSERT_NE(std::find(queue.begin(), queue.end(), b), queue.end())
          << "victim " << b << " was not free";
      if (hash[b].empty()) {
        ASSERT_EQ(c, 0u) << "uncached victim " << b << " after a cached one";
        ++taken_uncached;
        continue;
      }
      ASSERT_EQ(taken_uncached, uncached) << "cached victim " << b << " while uncached were free";
      ASSERT_LT(c, free_cached.size());
      ASSERT_EQ(ret[b].prio, ret[free_cached[c]].prio)
          << "victim " << b << " at priority " << ret[b].prio << " while block " << free_cached[c]
          << " at " << ret[free_cached[c]].prio << " was free";
      if (policy == EvictionPolicy::kLru) {
        ASSERT_EQ(b, free_cached[c]) << "not the oldest of the lowest priority";
      }
      ++c;
    }
    for (const BlockId b : v) {
      queue.erase(std::find(queue.begin(), queue.end(), b));
      if (!hash[b].empty()) {
        if (ret[b].prio > kDefaultRetentionPriority) ++rs.forced_evictions;
        ++rs.by_class[cls(ret[b].prio)].evictions;
        uncache(b);
      }
      reset_ret(b);
    }
  }

  void uncache(BlockId b) {
    map.erase(std::find(map.begin(), map.end(), b));
    emit(BlockRemoved{{hash[b]}, grp[b]});
    hash[b] = BlockHash();
    grp[b] = 0;
  }
  BlockId lookup(const BlockHash& h, GroupId g) const {
    for (const BlockId b : map) {
      if (hash[b] == h && grp[b] == g) return b;
    }
    return -1;
  }
  std::vector<BlockId> full_hit(const Request& r, GroupId g, std::size_t max_blocks) const {
    std::vector<BlockId> out;
    for (std::size_t i = 0; i < max_blocks; ++i) {
      const BlockId b = lookup(r.block_hashes()[i], g);
      if (b < 0) break;
      out.push_back(b);
    }
    return out;
  }
  // vLLM's SlidingWindowManager: from the right, the first run of window_blocks() cached blocks;
  // without one, the run that reaches block 0.
  std::vector<BlockId> window_hit(const Request& r, GroupId g, std::size_t max_blocks) const {
    const std::size_t needed = groups[g].window_blocks();
    std::vector<BlockId> out(max_blocks, kNullBlockId);
    std::size_t run = 0;
    for (std::size_t i = max_blocks; i-- > 0;) {
      const BlockId b = lookup(r.block_hashes()[i], g);
      if (b < 0) {
        run = 0;
        continue;
      }
      out[i] = b;
      if (++run >= needed) {
        out.resize(i + run);
        return out;
      }
    }
    out.resize(run);
    return out;
  }
  // The hybrid hit: each group shortens the length until none does.
  std::vector<std::vector<BlockId>> hit(const Request& r) const {
    std::vector<std::vector<BlockId>> rows(groups.size());
    if (!caching || r.skip_reading_prefix_cache) return rows;
    std::size_t blocks = r.num_tokens() == 0 ? 0 : (r.num_tokens() - 1) / bs;
    blocks = std::min(blocks, r.block_hashes().size());
    for (bool changed = true; changed;) {
      changed = false;
      for (std::size_t g = 0; g < groups.size(); ++g) {
        rows[g] = groups[g].kind == AttentionKind::kFull
                      ? full_hit(r, static_cast<GroupId>(g), blocks)
                      : window_hit(r, static_cast<GroupId>(g), blocks);
        if (rows[g].size() < blocks) {
          blocks = rows[g].size();
          changed = true;
        }
      }
    }
    for (auto& row : rows) row.resize(blocks);
    return rows;
  }
  // Blocks of a window group's row that left the window, last first, up to the first null.
  std::vector<std::size_t> out_of_window(std::size_t g, const std::vector<BlockId>& row,
                                         std::size_t computed) const {
    std::vector<std::size_t> pos;
    const AttentionSpec& spec = groups[g];
    if (spec.kind != AttentionKind::kSlidingWindow || computed + 1 <= spec.sliding_window) {
      return pos;
    }
    const std::size_t end =
        std::min<std::size_t>((computed + 1 - spec.sliding_window) / bs, row.size());
    for (std::size_t i = end; i-- > 0 && row[i] != kNullBlockId;) pos.push_back(i);
    return pos;
  }
  void release_list(const std::vector<BlockId>& blocks) {  // given tail first
    std::vector<BlockId> unhashed, hashed;
    for (const BlockId b : blocks) {
      if (b == kNullBlockId) continue;
      if (--ref[b] == 0) (hash[b].empty() ? unhashed : hashed).push_back(b);
    }
    if (ret_on) {
      for (const BlockId b : hashed) queue_cached(b);
      for (const BlockId b : unhashed) reset_ret(b);
    }
    queue.insert(queue.begin(), unhashed.begin(), unhashed.end());
    queue.insert(queue.end(), hashed.begin(), hashed.end());
  }
  // Returns group 0's new blocks, or nullopt when it does not fit (nothing changed).
  // With retention state, the pool's victims (each group's new blocks, `picks`) are checked
  // (take_victims) and taken instead of the queue's head.
  std::optional<std::vector<BlockId>> allocate(
      const Request& r, std::size_t n, const std::vector<std::vector<BlockId>>& hits,
      std::size_t lookahead, const std::vector<std::vector<BlockId>>* picks = nullptr) {
    const std::size_t ng = groups.size();
    const bool known = reqs.count(r.id()) != 0;
    Req cur = known ? reqs.at(r.id())
                    : Req{std::vector<std::vector<BlockId>>(ng), std::vector<std::size_t>(ng, 0)};
    const std::size_t hit_tokens = hits.empty() ? 0 : hits[0].size() * bs;
    const std::size_t computed = r.num_computed_tokens() + hit_tokens;
    std::size_t slots = computed + n + lookahead;
    if (max_model_len) slots = std::min(slots, std::max(*max_model_len, computed + n));
    const std::size_t need = (slots + bs - 1) / bs;
    std::size_t needed = 0, releasable = 0;
    std::vector<std::size_t> alloc(ng, 0);
    for (std::size_t g = 0; g < ng; ++g) {
      const std::size_t have = cur.rows[g].size() + (hits.empty() ? 0 : hits[g].size());
      alloc[g] = need > have ? need - have : 0;
      needed += alloc[g];
      if (!hits.empty()) {
        for (const BlockId b : hits[g]) needed += b != kNullBlockId && ref[b] == 0;
      }
      for (const std::size_t i : out_of_window(g, cur.rows[g], r.num_computed_tokens())) {
        releasable += ref[cur.rows[g][i]] == 1;
      }
    }
    if (needed > queue.size() + releasable) return std::nullopt;
    if (ret_on && raises(r)) active = true;  // the manager's prepare_retention
    Req& st = reqs[r.id()];
    st = cur;
    for (std::size_t g = 0; g < ng; ++g) {
      std::vector<BlockId> freed;
      for (const std::size_t i : out_of_window(g, st.rows[g], r.num_computed_tokens())) {
        freed.push_back(st.rows[g][i]);
        st.rows[g][i] = kNullBlockId;
      }
      release_list(freed);
    }
    if (!hits.empty()) {
      for (std::size_t g = 0; g < ng; ++g) {
        for (const BlockId b : hits[g]) {
          if (b != kNullBlockId) {
            if (ref[b] == 0) queue.erase(std::find(queue.begin(), queue.end(), b));
            ++ref[b];
            if (ret_on && !hash[b].empty()) hit_ret(b);
          }
          st.rows[g].push_back(b);
        }
        st.cached[g] = hits[g].size();
      }
    }
    std::vector<BlockId> fresh;
    for (std::size_t g = 0; g < ng; ++g) {
      if (ret_on && active && alloc[g] > 0) {
        const std::vector<BlockId>& v = (*picks)[g];
        EXPECT_EQ(v.size(), alloc[g]);
        take_victims(v);
        for (const BlockId b : v) {
          ref[b] = 1;
          st.rows[g].push_back(b);
          if (g == 0) fresh.push_back(b);
        }
        continue;
      }
      for (std::size_t i = 0; i < alloc[g]; ++i) {
        const BlockId b = queue.front();
        queue.erase(queue.begin());
        if (!hash[b].empty()) {
          if (ret_on) ++rs.by_class[cls(ret[b].prio)].evictions;
          uncache(b);
        }
        ref[b] = 1;
        st.rows[g].push_back(b);
        if (g == 0) fresh.push_back(b);
      }
    }
    if (caching) {
      const std::size_t full = std::min(computed + n, r.num_tokens()) / bs;
      for (std::size_t g = 0; g < ng; ++g) {
        std::size_t i = st.cached[g];
        while (i < full) {  // one BlockStored per run of consecutive non-null blocks
          if (st.rows[g][i] == kNullBlockId) {
            ++i;
            continue;
          }
          BlockStored stored;
          if (i > 0) stored.parent_block_hash = r.block_hashes()[i - 1];
          stored.block_size = bs;
          stored.group_id = static_cast<GroupId>(g);
          for (; i < full && st.rows[g][i] != kNullBlockId; ++i) {
            const BlockId b = st.rows[g][i];
            hash[b] = r.block_hashes()[i];
            grp[b] = static_cast<GroupId>(g);
            map.push_back(b);
            stored.block_hashes.push_back(hash[b]);
            for (std::size_t t = i * bs; t < (i + 1) * bs; ++t) {
              stored.token_ids.push_back(r.tokens()[t]);
            }
            OwnedExtraKeys keys;
            if (i == 0) keys.cache_salt = r.hashed_tokens().keys().cache_salt;
            stored.extra_keys.push_back(keys);
          }
          emit(std::move(stored));
        }
        st.cached[g] = std::max(st.cached[g], full);
      }
    }
    return fresh;
  }
  void release(RequestId id) {
    for (auto& row : reqs.at(id).rows) release_list({row.rbegin(), row.rend()});
    reqs.erase(id);
  }
  bool reset() {
    if (queue.size() != ref.size() - 1) return false;
    if (ret_on) {
      for (BlockId b = 1; b < static_cast<BlockId>(ref.size()); ++b) reset_ret(b);
    }
    for (auto& h : hash) h = BlockHash();
    for (auto& g : grp) g = 0;
    map.clear();
    emit(AllBlocksCleared{});
    return true;
  }
  void evict(const std::vector<BlockId>& ids) {
    for (const BlockId b : ids) {
      if (!hash[b].empty()) {
        if (ret_on) evicted(b);
        uncache(b);
      }
    }
  }
};

struct RunConfig {
  int num_blocks = 48;
  bool verify = true;
  bool weak_hash = false;  // 8-bit collisions: check safety, not equality with the model
  bool explicit_evict = false;
  bool caching = true;
  HashScheme scheme = HashScheme::kSha256;
  std::optional<std::size_t> max_model_len;
  std::vector<AttentionSpec> groups;  // empty: one full-attention group
  std::uint32_t seed = 1;
  // Retention: random configs on half the requests, a fake clock, this policy and pin budget.
  bool retention = false;
  EvictionPolicy policy = EvictionPolicy::kLru;
  double retained_fraction = 1.0;
};

struct Outcome {
  std::uint64_t ops = 0;
  std::uint64_t hit_blocks = 0;
  std::uint64_t failed_allocations = 0;
  std::uint64_t collisions_rejected = 0;
  std::uint64_t events = 0;
  std::uint64_t window_hit_blocks = 0;  // null blocks skipped by sliding-window hits
  RetentionStats retention;             // the last stats (retention runs)
  std::uint64_t lifts = 0, lowered = 0, kept_up = 0;
};

Outcome run(const RunConfig& rc) {
  constexpr std::uint32_t kB = 4;
  std::mt19937 rng(rc.seed);
  auto uniform = [&](std::size_t lo, std::size_t hi) {  // inclusive
    return lo + static_cast<std::size_t>(rng() % (hi - lo + 1));
  };

  KVCacheManagerConfig cfg;
  cfg.num_blocks = rc.num_blocks;
  cfg.block_size = kB;
  cfg.verify_cache_hits = rc.verify;
  cfg.enable_caching = rc.caching;
  cfg.enable_kv_events = !rc.weak_hash;
  cfg.hash_scheme = rc.scheme;
  cfg.max_model_len = rc.max_model_len;
  cfg.groups = rc.groups;
  cfg.hash_seed = "model";
  if (rc.weak_hash) cfg.hasher = BlockHasher::weak_for_testing(HashScheme::kSha256, "model", 8);
  RetentionTick now = 0;  // the fake retention clock (before m, which reads it)
  if (rc.retention) {
    cfg.eviction_policy = rc.policy;
    cfg.max_retained_fraction = rc.retained_fraction;
    cfg.retention_clock = [&now] { return now; };
  }
  KVCacheManager m(cfg);
  std::vector<AttentionSpec> specs = rc.groups;
  if (specs.empty()) specs.push_back(AttentionSpec::full(kB));
  for (const AttentionSpec& spec : specs) {
    if (spec.block_size != kB) throw std::logic_error("the model has one block size");
  }
  RefModel ref(rc.num_blocks, kB, rc.caching, cfg.enable_kv_events, rc.max_model_len, specs);
  if (rc.retention) ref.enable_retention(rc.policy, rc.retained_fraction, &now);
  const std::size_t num_groups = specs.size();
  // A random retention config for a prompt of n tokens (half the requests get none).
  const std::vector<int> kPriorities = {0, 10, 20, 35, 35, 60, 90, 100};
  auto random_priority = [&] {
    return static_cast<RetentionPriority>(kPriorities[uniform(0, kPriorities.size() - 1)]);
  };
  auto random_duration = [&]() -> std::optional<RetentionTick> {
    if (uniform(0, 2) != 0) return std::nullopt;
    return static_cast<RetentionTick>(uniform(1, 30));
  };
  auto random_retention = [&](std::size_t n) -> std::optional<RetentionConfig> {
    if (uniform(0, 1) == 0) return std::nullopt;
    RetentionConfig c;
    std::size_t at = 0;
    for (std::size_t k = uniform(0, 2); k > 0 && at < n; --k) {
      TokenRangeRetention t;
      t.token_start = uniform(at, n - 1);
      const std::size_t end = uniform(t.token_start + 1, n);
      if (end < n || uniform(0, 1) == 0) t.token_end = end;
      t.priority = random_priority();
      t.duration = random_duration();
      c.token_ranges.push_back(t);
      at = end;
    }
    if (uniform(0, 1) == 0) c.decode_retention_priority = random_priority();
    c.decode_duration = random_duration();
    return c;
  };

  // Shared prefixes (a system prompt, tool definitions, ...) and tenants.
  std::vector<std::vector<TokenId>> prefixes = {{}, {}, {}, {}};
  for (std::size_t p = 1; p < prefixes.size(); ++p) {
    prefixes[p].resize(uniform(3, 30));
    for (auto& t : prefixes[p]) t = static_cast<TokenId>(uniform(0, 5));
  }
  const std::vector<std::optional<std::string>> salts = {std::nullopt, "tenant-a", "tenant-b"};

  std::vector<Request> running;  // allocated at least once
  std::vector<Request> waiting;  // preempted, to be rescheduled
  RequestId next_id = 1;
  // Weak-hash safety: the prefix each cached block was computed for (salt, tokens).
  std::vector<std::vector<TokenId>> shadow(static_cast<std::size_t>(rc.num_blocks));
  std::vector<std::optional<std::string>> shadow_salt(static_cast<std::size_t>(rc.num_blocks));
  Outcome out;

  auto prefix_of = [&](const Request& r, std::size_t blocks) {
    return std::vector<TokenId>(r.tokens().begin(), r.tokens().begin() + blocks * kB);
  };
  auto compare_state = [&]() {
    m.check_invariants();
    if (rc.weak_hash) return;
    const BlockPool& pool = m.block_pool();
    for (BlockId b = 1; b < rc.num_blocks; ++b) {
      ASSERT_EQ(pool.block(b).ref_cnt, ref.ref[b]) << "block " << b;
      ASSERT_EQ(pool.block(b).block_hash, ref.hash[b]) << "block " << b;
      if (!ref.hash[b].empty()) {
        ASSERT_EQ(pool.block(b).group_id, ref.grp[b]) << "block " << b;
      }
    }
    ASSERT_EQ(pool.num_free_blocks(), static_cast<std::int32_t>(ref.queue.size()));
    for (const auto& [id, st] : ref.reqs) {
      for (std::size_t g = 0; g < num_groups; ++g) {
        const auto row = m.block_ids(id, g);
        ASSERT_EQ(std::vector<BlockId>(row.begin(), row.end()), st.rows[g]) << "request " << id;
      }
    }
    if (rc.retention) {
      EXPECT_EQ(pool.retention_active(), ref.active);
      for (BlockId b = 1; b < rc.num_blocks; ++b) {
        ASSERT_EQ(m.block_retention(b), ref.effective(b)) << "block " << b << " at tick " << now;
      }
      RetentionStats want = ref.rs;
      if (!ref.active) {  // an LRU pool without retention state counts no hits per class
        for (auto& c : want.by_class) c.hits = 0;
      }
      const RetentionStats got = m.retention_stats();
      ASSERT_EQ(got, want) << "retention stats at tick " << now;
      ASSERT_LE(got.retained_blocks, got.retained_budget);
      // Every block a request holds is at least at the lower of its ask and the default (the
      // rule for shared blocks; a budget refusal still leaves the default).
      for (const Request& r : running) {
        if (ref.reqs.count(r.id()) == 0) continue;
        for (std::size_t g = 0; g < num_groups; ++g) {
          const auto& row = ref.reqs.at(r.id()).rows[g];
          for (std::size_t i = 0; i < row.size(); ++i) {
            if (row[i] == kNullBlockId) continue;
            const int ask =
                r.retention() ? RefModel::ask_of(r, i, kB).first : kDefaultRetentionPriority;
            ASSERT_GE(int{m.block_retention(row[i]).priority},
                      std::min(ask, int{kDefaultRetentionPriority}))
                << "request " << r.id() << " block " << row[i] << " at position " << i;
          }
        }
      }
    } else {
      ASSERT_EQ(pool.free_queue().ids(), ref.queue);
    }
    // The exact event stream: every BlockStored (hashes, parent, tokens, extra keys, group),
    // BlockRemoved and AllBlocksCleared, with its sequence number.
    const std::vector<KVEvent> got = m.take_events();
    out.events += got.size();
    ASSERT_EQ(got, ref.events);
    ref.events.clear();
  };
  // Runs hit lookup + one allocation in both; returns whether it fit.
  auto schedule = [&](Request& r, bool first) -> bool {
    CacheHit hit;
    std::vector<std::vector<BlockId>> ref_hit;
    if (first) {
      hit = m.get_computed_blocks(r);
      if (rc.weak_hash) {
        const auto& hashes = r.block_hashes();
        if (hit.blocks.size() < hashes.size() &&
            m.block_pool().get_cached_block(hashes[hit.blocks.size()]) != BlockPool::kNoBlock) {
          ++out.collisions_rejected;  // the raw map had a candidate; verification refused it
        }
        for (std::size_t g = 0; g < num_groups; ++g) {  // window groups: null blocks skipped
          for (std::size_t i = 0; i < hit.group(g).size(); ++i) {
            if (hit.group(g)[i] == kNullBlockId) continue;
            const auto b = static_cast<std::size_t>(hit.group(g)[i]);
            EXPECT_EQ(shadow[b], prefix_of(r, i + 1)) << "WRONG HIT: group " << g << " block " << b;
            EXPECT_EQ(shadow_salt[b], r.hashed_tokens().keys().cache_salt) << "WRONG HIT (salt)";
          }
        }
      } else {
        ref_hit = ref.hit(r);
        for (std::size_t g = 0; g < num_groups; ++g) {
          EXPECT_EQ(hit.group(g), ref_hit[g]) << "group " << g;
        }
      }
      out.hit_blocks += hit.blocks.size();
      for (std::size_t g = 1; g < num_groups; ++g) {
        out.window_hit_blocks +=
            static_cast<std::uint64_t>(std::count(hit.group(g).begin(), hit.group(g).end(), 0));
      }
    }
    const std::size_t computed = r.num_computed_tokens() + hit.num_tokens;
    const std::size_t n = uniform(1, r.num_tokens() - computed);
    const std::size_t lookahead = uniform(0, 4) == 0 ? uniform(1, 5) : 0;
    std::vector<bool> was_cached(static_cast<std::size_t>(rc.num_blocks));
    for (BlockId b = 0; b < rc.num_blocks; ++b) {
      was_cached[static_cast<std::size_t>(b)] = m.block_pool().block(b).is_cached();
    }
    // Each group's table length before the call plus its hit: newer positions get new blocks.
    std::vector<std::size_t> first_new(num_groups, 0), old_size(num_groups, 0);
    for (std::size_t g = 0; g < num_groups && (rc.weak_hash || rc.retention); ++g) {
      const std::size_t hit_size = g <= hit.other_groups.size() ? hit.group(g).size() : 0;
      old_size[g] = first ? 0 : m.block_ids(r.id(), g).size();
      first_new[g] = old_size[g] + hit_size;
    }
    const auto got = m.allocate_slots(r, n, hit, lookahead);
    if (!rc.weak_hash) {
      std::vector<std::vector<BlockId>> picks(num_groups);  // the pool's victims, per group
      if (got && rc.retention) {
        for (std::size_t g = 0; g < num_groups; ++g) {
          const auto row = m.block_ids(r.id(), g);
          picks[g].assign(row.begin() + static_cast<std::ptrdiff_t>(first_new[g]), row.end());
        }
      }
      const auto want = ref.allocate(r, n, ref_hit, lookahead, &picks);
      EXPECT_EQ(got.has_value(), want.has_value());
      if (got && want) {
        EXPECT_EQ(std::vector<BlockId>(got->begin(), got->end()), *want);
        ref.apply_asks(r, old_size, first_new);
      }
    }
    if (!got) {
      ++out.failed_allocations;
      return false;
    }
    if (rc.weak_hash) {  // record what newly cached blocks hold, in every group
      for (std::size_t g = 0; g < num_groups; ++g) {
        const auto blocks = m.block_ids(r.id(), g);
        for (std::size_t i = 0; i < blocks.size(); ++i) {
          if (blocks[i] == kNullBlockId || !m.block_pool().block(blocks[i]).is_cached()) continue;
          const auto b = static_cast<std::size_t>(blocks[i]);
          if (!was_cached[b] || i >= first_new[g]) {
            shadow[b] = prefix_of(r, i + 1);
            shadow_salt[b] = r.hashed_tokens().keys().cache_salt;
          }
        }
      }
    }
    r.set_num_computed_tokens(computed + n);
    return true;
  };

  const auto start = std::chrono::steady_clock::now();
  const double run_seconds = g_seconds / kNumRuns;  // the budget is shared by all runs
  // Retention runs check every block's retention after each operation: 1/4 of the operations.
  const std::uint64_t num_ops = rc.retention ? g_ops / 4 : g_ops;
  // The budget stops a run only past the default's operations.
  const std::uint64_t min_ops = rc.retention ? kDefaultOps / 4 : kDefaultOps;
  for (std::uint64_t op = 0; op < num_ops; ++op) {
    if (g_seconds > 0 && op >= min_ops && (op & 1023) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
            run_seconds) {
      break;
    }
    if (rc.retention && uniform(0, 3) == 0) now += static_cast<RetentionTick>(uniform(0, 4));
    const std::size_t kind = uniform(0, 99);
    if (kind < 30 || running.empty()) {  // a new request (or a preempted one) arrives
      if (!waiting.empty() && uniform(0, 1) == 0) {
        Request r = std::move(waiting.back());
        waiting.pop_back();
        if (schedule(r, true)) running.push_back(std::move(r));
      } else {
        std::vector<TokenId> tokens = prefixes[uniform(0, prefixes.size() - 1)];
        const std::size_t extra = uniform(tokens.empty() ? 1 : 0, 24);
        for (std::size_t i = 0; i < extra; ++i)
          tokens.push_back(static_cast<TokenId>(uniform(0, 3)));
        RequestHashKeys keys;
        keys.cache_salt = salts[uniform(0, salts.size() - 1)];
        Request r = m.make_request(next_id++, tokens, keys);
        if (rc.retention) r.set_retention(random_retention(r.num_tokens()));
        if (schedule(r, true)) running.push_back(std::move(r));
      }
    } else {
      const std::size_t i = uniform(0, running.size() - 1);
      Request& r = running[i];
      if (kind < 55) {  // next prefill chunk, or a decode step
        if (r.num_computed_tokens() == r.num_tokens()) {
          r.append_token(static_cast<TokenId>(uniform(0, 3)));
        }
        schedule(r, false);
      } else if (kind < 80) {  // finished
        m.free(r);
        if (!rc.weak_hash) {
          ref.release_asks(r);
          ref.release(r.id());
        }
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (kind < 88) {  // preempted
        m.preempt(r);
        if (!rc.weak_hash) {
          ref.release_asks(r);
          ref.release(r.id());
        }
        waiting.push_back(std::move(r));
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
        if (waiting.size() > 8) waiting.erase(waiting.begin());
      } else if (kind < 94) {
        if (rc.explicit_evict) {
          std::vector<BlockId> ids;
          for (std::size_t k = uniform(1, 3); k > 0; --k) {
            ids.push_back(
                static_cast<BlockId>(uniform(1, static_cast<std::size_t>(rc.num_blocks) - 1)));
          }
          m.evict_blocks(ids);
          if (!rc.weak_hash) ref.evict(ids);
        }
      } else {  // reset attempt; succeeds only when idle
        const bool all_done = uniform(0, 3) == 0;
        if (all_done) {
          for (Request& q : running) {
            m.free(q);
            if (!rc.weak_hash) {
              ref.release_asks(q);
              ref.release(q.id());
            }
          }
          running.clear();
        }
        const bool reset = m.reset_prefix_cache();
        EXPECT_EQ(reset, rc.weak_hash ? running.empty() : ref.reset());
        if (reset) {
          for (auto& s : shadow) s.clear();
        }
      }
    }
    compare_state();
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "first divergence at operation " << op << " (seed " << rc.seed << ")";
      break;
    }
    ++out.ops;
  }
  out.retention = m.retention_stats();
  out.lifts = ref.lifts;
  out.lowered = ref.lowered;
  out.kept_up = ref.kept_up;
  return out;
}

TEST(KVCacheManagerModel, MatchesReferenceWithoutVerification) {
  RunConfig rc;
  rc.verify = false;
  rc.explicit_evict = true;
  rc.seed = 11;
  const Outcome o = run(rc);
  EXPECT_GT(o.hit_blocks, 0u);
  EXPECT_GT(o.failed_allocations, 0u);
  std::printf("no verification: %llu ops, %llu hit blocks, %llu failed allocations\n",
              static_cast<unsigned long long>(o.ops), static_cast<unsigned long long>(o.hit_blocks),
              static_cast<unsigned long long>(o.failed_allocations));
}

TEST(KVCacheManagerModel, MatchesReferenceWithVerification) {
  RunConfig rc;
  rc.verify = true;
  rc.seed = 12;
  const Outcome o = run(rc);
  EXPECT_GT(o.hit_blocks, 0u);
  std::printf("verification: %llu ops, %llu hit blocks\n", static_cast<unsigned long long>(o.ops),
              static_cast<unsigned long long>(o.hit_blocks));
}

TEST(KVCacheManagerModel, MatchesReferenceWithCachingOff) {
  RunConfig rc;
  rc.caching = false;
  rc.max_model_len = 30;
  rc.seed = 14;
  const Outcome o = run(rc);
  EXPECT_EQ(o.hit_blocks, 0u);  // (events: only AllBlocksCleared, compared with the reference)
  EXPECT_GT(o.failed_allocations, 0u);
}

TEST(KVCacheManagerModel, MatchesReferenceWithMaxModelLenAndXxh3) {
  RunConfig rc;
  rc.scheme = HashScheme::kXxh3_128;
  rc.max_model_len = 26;
  rc.explicit_evict = true;
  rc.seed = 15;
  const Outcome o = run(rc);
  EXPECT_GT(o.hit_blocks, 0u);
  EXPECT_GT(o.events, 0u);
  std::printf("xxh3 + max_model_len: %llu ops, %llu hit blocks, %llu events\n",
              static_cast<unsigned long long>(o.ops), static_cast<unsigned long long>(o.hit_blocks),
              static_cast<unsigned long long>(o.events));
}

TEST(KVCacheManagerModel, HybridMatchesReference) {
  RunConfig rc;
  rc.groups = {AttentionSpec::full(4), AttentionSpec::sliding(4, 7)};
  rc.num_blocks = 64;
  rc.explicit_evict = true;
  rc.seed = 16;
  const Outcome o = run(rc);
  EXPECT_GT(o.hit_blocks, 0u);
  EXPECT_GT(o.window_hit_blocks, 0u) << "no window hit skipped a block: the test is weak";
  std::printf("hybrid: %llu ops, %llu hit blocks, %llu null window blocks, %llu events\n",
              static_cast<unsigned long long>(o.ops), static_cast<unsigned long long>(o.hit_blocks),
              static_cast<unsigned long long>(o.window_hit_blocks),
              static_cast<unsigned long long>(o.events));
}

TEST(KVCacheManagerModel, HybridTwoWindowsXxh3MatchesReference) {
  RunConfig rc;
  rc.groups = {AttentionSpec::sliding(4, 5), AttentionSpec::full(4), AttentionSpec::sliding(4, 9)};
  rc.num_blocks = 80;
  rc.scheme = HashScheme::kXxh3_128;
  rc.explicit_evict = true;
  rc.max_model_len = 40;
  rc.seed = 17;
  const Outcome o = run(rc);
  EXPECT_GT(o.hit_blocks, 0u);
}

TEST(KVCacheManagerModel, WeakHashNeverGivesAWrongHit) {
  RunConfig rc;
  rc.weak_hash = true;
  rc.explicit_evict = true;
  rc.seed = 13;
  const Outcome o = run(rc);
  EXPECT_GT(o.hit_blocks, 0u);
  EXPECT_GT(o.collisions_rejected, 0u) << "the weak hash produced no collisions: test is vacuous";
  std::printf("8-bit hash: %llu ops, %llu verified hit blocks, %llu collisions rejected\n",
              static_cast<unsigned long long>(o.ops), static_cast<unsigned long long>(o.hit_blocks),
              static_cast<unsigned long long>(o.collisions_rejected));
}

// The same with sliding windows (one window group, and a hybrid model): every non-null block of
// every group's hit holds the request's own prefix, so a window run is anchored to it.
TEST(KVCacheManagerModel, WeakHashNeverGivesAWrongWindowHit) {
  for (const auto& groups : std::vector<std::vector<AttentionSpec>>{
           {AttentionSpec::sliding(4, 7)},
           {AttentionSpec::full(4), AttentionSpec::sliding(4, 5)}}) {
    RunConfig rc;
    rc.weak_hash = true;
    rc.explicit_evict = true;
    rc.seed = 17;
    rc.groups = groups;
    const Outcome o = run(rc);
    EXPECT_GT(o.hit_blocks, 0u);
    EXPECT_GT(o.window_hit_blocks + (groups.size() == 1 ? o.hit_blocks : 0), 0u);
    std::printf("8-bit hash, %zu group(s): %llu ops, %llu hit blocks, %llu null window blocks\n",
                groups.size(), static_cast<unsigned long long>(o.ops),
                static_cast<unsigned long long>(o.hit_blocks),
                static_cast<unsigned long long>(o.window_hit_blocks));
  }
}

// Retention (issue 38): random configs, durations on the fake clock, the pin budget and each
// eviction policy, against the reference's own retention model.
void expect_retention_exercised(const Outcome& o, bool budget_binds) {
  const RetentionStats& s = o.retention;
  EXPECT_GT(o.lifts, 0u) << "no shared block was lifted to the default: the test is weak";
  EXPECT_GT(o.lowered, 0u);
  EXPECT_GT(o.kept_up, 0u) << "no ask below the default met a default block";
  EXPECT_GT(s.expirations, 0u);
  EXPECT_GT(s.forced_evictions, 0u);
  EXPECT_GT(s.by_class[0].evictions + s.by_class[2].evictions, 0u);
  if (budget_binds) {
    EXPECT_GT(s.budget_refusals, 0u);
  }
  std::printf(
      "%llu ops: %llu hit blocks, %llu lifted, %llu lowered, %llu kept up, %llu refusals, %llu "
      "expirations, %llu forced evictions\n",
      static_cast<unsigned long long>(o.ops), static_cast<unsigned long long>(o.hit_blocks),
      static_cast<unsigned long long>(o.lifts), static_cast<unsigned long long>(o.lowered),
      static_cast<unsigned long long>(o.kept_up),
      static_cast<unsigned long long>(s.budget_refusals),
      static_cast<unsigned long long>(s.expirations),
      static_cast<unsigned long long>(s.forced_evictions));
}

class RetentionModel : public ::testing::TestWithParam<EvictionPolicy> {};

TEST_P(RetentionModel, MatchesReferenceWithRetention) {
  RunConfig rc;
  rc.retention = true;
  rc.policy = GetParam();
  rc.explicit_evict = true;
  rc.seed = 21 + static_cast<std::uint32_t>(GetParam());
  const Outcome o = run(rc);
  EXPECT_GT(o.hit_blocks, 0u);
  expect_retention_exercised(o, false);
}

TEST_P(RetentionModel, PinBudgetAndXxh3MatchReference) {
  RunConfig rc;
  rc.retention = true;
  rc.policy = GetParam();
  rc.retained_fraction = 0.15;
  rc.scheme = HashScheme::kXxh3_128;
  rc.max_model_len = 40;
  rc.seed = 31 + static_cast<std::uint32_t>(GetParam());
  const Outcome o = run(rc);
  expect_retention_exercised(o, true);
}

INSTANTIATE_TEST_SUITE_P(Policies, RetentionModel,
                         ::testing::Values(EvictionPolicy::kLru, EvictionPolicy::kSlru,
                                           EvictionPolicy::kLineage),
                         [](const auto& p) { return std::string(to_string(p.param)); });

TEST(KVCacheManagerModel, HybridWithRetentionMatchesReference) {
  RunConfig rc;
  rc.retention = true;
  rc.policy = EvictionPolicy::kS3Fifo;
  rc.retained_fraction = 0.3;
  rc.groups = {AttentionSpec::full(4), AttentionSpec::sliding(4, 7)};
  rc.num_blocks = 64;
  rc.explicit_evict = true;
  rc.seed = 41;
  const Outcome o = run(rc);
  expect_retention_exercised(o, true);
}

}  // namespace
}  // namespace pagedkv

int main(int argc, char** argv) {
  return pagedkv::testing_util::run_with_stress_flags(argc, argv, "ops", pagedkv::g_ops,
                                                      pagedkv::g_seconds);
}
