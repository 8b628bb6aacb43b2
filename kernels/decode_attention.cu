// Paged decode attention: one query token per sequence over its paged K/V (see
// include/pagedkv/cuda/decode_attention.hpp for the contract).
//
// CTA = 4 warps = one (sequence, KV head, split). K/V tiles of kTile tokens (8 KiB of K and 8 KiB
// of V) stream through a kStages-deep cp.async pipeline; every thread issues 16-byte copies and
// resolves its rows through the block table itself, so a tile may span many blocks (block size 1
// included). The query heads of the GQA group are spread over the warps: a warp owns up to
// kMaxHeadsPerWarp heads (their q slices live in registers) and a share of each tile's rows; with
// small groups several warps share a head and split the rows, and their softmax states are merged
// at the end. Within a warp, kLanesPerRow lanes cover one row (16 bytes each) and the warp covers
// kRowsPerStep rows at a time.
//
// Per tile, each warp: scores for its rows and heads (dot products reduced across the row's
// lanes) go to shared memory; then the tile maximum, a rescale of the running output, and P x V
// with p = exp2(score - max) recomputed per row. Scores are kept in the log2 domain (q is
// pre-multiplied by sm_scale x log2(e)), so exp2f is the only transcendental. Rows past the
// range's end are zero-filled in shared memory and masked to -inf, so nothing past seq_len is
// ever read from global memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "fp8_kernels.hpp"
#include "internal/cp_async.cuh"
#include "internal/decode_tc_launch.hpp"
#include "internal/decode_tc_layout.hpp"
#include "internal/head_dims.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/cuda/decode_attention.hpp"

