"""Covering arrays: the covering property checked by brute force on a small space, determinism, seeding, the
suites' measured coverage, ``attnconf cases --coverage``."""

from __future__ import annotations

import itertools
import json

import pytest

from conformance.cases import covering, space
from conformance.cases.covering import Strength, coverage, covering_array, measures, uncovered
from conformance.suites.found import found_cases
from conformance.graphs.suite import small_cases
from conformance.suites.registry import DEFAULT, backward_cases, covering_cases, get_suite
from conformance.cli import main

# ------------------------------------------------------------------ a small space, checked by brute force
LEVELS = {"a": (0, 1, 2, 3), "b": ("x", "y", "z"), "c": (False, True), "d": (0, 1, 2, 3, 4), "e": ("p", "q")}


def small_ok(p: dict) -> bool:
    """Three rules; (c=True, e=q) is allowed pairwise by each but excluded by the chain c -> a=3 -> b=z -> e=p."""
    if p.get("a") == 0 and p.get("b") == "z":
        return False
    if "c" in p and "a" in p and p["c"] and p["a"] != 3:
        return False
    if "a" in p and "b" in p and p["a"] == 3 and p["b"] != "z":
        return False
    if "b" in p and "e" in p and p["b"] == "z" and p["e"] != "p":
        return False
    return not ("d" in p and "c" in p and p["d"] == 4 and p["c"])


FULL_POINTS = [
    dict(zip(LEVELS, values)) for values in itertools.product(*LEVELS.values()) if small_ok(dict(zip(LEVELS, values)))
]


def small_possible(axes: tuple[str, ...]) -> set[tuple]:
    return {tuple(p[a] for a in axes) for p in FULL_POINTS}


def small_extensible(partial) -> bool:
    return any(all(p[a] == v for a, v in partial.items()) for p in FULL_POINTS)


def generate(strengths, **kw):
    return covering_array(strengths, levels=LEVELS, possible=small_possible, extensible=small_extensible, **kw)


def brute_missing(rows, axes, t) -> list:
    """Possible t-tuples no row covers, counted independently of the generator's bookkeeping."""
    missing = []
    for sub in itertools.combinations(axes, t):
        have = {tuple(r[a] for a in sub) for r in rows}
        missing += [(sub, v) for v in sorted(small_possible(sub), key=repr) if v not in have]
    return missing


@pytest.mark.parametrize(
    "strengths",
    [
        (Strength(tuple(LEVELS), 2),),
        (Strength(tuple(LEVELS), 2), Strength(("a", "b", "d"), 3)),
        (Strength(tuple(LEVELS), 3),),
        (Strength(tuple(LEVELS), 4),),
    ],
    ids=["t2", "t2+t3abd", "t3", "t4"],
)
@pytest.mark.parametrize("seed", [0, 7])
def test_small_space_covering_property(strengths, seed) -> None:
    rows = generate(strengths, seed=seed)
    assert rows and all(small_ok(r) for r in rows), "every row is a valid point"
    for st in strengths:
        assert brute_missing(rows, st.axes, st.t) == []
    # not wasteful: at most the whole valid space, and a pairwise array is far smaller
    assert len(rows) <= len(FULL_POINTS)
    if strengths == (Strength(tuple(LEVELS), 2),):
        assert len(rows) <= 25
    assert (True, "q") not in small_possible(("c", "e"))  # the chain excludes it, no single rule does
    assert small_ok({"c": True, "e": "q"})


