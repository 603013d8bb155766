#!/usr/bin/env bash
# Run one suite on the GPU in N parallel shards (one runner + worker each) and merge the results.
#
#   bash scripts/gpu-sweep.sh SUITE OUT_JSONL SHARDS [attnconf run options...]
#   bash scripts/gpu-sweep.sh default reports/h200/default.jsonl 8 --backend fa2 --backend fa4 --device cuda
#
# The runner is mostly CPU-bound (reference, baseline, checks, FA4's JIT compiles), so shards on one
# GPU finish several times sooner than one process; each shard is an ordinary `attnconf run --shard i/N`
# with its own crash-isolated worker, and the merged file is what `attnconf report` reads.
set -u
suite=$1; out=$2; n=$3; shift 3
tmp=$(mktemp -d)
start=$(date +%s)
for i in $(seq 0 $((n - 1))); do
  python3 -m conformance run --suite "$suite" --shard "$i/$n" --out "$tmp/shard-$i.jsonl" --no-progress "$@" \
    >"$tmp/shard-$i.log" 2>&1 &
done
wait
cat "$tmp"/shard-*.jsonl >"$out"
echo "suite $suite: $n shards, wall $(( $(date +%s) - start )) s, $(grep -c '"type": "result"' "$out") records -> $out"
tail -n 3 "$tmp"/shard-0.log
