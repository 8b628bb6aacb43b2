#include "pagedkv/remote/remote_value.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace pagedkv {
namespace {

BlockHash hash_of(std::uint8_t seed, std::size_t size = 32) {
  std::array<std::uint8_t, 32> b{};
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(seed * 37 + i);
  return BlockHash(std::span<const std::uint8_t>(b.data(), size));
}

// Block 5 of a chain: its hash and its parent's.
const RemoteValueBinding kBlock{hash_of(5), hash_of(4), 0};

std::vector<std::byte> make_value(std::uint64_t fp, const std::vector<std::byte>& payload,
                                  const RemoteValueBinding& binding = kBlock) {
  const auto h = encode_remote_value_header(fp, binding, payload);
  std::vector<std::byte> v(h.size() + payload.size());
  std::memcpy(v.data(), h.data(), h.size());
  if (!payload.empty()) std::memcpy(v.data() + h.size(), payload.data(), payload.size());
  return v;
}

std::vector<std::byte> payload_of(std::size_t n) {
  std::vector<std::byte> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = std::byte(static_cast<std::uint8_t>(i * 131 + 7));
  return p;
}

TEST(RemoteValue, HeaderLayoutIsLittleEndianAndDocumented) {
  const auto payload = payload_of(100);
  const auto h = encode_remote_value_header(0x0102030405060708ull, kBlock, payload);
  EXPECT_EQ(std::to_integer<int>(h[0]), 'P');
  EXPECT_EQ(std::to_integer<int>(h[1]), 'K');
  EXPECT_EQ(std::to_integer<int>(h[2]), 'V');
  EXPECT_EQ(std::to_integer<int>(h[3]), 'B');
  EXPECT_EQ(std::to_integer<int>(h[4]), kRemoteValueVersion);
  EXPECT_EQ(std::to_integer<int>(h[6]), int(kRemoteValueHeaderSize));
  EXPECT_EQ(std::to_integer<int>(h[8]), 0x08);
  EXPECT_EQ(std::to_integer<int>(h[15]), 0x01);
  EXPECT_EQ(std::to_integer<int>(h[16]), 100);
  EXPECT_EQ(kRemoteValueVersion, 3);
  EXPECT_EQ(kRemoteValueHeaderSize, 144u);
  // The binding: sizes, group and KV format, then the block and parent hashes and the prefix
  // identity (none here), zero-padded.
  EXPECT_EQ(std::to_integer<int>(h[32]), 32);
  EXPECT_EQ(std::to_integer<int>(h[33]), 32);
  EXPECT_EQ(std::to_integer<int>(h[34]), 0);
  EXPECT_EQ(std::to_integer<int>(h[35]), 0);  // no prefix identity
  EXPECT_EQ(std::to_integer<int>(h[36]), 1);  // KVDtype::kBFloat16
  EXPECT_EQ(std::to_integer<int>(h[37]), 0);  // no scales
  for (int i = 38; i < 40; ++i) EXPECT_EQ(std::to_integer<int>(h[i]), 0);
  EXPECT_EQ(std::memcmp(h.data() + 40, kBlock.block.bytes().data(), 32), 0);
  EXPECT_EQ(std::memcmp(h.data() + 72, kBlock.parent.bytes().data(), 32), 0);
  for (int i = 104; i < 144; ++i) EXPECT_EQ(std::to_integer<int>(h[i]), 0);
  // A prefix identity and another KV format.
  RemoteValueBinding with = kBlock;
  with.identity = hash_of(77);
  with.kv_dtype = 5;
  with.kv_scale_mode = kKVScalePerTokenHead;
  const auto hi = encode_remote_value_header(1, with, payload);
  EXPECT_EQ(std::to_integer<int>(hi[35]), 32);
  EXPECT_EQ(std::to_integer<int>(hi[36]), 5);
  EXPECT_EQ(std::to_integer<int>(hi[37]), 2);
  EXPECT_EQ(std::memcmp(hi.data() + 104, with.identity.bytes().data(), 32), 0);
  for (int i = 136; i < 144; ++i) EXPECT_EQ(std::to_integer<int>(hi[i]), 0);
  // The checksum: xxh3_64 of the payload seeded with xxh3_64 of the header, checksum zeroed.
  std::uint64_t checksum = 0;
  for (int i = 0; i < 8; ++i)
    checksum |= std::uint64_t(std::to_integer<std::uint8_t>(h[24 + i])) << (8 * i);
  auto zeroed = h;
  std::memset(zeroed.data() + 24, 0, 8);
  const std::uint64_t seed = XXH3_64bits(zeroed.data(), zeroed.size());
  EXPECT_EQ(checksum, XXH3_64bits_withSeed(payload.data(), payload.size(), seed));
  // 16-byte hashes and a chain's block 0 (no parent) are padded with zeros.
  const auto h0 = encode_remote_value_header(1, RemoteValueBinding{hash_of(9, 16), {}, 3}, payload);
  EXPECT_EQ(std::to_integer<int>(h0[32]), 16);
  EXPECT_EQ(std::to_integer<int>(h0[33]), 0);
  EXPECT_EQ(std::to_integer<int>(h0[34]), 3);
  for (int i = 56; i < 104; ++i) EXPECT_EQ(std::to_integer<int>(h0[i]), 0) << i;
}

TEST(RemoteValue, ChecksumIsXxh3_64OfKnownInput) {
  // xxhsum -H3 of the empty input: 2d06800538d394c2 (XXH3_64bits, seed 0).
  EXPECT_EQ(remote_checksum({}), 0x2d06800538d394c2ull);
  EXPECT_NE(layout_fingerprint("a"), layout_fingerprint("b"));
}

TEST(RemoteValue, AcceptsWhatItWrote) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{65536}}) {
    const auto payload = payload_of(n);
    const auto v = make_value(42, payload);
    EXPECT_EQ(check_remote_value(v, 42, n, kBlock), RemoteValueCheck::kOk) << n;
    const RemoteValueBinding first{hash_of(1, 16), {}, 2};
    EXPECT_EQ(check_remote_value(make_value(42, payload, first), 42, n, first),
              RemoteValueCheck::kOk)
        << n;
  }
}

