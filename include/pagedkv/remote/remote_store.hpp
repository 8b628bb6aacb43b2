// pagedkv/remote/remote_store.hpp: a shared store of block bytes below the host tier (the shape of
// LMCache's and SGLang HiCache's storage backends), keyed by BlockHash under a namespace.
//
// The engine sets the namespace to everything that makes block bytes incompatible (model, KV
// dtype, layout, block size, tensor-parallel rank...); the tenant salt is already in the hash.
// Values carry a header (remote_value.hpp) binding them to their block: a get checks the value
// against the block it asked for (key, parent hash, group); a value that does not check - another
// block's value under this key included - is a miss, counted, never loaded.
//
// Operations are batched and asynchronous. exists(), get() and put() submit a batch and return at
// once with a ticket, or with nullopt when the store's bounded queue cannot take the whole batch
// (nothing was submitted; the drop is counted in stats().queue_full_drops). They never block on
// the network. Each operation of an accepted batch later yields exactly one RemoteCompletion
// (ticket, index in the batch, result), handed out by poll(), which never blocks either.
//
// Buffers: the caller owns them (typically host-tier slot memory). A get's destination and a
// put's source must stay alive and untouched by the caller from submission until that op's
// completion has been returned by poll() (or the store is destroyed). A get's destination holds
// the checked payload when the result is kHit; on any other result its bytes are unspecified (a
// store may read a value into it before checking it: DiskStore does; RedisStore writes it only on
// kHit) and the caller must not use them. The one caller, RemoteTier (src/tier/remote_tier.cpp),
// fills a host slot taken for the fill (TieredKVCacheManager::begin_fill_known: free, not cached,
// read by nobody) and commits it failed on any result but kHit, which frees the slot uncached:
// its bytes are never read before a later store or fill rewrites them.
//
// Faults are normal outcomes, never exceptions: a server that is down, slow, restarted or full
// gives kError, kTimeout or kSkippedFull results, counted in stats(). Every operation completes
// (poll returns it) no later than its submission time plus the store's operation timeout, plus
// however late the caller polls.
//
// Errors: only misuse throws pagedkv::Error (kInvalidArgument), before anything is submitted: an
// empty key, a buffer larger than the store's maximum value size, an empty get destination.
// Thread safety: implementations are thread-safe (every call may run on any thread); a scheduler
// thread typically submits and polls, and the store's own I/O threads do the network work.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "pagedkv/hash/block_hash.hpp"
#include "pagedkv/pool/kv_cache_block.hpp"
#include "pagedkv/remote/remote_value.hpp"

