// KVEventPublisher (see pagedkv/events/publisher.hpp).
#define MSGPACK_NO_BOOST
#include "pagedkv/events/publisher.hpp"

#include <msgpack.hpp>
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <variant>

#include "pagedkv/base/error.hpp"

namespace pagedkv::events {

namespace {

bool vllm_binds(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct KVEventPublisher::Impl {
  struct Pending {
    std::uint64_t seq;
    double ts;
    std::vector<KVEvent> events;
  };

  KVEventPublisherConfig config;
  std::uint64_t incarnation = 0;  // random per publisher, answered in probes
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;
  std::string pub_endpoint;
  std::optional<std::string> bound_replay_endpoint;

  // Guarded by mu: the queue, the next sequence number, the counters the scheduler touches.
  mutable std::mutex mu;
  std::condition_variable cv;       // sender: work or stop
  std::condition_variable drained;  // flush(): queue empty and in-flight batch sent
  std::deque<Pending> queue;
  std::uint64_t next_seq = 0;
  bool stopping = false;
  std::atomic<bool> stop_serving{false};  // `stopping`, read by serve_replay without the lock
  bool in_flight = false;
  KVEventPublisherStats stats;

  // Sender thread only.
  std::deque<std::pair<std::uint64_t, std::string>> buffer;  // replay buffer, oldest first
  std::string payload;
  std::thread thread;
  bool stopped = false;

  void run() {
    std::unique_lock lock(mu);
    while (true) {
      if (queue.empty()) {
        if (stopping) break;
        if (replay) {
          lock.unlock();
          serve_replay_noexcept(std::chrono::milliseconds(5));
          lock.lock();
        } else {
          cv.wait_for(lock, std::chrono::milliseconds(50));
        }
        continue;
      }
      Pending p = std::move(queue.front());
      queue.pop_front();
      in_flight = true;
      lock.unlock();
      send(p);
      if (replay) serve_replay_noexcept(std::chrono::milliseconds(0));
      lock.lock();
      in_flight = false;
      if (queue.empty()) drained.notify_all();
    }
    drained.notify_all();
  }

  // Never throws (the sender thread must not die): a batch that cannot be encoded (publish()
  // validates what it can; bad_alloc remains) is dropped and counted, never sent nor buffered.
  void send(const Pending& p) noexcept {
    try {
      payload.clear();
      encode_event_batch(p.events, p.ts, config.wire, payload);
    } catch (const std::exception&) {
      std::lock_guard g(mu);
      ++stats.dropped_batches;
      ++stats.encode_failures;
      return;
    }
    char seq[8];
    put_seq(p.seq, seq);
    bool ok = true;
    try {
      ok = pub.send(zmq::buffer(config.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait)
               .has_value();
      if (ok) {
        pub.send(zmq::buffer(seq, 8), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
      }
    } catch (const zmq::error_t&) {
      ok = false;
    }
    try {
      buffer.emplace_back(p.seq, payload);
    } catch (const std::bad_alloc&) {
      // Not kept for replay: a replay asked for it ends before it, and the indexer sees the hole.
    }
    while (buffer.size() > config.buffer_steps) buffer.pop_front();
    std::lock_guard g(mu);
    if (ok) {
      ++stats.sent_batches;
    } else {
      ++stats.send_failures;
    }
  }

  // serve_replay on the sender thread: an allocation that fails while serving (or a socket error)
  // costs that request, never the thread.
  void serve_replay_noexcept(std::chrono::milliseconds wait) noexcept {
    try {
      serve_replay(wait);
    } catch (const std::exception&) {
    }
  }

  // Serves up to kRequestsPerTurn waiting requests (replay or probe), polling up to `wait` for
  // the first. Bounded, so that a client sending requests nonstop (each replay copies the whole
  // buffer) neither starves the queue nor holds shutdown() up: the sender thread sends a queued
  // batch, or sees `stopping`, between turns.
  static constexpr int kRequestsPerTurn = 8;
  void serve_replay(std::chrono::milliseconds wait) {
    zmq::pollitem_t item{replay->handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, wait) <= 0) return;
    for (int served = 0; served < kRequestsPerTurn; ++served) {
      if (stop_serving.load(std::memory_order_relaxed)) return;
      std::vector<zmq::message_t> frames;
      zmq::message_t part;
      bool more = true;
      bool got = false;
      while (more) {
        if (!replay->recv(part, zmq::recv_flags::dontwait)) break;
        got = true;
        more = part.more();
        frames.push_back(std::move(part));
      }
      if (!got) return;
      handle_request(frames);
    }
  }

  void reply(const zmq::message_t& identity, std::string_view a, std::string_view b) {
    try {
      replay->send(zmq::buffer(identity.data(), identity.size()), zmq::send_flags::sndmore);
      replay->send(zmq::message_t(), zmq::send_flags::sndmore);
      replay->send(zmq::buffer(a), zmq::send_flags::sndmore);
      replay->send(zmq::buffer(b), zmq::send_flags::none);
    } catch (const zmq::error_t&) {
      // The client went away (ROUTER drops unroutable messages): nothing to do.
    }
  }

  void handle_request(std::vector<zmq::message_t>& frames) {
    if (frames.size() == 3 && frames[2].size() == 8) {  // vLLM replay: [id, "", start seq]
      const std::int64_t start = get_seq({static_cast<const std::uint8_t*>(frames[2].data()), 8});
      char seq[8];
      for (const auto& [s, buf] : buffer) {
        if (static_cast<std::int64_t>(s) < start) continue;
        put_seq(s, seq);
        reply(frames[0], {seq, 8}, buf);
      }
      put_seq(static_cast<std::uint64_t>(kReplayEnd), seq);
      reply(frames[0], {seq, 8}, {});
      std::lock_guard g(mu);
      ++stats.replays_served;
    } else if (frames.size() == 4 && frames[2].to_string_view() == kProbeTag) {
      std::string out;
      struct Sink {
        std::string* s;
        void write(const char* d, std::size_t n) { s->append(d, n); }
      } sink{&out};
      msgpack::packer<Sink> p(sink);
      try {
        if (!config.probe_hasher) {
          throw Error(ErrorCode::kInvalidState, "this publisher has no probe hasher");
        }
        if (frames[3].size() > kMaxProbeBytes) {
          throw Error(ErrorCode::kInvalidArgument,
                      "probe request over " + std::to_string(kMaxProbeBytes) + " bytes");
        }
        bool referenced = false;
        auto oh = msgpack::unpack(static_cast<const char*>(frames[3].data()), frames[3].size(),
                                  referenced, nullptr, nullptr,
                                  msgpack::unpack_limit(kMaxProbeTokens, 0, 0, 0, 0, 2));
        std::vector<TokenId> tokens;
        oh.get().convert(tokens);
        const BlockHash h =
            config.probe_hasher->hash_block(config.probe_hasher->none_hash(), tokens);
        p.pack_map(3);
        p.pack(std::string("incarnation"));
        p.pack(incarnation);
        p.pack(std::string("scheme"));
        p.pack(std::string(to_string(config.probe_hasher->scheme())));
        p.pack(std::string("hash"));
        p.pack_bin(static_cast<std::uint32_t>(h.size()));
        p.pack_bin_body(reinterpret_cast<const char*>(h.bytes().data()),
                        static_cast<std::uint32_t>(h.size()));
      } catch (const std::exception& ex) {
        out.clear();
        p.pack_map(2);
        p.pack(std::string("incarnation"));
        p.pack(incarnation);
        p.pack(std::string("error"));
        p.pack(std::string(ex.what()));
      }
      reply(frames[0], kProbeTag, out);
      std::lock_guard g(mu);
      ++stats.probes_served;
    }
    // Anything else is ignored, as vLLM does.
  }
};

KVEventPublisher::KVEventPublisher(KVEventPublisherConfig config)
    : impl_(std::make_unique<Impl>()) {
  if (config.buffer_steps == 0 || config.max_queue_size == 0 || config.hwm < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "KVEventPublisher: buffer_steps and max_queue_size must be >= 1, hwm >= 0");
  }
  // ZeroMQ reads a negative linger as "wait forever": a subscriber that stops reading would hang
  // shutdown().
  if (config.linger_ms < 0) {
    throw Error(ErrorCode::kInvalidArgument, "KVEventPublisher: linger_ms must be >= 0, got " +
                                                 std::to_string(config.linger_ms));
  }
  Impl& s = *impl_;
  s.config = std::move(config);
  std::random_device rd;
  s.incarnation = (std::uint64_t{rd()} << 32) ^ rd();
  try {
    s.pub.set(zmq::sockopt::sndhwm, s.config.hwm);
    s.pub.set(zmq::sockopt::linger, s.config.linger_ms);
    if (s.config.bind.value_or(vllm_binds(s.config.endpoint))) {
      s.pub.bind(s.config.endpoint);
      s.pub_endpoint = s.pub.get(zmq::sockopt::last_endpoint);
    } else {
      s.pub.connect(s.config.endpoint);
      s.pub_endpoint = s.config.endpoint;
    }
    if (s.config.replay_endpoint) {
      s.replay.emplace(s.ctx, zmq::socket_type::router);
      s.replay->set(zmq::sockopt::linger, 0);
      // Requests are 8 bytes (a replay) or a probe: a peer sending more is disconnected.
      s.replay->set(zmq::sockopt::maxmsgsize,
                    static_cast<std::int64_t>(kMaxProbeBytes + kProbeTag.size() + 64));
      s.replay->bind(*s.config.replay_endpoint);
      s.bound_replay_endpoint = s.replay->get(zmq::sockopt::last_endpoint);
    }
  } catch (const zmq::error_t& e) {
    throw Error(ErrorCode::kInvalidArgument,
                "KVEventPublisher: cannot open " + s.config.endpoint +
                    (s.config.replay_endpoint ? " / " + *s.config.replay_endpoint : "") + ": " +
                    e.what());
  }
  s.thread = std::thread([&s] { s.run(); });
}

KVEventPublisher::~KVEventPublisher() {
  shutdown();
}

namespace {

// What encode_event_batch would refuse on the sender thread, refused here instead.
void check_events(const std::vector<KVEvent>& events) {
  auto check = [](const BlockHash& h, std::size_t event, const char* what) {
    if (h.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "KVEventPublisher::publish: event " +
                                                   std::to_string(event) + " has an empty " + what +
                                                   " (nothing was queued)");
    }
  };
  for (std::size_t i = 0; i < events.size(); ++i) {
    if (const auto* st = std::get_if<BlockStored>(&events[i].data)) {
      for (const BlockHash& h : st->block_hashes) check(h, i, "block hash");
      if (st->parent_block_hash) check(*st->parent_block_hash, i, "parent block hash");
    } else if (const auto* r = std::get_if<BlockRemoved>(&events[i].data)) {
      for (const BlockHash& h : r->block_hashes) check(h, i, "block hash");
    }
  }
}

}  // namespace

std::optional<std::uint64_t> KVEventPublisher::publish(std::vector<KVEvent> events) {
  if (events.empty()) return std::nullopt;
  check_events(events);
  const double ts = now_seconds();
  Impl& s = *impl_;
  std::uint64_t seq = 0;
  {
    std::lock_guard g(s.mu);
    if (s.stopping)
      throw Error(ErrorCode::kInvalidState, "KVEventPublisher: publish after shutdown");
    // Queued first (push_back may throw bad_alloc: then nothing changed, no number is taken and
    // no batch dropped), then the oldest dropped when the queue is over its bound.
    seq = s.next_seq;
    s.queue.push_back({seq, ts, std::move(events)});
    ++s.next_seq;
    ++s.stats.published_batches;
    if (s.queue.size() > s.config.max_queue_size) {
      s.queue.pop_front();
      ++s.stats.dropped_batches;
    }
  }
  s.cv.notify_one();
  return seq;
}

bool KVEventPublisher::flush(std::chrono::milliseconds timeout) {
  // now() + timeout must not overflow the clock (milliseconds::max() would wrap to the past):
  // a year is "wait until drained".
  timeout = std::min(timeout, std::chrono::milliseconds(std::chrono::hours(24 * 366)));
  Impl& s = *impl_;
  std::unique_lock lock(s.mu);
  return s.drained.wait_for(lock, timeout, [&] { return s.queue.empty() && !s.in_flight; });
}

void KVEventPublisher::shutdown() {
  Impl& s = *impl_;
  {
    std::lock_guard g(s.mu);
    if (s.stopped) return;
    s.stopping = true;
    s.stop_serving = true;
    s.stopped = true;
  }
  s.cv.notify_all();
  if (s.thread.joinable()) s.thread.join();
  s.pub.close();
  if (s.replay) s.replay->close();
}

std::string KVEventPublisher::endpoint() const {
  return impl_->pub_endpoint;
}
std::uint64_t KVEventPublisher::incarnation() const {
  return impl_->incarnation;
}
std::optional<std::string> KVEventPublisher::replay_endpoint() const {
  return impl_->bound_replay_endpoint;
}

KVEventPublisherStats KVEventPublisher::stats() const {
  std::lock_guard g(impl_->mu);
  KVEventPublisherStats st = impl_->stats;
  st.queued = impl_->queue.size();
  return st;
}

}  // namespace pagedkv::events
