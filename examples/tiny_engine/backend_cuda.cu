// The CUDA forward pass of the tiny engine (see backend.hpp).
//
// Dense layers run in small kernels that perform exactly the CPU path's IEEE operations in the
// same order (explicit _rn intrinsics: no FMA contraction, sequential accumulation per output
// element, double where the CPU uses double), so for equal inputs they return the CPU's bits;
// RoPE uses the CPU's cos/sin values (uploaded). Attention, kv_append and the KV cache are
// pagedkv::cuda's. Everything runs on the legacy default stream; each forward pass ends with the
// logits' copy to the host.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.hpp"
#include "engine.hpp"
#include "model.hpp"
#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/cuda/extend_attention.hpp"
#include "pagedkv/cuda/head_dims.hpp"
#include "pagedkv/device/block_table.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace tiny_engine {

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("tiny engine (CUDA): ") + what + ": " +
                             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
  }
}
#define TE_CUDA_CHECK(call) check((call), #call)
#define TE_LAUNCH_CHECK(what) check(cudaGetLastError(), what)

// A growable device array.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
  }
  // At least n elements (contents are lost when it grows).
  T* reserve(std::size_t n) {
    if (n > capacity_) {
      if (ptr_ != nullptr) TE_CUDA_CHECK(cudaFree(ptr_));
      ptr_ = nullptr;
      capacity_ = 0;
      TE_CUDA_CHECK(
          cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<std::size_t>(n, 1) * sizeof(T)));
      capacity_ = n;
    }
    return ptr_;
  }
  T* upload(const T* host, std::size_t n) {
    reserve(n);
    if (n > 0) TE_CUDA_CHECK(cudaMemcpy(ptr_, host, n * sizeof(T), cudaMemcpyHostToDevice));
    return ptr_;
  }
  T* upload(const std::vector<T>& host) { return upload(host.data(), host.size()); }
  T* get() const { return ptr_; }
  std::size_t capacity() const { return capacity_; }

 private:
  T* ptr_ = nullptr;
  std::size_t capacity_ = 0;
};

// ---- kernels: the CPU path's arithmetic, operation for operation ----

constexpr int kThreads = 128;
constexpr unsigned kMaxGridY = 65535;

unsigned blocks_for(std::size_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

// y[r][i] = sum_j x[r][j] * w[j][i], j ascending, products and sums rounded separately (the CPU
// matmul with -ffp-contract=off).
__global__ void matmul_kernel(const float* x, int rows, int in, const float* w, int out, float* y) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= out) return;
  for (int r = static_cast<int>(blockIdx.y); r < rows; r += static_cast<int>(gridDim.y)) {
    const float* xr = x + static_cast<std::size_t>(r) * in;
    float acc = 0.0f;
    for (int j = 0; j < in; ++j) {
      acc = __fadd_rn(acc, __fmul_rn(xr[j], w[static_cast<std::size_t>(j) * out + i]));
    }
    y[static_cast<std::size_t>(r) * out + i] = acc;
  }
}

// One thread per row: sum of squares in double in index order, then x * inv * weight.
__global__ void rms_norm_kernel(const float* x, int rows, int dim, const float* weight, float eps,
                                float* y) {
  const int r = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= rows) return;
  const float* xr = x + static_cast<std::size_t>(r) * dim;
  float* yr = y + static_cast<std::size_t>(r) * dim;
  double sum = 0.0;
  for (int i = 0; i < dim; ++i) {
    const double v = static_cast<double>(xr[i]);
    sum = __dadd_rn(sum, __dmul_rn(v, v));
  }
  const double mean = __dadd_rn(__ddiv_rn(sum, static_cast<double>(dim)), static_cast<double>(eps));
  const float inv = __double2float_rn(__ddiv_rn(1.0, __dsqrt_rn(mean)));
  for (int i = 0; i < dim; ++i) yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), weight[i]);
}

