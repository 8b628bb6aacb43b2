// Paged extend attention: the new tokens of each sequence attend to its cached prefix and,
// causally, to themselves (see include/pagedkv/cuda/extend_attention.hpp for the contract).
//
// FlashAttention-2 structure on mma.sync.m16n8k16 (fp16/bf16 inputs, fp32 accumulators):
//   CTA   = 4 warps = one (query tile, sequence, KV head). The tile is 64 consecutive rows of the
//           sequence's packed (new token, head of the GQA group) index r = token x group + head,
//           so every query head of the group reuses the K/V tiles the CTA loads.
//   warp  = 16 of those rows: S = Q K^T for a K tile, online softmax in registers, O += P V with
//           P taken straight from the S accumulators (the m16n8 C layout of two adjacent n-tiles
//           is the A layout of one k16 step).
//   K/V   = tiles of kKeys keys in a 2-stage cp.async ring; each thread resolves its rows
//           through the block table, so a tile may start anywhere (it starts at the first key the
//           query tile can see) and span any number of blocks. Keys past the tile's last visible
//           position are zero-filled, never read from global memory.
//   smem  = rows of head_dim values as 16-byte chunks, chunk c of row r stored at c ^ (r % 8):
//           the eight row addresses of every ldmatrix hit eight different bank groups.
// Scores live in the log2 domain (scaled by sm_scale x log2(e)), so exp2f is the only
// transcendental; the log-sum-exp is converted back to natural log when stored.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "fp8_kernels.hpp"
#include "internal/cp_async.cuh"
#include "internal/extend_attention_tiles.hpp"
#include "internal/extend_fa2_fp8_layout.hpp"
#include "internal/extend_fa2_launch.hpp"
#include "internal/extend_fa2_layout.hpp"
#include "internal/extend_persistent_schedule.hpp"
#include "internal/extend_wgmma_launch.hpp"
#include "internal/head_dims.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/cuda/extend_attention.hpp"

namespace pagedkv {

namespace {

using kernels::cp_async_16;
using kernels::cp_async_commit;
using kernels::cp_async_wait;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kCudaExtendTileRows;  // query rows per CTA, 16 per warp
constexpr int kMaxGridYZ = 65535;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kRows == kWarps * 16, "one m16 row block per warp");

// ---- tensor-core and shared-memory primitives (sm_80+) ----

struct Bf16Mma {
  // c += a x b: a is 16x16 (row-major fragments), b is 16x8 (column-major), c is 16x8 fp32.
  __device__ static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  // Two values in one register, `lo` in the low half (the lower column of a fragment pair).
  __device__ static unsigned pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }
};

struct Fp16Mma {
  __device__ static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ static unsigned pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }
};

// Four 8x8 b16 matrices; lane l supplies the row address of matrix l / 8, row l % 8.
template <bool kTranspose>
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const uint4* row) {
  const auto addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTranspose) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  }
}

// ---- kernel ----

struct ExtendKernelParams {
  const std::uint16_t* q;  // [num_q_tokens, num_q_heads, head_dim]
  std::int64_t q_stride_token;
  std::int64_t q_stride_head;
  const std::uint16_t* k_cache;
  const std::uint16_t* v_cache;
  std::int64_t stride_block;
  std::int64_t stride_token;
  std::int64_t stride_head;
  std::int64_t num_blocks;
  std::int32_t block_size;
  std::int32_t block_shift;  // log2(block_size) when a power of two, else -1
  std::int32_t num_q_heads;
  std::int32_t group;               // query heads per KV head
  const std::int32_t* q_indptr;     // [num_seqs + 1]
  std::int32_t max_q_len;           // q_len_i is clamped to it
  const std::int32_t* block_table;  // [num_seqs, max_blocks_per_seq]
  std::int32_t max_blocks_per_seq;
  const std::int32_t* seq_lens;  // [num_seqs]
  std::uint16_t* out;            // [num_q_tokens, num_q_heads, head_dim]
  std::int64_t out_stride_token;
  std::int64_t out_stride_head;
  float* lse;         // [num_q_tokens, num_q_heads] or null
  float score_scale;  // sm_scale x log2(e); with a soft-cap sm_scale / cap
  float cap_log2;     // cap x log2(e); 0 = no soft-cap
  std::int32_t window_size;
};

template <int kHeadDim>
struct ExtendTile {
  static constexpr int kKeys = kHeadDim == 256 ? 32 : 64;  // keys per K/V tile
  static constexpr int kChunks = kHeadDim / 8;             // 16-byte chunks per row
  static constexpr int kQChunks = kRows * kChunks;
  static constexpr int kKVChunks = kKeys * kChunks;
  static constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of 128 copies covers
  static constexpr int kDimTiles = kHeadDim / 8;           // n8 tiles of the output
  static constexpr int kKeyTiles = kKeys / 8;              // n8 tiles of the scores
  // Q fragments stay in registers up to head_dim 128; at 256 they would spill, so they are
  // re-read from shared memory for every K tile.
  static constexpr bool kQInRegisters = kHeadDim <= 128;
  static constexpr std::size_t kSmemBytes =
      static_cast<std::size_t>(kQChunks + 4 * kKVChunks) * sizeof(uint4);
  static_assert(kChunks >= 8, "the swizzle permutes groups of 8 chunks");
  static_assert(kThreads % kChunks == 0 && kKeys % kRowsPerPass == 0 && kRows % kRowsPerPass == 0,
                "tiles are covered by whole passes");
};

