// pagedkv/events/router.hpp: KVRouter, picks the engine for a request from the KVIndexer.
//
// Score of engine e for a request of n blocks (n >= 1), with its cached prefix from the index
// (gpu = blocks of the prefix on the engine's GPU, any = on any medium, any >= gpu) and its load
// L_e as the caller measures it (running requests, queued tokens...), L_max = max over engines:
//
//   score_e = prefix_weight * (gpu + cpu_weight * (any - gpu)) / n
//           - load_weight   * L_e / max(L_max, 1)
//
// Both terms lie in [0, 1] before weighting, like llm-d's prefix-cache and load scorers; a GPU
// block counts fully, a block that must come back from a lower tier counts cpu_weight. The
// highest score wins; ties go to the lower load, then round-robin (so with no cache anywhere
// and equal loads the router spreads requests evenly). route() gives an engine that is not
// in sync (KVIndexer::in_sync: its connection is lost, or not yet resynchronised after a
// reconnect) no prefix: its entries may describe a dead or restarted process. route() also
// skips every engine whose connection is down (KVIndexer::reachable: EngineStatus::connected of
// an engine followed over ZeroMQ): it is never picked while another engine is reachable; when
// none is, the pick is made among all engines as if all were up (the caller must send the
// request somewhere; RouteDecision::down says which were down).
//
// Thread-compatible: route() updates the round-robin cursor; use one router per thread or lock.
// Errors: loads.size() != number of engines, no engines, a load that is not finite or is
// negative, or a match with gpu_prefix_blocks > prefix_blocks throw pagedkv::Error
// (kInvalidArgument), changing nothing (the round-robin cursor included).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pagedkv/events/indexer.hpp"

namespace pagedkv::events {

struct KVRouterConfig {
  double prefix_weight = 1.0;
  double cpu_weight = 0.5;
  double load_weight = 0.5;
};

struct RouteDecision {
  EngineId engine = 0;
  std::vector<PrefixMatch> matches;  // per engine (zero for an engine not in sync)
  std::vector<double> scores;        // per engine (an engine that is down keeps its score)
  std::vector<bool> down;            // per engine: its connection was down (skipped)
};

class KVRouter {
 public:
  explicit KVRouter(const KVIndexer& indexer, KVRouterConfig config = {});

  // block_ids: the request's full blocks' ids (BlockHash::event_id() of its hashes, computed
  // with the cluster's scheme and seed). loads: one per engine.
  RouteDecision route(std::span<const std::uint64_t> block_ids, std::span<const double> loads);
  // The same scoring without the index lookup (matches per engine given).
  // `skip` (empty, or one per engine): engines not to pick unless every engine is skipped.
  EngineId pick(std::span<const PrefixMatch> matches, std::size_t num_blocks,
                std::span<const double> loads, std::vector<double>* scores = nullptr,
                const std::vector<bool>& skip = {});

  const KVRouterConfig& config() const noexcept { return config_; }

 private:
  const KVIndexer& indexer_;
  KVRouterConfig config_;
  std::size_t cursor_ = 0;  // round-robin tie-break
};

}  // namespace pagedkv::events
