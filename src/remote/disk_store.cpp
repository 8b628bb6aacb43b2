#include "pagedkv/remote/disk_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>

#include "op_queue.hpp"
#include "pagedkv/base/error.hpp"
#include "pagedkv/remote/latency_histogram.hpp"
#include "pagedkv/remote/remote_value.hpp"
#include "store_counters.hpp"

namespace pagedkv {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kFileMagic = 0x314b5344564b50ull;  // "PKVDSK1"
// Version 1: every slot holds record, value header and payload together (the only layout of
// version 1, kept for slots of up to 4096 bytes). Version 2: slots above 4096 bytes keep record
// and value header in a metadata region and the payload, aligned, in a payload region
// (DiskStore::slot_bytes_for).
constexpr std::uint32_t kFileVersionInline = 1;
constexpr std::uint32_t kFileVersionSplit = 2;
constexpr std::size_t kMetaStride = 256;  // a slot's record + value header in the split layout
constexpr std::size_t kMaxPayloadAlign = std::size_t{2} << 20;
constexpr std::uint64_t kRecordMagic = 0x31544f4c53564b50ull;  // "PKVSLOT1"
// Sequence numbers of a record read back are below this (2^62 puts: centuries at a billion a
// second); a record claiming more is forged or damaged and ignored: the put counter (next_seq,
// one above the highest found) must never wrap, or newer puts would lose to older slots.
constexpr std::uint64_t kMaxSeq = std::uint64_t{1} << 62;
constexpr std::uint32_t kNoSlot = 0xffffffffu;
constexpr std::size_t kScanBytes = DiskStore::kSlotRecordBytes + kRemoteValueHeaderSize;

[[noreturn]] void bad_config(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "DiskStore: " + what);
}

[[noreturn]] void sys_fail(const std::string& what, int err) {
  throw Error(
      ErrorCode::kInvalidArgument,
      "DiskStore: " + what + ": " + std::error_code(err, std::generic_category()).message());
}

void put_le(std::byte* p, std::uint64_t v, int n) noexcept {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
std::uint64_t get_le(const std::byte* p, int n) noexcept {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t(std::to_integer<std::uint8_t>(p[i])) << (8 * i);
  return v;
}

// Full pread/pwrite: loops over short transfers and EINTR. Returns bytes done (< n on EOF/error,
// errno set on error).
std::size_t pread_full(int fd, std::byte* buf, std::size_t n, std::uint64_t off) noexcept {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, buf + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += static_cast<std::size_t>(r);
  }
  return done;
}

// Skips `bytes` just transferred from iov[first..n): whole iovecs advance `first`, a partly done
// one is trimmed to what is left.
void skip_done(iovec* iov, int n, int& first, std::size_t bytes) noexcept {
  while (first < n && bytes >= iov[first].iov_len) bytes -= iov[first++].iov_len;
  if (bytes > 0) {
    iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + bytes;
    iov[first].iov_len -= bytes;
  }
}

