// KVEventBatch encoding round trips through the decoder, in both encodings and hash forms, and the
// decoder rejects malformed input. (The independent check of the bytes is decode_stream.py.)
#include <gtest/gtest.h>

#include <numeric>

#include "pagedkv/base/error.hpp"
#include "pagedkv/events/wire.hpp"

namespace pagedkv::events {
namespace {

BlockHash digest(std::uint8_t fill) {
  std::array<std::uint8_t, 32> b{};
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(fill + i);
  return BlockHash(b);
}

std::vector<KVEvent> sample_events() {
  BlockStored s;
  s.block_hashes = {digest(1), digest(2)};
  s.parent_block_hash = digest(9);
  s.token_ids.resize(8);
  std::iota(s.token_ids.begin(), s.token_ids.end(), 65530);  // crosses the uint16 boundary
  s.block_size = 4;
  s.lora_name = "ad";
  s.extra_keys.resize(2);
  s.extra_keys[0].lora_name = "ad";
  s.extra_keys[0].mm_items = {{"img", -2}};
  s.group_id = 1;
  s.medium = "CPU";  // a host tier's block; the BlockRemoved below keeps the default "GPU"
  return {KVEvent{0, s}, KVEvent{1, BlockRemoved{{digest(1)}, 0}}, KVEvent{2, AllBlocksCleared{}}};
}

std::span<const std::uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

class WireRoundTrip : public ::testing::TestWithParam<std::tuple<EventEncoding, HashFormat>> {};

TEST_P(WireRoundTrip, DecodesWhatItEncodes) {
  WireOptions o;
  o.encoding = std::get<0>(GetParam());
  o.hash_format = std::get<1>(GetParam());
  o.data_parallel_rank = 3;
  o.groups = {GroupWireSpec::from(AttentionSpec::full(4)),
              GroupWireSpec::from(AttentionSpec::sliding(4, 64))};
  const auto events = sample_events();
  std::string payload;
  encode_event_batch(events, 1234.5, o, payload);
  const WireBatch b = decode_event_batch(bytes(payload));
  EXPECT_EQ(b.ts, 1234.5);
  EXPECT_EQ(b.data_parallel_rank, 3);
  ASSERT_EQ(b.events.size(), 3u);
  const auto& s = std::get<BlockStored>(events[0].data);
  EXPECT_EQ(b.events[0].type, WireEventType::kBlockStored);
  EXPECT_EQ(b.events[0].block_ids,
            (std::vector<std::uint64_t>{s.block_hashes[0].event_id(), s.block_hashes[1].event_id()}));
  EXPECT_EQ(b.events[0].parent_block_id, s.parent_block_hash->event_id());
  EXPECT_EQ(b.events[0].token_ids, s.token_ids);
  EXPECT_EQ(b.events[0].block_size, 4u);
  EXPECT_EQ(b.events[0].medium, "CPU");
  EXPECT_EQ(b.events[0].lora_name, "ad");
  EXPECT_EQ(b.events[0].group_idx, 1);
  EXPECT_EQ(b.events[1].type, WireEventType::kBlockRemoved);
  EXPECT_EQ(b.events[1].block_ids, std::vector<std::uint64_t>{digest(1).event_id()});
  EXPECT_EQ(b.events[1].medium, "GPU");
  EXPECT_EQ(b.events[1].group_idx, 0);
  EXPECT_EQ(b.events[2].type, WireEventType::kAllBlocksCleared);
}

INSTANTIATE_TEST_SUITE_P(All, WireRoundTrip,
                         ::testing::Combine(::testing::Values(EventEncoding::kArrayLike,
                                                              EventEncoding::kMap),
                                            ::testing::Values(HashFormat::kInt64,
                                                              HashFormat::kBytes)));

// Each event's own medium is sent; WireOptions::medium only fills in an empty one.
TEST(Wire, EventMediumWinsOverTheDefault) {
  WireOptions o;
  o.medium = "DISK";
  std::vector<KVEvent> events = sample_events();
  std::get<BlockRemoved>(events[1].data).medium.clear();
  std::string payload;
  encode_event_batch(events, 1, o, payload);
  const WireBatch b = decode_event_batch(bytes(payload));
  EXPECT_EQ(b.events[0].medium, "CPU");
  EXPECT_EQ(b.events[1].medium, "DISK");
}

TEST(Wire, BytesHashesAreWholeDigests) {
  WireOptions o;
  o.hash_format = HashFormat::kBytes;
  std::string a, b;
  encode_event_batch(sample_events(), 1, o, a);
  o.hash_format = HashFormat::kInt64;
  encode_event_batch(sample_events(), 1, o, b);
  // Two 32-byte hashes and a parent as bin (2 + 32 bytes each) instead of uint64 (9 bytes each).
  EXPECT_GT(a.size(), b.size() + 3 * 25);
}

TEST(Wire, SequenceFramesAreBigEndian) {
  char f[8];
  put_seq(0x0102030405060708ull, f);
  EXPECT_EQ(std::string(f, 8), std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  EXPECT_EQ(get_seq({reinterpret_cast<const std::uint8_t*>(f), 8}), 0x0102030405060708ll);
  put_seq(static_cast<std::uint64_t>(kReplayEnd), f);
  EXPECT_EQ(get_seq({reinterpret_cast<const std::uint8_t*>(f), 8}), -1);
  EXPECT_THROW(get_seq({reinterpret_cast<const std::uint8_t*>(f), 7}), Error);
}

TEST(Wire, IdFromBytesMatchesEventId) {
  const BlockHash h = digest(7);
  EXPECT_EQ(id_from_bytes(h.bytes()), h.event_id());
}

TEST(Wire, RejectsMalformedPayloads) {
  for (const std::string& bad : {std::string(""), std::string("\xc1"), std::string("\x91\x01"),
                                std::string("\x92\xcb\0\0\0\0\0\0\0\0\x91\x91\xa3" "Bad", 16)}) {
    try {
      decode_event_batch(bytes(bad));
      ADD_FAILURE() << "accepted a malformed payload of " << bad.size() << " bytes";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kParseError);
    }
  }
}

// Issue 41: bytes after a valid batch, and payloads over the decode limits, are refused with
// their reason (before, the trailing bytes were ignored and there were no limits).
TEST(Wire, RefusesTrailingBytesAndPayloadsOverTheLimits) {
  std::string good;
  encode_event_batch(sample_events(), 1.5, {}, good);
  WireBatch b;
  EXPECT_EQ(try_decode_event_batch(bytes(good), {}, b), DecodeFailure::kNone);
  std::string msg;
  EXPECT_EQ(try_decode_event_batch(bytes(good + '\x01'), {}, b, &msg),
            DecodeFailure::kTrailingBytes);
  EXPECT_NE(msg.find("1 bytes after the batch"), std::string::npos) << msg;
  EXPECT_THROW(decode_event_batch(bytes(good + good)), Error);

  DecodeLimits small;
  small.max_bytes = good.size() - 1;
  EXPECT_EQ(try_decode_event_batch(bytes(good), small, b), DecodeFailure::kTooLarge);
  small = {};
  small.max_elements = 10;
  EXPECT_EQ(try_decode_event_batch(bytes(good), small, b), DecodeFailure::kTooManyElements);
  small = {};
  small.max_depth = 2;  // batch > events > event > block_hashes: depth 4
  EXPECT_EQ(try_decode_event_batch(bytes(good), small, b), DecodeFailure::kTooManyElements);
  try {
    decode_event_batch(bytes(good), small);
    ADD_FAILURE() << "accepted a payload nested past the limit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kParseError);
    EXPECT_NE(std::string(e.what()).find("too many elements"), std::string::npos) << e.what();
  }
  // An array header declaring 2^32 - 1 items in 5 bytes: refused before anything is allocated.
  EXPECT_EQ(try_decode_event_batch(bytes(std::string("\xdd\xff\xff\xff\xff", 5)), {}, b),
            DecodeFailure::kTooManyElements);
  // 100,000 nested arrays (100 KB): refused by depth, not decoded.
  EXPECT_EQ(try_decode_event_batch(bytes(std::string(100000, '\x91')), {}, b),
            DecodeFailure::kTooManyElements);
  EXPECT_EQ(try_decode_event_batch(bytes(std::string("\xc1")), {}, b), DecodeFailure::kMalformed);
}

TEST(Wire, EmptyHashIsAnError) {
  std::string out;
  const std::vector<KVEvent> ev{KVEvent{0, BlockRemoved{{BlockHash()}, 0}}};
  EXPECT_THROW(encode_event_batch(ev, 0, {}, out), Error);
}

}  // namespace
}  // namespace pagedkv::events
