#!/bin/bash
# call 5 (parts 1+3): a fresh fuzz campaign on the five kernels, then ledger audit --strict of it
cd "$(dirname "$0")/../.."
for p in 1 3; do bash .gpu-kit/part$p/install.sh .gpu-kit/part$p > $OUT/kit$p.log 2>&1; done
source reports/h200-2026-11-28-speed/job-common.sh
s=$SECONDS
(cd /tmp && timeout -s INT 420 attnconf fuzz --backend fa2 --backend fa3-vllm --backend flashmla --backend torch-flash --backend sdpa-cuda \
   --device cuda --seed 29 --budget 330s --no-progress --out $W/fuzz-29.jsonl.gz > $W/fuzz29.log 2>&1)
stamp fuzz29 $?
timeout 40 attnconf ledger audit --strict $W/fuzz-29.jsonl.gz > $W/audit-fuzz29.txt 2>&1; stamp audit $?
ls -la $W >> $W/done.txt; cat $W/done.txt; tar czf $OUT/fuzz.tgz -C $OUT w
