"""The host tier (TieredKVCacheManager): host hits after GPU eviction, plans as arrays, commit
failures rolling a request back, misuse raising with nothing changed, events with their medium."""

import numpy as np
import pytest

import pagedkv
from conftest import tokens


def make_tier(**kw):
    """4 usable GPU blocks of 4 tokens, 8 host slots, write-through."""
    kw.setdefault("hash_seed", "tier")
    return pagedkv.TieredKVCacheManager(5, 8, block_size=4, **kw)


def commit_all(tier, ids, ok=True):
    for i in ids:
        tier.commit(int(i), ok)


def run_and_store(tier, rid, prompt):
    """Schedules a prompt, commits its stores, frees it. Returns the allocation."""
    r = tier.make_request(rid, prompt)
    hit = tier.get_computed_blocks(r)
    a = tier.allocate_slots(r, len(prompt) - hit.num_tokens, hit)
    assert a is not None
    commit_all(tier, a.transfers.store_ids)
    tier.free(r)
    return a


def evicted_from_gpu(tier, prompt):
    """Stores `prompt`, then fills the GPU with other blocks so only the host tier holds it."""
    run_and_store(tier, 1, prompt)
    run_and_store(tier, 2, np.arange(100, 116, dtype=np.int32))


def test_write_through_plan_contents():
    tier = make_tier(bytes_per_block=1024)
    r = tier.make_request(1, tokens(*range(9)))
    hit = tier.get_computed_blocks(r)
    assert (hit.num_gpu_tokens, hit.num_host_tokens, hit.num_tokens) == (0, 0, 0)
    a = tier.allocate_slots(r, 9, hit)
    assert a.new_blocks.dtype == np.int32 and list(a.new_blocks) == list(tier.block_ids(r))
    assert not a.new_blocks.flags.writeable
    plan = a.transfers
    assert plan.evictions.shape == (0, 2) and plan.loads.shape == (0, 2)
    # Write-through: one store per full block, GPU block -> host slot, after the forward pass.
    assert plan.stores.dtype == np.int32 and plan.stores.shape == (2, 2)
    assert list(plan.stores[:, 0]) == list(a.new_blocks[:2])
    assert len(set(plan.stores[:, 1])) == 2
    assert plan.store_ids.dtype == np.uint64 and len(plan.store_ids) == 2
    assert plan.num_copies == 2 and not plan.empty
    assert not plan.stores.flags.writeable
    stores = plan.stores
    del plan, a                      # the view keeps its plan alive
    assert stores.shape == (2, 2)
    assert tier.num_in_flight == 2 and tier.stats().host_slots_storing == 2
    for i in range(2):
        tier.commit(int(tier.snapshot().live_transfers[0]), True)
    s = tier.stats()
    assert (s.stored_blocks, s.stored_bytes, s.host_cached_blocks) == (2, 2048, 2)
    assert tier.num_in_flight == 0
    tier.free(r)
    tier.check_invariants()


