// RemoteTier: engines (TieredKVCacheManager + RedisStore + RemoteTier, K/V moved by the CPU
// reference executor) sharing prefixes through a real redis-server on 127.0.0.1 (started by the
// test, tests/util/redis_servers.hpp). A token's "K/V" is a digest of the tokens up to it, written
// by a fake forward pass, so every loaded byte is checked against what the prefix must hold.
// Faults: wrong namespace, corrupted value, server killed mid-run, full server. Without
// redis-server every test reports SKIPPED.
#include "pagedkv/tier/remote_tier.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "pagedkv/reference/transfer.hpp"
#include "pagedkv/remote/redis_store.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "redis_servers.hpp"
#include "tier_episode.hpp"

namespace pagedkv {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kBs = 4;
constexpr std::size_t kLayers = 2;
constexpr std::int32_t kGpuBlocks = 64;
constexpr std::int32_t kHostBlocks = 48;

using tier_test::reference_values;

std::vector<TokenId> tokens(std::uint32_t seed, std::size_t n) {
  std::vector<TokenId> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<TokenId>((seed * 7919 + i * 31) % 1000);
  return t;
}

struct RunResult {
  std::size_t gpu_hit_tokens = 0;
  std::size_t host_hit_tokens = 0;
  std::size_t computed_tokens = 0;  // prefill the fake forward pass computed
  std::chrono::microseconds wait{0};
};

// One engine: the tier, a Redis store, the remote tier, device and host buffers.
class Engine {
 public:
  Engine(std::uint16_t port, const std::string& ns, RemoteTierConfig rc = {},
         std::chrono::milliseconds op_timeout = 500ms, std::int32_t host_blocks = kHostBlocks,
         HashScheme scheme = HashScheme::kSha256, std::optional<BlockHasher> hasher = {})
      : host_blocks_(host_blocks) {
    KVCacheManagerConfig c;
    c.num_blocks = kGpuBlocks;
    c.block_size = kBs;
    c.hash_seed = "remote-tier-test";
    c.hash_scheme = scheme;
    c.hasher = std::move(hasher);
    HostTierConfig h;
    h.num_host_blocks = host_blocks;
    h.policy = HostPolicy::kWriteThrough;
    layout_ = TransferLayout::block_first(kLayers, kBs * sizeof(std::uint64_t));
    h.bytes_per_block = layout_.block_bytes();
    tier_ = std::make_unique<TieredKVCacheManager>(c, h);
    device_.assign(static_cast<std::size_t>(kGpuBlocks) * layout_.block_bytes(), std::byte{0});
    host_.assign(static_cast<std::size_t>(host_blocks + 1) * layout_.block_bytes(), std::byte{0});
    RedisStoreConfig sc;
    sc.port = port;
    sc.name_space = ns;
    sc.layout_fingerprint = layout_fingerprint("remote-tier-test,block-first,u64,bs4,2 layers");
    sc.op_timeout = op_timeout;
    sc.connect_timeout = 200ms;
    store_ = std::make_unique<RedisStore>(sc);
    rc.bytes_per_block = layout_.block_bytes();
    remote_ = std::make_unique<RemoteTier>(*tier_, *store_, host_, rc);
  }

  std::uint64_t* dev(BlockId b, std::size_t l, std::size_t off) {
    return reinterpret_cast<std::uint64_t*>(device_.data() + b * layout_.device_block_stride +
                                            l * layout_.device_layer_stride) +
           off;
  }

