// The tiny engine's dense product (model.hpp, matmul), in a file of its own so the build can
// compile it at -O3 whatever the build type (examples/tiny_engine/CMakeLists.txt), with any
// compiler: at CI's sanitizer -O1 it was half of every tiny-engine test's time (docs/testing.md,
// "CI"). Not instrumented by the sanitizers either: it is example code, not the library, and was
// 84% of every tiny-engine test's time in CI's ASan + UBSan build (22 s -> 5 s for one test);
// everything around it, the library's calls included, stays instrumented. The loops keep their
// order of additions (-ffp-contract=off, no reassociation), so the bits do not change with the
// optimization level.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "model.hpp"

namespace tiny_engine {

#if defined(__GNUC__) || defined(__clang__)
__attribute__((no_sanitize("address", "undefined")))
#endif
void matmul(const float* x, std::int64_t rows, std::int32_t in, const float* w, std::int32_t out,
            float* y) {
  // Rows in tiles so each weight row is loaded once per tile; within a row, y[i] accumulates
  // x[j] * w[j][i] for j = 0, 1, ... in order whatever the tile, so results never depend on
  // how many rows were batched (the inner loop over i vectorizes without reassociation).
  constexpr std::int64_t kTile = 8;
  const auto n_out = static_cast<std::size_t>(out);
  for (std::int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const std::int64_t r1 = std::min(rows, r0 + kTile);
    for (std::int64_t r = r0; r < r1; ++r) {
      float* yr = y + static_cast<std::size_t>(r) * n_out;
      for (std::size_t i = 0; i < n_out; ++i) yr[i] = 0.0f;
    }
    for (std::int32_t j = 0; j < in; ++j) {
      const float* wj = w + static_cast<std::size_t>(j) * n_out;
      for (std::int64_t r = r0; r < r1; ++r) {
        const float xj = x[static_cast<std::size_t>(r) * static_cast<std::size_t>(in) +
                           static_cast<std::size_t>(j)];
        float* yr = y + static_cast<std::size_t>(r) * n_out;
        for (std::size_t i = 0; i < n_out; ++i) yr[i] += xj * wj[i];
      }
    }
  }
}

}  // namespace tiny_engine
