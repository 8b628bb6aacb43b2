#!/usr/bin/env bash
# Computed prefill tokens and p99 queueing delay against arrival rate, --schedule fcfs and prefix
# (bench/results/sched.md). Writes bench/results/sched_sweep.dat and, with gnuplot, sched.png.
# Usage: bench/replay/sched_sweep.sh [REPLAY] [SCALES...]   (run from the repository root)
set -euo pipefail
replay=${1:-build/dev/bench/pagedkv-replay}
shift || true
scales=${*:-0.25 0.5 1 2}
out=bench/results/sched_sweep.dat
tmp=$(mktemp)
echo "# arrival_rate_scale fcfs_prefill_tokens prefix_prefill_tokens fcfs_queue_p99_s prefix_queue_p99_s fcfs_waiting_nonempty prefix_waiting_nonempty" > "$tmp"
for s in $scales; do
  row="$s"
  declare -A f
  for sched in fcfs prefix; do
    json=$("$replay" --generate agents --requests 2000 --mode engine --num-blocks 4001 \
           --schedule "$sched" --arrival-rate-scale "$s")
    f[$sched]=$json
  done
  row=$(python3 - "$s" "${f[fcfs]}" "${f[prefix]}" <<'PY'
import json, sys
s, a, b = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(s, a["prefill_tokens_computed"], b["prefill_tokens_computed"],
      a["queue_delay_p99_ms"] / 1e3, b["queue_delay_p99_ms"] / 1e3,
      a["waiting_nonempty_ratio"], b["waiting_nonempty_ratio"])
PY
)
  echo "$row" >> "$tmp"
  echo "$row" >&2
done
mv "$tmp" "$out"
if command -v gnuplot > /dev/null; then gnuplot bench/results/sched_plot.gp; fi
