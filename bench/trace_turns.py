#!/usr/bin/env python3
"""How predictable reuse is in a hash-id trace (bench/results/eviction.md, 2026-12-05).

Links each request to the earlier request whose blocks it extends (its longest prefix of
already-seen hash ids, when that prefix is 2 or more ids: the first id of the Mooncake trace is
shared by every request) and prints, per turn number and per prompt length, the share of
requests that get a next turn, and the same per output length and per time since the request it
extends (what an engine knows when a request ends: could either predict the next turn?); then
the gaps between uses of a hash id, in requests (log2 bins).

  python3 bench/trace_turns.py data/traces/mooncake/conversation_trace.jsonl.gz

The trace is read by python/bench/mooncake.py's read_trace: every line is checked (a JSON object
with timestamp, input_length, output_length and hash_ids, each in trace.cpp's ranges), and a
malformed one stops the script with an error naming the file and line (exit 1).
"""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python",
                                "bench"))
import mooncake  # noqa: E402


def read(path):
    """The trace's checked records (mooncake.read_trace, all four fields required)."""
    reqs = mooncake.read_trace(path, required=mooncake.FIELDS)
    if not reqs:
        raise mooncake.TraceError(f"{path}: no requests")
    return reqs


def main(path):
    reqs = read(path)
    owner = {}  # hash id -> the request that first had it
    turn = [1] * len(reqs)
    has_next = [False] * len(reqs)
    parent = [-1] * len(reqs)
    last = {}
    gaps = collections.Counter()
    for i, r in enumerate(reqs):
        ids = r["hash_ids"]
        h = 0
        while h < len(ids) and ids[h] in owner:
            h += 1
        if h >= 2:
            parent[i] = owner[ids[h - 1]]
            turn[i] = turn[parent[i]] + 1
            has_next[parent[i]] = True
        for b in ids:
            owner.setdefault(b, i)
        for b in set(ids):
            if b in last:
                gaps[(i - last[b]).bit_length() - 1] += 1
            last[b] = i
    by_turn = collections.defaultdict(lambda: [0, 0])
    by_len = collections.defaultdict(lambda: [0, 0])
    by_output = collections.defaultdict(lambda: [0, 0])
    by_wait = collections.defaultdict(lambda: [0, 0])  # later turns: log2 of seconds since parent
    for i, r in enumerate(reqs):
        keys = [(by_turn, min(turn[i], 8)), (by_len, min(r["input_length"] // 4000, 8)),
                (by_output, min(r["output_length"] // 256, 4))]
        if parent[i] >= 0:
            seconds = int(max(0, r["timestamp"] - reqs[parent[i]]["timestamp"]) // 1000)
            keys.append((by_wait, min(seconds.bit_length(), 10)))
        for table, key in keys:
            table[key][0] += 1
            table[key][1] += has_next[i]
    print("turn  requests  P(next turn)   (8: 8 or more)")
    for k in sorted(by_turn):
        n, c = by_turn[k]
        print(f"{k:4d}  {n:8d}  {c / n:.3f}")
    print("prompt tokens  requests  P(next turn)   (all turns)")
    for k in sorted(by_len):
        n, c = by_len[k]
        label = f"{k * 4000}-{k * 4000 + 3999}" if k < 8 else f"{k * 4000}+"
        print(f"{label:>13}  {n:8d}  {c / n:.3f}")
    print("output tokens  requests  P(next turn)")
    for k in sorted(by_output):
        n, c = by_output[k]
        label = f"{k * 256}-{k * 256 + 255}" if k < 4 else f"{k * 256}+"
        print(f"{label:>13}  {n:8d}  {c / n:.3f}")
    print("seconds since the turn it extends  requests  P(next turn)   (turns 2 and later)")
    for k in sorted(by_wait):
        n, c = by_wait[k]
        label = "0" if k == 0 else f"{2 ** (k - 1)}-{2 ** k - 1}" if k < 10 else f"{2 ** 9}+"
        print(f"{label:>33}  {n:8d}  {c / n:.3f}")
    print("gap between uses of a hash id (requests)  uses")
    for k in sorted(gaps):
        print(f"{2 ** k:>10}-{2 ** (k + 1) - 1:<10}  {gaps[k]:8d}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: trace_turns.py TRACE.jsonl[.gz]")
    try:
        main(sys.argv[1])
    except (mooncake.TraceError, OSError) as e:
        sys.exit(f"trace_turns.py: {e}")
