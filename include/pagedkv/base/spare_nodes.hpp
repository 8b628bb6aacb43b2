// pagedkv/base/spare_nodes.hpp: a bounded stack of nodes taken out of a node-based map
// (std::unordered_map, std::map), reused for new keys. A map whose entries come and go at a
// steady rate (a manager's per-request state: inserted when a request is first allocated, erased
// when it is preempted or freed) then allocates no node, and each reused value keeps the capacity
// of its vectors.
//
// Contract:
//   - O(1) per call, plus the map's own insert (which may rehash) or extract.
//   - Not thread-safe: it belongs to the map's owner, who serializes both.
//   - insert_new() throws what the map's insert throws (std::bad_alloc on a rehash), with the map
//     unchanged; a spare node may then be lost (never a map entry).
//   - give() never throws: the owner's `reset` (noexcept) clears the value and says whether to
//     keep it (e.g. false when its vectors grew too large to hold on to idle); a node beyond the
//     bound, or one not kept, is destroyed.
//   - The spare nodes are the owner's memory: at most N values, each as large as `reset` allows.
#pragma once

#include <array>
#include <cstddef>
#include <utility>

namespace pagedkv {

template <typename Map, std::size_t N>
class SpareNodes {
 public:
  using Node = typename Map::node_type;

  // Inserts `key`, which the map must not hold, with a spare node's value when there is one
  // (as `reset` left it), else a value-initialized one. Returns the new entry.
  typename Map::iterator insert_new(Map& map, const typename Map::key_type& key) {
    if (count_ == 0) return map.try_emplace(key).first;
    Node node = std::move(spares_[--count_]);
    node.key() = key;
    return map.insert(std::move(node)).position;
  }

  // Erases `it` from the map, keeping its node for a later insert_new() when reset(value) (which
  // must not throw) returns true and fewer than N are kept.
  template <typename Reset>
  void give(Map& map, typename Map::iterator it, Reset&& reset) noexcept {
    Node node = map.extract(it);
    if (count_ < N && reset(node.mapped())) spares_[count_++] = std::move(node);
  }

  std::size_t size() const noexcept { return count_; }

 private:
  std::array<Node, N> spares_{};
  std::size_t count_ = 0;
};

}  // namespace pagedkv
