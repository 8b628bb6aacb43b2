// The CPU forward pass of the tiny engine (see backend.hpp).
#include <algorithm>
#include <cmath>

#include "backend.hpp"
#include "engine.hpp"
#include "model.hpp"
#include "pagedkv/device/kv_dtype.hpp"
#include "pagedkv/reference/cache_ops.hpp"
#include "pagedkv/reference/decode_attention.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace tiny_engine {

namespace {

void to_bits(pagedkv::KVDtype dtype, const std::vector<float>& in, std::vector<std::uint16_t>& out,
             std::size_t n) {
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = pagedkv::float_to_dtype_bits(dtype, in[i]);
}

void add_into(std::vector<float>& x, const std::vector<float>& y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) x[i] += y[i];
}

std::uint16_t quiet_nan_bits(pagedkv::KVDtype dtype) {
  return dtype == pagedkv::KVDtype::kFloat16 ? std::uint16_t{0x7E00} : std::uint16_t{0x7FC0};
}

class CpuBackend final : public ForwardBackend {
 public:
  CpuBackend(const Model& model, KVCache& cache) : model_(model), cache_(cache) {}

  void reset_cache() override {
    // FP8: every byte 0x7f, a NaN code in both formats (scales read as 0x7f7f7f7f, finite).
    const std::uint16_t nan =
        pagedkv::is_fp8(cache_.dtype) ? std::uint16_t{0x7f7f} : quiet_nan_bits(cache_.dtype);
    for (auto& plane : cache_.k) std::fill(plane.begin(), plane.end(), nan);
    for (auto& plane : cache_.v) std::fill(plane.begin(), plane.end(), nan);
  }

  void forward(const ForwardBatch& batch, std::vector<float>& logits) override;

 private:
  const Model& model_;
  KVCache& cache_;
  // Scratch, reused across steps (rows = tokens of one forward pass).
  std::vector<float> x_, h_, q_, k_, v_, attn_, tmp_, gate_, up_;
  std::vector<std::uint16_t> q_bits_, k_bits_, v_bits_, attn_bits_;
};

