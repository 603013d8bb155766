"""The sweep: every selected case against every backend, one JSON line per (case, backend).

Order is cases outer, backends inner, and a case goes to one worker with all of its backends, so the
worker computes the case's reference once and reuses it for every backend.  Kernels run in
:class:`~conformance.running.worker.WorkerClient` subprocesses, ``config.jobs`` of them at once
(:mod:`conformance.running.pool`: how many, on which GPU); a dead worker becomes a ``crash`` record,
a silent one a ``timeout`` record, and that worker alone is replaced by a fresh one.  Each worker has
its next request queued before it finishes the current one, so it never waits for the parent.

The parent is the only writer: records are appended as soon as they arrive, and the file is fsync'ed
once per batch of records that arrived together (before the parent waits again), so a killed run
loses at most the pairs in flight; ``resume`` skips the pairs already in the file, and refuses a file whose
header says it holds another sweep (:mod:`conformance.running.outfile`: suite, selection, seed, device,
tolerance).  Without ``resume`` an existing file is moved to the first free numbered backup
(``<name>.1.jsonl``, ``<name>.2.jsonl``, ...): no run deletes earlier results.  Ctrl-C stops the workers,
keeps every record that arrived (fsync'ed) and returns a summary that says it was interrupted (exit 130).

CUDA out of memory under sharing (:func:`is_cuda_oom`): an ``error`` record whose reason is a CUDA OOM (or
cuDNN's attention graph failing to execute, seen only under sharing),
from a worker that shares its GPU with others, is not written; the pair is deferred, its worker
restarted, and after the parallel phase the deferred pairs run again with one worker per GPU and every
other worker closed.  That record is final and carries ``extra["oom_retry"]`` (the first error and how
many workers shared the GPU).  A run killed before the retry has not written those pairs, so ``resume``
runs them again.  Cases go to workers by compile affinity (:class:`~conformance.running.pool.WorkFeed`,
keys from the first worker's ``keys`` op), so a JIT backend compiles each kernel in as few workers as it can.

Exit status of a run: :attr:`conformance.running.outcome.RunSummary.exit_code` (unexpected problems, by the
known-failure ledger; ``--strict``; 130 when interrupted).
"""

from __future__ import annotations

import datetime as _dt
import queue
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from conformance.records import CheckResult, Header, Status, append_record, read_records
from conformance.running.outcome import RunSummary, resume_command, short_reason
from conformance.running.outfile import check_resume, check_writable, move_aside, repair_tail, sweep
from conformance.running.pairs import (
    RunConfig,
    _account,
    _check_names,
    _close_all,
    _compile_keys,
    _describe,
    _Pair,
    _placements,
    _progress,
    _record,
    _retry_units,
    _timing_warning,
    _units,
    _Writer,
    _counts_text,
    is_cuda_oom,
)
from conformance.running.pool import Outcome, WorkFeed, serve
from conformance.running.selection import json_case_ids, parse_features, parse_models, parse_shard, select_cases
from conformance.exits import UsageError
from conformance.running.worker import Reply, WorkerClient

__all__ = [
    "RunConfig",
    "RunSummary",
    "UsageError",
    "is_cuda_oom",
    "main_run",
    "parse_shard",
    "repair_tail",
    "run",
    "select_cases",
]


def _previous(config: RunConfig, identity: dict[str, Any]) -> dict[tuple[str, str], CheckResult]:
    """The records of the file ``resume`` continues, once its headers say it holds this sweep."""
    if not config.resume or not config.out.exists():
        return {}
    try:
        headers, results = read_records(config.out)
        text = config.out.read_bytes().strip() != b""
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--resume: {config.out} cannot be read as a results file: {exc}") from None
    check_resume(config.out, headers, identity, has_records=text)
    repair_tail(config.out)
    return {(r.case_id, r.backend): r for r in results}


