// The warpgroup-MMA probe (kernels/internal/wgmma_probe.hpp, issue 35 step B groundwork) on a
// GPU of compute capability 9.0: each case's D against a reference matmul on the host. Operands
// are multiples of 1/8 in [-1, 1] (exact in bf16) so every product and every partial sum of 64 of
// them is exact in fp32 whatever the summation order: the check is equality. The N-major case
// runs both readings of its descriptor: the one kernels/internal/wgmma_layout.hpp asserts
// (kMnMajorKGroupsInLbo) must match and the other must not (so the check can fail, and a wrong
// reading is named).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "internal/wgmma_layout.hpp"
#include "internal/wgmma_probe.hpp"

namespace pagedkv {
namespace {

using cuda::detail::run_wgmma_probe;
using cuda::detail::wgmma_probe_shape;
using cuda::detail::WgmmaProbeCase;

std::uint16_t bf16_bits(float x) {  // exact for the values used here
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<std::uint16_t>(u >> 16);
}

struct Operands {
  std::vector<float> a, b;  // values
  std::vector<std::uint16_t> a_bits, b_bits;
};

Operands random_operands(std::size_t a_count, std::size_t b_count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-8, 8);
  Operands o;
  for (std::size_t i = 0; i < a_count; ++i) o.a.push_back(static_cast<float>(dist(rng)) / 8.f);
  for (std::size_t i = 0; i < b_count; ++i) o.b.push_back(static_cast<float>(dist(rng)) / 8.f);
  for (const float x : o.a) o.a_bits.push_back(bf16_bits(x));
  for (const float x : o.b) o.b_bits.push_back(bf16_bits(x));
  return o;
}

// D = A x B^T (b_is_nk: B given n x k) or A x B (B given k x n).
std::vector<float> reference(const Operands& o, int m, int n, int k, bool b_is_nk) {
  std::vector<float> d(static_cast<std::size_t>(m) * static_cast<std::size_t>(n));
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < n; ++c) {
      double s = 0;
      for (int i = 0; i < k; ++i) {
        const float bv = b_is_nk ? o.b[static_cast<std::size_t>(c * k + i)]
                                 : o.b[static_cast<std::size_t>(i * n + c)];
        s += static_cast<double>(o.a[static_cast<std::size_t>(r * k + i)]) * bv;
      }
      d[static_cast<std::size_t>(r * n + c)] = static_cast<float>(s);
    }
  }
  return d;
}

// Mismatching elements, with the first few named.
int mismatches(const std::vector<float>& got, const std::vector<float>& want, int n,
               std::string& first) {
  int bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;  // NaN (never written) is unequal too
    if (++bad <= 4) {
      first += " (" + std::to_string(i / static_cast<std::size_t>(n)) + "," +
               std::to_string(i % static_cast<std::size_t>(n)) + "): " + std::to_string(got[i]) +
               " vs " + std::to_string(want[i]) + ";";
    }
  }
  return bad;
}

class WgmmaProbe : public testing::GpuTest {
 protected:
  void SetUp() override {
    testing::GpuTest::SetUp();
    if (IsSkipped()) return;
    if (!cuda::detail::wgmma_probe_supported()) {
      PAGEDKV_GPU_SKIP("the device is not compute capability 9.0: no sm_90a code to probe");
    }
  }

  void check_case(WgmmaProbeCase c, bool k_groups_in_lbo, bool expect_match, unsigned seed) {
    const auto s = wgmma_probe_shape(c);
    const auto mk = static_cast<std::size_t>(s.m * s.k);
    const auto nk = static_cast<std::size_t>(s.n * s.k);
    const Operands o = random_operands(mk, nk, seed);
    const bool b_is_nk = c != WgmmaProbeCase::kRegAMnMajorB;
    const std::vector<float> want = reference(o, s.m, s.n, s.k, b_is_nk);
    std::vector<float> got(want.size());
    run_wgmma_probe(c, k_groups_in_lbo, o.a_bits.data(), o.b_bits.data(), got.data());
    std::string first;
    const int bad = mismatches(got, want, s.n, first);
    if (expect_match) {
      EXPECT_EQ(bad, 0) << bad << " of " << want.size() << " elements differ:" << first;
    } else {
      EXPECT_GT(bad, 0) << "the other descriptor reading also matched";
    }
  }
};

TEST_F(WgmmaProbe, SharedMemoryAAndKMajorB) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    check_case(WgmmaProbeCase::kSmemAKMajorB, true, true, seed);
  }
}

TEST_F(WgmmaProbe, RegisterAAndKMajorB) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    check_case(WgmmaProbeCase::kRegAKMajorB, true, true, seed);
  }
}

TEST_F(WgmmaProbe, RegisterAAndNMajorBAsTheLayoutHeaderReadsIt) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE("kMnMajorKGroupsInLbo = " + std::to_string(detail::kMnMajorKGroupsInLbo) +
                 "; if only the other reading matches, flip it");
    check_case(WgmmaProbeCase::kRegAMnMajorB, detail::kMnMajorKGroupsInLbo, true, seed);
    check_case(WgmmaProbeCase::kRegAMnMajorB, !detail::kMnMajorKGroupsInLbo, false, seed);
  }
}

}  // namespace
}  // namespace pagedkv
