"""What a fuzz campaign is asked to do and what it reports: :class:`Budget` (``--budget``), :class:`FuzzConfig`
(everything ``attnconf fuzz`` was given, and the header's ``env["fuzz"]`` a resumed campaign must match) and
:class:`FuzzSummary` (counters, the file's records, the failure groups, the text ``attnconf fuzz`` prints).
The campaign itself is :mod:`conformance.fuzz.campaign`.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.fuzz.draw import DrawLimits
from conformance.fuzz.group import FuzzGroup, fuzz_role
from conformance.records import CheckResult, NONFINITE_PASS, Status
from conformance.running.runner import RunConfig, UsageError

__all__ = ["Budget", "FuzzConfig", "FuzzSummary", "parse_budget"]


@dataclass(frozen=True)
class Budget:
    """How long a campaign draws: ``cases`` (cases run) or ``seconds`` (wall time of this invocation)."""

    cases: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.cases is None) == (self.seconds is None):
            raise ValueError("budget must set exactly one of cases and seconds")
        if self.cases is not None and self.cases < 1:
            raise ValueError(f"budget cases must be >= 1, got {self.cases}")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"budget seconds must be > 0, got {self.seconds}")

    def text(self) -> str:
        return f"{self.cases} cases" if self.cases is not None else f"{self.seconds:g} s"


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h)$")


def parse_budget(text: str) -> Budget:
    """``--budget``: a number of cases in [1, 10**18) (``200``) or a finite duration > 0 (``90s``, ``10m``,
    ``1.5h``)."""
    t = text.strip().lower()
    if t.isascii() and t.isdigit() and len(t) <= 18 and int(t) > 0:
        return Budget(cases=int(t))
    m = _DURATION.match(t)
    if m and 0 < (seconds := float(m.group(1)) * {"s": 1, "m": 60, "h": 3600}[m.group(2)]) < math.inf:
        return Budget(seconds=seconds)
    raise UsageError(
        f"--budget must be a number of cases in [1, 10**18) (200) or a finite duration > 0 (90s, 10m, 1h), "
        f"got {text[:40]!r}"
    )


@dataclass(frozen=True)
class FuzzConfig:
    """Everything ``attnconf fuzz`` was asked to do."""

    backends: tuple[str, ...]
    device: str = "cpu"
    budget: Budget = Budget(cases=100)
    seed: int = 0
    out: Path = Path("fuzz.jsonl")
    resume: bool = False
    timeout: float = 300.0
    max_shrink_steps: int = 200
    limits: DrawLimits = DrawLimits()
    tol: tuple[str, ...] = ()
    tol_file: str | None = None
    db: Path | None = None
    progress: bool = True
    argv: tuple[str, ...] = ()
    #: ``--allow-unjudged``: a backend that judged no drawn case does not make the exit status 4
    allow_unjudged: bool = False
    #: ``--allow-skipped``: ``resume`` keeps lines of the file that are not records instead of refusing it
    allow_skipped: bool = False

    def run_config(self) -> RunConfig:
        """The ``run`` configuration the shared record helpers read (repro commands, tolerance overrides)."""
        return RunConfig(
            backends=self.backends,
            device=self.device,
            out=self.out,
            resume=self.resume,
            timeout=self.timeout,
            seed=self.seed,
            tol=self.tol,
            tol_file=self.tol_file,
            progress=self.progress,
            argv=self.argv,
        )

    def fuzz_info(self) -> dict[str, Any]:
        """The header's ``env["fuzz"]``: what a resumed campaign must match to continue the same stream."""
        return {
            "seed": self.seed,
            "max_tokens": self.limits.max_tokens,
            "max_heads": self.limits.max_heads,
            "budget": self.budget.text(),
            "max_shrink_steps": self.max_shrink_steps,
            "db": str(self.db) if self.db else None,
        }