void CpuBackend::forward(const ForwardBatch& batch, std::vector<float>& logits) {
  const ModelConfig& m = model_.config();
  const auto d = static_cast<std::size_t>(m.d_model);
  const auto qd = static_cast<std::size_t>(m.q_dim());
  const auto kvd = static_cast<std::size_t>(m.kv_dim());
  const auto ffn = static_cast<std::size_t>(m.ffn_dim);
  const std::size_t rows = batch.tokens.size();
  const auto vocab = static_cast<std::size_t>(m.vocab_size);
  logits.assign(batch.sample_rows.size() * vocab, 0.0f);
  if (rows == 0) return;
  x_.resize(rows * d);
  h_.resize(rows * d);
  tmp_.resize(rows * d);
  q_.resize(rows * qd);
  attn_.resize(rows * qd);
  attn_bits_.resize(rows * qd);
  k_.resize(rows * kvd);
  v_.resize(rows * kvd);
  gate_.resize(rows * ffn);
  up_.resize(rows * ffn);
  for (std::size_t row = 0; row < rows; ++row) {
    const auto e = model_.embedding(batch.tokens[row]);
    std::copy(e.begin(), e.end(), x_.begin() + static_cast<std::ptrdiff_t>(row * d));
  }
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
  const auto num_seqs = static_cast<std::int32_t>(batch.seq_lens.size());

  const auto n_rows = static_cast<std::int64_t>(rows);
  // The 16-bit type of q, the new K/V and the attention output; an FP8 cache quantizes K/V in
  // kv_append (per-(token, KV head) scales, or the layer's per-tensor k / v scale) and keeps q and
  // outputs in bf16.
  const bool fp8 = pagedkv::is_fp8(cache_.dtype);
  const pagedkv::KVDtype dtype = fp8 ? pagedkv::KVDtype::kBFloat16 : cache_.dtype;
  pagedkv::KVQuant quant;
  if (fp8) {
    quant.mode = cache_.scale_mode;
    quant.dtype = cache_.dtype;
  }
  for (std::int32_t l = 0; l < m.num_layers; ++l) {
    const LayerWeights& w = model_.layer(l);
    if (quant.mode == pagedkv::KVScaleMode::kPerTensor) {
      quant.k_scale = cache_.k_scales[static_cast<std::size_t>(l)];
      quant.v_scale = cache_.v_scales[static_cast<std::size_t>(l)];
    }
    auto& k_plane = cache_.k[static_cast<std::size_t>(l)];
    auto& v_plane = cache_.v[static_cast<std::size_t>(l)];

    // Attention block.
    rms_norm(x_.data(), n_rows, m.d_model, w.attn_norm.data(), m.rms_eps, h_.data());
    matmul(h_.data(), n_rows, m.d_model, w.wq.data(), m.q_dim(), q_.data());
    matmul(h_.data(), n_rows, m.d_model, w.wk.data(), m.kv_dim(), k_.data());
    matmul(h_.data(), n_rows, m.d_model, w.wv.data(), m.kv_dim(), v_.data());
    for (std::size_t r = 0; r < rows; ++r) {
      apply_rope(q_.data() + r * qd, m.num_q_heads, m.head_dim, batch.positions[r], m.rope_theta);
      apply_rope(k_.data() + r * kvd, m.num_kv_heads, m.head_dim, batch.positions[r], m.rope_theta);
    }
    to_bits(dtype, k_, k_bits_, rows * kvd);
    to_bits(dtype, v_, v_bits_, rows * kvd);
    to_bits(dtype, q_, q_bits_, rows * qd);

    pagedkv::KVAppendParams append;
    append.dtype = dtype;
    append.quant = quant;
    append.num_tokens = n_rows;
    append.key = k_bits_.data();
    append.value = v_bits_.data();
    append.slot_mapping = batch.slots.data();
    append.k_cache = k_plane.data();
    append.v_cache = v_plane.data();
    append.layout = cache_.layout;
    pagedkv::reference_kv_append(append);

    // The attention output is written in the KV dtype, as the CUDA kernels write it (the
    // references compute in double, then round to float and to the dtype).
    if (batch.decode) {
      // One query token per sequence over its whole paged context.
      pagedkv::PagedDecodeParams attention;
      attention.dtype = dtype;
      attention.quant = quant;
      attention.num_seqs = num_seqs;
      attention.num_q_heads = m.num_q_heads;
      attention.q = q_bits_.data();
      attention.k_cache = k_plane.data();
      attention.v_cache = v_plane.data();
      attention.layout = cache_.layout;
      attention.block_table = batch.table.block_ids.data();
      attention.max_blocks_per_seq = batch.table.max_blocks_per_seq;
      attention.seq_lens = batch.seq_lens.data();
      attention.out = attn_bits_.data();
      attention.sm_scale = sm_scale;
      pagedkv::reference_paged_decode_attention(attention);
    } else {
      // The new tokens attend causally to the cached prefix (the hit) and to each other.
      pagedkv::PagedExtendParams attention;
      attention.dtype = dtype;
      attention.quant = quant;
      attention.num_seqs = num_seqs;
      attention.num_q_heads = m.num_q_heads;
      attention.q_indptr = batch.q_indptr.data();
      attention.max_q_len = batch.max_q_len;
      attention.q = q_bits_.data();
      attention.k_cache = k_plane.data();
      attention.v_cache = v_plane.data();
      attention.layout = cache_.layout;
      attention.block_table = batch.table.block_ids.data();
      attention.max_blocks_per_seq = batch.table.max_blocks_per_seq;
      attention.seq_lens = batch.seq_lens.data();
      attention.out = attn_bits_.data();
      attention.sm_scale = sm_scale;
      pagedkv::reference_paged_extend_attention(attention);
    }
    for (std::size_t i = 0; i < rows * qd; ++i) {
      attn_[i] = pagedkv::dtype_bits_to_float(dtype, attn_bits_[i]);
    }

    matmul(attn_.data(), n_rows, m.q_dim(), w.wo.data(), m.d_model, tmp_.data());
    add_into(x_, tmp_, rows * d);

    // MLP block.
    rms_norm(x_.data(), n_rows, m.d_model, w.mlp_norm.data(), m.rms_eps, h_.data());
    matmul(h_.data(), n_rows, m.d_model, w.w_gate.data(), m.ffn_dim, gate_.data());
    matmul(h_.data(), n_rows, m.d_model, w.w_up.data(), m.ffn_dim, up_.data());
    swiglu(gate_.data(), up_.data(), n_rows * m.ffn_dim, gate_.data());
    matmul(gate_.data(), n_rows, m.ffn_dim, w.w_down.data(), m.d_model, tmp_.data());
    add_into(x_, tmp_, rows * d);
  }

  // Logits of the sampled rows.
  for (std::size_t i = 0; i < batch.sample_rows.size(); ++i) {
    const std::size_t row = batch.sample_rows[i];
    rms_norm(x_.data() + row * d, 1, m.d_model, model_.final_norm().data(), m.rms_eps, h_.data());
    matmul(h_.data(), 1, m.d_model, model_.lm_head().data(), m.vocab_size,
           logits.data() + i * vocab);
  }
}

}  // namespace

std::unique_ptr<ForwardBackend> make_cpu_backend(const Model& model, const EngineConfig&,
                                                 KVCache& cache) {
  return std::make_unique<CpuBackend>(model, cache);
}

}  // namespace tiny_engine
