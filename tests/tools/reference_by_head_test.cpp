// bench/reference_by_head.hpp (the kernel benchmarks' after-timing checks): the CPU references
// run one KV head per thread give the single-call references' outputs bit for bit, over GQA
// groups, head_dims, block sizes, soft-cap, sliding windows and varlen batches; unsupported
// inputs are refused with a message naming the problem.
#include "reference_by_head.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "expect_error.hpp"
#include "kv_test_util.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/reference/decode_attention.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv {
namespace {

using testing::DecodeShape;

// Bit for bit: the same arithmetic per head, only the work split differs.
void expect_identical(const std::vector<double>& got, const std::vector<double>& want,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(double)), 0)
        << what << ": value " << i << " is " << got[i] << ", the reference's " << want[i];
  }
}

TEST(ReferenceByHead, DecodeEqualsTheSingleCallReference) {
  std::uint64_t seed = 1;
  int cases = 0;
  for (const std::int32_t kv_heads : {1, 2, 8}) {
    for (const std::int32_t group : {1, 4, 7}) {
      for (const std::int32_t head_dim : {64, 128}) {
        for (const std::int32_t block_size : {1, 16, 64}) {
          DecodeShape shape;
          shape.num_seqs = 4;
          shape.num_kv_heads = kv_heads;
          shape.num_q_heads = kv_heads * group;
          shape.head_dim = head_dim;
          shape.block_size = block_size;
          shape.seq_lens = {1, 77, 300, 16};
          shape.soft_cap = (seed % 3 == 0) ? 20.0f : 0.0f;
          shape.window_size = (seed % 4 == 1) ? 50 : 0;
          const auto pb = testing::make_decode_problem(shape, seed++);
          const PagedDecodeParams p = pb.params(nullptr);
          expect_identical(bench::decode_reference_by_kv_head(p),
                           reference_paged_decode_attention_f64(p), testing::describe(shape));
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 54);
  // Several query tokens per sequence (speculative decoding).
  for (const std::int32_t q_len : {2, 5}) {
    const std::vector<std::int32_t> q_lens(3, q_len);
    const auto pb = testing::make_extend_problem(
        testing::make_extend_shape(KVDtype::kBFloat16, 64, 2, 4, 16, {0, 30, 100}, q_lens), seed++);
    const PagedDecodeParams p = pb.decode_params();
    expect_identical(bench::decode_reference_by_kv_head(p), reference_paged_decode_attention_f64(p),
                     "q_len " + std::to_string(q_len));
  }
}

TEST(ReferenceByHead, ExtendEqualsTheSingleCallReference) {
  std::uint64_t seed = 100;
  for (const std::int32_t kv_heads : {1, 2, 8}) {
    for (const std::int32_t group : {1, 4}) {
      for (const std::int32_t block_size : {1, 16}) {
        auto shape = testing::make_extend_shape(KVDtype::kBFloat16, 64, kv_heads, group, block_size,
                                                {0, 37, 200, 5}, {40, 19, 1, 64});
        shape.cache.soft_cap = (seed % 2 == 0) ? 30.0f : 0.0f;
        shape.cache.window_size = (seed % 3 == 0) ? 33 : 0;
        const auto pb = testing::make_extend_problem(shape, seed++);
        const PagedExtendParams p = pb.params(nullptr);
        expect_identical(bench::extend_reference_by_kv_head(p),
                         reference_paged_extend_attention_f64(p).out, testing::describe(shape));
      }
    }
  }
}

TEST(ReferenceByHead, RefusesWhatItCannotSplit) {
  DecodeShape shape;
  shape.num_kv_heads = 2;
  shape.num_q_heads = 4;
  shape.seq_lens = {20};
  const auto pb = testing::make_decode_problem(shape, 7);
  PagedDecodeParams p = pb.params(nullptr);
  PagedDecodeParams strided = p;
  strided.q_stride_head = p.layout.head_dim;  // a stride given explicitly, even a dense one
  testing::expect_error([&] { (void)bench::decode_reference_by_kv_head(strided); },
                        ErrorCode::kInvalidArgument, "q must be dense");
  PagedDecodeParams hnd = p;
  hnd.layout = KVLayout::hnd(p.layout.num_blocks, p.layout.block_size, p.layout.num_kv_heads,
                             p.layout.head_dim);
  testing::expect_error([&] { (void)bench::decode_reference_by_kv_head(hnd); },
                        ErrorCode::kInvalidArgument, "not a packed NHD layout");
  PagedDecodeParams fp8 = p;
  fp8.quant.mode = KVScaleMode::kPerTensor;
  testing::expect_error([&] { (void)bench::decode_reference_by_kv_head(fp8); },
                        ErrorCode::kInvalidArgument, "FP8");
  PagedDecodeParams no_q = p;
  no_q.q = nullptr;
  testing::expect_error([&] { (void)bench::decode_reference_by_kv_head(no_q); },
                        ErrorCode::kInvalidArgument, "null");
}

}  // namespace
}  // namespace pagedkv