template <int kChunks>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * kChunks + (chunk ^ (row & 7));
}

// Element offset of key `t` of the sequence (at dim 0 of kv head 0) or false when its block id
// is outside the pool.
__device__ __forceinline__ bool key_offset(const ExtendKernelParams& p, const std::int32_t* row,
                                           int t, std::int64_t* offset) {
  const int block_index = p.block_shift >= 0 ? t >> p.block_shift : t / p.block_size;
  const int in_block = t - block_index * p.block_size;
  const std::int64_t block = __ldg(row + block_index);
  *offset = block * p.stride_block + in_block * p.stride_token;
  return block >= 0 && block < p.num_blocks;
}

template <typename Mma, int kHeadDim>
__global__ void __launch_bounds__(kThreads) paged_extend_kernel(const ExtendKernelParams p) {
  using T = ExtendTile<kHeadDim>;
  constexpr int kC = T::kChunks;
  constexpr int kKeys = T::kKeys;
  extern __shared__ uint4 smem[];
  uint4* q_tile = smem;                         // [kRows][kC], swizzled
  uint4* k_tiles = smem + T::kQChunks;          // [2][kKeys][kC], swizzled
  uint4* v_tiles = k_tiles + 2 * T::kKVChunks;  // [2][kKeys][kC], swizzled

  // ---- what this CTA covers ----
  const int kv_head = static_cast<int>(blockIdx.x);
  const int seq = static_cast<int>(blockIdx.y);
  const int q_begin = __ldg(p.q_indptr + seq);
  const std::int64_t raw_q_len = static_cast<std::int64_t>(__ldg(p.q_indptr + seq + 1)) - q_begin;
  const int q_len =
      static_cast<int>(raw_q_len < 0 ? 0 : (raw_q_len > p.max_q_len ? p.max_q_len : raw_q_len));
  const std::int64_t capacity = static_cast<std::int64_t>(p.max_blocks_per_seq) * p.block_size;
  const std::int64_t raw_kv_len = __ldg(p.seq_lens + seq);
  const int kv_len =
      static_cast<int>(raw_kv_len < 0 ? 0 : (raw_kv_len > capacity ? capacity : raw_kv_len));
  const int prefix = kv_len - q_len;  // < 0 only for inconsistent data: those rows see nothing
  const int num_tiles = detail::extend_num_tiles(q_len, p.group, kRows);
  if (static_cast<int>(blockIdx.z) >= num_tiles) return;  // uniform over the CTA
  // blockIdx.z = 0 takes the last tile, whose tokens see the most keys: heavy work first.
  const detail::ExtendTileGeometry tile = detail::extend_tile_geometry(
      q_len, prefix, p.group, p.window_size, num_tiles - 1 - static_cast<int>(blockIdx.z), kRows);
  const int row0 = tile.row0;
  const int kv_begin = tile.kv_begin;
  const int kv_end = tile.kv_end;
  const int num_kv_tiles = (kv_end - kv_begin + kKeys - 1) / kKeys;

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int quad_row = lane / 4;  // fragment row (and n column) of this lane
  const int quad_col = lane % 4;  // fragment column pair of this lane

  // ---- loads: thread tid copies chunk tid % kC of rows tid / kC + i x kRowsPerPass ----
  const int load_chunk = tid % kC;
  const int load_row = tid / kC;
#pragma unroll
  for (int i = 0; i < kRows / T::kRowsPerPass; ++i) {
    const int r = load_row + i * T::kRowsPerPass;
    const int packed = row0 + r;
    const int token = packed / p.group;
    const bool fill = token < q_len;
    const std::int64_t at =
        (static_cast<std::int64_t>(q_begin) + token) * p.q_stride_token +
        static_cast<std::int64_t>(kv_head * p.group + packed % p.group) * p.q_stride_head +
        load_chunk * 8;
    cp_async_16(q_tile + swizzled<kC>(r, load_chunk), fill ? p.q + at : p.q, fill);
  }
  cp_async_commit();

  const std::int32_t* table_row =
      p.block_table + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;
  const std::int64_t head_offset =
      static_cast<std::int64_t>(kv_head) * p.stride_head + load_chunk * 8;
  const auto load_kv = [&](int kv_tile, int stage) {
    const int key0 = kv_begin + kv_tile * kKeys;
#pragma unroll
    for (int i = 0; i < kKeys / T::kRowsPerPass; ++i) {
      const int r = load_row + i * T::kRowsPerPass;
      std::int64_t offset = 0;
      const bool fill = key0 + r < kv_end && key_offset(p, table_row, key0 + r, &offset);
      offset += head_offset;
      const int at = stage * T::kKVChunks + swizzled<kC>(r, load_chunk);
      cp_async_16(k_tiles + at, fill ? p.k_cache + offset : p.k_cache, fill);
      cp_async_16(v_tiles + at, fill ? p.v_cache + offset : p.v_cache, fill);
    }
  };
  if (num_kv_tiles > 0) load_kv(0, 0);
  cp_async_commit();

  // ---- per-lane row state: rows quad_row and quad_row + 8 of the warp's 16 ----
  int row_pos[2];  // key positions <= row_pos are visible; -1 for padding rows (past q_len)
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int token = (row0 + warp * 16 + quad_row + half * 8) / p.group;
    row_pos[half] = token < q_len ? prefix + token : -1;
  }
  float o[T::kDimTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY};  // running maxima (log2 domain)
  float l[2] = {0.0f, 0.0f};            // running sums of this lane's columns

  // Q fragments: m16 x k16 blocks of the warp's rows, for every k16 step of head_dim.
  unsigned q_frag[T::kQInRegisters ? kHeadDim / 16 : 1][4];
  const int q_row = warp * 16 + lane % 16;  // the row this lane addresses for ldmatrix
  if constexpr (T::kQInRegisters) {
    cp_async_wait<1>();  // the Q group is complete (the K/V group may still be in flight)
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      ldmatrix_x4<false>(q_frag[kk], q_tile + swizzled<kC>(q_row, kk * 2 + lane / 16));
    }
  }

  for (int j = 0; j < num_kv_tiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();  // tile j visible to all; every warp is done with tile j - 1's stage
    if (j + 1 < num_kv_tiles) load_kv(j + 1, (j + 1) & 1);
    cp_async_commit();
    const uint4* kt = k_tiles + (j & 1) * T::kKVChunks;
    const uint4* vt = v_tiles + (j & 1) * T::kKVChunks;
    const int key0 = kv_begin + j * kKeys;

    // S = Q K^T: ldmatrix of K rows (keys) gives the col-major B fragments directly.
    float s[T::kKeyTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      unsigned a[4];
      if constexpr (T::kQInRegisters) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = q_frag[kk][i];
      } else {
        ldmatrix_x4<false>(a, q_tile + swizzled<kC>(q_row, kk * 2 + lane / 16));
      }
#pragma unroll
      for (int nn = 0; nn < kKeys / 16; ++nn) {
        unsigned b[4];  // keys nn*16 + 0..7 (b[0], b[1]) and + 8..15 (b[2], b[3])
        ldmatrix_x4<false>(
            b, kt + swizzled<kC>(nn * 16 + (lane / 16) * 8 + lane % 8, kk * 2 + (lane / 8) % 2));
        Mma::mma(s[2 * nn], a, b[0], b[1]);
        Mma::mma(s[2 * nn + 1], a, b[2], b[3]);
      }
    }

    // Scale, and mask only tiles that cross the diagonal, the window edge or the end.
    const bool need_mask = detail::extend_tile_needs_mask(tile, key0, kKeys, p.window_size);