namespace pagedkv {

// The longest timeout or backoff a store or the remote tier accepts (their configs refuse more by
// name): deadlines are computed as now + timeout on the steady clock, which a longer one (say
// milliseconds::max(), meant as "never") would overflow.
inline constexpr std::chrono::milliseconds kMaxRemoteTimeout = std::chrono::hours(24);

// Names one accepted batch; unique per store, increasing from 1.
using RemoteTicket = std::uint64_t;

enum class RemoteOpKind : std::uint8_t { kExists, kGet, kPut };

enum class RemoteResult : std::uint8_t {
  kHit,           // exists: the key is present; get: the checked payload was written to the buffer
  kMiss,          // exists / get: no value under the key
  kInvalidValue,  // get: a value is present but its header, fingerprint, length, binding (it
                  // belongs to another block) or checksum did not match; a miss (the buffer's
                  // bytes are unspecified), counted in stats
  kStored,        // put: the value is stored
  kSkippedFull,   // put: the store refused it for lack of memory (e.g. Redis maxmemory +
                  // noeviction); a normal outcome, counted
  kTimeout,       // no reply within the operation timeout (a get's buffer: unspecified)
  kError,         // the store is unreachable, refused the op (AUTH, an ACL's NOPERM) or replied
                  // an error
};

std::string_view to_string(RemoteOpKind kind) noexcept;
std::string_view to_string(RemoteResult result) noexcept;

// One get: the payload of `key` is written to `dest`, whose size is the block's payload size (a
// stored value of any other length is kInvalidValue). The value must be bound to this block: its
// header's block hash `key`, parent hash `parent` (the previous block's hash; empty for a chain's
// block 0), `group` and prefix identity `identity`, and have the KV format (kv_dtype,
// kv_scale_mode) asked for (remote_value.hpp); any other is kInvalidValue.
struct RemoteGet {
  BlockHash key;
  std::span<std::byte> dest;
  BlockHash parent{};
  GroupId group = 0;
  BlockHash identity{};  // the block's prefix identity (remote_value.hpp); empty: none
  std::uint8_t kv_dtype = kKVDtypeBFloat16Value;  // the KV format the value must have
  std::uint8_t kv_scale_mode = kKVScaleNone;
};

// One put: `src` (the block's payload) is stored under `key`, replacing any previous value, bound
// to (key, parent, group) as a get of it expects.
struct RemotePut {
  BlockHash key;
  std::span<const std::byte> src;
  BlockHash parent{};
  GroupId group = 0;
  BlockHash identity{};
  std::uint8_t kv_dtype = kKVDtypeBFloat16Value;
  std::uint8_t kv_scale_mode = kKVScaleNone;
};

// The block a put's value is bound to, and a get's value must be (remote_value.hpp). Every
// backend (Redis, a disk store) writes encode_remote_value_header(fingerprint, binding_of(put),
// put.src) before the payload, and loads a value into a get's buffer only when
// check_remote_value(value, fingerprint, get.dest.size(), binding_of(get)) is kOk.
inline RemoteValueBinding binding_of(const RemoteGet& g) noexcept {
  return {g.key, g.parent, g.group, g.identity, g.kv_dtype, g.kv_scale_mode};
}
inline RemoteValueBinding binding_of(const RemotePut& p) noexcept {
  return {p.key, p.parent, p.group, p.identity, p.kv_dtype, p.kv_scale_mode};
}

struct RemoteCompletion {
  RemoteTicket ticket = 0;
  std::uint32_t index = 0;  // position of the op in its batch
  RemoteOpKind kind = RemoteOpKind::kExists;
  RemoteResult result = RemoteResult::kError;
};

struct RemoteLatency {
  std::uint64_t count = 0;
  std::uint64_t p50_us = 0;  // upper bucket edges (LatencyHistogram): at most 6.25% high
  std::uint64_t p99_us = 0;
};

// Counters since construction. Latencies run from submission to completion (queueing included).
struct RemoteStoreStats {
  std::uint64_t probes = 0;              // exists ops completed
  std::uint64_t probe_hits = 0;          // ... that found the key
  std::uint64_t gets = 0;                // get ops completed
  std::uint64_t hits = 0;                // ... loaded (kHit)
  std::uint64_t misses = 0;              // ... kMiss or kInvalidValue
  std::uint64_t puts = 0;                // put ops completed
  std::uint64_t stored = 0;              // ... kStored
  std::uint64_t skipped_full = 0;        // ... kSkippedFull
  std::uint64_t bytes_in = 0;            // payload bytes loaded into get buffers
  std::uint64_t bytes_out = 0;           // payload bytes of stored puts
  std::uint64_t timeouts = 0;            // ops of any kind completed as kTimeout
  std::uint64_t errors = 0;              // ops of any kind completed as kError
  std::uint64_t checksum_failures = 0;   // gets rejected for their payload checksum
  std::uint64_t header_mismatches = 0;   // gets rejected for magic, version, fingerprint or length
  std::uint64_t binding_mismatches = 0;  // gets rejected: the value belongs to another block
  std::uint64_t format_mismatches = 0;   // gets rejected: another KV dtype or scale mode
  std::uint64_t queue_full_drops = 0;    // ops in batches refused because the queue was full
  std::uint64_t connects = 0;            // successful (re)connections
  std::uint64_t connect_failures = 0;    // failed connection attempts (incl. AUTH refused)
  RemoteLatency exists_latency;
  RemoteLatency get_latency;
  RemoteLatency put_latency;
};

class RemoteStore {
 public:
  virtual ~RemoteStore() = default;

  // Submit a batch (see the file comment). An empty batch is accepted and completes nothing.
  virtual std::optional<RemoteTicket> exists(std::span<const BlockHash> keys) = 0;
  virtual std::optional<RemoteTicket> get(std::span<const RemoteGet> ops) = 0;
  virtual std::optional<RemoteTicket> put(std::span<const RemotePut> ops) = 0;

  // Appends every completion available now to `out` (in no promised order across batches) and
  // returns how many it appended. Never blocks on the network. Reusing `out` (clear() between
  // calls) keeps it allocation-free in steady state.
  virtual std::size_t poll(std::vector<RemoteCompletion>& out) = 0;

  // Ops submitted and not yet returned by poll().
  virtual std::size_t in_flight() const = 0;

  virtual RemoteStoreStats stats() const = 0;
  virtual std::string_view name_space() const noexcept = 0;
};

}  // namespace pagedkv
