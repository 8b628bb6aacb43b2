// kernels/cp_async.cuh: asynchronous global -> shared copies (sm_80+), shared by the attention
// kernels. Internal to pagedkv::cuda.
#pragma once

namespace pagedkv::kernels {

// 16-byte copy; with `fill` false nothing is read from global memory and 16 zero bytes are
// written, so rows past a sequence's end never touch (possibly NaN) cache slots.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool fill) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = fill ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
// 4-byte copy (a float32 scale; cached in L1), zero-filled when !fill.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool fill) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = fill ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace pagedkv::kernels