  // Runs one request's prefill to completion and checks every token's K/V in its blocks.
  RunResult run(RequestId id, const std::vector<TokenId>& prompt) {
    RunResult r;
    auto req = std::make_unique<Request>(tier_->make_request(id, prompt));
    const auto arrived = Clock::now();
    remote_->add_request(*req, arrived);
    for (;;) {
      const auto now = Clock::now();
      remote_->poll(now);
      if (remote_->ready(id, now)) break;
      if (now - arrived > 20s) {
        ADD_FAILURE() << "request " << id << " never became ready";
        break;
      }
      std::this_thread::sleep_for(200us);
    }
    r.wait = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - arrived);
    remote_->remove_request(id);
    const TieredCacheHit hit = tier_->get_computed_blocks(*req);
    r.gpu_hit_tokens = hit.gpu.num_tokens;
    r.host_hit_tokens = hit.num_host_tokens;
    auto a = tier_->allocate_slots(*req, prompt.size() - hit.num_tokens(), hit);
    if (!a) {
      ADD_FAILURE() << "no GPU blocks";
      return r;
    }
    TierPlan plan = std::move(a->transfers);
    execute(plan.plan, TransferStage::kBeforeForward);
    for (TransferId t : plan.eviction_ids) tier_->commit(t, true);
    for (TransferId t : plan.load_ids) tier_->commit(t, true);
    std::size_t computed = hit.num_tokens();
    std::vector<TierPlan> after;
    if (!plan.load_ids.empty()) {
      LoadResult lr = tier_->finish_loads(*req);
      computed = lr.num_computed_tokens;
      after.push_back(std::move(lr.transfers));
    }
    // Check what is in place, then the fake forward pass writes the rest.
    const std::vector<std::uint64_t> want = reference_values(prompt);
    const std::span<const BlockId> blocks = tier_->block_ids(id);
    for (std::size_t p = 0; p < prompt.size(); ++p) {
      for (std::size_t l = 0; l < kLayers; ++l) {
        std::uint64_t* v = dev(blocks[p / kBs], l, p % kBs);
        if (p < computed) {
          EXPECT_EQ(*v, want[p] ^ l) << "request " << id << " token " << p << " layer " << l;
        } else {
          *v = want[p] ^ l;
        }
      }
    }
    r.computed_tokens = prompt.size() - computed;
    execute(plan.plan, TransferStage::kAfterForward);
    for (TransferId t : plan.store_ids) tier_->commit(t, true);
    for (TierPlan& p : after) {
      execute(p.plan, TransferStage::kAfterForward);
      for (TransferId t : p.store_ids) tier_->commit(t, true);
    }
    tier_->free(*req);
    tier_->check_invariants();
    return r;
  }

  // Polls until every op of the remote tier completed (puts included), up to `limit`.
  bool drain(std::chrono::milliseconds limit = 10000ms) {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      remote_->poll(Clock::now());
      if (remote_->in_flight() == 0 && remote_->pinned_for_puts() == 0) return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }

  void execute(TransferPlan& plan, TransferStage stage) {
    reference::execute_transfer_plan(plan, stage, layout_, device_,
                                     static_cast<std::size_t>(kGpuBlocks), host_,
                                     static_cast<std::size_t>(host_blocks_ + 1));
  }

  TieredKVCacheManager& tier() { return *tier_; }
  RedisStore& store() { return *store_; }
  RemoteTier& remote() { return *remote_; }

 private:
  std::int32_t host_blocks_;
  TransferLayout layout_;
  std::vector<std::byte> device_, host_;
  std::unique_ptr<TieredKVCacheManager> tier_;
  std::unique_ptr<RedisStore> store_;
  std::unique_ptr<RemoteTier> remote_;
};

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::RedisServer::binary().empty()) {
      GTEST_SKIP() << "redis-server not installed (Debian: redis-server): remote tests skipped";
    }
  }
};

// 42 tokens: 10 full blocks; a hit is capped at num_tokens - 1 = 41 tokens = 10 blocks.
const std::vector<TokenId> kPrompt = tokens(1, 42);

TEST_F(RemoteTierTest, SecondEngineLoadsTheFirstOnesPrefixInsteadOfComputing) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  {
    Engine a(server.port(), "ns-a");
    const RunResult ra = a.run(1, kPrompt);
    EXPECT_EQ(ra.computed_tokens, kPrompt.size());
    ASSERT_TRUE(a.drain());
    EXPECT_EQ(a.remote().stats().stored_blocks, 10u);
    EXPECT_EQ(a.remote().stats().puts_failed, 0u);
    a.tier().check_invariants();
  }
  RemoteTierConfig rc;
  rc.policy = PrefetchPolicy::kWaitComplete;
  Engine b(server.port(), "ns-a", rc);
  // Shares 8 blocks (32 tokens) with the first engine's prompt, then diverges.
  std::vector<TokenId> prompt(kPrompt.begin(), kPrompt.begin() + 32);
  const auto tail = tokens(2, 9);
  prompt.insert(prompt.end(), tail.begin(), tail.end());
  const RunResult rb = b.run(7, prompt);
  EXPECT_EQ(rb.host_hit_tokens, 32u);
  EXPECT_EQ(rb.computed_tokens, prompt.size() - 32);  // bytes checked inside run()
  const RemoteTierStats s = b.remote().stats();
  EXPECT_EQ(s.probe_hit_blocks, 8u);
  EXPECT_EQ(s.loaded_blocks, 8u);
  EXPECT_EQ(s.load_misses, 0u);
  EXPECT_EQ(s.remote_hit_tokens, 32u);
  EXPECT_EQ(b.tier().stats().loaded_blocks, 8u);
  // The blocks that came from Redis are not put back; the new ones are.
  ASSERT_TRUE(b.drain());
  EXPECT_EQ(b.remote().stats().stored_blocks, 2u);
  // The same prompt again is a GPU hit now: no remote probe beyond the local prefix.
  const RunResult again = b.run(8, prompt);
  EXPECT_EQ(again.gpu_hit_tokens, 40u);
  EXPECT_EQ(again.computed_tokens, 1u);
}

