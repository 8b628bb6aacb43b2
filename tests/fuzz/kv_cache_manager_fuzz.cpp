// Fuzz harness: bytes -> a stream of KVCacheManager operations, valid and invalid.
//
// The harness keeps its own shadow of what the engine knows (each request's tokens, salt, whether
// the manager holds blocks for it, whether it was freed, which request position each physical
// block was allocated for) and from it predicts, before every call, whether the call is valid.
// Properties checked after every operation:
//  - the library never crashes (sanitizers catch memory errors) and throws nothing but
//    pagedkv::Error;
//  - a call predicted valid completes (a valid call that throws is a crash), and a call predicted
//    invalid throws pagedkv::Error (an invalid call that is accepted is a crash); calls whose
//    validity the shadow cannot decide (a stale, foreign or corrupted hit; freeing or preempting
//    a request that holds no blocks, which vLLM treats as harmless) may do either;
//  - a call that throws, and an allocate_slots that returns std::nullopt, leave everything
//    observable exactly as it was: the manager's snapshot, its stats, its counters and every
//    request's state;
//  - check_invariants() holds;
//  - retention (issue 38): the pin budget is never exceeded, and every block a request holds is
//    at least at the lower of the default priority and what the request asked for it when it
//    took the block (its config then, token by token: a request without one asks the default),
//    so a block shared by a request of a higher priority is never below that request's ask;
//  - hit safety: every block of a hit returned by get_computed_blocks (or accepted by
//    allocate_slots) was allocated for the same position of a request with the same salt and the
//    same tokens up to the end of that block. This is what verification promises, so it is
//    checked in every configuration except a weak hash with verification off (where wrong hits
//    are the expected failure mode), and for hits accepted by allocate_slots only with a full
//    digest (allocate_slots compares hashes, so a deliberately weakened hash can pass it a foreign
//    block; get_computed_blocks never returns one). A request that accepted such a foreign hit
//    computes its later blocks on the foreign blocks' KV, and the pool labels them with that
//    prefix (as it should: it is what their KV holds); their content is then not checked, only
//    their position (Owner::tainted).
//
// Built two ways: with clang's -fsanitize=fuzzer (PAGEDKV_LIBFUZZER defined) as a libFuzzer
// target, and as a plain program (any compiler) that replays files and directories given on the
// command line, or `--random N` seeded random inputs; ctest runs the latter on tests/fuzz/corpus.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "fuzz_replay_main.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"

namespace {

using namespace pagedkv;

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// The configuration of the input being run, printed with a failure.
std::string g_config;

[[noreturn]] void fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "kv_cache_manager_fuzz: %s %s\n  configuration: %s\n", what, detail.c_str(),
               g_config.c_str());
  std::abort();
}

// What the shadow predicts for a call.
enum class Expect { kValid, kInvalid, kEither };

// One request as the engine knows it. Tracked requests live until the input ends (blocks refer
// to them as their owners), so their addresses are stable.
struct Tracked {
  std::unique_ptr<Request> req;
  std::optional<std::string> salt;
  bool held = false;      // the manager holds blocks for it (an allocation succeeded since)
  bool finished = false;  // freed
  // It holds a hit the shadow cannot vouch for (stale, foreign or corrupted, accepted under a
  // weakened hash): its KV was computed on another prefix's blocks. Until it releases them.
  bool tainted = false;
  // Per group and position: the lowest priority the block there may have while held (the lower
  // of the default and the request's ask when it took the block).
  std::vector<std::vector<int>> floors;
};

