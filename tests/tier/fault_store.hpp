// tests/tier/fault_store.hpp: an in-memory RemoteStore (remote/remote_store.hpp) for the remote
// tier's model test and fuzzer (remote_episode.hpp), deterministic and driven by the episode's
// random source, injecting every normal fault of the store contract:
//   - ops answered kError or kTimeout (a timed-out put may still have been applied, as on a real
//     server), puts refused kSkippedFull when the backend holds its capacity of values;
//   - batches refused with nullopt when the bounded queue cannot take them whole (counted in
//     queue_full_drops), and at random;
//   - completions delayed across polls (each op is due 0..max_delay polls after its submission)
//     and handed out in a shuffled order; ops run when they complete, so a value can be evicted
//     (or damaged, or replaced) between a probe and the get that follows it;
//   - a get's destination scribbled on any result but kHit (with the rejected value's payload or
//     random bytes, as a store reading a value into the buffer before checking it may leave it);
//   - hostile values, by FaultBackend's mutators: a byte of a stored value flipped (header or
//     payload), a value copied under another key, a value made longer or shorter, a value
//     re-stamped with another layout fingerprint or KV format over garbage payload bytes.
// Values are stored exactly as the real backends store them: encode_remote_value_header() on put
// before the payload, and a get loads a value only when check_remote_value() against the get's
// binding is kOk (else kInvalidValue, counted by kind), as DiskStore and RedisStore do.
//
// Two engines share one FaultBackend through one FaultStore each (as two engines share one Redis
// server through one RedisStore each): values of "another engine" arrive that way. Each
// FaultStore has its own tickets, queue and completions; the tier polling it is its only caller.
// Misuse throws pagedkv::Error (kInvalidArgument) before anything is submitted, as the contract
// says: an empty key, a buffer larger than max_value_bytes, an empty get destination.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/remote/remote_store.hpp"
#include "pagedkv/remote/remote_value.hpp"

namespace pagedkv::remote_test {

// The values a namespace holds (shared by every FaultStore of the episode). Insertion-ordered
// (deterministic choices by index).
struct FaultBackend {
  std::size_t capacity = 64;  // values at most; a put of a new key beyond it is kSkippedFull
  std::vector<std::pair<BlockHash, std::vector<std::byte>>> values;
  std::uint64_t hostile = 0;  // values damaged or misplaced by the mutators below

