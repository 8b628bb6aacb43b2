// pagedkv/cuda/decode_attention.hpp: paged decode attention on the GPU (target pagedkv::cuda).
//
// Same contract as the CPU reference in pagedkv/reference/decode_attention.hpp, on device buffers.
// fp16 and bf16 values, fp32 accumulation and softmax; head_dim 64, 128 or 256; GQA group
// sizes 1..16; block sizes 1..256 with any strides KVLayout accepts; 64-bit address arithmetic
// throughout. Several query tokens per sequence (q_len > 1: speculative decoding's draft tokens,
// appended to the cache first, each attending up to its own position) on the tensor-core
// variants of a 16-bit cache, group x q_len <= 16 (kCudaDecodeMaxQueryRows), with a split plan's
// chunks of at least 16 tokens; kSimt and FP8 caches take one (Error otherwise).
// paged_extend_attention (pagedkv/cuda/extend_attention.hpp) takes any number of new tokens with
// the same result.
//
// Launch geometry (kSimt; kTensorCore below): one CTA (4 warps) per (sequence, KV head, split)
// serves every query head of the KV head's group, so each K/V byte is read from memory once per
// group. K/V tiles stream through a 3-stage cp.async pipeline in shared memory with 16-byte
// accesses. With a split-KV plan (pagedkv/device/decode_plan.hpp) each CTA writes its chunk's
// output and log-sum-exp to the workspace and a second kernel merges them; sequences that need one
// chunk are written directly.
//
// An FP8 cache (params.quant.fp8(); pagedkv/device/kv_quant.hpp) runs kernels/fp8_attention.cu
// instead: one CTA per (sequence, KV head), codes decoded in registers, the row scales applied to
// the fp32 dot product and softmax weight, fp32 accumulation; no split-KV (the plan is ignored),
// unless the caller chose kTensorCoreFp8 or kTensorCoreFp8Direct (below).
//
// Kernel variants (DecodeKernel, chosen per call; the default is kTensorCoreWideMerge):
//   kTensorCore  kernels/decode_attention_tc.cu: the GQA group's query heads are the M dimension
//                of mma.sync m16n8k16 (fp32 accumulation), 64-token key tiles split over the 4
//                warps, each with its own cp.async pipeline and softmax state, merged once per CTA;
//                same contract, same plan and workspace. The default from the GPU run of
//                2026-12-04 (0.92 x copy bandwidth on the worst >= 1 GiB shape, 2.7x the kSimt
//                kernel's speed at the median shape) until the next one.
//   kTensorCoreWideMerge  (the default since the GPU run of 2026-12-04, evening;
//                bench/results/gpu.md) the kTensorCore attention kernel with a one-wave split plan
//                (decode_plan_options_for_current_device) and a merge kernel that is parallel over
//                the splits (one CTA per (sequence, query head) instead of one thread looping over
//                every split); the merge is launched through programmatic dependent launch
//                and triggered at the attention kernel's start, and the attention kernel itself
//                is launched with programmatic stream serialization (it reads nothing before
//                griddepcontrol.wait, so stream order holds; only its launch latency overlaps
//                the previous kernel). Same contract, plan and workspace. Without split-KV it
//                runs kTensorCore's attention kernel.
//   kTensorCoreFp8  (opt-in until a GPU run proves it) for an FP8 cache,
//                kernels/decode_attention_tc_fp8.cu: kTensorCore's geometry with the FP8 codes
//                staged in shared memory and converted exactly to q's 16-bit type there (no
//                scale applied to values: K scales multiply the scores, V scales the
//                probabilities of the PV product, not the softmax sum), with the plan's split-KV
//                and a merge parallel over the splits. Layouts whose strides are not multiples of
//                16 bytes run the FP8 kernel above instead (decode_kernel_runs says so). For a
//                16-bit cache it behaves as kTensorCore.
//   kTensorCoreFp8Direct  (opt-in; not yet run on a GPU) kTensorCoreFp8 without the 16-bit copy
//                in shared memory: each lane reads the staged codes with ldmatrix and converts
//                them straight into the MMA's fragments in registers (q's fragments take the
//                same permutation of head_dim, so the dot products are the same; docs/fp8.md), and
//                the freed shared memory deepens the copy ring. Same layouts, fallbacks, plans,
//                workspace and contract as kTensorCoreFp8; results equal up to the order of fp32
//                sums. For a 16-bit cache it behaves as kTensorCore.
//   kTensorCoreFusedMerge  (opt-in until a GPU run proves it) kTensorCoreWideMerge without the
//                merge kernel: the last CTA of each (sequence, KV head) to finish merges the
//                group's query heads itself (kernels/internal/decode_fused_merge.cuh), so batch-1
//                decode pays one grid's drain instead of two. It counts the CTAs done per
//                (sequence, KV head) in caller-owned split counters (DecodeSplitCounters below);
//                same plan (one wave), workspace and contract otherwise. Without split-KV it
//                runs as kTensorCoreWideMerge does without split-KV (the attention kernel alone,
//                launched programmatically) and touches no counter.
//   kSimt        the CUDA-core kernel described above (kernels/decode_attention.cu), the default
//                before 2026-12-04; kept for comparison. An FP8 cache falls back to the FP8
//                kernel with any variant; every 16-bit shape above runs every variant.
//
// Stream semantics: everything is enqueued on `stream`; no allocation, no synchronization, no
// host reads of device data, so launches can be captured in a CUDA graph. The caller owns the
// workspace (size from decode_workspace_bytes) and must not reuse it until the launch completes.
//
// Errors: argument problems detectable on the host throw pagedkv::Error before anything is
// enqueued; CUDA errors are returned. Device data is trusted: seq_lens are clamped to the table
// row, and a block id outside the pool yields an unspecified (finite, in-bounds-read) result
// instead of a fault; validate_block_table() checks the host copy when in doubt.
// Thread-safety: any number of host threads may launch concurrently.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "pagedkv/device/decode_plan.hpp"
#include "pagedkv/reference/decode_attention.hpp"

