// CUDA paged extend attention against the CPU reference on fresh random inputs: both dtypes,
// head_dim 64/128/256, GQA groups 1..16, block sizes 1/16/64 (and odd ones), shuffled block
// tables, NaN-poisoned unused slots, every layout kind; plain causal prefill, a cached prefix
// ending mid-block, new tokens spanning several blocks, one new token (also against CUDA decode
// attention), sliding window, soft-cap, the log-sum-exp output, a device-side kv_append first,
// long prompts with many query tiles, strided q/out, CUDA-graph capture, a pool of more than 2^31
// elements, block ids outside the pool, GQA groups above 16, and device data that breaks the
// host-side rules (q_len > max_q_len, q_len > seq_len: clamped as documented, never a fault).
// Every output row (one query head of one new token) must be within a relative error
// ||out_row - ref_row|| / ||ref_row|| of 1e-2 (bf16) or 2e-3 (fp16) (testing::check_rows);
// outputs start NaN-poisoned, so an unwritten row fails.
//
// Every device test runs for each kernel variant (test names end in /Mma16, the default
// ExtendKernel::kMma16; /Fa2, ExtendKernel::kFa2 with the planner's split for the current device;
// /Fa2Split3, kFa2 forced to 3 splits over keys with its workspace, so the partial rows and the
// merge are checked on every shape, including tiles whose splits see no key; /Wgmma,
// ExtendKernel::kWgmma with the planner's split for the current device, which runs its sm_90a
// kernel at head_dim 128 on compute capability 9.0 and falls back to kFa2 elsewhere; /WgmmaSplit3,
// kWgmma forced to 3 splits, its partial rows through kFa2's merge; /WgmmaPipelined,
// ExtendKernel::kWgmmaPipelined with the planner's split, the same shapes and fallback;
// /WgmmaPipelinedSplit3, kWgmmaPipelined forced to 3 splits: on a GPU the planner splits small
// batches 16 ways (1 or 2 key tiles per split) and long ones not at all, so only forced splits
// give the pipelined kernel partial rows from splits long enough to wrap its 4-stage ring;
// /Fa2LeanSoftmax, ExtendKernel::kFa2LeanSoftmax (kFa2's kernel with the kWgmma kernels'
// softmax) with the planner's split;
// /WgmmaWarpSpecialized, ExtendKernel::kWgmmaWarpSpecialized with the planner's split;
// /WgmmaWarpSpecializedPingPong, kWgmmaWarpSpecializedPingPong likewise;
// /WgmmaWarpSpecializedPersistent, kWgmmaWarpSpecializedPersistent with the planner's splits (a
// test's forced splits replace them) and at most 3 CTAs, so that each CTA runs item after item
// through one ring (the planner's one CTA per SM would give most CTAs one item of these small
// problems), and its workspace, whose counter is poisoned before each launch (in a captured graph
// too): the launch must zero it).
//
// Without a GPU every device test skips; the host-side argument checks still run.
#include "pagedkv/cuda/extend_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "attention_dump.hpp"
#include "attention_fingerprint.hpp"
#include "cuda_attention_test_util.hpp"
#include "cuda_test_util.hpp"
#include "expect_error.hpp"
#include "internal/extend_fa2_layout.hpp"
#include "kv_test_util.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/decode_attention.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::ExtendShape;
using testing::LayoutKind;

// The per-row tolerance: 1e-2 (bf16), 2e-3 (fp16); the dump inspector checks with the same.
double tolerance(KVDtype dtype) {
  return testing::extend_row_tolerance(dtype);
}
// Absolute, on natural-log values of order 1..10: fp32 softmax sums of exactly the same inputs.
constexpr double kLseTolerance = 1e-3;

using testing::DeviceExtendProblem;

// The query-tile rows and key-tile length of the kernel the last launch ran (set by
// launch_extend), for the failure fingerprint: the sm_90a kernels 128 x 64, kFa2 its
// fa2_tile_rows x 32 (16 at head_dim 256), kMma16 64 x 64 (32 at head_dim 256).
struct TileGeometry {
  std::int32_t rows = testing::kFingerprintTileRows;
  std::int32_t keys = testing::kFingerprintKeyTile;
};
TileGeometry g_tiles;

