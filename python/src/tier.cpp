// python/src/tier.cpp: TieredKVCacheManager (the host-memory tier), its config, plans and stats.
//
// Lifetimes: TieredCacheHit.blocks / host_slots and every TierPlan array (evictions, loads,
// stores: int32 [n, 2] as (src, dst); *_ids: uint64 [n]) are zero-copy read-only views of the
// result object that holds them, which nothing mutates; a view keeps that object alive.
// TierAllocation.new_blocks views the allocation's own copy of the library's span (which is valid
// only until the next call).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common.hpp"
#include "objects.hpp"
#include "pagedkv/tier/host_tier_config.hpp"
#include "pagedkv/tier/tiered_kv_cache_manager.hpp"

namespace pagedkv::python {

namespace {

static_assert(sizeof(BlockCopy) == 3 * sizeof(std::int32_t) && offsetof(BlockCopy, group) == 8,
              "BlockCopy is viewed as int32 [n, 2] (src, dst) and [n] (group), row stride 12");

struct PyTierAllocation {
  std::vector<BlockId> new_blocks;
  TierPlan transfers;
};

// Read-only views owned by `owner`.
py::array_t<std::int32_t> copies_view(const std::vector<BlockCopy>& v, py::handle owner) {
  py::array_t<std::int32_t> a(
      {static_cast<py::ssize_t>(v.size()), py::ssize_t{2}},
      {static_cast<py::ssize_t>(sizeof(BlockCopy)), static_cast<py::ssize_t>(sizeof(std::int32_t))},
      reinterpret_cast<const std::int32_t*>(v.data()), owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}
// The copies' KV-cache groups (0 for a single-group model), int32 [n].
py::array_t<std::int32_t> groups_view(const std::vector<BlockCopy>& v, py::handle owner) {
  py::array_t<std::int32_t> a({static_cast<py::ssize_t>(v.size())},
                              {static_cast<py::ssize_t>(sizeof(BlockCopy))},
                              v.empty() ? nullptr : &v.data()->group, owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}
py::array_t<std::uint64_t> ids_view(const std::vector<TransferId>& v, py::handle owner) {
  py::array_t<std::uint64_t> a({static_cast<py::ssize_t>(v.size())}, {sizeof(TransferId)}, v.data(),
                               owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

HostPolicy policy_from(py::handle obj) {
  if (py::isinstance<py::str>(obj)) {
    const auto text = obj.cast<std::string>();
    if (auto p = parse_host_policy(text)) return *p;
    throw Error(ErrorCode::kInvalidArgument,
                "host policy: expected 'write_through', 'write_through_selective' or "
                "'write_back', got '" +
                    text + "'");
  }
  try {
    return obj.cast<HostPolicy>();
  } catch (const py::cast_error&) {
    throw Error(ErrorCode::kInvalidArgument,
                "host policy: expected pagedkv.HostPolicy or its name");
  }
}

WindowStoreRule window_store_from(py::handle obj) {
  if (py::isinstance<py::str>(obj)) {
    const auto text = obj.cast<std::string>();
    if (text == "all") return WindowStoreRule::kAll;
    if (text == "request_tail") return WindowStoreRule::kRequestTail;
    throw Error(ErrorCode::kInvalidArgument,
                "window_store: expected 'all' or 'request_tail', got '" + text + "'");
  }
  try {
    return obj.cast<WindowStoreRule>();
  } catch (const py::cast_error&) {
    throw Error(ErrorCode::kInvalidArgument,
                "window_store: expected pagedkv.WindowStoreRule or its name");
  }
}

bool long_call(const Request& r) {
  return r.num_tokens() >= kReleaseGilAbove;
}

}  // namespace

void bind_tier(py::module_& m) {
  py::enum_<HostPolicy>(m, "HostPolicy", "When blocks are copied into the host tier.")
      .value("WRITE_THROUGH", HostPolicy::kWriteThrough)
      .value("WRITE_THROUGH_SELECTIVE", HostPolicy::kWriteThroughSelective)
      .value("WRITE_BACK", HostPolicy::kWriteBack);

  py::class_<TierStats>(m, "TierStats", "Cumulative host-tier statistics.")
      .def_readonly("requests", &TierStats::requests)
      .def_readonly("queried_tokens", &TierStats::queried_tokens)
      .def_readonly("gpu_hit_tokens", &TierStats::gpu_hit_tokens)
      .def_readonly("host_hit_tokens", &TierStats::host_hit_tokens)
      .def_readonly("loaded_blocks", &TierStats::loaded_blocks)
      .def_readonly("load_failures", &TierStats::load_failures)
      .def_readonly("rollbacks", &TierStats::rollbacks)
      .def_readonly("stored_blocks", &TierStats::stored_blocks)
      .def_readonly("store_failures", &TierStats::store_failures)
      .def_readonly("stores_skipped_full", &TierStats::stores_skipped_full)
      .def_readonly("stores_skipped_priority", &TierStats::stores_skipped_priority)
      .def_readonly("stores_skipped_no_memory", &TierStats::stores_skipped_no_memory)
      .def_readonly("events_dropped_no_memory", &TierStats::events_dropped_no_memory)
      .def_readonly("loaded_bytes", &TierStats::loaded_bytes)
      .def_readonly("stored_bytes", &TierStats::stored_bytes)
      .def_readonly("host_evictions", &TierStats::host_evictions)
      .def_readonly("host_slots", &TierStats::host_slots)
      .def_readonly("host_slots_pinned", &TierStats::host_slots_pinned)
      .def_readonly("host_slots_storing", &TierStats::host_slots_storing)
      .def_readonly("host_cached_blocks", &TierStats::host_cached_blocks)
      .def_readonly("window_stores_skipped", &TierStats::window_stores_skipped)
      .def_property_readonly("hit_rate", &TierStats::hit_rate)
      .def_property_readonly("host_usage", &TierStats::host_usage)
      .def("__repr__", [](const TierStats& s) {
        return "TierStats(requests=" + std::to_string(s.requests) +
               ", gpu_hit_tokens=" + std::to_string(s.gpu_hit_tokens) +
               ", host_hit_tokens=" + std::to_string(s.host_hit_tokens) +
               ", stored_blocks=" + std::to_string(s.stored_blocks) +
               ", loaded_blocks=" + std::to_string(s.loaded_blocks) + ")";
      });

  py::enum_<WindowStoreRule>(m, "WindowStoreRule",
                             "Hybrid models: which sliding-window blocks the host tier stores.")
      .value("ALL", WindowStoreRule::kAll)
      .value("REQUEST_TAIL", WindowStoreRule::kRequestTail);

  py::class_<TierGroupStats>(m, "TierGroupStats",
                             "One KV-cache group's share of the tier's copies (group_stats()).")
      .def_readonly("loaded_blocks", &TierGroupStats::loaded_blocks)
      .def_readonly("loaded_bytes", &TierGroupStats::loaded_bytes)
      .def_readonly("stored_blocks", &TierGroupStats::stored_blocks)
      .def_readonly("stored_bytes", &TierGroupStats::stored_bytes)
      .def_readonly("window_stores_skipped", &TierGroupStats::window_stores_skipped)
      .def("__repr__", [](const TierGroupStats& s) {
        return "TierGroupStats(loaded_blocks=" + std::to_string(s.loaded_blocks) +
               ", stored_blocks=" + std::to_string(s.stored_blocks) +
               ", window_stores_skipped=" + std::to_string(s.window_stores_skipped) + ")";
      });

  py::class_<TierPlan>(m, "TierPlan",
                       "The copies of one step as read-only arrays: evictions and loads run "
                       "before the forward pass (in that order), stores after it. Each stage is "
                       "int32 [n, 2] with columns (src, dst): evictions and stores copy GPU block "
                       "-> host slot, loads host slot -> GPU block; *_groups (int32 [n]) name each "
                       "copy's KV-cache group (0 for one group); *_ids are the uint64 ids to "
                       "commit(), row for row. Views keep this plan alive.")
      .def_property_readonly("eviction_groups",
                             [](py::object self) {
                               return groups_view(self.cast<const TierPlan&>().plan.evictions,
                                                  self);
                             })
      .def_property_readonly("load_groups",
                             [](py::object self) {
                               return groups_view(self.cast<const TierPlan&>().plan.loads, self);
                             })
      .def_property_readonly("store_groups",
                             [](py::object self) {
                               return groups_view(self.cast<const TierPlan&>().plan.stores, self);
                             })
      .def_property_readonly("evictions",
                             [](py::object self) {
                               return copies_view(self.cast<const TierPlan&>().plan.evictions,
                                                  self);
                             })
      .def_property_readonly("loads",
                             [](py::object self) {
                               return copies_view(self.cast<const TierPlan&>().plan.loads, self);
                             })
      .def_property_readonly("stores",
                             [](py::object self) {
                               return copies_view(self.cast<const TierPlan&>().plan.stores, self);
                             })
      .def_property_readonly(
          "eviction_ids",
          [](py::object self) { return ids_view(self.cast<const TierPlan&>().eviction_ids, self); })
      .def_property_readonly(
          "load_ids",
          [](py::object self) { return ids_view(self.cast<const TierPlan&>().load_ids, self); })
      .def_property_readonly(
          "store_ids",
          [](py::object self) { return ids_view(self.cast<const TierPlan&>().store_ids, self); })
      .def_property_readonly("num_copies", [](const TierPlan& p) { return p.plan.num_copies(); })
      .def_property_readonly("empty", [](const TierPlan& p) { return p.plan.empty(); })
      .def("__repr__", [](const TierPlan& p) {
        return "TierPlan(evictions=" + std::to_string(p.plan.evictions.size()) +
               ", loads=" + std::to_string(p.plan.loads.size()) +
               ", stores=" + std::to_string(p.plan.stores.size()) + ")";
      });

  py::class_<TieredCacheHit>(m, "TieredCacheHit",
                             "get_computed_blocks() of the tier: the GPU hit, then the host slots "
                             "continuing it. Pass it to allocate_slots().")
      .def(py::init<>(), "No hit.")
      .def_property_readonly(
          "gpu", [](const TieredCacheHit& h) -> const CacheHit& { return h.gpu; },
          py::return_value_policy::reference_internal, "The GPU part (a CacheHit).")
      .def_property_readonly(
          "blocks",
          [](py::object self) {
            return view_of(self.cast<const TieredCacheHit&>().gpu.blocks, self);
          },
          "GPU hit block ids (read-only int32 view).")
      .def_property_readonly(
          "host_slots",
          [](py::object self) {
            return view_of(self.cast<const TieredCacheHit&>().host_slots, self);
          },
          "Host slot of the request's block len(blocks) + i (read-only int32 view).")
      .def_property_readonly("num_groups",
                             [](const TieredCacheHit& h) { return h.host_other_groups.size() + 1; })
      .def(
          "host_group",
          [](py::object self, py::handle group_obj) {
            const auto g =
                static_cast<std::size_t>(to_uint64(group_obj, "TieredCacheHit.host_group: group"));
            const TieredCacheHit& h = self.cast<const TieredCacheHit&>();
            if (g > h.host_other_groups.size()) {
              throw Error(ErrorCode::kOutOfRange,
                          "TieredCacheHit.host_group: group " + std::to_string(g) +
                              " but the hit has " + std::to_string(h.host_other_groups.size() + 1));
            }
            return view_of(g == 0 ? h.host_slots : h.host_other_groups[g - 1], self);
          },
          py::arg("group"),
          "Group g's host slots continuing the GPU hit (read-only int32 view; group 0 is "
          "host_slots). A sliding-window group has slot 0 where the hit needs no block.")
      .def_property_readonly("num_gpu_tokens",
                             [](const TieredCacheHit& h) { return h.gpu.num_tokens; })
      .def_readonly("num_host_tokens", &TieredCacheHit::num_host_tokens)
      .def_property_readonly("num_tokens", &TieredCacheHit::num_tokens)
      .def("__repr__", [](const TieredCacheHit& h) {
        return "TieredCacheHit(num_gpu_tokens=" + std::to_string(h.gpu.num_tokens) +
               ", num_host_tokens=" + std::to_string(h.num_host_tokens) + ")";
      });

  py::class_<PyTierAllocation>(m, "TierAllocation", "allocate_slots() of the tier.")
      .def_property_readonly(
          "new_blocks",
          [](py::object self) {
            return view_of(self.cast<const PyTierAllocation&>().new_blocks, self);
          },
          "The newly allocated GPU blocks, the host-hit part's first (a read-only int32 view of "
          "this allocation's own copy, which keeps it alive).")
      .def_property_readonly(
          "transfers", [](const PyTierAllocation& a) -> const TierPlan& { return a.transfers; },
          py::return_value_policy::reference_internal)
      .def("__repr__", [](const PyTierAllocation& a) {
        return "TierAllocation(new_blocks=" + std::to_string(a.new_blocks.size()) +
               ", copies=" + std::to_string(a.transfers.plan.num_copies()) + ")";
      });

  py::class_<LoadResult>(m, "LoadResult", "finish_loads(): where the request stands.")
      .def_readonly("num_computed_tokens", &LoadResult::num_computed_tokens)
      .def_readonly("rolled_back", &LoadResult::rolled_back)
      .def_property_readonly(
          "transfers", [](const LoadResult& r) -> const TierPlan& { return r.transfers; },
          py::return_value_policy::reference_internal,
          "Stores of the blocks this finish cached (after the forward pass).")
      .def("__repr__", [](const LoadResult& r) {
        return "LoadResult(num_computed_tokens=" + std::to_string(r.num_computed_tokens) +
               ", rolled_back=" + (r.rolled_back ? "True" : "False") + ")";
      });

  py::class_<TieredSnapshot>(m, "TieredSnapshot",
                             "Everything observable about a tier (equal snapshots: equal tiers).")
      .def("__eq__", [](const TieredSnapshot& a, const TieredSnapshot& b) { return a == b; })
      .def_property_readonly("gpu", [](const TieredSnapshot& s) { return s.gpu; })
      .def_property_readonly("live_transfers",
                             [](const TieredSnapshot& s) {
                               return array_copy(std::span<const std::uint64_t>(s.live_transfers));
                             })
      .def_readonly("next_event_seq", &TieredSnapshot::next_event_seq);

  using Tier = PyTieredKVCacheManager;
  py::class_<Tier> tiered(
      m, "TieredKVCacheManager",
      "A KVCacheManager with a host-memory tier (one group, or a hybrid model's groups: full "
      "attention and sliding windows). Per step and request: "
      "get_computed_blocks, allocate_slots (a TierPlan to run), commit every eviction and load, "
      "finish_loads if it had loads, the forward pass, the stores, commit them; free once nothing "
      "is in flight.");
  tiered
      .def(py::init([](py::handle num_blocks, py::handle num_host_blocks, py::handle block_size,
                       py::object policy, py::handle selective_hits, py::handle bytes_per_block,
                       py::object hash_scheme, std::optional<std::string> hash_seed,
                       bool verify_cache_hits, bool enable_kv_events, py::handle stats_window,
                       py::handle max_model_len, std::string eviction_policy,
                       double max_retained_fraction, py::object secondary_offload_min_priority,
                       std::string host_eviction_policy,
                       std::optional<std::vector<AttentionSpec>> groups, py::object window_store,
                       py::handle group_bytes_per_block) {
             KVCacheManagerConfig c =
                 manager_config(num_blocks, block_size, hash_scheme, hash_seed, verify_cache_hits,
                                enable_kv_events, stats_window, max_model_len);
             if (groups) c.groups = *groups;
             c.eviction_policy = parse_eviction_policy(eviction_policy);
             c.max_retained_fraction = max_retained_fraction;
             HostTierConfig h;
             h.num_host_blocks = to_integer<std::int32_t>(num_host_blocks, "num_host_blocks");
             h.policy = policy_from(policy);
             h.selective_hits = to_integer<std::uint32_t>(selective_hits, "selective_hits");
             h.bytes_per_block = to_uint64(bytes_per_block, "bytes_per_block");
             h.secondary_offload_min_priority = static_cast<RetentionPriority>(to_int64(
                 secondary_offload_min_priority, "secondary_offload_min_priority", 0, 255));
             h.eviction_policy = parse_eviction_policy(host_eviction_policy);
             h.window_store = window_store_from(window_store);
             if (!group_bytes_per_block.is_none()) {
               h.group_bytes_per_block =
                   to_uint64_vector(group_bytes_per_block, "group_bytes_per_block");
             }
             return std::make_unique<Tier>(c, h);
           }),
           py::arg("num_blocks"), py::arg("num_host_blocks"), py::kw_only(),
           py::arg("block_size") = 16, py::arg("policy") = "write_through",
           py::arg("selective_hits") = 2, py::arg("bytes_per_block") = 0,
           py::arg("hash_scheme") = "sha256", py::arg("hash_seed") = py::none(),
           py::arg("verify_cache_hits") = true, py::arg("enable_kv_events") = false,
           py::arg("stats_window") = 1000, py::arg("max_model_len") = py::none(),
           py::arg("eviction_policy") = "lru",
           py::arg("max_retained_fraction") = kDefaultMaxRetainedFraction,
           py::arg("secondary_offload_min_priority") = 0, py::arg("host_eviction_policy") = "lru",
           py::arg("groups") = py::none(), py::arg("window_store") = "all",
           py::arg("group_bytes_per_block") = py::none(),
           "num_blocks: GPU pool blocks including the null block; num_host_blocks: slots of the "
           "engine's host buffer (a slot holds one block of one group). With xxh3_128 host hits "
           "compare SHA-256 prefix identities. groups: AttentionSpecs of a hybrid model (default: "
           "one full-attention group of block_size); window_store: 'all' or 'request_tail', which "
           "sliding-window blocks the host stores; group_bytes_per_block: per group, for the byte "
           "counts (default bytes_per_block). "
           "secondary_offload_min_priority: GPU blocks below this retention priority are not "
           "stored in the host tier (TensorRT-LLM's name); host_eviction_policy: the host pool's "
           "eviction policy.")
      .def_property_readonly("num_blocks",
                             [](const Tier& s) { return s.tier.gpu().block_pool().num_blocks(); })
      .def_property_readonly("num_groups", [](const Tier& s) { return s.tier.gpu().num_groups(); })
      .def(
          "group_spec",
          [](const Tier& s, py::handle g) {
            return s.tier.gpu().group_spec(
                static_cast<std::size_t>(to_uint64(g, "group_spec: group")));
          },
          py::arg("group"))
      .def_property_readonly("window_store",
                             [](const Tier& s) { return s.tier.host_config().window_store; })
      .def_property_readonly("num_host_blocks",
                             [](const Tier& s) { return s.tier.host_config().num_host_blocks; })
      .def_property_readonly("policy", [](const Tier& s) { return s.tier.host_config().policy; })
      .def_property_readonly("num_in_flight",
                             [](Tier& s) {
                               BusyGuard g(s.busy, "TieredKVCacheManager");
                               return s.tier.num_in_flight();
                             })
      .def(
          "get_computed_blocks",
          [](Tier& s, PyRequest& r) {
            BusyGuard gm(s.busy, "TieredKVCacheManager");
            BusyGuard gr(r.busy, "Request");
            auto hit = std::make_unique<TieredCacheHit>();
            MaybeReleaseGil nogil(long_call(r.req));
            *hit = s.tier.get_computed_blocks(r.req);
            return hit;
          },
          py::arg("request"),
          "The GPU prefix, then the longest run in the host tier (capped at num_tokens - 1); "
          "records stats, changes nothing else.")
      .def(
          "allocate_slots",
          [](Tier& s, PyRequest& r, py::object num_new_tokens, py::object hit,
             py::object num_lookahead_tokens) -> py::object {
            BusyGuard gm(s.busy, "TieredKVCacheManager");
            BusyGuard gr(r.busy, "Request");
            const std::size_t n = non_negative(num_new_tokens, "allocate_slots: num_new_tokens");
            const std::size_t look =
                non_negative(num_lookahead_tokens, "allocate_slots: num_lookahead_tokens");
            static const TieredCacheHit kNoHit;
            if (!hit.is_none() && !py::isinstance<TieredCacheHit>(hit)) {
              throw Error(ErrorCode::kInvalidArgument,
                          "allocate_slots: hit must be a TieredCacheHit or None");
            }
            const TieredCacheHit& h = hit.is_none() ? kNoHit : hit.cast<const TieredCacheHit&>();
            std::optional<TierAllocation> a;
            {
              MaybeReleaseGil nogil(n + look + h.num_tokens() >= kReleaseGilAbove);
              a = s.tier.allocate_slots(r.req, n, h, look);
            }
            if (!a) return py::none();
            auto out = std::make_unique<PyTierAllocation>();
            out->new_blocks.assign(a->new_blocks.begin(), a->new_blocks.end());
            out->transfers = std::move(a->transfers);
            return py::cast(std::move(out));
          },
          py::arg("request"), py::arg("num_new_tokens"), py::arg("hit") = py::none(),
          py::arg("num_lookahead_tokens") = 0,
          "GPU blocks for the hit's host part and the new tokens, and the TierPlan to run; None "
          "when they do not fit (nothing changed).")
      .def(
          "commit",
          [](Tier& s, py::object transfer_id, bool ok) {
            const TransferId id = to_uint64(transfer_id, "commit: transfer_id");
            BusyGuard gm(s.busy, "TieredKVCacheManager");
            s.tier.commit(id, ok);
          },
          py::arg("transfer_id"), py::arg("ok") = true,
          "Commits one copy as done (ok) or failed. Unknown or committed id: pagedkv.Error "
          "(NOT_FOUND).")
      .def(
          "commit_many",
          [](Tier& s, py::object transfer_ids, bool ok) {
            // A plan's own id arrays (uint64, C-contiguous) are read in place; anything else
            // is converted with the checks (no float, bool or negative id).
            std::vector<TransferId> converted;
            std::span<const TransferId> ids;
            if (py::isinstance<py::array_t<std::uint64_t>>(transfer_ids)) {
              const auto a = py::reinterpret_borrow<py::array_t<std::uint64_t>>(transfer_ids);
              if (a.ndim() == 1 && (a.flags() & py::array::c_style)) {
                ids = std::span<const TransferId>(a.data(), static_cast<std::size_t>(a.size()));
              }
            }
            if (ids.data() == nullptr) {
              converted = to_uint64_vector(transfer_ids, "commit_many: transfer_ids");
              ids = converted;
            }
            BusyGuard gm(s.busy, "TieredKVCacheManager");
            s.tier.commit(ids, ok);
          },
          py::arg("transfer_ids"), py::arg("ok") = true,
          "Commits a batch of copies (e.g. plan.load_ids) as done or failed in one call: every id "
          "is checked first; an unknown, committed or repeated id raises pagedkv.Error "
          "(NOT_FOUND) with nothing committed.")
      .def(
          "finish_loads",
          [](Tier& s, PyRequest& r) {
            BusyGuard gm(s.busy, "TieredKVCacheManager");
            BusyGuard gr(r.busy, "Request");
            return s.tier.finish_loads(r.req);
          },
          py::arg("request"),
          "Once every load of the request is committed: caches what is in place and returns a "
          "LoadResult (rolled back to the first failed load).")
      .def(
          "has_unfinished_loads",
          [](Tier& s, py::object request) {
            BusyGuard gm(s.busy, "TieredKVCacheManager");
            return s.tier.has_unfinished_loads(
                request_id_of(request, s.tier.gpu(), "has_unfinished_loads"));
          },
          py::arg("request"))
      .def(
          "block_ids",
          [](Tier& s, py::object request, py::handle group_obj) {
            const auto group = static_cast<std::size_t>(to_uint64(group_obj, "block_ids: group"));
            BusyGuard gm(s.busy, "TieredKVCacheManager");
            return array_copy(
                s.tier.gpu().block_ids(request_id_of(request, s.tier.gpu(), "block_ids"), group));
          },
          py::arg("request"), py::arg("group") = 0,
          "The request's GPU block table row of a group (a new int32 array).")
      .def(
          "group_stats",
          [](Tier& s) {
            BusyGuard gm(s.busy, "TieredKVCacheManager");
            return s.tier.group_stats();
          },
          "Per KV-cache group: blocks and bytes loaded and stored (a list, one per group).")
      .def("gpu_stats", [](Tier& s) {
        BusyGuard gm(s.busy, "TieredKVCacheManager");
        return s.tier.gpu().stats();
      });
  def_manager_calls(tiered, {"As KVCacheManager.make_request.",
                             "As KVCacheManager.free; refused while transfers are in flight.",
                             "As KVCacheManager.preempt; refused while transfers are in flight.",
                             "KV events of both tiers in one gap-free sequence (medium 'GPU' or "
                             "'CPU')."});
}

}  // namespace pagedkv::python
