// python/src/manager.cpp: Request, CacheHit, KVCacheManager, stats, KV events and snapshots.
//
// Lifetimes (see also pagedkv/__init__.py):
//  - CacheHit.blocks / CacheHit.group(g): zero-copy read-only views of the hit's own vectors,
//    which nothing mutates; each view keeps its CacheHit alive.
//  - KVCacheManager.block_ids(), allocate_slots(), block_table(), slot_mapping(): new arrays
//    (copies). A request's block table row grows and is freed by later calls, so a view of it
//    could dangle; a copy of a row costs about as much as creating the array object.
#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "hashing.hpp"
#include "objects.hpp"
#include "pagedkv/device/block_table.hpp"
#include "pagedkv/manager/kv_cache_manager.hpp"

namespace pagedkv::python {

py::list event_ids(const std::vector<BlockHash>& hashes) {
  py::list out(hashes.size());
  for (std::size_t i = 0; i < hashes.size(); ++i) out[i] = py::int_(hashes[i].event_id());
  return out;
}
py::list digests(const std::vector<BlockHash>& hashes) {
  py::list out(hashes.size());
  for (std::size_t i = 0; i < hashes.size(); ++i) out[i] = hash_to_bytes(hashes[i]);
  return out;
}

py::object to_python(KVEvent&& e) {
  if (auto* s = std::get_if<BlockStored>(&e.data)) {
    return py::cast(PyBlockStored{e.seq, std::move(*s)});
  }
  if (auto* r = std::get_if<BlockRemoved>(&e.data)) {
    return py::cast(PyBlockRemoved{e.seq, std::move(*r)});
  }
  return py::cast(PyAllBlocksCleared{e.seq});
}

py::list events_to_python(std::vector<KVEvent>&& events) {
  py::list out(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) out[i] = to_python(std::move(events[i]));
  return out;
}

KVEvent event_from_python(py::handle obj) {
  if (py::isinstance<PyBlockStored>(obj)) {
    const auto& e = obj.cast<const PyBlockStored&>();
    return KVEvent{e.seq, e.data};
  }
  if (py::isinstance<PyBlockRemoved>(obj)) {
    const auto& e = obj.cast<const PyBlockRemoved&>();
    return KVEvent{e.seq, e.data};
  }
  if (py::isinstance<PyAllBlocksCleared>(obj)) {
    return KVEvent{obj.cast<const PyAllBlocksCleared&>().seq, AllBlocksCleared{}};
  }
  throw Error(ErrorCode::kInvalidArgument,
              "expected pagedkv.BlockStored, BlockRemoved or AllBlocksCleared, got " +
                  std::string(py::str(py::type::of(obj).attr("__name__"))));
}

py::array_t<BlockId> view_of(const std::vector<BlockId>& v, py::handle owner) {
  py::array_t<BlockId> a({static_cast<py::ssize_t>(v.size())}, {sizeof(BlockId)}, v.data(), owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

RequestId request_id_of(py::handle obj, const KVCacheManager& kv, const char* what) {
  if (py::isinstance<PyRequest>(obj)) {
    const Request& r = obj.cast<const PyRequest&>().req;
    kv.check_owner(r, what);
    return r.id();
  }
  return to_uint64(obj, what);
}

std::size_t non_negative(py::handle v, const char* what) {
  return static_cast<std::size_t>(to_int64(v, what, 0));
}

std::unique_ptr<PyRequest> build_request(RequestId id, const BlockHasher& hasher,
                                         std::uint32_t block_size, py::handle prompt,
                                         const std::optional<std::string>& cache_salt,
                                         const std::optional<std::string>& lora_name,
                                         const py::object& mm_items,
                                         const std::optional<RetentionConfig>& retention) {
  const TokenView tokens(prompt, "prompt_token_ids");
  RequestHashKeys keys = hash_keys_from(cache_salt, lora_name, mm_items);
  std::optional<Request> r;
  {
    MaybeReleaseGil nogil(tokens.span().size() >= kReleaseGilAbove);  // hashing: O(prompt)
    r.emplace(id, hasher, block_size, tokens.span(), std::move(keys));
  }
  r->set_retention(retention);  // validated against the prompt
  return std::make_unique<PyRequest>(std::move(*r));
}

KVCacheManagerConfig manager_config(py::handle num_blocks, py::handle block_size,
                                    py::handle hash_scheme,
                                    const std::optional<std::string>& hash_seed,
                                    bool verify_cache_hits, bool enable_kv_events,
                                    py::handle stats_window, py::handle max_model_len) {
  KVCacheManagerConfig c;
  c.num_blocks = to_integer<std::int32_t>(num_blocks, "num_blocks");
  c.block_size = to_integer<std::uint32_t>(block_size, "block_size");
  c.hash_scheme = scheme_from(hash_scheme);
  c.hash_seed = hash_seed;
  c.verify_cache_hits = verify_cache_hits;
  c.enable_kv_events = enable_kv_events;
  c.stats_window = to_integer<std::size_t>(stats_window, "stats_window");
  c.max_model_len = to_optional_integer<std::size_t>(max_model_len, "max_model_len");
  return c;
}

namespace {

// AttentionSpec's constructors with checked integers (common.hpp to_integer).
AttentionSpec full_spec(py::handle block_size) {
  return AttentionSpec::full(to_integer<std::uint32_t>(block_size, "AttentionSpec: block_size"));
}
AttentionSpec sliding_spec(py::handle block_size, py::handle sliding_window) {
  return AttentionSpec::sliding(
      to_integer<std::uint32_t>(block_size, "AttentionSpec: block_size"),
      to_integer<std::uint32_t>(sliding_window, "AttentionSpec: sliding_window"));
}

// One block id (the pool checks its range).
BlockId block_id_of(py::handle obj, const char* what) {
  return static_cast<BlockId>(to_int64(obj, what, std::numeric_limits<BlockId>::min(),
                                       std::numeric_limits<BlockId>::max()));
}

// The rows of `ids` in group g, for block tables and slot mappings (manager guard held).
std::vector<std::span<const BlockId>> rows_of(const KVCacheManager& kv, py::handle requests,
                                              std::size_t group) {
  std::vector<std::span<const BlockId>> rows;
  if (py::isinstance<py::array>(requests)) {
    for (const std::uint64_t id : to_uint64_vector(requests, "requests")) {
      rows.push_back(kv.block_ids(id, group));
    }
  } else {
    for (py::handle r : requests)
      rows.push_back(kv.block_ids(request_id_of(r, kv, "requests"), group));
  }
  return rows;
}

}  // namespace

void bind_manager(py::module_& m) {
  // ---- attention specs ----
  py::enum_<AttentionKind>(m, "AttentionKind")
      .value("FULL", AttentionKind::kFull)
      .value("SLIDING_WINDOW", AttentionKind::kSlidingWindow);
  py::class_<AttentionSpec>(m, "AttentionSpec", "The attention kind of one KV-cache group.")
      .def_static("full", &full_spec, py::arg("block_size"))
      .def_static("sliding", &sliding_spec, py::arg("block_size"), py::arg("sliding_window"))
      .def_readonly("kind", &AttentionSpec::kind)
      .def_readonly("block_size", &AttentionSpec::block_size)
      .def_readonly("sliding_window", &AttentionSpec::sliding_window)
      .def_property_readonly("window_blocks", &AttentionSpec::window_blocks)
      .def("__eq__",
           [](const AttentionSpec& a, const AttentionSpec& b) {
             return a.kind == b.kind && a.block_size == b.block_size &&
                    a.sliding_window == b.sliding_window;
           })
      .def("__repr__",
           [](const AttentionSpec& s) { return "AttentionSpec(" + s.describe() + ")"; });
  // vLLM's spec names (only the fields the cache manager uses).
  m.def("FullAttentionSpec", &full_spec, py::arg("block_size"));
  m.def("SlidingWindowSpec", &sliding_spec, py::arg("block_size"), py::arg("sliding_window"));

  // ---- requests ----
  py::class_<PyRequest>(m, "Request",
                        "A request's tokens and block hashes, hashed incrementally. Create it "
                        "with KVCacheManager.make_request() so it is hashed like the cache.")
      .def(py::init([](py::handle id, py::object prompt, const BlockHasher& hasher,
                       py::handle block_size, std::optional<std::string> cache_salt,
                       std::optional<std::string> lora_name, py::object mm_items) {
             return build_request(to_uint64(id, "Request: request_id"), hasher,
                                  to_integer<std::uint32_t>(block_size, "Request: block_size"),
                                  prompt, cache_salt, lora_name, mm_items);
           }),
           py::arg("request_id"), py::arg("prompt_token_ids"), py::arg("hasher"),
           py::arg("block_size") = 16, py::kw_only(), py::arg("cache_salt") = py::none(),
           py::arg("lora_name") = py::none(), py::arg("mm_items") = py::none())
      .def_property_readonly("request_id", [](const PyRequest& r) { return r.req.id(); })
      .def_property_readonly("num_tokens",
                             [](PyRequest& r) {
                               BusyGuard g(r.busy, "Request");
                               return r.req.num_tokens();
                             })
      .def_property_readonly("num_prompt_tokens",
                             [](const PyRequest& r) { return r.req.num_prompt_tokens(); })
      .def_property(
          "num_computed_tokens",
          [](PyRequest& r) {
            BusyGuard g(r.busy, "Request");
            return r.req.num_computed_tokens();
          },
          [](PyRequest& r, py::object n) {
            const std::size_t v = non_negative(n, "num_computed_tokens");
            BusyGuard g(r.busy, "Request");
            r.req.set_num_computed_tokens(v);
          })
      .def_property(
          "kv_cache_retention_config",
          [](PyRequest& r) {
            BusyGuard g(r.busy, "Request");
            return r.req.retention();
          },
          [](PyRequest& r, std::optional<RetentionConfig> c) {
            BusyGuard g(r.busy, "Request");
            r.req.set_retention(std::move(c));
          },
          "The request's KvCacheRetentionConfig or None (every block at the default priority). "
          "Setting it checks it against the prompt; it applies to the blocks the request "
          "allocates, hits or releases afterwards.")
      .def_property(
          "skip_reading_prefix_cache",
          [](PyRequest& r) {
            BusyGuard g(r.busy, "Request");
            return r.req.skip_reading_prefix_cache;
          },
          [](PyRequest& r, bool v) {
            BusyGuard g(r.busy, "Request");
            r.req.skip_reading_prefix_cache = v;
          })
      .def_property_readonly("is_finished",
                             [](PyRequest& r) {
                               BusyGuard g(r.busy, "Request");
                               return r.req.is_finished();
                             })
      .def_property_readonly("block_size",
                             [](const PyRequest& r) { return r.req.hashed_tokens().block_size(); })
      .def_property_readonly(
          "cache_salt", [](const PyRequest& r) { return r.req.hashed_tokens().keys().cache_salt; })
      .def_property_readonly(
          "lora_name", [](const PyRequest& r) { return r.req.hashed_tokens().keys().lora_name; })
      .def_property_readonly(
          "all_token_ids",
          [](PyRequest& r) {
            BusyGuard g(r.busy, "Request");
            return array_copy(r.req.tokens());
          },
          "A copy (int32): appending tokens may move the request's storage.")
      .def_property_readonly(
          "block_hashes",
          [](PyRequest& r) {
            BusyGuard g(r.busy, "Request");
            py::list out(r.req.block_hashes().size());
            for (std::size_t i = 0; i < r.req.block_hashes().size(); ++i)
              out[i] = hash_to_bytes(r.req.block_hashes()[i]);
            return out;
          },
          "The digests of the full blocks (bytes), block i covering tokens [i*B, (i+1)*B).")
      .def(
          "append_token",
          [](PyRequest& r, py::object token) {
            // Negative ids are the Request's to refuse, as in append_tokens.
            const auto t = static_cast<TokenId>(to_int64(token, "append_token: token",
                                                         std::numeric_limits<TokenId>::min(),
                                                         std::numeric_limits<TokenId>::max()));
            BusyGuard g(r.busy, "Request");
            r.req.append_token(t);
          },
          py::arg("token"), "Appends a decoded token; hashes the block it completes.")
      .def(
          "append_tokens",
          [](PyRequest& r, py::object tokens) {
            BusyGuard g(r.busy, "Request");
            const TokenView t(tokens, "append_tokens");
            MaybeReleaseGil nogil(t.span().size() >= kReleaseGilAbove);
            r.req.append_tokens(t.span());
          },
          py::arg("tokens"),
          "Appends tokens; hashes every block they complete. Releases the GIL for 4096+ tokens.")
      .def("__repr__", [](PyRequest& r) {
        BusyGuard g(r.busy, "Request");
        return "Request(request_id=" + std::to_string(r.req.id()) +
               ", num_tokens=" + std::to_string(r.req.num_tokens()) +
               ", num_computed_tokens=" + std::to_string(r.req.num_computed_tokens()) + ")";
      });

  // ---- cache hits ----
  py::class_<CacheHit>(m, "CacheHit",
                       "get_computed_blocks() result: unpacks as (blocks, num_hit_tokens) like "
                       "vLLM's; pass the object itself to allocate_slots().")
      .def(py::init<>(), "No hit.")
      .def_property_readonly(
          "blocks",
          [](py::object self) { return view_of(self.cast<const CacheHit&>().blocks, self); },
          "Group 0's hit block ids: a read-only int32 view that keeps this CacheHit alive.")
      .def_readonly("num_tokens", &CacheHit::num_tokens)
      .def_readonly("num_hit_tokens", &CacheHit::num_tokens)
      .def_property_readonly("num_groups",
                             [](const CacheHit& h) { return h.other_groups.size() + 1; })
      .def(
          "group",
          [](py::object self, py::handle group_obj) {
            const auto g = static_cast<std::size_t>(to_uint64(group_obj, "CacheHit.group: group"));
            const CacheHit& h = self.cast<const CacheHit&>();
            if (g > h.other_groups.size()) {
              throw Error(ErrorCode::kOutOfRange, "CacheHit.group: group " + std::to_string(g) +
                                                      " but the hit has " +
                                                      std::to_string(h.other_groups.size() + 1));
            }
            return view_of(h.group(g), self);
          },
          py::arg("group"), "Group g's hit blocks (null block 0 before a sliding window).")
      .def("__len__", [](const CacheHit&) { return 2; })
      .def("__iter__",
           [](py::object self) {
             const CacheHit& h = self.cast<const CacheHit&>();
             return py::iter(py::make_tuple(view_of(h.blocks, self), h.num_tokens));
           })
      .def("__getitem__",
           [](py::object self, int i) -> py::object {
             const CacheHit& h = self.cast<const CacheHit&>();
             if (i == 0 || i == -2) return view_of(h.blocks, self);
             if (i == 1 || i == -1) return py::int_(h.num_tokens);
             throw py::index_error("CacheHit unpacks as (blocks, num_hit_tokens)");
           })
      .def("__repr__", [](const CacheHit& h) {
        return "CacheHit(num_blocks=" + std::to_string(h.blocks.size()) +
               ", num_hit_tokens=" + std::to_string(h.num_tokens) + ")";
      });

  // ---- stats ----
  py::class_<PrefixCacheStats>(m, "PrefixCacheStats")
      .def_readonly("requests", &PrefixCacheStats::requests)
      .def_readonly("queries", &PrefixCacheStats::queries)
      .def_readonly("hits", &PrefixCacheStats::hits)
      .def_readonly("evictions", &PrefixCacheStats::evictions)
      .def_readonly("recent_requests", &PrefixCacheStats::recent_requests)
      .def_readonly("recent_hit_rate", &PrefixCacheStats::recent_hit_rate)
      .def_property_readonly("hit_rate", &PrefixCacheStats::hit_rate)
      .def("__repr__", [](const PrefixCacheStats& s) {
        return "PrefixCacheStats(requests=" + std::to_string(s.requests) +
               ", queries=" + std::to_string(s.queries) + ", hits=" + std::to_string(s.hits) +
               ", evictions=" + std::to_string(s.evictions) + ")";
      });

  // ---- events (vLLM's field names; block_hashes in vLLM's 64-bit int form) ----
  py::class_<PyBlockStored>(m, "BlockStored")
      .def_readonly("seq", &PyBlockStored::seq)
      .def_property_readonly("block_hashes",
                             [](const PyBlockStored& e) { return event_ids(e.data.block_hashes); })
      .def_property_readonly("parent_block_hash",
                             [](const PyBlockStored& e) -> py::object {
                               if (!e.data.parent_block_hash) return py::none();
                               return py::int_(e.data.parent_block_hash->event_id());
                             })
      .def_property_readonly("token_ids",
                             [](const PyBlockStored& e) { return py::cast(e.data.token_ids); })
      .def_property_readonly("block_size", [](const PyBlockStored& e) { return e.data.block_size; })
      .def_property_readonly("lora_id", [](const PyBlockStored&) { return py::none(); })
      .def_property_readonly("medium", [](const PyBlockStored& e) { return e.data.medium; })
      .def_property_readonly("lora_name", [](const PyBlockStored& e) { return e.data.lora_name; })
      .def_property_readonly("extra_keys",
                             [](const PyBlockStored& e) {
                               py::list out;
                               for (const auto& k : e.data.extra_keys)
                                 out.append(extra_keys_tuple(k));
                               return out;
                             })
      .def_property_readonly("group_idx", [](const PyBlockStored& e) { return e.data.group_id; })
      .def_property_readonly("block_digests",
                             [](const PyBlockStored& e) { return digests(e.data.block_hashes); })
      .def_property_readonly("parent_block_digest",
                             [](const PyBlockStored& e) -> py::object {
                               if (!e.data.parent_block_hash) return py::none();
                               return hash_to_bytes(*e.data.parent_block_hash);
                             })
      .def("__eq__", [](const PyBlockStored& a,
                        const PyBlockStored& b) { return a.seq == b.seq && a.data == b.data; })
      .def("__repr__", [](const PyBlockStored& e) {
        return "BlockStored(seq=" + std::to_string(e.seq) +
               ", blocks=" + std::to_string(e.data.block_hashes.size()) +
               ", group_idx=" + std::to_string(e.data.group_id) + ")";
      });
  py::class_<PyBlockRemoved>(m, "BlockRemoved")
      .def_readonly("seq", &PyBlockRemoved::seq)
      .def_property_readonly("block_hashes",
                             [](const PyBlockRemoved& e) { return event_ids(e.data.block_hashes); })
      .def_property_readonly("block_digests",
                             [](const PyBlockRemoved& e) { return digests(e.data.block_hashes); })
      .def_property_readonly("medium", [](const PyBlockRemoved& e) { return e.data.medium; })
      .def_property_readonly("group_idx", [](const PyBlockRemoved& e) { return e.data.group_id; })
      .def("__eq__", [](const PyBlockRemoved& a,
                        const PyBlockRemoved& b) { return a.seq == b.seq && a.data == b.data; })
      .def("__repr__", [](const PyBlockRemoved& e) {
        return "BlockRemoved(seq=" + std::to_string(e.seq) +
               ", blocks=" + std::to_string(e.data.block_hashes.size()) + ")";
      });
  py::class_<PyAllBlocksCleared>(m, "AllBlocksCleared")
      .def_readonly("seq", &PyAllBlocksCleared::seq)
      .def("__eq__",
           [](const PyAllBlocksCleared& a, const PyAllBlocksCleared& b) { return a.seq == b.seq; })
      .def("__repr__", [](const PyAllBlocksCleared& e) {
        return "AllBlocksCleared(seq=" + std::to_string(e.seq) + ")";
      });

  // ---- snapshots (tests: equal snapshots mean equal managers) ----
  py::class_<KVCacheManagerSnapshot>(m, "KVCacheManagerSnapshot")
      .def("__eq__",
           [](const KVCacheManagerSnapshot& a, const KVCacheManagerSnapshot& b) { return a == b; })
      .def_property_readonly(
          "free_queue",
          [](const KVCacheManagerSnapshot& s) {
            return array_copy(std::span<const BlockId>(s.pool.free_queue));
          },
          "Free block ids, head (allocated and evicted next) first.")
      .def_property_readonly("ref_cnts",
                             [](const KVCacheManagerSnapshot& s) {
                               return array_copy(std::span<const std::int32_t>(s.pool.ref_cnts));
                             })
      .def_property_readonly(
          "block_hashes",
          [](const KVCacheManagerSnapshot& s) {
            py::list out;
            for (const BlockHash& h : s.pool.block_hashes)
              out.append(h.empty() ? py::object(py::none()) : py::object(hash_to_bytes(h)));
            return out;
          })
      .def_property_readonly("request_blocks",
                             [](const KVCacheManagerSnapshot& s) {
                               py::dict out;
                               for (const auto& [id, groups] : s.request_blocks) {
                                 py::list rows;
                                 for (const auto& row : groups)
                                   rows.append(array_copy(std::span<const BlockId>(row)));
                                 out[py::int_(id)] = rows;
                               }
                               return out;
                             })
      .def_property_readonly("num_evictions",
                             [](const KVCacheManagerSnapshot& s) { return s.pool.num_evictions; })
      .def_property_readonly("next_event_seq",
                             [](const KVCacheManagerSnapshot& s) { return s.pool.next_event_seq; });

  // ---- the manager ----
  py::class_<PyKVCacheManager> manager(
      m, "KVCacheManager",
      "The scheduler's view of the KV cache (vLLM v1 names). One scheduler thread per manager.");
  manager
      .def(py::init([](py::handle num_blocks, py::handle block_size,
                       std::optional<std::vector<AttentionSpec>> groups, bool enable_caching,
                       py::object hash_scheme, std::optional<std::string> hash_seed,
                       bool verify_cache_hits, bool enable_kv_events, py::handle stats_window,
                       py::handle max_model_len, std::string eviction_policy,
                       double max_retained_fraction, py::handle lineage_key_depth,
                       bool lineage_adaptive_depth, py::handle adaptive_ghost_sample_shift) {
             KVCacheManagerConfig c =
                 manager_config(num_blocks, block_size, hash_scheme, hash_seed, verify_cache_hits,
                                enable_kv_events, stats_window, max_model_len);
             if (groups) c.groups = *groups;
             c.enable_caching = enable_caching;
             c.eviction_policy = parse_eviction_policy(eviction_policy);
             c.max_retained_fraction = max_retained_fraction;
             c.lineage_key_depth = to_integer<std::size_t>(lineage_key_depth, "lineage_key_depth");
             c.lineage_adaptive_depth = lineage_adaptive_depth;
             c.adaptive_ghost_sample_shift =
                 to_integer<int>(adaptive_ghost_sample_shift, "adaptive_ghost_sample_shift");
             return std::make_unique<PyKVCacheManager>(c);
           }),
           py::arg("num_blocks"), py::kw_only(), py::arg("block_size") = 16,
           py::arg("groups") = py::none(), py::arg("enable_caching") = true,
           py::arg("hash_scheme") = "sha256", py::arg("hash_seed") = py::none(),
           py::arg("verify_cache_hits") = true, py::arg("enable_kv_events") = false,
           py::arg("stats_window") = 1000, py::arg("max_model_len") = py::none(),
           py::arg("eviction_policy") = "lru",
           py::arg("max_retained_fraction") = kDefaultMaxRetainedFraction,
           py::arg("lineage_key_depth") = kLineageKeyDepth,
           py::arg("lineage_adaptive_depth") = false, py::arg("adaptive_ghost_sample_shift") = -1,
           "num_blocks: total pool blocks including the null block. groups: AttentionSpecs of a "
           "hybrid model (default: one full-attention group of block_size). eviction_policy: "
           "the pool's free-block order (pagedkv.EVICTION_POLICIES; 'lru' is vLLM's). "
           "max_retained_fraction: the pin budget, the share of the pool that may be above the "
           "default retention priority. lineage_key_depth, lineage_adaptive_depth: the 'lineage' "
           "policy's key depth in blocks (past the prompts' shared head) and whether the pool "
           "learns it. adaptive_ghost_sample_shift: the 'adaptive' policy's ghosts track 1 in "
           "2**s block fingerprints (0: all; -1: s chosen by the pool's size).")
      .def_property_readonly("num_groups",
                             [](const PyKVCacheManager& s) { return s.kv.num_groups(); })
      .def_property_readonly(
          "num_blocks", [](const PyKVCacheManager& s) { return s.kv.block_pool().num_blocks(); })
      .def_property_readonly("num_out_of_window_blocks_freed",
                             [](PyKVCacheManager& s) {
                               BusyGuard g(s.busy, "KVCacheManager");
                               return s.kv.num_out_of_window_blocks_freed();
                             })
      .def_property_readonly("usage",
                             [](PyKVCacheManager& s) {
                               BusyGuard g(s.busy, "KVCacheManager");
                               return s.kv.usage();
                             })
      .def(
          "group_spec",
          [](const PyKVCacheManager& s, py::handle g) {
            return s.kv.group_spec(static_cast<std::size_t>(to_uint64(g, "group_spec: group")));
          },
          py::arg("group"))
      .def(
          "get_computed_blocks",
          [](PyKVCacheManager& s, PyRequest& r) {
            BusyGuard gm(s.busy, "KVCacheManager");
            BusyGuard gr(r.busy, "Request");
            auto hit = std::make_unique<CacheHit>();
            MaybeReleaseGil nogil(r.req.num_tokens() >= kReleaseGilAbove);
            *hit = s.kv.get_computed_blocks(r.req);
            return hit;
          },
          py::arg("request"),
          "Longest cached prefix, capped at num_tokens - 1 tokens; records stats; changes no "
          "reference counts. Returns a CacheHit (unpacks as (blocks, num_hit_tokens)).")
      .def(
          "allocate_slots",
          [](PyKVCacheManager& s, PyRequest& r, py::object num_new_tokens, py::object hit,
             py::object num_lookahead_tokens) -> py::object {
            BusyGuard gm(s.busy, "KVCacheManager");
            BusyGuard gr(r.busy, "Request");
            const std::size_t n = non_negative(num_new_tokens, "allocate_slots: num_new_tokens");
            const std::size_t look =
                non_negative(num_lookahead_tokens, "allocate_slots: num_lookahead_tokens");
            static const CacheHit kNoHit;
            const CacheHit& h = hit.is_none() ? kNoHit : hit.cast<const CacheHit&>();
            std::optional<std::span<const BlockId>> blocks;
            {
              MaybeReleaseGil nogil(n + look + h.num_tokens >= kReleaseGilAbove);
              blocks = s.kv.allocate_slots(r.req, n, h, look);
            }
            if (!blocks) return py::none();
            return array_copy(*blocks);
          },
          py::arg("request"), py::arg("num_new_tokens"), py::arg("hit") = py::none(),
          py::arg("num_lookahead_tokens") = 0,
          "Touches the hit, allocates blocks for the new (+ lookahead) tokens and caches full "
          "blocks. Returns group 0's new block ids (a new int32 array), or None when they do not "
          "fit (nothing changed).")
      .def(
          "block_ids",
          [](PyKVCacheManager& s, py::object request, py::handle group_obj) {
            const auto group = static_cast<std::size_t>(to_uint64(group_obj, "block_ids: group"));
            BusyGuard gm(s.busy, "KVCacheManager");
            return array_copy(s.kv.block_ids(request_id_of(request, s.kv, "block_ids"), group));
          },
          py::arg("request"), py::arg("group") = 0,
          "The request's block table row in a group (a new int32 array; a Request or its id).")
      .def(
          "block_table",
          [](PyKVCacheManager& s, py::object requests, py::handle group_obj,
             py::handle max_blocks_per_seq_obj, py::handle pad_block_id_obj,
             py::object out_obj) -> py::object {
            const auto group = static_cast<std::size_t>(to_uint64(group_obj, "block_table: group"));
            const auto max_blocks_per_seq =
                to_integer<std::int32_t>(max_blocks_per_seq_obj, "block_table: max_blocks_per_seq");
            const auto pad_block_id =
                to_integer<std::int32_t>(pad_block_id_obj, "block_table: pad_block_id");
            BusyGuard gm(s.busy, "KVCacheManager");
            const auto rows = rows_of(s.kv, requests, group);
            if (pad_block_id < 0) {
              throw Error(ErrorCode::kInvalidArgument, "block_table: pad_block_id is negative");
            }
            std::size_t width = max_blocks_per_seq < 0 ? 0 : std::size_t(max_blocks_per_seq);
            std::size_t longest = 0;
            for (const auto& r : rows) longest = std::max(longest, r.size());
            std::optional<py::array_t<std::int32_t>> out;
            if (!out_obj.is_none()) {
              // Checked, never converted: a converted copy would silently drop the writes.
              if (!py::isinstance<py::array_t<std::int32_t>>(out_obj)) {
                throw Error(ErrorCode::kInvalidArgument, "block_table: out must be an int32 array");
              }
              out = py::reinterpret_borrow<py::array_t<std::int32_t>>(out_obj);
              const auto& a = *out;
              if (a.ndim() != 2 || !(a.flags() & py::array::c_style) || !a.writeable() ||
                  static_cast<std::size_t>(a.shape(0)) < rows.size()) {
                throw Error(ErrorCode::kInvalidArgument,
                            "block_table: out must be a writeable C-contiguous int32 array with "
                            "at least one row per request");
              }
              width = static_cast<std::size_t>(a.shape(1));
            } else if (width == 0) {
              width = longest;
            }
            if (max_blocks_per_seq < 0 || longest > width) {
              throw Error(ErrorCode::kOutOfRange,
                          "block_table: a request holds " + std::to_string(longest) +
                              " blocks but rows have " + std::to_string(width) + " columns");
            }
            py::array_t<std::int32_t> table =
                out ? *out
                    : py::array_t<std::int32_t>(
                          {static_cast<py::ssize_t>(rows.size()), static_cast<py::ssize_t>(width)});
            std::int32_t* p = table.mutable_data();
            for (std::size_t i = 0; i < rows.size(); ++i, p += width) {
              std::copy(rows[i].begin(), rows[i].end(), p);
              std::fill(p + rows[i].size(), p + width, pad_block_id);
            }
            return table;
          },
          py::arg("requests"), py::arg("group") = 0, py::kw_only(),
          py::arg("max_blocks_per_seq") = 0, py::arg("pad_block_id") = 0,
          py::arg("out") = py::none(),
          "Dense int32 [num_seqs, max_blocks_per_seq] table of these requests' rows (Requests or "
          "ids), padded with pad_block_id. out: write into this preallocated array instead "
          "(its width is the row length; rows past the requests are left as they are).")
      .def(
          "slot_mapping",
          [](PyKVCacheManager& s, py::object requests, py::object first_positions,
             py::object num_tokens, py::handle group_obj) {
            const auto group =
                static_cast<std::size_t>(to_uint64(group_obj, "slot_mapping: group"));
            BusyGuard gm(s.busy, "KVCacheManager");
            const auto rows = rows_of(s.kv, requests, group);
            const auto first = to_int64_vector(first_positions, "slot_mapping: first_positions", 0);
            const auto count = to_int64_vector(num_tokens, "slot_mapping: num_tokens", 0);
            if (first.size() != rows.size() || count.size() != rows.size()) {
              throw Error(ErrorCode::kInvalidArgument,
                          "slot_mapping: requests, first_positions and num_tokens differ in "
                          "length");
            }
            const auto bs = static_cast<std::int32_t>(s.kv.group_spec(group).block_size);
            std::vector<std::int64_t> slots;
            for (std::size_t i = 0; i < rows.size(); ++i) {
              append_slot_mapping(slots, rows[i], bs, first[i], count[i]);
            }
            const auto n = static_cast<py::ssize_t>(slots.size());
            return array_owning(std::move(slots), {n});
          },
          py::arg("requests"), py::arg("first_positions"), py::arg("num_tokens"),
          py::arg("group") = 0,
          "int64 slots (block_id * block_size + offset) of tokens [first, first + n) of each "
          "request, concatenated: the kv_append input of one step.")
      .def(
          "num_common_prefix_blocks",
          [](PyKVCacheManager& s, py::object request) {
            BusyGuard gm(s.busy, "KVCacheManager");
            return s.kv.num_common_prefix_blocks(
                request_id_of(request, s.kv, "num_common_prefix_blocks"));
          },
          py::arg("request"))
      .def(
          "evict_blocks",
          [](PyKVCacheManager& s, py::object ids) {
            BusyGuard gm(s.busy, "KVCacheManager");
            std::vector<BlockId> v;
            for (const std::int64_t id : to_int64_vector(ids, "evict_blocks: block_ids")) {
              if (id < std::numeric_limits<BlockId>::min() ||
                  id > std::numeric_limits<BlockId>::max()) {
                throw Error(ErrorCode::kOutOfRange,
                            "evict_blocks: block " + std::to_string(id) + " is out of range");
              }
              v.push_back(static_cast<BlockId>(id));
            }
            return s.kv.evict_blocks(v);
          },
          py::arg("block_ids"), "Drops these blocks' cache entries; returns how many were cached.")
      .def(
          "block_hash",
          [](PyKVCacheManager& s, py::object block_id) -> py::object {
            const BlockId id = block_id_of(block_id, "block_hash: block_id");
            BusyGuard gm(s.busy, "KVCacheManager");
            const KVCacheBlock& b = s.kv.block_pool().block(id);
            if (!b.is_cached()) return py::none();
            return hash_to_bytes(b.block_hash);
          },
          py::arg("block_id"), "The digest a block is cached under, or None.")
      .def(
          "ref_cnt",
          [](PyKVCacheManager& s, py::object block_id) {
            const BlockId id = block_id_of(block_id, "ref_cnt: block_id");
            BusyGuard gm(s.busy, "KVCacheManager");
            return s.kv.block_pool().block(id).ref_cnt;
          },
          py::arg("block_id"));
  def_manager_calls(
      manager,
      {"A Request hashed the way this manager's cache is keyed (hashes the prompt; releases the "
       "GIL for 4096+ tokens). mm_items: (identifier, offset, length) tuples.",
       "Releases a finished request's blocks (tail first).",
       "Releases a running request's blocks so it can be rescheduled; num_computed_tokens = 0.",
       "Buffered KV events (BlockStored, BlockRemoved, AllBlocksCleared), oldest first; needs "
       "enable_kv_events=True."});
}

}  // namespace pagedkv::python
