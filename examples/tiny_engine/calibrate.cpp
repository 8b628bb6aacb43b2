#include "calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tiny_engine {

namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

float amax_of(const std::vector<float>& values) {
  float amax = 0;
  for (const float x : values) {
    if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  }
  return amax;
}

}  // namespace

KVScales calibrate_kv_scales(const Model& model, pagedkv::Fp8Format format, std::int32_t num_tokens,
                             std::uint64_t seed) {
  if (num_tokens < 1) throw std::invalid_argument("calibrate_kv_scales: num_tokens must be >= 1");
  const ModelConfig& m = model.config();
  const auto rows = static_cast<std::size_t>(num_tokens);
  const auto d = static_cast<std::size_t>(m.d_model);
  const auto qd = static_cast<std::size_t>(m.q_dim());
  const auto kvd = static_cast<std::size_t>(m.kv_dim());
  const auto ffn = static_cast<std::size_t>(m.ffn_dim);
  const auto hd = static_cast<std::size_t>(m.head_dim);
  const std::int32_t group = m.num_q_heads / m.num_kv_heads;
  const double sm_scale = 1.0 / std::sqrt(static_cast<double>(m.head_dim));

  std::vector<float> x(rows * d), h(rows * d), tmp(rows * d), q(rows * qd), k(rows * kvd),
      v(rows * kvd), attn(rows * qd), gate(rows * ffn), up(rows * ffn);
  std::uint64_t state = seed;
  for (std::size_t r = 0; r < rows; ++r) {
    const auto token =
        static_cast<std::int32_t>(splitmix64(state) % static_cast<std::uint64_t>(m.vocab_size));
    const auto e = model.embedding(token);
    std::copy(e.begin(), e.end(), x.begin() + static_cast<std::ptrdiff_t>(r * d));
  }

  KVScales scales;
  std::vector<double> p(rows);
  const auto n = static_cast<std::int64_t>(rows);
  for (std::int32_t l = 0; l < m.num_layers; ++l) {
    const LayerWeights& w = model.layer(l);
    rms_norm(x.data(), n, m.d_model, w.attn_norm.data(), m.rms_eps, h.data());
    matmul(h.data(), n, m.d_model, w.wq.data(), m.q_dim(), q.data());
    matmul(h.data(), n, m.d_model, w.wk.data(), m.kv_dim(), k.data());
    matmul(h.data(), n, m.d_model, w.wv.data(), m.kv_dim(), v.data());
    for (std::size_t r = 0; r < rows; ++r) {
      const auto pos = static_cast<std::int64_t>(r);
      apply_rope(q.data() + r * qd, m.num_q_heads, m.head_dim, pos, m.rope_theta);
      apply_rope(k.data() + r * kvd, m.num_kv_heads, m.head_dim, pos, m.rope_theta);
    }
    scales.k.push_back(pagedkv::fp8_row_scale(format, amax_of(k)));
    scales.v.push_back(pagedkv::fp8_row_scale(format, amax_of(v)));
    if (l + 1 == m.num_layers) break;  // the last layer's output is not needed

    // Dense causal attention in double.
    for (std::size_t t = 0; t < rows; ++t) {
      for (std::int32_t head = 0; head < m.num_q_heads; ++head) {
        const float* qv = q.data() + t * qd + static_cast<std::size_t>(head) * hd;
        const std::size_t kv_off = static_cast<std::size_t>(head / group) * hd;
        double top = -INFINITY;
        for (std::size_t s = 0; s <= t; ++s) {
          const float* kv = k.data() + s * kvd + kv_off;
          double dot = 0;
          for (std::size_t i = 0; i < hd; ++i) dot += static_cast<double>(qv[i]) * kv[i];
          p[s] = dot * sm_scale;
          top = std::max(top, p[s]);
        }
        double sum = 0;
        for (std::size_t s = 0; s <= t; ++s) sum += (p[s] = std::exp(p[s] - top));
        float* out = attn.data() + t * qd + static_cast<std::size_t>(head) * hd;
        for (std::size_t i = 0; i < hd; ++i) {
          double acc = 0;
          for (std::size_t s = 0; s <= t; ++s) acc += p[s] * v[s * kvd + kv_off + i];
          out[i] = static_cast<float>(acc / sum);
        }
      }
    }
    matmul(attn.data(), n, m.q_dim(), w.wo.data(), m.d_model, tmp.data());
    for (std::size_t i = 0; i < rows * d; ++i) x[i] += tmp[i];
    rms_norm(x.data(), n, m.d_model, w.mlp_norm.data(), m.rms_eps, h.data());
    matmul(h.data(), n, m.d_model, w.w_gate.data(), m.ffn_dim, gate.data());
    matmul(h.data(), n, m.d_model, w.w_up.data(), m.ffn_dim, up.data());
    swiglu(gate.data(), up.data(), n * m.ffn_dim, gate.data());
    matmul(gate.data(), n, m.ffn_dim, w.w_down.data(), m.d_model, tmp.data());
    for (std::size_t i = 0; i < rows * d; ++i) x[i] += tmp[i];
  }
  return scales;
}

}  // namespace tiny_engine
