"""KVCacheManager from Python: the behaviours of the C++ unit tests at the Python level."""

import gc
import threading
import time

import numpy as np
import pytest

import pagedkv
from conftest import tokens


def run_prompt(kv, rid, toks, **keys):
    r = kv.make_request(rid, np.asarray(toks, dtype=np.int32), **keys)
    hit = kv.get_computed_blocks(r)
    new = kv.allocate_slots(r, r.num_tokens - hit.num_tokens, hit)
    assert new is not None
    r.num_computed_tokens = r.num_tokens
    return r, hit, new


def test_prefix_hit_after_free(kv):
    a, hit, new = run_prompt(kv, 1, range(10))
    assert hit.num_tokens == 0 and list(new) == [1, 2, 3]
    kv.free(a)
    b, hit, new = run_prompt(kv, 2, list(range(8)) + [99, 98])
    blocks, num_hit_tokens = hit  # vLLM's (blocks, num_computed_tokens) shape
    assert list(blocks) == [1, 2] and num_hit_tokens == 8 == hit.num_hit_tokens
    assert list(kv.block_ids(b)) == [1, 2] + list(new)
    s = kv.stats()
    assert (s.requests, s.queries, s.hits) == (2, 20, 8)
    assert s.hit_rate == pytest.approx(8 / 20)
    kv.check_invariants()


def test_hit_is_capped_at_num_tokens_minus_one(kv):
    a, _, _ = run_prompt(kv, 1, range(12))
    kv.free(a)
    # The same 12 tokens (3 full blocks) hit only 2 blocks: the last token is recomputed.
    b = kv.make_request(2, tokens(*range(12)))
    hit = kv.get_computed_blocks(b)
    assert hit.num_tokens == 8 and len(hit.blocks) == 2
    # One more token: all 3 blocks hit.
    c = kv.make_request(3, tokens(*range(13)))
    assert kv.get_computed_blocks(c).num_tokens == 12


def test_salt_isolates_tenants(kv):
    a, _, _ = run_prompt(kv, 1, range(9), cache_salt="tenant-a")
    kv.free(a)
    assert kv.get_computed_blocks(kv.make_request(2, tokens(*range(9)))).num_tokens == 0
    assert kv.get_computed_blocks(
        kv.make_request(3, tokens(*range(9)), cache_salt="tenant-b")).num_tokens == 0
    assert kv.get_computed_blocks(
        kv.make_request(4, tokens(*range(9)), cache_salt="tenant-a")).num_tokens == 8


def test_eviction_order_tail_of_chain_first(kv):
    a, _, new_a = run_prompt(kv, 1, range(10))       # blocks 1, 2 cached; 3 partial
    assert list(new_a) == [1, 2, 3]
    kv.free(a)
    # Freed tail first: the unhashed partial block 3 goes to the head, the hashed chain to the
    # tail in reverse order (2 before 1), so the chain's tail is evicted before its head.
    fq = list(kv.snapshot().free_queue)
    assert fq[0] == 3 and fq[-2:] == [2, 1]
    # Take all 9 usable blocks but the last two: 2 is evicted before 1 once they are needed.
    b, _, _ = run_prompt(kv, 2, range(100, 128))     # 7 blocks: 3, 4..9
    assert kv.block_hash(1) is not None and kv.block_hash(2) is not None
    c = kv.make_request(3, tokens(*range(200, 203)))
    assert list(kv.allocate_slots(c, 3)) == [2]
    assert kv.block_hash(2) is None and kv.block_hash(1) is not None
    assert kv.stats().evictions == 1
    kv.check_invariants()


def test_out_of_blocks_is_none_and_changes_nothing(kv):
    big = kv.make_request(1, tokens(*range(40)))      # 10 blocks > 9 usable
    before = kv.snapshot()
    assert kv.allocate_slots(big, 40) is None
    assert kv.snapshot() == before
    assert kv.num_free_blocks == 9