// The priority request r asks for its block [begin, end): the highest of its tokens' (a token
// range's, the default for prompt tokens no range names, the decode priority past the prompt).
// Written token by token, independently of retention_ask().
int asked_priority(const Request& r, std::size_t begin, std::size_t end) {
  if (!r.retention()) return kDefaultRetentionPriority;
  const RetentionConfig& c = *r.retention();
  int p = 0;
  for (std::size_t t = begin; t < end; ++t) {
    int tp = kDefaultRetentionPriority;
    if (t >= r.num_prompt_tokens()) {
      tp = c.decode_retention_priority;
    } else {
      for (const TokenRangeRetention& range : c.token_ranges) {
        if (t >= range.token_start && t < range.token_end.value_or(r.num_prompt_tokens())) {
          tp = range.priority;
        }
      }
    }
    p = std::max(p, tp);
  }
  return p;
}

// The request position a physical block was last allocated for: its KV holds that request's
// tokens [0, (index + 1) * group block size) once cached.
// A block allocated while its request was tainted (or before, if still held then) holds KV
// computed on a foreign prefix: the pool labels it with the prefix it was computed on (the
// cached blocks before it in the row), which the shadow does not model, so only its position is
// checked.
struct Owner {
  const Tracked* t = nullptr;
  std::size_t group = 0;
  std::size_t index = 0;
  bool tainted = false;
};

// Everything observable about one request.
struct RequestState {
  RequestId id;
  std::vector<TokenId> tokens;
  std::vector<BlockHash> hashes;
  std::size_t num_computed;
  bool finished;
  std::optional<RetentionConfig> retention;
  bool operator==(const RequestState&) const = default;
};

// Everything observable: the manager's snapshot and the figures it reports outside it, and the
// state of every request an operation can reach.
struct World {
  KVCacheManagerSnapshot manager;
  std::uint64_t requests, queries, hits, evictions, out_of_window_freed;
  std::size_t num_requests;
  std::vector<RequestState> requests_state;
  bool operator==(const World&) const = default;
};

class Harness {
 public:
  Harness(const KVCacheManagerConfig& cfg, bool weak_hash)
      : m_(with_clock(cfg)),
        owners_(static_cast<std::size_t>(cfg.num_blocks)),
        check_hit_content_(!weak_hash || cfg.verify_cache_hits),
        check_accepted_hits_(!weak_hash) {}

  KVCacheManager& manager() { return m_; }

  World world() const {
    World w;
    w.manager = m_.snapshot();
    const PrefixCacheStats st = m_.stats();
    w.requests = st.requests;
    w.queries = st.queries;
    w.hits = st.hits;
    w.evictions = st.evictions;
    w.out_of_window_freed = m_.num_out_of_window_blocks_freed();
    w.num_requests = m_.num_requests();
    // The requests an operation can reach (dropped ones are never passed to a call again).
    for (const Tracked* t : active_) {
      const Request& r = *t->req;
      w.requests_state.push_back(
          RequestState{r.id(), std::vector<TokenId>(r.tokens().begin(), r.tokens().end()),
                       std::vector<BlockHash>(r.block_hashes().begin(), r.block_hashes().end()),
                       r.num_computed_tokens(), r.is_finished(), r.retention()});
    }
    return w;
  }

  // Runs `op` with the predicted outcome; returns whether it completed. A throwing call must
  // change nothing observable. Invariants must hold either way.
  template <typename Op>
  bool step(const char* name, Expect expect, Op op) {
    const World before = world();
    bool completed = false;
    try {
      op();
      completed = true;
    } catch (const Error& e) {
      if (expect == Expect::kValid)
        fail("a valid call threw:", std::string(name) + ": " + e.what());
      if (!(world() == before))
        fail("state changed by a rejected call:", name + (": " + std::string(e.what())));
    } catch (const std::exception& e) {
      fail("threw something other than pagedkv::Error:", std::string(name) + ": " + e.what());
    }
    if (completed && expect == Expect::kInvalid) fail("an invalid call was accepted:", name);
    try {
      m_.check_invariants();
    } catch (const Error& e) {
      fail("invariant broken:", std::string(name) + ": " + e.what());
    }
    return completed;
  }

