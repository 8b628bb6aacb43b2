// RemoteTier for hybrid models (a full-attention group beside a sliding-window group, one block
// size) over a DiskStore (always: temporary directories) and a RedisStore (a redis-server the test
// starts on 127.0.0.1; SKIPPED without one). Every block's "K/V" is a tag of (group, the exact
// token prefix) written by a fake forward pass (tests/tier/hybrid_episode.hpp's tag_of), so every
// loaded byte is checked against what its group and prefix must hold. Cases: a second engine (or a
// restarted one on the same directory) loads every group's run, the window group only its window
// at the hit's end; the tail window-store rule puts only the window; a value of another group under
// a group's key is a counted miss; weak hashers (colliding keys of other prefixes) never load a
// wrong value.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <variant>
#include <vector>

#include "hybrid_episode.hpp"
#include "pagedkv/remote/disk_store.hpp"
#include "pagedkv/tier/remote_tier.hpp"
#if PAGEDKV_TEST_REDIS
#include "pagedkv/remote/redis_store.hpp"
#include "redis_servers.hpp"
#endif

namespace pagedkv {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using hybrid_test::kBs;
using hybrid_test::tag_of;
namespace fs = std::filesystem;

constexpr std::uint32_t kWindow = 8;  // tokens: window_blocks = ceil(7 / 4) = 2
constexpr std::size_t kWb = 2;

// The model: group 0 full attention, group 1 a sliding window, each at its block size.
struct Layout {
  std::uint32_t bs[2] = {kBs, kBs};
  std::uint32_t window = kWindow;  // tokens
  std::size_t wb = kWb;            // window_blocks of group 1
};
const Layout kOneSize{};
// Groups of different block sizes: a full-attention group at 16 tokens beside a window group at
// 32 (window_blocks 2), and full attention at 32 beside a window at 16 (group 0 not the smallest).
const Layout kFull16Window32{{16, 32}, 2 * 32 + 1, 2};
const Layout kFull32Window16{{32, 16}, 2 * 16 + 1, 2};
// The same with a window covering the whole 322-token prompt: every block of both groups is
// fetched, so a failed block of either group shows the rollback to the longest prefix valid in
// every group.
const Layout kFull16WideWindow32{{16, 32}, 10 * 32 + 1, 10};
const Layout kFull32WideWindow16{{32, 16}, 20 * 16 + 1, 20};
constexpr std::uint64_t kFingerprint = 0x4859425249440001ull;
constexpr std::size_t kPayload = sizeof(std::uint64_t);  // a block's tag

std::vector<TokenId> tokens(std::uint32_t seed, std::size_t n) {
  std::vector<TokenId> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>((seed * 7919 + i * 31) % 1000);
  return t;
}

// 42 tokens: 10 full blocks; a hit is capped at 41 tokens = 10 blocks.
const std::vector<TokenId> kPrompt = tokens(1, 42);

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("pagedkv-hybrid-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    fs::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::unique_ptr<RemoteStore> disk_store(const fs::path& dir) {
  DiskStoreConfig c;
  c.directory = dir;
  c.name_space = "hybrid-remote-test";
  c.layout_fingerprint = kFingerprint;
  c.value_bytes = kPayload;
  c.capacity_bytes = 1u << 20;
  c.op_timeout = 2000ms;
  c.sync_on_close = false;
  return std::make_unique<DiskStore>(c);
}

struct RunResult {
  std::size_t gpu_hit_tokens = 0, host_hit_tokens = 0, computed_tokens = 0;
};

// One engine: a hybrid tier (full + window of kWindow tokens), a store, the remote tier; GPU
// blocks and host slots hold one tag each.
class HybridEngine {
 public:
  HybridEngine(std::unique_ptr<RemoteStore> store, int hashing,
               WindowStoreRule rule = WindowStoreRule::kAll, std::int32_t host_slots = 64,
               bool events = false, const Layout& layout = kOneSize)
      : store_(std::move(store)), layout_(layout) {
    const std::int32_t gpu_blocks = 64;
    KVCacheManagerConfig c = hybrid_test::hybrid_config(gpu_blocks, layout.window, hashing);
    c.groups = {AttentionSpec::full(layout.bs[0]),
                AttentionSpec::sliding(layout.bs[1], layout.window)};
    c.enable_kv_events = events;
    tier_ = std::make_unique<TieredKVCacheManager>(
        c, hybrid_test::host_config(host_slots, HostPolicy::kWriteThrough, rule));
    gpu_.assign(static_cast<std::size_t>(gpu_blocks), 0);
    host_.assign(static_cast<std::size_t>(host_slots + 1) * kPayload, std::byte{0});
    RemoteTierConfig rc;
    rc.policy = PrefetchPolicy::kWaitComplete;
    rc.bytes_per_block = kPayload;
    remote_ = std::make_unique<RemoteTier>(*tier_, *store_, host_, rc);
  }

