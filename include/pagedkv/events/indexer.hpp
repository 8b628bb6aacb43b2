// pagedkv/events/indexer.hpp: KVIndexer, the cluster's view of which engine caches which block.
//
// It follows N engines' KV event streams (vLLM's wire: ZeroMQ SUB per engine, optional replay
// ROUTER) and keeps block id -> engines, per medium (block_index.hpp). Only group 0's events (the
// full-attention group, or group_idx None) are indexed: routing looks up group 0's hashes.
//
// Per engine, batches apply in sequence order:
//   seq == expected          applied;
//   seq >  expected (a gap)  the missing batches are asked from the engine's replay socket and
//                            applied; if the replay cannot fill the gap (no replay socket, no
//                            answer within replay_timeout, past replay_deadline, or batches no
//                            longer buffered or never sent) the engine's entries are dropped and
//                            rebuilt from the events that follow (EngineStatus::gaps_lost): its
//                            entries are then a subset of its cache, never a block it does not
//                            hold;
//   seq <  expected          a new publisher (engine restart): the engine's entries are dropped
//                            and its buffered history asked from 0 (EngineStatus::restarts);
//   first batch seq > 0      a late join: history asked from 0 the same way.
// AllBlocksCleared drops the engine's entries.
//
// Restarts whatever the sequence numbers: a restarted engine's numbers start again at 0, but the
// indexer may hear none of its first batches (it publishes while the SUB reconnects), so the
// first one it hears may be at or past the expected number and look in order, or like a gap. The
// sequence rules cannot see that; the connection can. Each connected engine's SUB socket is
// watched with a ZeroMQ socket monitor, and a restarted engine is necessarily a lost connection
// and a new one. In each poll the receiver reads an engine's monitor events before its data, and
// again after each message it receives (ZeroMQ queues a connection's handshake event before its
// first message), so no message of a new connection is ever applied as the old one's. When the
// connection is lost (ZMQ_EVENT_DISCONNECTED) the SUB socket is closed, discarding what it still
// queued (from either side of the loss), and a fresh one connects. Once it completes a handshake
// (EngineStatus::reconnects) the engine is resynchronised:
//   - an engine that answered the probe with an incarnation (pagedkv publishers send a random
//     id per instance, wire.hpp kProbeTag) is probed again: the same incarnation keeps its
//     entries and asks the replay socket for everything from the expected number on (what the
//     closed socket held or the engine sent meanwhile; the gap rules above apply to the answer);
//     a new incarnation is a restart (EngineStatus::restarts);
//   - a restart, an engine that does not tell its incarnation (a stock vLLM: no probe answer; or
//     no hasher configured, so no probe), or no answer now: its entries are dropped and rebuilt
//     from its replay buffer from 0 and the events that follow (EngineStatus::unverified_resyncs
//     when it was not a known restart). So for such engines every reconnect, even a network
//     blip, rebuilds the entries; they stay a subset of the engine's cache (the replay buffer may
//     not reach back to the oldest cached block).
// Batches the fresh socket delivers that the resync's replay already applied are skipped. A
// connection that fails its handshake delivered nothing: the socket is kept and retries at
// ZeroMQ's reconnect interval (no churn against a peer that accepts and closes). The monitor
// subscribes to two event kinds and is drained every poll; its queue is ZeroMQ's, bounded. What
// remains: between an engine's death and the indexer's reconnect (ZeroMQ's reconnect interval,
// 100 ms by default, then one probe round trip) the old entries stand, since nothing can be known
// sooner; EngineStatus::connected says whether the engine is connected now, and in_sync
// whether its entries were checked since (KVRouter gives an engine not in sync no credit). As at
// the first connection, batches published after the resync's replay but before the new subscription
// reaches the engine are seen (and fetched) only when a later batch arrives. A restarted engine
// that now hashes differently is reported (ProbeResult::kDisagreed), not refused, since the
// receiver thread cannot throw; its blocks never match a request. Engines fed through apply()
// have no connection: for them only the sequence rules hold.
//
// Hash agreement: with `hasher` set, connect_engine() asks the engine (replay socket, wire.hpp
// kProbeTag) for the hash of a fixed probe block and throws pagedkv::Error (kInvalidArgument)
// naming both hashes and schemes when it differs from this indexer's: such an engine's blocks
// would never match a request. An engine that does not answer (a stock vLLM) is indexed but
// reported as unverified (EngineStatus::probe).
//
// Hostile engines: everything an engine sends is bounded and costs in proportion to that
// engine's own entries. A clear, a loss, a restart or a bad payload removes only its entries
// (BlockIndex keeps each engine's ids), in spans of a few thousand operations under the exclusive
// lock, lookups getting in between; tables that must grow or shrink are rebuilt outside the
// exclusive lock and swapped in. An engine holds at most max_entries_per_engine entries (stores
// past it are counted, not applied); a payload is bounded in bytes (also ZeroMQ's
// ZMQ_MAXMSGSIZE on the sockets), in decoded values and in nesting, and bytes after a batch make
// it a bad payload; every dropped frame is counted with its reason (EngineStatus::dropped). A
// replay has a total deadline and bounds on its frames and ids: past them the engine's entries
// are dropped, it is marked not in sync and neither replayed nor probed for replay_backoff
// (gaps meanwhile are losses); so is a replay that falls silent for replay_timeout. A probe
// exchange is bounded by probe_timeout as a whole. stop() is seen within ~50 ms, also in the
// middle of a replay or a probe. The
// table's memory is returned as entries go (block_index.hpp: shrink under load 0.125).
//
// Threads: start() runs one receiver thread for the connected engines (replays and resync probes
// block it, up to replay_deadline / probe_timeout, never the caller); apply() feeds a batch
// in-process (same rules, no replay) for engines added with add_engine(); calls for one engine
// must not run concurrently. Lookups (match(), status(), engine_ids()) may run on any thread
// concurrently with updates (a shared lock; one lookup takes it once) and may see a batch partly
// applied; the exclusive lock is held for at most ~4,096 index operations at a time.
// Errors: pagedkv::Error for bad arguments; a dead or misbehaving engine is a status, never an
// exception (a malformed batch is counted in EngineStatus::bad_batches and ::dropped).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pagedkv/events/block_index.hpp"
#include "pagedkv/events/wire.hpp"
#include "pagedkv/hash/block_hasher.hpp"

