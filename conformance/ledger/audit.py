"""Audit a ledger against results files: what each entry explains, what it wrongly claims, what nothing explains.

:func:`audit` reads every record of every file (fuzz campaigns' original, minimal and replay records alike) and
sorts them with :meth:`Ledger.classify`.  Per entry: the problems it explains, the passes it claims (a non-flaky
entry should claim none: its predicate is too wide or the bug is fixed), the passes of its flaky or partial cases,
the passes past its version range (fixed), and the problems of its cases in a status or with a message it does not
list (*unlisted*: not explained, counted among the unexplained and listed under the entry rather than in a group:
its cause may show that way, and the entry must be widened to it with evidence, or the problem is another cause).
An ``error`` record no entry explains whose case the backend's adapter now declares it cannot run
(:func:`conformance.verdict.check.declared_support` on the record's device: the composition's refusal, then the
adapter's) is *refused now*: the adapter passed a call the kernel
rejected, and the declared refusal it owed has been added since; such records are listed with that refusal, apart
from the unexplained (a ``fail``, ``crash`` or ``timeout`` is the kernel's answer and is never refused now).
A problem that is the *collateral* of an earlier fault of a known cause in the same run (:func:`collateral`: a
pair left unjudged by a lost device or a broken CUDA context, after a record of an entry that says its calls
``fault``) is explained by that entry and listed under it apart from the records it explains itself.
Per backend: the other problems no entry explains, grouped by a short signature (status, layout, the modes that
select kernel paths, whether some row sees no key, the checks that failed or the error's first words) so that
failures of one cause fall into one group.  Records are sorted by their effective status
(:attr:`conformance.records.CheckResult.effective_status`: a ``pass`` whose statistics are NaN or inf is a fail;
:attr:`Audit.nonfinite_passes` counts them).
"""

from __future__ import annotations

import functools
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.records import CheckResult, is_cuda_fault, is_lost_device, judged_results
from conformance.results_file import load_results, ResultsFileError
from conformance.ledger.entries import Ledger, LedgerEntry, builtin_suite_cases
from conformance.ledger.fields import case_view

if TYPE_CHECKING:
    from attnfast.base import Backend

__all__ = ["Audit", "EntryAudit", "Group", "audit", "collateral", "signature"]

#: Features that select a kernel path or a mode (batch-shape features such as decode or varlen are left out).
_MODES = (
    "causal",
    "window",
    "local_chunk",
    "softcap",
    "alibi",
    "sinks",
    "scale",
    "qv",
    "v_pad",
    "cp",
    "append",
    "splits",
    "empty_kv",
    "sq_gt_sk",
    "dv",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_kv_only",
    "int8_t1",
    "int8_t2",
    "sched_meta",
)


def signature(r: CheckResult) -> str:
    """``status | layout | modes | keyless rows | failed checks or the error's first words``."""
    view = case_view(r.case)
    parts = [r.status.value]
    if view is None:
        parts.append("no case")
    else:
        c = view.case
        if c.engine:
            parts.append(f"engine {c.engine}")
        parts.append(f"paged {c.kv_layout}" if c.paged else "contiguous")
        parts.append(" ".join(f for f in _MODES if f in view.features) or "plain")
        if view.value("rows_without_keys"):
            parts.append("keyless rows")
    if r.stats is not None and r.stats.failed_checks:
        parts.append("+".join(r.stats.failed_checks))
    elif r.reason:
        parts.append(_first_line(r.reason))
    return " | ".join(parts)


def _first_line(reason: str, width: int = 60) -> str:
    return re.sub(r"\s+", " ", (reason or "").split("\n")[0])[:width]


def _excerpt(reason: str | None, width: int = 200) -> str:
    """The reason's first ``width`` characters ('' for a record whose reason is null)."""
    return (reason or "")[:width]