// Two requests arriving together with the same remote prefix: one get per block, not two. The
// second request waits for the first one's fills: whenever it becomes ready, every block of the
// run is in the host tier already.
TEST_F(RemoteTierTest, RequestsArrivingTogetherFetchASharedPrefixOnce) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  {
    Engine a(server.port(), "ns-shared");
    a.run(1, kPrompt);
    ASSERT_TRUE(a.drain());
    ASSERT_EQ(a.remote().stats().stored_blocks, 10u);
  }
  RemoteTierConfig rc;
  rc.policy = PrefetchPolicy::kWaitComplete;
  Engine b(server.port(), "ns-shared", rc);
  const Request r1 = b.tier().make_request(1, kPrompt);
  const Request r2 = b.tier().make_request(2, kPrompt);
  const auto arrived = Clock::now();
  b.remote().add_request(r1, arrived);
  b.remote().add_request(r2, arrived);
  // Let both probes answer before the first poll, so that both requests start their fills in
  // the same poll (with the first one's gets certainly in flight when the second one starts).
  std::this_thread::sleep_for(200ms);
  bool ready1 = false;
  bool ready2 = false;
  while (!(ready1 && ready2)) {
    const auto now = Clock::now();
    ASSERT_LT(now - arrived, 20s) << "never ready";
    b.remote().poll(now);
    for (auto [r, ready] : {std::pair{&r1, &ready1}, std::pair{&r2, &ready2}}) {
      if (*ready || !b.remote().ready(r->id(), now)) continue;
      *ready = true;
      for (std::size_t i = 0; i < 10; ++i) {
        EXPECT_TRUE(b.tier().host_holds(*r, i))
            << "request " << r->id() << " ready before block " << i << " was in the host tier";
      }
    }
    std::this_thread::sleep_for(100us);
  }
  b.remote().remove_request(1);
  b.remote().remove_request(2);
  RemoteTierStats s = b.remote().stats();
  EXPECT_EQ(s.probe_hit_blocks, 20u);  // both probed the run
  EXPECT_EQ(s.fills, 10u);             // one get per block
  EXPECT_EQ(s.fills_shared, 10u);
  EXPECT_EQ(s.loaded_blocks, 10u);
  EXPECT_EQ(b.store().stats().gets, 10u);
  // Both are now host hits over the whole run; run() checks every loaded byte.
  EXPECT_EQ(b.run(3, kPrompt).host_hit_tokens, 40u);
  s = b.remote().stats();
  EXPECT_EQ(s.fills, 10u);  // nothing fetched again
  b.tier().check_invariants();
}

TEST_F(RemoteTierTest, AnotherNamespaceIsAMiss) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  {
    Engine a(server.port(), "model-a");
    a.run(1, kPrompt);
    ASSERT_TRUE(a.drain());
  }
  Engine b(server.port(), "model-b");
  const RunResult rb = b.run(1, kPrompt);
  EXPECT_EQ(rb.computed_tokens, kPrompt.size());
  EXPECT_EQ(b.remote().stats().probe_hit_blocks, 0u);
  EXPECT_EQ(b.remote().stats().loaded_blocks, 0u);
}

TEST_F(RemoteTierTest, CorruptedValueIsAMissAndShortensTheHit) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  Engine a(server.port(), "ns");
  a.run(1, kPrompt);
  ASSERT_TRUE(a.drain());
  // Flip one payload byte of block 3's value.
  const Request r = a.tier().make_request(99, kPrompt);
  const std::string key = a.store().key_of(r.block_hashes()[3]);
  test::Client client(server.port());
  auto value = client.command({"GET", key});
  ASSERT_TRUE(value.has_value());
  ASSERT_GT(value->size(), kRemoteValueHeaderSize);
  (*value)[kRemoteValueHeaderSize + 5] =
      static_cast<char>((*value)[kRemoteValueHeaderSize + 5] ^ 1);
  ASSERT_EQ(client.command({"SET", key, *value}), "OK");

  RemoteTierConfig rc;
  rc.policy = PrefetchPolicy::kWaitComplete;
  Engine b(server.port(), "ns", rc);
  const RunResult rb = b.run(1, kPrompt);
  EXPECT_EQ(rb.host_hit_tokens, 3u * kBs);  // blocks 0-2; 3 is corrupt, the rest do not chain
  EXPECT_EQ(rb.computed_tokens, kPrompt.size() - 3 * kBs);
  EXPECT_EQ(b.store().stats().checksum_failures, 1u);
  EXPECT_EQ(b.remote().stats().load_misses, 1u);
  EXPECT_EQ(b.remote().stats().loaded_blocks, 9u);
}

// Issue 41: values rotated among their keys (each key holds another block's genuine value, header
// and checksum intact, as a writer with access to the namespace or a bug could leave them). Every
// get of such a value is a counted miss, never a hit: run() checks every loaded byte against the
// prefix, so a value loaded under the wrong key fails there. Another prompt's values (other
// blocks, other parents) rotated into this prompt's keys are rejected just the same.
TEST_F(RemoteTierTest, ValuesRotatedAmongKeysAreCountedMissesNeverWrongKV) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  const std::vector<TokenId> other = tokens(77, 42);
  std::vector<std::string> keys;
  {
    Engine a(server.port(), "ns");
    a.run(1, kPrompt);
    a.run(2, other);
    ASSERT_TRUE(a.drain());
    ASSERT_EQ(a.remote().stats().stored_blocks, 20u);
    const Request r = a.tier().make_request(99, kPrompt);
    const Request o = a.tier().make_request(98, other);
    for (std::size_t i = 0; i < 10; ++i) keys.push_back(a.store().key_of(r.block_hashes()[i]));
    for (std::size_t i = 0; i < 10; ++i) keys.push_back(a.store().key_of(o.block_hashes()[i]));
  }
  test::Client client(server.port());
  std::vector<std::string> values;
  for (const std::string& k : keys) {
    auto v = client.command({"GET", k});
    ASSERT_TRUE(v.has_value() && *v != "(nil)") << k;
    values.push_back(*v);
  }
  // Key i (of kPrompt) gets the value of key i + 1 (the next block of kPrompt, or, for the last
  // ones, blocks of the other prompt), so no key keeps its own value.
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(client.command({"SET", keys[i], values[(i + 1) % keys.size()]}), "OK");
  }

  RemoteTierConfig rc;
  rc.policy = PrefetchPolicy::kWaitComplete;
  Engine b(server.port(), "ns", rc);
  const RunResult rb = b.run(1, kPrompt);  // bytes checked inside run()
  EXPECT_EQ(rb.host_hit_tokens, 0u);
  EXPECT_EQ(rb.computed_tokens, kPrompt.size());
  const RunResult ro = b.run(2, other);
  EXPECT_EQ(ro.host_hit_tokens, 0u);
  EXPECT_EQ(ro.computed_tokens, other.size());
  const RemoteTierStats s = b.remote().stats();
  EXPECT_EQ(s.probe_hit_blocks, 20u);  // the keys are there...
  EXPECT_EQ(s.fills, 20u);
  EXPECT_EQ(s.loaded_blocks, 0u);  // ... but no value is loaded under a key not its own
  EXPECT_EQ(s.load_misses, 20u);
  EXPECT_EQ(s.rejected_values, 20u);
  const RemoteStoreStats st = b.store().stats();
  EXPECT_EQ(st.binding_mismatches, 20u);
  EXPECT_EQ(st.checksum_failures + st.header_mismatches, 0u);
  EXPECT_EQ(st.misses, 20u);
  EXPECT_EQ(st.hits, 0u);
  b.tier().check_invariants();
}

