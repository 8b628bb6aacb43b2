// pagedkv/remote/redis_store.hpp: RemoteStore on Redis (one server, or several behind a
// Redis-protocol proxy such as twemproxy), on I/O threads. hiredis connects and authenticates;
// the pipelines are written with sendmsg (a put's payload goes out from the caller's buffer, no
// copy) and their replies parsed by the store from one reusable buffer per connection (a get's
// value is checked there and copied once into its destination).
//
// Keys are "<namespace>/<hex of the block hash>"; values are remote_value.hpp's header + payload,
// bound to their block: a get checks the value against the block it asked for (RemoteGet's key,
// parent and group), and another block's value under the key is kInvalidValue, counted in
// stats().binding_mismatches.
// Only single-key GET, SET, EXISTS (and AUTH at connect) are sent, pipelined per connection, so any
// proxy that shards single-key commands works (twemproxy has no MULTI and no multi-key EXISTS).
//
// Tenants. Namespaces are key prefixes, not a security boundary: tenants sharing one Redis are
// kept apart by Redis ACL users (Redis >= 6), one per tenant, passed in the URL
// (redis://user:password@host/namespace). The store needs no more than this ACL:
//   ACL SETUSER <user> reset on ><password> ~<namespace>/* resetchannels -@all +get +set +exists
// (AUTH is always allowed; the store sends no SELECT, INFO, PING, CLIENT, SCAN or scripts; escape
// any of * ? [ ] \ in the namespace within the key pattern). A command the server refuses (NOPERM:
// a key outside the user's patterns, a command not granted) completes kError, counted in
// stats().errors - a miss for exists and get (the buffer untouched), a failed put - on the live
// connection, within the op timeout; never an exception. tests/remote/redis_acl_test.cpp shows two
// such tenants each reaching only its own namespace, and that each of the three commands is needed.
//
// Threads: `num_connections` I/O threads, each with its own connection. They take batches of up to
// `pipeline_depth` ops from one bounded FIFO, write them as one pipeline, and read the replies.
// An I/O thread never dies of an exception: one while a batch is in hand (bad_alloc) fails that
// batch kError and drops the connection; one setting up the thread's buffers is counted in
// stats().connect_failures and retried after reconnect_backoff_min.
// The queue holds at most `queue_depth` ops submitted and not yet polled: a batch that does not fit
// is refused whole (nullopt) and counted, never waited for.
//
// Timeouts and faults. Each op has a deadline: its submission time + op_timeout. An op still queued
// at its deadline completes as kTimeout (poll() and the I/O threads both expire them); a pipeline
// in flight is bounded by the earliest deadline among its ops, and on expiry its unanswered ops
// complete as kTimeout and the connection is dropped (its reply stream is no longer in step).
// A connection error fails the ops in flight as kError and drops the connection, except that a
// connection that fails before any reply (gone stale while idle, e.g. the server restarted) is
// replaced at once and the batch rerun on the new one (GET, EXISTS and SET are idempotent) when
// that reconnect (connect_timeout, twice that with AUTH) fits before the batch's earliest deadline;
// otherwise the batch fails kError at once and the next batch reconnects. A thread without a
// connection reconnects (connect_timeout, then AUTH); after a failed attempt it waits
// reconnect_backoff_min, doubling up to reconnect_backoff_max. Meanwhile (and right after a failed
// attempt) it leaves queued ops to the threads that are connected, or, when none is, fails the ops
// it takes as kError at once, so callers see prompt misses while a server is down. Redis' OOM
// reply to SET (maxmemory with noeviction) is kSkippedFull.
//
// Destruction stops the I/O threads (waiting for at most one connect or one op timeout) and drops
// ops not yet completed; after the destructor returns no buffer is touched.
//
// Errors: the constructor throws pagedkv::Error (kInvalidArgument) on a bad config (empty host or
// namespace, port 0, zero connections, queue depth or pipeline depth, a pipeline depth above
// 65536, a timeout or backoff outside [1 ms, 1 day], backoff min > max) and never connects on the
// caller's thread (an unreachable server is not an error). Submissions throw as RemoteStore says.
// std::system_error if a thread cannot be started.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/remote/remote_store.hpp"

namespace pagedkv {

struct RedisStoreConfig {
  std::string host = "127.0.0.1";
  std::uint16_t port = 6379;
  std::string username;    // ACL user for AUTH; empty: "AUTH password" (the default user)
  std::string password;    // empty: no AUTH
  std::string name_space;  // required: model, KV dtype, layout, block size, TP rank...
  std::uint64_t layout_fingerprint = 0;  // written into and checked against every value
  std::chrono::milliseconds connect_timeout{200};
  std::chrono::milliseconds op_timeout{200};
  unsigned num_connections = 2;     // I/O threads, one connection each
  std::size_t queue_depth = 4096;   // ops submitted and not yet polled
  std::size_t pipeline_depth = 32;  // ops written per round trip per connection
  std::chrono::milliseconds reconnect_backoff_min{10};
  std::chrono::milliseconds reconnect_backoff_max{1000};
  std::size_t max_value_bytes = 64u << 20;  // largest payload accepted (Redis allows 512 MiB)

  // Parses "redis://[[user]:password@]host[:port]/namespace" (port default 6379); other fields
  // keep their defaults. Throws pagedkv::Error (kParseError) naming what is wrong.
  static RedisStoreConfig from_url(std::string_view url);
};

class RedisStore final : public RemoteStore {
 public:
  explicit RedisStore(RedisStoreConfig config);
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  std::optional<RemoteTicket> exists(std::span<const BlockHash> keys) override;
  std::optional<RemoteTicket> get(std::span<const RemoteGet> ops) override;
  std::optional<RemoteTicket> put(std::span<const RemotePut> ops) override;
  std::size_t poll(std::vector<RemoteCompletion>& out) override;
  std::size_t in_flight() const override;
  RemoteStoreStats stats() const override;
  std::string_view name_space() const noexcept override;

  // Like poll(), but blocks up to max_wait until at least one completion is available. For
  // background threads, tools and tests; a scheduler thread should call poll(). A max_wait too
  // large to add to the clock (microseconds::max()) blocks until a completion is available.
  std::size_t wait(std::vector<RemoteCompletion>& out, std::chrono::microseconds max_wait);

  // The Redis key of a block under this store's namespace.
  std::string key_of(const BlockHash& hash) const;

  const RedisStoreConfig& config() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedkv
