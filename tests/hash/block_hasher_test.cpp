#include "pagedkv/hash/block_hasher.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "pagedkv/hash/request_hasher.hpp"
#include "test_tokens.hpp"

namespace pagedkv {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string field;
  std::istringstream in(s);
  while (std::getline(in, field, sep)) out.push_back(field);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

// docs/hashing.md: vLLM's sha256_cbor with seed "vllm-none-hash".
TEST(BlockHasher, VllmSha256CborVectors) {
  const BlockHasher hasher(HashScheme::kSha256CborVllm);
  const auto b0 = hash_block_tokens(hasher, nullptr, iota_tokens(0, 16));
  const auto b1 = hash_block_tokens(hasher, &b0, iota_tokens(16, 16));
  EXPECT_EQ(b0.to_hex(), "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749");
  EXPECT_EQ(b1.to_hex(), "c300ec275d7bf08af8fc63e76cdc0086911bbc7091e03c5cf892553bef84ef0c");
  // An explicit seed equal to the default gives the same NONE_HASH.
  EXPECT_EQ(BlockHasher(HashScheme::kSha256CborVllm, "vllm-none-hash").none_hash(),
            hasher.none_hash());
}

TEST(BlockHasher, RawDigestsMatchPublishedValues) {
  const std::string abc = "abc";
  const std::span<const std::uint8_t> bytes(reinterpret_cast<const std::uint8_t*>(abc.data()), 3);
  EXPECT_EQ(raw_digest(HashScheme::kSha256, bytes).to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(raw_digest(HashScheme::kXxh3_128, bytes).to_hex(), "06b05ab6733a618578af5f94892f3950");
}

// Vectors from tests/hash_vectors.py (independent Python implementation), covering every scheme
// and extra-key kind, edge integers and odd block sizes; checked one-shot and token at a time.
TEST(BlockHasher, IndependentKnownAnswerVectors) {
  std::ifstream file(PAGEDKV_HASH_VECTORS);
  ASSERT_TRUE(file) << "cannot open " << PAGEDKV_HASH_VECTORS;
  std::string line;
  int checked = 0;
  while (std::getline(file, line)) {
    const auto f = split(line, '|');
    ASSERT_EQ(f.size(), 8u) << line;
    const BlockHasher hasher(parse_hash_scheme(f[0]), f[1]);
    const auto block_size = static_cast<std::uint32_t>(std::stoul(f[2]));
    std::vector<TokenId> tokens;
    for (const auto& t : split(f[3], ',')) tokens.push_back(static_cast<TokenId>(std::stol(t)));
    RequestHashKeys keys;
    if (f[4] != "-") keys.lora_name = f[4];
    if (f[5] != "-") keys.cache_salt = f[5];
    if (f[6] != "-") {
      for (const auto& item : split(f[6], ';')) {
        const auto parts = split(item, ':');
        ASSERT_EQ(parts.size(), 3u) << item;
        keys.mm_items.push_back({parts[0], std::stoll(parts[1]), std::stoll(parts[2])});
      }
    }
    const auto expected = split(f[7], ',');

    const auto one_shot = hash_request_blocks(hasher, block_size, tokens, keys);
    RequestBlockHasher incremental(hasher, block_size, keys);
    for (const TokenId t : tokens) incremental.append(t);
    ASSERT_EQ(one_shot.size(), expected.size()) << line;
    ASSERT_EQ(incremental.block_hashes().size(), expected.size()) << line;
    for (std::size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(one_shot[i].to_hex(), expected[i]) << "block " << i << " of " << line;
      EXPECT_EQ(incremental.block_hashes()[i], one_shot[i]) << "block " << i << " of " << line;
    }
    ++checked;
  }
  EXPECT_GE(checked, 32);
}

TEST(BlockHasher, CborOfEdgeIntegersAndNegativeOffsets) {
  const BlockHasher hasher(HashScheme::kSha256CborVllm);
  const std::vector<TokenId> tokens = {23, 24, 255, 256, 65535, 65536, 2147483647};
  const MultiModalKey mm[] = {{"i", -1}, {"j", -24}, {"k", -25}, {"l", -257}};
  BlockExtraKeys extra;
  extra.mm_items = mm;
  const auto bytes = hasher.encode_block(hasher.none_hash(), tokens, extra);
  std::vector<std::uint8_t> expected = {0x83, 0x58, 0x20};
  const auto parent = hasher.none_hash().bytes();
  expected.insert(expected.end(), parent.begin(), parent.end());
  const std::vector<std::uint8_t> rest = {0x87,                          // array(7)
                                          0x17,                          // 23
                                          0x18, 0x18,                    // 24
                                          0x18, 0xff,                    // 255
                                          0x19, 0x01, 0x00,              // 256
                                          0x19, 0xff, 0xff,              // 65535
                                          0x1a, 0x00, 0x01, 0x00, 0x00,  // 65536
                                          0x1a, 0x7f, 0xff, 0xff, 0xff,  // 2^31 - 1
                                          0x84,                          // extra keys: array(4)
                                          0x82, 0x61, 'i',  0x20,        // ["i", -1]
                                          0x82, 0x61, 'j',  0x37,        // ["j", -24]
                                          0x82, 0x61, 'k',  0x38, 0x18,  // ["k", -25]
                                          0x82, 0x61, 'l',  0x39, 0x01, 0x00};  // ["l", -257]
  expected.insert(expected.end(), rest.begin(), rest.end());
  EXPECT_EQ(bytes, expected);
  // No extra keys: CBOR null.
  const auto plain = hasher.encode_block(hasher.none_hash(), std::vector<TokenId>{0});
  EXPECT_EQ(plain.back(), 0xf6);
  // The hash is SHA-256 of exactly these bytes.
  EXPECT_EQ(hasher.hash_block(hasher.none_hash(), tokens, extra),
            raw_digest(HashScheme::kSha256, bytes));
}

class EveryScheme : public ::testing::TestWithParam<HashScheme> {};

TEST_P(EveryScheme, OneChangedTokenChangesItsBlockAndEveryLaterOne) {
  const BlockHasher hasher(GetParam(), "seed");
  const auto tokens = iota_tokens(100, 16 * 6);
  const auto base = hash_request_blocks(hasher, 16, tokens);
  ASSERT_EQ(base.size(), 6u);
  for (std::size_t pos : {0u, 15u, 16u, 40u, 95u}) {
    auto changed = tokens;
    changed[pos] += 1;
    const auto hashes = hash_request_blocks(hasher, 16, changed);
    for (std::size_t b = 0; b < base.size(); ++b) {
      if (b < pos / 16) {
        EXPECT_EQ(hashes[b], base[b]) << "pos " << pos << " block " << b;
      } else {
        EXPECT_NE(hashes[b], base[b]) << "pos " << pos << " block " << b;
      }
    }
  }
}

TEST_P(EveryScheme, SaltChangesEveryBlockLoraChangesEveryBlock) {
  const BlockHasher hasher(GetParam(), "seed");
  const auto tokens = iota_tokens(0, 16 * 4);
  const auto plain = hash_request_blocks(hasher, 16, tokens);
  RequestHashKeys a, b, lora;
  a.cache_salt = "tenant-a";
  b.cache_salt = "tenant-b";
  lora.lora_name = "adapter";
  const auto ha = hash_request_blocks(hasher, 16, tokens, a);
  const auto hb = hash_request_blocks(hasher, 16, tokens, b);
  const auto hl = hash_request_blocks(hasher, 16, tokens, lora);
  EXPECT_EQ(ha, hash_request_blocks(hasher, 16, tokens, a));  // deterministic: same salt hits
  for (std::size_t i = 0; i < plain.size(); ++i) {
    EXPECT_NE(ha[i], plain[i]);
    EXPECT_NE(ha[i], hb[i]);
    EXPECT_NE(hl[i], plain[i]);
    EXPECT_NE(hl[i], ha[i]);
  }
}

TEST_P(EveryScheme, SeedsSeparateNamespaces) {
  const auto tokens = iota_tokens(0, 16);
  const BlockHasher s1(GetParam(), "one"), s2(GetParam(), "two"), s1_again(GetParam(), "one");
  EXPECT_EQ(s1.none_hash().size(), digest_size(GetParam()));
  EXPECT_EQ(s1.none_hash(), s1_again.none_hash());
  EXPECT_NE(s1.none_hash(), s2.none_hash());
  EXPECT_NE(s1.hash_block(s1.none_hash(), tokens), s2.hash_block(s2.none_hash(), tokens));
}

TEST_P(EveryScheme, RejectsBadInputWithClearErrors) {
  const BlockHasher hasher(GetParam(), "seed");
  const std::vector<TokenId> bad = {1, -5, 3};
  try {
    hasher.hash_block(hasher.none_hash(), bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("-5 at position 1"), std::string::npos) << e.what();
  }
  BlockExtraKeys empty_salt;
  empty_salt.cache_salt = "";
  EXPECT_THROW(hasher.hash_block(hasher.none_hash(), iota_tokens(0, 4), empty_salt), Error);
  BlockExtraKeys empty_lora;
  empty_lora.lora_name = "";
  EXPECT_THROW(hasher.hash_block(hasher.none_hash(), iota_tokens(0, 4), empty_lora), Error);
  const MultiModalKey unnamed[] = {{"", 0}};
  BlockExtraKeys bad_mm;
  bad_mm.mm_items = unnamed;
  EXPECT_THROW(hasher.hash_block(hasher.none_hash(), iota_tokens(0, 4), bad_mm), Error);
  EXPECT_THROW(hasher.hash_block(hasher.none_hash(), std::span<const TokenId>()), Error);
  EXPECT_THROW(hasher.hash_block(BlockHash(), iota_tokens(0, 4)), Error);
  const BlockHasher other(
      GetParam() == HashScheme::kXxh3_128 ? HashScheme::kSha256 : HashScheme::kXxh3_128, "seed");
  EXPECT_THROW(hasher.hash_block(other.none_hash(), iota_tokens(0, 4)), Error);
  EXPECT_THROW(BlockHasher(GetParam(), ""), Error);
}

TEST_P(EveryScheme, LargeBlocksTakeTheHeapPathWithTheSameResult) {
  // 1,000 tokens of up to 5 CBOR bytes exceed the 4 KiB stack buffer.
  const BlockHasher hasher(GetParam(), "seed");
  auto tokens = iota_tokens(1 << 30, 1000);
  const auto h = hasher.hash_block(hasher.none_hash(), tokens);
  EXPECT_EQ(h, raw_digest(hasher.scheme() == HashScheme::kXxh3_128 ? HashScheme::kXxh3_128
                                                                   : HashScheme::kSha256,
                          hasher.encode_block(hasher.none_hash(), tokens)));
}

INSTANTIATE_TEST_SUITE_P(Schemes, EveryScheme,
                         ::testing::Values(HashScheme::kSha256, HashScheme::kSha256CborVllm,
                                           HashScheme::kXxh3_128),
                         [](const auto& p) { return std::string(to_string(p.param)); });

// vLLM issue 44701: its untyped extra keys let a LoRA name equal a salt. pagedkv's own encoding
// types every key, so the three kinds never collide.
TEST(BlockHasher, TypedExtraKeysCannotBeConfused) {
  const auto tokens = iota_tokens(0, 16);
  const MultiModalKey mm[] = {{"x", 0}};
  BlockExtraKeys as_lora, as_salt, as_mm;
  as_lora.lora_name = "x";
  as_salt.cache_salt = "x";
  as_mm.mm_items = mm;
  for (HashScheme scheme : {HashScheme::kSha256, HashScheme::kXxh3_128}) {
    const BlockHasher h(scheme, "seed");
    const auto l = h.hash_block(h.none_hash(), tokens, as_lora);
    const auto s = h.hash_block(h.none_hash(), tokens, as_salt);
    const auto m = h.hash_block(h.none_hash(), tokens, as_mm);
    EXPECT_NE(l, s);
    EXPECT_NE(l, m);
    EXPECT_NE(s, m);
  }
  // The vLLM-compatible scheme reproduces vLLM, confusion included: documented, not hidden.
  const BlockHasher v(HashScheme::kSha256CborVllm);
  EXPECT_EQ(v.hash_block(v.none_hash(), tokens, as_lora),
            v.hash_block(v.none_hash(), tokens, as_salt));
}

TEST(BlockHasher, RandomSeedPerInstanceUnlessGiven) {
  const BlockHasher a(HashScheme::kSha256), b(HashScheme::kSha256);
  EXPECT_NE(a.none_hash(), b.none_hash());
  const BlockHasher x(HashScheme::kXxh3_128), y(HashScheme::kXxh3_128);
  EXPECT_NE(x.none_hash(), y.none_hash());
  EXPECT_EQ(BlockHasher(HashScheme::kSha256CborVllm).none_hash(),
            BlockHasher(HashScheme::kSha256CborVllm).none_hash());
}

TEST(BlockHasher, SchemeNames) {
  for (HashScheme s : {HashScheme::kSha256, HashScheme::kSha256CborVllm, HashScheme::kXxh3_128}) {
    EXPECT_EQ(parse_hash_scheme(to_string(s)), s);
  }
  try {
    parse_hash_scheme("md5");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kParseError);
    EXPECT_NE(std::string(e.what()).find("'md5'"), std::string::npos);
  }
  EXPECT_EQ(digest_size(HashScheme::kXxh3_128), 16u);
  EXPECT_EQ(digest_size(HashScheme::kSha256), 32u);
}

// A scheme cast from an int outside the enum is refused by every call that takes one: raw_digest
// used to hash it silently as SHA-256.
TEST(BlockHasher, SchemeOutsideTheEnumIsRejected) {
  const auto bad = static_cast<HashScheme>(9);
  const std::uint8_t byte = 0;
  try {
    (void)raw_digest(bad, std::span<const std::uint8_t>(&byte, 1));
    ADD_FAILURE() << "raw_digest accepted hash scheme 9";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("unknown hash scheme value 9"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(BlockHasher(bad, "seed"), Error);
  EXPECT_THROW((void)BlockHasher::weak_for_testing(bad, "seed", 4), Error);
  EXPECT_EQ(to_string(bad), "unknown");
}

}  // namespace
}  // namespace pagedkv
