"""The ``attnconf fuzz`` subcommand: :func:`add_parser` registers it, :func:`main` runs it.

Exit status: 0 when no drawn or replayed case failed, errored, crashed or timed out; 1 otherwise (the groups
of failures are printed); 2 on usage errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_parser", "main"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``fuzz`` to ``attnconf``'s subparsers."""
    from conformance.running.usage import device_spec

    f = subparsers.add_parser(
        "fuzz",
        help="random cases from the whole case space; failures shrunk to minimal cases and grouped",
        description="Draw seeded random cases from the case space, check them against backends (crash-isolated, "
        "same records as `run`), shrink every failure to a minimal case and group failures by the axis values "
        "their minimal cases share. Exit status: 0 if nothing failed, 1 otherwise, 2 on usage errors.",
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
        default="100",
        help="a number of cases (200) or this invocation's wall time (90s, 10m, 1h); default 100 cases",
    )
    f.add_argument("--seed", type=int, default=0, help="seed of the case stream (and of the inputs)")
    f.add_argument(
        "--out",
        type=Path,
        default=Path("fuzz.jsonl"),
        help="results file (default fuzz.jsonl); without --resume an existing one moves to the first free "
        "numbered backup NAME.1.jsonl, NAME.2.jsonl, ...",
    )
    f.add_argument(
        "--resume",
        action="store_true",
        help="continue the file's seeded stream: check only missing pairs, finish missing or cut shrinks",
    )
    f.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds per check before the worker is killed (default 300)",
    )
    f.add_argument(
        "--max-shrink-steps",
        type=int,
        default=200,
        help="evaluations spent shrinking one failure, at most (default 200)",
    )
    f.add_argument(
        "--max-tokens",
        type=int,
        default=512,
        help="bound on the summed q and kv lengths of a drawn case (default 512: CPU-affordable); the work "
        "sum(q*kv)*h*(d+dv) is bounded by max_tokens**2 * 128",
    )
    f.add_argument("--max-heads", type=int, default=256, help="bound on the q heads of a drawn case (default 256)")
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
    f.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return f


def main(args: argparse.Namespace, argv: list[str]) -> int:
    """Run ``attnconf fuzz``; prints the summary and the failure groups to stderr."""
    from conformance.fuzz.campaign import FuzzConfig, parse_budget, run_fuzz
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
        budget=parse_budget(args.budget),
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
    )
    summary = run_fuzz(config)
    print(summary.text(), file=sys.stderr)
    return summary.exit_code
