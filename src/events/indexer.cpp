// KVIndexer (see pagedkv/events/indexer.hpp).
#define MSGPACK_NO_BOOST
#include "pagedkv/events/indexer.hpp"

#include <msgpack.hpp>
#include <zmq.hpp>

#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <shared_mutex>
#include <thread>
#include <utility>

#include "pagedkv/base/error.hpp"

namespace pagedkv::events {

namespace {

Tier tier_of(const std::optional<std::string>& medium) {
  // vLLM's media: "GPU" (or None: the engine's own cache), "CPU", "STORAGE"... Anything but the
  // GPU is a lower tier for routing.
  return !medium || *medium == kMediumGpu ? Tier::kGpu : Tier::kCpu;
}

std::span<const std::uint8_t> bytes_of(const zmq::message_t& m) {
  return {static_cast<const std::uint8_t*>(m.data()), m.size()};
}

}  // namespace

struct KVIndexer::Impl {
  struct Engine {
    EngineStatus st;
    std::optional<EngineEndpoints> endpoints;  // connected engines only
    std::optional<zmq::socket_t> sub;
    std::optional<zmq::socket_t> monitor;  // PAIR reading `sub`'s socket-monitor events
    std::optional<zmq::socket_t> dealer;   // replay and probe requests
    // Receiver thread only. A connection was lost: the next one must be resynchronised.
    bool resync_pending = false;
    bool handshaken = false;  // `sub` completed a handshake (may hold a peer's data)
    // After a resync's replay, batches below this came again on the new connection: skipped
    // until the first one at or above it (a connection delivers in order).
    std::optional<std::uint64_t> dup_below;
  };

  // What an engine answered to the probe.
  struct ProbeAnswer {
    bool answered = false;
    std::string error;    // set: it answered but could not hash, or the reply was malformed
    bool agrees = false;  // its digest equals ours
    std::string theirs;   // its scheme and digest (hex), for messages
    std::optional<std::uint64_t> incarnation;
  };

  KVIndexerConfig config;
  zmq::context_t ctx{1};
  mutable std::shared_mutex mu;  // guards index and every Engine::st
  BlockIndex index;
  // Reserved to BlockIndex::kMaxEngines: add_engine() never moves the elements the receiver
  // thread reads without the lock (it reads the count under it).
  std::vector<std::unique_ptr<Engine>> engines;
  std::thread thread;
  std::atomic<bool> stop{false};
  bool started = false;
  std::uint64_t monitor_serial = 0;  // names the monitors' inproc endpoints
  bool items_dirty = true;           // a SUB socket was replaced: rebuild the poll set

  // (Re)opens the engine's SUB socket with a fresh monitor, connected to its endpoint. A new
  // socket never delivers what an older connection had queued. Throws zmq::error_t.
  void open_sub(Engine& en) {
    en.sub.reset();
    en.monitor.reset();
    en.handshaken = false;
    items_dirty = true;
    zmq::socket_t sub(ctx, zmq::socket_type::sub);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::rcvhwm, config.rcvhwm);
    sub.set(zmq::sockopt::subscribe, config.topic);
    const std::string addr = "inproc://pagedkv-indexer-monitor-" + std::to_string(monitor_serial++);
    if (zmq_socket_monitor(sub.handle(), addr.c_str(),
                           ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED) != 0) {
      throw zmq::error_t();
    }
    zmq::socket_t monitor(ctx, zmq::socket_type::pair);
    monitor.set(zmq::sockopt::linger, 0);
    monitor.connect(addr);  // before sub connects: no event can be missed
    sub.connect(en.endpoints->endpoint);
    en.sub.emplace(std::move(sub));
    en.monitor.emplace(std::move(monitor));
  }

  void open_dealer(Engine& en) {
    en.dealer.emplace(ctx, zmq::socket_type::dealer);
    en.dealer->set(zmq::sockopt::linger, 0);
    en.dealer->set(zmq::sockopt::sndtimeo, static_cast<int>(config.replay_timeout.count()));
    en.dealer->connect(*en.endpoints->replay_endpoint);
  }

