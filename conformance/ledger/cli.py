"""``attnconf ledger``: check the known-failure ledger against results files, list the fields a predicate may test.

``attnconf ledger audit FILES... [--json] [--ledger-dir DIR] [--strict]`` prints, per entry, the problems it
explains, the passes it claims, the passes past its version range (fixed) and the problems of its cases in a status
or with a message it does not list (UNLISTED: unexplained), the pairs its faults left unjudged after them in the
same run (COLLATERAL: explained, :func:`conformance.ledger.audit.collateral`), and per backend the other problems
no entry explains, grouped by signature.  ``attnconf ledger fields`` lists the predicate fields.

Exit status: 0; 1 when a non-flaky entry claims a pass (its predicate is too wide, or the bug is fixed), or with
``--strict`` when a problem is unexplained (an unlisted one too); 2 for a malformed ledger, or a missing,
unreadable or empty results file, one with lines that are not records (unless ``--allow-skipped``), or one
recording a (case, backend) pair twice (unless ``--drop-duplicates``).  What reading a file noted (a newer
writer's schema, duplicates dropped) goes to stderr, one line per file and note.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_parser", "main"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``ledger`` (``audit``, ``fields``) to ``attnconf``'s subparsers."""
    p = subparsers.add_parser(
        "ledger",
        help="audit the known-failure ledger against results files; list the predicate fields",
        description="Exit status: 0; 1 when an entry claims a pass (or, with --strict, a problem is unexplained, "
        "one of an entry's cases in a status or with a message the entry does not list included); "
        "2 for a malformed ledger or an unreadable or empty results file.",
    )
    sub = p.add_subparsers(dest="ledger_command", required=True)
    a = sub.add_parser(
        "audit",
        help="per entry: problems explained, passes claimed, problems in a status or with a message it does not "
        "list; per backend: what is unexplained",
    )
    a.add_argument("results", nargs="+", type=Path, help="results files (.jsonl or .jsonl.gz; fuzz campaigns too)")
    a.add_argument(
        "--ledger-dir",
        type=Path,
        help="known-failure ledgers (default conformance/ledgers); refused (exit 2) when missing, not a directory "
        "or holding a malformed ledger",
    )
    a.add_argument("--json", action="store_true", help="print the audit as one JSON object")
    a.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when any problem is unexplained too, an entry's cause in a status (or with a message) the entry "
        "does not list included",
    )
    a.add_argument(
        "--allow-skipped",
        action="store_true",
        help="read files with lines that are not records (counted and reported) instead of refusing them",
    )
    a.add_argument(
        "--drop-duplicates",
        action="store_true",
        help="read files that record a (case, backend) pair twice (two runs wrote them at once), keeping the last "
        "record of each pair (counted and reported), instead of refusing them",
    )
    a.add_argument(
        "--no-suites",
        action="store_true",
        help="call an entry stale when it matches no record, without building the built-in suites",
    )
    sub.add_parser("fields", help="the names a ledger predicate may test, with their types")
    return p


def _fields() -> int:
    from conformance.ledger.fields import FIELDS

    for name, f in FIELDS.items():
        print(f"{name:28} {f.kind + (' or none' if f.nullable else ''):14} {f.help}")
    return 0


