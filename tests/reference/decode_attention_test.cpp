// The CPU reference of paged decode attention against an independent naive computation
// (gather into dense arrays, two-pass softmax) over many shapes, hand-checked cases, and bad input.
#include "pagedkv/reference/decode_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "kv_test_util.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/reference/extend_attention.hpp"

namespace pagedkv {
namespace {

using testing::DecodeShape;
using testing::LayoutKind;

// Both sides compute in double from the same 16-bit inputs: only summation order differs.
constexpr double kExactTolerance = 1e-12;

void expect_matches_naive(const DecodeShape& shape, std::uint64_t seed) {
  const auto pb = testing::make_decode_problem(shape, seed);
  const auto ref = reference_paged_decode_attention_f64(pb.params(nullptr));
  const auto naive = testing::naive_decode(pb);
  ASSERT_EQ(ref.size(), naive.size());
  for (const double x : ref) ASSERT_TRUE(std::isfinite(x)) << testing::describe(shape);
  EXPECT_LT(testing::relative_error(ref, naive), kExactTolerance) << testing::describe(shape);
}

TEST(DecodeAttentionReference, MatchesNaiveOverShapeGrid) {
  std::uint64_t seed = 1;
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    for (const std::int32_t head_dim : {64, 128, 256}) {
      for (const std::int32_t group : {1, 4, 16}) {
        for (const std::int32_t block_size : {1, 3, 16, 64}) {
          DecodeShape s;
          s.dtype = dtype;
          s.num_seqs = 3;
          s.num_kv_heads = 2;
          s.num_q_heads = 2 * group;
          s.head_dim = head_dim;
          s.block_size = block_size;
          s.seq_lens = {1, block_size * 2 + 1, 77};  // not block multiples (except bs 1)
          expect_matches_naive(s, seed++);
        }
      }
    }
  }
}

TEST(DecodeAttentionReference, MatchesNaiveOnRandomShapes) {
  std::mt19937_64 rng(42);
  const auto pick = [&](std::initializer_list<std::int32_t> values) {
    std::uniform_int_distribution<std::size_t> d(0, values.size() - 1);
    return *(values.begin() + static_cast<std::ptrdiff_t>(d(rng)));
  };
  for (int i = 0; i < 150; ++i) {
    DecodeShape s;
    s.dtype = pick({0, 1}) == 0 ? KVDtype::kFloat16 : KVDtype::kBFloat16;
    s.num_seqs = pick({1, 2, 5});
    s.num_kv_heads = pick({1, 2, 3});
    s.num_q_heads = s.num_kv_heads * pick({1, 2, 3, 5, 8, 16});
    s.head_dim = pick({8, 40, 64, 128, 256});
    s.block_size = pick({1, 2, 3, 7, 16, 32, 64, 256});
    s.kind = static_cast<LayoutKind>(pick({0, 1, 2, 3}));
    s.window_size = pick({0, 0, 1, 5, 40});
    s.soft_cap = pick({0, 0, 1}) == 1 ? 2.5f : 0.0f;
    s.value_range = s.soft_cap > 0 ? 4.0f : 1.0f;
    s.shuffle_blocks = pick({0, 1}) == 1;
    s.extra_table_columns = pick({0, 2});
    std::uniform_int_distribution<std::int32_t> len(0, 300);
    for (std::int32_t j = 0; j < s.num_seqs; ++j) s.seq_lens.push_back(len(rng));
    expect_matches_naive(s, 1000 + static_cast<std::uint64_t>(i));
  }
}

TEST(DecodeAttentionReference, WindowAndSoftCapMatchNaive) {
  for (const std::int32_t window : {1, 16, 17, 100, 1000}) {
    for (const float cap : {0.0f, 0.5f, 30.0f}) {
      DecodeShape s;
      s.num_seqs = 2;
      s.num_kv_heads = 2;
      s.num_q_heads = 8;
      s.head_dim = 64;
      s.block_size = 16;
      s.window_size = window;
      s.soft_cap = cap;
      s.value_range = 3.0f;
      s.seq_lens = {150, 40};
      expect_matches_naive(s, 7);
    }
  }
}

// Closed form: one head, two tokens, q = (a, 0, ...), k0 = (1, 0, ...), k1 = 0, scale 1:
// logits (a, 0), so out = (e^a v0 + v1) / (e^a + 1).
TEST(DecodeAttentionReference, HandComputedTwoTokens) {
  const KVDtype dtype = KVDtype::kFloat16;
  const KVLayout layout = KVLayout::nhd(1, 2, 1, 8);
  std::vector<std::uint16_t> k(16, 0), v(16, 0), q(8, 0), out(8, 0);
  const float a = 0.75f;
  q[0] = float_to_fp16_bits(a);
  k[0] = float_to_fp16_bits(1.0f);
  for (int d = 0; d < 8; ++d) {
    v[static_cast<std::size_t>(d)] = float_to_fp16_bits(static_cast<float>(d));
    v[static_cast<std::size_t>(8 + d)] = float_to_fp16_bits(-1.0f);
  }
  const std::int32_t table[1] = {0};
  const std::int32_t lens[1] = {2};
  PagedDecodeParams p;
  p.dtype = dtype;
  p.num_seqs = 1;
  p.num_q_heads = 1;
  p.q = q.data();
  p.k_cache = k.data();
  p.v_cache = v.data();
  p.layout = layout;
  p.block_table = table;
  p.max_blocks_per_seq = 1;
  p.seq_lens = lens;
  p.out = out.data();
  p.sm_scale = 1.0f;
  const auto exact = reference_paged_decode_attention_f64(p);
  const double w = std::exp(static_cast<double>(a));
  for (int d = 0; d < 8; ++d) {
    EXPECT_NEAR(exact[static_cast<std::size_t>(d)], (w * d - 1.0) / (w + 1.0), 1e-12) << d;
  }
  // With a window of 1 only the last token (v1 = -1) is attended.
  p.window_size = 1;
  for (const double x : reference_paged_decode_attention_f64(p)) EXPECT_DOUBLE_EQ(x, -1.0);
  // The rounded variant writes fp16.
  p.window_size = 0;
  reference_paged_decode_attention(p);
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(out[static_cast<std::size_t>(d)],
              float_to_fp16_bits(static_cast<float>((w * d - 1.0) / (w + 1.0))));
  }
}

