#!/usr/bin/env python3
"""Decodes KVEventPublisher's stream with an independent decoder (pyzmq + msgpack) and checks
every frame and field against vLLM's schema (vllm/distributed/kv_events.py) and the block hashes
`pagedkv-hash --scheme sha256_cbor_vllm` prints for the same tokens.

usage: decode_stream.py EMITTER PAGEDKV_HASH [--map] [--bytes]
"""
import subprocess
import sys
import time

import msgpack
import zmq

emitter, hash_cli = sys.argv[1], sys.argv[2]
flags = sys.argv[3:]
as_map = "--map" in flags
as_bytes = "--bytes" in flags
TOPIC = b"kv@test"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def cli_hashes(tokens, *extra):
    out = subprocess.run(
        [hash_cli, "--scheme", "sha256_cbor_vllm", "--block-size", "4", "--tokens",
         ",".join(map(str, tokens)), *extra], check=True, capture_output=True, text=True).stdout
    digests = [bytes.fromhex(line.strip()) for line in out.splitlines() if line.strip()]
    # vLLM's int form: the last 8 bytes, big-endian (maybe_convert_block_hash).
    return [d if as_bytes else int.from_bytes(d[-8:], "big") for d in digests]


r1 = cli_hashes(range(10), "--salt", "s1", "--lora", "ad")
r2 = cli_hashes(range(100, 112))
check(len(r1) == 2 and len(r2) == 3, f"pagedkv-hash gave {len(r1)} and {len(r2)} blocks")

proc = subprocess.Popen([emitter, *flags], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        text=True)
pub_ep, replay_ep = proc.stdout.readline().split()
check(pub_ep.startswith("tcp://127.0.0.1:"), f"endpoint {pub_ep}")
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, TOPIC)
sub.connect(pub_ep)
time.sleep(0.5)  # let the subscription reach the publisher (ZeroMQ's slow joiner)
t0 = time.time()
proc.stdin.write("go\n")
proc.stdin.flush()
check(proc.stdout.readline().strip() == "published", "emitter did not publish")

messages = []
poller = zmq.Poller()
poller.register(sub, zmq.POLLIN)
while len(messages) < 3 and poller.poll(5000):
    messages.append(sub.recv_multipart())
check(len(messages) == 3, f"received {len(messages)} messages, expected 3")


def fields(event, names):
    """Event -> (tag, {field: value}) for either encoding; checks the encoding's shape."""
    if as_map:
        check(isinstance(event, dict), f"event {event!r} is not a map")
        tag = event.get("type")
        check(set(event) <= {"type", *names}, f"unexpected keys in {event!r}")
        return tag, {n: event[n] for n in names if n in event}
    check(isinstance(event, list), f"event {event!r} is not an array")
    tag = event[0]
    return tag, dict(zip(names, event[1:]))


STORED = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
          "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
          "kv_cache_spec_sliding_window"]
REMOVED = ["block_hashes", "medium", "group_idx"]

batches = []
for seq, frames in enumerate(messages):
    check(len(frames) == 3, f"message {seq}: {len(frames)} frames")
    topic, seq_bytes, payload = frames
    check(topic == TOPIC, f"topic {topic!r}")
    check(len(seq_bytes) == 8 and int.from_bytes(seq_bytes, "big") == seq,
          f"seq frame {seq_bytes!r}, expected {seq}")
    batch = msgpack.unpackb(payload, raw=False)
    check(isinstance(batch, list) and len(batch) == 3, f"batch {batch!r} is not [ts, events, rank]")
    ts, evs, rank = batch
    check(isinstance(ts, float) and abs(ts - t0) < 30, f"ts {ts!r}")
    check(rank == 0, f"data_parallel_rank {rank!r}")
    batches.append(evs)

