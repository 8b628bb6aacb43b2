// kernels/internal/mma_sync.cuh: the warp-level tensor-core primitives the attention kernels
// share (sm_80+; kernels/decode_attention_tc.cu, kernels/extend_attention_fa2.cu): packing two
// fp32 values into one 16-bit pair, mma.sync m16n8k16 with fp32 accumulators, and ldmatrix x4
// (plain and transposed) from shared memory. Internal to pagedkv::cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace pagedkv::kernels {

// fp16 (kBf16 false) or bf16 operands.
template <bool kBf16>
struct MmaOps {
  // Two fp32 values rounded to nearest into one 32-bit register (lo in the low half).
  __device__ static unsigned pack2(float lo, float hi) {
    if constexpr (kBf16) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
      return *reinterpret_cast<const unsigned*>(&h);
    } else {
      const __half2 h = __floats2half2_rn(lo, hi);
      return *reinterpret_cast<const unsigned*>(&h);
    }
  }
  // d += a x b (m16n8k16, row.col, fp32 accumulators).
  __device__ static void mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    if constexpr (kBf16) {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
  }
};

// Four 8x8 b16 matrices from shared memory (smem_addr: a shared-space address, per lane).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr)
               : "memory");
}
// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr)
               : "memory");
}

}  // namespace pagedkv::kernels
