// pagedkv/base/transfer_plan.hpp: block copies between device KV memory and a host tier, as plain
// data. The tier layer (pagedkv/tier) produces plans; executors run them: the CPU reference
// (pagedkv/reference/transfer.hpp) and the CUDA executor (pagedkv/cuda/transfer.hpp). It sits in
// base because both branches of the layer tree (tier above the manager, cuda above device) use it.
//
// A plan has three stages, executed in this order on one stream:
//   evictions  device block -> host slot, BEFORE the loads and the forward pass: the old contents
//              of device blocks that this step's allocation took over (write-back), copied out
//              before their new owner (or a load) overwrites them;
//   loads      host slot -> device block, before the forward pass that reads them;
//   stores     device block -> host slot, AFTER the forward pass that writes them (write-through).
// Every copy moves one whole block: all layers, K and V (TransferLayout says where they lie), of
// one KV-cache group. A hybrid model's groups have their own layers (and the engine its own
// device layout per group): each copy names its group, and an engine runs a group's copies with
// that group's layout (e.g. the executors on a plan filtered by group). Single-group models: 0.
// An executor marks each stage it ran; running a stage twice throws pagedkv::Error
// (kInvalidState) with nothing copied. Thread-compatible plain data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pagedkv {

struct BlockCopy {
  std::int32_t src = 0;    // block index on the source side (device block id or host slot)
  std::int32_t dst = 0;    // block index on the destination side
  std::int32_t group = 0;  // the KV-cache group whose layers the block holds (0: the only one)

  bool operator==(const BlockCopy&) const = default;
};

enum class TransferStage : std::uint8_t {
  kBeforeForward = 1,  // evictions, then loads
  kAfterForward = 2,   // stores
};

struct TransferPlan {
  std::vector<BlockCopy> evictions;  // device -> host, first
  std::vector<BlockCopy> loads;      // host -> device, second
  std::vector<BlockCopy> stores;     // device -> host, after the forward pass
  std::uint8_t executed_stages = 0;  // TransferStage bits set by executors

  bool empty() const noexcept { return evictions.empty() && loads.empty() && stores.empty(); }
  std::size_t num_copies() const noexcept {
    return evictions.size() + loads.size() + stores.size();
  }
};

// The copies of `plan` that belong to KV-cache group `group`, as a plan of their own (stages
// executed: none), for an executor that runs one group's layout at a time. O(copies).
inline TransferPlan group_plan(const TransferPlan& plan, std::int32_t group) {
  TransferPlan out;
  for (const BlockCopy& c : plan.evictions)
    if (c.group == group) out.evictions.push_back(c);
  for (const BlockCopy& c : plan.loads)
    if (c.group == group) out.loads.push_back(c);
  for (const BlockCopy& c : plan.stores)
    if (c.group == group) out.stores.push_back(c);
  return out;
}

// Where one block's bytes lie. The host side is always block-first: slot s holds its layers
// back to back, layer l at s * block_bytes() + l * chunk_bytes (a slot is one block's K/V for
// every layer). The device side has either layout:
//   block-first: device_block_stride = block_bytes(), device_layer_stride = chunk_bytes;
//   layer-first: device_layer_stride = num_device_blocks * chunk_bytes,
//                device_block_stride = chunk_bytes.
struct TransferLayout {
  std::size_t num_layers = 1;           // chunks per block
  std::size_t chunk_bytes = 0;          // one block's K and V in one layer
  std::size_t device_block_stride = 0;  // bytes from block b to b + 1 in one layer
  std::size_t device_layer_stride = 0;  // bytes from layer l to l + 1 of one block

  std::size_t block_bytes() const noexcept { return num_layers * chunk_bytes; }
  bool device_block_contiguous() const noexcept {
    return num_layers == 1 || device_layer_stride == chunk_bytes;
  }
  static TransferLayout block_first(std::size_t num_layers, std::size_t chunk_bytes) {
    return {num_layers, chunk_bytes, num_layers * chunk_bytes, chunk_bytes};
  }
  static TransferLayout layer_first(std::size_t num_layers, std::size_t chunk_bytes,
                                    std::size_t num_device_blocks) {
    return {num_layers, chunk_bytes, chunk_bytes, num_device_blocks * chunk_bytes};
  }
};

}  // namespace pagedkv
