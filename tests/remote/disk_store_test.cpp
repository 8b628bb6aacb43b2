// DiskStore on temporary directories under std::filesystem::temp_directory_path(): round trips,
// LRU eviction, restart, corruption and misplaced values between runs, the directory lock, and a
// writer process killed with SIGKILL mid-run.
#include "pagedkv/remote/disk_store.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>

#include "expect_error.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/remote/remote_value.hpp"

namespace pagedkv {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr std::size_t kValue = 3000;  // slot of 4096 bytes

BlockHash key_of(std::uint64_t i, std::uint8_t salt = 0) {
  std::array<std::uint8_t, 32> b{};
  for (int k = 0; k < 8; ++k) b[k] = static_cast<std::uint8_t>(i >> (8 * k));
  b[8] = salt;
  b[31] = 0x5a;
  return BlockHash(b);
}

std::vector<std::byte> bytes_of(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x & 0xff);
  }
  return v;
}

// A fresh directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() /
            ("pagedkv-disk-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    fs::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

DiskStoreConfig config_for(const fs::path& dir, std::uint64_t slots = 64) {
  DiskStoreConfig c;
  c.directory = dir;
  c.name_space = "test/model-a/bf16";
  c.layout_fingerprint = layout_fingerprint("layer-first,bf16,block16");
  c.value_bytes = kValue;
  c.capacity_bytes = slots * DiskStore::slot_bytes_for(kValue);
  c.op_timeout = 10000ms;
  c.sync_on_close = false;
  return c;
}

std::vector<RemoteCompletion> collect(DiskStore& s, std::size_t n) {
  std::vector<RemoteCompletion> all, buf;
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (all.size() < n && std::chrono::steady_clock::now() < end) {
    buf.clear();
    s.wait(buf, 20ms);
    all.insert(all.end(), buf.begin(), buf.end());
  }
  std::sort(all.begin(), all.end(), [](const RemoteCompletion& a, const RemoteCompletion& b) {
    return a.ticket != b.ticket ? a.ticket < b.ticket : a.index < b.index;
  });
  return all;
}

// Each helper submits one op and waits for its completion.
RemoteResult put1(DiskStore& s, std::uint64_t i, const std::vector<std::byte>& v,
                  BlockHash parent = {}) {
  const RemotePut op{key_of(i), v, parent, 0};
  if (!s.put(std::span(&op, 1))) return RemoteResult::kError;
  const auto c = collect(s, 1);
  return c.size() == 1 ? c[0].result : RemoteResult::kTimeout;
}

RemoteResult get1(DiskStore& s, std::uint64_t i, std::vector<std::byte>& dest,
                  BlockHash parent = {}) {
  const RemoteGet op{key_of(i), dest, parent, 0};
  if (!s.get(std::span(&op, 1))) return RemoteResult::kError;
  const auto c = collect(s, 1);
  return c.size() == 1 ? c[0].result : RemoteResult::kTimeout;
}

bool exists1(DiskStore& s, std::uint64_t i) {
  const BlockHash k = key_of(i);
  if (!s.exists(std::span(&k, 1))) return false;
  const auto c = collect(s, 1);
  return c.size() == 1 && c[0].result == RemoteResult::kHit;
}

void patch_file(const fs::path& file, std::uint64_t offset, std::span<const std::byte> bytes) {
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)),
            static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

std::vector<std::byte> read_file(const fs::path& file, std::uint64_t offset, std::size_t n) {
  std::vector<std::byte> v(n);
  const int fd = ::open(file.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::pread(fd, v.data(), n, static_cast<off_t>(offset)), static_cast<ssize_t>(n));
  ::close(fd);
  return v;
}

TEST(DiskStore, RoundTripsRealBytesInBatches) {
  TempDir dir;
  DiskStore s(config_for(dir.path()));
  EXPECT_EQ(s.slot_bytes(), 4096u);
  EXPECT_EQ(s.num_slots(), 64u);
  std::vector<std::vector<std::byte>> vals;
  std::vector<RemotePut> puts;
  for (std::uint64_t i = 0; i < 40; ++i) vals.push_back(bytes_of(kValue, i));
  for (std::uint64_t i = 0; i < 40; ++i) puts.push_back({key_of(i), vals[i], key_of(i, 1), 0});
  ASSERT_TRUE(s.put(puts));
  auto c = collect(s, 40);
  ASSERT_EQ(c.size(), 40u);
  for (const auto& x : c) EXPECT_EQ(x.result, RemoteResult::kStored);

  std::vector<std::vector<std::byte>> out(41, std::vector<std::byte>(kValue, std::byte{7}));
  std::vector<RemoteGet> gets;
  for (std::uint64_t i = 0; i <= 40; ++i) gets.push_back({key_of(i), out[i], key_of(i, 1), 0});
  ASSERT_TRUE(s.get(gets));
  c = collect(s, 41);
  ASSERT_EQ(c.size(), 41u);
  for (std::uint64_t i = 0; i < 40; ++i) {
    EXPECT_EQ(c[i].result, RemoteResult::kHit) << i;
    EXPECT_EQ(out[i], vals[i]) << i;
  }
  EXPECT_EQ(c[40].result, RemoteResult::kMiss);
  EXPECT_EQ(out[40], std::vector<std::byte>(kValue, std::byte{7}));  // untouched on a miss
  EXPECT_TRUE(exists1(s, 3));
  EXPECT_FALSE(exists1(s, 99));
  const auto st = s.stats();
  EXPECT_EQ(st.stored, 40u);
  EXPECT_EQ(st.hits, 40u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.bytes_out, 40 * kValue);
  EXPECT_EQ(st.bytes_in, 40 * kValue);
  EXPECT_EQ(st.probes, 2u);
  EXPECT_EQ(st.probe_hits, 1u);
  EXPECT_EQ(s.in_flight(), 0u);
}

TEST(DiskStore, ReputReplacesTheValue) {
  TempDir dir;
  DiskStore s(config_for(dir.path(), 4));
  ASSERT_EQ(put1(s, 1, bytes_of(kValue, 100)), RemoteResult::kStored);
  ASSERT_EQ(put1(s, 1, bytes_of(kValue, 200)), RemoteResult::kStored);
  EXPECT_EQ(s.size(), 1u);
  std::vector<std::byte> out(kValue);
  ASSERT_EQ(get1(s, 1, out), RemoteResult::kHit);
  EXPECT_EQ(out, bytes_of(kValue, 200));
}

TEST(DiskStore, EvictsTheLeastRecentlyUsedAtCapacity) {
  TempDir dir;
  DiskStore s(config_for(dir.path(), 4));
  for (std::uint64_t i = 0; i < 4; ++i)
    ASSERT_EQ(put1(s, i, bytes_of(kValue, i)), RemoteResult::kStored);
  std::vector<std::byte> out(kValue);
  ASSERT_EQ(get1(s, 0, out), RemoteResult::kHit);  // 0 becomes the most recent; 1 is the LRU
  ASSERT_EQ(put1(s, 4, bytes_of(kValue, 4)), RemoteResult::kStored);
  EXPECT_FALSE(exists1(s, 1));
  EXPECT_TRUE(exists1(s, 0));  // exists does not promote
  ASSERT_EQ(put1(s, 5, bytes_of(kValue, 5)), RemoteResult::kStored);
  EXPECT_FALSE(exists1(s, 2));
  for (std::uint64_t i : {0, 3, 4, 5}) {
    ASSERT_EQ(get1(s, i, out), RemoteResult::kHit) << i;
    EXPECT_EQ(out, bytes_of(kValue, i));
  }
  EXPECT_EQ(s.size(), 4u);
}

// io_threads == 2 splits runs of gets or puts of large values across two threads; the results,
// the bytes and the index (contents, LRU order, what a restart finds) must be those of one
// thread, for batches that evict, re-put a key twice in one run, miss, and meet a corrupted
// slot.
TEST(DiskStore, TwoIoThreadsGiveWhatOneGives) {
  constexpr std::size_t kBig = std::size_t{40} << 10;  // above the split threshold (32 KiB)
  struct Trace {
    std::vector<RemoteResult> results;
    std::vector<std::vector<std::byte>> read;
    std::vector<bool> present;  // keys 0..29 after the run, and after a restart
    std::uint64_t checksum_failures = 0;
  };
  auto run = [&](int threads) -> Trace {
    TempDir dir;
    DiskStoreConfig c = config_for(dir.path(), 12);
    c.value_bytes = kBig;
    c.capacity_bytes = 12 * DiskStore::slot_bytes_for(kBig);
    c.io_threads = threads;
    Trace t;
    std::vector<std::vector<std::byte>> src;
    for (std::uint64_t i = 0; i < 30; ++i) src.push_back(bytes_of(kBig, 100 + i));
    std::vector<std::vector<std::byte>> dst(16, std::vector<std::byte>(kBig));
    {
      DiskStore s(c);
      auto puts = [&](std::vector<std::uint64_t> keys) {
        std::vector<RemotePut> ops;
        for (std::uint64_t k : keys) ops.push_back({key_of(k), src[k], {}, 0});
        ASSERT_TRUE(s.put(ops));
        for (const auto& r : collect(s, ops.size())) t.results.push_back(r.result);
      };
      auto gets = [&](std::vector<std::uint64_t> keys) {
        std::vector<RemoteGet> ops;
        for (std::size_t i = 0; i < keys.size(); ++i) {
          std::fill(dst[i].begin(), dst[i].end(), std::byte{0});
          ops.push_back({key_of(keys[i]), dst[i], {}, 0});
        }
        ASSERT_TRUE(s.get(ops));
        for (const auto& r : collect(s, ops.size())) t.results.push_back(r.result);
        for (std::size_t i = 0; i < keys.size(); ++i) t.read.push_back(dst[i]);
      };
      auto snapshot = [&] {  // which keys are stored now
        for (std::uint64_t k = 0; k < 30; ++k) {
          t.present.push_back(s.slot_offset_of(key_of(k)).has_value());
        }
      };
      puts({0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
      gets({3, 1, 25, 8});               // one miss; 3, 1, 8 promoted in this order
      puts({10, 11, 12, 13, 3, 14, 3});  // evicts the LRU; key 3 put twice in one run
      snapshot();
      const auto off = s.payload_offset_of(key_of(8));
      if (!off) {
        ADD_FAILURE() << "key 8 is not stored";
        return t;
      }
      const std::array<std::byte, 1> flip{std::byte{0x5a}};
      patch_file(s.slab_path(), *off + 9, flip);
      gets({8, 1, 14, 3, 0, 12});  // 8 is corrupt: a counted miss, dropped
      snapshot();
      puts({15, 16, 17});
      snapshot();
      t.checksum_failures = s.stats().checksum_failures;
    }
    DiskStore again(c);
    for (std::uint64_t k = 0; k < 30; ++k)
      t.present.push_back(again.slot_offset_of(key_of(k)).has_value());
    return t;
  };
  const Trace one = run(1);
  const Trace two = run(2);
  EXPECT_EQ(one.results, two.results);
  EXPECT_EQ(one.read, two.read);
  EXPECT_EQ(one.present, two.present);
  EXPECT_EQ(one.checksum_failures, 1u);
  EXPECT_EQ(two.checksum_failures, 1u);
  // And they are right: the hits returned their bytes, 8 was dropped, the LRU was evicted.
  ASSERT_EQ(one.results.size(), 10u + 4 + 7 + 6 + 3);
  EXPECT_EQ(one.results[10 + 2], RemoteResult::kMiss);      // key 25
  EXPECT_EQ(one.results[21], RemoteResult::kInvalidValue);  // key 8, corrupted
  EXPECT_EQ(one.read[4 + 1], bytes_of(kBig, 101));          // key 1
  EXPECT_EQ(one.read[4 + 3], bytes_of(kBig, 103));          // key 3 (put twice)
  // After the second puts: the four least recently used (0, 2, 4, 5) evicted, 6 kept.
  EXPECT_FALSE(one.present[0] || one.present[2] || one.present[4] || one.present[5]);
  EXPECT_TRUE(one.present[6] && one.present[3] && one.present[14]);
  EXPECT_FALSE(one.present[30 + 8]);  // dropped by its failed get
  EXPECT_TRUE(one.present[60 + 17] && one.present[60 + 1]);
  ASSERT_EQ(one.present.size(), 4u * 30);
  EXPECT_EQ(std::vector<bool>(one.present.begin() + 60, one.present.begin() + 90),
            std::vector<bool>(one.present.begin() + 90, one.present.end()));  // the restart
  EXPECT_THROW(
      [] {
        TempDir d;
        DiskStoreConfig c = config_for(d.path());
        c.io_threads = 3;
        DiskStore s(c);
      }(),
      Error);
}

TEST(DiskStore, ARestartedStoreReusesValuesAndTheirOrder) {
  TempDir dir;
  {
    DiskStore s(config_for(dir.path(), 9));
    for (std::uint64_t i = 0; i < 8; ++i)
      ASSERT_EQ(put1(s, i, bytes_of(kValue, i), key_of(i, 9)), RemoteResult::kStored);
    // A re-put goes to the free slot; the old slot of 2 is retired.
    ASSERT_EQ(put1(s, 2, bytes_of(kValue, 22), key_of(2, 9)), RemoteResult::kStored);
  }
  DiskStore s(config_for(dir.path(), 9));
  EXPECT_EQ(s.open_stats().empty, 1u);
  EXPECT_EQ(s.open_stats().duplicates, 0u);
  EXPECT_EQ(s.open_stats().recovered, 8u);
  EXPECT_EQ(s.open_stats().invalid, 0u);
  EXPECT_FALSE(s.open_stats().reset);
  std::vector<std::byte> out(kValue);
  for (std::uint64_t i = 0; i < 8; ++i) {
    ASSERT_EQ(get1(s, i, out, key_of(i, 9)), RemoteResult::kHit) << i;
    EXPECT_EQ(out, bytes_of(kValue, i == 2 ? 22 : i)) << i;
  }
  // The gets above promoted 0..7 in turn: 0 is the LRU. 100 takes the free slot, 101 evicts 0.
  ASSERT_EQ(put1(s, 100, bytes_of(kValue, 100)), RemoteResult::kStored);
  EXPECT_TRUE(exists1(s, 0));
  ASSERT_EQ(put1(s, 101, bytes_of(kValue, 101)), RemoteResult::kStored);
  EXPECT_FALSE(exists1(s, 0));
  EXPECT_TRUE(exists1(s, 1));
}

TEST(DiskStore, RestartOrderFollowsPuts) {
  TempDir dir;
  {
    DiskStore s(config_for(dir.path(), 4));
    for (std::uint64_t i : {3, 1, 0, 2})
      ASSERT_EQ(put1(s, i, bytes_of(kValue, i)), RemoteResult::kStored);
  }
  DiskStore s(config_for(dir.path(), 4));
  ASSERT_EQ(put1(s, 10, bytes_of(kValue, 10)), RemoteResult::kStored);
  EXPECT_FALSE(exists1(s, 3));  // the oldest put is evicted first
  ASSERT_EQ(put1(s, 11, bytes_of(kValue, 11)), RemoteResult::kStored);
  EXPECT_FALSE(exists1(s, 1));
  EXPECT_TRUE(exists1(s, 0));
  EXPECT_TRUE(exists1(s, 2));
}

TEST(DiskStore, FlippedOrTruncatedSlotsBetweenRunsAreCountedMisses) {
  TempDir dir;
  fs::path slab;
  std::uint64_t off0 = 0, off2 = 0, off3 = 0;
  {
    DiskStore s(config_for(dir.path(), 4));
    for (std::uint64_t i = 0; i < 4; ++i)
      ASSERT_EQ(put1(s, i, bytes_of(kValue, i)), RemoteResult::kStored);
    slab = s.slab_path();
    off0 = *s.slot_offset_of(key_of(0));
    off2 = *s.slot_offset_of(key_of(2));
    off3 = *s.slot_offset_of(key_of(3));
  }
  const std::size_t value_at = DiskStore::kSlotRecordBytes + kRemoteValueHeaderSize;
  // Slot of 0: one payload byte flipped. Slot of 2: one record byte flipped.
  auto b = read_file(slab, off0 + value_at + 1234, 1);
  b[0] ^= std::byte{0x10};
  patch_file(slab, off0 + value_at + 1234, b);
  b = read_file(slab, off2 + 30, 1);
  b[0] ^= std::byte{0x01};
  patch_file(slab, off2 + 30, b);
  // The file ends inside the payload of 3 (the last slot, since 0..3 went to slots 0..3).
  ASSERT_EQ(off3, DiskStore::kFileHeaderBytes + 3 * 4096u);
  fs::resize_file(slab, off3 + value_at + 100);

  DiskStore s(config_for(dir.path(), 4));
  EXPECT_EQ(s.open_stats().invalid, 1u);  // the record of 2
  EXPECT_EQ(s.open_stats().recovered, 3u);
  // (The payload is read into the destination before it is checked: after a kInvalidValue its
  // bytes are unspecified, remote_store.hpp; the next hit into the same buffer overwrites them.)
  std::vector<std::byte> out(kValue, std::byte{1});
  EXPECT_EQ(get1(s, 0, out), RemoteResult::kInvalidValue);
  EXPECT_EQ(get1(s, 2, out), RemoteResult::kMiss);
  EXPECT_EQ(get1(s, 3, out), RemoteResult::kInvalidValue);  // the missing tail reads as zeros
  ASSERT_EQ(get1(s, 1, out), RemoteResult::kHit);
  EXPECT_EQ(out, bytes_of(kValue, 1));
  auto st = s.stats();
  EXPECT_EQ(st.checksum_failures, 2u);
  EXPECT_EQ(st.misses, 3u);
  EXPECT_EQ(st.hits, 1u);
  // A bad slot is dropped at its first failed get: the next is a plain miss.
  EXPECT_EQ(get1(s, 0, out), RemoteResult::kMiss);
  EXPECT_EQ(s.stats().checksum_failures, 2u);
  // The slots are reused.
  for (std::uint64_t i = 10; i < 13; ++i)
    ASSERT_EQ(put1(s, i, bytes_of(kValue, i)), RemoteResult::kStored);
  EXPECT_TRUE(exists1(s, 1));
}

// A slot record is hostile input: one forged with a valid checksum but a sequence number of
// UINT64_MAX used to be recovered and make the put counter (one above the highest found) wrap to
// 0, so later puts of the key ranked below it. Sequence numbers from 2^62 on are refused (the slot
// counted invalid, its value not recovered); the store goes on with the others.
TEST(DiskStore, ARecordWithAnImpossibleSequenceNumberIsInvalid) {
  TempDir dir;
  fs::path slab;
  std::uint64_t off1 = 0;
  {
    DiskStore s(config_for(dir.path(), 4));
    ASSERT_EQ(put1(s, 1, bytes_of(kValue, 1)), RemoteResult::kStored);
    ASSERT_EQ(put1(s, 2, bytes_of(kValue, 2)), RemoteResult::kStored);
    slab = s.slab_path();
    off1 = *s.slot_offset_of(key_of(1));
  }
  // The record: magic (8), sequence number (8), key size and key, checksum of the first 56 bytes.
  auto record = read_file(slab, off1, DiskStore::kSlotRecordBytes);
  for (int k = 0; k < 8; ++k) record[8 + k] = std::byte{0xff};
  const std::uint64_t sum = remote_checksum(std::span<const std::byte>(record.data(), 56));
  for (int k = 0; k < 8; ++k) record[56 + k] = static_cast<std::byte>(sum >> (8 * k));
  patch_file(slab, off1, record);
  {
    DiskStore s(config_for(dir.path(), 4));
    EXPECT_EQ(s.open_stats().invalid, 1u);
    EXPECT_EQ(s.open_stats().recovered, 1u);
    EXPECT_FALSE(exists1(s, 1));
    EXPECT_TRUE(exists1(s, 2));
    ASSERT_EQ(put1(s, 1, bytes_of(kValue, 11)), RemoteResult::kStored);
  }
  DiskStore s(config_for(dir.path(), 4));  // the new value of 1 is the one recovered
  EXPECT_EQ(s.open_stats().recovered, 2u);
  std::vector<std::byte> out(kValue);
  ASSERT_EQ(get1(s, 1, out), RemoteResult::kHit);
  EXPECT_EQ(out, bytes_of(kValue, 11));
}

// Values above a 4 KiB slot lie apart from their records and headers, each payload at a multiple
// of its (power-of-two) size: the page cache then holds it in large folios. Damage to a payload,
// a header or the file's tail is still a counted miss, and what is intact reloads.
TEST(DiskStore, LargePayloadsLieAlignedAndDamageStaysACountedMiss) {
  constexpr std::size_t kLarge = std::size_t{64} << 10;
  TempDir dir;
  DiskStoreConfig c = config_for(dir.path(), 5);
  c.value_bytes = kLarge;
  c.capacity_bytes = 5 * DiskStore::slot_bytes_for(kLarge);
  EXPECT_EQ(DiskStore::slot_bytes_for(kLarge), kLarge + 256);
  fs::path slab;
  std::vector<std::uint64_t> meta(5), payload(5);
  {
    DiskStore s(c);
    for (std::uint64_t i = 0; i < 5; ++i) {
      ASSERT_EQ(put1(s, i, bytes_of(kLarge, i)), RemoteResult::kStored);
      meta[i] = *s.slot_offset_of(key_of(i));
      payload[i] = *s.payload_offset_of(key_of(i));
      EXPECT_EQ(payload[i] % kLarge, 0u) << "key " << i;
      EXPECT_LT(meta[i] + DiskStore::kSlotRecordBytes + kRemoteValueHeaderSize, payload[0]);
    }
    std::vector<std::byte> out(kLarge);
    for (std::uint64_t i = 0; i < 5; ++i) {
      ASSERT_EQ(get1(s, i, out), RemoteResult::kHit);
      EXPECT_EQ(out, bytes_of(kLarge, i));
    }
    slab = s.slab_path();
  }
  // 0: one payload byte flipped. 1: one value header byte (its checksum) flipped. 2: another
  // payload written over it (a put cut short before its header: the old header stays).
  auto b = read_file(slab, payload[0] + 40000, 1);
  b[0] ^= std::byte{0x04};
  patch_file(slab, payload[0] + 40000, b);
  b = read_file(slab, meta[1] + DiskStore::kSlotRecordBytes + 24, 1);
  b[0] ^= std::byte{0x01};
  patch_file(slab, meta[1] + DiskStore::kSlotRecordBytes + 24, b);
  patch_file(slab, payload[2], bytes_of(kLarge, 99));
  // The file ends inside the last slot's payload (4: the slots were taken in order).
  ASSERT_EQ(payload[4], payload[3] + kLarge);
  fs::resize_file(slab, payload[4] + 1000);
  DiskStore s(c);
  EXPECT_EQ(s.open_stats().truncated, 1u);
  EXPECT_EQ(s.open_stats().recovered, 5u);  // records and headers all still check
  std::vector<std::byte> out(kLarge);
  EXPECT_EQ(get1(s, 0, out), RemoteResult::kInvalidValue);  // one get alone
  // The others in one batch (adjacent slots: one read of their headers).
  std::vector<std::vector<std::byte>> outs(4, std::vector<std::byte>(kLarge));
  std::vector<RemoteGet> ops;
  for (std::uint64_t i = 1; i < 5; ++i) ops.push_back({key_of(i), outs[i - 1], {}, 0});
  ASSERT_TRUE(s.get(ops));
  const auto done = collect(s, ops.size());
  ASSERT_EQ(done.size(), 4u);
  EXPECT_EQ(done[0].result, RemoteResult::kInvalidValue);
  EXPECT_EQ(done[1].result, RemoteResult::kInvalidValue);
  ASSERT_EQ(done[2].result, RemoteResult::kHit);
  EXPECT_EQ(outs[2], bytes_of(kLarge, 3));
  EXPECT_EQ(done[3].result, RemoteResult::kInvalidValue);  // the cut tail reads as zeros
  EXPECT_EQ(s.stats().checksum_failures, 4u);
  EXPECT_EQ(s.stats().hits, 1u);
  EXPECT_EQ(get1(s, 0, out), RemoteResult::kMiss);  // dropped at its failed get
  // The freed slots take new values that read back.
  std::vector<std::vector<std::byte>> vals;
  std::vector<RemotePut> puts;
  for (std::uint64_t i = 10; i < 14; ++i) vals.push_back(bytes_of(kLarge, i));
  for (std::uint64_t i = 10; i < 14; ++i) puts.push_back({key_of(i), vals[i - 10], {}, 0});
  ASSERT_TRUE(s.put(puts));
  for (const auto& r : collect(s, puts.size())) EXPECT_EQ(r.result, RemoteResult::kStored);
  for (std::uint64_t i = 10; i < 14; ++i) {
    ASSERT_EQ(get1(s, i, out), RemoteResult::kHit);
    EXPECT_EQ(out, bytes_of(kLarge, i));
  }
}

// Values of the layout apart in adjacent slots are read (written) in groups with one preadv
// (pwritev); a value that is not a whole number of pages leaves a gap before the next payload.
// Every value of a group lands in its own slot and destination, and damage to one stays that
// value's counted miss.
void grouped_payloads_keep_their_bytes(int io_threads) {
  SCOPED_TRACE(io_threads);
  constexpr std::size_t kOdd = 40000;  // payload stride 40960: 960 bytes of gap after each
  constexpr std::uint64_t kStride = 40960;
  constexpr std::uint64_t kN = 40;  // more than one group (1 MiB: 25 payloads)
  TempDir dir;
  DiskStoreConfig c = config_for(dir.path(), kN);
  c.value_bytes = kOdd;
  c.io_threads = io_threads;  // 2: each half of a run on its own thread, with its own scratch
  c.capacity_bytes = kN * DiskStore::slot_bytes_for(kOdd);
  std::vector<std::vector<std::byte>> vals;
  for (std::uint64_t i = 0; i < kN; ++i) vals.push_back(bytes_of(kOdd, 1000 + i));
  const auto get_all = [&](DiskStore& s, std::vector<std::vector<std::byte>>& outs) {
    outs.assign(kN, std::vector<std::byte>(kOdd));
    std::vector<RemoteGet> ops;
    for (std::uint64_t i = 0; i < kN; ++i) ops.push_back({key_of(i), outs[i], {}, 0});
    EXPECT_TRUE(s.get(ops));
    return collect(s, ops.size());
  };
  fs::path slab;
  std::vector<std::uint64_t> meta(kN), payload(kN);
  {
    DiskStore s(c);
    std::vector<RemotePut> puts;
    for (std::uint64_t i = 0; i < kN; ++i) puts.push_back({key_of(i), vals[i], {}, 0});
    ASSERT_TRUE(s.put(puts));  // one batch: runs of adjacent slots
    for (const auto& r : collect(s, puts.size())) ASSERT_EQ(r.result, RemoteResult::kStored);
    for (std::uint64_t i = 0; i < kN; ++i) {
      meta[i] = *s.slot_offset_of(key_of(i));
      payload[i] = *s.payload_offset_of(key_of(i));
      if (i > 0) {
        ASSERT_EQ(payload[i], payload[i - 1] + kStride) << "slots taken in order";
      }
      // The bytes on disk are the value's, at its own offset (not shifted by a neighbour's).
      ASSERT_EQ(read_file(s.slab_path(), payload[i], kOdd), vals[i]) << "key " << i;
    }
    std::vector<std::vector<std::byte>> outs;
    const auto done = get_all(s, outs);
    ASSERT_EQ(done.size(), kN);
    for (std::uint64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(done[i].result, RemoteResult::kHit) << "key " << i;
      EXPECT_EQ(outs[i], vals[i]) << "key " << i;
    }
    slab = s.slab_path();
  }
  // 7: a payload byte flipped; 20: a value header byte (its checksum) flipped; 33: another
  // payload written over it under the old header.
  auto b = read_file(slab, payload[7] + kOdd - 1, 1);
  b[0] ^= std::byte{0x80};
  patch_file(slab, payload[7] + kOdd - 1, b);
  b = read_file(slab, meta[20] + DiskStore::kSlotRecordBytes + 24, 1);
  b[0] ^= std::byte{0x01};
  patch_file(slab, meta[20] + DiskStore::kSlotRecordBytes + 24, b);
  patch_file(slab, payload[33], bytes_of(kOdd, 7));
  DiskStore s(c);
  EXPECT_EQ(s.open_stats().recovered, kN);
  std::vector<std::vector<std::byte>> outs;
  const auto done = get_all(s, outs);
  ASSERT_EQ(done.size(), kN);
  for (std::uint64_t i = 0; i < kN; ++i) {
    if (i == 7 || i == 20 || i == 33) {
      EXPECT_EQ(done[i].result, RemoteResult::kInvalidValue) << "key " << i;
    } else {
      ASSERT_EQ(done[i].result, RemoteResult::kHit) << "key " << i;
      EXPECT_EQ(outs[i], vals[i]) << "key " << i;
    }
  }
  EXPECT_EQ(s.stats().checksum_failures, 3u);
  EXPECT_EQ(s.stats().hits, kN - 3);
  EXPECT_EQ(s.size(), kN - 3);  // the damaged values were dropped
}

TEST(DiskStore, GroupedPayloadsOfAdjacentSlotsKeepTheirBytesAndDamageStaysACountedMiss) {
  grouped_payloads_keep_their_bytes(1);
  grouped_payloads_keep_their_bytes(2);
}

TEST(DiskStore, ACorruptedFileHeaderDiscardsTheSlab) {
  TempDir dir;
  fs::path slab;
  {
    DiskStore s(config_for(dir.path(), 4));
    ASSERT_EQ(put1(s, 1, bytes_of(kValue, 1)), RemoteResult::kStored);
    slab = s.slab_path();
  }
  auto b = read_file(slab, 20, 1);
  b[0] ^= std::byte{0x80};
  patch_file(slab, 20, b);
  DiskStore s(config_for(dir.path(), 4));
  EXPECT_TRUE(s.open_stats().reset);
  EXPECT_EQ(s.open_stats().recovered, 0u);
  std::vector<std::byte> out(kValue);
  EXPECT_EQ(get1(s, 1, out), RemoteResult::kMiss);
}

TEST(DiskStore, AnotherValueSizeOrNamespaceInTheDirectoryIsRefused) {
  TempDir dir;
  { DiskStore s(config_for(dir.path(), 4)); }
  auto c = config_for(dir.path(), 4);
  c.name_space = "test/model-b/bf16";
  EXPECT_THROW(DiskStore{c}, Error);
  c = config_for(dir.path(), 4);
  c.value_bytes = 5000;
  EXPECT_THROW(DiskStore{c}, Error);
  EXPECT_NO_THROW(DiskStore{config_for(dir.path(), 6)});  // another capacity is fine
}

TEST(DiskStore, AValueUnderAnotherKeyIsABindingMismatch) {
  TempDir dir;
  fs::path slab;
  std::uint64_t off_a = 0, off_b = 0;
  {
    DiskStore s(config_for(dir.path(), 4));
    ASSERT_EQ(put1(s, 1, bytes_of(kValue, 1)), RemoteResult::kStored);
    ASSERT_EQ(put1(s, 2, bytes_of(kValue, 2)), RemoteResult::kStored);
    // In one run: the value of 1 asked for with another parent (another prefix).
    std::vector<std::byte> out(kValue);
    EXPECT_EQ(get1(s, 1, out, key_of(77)), RemoteResult::kInvalidValue);
    EXPECT_EQ(s.stats().binding_mismatches, 1u);
    ASSERT_EQ(get1(s, 1, out), RemoteResult::kHit);  // still there for its own block
    slab = s.slab_path();
    off_a = *s.slot_offset_of(key_of(1));
    off_b = *s.slot_offset_of(key_of(2));
  }
  // Copy the value (header + payload) of 1 over the value of 2, keeping 2's record (its key).
  const std::size_t n = kRemoteValueHeaderSize + kValue;
  const auto v = read_file(slab, off_a + DiskStore::kSlotRecordBytes, n);
  patch_file(slab, off_b + DiskStore::kSlotRecordBytes, v);
  DiskStore s(config_for(dir.path(), 4));
  EXPECT_EQ(s.open_stats().recovered, 2u);
  std::vector<std::byte> out(kValue, std::byte{3});
  EXPECT_EQ(get1(s, 2, out), RemoteResult::kInvalidValue);  // (out's bytes: unspecified)
  EXPECT_EQ(s.stats().binding_mismatches, 1u);
  EXPECT_EQ(s.stats().checksum_failures, 0u);
  EXPECT_EQ(get1(s, 2, out), RemoteResult::kMiss);  // another block's value is dropped
  ASSERT_EQ(get1(s, 1, out), RemoteResult::kHit);
  EXPECT_EQ(out, bytes_of(kValue, 1));
}

TEST(DiskStore, ASecondOpenOfTheDirectoryIsRefusedWhileTheFirstHoldsIt) {
  TempDir dir;
  {
    DiskStore first(config_for(dir.path()));
    try {
      DiskStore second(config_for(dir.path()));
      ADD_FAILURE() << "second open accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidState);
      EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
    }
    // Another process is refused too.
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 2;
      try {
        DiskStore other(config_for(dir.path()));
        code = 0;
      } catch (const Error& e) {
        code = e.code() == ErrorCode::kInvalidState ? 1 : 3;
      } catch (...) {
        code = 4;
      }
      ::_exit(code);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 1);
    ASSERT_EQ(put1(first, 1, bytes_of(kValue, 1)), RemoteResult::kStored);
  }
  DiskStore again(config_for(dir.path()));  // released with the first
  EXPECT_EQ(again.open_stats().recovered, 1u);
}

// Both layouts: contiguous slots (kValue) and payloads apart from their headers (40 KiB, written
// payload first, header last).
TEST(DiskStore, AWriterKilledMidRunLosesNothingItAcknowledged) {
  TempDir dir;
  constexpr std::uint64_t kMax = 3000;
  std::mt19937_64 rng(std::random_device{}());
  for (int round = 0; round < 6; ++round) {
    const std::size_t value = round < 3 ? kValue : std::size_t{40} << 10;
    DiskStoreConfig config = config_for(dir.path(), kMax);
    config.value_bytes = value;
    config.capacity_bytes = kMax * DiskStore::slot_bytes_for(value);
    fs::remove_all(dir.path());
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the writer: puts batches, reports each acknowledged key on the pipe
      ::close(fds[0]);
      DiskStore s(config);
      std::vector<std::vector<std::byte>> vals(8);
      for (std::uint64_t i = 0; i < kMax; i += 8) {
        std::vector<RemotePut> ops;
        for (std::uint64_t k = 0; k < 8; ++k) {
          vals[k] = bytes_of(value, i + k);
          ops.push_back({key_of(i + k), vals[k], {}, 0});
        }
        if (!s.put(ops)) ::_exit(3);
        for (const auto& c : collect(s, 8)) {
          if (c.result != RemoteResult::kStored) ::_exit(4);
          const std::uint64_t key = i + c.index;
          if (::write(fds[1], &key, sizeof(key)) != sizeof(key)) ::_exit(5);
        }
      }
      for (;;) ::pause();  // never ends on its own: the parent always kills it
    }
    ::close(fds[1]);
    // Kill it after a random number of acknowledgements (well before it could finish).
    const std::uint64_t kill_after = std::uniform_int_distribution<std::uint64_t>(1, 1500)(rng);
    std::vector<std::uint64_t> acked;
    std::uint64_t key = 0;
    while (acked.size() < kill_after && ::read(fds[0], &key, sizeof(key)) == sizeof(key)) {
      acked.push_back(key);
    }
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended on its own: status " << status;
    while (::read(fds[0], &key, sizeof(key)) == sizeof(key)) acked.push_back(key);
    ::close(fds[0]);
    ASSERT_GE(acked.size(), kill_after);

    DiskStore s(config);
    std::vector<std::byte> out(value);
    std::vector<bool> is_acked(kMax, false);
    for (std::uint64_t k : acked) is_acked[k] = true;
    std::size_t hits = 0;
    for (std::uint64_t i = 0; i < kMax; ++i) {
      const RemoteResult r = get1(s, i, out);
      if (is_acked[i]) {
        ASSERT_EQ(r, RemoteResult::kHit)
            << "acknowledged key " << i << " lost (round " << round << ")";
      }
      if (r == RemoteResult::kHit) {
        ++hits;
        ASSERT_EQ(out, bytes_of(value, i)) << "wrong bytes for " << i;
      } else {
        ASSERT_TRUE(r == RemoteResult::kMiss || r == RemoteResult::kInvalidValue) << i;
      }
    }
    EXPECT_GE(hits, acked.size());
  }
}

