// tiny_engine/model.hpp: a small decoder-only transformer (Llama-style: RMSNorm, RoPE, GQA
// attention, SwiGLU MLP) whose weights are drawn from a seed, run token-parallel on the CPU in
// fp32 with its KV cache paged by pagedkv.
//
// Exactness contract (what the prefix-caching proof rests on): every per-token computation
// (projections, norms, RoPE, MLP, logits) reads only that token's row and accumulates in a fixed
// order, so a token's outputs are bit-identical however the batch around it was formed. The only
// cross-token computation is attention, done by pagedkv's CPU references, which walk a token's
// keys in position order. Hence the K/V a token writes depend only on the tokens before it, and a
// cached block holds exactly the values a recomputation would produce.
//
// Thread-compatible; weights are immutable after construction.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tiny_engine {

inline constexpr std::int32_t kMaxHeadDim = 256;

struct ModelConfig {
  std::int32_t num_layers = 4;
  std::int32_t d_model = 256;
  std::int32_t num_q_heads = 8;
  std::int32_t num_kv_heads = 2;  // GQA: 4 query heads share one KV head
  std::int32_t head_dim = 32;     // the CPU references take any multiple of 8; the CUDA kernels
                                  // 64, 128 or 256 (--head-dim; --device cuda defaults to 64)
  std::int32_t ffn_dim = 512;     // SwiGLU hidden size
  std::int32_t vocab_size = 4096;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  std::uint64_t seed = 1;

  // Throws std::invalid_argument naming the first bad field.
  void validate() const;
  std::int32_t q_dim() const noexcept { return num_q_heads * head_dim; }
  std::int32_t kv_dim() const noexcept { return num_kv_heads * head_dim; }
};

// Row-major weights; a matrix "[in, out]" maps a row vector x[in] to x * W [out].
struct LayerWeights {
  std::vector<float> attn_norm;  // [d_model]
  std::vector<float> wq;         // [d_model, q_dim]
  std::vector<float> wk;         // [d_model, kv_dim]
  std::vector<float> wv;         // [d_model, kv_dim]
  std::vector<float> wo;         // [q_dim, d_model]
  std::vector<float> mlp_norm;   // [d_model]
  std::vector<float> w_gate;     // [d_model, ffn_dim]
  std::vector<float> w_up;       // [d_model, ffn_dim]
  std::vector<float> w_down;     // [ffn_dim, d_model]
};

class Model {
 public:
  explicit Model(const ModelConfig& config);

  const ModelConfig& config() const noexcept { return config_; }
  const LayerWeights& layer(std::int32_t i) const {
    return layers_.at(static_cast<std::size_t>(i));
  }
  std::span<const float> embedding(std::int32_t token) const;  // [d_model]
  std::span<const float> final_norm() const noexcept { return final_norm_; }
  std::span<const float> lm_head() const noexcept { return lm_head_; }  // [d_model, vocab]

  // One line describing the shape, e.g. for --help and the JSON report.
  std::string describe() const;

 private:
  ModelConfig config_;
  std::vector<float> embed_;  // [vocab, d_model]
  std::vector<LayerWeights> layers_;
  std::vector<float> final_norm_;  // [d_model]
  std::vector<float> lm_head_;     // [d_model, vocab]
};

// ---- row-wise kernels (each output row depends only on its input row; fixed order) ----

// Y[t] = X[t] * W for t < rows; W is [in, out]. Accumulates over `in` in index order.
void matmul(const float* x, std::int64_t rows, std::int32_t in, const float* w, std::int32_t out,
            float* y);
// y = x / rms(x) * weight, per row of `dim` values.
void rms_norm(const float* x, std::int64_t rows, std::int32_t dim, const float* weight, float eps,
              float* y);
// The rotation of one position: cos_out[i], sin_out[i] for the head_dim / 2 frequency pairs
// (computed in double, rounded to float; the CUDA path uploads these exact values).
void rope_cos_sin(std::int32_t head_dim, std::int64_t position, float theta, float* cos_out,
                  float* sin_out);
// Rotates each head of one token's row in place (rotate-half pairing: d and d + head_dim / 2):
// v[i] = a c - b s, v[i + half] = b c + a s with (c, s) from rope_cos_sin.
void apply_rope(float* row, std::int32_t num_heads, std::int32_t head_dim, std::int64_t position,
                float theta);
// out[i] = silu(gate[i]) * up[i] = gate / (1 + e) * up with e = exp(-gate) computed in double and
// rounded to float (a correctly rounded float, so the CUDA path's exp gives the same bits).
void swiglu(const float* gate, const float* up, std::int64_t n, float* out);

}  // namespace tiny_engine
