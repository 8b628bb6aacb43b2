#include "pagedkv/device/kv_dtype.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "pagedkv/base/error.hpp"

namespace pagedkv {
namespace {

TEST(KVDtype, NamesAndSizes) {
  EXPECT_EQ(to_string(KVDtype::kFloat16), "fp16");
  EXPECT_EQ(to_string(KVDtype::kBFloat16), "bf16");
  EXPECT_EQ(bytes_per_value(KVDtype::kFloat16), 2u);
  EXPECT_EQ(bytes_per_value(KVDtype::kBFloat16), 2u);
}

TEST(KVDtype, Fp8NamesSizesAndFormats) {
  // The numbers are the tiers' value header fields: never renumber.
  EXPECT_EQ(static_cast<int>(KVDtype::kFloat16), 0);
  EXPECT_EQ(static_cast<int>(KVDtype::kBFloat16), 1);
  EXPECT_EQ(static_cast<int>(KVDtype::kFp8E4M3), 2);
  EXPECT_EQ(static_cast<int>(KVDtype::kFp8E5M2), 3);
  EXPECT_EQ(static_cast<int>(KVScaleMode::kNone), 0);
  EXPECT_EQ(static_cast<int>(KVScaleMode::kPerTensor), 1);
  EXPECT_EQ(static_cast<int>(KVScaleMode::kPerTokenHead), 2);
  EXPECT_EQ(bytes_per_value(KVDtype::kFp8E4M3), 1u);
  EXPECT_EQ(bytes_per_value(KVDtype::kFp8E5M2), 1u);
  for (const KVDtype d :
       {KVDtype::kFloat16, KVDtype::kBFloat16, KVDtype::kFp8E4M3, KVDtype::kFp8E5M2}) {
    KVDtype back = KVDtype::kFloat16;
    ASSERT_TRUE(parse_kv_dtype(to_string(d), back)) << to_string(d);
    EXPECT_EQ(back, d);
  }
  for (const KVScaleMode m :
       {KVScaleMode::kNone, KVScaleMode::kPerTensor, KVScaleMode::kPerTokenHead}) {
    KVScaleMode back = KVScaleMode::kNone;
    ASSERT_TRUE(parse_kv_scale_mode(to_string(m), back)) << to_string(m);
    EXPECT_EQ(back, m);
  }
  KVDtype untouched = KVDtype::kBFloat16;
  EXPECT_FALSE(parse_kv_dtype("fp8", untouched));
  EXPECT_EQ(untouched, KVDtype::kBFloat16);
  EXPECT_NO_THROW(validate_kv_format(KVDtype::kBFloat16, KVScaleMode::kNone, "t"));
  EXPECT_NO_THROW(validate_kv_format(KVDtype::kFp8E4M3, KVScaleMode::kPerTokenHead, "t"));
  EXPECT_THROW(validate_kv_format(KVDtype::kFp8E5M2, KVScaleMode::kNone, "t"), Error);
  EXPECT_THROW(validate_kv_format(KVDtype::kFloat16, KVScaleMode::kPerTensor, "t"), Error);
  EXPECT_THROW(validate_kv_format(static_cast<KVDtype>(4), KVScaleMode::kNone, "t"), Error);
}

TEST(KVDtype, Fp16KnownValues) {
  EXPECT_EQ(float_to_fp16_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16_bits(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(float_to_fp16_bits(65520.0f), 0x7c00);  // halfway to 2^16: to infinity
  EXPECT_EQ(float_to_fp16_bits(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16_bits(0x1p-24f), 0x0001);    // smallest subnormal
  EXPECT_EQ(float_to_fp16_bits(0x1p-25f), 0x0000);    // tie with 0: to even (0)
  EXPECT_EQ(float_to_fp16_bits(0x1.8p-24f), 0x0002);  // tie 1.5: to even (2)
  EXPECT_EQ(float_to_fp16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16_bits(1.0f + 0x1p-11f), 0x3c00);    // tie: to even
  EXPECT_EQ(float_to_fp16_bits(1.0f + 0x1.8p-10f), 0x3c02);  // tie 1.5 ulp: to even
  EXPECT_EQ(float_to_fp16_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(fp16_bits_to_float(float_to_fp16_bits(std::nanf("")))));
  EXPECT_EQ(fp16_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_bits_to_float(0x3555), 0x1.554p-2f);
}

TEST(KVDtype, Fp16RoundTripsEveryBitPattern) {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto h = static_cast<std::uint16_t>(bits);
    const float f = fp16_bits_to_float(h);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) {
      EXPECT_TRUE(std::isnan(f)) << bits;
      EXPECT_TRUE(std::isnan(fp16_bits_to_float(float_to_fp16_bits(f)))) << bits;
    } else {
      ASSERT_EQ(float_to_fp16_bits(f), h) << bits;
    }
  }
}

#if defined(__FLT16_MANT_DIG__)
// The compiler's _Float16 conversion (libgcc, round to nearest even) is an independent oracle.
TEST(KVDtype, Fp16MatchesCompilerConversion) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  std::uniform_int_distribution<std::uint32_t> near_range(0x33000000u, 0x47800000u);  // 2^-25..2^16
  for (int i = 0; i < 2000000; ++i) {
    std::uint32_t bits =
        (i % 2 == 0) ? any_bits(rng) : (near_range(rng) | (any_bits(rng) & 0x80000000u));
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f)) continue;
    const auto expected = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
    ASSERT_EQ(float_to_fp16_bits(f), expected) << std::hexfloat << f;
    ASSERT_EQ(fp16_bits_to_float(expected), static_cast<float>(static_cast<_Float16>(f)));
  }
}
#endif

// bf16 oracle: of the two bf16 values around f (truncation and next toward infinity), pick the
// nearer in double, ties to the even mantissa.
std::uint16_t bf16_oracle(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const auto down = static_cast<std::uint16_t>(bits >> 16);
  const auto up = static_cast<std::uint16_t>(down + 1);
  const double fd = f;
  const double d_down = std::fabs(fd - static_cast<double>(bf16_bits_to_float(down)));
  const float up_value = bf16_bits_to_float(up);
  const double d_up = std::isinf(up_value) ? std::fabs(fd - 0x1p128 * (f < 0 ? -1 : 1))
                                           : std::fabs(fd - static_cast<double>(up_value));
  if (d_down < d_up) return down;
  if (d_up < d_down) return up;
  return (down & 1u) == 0 ? down : up;
}

TEST(KVDtype, Bf16MatchesNearestEvenOracle) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
  // A signalling-looking NaN whose payload sits in the low bits must not become infinity.
  EXPECT_TRUE(
      std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::bit_cast<float>(0x7f800001u)))));
  std::mt19937 rng(3);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (int i = 0; i < 2000000; ++i) {
    std::uint32_t bits = any_bits(rng);
    if (i % 4 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // exact ties
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(float_to_bf16_bits(f), bf16_oracle(f)) << std::hexfloat << f;
  }
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = bf16_bits_to_float(static_cast<std::uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(float_to_bf16_bits(f), b);
    }
  }
}

TEST(KVDtype, DispatchFollowsDtype) {
  EXPECT_EQ(float_to_dtype_bits(KVDtype::kFloat16, 1.0f), 0x3c00);
  EXPECT_EQ(float_to_dtype_bits(KVDtype::kBFloat16, 1.0f), 0x3f80);
  EXPECT_EQ(dtype_bits_to_float(KVDtype::kFloat16, 0x3c00), 1.0f);
  EXPECT_EQ(dtype_bits_to_float(KVDtype::kBFloat16, 0x3f80), 1.0f);
}

}  // namespace
}  // namespace pagedkv
