// Fuzz harness: bytes -> KV event batches of a hostile engine, decoded and applied through
// KVIndexer::apply beside an honest engine.
//
// Each input is a list of records; a record is either raw payload bytes (anything: the decoder
// must refuse what is not a KVEventBatch, with a reason) or a batch the harness builds from the
// bytes and encodes on the wire (stores, removals and clears of ids that collide with the honest
// engine's, on both media, groups 0 and 1, array or map encoding), each with a sequence number
// that may be in order, repeat (a restart) or skip ahead (a loss). The harness keeps its own
// model of the hostile engine's entries from the header's rules (sequence rules, group 0 only,
// the entry cap, a bad payload drops the entries) and checks after every batch:
//  - nothing crashes or throws (sanitizers catch memory errors);
//  - the honest engine's ids, per medium, and its lookups are exactly what it was fed;
//  - the hostile engine's ids are exactly the model's, never more than the cap; its status
//    counts agree (gpu/cpu blocks, bad batches = dropped payloads, the reason matching the
//    decoder's);
//  - the index's entry count is the sum of both engines'.
//
// Built two ways, like kv_cache_manager_fuzz: a libFuzzer target (PAGEDKV_LIBFUZZER) and a plain
// program replaying files, directories or `--random N` inputs (ctest: tests/fuzz/indexer_corpus).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_replay_main.hpp"
#include "pagedkv/events/indexer.hpp"
#include "pagedkv/events/wire.hpp"

namespace {

using namespace pagedkv;
using namespace pagedkv::events;

constexpr std::size_t kCap = 48;  // hostile engine's entry cap (small: the fuzzer reaches it)

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "kv_indexer_fuzz: %s\n", what);
  std::abort();
}