namespace pagedkv {

namespace {

using kernels::cp_async_16;
using kernels::cp_async_commit;
using kernels::cp_async_wait;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 3;
constexpr int kMaxGroup = kCudaDecodeMaxGroupSize;
constexpr int kMaxHeadsPerWarp = kMaxGroup / kWarps;
constexpr int kMinCtasPerSm = 4;
constexpr float kLog2e = 1.4426950408889634f;

// ---- 16-bit vector conversions (8 values = 16 bytes) ----

struct Bf16Ops {
  __device__ static void to_float8(const uint4& v, float (&f)[8]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
  __device__ static unsigned pack2(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const unsigned*>(&h);
  }
};

struct Fp16Ops {
  __device__ static void to_float8(const uint4& v, float (&f)[8]) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
  __device__ static unsigned pack2(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const unsigned*>(&h);
  }
};

// ---- kernel parameters ----

struct DecodeKernelParams {
  const std::uint16_t* q;  // [num_seqs, num_q_heads, head_dim]
  std::int64_t q_stride_seq;
  std::int64_t q_stride_head;
  const std::uint16_t* k_cache;
  const std::uint16_t* v_cache;
  std::int64_t stride_block;
  std::int64_t stride_token;
  std::int64_t stride_head;
  std::int64_t num_blocks;
  std::int32_t block_size;
  std::int32_t block_shift;  // log2(block_size) when a power of two, else -1
  std::int32_t num_kv_heads;
  std::int32_t num_q_heads;
  std::int32_t group;               // query heads per KV head
  std::int32_t heads_per_warp;      // <= kMaxHeadsPerWarp
  std::int32_t head_groups;         // warps' head sets: ceil(group / heads_per_warp)
  std::int32_t token_splits;        // warps sharing one head set: kWarps / head_groups (1, 2, 4)
  const std::int32_t* block_table;  // [num_seqs, max_blocks_per_seq]
  std::int32_t max_blocks_per_seq;
  const std::int32_t* seq_lens;  // [num_seqs]
  std::uint16_t* out;            // [num_seqs, num_q_heads, head_dim]
  std::int64_t out_stride_seq;
  std::int64_t out_stride_head;
  float q_scale;   // sm_scale x log2(e), or sm_scale / cap with a soft-cap
  float cap_log2;  // cap x log2(e); 0 = no soft-cap
  std::int32_t window_size;
  std::int32_t num_splits;
  std::int32_t chunk;  // tokens per split when num_splits > 1
  float* partial_out;  // [num_seqs, num_q_heads, num_splits, head_dim]
  float* partial_lse;  // [num_seqs, num_q_heads, num_splits]
};

// The token range one (sequence, split) attends: [begin, end). Shared by both kernels so that
// they agree on how many splits a sequence uses.
struct SplitRange {
  int begin;
  int end;
  int num_active_splits;  // >= 1
};

__device__ __forceinline__ SplitRange split_range(const DecodeKernelParams& p, int seq, int split) {
  const std::int64_t capacity = static_cast<std::int64_t>(p.max_blocks_per_seq) * p.block_size;
  const std::int64_t raw_len = __ldg(p.seq_lens + seq);
  const int len = static_cast<int>(raw_len < 0 ? 0 : (raw_len > capacity ? capacity : raw_len));
  const int first = p.window_size > 0 && len > p.window_size ? len - p.window_size : 0;
  SplitRange r{first, len, 1};
  if (p.num_splits > 1) {
    const std::int64_t attended = len - first;
    const std::int64_t needed = (attended + p.chunk - 1) / p.chunk;
    r.num_active_splits =
        needed < 1 ? 1 : (needed < p.num_splits ? static_cast<int>(needed) : p.num_splits);
    r.begin = first + split * p.chunk;  // split < num_active_splits, so no overflow
    r.end = split == r.num_active_splits - 1 ? len : r.begin + p.chunk;
  }
  return r;
}

template <int kHeadDim>
struct DecodeShape {
  static constexpr int kLanesPerRow = kHeadDim / 8;       // 16-byte vectors per row
  static constexpr int kRowsPerStep = 32 / kLanesPerRow;  // rows a warp covers at once
  static constexpr int kTile = 4096 / kHeadDim;           // tokens per tile: 8 KiB of K
  static constexpr int kTileVecs = kTile * kLanesPerRow;  // 16-byte vectors per K tile
  static constexpr int kLoadsPerThread = kTileVecs / kThreads;
  static constexpr int kLoadRowStride = kThreads / kLanesPerRow;
  static constexpr std::size_t kSmemBytes =
      2u * kStages * kTileVecs * sizeof(uint4) + sizeof(float) * kMaxGroup * kTile;
  static_assert(kTileVecs % kThreads == 0, "whole vectors per thread");
  static_assert(kTile % (kWarps * kRowsPerStep) == 0, "rows split evenly over 4 warps");
  // The end-of-kernel merge scratch reuses the stage buffers.
  static_assert(sizeof(float) * kWarps * kMaxHeadsPerWarp * (kHeadDim + 2) <=
                    2u * kStages * kTileVecs * sizeof(uint4),
                "merge scratch fits");
};

template <typename Ops, int kHeadDim>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
    paged_decode_kernel(const DecodeKernelParams p) {
  using S = DecodeShape<kHeadDim>;
  constexpr int kL = S::kLanesPerRow;
  constexpr int kTile = S::kTile;
  extern __shared__ uint4 smem[];
  uint4* k_tiles = smem;                           // [kStages][kTileVecs]
  uint4* v_tiles = smem + kStages * S::kTileVecs;  // [kStages][kTileVecs]
  float* scores = reinterpret_cast<float*>(smem + 2 * kStages * S::kTileVecs);  // [group][kTile]

  // Work item: blockIdx.x = (seq * num_kv_heads + kv_head) * num_splits + split.
  const std::int64_t item = blockIdx.x;
  const int split = static_cast<int>(item % p.num_splits);
  const std::int64_t seq_head = item / p.num_splits;
  const int kv_head = static_cast<int>(seq_head % p.num_kv_heads);
  const int seq = static_cast<int>(seq_head / p.num_kv_heads);
  const SplitRange range = split_range(p, seq, split);
  if (split >= range.num_active_splits) return;  // uniform over the CTA: no barrier skipped
  const bool direct = range.num_active_splits == 1;

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int head_group = warp / p.token_splits;
  const int token_split = warp % p.token_splits;
  const bool active = head_group < p.head_groups;
  const int head0 = head_group * p.heads_per_warp;  // first head of the warp, within the group
  const int num_heads = active ? min(p.heads_per_warp, p.group - head0) : 0;
  const int vec = lane % kL;          // which 16-byte slice of a row this lane handles
  const int row_in_step = lane / kL;  // which of the step's rows
  const int rows_per_warp = kTile / p.token_splits;
  const int row0 = token_split * rows_per_warp;
  const int steps = rows_per_warp / S::kRowsPerStep;

  // q slices of this warp's heads, pre-scaled into the log2 domain.
  float q[kMaxHeadsPerWarp][8];
  const int q_head0 = kv_head * p.group + head0;
#pragma unroll
  for (int j = 0; j < kMaxHeadsPerWarp; ++j) {
    if (j < num_heads) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(
          p.q + seq * p.q_stride_seq + (q_head0 + j) * p.q_stride_head + vec * 8));
      Ops::to_float8(raw, q[j]);
#pragma unroll
      for (int k = 0; k < 8; ++k) q[j][k] *= p.q_scale;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) q[j][k] = 0.0f;
    }
  }
  float acc[kMaxHeadsPerWarp][8];
  float m[kMaxHeadsPerWarp];
  float l[kMaxHeadsPerWarp];
#pragma unroll
  for (int j = 0; j < kMaxHeadsPerWarp; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[j][k] = 0.0f;
  }