def run(config: RunConfig) -> RunSummary:
    """Run the sweep described by ``config``; raises :class:`UsageError` for a bad selection.

    Ctrl-C (``KeyboardInterrupt``) during the sweep does not propagate: the workers are stopped, the records that
    arrived are kept, and the summary returned has ``interrupted`` set (exit status 130)."""
    t_start = time.perf_counter()
    cases = select_cases(
        config.suite,
        config.case_patterns,
        config.case_json,
        config.shard,
        config.limit,
        exclude=config.exclude,
        features=config.features,
        exclude_features=config.exclude_features,
        models=config.models,
    )
    if not config.backends:
        raise UsageError("give at least one --backend")
    _check_names(config.backends)
    from conformance.running.worker import load_overrides

    try:
        overrides = load_overrides(list(config.tol), config.tol_file)  # the worker parses them again; fail fast
    except (OSError, ValueError, RuntimeError) as exc:
        raise UsageError(f"tolerance overrides: {exc}") from None
    check_writable(config.out)
    placements = _placements(config)
    warning = _timing_warning(config, placements)
    if warning:
        print(f"attnconf run: {warning}", file=sys.stderr)
    identity = sweep(
        suite=config.suite,
        cases=cases,
        json_ids=json_case_ids(config.case_json) if config.case_json else None,
        patterns=config.case_patterns,
        exclude=config.exclude,
        features=parse_features(config.features),
        exclude_features=parse_features(config.exclude_features, "--exclude-feature"),
        models=parse_models(config.models),
        shard=config.shard,
        limit=config.limit,
        seed=config.seed,
        device=config.device,
        tol=overrides,
        tol_args=config.tol,
        tol_file=config.tol_file,
    )
    done = _previous(config, identity)
    clients = [WorkerClient(env=p.env()) for p in placements]
    summary = RunSummary(out=config.out)
    try:
        for client in clients[1 : len(cases)]:
            client.spawn()  # their imports overlap the first worker's describe
        env, infos, jit = _describe(clients[0], config)
        for client in clients:
            client.preload = list(config.backends)
        if not config.resume and config.out.exists():
            # A fresh run starts a new file, and every earlier one is kept: a repro command pasted from a
            # report (default --out) must not destroy the sweep it came from.
            backup = move_aside(config.out)
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
        header = Header(
            suite=config.suite or "custom",
            backends={infos[s]["name"]: infos[s] for s in config.backends},
            env={**env, "run": run_info},
            argv=list(config.argv),
            started=started,
            sweep=identity,
        )
        try:
            append_record(config.out, header)
        except OSError as exc:
            raise UsageError(f"--out {config.out}: cannot write: {exc.strerror or exc}") from None
        summary.skipped = len(pairs) - len(todo)
        summary.results = [done[c.id, infos[s]["name"]] for c, s in pairs if (c.id, infos[s]["name"]) in done]
        summary.problems = sum(r.status.is_problem for r in summary.results)
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
                retried[pair.case.id, pair.spec] = {"first_error": short_reason(record.reason), "workers_sharing": n}
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
    except KeyboardInterrupt:
        # phase() has stopped the workers and fsync'ed every record that arrived; the pairs in flight are lost
        summary.interrupted = True
    finally:
        summary.worker_starts = sum(c.starts for c in clients)
        _close_all(clients)
        summary.wall_s = time.perf_counter() - t_start
    return summary


def main_run(config: RunConfig) -> int:
    """Run, print the summary and the listing of problems (unexpected ones, known ones per ledger entry) to
    stderr, write the ``--json`` summary; the exit status of ``attnconf run``
    (:attr:`conformance.running.outcome.RunSummary.exit_code`)."""
    from conformance.reporting.ledger import load_ledger_dir

    try:
        ledger = load_ledger_dir(config.ledger_dir)  # --ledger-dir missing, not a directory, malformed: exit 2
    except UsageError:
        raise
    except ValueError as exc:
        # The packaged ledgers are broken (a bug of this checkout): run anyway, every problem unexpected.
        print(f"attnconf run: the known-failure ledger cannot be read, so every problem counts: {exc}", file=sys.stderr)
        ledger = None
    if config.summary_json is not None:
        check_writable(config.summary_json, "--json")
    summary = run(config)
    if ledger is not None:
        summary.finish(ledger, config.strict)
    summary.strict = config.strict
    print(summary.text(), file=sys.stderr)
    print(summary.listing(), file=sys.stderr)
    if config.summary_json is not None:
        summary.write_json(config.summary_json, config.argv)
    if summary.interrupted:
        print(
            f"attnconf run: interrupted (Ctrl-C): the workers were stopped; {summary.written} record(s) of this run "
            f"are kept in {config.out} (fsync'ed), the pairs in flight were dropped; resume with: "
            f"{resume_command(config.argv)}",
            file=sys.stderr,
        )
    return summary.exit_code