  std::uint64_t host_tag(BlockId s) const {
    std::uint64_t v = 0;
    std::memcpy(&v, host_.data() + static_cast<std::size_t>(s) * kPayload, kPayload);
    return v;
  }
  void set_host_tag(BlockId s, std::uint64_t v) {
    std::memcpy(host_.data() + static_cast<std::size_t>(s) * kPayload, &v, kPayload);
  }
  void to_host(const std::vector<BlockCopy>& copies, const std::vector<TransferId>& ids) {
    for (std::size_t k = 0; k < copies.size(); ++k) {
      set_host_tag(copies[k].dst, gpu_[static_cast<std::size_t>(copies[k].src)]);
      tier_->commit(ids[k], true);
    }
  }

  RunResult run(RequestId id, const std::vector<TokenId>& prompt) {
    RunResult res;
    Request r = tier_->make_request(id, prompt);
    const auto arrived = Clock::now();
    remote_->add_request(r, arrived);
    for (;;) {
      const auto now = Clock::now();
      remote_->poll(now);
      if (remote_->ready(id, now)) break;
      if (now - arrived > 20s) {
        ADD_FAILURE() << "request " << id << " never became ready";
        break;
      }
      std::this_thread::sleep_for(100us);
    }
    remote_->remove_request(id);
    const TieredCacheHit hit = tier_->get_computed_blocks(r);
    res.gpu_hit_tokens = hit.gpu.num_tokens;
    res.host_hit_tokens = hit.num_host_tokens;
    auto a = tier_->allocate_slots(r, r.num_tokens() - hit.num_tokens(), hit);
    if (!a) {
      ADD_FAILURE() << "no GPU blocks";
      return res;
    }
    std::vector<TierPlan> after;
    to_host(a->transfers.plan.evictions, a->transfers.eviction_ids);
    for (std::size_t k = 0; k < a->transfers.plan.loads.size(); ++k) {
      const BlockCopy& c = a->transfers.plan.loads[k];
      gpu_[static_cast<std::size_t>(c.dst)] = host_tag(c.src);
      tier_->commit(a->transfers.load_ids[k], true);
    }
    std::size_t computed = hit.num_tokens();
    after.push_back(std::move(a->transfers));
    if (tier_->has_unfinished_loads(r.id())) {
      LoadResult lr = tier_->finish_loads(r);
      computed = lr.num_computed_tokens;
      after.push_back(std::move(lr.transfers));
    }
    // Every position the request's attention reads at `computed` holds its group's tag (each
    // group's blocks at its block size).
    for (std::size_t g = 0; g < 2; ++g) {
      const std::size_t gbs = layout_.bs[g];
      const std::size_t cb = computed / gbs;
      const std::span<const BlockId> row = tier_->gpu().block_ids(r.id(), g);
      for (std::size_t p = g == 0 ? 0 : (cb > layout_.wb ? cb - layout_.wb : 0); p < cb; ++p) {
        EXPECT_LT(p, row.size()) << "group " << g << " block " << p;
        if (p >= row.size()) break;
        EXPECT_NE(row[p], kNullBlockId) << "group " << g << " block " << p;
        if (row[p] == kNullBlockId) continue;
        EXPECT_EQ(gpu_[static_cast<std::size_t>(row[p])], tag_of(g, prompt, p, gbs))
            << "wrong K/V: request " << id << " group " << g << " block " << p;
      }
    }
    r.set_num_computed_tokens(computed);
    for (std::size_t g = 0; g < 2; ++g) {
      const std::size_t gbs = layout_.bs[g];
      const std::span<const BlockId> row = tier_->gpu().block_ids(r.id(), g);
      for (std::size_t p = computed / gbs; p < prompt.size() / gbs && p < row.size(); ++p) {
        if (row[p] != kNullBlockId) {
          gpu_[static_cast<std::size_t>(row[p])] = tag_of(g, prompt, p, gbs);
        }
      }
    }
    r.set_num_computed_tokens(r.num_tokens());
    res.computed_tokens = prompt.size() - computed;
    for (TierPlan& p : after) to_host(p.plan.stores, p.store_ids);
    tier_->free(r);
    tier_->check_invariants();
    return res;
  }

  bool drain(std::chrono::milliseconds limit = 10000ms) {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      remote_->poll(Clock::now());
      if (remote_->in_flight() == 0 && remote_->pinned_for_puts() == 0) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }

  TieredKVCacheManager& tier() { return *tier_; }
  RemoteStore& store() { return *store_; }
  RemoteTier& remote() { return *remote_; }