std::array<std::uint8_t, 16> digest_of(std::uint64_t id) {
  std::array<std::uint8_t, 16> d{};
  for (int i = 0; i < 8; ++i) d[15 - i] = static_cast<std::uint8_t>(id >> (8 * i));
  return d;
}

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::span<const std::uint8_t> take(std::size_t n) {
    n = std::min(n, size_ - std::min(pos_, size_));
    std::span<const std::uint8_t> s(data_ + pos_, n);
    pos_ += n;
    return s;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// Ids collide with the honest engine's on purpose (both use 1..64).
std::uint64_t id_from(std::uint8_t b) {
  return 1 + b % 64;
}

// A batch built from the input: 0-7 events.
std::string build_batch(Input& in) {
  std::vector<KVEvent> events;
  const int n = in.byte() % 8;
  for (int k = 0; k < n; ++k) {
    const std::uint8_t kind = in.byte() % 8;
    const std::size_t ids = in.byte() % 12;
    const std::uint8_t medium = in.byte();
    const GroupId group = medium % 5 == 0 ? 1 : 0;
    const std::string med = medium % 3 == 0 ? "CPU" : "GPU";
    if (kind == 0) {
      events.push_back(KVEvent{0, AllBlocksCleared{}});
    } else if (kind < 5) {
      BlockStored s;
      for (std::size_t i = 0; i < ids; ++i)
        s.block_hashes.emplace_back(digest_of(id_from(in.byte())));
      s.block_size = 1;
      s.token_ids.assign(ids, 7);
      s.extra_keys.resize(ids);
      s.group_id = group;
      s.medium = med;
      events.push_back(KVEvent{0, std::move(s)});
    } else {
      BlockRemoved r;
      for (std::size_t i = 0; i < ids; ++i)
        r.block_hashes.emplace_back(digest_of(id_from(in.byte())));
      r.group_id = group;
      r.medium = med;
      events.push_back(KVEvent{0, std::move(r)});
    }
  }
  WireOptions w;
  w.encoding = in.byte() % 2 ? EventEncoding::kMap : EventEncoding::kArrayLike;
  w.hash_format = in.byte() % 3 == 0 ? HashFormat::kBytes : HashFormat::kInt64;
  std::string out;
  encode_event_batch(events, 0, w, out);
  return out;
}

// The hostile engine as the indexer should see it: (id, medium) -> copies.
struct Model {
  std::map<std::pair<std::uint64_t, Tier>, std::uint32_t> copies;
  std::optional<std::uint64_t> next_seq;

  void clear() { copies.clear(); }
  void apply(const WireBatch& b) {
    for (const WireEvent& ev : b.events) {
      if (ev.type == WireEventType::kAllBlocksCleared) {
        clear();
        continue;
      }
      if (ev.group_idx != 0) continue;
      const Tier t = !ev.medium || *ev.medium == kMediumGpu ? Tier::kGpu : Tier::kCpu;
      for (std::uint64_t id : ev.block_ids) {
        if (ev.type == WireEventType::kBlockStored) {
          if (copies.size() >= kCap) continue;
          ++copies[{id, t}];
        } else {
          auto it = copies.find({id, t});
          if (it != copies.end() && --it->second == 0) copies.erase(it);
        }
      }
    }
  }
  // The sequence rules of an engine fed through apply() (no replay socket).
  void ingest(std::uint64_t seq, const std::optional<WireBatch>& b) {
    if (!b) {
      clear();
      next_seq = seq + 1;
      return;
    }
    if (next_seq ? seq != *next_seq : seq > 0) clear();  // restart, gap or late join
    apply(*b);
    next_seq = seq + 1;
  }
  std::vector<std::uint64_t> ids(Tier t) const {
    std::vector<std::uint64_t> out;
    for (const auto& [k, n] : copies) {
      if (k.second == t) out.push_back(k.first);
    }
    return out;  // std::map order: sorted by id within a medium
  }
};

void run_one(const std::uint8_t* data, std::size_t size) {
  KVIndexerConfig config;
  config.max_entries_per_engine = kCap;
  config.decode.max_bytes = 4096;
  config.decode.max_elements = 512;
  config.decode.max_depth = 8;
  KVIndexer indexer(config);
  const EngineId h = indexer.add_engine("honest");
  const EngineId x = indexer.add_engine("hostile");
  // The honest engine (within the cap, which holds for every engine): ids 1..24 on the GPU,
  // 20..32 on the CPU, one batch each.
  std::vector<std::uint64_t> gpu_ids, cpu_ids;
  for (std::uint64_t id = 1; id <= 24; ++id) gpu_ids.push_back(id);
  for (std::uint64_t id = 20; id <= 32; ++id) cpu_ids.push_back(id);
  for (int m = 0; m < 2; ++m) {
    BlockStored s;
    for (std::uint64_t id : m == 0 ? gpu_ids : cpu_ids) s.block_hashes.emplace_back(digest_of(id));
    s.block_size = 1;
    s.token_ids.assign(s.block_hashes.size(), 1);
    s.extra_keys.resize(s.block_hashes.size());
    s.medium = m == 0 ? "GPU" : "CPU";
    std::string p;
    encode_event_batch(std::vector<KVEvent>{KVEvent{0, std::move(s)}}, 0, WireOptions{}, p);
    indexer.apply(h, static_cast<std::uint64_t>(m),
                  {reinterpret_cast<const std::uint8_t*>(p.data()), p.size()});
  }
  const EngineStatus honest_before = indexer.status(h);

  Input in(data, size);
  Model model;
  std::uint64_t seq = 0;
  std::uint64_t bad = 0;
  EngineStatus::Dropped dropped;
  for (int records = 0; !in.done() && records < 64; ++records) {
    const std::uint8_t op = in.byte();
    // Sequence number: mostly in order; sometimes repeated (restart) or ahead (loss).
    const std::uint8_t s = in.byte();
    if (s % 8 == 0) {
      seq = s / 8;
    } else if (s % 8 == 1) {
      seq += s / 8;
    }
    std::string payload;
    if (op % 4 == 0) {
      const std::size_t n = in.byte() + 256u * (in.byte() % 32);
      const auto raw = in.take(n);
      payload.assign(raw.begin(), raw.end());
      if (op % 8 == 4 && !payload.empty()) {  // a valid batch with bytes after it
        payload = build_batch(in) + payload;
      }
    } else {
      payload = build_batch(in);
    }
    const std::span<const std::uint8_t> bytes(reinterpret_cast<const std::uint8_t*>(payload.data()),
                                              payload.size());
    WireBatch decoded;
    const DecodeFailure f = try_decode_event_batch(bytes, config.decode, decoded);
    indexer.apply(x, seq, bytes);
    std::optional<WireBatch> b;
    if (f == DecodeFailure::kNone) {
      b = std::move(decoded);
    } else {
      ++bad;
      switch (f) {
        case DecodeFailure::kTooLarge:
          ++dropped.too_large;
          break;
        case DecodeFailure::kTooManyElements:
          ++dropped.too_many_elements;
          break;
        case DecodeFailure::kTrailingBytes:
          ++dropped.trailing_bytes;
          break;
        default:
          ++dropped.malformed;
          break;
      }
    }
    model.ingest(seq, b);
    ++seq;

    // The honest engine is untouched.
    if (indexer.engine_ids(h, Tier::kGpu) != gpu_ids) fail("honest GPU ids changed");
    if (indexer.engine_ids(h, Tier::kCpu) != cpu_ids) fail("honest CPU ids changed");
    const auto m = indexer.match(gpu_ids);
    if (m.size() != 2 || m[h].gpu_prefix_blocks != gpu_ids.size()) fail("honest lookup changed");
    const EngineStatus hs = indexer.status(h);
    if (hs.batches_applied != honest_before.batches_applied || hs.bad_batches != 0 ||
        hs.gaps_lost != 0 || hs.dropped.total() != 0) {
      fail("honest status changed");
    }
    // The hostile engine is exactly the model, within the cap, and counted.
    const auto xg = indexer.engine_ids(x, Tier::kGpu);
    const auto xc = indexer.engine_ids(x, Tier::kCpu);
    if (xg != model.ids(Tier::kGpu) || xc != model.ids(Tier::kCpu)) fail("hostile ids differ");
    if (xg.size() + xc.size() > kCap) fail("hostile engine past its cap");
    const EngineStatus xs = indexer.status(x);
    if (xs.gpu_blocks != xg.size() || xs.cpu_blocks != xc.size()) fail("block counts differ");
    if (xs.bad_batches != bad || xs.dropped.total() != bad ||
        xs.dropped.too_large != dropped.too_large ||
        xs.dropped.too_many_elements != dropped.too_many_elements ||
        xs.dropped.trailing_bytes != dropped.trailing_bytes ||
        xs.dropped.malformed != dropped.malformed) {
      fail("dropped payloads miscounted");
    }
    if (xs.next_seq != model.next_seq) fail("next_seq differs");
    if (indexer.num_entries() != gpu_ids.size() + cpu_ids.size() + xg.size() + xc.size()) {
      fail("entry count differs");
    }
  }
}

}  // namespace

PAGEDKV_FUZZ_ENTRY_POINTS("kv_indexer_fuzz", run_one, 1024)
