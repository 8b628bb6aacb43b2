// Decode attention and copy_blocks bandwidth against a device-to-device copy measured in the same
// run (GPU only; exits 0 with a message when there is no device).
//
// C (copy bandwidth) = 2 x bytes / time of one cudaMemcpyAsync device-to-device of 1 GiB (each
// byte is read once and written once). Decode attention bandwidth = (unique K/V bytes read + q +
// out) / time. Shapes like Llama-3-8B (32 query heads, 8 KV heads, head_dim 128, bf16); batch 1, 8,
// 64, 256; context 1k..32k; block size 16 and 64; identity and shuffled block tables. Every
// timed launch reads a different copy of the batch's blocks (at least 1 GiB in rotation), so L2
// never serves K/V from a previous launch. Times are CUDA-event medians over repeats.
//
// Usage: bench_decode_attention [--quick]   (--quick: a few small shapes, for smoke tests)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/device.hpp"
#include "pagedkv/device/decode_plan.hpp"
#include "pagedkv/device/kv_layout.hpp"

namespace {

using pagedkv::DecodePlan;
using pagedkv::KVDtype;
using pagedkv::KVLayout;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "bench_decode_attention: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}
#define CHECK(call) check((call), #call)

constexpr std::int64_t kGiB = std::int64_t{1} << 30;
constexpr int kQHeads = 32;
constexpr int kKVHeads = 8;
constexpr int kHeadDim = 128;
constexpr KVDtype kDtype = KVDtype::kBFloat16;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds of `launch` per call; each repeat times `per_repeat` back-to-back calls.
template <typename Fn>
double time_ms(cudaStream_t stream, int repeats, int per_repeat, Fn&& launch) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) launch(i);  // warm-up
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
  return median(samples);
}