def _print(result, out) -> None:
    from conformance.ledger.audit import by_backend
    from conformance.records import is_lost_device

    w = out.write
    w(
        f"ledger audit over {len(result.files)} files, {result.records} records: {result.problems} problems, "
        f"{result.explained} explained, {result.unexplained_count} unexplained; "
        f"passes claimed by non-flaky entries: {result.passes_claimed}\n"
    )
    if result.unlisted_count:
        w(
            f"  {result.unlisted_count} of the unexplained are an entry's cases in a status or with a message the "
            "entry does not list (UNLISTED below: widen the entry with evidence, or it is another cause)\n"
        )
    if result.collateral_count:
        w(
            f"  {result.collateral_count} of the explained are collateral: pairs a lost device or a broken CUDA "
            "context left unjudged after a fault of a known cause in their run (COLLATERAL below)\n"
        )
    if result.refused_now:
        w(
            f"  {len(result.refused_now)} error record(s) no entry explains are calls the adapter now refuses (the "
            "declared refusal they owed was added since: REFUSED NOW below, not counted as unexplained)\n"
        )
    if result.nonfinite_passes:
        from conformance.records import NONFINITE_PASS

        w(f"  {NONFINITE_PASS}: {result.nonfinite_passes} record(s)\n")
    for path, n in result.skipped.items():
        w(f"  {path}: {n} lines that are not records skipped (--allow-skipped)\n")
    if result.unknown_version:
        w(f"  ({result.unknown_version} explained records carry no PEP 440 version: judged on their case alone)\n")
    w("\nentries:\n")
    for e in result.entries:
        flag = " [flaky]" if e.entry.flaky else " [partial]" if e.entry.partial else ""
        if e.entry.fixed is not None:
            flag += f" [harness defect, fixed in {e.entry.fixed[0]} at {e.entry.fixed[1].isoformat()}]"
        w(
            f"  {e.entry.source}{flag}: explains {e.explained} records ({len(e.explained_cases)} cases), "
            f"claims {len(e.passes_claimed)} passes, flaky or partial passes {e.flaky_passes}, fixed {len(e.fixed)}, "
            f"unlisted {len(e.unlisted)}\n"
            f"      {e.entry.reason}\n"
        )
        for f, r in e.passes_claimed[:5]:
            w(f"      CLAIMS PASS {r.case_id} ({r.version}, {f})\n")
        listed = ", ".join(s + "".join(f" '{m}'" for m in dict(e.entry.messages).get(s, ())) for s in e.entry.statuses)
        for status, message, records in e.unlisted_groups():
            f, r = records[0]
            cases = len({x.case_id for _, x in records})
            w(
                f"      UNLISTED {status} ({len(records)} records, {cases} cases; the entry lists {listed}): "
                f"{message}\n           e.g. {r.case_id} ({r.version}, {f})\n"
            )
        for f, r in e.fixed[:3]:
            w(f"      fixed in {r.version}: {r.case_id} ({f})\n")
        if e.collateral:
            f, r, after = e.collateral[0]
            lost = sum(1 for _, x, _ in e.collateral if is_lost_device(x))
            w(
                f"      COLLATERAL {len(e.collateral)} records after its faults ({lost} lost device, "
                f"{len(e.collateral) - lost} broken context)\n"
                f"           e.g. {r.backend} {r.case_id} after {after} ({f})\n"
            )
    for e in result.stale:
        w(f"  STALE {e.source}: matches no record and no case of the built-in suites\n")
    if result.refused_now:
        w("\nrefused now (error records of calls the adapter declares it cannot run):\n")
        seen: dict[tuple[str, str], list] = {}
        for f, r, why in result.refused_now:
            seen.setdefault((r.backend, why), []).append((f, r))
        for (backend, why), records in sorted(seen.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
            f, r = records[0]
            error = (r.reason or "")[:80]  # a null reason is read as ''
            w(f"  {backend}: {len(records)} record(s) | {why}\n           e.g. {r.case_id}: {error} ({f})\n")
    if result.unexplained:
        w("\nunexplained problems, by backend and signature:\n")
        for backend, groups in by_backend(result.unexplained).items():
            w(f"  {backend} ({sum(len(g.records) for g in groups)}):\n")
            for g in groups:
                f, r = g.records[0]
                cases = len({x.case_id for _, x in g.records})
                w(f"    {len(g.records):4d} records, {cases:3d} cases | {g.signature}\n")
                w(f"           e.g. {r.case_id} ({f})\n")


def main(args: argparse.Namespace) -> int:
    """Run ``attnconf ledger ...``; returns the exit status (a reader that stops early, ``| head``, is
    :func:`conformance.cli.main`'s: 141, quietly)."""
    if args.ledger_command == "fields":
        return _fields()
    from conformance.ledger.entries import load_ledger_dir
    from conformance.ledger.audit import audit

    try:
        ledger = load_ledger_dir(args.ledger_dir)
        result = audit(
            ledger,
            list(args.results),
            suites=not args.no_suites,
            allow_skipped=args.allow_skipped,
            drop_duplicates=args.drop_duplicates,
        )
    except ValueError as exc:
        print(f"attnconf ledger audit: {exc}", file=sys.stderr)
        return 2
    for note in result.notes:
        print(f"attnconf ledger audit: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_json(), indent=1, sort_keys=True))
    else:
        _print(result, sys.stdout)
    if result.passes_claimed:
        return 1
    return 1 if args.strict and result.unexplained_count else 0
