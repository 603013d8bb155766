"""What ``attnconf compare`` checks before it compares: two results files it may compare, or a refusal.

A comparison that says "no regression" must have compared everything it was asked to, so
:func:`check_inputs` raises :class:`CompareRefused` (one line: the file and the reason; ``attnconf compare``
exits 2) when:

* a file is missing, unreadable (not UTF-8 text, a broken gzip stream), empty, has no header line or no
  result record (:func:`conformance.results_file.load_results`);
* a file has lines that are not records (a truncated last line, garbage) and ``allow_skipped`` is off; with
  it they are counted and the summary says how many;
* a file records one (case, backend) pair twice (two runs wrote it at once) and ``drop_duplicates`` is off; with
  it the last record of each pair is kept and the summary counts the others;
* a file mixes runs (headers) of different suites or tolerances;
* the two runs are of different suites (``Header.sweep["suite"]``; ``custom`` for ``--case-json`` runs);
* they were judged under different tolerances: the resolved overrides ``Header.sweep["tol"]``, or for a header
  written before ``sweep`` existed, its ``env.run.tol`` parsed (``--tol`` flags); a ``--tol-file`` whose
  contents an old header does not record matches only the same file name and flags;
* NEW lacks (case, family) pairs OLD has (a shorter selection, a killed or missing shard) and
  ``allow_subset`` is off; the refusal names the first few and the count.  With it, the summary counts the
  pairs not compared;
* no (case, family) pair is in both files.

Different backend versions, devices or machines are what compare is for and are never refused.  With
``only_new_families`` only the backend families NEW's headers list (what it was asked to run) are compared;
OLD's other families are counted as outside the comparison, and every OLD pair of NEW's families must still
be in NEW.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.records import CheckResult, Header
from conformance.results_file import load_results, ResultsFile, ResultsFileError

__all__ = ["CompareRefused", "Inputs", "check_inputs", "family", "suite_of", "tolerance_of"]

Key = tuple[str, str]
LISTED = 5  # missing pairs named in a refusal (the count is exact)


class CompareRefused(ValueError):
    """The files cannot be compared; ``str()`` is one line naming the file and the reason."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


