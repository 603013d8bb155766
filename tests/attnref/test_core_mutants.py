"""Promises of attnref.core's tiling and ALiBi helpers that the mutation run (docs "Mutation testing") found unchecked.

``tile_shape(sq, sk, heads, budget)`` picks the query and key tile lengths of the online-softmax engine: at least
1, never longer than the sequence (a key tile at most 1024), ``heads * tq * tk <= max(budget, heads)`` (the
docstring's bound), and as large as that bound allows: the key tile first, the query tile with what is left, so a
short key range leaves the budget to more query rows.

``query_tiles`` yields exactly the key tiles over each query tile's span, flags ``partial`` exactly where a row of
the tile misses a key of it, skips tiles whose rows see no key, and hands back bounds on the device asked for (the
non-CPU branch recomputes them there; the meta device stands in for a GPU).  ``alibi_penalty`` with an
``alibi_dtype`` rounds the bias relative to the row's largest visible bias, wherever the row sits against
``[lo, hi)``, and returns the slopes' dtype whatever the sinks' dtype."""

from __future__ import annotations

import itertools

import pytest

import torch

from attnref import AttnOptions
from attnref.core import alibi_penalty, query_tiles, tile_shape


def _check(sq: int, sk: int, heads: int, budget: int) -> None:
    tq, tk = tile_shape(sq, sk, heads, budget)
    where = f"tile_shape({sq}, {sk}, {heads}, {budget}) = {(tq, tk)}"
    assert type(tq) is int and type(tk) is int, where
    assert 1 <= tq <= max(sq, 1), where
    assert 1 <= tk <= min(max(sk, 1), 1024), where
    assert heads * tq * tk <= max(budget, heads), where
    # as large as the bound allows: a longer key tile (the query tile shrunk to 1) or a longer query tile breaks it
    assert tk == min(max(sk, 1), 1024) or heads * (tk + 1) > budget, where
    assert tq == max(sq, 1) or heads * (tq + 1) * tk > budget, where


def test_tiles_are_bounded_and_as_large_as_the_budget_allows() -> None:
    for sq, sk, heads, budget in itertools.product(range(7), range(7), range(1, 5), range(1, 41)):
        _check(sq, sk, heads, budget)


@pytest.mark.parametrize(
    "sq, sk, heads, budget, want",
    [
        (100, 3, 1, 300, (100, 3)),  # a short key range: the query tile takes the rest of the budget
        (100, 2, 4, 16, (2, 2)),  # 4 heads x 2 x 2 = 16
        (4, 4, 4, 4, (1, 1)),  # budget = heads: one score per head at a time
        (1, 100, 1, 10, (1, 10)),
        (1, 1, 1, 100, (1, 1)),
        (0, 0, 2, 100, (1, 1)),  # empty sequences still get tiles of 1
        (8, 5000, 2, 1 << 20, (8, 1024)),  # key tiles stop at 1024
        (3000, 5000, 1, 1 << 20, (1024, 1024)),
    ],
)
def test_tile_shape_examples(sq: int, sk: int, heads: int, budget: int, want: tuple[int, int]) -> None:
    assert tile_shape(sq, sk, heads, budget) == want
    _check(sq, sk, heads, budget)


def _tiles(sq: int, sk: int, tiles: tuple[int, int], options: AttnOptions) -> list[tuple[int, int, list]]:
    return [(q0, q1, key_tiles) for q0, q1, _, _, key_tiles in query_tiles(sq, sk, tiles, options, "cpu")]


def test_query_tiles_partial_exactly_where_a_row_misses_a_key() -> None:
    # no mask: every tile is full, the last key tile cut at sk
    assert _tiles(8, 10, (4, 4), AttnOptions()) == [
        (0, 4, [(0, 4, False), (4, 8, False), (8, 10, False)]),
        (4, 8, [(0, 4, False), (4, 8, False), (8, 10, False)]),
    ]
    # causal, sq = sk = 4, one query tile of 2 rows: rows 0-1 see keys [0, 1) and [0, 2)
    assert _tiles(4, 4, (2, 1), AttnOptions(causal=True)) == [
        (0, 2, [(0, 1, False), (1, 2, True)]),
        (2, 4, [(0, 1, False), (1, 2, False), (2, 3, False), (3, 4, True)]),
    ]
    # a window (left 1, right 0): rows 0-1 see [0, 1) and [0, 2); rows 2-3 see [1, 3) and [2, 4), so key [2, 3)
    # is the one both see (lo_max == k0, hi_min == k1: full)
    assert _tiles(4, 4, (2, 1), AttnOptions(window=(1, 0))) == [
        (0, 2, [(0, 1, False), (1, 2, True)]),
        (2, 4, [(1, 2, True), (2, 3, False), (3, 4, True)]),
    ]


