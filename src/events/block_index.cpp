// BlockIndex (see pagedkv/events/block_index.hpp).
#include "pagedkv/events/block_index.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <random>
#include <string>
#include <utility>

#include "pagedkv/base/error.hpp"

namespace pagedkv::events {

namespace {

constexpr std::size_t kInitialSlots = 1024;  // the shared table's smallest size
constexpr std::size_t kInitialIdSlots = 16;  // an engine set's smallest size (when not empty)

void check_engine(std::size_t engine) {
  if (engine >= BlockIndex::kMaxEngines) {
    throw Error(ErrorCode::kOutOfRange, "BlockIndex: engine " + std::to_string(engine) +
                                            " (at most " + std::to_string(BlockIndex::kMaxEngines) +
                                            ")");
  }
}

// Loads: grow past 0.7, shrink under 0.125, resized tables hold at most 0.35.
bool over_max(std::size_t n, std::size_t slots) {
  return n * 10 > slots * 7;
}
bool under_min(std::size_t n, std::size_t slots, std::size_t floor) {
  return slots > floor && n * 8 < slots;
}
// The size a table of `slots` holding n ids is resized to: a shrink goes to a load of at most
// 0.35; a grow at least doubles (as add() does) and takes n under the maximum load.
std::size_t fit(std::size_t n, std::size_t slots, std::size_t floor) {
  if (!over_max(n, slots)) {
    std::size_t s = floor;
    while (n * 20 > s * 7) s *= 2;
    return s;
  }
  std::size_t s = std::max(slots * 2, floor);
  while (over_max(n, s)) s *= 2;
  return s;
}
unsigned shift_of(std::size_t slots) {
  return 64 - static_cast<unsigned>(std::countr_zero(slots));
}

}  // namespace

// --- an engine's id set ---

std::size_t BlockIndex::IdSet::probe(std::uint64_t id) const noexcept {
  const std::size_t mask = slots.size() - 1;
  std::size_t i = home(id);
  while (slots[i] != 0 && slots[i] != id) i = (i + 1) & mask;
  return i;
}

void BlockIndex::IdSet::insert(std::uint64_t id) {
  if (id == 0) {
    has_zero = true;
    return;
  }
  if (slots.empty() || over_max(size + 1, slots.size())) {
    const std::size_t n = slots.empty() ? kInitialIdSlots : slots.size() * 2;
    std::vector<std::uint64_t> grown(n, 0);
    const unsigned s = shift_of(n);
    for (const std::uint64_t x : slots) {
      if (x == 0) continue;
      std::size_t i = static_cast<std::size_t>(mix(x, key) >> s);
      while (grown[i] != 0) i = (i + 1) & (n - 1);
      grown[i] = x;
    }
    slots.swap(grown);
    shift = s;
  }
  slots[probe(id)] = id;
  ++size;
}

void BlockIndex::IdSet::erase(std::uint64_t id) noexcept {
  if (id == 0) {
    has_zero = false;
    return;
  }
  if (slots.empty()) return;
  std::size_t hole = probe(id);
  if (slots[hole] == 0) return;
  --size;
  const std::size_t mask = slots.size() - 1;
  for (std::size_t i = hole;;) {
    i = (i + 1) & mask;
    const std::uint64_t x = slots[i];
    if (x == 0) break;
    const std::size_t h = home(x);
    const bool stays = hole <= i ? (hole < h && h <= i) : (hole < h || h <= i);
    if (!stays) {
      slots[hole] = x;
      hole = i;
    }
  }
  slots[hole] = 0;
}

// --- the shared table ---

namespace {
std::uint64_t random_key() {
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}
}  // namespace

BlockIndex::BlockIndex() : BlockIndex(random_key()) {}

BlockIndex::BlockIndex(std::uint64_t key) : slots_(kInitialSlots, Slot{0, 0, 0}), key_(key) {
  shift_ = shift_of(kInitialSlots);
  for (EngineIds& en : engines_) reset_engine_state(en);
}

void BlockIndex::reset_engine_state(EngineIds& en) const {
  IdSet set;
  set.key = key_;
  DupMap copies(0, DupHash{key_});
  en.ids = std::move(set);
  en.extra_copies = std::move(copies);
}

std::size_t BlockIndex::probe(std::uint64_t id) const noexcept {
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = home(id);
  while (true) {
    const Slot& s = slots_[i];
    if ((s.gpu | s.cpu) == 0 || s.id == id) return i;
    i = (i + 1) & mask;
  }
}

BlockIndex::Masks BlockIndex::find(std::uint64_t id) const noexcept {
  const Slot& s = slots_[probe(id)];
  return {s.gpu, s.cpu};
}

void BlockIndex::add(std::uint64_t id, std::size_t engine, Tier tier) {
  check_engine(engine);
  EngineIds& en = engines_[engine];
  if (en.clearing) finish_clear(engine);
  if (over_max(size_ + 1, slots_.size())) grow();
  Slot& s = slots_[probe(id)];
  const std::uint32_t bit = 1u << engine;
  std::uint32_t& mask = tier == Tier::kGpu ? s.gpu : s.cpu;
  if (mask & bit) {
    std::uint32_t& copies = en.extra_copies[{id, tier}];  // may throw: nothing changed yet
    if (copies < std::numeric_limits<std::uint32_t>::max()) ++copies;
    ++version_;
    return;
  }
  if (((s.gpu | s.cpu) & bit) == 0) en.ids.insert(id);  // may throw: nothing changed yet
  if ((s.gpu | s.cpu) == 0) {
    s.id = id;
    ++size_;
  }
  mask |= bit;
  ++entries_;
  ++(tier == Tier::kGpu ? en.gpu : en.cpu);
  ++version_;
}

void BlockIndex::remove(std::uint64_t id, std::size_t engine, Tier tier) {
  check_engine(engine);
  EngineIds& en = engines_[engine];
  if (en.clearing) finish_clear(engine);
  const std::size_t i = probe(id);
  Slot& s = slots_[i];
  const std::uint32_t bit = 1u << engine;
  std::uint32_t& mask = tier == Tier::kGpu ? s.gpu : s.cpu;
  if ((s.gpu | s.cpu) == 0 || !(mask & bit)) return;
  ++version_;
  if (!en.extra_copies.empty()) {
    const auto it = en.extra_copies.find({id, tier});
    if (it != en.extra_copies.end()) {
      if (--it->second == 0) en.extra_copies.erase(it);
      return;
    }
  }
  mask &= ~bit;
  --entries_;
  --(tier == Tier::kGpu ? en.gpu : en.cpu);
  if (((s.gpu | s.cpu) & bit) == 0) en.ids.erase(id);
  if ((s.gpu | s.cpu) == 0) erase_slot(i);
}

// Backward-shift deletion: pull later members of the probe run into the hole so that every
// lookup still finds its slot before the first empty one.
void BlockIndex::erase_slot(std::size_t hole) noexcept {
  const std::size_t mask = slots_.size() - 1;
  --size_;
  std::size_t i = hole;
  while (true) {
    i = (i + 1) & mask;
    Slot& s = slots_[i];
    if ((s.gpu | s.cpu) == 0) break;
    const std::size_t h = home(s.id);
    // Move s into the hole when its home is not in (hole, i] (cyclically).
    const bool stays = hole <= i ? (hole < h && h <= i) : (hole < h || h <= i);
    if (!stays) {
      slots_[hole] = s;
      hole = i;
    }
  }
  slots_[hole] = Slot{0, 0, 0};
}

void BlockIndex::grow() {
  std::vector<Slot> old(slots_.size() * 2, Slot{0, 0, 0});
  old.swap(slots_);
  --shift_;
  for (const Slot& s : old) {
    if ((s.gpu | s.cpu) == 0) continue;
    slots_[probe(s.id)] = s;
  }
}

void BlockIndex::drop_from_table(std::uint64_t id, std::size_t engine) noexcept {
  const std::size_t i = probe(id);
  Slot& s = slots_[i];
  const std::uint32_t bit = 1u << engine;
  if ((s.gpu | s.cpu) == 0) return;
  entries_ -= static_cast<std::size_t>(((s.gpu & bit) != 0) + ((s.cpu & bit) != 0));
  s.gpu &= ~bit;
  s.cpu &= ~bit;
  if ((s.gpu | s.cpu) == 0) erase_slot(i);
}

bool BlockIndex::clear_engine_some(std::size_t engine, std::size_t budget) {
  check_engine(engine);
  EngineIds& en = engines_[engine];
  if (!en.clearing) {
    if (en.ids.count() == 0 && en.extra_copies.empty()) return true;
    en.clearing = true;
    en.clear_pos = en.ids.slots.size();
  }
  ++version_;
  // The engine's set is only walked (never probed) until the clear ends: its slots are zeroed
  // without the backward shift.
  std::size_t scanned = 0;
  const std::size_t max_scan = std::max<std::size_t>(budget, 1) * 8;
  std::size_t dropped = 0;
  while (en.clear_pos > 0 && dropped < budget && scanned < max_scan) {
    std::uint64_t& x = en.ids.slots[--en.clear_pos];
    ++scanned;
    if (x == 0) continue;
    drop_from_table(x, engine);
    x = 0;
    --en.ids.size;
    ++dropped;
  }
  if (en.clear_pos > 0) return false;
  if (en.ids.has_zero) drop_from_table(0, engine);
  reset_engine_state(en);  // frees its slots and copies
  en.gpu = 0;
  en.cpu = 0;
  en.clearing = false;
  return true;
}

void BlockIndex::finish_clear(std::size_t engine) noexcept {
  while (!clear_engine_some(engine, std::numeric_limits<std::size_t>::max() / 16)) {
  }
}

void BlockIndex::clear_engine(std::size_t engine) {
  check_engine(engine);
  finish_clear(engine);
  // The freed room goes back when the table has become sparse.
  if (resize_needed(engine, 0)) adopt(plan_resize(engine, 0));
}

bool BlockIndex::resize_needed(std::size_t engine, std::size_t adds) const {
  check_engine(engine);
  if (over_max(size_ + adds, slots_.size()) ||
      (adds == 0 && under_min(size_, slots_.size(), kInitialSlots))) {
    return true;
  }
  const EngineIds& en = engines_[engine];
  if (en.clearing) return false;
  const std::size_t n = en.ids.slots.size();
  if (adds > 0) return n == 0 || over_max(en.ids.size + adds, n);
  return n > 0 && (en.ids.size == 0 || under_min(en.ids.size, n, kInitialIdSlots));
}

BlockIndex::Resize BlockIndex::plan_resize(std::size_t engine, std::size_t adds) const {
  check_engine(engine);
  Resize plan;
  plan.version = version_;
  if (over_max(size_ + adds, slots_.size()) ||
      (adds == 0 && under_min(size_, slots_.size(), kInitialSlots))) {
    const std::size_t n = fit(size_ + adds, slots_.size(), kInitialSlots);
    plan.slots.assign(n, Slot{0, 0, 0});
    plan.shift = shift_of(n);
    for (const Slot& s : slots_) {
      if ((s.gpu | s.cpu) == 0) continue;
      std::size_t i = static_cast<std::size_t>(mix(s.id, key_) >> plan.shift);
      while ((plan.slots[i].gpu | plan.slots[i].cpu) != 0) i = (i + 1) & (n - 1);
      plan.slots[i] = s;
    }
    plan.main = true;
  }
  const EngineIds& en = engines_[engine];
  const std::size_t cur = en.ids.slots.size();
  const bool grow_set = adds > 0 && (cur == 0 || over_max(en.ids.size + adds, cur));
  const bool shrink_set =
      adds == 0 && cur > 0 && (en.ids.size == 0 || under_min(en.ids.size, cur, kInitialIdSlots));
  if (!en.clearing && (grow_set || shrink_set)) {
    plan.engine = engine;
    if (en.ids.size + adds > 0) {
      const std::size_t n = fit(en.ids.size + adds, cur, kInitialIdSlots);
      plan.ids.assign(n, 0);
      plan.ids_shift = shift_of(n);
      for (const std::uint64_t x : en.ids.slots) {
        if (x == 0) continue;
        std::size_t i = static_cast<std::size_t>(mix(x, key_) >> plan.ids_shift);
        while (plan.ids[i] != 0) i = (i + 1) & (n - 1);
        plan.ids[i] = x;
      }
    }
  }
  return plan;
}

void BlockIndex::adopt(Resize&& plan) noexcept {
  if (plan.version != version_) return;  // the index changed since: the plan is stale
  if (plan.main) {
    slots_.swap(plan.slots);
    shift_ = plan.shift;
  }
  if (plan.engine < kMaxEngines) {
    IdSet& set = engines_[plan.engine].ids;
    set.slots.swap(plan.ids);
    set.shift = set.slots.empty() ? 64 : plan.ids_shift;
  }
  ++version_;
}

void BlockIndex::longest_prefixes(std::span<const std::uint64_t> ids,
                                  std::span<PrefixMatch> out) const {
  const std::size_t n = std::min(out.size(), kMaxEngines);
  for (std::size_t e = 0; e < n; ++e) out[e] = {};
  std::uint32_t any_alive = n == 32 ? ~0u : ((1u << n) - 1);
  std::uint32_t gpu_alive = any_alive;
  std::uint32_t len = 0;
  for (const std::uint64_t id : ids) {
    const Slot& s = slots_[probe(id)];
    const std::uint32_t any_next = any_alive & (s.gpu | s.cpu);
    const std::uint32_t gpu_next = gpu_alive & s.gpu;
    // Engines whose prefix ends here.
    for (std::uint32_t ended = any_alive & ~any_next; ended; ended &= ended - 1) {
      out[static_cast<std::size_t>(std::countr_zero(ended))].prefix_blocks = len;
    }
    for (std::uint32_t ended = gpu_alive & ~gpu_next; ended; ended &= ended - 1) {
      out[static_cast<std::size_t>(std::countr_zero(ended))].gpu_prefix_blocks = len;
    }
    any_alive = any_next;
    gpu_alive = gpu_next;
    ++len;
    if (any_alive == 0) return;
  }
  for (std::uint32_t m = any_alive; m; m &= m - 1) {
    out[static_cast<std::size_t>(std::countr_zero(m))].prefix_blocks = len;
  }
  for (std::uint32_t m = gpu_alive; m; m &= m - 1) {
    out[static_cast<std::size_t>(std::countr_zero(m))].gpu_prefix_blocks = len;
  }
}

std::vector<std::uint64_t> BlockIndex::engine_ids(std::size_t engine, Tier tier) const {
  check_engine(engine);
  const EngineIds& en = engines_[engine];
  std::vector<std::uint64_t> out;
  out.reserve(tier == Tier::kGpu ? en.gpu : en.cpu);
  const std::uint32_t bit = 1u << engine;
  auto take = [&](std::uint64_t id) {
    const Masks m = find(id);
    if (((tier == Tier::kGpu ? m.gpu : m.cpu) & bit) != 0) out.push_back(id);
  };
  if (en.ids.has_zero) take(0);
  for (const std::uint64_t x : en.ids.slots) {
    if (x != 0) take(x);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::size_t BlockIndex::engine_entries(std::size_t engine, Tier tier) const {
  check_engine(engine);
  const EngineIds& en = engines_[engine];
  if (!en.clearing) return tier == Tier::kGpu ? en.gpu : en.cpu;
  return engine_ids(engine, tier).size();  // counted as the clear goes
}

std::size_t BlockIndex::max_probe_length() const noexcept {
  const std::size_t mask = slots_.size() - 1;
  std::size_t longest = 0;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if ((s.gpu | s.cpu) == 0) continue;
    longest = std::max(longest, ((i - home(s.id)) & mask) + 1);
  }
  return longest;
}

std::size_t BlockIndex::memory_bytes() const noexcept {
  // unordered_map: one node (key, value, next pointer, cached hash) plus one bucket pointer each.
  std::size_t bytes = slots_.capacity() * sizeof(Slot);
  for (const EngineIds& en : engines_) {
    bytes +=
        en.ids.slots.capacity() * sizeof(std::uint64_t) +
        en.extra_copies.size() * (sizeof(DupKey) + sizeof(std::uint32_t) + 2 * sizeof(void*) + 8) +
        en.extra_copies.bucket_count() * sizeof(void*);
  }
  return bytes;
}

}  // namespace pagedkv::events