// Every output row within the tolerance, and every log-sum-exp within kLseTolerance (both -inf
// for a row that sees no key).
::testing::AssertionResult check_outputs(const testing::HostExtendProblem& pb,
                                         const DeviceExtendProblem& dev, const ExtendReference& ref,
                                         bool check_lse = true) {
  const KVDtype dtype = pb.shape.cache.dtype;
  const auto out =
      testing::to_doubles(dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
  auto rows = testing::rows_match(out, ref.out, static_cast<std::size_t>(pb.shape.cache.head_dim),
                                  tolerance(dtype));
  if (!rows) {
    // Where the wrong rows sit (query-tile row, keys seen, head_dim columns, ...): enough to
    // reason about a failure after the GPU run (tests/util/attention_fingerprint.hpp).
    return rows << " [" << testing::describe(pb.shape) << "; rows are token x "
                << pb.shape.cache.num_q_heads << " + query head]\n"
                << testing::error_fingerprint(
                       out, ref.out, static_cast<std::size_t>(pb.shape.cache.head_dim),
                       tolerance(dtype), testing::extend_row_sites(pb, g_tiles.rows), g_tiles.rows,
                       g_tiles.keys);
  }
  if (!check_lse) return ::testing::AssertionSuccess();
  const auto lse = testing::download<float>(dev.lse.get(), ref.lse.size());
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const double got = lse[i];
    const bool both_empty = std::isinf(ref.lse[i]) && ref.lse[i] < 0 && got == ref.lse[i];
    if (!both_empty && !(std::abs(got - ref.lse[i]) <= kLseTolerance)) {
      return ::testing::AssertionFailure()
             << "lse[" << i << "] = " << got << ", reference " << ref.lse[i] << " ["
             << testing::describe(pb.shape) << "]";
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- the kernel variant under test (set by the fixture for each parameterized test) ----
enum class Variant {
  kMma16,
  kFa2,
  kFa2Split3,
  kWgmma,
  kWgmmaSplit3,
  kWgmmaPipelined,
  kWgmmaPipelinedSplit3,
  kWgmmaWarpSpecialized,
  kWgmmaWarpSpecializedPingPong,
  kWgmmaWarpSpecializedPersistent,
  kFa2LeanSoftmax
};
Variant g_variant = Variant::kMma16;
DeviceBuffer g_workspace;  // grown on demand; freed by the fixture

ExtendKernel kernel_of(Variant v) {
  switch (v) {
    case Variant::kMma16:
      return ExtendKernel::kMma16;
    case Variant::kFa2:
    case Variant::kFa2Split3:
      return ExtendKernel::kFa2;
    case Variant::kWgmma:
    case Variant::kWgmmaSplit3:
      return ExtendKernel::kWgmma;
    case Variant::kWgmmaPipelined:
    case Variant::kWgmmaPipelinedSplit3:
      return ExtendKernel::kWgmmaPipelined;
    case Variant::kWgmmaWarpSpecialized:
      return ExtendKernel::kWgmmaWarpSpecialized;
    case Variant::kWgmmaWarpSpecializedPingPong:
      return ExtendKernel::kWgmmaWarpSpecializedPingPong;
    case Variant::kWgmmaWarpSpecializedPersistent:
      return ExtendKernel::kWgmmaWarpSpecializedPersistent;
    case Variant::kFa2LeanSoftmax:
      return ExtendKernel::kFa2LeanSoftmax;
  }
  return ExtendKernel::kFa2;
}

// > 0: the plan of every variant that splits over keys (a test's own), else the variant's.
int g_forced_splits = 0;
// The most CTAs /WgmmaWarpSpecializedPersistent launches.
constexpr std::int32_t kPersistentTestCtas = 3;

ExtendSplitPlan plan_of(const PagedExtendParams& p) {
  ExtendSplitPlan plan;
  if (g_variant == Variant::kWgmmaWarpSpecializedPersistent) {
    testing::cuda_check(extend_split_plan_for_current_device(p, kernel_of(g_variant), &plan),
                        "extend_split_plan_for_current_device");
    if (g_forced_splits > 0) plan.num_splits = g_forced_splits;
    plan.persistent_ctas = std::min(plan.persistent_ctas, kPersistentTestCtas);
  } else if (g_forced_splits > 0) {
    plan.num_splits = g_forced_splits;
  } else if (g_variant == Variant::kFa2) {
    testing::cuda_check(extend_split_plan_for_current_device(p, ExtendKernel::kFa2, &plan),
                        "extend_split_plan_for_current_device");
  } else if (g_variant == Variant::kWgmma || g_variant == Variant::kWgmmaPipelined ||
             g_variant == Variant::kWgmmaWarpSpecialized ||
             g_variant == Variant::kWgmmaWarpSpecializedPingPong ||
             g_variant == Variant::kFa2LeanSoftmax) {
    testing::cuda_check(extend_split_plan_for_current_device(p, kernel_of(g_variant), &plan),
                        "extend_split_plan_for_current_device");
  } else if (g_variant == Variant::kFa2Split3 || g_variant == Variant::kWgmmaSplit3 ||
             g_variant == Variant::kWgmmaPipelinedSplit3) {
    plan.num_splits = 3;
  }
  return plan;
}

// Allocates the workspace the launch will need (outside a graph capture).
void reserve_workspace(const PagedExtendParams& p) {
  const std::size_t bytes = extend_workspace_bytes(p, plan_of(p));
  if (bytes > g_workspace.bytes()) g_workspace = DeviceBuffer(bytes);
}

// The tiles of the kernel that runs `p` for `kernel` (TileGeometry).
TileGeometry tiles_of(const PagedExtendParams& p, ExtendKernel kernel) {
  const bool wide = p.layout.head_dim == 256;
  if (kernel == ExtendKernel::kMma16) return {kCudaExtendTileRows, wide ? 32 : 64};
  if (kernel != ExtendKernel::kFa2 && kernel != ExtendKernel::kFa2LeanSoftmax &&
      extend_kernel_runs(p, kernel)) {
    return {testing::kFingerprintTileRows, testing::kFingerprintKeyTile};
  }
  return {detail::fa2_tile_rows(p.layout.head_dim, detail::fa2_warps(p.max_q_len, p.group_size())),
          wide ? 16 : 32};
}

// paged_extend_attention with the variant under test.
cudaError_t launch_extend(const PagedExtendParams& p, cudaStream_t stream) {
  g_tiles = tiles_of(p, kernel_of(g_variant));
  if (g_variant == Variant::kMma16) {
    return paged_extend_attention(p, stream, ExtendKernel::kMma16);
  }
  const ExtendSplitPlan plan = plan_of(p);
  reserve_workspace(p);
  if (plan.persistent_ctas > 0 && g_workspace.bytes() > 0) {
    // The counter poisoned: a launch that does not zero it first skips or repeats items.
    const cudaError_t err = cudaMemsetAsync(g_workspace.get(), 0x5a, 16, stream);
    if (err != cudaSuccess) return err;
  }
  return paged_extend_attention(p, stream, kernel_of(g_variant), plan, g_workspace.get(),
                                g_workspace.bytes());
}

// The dumps this process has written (PAGEDKV_TEST_DUMP_DIR; tests/util/attention_dump.hpp).
testing::DumpBudget g_dump_budget;

// Runs one case and checks it against the CPU reference. A failing case is dumped when the
// environment names a folder (its shape and seed regenerate it: extend_dump_inspect).
::testing::AssertionResult run_case(const ExtendShape& shape, std::uint64_t seed) {
  const auto pb = testing::make_extend_problem(shape, seed);
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  DeviceExtendProblem dev(pb);
  const PagedExtendParams params = dev.params(pb);
  testing::cuda_check(launch_extend(params, nullptr), "paged_extend_attention");
  testing::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  auto result = check_outputs(pb, dev, ref);
  if (!result) {
    testing::ExtendDump d;
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    d.test =
        info == nullptr ? "unknown" : std::string(info->test_suite_name()) + "." + info->name();
    const ExtendSplitPlan plan = g_variant == Variant::kMma16 ? ExtendSplitPlan{} : plan_of(params);
    d.plan = "kernel " + std::to_string(static_cast<int>(kernel_of(g_variant))) + ", splits " +
             std::to_string(plan.num_splits) + ", persistent CTAs " +
             std::to_string(plan.persistent_ctas);
    d.shape = shape;
    d.seed = seed;
    d.out = testing::download<std::uint16_t>(dev.out.get(), pb.q.size());
    d.lse = testing::download<float>(dev.lse.get(), ref.lse.size());
    const std::string what = testing::maybe_dump_extend(d, g_dump_budget);
    if (!what.empty()) result << "\n" << what;
  }
  return result;
}

void expect_case(const ExtendShape& shape, std::uint64_t seed) {
  EXPECT_TRUE(run_case(shape, seed));
}

class CudaExtendAttention : public testing::GpuTest, public ::testing::WithParamInterface<Variant> {
 protected:
  void SetUp() override {
    testing::GpuTest::SetUp();
    g_variant = GetParam();
  }
  void TearDown() override {
    g_workspace = DeviceBuffer();
    g_variant = Variant::kMma16;
    g_forced_splits = 0;
  }
};

std::string variant_name(const ::testing::TestParamInfo<Variant>& info) {
  switch (info.param) {
    case Variant::kMma16:
      return "Mma16";
    case Variant::kFa2:
      return "Fa2";
    case Variant::kFa2Split3:
      return "Fa2Split3";
    case Variant::kWgmma:
      return "Wgmma";
    case Variant::kWgmmaSplit3:
      return "WgmmaSplit3";
    case Variant::kWgmmaPipelined:
      return "WgmmaPipelined";
    case Variant::kWgmmaPipelinedSplit3:
      return "WgmmaPipelinedSplit3";
    case Variant::kWgmmaWarpSpecialized:
      return "WgmmaWarpSpecialized";
    case Variant::kWgmmaWarpSpecializedPingPong:
      return "WgmmaWarpSpecializedPingPong";
    case Variant::kWgmmaWarpSpecializedPersistent:
      return "WgmmaWarpSpecializedPersistent";
    case Variant::kFa2LeanSoftmax:
      return "Fa2LeanSoftmax";
  }
  return "Unknown";
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaExtendAttention,
                         ::testing::Values(Variant::kMma16, Variant::kFa2, Variant::kFa2Split3,
                                           Variant::kWgmma, Variant::kWgmmaSplit3,
                                           Variant::kWgmmaPipelined, Variant::kWgmmaPipelinedSplit3,
                                           Variant::kWgmmaWarpSpecialized,
                                           Variant::kWgmmaWarpSpecializedPingPong,
                                           Variant::kWgmmaWarpSpecializedPersistent,
                                           Variant::kFa2LeanSoftmax),
                         variant_name);

// Per case: a plain causal prefill, a prefix ending mid-block, new tokens spanning several blocks
// from a block boundary, and one new token after a long prefix, batched together (varlen).
TEST_P(CudaExtendAttention, MatchesReferenceOverDtypesDimsGroupsBlockSizes) {
  std::uint64_t seed = 1;
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    for (const std::int32_t head_dim : {64, 128, 256}) {
      for (const std::int32_t group : {1, 3, 8}) {
        for (const std::int32_t bs : {1, 16, 64}) {
          ExtendShape s = testing::make_extend_shape(
              dtype, head_dim, 2, group, bs, {0, 37, 2 * bs, 300}, {150, 90, 2 * bs + 5, 1});
          s.extra_max_q_len = 7;
          expect_case(s, seed++);
        }
      }
    }
  }
}

TEST_P(CudaExtendAttention, MatchesReferenceOnRandomShapesAndLayouts) {
  std::mt19937_64 rng(99);
  const auto pick = [&](std::initializer_list<std::int32_t> values) {
    std::uniform_int_distribution<std::size_t> d(0, values.size() - 1);
    return *(values.begin() + static_cast<std::ptrdiff_t>(d(rng)));
  };
  for (int i = 0; i < 80; ++i) {
    ExtendShape s;
    testing::DecodeShape& c = s.cache;
    c.dtype = pick({0, 1}) == 0 ? KVDtype::kFloat16 : KVDtype::kBFloat16;
    c.num_seqs = pick({1, 2, 5, 9});
    c.num_kv_heads = pick({1, 2, 4});
    c.num_q_heads = c.num_kv_heads * pick({1, 2, 4, 5, 8, 16});
    c.head_dim = pick({64, 128, 256});
    c.block_size = pick({1, 3, 16, 32, 64, 100, 256});
    c.kind = static_cast<LayoutKind>(pick({0, 1, 2, 3}));
    c.window_size = pick({0, 0, 0, 1, 33, 200});
    c.soft_cap = pick({0, 0, 1}) == 1 ? 5.0f : 0.0f;
    c.value_range = pick({1, 2}) == 2 ? 3.0f : 1.0f;
    c.shuffle_blocks = pick({0, 1, 1}) == 1;
    c.extra_table_columns = pick({0, 2});
    s.extra_max_q_len = pick({0, 64});
    std::uniform_int_distribution<std::int32_t> prefix(0, 700);
    std::uniform_int_distribution<std::int32_t> new_tokens(0, 300);
    for (std::int32_t j = 0; j < c.num_seqs; ++j) {
      const std::int32_t q_len = new_tokens(rng);
      s.q_lens.push_back(q_len);
      c.seq_lens.push_back(prefix(rng) + q_len);
    }
    expect_case(s, 5000 + static_cast<std::uint64_t>(i));
  }
}

// Head_dim 128 too: the only one the kWgmma kernels run (their soft-cap instantiations and
// windows whose first visible key is not a multiple of their 64-key tiles).
TEST_P(CudaExtendAttention, SlidingWindowAndSoftCap) {
  std::uint64_t seed = 70;
  for (const std::int32_t window : {1, 16, 17, 64, 65, 130, 5000}) {
    for (const float cap : {0.0f, 30.0f}) {
      for (const std::int32_t head_dim : {64, 128, 256}) {
        ExtendShape s = testing::make_extend_shape(KVDtype::kBFloat16, head_dim, 2, 4, 16,
                                                   {45, 0, 200}, {130, 200, 3});
        s.cache.window_size = window;
        s.cache.soft_cap = cap;
        s.cache.value_range = 3.0f;
        expect_case(s, seed++);
      }
    }
  }
}

// A zero or negative sm_scale (finite, so valid): uniform attention over the visible keys, or
// the keys weighed the other way round. The sm_90a kernels take the row maximum of unscaled
// scores and scale in the exponential, right only for a positive scale, so without soft-cap they
// fall back to kFa2 there (extend_kernel_runs false) and with soft-cap they run; every variant
// must match the reference either way, masked keys (causal, window) included.
TEST_P(CudaExtendAttention, ZeroAndNegativeScale) {
  std::uint64_t seed = 810;
  for (const float scale : {0.0f, -0.0f, -0.09f}) {
    for (const float cap : {0.0f, 20.0f}) {
      for (const std::int32_t window : {0, 40}) {
        ExtendShape s = testing::make_extend_shape(KVDtype::kBFloat16, 128, 2, 4, 16, {0, 70, 130},
                                                   {150, 9, 64});
        s.cache.soft_cap = cap;
        s.cache.window_size = window;
        auto pb = testing::make_extend_problem(s, seed++);
        pb.cache.sm_scale = scale;
        const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
        DeviceExtendProblem dev(pb);
        const PagedExtendParams params = dev.params(pb);
        ASSERT_EQ(params.sm_scale, scale);
        // On a device where the sm_90a kernels run (at a positive scale), they run here only
        // with soft-cap.
        PagedExtendParams positive = params;
        positive.sm_scale = 0.09f;
        if (g_variant != Variant::kMma16 && kernel_of(g_variant) != ExtendKernel::kFa2 &&
            extend_kernel_runs(positive, kernel_of(g_variant))) {
          EXPECT_EQ(extend_kernel_runs(params, kernel_of(g_variant)), cap > 0.0f)
              << "scale " << scale << ", cap " << cap;
        }
        testing::cuda_check(launch_extend(params, nullptr), "paged_extend_attention");
        testing::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        EXPECT_TRUE(check_outputs(pb, dev, ref))
            << "scale " << scale << ", cap " << cap << ", window " << window;
      }
    }
  }
}

// Long prompts: many query tiles per sequence (scheduled heaviest first), GQA 8, 0-50% cached.
TEST_P(CudaExtendAttention, LongPromptsWithCachedPrefixes) {
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    ExtendShape s =
        testing::make_extend_shape(dtype, 128, 2, 8, 16, {0, 1000, 777}, {2048, 1048, 1});
    expect_case(s, 123);
  }
}

// Every key-tile count of a CTA around the kWgmma kernels' rings (64-key tiles; 3 stages for
// kWgmma, 4 for kWgmmaPipelined, whose 4th is used from 4 tiles on and which wraps from 5): one
// 32-row query tile per sequence seeing 1 .. 9 and 17 key tiles, at head_dim 128 (where the sm_90a
// kernels run), with the variant's plan and without a split (on a GPU the planner splits so few
// CTAs 16 ways, 1 or 2 key tiles each). Small enough for racecheck and synccheck (gpu-check).
TEST_P(CudaExtendAttention, KeyTileCountsAroundTheRing) {
  std::uint64_t seed = 900;
  for (const int forced : {0, 1}) {
    g_forced_splits = forced;
    for (const KVDtype dtype : {KVDtype::kBFloat16, KVDtype::kFloat16}) {
      ExtendShape s = testing::make_extend_shape(dtype, 128, 1, 4, 16,
                                                 {0, 64, 128, 192, 256, 320, 384, 448, 512, 1024},
                                                 std::vector<std::int32_t>(10, 8));
      expect_case(s, seed++);
    }
  }
  g_forced_splits = 0;
}

// One new token per sequence: extend equals decode attention of that token, CUDA against CUDA.
TEST_P(CudaExtendAttention, OneNewTokenAgreesWithCudaDecode) {
  std::uint64_t seed = 300;
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    for (const std::int32_t head_dim : {64, 128, 256}) {
      ExtendShape s =
          testing::make_extend_shape(dtype, head_dim, 2, 4, 16, {0, 17, 64, 1300}, {1, 1, 1, 1});
      s.cache.window_size = head_dim == 128 ? 100 : 0;
      const auto pb = testing::make_extend_problem(s, seed++);
      DeviceExtendProblem dev(pb);
      PAGEDKV_CUDA_CHECK(launch_extend(dev.params(pb), nullptr));
      const DeviceBuffer decode_out(pb.q.size() * sizeof(std::uint16_t));
      PagedDecodeParams d = pb.cache.params(decode_out.get());
      d.q = dev.q.get();
      d.k_cache = dev.k.get();
      d.v_cache = dev.v_plane(pb);
      d.block_table = dev.table.get<std::int32_t>();
      d.seq_lens = dev.lens.get<std::int32_t>();
      PAGEDKV_CUDA_CHECK(paged_decode_attention(d, DecodePlan{}, nullptr, 0, nullptr));
      const auto extend_out =
          testing::to_doubles(dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
      const auto decode = testing::to_doubles(
          dtype, testing::download<std::uint16_t>(decode_out.get(), pb.q.size()));
      EXPECT_TRUE(testing::rows_match(extend_out, decode, static_cast<std::size_t>(head_dim),
                                      tolerance(dtype)))
          << "extend vs decode: " << testing::describe(s);
      const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
      EXPECT_TRUE(testing::rows_match(extend_out, ref.out, static_cast<std::size_t>(head_dim),
                                      tolerance(dtype)))
          << testing::describe(s);
    }
  }
}

// The engine's order of operations on the device: kv_append the new tokens into their (NaN)
// slots, then extend attention; without the append the new slots would poison every row.
TEST_P(CudaExtendAttention, AfterDeviceKvAppend) {
  ExtendShape s =
      testing::make_extend_shape(KVDtype::kBFloat16, 128, 2, 4, 16, {21, 0, 64}, {40, 33, 17});
  auto pb = testing::make_extend_problem(s, 41, /*append=*/false);
  DeviceExtendProblem dev(pb);
  const DeviceBuffer new_k = testing::upload(pb.new_k);
  const DeviceBuffer new_v = testing::upload(pb.new_v);
  const DeviceBuffer slots = testing::upload(pb.slot_mapping);
  KVAppendParams a = pb.append_params(dev.k.get(), dev.v_plane(pb));
  a.key = new_k.get();
  a.value = new_v.get();
  a.slot_mapping = slots.get<std::int64_t>();
  PAGEDKV_CUDA_CHECK(kv_append(a, nullptr));
  PAGEDKV_CUDA_CHECK(launch_extend(dev.params(pb), nullptr));
  reference_kv_append(pb.append_params());  // the host copy catches up
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  EXPECT_TRUE(check_outputs(pb, dev, ref));
}

TEST_P(CudaExtendAttention, EmptySequencesAndNoLse) {
  ExtendShape s =
      testing::make_extend_shape(KVDtype::kFloat16, 64, 2, 2, 16, {10, 0, 33, 0}, {0, 0, 70, 5});
  const auto pb = testing::make_extend_problem(s, 19);
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  DeviceExtendProblem dev(pb);
  PAGEDKV_CUDA_CHECK(cudaMemset(dev.lse.get(), 0x7f, dev.lse.bytes()));
  PAGEDKV_CUDA_CHECK(launch_extend(dev.params(pb, /*with_lse=*/false), nullptr));
  const auto out = testing::to_doubles(
      s.cache.dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
  EXPECT_TRUE(testing::rows_match(out, ref.out, 64, tolerance(s.cache.dtype)));
  for (const std::uint32_t bits :
       testing::download<std::uint32_t>(dev.lse.get(), dev.lse.bytes() / 4)) {
    ASSERT_EQ(bits, 0x7f7f7f7fu);  // untouched
  }
  // An empty batch and a batch of empty sequences launch nothing.
  PagedExtendParams p = dev.params(pb);
  p.num_seqs = 0;
  PAGEDKV_CUDA_CHECK(launch_extend(p, nullptr));
  p = dev.params(pb);
  p.max_q_len = 0;
  PAGEDKV_CUDA_CHECK(launch_extend(p, nullptr));
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_P(CudaExtendAttention, StridedQueryAndOutput) {
  ExtendShape s = testing::make_extend_shape(KVDtype::kFloat16, 64, 2, 4, 16, {100, 0}, {17, 40});
  const auto pb = testing::make_extend_problem(s, 8);
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  const int tokens = pb.num_q_tokens();
  // q lives inside a fused qkv-like buffer: heads 72 apart, tokens 1024 apart.
  std::vector<std::uint16_t> q_strided(static_cast<std::size_t>(tokens) * 1024,
                                       testing::nan_bits(s.cache.dtype));
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < 8; ++h) {
      for (int d = 0; d < 64; ++d) {
        q_strided[static_cast<std::size_t>(t * 1024 + h * 72 + d)] =
            pb.q[static_cast<std::size_t>((t * 8 + h) * 64 + d)];
      }
    }
  }
  DeviceExtendProblem dev(pb);
  const DeviceBuffer q = testing::upload(q_strided);
  const DeviceBuffer out(static_cast<std::size_t>(tokens) * 800 * sizeof(std::uint16_t));
  PAGEDKV_CUDA_CHECK(cudaMemset(out.get(), 0x5a, out.bytes()));  // a pattern, not zeros
  PagedExtendParams p = dev.params(pb);
  p.q = q.get();
  p.q_stride_token = 1024;
  p.q_stride_head = 72;
  p.out = out.get();
  p.out_stride_token = 800;
  p.out_stride_head = 96;
  PAGEDKV_CUDA_CHECK(launch_extend(p, nullptr));
  const auto got =
      testing::download<std::uint16_t>(out.get(), static_cast<std::size_t>(tokens) * 800);
  std::vector<double> dense(ref.out.size());
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < 8; ++h) {
      for (int d = 0; d < 64; ++d) {
        dense[static_cast<std::size_t>((t * 8 + h) * 64 + d)] =
            fp16_bits_to_float(got[static_cast<std::size_t>(t * 800 + h * 96 + d)]);
      }
    }
  }
  EXPECT_TRUE(testing::rows_match(dense, ref.out, 64, tolerance(s.cache.dtype)));
  EXPECT_EQ(got[64], 0x5a5a);  // the gap after head 0 is untouched
}

