#include "pagedkv/device/block_table.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "../base/vector_growth.hpp"
#include "pagedkv/base/error.hpp"

namespace pagedkv {

std::span<const std::int32_t> BlockTable::row(std::int32_t seq) const {
  const auto width = static_cast<std::size_t>(std::max(max_blocks_per_seq, 0));
  if (seq < 0 || seq >= num_seqs ||
      (static_cast<std::size_t>(seq) + 1) * width > block_ids.size()) {
    throw Error(ErrorCode::kOutOfRange, "BlockTable::row: row " + std::to_string(seq) +
                                            " is outside the table of " + std::to_string(num_seqs) +
                                            " rows of " + std::to_string(max_blocks_per_seq) +
                                            " (" + std::to_string(block_ids.size()) + " entries)");
  }
  return std::span<const std::int32_t>(block_ids).subspan(static_cast<std::size_t>(seq) * width,
                                                          width);
}

BlockTable make_block_table(std::span<const std::vector<std::int32_t>> seq_block_ids,
                            std::int32_t max_blocks_per_seq, std::int32_t pad_block_id) {
  if (seq_block_ids.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    throw Error(ErrorCode::kInvalidArgument, "make_block_table: more than INT32_MAX sequences");
  }
  if (max_blocks_per_seq < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "make_block_table: max_blocks_per_seq must not be negative, got " +
                    std::to_string(max_blocks_per_seq));
  }
  if (pad_block_id < 0) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "make_block_table: pad_block_id must not be negative, got " + std::to_string(pad_block_id));
  }
  std::size_t longest = 0;
  for (std::size_t i = 0; i < seq_block_ids.size(); ++i) {
    const auto& ids = seq_block_ids[i];
    longest = std::max(longest, ids.size());
    for (std::size_t j = 0; j < ids.size(); ++j) {
      if (ids[j] < 0) {
        throw Error(ErrorCode::kInvalidArgument, "make_block_table: sequence " + std::to_string(i) +
                                                     " has a negative block id " +
                                                     std::to_string(ids[j]) + " at index " +
                                                     std::to_string(j));
      }
    }
  }
  if (max_blocks_per_seq == 0) {
    if (longest > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
      throw Error(ErrorCode::kInvalidArgument, "make_block_table: a row longer than INT32_MAX");
    }
    max_blocks_per_seq = static_cast<std::int32_t>(longest);
  } else if (longest > static_cast<std::size_t>(max_blocks_per_seq)) {
    throw Error(
        ErrorCode::kOutOfRange,
        "make_block_table: a sequence has " + std::to_string(longest) +
            " blocks, more than max_blocks_per_seq = " + std::to_string(max_blocks_per_seq));
  }

  BlockTable table;
  table.num_seqs = static_cast<std::int32_t>(seq_block_ids.size());
  table.max_blocks_per_seq = max_blocks_per_seq;
  table.block_ids.assign(seq_block_ids.size() * static_cast<std::size_t>(max_blocks_per_seq),
                         pad_block_id);
  for (std::size_t i = 0; i < seq_block_ids.size(); ++i) {
    std::copy(seq_block_ids[i].begin(), seq_block_ids[i].end(),
              table.block_ids.begin() +
                  static_cast<std::ptrdiff_t>(i * static_cast<std::size_t>(max_blocks_per_seq)));
  }
  return table;
}

std::int64_t slot_of(std::span<const std::int32_t> block_ids, std::int32_t block_size,
                     std::int64_t position) {
  if (block_size <= 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "slot_of: block_size must be positive, got " + std::to_string(block_size));
  }
  if (position < 0 || position / block_size >= static_cast<std::int64_t>(block_ids.size())) {
    throw Error(ErrorCode::kOutOfRange, "slot_of: position " + std::to_string(position) +
                                            " is outside the " + std::to_string(block_ids.size()) +
                                            " blocks of " + std::to_string(block_size) + " tokens");
  }
  const std::int32_t block = block_ids[static_cast<std::size_t>(position / block_size)];
  if (block < 0) {
    throw Error(ErrorCode::kInvalidArgument, "slot_of: negative block id " + std::to_string(block));
  }
  return static_cast<std::int64_t>(block) * block_size + position % block_size;
}

