"""Mooncake hash-id trace loading and token synthesis, as bench/replay/trace.cpp does it.

Source block j of id h contributes tokens h * S + i (S = 512 for Mooncake) while that is below
2**30, else a mixed value with bit 30 set; tokens past the ids are unique to the request. Equal
ids give equal tokens, so the prefix structure is the trace's.

The reader (read_trace, load) checks every line as trace.cpp's parser does and raises TraceError
naming the file and line: a line that is not a JSON object, a field missing or given twice, a
hash id that is not an integer in [0, 2**32), a token count that is not an integer in [1 (0 for
output_length), 2**24], a timestamp outside +-1e15 ms, more hash ids than the prompt's blocks.
"""

import gzip
import json
import math

import numpy as np

_M = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x):
    """SplitMix64's finalizer on a uint64 array, 31 bits kept (trace.cpp: mix_token)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x & np.uint64(0x7FFFFFFF)).astype(np.int32)


# trace.cpp's limits (bench/replay/trace.hpp: kMaxTraceTokens, kMaxTraceTimestampMs,
# kMaxTraceLineBytes) and its source block size.
MAX_TOKENS = 1 << 24
MAX_TIMESTAMP_MS = 1e15
MAX_LINE_BYTES = 64 << 20
MAX_HASH_ID = (1 << 32) - 1
SOURCE_BLOCK_SIZE = 512
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(ValueError):
    """A malformed trace: the message starts with "PATH:LINE: " (a line's fault) or "PATH: " (a
    file that cannot be read: a cut or damaged gzip stream)."""


def _integer(value):
    """`value` as an int when it is a JSON integer (1024 or 1024.0; not true, 1.5), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return None


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"field '{key}' appears twice")
        seen[key] = value
    return seen


def parse_record(text, required=("input_length", "hash_ids"),
                 source_block_size=SOURCE_BLOCK_SIZE):
    """One trace line (str) as a dict of the FIELDS it has, each checked; raises ValueError saying
    what is wrong (read_trace adds the file and line). `required` fields must be present."""
    def number(value):  # json.loads takes NaN and Infinity; a trace does not
        raise ValueError(f"'{value}' is not a number")
    try:
        r = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=number)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise ValueError("not JSON (nested too deeply)") from None
    if not isinstance(r, dict):
        raise ValueError(f"expected a JSON object, got {type(r).__name__}")
    for field in required:
        if field not in r:
            raise ValueError(f"field '{field}' is missing")
    out = {}
    if "timestamp" in r:
        t = r["timestamp"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise ValueError(f"field 'timestamp': expected a number, got {t!r}")
        if abs(t) > MAX_TIMESTAMP_MS:
            raise ValueError("field 'timestamp': outside [-1e15, 1e15] ms")
        out["timestamp"] = t
    for field, least in (("input_length", 1), ("output_length", 0)):
        if field not in r:
            continue
        v = _integer(r[field])
        if v is None or v < 0:
            raise ValueError(f"field '{field}': expected a non-negative integer, got {r[field]!r}")
        if v > MAX_TOKENS:
            raise ValueError(f"field '{field}': {v} tokens is more than the limit of {MAX_TOKENS}")
        if v < least:
            raise ValueError(f"field '{field}': a prompt has at least one token")
        out[field] = v
    if "hash_ids" in r:
        ids = r["hash_ids"]
        if not isinstance(ids, list):
            raise ValueError(f"field 'hash_ids': expected an array, got {type(ids).__name__}")
        if all(type(h) is int for h in ids) and (not ids or (min(ids) >= 0 and
                                                            max(ids) <= MAX_HASH_ID)):
            checked = ids  # the common case, checked at once
        else:
            checked = []
            for k, h in enumerate(ids):
                v = _integer(h)
                if v is None or not 0 <= v <= MAX_HASH_ID:
                    raise ValueError(f"field 'hash_ids': id {k} is {h!r}, expected an integer "
                                     f"in [0, {MAX_HASH_ID}]")
                checked.append(v)
        tokens = out.get("input_length", MAX_TOKENS)
        needed = -(-tokens // source_block_size)
        if len(checked) > needed:
            raise ValueError(f"field 'hash_ids': {len(checked)} ids for {tokens} tokens at source "
                             f"block size {source_block_size}")
        out["hash_ids"] = checked
    return out


def read_trace(path, limit=0, required=("input_length", "hash_ids")):
    """The checked records (parse_record) of a hash-id trace in file order, blank lines skipped; a
    gzip file (by its magic bytes) is decompressed. Raises TraceError naming the file and line."""
    out = []
    with open(path, "rb") as raw:
        compressed = raw.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rb") if compressed else open(path, "rb")) as f:
            number = 0
            while True:
                line = f.readline(MAX_LINE_BYTES + 2)  # the bytes, the '\n', one more
                if not line:
                    break
                number += 1
                if len(line[:-1] if line.endswith(b"\n") else line) > MAX_LINE_BYTES:
                    raise TraceError(f"{path}:{number}: line longer than {MAX_LINE_BYTES} bytes; "
                                     "the rest of the file is not read")
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise TraceError(f"{path}:{number}: not UTF-8 (byte {e.start})") from None
                if not text.strip():
                    continue
                try:
                    out.append(parse_record(text, required))
                except ValueError as e:
                    raise TraceError(f"{path}:{number}: {e}") from None
                if limit and len(out) >= limit:
                    break
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError; a cut stream, EOFError
        if isinstance(e, FileNotFoundError):
            raise
        raise TraceError(f"{path}: cannot read ({e})") from None
    return out


def load(path, limit=0):
    """[(input_length, hash_ids)] in file order (read_trace: each line checked, TraceError naming
    the line otherwise)."""
    return [(r["input_length"], r["hash_ids"]) for r in read_trace(path, limit)]


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