// A captured graph replays correctly when the batch's data (lengths, offsets) change on the
// device within the captured max_q_len.
TEST_P(CudaExtendAttention, GraphCaptureAndReplay) {
  ExtendShape s =
      testing::make_extend_shape(KVDtype::kBFloat16, 128, 2, 4, 16, {300, 0}, {200, 260});
  s.extra_max_q_len = 40;
  auto pb = testing::make_extend_problem(s, 31);
  DeviceExtendProblem dev(pb);
  cudaStream_t stream = nullptr;
  PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  reserve_workspace(dev.params(pb));
  PAGEDKV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launched = launch_extend(dev.params(pb), stream);
  PAGEDKV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  PAGEDKV_CUDA_CHECK(launched);
  PAGEDKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    if (replay == 1) {
      // Fewer new tokens over longer prefixes, same pool: the same q rows re-split.
      pb.q_indptr = {0, 230, 460};
      pb.shape.q_lens = {230, 230};
      PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(dev.q_indptr.get(), pb.q_indptr.data(), 12,
                                         cudaMemcpyHostToDevice, stream));
    }
    PAGEDKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
    EXPECT_TRUE(check_outputs(pb, dev, ref)) << "replay " << replay;
  }
  PAGEDKV_CUDA_CHECK(cudaGraphExecDestroy(exec));
  PAGEDKV_CUDA_CHECK(cudaGraphDestroy(graph));
  PAGEDKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// GQA groups above 16 (the decode kernel's limit): a query tile of 64 packed rows then holds
