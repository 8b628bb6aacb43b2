// tiny_engine/backend.hpp: where the model's forward pass runs (internal to the tiny engine).
//
// The engine's scheduler (engine.cpp) decides what runs; a backend runs it. Each scheduler step
// hands a backend one ForwardBatch: the new tokens of its sequences, the slot of each new token
// and one block-table row per sequence, exactly as KVCacheManager produced them. The backend
// appends the new K/V through the slot mapping and attends through the block table (decode
// attention for a batch of decode tokens, extend attention for prefill chunks), and returns the
// logits of the rows the scheduler samples.
//
//   CPU  (backend_cpu.cpp)   fp32 dense layers in a fixed accumulation order, pagedkv's CPU
//                            references (double) for kv_append and attention; the KV cache is
//                            host memory (KVCache), which the prefix-hit hook may tamper with.
//   CUDA (backend_cuda.cu)   weights and KV on the GPU; pagedkv::cuda's kv_append, paged decode
//                            attention and paged extend attention; dense layers in kernels that
//                            perform the same IEEE operations in the same order as the CPU path
//                            (no FMA contraction), so they give the CPU's bits. Built when nvcc is
//                            found; without a device (or without CUDA in the build)
//                            make_cuda_backend throws NoCudaDevice.
//
// Both keep per-row independence: a token's outputs do not depend on the other rows of its batch
// (prefix caching changes batches, never results). Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "pagedkv/device/block_table.hpp"

namespace tiny_engine {

class Model;
struct EngineConfig;
struct KVCache;

struct ForwardBatch {
  bool decode = false;                  // one new token per sequence (else prefill chunks)
  std::vector<std::int32_t> tokens;     // [rows] token ids of the new tokens
  std::vector<std::int64_t> positions;  // [rows]
  std::vector<std::int64_t> slots;      // [rows] slot mapping
  pagedkv::BlockTable table;            // one row per sequence
  std::vector<std::int32_t> seq_lens;   // [sequences] new tokens included
  std::vector<std::int32_t> q_indptr;   // [sequences + 1] rows of each sequence
  std::int32_t max_q_len = 0;
  std::vector<std::size_t> sample_rows;  // rows whose logits are wanted, ascending
};

class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;
  // Every KV slot back to NaN (a cold cache for a new run).
  virtual void reset_cache() = 0;
  // Runs the model over the batch; `logits` becomes [sample_rows.size(), vocab].
  virtual void forward(const ForwardBatch& batch, std::vector<float>& logits) = 0;
};

// `cache` is the engine-owned host KV cache the CPU backend reads and writes.
std::unique_ptr<ForwardBackend> make_cpu_backend(const Model& model, const EngineConfig& config,
                                                 KVCache& cache);

// Thrown by make_cuda_backend when this process cannot use a GPU: the build has no CUDA, or no
// CUDA device is visible. (A CUDA driver that is installed but fails throws pagedkv::Error.)
class NoCudaDevice : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Uploads the weights and allocates the KV planes on the current CUDA device. Throws
// NoCudaDevice, std::invalid_argument for a model the kernels do not support (head_dim not
// 64/128/256, GQA group above 16), or std::runtime_error naming a failed CUDA call.
std::unique_ptr<ForwardBackend> make_cuda_backend(const Model& model, const EngineConfig& config);

// Whether this build has the CUDA backend at all.
bool cuda_backend_built() noexcept;

}  // namespace tiny_engine