def test_query_tiles_skip_tiles_whose_rows_see_no_key() -> None:
    # causal with sq = 8 > sk = 4 (bottom-right aligned): rows 0-3 see no key, so their tile is skipped
    assert _tiles(8, 4, (4, 4), AttnOptions(causal=True)) == [(4, 8, [(0, 4, True)])]
    assert _tiles(8, 4, (2, 4), AttnOptions(causal=True)) == [(4, 6, [(0, 2, True)]), (6, 8, [(0, 4, True)])]


@pytest.mark.parametrize("options", [AttnOptions(), AttnOptions(causal=True), AttnOptions(window=(2, 1), chunk=3)])
def test_query_tiles_bounds_on_the_device_asked_for(options: AttnOptions) -> None:
    """Off the CPU the bounds are recomputed on the device (the decisions stay on the host's copy)."""
    on_cpu = list(query_tiles(7, 9, (3, 4), options, "cpu"))
    on_meta = list(query_tiles(7, 9, (3, 4), options, torch.device("meta")))
    assert [(a[0], a[1], a[4]) for a in on_cpu] == [(a[0], a[1], a[4]) for a in on_meta]
    for (q0, q1, lo, hi, _), (_, _, lo_m, hi_m, _) in zip(on_cpu, on_meta):
        assert lo.device.type == hi.device.type == "cpu"
        assert lo_m.device.type == hi_m.device.type == "meta"
        assert lo.shape == hi.shape == lo_m.shape == hi_m.shape == (q1 - q0,)
        assert lo.dtype == hi.dtype == lo_m.dtype == hi_m.dtype == torch.int64


def _rounded_penalty(slopes, rows, cols, sq, sk, lo, hi, sinks, alibi_dtype):
    """The contract, by brute force: the row's top bias over its visible keys (or the sink), rounding relative to it."""
    ct = slopes.dtype
    pos = rows[:, None].to(ct) + (sk - sq)
    penalty = slopes * (pos - cols[None, :].to(ct)).abs()
    tops = []
    for i, p in enumerate(pos[:, 0].tolist()):
        visible = [-abs(p - j) for j in range(int(lo[i]), int(hi[i]))]
        tops.append(max(visible) if visible else 0.0)
    top = slopes * torch.tensor(tops, dtype=ct)[:, None]
    if sinks is not None:
        top = torch.maximum(top, sinks.to(ct))
    return -((-penalty - top).to(alibi_dtype).to(ct) + top)


@pytest.mark.parametrize("alibi_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_alibi_penalty_rounds_relative_to_the_nearest_visible_key(alibi_dtype: torch.dtype, with_sinks: bool) -> None:
    # rows at positions 0..5 (sq = 6, sk = 10: pos = row + 4); bounds chosen so that rows sit left of, inside and
    # right of [lo, hi), including pos == lo and pos == hi
    sq, sk = 6, 10
    rows = torch.arange(sq)
    cols = torch.arange(sk)
    lo = torch.tensor([7, 5, 2, 0, 3, 1])
    hi = torch.tensor([9, 8, 6, 3, 8, 4])
    slopes = torch.tensor([0.37, 1.9, 0.061], dtype=torch.float64).reshape(3, 1, 1)
    sinks = torch.tensor([-0.5, 3.0, -40.0], dtype=torch.float64).reshape(3, 1, 1) if with_sinks else None
    got = alibi_penalty(slopes, rows, cols, sq, sk, lo, hi, sinks, alibi_dtype)
    want = _rounded_penalty(slopes, rows, cols, sq, sk, lo, hi, sinks, alibi_dtype)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    exact = alibi_penalty(slopes, rows, cols, sq, sk, lo, hi)
    torch.testing.assert_close(exact, slopes * (rows[:, None] + sk - sq - cols[None, :]).abs().double(), rtol=0, atol=0)
    assert not torch.equal(got, exact)  # the rounding is visible at these slopes


@pytest.mark.parametrize(
    "slopes_dtype, sinks_dtype, alibi_dtype",
    [
        (torch.float16, None, torch.bfloat16),  # bf16 + f16 would promote to f32
        (torch.float32, torch.float64, torch.bfloat16),  # a wider sink must not widen the result
        (torch.float16, torch.float32, torch.bfloat16),
    ],
)
def test_alibi_penalty_keeps_the_slopes_dtype(slopes_dtype, sinks_dtype, alibi_dtype) -> None:
    sq, sk = 3, 5
    rows, cols = torch.arange(sq), torch.arange(sk)
    lo, hi = torch.zeros(sq, dtype=torch.int64), torch.full((sq,), sk)
    slopes = torch.tensor([0.5, 0.25], dtype=slopes_dtype).reshape(2, 1, 1)
    sinks = None if sinks_dtype is None else torch.tensor([0.3, -2.0], dtype=sinks_dtype).reshape(2, 1, 1)
    got = alibi_penalty(slopes, rows, cols, sq, sk, lo, hi, sinks, alibi_dtype)
    assert got.dtype == slopes_dtype
    want = _rounded_penalty(
        slopes, rows, cols, sq, sk, lo, hi, None if sinks is None else sinks.to(slopes_dtype), alibi_dtype
    )
    torch.testing.assert_close(got, want, rtol=0, atol=0)
