"""Random operations against a small pure-Python model of the manager's semantics
(docs/semantics.md, one full-attention group). After every operation the library and the model must
agree on results, ref counts, cached hashes, the free queue order and every block table row."""

import random

import numpy as np
import pytest

import pagedkv


class Model:
    """vLLM v1 semantics: LRU free queue (head = next allocated), lazy eviction, first-inserted
    hit, hit capped at num_tokens - 1, freed chains queued tail first."""

    def __init__(self, num_blocks, block_size):
        self.B = block_size
        self.ref = [0] * num_blocks
        self.hash = [None] * num_blocks
        self.queue = list(range(1, num_blocks))
        self.map = {}                  # digest -> [block ids], first inserted first
        self.rows = {}                 # request id -> [block ids]
        self.cached = {}               # request id -> number of cached leading blocks
        self.evictions = 0

    def hit(self, req):
        out = []
        for d in req.block_hashes[: (req.num_tokens - 1) // self.B]:
            if not self.map.get(d):
                break
            out.append(self.map[d][0])
        return out

    def allocate(self, req, n, hit):
        rid = req.request_id
        held = self.rows.get(rid, [])
        computed = req.num_computed_tokens + len(hit) * self.B
        need_blocks = -(-(computed + n) // self.B) - len(held) - len(hit)
        need_blocks = max(need_blocks, 0)
        if need_blocks + sum(self.ref[b] == 0 for b in hit) > len(self.queue):
            return None
        row = self.rows.setdefault(rid, [])
        for b in hit:
            if self.ref[b] == 0:
                self.queue.remove(b)
            self.ref[b] += 1
        if hit:
            row.extend(hit)
            self.cached[rid] = len(hit)
        new = []
        for _ in range(need_blocks):
            b = self.queue.pop(0)
            if self.hash[b] is not None:
                self.map[self.hash[b]].remove(b)
                self.hash[b] = None
                self.evictions += 1
            self.ref[b] = 1
            new.append(b)
        row.extend(new)
        full = min(computed + n, req.num_tokens) // self.B
        for i in range(self.cached.get(rid, 0), full):
            d = req.block_hashes[i]
            self.hash[row[i]] = d
            self.map.setdefault(d, []).append(row[i])
        self.cached[rid] = max(self.cached.get(rid, 0), full)
        return new

    def release(self, req):
        row = self.rows.pop(req.request_id)
        self.cached.pop(req.request_id, None)
        unhashed, hashed = [], []
        for b in reversed(row):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (hashed if self.hash[b] is not None else unhashed).append(b)
        self.queue = unhashed + self.queue + hashed


def check_same(kv, model):
    s = kv.snapshot()
    assert list(s.free_queue) == model.queue
    assert list(s.ref_cnts)[1:] == model.ref[1:]
    assert s.block_hashes[1:] == model.hash[1:]
    assert {k: list(v[0]) for k, v in s.request_blocks.items()} == model.rows
    assert kv.stats().evictions == model.evictions


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_match_model(seed):
    rng = random.Random(seed)
    num_blocks, B = rng.choice([(12, 4), (24, 2), (40, 4)])
    kv = pagedkv.KVCacheManager(num_blocks, block_size=B, hash_seed=f"m{seed}")
    model = Model(num_blocks, B)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 20))] for _ in range(4)]
    running, next_id, ops = [], 0, 0
    for _ in range(600):
        op = rng.random()
        if op < 0.35 or not running:
            # A new request: a shared prefix plus a random tail, prefilled in one or two chunks.
            toks = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(0, 12))]
            if not toks:
                continue
            req = kv.make_request(next_id, np.asarray(toks, dtype=np.int32),
                                  cache_salt=rng.choice([None, None, "s"]))
            next_id += 1
            hit = kv.get_computed_blocks(req)
            assert list(hit.blocks) == model.hit(req)
            assert hit.num_tokens == len(hit.blocks) * B
            remaining = req.num_tokens - hit.num_tokens
            chunk = remaining if rng.random() < 0.7 else rng.randrange(1, remaining + 1)
            got = kv.allocate_slots(req, chunk, hit)
            want = model.allocate(req, chunk, list(hit.blocks))
            assert (got is None) == (want is None)
            if got is None:
                continue                     # does not fit: it stays waiting (dropped here)
            assert list(got) == want
            req.num_computed_tokens = hit.num_tokens + chunk
            running.append(req)
        elif op < 0.7:
            # A step: finish the prefill, or decode one token.
            req = rng.choice(running)
            if req.num_computed_tokens < req.num_tokens:
                n = req.num_tokens - req.num_computed_tokens
            else:
                req.append_token(rng.randrange(50))
                n = 1
            got = kv.allocate_slots(req, n)
            want = model.allocate(req, n, [])
            assert (got is None) == (want is None)
            if got is not None:
                assert list(got) == want
                req.num_computed_tokens += n
            else:                            # does not fit: preempt it, as a scheduler would
                kv.preempt(req)
                model.release(req)
                running.remove(req)
        elif op < 0.9:
            req = running.pop(rng.randrange(len(running)))
            kv.free(req)
            model.release(req)
        else:
            # Misuse: raises and changes nothing.
            before = kv.snapshot()
            req = rng.choice(running)
            with pytest.raises(pagedkv.Error):
                rng.choice([lambda: kv.allocate_slots(req, 0),
                            lambda: kv.allocate_slots(req, req.num_tokens + 1),
                            lambda: kv.block_ids(10**9),
                            lambda: kv.evict_blocks([num_blocks])])()
            assert kv.snapshot() == before
        ops += 1
        check_same(kv, model)
        kv.check_invariants()
    assert ops > 400 and model.evictions > 0