// Rotate-half RoPE of `heads` heads per row with the rows' (cos, sin) tables [rows, head_dim/2].
__global__ void rope_kernel(float* v, int rows, int heads, int head_dim, const float* cos_table,
                            const float* sin_table) {
  const int half = head_dim / 2;
  const std::int64_t n = static_cast<std::int64_t>(rows) * heads * half;
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n) return;
  const int i = static_cast<int>(idx % half);
  const int h = static_cast<int>((idx / half) % heads);
  const std::int64_t r = idx / (static_cast<std::int64_t>(half) * heads);
  const float c = cos_table[r * half + i];
  const float s = sin_table[r * half + i];
  float* head = v + (r * heads + h) * head_dim;
  const float a = head[i];
  const float b = head[i + half];
  head[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  head[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// pagedkv::float_to_fp16_bits / float_to_bf16_bits (src/kv_dtype.cpp), bit for bit.
__device__ std::uint16_t to_fp16_bits(float value) {
  const std::uint32_t bits = __float_as_uint(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  const std::uint32_t mantissa = magnitude & 0x7fffffu;
  if (exponent >= 16) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (exponent >= -14) {
    std::uint32_t half = (static_cast<std::uint32_t>(exponent + 15) << 10) | (mantissa >> 13);
    const std::uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u) != 0)) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  if (exponent < -25) return sign;
  const std::uint32_t m = mantissa | 0x800000u;
  const int shift = -(exponent + 1);
  std::uint32_t half = m >> shift;
  const std::uint32_t rest = m & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (half & 1u) != 0)) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

__device__ std::uint16_t to_bf16_bits(float value) {
  const std::uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

__global__ void to_bits_kernel(const float* in, std::int64_t n, bool bf16, std::uint16_t* out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = bf16 ? to_bf16_bits(in[i]) : to_fp16_bits(in[i]);
}

// Exact conversions (every fp16 and bf16 value is a float).
__global__ void from_bits_kernel(const std::uint16_t* in, std::int64_t n, bool bf16, float* out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (bf16) {
    out[i] = __uint_as_float(static_cast<std::uint32_t>(in[i]) << 16);
  } else {
    __half_raw raw;
    raw.x = in[i];
    out[i] = __half2float(__half(raw));
  }
}

// out = gate / (1 + e) * up with e = exp(-gate) in double, rounded to float.
__global__ void swiglu_kernel(const float* gate, const float* up, std::int64_t n, float* out) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  const float e = __double2float_rn(exp(-static_cast<double>(g)));
  out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, e)), up[i]);
}

__global__ void add_kernel(float* x, const float* y, std::int64_t n) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

// dst[r] = src[index[r]] for rows of `dim` floats.
__global__ void gather_rows_kernel(const float* src, const std::int32_t* index, int rows, int dim,
                                   float* dst) {
  const std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<std::int64_t>(rows) * dim) return;
  const std::int64_t r = i / dim;
  const std::int64_t c = i % dim;
  dst[i] = src[static_cast<std::int64_t>(index[r]) * dim + c];
}

struct DeviceLayer {
  DeviceArray<float> attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
  DeviceArray<std::uint16_t> k_cache, v_cache;  // [layout.plane_elements()]
};

class CudaBackend final : public ForwardBackend {
 public:
  CudaBackend(const Model& model, const EngineConfig& config);
  void reset_cache() override;
  void forward(const ForwardBatch& batch, std::vector<float>& logits) override;

 private:
  void matmul(const float* x, int rows, int in, const float* w, int out, float* y) {
    const dim3 grid(blocks_for(static_cast<std::size_t>(out)),
                    std::min<unsigned>(static_cast<unsigned>(rows), kMaxGridY));
    matmul_kernel<<<grid, kThreads>>>(x, rows, in, w, out, y);
    TE_LAUNCH_CHECK("matmul_kernel");
  }
  void rms_norm(const float* x, int rows, int dim, const float* weight, float* y) {
    rms_norm_kernel<<<blocks_for(static_cast<std::size_t>(rows)), kThreads>>>(
        x, rows, dim, weight, model_.config().rms_eps, y);
    TE_LAUNCH_CHECK("rms_norm_kernel");
  }

  const Model& model_;
  pagedkv::KVDtype dtype_;  // of q, the new K/V and attention outputs (bf16 with an FP8 cache)
  pagedkv::DecodeKernel decode_kernel_;  // EngineConfig::decode_kernel
  pagedkv::ExtendKernel extend_kernel_;  // EngineConfig::extend_kernel (no split over keys)
  // kWgmmaWarpSpecializedPersistent: its plan (the device's CTAs, no split; made at the first
  // extend step, the same for every batch) and its workspace (the counter).
  pagedkv::ExtendSplitPlan extend_plan_;
  DeviceArray<std::uint64_t> extend_workspace_;
  pagedkv::KVQuant quant_;  // FP8 KV: per-(token, KV head) or per-tensor scales, as the CPU path
  std::vector<float> k_scales_, v_scales_;  // per-tensor: [num_layers]
  pagedkv::KVLayout layout_;
  std::vector<DeviceLayer> layers_;
  DeviceArray<float> embed_, final_norm_, lm_head_;
  // Per-step data and scratch.
  DeviceArray<std::int32_t> tokens_, table_, seq_lens_, q_indptr_, sample_rows_;
  DeviceArray<std::int64_t> slots_;
  DeviceArray<float> cos_, sin_;
  DeviceArray<float> x_, h_, q_, k_, v_, attn_, tmp_, gate_, up_, sampled_, logits_;
  DeviceArray<std::uint16_t> q_bits_, k_bits_, v_bits_, attn_bits_;
  std::vector<float> cos_host_, sin_host_;
};