// remote_store.hpp: every op completes by submission + op_timeout, after which the caller may
// reuse its buffer (RemoteTier frees host slots after its drain_timeout). The I/O thread takes up
// to 64 ops at a time; one taken before its deadline but reached after it (the reads or writes of
// the ops before it took longer) completes kTimeout without its I/O: a timed-out get never wrote
// into its destination, a timed-out put was never stored. 64 values of 1 MiB per batch take far
// longer than a 5 ms op_timeout to read or write (~100 ms on the 2-core CI VM), so a batch taken
// before its deadline ends with both hits (or stores) and timeouts; a batch the thread took late (a
// loaded machine) times out whole, so each part retries a few times until one batch is mixed.
TEST(DiskStore, TakenOpsPastTheirDeadlineTimeOutWithoutTouchingTheirBuffers) {
  constexpr std::size_t kBig = std::size_t{1} << 20;
  constexpr std::size_t kOps = 64;
  constexpr auto kSentinel = std::byte{0xee};
  constexpr auto kTimeout = 5ms;
  for (const int threads : {1, 2}) {
    SCOPED_TRACE("io_threads " + std::to_string(threads));
    std::vector<std::byte> src(kOps * kBig);
    for (std::size_t i = 0; i < kOps; ++i) {
      const auto v = bytes_of(4096, i + 1);
      for (std::size_t at = 0; at < kBig; at += v.size()) {
        std::memcpy(src.data() + i * kBig + at, v.data(), v.size());
      }
    }
    const auto value = [&](std::size_t i) {
      return std::span<const std::byte>(src).subspan(i * kBig, kBig);
    };
    const auto config = [&](const fs::path& dir, std::chrono::milliseconds timeout) {
      auto c = config_for(dir, kOps);
      c.value_bytes = kBig;
      c.capacity_bytes = kOps * DiskStore::slot_bytes_for(kBig);
      c.preallocate = false;
      c.io_threads = threads;
      c.op_timeout = timeout;
      return c;
    };
    std::vector<RemotePut> puts(kOps);
    for (std::size_t i = 0; i < kOps; ++i) puts[i] = RemotePut{key_of(i), value(i), {}, 0};

    // Puts: a timed-out put is not stored; a stored one reads back.
    bool mixed_puts = false;
    for (int attempt = 0; attempt < 10 && !mixed_puts; ++attempt) {
      TempDir dir;
      std::vector<RemoteCompletion> done;
      {
        DiskStore s(config(dir.path(), kTimeout));
        ASSERT_TRUE(s.put(puts).has_value());
        done = collect(s, kOps);
        ASSERT_EQ(done.size(), kOps);
        std::uint64_t timeouts = 0;
        for (const auto& c : done) timeouts += c.result == RemoteResult::kTimeout;
        EXPECT_EQ(s.stats().timeouts, timeouts);
        mixed_puts = timeouts > 0 && timeouts < kOps;
      }
      DiskStore s(config(dir.path(), 10000ms));
      std::vector<std::byte> dest(kBig);
      for (const auto& c : done) {
        ASSERT_TRUE(c.result == RemoteResult::kStored || c.result == RemoteResult::kTimeout)
            << to_string(c.result);
        const RemoteGet g{key_of(c.index), dest, {}, 0};
        ASSERT_TRUE(s.get(std::span(&g, 1)).has_value());
        const auto r = collect(s, 1);
        ASSERT_EQ(r.size(), 1u);
        if (c.result == RemoteResult::kTimeout) {
          EXPECT_EQ(r[0].result, RemoteResult::kMiss) << "put " << c.index;
        } else {
          ASSERT_EQ(r[0].result, RemoteResult::kHit) << "put " << c.index;
          EXPECT_TRUE(std::equal(dest.begin(), dest.end(), value(c.index).begin()));
        }
      }
    }
    EXPECT_TRUE(mixed_puts) << "no batch of puts both stored and timed out";

    // Gets: a timed-out get's destination keeps the sentinel; a hit holds the value.
    TempDir dir;
    {
      DiskStore s(config(dir.path(), 10000ms));
      ASSERT_TRUE(s.put(puts).has_value());
      for (const auto& c : collect(s, kOps)) ASSERT_EQ(c.result, RemoteResult::kStored);
    }
    DiskStore s(config(dir.path(), kTimeout));
    std::vector<std::byte> dst(kOps * kBig);
    std::vector<RemoteGet> gets(kOps);
    for (std::size_t i = 0; i < kOps; ++i) {
      gets[i] = RemoteGet{key_of(i), std::span(dst).subspan(i * kBig, kBig), {}, 0};
    }
    bool mixed_gets = false;
    std::uint64_t timeouts = 0;
    for (int attempt = 0; attempt < 10 && !mixed_gets; ++attempt) {
      std::fill(dst.begin(), dst.end(), kSentinel);
      ASSERT_TRUE(s.get(gets).has_value());
      const auto done = collect(s, kOps);
      ASSERT_EQ(done.size(), kOps);
      std::size_t hits = 0, round_timeouts = 0;
      for (const auto& c : done) {
        const auto d = std::span<const std::byte>(dst).subspan(c.index * kBig, kBig);
        if (c.result == RemoteResult::kHit) {
          ++hits;
          EXPECT_TRUE(std::equal(d.begin(), d.end(), value(c.index).begin())) << c.index;
        } else {
          ASSERT_EQ(c.result, RemoteResult::kTimeout) << to_string(c.result);
          ++round_timeouts;
          EXPECT_TRUE(std::all_of(d.begin(), d.end(), [&](std::byte b) { return b == kSentinel; }))
              << "get " << c.index << " timed out after writing into its destination";
        }
      }
      timeouts += round_timeouts;
      mixed_gets = hits > 0 && round_timeouts > 0;
    }
    EXPECT_TRUE(mixed_gets) << "no batch of gets both hit and timed out";
    EXPECT_EQ(s.stats().timeouts, timeouts);
  }
}

// The same for small values (one slot of 4096 bytes: reading or writing one takes microseconds,
// too little to push an op past a deadline of 1 ms or more reliably), made deterministic with
// DiskStoreConfig::on_ops_taken: the I/O thread is held in it first with a blocker op in hand,
// while a batch of gets and a batch of puts are queued behind it; then, once it has taken those
// (in one take: both were queued), until every deadline of theirs has passed. Each then completes
// kTimeout without its I/O: the gets' destinations keep their sentinel, the puts are not stored
// (the key put before keeps its value, the new key is a miss). A take that came only after the
// ops' deadlines (a loaded machine: the queue expires them, another path) is tried again.
TEST(DiskStore, SmallValuesTakenPastTheirDeadlineTimeOutWithoutTouchingTheirBuffers) {
  constexpr auto kSentinel = std::byte{0xee};
  constexpr auto kTimeout = 200ms;
  constexpr std::size_t kGets = 3;
  using SteadyClock = std::chrono::steady_clock;
  struct Hold {
    std::mutex mu;
    std::condition_variable cv;
    int calls = 0;                                 // on_ops_taken calls while armed
    bool release = false;                          // the first call may return
    std::optional<SteadyClock::time_point> until;  // the second call returns after
    std::size_t taken = 0;                         // ops of the second call
  };
  bool checked = false;
  for (int attempt = 0; attempt < 5 && !checked; ++attempt) {
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    TempDir dir;
    auto hold = std::make_shared<Hold>();
    std::atomic<bool> armed{false};
    auto c = config_for(dir.path());
    c.op_timeout = kTimeout;
    c.on_ops_taken = [hold, &armed](std::size_t n) {
      if (!armed.load()) return;
      std::unique_lock<std::mutex> lock(hold->mu);
      const int call = ++hold->calls;
      hold->cv.notify_all();
      if (call == 1) {
        hold->cv.wait(lock, [&] { return hold->release; });
      } else if (call == 2) {
        hold->taken = n;
        hold->cv.wait(lock, [&] { return hold->until.has_value(); });
        const SteadyClock::time_point until = *hold->until;
        lock.unlock();
        std::this_thread::sleep_until(until);
      }
    };
    DiskStore s(c);
    // Lets the I/O thread go before the store is destroyed (it joins the thread), whatever
    // assertion returns early.
    struct Release {
      std::shared_ptr<Hold> hold;
      ~Release() {
        {
          std::lock_guard<std::mutex> lock(hold->mu);
          hold->release = true;
          if (!hold->until) hold->until = SteadyClock::now();
        }
        hold->cv.notify_all();
      }
    } release{hold};
    std::vector<std::vector<std::byte>> old(kGets);
    for (std::size_t i = 0; i < kGets; ++i) {
      old[i] = bytes_of(kValue, 100 + i);
      ASSERT_EQ(put1(s, i, old[i]), RemoteResult::kStored);
    }
    const std::uint64_t timeouts_before = s.stats().timeouts;

    armed = true;
    const BlockHash blocker = key_of(0);
    ASSERT_TRUE(s.exists(std::span(&blocker, 1)).has_value());
    {
      std::unique_lock<std::mutex> lock(hold->mu);
      ASSERT_TRUE(hold->cv.wait_for(lock, 20s, [&] { return hold->calls >= 1; }));
    }
    // The I/O thread waits in on_ops_taken: these stay queued.
    std::vector<std::byte> dst(kGets * kValue, kSentinel);
    std::vector<RemoteGet> gets(kGets);
    for (std::size_t i = 0; i < kGets; ++i) {
      gets[i] = RemoteGet{key_of(i), std::span(dst).subspan(i * kValue, kValue), {}, 0};
    }
    const auto fresh = bytes_of(kValue, 7);
    const std::array<RemotePut, 2> puts{RemotePut{key_of(0), fresh, {}, 0},
                                        RemotePut{key_of(kGets), fresh, {}, 0}};
    const auto get_ticket = s.get(gets);
    const auto put_ticket = s.put(puts);
    const SteadyClock::time_point submitted = SteadyClock::now();  // after every deadline's start
    ASSERT_TRUE(get_ticket.has_value());
    ASSERT_TRUE(put_ticket.has_value());
    {
      std::lock_guard<std::mutex> lock(hold->mu);
      hold->release = true;
    }
    hold->cv.notify_all();
    {
      std::unique_lock<std::mutex> lock(hold->mu);
      // The second take (or none: the queue expired them first and completes them itself).
      (void)hold->cv.wait_for(lock, kTimeout + 5s, [&] { return hold->calls >= 2; });
      hold->until = submitted + kTimeout + 1ms;  // past each op's deadline
    }
    hold->cv.notify_all();
    const auto done = collect(s, 1 + kGets + puts.size());
    ASSERT_EQ(done.size(), 1 + kGets + puts.size());
    armed = false;
    std::size_t taken = 0;
    {
      std::lock_guard<std::mutex> lock(hold->mu);
      taken = hold->calls >= 2 ? hold->taken : 0;
    }
    if (taken != kGets + puts.size()) continue;  // not taken in one take before the deadlines
    checked = true;
    for (const auto& d : done) {
      if (d.ticket != *get_ticket && d.ticket != *put_ticket) {
        EXPECT_EQ(d.result, RemoteResult::kHit);  // the blocker
        continue;
      }
      EXPECT_EQ(d.result, RemoteResult::kTimeout)
          << (d.ticket == *get_ticket ? "get " : "put ") << d.index << ": " << to_string(d.result);
    }
    EXPECT_EQ(s.stats().timeouts - timeouts_before, kGets + puts.size());
    EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [&](std::byte b) { return b == kSentinel; }))
        << "a get timed out after writing into its destination";
    // The puts were not stored: key 0 keeps its value, the new key is not there.
    std::vector<std::byte> back(kValue);
    ASSERT_EQ(get1(s, 0, back), RemoteResult::kHit);
    EXPECT_EQ(back, old[0]);
    EXPECT_EQ(get1(s, kGets, back), RemoteResult::kMiss);
    EXPECT_FALSE(exists1(s, kGets));
  }
  EXPECT_TRUE(checked) << "the I/O thread never took the ops before their deadlines";
}

