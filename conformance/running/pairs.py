"""The pieces of a sweep: what it was asked (:class:`RunConfig`), the backends' description, one worker request
per (case, backend) pair, the record of each reply, the results file writer, the progress bar and the bookkeeping
of a record (:mod:`conformance.running.runner` drives them).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnfast.base import info_devices, runs_on
from conformance.cases.case import AttentionCase
from conformance.records import HARNESS_ERROR, CheckResult, Status
from conformance.results_writer import Appender
from conformance.running.outcome import RunSummary
from conformance.running.pool import Placement, PlacementError, parse_gpus, plan_workers
from conformance.running.selection import Selection
from conformance.exits import OutputError, UsageError
from conformance.running.worker import Reply, WorkerClient

__all__ = ["RunConfig", "check_backend_names", "describe_backends", "reply_record"]


@dataclass(frozen=True)
class RunConfig:
    """Everything ``attnconf run`` was asked to do: its :attr:`selection` (the fields from ``backends`` to ``seed``
    that decide the pairs, :class:`~conformance.running.selection.Selection`) and how to run and report them."""

    backends: tuple[str, ...]
    suite: str | None = None
    device: str = "cpu"
    out: Path = Path("results.jsonl")
    resume: bool = False
    shard: tuple[int, int] | None = None
    timeout: float = 300.0
    seed: int = 0
    case_patterns: tuple[str, ...] = ()
    case_json: str | None = None
    time: bool = False
    tol: tuple[str, ...] = ()
    tol_file: str | None = None
    limit: int | None = None
    progress: bool = True
    argv: tuple[str, ...] = ()
    #: workers at once (None: what the machine sustains, :func:`conformance.running.pool.default_jobs`)
    jobs: int | None = 1
    #: ``--gpus`` text (``all`` or ``0,1,...``); None: every visible GPU for ``--device cuda``, else none
    gpus: str | None = None
    #: ``--exclude`` globs, ``--feature`` / ``--exclude-feature`` groups (``"paged,window"``)
    exclude: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    exclude_features: tuple[str, ...] = ()
    #: ``--model`` names (registry models, :mod:`conformance.models`)
    models: tuple[str, ...] = ()
    #: ``--strict``: known failures and unexpected passes fail the run too
    strict: bool = False
    #: ``--ledger-dir``: known-failure ledgers (None: conformance/ledgers)
    ledger_dir: Path | None = None
    #: ``--json``: the machine-readable summary goes here
    summary_json: Path | None = None
    #: ``--report DIR``: the report of the results file (``report.md``, ``report.html``) is written there after the
    #: run (:mod:`conformance.reporting.report_render`)
    report: Path | None = None
    #: ``--allow-unjudged``: a backend that judged no case (every pair unsupported) does not fail the run
    allow_unjudged: bool = False
    #: ``--profile``: print where the time went at the end (:mod:`conformance.running.profile`)
    profile: bool = False
    #: ``--compile-only`` (``attnconf warmup``): the compile phase alone, no results file
    compile_only: bool = False
    #: ``--no-compile-phase``: JIT backends compile inside the checks (:mod:`conformance.running.compile_phase`)
    compile_phase: bool = True
    #: ``--schedule``: ``cost`` (longest case first) or ``fifo`` (the selection's order); ``--costs`` FILE
    schedule: str = "cost"
    costs: Path | None = None
    #: ``--allow-skipped``: ``resume`` keeps lines of the file that are not records instead of refusing it
    allow_skipped: bool = False
    #: ``--spare-workers``: started workers kept per placement for restarts (None: auto,
    #: :func:`conformance.running.spares.spares_for`; 0: none)
    spare_workers: int | None = None

    @classmethod
    def from_selection(cls, selection: Selection, **options: Any) -> RunConfig:
        """The configuration that runs ``selection`` (its every field, a field of the same name here) with ``options``
        (the other fields):
        ``RunConfig.from_selection(s, ...).selection == s``."""
        return cls(**{f.name: getattr(selection, f.name) for f in dataclasses.fields(Selection)}, **options)

    @property
    def selection(self) -> Selection:
        """What decides the run's pairs (written into the results file's header as ``Header.selection``)."""
        return Selection(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Selection)})


def check_backend_names(specs: tuple[str, ...]) -> None:
    """:class:`UsageError` for a spec that is not a registry name nor ``module:Class`` (checked here, before a
    worker starts; ``module:Class`` is checked by the worker's describe)."""
    from attnfast.registry import available_names

    known = available_names()
    unknown = [s for s in specs if ":" not in s and s not in known]
    if unknown:
        raise UsageError(
            f"unknown backend {', '.join(map(repr, unknown))}; --backend must be one of {known} or module:Class"
        )


def describe_backends(
    client: WorkerClient, config: RunConfig
) -> tuple[dict[str, Any], dict[str, dict[str, str]], list[str]]:
    """(the host's environment, each backend spec's description, the JIT-compiling specs), as the worker
    ``client`` describes ``config.backends`` on ``config.device``; :class:`UsageError` when it cannot, when a
    spec does not load, when a backend does not run on the device, or when two specs name one backend."""
    reply = client.request(
        {"op": "describe", "backends": list(config.backends), "device": config.device},
        timeout=max(120.0, config.timeout),
    )
    if reply.kind != "ok" or not reply.data.get("ok"):
        raise UsageError(f"the worker could not describe the backends: {reply.reason or reply.data.get('error')}")
    errors = reply.data.get("errors", {})
    if errors:
        raise UsageError("; ".join(f"{spec}: {msg}" for spec, msg in errors.items()))
    infos = reply.data["backends"]
    declared = {s: info_devices(infos[s]) or () for s in config.backends}  # none declared: runs nowhere
    elsewhere = {s: ",".join(d) for s, d in declared.items() if not runs_on(d, config.device)}
    if elsewhere:  # its every pair would be "unsupported": a command line to fix, not a finding
        raise UsageError(
            "; ".join(f"--backend {s} runs on {d.replace(',', '/') or 'no device'} only" for s, d in elsewhere.items())
            + f", not on --device {config.device}"
        )
    names = [infos[s]["name"] for s in config.backends]
    if len(set(names)) != len(names):
        raise UsageError(f"two --backend values name the same backend: {names}")
    return reply.data["env"], infos, list(reply.data.get("jit", []))


def _compile_keys(
    client: WorkerClient, config: RunConfig, units: list[list[_Pair]], jit: list[str]
) -> dict[str, tuple[tuple[str, Hashable], ...]]:
    """Each case's compile keys, ``(spec, key)`` for its pairs of JIT backends (the worker computes them:
    the parent imports no adapter).  Empty when no backend JIT-compiles or the worker could not tell."""
    if not jit or not units:
        return {}
    reply = client.request(
        {"op": "keys", "backends": jit, "cases": [u[0].request["case"] for u in units], "device": config.device},
        timeout=max(120.0, config.timeout),
    )
    if reply.kind != "ok" or not reply.data.get("ok"):
        return {}  # a scheduling hint only: the sweep runs without it
    keys: dict[str, tuple[tuple[str, Hashable], ...]] = {}
    for unit, row in zip(units, reply.data["keys"]):
        specs = {p.spec for p in unit}
        keys[unit[0].case.id] = tuple((s, k) for s, k in zip(jit, row) if k is not None and s in specs)
    return keys


def reply_record(reply: Reply, case: AttentionCase, spec: str, info: dict[str, str], config: RunConfig) -> CheckResult:
    """The record of one request (``case`` against backend ``spec``, described by ``info``): the worker's verdict,
    or one the parent writes for it (a harness error, a crash, a timeout); its repro command is rebuilt from
    ``config`` (device, seed, tolerance overrides)."""
    from conformance.verdict.check import repro_command

    # Rebuilt here rather than taken from the worker's record: a `module:Class` backend is only
    # reachable by its import path, and tolerance overrides change the verdict, so both belong in it.
    repro = repro_command(case, spec, config.device, config.seed)
    repro += "".join(f" --tol {shlex.quote(t)}" for t in config.tol)
    repro += f" --tol-file {shlex.quote(config.tol_file)}" if config.tol_file else ""
    if reply.kind == "ok" and reply.data.get("ok"):
        result = CheckResult.from_json(reply.data["result"])
        timing = {"roundtrip_s": reply.wall_s}
        if "worker_s" in reply.data:
            timing["worker_s"] = reply.data["worker_s"]
        return replace(result, extra={**result.extra, **timing}, repro=repro)
    if reply.kind == "ok":
        status, reason = (
            Status.ERROR,
            HARNESS_ERROR + str(reply.data.get("error")),
        )
        if reply.data.get("traceback"):
            reason += "\n" + reply.data["traceback"]
    else:
        status, reason = (Status.CRASH if reply.kind == "crash" else Status.TIMEOUT), reply.reason
    return CheckResult(
        case_id=case.id,
        backend=info["name"],
        family=info.get("family", ""),
        status=status,
        case=case.to_json(),
        reason=reason,
        version=info.get("version", ""),
        device=config.device,
        seed=config.seed,
        repro=repro,
        elapsed_s=reply.wall_s,
    )


def _progress(config: RunConfig, total: int):
    """The run's progress on stderr (:func:`conformance.console.progress`: a bar in a terminal, else a line per
    10 % of the pairs)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from conformance.console import progress

    return progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[counts]}"),
        disable=not config.progress or total == 0,
        unit="pairs",
    )


_COLORS = {
    "pass": "green",
    "fail": "red",
    "unsupported": "yellow",
    "error": "magenta",
    "crash": "bold red",
    "timeout": "bold magenta",
}


#: Statuses whose record timed a kernel call (the harness/kernel medians are taken over these).
_RAN = (Status.PASS, Status.FAIL, Status.ERROR)


def _counts_text(counts: Counter) -> str:
    return " ".join(f"[{_COLORS[s.value]}]{s.value} {counts.get(s.value, 0)}[/]" for s in Status)


@dataclass(frozen=True)
class _Pair:
    """One (case, backend) to run, with the worker request that runs it."""

    case: AttentionCase
    spec: str
    request: dict[str, Any]


def _units(
    config: RunConfig, cases: list[AttentionCase], todo: set[tuple[str, str]], available: frozenset[str] = frozenset()
) -> list[list[_Pair]]:
    """The pairs still to run, grouped by case (cases outer, backends inner); ``available``: the specs the run's
    describe step found available (a worker that finds one unavailable later records an error, not a refusal)."""
    units = []
    for case in cases:
        case_json = case.to_json()
        units.append(
            [
                _Pair(
                    case,
                    spec,
                    {
                        "op": "check",
                        "case": case_json,
                        "backend": spec,
                        "seed": config.seed,
                        "device": config.device,
                        "available": spec in available,
                        "tol": list(config.tol),
                        "tol_file": config.tol_file,
                        "time": config.time,
                    },
                )
                for spec in config.backends
                if (case.id, spec) in todo
            ]
        )
    return [u for u in units if u]


def _retry_units(deferred: list[_Pair]) -> list[list[_Pair]]:
    """The deferred pairs grouped by case, in the order they were deferred (one reference per case)."""
    by_case: dict[str, list[_Pair]] = {}
    for pair in deferred:
        by_case.setdefault(pair.case.id, []).append(pair)
    return list(by_case.values())


def _placements(config: RunConfig) -> list[Placement]:
    try:
        gpus = parse_gpus(config.gpus) if config.gpus is not None else None
        return plan_workers(config.device, config.jobs, gpus, gpus_given=config.gpus is not None, timed=config.time)
    except PlacementError as exc:
        raise UsageError(str(exc)) from None


def _timing_warning(config: RunConfig, placements: list[Placement]) -> str | None:
    """A warning when ``--time`` runs more workers than devices: timed kernels would share a device."""
    devices = max(1, len({p.gpu for p in placements}))
    if not config.time or len(placements) <= devices:
        return None
    return (
        f"--time with {len(placements)} workers on {devices} device(s): timed kernels share a device with "
        "other workers' work (--jobs auto gives one worker per device with --time)"
    )


class _Writer:
    """The results file, open for the whole run (:class:`conformance.results_writer.Appender`: plain lines, or one gzip
    member per batch for a gzipped file): records appended as they arrive, handed to the operating system per
    batch (:meth:`sync`: a killed run keeps them), and fsync'ed at most every :attr:`SYNC_EVERY_S` seconds and
    when a phase ends (``force``): only a machine that crashes loses the records of that interval, which
    ``--resume`` runs again.

    A write that fails (a full disk, an I/O error) is an :class:`OutputError` (exit 3), raised again by every
    later call; the records before it are kept, and the file's descriptor then points at ``/dev/null`` so that
    the close that follows does not fail a second time on the bytes it could not write."""

    SYNC_EVERY_S = 0.5

    def __init__(self, out: Appender) -> None:
        self.out = out
        self.failed: OutputError | None = None
        self._synced = time.perf_counter()

    def write(self, record: CheckResult) -> None:
        if self.failed:
            raise self.failed
        self.out.write(record)

    def sync(self, force: bool = False) -> None:
        if self.failed:
            raise self.failed
        try:
            now = time.perf_counter()
            fsync = force or now - self._synced >= self.SYNC_EVERY_S
            self.out.sync(fsync=fsync)
            if fsync:
                self._synced = now
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.failed = OutputError(
            f"--out {self.out.path}: cannot write: {exc.strerror or exc}; the records written before are kept "
            "(free the space, then run the same command with --resume)"
        )
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self.out.fileno())
            os.close(null)
        except OSError:
            pass
        raise self.failed from None


def _account(summary: RunSummary, record: CheckResult, reply: Reply) -> None:
    record = summary.add(record)
    if reply.kind != "ok":
        return
    if "worker_s" in reply.data:
        summary.overhead_s.append(reply.wall_s - reply.data["worker_s"])
    if "idle_s" in reply.data:
        summary.idle_s.append(reply.data["idle_s"])
    for name, seconds in reply.data.get("phases", {}).items():
        summary.phases_s.setdefault(name, []).append(seconds)
    if reply.data.get("ok") and record.status in _RAN:
        summary.harness_s.append(record.harness_s)
        summary.kernel_s.append(record.kernel_s)
        summary.roundtrip_s.append(reply.wall_s)


def _close_all(clients: list[WorkerClient]) -> None:
    for client in clients:
        client.close_input()  # all of them first, so they exit together
    for client in clients:
        client.close()
