// pagedkv/cuda/extend_attention.hpp: paged extend (prefix-hit prefill) attention on the GPU
// (target pagedkv::cuda).
//
// Same contract as the CPU reference in pagedkv/reference/extend_attention.hpp, on device buffers:
// fp16 and bf16 values with fp32 accumulation and softmax; head_dim 64, 128 or 256; any GQA group;
// block sizes 1..256 with any strides KVLayout accepts; 64-bit address arithmetic.
//
// Design (FlashAttention-2 style, tensor cores through mma.sync m16n8k16): one CTA of 4 warps
// per (query tile, sequence, KV head). A query tile is 64 rows of the sequence's
// (new token, query head of the group) pairs, token-major, so the heads of a GQA group share
// every K/V tile the CTA loads; each warp owns 16 rows. K/V tiles of 64 keys (32 for head_dim 256)
// are gathered through the block table with 16-byte cp.async copies into a double-buffered,
// XOR-swizzled shared-memory ring, starting at the tile's first visible key (the cached prefix
// and the new tokens alike: a tile may span the prefix boundary or several blocks). Scores and
// the online softmax stay in registers (log2 domain, exp2f); only tiles that cross the causal
// diagonal or the window edge are masked. Query tiles are scheduled heaviest (most keys) first.
// No workspace: there is no split over keys, so a sequence with few new tokens and a long
// prefix runs on few CTAs (decode attention covers the one-token case with split-KV).
//
// An FP8 cache (params.quant.fp8(); pagedkv/device/kv_quant.hpp) runs kernels/fp8_attention.cu
// instead: one CTA per (new token, KV head) on CUDA cores, codes decoded in registers, the row
// scales applied to the fp32 dot product and softmax weight, fp32 accumulation (correctness
// first), unless the caller chose kFa2Fp8 (below), the tensor-core FP8 path.
//
// Kernel variants (ExtendKernel, chosen per call; the default is kFa2):
//   kMma16  the kernel described above (kernels/extend_attention.cu), the default until the GPU
//           run of 2026-12-04 (evening).
//   kFa2    kernels/extend_attention_fa2.cu (issue 35, step A; FlashAttention-2 parity): 32 query
//           rows per warp (16 at head_dim 256), 128-row tiles of 4 warps (64-row tiles of 2 warps
//           when max_q_len x group <= 64), the score scale applied to the fp32 scores (Q fragments
//           in registers at head_dim 64), a 3-stage cp.async ring with each tile's page offsets
//           resolved two tiles ahead, the output rescale skipped when no row maximum moved, and an
//           optional split over keys (ExtendSplitPlan) for grids that under-fill the GPU (heavily
//           cached prompts): each split writes partial rows to the caller's workspace and a merge
//           kernel combines them. Same contract and tolerances. The default since the GPU run
//           of 2026-12-04 (evening; bench/results/gpu.md): correct in every kernel check and
//           sanitizer, 0.83x kMma16's time on the H200, and the tiny engine on CUDA passes its
//           caching on/off check (near-tie aware) with it over workload seeds 1-4.
//   kWgmma  kernels/extend_attention_wgmma.cu (issue 35, step B, first cut; sm_90a code): Hopper's
//           warpgroup MMA (wgmma) on kFa2's tile geometry, two warpgroups of 64 query rows each,
//           64-key tiles in 128-byte-swizzled shared layouts, P fed from registers, the split
//           over keys of kFa2 (same plan, workspace and merge kernel; its planner counts query
//           tiles of 128 rows and its own occupancy), no warp specialization yet. It runs for
//           16-bit caches at head_dim 128 on a device of compute capability 9.0 in a build with
//           sm_90a code (CUDA 12+), with soft-cap or a positive sm_scale; anything else falls
//           back to kFa2 with the given plan (extend_kernel_runs says which). NOT YET RUN ON A
//           GPU: opt-in only, never the default until a GPU run of scripts/gpu-check proves it
//           correct and faster.
//   kWgmmaPipelined  kWgmma's kernel with FlashAttention-3's intra-warpgroup overlap: iteration t
//           issues tile t's S GEMM, then tile t - 1's PV GEMM, and runs tile t's softmax while the
//           PV GEMM is in flight (a 4-stage K/V ring, 166,912 B = 163 KiB of shared memory). Same
//           shapes, plan, fallback and status (not yet run on a GPU).
//   kWgmmaWarpSpecialized  kernels/extend_attention_wgmma_ws.cu: FlashAttention-3's structure. A
//           producer warpgroup (registers cut to 40 with setmaxnreg) gathers the paged K/V with
//           cp.async into a 4-stage ring whose stages are handed over by mbarriers; two consumer
//           warpgroups (232 registers) each run kWgmmaPipelined's loop on their 64 rows with no
//           CTA-wide barrier, so one's softmax can run under the other's GEMMs. Same shapes,
//           plan, fallback and status (not yet run on a GPU).
//   kWgmmaWarpSpecializedPingPong  the same kernel with the consumers taking turns issuing their
//           GEMMs (two more mbarriers; consumer 0 first), so one's softmax runs while the
//           other's GEMMs occupy the tensor cores by construction, not by drift
//           (FlashAttention-3's inter-warpgroup ping-pong). Same shapes, plan, fallback and
//           status (not yet run on a GPU).
//   kWgmmaWarpSpecializedPersistent  the ping-pong kernel made persistent: the launch starts at
//           most ExtendSplitPlan::persistent_ctas CTAs (the planner's: one per resident slot,
//           SMs x CTAs per SM) and each takes work items (the other variants' CTAs: KV head x
//           sequence x query tile x split) off a shared counter, in the order the hardware would
//           have started them, every sequence's heaviest query tile first, so a CTA that finishes
//           early takes the next (greedy, longest-first when the sequences are alike); the
//           producer gathers the next item's K/V into the ring while the consumers finish the
//           current one. The counter lives in the first 16 bytes of the caller's workspace
//           (extend_workspace_bytes counts them; the split's partials follow) and the launch zeroes
//           it on the stream before the kernel (a memset node in a captured graph), so the variant
//           always needs a plan from the planner and its workspace, also without a split. Same
//           shapes, fallback and status (not yet run on a GPU).
//   kFa2LeanSoftmax  kFa2's kernel, tiles, ring, split, plan, workspace and merge with the
//           kWgmma kernels' softmax: without soft-cap the scores stay unscaled until the
//           exponential, which applies the scale and subtracts the row maximum in one FFMA (the
//           row maximum of the raw scores times the scale: needs sm_scale > 0); the mask runs on
//           its own branch, only on the tiles that need one, instead of a select on every score
//           of every tile; the exponentials flush denormal results (ex2.approx.ftz: values below
//           2^-126 of a row's largest term). 1,177 -> 870 instructions in the tile loop at
//           head_dim 128 (bf16, 4 warps, no soft-cap; scripts/kernel-resources). A zero or
//           negative sm_scale without soft-cap runs kFa2 (extend_kernel_runs false), an FP8
//           cache the CUDA-core FP8 kernel, as with kFa2. NOT YET RUN ON A GPU.
//   kFa2Fp8  kernels/extend_attention_fa2_fp8.cu: for an FP8 cache, kFa2's 4-warp tiles, ring,
//           split (same plan rules over its own tiles and occupancy, same workspace and merge
//           kernel) with FP8 codes in the ring, each thread converting the codes it copied
//           exactly into 16-bit K / V tiles for kFa2's GEMMs; K scales multiply the score columns,
//           V scales the probability columns. Layouts whose strides are not multiples of 16
//           bytes run kernels/fp8_attention.cu; a 16-bit cache runs kFa2. NOT YET RUN ON A GPU.
//           Any other variant over an FP8 cache runs the CUDA-core FP8 kernel; every 16-bit shape
//           runs kMma16 and kFa2.
//
// Stream semantics: everything is enqueued on `stream`; no allocation, no synchronization, no
// host reads of device data (max_q_len sizes the grid), so launches can be captured in a CUDA
// graph. The caller owns the workspace (a split's partial rows, the persistent variant's counter)
// and must neither reuse it nor hand it to another launch that may run meanwhile (another stream)
// until the launch completes: two persistent launches sharing a counter would skip each other's
// items.
//
// Errors: argument problems detectable on the host throw pagedkv::Error before anything is
// enqueued; CUDA errors are returned. The warp-specialized variants (kWgmmaWarpSpecialized,
// kWgmmaWarpSpecializedPingPong, kWgmmaWarpSpecializedPersistent) hand stages over on shared-memory
// barriers: a barrier wait longer than PAGEDKV_CUDA_WAIT_LIMIT_MS (a build option, 10 s; 0: no
// limit) traps instead of hanging, and the launch then fails with a sticky error (the context is
// unusable, as after any device fault); a working kernel never waits that long. Device data is
// trusted but clamped: seq_lens to the table row, q_len_i to [0, max_q_len]; a block id outside the
// pool reads zeros instead of faulting; a sequence with q_len_i > seq_lens[i] gets zero rows (lse
// -inf) for the tokens that would sit before position 0. validate_block_table() and the CPU
// reference check the host copies. Thread-safety: any number of host threads may launch
// concurrently.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv {

// Query rows ((token, head) pairs) per CTA.
inline constexpr int kCudaExtendTileRows = 64;

// The host-side checks paged_extend_attention performs: validate(params), plus head_dim in
// {64, 128, 256} and compiled into this build (pagedkv/cuda/head_dims.hpp); 16-byte aligned q /
// k_cache / v_cache / out, 4-byte aligned lse; q and out strides multiples of 8 elements; num_seqs
// and the number of query tiles, ceil(max_q_len x group / kCudaExtendTileRows), at most 65535 each.
// Throws pagedkv::Error.
void validate_cuda_extend(const PagedExtendParams& params);

// Enqueues extend attention for one layer with kDefaultExtendKernel and no split over keys (so
// no workspace). `params` points to device memory (q_indptr, block_table and seq_lens included).
cudaError_t paged_extend_attention(const PagedExtendParams& params, cudaStream_t stream);

enum class ExtendKernel : int {
  kMma16 = 0,  // 16 rows per warp, 2-stage ring, no split
  kFa2 = 1,    // FlashAttention-2-style variant with an optional split over keys (the default)
  kWgmma = 2,  // sm_90a warpgroup-MMA variant (head_dim 128, compute capability 9.0; else kFa2)
  kWgmmaPipelined = 3,  // kWgmma with a tile's softmax overlapping the previous tile's PV GEMM
  kWgmmaWarpSpecialized = 4,          // kWgmmaPipelined's consumers fed by a producer warpgroup
  kWgmmaWarpSpecializedPingPong = 5,  // kWgmmaWarpSpecialized, the consumers' GEMMs alternating
  // FP8 caches on tensor cores (opt-in until a GPU run proves it): kFa2's tiles and split over
  // K/V codes converted exactly to q's 16-bit type in shared memory, the scales applied to the
  // score and probability columns (kernels/extend_attention_fa2_fp8.cu). A layout whose strides
  // are not multiples of 16 bytes runs kernels/fp8_attention.cu; a 16-bit cache runs kFa2.
  kFa2Fp8 = 6,
  // kWgmmaWarpSpecializedPingPong, persistent: CTAs that each take work item after work item off
  // a counter in the workspace, heaviest query tiles first (needs a plan and its workspace).
  kWgmmaWarpSpecializedPersistent = 7,
  // kFa2 with the kWgmma kernels' softmax (fewer instructions per key tile; opt-in until a GPU
  // run proves it): scale in the exponential's FFMA, mask on its own branch, flushing exp2.
  kFa2LeanSoftmax = 8,
};
inline constexpr ExtendKernel kDefaultExtendKernel = ExtendKernel::kFa2;

