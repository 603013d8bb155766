"""``attnconf backends``, ``attnconf cases`` and ``attnconf suites``: what is installed, what a suite holds (its
cases, its coverage of the case space) and which suites there are; their subparsers and handlers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from conformance.suites.descriptions import SUITE_DESCRIPTIONS, suites_epilog

__all__ = [
    "CASES_WIDTH",
    "add_backends_parser",
    "add_cases_parser",
    "add_suites_parser",
    "backends",
    "case_lines",
    "cases",
    "suites",
]

#: The width ``attnconf cases`` fits its lines to when standard output is not a terminal and ``$COLUMNS`` is unset.
CASES_WIDTH = 120


def _strength(text: str) -> int:
    """``--strength``: an integer from 1 to the number of kernel axes (:data:`conformance.cases.space.KERNEL_AXES`:
    a t-tuple needs t distinct axes)."""
    from conformance.cases.space import KERNEL_AXES
    from conformance.running.usage import bounded_int

    return bounded_int(1, len(KERNEL_AXES))(text)


def add_backends_parser(sub) -> None:
    """The ``backends`` subparser."""
    b = sub.add_parser("backends", help="capability matrix of the installed backends")
    b.add_argument("--json", action="store_true", help="machine-readable, with every refusal's reason")
    b.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="NAME",
        help="only these (registry name or module:Class; an unknown registry name is refused, exit 2; a "
        "module:Class that cannot be loaded is shown as not available)",
    )


def add_cases_parser(sub) -> None:
    """The ``cases`` subparser."""
    from conformance.running.selection import add_selection_args

    cs = sub.add_parser(
        "cases",
        help="list the cases of a suite (a peer-* suite: then one line of its grid's points without a case, "
        "by reason: refused by the case model, pending a case field, the same call as another point), or measure its "
        "coverage of the case space",
        description="One line per selected case: its id (what --case and the records name) and its requests' "
        "query/key lengths, cut to the terminal's width (COLUMNS, else 120 columns when the output is not a "
        "terminal; an id longer than that stands alone, never cut); then the count per feature. --long prints "
        "every field of each case, --json all of it for scripts, --count the number of cases alone. Exit status 0; "
        "2 on an unknown suite or "
        "feature, or a selection that holds no case.",
        epilog=suites_epilog(),
    )
    cs.add_argument("--suite", required=True, metavar="NAME", help="the suite (listed below and by attnconf suites)")
    add_selection_args(cs)
    cs.add_argument(
        "--json",
        action="store_true",
        help="a JSON list, one object per case: id, summary (the --long line), features, and the case's fields",
    )
    cs.add_argument(
        "--count",
        action="store_true",
        help="print only the number of selected cases (one line: the figure docs and scripts cite, never copied into "
        "prose)",
    )
    cs.add_argument(
        "--long",
        action="store_true",
        help="one line per case with every field (heads, head dims, dtype, layout, window, soft-cap, quantization, "
        "features), however long",
    )
    cs.add_argument(
        "--coverage",
        action="store_true",
        help="print covered / possible t-tuples of axis levels (conformance.cases.space): pairwise over all axes, "
        "3-wise over the kernel axes, 3-wise over all axes",
    )
    cs.add_argument(
        "--strength",
        type=_strength,
        metavar="T",
        help="with --coverage: T-wise over all axes and over the kernel axes, 1 <= T <= the number of kernel axes",
    )
    cs.add_argument("--uncovered", action="store_true", help="with --coverage: also list every missing tuple")
    cs.add_argument(
        "--backend",
        metavar="NAME",
        help="with --coverage: over the cases this backend runs and the tuples it reaches, by its declared "
        "features (registry name or module:Class; need not be installed here)",
    )


def add_suites_parser(sub) -> None:
    """The ``suites`` subparser."""
    su = sub.add_parser(
        "suites",
        help="list the named suites, one line each",
        description="The suites --suite takes (run, warmup, cases), each with one line on what it holds "
        "(conformance/suites/descriptions.py). Exit status 0.",
    )
    su.add_argument("--json", action="store_true", help='a JSON list of {"name", "description"}, in the same order')


def suites(args: argparse.Namespace) -> int:
    """``attnconf suites``: every registered suite and its line (no torch import: the lines are data)."""
    if args.json:
        print(json.dumps([{"name": n, "description": d} for n, d in SUITE_DESCRIPTIONS.items()], indent=1))
        return 0
    width = max(map(len, SUITE_DESCRIPTIONS))
    for name, line in SUITE_DESCRIPTIONS.items():
        print(f"{name:<{width}}  {line}")
    return 0


def backends(args: argparse.Namespace) -> int:
    """``attnconf backends``: the capability matrix (a rich table, or ``--json``); a :class:`UsageError` for an
    unknown registry name."""
    from attnfast.registry import available_names

    from conformance.cases.case import FEATURES
    from conformance.running.env import backend_info, refused_features, resolve_backend
    from conformance.running.pairs import check_backend_names

    check_backend_names(tuple(args.backend))  # an unknown registry name is a typo: exit 2, listing the names
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
    from rich.table import Table

    from conformance.console import PipeConsole

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
    console = PipeConsole(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    for spec, info in infos.items():
        if info.get("available") != "yes":
            console.print(
                f"{info.get('name', spec)}: not available: {info.get('unavailable_reason', '')}",
                highlight=False,
            )
    return 0


def cases(args: argparse.Namespace) -> int:
    """``attnconf cases``: the selected cases of a suite (and, for a ``peer-*`` suite, its grid's points without a
    case, by reason), or (``--coverage``) its coverage of the case space."""
    from conformance.suites.peers import PEERS
    from conformance.running.selection import select_cases, selection_kwargs
    from conformance.exits import UsageError

    if (args.strength is not None or args.uncovered or args.backend) and not args.coverage:
        raise UsageError("--strength, --uncovered and --backend need --coverage")
    if args.long and (args.json or args.coverage):
        raise UsageError("--long lists the cases as text: not with --json or --coverage")
    if args.count and (args.json or args.coverage or args.long):
        raise UsageError("--count prints the number of cases alone: not with --json, --long or --coverage")
    cases = select_cases(args.suite, tuple(args.case), **selection_kwargs(args))
    if args.count:
        print(len(cases))
        return 0
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
    import shutil

    width = max(shutil.get_terminal_size((CASES_WIDTH, 24)).columns, 40)
    for line in case_lines(cases, width, long=args.long):
        print(line)
    counts = Counter(f for c in cases for f in c.features())
    print()
    for line in _fill(
        f"{len(cases)} cases; per feature:",
        [f"{f} {counts[f]}," for f in sorted(counts, key=lambda f: (-counts[f], f))],
        width,
    ):
        print(line)
    if args.suite in PEERS:  # a peer's grid: what it holds that the suite has no case for
        print(PEERS[args.suite].summary())
    return 0


def case_lines(cases: list, width: int, *, long: bool = False) -> list[str]:
    """``attnconf cases``: ``ID  N req  q/kv Q/K Q/K ...`` per case, each line at most ``width`` characters: the
    id column as wide as nine ids in ten (at most ``width - 20``), a longer id pushing its lengths right, the lengths
    cut with ``...``, and an id that leaves no room for them alone on its line, whole (ids are never cut: ``--case``
    takes them); ``long``: ``ID  SUMMARY`` (:meth:`~conformance.cases.case.AttentionCase.summary`, every
    field), however long."""
    ids = [c.id for c in cases]
    lengths = sorted(map(len, ids))
    column = min(lengths[(len(lengths) - 1) * 9 // 10], width - 20)
    lines = []
    for case_id, case in zip(ids, cases):
        if long:
            lines.append(f"{case_id:<{column}}  {case.summary()}")
            continue
        head = f"{case_id:<{column}}  "
        room = width - len(head)
        reqs = case.requests
        text = f"{len(reqs):>3} req  q/kv " + " ".join(f"{q}/{k}" for q, k in reqs)
        if len(text) > room:
            text = text[: max(room - 3, 0)].rsplit(" ", 1)[0] + " ..."
        lines.append(head + text if room >= 16 else case_id)
    return lines


def _fill(first: str, words: list[str], width: int) -> list[str]:
    """``first`` then ``words`` (each kept whole), wrapped to ``width``, later lines indented by two spaces; the
    last word's trailing comma dropped."""
    if words:
        words[-1] = words[-1].rstrip(",")
    lines, line = [], first
    for word in words:
        if len(line) + 1 + len(word) > width:
            lines.append(line)
            line = "  " + word
        else:
            line += " " + word
    return [*lines, line]


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
