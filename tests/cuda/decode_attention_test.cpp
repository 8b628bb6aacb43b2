// CUDA paged decode attention against the CPU reference on fresh random inputs: both dtypes,
// head_dim 64/128/256, GQA groups 1..16, block sizes 1/3/16/64, shuffled block tables, lengths
// that are not block multiples, NaN-poisoned unused slots, every layout kind, split-KV on and off,
// sliding window, soft-cap, a pool of more than 2^31 elements, block ids outside the pool, the
// three-head-group warp layout (GQA groups 9..12), CUDA-graph capture, and several query tokens
// per sequence (q_len > 1, the tensor-core variants). Every device test runs
// for every kernel variant (DecodeKernel::kSimt, kTensorCore, kTensorCoreWideMerge, the default,
// and kTensorCoreFusedMerge; test names end in /Simt, /TensorCore, /TensorCoreWideMerge and
// /TensorCoreFusedMerge), the variant's split plans from its own planner options. Every launch
// gets zeroed split counters (only kTensorCoreFusedMerge reads them), and after it they must be
// zero again: each state's last CTA resets its counter. kTensorCoreFusedMerge alone: one counter
// array across launches of different shapes, and back-to-back launches on one stream that must be
// exact and bitwise repeatable (CudaDecodeFusedMerge).
// Every output row (one query head of one sequence) must be within a relative error
// ||out_row - ref_row|| / ||ref_row|| of 1e-2 (bf16) or 2e-3 (fp16) (testing::check_rows);
// outputs start NaN-poisoned, so an unwritten row fails.
//
// Without a GPU every device test skips; the host-side argument checks still run.
#include "pagedkv/cuda/decode_attention.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attention_fingerprint.hpp"
#include "cuda_attention_test_util.hpp"
#include "cuda_test_util.hpp"
#include "expect_error.hpp"
#include "kv_test_util.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/head_dims.hpp"