  // A fresh replay socket on the receiver thread, which must not throw: without one (e.g. out of
  // file descriptors) replays find nothing, so the sound rules apply (entries rebuilt), and the
  // next resync tries again.
  void renew_dealer(Engine& en) noexcept {
    try {
      open_dealer(en);
    } catch (const zmq::error_t&) {
      en.dealer.reset();
    }
  }

  // Receives one multipart message within `timeout`; empty when none came.
  static std::vector<zmq::message_t> recv_multipart(zmq::socket_t& s,
                                                    std::chrono::milliseconds timeout) {
    std::vector<zmq::message_t> frames;
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) <= 0) return frames;
    while (true) {
      zmq::message_t m;
      if (!s.recv(m, zmq::recv_flags::dontwait)) break;
      const bool more = m.more();
      frames.push_back(std::move(m));
      if (!more) break;
    }
    return frames;
  }

  // Batches [from, until) from the engine's replay socket, in order; fewer (or none) when the
  // engine no longer has them or does not answer.
  std::vector<std::pair<std::uint64_t, std::vector<std::uint8_t>>> fetch_replay(
      Engine& en, std::uint64_t from, std::uint64_t until) {
    std::vector<std::pair<std::uint64_t, std::vector<std::uint8_t>>> out;
    if (!en.dealer) return out;
    char seq[8];
    put_seq(from, seq);
    try {
      en.dealer->send(zmq::message_t(), zmq::send_flags::sndmore);
      en.dealer->send(zmq::buffer(seq, 8), zmq::send_flags::none);
      while (true) {
        auto frames = recv_multipart(*en.dealer, config.replay_timeout);
        if (frames.empty()) {  // no answer: drop the socket so a late reply cannot confuse us
          renew_dealer(en);
          return out;
        }
        if (frames.size() != 3 || frames[1].size() != 8) continue;  // not a replay reply
        const std::int64_t s = get_seq(bytes_of(frames[1]));
        if (s == kReplayEnd) return out;
        if (s < 0 || static_cast<std::uint64_t>(s) >= until) continue;
        const auto p = bytes_of(frames[2]);
        out.emplace_back(static_cast<std::uint64_t>(s),
                         std::vector<std::uint8_t>(p.begin(), p.end()));
      }
    } catch (const zmq::error_t&) {
      renew_dealer(en);
      return out;
    }
  }

  // Applies one decoded batch to the index (lock held).
  void apply_batch(EngineId e, Engine& en, const WireBatch& b) {
    for (const WireEvent& ev : b.events) {
      if (ev.type == WireEventType::kAllBlocksCleared) {
        index.clear_engine(e);
        ++en.st.clears;
        continue;
      }
      if (ev.group_idx != 0) continue;
      const Tier t = tier_of(ev.medium);
      for (const std::uint64_t id : ev.block_ids) {
        if (ev.type == WireEventType::kBlockStored) {
          index.add(id, e, t);
        } else {
          index.remove(id, e, t);
        }
      }
    }
    ++en.st.batches_applied;
  }

  void lose(EngineId e, Engine& en) {
    index.clear_engine(e);
    ++en.st.gaps_lost;
  }

  // The sequence rules of the header, for one received batch.
  void ingest(EngineId e, std::uint64_t seq, std::span<const std::uint8_t> payload) {
    Engine& en = *engines[e];
    if (en.dup_below) {
      if (seq < *en.dup_below) return;  // already applied from the resync's replay
      en.dup_below.reset();
    }
    std::optional<WireBatch> current;
    try {
      current = decode_event_batch(payload);
    } catch (const Error&) {
    }
    std::optional<std::uint64_t> from;
    {
      std::unique_lock lock(mu);
      EngineStatus& st = en.st;
      if (!current) {  // its contents are lost: rebuild from what follows
        ++st.bad_batches;
        lose(e, en);
        st.next_seq = seq + 1;
        return;
      }
      if (!st.next_seq) {
        if (seq > 0) from = 0;  // joined late
      } else if (seq < *st.next_seq) {
        index.clear_engine(e);  // a new publisher: the engine restarted
        ++st.restarts;
        if (seq > 0) from = 0;
      } else if (seq > *st.next_seq) {
        ++st.gaps;
        from = *st.next_seq;
      }
      if (!from) {
        apply_batch(e, en, *current);
        st.next_seq = seq + 1;
        return;
      }
    }
    auto replayed = fetch_replay(en, *from, seq);
    std::unique_lock lock(mu);
    const std::uint64_t expected = apply_replayed(e, en, *from, replayed);
    if (seq > expected) lose(e, en);  // the replay could not reach the current batch
    apply_batch(e, en, *current);
    en.st.next_seq = seq + 1;
  }

  // Applies replayed batches from `from` on (lock held); returns the sequence number after the
  // last one applied (`from` when none was).
  std::uint64_t apply_replayed(
      EngineId e, Engine& en, std::uint64_t from,
      const std::vector<std::pair<std::uint64_t, std::vector<std::uint8_t>>>& replayed) {
    std::uint64_t expected = from;
    for (const auto& [s, p] : replayed) {
      if (s < expected) continue;
      std::optional<WireBatch> b;
      try {
        b = decode_event_batch(p);
      } catch (const Error&) {
        ++en.st.bad_batches;
        break;
      }
      if (s > expected) lose(e, en);  // a hole the engine cannot fill: keep the run after it
      apply_batch(e, en, *b);
      ++en.st.batches_replayed;
      expected = s + 1;
    }
    return expected;
  }

  // A new connection after a lost one (receiver thread). The peer may be the same process (a
  // network blip, or a slow joiner's reconnect) or a restarted one whose sequence numbers say
  // nothing about it. An engine that told its incarnation before is asked again: the same one
  // keeps its entries and fills what it missed from the replay socket (the normal gap rule);
  // any other answer, or none, drops its entries and rebuilds them from its replay buffer from 0
  // and the events that follow, so they stay a subset of what it holds.
  void resync(EngineId e, Engine& en) {
    en.resync_pending = false;
    en.dup_below.reset();
    // Nothing queued for, or answered by, the previous connection.
    if (en.endpoints->replay_endpoint) renew_dealer(en);
    std::optional<ProbeAnswer> answer;
    if (en.st.incarnation && config.hasher && en.dealer) answer = ask_probe(en);
    std::uint64_t from = 0;
    bool same = false;
    {
      std::unique_lock lock(mu);
      EngineStatus& st = en.st;
      ++st.reconnects;
      if (answer && answer->answered) {
        const bool new_incarnation = answer->incarnation != st.incarnation;
        same = !new_incarnation && answer->error.empty() && answer->agrees;
        st.probe = answer->error.empty() && answer->agrees ? ProbeResult::kAgreed
                                                           : ProbeResult::kDisagreed;
        if (new_incarnation && answer->incarnation) {
          ++st.restarts;
        } else if (!same) {
          ++st.unverified_resyncs;
        }
        st.incarnation = answer->incarnation;
      } else {
        if (answer) st.probe = ProbeResult::kUnanswered;
        ++st.unverified_resyncs;
      }
      if (same) {
        if (!st.next_seq) return;  // nothing received yet: the join rules apply
        from = *st.next_seq;
      } else {
        index.clear_engine(e);
        st.next_seq.reset();
      }
    }
    if (!en.dealer) return;  // no replay: rebuilt from the events that follow
    const auto replayed = fetch_replay(en, from, std::numeric_limits<std::uint64_t>::max());
    std::unique_lock lock(mu);
    const std::uint64_t expected = apply_replayed(e, en, from, replayed);
    if (expected > from) en.st.next_seq = expected;
    if (en.st.next_seq) en.dup_below = en.st.next_seq;
  }

  // Drains the engine's monitor events (receiver thread). A lost connection replaces the SUB
  // socket (what it still holds may come from either side of the loss) and marks a resync, done
  // when the new socket completes a handshake. True when the socket was replaced.
  bool poll_monitor(EngineId e, Engine& en) {
    while (en.monitor) {
      zmq::message_t ev;
      if (!en.monitor->recv(ev, zmq::recv_flags::dontwait)) return false;
      for (bool more = ev.more(); more;) {  // the endpoint frame (sent with the event)
        zmq::message_t rest;
        if (!en.monitor->recv(rest, zmq::recv_flags::dontwait)) break;
        more = rest.more();
      }
      if (ev.size() < 6) continue;
      std::uint16_t id = 0;
      std::memcpy(&id, ev.data(), sizeof id);
      if (id == ZMQ_EVENT_DISCONNECTED) {
        {
          std::unique_lock lock(mu);
          en.st.connected = false;
          en.st.in_sync = false;  // its entries may be a dead process's until the resync
        }
        // A connection that failed its handshake delivered nothing: the socket keeps retrying
        // at ZeroMQ's reconnect interval (no churn against a peer that accepts and closes).
        if (!en.handshaken) continue;
        en.resync_pending = true;
        reopen(en);
        return true;
      }
      if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        en.handshaken = true;
        {
          std::unique_lock lock(mu);
          en.st.connected = true;
        }
        if (en.resync_pending) resync(e, en);
        std::unique_lock lock(mu);
        en.st.in_sync = en.st.connected;  // unless it dropped again during the resync
      }
    }
    return false;
  }

  void reopen(Engine& en) {
    try {
      open_sub(en);
    } catch (const zmq::error_t&) {  // e.g. out of file descriptors: retried every poll
      en.sub.reset();
      en.monitor.reset();
      items_dirty = true;
    }
  }

  void run() {
    std::size_t count = 0;  // engines added later (add_engine) are fed in-process, never here
    {
      std::shared_lock lock(mu);
      count = engines.size();
    }
    std::vector<zmq::pollitem_t> items;
    while (!stop.load(std::memory_order_relaxed)) {
      if (items_dirty) {
        items.clear();
        for (std::size_t i = 0; i < count; ++i) {
          Engine* en = engines[i].get();
          if (!en->endpoints) continue;
          if (!en->sub) reopen(*en);  // a reopen that failed earlier
          if (!en->sub) continue;
          items.push_back({en->monitor->handle(), 0, ZMQ_POLLIN, 0});
          items.push_back({en->sub->handle(), 0, ZMQ_POLLIN, 0});
        }
        items_dirty = false;
      }
      try {
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(50));
      } catch (const zmq::error_t&) {
        continue;
      }
      for (EngineId e = 0; e < count; ++e) {
        Engine& en = *engines[e];
        if (!en.sub) {
          items_dirty = items_dirty || en.endpoints.has_value();
          continue;
        }
        // Connection events first: data never reads as the old connection's after a loss.
        if (poll_monitor(e, en)) continue;
        // Drain what is there, so one busy engine does not starve the others' polls for long.
        for (int n = 0; n < 64; ++n) {
          auto frames = recv_multipart(*en.sub, std::chrono::milliseconds(0));
          if (frames.empty()) break;
          // The connection's handshake event is queued before its first message, so a loss
          // that happened before this message was received shows now: the message may be the
          // new peer's, and the socket is replaced and resynchronised instead.
          if (poll_monitor(e, en)) break;
          if (en.resync_pending) resync(e, en);  // data before its handshake event (lost event)
          if (frames.size() != 3 || frames[1].size() != 8) continue;  // not a KV event message
          const std::int64_t seq = get_seq(bytes_of(frames[1]));
          if (seq < 0) continue;
          ingest(e, static_cast<std::uint64_t>(seq), bytes_of(frames[2]));
        }
      }
    }
  }

  // Sends the probe on the engine's replay socket and waits up to probe_timeout for the answer.
  ProbeAnswer ask_probe(Engine& en) {
    ProbeAnswer a;
    std::vector<TokenId> tokens(config.probe_block_size);
    std::iota(tokens.begin(), tokens.end(), 0);
    const BlockHash mine = config.hasher->hash_block(config.hasher->none_hash(), tokens);
    msgpack::sbuffer req;
    msgpack::pack(req, tokens);
    try {
      en.dealer->send(zmq::message_t(), zmq::send_flags::sndmore);
      en.dealer->send(zmq::buffer(kProbeTag), zmq::send_flags::sndmore);
      en.dealer->send(zmq::buffer(req.data(), req.size()), zmq::send_flags::none);
      const auto deadline = std::chrono::steady_clock::now() + config.probe_timeout;
      while (true) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        auto frames = recv_multipart(*en.dealer, left);
        if (frames.size() != 3 || frames[1].to_string_view() != kProbeTag) continue;
        a.answered = true;
        std::string scheme = "?";
        std::vector<std::uint8_t> theirs;
        try {
          auto oh = msgpack::unpack(static_cast<const char*>(frames[2].data()), frames[2].size());
          std::map<std::string, msgpack::object> m;
          oh.get().convert(m);
          if (auto it = m.find("error"); it != m.end()) a.error = it->second.as<std::string>();
          if (auto it = m.find("scheme"); it != m.end()) scheme = it->second.as<std::string>();
          if (auto it = m.find("hash"); it != m.end() && it->second.type == msgpack::type::BIN) {
            const auto& bin = it->second.via.bin;
            theirs.assign(bin.ptr, bin.ptr + bin.size);
          }
          if (auto it = m.find("incarnation");
              it != m.end() && it->second.type == msgpack::type::POSITIVE_INTEGER) {
            a.incarnation = it->second.as<std::uint64_t>();
          }
        } catch (const std::exception& ex) {
          a.error = std::string("malformed probe reply (") + ex.what() + ")";
        }
        const std::vector<std::uint8_t> ours(mine.bytes().begin(), mine.bytes().end());
        a.agrees = a.error.empty() && theirs == ours;
        static constexpr char kHex[] = "0123456789abcdef";
        a.theirs = scheme + " ";
        for (std::uint8_t b : theirs) {
          a.theirs += kHex[b >> 4];
          a.theirs += kHex[b & 15];
        }
        return a;
      }
    } catch (const zmq::error_t&) {
    }
    renew_dealer(en);  // drop a late answer
    return a;
  }

  // The connect-time probe: throws when the engine hashes differently or cannot hash.
  ProbeResult probe(Engine& en) {
    if (!config.hasher || !en.dealer) return ProbeResult::kNotAsked;
    const ProbeAnswer a = ask_probe(en);
    if (!a.answered) return ProbeResult::kUnanswered;
    if (!a.error.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "KVIndexer: engine '" + en.st.name +
                                                   "' cannot answer the hash probe: " + a.error);
    }
    if (!a.agrees) {
      std::vector<TokenId> tokens(config.probe_block_size);
      std::iota(tokens.begin(), tokens.end(), 0);
      const BlockHash mine = config.hasher->hash_block(config.hasher->none_hash(), tokens);
      throw Error(ErrorCode::kInvalidArgument,
                  "KVIndexer: engine '" + en.st.name +
                      "' hashes blocks differently from this indexer (probe block of " +
                      std::to_string(tokens.size()) + " tokens: engine " + a.theirs + ", indexer " +
                      std::string(to_string(config.hasher->scheme())) + " " + mine.to_hex() +
                      "); its blocks would never match a request: use the same --hash scheme "
                      "and hash seed on engines and router");
    }
    en.st.incarnation = a.incarnation;
    return ProbeResult::kAgreed;
  }
};