struct Device {
  unsigned char* k = nullptr;  // K planes (one big allocation, reused by every shape)
  unsigned char* v = nullptr;
  std::int64_t bytes = 0;  // of each
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (argc > 1 && !quick) {
    std::fprintf(stderr, "usage: bench_decode_attention [--quick]\n");
    return 2;
  }
  if (pagedkv::cuda_device_count() == 0) {
    std::printf("bench_decode_attention: no CUDA device visible; nothing measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

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
  // bf16 0x3c3c (about 0.0115) everywhere: finite, and timing does not depend on values.
  CHECK(cudaMemset(dev.k, 0x3c, static_cast<std::size_t>(dev.bytes)));
  CHECK(cudaMemset(dev.v, 0x3c, static_cast<std::size_t>(dev.bytes)));

  // ---- C: device-to-device copy of 1 GiB ----
  const std::int64_t copy_bytes = std::min<std::int64_t>(kGiB, dev.bytes);
  const double copy_ms = time_ms(stream, quick ? 3 : 20, 1, [&](int) {
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

  pagedkv::DecodePlanOptions options;
  CHECK(pagedkv::decode_plan_options_for_current_device(kDtype, kHeadDim, &options));

  // q and out, shared by every launch.
  const std::int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  void* q = nullptr;
  void* out = nullptr;
  CHECK(cudaMalloc(&q, static_cast<std::size_t>(max_batch * kQHeads * kHeadDim * 2)));
  CHECK(cudaMalloc(&out, static_cast<std::size_t>(max_batch * kQHeads * kHeadDim * 2)));
  CHECK(cudaMemset(q, 0x3c, static_cast<std::size_t>(max_batch * kQHeads * kHeadDim * 2)));

  std::printf(
      "| batch | context | block | table | splits x chunk | rotation | us | GB/s | / C |\n");
  std::printf("|---:|---:|---:|---|---|---:|---:|---:|---:|\n");
  std::mt19937_64 rng(1);
  for (const int batch : batches) {
    for (const int context : contexts) {
      for (const int block_size : block_sizes) {
        for (const bool shuffled : {false, true}) {
          if (quick && shuffled) continue;
          const std::int64_t kv_bytes = std::int64_t{batch} * context * token_bytes;  // per plane
          const std::int64_t rotation = std::max<std::int64_t>(
              1, std::min<std::int64_t>(kGiB / kv_bytes + 1, dev.bytes / kv_bytes));
          if (kv_bytes > dev.bytes) {
            std::printf("| %d | %d | %d | %s | skipped: needs %.1f GiB per plane | | | | |\n",
                        batch, context, block_size, shuffled ? "shuffled" : "identity",
                        static_cast<double>(kv_bytes) / static_cast<double>(kGiB));
            continue;
          }
          const std::int64_t blocks_per_seq = (context + block_size - 1) / block_size;
          const std::int64_t blocks_per_call = batch * blocks_per_seq;
          const KVLayout layout =
              KVLayout::nhd(dev.bytes / (token_bytes * block_size), block_size, kKVHeads, kHeadDim);
          std::vector<std::int32_t> ids(static_cast<std::size_t>(rotation * blocks_per_call));
          std::iota(ids.begin(), ids.end(), 0);
          if (shuffled) std::shuffle(ids.begin(), ids.end(), rng);
          void* table = nullptr;
          CHECK(cudaMalloc(&table, ids.size() * sizeof(std::int32_t)));
          CHECK(cudaMemcpy(table, ids.data(), ids.size() * sizeof(std::int32_t),
                           cudaMemcpyHostToDevice));
          const std::vector<std::int32_t> lens(static_cast<std::size_t>(batch), context);
          void* lens_dev = nullptr;
          CHECK(cudaMalloc(&lens_dev, lens.size() * sizeof(std::int32_t)));
          CHECK(cudaMemcpy(lens_dev, lens.data(), lens.size() * sizeof(std::int32_t),
                           cudaMemcpyHostToDevice));
          const DecodePlan plan = pagedkv::plan_paged_decode(lens, kKVHeads, options);
          const std::size_t ws_bytes =
              pagedkv::decode_workspace_bytes(plan, batch, kQHeads, kHeadDim);
          void* workspace = nullptr;
          if (ws_bytes > 0) CHECK(cudaMalloc(&workspace, ws_bytes));

          pagedkv::PagedDecodeParams p;
          p.dtype = kDtype;
          p.num_seqs = batch;
          p.num_q_heads = kQHeads;
          p.q = q;
          p.k_cache = dev.k;
          p.v_cache = dev.v;
          p.layout = layout;
          p.max_blocks_per_seq = static_cast<std::int32_t>(blocks_per_seq);
          p.seq_lens = static_cast<const std::int32_t*>(lens_dev);
          p.out = out;
          p.sm_scale = 0.0883883f;
          const auto* table_base = static_cast<const std::int32_t*>(table);
          const int per_repeat = static_cast<int>(std::min<std::int64_t>(rotation, 64));
          const double ms = time_ms(stream, quick ? 3 : 15, per_repeat, [&](int call) {
            p.block_table = table_base + (call % rotation) * blocks_per_call;
            CHECK(pagedkv::paged_decode_attention(p, plan, workspace, ws_bytes, stream));
          });
          const double bytes = 2.0 * static_cast<double>(kv_bytes) +
                               2.0 * batch * kQHeads * kHeadDim * 2;  // K, V, q, out
          const double gbs = bytes / (ms * 1e6);
          char split[64];
          if (plan.split_kv()) {
            std::snprintf(split, sizeof(split), "%d x %d", plan.num_splits, plan.kv_chunk_size);
          } else {
            std::snprintf(split, sizeof(split), "none");
          }
          std::printf("| %d | %d | %d | %s | %s | %.2f GiB | %.1f | %.0f | %.2f |\n", batch,
                      context, block_size, shuffled ? "shuffled" : "identity", split,
                      2.0 * static_cast<double>(rotation * kv_bytes) / static_cast<double>(kGiB),
                      ms * 1e3, gbs, gbs / c_gbs);
          std::fflush(stdout);
          if (workspace != nullptr) CHECK(cudaFree(workspace));
          CHECK(cudaFree(lens_dev));
          CHECK(cudaFree(table));
        }
      }
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
    const double ms = time_ms(stream, quick ? 3 : 15, 1, [&](int) {
      CHECK(pagedkv::copy_blocks(plane_ptrs, layout, kDtype,
                                 static_cast<const pagedkv::BlockPair*>(pairs_dev),
                                 static_cast<std::int64_t>(pairs.size()), stream));
    });
    const double moved = static_cast<double>(pairs_count * planes * block_bytes);
    const double gbs = 2.0 * moved / (ms * 1e6);
    std::printf("| copy_blocks | %d | %lld | %d | %.0f | %.1f | %.0f | %.2f |\n", block_size,
                static_cast<long long>(pairs_count), planes, moved / (1 << 20), ms * 1e3, gbs,
                gbs / c_gbs);
    CHECK(cudaFree(pairs_dev));
  }
  CHECK(cudaFree(q));
  CHECK(cudaFree(out));
  CHECK(cudaFree(dev.k));
  CHECK(cudaFree(dev.v));
  CHECK(cudaStreamDestroy(stream));
  return 0;
}
