"""``attnconf run``: its subparser (the options themselves are :mod:`conformance.running.run_args`, which the
shard merge re-reads too) and the command, a :class:`~conformance.running.runner.RunConfig` handed to the runner;
:func:`main_run` ends it (the ledger's verdict, the ``--json`` summary, the ``--report``), here and not in
``running/`` because the report is a layer above the runner.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.suites.descriptions import suites_epilog
from conformance.exits import Exit, UsageError
from conformance.running.run_args import add_run_arguments

if TYPE_CHECKING:
    from conformance.running.outcome import RunSummary
    from conformance.running.pairs import RunConfig

__all__ = ["add_parser", "add_warmup_parser", "main_run", "run", "warmup"]


def add_parser(sub) -> None:
    """The ``run`` subparser."""
    r = sub.add_parser(
        "run",
        help="run a suite against backends, one JSON line per (case, backend)",
        description="Exit status: 0 when every problem (fail, error, crash, timeout) of the selected (case, "
        "backend) pairs is a known failure of the ledger (--ledger-dir) and every selected backend judged at "
        "least one case; 1 when some problem is unexpected (with --strict: any problem, or a case a ledger entry "
        "expects to fail passing); 4 when a selected backend judged no case: every one of its pairs unsupported, "
        "e.g. a backend not installed on this machine (unless --allow-unjudged; 1 takes precedence); 130 when "
        "interrupted (Ctrl-C: the records are kept; the message gives the --resume command); 2 on usage errors "
        "(an --out, --json or --report that is a directory, a device, a FIFO or an input included); 3 when --out or "
        "--json cannot be written (read-only, disk full; the records before are kept). With --report DIR the report "
        "of the results file is written after the run and the exit status stays the run's (a report that cannot "
        "be written then is 3, or 2, only when the run itself exits 0). "
        "The run ends with its verdict line (exit N: why), the count of each status (each status but pass that "
        "occurred explained in a line: unsupported means the backend declares it cannot run the case), then every "
        "unexpected problem (status, backend, case id, reason, repro command), the known ones counted per ledger "
        "entry and each backend that judged nothing, with its refusal reason, and then the verdict line again; "
        "--profile adds where the time went; --json writes the same as JSON. A record marked pass whose statistics "
        "are NaN or inf counts as a fail. Progress goes to stderr: a bar in a terminal, else (a CI log) a line per "
        "10% of the pairs.",
        epilog=suites_epilog(),
    )
    add_run_arguments(r)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """``attnconf run``: the options as a :class:`~conformance.running.runner.RunConfig` (its selection parsed once,
    :meth:`~conformance.running.selection.Selection.from_args`), run by the runner."""
    from conformance.running.runner import RunConfig, Selection
    from conformance.running.usage import device_and_backends

    device, backends = device_and_backends("run", args.device, args.backend)
    config = RunConfig.from_selection(
        Selection.from_args(args, device=device, backends=backends),
        out=args.out,
        resume=args.resume,
        timeout=args.timeout,
        time=args.time,
        tol=tuple(args.tol),
        tol_file=args.tol_file,
        progress=not args.no_progress,
        argv=("attnconf", *argv),
        jobs=args.jobs,
        spare_workers=args.spare_workers,
        gpus=args.gpus,
        strict=args.strict,
        ledger_dir=args.ledger_dir,
        summary_json=args.summary_json,
        report=args.report,
        allow_unjudged=args.allow_unjudged,
        profile=args.profile,
        compile_only=args.compile_only,
        compile_phase=args.compile_phase,
        schedule=args.schedule,
        costs=args.costs,
        allow_skipped=args.allow_skipped,
    )
    if config.compile_only and config.resume:
        raise UsageError("--resume: --compile-only (warmup) writes no results file, so there is nothing to resume")
    if config.compile_only and config.report is not None:
        raise UsageError("--report: --compile-only (warmup) writes no results file, so there is nothing to report")
    return main_run(config)


def main_run(config: RunConfig) -> int:
    """Run, print the end of the run to stderr (:meth:`~conformance.running.outcome.RunSummary.terminal`: the
    verdict line first, the counts explained, the timings with ``--profile``, the listing of problems: unexpected
    ones, known ones per ledger entry), write the ``--json`` summary and, unless interrupted, the ``--report``
    (:func:`_write_report`); the exit status of ``attnconf run``
    (:attr:`conformance.running.outcome.RunSummary.exit_code`)."""
    from conformance.ledger.entries import load_ledger_dir
    from conformance.outputs import check_outputs
    from conformance.running.outcome import resume_command
    from conformance.running.runner import run as run_sweep, run_inputs

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
    summary = run_sweep(config)
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
    from conformance.running.outcome import LIST_MAX, short_reason

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


#: ``run`` options ``warmup`` does not list: about the results file, the verdict or the checks' order
_NOT_FOR_WARMUP = {"out", "resume", "time", "strict", "allow_unjudged", "ledger_dir", "profile", "compile_only",
                   "compile_phase", "schedule", "costs", "report"}  # fmt: skip


def add_warmup_parser(sub) -> None:
    """The ``warmup`` subparser: ``run``'s options, for ``run --compile-only``."""
    w = sub.add_parser(
        "warmup",
        help="compile the JIT kernels (FA4) of a selection into their disk cache; no results file",
        description="attnconf run --compile-only: select cases and backends as run does, compile each distinct "
        "kernel of the JIT backends (those with a compile key, FA4) once, spread over the workers and GPUs, into "
        "the backend's persistent cache (FA4: FLASH_ATTENTION_CUTE_DSL_CACHE_DIR), and write no results file "
        "(--out and --resume are refused). A kernel that does not compile is listed and left to the checks of "
        "a later run. Exit status 0 (130 when interrupted), 2 on usage errors.",
        epilog=suites_epilog(),
    )
    add_run_arguments(w)
    w.set_defaults(out=None, compile_only=True)
    for action in w._actions:  # run's options that mean nothing without checks: accepted (or refused), not listed
        if action.dest in _NOT_FOR_WARMUP:
            action.help = argparse.SUPPRESS


def warmup(args: argparse.Namespace, argv: list[str]) -> int:
    """``attnconf warmup``: ``attnconf run --compile-only`` with the same options."""
    if args.out is not None:
        raise UsageError("--out: warmup writes no results file (it fills the kernels' disk cache)")
    args.out = Path("results.jsonl")  # unused: nothing is written
    args.compile_only = True
    return run(args, argv)
