#!/usr/bin/env bash
# Pool and hashing CPU time per prompt block of the Mooncake conversation trace, one thread, for
# each hash scheme at N = 32,001 and 6,000,001, against raw SHA-256 of a 128-byte message
# (`openssl speed`, measured before, between and after the rounds): issue 18's ratios. Each
# replay runs one pool size.
# usage: bench/pool_vs_sha256.sh [BUILD_DIR (default build/release)] [ROUNDS (default 3)]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REPLAY="${1:-$ROOT/build/release}/bench/pagedkv-replay"
ROUNDS="${2:-3}"
TRACE="$ROOT/data/traces/mooncake/conversation_trace.jsonl.gz"
ossl() {
  openssl speed -evp sha256 -bytes 128 -seconds 3 2>/dev/null |
    awk '/^sha256/ {v = $2; sub("k", "", v); printf "openssl_ns %.1f\n", 128 / (v * 1000) * 1e9}'
}
ossl
# Each pool size runs in a process of its own (as an engine has one pool): in one process the
# two pools' requests alternate, and each pool's tables push the other's out of the caches.
for round in $(seq 1 "$ROUNDS"); do
  for h in sha256 xxh3_128 sha256_cbor_vllm; do
    for n in 32001 6000001; do
    "$REPLAY" --threads 1 --trace "$TRACE" --hash "$h" --num-blocks "$n" |
      ROUND="$round" python3 -c '
import json, os, sys
for line in sys.stdin:
    d = json.loads(line)
    b = d["prompt_blocks"]
    print("round", os.environ["ROUND"], d["hash"], d["num_blocks"],
          "pool_ns %.1f" % (d["pool_cpu_seconds"] / b * 1e9),
          "hash_ns %.1f" % (d["hash_cpu_seconds"] / b * 1e9),
          "hit_tokens", d["hit_tokens"], "evicted", d["evicted_blocks"])
'
    done
  done
  ossl
done