def expect_error(kv, code, fn, *args):
    before = kv.snapshot()
    with pytest.raises(pagedkv.Error) as e:
        fn(*args)
    assert e.value.code == code
    assert kv.snapshot() == before, "a failed call changed the manager"
    kv.check_invariants()
    return str(e.value)


def test_misuse_raises_and_changes_nothing(kv):
    a, _, _ = run_prompt(kv, 1, range(10))
    kv.take_events()
    E = pagedkv.ErrorCode
    msg = expect_error(kv, E.INVALID_ARGUMENT, kv.allocate_slots, a, 0)
    assert "num_new_tokens must be greater than 0" in msg
    expect_error(kv, E.OUT_OF_RANGE, kv.allocate_slots, a, 5)        # beyond known tokens
    expect_error(kv, E.INVALID_ARGUMENT, kv.allocate_slots, a, -1)
    expect_error(kv, E.NOT_FOUND, kv.block_ids, 77)
    expect_error(kv, E.OUT_OF_RANGE, kv.block_ids, a, 1)
    # Freeing a request that never got blocks (aborted while waiting) changes nothing; freeing
    # it again is an error.
    waiting = kv.make_request(9, tokens(1, 2))
    before = kv.snapshot()
    kv.free(waiting)
    assert kv.snapshot() == before
    expect_error(kv, E.INVALID_STATE, kv.free, waiting)
    expect_error(kv, E.OUT_OF_RANGE, kv.evict_blocks, [1, 50])
    expect_error(kv, E.OUT_OF_RANGE, kv.ref_cnt, 10)
    other = pagedkv.KVCacheManager(10, block_size=4, hash_seed="other")
    foreign = other.make_request(5, tokens(*range(8)))
    expect_error(kv, E.INVALID_ARGUMENT, kv.get_computed_blocks, foreign)
    # A stale hit: taken, then its block is evicted before allocate_slots.
    kv.free(a)
    b = kv.make_request(2, tokens(*range(10)))
    hit = kv.get_computed_blocks(b)
    assert hit.num_tokens == 8
    kv.evict_blocks(hit.blocks)
    expect_error(kv, E.INVALID_ARGUMENT, kv.allocate_slots, b, 2, hit)
    expect_error(kv, E.INVALID_STATE, kv.free, a)                     # freed twice
    expect_error(kv, E.INVALID_STATE, kv.allocate_slots, a, 1)
    expect_error(kv, E.INVALID_STATE, kv.get_computed_blocks, a)
    with pytest.raises(pagedkv.Error):
        b.num_computed_tokens = 11


def test_preempt_keeps_cached_blocks_hitable(kv):
    a, _, _ = run_prompt(kv, 1, range(10))
    kv.preempt(a)
    assert a.num_computed_tokens == 0 and not a.is_finished and kv.num_requests == 0
    hit = kv.get_computed_blocks(a)
    assert hit.num_tokens == 8
    assert kv.allocate_slots(a, 2, hit) is not None
    kv.free(a)
    assert a.is_finished


def test_decode_appends_and_caches_full_blocks(kv):
    a, _, _ = run_prompt(kv, 1, range(7))
    for t in range(5):
        a.append_token(1000 + t)
        assert kv.allocate_slots(a, 1) is not None
        a.num_computed_tokens = a.num_tokens
    assert a.num_tokens == 12 and len(a.block_hashes) == 3
    assert all(kv.block_hash(b) is not None for b in kv.block_ids(a))
    kv.check_invariants()


def test_lookahead_slots_are_never_cached(kv):
    a = kv.make_request(1, tokens(*range(4)))
    new = kv.allocate_slots(a, 4, None, num_lookahead_tokens=5)
    assert len(new) == 3                                  # 9 slots
    assert kv.block_hash(new[0]) is not None and kv.block_hash(new[2]) is None