#pragma unroll
    for (int n = 0; n < T::kKeyTiles; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float x = p.cap_log2 > 0.0f ? p.cap_log2 * tanhf(s[n][c] * p.score_scale)
                                    : s[n][c] * p.score_scale;
        if (need_mask) {
          const int key = key0 + n * 8 + quad_col * 2 + (c & 1);
          if (!detail::extend_key_visible(row_pos[c / 2], key, p.window_size)) x = -INFINITY;
        }
#ifdef PAGEDKV_TEST_DROP_KEY
        // Test-only build (tests/cuda_broken_kernel_test.cpp): one key position left out.
        if (key0 + n * 8 + quad_col * 2 + (c & 1) == PAGEDKV_TEST_DROP_KEY) x = -INFINITY;
#endif
        s[n][c] = x;
      }
    }

    // Online softmax per row: a row's 64 columns live in the 4 lanes of its quad.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < T::kKeyTiles; ++n) {
        tile_max = fmaxf(tile_max, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(m[half], tile_max);
      // Until a visible key is seen m stays -inf; subtracting 0 then keeps exp2f(-inf) = 0.
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = exp2f(m[half] - m_use);
      m[half] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < T::kKeyTiles; ++n) {
        s[n][2 * half] = exp2f(s[n][2 * half] - m_use);
        s[n][2 * half + 1] = exp2f(s[n][2 * half + 1] - m_use);
        sum += s[n][2 * half] + s[n][2 * half + 1];
      }
      l[half] = l[half] * alpha + sum;
#pragma unroll
      for (int d = 0; d < T::kDimTiles; ++d) {
        o[d][2 * half] *= alpha;
        o[d][2 * half + 1] *= alpha;
      }
    }

    // O += P V: two adjacent n8 score tiles form one k16 A fragment; V needs the transpose.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const unsigned a[4] = {Mma::pack(s[2 * kk][0], s[2 * kk][1]),
                             Mma::pack(s[2 * kk][2], s[2 * kk][3]),
                             Mma::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             Mma::pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dd = 0; dd < kHeadDim / 16; ++dd) {
        unsigned b[4];  // dims dd*16 + 0..7 (b[0], b[1]) and + 8..15 (b[2], b[3])
        ldmatrix_x4<true>(b, vt + swizzled<kC>(kk * 16 + lane % 16, dd * 2 + lane / 16));
        Mma::mma(o[2 * dd], a, b[0], b[1]);
        Mma::mma(o[2 * dd + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();  // nothing may be in flight when the CTA exits

  // ---- epilogue: normalize and store this lane's two rows ----
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
    const int packed = row0 + warp * 16 + quad_row + half * 8;
    const int token = packed / p.group;
    if (token >= q_len) continue;
    const int head = kv_head * p.group + packed % p.group;
    const std::int64_t q_row_index = static_cast<std::int64_t>(q_begin) + token;
    const float inv = l[half] > 0.0f ? 1.0f / l[half] : 0.0f;
    std::uint16_t* dst =
        p.out + q_row_index * p.out_stride_token + head * p.out_stride_head + quad_col * 2;
#pragma unroll
    for (int d = 0; d < T::kDimTiles; ++d) {
      *reinterpret_cast<unsigned*>(dst + d * 8) =
          Mma::pack(o[d][2 * half] * inv, o[d][2 * half + 1] * inv);
    }
    if (p.lse != nullptr && quad_col == 0) {
      p.lse[q_row_index * p.num_q_heads + head] =
          l[half] > 0.0f ? (m[half] + log2f(l[half])) * kLn2 : -INFINITY;
    }
  }
}

// ---- host side ----

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "paged_extend_attention (CUDA): " + message);
}

bool aligned_to(const void* ptr, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(ptr) % bytes == 0;
}

using KernelFn = void (*)(ExtendKernelParams);

struct KernelChoice {
  KernelFn kernel = nullptr;
  std::size_t smem_bytes = 0;
};

template <int kHeadDim>
KernelChoice choose(KVDtype dtype) {
  return {dtype == KVDtype::kBFloat16 ? paged_extend_kernel<Bf16Mma, kHeadDim>
                                      : paged_extend_kernel<Fp16Mma, kHeadDim>,
          ExtendTile<kHeadDim>::kSmemBytes};
}

KernelChoice choose(KVDtype dtype, int head_dim) {
  switch (head_dim) {
#if PAGEDKV_CUDA_HEAD_DIM_64
    case 64:
      return choose<64>(dtype);
#endif
#if PAGEDKV_CUDA_HEAD_DIM_128
    case 128:
      return choose<128>(dtype);
#endif
#if PAGEDKV_CUDA_HEAD_DIM_256
    case 256:
      return choose<256>(dtype);
#endif
    default:
      fail(kernels::head_dim_error(head_dim));
  }
}

// Query tiles of the kFa2 variant's launch (its tile rows: head_dim, max_q_len x group).
std::int64_t fa2_query_tiles(const PagedExtendParams& params) {
  const int group = params.group_size();
  const int rows =
      detail::fa2_tile_rows(params.layout.head_dim, detail::fa2_warps(params.max_q_len, group));
  return (static_cast<std::int64_t>(params.max_q_len) * group + rows - 1) / rows;
}

// The sm_90a variants (each falls back to kFa2 where its kernel does not run).
bool wgmma_variant(ExtendKernel kernel) {
  return kernel == ExtendKernel::kWgmma || kernel == ExtendKernel::kWgmmaPipelined ||
         kernel == ExtendKernel::kWgmmaWarpSpecialized ||
         kernel == ExtendKernel::kWgmmaWarpSpecializedPingPong ||
         kernel == ExtendKernel::kWgmmaWarpSpecializedPersistent;
}

// The warp-specialized ones (kernels/extend_attention_wgmma_ws.cu).
bool warp_specialized(ExtendKernel kernel) {
  return kernel == ExtendKernel::kWgmmaWarpSpecialized ||
         kernel == ExtendKernel::kWgmmaWarpSpecializedPingPong ||
         kernel == ExtendKernel::kWgmmaWarpSpecializedPersistent;
}

// kFa2's kernel: kFa2 itself and kFa2LeanSoftmax (the same tiles, plan and workspace).
bool fa2_kernel(ExtendKernel kernel) {
  return kernel == ExtendKernel::kFa2 || kernel == ExtendKernel::kFa2LeanSoftmax;
}

// The variants that take an ExtendSplitPlan: kFa2, kFa2LeanSoftmax, kFa2Fp8 and the kWgmma
// variants.
bool splits_over_keys(ExtendKernel kernel) {
  return fa2_kernel(kernel) || kernel == ExtendKernel::kFa2Fp8 || wgmma_variant(kernel);
}