// The same value back under its own key is a hit again: the binding rejects only misplacement.
TEST_F(RemoteTierTest, AValueRestoredUnderItsOwnKeyIsAHitAgain) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  std::vector<std::string> keys;
  {
    Engine a(server.port(), "ns");
    a.run(1, kPrompt);
    ASSERT_TRUE(a.drain());
    const Request r = a.tier().make_request(99, kPrompt);
    for (std::size_t i = 0; i < 10; ++i) keys.push_back(a.store().key_of(r.block_hashes()[i]));
  }
  test::Client client(server.port());
  const auto v3 = client.command({"GET", keys[3]});
  const auto v4 = client.command({"GET", keys[4]});
  ASSERT_TRUE(v3 && v4);
  // Blocks 3 and 4 swapped: the run ends before block 3.
  ASSERT_EQ(client.command({"SET", keys[3], *v4}), "OK");
  ASSERT_EQ(client.command({"SET", keys[4], *v3}), "OK");
  RemoteTierConfig rc;
  rc.policy = PrefetchPolicy::kWaitComplete;
  {
    RemoteTierConfig no_store = rc;  // leaves the swapped values in place
    no_store.store = false;
    Engine b(server.port(), "ns", no_store);
    const RunResult rb = b.run(1, kPrompt);
    EXPECT_EQ(rb.host_hit_tokens, 3u * kBs);
    EXPECT_EQ(b.remote().stats().rejected_values, 2u);
    EXPECT_EQ(b.store().stats().binding_mismatches, 2u);
  }
  // Swapped back: every block is a hit.
  ASSERT_EQ(client.command({"SET", keys[3], *v3}), "OK");
  ASSERT_EQ(client.command({"SET", keys[4], *v4}), "OK");
  Engine c(server.port(), "ns", rc);
  EXPECT_EQ(c.run(1, kPrompt).host_hit_tokens, 40u);
  EXPECT_EQ(c.remote().stats().rejected_values, 0u);
}

TEST_F(RemoteTierTest, ServerKilledMidRunGivesMissesNotStalls) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  Engine a(server.port(), "ns");
  a.run(1, kPrompt);
  ASSERT_TRUE(a.drain());
  RemoteTierConfig rc;
  rc.policy = PrefetchPolicy::kTimeout;
  rc.timeout = 300ms;
  Engine b(server.port(), "ns", rc, 200ms);
  for (std::uint32_t i = 0; i < 6; ++i) {
    if (i == 2) server.kill();
    // Request 0 shares all 10 blocks with the first engine; later ones share 5 and bring 5 new
    // blocks (probed, then stored: remote traffic before and after the kill).
    std::vector<TokenId> prompt = kPrompt;
    if (i > 0) {
      const auto tail = tokens(100 + i, 22);
      std::copy(tail.begin(), tail.end(), prompt.begin() + 20);
    }
    const RunResult rb = b.run(10 + i, prompt);
    // Never longer than the timeout (plus scheduling slack on a loaded machine).
    EXPECT_LT(rb.wait, 3s) << "request " << i;
    if (i == 0) {
      EXPECT_EQ(rb.host_hit_tokens, 40u);
    }
  }
  EXPECT_TRUE(b.drain());
  const RemoteStoreStats st = b.store().stats();
  EXPECT_GT(st.errors + st.timeouts, 0u);
  b.tier().check_invariants();
  EXPECT_EQ(b.remote().pinned_for_puts(), 0u);
}

TEST_F(RemoteTierTest, FullServerSkipsStores) {
  test::RedisServer server({"--maxmemory-policy", "noeviction"});
  ASSERT_TRUE(server.start());
  // Full from the start: with noeviction, every write is refused with OOM.
  test::Client client(server.port());
  ASSERT_EQ(client.command({"CONFIG", "SET", "maxmemory", "1"}), "OK");
  Engine a(server.port(), "ns");
  for (std::uint32_t i = 0; i < 4; ++i) a.run(1 + i, tokens(10 + i, 42));
  ASSERT_TRUE(a.drain());
  const RemoteTierStats s = a.remote().stats();
  EXPECT_EQ(s.puts, 40u);
  EXPECT_EQ(s.puts_skipped_full, 40u);
  EXPECT_EQ(s.stored_blocks, 0u);
  EXPECT_EQ(a.store().stats().skipped_full, 40u);
  EXPECT_EQ(a.remote().pinned_for_puts(), 0u);
  a.tier().check_invariants();
}

