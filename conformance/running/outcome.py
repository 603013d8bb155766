"""What a sweep came to: counts and timings (:class:`RunSummary`), the problems sorted against the ledger, the
end-of-run listing a CI log can act on, the ``--json`` summary, and the exit status.

**Exit status** of ``attnconf run`` (:attr:`RunSummary.exit_code`, :class:`conformance.exits.Exit`), the first
that applies: 130 when interrupted (Ctrl-C); 1 when some problem (fail, error, crash, timeout) is unexpected, i.e.
no known-failure ledger entry (:mod:`conformance.ledger.entries`) explains it, and with ``strict``
(``--strict``) also on any known problem and on any unexpected pass (a steady ledger entry whose case passed: the
bug may be fixed); 4 (``NO_EVIDENCE``) when a selected backend judged no case (:meth:`RunSummary.unjudged`: every
pair of it ``unsupported``, e.g. a backend not installed on this machine, or no pair of it recorded), unless
``allow_unjudged`` (``--allow-unjudged``); else 0.  Pairs recorded by an earlier run of a resumed file count too,
so the status describes the whole sweep.  Without a ledger (``finish`` not called) every problem counts.  Records
are counted by :attr:`conformance.records.CheckResult.effective_status` (a ``pass`` with non-finite statistics is
a fail, and the listing says how many there were).
"""

from __future__ import annotations

import json
import shlex
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.exits import Exit
from conformance.records import CheckResult, judged_results, NONFINITE_PASS, Status

__all__ = ["LIST_MAX", "STATUS_MEANINGS", "RunSummary", "resume_command", "short_reason", "unjudged_backends"]

#: Unexpected problems (and unexpected passes) listed at the end of a run; the ``--json`` summary has all.
LIST_MAX = 50
SUMMARY_SCHEMA = 1
#: The output kind of the ``--json`` summary (:mod:`conformance.outputs`).
SUMMARY_KIND = "run-summary"

#: What a record's status means, as the end of a run explains its counts (:meth:`RunSummary.text`; the verdict's
#: side in docs/concepts/verdict.md).
STATUS_MEANINGS: dict[Status, str] = {
    Status.PASS: "judged: within the tolerance of the reference",
    Status.FAIL: "judged: outside the tolerance, or NaN or inf where the reference is finite",
    Status.UNSUPPORTED: "not run: the backend declares it cannot run the case; `attnconf backends` says why, "
    "and so does each record's reason",
    Status.ERROR: "the adapter or the kernel raised an exception",
    Status.CRASH: "the worker process died (a segfault, an illegal memory access, an abort)",
    Status.TIMEOUT: "the pair ran past --timeout and its worker was killed",
}


