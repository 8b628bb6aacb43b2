// python/src/retention.cpp: retention configs (TensorRT-LLM's names: KvCacheRetentionConfig,
// TokenRangeRetentionConfig), a block's retention and the per-class retention stats.
// The manager side (Request.kv_cache_retention_config, make_request(kv_cache_retention_config=),
// set_time(), retention_stats(), block_retention()) is in objects.hpp / manager.cpp.
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "pagedkv/manager/retention.hpp"
#include "pagedkv/pool/eviction_policy.hpp"
#include "pagedkv/pool/retention.hpp"

namespace pagedkv::python {

namespace {

RetentionPriority priority_of(py::handle v, const char* what) {
  // 0..255 converts; validate() names anything above 100.
  return static_cast<RetentionPriority>(to_int64(v, what, 0, 255));
}

std::optional<RetentionTick> duration_of(py::handle v, const char* what) {
  if (v.is_none()) return std::nullopt;
  return to_int64(v, what);
}

py::object duration_to_python(const std::optional<RetentionTick>& d) {
  return d ? py::object(py::int_(*d)) : py::object(py::none());
}

// Checks what can be checked without the prompt (priorities, durations, order, empty ranges).
void check_config(const RetentionConfig& c) {
  c.validate(static_cast<std::size_t>(-1));
}

std::string repr(const TokenRangeRetention& t) {
  return "TokenRangeRetentionConfig(token_start=" + std::to_string(t.token_start) +
         ", token_end=" + (t.token_end ? std::to_string(*t.token_end) : "None") +
         ", priority=" + std::to_string(unsigned{t.priority}) +
         ", duration=" + (t.duration ? std::to_string(*t.duration) : "None") + ")";
}

const char* class_name(std::size_t k) {
  static const char* const kNames[] = {"below_default", "default", "above_default"};
  return kNames[k];
}

}  // namespace

void bind_retention(py::module_& m) {
  m.attr("DEFAULT_RETENTION_PRIORITY") = py::int_(unsigned{kDefaultRetentionPriority});
  m.attr("MAX_RETENTION_PRIORITY") = py::int_(unsigned{kMaxRetentionPriority});
  m.attr("EVICTION_POLICIES") = [] {
    py::list names;
    for (std::uint8_t p = 0; p < kNumEvictionPolicies; ++p) {
      names.append(py::str(std::string(to_string(static_cast<EvictionPolicy>(p)))));
    }
    return py::tuple(names);
  }();

  py::class_<TokenRangeRetention>(
      m, "TokenRangeRetentionConfig",
      "Prompt tokens [token_start, token_end) (token_end None: the end of the prompt) retained at "
      "`priority` (0..100; 35 is the default) for `duration` ticks of the manager's clock after "
      "their last use (None: no expiry). TensorRT-LLM's name.")
      .def(py::init([](py::object token_start, py::object token_end, py::object priority,
                       py::object duration) {
             TokenRangeRetention t;
             t.token_start = static_cast<std::size_t>(
                 to_int64(token_start, "TokenRangeRetentionConfig: token_start", 0));
             if (!token_end.is_none()) {
               t.token_end = static_cast<std::size_t>(
                   to_int64(token_end, "TokenRangeRetentionConfig: token_end", 0));
             }
             t.priority = priority_of(priority, "TokenRangeRetentionConfig: priority");
             t.duration = duration_of(duration, "TokenRangeRetentionConfig: duration");
             RetentionConfig c;
             c.token_ranges.push_back(t);
             check_config(c);
             return t;
           }),
           py::arg("token_start"), py::arg("token_end") = py::none(),
           py::arg("priority") = unsigned{kDefaultRetentionPriority},
           py::arg("duration") = py::none())
      .def_readonly("token_start", &TokenRangeRetention::token_start)
      .def_readonly("token_end", &TokenRangeRetention::token_end)
      .def_property_readonly("priority",
                             [](const TokenRangeRetention& t) { return unsigned{t.priority}; })
      .def_property_readonly(
          "duration", [](const TokenRangeRetention& t) { return duration_to_python(t.duration); })
      .def("__eq__",
           [](const TokenRangeRetention& a, const TokenRangeRetention& b) { return a == b; })
      .def("__repr__", [](const TokenRangeRetention& t) { return repr(t); });

  py::class_<RetentionConfig>(
      m, "KvCacheRetentionConfig",
      "A request's retention (TensorRT-LLM's KvCacheRetentionConfig): token ranges of the prompt "
      "(sorted, not overlapping) with a priority and an optional duration each, and a priority "
      "and duration for generated tokens. A block takes the highest priority of the tokens it "
      "holds. Set it on a request (Request.kv_cache_retention_config or make_request(..., "
      "kv_cache_retention_config=)), which checks it against the prompt.")
      .def(py::init([](std::vector<TokenRangeRetention> ranges, py::object decode_priority,
                       py::object decode_duration) {
             RetentionConfig c;
             c.token_ranges = std::move(ranges);
             c.decode_retention_priority =
                 priority_of(decode_priority, "KvCacheRetentionConfig: decode_retention_priority");
             c.decode_duration =
                 duration_of(decode_duration, "KvCacheRetentionConfig: decode_duration");
             check_config(c);
             return c;
           }),
           py::arg("token_range_retention_configs") = std::vector<TokenRangeRetention>{},
           py::arg("decode_retention_priority") = unsigned{kDefaultRetentionPriority},
           py::arg("decode_duration") = py::none())
      .def_readonly("token_range_retention_configs", &RetentionConfig::token_ranges)
      .def_property_readonly(
          "decode_retention_priority",
          [](const RetentionConfig& c) { return unsigned{c.decode_retention_priority}; })
      .def_property_readonly(
          "decode_duration",
          [](const RetentionConfig& c) { return duration_to_python(c.decode_duration); })
      .def("__eq__", [](const RetentionConfig& a, const RetentionConfig& b) { return a == b; })
      .def("__repr__", [](const RetentionConfig& c) {
        std::string s = "KvCacheRetentionConfig(token_range_retention_configs=[";
        for (std::size_t i = 0; i < c.token_ranges.size(); ++i) {
          s += (i ? ", " : "") + repr(c.token_ranges[i]);
        }
        return s + "], decode_retention_priority=" +
               std::to_string(unsigned{c.decode_retention_priority}) + ", decode_duration=" +
               (c.decode_duration ? std::to_string(*c.decode_duration) : "None") + ")";
      });

  py::class_<BlockRetention>(m, "BlockRetention",
                             "A block's retention now: priority, duration and expires_at (None: "
                             "no expiry).")
      .def_property_readonly("priority",
                             [](const BlockRetention& b) { return unsigned{b.priority}; })
      .def_property_readonly("duration",
                             [](const BlockRetention& b) {
                               return b.duration == kNoExpiry ? py::object(py::none())
                                                              : py::object(py::int_(b.duration));
                             })
      .def_property_readonly("expires_at",
                             [](const BlockRetention& b) {
                               return b.expires_at == kNoExpiry
                                          ? py::object(py::none())
                                          : py::object(py::int_(b.expires_at));
                             })
      .def("__repr__", [](const BlockRetention& b) {
        return "BlockRetention(priority=" + std::to_string(unsigned{b.priority}) + ")";
      });

  py::class_<RetentionStats::PerClass>(m, "RetentionClassStats")
      .def_readonly("blocks", &RetentionStats::PerClass::blocks)
      .def_readonly("hits", &RetentionStats::PerClass::hits)
      .def_readonly("evictions", &RetentionStats::PerClass::evictions)
      .def("__repr__", [](const RetentionStats::PerClass& p) {
        return "RetentionClassStats(blocks=" + std::to_string(p.blocks) +
               ", hits=" + std::to_string(p.hits) + ", evictions=" + std::to_string(p.evictions) +
               ")";
      });

  py::class_<RetentionStats>(
      m, "RetentionStats",
      "Per priority class (by_class: 'below_default', 'default', 'above_default'): blocks, hits, "
      "evictions; the pin budget (retained_blocks of retained_budget, budget_refusals), "
      "expirations and forced_evictions (a block above the default evicted because nothing "
      "lower was evictable).")
      .def_property_readonly("by_class",
                             [](const RetentionStats& s) {
                               py::dict d;
                               for (std::size_t k = 0; k < kNumRetentionClasses; ++k) {
                                 d[py::str(class_name(k))] = py::cast(s.by_class[k]);
                               }
                               return d;
                             })
      .def_readonly("retained_blocks", &RetentionStats::retained_blocks)
      .def_readonly("retained_budget", &RetentionStats::retained_budget)
      .def_readonly("budget_refusals", &RetentionStats::budget_refusals)
      .def_readonly("expirations", &RetentionStats::expirations)
      .def_readonly("forced_evictions", &RetentionStats::forced_evictions)
      .def("__repr__", [](const RetentionStats& s) {
        return "RetentionStats(retained_blocks=" + std::to_string(s.retained_blocks) +
               ", retained_budget=" + std::to_string(s.retained_budget) +
               ", budget_refusals=" + std::to_string(s.budget_refusals) +
               ", expirations=" + std::to_string(s.expirations) +
               ", forced_evictions=" + std::to_string(s.forced_evictions) + ")";
      });
}

}  // namespace pagedkv::python