  // Loader: thread t copies vectors t + i * kThreads of each tile, i.e. rows
  // t / kL + i * kLoadRowStride, always the same 16-byte column.
  const int load_vec = static_cast<int>(threadIdx.x) % kL;
  const int load_row = static_cast<int>(threadIdx.x) / kL;
  const std::int64_t head_offset = kv_head * p.stride_head + load_vec * 8;
  const std::int32_t* table_row =
      p.block_table + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;
  const auto load_tile = [&](int tile, int stage) {
    const int tile_begin = range.begin + tile * kTile;
#pragma unroll
    for (int i = 0; i < S::kLoadsPerThread; ++i) {
      const int t = tile_begin + load_row + i * S::kLoadRowStride;
      bool fill = t < range.end;
      std::int64_t offset = 0;
      if (fill) {
        int block_index;
        int in_block;
        if (p.block_shift >= 0) {
          block_index = t >> p.block_shift;
          in_block = t & (p.block_size - 1);
        } else {
          block_index = t / p.block_size;
          in_block = t - block_index * p.block_size;
        }
        const std::int64_t block = __ldg(table_row + block_index);
        fill = block >= 0 && block < p.num_blocks;
        offset = block * p.stride_block + in_block * p.stride_token + head_offset;
      }
      const int slot = stage * S::kTileVecs + static_cast<int>(threadIdx.x) + i * kThreads;
      cp_async_16(k_tiles + slot, fill ? p.k_cache + offset : p.k_cache, fill);
      cp_async_16(v_tiles + slot, fill ? p.v_cache + offset : p.v_cache, fill);
    }
  };

  const int num_tiles = (range.end - range.begin + kTile - 1) / kTile;
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < num_tiles) load_tile(stage, stage);
    cp_async_commit();
  }
  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile's data visible to all; the stage refilled below is no longer read
    const int next = tile + kStages - 1;
    if (next < num_tiles) load_tile(next, next % kStages);
    cp_async_commit();
    if (num_heads == 0) continue;

    const uint4* kt = k_tiles + (tile % kStages) * S::kTileVecs;
    const uint4* vt = v_tiles + (tile % kStages) * S::kTileVecs;
    const int valid_rows = range.end - (range.begin + tile * kTile);

    // Scores of this warp's rows for its heads.
    for (int step = 0; step < steps; ++step) {
      const int r = row0 + step * S::kRowsPerStep + row_in_step;
      float kf[8];
      Ops::to_float8(kt[r * kL + vec], kf);
#pragma unroll
      for (int j = 0; j < kMaxHeadsPerWarp; ++j) {
        if (j < num_heads) {
          float dot = 0.0f;
#pragma unroll
          for (int k = 0; k < 8; ++k) dot = fmaf(q[j][k], kf[k], dot);
#pragma unroll
          for (int offset = kL / 2; offset > 0; offset /= 2) {
            dot += __shfl_xor_sync(0xffffffffu, dot, offset);
          }
          if (vec == 0) {
            const float s = p.cap_log2 > 0.0f ? p.cap_log2 * tanhf(dot) : dot;
#ifdef PAGEDKV_TEST_DROP_KEY
            // Test-only build (tests/cuda_broken_kernel_test.cpp): one key position left out.
            const bool dropped = range.begin + tile * kTile + r == PAGEDKV_TEST_DROP_KEY;
#else
            constexpr bool dropped = false;
#endif
            scores[(head0 + j) * kTile + r] = r < valid_rows && !dropped ? s : -INFINITY;
          }
        }
      }
    }
    __syncwarp();

    // Tile maximum over the warp's rows; rescale the running state.
    float m_use[kMaxHeadsPerWarp];
