#!/bin/bash
# call 4: the first warm six-kernel run after the warmup, then flash-attention's kvcache tests and peer-fa2-kvcache side by side
cd "$(dirname "$0")/../.."
source reports/h200-2026-11-28-speed/job-common.sh
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4cache
s=$SECONDS
if [ -n "$WARMUP_AGAIN" ]; then
  timeout -s INT 200 attnconf warmup --suite default --backend fa4 --device cuda --no-progress --json $W/warmup6-resumed.json > $W/warmup6-resumed.log 2>&1
  stamp warmup6-resumed $?
fi
echo "fa4cache before warm6 $(find /tmp/fa4cache -type f | wc -l)" >> $W/done.txt
(cd /tmp && timeout 290 python $REPO/scripts/bench_gpu.py /tmp/runs warm6 --cache-dir /tmp/fa4cache -- $B5 --backend fa4)
stamp warm6 $?; keep warm6; pack six
echo "fa4cache after warm6 $(find /tmp/fa4cache -type f | wc -l)" >> $W/done.txt
timeout 40 attnconf ledger audit /tmp/runs/warm6.jsonl.gz > $W/audit-warm6.txt 2>&1; stamp audit6 $?
mkdir -p /tmp/peer && cp tmpjobs/test_flash_attn.py /tmp/peer/  # flash-attention v2.8.3, tests/test_flash_attn.py
(cd /tmp/peer && timeout -s INT 110 python -m pytest -n 12 -q -p no:cacheprovider test_flash_attn.py -k test_flash_attn_kvcache 2>&1 | tail -5 > $W/peer-pytest.log)
stamp peer-pytest $?
(cd /tmp && timeout 150 python $REPO/scripts/bench_gpu.py /tmp/runs peerfa2 -- --suite peer-fa2-kvcache --backend fa2 --profile)
stamp peerfa2 $?; keep peerfa2
cat $W/done.txt; pack six