if len(batches) == 3:
    # batch 0: BlockStored of R1 with its extra keys (LoRA name, then the salt on block 0).
    check(len(batches[0]) == 1, f"batch 0 has {len(batches[0])} events")
    tag, f = fields(batches[0][0], STORED)
    check(tag == "BlockStored", f"batch 0 tag {tag}")
    expect = {"block_hashes": r1, "parent_block_hash": None, "token_ids": list(range(8)),
              "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": "ad",
              "extra_keys": [["ad", "s1"], ["ad"]], "group_idx": 0,
              "kv_cache_spec_kind": "full_attention"}
    check(f == expect, f"batch 0 fields {f} != {expect}")
    if not as_map:  # trailing default (kv_cache_spec_sliding_window = None) omitted
        check(len(batches[0][0]) == 1 + 10, f"batch 0 array length {len(batches[0][0])}")
    # batch 1: R1's two blocks evicted (one event each, tail of the free queue order), R2 stored.
    evs = batches[1]
    check(len(evs) == 3, f"batch 1 has {len(evs)} events")
    removed = []
    for ev in evs[:2]:
        tag, f = fields(ev, REMOVED)
        check(tag == "BlockRemoved", f"tag {tag}")
        check(f.get("medium") == "GPU" and f.get("group_idx") == 0, f"removed fields {f}")
        removed += f.get("block_hashes", [])
    check(sorted(removed) == sorted(r1), f"removed {removed} != {r1}")
    tag, f = fields(evs[2], STORED)
    expect = {"block_hashes": r2, "parent_block_hash": None, "token_ids": list(range(100, 112)),
              "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": None,
              "extra_keys": [None, None, None], "group_idx": 0,
              "kv_cache_spec_kind": "full_attention"}
    check(tag == "BlockStored" and f == expect, f"batch 1 stored {tag} {f} != {expect}")
    # batch 2: AllBlocksCleared, no fields.
    check(batches[2] == ([{"type": "AllBlocksCleared"}] if as_map else [["AllBlocksCleared"]]),
          f"batch 2 {batches[2]!r}")

# Replay as vLLM's subscriber asks ([start seq] after the envelope) -> batches 1, 2, then
# (-1, b""). A DEALER keeps the empty delimiter frame a REQ socket would add.
dealer = ctx.socket(zmq.DEALER)
dealer.connect(replay_ep)
dealer.send_multipart([b"", (1).to_bytes(8, "big")])
replayed = []
end = False
while dealer.poll(5000):
    empty, seq_bytes, payload = dealer.recv_multipart()
    seq = int.from_bytes(seq_bytes, "big", signed=True)
    if seq == -1:
        end = payload == b""
        break
    replayed.append((seq, payload))
check(end, "no end marker after the replay")
check([s for s, _ in replayed] == [1, 2], f"replayed seqs {[s for s, _ in replayed]}")
check([p for _, p in replayed] == [m[2] for m in messages[1:]], "replayed payloads differ")

# Hash-agreement probe on the same socket: the digest of tokens 0..3 as block 0.
dealer.send_multipart([b"", b"pagedkv-probe", msgpack.packb([0, 1, 2, 3])])
check(dealer.poll(5000), "no probe reply")
if not failures:
    empty, tag, reply = dealer.recv_multipart()
    reply = msgpack.unpackb(reply, raw=False)
    out = subprocess.run([hash_cli, "--scheme", "sha256_cbor_vllm", "--block-size", "4",
                          "--tokens", "0,1,2,3"], check=True, capture_output=True, text=True).stdout
    # "incarnation": the publisher's random per-instance id (a uint64), asked again on reconnects.
    incarnation = reply.pop("incarnation", None) if isinstance(reply, dict) else None
    check(isinstance(incarnation, int) and 0 <= incarnation < 2**64,
          f"probe reply incarnation {incarnation!r}")
    check(tag == b"pagedkv-probe" and reply == {"scheme": "sha256_cbor_vllm",
                                                "hash": bytes.fromhex(out.split()[0])},
          f"probe reply {tag!r} {reply!r}")
    # A second probe answers the same incarnation (it is per instance, not per answer).
    dealer.send_multipart([b"", b"pagedkv-probe", msgpack.packb([0, 1, 2, 3])])
    check(dealer.poll(5000), "no second probe reply")
    if not failures:
        again = msgpack.unpackb(dealer.recv_multipart()[2], raw=False)
        check(again.get("incarnation") == incarnation,
              f"second probe incarnation {again.get('incarnation')!r} != {incarnation!r}")

proc.stdin.write("quit\n")
proc.stdin.flush()
check(proc.wait(timeout=10) == 0, f"emitter exit code {proc.returncode}")
for f in failures:
    print("FAIL:", f)
print("ok" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