// An on_ops_taken that throws is ignored (DiskStoreConfig): the I/O thread lives on and the ops
// it had taken run as if the hook had returned (an exception escaping the thread terminated the
// process).
TEST(DiskStore, AnOnOpsTakenThatThrowsIsIgnored) {
  TempDir dir;
  std::atomic<int> calls{0};
  auto c = config_for(dir.path());
  c.on_ops_taken = [&calls](std::size_t) {
    ++calls;
    throw std::runtime_error("on_ops_taken");
  };
  DiskStore s(c);
  const auto v = bytes_of(kValue, 9);
  EXPECT_EQ(put1(s, 1, v), RemoteResult::kStored);
  std::vector<std::byte> back(kValue);
  EXPECT_EQ(get1(s, 1, back), RemoteResult::kHit);
  EXPECT_EQ(back, v);
  EXPECT_GE(calls.load(), 2);
}

// An op_timeout meant as "never" (milliseconds::max()) overflowed submission + op_timeout (every
// op timed out at once): timeouts above a day are refused by name. A wait() of
// microseconds::max() overflowed its end the same way and returned at once; it waits until a
// completion arrives.
TEST(DiskStore, HugeTimeoutsAreRefusedAndAnEndlessWaitWaitsForACompletion) {
  TempDir dir;
  for (const auto t : {std::chrono::milliseconds::max(), std::chrono::milliseconds(86400001)}) {
    auto c = config_for(dir.path(), 8);
    c.op_timeout = t;
    testing::expect_error([&] { DiskStore s(c); }, ErrorCode::kInvalidArgument, "op_timeout");
  }
  auto c = config_for(dir.path(), 8);
  c.op_timeout = std::chrono::hours(24);  // the longest accepted
  DiskStore s(c);
  const auto v = bytes_of(kValue, 7);
  EXPECT_EQ(put1(s, 1, v), RemoteResult::kStored);

  std::size_t got = 0;
  std::vector<RemoteCompletion> out;
  std::thread waiter([&] { got = s.wait(out, std::chrono::microseconds::max()); });
  std::this_thread::sleep_for(50ms);  // the waiter is waiting on an idle store
  const BlockHash k = key_of(1);
  ASSERT_TRUE(s.exists(std::span(&k, 1)).has_value());
  waiter.join();
  ASSERT_EQ(got, 1u);
  EXPECT_EQ(out[0].result, RemoteResult::kHit);
}