@dataclass
class EntryAudit:
    entry: LedgerEntry
    explained: int = 0
    explained_cases: set[str] = field(default_factory=set)
    files: Counter = field(default_factory=Counter)
    #: passes of a case the (non-flaky) entry claims at a version in range: (file, record)
    passes_claimed: list[tuple[str, CheckResult]] = field(default_factory=list)
    flaky_passes: int = 0
    #: passes past the entry's version range: (file, record)
    fixed: list[tuple[str, CheckResult]] = field(default_factory=list)
    #: problems of a case it matches (version in range) in a status or with a message it does not list: (file, record)
    unlisted: list[tuple[str, CheckResult]] = field(default_factory=list)
    #: problems its faults left unjudged later in the same run (:func:`collateral`): (file, record, its fault's pair)
    collateral: list[tuple[str, CheckResult, str]] = field(default_factory=list)

    def unlisted_groups(self) -> list[tuple[str, str, list[tuple[str, CheckResult]]]]:
        """:attr:`unlisted` by status and the reason's first line (60 characters): (status, message, records),
        the largest group first."""
        groups: dict[tuple[str, str], list[tuple[str, CheckResult]]] = {}
        for f, r in self.unlisted:
            groups.setdefault((r.status.value, _first_line(r.reason)), []).append((f, r))
        return [(s, m, rs) for (s, m), rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]

    def to_json(self) -> dict[str, Any]:
        e = self.entry
        return {
            "source": e.source,
            "backend": e.backend,
            "reason": e.reason,
            "matches": e.pattern,
            "statuses": list(e.statuses),
            "messages": {status: list(m) for status, m in e.messages},
            "flaky": e.flaky,
            "partial": e.partial,
            "harness_fix": None if e.fixed is None else {"commit": e.fixed[0], "date": e.fixed[1].isoformat()},
            "explained": self.explained,
            "explained_cases": len(self.explained_cases),
            "files": dict(sorted(self.files.items())),
            "passes_claimed": [{"file": f, "case_id": r.case_id, "version": r.version} for f, r in self.passes_claimed],
            "flaky_passes": self.flaky_passes,
            "fixed": [{"file": f, "case_id": r.case_id, "version": r.version} for f, r in self.fixed],
            "unlisted": [
                {
                    "file": f,
                    "case_id": r.case_id,
                    "version": r.version,
                    "status": r.status.value,
                    "reason": _excerpt(r.reason),
                }
                for f, r in self.unlisted
            ],
            "collateral": [
                {"file": f, "case_id": r.case_id, "backend": r.backend, "reason": _excerpt(r.reason), "after": after}
                for f, r, after in self.collateral
            ],
        }


