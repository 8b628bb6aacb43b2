// Paged decode and extend attention over an FP8 KV cache (issue 36; contracts in
// include/pagedkv/cuda/decode_attention.hpp, extend_attention.hpp and
// pagedkv/device/kv_quant.hpp). The 16-bit kernels are untouched: paged_decode_attention and
// paged_extend_attention hand parameters with quant.fp8() to the functions here.
//
// One kernel serves both: a query row is one new token of one sequence (decode: the last
// position; extend: prefix + j, causal, bottom-right aligned), CTA = (query row, KV head), 4
// warps, warp w takes the group's query heads w, w + 4, ... one at a time. Within a warp,
// kLanes = head_dim / 8 lanes cover one key row (8 codes, one 8-byte load, each) and the warp
// walks 32 / kLanes keys at a time through the block table; each key group keeps its own online
// softmax state (m, l, 8 output dims per lane), merged across groups at the end.
// Dequantization happens in registers: codes decode exactly (fp8.hpp's device code, integer
// ops); the row's scale multiplies the fp32 dot product (K) and the fp32 softmax weight (V), so
// q . (decode(k) x s_k) and p x s_v x decode(v) are accumulated in fp32 (two-level: per lane,
// then across lanes / key groups). The CPU reference multiplies each value by its scale before
// the product; the two differ by float32 roundings only.
//
// Correctness first: CUDA cores, no split-KV, no tensor cores. Its speed against the 16-bit
// kernels is not measured yet (no GPU here); scripts/gpu-check has the targets.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "fp8_kernels.hpp"
#include "internal/head_dims.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/extend_attention.hpp"
#include "pagedkv/device/fp8.hpp"