#pragma unroll
    for (int j = 0; j < kMaxHeadsPerWarp; ++j) {
      m_use[j] = 0.0f;
      if (j < num_heads) {
        float tile_max = -INFINITY;
        for (int r = lane; r < rows_per_warp; r += 32) {
          tile_max = fmaxf(tile_max, scores[(head0 + j) * kTile + row0 + r]);
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) {
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
        }
        const float m_new = fmaxf(m[j], tile_max);
        // Until a valid row is seen m stays -inf; subtracting 0 then keeps exp2f(-inf) = 0.
        m_use[j] = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = exp2f(m[j] - m_use[j]);
        l[j] *= alpha;
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[j][k] *= alpha;
        m[j] = m_new;
      }
    }

    // P x V.
    for (int step = 0; step < steps; ++step) {
      const int r = row0 + step * S::kRowsPerStep + row_in_step;
      float vf[8];
      Ops::to_float8(vt[r * kL + vec], vf);
#pragma unroll
      for (int j = 0; j < kMaxHeadsPerWarp; ++j) {
        if (j < num_heads) {
          const float prob = exp2f(scores[(head0 + j) * kTile + r] - m_use[j]);
          l[j] += prob;
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[j][k] = fmaf(prob, vf[k], acc[j][k]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the stage buffers are reused as merge scratch below

  // Sum over the warp's row groups (lanes with the same `vec`).
#pragma unroll
  for (int j = 0; j < kMaxHeadsPerWarp; ++j) {
    if (j < num_heads) {
#pragma unroll
      for (int offset = kL; offset < 32; offset *= 2) {
        l[j] += __shfl_xor_sync(0xffffffffu, l[j], offset);
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[j][k] += __shfl_xor_sync(0xffffffffu, acc[j][k], offset);
      }
    }
  }

  // Merge the warps that split one head set's rows: same formula as the split-KV merge.
  if (p.token_splits > 1) {
    float* scratch_acc = reinterpret_cast<float*>(smem);  // [kWarps][kMaxHeadsPerWarp][kHeadDim]
    float* scratch_ml = scratch_acc + kWarps * kMaxHeadsPerWarp * kHeadDim;  // [..][..][2]
#pragma unroll
    for (int j = 0; j < kMaxHeadsPerWarp; ++j) {
      if (j < num_heads) {
        float* a = scratch_acc + (warp * kMaxHeadsPerWarp + j) * kHeadDim + vec * 8;
        if (row_in_step == 0) {
#pragma unroll
          for (int k = 0; k < 8; ++k) a[k] = acc[j][k];
        }
        if (lane == 0) {
          scratch_ml[(warp * kMaxHeadsPerWarp + j) * 2] = m[j];
          scratch_ml[(warp * kMaxHeadsPerWarp + j) * 2 + 1] = l[j];
        }
      }
    }
    __syncthreads();
    if (token_split == 0) {
#pragma unroll
      for (int j = 0; j < kMaxHeadsPerWarp; ++j) {
        if (j < num_heads) {
          float m_all = -INFINITY;
          for (int w = warp; w < warp + p.token_splits; ++w) {
            m_all = fmaxf(m_all, scratch_ml[(w * kMaxHeadsPerWarp + j) * 2]);
          }
          const float m_ref = m_all == -INFINITY ? 0.0f : m_all;
          float l_all = 0.0f;
          float a_all[8] = {};
          for (int w = warp; w < warp + p.token_splits; ++w) {
            const float weight = exp2f(scratch_ml[(w * kMaxHeadsPerWarp + j) * 2] - m_ref);
            l_all += weight * scratch_ml[(w * kMaxHeadsPerWarp + j) * 2 + 1];
            const float* a = scratch_acc + (w * kMaxHeadsPerWarp + j) * kHeadDim + vec * 8;
#pragma unroll
            for (int k = 0; k < 8; ++k) a_all[k] = fmaf(weight, a[k], a_all[k]);
          }
          m[j] = m_all;
          l[j] = l_all;
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[j][k] = a_all[k];
        }
      }
    }
  }
  if (token_split != 0 || row_in_step != 0) return;

    // Lanes 0 .. kL - 1 of each head set's first warp write its heads.
#pragma unroll
  for (int j = 0; j < kMaxHeadsPerWarp; ++j) {
    if (j < num_heads) {
      const int q_head = q_head0 + j;
      if (direct) {
        const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
        uint4 packed;
        packed.x = Ops::pack2(acc[j][0] * inv, acc[j][1] * inv);
        packed.y = Ops::pack2(acc[j][2] * inv, acc[j][3] * inv);
        packed.z = Ops::pack2(acc[j][4] * inv, acc[j][5] * inv);
        packed.w = Ops::pack2(acc[j][6] * inv, acc[j][7] * inv);
        *reinterpret_cast<uint4*>(p.out + seq * p.out_stride_seq + q_head * p.out_stride_head +
                                  vec * 8) = packed;
      } else {
        // A non-empty chunk: its maximum row has prob 1, so l >= 1.
        const std::int64_t state =
            (static_cast<std::int64_t>(seq) * p.num_q_heads + q_head) * p.num_splits + split;
        const float inv = 1.0f / l[j];
        float4* o = reinterpret_cast<float4*>(p.partial_out + state * kHeadDim + vec * 8);
        o[0] = make_float4(acc[j][0] * inv, acc[j][1] * inv, acc[j][2] * inv, acc[j][3] * inv);
        o[1] = make_float4(acc[j][4] * inv, acc[j][5] * inv, acc[j][6] * inv, acc[j][7] * inv);
        if (vec == 0) p.partial_lse[state] = m[j] + log2f(l[j]);
      }
    }
  }
}

// Merges the split-KV partial outputs of each (sequence, query head) that used >= 2 splits:
// out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M). blockDim = (kHeadDim / 4, kMergeHeads).
constexpr int kMergeHeads = 4;

template <typename Ops, int kHeadDim>
__global__ void __launch_bounds__(kHeadDim / 4 * kMergeHeads)
    merge_splits_kernel(const DecodeKernelParams p, std::int64_t num_states) {
  const std::int64_t state = static_cast<std::int64_t>(blockIdx.x) * kMergeHeads + threadIdx.y;
  if (state >= num_states) return;
  const int seq = static_cast<int>(state / p.num_q_heads);
  const int q_head = static_cast<int>(state % p.num_q_heads);
  const int n = split_range(p, seq, 0).num_active_splits;
  if (n <= 1) return;  // written directly by the attention kernel
  const float* lse = p.partial_lse + state * p.num_splits;
  float m_all = -INFINITY;
  for (int s = 0; s < n; ++s) m_all = fmaxf(m_all, lse[s]);
  float weight_sum = 0.0f;
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const int d = static_cast<int>(threadIdx.x) * 4;
  for (int s = 0; s < n; ++s) {
    const float w = exp2f(lse[s] - m_all);
    weight_sum += w;
    const float4 part =
        *reinterpret_cast<const float4*>(p.partial_out + (state * p.num_splits + s) * kHeadDim + d);
    o.x = fmaf(w, part.x, o.x);
    o.y = fmaf(w, part.y, o.y);
    o.z = fmaf(w, part.z, o.z);
    o.w = fmaf(w, part.w, o.w);
  }
  const float inv = 1.0f / weight_sum;
  uint2 packed;
  packed.x = Ops::pack2(o.x * inv, o.y * inv);
  packed.y = Ops::pack2(o.z * inv, o.w * inv);
  *reinterpret_cast<uint2*>(p.out + seq * p.out_stride_seq + q_head * p.out_stride_head + d) =
      packed;
}

// ---- host side ----

bool aligned16(const void* ptr) {
  return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
}

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "paged_decode_attention (CUDA): " + message);
}

template <typename Ops, int kHeadDim>
cudaError_t set_smem_limit() {
  return cudaFuncSetAttribute(paged_decode_kernel<Ops, kHeadDim>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(DecodeShape<kHeadDim>::kSmemBytes));
}

template <typename Ops, int kHeadDim>
cudaError_t launch(const DecodeKernelParams& kp, std::int64_t num_seqs, cudaStream_t stream) {
  // Set on every launch: cheap, per device, and allowed while a graph is being captured.
  cudaError_t err = set_smem_limit<Ops, kHeadDim>();
  if (err != cudaSuccess) return err;
  const std::int64_t ctas = num_seqs * kp.num_kv_heads * kp.num_splits;
  if (ctas == 0) return cudaSuccess;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(ctas));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = DecodeShape<kHeadDim>::kSmemBytes;
  config.stream = stream;
  err = cudaLaunchKernelEx(&config, paged_decode_kernel<Ops, kHeadDim>, kp);
  if (err != cudaSuccess || kp.num_splits == 1) return err;

  const std::int64_t states = num_seqs * kp.num_q_heads;
  cudaLaunchConfig_t merge{};
  merge.gridDim = dim3(static_cast<unsigned>((states + kMergeHeads - 1) / kMergeHeads));
  merge.blockDim = dim3(kHeadDim / 4, kMergeHeads);
  merge.stream = stream;
  return cudaLaunchKernelEx(&merge, merge_splits_kernel<Ops, kHeadDim>, kp, states);
}