def test_hybrid_groups_sliding_window():
    kv = pagedkv.KVCacheManager(64, groups=[pagedkv.FullAttentionSpec(4),
                                            pagedkv.SlidingWindowSpec(4, 8)], hash_seed="h")
    assert kv.num_groups == 2 and kv.group_spec(1).kind == pagedkv.AttentionKind.SLIDING_WINDOW
    a, _, _ = run_prompt(kv, 1, range(32))
    kv.free(a)
    b = kv.make_request(2, tokens(*range(33)))
    hit = kv.get_computed_blocks(b)
    assert hit.num_tokens == 32 and hit.num_groups == 2
    win = list(hit.group(1))
    assert len(win) == 8 and win[:6] == [0] * 6 and 0 not in win[6:]  # null block before the window
    assert kv.allocate_slots(b, 1, hit) is not None
    b.num_computed_tokens = 33
    for t in range(8):                                    # decoding frees out-of-window blocks
        b.append_token(500 + t)
        assert kv.allocate_slots(b, 1) is not None
        b.num_computed_tokens = b.num_tokens
    assert kv.num_out_of_window_blocks_freed > 0
    kv.check_invariants()
    with pytest.raises(pagedkv.Error):
        hit.group(2)


def test_cache_hit_view_lifetime_and_read_only(kv):
    a, _, _ = run_prompt(kv, 1, range(10))
    kv.free(a)
    b = kv.make_request(2, tokens(*range(10)))
    blocks = kv.get_computed_blocks(b).blocks          # the CacheHit itself is dropped here
    gc.collect()
    assert list(blocks) == [1, 2] and blocks.dtype == np.int32
    assert not blocks.flags.writeable and not blocks.flags.owndata
    with pytest.raises(ValueError):
        blocks[0] = 5
    row = kv.block_ids(a.request_id) if kv.num_requests else None
    assert row is None
    # block_ids is a copy: later calls do not change an array already returned.
    hit = kv.get_computed_blocks(b)
    kv.allocate_slots(b, 2, hit)
    row = kv.block_ids(b)
    b.num_computed_tokens = 10
    b.append_tokens(tokens(*range(20, 27)))
    kv.allocate_slots(b, 7)
    assert len(row) == 3 and len(kv.block_ids(b)) == 5
    assert pagedkv.CacheHit().num_tokens == 0 and len(pagedkv.CacheHit().blocks) == 0


def test_block_table_and_slot_mapping(kv):
    a, _, _ = run_prompt(kv, 1, range(10))
    b, _, _ = run_prompt(kv, 2, range(50, 55))
    t = kv.block_table([a, b])
    assert t.dtype == np.int32 and t.shape == (2, 3)
    assert list(t[0]) == list(kv.block_ids(a)) and list(t[1]) == list(kv.block_ids(b)) + [0]
    assert (kv.block_table(np.array([1, 2]), max_blocks_per_seq=4)[:, 3] == 0).all()
    out = np.full((4, 5), -7, dtype=np.int32)
    assert kv.block_table([b, a], out=out, pad_block_id=0) is not None
    assert list(out[1, :3]) == list(kv.block_ids(a)) and (out[2:] == -7).all()
    with pytest.raises(pagedkv.Error):
        kv.block_table([a], out=np.zeros((1, 5), dtype=np.int64))   # never a silent copy
    with pytest.raises(pagedkv.Error):
        kv.block_table([a], max_blocks_per_seq=2)
    slots = kv.slot_mapping([a, b], [8, 4], [2, 1])
    ra, rb = kv.block_ids(a), kv.block_ids(b)
    assert slots.dtype == np.int64
    assert list(slots) == [ra[2] * 4, ra[2] * 4 + 1, rb[1] * 4]
    with pytest.raises(pagedkv.Error):
        kv.slot_mapping([a], [8], [5])                    # past its blocks


def test_reset_prefix_cache(kv):
    a, _, _ = run_prompt(kv, 1, range(10))
    assert kv.reset_prefix_cache() is False               # a request holds blocks
    kv.free(a)
    assert kv.reset_prefix_cache() is True
    assert kv.get_computed_blocks(kv.make_request(2, tokens(*range(10)))).num_tokens == 0


