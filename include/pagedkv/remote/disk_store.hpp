// pagedkv/remote/disk_store.hpp: RemoteStore on a local directory (a second backend beside
// RedisStore): fixed-size values in one slab file of fixed-size slots, an in-memory index, LRU
// eviction within a capacity in bytes, and an index rebuilt from the file at start, so a restarted
// engine reuses what the previous process stored.
//
// Files under `directory` (created if missing):
//   lock      flock(LOCK_EX | LOCK_NB) held for the store's lifetime: a second DiskStore on the
//             same directory, in this process or another, is refused with pagedkv::Error
//             (kInvalidState) while the first is open. There is no shared or read-only mode.
//   slab.pkv  a 4096-byte file header (magic, version, slot size, value size, namespace hash,
//             checksum), then num_slots slots of slot_bytes() each (slot_bytes_for). A slot is a
//             64-byte record (magic, put sequence number, the key: the block hash the value is
//             stored under, record checksum) and the value: remote_value.hpp's 144-byte
//             header + payload, exactly as RedisStore stores it. Two layouts, by slot size:
//             up to 4096 bytes (file version 1) the slots follow the file header, each one
//             record, header and payload in a row (512 to 4096 bytes, a power of two: a slot
//             never straddles a 4 KiB page); above (version 2) the records and headers lie in a
//             metadata region (256 bytes per slot, after the file header) and the payloads in a
//             payload region after it, each payload at a file offset that is a multiple of the
//             largest power of two (at most 2 MiB) dividing the payload rounded up to 4 KiB: the
//             page cache then holds a payload in large folios, and reading or writing it costs
//             what a plain pread/pwrite of an aligned block does (an unaligned 64 KiB payload
//             read at half that speed: bench/results/disk.md). A slab of version 1 with slots
//             above 4096 bytes (the layout before version 2) is discarded (open_stats().reset).
//             A value is written and checked as (encode_remote_value_header with
//             binding_of(put); a get loads only when check_remote_value(..., binding_of(get)) is
//             kOk). A value stored under another key (the record says B, the value is bound to A)
//             is kInvalidValue, counted in stats().binding_mismatches.
//
// Values are fixed-size: every put's source and every get's destination is value_bytes long
// (anything else is misuse and throws). capacity_bytes / slot_bytes() slots (at least one).
// Puts write a free slot, or the least recently used one (gets and puts promote; exists does
// not); a put of a key already stored writes a new slot and then retires the old one (its record
// is zeroed), so a failed or torn put never destroys the previous value.
//
// Durability (fsync policy). No fsync per put: a put completes kStored when its writes returned
// the whole slot (one pwritev; apart: the payload's pwrite, then record and header's pwritev),
// i.e. the bytes are in the kernel's page cache. That survives the process being
// killed (SIGKILL included: tests/remote/disk_store_test.cpp kills a writer mid-run and finds
// every acknowledged value), not a kernel crash or power loss. The destructor calls fdatasync once
// when sync_on_close is set. After a power loss a slot may be torn; its checksum then fails and
// it is a counted miss, never loaded.
//
// Start. The constructor reads every slot's record and value header (one 176-byte pread per slot:
// O(num_slots)); a slot whose record checks (its sequence number below 2^62: a higher one is
// forged or damaged and would wrap the put counter) and whose value header has this store's magic,
// version, fingerprint and length enters the index; of two slots with the same key the higher
// sequence number wins; LRU order is rebuilt from the sequence numbers (put order: promotions by
// gets are not persisted). Payload checksums are verified at each get, not at start. What the
// scan found is in open_stats(). A file header that does not check (torn, corrupted) discards the
// slab (open_stats().reset); a valid header of another slot size, value size or namespace throws
// pagedkv::Error (kInvalidArgument): use another directory. A file shorter than the slots is
// extended (missing bytes read as zeros: empty slots, or a counted checksum miss) and the slots
// it cut are counted (open_stats().truncated).
//
// Threads. One I/O thread takes the ops in submission order and does all index work (lookups,
// slot choice, LRU, commits) in that order; with io_threads == 2 and values of 32 KiB or more, a
// run of consecutive gets (or puts) is split in two halves whose reads (writes) and checksums
// run on the I/O thread and a second thread at once, the outcomes then applied to the
// index in op order (the same index as one thread leaves, except that two gets of one corrupted
// key in one run both count the failed check). Values of the layout apart (slots above 4096
// bytes) take that path with one thread too, the records and headers of a run's adjacent slots
// read (written) with one call, and the payloads of adjacent slots, up to 1 MiB of them, with one
// preadv (pwritev; the gaps between payloads that are not whole pages go to scratch bytes or
// are written as zeros), each value checksummed and checked one by one as before (system calls
// cost about 3 us each on the VM of bench/results/disk.md). Submissions and poll() only touch a
// bounded queue under a mutex, never the disk. The queue holds at most `queue_depth` ops
// submitted and not yet polled; a batch that does not fit is refused whole (nullopt) and counted
// in stats().queue_full_drops. An op still queued at submission + op_timeout completes kTimeout,
// and so does one taken by the I/O thread whose deadline has passed when its read or write is
// about to start (the thread takes up to 64 ops at a time; each op's deadline is checked again
// just before its own I/O, so a timed-out get never wrote into its destination and a timed-out
// put never read its source nor was stored; a pread/pwrite already running is not interrupted). I/O
// errors complete kError; ENOSPC/EDQUOT on a put completes kSkippedFull. A slot that fails its
// value check at a get is dropped from the index (its record zeroed): a bad header or checksum, or
// a value of another block; a value of the same block asked for under another parent or group stays
// (a miss for that get only).
//
// Complexity: exists O(1); get/put O(value) (a get: the value header read into the store's buffer
// and the payload straight into the destination, one preadv or, apart, a share of one pread
// of the run's headers and of one preadv of its adjacent payloads; then one
// xxh3_64 pass over the destination; on any result but kHit the destination's bytes are
// unspecified, remote_store.hpp; a put: one xxh3_64 pass and the slot's writes from the source,
// no copy); the index is an
// open-addressing table (no allocation after construction); memory ~80 bytes per slot.
// Thread safety: every member may be called from any thread.
// Errors: the constructor throws pagedkv::Error (kInvalidArgument) on a bad config (empty
// directory or namespace, value_bytes 0, capacity below one slot or above 2^32 - 2 slots, zero
// queue depth, an op_timeout outside [1 ms, 1 day], io_threads other than 1 or 2) or a directory it
// cannot create/open/size, and kInvalidState when the directory is locked. Submissions throw
// (kInvalidArgument) on an empty key or a buffer whose size is not value_bytes, before anything is
// submitted. std::system_error if the thread cannot be started.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/remote/remote_store.hpp"