@dataclass
class Inputs:
    """Two files that may be compared, and what the comparison leaves out (accepted explicitly)."""

    old: ResultsFile
    new: ResultsFile
    old_results: list[CheckResult]
    new_results: list[CheckResult]
    #: OLD (case, family) pairs NEW lacks (only with ``allow_subset``)
    not_in_new: list[Key] = field(default_factory=list)
    #: OLD families outside NEW's backends -> OLD records (only with ``only_new_families``)
    outside_scope: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: what reading the files noted (:meth:`conformance.results_file.ResultsFile.notes`: a newer writer's schema,
    #: duplicates dropped), ``PATH: note``
    file_notes: list[str] = field(default_factory=list)


def family(r: CheckResult) -> str:
    return r.family or r.backend


def suite_of(h: Header) -> str:
    """The suite a header's run selected from; ``custom`` for ``--case-json`` cases."""
    if h.sweep and "suite" in h.sweep:
        return h.sweep["suite"] or "custom"
    return h.suite or "custom"


def _floats(value: Any) -> Any:
    """Numbers as floats (a TOML ``factor = 3`` and a ``--tol factor=3`` are one tolerance)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_floats(v) for v in value]
    return value


def tolerance_of(h: Header) -> tuple[str, str]:
    """(identity, description) of the tolerance a header's run was judged by; equal identities = same
    tolerance.  The identity is the resolved override layers when known, else the flags as typed."""
    if h.sweep and "tol" in h.sweep:
        layers = _floats(h.sweep["tol"])
        typed = h.sweep.get("tol_args") or {}
    else:
        run = h.run_options
        if "tol" not in run and "tol_file" not in run:
            return "unrecorded", "no tolerance recorded in the header (env.run.tol)"
        typed = {"tol": list(run.get("tol") or []), "tol_file": run.get("tol_file")}
        layers = None
        if not typed["tol_file"]:
            from conformance.verdict.tolerance import parse_override

            try:
                layers = _floats([parse_override(t) for t in typed["tol"]])
            except ValueError:
                layers = None
        if layers is None:
            flags = _flags(typed)
            # no mutate: any prefix keeps the kinds of identity apart; ``typed`` is built with its keys in one order
            ident = "typed:" + json.dumps(typed, sort_keys=True)  # pragma: no mutate
            return ident, f"{flags} (file contents not recorded)"
    text = json.dumps(layers, sort_keys=True)
    shown = text if len(text) <= 160 else text[:157] + "..."
    flags = _flags(typed)
    # no mutate: any prefix keeps the kinds of identity apart ("unrecorded", "typed:", "layers:")
    ident = "layers:" + text  # pragma: no mutate
    return ident, ("the defaults" if not layers else f"overrides {shown}") + (f" ({flags})" if flags else "")


def _flags(typed: dict[str, Any]) -> str:
    parts = [f"--tol {t}" for t in typed.get("tol") or []]
    if typed.get("tol_file"):
        parts.append(f"--tol-file {typed['tol_file']}")
    return " ".join(parts)


def _one(f: ResultsFile, what: str, of) -> tuple[str, str]:
    """The single value ``of`` gives every header of ``f`` (as (identity, description)); refused when mixed."""
    seen: dict[str, tuple[int, str]] = {}
    for i, h in enumerate(f.headers, 1):
        ident, desc = of(h)
        seen.setdefault(ident, (i, desc))
    if len(seen) > 1:
        (i, a), (j, b) = list(seen.values())[:2]
        raise CompareRefused(
            f.path, f"mixes runs of different {what}: header {i} has {a}, header {j} has {b}; compare one run"
        )
    ((ident, (_, desc)),) = seen.items()
    return ident, desc


def _load(path: Path | str, allow_skipped: bool, drop_duplicates: bool) -> ResultsFile:
    try:
        f = load_results(path, allow_skipped=True, drop_duplicates=drop_duplicates)
    except ResultsFileError as exc:
        raise CompareRefused(exc.path, exc.reason) from None
    if f.skipped and not allow_skipped:
        raise CompareRefused(f.path, f"{f.skipped_summary()}; pass --allow-skipped to compare the rest")
    return f


def _seed(h: Header) -> Any:
    if h.sweep and "seed" in h.sweep:
        return h.sweep["seed"]
    return h.run_options.get("seed")


def _families_asked(f: ResultsFile) -> set[str]:
    """The families NEW's headers name (what it was asked to run), and those it recorded."""
    asked = {info.get("family") or name for h in f.headers for name, info in h.backends.items()}
    return asked | {family(r) for r in f.results}


def check_inputs(
    old_path: Path | str,
    new_path: Path | str,
    *,
    allow_skipped: bool = False,
    allow_subset: bool = False,
    only_new_families: bool = False,
    drop_duplicates: bool = False,
) -> Inputs:
    """Load both files and check that they may be compared (module docstring); :class:`CompareRefused`
    otherwise."""
    old, new = _load(old_path, allow_skipped, drop_duplicates), _load(new_path, allow_skipped, drop_duplicates)
    old_suite, _ = _one(old, "suites", lambda h: (suite_of(h), suite_of(h)))
    new_suite, _ = _one(new, "suites", lambda h: (suite_of(h), suite_of(h)))
    if old_suite != new_suite:
        raise CompareRefused(
            new.path,
            f"a run of suite {new_suite}, but {old.path} is of suite {old_suite}; compare runs of one suite",
        )
    old_tol, old_desc = _one(old, "tolerances", tolerance_of)
    new_tol, new_desc = _one(new, "tolerances", tolerance_of)
    if old_tol != new_tol or old_tol == "unrecorded":
        raise CompareRefused(
            new.path,
            f"judged with tolerance {new_desc}, but {old.path} with {old_desc}; verdicts under different (or "
            "unknown) tolerances are not comparable",
        )
    inputs = Inputs(old, new, list(old.results), list(new.results))
    inputs.file_notes = [f"{f.path}: {note}" for f in (old, new) for note in f.notes()]
    if only_new_families:
        scope = _families_asked(new)
        for r in old.results:
            if family(r) not in scope:
                inputs.outside_scope[family(r)] = inputs.outside_scope.get(family(r), 0) + 1
        inputs.old_results = [r for r in old.results if family(r) in scope]
    old_keys = {(r.case_id, family(r)) for r in inputs.old_results}
    new_keys = {(r.case_id, family(r)) for r in inputs.new_results}
    missing = sorted(old_keys - new_keys)
    if not old_keys & new_keys:
        raise CompareRefused(
            new.path,
            f"no (case, family) pair in common with {old.path} ({len(old_keys)} pairs there, {len(new_keys)} here)"
            "; nothing to compare",
        )
    if missing and not allow_subset:
        named = ", ".join(f"{c} x {b}" for c, b in missing[:LISTED])
        more = f" (+{len(missing) - LISTED} more)" if len(missing) > LISTED else ""
        raise CompareRefused(
            new.path,
            f"lacks {len(missing)} of the {len(old_keys)} (case, family) pairs of {old.path}: {named}{more}; "
            "run them, or pass --allow-subset to compare the rest",
        )
    inputs.not_in_new = missing
    seeds_old = {_seed(h) for h in old.headers}
    seeds_new = {_seed(h) for h in new.headers}
    if seeds_old != seeds_new:
        inputs.notes.append(
            f"Seeds differ (old {sorted(map(str, seeds_old))}, new {sorted(map(str, seeds_new))}): the inputs "
            "differ, so error figures are not comparable one to one."
        )
    return inputs
