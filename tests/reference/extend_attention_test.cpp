// The CPU reference of paged extend attention against an independent naive computation (dense
// K/V by position with the new tokens taken from their rows, explicit visible lists, two-pass
// softmax) over many shapes; agreement with the decode reference for one new token;
// hand-computed cases; bad input.
#include "pagedkv/reference/extend_attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "internal/extend_attention_tiles.hpp"
#include "kv_test_util.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/reference/decode_attention.hpp"

namespace pagedkv {
namespace {

using testing::DecodeShape;
using testing::ExtendShape;
using testing::LayoutKind;

// Both sides compute in double from the same 16-bit inputs: only summation order differs.
constexpr double kExactTolerance = 1e-12;

void expect_matches_naive(const ExtendShape& shape, std::uint64_t seed) {
  const auto pb = testing::make_extend_problem(shape, seed);
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  const auto naive = testing::naive_extend(pb);
  ASSERT_EQ(ref.out.size(), naive.out.size());
  ASSERT_EQ(ref.lse.size(), naive.lse.size());
  for (const double x : ref.out) ASSERT_TRUE(std::isfinite(x)) << testing::describe(shape);
  for (const double x : ref.lse) ASSERT_TRUE(std::isfinite(x)) << testing::describe(shape);
  EXPECT_LT(testing::relative_error(ref.out, naive.out), kExactTolerance)
      << testing::describe(shape);
  EXPECT_LT(testing::relative_error(ref.lse, naive.lse), kExactTolerance)
      << testing::describe(shape);
}

// Per block size: a plain causal prefill, a prefix ending mid-block, new tokens spanning several
// blocks from a block boundary, and a single new token after a long prefix.
TEST(ExtendAttentionReference, MatchesNaiveOverShapeGrid) {
  std::uint64_t seed = 1;
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    for (const std::int32_t head_dim : {64, 128, 256}) {
      for (const std::int32_t group : {1, 4}) {
        for (const std::int32_t bs : {1, 16, 64}) {
          const ExtendShape s = testing::make_extend_shape(
              dtype, head_dim, 2, group, bs, {0, 37, 2 * bs, 90}, {21, 19, 2 * bs + 5, 1});
          expect_matches_naive(s, seed++);
        }
      }
    }
  }
}

TEST(ExtendAttentionReference, MatchesNaiveOnRandomShapes) {
  std::mt19937_64 rng(42);
  const auto pick = [&](std::initializer_list<std::int32_t> values) {
    std::uniform_int_distribution<std::size_t> d(0, values.size() - 1);
    return *(values.begin() + static_cast<std::ptrdiff_t>(d(rng)));
  };
  for (int i = 0; i < 120; ++i) {
    ExtendShape s;
    DecodeShape& c = s.cache;
    c.dtype = pick({0, 1}) == 0 ? KVDtype::kFloat16 : KVDtype::kBFloat16;
    c.num_seqs = pick({1, 2, 4});
    c.num_kv_heads = pick({1, 2});
    c.num_q_heads = c.num_kv_heads * pick({1, 2, 3, 8});
    c.head_dim = pick({8, 64, 128});
    c.block_size = pick({1, 3, 16, 64});
    c.kind = static_cast<LayoutKind>(pick({0, 1, 2, 3}));
    c.window_size = pick({0, 0, 1, 7, 50});
    c.soft_cap = pick({0, 0, 1}) == 1 ? 2.5f : 0.0f;
    c.value_range = c.soft_cap > 0 ? 4.0f : 1.0f;
    c.shuffle_blocks = pick({0, 1}) == 1;
    c.extra_table_columns = pick({0, 2});
    s.extra_max_q_len = pick({0, 5});
    std::uniform_int_distribution<std::int32_t> prefix(0, 120);
    std::uniform_int_distribution<std::int32_t> new_tokens(0, 70);
    for (std::int32_t j = 0; j < c.num_seqs; ++j) {
      const std::int32_t q_len = new_tokens(rng);
      s.q_lens.push_back(q_len);
      c.seq_lens.push_back(prefix(rng) + q_len);
    }
    expect_matches_naive(s, 1000 + static_cast<std::uint64_t>(i));
  }
}

TEST(ExtendAttentionReference, SlidingWindowAndSoftCapMatchNaive) {
  for (const std::int32_t window : {1, 5, 16, 17, 1000}) {
    for (const float cap : {0.0f, 0.5f, 30.0f}) {
      ExtendShape s =
          testing::make_extend_shape(KVDtype::kBFloat16, 64, 2, 4, 16, {45, 0, 16}, {30, 40, 1});
      s.cache.window_size = window;
      s.cache.soft_cap = cap;
      s.cache.value_range = 3.0f;
      expect_matches_naive(s, 7);
    }
  }
}

// With one new token per sequence, extend attention is decode attention of that token.
TEST(ExtendAttentionReference, OneNewTokenAgreesWithDecode) {
  std::uint64_t seed = 300;
  for (const std::int32_t window : {0, 1, 33}) {
    for (const std::int32_t bs : {1, 16, 64}) {
      for (const std::int32_t head_dim : {64, 128, 256}) {
        ExtendShape s = testing::make_extend_shape(KVDtype::kFloat16, head_dim, 2, 4, bs,
                                                   {0, 17, 64, 130}, {1, 1, 1, 1});
        s.cache.window_size = window;
        s.cache.soft_cap = window == 1 ? 0.0f : 5.0f;
        const auto pb = testing::make_extend_problem(s, seed++);
        const auto extend = reference_paged_extend_attention_f64(pb.params(nullptr));
        PagedDecodeParams d = pb.cache.params(nullptr);
        d.q = pb.q.data();  // one row per sequence: the decode query layout
        const auto decode = reference_paged_decode_attention_f64(d);
        ASSERT_EQ(extend.out.size(), decode.size());
        EXPECT_LT(testing::relative_error(extend.out, decode), kExactTolerance)
            << testing::describe(s);
      }
    }
  }
}

// Closed forms. Prefill without a prefix: new token 0 sees only itself, so its output is v_0 and
// its log-sum-exp is its own logit. With window 1 every token is in that situation.
TEST(ExtendAttentionReference, FirstTokenOfAPrefillSeesOnlyItself) {
  for (const std::int32_t window : {0, 1}) {
    ExtendShape s = testing::make_extend_shape(KVDtype::kBFloat16, 64, 1, 2, 16, {0}, {20});
    s.cache.window_size = window;
    const auto pb = testing::make_extend_problem(s, 9);
    const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
    const std::int32_t rows_checked = window == 1 ? 20 : 1;
    for (std::int32_t j = 0; j < rows_checked; ++j) {
      for (std::int32_t h = 0; h < 2; ++h) {
        const auto row = static_cast<std::size_t>(j * 2 + h);
        double dot = 0.0;
        for (std::size_t d = 0; d < 64; ++d) {
          EXPECT_EQ(ref.out[row * 64 + d],
                    bf16_bits_to_float(pb.new_v[static_cast<std::size_t>(j) * 64 + d]));
          dot += static_cast<double>(bf16_bits_to_float(pb.q[row * 64 + d])) *
                 bf16_bits_to_float(pb.new_k[static_cast<std::size_t>(j) * 64 + d]);
        }
        EXPECT_NEAR(ref.lse[row], static_cast<double>(pb.cache.sm_scale) * dot, 1e-12);
      }
    }
  }
}

// The log-sum-exp makes partial results mergeable. In a prefill whose new tokens all share one
// query, the last token sees keys [0, n); with a window of w it sees [n - w, n), and token
// n - w - 1 sees [0, n - w). Merging those two partial results with their lse must give the full
// row: out = sum_k e^(lse_k - L) out_k, L = log sum_k e^lse_k.
TEST(ExtendAttentionReference, LogSumExpMergesPartialResults) {
  const std::int32_t n = 50;
  const std::int32_t w = 20;
  ExtendShape s = testing::make_extend_shape(KVDtype::kFloat16, 64, 1, 1, 16, {0}, {n});
  auto pb = testing::make_extend_problem(s, 13);
  // Give every new token the same query, so rows differ only by what they see.
  for (std::size_t j = 1; j < static_cast<std::size_t>(n); ++j) {
    std::copy(pb.q.begin(), pb.q.begin() + 64, pb.q.begin() + static_cast<std::ptrdiff_t>(j * 64));
  }
  const auto full = reference_paged_extend_attention_f64(pb.params(nullptr));
  PagedExtendParams windowed = pb.params(nullptr);
  windowed.window_size = w;
  const auto part = reference_paged_extend_attention_f64(windowed);
  const std::size_t last = n - 1;       // sees [0, n) fully, [n - w, n) windowed
  const std::size_t early = n - w - 1;  // sees [0, n - w) fully
  const double la = part.lse[last];
  const double lb = full.lse[early];
  const double l_all = std::log(std::exp(la) + std::exp(lb));
  EXPECT_NEAR(full.lse[last], l_all, 1e-12);
  for (std::size_t d = 0; d < 64; ++d) {
    const double merged = std::exp(la - l_all) * part.out[last * 64 + d] +
                          std::exp(lb - l_all) * full.out[early * 64 + d];
    EXPECT_NEAR(full.out[last * 64 + d], merged, 1e-12) << d;
  }
}

// NaN sits in every slot no sequence uses and in the poison block the table's padding names; the
// new tokens' slots hold NaN until the append. So a finite output shows that nothing past
// seq_len is read, and a NaN output before the append shows the new slots are read.
TEST(ExtendAttentionReference, ReadsAppendedSlotsAndNothingPastTheEnd) {
  ExtendShape s =
      testing::make_extend_shape(KVDtype::kBFloat16, 64, 2, 2, 16, {21, 0, 5}, {7, 16, 40});
  s.cache.extra_table_columns = 3;
  const auto appended = testing::make_extend_problem(s, 17);
  const auto ref = reference_paged_extend_attention_f64(appended.params(nullptr));
  for (const double x : ref.out) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LT(testing::relative_error(ref.out, testing::naive_extend(appended).out), kExactTolerance);

  const auto not_appended = testing::make_extend_problem(s, 17, /*append=*/false);
  const auto stale = reference_paged_extend_attention_f64(not_appended.params(nullptr));
  for (const double x : stale.out) EXPECT_TRUE(std::isnan(x));
}

TEST(ExtendAttentionReference, EmptySequencesAndBatch) {
  ExtendShape s =
      testing::make_extend_shape(KVDtype::kFloat16, 64, 1, 2, 16, {10, 0, 33}, {0, 0, 4});
  const auto pb = testing::make_extend_problem(s, 19);
  const auto ref = reference_paged_extend_attention_f64(pb.params(nullptr));
  EXPECT_EQ(ref.out.size(), 4u * 2 * 64);
  EXPECT_LT(testing::relative_error(ref.out, testing::naive_extend(pb).out), kExactTolerance);
  PagedExtendParams p = pb.params(nullptr);
  p.num_seqs = 0;
  p.q_indptr = nullptr;
  EXPECT_TRUE(reference_paged_extend_attention_f64(p).out.empty());
  EXPECT_NO_THROW(reference_paged_extend_attention(p));
}

TEST(ExtendAttentionReference, WritesStridedOutputAndLseRoundedToDtype) {
  for (const KVDtype dtype : {KVDtype::kFloat16, KVDtype::kBFloat16}) {
    ExtendShape s = testing::make_extend_shape(dtype, 64, 2, 2, 16, {9, 30}, {3, 2});
    const auto pb = testing::make_extend_problem(s, 11);
    // Output rows 72 elements apart, tokens 400 apart; the gaps must stay untouched.
    std::vector<std::uint16_t> out(5 * 400, 0xabcd);
    std::vector<float> lse(5 * 4, -1.0f);
    PagedExtendParams p = pb.params(out.data(), lse.data());
    p.out_stride_head = 72;
    p.out_stride_token = 400;
    reference_paged_extend_attention(p);
    const auto exact = reference_paged_extend_attention_f64(p);
    for (std::size_t i = 0; i < out.size(); ++i) {
      const std::size_t token = i / 400;
      const std::size_t head = (i % 400) / 72;
      const std::size_t d = (i % 400) % 72;
      if (head < 4 && d < 64) {
        const double want = exact.out[(token * 4 + head) * 64 + d];
        EXPECT_EQ(out[i], float_to_dtype_bits(dtype, static_cast<float>(want))) << i;
      } else {
        EXPECT_EQ(out[i], 0xabcd) << i;
      }
    }
    for (std::size_t i = 0; i < lse.size(); ++i) {
      EXPECT_EQ(lse[i], static_cast<float>(exact.lse[i])) << i;
    }
  }
}

// ---- the CUDA kernel's work decomposition (kernels/internal/extend_attention_tiles.hpp) ----

// Every valid row of every query tile finds all the keys it may see inside the tile's key range,
// the range is tight, and a key tile declared mask-free is entirely visible to every row and holds
// no key past the range (those are zero-filled on the GPU).
TEST(ExtendAttentionTiles, CoverExactlyTheVisibleKeys) {
  constexpr int kRows = 64;
  for (const int group : {1, 2, 3, 5, 8, 16}) {
    for (const int q_len : {0, 1, 2, 7, 63, 64, 65, 130, 300}) {
      for (const int prefix : {0, 1, 15, 100}) {
        for (const int window : {0, 1, 7, 64, 65, 200}) {
          const std::string where = "group " + std::to_string(group) + " q_len " +
                                    std::to_string(q_len) + " prefix " + std::to_string(prefix) +
                                    " window " + std::to_string(window);
          const int tiles = detail::extend_num_tiles(q_len, group, kRows);
          ASSERT_EQ(tiles * kRows >= q_len * group, true) << where;
          ASSERT_LT((tiles - 1) * kRows, std::max(1, q_len * group)) << where;
          for (int t = 0; t < tiles; ++t) {
            const auto g = detail::extend_tile_geometry(q_len, prefix, group, window, t, kRows);
            ASSERT_LE(g.kv_begin, g.kv_end) << where;
            ASSERT_LE(g.kv_end, prefix + q_len) << where;
            int first_pos = -1;
            int last_pos = -1;
            for (int r = g.row0; r < g.row0 + kRows; ++r) {
              const int token = r / group;
              if (token >= q_len) continue;
              const int pos = prefix + token;
              if (first_pos < 0) first_pos = pos;
              last_pos = pos;
              ASSERT_GE(pos, g.pos_lo) << where;
              ASSERT_LE(pos, g.pos_hi) << where;
              for (int key = 0; key <= pos + 3; ++key) {  // key positions are >= 0
                const bool visible = key <= pos && (window == 0 || pos - key < window);
                ASSERT_EQ(detail::extend_key_visible(pos, key, window), visible) << where;
                if (visible) {
                  ASSERT_GE(key, g.kv_begin) << where << " tile " << t;
                  ASSERT_LT(key, g.kv_end) << where << " tile " << t;
                }
              }
            }
            ASSERT_EQ(first_pos, g.pos_lo) << where;
            ASSERT_EQ(last_pos, g.pos_hi) << where;
            // Tight: the first key is seen by the first token, the last by the last token.
            EXPECT_TRUE(detail::extend_key_visible(g.pos_lo, g.kv_begin, window)) << where;
            EXPECT_TRUE(detail::extend_key_visible(g.pos_hi, g.kv_end - 1, window)) << where;
            for (const int keys : {32, 64}) {
              for (int key0 = g.kv_begin; key0 < g.kv_end; key0 += keys) {
                if (detail::extend_tile_needs_mask(g, key0, keys, window)) continue;
                ASSERT_LE(key0 + keys, g.kv_end) << where;
                for (int pos = g.pos_lo; pos <= g.pos_hi; ++pos) {
                  for (int key = key0; key < key0 + keys; ++key) {
                    ASSERT_TRUE(detail::extend_key_visible(pos, key, window)) << where;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

// ---- bad input ----

struct BadInputFixture {
  testing::HostExtendProblem pb;
  std::vector<std::uint16_t> out;
  BadInputFixture() {
    pb = testing::make_extend_problem(
        testing::make_extend_shape(KVDtype::kBFloat16, 64, 2, 2, 16, {20, 0}, {5, 24}), 5);
    out.assign(29 * 4 * 64, 0x1234);
  }
};

void expect_error(const PagedExtendParams& p, ErrorCode code, const std::string& fragment) {
  testing::expect_error([&] { reference_paged_extend_attention(p); }, code, fragment);
}

TEST(ExtendAttentionReference, RejectsBadParameters) {
  BadInputFixture f;
  const PagedExtendParams good = f.pb.params(f.out.data());
  EXPECT_NO_THROW(validate(good));

  testing::expect_rejects_bad_paged_kv(
      good, [](const PagedExtendParams& p) { reference_paged_extend_attention(p); });
  PagedExtendParams p = good;
  p.q_indptr = nullptr;
  expect_error(p, ErrorCode::kInvalidArgument, "q_indptr is null");
  p = good;
  p.q = nullptr;
  expect_error(p, ErrorCode::kInvalidArgument, "q is null");
  p = good;
  p.out = nullptr;
  expect_error(p, ErrorCode::kInvalidArgument, "out is null");
  p = good;
  p.max_q_len = -1;
  expect_error(p, ErrorCode::kInvalidArgument, "max_q_len");
  p = good;
  p.q_stride_head = 32;  // rows of 64 would overlap
  expect_error(p, ErrorCode::kInvalidArgument, "overlap");
  p = good;
  p.out_stride_token = 64;  // the next token's row would start inside this one's heads
  expect_error(p, ErrorCode::kInvalidArgument, "overlap");
  p = good;
  p.q_stride_token = -256;
  expect_error(p, ErrorCode::kInvalidArgument, "negative");
  for (const auto x : f.out) EXPECT_EQ(x, 0x1234);  // nothing written by any failed call
}

TEST(ExtendAttentionReference, RejectsStridesThatOverflow) {
  // Strides whose spans wrap past INT64_MAX once passed the overlap check (4 heads 2^62 apart
  // made a token's span negative) and the reference and the kernels indexed far outside q.
  BadInputFixture f;
  const PagedExtendParams good = f.pb.params(f.out.data());
  const auto expect_overflow = [](const PagedExtendParams& p) {
    testing::expect_error([&] { validate(p); }, ErrorCode::kInvalidArgument, "overflow");
  };
  PagedExtendParams p = good;
  p.q_stride_head = std::int64_t{1} << 62;
  expect_overflow(p);
  p = good;
  // One token's rows fit, but the batch's 2 x max_q_len tokens 2^60 apart do not.
  p.out_stride_token = std::int64_t{1} << 60;
  expect_overflow(p);
  for (const auto x : f.out) EXPECT_EQ(x, 0x1234);
}

TEST(ExtendAttentionReference, RejectsBadDeviceData) {
  BadInputFixture f;
  const PagedExtendParams good = f.pb.params(f.out.data());
  PagedExtendParams p = good;
  std::vector<std::int32_t> indptr = {1, 5, 29};
  p.q_indptr = indptr.data();
  expect_error(p, ErrorCode::kInvalidArgument, "q_indptr[0] must be 0");
  indptr = {0, 6, 5};
  expect_error(p, ErrorCode::kInvalidArgument, "decreases");
  p = good;
  p.max_q_len = 23;  // sequence 1 has 24 new tokens
  expect_error(p, ErrorCode::kOutOfRange, "more than max_q_len");
  std::vector<std::int32_t> lens = {25, 23};  // 24 new tokens need a KV length >= 24
  p = good;
  p.seq_lens = lens.data();
  expect_error(p, ErrorCode::kOutOfRange, "append the new K/V first");
  lens = {25, 16 * good.max_blocks_per_seq + 1};
  expect_error(p, ErrorCode::kOutOfRange, "needs");
  auto table = f.pb.cache.table.block_ids;
  table[0] = static_cast<std::int32_t>(good.layout.num_blocks);
  p = good;
  p.block_table = table.data();
  expect_error(p, ErrorCode::kOutOfRange, "outside the pool");
  for (const auto x : f.out) EXPECT_EQ(x, 0x1234);
}

// The host-side check an engine runs on its metadata before uploading it for the CUDA kernel
// (which cannot read it on the host): q_len > max_q_len and q_len > seq_len are clear errors.
TEST(ExtendAttentionMetadata, RejectsWhatTheKernelWouldClampOnTheHost) {
  const KVLayout layout = KVLayout::nhd(10, 16, 2, 64);
  const std::vector<std::int32_t> table = {1, 2, 3, 0, 4, 5, 6, 7};  // 2 sequences x 4 blocks
  const auto check = [&](const std::vector<std::int32_t>& indptr, std::int32_t max_q_len,
                         const std::vector<std::int32_t>& lens,
                         const std::vector<std::int32_t>& ids = {}) {
    validate_extend_metadata(indptr, max_q_len, lens, ids.empty() ? table : ids, 4, 16,
                             layout.num_blocks);
  };
  EXPECT_NO_THROW(check({0, 5, 29}, 24, {40, 64}));
  EXPECT_NO_THROW(check({0, 0, 0}, 0, {0, 0}));
  const auto expect = [](auto&& fn, ErrorCode code, const std::string& fragment) {
    try {
      fn();
      ADD_FAILURE() << "expected an error containing '" << fragment << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  // q_len > max_q_len: sequence 1 has 24 new tokens.
  expect(
      [&] {
        check({0, 5, 29}, 23, {40, 64});
      },
      ErrorCode::kOutOfRange, "sequence 1 has 24 new tokens, more than max_q_len = 23");
  // q_len > seq_len: sequence 0 has 5 new tokens but only 4 in the cache.
  expect(
      [&] {
        check({0, 5, 29}, 24, {4, 64});
      },
      ErrorCode::kOutOfRange, "sequence 0 has 5 new tokens but a KV length of only 4");
  expect(
      [&] {
        check({2, 5, 29}, 24, {40, 64});
      },
      ErrorCode::kInvalidArgument, "q_indptr[0] must be 0");
  expect([&] { check({0, 6, 5}, 24, {40, 64}); }, ErrorCode::kInvalidArgument, "decreases");
  expect(
      [&] {
        check({0, 5, 29}, 24, {40});
      },
      ErrorCode::kInvalidArgument, "seq_lens has 1 entries for 2 sequences");
  expect([&] { check({}, 24, {}); }, ErrorCode::kInvalidArgument, "q_indptr needs");
  expect([&] { check({0, 5, 29}, -1, {40, 64}); }, ErrorCode::kInvalidArgument, "max_q_len");
  // Block ids: past the pool, negative, or a sequence longer than its row.
  expect(
      [&] {
        check({0, 5, 29}, 24, {40, 64}, {1, 2, 10, 0, 4, 5, 6, 7});
      },
      ErrorCode::kOutOfRange, "outside the pool");
  expect(
      [&] {
        check({0, 5, 29}, 24, {40, 64}, {1, 2, 3, 0, 4, -1, 6, 7});
      },
      ErrorCode::kOutOfRange, "");
  expect([&] { check({0, 5, 29}, 24, {40, 65}); }, ErrorCode::kOutOfRange, "needs");
}

}  // namespace
}  // namespace pagedkv