// Full preadv into iov[0..n) (modified as it goes): loops over short transfers and EINTR.
// Returns bytes done (< the iovecs' total on EOF/error, errno set on error).
std::size_t preadv_full(int fd, iovec* iov, int n, std::uint64_t off) noexcept {
  std::size_t done = 0;
  int first = 0;
  while (first < n) {
    const ssize_t r = ::preadv(fd, iov + first, n - first, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    done += static_cast<std::size_t>(r);
    skip_done(iov, n, first, static_cast<std::size_t>(r));
  }
  return done;
}

// Full pwritev of iov[0..n) (modified as it goes): loops over short transfers and EINTR. Returns 0
// or the errno of the failed write (EIO for a write that did nothing without an error).
int pwritev_full(int fd, iovec* iov, int n, std::uint64_t off) noexcept {
  std::size_t done = 0;
  int first = 0;
  while (first < n) {
    const ssize_t r = ::pwritev(fd, iov + first, n - first, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r < 0 ? errno : EIO;
    done += static_cast<std::size_t>(r);
    skip_done(iov, n, first, static_cast<std::size_t>(r));
  }
  return 0;
}

bool pwrite_full(int fd, const std::byte* buf, std::size_t n, std::uint64_t off) noexcept {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pwrite(fd, buf + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += static_cast<std::size_t>(r);
  }
  return true;
}

// The 4096-byte file header: magic u64, version u32, record bytes u32, slot bytes u64, value bytes
// u64, namespace hash u64, checksum u64 (remote_checksum of the first 40 bytes).
struct FileHeader {
  std::uint32_t version = kFileVersionInline;
  std::uint64_t slot_bytes = 0;
  std::uint64_t value_bytes = 0;
  std::uint64_t ns_hash = 0;
};

std::array<std::byte, 48> encode_file_header(const FileHeader& h) noexcept {
  std::array<std::byte, 48> b{};
  put_le(b.data(), kFileMagic, 8);
  put_le(b.data() + 8, h.version, 4);
  put_le(b.data() + 12, DiskStore::kSlotRecordBytes, 4);
  put_le(b.data() + 16, h.slot_bytes, 8);
  put_le(b.data() + 24, h.value_bytes, 8);
  put_le(b.data() + 32, h.ns_hash, 8);
  put_le(b.data() + 40, remote_checksum(std::span<const std::byte>(b.data(), 40)), 8);
  return b;
}

std::optional<FileHeader> decode_file_header(const std::byte* b) noexcept {
  const auto version = static_cast<std::uint32_t>(get_le(b + 8, 4));
  if (get_le(b, 8) != kFileMagic ||
      (version != kFileVersionInline && version != kFileVersionSplit) ||
      get_le(b + 12, 4) != DiskStore::kSlotRecordBytes ||
      get_le(b + 40, 8) != remote_checksum(std::span<const std::byte>(b, 40))) {
    return std::nullopt;
  }
  return FileHeader{version, get_le(b + 16, 8), get_le(b + 24, 8), get_le(b + 32, 8)};
}

// A slot's 64-byte record: magic u64, sequence u64, key size u8, 7 reserved, key 32 bytes,
// checksum u64 (remote_checksum of the first 56 bytes). All zero: an empty slot.
using SlotRecord = std::array<std::byte, DiskStore::kSlotRecordBytes>;

SlotRecord encode_record(const BlockHash& key, std::uint64_t seq) noexcept {
  SlotRecord r{};
  put_le(r.data(), kRecordMagic, 8);
  put_le(r.data() + 8, seq, 8);
  r[16] = static_cast<std::byte>(key.size());
  const auto kb = key.padded_bytes();
  std::memcpy(r.data() + 24, kb.data(), kb.size());
  put_le(r.data() + 56, remote_checksum(std::span<const std::byte>(r.data(), 56)), 8);
  return r;
}

enum class RecordState { kEmpty, kValid, kInvalid };

RecordState decode_record(const std::byte* r, BlockHash& key, std::uint64_t& seq) noexcept {
  if (get_le(r, 8) != kRecordMagic) {
    for (std::size_t i = 0; i < DiskStore::kSlotRecordBytes; ++i) {
      if (r[i] != std::byte{0}) return RecordState::kInvalid;
    }
    return RecordState::kEmpty;
  }
  if (get_le(r + 56, 8) != remote_checksum(std::span<const std::byte>(r, 56))) {
    return RecordState::kInvalid;
  }
  const auto size = std::to_integer<std::size_t>(r[16]);
  if (size != 16 && size != 32) return RecordState::kInvalid;
  for (std::size_t i = 24 + size; i < 56; ++i) {
    if (r[i] != std::byte{0}) return RecordState::kInvalid;
  }
  std::array<std::uint8_t, 32> kb{};
  std::memcpy(kb.data(), r + 24, size);
  key = BlockHash(std::span<const std::uint8_t>(kb.data(), size));
  seq = get_le(r + 8, 8);
  if (seq >= kMaxSeq) return RecordState::kInvalid;
  return RecordState::kValid;
}

// The value header's fields that do not depend on the block asked for (remote_value.hpp).
bool value_header_plausible(const std::byte* h, std::uint64_t fingerprint,
                            std::size_t value_bytes) noexcept {
  return get_le(h, 4) == kRemoteValueMagic && get_le(h + 4, 2) == kRemoteValueVersion &&
         get_le(h + 6, 2) == kRemoteValueHeaderSize && get_le(h + 8, 8) == fingerprint &&
         get_le(h + 16, 8) == value_bytes;
}

using Op = remote_detail::StoreOp;
using remote_detail::bump;

// Which blocks are in which slots, and their LRU order. Owned by the I/O thread (and the
// constructor); slot_offset_of()/size() read it under index_mu.
class SlotIndex {
 public:
  explicit SlotIndex(std::uint32_t num_slots)
      : keys_(num_slots), seq_(num_slots, 0), prev_(num_slots, kNoSlot), next_(num_slots, kNoSlot) {
    std::size_t cap = 16;
    while (cap < 2 * std::size_t{num_slots}) cap *= 2;
    table_.assign(cap, kNoSlot);
    mask_ = cap - 1;
    free_.reserve(num_slots);
  }

  std::uint32_t find(const BlockHash& key) const noexcept {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      const std::uint32_t s = table_[i];
      if (s == kNoSlot) return kNoSlot;
      if (keys_[s] == key) return s;
    }
  }
  // Enters `slot` (not linked, key not present) as the most recently used.
  void insert(std::uint32_t slot, const BlockHash& key, std::uint64_t seq) noexcept {
    keys_[slot] = key;
    seq_[slot] = seq;
    std::size_t i = home(key);
    while (table_[i] != kNoSlot) i = (i + 1) & mask_;
    table_[i] = slot;
    link_front(slot);
    ++size_;
  }
  // Removes a stored slot from the table and the LRU list (the slot is then unowned).
  void erase(std::uint32_t slot) noexcept {
    std::size_t i = home(keys_[slot]);
    while (table_[i] != slot) i = (i + 1) & mask_;
    // Backward-shift deletion (linear probing): no tombstones.
    std::size_t j = i;
    while (true) {
      j = (j + 1) & mask_;
      if (table_[j] == kNoSlot) break;
      const std::size_t k = home(keys_[table_[j]]);
      const bool movable = (j > i) ? (k <= i || k > j) : (k <= i && k > j);
      if (movable) {
        table_[i] = table_[j];
        i = j;
      }
    }
    table_[i] = kNoSlot;
    unlink(slot);
    keys_[slot] = BlockHash();
    --size_;
  }
  void touch(std::uint32_t slot) noexcept {
    if (head_ == slot) return;
    unlink(slot);
    link_front(slot);
  }
  // A slot to write: a free one, else the least recently used (erased from the index).
  std::uint32_t take_slot() noexcept {
    if (!free_.empty()) {
      const std::uint32_t s = free_.back();
      free_.pop_back();
      return s;
    }
    const std::uint32_t s = tail_;
    erase(s);
    return s;
  }
  void release(std::uint32_t slot) noexcept { free_.push_back(slot); }  // capacity: num_slots
  // Free slots are taken lowest first (after the start-up scan; later, most recently freed).
  void order_free() noexcept { std::sort(free_.begin(), free_.end(), std::greater<>()); }
  std::uint64_t size() const noexcept { return size_; }
  bool stored(std::uint32_t slot) const noexcept { return !keys_[slot].empty(); }
  std::uint64_t seq(std::uint32_t slot) const noexcept { return seq_[slot]; }

 private:
  std::size_t home(const BlockHash& key) const noexcept {
    return static_cast<std::size_t>((key.hash_code() * 0x9e3779b97f4a7c15ull) >> 17) & mask_;
  }
  void link_front(std::uint32_t s) noexcept {
    prev_[s] = kNoSlot;
    next_[s] = head_;
    if (head_ != kNoSlot) prev_[head_] = s;
    head_ = s;
    if (tail_ == kNoSlot) tail_ = s;
  }
  void unlink(std::uint32_t s) noexcept {
    if (prev_[s] != kNoSlot)
      next_[prev_[s]] = next_[s];
    else
      head_ = next_[s];
    if (next_[s] != kNoSlot)
      prev_[next_[s]] = prev_[s];
    else
      tail_ = prev_[s];
    prev_[s] = next_[s] = kNoSlot;
  }

  std::vector<BlockHash> keys_;      // per slot: the key stored there; empty when not indexed
  std::vector<std::uint64_t> seq_;   // per slot: its record's sequence number
  std::vector<std::uint32_t> prev_;  // per slot: LRU neighbours (towards the head: more recent)
  std::vector<std::uint32_t> next_;
  std::vector<std::uint32_t> table_;  // open addressing: slot numbers, kNoSlot when empty
  std::size_t mask_ = 0;
  std::vector<std::uint32_t> free_;  // slots holding nothing indexed
  std::uint32_t head_ = kNoSlot;     // most recently used
  std::uint32_t tail_ = kNoSlot;     // least recently used: the next victim
  std::uint64_t size_ = 0;
};

}  // namespace

