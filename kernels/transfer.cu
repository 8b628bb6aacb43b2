#include "pagedkv/cuda/transfer.hpp"

#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv {

namespace {

void check_copies(const std::vector<BlockCopy>& copies, std::size_t num_src, std::size_t num_dst,
                  const char* what) {
  for (const BlockCopy& c : copies) {
    if (c.src < 0 || static_cast<std::size_t>(c.src) >= num_src || c.dst < 0 ||
        static_cast<std::size_t>(c.dst) >= num_dst) {
      throw Error(ErrorCode::kOutOfRange, std::string("CudaTransferExecutor: ") + what + " copy " +
                                              std::to_string(c.src) + " -> " +
                                              std::to_string(c.dst) + " is out of range");
    }
  }
}

}  // namespace

bool cuda_transfer_batch_supported() noexcept {
#if CUDART_VERSION >= 12080
  return true;
#else
  return false;
#endif
}

CudaTransferExecutor::CudaTransferExecutor(const TransferLayout& layout, void* device,
                                           std::size_t num_device_blocks, void* host,
                                           std::size_t num_host_slots, CudaTransferMethod method)
    : layout_(layout),
      device_(static_cast<char*>(device)),
      num_device_blocks_(num_device_blocks),
      host_(static_cast<char*>(host)),
      num_host_slots_(num_host_slots),
      method_(method) {
  if (layout.chunk_bytes == 0 || layout.num_layers == 0) {
    throw Error(ErrorCode::kInvalidArgument, "CudaTransferExecutor: empty layout");
  }
  if ((device == nullptr && num_device_blocks > 0) || (host == nullptr && num_host_slots > 0)) {
    throw Error(ErrorCode::kInvalidArgument, "CudaTransferExecutor: null buffer");
  }
  if (method == CudaTransferMethod::kBatch && !cuda_transfer_batch_supported()) {
    throw Error(ErrorCode::kInvalidArgument,
                "CudaTransferExecutor: this CUDA runtime has no cudaMemcpyBatchAsync");
  }
}

void CudaTransferExecutor::add_copies(const std::vector<BlockCopy>& copies, bool to_host) {
  const TransferLayout& l = layout_;
  const std::size_t bb = l.block_bytes();
  const bool contiguous = l.device_block_contiguous();
  std::size_t i = 0;
  while (i < copies.size()) {
    // A run: consecutive source and destination blocks.
    std::size_t n = 1;
    while (i + n < copies.size() && copies[i + n].src == copies[i].src + static_cast<int>(n) &&
           copies[i + n].dst == copies[i].dst + static_cast<int>(n)) {
      ++n;
    }
    const auto dev_block = static_cast<std::size_t>(to_host ? copies[i].src : copies[i].dst);
    const auto slot = static_cast<std::size_t>(to_host ? copies[i].dst : copies[i].src);
    char* dev = device_ + dev_block * l.device_block_stride;
    char* hst = host_ + slot * bb;
    const auto add = [&](char* d, std::size_t d_pitch, char* h, std::size_t h_pitch,
                         std::size_t width, std::size_t rows) {
      if (to_host) {
        pieces_.push_back({h, d, width, rows, h_pitch, d_pitch});
      } else {
        pieces_.push_back({d, h, width, rows, d_pitch, h_pitch});
      }
    };
    if (contiguous && (l.num_layers == 1 || l.device_block_stride == bb)) {
      add(dev, n * bb, hst, n * bb, n * bb, 1);  // one range on both sides
    } else if (contiguous) {
      // Each block contiguous but blocks apart: one row per block.
      add(dev, l.device_block_stride, hst, bb, bb, n);
    } else if (l.num_layers <= n) {
      for (std::size_t layer = 0; layer < l.num_layers; ++layer) {
        add(dev + layer * l.device_layer_stride, l.device_block_stride, hst + layer * l.chunk_bytes,
            bb, l.chunk_bytes, n);
      }
    } else {
      for (std::size_t b = 0; b < n; ++b) {
        add(dev + b * l.device_block_stride, l.device_layer_stride, hst + b * bb, l.chunk_bytes,
            l.chunk_bytes, l.num_layers);
      }
    }
    i += n;
  }
}

