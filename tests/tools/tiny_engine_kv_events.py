#!/usr/bin/env python3
"""pagedkv-tiny-engine --kv-events: a real engine run's KV events arrive on vLLM's wire.

Binds a SUB socket on 127.0.0.1, runs the engine with --kv-events pointing at it and
--hash sha256_cbor_vllm, then checks the stream with an independent decoder (pyzmq + msgpack):
three frames per message, gap-free sequence numbers, KVEventBatch payloads, and the block hashes
of every BlockStored that starts a chain equal to what pagedkv-hash prints for its tokens.
Usage: tiny_engine_kv_events.py PAGEDKV_TINY_ENGINE PAGEDKV_HASH
"""
import subprocess
import sys
import time

try:
    import msgpack
    import zmq
except ImportError as e:  # reported as skipped by ctest (SKIP_REGULAR_EXPRESSION)
    print(f"SKIPPED: No module named {e.name}")
    sys.exit(0)

SEED = "pagedkv-tiny-engine"


def main():
    engine, hasher = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    port = sub.bind_to_random_port("tcp://127.0.0.1")
    proc = subprocess.Popen([engine, "--hash", "sha256_cbor_vllm", "--json",
                             "--kv-events", f"tcp://127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, text=True)
    messages = []
    deadline = time.time() + 300
    while time.time() < deadline:
        if sub.poll(200):
            messages.append(sub.recv_multipart())
        elif proc.poll() is not None:
            break
    while sub.poll(500):
        messages.append(sub.recv_multipart())
    out, _ = proc.communicate(timeout=60)
    failures = []
    if proc.returncode != 0:
        failures.append(f"engine exited {proc.returncode}")
    seqs = [int.from_bytes(m[1], "big") for m in messages if len(m) == 3]
    if len(seqs) != len(messages) or not messages:
        failures.append(f"{len(messages)} messages, {len(seqs)} of three frames")
    # The first batches may go before the subscription reaches the publisher (PUB drops them);
    # from the first one received on, the sequence is gap-free.
    if seqs and seqs != list(range(seqs[0], seqs[0] + len(seqs))):
        failures.append(f"sequence numbers have gaps: {seqs[:10]}...")
    stored = checked = 0
    for m in messages:
        ts, events, dp_rank = msgpack.unpackb(m[2], raw=False)
        if not isinstance(ts, float) or dp_rank != 0:
            failures.append(f"batch header {ts!r}, {dp_rank!r}")
        for ev in events:
            tag = ev[0] if isinstance(ev, list) else ev.get("type")
            if tag != "BlockStored":
                continue
            stored += 1
            hashes, parent, tokens, block_size = ev[1], ev[2], ev[3], ev[4]
            if block_size != 16 or len(tokens) != 16 * len(hashes) or ev[6] != "GPU":
                failures.append(f"BlockStored fields {ev[:7]}")
            if parent is None and checked < 5:
                digests = subprocess.run(
                    [hasher, "--scheme", "sha256_cbor_vllm", "--seed", SEED, "--block-size", "16",
                     "--tokens", ",".join(map(str, tokens))],
                    capture_output=True, text=True, check=True).stdout.split()
                want = [int(d[-16:], 16) for d in digests]  # vLLM: last 8 bytes, big-endian
                if want != hashes:
                    failures.append(f"hashes {hashes} != pagedkv-hash {want}")
                checked += 1
    if stored == 0 or checked == 0:
        failures.append(f"{stored} BlockStored events, {checked} chains checked")
    for f in failures:
        print("FAIL:", f)
    print(f"{len(messages)} batches, {stored} BlockStored, {checked} chains checked against "
          f"pagedkv-hash")
    print(f"{1 if not failures else 0} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
