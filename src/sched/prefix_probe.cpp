#include "pagedkv/sched/prefix_probe.hpp"

#include <algorithm>

#include "pagedkv/base/error.hpp"
#include "pagedkv/manager/full_attention.hpp"

namespace pagedkv {

namespace {

const KVCacheManager& unitary(const KVCacheManager& m) {
  if (m.num_groups() != 1 || m.group_spec(0).kind != AttentionKind::kFull) {
    throw Error(ErrorCode::kInvalidArgument,
                "PrefixProbe: one full-attention KV-cache group only (this manager has " +
                    std::to_string(m.num_groups()) + " groups)");
  }
  return m;
}

}  // namespace

PrefixProbe::PrefixProbe(const KVCacheManager& gpu)
    : gpu_(unitary(gpu)), block_size_(gpu.block_size()) {}

PrefixProbe::PrefixProbe(const TieredKVCacheManager& tier)
    : gpu_(unitary(tier.gpu())), tier_(&tier), block_size_(tier.block_size()) {}

CachedPrefix PrefixProbe::probe(const Request& request) {
  CachedPrefix out;
  const BlockPool& pool = gpu_.block_pool();
  if (!pool.config().enable_caching || request.skip_reading_prefix_cache ||
      request.num_tokens() == 0) {
    return out;
  }
  const RequestBlockHasher& hashed = request.hashed_tokens();
  if (hashed.block_size() != block_size_ || !(hashed.hasher() == gpu_.hasher())) {
    throw Error(ErrorCode::kInvalidArgument,
                "PrefixProbe: request " + std::to_string(request.id()) +
                    " is hashed with a different block size, scheme or seed than the manager");
  }
  const BlockSequence seq = hashed.sequence();
  // The last token is always recomputed (get_computed_blocks' cap).
  const std::size_t max_blocks =
      std::min((request.num_tokens() - 1) / block_size_, seq.block_hashes.size());
  find_full_attention_hit(pool, seq, 0, max_blocks, 1, hit_, &scratch_);
  out.gpu_tokens = hit_.size() * block_size_;
  for (const BlockId b : hit_) out.gpu_free_hit_blocks += pool.block(b).ref_cnt == 0 ? 1 : 0;
  if (tier_ != nullptr) {
    std::size_t i = hit_.size();
    while (i < max_blocks && tier_->host_holds(request, i)) ++i;
    out.host_tokens = (i - hit_.size()) * block_size_;
  }
  return out;
}

}  // namespace pagedkv
