"""The ``attnconf fuzz`` subcommand: :func:`add_parser` registers it, :func:`main` runs it.

Exit status: 0 when no drawn or replayed case failed, errored, crashed or timed out; 1 otherwise (the groups
of failures are printed); 4 when a backend judged no drawn case (every draw it got unsupported, or it runs on
another device; unless ``--allow-unjudged``); 2 on usage errors (every numeric option is range-checked by the parser:
:mod:`conformance.running.usage`); 3 when the campaign file cannot be written
(:func:`conformance.fuzz.campaign.check_campaign_paths`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.running.usage import bounded_int, positive_seconds, seed_int

__all__ = ["MAX_HEADS", "MAX_SHRINK_STEPS", "MAX_TOKENS", "add_parser", "main"]

#: ``--max-tokens`` at most 2**17: a draw's work bound is ``max_tokens**2 * 128`` (about 2e12 there: hours of the
#: fp32 reference on a CPU); at least 64 (:class:`conformance.fuzz.draw.DrawLimits`).
MAX_TOKENS = 2**17
#: ``--max-heads`` at most 1024 (the largest models have 128 q heads; a draw enumerates every head pair up to it).
MAX_HEADS = 1024
#: ``--max-shrink-steps`` at most a million kernel evaluations per failure.
MAX_SHRINK_STEPS = 10**6


def _budget(text: str):
    """``--budget``, checked by the parser (:func:`conformance.fuzz.config.parse_budget`)."""
    from conformance.exits import UsageError
    from conformance.fuzz.config import parse_budget

    try:
        return parse_budget(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--budget ")) from None


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``fuzz`` to ``attnconf``'s subparsers."""
    from conformance.running.usage import device_spec

    f = subparsers.add_parser(
        "fuzz",
        help="random cases from the whole case space; failures shrunk to minimal cases and grouped",
        description="Draw seeded random cases from the case space, check them against backends (crash-isolated, "
        "same records as `run`), shrink every failure to a minimal case and group failures by the axis values "
        "their minimal cases share. Exit status: 0 if nothing failed, 1 otherwise, 4 when a backend judged no drawn "
        "case (e.g. a backend that runs on another device; unless --allow-unjudged; 1 takes precedence), 2 on "
        "usage errors (an --out that is a directory, a device, a FIFO or the --tol-file included), 3 when --out "
        "cannot be written.",
    )
    f.add_argument(
        "--backend",
        action="append",
        metavar="NAME",
        help="registry name or module:Class; repeat for several; default: every installed backend on the device",
    )
    f.add_argument(
        "--device",
        type=device_spec,
        default="auto",
        help="cpu, cuda, cuda:N or auto (cuda when present; default); refused (exit 2) when this machine has no "
        "such device, or when a --backend does not run on it",
    )
    f.add_argument(
        "--budget",
        type=_budget,
        default="100",
        help="a number of cases >= 1 (200) or this invocation's wall time > 0 (90s, 10m, 1h); default 100 cases",
    )
    f.add_argument(
        "--seed",
        type=seed_int,
        default=0,
        help="seed of the case stream (and of the inputs), 0 <= SEED < 2**32 as for run (default 0)",
    )
    f.add_argument(
        "--out",
        type=Path,
        default=Path("fuzz.jsonl"),
        help="results file (default fuzz.jsonl; NAME.jsonl.gz: gzipped); without --resume an existing one moves "
        "to the first free numbered backup NAME.1.jsonl, NAME.2.jsonl, ... (never overwritten); a directory, "
        "device or FIFO is refused (exit 2), an unwritable path is exit 3, before any worker starts; one command "
        "at a time per file: a second one refuses (exit 2) naming the pid of the first",
    )
    f.add_argument(
        "--resume",
        action="store_true",
        help="continue the file's seeded stream: check only missing pairs, finish missing or cut shrinks; refused "
        "(exit 2) for another campaign's file or one with lines that are not records (see --allow-skipped)",
    )
    f.add_argument(
        "--allow-skipped",
        action="store_true",
        help="with --resume: keep lines of the file that are not records (a garbled line) instead of refusing it",
    )
    f.add_argument(
        "--timeout",
        type=positive_seconds,
        default=300.0,
        help="seconds per check before the worker is killed: finite, > 0 and at most a week, 604800 (default 300)",
    )
    f.add_argument(
        "--max-shrink-steps",
        type=bounded_int(0, MAX_SHRINK_STEPS),
        default=200,
        help=f"evaluations spent shrinking one failure, at most, 0 to {MAX_SHRINK_STEPS} (default 200)",
    )
    f.add_argument(
        "--max-tokens",
        type=bounded_int(64, MAX_TOKENS),
        default=512,
        help=f"bound on the summed q and kv lengths of a drawn case, 64 to {MAX_TOKENS} (default 512: "
        "CPU-affordable); the work sum(q*kv)*h*(d+dv) is bounded by max_tokens**2 * 128",
    )
    f.add_argument(
        "--max-heads",
        type=bounded_int(1, MAX_HEADS),
        default=256,
        help=f"bound on the q heads of a drawn case, 1 to {MAX_HEADS} (default 256)",
    )
    f.add_argument(
        "--db",
        type=Path,
        metavar="DIR",
        help="Hypothesis example database: minimal failures are saved there and replayed first next time",
    )
    f.add_argument(
        "--tol",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="tolerance override (conformance.verdict.tolerance), repeatable",
    )
    f.add_argument("--tol-file", metavar="TOML", help="tolerance overrides from a TOML file (below --tol)")
    f.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress on stderr (by default a bar in a terminal, else a line per 10%% of the budget)",
    )
    f.add_argument(
        "--allow-unjudged",
        action="store_true",
        help="exit 0, not 4, when a backend judged no drawn case (the summary still names it)",
    )
    return f


def main(args: argparse.Namespace, argv: list[str]) -> int:
    """Run ``attnconf fuzz``; prints the summary and the failure groups to stderr."""
    from conformance.fuzz.campaign import FuzzConfig, run_fuzz
    from conformance.fuzz.draw import DrawLimits
    from conformance.running.runner import UsageError
    from conformance.running.usage import device_and_backends

    device, backends = device_and_backends("fuzz", args.device, args.backend)
    try:
        limits = DrawLimits(max_tokens=args.max_tokens, max_heads=args.max_heads)
    except ValueError as exc:
        raise UsageError(f"--max-tokens / --max-heads: {exc}") from None
    config = FuzzConfig(
        backends=tuple(backends),
        device=device,
        budget=args.budget,  # a Budget: the parser applies _budget to the default "100" too
        seed=args.seed,
        out=args.out,
        resume=args.resume,
        timeout=args.timeout,
        max_shrink_steps=args.max_shrink_steps,
        limits=limits,
        tol=tuple(args.tol),
        tol_file=args.tol_file,
        db=args.db,
        progress=not args.no_progress,
        argv=("attnconf", *argv),
        allow_unjudged=args.allow_unjudged,
        allow_skipped=args.allow_skipped,
    )
    summary = run_fuzz(config)
    print(summary.text(), file=sys.stderr)
    return summary.exit_code