def test_caching_disabled():
    kv = pagedkv.KVCacheManager(10, block_size=4, enable_caching=False)
    a, _, _ = run_prompt(kv, 1, range(10))
    kv.free(a)
    assert kv.get_computed_blocks(kv.make_request(2, tokens(*range(10)))).num_tokens == 0


def test_config_errors():
    with pytest.raises(pagedkv.Error):
        pagedkv.KVCacheManager(1)
    with pytest.raises(pagedkv.Error):
        pagedkv.KVCacheManager(10, hash_scheme="xxh3_128", verify_cache_hits=False)


def test_gil_released_and_concurrent_use_is_refused():
    """A long call releases the GIL; a second thread touching the same manager meanwhile gets
    pagedkv.Error(INVALID_STATE) rather than racing."""
    kv = pagedkv.KVCacheManager(5000, block_size=16, hash_seed="g")
    prompt = np.arange(64 * 1024, dtype=np.int32)
    r, _, _ = run_prompt(kv, 1, prompt)
    kv.free(r)
    req = kv.make_request(2, prompt)
    done, stop = threading.Event(), threading.Event()
    calls = [0]

    def worker():
        # At least 100 calls, then until the main thread saw one in flight (a loaded machine
        # may not schedule it during the first ones), at most 20 s.
        deadline = time.monotonic() + 20
        while calls[0] < 100 or (not stop.is_set() and time.monotonic() < deadline):
            kv.get_computed_blocks(req)
            calls[0] += 1
        done.set()

    t = threading.Thread(target=worker)
    busy = ok = 0
    t.start()
    while not done.is_set():
        try:
            kv.num_requests
            ok += 1
        except pagedkv.Error as e:
            assert e.code == pagedkv.ErrorCode.INVALID_STATE and "another thread" in str(e)
            busy += 1
            stop.set()
    t.join()
    assert busy > 0, "the main thread never ran while get_computed_blocks was in flight"
    assert kv.stats().requests == 1 + calls[0]
    kv.check_invariants()


def refused(fn, *args, what, state=()):
    """fn(*args) raises pagedkv.Error(INVALID_ARGUMENT) naming `what`, and every object in
    `state` (managers, tiers) has the same snapshot afterwards."""
    before = [s.snapshot() for s in state]
    with pytest.raises(pagedkv.Error) as e:
        fn(*args)
    assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT, str(e.value)
    assert what in str(e.value), str(e.value)
    assert [s.snapshot() for s in state] == before, "a refused call changed state"
    for s in state:
        s.check_invariants()
    return str(e.value)


def test_another_managers_request_is_refused_and_the_owner_keeps_it():
    """B.free(r) for a request A allocated used to mark it finished: A.free(r) then failed,
    A's blocks leaked and the id stayed taken. Every call taking a request refuses another
    manager's, with both managers unchanged."""
    a = pagedkv.KVCacheManager(10, block_size=4, hash_seed="test")
    b = pagedkv.KVCacheManager(10, block_size=4, hash_seed="test")
    r, _, _ = run_prompt(a, 1, range(10))
    own, _, _ = run_prompt(b, 1, range(50, 56))   # b's own request 1
    foreign = "request 1 belongs to another manager"
    for call, args in [(b.free, (r,)), (b.preempt, (r,)), (b.allocate_slots, (r, 1)),
                       (b.get_computed_blocks, (r,)), (b.block_ids, (r,)),
                       (b.block_table, ([r],)), (b.slot_mapping, ([r], [0], [1])),
                       (b.num_common_prefix_blocks, (r,))]:
        refused(call, *args, what=foreign, state=(a, b))
    assert not r.is_finished and r.num_computed_tokens == 10
    a.preempt(r)                                  # preempted, still a's
    refused(b.allocate_slots, r, 10, what=foreign, state=(a, b))
    hit = a.get_computed_blocks(r)
    assert a.allocate_slots(r, 10 - hit.num_tokens, hit) is not None
    a.free(r)
    assert r.is_finished and a.num_requests == 0 and a.num_free_blocks == 9
    again, _, _ = run_prompt(a, 1, range(10))     # the id is free again
    a.free(again)
    b.free(own)
    assert b.num_requests == 0 and b.num_free_blocks == 9
    a.check_invariants()
    b.check_invariants()
    # Until its first allocation a request belongs to no manager: made by a, run by b.
    routed = a.make_request(2, tokens(*range(9)))
    assert b.allocate_slots(routed, 9) is not None
    refused(a.free, routed, what="request 2 belongs to another manager", state=(a, b))
    b.free(routed)


