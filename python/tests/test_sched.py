"""AdmissionScheduler: the probe is read-only and equals get_computed_blocks; longest cached
prefix first; the aging bound; budget and free-block bounds; misuse raising."""

import numpy as np
import pytest

import pagedkv


def toks(start, n):
    return np.arange(start, start + n, dtype=np.int32)


def warm(kv, rid, tokens):
    r = kv.make_request(rid, tokens)
    hit = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, r.num_tokens - hit.num_tokens, hit) is not None
    r.num_computed_tokens = r.num_tokens
    kv.free(r)


def test_probe_is_read_only_and_equals_the_hit():
    kv = pagedkv.KVCacheManager(64, block_size=4, hash_seed="sched")
    warm(kv, 1, np.concatenate([toks(1, 40), toks(900, 2)]))
    s = pagedkv.AdmissionScheduler(kv)
    r = kv.make_request(2, np.concatenate([toks(1, 40), toks(500, 6)]))
    before = kv.snapshot()
    c = s.probe(r)
    assert kv.snapshot() == before
    assert c.gpu_tokens == 40 and c.host_tokens == 0 and c.tokens == 40
    assert c.gpu_free_hit_blocks == 10
    assert kv.get_computed_blocks(r).num_tokens == c.gpu_tokens


def test_longest_cached_prefix_first_and_budget():
    kv = pagedkv.KVCacheManager(200, block_size=4, hash_seed="sched")
    warm(kv, 1, np.concatenate([toks(1, 40), toks(900, 2)]))
    cold = kv.make_request(10, toks(5000, 20))
    hot = kv.make_request(11, np.concatenate([toks(1, 40), toks(7000, 20)]))
    s = pagedkv.AdmissionScheduler(kv)
    p = s.propose([cold, hot], [0, 1], token_budget=30, free_blocks=199, max_admissions=8)
    assert [a.index for a in p.admissions] == [1, 0]
    assert p.admissions[0].cached_tokens == 40 and p.admissions[0].chunk_tokens == 20
    assert p.admissions[1].chunk_tokens == 10  # what is left of the budget
    assert p.tokens_charged == 30 <= 30
    fcfs = pagedkv.AdmissionScheduler(kv, policy="fcfs")
    q = fcfs.propose([cold, hot], [0, 1], token_budget=1000, free_blocks=199, max_admissions=8)
    assert [a.index for a in q.admissions] == [0, 1]
    # Free blocks bound the proposal: the hot request's whole prompt needs 15 blocks.
    r = s.propose([cold, hot], [0, 1], token_budget=1000, free_blocks=5, max_admissions=8)
    assert [a.index for a in r.admissions] == [0]
    assert r.blocks_reserved <= 5


def test_aging_bound_in_a_random_stream():
    rng = np.random.default_rng(3)
    kv = pagedkv.KVCacheManager(80, block_size=4, hash_seed="sched")
    s = pagedkv.AdmissionScheduler(kv, max_passed_over=2, max_candidates=0)
    prefixes = [rng.integers(0, 30000, 24).astype(np.int32) for _ in range(3)]
    waiting, running, arrivals, truth, nxt = [], [], {}, {}, 0
    for _ in range(200):
        for _ in range(int(rng.integers(0, 4))):
            t = np.concatenate([prefixes[int(rng.integers(0, 3))], rng.integers(0, 30000, 5).astype(np.int32)])
            r = kv.make_request(nxt, t)
            waiting.append(r)
            arrivals[r.request_id] = nxt
            truth[nxt] = 0
            nxt += 1
        for r in list(running):
            if rng.integers(0, 2):
                kv.free(r)
                running.remove(r)
        arr = [arrivals[r.request_id] for r in waiting]
        p = s.propose(waiting, arr, token_budget=int(rng.integers(10, 60)),
                      free_blocks=kv.num_free_blocks,
                      max_admissions=1)
        admitted = []
        for a in p.admissions:
            r = waiting[a.index]
            hit = kv.get_computed_blocks(r)
            if kv.allocate_slots(r, r.num_tokens - hit.num_tokens, hit) is None:
                break
            r.num_computed_tokens = r.num_tokens
            admitted.append(a.index)
        s.record_step(len(admitted))
        latest = max((arr[i] for i in admitted), default=-1)
        for i, r in enumerate(waiting):
            if i not in admitted and arr[i] < latest:
                truth[arr[i]] += 1
            if i not in admitted:
                assert s.passed_over(arr[i]) == truth[arr[i]] <= 2
        running += [waiting[i] for i in admitted]
        waiting = [r for i, r in enumerate(waiting) if i not in admitted]
    assert max(truth.values()) >= 1  # the order did differ from arrival order


def test_misuse_raises():
    kv = pagedkv.KVCacheManager(20, block_size=4, hash_seed="sched")
    r = kv.make_request(1, toks(1, 9))
    s = pagedkv.AdmissionScheduler(kv)
    with pytest.raises(pagedkv.Error):
        s.propose([r], [0, 1], token_budget=10, free_blocks=10, max_admissions=1)
    with pytest.raises(pagedkv.Error):
        pagedkv.AdmissionScheduler(kv, policy="lifo")
    s.propose([r], [0], token_budget=10, free_blocks=10, max_admissions=1)
    with pytest.raises(pagedkv.Error):
        s.record_step(2)
    hybrid = pagedkv.KVCacheManager(20, groups=[pagedkv.FullAttentionSpec(4),
                                                pagedkv.SlidingWindowSpec(4, 8)])
    with pytest.raises(pagedkv.Error):
        pagedkv.AdmissionScheduler(hybrid)


def test_tiered_manager():
    tier = pagedkv.TieredKVCacheManager(5, 8, block_size=4, hash_seed="sched")
    s = pagedkv.AdmissionScheduler(tier)
    r = tier.make_request(1, toks(1, 9))
    assert s.probe(r).tokens == 0
