// Paged extend attention throughput against a dense bf16 GEMM measured in the same run (GPU only;
// exits 0 with a message when there is no device).
//
// Before anything is timed, a small random case (3 sequences, cached prefixes, shuffled blocks)
// is checked against the CPU reference: every output row within 1e-2 relative (bf16); a failed
// check exits 1 without timing. And after each variant is timed on a shape, it runs once more on
// that shape (its timed table, the same split workspace, output and workspace poisoned first),
// and the last sequence's first and last two new rows are checked against the CPU reference
// computed from the device's own blocks and q (CHECK extend_after_timing, one line per variant
// and shape and a summary): every timed shape is checked, in the state its timing left. A
// failure there exits 1 after the report.
//
// G = cuBLAS bf16 GEMM rate (fp32 accumulation, 8192^3, random inputs: a GEMM on constant data
// runs faster and would inflate the baseline): 2 m n k / time. Attention rate =
// 4 x visible (query, key) pairs x head_dim x q_heads / time, where a prompt of P tokens with H
// cached has (P - H) x H + (P - H)(P - H + 1) / 2 visible pairs per head (causal, bottom-right).
// Shapes like Llama-3-8B (32 query heads, 8 KV heads, head_dim 128, bf16, random q / K / V),
// block size 16. Tables:
//   1. 8k-token prompts with 0-50% cached, paged (shuffled block table) and identity table.
//   2. "Prefill saved": the same 8k prompt with H/P from 0 to 0.9; time should fall like the
//      uncached work (visible pairs), not like the uncached token count.
// Warm-up runs on other inputs than the timed calls (the GEMM on its own matrices, attention
// through a block table into the other half of the pool). Times are CUDA-event medians.
//
// Targets (issue 35, docs/figures.md): extend >= 0.60 x G on table 1's 12 shapes (TARGET
// extend_vs_gemm) and >= 0.45 x G on table 2's shapes with 80% and 90% cached (TARGET
// extend_cached_vs_gemm), both for the default kernel; every other variant gets the same two lines
// under its name. Every figure is also printed as a RESULT / TARGET / CHECK line
// (bench_cuda_util.hpp).
//
// Variants (issue 35, step A): every shape is timed with ExtendKernel::kMma16 and, right after on
// the same tables, with kFa2 and the planner's split for this device
// (extend_split_plan_for_current_device; its workspace allocated before timing). Both are checked
// against the CPU reference first (kFa2 also with 3 forced splits). TARGET extend_vs_gemm /
// extend_cached_vs_gemm are the default kernel's (kFa2 since 2026-12-04, evening), TARGET
// extend_mma16_vs_gemm / extend_mma16_cached_vs_gemm kMma16's; RESULT extend_variants gives kFa2's
// time over kMma16's.
// RESULT extend / extend_saved lines are kMma16's, RESULT extend_fa2 / extend_fa2_saved kFa2's.
// ExtendKernel::kWgmma, kWgmmaPipelined, kWgmmaWarpSpecialized, kWgmmaWarpSpecializedPingPong
// and kWgmmaWarpSpecializedPersistent (issue 35 step B, sm_90a, opt-in; names wgmma,
// wgmma_pipelined, wgmma_ws, wgmma_ws_pingpong, wgmma_ws_persistent: the persistent one on the
// planner's CTAs, its launch's counter memset inside the timed calls) run last, after every
// figure above is printed,
// each checked on its own without and with 3 forced splits (CHECK extend_attention_<name>[_split],
// a failure skips only that variant's timing), then every shape again with the same tables and
// the planner's split for its kernel, against kFa2's time from the tables: RESULT extend_<name> /
// extend_<name>_saved (time_vs_fa2), TARGET extend_<name>_vs_gemm / extend_<name>_cached_vs_gemm
// (without the name if it is the default) and RESULT extend_variants
// <name>_time_vs_fa2; RESULT extend_<name>_runs says whether its sm_90a kernel ran here.
// ExtendKernel::kFa2LeanSoftmax (kFa2's kernel with the kWgmma kernels' softmax, opt-in; name
// fa2_lean) runs last the same way: its RESULT extend_variants fa2_lean_time_vs_fa2 is kFa2's
// own kernel with and without the leaner softmax, on the same tables.
//
// Usage: bench_extend_attention [--quick]   (--quick: a 1k prompt, for smoke tests)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "bench_cuda_util.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/cuda/extend_attention.hpp"
#include "pagedkv/device/kv_layout.hpp"
#include "pagedkv/reference/extend_attention.hpp"
#include "reference_by_head.hpp"

namespace {

using pagedkv::KVDtype;
using pagedkv::KVLayout;

constexpr const char* kProgram = "bench_extend_attention";
void check(cudaError_t err, const char* what) {
  bench::cuda_check(err, what, kProgram);
}
void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "bench_extend_attention: %s: cuBLAS status %d\n", what,
                 static_cast<int>(status));
    std::exit(1);
  }
}
#define CHECK(call) check((call), #call)

constexpr int kQHeads = 32;
constexpr int kKVHeads = 8;
constexpr int kHeadDim = 128;
constexpr int kBlockSize = 16;
constexpr KVDtype kDtype = KVDtype::kBFloat16;
constexpr double kTarget = 0.60;        // table 1's 12 shapes (issue 35)
constexpr double kTargetCached = 0.45;  // table 2's shapes with 80% and 90% cached
constexpr double kRowTolerance = 1e-2;  // bf16, as the GPU tests
constexpr float kSmScale = 0.0883883f;  // 1 / sqrt(head_dim)

