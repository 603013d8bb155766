"""The sweep: every selected case against every backend, one JSON line per (case, backend).

Order is cases outer, backends inner, and a case goes to one worker with all of its backends, so the
worker computes the case's reference once and reuses it for every backend.  Kernels run in
:class:`~conformance.running.worker.WorkerClient` subprocesses, ``config.jobs`` of them at once
(:mod:`conformance.running.pool`: how many, on which GPU); a dead worker becomes a ``crash`` record,
a silent one a ``timeout`` record, and that worker alone is replaced by a fresh one.  Each worker has
its next request queued before it finishes the current one, so it never waits for the parent.

The parent is the only writer: records are appended as soon as they arrive, and the file is fsync'ed
once per batch of records that arrived together (before the parent waits again), so a killed run
loses at most the pairs in flight; ``resume`` skips the pairs already in the file.  Without
``resume`` an existing file is moved aside to ``<name>.prev.jsonl`` (one backup) before the new
run starts.

CUDA out of memory under sharing (:func:`is_cuda_oom`): an ``error`` record whose reason is a CUDA OOM (or
cuDNN's attention graph failing to execute, seen only under sharing),
from a worker that shares its GPU with others, is not written; the pair is deferred, its worker
restarted, and after the parallel phase the deferred pairs run again with one worker per GPU and every
other worker closed.  That record is final and carries ``extra["oom_retry"]`` (the first error and how
many workers shared the GPU).  A run killed before the retry has not written those pairs, so ``resume``
runs them again.  Cases go to workers by compile affinity (:class:`~conformance.running.pool.WorkFeed`,
keys from the first worker's ``keys`` op), so a JIT backend compiles each kernel in as few workers as it can.

Exit status of a run (see :attr:`RunSummary.exit_code`): 0 when no selected (case, backend) pair has
a problem status (fail, error, crash, timeout), 1 otherwise; pairs recorded by an earlier run of
a resumed file count too, so the status describes the whole sweep.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
import json
import os
import queue
import re
import shlex
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from conformance.cases.case import AttentionCase
from conformance.records import CheckResult, Header, Status, append_record, read_records
from conformance.running.pool import (
    Outcome,
    Placement,
    PlacementError,
    WorkFeed,
    parse_gpus,
    plan_workers,
    serve,
)
from conformance.running.worker import Reply, WorkerClient

__all__ = ["RunConfig", "RunSummary", "UsageError", "parse_shard", "repair_tail", "run", "select_cases"]


class UsageError(ValueError):
    """A bad command line (unknown suite or backend, empty selection): exit status 2."""


@dataclass(frozen=True)
class RunConfig:
    """Everything ``attnconf run`` was asked to do."""

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

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def text(self) -> str:
        def med(xs: list[float]) -> str:
            return f"{statistics.median(xs) * 1e3:.2f} ms" if xs else "n/a"

        counts = ", ".join(f"{s.value} {self.counts.get(s.value, 0)}" for s in Status)
        parent = f"{self.parent_s / self.written * 1e3:.2f} ms" if self.written else "n/a"
        phases = ", ".join(f"{k.removesuffix('_s')} {med(v)}" for k, v in self.phases_s.items())
        return (
            f"{self.written} records written to {self.out} ({self.skipped} already there) in {self.wall_s:.1f} s "
            f"by {self.workers} worker(s): {counts}\n"
            f"median per record: harness {med(self.harness_s)}, kernel {med(self.kernel_s)}, "
            f"parent round trip {med(self.roundtrip_s)}, overhead (round trip - worker time) "
            f"{med(self.overhead_s)}, worker idle before a request {med(self.idle_s)}; "
            f"parent bookkeeping {parent} per record; worker starts: {self.worker_starts}"
            + (f"; CUDA OOM retried alone: {self.oom_retries}" if self.oom_retries else "")
            + "\n"
            f"median worker phases: {phases or 'n/a'} (context: inputs + reference + baseline of a new case)"
        )


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` with 0 <= i < n (0-based, as pytest-shard and CI matrices count)."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard must look like i/n, got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise UsageError(f"--shard i/n needs 0 <= i < n, got {text!r}")
    return i, n


def _json_cases(text: str) -> list[AttentionCase]:
    raw = Path(text[1:]).read_text() if text.startswith("@") else text
    try:
        data = json.loads(raw)
        items = data if isinstance(data, list) else [data]
        return [AttentionCase.from_json(d) for d in items]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"--case-json is not an AttentionCase (or a list of them): {exc}") from None


def select_cases(
    suite: str | None,
    patterns: tuple[str, ...] = (),
    case_json: str | None = None,
    shard: tuple[int, int] | None = None,
    limit: int | None = None,
) -> list[AttentionCase]:
    """The cases of a run: suite cases matching any pattern (id or fnmatch glob), plus the JSON
    cases, deduplicated by id; then shard ``i/n`` keeps every n-th from the i-th; then ``limit``."""
    cases: list[AttentionCase] = []
    if suite is not None:
        from conformance.cases.suites import get_suite, suite_names

        if suite not in suite_names():
            raise UsageError(f"--suite must be one of {suite_names()}, got {suite!r}")
        cases = get_suite(suite)
        if patterns:
            cases = [c for c in cases if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]
    elif patterns:
        raise UsageError("--case filters a suite: give --suite too (or --case-json for a case of your own)")
    if case_json:
        cases = cases + _json_cases(case_json)
    if suite is None and not case_json:
        raise UsageError("give --suite and/or --case-json")
    cases = list({c.id: c for c in cases}.values())
    if shard is not None:
        cases = cases[shard[0] :: shard[1]]
    if limit is not None:
        cases = cases[: max(0, limit)]
    if not cases:
        raise UsageError("no case selected (check --case patterns, --shard and --limit)")
    return cases


def repair_tail(path: Path) -> None:
    """Make the next append start on a fresh line: drop a last line cut short by a kill.

    A complete JSON object that merely lacks its newline is kept (and given one).
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    try:
        json.loads(data[cut:])
        complete = True
    except ValueError:
        complete = False
    with open(path, "r+b") as fh:
        if complete:
            fh.seek(0, 2)
            fh.write(b"\n")
        else:
            fh.truncate(cut)


def _check_names(specs: tuple[str, ...]) -> None:
    """Unknown registry names fail here, before a worker starts (``module:Class`` is checked there)."""
    from attnfast.registry import available_names

    known = available_names()
    unknown = [s for s in specs if ":" not in s and s not in known]
    if unknown:
        raise UsageError(
            f"unknown backend {', '.join(map(repr, unknown))}; --backend must be one of {known} or module:Class"
        )


def _describe(client: WorkerClient, config: RunConfig) -> tuple[dict[str, Any], dict[str, dict[str, str]], list[str]]:
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
    names = [infos[s]["name"] for s in config.backends]
    if len(set(names)) != len(names):
        raise UsageError(f"two --backend values name the same backend: {names}")
    return reply.data["env"], infos, list(reply.data.get("jit", []))


def _compile_keys(
    client: WorkerClient, config: RunConfig, units: list[list[_Pair]], jit: list[str]
) -> dict[str, tuple[Hashable, ...]]:
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
    keys: dict[str, tuple[Hashable, ...]] = {}
    for unit, row in zip(units, reply.data["keys"]):
        specs = {p.spec for p in unit}
        keys[unit[0].case.id] = tuple((s, k) for s, k in zip(jit, row) if k is not None and s in specs)
    return keys


def _previous(config: RunConfig) -> dict[tuple[str, str], CheckResult]:
    if not config.resume or not config.out.exists():
        return {}
    repair_tail(config.out)
    headers, results = read_records(config.out)
    for h in headers:
        prior = h.env.get("run", {})
        for key in ("device", "seed"):
            if key in prior and prior[key] != getattr(config, key):
                raise UsageError(
                    f"--resume: {config.out} was run with {key}={prior[key]!r}, not {getattr(config, key)!r}"
                )
    return {(r.case_id, r.backend): r for r in results}


def _record(reply: Reply, case: AttentionCase, spec: str, info: dict[str, str], config: RunConfig) -> CheckResult:
    """The record of one request: the worker's verdict, or one the parent writes for it."""
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
            "harness error (inputs or reference), not the kernel: " + str(reply.data.get("error")),
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
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[counts]}"),
        console=console,
        disable=not config.progress or total == 0,
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


def is_cuda_oom(record: CheckResult) -> bool:
    """Whether ``record`` is an ``error`` whose reason is a CUDA out-of-memory error (kernel or harness)."""
    return record.status is Status.ERROR and bool(_CUDA_OOM.search(record.reason or ""))


def _short(reason: str, limit: int = 300) -> str:
    """The first line of a reason, at most ``limit`` characters."""
    line = (reason or "").strip().splitlines()[0] if (reason or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _counts_text(counts: Counter) -> str:
    return " ".join(f"[{_COLORS[s.value]}]{s.value} {counts.get(s.value, 0)}[/]" for s in Status)


@dataclass(frozen=True)
class _Pair:
    """One (case, backend) to run, with the worker request that runs it."""

    case: AttentionCase
    spec: str
    request: dict[str, Any]


def _units(config: RunConfig, cases: list[AttentionCase], todo: set[tuple[str, str]]) -> list[list[_Pair]]:
    """The pairs still to run, grouped by case (cases outer, backends inner)."""
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
    """The results file, open for the whole run: lines appended as records arrive, fsync'ed per batch."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh

    def write(self, record: CheckResult) -> None:
        # The line format of conformance.records.append_record, without its open and fsync per record.
        self.fh.write(json.dumps(record.to_json(), sort_keys=True, allow_nan=True) + "\n")

    def sync(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())


def _account(summary: RunSummary, record: CheckResult, reply: Reply) -> None:
    summary.written += 1
    summary.counts[record.status.value] += 1
    summary.problems += record.status.is_problem
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


def run(config: RunConfig) -> RunSummary:
    """Run the sweep described by ``config``; raises :class:`UsageError` for a bad selection."""
    t_start = time.perf_counter()
    cases = select_cases(config.suite, config.case_patterns, config.case_json, config.shard, config.limit)
    if not config.backends:
        raise UsageError("give at least one --backend")
    _check_names(config.backends)
    from conformance.running.worker import load_overrides

    try:
        load_overrides(list(config.tol), config.tol_file)  # the worker parses them again; fail fast here
    except (OSError, ValueError, RuntimeError) as exc:
        raise UsageError(f"tolerance overrides: {exc}") from None
    placements = _placements(config)
    warning = _timing_warning(config, placements)
    if warning:
        print(f"attnconf run: {warning}", file=sys.stderr)
    done = _previous(config)
    clients = [WorkerClient(env=p.env()) for p in placements]
    summary = RunSummary(out=config.out)
    try:
        for client in clients[1 : len(cases)]:
            client.spawn()  # their imports overlap the first worker's describe
        env, infos, jit = _describe(clients[0], config)
        for client in clients:
            client.preload = list(config.backends)
        config.out.parent.mkdir(parents=True, exist_ok=True)
        if not config.resume and config.out.exists():
            # A fresh run starts a new file, but the last one is kept: a repro command pasted from a
            # report (default --out) must not destroy the sweep it came from.
            backup = config.out.with_name(config.out.stem + ".prev" + config.out.suffix)
            config.out.replace(backup)
            print(f"attnconf run: moved the existing {config.out} to {backup}", file=sys.stderr)
        pairs = [(c, s) for c in cases for s in config.backends]
        todo = {(c.id, s) for c, s in pairs if (c.id, infos[s]["name"]) not in done}
        units = _units(config, cases, todo)
        workers = min(len(placements), len(units))
        gpus = [p.gpu for p in placements[: max(1, workers)] if p.gpu is not None]
        run_info = {
            "device": config.device,
            "seed": config.seed,
            "shard": list(config.shard) if config.shard else None,
            "timeout_s": config.timeout,
            "time": config.time,
            "tol": list(config.tol),
            "tol_file": config.tol_file,
            "cases": len(cases),
            "resume": config.resume,
            "already_recorded": len(done),
            "jobs": workers,
            "gpus": sorted(set(gpus), key=gpus.index) if gpus else None,
            "workers": [p.to_json() for p in placements[:workers]],
        }
        started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        append_record(
            config.out,
            Header(
                suite=config.suite or "custom",
                backends={infos[s]["name"]: infos[s] for s in config.backends},
                env={**env, "run": run_info},
                argv=list(config.argv),
                started=started,
            ),
        )
        summary.skipped = len(pairs) - len(todo)
        summary.problems = sum(
            1 for c, s in pairs if (c.id, infos[s]["name"]) in done and done[c.id, infos[s]["name"]].status.is_problem
        )
        summary.workers = workers

        #: (case id, backend name) -> its pair; deferred CUDA OOMs and their first error, for the retry phase
        pair_of = {(p.case.id, infos[p.spec]["name"]): p for u in units for p in u}
        deferred: list[_Pair] = []
        retried: dict[tuple[str, str], dict[str, Any]] = {}
        sharing = Counter(p.gpu for p in placements[:workers])  # workers per GPU (None: the one device)

        def judge(pair: _Pair, reply: Reply, worker: int) -> tuple[CheckResult, bool]:
            record = _record(reply, pair.case, pair.spec, infos[pair.spec], config)
            extra = {**record.extra, "worker": worker}
            if placements[worker].gpu is not None:
                extra["gpu"] = placements[worker].gpu
            if (pair.case.id, pair.spec) in retried:
                extra["oom_retry"] = retried[pair.case.id, pair.spec]
            # An ERROR on CUDA may have poisoned the worker's context, and one that ran out of memory holds a
            # large allocator cache: it is replaced before its next request.
            restart = record.status is Status.ERROR and (config.device.startswith("cuda") or is_cuda_oom(record))
            return replace(record, extra=extra), restart

        def deliver(outcome: Outcome, writer: _Writer, shared: Counter) -> bool:
            """Write a finished record, or defer a CUDA OOM of a worker that shared its GPU (False)."""
            record = outcome.record
            n = shared[placements[outcome.worker].gpu]
            if n > 1 and is_cuda_oom(record):
                pair = pair_of[record.case_id, record.backend]
                retried[pair.case.id, pair.spec] = {"first_error": _short(record.reason), "workers_sharing": n}
                deferred.append(pair)
                return False
            writer.write(record)
            _account(summary, record, outcome.reply)
            return True

        def phase(ids: list[int], feed: WorkFeed, shared: Counter, writer: _Writer, bar: Any, task: Any) -> None:
            """Drive the workers ``ids`` until ``feed`` is empty, writing records as they arrive."""
            outcomes: queue.Queue[Outcome] = queue.Queue()
            stop = threading.Event()
            threads = [
                threading.Thread(
                    target=serve,
                    args=(i, clients[i], feed, outcomes, judge, config.timeout, stop),
                    name=f"attnconf-worker-{i}",
                    daemon=True,
                )
                for i in ids
            ]
            for thread in threads:
                thread.start()
            ended = 0
            try:
                while ended < len(ids):
                    batch = [outcomes.get()]
                    t0 = time.perf_counter()
                    while True:
                        try:
                            batch.append(outcomes.get_nowait())
                        except queue.Empty:
                            break
                    wrote = 0
                    for outcome in batch:
                        ended += outcome.end
                        if outcome.error is not None:
                            raise outcome.error
                        if outcome.record is not None:
                            wrote += deliver(outcome, writer, shared)
                    if wrote:
                        writer.sync()
                        bar.update(task, advance=wrote, counts=_counts_text(summary.counts))
                    summary.parent_s += time.perf_counter() - t0
            finally:
                if ended < len(ids):  # interrupted or a worker could not start: stop the others now
                    stop.set()
                    for i in ids:
                        clients[i].kill()
                    for thread in threads:
                        thread.join(timeout=10)
                    while True:  # records that arrived complete are kept; only the pairs in flight are lost
                        try:
                            outcome = outcomes.get_nowait()
                        except queue.Empty:
                            break
                        if outcome.record is not None:
                            deliver(outcome, writer, shared)
                    writer.sync()

        unit_keys = _compile_keys(clients[0], config, units, jit) if workers > 1 else {}
        feed = WorkFeed(units, keys=lambda unit: unit_keys.get(unit[0].case.id, ()))
        label = (config.suite or "cases") + (f" ({workers} workers)" if workers > 1 else "")
        with _progress(config, len(todo)) as bar, open(config.out, "a", encoding="utf-8") as fh:
            task = bar.add_task(label, total=len(todo), counts="")
            writer = _Writer(fh)
            phase(list(range(workers)), feed, sharing, writer, bar, task)
            if deferred:
                # Alone: one worker per GPU (the first placed on it), every other worker closed so that its
                # CUDA context and allocator cache are gone too.
                first: dict[str | None, int] = {}
                for i in range(workers):
                    first.setdefault(placements[i].gpu, i)
                alone = sorted(first.values())
                others = [clients[i] for i in range(workers) if i not in alone]
                _close_all(others)
                summary.oom_retries = len(deferred)
                retry = _retry_units(deferred)
                bar.update(task, description=f"{label}: {len(deferred)} CUDA OOM(s) again, one worker per GPU")
                phase(alone, WorkFeed(retry), Counter(placements[i].gpu for i in alone), writer, bar, task)
    finally:
        summary.worker_starts = sum(c.starts for c in clients)
        _close_all(clients)
        summary.wall_s = time.perf_counter() - t_start
    return summary


def main_run(config: RunConfig) -> int:
    """Run and print the summary to stderr; the exit status of ``attnconf run``."""
    summary = run(config)
    print(summary.text(), file=sys.stderr)
    return summary.exit_code
