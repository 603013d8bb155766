"""``attnconf backends`` and ``attnconf cases``: what is installed and what a suite holds (its cases, its
coverage of the case space); their subparsers and handlers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

__all__ = ["add_backends_parser", "add_cases_parser", "backends", "cases"]


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
    )
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


def backends(args: argparse.Namespace) -> int:
    """``attnconf backends``: the capability matrix (a rich table, or ``--json``); a :class:`UsageError` for an
    unknown registry name."""
    from attnfast.registry import available_names

    from conformance.cases.case import FEATURES
    from conformance.running.env import backend_info, refused_features, resolve_backend
    from conformance.running.pairs import _check_names

    _check_names(tuple(args.backend))  # an unknown registry name is a typo: exit 2, listing the names
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
    from conformance.cases.peers import PEERS
    from conformance.running.selection import select_cases, selection_kwargs
    from conformance.exits import UsageError

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
    if args.suite in PEERS:  # a peer's grid: what it holds that the suite has no case for
        print(PEERS[args.suite].summary())
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
