"""Known failures: one TOML ledger per backend, each entry a predicate of its cause with its evidence.

``conformance/ledgers/<backend>.toml`` (or the files of another directory, ``--ledger-dir``)::

    # why this backend fails what it fails
    [[failure]]
    reason = "non-TMA paged loader, d80/d96 without a mask: wrong output"
    evidence = ["reports/<run>.jsonl.gz: ...", "https://github.com/<owner>/<repo>/issues/<n>"]
    statuses = ["fail"]               # optional, default ["fail"]; any of fail/error/crash/timeout
    messages = { error = "illegal memory access" }  # optional: per status, a text (or list: any) the reason holds
    versions = ">=4.0.0b36"           # optional: PEP 440 specifiers the record's version must meet
    flaky = false                     # optional: true when the bug does not show on every run
    partial = "why"                   # optional: the bug shows on some cases of the predicate only (say why)
    faults = "how"                    # optional: how the cause's calls break the calls after them (the audit)
    fixed = { commit = "703452a", date = "2026-11-24T17:38:07+00:00" }  # optional: a defect of this harness
    [failure.when]                    # the cause, as conditions on the case (predicate.py)
    head_dim = [80, 96]
    fa4_sm90_paged_loader = "non_tma"
    no_features = ["causal", "window"]

Several ``[[failure.when]]`` tables are OR'd.  ``pattern`` (an fnmatch glob on the case id, or a list of them)
is still read, but only with ``glob_reason = "..."`` saying why no predicate can say it; an entry needs a
``when`` or a ``pattern``.  Field names are checked when the file loads (``attnconf ledger fields``).

A result is *known* when an entry of its backend matches its case, its version is in the entry's ``versions`` and
the entry lists its status (with one of its ``messages`` for that status in the reason, where it gives any); a problem
no entry explains is *unexpected*.  A harness error (a reason starting ``harness error``) is never a kernel's.  A
problem of a case an entry matches at a version in range, in a status or with a message the entry does not list, is
unexpected too (its cause may show that way, but nobody has shown it: widen the entry, with evidence), and
:attr:`LedgerVerdict.unlisted` names the entry.  A pass of a case an entry matches at a version in range is an
*unexpected pass* (the bug may be fixed: narrow ``versions`` or drop the entry) unless the entry says ``flaky =
true`` or ``partial = "..."`` (the predicate is the envelope of the cause: every failure inside it is of that cause,
but not every case inside it fails); a pass at a version past the range (an upper bound excludes it) is *fixed*
("fixed in <version>"); a failure at a version outside the range is unexpected (the entry does not claim it).  A
record whose version is not a PEP 440 version (older runs wrote 'not installed' for vLLM's fork) is judged on its
case alone.  An entry matching no case of a backend that ran, nor any case of the built-in suites, is *stale*; an
entry whose cases this run simply did not include is neither.  ``faults``: the audit explains by the entry the pairs
its faults left unjudged (:func:`conformance.ledger.audit.collateral`).  ``fixed``: a defect of this harness (the
adapter's call, the verdict), explaining problems (harness errors too) of runs begun before its fix only, no pass.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet

from conformance._toml import TOMLDecodeError, load_toml_file
from conformance.cases.case import AttentionCase
from conformance.exits import UsageError
from conformance.records import HARNESS_ERROR, CheckResult, Status
from conformance.ledger.fields import CaseView, case_view
from conformance.ledger.predicate import Predicate, parse_predicate, parse_version, parse_versions
from conformance.ledger.predicate import version_side as _version_side

__all__ = [
    "DEFAULT_DIR",
    "Ledger",
    "LedgerDirError",
    "LedgerEntry",
    "LedgerVerdict",
    "builtin_suite_cases",
    "load_ledger",
    "load_ledger_dir",
]

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "ledgers"
_KEYS = frozenset(  # the keys of a [[failure]] table
    "pattern glob_reason when versions reason evidence statuses messages flaky partial faults fixed".split()
)
_PROBLEMS = [s.value for s in Status if s.is_problem]


@dataclass(frozen=True)
class LedgerEntry:
    """One known failure of one backend."""

    backend: str
    #: every glob of the entry: a case id matching any of them matches (empty for a predicate-only entry)
    patterns: tuple[str, ...]
    reason: str
    evidence: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ("fail",)
    source: str = ""
    #: the failure does not show on every run: a pass of a matching case is not an unexpected pass
    flaky: bool = False
    #: the cause as conditions on the case (None: globs only)
    predicate: Predicate | None = None
    #: the kernel versions the entry applies to (None: every version)
    versions: SpecifierSet | None = None
    #: why the entry needs id globs
    glob_reason: str = ""
    #: the bug shows on some cases of the predicate only (the rule inside it unknown): why; passes prove nothing
    partial: str = ""
    #: per listed status, the messages one of which the record's reason must contain (a status absent: any reason)
    messages: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: how the cause's calls break what runs after them (a sticky CUDA error, memory written outside the call's
    #: tensors, a device that refuses new processes after faults back to back), with the evidence; empty: they do not
    faults: str = ""
    #: a defect of this harness, not the kernel's: (the commit that fixed it, when, an aware datetime); None: a kernel's
    fixed: tuple[str, datetime] | None = None

    @property
    def claims_passes(self) -> bool:
        """Whether a pass of a matching case contradicts the entry (neither flaky nor partial nor a fixed defect of
        the harness)."""
        return not (self.flaky or self.partial or self.fixed)

    def before_fix(self, started: str | None) -> bool:
        """Whether the entry applies to a run that started at ``started`` (a results-file header's ISO time): always
        for a kernel's cause; for a harness defect (``fixed``), only a run that started before its fix (a time that
        is missing, unreadable or without its zone: no, so a record of unknown age is never excused)."""
        if self.fixed is None:
            return True
        when = _aware(started)
        return when is not None and when < self.fixed[1]

    @property
    def pattern(self) -> str:
        """What the entry matches, in one line (for reports): the predicate, the globs, the version range."""
        parts = [self.predicate.text()] if self.predicate is not None else []
        parts += list(self.patterns)
        text = " | ".join(parts)
        return f"{text} [versions {self.versions}]" if self.versions is not None else text

    def matches_id(self, case_id: str) -> bool:
        """Whether any of the entry's globs matches ``case_id`` (a predicate needs the case: :meth:`matches_case`)."""
        return any(fnmatch.fnmatchcase(case_id, p) for p in self.patterns)

    def matches_view(self, view: CaseView | None, case_id: str) -> bool:
        if self.matches_id(case_id):
            return True
        return self.predicate is not None and view is not None and self.predicate.holds(view)

    def matches_case(self, case: AttentionCase) -> bool:
        """Whether the entry's predicate or one of its globs matches ``case`` (any version)."""
        return self.matches_view(case_view(case), case.id)

    def version_side(self, version: str) -> str:
        """``in``, ``after`` (newer than the range), ``before``, or ``unknown`` (not a PEP 440 version)."""
        if self.versions is None:
            return "in"
        parsed = parse_version(version)
        return "unknown" if parsed is None else _version_side(self.versions, parsed)

    def matches_record_case(self, result: CheckResult) -> bool:
        """Same backend, and the record's case matches (whatever its version)."""
        return result.backend == self.backend and self.matches_view(case_view(result.case), result.case_id)

    def matches(self, result: CheckResult) -> bool:
        """Same backend, the case matches, and the record's version is in range (or unknown)."""
        return self.matches_record_case(result) and self.version_side(result.version) in ("in", "unknown")

    def lists(self, result: CheckResult) -> bool:
        """Whether the entry expects ``result``'s status and message, whatever its case: the status is listed, the
        reason contains one of the entry's messages for it (when the entry gives any), and it is no harness error."""
        status, reason = result.status.value, result.reason or ""
        if status not in self.statuses or (reason.startswith(HARNESS_ERROR) and self.fixed is None):
            return False
        wanted = dict(self.messages).get(status)
        return wanted is None or any(m in reason for m in wanted)

    def explains(self, result: CheckResult, started: str | None = None) -> bool:
        """Matches, the result's status and message are ones this entry expects (:meth:`lists`), and its run (which
        ``started`` then; None: unknown) is one the entry applies to (:meth:`before_fix`)."""
        return self.before_fix(started) and self.matches(result) and self.lists(result)


@dataclass
class LedgerVerdict:
    """A run's results sorted against the ledger."""

    known: list[tuple[CheckResult, LedgerEntry]] = field(default_factory=list)
    unexpected: list[CheckResult] = field(default_factory=list)
    #: passes of a case a non-flaky entry claims at a version in range: the bug may be fixed
    unexpected_passes: list[tuple[CheckResult, LedgerEntry]] = field(default_factory=list)
    stale: list[LedgerEntry] = field(default_factory=list)
    #: passes of a case an entry matches, at a version past its range: fixed in ``result.version``
    fixed: list[tuple[CheckResult, LedgerEntry]] = field(default_factory=list)
    #: problems (also in ``unexpected``) of a case an entry matches at a version in range, in a status or with a
    #: message that entry does not list, harness errors left out: (record, the first such entry)
    unlisted: list[tuple[CheckResult, LedgerEntry]] = field(default_factory=list)


def builtin_suite_cases() -> Iterator[AttentionCase]:
    """Every case of the harness's own built-in suites, a suite at a time in :data:`~conformance.suites.registry.SUITES`
    order (a case of two suites comes twice), so a caller that stops once it has found what it looks for never builds
    the rest.  The ``peer-*`` suites (:mod:`conformance.suites.peers`: minutes to build) are left
    out: they restate the kernels' own test grids, and a ledger entry names a cause the harness's own suites exercise
    (a failure first seen in a peer grid gets a case of its own in :mod:`conformance.suites.found`), which the tests
    check for every committed entry."""
    from conformance.suites.peers import PEERS
    from conformance.suites.registry import SUITES

    for name, build in SUITES.items():
        if name not in PEERS:
            yield from build()


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
        self,
        results: Iterable[CheckResult],
        suite_case_ids: Callable[[], Iterable[str | AttentionCase]] | None = None,
        started: Callable[[CheckResult], str | None] | None = None,
    ) -> LedgerVerdict:
        """Known and unexpected problems (those of an entry's case in a status or with a message it does not list
        named in ``unlisted``), unexpected passes, fixed defects, stale entries (of backends that ran).

        ``suite_case_ids`` returns every case the harness can generate, as ids or cases (called only when some
        entry matched no result, and read only until each such entry has matched one; :func:`builtin_suite_cases`
        gives the cases): an entry matching one of them is not stale, only not exercised.  Globs are tested on ids,
        predicates on cases.  Without it, every entry that matched no result of its backend is stale.  ``started``
        gives the time the record's run started (its results file's header): a harness defect's entry (``fixed``)
        applies only to runs before its fix, and to none without it.
        """
        verdict = LedgerVerdict()
        used: set[int] = set()
        ran: set[str] = set()
        by_backend: dict[str, list[tuple[int, LedgerEntry]]] = {}
        for i, e in enumerate(self.entries):
            by_backend.setdefault(e.backend, []).append((i, e))
        for r in results:
            ran.add(r.backend)
            entries = by_backend.get(r.backend, ())
            view = case_view(r.case) if entries else None  # cached per case JSON: cheap for glob-only entries too
            matching: list[tuple[LedgerEntry, str]] = []
            for i, e in entries:
                if e.matches_view(view, r.case_id):
                    used.add(i)
                    if e.before_fix(started(r) if started is not None else None):
                        matching.append((e, e.version_side(r.version)))
            in_range = [e for e, side in matching if side in ("in", "unknown")]
            if r.status.is_problem:
                entry = next((e for e in in_range if e.lists(r)), None)
                if entry is None:
                    verdict.unexpected.append(r)
                    if in_range and not str(r.reason).startswith(HARNESS_ERROR):  # a None reason reads "None"
                        verdict.unlisted.append((r, in_range[0]))
                else:
                    verdict.known.append((r, entry))
            elif r.status is Status.PASS:
                steady = next((e for e in in_range if e.claims_passes), None)
                if steady is not None:
                    verdict.unexpected_passes.append((r, steady))
                else:
                    gone = next((e for e, side in matching if side == "after" and e.claims_passes), None)
                    if gone is not None:
                        verdict.fixed.append((r, gone))
        unused = [e for i, e in enumerate(self.entries) if i not in used and e.backend in ran]
        if unused and suite_case_ids is not None:
            for item in suite_case_ids():  # streamed: stops once every entry has matched a case
                case_id = item if isinstance(item, str) else item.id
                view = case_view(item) if isinstance(item, AttentionCase) else None
                unused = [
                    e
                    for e in unused
                    if not e.matches_id(case_id)
                    and not (e.predicate is not None and view is not None and e.predicate.holds(view))
                ]
                if not unused:
                    break
        verdict.stale = unused
        return verdict


