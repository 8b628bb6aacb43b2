// KVEventBatch encoding and decoding (see pagedkv/events/wire.hpp).
#define MSGPACK_NO_BOOST
#include "pagedkv/events/wire.hpp"

#include <msgpack.hpp>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <variant>

#include "pagedkv/base/error.hpp"

namespace pagedkv::events {

namespace {

// msgpack::packer writes through write(const char*, size_t).
struct StringSink {
  std::string* out;
  void write(const char* data, std::size_t size) { out->append(data, size); }
};
using Packer = msgpack::packer<StringSink>;

void pack_str(Packer& p, std::string_view s) {
  p.pack_str(static_cast<std::uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

void pack_hash(Packer& p, const BlockHash& h, HashFormat format) {
  if (h.empty()) throw Error(ErrorCode::kInvalidArgument, "encode_event_batch: empty block hash");
  if (format == HashFormat::kInt64) {
    p.pack_uint64(h.event_id());
  } else {
    p.pack_bin(static_cast<std::uint32_t>(h.size()));
    p.pack_bin_body(reinterpret_cast<const char*>(h.bytes().data()),
                    static_cast<std::uint32_t>(h.size()));
  }
}

// vLLM's per-block extra keys tuple, in hashing order: LoRA name, [identifier, offset] per
// multimodal item, cache salt; None for a block without extra keys.
void pack_extra_keys(Packer& p, const OwnedExtraKeys& k) {
  const std::size_t n = (k.lora_name ? 1 : 0) + k.mm_items.size() + (k.cache_salt ? 1 : 0);
  if (n == 0) {
    p.pack_nil();
    return;
  }
  p.pack_array(static_cast<std::uint32_t>(n));
  if (k.lora_name) pack_str(p, *k.lora_name);
  for (const auto& [id, offset] : k.mm_items) {
    p.pack_array(2);
    pack_str(p, id);
    p.pack_int64(offset);
  }
  if (k.cache_salt) pack_str(p, *k.cache_salt);
}

// A field list for one event: name and a writer. Fields with `defaulted` set and a None value are
// omitted (trailing ones only, in array form), as msgspec's omit_defaults does.
struct Field {
  std::string_view name;
  bool is_none;    // the value equals None
  bool defaulted;  // the field has a default (None) in vLLM's struct
};

template <typename WriteValue>
void pack_event(Packer& p, EventEncoding encoding, std::string_view tag,
                std::span<const Field> fields, WriteValue&& write_value) {
  std::size_t n = fields.size();
  if (encoding == EventEncoding::kArrayLike) {
    while (n > 0 && fields[n - 1].defaulted && fields[n - 1].is_none) --n;
    p.pack_array(static_cast<std::uint32_t>(n + 1));
    pack_str(p, tag);
    for (std::size_t i = 0; i < n; ++i) write_value(i);
  } else {
    std::size_t kept = 0;
    for (const Field& f : fields) kept += (f.defaulted && f.is_none) ? 0 : 1;
    p.pack_map(static_cast<std::uint32_t>(kept + 1));
    pack_str(p, "type");
    pack_str(p, tag);
    for (std::size_t i = 0; i < n; ++i) {
      if (fields[i].defaulted && fields[i].is_none) continue;
      pack_str(p, fields[i].name);
      write_value(i);
    }
  }
}

}  // namespace

GroupWireSpec GroupWireSpec::from(const AttentionSpec& spec) {
  if (spec.kind == AttentionKind::kSlidingWindow) {
    return {"sliding_window", static_cast<std::int64_t>(spec.sliding_window)};
  }
  return {"full_attention", std::nullopt};
}

void encode_event_batch(std::span<const KVEvent> events, double ts, const WireOptions& options,
                        std::string& out) {
  std::string buf;
  StringSink sink{&buf};
  Packer p(sink);
  const GroupWireSpec full_attention;
  p.pack_array(3);
  p.pack_double(ts);
  p.pack_array(static_cast<std::uint32_t>(events.size()));
  for (const KVEvent& e : events) {
    if (const auto* s = std::get_if<BlockStored>(&e.data)) {
      const GroupWireSpec& g =
          s->group_id < options.groups.size() ? options.groups[s->group_id] : full_attention;
      const Field fields[] = {
          {"block_hashes", false, false},
          {"parent_block_hash", !s->parent_block_hash.has_value(), false},
          {"token_ids", false, false},
          {"block_size", false, false},
          {"lora_id", true, false},  // deprecated in vLLM; pagedkv keys LoRA by name
          {"medium", false, false},
          {"lora_name", !s->lora_name.has_value(), false},
          {"extra_keys", false, true},
          {"group_idx", false, true},
          {"kv_cache_spec_kind", false, true},
          {"kv_cache_spec_sliding_window", !g.sliding_window.has_value(), true},
      };
      pack_event(p, options.encoding, "BlockStored", fields, [&](std::size_t i) {
        switch (i) {
          case 0:
            p.pack_array(static_cast<std::uint32_t>(s->block_hashes.size()));
            for (const BlockHash& h : s->block_hashes) pack_hash(p, h, options.hash_format);
            break;
          case 1:
            if (s->parent_block_hash) {
              pack_hash(p, *s->parent_block_hash, options.hash_format);
            } else {
              p.pack_nil();
            }
            break;
          case 2:
            p.pack_array(static_cast<std::uint32_t>(s->token_ids.size()));
            for (TokenId t : s->token_ids) p.pack_int32(t);
            break;
          case 3: p.pack_uint32(s->block_size); break;
          case 4: p.pack_nil(); break;
          case 5: pack_str(p, s->medium.empty() ? options.medium : s->medium); break;
          case 6:
            if (s->lora_name) {
              pack_str(p, *s->lora_name);
            } else {
              p.pack_nil();
            }
            break;
          case 7:
            p.pack_array(static_cast<std::uint32_t>(s->block_hashes.size()));
            for (std::size_t b = 0; b < s->block_hashes.size(); ++b) {
              if (b < s->extra_keys.size()) {
                pack_extra_keys(p, s->extra_keys[b]);
              } else {
                p.pack_nil();
              }
            }
            break;
          case 8: p.pack_uint32(s->group_id); break;
          case 9: pack_str(p, g.kind); break;
          default:
            if (g.sliding_window) {
              p.pack_int64(*g.sliding_window);
            } else {
              p.pack_nil();
            }
        }
      });
    } else if (const auto* r = std::get_if<BlockRemoved>(&e.data)) {
      const Field fields[] = {
          {"block_hashes", false, false}, {"medium", false, false}, {"group_idx", false, true}};
      pack_event(p, options.encoding, "BlockRemoved", fields, [&](std::size_t i) {
        if (i == 0) {
          p.pack_array(static_cast<std::uint32_t>(r->block_hashes.size()));
          for (const BlockHash& h : r->block_hashes) pack_hash(p, h, options.hash_format);
        } else if (i == 1) {
          pack_str(p, r->medium.empty() ? options.medium : r->medium);
        } else {
          p.pack_uint32(r->group_id);
        }
      });
    } else {
      pack_event(p, options.encoding, "AllBlocksCleared", {}, [](std::size_t) {});
    }
  }
  p.pack_int64(options.data_parallel_rank);
  out.append(buf);
}

void put_seq(std::uint64_t seq, char out[8]) noexcept {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(seq & 0xff);
    seq >>= 8;
  }
}

std::int64_t get_seq(std::span<const std::uint8_t> frame) {
  if (frame.size() != 8) {
    throw Error(ErrorCode::kParseError,
                "sequence frame of " + std::to_string(frame.size()) + " bytes (expected 8)");
  }
  std::uint64_t v = 0;
  for (std::uint8_t b : frame) v = (v << 8) | b;
  return static_cast<std::int64_t>(v);
}

std::uint64_t id_from_bytes(std::span<const std::uint8_t> digest) noexcept {
  const std::size_t start = digest.size() > 8 ? digest.size() - 8 : 0;
  std::uint64_t v = 0;
  for (std::size_t i = start; i < digest.size(); ++i) v = (v << 8) | digest[i];
  return v;
}

// --- decoding ---

namespace {

// Thrown inside the decoder; try_decode_event_batch() turns it into its kind and message.
struct Refused {
  DecodeFailure kind;
  std::string what;
};

[[noreturn]] void bad(const std::string& what) {
  throw Refused{DecodeFailure::kMalformed, what};
}

// Counts a payload's values and nesting without materialising any (msgpack's parse visitor):
// stops at the first value past the limits. A container's declared size counts before its items
// are read, so a 5-byte array header declaring 2^32 items is refused at once.
struct CountingVisitor : msgpack::null_visitor {
  std::size_t max_elements = 0;
  std::size_t max_depth = 0;
  std::size_t elements = 1;  // the root
  std::size_t depth = 0;
  bool over = false;

