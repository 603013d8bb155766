"""The sweep: every selected case against every backend, one JSON line per (case, backend).

Order is cases outer, backends inner, and a case goes to one worker with all of its backends, so the
worker computes the case's reference once and reuses it for every backend.  Kernels run in
:class:`~conformance.running.worker.WorkerClient` subprocesses, ``config.jobs`` of them at once
(:mod:`conformance.running.pool`: how many, on which GPU); a dead worker becomes a ``crash`` record,
a silent one a ``timeout`` record, and that worker alone is replaced by a fresh one.  Each worker has
its next request queued before it finishes the current one, so it never waits for the parent.

The parent is the only writer, and one run at a time holds the file (:mod:`conformance.lock`): records are
appended as soon as they arrive (plain lines, or one gzip member per batch for a gzipped file), each batch of
records that arrived together is handed to the operating system before the parent waits again (and fsync'ed at
most every 0.5 s and when a phase ends, :class:`~conformance.running.pairs._Writer`), so a killed run
loses at most the pairs in flight; ``resume`` skips the pairs already in the file, and refuses a file whose
header says it holds another sweep (:mod:`conformance.running.outfile`: suite, selection, seed, device,
tolerance).  Without ``resume`` an existing file is moved to the first free numbered backup
(``<name>.1.jsonl``, ``<name>.2.jsonl``, ...): no run deletes earlier results.  Ctrl-C stops the workers,
keeps every record that arrived (fsync'ed) and returns a summary that says it was interrupted (exit 130).

Pairs run again (:func:`is_cuda_oom`, :func:`~conformance.records.is_harness_cuda_fault`): an ``error`` that is
a CUDA OOM (or cuDNN's attention graph failing to execute) of a worker sharing its GPU, or a CUDA error raised before
the pair's kernel ran (a context an earlier call broke), is not written; the pair is deferred once, its worker
restarted, and after the parallel phase the deferred pairs run again with one worker per GPU and every other worker
and spare closed.  That record is final and carries ``extra["oom_retry"]`` (the first error, the workers sharing the
GPU) or ``extra["harness_retry"]`` (the first error, the pair that process ran before).  A run killed before the
retry has not written those pairs, so ``resume`` runs them again.  Cases go to workers longest first
(:mod:`conformance.running.schedule`) and by compile affinity (:class:`~conformance.running.pool.WorkFeed`); before
the checks, the compile phase (:mod:`conformance.running.compile_phase`) compiles each JIT kernel once over all
workers (``attnconf warmup`` stops there).  Each record carries its time split (:mod:`conformance.running.profile`).
Size: one concept, the sweep's execution; what stands alone is a module (pool, spares, compile phase, outfile).

Exit status: :attr:`conformance.running.outcome.RunSummary.exit_code` (unexpected problems by the ledger; ``--strict``;
4 when a selected backend judged no case, unless ``--allow-unjudged``; 130 when interrupted).

A run is four parts, each a function with its contract: :func:`~conformance.running.plan.select_run` (the selection,
checked before any worker starts) and :func:`~conformance.running.plan.plan_pairs` (the (case, backend) pairs still to
run, grouped and ordered for the workers) in :mod:`conformance.running.plan`; :func:`execute` (the compile phase, the
header, the checks, the records) and :func:`summarize` (the workers closed, the wall time and profile); :func:`run`
holds the file's lock around them.
"""

from __future__ import annotations

