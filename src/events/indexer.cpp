// KVIndexer (see pagedkv/events/indexer.hpp).
#define MSGPACK_NO_BOOST
#include "pagedkv/events/indexer.hpp"

#include <msgpack.hpp>
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <numeric>
#include <shared_mutex>
#include <stdexcept>
#include <string>
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
    // A replay was abandoned: until then no replay or probe is asked, the engine is not in sync.
    std::optional<std::chrono::steady_clock::time_point> suspended_until;
  };

  // What a replay brought, decoded, and how it ended.
  // kStopped: stop() was called meanwhile (what came is kept; the rest is a loss).
  enum class ReplayEnd : std::uint8_t { kComplete, kSilent, kDeadline, kSize, kBadBatch, kStopped };
  // How long the receiver waits at a time for a replay or probe answer before it looks at the
  // stop flag again.
  static constexpr std::chrono::milliseconds kStopCheck{50};
  struct Replay {
    std::vector<std::pair<std::uint64_t, WireBatch>> batches;
    ReplayEnd end = ReplayEnd::kSilent;
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
  // Serialises the index's writers. A writer holds it across a whole update and `mu` only in
  // spans of kOpsPerHold operations (lookups get in between), and rebuilds a table that must
  // grow or shrink with `mu` released (readers keep using the old one; no writer can change it).
  std::mutex write_mu;
  static constexpr std::size_t kOpsPerHold = 4096;
  BlockIndex index;
  // Reserved to BlockIndex::kMaxEngines: add_engine() never moves the elements the receiver
  // thread reads without the lock (it reads the count under it).
  std::vector<std::unique_ptr<Engine>> engines;
  std::thread thread;
  std::atomic<bool> stop{false};
  bool started = false;
  std::uint64_t monitor_serial = 0;  // names the monitors' inproc endpoints
  bool items_dirty = true;           // a SUB socket was replaced: rebuild the poll set

  // A writer's hold on the index (see write_mu).
  class Writer {
   public:
    explicit Writer(Impl& s) : s_(s), w_(s.write_mu), x_(s.mu) {}
    // Counts one index operation; every kOpsPerHold, lets waiting lookups in.
    void tick() {
      if (++ops_ >= kOpsPerHold) yield();
    }
    void yield() {
      ops_ = 0;
      x_.unlock();
      std::this_thread::yield();
      x_.lock();
    }
    // Makes room for `adds` more ids of engine e (adds = 0: gives back room when sparse),
    // building the new tables without the exclusive lock. Without the memory for them the tables
    // are left as they are (add() grows them in place if it must).
    void fit(EngineId e, std::size_t adds) {
      if (!s_.index.resize_needed(e, adds)) return;
      x_.unlock();
      std::optional<BlockIndex::Resize> plan;
      try {
        plan.emplace(s_.index.plan_resize(e, adds));
      } catch (const std::bad_alloc&) {
      }
      x_.lock();
      ops_ = 0;
      if (!plan) return;
      s_.index.adopt(std::move(*plan));  // the plan now holds the old tables
      x_.unlock();
      plan.reset();  // freed outside the exclusive lock
      x_.lock();
    }

    // Makes room for `adds` more ids of engine e like fit(), but throws std::bad_alloc (having
    // changed nothing) when the tables cannot be built: after it, adding up to `adds` ids
    // grows no table (as long as nothing shrinks them: clears pass give_back = false).
    void reserve(EngineId e, std::size_t adds) {
      if (adds == 0 || !s_.index.resize_needed(e, adds)) return;
      x_.unlock();
      std::optional<BlockIndex::Resize> plan;
      try {
        plan.emplace(s_.index.plan_resize(e, adds));
      } catch (...) {
        x_.lock();
        throw;
      }
      x_.lock();
      ops_ = 0;
      s_.index.adopt(std::move(*plan));
      x_.unlock();
      plan.reset();
      x_.lock();
    }

   private:
    Impl& s_;
    std::unique_lock<std::mutex> w_;
    std::unique_lock<std::shared_mutex> x_;
    std::size_t ops_ = 0;
  };

  bool suspended(const Engine& en) const {
    return en.suspended_until && std::chrono::steady_clock::now() < *en.suspended_until;
  }

  // Counts a dropped frame (takes the lock).
  void count_drop(Engine& en, std::uint64_t EngineStatus::Dropped::*reason) {
    std::unique_lock lock(mu);
    ++(en.st.dropped.*reason);
  }
  static std::uint64_t EngineStatus::Dropped::*reason_of(DecodeFailure f) {
    switch (f) {
      case DecodeFailure::kTooLarge:
        return &EngineStatus::Dropped::too_large;
      case DecodeFailure::kTooManyElements:
        return &EngineStatus::Dropped::too_many_elements;
      case DecodeFailure::kTrailingBytes:
        return &EngineStatus::Dropped::trailing_bytes;
      default:
        return &EngineStatus::Dropped::malformed;
    }
  }

  std::int64_t max_msg_size() const {
    return static_cast<std::int64_t>(
        std::min<std::size_t>(config.decode.max_bytes,
                              std::numeric_limits<std::int64_t>::max() / 2) +
        4096);
  }

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
    sub.set(zmq::sockopt::maxmsgsize, max_msg_size());
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
    en.dealer->set(zmq::sockopt::maxmsgsize, max_msg_size());
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

  // Receives one multipart message within `timeout`; empty when none came. Keeps its first 4
  // frames (the rest are read and discarded); *count receives how many it had.
  static std::vector<zmq::message_t> recv_multipart(zmq::socket_t& s,
                                                    std::chrono::milliseconds timeout,
                                                    std::size_t* count = nullptr) {
    std::vector<zmq::message_t> frames;
    std::size_t n = 0;
    if (count) *count = 0;
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) <= 0) return frames;
    while (true) {
      zmq::message_t m;
      if (!s.recv(m, zmq::recv_flags::dontwait)) break;
      const bool more = m.more();
      if (++n <= 4) frames.push_back(std::move(m));
      if (!more) break;
    }
    if (count) *count = n;
    return frames;
  }

  // Checks the frames of a [topic or envelope, seq, payload] message, counting what is dropped.
  // The sequence number when it is usable (kReplayEnd is returned as is).
  std::optional<std::int64_t> check_frames(Engine& en, const std::vector<zmq::message_t>& frames,
                                           std::size_t count) {
    if (count != 3) {
      count_drop(en, &EngineStatus::Dropped::wrong_frame_count);
      return std::nullopt;
    }
    if (frames[1].size() != 8) {
      count_drop(en, &EngineStatus::Dropped::bad_seq_size);
      return std::nullopt;
    }
    const std::int64_t seq = get_seq(bytes_of(frames[1]));
    if (seq < 0 && seq != kReplayEnd) {
      count_drop(en, &EngineStatus::Dropped::negative_seq);
      return std::nullopt;
    }
    return seq;
  }

  // Batches [from, until) from the engine's replay socket, decoded, in increasing order; fewer
  // (or none) when the engine no longer has them or does not answer. The whole exchange is bounded
  // by replay_deadline, max_replay_frames and max_replay_ids (ReplayEnd says which ended it).
  Replay fetch_replay(Engine& en, std::uint64_t from, std::uint64_t until) {
    Replay r;
    if (!en.dealer) return r;
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + config.replay_deadline;
    auto silent_at = Clock::now() + config.replay_timeout;  // moved on by every frame
    std::size_t frames_seen = 0;
    std::size_t ids = 0;
    std::size_t events = 0;
    std::optional<std::uint64_t> last;
    char seq[8];
    put_seq(from, seq);
    try {
      en.dealer->send(zmq::message_t(), zmq::send_flags::sndmore);
      en.dealer->send(zmq::buffer(seq, 8), zmq::send_flags::none);
      while (true) {
        if (stop.load(std::memory_order_relaxed)) {
          r.end = ReplayEnd::kStopped;
          break;
        }
        const auto now = Clock::now();
        if (now >= deadline) {
          r.end = ReplayEnd::kDeadline;
          break;
        }
        if (now >= silent_at) {
          r.end = ReplayEnd::kSilent;
          break;
        }
        const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::min(deadline, silent_at) - now);
        std::size_t count = 0;
        auto frames = recv_multipart(
            *en.dealer, std::clamp(wait, std::chrono::milliseconds(1), kStopCheck), &count);
        if (count == 0) continue;  // silence so far: the checks above end it
        silent_at = Clock::now() + config.replay_timeout;
        if (++frames_seen > config.max_replay_frames) {
          r.end = ReplayEnd::kSize;
          break;
        }
        const auto s = check_frames(en, frames, count);
        if (!s) continue;
        if (*s == kReplayEnd) {
          r.end = ReplayEnd::kComplete;
          return r;
        }
        const auto u = static_cast<std::uint64_t>(*s);
        if (u < from || u >= until || (last && u <= *last)) continue;  // not asked, or again
        WireBatch b;
        const DecodeFailure f = try_decode_event_batch(bytes_of(frames[2]), config.decode, b);
        if (f != DecodeFailure::kNone) {
          {
            std::unique_lock lock(mu);
            ++(en.st.dropped.*reason_of(f));
            ++en.st.bad_batches;
          }
          r.end = ReplayEnd::kBadBatch;  // what follows cannot be applied past the hole
          break;
        }
        for (const WireEvent& ev : b.events) ids += ev.block_ids.size();
        events += b.events.size();
        if (ids > config.max_replay_ids || events > config.max_replay_events) {
          r.end = ReplayEnd::kSize;
          break;
        }
        last = u;
        r.batches.emplace_back(u, std::move(b));
      }
    } catch (const zmq::error_t&) {
      r.end = ReplayEnd::kSilent;
    }
    renew_dealer(en);  // a late or continuing answer must not reach the next request
    return r;
  }

  // Removes every entry of the engine, in spans (lookups get in between), and gives back the
  // room when the table has become sparse (unless !give_back: a batch that follows may use the
  // room reserved for it; apply_batch gives it back at its end).
  void clear_engine(Writer& w, EngineId e, bool give_back = true) {
    while (!index.clear_engine_some(e, kOpsPerHold)) w.yield();
    if (give_back) w.fit(e, 0);
  }

  // Stores a batch may add (group 0 ids, at most the cap): reserved before it changes anything.
  std::size_t stores_in(const WireBatch& b) const {
    std::size_t n = 0;
    for (const WireEvent& ev : b.events) {
      if (ev.type == WireEventType::kBlockStored && ev.group_idx == 0) n += ev.block_ids.size();
    }
    return std::min(n, config.max_entries_per_engine);
  }

  // Applies one decoded batch to the index (writer held). Stores past max_entries_per_engine
  // are ignored (counted).
  void apply_batch(Writer& w, EngineId e, Engine& en, const WireBatch& b) {
    const std::size_t cap = config.max_entries_per_engine;
    auto held = [&] {
      return index.engine_entries(e, Tier::kGpu) + index.engine_entries(e, Tier::kCpu);
    };
    for (const WireEvent& ev : b.events) {
      // Room for the event's ids (never past the cap) before any is added: the tables never
      // grow in place, under the exclusive lock.
      if (ev.type == WireEventType::kBlockStored && ev.group_idx == 0 && !ev.block_ids.empty()) {
        w.fit(e, std::min(ev.block_ids.size(), cap - std::min(cap, held())));
      }
      if (ev.type == WireEventType::kAllBlocksCleared) {
        clear_engine(w, e, false);
        ++en.st.clears;
        continue;
      }
      if (ev.group_idx != 0) continue;
      const Tier t = tier_of(ev.medium);
      for (const std::uint64_t id : ev.block_ids) {
        if (ev.type == WireEventType::kBlockStored) {
          if (held() >= cap) {
            ++en.st.ids_over_cap;
            continue;
          }
          try {
            index.add(id, e, t);  // strong: on failure the id is as it was
          } catch (const std::bad_alloc&) {
            // Only an extra copy's count (the id is held already) or a table the reservation
            // did not cover can fail here: the store is skipped, so the entries stay a subset
            // of the engine's cache, and the batch is applied whole (counted).
            ++en.st.stores_no_memory;
          }
        } else {
          index.remove(id, e, t);
        }
        w.tick();
      }
    }
    ++en.st.batches_applied;
    w.fit(e, 0);
  }

  void lose(Writer& w, EngineId e, Engine& en, bool give_back = true) {
    clear_engine(w, e, give_back);
    ++en.st.gaps_lost;
  }

  // Whether a replay that ended so is abandoned (abandon_replay): its bounds, or silence.
  static bool abandoned(ReplayEnd end) {
    return end == ReplayEnd::kDeadline || end == ReplayEnd::kSize || end == ReplayEnd::kSilent;
  }

  // A replay ended by its bounds or by silence (no reply within replay_timeout, or a peer that
  // cannot be sent to): the engine's entries go (the events that follow rebuild them), and it is
  // neither replayed nor probed, nor in sync, for replay_backoff. So a replay socket that never
  // answers costs the receiver thread one replay_timeout per replay_backoff, not one per gap.
  void abandon_replay(Writer& w, EngineId e, Engine& en, ReplayEnd end) {
    ++(end == ReplayEnd::kDeadline ? en.st.replays_aborted_deadline
       : end == ReplayEnd::kSilent ? en.st.replays_aborted_silent
                                   : en.st.replays_aborted_size);
    en.suspended_until = std::chrono::steady_clock::now() + config.replay_backoff;
    en.st.in_sync = false;
    clear_engine(w, e);
  }

  // The sequence rules of the header, for one received batch.
  void ingest(EngineId e, std::uint64_t seq, std::span<const std::uint8_t> payload) {
    Engine& en = *engines[e];
    if (en.dup_below) {
      if (seq < *en.dup_below) return;  // already applied from the resync's replay
      en.dup_below.reset();
    }
    WireBatch current;
    const DecodeFailure failure = try_decode_event_batch(payload, config.decode, current);
    std::optional<std::uint64_t> from;
    {
      Writer w(*this);
      EngineStatus& st = en.st;
      // Room for the batch's stores first: a bad_alloc here leaves everything as it was, and
      // with the room made no store below allocates a table (in-process apply() is all or
      // nothing).
      if (failure == DecodeFailure::kNone) w.reserve(e, stores_in(current));
      if (en.suspended_until && !suspended(en)) {  // the backoff is over
        en.suspended_until.reset();
        st.in_sync = en.endpoints ? st.connected : true;
      }
      if (failure != DecodeFailure::kNone) {  // its contents are lost: rebuild from what follows
        ++(st.dropped.*reason_of(failure));
        ++st.bad_batches;
        lose(w, e, en);
        st.next_seq = seq + 1;
        return;
      }
      if (!st.next_seq) {
        if (seq > 0) from = 0;  // joined late
      } else if (seq < *st.next_seq) {
        clear_engine(w, e, false);  // a new publisher: the engine restarted
        ++st.restarts;
        if (seq > 0) from = 0;
      } else if (seq > *st.next_seq) {
        ++st.gaps;
        from = *st.next_seq;
      }
      if (from && (!en.dealer || suspended(en))) {
        if (en.dealer) ++st.replays_skipped;
        if (seq > *from) lose(w, e, en, false);  // nothing can fill the gap
        from.reset();
      }
      if (!from) {
        apply_batch(w, e, en, current);
        st.next_seq = seq + 1;
        return;
      }
    }
    const Replay replay = fetch_replay(en, *from, seq);
    Writer w(*this);
    if (abandoned(replay.end)) {
      abandon_replay(w, e, en, replay.end);
    } else {
      const std::uint64_t expected = apply_replayed(w, e, en, *from, replay.batches);
      if (seq > expected) lose(w, e, en);  // the replay could not reach the current batch
    }
    apply_batch(w, e, en, current);
    en.st.next_seq = seq + 1;
  }

  // Applies replayed batches from `from` on (writer held); returns the sequence number after the
  // last one applied (`from` when none was).
  std::uint64_t apply_replayed(Writer& w, EngineId e, Engine& en, std::uint64_t from,
                               const std::vector<std::pair<std::uint64_t, WireBatch>>& replayed) {
    std::uint64_t expected = from;
    for (const auto& [s, b] : replayed) {
      if (s < expected) continue;
      if (s > expected) lose(w, e, en);  // a hole the engine cannot fill: keep the run after it
      apply_batch(w, e, en, b);
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
    if (en.st.incarnation && config.hasher && en.dealer && !suspended(en)) answer = ask_probe(en);
    std::uint64_t from = 0;
    bool same = false;
    {
      Writer w(*this);
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
        clear_engine(w, e);
        st.next_seq.reset();
      }
      if (en.dealer && suspended(en)) {
        ++st.replays_skipped;
        return;  // rebuilt from the events that follow
      }
    }
    if (!en.dealer) return;  // no replay: rebuilt from the events that follow
    const Replay replay = fetch_replay(en, from, std::numeric_limits<std::uint64_t>::max());
    Writer w(*this);
    if (abandoned(replay.end)) {
      abandon_replay(w, e, en, replay.end);
      en.st.next_seq.reset();  // the events that follow rebuild it as a late join
      return;
    }
    const std::uint64_t expected = apply_replayed(w, e, en, from, replay.batches);
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
        // Unless it dropped again during the resync, or a replay was abandoned.
        en.st.in_sync = en.st.connected && !suspended(en);
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
        try {
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
        } catch (const std::exception&) {  // bad_alloc: tried again after a pause
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          continue;
        }
      }
      try {
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(50));
      } catch (const zmq::error_t&) {
        continue;
      }
      for (EngineId e = 0; e < count && !stop.load(std::memory_order_relaxed); ++e) {
        Engine& en = *engines[e];
        if (!en.sub) {
          items_dirty = items_dirty || en.endpoints.has_value();
          continue;
        }
        try {
          serve(e, en);
        } catch (const std::exception&) {  // e.g. bad_alloc: the thread must not die
          fail_engine(e, en);
        }
      }
    }
  }

  // An exception on the receiver thread while it handled engine e (an allocation failed): what
  // it was applying may be half applied, so the engine's entries go and are rebuilt from what
  // follows (as a late join), and it is counted (EngineStatus::receiver_errors).
  void fail_engine(EngineId e, Engine& en) noexcept {
    try {
      en.dup_below.reset();
      Writer w(*this);
      clear_engine(w, e);
      en.st.next_seq.reset();
      ++en.st.receiver_errors;
    } catch (const std::exception&) {
      // clear_engine allocates nothing; only the locks could throw (system_error).
    }
  }

  // One poll's work for a connected engine: its connection events, then up to 64 messages.
  void serve(EngineId e, Engine& en) {
    // Connection events first: data never reads as the old connection's after a loss.
    if (poll_monitor(e, en)) return;
    // Drain what is there, so one busy engine does not starve the others' polls for long.
    for (int n = 0; n < 64 && !stop.load(std::memory_order_relaxed); ++n) {
      std::size_t nframes = 0;
      auto frames = recv_multipart(*en.sub, std::chrono::milliseconds(0), &nframes);
      if (nframes == 0) break;
      // The connection's handshake event is queued before its first message, so a loss
      // that happened before this message was received shows now: the message may be the
      // new peer's, and the socket is replaced and resynchronised instead.
      if (poll_monitor(e, en)) break;
      if (en.resync_pending) resync(e, en);  // data before its handshake event (lost event)
      const auto seq = check_frames(en, frames, nframes);  // not a KV event message: counted
      if (!seq) continue;
      if (*seq < 0) {  // a replay's end marker on the SUB socket
        count_drop(en, &EngineStatus::Dropped::negative_seq);
        continue;
      }
      ingest(e, static_cast<std::uint64_t>(*seq), bytes_of(frames[2]));
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
      while (!stop.load(std::memory_order_relaxed)) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        std::size_t count = 0;
        auto frames = recv_multipart(*en.dealer, std::min(left, kStopCheck), &count);
        if (count != 3 || frames[1].to_string_view() != kProbeTag) continue;
        a.answered = true;
        std::string scheme = "?";
        std::vector<std::uint8_t> theirs;
        try {
          if (frames[2].size() > kMaxProbeBytes) {
            throw std::length_error("over " + std::to_string(kMaxProbeBytes) + " bytes");
          }
          bool referenced = false;
          // A map of a few short fields: limits keep a crafted header from allocating.
          auto oh = msgpack::unpack(static_cast<const char*>(frames[2].data()), frames[2].size(),
                                    referenced, nullptr, nullptr,
                                    msgpack::unpack_limit(0, 16, 4096, 256, 0, 2));
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
  if (config.max_replay_events == 0) {
    throw Error(ErrorCode::kInvalidArgument, "KVIndexer: max_replay_events must be >= 1");
  }
  // Each is added to now() and replay_timeout becomes ZeroMQ's int send timeout (where -1 is
  // "block forever"): a negative or huge value would wrap. A day is far above any sane setting.
  for (const auto& [value, name] : {std::pair{config.probe_timeout, "probe_timeout"},
                                    std::pair{config.replay_timeout, "replay_timeout"},
                                    std::pair{config.replay_deadline, "replay_deadline"},
                                    std::pair{config.replay_backoff, "replay_backoff"}}) {
    if (value < std::chrono::milliseconds::zero() || value > kMaxIndexerWait) {
      throw Error(ErrorCode::kInvalidArgument, std::string("KVIndexer: ") + name +
                                                   " must be within 0 ms .. 1 day, got " +
                                                   std::to_string(value.count()) + " ms");
    }
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
  {
    std::shared_lock lock(impl_->mu);
    if (e >= impl_->engines.size()) {
      throw Error(ErrorCode::kOutOfRange, "KVIndexer::apply: unknown engine " + std::to_string(e));
    }
    if (impl_->engines[e]->endpoints) {
      // Its state belongs to the receiver thread.
      throw Error(ErrorCode::kInvalidArgument,
                  "KVIndexer::apply: engine " + std::to_string(e) + " ('" +
                      impl_->engines[e]->st.name +
                      "') is followed over ZeroMQ (connect_engine); apply() feeds only engines "
                      "added with add_engine()");
    }
  }
  if (seq >= (std::uint64_t{1} << 63)) {
    // vLLM's sequence numbers are int64 (the wire drops these as negative); next_seq would wrap.
    throw Error(ErrorCode::kInvalidArgument,
                "KVIndexer::apply: sequence number " + std::to_string(seq) + " is >= 2^63");
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

bool KVIndexer::reachable(EngineId e) const {
  std::shared_lock lock(impl_->mu);
  if (e >= impl_->engines.size()) {
    throw Error(ErrorCode::kOutOfRange,
                "KVIndexer::reachable: unknown engine " + std::to_string(e));
  }
  const auto& en = *impl_->engines[e];
  return !en.endpoints || en.st.connected;
}

EngineStatus KVIndexer::status(EngineId e) const {
  std::shared_lock lock(impl_->mu);
  if (e >= impl_->engines.size()) {
    throw Error(ErrorCode::kOutOfRange, "KVIndexer::status: unknown engine " + std::to_string(e));
  }
  EngineStatus st = impl_->engines[e]->st;
  st.gpu_blocks = impl_->index.engine_entries(e, Tier::kGpu);
  st.cpu_blocks = impl_->index.engine_entries(e, Tier::kCpu);
  return st;
}

std::vector<std::uint64_t> KVIndexer::engine_ids(EngineId e, Tier tier) const {
  std::shared_lock lock(impl_->mu);
  if (e >= impl_->engines.size()) {
    throw Error(ErrorCode::kOutOfRange,
                "KVIndexer::engine_ids: unknown engine " + std::to_string(e));
  }
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
  // now() + milliseconds::max() would overflow the clock: a year is "until it is there".
  timeout = std::min(timeout, std::chrono::milliseconds(std::chrono::hours(24 * 366)));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    {
      std::shared_lock lock(impl_->mu);
      if (e >= impl_->engines.size()) {
        throw Error(ErrorCode::kOutOfRange,
                    "KVIndexer::wait_for: unknown engine " + std::to_string(e));
      }
      const auto& st = impl_->engines[e]->st;
      if (st.next_seq && *st.next_seq >= next_seq) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace pagedkv::events
