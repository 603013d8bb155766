"""The fuzzer's case stream: valid, deterministic, within its limits, and reaching the whole case space."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cases import space
from conformance.cases.sweep import MASKS
from conformance.fuzz.draw import DRAWN_AXES, DrawLimits, draw, stream, work

seeds = st.integers(min_value=0, max_value=2**40)
indices = st.integers(min_value=0, max_value=10**7)
limits = st.builds(DrawLimits, max_tokens=st.integers(64, 4096), max_heads=st.integers(1, 128))


def test_every_axis_of_the_space_is_drawn():
    assert set(space.AXES) <= DRAWN_AXES, "an axis was added to the space: teach conformance/fuzz/draw.py to draw it"


@settings(max_examples=120, deadline=None)
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