import datetime as _dt
import queue
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.lock import hold
from conformance.records import CheckResult, Header, Status, is_cuda_fault, is_cuda_oom, is_harness_cuda_fault
from conformance.results_writer import append_record, Appender
from conformance.running.outcome import RunSummary, short_reason
from conformance.running.outfile import check_resume, check_writable, move_aside, read_for_resume, repair_tail
from conformance.running.pairs import (
    RunConfig,
    _account,
    _close_all,
    _compile_keys,
    _Pair,
    _progress,
    _retry_units,
    _Writer,
    _counts_text,
    check_backend_names,
    describe_backends,
    reply_record,
)
from conformance.running.compile_phase import CompileStats, compile_first
from conformance.running.plan import Plan, Selected, plan_pairs, select_run
from conformance.running.pool import Outcome, WorkFeed, serve
from conformance.running.profile import RunClock, profile_records
from conformance.running.schedule import load_costs
from conformance.running.spares import Spares, spares_for
from conformance.running.selection import (
    parse_shard,
    select_cases,
    Selection,
)
from conformance.exits import OutputError, UsageError
from conformance.running.worker import Reply, WorkerClient

if TYPE_CHECKING:
    pass

__all__ = [
    "Plan",
    "RunConfig",
    "RunState",
    "RunSummary",
    "Selected",
    "Selection",
    "UsageError",
    "check_backend_names",
    "describe_backends",
    "execute",
    "is_cuda_oom",
    "parse_shard",
    "plan_pairs",
    "repair_tail",
    "reply_record",
    "run",
    "run_header",
    "select_cases",
    "select_run",
    "summarize",
]


def run_inputs(config: RunConfig) -> list[Path]:
    """The files a run reads (``--case-json @FILE``, ``--tol-file``, the ``--ledger-dir`` ledgers): no output
    may name one of them."""
    found = [Path(config.case_json[1:])] if config.case_json and config.case_json.startswith("@") else []
    if config.tol_file:
        found.append(Path(config.tol_file))
    if config.ledger_dir is not None and config.ledger_dir.is_dir():
        found += sorted(config.ledger_dir.glob("*.toml"))
    return found


def _previous(config: RunConfig, identity: dict[str, Any]) -> dict[tuple[str, str], CheckResult]:
    """The records of the file ``resume`` continues, once it reads cleanly (:func:`read_for_resume`) and its
    headers say it holds this sweep; its cut tail is then repaired, so appends start on a fresh line or member."""
    if not config.resume:
        return {}
    previous = read_for_resume(config.out, allow_skipped=config.allow_skipped)
    if previous is None:
        return {}
    has_records = bool(previous.headers or previous.results or len(previous.skipped) > previous.cut_tail)
    check_resume(config.out, previous.headers, identity, has_records=has_records)
    repair_tail(config.out, previous)
    return {(r.case_id, r.backend): r for r in previous.results}


def run(config: RunConfig) -> RunSummary:
    """Run the sweep described by ``config``; raises :class:`UsageError` for a bad selection, or when another
    command holds the results file (:mod:`conformance.lock`: the lock is held for the whole run).

    Ctrl-C (``KeyboardInterrupt``) during the sweep does not propagate: the workers are stopped, the records that
    arrived are kept, and the summary returned has ``interrupted`` set (exit status 130)."""
    if config.compile_only:  # warmup: no results file, nothing to hold
        return _run(config)
    check_writable(config.out, "--out", run_inputs(config))  # a directory, device or FIFO refused before the lock
    with hold(config.out, "--out"):
        return _run(config)


@dataclass
class RunState:
    """How far a run got, for :func:`summarize`: filled in by :func:`run`'s parts as they go."""

    #: the run's clock (its start, the parent's writer time)
    clock: RunClock
    #: workers the plan uses (0 before there is a plan)
    workers: int = 0
    #: records in the summary before this run's first (the resumed file's)
    n_before: int = 0
    #: seconds from the start to the first check (None before the checks)
    checks_at: float | None = None
    #: the spare workers restarts take (:mod:`conformance.running.spares`), closed by :func:`summarize`
    spares: Spares | None = None