def test_host_hit_after_gpu_eviction():
    tier = make_tier(enable_kv_events=True)
    prompt = tokens(*range(9))
    evicted_from_gpu(tier, prompt)
    tier.take_events()
    r = tier.make_request(3, prompt)
    hit = tier.get_computed_blocks(r)
    assert hit.num_gpu_tokens == 0 and len(hit.blocks) == 0
    assert hit.num_host_tokens == 8 and hit.num_tokens == 8 and len(hit.host_slots) == 2
    a = tier.allocate_slots(r, 1, hit)
    loads = a.transfers.loads
    # Loads copy host slot -> GPU block: the hit's slots into the first new blocks, in order.
    assert list(loads[:, 0]) == list(hit.host_slots)
    assert list(loads[:, 1]) == list(a.new_blocks[:2])
    # Every copy names its KV-cache group: 0 for a single-group model.
    assert a.transfers.load_groups.dtype == np.int32 and list(a.transfers.load_groups) == [0, 0]
    assert a.transfers.eviction_groups.shape == (len(a.transfers.evictions),)
    assert len(a.transfers.load_ids) == 2 and tier.has_unfinished_loads(r)
    with pytest.raises(pagedkv.Error):         # loads still in flight
        tier.finish_loads(r)
    commit_all(tier, a.transfers.load_ids)
    res = tier.finish_loads(r)
    assert (res.num_computed_tokens, res.rolled_back) == (8, False)
    assert not tier.has_unfinished_loads(r)
    s = tier.stats()
    assert (s.host_hit_tokens, s.loaded_blocks, s.load_failures) == (8, 2, 0)
    tier.free(r)
    # The loaded blocks are cached on the GPU again: a GPU hit now.
    r2 = tier.make_request(4, prompt)
    assert tier.get_computed_blocks(r2).num_gpu_tokens == 8
    tier.check_invariants()
    events = tier.take_events()
    assert {e.medium for e in events} <= {"GPU", "CPU"}
    assert any(isinstance(e, pagedkv.BlockStored) and e.medium == "GPU" for e in events)
    assert [e.seq for e in events] == list(range(events[0].seq, events[0].seq + len(events)))


def test_store_events_carry_cpu_medium():
    tier = make_tier(enable_kv_events=True)
    run_and_store(tier, 1, tokens(*range(9)))
    events = tier.take_events()
    gpu = [e for e in events if isinstance(e, pagedkv.BlockStored) and e.medium == "GPU"]
    cpu = [e for e in events if isinstance(e, pagedkv.BlockStored) and e.medium == "CPU"]
    assert sum(len(e.block_hashes) for e in gpu) == 2
    assert sum(len(e.block_hashes) for e in cpu) == 2
    assert sorted(h for e in cpu for h in e.block_hashes) == sorted(
        h for e in gpu for h in e.block_hashes)


@pytest.mark.parametrize("failed, computed", [(0, 0), (1, 4)])
def test_failed_load_rolls_back(failed, computed):
    tier = make_tier()
    prompt = tokens(*range(9))
    evicted_from_gpu(tier, prompt)
    r = tier.make_request(3, prompt)
    hit = tier.get_computed_blocks(r)
    a = tier.allocate_slots(r, 1, hit)
    for i, tid in enumerate(a.transfers.load_ids):
        tier.commit(int(tid), i != failed)
    res = tier.finish_loads(r)
    assert res.rolled_back and res.num_computed_tokens == computed
    s = tier.stats()
    assert (s.load_failures, s.rollbacks) == (1, 1)
    tier.check_invariants()
    tier.free(r)
    tier.check_invariants()


def test_failed_store_frees_its_slot():
    tier = make_tier()
    r = tier.make_request(1, tokens(*range(9)))
    a = tier.allocate_slots(r, 9, tier.get_computed_blocks(r))
    ids = a.transfers.store_ids
    tier.commit(int(ids[0]), False)
    tier.commit(int(ids[1]), True)
    s = tier.stats()
    assert (s.store_failures, s.stored_blocks, s.host_cached_blocks) == (1, 1, 1)
    tier.free(r)
    tier.check_invariants()


