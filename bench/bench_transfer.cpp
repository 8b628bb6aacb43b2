// bench_transfer: bandwidth of CudaTransferExecutor (pagedkv/cuda/transfer.hpp) running a
// transfer plan, host -> device (loads) and device -> host (stores), against one contiguous
// cudaMemcpyAsync of the same bytes between the same pinned host buffer and device memory, in
// the same run. Target: plan bandwidth >= 0.8 x the contiguous copy, for both device layouts
// (block-first: a block's layers contiguous; layer-first: one plane per layer, K and V apart)
// and both methods (kMemcpy, kBatch).
//
// The plan copies kBlocks blocks between scattered device blocks and scattered host slots (no
// two consecutive: the executor cannot coalesce), the shape of an 8B model's KV: 32 layers,
// K and V each 16 tokens x 8 heads x 128 dims in bf16 (32 KiB), so 64 chunks and 2 MiB per
// block. Before timing, a small plan of each layout and method is checked byte for byte against
// the CPU reference executor (exit 1 on a mismatch, nothing timed).
// Output lines as bench_cuda_util.hpp describes (RESULT / TARGET / CHECK); timings are medians
// of kReps runs measured with CUDA events on one non-blocking stream.
// Usage: bench_transfer [--quick]   (--quick: small shapes, for smoke tests)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_cuda_util.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/cuda/transfer.hpp"
#include "pagedkv/reference/transfer.hpp"

