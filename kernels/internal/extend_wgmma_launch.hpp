// kernels/internal/extend_wgmma_launch.hpp: host entry points of the warpgroup-MMA paged extend
// kernels (kernels/extend_attention_wgmma.cu, ExtendKernel::kWgmma and kWgmmaPipelined, and
// kernels/extend_attention_wgmma_ws.cu, kWgmmaWarpSpecialized, kWgmmaWarpSpecializedPingPong and
// kWgmmaWarpSpecializedPersistent; sm_90a),
// internal to pagedkv::cuda. Defined only where the build has sm_90a code (PAGEDKV_HAS_SM90A);
// the caller validates the parameters first.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv::kernels {

// Query rows per CTA (two warpgroups of 64): the split planner counts query tiles of this size.
inline constexpr int kWgmmaExtendRows = 128;

// Whether the kernel runs these (validated) params on the current device: a 16-bit cache,
// head_dim 128, compute capability 9.0. Never throws (false on any error).
bool wgmma_extend_runs(const PagedExtendParams& params) noexcept;

// Validated params for which wgmma_extend_runs() holds, num_seqs > 0, num_splits >= 1 and, when
// > 1, a workspace of extend_workspace_bytes (kFa2's layout). Enqueues the kernel and, with splits,
// kFa2's merge kernel.
// pipelined: ExtendKernel::kWgmmaPipelined's kernel (a tile's softmax runs while the previous
// tile's PV GEMM does), else kWgmma's.
cudaError_t wgmma_paged_extend(const PagedExtendParams& params, bool pipelined, int num_splits,
                               void* workspace, cudaStream_t stream);

// ExtendKernel::kWgmmaWarpSpecialized (kernels/extend_attention_wgmma_ws.cu): the same contract
// as wgmma_paged_extend, with a producer warpgroup and two consumer warpgroups. The schedule:
//   kPlain               one CTA per grid cell (kWgmmaWarpSpecialized);
//   kPingPong            the consumers take turns issuing their GEMMs
//                        (kWgmmaWarpSpecializedPingPong);
//   kPingPongPersistent  the same consumers, at most persistent_ctas (>= 1) CTAs each taking
//                        grid cells off a counter at the start of `workspace`, which must then
//                        hold the counter (kPersistentCounterBytes) before any split partials
//                        (kWgmmaWarpSpecializedPersistent; extend_persistent_schedule.hpp).
enum class WsSchedule { kPlain, kPingPong, kPingPongPersistent };
cudaError_t wgmma_ws_paged_extend(const PagedExtendParams& params, WsSchedule schedule,
                                  int num_splits, void* workspace, std::int64_t persistent_ctas,
                                  cudaStream_t stream);
// CTAs resident per SM (the plain and ping-pong kernels have the same threads and shared memory;
// the persistent one 48 B more).
cudaError_t wgmma_ws_extend_ctas_per_sm(bool persistent, int* ctas);

// CTAs of the (pipelined or plain) kernel resident per SM on the current device (the same for
// every dtype and soft-cap).
cudaError_t wgmma_extend_ctas_per_sm(bool pipelined, int* ctas);

}  // namespace pagedkv::kernels
