// kernels/internal/mbarrier.cuh: shared-memory barriers (mbarrier; the parity waits use
// try_wait, sm_90+, bounded in time so a deadlock traps instead of hanging), cp.async
// completion tracked by an mbarrier, named CTA barriers and the warpgroup register reallocation of
// sm_90a (setmaxnreg) for the warp-specialized kernels. Thin wrappers over PTX; internal to
// pagedkv::cuda.
//
// The phase protocol used with them: a barrier initialized with count N completes its current
// phase when N arrivals have happened, then starts the next; wait_parity(bar, parity) returns
// once the phase of that parity has completed. A consumer of stage s in round r (the r-th time
// the ring comes back to s) waits on full[s] with parity r & 1; a producer about to refill s for
// round r waits on empty[s] with parity (r & 1) ^ 1, which a fresh barrier passes at once (round
// 0: nothing to wait for).
#pragma once

#include <cstdint>

#include "internal/wait_limit.hpp"

namespace pagedkv::kernels::mbar {

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// One thread initializes; the CTA then synchronizes before anyone uses the barrier.
__device__ __forceinline__ void init(std::uint64_t* bar, std::uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

// After the inits, by the initializing thread, before the CTA barrier that publishes them: orders
// the inits before later arrivals, including the asynchronous ones of cp.async.mbarrier.arrive
// (as CUTLASS's pipelines do after every barrier init).
__device__ __forceinline__ void fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival (release semantics: the thread's earlier writes are visible to whoever observes
// the phase completing). The phase token is not needed (parity waits): sink.
__device__ __forceinline__ void arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// An arrival triggered when every cp.async this thread issued before it has completed; counted
// in the barrier's expected count (.noinc).
__device__ __forceinline__ void arrive_on_cp_async(std::uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}

// How long one wait may last before it is taken for a deadlock (a barrier that will never
// complete: a wrong arrival count, parity or stage, a warpgroup that exited early) and the kernel
// traps: kWaitLimitNs and the rule wait_expired (kernels/internal/wait_limit.hpp), in
// nanoseconds of %globaltimer; 0 waits forever. A trap ends the grid with a sticky error the
// launch's stream reports (the ISA says only "abort execution and generate an interrupt to the
// host CPU"; a public report, ROCm/hip#233, saw cudaErrorIllegalInstruction under nvcc; the
// context is then unusable, as after any device-side fault) instead of a hang no error ever
// reports. The longest honest wait lasts a few tiles' work of another warpgroup (the producer's
// wait on empty[s] spans up to kStages - 1 consumer iterations), microseconds (milliseconds under
// compute-sanitizer), so 10 s never fires on a working kernel; the build may set it (the CMake
// cache variable PAGEDKV_CUDA_WAIT_LIMIT_MS, 0 under a debugger that stops warps at breakpoints
// while the timer runs).

// The global nanosecond timer (%globaltimer; its resolution is about a microsecond).
__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// One try: true once the phase of parity `parity` has completed (acquire semantics), false when
// the hardware's time-limited wait ran out first.
__device__ __forceinline__ bool try_wait_parity(std::uint32_t addr, std::uint32_t parity) {
  std::uint32_t done = 0;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}\n"
      : "=r"(done)
      : "r"(addr), "r"(parity)
      : "memory");
  return done != 0;
}

// Blocks until the phase of parity `parity` has completed (acquire semantics); traps when that
// takes longer than kLimitNs (0: never). The timer is read only after a try has failed.
template <std::uint64_t kLimitNs = kWaitLimitNs>
__device__ __forceinline__ void wait_parity(std::uint64_t* bar, std::uint32_t parity) {
  const std::uint32_t addr = smem_addr(bar);
  if (try_wait_parity(addr, parity)) return;
  if constexpr (kLimitNs == 0) {
    while (!try_wait_parity(addr, parity)) {
    }
  } else {
    const std::uint64_t start = global_timer_ns();
    while (!try_wait_parity(addr, parity)) {
      if (wait_expired(start, global_timer_ns(), kLimitNs)) __trap();
    }
  }
}

// Waits for every cp.async this thread issued (committed in groups or not).
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// A barrier among `threads` threads (whole warps) of the CTA, id 1..15 (0 is __syncthreads).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Warpgroup register reallocation (sm_90a): every warp of the warpgroup runs it; the per-thread
// limit becomes kRegs (a multiple of 8 in [24, 256]).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes 24..256 by 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes 24..256 by 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace pagedkv::kernels::mbar