// kOnHostEviction: nothing is put while blocks sit in the host tier; a block is put when the
// host tier evicts it, from a copy taken before its slot is reused. A second engine then loads
// those blocks, and run() checks every loaded byte against the prefix (a copy taken after the
// slot was overwritten would carry the wrong block's bytes under a valid checksum).
TEST_F(RemoteTierTest, HostEvictionStoresBlocksASecondEngineLoads) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  RemoteTierConfig rc;
  rc.policy = PrefetchPolicy::kWaitComplete;
  rc.store_policy = RemoteStorePolicy::kOnHostEviction;
  rc.eviction_staging_blocks = 16;
  constexpr std::int32_t kSmallHost = 12;
  {
    Engine a(server.port(), "ns", rc, 500ms, kSmallHost);
    a.run(1, kPrompt);  // 10 blocks into the host tier (12 slots): nothing evicted, nothing put
    ASSERT_TRUE(a.drain());
    EXPECT_EQ(a.remote().stats().puts, 0u);
    EXPECT_EQ(a.tier().stats().host_evictions, 0u);
    // Two other prompts of 10 blocks each: the host tier evicts the first prompt's blocks.
    // Drained after each: the staging buffers are free again (puts still in flight would hold
    // them, and evictions beyond them are skipped).
    a.run(2, tokens(20, 42));
    ASSERT_TRUE(a.drain());
    a.run(3, tokens(30, 42));
    ASSERT_TRUE(a.drain());
    const RemoteTierStats s = a.remote().stats();
    const std::uint64_t evictions = a.tier().stats().host_evictions;
    EXPECT_GE(evictions, 10u);
    EXPECT_EQ(s.eviction_puts, evictions);  // every evicted block was put, none skipped
    EXPECT_EQ(s.puts, s.eviction_puts);
    EXPECT_EQ(s.stored_blocks, s.puts);
    EXPECT_EQ(s.puts_skipped, 0u);
    EXPECT_EQ(s.puts_failed, 0u);
    a.tier().check_invariants();
  }
  // The first prompt's blocks are in Redis only because they were evicted from a's host tier.
  Engine b(server.port(), "ns", rc, 500ms, kSmallHost);
  const RunResult rb = b.run(1, kPrompt);  // bytes checked inside run()
  EXPECT_EQ(rb.host_hit_tokens, 40u);
  EXPECT_EQ(rb.computed_tokens, kPrompt.size() - 40);
  EXPECT_EQ(b.remote().stats().loaded_blocks, 10u);
  EXPECT_EQ(b.store().stats().checksum_failures, 0u);
}

// kOnHostEviction with every staging buffer in use: evictions beyond them are skipped and
// counted, never blocking; a store that is down fails the puts (counted), nothing stays pinned.
TEST_F(RemoteTierTest, HostEvictionStagingFullOrStoreDownIsACountedSkip) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  RemoteTierConfig rc;
  rc.store_policy = RemoteStorePolicy::kOnHostEviction;
  rc.eviction_staging_blocks = 3;
  {
    Engine a(server.port(), "ns", rc, 500ms, 10);
    a.run(1, kPrompt);
    ASSERT_TRUE(a.drain());
    a.run(2, tokens(20, 42));  // evicts 10 blocks in one call: 3 staged, 7 skipped
    ASSERT_TRUE(a.drain());
    const RemoteTierStats s = a.remote().stats();
    EXPECT_EQ(a.tier().stats().host_evictions, 10u);
    EXPECT_EQ(s.eviction_puts, 3u);
    EXPECT_EQ(s.stored_blocks, 3u);
    EXPECT_EQ(s.puts_skipped, 7u);
  }
  const std::uint16_t port = server.port();
  server.kill();
  Engine d(port, "ns", rc, 200ms, 10);
  d.run(1, kPrompt);
  d.run(2, tokens(20, 42));
  ASSERT_TRUE(d.drain());
  const RemoteTierStats s = d.remote().stats();
  EXPECT_EQ(s.eviction_puts, 3u);
  EXPECT_EQ(s.stored_blocks, 0u);
  EXPECT_EQ(s.puts_failed, 3u);
  EXPECT_EQ(d.remote().pinned_for_puts(), 0u);
  d.tier().check_invariants();
}