namespace pagedkv::events {

using EngineId = std::size_t;

struct EngineEndpoints {
  std::string name;
  std::string endpoint;                        // the engine's PUB socket, e.g. tcp://10.0.0.2:5557
  std::optional<std::string> replay_endpoint;  // its ROUTER socket, e.g. tcp://10.0.0.2:5558
};

// The bound on KVIndexerConfig's durations (probe_timeout, replay_timeout, replay_deadline,
// replay_backoff): each within 0 ms .. kMaxIndexerWait, else the constructor throws
// pagedkv::Error (kInvalidArgument) naming it.
inline constexpr std::chrono::milliseconds kMaxIndexerWait = std::chrono::hours(24);

struct KVIndexerConfig {
  std::string topic;  // subscription prefix ("" = everything)
  // The cluster's hasher (scheme and seed). When set, engines are probed on connect.
  std::optional<BlockHasher> hasher;
  std::uint32_t probe_block_size = 16;           // tokens in the probe block (0, 1, 2, ...)
  std::chrono::milliseconds probe_timeout{500};  // a whole probe exchange
  // Silence between two replay replies. A replay that falls silent this long is abandoned as
  // one past its bounds is (EngineStatus::replays_aborted_silent, then replay_backoff), so a
  // replay socket that never answers costs one replay_timeout per replay_backoff, not per gap.
  std::chrono::milliseconds replay_timeout{1000};
  // A whole replay, and what it may bring (frames of any kind; block ids in the batches): past
  // either the replay is abandoned (EngineStatus::replays_aborted_*), the engine's entries are
  // dropped and rebuilt from the events that follow, and it is not in sync and neither replayed
  // nor probed again for replay_backoff. A legitimate replay is one frame per buffered batch
  // (vLLM buffers 10,000 steps by default) and the end marker.
  // The receiver thread serves no other engine during a replay, so replay_deadline bounds how
  // long one engine can hold the others' indexing up, once per replay_backoff.
  std::chrono::milliseconds replay_deadline{2000};
  std::size_t max_replay_frames = 20'000;
  std::size_t max_replay_ids = std::size_t{1} << 22;
  // Decoded events a replay may bring (>= 1), whatever they hold: the replay's batches are kept
  // decoded until it ends (~150 B per event), and events without block ids (AllBlocksCleared)
  // escape max_replay_ids (one 16 MiB frame can hold 2^19 of them).
  std::size_t max_replay_events = std::size_t{1} << 20;
  std::chrono::milliseconds replay_backoff{30'000};
  // Entries ((id, medium) pairs) one engine may hold; stores past it are ignored and counted
  // (EngineStatus::ids_over_cap): the entries stay a subset of the engine's cache. ~50 B each at
  // most (block_index.hpp), so the default bounds one engine at ~100 MB.
  std::size_t max_entries_per_engine = std::size_t{1} << 21;
  // Bounds on one payload (wire.hpp); max_bytes is also the sockets' ZMQ_MAXMSGSIZE (a peer
  // sending a larger frame is disconnected by ZeroMQ, and resynchronised when it reconnects).
  DecodeLimits decode;
  int rcvhwm = 100'000;  // SUB receive high-water mark (messages)
};

enum class ProbeResult : std::uint8_t {
  kNotAsked,    // no hasher configured, or no replay endpoint
  kAgreed,      // the engine hashes exactly as this indexer
  kUnanswered,  // no answer within probe_timeout (e.g. a stock vLLM publisher)
  kDisagreed,   // after a reconnect: the engine now hashes differently or cannot hash
};

struct EngineStatus {
  std::string name;
  ProbeResult probe = ProbeResult::kNotAsked;
  std::optional<std::uint64_t> incarnation;  // its publisher's id, from its last probe answer
  bool connected = false;  // its SUB socket holds a connection (connected engines)
  // Its entries may be trusted as a subset of its cache: always for engines fed through apply();
  // for connected engines from their first connection on, false from a lost connection until
  // the new one is resynchronised (KVRouter gives no prefix credit meanwhile).
  bool in_sync = false;
  std::optional<std::uint64_t> next_seq;  // the sequence number expected next
  std::uint64_t batches_applied = 0;
  std::uint64_t batches_replayed = 0;    // of which came through the replay socket
  std::uint64_t gaps = 0;                // gaps seen
  std::uint64_t gaps_lost = 0;           // gaps the replay could not fill (entries rebuilt)
  std::uint64_t reconnects = 0;          // connections made again after a lost one (each resyncs)
  std::uint64_t restarts = 0;            // new publishers: a sequence reset or a new incarnation
  std::uint64_t unverified_resyncs = 0;  // reconnects whose incarnation was unknown: rebuilt
  std::uint64_t clears = 0;              // AllBlocksCleared received
  std::uint64_t bad_batches = 0;         // undecodable payloads (skipped): the sum of the
                                         // payload reasons in `dropped`
  std::uint64_t ids_over_cap = 0;        // stores ignored past max_entries_per_engine
  std::uint64_t stores_no_memory = 0;    // stores skipped for a failed allocation (bad_alloc)
  std::uint64_t replays_aborted_deadline = 0;  // replays past replay_deadline
  std::uint64_t replays_aborted_size = 0;      // past max_replay_frames, _ids or _events
  std::uint64_t replays_aborted_silent = 0;    // no reply within replay_timeout (or unsendable)
  std::uint64_t replays_skipped = 0;           // not asked: within replay_backoff of an abort
  // Exceptions on the receiver thread while handling this engine (an allocation that failed):
  // its entries were dropped and are rebuilt from what follows.
  std::uint64_t receiver_errors = 0;
  // Frames dropped, by reason (from the SUB socket, the replay socket, or apply()).
  struct Dropped {
    std::uint64_t wrong_frame_count = 0;  // a message of other than 3 frames
    std::uint64_t bad_seq_size = 0;       // a sequence-number frame of other than 8 bytes
    std::uint64_t negative_seq = 0;       // a sequence number >= 2^63 (other than a replay's end)
    std::uint64_t too_large = 0;          // a payload over decode.max_bytes
    std::uint64_t too_many_elements = 0;  // over decode.max_elements values or max_depth
    std::uint64_t trailing_bytes = 0;     // bytes after a valid KVEventBatch
    std::uint64_t malformed = 0;          // not a KVEventBatch
    std::uint64_t total() const noexcept {
      return wrong_frame_count + bad_seq_size + negative_seq + too_large + too_many_elements +
             trailing_bytes + malformed;
    }
  } dropped;
  std::uint64_t gpu_blocks = 0;  // ids indexed for this engine on GPU / CPU
  std::uint64_t cpu_blocks = 0;
};

class KVIndexer {
 public:
  explicit KVIndexer(KVIndexerConfig config = {});
  ~KVIndexer();  // stop()
  KVIndexer(const KVIndexer&) = delete;
  KVIndexer& operator=(const KVIndexer&) = delete;