 private:
  std::unique_ptr<RemoteStore> store_;
  Layout layout_;
  std::unique_ptr<TieredKVCacheManager> tier_;
  std::vector<std::uint64_t> gpu_;
  std::vector<std::byte> host_;
  std::unique_ptr<RemoteTier> remote_;
};

// Submits one put outside the remote tier (nothing of the tier's is in flight) and waits for it.
void put_raw(RemoteStore& store, const RemotePut& op) {
  const std::optional<RemoteTicket> t = store.put(std::span<const RemotePut>(&op, 1));
  ASSERT_TRUE(t.has_value());
  std::vector<RemoteCompletion> done;
  const auto end = Clock::now() + 10s;
  while (done.empty() && Clock::now() < end) {
    store.poll(done);
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(done.size(), 1u);
  ASSERT_EQ(done[0].result, RemoteResult::kStored);
}

class RemoteTierHybridDisk : public ::testing::TestWithParam<int> {};  // hashing: 0 sha256, 1 xxh3

// A restarted engine on the same directory loads the whole prompt from the disk store: every
// full-attention block, and of the window group only the window at the hit's end.
TEST_P(RemoteTierHybridDisk, RestartedEngineLoadsFullGroupAndOnlyTheWindow) {
  TempDir dir;
  {
    HybridEngine a(disk_store(dir.path()), GetParam());
    const RunResult ra = a.run(1, kPrompt);
    EXPECT_EQ(ra.computed_tokens, kPrompt.size());
    ASSERT_TRUE(a.drain());
    const std::vector<RemoteTierGroupStats> gs = a.remote().group_stats();
    ASSERT_EQ(gs.size(), 2u);
    EXPECT_EQ(gs[0].stored_blocks, 10u);
    EXPECT_EQ(gs[1].stored_blocks, 10u);  // WindowStoreRule::kAll: every window block
    EXPECT_EQ(a.remote().stats().puts_failed, 0u);
  }
  HybridEngine b(disk_store(dir.path()), GetParam(), WindowStoreRule::kAll, 64, /*events=*/true);
  const RunResult rb = b.run(2, kPrompt);
  EXPECT_EQ(rb.gpu_hit_tokens, 0u);
  // The fills' host BlockStored events carry their group: 10 blocks of group 0, the window's 2
  // of group 1 (the host stores of the same request find them there and add none).
  std::size_t cpu_stored[2] = {0, 0};
  for (const KVEvent& ev : b.tier().take_events()) {
    if (const auto* st = std::get_if<BlockStored>(&ev.data); st != nullptr && st->medium == "CPU") {
      ASSERT_LT(st->group_id, 2u);
      cpu_stored[st->group_id] += st->block_hashes.size();
    }
  }
  EXPECT_EQ(cpu_stored[0], 10u);
  EXPECT_EQ(cpu_stored[1], kWb);
  EXPECT_EQ(rb.host_hit_tokens, 40u);
  EXPECT_EQ(rb.computed_tokens, 2u);  // K/V checked inside run()
  const RemoteTierStats s = b.remote().stats();
  const std::vector<RemoteTierGroupStats> gs = b.remote().group_stats();
  EXPECT_EQ(gs[0].loaded_blocks, 10u);
  EXPECT_EQ(gs[1].loaded_blocks, kWb);  // [L - window_blocks, L) only
  EXPECT_EQ(s.window_blocks_not_loaded, 10u - kWb);
  EXPECT_EQ(gs[1].window_blocks_not_loaded, 10u - kWb);
  EXPECT_EQ(s.loaded_blocks, 10u + kWb);
  EXPECT_EQ(s.loaded_bytes, (10u + kWb) * kPayload);
  EXPECT_EQ(s.rejected_values, 0u);
  EXPECT_EQ(s.load_misses, 0u);
  EXPECT_EQ(b.store().stats().binding_mismatches, 0u);
  // The host tier loaded exactly those to the GPU.
  const std::vector<TierGroupStats> tg = b.tier().group_stats();
  EXPECT_EQ(tg[0].loaded_blocks, 10u);
  EXPECT_EQ(tg[1].loaded_blocks, kWb);
}

// A branch of the prompt in a fresh engine: the run ends where the branch leaves the prompt, and
// the window group loads the window before that point (blocks the first run did not end at).
TEST_P(RemoteTierHybridDisk, BranchLoadsTheWindowAtItsOwnEnd) {
  TempDir dir;
  {
    HybridEngine a(disk_store(dir.path()), GetParam());
    a.run(1, kPrompt);
    ASSERT_TRUE(a.drain());
  }
  HybridEngine b(disk_store(dir.path()), GetParam());
  std::vector<TokenId> branch(kPrompt.begin(), kPrompt.begin() + 24);  // 6 blocks shared
  const std::vector<TokenId> tail = tokens(9, 7);
  branch.insert(branch.end(), tail.begin(), tail.end());
  const RunResult rb = b.run(2, branch);
  EXPECT_EQ(rb.host_hit_tokens, 24u);
  EXPECT_EQ(rb.computed_tokens, branch.size() - 24);
  const std::vector<RemoteTierGroupStats> gs = b.remote().group_stats();
  EXPECT_EQ(gs[0].loaded_blocks, 6u);
  EXPECT_EQ(gs[1].loaded_blocks, kWb);  // blocks 4 and 5
  EXPECT_EQ(b.remote().stats().window_blocks_not_loaded, 6u - kWb);
}

// WindowStoreRule::kRequestTail: the host tier caches, and so the remote tier puts, only the
// window before the request's end; that is all a later hit at that end needs.
TEST_P(RemoteTierHybridDisk, TailRulePutsOnlyTheWindowAndStillHits) {
  TempDir dir;
  {
    HybridEngine a(disk_store(dir.path()), GetParam(), WindowStoreRule::kRequestTail);
    a.run(1, kPrompt);
    ASSERT_TRUE(a.drain());
    const std::vector<RemoteTierGroupStats> gs = a.remote().group_stats();
    EXPECT_EQ(gs[0].stored_blocks, 10u);
    EXPECT_EQ(gs[1].stored_blocks, kWb);
    EXPECT_EQ(a.tier().stats().window_stores_skipped, 10u - kWb);
  }
  HybridEngine b(disk_store(dir.path()), GetParam(), WindowStoreRule::kRequestTail);
  const RunResult rb = b.run(2, kPrompt);
  EXPECT_EQ(rb.host_hit_tokens, 40u);
  EXPECT_EQ(b.remote().group_stats()[1].loaded_blocks, kWb);
  EXPECT_EQ(b.remote().stats().window_blocks_not_loaded, 0u);  // the store never held them
}

// A genuine value of the window group stored under the full-attention group's key of the same
// block is rejected (its binding names another group): a counted miss, never loaded.
TEST_P(RemoteTierHybridDisk, AValueOfAnotherGroupIsACountedMiss) {
  TempDir dir;
  {
    HybridEngine a(disk_store(dir.path()), GetParam());
    a.run(1, kPrompt);
    ASSERT_TRUE(a.drain());
  }
  HybridEngine b(disk_store(dir.path()), GetParam());
  // Block 3's window-group value (its tag, bound to group 1) under block 3's group-0 key.
  const Request probe = b.tier().make_request(99, kPrompt);
  std::vector<BlockHash> ids;
  b.tier().prefix_identities(probe, 4, ids);
  const std::uint64_t tag = tag_of(1, kPrompt, 3);
  std::array<std::byte, kPayload> bytes{};
  std::memcpy(bytes.data(), &tag, kPayload);
  RemotePut op;
  op.key = probe.block_hashes()[3];  // group 0's key
  op.src = bytes;
  op.parent = probe.block_hashes()[2];
  op.group = 1;
  op.identity = ids.empty() ? BlockHash() : ids[3];
  put_raw(b.store(), op);
  const RunResult rb = b.run(2, kPrompt);
  EXPECT_EQ(b.remote().stats().rejected_values, 1u);
  EXPECT_EQ(b.store().stats().binding_mismatches, 1u);
  // Group 0 misses block 3, and the window group holds no window before it: no remote hit.
  EXPECT_EQ(rb.host_hit_tokens, 0u);
  EXPECT_EQ(rb.computed_tokens, kPrompt.size());  // K/V checked inside run()
}

INSTANTIATE_TEST_SUITE_P(Hashes, RemoteTierHybridDisk, ::testing::Values(0, 1),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return i.param == 0 ? std::string("sha256") : std::string("xxh3_128");
                         });

// Group keys: group 0's is the block hash, the others' differ from it and from each other.
TEST(RemoteTierHybridKeys, GroupsNeverShareAKey) {
  TempDir dir;
  for (const int hashing : {0, 1}) {
    HybridEngine e(disk_store(dir.path() / std::to_string(hashing)), hashing);
    const Request r = e.tier().make_request(1, kPrompt);
    for (const BlockHash& h : r.block_hashes()) {
      EXPECT_EQ(e.remote().group_key(h, 0), h);
      EXPECT_NE(e.remote().group_key(h, 1), h);
      EXPECT_NE(e.remote().group_key(h, 1), e.remote().group_key(h, 2));
      EXPECT_EQ(e.remote().group_key(h, 1).size(), h.size());
      for (const BlockHash& other : r.block_hashes()) EXPECT_NE(e.remote().group_key(h, 1), other);
    }
  }
}

// Weak hashers (2-bit digests: every key collides with many blocks of other prefixes and other
// groups): over many prompts sharing prefixes, values of other prefixes or groups under a key are
// rejected (counted), never loaded; K/V is checked at every position in run().
TEST(RemoteTierHybridCollisions, WeakHashersNeverLoadAnotherPrefixOrGroup) {
  for (const int hashing : {2, 3}) {
    TempDir dir;
    std::vector<std::vector<TokenId>> prompts;
    std::mt19937 rng(7u + static_cast<unsigned>(hashing));
    std::vector<TokenId> base(12 * kBs);
    for (TokenId& t : base) t = static_cast<TokenId>(rng() % 3);
    for (int k = 0; k < 8; ++k) {
      std::vector<TokenId> p(base.begin(), base.begin() + (4 + rng() % 8) * kBs);
      for (std::size_t i = 0; i < 3 + rng() % 9; ++i) p.push_back(static_cast<TokenId>(rng() % 3));
      prompts.push_back(p);
    }
    {
      HybridEngine a(disk_store(dir.path()), hashing);
      for (std::size_t k = 0; k < prompts.size(); k += 2) {
        a.run(static_cast<RequestId>(k + 1), prompts[k]);
        ASSERT_TRUE(a.drain());
      }
    }
    HybridEngine b(disk_store(dir.path()), hashing);
    for (std::size_t k = 0; k < prompts.size(); ++k) {
      b.run(static_cast<RequestId>(100 + k), prompts[k]);
      ASSERT_TRUE(b.drain());
    }
    const RemoteTierStats s = b.remote().stats();
    EXPECT_GT(s.rejected_values, 0u) << "hashing " << hashing << ": no collision was exercised";
    EXPECT_EQ(s.rejected_values, b.store().stats().binding_mismatches) << "hashing " << hashing;
  }
}

TEST(RemoteTierHybridConfig, ConstructsForAHybridTier) {
  TempDir dir;
  EXPECT_NO_THROW(HybridEngine(disk_store(dir.path()), 0));
}

// ---- Groups of different block sizes (16 and 32 tokens) ----

// 322 tokens: a hit is capped at 321, 20 blocks of 16 = 10 of 32 (the LCM clamps it to 320).
const std::vector<TokenId> kLongPrompt = tokens(3, 10 * 32 + 2);
constexpr std::size_t kLongHit = 320;

// The store key of group g's block q of `prompt` (group 0's: its block hash at its block size,
// a coarser group's the GPU manager's digest of the fine hashes it covers).
BlockHash group_block_key(HybridEngine& e, const std::vector<TokenId>& prompt, std::size_t g,
                          std::size_t q, BlockHash* parent) {
  const Request r = e.tier().make_request(9999, prompt);
  std::vector<AttentionSpec> specs;
  for (std::size_t h = 0; h < e.tier().gpu().num_groups(); ++h) {
    specs.push_back(e.tier().gpu().group_spec(h));
  }
  const KVCacheCoordinator keys(specs, e.tier().gpu().hasher().scheme());
  std::vector<BlockHash> coarse;
  const BlockSequence seq = keys.group_sequence(r.hashed_tokens().sequence(), g, coarse);
  *parent = q > 0 ? seq.block_hashes[q - 1] : BlockHash();
  return e.remote().group_key(seq.block_hashes[q], static_cast<GroupId>(g));
}

// A store over another whose value of the n-th get of one group vanishes (as if evicted between
// the probe and the get): that get completes kMiss.
class VanishingStore final : public RemoteStore {
 public:
  VanishingStore(std::unique_ptr<RemoteStore> inner, GroupId group, std::size_t nth)
      : inner_(std::move(inner)), group_(group), nth_(nth) {}
  std::optional<RemoteTicket> exists(std::span<const BlockHash> keys) override {
    return inner_->exists(keys);
  }
  std::optional<RemoteTicket> get(std::span<const RemoteGet> ops) override {
    const std::optional<RemoteTicket> t = inner_->get(ops);
    if (!t) return t;
    for (std::size_t k = 0; k < ops.size(); ++k) {
      if (ops[k].group == group_ && seen_++ == nth_) vanish_ = {*t, static_cast<std::uint32_t>(k)};
    }
    return t;
  }
  std::optional<RemoteTicket> put(std::span<const RemotePut> ops) override {
    return inner_->put(ops);
  }
  std::size_t poll(std::vector<RemoteCompletion>& out) override {
    const std::size_t before = out.size();
    const std::size_t n = inner_->poll(out);
    for (std::size_t k = before; k < out.size(); ++k) {
      if (out[k].kind == RemoteOpKind::kGet && out[k].ticket == vanish_.first &&
          out[k].index == vanish_.second) {
        out[k].result = RemoteResult::kMiss;
        ++vanished_;
      }
    }
    return n;
  }
  std::size_t in_flight() const override { return inner_->in_flight(); }
  RemoteStoreStats stats() const override { return inner_->stats(); }
  std::string_view name_space() const noexcept override { return inner_->name_space(); }
  std::size_t vanished() const noexcept { return vanished_; }