def test_small_space_determinism_and_seeding() -> None:
    strengths = (Strength(tuple(LEVELS), 3),)
    assert generate(strengths, seed=3) == generate(strengths, seed=3)
    rows = generate(strengths, seed=3)
    assert generate(strengths, seeds=rows) == []  # fully seeded: nothing to add
    half = rows[: len(rows) // 2]
    rest = generate(strengths, seeds=half, seed=3)
    assert brute_missing(half + rest, tuple(LEVELS), 3) == []
    assert not any(r in half for r in rest)
    assert len(rest) < len(rows)
    assert len(generate(strengths, seed=3, max_rows=4)) == 4


def test_strength_validation() -> None:
    with pytest.raises(ValueError, match="Strength.t"):
        Strength(("a", "b"), 3)
    with pytest.raises(ValueError, match="unknown axes"):
        generate((Strength(("a", "nope"), 2),))


# ------------------------------------------------------------------ the case space
def test_coverage_counts_match_a_direct_count() -> None:
    cases = get_suite("smoke")
    points = [space.classify(c) for c in cases]
    for axes, t in ((tuple(space.AXES), 2), (space.KERNEL_AXES[:5], 3)):
        covered = possible = 0
        for sub in itertools.combinations(axes, t):
            poss = {
                v
                for v in itertools.product(*(space.AXES[a].values for a in sub))
                if space.extensible(dict(zip(sub, v)))
            }
            have = {tuple(p[a] for a in sub) for p in points}
            covered += len(poss & have)
            possible += len(poss)
        assert coverage(cases, axes, t) == (covered, possible)
        assert len(uncovered(cases, axes, t)) == possible - covered
    assert 0 < covered < possible


def test_default_covers_every_pair_and_every_kernel_triple() -> None:
    cases = get_suite("default")
    pairs, kernel, all3 = measures(cases)
    assert pairs.covered == pairs.possible > 3000 and pairs.line().endswith("(100.0 %)")
    assert kernel.covered == kernel.possible > 17000
    assert all3.covered < all3.possible  # t=3 over all axes is full's job
    # the sweep cases keep their ids and their order; the covering cases come after them, then the found ones
    sweep_ids = list(dict.fromkeys(c.id for sweep in DEFAULT for c in sweep.cases()))
    assert [c.id for c in cases[: len(sweep_ids)]] == sweep_ids
    added = covering_cases("default")
    after = added + found_cases() + tuple(small_cases()) + backward_cases("default")  # backward: issue 20
    assert [c.id for c in cases[len(sweep_ids) :]] == [c.id for c in after]
    assert len(added) <= 3000  # 1,657 before the registry's heads and dims levels, 2,927 with them
    # every heads level meets every dims level (a kernel triple with batch), the wide ones and 224 included
    seen = {(p["heads"], p["dims"]) for p in map(space.classify, cases)}
    assert {(h, d) for h in space.HEADS for d in space.AXES["dims"].values} <= seen
    # small: the space's canonical batches only
    assert max(k for c in added for _, k in c.requests) <= 1100
    assert max(sum(q for q, _ in c.requests) for c in added) <= 500


def _earlier_rows(strengths, base) -> list[dict]:
    """What :func:`covering.cover` gave before the levels :data:`space.EARLIER` names arrived: the same tiers on a
    space whose axes have only their earlier levels (so the generator's level codes and choices are the old ones)."""
    earlier = {a: v for sub in space.EARLIER for a, v in sub.items()}  # one growth so far: its levels
    levels = {a: tuple(earlier.get(a, axis.values)) for a, axis in space.AXES.items()}
    seeds = [space.classify(c) for c in base]
    rows: list[dict] = []
    for within in (space.PLAIN, earlier):
        inside = [p for p in seeds + rows if all(v in within.get(a, (v,)) for a, v in p.items())]
        rows += covering_array(
            strengths,
            seeds=inside,
            levels=levels,
            possible=lambda axes, w=within: space.possible_tuples(axes, w),
            extensible=lambda point, w=within: space.extensible(point, w),
            components=space.COMPONENTS,
        )
    return rows


def test_a_new_level_adds_rows_after_the_earlier_spaces_rows() -> None:
    """Issue 31 added the append levels short and fp8: the rows of the space without them come first, unchanged (so
    the cases they build keep their ids), and only the tuples the new levels make possible add rows, after them."""
    strengths = (Strength(covering.ALL_AXES, 2),)
    base = [c for c in get_suite("smoke") if space.classify(c)["append"] in (False, True)]
    before = [space.build(r).id for r in _earlier_rows(strengths, base)]
    got = [c.id for c in covering.cover(strengths, base)]
    assert got[: len(before)] == before
    new = [space.classify(c)["append"] for c in covering.cover(strengths, base)[len(before) :]]
    assert new and set(new) <= {"short", "fp8"} and {"short", "fp8"} <= set(new)
    # one array over today's space (no earlier tier) does not keep them
    assert [c.id for c in covering.cover(strengths, base, tiers=(space.PLAIN,))][: len(before)] != before


def test_plain_tuples_are_covered_by_plain_cases() -> None:
    """The first tier: every tuple possible inside space.PLAIN is covered by a case inside it, so a backend that
    refuses fp8, sinks, HND or d != dv still runs a case for it."""
    cases = get_suite("default")
    assert coverage(cases, None, 2, within=space.PLAIN) == (coverage(cases, None, 2, within=space.PLAIN)[1],) * 2
    covered, possible = coverage(cases, space.KERNEL_AXES, 3, within=space.PLAIN)
    assert covered == possible > 5000
    # without the tier the plain cases would not do it: the sweeps alone leave most plain triples uncovered
    sweeps = list(dict.fromkeys(c for sweep in DEFAULT for c in sweep.cases()))
    assert coverage(sweeps, space.KERNEL_AXES, 3, within=space.PLAIN)[0] < possible / 2


def test_backend_view_counts_what_a_backend_runs() -> None:
    runs, reaches = covering.backend_view({"sinks", "fp8_e4m3", "hnd"})
    plain = space.build({})
    assert runs(plain) and not runs(space.build({"sinks": True}))
    assert reaches({"dims": (80, 80)}) and not reaches({"sinks": True})
    assert not reaches({"layout": "HND", "dims": (80, 80)})
    assert not reaches({"dims": (80, 80), "mask": "causal", "quant": "fp8_e4m3"})  # through its pair
    assert reaches({"dims": (80, 80), "mask": "causal", "quant": "fp8_e5m2"})
    cases = get_suite("smoke")
    every, limited = measures(cases, 2), measures(cases, 2, refused={"sinks", "paged"})
    assert limited[0].possible < every[0].possible and limited[0].covered < every[0].covered


def test_full_covers_every_triple_and_contains_default() -> None:
    full = get_suite("full")
    covered, possible = coverage(full, None, 3)
    assert covered == possible > 66000
    assert {c.id for c in get_suite("default")} <= {c.id for c in full}


def test_covering_cases_are_deterministic() -> None:
    base = [space.classify(c) for c in get_suite("smoke")]
    first = covering_array(covering.DEFAULT_STRENGTHS, seeds=base, seed=5, max_rows=60)
    assert first == covering_array(covering.DEFAULT_STRENGTHS, seeds=base, seed=5, max_rows=60)
    assert all(space.valid(r) and space.extensible(r) for r in first)
    with pytest.raises(ValueError, match="name must be"):
        covering_cases("smoke")


def test_measure_percent_never_rounds_up_to_100() -> None:
    m = covering.Measure("x", 2, ("a", "b"), 9999, 10000)
    assert m.percent == 99.9 and m.line() == "x: 9,999 / 10,000 (99.9 %)"


# ------------------------------------------------------------------ the CLI
def test_cli_coverage(capsys) -> None:
    assert main(["cases", "--suite", "default", "--coverage"]) == 0
    out = capsys.readouterr().out.splitlines()
    n = len(space.AXES)
    assert out[1].startswith(f"pairwise (all {n} axes): ") and out[1].endswith("(100.0 %)")
    assert out[2].startswith("3-wise (8 kernel axes: batch, heads, dims") and out[2].endswith("(100.0 %)")
    assert out[3].startswith(f"3-wise (all {n} axes): ")

    assert main(["cases", "--suite", "smoke", "--coverage", "--strength", "2", "--uncovered", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["suite"] == "smoke" and data["cases"] == len(get_suite("smoke"))
    pairs = data["measures"][0]
    assert pairs["t"] == 2 and len(pairs["uncovered"]) == pairs["possible"] - pairs["covered"] > 0
    assert all(len(u) == 2 for u in pairs["uncovered"])

    assert main(["cases", "--suite", "smoke", "--uncovered"]) == 2
    assert "need --coverage" in capsys.readouterr().err
    assert main(["cases", "--suite", "smoke", "--coverage", "--strength", "0"]) == 2
    capsys.readouterr()

    assert main(["cases", "--suite", "smoke", "--coverage", "--strength", "2", "--backend", "sdpa-cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] == "sdpa-cpu" and "softcap" in data["refused_features"]
    refused = set(data["refused_features"])
    assert data["backend_runs"] == sum(not (c.features() & refused) for c in get_suite("smoke"))
    assert data["measures"][0]["possible"] < pairs["possible"]
    assert main(["cases", "--suite", "smoke", "--coverage", "--backend", "nope"]) == 2
    assert "--backend nope" in capsys.readouterr().err
