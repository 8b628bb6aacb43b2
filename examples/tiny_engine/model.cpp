#include "model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tiny_engine {

namespace {

// SplitMix64: a portable, seedable stream (std::*_distribution differ between standard
// libraries; these weights must not).
class WeightStream {
 public:
  explicit WeightStream(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-bound, bound).
  float uniform(float bound) {
    const double u = static_cast<double>(next() >> 11) * 0x1.0p-53;  // [0, 1)
    return static_cast<float>((2.0 * u - 1.0) * bound);
  }

 private:
  std::uint64_t state_;
};

std::vector<float> random_matrix(WeightStream& rng, std::int32_t in, std::int32_t out) {
  // Uniform with variance 1 / in keeps activations at unit scale.
  const float bound = std::sqrt(3.0f / static_cast<float>(in));
  std::vector<float> w(static_cast<std::size_t>(in) * static_cast<std::size_t>(out));
  for (float& x : w) x = rng.uniform(bound);
  return w;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("model config: " + what);
}

}  // namespace

void ModelConfig::validate() const {
  require(num_layers > 0, "num_layers must be positive");
  require(d_model > 0, "d_model must be positive");
  require(num_q_heads > 0 && num_kv_heads > 0, "head counts must be positive");
  require(num_q_heads % num_kv_heads == 0, "num_q_heads must be a multiple of num_kv_heads");
  require(head_dim > 0 && head_dim % 8 == 0 && head_dim <= kMaxHeadDim,
          "head_dim must be a positive multiple of 8, at most 256");
  require(ffn_dim > 0, "ffn_dim must be positive");
  require(vocab_size > 1, "vocab_size must be at least 2");
  require(rope_theta > 0 && rms_eps > 0, "rope_theta and rms_eps must be positive");
}

Model::Model(const ModelConfig& config) : config_(config) {
  config_.validate();
  WeightStream rng(config_.seed);
  const std::int32_t d = config_.d_model;
  embed_.resize(static_cast<std::size_t>(config_.vocab_size) * static_cast<std::size_t>(d));
  for (float& x : embed_) x = rng.uniform(1.0f);
  layers_.resize(static_cast<std::size_t>(config_.num_layers));
  for (LayerWeights& l : layers_) {
    l.attn_norm.assign(static_cast<std::size_t>(d), 1.0f);
    l.wq = random_matrix(rng, d, config_.q_dim());
    l.wk = random_matrix(rng, d, config_.kv_dim());
    l.wv = random_matrix(rng, d, config_.kv_dim());
    l.wo = random_matrix(rng, config_.q_dim(), d);
    l.mlp_norm.assign(static_cast<std::size_t>(d), 1.0f);
    l.w_gate = random_matrix(rng, d, config_.ffn_dim);
    l.w_up = random_matrix(rng, d, config_.ffn_dim);
    l.w_down = random_matrix(rng, config_.ffn_dim, d);
  }
  final_norm_.assign(static_cast<std::size_t>(d), 1.0f);
  lm_head_ = random_matrix(rng, d, config_.vocab_size);
}

std::span<const float> Model::embedding(std::int32_t token) const {
  if (token < 0 || token >= config_.vocab_size) {
    throw std::out_of_range("token id " + std::to_string(token) + " outside the vocabulary of " +
                            std::to_string(config_.vocab_size));
  }
  const auto d = static_cast<std::size_t>(config_.d_model);
  return std::span<const float>(embed_).subspan(static_cast<std::size_t>(token) * d, d);
}

std::string Model::describe() const {
  const ModelConfig& c = config_;
  return std::to_string(c.num_layers) + " layers, d_model " + std::to_string(c.d_model) + ", " +
         std::to_string(c.num_q_heads) + " query / " + std::to_string(c.num_kv_heads) +
         " KV heads of " + std::to_string(c.head_dim) + ", SwiGLU " + std::to_string(c.ffn_dim) +
         ", vocabulary " + std::to_string(c.vocab_size) + ", seed " + std::to_string(c.seed);
}

void rms_norm(const float* x, std::int64_t rows, std::int32_t dim, const float* weight, float eps,
              float* y) {
  const auto n = static_cast<std::size_t>(dim);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<std::size_t>(r) * n;
    float* yr = y + static_cast<std::size_t>(r) * n;
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const auto inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
    for (std::size_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

void rope_cos_sin(std::int32_t head_dim, std::int64_t position, float theta, float* cos_out,
                  float* sin_out) {
  const std::int32_t half = head_dim / 2;
  for (std::int32_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
    const double angle = static_cast<double>(position) * inv_freq;
    cos_out[i] = static_cast<float>(std::cos(angle));
    sin_out[i] = static_cast<float>(std::sin(angle));
  }
}

void apply_rope(float* row, std::int32_t num_heads, std::int32_t head_dim, std::int64_t position,
                float theta) {
  const std::int32_t half = head_dim / 2;
  float cos_table[kMaxHeadDim / 2];
  float sin_table[kMaxHeadDim / 2];
  if (head_dim > kMaxHeadDim) {
    throw std::invalid_argument("apply_rope: head_dim " + std::to_string(head_dim) + " above " +
                                std::to_string(kMaxHeadDim));
  }
  rope_cos_sin(head_dim, position, theta, cos_table, sin_table);
  for (std::int32_t i = 0; i < half; ++i) {
    const float c = cos_table[i];
    const float s = sin_table[i];
    for (std::int32_t h = 0; h < num_heads; ++h) {
      float* v = row + static_cast<std::size_t>(h) * static_cast<std::size_t>(head_dim);
      const float a = v[i];
      const float b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

void swiglu(const float* gate, const float* up, std::int64_t n, float* out) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const auto e = static_cast<float>(std::exp(-static_cast<double>(g)));
    out[i] = g / (1.0f + e) * up[i];
  }
}

}  // namespace tiny_engine