def short_reason(reason: str, limit: int = 300) -> str:
    """The first line of a reason, at most ``limit`` characters."""
    line = (reason or "").strip().splitlines()[0] if (reason or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def resume_command(argv: list[str] | tuple[str, ...]) -> str:
    """The command line that resumes the run ``argv`` (``attnconf run ...``): the same, plus ``--resume``."""
    argv = list(argv) or ["attnconf", "run"]
    return shlex.join(argv if "--resume" in argv else [*argv, "--resume"])


def _entry_json(entry: Any) -> dict[str, Any]:
    return {
        "backend": getattr(entry, "backend", ""),
        "source": getattr(entry, "source", ""),
        "reason": getattr(entry, "reason", ""),
    }


def _problem_json(r: CheckResult) -> dict[str, Any]:
    return {
        "case_id": r.case_id,
        "backend": r.backend,
        "status": r.status.value,
        "reason": short_reason(r.reason),
        "repro": r.repro,
    }


def unjudged_backends(results: Iterable[CheckResult], backends: dict[str, str]) -> list[tuple[str, str, int]]:
    """(backend, why, pairs) of every selected backend (``backends``: name -> why it is not available here, ''
    when it is; empty: the backends of ``results``) that judged no case: each of its pairs is ``unsupported``
    (why: its unavailability reason when it is not available here, else the most common refusal, with its count),
    or none of its pairs was recorded; with no backend and no record at all, one ``(none)`` entry.  A backend with
    a pass, a fail, an error, a crash or a timeout judged something (problems are the ledger's and exit 1's)."""
    by_backend: dict[str, list[CheckResult]] = {}
    for r in results:
        by_backend.setdefault(r.backend, []).append(r)
    names = list(backends) or list(by_backend)
    if not names:
        return [("(none)", "no (case, backend) pair was recorded", 0)]
    out = []
    for name in names:
        records = by_backend.get(name, [])
        if any(r.status is not Status.UNSUPPORTED for r in records):
            continue
        if backends.get(name):
            why = f"not available here: {short_reason(backends[name], 200)}"
        elif records:
            reason, n = Counter(short_reason(r.reason, 200) or "(no reason)" for r in records).most_common(1)[0]
            why = f"unsupported: {reason}" + (f" ({n} of {len(records)} pairs)" if n < len(records) else "")
        else:
            why = "no pair of it was recorded"
        out.append((name, why, len(records)))
    return out


@dataclass
class RunSummary:
    """Counts of one sweep; ``exit_code`` is the run command's exit status."""

    out: Path
    counts: Counter = field(default_factory=Counter)
    written: int = 0
    skipped: int = 0
    problems: int = 0
    worker_starts: int = 0
    harness_s: list[float] = field(default_factory=list)
    kernel_s: list[float] = field(default_factory=list)
    roundtrip_s: list[float] = field(default_factory=list)
    #: per worker reply: the parent's round trip minus the worker's own time (IPC, JSON, thread hand-offs)
    overhead_s: list[float] = field(default_factory=list)
    #: per worker reply: how long the worker waited for that request after its previous reply
    idle_s: list[float] = field(default_factory=list)
    #: per check reply: the worker's phases (``context_s`` only from the first backend of a case)
    phases_s: dict[str, list[float]] = field(default_factory=dict)
    #: the parent's time writing, fsync'ing and counting records (per batch of records that arrived together)
    parent_s: float = 0.0
    workers: int = 0
    wall_s: float = 0.0
    #: pairs whose CUDA OOM under a shared GPU was deferred and run again alone
    oom_retries: int = 0
    #: pairs whose inputs, reference or baseline met a broken CUDA context (a harness CUDA fault), run again alone
    harness_retries: int = 0
    #: the final record of every selected pair there is one of (a resumed file's earlier ones included)
    results: list[CheckResult] = field(default_factory=list)
    #: Ctrl-C ended the run: the records that arrived are in the file, the pairs in flight are not
    interrupted: bool = False
    #: set by :meth:`finish`: problems no ledger entry explains, (problem, entry) explained, (pass, entry)
    unexpected: list[CheckResult] | None = None
    known: list[tuple[CheckResult, Any]] = field(default_factory=list)
    unexpected_passes: list[tuple[CheckResult, Any]] = field(default_factory=list)
    #: passes of a case an entry matches at a version past the entry's range (the defect is fixed there)
    fixed: list[tuple[CheckResult, Any]] = field(default_factory=list)
    strict: bool = False
    #: the selected backends, by the name their records carry -> why the backend is not available here ('' when
    #: it is); empty: the backends of :attr:`results`
    backends: dict[str, str] = field(default_factory=dict)
    #: ``--allow-unjudged``: a backend that judged no case does not fail the run (it is still listed)
    allow_unjudged: bool = False
    #: records marked ``pass`` whose statistics are not finite, counted as fails
    #: (:attr:`conformance.records.CheckResult.effective_status`)
    nonfinite_passes: int = 0
    #: the compile phase's :class:`~conformance.running.compile_phase.CompileStats`, when it ran
    compile: Any = None
    #: ``--compile-only`` (``attnconf warmup``): no checks ran and no results file was written
    compile_only: bool = False
    #: where the time went (:class:`conformance.running.profile.Profile`; this run's records)
    profile: Any = None

    def keep_recorded(self, records: Iterable[CheckResult]) -> None:
        """Start from the records a resumed file already holds (counted by their effective status)."""
        self.results, self.nonfinite_passes = judged_results(records)
        self.problems = sum(r.status.is_problem for r in self.results)

    def add(self, record: CheckResult) -> CheckResult:
        """Count a record this run wrote, by its effective status; returns it as counted."""
        counted = record.judged()
        self.nonfinite_passes += counted is not record
        self.written += 1
        self.results.append(counted)
        self.counts[counted.status.value] += 1
        self.problems += counted.status.is_problem
        return counted

    def unjudged(self) -> list[tuple[str, str, int]]:
        """The selected backends that judged no case (:func:`unjudged_backends`)."""
        return unjudged_backends(self.results, self.backends)

    def finish(self, ledger: Any, strict: bool = False) -> None:
        """Sort the problems against ``ledger`` (a :class:`conformance.ledger.entries.Ledger`)."""
        verdict = ledger.classify(self.results)
        self.unexpected = list(verdict.unexpected)
        self.known = list(verdict.known)
        self.unexpected_passes = list(verdict.unexpected_passes)
        self.fixed = list(getattr(verdict, "fixed", ()))
        self.strict = strict

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return Exit.INTERRUPTED
        if self.compile_only:
            return Exit.OK  # a failed compile is the checks' to judge: the warmup did what it could
        if self.unexpected is None:
            if self.problems:
                return Exit.PROBLEMS
        elif self.unexpected or (self.strict and (self.known or self.unexpected_passes)):
            return Exit.PROBLEMS
        if not self.allow_unjudged and self.unjudged():
            return Exit.NO_EVIDENCE
        return Exit.OK

    def unexpected_problems(self) -> list[CheckResult]:
        """The problems no ledger entry explains (every problem before :meth:`finish`)."""
        if self.unexpected is not None:
            return self.unexpected
        return [r for r in self.results if r.status.is_problem]

    def known_by_entry(self) -> list[tuple[Any, list[CheckResult]]]:
        """The known problems grouped by the ledger entry that explains them, most first."""
        groups: dict[int, tuple[Any, list[CheckResult]]] = {}
        for result, entry in self.known:
            groups.setdefault(id(entry), (entry, []))[1].append(result)
        return sorted(groups.values(), key=lambda g: (-len(g[1]), getattr(g[0], "backend", "")))

    def text(self, timings: bool = False) -> str:
        """What ran: the compile phase's line (when it ran), the records written (and the worker starts when a worker
        was replaced), the statuses of every selected pair recorded (a resumed file's earlier records included), each
        status present but ``pass`` explained (:data:`STATUS_MEANINGS`); with ``timings`` (``--profile``) the
        medians per record and per worker phase."""
        compiled = self.compile.line() if self.compile is not None else ""
        if self.compile_only:
            return (compiled or "compile phase: nothing to compile (no selected backend JIT-compiles per case)") + (
                f"; no results file written; {self.wall_s:.1f} s in all"
            )
        counts = self.counts_all()
        lines = [compiled] if compiled else []
        lines.append(
            f"{self.written} records written to {self.out} ({self.skipped} already there) in {self.wall_s:.1f} s "
            f"by {self.workers} worker(s)"
            + (
                f"; worker starts: {self.worker_starts} (a crash, a timeout or a CUDA error replaces its worker)"
                if self.worker_starts > self.workers
                else ""
            )
            + (f"; CUDA OOM retried alone: {self.oom_retries}" if self.oom_retries else "")
            + (f"; retried alone after a broken CUDA context: {self.harness_retries}" if self.harness_retries else "")
        )
        lines.append(
            f"{len(self.results)} (case, backend) pair(s): "
            + ", ".join(f"{s.value} {counts.get(s.value, 0)}" for s in Status)
        )
        lines += [
            f"  {s.value} {counts[s.value]}: {STATUS_MEANINGS[s]}"
            for s in Status
            if s is not Status.PASS and counts.get(s.value)
        ]
        if timings:
            lines += self._timing_lines()
        return "\n".join(lines)

    def _timing_lines(self) -> list[str]:
        def med(xs: list[float]) -> str:
            return f"{statistics.median(xs) * 1e3:.2f} ms" if xs else "n/a"

        parent = f"{self.parent_s / self.written * 1e3:.2f} ms" if self.written else "n/a"
        legacy = ("context_s", "check_s", "encode_s")
        phases = ", ".join(f"{k.removesuffix('_s')} {med(v)}" for k, v in self.phases_s.items() if k in legacy)
        return [
            f"median per record: harness {med(self.harness_s)}, kernel {med(self.kernel_s)}, "
            f"parent round trip {med(self.roundtrip_s)}, overhead (round trip - worker time) "
            f"{med(self.overhead_s)}, worker idle before a request {med(self.idle_s)}; "
            f"parent bookkeeping {parent} per record",
            f"median worker phases: {phases or 'n/a'} (context: inputs + reference + baseline of a new case)",
        ]

    def terminal(self, timings: bool = False) -> str:
        """The end of ``attnconf run`` on stderr, for a CI log: the verdict line (:meth:`verdict_line`) first, then
        what ran (:meth:`text`; ``timings``, i.e. ``--profile``: the medians and where the time went,
        :mod:`conformance.running.profile`), then, when there is anything to list, the listing
        (:meth:`listing`), which ends with the verdict line again."""
        parts = [self.verdict_line(), self.text(timings)]
        if timings and self.profile is not None:
            parts.append(self.profile.text())
        listing = self.listing()
        if "\n" in listing:
            parts.append(listing)
        return "\n".join(parts)

    def listing(self) -> str:
        """The end of a run: every unexpected problem (status, backend, case, one-line reason, repro), the known
        ones counted per ledger entry, unexpected passes, and what the exit status is and why."""
        lines: list[str] = []
        unexpected = self.unexpected_problems()
        if unexpected:
            lines.append(f"UNEXPECTED: {len(unexpected)} problem(s) no ledger entry explains:")
            for r in unexpected[:LIST_MAX]:
                lines.append(f"  {r.status.value:<7} {r.backend}  {r.case_id}  {short_reason(r.reason, 200)}")
                if r.repro:
                    lines.append(f"          repro: {r.repro}")
            if len(unexpected) > LIST_MAX:
                lines.append(f"  ... and {len(unexpected) - LIST_MAX} more (all of them in the --json summary)")
        groups = self.known_by_entry()
        if groups:
            lines.append(f"known: {len(self.known)} problem(s) explained by {len(groups)} ledger entr(ies):")
            for entry, results in groups:
                statuses = Counter(r.status.value for r in results)
                shown = ", ".join(f"{s} {n}" for s, n in sorted(statuses.items()))
                lines.append(
                    f"  {len(results):>5}  {getattr(entry, 'backend', '')}  {getattr(entry, 'source', '')} ({shown}): "
                    f"{short_reason(getattr(entry, 'reason', ''), 160)}"
                )
        if self.unexpected_passes:
            lines.append(
                f"unexpected passes: {len(self.unexpected_passes)} case(s) a steady ledger entry expects to fail "
                "passed (fixed? the entry may be stale):"
            )
            for r, entry in self.unexpected_passes[:LIST_MAX]:
                lines.append(f"  {r.backend}  {r.case_id}  ({getattr(entry, 'source', '')})")
        if self.fixed:
            lines.append(
                f"fixed: {len(self.fixed)} pass(es) of cases a ledger entry describes, at versions past its range"
            )
        if self.nonfinite_passes:
            lines.append(f"{NONFINITE_PASS}: {self.nonfinite_passes} record(s), listed with the problems")
        if not self.interrupted:
            for name, why, pairs in self.unjudged():
                accepted = " (accepted: --allow-unjudged)" if self.allow_unjudged else ""
                lines.append(f"UNJUDGED: {name} judged none of its {pairs} pair(s): {why}{accepted}")
        lines.append(self.verdict_line())
        return "\n".join(lines)

    def verdict_line(self) -> str:
        code = self.exit_code
        if self.interrupted:
            return f"exit {code}: interrupted"
        unjudged = [name for name, _, _ in self.unjudged()]
        if code == Exit.NO_EVIDENCE:
            return (
                f"exit {code}: no evidence: {len(unjudged)} selected backend(s) judged no case ({', '.join(unjudged)})"
                "; --allow-unjudged accepts a selection that holds no case a backend supports"
            )
        if not unjudged:
            return self._problems_line(code)
        accepted = " (accepted with --allow-unjudged)" if self.allow_unjudged else ""
        return f"{self._problems_line(code)}; {len(unjudged)} backend(s) judged no case{accepted}"

    def _problems_line(self, code: int) -> str:
        if self.unexpected is None:
            return f"exit {code}: {self.problems} problem(s)" if self.problems else f"exit {code}: no problem"
        n_unexp = len(self.unexpected)
        known = f"{len(self.known)} known" + (
            f", {len(self.unexpected_passes)} unexpected pass(es)" if self.unexpected_passes else ""
        )
        if n_unexp:
            return f"exit {code}: {n_unexp} unexpected problem(s) ({known})"
        if code:
            return f"exit {code}: no unexpected problem, but --strict fails on {known}"
        tail = "; --strict would fail on them" if self.known or self.unexpected_passes else ""
        return f"exit {code}: no unexpected problem ({known}{tail})"

    def to_json(self, argv: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
        """The ``--json`` summary (schema in docs/concepts/running.md)."""
        unexpected = self.unexpected_problems()
        return {
            "schema": SUMMARY_SCHEMA,
            "command": "run",
            "argv": list(argv),
            "out": str(self.out),
            "exit_status": self.exit_code,
            "strict": self.strict,
            "interrupted": self.interrupted,
            "resume_command": resume_command(argv) if self.interrupted else None,
            "wall_s": round(self.wall_s, 3),
            "pairs": len(self.results),
            "written": self.written,
            "already_recorded": self.skipped,
            "counts": {s.value: self.counts_all().get(s.value, 0) for s in Status},
            "unexpected": [_problem_json(r) for r in unexpected],
            "known": [
                {**_entry_json(entry), "count": len(results), "cases": [[r.case_id, r.status.value] for r in results]}
                for entry, results in self.known_by_entry()
            ],
            "unexpected_passes": [
                {"case_id": r.case_id, "backend": r.backend, "entry": _entry_json(e)} for r, e in self.unexpected_passes
            ],
            "unjudged": [
                {"backend": name, "reason": why, "pairs": pairs}
                for name, why, pairs in ([] if self.interrupted or self.compile_only else self.unjudged())
            ],
            "allow_unjudged": self.allow_unjudged,
            "nonfinite_passes": self.nonfinite_passes,
            "compile_only": self.compile_only,
            "compile": self.compile.to_json() if self.compile is not None else None,
            "profile": self.profile.to_json() if self.profile is not None else None,
        }

    def counts_all(self) -> Counter:
        """Statuses of every selected pair with a record (this run's and a resumed file's earlier ones)."""
        return Counter(r.status.value for r in self.results)

    def write_json(self, path: Path, argv: list[str] | tuple[str, ...] = ()) -> None:
        """The ``--json`` summary, written as an attnconf output of kind :data:`SUMMARY_KIND`
        (:mod:`conformance.outputs`: atomic; an earlier summary replaced, any other file kept as a backup)."""
        from conformance.outputs import write_text

        data = {"attnconf_output": SUMMARY_KIND, **self.to_json(argv)}
        write_text(path, json.dumps(data, indent=1, allow_nan=True) + "\n", kind=SUMMARY_KIND, flag="--json")