template <typename Fn>
auto dispatch(KVDtype dtype, int head_dim, Fn&& fn) {
  const bool bf16 = dtype == KVDtype::kBFloat16;
  switch (head_dim) {
#if PAGEDKV_CUDA_HEAD_DIM_64
    case 64:
      return bf16 ? fn.template operator()<Bf16Ops, 64>() : fn.template operator()<Fp16Ops, 64>();
#endif
#if PAGEDKV_CUDA_HEAD_DIM_128
    case 128:
      return bf16 ? fn.template operator()<Bf16Ops, 128>() : fn.template operator()<Fp16Ops, 128>();
#endif
#if PAGEDKV_CUDA_HEAD_DIM_256
    case 256:
      return bf16 ? fn.template operator()<Bf16Ops, 256>() : fn.template operator()<Fp16Ops, 256>();
#endif
    default:
      fail(kernels::head_dim_error(head_dim));
  }
}

}  // namespace

void validate_cuda_decode(const PagedDecodeParams& params, const DecodePlan& plan,
                          const void* workspace, std::size_t workspace_bytes) {
  validate(params);
  validate(plan);
  const int head_dim = params.layout.head_dim;
  if (!kernels::head_dim_compiled(head_dim)) fail(kernels::head_dim_error(head_dim));
  if (params.group_size() > kCudaDecodeMaxGroupSize) {
    fail("at most " + std::to_string(kCudaDecodeMaxGroupSize) + " query heads per KV head, got " +
         std::to_string(params.group_size()));
  }
  if (params.num_seqs == 0) return;
  if (!aligned16(params.q) || !aligned16(params.k_cache) || !aligned16(params.v_cache) ||
      !aligned16(params.out)) {
    fail("q, k_cache, v_cache and out must be 16-byte aligned");
  }
  if (params.out == nullptr) fail("out is null");
  for (const std::int64_t stride :
       {params.q_seq_stride(), params.q_token_stride(), params.q_head_stride(),
        params.out_seq_stride(), params.out_token_stride(), params.out_head_stride()}) {
    if (stride % 8 != 0) fail("q and out strides must be multiples of 8 elements");
  }
  const std::int64_t ctas =
      static_cast<std::int64_t>(params.num_seqs) * params.layout.num_kv_heads * plan.num_splits;
  if (ctas > std::numeric_limits<std::int32_t>::max()) {
    fail("num_seqs x num_kv_heads x num_splits = " + std::to_string(ctas) +
         " CTAs exceeds 2^31 - 1");
  }
  if (plan.split_kv()) {
    // The merge kernels' grids: kTensorCoreWideMerge launches one CTA per (sequence, query
    // token, query head).
    const std::int64_t states =
        static_cast<std::int64_t>(params.num_seqs) * params.q_len * params.num_q_heads;
    if (states > std::numeric_limits<std::int32_t>::max()) {
      fail("num_seqs x q_len x num_q_heads = " + std::to_string(states) +
           " merge states exceeds 2^31 - 1");
    }
    const std::size_t needed =
        decode_workspace_bytes(plan, params.num_seqs, params.num_q_heads, head_dim, params.q_len);
    if (workspace == nullptr || workspace_bytes < needed) {
      fail("the split-KV plan needs a workspace of " + std::to_string(needed) + " bytes, got " +
           std::to_string(workspace == nullptr ? 0 : workspace_bytes));
    }
    if (!aligned16(workspace)) fail("workspace must be 16-byte aligned");
  }
}