struct DiskStore::Impl : remote_detail::OpQueue {
  // A get's result before the index sees it.
  // kTimeout: its deadline passed before its read; the destination was never touched.
  enum class GetOutcome : std::uint8_t { kMiss, kError, kHit, kKeep, kDrop, kTimeout };
  // Split::err of a put whose deadline passed before its write (its source was never read).
  static constexpr int kErrTimedOut = -1;
  static constexpr std::size_t kTake = 64;  // ops taken from the queue at a time
  // The layout apart reads (writes) the payloads of up to this many bytes of adjacent slots with
  // one preadv (pwritev), each value checksummed just after (before) it: fewer system calls
  // than one per value (bench/results/disk.md, 2026-12-04).
#ifdef PAGEDKV_DISK_GROUP_BYTES  // experiments only (bench_disk_store builds of other sizes)
  static constexpr std::size_t kGroupBytes = PAGEDKV_DISK_GROUP_BYTES;
#else
  static constexpr std::size_t kGroupBytes = std::size_t{1} << 20;
#endif
  // Values at least this large are worth splitting a run across two threads (below it the
  // hand-off costs about what the second thread saves).
  static constexpr std::size_t kSplitMinBytes = std::size_t{32} << 10;
  struct Split {  // one op of a run split across two threads
    std::uint32_t slot = kNoSlot;
    std::uint64_t seq = 0;
    GetOutcome outcome = GetOutcome::kMiss;
    int err = 0;
  };

  Impl(DiskStoreConfig c, std::size_t slot_bytes_, std::uint32_t num_slots_)
      : OpQueue(c.queue_depth),
        config(std::move(c)),
        slot_bytes(slot_bytes_),
        num_slots(num_slots_),
        value_size(kRemoteValueHeaderSize + config.value_bytes),
        apart(slot_bytes_ > 4096),
        meta_stride(apart ? kMetaStride : slot_bytes_),
        payload_stride(apart ? slot_bytes_ - kMetaStride : slot_bytes_),
        payload_base(apart ? payload_base_for(num_slots_, payload_stride)
                           : kFileHeaderBytes + kSlotRecordBytes + kRemoteValueHeaderSize),
        index(num_slots_),
        use_helper(config.io_threads >= 2 && config.value_bytes >= kSplitMinBytes &&
                   num_slots_ >= 2),
        split_limit(std::min<std::size_t>(kTake, num_slots_)),
        runs(use_helper || (apart && num_slots_ >= 2)),
        group_values(std::clamp<std::size_t>(kGroupBytes / payload_stride, 1, kTake)),
        gap_bytes(apart ? payload_stride - config.value_bytes : 0) {
    if (apart) {  // metadata of a run, then scratch for the gaps between grouped payloads
      meta_run.resize(kTake * kMetaStride + gap_bytes);
      if (use_helper) meta_run2.resize(kTake * kMetaStride + gap_bytes);
    }
  }
  ~Impl() {
    if (slab_fd >= 0) ::close(slab_fd);
    if (lock_fd >= 0) ::close(lock_fd);  // releases the flock
  }

  DiskStoreConfig config;
  std::size_t slot_bytes;
  std::uint32_t num_slots;
  std::size_t value_size;  // header + payload
  // The layout (DiskStore::slot_bytes_for). apart: slots above 4096 bytes keep the 64-byte
  // record and the value header at kFileHeaderBytes + slot * kMetaStride and the payload at
  // payload_base + slot * payload_stride, aligned so the page cache can hold it in large folios
  // (bench/results/disk.md: a pread of a 64 KiB payload at an offset that is not a multiple of
  // 64 KiB ran at half the speed of an aligned one); otherwise record, header and payload are
  // contiguous in one slot at kFileHeaderBytes + slot * slot_bytes.
  bool apart;
  std::size_t meta_stride;
  std::size_t payload_stride;
  std::uint64_t payload_base;  // file offset of slot 0's payload
  int lock_fd = -1;
  int slab_fd = -1;
  DiskStoreOpenStats open_stats;
  std::uint64_t next_seq = 1;  // sequence number of the next put (under index_mu)

  mutable std::mutex index_mu;  // guards index against slot_offset_of()/size() readers
  SlotIndex index;
  RemoteValueHeader staging{};  // I/O thread: the value header read by a get
  // Layout apart: a run of gets or puts of adjacent slots reads (writes) their records and
  // headers with one pread (pwrite) of this buffer (one per thread), not one per op.
  std::vector<std::byte> meta_run, meta_run2;

  // The second thread (DiskStoreConfig::io_threads == 2, values of kSplitMinBytes or more):
  // runs half of a run of gets or puts (run_split) with its own header buffer.
  bool use_helper = false;
  std::size_t split_limit = 0;  // ops per split run: <= kTake and <= num_slots
  RemoteValueHeader staging2{};
  bool runs = false;             // runs of gets or puts go through run_split (helper or apart)
  std::size_t group_values = 1;  // layout apart: payloads of adjacent slots per preadv/pwritev
  std::size_t gap_bytes = 0;     // layout apart: bytes between one payload's end and the next
  std::array<Split, kTake> split{};
  std::mutex helper_mu;
  std::condition_variable helper_cv;
  const std::uint32_t* helper_group = nullptr;
  std::size_t helper_begin = 0, helper_end = 0;
  bool helper_job = false, helper_stop = false;
  std::thread helper;

  // The op queue (remote_detail::OpQueue, the base): its mu also guards stop; done_cv wakes wait().
  std::condition_variable work_cv;
  bool stop = false;
  std::thread thread;

  // The payload region starts at a multiple of the largest power of two (at most 2 MiB) that
  // divides the payload stride, so every payload lies at such a multiple.
  static std::uint64_t payload_base_for(std::uint32_t slots, std::size_t stride) noexcept {
    const std::uint64_t align = std::min<std::uint64_t>(stride & (~stride + 1), kMaxPayloadAlign);
    const std::uint64_t meta_end = kFileHeaderBytes + std::uint64_t(slots) * kMetaStride;
    return (meta_end + align - 1) / align * align;
  }
  // File offset of a slot's record (the value header follows it).
  std::uint64_t offset_of(std::uint32_t slot) const noexcept {
    return kFileHeaderBytes + std::uint64_t(slot) * meta_stride;
  }
  std::uint64_t payload_offset_of(std::uint32_t slot) const noexcept {
    return payload_base + std::uint64_t(slot) * payload_stride;
  }
  // The slab file's size: the end of the last slot.
  std::uint64_t file_bytes() const noexcept {
    return apart ? payload_offset_of(num_slots) : offset_of(num_slots);
  }
  // Slots whose bytes all lie below `size`.
  std::uint64_t whole_slots_below(std::uint64_t size) const noexcept {
    if (!apart) return size > kFileHeaderBytes ? (size - kFileHeaderBytes) / slot_bytes : 0;
    return size > payload_base ? (size - payload_base) / payload_stride : 0;
  }

