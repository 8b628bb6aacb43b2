// python/src/objects.hpp: the Python-side objects shared by the binding files (not installed):
// requests, the plain manager, KV events, and the helpers that read them back.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"
#include "pagedkv/pool/kv_events.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv::python {

struct PyRequest {
  explicit PyRequest(Request r) : req(std::move(r)) {}
  Request req;
  std::atomic<bool> busy{false};
};

struct PyKVCacheManager {
  explicit PyKVCacheManager(const KVCacheManagerConfig& c) : kv(c) {}
  KVCacheManager kv;
  std::atomic<bool> busy{false};
};

// Not movable: constructed in place, owned by its Python object.
struct PyTieredKVCacheManager {
  PyTieredKVCacheManager(const KVCacheManagerConfig& gpu, const HostTierConfig& host)
      : tier(gpu, host) {}
  TieredKVCacheManager tier;
  std::atomic<bool> busy{false};
};

// Events: the library's event with its sequence number, exposed under vLLM's field names.
struct PyBlockStored {
  std::uint64_t seq;
  BlockStored data;
};
struct PyBlockRemoved {
  std::uint64_t seq;
  BlockRemoved data;
};
struct PyAllBlocksCleared {
  std::uint64_t seq;
};

py::list event_ids(const std::vector<BlockHash>& hashes);
py::list digests(const std::vector<BlockHash>& hashes);
py::object to_python(KVEvent&& e);
py::list events_to_python(std::vector<KVEvent>&& events);
// The library event behind a pagedkv.BlockStored / BlockRemoved / AllBlocksCleared.
KVEvent event_from_python(py::handle obj);

// A read-only array viewing `v`, which lives as long as `owner`.
py::array_t<BlockId> view_of(const std::vector<BlockId>& v, py::handle owner);
// A Request or a request id.
RequestId request_id_of(py::handle obj);
std::size_t non_negative(std::int64_t v, const char* what);

std::unique_ptr<PyRequest> build_request(RequestId id, const BlockHasher& hasher,
                                         std::uint32_t block_size, py::handle prompt,
                                         const std::optional<std::string>& cache_salt,
                                         const std::optional<std::string>& lora_name,
                                         const py::object& mm_items);

// Releasing and re-taking the GIL costs on the order of 100 ns; calls release it only when their
// input is at least this many tokens (or blocks), where the work dwarfs that.
inline constexpr std::size_t kReleaseGilAbove = 4096;

// Releases the GIL for its scope when `release` is true.
class MaybeReleaseGil {
 public:
  explicit MaybeReleaseGil(bool release) : state_(release ? PyEval_SaveThread() : nullptr) {}
  ~MaybeReleaseGil() {
    if (state_ != nullptr) PyEval_RestoreThread(state_);
  }
  MaybeReleaseGil(const MaybeReleaseGil&) = delete;
  MaybeReleaseGil& operator=(const MaybeReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace pagedkv::python
