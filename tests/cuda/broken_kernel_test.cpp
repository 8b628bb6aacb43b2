// The GPU tests' per-row comparison fails kernels that are wrong by one key. This program links
// pagedkv_cuda_drop_key: the decode and extend kernels built with PAGEDKV_TEST_DROP_KEY=100, so
// key position 100 of every sequence is left out (tests/CMakeLists.txt); the decode check runs
// for the decode variants (kernels/decode_attention.cu, kernels/decode_attention_tc.cu and, over an
// FP8 cache, kernels/decode_attention_tc_fp8.cu), the
// extend check for the extend variants (kernels/extend_attention.cu and
// kernels/extend_attention_fa2.cu, the latter also with a split over keys, the sm_90a ones, and
// over an FP8 cache kernels/extend_attention_fa2_fp8.cu). It
// passes only when the check the real GPU tests use (testing::check_rows, 1e-2 per row for bf16,
// 2e-3 for fp16) rejects exactly the rows that should see key 100 and accepts the others; the
// whole-batch Frobenius error the tests used before is printed for comparison (for the bf16 decode
// batch it stays under 1e-2, i.e. the old check passed this broken kernel). Every case runs
// head_dim 128: the broken library is built for no other (PAGEDKV_CUDA_HEAD_DIMS' mechanism,
// tests/CMakeLists.txt), which the host suite below checks (the only suite here that needs no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda_attention_test_util.hpp"
#include "cuda_test_util.hpp"
#include "expect_error.hpp"
#include "kv_test_util.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/cuda/extend_attention.hpp"
#include "pagedkv/cuda/head_dims.hpp"
#include "pagedkv/device/kv_quant.hpp"
#include "pagedkv/reference/cache_ops.hpp"
#include "pagedkv/reference/decode_attention.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv {
namespace {

double tolerance(KVDtype dtype) {
  return dtype == KVDtype::kBFloat16 ? 1e-2 : 2e-3;
}

// ---- host side: a build with head dimensions left out (no device needed) ----

// pagedkv_cuda_drop_key compiles its kernels for head_dim 128 alone
// (kernels/internal/head_dims.hpp with PAGEDKV_CUDA_HEAD_DIM_64=0 and PAGEDKV_CUDA_HEAD_DIM_256=0,
// what PAGEDKV_CUDA_HEAD_DIMS=128 gives the library): every entry point refuses 64 and 256 before
// anything is enqueued, saying they are left out of the build rather than unsupported, and
// accepts 128.
TEST(CudaBrokenKernelArguments, HeadDimsLeftOutOfTheBuildAreRefusedByName) {
  EXPECT_TRUE(cuda_head_dim_compiled(128));
  for (const int head_dim : {0, 32, 64, 96, 192, 256, 512}) {
    EXPECT_FALSE(cuda_head_dim_compiled(head_dim)) << head_dim;
  }
  alignas(16) static std::uint16_t out[58 * 8 * 256];
  alignas(16) static float lse[58 * 8];
  alignas(16) static unsigned char workspace[1 << 18];
  for (const int head_dim : {64, 128, 256, 96}) {
    SCOPED_TRACE(head_dim);
    const std::string refusal = head_dim == 96
                                    ? std::string("head_dim must be 64, 128 or 256, got 96")
                                    : "head_dim " + std::to_string(head_dim) +
                                          " is not compiled into this build of pagedkv::cuda "
                                          "(PAGEDKV_CUDA_HEAD_DIMS: 128)";
    const auto refused = [&](auto&& call) {
      if (head_dim == 128) {
        EXPECT_NO_THROW(call());
      } else {
        testing::expect_error(call, ErrorCode::kInvalidArgument, refusal);
      }
    };
    testing::DecodeShape s;
    s.num_seqs = 2;
    s.num_kv_heads = 2;
    s.num_q_heads = 8;
    s.head_dim = head_dim;
    s.seq_lens = {40, 50};
    const auto pb = testing::make_decode_problem(s, 1);
    const PagedDecodeParams decode = pb.params(out);
    const DecodePlan split{4, 64};
    const std::size_t need = decode_workspace_bytes(split, 2, 8, head_dim);
    ASSERT_LE(need, sizeof(workspace));
    refused([&] { validate_cuda_decode(decode, DecodePlan{}, nullptr, 0); });
    refused([&] { validate_cuda_decode(decode, split, workspace, need); });
    if (head_dim != 128) {
      // The launch entry points check first (at 128 they would launch: a GPU test's business).
      for (const DecodeKernel kernel :
           {DecodeKernel::kSimt, DecodeKernel::kTensorCore, DecodeKernel::kTensorCoreWideMerge}) {
        refused(
            [&] { (void)paged_decode_attention(decode, split, workspace, need, nullptr, kernel); });
      }
      // The planners too (each refuses before it asks the device anything).
      for (const DecodeKernel kernel :
           {DecodeKernel::kSimt, DecodeKernel::kTensorCore, DecodeKernel::kTensorCoreFp8Direct}) {
        DecodePlanOptions options;
        refused([&] {
          (void)decode_plan_options_for_current_device(KVDtype::kBFloat16, head_dim, &options,
                                                       kernel);
        });
      }
    }
    const testing::ExtendShape es =
        testing::make_extend_shape(KVDtype::kBFloat16, head_dim, 2, 4, 16, {40, 0}, {8, 50});
    const auto epb = testing::make_extend_problem(es, 1);
    const PagedExtendParams extend = epb.params(out, lse);
    refused([&] { validate_cuda_extend(extend); });
    if (head_dim != 128) {
      for (const ExtendKernel kernel : {ExtendKernel::kMma16, ExtendKernel::kFa2}) {
        refused([&] { (void)paged_extend_attention(extend, nullptr, kernel); });
      }
      ExtendSplitPlan plan;
      refused(
          [&] { (void)extend_split_plan_for_current_device(extend, ExtendKernel::kFa2, &plan); });
    }
  }
}

class CudaBrokenKernel : public testing::GpuTest {};

// Every decode variant (kSimt, kTensorCore, kTensorCoreWideMerge, the default, and
// kTensorCoreFusedMerge) is built broken.
TEST_F(CudaBrokenKernel, PerRowCheckRejectsDecodeWithoutKey100) {
  for (const DecodeKernel kernel :
       {DecodeKernel::kSimt, DecodeKernel::kTensorCore, DecodeKernel::kTensorCoreWideMerge,
        DecodeKernel::kTensorCoreFusedMerge}) {
    for (const KVDtype dtype : {KVDtype::kBFloat16, KVDtype::kFloat16}) {
      for (const DecodePlan plan : {DecodePlan{}, DecodePlan{5, 37}}) {
        testing::DecodeShape s;
        s.dtype = dtype;
        s.num_seqs = 3;
        s.num_kv_heads = 2;
        s.num_q_heads = 8;
        s.head_dim = 128;
        s.block_size = 16;
        s.seq_lens = {1, 190, 50};  // only the 190-token sequence has a key 100
        const auto pb = testing::make_decode_problem(s, 3);
        const auto ref = reference_paged_decode_attention_f64(pb.params(nullptr));
        testing::DeviceDecodeProblem dev(pb);
        const std::size_t ws_bytes = decode_workspace_bytes(plan, 3, 8, 128);
        testing::DeviceBuffer workspace(ws_bytes);
        testing::DeviceBuffer counters(3 * 2 * sizeof(std::uint32_t));  // (sequence, KV head)
        PAGEDKV_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
        PAGEDKV_CUDA_CHECK(paged_decode_attention(dev.params(pb), plan, workspace.get(), ws_bytes,
                                                  nullptr, kernel,
                                                  {counters.get<std::uint32_t>(), 3 * 2}));
        const auto out = testing::to_doubles(
            dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
        const double tol = tolerance(dtype);
        const testing::RowCheck all = testing::check_rows(out, ref, 128, tol);
        std::printf(
            "decode %s %s splits=%d: whole-batch Frobenius error %.4g (old check: %s), worst "
            "row %.4g, %zu of %zu rows rejected\n",
            kernel == DecodeKernel::kSimt                  ? "simt"
            : kernel == DecodeKernel::kTensorCore          ? "tensor-core"
            : kernel == DecodeKernel::kTensorCoreWideMerge ? "tensor-core-wide-merge"
                                                           : "tensor-core-fused-merge",
            std::string(to_string(dtype)).c_str(), plan.num_splits, all.frobenius,
            all.frobenius < tol ? "passed" : "failed", all.max_row_error, all.bad_rows, all.rows);
        const std::span<const double> o(out);
        const std::span<const double> r(ref);
        EXPECT_TRUE(testing::rows_match(o.subspan(0, 1024), r.subspan(0, 1024), 128, tol));
        EXPECT_TRUE(testing::rows_match(o.subspan(2048, 1024), r.subspan(2048, 1024), 128, tol));
        const testing::RowCheck broken =
            testing::check_rows(o.subspan(1024, 1024), r.subspan(1024, 1024), 128, tol);
        EXPECT_GT(broken.bad_rows, 0u) << "the per-row check missed the dropped key";
      }
    }
  }
}

// Every extend variant is built broken: kMma16, kFa2 without and with a split over keys (3
// splits: the dropped key sits in one split's partial rows), kWgmma without and with 3 splits
// (variants 4 and 5; its sm_90a kernel on compute capability 9.0, else its kFa2 fallback) and
// kWgmmaPipelined, kWgmmaWarpSpecialized, kWgmmaWarpSpecializedPingPong and
// kWgmmaWarpSpecializedPersistent (on 2 CTAs, so each runs several items) without and with 3
// splits (variants 6-7, 8-9, 10-11 and 12-13), and kFa2LeanSoftmax without and with 3 splits
// (14-15).
TEST_F(CudaBrokenKernel, PerRowCheckRejectsExtendWithoutKey100) {
  for (const int variant : {0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}) {
    for (const KVDtype dtype : {KVDtype::kBFloat16, KVDtype::kFloat16}) {
      // Sequence 1's new tokens sit at positions 150..189 and see key 100; the others do not.
      const testing::ExtendShape s =
          testing::make_extend_shape(dtype, 128, 2, 4, 16, {0, 150, 30}, {1, 40, 20});
      const auto pb = testing::make_extend_problem(s, 5);
      const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
      testing::DeviceExtendProblem dev(pb);
      ExtendSplitPlan plan;
      plan.num_splits = variant >= 3 && variant % 2 == 1 ? 3 : 1;
      plan.persistent_ctas = variant == 12 || variant == 13 ? 2 : 0;
      const testing::DeviceBuffer workspace(extend_workspace_bytes(dev.params(pb), plan));
      PAGEDKV_CUDA_CHECK(
          paged_extend_attention(dev.params(pb), nullptr,
                                 variant == 0    ? ExtendKernel::kMma16
                                 : variant >= 14 ? ExtendKernel::kFa2LeanSoftmax
                                 : variant >= 12 ? ExtendKernel::kWgmmaWarpSpecializedPersistent
                                 : variant >= 10 ? ExtendKernel::kWgmmaWarpSpecializedPingPong
                                 : variant >= 8  ? ExtendKernel::kWgmmaWarpSpecialized
                                 : variant >= 6  ? ExtendKernel::kWgmmaPipelined
                                 : variant >= 4  ? ExtendKernel::kWgmma
                                                 : ExtendKernel::kFa2,
                                 plan, workspace.get(), workspace.bytes()));
      PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
      const auto out =
          testing::to_doubles(dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
      const double tol = tolerance(dtype);
      const testing::RowCheck all = testing::check_rows(out, ref.out, 128, tol);
      std::printf(
          "extend (%s, %d splits) %s: whole-batch Frobenius error %.4g, worst row %.4g, %zu of %zu "
          "rows "
          "rejected\n",
          variant == 0    ? "mma16"
          : variant >= 14 ? "fa2-lean-softmax"
          : variant >= 12 ? "wgmma-warp-specialized-persistent"
          : variant >= 10 ? "wgmma-warp-specialized-ping-pong"
          : variant >= 8  ? "wgmma-warp-specialized"
          : variant >= 6  ? "wgmma-pipelined"
          : variant >= 4  ? "wgmma"
                          : "fa2",
          plan.num_splits, std::string(to_string(dtype)).c_str(), all.frobenius, all.max_row_error,
          all.bad_rows, all.rows);
      const std::size_t row = 8 * 128;  // one token's heads
      const std::span<const double> o(out);
      const std::span<const double> r(ref.out);
      EXPECT_TRUE(testing::rows_match(o.subspan(0, row), r.subspan(0, row), 128, tol));
      EXPECT_TRUE(testing::rows_match(o.subspan(41 * row, 20 * row), r.subspan(41 * row, 20 * row),
                                      128, tol));
      const testing::RowCheck broken =
          testing::check_rows(o.subspan(row, 40 * row), r.subspan(row, 40 * row), 128, tol);
      EXPECT_GT(broken.bad_rows, 0u)
          << "the per-row check missed the dropped key (variant " << variant << ")";
    }
  }
}

// An FP8 cache (the given scale mode and format) of three sequences, 1, 190 and 50 tokens (only the
// 190-token one has key 100), written by the host FP8 append; its host planes and device copies.
struct Fp8Cache {
  static constexpr std::int32_t kKvHeads = 2, kQHeads = 8, kHeadDim = 128, kBlockSize = 16;
  std::vector<std::int32_t> lens = {1, 190, 50};
  std::int32_t max_blocks = (190 + kBlockSize - 1) / kBlockSize;
  KVLayout layout;
  KVQuant quant;
  std::vector<std::int32_t> table;
  std::vector<std::uint8_t> k_plane, v_plane;
  testing::DeviceBuffer dk, dv, dtable, dlens;

  Fp8Cache(KVScaleMode mode, KVDtype format) {
    const std::int64_t num_blocks = 3 * max_blocks;
    layout = mode == KVScaleMode::kPerTokenHead
                 ? KVLayout::nhd_scaled(num_blocks, kBlockSize, kKvHeads, kHeadDim)
                 : KVLayout::nhd(num_blocks, kBlockSize, kKvHeads, kHeadDim);
    quant.mode = mode;
    quant.dtype = format;
    quant.k_scale = 0.01f;
    quant.v_scale = 0.01f;
    // Sequence s uses blocks s x max_blocks ..; its rows come from the host FP8 append.
    table.assign(3 * static_cast<std::size_t>(max_blocks), 0);
    std::vector<std::int64_t> slots;
    for (std::size_t s = 0; s < lens.size(); ++s) {
      for (std::int32_t b = 0; b < max_blocks; ++b) {
        table[s * static_cast<std::size_t>(max_blocks) + static_cast<std::size_t>(b)] =
            static_cast<std::int32_t>(s) * max_blocks + b;
      }
      for (std::int32_t t = 0; t < lens[s]; ++t) {
        slots.push_back((static_cast<std::int64_t>(s) * max_blocks + t / kBlockSize) * kBlockSize +
                        t % kBlockSize);
      }
    }
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    const std::size_t values = slots.size() * kKvHeads * kHeadDim;
    std::vector<std::uint16_t> key(values), value(values);
    for (auto& x : key) x = float_to_bf16_bits(unit(rng));
    for (auto& x : value) x = float_to_bf16_bits(unit(rng));
    const auto plane = static_cast<std::size_t>(layout.plane_elements());
    k_plane.assign(plane, 0);
    v_plane.assign(plane, 0);
    KVAppendParams a;
    a.dtype = KVDtype::kBFloat16;
    a.quant = quant;
    a.num_tokens = static_cast<std::int64_t>(slots.size());
    a.key = key.data();
    a.value = value.data();
    a.slot_mapping = slots.data();
    a.k_cache = k_plane.data();
    a.v_cache = v_plane.data();
    a.layout = layout;
    reference_kv_append(a);
    dk = testing::upload(k_plane);
    dv = testing::upload(v_plane);
    dtable = testing::upload(table);
    dlens = testing::upload(lens);
  }

  // The host view (host planes, table and lengths), bf16 q / out, sm_scale 1/8.
  void host_kv(PagedKVParams* kv) const {
    kv->dtype = KVDtype::kBFloat16;
    kv->quant = quant;
    kv->num_seqs = static_cast<std::int32_t>(lens.size());
    kv->num_q_heads = kQHeads;
    kv->k_cache = k_plane.data();
    kv->v_cache = v_plane.data();
    kv->layout = layout;
    kv->block_table = table.data();
    kv->max_blocks_per_seq = max_blocks;
    kv->seq_lens = lens.data();
    kv->sm_scale = 0.125f;
  }
  // The device view of the same.
  void device_kv(PagedKVParams* kv) const {
    host_kv(kv);
    kv->k_cache = dk.get();
    kv->v_cache = dv.get();
    kv->block_table = dtable.get<std::int32_t>();
    kv->seq_lens = dlens.get<std::int32_t>();
  }
};

// The FP8 caches the two tests below break: both scale modes in both formats (the tensor-core
// kernels are instantiated per format: kTensorCoreFp8Direct has one kernel per format).
constexpr std::pair<KVScaleMode, KVDtype> kFp8Cases[] = {
    {KVScaleMode::kPerTokenHead, KVDtype::kFp8E4M3},
    {KVScaleMode::kPerTensor, KVDtype::kFp8E4M3},
    {KVScaleMode::kPerTokenHead, KVDtype::kFp8E5M2},
    {KVScaleMode::kPerTensor, KVDtype::kFp8E5M2}};

// DecodeKernel::kTensorCoreFp8 and kTensorCoreFp8Direct (kernels/decode_attention_tc_fp8.cu) are
// built broken too: the FP8
// decode check of tests/cuda/fp8_test.cpp (1e-2 per row against the reference over the same FP8
// cache) must reject the rows that should see key 100, with and without split-KV. (The FP8
// CUDA-core kernel, kernels/fp8_attention.cu, has no such switch.)
TEST_F(CudaBrokenKernel, PerRowCheckRejectsFp8TensorCoreDecodeWithoutKey100) {
  constexpr std::int32_t head_dim = Fp8Cache::kHeadDim;
  for (const auto& [mode, format] : kFp8Cases) {
    const Fp8Cache cache(mode, format);
    std::mt19937_64 rng(8);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::vector<std::uint16_t> q(cache.lens.size() * Fp8Cache::kQHeads * head_dim);
    for (auto& x : q) x = float_to_bf16_bits(unit(rng));
    PagedDecodeParams hp;
    cache.host_kv(&hp);
    hp.q = q.data();
    const std::vector<double> ref = reference_paged_decode_attention_f64(hp);

    const testing::DeviceBuffer dq = testing::upload(q);
    testing::DeviceBuffer dout(q.size() * 2);
    PagedDecodeParams dp = hp;
    cache.device_kv(&dp);
    dp.q = dq.get();
    dp.out = dout.get();
    for (const DecodeKernel kernel :
         {DecodeKernel::kTensorCoreFp8, DecodeKernel::kTensorCoreFp8Direct}) {
      for (const DecodePlan plan : {DecodePlan{}, DecodePlan{5, 37}}) {
        const std::size_t ws_bytes =
            decode_workspace_bytes(plan, dp.num_seqs, Fp8Cache::kQHeads, head_dim);
        testing::DeviceBuffer workspace(ws_bytes);
        PAGEDKV_CUDA_CHECK(
            paged_decode_attention(dp, plan, workspace.get(), ws_bytes, nullptr, kernel));
        const auto out = testing::to_doubles(
            KVDtype::kBFloat16, testing::download<std::uint16_t>(dout.get(), q.size()));
        const testing::RowCheck all = testing::check_rows(out, ref, head_dim, 1e-2);
        std::printf(
            "decode tensor-core-fp8%s %s %s splits=%d: worst row %.4g, %zu of %zu rows rejected\n",
            kernel == DecodeKernel::kTensorCoreFp8Direct ? "-direct" : "",
            std::string(to_string(format)).c_str(), std::string(to_string(mode)).c_str(),
            plan.num_splits, all.max_row_error, all.bad_rows, all.rows);
        const std::span<const double> o(out);
        const std::span<const double> r(ref);
        EXPECT_TRUE(testing::rows_match(o.subspan(0, 1024), r.subspan(0, 1024), head_dim, 1e-2));
        EXPECT_TRUE(
            testing::rows_match(o.subspan(2048, 1024), r.subspan(2048, 1024), head_dim, 1e-2));
        const testing::RowCheck broken =
            testing::check_rows(o.subspan(1024, 1024), r.subspan(1024, 1024), head_dim, 1e-2);
        EXPECT_GT(broken.bad_rows, 0u) << "the FP8 per-row check missed the dropped key";
      }
    }
  }
}

// ExtendKernel::kFa2Fp8 (kernels/extend_attention_fa2_fp8.cu) likewise, without and with 3 splits
// over keys: the 190-token sequence's 40 new tokens (positions 150..189) see key 100, the 1 and
// 20 new tokens of the others do not; the FP8 extend check of tests/cuda/fp8_test.cpp (1e-2 per
// row) must reject some of the 40 and accept the others.
TEST_F(CudaBrokenKernel, PerRowCheckRejectsFp8TensorCoreExtendWithoutKey100) {
  constexpr std::int32_t head_dim = Fp8Cache::kHeadDim;
  const std::vector<std::int32_t> indptr = {0, 1, 41, 61};
  for (const auto& [mode, format] : kFp8Cases) {
    const Fp8Cache cache(mode, format);
    std::mt19937_64 rng(9);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::vector<std::uint16_t> q(61 * Fp8Cache::kQHeads * head_dim);
    for (auto& x : q) x = float_to_bf16_bits(unit(rng));
    PagedExtendParams hp;
    cache.host_kv(&hp);
    hp.q_indptr = indptr.data();
    hp.max_q_len = 40;
    hp.q = q.data();
    const ExtendReference ref = reference_paged_extend_attention_f64(hp);

    const testing::DeviceBuffer dq = testing::upload(q), dindptr = testing::upload(indptr);
    testing::DeviceBuffer dout(q.size() * 2);
    PagedExtendParams dp = hp;
    cache.device_kv(&dp);
    dp.q_indptr = dindptr.get<std::int32_t>();
    dp.q = dq.get();
    dp.out = dout.get();
    ASSERT_TRUE(extend_kernel_runs(dp, ExtendKernel::kFa2Fp8));
    for (const std::int32_t splits : {1, 3}) {
      ExtendSplitPlan plan;
      plan.num_splits = splits;
      const std::size_t ws_bytes = extend_workspace_bytes(dp, plan);
      testing::DeviceBuffer workspace(std::max<std::size_t>(ws_bytes, 16));
      PAGEDKV_CUDA_CHECK(paged_extend_attention(dp, nullptr, ExtendKernel::kFa2Fp8, plan,
                                                workspace.get(), ws_bytes));
      PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
      const auto out = testing::to_doubles(KVDtype::kBFloat16,
                                           testing::download<std::uint16_t>(dout.get(), q.size()));
      const testing::RowCheck all = testing::check_rows(out, ref.out, head_dim, 1e-2);
      std::printf(
          "extend tensor-core-fp8 %s %s splits=%d: worst row %.4g, %zu of %zu rows rejected\n",
          std::string(to_string(format)).c_str(), std::string(to_string(mode)).c_str(), splits,
          all.max_row_error, all.bad_rows, all.rows);
      const std::size_t row = Fp8Cache::kQHeads * head_dim;  // one token's heads
      const std::span<const double> o(out);
      const std::span<const double> r(ref.out);
      EXPECT_TRUE(testing::rows_match(o.subspan(0, row), r.subspan(0, row), head_dim, 1e-2));
      EXPECT_TRUE(testing::rows_match(o.subspan(41 * row, 20 * row), r.subspan(41 * row, 20 * row),
                                      head_dim, 1e-2));
      const testing::RowCheck broken =
          testing::check_rows(o.subspan(row, 40 * row), r.subspan(row, 40 * row), head_dim, 1e-2);
      EXPECT_GT(broken.bad_rows, 0u) << "the FP8 extend per-row check missed the dropped key";
    }
  }
}

}  // namespace
}  // namespace pagedkv
