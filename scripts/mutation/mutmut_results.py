"""mutmut 3.8's per-mutant results (``mutants/**/*.meta``): what counts as detected, each module's score, the mutants
not tried yet.  Read by ``noxfile.py``'s ``mutation`` session and by ``scripts/mutation/drive.py`` and ``recheck.py``
(which run on device hosts without nox), so it imports nothing but the standard library."""

from __future__ import annotations

import os

__all__ = ["MUTMUT_DETECTED", "MUTMUT_SKIPPED", "exit_codes", "module_score", "module_scores", "untried_mutants"]

#: mutmut 3.8's exit codes (``mutmut.stats.status_by_exit_code``) of a detected mutant (killed: a test failed or
#: pytest broke; timeout: its tests ran past mutmut's limit) and of a skipped one; every other code, ``None`` (not
#: tried) included, is a mutant not detected
MUTMUT_DETECTED = frozenset({1, 3, 36, -24, 24, 152, 255})
MUTMUT_SKIPPED = frozenset({34})


def exit_codes(meta: str) -> dict[str, int | None]:
    """Mutant name -> mutmut's exit code (``None``: not tried yet) from one of mutmut's ``.meta`` files.
    ``OSError`` when it cannot be read, ``ValueError`` when it is not mutmut's per-mutant results."""
    import json

    try:
        with open(meta, encoding="utf-8") as f:
            codes = json.load(f)["exit_code_by_key"]
        if not isinstance(codes, dict):
            raise TypeError(f"exit_code_by_key is a {type(codes).__name__}")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{meta}: not mutmut's per-mutant results ({exc!r})") from exc
    return codes


def module_score(module: str) -> tuple[int, int, list[str]]:
    """(detected, counted, names of the mutants not detected) of one module, from the per-mutant results mutmut
    keeps in ``mutants/<module>.meta``, counted as :func:`mutation_score` counts the whole run.  ``ValueError``
    when the file is missing (mutmut made no mutants of it: a broken run) or not mutmut's JSON."""
    meta = os.path.join("mutants", module + ".meta")
    try:
        codes = exit_codes(meta)
    except OSError as exc:
        raise ValueError(f"{meta}: no results for module {module} ({exc.strerror or exc})") from exc
    counted = {k: v for k, v in codes.items() if v not in MUTMUT_SKIPPED}
    missed = sorted(k for k, v in counted.items() if v not in MUTMUT_DETECTED)
    return len(counted) - len(missed), len(counted), missed


def module_scores(modules: list[str]) -> dict[str, tuple[int, int, list[str]]]:
    """:func:`module_score` of each module."""
    return {m: module_score(m) for m in modules}


def untried_mutants(args: list[str]) -> list[str] | None:
    """``mutmut run``'s arguments for ``nox -s mutation -- ARGS``: each mutant-name glob (``*``, ``?`` or ``[``)
    replaced by the names of its mutants that have no result yet in ``mutants/**/*.meta``; other arguments kept.
    mutmut 3.8 reruns every mutant its command line names, results or not (``__main__.py``: "Rerun mutant if it's
    explicitly mentioned"), so a glob given again to go on with an interrupted run would start it over.  Before the
    first run (no ``.meta`` file) the globs are kept; ``None`` when every glob given has nothing left to try.
    :func:`exit_codes`' errors for a ``.meta`` file it cannot read."""
    import fnmatch
    import glob

    globs = [a for a in args if not a.startswith("-") and any(c in a for c in "*?[")]
    metas = glob.glob(os.path.join("mutants", "**", "*.meta"), recursive=True)
    if not globs or not metas:
        return list(args)
    untried: list[str] = []
    for meta in metas:
        untried += [k for k, v in exit_codes(meta).items() if v is None]
    out: list[str] = []
    for a in args:
        out += sorted(k for k in untried if fnmatch.fnmatchcase(k, a)) if a in globs else [a]
    return out if len(out) > len(args) - len(globs) else None