namespace pagedkv {

struct DiskStoreConfig {
  std::filesystem::path directory;       // required; created if missing
  std::string name_space;                // required: model, KV dtype, layout, block size, TP rank
  std::uint64_t layout_fingerprint = 0;  // written into and checked against every value
  std::size_t value_bytes = 0;           // required: every block's payload size
  std::uint64_t capacity_bytes = 1ull << 30;  // slab size; slots = capacity / slot_bytes()
  std::size_t queue_depth = 4096;             // ops submitted and not yet polled
  std::chrono::milliseconds op_timeout{1000};
  // 1: one I/O thread does everything. 2: runs of gets or puts of values of 32 KiB or more are
  // split across the I/O thread and a second thread (reads, writes and checksums in
  // parallel; the index work stays in op order): more throughput only where a second core is
  // free (not measurable on the loaded machine of bench/results/disk.md), a little more CPU.
  int io_threads = 1;
  bool preallocate = true;    // posix_fallocate the slab (falls back to a sparse file)
  bool sync_on_close = true;  // fdatasync in the destructor
  // Called (when set) on the I/O thread each time it has taken ops from the queue, with their
  // number, before the first of them is checked against its deadline and run: for tracing, and
  // for tests that hold the thread there (say, past the ops' deadlines: each then completes
  // kTimeout without its read or write). The thread waits for it; it must not call this store
  // (a poll or submission from it may deadlock, the destructor surely does). An exception it
  // throws is caught and ignored: the ops run as if it had returned.
  std::function<void(std::size_t ops_taken)> on_ops_taken;
};

// What the start-up scan found.
struct DiskStoreOpenStats {
  std::uint64_t slots = 0;       // slots in the slab
  std::uint64_t recovered = 0;   // values entered into the index
  std::uint64_t empty = 0;       // slots without a record (never written or retired)
  std::uint64_t invalid = 0;     // slots with a record or value header that did not check
  std::uint64_t duplicates = 0;  // older slots of a key stored twice (ignored)
  std::uint64_t truncated = 0;   // slots (partly) past the end of a file found shorter than its
                                 // slots (cut short since: their values are lost or torn)
  bool reset = false;            // the file header did not check: the slab was discarded
};

class DiskStore final : public RemoteStore {
 public:
  static constexpr std::size_t kFileHeaderBytes = 4096;
  static constexpr std::size_t kSlotRecordBytes = 64;

  explicit DiskStore(DiskStoreConfig config);
  ~DiskStore() override;
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  std::optional<RemoteTicket> exists(std::span<const BlockHash> keys) override;
  std::optional<RemoteTicket> get(std::span<const RemoteGet> ops) override;
  std::optional<RemoteTicket> put(std::span<const RemotePut> ops) override;
  std::size_t poll(std::vector<RemoteCompletion>& out) override;
  std::size_t in_flight() const override;
  RemoteStoreStats stats() const override;
  std::string_view name_space() const noexcept override;

  // Like poll(), but blocks up to max_wait until at least one completion is available (a max_wait
  // too large to add to the clock, e.g. microseconds::max(), blocks until one is).
  std::size_t wait(std::vector<RemoteCompletion>& out, std::chrono::microseconds max_wait);

  // Bytes per slot: record + value header + value_bytes rounded up to the next power of two from
  // 512 when that is at most 4096 (one contiguous slot); otherwise 256 bytes of metadata plus
  // value_bytes rounded up to a multiple of 4096 (layout apart; the file also holds up to
  // 2 MiB of alignment padding before the payload region).
  static std::size_t slot_bytes_for(std::size_t value_bytes) noexcept;
  std::size_t slot_bytes() const noexcept;
  std::uint64_t num_slots() const noexcept;
  // Keys in the index now.
  std::uint64_t size() const;
  // The slab file's path, and the file offset of the record of the slot holding `key` now (its
  // value header follows; nullopt: not stored). For tools and tests (e.g. to corrupt a slot on
  // purpose).
  std::filesystem::path slab_path() const;
  std::optional<std::uint64_t> slot_offset_of(const BlockHash& key) const;
  // The file offset of the payload of `key`'s value now (slot_offset_of + record + value header
  // where the slot is contiguous).
  std::optional<std::uint64_t> payload_offset_of(const BlockHash& key) const;

  const DiskStoreOpenStats& open_stats() const noexcept;
  const DiskStoreConfig& config() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedkv
