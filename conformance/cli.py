"""``attnconf``: the command line (also ``python -m conformance``).

Subcommands and exit statuses (2 is always a usage error: bad flags or option values, unknown suite or
backend, an empty selection, an unwritable ``--out``; printed as one line, never a traceback; 130 on Ctrl-C):

* ``run``: sweep cases x backends into a JSONL file (:mod:`conformance.running.runner`); 0 when every
  problem (fail/error/crash/timeout) of the selected (case, backend) pairs is a known failure of the ledger,
  1 when some problem is unexpected (with ``--strict``: any problem, or an unexpected pass), 130 when
  interrupted (Ctrl-C; the records are kept, the message says how to resume).  It ends by listing the
  unexpected problems (status, backend, case id, one-line reason, repro) and the known ones per ledger entry;
  ``--json PATH`` writes the same as JSON.
* ``--version``: the package version; 0.
* ``report``: Markdown + HTML report of one or more results files (:mod:`conformance.reporting.report`); 0,
  2 when a file is missing or unreadable or the files hold no result (skipped lines are counted on stderr).
* ``compare``: diff two results files (:mod:`conformance.reporting.compare`); 1 when anything regressed, 2
  when the files may not be compared (:mod:`conformance.reporting.compare_inputs`: unreadable, empty, skipped
  lines, other suite or tolerance, NEW lacking pairs of OLD), one line naming the file and the reason.
* ``merge``: the shard files of one sweep into one results file (:mod:`conformance.reporting.shards`); 1 when
  shards or (case, backend) pairs are missing (the file is written all the same), 2 when the files do not
  belong to one sweep or disagree.
* ``backends``: capability matrix of the installed backends; 0.
* ``fuzz``: random cases, failures shrunk and grouped (:mod:`conformance.fuzz`); 1 when any case failed.
* ``cases``: the cases of a suite, selected as ``run`` selects them (``--case``, ``--feature``, ``--exclude``,
  ``--exclude-feature``: :mod:`conformance.running.selection`); 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

__all__ = ["build_parser", "main"]


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


def _jobs(text: str) -> int | None:
    """``--jobs``: ``auto`` (None) or an integer >= 1 (:func:`conformance.running.pool.parse_jobs`)."""
    from conformance.running.pool import PlacementError, parse_jobs

    try:
        return parse_jobs(text)
    except PlacementError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--jobs ")) from None


def _gpus(text: str) -> str:
    """``--gpus``: checked here (``all`` or ``0,1,...``), resolved against the visible GPUs by the runner."""
    from conformance.running.pool import PlacementError, parse_gpus

    try:
        parse_gpus(text)
    except PlacementError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--gpus ")) from None
    return text


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``attnconf run: argument --timeout: must be ...``), exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnconf")
    except PackageNotFoundError:  # a checkout run without `pip install -e .`
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    from conformance.running.selection import add_selection_args
    from conformance.running.usage import positive_int, positive_seconds, seed_int

    p = _Parser(prog="attnconf", description="Attention-kernel conformance harness.")
    p.add_argument("--version", action="version", version=f"attnconf {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser(
        "run",
        help="run a suite against backends, one JSON line per (case, backend)",
        description="Exit status: 0 when every problem (fail, error, crash, timeout) of the selected (case, "
        "backend) pairs is a known failure of the ledger (--ledger-dir), 1 when some problem is unexpected "
        "(with --strict: any problem, or a case a ledger entry expects to fail passing), 130 when interrupted "
        "(Ctrl-C: the records are kept; the message gives the --resume command), 2 on usage errors. The run "
        "ends by listing every unexpected problem (status, backend, case id, reason, repro command) and the "
        "known ones counted per ledger entry; --json writes the same as JSON.",
    )
    r.add_argument("--suite", help="suite name (see `attnconf cases`); optional with --case-json")
    r.add_argument(
        "--backend",
        action="append",
        metavar="NAME",
        help="registry name or module:Class; repeat for several (cases outer, backends inner); "
        "default: every installed backend available on the device",
    )
    r.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda when present; default)")
    r.add_argument(
        "--out",
        type=Path,
        default=Path("results.jsonl"),
        help="results file (default results.jsonl); without --resume an existing one moves to the first free "
        "numbered backup NAME.1.jsonl, NAME.2.jsonl, ... (never overwritten)",
    )
    r.add_argument(
        "--resume",
        action="store_true",
        help="keep the file's records and run only the missing (case, backend) pairs; refused (exit 2) when the "
        "file holds another sweep (suite, selection, seed, device or tolerance differ)",
    )
    r.add_argument("--shard", metavar="I/N", help="run every N-th case starting at the I-th (0 <= I < N)")
    r.add_argument(
        "--timeout",
        type=positive_seconds,
        default=300.0,
        help="seconds (> 0) per (case, backend) before the worker is killed (default 300)",
    )
    r.add_argument("--seed", type=seed_int, default=0, help="input seed, 0 <= SEED < 2**32 (default 0)")
    add_selection_args(r)
    r.add_argument("--case-json", metavar="JSON", help="a case (or list) as AttentionCase JSON, or @file")
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
    r.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    r.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N|auto",
        help="crash-isolated workers at once, in total (default auto: on cpu one per core, at most 16; on cuda "
        "one per core but one, at most 12 per GPU, at least one per GPU; with --time one per GPU, or 1 on cpu)",
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
    r.add_argument("--ledger-dir", type=Path, help="known-failure ledgers (default conformance/ledgers)")
    r.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        dest="summary_json",
        help="write a JSON summary here: exit status, counts, every unexpected problem with its repro, known "
        "problems per ledger entry, unexpected passes, wall time, the results file",
    )

    rep = sub.add_parser(
        "report",
        help="write DIR/report.md and DIR/report.html",
        description="Exit status: 0 when the report was written; 2 when a file is missing or unreadable (not "
        "UTF-8 text, a broken gzip stream, no records at all) or the files hold no result record. Lines that "
        "are not records (a truncated last line, garbage) are skipped and counted on stderr, per file.",
    )
    rep.add_argument("results", nargs="+", type=Path)
    rep.add_argument("--out", type=Path, default=Path("report"), help="output directory (default report/)")
    rep.add_argument("--ledger-dir", type=Path, help="known-failure ledgers (default conformance/ledgers)")
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
        description="Exit status: 0 no regression; 1 regressed (a new failure, an error-ratio or performance "
        "regression, a lost capability); 2 refused, with one line naming the file and the reason: a file "
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

    b = sub.add_parser("backends", help="capability matrix of the installed backends")
    b.add_argument("--json", action="store_true", help="machine-readable, with every refusal's reason")
    b.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="NAME",
        help="only these (registry name or module:Class)",
    )

    from conformance.fuzz.cli import add_parser as add_fuzz_parser

    add_fuzz_parser(sub)
    from conformance.reporting.ledger_cli import add_parser as add_ledger_parser

    add_ledger_parser(sub)

    cs = sub.add_parser("cases", help="list the cases of a suite, or measure its coverage of the case space")
    cs.add_argument("--suite", required=True)
    add_selection_args(cs)
    cs.add_argument("--json", action="store_true")
    cs.add_argument(
        "--coverage",
        action="store_true",
        help="print covered / possible t-tuples of axis levels (conformance.cases.space): pairwise over all axes, "
        "3-wise over the kernel axes, 3-wise over all axes",
    )
    cs.add_argument(
        "--strength", type=int, metavar="T", help="with --coverage: T-wise over all axes and over the kernel axes"
    )
    cs.add_argument("--uncovered", action="store_true", help="with --coverage: also list every missing tuple")
    cs.add_argument(
        "--backend",
        metavar="NAME",
        help="with --coverage: over the cases this backend runs and the tuples it reaches, by its declared "
        "features (registry name or module:Class; need not be installed here)",
    )
    return p


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    from conformance.running.runner import RunConfig, UsageError, main_run, parse_shard

    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    backends = args.backend
    if not backends:
        from attnfast.registry import runnable_names

        backends = runnable_names(device)
        if not backends:
            raise UsageError(f"no installed backend runs on {device}; name one with --backend")
        print(f"attnconf run: device {device}, backends {', '.join(backends)}", file=sys.stderr)
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
    )
    return main_run(config)


def _report(args: argparse.Namespace) -> int:
    from conformance.records import ResultsFileError
    from conformance.reporting.report import load_runs, write_report
    from conformance.reporting.report_summary import report_json
    from conformance.reporting.summary_json import write_summary

    def refuse(path: str, reason: str) -> int:
        print(f"attnconf report: {path}: {reason}", file=sys.stderr)
        if args.summary_json:
            write_summary(
                {"schema": 1, "exit_status": 2, "refusal": {"file": path, "reason": reason}}, args.summary_json
            )
        return 2

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


def _compare(args: argparse.Namespace) -> int:
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


def _merge(args: argparse.Namespace) -> int:
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


def _backends(args: argparse.Namespace) -> int:
    from attnfast.registry import available_names

    from conformance.cases.case import FEATURES
    from conformance.running.env import backend_info, refused_features, resolve_backend

    infos: dict[str, dict[str, str]] = {}
    for spec in args.backend or available_names():
        try:
            infos[spec] = backend_info(resolve_backend(spec), spec)
        except Exception as exc:  # noqa: BLE001 - a broken adapter is shown, not fatal
            infos[spec] = {
                "name": spec,
                "available": "no",
                "unavailable_reason": f"cannot load: {type(exc).__name__}: {exc}",
            }
    if args.json:
        out = {
            spec: {
                **{k: v for k, v in i.items() if not k.startswith("refuses.")},
                "refused": refused_features(i),
            }
            for spec, i in infos.items()
        }
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="attnconf backends: declared capabilities (--json gives every refusal's reason)")
    table.add_column("feature", no_wrap=True)
    for spec, info in infos.items():
        table.add_column(info.get("name", spec), no_wrap=True)
    table.add_row(
        "[bold]available",
        *["[green]yes" if i.get("available") == "yes" else "[red]no" for i in infos.values()],
    )
    table.add_row("[bold]version", *[i.get("version", "?") for i in infos.values()])
    table.add_row("[bold]family", *[i.get("family", "?") for i in infos.values()])
    table.add_row("[bold]devices", *[i.get("devices", "?") for i in infos.values()], end_section=True)
    refused = [refused_features(i) for i in infos.values()]
    for feature in FEATURES:
        table.add_row(feature, *["[red]no" if feature in r else "[green]yes" for r in refused])
    # Piped output has no terminal width; the matrix is wider than rich's 80-column default.
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    for spec, info in infos.items():
        if info.get("available") != "yes":
            console.print(
                f"{info.get('name', spec)}: not available: {info.get('unavailable_reason', '')}",
                highlight=False,
            )
    return 0


def _cases(args: argparse.Namespace) -> int:
    from conformance.running.selection import select_cases, selection_kwargs
    from conformance.running.usage import UsageError

    if (args.strength is not None or args.uncovered or args.backend) and not args.coverage:
        raise UsageError("--strength, --uncovered and --backend need --coverage")
    cases = select_cases(args.suite, tuple(args.case), **selection_kwargs(args))
    if args.coverage:
        return _coverage(args, cases)
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": c.id,
                        "summary": c.summary(),
                        "features": sorted(c.features()),
                        "case": c.to_json(),
                    }
                    for c in cases
                ],
                indent=1,
            )
        )
        return 0
    width = max(len(c.id) for c in cases)
    for c in cases:
        print(f"{c.id:<{width}}  {c.summary()}")
    counts = Counter(f for c in cases for f in c.features())
    print(
        f"\n{len(cases)} cases; per feature: "
        + ", ".join(f"{f} {counts[f]}" for f in sorted(counts, key=lambda f: (-counts[f], f)))
    )
    return 0


def _coverage(args: argparse.Namespace, cases: list) -> int:
    from conformance.cases.covering import measures
    from conformance.running.runner import UsageError

    refused = None
    if args.backend:
        from conformance.running.env import backend_info, refused_features, resolve_backend

        try:
            refused = sorted(refused_features(backend_info(resolve_backend(args.backend), args.backend)))
        except (ImportError, AttributeError, KeyError, ValueError) as exc:
            raise UsageError(f"--backend {args.backend}: {exc}") from None
    try:
        figures = measures(cases, args.strength, with_missing=args.uncovered, refused=refused)
    except ValueError as exc:
        raise UsageError(f"--strength: {exc}") from None
    runs = None if refused is None else sum(not (c.features() & set(refused)) for c in cases)
    if args.json:
        out = {"suite": args.suite, "cases": len(cases), "measures": [m.to_json() for m in figures]}
        if refused is not None:
            out |= {"backend": args.backend, "refused_features": refused, "backend_runs": runs}
        print(json.dumps(out))
        return 0
    from conformance.cases.space import describe

    print(f"{args.suite}: {len(cases):,} cases")
    if refused is not None:
        print(f"{args.backend} runs {runs:,} of them (declared refusals: {', '.join(refused) or 'none'})")
    for m in figures:
        print(m.line())
        for missing in m.missing or ():
            print(f"  uncovered: {describe(missing)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``attnconf``; returns the exit status (see the module docstring)."""
    from conformance.running.usage import UsageError
    from conformance.running.worker import WorkerStartError

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad flags, 0 on --help
        return int(exc.code or 0)
    try:
        if args.command == "run":
            return _run(args, argv)
        if args.command == "report":
            return _report(args)
        if args.command == "compare":
            return _compare(args)
        if args.command == "merge":
            return _merge(args)
        if args.command == "backends":
            return _backends(args)
        if args.command == "fuzz":
            from conformance.fuzz.cli import main as fuzz_main

            return fuzz_main(args, argv)
        if args.command == "ledger":
            from conformance.reporting.ledger_cli import main as ledger_main

            return ledger_main(args)
        return _cases(args)
    except UsageError as exc:
        print(f"attnconf {args.command}: {exc}", file=sys.stderr)
        return 2
    except WorkerStartError as exc:  # not the user's fault: the machine or an adapter import is broken
        print(f"attnconf {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a run's sweep handles its own (records kept, resume command); this is the rest
        hint = ""
        if args.command == "run":
            from conformance.running.outcome import resume_command

            hint = f"; records already written are kept: resume with: {resume_command(('attnconf', *argv))}"
        print(f"attnconf {args.command}: interrupted (Ctrl-C){hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
