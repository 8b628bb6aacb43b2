// Fuzz harness: a DiskStore reopened on a slab file that someone else damaged. The file on disk is
// hostile (disk_store.hpp: "values in a shared store or on disk" are checked before use).
//
// Each input picks a layout (3,000-byte values in contiguous 4 KiB slots, file version 1, or
// 40,000-byte values apart from their records and headers, version 2; one or two I/O threads),
// takes a genuine slab that the store itself wrote (six values of a hash chain, one of them put
// twice so a retired slot is in the file), and applies the input's edits to the file's bytes:
// XOR a run of bytes, overwrite one, copy a run from elsewhere in the file (a genuine record, value
// header or payload moved to another slot: checksums intact, the binding wrong), cut the file
// short, or extend it with zeros. It then reopens the store on the damaged file and checks:
//  - nothing crashes, hangs or throws anything but pagedkv::Error (kInvalidArgument: a valid file
//    header of another shape, the documented refusal); sanitizers catch memory errors;
//  - the start-up scan's counts are consistent: recovered + empty + invalid + duplicates = slots
//    and no more keys recovered than were ever stored;
//  - every get of a stored key is kHit, kMiss or kInvalidValue, and a kHit holds exactly the
//    value stored under that key (never another block's bytes, never damaged bytes); gets of keys
//    never stored are kMiss; the store's hit count is the hits seen;
//  - the store keeps working: new values put after the damage are stored and read back exactly.
//
// Built two ways, like the other harnesses: a libFuzzer target (PAGEDKV_LIBFUZZER) and a plain
// program replaying files, directories or `--random N` inputs (ctest: tests/fuzz/disk_corpus).
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "fuzz_replay_main.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/remote/disk_store.hpp"
#include "pagedkv/remote/remote_value.hpp"

namespace {

using namespace pagedkv;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr std::uint64_t kStoredKeys = 6;  // keys 0..5, a chain; key 2 put twice
constexpr std::uint64_t kSlots = 8;
constexpr std::uint64_t kNewKeys = 3;  // put after the damage: keys 100..102

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "disk_store_fuzz: %s\n", what);
  std::abort();
}

BlockHash key_of(std::uint64_t i) {
  std::array<std::uint8_t, 32> b{};
  for (int k = 0; k < 8; ++k)
    b[static_cast<std::size_t>(k)] = static_cast<std::uint8_t>(i >> (8 * k));
  b[31] = 0xd5;
  return BlockHash(b);
}

// A block's parent in the harness's chains: the previous key (none for 0 and for new keys).
BlockHash parent_of(std::uint64_t i) {
  return (i == 0 || i >= 100) ? BlockHash{} : key_of(i - 1);
}

// A block's bytes depend on the block alone (as K/V bytes depend on the tokens).
std::vector<std::byte> value_of(std::uint64_t i, std::size_t n) {
  std::vector<std::byte> v(n);
  std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x & 0xff);
  }
  return v;
}

DiskStoreConfig config_for(const fs::path& dir, std::size_t value_bytes, int io_threads) {
  DiskStoreConfig c;
  c.directory = dir;
  c.name_space = "fuzz/model/bf16";
  c.layout_fingerprint = layout_fingerprint("fuzz,bf16,block16");
  c.value_bytes = value_bytes;
  c.capacity_bytes = kSlots * DiskStore::slot_bytes_for(value_bytes);
  c.op_timeout = 20000ms;
  c.io_threads = io_threads;
  c.preallocate = false;
  c.sync_on_close = false;
  return c;
}

// Waits for the completions of one submitted batch (`n` ops), in op order.
std::vector<RemoteResult> collect(DiskStore& s, std::size_t n) {
  std::vector<RemoteCompletion> all, buf;
  const auto end = std::chrono::steady_clock::now() + 60s;
  while (all.size() < n) {
    if (std::chrono::steady_clock::now() > end) fail("ops did not complete within 60 s");
    buf.clear();
    s.wait(buf, 20ms);
    all.insert(all.end(), buf.begin(), buf.end());
  }
  std::sort(all.begin(), all.end(),
            [](const RemoteCompletion& a, const RemoteCompletion& b) { return a.index < b.index; });
  std::vector<RemoteResult> out;
  for (const auto& c : all) out.push_back(c.result);
  return out;
}

RemoteResult put1(DiskStore& s, std::uint64_t i) {
  const std::vector<std::byte> v = value_of(i, s.config().value_bytes);
  const RemotePut op{key_of(i), v, parent_of(i), 0};
  if (!s.put(std::span(&op, 1))) fail("a put of one op was refused");
  return collect(s, 1).at(0);
}

RemoteResult get1(DiskStore& s, std::uint64_t i, std::vector<std::byte>& dest) {
  const RemoteGet op{key_of(i), dest, parent_of(i), 0};
  if (!s.get(std::span(&op, 1))) fail("a get of one op was refused");
  return collect(s, 1).at(0);
}

