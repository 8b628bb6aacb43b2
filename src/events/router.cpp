// KVRouter (see pagedkv/events/router.hpp).
#include "pagedkv/events/router.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "pagedkv/base/error.hpp"

namespace pagedkv::events {

KVRouter::KVRouter(const KVIndexer& indexer, KVRouterConfig config)
    : indexer_(indexer), config_(config) {}

RouteDecision KVRouter::route(std::span<const std::uint64_t> block_ids,
                              std::span<const double> loads) {
  RouteDecision d;
  d.matches = indexer_.match(block_ids);
  // An engine whose connection is lost (or not yet resynchronised) may be dead or restarted:
  // its entries earn no credit until the indexer has checked them again.
  // An engine whose connection is down is not sent requests while another one is up.
  d.down.assign(d.matches.size(), false);
  for (EngineId e = 0; e < d.matches.size(); ++e) {
    if (!indexer_.in_sync(e)) d.matches[e] = PrefixMatch{};
    d.down[e] = !indexer_.reachable(e);
  }
  d.engine = pick(d.matches, block_ids.size(), loads, &d.scores, d.down);
  return d;
}

EngineId KVRouter::pick(std::span<const PrefixMatch> matches, std::size_t num_blocks,
                        std::span<const double> loads, std::vector<double>* scores,
                        const std::vector<bool>& skip) {
  const std::size_t k = matches.size();
  if (k == 0 || loads.size() != k) {
    throw Error(ErrorCode::kInvalidArgument, "KVRouter: " + std::to_string(loads.size()) +
                                                 " loads for " + std::to_string(k) + " engines");
  }
  if (!skip.empty() && skip.size() != k) {
    throw Error(ErrorCode::kInvalidArgument, "KVRouter: " + std::to_string(skip.size()) +
                                                 " skip flags for " + std::to_string(k) +
                                                 " engines");
  }
  for (std::size_t e = 0; e < k; ++e) {
    if (!std::isfinite(loads[e]) || loads[e] < 0) {
      throw Error(ErrorCode::kInvalidArgument, "KVRouter: load " + std::to_string(loads[e]) +
                                                   " of engine " + std::to_string(e) +
                                                   " (must be finite and >= 0)");
    }
    if (matches[e].gpu_prefix_blocks > matches[e].prefix_blocks) {
      throw Error(ErrorCode::kInvalidArgument,
                  "KVRouter: engine " + std::to_string(e) + " matches " +
                      std::to_string(matches[e].gpu_prefix_blocks) + " blocks on its GPU but " +
                      std::to_string(matches[e].prefix_blocks) +
                      " on any medium (gpu_prefix_blocks must be <= prefix_blocks)");
    }
  }
  // Every engine skipped: choose among all of them.
  const bool skipping = !skip.empty() && std::find(skip.begin(), skip.end(), false) != skip.end();
  const double max_load = std::max(1.0, *std::max_element(loads.begin(), loads.end()));
  const double n = static_cast<double>(std::max<std::size_t>(num_blocks, 1));
  if (scores) scores->assign(k, 0.0);
  EngineId best = k;
  double best_score = 0;
  for (std::size_t i = 0; i < k; ++i) {
    const EngineId e = (cursor_ + i) % k;  // ties keep the first seen: rotates with the cursor
    const PrefixMatch& m = matches[e];
    const double cached =
        m.gpu_prefix_blocks + config_.cpu_weight * (m.prefix_blocks - m.gpu_prefix_blocks);
    const double score =
        config_.prefix_weight * cached / n - config_.load_weight * loads[e] / max_load;
    if (scores) (*scores)[e] = score;
    if (skipping && skip[e]) continue;
    if (best == k || score > best_score || (score == best_score && loads[e] < loads[best])) {
      best = e;
      best_score = score;
    }
  }
  cursor_ = (cursor_ + 1) % k;
  return best;
}

}  // namespace pagedkv::events
