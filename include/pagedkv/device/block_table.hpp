// pagedkv/device/block_table.hpp: the device-side view of requests' blocks, built on the host.
//
// Block table: a dense row-major int32 matrix [num_seqs, max_blocks_per_seq]; row i lists the
// physical block ids of sequence i in logical order (token t of the sequence lives in block
// row[t / block_size] at offset t % block_size). Entries past a sequence's blocks hold a padding
// id and are never read by kernels, which only look at the first ceil(seq_len / block_size).
//
// Slot mapping: one int64 per new token, slot = block_id x block_size + offset in block; a
// negative slot (kSkipSlot) means "do not write this token" (padding, or a token whose K/V is
// already cached). kv_append scatters new keys and values to these slots.
//
// These are the layouts vLLM, FlashInfer (dense page table) and TensorRT-LLM kernels consume.
// Complexity: linear in the output size. Thread-compatible value types and pure functions.
// Errors: pagedkv::Error (kInvalidArgument / kOutOfRange) before producing any output.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace pagedkv {

inline constexpr std::int64_t kSkipSlot = -1;

struct BlockTable {
  std::int32_t num_seqs = 0;
  std::int32_t max_blocks_per_seq = 0;  // row length (columns)
  std::vector<std::int32_t> block_ids;  // [num_seqs, max_blocks_per_seq], row-major

  // Row i. Throws pagedkv::Error (kOutOfRange) unless 0 <= seq < num_seqs and block_ids holds
  // that row (the fields are public: a table edited by hand may not).
  std::span<const std::int32_t> row(std::int32_t seq) const;
};

// Builds the dense table from each sequence's block ids (e.g. KVCacheManager::block_ids()).
// max_blocks_per_seq = 0 means "the longest list"; a larger value leaves room for growth (a CUDA
// graph captured with a fixed shape). Unused entries are pad_block_id (the null block 0 by
// default). Throws if a list is longer than max_blocks_per_seq, an id or pad is negative, or
// there are more than INT32_MAX sequences.
BlockTable make_block_table(std::span<const std::vector<std::int32_t>> seq_block_ids,
                            std::int32_t max_blocks_per_seq = 0, std::int32_t pad_block_id = 0);

// The slot of logical token `position` of a sequence whose blocks are `block_ids`. Throws
// (kOutOfRange) when the position is negative or past the last block, (kInvalidArgument) for
// block_size <= 0 or a negative block id.
std::int64_t slot_of(std::span<const std::int32_t> block_ids, std::int32_t block_size,
                     std::int64_t position);

// Appends the slots of tokens first_position .. first_position + num_tokens - 1 of one sequence
// to `slots`: the new tokens of a prefill (first_position = number of prefix-cache hit tokens) or
// the one token of a decode step. On error nothing is appended.
void append_slot_mapping(std::vector<std::int64_t>& slots, std::span<const std::int32_t> block_ids,
                         std::int32_t block_size, std::int64_t first_position,
                         std::int64_t num_tokens);

// Checks a table against sequence lengths and a pool of num_blocks blocks: every block a
// sequence's first seq_len tokens use must be inside its row and in [0, num_blocks). Kernels
// cannot check device data; engines can call this on the host copy in debug builds.
void validate_block_table(std::span<const std::int32_t> block_table, std::int32_t num_seqs,
                          std::int32_t max_blocks_per_seq, std::span<const std::int32_t> seq_lens,
                          std::int32_t block_size, std::int64_t num_blocks);

}  // namespace pagedkv