def run_header(
    config: RunConfig,
    selected: Selected,
    plan: Plan,
    env: dict[str, Any],
    infos: dict[str, dict[str, str]],
    *,
    compile: CompileStats | None,
    checks_at: float,
    started: str,
) -> Header:
    """The header line of this run's segment of the results file: the suite (``custom`` for ``--case-json``
    alone), the backends by name, ``env`` with the run's options (``env.run``), ``argv``, ``started``, the sweep
    identity (``sweep``) and the selection (``selection``: :meth:`Selection.to_json`)."""
    placements = selected.placements
    gpus = [p.gpu for p in placements[: max(1, plan.workers)] if p.gpu is not None]
    run_info = {
        "device": config.device,
        "seed": config.seed,
        "shard": list(config.shard) if config.shard else None,
        "timeout_s": config.timeout,
        "time": config.time,
        "tol": list(config.tol),
        "tol_file": config.tol_file,
        "cases": len(selected.cases),
        "resume": config.resume,
        "already_recorded": plan.already_recorded,
        "jobs": plan.workers,
        "gpus": sorted(set(gpus), key=gpus.index) if gpus else None,
        "workers": [p.to_json() for p in placements[: plan.workers]],
        "schedule": config.schedule,
        "spare_workers": spares_for(config.spare_workers, config.time),
        "compile": compile.to_json() if compile else None,
        "checks_at_s": checks_at,
    }
    return Header(
        suite=config.suite or "custom",
        backends={infos[s]["name"]: infos[s] for s in config.backends},
        env={**env, "run": run_info},
        argv=list(config.argv),
        started=started,
        sweep=selected.identity,
        selection=selected.selection.to_json(),
    )


def execute(
    config: RunConfig,
    selected: Selected,
    plan: Plan,
    clients: list[WorkerClient],
    summary: RunSummary,
    state: RunState,
    *,
    env: dict[str, Any],
    infos: dict[str, dict[str, str]],
    jit: list[str],
) -> None:
    """The execution part of a run: the compile phase (with several workers or ``--compile-only``: each JIT
    kernel of ``jit`` compiled once over the workers; ``--compile-only`` stops there), then the header
    (:func:`run_header`) appended to ``config.out`` and every unit of ``plan`` run on ``clients`` (one per
    placement, ``plan.workers`` of them used), each record appended as it arrives and counted into ``summary``;
    CUDA OOMs of workers sharing a GPU are run again at the end, one worker per GPU.  ``state`` says how far it
    got.  :class:`OutputError` when the file cannot be written; a ``KeyboardInterrupt`` propagates once the
    workers are stopped and every record that arrived is on disk."""
    units, workers, placements = plan.units, plan.workers, selected.placements
    clock = state.clock
    unit_keys = _compile_keys(clients[0], config, units, jit) if workers > 1 or config.compile_only else {}
    if unit_keys and (config.compile_only or config.compile_phase):
        summary.compile = CompileStats()  # filled in place: Ctrl-C in the phase still reports what it did
        compile_first(
            clients[:workers], units, unit_keys, seed=config.seed, device=config.device,
            timeout=config.timeout, progress=config.progress, stats=summary.compile,
        )  # fmt: skip
    if config.compile_only:
        summary.workers = summary.compile.workers if summary.compile else 0
        return
    state.checks_at = checks_at = round(time.perf_counter() - clock.t_start, 3)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    header = run_header(
        config, selected, plan, env, infos, compile=summary.compile, checks_at=checks_at, started=started
    )
    try:
        append_record(config.out, header)
    except OSError as exc:
        raise OutputError(f"--out {config.out}: cannot write: {exc.strerror or exc}") from None
    summary.skipped = len(plan.pairs) - len(plan.todo)
    summary.keep_recorded(plan.recorded)
    summary.backends = {
        infos[s]["name"]: infos[s].get("unavailable_reason", "?") if infos[s].get("available") == "no" else ""
        for s in config.backends
    }
    summary.workers = workers
    state.n_before = len(summary.results)

    #: (case id, backend name) -> its pair; deferred pairs (CUDA OOMs, harness CUDA faults) and the extra their
    #: final record carries (its key, the first error), for the retry phase
    pair_of = {(p.case.id, infos[p.spec]["name"]): p for u in units for p in u}
    deferred: list[_Pair] = []
    retried: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    sharing = Counter(p.gpu for p in placements[:workers])  # workers per GPU (None: the one device)
    #: per worker slot, the pair its current process ran last (None: a fresh process), to name what broke a context
    last_pair: dict[int, str | None] = {}

    def judge(pair: _Pair, reply: Reply, worker: int) -> tuple[CheckResult, bool]:
        t0 = time.perf_counter()
        record = reply_record(reply, pair.case, pair.spec, infos[pair.spec], config)
        extra = {**record.extra, "worker": worker}
        if placements[worker].gpu is not None:
            extra["gpu"] = placements[worker].gpu
        if (pair.case.id, pair.spec) in retried:
            name, first = retried[pair.case.id, pair.spec]
            extra[name] = first
        # A CUDA error (harness or kernel) names the worker's previous pair (None: a fresh process), where a sticky
        # error left behind would come from.
        if is_cuda_fault(record):
            extra["context_broken_after"] = last_pair.get(worker)
        # An ERROR on CUDA may have poisoned the worker's context, and one that ran out of memory holds a
        # large allocator cache: it is replaced before its next request; so is one whose kernel wrote into
        # memory it was not given (check_backend's guard: ``wrote_outside``), which may have hit more than the
        # case's tensors.
        restart = (record.status is Status.ERROR and (config.device.startswith("cuda") or is_cuda_oom(record))) or (
            "wrote_outside" in record.extra
        )
        last_pair[worker] = None if restart else f"{pair.case.id} {record.backend}"
        clock.judged(extra, reply, time.perf_counter() - t0)
        return replace(record, extra=extra), restart

    def deliver(outcome: Outcome, writer: _Writer, shared: Counter) -> bool:
        """Write a finished record, or defer it (False): a CUDA OOM of a worker that shared its GPU, or a harness
        CUDA fault (the worker's context broken before this pair's kernel ran), each once."""
        record = outcome.record
        n = shared[placements[outcome.worker].gpu]
        if n > 1 and is_cuda_oom(record):
            why: tuple[str, dict[str, Any]] | None = ("oom_retry", {"workers_sharing": n})
        elif is_harness_cuda_fault(record):
            why = ("harness_retry", {"after": record.extra.get("context_broken_after")})
        else:
            why = None
        if why is not None:
            pair = pair_of[record.case_id, record.backend]
            if (pair.case.id, pair.spec) not in retried:  # once: the run again's record is final
                name, first = why
                retried[pair.case.id, pair.spec] = (name, {"first_error": short_reason(record.reason), **first})
                deferred.append(pair)
                return False
        clock.written(record.extra)
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
                clock.batch(time.perf_counter() - t0, wrote)
        finally:
            if ended < len(ids):  # interrupted or a worker could not start: stop the others now
                stop.set()
                if state.spares is not None:
                    state.spares.close()  # a slot waiting for a spare stops waiting; none starts any more
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
            writer.sync(force=True)  # every record that arrived is on disk before the phase returns

    weigh = (lambda unit: plan.unit_cost[unit[0].case.id]) if config.schedule == "cost" else None
    feed = WorkFeed(units, keys=lambda unit: unit_keys.get(unit[0].case.id, ()), cost=weigh)
    for key, holder in (summary.compile.owner if summary.compile else {}).items():
        feed.hold(holder, key)  # the worker that compiled a kernel runs its cases first
    label = (config.suite or "cases") + (f" ({workers} workers)" if workers > 1 else "")
    with _progress(config, len(plan.todo)) as bar, Appender(config.out) as appender:
        writer = _Writer(appender)
        task = bar.add_task(label, total=len(plan.todo), counts="")
        phase(list(range(workers)), feed, sharing, writer, bar, task)
        if deferred:
            # Alone: one worker per GPU (the first placed on it), every other worker and every spare closed so
            # that its CUDA context and allocator cache are gone too.
            first: dict[str | None, int] = {}
            for i in range(workers):
                first.setdefault(placements[i].gpu, i)
            alone = sorted(first.values())
            others = [clients[i] for i in range(workers) if i not in alone]
            _close_all(others)
            if state.spares is not None:
                state.spares.drain()  # a spare would share the GPU too; a restart now starts its own worker
            summary.oom_retries = sum(retried[p.case.id, p.spec][0] == "oom_retry" for p in deferred)
            summary.harness_retries = len(deferred) - summary.oom_retries
            retry = _retry_units(deferred)
            bar.update(task, description=f"{label}: {len(deferred)} pair(s) again, one worker per GPU")
            phase(alone, WorkFeed(retry), Counter(placements[i].gpu for i in alone), writer, bar, task)


