// KVIndexer over real loopback sockets: several engines (each a KVCacheManager publishing
// through its own KVEventPublisher on tcp://127.0.0.1:*) and one indexer. After each scenario
// the index must equal every engine's own pool contents.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <memory>
#include <random>
#include <thread>

#include "pagedkv/base/error.hpp"
#include "pagedkv/events/indexer.hpp"
#include "pagedkv/events/publisher.hpp"
#include "pagedkv/events/router.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "tcp_proxy.hpp"

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
}

}  // namespace
}  // namespace pagedkv::events