// The split over keys of a kFa2, kFa2LeanSoftmax, kFa2Fp8 or kWgmma-variant launch (kWgmma,
// kWgmmaPipelined, kWgmmaWarpSpecialized, kWgmmaWarpSpecializedPingPong,
// kWgmmaWarpSpecializedPersistent): each query tile's visible keys are cut into num_splits
// contiguous runs of key tiles (fewer where a tile has fewer key tiles). 1 = no split, no workspace
// (but for a persistent plan's counter). kMma16 and FP8 caches ignore it (but for kFa2Fp8's FP8
// kernel); the kWgmma variants' fallback to kFa2 uses it.
struct ExtendSplitPlan {
  std::int32_t num_splits = 1;
  // kWgmmaWarpSpecializedPersistent: the most CTAs its launch starts (>= 1; the planner's: SMs x
  // resident CTAs per SM); a plan with it > 0 has 16 more workspace bytes (the work counter).
  // 0 for every other variant, which ignore it.
  std::int32_t persistent_ctas = 0;
};
inline constexpr std::int32_t kCudaExtendMaxSplits = 16;
inline constexpr std::int32_t kCudaExtendMaxPersistentCtas = 65536;

// Whether `kernel` itself runs for these parameters (for kWgmma: on the current device); false
// when paged_extend_attention falls back (an FP8 cache runs kernels/fp8_attention.cu except with
// kFa2Fp8 on a layout whose strides are multiples of 16 bytes; kFa2Fp8 on a 16-bit cache runs
// kFa2: false; kFa2LeanSoftmax without soft-cap and with sm_scale <= 0 runs kFa2: false).
bool extend_kernel_runs(const PagedExtendParams& params, ExtendKernel kernel) noexcept;

