#include "pagedkv/device/block_table.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "pagedkv/base/error.hpp"

namespace pagedkv {
namespace {

using testing::expect_error;

TEST(BlockTable, DenseRowsWithPadding) {
  const std::vector<std::vector<std::int32_t>> ids = {{7, 3, 9}, {}, {4}};
  const BlockTable table = make_block_table(ids);
  EXPECT_EQ(table.num_seqs, 3);
  EXPECT_EQ(table.max_blocks_per_seq, 3);
  EXPECT_EQ(table.block_ids, (std::vector<std::int32_t>{7, 3, 9, 0, 0, 0, 4, 0, 0}));
  EXPECT_EQ(std::vector<std::int32_t>(table.row(2).begin(), table.row(2).end()),
            (std::vector<std::int32_t>{4, 0, 0}));

  const BlockTable wide = make_block_table(ids, 5, 11);
  EXPECT_EQ(wide.max_blocks_per_seq, 5);
  EXPECT_EQ(wide.block_ids,
            (std::vector<std::int32_t>{7, 3, 9, 11, 11, 11, 11, 11, 11, 11, 4, 11, 11, 11, 11}));

  const BlockTable empty = make_block_table({});
  EXPECT_EQ(empty.num_seqs, 0);
  EXPECT_TRUE(empty.block_ids.empty());
}

TEST(BlockTable, RowOutsideTheTableIsAnError) {
  // row() once built a span past block_ids (undefined behaviour) for a row it did not hold.
  const std::vector<std::vector<std::int32_t>> seqs = {{1, 2}, {3}, {}};
  BlockTable table = make_block_table(seqs, 2);
  EXPECT_EQ(table.row(1).size(), 2u);
  for (const std::int32_t seq : {3, -1, 1 << 30}) {
    expect_error([&] { (void)table.row(seq); }, ErrorCode::kOutOfRange, "outside the table");
  }
  table.block_ids.resize(5);  // edited by hand: the last row is short
  EXPECT_EQ(table.row(1)[0], 3);
  expect_error([&] { (void)table.row(2); }, ErrorCode::kOutOfRange, "(5 entries)");
}

TEST(BlockTable, RejectsBadInput) {
  const std::vector<std::vector<std::int32_t>> ids = {{1, 2, 3}};
  expect_error([&] { (void)make_block_table(ids, 2); }, ErrorCode::kOutOfRange,
               "more than max_blocks_per_seq");
  expect_error([&] { (void)make_block_table(ids, -1); }, ErrorCode::kInvalidArgument,
               "max_blocks_per_seq");
  expect_error([&] { (void)make_block_table(ids, 0, -1); }, ErrorCode::kInvalidArgument,
               "pad_block_id");
  const std::vector<std::vector<std::int32_t>> negative = {{1}, {2, -5}};
  expect_error([&] { (void)make_block_table(negative); }, ErrorCode::kInvalidArgument,
               "sequence 1 has a negative block id -5");
}

TEST(SlotMapping, SlotIsBlockTimesSizePlusOffset) {
  const std::vector<std::int32_t> blocks = {5, 2, 8};
  EXPECT_EQ(slot_of(blocks, 16, 0), 80);
  EXPECT_EQ(slot_of(blocks, 16, 15), 95);
  EXPECT_EQ(slot_of(blocks, 16, 16), 32);
  EXPECT_EQ(slot_of(blocks, 16, 47), 143);
  // 64-bit slots: block ids near INT32_MAX times a block size of 256.
  const std::vector<std::int32_t> big = {2147483000};
  EXPECT_EQ(slot_of(big, 256, 255), 2147483000LL * 256 + 255);

  // A prefill after a 20-token prefix hit: tokens 20..39, then one decode token.
  std::vector<std::int64_t> slots = {kSkipSlot};
  append_slot_mapping(slots, blocks, 16, 20, 20);
  append_slot_mapping(slots, blocks, 16, 40, 1);
  ASSERT_EQ(slots.size(), 22u);
  EXPECT_EQ(slots[0], kSkipSlot);
  for (std::int64_t p = 20; p < 41; ++p) {
    EXPECT_EQ(slots[static_cast<std::size_t>(p - 19)], slot_of(blocks, 16, p)) << p;
  }
  EXPECT_EQ(slots[1], 2 * 16 + 4);
  append_slot_mapping(slots, blocks, 16, 40, 0);  // no tokens: nothing appended
  EXPECT_EQ(slots.size(), 22u);
}

// One token per call (a decode step's slot mapping built sequence by sequence) grows the vector
// geometrically. Before, each call reserved exactly size + num_tokens: a reallocation and a copy
// of everything appended so far at every call.
TEST(SlotMapping, AppendingOneTokenAtATimeGrowsGeometrically) {
  const std::vector<std::int32_t> blocks = {3};
  std::vector<std::int64_t> slots;
  int reallocations = 0;
  for (int i = 0; i < 4096; ++i) {
    const std::size_t before = slots.capacity();
    append_slot_mapping(slots, blocks, 16, i % 16, 1);
    if (slots.capacity() != before) ++reallocations;
  }
  EXPECT_EQ(slots.size(), 4096u);
  EXPECT_LT(reallocations, 32);
  EXPECT_EQ(slots[17], 3 * 16 + 1);
}

TEST(SlotMapping, RejectsPositionsOutsideTheBlocks) {
  const std::vector<std::int32_t> blocks = {5, 2};
  expect_error([&] { (void)slot_of(blocks, 16, 32); }, ErrorCode::kOutOfRange, "position 32");
  expect_error([&] { (void)slot_of(blocks, 16, -1); }, ErrorCode::kOutOfRange, "position -1");
  expect_error([&] { (void)slot_of(blocks, 0, 0); }, ErrorCode::kInvalidArgument, "block_size");
  std::vector<std::int64_t> slots = {1, 2};
  expect_error([&] { append_slot_mapping(slots, blocks, 16, 20, 13); }, ErrorCode::kOutOfRange,
               "position 32");
  expect_error([&] { append_slot_mapping(slots, blocks, 16, 0, -1); }, ErrorCode::kInvalidArgument,
               "num_tokens");
  // The last position first_position + num_tokens - 1 once overflowed (signed, UB) and the
  // error named a negative position the caller never gave.
  expect_error(
      [&] { append_slot_mapping(slots, blocks, 16, 2, std::numeric_limits<std::int64_t>::max()); },
      ErrorCode::kOutOfRange, "9223372036854775807 tokens from position 2");
  const std::vector<std::int32_t> bad = {5, -1, 3};
  expect_error([&] { append_slot_mapping(slots, bad, 4, 2, 8); }, ErrorCode::kInvalidArgument,
               "negative block id");
  EXPECT_EQ(slots, (std::vector<std::int64_t>{1, 2}));  // untouched by the failed calls
}

TEST(BlockTable, ValidateAgainstLengthsAndPool) {
  const std::vector<std::vector<std::int32_t>> ids = {{7, 3}, {4}};
  const BlockTable table = make_block_table(ids, 3, 99);  // padding 99 is outside the pool
  const std::vector<std::int32_t> lens = {17, 16};
  EXPECT_NO_THROW(validate_block_table(table.block_ids, 2, 3, lens, 16, 10));
  const std::vector<std::int32_t> too_long = {17, 17};  // sequence 1 would use padding 99
  expect_error([&] { validate_block_table(table.block_ids, 2, 3, too_long, 16, 10); },
               ErrorCode::kOutOfRange, "sequence 1 block 1 has id 99");
  const std::vector<std::int32_t> beyond_row = {49, 0};
  expect_error([&] { validate_block_table(table.block_ids, 2, 3, beyond_row, 16, 10); },
               ErrorCode::kOutOfRange, "needs 4 blocks, the row has 3");
  const std::vector<std::int32_t> negative = {-1, 0};
  expect_error([&] { validate_block_table(table.block_ids, 2, 3, negative, 16, 10); },
               ErrorCode::kInvalidArgument, "negative length");
  expect_error([&] { validate_block_table(table.block_ids, 2, 3, lens, 16, 7); },
               ErrorCode::kOutOfRange, "sequence 0 block 0 has id 7");
  expect_error([&] { validate_block_table(table.block_ids, 3, 3, lens, 16, 10); },
               ErrorCode::kInvalidArgument, "the table has 6 entries");
}

}  // namespace
}  // namespace pagedkv