def test_misuse_raises_and_changes_nothing():
    tier = make_tier()
    prompt = tokens(*range(9))
    evicted_from_gpu(tier, prompt)
    r = tier.make_request(3, prompt)
    hit = tier.get_computed_blocks(r)
    a = tier.allocate_slots(r, 1, hit)
    before = tier.snapshot()

    def refused(code, call, *args):
        with pytest.raises(pagedkv.Error) as e:
            call(*args)
        assert e.value.code == code, str(e.value)
        assert tier.snapshot() == before
        tier.check_invariants()

    refused(pagedkv.ErrorCode.NOT_FOUND, tier.commit, 123456789, True)       # unknown id
    refused(pagedkv.ErrorCode.INVALID_STATE, tier.free, r)                   # loads in flight
    refused(pagedkv.ErrorCode.INVALID_STATE, tier.preempt, r)
    refused(pagedkv.ErrorCode.INVALID_STATE, tier.finish_loads, r)           # loads in flight
    refused(pagedkv.ErrorCode.INVALID_ARGUMENT, tier.allocate_slots, r, -1)
    refused(pagedkv.ErrorCode.INVALID_STATE, tier.allocate_slots, r, 1)      # loads unfinished
    first = int(a.transfers.load_ids[0])
    tier.commit(first, True)
    before = tier.snapshot()
    refused(pagedkv.ErrorCode.NOT_FOUND, tier.commit, first, True)           # committed twice
    commit_all(tier, a.transfers.load_ids[1:])
    tier.finish_loads(r)
    before = tier.snapshot()
    refused(pagedkv.ErrorCode.INVALID_STATE, tier.finish_loads, r)           # nothing to finish
    refused(pagedkv.ErrorCode.INVALID_ARGUMENT, tier.allocate_slots, r, 1, "not a hit")


def test_commit_many_checks_every_id_first():
    tier = make_tier()
    prompt = tokens(*range(9))
    evicted_from_gpu(tier, prompt)
    r = tier.make_request(3, prompt)
    a = tier.allocate_slots(r, 1, tier.get_computed_blocks(r))
    ids = a.transfers.load_ids
    assert len(ids) == 2
    before = tier.snapshot()
    for bad in ([int(ids[0]), int(ids[0])], [int(ids[1]), 123456789]):  # repeated, unknown
        with pytest.raises(pagedkv.Error) as e:
            tier.commit_many(np.array(bad, dtype=np.uint64))
        assert e.value.code == pagedkv.ErrorCode.NOT_FOUND, str(e.value)
        assert tier.snapshot() == before and tier.num_in_flight == 2
    with pytest.raises(pagedkv.Error):
        tier.commit_many(np.zeros((1, 2), dtype=np.uint64))   # not one-dimensional
    tier.commit_many(ids, ok=True)                            # the plan's own array
    assert tier.num_in_flight == 0 and tier.stats().loaded_blocks == 2
    assert tier.finish_loads(r).num_computed_tokens == 8
    tier.commit_many(np.array([], dtype=np.uint64))           # an empty batch: nothing to do
    tier.check_invariants()


def test_config_errors():
    # xxh3_128 is served: the tier keeps SHA-256 prefix identities (docs/tiers.md).
    x = pagedkv.TieredKVCacheManager(5, 8, block_size=4, hash_scheme="xxh3_128")
    assert x.num_host_blocks == 8
    with pytest.raises(pagedkv.Error):
        pagedkv.TieredKVCacheManager(5, 0, block_size=4)
    with pytest.raises(pagedkv.Error) as e:
        pagedkv.TieredKVCacheManager(5, 8, policy="write_sometimes")
    assert "write_back" in str(e.value)
    t = pagedkv.TieredKVCacheManager(5, 8, policy=pagedkv.HostPolicy.WRITE_BACK)
    assert t.policy == pagedkv.HostPolicy.WRITE_BACK and t.num_host_blocks == 8


def test_write_back_stores_on_gpu_eviction():
    tier = make_tier(policy="write_back")
    a = run_and_store(tier, 1, tokens(*range(9)))
    assert a.transfers.empty                        # nothing stored while the GPU holds it
    r = tier.make_request(2, np.arange(100, 116, dtype=np.int32))
    b = tier.allocate_slots(r, 16, tier.get_computed_blocks(r))
    ev = b.transfers.evictions
    assert ev.shape == (2, 2) and len(b.transfers.eviction_ids) == 2
    assert set(ev[:, 0]) <= set(b.new_blocks)       # evicted GPU blocks -> host slots
    commit_all(tier, b.transfers.eviction_ids)
    assert tier.stats().stored_blocks == 2
    tier.free(r)
    r3 = tier.make_request(3, tokens(*range(9)))
    assert tier.get_computed_blocks(r3).num_host_tokens == 8
    tier.check_invariants()