// fewer than 4 tokens, or part of one token's heads.
TEST_P(CudaExtendAttention, GqaGroupsAbove16) {
  std::uint64_t seed = 600;
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    for (const std::int32_t head_dim : {64, 128, 256}) {
      for (const std::int32_t group : {17, 24, 32, 64}) {
        const std::int32_t kv_heads = group == 64 ? 1 : 2;
        ExtendShape s = testing::make_extend_shape(dtype, head_dim, kv_heads, group, 16,
                                                   {0, 37, 100}, {70, 20, 1});
        expect_case(s, seed++);
      }
    }
  }
}

// More than 2^31 elements per plane: the sequences' blocks sit at the top of a 4.3 GB pool, so
// every K/V offset needs 64 bits.
TEST_P(CudaExtendAttention, PoolLargerThan2To31Elements) {
  ExtendShape s =
      testing::make_extend_shape(KVDtype::kBFloat16, 128, 8, 4, 16, {700, 0, 33}, {200, 333, 64});
  const auto pb = testing::make_extend_problem(s, 22);
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  const KVLayout& small = pb.cache.layout;
  // Every host block lands at or above element 2^31 (the lowest one too).
  const std::int64_t big_blocks =
      (std::int64_t{1} << 31) / small.block_elements() + 1 + small.num_blocks;
  const KVLayout big = KVLayout::nhd(big_blocks, 16, 8, 128);
  ASSERT_GT(big.plane_elements(), std::int64_t{1} << 31);
  const std::int64_t shift = big_blocks - small.num_blocks;  // host block b -> b + shift
  const std::size_t plane_bytes = static_cast<std::size_t>(big.plane_elements()) * 2;
  size_t free_bytes = 0, total_bytes = 0;
  PAGEDKV_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < 2 * plane_bytes + (std::size_t{1} << 30)) {
    PAGEDKV_GPU_SKIP("needs " << 2 * plane_bytes / (1 << 20) << " MiB of free device memory");
  }
  DeviceBuffer k(plane_bytes);  // NaN (0xFFFF) everywhere the blocks below do not land
  DeviceBuffer v(plane_bytes);
  const std::size_t block_bytes = static_cast<std::size_t>(small.block_elements()) * 2;
  for (std::int64_t b = 0; b < small.num_blocks; ++b) {
    const std::size_t at = static_cast<std::size_t>(b + shift) * block_bytes;
    PAGEDKV_CUDA_CHECK(cudaMemcpy(k.get<unsigned char>() + at,
                                  pb.cache.k_buffer.data() + b * small.block_elements(),
                                  block_bytes, cudaMemcpyHostToDevice));
    PAGEDKV_CUDA_CHECK(cudaMemcpy(v.get<unsigned char>() + at,
                                  pb.cache.v_buffer.data() + b * small.block_elements(),
                                  block_bytes, cudaMemcpyHostToDevice));
  }
  std::vector<std::int32_t> table = pb.cache.table.block_ids;
  for (auto& id : table) {
    id = static_cast<std::int32_t>(id + shift);
    ASSERT_GE(big.offset(id, 0, 0), std::int64_t{1} << 31);
  }
  DeviceExtendProblem dev(pb);
  const DeviceBuffer table_dev = testing::upload(table);
  PagedExtendParams p = dev.params(pb);
  p.k_cache = k.get();
  p.v_cache = v.get();
  p.layout = big;
  p.block_table = table_dev.get<std::int32_t>();
  PAGEDKV_CUDA_CHECK(launch_extend(p, nullptr));
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(check_outputs(pb, dev, ref));
}

// A block id outside the pool (past its end, or negative) is never followed: its keys and values
// read as zeros, exactly as if the table named an all-zero block. The other sequences are exact.
// Run under compute-sanitizer memcheck by scripts/gpu-check.
TEST_P(CudaExtendAttention, BlockIdsOutsideThePoolReadZeros) {
  for (const std::int32_t bad_id : {1 << 20, -5}) {
    ExtendShape s =
        testing::make_extend_shape(KVDtype::kBFloat16, 128, 2, 4, 16, {40, 100, 0}, {9, 30, 50});
    s.cache.shuffle_blocks = false;
    auto pb = testing::make_extend_problem(s, 23);
    DeviceExtendProblem dev(pb);
    // Device: sequence 1's third block (inside its cached prefix) is out of the pool.
    const std::size_t cell = static_cast<std::size_t>(pb.cache.table.max_blocks_per_seq) + 2;
    std::vector<std::int32_t> table = pb.cache.table.block_ids;
    table[cell] = bad_id;
    const DeviceBuffer table_dev = testing::upload(table);
    PagedExtendParams p = dev.params(pb);
    p.block_table = table_dev.get<std::int32_t>();
    PAGEDKV_CUDA_CHECK(launch_extend(p, nullptr));
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    // Host reference: the same cell names a spare block filled with zeros.
    std::vector<bool> used(static_cast<std::size_t>(pb.cache.layout.num_blocks), false);
    for (const auto& blocks : pb.cache.seq_blocks) {
      for (const std::int32_t b : blocks) used[static_cast<std::size_t>(b)] = true;
    }
    used[static_cast<std::size_t>(pb.cache.poison_block)] = true;
    const auto spare = std::find(used.begin(), used.end(), false);
    ASSERT_NE(spare, used.end());
    const auto zero_block = static_cast<std::int32_t>(spare - used.begin());
    for (std::int64_t t = 0; t < s.cache.block_size; ++t) {
      for (std::int64_t h = 0; h < s.cache.num_kv_heads; ++h) {
        for (std::int64_t d = 0; d < s.cache.head_dim; ++d) {
          pb.cache.k_buffer[static_cast<std::size_t>(
              pb.cache.addressing.offset(false, zero_block, t, h, d))] = 0;
          pb.cache.v_buffer[static_cast<std::size_t>(
              pb.cache.addressing.offset(true, zero_block, t, h, d))] = 0;
        }
      }
    }
    pb.cache.table.block_ids[cell] = zero_block;
    const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
    EXPECT_TRUE(check_outputs(pb, dev, ref)) << "bad id " << bad_id;
  }
}