namespace pagedkv {
namespace {

using testing::DecodeShape;
using testing::DeviceBuffer;
using testing::LayoutKind;

double tolerance(KVDtype dtype) {
  return dtype == KVDtype::kBFloat16 ? 1e-2 : 2e-3;
}

using testing::DeviceDecodeProblem;

// Split counters for `states` (sequence, KV head) states, zeroed as the contract asks
// (include/pagedkv/cuda/decode_attention.hpp).
class SplitCounters {
 public:
  explicit SplitCounters(std::int64_t states)
      : states_(states), buffer_(static_cast<std::size_t>(states) * sizeof(std::uint32_t)) {
    PAGEDKV_CUDA_CHECK(cudaMemset(buffer_.get(), 0, buffer_.bytes()));
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
  }
  DecodeSplitCounters get() const { return {buffer_.get<std::uint32_t>(), states_}; }
  // Every launch that completed left them zero (call after synchronizing).
  ::testing::AssertionResult all_zero() const {
    const auto values =
        testing::download<std::uint32_t>(buffer_.get(), static_cast<std::size_t>(states_));
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (values[i] != 0) {
        return ::testing::AssertionFailure()
               << "split counter " << i << " left at " << values[i] << " (not reset)";
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  std::int64_t states_;
  DeviceBuffer buffer_;
};

enum class Split { kOff, kPlanner, kForced, kMany };

DecodePlan plan_for(const testing::HostDecodeProblem& pb, Split split, DecodeKernel kernel) {
  switch (split) {
    case Split::kOff:
      return DecodePlan{};
    case Split::kForced:
      // Chunks of 37 tokens (not a tile or block multiple), at most 5 per sequence: the last
      // chunk of a long sequence takes the rest.
      return DecodePlan{5, 37};
    case Split::kMany:
      // 300 chunks of 64 tokens: more splits than the wide merge's threads (256) and rows, and a
      // count that is a multiple of neither; the last chunk takes the rest.
      return DecodePlan{300, 64};
    case Split::kPlanner: {
      DecodePlanOptions options;
      testing::cuda_check(decode_plan_options_for_current_device(pb.shape.dtype, pb.shape.head_dim,
                                                                 &options, kernel),
                          "decode_plan_options_for_current_device");
      options.window_size = pb.shape.window_size;
      options.min_chunk_tokens = 64;  // split even the test's short sequences
      return plan_paged_decode(pb.shape.seq_lens, pb.shape.num_kv_heads, options);
    }
  }
  return {};
}

// Runs one case and checks every output row against the CPU reference.
::testing::AssertionResult run_case(const DecodeShape& shape, Split split, std::uint64_t seed,
                                    DecodeKernel kernel) {
  const auto pb = testing::make_decode_problem(shape, seed);
  const auto ref = reference_paged_decode_attention_f64(pb.params(nullptr));
  DeviceDecodeProblem dev(pb);
  const DecodePlan plan = plan_for(pb, split, kernel);
  const std::size_t ws_bytes =
      decode_workspace_bytes(plan, shape.num_seqs, shape.num_q_heads, shape.head_dim);
  DeviceBuffer workspace(ws_bytes);
  const SplitCounters counters(static_cast<std::int64_t>(shape.num_seqs) * shape.num_kv_heads);
  testing::cuda_check(paged_decode_attention(dev.params(pb), plan, workspace.get(), ws_bytes,
                                             nullptr, kernel, counters.get()),
                      "paged_decode_attention");
  testing::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (::testing::AssertionResult zero = counters.all_zero(); !zero) return zero;
  const auto out = testing::to_doubles(
      shape.dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
  auto rows = testing::rows_match(out, ref, static_cast<std::size_t>(shape.head_dim),
                                  tolerance(shape.dtype));
  if (rows) return rows;
  // Where the wrong rows sit (tests/util/attention_fingerprint.hpp), for study after the GPU run.
  return rows << " [" << testing::describe(shape) << " split=" << static_cast<int>(split)
              << " plan " << plan.num_splits << " x " << plan.kv_chunk_size
              << "; rows are sequence x " << shape.num_q_heads << " + query head]\n"
              << testing::error_fingerprint(out, ref, static_cast<std::size_t>(shape.head_dim),
                                            tolerance(shape.dtype), testing::decode_row_sites(pb),
                                            testing::kFingerprintDecodeTileRows);
}

class CudaDecodeAttention : public testing::GpuTest,
                            public ::testing::WithParamInterface<DecodeKernel> {};

std::string kernel_test_name(const ::testing::TestParamInfo<DecodeKernel>& param_info) {
  switch (param_info.param) {
    case DecodeKernel::kSimt:
      return "Simt";
    case DecodeKernel::kTensorCore:
      return "TensorCore";
    case DecodeKernel::kTensorCoreWideMerge:
      return "TensorCoreWideMerge";
    case DecodeKernel::kTensorCoreFp8:  // FP8 caches only: tests/cuda/fp8_test.cpp
      return "TensorCoreFp8";
    case DecodeKernel::kTensorCoreFusedMerge:
      return "TensorCoreFusedMerge";
    case DecodeKernel::kTensorCoreFp8Direct:  // FP8 caches only: tests/cuda/fp8_test.cpp
      return "TensorCoreFp8Direct";
  }
  return "Unknown";
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaDecodeAttention,
                         ::testing::Values(DecodeKernel::kSimt, DecodeKernel::kTensorCore,
                                           DecodeKernel::kTensorCoreWideMerge,
                                           DecodeKernel::kTensorCoreFusedMerge),
                         kernel_test_name);

// Many splits per sequence (300 of 64 tokens, the last one longer), every head_dim and dtype, a
// short sequence that uses fewer splits beside a long one: the merge's reduction over splits
// (serial in the default merge, spread over threads and rows in the wide merge).
TEST_P(CudaDecodeAttention, ManySplitsMerged) {
  std::uint64_t seed = 900;
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    for (const int head_dim : {64, 128, 256}) {
      DecodeShape s;
      s.dtype = dtype;
      s.num_seqs = 3;
      s.num_kv_heads = 2;
      s.num_q_heads = 8;
      s.head_dim = head_dim;
      s.block_size = 16;
      s.seq_lens = {20000, 600, 70};
      EXPECT_TRUE(run_case(s, Split::kMany, seed++, GetParam()));
    }
  }
}

TEST_P(CudaDecodeAttention, MatchesReferenceOverDtypesDimsGroupsBlockSizes) {
  std::uint64_t seed = 1;
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    for (const std::int32_t head_dim : {64, 128, 256}) {
      for (const std::int32_t group : {1, 2, 3, 4, 5, 8, 13, 16}) {
        for (const std::int32_t block_size : {1, 3, 16, 64}) {
          for (const Split split : {Split::kOff, Split::kForced}) {
            DecodeShape s;
            s.dtype = dtype;
            s.num_seqs = 3;
            s.num_kv_heads = 2;
            s.num_q_heads = 2 * group;
            s.head_dim = head_dim;
            s.block_size = block_size;
            s.seq_lens = {1, 190, 3 * block_size + 2};
            s.extra_table_columns = 2;
            EXPECT_TRUE(run_case(s, split, seed++, GetParam()));
          }
        }
      }
    }
  }
}

TEST_P(CudaDecodeAttention, MatchesReferenceOnRandomShapesAndLayouts) {
  std::mt19937_64 rng(99);
  const auto pick = [&](std::initializer_list<std::int32_t> values) {
    std::uniform_int_distribution<std::size_t> d(0, values.size() - 1);
    return *(values.begin() + static_cast<std::ptrdiff_t>(d(rng)));
  };
  for (int i = 0; i < 120; ++i) {
    DecodeShape s;
    s.dtype = pick({0, 1}) == 0 ? KVDtype::kFloat16 : KVDtype::kBFloat16;
    s.num_seqs = pick({1, 2, 7, 33});
    s.num_kv_heads = pick({1, 2, 4, 8});
    s.num_q_heads = s.num_kv_heads * pick({1, 2, 4, 6, 7, 8, 12, 16});
    s.head_dim = pick({64, 128, 256});
    s.block_size = pick({1, 3, 8, 16, 32, 64, 100, 256});
    s.kind = static_cast<LayoutKind>(pick({0, 1, 2, 3}));
    s.window_size = pick({0, 0, 0, 1, 33, 500});
    s.soft_cap = pick({0, 0, 1}) == 1 ? 5.0f : 0.0f;
    s.value_range = pick({1, 2}) == 2 ? 3.0f : 1.0f;
    s.shuffle_blocks = pick({0, 1, 1}) == 1;
    std::uniform_int_distribution<std::int32_t> len(0, 1500);
    for (std::int32_t j = 0; j < s.num_seqs; ++j) s.seq_lens.push_back(len(rng));
    const Split split = static_cast<Split>(pick({0, 1, 2}));
    EXPECT_TRUE(run_case(s, split, 5000 + static_cast<std::uint64_t>(i), GetParam()));
  }
}

TEST_P(CudaDecodeAttention, LongContextWithPlannedSplits) {
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    DecodeShape s;
    s.dtype = dtype;
    s.num_seqs = 2;
    s.num_kv_heads = 8;
    s.num_q_heads = 32;
    s.head_dim = 128;
    s.block_size = 16;
    s.seq_lens = {20000, 3001};
    const auto pb = testing::make_decode_problem(s, 77);
    ASSERT_TRUE(plan_for(pb, Split::kPlanner, GetParam()).split_kv());
    EXPECT_TRUE(run_case(s, Split::kPlanner, 77, GetParam()));
    EXPECT_TRUE(run_case(s, Split::kOff, 77, GetParam()));
  }
}

// Several query tokens per sequence (q_len > 1, speculative decoding) on the tensor-core
// variants: against the CPU reference (itself checked against the extend reference,
// tests/reference/decode_attention_test.cpp), every dtype and head_dim, group x q_len up to 16,
// windows that end inside a chunk, soft-cap, split-KV off, forced (chunks of 37: last chunks too
// short for the early tokens), planned and many (300 chunks), sequences shorter than q_len, and
// strided q / out with gaps between tokens. kSimt refuses q_len > 1 (host check below).
::testing::AssertionResult run_multi_query(KVDtype dtype, std::int32_t head_dim, std::int32_t group,
                                           std::int32_t q_len, std::int32_t block_size,
                                           std::int32_t window, float cap,
                                           const std::vector<std::int32_t>& prefixes, Split split,
                                           bool strided, std::uint64_t seed, DecodeKernel kernel) {
  const std::vector<std::int32_t> q_lens(prefixes.size(), q_len);
  auto shape = testing::make_extend_shape(dtype, head_dim, 2, group, block_size, prefixes, q_lens);
  shape.cache.window_size = window;
  shape.cache.soft_cap = cap;
  const auto pb = testing::make_extend_problem(shape, seed);
  const PagedDecodeParams host = pb.decode_params();
  const auto ref = reference_paged_decode_attention_f64(host);
  testing::DeviceExtendProblem dev(pb);
  const auto num_seqs = static_cast<std::int32_t>(prefixes.size());
  const std::int32_t num_q_heads = 2 * group;
  const std::int64_t row = static_cast<std::int64_t>(num_q_heads) * head_dim;
  // Strided: 8 elements after each token's heads and 16 more after each sequence's tokens.
  const std::int64_t token_stride = strided ? row + 8 : row;
  const std::int64_t seq_stride = strided ? q_len * token_stride + 16 : q_len * row;
  std::vector<std::uint16_t> q_host(static_cast<std::size_t>(num_seqs * seq_stride), 0);
  for (std::int64_t s = 0; s < num_seqs; ++s) {
    for (std::int64_t i = 0; i < q_len; ++i) {
      std::copy_n(pb.q.begin() + (s * q_len + i) * row, row,
                  q_host.begin() + s * seq_stride + i * token_stride);
    }
  }
  const DeviceBuffer q(testing::upload(q_host));
  const DeviceBuffer out(q_host.size() * sizeof(std::uint16_t));  // NaN-poisoned
  PagedDecodeParams p = host;
  p.q = q.get();
  p.k_cache = dev.k.get();
  p.v_cache = dev.v_plane(pb);
  p.block_table = dev.table.get<std::int32_t>();
  p.seq_lens = dev.lens.get<std::int32_t>();
  p.out = out.get();
  if (strided) {
    p.q_stride_token = p.out_stride_token = token_stride;
    p.q_stride_seq = p.out_stride_seq = seq_stride;
  }
  DecodePlan plan;
  if (split == Split::kForced) plan = DecodePlan{5, 37};
  if (split == Split::kMany) plan = DecodePlan{300, 64};
  if (split == Split::kPlanner) {
    DecodePlanOptions options;
    testing::cuda_check(decode_plan_options_for_current_device(dtype, head_dim, &options, kernel),
                        "decode_plan_options_for_current_device");
    options.window_size = window;
    options.min_chunk_tokens = 64;
    plan = plan_paged_decode(pb.shape.cache.seq_lens, 2, options);
  }
  const std::size_t ws_bytes = decode_workspace_bytes(plan, num_seqs, num_q_heads, head_dim, q_len);
  DeviceBuffer workspace(ws_bytes);
  const SplitCounters counters(static_cast<std::int64_t>(num_seqs) * 2);
  testing::cuda_check(
      paged_decode_attention(p, plan, workspace.get(), ws_bytes, nullptr, kernel, counters.get()),
      "paged_decode_attention");
  testing::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (::testing::AssertionResult zero = counters.all_zero(); !zero) return zero;
  const auto all = testing::download<std::uint16_t>(out.get(), q_host.size());
  std::vector<std::uint16_t> dense(static_cast<std::size_t>(num_seqs * q_len * row));
  for (std::int64_t s = 0; s < num_seqs; ++s) {
    for (std::int64_t i = 0; i < q_len; ++i) {
      std::copy_n(all.begin() + s * seq_stride + i * token_stride, row,
                  dense.begin() + (s * q_len + i) * row);
      if (strided &&
          all[static_cast<std::size_t>(s * seq_stride + i * token_stride + row)] != 0xffff) {
        return ::testing::AssertionFailure() << "the gap after a token's heads was written";
      }
    }
  }
  const auto got = testing::to_doubles(dtype, dense);
  auto rows = testing::rows_match(got, ref, static_cast<std::size_t>(head_dim), tolerance(dtype));
  if (rows) return rows;
  return rows << " [q_len " << q_len << " group " << group << " head_dim " << head_dim << " block "
              << block_size << " window " << window << " cap " << cap << " split "
              << static_cast<int>(split) << (strided ? " strided" : "") << " plan "
              << plan.num_splits << " x " << plan.kv_chunk_size
              << "; rows are (sequence x q_len + token) x " << num_q_heads << " + query head]\n"
              << testing::error_fingerprint(
                     got, ref, static_cast<std::size_t>(head_dim), tolerance(dtype),
                     testing::extend_row_sites(pb, testing::kFingerprintDecodeTileRows),
                     testing::kFingerprintDecodeTileRows);
}

TEST_P(CudaDecodeAttention, SeveralQueryTokensMatchTheReference) {
  if (GetParam() == DecodeKernel::kSimt) GTEST_SKIP() << "kSimt takes one query token";
  std::uint64_t seed = 7000;
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    for (const std::int32_t head_dim : {64, 128, 256}) {
      for (const auto& [group, q_len] :
           std::vector<std::pair<int, int>>{{1, 2}, {1, 16}, {2, 4}, {3, 5}, {4, 3}, {8, 2}}) {
        for (const Split split : {Split::kOff, Split::kForced, Split::kPlanner}) {
          EXPECT_TRUE(run_multi_query(dtype, head_dim, group, q_len, 16, 0, 0.0f, {0, 1, 190, 700},
                                      split, false, seed++, GetParam()));
        }
      }
    }
  }
  // Windows (ending inside a chunk; one token's window a chunk away from another's), soft-cap,
  // block size 1 and 64, 300 chunks, strided q / out, sequences shorter than q_len.
  for (const std::int32_t window : {1, 5, 40, 100}) {
    for (const Split split : {Split::kOff, Split::kForced, Split::kMany}) {
      EXPECT_TRUE(run_multi_query(KVDtype::kBFloat16, 128, 2, 6, 1, window, 0.0f, {3, 120, 20000},
                                  split, false, seed++, GetParam()));
      EXPECT_TRUE(run_multi_query(KVDtype::kFloat16, 64, 4, 4, 64, window, 10.0f, {0, 77, 900},
                                  split, true, seed++, GetParam()));
    }
  }
}

// A few of the cases above, small enough for compute-sanitizer (scripts/gpu-check's memcheck,
// racecheck and synccheck lines): split and not, a window, strided q / out, a sequence shorter
// than q_len.
TEST_P(CudaDecodeAttention, SeveralQueryTokensFewCases) {
  if (GetParam() == DecodeKernel::kSimt) GTEST_SKIP() << "kSimt takes one query token";
  for (const Split split : {Split::kOff, Split::kForced}) {
    EXPECT_TRUE(run_multi_query(KVDtype::kBFloat16, 128, 4, 4, 16, 0, 0.0f, {2, 150}, split, true,
                                7500, GetParam()));
    EXPECT_TRUE(run_multi_query(KVDtype::kFloat16, 64, 2, 8, 16, 20, 0.0f, {90}, split, false, 7501,
                                GetParam()));
  }
}

TEST_P(CudaDecodeAttention, EmptySequencesGiveZeros) {
  DecodeShape s;
  s.num_seqs = 3;
  s.num_kv_heads = 2;
  s.num_q_heads = 8;
  s.head_dim = 128;
  s.seq_lens = {0, 500, 0};
  for (const Split split : {Split::kOff, Split::kForced, Split::kPlanner}) {
    const auto pb = testing::make_decode_problem(s, 4);
    const auto ref = reference_paged_decode_attention_f64(pb.params(nullptr));
    DeviceDecodeProblem dev(pb);
    // The output starts as a NaN pattern, not as the zeros a fresh allocation often holds.
    for (const std::uint16_t bits : testing::download<std::uint16_t>(dev.out.get(), 16)) {
      ASSERT_EQ(bits, 0xffff);
    }
    const DecodePlan plan = plan_for(pb, split, GetParam());
    const std::size_t ws_bytes = decode_workspace_bytes(plan, 3, 8, 128);
    DeviceBuffer workspace(ws_bytes);
    const SplitCounters counters(3 * 2);
    PAGEDKV_CUDA_CHECK(paged_decode_attention(dev.params(pb), plan, workspace.get(), ws_bytes,
                                              nullptr, GetParam(), counters.get()));
    const auto out = testing::download<std::uint16_t>(dev.out.get(), pb.q.size());
    EXPECT_TRUE(counters.all_zero());
    for (std::size_t i = 0; i < 8 * 128; ++i) ASSERT_EQ(out[i], 0) << i;
    for (std::size_t i = 2 * 8 * 128; i < 3 * 8 * 128; ++i) ASSERT_EQ(out[i], 0) << i;
    EXPECT_TRUE(
        testing::rows_match(testing::to_doubles(s.dtype, out), ref, 128, tolerance(s.dtype)))
        << "split " << static_cast<int>(split);
  }
}

// GQA groups 9..12 put the group's heads on three warps (heads_per_warp 3 or 4, the fourth warp
// idle, no warps sharing a head); the random-shape test reaches this layout only by chance.
TEST_P(CudaDecodeAttention, ThreeHeadGroupWarpLayout) {
  std::uint64_t seed = 900;
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    for (const std::int32_t head_dim : {64, 128, 256}) {
      for (const std::int32_t group : {9, 10, 11, 12}) {
        for (const Split split : {Split::kOff, Split::kForced}) {
          DecodeShape s;
          s.dtype = dtype;
          s.num_seqs = 3;
          s.num_kv_heads = 2;
          s.num_q_heads = 2 * group;
          s.head_dim = head_dim;
          s.block_size = 16;
          s.seq_lens = {1, 190, 77};
          s.extra_table_columns = 2;
          EXPECT_TRUE(run_case(s, split, seed++, GetParam()));
        }
      }
    }
  }
}

// Device data is trusted but never followed out of bounds: a block id outside the pool (past its
// end, or negative) gives that sequence a finite result (no fault, no NaN), and every other
// sequence of the batch is exact. Run under compute-sanitizer memcheck by scripts/gpu-check.
TEST_P(CudaDecodeAttention, BlockIdsOutsideThePool) {
  for (const std::int32_t bad_id : {1 << 20, -3}) {
    for (const Split split : {Split::kOff, Split::kForced}) {
      DecodeShape s;
      s.num_seqs = 3;
      s.num_kv_heads = 2;
      s.num_q_heads = 8;
      s.head_dim = 128;
      s.block_size = 16;
      s.seq_lens = {100, 300, 64};
      const auto pb = testing::make_decode_problem(s, 15);
      const auto ref = reference_paged_decode_attention_f64(pb.params(nullptr));
      DeviceDecodeProblem dev(pb);
      std::vector<std::int32_t> table = pb.table.block_ids;
      table[static_cast<std::size_t>(pb.table.max_blocks_per_seq) + 3] = bad_id;  // seq 1
      const DeviceBuffer table_dev = testing::upload(table);
      PagedDecodeParams p = dev.params(pb);
      p.block_table = table_dev.get<std::int32_t>();
      const DecodePlan plan = plan_for(pb, split, GetParam());
      const std::size_t ws_bytes = decode_workspace_bytes(plan, 3, 8, 128);
      DeviceBuffer workspace(ws_bytes);
      const SplitCounters counters(3 * 2);
      PAGEDKV_CUDA_CHECK(paged_decode_attention(p, plan, workspace.get(), ws_bytes, nullptr,
                                                GetParam(), counters.get()));
      PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_TRUE(counters.all_zero());
      const auto out =
          testing::to_doubles(s.dtype, testing::download<std::uint16_t>(dev.out.get(), 3 * 1024));
      const std::span<const double> o(out);
      const std::span<const double> r(ref);
      EXPECT_TRUE(testing::rows_match(o.subspan(0, 1024), r.subspan(0, 1024), 128, 1e-2));
      EXPECT_TRUE(testing::rows_match(o.subspan(2048, 1024), r.subspan(2048, 1024), 128, 1e-2));
      for (std::size_t i = 1024; i < 2048; ++i) {
        ASSERT_TRUE(std::isfinite(out[i])) << "bad id " << bad_id << " value " << i;
      }
    }
  }
}