 private:
  std::unique_ptr<RemoteStore> inner_;
  GroupId group_;
  std::size_t nth_;
  std::size_t seen_ = 0;
  std::pair<RemoteTicket, std::uint32_t> vanish_{0, 0};
  std::size_t vanished_ = 0;
};

std::string layout_name(const Layout& l) {
  return "full" + std::to_string(l.bs[0]) + "_window" + std::to_string(l.bs[1]) + "x" +
         std::to_string(l.wb);
}

// hashing (0 sha256, 1 xxh3_128) x layout (0: full 16 + window 32, 1: full 32 + window 16).
class RemoteTierHybridSizes : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  int hashing() const { return std::get<0>(GetParam()); }
  const Layout& layout() const {
    return std::get<1>(GetParam()) == 0 ? kFull16Window32 : kFull32Window16;
  }
  const Layout& wide() const {
    return std::get<1>(GetParam()) == 0 ? kFull16WideWindow32 : kFull32WideWindow16;
  }
  // The rollback tests: a first engine stores kLongPrompt under wide() in `dir`.
  void store_long_prompt(const fs::path& dir) const {
    HybridEngine a(disk_store(dir), hashing(), WindowStoreRule::kAll, 64, false, wide());
    a.run(1, kLongPrompt);
    ASSERT_TRUE(a.drain());
  }
  // (group, its block) whose value fails: the failed block starts at 208 tokens (group 0 at 16)
  // or 96 (group 1 at 32) for full 16 + window 32; at 160 (group 0 at 32) or 208 (group 1 at 16)
  // otherwise.
  std::array<std::pair<std::size_t, std::size_t>, 2> failing_blocks() const {
    const bool fine0 = wide().bs[0] == 16;
    return {{{0, fine0 ? 13 : 5}, {1, fine0 ? 3 : 13}}};
  }
};