  // Hit safety (see the file comment) and the hit's shape.
  void check_hit(const Tracked& t, const CacheHit& hit, bool check_content) const {
    const Request& r = *t.req;
    if (hit.other_groups.size() + 1 != m_.num_groups()) fail("hit: wrong group count");
    if (hit.num_tokens > 0 && hit.num_tokens >= r.num_tokens()) {
      fail("hit: covers the last token:",
           std::to_string(hit.num_tokens) + " of " + std::to_string(r.num_tokens()));
    }
    for (std::size_t g = 0; g < m_.num_groups(); ++g) {
      const AttentionSpec& spec = m_.group_spec(g);
      const std::vector<BlockId>& blocks = hit.group(g);
      if (blocks.size() * spec.block_size != hit.num_tokens) fail("hit: group length differs");
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        const BlockId b = blocks[i];
        if (b == kNullBlockId) {
          if (spec.kind != AttentionKind::kSlidingWindow) fail("hit: null block in full attention");
          continue;
        }
        if (b < 0 || b >= m_.block_pool().num_blocks()) fail("hit: block id out of range");
        if (!check_content) continue;
        const Owner& o = owners_[static_cast<std::size_t>(b)];
        const std::size_t end = (i + 1) * spec.block_size;
        const std::string where = "request " + std::to_string(r.id()) + " group " +
                                  std::to_string(g) + " block " + std::to_string(i) + " -> " +
                                  std::to_string(b);
        if (o.t == nullptr) fail("hit on a block never allocated:", where);
        if (o.group != g || o.index != i) {
          fail("hit on a block of another position:",
               where + " (allocated for request " + std::to_string(o.t->req->id()) + " group " +
                   std::to_string(o.group) + " block " + std::to_string(o.index) + ")");
        }
        if (o.tainted) continue;
        const auto mine = r.tokens();
        const auto theirs = o.t->req->tokens();
        if (o.t->salt != t.salt || theirs.size() < end ||
            !std::equal(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(end),
                        theirs.begin())) {
          fail("WRONG HIT: the block holds other tokens or another salt:",
               where + " (owner request " + std::to_string(o.t->req->id()) + ")");
        }
      }
    }
  }

  void run(Reader& in);

  // The retention properties of the file comment.
  void check_retention() const {
    const RetentionStats s = m_.retention_stats();
    if (s.retained_blocks > s.retained_budget) {
      fail("pin budget exceeded:", std::to_string(s.retained_blocks) +
                                       " blocks above the default, " +
                                       std::to_string(s.retained_budget) + " allowed");
    }
    for (const Tracked* t : active_) {
      if (!t->held) continue;
      for (std::size_t g = 0; g < t->floors.size(); ++g) {
        const auto row = m_.block_ids(t->req->id(), g);
        for (std::size_t i = 0; i < t->floors[g].size() && i < row.size(); ++i) {
          if (row[i] == kNullBlockId) continue;
          const int p = m_.block_retention(row[i]).priority;
          if (p < t->floors[g][i]) {
            fail("a held block is below its request's ask:",
                 "request " + std::to_string(t->req->id()) + " group " + std::to_string(g) +
                     " block " + std::to_string(i) + " -> " + std::to_string(row[i]) +
                     " at priority " + std::to_string(p) + ", asked at least " +
                     std::to_string(t->floors[g][i]));
          }
        }
      }
    }
  }

 private:
  Tracked* pick(Reader& in) {
    return active_.empty() ? nullptr : active_[in.u8() % active_.size()];
  }
  void make(Reader& in);
  void allocate(Reader& in);
  void retain(Reader& in);
  void release(Tracked& t, bool finish);

  // The manager's retention clock: retain() advances it.
  KVCacheManagerConfig with_clock(KVCacheManagerConfig c) {
    c.retention_clock = [this] { return tick_; };
    return c;
  }

  RetentionTick tick_ = 0;  // before m_, whose retention_clock reads it
  KVCacheManager m_;
  std::vector<Owner> owners_;
  const bool check_hit_content_;
  const bool check_accepted_hits_;
  std::vector<std::unique_ptr<Tracked>> all_;
  std::vector<Tracked*> active_;  // the requests operations pick from (at most 12)
  RequestId next_id_ = 1;         // ids are never reused
  // The last get_computed_blocks result, whose request, and the pool generation it was taken in
  // (bumped by every call that may change which blocks are cached).
  std::optional<CacheHit> last_hit_;
  const Tracked* last_hit_owner_ = nullptr;
  std::uint64_t last_hit_gen_ = 0;
  std::uint64_t gen_ = 0;
};