TEST(RemoteValue, RejectsEveryMismatch) {
  const auto payload = payload_of(1000);
  const auto good = make_value(7, payload);
  EXPECT_EQ(check_remote_value(std::span(good).first(kRemoteValueHeaderSize - 1), 7, 1000, kBlock),
            RemoteValueCheck::kTooShort);
  EXPECT_EQ(check_remote_value(good, 8, 1000, kBlock), RemoteValueCheck::kFingerprintMismatch);
  EXPECT_EQ(check_remote_value(good, 7, 999, kBlock), RemoteValueCheck::kLengthMismatch);
  EXPECT_EQ(check_remote_value(std::span(good).first(good.size() - 1), 7, 999, kBlock),
            RemoteValueCheck::kLengthMismatch);

  auto bad = good;
  bad[0] ^= std::byte{1};
  EXPECT_EQ(check_remote_value(bad, 7, 1000, kBlock), RemoteValueCheck::kBadMagic);
  bad = good;
  bad[4] = std::byte{4};
  EXPECT_EQ(check_remote_value(bad, 7, 1000, kBlock), RemoteValueCheck::kBadVersion);
  bad = good;  // version 2: a 112-byte header without prefix identity or KV format
  bad[4] = std::byte{2};
  bad[6] = std::byte{112};
  EXPECT_EQ(check_remote_value(bad, 7, 1000, kBlock), RemoteValueCheck::kBadVersion);
  bad = good;
  bad[38] = std::byte{1};  // reserved
  EXPECT_EQ(check_remote_value(bad, 7, 1000, kBlock), RemoteValueCheck::kBadVersion);
  bad = good;
  bad[6] = std::byte{40};  // version 1's header size
  EXPECT_EQ(check_remote_value(bad, 7, 1000, kBlock), RemoteValueCheck::kBadVersion);
  // Every single flipped payload byte is caught.
  for (std::size_t i = kRemoteValueHeaderSize; i < good.size(); i += 97) {
    bad = good;
    bad[i] ^= std::byte{0x10};
    EXPECT_EQ(check_remote_value(bad, 7, 1000, kBlock), RemoteValueCheck::kChecksumMismatch) << i;
  }
  // A flipped checksum byte too.
  bad = good;
  bad[24] ^= std::byte{1};
  EXPECT_EQ(check_remote_value(bad, 7, 1000, kBlock), RemoteValueCheck::kChecksumMismatch);
  EXPECT_EQ(to_string(RemoteValueCheck::kChecksumMismatch), "checksum_mismatch");
  EXPECT_EQ(to_string(RemoteValueCheck::kBindingMismatch), "binding_mismatch");
  EXPECT_EQ(to_string(RemoteValueCheck::kFormatMismatch), "format_mismatch");
}