// Blocks of group g in `tokens` tokens under layout l.
std::size_t blocks_of(const Layout& l, std::size_t g, std::size_t tokens) {
  return tokens / l.bs[g];
}

// A restarted engine on the same directory loads the prompt from the disk store: every block of
// the full-attention group at its block size, of the window group only the window at the hit's
// end (at its block size); the exact tags of both groups land (checked in run()).
TEST_P(RemoteTierHybridSizes, RestartedEngineLoadsEachGroupAtItsBlockSize) {
  SCOPED_TRACE(layout_name(layout()));
  const Layout& l = layout();
  TempDir dir;
  {
    HybridEngine a(disk_store(dir.path()), hashing(), WindowStoreRule::kAll, 64, false, l);
    EXPECT_EQ(a.run(1, kLongPrompt).computed_tokens, kLongPrompt.size());
    ASSERT_TRUE(a.drain());
    const std::vector<RemoteTierGroupStats> gs = a.remote().group_stats();
    EXPECT_EQ(gs[0].stored_blocks, blocks_of(l, 0, kLongHit));
    EXPECT_EQ(gs[1].stored_blocks, blocks_of(l, 1, kLongHit));
    EXPECT_EQ(a.remote().stats().puts_failed, 0u);
  }
  HybridEngine b(disk_store(dir.path()), hashing(), WindowStoreRule::kAll, 64, true, l);
  const RunResult rb = b.run(2, kLongPrompt);
  EXPECT_EQ(rb.gpu_hit_tokens, 0u);
  EXPECT_EQ(rb.host_hit_tokens, kLongHit);
  EXPECT_EQ(rb.computed_tokens, kLongPrompt.size() - kLongHit);
  // The fills' host events carry their group, at its block size.
  std::size_t cpu_stored[2] = {0, 0};
  for (const KVEvent& ev : b.tier().take_events()) {
    if (const auto* st = std::get_if<BlockStored>(&ev.data); st != nullptr && st->medium == "CPU") {
      ASSERT_LT(st->group_id, 2u);
      cpu_stored[st->group_id] += st->block_hashes.size();
      EXPECT_EQ(st->block_size, l.bs[st->group_id]);
    }
  }
  EXPECT_EQ(cpu_stored[0], blocks_of(l, 0, kLongHit));
  EXPECT_EQ(cpu_stored[1], l.wb);
  const RemoteTierStats s = b.remote().stats();
  const std::vector<RemoteTierGroupStats> gs = b.remote().group_stats();
  EXPECT_EQ(gs[0].probed_blocks, blocks_of(l, 0, kLongHit));
  EXPECT_EQ(gs[1].probed_blocks, blocks_of(l, 1, kLongHit));
  EXPECT_EQ(gs[0].loaded_blocks, blocks_of(l, 0, kLongHit));
  EXPECT_EQ(gs[1].loaded_blocks, l.wb);
  EXPECT_EQ(gs[1].window_blocks_not_loaded, blocks_of(l, 1, kLongHit) - l.wb);
  EXPECT_EQ(s.loaded_blocks, blocks_of(l, 0, kLongHit) + l.wb);
  EXPECT_EQ(s.remote_hit_tokens, kLongHit + l.wb * l.bs[1]);
  EXPECT_EQ(s.load_misses, 0u);
  EXPECT_EQ(s.rejected_values, 0u);
  const std::vector<TierGroupStats> tg = b.tier().group_stats();
  EXPECT_EQ(tg[0].loaded_blocks, blocks_of(l, 0, kLongHit));
  EXPECT_EQ(tg[1].loaded_blocks, l.wb);
}