KVIndexer::KVIndexer(KVIndexerConfig config) : impl_(std::make_unique<Impl>()) {
  if (config.probe_block_size == 0) {
    throw Error(ErrorCode::kInvalidArgument, "KVIndexer: probe_block_size must be >= 1");
  }
  impl_->config = std::move(config);
  impl_->engines.reserve(BlockIndex::kMaxEngines);
}

KVIndexer::~KVIndexer() {
  stop();
}

EngineId KVIndexer::add_engine(std::string name) {
  std::unique_lock lock(impl_->mu);
  if (impl_->engines.size() >= BlockIndex::kMaxEngines) {
    throw Error(ErrorCode::kOutOfRange,
                "KVIndexer: at most " + std::to_string(BlockIndex::kMaxEngines) + " engines");
  }
  auto en = std::make_unique<Impl::Engine>();
  en->st.name = std::move(name);
  en->st.in_sync = true;  // fed in-process: its batches are its state
  impl_->engines.push_back(std::move(en));
  return impl_->engines.size() - 1;
}

EngineId KVIndexer::connect_engine(const EngineEndpoints& endpoints) {
  Impl& s = *impl_;
  if (s.started) throw Error(ErrorCode::kInvalidState, "KVIndexer: connect_engine after start()");
  if (s.engines.size() >= BlockIndex::kMaxEngines) {
    throw Error(ErrorCode::kOutOfRange,
                "KVIndexer: at most " + std::to_string(BlockIndex::kMaxEngines) + " engines");
  }
  auto en = std::make_unique<Impl::Engine>();
  en->st.name = endpoints.name;
  en->endpoints = endpoints;
  try {
    s.open_sub(*en);
    if (endpoints.replay_endpoint) s.open_dealer(*en);
  } catch (const zmq::error_t& e) {
    throw Error(ErrorCode::kInvalidArgument, "KVIndexer: cannot connect to engine '" +
                                                 endpoints.name + "' at " + endpoints.endpoint +
                                                 ": " + e.what());
  }
  en->st.probe = s.probe(*en);  // throws on disagreement; the engine is then not added
  std::unique_lock lock(s.mu);
  s.engines.push_back(std::move(en));
  return s.engines.size() - 1;
}