  std::vector<std::byte>* find(const BlockHash& key) {
    for (auto& [k, v] : values) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  void erase(const BlockHash& key) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (values[i].first == key) {
        values.erase(values.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
    }
  }

  // Hostile mutations (see the file comment); each picks its victims from `rng`. No-ops on an
  // empty backend.
  template <typename R>
  void evict(R& rng) {
    if (values.empty()) return;
    values.erase(values.begin() + static_cast<std::ptrdiff_t>(rng() % values.size()));
  }
  template <typename R>
  void flip_byte(R& rng) {
    if (values.empty()) return;
    std::vector<std::byte>& v = values[rng() % values.size()].second;
    if (v.empty()) return;
    // Half the time in the header (binding, checksum, magic...), else anywhere.
    const std::size_t at =
        rng() % 2 == 0 ? rng() % std::min(v.size(), kRemoteValueHeaderSize) : rng() % v.size();
    v[at] ^= static_cast<std::byte>(1u << (rng() % 8));
    ++hostile;
  }
  template <typename R>
  void move_value(R& rng) {
    if (values.size() < 2) return;
    const std::size_t from = rng() % values.size();
    const std::size_t to = rng() % values.size();
    if (from == to) return;
    values[to].second = values[from].second;  // a genuine value of another block under this key
    if (rng() % 2 == 0) values.erase(values.begin() + static_cast<std::ptrdiff_t>(from));
    ++hostile;
  }
  template <typename R>
  void resize_value(R& rng) {
    if (values.empty()) return;
    std::vector<std::byte>& v = values[rng() % values.size()].second;
    if (rng() % 2 == 0 || v.size() < 2) {
      const std::size_t extra = 1 + rng() % 16;
      for (std::size_t i = 0; i < extra; ++i) v.push_back(static_cast<std::byte>(rng()));
    } else {
      v.resize(v.size() - 1 - rng() % (v.size() - 1));
    }
    ++hostile;
  }
  // Another layout's or KV format's value of the same block: the binding (parsed from the value's
  // own header) kept, the fingerprint made another than `fingerprint` (the engines') or the KV
  // dtype one no engine writes (`foreign_dtype`), the payload garbage, the checksum valid: only
  // the fingerprint / format check can reject it. (Never a value every check passes: that would
  // be a forgery, which the value format does not defend against; remote_value.hpp.)
  template <typename R>
  void restamp(R& rng, std::uint64_t fingerprint, std::uint8_t foreign_dtype) {
    if (values.empty()) return;
    std::vector<std::byte>& v = values[rng() % values.size()].second;
    if (v.size() <= kRemoteValueHeaderSize) return;
    const auto u8 = [&v](std::size_t at) { return std::to_integer<std::uint8_t>(v[at]); };
    const auto hash_at = [&](std::size_t at, std::size_t size) {
      if (size != 16 && size != 32) return BlockHash();
      std::vector<std::uint8_t> b(size);
      for (std::size_t i = 0; i < size; ++i) b[i] = u8(at + i);
      return BlockHash(b);
    };
    if (u8(32) != 16 && u8(32) != 32) return;  // damaged already
    RemoteValueBinding b;
    b.block = hash_at(40, u8(32));
    b.parent = hash_at(72, u8(33));
    b.group = u8(34);
    b.identity = hash_at(104, u8(35));
    b.kv_dtype = u8(36);
    b.kv_scale_mode = u8(37);
    if (rng() % 2 == 0) {
      fingerprint ^= 1 + rng() % 255;
    } else {
      b.kv_dtype = foreign_dtype;
    }
    for (std::size_t i = kRemoteValueHeaderSize; i < v.size(); ++i)
      v[i] = static_cast<std::byte>(rng());
    const RemoteValueHeader h = encode_remote_value_header(
        fingerprint, b, std::span<const std::byte>(v).subspan(kRemoteValueHeaderSize));
    std::memcpy(v.data(), h.data(), h.size());
    ++hostile;
  }
};

struct FaultConfig {
  std::string name_space = "fault-store";
  std::uint64_t fingerprint = 0;
  std::size_t max_value_bytes = 1 << 16;  // payload bytes; a larger buffer is misuse
  std::size_t queue_capacity = 64;        // ops in flight at most
  unsigned error_percent = 0;             // per op
  unsigned timeout_percent = 0;           // per op
  unsigned refuse_percent = 0;            // per batch (nullopt)
  unsigned max_delay = 0;                 // polls
};

// R: a uniform random bit generator (the episode's), used by reference; must outlive the store.
template <typename R>
class FaultStore final : public RemoteStore {
 public:
  FaultStore(FaultBackend& backend, R& rng, FaultConfig config)
      : backend_(backend), rng_(rng), config_(std::move(config)) {}

  std::optional<RemoteTicket> exists(std::span<const BlockHash> keys) override {
    for (const BlockHash& k : keys) check_key(k);
    if (!admit(keys.size())) return std::nullopt;
    const RemoteTicket t = next_ticket_++;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      Op op;
      op.kind = RemoteOpKind::kExists;
      op.get.key = keys[i];
      enqueue(std::move(op), t, i);
    }
    return t;
  }

  std::optional<RemoteTicket> get(std::span<const RemoteGet> ops) override {
    for (const RemoteGet& g : ops) {
      check_key(g.key);
      if (g.dest.empty()) misuse("an empty get destination");
      if (g.dest.size() > config_.max_value_bytes) misuse("a get destination above the maximum");
    }
    if (!admit(ops.size())) return std::nullopt;
    const RemoteTicket t = next_ticket_++;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      Op op;
      op.kind = RemoteOpKind::kGet;
      op.get = ops[i];
      enqueue(std::move(op), t, i);
    }
    return t;
  }

  std::optional<RemoteTicket> put(std::span<const RemotePut> ops) override {
    for (const RemotePut& p : ops) {
      check_key(p.key);
      if (p.src.size() > config_.max_value_bytes) misuse("a put source above the maximum");
    }
    if (!admit(ops.size())) return std::nullopt;
    const RemoteTicket t = next_ticket_++;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      Op op;
      op.kind = RemoteOpKind::kPut;
      op.put = ops[i];
      enqueue(std::move(op), t, i);
    }
    return t;
  }

  // One tick: every op due now runs (in a shuffled order) and completes.
  std::size_t poll(std::vector<RemoteCompletion>& out) override {
    ++tick_;
    due_.clear();
    for (std::size_t i = 0; i < queue_.size();) {
      if (queue_[i].due <= tick_) {
        due_.push_back(std::move(queue_[i]));
        queue_[i] = std::move(queue_.back());
        queue_.pop_back();
      } else {
        ++i;
      }
    }
    for (std::size_t k = due_.size(); k > 1; --k) std::swap(due_[k - 1], due_[rng_() % k]);
    for (Op& op : due_) out.push_back({op.ticket, op.index, op.kind, run(op)});
    return due_.size();
  }

  std::size_t in_flight() const override { return queue_.size(); }
  RemoteStoreStats stats() const override { return stats_; }
  std::string_view name_space() const noexcept override { return config_.name_space; }

  // Gets answered kInvalidValue (the tier's rejected_values must match).
  std::uint64_t invalid_values() const noexcept { return invalid_values_; }

 private:
  struct Op {
    RemoteOpKind kind = RemoteOpKind::kExists;
    RemoteGet get;  // exists: the key only
    RemotePut put;
    RemoteTicket ticket = 0;
    std::uint32_t index = 0;
    std::uint64_t due = 0;
  };

  [[noreturn]] static void misuse(const char* what) {
    throw Error(ErrorCode::kInvalidArgument, std::string("FaultStore: ") + what);
  }
  static void check_key(const BlockHash& k) {
    if (k.empty()) misuse("an empty key");
  }

  bool admit(std::size_t n) {
    if (queue_.size() + n > config_.queue_capacity ||
        (config_.refuse_percent > 0 && rng_() % 100 < config_.refuse_percent)) {
      stats_.queue_full_drops += n;
      return false;
    }
    return true;
  }

  void enqueue(Op&& op, RemoteTicket t, std::size_t i) {
    op.ticket = t;
    op.index = static_cast<std::uint32_t>(i);
    op.due = tick_ + 1 + (config_.max_delay == 0 ? 0 : rng_() % (config_.max_delay + 1));
    queue_.push_back(std::move(op));
  }

  // A fault for this op, or kHit (none).
  RemoteResult fault() {
    const auto x = static_cast<unsigned>(rng_() % 100);
    if (x < config_.error_percent) return RemoteResult::kError;
    if (x < config_.error_percent + config_.timeout_percent) return RemoteResult::kTimeout;
    return RemoteResult::kHit;
  }

  void scribble(std::span<std::byte> dest, const std::vector<std::byte>* value) {
    if (rng_() % 2 == 0) return;
    for (std::size_t i = 0; i < dest.size(); ++i) {
      const std::size_t at = kRemoteValueHeaderSize + i;
      dest[i] =
          value != nullptr && at < value->size() ? (*value)[at] : static_cast<std::byte>(rng_());
    }
  }

  RemoteResult run(Op& op) {
    const RemoteResult f = fault();
    const RemoteResult r = f != RemoteResult::kHit ? failed(op, f) : execute(op);
    if (r == RemoteResult::kTimeout) ++stats_.timeouts;
    if (r == RemoteResult::kError) ++stats_.errors;
    switch (op.kind) {
      case RemoteOpKind::kExists:
        ++stats_.probes;
        if (r == RemoteResult::kHit) ++stats_.probe_hits;
        break;
      case RemoteOpKind::kGet:
        ++stats_.gets;
        if (r == RemoteResult::kHit) {
          ++stats_.hits;
          stats_.bytes_in += op.get.dest.size();
        }
        if (r == RemoteResult::kMiss || r == RemoteResult::kInvalidValue) ++stats_.misses;
        if (r == RemoteResult::kInvalidValue) ++invalid_values_;
        break;
      case RemoteOpKind::kPut:
        ++stats_.puts;
        if (r == RemoteResult::kStored) {
          ++stats_.stored;
          stats_.bytes_out += op.put.src.size();
        }
        if (r == RemoteResult::kSkippedFull) ++stats_.skipped_full;
        break;
    }
    return r;
  }

  RemoteResult failed(Op& op, RemoteResult f) {
    if (op.kind == RemoteOpKind::kGet) scribble(op.get.dest, nullptr);
    // A put that timed out may have reached the server all the same.
    if (op.kind == RemoteOpKind::kPut && f == RemoteResult::kTimeout && rng_() % 2 == 0) {
      (void)store_value(op.put);
    }
    return f;
  }

  bool store_value(const RemotePut& p) {
    std::vector<std::byte>* v = backend_.find(p.key);
    if (v == nullptr) {
      if (backend_.values.size() >= backend_.capacity) return false;
      backend_.values.emplace_back(p.key, std::vector<std::byte>());
      v = &backend_.values.back().second;
    }
    const RemoteValueHeader h =
        encode_remote_value_header(config_.fingerprint, binding_of(p), p.src);
    v->assign(h.begin(), h.end());
    v->insert(v->end(), p.src.begin(), p.src.end());
    return true;
  }

  RemoteResult execute(Op& op) {
    switch (op.kind) {
      case RemoteOpKind::kExists:
        return backend_.find(op.get.key) != nullptr ? RemoteResult::kHit : RemoteResult::kMiss;
      case RemoteOpKind::kPut:
        return store_value(op.put) ? RemoteResult::kStored : RemoteResult::kSkippedFull;
      case RemoteOpKind::kGet:
        break;
    }
    const RemoteGet& g = op.get;
    const std::vector<std::byte>* v = backend_.find(g.key);
    if (v == nullptr) {
      scribble(g.dest, nullptr);
      return RemoteResult::kMiss;
    }
    // The library's own check, as DiskStore and RedisStore run it.
    const RemoteValueCheck c =
        check_remote_value(*v, config_.fingerprint, g.dest.size(), binding_of(g));
    switch (c) {
      case RemoteValueCheck::kOk:
        std::memcpy(g.dest.data(), v->data() + kRemoteValueHeaderSize, g.dest.size());
        return RemoteResult::kHit;
      case RemoteValueCheck::kBindingMismatch:
        ++stats_.binding_mismatches;
        break;
      case RemoteValueCheck::kChecksumMismatch:
        ++stats_.checksum_failures;
        break;
      case RemoteValueCheck::kFormatMismatch:
        ++stats_.format_mismatches;
        break;
      default:
        ++stats_.header_mismatches;
        break;
    }
    scribble(g.dest, v);
    return RemoteResult::kInvalidValue;
  }

  FaultBackend& backend_;
  R& rng_;
  FaultConfig config_;
  RemoteTicket next_ticket_ = 1;
  std::uint64_t tick_ = 0;
  std::vector<Op> queue_;
  std::vector<Op> due_;
  RemoteStoreStats stats_;
  std::uint64_t invalid_values_ = 0;
};

}  // namespace pagedkv::remote_test