// One engine: its prompt is stored, then evicted from the GPU and the host by other prompts, then
// fetched back from the store; a branch that leaves the prompt mid-way hits up to the last LCM
// boundary before it.
TEST_P(RemoteTierHybridSizes, EvictedPromptComesBackFromTheStore) {
  SCOPED_TRACE(layout_name(layout()));
  const Layout& l = layout();
  TempDir dir;
  HybridEngine e(disk_store(dir.path()), hashing(), WindowStoreRule::kAll, 40, false, l);
  e.run(1, kLongPrompt);
  ASSERT_TRUE(e.drain());
  for (std::uint32_t k = 0; k < 4; ++k) {
    e.run(10 + k, tokens(20 + k, kLongPrompt.size()));
    ASSERT_TRUE(e.drain());
  }
  const Request probe = e.tier().make_request(98, kLongPrompt);
  for (std::size_t g = 0; g < 2; ++g) {
    EXPECT_FALSE(e.tier().host_holds(probe, 0, static_cast<GroupId>(g))) << "group " << g;
  }
  const RemoteTierStats before = e.remote().stats();
  const RunResult r = e.run(2, kLongPrompt);
  EXPECT_EQ(r.gpu_hit_tokens, 0u);
  EXPECT_EQ(r.host_hit_tokens, kLongHit);
  const RemoteTierStats after = e.remote().stats();
  EXPECT_EQ(after.loaded_blocks - before.loaded_blocks, blocks_of(l, 0, kLongHit) + l.wb);
  EXPECT_EQ(after.load_misses, 0u);
  // A branch: 7 blocks of 16 (112 tokens) shared, then other tokens; the hit stops at 96 (the
  // LCM 32's multiple below 112), the window group loads its window before 96.
  for (std::uint32_t k = 0; k < 4; ++k) {
    e.run(30 + k, tokens(40 + k, kLongPrompt.size()));
    ASSERT_TRUE(e.drain());
  }
  std::vector<TokenId> branch(kLongPrompt.begin(), kLongPrompt.begin() + 112);
  const std::vector<TokenId> tail = tokens(9, 50);
  branch.insert(branch.end(), tail.begin(), tail.end());
  const RemoteTierGroupStats g1 = e.remote().group_stats()[1];
  const RunResult rb = e.run(3, branch);
  EXPECT_EQ(rb.gpu_hit_tokens, 0u);
  EXPECT_EQ(rb.host_hit_tokens, 96u);
  EXPECT_EQ(e.remote().group_stats()[1].loaded_blocks - g1.loaded_blocks, l.wb);
}