void KVIndexer::start() {
  Impl& s = *impl_;
  if (s.started) return;
  s.started = true;
  s.thread = std::thread([&s] { s.run(); });
}

void KVIndexer::stop() {
  Impl& s = *impl_;
  s.stop = true;
  if (s.thread.joinable()) s.thread.join();
}

void KVIndexer::apply(EngineId e, std::uint64_t seq, std::span<const std::uint8_t> payload) {
  if (e >= num_engines()) {
    throw Error(ErrorCode::kOutOfRange, "KVIndexer::apply: unknown engine " + std::to_string(e));
  }
  impl_->ingest(e, seq, payload);
}

std::vector<PrefixMatch> KVIndexer::match(std::span<const std::uint64_t> block_ids) const {
  std::shared_lock lock(impl_->mu);
  std::vector<PrefixMatch> out(impl_->engines.size());
  impl_->index.longest_prefixes(block_ids, out);
  return out;
}

void KVIndexer::match(std::span<const std::uint64_t> block_ids, std::span<PrefixMatch> out) const {
  std::shared_lock lock(impl_->mu);
  impl_->index.longest_prefixes(block_ids, out);
}

std::size_t KVIndexer::num_engines() const {
  std::shared_lock lock(impl_->mu);
  return impl_->engines.size();
}

