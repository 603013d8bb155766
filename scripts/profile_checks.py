"""Where a worker's check time goes, function by function (issue 30 item 1's table, one level down): the worker's
own ``check`` op, in this process, under ``cProfile``, over a sample of a suite and some backends, in the order
the runner sends them (a case's backends one after the other, so the case context is built once).

    PYTHONPATH=. python scripts/profile_checks.py --suite default --every 10 --device cuda \
        --backend fa2 --backend sdpa-cuda --out profile-checks

Writes ``OUT.json`` (per backend: the worker's phase sums, seconds, and the record count per status) and
``OUT.txt`` (the 60 functions of largest own time and of largest cumulative time).  A sample's first case of each
backend pays imports and first-call costs, as a worker's does.  ``--skip-known`` leaves out the (case, backend)
pairs a shipped ledger entry of that backend matches by its case fields: a kernel fault there (FA4's illegal memory
accesses, ledgers/fa4.toml) poisons the CUDA context of this one process, and with it the rest of the profile.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from collections import Counter, defaultdict


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--suite", default="default")
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", action="append", default=[])
    p.add_argument("--out", default="profile-checks")
    p.add_argument("--skip-known", action="store_true", help="leave out pairs a ledger entry matches by case")
    args = p.parse_args()

    from conformance.suites.registry import get_suite
    from conformance.running.worker import _Worker

    cases = get_suite(args.suite)[args.offset :: args.every]
    worker = _Worker()
    known: dict[str, list] = {}
    if args.skip_known:
        from conformance.ledger.entries import load_ledger

        ledger = load_ledger()
        known = {spec: ledger.for_backend(spec) for spec in args.backend}
    skipped: Counter = Counter()
    phases: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    statuses: dict[str, Counter] = defaultdict(Counter)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for case in cases:
        case_json = case.to_json()
        for spec in args.backend:
            if any(entry.matches_case(case) for entry in known.get(spec, ())):
                skipped[spec] += 1
                continue
            reply = worker.check(
                {"case": case_json, "backend": spec, "device": args.device, "seed": 0, "available": True}
            )
            statuses[spec][reply["result"]["status"]] += 1
            for k, v in reply["phases"].items():
                phases[spec][k] += v
    prof.disable()
    wall = time.perf_counter() - t0
    out = {
        "suite": args.suite,
        "every": args.every,
        "cases": len(cases),
        "wall_s": wall,
        "phases": phases,
        "statuses": {k: dict(v) for k, v in statuses.items()},
        "skipped_known": dict(skipped),
    }
    with open(args.out + ".json", "w") as f:
        json.dump(out, f, indent=1)
    text = io.StringIO()
    for key in ("tottime", "cumulative"):
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats(key).print_stats(60)
    with open(args.out + ".txt", "w") as f:
        f.write(text.getvalue())
    print(json.dumps({k: {p: round(s, 2) for p, s in v.items()} for k, v in phases.items()}, indent=1))
    print(f"wall {wall:.1f} s over {len(cases)} cases")


if __name__ == "__main__":
    main()