def test_another_tiers_request_is_refused_while_its_loads_are_in_flight():
    """B.free(r) for a request of tier A with loads in flight used to mark it finished: A could
    then neither finish its loads nor free it. Every call refuses another tier's request before
    touching either tier's state; the owner then finishes and frees as usual."""
    a, b = make_tier(), make_tier()
    prompt = tokens(*range(9))
    evicted_from_gpu(a, prompt)
    evicted_from_gpu(b, prompt)
    r = a.make_request(3, prompt)
    alloc = a.allocate_slots(r, 1, a.get_computed_blocks(r))
    assert len(alloc.transfers.load_ids) == 2 and a.has_unfinished_loads(r)
    own = b.make_request(3, prompt)                   # b's own request 3, loading too
    own_alloc = b.allocate_slots(own, 1, b.get_computed_blocks(own))
    before = (a.snapshot(), b.snapshot())
    for call, args in [(b.free, (r,)), (b.preempt, (r,)), (b.finish_loads, (r,)),
                       (b.allocate_slots, (r, 1)), (b.get_computed_blocks, (r,)),
                       (b.has_unfinished_loads, (r,)), (b.block_ids, (r,))]:
        with pytest.raises(pagedkv.Error) as e:
            call(*args)
        assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT, str(e.value)
        assert "request 3 belongs to another manager" in str(e.value)
        assert (a.snapshot(), b.snapshot()) == before
    assert not r.is_finished
    a.commit_many(alloc.transfers.load_ids)
    assert a.finish_loads(r).num_computed_tokens == 8
    a.free(r)
    assert r.is_finished and a.num_requests == 0 and a.num_in_flight == 0
    assert a.num_free_blocks == 4 and a.stats().host_slots_pinned == 0
    run_and_store(a, 3, prompt)                       # the id is free again
    a.check_invariants()
    b.commit_many(own_alloc.transfers.load_ids)
    b.finish_loads(own)
    b.free(own)
    assert b.num_requests == 0 and b.num_in_flight == 0
    b.check_invariants()


@pytest.mark.parametrize("bad", [
    lambda ids: [float(ids[0])],                      # used to be truncated and committed
    lambda ids: [1.7],
    lambda ids: np.array([float(ids[0])]),
    lambda ids: np.array([-1]),                       # used to wrap to 2**64 - 1
    lambda ids: [-1],
    lambda ids: [int(ids[0]), -1],
    lambda ids: [True],
    lambda ids: np.array([True, False]),
    lambda ids: [int(ids[0]), "1"],
    lambda ids: np.zeros((1, 2), dtype=np.uint64),
], ids=["float of a live id", "float", "float array", "negative array", "negative",
        "live then negative", "bool", "bool array", "string", "two dimensions"])
def test_commit_many_takes_only_integer_ids(bad):
    tier = make_tier()
    prompt = tokens(*range(9))
    evicted_from_gpu(tier, prompt)
    r = tier.make_request(3, prompt)
    a = tier.allocate_slots(r, 1, tier.get_computed_blocks(r))
    ids = a.transfers.load_ids
    before = tier.snapshot()
    with pytest.raises(pagedkv.Error) as e:
        tier.commit_many(bad(ids))
    assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT, str(e.value)
    assert "transfer_ids" in str(e.value)
    assert tier.snapshot() == before and tier.num_in_flight == 2
    tier.check_invariants()
    # Any integer form of the ids is taken.
    tier.commit_many([int(ids[0])])
    tier.commit_many(np.array([ids[1]], dtype=np.int64))
    assert tier.num_in_flight == 0


@pytest.mark.parametrize("name", ["commit float", "commit bool", "commit negative",
                                  "allocate float", "has_unfinished_loads float",
                                  "block_ids bool"])