namespace pagedkv::kernels {

namespace {

constexpr int kWarps = 4;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

[[noreturn]] void fail(const char* where, const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, std::string(where) + " (CUDA, FP8): " + message);
}

struct Fp8AttentionParams {
  const std::uint16_t* q;
  std::int64_t q_stride_row;  // decode: per sequence; extend: per token
  std::int64_t q_stride_head;
  const std::uint8_t* k_cache;
  const std::uint8_t* v_cache;
  KVLayout layout;
  float k_scale;  // per tensor
  float v_scale;
  bool per_row;
  Fp8Format format;
  std::int32_t num_q_heads;
  std::int32_t group;
  const std::int32_t* q_indptr;  // extend: [num_seqs + 1]; null for decode
  std::int32_t max_q_len;        // extend: rows per sequence in the grid; decode: 1
  const std::int32_t* block_table;
  std::int32_t max_blocks_per_seq;
  const std::int32_t* seq_lens;
  std::uint16_t* out;
  std::int64_t out_stride_row;
  std::int64_t out_stride_head;
  float* lse;         // extend, [tokens, num_q_heads] natural log; or null
  float score_scale;  // sm_scale x log2(e); with a soft-cap sm_scale / cap
  float cap_log2;     // cap x log2(e); 0 = no soft-cap
  std::int32_t window_size;
  bool bf16;
};

__device__ __forceinline__ float half_bits_to_float(std::uint16_t bits, bool bf16) {
  return bf16 ? __uint_as_float(static_cast<unsigned>(bits) << 16)
              : __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ std::uint16_t float_to_half_bits(float x, bool bf16) {
  return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
}

// Code i (0..7) of an 8-byte load, decoded exactly.
__device__ __forceinline__ float decode_at(Fp8Format format, uint2 codes, int i) {
  const unsigned word = i < 4 ? codes.x : codes.y;
  return fp8_bits_to_float(format, static_cast<std::uint8_t>(word >> (8 * (i % 4))));
}

template <int kHeadDim>
__global__ void __launch_bounds__(kWarps * 32) fp8_attention_kernel(const Fp8AttentionParams p) {
  constexpr int kLanes = kHeadDim / 8;       // lanes per key row
  constexpr int kKeysPerStep = 32 / kLanes;  // keys a warp handles at once
  static_assert(kLanes >= 1 && kLanes <= 32 && 32 % kLanes == 0, "head_dim 8 .. 256, pow2");

  // ---- which query row ----
  const int kv_head = static_cast<int>(blockIdx.y);
  const int seq = static_cast<int>(blockIdx.x) / p.max_q_len;
  const int j = static_cast<int>(blockIdx.x) - seq * p.max_q_len;
  const std::int64_t capacity =
      static_cast<std::int64_t>(p.max_blocks_per_seq) * p.layout.block_size;
  const std::int64_t raw_len = __ldg(p.seq_lens + seq);
  const int kv_len = static_cast<int>(raw_len < 0 ? 0 : (raw_len > capacity ? capacity : raw_len));
  std::int64_t row;  // q / out row
  int pos;           // the query's position: keys <= pos are visible
  if (p.q_indptr == nullptr) {
    row = seq;
    pos = kv_len - 1;
  } else {
    const int q_begin = __ldg(p.q_indptr + seq);
    const std::int64_t raw_q_len = static_cast<std::int64_t>(__ldg(p.q_indptr + seq + 1)) - q_begin;
    const int q_len =
        static_cast<int>(raw_q_len < 0 ? 0 : (raw_q_len > p.max_q_len ? p.max_q_len : raw_q_len));
    if (j >= q_len) return;  // uniform over the CTA
    row = static_cast<std::int64_t>(q_begin) + j;
    pos = kv_len - q_len + j;  // < 0 only for inconsistent data: sees nothing
  }
  const int first = p.window_size > 0 ? max(0, pos - p.window_size + 1) : 0;
  const std::int32_t* table = p.block_table + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int sub = lane % kLanes;       // which 8 dims of the row
  const int key_slot = lane / kLanes;  // which key of the step

  for (int g = warp; g < p.group; g += kWarps) {
    const int q_head = kv_head * p.group + g;
    // This lane's 8 query values, pre-scaled into the log2 domain (or by sm / cap).
    float q[8];
    const std::uint16_t* q_row = p.q + row * p.q_stride_row + q_head * p.q_stride_head + sub * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = half_bits_to_float(q_row[i], p.bf16) * p.score_scale;

    float m = -INFINITY;
    float l = 0.0f;
    float acc[8] = {};
    for (int base = first; base <= pos; base += kKeysPerStep) {
      const int t = base + key_slot;
      const bool valid = t <= pos;  // whole key groups are masked, never read
      float x = -INFINITY;
      std::int64_t block = 0;
      int in_block = 0;
      if (valid) {
        const int block_index = t / p.layout.block_size;
        in_block = t - block_index * p.layout.block_size;
        block = __ldg(table + block_index);
      }
      const bool in_pool = valid && block >= 0 && block < p.layout.num_blocks;
      float dot = 0.0f;
      float v_scale = p.v_scale;
      uint2 v_codes = make_uint2(0, 0);
      if (in_pool) {
        const std::int64_t at = fp8_row_offset(p.layout, block, in_block, kv_head) + sub * 8;
        const uint2 k_codes = *reinterpret_cast<const uint2*>(p.k_cache + at);
        v_codes = *reinterpret_cast<const uint2*>(p.v_cache + at);
#pragma unroll
        for (int i = 0; i < 8; ++i) dot += q[i] * decode_at(p.format, k_codes, i);
      }
      // The row's dot product: a sum over its kLanes lanes (fp32).
#pragma unroll
      for (int offset = kLanes / 2; offset > 0; offset /= 2) {
        dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      }
      if (in_pool) {
        float k_scale = p.k_scale;
        if (p.per_row) {
          const std::int64_t s = fp8_scale_offset(p.layout, block, in_block, kv_head);
          k_scale = *reinterpret_cast<const float*>(p.k_cache + s);
          v_scale = *reinterpret_cast<const float*>(p.v_cache + s);
        }
        const float score = dot * k_scale;
        x = p.cap_log2 > 0.0f ? p.cap_log2 * tanhf(score) : score;
      }  // a block id outside the pool: the key is skipped (finite result, nothing read)
      if (!valid) continue;  // this key group is past the end (the shuffles above are done)
      const float m_new = fmaxf(m, x);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m - m_use);
      const float weight = exp2f(x - m_use);
      m = m_new;
      l = l * alpha + weight;
      const float pv = weight * v_scale;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = acc[i] * alpha + pv * decode_at(p.format, v_codes, i);
    }
    // Merge the key groups' states (lanes with the same `sub`).
#pragma unroll
    for (int offset = kLanes; offset < 32; offset *= 2) {
      const float m_other = __shfl_xor_sync(0xffffffffu, m, offset);
      const float l_other = __shfl_xor_sync(0xffffffffu, l, offset);
      const float m_new = fmaxf(m, m_other);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float a = exp2f(m - m_use);
      const float b = exp2f(m_other - m_use);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float acc_other = __shfl_xor_sync(0xffffffffu, acc[i], offset);
        acc[i] = acc[i] * a + acc_other * b;
      }
      l = l * a + l_other * b;
      m = m_new;
    }
    if (key_slot == 0) {
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      std::uint16_t* o = p.out + row * p.out_stride_row + q_head * p.out_stride_head + sub * 8;
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = float_to_half_bits(acc[i] * inv, p.bf16);
      if (p.lse != nullptr && sub == 0) {
        p.lse[row * p.num_q_heads + q_head] = l > 0.0f ? (m + log2f(l)) * kLn2 : -INFINITY;
      }
    }
  }
}