  void open_files();
  void scan();
  void io_thread();
  RemoteResult run_exists(const Op& op);
  RemoteResult run_get(const Op& op);
  RemoteResult run_put(const Op& op);
  GetOutcome read_get(const Op& op, std::uint32_t slot, RemoteValueHeader& header) noexcept;
  RemoteResult finish_get(const Op& op, std::uint32_t slot, GetOutcome outcome);
  void begin_put(std::uint32_t& slot, std::uint64_t& seq) noexcept;
  int write_put(const Op& op, std::uint32_t slot, std::uint64_t seq) noexcept;
  RemoteResult commit_put(const Op& op, std::uint32_t slot, std::uint64_t seq, int err);
  bool run_split(const std::uint32_t* group, std::size_t n);
  void split_io(const std::uint32_t* group, std::size_t begin, std::size_t end,
                RemoteValueHeader& header, std::vector<std::byte>& meta) noexcept;
  void gets_apart(const std::uint32_t* group, std::size_t begin, std::size_t end,
                  std::vector<std::byte>& meta) noexcept;
  void puts_apart(const std::uint32_t* group, std::size_t begin, std::size_t end,
                  std::vector<std::byte>& meta) noexcept;
  GetOutcome check_get(const Op& op, const std::byte* header, std::size_t header_got,
                       std::size_t payload_got) noexcept;
  void helper_thread();
  void stop_helper() noexcept {
    {
      std::lock_guard<std::mutex> lock(helper_mu);
      helper_stop = true;
    }
    helper_cv.notify_all();
    if (helper.joinable()) helper.join();
  }
  void retire(std::uint32_t slot) noexcept;
  // An op taken by an I/O thread whose deadline has passed: it completes kTimeout without its
  // I/O (remote_store.hpp: every op completes by submission + op_timeout, and the caller may
  // reuse its buffer then), so each op's deadline is checked again just before its read/write.
  static bool overdue(const Op& op) noexcept {
    return op.deadline <= Clock::now();
  }

  template <class Fill>
  std::optional<RemoteTicket> submit(RemoteOpKind kind, std::size_t n, Fill&& fill) {
    const auto now = Clock::now();
    std::optional<RemoteTicket> ticket;
    {
      std::lock_guard<std::mutex> lock(mu);
      ticket = submit_locked(kind, n, now, config.op_timeout, fill);
    }
    if (ticket && n > 0) work_cv.notify_one();
    return ticket;
  }
};

void DiskStore::Impl::open_files() {
  std::error_code ec;
  std::filesystem::create_directories(config.directory, ec);
  if (ec) bad_config("cannot create directory " + config.directory.string() + ": " + ec.message());
  const auto lock_path = config.directory / "lock";
  lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) sys_fail("cannot open " + lock_path.string(), errno);
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      throw Error(ErrorCode::kInvalidState,
                  "DiskStore: directory " + config.directory.string() +
                      " is in use by another DiskStore (this or another process holds " +
                      lock_path.string() + ")");
    }
    sys_fail("cannot lock " + lock_path.string(), err);
  }
  const auto slab = config.directory / "slab.pkv";
  slab_fd = ::open(slab.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (slab_fd < 0) sys_fail("cannot open " + slab.string(), errno);

  const FileHeader want{apart ? kFileVersionSplit : kFileVersionInline, slot_bytes,
                        config.value_bytes,
                        remote_checksum(std::as_bytes(std::span(config.name_space)))};
  std::array<std::byte, 48> have{};
  const std::size_t got = pread_full(slab_fd, have.data(), have.size(), 0);
  bool fresh = true;
  if (got == have.size()) {
    const auto h = decode_file_header(have.data());
    if (h && h->version == kFileVersionInline && h->slot_bytes > 4096) {
      open_stats.reset = true;  // the layout before version 2 (large slots contiguous): discard
    } else if (h) {
      if (h->version != want.version || h->slot_bytes != want.slot_bytes ||
          h->value_bytes != want.value_bytes || h->ns_hash != want.ns_hash) {
        bad_config(slab.string() + " holds a store of another value size or namespace (value " +
                   std::to_string(h->value_bytes) + " bytes); use another directory");
      }
      fresh = false;
    } else {
      open_stats.reset = true;
    }
  } else if (got > 0) {
    open_stats.reset = true;
  }
  const auto total = static_cast<off_t>(file_bytes());
  if (fresh) {  // discard whatever is there, then write a valid header
    if (::ftruncate(slab_fd, 0) != 0) sys_fail("cannot truncate " + slab.string(), errno);
  }
  struct stat st {};
  if (::fstat(slab_fd, &st) != 0) sys_fail("cannot stat " + slab.string(), errno);
  if (!fresh && st.st_size < total) {  // cut short since it was sized: count what is gone
    const std::uint64_t whole = whole_slots_below(static_cast<std::uint64_t>(st.st_size));
    open_stats.truncated = num_slots - std::min<std::uint64_t>(whole, num_slots);
  }
  if (st.st_size > total && ::ftruncate(slab_fd, total) != 0) {
    sys_fail("cannot shrink " + slab.string(), errno);
  }
  bool sized = false;
  if (config.preallocate) {
    const int err = ::posix_fallocate(slab_fd, 0, total);
    if (err == 0)
      sized = true;
    else if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
      sys_fail("not enough space for " + std::to_string(total) + " bytes in " + slab.string(), err);
    }
  }
  if (!sized && st.st_size < total && ::ftruncate(slab_fd, total) != 0) {
    sys_fail("cannot size " + slab.string(), errno);
  }
  if (fresh) {
    const auto h = encode_file_header(want);
    if (!pwrite_full(slab_fd, h.data(), h.size(), 0)) {
      sys_fail("cannot write the header of " + slab.string(), errno);
    }
  }
}

void DiskStore::Impl::scan() {
  open_stats.slots = num_slots;
  std::vector<std::byte> buf(kScanBytes);
  for (std::uint32_t s = 0; s < num_slots; ++s) {
    BlockHash key;
    std::uint64_t seq = 0;
    const std::size_t got = pread_full(slab_fd, buf.data(), buf.size(), offset_of(s));
    RecordState state = RecordState::kEmpty;
    if (got == buf.size()) state = decode_record(buf.data(), key, seq);
    if (state == RecordState::kValid &&
        !value_header_plausible(buf.data() + kSlotRecordBytes, config.layout_fingerprint,
                                config.value_bytes)) {
      state = RecordState::kInvalid;
    }
    if (state != RecordState::kValid) {
      ++(state == RecordState::kEmpty ? open_stats.empty : open_stats.invalid);
      index.release(s);
      continue;
    }
    const std::uint32_t other = index.find(key);
    if (other != kNoSlot) {  // a key stored twice (a re-put cut short): keep the newer
      ++open_stats.duplicates;
      if (index.seq(other) >= seq) {
        index.release(s);
        continue;
      }
      index.erase(other);
      index.release(other);
    }
    index.insert(s, key, seq);
    next_seq = std::max(next_seq, seq + 1);
  }
  // The LRU order from put order: promote from oldest to newest, so the newest ends at the head.
  std::vector<std::pair<std::uint64_t, std::uint32_t>> live;
  live.reserve(index.size());
  for (std::uint32_t s = 0; s < num_slots; ++s) {
    if (index.stored(s)) live.emplace_back(index.seq(s), s);
  }
  std::sort(live.begin(), live.end());
  for (const auto& entry : live) index.touch(entry.second);
  index.order_free();
  open_stats.recovered = index.size();
}

