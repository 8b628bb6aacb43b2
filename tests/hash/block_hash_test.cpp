#include "pagedkv/hash/block_hash.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <type_traits>
#include <unordered_set>

#include "pagedkv/base/error.hpp"

namespace pagedkv {
namespace {

static_assert(std::is_trivially_copyable_v<BlockHash>);
static_assert(sizeof(BlockHash) <= 33, "a block hash stays a small value type");

TEST(BlockHash, EmptyByDefault) {
  const BlockHash h;
  EXPECT_TRUE(h.empty());
  EXPECT_EQ(h.size(), 0u);
  EXPECT_EQ(h.to_hex(), "");
  EXPECT_EQ(h.event_id(), 0u);
  EXPECT_EQ(h, BlockHash());
}

TEST(BlockHash, HexRoundTripAndEventId) {
  const std::string hex = "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749";
  const BlockHash h = BlockHash::from_hex(hex);
  EXPECT_EQ(h.size(), 32u);
  EXPECT_EQ(h.to_hex(), hex);
  // vLLM's 64-bit form: the last 8 bytes, big-endian.
  EXPECT_EQ(h.event_id(), 0x1efea06206ac0749ULL);
  EXPECT_EQ(BlockHash::from_hex("DC918A88B139E5AFE60B88EDA27508D4AEE16C10FDC354791EFEA06206AC0749"),
            h);

  const BlockHash x = BlockHash::from_hex("06b05ab6733a618578af5f94892f3950");
  EXPECT_EQ(x.size(), 16u);
  EXPECT_EQ(x.event_id(), 0x78af5f94892f3950ULL);
}

TEST(BlockHash, ComparesBySizeThenBytes) {
  std::array<std::uint8_t, 32> a{};
  std::array<std::uint8_t, 32> b{};
  b[31] = 1;
  const BlockHash ha(a), hb(b);
  EXPECT_NE(ha, hb);
  EXPECT_LT(ha, hb);
  // A 16-byte digest never equals a 32-byte one, even with equal leading bytes.
  const BlockHash short_hash(std::span<const std::uint8_t>(a.data(), 16));
  EXPECT_NE(short_hash, ha);
  EXPECT_LT(short_hash, ha);
  std::unordered_set<BlockHash> set{ha, hb, short_hash, ha};
  EXPECT_EQ(set.size(), 3u);
}

TEST(BlockHash, RejectsBadSizesAndHex) {
  const std::array<std::uint8_t, 20> twenty{};
  try {
    BlockHash h{std::span<const std::uint8_t>(twenty)};
    FAIL() << "20-byte digest accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("20"), std::string::npos) << e.what();
  }
  EXPECT_THROW(BlockHash::from_hex("abc"), Error);
  try {
    BlockHash::from_hex("zz918a88b139e5afe60b88eda27508d4");
    FAIL() << "bad hex accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kParseError);
    EXPECT_NE(std::string(e.what()).find("character 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagedkv
