"""``attnref.row_bounds`` returns int64 bounds clamped to ``[0, sk]`` (its docstring), also for int32 rows, rows
before the first visible key and context-parallel shards (mutmut found these unchecked: docs "Mutation
testing")."""

from __future__ import annotations

import re

import pytest
import torch

from attnref import AttnOptions, row_bounds


def test_bounds_are_int64_for_int32_rows() -> None:
    for options in (AttnOptions(causal=True), AttnOptions(causal=True, cp=(2, 1, 9))):
        lo, hi = row_bounds(torch.arange(3, dtype=torch.int32), 3, 5, options)
        assert lo.dtype == torch.int64 and hi.dtype == torch.int64


def test_rows_before_the_first_key_get_empty_ranges_at_zero() -> None:
    """Causal with ``sq > sk``: the first rows see nothing, as ``[0, 0)``, never a negative bound."""
    lo, hi = row_bounds(torch.arange(5), 5, 2, AttnOptions(causal=True))
    assert lo.tolist() == [0, 0, 0, 0, 0] and hi.tolist() == [0, 0, 0, 1, 2]


def test_context_parallel_bounds_are_clamped_to_the_shard() -> None:
    # total 4 keys over 2 ranks, rank 1 holds absolute keys 1, 3; 6 rows: rows 0-2 see no key of this rank
    lo, hi = row_bounds(torch.arange(6), 6, 2, AttnOptions(causal=True, cp=(2, 1, 4)))
    assert lo.tolist() == [0] * 6 and hi.tolist() == [0, 0, 0, 1, 1, 2]
    # a call holding fewer keys than the shard's share: bounded by the keys it holds
    _, hi = row_bounds(torch.arange(2), 2, 1, AttnOptions(causal=True, cp=(2, 0, 8)))
    assert hi.tolist() == [1, 1]


def test_context_parallel_needs_the_total_for_one_sequence() -> None:
    message = "options.cp.total must be set for one sequence (its keys over all ranks)"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        row_bounds(torch.arange(2), 2, 2, AttnOptions(causal=True, cp=(2, 0)))