TEST(DecodeAttentionReference, EmptySequenceGivesZerosAndNaNTailIsNeverRead) {
  DecodeShape s;
  s.num_seqs = 3;
  s.num_kv_heads = 1;
  s.num_q_heads = 2;
  s.head_dim = 64;
  s.block_size = 16;
  s.seq_lens = {0, 5, 16};
  s.extra_table_columns = 3;  // padding entries point at the all-NaN poison block
  const auto pb = testing::make_decode_problem(s, 3);
  const auto ref = reference_paged_decode_attention_f64(pb.params(nullptr));
  for (std::size_t i = 0; i < 2 * 64; ++i) EXPECT_EQ(ref[i], 0.0) << i;
  for (const double x : ref) EXPECT_TRUE(std::isfinite(x));
  EXPECT_LT(testing::relative_error(ref, testing::naive_decode(pb)), kExactTolerance);
}

TEST(DecodeAttentionReference, WritesStridedOutputRoundedToDtype) {
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    DecodeShape s;
    s.dtype = dtype;
    s.num_seqs = 2;
    s.num_kv_heads = 2;
    s.num_q_heads = 4;
    s.head_dim = 64;
    s.seq_lens = {33, 70};
    const auto pb = testing::make_decode_problem(s, 11);
    // Output rows 72 elements apart, sequences 400 apart; the gaps must stay untouched.
    std::vector<std::uint16_t> out(800, 0xabcd);
    PagedDecodeParams p = pb.params(out.data());
    p.out_stride_head = 72;
    p.out_stride_seq = 400;
    reference_paged_decode_attention(p);
    const auto exact = reference_paged_decode_attention_f64(p);
    for (std::size_t i = 0; i < out.size(); ++i) {
      const std::size_t seq = i / 400;
      const std::size_t head = (i % 400) / 72;
      const std::size_t d = (i % 400) % 72;
      if (seq < 2 && head < 4 && d < 64) {
        const double want = exact[(seq * 4 + head) * 64 + d];
        EXPECT_EQ(out[i], float_to_dtype_bits(dtype, static_cast<float>(want))) << i;
      } else {
        EXPECT_EQ(out[i], 0xabcd) << i;
      }
    }
  }
}

