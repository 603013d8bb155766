#!/bin/bash
cd "$(dirname "$0")/.."
bash .gpu-kit/part1/install.sh .gpu-kit/part1 > $OUT/kit1.log 2>&1 && source /tmp/gpu-kit/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
mkdir -p $OUT/w; W=$OUT/w
{ env | grep -i -E "^PYTHON|^PIP"; python -c "import sys,os,importlib.util as u,torch; print('dont_write', sys.flags.dont_write_bytecode, 'prefix', sys.pycache_prefix); f=torch.__file__; print(f, u.cache_from_source(f), os.path.exists(u.cache_from_source(f)), 'writable', os.access(os.path.dirname(f), os.W_OK))"; ls /opt/torch/.venv/lib/python3.12/site-packages/torch/__pycache__ 2>&1 | head -3; id; } > $W/pyenv.txt 2>&1
s=$SECONDS
for i in 1 2; do
 env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc timeout 120 python scripts/investigate_first_call.py --procs 1 --out $W/pyc-1-run$i.json > $W/pyc-1-run$i.log 2>&1
 echo "pyc-1 run$i rc $? $((SECONDS-s))" >> $W/done.txt; s=$SECONDS
done
env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc timeout 150 python scripts/investigate_first_call.py --procs 16 --gpus 0 --out $W/pyc-16.json > $W/pyc-16.log 2>&1
echo "pyc-16 rc $? $((SECONDS-s))" >> $W/done.txt; s=$SECONDS
env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc timeout 150 python scripts/investigate_first_call.py --procs 48 --gpus 0,1,2,3 --out $W/pyc-48.json > $W/pyc-48.log 2>&1
echo "pyc-48 rc $? $((SECONDS-s))" >> $W/done.txt; s=$SECONDS
du -sh /tmp/pyc >> $W/done.txt; find /tmp/pyc -name "*.pyc" | wc -l >> $W/done.txt
cat $W/done.txt $W/pyenv.txt
tar czf $OUT/pyc.tgz -C $OUT w && rm -rf $W
