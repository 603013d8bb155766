"""Known failures: one TOML ledger per backend, each entry with its evidence.

``conformance/ledgers/<backend>.toml`` (or the files of another directory, ``--ledger-dir``)::

    # why this backend fails what it fails
    [[failure]]
    pattern = "*_win*-0_*"            # fnmatch glob on the case id, or a list of globs (any matches)
    reason = "window right bound taken as sk, not 0 (FA2 bug)"
    evidence = ["https://github.com/Dao-AILab/flash-attention/issues/895", "reports/h200-fa2.jsonl"]
    statuses = ["fail"]               # optional, default ["fail"]; any of fail/error/crash/timeout
    flaky = false                     # optional: true when the bug does not show on every run

A result is *known* when an entry of its backend matches its case id and lists its status; a
problem no entry explains is *unexpected*.  An entry matching a case that passed is an
*unexpected pass* (the bug may be fixed: the entry should go) unless the entry says ``flaky = true`` (a
bug seen on some runs and not others: its passes prove nothing), and an entry matching no case of a
backend that ran, nor any case of the built-in suites, is *stale* (its pattern no longer names
anything).  An entry whose cases this run simply did not include (another suite, ``--case``) is
neither.  The array-api-tests xfail files work the same way.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance._toml import TOMLDecodeError, load_toml_file
from conformance.records import CheckResult, Status

__all__ = ["DEFAULT_DIR", "Ledger", "LedgerEntry", "LedgerVerdict", "load_ledger"]

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "ledgers"
_KEYS = {"pattern", "reason", "evidence", "statuses", "flaky"}
_PROBLEMS = [s.value for s in Status if s.is_problem]


@dataclass(frozen=True)
class LedgerEntry:
    """One known failure of one backend."""

    backend: str
    #: every glob of the entry: a case id matching any of them matches
    patterns: tuple[str, ...]
    reason: str
    evidence: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ("fail",)
    source: str = ""
    #: the failure does not show on every run: a pass of a matching case is not an unexpected pass
    flaky: bool = False

    @property
    def pattern(self) -> str:
        """The glob, or the globs joined by " | " (for reports)."""
        return " | ".join(self.patterns)

    def matches_id(self, case_id: str) -> bool:
        """Whether any of the entry's globs matches ``case_id``."""
        return any(fnmatch.fnmatchcase(case_id, p) for p in self.patterns)

    def matches(self, result: CheckResult) -> bool:
        """Same backend, and a glob matches the case id."""
        return result.backend == self.backend and self.matches_id(result.case_id)

    def explains(self, result: CheckResult) -> bool:
        """Matches, and the result's status is one this entry expects."""
        return self.matches(result) and result.status.value in self.statuses


@dataclass
class LedgerVerdict:
    """A run's results sorted against the ledger."""

    known: list[tuple[CheckResult, LedgerEntry]] = field(default_factory=list)
    unexpected: list[CheckResult] = field(default_factory=list)
    unexpected_passes: list[tuple[CheckResult, LedgerEntry]] = field(default_factory=list)
    stale: list[LedgerEntry] = field(default_factory=list)


@dataclass
class Ledger:
    """Every entry of every ledger file read."""

    entries: list[LedgerEntry] = field(default_factory=list)

    def for_backend(self, backend: str) -> list[LedgerEntry]:
        return [e for e in self.entries if e.backend == backend]

    def explain(self, result: CheckResult) -> LedgerEntry | None:
        """The first entry that explains a problem result, else None."""
        if not result.status.is_problem:
            return None
        return next((e for e in self.for_backend(result.backend) if e.explains(result)), None)

    def classify(
        self, results: Iterable[CheckResult], suite_case_ids: Callable[[], Iterable[str]] | None = None
    ) -> LedgerVerdict:
        """Known and unexpected problems, unexpected passes, stale entries (of backends that ran).

        ``suite_case_ids`` returns every case id the harness can generate (called only when some
        entry matched no result): an entry matching one of them is not stale, only not exercised.
        Without it, every entry that matched no result of its backend is stale.
        """
        verdict = LedgerVerdict()
        used: set[int] = set()
        ran: set[str] = set()
        for r in results:
            ran.add(r.backend)
            matching = [(i, e) for i, e in enumerate(self.entries) if e.matches(r)]
            used.update(i for i, _ in matching)
            if r.status.is_problem:
                entry = next((e for _, e in matching if e.explains(r)), None)
                if entry is None:
                    verdict.unexpected.append(r)
                else:
                    verdict.known.append((r, entry))
            elif r.status is Status.PASS:
                steady = next((e for _, e in matching if not e.flaky), None)
                if steady is not None:
                    verdict.unexpected_passes.append((r, steady))
        unused = [e for i, e in enumerate(self.entries) if i not in used and e.backend in ran]
        if unused and suite_case_ids is not None:
            ids = list(suite_case_ids())
            unused = [e for e in unused if not any(e.matches_id(c) for c in ids)]
        verdict.stale = unused
        return verdict


def _entry(backend: str, raw: Any, source: str) -> LedgerEntry:
    if not isinstance(raw, dict):
        # ValueError rather than TypeError: a malformed file is a value problem, like every other one here.
        raise ValueError(f"{source}: each [[failure]] must be a table, got {raw!r}")  # noqa: TRY004
    unknown = set(raw) - _KEYS
    if unknown:
        raise ValueError(f"{source}: unknown keys {sorted(unknown)} (allowed: {sorted(_KEYS)})")
    if not isinstance(raw.get("reason"), str) or not raw["reason"].strip():
        raise ValueError(f"{source}: every entry needs a non-empty string 'reason'")
    pattern = raw.get("pattern")
    patterns = (pattern,) if isinstance(pattern, str) else tuple(pattern) if isinstance(pattern, list) else ()
    if not patterns or not all(isinstance(p, str) and p.strip() for p in patterns):
        raise ValueError(f"{source}: every entry needs 'pattern': a non-empty glob string or a list of them")
    evidence = raw.get("evidence", ())
    evidence = (evidence,) if isinstance(evidence, str) else tuple(str(e) for e in evidence)
    statuses = raw.get("statuses", ["fail"])
    statuses = (statuses,) if isinstance(statuses, str) else tuple(statuses)
    bad = [s for s in statuses if s not in _PROBLEMS]
    if bad or not statuses:
        raise ValueError(f"{source}: statuses must be a non-empty subset of {_PROBLEMS}, got {list(statuses)}")
    flaky = raw.get("flaky", False)
    if not isinstance(flaky, bool):
        raise ValueError(f"{source}: 'flaky' must be true or false, got {flaky!r}")
    return LedgerEntry(backend, patterns, raw["reason"], evidence, statuses, source, flaky)


def load_ledger(directory: Path | str | None = None) -> Ledger:
    """Every ``<backend>.toml`` in ``directory`` (default: the package's ``ledgers/``).

    A missing directory is an empty ledger; a malformed file raises ``ValueError`` naming it.
    """
    directory = DEFAULT_DIR if directory is None else Path(directory)
    ledger = Ledger()
    if not directory.is_dir():
        return ledger
    for path in sorted(directory.glob("*.toml")):
        try:
            data = load_toml_file(path)
        except TOMLDecodeError as exc:
            raise ValueError(f"{path}: {exc}") from None
        unknown = set(data) - {"failure"}
        if unknown:
            raise ValueError(f"{path}: top-level keys must be [[failure]] entries, got {sorted(unknown)}")
        ledger.entries.extend(
            _entry(path.stem, raw, f"{path.parent.name}/{path.name}[{i}]")
            for i, raw in enumerate(data.get("failure", []))
        )
    return ledger