namespace {

// Why `kernel` cannot take params' q_len > 1 query tokens per sequence (kNone: it can, or
// q_len is 1). The tensor-core kernels of a 16-bit cache put the group's heads times the tokens on
// the MMA's 16 rows (kernels/decode_attention_tc.cu); kTensorCoreFp8 and kTensorCoreFp8Direct on a
// 16-bit cache run kTensorCore.
enum class MultiQueryRefusal { kNone, kNotTensorCore, kTooManyRows };

MultiQueryRefusal multi_query_refusal(const PagedDecodeParams& params,
                                      DecodeKernel kernel) noexcept {
  if (params.q_len <= 1) return MultiQueryRefusal::kNone;
  const bool tensor_core =
      kernel == DecodeKernel::kTensorCore || kernel == DecodeKernel::kTensorCoreWideMerge ||
      kernel == DecodeKernel::kTensorCoreFusedMerge || kernel == DecodeKernel::kTensorCoreFp8 ||
      kernel == DecodeKernel::kTensorCoreFp8Direct;
  if (params.quant.fp8() || !tensor_core) return MultiQueryRefusal::kNotTensorCore;
  if (params.group_size() * params.q_len > kCudaDecodeMaxQueryRows) {
    return MultiQueryRefusal::kTooManyRows;
  }
  return MultiQueryRefusal::kNone;
}

}  // namespace

bool decode_kernel_runs(const PagedDecodeParams& params, DecodeKernel kernel) noexcept {
  // The 16-bit variants cover every 16-bit shape validate_cuda_decode accepts; FP8 has its own
  // kernels (kTensorCoreFp8's needs 16-byte strides). Several query tokens per sequence: what
  // multi_query_refusal accepts (paged_decode_attention refuses the rest).
  if (multi_query_refusal(params, kernel) != MultiQueryRefusal::kNone) return false;
  if (params.quant.fp8()) {
    return (kernel == DecodeKernel::kTensorCoreFp8 ||
            kernel == DecodeKernel::kTensorCoreFp8Direct) &&
           kernels::tc_fp8_decode_supported(params.layout);
  }
  return kernel == DecodeKernel::kSimt || kernel == DecodeKernel::kTensorCore ||
         kernel == DecodeKernel::kTensorCoreWideMerge ||
         kernel == DecodeKernel::kTensorCoreFusedMerge;
}