namespace pagedkv {

inline constexpr int kCudaDecodeMaxGroupSize = 16;
// Several query tokens per sequence (PagedDecodeParams::q_len > 1): at most this many query rows
// (group x q_len) per KV head, on the tensor-core kernels.
inline constexpr int kCudaDecodeMaxQueryRows = 16;

enum class DecodeKernel : int {
  kSimt = 0,                  // CUDA-core kernel (the default before 2026-12-04)
  kTensorCore = 1,            // tensor-core kernel
  kTensorCoreWideMerge = 2,   // kTensorCore, one-wave plan, parallel merge (the default)
  kTensorCoreFp8 = 3,         // FP8 caches on tensor cores (opt-in; see above)
  kTensorCoreFusedMerge = 4,  // kTensorCoreWideMerge, merged by each state's last CTA (opt-in)
  kTensorCoreFp8Direct = 5,   // kTensorCoreFp8, codes straight into MMA fragments (opt-in)
};
inline constexpr DecodeKernel kDefaultDecodeKernel = DecodeKernel::kTensorCoreWideMerge;

// kTensorCoreFusedMerge's arrival counters: device memory the caller owns, one std::uint32_t per
// (sequence, KV head) of a batch (count >= num_seqs x num_kv_heads; counter seq x num_kv_heads +
// kv_head). They must be zero before the first launch that uses them (cudaMemsetAsync once, after
// allocating them); every launch that completes leaves them zero again (a state's last CTA resets
// its counter), so one zeroed array serves every later launch, plan and batch on the stream, and
// CUDA-graph replays. Other variants neither read nor write them. Launches that share them must
// run one after another, as launches that share a workspace must: consecutive launches on one
// stream do (the next one's CTAs wait in griddepcontrol.wait before touching either), but a
// kernel enqueued between them with programmatic stream serialization that never waits for its
// predecessor would let them overlap. A counter found at or above its sequence's split count is
// not a zeroed counter: the kernel executes `trap` (the launch fails with a CUDA error; the
// context is lost) rather than write a wrong result. A counter left between 1 and the split
// count minus 1 is not detectable and stays wrong for every later launch (each merges before all
// its chunks are written): memory that was never zeroed, seq_lens changed on the device while a
// launch ran (every CTA of a sequence must see the same length), or a launch aborted midway.
// Zero the array again (cudaMemsetAsync) after any of these.
struct DecodeSplitCounters {
  std::uint32_t* data = nullptr;
  std::int64_t count = 0;
};

// Whether `kernel` itself runs for these parameters; false when paged_decode_attention falls back
// (an FP8 cache runs kernels/fp8_attention.cu except with kTensorCoreFp8 or kTensorCoreFp8Direct
// on a layout whose strides are multiples of 16 bytes; either on a 16-bit cache runs kTensorCore:
// false)
// or refuses them (q_len > 1 beyond the tensor-core variants of a 16-bit cache with group x
// q_len <= 16).
bool decode_kernel_runs(const PagedDecodeParams& params, DecodeKernel kernel) noexcept;

// The host-side checks paged_decode_attention performs: validate(params) and validate(plan),
// plus head_dim in {64, 128, 256} and compiled into this build (pagedkv/cuda/head_dims.hpp),
// group size <= 16, 16-byte aligned q / k_cache / v_cache / out,
// q and out strides multiples of 8 elements, a large enough 16-byte aligned workspace when
// splitting (decode_workspace_bytes with params.q_len), a grid of at most 2^31 - 1 CTAs, and when
// splitting num_seqs x q_len x num_q_heads <= 2^31 - 1 (the merge grid). The checks of q_len > 1
// that depend on the kernel (above) are paged_decode_attention's. Throws pagedkv::Error.
void validate_cuda_decode(const PagedDecodeParams& params, const DecodePlan& plan,
                          const void* workspace, std::size_t workspace_bytes);

// Enqueues decode attention for one layer. `params` points to device memory (block_table and
// seq_lens included); `workspace` may be null when !plan.split_kv(). `split_counters` is read only
// by kTensorCoreFusedMerge with a split-KV plan, which throws pagedkv::Error (before enqueuing
// anything) unless it holds at least num_seqs x num_kv_heads 4-byte aligned counters.
cudaError_t paged_decode_attention(const PagedDecodeParams& params, const DecodePlan& plan,
                                   void* workspace, std::size_t workspace_bytes,
                                   cudaStream_t stream, DecodeKernel kernel = kDefaultDecodeKernel,
                                   DecodeSplitCounters split_counters = {});

// Planner options for the current device: num_sms from the device and ctas_per_sm from the
// kernel's occupancy for this dtype and head_dim (other options keep their defaults). For
// kTensorCore ctas_per_sm is twice the variant's occupancy, so the planner's one-wave target
// fills two waves of it (its CTAs are short; two waves balance the tail), and min_chunk_tokens
// is one 64-token tile; kTensorCoreWideMerge and kTensorCoreFusedMerge plan one wave with the
// same minimum chunk;
// kTensorCoreFp8 and kTensorCoreFp8Direct plan like kTensorCore with their own kernel's occupancy
// (dtype is
// q's 16-bit type; use kTensorCore's options for a 16-bit cache). Throws
// pagedkv::Error for an unsupported head_dim; returns CUDA errors.
cudaError_t decode_plan_options_for_current_device(KVDtype dtype, int head_dim,
                                                   DecodePlanOptions* options,
                                                   DecodeKernel kernel = kDefaultDecodeKernel);

}  // namespace pagedkv
