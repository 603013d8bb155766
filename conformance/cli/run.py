"""``attnconf run``: its subparser (the options themselves are :mod:`conformance.running.run_args`, which the
shard merge re-reads too) and the command, a :class:`~conformance.running.runner.RunConfig` handed to the runner.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from conformance.cases.suite_descriptions import suites_epilog
from conformance.exits import UsageError
from conformance.running.run_args import add_run_arguments

__all__ = ["add_parser", "add_warmup_parser", "run", "warmup"]


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
    """``attnconf run``: the options as a :class:`~conformance.running.runner.RunConfig`, run by the runner."""
    from conformance.running.runner import RunConfig, main_run, parse_shard
    from conformance.running.usage import device_and_backends

    device, backends = device_and_backends("run", args.device, args.backend)
    config = RunConfig(
        backends=tuple(backends),
        suite=args.suite or ("models" if args.model else None),
        device=device,
        out=args.out,
        resume=args.resume,
        shard=parse_shard(args.shard) if args.shard else None,
        timeout=args.timeout,
        seed=args.seed,
        case_patterns=tuple(args.case),
        case_json=args.case_json,
        time=args.time,
        tol=tuple(args.tol),
        tol_file=args.tol_file,
        limit=args.limit,
        progress=not args.no_progress,
        argv=("attnconf", *argv),
        jobs=args.jobs,
        gpus=args.gpus,
        exclude=tuple(args.exclude),
        features=tuple(args.feature),
        exclude_features=tuple(args.exclude_feature),
        models=tuple(args.model),
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
