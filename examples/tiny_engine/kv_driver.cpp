#include "kv_driver.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "engine.hpp"
#include "pagedkv/reference/transfer.hpp"

namespace tiny_engine {

KVDriver::KVDriver(const pagedkv::KVCacheManagerConfig& config, std::int32_t num_host_blocks,
                   pagedkv::HostPolicy policy, KVCache& cache, HostLoadHook hook)
    : cache_(cache), hook_(std::move(hook)) {
  if (num_host_blocks <= 0) {
    plain_ = std::make_unique<pagedkv::KVCacheManager>(config);
    return;
  }
  const std::size_t elem = pagedkv::bytes_per_value(cache_.dtype);  // FP8: 1, scales in blocks
  if (!cache_.layout.block_is_contiguous() || cache_.k.empty() ||
      cache_.storage.size() * sizeof(std::uint16_t) !=
          2 * cache_.k.size() * static_cast<std::size_t>(cache_.layout.plane_elements()) * elem) {
    throw std::logic_error("the host tier needs the CPU path's KV storage");
  }
  const std::size_t chunk = static_cast<std::size_t>(cache_.layout.stride_block) * elem;
  const std::size_t plane = static_cast<std::size_t>(cache_.layout.plane_elements()) * elem;
  // Layer-first: chunk c of block b at c * plane + b * chunk (chunk 2l: K of layer l, 2l + 1: V).
  layout_ = pagedkv::TransferLayout{2 * cache_.k.size(), chunk, chunk, plane};
  pagedkv::HostTierConfig host;
  host.num_host_blocks = num_host_blocks;
  host.policy = policy;
  host.bytes_per_block = layout_.block_bytes();
  tier_ = std::make_unique<pagedkv::TieredKVCacheManager>(config, host);
  num_host_slots_ = static_cast<std::size_t>(num_host_blocks) + 1;  // slot 0: the null block
  host_.assign(num_host_slots_ * layout_.block_bytes(), std::byte{0});
}

KVDriver::~KVDriver() = default;

const pagedkv::KVCacheManager& KVDriver::gpu() const noexcept {
  return plain_ ? *plain_ : tier_->gpu();
}

std::optional<pagedkv::TierStats> KVDriver::tier_stats() const {
  if (!tier_) return std::nullopt;
  return tier_->stats();
}

std::vector<pagedkv::KVEvent> KVDriver::take_events() {
  return tier_ ? tier_->take_events() : plain_->take_events();
}

void KVDriver::check_invariants() const {
  if (plain_) {
    plain_->check_invariants();
  } else {
    tier_->check_invariants();
  }
}

void KVDriver::run_before(pagedkv::TierPlan& t) {
  if (!t.plan.loads.empty() && hook_) hook_(t.plan, host_, layout_);
  const std::span<std::byte> device(reinterpret_cast<std::byte*>(cache_.storage.data()),
                                    cache_.storage.size() * sizeof(std::uint16_t));
  pagedkv::reference::execute_transfer_plan(
      t.plan, pagedkv::TransferStage::kBeforeForward, layout_, device,
      static_cast<std::size_t>(cache_.layout.num_blocks), host_, num_host_slots_);
  for (const pagedkv::TransferId id : t.eviction_ids) tier_->commit(id, true);
  for (const pagedkv::TransferId id : t.load_ids) tier_->commit(id, true);
  if (!t.plan.stores.empty()) after_.push_back(std::move(t));
}

std::optional<Admission> KVDriver::admit(pagedkv::Request& request, std::size_t budget) {
  Admission a;
  if (plain_) {
    a.gpu_hit = plain_->get_computed_blocks(request);
    a.hit_tokens = a.gpu_hit.num_tokens;
    a.new_tokens = std::min(request.num_tokens() - a.hit_tokens, budget);
    if (!plain_->allocate_slots(request, a.new_tokens, a.gpu_hit)) return std::nullopt;
    request.set_num_computed_tokens(a.hit_tokens);
    return a;
  }
  pagedkv::TieredCacheHit hit = tier_->get_computed_blocks(request);
  a.new_tokens = std::min(request.num_tokens() - hit.num_tokens(), budget);
  std::optional<pagedkv::TierAllocation> alloc = tier_->allocate_slots(request, a.new_tokens, hit);
  if (!alloc) return std::nullopt;
  a.gpu_hit = std::move(hit.gpu);
  a.hit_tokens = a.gpu_hit.num_tokens;
  run_before(alloc->transfers);
  if (tier_->has_unfinished_loads(request.id())) {
    pagedkv::LoadResult r = tier_->finish_loads(request);
    // Every load was committed done, so nothing rolls back.
    if (r.rolled_back) throw std::logic_error("the host tier rolled back a load that succeeded");
    a.host_tokens = r.num_computed_tokens - a.hit_tokens;
    a.hit_tokens = r.num_computed_tokens;
    if (!r.transfers.plan.empty()) after_.push_back(std::move(r.transfers));
  }
  request.set_num_computed_tokens(a.hit_tokens);
  return a;
}

bool KVDriver::allocate_slots(pagedkv::Request& request, std::size_t num_new_tokens) {
  if (plain_) return plain_->allocate_slots(request, num_new_tokens).has_value();
  std::optional<pagedkv::TierAllocation> alloc = tier_->allocate_slots(request, num_new_tokens);
  if (!alloc) return false;
  run_before(alloc->transfers);
  return true;
}

void KVDriver::after_forward() {
  const std::span<std::byte> device(reinterpret_cast<std::byte*>(cache_.storage.data()),
                                    cache_.storage.size() * sizeof(std::uint16_t));
  for (pagedkv::TierPlan& t : after_) {
    pagedkv::reference::execute_transfer_plan(
        t.plan, pagedkv::TransferStage::kAfterForward, layout_, device,
        static_cast<std::size_t>(cache_.layout.num_blocks), host_, num_host_slots_);
    for (const pagedkv::TransferId id : t.store_ids) tier_->commit(id, true);
  }
  after_.clear();
}

void KVDriver::preempt(pagedkv::Request& request) {
  if (plain_) {
    plain_->preempt(request);
  } else {
    tier_->preempt(request);
  }
}

void KVDriver::free(pagedkv::Request& request) {
  if (plain_) {
    plain_->free(request);
  } else {
    tier_->free(request);
  }
}

}  // namespace tiny_engine
