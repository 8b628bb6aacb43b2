// tiny_engine/remote_link.hpp: the engine's side of pagedkv's remote tier (internal to the tiny
// engine). With EngineConfig::remote_url ("redis://HOST:PORT/NAMESPACE", or "file://DIR" for a
// DiskStore of EngineConfig::disk_bytes in DIR: --disk DIR) and a host tier, a run builds that
// store and a RemoteTier (pagedkv/tier/remote_tier.hpp) over the KVDriver's
// TieredKVCacheManager and host buffer:
//   add_request()     when a request arrives: its remote prefix (the blocks after its GPU + host
//                     hit) is probed in the background;
//   poll()            every scheduler step: completions routed, remote hits fetched into host
//                     slots, host blocks written through to Redis (every block the host tier
//                     caches: use --host-policy write_through to send every computed block);
//   ready(id)         the request may be admitted (kTimeout policy: the probe and its gets
//                     completed, or kTimeout after arrival); its filled blocks are then ordinary
//                     host hits that the tier's plan loads to the KV pool;
//   finish()          at the end of the run: polls until the puts in flight completed (at most
//                     kDrainTimeout) and returns the counts.
// Faults are normal: a Redis that is down, slow or full gives misses and skipped stores, counted
// in RemoteRunStats, never an exception; no wait is longer than the timeouts below.
// The value fingerprint covers everything that makes K/V bytes incompatible (model config and
// seed, KV dtype, block size, KV layout), so engines of another model sharing a namespace miss.
// file://DIR always works; redis:// needs RedisStore (TINY_ENGINE_HAS_REMOTE: hiredis), without
// it check_url() names the problem and open() throws.
// Not thread-safe: the scheduler thread calls everything.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "pagedkv/manager/request.hpp"

namespace tiny_engine {

class KVDriver;
struct EngineConfig;
struct ModelConfig;

struct RemoteRunStats {
  std::string name_space;
  std::uint64_t requests = 0;           // requests probed
  std::uint64_t probed_blocks = 0;      // block keys probed
  std::uint64_t probe_hit_blocks = 0;   // leading keys found in Redis
  std::uint64_t loaded_blocks = 0;      // blocks fetched into host slots (remote hits)
  std::uint64_t remote_hit_tokens = 0;  // tokens of those blocks
  std::uint64_t loaded_bytes = 0;
  std::uint64_t load_misses = 0;  // gets that loaded nothing (miss, corrupt, timeout, error)
  std::uint64_t fills_no_slot = 0;
  std::uint64_t ready_by_timeout = 0;
  std::uint64_t puts = 0;
  std::uint64_t stored_blocks = 0;
  std::uint64_t stored_bytes = 0;
  std::uint64_t puts_skipped = 0;
  std::uint64_t puts_failed = 0;
  std::uint64_t store_errors = 0;        // store ops completed kError (e.g. server down)
  std::uint64_t store_timeouts = 0;      // store ops completed kTimeout
  std::uint64_t rejected_values = 0;     // values found that did not check (any reason below)
  std::uint64_t binding_mismatches = 0;  // of those: another block's value under the key
  std::uint64_t connect_failures = 0;
  bool drained = true;  // every put completed before finish() returned
  // A DiskStore (file://DIR): what its start-up scan found (DiskStoreOpenStats).
  bool disk = false;
  std::uint64_t disk_recovered = 0;  // values the store found from an earlier process
  std::uint64_t disk_invalid = 0;    // slots whose record or value header did not check
  std::uint64_t disk_truncated = 0;  // slots (partly) past the end of a truncated file
};

class RemoteLink {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kTimeout{1000};        // longest wait of a request
  static constexpr std::chrono::milliseconds kOpTimeout{500};       // one store op
  static constexpr std::chrono::milliseconds kDrainTimeout{10000};  // finish()'s wait for puts

  // Throws std::invalid_argument for a malformed URL, a redis:// URL without RedisStore, or a
  // disk directory the DiskStore refuses (locked by another process, another model's store).
  // `driver` must have a host tier and outlive the link.
  static std::unique_ptr<RemoteLink> open(const EngineConfig& config, const ModelConfig& model,
                                          KVDriver& driver);
  // "" when `url` parses as redis://[[user]:password@]host[:port]/namespace (with RedisStore)
  // or is file://DIR, else the problem.
  static std::string check_url(const std::string& url);

  ~RemoteLink();
  RemoteLink(const RemoteLink&) = delete;
  RemoteLink& operator=(const RemoteLink&) = delete;

  void add_request(const pagedkv::Request& request);
  void poll();
  bool ready(pagedkv::RequestId id) const;
  void remove_request(pagedkv::RequestId id) noexcept;
  RemoteRunStats finish();

 private:
  struct Impl;
  explicit RemoteLink(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tiny_engine
