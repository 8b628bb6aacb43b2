// KVIndexer over real loopback sockets: several engines (each a KVCacheManager publishing
// through its own KVEventPublisher on tcp://127.0.0.1:*) and one indexer. After each scenario
// the index must equal every engine's own pool contents.
#define MSGPACK_NO_BOOST
#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <zmq.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <thread>

#include "pagedkv/base/error.hpp"
#include "pagedkv/events/indexer.hpp"
#include "pagedkv/events/publisher.hpp"
#include "pagedkv/events/router.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "tcp_proxy.hpp"

// GCC 12's -Wrestrict false positive on `"literal" + std::to_string(i)` (GCC bug 105329),
// reported or not depending on how much of this file gets inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

namespace pagedkv::events {
namespace {

using namespace std::chrono_literals;

constexpr std::uint32_t kBlockSize = 4;

struct Engine {
  KVCacheManager manager;
  std::unique_ptr<KVEventPublisher> publisher;
  std::mt19937 rng;
  TokenId token_base = 0;  // engines with different bases share no block

  Engine(std::uint32_t seed, KVEventPublisherConfig pc, std::int32_t num_blocks = 64)
      : manager(config(num_blocks)), rng(seed) {
    pc.probe_hasher = manager.hasher();
    publisher = std::make_unique<KVEventPublisher>(std::move(pc));
  }
  static KVCacheManagerConfig config(std::int32_t num_blocks) {
    KVCacheManagerConfig c;
    c.num_blocks = num_blocks;
    c.block_size = kBlockSize;
    c.hash_scheme = HashScheme::kSha256CborVllm;
    c.enable_kv_events = true;
    return c;
  }

  // One request with one of a few shared prefixes (hits, and evictions once the pool fills),
  // published as one batch per request like a scheduler step.
  void step(RequestId id) {
    std::vector<TokenId> tokens(static_cast<std::size_t>(rng() % 40 + 5));
    const TokenId prefix = static_cast<TokenId>(rng() % 6) * 1000;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = token_base +
                  (i < 12 ? prefix + static_cast<TokenId>(i) : static_cast<TokenId>(rng() % 50000));
    }
    Request r = manager.make_request(id, tokens);
    const CacheHit hit = manager.get_computed_blocks(r);
    if (manager.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit)) manager.free(r);
    publisher->publish(manager.take_events());
  }
  void steps(int n, RequestId first) {
    for (int i = 0; i < n; ++i) step(first + static_cast<RequestId>(i));
  }

  // The truth: ids of the blocks the pool has cached (group 0).
  std::vector<std::uint64_t> cached_ids() const {
    std::vector<std::uint64_t> ids;
    const BlockPool& pool = manager.block_pool();
    for (BlockId b = 1; b < pool.num_blocks(); ++b) {
      const KVCacheBlock& blk = pool.block(b);
      if (blk.is_cached() && blk.group_id == 0) ids.push_back(blk.block_hash.event_id());
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
  }
  std::uint64_t published() const { return publisher->stats().published_batches; }
};

KVEventPublisherConfig loopback(int hwm = 100000) {
  KVEventPublisherConfig c;
  c.endpoint = "tcp://127.0.0.1:*";
  c.replay_endpoint = "tcp://127.0.0.1:*";
  c.hwm = hwm;
  return c;
}

KVIndexerConfig indexer_config(int rcvhwm = 100000) {
  KVIndexerConfig c;
  c.hasher = BlockHasher(HashScheme::kSha256CborVllm);
  c.probe_block_size = kBlockSize;
  c.rcvhwm = rcvhwm;
  c.replay_timeout = 2000ms;
  return c;
}

EngineEndpoints endpoints_of(const std::string& name, const Engine& e) {
  return {name, e.publisher->endpoint(), e.publisher->replay_endpoint()};
}

void expect_converged(const KVIndexer& indexer, EngineId id, Engine& e) {
  ASSERT_TRUE(e.publisher->flush(10s));
  ASSERT_TRUE(indexer.wait_for(id, e.published(), 20s))
      << "engine " << id << " stuck at " << indexer.status(id).next_seq.value_or(0) << " of "
      << e.published();
  EXPECT_EQ(indexer.engine_ids(id, Tier::kGpu), e.cached_ids()) << "engine " << id;
  EXPECT_TRUE(indexer.engine_ids(id, Tier::kCpu).empty());
}

// Polls `pred` until it holds or `timeout` passes; true when it held.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// The engine's publisher comes back on the same ports (bind, as a restarted engine would).
KVEventPublisherConfig same_ports(const std::string& pub, const std::string& replay) {
  KVEventPublisherConfig pc = loopback();
  pc.endpoint = pub;
  pc.bind = true;  // vLLM's heuristic would connect to an address without '*'
  pc.replay_endpoint = replay;
  return pc;
}

// After a (re)connection the subscription reaches the engine's PUB socket at a moment nobody
// can observe, and a batch published before that is seen only when a later one arrives (vLLM's
// wire has no heartbeat). So: one batch at a time until the indexer has caught up, then compare.
void expect_follows(const KVIndexer& indexer, EngineId id, Engine& e, RequestId first) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  for (RequestId r = first;; ++r) {
    const std::uint64_t before = e.published();
    while (e.published() == before) e.step(r++);  // a step may publish nothing (all hits)
    ASSERT_TRUE(e.publisher->flush(10s));
    if (indexer.wait_for(id, e.published(), 200ms)) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "engine " << id << " stuck at " << indexer.status(id).next_seq.value_or(0) << " of "
        << e.published();
  }
  expect_converged(indexer, id, e);
}

TEST(KVIndexer, SeveralEnginesConvergeAndRoute) {
  std::vector<std::unique_ptr<Engine>> engines;
  for (std::uint32_t i = 0; i < 3; ++i)
    engines.push_back(std::make_unique<Engine>(i + 1, loopback()));
  // Engine 0 publishes before the indexer exists: those batches can only come by replay.
  engines[0]->steps(20, 1000);
  ASSERT_TRUE(engines[0]->publisher->flush(10s));
  KVIndexer indexer(indexer_config());
  for (std::size_t i = 0; i < engines.size(); ++i) {
    EXPECT_EQ(indexer.connect_engine(endpoints_of("e" + std::to_string(i), *engines[i])), i);
    EXPECT_EQ(indexer.status(i).probe, ProbeResult::kAgreed);
  }
  indexer.start();
  std::this_thread::sleep_for(300ms);
  for (int round = 0; round < 5; ++round) {
    for (std::size_t i = 0; i < engines.size(); ++i)
      engines[i]->steps(30, 10000 * (round + 1) + 100 * i);
  }
  for (std::size_t i = 0; i < engines.size(); ++i) expect_converged(indexer, i, *engines[i]);
  EXPECT_GT(indexer.status(0).batches_replayed, 0u);  // the history before the indexer came
  EXPECT_EQ(indexer.status(0).gaps_lost, 0u);

  // A prompt cached on engine 1 only: the router sends it there.
  std::vector<TokenId> prompt(40);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(900000 + i);
  Request r = engines[1]->manager.make_request(1, prompt);
  const CacheHit hit = engines[1]->manager.get_computed_blocks(r);
  ASSERT_TRUE(engines[1]->manager.allocate_slots(r, r.num_tokens() - hit.num_tokens, hit));
  engines[1]->publisher->publish(engines[1]->manager.take_events());
  expect_converged(indexer, 1, *engines[1]);
  std::vector<std::uint64_t> ids;
  for (const BlockHash& h : r.block_hashes()) ids.push_back(h.event_id());
  KVRouter router(indexer);
  const RouteDecision d = router.route(ids, std::vector<double>{0, 0, 0});
  EXPECT_EQ(d.engine, 1u);
  EXPECT_EQ(d.matches[1].gpu_prefix_blocks, ids.size());
  engines[1]->manager.free(r);
}

TEST(KVIndexer, EngineRestartIsDetectedAndReindexed) {
  auto a = std::make_unique<Engine>(11, loopback());
  KVIndexer indexer(indexer_config());
  const EngineId id = indexer.connect_engine(endpoints_of("a", *a));
  indexer.start();
  std::this_thread::sleep_for(300ms);
  a->steps(60, 1);
  expect_converged(indexer, id, *a);
  const std::string pub = a->publisher->endpoint();
  const std::string replay = *a->publisher->replay_endpoint();
  a.reset();  // the engine dies
  // It comes back on the same ports with an empty cache and a new stream (seq from 0).
  auto b = std::make_unique<Engine>(12, same_ports(pub, replay));
  // The indexer sees the connection drop and come back, and the probe answers a new
  // incarnation: a restart, known before the new engine publishes anything.
  ASSERT_TRUE(eventually([&] { return indexer.status(id).restarts == 1; }, 20s));
  expect_follows(indexer, id, *b, 5000);
  ASSERT_LT(b->published(), 60u);  // its sequence numbers are below the old stream's next_seq
  const EngineStatus st = indexer.status(id);
  EXPECT_EQ(st.restarts, 1u);
  EXPECT_EQ(st.reconnects, 1u);
  EXPECT_EQ(st.unverified_resyncs, 0u);
  EXPECT_TRUE(st.connected);
  EXPECT_EQ(st.incarnation, b->publisher->incarnation());
  EXPECT_EQ(st.next_seq, b->published());
}