// Whether kFa2LeanSoftmax's softmax runs: a 16-bit cache and a soft-cap or a positive sm_scale
// (its row maximum is taken on the unscaled scores; a zero or negative scale, finite and so
// valid, runs kFa2's softmax, which scales each score first).
bool lean_softmax_runs(const PagedExtendParams& params) noexcept {
  return !params.quant.fp8() && (params.logits_soft_cap > 0.0f || params.sm_scale > 0.0f);
}

// Whether kFa2Fp8's FP8 tensor-core kernel runs for these params (an FP8 cache in a layout of
// 16-byte strides).
bool tc_fp8_extend_runs(const PagedExtendParams& params, ExtendKernel kernel) {
  return kernel == ExtendKernel::kFa2Fp8 && params.quant.fp8() &&
         kernels::tc_fp8_extend_supported(params.layout);
}

// Query tiles of kFa2Fp8's FP8 kernel (kFa2's 4-warp tiles).
std::int64_t fa2_fp8_query_tiles(const PagedExtendParams& params) {
  const int rows = detail::fa2_tile_rows(params.layout.head_dim, detail::kFa2Fp8Warps);
  return (static_cast<std::int64_t>(params.max_q_len) * params.group_size() + rows - 1) / rows;
}

// Query tiles of the kWgmma kernels' launch (128 rows).
std::int64_t wgmma_query_tiles(const PagedExtendParams& params) {
  return (static_cast<std::int64_t>(params.max_q_len) * params.group_size() +
          kernels::kWgmmaExtendRows - 1) /
         kernels::kWgmmaExtendRows;
}

// kWgmmaWarpSpecializedPersistent's CTAs: one per resident slot, whatever the batch (and
// whichever kernel runs), at most kCudaExtendMaxPersistentCtas.
std::int32_t persistent_ctas_for(int num_sms, int ctas_per_sm) {
  const std::int64_t slots = static_cast<std::int64_t>(num_sms) * ctas_per_sm;
  return static_cast<std::int32_t>(
      slots < kCudaExtendMaxPersistentCtas ? slots : kCudaExtendMaxPersistentCtas);
}

std::int64_t num_query_tiles(const PagedExtendParams& params) {
  return (static_cast<std::int64_t>(params.max_q_len) * params.group_size() + kRows - 1) / kRows;
}

// The grid limits: at most kMaxGridYZ sequences and query tiles (so that query tiles x sequences
// x KV heads stays within 64 bits). Requires a positive group size.
void check_grid(const PagedExtendParams& params) {
  if (params.num_seqs > kMaxGridYZ) {
    fail("at most " + std::to_string(kMaxGridYZ) + " sequences per launch, got " +
         std::to_string(params.num_seqs));
  }
  if (num_query_tiles(params) > kMaxGridYZ) {
    fail("max_q_len x group = " +
         std::to_string(static_cast<std::int64_t>(params.max_q_len) * params.group_size()) +
         " query rows exceed " + std::to_string(kMaxGridYZ) + " tiles of " + std::to_string(kRows));
  }
}

}  // namespace

void validate_cuda_extend(const PagedExtendParams& params) {
  validate(params);
  (void)choose(params.dtype, params.layout.head_dim);  // throws for other head_dims
  check_grid(params);
  if (params.num_seqs == 0) return;
  if (params.out == nullptr) fail("out is null");
  if (!aligned_to(params.q, 16) || !aligned_to(params.k_cache, 16) ||
      !aligned_to(params.v_cache, 16) || !aligned_to(params.out, 16)) {
    fail("q, k_cache, v_cache and out must be 16-byte aligned");
  }
  if (!aligned_to(params.lse, alignof(float))) fail("lse must be 4-byte aligned");
  for (const std::int64_t stride : {params.q_token_stride(), params.q_head_stride(),
                                    params.out_token_stride(), params.out_head_stride()}) {
    if (stride % 8 != 0) fail("q and out strides must be multiples of 8 elements");
  }
}

bool extend_kernel_runs(const PagedExtendParams& params, ExtendKernel kernel) noexcept {
  // kMma16 and kFa2 cover every 16-bit shape validate_cuda_extend accepts; FP8 has its own kernel.
  if (wgmma_variant(kernel)) {
#ifdef PAGEDKV_HAS_SM90A
    return kernels::wgmma_extend_runs(params);
#else
    return false;
#endif
  }
  if (kernel == ExtendKernel::kFa2Fp8) return tc_fp8_extend_runs(params, kernel);
  if (kernel == ExtendKernel::kFa2LeanSoftmax) return lean_softmax_runs(params);
  return !params.quant.fp8() && (kernel == ExtendKernel::kMma16 || kernel == ExtendKernel::kFa2);
}

