"""The fuzzer's case stream: valid, deterministic, within its limits, and reaching the whole case space."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases import space
from conformance.cases.sweep import BATCHES, MASKS
from conformance.fuzz.draw import DRAWN_AXES, DrawLimits, _head_pairs, draw, stream, work
from conformance.fuzz.shrink import same_failure, shrink
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.fakes import GqaHeadMappingBackend

seeds = st.integers(min_value=0, max_value=2**40)
indices = st.integers(min_value=0, max_value=10**7)
limits = st.builds(DrawLimits, max_tokens=st.integers(64, 4096), max_heads=st.integers(1, 256))


def test_every_axis_of_the_space_is_drawn():
    assert set(space.AXES) <= DRAWN_AXES, "an axis was added to the space: teach conformance/fuzz/draw.py to draw it"


@settings(max_examples=120)
@given(seed=seeds, index=indices, lim=limits)
def test_a_draw_is_a_valid_case_within_the_limits_and_deterministic(seed, index, lim):
    d = draw(seed, index, lim)
    assert d == draw(seed, index, lim)  # depends on (seed, index, limits) only
    assert d.index == index
    if d.case is None:
        assert d.rejected.startswith(("case model:", "case space:"))
        return
    case = d.case
    assert not space.violations(space.classify(case))
    assert sum(case.q_lens) <= lim.max_tokens and sum(case.kv_lens) <= lim.max_tokens
    assert case.num_heads <= lim.max_heads
    assert work(case) <= lim.max_work or all(q <= 1 and k <= 1 for q, k in case.requests)
    assert 1 <= case.batch <= 8
    assert dict(d.levels).keys() <= set(space.AXES)


def test_the_stream_reaches_every_level_of_every_axis_and_goes_beyond_them():
    """400 draws of seed 0 (about 1.5 s): every level of every axis occurs, and values off the named levels too."""
    seen: dict[str, set] = defaultdict(set)
    dims, blocks, windows = set(), set(), set()
    for d in (draw(0, i) for i in range(400)):
        assert d.case is not None, d.rejected
        for axis, value in space.classify(d.case).items():
            seen[axis].add(value)
        dims.add(d.case.head_dim)
        blocks.add(d.case.block_size)
        windows.add(d.case.window)
    for name, axis in space.AXES.items():
        assert set(axis.values) <= seen[name], f"{name}: levels never drawn: {set(axis.values) - seen[name]}"
    level_dims = {x for pair in space.AXES["dims"].values for x in pair}
    assert len(dims - level_dims) > 10 and any(x % 8 for x in dims)  # non-level and non-multiple-of-8 dims
    assert len(blocks - set(space.AXES["block_size"].values)) > 5
    assert len(windows - {w for _, w, _ in MASKS.values()}) > 20
    assert any(0 in (k for _, k in c.requests) for c in (draw(0, i).case for i in range(400)))


def test_seeds_give_different_streams_and_stream_matches_draw():
    a = [d.case.id for d, _ in zip(stream(1), range(20))]
    b = [d.case.id for d, _ in zip(stream(2), range(20))]
    assert a != b
    assert [d.case.id for d, _ in zip(stream(1, start=5), range(3))] == a[5:8]


@pytest.mark.parametrize("kwargs", [{"max_tokens": 63}, {"max_heads": 0}])
def test_limits_are_validated(kwargs):
    with pytest.raises(ValueError, match="max_"):
        DrawLimits(**kwargs)


def test_draws_go_between_and_beyond_the_levels():
    """300 draws of seed 3 with room for long requests: head counts, head dims, lengths, block sizes, scales and
    split counts off the space's levels, beyond its largest ones too."""
    cases = [d.case for d in (draw(3, i, DrawLimits(max_tokens=4096)) for i in range(300))]
    assert all(c is not None for c in cases)
    level_heads = set(space.HEADS.values())
    heads = {(c.num_heads, c.num_kv_heads) for c in cases}
    assert len(heads - level_heads) > 50 and max(h for h, _ in heads) > 128
    assert any(16 < h < 128 and (h, hk) not in level_heads for h, hk in heads)  # between the levels
    level_dims = {x for pair in space.AXES["dims"].values for x in pair}
    dims = {c.head_dim for c in cases} | {c.dv for c in cases}
    assert len({x for x in dims if x % 8 == 0 and x <= 256} - level_dims) >= 10  # multiples of 8 between levels
    assert any(x % 8 for x in dims) and max(dims) > 512  # dims adapters must refuse, and beyond 576/512
    canonical_kv = max(k for reqs in BATCHES.values() if len(reqs) < 8 for _, k in reqs if k <= 1100)
    assert max(k for c in cases for _, k in c.requests) > canonical_kv  # longer than the covering batches
    blocks = {c.block_size for c in cases if c.block_size}
    assert max(blocks) > 256 and len(blocks - set(space.AXES["block_size"].values)) > 10
    scales = {c.scale for c in cases if c.scale is not None}
    assert max(scales) > 1.0 and min(scales) < 0.01 and any(c.scale == round(c.head_dim**-0.5, 6) for c in cases)
    assert max(c.num_splits or 0 for c in cases) > 8


