#!/usr/bin/env python3
"""Independent generator of pagedkv's block-hash known-answer vectors.

Written from the format descriptions alone (docs/hashing.md, vLLM's sha256_cbor, and
pagedkv's canonical encoding documented in include/pagedkv/hash/block_hasher.hpp), sharing no code
with the C++ library: CBOR is hand-encoded here, SHA-256 comes from hashlib and XXH3-128 from
the xxhsum command-line tool (Debian package `xxhash`).

  hash_vectors.py --xxhsum PATH > hash_vectors.txt      write the vectors
  hash_vectors.py --xxhsum PATH --check hash_vectors.txt  exit 1 unless they match the file

Line format (fields separated by '|', '-' for absent):
  scheme|seed|block_size|tokens|lora|salt|mm items (id:offset:length;...)|block hashes (hex,...)
"""
import argparse
import hashlib
import struct
import subprocess
import sys


def cbor_head(major, n):
    if n < 24:
        return bytes([(major << 5) | n])
    for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < (1 << (8 * size)):
            return bytes([(major << 5) | extra]) + n.to_bytes(size, "big")
    raise ValueError(n)


def cbor_int(v):
    return cbor_head(0, v) if v >= 0 else cbor_head(1, -1 - v)


def cbor_text(s):
    b = s.encode("utf-8")
    return cbor_head(3, len(b)) + b


def cbor_bytes(b):
    return cbor_head(2, len(b)) + b


class Digest:
    def __init__(self, scheme, xxhsum):
        self.scheme = scheme
        self.xxhsum = xxhsum

    def __call__(self, data):
        if self.scheme == "xxh3_128":
            out = subprocess.run([self.xxhsum, "-H2", "-"], input=data, capture_output=True,
                                 check=True).stdout.decode()
            return bytes.fromhex(out.split()[0])
        return hashlib.sha256(data).digest()


def block_extra_keys(index, block_size, lora, salt, mm):
    """vLLM's rule: LoRA name, then overlapping mm items as (id, offset - block start),
    then the salt on block 0 only."""
    start, end = index * block_size, (index + 1) * block_size
    keys = []
    if lora is not None:
        keys.append(("lora", lora))
    for ident, offset, length in mm:
        if offset < end and offset + length > start:
            keys.append(("mm", ident, offset - start))
    if salt is not None and index == 0:
        keys.append(("salt", salt))
    return keys


def encode_vllm(parent, tokens, keys):
    out = b"\x83" + cbor_bytes(parent) + cbor_head(4, len(tokens))
    out += b"".join(cbor_int(t) for t in tokens)
    if not keys:
        return out + b"\xf6"
    out += cbor_head(4, len(keys))
    for key in keys:
        if key[0] == "mm":
            out += b"\x82" + cbor_text(key[1]) + cbor_int(key[2])
        else:
            out += cbor_text(key[1])
    return out


TAGS = {"lora": 1, "mm": 2, "salt": 3}


def encode_canonical(parent, tokens, keys):
    out = parent + struct.pack("<I", len(tokens)) + struct.pack("<%dI" % len(tokens), *tokens)
    out += struct.pack("<I", len(keys))
    for key in keys:
        value = key[1].encode("utf-8")
        out += bytes([TAGS[key[0]]]) + struct.pack("<I", len(value)) + value
        if key[0] == "mm":
            out += struct.pack("<q", key[2])
    return out


def none_hash(scheme, seed, digest):
    if scheme == "sha256_cbor_vllm":
        return digest(cbor_text(seed))
    s = seed.encode("utf-8")
    return digest(b"pagedkv-none-hash-v1" + struct.pack("<I", len(s)) + s)


def chain(scheme, seed, block_size, tokens, lora, salt, mm, xxhsum):
    digest = Digest(scheme, xxhsum)
    encode = encode_vllm if scheme == "sha256_cbor_vllm" else encode_canonical
    parent = none_hash(scheme, seed, digest)
    hashes = []
    for i in range(len(tokens) // block_size):
        block = tokens[i * block_size:(i + 1) * block_size]
        parent = digest(encode(parent, block, block_extra_keys(i, block_size, lora, salt, mm)))
        hashes.append(parent.hex())
    return hashes


EDGE_TOKENS = [0, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 1, 22, 25, 254, 257, 65534, 65537, 7]
MM = [("img-a", 3, 10), ("img-b", 20, 30)]  # overlaps blocks 0, 1 (from -13) and 1..3


def cases():
    seq32 = list(range(32))
    seq64 = list(range(1000, 1064))
    for scheme, seed in (("sha256_cbor_vllm", "vllm-none-hash"), ("sha256_cbor_vllm", "42"),
                         ("sha256", "pagedkv-test-seed"), ("xxh3_128", "pagedkv-test-seed")):
        yield scheme, seed, 16, seq32, None, None, []
        yield scheme, seed, 16, EDGE_TOKENS + seq32[:16] + [5], None, None, []
        yield scheme, seed, 16, seq64, "my-lora", None, []
        yield scheme, seed, 16, seq64, None, "tenant-a", []
        yield scheme, seed, 16, seq64, None, None, MM
        yield scheme, seed, 16, seq64, "my-lora", "tenant-a", MM
        yield scheme, seed, 5, seq32, None, "s", [("x" * 30, 7, 1)]
        yield scheme, seed, 1, [3, 1, 4], "l", None, []


def fmt(v):
    return "-" if v is None else v


def render(xxhsum):
    lines = []
    for scheme, seed, bs, tokens, lora, salt, mm in cases():
        hashes = chain(scheme, seed, bs, tokens, lora, salt, mm, xxhsum)
        mm_text = ";".join("%s:%d:%d" % item for item in mm) or "-"
        lines.append("|".join([scheme, seed, str(bs), ",".join(map(str, tokens)), fmt(lora),
                               fmt(salt), mm_text, ",".join(hashes)]))
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--xxhsum", default="xxhsum")
    parser.add_argument("--check", metavar="FILE")
    args = parser.parse_args()
    text = render(args.xxhsum)
    if args.check:
        with open(args.check, encoding="utf-8") as f:
            if f.read() != text:
                print("hash_vectors.py: %s differs from freshly generated vectors" % args.check)
                return 1
        print("hash_vectors.py: %d vectors match" % text.count("\n"))
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