// Zeroes a slot's record (so a restart does not bring back what it held) and frees it.
void DiskStore::Impl::retire(std::uint32_t slot) noexcept {
  static constexpr SlotRecord kZero{};
  (void)pwrite_full(slab_fd, kZero.data(), kZero.size(), offset_of(slot));
  std::lock_guard<std::mutex> lock(index_mu);
  index.release(slot);
}

RemoteResult DiskStore::Impl::run_exists(const Op& op) {
  std::lock_guard<std::mutex> lock(index_mu);
  return index.find(op.id.block) != kNoSlot ? RemoteResult::kHit : RemoteResult::kMiss;
}

// Reads `slot` (found for op's key) with one preadv: the value header into `header`, the payload
// straight into the op's destination, where it is then checked (on any outcome but kHit the
// destination's bytes are unspecified: remote_store.hpp). Touches no index state: the caller
// applies the outcome (finish_get) in op order.
DiskStore::Impl::GetOutcome DiskStore::Impl::read_get(const Op& op, std::uint32_t slot,
                                                      RemoteValueHeader& header) noexcept {
  if (slot == kNoSlot) return GetOutcome::kMiss;
  std::size_t header_got = 0;
  std::size_t payload_got = 0;
  errno = 0;
  if (apart) {  // two reads: the header from the metadata region, the payload from its own
    header_got =
        pread_full(slab_fd, header.data(), header.size(), offset_of(slot) + kSlotRecordBytes);
    if (header_got < header.size() && errno != 0) return GetOutcome::kError;
    if (header_got == header.size()) {
      payload_got = pread_full(slab_fd, op.buf, config.value_bytes, payload_offset_of(slot));
      if (payload_got < config.value_bytes && errno != 0) return GetOutcome::kError;
    }
  } else {
    std::array<iovec, 2> iov{};
    iov[0] = {header.data(), header.size()};
    iov[1] = {op.buf, config.value_bytes};
    const std::size_t got = preadv_full(slab_fd, iov.data(), static_cast<int>(iov.size()),
                                        offset_of(slot) + kSlotRecordBytes);
    if (got < value_size && errno != 0) return GetOutcome::kError;
    header_got = std::min(got, header.size());
    payload_got = got - header_got;
  }
  // A short read (the file ends inside the value) fails the check as a short value would.
  return check_get(op, header.data(), header_got, payload_got);
}

// Checks a value read for a get: the header (header_got bytes of it) and the payload already in
// the op's destination (payload_got bytes of it).
DiskStore::Impl::GetOutcome DiskStore::Impl::check_get(const Op& op, const std::byte* header,
                                                       std::size_t header_got,
                                                       std::size_t payload_got) noexcept {
  const auto check = check_remote_value(std::span<const std::byte>(header, header_got),
                                        std::span<const std::byte>(op.buf, payload_got),
                                        config.layout_fingerprint, config.value_bytes, op.id);
  switch (check) {
    case RemoteValueCheck::kOk:
      return GetOutcome::kHit;
    case RemoteValueCheck::kBindingMismatch: {
      bump(counters.binding_mismatches);
      // The same block under another prefix or group: a miss, and the value stays for its own
      // block's gets. A value of another block altogether (copied here, or a put torn between
      // record and value) can never serve this key: drop it.
      const std::byte* h = header;
      const auto size = std::to_integer<std::size_t>(h[kRemoteValueBindingOffset]);
      const auto kb = op.id.block.padded_bytes();
      if (size == op.id.block.size() &&
          std::memcmp(h + kRemoteValueBindingOffset + 8, kb.data(), kb.size()) == 0) {
        return GetOutcome::kKeep;
      }
      return GetOutcome::kDrop;
    }
    case RemoteValueCheck::kChecksumMismatch:
      bump(counters.checksum_failures);
      return GetOutcome::kDrop;
    case RemoteValueCheck::kFormatMismatch:  // another KV format's value: never this reader's
      bump(counters.format_mismatches);
      return GetOutcome::kDrop;
    default:
      bump(counters.header_mismatches);
      return GetOutcome::kDrop;
  }
}

// Applies a get's outcome to the index (call in op order): a hit promotes the slot; a value that
// did not check is dropped (a torn or corrupted slot never becomes valid).
RemoteResult DiskStore::Impl::finish_get(const Op& op, std::uint32_t slot, GetOutcome outcome) {
  switch (outcome) {
    case GetOutcome::kMiss:
      return RemoteResult::kMiss;
    case GetOutcome::kError:
      return RemoteResult::kError;
    case GetOutcome::kTimeout:
      return RemoteResult::kTimeout;
    case GetOutcome::kKeep:
      return RemoteResult::kInvalidValue;
    case GetOutcome::kHit: {
      std::lock_guard<std::mutex> lock(index_mu);
      if (index.find(op.id.block) == slot) index.touch(slot);
      return RemoteResult::kHit;
    }
    case GetOutcome::kDrop:
      break;
  }
  {
    std::lock_guard<std::mutex> lock(index_mu);
    if (index.find(op.id.block) != slot) return RemoteResult::kInvalidValue;  // dropped already
    index.erase(slot);
  }
  retire(slot);
  return RemoteResult::kInvalidValue;
}

RemoteResult DiskStore::Impl::run_get(const Op& op) {
  std::uint32_t slot = kNoSlot;
  {
    std::lock_guard<std::mutex> lock(index_mu);
    slot = index.find(op.id.block);
  }
  return finish_get(op, slot, read_get(op, slot, staging));
}

// A slot for a put and its sequence number (take_slot may evict the least recently used value,
// the op's own key included).
void DiskStore::Impl::begin_put(std::uint32_t& slot, std::uint64_t& seq) noexcept {
  std::lock_guard<std::mutex> lock(index_mu);
  slot = index.take_slot();
  seq = next_seq++;
}

// Header, checksum and the slot's writes: one pwritev of record, header and payload, or (the
// layout apart) the payload first and then record and header, so a put cut short between the two
// leaves the slot's previous header, which the new bytes fail (a counted miss at a get). Returns 0
// or the errno of the failed write.
int DiskStore::Impl::write_put(const Op& op, std::uint32_t slot, std::uint64_t seq) noexcept {
  const std::span<const std::byte> src(op.buf, config.value_bytes);
  const RemoteValueHeader header =
      encode_remote_value_header(config.layout_fingerprint, op.id, src);
  const SlotRecord record = encode_record(op.id.block, seq);
  std::array<iovec, 3> iov{};
  iov[0] = {const_cast<std::byte*>(record.data()), record.size()};
  iov[1] = {const_cast<std::byte*>(header.data()), header.size()};
  iov[2] = {op.buf, config.value_bytes};
  if (!apart) return pwritev_full(slab_fd, iov.data(), 3, offset_of(slot));
  if (const int err = pwritev_full(slab_fd, iov.data() + 2, 1, payload_offset_of(slot))) return err;
  return pwritev_full(slab_fd, iov.data(), 2, offset_of(slot));
}

