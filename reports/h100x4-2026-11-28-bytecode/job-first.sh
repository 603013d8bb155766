#!/bin/bash
# GPU call: what a fresh worker pays before its first check is cheap
cd "$(dirname "$0")/.."
bash .gpu-kit/part1/install.sh .gpu-kit/part1 > $OUT/kit1.log 2>&1 && source /tmp/gpu-kit/env.sh
python -m pip install -q --no-deps --no-build-isolation -e . > $OUT/pip.log 2>&1
export PYTHONPATH=$PWD:$PYTHONPATH
mkdir -p $OUT/w; W=$OUT/w
{ nproc; nvidia-smi -L; python -c "import torch; print(torch.__version__)"; } > $W/machine.txt 2>&1
s=$SECONDS
timeout 120 python scripts/investigate_first_call.py --procs 1 --out $W/first-1.json > $W/first-1.log 2>&1
echo "first-1 rc $? $((SECONDS-s))" >> $W/done.txt; s=$SECONDS
CUDA_MODULE_LOADING=EAGER timeout 120 python scripts/investigate_first_call.py --procs 1 --out $W/first-1-eager.json > $W/first-1-eager.log 2>&1
echo "first-1-eager rc $? $((SECONDS-s))" >> $W/done.txt; s=$SECONDS
timeout 150 python scripts/investigate_first_call.py --procs 16 --gpus 0 --out $W/first-16.json > $W/first-16.log 2>&1
echo "first-16 rc $? $((SECONDS-s))" >> $W/done.txt; s=$SECONDS
timeout 180 python scripts/investigate_first_call.py --procs 48 --gpus 0,1,2,3 --out $W/first-48.json > $W/first-48.log 2>&1
echo "first-48 rc $? $((SECONDS-s))" >> $W/done.txt; s=$SECONDS
CUDA_VISIBLE_DEVICES=0 timeout 90 python scripts/profile_checks.py --suite smoke --every 100000 --backend fa2 --out $W/prof-fa2-first > $W/prof-fa2.log 2>&1
echo "prof-fa2 rc $? $((SECONDS-s))" >> $W/done.txt; s=$SECONDS
CUDA_VISIBLE_DEVICES=0 timeout 90 python scripts/profile_checks.py --suite smoke --every 100000 --backend sdpa-cuda --out $W/prof-sdpa-first > $W/prof-sdpa.log 2>&1
echo "prof-sdpa rc $? $((SECONDS-s))" >> $W/done.txt; s=$SECONDS
CUDA_VISIBLE_DEVICES=0 timeout 100 python scripts/count_ops.py --suite default --every 100 --backend sdpa-cuda --device cuda --out $W/ops-cuda > $W/ops-cuda.log 2>&1
echo "ops rc $? $((SECONDS-s))" >> $W/done.txt
cat $W/done.txt
tar czf $OUT/first.tgz -C $OUT w && rm -rf $W