# Every binding taking ids, tokens, positions or counts refuses floats, bools and (for ids)
# negative values with pagedkv.Error(INVALID_ARGUMENT) naming the argument, nothing changed;
# before, several truncated or wrapped them, or let bools through as 0 and 1.
MANAGER_BAD_CALLS = [
    ("make_request id float", lambda kv, r: kv.make_request(5.0, tokens(1, 2)), "request_id"),
    ("make_request id bool", lambda kv, r: kv.make_request(True, tokens(1, 2)), "request_id"),
    ("make_request id negative", lambda kv, r: kv.make_request(-1, tokens(1, 2)), "request_id"),
    ("prompt float list", lambda kv, r: kv.make_request(5, [1, 2.5]), "prompt_token_ids"),
    ("prompt bool list", lambda kv, r: kv.make_request(5, [True, 2]), "prompt_token_ids"),
    ("prompt bool array", lambda kv, r: kv.make_request(5, np.array([True])), "prompt_token_ids"),
    ("prompt float array", lambda kv, r: kv.make_request(5, np.array([1.0])), "prompt_token_ids"),
    ("append_tokens bool", lambda kv, r: r.append_tokens([1, False]), "append_tokens"),
    ("append_tokens float", lambda kv, r: r.append_tokens(np.array([1.7])), "append_tokens"),
    ("append_token float", lambda kv, r: r.append_token(1.0), "append_token"),
    ("append_token bool", lambda kv, r: r.append_token(True), "append_token"),
    ("num_computed float", lambda kv, r: setattr(r, "num_computed_tokens", 4.0),
     "num_computed_tokens"),
    ("num_computed bool", lambda kv, r: setattr(r, "num_computed_tokens", True),
     "num_computed_tokens"),
    ("num_computed negative", lambda kv, r: setattr(r, "num_computed_tokens", -1),
     "num_computed_tokens"),
    ("allocate float", lambda kv, r: kv.allocate_slots(r, 1.0), "num_new_tokens"),
    ("allocate bool", lambda kv, r: kv.allocate_slots(r, True), "num_new_tokens"),
    ("lookahead float", lambda kv, r: kv.allocate_slots(r, 1, None, 0.5), "num_lookahead_tokens"),
    ("block_ids float id", lambda kv, r: kv.block_ids(1.0), "block_ids"),
    ("block_ids bool id", lambda kv, r: kv.block_ids(True), "block_ids"),
    ("block_ids negative id", lambda kv, r: kv.block_ids(-1), "block_ids"),
    ("block_ids bool group", lambda kv, r: kv.block_ids(r, True), "block_ids: group"),
    ("block_ids float group", lambda kv, r: kv.block_ids(r, 0.0), "block_ids: group"),
    ("block_table bool group", lambda kv, r: kv.block_table([r], True), "block_table: group"),
    ("slot_mapping bool group", lambda kv, r: kv.slot_mapping([r], [0], [1], True),
     "slot_mapping: group"),
    ("group_spec bool", lambda kv, r: kv.group_spec(True), "group_spec: group"),
    ("block_table float ids", lambda kv, r: kv.block_table(np.array([1.0])), "requests"),
    ("block_table negative ids", lambda kv, r: kv.block_table(np.array([-1])), "requests"),
    ("block_table bool ids", lambda kv, r: kv.block_table([True]), "requests"),
    ("block_table float id", lambda kv, r: kv.block_table([1.0]), "requests"),
    ("slot_mapping float positions", lambda kv, r: kv.slot_mapping([1], [0.5], [1]),
     "first_positions"),
    ("slot_mapping bool counts", lambda kv, r: kv.slot_mapping([1], [0], [True]), "num_tokens"),
    ("slot_mapping negative counts", lambda kv, r: kv.slot_mapping([1], [0], [-1]), "num_tokens"),
    ("common prefix bool", lambda kv, r: kv.num_common_prefix_blocks(True),
     "num_common_prefix_blocks"),
    ("evict_blocks float", lambda kv, r: kv.evict_blocks([1.5]), "block_ids"),
    ("evict_blocks bool", lambda kv, r: kv.evict_blocks([True]), "block_ids"),
    ("evict_blocks float array", lambda kv, r: kv.evict_blocks(np.array([1.0])), "block_ids"),
    ("block_hash float", lambda kv, r: kv.block_hash(1.0), "block_id"),
    ("block_hash bool", lambda kv, r: kv.block_hash(True), "block_id"),
    ("ref_cnt bool", lambda kv, r: kv.ref_cnt(True), "block_id"),
    ("mm_items float offset",
     lambda kv, r: kv.make_request(5, tokens(1, 2), mm_items=[("img", 0.5, 1)]), "offset"),
    ("mm_items bool length",
     lambda kv, r: kv.make_request(5, tokens(1, 2), mm_items=[("img", 0, True)]), "length"),
]


@pytest.mark.parametrize("name,call,what", MANAGER_BAD_CALLS, ids=[c[0] for c in MANAGER_BAD_CALLS])
def test_integer_arguments_refuse_floats_bools_and_negatives(kv, name, call, what):
    r, _, _ = run_prompt(kv, 1, range(6))
    tokens_before = r.all_token_ids.tolist()
    computed_before = r.num_computed_tokens
    refused(call, kv, r, what=what, state=(kv,))
    assert r.all_token_ids.tolist() == tokens_before
    assert r.num_computed_tokens == computed_before


# The same for the constructors and the module-level calls, which pybind11's own converter used
# to read: a float raised TypeError instead of pagedkv.Error, and True/False passed as 1/0.
def _scheduler(kv, **kw):
    return pagedkv.AdmissionScheduler(kv, **kw)


ENTRY_POINT_BAD_CALLS = [
    ("Request id float", lambda kv, h: pagedkv.Request(1.0, tokens(1, 2), h), "request_id"),
    ("Request id bool", lambda kv, h: pagedkv.Request(True, tokens(1, 2), h), "request_id"),
    ("Request id negative", lambda kv, h: pagedkv.Request(-1, tokens(1, 2), h), "request_id"),
    ("Request block_size bool",
     lambda kv, h: pagedkv.Request(1, tokens(1, 2), h, True), "block_size"),
    ("Request block_size float",
     lambda kv, h: pagedkv.Request(1, tokens(1, 2), h, 4.0), "block_size"),
    ("manager num_blocks float", lambda kv, h: pagedkv.KVCacheManager(10.0), "num_blocks"),
    ("manager num_blocks bool", lambda kv, h: pagedkv.KVCacheManager(True), "num_blocks"),
    ("manager num_blocks too large", lambda kv, h: pagedkv.KVCacheManager(2**31), "num_blocks"),
    ("manager block_size bool",
     lambda kv, h: pagedkv.KVCacheManager(10, block_size=True), "block_size"),
    ("manager block_size negative",
     lambda kv, h: pagedkv.KVCacheManager(10, block_size=-4), "block_size"),
    ("manager stats_window float",
     lambda kv, h: pagedkv.KVCacheManager(10, stats_window=10.5), "stats_window"),
    ("manager max_model_len bool",
     lambda kv, h: pagedkv.KVCacheManager(10, max_model_len=True), "max_model_len"),
    ("manager lineage_key_depth float",
     lambda kv, h: pagedkv.KVCacheManager(10, lineage_key_depth=2.0), "lineage_key_depth"),
    ("manager ghost shift bool",
     lambda kv, h: pagedkv.KVCacheManager(10, adaptive_ghost_sample_shift=False),
     "adaptive_ghost_sample_shift"),
    ("tier num_host_blocks float",
     lambda kv, h: pagedkv.TieredKVCacheManager(5, 8.0, block_size=4), "num_host_blocks"),
    ("tier selective_hits bool",
     lambda kv, h: pagedkv.TieredKVCacheManager(5, 8, block_size=4, selective_hits=True),
     "selective_hits"),
    ("tier bytes_per_block negative",
     lambda kv, h: pagedkv.TieredKVCacheManager(5, 8, block_size=4, bytes_per_block=-1),
     "bytes_per_block"),
    ("tier group_bytes_per_block float",
     lambda kv, h: pagedkv.TieredKVCacheManager(5, 8, block_size=4, group_bytes_per_block=[1.5]),
     "group_bytes_per_block"),
    ("FullAttentionSpec bool", lambda kv, h: pagedkv.FullAttentionSpec(True), "block_size"),
    ("AttentionSpec.sliding float window",
     lambda kv, h: pagedkv.AttentionSpec.sliding(4, 8.0), "sliding_window"),
    ("hash_blocks block_size bool",
     lambda kv, h: h.hash_blocks(tokens(1, 2, 3, 4), True), "block_size"),
    ("hash_blocks block_size negative",
     lambda kv, h: h.hash_blocks(tokens(1, 2, 3, 4), -4), "block_size"),
    ("make_block_table width float",
     lambda kv, h: pagedkv.make_block_table([[1, 2]], 4.0), "max_blocks_per_seq"),
    ("make_block_table pad bool",
     lambda kv, h: pagedkv.make_block_table([[1, 2]], 4, True), "pad_block_id"),
    ("slot_of block_size bool", lambda kv, h: pagedkv.slot_of([1], True, 0), "block_size"),
    ("slot_of position float", lambda kv, h: pagedkv.slot_of([1], 4, 1.0), "position"),
    ("slot_mapping first_position float",
     lambda kv, h: pagedkv.slot_mapping([1], 4, 0.0, 1), "first_position"),
    ("slot_mapping num_tokens bool",
     lambda kv, h: pagedkv.slot_mapping([1], 4, 0, True), "num_tokens"),
    ("validate_block_table num_blocks float",
     lambda kv, h: pagedkv.validate_block_table(np.zeros((1, 1), np.int32), [1], 4, 10.0),
     "num_blocks"),
    ("manager.block_table width bool",
     lambda kv, h: kv.block_table([1], max_blocks_per_seq=True), "max_blocks_per_seq"),
    ("manager.block_table pad float",
     lambda kv, h: kv.block_table([1], pad_block_id=0.0), "pad_block_id"),
    ("scheduler max_passed_over float",
     lambda kv, h: _scheduler(kv, max_passed_over=1.0), "max_passed_over"),
    ("scheduler max_candidates negative",
     lambda kv, h: _scheduler(kv, max_candidates=-1), "max_candidates"),
    ("scheduler host load bool",
     lambda kv, h: _scheduler(kv, host_load_tokens_per_step=True), "host_load_tokens_per_step"),
    ("propose token_budget float",
     lambda kv, h: _scheduler(kv).propose([], [], token_budget=1.0, free_blocks=1,
                                          max_admissions=1), "token_budget"),
    ("propose arrivals bool",
     lambda kv, h: _scheduler(kv).propose([kv.make_request(9, tokens(1))], [True],
                                          token_budget=1, free_blocks=1, max_admissions=1),
     "arrivals"),
    ("propose remote_tokens negative",
     lambda kv, h: _scheduler(kv).propose([kv.make_request(9, tokens(1))], [0],
                                          token_budget=1, free_blocks=1, max_admissions=1,
                                          remote_tokens=[-1]), "remote_tokens"),
    ("record_step bool", lambda kv, h: _scheduler(kv).record_step(True), "num_admitted"),
    ("passed_over negative", lambda kv, h: _scheduler(kv).passed_over(-1), "arrival"),
]