namespace {

constexpr const char* kProgram = "bench_transfer";
#define CHECK(call) bench::cuda_check((call), #call, kProgram)

struct Shape {
  std::size_t chunks = 64;          // K and V of 32 layers
  std::size_t chunk_bytes = 32768;  // 16 tokens x 8 heads x 128 dims x 2 bytes
  std::size_t device_blocks = 1024;
  std::size_t host_slots = 320;
  std::size_t blocks = 256;  // copies per plan
  int reps = 10;
};

const char* layout_name(bool layer_first) {
  return layer_first ? "layer_first" : "block_first";
}
const char* method_name(pagedkv::CudaTransferMethod m) {
  return m == pagedkv::CudaTransferMethod::kBatch ? "batch" : "memcpy";
}

pagedkv::TransferLayout make_layout(const Shape& s, bool layer_first) {
  return layer_first
             ? pagedkv::TransferLayout::layer_first(s.chunks, s.chunk_bytes, s.device_blocks)
             : pagedkv::TransferLayout::block_first(s.chunks, s.chunk_bytes);
}

// n copies, none consecutive to the previous on both sides (nothing to coalesce).
std::vector<pagedkv::BlockCopy> scattered(std::size_t n, std::size_t num_src, std::size_t num_dst,
                                          std::mt19937_64& rng) {
  std::vector<int> src(num_src), dst(num_dst);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<pagedkv::BlockCopy> out;
  for (std::size_t i = 0; i < n; ++i) out.push_back({src[i], dst[i]});
  for (std::size_t i = 1; i < out.size(); ++i) {
    if (out[i].src == out[i - 1].src + 1 && out[i].dst == out[i - 1].dst + 1)
      std::swap(out[i].dst, out[0].dst);
  }
  return out;
}

std::size_t device_bytes(const pagedkv::TransferLayout& l, std::size_t device_blocks) {
  return (device_blocks - 1) * l.device_block_stride + (l.num_layers - 1) * l.device_layer_stride +
         l.chunk_bytes;
}

// Byte-exact comparison with the CPU reference on a small plan (evictions, loads, stores).
bool check(bool layer_first, pagedkv::CudaTransferMethod method, cudaStream_t stream) {
  Shape s;
  s.chunks = 6;
  s.chunk_bytes = 256;
  s.device_blocks = 40;
  s.host_slots = 30;
  const pagedkv::TransferLayout l = make_layout(s, layer_first);
  std::mt19937_64 rng(5);
  const std::size_t dev_bytes = device_bytes(l, s.device_blocks);
  const std::size_t host_bytes = s.host_slots * l.block_bytes();
  std::vector<std::byte> dev(dev_bytes), host(host_bytes);
  for (auto& b : dev) b = static_cast<std::byte>(rng());
  for (auto& b : host) b = static_cast<std::byte>(rng());
  pagedkv::TransferPlan plan;
  plan.evictions = {{3, 20}, {4, 21}};
  // Loads: host slots 0..19 to distinct device blocks 8..39 in random order, then the two
  // evicted blocks 3 and 4 loaded over from slots 22 and 23 (after their eviction).
  plan.loads = scattered(12, 20, 32, rng);
  for (auto& c : plan.loads) c.dst += 8;
  plan.loads.push_back({22, 3});
  plan.loads.push_back({23, 4});
  plan.stores = {{30, 25}, {31, 26}, {32, 27}, {7, 29}};
  pagedkv::TransferPlan ref_plan = plan;
  void* d = nullptr;
  void* h = nullptr;
  CHECK(cudaMalloc(&d, dev_bytes));
  CHECK(cudaMallocHost(&h, host_bytes));
  CHECK(cudaMemcpy(d, dev.data(), dev_bytes, cudaMemcpyHostToDevice));
  std::memcpy(h, host.data(), host_bytes);
  pagedkv::CudaTransferExecutor exec(l, d, s.device_blocks, h, s.host_slots, method);
  for (const auto stage :
       {pagedkv::TransferStage::kBeforeForward, pagedkv::TransferStage::kAfterForward}) {
    pagedkv::reference::execute_transfer_plan(ref_plan, stage, l, dev, s.device_blocks, host,
                                              s.host_slots);
    CHECK(exec.execute(plan, stage, stream));
  }
  CHECK(cudaStreamSynchronize(stream));
  std::vector<std::byte> got(dev_bytes);
  CHECK(cudaMemcpy(got.data(), d, dev_bytes, cudaMemcpyDeviceToHost));
  const bool ok = got == dev && std::memcmp(h, host.data(), host_bytes) == 0;
  CHECK(cudaFree(d));
  CHECK(cudaFreeHost(h));
  std::printf(
      "CHECK transfer %s %s against the CPU reference executor max_row_error=%d "
      "tolerance=0 %s\n",
      layout_name(layer_first), method_name(method), ok ? 0 : 1, ok ? "PASS" : "FAIL");
  return ok;
}

template <typename F>
double median_ms(int reps, cudaStream_t stream, F&& enqueue) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  enqueue();  // warm-up
  CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    CHECK(cudaEventRecord(start, stream));
    enqueue();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return bench::median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (argc > 1 && !quick) {
    std::fprintf(stderr, "usage: bench_transfer [--quick]\n");
    return 2;
  }
  int devices = 0;
  try {
    devices = pagedkv::cuda_device_count();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_transfer: %s\n", e.what());
    return 1;
  }
  if (devices == 0) {
    std::printf("bench_transfer: no CUDA device visible; nothing measured\n");
    return 0;
  }
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<pagedkv::CudaTransferMethod> methods = {pagedkv::CudaTransferMethod::kMemcpy};
  if (pagedkv::cuda_transfer_batch_supported())
    methods.push_back(pagedkv::CudaTransferMethod::kBatch);

  bool ok = true;
  for (const bool layer_first : {false, true}) {
    for (const auto m : methods) ok = check(layer_first, m, stream) && ok;
  }
  if (!ok) {
    std::printf("bench_transfer: the check against the CPU reference failed; nothing timed\n");
    return 1;
  }