  bool open(std::size_t items) {
    elements += items;
    if (++depth > max_depth || elements > max_elements) {
      over = true;
      return false;
    }
    return true;
  }
  bool start_array(std::uint32_t n) { return open(n); }
  bool start_map(std::uint32_t n) { return open(std::size_t{n} * 2); }
  bool end_array() {
    --depth;
    return true;
  }
  bool end_map() {
    --depth;
    return true;
  }
  void parse_error(std::size_t, std::size_t) {}
  void insufficient_bytes(std::size_t, std::size_t) {}
};

bool is_nil(const msgpack::object& o) { return o.type == msgpack::type::NIL; }

std::uint64_t as_id(const msgpack::object& o, const char* field) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) return o.via.u64;
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return static_cast<std::uint64_t>(o.via.i64);
  if (o.type == msgpack::type::BIN) {
    return id_from_bytes({reinterpret_cast<const std::uint8_t*>(o.via.bin.ptr), o.via.bin.size});
  }
  bad(std::string(field) + " is not an int or bytes hash");
}

std::int64_t as_int(const msgpack::object& o, const char* field) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) {
    if (o.via.u64 > static_cast<std::uint64_t>(INT64_MAX)) bad(std::string(field) + " overflows");
    return static_cast<std::int64_t>(o.via.u64);
  }
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return o.via.i64;
  bad(std::string(field) + " is not an integer");
}