// Request::set_retention with a random config, valid or not (predicted here independently of
// RetentionConfig::validate), sometimes advancing the retention clock first.
void Harness::retain(Reader& in) {
  tick_ += in.u8() % 8;
  Tracked* t = pick(in);
  if (!t) return;
  const std::size_t prompt = t->req->num_prompt_tokens();
  std::optional<RetentionConfig> config;
  bool valid = true;
  const std::uint8_t shape = in.u8();
  if (shape % 5 != 0) {
    config.emplace();
    std::size_t previous_end = 0;
    const std::size_t n = shape % 4;
    for (std::size_t k = 0; k < n; ++k) {
      TokenRangeRetention r;
      r.token_start = in.u8() % 50;
      const std::uint8_t e = in.u8();
      if (e % 4 != 0) r.token_end = r.token_start + e % 20;        // e % 20 == 0: empty
      r.priority = static_cast<RetentionPriority>(in.u8() % 104);  // 101..103: invalid
      const std::uint8_t d = in.u8() % 8;
      if (d != 0) r.duration = static_cast<RetentionTick>(d) - 2;  // -1, 0: invalid
      const std::size_t end = r.token_end.value_or(prompt);
      valid = valid && r.priority <= 100 && (!r.duration || *r.duration > 0) && end <= prompt &&
              r.token_start < end && (k == 0 || r.token_start >= previous_end);
      previous_end = end;
      config->token_ranges.push_back(r);
    }
    config->decode_retention_priority = static_cast<RetentionPriority>(in.u8() % 102);
    const std::uint8_t d = in.u8() % 6;
    if (d != 0) config->decode_duration = static_cast<RetentionTick>(d) - 1;  // 0: invalid
    valid = valid && config->decode_retention_priority <= 100 &&
            (!config->decode_duration || *config->decode_duration > 0);
  }
  step("set_retention", valid ? Expect::kValid : Expect::kInvalid,
       [&] { t->req->set_retention(config); });
}

void Harness::make(Reader& in) {
  std::vector<TokenId> tokens(in.u8() % 48);
  bool valid = true;
  for (auto& t : tokens) {
    t = static_cast<TokenId>(in.u8() % 5) - (in.u8() == 255 ? 9 : 0);  // negative: invalid
    valid = valid && t >= 0;
  }
  RequestHashKeys keys;
  const std::uint8_t s = in.u8() % 4;
  if (s == 1) keys.cache_salt = "a";
  if (s == 2) keys.cache_salt = "b";
  if (s == 3) keys.cache_salt = "";  // invalid
  valid = valid && s != 3;
  auto t = std::make_unique<Tracked>();
  t->salt = keys.cache_salt;
  const RequestId id = next_id_++;
  if (!step("make_request", valid ? Expect::kValid : Expect::kInvalid,
            [&] { t->req = std::make_unique<Request>(m_.make_request(id, tokens, keys)); })) {
    return;
  }
  if (active_.size() >= 12) {  // the engine drops its oldest request, freeing it first
    Tracked& old = *active_.front();
    if (old.held) release(old, /*finish=*/true);
    active_.erase(active_.begin());
  }
  all_.push_back(std::move(t));
  active_.push_back(all_.back().get());
}