// ---- bad input ----

struct BadInputFixture {
  testing::HostDecodeProblem pb;
  std::vector<std::uint16_t> out;
  BadInputFixture() {
    DecodeShape s;
    s.num_seqs = 2;
    s.num_kv_heads = 2;
    s.num_q_heads = 4;
    s.head_dim = 64;
    s.block_size = 16;
    s.seq_lens = {20, 40};
    pb = testing::make_decode_problem(s, 5);
    out.assign(2 * 4 * 64, 0x1234);
  }
};

void expect_error(const PagedDecodeParams& p, ErrorCode code, const std::string& fragment) {
  testing::expect_error([&] { reference_paged_decode_attention(p); }, code, fragment);
}

// Decode with q_len query tokens per sequence (speculative decoding) is extend attention with
// those tokens new: the same cache (their K/V appended), the same q rows. The two references are
// written independently, so each checks the other.
testing::HostExtendProblem several_tokens_problem(std::int32_t kv_heads, std::int32_t group,
                                                  std::int32_t block_size, std::int32_t q_len,
                                                  const std::vector<std::int32_t>& prefixes,
                                                  std::uint64_t seed) {
  const std::vector<std::int32_t> q_lens(prefixes.size(), q_len);
  return testing::make_extend_problem(
      testing::make_extend_shape(KVDtype::kBFloat16, 64, kv_heads, group, block_size, prefixes,
                                 q_lens),
      seed);
}

