// python/src/hashing.cpp: hash schemes, BlockHasher, digests as bytes, vLLM's 64-bit event form.
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "hashing.hpp"
#include "pagedkv/hash/request_hasher.hpp"

namespace pagedkv::python {

RequestHashKeys hash_keys_from(const std::optional<std::string>& cache_salt,
                               const std::optional<std::string>& lora_name,
                               const py::object& mm_items) {
  RequestHashKeys keys;
  keys.cache_salt = cache_salt;
  keys.lora_name = lora_name;
  if (!mm_items.is_none()) {
    for (py::handle item : mm_items) {
      // (identifier, offset, length), or any object with those attributes.
      MultiModalItem mm;
      if (py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) {
        const py::sequence t = py::reinterpret_borrow<py::sequence>(item);
        if (t.size() != 3) {
          throw Error(ErrorCode::kInvalidArgument,
                      "mm_items: each item is (identifier, offset, length)");
        }
        mm.identifier = t[0].cast<std::string>();
        mm.offset = to_int64(t[1], "mm_items: offset");
        mm.length = to_int64(t[2], "mm_items: length");
      } else {
        mm.identifier = item.attr("identifier").cast<std::string>();
        mm.offset = to_int64(item.attr("offset"), "mm_items: offset");
        mm.length = to_int64(item.attr("length"), "mm_items: length");
      }
      keys.mm_items.push_back(std::move(mm));
    }
  }
  return keys;
}

py::object extra_keys_tuple(const OwnedExtraKeys& k) {
  if (!k.lora_name && k.mm_items.empty() && !k.cache_salt) return py::none();
  py::list items;
  if (k.lora_name) items.append(py::str(*k.lora_name));
  for (const auto& [id, offset] : k.mm_items) items.append(py::make_tuple(id, offset));
  if (k.cache_salt) items.append(py::str(*k.cache_salt));
  return py::tuple(items);
}

namespace {

// One block's extra keys for BlockHasher.hash_block: views into `strings`.
struct BlockKeysArg {
  std::vector<std::string> ids;
  std::vector<MultiModalKey> mm;
  std::optional<std::string> lora, salt;

