// Decode attention and copy_blocks bandwidth against a device-to-device copy measured in the same
// run (GPU only; exits 0 with a message when there is no device).
//
// Before anything is timed, a small case on random data is checked against the CPU reference
// (every output row within 1e-2 relative, bf16; split-KV off and planned) and copy_blocks against
// its reference, bit for bit; a failed check exits 1 without timing.
//
// C (copy bandwidth) = 2 x bytes / time of one cudaMemcpyAsync device-to-device of 1 GiB (each
// byte is read once and written once). Decode attention bandwidth = (unique K/V bytes read + q +
// out) / time. Shapes like Llama-3-8B (32 query heads, 8 KV heads, head_dim 128, bf16); batch 1, 8,
// 64, 256; context 1k..32k; block size 16 and 64; identity and shuffled block tables; and
// mixed-length batches (8, 64, 256 sequences of 256..32,768 tokens drawn log-uniformly, shuffled
// tables, context "mixed"; their bytes are their tokens', and those with >= 1 GiB count toward
// the target like the others); and several query tokens per sequence (q_len 2 and 4:
// speculative decoding's drafts, the tensor-core variants; batch 1, 8 and 64, shuffled tables,
// block 16; RESULT decode_multi_query gives each one's time against the same shape's one-token
// time; not counted toward the targets); K/V, q are random. Every timed launch reads a
// different copy of the batch's blocks (at least 1 GiB in rotation), so L2 never serves K/V from
// a previous launch; the warm-up launches read copies the timed launches reach last (or never).
// Shapes with under 256 MiB of K/V per launch are timed as replays of a CUDA graph of up to 64
// launches (so the launch path is not what is measured); larger ones launch directly. Times are
// CUDA-event medians over repeats.
//
// R (read-only streaming) = bytes / time of one kernel that only reads 1 GiB (read_bandwidth.hpp):
// decode only reads K/V, so R is its own ceiling, measured in the same run beside C.
//
// Every decode kernel variant runs on every shape in the same run (DecodeKernel::kSimt,
// kTensorCore, kTensorCoreWideMerge, the default since the 2026-12-04 evening run, and
// kTensorCoreFusedMerge), each with its own split plan, timed back to back (the order rotates
// from shape to shape); each is checked against the CPU reference before anything is timed (the
// fused merge's split counters zeroed once per shape and checked zero again after the check).
// And after it is timed on a shape, each variant runs once more on that shape (the rotation's
// first copy, the same workspace and split counters, output and workspace poisoned first), and
// the last sequence's rows are checked against the CPU reference computed from the device's own
// blocks (CHECK decode_after_timing, one line per variant and shape and a summary; the counters
// are checked zero after every shape): so every timed shape is checked, at its own length, block
// size and table, in the state the timing left. A failure there exits 1 after the report.
// RESULT decode_variants gives simt / tensor-core time over every shape, tensor-core /
// wide-merge time and wide-merge / fused-merge time over the split-KV shapes.
//
// Target (docs/figures.md): decode >= 0.85 x C on the bandwidth-bound shapes (>= 1 GiB of K/V
// per launch): TARGET decode_vs_copy (the default kernel, kDefaultDecodeKernel), TARGET
// decode_vs_read (against R), and the same for the other variant under its name
// (decode_simt_*, decode_tc_*, decode_wide_merge_* while another kernel is the default,
// decode_fused_merge_*); batch 1
// at 4,096 tokens >= 0.5 x C (decode_b1_4k_vs_copy and each variant's). Every figure is
// also printed as a RESULT / TARGET / CHECK line (bench_cuda_util.hpp).
//
// Usage: bench_decode_attention [--quick]   (--quick: a few small shapes, for smoke tests)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <future>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_cuda_util.hpp"
#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/device/decode_plan.hpp"
#include "pagedkv/device/kv_layout.hpp"
#include "pagedkv/reference/cache_ops.hpp"
#include "pagedkv/reference/decode_attention.hpp"
#include "read_bandwidth.hpp"
#include "reference_by_head.hpp"

