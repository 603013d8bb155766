"""Typed, frozen run records: what one (case, backend) verdict holds (:class:`CheckResult`, its statistics and
timing) and what a results file's header says (:class:`Header`), with their JSON form.

Every record carries ``schema``; readers ignore keys they do not know and fill missing ones with defaults, so
records written by older and newer versions stay readable.  :meth:`CheckResult.effective_status` is the one rule
every reader counts statuses by.  The results file that holds them (JSON lines, gzip members, the strict and
lenient readers, the appender) is :mod:`conformance.results_file`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Status",
    "ErrorStats",
    "Timing",
    "CheckResult",
    "Header",
    "SCHEMA",
    "NONFINITE_PASS",
    "HARNESS_ERROR",
    "LOST_DEVICE",
    "is_cuda_fault",
    "is_cuda_oom",
    "is_harness_cuda_fault",
    "is_lost_device",
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
                # no mutate: lse_max_abs is the last field of _ERROR_STATS, so break ends the loop as continue does
                continue  # pragma: no mutate
            if not _finite(value) and not (name == "cosine" and _real(value) and math.isnan(value)):
                bad.append(f"{name}={value}")
        if self.nonfinite != 0:
            bad.append(f"nonfinite={self.nonfinite}")
        return tuple(bad)


#: The fields :meth:`ErrorStats.nonfinite_fields` checks, in that order.
_ERROR_STATS = ("max_abs", "max_rel", "mean_abs", "error_ratio", "cosine", "lse_max_abs")

#: What a reader says of a `pass` record whose statistics are not finite (:attr:`CheckResult.effective_status`).
NONFINITE_PASS = "pass record with non-finite statistics: treated as fail"

#: How the reason of an ``error`` starts when the worker failed outside the kernel call (the case's inputs, reference
#: or baseline): the runner writes it (:func:`conformance.running.pairs.reply_record`), the ledger, the fuzzer's
#: shrink and the run-again of a broken CUDA context read it.
HARNESS_ERROR = "harness error (inputs or reference), not the kernel: "

#: How the reason of an ``error`` starts when a backend that was available when the run began is not in the worker
#: that got the pair (:func:`conformance.verdict.check.check_backend`): most often the device was lost (after faults,
#: the GPU refused CUDA to new processes), so the pair was not judged.
LOST_DEVICE = "not available in this worker, though it was when the run began (a lost device?): "

#: How a CUDA out-of-memory error reads: torch's OutOfMemoryError (``torch.cuda.OutOfMemoryError``), its
#: older RuntimeError text, the runtime's and driver's error names, cuBLAS/cuDNN allocation failures, and
#: cuDNN's SDPA graph failing to execute (``mha_graph.execute(...).is_good()``: on the H100 once in three
#: ``default`` runs with 12 workers on the GPU, for a case that passed alone and in the other two runs).
_CUDA_OOM = re.compile(
    r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory|cudaErrorMemoryAllocation"
    r"|CUDA_ERROR_OUT_OF_MEMORY|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
    r"|mha_graph\.execute\(.*\)\.is_good\(\)",
    re.IGNORECASE,
)


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
    #: what decides the run's (case, backend) pairs, as ``attnconf run`` was given it (the format is
    #: :meth:`conformance.running.selection.Selection.to_json`; ``attnconf merge`` rebuilds a shard's cases from it);
    #: empty in files written before it existed (``argv`` is read instead) and by ``fuzz``
    selection: dict[str, Any] = field(default_factory=dict)

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


def is_cuda_oom(record: CheckResult) -> bool:
    """Whether ``record`` is an ``error`` whose reason is a CUDA out-of-memory error (kernel or harness)."""
    return record.status is Status.ERROR and bool(_CUDA_OOM.search(str(record.reason)))


def is_cuda_fault(record: CheckResult) -> bool:
    """Whether ``record`` is an ``error`` from a CUDA error other than an OOM, in the harness or in the kernel's step:
    a sticky error may be the pair's own or one an earlier call of the process left behind."""
    reason = str(record.reason)  # None reads "None": no CUDA error
    return record.status is Status.ERROR and "CUDA error" in reason and not _CUDA_OOM.search(reason)


def is_harness_cuda_fault(record: CheckResult) -> bool:
    """Whether ``record`` is an ``error`` raised before the backend's kernel ran (its case's inputs, reference or
    baseline) by a CUDA error other than an OOM (:func:`is_cuda_fault`): pure PyTorch ops on the case's own
    tensors, so the worker's CUDA context was already broken by an earlier call in that process (a kernel that
    faulted asynchronously or wrote into memory it was not given), not by this pair."""
    return is_cuda_fault(record) and str(record.reason).startswith(HARNESS_ERROR)


def is_lost_device(record: CheckResult) -> bool:
    """Whether ``record`` is an ``error`` of a backend missing from its worker though available when the run
    began (:data:`LOST_DEVICE`): the pair was not judged."""
    return record.status is Status.ERROR and str(record.reason).startswith(LOST_DEVICE)