cudaError_t CudaTransferExecutor::issue(cudaStream_t stream) {
  if (pieces_.empty()) return cudaSuccess;
  if (method_ == CudaTransferMethod::kMemcpy) {
    for (const Piece& p : pieces_) {
      cudaError_t err;
      if (p.rows == 1 || (p.dst_pitch == p.width && p.src_pitch == p.width)) {
        err = cudaMemcpyAsync(p.dst, p.src, p.width * p.rows, cudaMemcpyDefault, stream);
      } else {
        err = cudaMemcpy2DAsync(p.dst, p.dst_pitch, p.src, p.src_pitch, p.width, p.rows,
                                cudaMemcpyDefault, stream);
      }
      ++last_calls_;
      if (err != cudaSuccess) return err;
    }
    return cudaSuccess;
  }
#if CUDART_VERSION >= 12080
  dsts_.clear();
  srcs_.clear();
  sizes_.clear();
  for (const Piece& p : pieces_) {
    if (p.dst_pitch == p.width && p.src_pitch == p.width) {
      dsts_.push_back(p.dst);
      srcs_.push_back(p.src);
      sizes_.push_back(p.width * p.rows);
      continue;
    }
    for (std::size_t r = 0; r < p.rows; ++r) {
      dsts_.push_back(p.dst + r * p.dst_pitch);
      srcs_.push_back(p.src + r * p.src_pitch);
      sizes_.push_back(p.width);
    }
  }
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  std::size_t attr_index = 0;
  ++last_calls_;
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), dsts_.size(), &attr,
                              &attr_index, 1, stream);
#else
  std::size_t fail_index = 0;
  return cudaMemcpyBatchAsync(dsts_.data(), const_cast<void**>(srcs_.data()), sizes_.data(),
                              dsts_.size(), &attr, &attr_index, 1, &fail_index, stream);
#endif
#else
  (void)stream;
  return cudaErrorNotSupported;
#endif
}

cudaError_t CudaTransferExecutor::execute(TransferPlan& plan, TransferStage stage,
                                          cudaStream_t stream, cudaEvent_t done) {
  const auto bit = static_cast<std::uint8_t>(stage);
  if ((plan.executed_stages & bit) != 0) {
    throw Error(ErrorCode::kInvalidState,
                "CudaTransferExecutor: this stage of the plan was already executed");
  }
  if (method_ == CudaTransferMethod::kBatch && stream == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "CudaTransferExecutor: kBatch needs a non-default stream");
  }
  last_calls_ = 0;
  cudaError_t err = cudaSuccess;
  if (stage == TransferStage::kBeforeForward) {
    check_copies(plan.evictions, num_device_blocks_, num_host_slots_, "eviction");
    check_copies(plan.loads, num_host_slots_, num_device_blocks_, "load");
    // Two issues: a load may overwrite a device block that an eviction copies out (write-back
    // hands an evicted block to the hit), and one batch does not order its copies.
    pieces_.clear();
    add_copies(plan.evictions, /*to_host=*/true);
    err = issue(stream);
    if (err != cudaSuccess) return err;
    pieces_.clear();
    add_copies(plan.loads, /*to_host=*/false);
  } else {
    check_copies(plan.stores, num_device_blocks_, num_host_slots_, "store");
    pieces_.clear();
    add_copies(plan.stores, /*to_host=*/true);
  }
  err = issue(stream);
  if (err != cudaSuccess) return err;
  if (done != nullptr) {
    err = cudaEventRecord(done, stream);
    if (err != cudaSuccess) return err;
  }
  plan.executed_stages |= bit;
  return cudaSuccess;
}

}  // namespace pagedkv
