// pagedkv-tiny-engine --disk DIR: two engine processes run one after the other on the same
// workload and the same directory (a pagedkv::DiskStore below the host tier). The first computes
// the prefill and writes its blocks to the disk store; the second finds them at start (the index
// rebuilt from the file) and loads them instead: fewer prefill tokens computed, and the same
// greedy tokens and bitwise-identical logits as the first process (results digest) and as caching
// off (--compare). Then the file is damaged between processes: one value's payload byte flipped,
// later the file truncated through a value; each is a counted miss (rejected value, truncated
// slots), never a failure or different bits.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli_run.hpp"
#include "pagedkv/remote/disk_store.hpp"
#include "pagedkv/remote/remote_value.hpp"

namespace {

namespace fs = std::filesystem;

// A small agents workload: 4 sessions of 2 turns sharing a 96-token system prompt.
constexpr const char* kWorkload = "--sessions 4 --turns 2 --system-tokens 96";

using Cli = pagedkv::test::CliRun;
using pagedkv::test::json_text;

Cli run_engine(const std::string& args) {
  return pagedkv::test::run_cli(PAGEDKV_TINY_ENGINE, args);
}
long long field(const std::string& json, const std::string& name) {
  return pagedkv::test::json_uint(json, name);
}
bool has(const std::string& json, const std::string& text) {
  return pagedkv::test::contains(json, text);
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "pagedkv-tiny-disk-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::uint64_t le64(const std::vector<unsigned char>& b, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t(b[at + i]) << (8 * i);
  return v;
}

// File offsets of the payloads of the slab's slots that hold a record (a stored value), from the
// file itself (disk_store.hpp's two layouts: version 1 contiguous slots, version 2 records and
// headers in 256-byte entries after the file header, payloads aligned in a region after them).
std::vector<std::uint64_t> stored_payloads(const fs::path& slab, std::uint64_t& value_bytes) {
  std::vector<unsigned char> bytes(fs::file_size(slab));
  FILE* f = std::fopen(slab.c_str(), "rb");
  if (f == nullptr) return {};
  const std::size_t got = std::fread(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  constexpr std::uint64_t kHeader = pagedkv::DiskStore::kFileHeaderBytes;
  if (got != bytes.size() || bytes.size() < kHeader) return {};
  const std::uint64_t version = le64(bytes, 8) & 0xffffffffu;
  const std::uint64_t slot_bytes = le64(bytes, 16);  // the file header's slot size
  value_bytes = le64(bytes, 24);
  const std::uint64_t size = bytes.size();
  const std::uint64_t to_payload =
      pagedkv::DiskStore::kSlotRecordBytes + pagedkv::kRemoteValueHeaderSize;
  std::uint64_t meta_stride = slot_bytes, slots = (size - kHeader) / slot_bytes, base = 0;
  const std::uint64_t stride = slot_bytes - 256;
  if (version == 2) {  // the slot count whose layout ends exactly at the file's end
    meta_stride = 256;
    const std::uint64_t align = std::min<std::uint64_t>(stride & (~stride + 1), 2u << 20);
    for (; slots > 0; --slots) {
      base = (kHeader + slots * 256 + align - 1) / align * align;
      if (base + slots * stride == size) break;
    }
    if (slots == 0) return {};
  }
  std::vector<std::uint64_t> out;
  for (std::uint64_t s = 0; s < slots; ++s) {
    const std::uint64_t off = kHeader + s * meta_stride;
    if (le64(bytes, off) != 0x31544f4c53564b50ull) continue;  // "PKVSLOT1"
    out.push_back(version == 2 ? base + s * stride : off + to_payload);
  }
  return out;
}

void expect_same_bits(const Cli& run, const std::string& digest) {
  const std::string& j = run.output;
  EXPECT_TRUE(has(j, "\"identical_tokens\":true")) << j;
  EXPECT_TRUE(has(j, "\"bitwise_identical_logits\":true")) << j;
  EXPECT_TRUE(has(j, "\"pass\":true")) << j;
  EXPECT_TRUE(has(j, "\"remote_drained_on\":true")) << j;
  EXPECT_EQ(json_text(j, "results_digest_on"), digest) << j;
  EXPECT_EQ(json_text(j, "results_digest_off"), digest) << j;
}

TEST(TinyEngineDisk, SecondProcessReusesTheDiskAndDamageIsACountedMiss) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const fs::path store = dir.path() / "store";
  const std::string args = std::string("--compare --json ") + kWorkload +
                           " --host-blocks 256 --host-policy write_through --disk-gib 0.0625" +
                           " --disk " + store.string();

  const Cli first = run_engine(args);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string digest = json_text(first.output, "results_digest_on");
  ASSERT_EQ(digest.size(), 16u) << first.output;
  expect_same_bits(first, digest);
  EXPECT_EQ(field(first.output, "remote_disk_recovered_on"), 0) << first.output;
  EXPECT_GT(field(first.output, "remote_stored_blocks_on"), 0) << first.output;
  EXPECT_EQ(field(first.output, "remote_hit_blocks_on"), 0) << first.output;

  // Process 2: the index is rebuilt from the file; the blocks are loaded, not computed.
  const Cli second = run_engine(args);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  expect_same_bits(second, digest);
  const long long p1 = field(first.output, "prefill_tokens_computed_on");
  const long long p2 = field(second.output, "prefill_tokens_computed_on");
  ASSERT_GT(p1, 0) << first.output;
  ASSERT_GE(p2, 0) << second.output;
  EXPECT_LT(2 * p2, p1) << "first " << p1 << ", second " << p2 << "\n" << second.output;
  EXPECT_GE(field(second.output, "remote_disk_recovered_on"),
            field(first.output, "remote_stored_blocks_on"))
      << second.output;
  EXPECT_GT(field(second.output, "remote_hit_blocks_on"), 0) << second.output;
  EXPECT_EQ(field(second.output, "remote_rejected_values_on"), 0) << second.output;
  EXPECT_EQ(field(second.output, "remote_disk_truncated_on"), 0) << second.output;

  // One payload byte flipped in every stored value: each get is a counted checksum miss.
  const fs::path slab = store / "slab.pkv";
  std::uint64_t value_bytes = 0;
  const std::vector<std::uint64_t> payloads = stored_payloads(slab, value_bytes);
  ASSERT_GT(payloads.size(), 1u);
  {
    const int fd = ::open(slab.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    for (const std::uint64_t off : payloads) {
      const std::uint64_t at = off + 77;
      unsigned char b = 0;
      ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(at)), 1);
      b ^= 0x10;
      ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(at)), 1);
    }
    ::close(fd);
  }
  const Cli flipped = run_engine(args);
  ASSERT_EQ(flipped.exit_code, 0) << flipped.output;
  expect_same_bits(flipped, digest);
  EXPECT_GT(field(flipped.output, "remote_rejected_values_on"), 0) << flipped.output;
  EXPECT_GT(field(flipped.output, "remote_load_misses_on"), 0) << flipped.output;
  EXPECT_GT(field(flipped.output, "prefill_tokens_computed_on"), p2) << flipped.output;

  // The third process stored its blocks again; now cut the file through the middle of a value.
  std::vector<std::uint64_t> again = stored_payloads(slab, value_bytes);
  ASSERT_GT(again.size(), 1u);
  std::sort(again.begin(), again.end());
  const std::uint64_t cut = again[again.size() / 2];
  fs::resize_file(slab, cut + value_bytes / 2);
  const Cli truncated = run_engine(args);
  ASSERT_EQ(truncated.exit_code, 0) << truncated.output;
  expect_same_bits(truncated, digest);
  EXPECT_GT(field(truncated.output, "remote_disk_truncated_on"), 0) << truncated.output;
  // What the cut left is still used; what it took is computed again.
  EXPECT_GT(field(truncated.output, "remote_hit_blocks_on"), 0) << truncated.output;
  EXPECT_GT(field(truncated.output, "prefill_tokens_computed_on"), p2) << truncated.output;
}

TEST(TinyEngineDiskCli, Flags) {
  EXPECT_EQ(run_engine("--disk /tmp/x").exit_code, 2);  // needs --host-blocks
  EXPECT_EQ(run_engine("--host-blocks 8 --disk-gib 0 --disk /tmp/x").exit_code, 2);
  EXPECT_EQ(run_engine("--host-blocks 8 --disk-gib abc --disk /tmp/x").exit_code, 2);
  EXPECT_EQ(run_engine("--host-blocks 8 --disk ''").exit_code, 2);
}

}  // namespace