// Median over `repeats` of the per-call milliseconds of `calls` back-to-back launches; `warmup`
// runs first (on other inputs than `launch`).
template <typename Warmup, typename Launch>
double median_ms(cudaStream_t stream, int repeats, int calls, Warmup&& warmup, Launch&& launch) {
  cudaEvent_t begin = nullptr;
  cudaEvent_t end = nullptr;
  CHECK(cudaEventCreate(&begin));
  CHECK(cudaEventCreate(&end));
  warmup();  // also the first launch's one-time setup
  CHECK(cudaStreamSynchronize(stream));
  std::vector<double> per_call;
  for (int r = 0; r < repeats; ++r) {
    CHECK(cudaEventRecord(begin, stream));
    for (int c = 0; c < calls; ++c) launch();
    CHECK(cudaEventRecord(end, stream));
    CHECK(cudaEventSynchronize(end));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, begin, end));
    per_call.push_back(static_cast<double>(ms) / calls);
  }
  CHECK(cudaEventDestroy(begin));
  CHECK(cudaEventDestroy(end));
  return bench::median(per_call);
}

// Dense bf16 GEMM rate in TFLOP/s (n x n x n, fp32 accumulation, bf16 output) on random inputs;
// the warm-up multiplies two other random matrices.
double gemm_tflops(cublasHandle_t cublas, cudaStream_t stream, int n, int repeats) {
  const std::size_t bytes = static_cast<std::size_t>(n) * static_cast<std::size_t>(n) * 2;
  void* m[5] = {};
  for (int i = 0; i < 5; ++i) {
    CHECK(cudaMalloc(&m[i], bytes));
    bench::fill_random(m[i], bytes, kDtype, 100 + static_cast<std::uint64_t>(i), kProgram);
  }
  const float alpha = 1.0f;
  const float beta = 0.0f;
  const auto gemm = [&](void* a, void* b) {
    CHECK(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b,
                       CUDA_R_16BF, n, &beta, m[4], CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT));
  };
  const double ms = median_ms(
      stream, repeats, 5, [&] { gemm(m[2], m[3]); }, [&] { gemm(m[0], m[1]); });
  for (void* ptr : m) CHECK(cudaFree(ptr));
  return 2.0 * n * static_cast<double>(n) * n / (ms * 1e9);
}

// Visible (query, key) pairs of one head of one sequence with `cached` of `prompt` tokens cached.
double visible_pairs(std::int64_t prompt, std::int64_t cached) {
  const double fresh = static_cast<double>(prompt - cached);
  return fresh * static_cast<double>(cached) + fresh * (fresh + 1.0) / 2.0;
}

// Device buffers shared by every shape: a K/V pool (random), q (random) for two batches of the
// longest prompt (the timed one and the warm-up's), out.
struct Workspace {
  KVLayout layout;
  void* k = nullptr;
  void* v = nullptr;
  void* q = nullptr;  // [2][max_seqs x prompt rows]
  std::size_t q_half_bytes = 0;
  void* out = nullptr;
  std::int32_t* table = nullptr;   // [2][num_seqs, blocks_per_seq]: timed, then warm-up
  std::int32_t* indptr = nullptr;  // [num_seqs + 1]
  std::int32_t* lens = nullptr;    // [num_seqs]
};

struct Shape {
  int num_seqs = 1;
  int prompt = 8192;  // tokens per sequence
  int cached = 0;     // of which cached (the prefix hit)
  bool shuffled = true;
};

// The kernel variant a run times: ExtendKernel::kMma16 or kFa2 with the planner's split for this
// device (its workspace grown outside the timed calls).
struct Variant {
  pagedkv::ExtendKernel kernel = pagedkv::ExtendKernel::kMma16;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  pagedkv::ExtendSplitPlan plan;  // of the current shape (printed beside its figure)
};

// Plans the shape's split and grows the workspace: once per shape, before anything is timed.
void prepare(const pagedkv::PagedExtendParams& p, Variant& variant) {
  variant.plan = pagedkv::ExtendSplitPlan{};
  if (variant.kernel == pagedkv::ExtendKernel::kMma16) return;
  CHECK(pagedkv::extend_split_plan_for_current_device(p, variant.kernel, &variant.plan));
  const std::size_t need = pagedkv::extend_workspace_bytes(p, variant.plan);
  if (need > variant.workspace_bytes) {
    if (variant.workspace != nullptr) CHECK(cudaFree(variant.workspace));
    CHECK(cudaMalloc(&variant.workspace, need));
    variant.workspace_bytes = need;
  }
}

cudaError_t launch(const pagedkv::PagedExtendParams& p, cudaStream_t stream,
                   const Variant& variant) {
  if (variant.kernel == pagedkv::ExtendKernel::kMma16) {
    return pagedkv::paged_extend_attention(p, stream, pagedkv::ExtendKernel::kMma16);
  }
  return pagedkv::paged_extend_attention(p, stream, variant.kernel, variant.plan, variant.workspace,
                                         variant.workspace_bytes);
}