TEST_P(CudaDecodeAttention, StridedQueryAndOutput) {
  DecodeShape s;
  s.dtype = KVDtype::kFloat16;
  s.num_seqs = 4;
  s.num_kv_heads = 2;
  s.num_q_heads = 8;
  s.head_dim = 64;
  s.seq_lens = {100, 17, 300, 64};
  const auto pb = testing::make_decode_problem(s, 8);
  const auto ref = reference_paged_decode_attention_f64(pb.params(nullptr));
  // q lives inside a fused qkv-like buffer: heads 72 apart, sequences 1024 apart.
  std::vector<std::uint16_t> q_strided(4 * 1024, testing::nan_bits(s.dtype));
  for (int seq = 0; seq < 4; ++seq) {
    for (int h = 0; h < 8; ++h) {
      for (int d = 0; d < 64; ++d) {
        q_strided[static_cast<std::size_t>(seq * 1024 + h * 72 + d)] =
            pb.q[static_cast<std::size_t>((seq * 8 + h) * 64 + d)];
      }
    }
  }
  DeviceDecodeProblem dev(pb);
  const DeviceBuffer q = testing::upload(q_strided);
  const DeviceBuffer out(4 * 800 * sizeof(std::uint16_t));
  PAGEDKV_CUDA_CHECK(cudaMemset(out.get(), 0x5a, out.bytes()));  // a pattern, not zeros
  PagedDecodeParams p = dev.params(pb);
  p.q = q.get();
  p.q_stride_seq = 1024;
  p.q_stride_head = 72;
  p.out = out.get();
  p.out_stride_seq = 800;
  p.out_stride_head = 96;
  // Without split-KV, and with four 64-token chunks (so the merges write the strided output).
  for (const DecodePlan plan : {DecodePlan{}, DecodePlan{4, 64}}) {
    const std::size_t ws_bytes = decode_workspace_bytes(plan, 4, 8, 64);
    DeviceBuffer workspace(ws_bytes);
    const SplitCounters counters(4 * 2);
    PAGEDKV_CUDA_CHECK(cudaMemset(out.get(), 0x5a, out.bytes()));  // a pattern, not zeros
    PAGEDKV_CUDA_CHECK(paged_decode_attention(p, plan, workspace.get(), ws_bytes, nullptr,
                                              GetParam(), counters.get()));
    const auto got = testing::download<std::uint16_t>(out.get(), 4 * 800);
    std::vector<double> dense(ref.size());
    for (int seq = 0; seq < 4; ++seq) {
      for (int h = 0; h < 8; ++h) {
        for (int d = 0; d < 64; ++d) {
          dense[static_cast<std::size_t>((seq * 8 + h) * 64 + d)] =
              fp16_bits_to_float(got[static_cast<std::size_t>(seq * 800 + h * 96 + d)]);
        }
      }
    }
    EXPECT_TRUE(testing::rows_match(dense, ref, 64, tolerance(s.dtype)))
        << "splits " << plan.num_splits;
    EXPECT_EQ(got[64], 0x5a5a) << "splits " << plan.num_splits;  // the gap after head 0
    EXPECT_TRUE(counters.all_zero());
  }
}