namespace {

using pagedkv::DecodeKernel;
using pagedkv::DecodePlan;
using pagedkv::KVDtype;
using pagedkv::KVLayout;

constexpr const char* kProgram = "bench_decode_attention";
#define CHECK(call) bench::cuda_check((call), #call, kProgram)

constexpr std::int64_t kGiB = std::int64_t{1} << 30;
constexpr int kQHeads = 32;
constexpr int kKVHeads = 8;
constexpr int kHeadDim = 128;
constexpr KVDtype kDtype = KVDtype::kBFloat16;
constexpr double kTarget = 0.85;
constexpr double kRowTolerance = 1e-2;  // bf16, as the GPU tests
constexpr double kTargetB1 = 0.5;       // batch 1, 4,096 tokens
constexpr float kSmScale = 0.0883883f;  // 1 / sqrt(head_dim)
constexpr int kMaxBenchQueryLen = 4;    // query tokens per sequence of the multi-query shapes
constexpr DecodeKernel kKernels[] = {DecodeKernel::kSimt, DecodeKernel::kTensorCore,
                                     DecodeKernel::kTensorCoreWideMerge,
                                     DecodeKernel::kTensorCoreFusedMerge};
constexpr int kNumKernels = 4;
constexpr int kWideMergeIndex = 2;  // kKernels[2]: the plan probes below vary its plan
constexpr int kFusedMergeIndex = 3;

// kTensorCoreFusedMerge's split counters for `states` (sequence, KV head) states, zeroed once;
// every launch leaves them zero (checked after the reference check).
struct SplitCounters {
  explicit SplitCounters(std::int64_t states) : count(states) {
    CHECK(cudaMalloc(reinterpret_cast<void**>(&data),
                     static_cast<std::size_t>(states) * sizeof(std::uint32_t)));
    CHECK(cudaMemset(data, 0, static_cast<std::size_t>(states) * sizeof(std::uint32_t)));
  }
  SplitCounters(const SplitCounters&) = delete;
  SplitCounters& operator=(const SplitCounters&) = delete;
  ~SplitCounters() { (void)cudaFree(data); }
  pagedkv::DecodeSplitCounters get() const { return {data, count}; }
  bool all_zero() const {
    std::vector<std::uint32_t> host(static_cast<std::size_t>(count));
    CHECK(
        cudaMemcpy(host.data(), data, host.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
    return std::all_of(host.begin(), host.end(), [](std::uint32_t c) { return c == 0; });
  }
  std::uint32_t* data = nullptr;
  std::int64_t count = 0;
};

const char* kernel_name(DecodeKernel kernel) {
  switch (kernel) {
    case DecodeKernel::kSimt:
      return "simt";
    case DecodeKernel::kTensorCore:
      return "tensor_core";
    case DecodeKernel::kTensorCoreWideMerge:
      return "tensor_core_wide_merge";
    case DecodeKernel::kTensorCoreFp8:
      return "tensor_core_fp8";
    case DecodeKernel::kTensorCoreFusedMerge:
      return "tensor_core_fused_merge";
    case DecodeKernel::kTensorCoreFp8Direct:
      return "tensor_core_fp8_direct";
  }
  return "unknown";
}

// Median milliseconds of one launch. Each repeat times `per_repeat` back-to-back calls
// launch(call) with call = 0, 1, 2, ... continuing across repeats; the two warm-up calls are
// launch(warmup_call) and launch(warmup_call + 1), indices the caller keeps away from the timed
// ones' first uses.
template <typename Fn>
double time_ms(cudaStream_t stream, int repeats, int per_repeat, int warmup_call, Fn&& launch) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) launch(warmup_call + i);
  CHECK(cudaStreamSynchronize(stream));
  std::vector<double> samples;
  int call = 0;
  for (int r = 0; r < repeats; ++r) {
    CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < per_repeat; ++i) launch(call++);
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(static_cast<double>(ms) / per_repeat);
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return bench::median(samples);
}

// Median milliseconds of one launch, timed as replays of a CUDA graph holding `per_graph`
// launches launch(first), ..., launch(first + per_graph - 1). The warm-up replays a second graph
// of launches starting at `warmup_first` (other inputs).
template <typename Fn>
double time_graph_ms(cudaStream_t stream, int repeats, int per_graph, int first, int warmup_first,
                     Fn&& launch) {
  const auto capture = [&](int from) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < per_graph; ++i) launch(from + i);
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphDestroy(graph));
    return exec;
  };
  cudaGraphExec_t warm = capture(warmup_first);
  cudaGraphExec_t timed = capture(first);
  CHECK(cudaGraphUpload(timed, stream));
  CHECK(cudaGraphLaunch(warm, stream));
  CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(timed, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(static_cast<double>(ms) / per_graph);
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaGraphExecDestroy(warm));
  CHECK(cudaGraphExecDestroy(timed));
  return bench::median(samples);
}