bool KVIndexer::in_sync(EngineId e) const {
  std::shared_lock lock(impl_->mu);
  if (e >= impl_->engines.size()) {
    throw Error(ErrorCode::kOutOfRange, "KVIndexer::in_sync: unknown engine " + std::to_string(e));
  }
  return impl_->engines[e]->st.in_sync;
}

EngineStatus KVIndexer::status(EngineId e) const {
  std::shared_lock lock(impl_->mu);
  if (e >= impl_->engines.size()) {
    throw Error(ErrorCode::kOutOfRange, "KVIndexer::status: unknown engine " + std::to_string(e));
  }
  EngineStatus st = impl_->engines[e]->st;
  st.gpu_blocks = impl_->index.engine_ids(e, Tier::kGpu).size();
  st.cpu_blocks = impl_->index.engine_ids(e, Tier::kCpu).size();
  return st;
}

std::vector<std::uint64_t> KVIndexer::engine_ids(EngineId e, Tier tier) const {
  std::shared_lock lock(impl_->mu);
  return impl_->index.engine_ids(e, tier);
}

std::size_t KVIndexer::memory_bytes() const {
  std::shared_lock lock(impl_->mu);
  return impl_->index.memory_bytes();
}

std::size_t KVIndexer::num_entries() const {
  std::shared_lock lock(impl_->mu);
  return impl_->index.num_entries();
}

bool KVIndexer::wait_for(EngineId e, std::uint64_t next_seq,
                         std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    {
      std::shared_lock lock(impl_->mu);
      const auto& st = impl_->engines.at(e)->st;
      if (st.next_seq && *st.next_seq >= next_seq) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace pagedkv::events
