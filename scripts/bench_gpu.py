"""The GPU speed benchmark (issue 30): one ``attnconf run`` of a suite on the installed GPU kernels, timed, with
its records, its ``--json`` summary (the profile table under ``profile``) and its log kept side by side.

    PYTHONPATH=. python scripts/bench_gpu.py OUT_DIR LABEL [--attnconf CMD] -- RUN-OPTIONS...

runs ``CMD run --device cuda --out OUT_DIR/LABEL.jsonl --json OUT_DIR/LABEL.json --no-progress RUN-OPTIONS``
(``CMD`` defaults to ``python -m conformance``; an older checkout runs as ``env PYTHONPATH=OLD python -m
conformance``), writes its stderr to ``OUT_DIR/LABEL.log`` and prints one line: label, wall seconds, records,
judged (pass + fail), judged per second, exit status.  ``--cache-dir DIR`` sets FA4's compile cache
(``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``): a new empty directory is a cold run, the same one again a warm run.
The lines of every run of one session go to ``OUT_DIR/bench.jsonl`` too.  The results file is then compressed
into one gzip member, ``OUT_DIR/LABEL.jsonl.gz`` (a run appending to a ``.jsonl.gz`` writes a member per batch,
which compresses 2-3 times worse).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path


def _statuses(path: Path) -> Counter:
    counts: Counter = Counter()
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("type") == "result":
                counts[rec["status"]] += 1
    return counts


def main() -> int:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("label")
    p.add_argument("--attnconf", default=f"{shlex.quote(sys.executable)} -m conformance")
    p.add_argument("--cache-dir", help="FA4's compile cache directory (FLASH_ATTENTION_CUTE_DSL_CACHE_DIR)")
    args = p.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"{args.label}.jsonl"
    summary = args.out_dir / f"{args.label}.json"
    env = dict(os.environ)
    if args.cache_dir:
        Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
        env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] = args.cache_dir
    cmd = [
        *shlex.split(args.attnconf),
        "run",
        "--device",
        "cuda",
        "--out",
        str(out),
        "--json",
        str(summary),
        "--no-progress",
        *extra,
    ]
    t0 = time.perf_counter()
    with open(args.out_dir / f"{args.label}.log", "w", encoding="utf-8") as log:
        log.write("+ " + shlex.join(cmd) + "\n")
        log.flush()
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - t0
    counts = _statuses(out) if out.exists() else Counter()
    if out.exists():
        with open(out, "rb") as src, gzip.open(f"{out}.gz", "wb", compresslevel=9) as dst:
            dst.write(src.read())
        out.unlink()
    judged = counts["pass"] + counts["fail"]
    line = {
        "label": args.label,
        "wall_s": round(wall, 1),
        "records": sum(counts.values()),
        "judged": judged,
        "judged_per_s": round(judged / wall, 1) if wall else None,
        "statuses": dict(counts),
        "exit": rc,
        "argv": cmd,
    }
    with open(args.out_dir / "bench.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
    print(
        f"{args.label}: {wall:.1f} s, {line['records']} records, {judged} judged, "
        f"{line['judged_per_s']} judged/s, exit {rc}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
