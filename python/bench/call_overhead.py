"""Per-call cost of the four binding calls of a request step, on one-block requests (17 tokens,
block size 16), where the library's own work is smallest: what remains is mostly the binding
(argument conversion, busy guards, GIL handling, result objects).

    PYTHONPATH=build/release/python python3 python/bench/call_overhead.py [--n 100000] [--repeat 5]

Prints the median over --repeat runs of ns per call for make_request, get_computed_blocks
(a one-block hit), allocate_slots (two new blocks, one of them full and cached) and free.
"""

import argparse
import statistics
import time

import numpy as np

import pagedkv


def one_run(n):
    kv = pagedkv.KVCacheManager(2 * n + 2, block_size=16, hash_seed="overhead")
    prompts = [np.arange(i * 17, i * 17 + 17, dtype=np.int32) for i in range(n)]
    clock = time.perf_counter
    t0 = clock()
    reqs = [kv.make_request(i, prompts[i]) for i in range(n)]
    t1 = clock()
    hits = [kv.get_computed_blocks(r) for r in reqs]
    t2 = clock()
    for r, h in zip(reqs, hits):
        kv.allocate_slots(r, 17, h)
    t3 = clock()
    for r in reqs:
        kv.free(r)
    t4 = clock()
    # A second pass hits the cached first block of each prompt.
    reqs2 = [kv.make_request(n + i, prompts[i]) for i in range(n)]
    t5 = clock()
    hits2 = [kv.get_computed_blocks(r) for r in reqs2]
    t6 = clock()
    assert all(h.num_tokens == 16 for h in hits2)
    kv.check_invariants()
    per = 1e9 / n
    return dict(make_request=(t1 - t0) * per, get_computed_blocks_miss=(t2 - t1) * per,
                get_computed_blocks_hit=(t6 - t5) * per, allocate_slots=(t3 - t2) * per,
                free=(t4 - t3) * per)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    runs = [one_run(a.n) for _ in range(a.repeat)]
    for k in runs[0]:
        print(f"{k:26s} {statistics.median(r[k] for r in runs):7.0f} ns/call "
              f"(median of {a.repeat}, {a.n} calls each)")


if __name__ == "__main__":
    main()
