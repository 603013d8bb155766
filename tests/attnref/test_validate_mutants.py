"""Promises of attnref.validate that the mutation run (docs "Mutation testing") found unchecked: each refusal names
the argument it is about (``k``, ``v``, ``seqused_k``, ``block_table``) and shows the offending value (the entry
before a decrease, the last offset, the rows a table has, the shape a per-head vector has: ``()`` for an object
without one), bool and complex integer lists are refused, an empty batch (``cu_seqlens = [0]``) and a head dim of 1
are valid."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from attnref import attention_paged, attention_varlen
from attnref.validate import as_int_list, check_cu_seqlens

H, HK, D = 4, 2, 8


def _varlen(**over):
    args = {
        "q": torch.randn(5, H, D),
        "k": torch.randn(7, HK, D),
        "v": torch.randn(7, HK, D),
        "cu_seqlens_q": torch.tensor([0, 2, 5], dtype=torch.int32),
        "cu_seqlens_k": torch.tensor([0, 3, 7], dtype=torch.int32),
    }
    args.update(over)
    return attention_varlen(**args)


def _paged(**over):
    args = {
        "q": torch.randn(3, H, D),
        "k_cache": torch.randn(4, 16, HK, D),
        "v_cache": torch.randn(4, 16, HK, D),
        "block_table": torch.tensor([[2, 0], [1, 3]], dtype=torch.int32),
        "seqused_k": torch.tensor([20, 5], dtype=torch.int32),
        "cu_seqlens_q": torch.tensor([0, 1, 3], dtype=torch.int32),
    }
    args.update(over)
    return attention_paged(**args)


def test_base_calls_are_valid() -> None:
    assert tuple(_varlen().out.shape) == (5, H, D)
    assert tuple(_paged().out.shape) == (3, H, D)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64])
def test_bool_and_complex_lists_are_refused(dtype) -> None:
    with pytest.raises(ValueError, match=rf"^lens must be an integer tensor, got dtype {re.escape(str(dtype))}$"):
        as_int_list("lens", torch.tensor([1, 0], dtype=dtype))


@pytest.mark.parametrize("name", ["k", "v"])
def test_k_and_v_refusals_name_them(name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be a torch.Tensor, got list$"):
        _varlen(**{name: [[0.0]]})
    with pytest.raises(
        ValueError, match=rf"^{name} must have 3 dims \(tokens, heads, head_dim\), got shape \(7, 16\)$"
    ):
        _varlen(**{name: torch.randn(7, 16)})
    with pytest.raises(ValueError, match=rf"^{name} must be a floating tensor, got dtype torch.int64$"):
        _varlen(**{name: torch.ones(7, HK, D, dtype=torch.int64)})


def test_rank_message_spells_the_token_dims() -> None:
    with pytest.raises(ValueError, match=r"^q must have 3 dims \(tokens, heads, head_dim\), got shape \(5, 32\)$"):
        _varlen(q=torch.randn(5, H * D))


def test_head_dim_one_is_valid_and_zero_is_not() -> None:
    q, k, v = torch.randn(5, H, 1), torch.randn(7, HK, 1), torch.randn(7, HK, 3)
    res = _varlen(q=q, k=k, v=v)
    assert tuple(res.out.shape) == (5, H, 3) and bool(torch.isfinite(res.out).all())
    with pytest.raises(ValueError, match=r"^head dims must be positive, got d=0, dv=3$"):
        _varlen(q=q[..., :0], k=k[..., :0], v=v)
    with pytest.raises(ValueError, match=r"^head dims must be positive, got d=1, dv=0$"):
        _varlen(q=q, k=k, v=v[..., :0])


def test_empty_batch_is_valid() -> None:
    """``cu_seqlens = [0]``: batch 0, no tokens; the call returns empty results."""
    assert check_cu_seqlens("cu", torch.tensor([0]), 0) == [0]
    assert check_cu_seqlens("cu", [0], 3, exact=False) == [0]
    cu = torch.zeros(1, dtype=torch.int32)
    res = _varlen(
        q=torch.randn(0, H, D), k=torch.randn(0, HK, D), v=torch.randn(0, HK, D), cu_seqlens_q=cu, cu_seqlens_k=cu
    )
    assert tuple(res.out.shape) == (0, H, D) and tuple(res.lse.shape) == (H, 0)


def test_no_entries_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^cu must have at least one entry \(batch \+ 1\), got none$"):
        check_cu_seqlens("cu", torch.zeros(0, dtype=torch.int64), 0)


@pytest.mark.parametrize(
    "values, total, message",
    [
        ([3, 5], 5, "cu must start at 0, got 3"),
        ([0, -1, 2], 2, "cu must be non-decreasing, got 0 then -1 at index 1"),
        ([0, 3, 2], 2, "cu must be non-decreasing, got 3 then 2 at index 2"),
        ([0, 1, 4, 3, 5], 5, "cu must be non-decreasing, got 4 then 3 at index 3"),
        ([0, 2, 3], 4, "cu[-1] must equal the number of tokens (4), got 3"),
    ],
)
def test_cu_seqlens_refusals_show_the_offending_entries(values: list[int], total: int, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_cu_seqlens("cu", torch.tensor(values), total)


def test_float_seqused_k_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match=r"^seqused_k must be an integer tensor, got dtype torch.float32$"):
        _paged(seqused_k=torch.tensor([20.0, 5.0]))


_NOT_A_VECTOR = [
    (torch.randn(H + 1), "(5,)"),
    (torch.randn(1, H), "(1, 4)"),
    (np.zeros(H + 1), "(5,)"),
    ([0.0] * H, "()"),
]


@pytest.mark.parametrize("bad, shown", _NOT_A_VECTOR, ids=["long", "2d", "numpy", "list"])
def test_bad_sinks_show_their_shape(bad, shown: str) -> None:
    with pytest.raises(
        ValueError, match=rf"^sinks must have shape \(4,\) \(one per query head\), got {re.escape(shown)}$"
    ):
        _varlen(sinks=bad)


@pytest.mark.parametrize(
    "bad, shown",
    [(torch.rand(3, H), "(3, 4)"), (np.zeros((2, H + 1)), "(2, 5)"), ([0.1] * H, "()")],
    ids=["rows", "numpy", "list"],
)
def test_bad_alibi_slopes_show_their_shape(bad, shown: str) -> None:
    with pytest.raises(ValueError, match=rf"^alibi_slopes must have shape \(4,\) or \(2, 4\), got {re.escape(shown)}$"):
        _varlen(alibi_slopes=bad)


@pytest.mark.parametrize(
    "bad, shown",
    [(torch.tensor([2, 0]), "(2,)"), (np.zeros((2, 2), dtype=np.int32), "(2, 2)"), ([[2, 0], [1, 3]], "()")],
    ids=["1d", "numpy", "list"],
)
def test_bad_block_table_shows_its_shape(bad, shown: str) -> None:
    want = rf"^block_table must be a 2-D \(batch, max_blocks\) tensor, got shape {re.escape(shown)}$"
    with pytest.raises(ValueError, match=want):
        _paged(block_table=bad)


def test_block_table_row_count_is_shown() -> None:
    table = torch.tensor([[2, 0], [1, 3], [0, 1]], dtype=torch.int32)  # 3 rows of 2 columns for 2 sequences
    with pytest.raises(ValueError, match=r"^block_table must have 2 rows \(one per sequence\), got 3$"):
        _paged(block_table=table)
