// Paged extend attention throughput against a dense bf16 GEMM measured in the same run (GPU only;
// exits 0 with a message when there is no device).
//
// G = cuBLAS bf16 GEMM rate (fp32 accumulation, 8192^3): 2 m n k / time. Attention rate =
// 4 x visible (query, key) pairs x head_dim x q_heads / time, where a prompt of P tokens with H
// cached has (P - H) x H + (P - H)(P - H + 1) / 2 visible pairs per head (causal, bottom-right).
// Shapes like Llama-3-8B (32 query heads, 8 KV heads, head_dim 128, bf16), block size 16. Tables:
//   1. 8k-token prompts with 0-50% cached, paged (shuffled block table) and identity table.
//   2. "Prefill saved": the same 8k prompt with H/P from 0 to 0.9; time should fall like the
//      uncached work (visible pairs), not like the uncached token count.
// Times are CUDA-event medians over repeats.
//
// Usage: bench_extend_attention [--quick]   (--quick: a 1k prompt, for smoke tests)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "pagedkv/cuda/device.hpp"
#include "pagedkv/cuda/extend_attention.hpp"
#include "pagedkv/device/kv_layout.hpp"

namespace {

using pagedkv::KVDtype;
using pagedkv::KVLayout;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "bench_extend_attention: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
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

// Median over `repeats` of the per-call milliseconds of `calls` back-to-back launches.
template <typename Launch>
double median_ms(cudaStream_t stream, int repeats, int calls, Launch&& launch) {
  cudaEvent_t begin = nullptr;
  cudaEvent_t end = nullptr;
  CHECK(cudaEventCreate(&begin));
  CHECK(cudaEventCreate(&end));
  launch();  // warm-up (and first-launch attribute setup)
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
  std::nth_element(per_call.begin(), per_call.begin() + repeats / 2, per_call.end());
  return per_call[static_cast<std::size_t>(repeats / 2)];
}

// Dense bf16 GEMM rate in TFLOP/s (n x n x n, fp32 accumulation, bf16 output).
double gemm_tflops(cublasHandle_t cublas, cudaStream_t stream, int n, int repeats) {
  const std::size_t bytes = static_cast<std::size_t>(n) * static_cast<std::size_t>(n) * 2;
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMalloc(&c, bytes));
  CHECK(cudaMemset(a, 0x3c, bytes));
  CHECK(cudaMemset(b, 0x3c, bytes));
  const float alpha = 1.0f;
  const float beta = 0.0f;
  const double ms = median_ms(stream, repeats, 5, [&] {
    CHECK(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b,
                       CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT));
  });
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFree(c));
  return 2.0 * n * static_cast<double>(n) * n / (ms * 1e9);
}

// Visible (query, key) pairs of one head of one sequence with `cached` of `prompt` tokens cached.
double visible_pairs(std::int64_t prompt, std::int64_t cached) {
  const double fresh = static_cast<double>(prompt - cached);
  return fresh * static_cast<double>(cached) + fresh * (fresh + 1.0) / 2.0;
}

// Device buffers shared by every shape: a K/V pool, q and out for the longest prompt.
struct Workspace {
  KVLayout layout;
  void* k = nullptr;
  void* v = nullptr;
  void* q = nullptr;
  void* out = nullptr;
  std::int32_t* table = nullptr;   // [num_seqs, blocks_per_seq]
  std::int32_t* indptr = nullptr;  // [num_seqs + 1]
  std::int32_t* lens = nullptr;    // [num_seqs]
};

struct Shape {
  int num_seqs = 1;
  int prompt = 8192;  // tokens per sequence
  int cached = 0;     // of which cached (the prefix hit)
  bool shuffled = true;
};