// Issue 14 follow-up: the restarted engine publishes more batches than the old one had before the
// indexer hears any of them, so its sequence numbers reach or pass the expected one and never
// look like a reset. The index must still drop the old process's blocks.
// `probed`: the indexer knows the engine's incarnation (a pagedkv publisher answering the probe);
// otherwise it is treated as a stock vLLM, whose incarnation cannot be told.
void restart_with_higher_sequence_numbers(KVIndexerConfig ic, bool probed) {
  auto a = std::make_unique<Engine>(51, loopback());
  KVIndexer indexer(std::move(ic));
  const EngineId id = indexer.connect_engine(endpoints_of("a", *a));
  indexer.start();
  ASSERT_TRUE(eventually([&] { return indexer.status(id).connected; }, 10s));
  a->steps(4, 1);
  expect_follows(indexer, id, *a, 100);
  const std::uint64_t expected = indexer.status(id).next_seq.value();  // e.g. 5: seq 0..4 seen
  const std::vector<std::uint64_t> old_ids = a->cached_ids();
  ASSERT_FALSE(old_ids.empty());
  const std::string pub = a->publisher->endpoint();
  const std::string replay = *a->publisher->replay_endpoint();
  a.reset();  // the engine dies
  // The new process publishes seq 0 .. expected + 4 at once, before the indexer's SUB has
  // reconnected (ZeroMQ waits its reconnect interval, 100 ms, after the disconnect): the indexer
  // receives none of them, and the first number it could hear is past the expected one.
  auto b = std::make_unique<Engine>(52, same_ports(pub, replay));
  b->token_base = 5'000'000;  // other blocks than the old process's
  for (RequestId r = 1000; b->published() < expected + 5; ++r) b->step(r);
  ASSERT_TRUE(b->publisher->flush(10s));
  const auto truth = b->cached_ids();
  for (std::uint64_t old_id : old_ids) {
    ASSERT_FALSE(std::binary_search(truth.begin(), truth.end(), old_id));
  }
  // No further batch: the indexer must notice the new process by itself.
  const bool converged = eventually(
      [&] {
        return indexer.status(id).next_seq == b->published() &&
               indexer.engine_ids(id, Tier::kGpu) == truth;
      },
      10s);
  const auto indexed = indexer.engine_ids(id, Tier::kGpu);
  std::size_t stale = 0;
  for (std::uint64_t x : indexed) stale += std::binary_search(old_ids.begin(), old_ids.end(), x);
  EXPECT_TRUE(converged) << "next_seq " << indexer.status(id).next_seq.value_or(0) << " of "
                         << b->published() << "; " << indexed.size() << " ids indexed, " << stale
                         << " of them the dead process's";
  EXPECT_EQ(stale, 0u);
  EngineStatus st = indexer.status(id);
  EXPECT_EQ(st.reconnects, 1u);
  EXPECT_EQ(st.restarts, probed ? 1u : 0u);            // a new incarnation id
  EXPECT_EQ(st.unverified_resyncs, probed ? 0u : 1u);  // no id: dropped and rebuilt anyway
  // And it follows the new stream afterwards.
  expect_follows(indexer, id, *b, 2000);
  st = indexer.status(id);
  EXPECT_EQ(st.gaps_lost, 0u);
  EXPECT_EQ(st.reconnects, 1u);
}

TEST(KVIndexer, RestartWithHigherSequenceNumbersDropsTheOldProcessBlocks) {
  restart_with_higher_sequence_numbers(indexer_config(), /*probed=*/true);
}

TEST(KVIndexer, StockEngineRestartWithHigherSequenceNumbersIsRebuilt) {
  // No hasher: no probe, so the engine's incarnation is unknown, as for a stock vLLM (which
  // ignores the probe). Every reconnect then rebuilds the engine's entries from its replay.
  KVIndexerConfig ic = indexer_config();
  ic.hasher.reset();
  restart_with_higher_sequence_numbers(ic, /*probed=*/false);
}

TEST(KVIndexer, ReconnectToTheSameEngineKeepsItsEntries) {
  // A network blip: the engine stays up, its PUB connection (through a proxy) is cut and refused
  // for a while, during which the engine publishes batches the indexer never receives. On the
  // reconnect the probe answers the same incarnation: the entries are kept and only the missed
  // batches are asked from the replay socket (the gap rules), not the history from 0.
  Engine a(61, loopback());
  const std::string pub = a.publisher->endpoint();
  testing::TcpProxy proxy(static_cast<std::uint16_t>(std::stoi(pub.substr(pub.rfind(':') + 1))));
  KVIndexer indexer(indexer_config());
  const EngineId id =
      indexer.connect_engine({"a", proxy.endpoint(), a.publisher->replay_endpoint()});
  ASSERT_EQ(indexer.status(id).probe, ProbeResult::kAgreed);
  indexer.start();
  ASSERT_TRUE(eventually([&] { return indexer.status(id).connected; }, 10s));
  a.steps(30, 1);
  expect_follows(indexer, id, a, 100);
  const EngineStatus before = indexer.status(id);
  EXPECT_EQ(before.incarnation, a.publisher->incarnation());

  proxy.refuse(true);
  proxy.cut();
  ASSERT_TRUE(eventually([&] { return !indexer.status(id).connected; }, 10s));
  // Meanwhile the router gives the engine no credit for what the index still holds.
  const std::vector<std::uint64_t> cached = indexer.engine_ids(id, Tier::kGpu);
  ASSERT_FALSE(cached.empty());
  KVRouter router(indexer);
  EXPECT_FALSE(indexer.status(id).in_sync);
  EXPECT_EQ(router.route(std::vector<std::uint64_t>{cached.front()}, std::vector<double>{0})
                .matches[0]
                .prefix_blocks,
            0u);
  for (RequestId r = 100; a.published() < before.next_seq.value() + 10; ++r) a.step(r);
  ASSERT_TRUE(a.publisher->flush(10s));
  const std::uint64_t missed = a.published() - before.next_seq.value();
  EXPECT_EQ(indexer.status(id).next_seq, before.next_seq);  // none of them arrived
  proxy.refuse(false);
  ASSERT_TRUE(eventually(
      [&] {
        const EngineStatus st = indexer.status(id);
        return st.reconnects == 1 && st.next_seq == a.published();
      },
      10s))
      << "next_seq " << indexer.status(id).next_seq.value_or(0) << " of " << a.published();
  EXPECT_EQ(indexer.engine_ids(id, Tier::kGpu), a.cached_ids());
  const EngineStatus st = indexer.status(id);
  EXPECT_TRUE(st.connected);
  ASSERT_TRUE(eventually([&] { return indexer.in_sync(id); }, 10s));
  const std::uint64_t still = a.cached_ids().front();
  EXPECT_EQ(router.route(std::vector<std::uint64_t>{still}, std::vector<double>{0})
                .matches[0]
                .gpu_prefix_blocks,
            1u);
  EXPECT_EQ(st.restarts, 0u);
  EXPECT_EQ(st.unverified_resyncs, 0u);
  EXPECT_EQ(st.gaps_lost, 0u);
  EXPECT_EQ(st.batches_replayed - before.batches_replayed, missed);  // from next_seq, not from 0
  EXPECT_GE(proxy.accepted(), 2);  // the first connection and the reconnect
  expect_follows(indexer, id, a, 1000);
}