// A directory of its own for each run, removed at the end.
class TempDir {
 public:
  TempDir() {
    static std::uint64_t counter = 0;
    path_ = fs::temp_directory_path() /
            ("pagedkv-disk-fuzz-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<std::uint8_t> read_all(const fs::path& file) {
  std::ifstream f(file, std::ios::binary);
  return std::vector<std::uint8_t>((std::istreambuf_iterator<char>(f)), {});
}

// The genuine slab of a layout, written once per process by the store itself.
const std::vector<std::uint8_t>& genuine_slab(std::size_t value_bytes, int io_threads) {
  static std::map<std::pair<std::size_t, int>, std::vector<std::uint8_t>> cache;
  auto& slab = cache[{value_bytes, io_threads}];
  if (slab.empty()) {
    TempDir dir;
    fs::path path;
    {
      DiskStore s(config_for(dir.path(), value_bytes, io_threads));
      for (std::uint64_t i = 0; i < kStoredKeys; ++i) {
        if (put1(s, i) != RemoteResult::kStored) fail("a genuine put was not stored");
      }
      if (put1(s, 2) != RemoteResult::kStored) fail("the second put of key 2 was not stored");
      path = s.slab_path();
    }
    slab = read_all(path);
    if (slab.empty()) fail("the genuine slab is empty");
  }
  return slab;
}

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(byte()) << (8 * i);
    return v;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// Applies the input's edits to `file` (at most 64; the file never grows past 2x + 64 KiB).
void damage(Input& in, std::vector<std::uint8_t>& file) {
  const std::size_t limit = 2 * file.size() + 65536;
  for (int edits = 0; edits < 64 && !in.done() && !file.empty(); ++edits) {
    // Op codes (byte % 8): 0-2 XOR, 3 overwrite, 4-5 copy, 6 cut, 7 extend; so a file is cut
    // short in about one edit in eight.
    const std::uint8_t op = in.byte() % 8;
    const std::size_t at = in.u32() % file.size();
    switch (op) {
      case 0:
      case 1:
      case 2: {  // XOR a run of up to 16 bytes
        const std::size_t n = 1 + in.byte() % 16;
        for (std::size_t i = 0; i < n && at + i < file.size(); ++i) file[at + i] ^= in.byte();
        break;
      }
      case 3: {  // overwrite one byte
        file[at] = in.byte();
        break;
      }
      case 4:
      case 5: {  // copy a run from elsewhere (a record, header or payload moved)
        const std::size_t from = in.u32() % file.size();
        std::size_t n = 1 + (in.u32() % 8192);
        n = std::min({n, file.size() - at, file.size() - from});
        std::vector<std::uint8_t> run(file.begin() + static_cast<std::ptrdiff_t>(from),
                                      file.begin() + static_cast<std::ptrdiff_t>(from + n));
        std::copy(run.begin(), run.end(), file.begin() + static_cast<std::ptrdiff_t>(at));
        break;
      }
      case 6: {  // cut the file short
        file.resize(at);
        break;
      }
      default: {  // extend with zeros
        const std::size_t n = 1 + in.u32() % 8192;
        if (file.size() + n <= limit) file.resize(file.size() + n, 0);
        break;
      }
    }
  }
}

void run_one(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const std::uint8_t shape = in.byte();
  const std::size_t value_bytes = (shape & 1) ? 40000 : 3000;
  const int io_threads = (shape & 2) ? 2 : 1;
  std::vector<std::uint8_t> file = genuine_slab(value_bytes, io_threads);
  damage(in, file);

  TempDir dir;
  fs::create_directories(dir.path());
  {
    std::ofstream f(dir.path() / "slab.pkv", std::ios::binary);
    f.write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
  }
  const DiskStoreConfig config = config_for(dir.path(), value_bytes, io_threads);
  std::unique_ptr<DiskStore> store;
  try {
    store = std::make_unique<DiskStore>(config);
    if (store->slab_path() != dir.path() / "slab.pkv") fail("the store opened another file");
  } catch (const Error& e) {
    // The documented refusal: a valid file header of another slot size, value size or
    // namespace. Anything else is a bug.
    if (e.code() != ErrorCode::kInvalidArgument) fail(e.what());
    return;
  }
  DiskStore& s = *store;
  const DiskStoreOpenStats& open = s.open_stats();
  if (open.slots != s.num_slots()) fail("open_stats().slots differs from num_slots()");
  if (open.recovered + open.empty + open.invalid + open.duplicates != open.slots) {
    fail("the start-up scan's counts do not add up to the slots");
  }
  if (open.recovered > kStoredKeys || s.size() != open.recovered) {
    fail("more keys recovered than were stored, or the index size differs");
  }

  std::uint64_t hits = 0;
  std::vector<std::byte> out(value_bytes);
  for (std::uint64_t i = 0; i < kStoredKeys; ++i) {
    const RemoteResult r = get1(s, i, out);
    if (r == RemoteResult::kHit) {
      ++hits;
      if (out != value_of(i, value_bytes))
        fail("a hit returned bytes that are not the key's value");
    } else if (r != RemoteResult::kMiss && r != RemoteResult::kInvalidValue) {
      fail("a get of a stored key completed with neither hit, miss nor invalid value");
    }
  }
  for (std::uint64_t i = 50; i < 52; ++i) {  // never stored
    if (get1(s, i, out) != RemoteResult::kMiss) fail("a key never stored was not a miss");
  }
  if (s.stats().hits != hits) fail("the store's hit count differs from the hits seen");

  // The store keeps working after the damage.
  for (std::uint64_t i = 100; i < 100 + kNewKeys; ++i) {
    if (put1(s, i) != RemoteResult::kStored) fail("a put after the damage was not stored");
  }
  for (std::uint64_t i = 100; i < 100 + kNewKeys; ++i) {
    if (get1(s, i, out) != RemoteResult::kHit || out != value_of(i, value_bytes)) {
      fail("a value put after the damage did not read back");
    }
  }
}

}  // namespace

PAGEDKV_FUZZ_ENTRY_POINTS("disk_store_fuzz", run_one, 256)
