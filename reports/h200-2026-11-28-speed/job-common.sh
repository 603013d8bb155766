# sourced by each job: kit env, the project installed as a user would, folders
REPO=$PWD
source /tmp/gpu-kit/env.sh
python -m pip install -q --no-deps --no-build-isolation -e . > $OUT/pip.log 2>&1
export ATTNCONF_GIT_COMMIT=$(cat tmpjobs/COMMIT)  # tmpjobs/COMMIT: git rev-parse HEAD
mkdir -p $OUT/w /tmp/runs; W=$OUT/w
B5="--suite default --backend fa2 --backend fa3-vllm --backend flashmla --backend torch-flash --backend sdpa-cuda --profile"
stamp() { echo "$1 rc $2 $(( SECONDS - s )) s $(date +%T)" >> $W/done.txt; s=$SECONDS; }
keep() { cp /tmp/runs/$1.json /tmp/runs/$1.log $W/ 2>/dev/null; python reports/h200-2026-11-28-speed/problems.py /tmp/runs/$1.jsonl.gz $W/$1-problems.jsonl.gz >> $W/done.txt 2>&1; }
pack() { cp /tmp/runs/bench.jsonl $W/ 2>/dev/null; tar czf $OUT/$1.tgz -C $OUT w; }
