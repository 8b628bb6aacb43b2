#include "pagedkv/reference/transfer.hpp"

#include <cstdint>
#include <cstring>
#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv::reference {

namespace {

void check_copies(const std::vector<BlockCopy>& copies, std::size_t num_src, std::size_t num_dst,
                  const char* what) {
  for (const BlockCopy& c : copies) {
    if (c.src < 0 || static_cast<std::size_t>(c.src) >= num_src || c.dst < 0 ||
        static_cast<std::size_t>(c.dst) >= num_dst) {
      throw Error(ErrorCode::kOutOfRange, std::string("execute_transfer_plan: ") + what + " copy " +
                                              std::to_string(c.src) + " -> " +
                                              std::to_string(c.dst) + " is out of range");
    }
  }
}

}  // namespace

void execute_transfer_plan(TransferPlan& plan, TransferStage stage, const TransferLayout& layout,
                           std::span<std::byte> device, std::size_t num_device_blocks,
                           std::span<std::byte> host, std::size_t num_host_slots) {
  if (stage != TransferStage::kBeforeForward && stage != TransferStage::kAfterForward) {
    throw Error(ErrorCode::kInvalidArgument, "execute_transfer_plan: unknown stage " +
                                                 std::to_string(static_cast<unsigned>(stage)));
  }
  const auto bit = static_cast<std::uint8_t>(stage);
  if ((plan.executed_stages & bit) != 0) {
    throw Error(ErrorCode::kInvalidState,
                "execute_transfer_plan: this stage of the plan was already executed");
  }
  if (layout.chunk_bytes == 0 || layout.num_layers == 0) {
    throw Error(ErrorCode::kInvalidArgument, "execute_transfer_plan: empty layout");
  }
  // The caller's counts and strides: a product that wraps would pass the size checks below and
  // send the copies outside the buffers.
  std::size_t block_bytes = 0;
  std::size_t host_bytes = 0;
  std::size_t device_bytes = 0;
  bool overflow = __builtin_mul_overflow(layout.num_layers, layout.chunk_bytes, &block_bytes) ||
                  __builtin_mul_overflow(num_host_slots, block_bytes, &host_bytes);
  if (num_device_blocks > 0) {
    std::size_t blocks = 0;
    std::size_t layers = 0;
    overflow = overflow ||
               __builtin_mul_overflow(num_device_blocks - 1, layout.device_block_stride, &blocks) ||
               __builtin_mul_overflow(layout.num_layers - 1, layout.device_layer_stride, &layers) ||
               __builtin_add_overflow(blocks, layers, &device_bytes) ||
               __builtin_add_overflow(device_bytes, layout.chunk_bytes, &device_bytes);
  }
  if (overflow) {
    throw Error(ErrorCode::kInvalidArgument,
                "execute_transfer_plan: the buffer sizes the layout and counts need overflow "
                "size_t");
  }
  if (device.size() < device_bytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "execute_transfer_plan: the device buffer is smaller than its blocks need");
  }
  if (host.size() < host_bytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "execute_transfer_plan: the host buffer is smaller than its slots need");
  }
  // memcpy between overlapping ranges is undefined: the parts of the buffers the copies may touch
  // must be disjoint.
  const auto begin = [](std::span<std::byte> b) {
    return reinterpret_cast<std::uintptr_t>(b.data());
  };
  if (device_bytes > 0 && host_bytes > 0 && begin(device) < begin(host) + host_bytes &&
      begin(host) < begin(device) + device_bytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "execute_transfer_plan: the device and host buffers overlap");
  }
  const auto dev = [&](std::int32_t b, std::size_t l) {
    return device.data() + static_cast<std::size_t>(b) * layout.device_block_stride +
           l * layout.device_layer_stride;
  };
  const auto hst = [&](std::int32_t s, std::size_t l) {
    return host.data() + static_cast<std::size_t>(s) * layout.block_bytes() +
           l * layout.chunk_bytes;
  };
  if (stage == TransferStage::kBeforeForward) {
    check_copies(plan.evictions, num_device_blocks, num_host_slots, "eviction");
    check_copies(plan.loads, num_host_slots, num_device_blocks, "load");
    for (const BlockCopy& c : plan.evictions) {
      for (std::size_t l = 0; l < layout.num_layers; ++l)
        std::memcpy(hst(c.dst, l), dev(c.src, l), layout.chunk_bytes);
    }
    for (const BlockCopy& c : plan.loads) {
      for (std::size_t l = 0; l < layout.num_layers; ++l)
        std::memcpy(dev(c.dst, l), hst(c.src, l), layout.chunk_bytes);
    }
  } else {
    check_copies(plan.stores, num_device_blocks, num_host_slots, "store");
    for (const BlockCopy& c : plan.stores) {
      for (std::size_t l = 0; l < layout.num_layers; ++l)
        std::memcpy(hst(c.dst, l), dev(c.src, l), layout.chunk_bytes);
    }
  }
  plan.executed_stages |= bit;
}

}  // namespace pagedkv::reference
