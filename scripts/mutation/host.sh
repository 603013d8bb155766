#!/bin/bash
# On a many-core device host: bash scripts/mutation/host.sh SECONDS GLOB...  (carry .mutwork/wheels: mutmut 3.8.1 and its
# dependencies as wheels; .mutwork/mut.tgz: tar czf of mutants/ made here, with its stats; scripts/ travels with the
# tree).  Runs the untried mutants of the globs for SECONDS, then returns $OUT/all.tgz: the .meta results and the list.
# env CLEAN=1 runs the clean selection beside (pytest -n 3); GPUJOB=cmd runs a GPU job beside.
T=${1:-530}; shift
cd "$(dirname "$0")/../.."
NP=$(nproc)
start=$SECONDS
python -m pip install -q --no-index --find-links .mutwork/wheels mutmut==3.8.1 pytest-benchmark 2>&1 | grep -v WARN | tail -2
python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARN | tail -2
if [ ! -d mutants ]; then tar xzf .mutwork/mut.tgz; echo "extracted mutants/"; else echo "mutants/ kept from the last call"; fi
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
MC=$((NP - 4))
if [ -n "${CLEAN:-}" ]; then
  MC=$((NP - 7))
  ( cd mutants && CUDA_VISIBLE_DEVICES= timeout 420 python -c "
import tomllib, subprocess, sys
c = tomllib.load(open('pyproject.toml', 'rb'))['tool']['mutmut']
sys.exit(subprocess.call([sys.executable, '-m', 'pytest', '-q', '-n', '3', *c['pytest_add_cli_args'], *c['pytest_add_cli_args_test_selection']]))
" > $OUT/clean.log 2>&1; echo "clean rc $?" >> $OUT/clean.log ) &
fi
[ -n "${GPUJOB:-}" ] && { timeout 420 bash $GPUJOB & MC=$((MC - 3)); }
echo "nproc $NP max-children $MC"
CUDA_VISIBLE_DEVICES= MODE=run timeout -s INT -k 10 $((T - (SECONDS - start))) python scripts/mutation/drive.py --max-children $MC "$@" > $OUT/mut.log 2>&1
echo "mutmut rc $?"
wait
MODE=list python scripts/mutation/drive.py > $OUT/list.txt
tail -1 $OUT/list.txt
tr '\r' '\n' < $OUT/mut.log | grep -v "^.[ ]Running\|^.[ ]Generating" | tail -8
tail -2 $OUT/clean.log 2>/dev/null; cat $OUT/gpu-done.txt 2>/dev/null
mkdir -p $OUT/w; mv $OUT/*.log $OUT/*.json* $OUT/*.txt $OUT/w/ 2>/dev/null
tar czf $OUT/all.tgz -C $OUT w -C $PWD $(find mutants -name "*.meta") mutants/mutmut-stats.json; rm -rf $OUT/w
