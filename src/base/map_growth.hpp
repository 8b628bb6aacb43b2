// src/base/map_growth.hpp (private, not installed): room for `extra` more keys in an unordered
// map, so that inserting them cannot rehash (allocate), grown geometrically and never shrunk.
//
// `m.reserve(m.size() + 1)` before each insert is what the strong guarantee's prepare phase
// needs, but libstdc++'s reserve also shrinks: a map whose size goes up and down (batches in
// flight) rehashes, allocating a new bucket array, at every few inserts (5 rehashes per 8 inserts
// on a map filled to 8 and emptied, measured). reserve_more_keys reserves only when an insert
// could rehash, and then for twice the keys. Throws what reserve throws (std::bad_alloc,
// std::length_error), changing nothing.
#pragma once

#include <algorithm>
#include <cstddef>

namespace pagedkv::detail {

// The growth, out of line: the check that usually finds room stays inline.
template <class Map>
[[gnu::noinline]] void grow_keys_to(Map& m, std::size_t need) {
  const std::size_t doubled = m.size() <= m.max_size() / 2 ? 2 * m.size() : need;
  m.reserve(std::max(need, doubled));
}

// An insert of up to `extra` keys rehashes only when the keys then held reach the bucket count
// times the maximum load factor ("at least": libstdc++ rehashes at equality, and a map's first
// single bucket always rehashes), so room is made then and only then.
template <class Map>
inline void reserve_more_keys(Map& m, std::size_t extra) {
  const std::size_t need = m.size() + extra;
  if (m.bucket_count() <= 1 ||
      static_cast<double>(need) >= static_cast<double>(m.bucket_count()) *
                                       static_cast<double>(m.max_load_factor())) [[unlikely]]
    grow_keys_to(m, need);
}

}  // namespace pagedkv::detail
