"""The arguments of ``attnconf run``, apart from the command line that offers them.

Two readers need them: the command line (:mod:`conformance.cli`), which parses what a user types, and the
shard merge (:mod:`conformance.reporting.shards`), which re-parses the ``argv`` of a results file's header written
before the header held its selection (``Header.selection``) to rebuild the cases that run selected
(:func:`selection_from_argv`).  Keeping them here, in the running
layer, lets the report layer read a run's options without importing the command line (that was an import cycle:
``cli`` -> ``reporting.shards`` -> ``cli``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from conformance.running.selection import add_selection_args, Selection
from conformance.exits import UsageError
from conformance.running.usage import bounded_int, device_spec, positive_int, positive_seconds, seed_int

__all__ = ["add_run_arguments", "parse_run_argv", "selection_from_argv"]


def _jobs(text: str) -> int | None:
    """``--jobs``: ``auto`` (None) or an integer >= 1 (:func:`conformance.running.pool.parse_jobs`)."""
    from conformance.running.pool import PlacementError, parse_jobs

    try:
        return parse_jobs(text)
    except PlacementError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--jobs ")) from None


def _spares(text: str) -> int | None:
    """``--spare-workers``: ``auto`` (None: :func:`conformance.running.spares.spares_for`) or an integer in
    [0, :data:`~conformance.running.spares.MAX_SPARES`]."""
    from conformance.running.spares import MAX_SPARES

    if text == "auto":
        return None
    try:
        return bounded_int(0, MAX_SPARES)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"must be auto or {str(exc).removeprefix('must be ')}") from None


def _gpus(text: str) -> str:
    """``--gpus``: checked here (``all`` or ``0,1,...``), resolved against the visible GPUs by the runner."""
    from conformance.running.pool import PlacementError, parse_gpus

    try:
        parse_gpus(text)
    except PlacementError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--gpus ")) from None
    return text


def _shard(text: str) -> str:
    """``--shard``: checked here (``I/N``, 0 <= I < N), parsed again by the command
    (:func:`conformance.running.selection.parse_shard`)."""
    from conformance.running.selection import parse_shard

    try:
        parse_shard(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--shard ")) from None
    return text


def add_run_arguments(r: argparse.ArgumentParser) -> None:
    """Every option of ``attnconf run``, in the order ``--help`` lists them."""
    r.add_argument(
        "--suite", metavar="NAME", help="suite name (listed below and by `attnconf suites`); optional with --case-json"
    )
    r.add_argument(
        "--backend",
        action="append",
        metavar="NAME",
        help="registry name or module:Class; repeat for several (cases outer, backends inner); "
        "default: every installed backend available on the device",
    )
    r.add_argument(
        "--device",
        type=device_spec,
        default="auto",
        help="cpu, cuda, cuda:N or auto (cuda when present; default); refused (exit 2) before anything runs when "
        "this machine has no such device, or when a --backend does not run on it",
    )
    r.add_argument(
        "--out",
        type=Path,
        default=Path("results.jsonl"),
        help="results file (default results.jsonl; NAME.jsonl.gz: gzipped); without --resume an existing one "
        "moves to the first free numbered backup NAME.1.jsonl, NAME.2.jsonl, ... (never overwritten); a directory, "
        "device, FIFO or an input of the run is refused (exit 2), an unwritable path is exit 3, before any worker "
        "starts; one run at a time per file: a second one refuses (exit 2) naming the pid of the first",
    )
    r.add_argument(
        "--resume",
        action="store_true",
        help="keep the file's records and run only the missing (case, backend) pairs (a gzipped file gets gzip "
        "members); a killed run's cut last line or gzip member is dropped; refused (exit 2) when the file holds "
        "another sweep (suite, selection, seed, device or tolerance differ), a (case, backend) pair twice, lines "
        "that are not records (see --allow-skipped) or was written by a newer attnconf",
    )
    r.add_argument(
        "--allow-skipped",
        action="store_true",
        help="with --resume: keep lines of the file that are not records (a garbled line; the refusal names "
        "them) instead of refusing the file, and run the pairs it lacks; readers then need --allow-skipped too",
    )
    r.add_argument("--shard", type=_shard, metavar="I/N", help="run every N-th case starting at the I-th (0 <= I < N)")
    r.add_argument(
        "--timeout",
        type=positive_seconds,
        default=300.0,
        help="seconds per (case, backend) before the worker is killed: finite, > 0 and at most a week, 604800 "
        "(default 300)",
    )
    r.add_argument("--seed", type=seed_int, default=0, help="input seed, 0 <= SEED < 2**32 (default 0)")
    add_selection_args(r)
    r.add_argument(
        "--case-json",
        metavar="JSON",
        help="a case (a JSON object of AttentionCase fields) or a list of them, inline or @FILE (UTF-8); refused "
        "(exit 2, one line naming the case, numbered from 0, the field and the constraint) on an unknown or "
        "missing field, a wrong JSON type, a non-finite number, an integer beyond 64 bits or a value the case "
        "model refuses",
    )
    r.add_argument("--time", action="store_true", help="time each kernel (conformance.perf.timing)")
    r.add_argument(
        "--tol",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="tolerance override (conformance.verdict.tolerance), repeatable",
    )
    r.add_argument("--tol-file", metavar="TOML", help="tolerance overrides from a TOML file (below --tol)")
    r.add_argument("--limit", type=positive_int, help="at most N >= 1 cases (after the filters and --shard)")
    r.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr (by default a bar in a terminal, else a line per 10%% of the pairs)",
    )
    r.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N|auto",
        help="crash-isolated workers at once, in total, 1 to 1024 (each is a process holding torch; default auto, "
        "counting the cores this process may run on (taskset, a cpuset): on cpu one per core, at most 16; on cuda "
        "one per core but one, at most 16 per GPU and 32 in all, at least one per GPU; with --time one per GPU, "
        "or 1 on cpu)",
    )
    r.add_argument(
        "--spare-workers",
        type=_spares,
        default=None,
        metavar="N|auto",
        help="after a worker's first restart (a crash, a timeout, a CUDA error), keep N workers per placement "
        "(GPU) started and loaded, so a restart takes one instead of waiting seconds for a new worker; 0 to 16 "
        "(default auto: 2, or 0 with --time, whose timed kernels would share the CPU with a spare's start)",
    )
    r.add_argument(
        "--gpus",
        type=_gpus,
        default=None,
        metavar="all|0,1,..",
        help="GPUs the workers go to, round-robin, each worker seeing its GPU as cuda:0 through "
        "CUDA_VISIBLE_DEVICES (needs --device cuda; default with --device cuda: all visible GPUs)",
    )
    r.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 on known failures (ledger) and unexpected passes too, not only on unexpected problems",
    )
    r.add_argument(
        "--allow-unjudged",
        action="store_true",
        help="exit 0, not 4, when a selected backend judged no case (every one of its pairs unsupported, e.g. a "
        "backend not installed here): for a selection that legitimately holds no case a backend supports; the "
        "listing and --json still name it",
    )
    r.add_argument(
        "--ledger-dir",
        type=Path,
        help="known-failure ledgers (default conformance/ledgers); refused (exit 2) when missing, not a directory "
        "or holding a malformed ledger",
    )
    r.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        dest="summary_json",
        help="write a JSON summary here: exit status, counts, every unexpected problem with its repro, known "
        "problems per ledger entry, unexpected passes, wall time, the results file, the compile phase and where "
        "the time went (profile); never --out or an input (exit 2); an earlier summary is replaced, any other "
        "file there kept as a numbered backup",
    )
    r.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="after the run, write the report of the results file (the whole file, a resumed run's earlier records "
        "included) into DIR: report.md, report.html and the PNGs, as attnconf report FILE --out DIR writes them "
        "(an earlier report there is replaced, any other file of those names kept as a numbered backup); the exit "
        "status stays the run's; DIR is checked before any worker starts (a file, or one naming --out or --json, "
        "exit 2; unwritable, exit 3); not written when the run is interrupted",
    )
    r.add_argument(
        "--profile",
        action="store_true",
        help="print where the time went at the end (by default the end shows the verdict, the counts and the "
        "problems only): the median times per record and per worker phase, and per backend, seconds of inputs, "
        "reference, baseline, "
        "prepare, compile, kernel, verdict, encode, IPC, worker idle and parent work; the run's wall time, "
        "workers, idle capacity, when the last pairs finished, the slowest cases (every record carries its "
        "timings; attnconf report rebuilds the table from the file)",
    )
    r.add_argument(
        "--compile-only",
        action="store_true",
        help="only the compile phase: compile each JIT kernel (FA4) of the selection once into its disk cache, "
        "spread over the workers, and write no results file (attnconf warmup is the same; for baking a CI image)",
    )
    r.add_argument(
        "--no-compile-phase",
        action="store_false",
        dest="compile_phase",
        help="let JIT backends compile inside the checks (default: with several workers, every distinct kernel "
        "is compiled once, spread over the workers, before the checks start)",
    )
    r.add_argument(
        "--schedule",
        choices=("cost", "fifo"),
        default="cost",
        help="order the cases go to workers: cost (default: longest first, by measured times from --costs or "
        "the resumed file, else by the case's size) or fifo (the selection's order)",
    )
    r.add_argument(
        "--costs",
        type=Path,
        metavar="FILE",
        help="a results file of an earlier run of these cases: its measured times order the cases (--schedule cost)",
    )


class _Quiet(argparse.ArgumentParser):
    """A parser that raises :class:`UsageError` instead of printing and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def parse_run_argv(argv: list[str]) -> argparse.Namespace:
    """The options of a recorded ``attnconf run`` command line (``argv`` without ``attnconf run``);
    :class:`UsageError` when this version does not read them (a flag it lacks, a value it refuses)."""
    parser = _Quiet(prog="attnconf run", add_help=False)
    add_run_arguments(parser)
    return parser.parse_args(argv)


def selection_from_argv(argv: list[str]) -> Selection | None:
    """The selection of a recorded ``attnconf run`` command line (a header's ``argv``, ``attnconf run`` included)
    as :meth:`Selection.from_args` reads it (the device and backends as typed: ``--device auto`` stays ``auto``);
    None when ``argv`` is not an ``attnconf run`` (``fuzz``, ``merge``).  :class:`UsageError` when this version
    does not read it (:func:`parse_run_argv`)."""
    if len(argv) < 2 or argv[1] != "run":
        return None
    args = parse_run_argv(argv[2:])
    return Selection.from_args(args, device=args.device, backends=args.backend or ())