template <int kHeadDim>
cudaError_t launch(const Fp8AttentionParams& kp, std::int64_t rows, int kv_heads,
                   cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(rows), static_cast<unsigned>(kv_heads));
  config.blockDim = dim3(kWarps * 32);
  config.stream = stream;
  return cudaLaunchKernelEx(&config, fp8_attention_kernel<kHeadDim>, kp);
}

cudaError_t dispatch(const char* where, const Fp8AttentionParams& kp, std::int64_t rows,
                     cudaStream_t stream) {
  if (rows > std::numeric_limits<std::int32_t>::max()) {
    fail(where, "too many query rows for one launch: " + std::to_string(rows));
  }
  if (rows == 0) return cudaSuccess;
  switch (kp.layout.head_dim) {
#if PAGEDKV_CUDA_HEAD_DIM_64
    case 64:
      return launch<64>(kp, rows, kp.layout.num_kv_heads, stream);
#endif
#if PAGEDKV_CUDA_HEAD_DIM_128
    case 128:
      return launch<128>(kp, rows, kp.layout.num_kv_heads, stream);
#endif
#if PAGEDKV_CUDA_HEAD_DIM_256
    case 256:
      return launch<256>(kp, rows, kp.layout.num_kv_heads, stream);
#endif
    default:
      fail(where, head_dim_error(kp.layout.head_dim));
  }
}

Fp8AttentionParams common(const PagedKVParams& params) {
  Fp8AttentionParams kp{};
  kp.k_cache = static_cast<const std::uint8_t*>(params.k_cache);
  kp.v_cache = static_cast<const std::uint8_t*>(params.v_cache);
  kp.layout = params.layout;
  kp.k_scale = params.quant.k_scale;
  kp.v_scale = params.quant.v_scale;
  kp.per_row = params.quant.mode == KVScaleMode::kPerTokenHead;
  kp.format = params.quant.format();
  kp.num_q_heads = params.num_q_heads;
  kp.group = params.group_size();
  kp.block_table = params.block_table;
  kp.max_blocks_per_seq = params.max_blocks_per_seq;
  kp.seq_lens = params.seq_lens;
  if (params.logits_soft_cap > 0.0f) {
    kp.score_scale = params.sm_scale / params.logits_soft_cap;
    kp.cap_log2 = params.logits_soft_cap * kLog2e;
  } else {
    kp.score_scale = params.sm_scale * kLog2e;
    kp.cap_log2 = 0.0f;
  }
  kp.window_size = params.window_size;
  kp.bf16 = params.dtype == KVDtype::kBFloat16;
  return kp;
}

}  // namespace

cudaError_t fp8_paged_decode(const PagedDecodeParams& params, cudaStream_t stream) {
  Fp8AttentionParams kp = common(params);
  kp.q = static_cast<const std::uint16_t*>(params.q);
  kp.q_stride_row = params.q_seq_stride();
  kp.q_stride_head = params.q_head_stride();
  kp.q_indptr = nullptr;
  kp.max_q_len = 1;
  kp.out = static_cast<std::uint16_t*>(params.out);
  kp.out_stride_row = params.out_seq_stride();
  kp.out_stride_head = params.out_head_stride();
  kp.lse = nullptr;
  return dispatch("paged decode attention", kp, params.num_seqs, stream);
}

cudaError_t fp8_paged_extend(const PagedExtendParams& params, cudaStream_t stream) {
  Fp8AttentionParams kp = common(params);
  kp.q = static_cast<const std::uint16_t*>(params.q);
  kp.q_stride_row = params.q_token_stride();
  kp.q_stride_head = params.q_head_stride();
  kp.q_indptr = params.q_indptr;
  kp.max_q_len = params.max_q_len;
  kp.out = static_cast<std::uint16_t*>(params.out);
  kp.out_stride_row = params.out_token_stride();
  kp.out_stride_head = params.out_head_stride();
  kp.lse = params.lse;
  return dispatch("paged extend attention", kp,
                  static_cast<std::int64_t>(params.num_seqs) * params.max_q_len, stream);
}

}  // namespace pagedkv::kernels