// The plan for a GPU with num_sms SMs of which each holds ctas_per_sm CTAs of the variant: no
// split when query tiles x sequences x KV heads fill two waves, else enough splits to fill them
// (at most kCudaExtendMaxSplits). Query tiles are the variant's: kFa2's 64 or 128 rows (32 or 64
// at head_dim 256), kFa2Fp8's 128 (64 at head_dim 256: kFa2's 4-warp tiles), the kWgmma
// variants' 128 (their kernels', whether or not they run here); the splits are capped so that
// kFa2's query tiles x num_splits stay within the grid limit paged_extend_attention checks, so
// the plan is valid for the variant whichever kernel runs. Pure, host only; kMma16 always gets
// 1, and so does an FP8 cache (whose CUDA-core kernel ignores the plan) but where kFa2Fp8's
// kernel runs. kWgmmaWarpSpecializedPersistent's plan also has persistent_ctas = num_sms x
// ctas_per_sm (at most kCudaExtendMaxPersistentCtas), for every batch, the empty one too. Throws
// pagedkv::Error for num_sms or ctas_per_sm < 1, for a head_dim validate_cuda_extend refuses
// (not 64, 128 or 256, or not compiled into this build), and for the shape it reads as the
// launch checks it: negative counts, num_q_heads not a positive multiple of num_kv_heads, more
// than 65535 sequences or query tiles.
ExtendSplitPlan plan_extend_split(const PagedExtendParams& params, ExtendKernel kernel, int num_sms,
                                  int ctas_per_sm);

// The same with num_sms and the variant's occupancy (dtype, head_dim, CTA size) of the current
// device; for a kWgmma variant whose kernel does not run here (extend_kernel_runs), and for
// kFa2LeanSoftmax where its softmax does not, kFa2's plan (the fallback's); for an FP8 cache 1
// split, but for kFa2Fp8 where its kernel runs; for kWgmmaWarpSpecializedPersistent always
// persistent_ctas >= 1 (where its kernel does not run, a count its launch accepts and ignores).
// Returns CUDA errors; throws as validate_cuda_extend for bad params.
cudaError_t extend_split_plan_for_current_device(const PagedExtendParams& params,
                                                 ExtendKernel kernel, ExtendSplitPlan* plan);

// Workspace bytes a launch with `plan` needs: with a split, float partial rows and their
// log-sum-exp for num_seqs x max_q_len x num_q_heads x num_splits states; with persistent_ctas >
// 0, 16 bytes more (the persistent kernel's work counter, before the partials); else 0. With a
// split, throws pagedkv::Error for a negative shape or a size past 2^63 bytes.
std::size_t extend_workspace_bytes(const PagedExtendParams& params, const ExtendSplitPlan& plan);

// Enqueues extend attention with the chosen variant. validate_cuda_extend's checks, plus for kFa2,
// kFa2LeanSoftmax, kFa2Fp8 and the kWgmma variants: 1 <= plan.num_splits <= kCudaExtendMaxSplits,
// kFa2's query tiles x num_splits <= 65535, 0 <= plan.persistent_ctas <=
// kCudaExtendMaxPersistentCtas (>= 1 for kWgmmaWarpSpecializedPersistent), and where
// extend_workspace_bytes is not 0 (a split, a persistent plan) a 16-byte aligned workspace of at
// least that many bytes (not needed for an FP8 cache but by kFa2Fp8's FP8 kernel). Throws
// pagedkv::Error.
cudaError_t paged_extend_attention(const PagedExtendParams& params, cudaStream_t stream,
                                   ExtendKernel kernel, const ExtendSplitPlan& plan = {},
                                   void* workspace = nullptr, std::size_t workspace_bytes = 0);

}  // namespace pagedkv