// Decode attention on a small random case (5 sequences of 1..1500 tokens, shuffled blocks)
// against the CPU reference, split-KV off and planned; copy_blocks against its reference.
bool check_against_reference(const pagedkv::DecodePlanOptions (&planners)[kNumKernels],
                             cudaStream_t stream) {
  bench::Random rng(2024);
  const std::vector<std::int32_t> lens = {1, 190, 777, 1500, 64};
  const int seqs = static_cast<int>(lens.size());
  const int block_size = 16;
  std::vector<std::vector<std::int32_t>> rows;
  std::int32_t blocks = 0;
  for (const std::int32_t len : lens) {
    std::vector<std::int32_t> row;
    for (int b = 0; b < (len + block_size - 1) / block_size; ++b) row.push_back(blocks++);
    rows.push_back(row);
  }
  const std::int32_t num_blocks = blocks + 5;
  // Shuffle the physical ids (Fisher-Yates with the benchmark's generator).
  std::vector<std::int32_t> perm(static_cast<std::size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  for (std::size_t i = perm.size() - 1; i > 0; --i) {
    std::swap(perm[i], perm[rng.next() % (i + 1)]);
  }
  std::size_t max_blocks = 0;
  for (auto& row : rows) {
    for (auto& id : row) id = perm[static_cast<std::size_t>(id)];
    max_blocks = std::max(max_blocks, row.size());
  }
  std::vector<std::int32_t> table(static_cast<std::size_t>(seqs) * max_blocks, perm.back());
  for (std::size_t s = 0; s < rows.size(); ++s) {
    std::copy(rows[s].begin(), rows[s].end(),
              table.begin() + static_cast<std::ptrdiff_t>(s * max_blocks));
  }
  const KVLayout layout = KVLayout::nhd(num_blocks, block_size, kKVHeads, kHeadDim);
  const auto plane = static_cast<std::size_t>(layout.plane_elements());
  const auto k = bench::random_values(kDtype, plane, rng);
  const auto v = bench::random_values(kDtype, plane, rng);
  const auto q =
      bench::random_values(kDtype, static_cast<std::size_t>(seqs) * kQHeads * kHeadDim, rng);
  pagedkv::PagedDecodeParams p;
  p.dtype = kDtype;
  p.num_seqs = seqs;
  p.num_q_heads = kQHeads;
  p.q = q.data();
  p.k_cache = k.data();
  p.v_cache = v.data();
  p.layout = layout;
  p.block_table = table.data();
  p.max_blocks_per_seq = static_cast<std::int32_t>(max_blocks);
  p.seq_lens = lens.data();
  p.sm_scale = kSmScale;
  const std::vector<double> ref = pagedkv::reference_paged_decode_attention_f64(p);

  void* k_dev = nullptr;
  void* v_dev = nullptr;
  void* q_dev = nullptr;
  void* out_dev = nullptr;
  void* table_dev = nullptr;
  void* lens_dev = nullptr;
  CHECK(cudaMalloc(&k_dev, plane * 2));
  CHECK(cudaMalloc(&v_dev, plane * 2));
  CHECK(cudaMalloc(&q_dev, q.size() * 2));
  CHECK(cudaMalloc(&out_dev, q.size() * 2));
  CHECK(cudaMalloc(&table_dev, table.size() * 4));
  CHECK(cudaMalloc(&lens_dev, lens.size() * 4));
  CHECK(cudaMemcpy(k_dev, k.data(), plane * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(v_dev, v.data(), plane * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(q_dev, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(table_dev, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(lens_dev, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
  p.q = q_dev;
  p.k_cache = k_dev;
  p.v_cache = v_dev;
  p.block_table = static_cast<const std::int32_t*>(table_dev);
  p.seq_lens = static_cast<const std::int32_t*>(lens_dev);
  p.out = out_dev;
  bool ok = true;
  const SplitCounters counters(std::int64_t{seqs} * kKVHeads);
  for (int kv = 0; kv < kNumKernels; ++kv) {
    const DecodeKernel kernel = kKernels[kv];
    pagedkv::DecodePlanOptions options = planners[kv];
    options.min_chunk_tokens = 64;
    for (const DecodePlan plan :
         {DecodePlan{}, pagedkv::plan_paged_decode(lens, kKVHeads, options)}) {
      const std::size_t ws_bytes = pagedkv::decode_workspace_bytes(plan, seqs, kQHeads, kHeadDim);
      void* workspace = nullptr;
      if (ws_bytes > 0) CHECK(cudaMalloc(&workspace, ws_bytes));
      CHECK(cudaMemsetAsync(out_dev, 0xff, q.size() * 2, stream));  // NaN: unwritten rows fail
      CHECK(pagedkv::paged_decode_attention(p, plan, workspace, ws_bytes, stream, kernel,
                                            counters.get()));
      CHECK(cudaStreamSynchronize(stream));
      std::vector<std::uint16_t> out(q.size());
      CHECK(cudaMemcpy(out.data(), out_dev, out.size() * 2, cudaMemcpyDeviceToHost));
      const double err = bench::max_row_error(bench::to_doubles(kDtype, out), ref, kHeadDim);
      const bool reset = counters.all_zero();
      const bool pass = err <= kRowTolerance && reset;
      ok = ok && pass;
      std::printf(
          "CHECK decode_attention kernel=%s splits=%d max_row_error=%.3g tolerance=%.0e "
          "split_counters=%s %s\n",
          kernel_name(kernel), plan.num_splits, err, kRowTolerance, reset ? "zero" : "NOT-RESET",
          pass ? "PASS" : "FAIL");
      if (workspace != nullptr) CHECK(cudaFree(workspace));
    }
  }

  // copy_blocks over the K and V planes: forks of three blocks, bit for bit.
  // Sources: sequence 1's first blocks; destinations: physical blocks no sequence uses.
  std::vector<pagedkv::BlockPair> pairs;
  for (int i = 0; i < 3; ++i) {
    pairs.push_back({table[max_blocks + static_cast<std::size_t>(i)],
                     perm[static_cast<std::size_t>(blocks + i)]});
  }
  void* pairs_dev = nullptr;
  CHECK(cudaMalloc(&pairs_dev, pairs.size() * sizeof(pagedkv::BlockPair)));
  CHECK(cudaMemcpy(pairs_dev, pairs.data(), pairs.size() * sizeof(pagedkv::BlockPair),
                   cudaMemcpyHostToDevice));
  std::vector<std::uint16_t> k_host = k;
  std::vector<std::uint16_t> v_host = v;
  std::vector<void*> host_planes = {k_host.data(), v_host.data()};
  pagedkv::reference_copy_blocks(host_planes, layout, kDtype, pairs);
  std::vector<void*> dev_planes = {k_dev, v_dev};
  CHECK(pagedkv::copy_blocks(dev_planes, layout, kDtype,
                             static_cast<const pagedkv::BlockPair*>(pairs_dev),
                             static_cast<std::int64_t>(pairs.size()), stream));
  CHECK(cudaStreamSynchronize(stream));
  std::vector<std::uint16_t> k_back(plane);
  std::vector<std::uint16_t> v_back(plane);
  CHECK(cudaMemcpy(k_back.data(), k_dev, plane * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(v_back.data(), v_dev, plane * 2, cudaMemcpyDeviceToHost));
  const bool copied = k_back == k_host && v_back == v_host;
  ok = ok && copied;
  std::printf("CHECK copy_blocks bit_exact=%s %s\n", copied ? "yes" : "no",
              copied ? "PASS" : "FAIL");
  for (void* ptr : {k_dev, v_dev, q_dev, out_dev, table_dev, lens_dev, pairs_dev}) {
    CHECK(cudaFree(ptr));
  }
  return ok;
}

struct Device {
  unsigned char* k = nullptr;  // K planes (one big allocation, reused by every shape)
  unsigned char* v = nullptr;
  std::int64_t bytes = 0;  // of each
};

// One sequence of a timed shape copied back from the device: its `num_blocks` blocks (physical
// ids `ids` of the NHD layout `layout` on the device, packed in order) and its q_len x num_q_heads
// q rows, so that exact() attends it on the CPU (reference_paged_decode_attention_f64 through an
// identity table) and returns its [q_len, num_q_heads, head_dim] outputs. The copies are made on
// the calling thread; exact() touches only host memory (one thread per KV head:
// reference_by_head.hpp), so it may run while the GPU is timed.
struct SampledSequence {
  SampledSequence(const Device& dev, const KVLayout& device_layout, const void* q, int seq,
                  const std::int32_t* ids, std::int64_t num_blocks, std::int32_t seq_len,
                  std::int32_t tokens)
      : layout(KVLayout::nhd(num_blocks, device_layout.block_size, device_layout.num_kv_heads,
                             device_layout.head_dim)),
        len(seq_len),
        q_len(tokens) {
    const auto block_elems = static_cast<std::size_t>(device_layout.stride_block);  // = layout's
    const auto n = static_cast<std::size_t>(num_blocks);
    k = bench::download_blocks(dev.k, block_elems, ids, n, kProgram);
    v = bench::download_blocks(dev.v, block_elems, ids, n, kProgram);
    const std::size_t q_rows_n = std::size_t{kQHeads} * kHeadDim * static_cast<std::size_t>(q_len);
    q_rows.resize(q_rows_n);
    CHECK(cudaMemcpy(q_rows.data(), static_cast<const std::uint16_t*>(q) + seq * q_rows_n,
                     q_rows_n * 2, cudaMemcpyDeviceToHost));
  }
  std::vector<double> exact() const {
    std::vector<std::int32_t> table(static_cast<std::size_t>(layout.num_blocks));
    std::iota(table.begin(), table.end(), 0);
    const std::vector<std::int32_t> lens = {len};
    pagedkv::PagedDecodeParams p;
    p.dtype = kDtype;
    p.num_seqs = 1;
    p.num_q_heads = kQHeads;
    p.q_len = q_len;
    p.q = q_rows.data();
    p.k_cache = k.data();
    p.v_cache = v.data();
    p.layout = layout;
    p.block_table = table.data();
    p.max_blocks_per_seq = static_cast<std::int32_t>(layout.num_blocks);
    p.seq_lens = lens.data();
    p.sm_scale = kSmScale;
    return bench::decode_reference_by_kv_head(p);
  }
  KVLayout layout;
  std::int32_t len;
  std::int32_t q_len;  // query tokens per sequence
  std::vector<std::uint16_t> k, v, q_rows;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (argc > 1 && !quick) {
    std::fprintf(stderr, "usage: bench_decode_attention [--quick]\n");
    return 2;
  }
  int devices = 0;
  try {
    devices = pagedkv::cuda_device_count();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode_attention: %s\n", e.what());
    return 1;
  }
  if (devices == 0) {
    std::printf("bench_decode_attention: no CUDA device visible; nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  pagedkv::DecodePlanOptions options[kNumKernels];
  for (int kv = 0; kv < kNumKernels; ++kv) {
    CHECK(pagedkv::decode_plan_options_for_current_device(kDtype, kHeadDim, &options[kv],
                                                          kKernels[kv]));
  }

  // ---- correctness first: nothing is timed unless the kernels are right here ----
  if (!check_against_reference(options, stream)) {
    std::printf(
        "bench_decode_attention: the check against the CPU reference failed; "
        "nothing timed\n");
    return 1;
  }

  const std::vector<int> batches = quick ? std::vector<int>{1, 8} : std::vector<int>{1, 8, 64, 256};
  const std::vector<int> contexts =
      quick ? std::vector<int>{1024} : std::vector<int>{1024, 4096, 16384, 32768};
  const std::vector<int> block_sizes = quick ? std::vector<int>{16} : std::vector<int>{16, 64};
  const std::int64_t token_bytes = std::int64_t{kKVHeads} * kHeadDim * 2;  // one plane, one layer

  // One allocation per plane, sized for the largest shape (or 1 GiB rotation) that fits.
  std::int64_t want = quick ? kGiB : 0;
  for (const int b : batches) {
    for (const int c : contexts) want = std::max(want, std::int64_t{b} * c * token_bytes);
  }
  want = std::max(want, 2 * kGiB);  // copy baseline and copy_blocks pools
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const auto usable = static_cast<std::int64_t>(free_bytes) - kGiB;  // leave headroom
  Device dev;
  dev.bytes = std::min(want, usable / 2) / (256 * 1024) * (256 * 1024);
  CHECK(cudaMalloc(reinterpret_cast<void**>(&dev.k), static_cast<std::size_t>(dev.bytes)));
  CHECK(cudaMalloc(reinterpret_cast<void**>(&dev.v), static_cast<std::size_t>(dev.bytes)));
  // Random bf16 values in [-1, 1) (timing must not depend on special data such as zeros).
  bench::fill_random(dev.k, static_cast<std::size_t>(dev.bytes), kDtype, 1, kProgram);
  bench::fill_random(dev.v, static_cast<std::size_t>(dev.bytes), kDtype, 2, kProgram);

  // ---- C: device-to-device copy of 1 GiB ----
  const std::int64_t copy_bytes = std::min<std::int64_t>(kGiB, dev.bytes);
  const double copy_ms = time_ms(stream, quick ? 3 : 20, 1, 0, [&](int) {
    CHECK(cudaMemcpyAsync(dev.v, dev.k, static_cast<std::size_t>(copy_bytes),
                          cudaMemcpyDeviceToDevice, stream));
  });
  const double c_gbs = 2.0 * static_cast<double>(copy_bytes) / (copy_ms * 1e6);
  std::printf(
      "# %s, %d SMs, %.0f GiB; pagedkv decode attention (bf16, 32 q heads, 8 KV heads, "
      "head_dim 128)\n",
      prop.name, prop.multiProcessorCount,
      static_cast<double>(total_bytes) / static_cast<double>(kGiB));
  std::printf("# C = device-to-device copy, read + write: %.0f GB/s (%.3f ms per %.0f MiB)\n\n",
              c_gbs, copy_ms, static_cast<double>(copy_bytes) / (1 << 20));
  std::printf("RESULT copy bytes=%lld ms=%.4f gbs=%.1f\n", static_cast<long long>(copy_bytes),
              copy_ms, c_gbs);

  // ---- R: read-only streaming of 1 GiB (decode only reads) ----
  unsigned* sink = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&sink), sizeof(unsigned)));
  const std::int64_t read_bytes = copy_bytes / 64 * 64;
  const double read_ms = time_ms(stream, quick ? 3 : 20, 1, 0, [&](int) {
    CHECK(bench::read_only_stream(dev.k, static_cast<std::size_t>(read_bytes), sink, stream));
  });
  const double r_gbs = static_cast<double>(read_bytes) / (read_ms * 1e6);
  std::printf("# R = read-only streaming kernel: %.0f GB/s (%.3f ms per %.0f MiB)\n\n", r_gbs,
              read_ms, static_cast<double>(read_bytes) / (1 << 20));
  std::printf("RESULT read bytes=%lld ms=%.4f gbs=%.1f ratio_copy=%.3f\n",
              static_cast<long long>(read_bytes), read_ms, r_gbs, r_gbs / c_gbs);

  // q and out, shared by every launch; q random.
  const std::int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  const auto q_bytes =
      static_cast<std::size_t>(max_batch * kMaxBenchQueryLen * kQHeads * kHeadDim * 2);
  void* q = nullptr;
  void* out = nullptr;
  CHECK(cudaMalloc(&q, q_bytes));
  CHECK(cudaMalloc(&out, q_bytes));
  bench::fill_random(q, q_bytes, kDtype, 3, kProgram);

  int after_checks = 0;
  int after_failures = 0;
  std::printf(
      "| batch | context | block | table | kernel | splits x chunk | rotation | timed as | us | "
      "GB/s | / C | / R |\n");
  std::printf("|---:|---:|---:|---|---|---|---:|---|---:|---:|---:|---:|\n");
  std::mt19937_64 rng(1);
  std::vector<double> bound_ratios[kNumKernels];  // per kernel: shapes with >= 1 GiB of K/V
  std::vector<double> speedups;                   // per shape: simt time / tensor-core time
  std::vector<double> wide_speedups;   // per split-KV shape: tensor-core time / wide-merge time
  std::vector<double> fused_speedups;  // per split-KV shape: wide-merge time / fused-merge time
  double b1_4k[kNumKernels] = {-1.0, -1.0, -1.0, -1.0};
  int shape_index = 0;
  // Single-query times of the shuffled shapes, by (batch, context, block, kernel): the
  // multi-query shapes below report their time against them.
  std::map<std::string, double> single_query_ms;
  const auto shape_key = [](int batch, const char* context, int block_size, int kv) {
    return std::to_string(batch) + "/" + context + "/" + std::to_string(block_size) + "/" +
           std::to_string(kv);
  };
  // One shape: `lens` (one length per sequence; `context` names it in the tables: the length,
  // or "mixed"), q_len query tokens per sequence, every variant timed, then checked again. False
  // if the split counters were not left zero (the caller stops).
  const auto run_shape = [&](const std::vector<std::int32_t>& lens, const char* context,
                             int block_size, bool shuffled, int q_len = 1) -> bool {
    const int batch = static_cast<int>(lens.size());
    const std::int32_t max_len = *std::max_element(lens.begin(), lens.end());
    const std::int64_t blocks_per_seq = (max_len + block_size - 1) / block_size;
    const std::int64_t blocks_per_call = batch * blocks_per_seq;  // table cells of one launch
    std::int64_t tokens = 0;  // a launch reads each sequence's tokens once per KV head
    for (const std::int32_t len : lens) tokens += len;
    const std::int64_t kv_bytes = tokens * token_bytes;  // per plane
    const std::int64_t pool_blocks = dev.bytes / (token_bytes * block_size);
    if (blocks_per_call > pool_blocks) {
      std::printf("| %d | %s | %d | %s | skipped: needs %.1f GiB per plane | | | | | |\n", batch,
                  context, block_size, shuffled ? "shuffled" : "identity",
                  static_cast<double>(blocks_per_call * block_size * token_bytes) /
                      static_cast<double>(kGiB));
      return true;
    }
    const std::int64_t rotation = std::max<std::int64_t>(
        1, std::min<std::int64_t>(kGiB / kv_bytes + 1, pool_blocks / blocks_per_call));
    const KVLayout layout = KVLayout::nhd(pool_blocks, block_size, kKVHeads, kHeadDim);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(rotation * blocks_per_call));
    std::iota(ids.begin(), ids.end(), 0);
    if (shuffled) std::shuffle(ids.begin(), ids.end(), rng);
    void* table = nullptr;
    CHECK(cudaMalloc(&table, ids.size() * sizeof(std::int32_t)));
    CHECK(cudaMemcpy(table, ids.data(), ids.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    void* lens_dev = nullptr;
    CHECK(cudaMalloc(&lens_dev, lens.size() * sizeof(std::int32_t)));
    CHECK(cudaMemcpy(lens_dev, lens.data(), lens.size() * sizeof(std::int32_t),
                     cudaMemcpyHostToDevice));
    pagedkv::PagedDecodeParams p;
    p.dtype = kDtype;
    p.num_seqs = batch;
    p.num_q_heads = kQHeads;
    p.q_len = q_len;
    p.q = q;
    p.k_cache = dev.k;
    p.v_cache = dev.v;
    p.layout = layout;
    p.max_blocks_per_seq = static_cast<std::int32_t>(blocks_per_seq);
    p.seq_lens = static_cast<const std::int32_t*>(lens_dev);
    p.out = out;
    p.sm_scale = kSmScale;
    const auto* table_base = static_cast<const std::int32_t*>(table);
    double ms_of[kNumKernels] = {};
    bool split_of[kNumKernels] = {};
    const SplitCounters counters(std::int64_t{batch} * kKVHeads);  // zeroed once
    // The sequence every variant's output is checked on after its timing: the last one.
    const int sample = batch - 1;
    const std::int32_t sample_len = lens[static_cast<std::size_t>(sample)];
    // Its blocks are copied back now; its reference is computed on other host threads while the
    // first variant is timed (the GPU's timing does not wait for it).
    const SampledSequence sampled(dev, layout, q, sample,
                                  ids.data() + std::int64_t{sample} * blocks_per_seq,
                                  (sample_len + block_size - 1) / block_size, sample_len, q_len);
    std::future<std::vector<double>> sample_future =
        std::async(std::launch::async, [&sampled] { return sampled.exact(); });
    std::vector<double> sample_ref;
    // A/B/C in one run: the order rotates from shape to shape.
    // Batch 1, identity tables: two more steps, the wide merge with a plan of twice its target
    // (two waves, as kTensorCore plans) and of half (longer chunks), so the run separates the
    // plan's effect from the merge's and shows the neighbouring plans.
    const bool plan_probe = batch == 1 && !shuffled;
    for (int step = 0; step < kNumKernels + (plan_probe ? 2 : 0); ++step) {
      const bool probe = step >= kNumKernels;
      const int kv = probe ? kWideMergeIndex : (step + shape_index) % kNumKernels;
      const DecodeKernel kernel = kKernels[kv];
      if (q_len > 1 && kernel == DecodeKernel::kSimt) continue;  // one query token only
      pagedkv::DecodePlanOptions plan_options = options[kv];
      if (step == kNumKernels) plan_options.ctas_per_sm *= 2;
      if (step == kNumKernels + 1) {
        plan_options.ctas_per_sm = std::max(1, plan_options.ctas_per_sm / 2);
      }
      const char* label = !probe                ? kernel_name(kernel)
                          : step == kNumKernels ? "tensor_core_wide_merge_plan_x2"
                                                : "tensor_core_wide_merge_plan_half";
      const DecodePlan plan = pagedkv::plan_paged_decode(lens, kKVHeads, plan_options);
      const std::size_t ws_bytes =
          pagedkv::decode_workspace_bytes(plan, batch, kQHeads, kHeadDim, q_len);
      void* workspace = nullptr;
      if (ws_bytes > 0) CHECK(cudaMalloc(&workspace, ws_bytes));
      const auto launch = [&](int call) {
        p.block_table = table_base + (call % rotation) * blocks_per_call;
        CHECK(pagedkv::paged_decode_attention(p, plan, workspace, ws_bytes, stream, kernel,
                                              counters.get()));
      };
      const int per_repeat = static_cast<int>(std::min<std::int64_t>(rotation, 64));
      // Small launches go through a graph; the warm-up graph reads the rotation's other copies
      // when there are enough (else the last ones).
      const bool graph = 2 * kv_bytes < 256 * (std::int64_t{1} << 20);
      const int warmup_first = static_cast<int>(
          rotation >= 2 * per_repeat ? per_repeat : std::max<std::int64_t>(0, rotation - 2));
      const double ms =
          graph ? time_graph_ms(stream, quick ? 3 : 15, per_repeat, 0, warmup_first, launch)
                : time_ms(stream, quick ? 3 : 15, per_repeat,
                          static_cast<int>(std::max<std::int64_t>(0, rotation - 2)), launch);
      // After timing: once more on the rotation's first copy, through the same workspace and
      // counters, with the output and workspace poisoned (NaN) first, so a row or a partial
      // result left over from the timed launches fails; the sampled sequence's rows against its
      // CPU reference.
      CHECK(cudaMemsetAsync(out, 0xff, q_bytes, stream));
      if (ws_bytes > 0) CHECK(cudaMemsetAsync(workspace, 0xff, ws_bytes, stream));
      launch(0);
      CHECK(cudaStreamSynchronize(stream));
      if (sample_future.valid()) sample_ref = sample_future.get();
      const std::size_t out_rows =  // one sequence's output values
          std::size_t{kQHeads} * kHeadDim * static_cast<std::size_t>(q_len);
      std::vector<std::uint16_t> rows(out_rows);
      CHECK(cudaMemcpy(rows.data(), static_cast<const std::uint16_t*>(out) + sample * out_rows,
                       out_rows * 2, cudaMemcpyDeviceToHost));
      const double after_err =
          bench::max_row_error(bench::to_doubles(kDtype, rows), sample_ref, kHeadDim);
      const bool after_pass = after_err <= kRowTolerance;
      ++after_checks;
      if (!after_pass) ++after_failures;
      std::printf(
          "CHECK decode_after_timing kernel=%s batch=%d context=%s q_len=%d block=%d table=%s "
          "splits=%d seq=%d len=%d max_row_error=%.3g tolerance=%.0e %s\n",
          label, batch, context, q_len, block_size, shuffled ? "shuffled" : "identity",
          plan.num_splits, sample, sample_len, after_err, kRowTolerance,
          after_pass ? "PASS" : "FAIL");
      if (!probe) {
        ms_of[kv] = ms;
        split_of[kv] = plan.split_kv();
      }
      const double bytes = 2.0 * static_cast<double>(kv_bytes) +
                           2.0 * batch * q_len * kQHeads * kHeadDim * 2;  // K, V, q, out
      const double gbs = bytes / (ms * 1e6);
      char split[64];
      if (plan.split_kv()) {
        std::snprintf(split, sizeof(split), "%d x %d", plan.num_splits, plan.kv_chunk_size);
      } else {
        std::snprintf(split, sizeof(split), "none");
      }
      const char* timed_as = graph ? "graph" : "launches";
      std::string context_q = context;
      if (q_len > 1) context_q += " (q_len " + std::to_string(q_len) + ")";
      std::printf("| %d | %s | %d | %s | %s | %s | %.2f GiB | %s | %.1f | %.0f | %.2f | %.2f |\n",
                  batch, context_q.c_str(), block_size, shuffled ? "shuffled" : "identity", label,
                  split, 2.0 * static_cast<double>(rotation * kv_bytes) / static_cast<double>(kGiB),
                  timed_as, ms * 1e3, gbs, gbs / c_gbs, gbs / r_gbs);
      std::printf(
          "RESULT decode kernel=%s batch=%d context=%s q_len=%d block=%d table=%s splits=%d "
          "kv_mib=%.0f timed_as=%s us=%.2f gbs=%.1f ratio_copy=%.3f ratio_read=%.3f\n",
          label, batch, context, q_len, block_size, shuffled ? "shuffled" : "identity",
          plan.num_splits, 2.0 * static_cast<double>(kv_bytes) / (1 << 20), timed_as, ms * 1e3, gbs,
          gbs / c_gbs, gbs / r_gbs);
      if (q_len > 1 && !probe) {
        const auto one = single_query_ms.find(shape_key(batch, context, block_size, kv));
        if (one != single_query_ms.end()) {
          std::printf(
              "RESULT decode_multi_query kernel=%s batch=%d context=%s q_len=%d block=%d "
              "time_vs_q_len_1=%.3f (the same shape's one-token time in this run)\n",
              label, batch, context, q_len, block_size, ms / one->second);
        }
      }
      std::fflush(stdout);
      if (q_len == 1 && !probe && shuffled) {
        single_query_ms[shape_key(batch, context, block_size, kv)] = ms;
      }
      if (q_len == 1 && !probe && 2 * kv_bytes >= kGiB) bound_ratios[kv].push_back(gbs / c_gbs);
      if (q_len == 1 && !probe && std::strcmp(context, "4096") == 0 && batch == 1 && !shuffled &&
          block_size == 16) {
        b1_4k[kv] = gbs / c_gbs;
      }
      if (workspace != nullptr) CHECK(cudaFree(workspace));
    }
    if (q_len == 1) speedups.push_back(ms_of[0] / ms_of[1]);  // kSimt takes one token only
    if (split_of[1] || split_of[kWideMergeIndex]) {
      wide_speedups.push_back(ms_of[1] / ms_of[kWideMergeIndex]);
    }
    if (split_of[kWideMergeIndex] || split_of[kFusedMergeIndex]) {
      fused_speedups.push_back(ms_of[kWideMergeIndex] / ms_of[kFusedMergeIndex]);
    }
    ++shape_index;
    CHECK(cudaFree(lens_dev));
    CHECK(cudaFree(table));
    if (!counters.all_zero()) {
      std::printf("CHECK decode_split_counters batch=%d context=%s FAIL (not reset)\n", batch,
                  context);
      return false;
    }
    return true;
  };
  for (const int batch : batches) {
    for (const int context : contexts) {
      for (const int block_size : block_sizes) {
        for (const bool shuffled : {false, true}) {
          if (quick && shuffled) continue;
          const std::string name = std::to_string(context);
          if (!run_shape(std::vector<std::int32_t>(static_cast<std::size_t>(batch), context),
                         name.c_str(), block_size, shuffled)) {
            return 1;
          }
        }
      }
    }
  }
  // Mixed-length batches (shuffled tables): lengths drawn log-uniformly from [256, 32768], so a
  // batch holds short and long sequences as a serving engine's does and the split plan must
  // balance them.
  std::mt19937_64 mixed_rng(7);
  for (const int batch : quick ? std::vector<int>{8} : std::vector<int>{8, 64, 256}) {
    std::vector<std::int32_t> lens(static_cast<std::size_t>(batch));
    for (auto& len : lens) {
      const double u = static_cast<double>(mixed_rng() >> 11) * 0x1.0p-53;
      len = static_cast<std::int32_t>(std::exp(std::log(256.0) + u * std::log(128.0)));
    }
    for (const int block_size : block_sizes) {
      if (!run_shape(lens, "mixed", block_size, true)) return 1;
    }
  }
  // Several query tokens per sequence (speculative decoding's drafts; the tensor-core variants):
  // shuffled tables, block 16, against the same shapes' one-token times above.
  for (const auto& [batch, context, q_len] :
       quick ? std::vector<std::array<int, 3>>{{1, 1024, 4}}
             : std::vector<std::array<int, 3>>{
                   {1, 4096, 2}, {1, 4096, 4}, {64, 4096, 4}, {8, 16384, 4}}) {
    const std::string name = std::to_string(context);
    if (!run_shape(std::vector<std::int32_t>(static_cast<std::size_t>(batch), context),
                   name.c_str(), 16, true, q_len)) {
      return 1;
    }
  }

  // ---- copy_blocks: 64 planes (32 layers x K, V), random forks, vs one memcpy of the same bytes.
  std::printf("\n| copy_blocks | block | pairs | planes | MiB moved | us | GB/s | / C |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const int block_size : block_sizes) {
    const int planes = 64;
    const std::int64_t block_bytes = token_bytes * block_size;
    const std::int64_t plane_bytes = (dev.bytes / planes) / block_bytes * block_bytes;
    const std::int64_t num_blocks = plane_bytes / block_bytes;
    const std::int64_t pairs_count =
        std::min<std::int64_t>(num_blocks / 2, (quick ? kGiB / 8 : kGiB) / (block_bytes * planes));
    std::vector<std::int64_t> order(static_cast<std::size_t>(num_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<pagedkv::BlockPair> pairs;
    for (std::int64_t i = 0; i < pairs_count; ++i) {
      pairs.push_back(
          {order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(pairs_count + i)]});
    }
    void* pairs_dev = nullptr;
    CHECK(cudaMalloc(&pairs_dev, pairs.size() * sizeof(pagedkv::BlockPair)));
    CHECK(cudaMemcpy(pairs_dev, pairs.data(), pairs.size() * sizeof(pagedkv::BlockPair),
                     cudaMemcpyHostToDevice));
    std::vector<void*> plane_ptrs;
    for (int i = 0; i < planes; ++i) plane_ptrs.push_back(dev.k + i * plane_bytes);
    const KVLayout layout = KVLayout::nhd(num_blocks, block_size, kKVHeads, kHeadDim);
    const double ms = time_ms(stream, quick ? 3 : 15, 1, 0, [&](int) {
      CHECK(pagedkv::copy_blocks(plane_ptrs, layout, kDtype,
                                 static_cast<const pagedkv::BlockPair*>(pairs_dev),
                                 static_cast<std::int64_t>(pairs.size()), stream));
    });
    const double moved = static_cast<double>(pairs_count * planes * block_bytes);
    const double gbs = 2.0 * moved / (ms * 1e6);
    std::printf("| copy_blocks | %d | %lld | %d | %.0f | %.1f | %.0f | %.2f |\n", block_size,
                static_cast<long long>(pairs_count), planes, moved / (1 << 20), ms * 1e3, gbs,
                gbs / c_gbs);
    std::printf(
        "RESULT copy_blocks block=%d pairs=%lld planes=%d us=%.2f gbs=%.1f "
        "ratio_copy=%.3f\n",
        block_size, static_cast<long long>(pairs_count), planes, ms * 1e3, gbs, gbs / c_gbs);
    CHECK(cudaFree(pairs_dev));
  }

  // ---- the targets: every bandwidth-bound shape at >= 0.85 x C (and x R), per kernel ----
  std::printf("\n");
  for (int kv = 0; kv < kNumKernels; ++kv) {
    const std::vector<double>& ratios = bound_ratios[kv];
    // The default kernel keeps the plain names; the other variants are named.
    const char* prefix = kKernels[kv] == pagedkv::kDefaultDecodeKernel ? "decode"
                         : kKernels[kv] == DecodeKernel::kSimt         ? "decode_simt"
                         : kKernels[kv] == DecodeKernel::kTensorCore   ? "decode_tc"
                         : kKernels[kv] == DecodeKernel::kTensorCoreFusedMerge
                             ? "decode_fused_merge"
                             : "decode_wide_merge";
    if (!ratios.empty()) {
      const double worst = *std::min_element(ratios.begin(), ratios.end());
      const double best = *std::max_element(ratios.begin(), ratios.end());
      std::printf(
          "TARGET %s_vs_copy value=%.3f target=%.2f met=%s shapes=%zu median=%.3f "
          "best=%.3f kernel=%s (worst shape with >= 1 GiB of K/V per launch)\n",
          prefix, worst, kTarget, worst >= kTarget ? "yes" : "no", ratios.size(),
          bench::median(ratios), best, kernel_name(kKernels[kv]));
      const double worst_read = worst * c_gbs / r_gbs;
      std::printf(
          "TARGET %s_vs_read value=%.3f target=%.2f met=%s shapes=%zu median=%.3f "
          "kernel=%s (same shapes, against the read-only stream R = %.0f GB/s)\n",
          prefix, worst_read, kTarget, worst_read >= kTarget ? "yes" : "no", ratios.size(),
          bench::median(ratios) * c_gbs / r_gbs, kernel_name(kKernels[kv]), r_gbs);
    }
    if (b1_4k[kv] >= 0.0) {
      std::printf(
          "TARGET %s_b1_4k_vs_copy value=%.3f target=%.2f met=%s kernel=%s (batch 1, "
          "4,096 tokens, block 16)\n",
          prefix, b1_4k[kv], kTargetB1, b1_4k[kv] >= kTargetB1 ? "yes" : "no",
          kernel_name(kKernels[kv]));
    }
  }
  if (!speedups.empty()) {
    std::printf(
        "RESULT decode_variants tensor_core_speedup_median=%.3f worst=%.3f best=%.3f shapes=%zu "
        "(simt time / tensor-core time, same run)\n",
        bench::median(speedups), *std::min_element(speedups.begin(), speedups.end()),
        *std::max_element(speedups.begin(), speedups.end()), speedups.size());
  }
  if (!wide_speedups.empty()) {
    std::printf(
        "RESULT decode_variants wide_merge_speedup_median=%.3f worst=%.3f best=%.3f shapes=%zu "
        "(tensor-core time / wide-merge time, same run, shapes where either splits)\n",
        bench::median(wide_speedups), *std::min_element(wide_speedups.begin(), wide_speedups.end()),
        *std::max_element(wide_speedups.begin(), wide_speedups.end()), wide_speedups.size());
  }
  if (!fused_speedups.empty()) {
    std::printf(
        "RESULT decode_variants fused_merge_speedup_median=%.3f worst=%.3f best=%.3f shapes=%zu "
        "(wide-merge time / fused-merge time, same run, shapes where either splits)\n",
        bench::median(fused_speedups),
        *std::min_element(fused_speedups.begin(), fused_speedups.end()),
        *std::max_element(fused_speedups.begin(), fused_speedups.end()), fused_speedups.size());
  }
  std::printf(
      "CHECK decode_after_timing checks=%d failures=%d (every variant on every shape, once more "
      "after its timing, sampled sequence against the CPU reference) %s\n",
      after_checks, after_failures, after_failures == 0 ? "PASS" : "FAIL");
  CHECK(cudaFree(sink));
  CHECK(cudaFree(q));
  CHECK(cudaFree(out));
  CHECK(cudaFree(dev.k));
  CHECK(cudaFree(dev.v));
  CHECK(cudaStreamDestroy(stream));
  return after_failures == 0 ? 0 : 1;
}