std::optional<std::string> as_opt_str(const msgpack::object& o, const char* field) {
  if (is_nil(o)) return std::nullopt;
  if (o.type != msgpack::type::STR) bad(std::string(field) + " is not a string or None");
  return std::string(o.via.str.ptr, o.via.str.size);
}

const msgpack::object_array& as_array(const msgpack::object& o, const char* field) {
  if (o.type != msgpack::type::ARRAY) bad(std::string(field) + " is not an array");
  return o.via.array;
}

// Field values by position in vLLM's order (nullptr: absent, i.e. the default None).
using Fields = std::vector<const msgpack::object*>;

void read_ids(const msgpack::object* o, std::vector<std::uint64_t>& out) {
  if (o == nullptr) bad("block_hashes missing");
  const auto& a = as_array(*o, "block_hashes");
  out.reserve(a.size);
  for (std::uint32_t i = 0; i < a.size; ++i) out.push_back(as_id(a.ptr[i], "block_hashes[i]"));
}

WireEvent read_event(const msgpack::object& o) {
  static constexpr std::string_view kStored[] = {
      "block_hashes", "parent_block_hash", "token_ids",          "block_size",
      "lora_id",      "medium",            "lora_name",          "extra_keys",
      "group_idx",    "kv_cache_spec_kind", "kv_cache_spec_sliding_window"};
  static constexpr std::string_view kRemoved[] = {"block_hashes", "medium", "group_idx"};
  std::string_view tag;
  Fields fields;
  auto names_of = [](std::string_view t) -> std::span<const std::string_view> {
    if (t == "BlockStored") return kStored;
    if (t == "BlockRemoved") return kRemoved;
    if (t == "AllBlocksCleared") return {};
    bad("unknown event tag '" + std::string(t) + "'");
  };
  if (o.type == msgpack::type::ARRAY) {
    const auto& a = o.via.array;
    if (a.size == 0 || a.ptr[0].type != msgpack::type::STR) bad("event without a tag");
    tag = {a.ptr[0].via.str.ptr, a.ptr[0].via.str.size};
    const auto names = names_of(tag);
    fields.assign(names.size(), nullptr);
    // Later vLLM versions append fields: read the ones we know, ignore the rest.
    for (std::uint32_t i = 1; i < a.size && i - 1 < names.size(); ++i) fields[i - 1] = &a.ptr[i];
  } else if (o.type == msgpack::type::MAP) {
    const auto& m = o.via.map;
    for (std::uint32_t i = 0; i < m.size; ++i) {
      const auto& k = m.ptr[i].key;
      if (k.type == msgpack::type::STR && std::string_view(k.via.str.ptr, k.via.str.size) == "type" &&
          m.ptr[i].val.type == msgpack::type::STR) {
        tag = {m.ptr[i].val.via.str.ptr, m.ptr[i].val.via.str.size};
      }
    }
    if (tag.empty()) bad("event map without a \"type\" tag");
    const auto names = names_of(tag);
    fields.assign(names.size(), nullptr);
    for (std::uint32_t i = 0; i < m.size; ++i) {
      const auto& k = m.ptr[i].key;
      if (k.type != msgpack::type::STR) bad("event map with a non-string key");
      const std::string_view key(k.via.str.ptr, k.via.str.size);
      for (std::size_t f = 0; f < names.size(); ++f) {
        if (names[f] == key) fields[f] = &m.ptr[i].val;
      }
    }
  } else {
    bad("event is neither an array nor a map");
  }
  auto nil_or_absent = [&](std::size_t f) { return fields[f] == nullptr || is_nil(*fields[f]); };

  WireEvent e;
  if (tag == "BlockStored") {
    e.type = WireEventType::kBlockStored;
    read_ids(fields[0], e.block_ids);
    if (!nil_or_absent(1)) e.parent_block_id = as_id(*fields[1], "parent_block_hash");
    if (fields[2] == nullptr) bad("token_ids missing");
    const auto& t = as_array(*fields[2], "token_ids");
    e.token_ids.reserve(t.size);
    for (std::uint32_t i = 0; i < t.size; ++i) {
      const std::int64_t v = as_int(t.ptr[i], "token_ids[i]");
      if (v < 0 || v > INT32_MAX) bad("token id out of range");
      e.token_ids.push_back(static_cast<TokenId>(v));
    }
    if (fields[3] == nullptr) bad("block_size missing");
    const std::int64_t bs = as_int(*fields[3], "block_size");
    if (bs <= 0 || bs > UINT32_MAX) bad("block_size out of range");
    e.block_size = static_cast<std::uint32_t>(bs);
    if (fields[5] != nullptr) e.medium = as_opt_str(*fields[5], "medium");
    if (fields[6] != nullptr) e.lora_name = as_opt_str(*fields[6], "lora_name");
    if (!nil_or_absent(8)) e.group_idx = as_int(*fields[8], "group_idx");
  } else if (tag == "BlockRemoved") {
    e.type = WireEventType::kBlockRemoved;
    read_ids(fields[0], e.block_ids);
    if (fields[1] != nullptr) e.medium = as_opt_str(*fields[1], "medium");
    if (!nil_or_absent(2)) e.group_idx = as_int(*fields[2], "group_idx");
  } else {
    e.type = WireEventType::kAllBlocksCleared;
  }
  return e;
}

}  // namespace

