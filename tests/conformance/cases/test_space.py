"""The case space: constraints, building, classification."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases import space
from conformance.cases.case import AttentionCase
from conformance.suites.registry import get_suite
from conformance.cases.sweep import BATCHES

# one violating and one satisfying point per constraint
CONSTRAINT_EXAMPLES = {
    "block_size_iff_paged": (
        [{"layout": "contiguous", "block_size": 16}, {"layout": "NHD", "block_size": None}],
        [{"layout": "contiguous", "block_size": None}, {"layout": "HND", "block_size": 1}],
    ),
    "append_needs_q_le_kv": (
        [{"append": True, "batch": b} for b in ("sq>sk", "cross", "empty-kv")] + [{"append": "fp8", "batch": "cross"}],
        [
            {"append": True, "batch": "decode"},
            {"append": False, "batch": "cross"},
            {"append": "short", "batch": "sq>sk"},
        ],
    ),
    "short_append_fits_batch": (
        [{"append": "short", "batch": b} for b in ("decode", "single-token", "empty-kv")],
        [{"append": "short", "batch": b} for b in ("spec-decode", "cross", "prefill")]
        + [{"append": True, "batch": "decode"}],
    ),
    "append_quant": (
        [
            {"append": True, "quant": "fp8_e4m3"},
            {"append": True, "quant": "int8_t2"},
            {"append": "fp8", "quant": "none"},
        ]
        + [{"append": "short", "quant": "int8_t1"}, {"append": "fp8", "quant": "int8_t2"}],
        [
            {"append": True, "quant": "none"},
            {"append": False, "quant": "int8_t1"},
            {"append": "fp8", "quant": "fp8_e5m2"},
        ]
        + [{"append": "short", "quant": "fp8_e4m3"}, {"append": "short", "quant": "none"}],
    ),
    "quant_needs_16bit_dtype": (
        [{"quant": "fp8_e5m2", "dtype": "fp32"}],
        [{"quant": "fp8_e5m2", "dtype": "fp16"}, {"quant": "none", "dtype": "fp32"}],
    ),
    "descale_per_family": (
        [{"quant": "none", "descale": "tensor"}, {"quant": "fp8_e4m3", "descale": "token"}],
        [{"quant": "int8_t1", "descale": "token"}, {"quant": "fp8_e4m3", "descale": "head"}],
    ),
    "quant_q_only_fp8": (
        [{"quant": "none", "quant_q": False}, {"quant": "int8_t2", "quant_q": False}],
        [{"quant": "fp8_e5m2", "quant_q": False}, {"quant": "none", "quant_q": True}],
    ),
    "qv_needs_mla_dims": (
        [{"qv": True, "dims": (128, 128)}, {"qv": True, "dims": (192, 128)}],
        [{"qv": True, "dims": (64, 512)}, {"qv": False, "dims": (40, 40)}],
    ),
    "qv_not_int8": (
        [{"qv": True, "quant": "int8_t1"}],
        [{"qv": True, "quant": "fp8_e4m3"}],
    ),
    "cp_needs_causal_mask": (
        [{"cp": (2, 1), "mask": "cw128"}, {"cp": (2, 1), "mask": "none"}],
        [{"cp": (2, 1), "mask": "causal"}, {"cp": (1, 0), "mask": "cw128"}],
    ),
    "cp_without_alibi_or_append": (
        [{"cp": (2, 1), "alibi": True, "append": False}, {"cp": (2, 1), "alibi": False, "append": True}],
        [{"cp": (2, 1), "alibi": False, "append": False}, {"cp": (1, 0), "alibi": True, "append": True}],
    ),
    "v_padded_needs_dv_lt_d": (
        [{"v_padded": True, "dims": (128, 128)}, {"v_padded": True, "dims": (64, 512)}],
        [{"v_padded": True, "dims": (192, 128)}],
    ),
}


def test_every_constraint_has_examples() -> None:
    assert set(CONSTRAINT_EXAMPLES) == {c.name for c in space.CONSTRAINTS}


@pytest.mark.parametrize("constraint", space.CONSTRAINTS, ids=lambda c: c.name)
def test_constraint_rejects_and_allows(constraint: space.Constraint) -> None:
    bad, good = CONSTRAINT_EXAMPLES[constraint.name]
    for point in bad:
        assert not constraint.allowed(point), point
        assert any(v.startswith(constraint.name + ":") for v in space.violations(point))
        assert not space.valid(point)
        # the case model agrees: the point does not build
        with pytest.raises(ValueError, match=constraint.name):
            space.build(point)
    for point in good:
        assert constraint.allowed(point), point
        assert space.valid(point)
        space.build(point)
    # a partial point that leaves an axis unassigned is allowed
    assert constraint.allowed({constraint.axes[0]: space.AXES[constraint.axes[0]].values[-1]})


def test_axes_cover_the_issue_degrees_of_freedom() -> None:
    assert set(space.KERNEL_AXES) == {"batch", "heads", "dims", "dtype", "layout", "block_size", "mask", "quant"}
    dims = space.AXES["dims"].values
    assert {(d, d) for d in (40, 80, 96, 112, 160, 192, 256)} <= set(dims)
    assert {(192, 128), (64, 512)} <= set(dims)
    assert {"prefill", "decode", "spec-decode", "chunked", "mixed-decode-first", "mixed-decode-last", "sq>sk"} <= set(
        space.AXES["batch"].values
    )
    assert {"cross", "empty-kv", "single-token"} <= set(space.AXES["batch"].values)
    for axis in space.AXES.values():
        assert axis.doc and axis.values and axis.default == axis.values[0]


def test_unknown_axis_or_level_is_named() -> None:
    assert space.violations({"colour": 1}) == ["unknown axis 'colour': axes are " + str(list(space.AXES))]
    with pytest.raises(ValueError, match="dims: \\(48, 48\\) is not a level"):
        space.build({"dims": (48, 48)})


def test_extensible_is_exact_where_constraints_chain() -> None:
    # each constraint alone allows it (dims unassigned), but no dims satisfy both: not extensible
    partial = {"qv": True, "v_padded": True}
    assert space.valid(partial)
    assert not space.extensible(partial)
    assert space.extensible({"qv": True, "quant": "fp8_e4m3", "batch": "decode"})
    # qv forces dims 64/512 and so forbids v_padded: the pair is impossible in every valid case
    assert ("True", "True") not in {tuple(map(str, t)) for t in space.valid_points(("qv", "v_padded"))}
    with pytest.raises(ValueError, match="does not extend to a valid case"):
        space.build(partial)
    # axes left out take the first level that keeps the point valid
    assert space.build({"layout": "NHD"}).block_size == 1
    mla = space.build({"qv": True})
    assert (mla.head_dim, mla.dv) == (64, 512)
    assert space.build({}) == space.build({a: axis.default for a, axis in space.AXES.items()})


def test_sub_space_is_exact() -> None:
    """possible_tuples / extensible inside PLAIN agree with a brute force over the valid component points."""
    assert not space.extensible({"quant": "fp8_e4m3"}, space.PLAIN) and space.extensible({"quant": "fp8_e4m3"})
    assert space.extensible({"layout": "NHD", "block_size": 16}, space.PLAIN)
    assert not space.extensible({"layout": "HND"}, space.PLAIN)
    comp = next(c for c in space.COMPONENTS if "quant" in c)
    inside = [
        dict(zip(comp, v))
        for v in space._component_points(comp)
        if all(x in space.PLAIN.get(a, (x,)) for a, x in zip(comp, v))
    ]
    for axes in (("batch", "dims"), ("dims", "quant", "dtype"), ("qv", "dims", "append")):
        assert set(space.possible_tuples(axes, space.PLAIN)) == {tuple(p[a] for a in axes) for p in inside}
        assert set(space.possible_tuples(axes, space.PLAIN)) < set(space.possible_tuples(axes))
    with pytest.raises(ValueError, match="within: unknown axes"):
        space.possible_tuples(("dims",), {"colour": (1,)})


def _random_valid_points(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    comps = {c: space._component_points(c) for c in space.COMPONENTS}
    points = []
    for _ in range(n):
        p: dict = {}
        for comp, pts in comps.items():
            p.update(zip(comp, rng.choice(pts)))
        points.append({a: p[a] for a in space.AXES})
    return points


def test_every_valid_component_assignment_builds_and_round_trips() -> None:
    """Exhaustive per constraint component (the other axes at their defaults), plus random full points."""
    points = []
    for comp in space.COMPONENTS:
        for values in space._component_points(comp):
            points.append({a: space.AXES[a].default for a in space.AXES} | dict(zip(comp, values)))
    points += _random_valid_points(2000, seed=1)
    for p in points:
        case = space.build(p)  # raises ValueError naming the constraint of a point that is not valid
        assert isinstance(case, AttentionCase) and space.extensible(p)
        assert space.classify(case) == p, (p, case.id)


def test_classify_every_suite_case_to_a_valid_point() -> None:
    for name in ("smoke", "default", "perf", "engines", "peer-fa2-kvcache"):  # peer: short appends, empty caches
        for case in get_suite(name):
            point = space.classify(case)
            assert set(point) == set(space.AXES)
            assert space.valid(point), (case.id, space.violations(point))


@pytest.mark.parametrize(
    ("requests", "level"),
    [
        (((5, 0), (3, 3)), "empty-kv"),
        (((1, 1), (1, 1)), "single-token"),
        (((40, 20), (16, 16)), "sq>sk"),
        (((40, 20), (3, 90)), "cross"),
        (((9, 9),), "prefill-single"),
        (((9, 9), (1, 1)), "prefill"),
        (((1, 9), (1, 1)), "decode"),
        (((1, 9), (30, 30)), "mixed-decode-first"),
        (((30, 30), (1, 9)), "mixed-decode-last"),
        (((30, 30), (1, 9), (8, 40)), "mixed-decode-last"),
        (((1, 9), (30, 30), (1, 2)), "mixed-decode-first"),
        (((2, 9), (2, 2)), "spec-decode"),
        (((17, 90), (17, 20)), "chunked"),
        (((30, 30), (8, 40)), "chunked"),
    ],
)
def test_classify_batch(requests, level) -> None:
    assert space.classify_batch(requests) == level


def test_classify_buckets_to_nearest_levels() -> None:
    assert space.classify_dims(48, 48) == (40, 40)  # 8 from 40, 16 from 64
    assert space.classify_dims(72, 72) == (64, 64)  # ties go to the smaller level
    assert space.classify_dims(8, 8) == (32, 32) and space.classify_dims(512, 512) == (256, 256)
    assert space.classify_dims(128, 64) == (192, 128) and space.classify_dims(64, 128) == (64, 512)
    assert space.classify_heads(24, 8) == "h40-gqa5" and space.classify_heads(48, 8) == "h64-gqa8"  # 64 band
    assert space.classify_heads(64, 4) == "h64-gqa16" and space.classify_heads(20, 4) == "gqa3"
    assert space.classify_heads(6, 3) == "gqa2" and space.classify_heads(2, 1) == "mqa"
    assert space.classify_mask(False, (None, 0), None) == "winf-16"
    assert space.classify_mask(True, (0, 0), None) == "cw128"
    assert space.classify_mask(False, (0, 7), None) == "w32-32"
    assert space.classify_mask(True, (5, None), 32) == "cchunk64"
    case = AttentionCase(
        requests=((3, 50),), num_heads=4, num_kv_heads=2, head_dim=64, kv_layout="HND", block_size=48, num_splits=7
    )
    point = space.classify(case)
    assert point["block_size"] == 64 and point["num_splits"] == 3 and point["heads"] == "gqa2"


def test_append_levels_classify_and_build() -> None:
    """An fp8 append classifies to ``fp8``, a short append (16-bit or fp8, an empty cache too: the peers' fewer keys
    than query rows) to ``short``, each to a valid point; each level builds back to a case of that kind."""

    def case(requests, **kw):
        return AttentionCase(requests=requests, num_heads=4, num_kv_heads=2, head_dim=64, append=True, **kw)

    fp8 = dict(quant="fp8_e4m3", kv_layout="NHD", block_size=16)
    examples = [
        (case(((3, 50), (3, 20)), **fp8), "fp8"),
        (case(((3, 50), (3, 20)), quant="fp8_e5m2", descale="head"), "fp8"),
        (case(((3, 50), (3, 20)), append_len=2, **fp8), "short"),
        (case(((6, 2), (6, 8)), causal=True, append_len=2), "short"),  # kv_len < q_len: sq>sk
        (case(((3, 50), (3, 20))), True),
        (AttentionCase(requests=((3, 50),), num_heads=4, num_kv_heads=2, head_dim=64, quant="fp8_e4m3"), False),
    ]
    for c, level in examples:
        point = space.classify(c)
        assert point["append"] == level and type(point["append"]) is type(level), (c.id, point["append"])
        assert space.valid(point), (c.id, space.violations(point))
    fp8_built = space.build({"append": "fp8"})
    assert fp8_built.append and fp8_built.append_len is None and fp8_built.quant.startswith("fp8")
    for batch in space.AXES["batch"].values:
        point = {"append": "short", "batch": batch}
        if not space.extensible(point):
            assert space.short_append_len(BATCHES[space.BATCH_SHAPES[batch]]) is None  # decode, single-token, empty-kv
            continue
        built = space.build(point)
        assert built.append_len == space.short_append_len(built.requests) and space.classify(built)["append"] == "short"


@settings(max_examples=200)
@given(
    reqs=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), min_size=1, max_size=6),
    hk=st.integers(1, 8),
    ratio=st.integers(1, 20),
    d=st.integers(1, 600),
    dv=st.integers(1, 600),
    left=st.none() | st.integers(0, 500),
    right=st.none() | st.integers(0, 500),
    causal=st.booleans(),
    chunk=st.none() | st.integers(1, 300),
    bs=st.none() | st.integers(1, 1024),
)
def test_classify_any_case(reqs, hk, ratio, d, dv, left, right, causal, chunk, bs) -> None:
    """Random cases (what the fuzzer draws) classify to a level of every axis."""
    if causal and right not in (None, 0):
        right = 0
    case = AttentionCase(
        requests=tuple(reqs),
        num_heads=hk * ratio,
        num_kv_heads=hk,
        head_dim=d,
        head_dim_v=dv,
        causal=causal,
        window=(left, right),
        chunk=chunk,
        kv_layout="contiguous" if bs is None else "NHD",
        block_size=bs,
    )
    point = space.classify(case)
    for axis, value in point.items():
        assert value in space.AXES[axis].values, (axis, value)