TEST(RemoteTierConfigTest, HostEvictionWithoutStagingIsRejected) {
  KVCacheManagerConfig c;
  c.num_blocks = 8;
  c.block_size = kBs;
  HostTierConfig h;
  h.num_host_blocks = 4;
  TieredKVCacheManager tier(c, h);
  // A store that is never contacted: the constructor throws first.
  RedisStoreConfig sc;
  sc.port = test::free_port();
  sc.name_space = "ns";
  RedisStore store(sc);
  std::vector<std::byte> host(5 * 64);
  RemoteTierConfig rc;
  rc.bytes_per_block = 64;
  rc.store_policy = RemoteStorePolicy::kOnHostEviction;
  rc.eviction_staging_blocks = 0;
  EXPECT_THROW(RemoteTier(tier, store, host, rc), Error);
}

// A timeout meant as "never" (milliseconds::max()) overflowed a request's deadline (now +
// timeout) or the destructor's (now + drain_timeout): above a day is refused by name.
TEST(RemoteTierConfigTest, HugeTimeoutsAreRejectedByName) {
  KVCacheManagerConfig c;
  c.num_blocks = 8;
  c.block_size = kBs;
  HostTierConfig h;
  h.num_host_blocks = 4;
  TieredKVCacheManager tier(c, h);
  RedisStoreConfig sc;  // never contacted
  sc.port = test::free_port();
  sc.name_space = "ns";
  RedisStore store(sc);
  std::vector<std::byte> host(5 * 64);
  for (const bool drain : {false, true}) {
    for (const auto t : {std::chrono::milliseconds::max(), std::chrono::milliseconds(86400001),
                         std::chrono::milliseconds(-1)}) {
      RemoteTierConfig rc;
      rc.bytes_per_block = 64;
      (drain ? rc.drain_timeout : rc.timeout) = t;
      testing::expect_error([&] { RemoteTier r(tier, store, host, rc); },
                            ErrorCode::kInvalidArgument, drain ? "drain_timeout" : "timeout");
    }
  }
  RemoteTierConfig rc;
  rc.bytes_per_block = 64;
  rc.timeout = std::chrono::hours(24);
  rc.drain_timeout = std::chrono::milliseconds(0);
  RemoteTier r(tier, store, host, rc);  // the bounds are accepted
}

// A hasher that is not collision resistant is served: values are bound to prefix identities.
TEST(RemoteTierConfigTest, AHasherThatIsNotCollisionResistantIsServed) {
  KVCacheManagerConfig c;
  c.num_blocks = 8;
  c.block_size = kBs;
  c.hasher = BlockHasher::weak_for_testing(HashScheme::kSha256, "remote-tier-test", 8);
  HostTierConfig h;
  h.num_host_blocks = 4;
  TieredKVCacheManager tier(c, h);
  RedisStoreConfig sc;
  sc.port = test::free_port();
  sc.name_space = "ns";
  RedisStore store(sc);
  std::vector<std::byte> host(5 * 64);
  RemoteTierConfig rc;
  rc.bytes_per_block = 64;
  EXPECT_TRUE(tier.uses_prefix_identities());
  EXPECT_NO_THROW(RemoteTier(tier, store, host, rc));
}

// xxh3_128 (issue 37): a second engine loads the first one's prefix through Redis, every byte
// checked; values carry the blocks' prefix identities.
TEST_F(RemoteTierTest, Xxh3SecondEngineLoadsTheFirstOnesPrefix) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  {
    Engine a(server.port(), "ns-x", {}, 500ms, kHostBlocks, HashScheme::kXxh3_128);
    EXPECT_TRUE(a.tier().uses_prefix_identities());
    EXPECT_EQ(a.run(1, kPrompt).computed_tokens, kPrompt.size());
    ASSERT_TRUE(a.drain());
    EXPECT_EQ(a.remote().stats().stored_blocks, 10u);
  }
  RemoteTierConfig rc;
  rc.policy = PrefetchPolicy::kWaitComplete;
  Engine b(server.port(), "ns-x", rc, 500ms, kHostBlocks, HashScheme::kXxh3_128);
  const RunResult rb = b.run(7, kPrompt);
  EXPECT_EQ(rb.host_hit_tokens, 40u);
  EXPECT_EQ(rb.computed_tokens, kPrompt.size() - 40);  // bytes checked inside run()
  EXPECT_EQ(b.remote().stats().loaded_blocks, 10u);
  EXPECT_EQ(b.remote().stats().rejected_values, 0u);
}