def test_tier_scalar_ids_take_only_integers(name):
    tier = make_tier()
    prompt = tokens(*range(9))
    evicted_from_gpu(tier, prompt)
    r = tier.make_request(3, prompt)
    a = tier.allocate_slots(r, 1, tier.get_computed_blocks(r))
    first = int(a.transfers.load_ids[0])
    call, what = {
        "commit float": (lambda: tier.commit(float(first)), "transfer_id"),
        "commit bool": (lambda: tier.commit(True), "transfer_id"),
        "commit negative": (lambda: tier.commit(-1), "transfer_id"),
        "allocate float": (lambda: tier.allocate_slots(r, 1.0), "num_new_tokens"),
        "has_unfinished_loads float": (lambda: tier.has_unfinished_loads(3.0),
                                       "has_unfinished_loads"),
        "block_ids bool": (lambda: tier.block_ids(True), "block_ids"),
    }[name]
    before = tier.snapshot()
    with pytest.raises(pagedkv.Error) as e:
        call()
    assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT, str(e.value)
    assert what in str(e.value)
    assert tier.snapshot() == before
    tier.commit(np.uint64(first))
    assert tier.num_in_flight == 1


def make_hybrid_tier(**kw):
    """A hybrid model: full attention beside a sliding window of 8 tokens (2 blocks of 4)."""
    kw.setdefault("hash_seed", "hybrid")
    groups = [pagedkv.FullAttentionSpec(4), pagedkv.SlidingWindowSpec(4, 8)]
    return pagedkv.TieredKVCacheManager(17, 64, block_size=4, groups=groups, bytes_per_block=100,
                                        group_bytes_per_block=[100, 60], **kw)


def test_hybrid_tier_loads_only_the_window_of_a_sliding_group():
    tier = make_hybrid_tier()
    assert tier.num_groups == 2 and tier.group_spec(1).window_blocks == 2
    assert tier.window_store == pagedkv.WindowStoreRule.ALL
    prompt = tokens(*range(25))                  # 6 full blocks per group
    a = run_and_store(tier, 1, prompt)
    # Write-through stores every full block of both groups, each row naming its group.
    assert sorted(a.transfers.store_groups.tolist()) == [0] * 6 + [1] * 6
    run_and_store(tier, 2, np.arange(100, 125, dtype=np.int32))  # evicts prompt's GPU blocks
    r = tier.make_request(3, prompt)
    hit = tier.get_computed_blocks(r)
    assert (hit.num_gpu_tokens, hit.num_host_tokens, hit.num_groups) == (0, 24, 2)
    assert list(hit.host_group(0)) == list(hit.host_slots) and len(hit.host_slots) == 6
    window = hit.host_group(1)
    assert not window.flags.writeable
    # Only the window at the hit's end (positions 4 and 5) comes from the host.
    assert list(window[:4]) == [0, 0, 0, 0] and all(window[4:] > 0)
    with pytest.raises(pagedkv.Error, match="group 2"):
        hit.host_group(2)
    a = tier.allocate_slots(r, len(prompt) - hit.num_tokens, hit)
    plan = a.transfers
    groups = plan.load_groups
    assert list(groups) == [0] * 6 + [1] * 2
    loads = plan.loads
    assert list(loads[groups == 0, 0]) == list(hit.host_slots)
    assert list(loads[groups == 1, 0]) == list(window[4:])
    tier.commit_many(plan.load_ids)
    assert tier.finish_loads(r).num_computed_tokens == 24
    assert list(loads[groups == 0, 1]) == list(tier.block_ids(r)[:6])
    assert list(loads[groups == 1, 1]) == list(tier.block_ids(r, 1)[4:6])
    assert list(tier.block_ids(r, 0)) == list(tier.block_ids(r))
    g0, g1 = tier.group_stats()
    assert (g0.loaded_blocks, g0.loaded_bytes, g1.loaded_blocks, g1.loaded_bytes) == (6, 600, 2, 120)
    assert (g0.stored_blocks, g0.stored_bytes, g1.stored_blocks, g1.stored_bytes) == (
        12, 1200, 12, 720)
    assert tier.stats().loaded_blocks == 8
    tier.free(r)
    tier.check_invariants()


