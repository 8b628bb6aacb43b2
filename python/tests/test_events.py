"""KV events as objects with vLLM's field names, gap-free sequence numbers."""

import numpy as np

import pagedkv
from conftest import tokens


def test_stored_removed_cleared(kv):
    r = kv.make_request(1, tokens(*range(10)), cache_salt="t", lora_name="lora-a")
    hit = kv.get_computed_blocks(r)
    kv.allocate_slots(r, 10, hit)
    (stored,) = kv.take_events()
    assert isinstance(stored, pagedkv.BlockStored)
    assert stored.seq == 0
    assert stored.block_hashes == [pagedkv.event_id(d) for d in r.block_hashes]
    assert stored.block_digests == r.block_hashes
    assert stored.parent_block_hash is None and stored.parent_block_digest is None
    assert stored.token_ids == list(range(8))
    assert stored.block_size == 4 and stored.medium == "GPU" and stored.group_idx == 0
    assert stored.lora_name == "lora-a" and stored.lora_id is None
    assert stored.extra_keys == [("lora-a", "t"), ("lora-a",)]   # the salt on block 0 only
    assert kv.take_events() == []

    # Decoding completes block 2: its parent is block 1.
    r.num_computed_tokens = 10
    for t in (10, 11):
        r.append_token(t)
        kv.allocate_slots(r, 1)
        r.num_computed_tokens = r.num_tokens
    (stored2,) = kv.take_events()
    assert stored2.seq == 1 and stored2.parent_block_hash == stored.block_hashes[1]
    assert stored2.token_ids == [8, 9, 10, 11]
    kv.free(r)

    # Filling the pool evicts the cached blocks, tail of the chain first.
    big = kv.make_request(2, tokens(*range(100, 136)))
    kv.allocate_slots(big, 36)
    events = kv.take_events()
    removed = [e for e in events if isinstance(e, pagedkv.BlockRemoved)]
    assert [e.block_hashes for e in removed] == [[h] for h in reversed(
        stored.block_hashes + stored2.block_hashes)]
    assert all(e.medium == "GPU" and e.group_idx == 0 for e in removed)
    assert [e.seq for e in events] == list(range(2, 2 + len(events)))
    kv.free(big)
    kv.take_events()
    assert kv.reset_prefix_cache()
    (cleared,) = kv.take_events()
    assert isinstance(cleared, pagedkv.AllBlocksCleared)
    assert cleared.seq == 2 + len(events)          # after the removals and big's BlockStored


def test_events_off_by_default():
    kv = pagedkv.KVCacheManager(10, block_size=4)
    r = kv.make_request(1, np.arange(10, dtype=np.int32))
    kv.allocate_slots(r, 10)
    assert kv.take_events() == []


def test_multimodal_extra_keys():
    kv = pagedkv.KVCacheManager(10, block_size=4, hash_seed="m", enable_kv_events=True)
    r = kv.make_request(1, tokens(*range(9)), mm_items=[("img", 2, 4)])
    kv.allocate_slots(r, 9)
    (e,) = kv.take_events()
    assert e.extra_keys == [(("img", 2),), (("img", -2),)]
