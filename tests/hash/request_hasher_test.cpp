#include "pagedkv/hash/request_hasher.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "pagedkv/base/error.hpp"
#include "test_tokens.hpp"

namespace pagedkv {
namespace {

TEST(RequestBlockHasher, HashesOnlyFullBlocksEachOnce) {
  const BlockHasher hasher(HashScheme::kSha256, "seed");
  RequestBlockHasher r(hasher, 16);
  r.append(iota_tokens(0, 20));
  EXPECT_EQ(r.num_tokens(), 20u);
  ASSERT_EQ(r.block_hashes().size(), 1u);  // the 4-token tail is not hashed
  const BlockHash first = r.block_hashes()[0];
  r.append(iota_tokens(20, 11));
  EXPECT_EQ(r.block_hashes().size(), 1u);
  r.append(31);
  ASSERT_EQ(r.block_hashes().size(), 2u);
  EXPECT_EQ(r.block_hashes()[0], first);  // earlier hashes are never recomputed or changed
  EXPECT_EQ(r.block_hashes()[1], hasher.hash_block(first, iota_tokens(16, 16)));
}

TEST(RequestBlockHasher, ChunkedAppendsMatchOneShot) {
  const BlockHasher hasher(HashScheme::kXxh3_128, "seed");
  RequestHashKeys keys;
  keys.cache_salt = "s";
  keys.lora_name = "l";
  keys.mm_items = {{"img", 5, 40}, {"aud", 70, 3}};
  const auto tokens = iota_tokens(7, 16 * 7 + 5);
  const auto expected = hash_request_blocks(hasher, 16, tokens, keys);
  ASSERT_EQ(expected.size(), 7u);
  for (std::size_t chunk : {1u, 3u, 16u, 17u, 50u}) {
    RequestBlockHasher r(hasher, 16, keys);
    for (std::size_t i = 0; i < tokens.size(); i += chunk) {
      const std::size_t n = std::min(chunk, tokens.size() - i);
      r.append(std::span<const TokenId>(tokens.data() + i, n));
    }
    EXPECT_EQ(std::vector<BlockHash>(r.block_hashes().begin(), r.block_hashes().end()), expected)
        << "chunk " << chunk;
  }
}

TEST(RequestBlockHasher, ExtraKeysFollowVllm) {
  RequestHashKeys keys;
  keys.cache_salt = "salt";
  keys.lora_name = "lora";
  keys.mm_items = {{"img", 5, 40}, {"aud", 70, 3}};
  const RequestBlockHasher r(BlockHasher(HashScheme::kSha256, "seed"), 16, keys);
  std::vector<MultiModalKey> scratch;

  auto b0 = r.block_extra_keys(0, scratch);
  ASSERT_TRUE(b0.cache_salt && b0.lora_name);
  EXPECT_EQ(*b0.cache_salt, "salt");
  EXPECT_EQ(*b0.lora_name, "lora");
  ASSERT_EQ(b0.mm_items.size(), 1u);
  EXPECT_EQ(b0.mm_items[0].identifier, "img");
  EXPECT_EQ(b0.mm_items[0].offset, 5);

  auto b2 = r.block_extra_keys(2, scratch);  // tokens [32, 48): img started 27 tokens earlier
  EXPECT_FALSE(b2.cache_salt);               // the salt is on block 0 only
  ASSERT_TRUE(b2.lora_name);                 // the LoRA name on every block
  ASSERT_EQ(b2.mm_items.size(), 1u);
  EXPECT_EQ(b2.mm_items[0].offset, -27);

  auto b3 = r.block_extra_keys(3, scratch);  // [48, 64): img ended at 45, aud starts at 70
  EXPECT_TRUE(b3.mm_items.empty());
  auto b4 = r.block_extra_keys(4, scratch);  // [64, 80): aud at +6
  ASSERT_EQ(b4.mm_items.size(), 1u);
  EXPECT_EQ(b4.mm_items[0].identifier, "aud");
  EXPECT_EQ(b4.mm_items[0].offset, 6);
}

TEST(RequestBlockHasher, ImageIdentifierChangesOnlyOverlappingAndLaterBlocks) {
  const BlockHasher hasher(HashScheme::kSha256, "seed");
  const auto tokens = iota_tokens(0, 64);
  RequestHashKeys a, b;
  a.mm_items = {{"cat.png", 20, 8}};
  b.mm_items = {{"dog.png", 20, 8}};
  const auto ha = hash_request_blocks(hasher, 16, tokens, a);
  const auto hb = hash_request_blocks(hasher, 16, tokens, b);
  EXPECT_EQ(ha[0], hb[0]);  // block 0 holds no image token
  for (std::size_t i = 1; i < ha.size(); ++i) EXPECT_NE(ha[i], hb[i]);
}

TEST(RequestBlockHasher, RejectsBadKeysAndTokensLeavingStateUnchanged) {
  const BlockHasher hasher(HashScheme::kSha256, "seed");
  EXPECT_THROW(RequestBlockHasher(hasher, 0), Error);
  auto expect_bad = [&](RequestHashKeys keys, const char* fragment) {
    try {
      RequestBlockHasher r(hasher, 16, std::move(keys));
      ADD_FAILURE() << "accepted keys that should fail with '" << fragment << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  RequestHashKeys k;
  k.cache_salt = "";
  expect_bad(k, "cache_salt");
  k = {};
  k.lora_name = "";
  expect_bad(k, "LoRA");
  k = {};
  k.mm_items = {{"", 0, 4}};
  expect_bad(k, "empty identifier");
  k.mm_items = {{"a", -1, 4}};
  expect_bad(k, "negative offset");
  k.mm_items = {{"a", 0, 0}};
  expect_bad(k, "length 0");
  k.mm_items = {{"a", 10, 4}, {"b", 12, 4}};
  expect_bad(k, "item 1");
  k.mm_items = {{"a", 10, 4}, {"b", 2, 4}};
  expect_bad(k, "sorted");

  RequestBlockHasher r(hasher, 4);
  r.append(iota_tokens(0, 6));
  const std::vector<TokenId> before_tokens(r.tokens().begin(), r.tokens().end());
  const std::vector<BlockHash> before_hashes(r.block_hashes().begin(), r.block_hashes().end());
  const std::vector<TokenId> bad = {9, 9, 9, -1};
  EXPECT_THROW(r.append(bad), Error);
  EXPECT_EQ(std::vector<TokenId>(r.tokens().begin(), r.tokens().end()), before_tokens);
  EXPECT_EQ(std::vector<BlockHash>(r.block_hashes().begin(), r.block_hashes().end()),
            before_hashes);
}

}  // namespace
}  // namespace pagedkv