// Forced collisions (issue 37): with a weak test hasher (4 bits) prompts whose block 0 differs
// but hashes alike have equal keys, parent hashes and groups for block 0 and for every later
// block with equal tokens. The second engine's gets find the first engine's values under its
// keys; their prefix identities differ, so each is a counted miss (rejected_values) and the
// request computes its tokens: never another prefix's K/V (checked byte for byte in run()).
TEST_F(RemoteTierTest, CollidingKeysOfAnotherPrefixAreRejectedNeverLoaded) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  const auto weak = [] {
    return BlockHasher::weak_for_testing(HashScheme::kXxh3_128, "remote-collide", 4);
  };
  RemoteTierConfig rc;
  rc.policy = PrefetchPolicy::kWaitComplete;
  Engine a(server.port(), "ns-c", rc, 500ms, kHostBlocks, HashScheme::kXxh3_128, weak());
  EXPECT_EQ(a.run(1, kPrompt).computed_tokens, kPrompt.size());
  ASSERT_TRUE(a.drain());
  const Request x = a.tier().make_request(99, kPrompt);
  // y: another block 0 with x's block-0 hash, then x's tokens.
  std::vector<TokenId> y_prompt;
  for (TokenId v = 2000; v < 4000 && y_prompt.empty(); ++v) {
    std::vector<TokenId> p = kPrompt;
    p[0] = v;
    const Request y = a.tier().make_request(98, p);
    if (y.block_hashes()[0] == x.block_hashes()[0]) y_prompt = p;
  }
  ASSERT_FALSE(y_prompt.empty());
  Engine b(server.port(), "ns-c", rc, 500ms, kHostBlocks, HashScheme::kXxh3_128, weak());
  const RunResult rb = b.run(7, y_prompt);
  EXPECT_EQ(rb.host_hit_tokens, 0u);
  EXPECT_EQ(rb.computed_tokens, y_prompt.size());  // bytes checked inside run()
  const RemoteTierStats s = b.remote().stats();
  EXPECT_GE(s.probe_hit_blocks, 1u);
  EXPECT_EQ(s.loaded_blocks, 0u);
  EXPECT_GE(s.rejected_values, 1u);
  EXPECT_GE(b.store().stats().binding_mismatches, 1u);
  // b wrote y's blocks under the colliding keys (the last writer of a key wins): now x misses
  // there the same way, in a third engine.
  ASSERT_TRUE(b.drain());
  Engine c(server.port(), "ns-c", rc, 500ms, kHostBlocks, HashScheme::kXxh3_128, weak());
  const RunResult rc2 = c.run(8, kPrompt);
  EXPECT_EQ(rc2.host_hit_tokens, 0u);
  EXPECT_EQ(rc2.computed_tokens, kPrompt.size());
  EXPECT_GE(c.remote().stats().rejected_values, 1u);
  EXPECT_EQ(c.remote().stats().loaded_blocks, 0u);
}

// The KV format (issue 37): an engine reading another KV dtype or scale mode than the writer's
// misses every value (counted), never loads one.
TEST_F(RemoteTierTest, AnotherKVFormatIsACountedMiss) {
  test::RedisServer server;
  ASSERT_TRUE(server.start());
  {
    Engine a(server.port(), "ns-f");
    EXPECT_EQ(a.run(1, kPrompt).computed_tokens, kPrompt.size());
    ASSERT_TRUE(a.drain());
  }
  for (const auto& [dtype, scales] : {std::pair<int, int>{0, 0}, std::pair<int, int>{1, 1}}) {
    RemoteTierConfig rc;
    rc.policy = PrefetchPolicy::kWaitComplete;
    rc.kv_dtype = static_cast<std::uint8_t>(dtype);
    rc.kv_scale_mode = static_cast<std::uint8_t>(scales);
    Engine b(server.port(), "ns-f", rc);
    const RunResult rb = b.run(7, kPrompt);
    EXPECT_EQ(rb.host_hit_tokens, 0u);
    EXPECT_EQ(rb.computed_tokens, kPrompt.size());
    const RemoteTierStats s = b.remote().stats();
    EXPECT_EQ(s.probe_hit_blocks, 10u);
    EXPECT_EQ(s.loaded_blocks, 0u);
    EXPECT_GE(s.rejected_values, 1u);
    EXPECT_GE(b.store().stats().format_mismatches, 1u);
    EXPECT_EQ(b.store().stats().header_mismatches, 0u);
  }
}

}  // namespace
}  // namespace pagedkv
