"""A toy continuous-batching engine whose every KV decision is pagedkv's.

The "model" is numpy only: token t's key is EMB[t]; a sequence's next token is chosen from the
mean of its keys, gathered from a paged KV cache through pagedkv's block table. New keys are
scattered to the slots pagedkv's slot mapping names. Requests share system prompts, so later ones
hit the prefix cache; the pool is small, so some are preempted. The run checks that each output
equals a cache-free recomputation, so a wrong block or slot would be caught.

Waiting requests are admitted by pagedkv.AdmissionScheduler ("prefix", the default: longest
cached prefix first, with an aging bound), or first come first served ("fcfs").
Run: PYTHONPATH=build/release/python python3 python/examples/engine_loop.py [prefix|fcfs]
"""
import sys

import numpy as np
import pagedkv

SCHEDULE = sys.argv[1] if len(sys.argv) > 1 else "prefix"
assert SCHEDULE in ("prefix", "fcfs"), "usage: engine_loop.py [prefix|fcfs]"

B, NUM_BLOCKS, VOCAB, DIM, MAX_BATCH_TOKENS = 16, 48, 1000, 8, 256
rng = np.random.default_rng(0)
EMB = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
OUT = rng.standard_normal((DIM, VOCAB)).astype(np.float32)
kv_cache = np.zeros((NUM_BLOCKS * B, DIM), np.float32)            # [slots, dim], paged
kv = pagedkv.KVCacheManager(NUM_BLOCKS, block_size=B, hash_seed="toy")
sched = pagedkv.AdmissionScheduler(kv, max_passed_over=8)          # reads kv, never changes it

def next_token(keys):
    return int(np.argmax(keys.mean(axis=0) @ OUT))

systems = [rng.integers(0, VOCAB, 100) for _ in range(3)]          # shared system prompts
waiting = [kv.make_request(i, np.concatenate([systems[i % 3], rng.integers(0, VOCAB, 20)])
                           .astype(np.int32)) for i in range(24)]
max_new, outputs, running, steps, preempted = 12, {}, [], 0, 0
while waiting or running:
    steps += 1
    budget, scheduled = MAX_BATCH_TOKENS, []                        # (request, first pos, n)
    for r in list(running):                                         # decode running requests first
        if r not in running:                                        # preempted in this step
            continue
        while kv.allocate_slots(r, 1) is None:                      # no room: preempt the newest
            victim = running.pop()
            kv.preempt(victim)
            waiting.insert(0, victim)
            preempted += 1
            if victim is r:
                break
        else:
            scheduled.append((r, r.num_tokens - 1, 1))
            budget -= 1
    if SCHEDULE == "fcfs":
        order = list(waiting)                                       # first come, first served
    elif waiting and budget > 0:
        proposal = sched.propose(waiting, [r.request_id for r in waiting], token_budget=budget,
                                 free_blocks=kv.num_free_blocks, max_admissions=len(waiting))
        order = [waiting[a.index] for a in proposal.admissions]
    else:
        order = []
    admitted = 0
    for r in order:                                                 # admit with prefix-cache hits
        if budget <= 0:
            break
        hit = kv.get_computed_blocks(r)
        n = r.num_tokens - hit.num_tokens
        if n > budget or kv.allocate_slots(r, n, hit) is None:      # whole prompts only here
            break
        waiting.remove(r)
        running.append(r)
        r.num_computed_tokens = hit.num_tokens
        scheduled.append((r, hit.num_tokens, n))
        budget -= n
        admitted += 1
    if SCHEDULE == "prefix" and order:
        sched.record_step(admitted)                                 # ages the passed-over ones
    if not scheduled:
        raise RuntimeError("nothing fits an empty batch")
    reqs = [s[0] for s in scheduled]
    slots = kv.slot_mapping(reqs, [s[1] for s in scheduled], [s[2] for s in scheduled])
    new_tokens = np.concatenate([r.all_token_ids[p:p + n] for r, p, n in scheduled])
    kv_cache[slots] = EMB[new_tokens]                               # kv_append
    table = kv.block_table(reqs)                                    # int32 [batch, max blocks]
    for row, (r, p, n) in zip(table, scheduled):
        seq_len = p + n
        keys = kv_cache[(row[:, None] * B + np.arange(B)).ravel()[:seq_len]]
        tok = next_token(keys)
        assert tok == next_token(EMB[r.all_token_ids[:seq_len]]), "paged KV differs"
        r.num_computed_tokens = seq_len
        out = outputs.setdefault(r.request_id, [])
        out.append(tok)
        if len(out) >= max_new:                                     # finished
            kv.free(r)
            running.remove(r)
        else:
            r.append_token(tok)
    kv.check_invariants()
s = kv.stats()
print(f"schedule {SCHEDULE}: {len(outputs)} requests, {steps} steps, {preempted} preemptions, "
      f"{sum(map(len, outputs.values()))} tokens generated")
print(f"prefix-cache hit rate {100 * s.hit_rate:.1f}% ({s.hits} of {s.queries} prompt tokens), "
      f"evictions {s.evictions}")
