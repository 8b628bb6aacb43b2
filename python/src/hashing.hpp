// python/src/hashing.hpp: conversions of hash keys shared by the hashing and manager bindings.
#pragma once

#include <optional>
#include <string>

#include "common.hpp"
#include "pagedkv/hash/request_hasher.hpp"
#include "pagedkv/pool/kv_events.hpp"

namespace pagedkv::python {

// A request's keys from Python: mm_items is None or an iterable of (identifier, offset, length)
// tuples or objects with those attributes.
RequestHashKeys hash_keys_from(const std::optional<std::string>& cache_salt,
                               const std::optional<std::string>& lora_name,
                               const py::object& mm_items);

// One block's extra keys as vLLM's events carry them: None, or a tuple in vLLM's order (LoRA
// name, (identifier, offset) per multimodal item, cache salt).
py::object extra_keys_tuple(const OwnedExtraKeys& keys);

}  // namespace pagedkv::python