  Shape s;
  if (quick) {
    s.chunks = 8;
    s.chunk_bytes = 4096;
    s.device_blocks = 64;
    s.host_slots = 40;
    s.blocks = 16;
    s.reps = 3;
  }
  std::mt19937_64 rng(9);
  const std::size_t bb = s.chunks * s.chunk_bytes;
  const std::size_t bytes = s.blocks * bb;
  void* host = nullptr;
  CHECK(cudaMallocHost(&host, s.host_slots * bb));
  std::memset(host, 0x5a, s.host_slots * bb);
  void* dev = nullptr;
  CHECK(cudaMalloc(&dev, s.device_blocks * bb));
  CHECK(cudaMemset(dev, 0x33, s.device_blocks * bb));
  void* contiguous = nullptr;  // the baseline's device side
  CHECK(cudaMalloc(&contiguous, bytes));
  const std::vector<pagedkv::BlockCopy> loads =
      scattered(s.blocks, s.host_slots, s.device_blocks, rng);
  const std::vector<pagedkv::BlockCopy> stores =
      scattered(s.blocks, s.device_blocks, s.host_slots, rng);
  std::printf(
      "RESULT transfer_shape chunks=%zu chunk_bytes=%zu block_bytes=%zu blocks=%zu bytes=%zu "
      "reps=%d\n",
      s.chunks, s.chunk_bytes, bb, s.blocks, bytes, s.reps);

  const double h2d_ms = median_ms(s.reps, stream, [&] {
    CHECK(cudaMemcpyAsync(contiguous, host, bytes, cudaMemcpyHostToDevice, stream));
  });
  const double d2h_ms = median_ms(s.reps, stream, [&] {
    CHECK(cudaMemcpyAsync(host, contiguous, bytes, cudaMemcpyDeviceToHost, stream));
  });
  const auto gbps = [&](double ms) { return static_cast<double>(bytes) / (ms * 1e-3) / 1e9; };
  std::printf("RESULT copy direction=h2d ms=%.4f GBps=%.2f\n", h2d_ms, gbps(h2d_ms));
  std::printf("RESULT copy direction=d2h ms=%.4f GBps=%.2f\n", d2h_ms, gbps(d2h_ms));

  for (const bool layer_first : {false, true}) {
    const pagedkv::TransferLayout l = make_layout(s, layer_first);
    double best[2] = {0, 0};
    const char* best_method[2] = {"", ""};
    for (const auto m : methods) {
      pagedkv::CudaTransferExecutor exec(l, dev, s.device_blocks, host, s.host_slots, m);
      for (int dir = 0; dir < 2; ++dir) {  // 0: loads (h2d), 1: stores (d2h)
        pagedkv::TransferPlan plan;
        if (dir == 0) {
          plan.loads = loads;
        } else {
          plan.stores = stores;
        }
        const auto stage = dir == 0 ? pagedkv::TransferStage::kBeforeForward
                                    : pagedkv::TransferStage::kAfterForward;
        const double ms = median_ms(s.reps, stream, [&] {
          plan.executed_stages = 0;
          CHECK(exec.execute(plan, stage, stream));
        });
        const double ratio = (dir == 0 ? h2d_ms : d2h_ms) / ms;
        std::printf(
            "RESULT plan layout=%s method=%s direction=%s ms=%.4f GBps=%.2f "
            "vs_contiguous=%.3f cuda_calls=%zu\n",
            layout_name(layer_first), method_name(m), dir == 0 ? "h2d" : "d2h", ms, gbps(ms), ratio,
            exec.last_num_calls());
        if (ratio > best[dir]) {
          best[dir] = ratio;
          best_method[dir] = method_name(m);
        }
      }
    }
    for (int dir = 0; dir < 2; ++dir) {
      std::printf("TARGET transfer_%s_%s value=%.3f target=0.8 met=%s best_method=%s\n",
                  layout_name(layer_first), dir == 0 ? "h2d" : "d2h", best[dir],
                  best[dir] >= 0.8 ? "yes" : "no", best_method[dir]);
    }
  }
  CHECK(cudaFree(contiguous));
  CHECK(cudaFree(dev));
  CHECK(cudaFreeHost(host));
  CHECK(cudaStreamDestroy(stream));
  return 0;
}