@pytest.mark.parametrize("name,call,what", ENTRY_POINT_BAD_CALLS,
                         ids=[c[0] for c in ENTRY_POINT_BAD_CALLS])
def test_constructors_and_module_calls_refuse_floats_bools_and_negatives(kv, name, call, what):
    r, _, _ = run_prompt(kv, 1, range(6))
    hasher = pagedkv.BlockHasher(pagedkv.HashScheme.SHA256, "test")
    refused(call, kv, hasher, what=what, state=(kv,))
    assert kv.block_ids(r).tolist() == kv.block_ids(1).tolist()


def test_constructors_and_module_calls_take_every_integer_form(kv):
    """numpy integers work wherever a Python int does (and bools nowhere)."""
    h = pagedkv.BlockHasher(pagedkv.HashScheme.SHA256, "test")
    r = pagedkv.Request(np.uint64(3), tokens(1, 2, 3, 4), h, np.int32(4))
    assert r.request_id == 3 and len(r.block_hashes) == 1
    m = pagedkv.KVCacheManager(np.int64(10), block_size=np.uint8(4), stats_window=np.int16(5),
                               max_model_len=np.int64(64))
    assert m.num_blocks == 10
    assert pagedkv.FullAttentionSpec(np.int32(4)).block_size == 4
    assert pagedkv.slot_of([2], np.int64(4), np.int8(1)) == 9
    assert pagedkv.slot_mapping([2], 4, np.int64(0), np.uint16(2)).tolist() == [8, 9]
    assert pagedkv.make_block_table([[1]], np.int32(2)).tolist() == [[1, 0]]
    assert len(h.hash_blocks(tokens(1, 2, 3, 4), np.uint32(4))) == 1
    s = pagedkv.AdmissionScheduler(m, max_passed_over=np.uint32(3))
    p = s.propose([], np.array([], dtype=np.uint64), token_budget=np.int64(8),
                  free_blocks=np.int32(4), max_admissions=np.int8(1))
    assert len(p.admissions) == 0
    s.record_step(np.int64(0))
    assert s.passed_over(np.uint64(7)) == 0


def test_integer_arguments_still_take_every_integer_form(kv):
    """Python ints, numpy integer scalars and arrays of any integer dtype, ranges, tuples."""
    r = kv.make_request(np.uint64(1), tokens(*range(6)))
    assert kv.allocate_slots(r, np.int64(6)) is not None
    r.num_computed_tokens = np.int32(6)
    r.append_token(np.int16(7))
    r.append_tokens((8, np.int64(9)))
    assert r.all_token_ids.tolist() == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    row = kv.block_ids(np.uint8(1)).tolist()
    assert kv.block_ids(1, np.int32(0)).tolist() == row
    assert kv.group_spec(np.uint8(0)).block_size == kv.group_spec(0).block_size
    for ids in ([1], (1,), np.array([1], dtype=np.uint64), np.array([1], dtype=np.int8), range(1, 2)):
        assert kv.block_table(ids).tolist() == [row]
    assert kv.slot_mapping(np.array([1], dtype=np.uint32), [0], np.array([2], dtype=np.int16)) \
        .tolist() == [row[0] * 4, row[0] * 4 + 1]
    assert kv.ref_cnt(np.int32(row[0])) == 1
    kv.free(r)
