#include "pagedkv/remote/remote_value.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace pagedkv {
namespace {

std::vector<std::byte> make_value(std::uint64_t fp, const std::vector<std::byte>& payload) {
  const auto h = encode_remote_value_header(fp, payload);
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
  const auto h = encode_remote_value_header(0x0102030405060708ull, payload);
  EXPECT_EQ(std::to_integer<int>(h[0]), 'P');
  EXPECT_EQ(std::to_integer<int>(h[1]), 'K');
  EXPECT_EQ(std::to_integer<int>(h[2]), 'V');
  EXPECT_EQ(std::to_integer<int>(h[3]), 'B');
  EXPECT_EQ(std::to_integer<int>(h[4]), kRemoteValueVersion);
  EXPECT_EQ(std::to_integer<int>(h[6]), int(kRemoteValueHeaderSize));
  EXPECT_EQ(std::to_integer<int>(h[8]), 0x08);
  EXPECT_EQ(std::to_integer<int>(h[15]), 0x01);
  EXPECT_EQ(std::to_integer<int>(h[16]), 100);
  std::uint64_t checksum = 0;
  for (int i = 0; i < 8; ++i)
    checksum |= std::uint64_t(std::to_integer<std::uint8_t>(h[24 + i])) << (8 * i);
  EXPECT_EQ(checksum, remote_checksum(payload));
  for (int i = 32; i < 40; ++i) EXPECT_EQ(std::to_integer<int>(h[i]), 0);
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
    EXPECT_EQ(check_remote_value(v, 42, n), RemoteValueCheck::kOk) << n;
  }
}

TEST(RemoteValue, RejectsEveryMismatch) {
  const auto payload = payload_of(1000);
  const auto good = make_value(7, payload);
  EXPECT_EQ(check_remote_value(std::span(good).first(39), 7, 1000), RemoteValueCheck::kTooShort);
  EXPECT_EQ(check_remote_value(good, 8, 1000), RemoteValueCheck::kFingerprintMismatch);
  EXPECT_EQ(check_remote_value(good, 7, 999), RemoteValueCheck::kLengthMismatch);
  EXPECT_EQ(check_remote_value(std::span(good).first(good.size() - 1), 7, 999),
            RemoteValueCheck::kLengthMismatch);

  auto bad = good;
  bad[0] ^= std::byte{1};
  EXPECT_EQ(check_remote_value(bad, 7, 1000), RemoteValueCheck::kBadMagic);
  bad = good;
  bad[4] = std::byte{2};
  EXPECT_EQ(check_remote_value(bad, 7, 1000), RemoteValueCheck::kBadVersion);
  bad = good;
  bad[6] = std::byte{48};
  EXPECT_EQ(check_remote_value(bad, 7, 1000), RemoteValueCheck::kBadVersion);
  // Every single flipped payload byte is caught.
  for (std::size_t i = kRemoteValueHeaderSize; i < good.size(); i += 97) {
    bad = good;
    bad[i] ^= std::byte{0x10};
    EXPECT_EQ(check_remote_value(bad, 7, 1000), RemoteValueCheck::kChecksumMismatch) << i;
  }
  // A flipped checksum byte too.
  bad = good;
  bad[24] ^= std::byte{1};
  EXPECT_EQ(check_remote_value(bad, 7, 1000), RemoteValueCheck::kChecksumMismatch);
  EXPECT_EQ(to_string(RemoteValueCheck::kChecksumMismatch), "checksum_mismatch");
}

}  // namespace
}  // namespace pagedkv