@dataclass
class FuzzSummary:
    """What a campaign did.  ``records`` are all result records of the file (earlier invocations too)."""

    out: Path
    draws: int = 0
    rejected: Counter = field(default_factory=Counter)
    refused_draws: int = 0
    refused: Counter = field(default_factory=Counter)
    cases_run: int = 0
    written: int = 0
    failures: int = 0
    shrinks: int = 0
    shrink_evaluations: int = 0
    replays: int = 0
    elapsed_s: float = 0.0
    worker_starts: int = 0
    #: the file's records, by effective status (:attr:`conformance.records.CheckResult.effective_status`)
    records: list[CheckResult] = field(default_factory=list)
    groups: list[FuzzGroup] = field(default_factory=list)
    #: records marked ``pass`` whose statistics are not finite, counted as fails
    nonfinite_passes: int = 0
    #: the campaign's backends by record name -> why it cannot run here ('' when it may)
    backends: dict[str, str] = field(default_factory=dict)
    allow_unjudged: bool = False
    #: why the campaign stopped drawing before its budget was spent ('' when it did not)
    stopped: str = ""

    def unjudged(self) -> list[tuple[str, str, int]]:
        """The campaign's backends that judged no drawn case (:func:`conformance.running.outcome.unjudged_backends`
        over the original and replayed records)."""
        from conformance.running.outcome import unjudged_backends

        judged = [r for r in self.records if fuzz_role(r).get("role") in ("original", "replay")]
        return unjudged_backends(judged, self.backends)

    @property
    def problems(self) -> list[CheckResult]:
        """Original and replayed records with a problem status (minimal records restate them)."""
        return [r for r in self.records if r.status.is_problem and fuzz_role(r).get("role") in ("original", "replay")]

    @property
    def exit_code(self) -> int:
        """1 when a drawn or replayed case had a problem; 4 when a backend judged no case (unless
        ``allow_unjudged``); else 0."""
        if self.problems:
            return 1
        return 4 if self.unjudged() and not self.allow_unjudged else 0

    def text(self) -> str:
        counts = Counter(r.status.value for r in self.records if fuzz_role(r).get("role") == "original")
        skipped = sum(sum(info.get("skipped", {}).values()) for info in _per_index(self.records).values())
        lines = [
            f"fuzz: {self.cases_run} cases run from {self.draws} draws in {self.elapsed_s:.1f} s "
            f"({sum(self.rejected.values())} rejected by the case model, {self.refused_draws} refused by every "
            f"backend's declarations; {skipped} such draws in the whole file); {self.written} records "
            f"written to {self.out}; worker starts: {self.worker_starts}",
            "originals: " + ", ".join(f"{s.value} {counts.get(s.value, 0)}" for s in Status),
            f"shrinks: {self.shrinks} ({self.shrink_evaluations} evaluations); replays from --db: {self.replays}",
        ]
        if self.nonfinite_passes:
            lines.append(f"{NONFINITE_PASS}: {self.nonfinite_passes} record(s)")
        if self.stopped:
            lines.append(f"stopped drawing before the budget was spent: {self.stopped}")
        for name, why, pairs in self.unjudged():
            accepted = " (accepted: --allow-unjudged)" if self.allow_unjudged else ""
            lines.append(f"UNJUDGED: {name} judged none of its {pairs} drawn case(s): {why}{accepted}")
        if self.refused:
            top = ", ".join(f"{reason} {n}" for reason, n in self.refused.most_common(6))
            lines.append(f"refusals of those draws, by feature (one per backend): {top}")
        if self.groups:
            lines.append(f"{len(self.problems)} failures in {len(self.groups)} groups:")
            for g in self.groups:
                lines.append("  " + g.text())
                lines.append("    repro: " + g.representative.repro)
        else:
            lines.append("no failures")
        return "\n".join(lines)


def _per_index(records: list[CheckResult]) -> dict[int, dict[str, Any]]:
    """The ``extra["fuzz"]`` of one original record per drawn index (every backend's record repeats it)."""
    return {int(info["index"]): info for info in map(fuzz_role, records) if info.get("role") == "original"}