// free() or preempt(): valid when the manager holds the request's blocks; an error once freed;
// either way (a no-op or an error) for a request holding no blocks.
void Harness::release(Tracked& t, bool finish) {
  Request& r = *t.req;
  const Expect expect = t.finished ? Expect::kInvalid : t.held ? Expect::kValid : Expect::kEither;
  const bool done = step(finish ? "free" : "preempt", expect, [&] {
    if (finish) {
      m_.free(r);
    } else {
      m_.preempt(r);
    }
  });
  if (!done) return;
  if (t.held) ++gen_;
  t.held = false;
  t.floors.clear();
  t.tainted = false;  // its next allocation starts from its own tokens
  if (finish && expect == Expect::kValid && !r.is_finished()) fail("free: request not finished");
  if (!finish && expect == Expect::kValid && r.num_computed_tokens() != 0) {
    fail("preempt: num_computed_tokens not reset");
  }
  t.finished = r.is_finished();
}

void Harness::allocate(Reader& in) {
  Tracked* t = pick(in);
  if (!t) return;
  Request& r = *t->req;
  const std::size_t n = in.u8() % 24;
  const std::size_t lookahead = in.u8() % 4;
  CacheHit hit;
  const std::uint8_t mode = in.u8() % 4;
  bool fresh = false, corrupted = false;
  if (mode == 1 && last_hit_) {
    hit = *last_hit_;
    fresh = last_hit_owner_ == t && last_hit_gen_ == gen_;
  }
  if (mode == 2 && last_hit_ && !last_hit_->blocks.empty()) {
    hit = *last_hit_;
    hit.blocks[in.u8() % hit.blocks.size()] = static_cast<BlockId>(in.u8() % 48) - 2;
    corrupted = true;
  }
  bool has_hit = hit.num_tokens > 0 || !hit.blocks.empty();
  for (const auto& g : hit.other_groups) has_hit = has_hit || !g.empty();
  const std::size_t computed = r.num_computed_tokens();
  Expect expect;
  if (t->finished || n == 0) {
    expect = Expect::kInvalid;
  } else if (!has_hit) {
    expect = computed + n <= r.num_tokens() ? Expect::kValid : Expect::kInvalid;
  } else if (fresh && !corrupted) {
    expect = !t->held && computed == 0 && hit.num_tokens + n <= r.num_tokens() ? Expect::kValid
                                                                               : Expect::kInvalid;
  } else {
    expect = Expect::kEither;  // a stale, foreign or corrupted hit
  }
  // Each group's table length before the call: new blocks are appended after it and the hit.
  std::vector<std::size_t> before(m_.num_groups(), 0);
  if (t->held) {
    for (std::size_t g = 0; g < m_.num_groups(); ++g) before[g] = m_.block_ids(r.id(), g).size();
  }
  const World world_before = world();
  bool fitted = false;
  const bool done = step("allocate_slots", expect, [&] {
    const std::size_t computed_after = computed + hit.num_tokens + n;
    if (m_.allocate_slots(r, n, hit, lookahead)) {
      fitted = true;
      r.set_num_computed_tokens(computed_after);  // the engine ran the model on them
    }
  });
  if (!done) return;
  if (!fitted) {
    if (!(world() == world_before)) fail("allocate_slots returned nullopt but changed state");
    return;
  }
  ++gen_;
  if (has_hit && (check_accepted_hits_ || expect == Expect::kValid)) {
    check_hit(*t, hit, check_hit_content_);
  }
  t->held = true;
  if (has_hit && expect != Expect::kValid && !check_accepted_hits_) {
    // An unverifiable hit was accepted (allocate_slots compares the weakened hashes only): what
    // this request computes from now on rests on those blocks' KV.
    t->tainted = true;
    for (Owner& o : owners_) o.tainted = o.tainted || o.t == t;
  }
  t->floors.resize(m_.num_groups());
  for (std::size_t g = 0; g < m_.num_groups(); ++g) {
    const auto row = m_.block_ids(r.id(), g);
    const std::size_t bs = m_.group_spec(g).block_size;
    std::vector<int>& floors = t->floors[g];
    floors.resize(row.size(), 0);
    for (std::size_t i = before[g]; i < row.size(); ++i) {
      floors[i] = std::min<int>(kDefaultRetentionPriority, asked_priority(r, i * bs, (i + 1) * bs));
    }
    // A default CacheHit{} has no other_groups: no hit in any group.
    const std::size_t hit_blocks = g == 0                         ? hit.blocks.size()
                                   : g <= hit.other_groups.size() ? hit.group(g).size()
                                                                  : 0;
    for (std::size_t i = before[g] + hit_blocks; i < row.size(); ++i) {
      if (row[i] != kNullBlockId) {
        owners_[static_cast<std::size_t>(row[i])] = Owner{t, g, i, t->tainted};
      }
    }
  }
}

