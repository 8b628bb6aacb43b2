// pagedkv/cuda/transfer.hpp: the CUDA executor of a TransferPlan (pagedkv/base/transfer_plan.hpp):
// block copies between device KV memory (either TransferLayout) and a pinned host buffer of
// block-first slots, enqueued on the engine's stream. The CPU reference
// (pagedkv/reference/transfer.hpp) defines the result; tests compare the bytes.
//
// How a stage is copied: the stage's copies, in plan order (evictions, then loads; or stores), are
// cut into runs of consecutive source and destination blocks. On a block-contiguous device
// (block-first, or one chunk per block) a run is one cudaMemcpyAsync; on a layer-first device a
// run is min(layers, blocks) cudaMemcpy2DAsync calls (one per layer with one row per block, or one
// per block with one row per layer). kBatch issues the same pieces as one cudaMemcpyBatchAsync
// (CUDA 12.8+; a non-default stream). bench/bench_transfer.cpp measures both against one
// contiguous copy of the same bytes. Within a stage every copy is ordered after the ones the
// stream ran before it; evictions precede loads, as the plan requires.
//
// Completion: execute() records `done` (when not null) on the stream after the stage's copies;
// the engine commits the plan's transfers once the event completed (cudaEventQuery /
// cudaEventSynchronize / cudaStreamWaitEvent for the forward pass).
// Errors: host-detectable problems throw pagedkv::Error with nothing enqueued: the stage already
// executed (kInvalidState), a block outside the buffers (kOutOfRange), an empty layout, null
// buffers or kBatch on the legacy default stream (kInvalidArgument). CUDA errors are returned
// (the stage is then not marked executed). The host buffer must be pinned (cudaHostAlloc /
// cudaHostRegister) for the copies to be asynchronous. No device memory is allocated; scratch
// for the pieces is kept in the executor (no allocation once it has grown).
// Thread-compatible: one executor per thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pagedkv/base/transfer_plan.hpp"

namespace pagedkv {

enum class CudaTransferMethod : std::uint8_t {
  kMemcpy,  // one cudaMemcpyAsync / cudaMemcpy2DAsync per piece
  kBatch,   // every piece of a stage in one cudaMemcpyBatchAsync (CUDA 12.8+)
};

// Whether this build's CUDA runtime has cudaMemcpyBatchAsync.
bool cuda_transfer_batch_supported() noexcept;

class CudaTransferExecutor {
 public:
  // `device` holds num_device_blocks blocks laid out as `layout` says (device memory); `host`
  // holds num_host_slots slots of layout.block_bytes() (pinned host memory). Throws
  // pagedkv::Error (kInvalidArgument) for an empty layout or null buffers, or kBatch where the
  // runtime lacks it.
  CudaTransferExecutor(const TransferLayout& layout, void* device, std::size_t num_device_blocks,
                       void* host, std::size_t num_host_slots,
                       CudaTransferMethod method = CudaTransferMethod::kMemcpy);

  // Enqueues one stage of `plan` on `stream` and marks it executed; records `done` after it.
  cudaError_t execute(TransferPlan& plan, TransferStage stage, cudaStream_t stream,
                      cudaEvent_t done = nullptr);

  const TransferLayout& layout() const noexcept { return layout_; }
  CudaTransferMethod method() const noexcept { return method_; }
  // CUDA calls the last execute() issued (copies and batches, not the event).
  std::size_t last_num_calls() const noexcept { return last_calls_; }

 private:
  struct Piece {
    char* dst;
    const char* src;
    std::size_t width;  // bytes per row
    std::size_t rows;
    std::size_t dst_pitch, src_pitch;
  };
  void add_copies(const std::vector<BlockCopy>& copies, bool to_host);
  cudaError_t issue(cudaStream_t stream);

  TransferLayout layout_;
  char* device_;
  std::size_t num_device_blocks_;
  char* host_;
  std::size_t num_host_slots_;
  CudaTransferMethod method_;
  std::size_t last_calls_ = 0;
  std::vector<Piece> pieces_;
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<std::size_t> sizes_;
};

}  // namespace pagedkv
