// tiny_engine/calibrate.hpp: per-layer K / V scales for an FP8 KV cache with per-tensor scales
// (KVScaleMode::kPerTensor), the way a checkpoint's k_scale / v_scale are made: one calibration
// pass over fixed tokens, the largest |K| and |V| each layer produced, divided by the FP8
// format's largest finite value.
//
// The calibration sequence is `num_tokens` token ids drawn from `seed` (splitmix64, uniform over
// the vocabulary), fixed by the model and the arguments alone: never by the workload, the cache or
// the device, so caching on and off (and the CPU and CUDA paths) use the same scales. The pass is
// the model's own forward pass in fp32 (model.hpp's row kernels) with dense causal attention in
// double over the whole sequence (no KV cache, no rounding to bf16). K is taken after RoPE, as
// kv_append sees it. scale = fp8_row_scale(format, amax) (fp8.hpp: amax / max_finite rounded
// toward zero, at least FLT_MIN; 1 when amax is 0): the calibration's largest value gets the
// largest code, and a larger value met while serving saturates (as with vLLM's per-tensor scales).
//
// Cost O(num_tokens^2 x layers x q_heads x head_dim) for attention plus num_tokens rows of the
// dense layers, once per Engine with per-tensor scales. Pure function of its arguments;
// thread-compatible. Throws std::invalid_argument for num_tokens < 1.
#pragma once

#include <cstdint>
#include <vector>

#include "model.hpp"
#include "pagedkv/device/fp8.hpp"

namespace tiny_engine {

struct KVScales {
  std::vector<float> k;  // [num_layers]
  std::vector<float> v;  // [num_layers]
};

inline constexpr std::int32_t kCalibrationTokens = 256;
inline constexpr std::uint64_t kCalibrationSeed = 0x6b765f7363616c65;  // "kv_scale"

KVScales calibrate_kv_scales(const Model& model, pagedkv::Fp8Format format,
                             std::int32_t num_tokens = kCalibrationTokens,
                             std::uint64_t seed = kCalibrationSeed);

}  // namespace tiny_engine