// The suffix of a variant's RESULT / CHECK names ("" for kMma16, the first kernel).
const char* variant_suffix(pagedkv::ExtendKernel kernel) {
  switch (kernel) {
    case pagedkv::ExtendKernel::kFa2:
      return "_fa2";
    case pagedkv::ExtendKernel::kWgmma:
      return "_wgmma";
    case pagedkv::ExtendKernel::kWgmmaPipelined:
      return "_wgmma_pipelined";
    case pagedkv::ExtendKernel::kWgmmaWarpSpecialized:
      return "_wgmma_ws";
    case pagedkv::ExtendKernel::kWgmmaWarpSpecializedPingPong:
      return "_wgmma_ws_pingpong";
    case pagedkv::ExtendKernel::kWgmmaWarpSpecializedPersistent:
      return "_wgmma_ws_persistent";
    case pagedkv::ExtendKernel::kFa2LeanSoftmax:
      return "_fa2_lean";
    default:
      return "";
  }
}

// The after-timing check of a shape: the last sequence's first and last kSampleRows new rows,
// attended on the CPU from the device's own blocks and q. The reference depends only on the
// shape and its table, which every variant's run of the shape reproduces (the same random
// state), so it is computed once per shape and reused while the sampled sequence's block ids
// stay the same (recomputed when they differ).
constexpr int kSampleRows = 2;

struct ExtendSample {
  std::vector<std::int32_t> ids;   // the sampled sequence's row of the timed table
  std::vector<std::int32_t> rows;  // the sampled rows' indices among the batch's new rows
  std::vector<double> ref;         // [rows, q heads, head_dim]
};

// Counts of the after-timing checks (every variant, every shape).
struct AfterTiming {
  int checks = 0;
  int failures = 0;
};

// The sampled sequence (`ids`: its blocks in the timed table) and its sampled q rows, copied back
// from the device on the calling thread; compute() touches only host memory (one thread per KV
// head, reference_by_head.hpp; it may run while the GPU is timed) and returns the sample with its
// CPU reference: two one-sequence problems over the sequence's blocks, its first kSampleRows new
// rows (keys [0, cached + row]) and its last kSampleRows (keys [0, prompt)).
struct SampleInput {
  SampleInput(const Workspace& ws, const Shape& shape, const std::vector<std::int32_t>& ids)
      : layout(
            KVLayout::nhd(static_cast<std::int64_t>(ids.size()), kBlockSize, kKVHeads, kHeadDim)) {
    sample.ids = ids;
    const int fresh = shape.prompt - shape.cached;
    const int seq = shape.num_seqs - 1;
    first = std::min(kSampleRows, fresh);
    last = std::min(kSampleRows, fresh - first);
    cached = shape.cached;
    prompt = shape.prompt;
    for (int r = 0; r < first; ++r) sample.rows.push_back(seq * fresh + r);
    for (int r = fresh - last; r < fresh; ++r) sample.rows.push_back(seq * fresh + r);
    const auto block_elems = static_cast<std::size_t>(ws.layout.stride_block);  // = layout's
    k = bench::download_blocks(ws.k, block_elems, ids.data(), ids.size(), kProgram);
    v = bench::download_blocks(ws.v, block_elems, ids.data(), ids.size(), kProgram);
    const std::size_t q_row = std::size_t{kQHeads} * kHeadDim;
    q.resize(sample.rows.size() * q_row);
    for (std::size_t i = 0; i < sample.rows.size(); ++i) {
      CHECK(cudaMemcpy(q.data() + i * q_row,
                       static_cast<const std::uint16_t*>(ws.q) +
                           static_cast<std::size_t>(sample.rows[i]) * q_row,
                       q_row * 2, cudaMemcpyDeviceToHost));
    }
  }
  ExtendSample compute() const {
    const auto num_blocks = static_cast<std::int32_t>(layout.num_blocks);
    std::vector<std::int32_t> table(2 * static_cast<std::size_t>(num_blocks));
    for (std::size_t b = 0; b < table.size(); ++b) {
      table[b] = static_cast<std::int32_t>(b % static_cast<std::size_t>(num_blocks));
    }
    const std::vector<std::int32_t> indptr = {0, first, first + last};
    const std::vector<std::int32_t> lens = {cached + first, prompt};
    pagedkv::PagedExtendParams p;
    p.dtype = kDtype;
    p.num_seqs = 2;
    p.num_q_heads = kQHeads;
    p.q_indptr = indptr.data();
    p.max_q_len = std::max(first, last);
    p.q = q.data();
    p.k_cache = k.data();
    p.v_cache = v.data();
    p.layout = layout;
    p.block_table = table.data();
    p.max_blocks_per_seq = num_blocks;
    p.seq_lens = lens.data();
    p.sm_scale = kSmScale;
    ExtendSample out = sample;
    out.ref = bench::extend_reference_by_kv_head(p);
    return out;
  }
  KVLayout layout;
  ExtendSample sample;  // ids and rows; ref filled by compute()
  int first = 0, last = 0, cached = 0, prompt = 0;
  std::vector<std::uint16_t> k, v, q;
};

