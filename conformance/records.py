"""Typed, frozen run records and their JSON-lines form.

A results file is JSON lines: one ``header`` record (environment, suite, backends), then one
``result`` record per (case, backend), appended as soon as it is known.  Every record carries
``schema``; readers ignore keys they do not know and fill missing ones with defaults, so files
written by older and newer versions stay readable.

Two readers: :func:`load_results` is strict (a missing, unreadable or empty file, or lines that are not
records unless allowed, raise :class:`ResultsFileError` naming the file and the reason; skipped lines are
kept with their numbers) and serves whatever decides from a file (compare, report, a gate);
:func:`read_records` skips what it cannot read without a word (``--resume``, which repairs the file anyway).
"""

from __future__ import annotations

import dataclasses
import enum
import gzip
import json
import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Status",
    "ErrorStats",
    "Timing",
    "CheckResult",
    "Header",
    "ResultsFile",
    "ResultsFileError",
    "SkippedLine",
    "load_results",
    "read_records",
    "append_record",
    "SCHEMA",
    "NONFINITE_PASS",
    "judged_results",
]

SCHEMA = 1


class Status(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    UNSUPPORTED = "unsupported"
    ERROR = "error"  # the adapter or kernel raised a Python exception
    CRASH = "crash"  # the worker process died (segfault, illegal memory access, abort)
    TIMEOUT = "timeout"  # the case exceeded its time limit; the worker was killed

    @property
    def is_problem(self) -> bool:
        return self in (Status.FAIL, Status.ERROR, Status.CRASH, Status.TIMEOUT)


def _from_dict(cls, data: dict[str, Any] | None):
    if data is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in names}
    for f in dataclasses.fields(cls):
        if f.name in kwargs and isinstance(kwargs[f.name], list) and "tuple" in str(f.type):
            kwargs[f.name] = tuple(kwargs[f.name])
    return cls(**kwargs)


@dataclass(frozen=True)
class ErrorStats:
    """Numerical comparison of a kernel's output against the reference (and of the baseline).

    ``worst`` is (token, head, dim) of the largest violation relative to the allowed bound;
    ``error_ratio`` is the kernel's max abs error over the allowed bound's error scale (pass needs
    <= 1); ``lse_max_abs`` is None when the kernel returned no LSE.
    """

    max_abs: float
    max_rel: float
    mean_abs: float
    worst: tuple[int, int, int]
    mismatch_frac: float
    error_ratio: float
    baseline_max_abs: float
    baseline_mean_abs: float
    allowed_max_abs: float
    cosine: float
    nonfinite: int = 0
    lse_max_abs: float | None = None
    lse_allowed: float | None = None
    failed_checks: tuple[str, ...] = ()

    def nonfinite_fields(self) -> tuple[str, ...]:
        """The kernel's error statistics that are not finite numbers, as ``name=value`` (empty when all are).

        Checked: ``max_abs``, ``max_rel``, ``mean_abs``, ``error_ratio``, ``lse_max_abs`` (when the kernel
        returned an LSE) must be finite numbers; ``cosine`` must not be +-inf (NaN is the verdict's value for
        an all-zero reference, where no direction exists: :func:`conformance.verdict.compare.cosine_similarity`);
        ``nonfinite`` (NaN/inf outputs where the reference is finite) must be 0.  The verdict never passes a
        kernel with any of these (:func:`conformance.verdict.check.check_backend`)."""
        bad = []
        for name in _ERROR_STATS:
            value = getattr(self, name)
            if name == "lse_max_abs" and value is None:
                continue
            if not _finite(value) and not (name == "cosine" and _real(value) and math.isnan(value)):
                bad.append(f"{name}={value}")
        if self.nonfinite != 0:
            bad.append(f"nonfinite={self.nonfinite}")
        return tuple(bad)


#: The fields :meth:`ErrorStats.nonfinite_fields` checks, in that order.
_ERROR_STATS = ("max_abs", "max_rel", "mean_abs", "error_ratio", "cosine", "lse_max_abs")

#: What a reader says of a `pass` record whose statistics are not finite (:attr:`CheckResult.effective_status`).
NONFINITE_PASS = "pass record with non-finite statistics: treated as fail"


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return _real(value) and math.isfinite(value)