// q_len > max_q_len in device data (validate_extend_metadata rejects it on the host): the kernel
// clamps q_len to max_q_len, so the rows past it stay untouched and nothing faults; the other
// sequences are exact.
TEST_P(CudaExtendAttention, DeviceQLenAboveMaxQLenLeavesTheRestUntouched) {
  ExtendShape s = testing::make_extend_shape(KVDtype::kFloat16, 64, 2, 4, 16, {30, 0}, {12, 40});
  const auto pb = testing::make_extend_problem(s, 24);
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  EXPECT_THROW(
      validate_extend_metadata(pb.q_indptr, 20, pb.shape.cache.seq_lens, pb.cache.table.block_ids,
                               pb.cache.table.max_blocks_per_seq, 16, pb.cache.layout.num_blocks),
      Error);
  DeviceExtendProblem dev(pb);
  PagedExtendParams p = dev.params(pb);
  p.max_q_len = 20;  // sequence 1 has 40 new tokens
  PAGEDKV_CUDA_CHECK(launch_extend(p, nullptr));
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  const std::size_t row = 8 * 64;  // one token's heads
  const auto out = testing::download<std::uint16_t>(dev.out.get(), pb.q.size());
  const auto got = testing::to_doubles(s.cache.dtype, out);
  // Sequence 0 (12 tokens, within max_q_len) is exact.
  EXPECT_TRUE(testing::rows_match(std::span<const double>(got).subspan(0, 12 * row),
                                  std::span<const double>(ref.out).subspan(0, 12 * row), 64,
                                  tolerance(s.cache.dtype)));
  // Sequence 1: tokens 0..19 written (finite), tokens 20..39 untouched (still the NaN pattern).
  for (std::size_t i = 12 * row; i < 32 * row; ++i) ASSERT_TRUE(std::isfinite(got[i])) << i;
  for (std::size_t i = 32 * row; i < 52 * row; ++i) ASSERT_EQ(out[i], 0xffff) << i;
}

// q_len > seq_len in device data (validate_extend_metadata rejects it on the host): the tokens
// that would sit before position 0 get zero rows and lse -inf; token j >= q_len - seq_len sits
// at position j - (q_len - seq_len) and attends like a prefill of seq_len tokens.
TEST_P(CudaExtendAttention, DeviceQLenAboveSeqLenGivesZeroRows) {
  ExtendShape s = testing::make_extend_shape(KVDtype::kBFloat16, 128, 2, 4, 16, {0}, {8});
  const auto pb = testing::make_extend_problem(s, 25);
  const std::vector<std::int32_t> short_lens = {5};
  EXPECT_THROW(
      validate_extend_metadata(pb.q_indptr, pb.max_q_len, short_lens, pb.cache.table.block_ids,
                               pb.cache.table.max_blocks_per_seq, 16, pb.cache.layout.num_blocks),
      Error);
  DeviceExtendProblem dev(pb);
  const DeviceBuffer lens = testing::upload(short_lens);
  PagedExtendParams p = dev.params(pb);
  p.seq_lens = lens.get<std::int32_t>();
  PAGEDKV_CUDA_CHECK(launch_extend(p, nullptr));
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  // Expected: tokens 3..7 as the 5 new tokens of a 5-token prefill (their q rows, same pool).
  PagedExtendParams e = pb.params(nullptr);
  const std::vector<std::int32_t> indptr = {0, 5};
  e.q = pb.q.data() + 3 * 8 * 128;
  e.q_indptr = indptr.data();
  e.max_q_len = 5;
  e.seq_lens = short_lens.data();
  const auto expected = reference_paged_extend_attention_f64(e);
  const std::size_t row = 8 * 128;
  const auto got = testing::to_doubles(
      s.cache.dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
  const auto lse = testing::download<float>(dev.lse.get(), 8 * 8);
  for (std::size_t i = 0; i < 3 * row; ++i) ASSERT_EQ(got[i], 0.0) << i;
  for (std::size_t i = 0; i < 3 * 8; ++i) ASSERT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << i;
  EXPECT_TRUE(testing::rows_match(std::span<const double>(got).subspan(3 * row), expected.out, 128,
                                  tolerance(s.cache.dtype)));
  for (std::size_t i = 0; i < 5 * 8; ++i) {
    EXPECT_NEAR(lse[3 * 8 + i], expected.lse[i], kLseTolerance) << i;
  }
}

// ---- host-side argument checks: no device needed ----

template <typename Fn>
void expect_error(Fn&& fn, const std::string& fragment) {
  testing::expect_error(fn, ErrorCode::kInvalidArgument, fragment);
}

// The host-side argument tests' batch: 2 sequences (40 cached + 8 new tokens, 50 new), bf16,
// head_dim 128, 2 KV heads x group 4, block 16; its out / lse are host arrays (nothing launches).
struct ArgumentsProblem {
  testing::HostExtendProblem pb = testing::make_extend_problem(
      testing::make_extend_shape(KVDtype::kBFloat16, 128, 2, 4, 16, {40, 0}, {8, 50}), 1);

  PagedExtendParams params(bool with_lse = true) const {
    alignas(16) static std::uint16_t out[58 * 8 * 128];
    alignas(16) static float lse[58 * 8 + 1];
    return pb.params(out, with_lse ? lse : nullptr);
  }
};

TEST(CudaExtendAttentionArguments, RejectedOnTheHostBeforeAnyLaunch) {
  const ArgumentsProblem args;
  const PagedExtendParams good = args.params();
  EXPECT_NO_THROW(validate_cuda_extend(good));

  PagedExtendParams p = good;
  p.q = static_cast<const std::uint16_t*>(good.q) + 1;
  expect_error([&] { validate_cuda_extend(p); }, "16-byte aligned");
  p = good;
  p.out = static_cast<std::uint16_t*>(good.out) + 4;
  expect_error([&] { validate_cuda_extend(p); }, "16-byte aligned");
  p = good;
  p.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(good.lse) + 2);
  expect_error([&] { validate_cuda_extend(p); }, "lse must be 4-byte aligned");
  p = good;
  p.out_stride_head = 132;  // rows fit (7 x 132 + 128 <= 1200) but are not 16-byte aligned
  p.out_stride_token = 1200;
  expect_error([&] { validate_cuda_extend(p); }, "multiples of 8");
  p = good;
  p.out = nullptr;
  expect_error([&] { validate_cuda_extend(p); }, "out is null");
  p = good;
  p.layout = KVLayout::nhd(good.layout.num_blocks, 16, 2, 96);
  expect_error([&] { validate_cuda_extend(p); }, "head_dim must be 64, 128 or 256");
  p = good;
  p.num_seqs = 70000;
  expect_error([&] { validate_cuda_extend(p); }, "sequences per launch");
  p = good;
  p.max_q_len = 1 << 20;  // x group 4 / 64 rows per tile = 65536 tiles
  expect_error([&] { validate_cuda_extend(p); }, "query rows exceed");
  p = good;
  p.window_size = -1;  // the shared validate() runs too
  expect_error([&] { validate_cuda_extend(p); }, "window_size");
  // The launch entry point checks before touching the device.
  p = good;
  p.q_stride_token = 1028;
  expect_error([&] { (void)paged_extend_attention(p, nullptr); }, "multiples of 8");
}

// extend_workspace_bytes with a split over keys (host only): num_seqs x max_q_len x num_q_heads x
// num_splits states whose four factors can pass 64 bits (the grid limits bound num_seqs and
// max_q_len, not num_q_heads). A size that wrapped to a small number would pass the launch's
// workspace check and the kernel would write past the workspace.
TEST(CudaExtendAttentionArguments, WorkspaceSizeOverflowIsAnError) {
  const ArgumentsProblem args;
  PagedExtendParams p = args.params();
  ExtendSplitPlan plan;
  plan.num_splits = 16;
  const std::size_t states = std::size_t{2} * 50 * 8 * 16;  // the problem's 2 x 50 x 8 heads
  EXPECT_EQ(extend_workspace_bytes(p, plan), states * 128 * 4 + (states * 4 + 15) / 16 * 16);
  p.num_seqs = 65535;
  p.max_q_len = 1 << 20;
  p.num_q_heads = 1 << 24;  // 2^64 states
  expect_error([&] { (void)extend_workspace_bytes(p, plan); }, "workspace size overflows");
  p.num_q_heads = 1 << 20;  // 2^60 states: 2^69 bytes
  expect_error([&] { (void)extend_workspace_bytes(p, plan); }, "workspace size overflows");
  p.num_q_heads = -8;
  expect_error([&] { (void)extend_workspace_bytes(p, plan); }, "bad shape");
  plan.num_splits = 1;  // no split: no workspace, whatever the shape
  EXPECT_EQ(extend_workspace_bytes(p, plan), 0u);
}

