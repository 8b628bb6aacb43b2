// KVIndexer (see pagedkv/events/indexer.hpp).
#define MSGPACK_NO_BOOST
#include "pagedkv/events/indexer.hpp"

#include <msgpack.hpp>
#include <zmq.hpp>

#include <atomic>
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
    std::optional<zmq::socket_t> dealer;  // replay and probe requests
  };

  KVIndexerConfig config;
  zmq::context_t ctx{1};
  mutable std::shared_mutex mu;  // guards index and every Engine::st
  BlockIndex index;
  std::vector<std::unique_ptr<Engine>> engines;
  std::thread thread;
  std::atomic<bool> stop{false};
  bool started = false;

  void open_dealer(Engine& en) {
    en.dealer.emplace(ctx, zmq::socket_type::dealer);
    en.dealer->set(zmq::sockopt::linger, 0);
    en.dealer->set(zmq::sockopt::sndtimeo, static_cast<int>(config.replay_timeout.count()));
    en.dealer->connect(*en.endpoints->replay_endpoint);
  }

  // Receives one multipart message within `timeout`; empty when none came.
  static std::vector<zmq::message_t> recv_multipart(zmq::socket_t& s, std::chrono::milliseconds timeout) {
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
          open_dealer(en);
          return out;
        }
        if (frames.size() != 3 || frames[1].size() != 8) continue;  // not a replay reply
        const std::int64_t s = get_seq(bytes_of(frames[1]));
        if (s == kReplayEnd) return out;
        if (s < 0 || static_cast<std::uint64_t>(s) >= until) continue;
        const auto p = bytes_of(frames[2]);
        out.emplace_back(static_cast<std::uint64_t>(s), std::vector<std::uint8_t>(p.begin(), p.end()));
      }
    } catch (const zmq::error_t&) {
      open_dealer(en);
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
    EngineStatus& st = en.st;
    std::uint64_t expected = *from;
    for (auto& [s, p] : replayed) {
      if (s < expected) continue;
      std::optional<WireBatch> b;
      try {
        b = decode_event_batch(p);
      } catch (const Error&) {
        ++st.bad_batches;
        break;
      }
      if (s > expected) lose(e, en);  // a hole the engine cannot fill: keep the run after it
      apply_batch(e, en, *b);
      ++st.batches_replayed;
      expected = s + 1;
    }
    if (seq > expected) lose(e, en);  // the replay could not reach the current batch
    apply_batch(e, en, *current);
    st.next_seq = seq + 1;
  }

  void run() {
    std::vector<zmq::pollitem_t> items;
    std::vector<EngineId> ids;
    for (EngineId e = 0; e < engines.size(); ++e) {
      if (!engines[e]->sub) continue;
      items.push_back({engines[e]->sub->handle(), 0, ZMQ_POLLIN, 0});
      ids.push_back(e);
    }
    while (!stop.load(std::memory_order_relaxed)) {
      try {
        if (zmq::poll(items.data(), items.size(), std::chrono::milliseconds(50)) <= 0) continue;
      } catch (const zmq::error_t&) {
        continue;
      }
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        Engine& en = *engines[ids[i]];
        // Drain what is there, so one busy engine does not starve the others' polls for long.
        for (int n = 0; n < 64; ++n) {
          auto frames = recv_multipart(*en.sub, std::chrono::milliseconds(0));
          if (frames.empty()) break;
          if (frames.size() != 3 || frames[1].size() != 8) continue;  // not a KV event message
          const std::int64_t seq = get_seq(bytes_of(frames[1]));
          if (seq < 0) continue;
          ingest(ids[i], static_cast<std::uint64_t>(seq), bytes_of(frames[2]));
        }
      }
    }
  }

  ProbeResult probe(Engine& en) {
    if (!config.hasher || !en.dealer) return ProbeResult::kNotAsked;
    std::vector<TokenId> tokens(config.probe_block_size);
    std::iota(tokens.begin(), tokens.end(), 0);
    const BlockHash mine = config.hasher->hash_block(config.hasher->none_hash(), tokens);
    msgpack::sbuffer req;
    msgpack::pack(req, tokens);
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
      std::string scheme = "?";
      std::string error;
      std::vector<std::uint8_t> theirs;
      try {
        auto oh = msgpack::unpack(static_cast<const char*>(frames[2].data()), frames[2].size());
        std::map<std::string, msgpack::object> m;
        oh.get().convert(m);
        if (auto it = m.find("error"); it != m.end()) error = it->second.as<std::string>();
        if (auto it = m.find("scheme"); it != m.end()) scheme = it->second.as<std::string>();
        if (auto it = m.find("hash"); it != m.end() && it->second.type == msgpack::type::BIN) {
          const auto& bin = it->second.via.bin;
          theirs.assign(bin.ptr, bin.ptr + bin.size);
        }
      } catch (const std::exception& ex) {
        error = std::string("malformed probe reply (") + ex.what() + ")";
      }
      if (!error.empty()) {
        throw Error(ErrorCode::kInvalidArgument,
                    "KVIndexer: engine '" + en.st.name + "' cannot answer the hash probe: " + error);
      }
      const std::vector<std::uint8_t> ours(mine.bytes().begin(), mine.bytes().end());
      if (theirs != ours) {
        std::string hex;
        static constexpr char kHex[] = "0123456789abcdef";
        for (std::uint8_t b : theirs) {
          hex += kHex[b >> 4];
          hex += kHex[b & 15];
        }
        throw Error(ErrorCode::kInvalidArgument,
                    "KVIndexer: engine '" + en.st.name +
                        "' hashes blocks differently from this indexer (probe block of " +
                        std::to_string(tokens.size()) + " tokens: engine " + scheme + " " + hex +
                        ", indexer " + std::string(to_string(config.hasher->scheme())) + " " +
                        mine.to_hex() +
                        "); its blocks would never match a request: use the same --hash scheme "
                        "and hash seed on engines and router");
      }
      return ProbeResult::kAgreed;
    }
    open_dealer(en);  // drop a late answer
    return ProbeResult::kUnanswered;
  }
};

KVIndexer::KVIndexer(KVIndexerConfig config) : impl_(std::make_unique<Impl>()) {
  if (config.probe_block_size == 0) {
    throw Error(ErrorCode::kInvalidArgument, "KVIndexer: probe_block_size must be >= 1");
  }
  impl_->config = std::move(config);
}

KVIndexer::~KVIndexer() { stop(); }

EngineId KVIndexer::add_engine(std::string name) {
  std::unique_lock lock(impl_->mu);
  if (impl_->engines.size() >= BlockIndex::kMaxEngines) {
    throw Error(ErrorCode::kOutOfRange,
                "KVIndexer: at most " + std::to_string(BlockIndex::kMaxEngines) + " engines");
  }
  auto en = std::make_unique<Impl::Engine>();
  en->st.name = std::move(name);
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
    en->sub.emplace(s.ctx, zmq::socket_type::sub);
    en->sub->set(zmq::sockopt::linger, 0);
    en->sub->set(zmq::sockopt::rcvhwm, s.config.rcvhwm);
    en->sub->set(zmq::sockopt::subscribe, s.config.topic);
    en->sub->connect(endpoints.endpoint);
    if (endpoints.replay_endpoint) s.open_dealer(*en);
  } catch (const zmq::error_t& e) {
    throw Error(ErrorCode::kInvalidArgument,
                "KVIndexer: cannot connect to engine '" + endpoints.name + "' at " +
                    endpoints.endpoint + ": " + e.what());
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