// Enters a written slot into the index (call in op order), retiring the key's previous slot
// only now: a failed or torn put never destroys the previous value.
RemoteResult DiskStore::Impl::commit_put(const Op& op, std::uint32_t slot, std::uint64_t seq,
                                         int err) {
  if (err == kErrTimedOut) {  // never written: free the slot taken for it
    retire(slot);
    return RemoteResult::kTimeout;
  }
  if (err != 0) {  // the slot's bytes are unknown now: retire it; the previous value stays
    retire(slot);
    return (err == ENOSPC || err == EDQUOT) ? RemoteResult::kSkippedFull : RemoteResult::kError;
  }
  std::uint32_t old = kNoSlot;
  {
    std::lock_guard<std::mutex> lock(index_mu);
    old = index.find(op.id.block);
    if (old != kNoSlot) index.erase(old);
    index.insert(slot, op.id.block, seq);
  }
  if (old != kNoSlot) retire(old);
  return RemoteResult::kStored;
}

RemoteResult DiskStore::Impl::run_put(const Op& op) {
  std::uint32_t slot = kNoSlot;
  std::uint64_t seq = 0;
  begin_put(slot, seq);
  return commit_put(op, slot, seq, write_put(op, slot, seq));
}

// Ops [begin, end) of `group`, all gets or all puts, on two threads: the index work in op order
// on this thread before (slots) and after (outcomes), the reads or writes with their checksums
// split between this thread and the helper (each with its own header buffer). The
// index ends exactly as the serial path leaves it, except that two gets of one corrupted key in
// the same run both count the failed check (serially the second one is a plain miss). Returns
// false, having done nothing, for a run of puts that re-puts a stored key (serial path).
bool DiskStore::Impl::run_split(const std::uint32_t* group, std::size_t n) {
  const RemoteOpKind kind = ops[group[0]].kind;
  {
    std::lock_guard<std::mutex> lock(index_mu);
    if (kind == RemoteOpKind::kPut) {
      // A put of a key already stored (or twice in the run) frees the old slot at its commit,
      // which the next put would take one at a time: such runs go the serial way.
      for (std::size_t k = 0; k < n; ++k) {
        const BlockHash& key = ops[group[k]].id.block;
        if (index.find(key) != kNoSlot) return false;
        for (std::size_t j = 0; j < k; ++j) {
          if (ops[group[j]].id.block == key) return false;
        }
      }
    }
    for (std::size_t k = 0; k < n; ++k) {
      Split& x = split[k];
      const Op& op = ops[group[k]];
      if (kind == RemoteOpKind::kGet) {
        x.slot = index.find(op.id.block);
      } else {
        x.slot = index.take_slot();
        x.seq = next_seq++;
      }
    }
  }
  if (!use_helper) {
    split_io(group, 0, n, staging, meta_run);
  } else {
    const std::size_t half = n / 2;
    {
      std::lock_guard<std::mutex> lock(helper_mu);
      helper_group = group;
      helper_begin = half;
      helper_end = n;
      helper_job = true;
    }
    helper_cv.notify_one();
    split_io(group, 0, half, staging, meta_run);
    {
      std::unique_lock<std::mutex> lock(helper_mu);
      helper_cv.wait(lock, [&] { return !helper_job; });
    }
  }
  for (std::size_t k = 0; k < n; ++k) {
    const Split& x = split[k];
    Op& op = ops[group[k]];
    RemoteResult r = kind == RemoteOpKind::kGet ? finish_get(op, x.slot, x.outcome)
                                                : commit_put(op, x.slot, x.seq, x.err);
    account(op, r, Clock::now());
  }
  return true;
}

// The I/O part of run_split for ops [begin, end) of `group` (either thread).
void DiskStore::Impl::split_io(const std::uint32_t* group, std::size_t begin, std::size_t end,
                               RemoteValueHeader& header, std::vector<std::byte>& meta) noexcept {
  if (apart) {
    if (ops[group[begin]].kind == RemoteOpKind::kGet)
      gets_apart(group, begin, end, meta);
    else
      puts_apart(group, begin, end, meta);
    return;
  }
  for (std::size_t k = begin; k < end; ++k) {
    Split& x = split[k];
    const Op& op = ops[group[k]];
    if (op.kind == RemoteOpKind::kGet) {
      x.outcome = overdue(op) ? GetOutcome::kTimeout : read_get(op, x.slot, header);
    } else {
      x.err = overdue(op) ? kErrTimedOut : write_put(op, x.slot, x.seq);
    }
  }
}

// Gets [begin, end) of a run (layout apart): the records and headers of adjacent slots (in op
// order) are read with one pread; then the payloads of adjacent slots, up to kGroupBytes of them,
// with one preadv straight into their destinations (the gaps between payloads into scratch
// bytes), each value then checked on its own as before.
void DiskStore::Impl::gets_apart(const std::uint32_t* group, std::size_t begin, std::size_t end,
                                 std::vector<std::byte>& meta) noexcept {
  for (std::size_t k = begin; k < end;) {
    if (overdue(ops[group[k]])) {
      split[k++].outcome = GetOutcome::kTimeout;
      continue;
    }
    if (split[k].slot == kNoSlot) {
      split[k++].outcome = GetOutcome::kMiss;
      continue;
    }
    std::size_t e = k + 1;
    while (e < end && split[e].slot != kNoSlot && split[e].slot == split[e - 1].slot + 1) ++e;
    errno = 0;
    const std::size_t want = (e - k) * kMetaStride;
    const std::size_t got = pread_full(slab_fd, meta.data(), want, offset_of(split[k].slot));
    if (got < want && errno != 0) {
      for (std::size_t m = k; m < e; ++m) split[m].outcome = GetOutcome::kError;
      k = e;
      continue;
    }
    // Bytes of op m's value header that the read returned (short at the file's end).
    const auto header_at = [&](std::size_t m) { return (m - k) * kMetaStride + kSlotRecordBytes; };
    const auto header_got = [&](std::size_t m) {
      const std::size_t at = header_at(m);
      return got > at ? std::min(got - at, kRemoteValueHeaderSize) : std::size_t{0};
    };
    for (std::size_t m = k; m < e;) {
      const Op& op = ops[group[m]];
      if (overdue(op)) {  // checked again before each payload read: never read past it
        split[m++].outcome = GetOutcome::kTimeout;
        continue;
      }
      if (header_got(m) < kRemoteValueHeaderSize) {  // the file ends before its payload
        split[m].outcome = check_get(op, meta.data() + header_at(m), header_got(m), 0);
        ++m;
        continue;
      }
      // Ops [m, g): one read of their adjacent payloads.
      std::size_t g = m + 1;
      while (g < e && g - m < group_values && header_got(g) == kRemoteValueHeaderSize &&
             !overdue(ops[group[g]])) {
        ++g;
      }
      // The payloads, and the gaps between them (payload_stride - value_bytes, below a page)
      // into the thread's scratch bytes after its metadata buffer.
      std::array<iovec, 2 * kTake> iov{};
      int n = 0;
      for (std::size_t q = m; q < g; ++q) {
        if (q > m && gap_bytes > 0) iov[n++] = {meta.data() + kTake * kMetaStride, gap_bytes};
        iov[n++] = {ops[group[q]].buf, config.value_bytes};
      }
      errno = 0;
      const std::size_t done =
          preadv_full(slab_fd, iov.data(), n, payload_offset_of(split[m].slot));
      const bool failed = done < (g - m - 1) * payload_stride + config.value_bytes && errno != 0;
      for (std::size_t q = m; q < g; ++q) {
        const std::size_t at = (q - m) * payload_stride;
        const std::size_t payload_got =
            done > at ? std::min(done - at, config.value_bytes) : std::size_t{0};
        split[q].outcome = failed && payload_got < config.value_bytes
                               ? GetOutcome::kError
                               : check_get(ops[group[q]], meta.data() + header_at(q),
                                           kRemoteValueHeaderSize, payload_got);
      }
      m = g;
    }
    k = e;
  }
}

