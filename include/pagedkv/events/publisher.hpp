// pagedkv/events/publisher.hpp: KVEventPublisher, vLLM's ZmqEventPublisher in C++.
//
// A PUB socket sends one multipart message per published batch: (topic, 8-byte big-endian
// sequence number, msgpack KVEventBatch; see wire.hpp). An optional ROUTER socket serves replays
// exactly as vLLM's: a client sends [empty, 8-byte start seq] and receives [empty, seq, payload]
// for every buffered batch with seq >= start, then [empty, -1, empty]. The same socket answers the
// hash-agreement probe (wire.hpp kProbeTag), which vLLM's publisher ignores; the answer also
// carries this publisher's incarnation, a random 64-bit id drawn at construction, by which an
// indexer that reconnects tells a restarted engine from the same one (indexer.hpp).
//
// Engine side, once per scheduler step:   publisher.publish(manager.take_events());
//
// publish() never blocks on I/O: it takes a short lock, numbers the batch and appends it to a
// bounded queue; a sender thread encodes and sends. When the queue is full the oldest queued batch
// is dropped and counted (stats().dropped_batches). Its sequence number is never sent, so
// subscribers see the gap: loss is never silent. A batch the PUB socket drops (high-water mark)
// stays in the replay buffer. Sequence numbers start at 0 per publisher; a subscriber that missed
// a restarted engine's first batches cannot tell it from the numbers, hence the incarnation.
//
// Endpoints follow vLLM's heuristic: bind when the endpoint contains '*' or "::" or is ipc:// or
// inproc://, else connect (KVEventPublisherConfig::bind overrides it). endpoint() and
// replay_endpoint() give the bound addresses (e.g. the port chosen for tcp://127.0.0.1:*).
//
// Thread safety: publish(), stats() and flush() may be called from any thread. Errors: the
// constructor throws pagedkv::Error (kInvalidArgument) for a bad option or an endpoint that cannot
// be bound/connected; publish() throws kInvalidState after shutdown() and kInvalidArgument for a
// batch the wire cannot carry (an empty BlockHash in a BlockStored or BlockRemoved), queuing and
// numbering nothing. The sender thread never dies from an exception: a batch it cannot encode
// (bad_alloc) is dropped and counted (dropped_batches, encode_failures).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagedkv/events/wire.hpp"
#include "pagedkv/hash/block_hasher.hpp"
#include "pagedkv/pool/kv_events.hpp"

namespace pagedkv::events {

struct KVEventPublisherConfig {
  std::string endpoint = "tcp://*:5557";
  // Bind (true) or connect (false) the PUB socket; unset: vLLM's heuristic (file comment).
  std::optional<bool> bind;
  std::optional<std::string> replay_endpoint;  // e.g. "tcp://*:5558"; none: no replay service
  std::size_t buffer_steps = 10'000;           // batches kept for replay (>= 1)
  int hwm = 100'000;                           // PUB send high-water mark (messages, >= 0)
  std::size_t max_queue_size = 100'000;        // batches waiting for the sender thread (>= 1)
  std::string topic;                           // first frame of every message
  WireOptions wire;
  // Answers hash-agreement probes with this hasher (use the manager's: manager.hasher()).
  std::optional<BlockHasher> probe_hasher;
  int linger_ms = 200;  // how long close waits for unsent messages at shutdown (>= 0)
};

struct KVEventPublisherStats {
  std::uint64_t published_batches = 0;  // numbered by publish()
  std::uint64_t sent_batches = 0;       // handed to the PUB socket
  std::uint64_t dropped_batches = 0;    // dropped from a full queue or not encodable (never sent)
  std::uint64_t encode_failures = 0;    // of which could not be encoded (e.g. bad_alloc)
  std::uint64_t send_failures = 0;      // the PUB socket refused a message (kept for replay)
  std::uint64_t replays_served = 0;
  std::uint64_t probes_served = 0;
  std::uint64_t queued = 0;  // waiting now
};

class KVEventPublisher {
 public:
  explicit KVEventPublisher(KVEventPublisherConfig config);
  ~KVEventPublisher();  // shutdown()
  KVEventPublisher(const KVEventPublisher&) = delete;
  KVEventPublisher& operator=(const KVEventPublisher&) = delete;

  // Queues one batch; empty batches are ignored (vLLM publishes only non-empty ones). Returns
  // the batch's sequence number, or std::nullopt for an empty batch.
  std::optional<std::uint64_t> publish(std::vector<KVEvent> events);

  // Waits up to `timeout` for the queue to drain into the PUB socket. True when it did. A timeout
  // above a year (milliseconds::max()) waits a year: "until drained".
  bool flush(std::chrono::milliseconds timeout);

  // Sends what is queued (up to linger_ms), stops the thread and closes the sockets. Idempotent.
  void shutdown();

  std::string endpoint() const;
  std::optional<std::string> replay_endpoint() const;
  std::uint64_t incarnation() const;  // the random id sent in probe answers
  KVEventPublisherStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedkv::events