@dataclass
class Group:
    """Unexplained problems of one backend sharing a signature."""

    backend: str
    signature: str
    records: list[tuple[str, CheckResult]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        cases = sorted({r.case_id for _, r in self.records})
        return {
            "backend": self.backend,
            "signature": self.signature,
            "records": len(self.records),
            "cases": len(cases),
            "head_dims": sorted({int(r.case.get("head_dim", 0)) for _, r in self.records}),
            "examples": [{"file": f, "case_id": r.case_id, "reason": _excerpt(r.reason)} for f, r in self.records[:3]],
        }


@dataclass
class Audit:
    files: list[str]
    records: int = 0
    problems: int = 0
    explained: int = 0
    unexplained: list[Group] = field(default_factory=list)
    entries: list[EntryAudit] = field(default_factory=list)
    stale: list[LedgerEntry] = field(default_factory=list)
    #: problems explained although the record's version is not a PEP 440 version ('not installed')
    unknown_version: int = 0
    #: lines skipped per file (only with allow_skipped)
    skipped: dict[str, int] = field(default_factory=dict)
    #: records marked ``pass`` whose statistics are not finite, sorted as fails
    nonfinite_passes: int = 0
    #: duplicated (case, backend) records dropped per file (only with drop_duplicates)
    dropped_duplicates: dict[str, int] = field(default_factory=dict)
    #: what reading the files noted, ``PATH: note`` (a newer writer's schema, duplicates dropped)
    notes: list[str] = field(default_factory=list)
    #: unexplained ``error`` records whose case the adapter now refuses: (file, record, the declared refusal)
    refused_now: list[tuple[str, CheckResult, str]] = field(default_factory=list)

    @property
    def passes_claimed(self) -> int:
        return sum(len(e.passes_claimed) for e in self.entries)

    @property
    def unlisted_count(self) -> int:
        """Problems of an entry's cases in a status or with a message it does not list (among the unexplained)."""
        return sum(len(e.unlisted) for e in self.entries)

    @property
    def collateral_count(self) -> int:
        """Problems explained as the collateral of a known fault earlier in their run (among the explained)."""
        return sum(len(e.collateral) for e in self.entries)

    @property
    def unexplained_count(self) -> int:
        """Problems no entry explains: those of the groups and the :attr:`unlisted_count`."""
        return sum(len(g.records) for g in self.unexplained) + self.unlisted_count

    def to_json(self) -> dict[str, Any]:
        return {
            "files": self.files,
            "records": self.records,
            "problems": self.problems,
            "explained": self.explained,
            "unexplained": self.unexplained_count,
            "unlisted": self.unlisted_count,
            "collateral": self.collateral_count,
            "passes_claimed": self.passes_claimed,
            "explained_at_unknown_version": self.unknown_version,
            "skipped_lines": self.skipped,
            "nonfinite_passes": self.nonfinite_passes,
            "duplicates_dropped": self.dropped_duplicates,
            "notes": self.notes,
            "entries": [e.to_json() for e in self.entries],
            "stale": [e.source for e in self.stale],
            "unexplained_groups": [g.to_json() for g in self.unexplained],
            "refused_now": [
                {"file": f, "backend": r.backend, "case_id": r.case_id, "error": _excerpt(r.reason), "refusal": why}
                for f, r, why in self.refused_now
            ],
        }


def audit(
    ledger: Ledger,
    paths: list[Path | str],
    suites: bool = True,
    allow_skipped: bool = False,
    drop_duplicates: bool = False,
) -> Audit:
    """Sort every record of ``paths`` against ``ledger``.  A missing or unreadable file, one without a result
    record, (unless ``allow_skipped``: then counted in :attr:`Audit.skipped`) one with lines that are not
    records, or (unless ``drop_duplicates``: the last record kept, the others counted) one recording a (case,
    backend) pair twice raises ``ValueError`` naming it (an audit over no data proves nothing).  Fuzz campaigns
    repeat pairs by design and are read whole (:func:`conformance.results_file.record_key`).  ``suites``: an entry
    matching no record is stale unless it matches a case of the built-in suites (building them takes seconds)."""
    out = Audit(files=[str(p) for p in paths])
    per_entry = {id(e): EntryAudit(e) for e in ledger.entries}
    out.entries = list(per_entry.values())
    groups: dict[tuple[str, str], Group] = {}
    every: list[CheckResult] = []
    for path in paths:
        try:
            loaded = load_results(
                path,
                allow_skipped=allow_skipped,
                # no mutate: load_results reads need_header as a truth value, so None (mutmut's swap) is False too
                need_header=False,  # pragma: no mutate
                drop_duplicates=drop_duplicates,
            )
        except ResultsFileError as exc:
            raise ValueError(str(exc)) from None
        results, nonfinite = judged_results(loaded.results)
        # the time each record's run started (its header's): a harness defect's entry applies to runs before its fix
        starts = {
            id(r): loaded.headers[h].started if h >= 0 else None  # -1: a record before any header
            for r, h in zip(results, loaded.result_headers)
        }
        out.nonfinite_passes += nonfinite
        if loaded.skipped:
            out.skipped[str(path)] = len(loaded.skipped)
        if loaded.dropped_duplicates:
            out.dropped_duplicates[str(path)] = loaded.dropped_duplicates
        out.notes.extend(f"{path}: {note}" for note in loaded.notes())
        every.extend(results)
        name = str(path)
        out.records += len(results)
        verdict = ledger.classify(results, started=lambda r: starts.get(id(r)))
        for r, e in verdict.known:
            a = per_entry[id(e)]
            a.explained += 1
            a.explained_cases.add(f"{r.backend} {r.case_id}")
            a.files[name] += 1
            if e.version_side(r.version) == "unknown":
                out.unknown_version += 1
        for r, e in verdict.unexpected_passes:
            per_entry[id(e)].passes_claimed.append((name, r))
        for r, e in verdict.fixed:
            per_entry[id(e)].fixed.append((name, r))
        caused = collateral(verdict.known, verdict.unexpected)
        for r in verdict.unexpected:
            if id(r) in caused:
                entry, after = caused[id(r)]
                per_entry[id(entry)].collateral.append((name, r, after))
        set_aside = set(caused)  # collateral, then refused now: neither unlisted nor in a group
        for r in verdict.unexpected:
            if id(r) not in caused and (why := refused_now(r)) is not None:
                set_aside.add(id(r))
                out.refused_now.append((name, r, why))
        for r, e in verdict.unlisted:
            if id(r) not in set_aside:
                per_entry[id(e)].unlisted.append((name, r))
        unlisted = {id(r) for r, _ in verdict.unlisted}
        for r in verdict.unexpected:
            if id(r) in unlisted or id(r) in set_aside:
                continue
            key = (r.backend, signature(r))
            groups.setdefault(key, Group(*key)).records.append((name, r))
        for r in results:
            if r.status.value == "pass":
                flaky = [
                    e for e in ledger.for_backend(r.backend) if e.fixed is None and not e.claims_passes and e.matches(r)
                ]
                for e in flaky[:1]:
                    per_entry[id(e)].flaky_passes += 1
        out.problems += len(verdict.known) + len(verdict.unexpected)
        out.explained += len(verdict.known) + len(caused)
    out.unexplained = sorted(groups.values(), key=lambda g: (g.backend, -len(g.records), g.signature))
    out.stale = ledger.classify(every, suite_case_ids=builtin_suite_cases if suites else None).stale
    return out


def _at(record: CheckResult) -> float | None:
    """Seconds into its run at which the parent received ``record`` (``extra.t.at``), when it says."""
    t = record.extra.get("t")
    at = t.get("at") if isinstance(t, dict) else None
    return float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None


def collateral(
    known: list[tuple[CheckResult, LedgerEntry]], unexpected: list[CheckResult]
) -> dict[int, tuple[LedgerEntry, str]]:
    """The problems of one run (``known`` with their entries, ``unexpected``) that a known fault left unjudged:
    ``id(record)`` -> (the entry with ``faults`` whose record came first, that record's "case backend").

    A *fault* is a known record of an entry that says its calls break what runs after them
    (:attr:`~conformance.ledger.entries.LedgerEntry.faults`).  An unexpected record is its collateral when it is

    - a lost device (:func:`~conformance.records.is_lost_device`: the backend was gone from its worker, the pair
      not judged) received after a fault on the same GPU (``extra.gpu``; the latest such fault is named); or
    - a CUDA error (:func:`~conformance.records.is_cuda_fault`, OOMs aside: in the case's own inputs or reference,
      or in the kernel's step, where a sticky error an earlier call left behind is reported by the next call) whose
      worker's previous pair was a fault: the pair the record names (``extra.context_broken_after``), or, in records
      older than that field, the latest problem of the same worker slot and GPU before it in the file, when that
      problem is a fault.

    Records without their time in the run (``extra.t.at``) are never collateral: their order is not known."""
    faults: dict[int, tuple[float, CheckResult, LedgerEntry]] = {}
    for r, e in known:
        at = _at(r)
        if e.faults and at is not None:
            faults[id(r)] = (at, r, e)
    out: dict[int, tuple[LedgerEntry, str]] = {}
    if not faults:
        return out
    problems = [(at, r) for r in [*(r for r, _ in known), *unexpected] if (at := _at(r)) is not None]

    def pair(r: CheckResult) -> str:  # as the runner names a pair in ``extra.context_broken_after``
        return f"{r.case_id} {r.backend}"

    named = {pair(r): e for _, r, e in faults.values()}
    for r in unexpected:
        at = _at(r)
        if at is None:
            continue
        gpu = r.extra.get("gpu")
        if is_lost_device(r):
            before = [(a, f, e) for a, f, e in faults.values() if a < at and f.extra.get("gpu") == gpu]
            if before:
                _, f, e = max(before, key=lambda x: x[0])
                out[id(r)] = (e, pair(f))
        elif is_cuda_fault(r):
            after = r.extra.get("context_broken_after")
            if isinstance(after, str):
                if after in named:
                    out[id(r)] = (named[after], after)
                continue
            worker = r.extra.get("worker")
            earlier = [
                (a, p) for a, p in problems if a < at and p.extra.get("worker") == worker and p.extra.get("gpu") == gpu
            ]
            if worker is not None and earlier:
                _, last = max(earlier, key=lambda x: x[0])
                if id(last) in faults:
                    out[id(r)] = (faults[id(last)][2], pair(last))
    return out


def refused_now(record: CheckResult) -> str | None:
    """The refusal the record's backend now declares for its case, when the record is an ``error`` (else None; None
    too when the backend is not registered here or the case JSON is not a valid case: nothing to consult)."""
    if record.status.value != "error" or not record.case:
        return None
    from conformance.cases.case import AttentionCase
    from conformance.verdict.check import declared_support

    try:
        backend = _backend(record.backend)
        case = AttentionCase.from_json(record.case)
    except (KeyError, ValueError, TypeError):
        return None
    support = declared_support(case, backend, record.device or "cuda")
    return None if support else support.reason


@functools.cache
def _backend(name: str) -> Backend:
    from attnfast.registry import get_backend

    return get_backend(name)


def by_backend(groups: list[Group]) -> dict[str, list[Group]]:
    out: dict[str, list[Group]] = defaultdict(list)
    for g in groups:
        out[g.backend].append(g)
    return out
