// pagedkv/events/wire.hpp: KV events on vLLM's wire (msgpack KVEventBatch, ZeroMQ frames).
//
// encode_event_batch() turns a manager's KVEvents into the msgpack payload vLLM's
// ZmqEventPublisher sends, field for field (vllm/distributed/kv_events.py; README "KV events"):
//   KVEventBatch      [ts, [event...], data_parallel_rank]         (array_like, always)
//   BlockStored       [block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//                      lora_name, extra_keys, group_idx, kv_cache_spec_kind,
//                      kv_cache_spec_sliding_window]
//   BlockRemoved      [block_hashes, medium, group_idx]
//   AllBlocksCleared  []
// Events are tagged by class name: with EventEncoding::kArrayLike (vLLM before PR #42892) an
// event is an array whose first element is the tag and trailing fields equal to their default
// (None) are omitted; with kMap (vLLM after #42892) it is a map with "type" = tag and one entry
// per field, defaults omitted. Hashes are vLLM's 64-bit ints (BlockHash::event_id(), the default,
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1) or the raw digest bytes (msgpack bin).
//
// decode_event_batch() reads either encoding (and either hash form) back into what a router
// needs: hashes as 64-bit ids, medium, group. It never trusts the input: malformed payloads throw
// pagedkv::Error (kParseError) naming what is wrong, and so do payloads over the DecodeLimits
// (size, number of values, nesting) and bytes after the batch.
//
// Thread safety: pure functions. Complexity: linear in the payload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pagedkv/manager/attention_spec.hpp"
#include "pagedkv/pool/kv_events.hpp"

namespace pagedkv::events {

enum class HashFormat : std::uint8_t {
  kInt64,  // vLLM's 64-bit form: the last 8 digest bytes, big-endian (BlockHash::event_id())
  kBytes,  // the full digest as msgpack bin
};

enum class EventEncoding : std::uint8_t {
  kArrayLike,  // msgspec array_like events (vLLM up to PR #42892, e.g. v0.11 .. v0.25)
  kMap,        // msgspec named-field events (vLLM after PR #42892, e.g. v0.26)
};

// vLLM's medium names.
inline constexpr std::string_view kMediumGpu = "GPU";
inline constexpr std::string_view kMediumCpu = "CPU";

// How one KV-cache group is described in BlockStored (kv_cache_spec_kind and _sliding_window).
struct GroupWireSpec {
  std::string kind = "full_attention";         // vLLM's KVCacheSpecKind value
  std::optional<std::int64_t> sliding_window;  // set for sliding-window groups only