TEST(DecodeAttentionReference, SeveralQueryTokensEqualExtendWithThoseTokensNew) {
  std::uint64_t seed = 300;
  int cases = 0;
  for (const std::int32_t q_len : {1, 2, 3, 4, 7}) {
    for (const std::int32_t group : {1, 4}) {
      for (const std::int32_t block_size : {1, 16}) {
        for (const std::int32_t window : {0, 5, 40}) {
          for (const float cap : {0.0f, 20.0f}) {
            auto pb = several_tokens_problem(2, group, block_size, q_len, {0, 1, 37, 120}, seed);
            pb.shape.cache.window_size = window;
            pb.cache.shape.window_size = window;
            pb.shape.cache.soft_cap = cap;
            pb.cache.shape.soft_cap = cap;
            const PagedDecodeParams d = pb.decode_params();
            const auto decode = reference_paged_decode_attention_f64(d);
            const auto extend = reference_paged_extend_attention_f64(pb.params(nullptr)).out;
            ASSERT_EQ(decode.size(), extend.size());
            for (const double x : decode) ASSERT_TRUE(std::isfinite(x));
            EXPECT_LT(testing::relative_error(decode, extend), 1e-12)
                << "q_len " << q_len << " group " << group << " block " << block_size << " window "
                << window << " cap " << cap;
            ++seed;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 120);
}

TEST(DecodeAttentionReference, SeveralQueryTokensAreCausalAmongThemselves) {
  // Token i sees exactly one key more than token i - 1: changing the last key's value changes
  // only the last query token's output.
  auto pb = several_tokens_problem(1, 2, 16, 3, {10}, 7);
  const PagedDecodeParams d = pb.decode_params();
  const auto before = reference_paged_decode_attention_f64(d);
  const std::int32_t last = 10 + 3 - 1;  // position of the last query token
  const std::int32_t block = pb.cache.seq_blocks[0][static_cast<std::size_t>(last / 16)];
  for (std::int32_t dim = 0; dim < 64; ++dim) {
    // The buffer index HostDecodeProblem::value reads.
    const auto at =
        static_cast<std::size_t>(pb.cache.addressing.offset(true, block, last % 16, 0, dim));
    pb.cache.v_buffer[at] = float_to_dtype_bits(KVDtype::kBFloat16, 0.75f);
  }
  const auto after = reference_paged_decode_attention_f64(pb.decode_params());
  const std::size_t token = 2 * 64;  // [q_len = 3][heads = 2][64]
  for (std::size_t i = 0; i < before.size(); ++i) {
    if (i < 2 * token) {
      EXPECT_EQ(before[i], after[i]) << "value " << i << " of tokens 0 and 1";
    }
  }
  double changed = 0.0;
  for (std::size_t i = 2 * token; i < before.size(); ++i) {
    changed = std::max(changed, std::abs(before[i] - after[i]));
  }
  EXPECT_GT(changed, 1e-6);
}

TEST(DecodeAttentionReference, SeveralQueryTokensStridedAndShortSequences) {
  // q and out with gaps between tokens and sequences give the dense result; a sequence shorter
  // than q_len gives zeros for the tokens that have no position.
  auto pb = several_tokens_problem(2, 2, 16, 3, {5, 30}, 11);
  PagedDecodeParams dense = pb.decode_params();
  const auto want = reference_paged_decode_attention_f64(dense);
  const std::int64_t row = 4 * 64;  // num_q_heads x head_dim
  std::vector<std::uint16_t> q(2 * 3 * (row + 64) + 2 * 128, 0);
  for (std::int64_t s = 0; s < 2; ++s) {
    for (std::int64_t i = 0; i < 3; ++i) {
      for (std::int64_t x = 0; x < row; ++x) {
        q[static_cast<std::size_t>(s * (3 * (row + 64) + 128) + i * (row + 64) + x)] =
            pb.q[static_cast<std::size_t>((s * 3 + i) * row + x)];
      }
    }
  }
  PagedDecodeParams strided = dense;
  strided.q = q.data();
  strided.q_stride_token = row + 64;
  strided.q_stride_seq = 3 * (row + 64) + 128;
  std::vector<std::uint16_t> out(q.size(), 0x1234);
  strided.out = out.data();
  strided.out_stride_token = row + 64;
  strided.out_stride_seq = 3 * (row + 64) + 128;
  reference_paged_decode_attention(strided);
  for (std::int64_t s = 0; s < 2; ++s) {
    for (std::int64_t i = 0; i < 3; ++i) {
      for (std::int64_t x = 0; x < row; ++x) {
        const double got = dtype_bits_to_float(
            KVDtype::kBFloat16,
            out[static_cast<std::size_t>(s * (3 * (row + 64) + 128) + i * (row + 64) + x)]);
        const double exact = want[static_cast<std::size_t>((s * 3 + i) * row + x)];
        EXPECT_NEAR(got, exact, 1e-2 * (std::abs(exact) + 1e-3));
      }
      // The gap after each token is not written.
      EXPECT_EQ(out[static_cast<std::size_t>(s * (3 * (row + 64) + 128) + i * (row + 64) + row)],
                0x1234);
    }
  }
  // Sequence 0 with 2 cached tokens and q_len 3: token 0 has position -1 (no keys): zeros;
  // tokens 1 and 2 see 1 and 2 keys.
  std::vector<std::int32_t> lens = {2, 33};
  PagedDecodeParams shorter = dense;
  shorter.seq_lens = lens.data();
  const auto got = reference_paged_decode_attention_f64(shorter);
  for (std::int64_t x = 0; x < row; ++x) EXPECT_EQ(got[static_cast<std::size_t>(x)], 0.0);
  double token1 = 0.0;
  for (std::int64_t x = row; x < 2 * row; ++x) {
    token1 = std::max(token1, std::abs(got[static_cast<std::size_t>(x)]));
  }
  EXPECT_GT(token1, 0.0);
}

TEST(DecodeAttentionReference, RejectsBadParameters) {
  BadInputFixture f;
  const PagedDecodeParams good = f.pb.params(f.out.data());
  EXPECT_NO_THROW(validate(good));

  testing::expect_rejects_bad_paged_kv(
      good, [](const PagedDecodeParams& p) { reference_paged_decode_attention(p); });
  PagedDecodeParams p = good;
  p.q = nullptr;
  expect_error(p, ErrorCode::kInvalidArgument, "q is null");
  p = good;
  p.out = nullptr;
  expect_error(p, ErrorCode::kInvalidArgument, "out is null");
  p = good;
  p.q_stride_head = 32;  // rows of 64 would overlap
  expect_error(p, ErrorCode::kInvalidArgument, "overlap");
  p = good;
  p.q_len = 0;
  expect_error(p, ErrorCode::kInvalidArgument, "q_len must be in [1, 64], got 0");
  p.q_len = kMaxDecodeQueryLen + 1;
  expect_error(p, ErrorCode::kInvalidArgument, "q_len must be in [1, 64], got 65");
  p = good;
  p.q_len = 2;
  p.q_stride_token = 3 * 64;  // 4 heads of 64 per token would run into the next token
  expect_error(p, ErrorCode::kInvalidArgument, "overlap");
  p = good;
  p.q_len = 2;
  p.out_stride_seq = 4 * 64;  // one token's worth per sequence: the second token overlaps
  expect_error(p, ErrorCode::kInvalidArgument, "overlap");
  // Nothing was written by any failed call.
  for (const auto x : f.out) EXPECT_EQ(x, 0x1234);
}

TEST(DecodeAttentionReference, RejectsStridesThatOverflow) {
  // Strides whose spans wrap past INT64_MAX once passed the overlap checks (4 heads 2^62 apart
  // made a token's span negative) and the reference and the kernels indexed far outside q.
  BadInputFixture f;
  const PagedDecodeParams good = f.pb.params(f.out.data());
  const auto expect_overflow = [](const PagedDecodeParams& p) {
    testing::expect_error([&] { validate(p); }, ErrorCode::kInvalidArgument, "overflow");
  };
  PagedDecodeParams p = good;
  p.q_len = 2;
  p.q_stride_head = std::int64_t{1} << 62;
  expect_overflow(p);
  p = good;
  p.out_stride_token = std::int64_t{1} << 62;  // 3 tokens x 2^62
  p.q_len = 4;
  expect_overflow(p);
  p = good;
  p.q_stride_seq = std::numeric_limits<std::int64_t>::max() / 2 + 8;  // the 2nd seq's rows fit
  EXPECT_NO_THROW(validate(p));
  p.q_stride_seq = std::numeric_limits<std::int64_t>::max() - 8;  // they end past INT64_MAX
  expect_overflow(p);
  for (const auto x : f.out) EXPECT_EQ(x, 0x1234);
}

TEST(DecodeAttentionReference, RejectsBadDeviceData) {
  BadInputFixture f;
  const PagedDecodeParams good = f.pb.params(f.out.data());
  // A sequence longer than its table row.
  std::vector<std::int32_t> lens = {20, 16 * good.max_blocks_per_seq + 1};
  PagedDecodeParams p = good;
  p.seq_lens = lens.data();
  expect_error(p, ErrorCode::kOutOfRange, "needs");
  lens = {-1, 40};
  expect_error(p, ErrorCode::kInvalidArgument, "negative length");
  // A block id outside the pool.
  auto table = f.pb.table.block_ids;
  table[0] = static_cast<std::int32_t>(good.layout.num_blocks);
  p = good;
  p.block_table = table.data();
  expect_error(p, ErrorCode::kOutOfRange, "outside the pool");
  for (const auto x : f.out) EXPECT_EQ(x, 0x1234);
}

}  // namespace
}  // namespace pagedkv
