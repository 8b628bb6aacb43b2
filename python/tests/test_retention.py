"""Retention from Python (issue 38): KvCacheRetentionConfig on requests, the eviction policy and
pin budget on the manager, the retention clock, per-class stats, the host tier's minimum
priority."""

import numpy as np
import pytest

import pagedkv

B = 4
PROMPT = list(range(16))  # the system prompt: 4 blocks


def pin(tokens=len(PROMPT), priority=90, duration=None):
    return pagedkv.KvCacheRetentionConfig(
        [pagedkv.TokenRangeRetentionConfig(0, tokens, priority, duration)])


def run(kv, rid, toks, retention=None):
    r = kv.make_request(rid, np.asarray(toks, dtype=np.int32),
                        kv_cache_retention_config=retention)
    hit = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, r.num_tokens - hit.num_tokens, hit) is not None
    kv.free(r)
    return hit.num_tokens


def flood(kv, first, n):
    for k in range(n):
        rid = first + k
        run(kv, rid, range(100000 + 1000 * rid, 100000 + 1000 * rid + 5 * B))


def with_prompt(rid):
    return PROMPT + [1000 + 100 * rid + i for i in range(3)]


def test_names_and_defaults():
    assert pagedkv.DEFAULT_RETENTION_PRIORITY == 35
    assert pagedkv.MAX_RETENTION_PRIORITY == 100
    assert "lru" in pagedkv.EVICTION_POLICIES and len(pagedkv.EVICTION_POLICIES) >= 3
    t = pagedkv.TokenRangeRetentionConfig(0, 16, 90, 10)
    assert (t.token_start, t.token_end, t.priority, t.duration) == (0, 16, 90, 10)
    c = pagedkv.KvCacheRetentionConfig([t], decode_retention_priority=20)
    assert c.token_range_retention_configs == [t]
    assert (c.decode_retention_priority, c.decode_duration) == (20, None)
    assert "priority=90" in repr(c)
    assert pagedkv.TokenRangeRetentionConfig(4).token_end is None


@pytest.mark.parametrize("make, fragment", [
    (lambda: pagedkv.TokenRangeRetentionConfig(0, 8, 101), "priority 101 is above 100"),
    (lambda: pagedkv.TokenRangeRetentionConfig(0, 8, 90, -3), "duration -3 is not positive"),
    (lambda: pagedkv.TokenRangeRetentionConfig(8, 8), "is empty"),
    (lambda: pagedkv.KvCacheRetentionConfig(
        [pagedkv.TokenRangeRetentionConfig(0, 8), pagedkv.TokenRangeRetentionConfig(4, 12)]),
     "before the end 8"),
    (lambda: pagedkv.KvCacheRetentionConfig(decode_retention_priority=150), "priority 150"),
])
def test_invalid_configs_are_refused(make, fragment):
    with pytest.raises(pagedkv.Error, match=fragment):
        make()


def test_a_range_past_the_prompt_is_refused_and_the_old_config_kept():
    kv = pagedkv.KVCacheManager(64, block_size=B, hash_seed="r")
    r = kv.make_request(1, np.arange(20, dtype=np.int32), kv_cache_retention_config=pin(8))
    with pytest.raises(pagedkv.Error, match="past the prompt's 20 tokens"):
        r.kv_cache_retention_config = pin(21)
    assert r.kv_cache_retention_config == pin(8)
    with pytest.raises(pagedkv.Error, match="past the prompt"):
        kv.make_request(2, np.arange(20, dtype=np.int32), kv_cache_retention_config=pin(40))
    r.kv_cache_retention_config = None
    assert r.kv_cache_retention_config is None


@pytest.mark.parametrize("retain", [True, False])
def test_pinned_system_prompt_survives_a_flood(retain):
    kv = pagedkv.KVCacheManager(64, block_size=B, hash_seed="r")
    cfg = pin() if retain else None
    assert run(kv, 1, with_prompt(1), cfg) == 0
    flood(kv, 10, 60)
    assert kv.stats().evictions > 200
    assert run(kv, 2, with_prompt(2), cfg) == (16 if retain else 0)
    s = kv.retention_stats()
    if retain:
        assert s.retained_blocks == 4 and s.forced_evictions == 0
        assert s.by_class["above_default"].evictions == 0
        assert s.by_class["default"].evictions > 200
    kv.check_invariants()


def test_durations_run_on_the_managers_clock():
    kv = pagedkv.KVCacheManager(64, block_size=B, hash_seed="r")
    run(kv, 1, with_prompt(1), pin(duration=10))  # until tick 10
    blocks_at_90 = [b for b in range(1, 64) if kv.block_retention(b).priority == 90]
    assert len(blocks_at_90) == 4
    assert kv.block_retention(blocks_at_90[0]).expires_at == 10
    kv.set_time(5)
    flood(kv, 10, 60)
    assert run(kv, 2, with_prompt(2)) == 16  # a hit at tick 5 renews: until 15
    kv.set_time(40)
    flood(kv, 100, 60)
    assert run(kv, 3, with_prompt(3)) == 0
    assert kv.retention_stats().expirations >= 4
    assert kv.time == 40
    with pytest.raises(pagedkv.Error, match="monotonic"):
        kv.set_time(39)


def test_pin_budget_and_eviction_policy_on_the_manager():
    kv = pagedkv.KVCacheManager(41, block_size=B, hash_seed="r", max_retained_fraction=0.1,
                                eviction_policy="slru")
    run(kv, 1, list(range(8 * B)) + [7777], pin(8 * B))
    s = kv.retention_stats()
    assert (s.retained_budget, s.retained_blocks) == (4, 4)
    assert s.budget_refusals >= 4
    flood(kv, 10, 40)
    assert run(kv, 2, list(range(8 * B)) + [8888]) == 4 * B
    with pytest.raises(pagedkv.Error, match="nosuch"):
        pagedkv.KVCacheManager(16, eviction_policy="nosuch")


@pytest.mark.parametrize("policy", ["lru", "slru", "s3fifo", "lineage", "adaptive"])
def test_every_policy_keeps_the_pinned_prompt(policy):
    if policy not in pagedkv.EVICTION_POLICIES:
        pytest.skip(f"no {policy} policy in this build")
    kv = pagedkv.KVCacheManager(64, block_size=B, hash_seed="r", eviction_policy=policy)
    run(kv, 1, with_prompt(1), pin())
    flood(kv, 10, 60)
    assert run(kv, 2, with_prompt(2), pin()) == 16


def test_host_tier_minimum_priority():
    def stored(min_priority, retain):
        """Write-through: how many of the prompt's blocks the tier plans to store."""
        t = pagedkv.TieredKVCacheManager(64, 64, block_size=B, hash_seed="r",
                                         secondary_offload_min_priority=min_priority,
                                         host_eviction_policy="lru")
        r = t.make_request(1, np.asarray(with_prompt(1), dtype=np.int32),
                           kv_cache_retention_config=pin() if retain else None)
        hit = t.get_computed_blocks(r)
        a = t.allocate_slots(r, r.num_tokens - hit.num_tokens, hit)
        assert a is not None
        n = len(a.transfers.store_ids)
        for i in a.transfers.store_ids:
            t.commit(int(i))
        t.free(r)
        t.check_invariants()
        return n, t.stats().stores_skipped_priority
    # 19 tokens: 4 full blocks, all of them the system prompt.
    assert stored(0, False) == (4, 0)
    assert stored(50, False) == (0, 4)  # the default priority (35) is below 50
    assert stored(50, True) == (4, 0)   # retained at 90
    assert stored(95, True) == (0, 4)
    with pytest.raises(pagedkv.Error, match="above 100"):
        pagedkv.TieredKVCacheManager(16, 16, secondary_offload_min_priority=101)


@pytest.mark.parametrize("policy", ["lru", "slru", "s3fifo", "lineage", "adaptive"])
def test_a_shared_block_takes_the_highest_priority_asked(policy):
    """A prompt one request keeps below the default (10) is at the default once a request without
    a config shares it, in either order, and outlives older default blocks."""
    if policy not in pagedkv.EVICTION_POLICIES:
        pytest.skip(f"no {policy} policy in this build")
    low = pin(priority=10)
    # The low request first, then a request without a config hits the prompt.
    kv = pagedkv.KVCacheManager(11, block_size=B, hash_seed="r", eviction_policy=policy)
    run(kv, 1, PROMPT + [1], low)
    prompt_blocks = [b for b in range(1, 11) if kv.block_retention(b).priority == 10]
    assert len(prompt_blocks) == 4
    run(kv, 2, list(range(500, 500 + 3 * B)) + [2])  # 3 default blocks, freed before the prompt
    assert run(kv, 3, PROMPT + [3]) == 16
    assert all(kv.block_retention(b).priority == 35 for b in prompt_blocks)
    assert kv.retention_stats().by_class["below_default"].blocks == 0
    run(kv, 4, range(900, 900 + 6 * B))  # 3 uncached blocks and 3 evictions: the older ones
    assert run(kv, 5, PROMPT + [5]) == 16
    kv.check_invariants()
    # The other order: a request without a config holds the prompt; the low one shares it.
    kv = pagedkv.KVCacheManager(64, block_size=B, hash_seed="r", eviction_policy=policy)
    plain = kv.make_request(1, np.asarray(PROMPT + [1], dtype=np.int32))
    assert kv.allocate_slots(plain, plain.num_tokens) is not None
    assert run(kv, 2, PROMPT + [2], low) == 16
    kv.free(plain)
    assert kv.retention_stats().by_class["below_default"].blocks == 0
    kv.check_invariants()


def test_lineage_key_depth_options():
    # The lineage policy's key depth (blocks) and its learned variant are accepted; a depth past
    # the library's bound is refused by the pool.
    kv = pagedkv.KVCacheManager(64, block_size=B, eviction_policy="lineage", lineage_key_depth=48,
                                lineage_adaptive_depth=True)
    assert run(kv, 1, list(range(4 * B)) + [5]) == 0
    with pytest.raises(pagedkv.Error, match="lineage_key_depth"):
        pagedkv.KVCacheManager(64, eviction_policy="lineage", lineage_key_depth=100000)


def test_adaptive_ghost_sample_shift_option():
    # The adaptive policy's ghost sample (1 in 2**s fingerprints) is accepted from 0 to 4 and -1
    # (by the pool's size); other values are refused by the pool, naming the setting.
    for shift in (-1, 0, 2, 4):
        kv = pagedkv.KVCacheManager(64, block_size=B, eviction_policy="adaptive",
                                    adaptive_ghost_sample_shift=shift)
        assert run(kv, 1, list(range(4 * B)) + [5]) == 0
    for bad in (-2, 5):
        with pytest.raises(pagedkv.Error, match="adaptive_ghost_sample_shift"):
            pagedkv.KVCacheManager(64, eviction_policy="adaptive", adaptive_ghost_sample_shift=bad)