cudaError_t paged_decode_attention(const PagedDecodeParams& params, const DecodePlan& plan,
                                   void* workspace, std::size_t workspace_bytes,
                                   cudaStream_t stream, DecodeKernel kernel,
                                   DecodeSplitCounters split_counters) {
  validate_cuda_decode(params, plan, workspace, workspace_bytes);
  if (kernel != DecodeKernel::kSimt && kernel != DecodeKernel::kTensorCore &&
      kernel != DecodeKernel::kTensorCoreWideMerge && kernel != DecodeKernel::kTensorCoreFp8 &&
      kernel != DecodeKernel::kTensorCoreFusedMerge &&
      kernel != DecodeKernel::kTensorCoreFp8Direct) {
    fail("unknown DecodeKernel " + std::to_string(static_cast<int>(kernel)));
  }
  switch (multi_query_refusal(params, kernel)) {
    case MultiQueryRefusal::kNotTensorCore:
      fail(std::string("q_len > 1 runs on the tensor-core kernels of a 16-bit cache "
                       "(kTensorCore, kTensorCoreWideMerge, kTensorCoreFusedMerge), not ") +
           (params.quant.fp8() ? "an FP8 cache" : "DecodeKernel::kSimt") +
           "; paged_extend_attention takes any number of new tokens");
    case MultiQueryRefusal::kTooManyRows:
      fail("q_len x group = " + std::to_string(params.q_len) + " x " +
           std::to_string(params.group_size()) + " exceeds " +
           std::to_string(kCudaDecodeMaxQueryRows) +
           " query rows per KV head; paged_extend_attention takes any number of new tokens");
    case MultiQueryRefusal::kNone:
      break;
  }
  if (params.q_len > 1) {
    if (plan.split_kv() && plan.kv_chunk_size < kCudaDecodeMaxQueryRows) {
      fail("q_len > 1 with split-KV needs kv_chunk_size >= " +
           std::to_string(kCudaDecodeMaxQueryRows) + " (every token's first key in chunk 0), got " +
           std::to_string(plan.kv_chunk_size));
    }
  }
  if (kernel == DecodeKernel::kTensorCoreFusedMerge && plan.split_kv() && !params.quant.fp8()) {
    // One counter per (sequence, KV head); validate_cuda_decode bounded both factors.
    const std::int64_t needed =
        static_cast<std::int64_t>(params.num_seqs) * params.layout.num_kv_heads;
    if (needed > 0) {  // an empty batch launches nothing
      if (split_counters.data == nullptr || split_counters.count < needed) {
        fail(
            "kTensorCoreFusedMerge with split-KV needs split counters for num_seqs x "
            "num_kv_heads = " +
            std::to_string(needed) + " (sequence, KV head) states, got " +
            (split_counters.data == nullptr ? std::string("none")
                                            : std::to_string(split_counters.count)));
      }
      if (reinterpret_cast<std::uintptr_t>(split_counters.data) % alignof(std::uint32_t) != 0) {
        fail("split counters must be 4-byte aligned");
      }
    }
  }
  if (params.num_seqs == 0) return cudaSuccess;
  if (params.quant.fp8()) {
    // kTensorCoreFp8 / kTensorCoreFp8Direct: kernels/decode_attention_tc_fp8.cu with the plan;
    // otherwise (or for a layout with 8-byte strides) kernels/fp8_attention.cu (no split-KV; the
    // plan is not used).
    if ((kernel == DecodeKernel::kTensorCoreFp8 || kernel == DecodeKernel::kTensorCoreFp8Direct) &&
        kernels::tc_fp8_decode_supported(params.layout)) {
      return kernels::tc_fp8_paged_decode(params, plan, workspace, stream,
                                          kernel == DecodeKernel::kTensorCoreFp8Direct);
    }
    return kernels::fp8_paged_decode(params, stream);
  }
  if (kernel == DecodeKernel::kTensorCoreFp8 || kernel == DecodeKernel::kTensorCoreFp8Direct) {
    kernel = DecodeKernel::kTensorCore;
  }
  if (kernel == DecodeKernel::kTensorCore || kernel == DecodeKernel::kTensorCoreWideMerge ||
      kernel == DecodeKernel::kTensorCoreFusedMerge) {
    const kernels::TcDecodeMerge merge =
        kernel == DecodeKernel::kTensorCoreWideMerge    ? kernels::TcDecodeMerge::kWide
        : kernel == DecodeKernel::kTensorCoreFusedMerge ? kernels::TcDecodeMerge::kFused
                                                        : kernels::TcDecodeMerge::kSerial;
    return kernels::tc_paged_decode(params, plan, workspace, stream, merge, split_counters.data);
  }
  const KVLayout& layout = params.layout;
  DecodeKernelParams kp{};
  kp.q = static_cast<const std::uint16_t*>(params.q);
  kp.q_stride_seq = params.q_seq_stride();
  kp.q_stride_head = params.q_head_stride();
  kp.k_cache = static_cast<const std::uint16_t*>(params.k_cache);
  kp.v_cache = static_cast<const std::uint16_t*>(params.v_cache);
  kp.stride_block = layout.stride_block;
  kp.stride_token = layout.stride_token;
  kp.stride_head = layout.stride_head;
  kp.num_blocks = layout.num_blocks;
  kp.block_size = layout.block_size;
  kp.block_shift = -1;
  for (int shift = 0; shift < 31; ++shift) {
    if ((1 << shift) == layout.block_size) kp.block_shift = shift;
  }
  kp.num_kv_heads = layout.num_kv_heads;
  kp.num_q_heads = params.num_q_heads;
  kp.group = params.group_size();
  kp.head_groups = (kp.group + kWarps - 1) / kWarps;
  kp.heads_per_warp = (kp.group + kp.head_groups - 1) / kp.head_groups;
  kp.token_splits = kWarps / kp.head_groups;
  kp.block_table = params.block_table;
  kp.max_blocks_per_seq = params.max_blocks_per_seq;
  kp.seq_lens = params.seq_lens;
  kp.out = static_cast<std::uint16_t*>(params.out);
  kp.out_stride_seq = params.out_seq_stride();
  kp.out_stride_head = params.out_head_stride();
  if (params.logits_soft_cap > 0.0f) {
    kp.q_scale = params.sm_scale / params.logits_soft_cap;
    kp.cap_log2 = params.logits_soft_cap * kLog2e;
  } else {
    kp.q_scale = params.sm_scale * kLog2e;
    kp.cap_log2 = 0.0f;
  }
  kp.window_size = params.window_size;
  kp.num_splits = plan.num_splits;
  kp.chunk = plan.split_kv() ? plan.kv_chunk_size : 0;
  if (plan.split_kv()) {
    const DecodeWorkspaceLayout ws =
        decode_workspace_layout(plan, params.num_seqs, params.num_q_heads, layout.head_dim);
    auto* base = static_cast<unsigned char*>(workspace);
    kp.partial_out = reinterpret_cast<float*>(base + ws.partial_out_offset);
    kp.partial_lse = reinterpret_cast<float*>(base + ws.partial_lse_offset);
  }
  return dispatch(params.dtype, layout.head_dim, [&]<typename Ops, int kHeadDim>() {
    return launch<Ops, kHeadDim>(kp, params.num_seqs, stream);
  });
}

