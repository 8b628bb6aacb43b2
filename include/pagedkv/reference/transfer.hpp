// pagedkv/reference/transfer.hpp: the CPU reference executor of a TransferPlan
// (pagedkv/base/transfer_plan.hpp): memcpy between a device KV buffer (either layout) and a
// block-first host buffer. Tests and CPU engines use it; the CUDA executor must match it.
//
// Errors (pagedkv::Error, nothing copied): the stage already executed (kInvalidState), a block
// index outside the buffers (kOutOfRange), a stage that is not kBeforeForward or kAfterForward,
// buffers smaller than the layout needs, device and host ranges (the bytes the copies may touch)
// that overlap, sizes (counts x strides) that overflow size_t or a zero chunk (kInvalidArgument).
// Complexity: linear in the bytes moved. Thread-compatible.
#pragma once

#include <cstddef>
#include <span>

#include "pagedkv/base/transfer_plan.hpp"

namespace pagedkv::reference {

// Runs one stage of `plan` (kBeforeForward: evictions then loads; kAfterForward: stores) and
// marks it executed. `device` holds num_device_blocks blocks laid out as `layout` says; `host`
// holds num_host_slots slots of layout.block_bytes() each.
void execute_transfer_plan(TransferPlan& plan, TransferStage stage, const TransferLayout& layout,
                           std::span<std::byte> device, std::size_t num_device_blocks,
                           std::span<std::byte> host, std::size_t num_host_slots);

}  // namespace pagedkv::reference