ExtendSplitPlan plan_extend_split(const PagedExtendParams& params, ExtendKernel kernel, int num_sms,
                                  int ctas_per_sm) {
  if (num_sms < 1 || ctas_per_sm < 1) {
    fail("plan_extend_split: num_sms and ctas_per_sm must be >= 1");
  }
  // The query tiles below depend on head_dim: one the kernels do not take gets no plan.
  (void)choose(params.dtype, params.layout.head_dim);
  // The shape the plan reads, as the launch checks it (the rest of the params is the launch's):
  // a group size to divide by, and the grid limits, which keep tiles x sequences x KV heads
  // within 64 bits.
  if (params.num_seqs < 0 || params.max_q_len < 0 || params.layout.num_kv_heads <= 0 ||
      params.num_q_heads <= 0 || params.num_q_heads % params.layout.num_kv_heads != 0) {
    fail("plan_extend_split: bad shape (num_seqs " + std::to_string(params.num_seqs) +
         ", max_q_len " + std::to_string(params.max_q_len) + ", num_q_heads " +
         std::to_string(params.num_q_heads) + ", num_kv_heads " +
         std::to_string(params.layout.num_kv_heads) + ")");
  }
  check_grid(params);
  ExtendSplitPlan plan;
  if (kernel == ExtendKernel::kWgmmaWarpSpecializedPersistent) {
    plan.persistent_ctas = persistent_ctas_for(num_sms, ctas_per_sm);
  }
  if (!splits_over_keys(kernel) || params.num_seqs == 0 || params.max_q_len == 0) return plan;
  // An FP8 cache that only the CUDA-core FP8 kernel takes: it ignores the plan.
  if (params.quant.fp8() && !tc_fp8_extend_runs(params, kernel)) return plan;
  // kFa2Fp8 on a 16-bit cache runs kFa2.
  const std::int64_t tiles = tc_fp8_extend_runs(params, kernel) ? fa2_fp8_query_tiles(params)
                             : fa2_kernel(kernel) || kernel == ExtendKernel::kFa2Fp8
                                 ? fa2_query_tiles(params)
                                 : wgmma_query_tiles(params);
  const std::int64_t ctas = tiles * params.num_seqs * params.layout.num_kv_heads;
  // The grid limit as paged_extend_attention checks it, for every variant: kFa2's query tiles
  // (the kWgmma variants' fallback launches those; never fewer than kWgmma's 128-row tiles), so
  // the plan is accepted whichever kernel runs.
  plan.num_splits = detail::fa2_num_splits(
      ctas, fa2_query_tiles(params),
      static_cast<std::int64_t>(num_sms) * ctas_per_sm * detail::kFa2PlanWaves,
      kCudaExtendMaxSplits);
  return plan;
}

std::size_t extend_workspace_bytes(const PagedExtendParams& params, const ExtendSplitPlan& plan) {
  if (plan.num_splits > 1) {
    // num_seqs x max_q_len x num_q_heads x num_splits states of head_dim + 1 floats: four 31-bit
    // factors (the grid limits bound num_seqs and max_q_len, not num_q_heads) can exceed 64 bits,
    // and a size that wrapped would pass the launch's workspace check.
    const std::int32_t head_dim = params.layout.head_dim;
    if (params.num_seqs < 0 || params.max_q_len < 0 || params.num_q_heads < 0 || head_dim < 0) {
      fail("extend_workspace_bytes: bad shape (num_seqs " + std::to_string(params.num_seqs) +
           ", max_q_len " + std::to_string(params.max_q_len) + ", num_q_heads " +
           std::to_string(params.num_q_heads) + ", head_dim " + std::to_string(head_dim) + ")");
    }
    std::size_t states = static_cast<std::size_t>(params.num_seqs);
    bool overflow = false;
    for (const std::int32_t factor : {params.max_q_len, params.num_q_heads, plan.num_splits}) {
      overflow |= __builtin_mul_overflow(states, static_cast<std::size_t>(factor), &states);
    }
    // fa2_workspace_bytes sums in int64: room for that, the lse's 16-byte round-up and the
    // persistent counter.
    constexpr auto kMaxBytes = static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max());
    if (overflow ||
        states > (kMaxBytes - 64) / sizeof(float) / (static_cast<std::size_t>(head_dim) + 1)) {
      fail("extend_workspace_bytes: the workspace size overflows (num_seqs " +
           std::to_string(params.num_seqs) + " x max_q_len " + std::to_string(params.max_q_len) +
           " x num_q_heads " + std::to_string(params.num_q_heads) + " x num_splits " +
           std::to_string(plan.num_splits) + " states of head_dim " + std::to_string(head_dim) +
           " + 1 floats)");
    }
  }
  const std::size_t split =
      detail::fa2_workspace_bytes(params.num_seqs, params.max_q_len, params.num_q_heads,
                                  params.layout.head_dim, plan.num_splits);
  // The persistent kernel's counter, where there is something to launch (an empty batch: nothing).
  const bool counter = plan.persistent_ctas > 0 && params.num_seqs > 0 && params.max_q_len > 0;
  return counter ? split + detail::kPersistentCounterBytes : split;
}