// Puts [begin, end) of a run (layout apart): the payloads of adjacent slots, up to kGroupBytes
// of them, each checksummed, then written with one pwritev from their sources (zeros over the
// gaps); then the records and headers of adjacent slots (in op order) with one pwrite, after
// their payloads (a run cut short leaves the slots' previous headers, which the new payloads
// fail).
void DiskStore::Impl::puts_apart(const std::uint32_t* group, std::size_t begin, std::size_t end,
                                 std::vector<std::byte>& meta) noexcept {
  std::size_t first = begin;  // the pending metadata run: ops [first, k)
  const auto flush = [&](std::size_t k) {
    if (k == first) return;
    iovec iov{meta.data(), (k - first) * kMetaStride};
    if (const int err = pwritev_full(slab_fd, &iov, 1, offset_of(split[first].slot))) {
      for (std::size_t m = first; m < k; ++m) split[m].err = err;
    }
  };
  for (std::size_t k = begin; k < end;) {
    if (k > first && split[k].slot != split[k - 1].slot + 1) {
      flush(k);
      first = k;
    }
    if (overdue(ops[group[k]])) {  // never written: end the metadata run before it
      flush(k);
      split[k].err = kErrTimedOut;
      first = ++k;
      continue;
    }
    // Ops [k, g): adjacent slots, written with one call.
    std::size_t g = k + 1;
    while (g < end && g - k < group_values && split[g].slot == split[g - 1].slot + 1 &&
           !overdue(ops[group[g]])) {
      ++g;
    }
    for (std::size_t q = k; q < g; ++q) {
      const Op& op = ops[group[q]];
      std::byte* m = meta.data() + (q - first) * kMetaStride;
      const SlotRecord record = encode_record(op.id.block, split[q].seq);
      std::memcpy(m, record.data(), record.size());
      std::memset(m + record.size() + kRemoteValueHeaderSize, 0,
                  kMetaStride - record.size() - kRemoteValueHeaderSize);
    }
    // The payloads, and zeros over the gaps between them (below a page each).
    static constexpr std::array<std::byte, 4096> kZeros{};
    std::array<iovec, 2 * kTake> iov{};
    int n = 0;
    for (std::size_t q = k; q < g; ++q) {
      const Op& op = ops[group[q]];
      const RemoteValueHeader header = encode_remote_value_header(
          config.layout_fingerprint, op.id, std::span<const std::byte>(op.buf, config.value_bytes));
      std::memcpy(meta.data() + (q - first) * kMetaStride + kSlotRecordBytes, header.data(),
                  header.size());
      if (q > k && gap_bytes > 0) iov[n++] = {const_cast<std::byte*>(kZeros.data()), gap_bytes};
      iov[n++] = {op.buf, config.value_bytes};
    }
    const int err = pwritev_full(slab_fd, iov.data(), n, payload_offset_of(split[k].slot));
    for (std::size_t q = k; q < g; ++q) split[q].err = err;
    if (err != 0) {  // their headers are never written: end the metadata run before them
      flush(k);
      first = g;
    }
    k = g;
  }
  flush(end);
}

void DiskStore::Impl::helper_thread() {
  std::unique_lock<std::mutex> lock(helper_mu);
  while (true) {
    helper_cv.wait(lock, [&] { return helper_stop || helper_job; });
    if (helper_stop) return;
    lock.unlock();
    split_io(helper_group, helper_begin, helper_end, staging2, meta_run2);
    lock.lock();
    helper_job = false;
    helper_cv.notify_all();
  }
}

void DiskStore::Impl::io_thread() {
  // Takes up to kTake queued ops at a time and hands their completions back together: one wakeup
  // of a waiting caller per group, not per op.
  std::array<std::uint32_t, kTake> taken{};
  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    work_cv.wait(lock, [&] { return stop || !pending.empty(); });
    if (stop) return;
    if (expire_locked(Clock::now())) done_cv.notify_all();
    std::size_t n = 0;
    while (n < kTake && !pending.empty()) taken[n++] = pending.pop();
    if (n == 0) continue;
    lock.unlock();  // the taken ops are owned by this thread until pushed to `completed`
    if (config.on_ops_taken) {
      try {
        config.on_ops_taken(n);
      } catch (...) {  // (documented: ignored; the ops run)
      }
    }
    for (std::size_t k = 0; k < n;) {
      Op& op = ops[taken[k]];
      if (overdue(op)) {  // expired while earlier taken ops ran: no I/O, its buffer untouched
        account(op, RemoteResult::kTimeout, Clock::now());
        ++k;
        continue;
      }
      // A run of gets or puts of large values: split across the two threads (at most
      // split_limit ops at a time, so the slots taken up front never exceed the store). Each
      // op's deadline is checked again before its own read or write.
      std::size_t e = k + 1;
      if (runs && op.kind != RemoteOpKind::kExists) {
        while (e < n && e - k < split_limit && ops[taken[e]].kind == op.kind &&
               !overdue(ops[taken[e]])) {
          ++e;
        }
      }
      if (e - k >= 2 && run_split(taken.data() + k, e - k)) {
        k = e;
        continue;
      }
      RemoteResult r = RemoteResult::kError;
      try {
        switch (op.kind) {
          case RemoteOpKind::kExists:
            r = run_exists(op);
            break;
          case RemoteOpKind::kGet:
            r = run_get(op);
            break;
          case RemoteOpKind::kPut:
            r = run_put(op);
            break;
        }
      } catch (...) {  // nothing here throws today; an op must complete regardless
        r = RemoteResult::kError;
      }
      account(op, r, Clock::now());
      ++k;
    }
    lock.lock();
    for (std::size_t k = 0; k < n; ++k) completed.push(taken[k]);
    done_cv.notify_all();
  }
}

