"""Covering arrays over the case space (:mod:`conformance.cases.space`), and coverage measured on any case list.

A covering array of strength t over a set of axes holds, for every t of those axes, every combination of their
levels that can occur in a valid case (:func:`~conformance.cases.space.possible_tuples`: exact, constraints
and their chains included) in at least one row.  :func:`covering_array` builds a mixed-strength one
(:class:`Strength` entries: ``default`` = t=2 over all axes + t=3 over the kernel axes, ``full`` = t=3 over all
axes), *seeded* with existing rows: the tuples a suite's hand-picked cases already cover (classified with
:func:`~conformance.cases.space.classify`) are not asked for again, so only what they leave uncovered adds
rows and the existing case ids stay as they are.

:func:`cover` (what the suites call) builds it in tiers: first every tuple possible inside :data:`space.PLAIN`
(equal head dims, 16-bit, contiguous or NHD, no chunk mask, no quantization, no modifier) by plain cases, then the
space before each level added to an existing axis (:data:`space.EARLIER`), then the rest of the space. A tier
restricted to an axis's earlier levels gives the rows the space without the new levels gave (the generator's level
codes keep their order and the new levels never fit), so a new level adds rows after them. In one tier the greedy
choice fills rows with whatever covers most; the plain tier first makes a backend that refuses the rarer levels
still run the tuples it can (``attnconf cases --coverage --backend B`` measures this per backend).

The generator is a greedy one-row-at-a-time AETG/IPOG-style construction (why not a PyPI library, and the figures
behind each tier: ``docs/concepts/coverage.md``, *History*).  Each row starts from an uncovered tuple of the axis
set with the most uncovered tuples, then fills the other axes (most uncovered tuples first) with the level that
completes the most uncovered tuples, among the levels that keep the row extensible to a valid case; ties go to the
axis default (plain cases run on more backends), then to a seeded random choice.  Every row is a valid case by
construction and every possible tuple is covered (a row that starts from a possible tuple always completes), unless
``max_rows`` stops it first.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from conformance.cases import space
from conformance.cases.case import AttentionCase

__all__ = [
    "DEFAULT_STRENGTHS",
    "FULL_STRENGTHS",
    "Measure",
    "Strength",
    "backend_view",
    "cover",
    "coverage",
    "covering_array",
    "measures",
    "uncovered",
]

Point = dict[str, Hashable]


@dataclass(frozen=True)
class Strength:
    """Cover every ``t``-tuple of levels over ``axes`` (every t of them)."""

    axes: tuple[str, ...]
    t: int

    def __post_init__(self) -> None:
        if not 1 <= self.t <= len(self.axes):
            raise ValueError(f"Strength.t must be between 1 and len(axes) = {len(self.axes)}, got {self.t}")
        if len(set(self.axes)) != len(self.axes):
            raise ValueError(f"Strength.axes must be distinct, got {self.axes!r}")

    def subsets(self) -> list[tuple[str, ...]]:
        return list(itertools.combinations(self.axes, self.t))


ALL_AXES: tuple[str, ...] = tuple(space.AXES)
#: ``default``: every pair of levels over all axes, every triple over the axes that interact inside kernels.
DEFAULT_STRENGTHS: tuple[Strength, ...] = (Strength(ALL_AXES, 2), Strength(space.KERNEL_AXES, 3))
#: ``full``: every triple of levels over all axes.
FULL_STRENGTHS: tuple[Strength, ...] = (Strength(ALL_AXES, 3),)


def _target_subsets(strengths: Iterable[Strength], order: Sequence[str]) -> list[tuple[str, ...]]:
    """The axis sets to cover, in axis order; a set inside a larger one is dropped (covering every possible
    tuple of the larger covers every possible tuple of the smaller: a possible tuple extends to a valid case)."""
    rank = {a: i for i, a in enumerate(order)}
    subsets = {tuple(sorted(s, key=rank.__getitem__)) for st in strengths for s in st.subsets()}
    inside = {sub for o in subsets for n in range(1, len(o)) for sub in itertools.combinations(o, n)}
    kept = [s for s in subsets if s not in inside]
    return sorted(kept, key=lambda s: (len(s), [rank[a] for a in s]))


def covering_array(
    strengths: Sequence[Strength],
    *,
    seeds: Iterable[Mapping[str, Hashable]] = (),
    seed: int = 0,
    max_rows: int | None = None,
    levels: Mapping[str, Sequence[Hashable]] | None = None,
    possible: Callable[[tuple[str, ...]], Iterable[tuple[Hashable, ...]]] | None = None,
    extensible: Callable[[Mapping[str, Hashable]], bool] | None = None,
    components: Sequence[Sequence[str]] | None = None,
    within: Mapping[str, Sequence[Hashable]] | None = None,
) -> list[Point]:
    """Rows (full points) that, with ``seeds``, cover every possible tuple the ``strengths`` ask for.

    ``seeds``: points already run (their tuples count as covered; they are not returned).  ``seed``: the
    tie-breaking random stream (same arguments, same rows).  ``max_rows``: stop after this many rows.
    ``within``: a sub-space of the case space (axis -> allowed levels, e.g. :data:`space.PLAIN`): rows stay in
    it and only the tuples possible in it are asked for.
    ``levels`` / ``possible`` / ``extensible`` / ``components`` default to the case space (:data:`space.AXES`,
    :func:`space.possible_tuples`, :func:`space.extensible`, :data:`space.COMPONENTS`: axis groups that
    constrain each other only within the group; ``extensible`` is asked about one group at a time); tests pass
    a small space of their own (``components=None`` with ``levels`` given: one group of every axis)."""
    if levels is None:
        levels = {a: tuple(ax.values) for a, ax in space.AXES.items()}
        components = space.COMPONENTS if components is None else components
        if within is not None:  # rows and targets inside the sub-space
            possible = possible or (lambda axes: space.possible_tuples(axes, within))
            extensible = extensible or (lambda point: space.extensible(point, within))
    elif within is not None:
        raise ValueError("covering_array: within applies to the case space (levels=None)")
    levels = dict(levels)
    possible = space.possible_tuples if possible is None else possible
    extensible = space.extensible if extensible is None else extensible
    names = list(levels)
    components = [tuple(names)] if components is None else [tuple(c) for c in components]
    for st in strengths:
        unknown = [a for a in st.axes if a not in levels]
        if unknown:
            raise ValueError(f"Strength.axes: unknown axes {unknown}; axes are {names}")
    pos = {a: i for i, a in enumerate(names)}
    comp_of = {pos[a]: tuple(pos[x] for x in c) for c in components for a in c}
    index = [{v: i for i, v in enumerate(levels[a])} for a in names]
    radix = [len(levels[a]) for a in names]
    subsets = [tuple(pos[a] for a in s) for s in _target_subsets(strengths, names)]
    # a tuple of subset s is the mixed-radix code sum(level index * mult) over its axes
    mults = []
    for s in subsets:
        place, acc = [], 1
        for j in reversed(s):
            place.append(acc)
            acc *= radix[j]
        mults.append(tuple(reversed(place)))

    uncovered: list[set[int]] = []
    for s, m in zip(subsets, mults):
        tuples = list(possible(tuple(names[i] for i in s)))
        packed = np.zeros(len(tuples), dtype=np.int64)
        for i, w, column in zip(s, m, zip(*tuples) if tuples else [() for _ in s]):
            packed += np.array([index[i][v] for v in column], dtype=np.int64) * w
        uncovered.append(set(packed.tolist()))
    seed_rows = {tuple(index[i].get(p.get(a), -1) for i, a in enumerate(names)) for p in seeds}
    if seed_rows:
        codes = np.array(sorted(seed_rows), dtype=np.int64)
        for k, (s, m) in enumerate(zip(subsets, mults)):
            sub = codes[:, list(s)]
            ok = (sub >= 0).all(axis=1)
            uncovered[k] -= set((sub[ok] @ np.array(m, dtype=np.int64)).tolist())
    # subsets per axis, those with tuples left only (rebuilt when one empties)
    by_axis = [[k for k, s in enumerate(subsets) if i in s and uncovered[k]] for i in range(len(names))]
    memo: dict[tuple[tuple[int, ...], tuple[int | None, ...]], bool] = {}

    def fits(row: list[int | None], i: int) -> bool:
        comp = comp_of[i]
        key = (comp, tuple(row[j] for j in comp))
        if key not in memo:
            memo[key] = extensible({names[j]: levels[names[j]][v] for j in comp if (v := row[j]) is not None})
        return memo[key]

    rng = random.Random(seed)
    rows: list[Point] = []
    while max_rows is None or len(rows) < max_rows:
        live_k = sorted({k for ks in by_axis for k in ks})
        if not live_k:
            break
        start = max(live_k, key=lambda k: (len(uncovered[k]), -k))
        row: list[int | None] = [None] * len(names)
        code = min(uncovered[start])
        for j, w in zip(subsets[start], mults[start]):
            row[j], code = divmod(code, w)
        free = [i for i in range(len(names)) if row[i] is None]
        rng.shuffle(free)
        sizes = np.fromiter(map(len, uncovered), dtype=np.int64, count=len(uncovered))
        weight = {i: int(sizes[by_axis[i]].sum()) for i in free}
        free.sort(key=lambda i: -weight[i])  # stable: the shuffle breaks ties
        for i in free:
            live = []
            for k in by_axis[i]:
                base, step = 0, 0
                for j, w in zip(subsets[k], mults[k]):
                    level = row[j]
                    if j == i:
                        step = w
                    elif level is None:
                        break
                    else:
                        base += level * w
                else:
                    live.append((uncovered[k], base, step))
            best: list[int] = []
            best_score = -1
            for v in range(radix[i]):
                row[i] = v
                if not fits(row, i):
                    continue
                score = sum((base + v * step) in unc for unc, base, step in live)
                if score > best_score:
                    best, best_score = [v], score
                elif score == best_score:
                    best.append(v)
            if not best:  # cannot happen: the start tuple is possible and each step keeps the row extensible
                raise AssertionError(f"covering_array: no level of {names[i]!r} extends row {row}")
            row[i] = 0 if 0 in best else rng.choice(best)
        full = [v for v in row if v is not None]
        assert len(full) == len(row)  # every axis has its level now
        emptied = False
        for k in live_k:
            uncovered[k].discard(sum(full[j] * w for j, w in zip(subsets[k], mults[k])))
            emptied = emptied or not uncovered[k]
        if emptied:
            by_axis = [[k for k in ks if uncovered[k]] for ks in by_axis]
        rows.append({a: levels[a][full[i]] for i, a in enumerate(names)})
    return rows


def cover(
    strengths: Sequence[Strength],
    base: Iterable[AttentionCase],
    *,
    seed: int = 0,
    tiers: Sequence[Mapping[str, Sequence[Hashable]]] = (space.PLAIN, *space.EARLIER),
) -> tuple[AttentionCase, ...]:
    """The cases a suite adds to ``base`` (its hand-picked cases) to cover ``strengths``, tier by tier: first the
    tuples possible inside each sub-space of ``tiers`` by cases inside it (only the base cases and earlier rows
    inside it count as covering them), then the rest of the space.  The default tiers are :data:`space.PLAIN`, then
    the space before each growth (:data:`space.EARLIER`), so a level added to an axis adds rows after the ones the
    space had without it, which keep their ids.  ``tiers=()``: one array."""
    seeds = [space.classify(c) for c in base]
    rows: list[Point] = []
    for within in tiers:
        inside = [p for p in seeds + rows if all(v in within.get(a, (v,)) for a, v in p.items())]
        rows += covering_array(strengths, seeds=inside, seed=seed, within=within)
    rows += covering_array(strengths, seeds=seeds + rows, seed=seed)
    return tuple(space.build(row) for row in rows)


# ---------------------------------------------------------------------------------------------- measuring
def _encode(points: Sequence[Mapping[str, Hashable]], axes: Sequence[str]) -> np.ndarray:
    index = {a: {v: i for i, v in enumerate(space.AXES[a].values)} for a in axes}
    return np.array([[index[a][p[a]] for a in axes] for p in points], dtype=np.int64).reshape(len(points), len(axes))


def _tuple_codes(codes: np.ndarray, cols: Sequence[int], radix: Sequence[int]) -> np.ndarray:
    out = np.zeros(codes.shape[0], dtype=np.int64)
    for c, r in zip(cols, radix):
        out = out * r + codes[:, c]
    return out


def _walk(
    cases: Iterable[AttentionCase],
    axes: Sequence[str] | None,
    t: int,
    reachable: Callable[[Mapping[str, Hashable]], bool] | None = None,
    within: Mapping[str, Sequence[Hashable]] | None = None,
):
    axes = tuple(space.AXES) if axes is None else tuple(axes)
    unknown = [a for a in axes if a not in space.AXES]
    if unknown:
        raise ValueError(f"axes: unknown {unknown}; axes are {list(space.AXES)}")
    if not 1 <= t <= len(axes):
        raise ValueError(f"t must be between 1 and the number of axes ({len(axes)}), got {t}")
    points = list({tuple(sorted(p.items(), key=str)): p for p in map(space.classify, cases)}.values())
    if within is not None:
        points = [p for p in points if all(v in within.get(a, (v,)) for a, v in p.items())]
    codes = _encode(points, axes)
    index = {a: {v: i for i, v in enumerate(space.AXES[a].values)} for a in axes}
    for cols in itertools.combinations(range(len(axes)), t):
        sub = tuple(axes[c] for c in cols)
        radix = [len(space.AXES[a].values) for a in sub]
        have = set(np.unique(_tuple_codes(codes, cols, radix)).tolist())
        for values in space.valid_points(sub, within):
            if reachable is not None and not reachable(dict(zip(sub, values))):
                continue
            code = 0
            for a, v, r in zip(sub, values, radix):
                code = code * r + index[a][v]
            yield sub, values, code in have


def coverage(
    cases: Iterable[AttentionCase],
    axes: Sequence[str] | None = None,
    t: int = 2,
    within: Mapping[str, Sequence[Hashable]] | None = None,
) -> tuple[int, int]:
    """(covered, possible) ``t``-tuples of levels over ``axes`` (default: all) for the classified cases;
    possible = the tuples some valid case has (exact).  With ``within`` (a sub-space such as
    :data:`space.PLAIN`): the tuples possible inside it, covered by the cases inside it."""
    covered = possible = 0
    for _, _, hit in _walk(cases, axes, t, within=within):
        possible += 1
        covered += hit
    return covered, possible


def uncovered(cases: Iterable[AttentionCase], axes: Sequence[str] | None = None, t: int = 2) -> list[Point]:
    """The possible ``t``-tuples over ``axes`` no case covers, as ``{axis: level}`` dicts."""
    return [dict(zip(sub, values)) for sub, values, hit in _walk(cases, axes, t) if not hit]


# ---------------------------------------------------------------------------------------------- the CLI's figures
@dataclass(frozen=True)
class Measure:
    """One coverage figure: ``covered`` of ``possible`` ``t``-tuples over ``axes``."""

    name: str
    t: int
    axes: tuple[str, ...]
    covered: int
    possible: int
    missing: tuple[Point, ...] | None = None

    @property
    def percent(self) -> float:
        """Rounded down to 0.1, so a figure below 100 % never prints as 100.0."""
        return 100.0 if self.possible == 0 else (1000 * self.covered // self.possible) / 10

    def line(self) -> str:
        return f"{self.name}: {self.covered:,} / {self.possible:,} ({self.percent:.1f} %)"

    def to_json(self) -> dict:
        out = {
            "name": self.name,
            "t": self.t,
            "axes": list(self.axes),
            "covered": self.covered,
            "possible": self.possible,
            "percent": self.percent,
        }
        if self.missing is not None:
            out["uncovered"] = [{a: list(v) if isinstance(v, tuple) else v for a, v in m.items()} for m in self.missing]
        return out


def backend_view(refused: Iterable[str]) -> tuple[Callable[[AttentionCase], bool], Callable[[Mapping], bool]]:
    """What a backend that refuses the features ``refused`` (:data:`~conformance.cases.case.FEATURES` names, as
    it declares them) runs and reaches: ``runs(case)`` when the case has none of them; ``reaches(tuple)`` for a
    single level or a pair when its plainest valid completion (:func:`space.build`: left-out axes at their
    defaults) has none of them, for a larger tuple when every pair in it is reachable.  Refusals that depend on
    values rather than features (a block size, a head dim) are not seen: they count as reachable."""
    refused = frozenset(refused)
    memo: dict[frozenset, bool] = {}

    def runs(case: AttentionCase) -> bool:
        return not (case.features() & refused)

    def plain(items: frozenset) -> bool:
        if items not in memo:
            memo[items] = runs(space.build(dict(items)))
        return memo[items]

    def reaches(point: Mapping) -> bool:
        items = list(point.items())
        if len(items) <= 2:
            return plain(frozenset(items))
        return all(plain(frozenset(pair)) for pair in itertools.combinations(items, 2))

    return runs, reaches


def measures(
    cases: Sequence[AttentionCase],
    strength: int | None = None,
    *,
    with_missing: bool = False,
    refused: Iterable[str] | None = None,
) -> list[Measure]:
    """The figures ``attnconf cases --coverage`` prints: t=2 over all axes, t=3 over the kernel axes and t=3
    over all axes; with ``strength`` T, t=T over all axes and over the kernel axes.  With ``refused`` (one
    backend's declared refusals, :func:`backend_view`): over the cases it runs and the tuples it reaches."""
    reaches = None
    if refused is not None:
        runs, reaches = backend_view(refused)
        cases = [c for c in cases if runs(c)]
    all_axes, kernel = tuple(space.AXES), space.KERNEL_AXES
    wanted: list[tuple[str, int, tuple[str, ...]]]
    if strength is None:
        wanted = [
            (f"pairwise (all {len(all_axes)} axes)", 2, all_axes),
            (f"3-wise ({len(kernel)} kernel axes: {', '.join(kernel)})", 3, kernel),
            (f"3-wise (all {len(all_axes)} axes)", 3, all_axes),
        ]
    else:
        if not 1 <= strength <= len(kernel):
            raise ValueError(f"strength must be between 1 and {len(kernel)}, got {strength}")
        wanted = [
            (f"{strength}-wise (all {len(all_axes)} axes)", strength, all_axes),
            (f"{strength}-wise ({len(kernel)} kernel axes: {', '.join(kernel)})", strength, kernel),
        ]
    out = []
    for name, t, axes in wanted:
        covered, possible, missing = 0, 0, []
        for sub, values, hit in _walk(cases, axes, t, reaches):
            possible += 1
            covered += hit
            if with_missing and not hit:
                missing.append(dict(zip(sub, values)))
        out.append(Measure(name, t, axes, covered, possible, tuple(missing) if with_missing else None))
    return out