cudaError_t extend_split_plan_for_current_device(const PagedExtendParams& params,
                                                 ExtendKernel kernel, ExtendSplitPlan* plan) {
  validate_cuda_extend(params);
  *plan = ExtendSplitPlan{};
  if (!splits_over_keys(kernel)) return cudaSuccess;
  // kWgmmaWarpSpecializedPersistent's plan always names its CTAs (>= 1), so that its launch's
  // checks pass whichever kernel runs.
  const bool persistent = kernel == ExtendKernel::kWgmmaWarpSpecializedPersistent;
  // An FP8 cache: no split (the CUDA-core FP8 kernel ignores the plan) but for kFa2Fp8's kernel.
  if (params.quant.fp8() && !tc_fp8_extend_runs(params, kernel)) {
    if (persistent) plan->persistent_ctas = 1;  // its kernel does not run: any count does
    return cudaSuccess;
  }
  // A kWgmma variant where its kernel does not run, kFa2Fp8 on a 16-bit cache or kFa2LeanSoftmax
  // where its softmax does not: the plan of the fallback, kFa2.
  if (kernel != ExtendKernel::kFa2 && !extend_kernel_runs(params, kernel)) {
    kernel = ExtendKernel::kFa2;
  }
  int device = 0;
  int sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  int resident = 1;
  if (err == cudaSuccess) {
    if (kernel == ExtendKernel::kFa2Fp8) {
      err = kernels::tc_fp8_extend_ctas_per_sm(params.dtype, params.layout.head_dim, &resident);
    } else
#ifdef PAGEDKV_HAS_SM90A
        if (warp_specialized(kernel)) {
      err = kernels::wgmma_ws_extend_ctas_per_sm(persistent, &resident);
    } else if (!fa2_kernel(kernel)) {
      err = kernels::wgmma_extend_ctas_per_sm(kernel == ExtendKernel::kWgmmaPipelined, &resident);
    } else
#endif
    {
      err =
          kernels::fa2_extend_ctas_per_sm(params.dtype, params.layout.head_dim,
                                          detail::fa2_warps(params.max_q_len, params.group_size()),
                                          kernel == ExtendKernel::kFa2LeanSoftmax, &resident);
    }
  }
  if (err != cudaSuccess) return err;
  *plan = plan_extend_split(params, kernel, sms, resident);
  if (persistent && plan->persistent_ctas == 0) {
    // Fallen back to kFa2: its plan, and a count the launch's checks accept.
    plan->persistent_ctas = persistent_ctas_for(sms, 1);
  }
  return cudaSuccess;
}

namespace {
cudaError_t mma16_paged_extend(const PagedExtendParams& params, cudaStream_t stream);
}  // namespace

cudaError_t paged_extend_attention(const PagedExtendParams& params, cudaStream_t stream,
                                   ExtendKernel kernel, const ExtendSplitPlan& plan,
                                   void* workspace, std::size_t workspace_bytes) {
  if (kernel == ExtendKernel::kMma16) return mma16_paged_extend(params, stream);
  if (!splits_over_keys(kernel)) {
    fail("unknown ExtendKernel " + std::to_string(static_cast<int>(kernel)));
  }
  // kFa2, kFa2LeanSoftmax, kFa2Fp8 and the kWgmma variants (whose fallback is kFa2 with the same
  // plan): the same
  // checks, so a plan is valid for all (kFa2's query tiles are never fewer than kWgmma's or
  // kFa2Fp8's).
  validate_cuda_extend(params);
  if (plan.num_splits < 1 || plan.num_splits > kCudaExtendMaxSplits) {
    fail("plan.num_splits must be in [1, " + std::to_string(kCudaExtendMaxSplits) + "], got " +
         std::to_string(plan.num_splits));
  }
  if (fa2_query_tiles(params) * plan.num_splits > kMaxGridYZ) {
    fail("query tiles x num_splits = " + std::to_string(fa2_query_tiles(params) * plan.num_splits) +
         " exceed " + std::to_string(kMaxGridYZ));
  }
  const bool persistent = kernel == ExtendKernel::kWgmmaWarpSpecializedPersistent;
  if (plan.persistent_ctas < 0 || plan.persistent_ctas > kCudaExtendMaxPersistentCtas ||
      (persistent && plan.persistent_ctas == 0)) {
    fail("plan.persistent_ctas must be in [" + std::string(persistent ? "1" : "0") + ", " +
         std::to_string(kCudaExtendMaxPersistentCtas) + "]" +
         (persistent ? " for kWgmmaWarpSpecializedPersistent (take the plan from "
                       "plan_extend_split or extend_split_plan_for_current_device)"
                     : "") +
         ", got " + std::to_string(plan.persistent_ctas));
  }
  // An FP8 cache needs no workspace (the CUDA-core FP8 kernel ignores the plan) but for kFa2Fp8's
  // kernel.
  const bool tc_fp8 = tc_fp8_extend_runs(params, kernel);
  const std::size_t needed =
      params.quant.fp8() && !tc_fp8 ? 0 : extend_workspace_bytes(params, plan);
  if (needed > 0) {  // a split of a non-empty batch, or a persistent plan's counter
    if (workspace == nullptr || workspace_bytes < needed) {
      fail(std::string(plan.persistent_ctas > 0 ? "the persistent plan" : "the split plan") +
           " needs a workspace of " + std::to_string(needed) + " bytes, got " +
           std::to_string(workspace == nullptr ? 0 : workspace_bytes));
    }
    if (!aligned_to(workspace, 16)) fail("workspace must be 16-byte aligned");
  }
  if (params.quant.fp8() && !tc_fp8) return kernels::fp8_paged_extend(params, stream);
  if (params.num_seqs == 0 || params.max_q_len == 0) return cudaSuccess;
  if (tc_fp8) return kernels::tc_fp8_paged_extend(params, plan.num_splits, workspace, stream);
#ifdef PAGEDKV_HAS_SM90A
  if (wgmma_variant(kernel) && kernels::wgmma_extend_runs(params)) {
    if (warp_specialized(kernel)) {
      const kernels::WsSchedule schedule = persistent ? kernels::WsSchedule::kPingPongPersistent
                                           : kernel == ExtendKernel::kWgmmaWarpSpecializedPingPong
                                               ? kernels::WsSchedule::kPingPong
                                               : kernels::WsSchedule::kPlain;
      return kernels::wgmma_ws_paged_extend(params, schedule, plan.num_splits, workspace,
                                            plan.persistent_ctas, stream);
    }
    return kernels::wgmma_paged_extend(params, kernel == ExtendKernel::kWgmmaPipelined,
                                       plan.num_splits, workspace, stream);
  }
#endif
  return kernels::fa2_paged_extend(
      params, plan.num_splits, workspace, stream,
      kernel == ExtendKernel::kFa2LeanSoftmax && lean_softmax_runs(params));
}

