"""Mooncake hash-id trace loading and token synthesis, as bench/replay/trace.cpp does it.

Source block j of id h contributes tokens h * S + i (S = 512 for Mooncake) while that is below
2**30, else a mixed value with bit 30 set; tokens past the ids are unique to the request. Equal
ids give equal tokens, so the prefix structure is the trace's.
"""

import gzip
import json

import numpy as np

_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x):
    """SplitMix64's finalizer on a uint64 array, 31 bits kept (trace.cpp: mix_token)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x & np.uint64(0x7FFFFFFF)).astype(np.int32)


def load(path, limit=0):
    """[(input_length, hash_ids)] in file order; a gzip file (by its magic bytes) is decompressed."""
    out = []
    with open(path, "rb") as raw:
        compressed = raw.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rt") if compressed else open(path)) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            out.append((int(r["input_length"]), [int(h) for h in r["hash_ids"]]))
            if limit and len(out) >= limit:
                break
    return out


def synthesize(index, input_length, hash_ids, source_block_size=512):
    """The prompt tokens of request `index` (int32 array)."""
    s = source_block_size
    covered = min(input_length, len(hash_ids) * s)
    pos = np.arange(covered, dtype=np.uint64)
    ids = np.asarray(hash_ids, dtype=np.uint64)[(pos // np.uint64(s)).astype(np.int64)]
    v = ids * np.uint64(s) + pos % np.uint64(s)
    small = v < np.uint64(1 << 30)
    tokens = np.where(small, v, np.uint64(0)).astype(np.int32)
    if not small.all():
        tokens[~small] = _mix(v[~small]) | np.int32(1 << 30)
    if input_length > covered:
        tail = (np.uint64(index) << np.uint64(32)) | np.arange(input_length - covered,
                                                               dtype=np.uint64)
        tokens = np.concatenate([tokens, _mix(tail) | np.int32(1 << 30)])
    return tokens
