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

// The retention clock a wrapper gives its manager (KVCacheManagerConfig::retention_clock): a tick
// Python sets (set_time()). The pool reads it inside calls, possibly with the GIL released, so
// it is an atomic; it never calls into Python.
struct RetentionTime {
  std::atomic<RetentionTick> now{0};
  KVCacheManagerConfig attach(KVCacheManagerConfig c) {
    c.retention_clock = [this] { return now.load(std::memory_order_relaxed); };
    return c;
  }
};

// The two manager wrappers share def_manager_calls() below: each names its class (kName), the
// object the calls go to (calls()) and its GPU KVCacheManager (gpu()).
struct PyKVCacheManager {
  static constexpr const char* kName = "KVCacheManager";
  explicit PyKVCacheManager(const KVCacheManagerConfig& c) : kv(clock.attach(c)) {}
  RetentionTime clock;  // before kv: its retention_clock reads it
  KVCacheManager& calls() noexcept { return kv; }
  const KVCacheManager& gpu() const noexcept { return kv; }
  KVCacheManager kv;
  std::atomic<bool> busy{false};
};

// Not movable: constructed in place, owned by its Python object.
struct PyTieredKVCacheManager {
  static constexpr const char* kName = "TieredKVCacheManager";
  PyTieredKVCacheManager(const KVCacheManagerConfig& gpu, const HostTierConfig& host)
      : tier(clock.attach(gpu), host) {}
  RetentionTime clock;  // before tier: its GPU pool's retention_clock reads it
  TieredKVCacheManager& calls() noexcept { return tier; }
  const KVCacheManager& gpu() const noexcept { return tier.gpu(); }
  TieredKVCacheManager tier;
  std::atomic<bool> busy{false};
};

// The manager settings both constructors take (the Python keywords of the same names).
// Integers are checked (common.hpp to_integer); None is no max_model_len.
KVCacheManagerConfig manager_config(py::handle num_blocks, py::handle block_size,
                                    py::handle hash_scheme,
                                    const std::optional<std::string>& hash_seed,
                                    bool verify_cache_hits, bool enable_kv_events,
                                    py::handle stats_window, py::handle max_model_len);

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
// A Request of `kv`'s (KVCacheManager::check_owner: another manager's is refused) or a request
// id (to_uint64); `what` names the call.
RequestId request_id_of(py::handle obj, const KVCacheManager& kv, const char* what);
// A count or position argument: a Python int >= 0 (to_int64).
std::size_t non_negative(py::handle v, const char* what);

std::unique_ptr<PyRequest> build_request(RequestId id, const BlockHasher& hasher,
                                         std::uint32_t block_size, py::handle prompt,
                                         const std::optional<std::string>& cache_salt,
                                         const std::optional<std::string>& lora_name,
                                         const py::object& mm_items,
                                         const std::optional<RetentionConfig>& retention = {});

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

// Docstrings of the calls def_manager_calls() binds.
struct ManagerCallDocs {
  const char* make_request;
  const char* free;
  const char* preempt;
  const char* take_events;
};

// A binding of `call(manager, request)` that holds both busy flags and releases the GIL for long
// requests.
template <class W, class Call>
auto request_call(Call call) {
  return [call](W& s, PyRequest& r) {
    BusyGuard gm(s.busy, W::kName);
    BusyGuard gr(r.busy, "Request");
    MaybeReleaseGil nogil(r.req.num_tokens() >= kReleaseGilAbove);
    call(s.calls(), r.req);
  };
}

// Binds the calls KVCacheManager and TieredKVCacheManager share, with the same names, arguments,
// checks and GIL rules: block_size, hasher, num_free_blocks, num_requests, make_request, free,
// preempt, reset_prefix_cache, stats, take_events, check_invariants, snapshot. Every call that
// reads or changes the manager holds its busy flag (one scheduler thread per manager).
template <class W>
void def_manager_calls(py::class_<W>& c, const ManagerCallDocs& docs) {
  c.def_property_readonly("block_size", [](const W& s) { return s.gpu().block_size(); })
      .def_property_readonly("hasher", [](const W& s) { return s.gpu().hasher(); })
      .def_property_readonly("num_free_blocks",
                             [](W& s) {
                               BusyGuard g(s.busy, W::kName);
                               return s.gpu().block_pool().num_free_blocks();
                             })
      .def_property_readonly("num_requests",
                             [](W& s) {
                               BusyGuard g(s.busy, W::kName);
                               return s.gpu().num_requests();
                             })
      .def(
          "make_request",
          [](const W& s, py::object request_id, py::object prompt,
             std::optional<std::string> cache_salt, std::optional<std::string> lora_name,
             py::object mm_items, std::optional<RetentionConfig> retention) {
            const RequestId id = to_uint64(request_id, "make_request: request_id");
            return build_request(id, s.gpu().hasher(), s.gpu().block_size(), prompt, cache_salt,
                                 lora_name, mm_items, retention);
          },
          py::arg("request_id"), py::arg("prompt_token_ids"), py::kw_only(),
          py::arg("cache_salt") = py::none(), py::arg("lora_name") = py::none(),
          py::arg("mm_items") = py::none(), py::arg("kv_cache_retention_config") = py::none(),
          docs.make_request)
      .def(
          "set_time",
          [](W& s, py::object tick) {
            const RetentionTick t = to_int64(tick, "set_time: tick");
            BusyGuard gm(s.busy, W::kName);
            const RetentionTick now = s.clock.now.load(std::memory_order_relaxed);
            if (t < now) {
              throw Error(ErrorCode::kInvalidArgument,
                          "set_time: tick " + std::to_string(t) + " is before the current " +
                              std::to_string(now) + " (the retention clock is monotonic)");
            }
            s.clock.now.store(t, std::memory_order_relaxed);
          },
          py::arg("tick"),
          "Sets the retention clock (any unit: steps, ms, ...; starts at 0, never goes back): "
          "retention durations are ticks of it.")
      .def_property_readonly("time",
                             [](const W& s) { return s.clock.now.load(std::memory_order_relaxed); })
      .def("retention_stats",
           [](W& s) {
             BusyGuard gm(s.busy, W::kName);
             return s.gpu().retention_stats();
           })
      .def(
          "block_retention",
          [](W& s, std::int32_t block_id) {
            BusyGuard gm(s.busy, W::kName);
            return s.gpu().block_retention(block_id);
          },
          py::arg("block_id"), "A block's retention now (an expired priority reads as 35).")
      .def("free", request_call<W>([](auto& m, Request& r) { m.free(r); }), py::arg("request"),
           docs.free)
      .def("preempt", request_call<W>([](auto& m, Request& r) { m.preempt(r); }),
           py::arg("request"), docs.preempt)
      .def("reset_prefix_cache",
           [](W& s) {
             BusyGuard gm(s.busy, W::kName);
             return s.calls().reset_prefix_cache();
           })
      .def("stats",
           [](W& s) {
             BusyGuard gm(s.busy, W::kName);
             return s.calls().stats();
           })
      .def(
          "take_events",
          [](W& s) {
            BusyGuard gm(s.busy, W::kName);
            return events_to_python(s.calls().take_events());
          },
          docs.take_events)
      .def("check_invariants",
           [](W& s) {
             BusyGuard gm(s.busy, W::kName);
             py::gil_scoped_release nogil;
             s.calls().check_invariants();
           })
      .def("snapshot", [](W& s) {
        BusyGuard gm(s.busy, W::kName);
        return s.calls().snapshot();
      });
}

}  // namespace pagedkv::python