def _strings(where: str, key: str, raw: Any) -> tuple[str, ...]:
    values = (raw,) if isinstance(raw, str) else tuple(raw) if isinstance(raw, list) else ()
    if not values or not all(isinstance(v, str) and v.strip() for v in values):
        raise ValueError(f"{where}: '{key}' must be a non-empty string or a list of them, got {raw!r}")
    return values


def _messages(where: str, raw: Any, statuses: tuple[str, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    if not isinstance(raw, dict) or not raw:
        raise ValueError(
            f"{where}: 'messages' must be a table of status = message (or a list of them), such as "
            f'messages = {{ error = "illegal memory access" }}, got {raw!r}'
        )
    unlisted = [s for s in raw if s not in statuses]
    if unlisted:
        raise ValueError(f"{where}: messages for {unlisted}, a status the entry does not list ({list(statuses)})")
    return tuple((status, _strings(where, f"messages.{status}", value)) for status, value in raw.items())


def _aware(text: Any) -> datetime | None:
    """``text`` as an ISO 8601 time with its zone, else None (not a string, not such a time, no zone)."""
    try:
        when = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo is not None else None


def _fixed(where: str, raw: Any) -> tuple[str, datetime]:
    table = raw if isinstance(raw, dict) else {}
    commit, when = table.get("commit"), _aware(table.get("date"))
    named = isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{7,40}", commit)
    if set(table) != {"commit", "date"} or not named or when is None:
        raise ValueError(f'{where}: \'fixed\' must be {{ commit = "<hex>", date = "<ISO time, zone>" }}, got {raw!r}')
    return str(commit), when


def _entry(backend: str, raw: Any, source: str, where: str) -> LedgerEntry:
    if not isinstance(raw, dict):
        # ValueError rather than TypeError: a malformed file is a value problem, like every other one here.
        raise ValueError(f"{where}: each [[failure]] must be a table, got {raw!r}")  # noqa: TRY004
    unknown = set(raw) - _KEYS
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (allowed: {sorted(_KEYS)})")
    if not isinstance(raw.get("reason"), str) or not raw["reason"].strip():
        raise ValueError(f"{where}: every entry needs a non-empty string 'reason'")
    if "pattern" not in raw and "when" not in raw:
        raise ValueError(f"{where}: every entry needs 'when' (a predicate of its cause) or 'pattern' (id globs)")
    patterns = _strings(where, "pattern", raw["pattern"]) if "pattern" in raw else ()
    glob_reason = raw.get("glob_reason", "")
    if patterns and (not isinstance(glob_reason, str) or not glob_reason.strip()):
        raise ValueError(
            f"{where}: 'pattern' needs glob_reason = \"...\" saying why no predicate ('when') can describe the cause"
        )
    if glob_reason and not patterns:
        raise ValueError(f"{where}: 'glob_reason' without 'pattern'")
    predicate = parse_predicate(where, raw["when"]) if "when" in raw else None
    versions = parse_versions(where, raw["versions"]) if "versions" in raw else None
    evidence = raw.get("evidence", ())
    evidence = (evidence,) if isinstance(evidence, str) else tuple(str(e) for e in evidence)
    statuses = raw.get("statuses", ["fail"])
    statuses = (statuses,) if isinstance(statuses, str) else tuple(statuses)
    bad = [s for s in statuses if s not in _PROBLEMS]
    if bad or not statuses:
        raise ValueError(f"{where}: statuses must be a non-empty subset of {_PROBLEMS}, got {list(statuses)}")
    flaky = raw.get("flaky", False)
    if not isinstance(flaky, bool):
        raise ValueError(f"{where}: 'flaky' must be true or false, got {flaky!r}")
    partial = raw.get("partial", "")
    if "partial" in raw and (not isinstance(partial, str) or not partial.strip()):
        raise ValueError(f"{where}: 'partial' must say why passes inside the predicate prove nothing, got {partial!r}")
    if partial and predicate is None:
        raise ValueError(f"{where}: 'partial' needs 'when' (the envelope of the cause)")
    messages = _messages(where, raw["messages"], statuses) if "messages" in raw else ()
    faults = raw.get("faults", "")
    if "faults" in raw and (not isinstance(faults, str) or not faults.strip()):
        raise ValueError(f"{where}: 'faults' must say how the cause's calls break later ones, got {faults!r}")
    fixed = _fixed(where, raw["fixed"]) if "fixed" in raw else None
    return LedgerEntry(
        backend,
        patterns,
        raw["reason"],
        evidence,
        statuses,
        source,
        flaky,
        predicate,
        versions,
        glob_reason,
        partial,
        messages,
        faults,
        fixed,
    )


def load_ledger(directory: Path | str | None = None) -> Ledger:
    """Every ``<backend>.toml`` in ``directory`` (default: the package's ``ledgers/``).

    A missing directory is an empty ledger; a malformed file raises ``ValueError`` naming the file, the entry
    and the key or field at fault.
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
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text (byte offset {exc.start})") from None
        except OSError as exc:  # a directory named *.toml, a file it may not read
            raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
        unknown = set(data) - {"failure"}
        if unknown:
            raise ValueError(f"{path}: top-level keys must be [[failure]] entries, got {sorted(unknown)}")
        failures = data.get("failure", [])
        if not isinstance(failures, list) or not all(isinstance(raw, dict) for raw in failures):
            raise ValueError(f"{path}: 'failure' must be an array of tables ([[failure]])")
        for i, raw in enumerate(failures):
            try:
                ledger.entries.append(
                    _entry(path.stem, raw, f"{path.parent.name}/{path.name}[{i}]", f"{path} failure[{i}]")
                )
            except (TypeError, AttributeError) as exc:  # a value of a type no check above expected
                raise ValueError(f"{path} failure[{i}]: malformed entry: {exc}") from None
    return ledger


class LedgerDirError(UsageError):
    """A ledger directory a user named that cannot be used; ``str()`` is one line, ``--ledger-dir DIR: reason``."""

    def __init__(self, directory: Path | str, reason: str, flag: str = "--ledger-dir") -> None:
        super().__init__(f"{flag} {directory}: {reason}")
        self.path = str(directory)
        self.reason = reason


def load_ledger_dir(directory: Path | str | None, flag: str = "--ledger-dir") -> Ledger:
    """The ledgers of a directory a user named with ``flag`` (None: the packaged ones, :func:`load_ledger`).

    :class:`LedgerDirError` (a :class:`~conformance.exits.UsageError`, exit 2) when it does not exist, is not a
    directory, or holds a ledger :func:`load_ledger` refuses (the reason names the file, the entry and the key)."""
    if directory is None:
        return load_ledger()
    path = Path(directory)
    try:
        exists = path.exists()  # Python < 3.12 raises here for a name too long (ENAMETOOLONG)
        is_dir = exists and path.is_dir()
    except OSError as exc:
        raise LedgerDirError(directory, f"cannot be read: {exc.strerror or exc}", flag) from None
    if not exists:
        raise LedgerDirError(directory, "no such directory", flag)
    if not is_dir:
        raise LedgerDirError(directory, "not a directory", flag)
    try:
        return load_ledger(path)
    except ValueError as exc:
        raise LedgerDirError(directory, str(exc), flag) from None