std::string_view to_string(DecodeFailure f) noexcept {
  switch (f) {
    case DecodeFailure::kNone:
      return "none";
    case DecodeFailure::kTooLarge:
      return "too large";
    case DecodeFailure::kTooManyElements:
      return "too many elements";
    case DecodeFailure::kTrailingBytes:
      return "trailing bytes";
    case DecodeFailure::kMalformed:
      return "malformed";
  }
  return "?";
}

namespace {

WireBatch decode_checked(std::span<const std::uint8_t> payload, const DecodeLimits& limits) {
  const char* data = reinterpret_cast<const char*>(payload.data());
  if (payload.size() > limits.max_bytes) {
    throw Refused{DecodeFailure::kTooLarge, "payload of " + std::to_string(payload.size()) +
                                                " bytes (at most " +
                                                std::to_string(limits.max_bytes) + ")"};
  }
  {
    CountingVisitor count;
    // Every value takes at least one byte: no payload holds more values than bytes.
    count.max_elements = std::min(limits.max_elements, std::max<std::size_t>(payload.size(), 1));
    count.max_depth = limits.max_depth;
    std::size_t off = 0;
    const bool parsed = msgpack::parse(data, payload.size(), off, count);
    if (count.over) {
      throw Refused{DecodeFailure::kTooManyElements,
                    "more than " + std::to_string(count.max_elements) +
                        " values or nesting deeper than " + std::to_string(limits.max_depth)};
    }
    if (!parsed) bad("not msgpack (truncated or invalid)");
    if (off != payload.size()) {
      throw Refused{DecodeFailure::kTrailingBytes,
                    std::to_string(payload.size() - off) + " bytes after the batch"};
    }
  }
  msgpack::object_handle oh;
  try {
    oh = msgpack::unpack(data, payload.size());
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& ex) {
    bad(std::string("not msgpack (") + ex.what() + ")");
  }
  const msgpack::object& root = oh.get();
  const auto& a = as_array(root, "batch");
  if (a.size < 2) bad("batch with fewer than 2 fields");
  WireBatch batch;
  if (a.ptr[0].type == msgpack::type::FLOAT64 || a.ptr[0].type == msgpack::type::FLOAT32) {
    batch.ts = a.ptr[0].via.f64;
  } else {
    batch.ts = static_cast<double>(as_int(a.ptr[0], "ts"));
  }
  const auto& evs = as_array(a.ptr[1], "events");
  batch.events.reserve(evs.size);
  for (std::uint32_t i = 0; i < evs.size; ++i) batch.events.push_back(read_event(evs.ptr[i]));
  if (a.size >= 3 && !is_nil(a.ptr[2])) batch.data_parallel_rank = as_int(a.ptr[2], "rank");
  return batch;
}

}  // namespace

DecodeFailure try_decode_event_batch(std::span<const std::uint8_t> payload,
                                     const DecodeLimits& limits, WireBatch& out,
                                     std::string* message) {
  try {
    out = decode_checked(payload, limits);
    return DecodeFailure::kNone;
  } catch (const Refused& r) {
    if (message) *message = r.what;
    return r.kind;
  }
}

WireBatch decode_event_batch(std::span<const std::uint8_t> payload, const DecodeLimits& limits) {
  try {
    return decode_checked(payload, limits);
  } catch (const Refused& r) {
    throw Error(ErrorCode::kParseError,
                "decode_event_batch: " + std::string(to_string(r.kind)) + ": " + r.what);
  }
}

}  // namespace pagedkv::events
