// python/src/sched.cpp: AdmissionScheduler (sched/admission_scheduler.hpp) over a KVCacheManager
// or TieredKVCacheManager: the admission order and prefill chunks of a step's waiting requests.
//
// Python keeps no WaitingRequest structs: propose(requests, arrivals, ...) takes the waiting
// requests and their arrival ranks, and the scheduler remembers each rank's passed-over count
// between steps (ranks no longer waiting are forgotten at the next propose()). record_step(n)
// then says how many of the proposal's admissions the engine made.
//
// Lifetimes: the scheduler keeps its manager alive (py::keep_alive) and reads it only through a
// read-only PrefixProbe; propose() holds each request's and the manager's busy flag for the call.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common.hpp"
#include "objects.hpp"
#include "pagedkv/sched/admission_scheduler.hpp"
#include "pagedkv/sched/prefix_probe.hpp"

namespace pagedkv::python {

namespace {

SchedulePolicy policy_of(const std::string& s) {
  if (s == "prefix") return SchedulePolicy::kPrefix;
  if (s == "fcfs") return SchedulePolicy::kFcfs;
  throw Error(ErrorCode::kInvalidArgument,
              "AdmissionScheduler: policy 'prefix' or 'fcfs', not '" + s + "'");
}

struct PyAdmissionScheduler {
  PyAdmissionScheduler(const KVCacheManager& gpu, std::atomic<bool>& mbusy,
                       const AdmissionSchedulerConfig& c)
      : probe(gpu), sched(probe, c), manager_busy(mbusy) {}
  PyAdmissionScheduler(const TieredKVCacheManager& tier, std::atomic<bool>& mbusy,
                       const AdmissionSchedulerConfig& c)
      : probe(tier), sched(probe, c), manager_busy(mbusy) {}
  PrefixProbe probe;
  AdmissionScheduler sched;
  std::atomic<bool>& manager_busy;
  std::atomic<bool> busy{false};
  std::unordered_map<std::uint64_t, std::uint32_t> passed_over;  // by arrival rank
  std::vector<WaitingRequest> last;                              // the last propose()'s entries
};

struct PyProposal {
  std::vector<Admission> admissions;
  std::vector<std::size_t> deferred;
  std::size_t tokens_charged = 0, blocks_taken = 0, blocks_reserved = 0;
};

// Integers are checked (common.hpp to_integer): no float, bool or negative count.
AdmissionSchedulerConfig config_of(const std::string& policy, py::handle max_passed_over,
                                   bool defer_shared_prefix, py::handle max_candidates,
                                   bool reserve_whole_prompt, py::handle max_chunk_tokens,
                                   py::handle host_load_tokens_per_step,
                                   py::handle remote_load_tokens_per_step) {
  AdmissionSchedulerConfig c;
  c.policy = policy_of(policy);
  c.max_passed_over = to_integer<std::uint32_t>(max_passed_over, "max_passed_over");
  c.defer_shared_prefix = defer_shared_prefix;
  c.max_candidates = to_integer<std::size_t>(max_candidates, "max_candidates");
  c.reserve_whole_prompt = reserve_whole_prompt;
  c.max_chunk_tokens = to_integer<std::size_t>(max_chunk_tokens, "max_chunk_tokens");
  c.host_load_tokens_per_step =
      to_integer<std::size_t>(host_load_tokens_per_step, "host_load_tokens_per_step");
  c.remote_load_tokens_per_step =
      to_integer<std::size_t>(remote_load_tokens_per_step, "remote_load_tokens_per_step");
  return c;
}

}  // namespace

void bind_sched(py::module_& m) {
  py::class_<CachedPrefix>(m, "CachedPrefix", "What a waiting request would hit now.")
      .def_readonly("gpu_tokens", &CachedPrefix::gpu_tokens)
      .def_readonly("host_tokens", &CachedPrefix::host_tokens)
      .def_readonly("gpu_free_hit_blocks", &CachedPrefix::gpu_free_hit_blocks)
      .def_property_readonly("tokens", &CachedPrefix::tokens)
      .def("__repr__", [](const CachedPrefix& c) {
        return "CachedPrefix(gpu_tokens=" + std::to_string(c.gpu_tokens) +
               ", host_tokens=" + std::to_string(c.host_tokens) + ")";
      });

  py::class_<Admission>(m, "Admission", "One admission of a proposal, in admission order.")
      .def_readonly("index", &Admission::index)
      .def_readonly("cached", &Admission::cached)
      .def_readonly("in_step_tokens", &Admission::in_step_tokens)
      .def_readonly("remote_tokens", &Admission::remote_tokens)
      .def_readonly("chunk_tokens", &Admission::chunk_tokens)
      .def_readonly("new_blocks", &Admission::new_blocks)
      .def_readonly("reserved_blocks", &Admission::reserved_blocks)
      .def_property_readonly("cached_tokens", &Admission::cached_tokens)
      .def("__repr__", [](const Admission& a) {
        return "Admission(index=" + std::to_string(a.index) +
               ", cached_tokens=" + std::to_string(a.cached_tokens()) +
               ", chunk_tokens=" + std::to_string(a.chunk_tokens) + ")";
      });

  py::class_<PyProposal>(m, "Proposal", "A step's admissions and deferrals.")
      .def_readonly("admissions", &PyProposal::admissions)
      .def_readonly("deferred", &PyProposal::deferred)
      .def_readonly("tokens_charged", &PyProposal::tokens_charged)
      .def_readonly("blocks_taken", &PyProposal::blocks_taken)
      .def_readonly("blocks_reserved", &PyProposal::blocks_reserved);

  py::class_<PyAdmissionScheduler>(
      m, "AdmissionScheduler",
      "Cache-aware admission of waiting requests (C++ pagedkv::AdmissionScheduler): longest "
      "cached prefix first, same-step shared-prefix deferral, aging (no request passed over more "
      "than max_passed_over steps). Reads the manager through a read-only probe.")
      .def(py::init([](PyKVCacheManager& kv, const std::string& policy, py::handle max_passed_over,
                       bool defer_shared_prefix, py::handle max_candidates,
                       bool reserve_whole_prompt, py::handle max_chunk_tokens, py::handle host_load,
                       py::handle remote_load) {
             return std::make_unique<PyAdmissionScheduler>(
                 kv.kv, kv.busy,
                 config_of(policy, max_passed_over, defer_shared_prefix, max_candidates,
                           reserve_whole_prompt, max_chunk_tokens, host_load, remote_load));
           }),
           py::arg("manager"), py::kw_only(), py::arg("policy") = "prefix",
           py::arg("max_passed_over") = 256, py::arg("defer_shared_prefix") = true,
           py::arg("max_candidates") = 128, py::arg("reserve_whole_prompt") = true,
           py::arg("max_chunk_tokens") = 0, py::arg("host_load_tokens_per_step") = 0,
           py::arg("remote_load_tokens_per_step") = 0, py::keep_alive<1, 2>())
      .def(py::init([](PyTieredKVCacheManager& t, const std::string& policy,
                       py::handle max_passed_over, bool defer_shared_prefix,
                       py::handle max_candidates, bool reserve_whole_prompt,
                       py::handle max_chunk_tokens, py::handle host_load, py::handle remote_load) {
             return std::make_unique<PyAdmissionScheduler>(
                 t.tier, t.busy,
                 config_of(policy, max_passed_over, defer_shared_prefix, max_candidates,
                           reserve_whole_prompt, max_chunk_tokens, host_load, remote_load));
           }),
           py::arg("manager"), py::kw_only(), py::arg("policy") = "prefix",
           py::arg("max_passed_over") = 256, py::arg("defer_shared_prefix") = true,
           py::arg("max_candidates") = 128, py::arg("reserve_whole_prompt") = true,
           py::arg("max_chunk_tokens") = 0, py::arg("host_load_tokens_per_step") = 0,
           py::arg("remote_load_tokens_per_step") = 0, py::keep_alive<1, 2>())
      .def(
          "probe",
          [](PyAdmissionScheduler& s, PyRequest& r) {
            BusyGuard g(s.busy, "AdmissionScheduler");
            BusyGuard gm(s.manager_busy, "the scheduler's manager");
            BusyGuard gr(r.busy, "Request");
            return s.probe.probe(r.req);
          },
          py::arg("request"),
          "The request's cached prefix now (GPU, then host), read-only: no LRU change, no stats.")
      .def(
          "propose",
          [](PyAdmissionScheduler& s, const std::vector<PyRequest*>& requests,
             py::handle arrivals_obj, py::handle token_budget_obj, py::handle free_blocks_obj,
             py::handle max_admissions_obj, py::handle remote_tokens_obj) {
            const std::vector<std::uint64_t> arrivals =
                to_uint64_vector(arrivals_obj, "AdmissionScheduler.propose: arrivals");
            const auto token_budget = to_integer<std::size_t>(
                token_budget_obj, "AdmissionScheduler.propose: token_budget");
            const auto free_blocks =
                to_integer<std::size_t>(free_blocks_obj, "AdmissionScheduler.propose: free_blocks");
            const auto max_admissions = to_integer<std::size_t>(
                max_admissions_obj, "AdmissionScheduler.propose: max_admissions");
            std::optional<std::vector<std::uint64_t>> remote_tokens;
            if (!remote_tokens_obj.is_none()) {
              remote_tokens =
                  to_uint64_vector(remote_tokens_obj, "AdmissionScheduler.propose: remote_tokens");
            }
            if (arrivals.size() != requests.size() ||
                (remote_tokens && remote_tokens->size() != requests.size())) {
              throw Error(ErrorCode::kInvalidArgument,
                          "AdmissionScheduler.propose: requests, arrivals (and remote_tokens) "
                          "must have the same length");
            }
            BusyGuard g(s.busy, "AdmissionScheduler");
            BusyGuard gm(s.manager_busy, "the scheduler's manager");
            std::vector<WaitingRequest> w(requests.size());
            std::vector<std::unique_ptr<BusyGuard>> guards;
            for (std::size_t i = 0; i < requests.size(); ++i) {
              if (requests[i] == nullptr) {
                throw Error(ErrorCode::kInvalidArgument, "AdmissionScheduler.propose: request " +
                                                             std::to_string(i) + " is None");
              }
              // A request listed twice is "in use" by its first entry: an error.
              guards.push_back(std::make_unique<BusyGuard>(requests[i]->busy, "Request"));
              const auto it = s.passed_over.find(arrivals[i]);
              w[i] = {&requests[i]->req, arrivals[i], it == s.passed_over.end() ? 0 : it->second,
                      remote_tokens ? (*remote_tokens)[i] : 0};
            }
            const Proposal& p = s.sched.propose(w, {token_budget, free_blocks, max_admissions});
            PyProposal out{p.admissions, p.deferred, p.tokens_charged, p.blocks_taken,
                           p.blocks_reserved};
            s.last = std::move(w);
            return out;
          },
          py::arg("requests"), py::arg("arrivals"), py::kw_only(), py::arg("token_budget"),
          py::arg("free_blocks"), py::arg("max_admissions"), py::arg("remote_tokens") = py::none(),
          "The step's proposal for the waiting requests (arrivals: unique FCFS ranks, smaller "
          "first). Admit proposal.admissions in order, then call record_step().")
      .def(
          "record_step",
          [](PyAdmissionScheduler& s, py::handle num_admitted_obj) {
            const auto num_admitted = to_integer<std::size_t>(
                num_admitted_obj, "AdmissionScheduler.record_step: num_admitted");
            BusyGuard g(s.busy, "AdmissionScheduler");
            s.sched.record_step(s.last, num_admitted);
            std::unordered_map<std::uint64_t, std::uint32_t> kept;
            for (const WaitingRequest& w : s.last) kept.emplace(w.arrival, w.passed_over);
            s.passed_over.swap(kept);
            s.last.clear();
          },
          py::arg("num_admitted"),
          "The engine admitted the first num_admitted admissions of the last proposal: ages the "
          "requests it passed over.")
      .def(
          "passed_over",
          [](PyAdmissionScheduler& s, py::handle arrival_obj) {
            const auto it = s.passed_over.find(
                to_uint64(arrival_obj, "AdmissionScheduler.passed_over: arrival"));
            return it == s.passed_over.end() ? 0u : it->second;
          },
          py::arg("arrival"), "Steps the waiting request of this arrival rank was passed over.");
}

}  // namespace pagedkv::python