  // An engine fed in-process through apply(). Throws kOutOfRange past BlockIndex::kMaxEngines.
  EngineId add_engine(std::string name);
  // An engine followed over ZeroMQ (before start()). Probes it when a hasher is configured;
  // throws pagedkv::Error (kInvalidArgument) when its probe hash differs, kInvalidState after
  // start(), kOutOfRange past kMaxEngines.
  EngineId connect_engine(const EngineEndpoints& engine);

  void start();  // the receiver thread (no-op without connected engines)
  void stop();   // idempotent

  // One batch of engine `e` (in-process feed). Never throws for a bad payload (counted). Throws
  // pagedkv::Error, changing nothing: kOutOfRange for an unknown engine, kInvalidArgument for an
  // engine added with connect_engine() (the receiver thread owns its state) or seq >= 2^63.
  // Under std::bad_alloc it is all or nothing: room for the batch's stores is made before
  // anything changes (a failure there throws, changing nothing), after which the batch is applied
  // whole; a store that still cannot allocate (an extra copy's count) is skipped and counted
  // (EngineStatus::stores_no_memory), leaving the entries a subset of the engine's cache.
  void apply(EngineId e, std::uint64_t seq, std::span<const std::uint8_t> payload);

  // Per engine (index = EngineId): the longest prefix of `block_ids` it caches.
  std::vector<PrefixMatch> match(std::span<const std::uint64_t> block_ids) const;
  void match(std::span<const std::uint64_t> block_ids, std::span<PrefixMatch> out) const;

  std::size_t num_engines() const;
  EngineStatus status(EngineId e) const;
  // status(e).in_sync without copying the status. Throws kOutOfRange for an unknown engine.
  bool in_sync(EngineId e) const;
  // False only for an engine followed over ZeroMQ whose connection is down now (status(e).
  // connected false: lost, or not yet made); engines fed through apply() have no connection to
  // lose and are always reachable. Throws kOutOfRange for an unknown engine.
  bool reachable(EngineId e) const;
  // Sorted. Throws kOutOfRange for an unknown engine.
  std::vector<std::uint64_t> engine_ids(EngineId e, Tier tier) const;
  std::size_t memory_bytes() const;
  std::size_t num_entries() const;

  // Waits until every connected engine's next_seq >= the given value (tests). True if reached.
  bool wait_for(EngineId e, std::uint64_t next_seq, std::chrono::milliseconds timeout) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedkv::events
