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

CUDA out of memory under sharing (:func:`is_cuda_oom`): an ``error`` record whose reason is a CUDA OOM (or
cuDNN's attention graph failing to execute, seen only under sharing),
from a worker that shares its GPU with others, is not written; the pair is deferred, its worker
restarted, and after the parallel phase the deferred pairs run again with one worker per GPU and every
other worker closed.  That record is final and carries ``extra["oom_retry"]`` (the first error and how
many workers shared the GPU).  A run killed before the retry has not written those pairs, so ``resume``
runs them again.  Cases go to workers longest first (:mod:`conformance.running.schedule`, ``--schedule``) and by
compile affinity (:class:`~conformance.running.pool.WorkFeed`, keys from the first worker's ``keys`` op); before
the checks, the compile phase (:mod:`conformance.running.compile_phase`) compiles each JIT kernel once over all
workers, and ``--compile-only`` (``attnconf warmup``) stops there, writing no results file.  Each record carries
its time split (``extra["t"]``, :mod:`conformance.running.profile`); the summary holds the run's profile.

Exit status of a run: :attr:`conformance.running.outcome.RunSummary.exit_code` (unexpected problems, by the
known-failure ledger; ``--strict``; 4 when a selected backend judged no case, unless ``--allow-unjudged``; 130
when interrupted).

Size: the sweep's one loop and its bookkeeping (selection, workers, records, resume, the summary it returns);
its parts live in :mod:`conformance.running.pairs`, :mod:`~conformance.running.pool` and their siblings.
"""

from __future__ import annotations

import datetime as _dt
import queue
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from conformance.lock import hold
from conformance.records import CheckResult, Header, Status
from conformance.results_writer import append_record, Appender
from conformance.running.outcome import LIST_MAX, RunSummary, resume_command, short_reason
from conformance.running.outfile import check_resume, check_writable, move_aside, read_for_resume, repair_tail, sweep
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
from conformance.running.compile_phase import CompileStats, compile_first
from conformance.running.pool import Outcome, WorkFeed, serve
from conformance.running.profile import RunClock, profile_records
from conformance.running.schedule import load_costs, schedule_units
from conformance.running.selection import json_case_ids, parse_features, parse_models, parse_shard, select_cases
from conformance.exits import Exit, OutputError, UsageError
from conformance.outputs import check_outputs
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


def _run(config: RunConfig) -> RunSummary:
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
    measured = [*load_costs(config.costs), *done.values()] if config.costs else list(done.values())
    clients = [WorkerClient(env=p.env()) for p in placements]
    summary = RunSummary(out=config.out, compile_only=config.compile_only)
    clock = RunClock(t_start)
    n_before, workers, checks_at = 0, 0, None
    try:
        for client in clients[1 : len(cases)]:
            client.spawn()  # their imports overlap the first worker's describe
        env, infos, jit = _describe(clients[0], config)
        for client in clients:
            client.preload = list(config.backends)
        if not config.compile_only and not config.resume and config.out.exists():
            # A fresh run starts a new file, and every earlier one is kept: a repro command pasted from a
            # report (default --out) must not destroy the sweep it came from.
            backup = move_aside(config.out)
            print(f"attnconf run: moved the existing {config.out} to {backup}", file=sys.stderr)
        pairs = [(c, s) for c in cases for s in config.backends]
        todo = {(c.id, s) for c, s in pairs if (c.id, infos[s]["name"]) not in done}
        units = _units(config, cases, todo, frozenset(s for s in config.backends if infos[s].get("available") == "yes"))
        names = {s: infos[s]["name"] for s in config.backends}
        units, unit_cost = schedule_units(units, names, measured, config.schedule)
        workers = min(len(placements), len(units))
        unit_keys = _compile_keys(clients[0], config, units, jit) if workers > 1 or config.compile_only else {}
        if unit_keys and (config.compile_only or config.compile_phase):
            summary.compile = CompileStats()  # filled in place: Ctrl-C in the phase still reports what it did
            compile_first(
                clients[:workers], units, unit_keys, seed=config.seed, device=config.device,
                timeout=config.timeout, progress=config.progress, stats=summary.compile,
            )  # fmt: skip
        if config.compile_only:
            summary.workers = summary.compile.workers if summary.compile else 0
            return summary
        gpus = [p.gpu for p in placements[: max(1, workers)] if p.gpu is not None]
        checks_at = round(time.perf_counter() - t_start, 3)
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
            "schedule": config.schedule,
            "compile": summary.compile.to_json() if summary.compile else None,
            "checks_at_s": checks_at,
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
            raise OutputError(f"--out {config.out}: cannot write: {exc.strerror or exc}") from None
        summary.skipped = len(pairs) - len(todo)
        summary.keep_recorded(done[c.id, infos[s]["name"]] for c, s in pairs if (c.id, infos[s]["name"]) in done)
        summary.backends = {
            infos[s]["name"]: infos[s].get("unavailable_reason", "?") if infos[s].get("available") == "no" else ""
            for s in config.backends
        }
        summary.workers = workers
        n_before = len(summary.results)

        #: (case id, backend name) -> its pair; deferred CUDA OOMs and their first error, for the retry phase
        pair_of = {(p.case.id, infos[p.spec]["name"]): p for u in units for p in u}
        deferred: list[_Pair] = []
        retried: dict[tuple[str, str], dict[str, Any]] = {}
        sharing = Counter(p.gpu for p in placements[:workers])  # workers per GPU (None: the one device)

        def judge(pair: _Pair, reply: Reply, worker: int) -> tuple[CheckResult, bool]:
            t0 = time.perf_counter()
            record = _record(reply, pair.case, pair.spec, infos[pair.spec], config)
            extra = {**record.extra, "worker": worker}
            if placements[worker].gpu is not None:
                extra["gpu"] = placements[worker].gpu
            if (pair.case.id, pair.spec) in retried:
                extra["oom_retry"] = retried[pair.case.id, pair.spec]
            # An ERROR on CUDA may have poisoned the worker's context, and one that ran out of memory holds a
            # large allocator cache: it is replaced before its next request; so is one whose kernel wrote into
            # memory it was not given (check_backend's guard: ``wrote_outside``), which may have hit more than the
            # case's tensors.
            restart = (record.status is Status.ERROR and (config.device.startswith("cuda") or is_cuda_oom(record))) or (
                "wrote_outside" in record.extra
            )
            clock.judged(extra, reply, time.perf_counter() - t0)
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

        weigh = (lambda unit: unit_cost[unit[0].case.id]) if config.schedule == "cost" else None
        feed = WorkFeed(units, keys=lambda unit: unit_keys.get(unit[0].case.id, ()), cost=weigh)
        for key, holder in (summary.compile.owner if summary.compile else {}).items():
            feed.hold(holder, key)  # the worker that compiled a kernel runs its cases first
        label = (config.suite or "cases") + (f" ({workers} workers)" if workers > 1 else "")
        with _progress(config, len(todo)) as bar, Appender(config.out) as appender:
            writer = _Writer(appender)
            task = bar.add_task(label, total=len(todo), counts="")
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
        summary.profile = profile_records(
            summary.results[n_before:], wall_s=summary.wall_s, workers=workers or None, checks_at_s=checks_at
        )
        summary.profile.live = clock.live([s for c in clients for s in c.start_s])
        summary.profile.compile = summary.compile.to_json() if summary.compile else None
    return summary


def main_run(config: RunConfig) -> int:
    """Run, print the end of the run to stderr (:meth:`~conformance.running.outcome.RunSummary.terminal`: the
    verdict line first, the counts explained, the timings with ``--profile``, the listing of problems: unexpected
    ones, known ones per ledger entry), write the ``--json`` summary and, unless interrupted, the ``--report``
    (:func:`_write_report`); the exit status of ``attnconf run``
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
    # every output checked before any worker starts: --json naming --out (the results) or an input is refused
    check_outputs([(config.out, "--out"), (config.summary_json, "--json")], run_inputs(config))
    if config.report is not None and not config.compile_only:
        from conformance.reporting.report_render import check_report_dir

        others = [(config.out, "--out"), (config.summary_json, "--json")]
        check_report_dir(config.report, run_inputs(config), "--report", others)
    summary = run(config)
    if config.compile_only:
        return _end_warmup(config, summary)
    if ledger is not None:
        summary.finish(ledger, config.strict)
    summary.strict = config.strict
    summary.allow_unjudged = config.allow_unjudged
    print(summary.terminal(timings=config.profile), file=sys.stderr)
    if config.summary_json is not None:
        summary.write_json(config.summary_json, config.argv)
    if summary.interrupted:
        print(
            f"attnconf run: interrupted (Ctrl-C): the workers were stopped; {summary.written} record(s) of this run "
            f"are kept in {config.out} (fsync'ed), the pairs in flight were dropped; resume with: "
            f"{resume_command(config.argv)}"
            + (f" (it writes --report {config.report} when it ends)" if config.report is not None else ""),
            file=sys.stderr,
        )
    elif config.report is not None:
        return _write_report(config, summary.exit_code)
    return summary.exit_code


def _write_report(config: RunConfig, code: int) -> int:
    """``--report DIR``: the report of the results file, written after the run; returns the exit status: the run's
    ``code``, or, when the report cannot be written and the run found nothing to fail on, the report's error's
    (2 refused, 3 unwritable: :mod:`conformance.exits`); the line on stderr says which, and how to write it again."""
    from conformance.reporting.report_render import write_report

    assert config.report is not None  # run() calls this for --report only
    again = f"attnconf report {config.out} --out {config.report}"
    try:
        md, html = write_report([config.out], config.report, config.ledger_dir, flag="--report")
    except ValueError as exc:  # UsageError, OutputError (exit 3), ResultsFileError, a ledger that cannot be read
        status = getattr(exc, "exit_code", Exit.USAGE)
        kept = f"; the run's exit status {code} stands" if code else ""
        print(f"attnconf run: --report {config.report}: not written: {exc}{kept}; retry: {again}", file=sys.stderr)
        return code or int(status)
    print(f"attnconf run: report: {html} and {md}", file=sys.stderr)
    return code


def _end_warmup(config: RunConfig, summary: RunSummary) -> int:
    """The end of ``attnconf warmup`` (``run --compile-only``): the compile phase's line, each kernel that did
    not compile (its pairs fail or crash in a sweep, with their own records), the ``--json`` summary; exit 0
    (130 when interrupted)."""
    print(f"attnconf warmup: {summary.text()}", file=sys.stderr)
    failed = summary.compile.failed if summary.compile is not None else []
    for f in failed[:LIST_MAX]:
        print(f"  not compiled: {f['backend']} {f['case_id']}: {short_reason(f['reason'], 200)}", file=sys.stderr)
    if len(failed) > LIST_MAX:
        print(f"  ... and {len(failed) - LIST_MAX} more (all of them in the --json summary)", file=sys.stderr)
    if config.summary_json is not None:
        summary.write_json(config.summary_json, config.argv)
    if summary.interrupted:
        print("attnconf warmup: interrupted (Ctrl-C): the kernels compiled so far are in the cache", file=sys.stderr)
    return summary.exit_code