static_assert(static_cast<int>(pagedkv::DecodeKernel::kSimt) == 0 &&
                  static_cast<int>(pagedkv::DecodeKernel::kTensorCore) == 1 &&
                  static_cast<int>(pagedkv::DecodeKernel::kTensorCoreWideMerge) == 2 &&
                  static_cast<int>(pagedkv::DecodeKernel::kTensorCoreFp8) == 3 &&
                  static_cast<int>(pagedkv::DecodeKernel::kTensorCoreFp8Direct) == 5 &&
                  static_cast<int>(pagedkv::ExtendKernel::kMma16) == 0 &&
                  static_cast<int>(pagedkv::ExtendKernel::kFa2) == 1 &&
                  static_cast<int>(pagedkv::ExtendKernel::kWgmma) == 2 &&
                  static_cast<int>(pagedkv::ExtendKernel::kWgmmaPipelined) == 3 &&
                  static_cast<int>(pagedkv::ExtendKernel::kWgmmaWarpSpecialized) == 4 &&
                  static_cast<int>(pagedkv::ExtendKernel::kWgmmaWarpSpecializedPingPong) == 5 &&
                  static_cast<int>(pagedkv::ExtendKernel::kFa2Fp8) == 6 &&
                  static_cast<int>(pagedkv::ExtendKernel::kWgmmaWarpSpecializedPersistent) == 7 &&
                  static_cast<int>(pagedkv::ExtendKernel::kFa2LeanSoftmax) == 8,
              "EngineConfig::decode_kernel / extend_kernel use these values");

CudaBackend::CudaBackend(const Model& model, const EngineConfig& config)
    : model_(model),
      dtype_(pagedkv::is_fp8(config.kv_dtype) ? pagedkv::KVDtype::kBFloat16 : config.kv_dtype),
      decode_kernel_(config.decode_kernel < 0
                         ? pagedkv::kDefaultDecodeKernel
                         : static_cast<pagedkv::DecodeKernel>(config.decode_kernel)),
      extend_kernel_(config.extend_kernel < 0
                         ? pagedkv::kDefaultExtendKernel
                         : static_cast<pagedkv::ExtendKernel>(config.extend_kernel)) {
  const ModelConfig& m = model.config();
  if (!pagedkv::cuda_head_dim_compiled(m.head_dim)) {
    throw std::invalid_argument(
        "--device cuda needs a head_dim this build of pagedkv::cuda has kernels for (64, 128 or "
        "256 by default; PAGEDKV_CUDA_HEAD_DIMS), got " +
        std::to_string(m.head_dim));
  }
  if (m.num_q_heads / m.num_kv_heads > pagedkv::kCudaDecodeMaxGroupSize) {
    throw std::invalid_argument("--device cuda: the decode kernel serves GQA groups up to " +
                                std::to_string(pagedkv::kCudaDecodeMaxGroupSize));
  }
  layout_ = pagedkv::KVLayout::nhd(config.num_blocks, static_cast<std::int32_t>(config.block_size),
                                   m.num_kv_heads, m.head_dim);
  if (pagedkv::is_fp8(config.kv_dtype) &&
      config.kv_scale_mode == pagedkv::KVScaleMode::kPerTensor) {
    // The engine's per-layer scales (Engine resolved them into config: given or calibrated).
    quant_.mode = pagedkv::KVScaleMode::kPerTensor;
    quant_.dtype = config.kv_dtype;
    k_scales_ = config.k_scales;
    v_scales_ = config.v_scales;
  } else if (pagedkv::is_fp8(config.kv_dtype)) {
    quant_.mode = pagedkv::KVScaleMode::kPerTokenHead;
    quant_.dtype = config.kv_dtype;
    layout_ = pagedkv::KVLayout::nhd_scaled(config.num_blocks,
                                            static_cast<std::int32_t>(config.block_size),
                                            m.num_kv_heads, m.head_dim);
  }
  layout_.validate();
  // In 16-bit units (an FP8 plane is bytes, a multiple of 16 of them).
  const auto plane = static_cast<std::size_t>(layout_.plane_elements()) *
                     pagedkv::bytes_per_value(quant_.cache_dtype(dtype_)) / 2;
  layers_ = std::vector<DeviceLayer>(static_cast<std::size_t>(m.num_layers));
  for (std::int32_t l = 0; l < m.num_layers; ++l) {
    const LayerWeights& w = model.layer(l);
    DeviceLayer& d = layers_[static_cast<std::size_t>(l)];
    d.attn_norm.upload(w.attn_norm);
    d.wq.upload(w.wq);
    d.wk.upload(w.wk);
    d.wv.upload(w.wv);
    d.wo.upload(w.wo);
    d.mlp_norm.upload(w.mlp_norm);
    d.w_gate.upload(w.w_gate);
    d.w_up.upload(w.w_up);
    d.w_down.upload(w.w_down);
    d.k_cache.reserve(plane);
    d.v_cache.reserve(plane);
  }
  std::vector<float> embed;
  embed.reserve(static_cast<std::size_t>(m.vocab_size) * static_cast<std::size_t>(m.d_model));
  for (std::int32_t t = 0; t < m.vocab_size; ++t) {
    const auto e = model.embedding(t);
    embed.insert(embed.end(), e.begin(), e.end());
  }
  embed_.upload(embed);
  final_norm_.upload(model.final_norm().data(), model.final_norm().size());
  lm_head_.upload(model.lm_head().data(), model.lm_head().size());
  reset_cache();
}

