// CudaTransferExecutor (pagedkv/cuda/transfer.hpp) against the CPU reference executor: the same
// plans on the same bytes, for both device layouts and both methods, must leave identical device
// and host buffers. Also: stage order (an eviction copies a block out before a load overwrites
// it), the completion event, and errors with nothing enqueued. Host-only argument checks run
// without a GPU (*Arguments*).
#include "pagedkv/cuda/transfer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/reference/transfer.hpp"

namespace pagedkv {
namespace {

class CudaTransfer : public testing::GpuTest {};

constexpr std::size_t kLayers = 3, kChunk = 96, kDeviceBlocks = 24, kHostSlots = 17;

std::vector<std::byte> random_bytes(std::size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xff);
  return v;
}

struct PinnedHost {
  explicit PinnedHost(std::size_t bytes) : size(bytes) {
    PAGEDKV_CUDA_CHECK(cudaMallocHost(&ptr, bytes));
  }
  ~PinnedHost() { cudaFreeHost(ptr); }
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(ptr); }
  void* ptr = nullptr;
  std::size_t size;
};

// A plan with runs (consecutive blocks, coalesced by the executor) and scattered copies, and an
// eviction of a device block that a load then overwrites.
TransferPlan make_plan() {
  TransferPlan p;
  // Device blocks 5 and 7 are evicted to host slots 12 and 13, then loaded over.
  p.evictions = {{5, 12}, {7, 13}};
  // Device 1..4 from host 1..4: one run; the rest scattered.
  p.loads = {{1, 1}, {2, 2}, {3, 3}, {4, 4}, {6, 5}, {9, 7}, {16, 10}, {10, 17}, {11, 8}, {15, 19}};
  p.stores = {{20, 14}, {21, 15}, {22, 16}, {1, 11}};
  return p;
}

void run_case(const TransferLayout& layout, CudaTransferMethod method) {
  std::mt19937_64 rng(11);
  const std::size_t dev_bytes =
      layout.device_block_contiguous() && layout.device_block_stride == layout.block_bytes()
          ? kDeviceBlocks * layout.block_bytes()
          : layout.num_layers * layout.device_layer_stride;
  const std::vector<std::byte> dev0 = random_bytes(dev_bytes, rng);
  const std::vector<std::byte> host0 = random_bytes(kHostSlots * layout.block_bytes(), rng);
  TransferPlan plan = make_plan();
  TransferPlan ref_plan = plan;
  std::vector<std::byte> ref_dev = dev0, ref_host = host0;

  testing::DeviceBuffer dev = testing::upload(dev0);
  PinnedHost host(host0.size());
  std::memcpy(host.data(), host0.data(), host0.size());
  cudaStream_t stream;
  PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t done;
  PAGEDKV_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  CudaTransferExecutor exec(layout, dev.get<std::byte>(), kDeviceBlocks, host.ptr, kHostSlots,
                            method);

  for (const TransferStage stage : {TransferStage::kBeforeForward, TransferStage::kAfterForward}) {
    reference::execute_transfer_plan(ref_plan, stage, layout, ref_dev, kDeviceBlocks, ref_host,
                                     kHostSlots);
    PAGEDKV_CUDA_CHECK(exec.execute(plan, stage, stream, done));
    EXPECT_GT(exec.last_num_calls(), 0u);
    PAGEDKV_CUDA_CHECK(cudaEventSynchronize(done));
    EXPECT_EQ(cudaEventQuery(done), cudaSuccess);
    EXPECT_EQ(plan.executed_stages, ref_plan.executed_stages);
    const std::vector<std::byte> got =
        testing::download<std::byte>(dev.get<std::byte>(), dev_bytes);
    EXPECT_TRUE(got == ref_dev) << "device bytes differ after stage " << static_cast<int>(stage);
    EXPECT_EQ(std::memcmp(host.data(), ref_host.data(), ref_host.size()), 0)
        << "host bytes differ after stage " << static_cast<int>(stage);
  }
  // The eviction saw block 5's old bytes (before the load overwrote it).
  const std::size_t l1 = layout.num_layers - 1;
  EXPECT_EQ(
      std::memcmp(host.data() + 12 * layout.block_bytes() + l1 * layout.chunk_bytes,
                  dev0.data() + 5 * layout.device_block_stride + l1 * layout.device_layer_stride,
                  layout.chunk_bytes),
      0);
  // A stage twice: an error, nothing enqueued.
  EXPECT_THROW(exec.execute(plan, TransferStage::kAfterForward, stream), Error);
  cudaEventDestroy(done);
  cudaStreamDestroy(stream);
}