def summarize(summary: RunSummary, clients: list[WorkerClient], state: RunState) -> RunSummary:
    """The summary part of a run, whatever happened before (it runs in a ``finally``): every worker of ``clients``
    closed, their starts counted, the wall time since ``state.clock`` started and the profile of this run's
    records (those past ``state.n_before``) put into ``summary``, which is returned."""
    if state.spares is not None:
        state.spares.close()
    summary.worker_starts = sum(c.starts for c in clients)
    _close_all(clients)
    summary.wall_s = time.perf_counter() - state.clock.t_start
    summary.profile = profile_records(
        summary.results[state.n_before :],
        wall_s=summary.wall_s,
        workers=state.workers or None,
        checks_at_s=state.checks_at,
    )
    summary.profile.live = state.clock.live(
        [s for c in clients for s in c.start_s],
        waits=[c.wait_s for c in clients],
        from_spare=sum(c.adopted for c in clients),
        spares=state.spares.stats() if state.spares is not None else None,
    )
    summary.profile.compile = summary.compile.to_json() if summary.compile else None
    return summary


def _run(config: RunConfig) -> RunSummary:
    """The four parts in order: :func:`select_run`, the resumed file read (:func:`_previous`), the backends
    described and the file moved aside (a fresh run), :func:`plan_pairs`, :func:`execute`, :func:`summarize`;
    Ctrl-C after the selection returns the summary with ``interrupted`` set."""
    clock = RunClock(time.perf_counter())
    selected = select_run(config)
    if selected.warning:
        print(f"attnconf run: {selected.warning}", file=sys.stderr)
    done = _previous(config, selected.identity)
    measured = [*load_costs(config.costs), *done.values()] if config.costs else list(done.values())
    clients = [WorkerClient(env=p.env()) for p in selected.placements]
    summary = RunSummary(out=config.out, compile_only=config.compile_only)
    spares = Spares(spares_for(config.spare_workers, config.time))
    state = RunState(clock, spares=spares)
    try:
        for client in clients[1 : len(selected.cases)]:
            client.spawn()  # their imports overlap the first worker's describe
        env, infos, jit = describe_backends(clients[0], config)
        for client in clients:
            client.preload = list(config.backends)
            client.spares = spares.take  # a restart takes a started worker (lazily: after the first)
        if not config.compile_only and not config.resume and config.out.exists():
            # A fresh run starts a new file, and every earlier one is kept: a repro command pasted from a
            # report (default --out) must not destroy the sweep it came from.
            backup = move_aside(config.out)
            print(f"attnconf run: moved the existing {config.out} to {backup}", file=sys.stderr)
        plan = plan_pairs(config, selected, infos, done, measured)
        state.workers = plan.workers
        execute(config, selected, plan, clients, summary, state, env=env, infos=infos, jit=jit)
    except KeyboardInterrupt:
        # execute() has stopped the workers and fsync'ed every record that arrived; the pairs in flight are lost
        summary.interrupted = True
    finally:
        summarize(summary, clients, state)
    return summary
