"""Mooncake conversation-trace replay driven from Python through the pagedkv bindings, against
the C++ pagedkv-replay on the same trace and settings, in the same run.

Default replay mode (docs/traces.md): requests in file order, one at a time, prompt only. Per
request, as an engine's scheduler would: make_request (hashing), get_computed_blocks,
allocate_slots, free: one binding call per step. Token synthesis (python/bench/mooncake.py, the
same tokens as bench/replay/trace.cpp) is outside the timed sections, as in the C++ tool.

Optionally the first K requests also run through vllm_style.py, a pure-Python re-implementation
of vLLM's block pool written from its documented semantics (NOT vLLM itself).

Exit code 77 when the trace is missing (ctest: skipped).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mooncake  # noqa: E402
import pagedkv  # noqa: E402
import vllm_style  # noqa: E402


def replay_bindings(trace, num_blocks, block_size=16, hash_scheme="sha256", seed="replay"):
    """One pass through the bindings. Returns counts and the seconds spent in the calls."""
    kv = pagedkv.KVCacheManager(num_blocks, block_size=block_size, hash_scheme=hash_scheme,
                                hash_seed=seed)
    res = dict(requests=0, rejected=0, prompt_tokens=0, prompt_blocks=0, hit_tokens=0,
               hash_seconds=0.0, pool_seconds=0.0, hash_cpu_seconds=0.0, pool_cpu_seconds=0.0)
    clock = time.perf_counter
    cpu = time.thread_time  # CPU time of this thread: on a loaded machine the wall clock also
    for i, (input_length, hash_ids) in enumerate(trace):  # counts waits for a core
        tokens = mooncake.synthesize(i, input_length, hash_ids)
        blocks_needed = -(-input_length // block_size)
        res["requests"] += 1
        res["prompt_tokens"] += input_length
        res["prompt_blocks"] += blocks_needed
        if blocks_needed > num_blocks - 1:
            res["rejected"] += 1
            continue
        c0, t0 = cpu(), clock()
        req = kv.make_request(i, tokens)
        c1, t1 = cpu(), clock()
        hit = kv.get_computed_blocks(req)
        new = kv.allocate_slots(req, input_length - hit.num_tokens, hit)
        kv.free(req)
        c2, t2 = cpu(), clock()
        if new is None:
            raise RuntimeError(f"request {i} did not fit an idle pool")
        res["hash_seconds"] += t1 - t0
        res["pool_seconds"] += t2 - t1
        res["hash_cpu_seconds"] += c1 - c0
        res["pool_cpu_seconds"] += c2 - c1
        res["hit_tokens"] += hit.num_tokens
        # Destroyed outside the timed sections, as the C++ replay destroys its Request.
        del req, hit, new
    res["evicted_blocks"] = kv.stats().evictions
    kv.check_invariants()
    return res


def replay_vllm_style(trace, num_blocks, block_size=16):
    """The same replay through the pure-Python re-implementation (vllm_style.py)."""
    m = vllm_style.Manager(num_blocks, block_size)
    res = dict(requests=0, rejected=0, prompt_tokens=0, prompt_blocks=0, hit_tokens=0,
               hash_seconds=0.0, pool_seconds=0.0, hash_cpu_seconds=0.0, pool_cpu_seconds=0.0)
    clock = time.perf_counter
    cpu = time.thread_time
    for i, (input_length, hash_ids) in enumerate(trace):
        tokens = mooncake.synthesize(i, input_length, hash_ids).tolist()
        blocks_needed = -(-input_length // block_size)
        res["requests"] += 1
        res["prompt_tokens"] += input_length
        res["prompt_blocks"] += blocks_needed
        if blocks_needed > num_blocks - 1:
            res["rejected"] += 1
            continue
        c0, t0 = cpu(), clock()
        hashes = vllm_style.hash_request(tokens, block_size)
        c1, t1 = cpu(), clock()
        hit, hit_tokens = m.get_computed_blocks(input_length, hashes)
        if m.allocate_slots(i, input_length, hashes, input_length - hit_tokens, hit) is None:
            raise RuntimeError(f"request {i} did not fit an idle pool")
        m.free(i)
        c2, t2 = cpu(), clock()
        res["hash_seconds"] += t1 - t0
        res["pool_seconds"] += t2 - t1
        res["hash_cpu_seconds"] += c1 - c0
        res["pool_cpu_seconds"] += c2 - c1
        res["hit_tokens"] += hit_tokens
    res["evicted_blocks"] = m.pool.evictions
    return res


def replay_cpp(binary, trace_path, limit, num_blocks, block_size, hash_scheme):
    cmd = [binary, "--trace", trace_path, "--num-blocks", str(num_blocks), "--block-size",
           str(block_size), "--hash", hash_scheme, "--threads", "1"]
    if limit:
        cmd += ["--limit", str(limit)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def us_per_block(r, cpu=False):
    """Hashing + pool microseconds per prompt block, wall clock or CPU time."""
    if cpu:
        return 1e6 * (r["hash_cpu_seconds"] + r["pool_cpu_seconds"]) / r["prompt_blocks"]
    return 1e6 * (r["hash_seconds"] + r["pool_seconds"]) / r["prompt_blocks"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", required=True)
    p.add_argument("--limit", type=int, default=0, help="first K requests (0: all)")
    p.add_argument("--num-blocks", type=int, nargs="+", default=[32001])
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--hash", default="sha256")
    p.add_argument("--repeat", type=int, default=1, help="runs of each; medians are reported")
    p.add_argument("--cpp-replay", help="path to pagedkv-replay (compared in the same run)")
    p.add_argument("--vllm-style-limit", type=int, default=0,
                   help="also replay the first K requests through vllm_style.py (0: skip)")
    a = p.parse_args()
    if not os.path.exists(a.trace):
        print(f"replay.py: trace not found: {a.trace}: skipped")
        return 77
    try:
        trace = mooncake.load(a.trace, a.limit)
    except mooncake.TraceError as e:
        print(f"replay.py: {e}", file=sys.stderr)
        return 1
    med = statistics.median
    for n in a.num_blocks:
        py_runs, cpp_runs = [], []
        for _ in range(a.repeat):   # interleaved, so machine noise hits both alike
            if a.cpp_replay:
                cpp_runs.append(replay_cpp(a.cpp_replay, a.trace, a.limit, n, a.block_size, a.hash))
            py_runs.append(replay_bindings(trace, n, a.block_size, a.hash))
        py = py_runs[0]
        print(f"N={n} requests={py['requests']} prompt_blocks={py['prompt_blocks']} "
              f"hit_tokens={py['hit_tokens']} ({100 * py['hit_tokens'] / py['prompt_tokens']:.3f}%)"
              f" evicted={py['evicted_blocks']}")
        def line(runs, cpu):
            h = med(r["hash_cpu_seconds" if cpu else "hash_seconds"] for r in runs)
            q = med(r["pool_cpu_seconds" if cpu else "pool_seconds"] for r in runs)
            return h, q, med(us_per_block(r, cpu) for r in runs)

        for cpu in (False, True):
            kind = "CPU time" if cpu else "wall clock"
            py_hash, py_pool, py_us = line(py_runs, cpu)
            print(f"  [{kind}] python bindings : hashing {py_hash:.3f} s, pool {py_pool:.3f} s, "
                  f"{py_us:.3f} us/block (median of {a.repeat})")
            if cpp_runs:
                c = cpp_runs[0]
                if (c["hit_tokens"], c["evicted_blocks"]) != (py["hit_tokens"],
                                                              py["evicted_blocks"]):
                    print(f"  MISMATCH with C++: hit {c['hit_tokens']} "
                          f"evicted {c['evicted_blocks']}")
                    return 1
                c_hash, c_pool, c_us = line(cpp_runs, cpu)
                print(f"  [{kind}] C++ replay      : hashing {c_hash:.3f} s, pool {c_pool:.3f} s, "
                      f"{c_us:.3f} us/block (same hits and evictions)")
                print(f"  [{kind}] binding overhead: {py_us - c_us:+.3f} us/block "
                      f"({1e6 * (py_hash + py_pool - c_hash - c_pool) / py['requests']:+.2f} "
                      f"us/request, python/C++ = {py_us / c_us:.2f}x)")
            print(f"  [{kind}] vs vLLM's quoted 0.64 (pool) + 1.1 (hashing) = 1.74 us/block: "
                  f"{1.74 / py_us:.1f}x")
        if a.vllm_style_limit:
            sub = trace[: a.vllm_style_limit]
            v = replay_vllm_style(sub, n, a.block_size)
            b = replay_bindings(sub, n, a.block_size, a.hash)
            if (v["hit_tokens"], v["evicted_blocks"]) != (b["hit_tokens"], b["evicted_blocks"]):
                print(f"  MISMATCH vllm_style: hit {v['hit_tokens']} vs {b['hit_tokens']}, "
                      f"evicted {v['evicted_blocks']} vs {b['evicted_blocks']}")
                return 1
            vb = v["prompt_blocks"]
            print(f"  first {len(sub)} requests ({vb} blocks), same hits and evictions "
                  f"(CPU time):")
            print(f"    vllm_style.py (pure Python, our re-implementation): hashing "
                  f"{1e6 * v['hash_cpu_seconds'] / vb:.3f} us/block, pool "
                  f"{1e6 * v['pool_cpu_seconds'] / vb:.3f} us/block")
            print(f"    pagedkv bindings: hashing {1e6 * b['hash_cpu_seconds'] / vb:.3f} us/block, "
                  f"pool {1e6 * b['pool_cpu_seconds'] / vb:.3f} us/block; "
                  f"speed-up {us_per_block(v, True) / us_per_block(b, True):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