void Harness::run(Reader& in) {
  for (int ops = 0; !in.done() && ops < 4096; ++ops) {
    check_retention();
    switch (in.u8() % 12) {
      case 0:
        make(in);
        break;
      case 1:
        if (Tracked* t = pick(in)) {
          std::optional<CacheHit> hit;
          step("get_computed_blocks", t->finished ? Expect::kInvalid : Expect::kValid,
               [&] { hit = m_.get_computed_blocks(*t->req); });
          if (hit) {
            check_hit(*t, *hit, check_hit_content_);
            last_hit_ = std::move(hit);
            last_hit_owner_ = t;
            last_hit_gen_ = gen_;
          }
        }
        break;
      case 2:
      case 3:
        allocate(in);
        break;
      case 4:
        if (Tracked* t = pick(in)) release(*t, /*finish=*/true);
        break;
      case 5:
        if (Tracked* t = pick(in)) release(*t, /*finish=*/false);
        break;
      case 6:
        if (Tracked* t = pick(in)) {
          const TokenId tok = static_cast<TokenId>(in.u8() % 6) - 1;  // -1 is invalid
          step("append_token",
               tok < 0       ? Expect::kInvalid
               : t->finished ? Expect::kEither
                             : Expect::kValid,
               [&] { t->req->append_token(tok); });
        }
        break;
      case 7:
        if (Tracked* t = pick(in)) {
          const std::size_t n = in.u8() % 64;
          step("set_num_computed_tokens",
               n > t->req->num_tokens() ? Expect::kInvalid
               : t->finished            ? Expect::kEither
                                        : Expect::kValid,
               [&] { t->req->set_num_computed_tokens(n); });
        }
        break;
      case 8: {
        const bool idle =
            std::none_of(all_.begin(), all_.end(), [](const auto& t) { return t->held; });
        bool reset = false;
        step("reset_prefix_cache", Expect::kValid, [&] { reset = m_.reset_prefix_cache(); });
        if (idle && !reset) fail("reset_prefix_cache refused with no request holding blocks");
        if (reset) ++gen_;
        break;
      }
      case 9: {
        std::vector<BlockId> ids(in.u8() % 4);
        bool valid = true;
        for (auto& id : ids) {
          id = static_cast<BlockId>(in.u8() % 48) - 2;
          valid = valid && id >= 0 && id < m_.block_pool().num_blocks();
        }
        if (step("evict_blocks", valid ? Expect::kValid : Expect::kInvalid,
                 [&] { (void)m_.evict_blocks(ids); })) {
          ++gen_;
        }
        break;
      }
      case 10: {
        const RequestId id = in.u8() % 16;
        // Known while the manager holds its blocks; unknown when never made or freed; a request
        // made but holding no blocks may or may not be known.
        Expect expect = Expect::kInvalid;
        for (const auto& t : all_) {
          if (t->req->id() != id) continue;
          expect = t->held ? Expect::kValid : t->finished ? Expect::kInvalid : Expect::kEither;
        }
        step("block_ids", expect, [&] {
          (void)m_.block_ids(id);
          (void)m_.num_common_prefix_blocks(id);
        });
        (void)m_.take_events();
        break;
      }
      case 11:
        retain(in);
        break;
    }
  }
  check_retention();
}

