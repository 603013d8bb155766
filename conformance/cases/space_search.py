"""Exact search over the case space (:mod:`conformance.cases.space` re-exports the public names): which partial
points extend to a valid full point, and which tuples of levels some valid case has, per connected component of
the constraint graph (axes that constrain one another), by variable elimination.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterable, Iterator, Mapping
from functools import lru_cache

from conformance.cases.space_axes import AXES, CONSTRAINTS, Point, violations

__all__ = ["COMPONENTS", "extensible", "possible_tuples", "valid_points"]


def _components() -> list[tuple[str, ...]]:
    """Axes grouped into connected components of the constraint graph (singletons for unconstrained axes)."""
    parent = {a: a for a in AXES}

    def find(a: str) -> str:
        while parent[a] != a:
            a = parent[a]
        return a

    for c in CONSTRAINTS:
        for a, b in itertools.pairwise(c.axes):
            parent[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for a in AXES:
        groups.setdefault(find(a), []).append(a)
    return [tuple(g) for g in groups.values()]


COMPONENTS: tuple[tuple[str, ...], ...] = tuple(_components())
_COMPONENT_OF: dict[str, tuple[str, ...]] = {a: comp for comp in COMPONENTS for a in comp}


Within = tuple[tuple[str, tuple[Hashable, ...]], ...]


def _within_key(within: Mapping[str, Iterable[Hashable]] | None) -> Within:
    """A sub-space (axis -> allowed levels; axes left out keep all) as a hashable cache key."""
    if within is None:
        return ()
    unknown = [a for a in within if a not in AXES]
    if unknown:
        raise ValueError(f"within: unknown axes {unknown}; axes are {list(AXES)}")
    return tuple((a, tuple(within[a])) for a in AXES if a in within)


@lru_cache(maxsize=None)
def _component_points(component: tuple[str, ...], within: Within = ()) -> tuple[tuple[Hashable, ...], ...]:
    """Every valid assignment of one component's axes (in component order) inside the sub-space, by
    backtracking: a brute force, for tests (the component of ``cp`` / ``quant`` / ``dims`` has about 10**5
    points; :func:`_eliminate` answers projections and extensibility without listing them)."""
    # each rule checked once, at the depth that assigns the last of its axes (before, it allows any partial point;
    # after, its axes keep their values)
    depth = {a: i for i, a in enumerate(component)}
    due: list[list] = [[] for _ in component]
    for c in CONSTRAINTS:
        if set(c.axes) <= set(component):
            due[max(depth[a] for a in c.axes)].append((c.rule, c.axes))
    allowed = dict(within)
    out: list[tuple[Hashable, ...]] = []

    def extend(partial: dict[str, Hashable], i: int) -> None:
        if i == len(component):
            out.append(tuple(partial[a] for a in component))
            return
        axis = component[i]
        for value in AXES[axis].values:
            if axis in allowed and value not in allowed[axis]:
                continue
            partial[axis] = value
            if all(rule(*(partial[a] for a in axes)) for rule, axes in due[i]):
                extend(partial, i + 1)
            del partial[axis]

    extend({}, 0)
    return tuple(out)


Relation = tuple[tuple[str, ...], frozenset[tuple[Hashable, ...]]]


def _join(a: Relation, b: Relation) -> Relation:
    """Natural join of two relations (scope, rows)."""
    (sa, ra), (sb, rb) = a, b
    shared = [x for x in sa if x in sb]
    extra = tuple(x for x in sb if x not in sa)
    ia, ib = [sa.index(x) for x in shared], [sb.index(x) for x in shared]
    ie = [sb.index(x) for x in extra]
    index: dict[tuple[Hashable, ...], list[tuple[Hashable, ...]]] = {}
    for row in rb:
        index.setdefault(tuple(row[i] for i in ib), []).append(tuple(row[i] for i in ie))
    rows = frozenset(row + tail for row in ra for tail in index.get(tuple(row[i] for i in ia), ()))
    return sa + extra, rows


@lru_cache(maxsize=None)
def _eliminate(
    component: tuple[str, ...], domains: tuple[tuple[Hashable, ...], ...], keep: tuple[str, ...]
) -> frozenset[tuple[Hashable, ...]]:
    """The tuples of ``keep`` (axes of ``component``) that extend to a valid assignment of the whole component
    with each axis in its domain (``domains``: in component order), by variable elimination: the constraints
    as relations, each other axis joined out in turn (the one with the smallest joined table first).  Exact,
    and fast on the space's nearly tree-shaped constraint graph, where listing the component's points is not."""
    dom = dict(zip(component, domains))
    factors: list[Relation] = [((a,), frozenset((v,) for v in dom[a])) for a in component]
    for c in CONSTRAINTS:
        if set(c.axes) <= set(component):
            scope = tuple(dict.fromkeys(c.axes))
            rows = frozenset(
                vals
                for vals in itertools.product(*(dom[a] for a in scope))
                if c.rule(*(vals[scope.index(a)] for a in c.axes))
            )
            factors.append((scope, rows))
    todo = [a for a in component if a not in keep]

    def cheapest() -> str:
        """The axis of ``todo`` whose joined table would be smallest (the first such in ``todo`` order)."""
        scopes: dict[str, set[str]] = {a: set() for a in todo}
        for s, _ in factors:
            for a in s:
                if a in scopes:
                    scopes[a].update(s)
        return min(todo, key=lambda a: math.prod(len(dom[x]) for x in scopes[a]))

    while todo:
        axis = cheapest()
        todo.remove(axis)
        involved = [f for f in factors if axis in f[0]]
        factors = [f for f in factors if axis not in f[0]]
        joined = involved[0]
        for f in involved[1:]:
            joined = _join(joined, f)
        scope, rows = joined
        i = scope.index(axis)
        factors.append((scope[:i] + scope[i + 1 :], frozenset(r[:i] + r[i + 1 :] for r in rows)))
    result: Relation = ((), frozenset({()}))
    for f in factors:
        result = _join(result, f)
    scope, rows = result
    idx = [scope.index(a) for a in keep]
    return frozenset(tuple(r[i] for i in idx) for r in rows)


def _domains(
    component: tuple[str, ...], within: Within, fixed: Point | None = None
) -> tuple[tuple[Hashable, ...], ...]:
    allowed = dict(within)
    fixed = fixed or {}
    return tuple(
        (fixed[a],) if a in fixed else tuple(v for v in AXES[a].values if a not in allowed or v in allowed[a])
        for a in component
    )


@lru_cache(maxsize=None)
def _component_projection(
    component: tuple[str, ...], axes: tuple[str, ...], within: Within = ()
) -> frozenset[tuple[Hashable, ...]]:
    inside = tuple(w for w in within if w[0] in component)
    return _eliminate(component, _domains(component, inside), axes)


@lru_cache(maxsize=None)
def _component_extensible(
    component: tuple[str, ...], assigned: tuple[tuple[str, Hashable], ...], within: Within
) -> bool:
    inside = tuple(w for w in within if w[0] in component)
    return bool(_eliminate(component, _domains(component, inside, dict(assigned)), ()))


def extensible(point: Point, within: Mapping[str, Iterable[Hashable]] | None = None) -> bool:
    """True when the partial point extends to a valid full point (inside the sub-space ``within``: axis ->
    allowed levels); exact, per constraint component."""
    if violations(point):
        return False
    if within is None and len(point) == len(AXES):
        return True  # every axis set and no rule broken: a valid full point
    key = _within_key(within)
    by_comp: dict[tuple[str, ...], list[str]] = {}
    for a in point:
        by_comp.setdefault(_COMPONENT_OF[a], []).append(a)
    for comp, axes in by_comp.items():
        if within is None and len(axes) == len(comp):
            continue  # every axis of the component set and no rule broken: a valid assignment
        if len(axes) <= 5:  # small projections are shared by many queries (5: the covering arrays' fastest bound)
            ordered = tuple(a for a in comp if a in axes)
            if tuple(point[a] for a in ordered) not in _component_projection(comp, ordered, key):
                return False
        elif not _component_extensible(comp, tuple((a, point[a]) for a in comp if a in axes), key):
            return False
    return True


def possible_tuples(
    axes: tuple[str, ...], within: Mapping[str, Iterable[Hashable]] | None = None
) -> frozenset[tuple[Hashable, ...]]:
    """Every tuple of values of ``axes`` that occurs in some valid full point (inside the sub-space ``within``):
    exact, as the product over constraint components of each component's projection (components constrain
    independently)."""
    return _possible_tuples(tuple(axes), _within_key(within))


@lru_cache(maxsize=None)
def _possible_tuples(axes: tuple[str, ...], within: Within) -> frozenset[tuple[Hashable, ...]]:
    parts: list[tuple[tuple[int, ...], frozenset[tuple[Hashable, ...]]]] = []
    for comp in dict.fromkeys(_COMPONENT_OF[a] for a in axes):
        ordered = tuple(a for a in comp if a in axes)
        parts.append((tuple(axes.index(a) for a in ordered), _component_projection(comp, ordered, within)))
    out = set()
    for combo in itertools.product(*(sorted(proj, key=repr) for _, proj in parts)):
        values: list[Hashable] = [None] * len(axes)
        for (positions, _), part in zip(parts, combo):
            for i, v in zip(positions, part):
                values[i] = v
        out.add(tuple(values))
    return frozenset(out)


def valid_points(
    axes: tuple[str, ...], within: Mapping[str, Iterable[Hashable]] | None = None
) -> Iterator[tuple[Hashable, ...]]:
    """:func:`possible_tuples` of ``axes`` in level order."""
    rank = {a: {v: i for i, v in enumerate(AXES[a].values)} for a in axes}
    yield from sorted(possible_tuples(tuple(axes), within), key=lambda t: tuple(rank[a][v] for a, v in zip(axes, t)))
