"""Copy a results file's header and its problem records (fail, error, crash, timeout) to a gzip file."""

import gzip
import json
import sys

src, dst = sys.argv[1], sys.argv[2]
n = 0
with gzip.open(src, "rt") as fh, gzip.open(dst, "wt", compresslevel=9) as out:
    for line in fh:
        rec = json.loads(line)
        if rec.get("type") == "result" and rec.get("status") not in ("fail", "error", "crash", "timeout"):
            continue
        n += rec.get("type") == "result"
        out.write(line)
print(f"{dst}: {n} problem records")