  BlockKeysArg(const std::optional<std::string>& lora_name, const py::object& mm_items,
               const std::optional<std::string>& cache_salt)
      : lora(lora_name), salt(cache_salt) {
    if (mm_items.is_none()) return;
    std::vector<std::int64_t> offsets;
    for (py::handle item : mm_items) {
      const py::sequence t = py::reinterpret_borrow<py::sequence>(item);
      if (!py::isinstance<py::sequence>(item) || t.size() != 2) {
        throw Error(ErrorCode::kInvalidArgument,
                    "mm_items: each block item is (identifier, offset in block)");
      }
      ids.push_back(t[0].cast<std::string>());
      offsets.push_back(to_int64(t[1], "mm_items: offset in block"));
    }
    for (std::size_t i = 0; i < ids.size(); ++i) mm.push_back({ids[i], offsets[i]});
  }
  BlockExtraKeys view() const {
    BlockExtraKeys e;
    if (lora) e.lora_name = std::string_view(*lora);
    if (salt) e.cache_salt = std::string_view(*salt);
    e.mm_items = mm;
    return e;
  }
};

BlockHash parent_from(const BlockHasher& h, const py::object& parent) {
  return parent.is_none() ? h.none_hash() : hash_from_bytes(parent, "parent");
}

}  // namespace

void bind_hashing(py::module_& m) {
  py::enum_<HashScheme>(m, "HashScheme", "Block hash schemes (docs/hashing.md).")
      .value("SHA256", HashScheme::kSha256)
      .value("SHA256_CBOR_VLLM", HashScheme::kSha256CborVllm)
      .value("XXH3_128", HashScheme::kXxh3_128)
      .def_property_readonly("scheme_name", [](HashScheme s) { return std::string(to_string(s)); });

  m.def(
      "digest_size", [](py::object scheme) { return digest_size(scheme_from(scheme)); },
      py::arg("scheme"), "Bytes per block digest: 32 for the SHA-256 schemes, 16 for XXH3-128.");
  m.def(
      "event_id", [](py::object digest) { return hash_from_bytes(digest, "event_id").event_id(); },
      py::arg("digest"),
      "vLLM's 64-bit form of a block hash as used in KV events: the last 8 bytes, big-endian.");
  m.def(
      "raw_digest",
      [](py::object scheme, py::bytes data) {
        const std::string s = data;
        return hash_to_bytes(raw_digest(
            scheme_from(scheme), std::span<const std::uint8_t>(
                                     reinterpret_cast<const std::uint8_t*>(s.data()), s.size())));
      },
      py::arg("scheme"), py::arg("data"), "The plain SHA-256 or XXH3-128 digest of bytes.");

  py::class_<BlockHasher>(m, "BlockHasher",
                          "A hash scheme plus its NONE_HASH (the parent of block 0). Immutable; "
                          "safe to share between threads.")
      .def(py::init([](py::object scheme, std::optional<std::string> seed) {
             if (seed) return BlockHasher(scheme_from(scheme), *seed);
             return BlockHasher(scheme_from(scheme));
           }),
           py::arg("scheme") = "sha256", py::arg("seed") = py::none(),
           "Without a seed, sha256_cbor_vllm uses vLLM's 'vllm-none-hash'; sha256 and xxh3_128 "
           "draw a random one (set one when processes must agree on hashes).")
      .def_property_readonly("scheme", &BlockHasher::scheme)
      .def_property_readonly("digest_size", &BlockHasher::digest_size)
      .def_property_readonly("none_hash",
                             [](const BlockHasher& h) { return hash_to_bytes(h.none_hash()); })
      .def(
          "hash_block",
          [](const BlockHasher& h, py::object parent, py::object tokens,
             std::optional<std::string> lora_name, py::object mm_items,
             std::optional<std::string> cache_salt) {
            const TokenView t(tokens, "hash_block: tokens");
            const BlockKeysArg keys(lora_name, mm_items, cache_salt);
            const BlockHash p = parent_from(h, parent);
            return hash_to_bytes(h.hash_block(p, t.span(), keys.view()));
          },
          py::arg("parent"), py::arg("tokens"), py::kw_only(), py::arg("lora_name") = py::none(),
          py::arg("mm_items") = py::none(), py::arg("cache_salt") = py::none(),
          "The digest of one full block. parent: the previous block's digest, or None for block "
          "0. mm_items: (identifier, offset relative to the block start) pairs.")
      .def(
          "encode_block",
          [](const BlockHasher& h, py::object parent, py::object tokens,
             std::optional<std::string> lora_name, py::object mm_items,
             std::optional<std::string> cache_salt) {
            const TokenView t(tokens, "encode_block: tokens");
            const BlockKeysArg keys(lora_name, mm_items, cache_salt);
            const auto bytes = h.encode_block(parent_from(h, parent), t.span(), keys.view());
            return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          },
          py::arg("parent"), py::arg("tokens"), py::kw_only(), py::arg("lora_name") = py::none(),
          py::arg("mm_items") = py::none(), py::arg("cache_salt") = py::none(),
          "The exact bytes hash_block() digests.")
      .def(
          "hash_blocks",
          [](const BlockHasher& h, py::object tokens, py::handle block_size_obj,
             std::optional<std::string> cache_salt, std::optional<std::string> lora_name,
             py::object mm_items) {
            const auto block_size =
                to_integer<std::uint32_t>(block_size_obj, "hash_blocks: block_size");
            const TokenView t(tokens, "hash_blocks: tokens");
            const RequestHashKeys keys = hash_keys_from(cache_salt, lora_name, mm_items);
            std::vector<BlockHash> hashes;
            {
              py::gil_scoped_release nogil;
              hashes = hash_request_blocks(h, block_size, t.span(), keys);
            }
            py::list out(hashes.size());
            for (std::size_t i = 0; i < hashes.size(); ++i) out[i] = hash_to_bytes(hashes[i]);
            return out;
          },
          py::arg("tokens"), py::arg("block_size") = 16, py::kw_only(),
          py::arg("cache_salt") = py::none(), py::arg("lora_name") = py::none(),
          py::arg("mm_items") = py::none(),
          "The digests of every full block of a token sequence, with a request's keys "
          "(mm_items: (identifier, offset, length) of each placeholder range). Releases the GIL.")
      .def(py::self == py::self)
      .def("__repr__", [](const BlockHasher& h) {
        return "BlockHasher(scheme='" + std::string(to_string(h.scheme())) +
               "', none_hash=" + h.none_hash().to_hex().substr(0, 16) + "...)";
      });
}

}  // namespace pagedkv::python