@dataclass(frozen=True)
class Timing:
    """Kernel time (conformance.perf.timing) and the roofline figures derived from it (conformance.perf.roofline).

    Percentages are 0-100."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    method: str
    flops: float | None = None
    bytes: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    roofline_pct: float | None = None
    bound: str | None = None
    pct_of_measured_bw: float | None = None
    measured_copy_gbps: float | None = None
    note: str = ""
    #: what was timed: ``forward`` (every record before backward timing), ``backward`` (the kernel's backward alone,
    #: rerun through the training call's ``backward_only``: flops are 2.5 x the forward's) or ``fwd+bwd`` (the whole
    #: training call, where the adapter cannot rerun its backward alone: 3.5 x); :mod:`conformance.perf.timing`
    phase: str = "forward"
    #: a ``backward`` timing's companion: the median of the whole training call (forward + backward), when timed
    fwd_bwd_ms: float | None = None


@dataclass(frozen=True)
class CheckResult:
    """One (case, backend) verdict."""

    case_id: str
    backend: str
    family: str
    status: Status
    case: dict[str, Any]
    reason: str = ""
    version: str = ""
    device: str = "cpu"
    seed: int = 0
    stats: ErrorStats | None = None
    timing: Timing | None = None
    repro: str = ""
    elapsed_s: float = 0.0
    kernel_s: float = 0.0
    harness_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def effective_status(self) -> Status:
        """The status every reader counts: :attr:`status`, except that a record marked ``pass`` whose error
        statistics are not finite (:meth:`ErrorStats.nonfinite_fields`; written by an older or buggy version, or
        edited by hand) is a ``fail``: NaN where the reference is finite never passes."""
        if self.status is Status.PASS and self.stats is not None and self.stats.nonfinite_fields():
            return Status.FAIL
        return self.status

    def judged(self) -> "CheckResult":
        """This record as readers count it: itself, or (when :attr:`effective_status` differs from
        :attr:`status`) a ``fail`` copy whose reason says why (:data:`NONFINITE_PASS`, with the fields) and whose
        ``extra["recorded_status"]`` keeps the status the file holds."""
        status = self.effective_status
        if status is self.status:
            return self
        assert self.stats is not None
        reason = f"{NONFINITE_PASS} ({', '.join(self.stats.nonfinite_fields())})"
        extra = {**self.extra, "recorded_status": self.status.value}
        return dataclasses.replace(self, status=status, reason=reason, extra=extra)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return {"type": "result", "schema": SCHEMA, **d}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CheckResult":
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["status"] = Status(kwargs["status"])
        kwargs["stats"] = _from_dict(ErrorStats, kwargs.get("stats"))
        kwargs["timing"] = _from_dict(Timing, kwargs.get("timing"))
        return cls(**kwargs)


def judged_results(results: Iterable[CheckResult]) -> tuple[list[CheckResult], int]:
    """(every record as readers count it, :meth:`CheckResult.judged`; how many of them are ``pass`` records with
    non-finite statistics, now ``fail``).  Every reader that counts statuses reads records through this."""
    recorded = list(results)
    out = [r.judged() for r in recorded]
    return out, sum(a is not b for a, b in zip(out, recorded))


@dataclass(frozen=True)
class Header:
    """First line of a results file: what ran, where."""

    suite: str
    backends: dict[str, dict[str, str]]
    env: dict[str, Any]
    argv: list[str] = field(default_factory=list)
    started: str = ""
    #: what makes the records one sweep (suite, selection, seed, device, resolved tolerance): the format is in
    #: :mod:`conformance.running.outfile`; empty in files written before it existed (and by ``fuzz``)
    sweep: dict[str, Any] = field(default_factory=dict)

    @property
    def run_options(self) -> dict[str, Any]:
        """``env["run"]``: the run's options as the runner recorded them (``{}`` when absent or malformed)."""
        run = self.env.get("run") if isinstance(self.env, dict) else None
        return run if isinstance(run, dict) else {}

    def to_json(self) -> dict[str, Any]:
        return {"type": "header", "schema": SCHEMA, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Header":
        return _from_dict(cls, data)


def append_record(path: Path, record: CheckResult | Header) -> None:
    """Append one JSON line and flush it to disk (a crash after this loses nothing)."""
    import os

    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record.to_json(), sort_keys=True, allow_nan=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_records(path: Path) -> tuple[list[Header], list[CheckResult]]:
    """Every header and result of a JSONL file (``.jsonl.gz`` too), lenient: a line that is not a record
    (a truncated last line of a killed writer, say) is skipped without a word.  Readers that decide something
    from a file (compare, report, a gate) use :func:`load_results`, which counts and names what it skipped."""
    scanned = _scan(Path(path))
    return list(scanned.headers), list(scanned.results)


class ResultsFileError(ValueError):
    """A results file that cannot be used; ``str()`` is one line naming the file and the reason."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


@dataclass(frozen=True)
class SkippedLine:
    """A non-blank line of a results file that is not a record this version can read."""

    line: int  # 1-based
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


@dataclass(frozen=True)
class ResultsFile:
    """What :func:`load_results` read: the records, and every line it skipped (with its line number)."""

    path: Path
    headers: tuple[Header, ...]
    results: tuple[CheckResult, ...]
    skipped: tuple[SkippedLine, ...] = ()
    #: records of a ``type`` this version does not know (a newer writer's): ignored, as the format promises
    other_records: int = 0

    def skipped_summary(self, shown: int = 3) -> str:
        """``2 lines skipped (line 4: not JSON; line 9: ...)``; empty when nothing was skipped."""
        if not self.skipped:
            return ""
        listed = "; ".join(str(s) for s in self.skipped[:shown])
        more = f"; +{len(self.skipped) - shown} more" if len(self.skipped) > shown else ""
        n = len(self.skipped)
        return f"{n} line{'s' if n != 1 else ''} skipped ({listed}{more})"


def load_results(
    path: Path | str, *, allow_skipped: bool = False, need_header: bool = True, need_results: bool = True
) -> ResultsFile:
    """Read a results file strictly; :class:`ResultsFileError` (one line: the file and the reason) when it is
    missing, unreadable (not UTF-8 text or a broken gzip stream), empty or holds no records, holds lines that
    are not records (unless ``allow_skipped``: they are then counted in :attr:`ResultsFile.skipped`), has no
    header line (``need_header``) or no result record (``need_results``).

    Lenient where the format promises it: unknown keys are ignored and missing ones take their defaults, so
    records of a newer schema keep loading, and records of an unknown ``type`` are counted, not refused.
    """
    path = Path(path)
    if not path.exists():
        raise ResultsFileError(path, "no such file")
    if path.is_dir():
        raise ResultsFileError(path, "is a directory, not a results file")
    try:
        scanned = _scan(path)
    except OSError as exc:
        raise ResultsFileError(path, f"cannot be read: {exc.strerror or exc}") from None
    if not scanned.headers and not scanned.results:
        what = "empty file" if path.stat().st_size == 0 else "holds no records"
        if scanned.skipped:
            what += f": {scanned.skipped_summary()}"
        raise ResultsFileError(path, what + " (not a results file of attnconf run)")
    if scanned.skipped and not allow_skipped:
        raise ResultsFileError(path, scanned.skipped_summary())
    if need_header and not scanned.headers:
        raise ResultsFileError(path, "no header line (not a results file of attnconf run)")
    if need_results and not scanned.results:
        raise ResultsFileError(path, "no result records (only a header: the run recorded nothing)")
    return scanned


_GZIP_MAGIC = b"\x1f\x8b"


def _scan(path: Path) -> ResultsFile:
    """Every line of ``path``, parsed; gzip by content (``.jsonl.gz`` or not).  OSError propagates; a
    file that is not UTF-8 text or not a complete gzip stream is a :class:`ResultsFileError`."""
    with open(path, "rb") as fh:
        gzipped = fh.read(2) == _GZIP_MAGIC
    headers: list[Header] = []
    results: list[CheckResult] = []
    skipped: list[SkippedLine] = []
    other = 0
    try:
        with (gzip.open if gzipped else open)(path, "rt", encoding="utf-8", newline="") as fh:
            raws = list(fh)
    except UnicodeDecodeError as exc:
        hint = "" if gzipped else "; a gzipped file starts with 1f 8b"
        raise ResultsFileError(path, f"not UTF-8 text (byte {exc.start}: {exc.reason}{hint})") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise ResultsFileError(path, f"not a complete gzip file ({exc})") from None
    for n, raw in enumerate(raws, 1):
        text = raw.strip()
        if not text:
            continue
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            cut = n == len(raws) and not raw.endswith("\n")
            skipped.append(SkippedLine(n, "not JSON" + (" (the last line, cut short)" if cut else "")))
            continue
        kind = line.get("type") if isinstance(line, dict) else None
        if kind is None:
            skipped.append(SkippedLine(n, "not a record (a JSON object with a 'type' field)"))
            continue
        try:
            if kind == "header":
                headers.append(Header.from_json(line))
            elif kind == "result":
                results.append(CheckResult.from_json(line))
            else:
                other += 1
        except (KeyError, TypeError, ValueError) as exc:
            skipped.append(SkippedLine(n, f"a {kind} record this version cannot read ({type(exc).__name__}: {exc})"))
    return ResultsFile(path, tuple(headers), tuple(results), tuple(skipped), other)