def test_hybrid_tier_with_groups_of_different_block_sizes():
    """Full attention in blocks of 4 tokens beside a 16-token window in blocks of 8 tokens."""
    groups = [pagedkv.FullAttentionSpec(4), pagedkv.SlidingWindowSpec(8, 16)]
    tier = pagedkv.TieredKVCacheManager(17, 64, block_size=4, groups=groups, bytes_per_block=100,
                                        group_bytes_per_block=[50, 100], hash_seed="sizes")
    assert tier.group_spec(1).block_size == 8 and tier.group_spec(1).window_blocks == 2
    prompt = tokens(*range(33))                  # 8 full blocks of 4, 4 full blocks of 8
    a = run_and_store(tier, 1, prompt)
    assert sorted(a.transfers.store_groups.tolist()) == [0] * 8 + [1] * 4
    run_and_store(tier, 2, np.arange(100, 133, dtype=np.int32))  # evict the prompt's GPU blocks
    run_and_store(tier, 4, np.arange(200, 233, dtype=np.int32))
    r = tier.make_request(3, prompt)
    hit = tier.get_computed_blocks(r)
    assert (hit.num_gpu_tokens, hit.num_host_tokens, hit.num_groups) == (0, 32, 2)
    assert len(hit.host_group(0)) == 8 and all(hit.host_group(0) > 0)
    window = hit.host_group(1)                   # in the window group's own blocks of 8 tokens
    # The window at the hit's end: tokens [16, 32) = the group's blocks 2 and 3, nothing before.
    assert len(window) == 4 and list(window[:2]) == [0, 0] and all(window[2:] > 0)
    a = tier.allocate_slots(r, len(prompt) - hit.num_tokens, hit)
    plan = a.transfers
    groups = plan.load_groups
    assert list(groups) == [0] * 8 + [1] * 2
    loads = plan.loads
    assert list(loads[groups == 0, 0]) == list(hit.host_group(0))
    assert list(loads[groups == 1, 0]) == list(window[2:])
    tier.commit_many(plan.load_ids)
    assert tier.finish_loads(r).num_computed_tokens == 32
    assert list(loads[groups == 0, 1]) == list(tier.block_ids(r, 0)[:8])
    assert list(loads[groups == 1, 1]) == list(tier.block_ids(r, 1)[2:4])
    g0, g1 = tier.group_stats()
    # A copy of group g moves group_bytes_per_block[g] bytes.
    assert (g0.loaded_blocks, g0.loaded_bytes, g1.loaded_blocks, g1.loaded_bytes) == (8, 400, 2, 200)
    assert (g0.stored_blocks, g1.stored_blocks) == (24, 12)
    tier.free(r)
    tier.check_invariants()


def test_hybrid_tier_arguments_are_checked():
    tier = make_hybrid_tier(window_store="request_tail")
    assert tier.window_store == pagedkv.WindowStoreRule.REQUEST_TAIL
    with pytest.raises(pagedkv.Error, match="window_store: expected 'all' or 'request_tail'"):
        make_hybrid_tier(window_store="tail_only")
    with pytest.raises(pagedkv.Error, match="window_store"):
        make_hybrid_tier(window_store=3)
    with pytest.raises(pagedkv.Error):
        make_hybrid_tier().block_ids(99, 1)       # an unknown request
    tier = make_hybrid_tier()
    r = tier.make_request(1, tokens(*range(9)))
    tier.allocate_slots(r, 9)
    with pytest.raises(pagedkv.Error):
        tier.block_ids(r, 2)                     # no such group
    with pytest.raises(pagedkv.Error):
        tier.group_spec(2)