// More than 2^31 elements per plane: the sequences' blocks sit at the top of a 4.3 GB pool, so
// every offset needs 64 bits. Also kv_append into those blocks.
TEST_P(CudaDecodeAttention, PoolLargerThan2To31Elements) {
  DecodeShape s;
  s.dtype = KVDtype::kBFloat16;
  s.num_seqs = 2;
  s.num_kv_heads = 8;
  s.num_q_heads = 32;
  s.head_dim = 128;
  s.block_size = 16;
  s.seq_lens = {1000, 333};
  const auto pb = testing::make_decode_problem(s, 21);
  const auto ref = reference_paged_decode_attention_f64(pb.params(nullptr));

  // Every host block lands at or above element 2^31 (the lowest one too).
  const std::int64_t big_blocks =
      (std::int64_t{1} << 31) / pb.layout.block_elements() + 1 + pb.layout.num_blocks;
  const KVLayout big = KVLayout::nhd(big_blocks, 16, 8, 128);
  ASSERT_GT(big.plane_elements(), std::int64_t{1} << 31);
  const std::int64_t shift = big_blocks - pb.layout.num_blocks;  // host block b -> b + shift
  const std::size_t plane_bytes = static_cast<std::size_t>(big.plane_elements()) * 2;
  size_t free_bytes = 0, total_bytes = 0;
  PAGEDKV_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < 2 * plane_bytes + (std::size_t{1} << 30)) {
    PAGEDKV_GPU_SKIP("needs " << 2 * plane_bytes / (1 << 20) << " MiB of free device memory");
  }
  DeviceBuffer k(plane_bytes);
  DeviceBuffer v(plane_bytes);
  PAGEDKV_CUDA_CHECK(cudaMemset(k.get(), 0xff, plane_bytes));  // NaN everywhere else
  PAGEDKV_CUDA_CHECK(cudaMemset(v.get(), 0xff, plane_bytes));
  const std::size_t block_bytes = static_cast<std::size_t>(pb.layout.block_elements()) * 2;
  for (std::int64_t b = 0; b < pb.layout.num_blocks; ++b) {
    const std::size_t at = static_cast<std::size_t>(b + shift) * block_bytes;
    PAGEDKV_CUDA_CHECK(cudaMemcpy(k.get<unsigned char>() + at,
                                  pb.k_buffer.data() + b * pb.layout.block_elements(), block_bytes,
                                  cudaMemcpyHostToDevice));
    PAGEDKV_CUDA_CHECK(cudaMemcpy(v.get<unsigned char>() + at,
                                  pb.v_buffer.data() + b * pb.layout.block_elements(), block_bytes,
                                  cudaMemcpyHostToDevice));
  }
  std::vector<std::int32_t> table = pb.table.block_ids;
  for (auto& id : table) id = static_cast<std::int32_t>(id + shift);
  DeviceDecodeProblem dev(pb);
  const DeviceBuffer table_dev = testing::upload(table);
  PagedDecodeParams p = dev.params(pb);
  p.k_cache = k.get();
  p.v_cache = v.get();
  p.layout = big;
  p.block_table = table_dev.get<std::int32_t>();
  for (const Split split : {Split::kOff, Split::kForced}) {
    const DecodePlan plan = plan_for(pb, split, GetParam());
    const std::size_t ws_bytes = decode_workspace_bytes(plan, 2, 32, 128);
    DeviceBuffer workspace(ws_bytes);
    const SplitCounters counters(2 * 8);
    PAGEDKV_CUDA_CHECK(paged_decode_attention(p, plan, workspace.get(), ws_bytes, nullptr,
                                              GetParam(), counters.get()));
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(counters.all_zero());
    const auto out =
        testing::to_doubles(s.dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
    EXPECT_TRUE(testing::rows_match(out, ref, 128, tolerance(s.dtype)))
        << "split " << static_cast<int>(split);
  }

  // kv_append one token per sequence into the high blocks, then read the slots back.
  std::mt19937_64 rng(5);
  const auto new_k = testing::random_values(s.dtype, 2 * 8 * 128, rng);
  const auto new_v = testing::random_values(s.dtype, 2 * 8 * 128, rng);
  std::vector<std::int64_t> slots;
  for (int seq = 0; seq < 2; ++seq) {
    // Overwrite the last token of each sequence: its slot is in one of the high blocks.
    const std::int32_t pos = s.seq_lens[static_cast<std::size_t>(seq)] - 1;
    slots.push_back(slot_of(pb.table.row(seq), 16, pos) + shift * 16);
  }
  const DeviceBuffer k_rows = testing::upload(new_k);
  const DeviceBuffer v_rows = testing::upload(new_v);
  const DeviceBuffer slot_dev = testing::upload(slots);
  KVAppendParams a;
  a.dtype = s.dtype;
  a.num_tokens = 2;
  a.key = k_rows.get();
  a.value = v_rows.get();
  a.slot_mapping = slot_dev.get<std::int64_t>();
  a.k_cache = k.get();
  a.v_cache = v.get();
  a.layout = big;
  PAGEDKV_CUDA_CHECK(kv_append(a, nullptr));
  for (int seq = 0; seq < 2; ++seq) {
    const std::int64_t slot = slots[static_cast<std::size_t>(seq)];
    const std::int64_t offset = big.offset(slot / 16, slot % 16, 0);
    ASSERT_GT(offset, std::int64_t{1} << 31);
    const auto k_back = testing::download<std::uint16_t>(k.get<std::uint16_t>() + offset, 8 * 128);
    const auto v_back = testing::download<std::uint16_t>(v.get<std::uint16_t>() + offset, 8 * 128);
    for (int i = 0; i < 8 * 128; ++i) {
      ASSERT_EQ(k_back[static_cast<std::size_t>(i)],
                new_k[static_cast<std::size_t>(seq * 1024 + i)]);
      ASSERT_EQ(v_back[static_cast<std::size_t>(i)],
                new_v[static_cast<std::size_t>(seq * 1024 + i)]);
    }
  }
}

// A captured graph replays the split-KV launch (attention + merge) correctly, and replays again
// after seq_lens grew on the device without re-capturing (kTensorCoreFusedMerge: on the same split
// counters, which each replay leaves zero for the next).
TEST_P(CudaDecodeAttention, GraphCaptureAndReplay) {
  DecodeShape s;
  s.num_seqs = 2;
  s.num_kv_heads = 2;
  s.num_q_heads = 8;
  s.head_dim = 128;
  s.seq_lens = {2000, 2000};  // tokens filled; the replays attend to fewer
  auto pb = testing::make_decode_problem(s, 31);
  DeviceDecodeProblem dev(pb);
  const DecodePlan plan{8, 256};
  const std::size_t ws_bytes = decode_workspace_bytes(plan, 2, 8, 128);
  DeviceBuffer workspace(ws_bytes);
  const SplitCounters counters(2 * 2);
  cudaStream_t stream = nullptr;
  PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::vector<std::int32_t> capture_lens = {2000, 900};
  PAGEDKV_CUDA_CHECK(cudaMemcpy(dev.lens.get(), capture_lens.data(), 8, cudaMemcpyHostToDevice));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  PAGEDKV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launched = paged_decode_attention(dev.params(pb), plan, workspace.get(),
                                                      ws_bytes, stream, GetParam(), counters.get());
  PAGEDKV_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  PAGEDKV_CUDA_CHECK(launched);
  PAGEDKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (const std::vector<std::int32_t>& lens :
       {std::vector<std::int32_t>{2000, 900}, std::vector<std::int32_t>{1500, 2000}}) {
    // Only seq_lens change between replays (decode steps); blocks and data stay.
    pb.shape.seq_lens = lens;
    PAGEDKV_CUDA_CHECK(cudaMemcpyAsync(dev.lens.get(), lens.data(), lens.size() * 4,
                                       cudaMemcpyHostToDevice, stream));
    // The previous replay's partial results and output poisoned: a replay that merged before its
    // own chunks were written, or wrote no row, would show it.
    PAGEDKV_CUDA_CHECK(cudaMemsetAsync(workspace.get(), 0xff, ws_bytes, stream));
    PAGEDKV_CUDA_CHECK(cudaMemsetAsync(dev.out.get(), 0xff, dev.out.bytes(), stream));
    PAGEDKV_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto ref = reference_paged_decode_attention_f64(pb.params(nullptr));
    const auto out =
        testing::to_doubles(s.dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
    EXPECT_TRUE(testing::rows_match(out, ref, 128, tolerance(s.dtype)));
    EXPECT_TRUE(counters.all_zero());
  }
  PAGEDKV_CUDA_CHECK(cudaGraphExecDestroy(exec));
  PAGEDKV_CUDA_CHECK(cudaGraphDestroy(graph));
  PAGEDKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// kTensorCoreFusedMerge: one counter array, zeroed once, serves launches of different batches,
// plans, head_dims and groups in a row (each launch leaves it zero for the next); every output
// row matches the CPU reference. A counter left non-zero would make the next launch merge early
// (a wrong row), skip the merge (a NaN-poisoned row), or trap.
class CudaDecodeFusedMerge : public testing::GpuTest {};

// A shape of block size 16 with num_kv_heads x group query heads, one sequence per length.
DecodeShape fused_shape(KVDtype dtype, std::int32_t num_kv_heads, std::int32_t group,
                        std::int32_t head_dim, std::vector<std::int32_t> seq_lens) {
  DecodeShape s;
  s.dtype = dtype;
  s.num_seqs = static_cast<std::int32_t>(seq_lens.size());
  s.num_kv_heads = num_kv_heads;
  s.num_q_heads = num_kv_heads * group;
  s.head_dim = head_dim;
  s.block_size = 16;
  s.seq_lens = std::move(seq_lens);
  return s;
}

TEST_F(CudaDecodeFusedMerge, OneZeroedCounterArrayServesEveryLaunch) {
  struct Step {
    KVDtype dtype;
    std::int32_t num_kv_heads;
    std::int32_t group;
    std::int32_t head_dim;
    std::vector<std::int32_t> seq_lens;
    DecodePlan plan;
  };
  const std::vector<Step> steps = {
      {KVDtype::kFloat16, 4, 2, 128, {3000, 64, 900, 1}, DecodePlan{8, 256}},
      {KVDtype::kBFloat16, 4, 4, 64, {5000}, DecodePlan{40, 128}},
      {KVDtype::kFloat16, 2, 8, 256, {700, 2100}, DecodePlan{3, 64}},
      {KVDtype::kBFloat16, 4, 16, 128, {4096, 4096, 100, 2500}, DecodePlan{32, 128}},
      {KVDtype::kFloat16, 4, 2, 128, {3000, 64, 900, 1}, DecodePlan{8, 256}},
  };
  const SplitCounters counters(4 * 4);  // the largest batch: 4 sequences x 4 KV heads
  std::uint64_t seed = 1200;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    const DecodeShape s =
        fused_shape(step.dtype, step.num_kv_heads, step.group, step.head_dim, step.seq_lens);
    const auto pb = testing::make_decode_problem(s, seed++);
    const auto ref = reference_paged_decode_attention_f64(pb.params(nullptr));
    DeviceDecodeProblem dev(pb);
    const std::size_t ws_bytes =
        decode_workspace_bytes(step.plan, s.num_seqs, s.num_q_heads, s.head_dim);
    DeviceBuffer workspace(ws_bytes);
    PAGEDKV_CUDA_CHECK(paged_decode_attention(dev.params(pb), step.plan, workspace.get(), ws_bytes,
                                              nullptr, DecodeKernel::kTensorCoreFusedMerge,
                                              counters.get()));
    PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
    const auto out =
        testing::to_doubles(s.dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
    EXPECT_TRUE(
        testing::rows_match(out, ref, static_cast<std::size_t>(s.head_dim), tolerance(s.dtype)))
        << "step " << i << " [" << testing::describe(s) << "]";
    ASSERT_TRUE(counters.all_zero()) << "after step " << i;
  }
}

// kTensorCoreFusedMerge launched back to back on one stream, as an engine launches one layer after
// another: two problems alternate on one workspace and one counter array (each launch's CTAs wait
// in griddepcontrol.wait for the previous one, on sm_90), each launch into its own output, one
// synchronization at the end. Then the same problem 64 times more with the workspace poisoned
// before each launch. The merged result does not depend on which CTA merges (the chunks are folded
// in a fixed order), so every launch of a problem must give the same bits: a merge that ran
// before every chunk's partials were visible (a missing fence, a wrong count, an overlap with the
// previous launch) would read a previous launch's partials or the poison and differ.
TEST_F(CudaDecodeFusedMerge, BackToBackLaunchesAreExactAndBitwiseRepeatable) {
  std::mt19937_64 rng(77);
  std::uniform_int_distribution<std::int32_t> len(1, 3000);
  std::vector<std::int32_t> lens_a(48);
  for (std::int32_t& l : lens_a) l = len(rng);
  // A: many states with many splits; B: few states, wide groups, another head_dim.
  const DecodeShape a = fused_shape(KVDtype::kBFloat16, 8, 4, 128, lens_a);
  const DecodeShape b = fused_shape(KVDtype::kFloat16, 2, 8, 64, {5000, 70, 900});
  const auto pa = testing::make_decode_problem(a, 1300);
  const auto pb = testing::make_decode_problem(b, 1301);
  const auto ref_a = reference_paged_decode_attention_f64(pa.params(nullptr));
  const auto ref_b = reference_paged_decode_attention_f64(pb.params(nullptr));
  DeviceDecodeProblem da(pa);
  DeviceDecodeProblem db(pb);
  const DecodePlan plan_a{48, 64};
  const DecodePlan plan_b{40, 128};
  const std::size_t ws_bytes = std::max(decode_workspace_bytes(plan_a, 48, 32, 128),
                                        decode_workspace_bytes(plan_b, 3, 16, 64));
  DeviceBuffer workspace(ws_bytes);
  const SplitCounters counters(48 * 8);
  constexpr int kRounds = 8;
  constexpr int kRepeats = 64;
  const std::size_t out_a = pa.q.size();
  const std::size_t out_b = pb.q.size();
  DeviceBuffer outs_a((kRounds + kRepeats) * out_a * sizeof(std::uint16_t));
  DeviceBuffer outs_b(kRounds * out_b * sizeof(std::uint16_t));
  cudaStream_t stream = nullptr;
  PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  PagedDecodeParams p_a = da.params(pa);
  PagedDecodeParams p_b = db.params(pb);
  for (int r = 0; r < kRounds; ++r) {
    p_a.out = outs_a.get<std::uint16_t>() + r * out_a;
    p_b.out = outs_b.get<std::uint16_t>() + r * out_b;
    PAGEDKV_CUDA_CHECK(paged_decode_attention(p_a, plan_a, workspace.get(), ws_bytes, stream,
                                              DecodeKernel::kTensorCoreFusedMerge, counters.get()));
    PAGEDKV_CUDA_CHECK(paged_decode_attention(p_b, plan_b, workspace.get(), ws_bytes, stream,
                                              DecodeKernel::kTensorCoreFusedMerge, counters.get()));
  }
  for (int r = 0; r < kRepeats; ++r) {
    PAGEDKV_CUDA_CHECK(cudaMemsetAsync(workspace.get(), 0xff, ws_bytes, stream));
    p_a.out = outs_a.get<std::uint16_t>() + (kRounds + r) * out_a;
    PAGEDKV_CUDA_CHECK(paged_decode_attention(p_a, plan_a, workspace.get(), ws_bytes, stream,
                                              DecodeKernel::kTensorCoreFusedMerge, counters.get()));
  }
  PAGEDKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  PAGEDKV_CUDA_CHECK(cudaStreamDestroy(stream));
  ASSERT_TRUE(counters.all_zero());
  const auto got_a = testing::download<std::uint16_t>(outs_a.get(), (kRounds + kRepeats) * out_a);
  const auto got_b = testing::download<std::uint16_t>(outs_b.get(), kRounds * out_b);
  const std::span<const std::uint16_t> all_a(got_a);
  const std::span<const std::uint16_t> all_b(got_b);
  EXPECT_TRUE(testing::rows_match(
      testing::to_doubles(a.dtype,
                          std::vector<std::uint16_t>(got_a.begin(), got_a.begin() + out_a)),
      ref_a, 128, tolerance(a.dtype)));
  EXPECT_TRUE(testing::rows_match(
      testing::to_doubles(b.dtype,
                          std::vector<std::uint16_t>(got_b.begin(), got_b.begin() + out_b)),
      ref_b, 64, tolerance(b.dtype)));
  for (int r = 1; r < kRounds + kRepeats; ++r) {
    const auto launch = all_a.subspan(r * out_a, out_a);
    ASSERT_TRUE(std::equal(launch.begin(), launch.end(), all_a.begin()))
        << "problem A, launch " << r << " differs from launch 0";
  }
  for (int r = 1; r < kRounds; ++r) {
    const auto launch = all_b.subspan(r * out_b, out_b);
    ASSERT_TRUE(std::equal(launch.begin(), launch.end(), all_b.begin()))
        << "problem B, launch " << r << " differs from launch 0";
  }
}

// ---- host-side argument checks: no device needed ----

template <typename Fn>
void expect_error(Fn&& fn, const std::string& fragment) {
  testing::expect_error_containing(fn, fragment);
}

// The head dimensions this build compiled are those CMake was given (PAGEDKV_CUDA_HEAD_DIMS,
// passed to this test comma-separated as PAGEDKV_TEST_CUDA_HEAD_DIMS); each compiled one validates,
// anything else is refused (the broken-kernel library's host suite checks a build with some left
// out).
TEST(CudaDecodeAttentionArguments, HeadDimsAreThoseTheBuildWasGiven) {
  const std::string configured = PAGEDKV_TEST_CUDA_HEAD_DIMS;
  for (const int head_dim : {0, 32, 64, 96, 128, 192, 256, 512}) {
    SCOPED_TRACE(head_dim);
    const std::string name = std::to_string(head_dim);
    bool listed = false;
    for (std::size_t at = 0; at <= configured.size();) {
      const std::size_t end = std::min(configured.find(',', at), configured.size());
      listed = listed || configured.substr(at, end - at) == name;
      at = end + 1;
    }
    EXPECT_EQ(cuda_head_dim_compiled(head_dim), listed);
    if (head_dim == 0) continue;
    DecodeShape s;
    s.num_seqs = 1;
    s.num_kv_heads = 1;
    s.num_q_heads = 4;
    s.head_dim = head_dim;
    s.seq_lens = {20};
    const auto pb = testing::make_decode_problem(s, 1);
    alignas(16) static std::uint16_t out[4 * 512];
    const PagedDecodeParams p = pb.params(out);
    if (listed) {
      EXPECT_NO_THROW(validate_cuda_decode(p, DecodePlan{}, nullptr, 0));
    } else {
      expect_error([&] { validate_cuda_decode(p, DecodePlan{}, nullptr, 0); }, "head_dim");
    }
  }
}

TEST(CudaDecodeAttentionArguments, RejectedOnTheHostBeforeAnyLaunch) {
  DecodeShape s;
  s.num_seqs = 2;
  s.num_kv_heads = 2;
  s.num_q_heads = 8;
  s.head_dim = 128;
  s.seq_lens = {40, 50};
  const auto pb = testing::make_decode_problem(s, 1);
  alignas(16) static std::uint16_t out[2 * 8 * 128];
  const PagedDecodeParams good = pb.params(out);
  EXPECT_NO_THROW(validate_cuda_decode(good, DecodePlan{}, nullptr, 0));

  PagedDecodeParams p = good;
  p.q = static_cast<const std::uint16_t*>(good.q) + 1;
  expect_error([&] { validate_cuda_decode(p, DecodePlan{}, nullptr, 0); }, "16-byte aligned");
  p = good;
  p.q_stride_head = 132;
  p.q_stride_seq = 2048;
  expect_error([&] { validate_cuda_decode(p, DecodePlan{}, nullptr, 0); }, "multiples of 8");
  p = good;
  p.layout = KVLayout::nhd(good.layout.num_blocks, 16, 2, 96);
  expect_error([&] { validate_cuda_decode(p, DecodePlan{}, nullptr, 0); }, "64, 128 or 256");
  p = good;
  p.num_q_heads = 2 * 17;
  expect_error([&] { validate_cuda_decode(p, DecodePlan{}, nullptr, 0); }, "at most 16");
  const DecodePlan split{4, 64};
  const std::size_t need = decode_workspace_bytes(split, 2, 8, 128);
  alignas(16) static unsigned char workspace[1 << 17];
  ASSERT_LE(need, sizeof(workspace));
  EXPECT_NO_THROW(validate_cuda_decode(good, split, workspace, need));
  expect_error([&] { validate_cuda_decode(good, split, workspace, need - 1); }, "workspace of");
  expect_error([&] { validate_cuda_decode(good, split, nullptr, need); }, "workspace of");
  expect_error([&] { validate_cuda_decode(good, split, workspace + 4, need); }, "16-byte aligned");
  expect_error([&] { validate_cuda_decode(good, DecodePlan{0, 0}, nullptr, 0); }, "num_splits");
  {
    // Split-KV's merge grid (one CTA per sequence x query head in kTensorCoreWideMerge) must
    // fit, even where the attention grid (sequences x KV heads x splits) does.
    PagedDecodeParams many = good;
    many.num_seqs = 1 << 27;
    many.num_q_heads = 32;  // group 16 over the layout's 2 KV heads
    expect_error([&] { validate_cuda_decode(many, split, workspace, need); }, "merge states");
  }
  // paged_decode_attention itself checks first and throws before touching the device.
  p = good;
  p.layout = KVLayout::nhd(good.layout.num_blocks, 16, 2, 96);
  expect_error([&] { (void)paged_decode_attention(p, DecodePlan{}, nullptr, 0, nullptr); },
               "64, 128 or 256");
  // The same checks for the tensor-core variant, and an unknown variant is refused.
  expect_error(
      [&] {
        (void)paged_decode_attention(p, DecodePlan{}, nullptr, 0, nullptr,
                                     DecodeKernel::kTensorCore);
      },
      "64, 128 or 256");
  expect_error(
      [&] {
        (void)paged_decode_attention(good, DecodePlan{}, nullptr, 0, nullptr,
                                     static_cast<DecodeKernel>(7));
      },
      "unknown DecodeKernel");
  DecodePlanOptions options;
  expect_error(
      [&] {
        (void)decode_plan_options_for_current_device(KVDtype::kBFloat16, 96, &options,
                                                     DecodeKernel::kTensorCore);
      },
      "64, 128 or 256");
  // kTensorCoreFusedMerge with split-KV needs num_seqs x num_kv_heads = 4 aligned counters.
  alignas(16) static std::uint32_t counters[8];
  const auto fused = [&](DecodeSplitCounters c) {
    (void)paged_decode_attention(good, split, workspace, need, nullptr,
                                 DecodeKernel::kTensorCoreFusedMerge, c);
  };
  expect_error([&] { fused({}); }, "split counters for num_seqs x num_kv_heads = 4");
  expect_error([&] { fused({nullptr, 8}); }, "got none");
  expect_error([&] { fused({counters, 3}); }, "states, got 3");
  auto* odd = reinterpret_cast<std::uint32_t*>(reinterpret_cast<unsigned char*>(counters) + 2);
  expect_error([&] { fused({odd, 4}); }, "4-byte aligned");
  // Several query tokens per sequence: the tensor-core variants of a 16-bit cache, group x q_len
  // <= 16 rows, a split plan's chunks >= 16 tokens, and the workspace for q_len times the states.
  {
    PagedDecodeParams mq = good;  // group 4
    mq.q_len = 2;
    const std::size_t need2 = decode_workspace_bytes(split, 2, 8, 128, 2);
    ASSERT_LE(need2, sizeof(workspace));
    expect_error([&] { validate_cuda_decode(mq, split, workspace, need); }, "workspace of");
    EXPECT_NO_THROW(validate_cuda_decode(mq, split, workspace, need2));
    expect_error(
        [&] {
          (void)paged_decode_attention(mq, split, workspace, need2, nullptr, DecodeKernel::kSimt);
        },
        "not DecodeKernel::kSimt");
    PagedDecodeParams fp8 = mq;
    fp8.quant.mode = KVScaleMode::kPerTensor;
    expect_error(
        [&] {
          (void)paged_decode_attention(fp8, split, workspace, need2, nullptr,
                                       DecodeKernel::kTensorCoreFp8);
        },
        "not an FP8 cache");
    mq.q_len = 5;  // 4 x 5 = 20 rows
    expect_error(
        [&] {
          (void)paged_decode_attention(mq, DecodePlan{}, nullptr, 0, nullptr,
                                       DecodeKernel::kTensorCore);
        },
        "q_len x group = 5 x 4 exceeds 16");
    mq.q_len = 2;
    const DecodePlan small{4, 8};
    const std::size_t need_small = decode_workspace_bytes(small, 2, 8, 128, 2);
    ASSERT_LE(need_small, sizeof(workspace));
    expect_error(
        [&] {
          (void)paged_decode_attention(mq, small, workspace, need_small, nullptr,
                                       DecodeKernel::kTensorCoreWideMerge);
        },
        "kv_chunk_size >= 16");
    mq.q_stride_token = 8 * 128 + 4;  // not a multiple of 8 elements
    mq.q_stride_seq = 2 * (8 * 128 + 8);
    expect_error([&] { validate_cuda_decode(mq, DecodePlan{}, nullptr, 0); }, "multiples of 8");
  }
  // An empty batch needs none (nothing is launched: this returns before touching the device).
  PagedDecodeParams empty = good;
  empty.num_seqs = 0;
  for (const DecodeSplitCounters c : {DecodeSplitCounters{}, DecodeSplitCounters{odd, 0}}) {
    EXPECT_EQ(paged_decode_attention(empty, split, workspace, need, nullptr,
                                     DecodeKernel::kTensorCoreFusedMerge, c),
              cudaSuccess);
  }
}

TEST(CudaDecodeAttentionArguments, VariantCoverage) {
  DecodeShape s;
  s.num_seqs = 1;
  s.num_kv_heads = 2;
  s.num_q_heads = 8;
  s.head_dim = 128;
  s.seq_lens = {40};
  const auto pb = testing::make_decode_problem(s, 1);
  alignas(16) static std::uint16_t out[8 * 128];
  PagedDecodeParams p = pb.params(out);
  // The default since the H200 run of 2026-12-04, evening (bench/results/gpu.md).
  EXPECT_EQ(kDefaultDecodeKernel, DecodeKernel::kTensorCoreWideMerge);
  EXPECT_TRUE(decode_kernel_runs(p, DecodeKernel::kSimt));
  EXPECT_TRUE(decode_kernel_runs(p, DecodeKernel::kTensorCore));
  EXPECT_TRUE(decode_kernel_runs(p, DecodeKernel::kTensorCoreWideMerge));
  EXPECT_TRUE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFusedMerge));
  EXPECT_FALSE(decode_kernel_runs(p, static_cast<DecodeKernel>(7)));
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFp8));  // 16-bit: kTensorCore runs
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFp8Direct));
  // Several query tokens per sequence (group 4 here): the tensor-core variants, up to 16 rows.
  p.q_len = 4;
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kSimt));
  EXPECT_TRUE(decode_kernel_runs(p, DecodeKernel::kTensorCore));
  EXPECT_TRUE(decode_kernel_runs(p, DecodeKernel::kTensorCoreWideMerge));
  EXPECT_TRUE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFusedMerge));
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFp8));
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFp8Direct));
  p.q_len = 5;  // 20 rows
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kTensorCore));
  p.q_len = 1;
  p.quant.mode = KVScaleMode::kPerTensor;  // an FP8 cache: the FP8 kernel, either variant
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kTensorCore));
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kSimt));
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kTensorCoreWideMerge));
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFusedMerge));
  EXPECT_FALSE(decode_kernel_runs(p, static_cast<DecodeKernel>(7)));
  // ... except kTensorCoreFp8 and kTensorCoreFp8Direct, on layouts whose strides are multiples
  // of 16 bytes.
  EXPECT_TRUE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFp8));
  EXPECT_TRUE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFp8Direct));
  p.q_len = 2;  // several query tokens: 16-bit caches only
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFp8Direct));
  p.q_len = 1;
  p.layout.stride_head = p.layout.head_dim + 8;
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFp8));
  EXPECT_FALSE(decode_kernel_runs(p, DecodeKernel::kTensorCoreFp8Direct));
}

}  // namespace
}  // namespace pagedkv
