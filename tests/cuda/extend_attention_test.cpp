// CUDA paged extend attention against the CPU reference on fresh random inputs: both dtypes,
// head_dim 64/128/256, GQA groups 1..16, block sizes 1/16/64 (and odd ones), shuffled block
// tables, NaN-poisoned unused slots, every layout kind; plain causal prefill, a cached prefix
// ending mid-block, new tokens spanning several blocks, one new token (also against CUDA decode
// attention), sliding window, soft-cap, the log-sum-exp output, a device-side kv_append first,
// long prompts with many query tiles, strided q/out, CUDA-graph capture.
// Relative error ||out - ref|| / ||ref|| must stay within 1e-2 (bf16) or 2e-3 (fp16).
//
// Without a GPU every device test skips; the host-side argument checks still run.
#include "pagedkv/cuda/extend_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "kv_test_util.hpp"
#include "pagedkv/cuda/cache_ops.hpp"
#include "pagedkv/cuda/decode_attention.hpp"
#include "pagedkv/base/error.hpp"

namespace pagedkv {
namespace {

using testing::DeviceBuffer;
using testing::ExtendShape;
using testing::LayoutKind;

double tolerance(KVDtype dtype) {
  return dtype == KVDtype::kBFloat16 ? 1e-2 : 2e-3;
}
// Absolute, on natural-log values of order 1..10: fp32 softmax sums of exactly the same inputs.
constexpr double kLseTolerance = 1e-3;

// The problem's buffers on the device.
struct DeviceExtendProblem {
  DeviceBuffer k;
  DeviceBuffer v;  // empty for kInterleaved (V lives in k)
  DeviceBuffer q;
  DeviceBuffer q_indptr;
  DeviceBuffer table;
  DeviceBuffer lens;
  DeviceBuffer out;
  DeviceBuffer lse;

  explicit DeviceExtendProblem(const testing::HostExtendProblem& pb)
      : k(testing::upload(pb.cache.k_buffer)),
        v(testing::upload(pb.cache.v_buffer)),
        q(testing::upload(pb.q)),
        q_indptr(testing::upload(pb.q_indptr)),
        table(testing::upload(pb.cache.table.block_ids)),
        lens(testing::upload(pb.shape.cache.seq_lens)),
        out(pb.q.size() * sizeof(std::uint16_t)),
        lse(static_cast<std::size_t>(pb.num_q_tokens()) *
            static_cast<std::size_t>(pb.shape.cache.num_q_heads) * sizeof(float)) {}

  void* v_plane(const testing::HostExtendProblem& pb) const {
    return (pb.shape.cache.kind == LayoutKind::kInterleaved ? k.get<std::uint16_t>()
                                                            : v.get<std::uint16_t>()) +
           pb.cache.v_plane_offset;
  }