std::size_t DiskStore::slot_bytes_for(std::size_t value_bytes) noexcept {
  const std::size_t raw = kSlotRecordBytes + kRemoteValueHeaderSize + value_bytes;
  if (raw <= 4096) {  // a power of two from 512: a slot never straddles a 4 KiB page
    std::size_t b = 512;
    while (b < raw) b *= 2;
    return b;
  }
  // Apart: 256 bytes of metadata, the payload rounded up to whole pages.
  return kMetaStride + (value_bytes + 4095) / 4096 * 4096;
}

DiskStore::DiskStore(DiskStoreConfig config) {
  if (config.directory.empty()) bad_config("empty directory");
  if (config.name_space.empty()) bad_config("empty namespace (set model, dtype, layout, ...)");
  if (config.value_bytes == 0) bad_config("value_bytes is 0");
  if (config.value_bytes > (std::size_t{1} << 40)) bad_config("value_bytes above 2^40");
  if (config.queue_depth == 0 || config.queue_depth > (std::size_t{1} << 31)) {
    bad_config("queue_depth must be in [1, 2^31]");
  }
  if (config.op_timeout.count() <= 0 || config.op_timeout > kMaxRemoteTimeout) {
    bad_config("op_timeout of " + std::to_string(config.op_timeout.count()) +
               " ms must be in [1 ms, 1 day]");
  }
  if (config.io_threads != 1 && config.io_threads != 2) bad_config("io_threads must be 1 or 2");
  const std::size_t slot = slot_bytes_for(config.value_bytes);
  const std::uint64_t slots = config.capacity_bytes / slot;
  if (slots == 0 || slots >= kNoSlot) {
    bad_config("capacity_bytes " + std::to_string(config.capacity_bytes) +
               " must hold between 1 and 2^32 - 2 slots of " + std::to_string(slot) + " bytes");
  }
  impl_ = std::make_unique<Impl>(std::move(config), slot, static_cast<std::uint32_t>(slots));
  impl_->open_files();
  impl_->scan();
  if (impl_->use_helper) {
    impl_->helper = std::thread([impl = impl_.get()] { impl->helper_thread(); });
  }
  try {
    impl_->thread = std::thread([impl = impl_.get()] { impl->io_thread(); });
  } catch (...) {
    impl_->stop_helper();
    throw;
  }
}

DiskStore::~DiskStore() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->work_cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->stop_helper();
  if (impl_->config.sync_on_close) (void)::fdatasync(impl_->slab_fd);
}

namespace {
void check_key(const BlockHash& key, const char* op) {
  if (key.empty()) {
    throw Error(ErrorCode::kInvalidArgument, std::string("DiskStore::") + op + ": empty key");
  }
}
void check_size(std::size_t size, std::size_t want, const char* op) {
  if (size != want) {
    throw Error(ErrorCode::kInvalidArgument, std::string("DiskStore::") + op + ": buffer of " +
                                                 std::to_string(size) + " bytes, values are " +
                                                 std::to_string(want));
  }
}
}  // namespace

std::optional<RemoteTicket> DiskStore::exists(std::span<const BlockHash> keys) {
  for (const auto& k : keys) check_key(k, "exists");
  return impl_->submit(RemoteOpKind::kExists, keys.size(), [&](Op& s, std::size_t k) {
    s.id = RemoteValueBinding{keys[k], BlockHash(), 0};
    s.buf = nullptr;
    s.len = 0;
  });
}

std::optional<RemoteTicket> DiskStore::get(std::span<const RemoteGet> ops) {
  for (const auto& op : ops) {
    check_key(op.key, "get");
    check_size(op.dest.size(), impl_->config.value_bytes, "get");
  }
  return impl_->submit(RemoteOpKind::kGet, ops.size(), [&](Op& s, std::size_t k) {
    s.id = binding_of(ops[k]);
    s.buf = ops[k].dest.data();
    s.len = ops[k].dest.size();
  });
}

std::optional<RemoteTicket> DiskStore::put(std::span<const RemotePut> ops) {
  for (const auto& op : ops) {
    check_key(op.key, "put");
    check_size(op.src.size(), impl_->config.value_bytes, "put");
  }
  return impl_->submit(RemoteOpKind::kPut, ops.size(), [&](Op& s, std::size_t k) {
    s.id = binding_of(ops[k]);
    s.buf = const_cast<std::byte*>(ops[k].src.data());  // only read (pwritev)
    s.len = ops[k].src.size();
  });
}

std::size_t DiskStore::poll(std::vector<RemoteCompletion>& out) {
  return impl_->poll(out);
}

std::size_t DiskStore::wait(std::vector<RemoteCompletion>& out,
                            std::chrono::microseconds max_wait) {
  return impl_->wait(out, max_wait);
}

std::size_t DiskStore::in_flight() const {
  return impl_->in_flight();
}

RemoteStoreStats DiskStore::stats() const {
  return impl_->stats();
}

std::string_view DiskStore::name_space() const noexcept {
  return impl_->config.name_space;
}
std::size_t DiskStore::slot_bytes() const noexcept {
  return impl_->slot_bytes;
}
std::uint64_t DiskStore::num_slots() const noexcept {
  return impl_->num_slots;
}
const DiskStoreOpenStats& DiskStore::open_stats() const noexcept {
  return impl_->open_stats;
}
const DiskStoreConfig& DiskStore::config() const noexcept {
  return impl_->config;
}

std::uint64_t DiskStore::size() const {
  std::lock_guard<std::mutex> lock(impl_->index_mu);
  return impl_->index.size();
}

std::filesystem::path DiskStore::slab_path() const {
  return impl_->config.directory / "slab.pkv";
}

std::optional<std::uint64_t> DiskStore::slot_offset_of(const BlockHash& key) const {
  std::lock_guard<std::mutex> lock(impl_->index_mu);
  const std::uint32_t slot = impl_->index.find(key);
  if (slot == kNoSlot) return std::nullopt;
  return impl_->offset_of(slot);
}

std::optional<std::uint64_t> DiskStore::payload_offset_of(const BlockHash& key) const {
  std::lock_guard<std::mutex> lock(impl_->index_mu);
  const std::uint32_t slot = impl_->index.find(key);
  if (slot == kNoSlot) return std::nullopt;
  return impl_->payload_offset_of(slot);
}

}  // namespace pagedkv