def test_heads_levels_follow_max_heads():
    """A level is drawn only when some head count within the limit classifies to it; every pair drawn for a
    level classifies back to it."""
    pairs = _head_pairs(256)
    assert set(pairs) == set(space.HEADS)
    for level, group in pairs.items():
        assert all(space.classify_heads(h, hk) == level and h % hk == 0 for h, hk in group)
    assert set(_head_pairs(16)) == {"mha", "mqa", "gqa2", "gqa3", "gqa4", "gqa8"}
    narrow = [draw(5, i, DrawLimits(max_heads=16)) for i in range(100)]
    assert all(d.case is not None and d.case.num_heads <= 16 for d in narrow)
    assert not any(dict(d.levels)["heads"] in space.WIDE_HEADS for d in narrow)
    wide = [draw(5, i) for i in range(100)]
    assert any(dict(d.levels)["heads"] in space.WIDE_HEADS for d in wide)
    for d in wide:
        level = dict(d.levels)["heads"]
        assert space.classify_heads(d.case.num_heads, d.case.num_kv_heads) == level


def test_a_wide_off_level_draw_shrinks():
    """A draw of more than 128 q heads with GQA fails a planted head-mapping bug; the shrinker still takes it
    down to a few heads that keep the bug."""
    limits = DrawLimits(max_tokens=128)
    case = next(
        c
        for c in (draw(0, i, limits).case for i in range(2000))
        if c is not None and c.num_heads > 128 and 1 < c.num_kv_heads < c.num_heads and not c.qv and c.quant == "none"
    )
    backend = GqaHeadMappingBackend()

    def evaluate(c):
        return check_backend(prepare_context(c, seed=0), backend)

    first = evaluate(case)
    if first.status is not Status.FAIL:
        pytest.skip(f"the planted bug does not show on {case.id}: {first.status}")
    res = shrink(case, first, evaluate, max_steps=200)
    m = res.case
    assert res.result.status is Status.FAIL and same_failure(first, res.result)
    assert m.num_heads <= 6 and 1 < m.num_kv_heads < m.num_heads and m.batch == 1


def test_draws_become_every_invariance_kind_without_changing_their_other_fields():
    """Stage 3: some draws are invariance cases (the growing neighbour included, often with num_splits pinned to 1,
    the batch-invariant promise); the fields drawn before stay those of the plain draw."""
    import dataclasses
    import itertools

    import conformance.fuzz.draw as draw_module

    kinds = defaultdict(int)
    for d in itertools.islice(stream(7, DrawLimits(max_tokens=2048)), 400):
        if d.case is None or not d.case.invariance:
            continue
        kinds[(d.case.invariance, d.case.num_splits == 1)] += 1
        inv = d.case
        plain = draw_module.P_INVARIANCE
        try:
            draw_module.P_INVARIANCE = 0.0
            base = draw(7, d.index, DrawLimits(max_tokens=2048)).case
        finally:
            draw_module.P_INVARIANCE = plain
        assert base is not None and not base.invariance
        same = {"invariance", "num_splits", "requests"}
        assert {f.name: getattr(inv, f.name) for f in dataclasses.fields(inv) if f.name not in same} == {
            f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.name not in same
        }
        assert inv.requests == base.requests[: len(inv.requests)]
        if inv.invariance == "neighbour":
            assert inv.batch == 2 and inv.requests[1][0] >= 2
    assert {k for k, _ in kinds} == {"run", "batch", "neighbour"}
    assert kinds[("neighbour", True)] > 0
