#!/usr/bin/env bash
# Run one suite on the GPU in N parallel shards (one runner + worker each) and merge the results.
#
#   bash scripts/gpu-sweep.sh SUITE OUT_JSONL SHARDS [attnconf run options...]
#   SWEEP_LIMIT_S=420 bash scripts/gpu-sweep.sh default reports/h200/default.jsonl 12 --backend fa2 --device cuda
#
# The runner is mostly CPU-bound (reference, baseline, checks, FA4's JIT compiles), so shards on one
# GPU finish several times sooner than one process; each shard is an ordinary `attnconf run --shard i/N`
# with its own crash-isolated worker.  With SWEEP_LIMIT_S the shards are stopped after that many
# seconds and what they recorded is still merged (rerun with --resume on the merged file to finish).
set -u
suite=$1; out=$2; n=$3; shift 3
tmp=$(mktemp -d)
start=$(date +%s)
pids=()
for i in $(seq 0 $((n - 1))); do
  python3 -m conformance run --suite "$suite" --shard "$i/$n" --out "$tmp/shard-$i.jsonl" --no-progress "$@" \
    >"$tmp/shard-$i.log" 2>&1 &
  pids+=($!)
done
if [ -n "${SWEEP_LIMIT_S:-}" ]; then
  ( sleep "$SWEEP_LIMIT_S"; kill "${pids[@]}" 2>/dev/null ) &
  watchdog=$!
fi
wait "${pids[@]}"
[ -n "${watchdog:-}" ] && kill "$watchdog" 2>/dev/null
cat "$tmp"/shard-*.jsonl >"$out"
echo "suite $suite: $n shards, wall $(( $(date +%s) - start )) s, $(grep -c '"type": "result"' "$out") records -> $out"
for i in $(seq 0 $((n - 1))); do tail -n 2 "$tmp/shard-$i.log"; done