TEST_F(CudaTransfer, BlockFirstMemcpyMatchesTheReference) {
  run_case(TransferLayout::block_first(kLayers, kChunk), CudaTransferMethod::kMemcpy);
}
TEST_F(CudaTransfer, LayerFirstMemcpyMatchesTheReference) {
  run_case(TransferLayout::layer_first(kLayers, kChunk, kDeviceBlocks),
           CudaTransferMethod::kMemcpy);
}
TEST_F(CudaTransfer, OneLayerMatchesTheReference) {
  run_case(TransferLayout::layer_first(1, kChunk, kDeviceBlocks), CudaTransferMethod::kMemcpy);
}
TEST_F(CudaTransfer, BlockFirstBatchMatchesTheReference) {
  if (!cuda_transfer_batch_supported()) GTEST_SKIP() << "no cudaMemcpyBatchAsync";
  run_case(TransferLayout::block_first(kLayers, kChunk), CudaTransferMethod::kBatch);
}
TEST_F(CudaTransfer, LayerFirstBatchMatchesTheReference) {
  if (!cuda_transfer_batch_supported()) GTEST_SKIP() << "no cudaMemcpyBatchAsync";
  run_case(TransferLayout::layer_first(kLayers, kChunk, kDeviceBlocks), CudaTransferMethod::kBatch);
}

TEST_F(CudaTransfer, OutOfRangeCopyThrowsWithNothingEnqueued) {
  const TransferLayout layout = TransferLayout::block_first(kLayers, kChunk);
  testing::DeviceBuffer dev(kDeviceBlocks * layout.block_bytes());
  PinnedHost host(kHostSlots * layout.block_bytes());
  std::memset(host.data(), 0x33, host.size);
  CudaTransferExecutor exec(layout, dev.get<std::byte>(), kDeviceBlocks, host.ptr, kHostSlots);
  TransferPlan plan;
  plan.evictions = {{1, 1}};
  plan.loads = {{static_cast<int>(kHostSlots), 2}};  // slot out of range
  EXPECT_THROW(exec.execute(plan, TransferStage::kBeforeForward, nullptr), Error);
  EXPECT_EQ(plan.executed_stages, 0);
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  for (std::size_t i = 0; i < host.size; ++i) ASSERT_EQ(host.data()[i], std::byte{0x33}) << i;
}

TEST(CudaTransferArguments, RejectsEmptyLayoutsAndNullBuffers) {
  int dummy = 0;
  EXPECT_THROW(CudaTransferExecutor(TransferLayout{}, &dummy, 1, &dummy, 1), Error);
  EXPECT_THROW(CudaTransferExecutor(TransferLayout::block_first(2, 16), nullptr, 4, &dummy, 1),
               Error);
  CudaTransferExecutor batch(
      TransferLayout::block_first(2, 16), &dummy, 0, &dummy, 0,
      cuda_transfer_batch_supported() ? CudaTransferMethod::kBatch : CudaTransferMethod::kMemcpy);
  TransferPlan plan;
  if (cuda_transfer_batch_supported()) {
    EXPECT_THROW(batch.execute(plan, TransferStage::kAfterForward, nullptr), Error);
    EXPECT_EQ(plan.executed_stages, 0);
  }
}

}  // namespace
}  // namespace pagedkv
