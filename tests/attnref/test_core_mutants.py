"""Promises of attnref.core.tile_shape that the mutation run (docs "Mutation testing") found unchecked.

``tile_shape(sq, sk, heads, budget)`` picks the query and key tile lengths of the online-softmax engine: at least
1, never longer than the sequence (a key tile at most 1024), ``heads * tq * tk <= max(budget, heads)`` (the
docstring's bound), and as large as that bound allows: the key tile first, the query tile with what is left, so a
short key range leaves the budget to more query rows."""

from __future__ import annotations

import itertools

import pytest

from attnref.core import tile_shape


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