void CudaBackend::reset_cache() {
  // 0xFFFF is a NaN in fp16 and bf16, 0xFF in E4M3 and E5M2 (and an FP8 scale of all ones is a
  // NaN float): reading a slot nobody wrote poisons the logits.
  const std::size_t bytes = static_cast<std::size_t>(layout_.plane_elements()) *
                            pagedkv::bytes_per_value(quant_.cache_dtype(dtype_));
  for (DeviceLayer& d : layers_) {
    TE_CUDA_CHECK(cudaMemset(d.k_cache.get(), 0xff, bytes));
    TE_CUDA_CHECK(cudaMemset(d.v_cache.get(), 0xff, bytes));
  }
  TE_CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaBackend::forward(const ForwardBatch& batch, std::vector<float>& logits) {
  const ModelConfig& m = model_.config();
  const int rows = static_cast<int>(batch.tokens.size());
  const int d = m.d_model;
  const int qd = m.q_dim();
  const int kvd = m.kv_dim();
  const int ffn = m.ffn_dim;
  const int half = m.head_dim / 2;
  const auto vocab = static_cast<std::size_t>(m.vocab_size);
  const auto num_seqs = static_cast<std::int32_t>(batch.seq_lens.size());
  const auto samples = static_cast<int>(batch.sample_rows.size());
  logits.assign(static_cast<std::size_t>(samples) * vocab, 0.0f);
  if (rows == 0) return;
  const auto n = [](int a, int b) {
    return static_cast<std::size_t>(a) * static_cast<std::size_t>(b);
  };

  // The host copies of the batch's data are checked before they are uploaded: the kernels
  // trust device data (pagedkv::validate_extend_metadata / validate_block_table).
  if (batch.decode) {
    pagedkv::validate_block_table(batch.table.block_ids, num_seqs, batch.table.max_blocks_per_seq,
                                  batch.seq_lens, layout_.block_size, layout_.num_blocks);
  } else {
    pagedkv::validate_extend_metadata(batch.q_indptr, batch.max_q_len, batch.seq_lens,
                                      batch.table.block_ids, batch.table.max_blocks_per_seq,
                                      layout_.block_size, layout_.num_blocks);
  }

  // Upload the step: token ids, RoPE tables of the rows' positions, slots, table, lengths.
  cos_host_.resize(n(rows, half));
  sin_host_.resize(n(rows, half));
  for (int r = 0; r < rows; ++r) {
    rope_cos_sin(m.head_dim, batch.positions[static_cast<std::size_t>(r)], m.rope_theta,
                 cos_host_.data() + n(r, half), sin_host_.data() + n(r, half));
  }
  const std::int32_t* tokens = tokens_.upload(batch.tokens);
  const float* cos_table = cos_.upload(cos_host_);
  const float* sin_table = sin_.upload(sin_host_);
  const std::int64_t* slots = slots_.upload(batch.slots);
  const std::int32_t* table = table_.upload(batch.table.block_ids);
  const std::int32_t* seq_lens = seq_lens_.upload(batch.seq_lens);
  const std::int32_t* q_indptr = q_indptr_.upload(batch.q_indptr);
  float* x = x_.reserve(n(rows, d));
  float* h = h_.reserve(n(rows, d));
  float* tmp = tmp_.reserve(n(rows, d));
  float* q = q_.reserve(n(rows, qd));
  float* attn = attn_.reserve(n(rows, qd));
  float* k = k_.reserve(n(rows, kvd));
  float* v = v_.reserve(n(rows, kvd));
  float* gate = gate_.reserve(n(rows, ffn));
  float* up = up_.reserve(n(rows, ffn));
  std::uint16_t* q_bits = q_bits_.reserve(n(rows, qd));
  std::uint16_t* k_bits = k_bits_.reserve(n(rows, kvd));
  std::uint16_t* v_bits = v_bits_.reserve(n(rows, kvd));
  std::uint16_t* attn_bits = attn_bits_.reserve(n(rows, qd));
  const bool bf16 = dtype_ == pagedkv::KVDtype::kBFloat16;
  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));

  gather_rows_kernel<<<blocks_for(n(rows, d)), kThreads>>>(embed_.get(), tokens, rows, d, x);
  TE_LAUNCH_CHECK("gather_rows_kernel");
  for (std::int32_t l = 0; l < m.num_layers; ++l) {
    DeviceLayer& w = layers_[static_cast<std::size_t>(l)];
    if (quant_.mode == pagedkv::KVScaleMode::kPerTensor) {
      quant_.k_scale = k_scales_[static_cast<std::size_t>(l)];
      quant_.v_scale = v_scales_[static_cast<std::size_t>(l)];
    }
    // Attention block.
    rms_norm(x, rows, d, w.attn_norm.get(), h);
    matmul(h, rows, d, w.wq.get(), qd, q);
    matmul(h, rows, d, w.wk.get(), kvd, k);
    matmul(h, rows, d, w.wv.get(), kvd, v);
    rope_kernel<<<blocks_for(n(rows, m.num_q_heads * half)), kThreads>>>(
        q, rows, m.num_q_heads, m.head_dim, cos_table, sin_table);
    rope_kernel<<<blocks_for(n(rows, m.num_kv_heads * half)), kThreads>>>(
        k, rows, m.num_kv_heads, m.head_dim, cos_table, sin_table);
    TE_LAUNCH_CHECK("rope_kernel");
    to_bits_kernel<<<blocks_for(n(rows, kvd)), kThreads>>>(
        k, static_cast<std::int64_t>(n(rows, kvd)), bf16, k_bits);
    to_bits_kernel<<<blocks_for(n(rows, kvd)), kThreads>>>(
        v, static_cast<std::int64_t>(n(rows, kvd)), bf16, v_bits);
    to_bits_kernel<<<blocks_for(n(rows, qd)), kThreads>>>(q, static_cast<std::int64_t>(n(rows, qd)),
                                                          bf16, q_bits);
    TE_LAUNCH_CHECK("to_bits_kernel");

    pagedkv::KVAppendParams append;
    append.dtype = dtype_;
    append.quant = quant_;
    append.num_tokens = rows;
    append.key = k_bits;
    append.value = v_bits;
    append.slot_mapping = slots;
    append.k_cache = w.k_cache.get();
    append.v_cache = w.v_cache.get();
    append.layout = layout_;
    TE_CUDA_CHECK(pagedkv::kv_append(append, nullptr));

    if (batch.decode) {
      pagedkv::PagedDecodeParams attention;
      attention.dtype = dtype_;
      attention.quant = quant_;
      attention.num_seqs = num_seqs;
      attention.num_q_heads = m.num_q_heads;
      attention.q = q_bits;
      attention.k_cache = w.k_cache.get();
      attention.v_cache = w.v_cache.get();
      attention.layout = layout_;
      attention.block_table = table;
      attention.max_blocks_per_seq = batch.table.max_blocks_per_seq;
      attention.seq_lens = seq_lens;
      attention.out = attn_bits;
      attention.sm_scale = sm_scale;
      // No split-KV: a sequence's result must not depend on the rest of the batch.
      TE_CUDA_CHECK(pagedkv::paged_decode_attention(attention, pagedkv::DecodePlan{}, nullptr, 0,
                                                    nullptr, decode_kernel_));
    } else {
      pagedkv::PagedExtendParams attention;
      attention.dtype = dtype_;
      attention.quant = quant_;
      attention.num_seqs = num_seqs;
      attention.num_q_heads = m.num_q_heads;
      attention.q_indptr = q_indptr;
      attention.max_q_len = batch.max_q_len;
      attention.q = q_bits;
      attention.k_cache = w.k_cache.get();
      attention.v_cache = w.v_cache.get();
      attention.layout = layout_;
      attention.block_table = table;
      attention.max_blocks_per_seq = batch.table.max_blocks_per_seq;
      attention.seq_lens = seq_lens;
      attention.out = attn_bits;
      attention.sm_scale = sm_scale;
      // No split over keys either (the same reason). The persistent variant's plan names its CTAs
      // and its workspace holds the work counter (which CTA runs an item does not change it).
      if (extend_kernel_ == pagedkv::ExtendKernel::kWgmmaWarpSpecializedPersistent &&
          extend_plan_.persistent_ctas == 0) {
        TE_CUDA_CHECK(pagedkv::extend_split_plan_for_current_device(attention, extend_kernel_,
                                                                    &extend_plan_));
        extend_plan_.num_splits = 1;
      }
      const std::size_t ws_bytes = pagedkv::extend_workspace_bytes(attention, extend_plan_);
      void* ws = ws_bytes > 0 ? extend_workspace_.reserve((ws_bytes + 7) / 8) : nullptr;
      TE_CUDA_CHECK(pagedkv::paged_extend_attention(attention, nullptr, extend_kernel_,
                                                    extend_plan_, ws, ws_bytes));
    }
    from_bits_kernel<<<blocks_for(n(rows, qd)), kThreads>>>(
        attn_bits, static_cast<std::int64_t>(n(rows, qd)), bf16, attn);
    TE_LAUNCH_CHECK("from_bits_kernel");
    matmul(attn, rows, qd, w.wo.get(), d, tmp);
    add_kernel<<<blocks_for(n(rows, d)), kThreads>>>(x, tmp, static_cast<std::int64_t>(n(rows, d)));
    TE_LAUNCH_CHECK("add_kernel");

    // MLP block.
    rms_norm(x, rows, d, w.mlp_norm.get(), h);
    matmul(h, rows, d, w.w_gate.get(), ffn, gate);
    matmul(h, rows, d, w.w_up.get(), ffn, up);
    swiglu_kernel<<<blocks_for(n(rows, ffn)), kThreads>>>(
        gate, up, static_cast<std::int64_t>(n(rows, ffn)), gate);
    TE_LAUNCH_CHECK("swiglu_kernel");
    matmul(gate, rows, ffn, w.w_down.get(), d, tmp);
    add_kernel<<<blocks_for(n(rows, d)), kThreads>>>(x, tmp, static_cast<std::int64_t>(n(rows, d)));
    TE_LAUNCH_CHECK("add_kernel");
  }

  // Logits of the sampled rows.
  if (samples > 0) {
    std::vector<std::int32_t> sample_rows(batch.sample_rows.begin(), batch.sample_rows.end());
    const std::int32_t* index = sample_rows_.upload(sample_rows);
    float* sampled = sampled_.reserve(n(samples, d));
    float* normed = h;  // rows >= samples
    float* out = logits_.reserve(static_cast<std::size_t>(samples) * vocab);
    gather_rows_kernel<<<blocks_for(n(samples, d)), kThreads>>>(x, index, samples, d, sampled);
    TE_LAUNCH_CHECK("gather_rows_kernel");
    rms_norm(sampled, samples, d, final_norm_.get(), normed);
    matmul(normed, samples, d, lm_head_.get(), m.vocab_size, out);
    TE_CUDA_CHECK(
        cudaMemcpy(logits.data(), out, logits.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }
  TE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace

std::unique_ptr<ForwardBackend> make_cuda_backend(const Model& model, const EngineConfig& config) {
  if (pagedkv::cuda_device_count() == 0) {
    throw NoCudaDevice(
        "--device cuda: no CUDA device is visible to this process (no NVIDIA driver, or no GPU); "
        "run it on a GPU machine, or use --device cpu");
  }
  return std::make_unique<CudaBackend>(model, config);
}

bool cuda_backend_built() noexcept {
  return true;
}

}  // namespace tiny_engine
