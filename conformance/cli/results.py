"""``attnconf report``, ``compare`` and ``merge``: the commands that read results files, their subparsers and
handlers (the work itself is in :mod:`conformance.reporting`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.exits import UsageError
from conformance.running.usage import finite_float

__all__ = ["add_parsers", "compare", "merge", "report"]

#: ``--ratio-threshold``: a growth factor >= 1 (1: any growth above the floor counts; below 1 a ratio that
#: shrank would count as a regression); ``--ratio-floor``: >= 0; ``--perf-threshold``: a fraction >= 0.
_ratio_threshold = finite_float(1)
_non_negative = finite_float(0)

#: Output kinds (:mod:`conformance.outputs`) of the files these commands write besides the report itself
#: (:mod:`conformance.reporting.report`) and the merged results file (never replaced: no kind).
REPORT_JSON, COMPARE_MD, COMPARE_JSON, MERGE_MD = "report-summary", "compare-md", "compare-summary", "merge-md"


def _margin(text: str) -> float | None:
    """``--perf-threshold``: ``auto`` (None: derived from the measured spread) or a finite fraction >= 0."""
    if text.strip() == "auto":
        return None
    try:
        return _non_negative(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"must be auto or {str(exc).removeprefix('must be ')}") from None


def add_parsers(sub) -> None:
    """The ``report``, ``compare`` and ``merge`` subparsers, in that order."""
    rep = sub.add_parser(
        "report",
        help="write DIR/report.md and DIR/report.html",
        description="The report opens on its verdict (one line per backend: judged, passed, unexpected, known, "
        "unsupported, or nothing judged), then the unexpected problems grouped by cause with their repro lines, "
        "then what changed against --baseline, then the details; the environment comes last, folded. "
        "Exit status: 0 when the report was written (whatever it found: attnconf run and attnconf compare are "
        "the gates; the verdict.exit_status of --json says what they would exit on these files); 2 when a file "
        "is missing or unreadable (not "
        "UTF-8 text, a broken gzip stream, a line over 64 MiB, no records at all), records a (case, backend) pair "
        "twice (unless --drop-duplicates) or the files hold no result record, when --baseline cannot be read or "
        "compared with the results (as attnconf compare refuses it), or an output path is refused (an "
        "input, a directory, a device, a FIFO); 3 when an output cannot be written (nothing is changed then). "
        "Lines that are not records (a truncated last line, garbage) are skipped and counted on stderr, per file; "
        "a file written by a newer attnconf is read as far as this version understands it, and said so on stderr. "
        "Across files, the last record of a pair wins.",
    )
    rep.add_argument("results", nargs="+", type=Path)
    rep.add_argument(
        "--drop-duplicates",
        action="store_true",
        help="read files that record a (case, backend) pair twice (two runs wrote them at once), keeping the last "
        "record of each pair (counted on stderr and in --json), instead of refusing them (exit 2)",
    )
    rep.add_argument(
        "--out",
        type=Path,
        default=Path("report"),
        help="output directory (default report/): report.md, report.html and the PNGs; an earlier report there "
        "is replaced, any other file of those names kept as a numbered backup (report.1.md, ...)",
    )
    rep.add_argument(
        "--ledger-dir",
        type=Path,
        help="known-failure ledgers (default conformance/ledgers); refused (exit 2) when missing, not a directory "
        "or holding a malformed ledger",
    )
    rep.add_argument(
        "--baseline",
        type=Path,
        metavar="OLD",
        help="an earlier results file to compare the results with, as attnconf compare OLD NEW does (new "
        "failures, error-ratio, gradient and performance regressions, fixes, ...): the report's section after the "
        "unexpected problems; one results file only; pairs of OLD the results lack are counted, not refused; "
        "exit 2 with one line when OLD cannot be read or compared (another suite or tolerance, nothing in common)",
    )
    rep.add_argument(
        "--json",
        metavar="PATH",
        dest="summary_json",
        help="also write a JSON summary here (- for stdout: the JSON alone): first the verdict a script acts on "
        "(verdict.exit_status, what the results imply for a gate: 1 an unexpected problem or a regression against "
        "--baseline, 2 a baseline attnconf compare would refuse (the results lack pairs of OLD, lines that are not "
        "records), 4 a backend or family judged nothing, else 0; its reasons; one line per backend; the unexpected "
        "problems grouped by cause with their repro lines), the comparison with --baseline as attnconf compare "
        "--json writes it, then files read and lines skipped, counts per backend and status, known failures per "
        "ledger entry, unexpected passes, stale entries (schema 2); an earlier summary is replaced, any other file "
        "kept as a numbered backup",
    )

    c = sub.add_parser(
        "compare",
        help="diff two results files; exit 1 when anything regressed, 4 when a family judged nothing",
        description="Exit status: 0 no regression; 1 regressed (a new failure, an error-ratio, gradient or "
        "performance regression, a NaN error ratio where the old one is a number, gradient numbers one run "
        "lacks, a lost capability); 4 nothing judged: a backend family none of whose compared pairs was judged "
        "in both files (every pair unsupported on one side or both, e.g. the new run on a machine without the "
        "kernel; unless --allow-unjudged; 1 takes precedence); 2 refused, with one line "
        "naming the file and the reason: a file "
        "missing, unreadable, empty, without header or results, or with lines that are not records (unless "
        "--allow-skipped), or recording a (case, backend) pair twice (unless --drop-duplicates); runs of "
        "different suites or tolerances; NEW lacking (case, family) pairs of OLD (unless --allow-subset); nothing "
        "in common; a rule number out of range; an output path that is an input, a directory, a device or a FIFO; "
        "3 when --out or --json cannot be written (never 1 or 4). A file written by a newer attnconf is compared "
        "as far as this version reads it, and said so on stderr. Different backend versions, devices or machines "
        "are what compare is for. A record marked pass whose statistics are NaN or inf counts as a fail.",
    )
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    c.add_argument(
        "--out",
        type=Path,
        help="also write the Markdown summary here (the reason, on a refusal); an earlier one is replaced, any "
        "other file kept as a numbered backup",
    )
    c.add_argument(
        "--json",
        metavar="PATH",
        dest="summary_json",
        help="also write a JSON summary here (- for stdout, instead of the Markdown): exit status, verdict or "
        "refusal, counts, every regression and fix, pairs compared and not compared; an earlier one is "
        "replaced, any other file kept as a numbered backup",
    )
    c.add_argument(
        "--allow-skipped",
        action="store_true",
        help="compare files with lines that are not records (e.g. a run killed mid-line); the summary counts them",
    )
    c.add_argument(
        "--drop-duplicates",
        action="store_true",
        help="read files that record a (case, backend) pair twice (two runs wrote them at once), keeping the last "
        "record of each pair (the summary counts the others), instead of refusing them (exit 2)",
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
        "--allow-unjudged",
        action="store_true",
        help="exit 0, not 4, when a backend family judged nothing in both files (the summary still names it): "
        "for a selection that legitimately holds no case a backend supports",
    )
    c.add_argument(
        "--ratio-threshold",
        type=_ratio_threshold,
        default=2.0,
        help="error-ratio growth factor that counts, a finite number >= 1 (1: any growth above the floor; default 2)",
    )
    c.add_argument(
        "--ratio-floor",
        type=_non_negative,
        default=0.5,
        help="new error ratios at or below this never count, a finite number >= 0 (default 0.5)",
    )
    c.add_argument(
        "--perf-threshold",
        default=None,
        type=_margin,
        metavar="auto|FRACTION",
        help="margin over the old p80 a new p20 must exceed, a finite fraction >= 0, e.g. 0.1; auto = the median "
        "p20-p80 spread",
    )

    m = sub.add_parser(
        "merge",
        help="merge the shard files of one sweep into one results file",
        description="Exit status: 0 when every shard and every selected (case, backend) pair is there and every "
        "backend judged at least one case; 1 when some are missing (the merged file is written all the same and "
        "its header lists them); 4 when a backend of the sweep judged no case in any shard (every pair "
        "unsupported, e.g. its kernel not installed on the runners; unless --allow-unjudged; 1 takes "
        "precedence); 2 when the files are not shards of one sweep (suite, commit, backends, options, shard "
        "count), hold one shard twice, give one (case, backend) pair two verdicts, record one pair twice in one "
        "file (unless --drop-duplicates), cannot be read (binary, cut or corrupt gzip data, a line over 64 MiB), "
        "hold lines that are not records (unless --allow-skipped; a killed runner's cut last line is fine: its "
        "pair is missing) or were written by a newer attnconf, or when an output path is an input, a directory, "
        "a device or a FIFO, or another command holds --out; 3 when an output cannot be written.",
    )
    m.add_argument("shards", nargs="+", type=Path, help="results files of `attnconf run --shard i/n` (or merged ones)")
    m.add_argument(
        "--out",
        type=Path,
        default=Path("merged.jsonl"),
        help="merged file (default merged.jsonl; .gz ok); an existing file there, a results file or not, is kept "
        "as a numbered backup (merged.1.jsonl), never replaced; not one of the shards",
    )
    m.add_argument(
        "--summary",
        type=Path,
        help="also write the Markdown summary here; an earlier one is replaced, any other file kept as a "
        "numbered backup",
    )
    m.add_argument("--allow-incomplete", action="store_true", help="exit 0 even when shards or pairs are missing")
    m.add_argument(
        "--allow-unjudged",
        action="store_true",
        help="exit 0, not 4, when a backend judged no case in any shard (for a selection that legitimately holds "
        "no case a backend supports)",
    )
    m.add_argument(
        "--allow-skipped",
        action="store_true",
        help="merge files with lines that are not records (garbled lines; the summary counts them)",
    )
    m.add_argument(
        "--drop-duplicates",
        action="store_true",
        help="read files that record a (case, backend) pair twice (two runs wrote them at once), keeping the last "
        "record of each pair (the summary and the merged header count the others), instead of refusing them (exit 2)",
    )


def report(args: argparse.Namespace) -> int:
    """``attnconf report``: Markdown + HTML (+ ``--json``) of the results files; 2 when there is nothing to report.
    Every output path is checked before any file is read (:func:`conformance.reporting.report_render.check_report_dir`);
    the files are written all or nothing (:func:`conformance.outputs.write_many`)."""
    from conformance.outputs import write_many
    from conformance.results_file import ResultsFileError
    from conformance.ledger.entries import LedgerDirError, load_ledger_dir
    from conformance.reporting.report import load_runs
    from conformance.reporting.report_render import check_report_dir, report_outputs
    from conformance.reporting.report_summary import SCHEMA, report_json
    from conformance.reporting.summary_json import summary_output, write_summary

    def refuse(path: str, reason: str, flag: str = "") -> int:
        print(f"attnconf report: {flag}{path}: {reason}", file=sys.stderr)
        if args.summary_json:
            write_summary(
                {"schema": SCHEMA, "exit_status": 2, "refusal": {"file": path, "reason": reason}, "verdict": None},
                args.summary_json,
                REPORT_JSON,
            )
        return 2

    try:
        load_ledger_dir(args.ledger_dir)  # refused before any file is read or written
    except LedgerDirError as exc:
        return refuse(exc.path, exc.reason, "--ledger-dir ")
    if args.baseline is not None and len(args.results) != 1:
        raise UsageError(
            f"--baseline {args.baseline}: compares one results file, not {len(args.results)}; merge the files "
            "first (attnconf merge) or report them without --baseline"
        )
    inputs = [*args.results, *([args.baseline] if args.baseline is not None else [])]
    md, html = check_report_dir(args.out, inputs, others=[(args.summary_json, "--json")])[:2]
    try:
        runs = load_runs(args.results, drop_duplicates=args.drop_duplicates)
    except ResultsFileError as exc:
        return refuse(exc.path, exc.reason)
    if not runs.results:
        return refuse(", ".join(runs.sources), "no result records: nothing to report")
    comparison = None
    if args.baseline is not None:
        from conformance.outputs import same_file
        from conformance.reporting.compare import CompareRefused, compare_files

        try:  # compare's own checks and comparison; what the report shows anyway is not refused
            comparison = compare_files(
                args.baseline,
                args.results[0],
                allow_skipped=True,
                allow_subset=True,
                drop_duplicates=args.drop_duplicates,
            )
        except CompareRefused as exc:
            if same_file(exc.path, args.baseline):
                return refuse(str(args.baseline), exc.reason, "--baseline ")
            reason = f"cannot be compared with {args.results[0]}: {exc.reason}"
            return refuse(str(args.baseline), reason, "--baseline ")
    for f in runs.files:
        for note in f.notes():
            print(f"attnconf report: {f.path}: {note}", file=sys.stderr)
        if f.skipped:
            print(f"attnconf report: {f.path}: {f.skipped_summary()}; the rest is reported", file=sys.stderr)
        if not f.results:
            print(f"attnconf report: {f.path}: no result records (only a header)", file=sys.stderr)
    if runs.nonfinite_passes:
        from conformance.records import NONFINITE_PASS

        print(f"attnconf report: {NONFINITE_PASS}: {runs.nonfinite_passes} record(s)", file=sys.stderr)
    outs, ctx = report_outputs(runs, args.out, args.ledger_dir, comparison)
    summary = report_json(runs, ctx, md, html, comparison) if args.summary_json else None
    if summary is not None and args.summary_json != "-":
        outs.append(summary_output(summary, args.summary_json, REPORT_JSON))
    write_many(outs)
    print(f"wrote {md} and {html}", file=sys.stderr if args.summary_json == "-" else sys.stdout)
    if summary is not None and args.summary_json == "-":
        write_summary(summary, "-", REPORT_JSON)
    return 0


def compare(args: argparse.Namespace) -> int:
    """``attnconf compare``: 1 when anything regressed, 4 when a family judged nothing (unless
    ``--allow-unjudged``), 2 when the files may not be compared (or an output path is refused), 3 when an output
    cannot be written; the outputs are checked before the files are read."""
    from conformance.outputs import Output, check_outputs, with_marker, write_many
    from conformance.reporting.compare import CompareRefused, compare_files
    from conformance.reporting.compare_markdown import render_markdown
    from conformance.reporting.compare_summary import refusal_json, to_json
    from conformance.reporting.summary_json import summary_output, write_summary

    check_outputs([(args.out, "--out"), (args.summary_json, "--json")], [args.old, args.new])

    def write(markdown: str, summary: dict) -> None:
        outs = [Output(args.out, with_marker(markdown, COMPARE_MD).encode(), COMPARE_MD)] if args.out else []
        if args.summary_json and args.summary_json != "-":
            outs.append(summary_output(summary, args.summary_json, COMPARE_JSON))
        write_many(outs)
        if args.summary_json == "-":
            write_summary(summary, "-", COMPARE_JSON)

    try:
        cmp = compare_files(
            args.old,
            args.new,
            allow_skipped=args.allow_skipped,
            allow_subset=args.allow_subset,
            only_new_families=args.only_new_families,
            allow_unjudged=args.allow_unjudged,
            drop_duplicates=args.drop_duplicates,
            ratio_threshold=args.ratio_threshold,
            ratio_floor=args.ratio_floor,
            perf_margin=args.perf_threshold,
        )
    except CompareRefused as exc:
        print(f"attnconf compare: refused: {exc}", file=sys.stderr)
        # a CI job summary built from --out shows why the gate failed
        write(f"# Compare: {args.old} -> {args.new}: REFUSED\n\n{exc}\n", refusal_json(exc.path, exc.reason))
        return 2
    for note in cmp.file_notes:
        print(f"attnconf compare: {note}", file=sys.stderr)
    text = render_markdown(cmp)
    if args.summary_json != "-":
        sys.stdout.write(text)
    write(text, to_json(cmp))
    for fam, why in cmp.unjudged:
        accepted = " (accepted with --allow-unjudged)" if cmp.allow_unjudged else ""
        print(f"attnconf compare: nothing judged: family {fam} {why}{accepted}", file=sys.stderr)
    return cmp.exit_status


def merge(args: argparse.Namespace) -> int:
    """``attnconf merge``: 1 when shards or pairs are missing, 4 when a backend judged no case in any shard, 2 when
    the files are not one sweep's shards (or an output path is refused), 3 when an output cannot be written.  An
    existing ``--out`` is a results file, data: it is always kept as a numbered backup, never replaced."""
    from conformance.lock import hold
    from conformance.outputs import Output, check_outputs, with_marker, write_many
    from conformance.reporting.shards import MergeError, merge_shards, merged_output, render_markdown

    for shard in args.shards:
        try:
            if shard.is_file():
                continue
            reason = "no such file"
        except OSError as exc:  # Python < 3.12: a name too long raises in is_file()
            reason = f"cannot be read: {exc.strerror or exc}"
        print(f"attnconf merge: {shard}: {reason}", file=sys.stderr)
        return 2
    check_outputs([(args.out, "--out"), (args.summary, "--summary")], args.shards)
    with hold(args.out, "--out"):  # no other merge or run writes --out meanwhile
        try:
            merged = merge_shards(args.shards, allow_skipped=args.allow_skipped, drop_duplicates=args.drop_duplicates)
        except MergeError as exc:
            print(f"attnconf merge: {exc}", file=sys.stderr)
            return 2
        text = render_markdown(merged, args.out)
        outs = [merged_output(merged, args.out)]
        if args.summary:
            outs.append(Output(args.summary, with_marker(text, MERGE_MD).encode(), MERGE_MD, "--summary"))
        write_many(outs)
    for note in merged.notes:
        print(f"attnconf merge: {note}", file=sys.stderr)
    sys.stdout.write(text)
    for line in merged.problems():
        print(f"attnconf merge: {line}", file=sys.stderr)
    accepted = " (accepted: --allow-unjudged)" if args.allow_unjudged else ""
    for name, why, pairs in merged.unjudged:
        print(f"attnconf merge: UNJUDGED: {name} judged none of its {pairs} pair(s): {why}{accepted}", file=sys.stderr)
    if not (merged.complete or args.allow_incomplete):
        return 1
    return 4 if merged.unjudged and not args.allow_unjudged else 0
