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

import glob
import json
import os
import sys

from mutmut_results import MUTMUT_DETECTED, exit_codes, untried_mutants  # beside this script

MODE = os.environ.get("MODE", "run")


def metas():
    for path in sorted(glob.glob("mutants/**/*.meta", recursive=True)):
        yield path[len("mutants/") : -len(".meta")], exit_codes(path)


def list_modules() -> None:
    tot = [0, 0, 0, 0]
    for mod, codes in metas():
        counts = (
            len(codes),
            sum(v is not None for v in codes.values()),
            sum(v in MUTMUT_DETECTED for v in codes.values()),
            sum(v == 0 for v in codes.values()),
        )
        other = {v for v in codes.values() if v is not None and v not in MUTMUT_DETECTED and v != 0}
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
        theirs = exit_codes(path)
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
        todo = untried_mutants(args)  # mutmut reruns every mutant it is given by name, results or not
        print(f"drive: {0 if todo is None else len(todo)} untried mutants of {args}", flush=True)
        if todo is None:
            return
        args = todo
    mutmut_main._run(args, children)


if __name__ == "__main__":
    if MODE == "list":
        list_modules()
    elif MODE == "merge":
        merge(sys.argv[1])
    else:
        run(sys.argv[1:])