void run_one(const std::uint8_t* data, std::size_t size) {
  Reader in(data, size);
  KVCacheManagerConfig cfg;
  cfg.num_blocks = 2 + in.u8() % 40;
  cfg.block_size = 1 + in.u8() % 8;
  const std::uint8_t flags = in.u8();
  cfg.enable_caching = (flags & 1) == 0;
  cfg.verify_cache_hits = (flags & 2) == 0;
  cfg.enable_kv_events = (flags & 4) != 0;
  cfg.hash_seed.emplace("fuzz");
  const bool weak = (flags & 8) != 0;
  // Full xxh3_128 (a guarded pool when every group is full attention) or sha256, unless weak.
  const bool xxh3 = !weak && cfg.verify_cache_hits && ((flags >> 5) & 1) != 0;
  if (weak) {
    cfg.hasher = BlockHasher::weak_for_testing(HashScheme::kXxh3_128, "fuzz", 1 + (flags >> 5));
  } else if (xxh3) {
    cfg.hash_scheme = HashScheme::kXxh3_128;
  }
  if (flags & 16) cfg.max_model_len = in.u8();
  const std::uint8_t layout = in.u8();  // single group, full + sliding window, or window only
  if (layout % 3 == 1) {
    cfg.groups = {
        AttentionSpec::full(cfg.block_size),
        AttentionSpec::sliding(cfg.block_size * (1 + layout / 3 % 2), 1 + layout / 8 % 24)};
  } else if (layout % 3 == 2) {
    cfg.groups = {AttentionSpec::sliding(cfg.block_size, 1 + layout / 8 % 24)};
  }
  g_config = "num_blocks " + std::to_string(cfg.num_blocks) + ", block_size " +
             std::to_string(cfg.block_size) + ", caching " + (cfg.enable_caching ? "on" : "off") +
             ", verify " + (cfg.verify_cache_hits ? "on" : "off") + ", hash " +
             (weak   ? "xxh3_128 weakened to " + std::to_string(1 + (flags >> 5)) + " bits"
              : xxh3 ? std::string("xxh3_128")
                     : std::string("sha256")) +
             ", max_model_len " + (cfg.max_model_len ? std::to_string(*cfg.max_model_len) : "-");
  for (const AttentionSpec& g : cfg.groups) {
    g_config += g.kind == AttentionKind::kSlidingWindow
                    ? ", sliding(" + std::to_string(g.block_size) + ", window " +
                          std::to_string(g.sliding_window) + ")"
                    : ", full(" + std::to_string(g.block_size) + ")";
  }
  // Retention: the pool's eviction policy and pin budget, and a clock the harness advances.
  const std::uint8_t retention = in.u8();
  cfg.eviction_policy = static_cast<EvictionPolicy>(retention % kNumEvictionPolicies);
  cfg.max_retained_fraction = 0.25 * (retention / kNumEvictionPolicies % 5);
  // The byte's rest (0..12): lineage's key depth (32, 0, 1, 2, 3, 5, 8) and whether it is learned.
  const int rest = retention / (kNumEvictionPolicies * 5);
  constexpr std::array<std::size_t, 7> kDepths = {kLineageKeyDepth, 0, 1, 2, 3, 5, 8};
  cfg.lineage_key_depth = kDepths[static_cast<std::size_t>(rest / 2)];
  cfg.lineage_adaptive_depth = rest % 2 == 1;
  g_config += ", eviction " + std::string(to_string(cfg.eviction_policy)) +
              ", max_retained_fraction " + std::to_string(cfg.max_retained_fraction) +
              ", lineage_key_depth " + std::to_string(cfg.lineage_key_depth) +
              (cfg.lineage_adaptive_depth ? " (adaptive)" : "");
  Harness h(cfg, weak);
  h.run(in);
}

}  // namespace

PAGEDKV_FUZZ_ENTRY_POINTS("kv_cache_manager_fuzz", run_one, 2048)
