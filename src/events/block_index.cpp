// BlockIndex (see pagedkv/events/block_index.hpp).
#include "pagedkv/events/block_index.hpp"

#include <algorithm>
#include <bit>
#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv::events {

namespace {

constexpr std::size_t kInitialSlots = 1024;

void check_engine(std::size_t engine) {
  if (engine >= BlockIndex::kMaxEngines) {
    throw Error(ErrorCode::kOutOfRange, "BlockIndex: engine " + std::to_string(engine) +
                                            " (at most " +
                                            std::to_string(BlockIndex::kMaxEngines) + ")");
  }
}

}  // namespace

BlockIndex::BlockIndex() : slots_(kInitialSlots, Slot{0, 0, 0}) {
  shift_ = 64 - static_cast<unsigned>(std::countr_zero(kInitialSlots));
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
  if ((size_ + 1) * 10 > slots_.size() * 7) grow();
  Slot& s = slots_[probe(id)];
  const std::uint32_t bit = 1u << engine;
  std::uint32_t& mask = tier == Tier::kGpu ? s.gpu : s.cpu;
  if ((s.gpu | s.cpu) == 0) {
    s.id = id;
    ++size_;
  }
  if (mask & bit) {
    ++extra_copies_[{id, static_cast<std::uint32_t>(engine * 2 + (tier == Tier::kCpu))}];
    return;
  }
  mask |= bit;
  ++entries_;
}

void BlockIndex::remove(std::uint64_t id, std::size_t engine, Tier tier) {
  check_engine(engine);
  const std::size_t i = probe(id);
  Slot& s = slots_[i];
  if ((s.gpu | s.cpu) == 0) return;
  const std::uint32_t bit = 1u << engine;
  std::uint32_t& mask = tier == Tier::kGpu ? s.gpu : s.cpu;
  if (!(mask & bit)) return;
  if (!extra_copies_.empty()) {
    const auto it =
        extra_copies_.find({id, static_cast<std::uint32_t>(engine * 2 + (tier == Tier::kCpu))});
    if (it != extra_copies_.end()) {
      if (--it->second == 0) extra_copies_.erase(it);
      return;
    }
  }
  mask &= ~bit;
  --entries_;
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

void BlockIndex::clear_engine(std::size_t engine) {
  check_engine(engine);
  const std::uint32_t keep = ~(1u << engine);
  std::vector<Slot> old(slots_.size(), Slot{0, 0, 0});
  old.swap(slots_);
  size_ = 0;
  entries_ = 0;
  for (Slot s : old) {
    s.gpu &= keep;
    s.cpu &= keep;
    if ((s.gpu | s.cpu) == 0) continue;
    slots_[probe(s.id)] = s;
    ++size_;
    entries_ += static_cast<std::size_t>(std::popcount(s.gpu) + std::popcount(s.cpu));
  }
  std::erase_if(extra_copies_, [&](const auto& kv) { return kv.first.engine_tier / 2 == engine; });
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
  std::vector<std::uint64_t> out;
  const std::uint32_t bit = 1u << engine;
  for (const Slot& s : slots_) {
    if (((tier == Tier::kGpu ? s.gpu : s.cpu) & bit) != 0) out.push_back(s.id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::size_t BlockIndex::memory_bytes() const noexcept {
  // unordered_map: one node (key, value, next pointer, cached hash) plus one bucket pointer each.
  return slots_.capacity() * sizeof(Slot) +
         extra_copies_.size() * (sizeof(DupKey) + sizeof(std::uint32_t) + 2 * sizeof(void*) + 8) +
         extra_copies_.bucket_count() * sizeof(void*);
}

}  // namespace pagedkv::events
