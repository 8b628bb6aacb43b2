// src/base/vector_growth.hpp (private, not installed): room for `extra` more elements in a
// vector, grown geometrically.
//
// `v.reserve(v.size() + extra)` before each append reserves exactly: a row that grows by one
// block per decode step then reallocates and copies itself at every step (a heap allocation per
// block, and quadratic copying over a long decode). reserve_more keeps the amortized O(1) growth
// of push_back while still allocating before any change is made (the strong guarantee's prepare
// phase). Throws what reserve throws (std::bad_alloc, std::length_error), changing nothing.
#pragma once

#include <algorithm>
#include <cstddef>

namespace pagedkv::detail {

// The growth, out of line: inlined into a caller's hot loop it costs registers (the tier measured
// 3 ns per block for its own reserve_room); the check that usually finds room stays inline.
template <class Vector>
[[gnu::noinline]] void grow_to(Vector& v, std::size_t need) {
  const std::size_t doubled = v.capacity() <= v.max_size() / 2 ? 2 * v.capacity() : need;
  v.reserve(std::max(need, doubled));
}

template <class Vector>
inline void reserve_more(Vector& v, std::size_t extra) {
  const std::size_t need = v.size() + extra;
  if (need > v.capacity()) [[unlikely]]
    grow_to(v, need);
}

}  // namespace pagedkv::detail
