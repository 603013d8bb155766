#!/bin/bash
# call 1 (parts 1+3): default on five kernels at the tree before 2a93a09 (66617e6) and at HEAD, compare
cd "$(dirname "$0")/../.."
for p in 1 3; do bash .gpu-kit/part$p/install.sh .gpu-kit/part$p > $OUT/kit$p.log 2>&1; done
source reports/h200-2026-11-28-speed/job-common.sh
{ nproc; nvidia-smi -L; python -c "import torch; print(torch.__version__)"; env | grep -E "^PYTHON|^CUDA"; lscpu | head -20; } > $W/machine.txt 2>&1
mkdir -p /tmp/old && tar xzf tmpjobs/old.tgz -C /tmp/old  # tmpjobs/old.tgz: git archive 66617e6 attnref attnfast conformance pyproject.toml
s=$SECONDS
(cd /tmp && ATTNCONF_GIT_COMMIT=66617e6 PYTHONPATH=/tmp/old:$PYTHONPATH timeout 200 python $REPO/scripts/bench_gpu.py /tmp/runs old5 -- $B5)
stamp old5 $?; keep old5; pack one
(cd /tmp && timeout 160 python $REPO/scripts/bench_gpu.py /tmp/runs new5 -- $B5)
stamp new5 $?; keep new5; pack one
timeout 60 attnconf compare /tmp/runs/old5.jsonl.gz /tmp/runs/new5.jsonl.gz --json $W/cmp-old5-new5.json > $W/cmp-old5-new5.md 2>&1
stamp cmp $?
timeout 40 attnconf ledger audit /tmp/runs/new5.jsonl.gz > $W/audit-new5.txt 2>&1
stamp audit $?
ls -la ~/.nv/ComputeCache 2>/dev/null | head -3 >> $W/done.txt; du -sh ~/.nv/ComputeCache ~/.cache/attnconf/pycache >> $W/done.txt 2>&1
cat $W/done.txt; pack one