// Issue 37: the KV format (dtype, scale mode) a value was written in must be the reader's; any
// other is kFormatMismatch, a miss, whatever else matches.
TEST(RemoteValue, AValueOfAnotherKVFormatIsRejected) {
  const auto payload = payload_of(256);
  RemoteValueBinding fp8 = kBlock;
  fp8.kv_dtype = 2;
  fp8.kv_scale_mode = kKVScalePerTensor;
  const auto v = make_value(7, payload, fp8);
  EXPECT_EQ(check_remote_value(v, 7, 256, fp8), RemoteValueCheck::kOk);
  EXPECT_EQ(check_remote_value(v, 7, 256, kBlock), RemoteValueCheck::kFormatMismatch);
  RemoteValueBinding other_scales = fp8;
  other_scales.kv_scale_mode = kKVScalePerTokenHead;
  EXPECT_EQ(check_remote_value(v, 7, 256, other_scales), RemoteValueCheck::kFormatMismatch);
  RemoteValueBinding other_dtype = fp8;
  other_dtype.kv_dtype = 0;
  EXPECT_EQ(check_remote_value(v, 7, 256, other_dtype), RemoteValueCheck::kFormatMismatch);
  // A default (bf16, no scales) value read by an fp8 reader.
  EXPECT_EQ(check_remote_value(make_value(7, payload), 7, 256, fp8),
            RemoteValueCheck::kFormatMismatch);
}

// Issue 37: with xxh3_128 (not collision resistant) a value is bound to its block's prefix
// identity; a value of another prefix whose block and parent hashes collide with the reader's is
// rejected, and so is a value with no identity read by a reader that expects one (and back).
TEST(RemoteValue, AValueOfAnotherPrefixIdentityIsRejected) {
  const auto payload = payload_of(256);
  RemoteValueBinding mine{hash_of(5, 16), hash_of(4, 16), 0, hash_of(50)};
  RemoteValueBinding theirs = mine;
  theirs.identity = hash_of(51);
  const auto v = make_value(7, payload, mine);
  EXPECT_EQ(check_remote_value(v, 7, 256, mine), RemoteValueCheck::kOk);
  EXPECT_EQ(check_remote_value(v, 7, 256, theirs), RemoteValueCheck::kBindingMismatch);
  EXPECT_EQ(check_remote_value(make_value(7, payload, theirs), 7, 256, mine),
            RemoteValueCheck::kBindingMismatch);
  RemoteValueBinding none = mine;
  none.identity = BlockHash();
  EXPECT_EQ(check_remote_value(v, 7, 256, none), RemoteValueCheck::kBindingMismatch);
  EXPECT_EQ(check_remote_value(make_value(7, payload, none), 7, 256, mine),
            RemoteValueCheck::kBindingMismatch);
  RemoteValueBinding short_id = mine;  // a 16-byte identity with the same leading bytes
  short_id.identity = hash_of(50, 16);
  EXPECT_EQ(check_remote_value(v, 7, 256, short_id), RemoteValueCheck::kBindingMismatch);
}