  PagedExtendParams params(const testing::HostExtendProblem& pb, bool with_lse = true) const {
    PagedExtendParams p = pb.params(out.get(), with_lse ? lse.get<float>() : nullptr);
    p.q = q.get();
    p.q_indptr = q_indptr.get<std::int32_t>();
    p.k_cache = k.get();
    p.v_cache = v_plane(pb);
    p.block_table = table.get<std::int32_t>();
    p.seq_lens = lens.get<std::int32_t>();
    return p;
  }
};

struct CaseError {
  double out = INFINITY;
  double lse = INFINITY;  // max absolute error
};

CaseError compare(const testing::HostExtendProblem& pb, const DeviceExtendProblem& dev,
                  const ExtendReference& ref) {
  const KVDtype dtype = pb.shape.cache.dtype;
  const auto out =
      testing::to_doubles(dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      ADD_FAILURE() << "non-finite output at " << i << " (read past seq_len?) "
                    << testing::describe(pb.shape);
      return {};
    }
  }
  const auto lse = testing::download<float>(dev.lse.get(), ref.lse.size());
  CaseError err;
  err.out = testing::relative_error(out, ref.out);
  err.lse = 0.0;
  for (std::size_t i = 0; i < lse.size(); ++i) {
    err.lse = std::max(err.lse, std::abs(static_cast<double>(lse[i]) - ref.lse[i]));
  }
  if (std::isnan(err.lse)) err.lse = INFINITY;
  return err;
}

// Runs one case and returns its errors against the CPU reference.
CaseError run_case(const ExtendShape& shape, std::uint64_t seed) {
  const auto pb = testing::make_extend_problem(shape, seed);
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  DeviceExtendProblem dev(pb);
  testing::cuda_check(paged_extend_attention(dev.params(pb), nullptr), "paged_extend_attention");
  testing::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return compare(pb, dev, ref);
}

void expect_case(const ExtendShape& shape, std::uint64_t seed) {
  const CaseError err = run_case(shape, seed);
  EXPECT_LT(err.out, tolerance(shape.cache.dtype)) << testing::describe(shape);
  EXPECT_LT(err.lse, kLseTolerance) << testing::describe(shape);
}

class CudaExtendAttention : public testing::GpuTest {};

// Per case: a plain causal prefill, a prefix ending mid-block, new tokens spanning several blocks
// from a block boundary, and one new token after a long prefix, batched together (varlen).
TEST_F(CudaExtendAttention, MatchesReferenceOverDtypesDimsGroupsBlockSizes) {
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

TEST_F(CudaExtendAttention, MatchesReferenceOnRandomShapesAndLayouts) {
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

TEST_F(CudaExtendAttention, SlidingWindowAndSoftCap) {
  std::uint64_t seed = 70;
  for (const std::int32_t window : {1, 16, 17, 64, 65, 130, 5000}) {
    for (const float cap : {0.0f, 30.0f}) {
      for (const std::int32_t head_dim : {64, 256}) {
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

// Long prompts: many query tiles per sequence (scheduled heaviest first), GQA 8, 0-50% cached.
TEST_F(CudaExtendAttention, LongPromptsWithCachedPrefixes) {
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    ExtendShape s =
        testing::make_extend_shape(dtype, 128, 2, 8, 16, {0, 1000, 777}, {2048, 1048, 1});
    expect_case(s, 123);
  }
}

// One new token per sequence: extend equals decode attention of that token, CUDA against CUDA.
TEST_F(CudaExtendAttention, OneNewTokenAgreesWithCudaDecode) {
  std::uint64_t seed = 300;
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    for (const std::int32_t head_dim : {64, 128, 256}) {
      ExtendShape s =
          testing::make_extend_shape(dtype, head_dim, 2, 4, 16, {0, 17, 64, 1300}, {1, 1, 1, 1});
      s.cache.window_size = head_dim == 128 ? 100 : 0;
      const auto pb = testing::make_extend_problem(s, seed++);
      DeviceExtendProblem dev(pb);
      PAGEDKV_CUDA_CHECK(paged_extend_attention(dev.params(pb), nullptr));
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
      EXPECT_LT(testing::relative_error(extend_out, decode), tolerance(dtype))
          << testing::describe(s);
      const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
      EXPECT_LT(testing::relative_error(extend_out, ref.out), tolerance(dtype));
    }
  }
}

// The engine's order of operations on the device: kv_append the new tokens into their (NaN)
// slots, then extend attention; without the append the new slots would poison every row.
TEST_F(CudaExtendAttention, AfterDeviceKvAppend) {
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
  PAGEDKV_CUDA_CHECK(paged_extend_attention(dev.params(pb), nullptr));
  reference_kv_append(pb.append_params());  // the host copy catches up
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  const CaseError err = compare(pb, dev, ref);
  EXPECT_LT(err.out, tolerance(s.cache.dtype));
  EXPECT_LT(err.lse, kLseTolerance);
}

TEST_F(CudaExtendAttention, EmptySequencesAndNoLse) {
  ExtendShape s =
      testing::make_extend_shape(KVDtype::kFloat16, 64, 2, 2, 16, {10, 0, 33, 0}, {0, 0, 70, 5});
  const auto pb = testing::make_extend_problem(s, 19);
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  DeviceExtendProblem dev(pb);
  PAGEDKV_CUDA_CHECK(cudaMemset(dev.lse.get(), 0x7f, dev.lse.bytes()));
  PAGEDKV_CUDA_CHECK(paged_extend_attention(dev.params(pb, /*with_lse=*/false), nullptr));
  const auto out = testing::to_doubles(
      s.cache.dtype, testing::download<std::uint16_t>(dev.out.get(), pb.q.size()));
  EXPECT_LT(testing::relative_error(out, ref.out), tolerance(s.cache.dtype));
  for (const std::uint32_t bits :
       testing::download<std::uint32_t>(dev.lse.get(), dev.lse.bytes() / 4)) {
    ASSERT_EQ(bits, 0x7f7f7f7fu);  // untouched
  }
  // An empty batch and a batch of empty sequences launch nothing.
  PagedExtendParams p = dev.params(pb);
  p.num_seqs = 0;
  PAGEDKV_CUDA_CHECK(paged_extend_attention(p, nullptr));
  p = dev.params(pb);
  p.max_q_len = 0;
  PAGEDKV_CUDA_CHECK(paged_extend_attention(p, nullptr));
  PAGEDKV_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_F(CudaExtendAttention, StridedQueryAndOutput) {
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
  PAGEDKV_CUDA_CHECK(cudaMemset(out.get(), 0, out.bytes()));
  PagedExtendParams p = dev.params(pb);
  p.q = q.get();
  p.q_stride_token = 1024;
  p.q_stride_head = 72;
  p.out = out.get();
  p.out_stride_token = 800;
  p.out_stride_head = 96;
  PAGEDKV_CUDA_CHECK(paged_extend_attention(p, nullptr));
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
  EXPECT_LT(testing::relative_error(dense, ref.out), tolerance(s.cache.dtype));
  EXPECT_EQ(got[64], 0);  // the gap after head 0 is untouched
}

// A captured graph replays correctly when the batch's data (lengths, offsets) change on the
// device within the captured max_q_len.
TEST_F(CudaExtendAttention, GraphCaptureAndReplay) {
  ExtendShape s =
      testing::make_extend_shape(KVDtype::kBFloat16, 128, 2, 4, 16, {300, 0}, {200, 260});
  s.extra_max_q_len = 40;
  auto pb = testing::make_extend_problem(s, 31);
  DeviceExtendProblem dev(pb);
  cudaStream_t stream = nullptr;
  PAGEDKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  PAGEDKV_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launched = paged_extend_attention(dev.params(pb), stream);
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
    const CaseError err = compare(pb, dev, ref);
    EXPECT_LT(err.out, tolerance(s.cache.dtype)) << "replay " << replay;
    EXPECT_LT(err.lse, kLseTolerance) << "replay " << replay;
  }
  PAGEDKV_CUDA_CHECK(cudaGraphExecDestroy(exec));
  PAGEDKV_CUDA_CHECK(cudaGraphDestroy(graph));
  PAGEDKV_CUDA_CHECK(cudaStreamDestroy(stream));
}

// ---- host-side argument checks: no device needed ----

template <typename Fn>
void expect_error(Fn&& fn, const std::string& fragment) {
  try {
    fn();
    ADD_FAILURE() << "expected pagedkv::Error containing '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(CudaExtendAttentionArguments, RejectedOnTheHostBeforeAnyLaunch) {
  const ExtendShape s =
      testing::make_extend_shape(KVDtype::kBFloat16, 128, 2, 4, 16, {40, 0}, {8, 50});
  const auto pb = testing::make_extend_problem(s, 1);
  alignas(16) static std::uint16_t out[58 * 8 * 128];
  alignas(16) static float lse[58 * 8 + 1];
  const PagedExtendParams good = pb.params(out, lse);
  EXPECT_NO_THROW(validate_cuda_extend(good));

  PagedExtendParams p = good;
  p.q = static_cast<const std::uint16_t*>(good.q) + 1;
  expect_error([&] { validate_cuda_extend(p); }, "16-byte aligned");
  p = good;
  p.out = out + 4;
  expect_error([&] { validate_cuda_extend(p); }, "16-byte aligned");
  p = good;
  p.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(lse) + 2);
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

}  // namespace
}  // namespace pagedkv