void append_slot_mapping(std::vector<std::int64_t>& slots, std::span<const std::int32_t> block_ids,
                         std::int32_t block_size, std::int64_t first_position,
                         std::int64_t num_tokens) {
  if (num_tokens < 0) {
    throw Error(
        ErrorCode::kInvalidArgument,
        "append_slot_mapping: num_tokens must not be negative, got " + std::to_string(num_tokens));
  }
  if (num_tokens == 0) return;
  // Check both ends (and every block id in between) before appending anything.
  (void)slot_of(block_ids, block_size, first_position);
  std::int64_t last_position = 0;
  if (__builtin_add_overflow(first_position, num_tokens - 1, &last_position)) {
    throw Error(ErrorCode::kOutOfRange,
                "append_slot_mapping: " + std::to_string(num_tokens) + " tokens from position " +
                    std::to_string(first_position) + " run past the largest position");
  }
  (void)slot_of(block_ids, block_size, last_position);
  const auto first_block = static_cast<std::size_t>(first_position / block_size);
  const auto last_block = static_cast<std::size_t>(last_position / block_size);
  for (std::size_t b = first_block; b <= last_block; ++b) {
    if (block_ids[b] < 0) {
      throw Error(ErrorCode::kInvalidArgument, "append_slot_mapping: negative block id " +
                                                   std::to_string(block_ids[b]) + " at index " +
                                                   std::to_string(b));
    }
  }
  detail::reserve_more(slots, static_cast<std::size_t>(num_tokens));
  for (std::int64_t p = first_position; p < first_position + num_tokens; ++p) {
    slots.push_back(static_cast<std::int64_t>(block_ids[static_cast<std::size_t>(p / block_size)]) *
                        block_size +
                    p % block_size);
  }
}

void validate_block_table(std::span<const std::int32_t> block_table, std::int32_t num_seqs,
                          std::int32_t max_blocks_per_seq, std::span<const std::int32_t> seq_lens,
                          std::int32_t block_size, std::int64_t num_blocks) {
  constexpr const char* kWhere = "validate_block_table: ";
  if (num_seqs < 0 || max_blocks_per_seq < 0 || block_size <= 0 || num_blocks <= 0) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(kWhere) + "bad shape (num_seqs " + std::to_string(num_seqs) +
                    ", max_blocks_per_seq " + std::to_string(max_blocks_per_seq) + ", block_size " +
                    std::to_string(block_size) + ", num_blocks " + std::to_string(num_blocks) +
                    ")");
  }
  const auto cells =
      static_cast<std::size_t>(num_seqs) * static_cast<std::size_t>(max_blocks_per_seq);
  if (block_table.size() < cells) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string(kWhere) + "the table has " + std::to_string(block_table.size()) +
                    " entries, the shape needs " + std::to_string(cells));
  }
  if (seq_lens.size() < static_cast<std::size_t>(num_seqs)) {
    throw Error(ErrorCode::kInvalidArgument, std::string(kWhere) + "seq_lens has " +
                                                 std::to_string(seq_lens.size()) + " entries for " +
                                                 std::to_string(num_seqs) + " sequences");
  }
  for (std::int32_t s = 0; s < num_seqs; ++s) {
    const std::int32_t len = seq_lens[static_cast<std::size_t>(s)];
    if (len < 0) {
      throw Error(ErrorCode::kInvalidArgument, std::string(kWhere) + "sequence " +
                                                   std::to_string(s) + " has negative length " +
                                                   std::to_string(len));
    }
    const std::int64_t used = (static_cast<std::int64_t>(len) + block_size - 1) / block_size;
    if (used > max_blocks_per_seq) {
      throw Error(ErrorCode::kOutOfRange, std::string(kWhere) + "sequence " + std::to_string(s) +
                                              " of " + std::to_string(len) + " tokens needs " +
                                              std::to_string(used) + " blocks, the row has " +
                                              std::to_string(max_blocks_per_seq));
    }
    for (std::int64_t b = 0; b < used; ++b) {
      const std::int32_t id =
          block_table[static_cast<std::size_t>(s) * static_cast<std::size_t>(max_blocks_per_seq) +
                      static_cast<std::size_t>(b)];
      if (id < 0 || id >= num_blocks) {
        throw Error(ErrorCode::kOutOfRange, std::string(kWhere) + "sequence " + std::to_string(s) +
                                                " block " + std::to_string(b) + " has id " +
                                                std::to_string(id) + ", outside the pool of " +
                                                std::to_string(num_blocks) + " blocks");
      }
    }
  }
}

}  // namespace pagedkv