TEST(DiskStore, RefusesMisuseAndCountsQueueDrops) {
  TempDir dir;
  auto c = config_for(dir.path(), 8);
  c.queue_depth = 4;
  DiskStore s(c);
  std::vector<std::byte> small(kValue - 1);
  const RemotePut bad_put{key_of(1), small, {}, 0};
  EXPECT_THROW(s.put(std::span(&bad_put, 1)), Error);
  const RemoteGet bad_get{key_of(1), small, {}, 0};
  EXPECT_THROW(s.get(std::span(&bad_get, 1)), Error);
  const BlockHash empty;
  EXPECT_THROW(s.exists(std::span(&empty, 1)), Error);
  const std::vector<BlockHash> five{key_of(1), key_of(2), key_of(3), key_of(4), key_of(5)};
  EXPECT_FALSE(s.exists(five).has_value());
  EXPECT_EQ(s.stats().queue_full_drops, 5u);
  EXPECT_EQ(s.in_flight(), 0u);

  auto bad = config_for(dir.path() / "x", 8);
  bad.value_bytes = 0;
  EXPECT_THROW(DiskStore{bad}, Error);
  bad = config_for(dir.path() / "x", 8);
  bad.capacity_bytes = 4095;
  EXPECT_THROW(DiskStore{bad}, Error);
  bad = config_for(dir.path() / "x", 8);
  bad.name_space.clear();
  EXPECT_THROW(DiskStore{bad}, Error);
}

}  // namespace
}  // namespace pagedkv
