// kernels/internal/wgmma.cuh: Hopper's warpgroup MMA as pagedkv's sm_90a kernels issue it
// (kernels/wgmma_probe.cu, kernels/extend_attention_wgmma.cu): the fences and group
// commit/wait of wgmma.mma_async, the shared-memory proxy fence, a register fence for
// accumulators, and the MMA shapes used, for fp16 or bf16 operands (kBf16) with fp32
// accumulators (descriptors and fragment maps in wgmma_layout.hpp). For sm_90a translation units
// only: the instructions exist nowhere else. Internal to pagedkv::cuda.
#pragma once

#include <cstdint>

#include "internal/fast_exp2.cuh"

// The accumulator operand lists of the asm statements below (N = 64: 32 registers; N = 128: 64).
#define PAGEDKV_WGMMA_D32                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
  "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define PAGEDKV_WGMMA_D64                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
  "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "  \
  "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "  \
  "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define PAGEDKV_WGMMA_OUT32                                                                       \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define PAGEDKV_WGMMA_OUT64                                                                       \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

namespace pagedkv::kernels::wgmma {

__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Waits until at most the kPending most recent of this warpgroup's committed groups are pending and
// every earlier one is complete (PTX ISA, wgmma.wait_group: "wait until only N or fewer of the
// most recent wgmma-groups are pending and all the prior wgmma-groups committed by the executing
// threads are complete"; wgmma.commit_group makes one group per warpgroup): wait<1> after
// committing an S GEMM and then a PV GEMM waits for the S GEMM, whatever order they finish in.
template <int kPending>
__device__ __forceinline__ void wait() {
  static_assert(kPending >= 0, "a count of pending groups");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// 2^x with a denormal result flushed to zero: one MUFU.EX2 (internal/fast_exp2.cuh).
using kernels::exp2_ftz;
// Keeps the computation of `x` (and all it depends on) before the next wgmma.wait_group in the
// SASS. ptxas moves register-only work freely across WARPGROUP.DEPBAR (the wait), and 13.0 puts
// the softmax's exponentials of the pipelined loop after the wait for the PV GEMM they were meant
// to overlap (every pipelined sm_90a extend kernel: all 34 MUFU.EX2 of a tile after the wait,
// about 100 instructions before it; scripts/kernel-resources checks the order). A shared-memory
// store stays on its side of the wait, so `x` is made the operand of one: a store to
// smem_addr predicated on x < 0, which never holds for what it is given (a softmax row sum:
// a sum of exponentials, >= 0, or NaN, for which the comparison is false), so nothing is ever
// stored; only the dependence remains.
__device__ __forceinline__ void compute_before_wait(float x, std::uint32_t smem_addr) {
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "setp.lt.f32 p, %0, 0f00000000;\n\t"
      "@p st.shared.f32 [%1], %0;\n\t}\n" ::"f"(x),
      "r"(smem_addr)
      : "memory");
}
// Generic-proxy writes to shared memory (stores, cp.async) made visible to the async proxy that
// wgmma reads shared memory through; each writing thread runs it before the barrier.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across the asynchronous MMA
// (issued before it, waited for after it).
template <int kN>
__device__ __forceinline__ void reg_fence(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// The same for A fragments in registers: their last writes (packing) stay before fence() (the ISA
// requires wgmma.fence between a register's write and a wgmma.mma_async reading it as A), and
// they stay untouched until the wait.
template <int kN>
__device__ __forceinline__ void reg_fence(unsigned (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// d (m64n64) = (accumulate ? d : 0) + A x B, A and B K-major in shared memory.
template <bool kBf16>
__device__ __forceinline__ void ss_m64n64(float (&d)[32], std::uint64_t a_desc,
                                          std::uint64_t b_desc, int accumulate) {
  if constexpr (kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " PAGEDKV_WGMMA_D32
        ", %32, %33, p, 1, 1, 0, 0;\n}\n"
        : PAGEDKV_WGMMA_OUT32
        : "l"(a_desc), "l"(b_desc), "r"(accumulate)
        : "memory");
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " PAGEDKV_WGMMA_D32
        ", %32, %33, p, 1, 1, 0, 0;\n}\n"
        : PAGEDKV_WGMMA_OUT32
        : "l"(a_desc), "l"(b_desc), "r"(accumulate)
        : "memory");
  }
}

// d (m64n64) = (accumulate ? d : 0) + A x B, A from registers, B K-major in shared memory.
template <bool kBf16>
__device__ __forceinline__ void rs_m64n64(float (&d)[32], const unsigned (&a)[4],
                                          std::uint64_t b_desc, int accumulate) {
  if constexpr (kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " PAGEDKV_WGMMA_D32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : PAGEDKV_WGMMA_OUT32
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate)
        : "memory");
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " PAGEDKV_WGMMA_D32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : PAGEDKV_WGMMA_OUT32
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate)
        : "memory");
  }
}

// d (m64n128) = (accumulate ? d : 0) + A x B, A from registers, B N-major in shared memory
// (imm-trans-b 1).
template <bool kBf16>
__device__ __forceinline__ void rs_m64n128_trans_b(float (&d)[64], const unsigned (&a)[4],
                                                   std::uint64_t b_desc, int accumulate) {
  if constexpr (kBf16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " PAGEDKV_WGMMA_D64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : PAGEDKV_WGMMA_OUT64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate)
        : "memory");
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " PAGEDKV_WGMMA_D64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : PAGEDKV_WGMMA_OUT64
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(accumulate)
        : "memory");
  }
}

}  // namespace pagedkv::kernels::wgmma

#undef PAGEDKV_WGMMA_D32
#undef PAGEDKV_WGMMA_D64
#undef PAGEDKV_WGMMA_OUT32
#undef PAGEDKV_WGMMA_OUT64
