"""``attnconf report``, ``compare`` and ``merge``: the commands that read results files, their subparsers and
handlers (the work itself is in :mod:`conformance.reporting`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_parsers", "compare", "merge", "report"]


def _margin(text: str) -> float | None:
    """``--perf-threshold``: ``auto`` (None: derived from the measured spread) or a fraction >= 0."""
    if text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be auto or a number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def add_parsers(sub) -> None:
    """The ``report``, ``compare`` and ``merge`` subparsers, in that order."""
    rep = sub.add_parser(
        "report",
        help="write DIR/report.md and DIR/report.html",
        description="Exit status: 0 when the report was written; 2 when a file is missing or unreadable (not "
        "UTF-8 text, a broken gzip stream, no records at all) or the files hold no result record. Lines that "
        "are not records (a truncated last line, garbage) are skipped and counted on stderr, per file.",
    )
    rep.add_argument("results", nargs="+", type=Path)
    rep.add_argument("--out", type=Path, default=Path("report"), help="output directory (default report/)")
    rep.add_argument(
        "--ledger-dir",
        type=Path,
        help="known-failure ledgers (default conformance/ledgers); refused (exit 2) when missing, not a directory "
        "or holding a malformed ledger",
    )
    rep.add_argument(
        "--json",
        metavar="PATH",
        dest="summary_json",
        help="also write a JSON summary here (- for stdout): files read and lines skipped, counts per backend and "
        "status, unexpected failures with repro, known failures per ledger entry, unexpected passes, stale entries",
    )

    c = sub.add_parser(
        "compare",
        help="diff two results files; exit 1 when anything regressed",
        description="Exit status: 0 no regression; 1 regressed (a new failure, an error-ratio, gradient or "
        "performance regression, gradient numbers one run lacks, a lost capability); 2 refused, with one line "
        "naming the file and the reason: a file "
        "missing, unreadable, empty, without header or results, or with lines that are not records (unless "
        "--allow-skipped); runs of different suites or tolerances; NEW lacking (case, family) pairs of OLD "
        "(unless --allow-subset); nothing in common. Different backend versions, devices or machines are what "
        "compare is for.",
    )
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    c.add_argument("--out", type=Path, help="also write the Markdown summary here")
    c.add_argument(
        "--json",
        metavar="PATH",
        dest="summary_json",
        help="also write a JSON summary here (- for stdout, instead of the Markdown): exit status, verdict or "
        "refusal, counts, every regression and fix, pairs compared and not compared",
    )
    c.add_argument(
        "--allow-skipped",
        action="store_true",
        help="compare files with lines that are not records (e.g. a run killed mid-line); the summary counts them",
    )
    c.add_argument(
        "--allow-subset",
        action="store_true",
        help="compare even when NEW lacks (case, family) pairs of OLD; the summary counts those not compared",
    )
    c.add_argument(
        "--only-new-families",
        action="store_true",
        help="compare only the backend families NEW's header lists (what it was asked to run); OLD's other "
        "families are counted as outside the comparison; NEW must still hold every OLD pair of its families",
    )
    c.add_argument(
        "--ratio-threshold", type=float, default=2.0, help="error-ratio growth factor that counts (default 2)"
    )
    c.add_argument(
        "--ratio-floor",
        type=float,
        default=0.5,
        help="new error ratios at or below this never count (default 0.5)",
    )
    c.add_argument(
        "--perf-threshold",
        default=None,
        type=_margin,
        metavar="auto|FRACTION",
        help="margin over the old p80 a new p20 must exceed, e.g. 0.1; auto = the median p20-p80 spread",
    )

    m = sub.add_parser(
        "merge",
        help="merge the shard files of one sweep into one results file",
        description="Exit status: 0 when every shard and every selected (case, backend) pair is there; 1 when "
        "some are missing (the merged file is written all the same and its header lists them); 2 when the files "
        "are not shards of one sweep (suite, commit, backends, options, shard count), hold one shard twice, or "
        "give one (case, backend) pair two verdicts.",
    )
    m.add_argument("shards", nargs="+", type=Path, help="results files of `attnconf run --shard i/n` (or merged ones)")
    m.add_argument("--out", type=Path, default=Path("merged.jsonl"), help="merged file (default merged.jsonl; .gz ok)")
    m.add_argument("--summary", type=Path, help="also write the Markdown summary here")
    m.add_argument("--allow-incomplete", action="store_true", help="exit 0 even when shards or pairs are missing")


def report(args: argparse.Namespace) -> int:
    """``attnconf report``: Markdown + HTML (+ ``--json``) of the results files; 2 when there is nothing to report."""
    from conformance.records import ResultsFileError
    from conformance.reporting.ledger import LedgerDirError, load_ledger_dir
    from conformance.reporting.report import load_runs, write_report
    from conformance.reporting.report_summary import report_json
    from conformance.reporting.summary_json import write_summary

    def refuse(path: str, reason: str, flag: str = "") -> int:
        print(f"attnconf report: {flag}{path}: {reason}", file=sys.stderr)
        if args.summary_json:
            write_summary(
                {"schema": 1, "exit_status": 2, "refusal": {"file": path, "reason": reason}}, args.summary_json
            )
        return 2

    try:
        load_ledger_dir(args.ledger_dir)  # refused before any file is read or written
    except LedgerDirError as exc:
        return refuse(exc.path, exc.reason, "--ledger-dir ")
    try:
        runs = load_runs(args.results)
    except ResultsFileError as exc:
        return refuse(exc.path, exc.reason)
    if not runs.results:
        return refuse(", ".join(runs.sources), "no result records: nothing to report")
    for f in runs.files:
        if f.skipped:
            print(f"attnconf report: {f.path}: {f.skipped_summary()}; the rest is reported", file=sys.stderr)
        if not f.results:
            print(f"attnconf report: {f.path}: no result records (only a header)", file=sys.stderr)
    md, html, ctx = write_report(runs, args.out, args.ledger_dir, with_context=True)
    print(f"wrote {md} and {html}", file=sys.stderr if args.summary_json == "-" else sys.stdout)
    if args.summary_json:
        write_summary(report_json(runs, ctx, md, html), args.summary_json)
    return 0


def compare(args: argparse.Namespace) -> int:
    """``attnconf compare``: 1 when anything regressed, 2 when the files may not be compared."""
    from conformance.reporting.compare import CompareRefused, compare_files, render_markdown
    from conformance.reporting.compare_summary import refusal_json, to_json
    from conformance.reporting.summary_json import write_summary

    try:
        cmp = compare_files(
            args.old,
            args.new,
            allow_skipped=args.allow_skipped,
            allow_subset=args.allow_subset,
            only_new_families=args.only_new_families,
            ratio_threshold=args.ratio_threshold,
            ratio_floor=args.ratio_floor,
            perf_margin=args.perf_threshold,
        )
    except CompareRefused as exc:
        print(f"attnconf compare: refused: {exc}", file=sys.stderr)
        if args.out:  # a CI job summary built from --out shows why the gate failed
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(f"# Compare: {args.old} -> {args.new}: REFUSED\n\n{exc}\n", encoding="utf-8")
        if args.summary_json:
            write_summary(refusal_json(exc.path, exc.reason), args.summary_json)
        return 2
    text = render_markdown(cmp)
    if args.summary_json != "-":
        sys.stdout.write(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    if args.summary_json:
        write_summary(to_json(cmp), args.summary_json)
    return 1 if cmp.regressed else 0


def merge(args: argparse.Namespace) -> int:
    """``attnconf merge``: 1 when shards or pairs are missing, 2 when the files are not one sweep's shards."""
    from conformance.reporting.shards import MergeError, merge_shards, render_markdown, write_merged

    missing = [str(p) for p in args.shards if not p.is_file()]
    if missing:
        print(f"attnconf merge: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        merged = merge_shards(args.shards)
    except MergeError as exc:
        print(f"attnconf merge: {exc}", file=sys.stderr)
        return 2
    write_merged(merged, args.out)
    text = render_markdown(merged, args.out)
    sys.stdout.write(text)
    if args.summary:
        args.summary.write_text(text, encoding="utf-8")
    for line in merged.problems():
        print(f"attnconf merge: {line}", file=sys.stderr)
    return 0 if merged.complete or args.allow_incomplete else 1