// The variant selector's own checks and the split planner (host only).
TEST(CudaExtendAttentionArguments, VariantSplitPlanAndWorkspaceChecks) {
  const ArgumentsProblem args;
  const PagedExtendParams good = args.params();
  EXPECT_TRUE(extend_kernel_runs(good, ExtendKernel::kMma16));
  EXPECT_TRUE(extend_kernel_runs(good, ExtendKernel::kFa2));
  EXPECT_FALSE(extend_kernel_runs(good, static_cast<ExtendKernel>(9)));
  // kFa2LeanSoftmax: its softmax for a 16-bit cache with a positive sm_scale or a soft-cap; with
  // neither (sm_scale 0 or negative, no cap) kFa2's runs.
  EXPECT_EQ(static_cast<int>(ExtendKernel::kFa2LeanSoftmax), 8);
  EXPECT_TRUE(extend_kernel_runs(good, ExtendKernel::kFa2LeanSoftmax));
  for (const float scale : {0.0f, -0.5f}) {
    PagedExtendParams flat = good;
    flat.sm_scale = scale;
    flat.logits_soft_cap = 0.0f;
    EXPECT_FALSE(extend_kernel_runs(flat, ExtendKernel::kFa2LeanSoftmax)) << scale;
    flat.logits_soft_cap = 30.0f;
    EXPECT_TRUE(extend_kernel_runs(flat, ExtendKernel::kFa2LeanSoftmax)) << scale;
  }
  // Its plan is kFa2's (the same kernel, tiles and workspace), for every batch and GPU size.
  for (const auto& [sms, per_sm] : {std::pair{132, 2}, std::pair{4, 1}, std::pair{3, 2}}) {
    EXPECT_EQ(plan_extend_split(good, ExtendKernel::kFa2LeanSoftmax, sms, per_sm).num_splits,
              plan_extend_split(good, ExtendKernel::kFa2, sms, per_sm).num_splits);
  }
  // kWgmma: its kernel only at head_dim 128 on a device of compute capability 9.0 (in a build
  // with sm_90a code); never for another head_dim.
  bool cc90 = false;
  if (cuda_device_count() > 0) {
    int dev = 0;
    cudaDeviceProp prop{};
    testing::cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    testing::cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    cc90 = prop.major == 9 && prop.minor == 0;
  }
  EXPECT_EQ(extend_kernel_runs(good, ExtendKernel::kWgmma), cc90 && PAGEDKV_TEST_HAS_SM90A != 0);
  EXPECT_EQ(extend_kernel_runs(good, ExtendKernel::kWgmmaPipelined),
            cc90 && PAGEDKV_TEST_HAS_SM90A != 0);
  EXPECT_EQ(extend_kernel_runs(good, ExtendKernel::kWgmmaWarpSpecialized),
            cc90 && PAGEDKV_TEST_HAS_SM90A != 0);
  EXPECT_EQ(extend_kernel_runs(good, ExtendKernel::kWgmmaWarpSpecializedPingPong),
            cc90 && PAGEDKV_TEST_HAS_SM90A != 0);
  EXPECT_EQ(extend_kernel_runs(good, ExtendKernel::kWgmmaWarpSpecializedPersistent),
            cc90 && PAGEDKV_TEST_HAS_SM90A != 0);
  PagedExtendParams dim64 = good;
  dim64.layout.head_dim = 64;
  EXPECT_FALSE(extend_kernel_runs(dim64, ExtendKernel::kWgmma));
  EXPECT_FALSE(extend_kernel_runs(dim64, ExtendKernel::kWgmmaPipelined));
  EXPECT_FALSE(extend_kernel_runs(dim64, ExtendKernel::kWgmmaWarpSpecialized));
  EXPECT_FALSE(extend_kernel_runs(dim64, ExtendKernel::kWgmmaWarpSpecializedPingPong));
  EXPECT_FALSE(extend_kernel_runs(dim64, ExtendKernel::kWgmmaWarpSpecializedPersistent));
  // kWgmma splits as kFa2, over its own 128-row query tiles: at head_dim 256 kFa2's tiles are 64
  // rows (16 per warp), so 200 rows are 4 tiles for kFa2 (16 CTAs) and 2 for kWgmma (8 CTAs).
  EXPECT_EQ(plan_extend_split(good, ExtendKernel::kWgmma, 132, 2).num_splits, kCudaExtendMaxSplits);
  EXPECT_EQ(plan_extend_split(good, ExtendKernel::kWgmma, 4, 1).num_splits, 1);  // 8 CTAs fill 8
  PagedExtendParams dim256 = good;
  dim256.layout.head_dim = 256;
  EXPECT_EQ(plan_extend_split(dim256, ExtendKernel::kFa2, 3, 2).num_splits, 1);    // 16 >= 12
  EXPECT_EQ(plan_extend_split(dim256, ExtendKernel::kWgmma, 3, 2).num_splits, 2);  // 8 -> 12
  EXPECT_EQ(plan_extend_split(dim256, ExtendKernel::kWgmmaPipelined, 3, 2).num_splits, 2);
  EXPECT_EQ(plan_extend_split(dim256, ExtendKernel::kWgmmaWarpSpecialized, 3, 2).num_splits, 2);
  EXPECT_EQ(plan_extend_split(dim256, ExtendKernel::kWgmmaWarpSpecializedPingPong, 3, 2).num_splits,
            2);
  EXPECT_EQ(
      plan_extend_split(dim256, ExtendKernel::kWgmmaWarpSpecializedPersistent, 3, 2).num_splits, 2);
  // Whatever the planner returns, paged_extend_attention takes it for the same variant: its grid
  // check counts kFa2's query tiles (what the kWgmma variants fall back to), which at head_dim 256
  // are twice kWgmma's. 160,000 tokens x group 4 = 10,000 kFa2 tiles, 5,000 kWgmma tiles; on a
  // large enough (hypothetical) GPU kWgmma's tiles alone would allow 13 splits, kFa2's only 6.
  // With no workspace the only complaint left must be the workspace's.
  for (const std::int32_t head_dim : {64, 128, 256}) {
    PagedExtendParams big = good;
    big.layout = KVLayout::nhd(good.layout.num_blocks, 16, 2, head_dim);
    big.max_q_len = 160000;
    for (const ExtendKernel k :
         {ExtendKernel::kFa2, ExtendKernel::kFa2LeanSoftmax, ExtendKernel::kWgmma,
          ExtendKernel::kWgmmaPipelined, ExtendKernel::kWgmmaWarpSpecialized,
          ExtendKernel::kWgmmaWarpSpecializedPingPong,
          ExtendKernel::kWgmmaWarpSpecializedPersistent}) {
      const ExtendSplitPlan wide = plan_extend_split(big, k, 100000, 1);
      EXPECT_GT(wide.num_splits, 1) << "head_dim " << head_dim;
      expect_error([&] { (void)paged_extend_attention(big, nullptr, k, wide, nullptr, 0); },
                   "workspace");
    }
  }
  // The default since the H200 run of 2026-12-04, evening (bench/results/gpu.md).
  EXPECT_EQ(kDefaultExtendKernel, ExtendKernel::kFa2);

  // Planner: 2 sequences x 2 KV heads x 1 query tile (max_q_len 50 x group 4 = 200 rows -> 2
  // tiles of 128) on 132 SMs x 2 CTAs -> splits to fill two waves, capped at 16.
  EXPECT_EQ(plan_extend_split(good, ExtendKernel::kMma16, 132, 2).num_splits, 1);
  EXPECT_EQ(plan_extend_split(good, ExtendKernel::kFa2, 132, 2).num_splits, kCudaExtendMaxSplits);
  EXPECT_EQ(plan_extend_split(good, ExtendKernel::kFa2, 2, 1).num_splits, 1);  // 8 CTAs fill 4
  expect_error([&] { (void)plan_extend_split(good, ExtendKernel::kFa2, 0, 1); }, "num_sms");
  // The shape it reads is checked as the launch checks it: query tiles x sequences x KV heads
  // then fit 64 bits.
  PagedExtendParams hostile = good;
  hostile.num_seqs = 70000;
  expect_error([&] { (void)plan_extend_split(hostile, ExtendKernel::kFa2, 132, 2); },
               "sequences per launch");
  hostile = good;
  hostile.max_q_len = 1 << 20;
  expect_error([&] { (void)plan_extend_split(hostile, ExtendKernel::kFa2, 132, 2); },
               "query rows exceed");
  hostile = good;
  hostile.num_q_heads = 7;  // not a multiple of the 2 KV heads
  expect_error([&] { (void)plan_extend_split(hostile, ExtendKernel::kFa2, 132, 2); }, "bad shape");
  hostile = good;
  hostile.max_q_len = -1;
  expect_error([&] { (void)plan_extend_split(hostile, ExtendKernel::kFa2, 132, 2); }, "bad shape");

  ExtendSplitPlan plan;
  plan.num_splits = 4;
  const std::size_t need = extend_workspace_bytes(good, plan);
  EXPECT_EQ(need, 2u * 50 * 8 * 4 * (128 * 4 + 4));
  EXPECT_EQ(extend_workspace_bytes(good, ExtendSplitPlan{}), 0u);
  expect_error(
      [&] { (void)paged_extend_attention(good, nullptr, ExtendKernel::kFa2, plan, nullptr, 0); },
      "workspace");
  alignas(16) static unsigned char small[64];
  expect_error(
      [&] { (void)paged_extend_attention(good, nullptr, ExtendKernel::kFa2, plan, small, 64); },
      "workspace");
  plan.num_splits = 0;
  expect_error([&] { (void)paged_extend_attention(good, nullptr, ExtendKernel::kFa2, plan); },
               "num_splits");
  plan.num_splits = kCudaExtendMaxSplits + 1;
  expect_error([&] { (void)paged_extend_attention(good, nullptr, ExtendKernel::kFa2, plan); },
               "num_splits");
  expect_error([&] { (void)paged_extend_attention(good, nullptr, static_cast<ExtendKernel>(-1)); },
               "unknown ExtendKernel");
  // kWgmma checks the plan and workspace as kFa2 does, whether its kernel or the fallback runs.
  expect_error([&] { (void)paged_extend_attention(good, nullptr, ExtendKernel::kWgmma, plan); },
               "num_splits");
  plan.num_splits = 4;
  expect_error(
      [&] { (void)paged_extend_attention(good, nullptr, ExtendKernel::kWgmma, plan, nullptr, 0); },
      "workspace");
  expect_error(
      [&] { (void)paged_extend_attention(good, nullptr, ExtendKernel::kWgmma, plan, small, 64); },
      "workspace");
  expect_error(
      [&] {
        (void)paged_extend_attention(good, nullptr, ExtendKernel::kWgmmaPipelined, plan, small, 64);
      },
      "workspace");
  expect_error(
      [&] {
        (void)paged_extend_attention(good, nullptr, ExtendKernel::kWgmmaWarpSpecialized, plan,
                                     nullptr, 0);
      },
      "workspace");
  expect_error(
      [&] {
        (void)paged_extend_attention(good, nullptr, ExtendKernel::kWgmmaWarpSpecializedPingPong,
                                     plan, nullptr, 0);
      },
      "workspace");
  expect_error([&] { (void)paged_extend_attention(good, nullptr, static_cast<ExtendKernel>(9)); },
               "unknown ExtendKernel");
  // An empty batch needs no workspace, even with a split plan (nothing is launched).
  plan.num_splits = 4;
  PagedExtendParams empty = good;
  empty.num_seqs = 0;
  EXPECT_EQ(extend_workspace_bytes(empty, plan), 0u);
  EXPECT_EQ(paged_extend_attention(empty, nullptr, ExtendKernel::kFa2, plan, nullptr, 0),
            cudaSuccess);
  PagedExtendParams p = good;
  p.q_stride_token = 1028;  // the shared checks run first for the variant too
  expect_error([&] { (void)paged_extend_attention(p, nullptr, ExtendKernel::kFa2); },
               "multiples of 8");
}