double run_shape(const Workspace& ws, const Shape& shape, cudaStream_t stream, int repeats,
                 std::mt19937_64& rng) {
  const int blocks_per_seq = (shape.prompt + kBlockSize - 1) / kBlockSize;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(shape.num_seqs) * blocks_per_seq);
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
  p.sm_scale = 0.0883883f;
  return median_ms(stream, repeats, 3, [&] { CHECK(pagedkv::paged_extend_attention(p, stream)); });
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
  if (pagedkv::cuda_device_count() == 0) {
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

  const int repeats = quick ? 3 : 11;
  const int prompt = quick ? 1024 : 8192;
  const double g = gemm_tflops(cublas, stream, quick ? 2048 : 8192, repeats);
  std::printf(
      "# %s, %d SMs; pagedkv extend attention (bf16, %d q heads, %d KV heads, head_dim %d, "
      "block %d)\n",
      prop.name, prop.multiProcessorCount, kQHeads, kKVHeads, kHeadDim, kBlockSize);
  std::printf("# G = cuBLAS bf16 GEMM %d^3: %.0f TFLOP/s\n\n", quick ? 2048 : 8192, g);

  // A pool twice the largest batch, so shuffled tables scatter over it.
  const int max_seqs = quick ? 2 : 4;
  const std::int64_t blocks = 2 * static_cast<std::int64_t>(max_seqs) * prompt / kBlockSize;
  Workspace ws;
  ws.layout = KVLayout::nhd(blocks, kBlockSize, kKVHeads, kHeadDim);
  const auto plane_bytes = static_cast<std::size_t>(ws.layout.plane_elements()) * 2;
  const auto q_bytes = static_cast<std::size_t>(max_seqs) * prompt * kQHeads * kHeadDim * 2;
  CHECK(cudaMalloc(&ws.k, plane_bytes));
  CHECK(cudaMalloc(&ws.v, plane_bytes));
  CHECK(cudaMalloc(&ws.q, q_bytes));
  CHECK(cudaMalloc(&ws.out, q_bytes));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&ws.table), static_cast<std::size_t>(blocks) * 4));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&ws.indptr), (max_seqs + 1) * 4));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&ws.lens), max_seqs * 4));
  // bf16 0x3c3c (about 0.0115) everywhere: finite, and timing does not depend on values.
  CHECK(cudaMemset(ws.k, 0x3c, plane_bytes));
  CHECK(cudaMemset(ws.v, 0x3c, plane_bytes));
  CHECK(cudaMemset(ws.q, 0x3c, q_bytes));
  std::mt19937_64 rng(1);

  std::printf("| seqs | prompt | cached | table | ms | TFLOP/s | / G | paged / identity time |\n");
  std::printf("|---:|---:|---:|---|---:|---:|---:|---:|\n");
  for (const int num_seqs : quick ? std::vector<int>{1} : std::vector<int>{1, 4}) {
    for (const double cached_fraction : {0.0, 0.25, 0.5}) {
      double identity_ms = 0.0;
      for (const bool shuffled : {false, true}) {
        const Shape shape{num_seqs, prompt, static_cast<int>(cached_fraction * prompt), shuffled};
        const double ms = run_shape(ws, shape, stream, repeats, rng);
        if (!shuffled) identity_ms = ms;
        const double tflops = attention_tflops(shape, ms);
        char ratio[32] = "";
        if (shuffled) std::snprintf(ratio, sizeof(ratio), "%.3f", ms / identity_ms);
        std::printf("| %d | %d | %d | %s | %.3f | %.1f | %.2f | %s |\n", num_seqs, prompt,
                    shape.cached, shuffled ? "paged" : "identity", ms, tflops, tflops / g, ratio);
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
  for (int tenth = 0; tenth <= 9; ++tenth) {
    const Shape shape{1, prompt, prompt * tenth / 10, true};
    const double ms = run_shape(ws, shape, stream, repeats, rng);
    if (tenth == 0) full_ms = ms;
    const double tflops = attention_tflops(shape, ms);
    std::printf("| %.1f | %d | %.3f | %.3f | %.3f | %.1f | %.1f | %.2f |\n", tenth / 10.0,
                shape.cached, ms, ms / full_ms,
                visible_pairs(prompt, shape.cached) / visible_pairs(prompt, 0), 1.0 - tenth / 10.0,
                tflops, tflops / g);
    std::fflush(stdout);
  }

  CHECK(cudaFree(ws.k));
  CHECK(cudaFree(ws.v));
  CHECK(cudaFree(ws.q));
  CHECK(cudaFree(ws.out));
  CHECK(cudaFree(ws.table));
  CHECK(cudaFree(ws.indptr));
  CHECK(cudaFree(ws.lens));
  CHECK(cublasDestroy(cublas));
  CHECK(cudaStreamDestroy(stream));
  return 0;
}