// Issue 41: a genuine value (header and checksum intact) read under another block's key is
// rejected, whichever part of the binding differs.
TEST(RemoteValue, AValueOfAnotherBlockIsRejected) {
  const auto payload = payload_of(1000);
  const auto v = make_value(7, payload);
  ASSERT_EQ(check_remote_value(v, 7, 1000, kBlock), RemoteValueCheck::kOk);
  const RemoteValueBinding others[] = {
      {hash_of(6), hash_of(5), 0},      // the next block of the chain
      {hash_of(5), hash_of(3), 0},      // same block hash, another prefix
      {hash_of(5), {}, 0},              // as block 0 of a chain
      {hash_of(5), hash_of(4), 1},      // another KV-cache group
      {hash_of(5, 16), hash_of(4), 0},  // a 16-byte hash with the same leading bytes
      {hash_of(5), hash_of(4, 16), 0},
  };
  for (const RemoteValueBinding& o : others) {
    EXPECT_EQ(check_remote_value(v, 7, 1000, o), RemoteValueCheck::kBindingMismatch);
    // ... and the other block's own value is not accepted under kBlock either.
    EXPECT_EQ(check_remote_value(make_value(7, payload, o), 7, 1000, kBlock),
              RemoteValueCheck::kBindingMismatch);
  }
  // Version 1 values (no binding) are a counted miss, never a hit.
  auto old = v;
  old[4] = std::byte{1};
  EXPECT_EQ(check_remote_value(old, 7, 1000, kBlock), RemoteValueCheck::kBadVersion);
}

// Every single bit of the header flipped - the binding's included - is rejected, and so is every
// bit of the payload: no edit of a value goes undetected.
TEST(RemoteValue, EveryFlippedHeaderBitIsRejected) {
  const auto payload = payload_of(300);
  const auto good = make_value(7, payload);
  for (std::size_t bit = 0; bit < 8 * good.size(); ++bit) {
    auto bad = good;
    bad[bit / 8] ^= std::byte(static_cast<std::uint8_t>(1u << (bit % 8)));
    const RemoteValueCheck c = check_remote_value(bad, 7, 300, kBlock);
    EXPECT_NE(c, RemoteValueCheck::kOk) << "bit " << bit;
    const std::size_t at = bit / 8;
    if (at == 36 || at == 37) {  // the KV format
      EXPECT_EQ(c, RemoteValueCheck::kFormatMismatch) << "bit " << bit;
    } else if (at == 38 || at == 39) {  // reserved
      EXPECT_EQ(c, RemoteValueCheck::kBadVersion) << "bit " << bit;
    } else if (at >= kRemoteValueBindingOffset &&
               at < kRemoteValueBindingOffset + kRemoteValueBindingSize) {
      EXPECT_EQ(c, RemoteValueCheck::kBindingMismatch) << "bit " << bit;
    }
    if (at >= kRemoteValueHeaderSize) {
      EXPECT_EQ(c, RemoteValueCheck::kChecksumMismatch) << "bit " << bit;
    }
  }
}

// A binding edited to the reader's block with the rest of the value kept (the checksum not
// recomputed) is caught by the checksum, which covers the header.
TEST(RemoteValue, ARebindingWithoutTheChecksumIsRejected) {
  const auto payload = payload_of(500);
  const RemoteValueBinding other{hash_of(6), hash_of(5), 0};
  auto v = make_value(7, payload, other);
  const auto want = encode_remote_value_header(7, kBlock, payload);
  std::memcpy(v.data() + kRemoteValueBindingOffset, want.data() + kRemoteValueBindingOffset,
              kRemoteValueBindingSize);
  EXPECT_EQ(check_remote_value(v, 7, 500, kBlock), RemoteValueCheck::kChecksumMismatch);
}

}  // namespace
}  // namespace pagedkv
