#!/bin/bash
# call 3 (part5): FA4 complete; the cold compile phase of default on fa4
cd "$(dirname "$0")/../.."
bash .gpu-kit/part5/install.sh .gpu-kit/part5 > $OUT/kit5.log 2>&1
source reports/h200-2026-11-28-speed/job-common.sh
python -c "import flash_attn.cute; print('fa4 ok')" >> $W/done.txt 2>&1
export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4cache; mkdir -p /tmp/fa4cache
echo "fa4cache before $(find /tmp/fa4cache -type f | wc -l)" >> $W/done.txt
s=$SECONDS
timeout -s INT 520 attnconf warmup --suite default --backend fa4 --device cuda --no-progress --json $W/warmup6.json > $W/warmup6.log 2>&1
stamp warmup6 $?
echo "fa4cache after $(find /tmp/fa4cache -type f | wc -l) $(du -sh /tmp/fa4cache)" >> $W/done.txt
cat $W/done.txt; pack warm
