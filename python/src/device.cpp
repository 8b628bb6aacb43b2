// python/src/device.cpp: block tables and slot mappings as numpy arrays (device/block_table.hpp).
// Results are arrays that own the library's output vectors (moved in, never copied).
#include <string>
#include <vector>

#include "common.hpp"
#include "pagedkv/device/block_table.hpp"

namespace pagedkv::python {

namespace {

std::vector<std::int32_t> int32_vector(py::handle obj, const char* what) {
  std::vector<std::int32_t> out;
  for (const std::int64_t v : to_int64_vector(obj, what)) {
    if (v < std::numeric_limits<std::int32_t>::min() ||
        v > std::numeric_limits<std::int32_t>::max()) {
      throw Error(ErrorCode::kOutOfRange,
                  std::string(what) + ": " + std::to_string(v) + " does not fit in 32 bits");
    }
    out.push_back(static_cast<std::int32_t>(v));
  }
  return out;
}

}  // namespace

void bind_device(py::module_& m) {
  m.attr("SKIP_SLOT") = kSkipSlot;
  m.def(
      "make_block_table",
      [](py::object seq_block_ids, std::int32_t max_blocks_per_seq, std::int32_t pad_block_id) {
        std::vector<std::vector<std::int32_t>> rows;
        for (py::handle r : seq_block_ids) rows.push_back(int32_vector(r, "make_block_table"));
        BlockTable t = make_block_table(rows, max_blocks_per_seq, pad_block_id);
        return array_owning(std::move(t.block_ids), {t.num_seqs, t.max_blocks_per_seq});
      },
      py::arg("seq_block_ids"), py::arg("max_blocks_per_seq") = 0, py::arg("pad_block_id") = 0,
      "Dense int32 [num_seqs, max_blocks_per_seq] block table from each sequence's block ids.");
  m.def(
      "slot_of",
      [](py::object block_ids, std::int32_t block_size, std::int64_t position) {
        return slot_of(int32_vector(block_ids, "slot_of"), block_size, position);
      },
      py::arg("block_ids"), py::arg("block_size"), py::arg("position"),
      "The slot (block_id * block_size + offset) of one token of a sequence.");
  m.def(
      "slot_mapping",
      [](py::object block_ids, std::int32_t block_size, std::int64_t first_position,
         std::int64_t num_tokens) {
        std::vector<std::int64_t> slots;
        append_slot_mapping(slots, int32_vector(block_ids, "slot_mapping"), block_size,
                            first_position, num_tokens);
        const auto n = static_cast<py::ssize_t>(slots.size());
        return array_owning(std::move(slots), {n});
      },
      py::arg("block_ids"), py::arg("block_size"), py::arg("first_position"), py::arg("num_tokens"),
      "int64 slots of tokens [first_position, first_position + num_tokens).");
  m.def(
      "validate_block_table",
      [](py::object table_obj, py::object seq_lens, std::int32_t block_size,
         std::int64_t num_blocks) {
        // 2-D: a C-contiguous int32 array is read in place; any other integer table is checked
        // row-major through the 1-D conversion (no float, bool or out-of-range entry).
        py::array table = py::array::ensure(table_obj);
        if (!table || table.ndim() != 2) {
          PyErr_Clear();
          throw Error(ErrorCode::kInvalidArgument,
                      "validate_block_table: table must be a 2-D integer array");
        }
        std::vector<std::int32_t> converted;
        std::span<const std::int32_t> cells;
        if (py::isinstance<py::array_t<std::int32_t>>(table) &&
            (table.flags() & py::array::c_style)) {
          cells = std::span<const std::int32_t>(static_cast<const std::int32_t*>(table.data()),
                                                static_cast<std::size_t>(table.size()));
        } else {
          converted = int32_vector(table.attr("reshape")(-1), "validate_block_table: table");
          cells = converted;
        }
        const auto lens = int32_vector(seq_lens, "validate_block_table: seq_lens");
        validate_block_table(cells, static_cast<std::int32_t>(table.shape(0)),
                             static_cast<std::int32_t>(table.shape(1)), lens, block_size,
                             num_blocks);
      },
      py::arg("table"), py::arg("seq_lens"), py::arg("block_size"), py::arg("num_blocks"),
      "Raises pagedkv.Error when a sequence's blocks fall outside its row or the pool.");
}

}  // namespace pagedkv::python