// A corrupted value (a value bound to another block, as a torn or hostile write leaves it) of
// either group is a counted miss, and the hit rolls back to the longest prefix valid in every
// group: the last multiple of the LCM (32 tokens) before the failed block.
TEST_P(RemoteTierHybridSizes, ACorruptValueOfEitherGroupRollsBackToAValidPrefix) {
  const Layout& l = wide();
  SCOPED_TRACE(layout_name(l));
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(store_long_prompt(dir.path()));
  for (const auto& [g, q] : failing_blocks()) {
    SCOPED_TRACE("corrupt group " + std::to_string(g) + " block " + std::to_string(q));
    TempDir copy;
    fs::copy(dir.path(), copy.path(), fs::copy_options::recursive);
    HybridEngine b(disk_store(copy.path()), hashing(), WindowStoreRule::kAll, 64, false, l);
    RemotePut op;
    op.key = group_block_key(b, kLongPrompt, g, q, &op.parent);
    op.parent = op.key;  // bound to another block
    op.group = static_cast<GroupId>(g);
    const std::uint64_t tag = 12345;
    std::array<std::byte, kPayload> bytes{};
    std::memcpy(bytes.data(), &tag, kPayload);
    op.src = bytes;
    put_raw(b.store(), op);
    const RunResult rb = b.run(2, kLongPrompt);  // K/V checked inside run()
    const std::size_t fail_token = q * l.bs[g];
    EXPECT_EQ(rb.host_hit_tokens, fail_token / 32 * 32);
    EXPECT_EQ(rb.computed_tokens, kLongPrompt.size() - fail_token / 32 * 32);
    const RemoteTierStats s = b.remote().stats();
    EXPECT_EQ(s.load_misses, 1u);
    EXPECT_EQ(s.rejected_values, 1u);
    EXPECT_EQ(b.store().stats().binding_mismatches, 1u);
    EXPECT_EQ(s.loaded_blocks, blocks_of(l, 0, kLongHit) + blocks_of(l, 1, kLongHit) - 1);
  }
}

