#!/bin/bash
# GPU call: default on five kernels, x4 H100, with and without the workers' bytecode cache
cd "$(dirname "$0")/.."
for p in 1 3; do bash .gpu-kit/part$p/install.sh .gpu-kit/part$p > $OUT/kit$p.log 2>&1; done
source /tmp/gpu-kit/env.sh
python -m pip install -q --no-deps --no-build-isolation -e . > $OUT/pip.log 2>&1
mkdir -p $OUT/w /tmp/runs; W=$OUT/w
export ATTNCONF_GIT_COMMIT=$(cat tmpjobs/COMMIT)
{ nproc; nvidia-smi -L; env | grep -E "^PYTHON"; } > $W/machine.txt 2>&1
B="--suite default --backend fa2 --backend fa3-vllm --backend flashmla --backend torch-flash --backend sdpa-cuda --device cuda --profile --no-progress"
run() { # name timeout cpus pycache-prefix-or-empty args...
  local name=$1 t=$2 cpus=$3 pre=$4; shift 4
  local s=$SECONDS
  if [ -n "$pre" ]; then export PYTHONPYCACHEPREFIX=$pre; else unset PYTHONPYCACHEPREFIX; fi
  timeout $t taskset -c $cpus attnconf run $B "$@" --out /tmp/runs/$name.jsonl.gz --json $W/$name.json > $W/$name.log 2>&1
  echo "$name rc $? $((SECONDS-s)) s pyc=$(find $HOME/.cache/attnconf/pycache -name '*.pyc' 2>/dev/null | wc -l)" >> $W/done.txt
  tar czf $OUT/scale.tgz -C $OUT w
}
OFF=/proc/no-bytecode
run r0-off-j32 130 0-63 $OFF --gpus all --jobs 32
run r1-off-j32 130 0-63 $OFF --gpus all --jobs 32
run r2-on-cold-j32 130 0-63 "" --gpus all --jobs 32
run r3-on-j32 130 0-63 "" --gpus all --jobs 32
run r4-on-one16 150 0-15 "" --gpus 0
run r5-on-auto 130 0-63 "" --gpus all
unset PYTHONPYCACHEPREFIX
for pair in "r1-off-j32 r3-on-j32" "r4-on-one16 r3-on-j32"; do set -- $pair
  timeout 60 attnconf compare /tmp/runs/$1.jsonl.gz /tmp/runs/$2.jsonl.gz --json $W/cmp-$1-$2.json > $W/cmp-$1-$2.md 2>&1
  echo "cmp $1 $2 rc $?" >> $W/done.txt; done
cat $W/done.txt
tar czf $OUT/scale.tgz -C $OUT w && rm -rf $W