  static GroupWireSpec from(const AttentionSpec& spec);
};

struct WireOptions {
  HashFormat hash_format = HashFormat::kInt64;
  EventEncoding encoding = EventEncoding::kArrayLike;
  // The medium sent for an event whose own `medium` field is empty. Events carry their medium
  // (the pool's are "GPU"; a host tier's, from TieredKVCacheManager, "CPU"), and that is sent.
  std::string medium = std::string(kMediumGpu);
  std::int64_t data_parallel_rank = 0;  // vLLM's publisher always fills it (0 without DP)
  // Per group id; groups beyond the list are described as full attention.
  std::vector<GroupWireSpec> groups;
};

// Appends the payload of one KVEventBatch holding `events` (in order; their seq is not encoded:
// the batch's sequence number travels in its own frame) at time `ts` (seconds since the epoch).
// Throws pagedkv::Error (kInvalidArgument) for an empty hash where one is required.
void encode_event_batch(std::span<const KVEvent> events, double ts, const WireOptions& options,
                        std::string& out);

// The ZeroMQ frames: topic, 8-byte big-endian sequence number, payload. Replay replies carry the
// sequence number and payload after the ROUTER envelope; kReplayEnd (-1) as the sequence number
// and an empty payload end a replay.
inline constexpr std::int64_t kReplayEnd = -1;
void put_seq(std::uint64_t seq, char out[8]) noexcept;
std::int64_t get_seq(std::span<const std::uint8_t> frame);  // throws kParseError unless 8 bytes

// Hash-agreement probe, on the replay ROUTER socket (vLLM's replay requests have one frame after
// the envelope; a probe has two, so a vLLM publisher ignores it): the request is
// [kProbeTag, msgpack array of token ids]; the reply is [kProbeTag, msgpack map
// {"incarnation": uint, "scheme": str, "hash": bin}] with the digest of those tokens hashed as
// block 0 (parent NONE_HASH), or {"incarnation": uint, "error": str} when the publisher has no
// hasher. "incarnation" is random per publisher instance (a restarted engine has a new one); a
// reply without it (an older pagedkv) reads as unknown.
inline constexpr std::string_view kProbeTag = "pagedkv-probe";
// The largest probe request or reply payload (bytes), and the most token ids a request may hold:
// both ends refuse bigger ones, and unpack them with msgpack size limits (a 5-byte array header
// can claim 2^32 elements). The publisher's replay socket also takes no frame over
// kMaxProbeBytes (ZMQ_MAXMSGSIZE): no request is larger.
inline constexpr std::size_t kMaxProbeBytes = 64 * 1024;
inline constexpr std::size_t kMaxProbeTokens = 8 * 1024;

// --- decoding ---
enum class WireEventType : std::uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared };

struct WireEvent {
  WireEventType type = WireEventType::kAllBlocksCleared;
  std::vector<std::uint64_t> block_ids;  // 64-bit ids (bytes hashes are reduced like event_id())
  std::optional<std::uint64_t> parent_block_id;
  std::vector<TokenId> token_ids;
  std::uint32_t block_size = 0;
  std::optional<std::string> medium;
  std::optional<std::string> lora_name;
  std::int64_t group_idx = 0;  // None on the wire reads as group 0
};

struct WireBatch {
  double ts = 0;
  std::vector<WireEvent> events;
  std::optional<std::int64_t> data_parallel_rank;
};

// Bounds on what one payload may cost to decode. The defaults are far above what a scheduler
// step publishes (an 8k-token step of 16-token blocks is ~10^4 values, ~100 KB).
struct DecodeLimits {
  std::size_t max_bytes = std::size_t{16} << 20;    // payload size
  std::size_t max_elements = std::size_t{1} << 20;  // msgpack values (containers and scalars)
  std::size_t max_depth = 16;                       // nesting of arrays and maps
};

// Why a payload was refused (kNone: it decoded).
enum class DecodeFailure : std::uint8_t {
  kNone,
  kTooLarge,         // over max_bytes
  kTooManyElements,  // over max_elements values, or nested deeper than max_depth
  kTrailingBytes,    // bytes after a complete KVEventBatch
  kMalformed,        // not msgpack, or not a KVEventBatch
};
std::string_view to_string(DecodeFailure f) noexcept;

// Throws pagedkv::Error (kParseError) naming the problem, for any failure above. The values are
// counted before any is materialised (one pass over the bytes, no allocation), so a hostile
// payload costs at most O(max_elements) memory.
WireBatch decode_event_batch(std::span<const std::uint8_t> payload,
                             const DecodeLimits& limits = {});
// The same without the exception for a bad payload (a receiver counts the kind): `out` holds the
// batch when kNone is returned; `message` (optional) receives the problem. Still throws
// std::bad_alloc.
DecodeFailure try_decode_event_batch(std::span<const std::uint8_t> payload,
                                     const DecodeLimits& limits, WireBatch& out,
                                     std::string* message = nullptr);

// The 64-bit id of a digest, as vLLM converts it (last 8 bytes, big-endian); bytes shorter than 8
// are read whole.
std::uint64_t id_from_bytes(std::span<const std::uint8_t> digest) noexcept;

}  // namespace pagedkv::events