TEST(KVRouter, SkipsAnEngineWhoseConnectionIsDown) {
  // Two engines followed over ZeroMQ, b through a proxy. b is idle and a is loaded, so with
  // both up b wins a request that neither caches; while b's connection is down (cut and
  // refused) every request goes to a; when b is back it wins again. With every engine down the
  // router still picks one (among all), and says which were down.
  Engine a(71, loopback());
  Engine b(72, loopback());
  const std::string pub = b.publisher->endpoint();
  testing::TcpProxy proxy(static_cast<std::uint16_t>(std::stoi(pub.substr(pub.rfind(':') + 1))));
  KVIndexer indexer(indexer_config());
  const EngineId ia =
      indexer.connect_engine({"a", a.publisher->endpoint(), a.publisher->replay_endpoint()});
  const EngineId ib =
      indexer.connect_engine({"b", proxy.endpoint(), b.publisher->replay_endpoint()});
  indexer.start();
  ASSERT_TRUE(eventually([&] { return indexer.reachable(ia) && indexer.reachable(ib); }, 10s));
  KVRouter router(indexer);
  const std::vector<std::uint64_t> uncached{0x1234567};
  std::vector<double> loads(2, 0.0);
  loads[ia] = 5;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(router.route(uncached, loads).engine, ib);

  proxy.refuse(true);
  proxy.cut();
  ASSERT_TRUE(eventually([&] { return !indexer.status(ib).connected; }, 10s));
  EXPECT_FALSE(indexer.reachable(ib));
  EXPECT_TRUE(indexer.reachable(ia));
  for (int i = 0; i < 3; ++i) {  // the round-robin cursor moves: every position is tried
    const RouteDecision d = router.route(uncached, loads);
    EXPECT_EQ(d.engine, ia);
    EXPECT_TRUE(d.down[ib]);
    EXPECT_FALSE(d.down[ia]);
  }
  // Every engine down: still a pick, among all of them (the least loaded here).
  std::vector<bool> all_down(2, true);
  EXPECT_EQ(router.pick(std::vector<PrefixMatch>(2), 1, loads, nullptr, all_down), ib);
  EXPECT_THROW(router.pick(std::vector<PrefixMatch>(2), 1, loads, nullptr, {true}), Error);

  proxy.refuse(false);
  ASSERT_TRUE(eventually([&] { return indexer.reachable(ib); }, 10s));
  EXPECT_EQ(router.route(uncached, loads).engine, ib);
  // An in-process engine has no connection to lose.
  KVIndexer local;
  const EngineId e = local.add_engine("in-process");
  EXPECT_TRUE(local.reachable(e));
  EXPECT_THROW((void)local.reachable(e + 1), Error);
}

TEST(KVIndexer, EngineRestartedWithAnotherHashIsReportedNotRefused) {
  // connect_engine() refuses such an engine; after a reconnect the receiver thread cannot throw:
  // the engine is reported (kDisagreed) and its old entries are dropped all the same.
  auto a = std::make_unique<Engine>(71, loopback());
  KVIndexer indexer(indexer_config());
  const EngineId id = indexer.connect_engine(endpoints_of("a", *a));
  indexer.start();
  ASSERT_TRUE(eventually([&] { return indexer.status(id).connected; }, 10s));
  a->steps(10, 1);
  expect_follows(indexer, id, *a, 100);
  ASSERT_FALSE(indexer.engine_ids(id, Tier::kGpu).empty());
  KVEventPublisherConfig pc =
      same_ports(a->publisher->endpoint(), *a->publisher->replay_endpoint());
  a.reset();
  pc.probe_hasher = BlockHasher(HashScheme::kSha256CborVllm, "another seed");
  KVEventPublisher b(pc);
  ASSERT_TRUE(eventually([&] { return indexer.status(id).reconnects == 1; }, 10s));
  const EngineStatus st = indexer.status(id);
  EXPECT_EQ(st.probe, ProbeResult::kDisagreed);
  EXPECT_EQ(st.restarts, 1u);
  EXPECT_EQ(st.incarnation, b.incarnation());
  EXPECT_TRUE(indexer.engine_ids(id, Tier::kGpu).empty());
}

TEST(KVIndexer, TinyHighWaterMarksLoseMessagesButReplayRecoversThem) {
  std::vector<std::unique_ptr<Engine>> engines;
  KVIndexer indexer(indexer_config(/*rcvhwm=*/1));
  for (std::uint32_t i = 0; i < 2; ++i) {
    engines.push_back(std::make_unique<Engine>(21 + i, loopback(/*hwm=*/1)));
    indexer.connect_engine(endpoints_of("e" + std::to_string(i), *engines[i]));
  }
  indexer.start();
  std::this_thread::sleep_for(300ms);
  std::thread t0([&] { engines[0]->steps(400, 1); });
  engines[1]->steps(400, 100000);
  t0.join();
  // A loss is seen when the next batch arrives: a few more, slowly, let the indexer notice.
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(50ms);
    for (std::size_t e = 0; e < engines.size(); ++e) engines[e]->step(900000 + 10 * i + e);
  }
  for (std::size_t i = 0; i < engines.size(); ++i) {
    expect_converged(indexer, i, *engines[i]);
    const EngineStatus st = indexer.status(i);
    EXPECT_EQ(st.gaps_lost, 0u);
    std::printf("engine %zu: %llu batches, %llu gaps, %llu replayed\n", i,
                (unsigned long long)st.batches_applied, (unsigned long long)st.gaps,
                (unsigned long long)st.batches_replayed);
  }
}

TEST(KVIndexer, UnrecoverableLossLeavesOnlyBlocksTheEngineHolds) {
  // No replay socket: a batch that never arrives cannot be recovered. The engine's entries are
  // dropped and rebuilt from what follows, so the index never claims a block the engine lacks.
  KVIndexer indexer;
  const EngineId e = indexer.add_engine("in-process");
  Engine eng(31, [] {
    KVEventPublisherConfig c;
    c.endpoint = "inproc://unused";
    return c;
  }());
  WireOptions wire;
  std::uint64_t seq = 0;
  for (RequestId r = 0; r < 200; ++r) {
    Request req = eng.manager.make_request(r, std::vector<TokenId>(8, static_cast<TokenId>(r % 7)));
    const CacheHit hit = eng.manager.get_computed_blocks(req);
    if (eng.manager.allocate_slots(req, req.num_tokens() - hit.num_tokens, hit))
      eng.manager.free(req);
    const auto events = eng.manager.take_events();
    if (events.empty()) continue;
    std::string payload;
    encode_event_batch(events, 0, wire, payload);
    const std::uint64_t s = seq++;
    if (s % 10 == 3) continue;  // lost on the way
    indexer.apply(e, s, {reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size()});
  }
  const auto indexed = indexer.engine_ids(e, Tier::kGpu);
  const auto truth = eng.cached_ids();
  EXPECT_TRUE(std::includes(truth.begin(), truth.end(), indexed.begin(), indexed.end()));
  EXPECT_GT(indexer.status(e).gaps_lost, 0u);
}

TEST(KVIndexer, InProcessSequenceResetIsARestart) {
  // apply() has no connection to watch: a sequence number below the expected one is a restart.
  KVIndexer indexer;
  const EngineId e = indexer.add_engine("in-process");
  const auto batch = [](std::uint64_t id) {
    std::array<std::uint8_t, 16> digest{};
    for (int i = 0; i < 8; ++i) digest[15 - i] = static_cast<std::uint8_t>(id >> (8 * i));
    BlockStored stored;
    stored.block_hashes.emplace_back(digest);
    stored.block_size = 1;
    stored.token_ids = {1};
    stored.extra_keys.resize(1);
    KVEvent ev;
    ev.data = stored;
    std::string payload;
    encode_event_batch(std::span<const KVEvent>(&ev, 1), 0, WireOptions{}, payload);
    return std::vector<std::uint8_t>(payload.begin(), payload.end());
  };
  for (std::uint64_t s = 0; s < 5; ++s) indexer.apply(e, s, batch(100 + s));
  EXPECT_EQ(indexer.engine_ids(e, Tier::kGpu).size(), 5u);
  indexer.apply(e, 0, batch(7));  // a new publisher
  EXPECT_EQ(indexer.engine_ids(e, Tier::kGpu), std::vector<std::uint64_t>{7});
  EXPECT_EQ(indexer.status(e).restarts, 1u);
  EXPECT_EQ(indexer.status(e).next_seq, 1u);
  // An in-process engine has no connection to lose: always in sync, so the router credits it.
  EXPECT_TRUE(indexer.in_sync(e));
  EXPECT_TRUE(indexer.status(e).in_sync);
  EXPECT_THROW((void)indexer.in_sync(e + 1), Error);
  KVRouter router(indexer);
  EXPECT_EQ(router.route(std::vector<std::uint64_t>{7}, std::vector<double>{0})
                .matches[0]
                .gpu_prefix_blocks,
            1u);
}

TEST(KVIndexer, RefusesAnEngineThatHashesDifferently) {
  KVEventPublisherConfig pc = loopback();
  pc.probe_hasher = BlockHasher(HashScheme::kSha256, "other-seed");
  KVEventPublisher publisher(pc);
  KVIndexer indexer(indexer_config());
  try {
    indexer.connect_engine({"mismatch", publisher.endpoint(), publisher.replay_endpoint()});
    ADD_FAILURE() << "an engine hashing with another scheme was accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(err.what()).find("hashes blocks differently"), std::string::npos)
        << err.what();
  }
  EXPECT_EQ(indexer.num_engines(), 0u);
  // Same scheme, different seed: refused too.
  pc.probe_hasher = BlockHasher(HashScheme::kSha256CborVllm, "another seed");
  pc.endpoint = "tcp://127.0.0.1:*";
  pc.replay_endpoint = "tcp://127.0.0.1:*";
  KVEventPublisher seeded(pc);
  EXPECT_THROW(indexer.connect_engine({"seed", seeded.endpoint(), seeded.replay_endpoint()}),
               Error);
}

TEST(KVIndexer, SilentReplaySocketReadsAsUnverified) {
  // A peer that never answers (a stock vLLM ignores the probe frame): indexed, marked unanswered.
  KVEventPublisherConfig pc = loopback();
  pc.replay_endpoint.reset();
  KVEventPublisher publisher(pc);
  KVIndexerConfig ic = indexer_config();
  ic.probe_timeout = 200ms;
  KVIndexer indexer(ic);
  EXPECT_EQ(indexer.connect_engine({"no-replay", publisher.endpoint(), std::nullopt}), 0u);
  EXPECT_EQ(indexer.status(0).probe, ProbeResult::kNotAsked);
  // A replay endpoint nobody serves: no answer within the timeout, indexed as unverified.
  EXPECT_EQ(indexer.connect_engine({"silent", publisher.endpoint(), "tcp://127.0.0.1:1"}), 1u);
  EXPECT_EQ(indexer.status(1).probe, ProbeResult::kUnanswered);
}

// --- issue 41: a hostile engine beside an honest one ---

std::array<std::uint8_t, 16> digest_of(std::uint64_t id) {
  std::array<std::uint8_t, 16> d{};
  for (int i = 0; i < 8; ++i) d[15 - i] = static_cast<std::uint8_t>(id >> (8 * i));
  return d;
}

// A batch storing `ids` (one token per block) on the medium.
std::vector<std::uint8_t> stored_batch(std::span<const std::uint64_t> ids,
                                       const std::string& medium = "GPU") {
  BlockStored s;
  for (std::uint64_t id : ids) s.block_hashes.emplace_back(digest_of(id));
  s.block_size = 1;
  s.token_ids.assign(ids.size(), 1);
  s.extra_keys.resize(ids.size());
  s.medium = medium;
  KVEvent ev;
  ev.data = std::move(s);
  std::string payload;
  encode_event_batch(std::span<const KVEvent>(&ev, 1), 0, WireOptions{}, payload);
  return {payload.begin(), payload.end()};
}

std::vector<std::uint8_t> clears_batch(int n) {
  std::vector<KVEvent> evs(static_cast<std::size_t>(n));
  for (auto& ev : evs) ev.data = AllBlocksCleared{};
  std::string payload;
  encode_event_batch(evs, 0, WireOptions{}, payload);
  return {payload.begin(), payload.end()};
}

std::vector<std::uint64_t> random_ids(std::mt19937_64& rng, std::size_t n) {
  std::vector<std::uint64_t> ids(n);
  for (auto& id : ids) id = rng() | 1;  // never the honest engine's (even) ids
  return ids;
}

// An honest engine of 300,000 blocks (even ids) fed in-process; returns them sorted.
std::vector<std::uint64_t> feed_honest(KVIndexer& indexer, EngineId h, std::uint64_t& seq) {
  std::mt19937_64 rng(5);
  std::vector<std::uint64_t> all;
  for (int b = 0; b < 300; ++b) {
    std::vector<std::uint64_t> ids(1000);
    for (auto& id : ids) id = rng() & ~1ull;
    indexer.apply(h, seq++, stored_batch(ids));
    all.insert(all.end(), ids.begin(), ids.end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

// Caller errors of apply() and engine_ids(): before, apply() fed a connect_engine() engine (two
// threads on its state), took seq 2^64-1 (next_seq wrapped to 0) and engine_ids() of an unknown
// engine returned an empty list.
TEST(KVIndexer, ApplyAndEngineIdsRefuseCallerErrors) {
  KVEventPublisherConfig pc = loopback();
  pc.replay_endpoint.reset();
  KVEventPublisher publisher(pc);
  KVIndexerConfig ic = indexer_config();
  ic.hasher.reset();
  KVIndexer indexer(ic);
  const EngineId c = indexer.connect_engine({"connected", publisher.endpoint(), std::nullopt});
  const EngineId e = indexer.add_engine("in-process");
  const auto batch = stored_batch(std::vector<std::uint64_t>{3});
  auto code_of = [&](auto&& call) {
    try {
      call();
    } catch (const Error& err) {
      return std::optional<ErrorCode>(err.code());
    }
    return std::optional<ErrorCode>();
  };
  EXPECT_EQ(code_of([&] { indexer.apply(c, 0, batch); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { indexer.apply(e, ~std::uint64_t{0}, batch); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { indexer.apply(e, std::uint64_t{1} << 63, batch); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { indexer.apply(e + 1, 0, batch); }), ErrorCode::kOutOfRange);
  EXPECT_EQ(code_of([&] { (void)indexer.engine_ids(e + 1, Tier::kGpu); }), ErrorCode::kOutOfRange);
  // Nothing changed.
  EXPECT_FALSE(indexer.status(c).next_seq.has_value());
  EXPECT_FALSE(indexer.status(e).next_seq.has_value());
  EXPECT_EQ(indexer.num_entries(), 0u);
  indexer.apply(e, (std::uint64_t{1} << 63) - 1, batch);  // the largest accepted
  EXPECT_EQ(indexer.engine_ids(e, Tier::kGpu), std::vector<std::uint64_t>{3});
}

// Durations outside 0 ms .. 1 day are refused, naming the setting. Before, replay_timeout went
// to ZeroMQ's int send timeout unchecked (a negative one blocks forever; above 2^31 ms it wrapped)
// and now() + a huge replay_deadline or backoff overflowed the clock.
TEST(KVIndexer, ConfigDurationsAreBounded) {
  using std::chrono::milliseconds;
  for (const milliseconds bad : {milliseconds(-1), milliseconds::max(),
                                 milliseconds(std::chrono::hours(24)) + milliseconds(1)}) {
    for (int field = 0; field < 4; ++field) {
      KVIndexerConfig c;
      const char* name = "";
      switch (field) {
        case 0:
          c.probe_timeout = bad, name = "probe_timeout";
          break;
        case 1:
          c.replay_timeout = bad, name = "replay_timeout";
          break;
        case 2:
          c.replay_deadline = bad, name = "replay_deadline";
          break;
        default:
          c.replay_backoff = bad, name = "replay_backoff";
          break;
      }
      try {
        KVIndexer indexer(c);
        ADD_FAILURE() << name << " = " << bad.count() << " ms accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      }
    }
  }
  KVIndexerConfig edge;
  edge.probe_timeout = edge.replay_timeout = edge.replay_deadline = edge.replay_backoff =
      kMaxIndexerWait;
  EXPECT_NO_THROW(KVIndexer{edge});
  edge.replay_timeout = edge.replay_backoff = milliseconds(0);
  EXPECT_NO_THROW(KVIndexer{edge});
}

// wait_for(milliseconds::max()) waits until the engine is there. Before, now() + timeout
// overflowed the clock (UBSan stops here), the deadline fell in the past and it returned false
// at its first look.
TEST(KVIndexer, WaitForWithTheLargestTimeoutWaits) {
  KVIndexer indexer;
  const EngineId e = indexer.add_engine("late");
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    indexer.apply(e, 0, stored_batch(std::vector<std::uint64_t>{5}));
  });
  const bool reached = indexer.wait_for(e, 1, std::chrono::milliseconds::max());
  later.join();
  EXPECT_TRUE(reached);
  EXPECT_EQ(indexer.engine_ids(e, Tier::kGpu), std::vector<std::uint64_t>{5});
}

// Before: every AllBlocksCleared and every undecodable payload rebuilt the whole shared table
// under the exclusive lock (20 clears with 1M honest blocks: 2.2 s). Now they cost the hostile
// engine's own entries. 1,000 clears and 200 bad payloads beside 300,000 honest blocks took
// seconds before; the bound is loose (about 50x what they take now in a Release build).
TEST(KVIndexerHostile, ClearsAndBadBatchesCostOnlyTheirEngine) {
  KVIndexer indexer;
  const EngineId h = indexer.add_engine("honest");
  const EngineId x = indexer.add_engine("hostile");
  std::uint64_t hs = 0, xs = 0;
  const auto honest = feed_honest(indexer, h, hs);
  const std::vector<std::uint64_t> chain(honest.begin(), honest.begin() + 64);
  const auto clears = clears_batch(20);
  const std::vector<std::uint8_t> junk{0x93, 0xc1, 0xc1, 0xc1};
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i) indexer.apply(x, xs++, clears);
  for (int i = 0; i < 200; ++i) indexer.apply(x, xs++, junk);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 1000.0) << "1,000 clears and 200 bad payloads of an empty engine";
  const EngineStatus st = indexer.status(x);
  EXPECT_EQ(st.clears, 1000u);
  EXPECT_EQ(st.bad_batches, 200u);
  EXPECT_EQ(indexer.engine_ids(h, Tier::kGpu), honest);
  EXPECT_EQ(indexer.match(chain)[h].gpu_prefix_blocks, 64u);
}

// Before: bytes after a valid batch were ignored and the batch applied.
TEST(KVIndexerHostile, TrailingBytesAfterAValidBatchAreRejected) {
  KVIndexer indexer;
  const EngineId x = indexer.add_engine("hostile");
  const std::vector<std::uint64_t> ids{2, 4, 6};
  auto payload = stored_batch(ids);
  payload.push_back(0xc0);  // a msgpack nil after the batch
  indexer.apply(x, 0, payload);
  EXPECT_TRUE(indexer.engine_ids(x, Tier::kGpu).empty());
  EXPECT_EQ(indexer.status(x).bad_batches, 1u);
}

// Before: a table only grew (one engine claiming millions of fake blocks kept 128 MB after they
// went).
TEST(KVIndexerHostile, MemoryComesBackWhenAnEnginesEntriesGo) {
  KVIndexer indexer;
  const EngineId h = indexer.add_engine("honest");
  const EngineId x = indexer.add_engine("hostile");
  std::mt19937_64 rng(9);
  std::vector<std::uint64_t> mine(1000);
  for (auto& id : mine) id = rng() & ~1ull;
  indexer.apply(h, 0, stored_batch(mine));
  const std::size_t before = indexer.memory_bytes();
  std::uint64_t xs = 0;
  for (int b = 0; b < 20; ++b) indexer.apply(x, xs++, stored_batch(random_ids(rng, 10000)));
  const std::size_t full = indexer.memory_bytes();
  EXPECT_GT(full, 10 * before);
  indexer.apply(x, xs++, clears_batch(1));
  EXPECT_LE(indexer.memory_bytes(), 2 * before)
      << before << " B before, " << full << " B full, " << indexer.memory_bytes() << " B after";
  EXPECT_EQ(indexer.engine_ids(h, Tier::kGpu).size(), 1000u);
}

// While another engine's replay holds the receiver thread, `e` takes 40 steps (5 ms apart) and
// must be indexed within 10 s of its last; returns the seconds from its first step until then.
double keep_publishing(KVIndexer& indexer, EngineId id, Engine& e, const char* during) {
  const auto t0 = std::chrono::steady_clock::now();
  for (RequestId r = 1000; r < 1040; ++r) {
    e.step(r);
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_TRUE(e.publisher->flush(10s));
  EXPECT_TRUE(indexer.wait_for(id, e.published(), 10s))
      << "engine stuck at " << indexer.status(id).next_seq.value_or(0) << " of " << e.published()
      << " during " << during;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The entry cap, every payload reason counted, and the honest engine untouched throughout.
TEST(KVIndexerHostile, CapAndDroppedPayloadReasonsLeaveTheHonestEngineAlone) {
  KVIndexerConfig ic;
  ic.max_entries_per_engine = 5000;
  ic.decode.max_bytes = 1 << 20;
  ic.decode.max_elements = 100'000;
  KVIndexer indexer(ic);
  const EngineId h = indexer.add_engine("honest");
  const EngineId x = indexer.add_engine("hostile");
  std::uint64_t hs = 0, xs = 0;
  std::mt19937_64 rng(3);
  std::vector<std::uint64_t> honest(4000);
  for (auto& id : honest) id = rng() & ~1ull;
  indexer.apply(h, hs++, stored_batch(honest));
  // Fake ids past the cap: 12,000 claimed, 5,000 kept, the rest counted.
  for (int b = 0; b < 3; ++b) indexer.apply(x, xs++, stored_batch(random_ids(rng, 4000)));
  EngineStatus st = indexer.status(x);
  EXPECT_EQ(st.gpu_blocks, 5000u);
  EXPECT_EQ(st.ids_over_cap, 7000u);
  indexer.apply(x, xs++, stored_batch(random_ids(rng, 10), "CPU"));  // the cap counts both media
  EXPECT_EQ(indexer.status(x).cpu_blocks, 0u);
  EXPECT_EQ(indexer.status(x).ids_over_cap, 7010u);
  // Payloads refused, one reason each.
  auto trailing = stored_batch(random_ids(rng, 3));
  trailing.push_back(0);
  indexer.apply(x, xs++, trailing);
  indexer.apply(x, xs++, std::vector<std::uint8_t>((1 << 20) + 1, 0x90));  // too large
  indexer.apply(x, xs++, stored_batch(random_ids(rng, 40000)));            // 120,000 values
  indexer.apply(x, xs++, std::vector<std::uint8_t>(5000, 0x91));           // nested 5,000 deep
  indexer.apply(x, xs++, std::vector<std::uint8_t>{0xc1});                 // not msgpack
  indexer.apply(x, xs++, std::vector<std::uint8_t>{0x92, 0x01, 0x02});     // not a KVEventBatch
  st = indexer.status(x);
  EXPECT_EQ(st.dropped.trailing_bytes, 1u);
  EXPECT_EQ(st.dropped.too_large, 1u);
  EXPECT_EQ(st.dropped.too_many_elements, 2u);
  EXPECT_EQ(st.dropped.malformed, 2u);
  EXPECT_EQ(st.bad_batches, 6u);
  EXPECT_EQ(st.dropped.total(), 6u);
  EXPECT_EQ(st.gpu_blocks, 0u);  // a bad batch drops the engine's entries (rebuilt after)
  // The honest engine: untouched, still indexed, still following its stream.
  std::sort(honest.begin(), honest.end());
  EXPECT_EQ(indexer.engine_ids(h, Tier::kGpu), honest);
  const std::vector<std::uint64_t> more{1000000, 1000002};
  indexer.apply(h, hs++, stored_batch(more));
  EXPECT_EQ(indexer.match(more)[h].gpu_prefix_blocks, 2u);
  const EngineStatus hst = indexer.status(h);
  EXPECT_EQ(hst.dropped.total(), 0u);
  EXPECT_EQ(hst.gaps_lost, 0u);
  EXPECT_EQ(hst.ids_over_cap, 0u);
  EXPECT_EQ(hst.next_seq, hs);
}

// A hostile engine on real sockets: its PUB socket sends frames of every malformed kind, and its
// replay socket answers a replay request forever without the end marker. Before, the replay
// timeout applied per reply, so the receiver thread stayed in the replay as long as the peer
// kept talking and the honest engine beside it was not indexed (its sequence number frozen);
// the malformed frames were dropped without being counted.
struct HostileEngine {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  zmq::socket_t router{ctx, zmq::socket_type::router};
  std::string pub_endpoint, replay_endpoint;
  std::atomic<bool> stop{false};
  std::atomic<int> requests{0};
  std::string clears;  // "clears" mode's frame: 500 AllBlocksCleared events
  std::thread server;

  // mode: "junk" (frames of a wrong count, every 2 ms), "valid" (batches of 20,000 ids with
  // increasing sequence numbers, every 2 ms), "clears" (batches of 500 AllBlocksCleared, no
  // block id, every 2 ms) or "silent" (requests counted, never answered). Stops
  // by itself after `for_how_long`.
  HostileEngine(std::string mode, std::chrono::milliseconds for_how_long) {
    pub.set(zmq::sockopt::linger, 0);
    router.set(zmq::sockopt::linger, 0);
    pub.bind("tcp://127.0.0.1:*");
    router.bind("tcp://127.0.0.1:*");
    pub_endpoint = pub.get(zmq::sockopt::last_endpoint);
    replay_endpoint = router.get(zmq::sockopt::last_endpoint);
    const auto c = clears_batch(500);
    clears.assign(c.begin(), c.end());
    server = std::thread([this, mode, for_how_long] {
      std::mt19937_64 rng(17);
      const auto end = std::chrono::steady_clock::now() + for_how_long;
      std::optional<zmq::message_t> peer;
      std::uint64_t next = 0;
      while (!stop && std::chrono::steady_clock::now() < end) {
        zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(2));
        if (item.revents & ZMQ_POLLIN) {
          zmq::message_t id;
          (void)router.recv(id);
          for (bool more = id.more(); more;) {  // the rest of the request
            zmq::message_t part;
            (void)router.recv(part);
            more = part.more();
          }
          peer.emplace(std::move(id));
          ++requests;
          if (mode == "silent") peer.reset();  // never answers
        }
        if (!peer) continue;
        if (mode == "clears") {
          if (next > 20'000) continue;  // never the end marker
          zmq::message_t to_peer(peer->data(), peer->size());
          router.send(to_peer, zmq::send_flags::sndmore);
          router.send(zmq::message_t(), zmq::send_flags::sndmore);
          char seq[8];
          put_seq(next++, seq);
          router.send(zmq::buffer(seq, 8), zmq::send_flags::sndmore);
          router.send(zmq::buffer(clears), zmq::send_flags::none);
          continue;
        }
        zmq::message_t to(peer->data(), peer->size());
        router.send(to, zmq::send_flags::sndmore);
        router.send(zmq::message_t(), zmq::send_flags::sndmore);
        if (mode == "junk") {
          router.send(zmq::str_buffer("junk"), zmq::send_flags::sndmore);
          router.send(zmq::str_buffer("more junk"), zmq::send_flags::sndmore);
          router.send(zmq::str_buffer("and more"), zmq::send_flags::none);
        } else {
          char seq[8];
          put_seq(next++, seq);
          router.send(zmq::buffer(seq, 8), zmq::send_flags::sndmore);
          const auto p = stored_batch(random_ids(rng, 20000));
          router.send(zmq::buffer(p.data(), p.size()), zmq::send_flags::none);
        }
      }
    });
  }
  ~HostileEngine() {
    stop = true;
    server.join();
  }
  void send_raw(std::vector<std::string> frames) {
    for (std::size_t i = 0; i < frames.size(); ++i) {
      pub.send(zmq::buffer(frames[i]),
               i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  static std::string seq_frame(std::uint64_t s) {
    char f[8];
    put_seq(s, f);
    return std::string(f, 8);
  }
  EngineId connect_to(KVIndexer& indexer) {
    return indexer.connect_engine({"hostile", pub_endpoint, replay_endpoint});
  }
  // Joins late: publishes `payload` at seq 1,000,000 (a gap: the indexer asks the replay socket
  // for 0 on) until the replay request arrives; false if none came within 10 s.
  bool join_late(const std::string& payload) {
    return eventually(
        [&] {
          send_raw({"", seq_frame(1'000'000), payload});
          return requests.load() > 0;
        },
        std::chrono::seconds(10));
  }
};

void endless_replay_beside_an_honest_engine(const std::string& mode) {
  Engine honest(81, loopback());
  KVIndexerConfig ic = indexer_config();
  ic.hasher.reset();  // no probes: replays only
  ic.replay_deadline = 1500ms;
  ic.max_replay_ids = 100'000;
  KVIndexer indexer(ic);
  const EngineId h = indexer.connect_engine(endpoints_of("honest", honest));
  HostileEngine hostile(mode, 30s);
  const EngineId x = hostile.connect_to(indexer);
  indexer.start();
  ASSERT_TRUE(eventually([&] { return indexer.status(x).connected; }, 10s));
  honest.steps(5, 1);
  expect_follows(indexer, h, honest, 100);
  // The hostile engine joins at seq 1,000,000: the indexer asks its replay socket for 0 on.
  const std::string payload = [] {
    const auto p = stored_batch(std::vector<std::uint64_t>{3, 5});
    return std::string(p.begin(), p.end());
  }();
  ASSERT_TRUE(hostile.join_late(payload));
  // Meanwhile the honest engine keeps publishing: it must keep being indexed.
  const double waited = keep_publishing(indexer, h, honest, "the hostile replay");
  std::printf("honest engine caught up %.2f s after the hostile replay began (%s)\n", waited,
              mode.c_str());
  EXPECT_EQ(indexer.engine_ids(h, Tier::kGpu), honest.cached_ids());
  ASSERT_TRUE(eventually(
      [&] {
        const EngineStatus st = indexer.status(x);
        return st.replays_aborted_deadline + st.replays_aborted_size > 0;
      },
      10s));
  const EngineStatus st = indexer.status(x);
  if (mode == "junk") {
    EXPECT_EQ(st.replays_aborted_deadline, 1u);
    EXPECT_GT(st.dropped.wrong_frame_count, 10u);
  } else {
    EXPECT_EQ(st.replays_aborted_size, 1u);  // 100,000 ids: after 5 frames
  }
  EXPECT_FALSE(st.in_sync);  // not trusted until its backoff ends
  // Its entries went with the replay: only what followed it (the batch that asked) is indexed.
  EXPECT_LE(st.gpu_blocks, 2u);
  // Within the backoff a new gap is not replayed again.
  hostile.send_raw({"", HostileEngine::seq_frame(2'000'000), payload});
  ASSERT_TRUE(eventually([&] { return indexer.status(x).replays_skipped > 0; }, 10s));
  EXPECT_EQ(hostile.requests.load(), 1);
  expect_follows(indexer, h, honest, 5000);
}

TEST(KVIndexerHostile, EndlessJunkReplayDoesNotStallAnHonestEngine) {
  endless_replay_beside_an_honest_engine("junk");
}

TEST(KVIndexerHostile, EndlessValidReplayIsBoundedBySize) {
  endless_replay_beside_an_honest_engine("valid");
}

// A replay socket that takes requests and never answers. Before, every gapped batch asked it
// again and waited replay_timeout (1 s by default): a hostile engine skipping one number per
// batch held the receiver thread nearly all the time (an honest engine beside it had 1 of 298
// batches applied in 6 s). Now silence abandons the replay as its bounds do: one request, then
// replay_backoff, gaps meanwhile are losses (replays_skipped).
TEST(KVIndexerHostile, SilentReplaySocketStartsTheBackoff) {
  Engine honest(83, loopback());
  KVIndexerConfig ic = indexer_config();
  ic.hasher.reset();  // no probes: replays only
  ic.replay_timeout = 200ms;
  KVIndexer indexer(ic);
  const EngineId h = indexer.connect_engine(endpoints_of("honest", honest));
  HostileEngine hostile("silent", 60s);
  const EngineId x = hostile.connect_to(indexer);
  indexer.start();
  ASSERT_TRUE(eventually([&] { return indexer.status(x).connected; }, 10s));
  honest.steps(5, 1);
  expect_follows(indexer, h, honest, 100);
  const auto p = stored_batch(std::vector<std::uint64_t>{3, 5});
  const std::string payload(p.begin(), p.end());
  // A late join at 1,000,000: the indexer asks the replay socket for 0 on, and hears nothing.
  ASSERT_TRUE(hostile.join_late(payload));
  // Every further batch skips a number: each is a gap, none is asked for (before: each was, and
  // replays_skipped stayed 0).
  std::uint64_t seq = 2'000'000;
  ASSERT_TRUE(eventually(
      [&] {
        hostile.send_raw({"", HostileEngine::seq_frame(seq), payload});
        seq += 2;
        return indexer.status(x).replays_skipped >= 5;
      },
      10s));
  const EngineStatus st = indexer.status(x);
  EXPECT_EQ(st.replays_aborted_silent, 1u);
  EXPECT_EQ(hostile.requests.load(), 1);
  EXPECT_FALSE(st.in_sync);  // not trusted until its backoff ends
  EXPECT_LE(st.gpu_blocks, 2u);
  for (RequestId r = 1000; r < 1020; ++r) honest.step(r);
  expect_follows(indexer, h, honest, 5000);
}

// stop() while the receiver waits for a replay that does not come: before, neither the replay
// nor the drain loop looked at the stop flag, so stop() waited out replay_timeout (here 60 s)
// for every gapped batch queued; now it returns within ~50 ms (bound: 5 s).
TEST(KVIndexerHostile, StopReturnsDuringASilentReplay) {
  KVIndexerConfig ic = indexer_config();
  ic.hasher.reset();
  ic.replay_timeout = 60s;
  ic.replay_deadline = 120s;
  KVIndexer indexer(ic);
  HostileEngine hostile("silent", 60s);
  const EngineId x = hostile.connect_to(indexer);
  indexer.start();
  ASSERT_TRUE(eventually([&] { return indexer.status(x).connected; }, 10s));
  const auto p = stored_batch(std::vector<std::uint64_t>{3});
  const std::string payload(p.begin(), p.end());
  ASSERT_TRUE(hostile.join_late(payload));
  // More gapped batches queued behind the one waiting for its replay.
  for (std::uint64_t s = 1'000'002; s < 1'000'010; s += 2) {
    hostile.send_raw({"", HostileEngine::seq_frame(s), payload});
  }
  const auto t0 = std::chrono::steady_clock::now();
  indexer.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

// A replay of events that carry no block id (AllBlocksCleared): max_replay_ids never tripped, so
// a replay could keep up to max_replay_frames (20,000) frames decoded (one 16 MiB frame holds
// 2^19 such events, ~9x its size once decoded), until replay_deadline. Now max_replay_events
// bounds what a replay holds.
TEST(KVIndexerHostile, ReplayOfEventsWithoutIdsIsBoundedByEvents) {
  KVIndexerConfig ic = indexer_config();
  ic.hasher.reset();
  ic.replay_deadline = 3000ms;
  ic.max_replay_events = 2000;  // the 5th frame of 500 passes it
  KVIndexer indexer(ic);
  HostileEngine hostile("clears", 60s);
  const EngineId x = hostile.connect_to(indexer);
  indexer.start();
  ASSERT_TRUE(eventually([&] { return indexer.status(x).connected; }, 10s));
  const auto p = stored_batch(std::vector<std::uint64_t>{3});
  const std::string payload(p.begin(), p.end());
  ASSERT_TRUE(hostile.join_late(payload));
  ASSERT_TRUE(eventually(
      [&] {
        const EngineStatus st = indexer.status(x);
        return st.replays_aborted_deadline + st.replays_aborted_size > 0;
      },
      10s));
  const EngineStatus st = indexer.status(x);
  EXPECT_EQ(st.replays_aborted_size, 1u);
  EXPECT_EQ(st.replays_aborted_deadline, 0u);
  EXPECT_EQ(st.clears, 0u);  // nothing of the abandoned replay was applied
  KVIndexerConfig bad = indexer_config();
  bad.max_replay_events = 0;
  try {
    KVIndexer refused(bad);
    ADD_FAILURE() << "max_replay_events 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("max_replay_events"), std::string::npos);
  }
}

// A replay peer that cannot be reached: its replay endpoint is a listener on 127.0.0.1 that
// never accepts, so no ZeroMQ connection to it ever completes. The replay socket's send must
// not wait for one: its sndtimeo is replay_timeout (here 30 s), and the receiver thread that
// would wait in it serves every engine. The send queues the request (ZMQ_IMMEDIATE is 0, and
// the socket is fresh for each replay, so its high-water mark is never reached), and the replay
// then costs what a silent one does: up to replay_deadline (here 1 s). A send that waited for a
// connection (ZMQ_IMMEDIATE 1) held the healthy engine's batches 60 s (two frames, 30 s each);
// the bound here is 10 s.
TEST(KVIndexerHostile, UnreachableReplayPeerDoesNotStallTheOthers) {
  Engine healthy(85, loopback());
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::listen(listener, 1), 0);  // never accept()ed
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{listener};
  const std::string unreachable = "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  KVIndexerConfig ic = indexer_config();
  ic.hasher.reset();  // no probes: replays only
  ic.replay_timeout = 30s;
  ic.replay_deadline = 1s;
  KVIndexer indexer(ic);
  const EngineId h = indexer.connect_engine(endpoints_of("healthy", healthy));
  HostileEngine peer("junk", 0ms);  // its PUB socket only
  const EngineId x = indexer.connect_engine({"unreachable", peer.pub_endpoint, unreachable});
  indexer.start();
  ASSERT_TRUE(eventually([&] { return indexer.status(x).connected; }, 10s));
  healthy.steps(5, 1);
  expect_follows(indexer, h, healthy, 100);
  const auto p = stored_batch(std::vector<std::uint64_t>{3, 5});
  const std::string payload(p.begin(), p.end());
  // Its first batch (once its subscription is through), then a gap: a replay is asked.
  ASSERT_TRUE(eventually(
      [&] {
        peer.send_raw({"", HostileEngine::seq_frame(0), payload});
        return indexer.status(x).next_seq.has_value();
      },
      10s));
  peer.send_raw({"", HostileEngine::seq_frame(1'000'000), payload});
  ASSERT_TRUE(eventually([&] { return indexer.status(x).gaps == 1; }, 10s));
  // The receiver thread is in that replay now; the healthy engine keeps publishing.
  const double waited = keep_publishing(indexer, h, healthy, "the unreachable peer's replay");
  std::printf("healthy engine caught up %.2f s after the unreachable peer's replay began\n",
              waited);
  ASSERT_TRUE(eventually([&] { return indexer.status(x).replays_aborted_deadline > 0; }, 10s));
  const EngineStatus st = indexer.status(x);
  EXPECT_EQ(st.replays_aborted_deadline, 1u);
  EXPECT_EQ(st.replays_aborted_silent, 0u);
  EXPECT_FALSE(st.in_sync);  // not trusted until its backoff ends
  EXPECT_EQ(st.next_seq, 1'000'001u);
  expect_follows(indexer, h, healthy, 5000);
}

// Frames dropped on the SUB socket, each counted with its reason (before: dropped silently).
TEST(KVIndexerHostile, MalformedFramesAreCountedByReason) {
  KVIndexerConfig ic = indexer_config();
  ic.hasher.reset();
  KVIndexer indexer(ic);
  HostileEngine hostile("junk", 0ms);
  const EngineId x = indexer.connect_engine({"hostile", hostile.pub_endpoint, std::nullopt});
  indexer.start();
  ASSERT_TRUE(eventually([&] { return indexer.status(x).connected; }, 10s));
  const auto p = stored_batch(std::vector<std::uint64_t>{3});
  const std::string good(p.begin(), p.end());
  const std::string seq0 = HostileEngine::seq_frame(0);
  // Resent until counted (a subscription reaches the publisher at an unobservable moment).
  auto counted = [&](std::vector<std::string> frames, auto field) {
    return eventually(
        [&] {
          hostile.send_raw(frames);
          return indexer.status(x).dropped.*field > 0;
        },
        10s);
  };
  EXPECT_TRUE(counted({"", seq0}, &EngineStatus::Dropped::wrong_frame_count));
  EXPECT_TRUE(counted({"", seq0, good, "x"}, &EngineStatus::Dropped::wrong_frame_count));
  EXPECT_TRUE(counted({"", seq0.substr(0, 7), good}, &EngineStatus::Dropped::bad_seq_size));
  EXPECT_TRUE(counted({"", seq0 + "x", good}, &EngineStatus::Dropped::bad_seq_size));
  EXPECT_TRUE(counted({"", HostileEngine::seq_frame(1ull << 63), good},
                      &EngineStatus::Dropped::negative_seq));
  EXPECT_TRUE(counted({"", seq0, good + '\0'}, &EngineStatus::Dropped::trailing_bytes));
  EXPECT_TRUE(counted({"", seq0, "\xc1"}, &EngineStatus::Dropped::malformed));
  EXPECT_TRUE(indexer.engine_ids(x, Tier::kGpu).empty());
}

// A frame over decode.max_bytes never reaches the indexer's memory: ZeroMQ (ZMQ_MAXMSGSIZE on the
// SUB socket) closes the connection, which then reconnects and resynchronises (before: a payload
// of any size was received and decoded).
TEST(KVIndexerHostile, OversizedFrameClosesTheConnection) {
  KVIndexerConfig ic = indexer_config();
  ic.hasher.reset();
  ic.decode.max_bytes = 64 * 1024;
  KVIndexer indexer(ic);
  HostileEngine hostile("junk", 0ms);
  const EngineId x = indexer.connect_engine({"hostile", hostile.pub_endpoint, std::nullopt});
  indexer.start();
  ASSERT_TRUE(eventually([&] { return indexer.status(x).connected; }, 10s));
  const std::string huge(1 << 20, '\x90');
  EXPECT_TRUE(eventually(
      [&] {
        hostile.send_raw({"", HostileEngine::seq_frame(0), huge});
        return indexer.status(x).reconnects > 0;
      },
      10s));
  EXPECT_EQ(indexer.status(x).bad_batches, 0u);  // never decoded
}

// A BlockStored with an empty (default) BlockHash: before, publish() queued it and the sender
// thread's encode_event_batch threw with no handler (std::terminate). Now publish() refuses it,
// numbering and queuing nothing.
TEST(KVEventPublisher, PublishRefusesAnEmptyBlockHash) {
  KVEventPublisherConfig pc = loopback();
  pc.replay_endpoint.reset();
  KVEventPublisher publisher(pc);
  auto stored = [](std::optional<BlockHash> parent, BlockHash h) {
    BlockStored s;
    s.block_hashes = {BlockHash(digest_of(7)), h};
    s.parent_block_hash = parent;
    s.token_ids.assign(2, 1);
    s.block_size = 1;
    std::vector<KVEvent> ev(1);
    ev[0].data = std::move(s);
    return ev;
  };
  std::vector<std::vector<KVEvent>> bad;
  bad.push_back(stored(std::nullopt, BlockHash{}));
  bad.push_back(stored(BlockHash{}, BlockHash(digest_of(8))));
  {
    BlockRemoved r;
    r.block_hashes = {BlockHash{}};
    std::vector<KVEvent> ev(2);
    ev[0].data = AllBlocksCleared{};
    ev[1].data = std::move(r);
    bad.push_back(std::move(ev));
  }
  for (auto& ev : bad) {
    try {
      (void)publisher.publish(std::move(ev));
      ADD_FAILURE() << "accepted a batch with an empty block hash";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(publisher.stats().published_batches, 0u);
  EXPECT_EQ(publisher.stats().queued, 0u);
  EXPECT_EQ(publisher.publish(stored(BlockHash(digest_of(6)), BlockHash(digest_of(8)))), 0u);
  ASSERT_TRUE(publisher.flush(10s));
  EXPECT_EQ(publisher.stats().sent_batches, 1u);
  EXPECT_EQ(publisher.stats().encode_failures, 0u);
}

// A client sending replay requests nonstop, each answered with the whole replay buffer: before,
// the sender thread served requests as long as any were waiting, so published batches were never
// sent (flush() timed out) and shutdown() did not return while the client went on. Now it serves
// at most a few per turn and stops serving once shutdown() begins.
TEST(KVEventPublisher, RequestFloodStarvesNeitherTheQueueNorShutdown) {
  KVEventPublisherConfig pc = loopback();
  pc.buffer_steps = 5000;
  auto publisher = std::make_unique<KVEventPublisher>(pc);
  auto batch = [](std::uint64_t id) {  // 64 blocks: a replay copies ~5 MB
    BlockStored s;
    for (std::uint64_t b = 0; b < 64; ++b) s.block_hashes.emplace_back(digest_of(id * 64 + b));
    s.token_ids.assign(64, 1);
    s.block_size = 1;
    std::vector<KVEvent> ev(1);
    ev[0].data = std::move(s);
    return ev;
  };
  for (std::uint64_t i = 0; i < 5000; ++i) (void)publisher->publish(batch(i + 1));
  ASSERT_TRUE(publisher->flush(10s));
  zmq::context_t ctx{1};
  zmq::socket_t client(ctx, zmq::socket_type::dealer);
  client.set(zmq::sockopt::linger, 0);
  client.set(zmq::sockopt::sndhwm, 0);  // no bound: requests pile up at the publisher
  client.connect(*publisher->replay_endpoint());
  std::atomic<bool> flooding{true};
  std::thread flood([&] {
    char seq[8];
    put_seq(0, seq);
    // Replies are never read (the ROUTER drops them past its HWM). At most 300,000 requests:
    // more than the publisher serves in 10 s.
    for (int sent = 0; flooding && sent < 300'000; ++sent) {
      try {
        if (client.send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
          client.send(zmq::buffer(seq, 8), zmq::send_flags::none);
        }
      } catch (const zmq::error_t&) {
      }
      std::this_thread::yield();
    }
  });
  const bool flooded = eventually([&] { return publisher->stats().replays_served >= 5; }, 10s);
  (void)publisher->publish(batch(50'000));
  const bool flushed = publisher->flush(10s);
  auto down = std::async(std::launch::async, [&] { publisher->shutdown(); });
  const bool shut = down.wait_for(10s) == std::future_status::ready;
  flooding = false;  // lets the unbounded server of before finish, to report rather than hang
  flood.join();
  down.wait();
  EXPECT_TRUE(flooded);
  EXPECT_TRUE(flushed) << "a published batch was not sent while requests kept coming";
  EXPECT_TRUE(shut) << "shutdown() did not return within 10 s while requests kept coming";
}

// A probe request over kMaxProbeBytes: the replay socket (ZMQ_MAXMSGSIZE) drops the connection
// instead of unpacking it (before: any size was received, unpacked and hashed). The client's next
// probe, on the reconnected socket, is the first one answered.
TEST(KVEventPublisher, OversizedProbeRequestIsNotServed) {
  KVEventPublisherConfig pc = loopback();
  pc.probe_hasher = BlockHasher(HashScheme::kSha256CborVllm);
  KVEventPublisher publisher(pc);
  zmq::context_t ctx{1};
  zmq::socket_t client(ctx, zmq::socket_type::dealer);
  client.set(zmq::sockopt::linger, 0);
  client.connect(*publisher.replay_endpoint());
  auto probe = [&](const std::vector<TokenId>& tokens) {
    msgpack::sbuffer req;
    msgpack::pack(req, tokens);
    client.send(zmq::message_t(), zmq::send_flags::sndmore);
    client.send(zmq::buffer(kProbeTag), zmq::send_flags::sndmore);
    client.send(zmq::buffer(req.data(), req.size()), zmq::send_flags::none);
  };
  probe(std::vector<TokenId>(100'000, 0));  // ~100 KB
  const std::vector<TokenId> small{0, 1, 2, 3};
  std::vector<std::string> reply;
  ASSERT_TRUE(eventually(
      [&] {
        probe(small);
        zmq::pollitem_t item{client.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, std::chrono::milliseconds(200)) <= 0) return false;
        for (bool more = true; more;) {
          zmq::message_t m;
          (void)client.recv(m);
          more = m.more();
          reply.push_back(m.to_string());
        }
        return true;
      },
      10s));
  ASSERT_EQ(reply.size(), 3u);
  auto oh = msgpack::unpack(reply[2].data(), reply[2].size());
  std::map<std::string, msgpack::object> m;
  oh.get().convert(m);
  ASSERT_TRUE(m.count("hash"));
  const auto& bin = m.at("hash").via.bin;
  const BlockHash want = pc.probe_hasher->hash_block(pc.probe_hasher->none_hash(), small);
  EXPECT_EQ(std::vector<std::uint8_t>(bin.ptr, bin.ptr + bin.size),
            std::vector<std::uint8_t>(want.bytes().begin(), want.bytes().end()))
      << "the first answer was not the small probe's";
}

TEST(KVEventPublisher, FullQueueDropsOldestAndCountsIt) {
  KVEventPublisherConfig pc = loopback();
  pc.max_queue_size = 1;
  Engine e(41, pc);
  e.steps(2000, 1);
  ASSERT_TRUE(e.publisher->flush(10s));
  const KVEventPublisherStats st = e.publisher->stats();
  EXPECT_EQ(st.sent_batches + st.dropped_batches + st.send_failures, st.published_batches);
  std::printf("published %llu, sent %llu, dropped %llu\n", (unsigned long long)st.published_batches,
              (unsigned long long)st.sent_batches, (unsigned long long)st.dropped_batches);
  KVEventPublisherConfig bad = loopback();
  bad.buffer_steps = 0;
  EXPECT_THROW(KVEventPublisher{bad}, Error);
  // ZeroMQ's "linger forever": a subscriber that stops reading would hang shutdown().
  bad = loopback();
  bad.linger_ms = -1;
  try {
    KVEventPublisher p(bad);
    ADD_FAILURE() << "linger_ms -1 accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(err.what()).find("linger_ms"), std::string::npos) << err.what();
  }
}

// flush(milliseconds::max()) means "until drained". Before, now() + timeout overflowed the clock
// (signed overflow: UBSan stops here), the deadline fell in the past and a queue that was not yet
// empty returned false at once.
TEST(KVEventPublisher, FlushWithTheLargestTimeoutWaitsUntilDrained) {
  KVEventPublisherConfig pc = loopback();
  pc.replay_endpoint.reset();
  KVEventPublisher publisher(pc);
  for (std::uint64_t i = 0; i < 2000; ++i) {
    BlockStored s;
    for (std::uint64_t j = 0; j < 64; ++j)
      s.block_hashes.push_back(BlockHash(digest_of(i * 64 + j + 1)));
    s.token_ids.assign(64, 1);
    s.block_size = 1;
    std::vector<KVEvent> ev(1);
    ev[0].data = std::move(s);
    ASSERT_EQ(publisher.publish(std::move(ev)), i);
  }
  EXPECT_TRUE(publisher.flush(std::chrono::milliseconds::max()));
  const KVEventPublisherStats st = publisher.stats();
  EXPECT_EQ(st.queued, 0u);
  EXPECT_EQ(st.sent_batches + st.dropped_batches + st.send_failures, st.published_batches);
}

}  // namespace
}  // namespace pagedkv::events
