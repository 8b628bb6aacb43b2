// The CPU reference executor of a TransferPlan (pagedkv/reference/transfer.hpp) on hostile
// arguments: nothing is copied and the plan is not marked when it throws.
#include "pagedkv/reference/transfer.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include "expect_error.hpp"
#include "pagedkv/base/error.hpp"

namespace pagedkv {
namespace {

constexpr std::size_t kHalf = std::size_t{1} << (std::numeric_limits<std::size_t>::digits - 1);

TEST(ReferenceTransfer, CopiesBlocksBothWays) {
  const TransferLayout layout = TransferLayout::block_first(2, 4);
  std::vector<std::byte> device(3 * 8);
  std::vector<std::byte> host(2 * 8);
  for (std::size_t i = 0; i < device.size(); ++i) device[i] = static_cast<std::byte>(i);
  TransferPlan plan;
  plan.evictions.push_back({2, 1});
  plan.loads.push_back({1, 0});
  reference::execute_transfer_plan(plan, TransferStage::kBeforeForward, layout, device, 3, host, 2);
  for (std::size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(host[8 + i], static_cast<std::byte>(16 + i));
    EXPECT_EQ(device[i], static_cast<std::byte>(16 + i));
  }
  EXPECT_EQ(plan.executed_stages, static_cast<std::uint8_t>(TransferStage::kBeforeForward));
}

TEST(ReferenceTransfer, RejectsUnknownStage) {
  // A stage value that is neither kBeforeForward nor kAfterForward once ran the stores (and
  // 3 marked both stages executed).
  const TransferLayout layout = TransferLayout::block_first(1, 8);
  std::vector<std::byte> device(8, std::byte{1});
  std::vector<std::byte> host(8, std::byte{0});
  for (const unsigned value : {0u, 3u, 4u, 255u}) {
    TransferPlan plan;
    plan.stores.push_back({0, 0});
    testing::expect_error(
        [&] {
          reference::execute_transfer_plan(plan, static_cast<TransferStage>(value), layout, device,
                                           1, host, 1);
        },
        ErrorCode::kInvalidArgument, "unknown stage");
    EXPECT_EQ(plan.executed_stages, 0);
    EXPECT_EQ(host[0], std::byte{0});
  }
}

// Device and host ranges in one buffer: memcpy between overlapping ranges is undefined, so the
// call is refused before anything is copied; disjoint parts of one buffer are fine.
TEST(ReferenceTransfer, RejectsOverlappingBuffers) {
  const TransferLayout layout = TransferLayout::block_first(2, 4);  // 8-byte blocks
  std::vector<std::byte> one(64);
  for (std::size_t i = 0; i < one.size(); ++i) one[i] = static_cast<std::byte>(i);
  const std::span<std::byte> all(one);
  TransferPlan plan;
  plan.evictions.push_back({0, 0});
  // Device blocks 0-2 at bytes 0-23, host slots 0-1 at bytes 16-31: they share bytes 16-23.
  testing::expect_error(
      [&] {
        reference::execute_transfer_plan(plan, TransferStage::kBeforeForward, layout,
                                         all.subspan(0, 24), 3, all.subspan(16, 16), 2);
      },
      ErrorCode::kInvalidArgument, "overlap");
  EXPECT_EQ(plan.executed_stages, 0);
  for (std::size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], static_cast<std::byte>(i));
  // Host first, device after it, sharing one byte.
  testing::expect_error(
      [&] {
        reference::execute_transfer_plan(plan, TransferStage::kBeforeForward, layout,
                                         all.subspan(31, 24), 3, all.subspan(16, 16), 2);
      },
      ErrorCode::kInvalidArgument, "overlap");
  // Disjoint parts of one buffer: copied.
  reference::execute_transfer_plan(plan, TransferStage::kBeforeForward, layout, all.subspan(0, 24),
                                   3, all.subspan(32, 16), 2);
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(one[32 + i], static_cast<std::byte>(i));
}

TEST(ReferenceTransfer, RejectsSizesThatOverflow) {
  std::vector<std::byte> device(64, std::byte{1});
  std::vector<std::byte> host(64, std::byte{0});
  const auto expect_overflow = [&](const TransferLayout& layout, std::size_t device_blocks,
                                   std::size_t host_slots, const TransferPlan& copies) {
    TransferPlan plan = copies;
    testing::expect_error(
        [&] {
          reference::execute_transfer_plan(plan, TransferStage::kBeforeForward, layout, device,
                                           device_blocks, host, host_slots);
        },
        ErrorCode::kInvalidArgument, "overflow");
    EXPECT_EQ(plan.executed_stages, 0);
  };
  TransferPlan evict;
  evict.evictions.push_back({1, 0});
  // (3 - 1) x 2^63 wrapped to 0: the device check saw 16 bytes, block 1 lay 2^63 bytes away.
  expect_overflow({1, 16, kHalf, 16}, 3, 1, evict);
  // (3 - 1) layers x 2^63 likewise.
  TransferPlan evict0;
  evict0.evictions.push_back({0, 0});
  expect_overflow({3, 16, 48, kHalf}, 1, 1, evict0);
  // num_layers x chunk_bytes wrapped to 16: 2^60 + 1 layers written past the host slot.
  expect_overflow({(std::size_t{1} << 60) + 1, 16, 16, 0}, 1, 1, evict0);
  // num_host_slots x block_bytes wrapped to 0.
  TransferPlan load;
  load.loads.push_back({1, 0});
  expect_overflow(TransferLayout::block_first(1, 16), 1, kHalf / 8, load);
  EXPECT_EQ(host[0], std::byte{0});
  EXPECT_EQ(device[0], std::byte{1});
}

}  // namespace
}  // namespace pagedkv