// A value of either group that vanishes between the probe and the get (kMiss) is a counted miss
// with the same rollback.
TEST_P(RemoteTierHybridSizes, AMissingValueOfEitherGroupRollsBackToAValidPrefix) {
  const Layout& l = wide();
  SCOPED_TRACE(layout_name(l));
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(store_long_prompt(dir.path()));
  for (const auto& [g, q] : failing_blocks()) {
    SCOPED_TRACE("missing group " + std::to_string(g) + " block " + std::to_string(q));
    auto vanishing =
        std::make_unique<VanishingStore>(disk_store(dir.path()), static_cast<GroupId>(g), q);
    VanishingStore& v = *vanishing;
    HybridEngine b(std::move(vanishing), hashing(), WindowStoreRule::kAll, 64, false, l);
    const RunResult rb = b.run(static_cast<RequestId>(2 + g), kLongPrompt);
    EXPECT_EQ(v.vanished(), 1u);
    const std::size_t fail_token = q * l.bs[g];
    EXPECT_EQ(rb.host_hit_tokens, fail_token / 32 * 32);
    const RemoteTierStats s = b.remote().stats();
    EXPECT_EQ(s.load_misses, 1u);
    EXPECT_EQ(s.rejected_values, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(HashesAndLayouts, RemoteTierHybridSizes,
                         ::testing::Combine(::testing::Values(0, 1), ::testing::Values(0, 1)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& i) {
                           return std::string(std::get<0>(i.param) == 0 ? "sha256" : "xxh3_128") +
                                  (std::get<1>(i.param) == 0 ? "_full16_window32"
                                                             : "_full32_window16");
                         });

// The tier's calls below the host at a coarser group's block size: the index is in that
// group's own blocks, the slot is cached under its key and token span, verified as the host
// tier verifies that group's slots (every hash scheme, weak hashers included).
TEST(RemoteTierHybridSizesTier, BelowHostCallsServeACoarserGroup) {
  for (int hashing = 0; hashing < 4; ++hashing) {
    SCOPED_TRACE("hashing " + std::to_string(hashing));
    KVCacheManagerConfig c = hybrid_test::hybrid_config(64, kFull16Window32.window, hashing);
    c.groups = {AttentionSpec::full(16), AttentionSpec::sliding(32, kFull16Window32.window)};
    TieredKVCacheManager t(c, hybrid_test::host_config(16, HostPolicy::kWriteBack));
    Request r = t.make_request(1, kLongPrompt);   // 20 blocks of 16, 10 of 32
    EXPECT_THROW(t.begin_fill(r, 10, 1), Error);  // group 1 has no full block 10
    EXPECT_FALSE(t.host_holds(r, 10, 1));
    EXPECT_FALSE(t.host_holds(r, 9, 1));
    const std::optional<HostFill> f = t.begin_fill(r, 9, 1);  // tokens [288, 320)
    ASSERT_TRUE(f.has_value());
    t.commit(f->id, true);
    EXPECT_TRUE(t.host_holds(r, 9, 1));
    EXPECT_FALSE(t.host_holds(r, 9, 0));
    EXPECT_FALSE(t.host_holds(r, 19, 1));
    EXPECT_FALSE(t.host_holds(r, 8, 1));
    // Another request sharing tokens [0, 304) but not [304, 320): not the same block of 32.
    std::vector<TokenId> other = kLongPrompt;
    other[310] += 1;
    Request r2 = t.make_request(2, other);
    EXPECT_FALSE(t.host_holds(r2, 9, 1));
    // The same block 9 after another prefix (token 5 differs): a different key (and, with weak
    // hashers, a different prefix identity), never held.
    std::vector<TokenId> moved = kLongPrompt;
    moved[5] += 1;
    Request r3 = t.make_request(3, moved);
    EXPECT_FALSE(t.host_holds(r3, 9, 1));
    t.check_invariants();
  }
}

// Weak hashers (2-bit digests) at block sizes 16 and 32: values of other prefixes or groups under
// a colliding key are rejected (counted), never loaded (K/V checked at every position in run()).
TEST(RemoteTierHybridSizesCollisions, WeakHashersNeverLoadAnotherPrefixOrGroup) {
  for (const Layout* l : {&kFull16Window32, &kFull32Window16}) {
    for (const int hashing : {2, 3}) {
      SCOPED_TRACE(layout_name(*l) + " hashing " + std::to_string(hashing));
      TempDir dir;
      std::vector<std::vector<TokenId>> prompts;
      std::mt19937 rng(11u + static_cast<unsigned>(hashing));
      std::vector<TokenId> base(12 * 32);
      for (TokenId& t : base) t = static_cast<TokenId>(rng() % 3);
      for (int k = 0; k < 8; ++k) {
        std::vector<TokenId> p(base.begin(), base.begin() + (2 + rng() % 10) * 32);
        for (std::size_t i = 0; i < 3 + rng() % 40; ++i) {
          p.push_back(static_cast<TokenId>(rng() % 3));
        }
        prompts.push_back(p);
      }
      {
        HybridEngine a(disk_store(dir.path()), hashing, WindowStoreRule::kAll, 64, false, *l);
        for (std::size_t k = 0; k < prompts.size(); k += 2) {
          a.run(static_cast<RequestId>(k + 1), prompts[k]);
          ASSERT_TRUE(a.drain());
        }
      }
      HybridEngine b(disk_store(dir.path()), hashing, WindowStoreRule::kAll, 64, false, *l);
      for (std::size_t k = 0; k < prompts.size(); ++k) {
        b.run(static_cast<RequestId>(100 + k), prompts[k]);
        ASSERT_TRUE(b.drain());
      }
      const RemoteTierStats s = b.remote().stats();
      EXPECT_GT(s.rejected_values, 0u) << "no collision was exercised";
      EXPECT_GT(s.loaded_blocks, 0u);
      EXPECT_EQ(s.rejected_values, b.store().stats().binding_mismatches);
    }
  }
}

#if PAGEDKV_TEST_REDIS
// Two engines live at once on one redis-server: the second loads the first one's prompt, the
// window group only its window.
TEST(RemoteTierHybridRedis, SecondEngineLoadsFullGroupAndOnlyTheWindow) {
  if (test::RedisServer::binary().empty()) {
    GTEST_SKIP() << "redis-server not installed (Debian: redis-server): redis case skipped";
  }
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  const auto redis = [&server] {
    RedisStoreConfig c;
    c.port = server.port();
    c.name_space = "hybrid";
    c.layout_fingerprint = kFingerprint;
    c.op_timeout = 1000ms;
    c.connect_timeout = 200ms;
    return std::make_unique<RedisStore>(c);
  };
  HybridEngine a(redis(), 1);
  a.run(1, kPrompt);
  ASSERT_TRUE(a.drain());
  EXPECT_EQ(a.remote().group_stats()[1].stored_blocks, 10u);
  HybridEngine b(redis(), 1);
  const RunResult rb = b.run(2, kPrompt);
  EXPECT_EQ(rb.host_hit_tokens, 40u);
  EXPECT_EQ(b.remote().group_stats()[0].loaded_blocks, 10u);
  EXPECT_EQ(b.remote().group_stats()[1].loaded_blocks, kWb);
  EXPECT_EQ(b.remote().stats().rejected_values, 0u);
}
#endif

}  // namespace
}  // namespace pagedkv
