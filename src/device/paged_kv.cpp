#include "pagedkv/device/paged_kv.hpp"

#include <cmath>
#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

void validate_paged_kv(const PagedKVParams& p, std::string_view who) {
  const auto fail = [who](const std::string& message) {
    throw Error(ErrorCode::kInvalidArgument, std::string(who) + ": " + message);
  };
  if (p.num_seqs < 0) fail("num_seqs must not be negative, got " + std::to_string(p.num_seqs));
  if (p.num_q_heads <= 0) {
    fail("num_q_heads must be positive, got " + std::to_string(p.num_q_heads));
  }
  p.layout.validate();
  validate_kv_quant(p.quant, p.dtype, p.layout, who);
  if (p.num_q_heads % p.layout.num_kv_heads != 0) {
    fail("num_q_heads (" + std::to_string(p.num_q_heads) +
         ") must be a multiple of layout.num_kv_heads (" + std::to_string(p.layout.num_kv_heads) +
         ")");
  }
  if (p.max_blocks_per_seq < 0) {
    fail("max_blocks_per_seq must not be negative, got " + std::to_string(p.max_blocks_per_seq));
  }
  if (!std::isfinite(p.sm_scale)) fail("sm_scale must be finite");
  if (!std::isfinite(p.logits_soft_cap) || p.logits_soft_cap < 0) {
    fail("logits_soft_cap must be finite and not negative (0 = off)");
  }
  if (p.window_size < 0) fail("window_size must not be negative (0 = off)");
  if (p.num_seqs == 0) return;
  if (p.seq_lens == nullptr) fail("seq_lens is null");
  if (p.k_cache == nullptr || p.v_cache == nullptr) fail("k_cache or v_cache is null");
  if (p.block_table == nullptr && p.max_blocks_per_seq > 0) fail("block_table is null");
}

}  // namespace pagedkv