// kWgmmaWarpSpecializedPersistent: an item's rows do not depend on which CTA ran it, nor on how
// many CTAs shared the items. Unlike sequences (long and short prompts, cached prefixes, one
// token, an empty one) so the CTAs draw items of very different sizes, run with 1, 2 and 5 CTAs
// and the planner's count, without and with 3 splits, on one stream without synchronizing: every
// run within the tolerance of the reference and, per split count, bitwise equal to the run with
// one CTA (where one CTA runs every item through one ring: its stages, phases and turns carried
// from item to item), its log-sum-exp too; and where the kernel ran, the counter it left counts
// every cell once plus one draw past the end per CTA (no cell skipped or drawn twice, no CTA
// stopping early, the counter zeroed by the launch over the poison). Where the kernel does not run
// (not compute capability 9.0) this checks the fallback, and says so.
class CudaExtendPersistent : public testing::GpuTest {};

TEST_F(CudaExtendPersistent, ResultsDoNotDependOnTheCtas) {
  ExtendShape s = testing::make_extend_shape(KVDtype::kBFloat16, 128, 3, 4, 16,
                                             {0, 500, 37, 900, 64, 0}, {700, 20, 300, 1, 129, 0});
  s.extra_max_q_len = 9;
  const auto pb = testing::make_extend_problem(s, 4242);
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  DeviceExtendProblem dev(pb);
  const PagedExtendParams base = dev.params(pb);
  constexpr ExtendKernel kKernel = ExtendKernel::kWgmmaWarpSpecializedPersistent;
  const bool runs = extend_kernel_runs(base, kKernel);
  if (!runs) {
    std::printf("[ NOTE ] the persistent kernel does not run on this device: the fallback ran\n");
  }
  ExtendSplitPlan planned;
  PAGEDKV_CUDA_CHECK(extend_split_plan_for_current_device(base, kKernel, &planned));
  ASSERT_GE(planned.persistent_ctas, 1);
  cudaStream_t stream = nullptr;
  PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::size_t elems = pb.q.size();
  for (const std::int32_t splits : {1, 3}) {
    const std::vector<std::int32_t> ctas = {1, 2, 5, planned.persistent_ctas};
    ExtendSplitPlan plan;
    plan.num_splits = splits;
    plan.persistent_ctas = 1;
    const std::size_t ws_bytes = extend_workspace_bytes(base, plan);
    ASSERT_GT(ws_bytes, 0u);
    std::vector<DeviceBuffer> outs;
    std::vector<DeviceBuffer> lses;
    std::vector<DeviceBuffer> workspaces;
    for (const std::int32_t n : ctas) {
      outs.emplace_back(elems * sizeof(std::uint16_t));
      lses.emplace_back(ref.lse.size() * sizeof(float));
      workspaces.emplace_back(ws_bytes);
      PAGEDKV_CUDA_CHECK(cudaMemsetAsync(outs.back().get(), 0xff, outs.back().bytes(), stream));
      PAGEDKV_CUDA_CHECK(cudaMemsetAsync(lses.back().get(), 0xff, lses.back().bytes(), stream));
      PAGEDKV_CUDA_CHECK(cudaMemsetAsync(workspaces.back().get(), 0x5a, ws_bytes, stream));
      PagedExtendParams p = base;
      p.out = outs.back().get();
      p.lse = lses.back().get<float>();
      plan.persistent_ctas = n;
      PAGEDKV_CUDA_CHECK(
          paged_extend_attention(p, stream, kKernel, plan, workspaces.back().get(), ws_bytes));
    }
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto first = testing::download<std::uint16_t>(outs.front().get(), elems);
    const auto first_lse = testing::download<float>(lses.front().get(), ref.lse.size());
    // The cells of the launch's grid: KV heads x sequences x query tiles of 128 rows x splits.
    const std::int64_t cells = std::int64_t{s.cache.num_kv_heads} * s.cache.num_seqs *
                               ((std::int64_t{base.max_q_len} * base.group_size() + 127) / 128) *
                               splits;
    for (std::size_t i = 0; i < ctas.size(); ++i) {
      const std::string what =
          std::to_string(ctas[i]) + " CTAs, " + std::to_string(splits) + " splits";
      const auto got = testing::download<std::uint16_t>(outs[i].get(), elems);
      const auto rows = testing::rows_match(testing::to_doubles(KVDtype::kBFloat16, got), ref.out,
                                            128, tolerance(KVDtype::kBFloat16));
      EXPECT_TRUE(rows) << what;
      EXPECT_TRUE(got == first) << what << ": not bitwise equal to the one-CTA run";
      const auto lse = testing::download<float>(lses[i].get(), ref.lse.size());
      EXPECT_EQ(std::memcmp(lse.data(), first_lse.data(), lse.size() * sizeof(float)), 0)
          << what << ": log-sum-exp not bitwise equal to the one-CTA run";
      for (std::size_t r = 0; r < lse.size(); ++r) {
        const bool both_empty = std::isinf(ref.lse[r]) && ref.lse[r] < 0 && lse[r] == ref.lse[r];
        if (!both_empty && !(std::abs(lse[r] - ref.lse[r]) <= kLseTolerance)) {
          ADD_FAILURE() << what << ": lse[" << r << "] = " << lse[r] << ", reference "
                        << ref.lse[r];
          break;
        }
      }
      if (runs) {
        const auto counter = testing::download<std::uint64_t>(workspaces[i].get(), 1);
        EXPECT_EQ(counter[0],
                  static_cast<std::uint64_t>(cells + std::min<std::int64_t>(ctas[i], cells)))
            << what << ": the counter after the launch";
      }
    }
  }
  PAGEDKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// kWgmmaWarpSpecializedPersistent's plan (its CTAs), workspace (the work counter before any split
// partials) and launch checks (host only).
TEST(CudaExtendAttentionArguments, PersistentPlanAndWorkspaceChecks) {
  const ArgumentsProblem args;
  const PagedExtendParams good = args.params();
  constexpr ExtendKernel kPersistent = ExtendKernel::kWgmmaWarpSpecializedPersistent;
  EXPECT_EQ(static_cast<int>(kPersistent), 7);

  // One CTA per resident slot, capped; the splits are the ping-pong kernel's.
  for (const auto& [sms, per_sm] : {std::pair{132, 1}, std::pair{4, 1}, std::pair{3, 2}}) {
    const ExtendSplitPlan plan = plan_extend_split(good, kPersistent, sms, per_sm);
    EXPECT_EQ(plan.persistent_ctas, sms * per_sm);
    EXPECT_EQ(plan.num_splits,
              plan_extend_split(good, ExtendKernel::kWgmmaWarpSpecializedPingPong, sms, per_sm)
                  .num_splits);
  }
  EXPECT_EQ(plan_extend_split(good, kPersistent, 100000, 2).persistent_ctas,
            kCudaExtendMaxPersistentCtas);
  // Every other variant's plan has none.
  for (const ExtendKernel k :
       {ExtendKernel::kMma16, ExtendKernel::kFa2, ExtendKernel::kWgmma,
        ExtendKernel::kWgmmaWarpSpecializedPingPong, ExtendKernel::kFa2Fp8}) {
    EXPECT_EQ(plan_extend_split(good, k, 132, 1).persistent_ctas, 0);
  }
  // The empty batch too gets CTAs (the launch checks them), but needs no workspace.
  PagedExtendParams empty = good;
  empty.num_seqs = 0;
  const ExtendSplitPlan empty_plan = plan_extend_split(empty, kPersistent, 132, 1);
  EXPECT_EQ(empty_plan.persistent_ctas, 132);
  EXPECT_EQ(extend_workspace_bytes(empty, empty_plan), 0u);
  EXPECT_EQ(paged_extend_attention(empty, nullptr, kPersistent, empty_plan, nullptr, 0),
            cudaSuccess);

  // Workspace: 16 bytes of counter, then the split partials.
  ExtendSplitPlan plan;
  plan.persistent_ctas = 132;
  EXPECT_EQ(extend_workspace_bytes(good, plan), 16u);
  plan.num_splits = 4;
  ExtendSplitPlan split_only;
  split_only.num_splits = 4;
  EXPECT_EQ(extend_workspace_bytes(good, plan), extend_workspace_bytes(good, split_only) + 16);
  EXPECT_EQ(extend_workspace_bytes(good, plan) % 16, 0u);

  // The launch: a plan with CTAs and its workspace, also without a split.
  ExtendSplitPlan none;
  expect_error([&] { (void)paged_extend_attention(good, nullptr, kPersistent, none); },
               "persistent_ctas must be in [1, 65536] for kWgmmaWarpSpecializedPersistent");
  ExtendSplitPlan bad;
  bad.persistent_ctas = kCudaExtendMaxPersistentCtas + 1;
  expect_error([&] { (void)paged_extend_attention(good, nullptr, kPersistent, bad); }, "got 65537");
  bad.persistent_ctas = -1;
  expect_error([&] { (void)paged_extend_attention(good, nullptr, ExtendKernel::kFa2, bad); },
               "persistent_ctas must be in [0, 65536], got -1");
  plan.num_splits = 1;
  expect_error([&] { (void)paged_extend_attention(good, nullptr, kPersistent, plan, nullptr, 0); },
               "the persistent plan needs a workspace of 16 bytes, got 0");
  alignas(16) static unsigned char small[32];
  expect_error([&] { (void)paged_extend_attention(good, nullptr, kPersistent, plan, small, 8); },
               "needs a workspace of 16 bytes, got 8");
  expect_error(
      [&] { (void)paged_extend_attention(good, nullptr, kPersistent, plan, small + 4, 28); },
      "16-byte aligned");
  plan.num_splits = 4;
  expect_error(
      [&] {
        (void)paged_extend_attention(good, nullptr, kPersistent, plan, small,
                                     extend_workspace_bytes(good, split_only));
      },
      "the persistent plan needs a workspace of " +
          std::to_string(extend_workspace_bytes(good, plan)));
  // The shared checks run first.
  PagedExtendParams p = good;
  p.q_stride_token = 1028;
  expect_error([&] { (void)paged_extend_attention(p, nullptr, kPersistent, plan); },
               "multiples of 8");
  PagedExtendParams dim96 = good;
  dim96.layout.head_dim = 96;
  expect_error([&] { (void)plan_extend_split(dim96, kPersistent, 0, 1); }, "num_sms");
  // A head_dim the kernels do not take gets no plan (whichever variant).
  for (const ExtendKernel k : {ExtendKernel::kFa2, ExtendKernel::kWgmma, kPersistent}) {
    expect_error([&] { (void)plan_extend_split(dim96, k, 132, 1); },
                 "head_dim must be 64, 128 or 256, got 96");
  }
}

// ExtendKernel::kFa2Fp8's selection, planning and workspace rules (host only; its kernel runs in
// tests/cuda/fp8_test.cpp). On a 16-bit cache it is kFa2 (same plan, same workspace checks); on
// an FP8 cache in a layout of 16-byte strides its own kernel runs, planned over kFa2's 4-warp
// tiles and needing the workspace of its split; with 8-byte strides the CUDA-core FP8 kernel runs.
TEST(CudaExtendAttentionArguments, Fa2Fp8SelectionPlanAndWorkspace) {
  const ArgumentsProblem args;
  const PagedExtendParams good = args.params(/*with_lse=*/false);
  EXPECT_FALSE(extend_kernel_runs(good, ExtendKernel::kFa2Fp8));  // kFa2 runs
  for (const int sms : {2, 132}) {
    EXPECT_EQ(plan_extend_split(good, ExtendKernel::kFa2Fp8, sms, 2).num_splits,
              plan_extend_split(good, ExtendKernel::kFa2, sms, 2).num_splits);
  }
  ExtendSplitPlan four;
  four.num_splits = 4;
  expect_error(
      [&] { (void)paged_extend_attention(good, nullptr, ExtendKernel::kFa2Fp8, four, nullptr, 0); },
      "workspace");

  // The same problem over an FP8 cache (per-(token, head) scales; the pointers are only checked).
  PagedExtendParams fp8 = good;
  fp8.quant.mode = KVScaleMode::kPerTokenHead;
  fp8.quant.dtype = KVDtype::kFp8E4M3;
  fp8.layout = KVLayout::nhd_scaled(good.layout.num_blocks, 16, 2, 128);
  ASSERT_NO_THROW(validate_cuda_extend(fp8));
  EXPECT_TRUE(extend_kernel_runs(fp8, ExtendKernel::kFa2Fp8));
  EXPECT_FALSE(extend_kernel_runs(fp8, ExtendKernel::kFa2));
  EXPECT_FALSE(extend_kernel_runs(fp8, ExtendKernel::kMma16));
  // kFa2LeanSoftmax over an FP8 cache: the CUDA-core FP8 kernel, as kFa2 (no split planned).
  EXPECT_FALSE(extend_kernel_runs(fp8, ExtendKernel::kFa2LeanSoftmax));
  EXPECT_EQ(plan_extend_split(fp8, ExtendKernel::kFa2LeanSoftmax, 132, 2).num_splits, 1);
  EXPECT_EQ(extend_workspace_bytes(fp8, four), extend_workspace_bytes(good, four));
  expect_error(
      [&] { (void)paged_extend_attention(fp8, nullptr, ExtendKernel::kFa2Fp8, four, nullptr, 0); },
      "workspace");
  alignas(16) static unsigned char small[64];
  expect_error(
      [&] { (void)paged_extend_attention(fp8, nullptr, ExtendKernel::kFa2Fp8, four, small, 64); },
      "workspace");
  ExtendSplitPlan zero;
  zero.num_splits = 0;
  expect_error([&] { (void)paged_extend_attention(fp8, nullptr, ExtendKernel::kFa2Fp8, zero); },
               "num_splits");
  // Planned over 4-warp tiles: at head_dim 256, 10 new tokens x group 4 = 40 rows are 2 of kFa2's
  // 32-row tiles (2 warps for short prompts) but 1 of kFa2Fp8's 64-row tiles. 2 sequences x 2 KV
  // heads: 8 CTAs for kFa2, 4 for kFa2Fp8; 3 SMs x 2 CTAs x 2 waves = 12 -> 2 and 3 splits.
  PagedExtendParams short256 = fp8;
  short256.layout = KVLayout::nhd_scaled(good.layout.num_blocks, 16, 2, 256);
  short256.max_q_len = 10;
  EXPECT_EQ(plan_extend_split(short256, ExtendKernel::kFa2Fp8, 3, 2).num_splits, 3);
  PagedExtendParams short256_16bit = good;
  short256_16bit.layout = KVLayout::nhd(good.layout.num_blocks, 16, 2, 256);
  short256_16bit.max_q_len = 10;
  EXPECT_EQ(plan_extend_split(short256_16bit, ExtendKernel::kFa2Fp8, 3, 2).num_splits, 2);
  EXPECT_EQ(plan_extend_split(short256_16bit, ExtendKernel::kFa2, 3, 2).num_splits, 2);
  // 8-byte strides (per-tensor codes, rows padded by 8 bytes): the CUDA-core FP8 kernel.
  PagedExtendParams padded = fp8;
  padded.quant.mode = KVScaleMode::kPerTensor;
  padded.layout = KVLayout::nhd(good.layout.num_blocks, 16, 2, 128);
  padded.layout.stride_head = 136;
  padded.layout.stride_token = 272;
  padded.layout.stride_block = 16 * 272;
  ASSERT_NO_THROW(padded.layout.validate());
  EXPECT_FALSE(extend_kernel_runs(padded, ExtendKernel::kFa2Fp8));
  // The CUDA-core FP8 kernel ignores the plan, so the planner gives it no split (and its launch
  // needs no workspace); kFa2Fp8's kernel gets one on the same GPU.
  EXPECT_EQ(plan_extend_split(padded, ExtendKernel::kFa2Fp8, 132, 2).num_splits, 1);
  EXPECT_EQ(plan_extend_split(fp8, ExtendKernel::kFa2, 132, 2).num_splits, 1);
  EXPECT_GT(plan_extend_split(fp8, ExtendKernel::kFa2Fp8, 132, 2).num_splits, 1);
}

}  // namespace
}  // namespace pagedkv
