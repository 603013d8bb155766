"""A peer's test grid walked point by point: every combination of the parameter values it lists, each either mapped
to an :class:`~conformance.cases.case.AttentionCase` or kept with the reason it has none.

A peer module (:mod:`conformance.suites.peers`) lists a test's values (facts of its source file) and a ``make``
function that builds the case of one combination as the test builds its call.  ``make`` returns the case, or None
for a combination the test itself skips (``pytest.skip``: no call), or raises :class:`Dropped` for a call the case
model says as another point's case (:data:`SAME_CALL`); a
:class:`~conformance.cases.case.CaseError` (the case model refuses the combination) is kept as :data:`REFUSED` with
its message.  :func:`walk` yields a :class:`Point` per combination the test runs, so a suite's size, its refusals
and its calls without a case are all counts over one list, and a test can pin each; :func:`walk_part` walks a part
of a grid, so that the points a later case field made cases of come after the earlier cases (their order kept).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from conformance.cases.case import AttentionCase, CaseError

__all__ = [
    "REFUSED",
    "SAME_CALL",
    "Dropped",
    "PeerSuite",
    "Point",
    "walk",
    "walk_part",
]

#: The case model refuses the combination (the message follows, after ``: ``).
REFUSED = "refused by the case model"
#: The combination makes the call another point already stands for (a parameter without effect there).
SAME_CALL = "same call as another point"


class Dropped(Exception):
    """Raised by a ``make`` function: the combination runs in the peer's test but has no case of its own here;
    ``reason`` says why (:data:`SAME_CALL`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Point:
    """One combination of a peer test's parameters that the test runs: ``params`` (name, value) in the order the
    module lists them, and either ``case`` or ``dropped`` (the reason there is none)."""

    test: str
    params: tuple[tuple[str, Any], ...]
    case: AttentionCase | None
    dropped: str = ""

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.params)


def walk(
    test: str, axes: Sequence[tuple[str, Iterable[Any]]], make: Callable[..., AttentionCase | None]
) -> Iterator[Point]:
    """A :class:`Point` for every combination of ``axes`` (``(name, values)``, the first varying slowest) that
    ``make(**combination)`` does not skip (returns None for)."""
    names = [name for name, _ in axes]
    for values in itertools.product(*(tuple(v) for _, v in axes)):
        params = tuple(zip(names, values))
        try:
            case = make(**dict(params))
        except Dropped as why:
            yield Point(test, params, None, why.reason)
            continue
        except CaseError as refusal:
            yield Point(test, params, None, f"{REFUSED}: {refusal.line}")
            continue
        if case is not None:
            yield Point(test, params, case)


def walk_part(
    test: str,
    axes: Sequence[tuple[str, Iterable[Any]]],
    make: Callable[..., AttentionCase | None],
    part: Callable[..., bool],
) -> Iterator[Point]:
    """:func:`walk` over the combinations ``part(**combination)`` holds for only: a grid walked in two parts (``part``
    and its negation) has every point once, the second part's after the first's."""
    return walk(test, axes, lambda **combination: make(**combination) if part(**combination) else None)


@dataclass(frozen=True)
class PeerSuite:
    """A named suite of one peer's test grids: ``source`` says where the values come from (repository, commit or
    tag, file, test functions), ``backends`` are the adapters it is meant for, ``grids`` walks every test's grid
    (:func:`walk`, uncached: :meth:`points` keeps one walk per process)."""

    name: str
    source: str
    backends: tuple[str, ...]
    grids: Callable[[], Iterator[Point]]

    def points(self) -> tuple[Point, ...]:
        """Every point of :attr:`grids`, in grid order (walked once per process); a point whose case another point
        already has (two combinations whose seeded draws coincide: short sequences leave few lengths to draw) is
        kept as :data:`SAME_CALL`, so every case id appears once."""
        return _points(self)

    def cases(self) -> list[AttentionCase]:
        """The cases of every point that has one, in grid order."""
        return [p.case for p in self.points() if p.case is not None]

    def dropped(self) -> Counter[str]:
        """How many points have no case, by reason (a refusal's reason without its message)."""
        return Counter(p.dropped.split(": ")[0] for p in self.points() if p.case is None)

    def summary(self) -> str:
        """One line: the grid's points, its cases, the points without a case by reason, the source and backends."""
        points = self.points()
        dropped = ", ".join(f"{reason} {n:,}" for reason, n in sorted(self.dropped().items()))
        return (
            f"{self.name}: {len(points):,} points of the peer's grid, {len(points) - sum(self.dropped().values()):,} "
            f"cases; without a case: {dropped or 'none'}; source: {self.source}; meant for "
            f"{', '.join(self.backends)}"
        )


@cache
def _points(suite: PeerSuite) -> tuple[Point, ...]:
    seen: set[str] = set()
    out = []
    for point in suite.grids():
        case = point.case
        if case is not None:
            if case.id in seen:
                point = replace(point, case=None, dropped=SAME_CALL)
            else:
                seen.add(case.id)
        out.append(point)
    return tuple(out)
