// pagedkv/device/paged_kv.hpp: what every paged attention kernel reads the KV cache through (as
// FlashInfer's paged_kv_t): one layer's key and value planes, the per-sequence block-table rows
// and KV lengths, and the attention settings shared by decode and extend. PagedDecodeParams and
// PagedExtendParams (pagedkv/reference/) add their queries and outputs to it.
//
// A plain description of raw buffers (host for the CPU references, device for the CUDA kernels),
// trivially copyable so kernels take it by value. validate_paged_kv checks the shared fields and
// throws pagedkv::Error (kInvalidArgument) naming the first problem; it reads no buffer.
#pragma once

#include <cstdint>
#include <string_view>

#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/device/kv_layout.hpp"
#include "pagedkv/device/kv_quant.hpp"

namespace pagedkv {

struct PagedKVParams {
  KVDtype dtype = KVDtype::kBFloat16;  // of q and out, and of the cache unless quant.fp8()
  // An FP8 cache (pagedkv/device/kv_quant.hpp): its codes' type, scale mode and per-tensor
  // scales. Default: none (the cache holds `dtype` values).
  KVQuant quant;
  std::int32_t num_seqs = 0;
  std::int32_t num_q_heads = 0;  // a multiple of layout.num_kv_heads

  // One layer's key and value planes, both described by `layout`.
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  KVLayout layout;

  // [num_seqs, max_blocks_per_seq] physical block ids; row i holds sequence i's blocks.
  const std::int32_t* block_table = nullptr;
  std::int32_t max_blocks_per_seq = 0;
  // [num_seqs] KV length per sequence (cached tokens, the new or current ones included).
  const std::int32_t* seq_lens = nullptr;

  float sm_scale = 0.0f;         // scale of q . k, usually 1 / sqrt(head_dim); finite
  float logits_soft_cap = 0.0f;  // > 0: cap logits with cap x tanh(logit / cap); 0 = off
  std::int32_t window_size = 0;  // > 0: a token sees only the window_size positions ending at
                                 // its own (itself included); 0 = all (vLLM's sliding_window)

  constexpr std::int32_t group_size() const noexcept {
    return layout.num_kv_heads > 0 ? num_q_heads / layout.num_kv_heads : 0;
  }
  constexpr std::int32_t head_dim() const noexcept { return layout.head_dim; }
};

// The checks every kernel needs: counts not negative, a valid layout, a valid cache format
// (validate_kv_quant), q heads a multiple of KV
// heads, finite scale and soft-cap, window not negative, and (when num_seqs > 0) the cache, length
// and block-table pointers present. `who` starts each message ("paged decode attention").
void validate_paged_kv(const PagedKVParams& params, std::string_view who);

}  // namespace pagedkv