cudaError_t decode_plan_options_for_current_device(KVDtype dtype, int head_dim,
                                                   DecodePlanOptions* options,
                                                   DecodeKernel kernel) {
  if (options == nullptr) fail("options is null");
  if (kernel == DecodeKernel::kTensorCore || kernel == DecodeKernel::kTensorCoreWideMerge ||
      kernel == DecodeKernel::kTensorCoreFp8 || kernel == DecodeKernel::kTensorCoreFusedMerge ||
      kernel == DecodeKernel::kTensorCoreFp8Direct) {
    if (!kernels::head_dim_compiled(head_dim)) fail(kernels::head_dim_error(head_dim));
    int device = 0;
    int sms = 0;
    int resident = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) {
      err = kernel == DecodeKernel::kTensorCoreFp8 || kernel == DecodeKernel::kTensorCoreFp8Direct
                ? kernels::tc_fp8_decode_ctas_per_sm(dtype, head_dim, &resident,
                                                     kernel == DecodeKernel::kTensorCoreFp8Direct)
                : kernels::tc_decode_ctas_per_sm(dtype, head_dim, &resident);
    }
    if (err != cudaSuccess) return err;
    options->num_sms = sms;
    // Waves of the kernel (decode_tc_layout.hpp): two for kTensorCore and the FP8 variants, one
    // for the wide and the fused merge.
    const bool one_wave = kernel == DecodeKernel::kTensorCoreWideMerge ||
                          kernel == DecodeKernel::kTensorCoreFusedMerge;
    options->ctas_per_sm =
        (one_wave ? detail::kTcWideMergePlanWaves : detail::kTcPlanWaves) * resident;
    options->min_chunk_tokens = detail::kTcMinChunkTokens;
    return cudaSuccess;
  }
  if (kernel != DecodeKernel::kSimt) {
    fail("unknown DecodeKernel " + std::to_string(static_cast<int>(kernel)));
  }
  return dispatch(dtype, head_dim, [&]<typename Ops, int kHeadDim>() {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    int sms = 0;
    if (err == cudaSuccess)
      err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess) err = set_smem_limit<Ops, kHeadDim>();
    int resident = 0;
    if (err == cudaSuccess) {
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &resident, paged_decode_kernel<Ops, kHeadDim>, kThreads,
          DecodeShape<kHeadDim>::kSmemBytes);
    }
    if (err != cudaSuccess) return err;
    options->num_sms = sms;
    options->ctas_per_sm = resident > 0 ? resident : 1;
    return cudaSuccess;
  });
}

}  // namespace pagedkv
