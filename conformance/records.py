"""Typed, frozen run records and their JSON-lines form.

A results file is JSON lines: one ``header`` record (environment, suite, backends), then one
``result`` record per (case, backend), appended as soon as it is known.  Every record carries
``schema``; readers ignore keys they do not know and fill missing ones with defaults, so files
written by older and newer versions stay readable.
"""

from __future__ import annotations

import dataclasses
import enum
import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Status", "ErrorStats", "Timing", "CheckResult", "Header", "read_records", "append_record", "SCHEMA"]

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


@dataclass(frozen=True)
class Header:
    """First line of a results file: what ran, where."""

    suite: str
    backends: dict[str, dict[str, str]]
    env: dict[str, Any]
    argv: list[str] = field(default_factory=list)
    started: str = ""

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
    """Every header and result of a JSONL file (``.jsonl.gz`` too); a truncated last line (killed
    writer) is skipped."""
    headers: list[Header] = []
    results: list[CheckResult] = []
    for line in _lines(path):
        kind = line.get("type")
        if kind == "header":
            headers.append(Header.from_json(line))
        elif kind == "result":
            results.append(CheckResult.from_json(line))
    return headers, results


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    # committed reports are gzipped JSONL (reports/ stays small); the runner writes plain JSONL
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for raw in fh:
            raw = raw.strip()
            if not raw:
                continue
            try:
                yield json.loads(raw)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill; the runner rewrites it on --resume
