"""Drive mutmut 3.8 from the project root, for runs split between this machine and a many-core host.

``MODE=stats``: generate the mutants and collect mutmut's stats, then stop before its clean run.
``MODE=run``:   skip mutmut's clean run and run the mutants of the name globs in argv that have no result yet
                (read from ``mutants/**/*.meta``); ``--max-children N`` first sets the processes.
``MODE=merge``: take the results of another ``mutants/`` folder (argv[1], e.g. a host's returned one) for every
                mutant that has none here.
``MODE=list``:  print per module: mutants, tried, detected (killed or timed out, as ``nox -s mutation`` counts them),
                survived, and the survivors' names.

``docs/guides/mutation-testing.md`` gives the recipe and its figures.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import sys

MODE = os.environ.get("MODE", "run")
#: mutmut 3.8's exit codes that count as detected (killed, timed out, killed by a signal)
DETECTED = {1, 3, 36, -24, 24, 152, 255}


def metas():
    for path in sorted(glob.glob("mutants/**/*.meta", recursive=True)):
        with open(path) as f:
            yield path[len("mutants/") : -len(".meta")], json.load(f)["exit_code_by_key"]


def list_modules() -> None:
    tot = [0, 0, 0, 0]
    for mod, codes in metas():
        counts = (
            len(codes),
            sum(v is not None for v in codes.values()),
            sum(v in DETECTED for v in codes.values()),
            sum(v == 0 for v in codes.values()),
        )
        other = {v for v in codes.values() if v is not None and v not in DETECTED and v != 0}
        print(
            f"{mod:45s} {counts[0]:5d} tried {counts[1]:5d} detected {counts[2]:5d} survived {counts[3]:4d} "
            f"other {sorted(other)}"
        )
        for k, v in codes.items():
            if v == 0:
                print("   survivor", k)
        tot = [a + b for a, b in zip(tot, counts)]
    print("all", tot)


def merge(other: str) -> None:
    taken = 0
    for path in glob.glob(os.path.join(other, "mutants", "**", "*.meta"), recursive=True):
        here = os.path.join("mutants", os.path.relpath(path, os.path.join(other, "mutants")))
        if not os.path.exists(here):
            continue
        with open(path) as f:
            theirs = json.load(f)["exit_code_by_key"]
        with open(here) as f:
            meta = json.load(f)
        mine = meta["exit_code_by_key"]
        new = {k: v for k, v in theirs.items() if v is not None and k in mine and mine[k] is None}
        if new:
            mine.update(new)
            with open(here, "w") as f:
                json.dump(meta, f)
            taken += len(new)
    print("drive: merged", taken, "results")


def run(args: list[str]) -> None:
    from mutmut import __main__ as mutmut_main
    from mutmut.workers import isolation

    def no_clean_run(self, tests):
        if MODE == "stats":
            print("drive: stats done, stopping before the clean run", flush=True)
            os._exit(0)
        return 0

    for name in dir(isolation):
        cls = getattr(isolation, name)
        if isinstance(cls, type) and "run_clean_tests" in vars(cls):
            setattr(cls, "run_clean_tests", no_clean_run)  # noqa: B010 - a class attribute mutmut defines
    children = None
    if args and args[0] == "--max-children":
        children, args = int(args[1]), args[2:]
    if MODE == "run" and args:
        names = [
            k
            for _, codes in metas()
            for k, v in codes.items()
            if v is None and any(fnmatch.fnmatch(k, g) for g in args)
        ]
        print(f"drive: {len(names)} untried mutants of {args}", flush=True)
        if not names:
            return
        args = names
    mutmut_main._run(args, children)


if __name__ == "__main__":
    if MODE == "list":
        list_modules()
    elif MODE == "merge":
        merge(sys.argv[1])
    else:
        run(sys.argv[1:])
