"""Host time of a case's inputs (``make_inputs`` on the CPU), this checkout against a git revision, in one run
(issue 30: inputs were 42 % of a GPU worker's busy time).

    PYTHONPATH=. python scripts/bench_inputs.py --suite peer-fa2-kvcache --every 50 --suite default --every 50 \
        --baseline main --rounds 5 --profile

The parent picks every ``--every``-th case of each ``--suite`` (as ``scripts/count_ops.py`` does) and writes them
as JSON; the baseline is ``git archive REV attnref conformance`` unpacked in a temporary folder.  Each round runs
one child process per tree, alternating (baseline, this checkout, baseline, ...) so a shared machine's load falls
on both alike; a child draws every case once, after a warm-up (one case of each kind: first calls, lazy imports),
and reports its milliseconds.  Printed per suite
and tree: ms per case (mean over cases of each case's median over rounds), the median round total, and whether
both trees drew the same bytes (a SHA-256 of every tensor of every case, which must match).  ``--profile`` adds one
``cProfile`` child per tree: own and cumulative time per function, ms per case.  ``--out FILE`` writes it all as
JSON.  A child runs with ``--threads`` torch threads (default 1: ``attnconf run`` gives each worker
its share of the cores in ``OMP_NUM_THREADS``, one with 15 workers on 16 cores).  ``--child`` is the children's
entry point.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any


def _digest(inputs: Any, h: Any) -> None:
    import dataclasses

    import torch

    holders = [inputs] + ([inputs.quant] if inputs.quant is not None else [])
    for holder in holders:
        for f in dataclasses.fields(holder):
            t = getattr(holder, f.name)
            if isinstance(t, torch.Tensor):
                h.update(f"{f.name}:{t.dtype}:{tuple(t.shape)}".encode())
                h.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())


def child(cases_file: str, profile: bool) -> None:
    """Time ``make_inputs`` over the cases in ``cases_file`` (one JSON list per suite); print one JSON line."""
    import cProfile
    import hashlib
    import pstats

    from conformance.cases.case import AttentionCase
    from conformance.cases.inputs import make_inputs

    with open(cases_file) as f:
        suites = {name: [AttentionCase.from_json(c) for c in cs] for name, cs in json.load(f).items()}
    out: dict[str, Any] = {}
    for name, cases in suites.items():
        kinds = {}  # warm-up: first calls and lazy imports, once per kind of case (a worker pays them once)
        for case in cases:
            kinds.setdefault((case.paged, case.kv_layout, case.quant, case.qv, case.append, case.data), case)
        for case in kinds.values():
            make_inputs(case, seed=1)
        ms, h = [], hashlib.sha256()
        prof = cProfile.Profile() if profile else None
        for case in cases:
            if prof is not None:
                prof.enable()
            t0 = time.perf_counter()
            inputs = make_inputs(case)
            ms.append((time.perf_counter() - t0) * 1e3)
            if prof is not None:
                prof.disable()
            _digest(inputs, h)
        entry: dict[str, Any] = {"ms": ms, "sha256": h.hexdigest()}
        if prof is not None:
            stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
            rows = []
            for (file, line, fn), (_cc, _nc, tt, ct, _callers) in stats.items():
                ours = "conformance" in file or "attnref" in file
                where = (
                    fn if file == "~" else f"{os.path.relpath(file) if ours else os.path.basename(file)}:{line}({fn})"
                )
                rows.append((where, tt * 1e3 / len(cases), ct * 1e3 / len(cases)))
            entry["profile"] = rows
        out[name] = entry
    print(json.dumps(out))


def _run_child(tree: str, cases_file: str, profile: bool, threads: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", cases_file] + (["--profile"] if profile else [])
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(rows: list[tuple[str, float, float]], key: int, top: int) -> str:
    rows = sorted(rows, key=lambda r: -r[key])[:top]
    return "\n".join(f"  {own:8.2f} {cum:8.2f}  {where}" for where, own, cum in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", action="append", default=[])
    p.add_argument("--every", action="append", type=int, default=[], help="every Nth case (one per --suite)")
    p.add_argument("--baseline", default=None, help="a git revision to compare with (default: none)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch threads of a child (a worker's share: 1 of 16 cores)")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.profile)
        return
    suites = args.suite or ["peer-fa2-kvcache", "default"]
    every = args.every or [50] * len(suites)
    if len(every) != len(suites):
        p.error("give one --every per --suite")
    from conformance.suites.registry import get_suite

    here = os.getcwd()
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-inputs-"))
        cases_file = os.path.join(tmp, "cases.json")
        with open(cases_file, "w") as f:
            json.dump({s: [c.to_json() for c in get_suite(s)[::n]] for s, n in zip(suites, every)}, f)
        trees = {"this": here}
        if args.baseline:
            base = os.path.join(tmp, "base")
            os.mkdir(base)
            archive = subprocess.run(
                ["git", "archive", args.baseline, "attnref", "conformance"], cwd=here, capture_output=True, check=True
            ).stdout
            subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
            trees = {f"{args.baseline}": base, "this": here}
        runs: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
        for r in range(args.rounds):
            for name, tree in trees.items():
                runs[name].append(_run_child(tree, cases_file, False, args.threads))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        profiles = {}
        if args.profile:
            profiles = {name: _run_child(tree, cases_file, True, args.threads) for name, tree in trees.items()}
    result: dict[str, Any] = {"suites": {}}
    for s, n in zip(suites, every):
        entry: dict[str, Any] = {"every": n}
        for name in trees:
            per_case = list(zip(*(run[s]["ms"] for run in runs[name])))
            medians = [statistics.median(x) for x in per_case]
            totals = [sum(run[s]["ms"]) for run in runs[name]]
            entry[name] = {
                "cases": len(medians),
                "ms_per_case": sum(medians) / len(medians),
                "median_round_ms_per_case": statistics.median(totals) / len(medians),
                "sha256": sorted({run[s]["sha256"] for run in runs[name]}),
            }
            if profiles:
                entry[name]["profile"] = profiles[name][s]["profile"]
        result["suites"][s] = entry
        shas = {sha for name in trees for sha in entry[name]["sha256"]}
        print(f"\n{s} (every {n}th case, {entry['this']['cases']} cases): same bytes in every run: {len(shas) == 1}")
        for name in trees:
            e = entry[name]
            mid = e["median_round_ms_per_case"]
            print(f"  {name:>10}: {e['ms_per_case']:7.2f} ms per case (median round {mid:.2f})")
        for name in trees if profiles else ():
            print(f"  profile {name}, ms per case (own, cumulative), by own time:")
            print(_table(entry[name]["profile"], 1, args.top))
            print(f"  profile {name}, by cumulative time:")
            print(_table(entry[name]["profile"], 2, args.top))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
