"""KVEventPublisher from Python: batches published over tcp://127.0.0.1 (a port chosen by the
OS), received with pyzmq and decoded with msgpack, checked field by field against the events."""

import struct
import time

import numpy as np
import pytest

import pagedkv
from conftest import tokens

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
if not pagedkv.HAS_EVENTS:
    pytest.skip("pagedkv built without the events layer", allow_module_level=True)


@pytest.fixture
def sub():
    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.LINGER, 0)
    yield s
    s.close()
    ctx.term()


def receive(sub, timeout_ms=200):
    if not sub.poll(timeout_ms):
        return None
    topic, seq, payload = sub.recv_multipart()
    return topic, struct.unpack(">q", seq)[0], msgpack.unpackb(payload, raw=False)


def connected(pub, sub, events):
    """PUB drops messages until the subscription arrives: publish `events` until one gets
    through (ZeroMQ's slow joiner). Returns the message received."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pub.publish(events)
        got = receive(sub)
        if got is not None:
            return got
    raise AssertionError("no message from the publisher within 20 s")


def check_stored(wire, e):
    # array_like: [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
    #              lora_name, extra_keys, group_idx, ...]; trailing defaults may be omitted.
    assert wire[0] == "BlockStored"
    assert wire[1] == e.block_hashes
    assert wire[2] == e.parent_block_hash
    assert wire[3] == e.token_ids
    assert wire[4] == e.block_size
    assert wire[5] is None                       # lora_id
    assert wire[6] == e.medium
    assert wire[7] == e.lora_name
    # extra_keys: one entry per block, None for a block without any (vLLM's tuple as a list).
    assert len(wire[8]) == len(e.block_hashes)
    assert [tuple(k) if k is not None else None for k in wire[8]] == [
        tuple(k) if k else None for k in e.extra_keys] + [None] * (
        len(e.block_hashes) - len(e.extra_keys))
    assert wire[9] == e.group_idx
    assert wire[10] == "full_attention"
    assert len(wire) == 11                       # no sliding window: trailing None omitted

def check_removed(wire, e):
    assert wire[0] == "BlockRemoved"
    assert wire[1] == e.block_hashes
    assert wire[2] == e.medium
    assert (wire[3] if len(wire) > 3 else 0) == e.group_idx


def test_publish_event_objects_and_publish_from(sub):
    kv = pagedkv.KVCacheManager(4, block_size=4, hash_seed="pub", enable_kv_events=True)
    with pagedkv.KVEventPublisher("tcp://127.0.0.1:*", topic="kv", data_parallel_rank=3) as pub:
        assert pub.endpoint.startswith("tcp://127.0.0.1:") and not pub.endpoint.endswith("*")
        sub.connect(pub.endpoint)

        r = kv.make_request(1, tokens(*range(9)), lora_name="ad")
        kv.allocate_slots(r, 9, kv.get_computed_blocks(r))
        events = kv.take_events()
        (stored,) = events
        topic, seq, batch = connected(pub, sub, events)
        assert topic == b"kv"
        ts, wire_events, dp_rank = batch
        assert isinstance(ts, float) and abs(ts - time.time()) < 60 and dp_rank == 3
        (wire,) = wire_events
        check_stored(wire, stored)
        assert wire[3] == list(range(8)) and wire[6] == "GPU" and wire[7] == "ad"
        while receive(sub, 100) is not None:     # earlier copies of the warm-up batch
            pass
        last = pub.stats().published_batches - 1

        # publish_from: the manager's pending events, without Python event objects.
        kv.free(r)
        big = kv.make_request(2, tokens(*range(100, 112)))
        kv.allocate_slots(big, 12)               # evicts the two cached blocks
        expected = kv.snapshot().next_event_seq
        assert pub.publish_from(kv) == last + 1
        assert kv.take_events() == []            # taken by the publisher
        assert pub.publish_from(kv) is None      # nothing pending: nothing published
        got = receive(sub, 10_000)
        assert got is not None and got[1] == last + 1
        removed = [w for w in got[2][1] if w[0] == "BlockRemoved"]
        assert sum(len(w[1]) for w in removed) == 2
        assert sorted(h for w in removed for h in w[1]) == sorted(stored.block_hashes)
        assert all(w[2] == "GPU" for w in removed)
        assert expected >= 2
        assert pub.flush(5.0)
        s = pub.stats()
        assert s.published_batches == last + 2 and s.dropped_batches == 0
    with pytest.raises(pagedkv.Error) as e:
        pub.publish(events)
    assert e.value.code == pagedkv.ErrorCode.INVALID_STATE


def test_tier_events_carry_medium_on_the_wire(sub):
    tier = pagedkv.TieredKVCacheManager(5, 8, block_size=4, hash_seed="pub",
                                        enable_kv_events=True)
    r = tier.make_request(1, tokens(*range(9)))
    a = tier.allocate_slots(r, 9, tier.get_computed_blocks(r))
    for i in a.transfers.store_ids:
        tier.commit(int(i), True)
    events = tier.take_events()
    assert {e.medium for e in events} == {"GPU", "CPU"}
    with pagedkv.KVEventPublisher("tcp://127.0.0.1:*", encoding="array_like") as pub:
        sub.connect(pub.endpoint)
        _, _, batch = connected(pub, sub, events)
        assert len(batch[1]) == len(events)
        for wire, e in zip(batch[1], events):
            check_stored(wire, e)
        # The same batch through publish_from (events taken in C++).
        tier.free(r)
        r2 = tier.make_request(2, np.arange(100, 116, dtype=np.int32))
        tier.allocate_slots(r2, 16, tier.get_computed_blocks(r2))
        while receive(sub, 100) is not None:
            pass
        seq = pub.publish_from(tier)
        got = receive(sub, 10_000)
        assert got is not None and got[1] == seq
        assert {w[0] for w in got[2][1]} <= {"BlockStored", "BlockRemoved"}


def test_bad_arguments():
    with pytest.raises(pagedkv.Error) as e:
        pagedkv.KVEventPublisher("tcp://127.0.0.1:*", hash_format="hex")
    assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT
    with pagedkv.KVEventPublisher("tcp://127.0.0.1:*") as pub:
        with pytest.raises(pagedkv.Error):
            pub.publish([object()])
        with pytest.raises(pagedkv.Error):
            pub.publish_from(object())
        assert pub.publish([]) is None
        assert pub.stats().published_batches == 0
        # flush's timeout: NaN, negative and huge floats were undefined behaviour as a count of
        # milliseconds; they are refused now, naming the argument.
        for bad in (float("nan"), -1.0, float("inf"), 1e300):
            with pytest.raises(pagedkv.Error) as e:
                pub.flush(bad)
            assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT
            assert "timeout_s" in str(e.value)
        assert pub.flush(0.0) and pub.flush(86400.0)


# Integer settings go through the checked conversion, as every other entry point's do.
@pytest.mark.parametrize("kw,what", [
    (dict(buffer_steps=1.0), "buffer_steps"), (dict(hwm=True), "hwm"),
    (dict(max_queue_size=-1), "max_queue_size"), (dict(data_parallel_rank=0.0),
                                                   "data_parallel_rank"),
    (dict(linger_ms=False), "linger_ms"), (dict(hwm=2**31), "hwm")])
def test_integer_settings_refuse_floats_bools_and_out_of_range(kw, what):
    with pytest.raises(pagedkv.Error) as e:
        pagedkv.KVEventPublisher("tcp://127.0.0.1:*", **kw)
    assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT
    assert what in str(e.value)