double run_shape(const Workspace& ws, const Shape& shape, cudaStream_t stream, int repeats,
                 std::mt19937_64& rng, Variant& variant, ExtendSample& sample, AfterTiming& after) {
  const int blocks_per_seq = (shape.prompt + kBlockSize - 1) / kBlockSize;
  const auto cells = static_cast<std::size_t>(shape.num_seqs) * blocks_per_seq;
  // Two tables of distinct blocks: the timed one, then the warm-up's.
  std::vector<std::int32_t> ids(2 * cells);
  std::iota(ids.begin(), ids.end(), 0);
  if (shape.shuffled) {
    // Any blocks of the pool, in random order.
    std::vector<std::int32_t> pool(static_cast<std::size_t>(ws.layout.num_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    std::copy(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(ids.size()), ids.begin());
  }
  const int fresh = shape.prompt - shape.cached;
  std::vector<std::int32_t> indptr(static_cast<std::size_t>(shape.num_seqs) + 1);
  for (int s = 0; s <= shape.num_seqs; ++s) indptr[static_cast<std::size_t>(s)] = s * fresh;
  const std::vector<std::int32_t> lens(static_cast<std::size_t>(shape.num_seqs), shape.prompt);
  CHECK(cudaMemcpy(ws.table, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(ws.indptr, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(ws.lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));

  pagedkv::PagedExtendParams p;
  p.dtype = kDtype;
  p.num_seqs = shape.num_seqs;
  p.num_q_heads = kQHeads;
  p.q_indptr = ws.indptr;
  p.max_q_len = fresh;
  p.q = ws.q;
  p.k_cache = ws.k;
  p.v_cache = ws.v;
  p.layout = ws.layout;
  p.block_table = ws.table;
  p.max_blocks_per_seq = blocks_per_seq;
  p.seq_lens = ws.lens;
  p.out = ws.out;
  p.sm_scale = kSmScale;
  pagedkv::PagedExtendParams warm = p;
  warm.q = static_cast<const unsigned char*>(ws.q) + ws.q_half_bytes;
  warm.block_table = ws.table + cells;
  prepare(p, variant);
  // The sample's reference (once per shape) is computed on another host thread while the GPU
  // is timed.
  const auto sampled =
      ids.begin() + static_cast<std::ptrdiff_t>(shape.num_seqs - 1) * blocks_per_seq;
  const std::vector<std::int32_t> sample_ids(sampled, sampled + blocks_per_seq);
  std::unique_ptr<const SampleInput> input;
  std::future<ExtendSample> next;
  if (sample.ids != sample_ids) {
    input = std::make_unique<const SampleInput>(ws, shape, sample_ids);
    next = std::async(std::launch::async, [&input] { return input->compute(); });
  }
  const double ms = median_ms(
      stream, repeats, 3, [&] { CHECK(launch(warm, stream, variant)); },
      [&] { CHECK(launch(p, stream, variant)); });
  if (next.valid()) sample = next.get();
  // After timing: once more, through the same workspace, with the output and workspace
  // poisoned (NaN) first, so a row or partial result left from the timed launches fails.
  CHECK(cudaMemsetAsync(ws.out, 0xff, ws.q_half_bytes, stream));
  if (variant.workspace != nullptr) {
    CHECK(cudaMemsetAsync(variant.workspace, 0xff, variant.workspace_bytes, stream));
  }
  CHECK(launch(p, stream, variant));
  CHECK(cudaStreamSynchronize(stream));
  const std::size_t q_row = std::size_t{kQHeads} * kHeadDim;
  std::vector<std::uint16_t> out(sample.rows.size() * q_row);
  for (std::size_t i = 0; i < sample.rows.size(); ++i) {
    CHECK(cudaMemcpy(out.data() + i * q_row,
                     static_cast<const std::uint16_t*>(ws.out) +
                         static_cast<std::size_t>(sample.rows[i]) * q_row,
                     q_row * 2, cudaMemcpyDeviceToHost));
  }
  const double err = bench::max_row_error(bench::to_doubles(kDtype, out), sample.ref, kHeadDim);
  const bool pass = err <= kRowTolerance;
  ++after.checks;
  if (!pass) ++after.failures;
  std::printf(
      "CHECK extend_after_timing%s seqs=%d prompt=%d cached=%d table=%s splits=%d rows=%zu "
      "max_row_error=%.3g tolerance=%.0e %s\n",
      variant_suffix(variant.kernel), shape.num_seqs, shape.prompt, shape.cached,
      shape.shuffled ? "paged" : "identity", variant.plan.num_splits, sample.rows.size(), err,
      kRowTolerance, pass ? "PASS" : "FAIL");
  return ms;
}

// Extend attention on a small random case (3 sequences: a plain prefill, a cached prefix ending
// mid-block, one new token after a long prefix; shuffled blocks) against the CPU reference.
bool check_against_reference(cudaStream_t stream, pagedkv::ExtendKernel kernel, int splits) {
  bench::Random rng(2025);
  const std::vector<std::int32_t> prefix = {0, 37, 700};
  const std::vector<std::int32_t> fresh = {150, 90, 1};
  std::vector<std::int32_t> lens;
  std::vector<std::int32_t> indptr = {0};
  std::int32_t max_q_len = 0;
  std::int32_t blocks = 0;
  std::int32_t max_blocks = 0;
  for (std::size_t s = 0; s < prefix.size(); ++s) {
    lens.push_back(prefix[s] + fresh[s]);
    indptr.push_back(indptr.back() + fresh[s]);
    max_q_len = std::max(max_q_len, fresh[s]);
    const std::int32_t n = (lens.back() + kBlockSize - 1) / kBlockSize;
    blocks += n;
    max_blocks = std::max(max_blocks, n);
  }
  const std::int32_t num_blocks = blocks + 4;
  std::vector<std::int32_t> perm(static_cast<std::size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  for (std::size_t i = perm.size() - 1; i > 0; --i) {
    std::swap(perm[i], perm[rng.next() % (i + 1)]);
  }
  const auto seqs = static_cast<std::int32_t>(prefix.size());
  std::vector<std::int32_t> table(static_cast<std::size_t>(seqs * max_blocks), perm.back());
  std::int32_t next = 0;
  for (std::int32_t s = 0; s < seqs; ++s) {
    for (std::int32_t b = 0; b < (lens[static_cast<std::size_t>(s)] + kBlockSize - 1) / kBlockSize;
         ++b) {
      table[static_cast<std::size_t>(s * max_blocks + b)] = perm[static_cast<std::size_t>(next++)];
    }
  }
  const KVLayout layout = KVLayout::nhd(num_blocks, kBlockSize, kKVHeads, kHeadDim);
  const auto plane = static_cast<std::size_t>(layout.plane_elements());
  const auto k = bench::random_values(kDtype, plane, rng);
  const auto v = bench::random_values(kDtype, plane, rng);
  const auto q = bench::random_values(
      kDtype, static_cast<std::size_t>(indptr.back()) * kQHeads * kHeadDim, rng);
  pagedkv::PagedExtendParams p;
  p.dtype = kDtype;
  p.num_seqs = seqs;
  p.num_q_heads = kQHeads;
  p.q_indptr = indptr.data();
  p.max_q_len = max_q_len;
  p.q = q.data();
  p.k_cache = k.data();
  p.v_cache = v.data();
  p.layout = layout;
  p.block_table = table.data();
  p.max_blocks_per_seq = max_blocks;
  p.seq_lens = lens.data();
  p.sm_scale = kSmScale;
  const pagedkv::ExtendReference ref = pagedkv::reference_paged_extend_attention_f64(p);

  void* ptrs[7] = {};
  const std::size_t sizes[7] = {plane * 2,        plane * 2,         q.size() * 2,   q.size() * 2,
                                table.size() * 4, indptr.size() * 4, lens.size() * 4};
  const void* host[7] = {k.data(),     v.data(),      q.data(),   nullptr,
                         table.data(), indptr.data(), lens.data()};
  for (int i = 0; i < 7; ++i) {
    CHECK(cudaMalloc(&ptrs[i], sizes[i]));
    if (host[i] != nullptr) CHECK(cudaMemcpy(ptrs[i], host[i], sizes[i], cudaMemcpyHostToDevice));
  }
  CHECK(cudaMemset(ptrs[3], 0xff, sizes[3]));  // NaN: unwritten rows fail
  p.k_cache = ptrs[0];
  p.v_cache = ptrs[1];
  p.q = ptrs[2];
  p.out = ptrs[3];
  p.block_table = static_cast<const std::int32_t*>(ptrs[4]);
  p.q_indptr = static_cast<const std::int32_t*>(ptrs[5]);
  p.seq_lens = static_cast<const std::int32_t*>(ptrs[6]);
  pagedkv::ExtendSplitPlan plan;
  if (kernel == pagedkv::ExtendKernel::kWgmmaWarpSpecializedPersistent) {
    // Its CTAs from the planner, but at most 3, so that each runs several items.
    CHECK(pagedkv::extend_split_plan_for_current_device(p, kernel, &plan));
    plan.persistent_ctas = std::min(plan.persistent_ctas, 3);
  }
  plan.num_splits = splits;
  void* workspace = nullptr;
  const std::size_t workspace_bytes = pagedkv::extend_workspace_bytes(p, plan);
  if (workspace_bytes > 0) CHECK(cudaMalloc(&workspace, workspace_bytes));
  CHECK(pagedkv::paged_extend_attention(p, stream, kernel, plan, workspace, workspace_bytes));
  CHECK(cudaStreamSynchronize(stream));
  const char* name = variant_suffix(kernel);
  const bool opt_in =
      kernel != pagedkv::ExtendKernel::kMma16 && kernel != pagedkv::ExtendKernel::kFa2;
  if (opt_in && splits == 1) {
    std::printf("RESULT extend%s_runs kernel=%s (no: its kFa2 fallback ran and is timed)\n", name,
                pagedkv::extend_kernel_runs(p, kernel) ? "yes" : "no");
  }
  std::vector<std::uint16_t> out(q.size());
  CHECK(cudaMemcpy(out.data(), ptrs[3], sizes[3], cudaMemcpyDeviceToHost));
  for (void* ptr : ptrs) CHECK(cudaFree(ptr));
  if (workspace != nullptr) CHECK(cudaFree(workspace));
  const double err = bench::max_row_error(bench::to_doubles(kDtype, out), ref.out, kHeadDim);
  const bool pass = err <= kRowTolerance;
  std::printf("CHECK extend_attention%s%s max_row_error=%.3g tolerance=%.0e %s\n", name,
              splits > 1 ? "_split" : "", err, kRowTolerance, pass ? "PASS" : "FAIL");
  return pass;
}

double attention_tflops(const Shape& shape, double ms) {
  const double flops =
      4.0 * shape.num_seqs * visible_pairs(shape.prompt, shape.cached) * kHeadDim * kQHeads;
  return flops / (ms * 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (argc > 1 && !quick) {
    std::fprintf(stderr, "usage: bench_extend_attention [--quick]\n");
    return 2;
  }
  int devices = 0;
  try {
    devices = pagedkv::cuda_device_count();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_extend_attention: %s\n", e.what());
    return 1;
  }
  if (devices == 0) {
    std::printf("bench_extend_attention: no CUDA device visible; nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t cublas = nullptr;
  CHECK(cublasCreate(&cublas));
  CHECK(cublasSetStream(cublas, stream));

  // ---- correctness first: nothing is timed unless the kernel is right here ----
  bool checked = check_against_reference(stream, pagedkv::ExtendKernel::kMma16, 1);
  checked = check_against_reference(stream, pagedkv::ExtendKernel::kFa2, 1) && checked;
  checked = check_against_reference(stream, pagedkv::ExtendKernel::kFa2, 3) && checked;
  if (!checked) {
    std::printf(
        "bench_extend_attention: the check against the CPU reference failed; "
        "nothing timed\n");
    return 1;
  }

  const int repeats = quick ? 3 : 11;
  const int prompt = quick ? 1024 : 8192;
  const double g = gemm_tflops(cublas, stream, quick ? 2048 : 8192, repeats);
  std::printf(
      "# %s, %d SMs; pagedkv extend attention (bf16, %d q heads, %d KV heads, head_dim %d, "
      "block %d)\n",
      prop.name, prop.multiProcessorCount, kQHeads, kKVHeads, kHeadDim, kBlockSize);
  std::printf("# G = cuBLAS bf16 GEMM %d^3 on random data: %.0f TFLOP/s\n\n", quick ? 2048 : 8192,
              g);
  std::printf("RESULT gemm n=%d tflops=%.1f\n", quick ? 2048 : 8192, g);

  // A pool twice the largest batch, so shuffled tables scatter over it.
  const int max_seqs = quick ? 2 : 4;
  const std::int64_t blocks = 2 * static_cast<std::int64_t>(max_seqs) * prompt / kBlockSize;
  Workspace ws;
  ws.layout = KVLayout::nhd(blocks, kBlockSize, kKVHeads, kHeadDim);
  const auto plane_bytes = static_cast<std::size_t>(ws.layout.plane_elements()) * 2;
  const auto q_bytes = static_cast<std::size_t>(max_seqs) * prompt * kQHeads * kHeadDim * 2;
  ws.q_half_bytes = q_bytes;
  CHECK(cudaMalloc(&ws.k, plane_bytes));
  CHECK(cudaMalloc(&ws.v, plane_bytes));
  CHECK(cudaMalloc(&ws.q, 2 * q_bytes));
  CHECK(cudaMalloc(&ws.out, q_bytes));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&ws.table), static_cast<std::size_t>(blocks) * 4));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&ws.indptr), (max_seqs + 1) * 4));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&ws.lens), max_seqs * 4));
  // Random bf16 values in [-1, 1): constant data would make the math unrealistically cheap.
  bench::fill_random(ws.k, plane_bytes, kDtype, 11, kProgram);
  bench::fill_random(ws.v, plane_bytes, kDtype, 12, kProgram);
  bench::fill_random(ws.q, 2 * q_bytes, kDtype, 13, kProgram);
  std::mt19937_64 rng(1);

  // Both variants on every shape, alternately in this run (A/B): kMma16, then kFa2.
  Variant mma16;
  Variant fa2;
  fa2.kernel = pagedkv::ExtendKernel::kFa2;
  // Every shape again for ExtendKernel::kWgmma at the end (its tables' random state and kFa2's
  // time kept): an opt-in kernel that fails or faults then costs none of the figures above.
  struct Later {
    Shape shape;
    std::mt19937_64 rng;
    double fa2_ms;
    bool table1;
    ExtendSample sample;  // the after-timing check's rows and reference
  };
  AfterTiming after;
  std::vector<Later> later;
  std::printf(
      "| seqs | prompt | cached | table | ms | TFLOP/s | / G | paged / identity time | fa2 ms | "
      "fa2 / G | fa2 splits | fa2 / default time |\n");
  std::printf("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<double> ratios;      // table 1: the target's shapes
  std::vector<double> fa2_ratios;  // the same for kFa2
  std::vector<double> fa2_times;   // kFa2 time / default time, every shape of both tables
  for (const int num_seqs : quick ? std::vector<int>{1} : std::vector<int>{1, 4}) {
    for (const double cached_fraction : {0.0, 0.25, 0.5}) {
      double identity_ms = 0.0;
      for (const bool shuffled : {false, true}) {
        const Shape shape{num_seqs, prompt, static_cast<int>(cached_fraction * prompt), shuffled};
        std::mt19937_64 fa2_rng = rng;                 // the same tables for every variant
        later.push_back({shape, rng, 0.0, true, {}});  // kWgmma's run, at the end
        ExtendSample& sample = later.back().sample;
        const double ms = run_shape(ws, shape, stream, repeats, rng, mma16, sample, after);
        const double fa2_ms = run_shape(ws, shape, stream, repeats, fa2_rng, fa2, sample, after);
        later.back().fa2_ms = fa2_ms;
        if (!shuffled) identity_ms = ms;
        const double tflops = attention_tflops(shape, ms);
        const double fa2_tflops = attention_tflops(shape, fa2_ms);
        char ratio[32] = "";
        if (shuffled) std::snprintf(ratio, sizeof(ratio), "%.3f", ms / identity_ms);
        std::printf("| %d | %d | %d | %s | %.3f | %.1f | %.2f | %s | %.3f | %.2f | %d | %.3f |\n",
                    num_seqs, prompt, shape.cached, shuffled ? "paged" : "identity", ms, tflops,
                    tflops / g, ratio, fa2_ms, fa2_tflops / g, fa2.plan.num_splits, fa2_ms / ms);
        std::printf(
            "RESULT extend seqs=%d prompt=%d cached=%d table=%s ms=%.4f tflops=%.1f "
            "ratio_gemm=%.3f\n",
            num_seqs, prompt, shape.cached, shuffled ? "paged" : "identity", ms, tflops,
            tflops / g);
        std::printf(
            "RESULT extend_fa2 seqs=%d prompt=%d cached=%d table=%s ms=%.4f tflops=%.1f "
            "ratio_gemm=%.3f splits=%d time_vs_default=%.3f\n",
            num_seqs, prompt, shape.cached, shuffled ? "paged" : "identity", fa2_ms, fa2_tflops,
            fa2_tflops / g, fa2.plan.num_splits, fa2_ms / ms);
        ratios.push_back(tflops / g);
        fa2_ratios.push_back(fa2_tflops / g);
        fa2_times.push_back(fa2_ms / ms);
        std::fflush(stdout);
      }
    }
  }

  std::printf(
      "\n## Prefill saved: one %d-token prompt, H tokens cached (paged table)\n\n"
      "| H/P | H | ms | time / time(H=0) | work / work(H=0) | uncached tokens | TFLOP/s | / G |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|\n",
      prompt);
  double full_ms = 0.0;
  std::vector<double> cached_ratios;      // kMma16 at 80% and 90% cached
  std::vector<double> fa2_cached_ratios;  // the same for kFa2
  for (int tenth = 0; tenth <= 9; ++tenth) {
    const Shape shape{1, prompt, prompt * tenth / 10, true};
    std::mt19937_64 fa2_rng = rng;
    later.push_back({shape, rng, 0.0, false, {}});
    ExtendSample& sample = later.back().sample;
    const double ms = run_shape(ws, shape, stream, repeats, rng, mma16, sample, after);
    const double fa2_ms = run_shape(ws, shape, stream, repeats, fa2_rng, fa2, sample, after);
    later.back().fa2_ms = fa2_ms;
    fa2_times.push_back(fa2_ms / ms);
    if (tenth == 0) full_ms = ms;
    const double tflops = attention_tflops(shape, ms);
    std::printf("| %.1f | %d | %.3f | %.3f | %.3f | %.1f | %.1f | %.2f |\n", tenth / 10.0,
                shape.cached, ms, ms / full_ms,
                visible_pairs(prompt, shape.cached) / visible_pairs(prompt, 0), 1.0 - tenth / 10.0,
                tflops, tflops / g);
    std::printf(
        "RESULT extend_saved prompt=%d cached=%d ms=%.4f time_ratio=%.3f work_ratio=%.3f "
        "tflops=%.1f ratio_gemm=%.3f\n",
        prompt, shape.cached, ms, ms / full_ms,
        visible_pairs(prompt, shape.cached) / visible_pairs(prompt, 0), tflops, tflops / g);
    const double fa2_tflops = attention_tflops(shape, fa2_ms);
    if (tenth >= 8) {
      cached_ratios.push_back(tflops / g);
      fa2_cached_ratios.push_back(fa2_tflops / g);
    }
    std::printf(
        "RESULT extend_fa2_saved prompt=%d cached=%d ms=%.4f tflops=%.1f ratio_gemm=%.3f "
        "splits=%d time_vs_default=%.3f\n",
        prompt, shape.cached, fa2_ms, fa2_tflops, fa2_tflops / g, fa2.plan.num_splits, fa2_ms / ms);
    std::fflush(stdout);
  }

  // ---- the targets: table 1's shapes at >= 0.60 x G, 80-90% cached at >= 0.45 x G ----
  // Every variant gets both lines: the default kernel's (kDefaultExtendKernel: kFa2 since the
  // H200 run of 2026-12-04, evening) are TARGET extend_vs_gemm and extend_cached_vs_gemm, the
  // others' carry the variant's name (extend_mma16_vs_gemm, extend_fa2_vs_gemm,
  // extend_wgmma_ws_vs_gemm, ...), whichever variant is the default.
  const auto target_lines = [&](pagedkv::ExtendKernel kernel, const char* name,
                                const std::vector<double>& table1,
                                const std::vector<double>& cached, const char* what) {
    const bool is_default = kernel == pagedkv::kDefaultExtendKernel;
    const std::string prefix = is_default ? std::string("extend") : std::string("extend_") + name;
    const auto line = [&](const std::string& target, const std::vector<double>& r, double threshold,
                          const char* shapes) {
      if (r.empty()) return;
      const double worst = *std::min_element(r.begin(), r.end());
      std::printf(
          "TARGET %s value=%.3f target=%.2f met=%s shapes=%zu median=%.3f best=%.3f (%s%s, worst "
          "of %s)\n",
          target.c_str(), worst, threshold, worst >= threshold ? "yes" : "no", r.size(),
          bench::median(r), *std::max_element(r.begin(), r.end()),
          is_default ? "the default, " : "", what, shapes);
    };
    line(prefix + "_vs_gemm", table1, kTarget, "table 1's shapes");
    line(prefix + "_cached_vs_gemm", cached, kTargetCached, "table 2's 80% and 90% cached");
  };
  std::printf("\n");
  target_lines(pagedkv::ExtendKernel::kFa2, "fa2", fa2_ratios, fa2_cached_ratios,
               "ExtendKernel::kFa2");
  target_lines(pagedkv::ExtendKernel::kMma16, "mma16", ratios, cached_ratios,
               "ExtendKernel::kMma16");
  std::printf(
      "RESULT extend_variants fa2_time_vs_mma16 median=%.3f worst=%.3f best=%.3f shapes=%zu "
      "(same run, alternating; < 1 = kFa2 faster)\n",
      bench::median(fa2_times), *std::max_element(fa2_times.begin(), fa2_times.end()),
      *std::min_element(fa2_times.begin(), fa2_times.end()), fa2_times.size());
  std::fflush(stdout);

  // ---- the kWgmma variants (issue 35 step B, opt-in): each checked, then every shape again on
  // the same tables (a copy of each shape's random state) ----
  struct WgmmaRun {
    pagedkv::ExtendKernel kernel;
    const char* name;  // RESULT / TARGET names: extend_<name>, extend_<name>_saved, ...
  };
  for (const WgmmaRun& run :
       {WgmmaRun{pagedkv::ExtendKernel::kWgmma, "wgmma"},
        WgmmaRun{pagedkv::ExtendKernel::kWgmmaPipelined, "wgmma_pipelined"},
        WgmmaRun{pagedkv::ExtendKernel::kWgmmaWarpSpecialized, "wgmma_ws"},
        WgmmaRun{pagedkv::ExtendKernel::kWgmmaWarpSpecializedPingPong, "wgmma_ws_pingpong"},
        WgmmaRun{pagedkv::ExtendKernel::kWgmmaWarpSpecializedPersistent, "wgmma_ws_persistent"},
        WgmmaRun{pagedkv::ExtendKernel::kFa2LeanSoftmax, "fa2_lean"}}) {
    const bool plain = check_against_reference(stream, run.kernel, 1);
    if (!(check_against_reference(stream, run.kernel, 3) && plain)) continue;
    Variant wg;
    wg.kernel = run.kernel;
    std::vector<double> wgmma_ratios;         // table 1
    std::vector<double> wgmma_cached_ratios;  // table 2 at 80% and 90% cached
    std::vector<double> wgmma_times;          // this variant's time / kFa2's, every shape
    for (Later& l : later) {
      std::mt19937_64 shape_rng = l.rng;
      const double wg_ms = run_shape(ws, l.shape, stream, repeats, shape_rng, wg, l.sample, after);
      const double wg_tflops = attention_tflops(l.shape, wg_ms);
      std::printf(
          "RESULT extend_%s%s seqs=%d prompt=%d cached=%d table=%s ms=%.4f tflops=%.1f "
          "ratio_gemm=%.3f splits=%d time_vs_fa2=%.3f\n",
          run.name, l.table1 ? "" : "_saved", l.shape.num_seqs, l.shape.prompt, l.shape.cached,
          l.shape.shuffled ? "paged" : "identity", wg_ms, wg_tflops, wg_tflops / g,
          wg.plan.num_splits, wg_ms / l.fa2_ms);
      if (l.table1) wgmma_ratios.push_back(wg_tflops / g);
      if (!l.table1 && l.shape.cached * 10 >= l.shape.prompt * 8) {
        wgmma_cached_ratios.push_back(wg_tflops / g);
      }
      wgmma_times.push_back(wg_ms / l.fa2_ms);
      std::fflush(stdout);
    }
    target_lines(run.kernel, run.name, wgmma_ratios, wgmma_cached_ratios,
                 run.kernel == pagedkv::ExtendKernel::kFa2LeanSoftmax
                     ? "kFa2 with the lean softmax, opt-in"
                     : "an sm_90a variant; whether its kernel ran here: RESULT extend_<name>_runs");
    std::printf(
        "RESULT extend_variants %s_time_vs_fa2 median=%.3f worst=%.3f best=%.3f shapes=%zu "
        "(kFa2's times from the tables above; < 1 = faster)\n",
        run.name, bench::median(wgmma_times),
        *std::max_element(wgmma_times.begin(), wgmma_times.end()),
        *std::min_element(wgmma_times.begin(), wgmma_times.end()), wgmma_times.size());
    if (wg.workspace != nullptr) CHECK(cudaFree(wg.workspace));
  }
  if (fa2.workspace != nullptr) CHECK(cudaFree(fa2.workspace));
  std::printf(
      "CHECK extend_after_timing checks=%d failures=%d (every variant on every shape, once more "
      "after its timing, sampled rows against the CPU reference) %s\n",
      after.checks, after.failures, after.failures == 0 ? "PASS" : "FAIL");

  CHECK(cudaFree(ws.k));
  CHECK(cudaFree(ws.v));
  CHECK(cudaFree(ws.q));
  CHECK(cudaFree(ws.out));
  CHECK(cudaFree(ws.table));
  CHECK(cudaFree(ws.indptr));
  CHECK(cudaFree(ws.lens));
  CHECK(cublasDestroy(cublas));
  CHECK(cudaStreamDestroy(stream));
  return after.failures == 0 ? 0 : 1;
}