cudaError_t paged_extend_attention(const PagedExtendParams& params, cudaStream_t stream) {
  return paged_extend_attention(params, stream, kDefaultExtendKernel);
}

namespace {

// ExtendKernel::kMma16 (kernels/extend_attention.cu's kernel above).
cudaError_t mma16_paged_extend(const PagedExtendParams& params, cudaStream_t stream) {
  validate_cuda_extend(params);
  // An FP8 cache: kernels/fp8_attention.cu.
  if (params.quant.fp8()) return kernels::fp8_paged_extend(params, stream);
  const KernelChoice choice = choose(params.dtype, params.layout.head_dim);
  // Set on every launch: cheap, per device, and allowed while a graph is being captured.
  cudaError_t err = cudaFuncSetAttribute(choice.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(choice.smem_bytes));
  const std::int64_t tiles = num_query_tiles(params);
  if (err != cudaSuccess || params.num_seqs == 0 || tiles == 0) return err;

  const KVLayout& layout = params.layout;
  ExtendKernelParams kp{};
  kp.q = static_cast<const std::uint16_t*>(params.q);
  kp.q_stride_token = params.q_token_stride();
  kp.q_stride_head = params.q_head_stride();
  kp.k_cache = static_cast<const std::uint16_t*>(params.k_cache);
  kp.v_cache = static_cast<const std::uint16_t*>(params.v_cache);
  kp.stride_block = layout.stride_block;
  kp.stride_token = layout.stride_token;
  kp.stride_head = layout.stride_head;
  kp.num_blocks = layout.num_blocks;
  kp.block_size = layout.block_size;
  kp.block_shift = (layout.block_size & (layout.block_size - 1)) == 0
                       ? __builtin_ctz(static_cast<unsigned>(layout.block_size))
                       : -1;
  kp.num_q_heads = params.num_q_heads;
  kp.group = params.group_size();
  kp.q_indptr = params.q_indptr;
  kp.max_q_len = params.max_q_len;
  kp.block_table = params.block_table;
  kp.max_blocks_per_seq = params.max_blocks_per_seq;
  kp.seq_lens = params.seq_lens;
  kp.out = static_cast<std::uint16_t*>(params.out);
  kp.out_stride_token = params.out_token_stride();
  kp.out_stride_head = params.out_head_stride();
  kp.lse = params.lse;
  if (params.logits_soft_cap > 0.0f) {
    kp.score_scale = params.sm_scale / params.logits_soft_cap;
    kp.cap_log2 = params.logits_soft_cap * kLog2e;
  } else {
    kp.score_scale = params.sm_scale * kLog2e;
    kp.cap_log2 = 0.0f;
  }
  kp.window_size = params.window_size;

  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(layout.num_kv_heads),
                        static_cast<unsigned>(params.num_seqs), static_cast<unsigned>(tiles));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = choice.smem_bytes;
  config.stream = stream;
  return cudaLaunchKernelEx(&config, choice.kernel, kp);
}

}  // namespace

}  // namespace pagedkv
