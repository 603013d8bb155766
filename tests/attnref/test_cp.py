"""Context parallelism (``AttnOptions(cp=...)``, vLLM FA3's ``cp_world_size`` / ``cp_rank`` / ``cp_tot_seqused_k``)
against an explicit-mask oracle.

The oracle spells the rule another way than :func:`attnref.row_bounds` does: it builds the plain causal mask of the
*whole* sequence (``T`` keys, :func:`oracle.oracle_mask`) and keeps the columns of the keys the rank holds
(``a % world == rank``, a slice ``[rank::world]``); attnref computes a per-row prefix length from
``a = j * world + rank``.  Then the merge identity: the ranks' partial results merged by LSE are plain causal
attention over all ``T`` keys, which is what makes the rule the one decode context parallelism needs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import oracle_attention, oracle_mask
from refhelpers import assert_close_to

from attnref import AttnOptions, ContextParallel, Numerics, attention_varlen, merge_many, visible_mask

FP64 = Numerics(dtype=torch.float64)


def shard_mask(sq: int, total: int, world: int, rank: int) -> np.ndarray:
    """The oracle's cp visibility: the full sequence's causal mask, the rank's columns only."""
    return oracle_mask(sq, total, causal=True)[:, rank::world]


def _cp(world: int, rank: int, total: int | None = None) -> AttnOptions:
    return AttnOptions(causal=True, cp=ContextParallel(world, rank, total))


def test_hand_written_mask() -> None:
    # world 2, rank 1, 7 keys: the rank holds absolute keys 1, 3, 5; 3 queries are the last 3 tokens (4, 5, 6).
    got = visible_mask(3, 3, _cp(2, 1, 7)).numpy()
    np.testing.assert_array_equal(got, np.array([[1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=bool))
    # rank 0 of 3 holding keys 0, 3 of 5; 4 queries (tokens 1..4): token 1 sees key 0, token 3 also key 3.
    got = visible_mask(4, 2, _cp(3, 0, 5)).numpy()
    np.testing.assert_array_equal(got, np.array([[1, 0], [1, 0], [1, 1], [1, 1]], dtype=bool))
    # more queries than keys: the top rows see nothing on any rank.
    assert not visible_mask(5, 1, _cp(2, 1, 3)).numpy()[:3].any()


@settings(max_examples=200)
@given(world=st.integers(2, 5), data=st.data())
def test_mask_equals_the_full_causal_mask_sliced_to_the_shard(world: int, data) -> None:
    rank = data.draw(st.integers(0, world - 1))
    total = data.draw(st.integers(0, 40))
    sq = data.draw(st.integers(0, 45))
    local = ContextParallel(world, rank).local_len(total)
    assert local == len(range(rank, total, world))
    np.testing.assert_array_equal(
        visible_mask(sq, local, _cp(world, rank, total)).numpy(), shard_mask(sq, total, world, rank)
    )


# (q_len, total keys) per sequence: decode, spec decode, extend, prefill, sq > T, an empty context, one key.
BATCH = [(1, 37), (3, 20), (9, 30), (12, 12), (6, 2), (1, 1), (4, 0)]


def _shards(gen, world: int):
    """Each sequence's full q/k/v and, per rank, its interleave-1 shard of the keys."""
    h, hk, d = 4, 2, 16
    seqs = [
        (
            torch.randn(sq, h, d, generator=gen, dtype=torch.float64),
            torch.randn(t, hk, d, generator=gen, dtype=torch.float64),
            torch.randn(t, hk, d, generator=gen, dtype=torch.float64),
        )
        for sq, t in BATCH
    ]
    return seqs


def _rank_call(seqs, world: int, rank: int, numerics=FP64, totals=None):
    q = torch.cat([s[0] for s in seqs])
    k = torch.cat([s[1][rank::world] for s in seqs])
    v = torch.cat([s[2][rank::world] for s in seqs])
    cu_q = torch.tensor([0, *np.cumsum([s[0].shape[0] for s in seqs])], dtype=torch.int32)
    cu_k = torch.tensor([0, *np.cumsum([s[1][rank::world].shape[0] for s in seqs])], dtype=torch.int32)
    totals = [s[1].shape[0] for s in seqs] if totals is None else totals
    tot = torch.tensor(totals, dtype=torch.int32)
    return attention_varlen(q, k, v, cu_q, cu_k, options=_cp(world, rank), numerics=numerics, cp_tot_seqused_k=tot)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_attention_against_the_oracle_with_an_explicit_mask(world: int) -> None:
    gen = torch.Generator().manual_seed(world)
    seqs = _shards(gen, world)
    for rank in range(world):
        got = _rank_call(seqs, world, rank)
        outs, lses = [], []
        for q, k, v in seqs:
            mask = shard_mask(q.shape[0], k.shape[0], world, rank)
            o, lse = oracle_attention(q, k[rank::world], v[rank::world], mask=mask)
            outs.append(o)
            lses.append(lse)
        assert_close_to(got.out, got.lse, torch.cat(outs), torch.cat(lses, dim=1), torch.float64)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("numerics", [FP64, Numerics(dtype=torch.float32)], ids=["fp64", "fp32"])
def test_the_ranks_merged_by_lse_are_causal_attention_over_all_keys(world: int, numerics: Numerics) -> None:
    gen = torch.Generator().manual_seed(10 + world)
    seqs = _shards(gen, world)
    parts = [_rank_call(seqs, world, r, numerics) for r in range(world)]
    merged = merge_many([p.out for p in parts], [p.lse for p in parts])
    q = torch.cat([s[0] for s in seqs])
    k = torch.cat([s[1] for s in seqs])
    v = torch.cat([s[2] for s in seqs])
    cu_q = torch.tensor([0, *np.cumsum([s[0].shape[0] for s in seqs])], dtype=torch.int32)
    cu_k = torch.tensor([0, *np.cumsum([s[1].shape[0] for s in seqs])], dtype=torch.int32)
    full = attention_varlen(q, k, v, cu_q, cu_k, options=AttnOptions(causal=True), numerics=FP64)
    tol = 1e-10 if numerics.dtype == torch.float64 else 2e-5
    torch.testing.assert_close(merged.out.double(), full.out, rtol=tol, atol=tol)
    live = torch.isfinite(full.lse)
    assert torch.equal(live, torch.isfinite(merged.lse))
    torch.testing.assert_close(merged.lse.double()[live], full.lse[live], rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(cp=(1, 0)), "cp.world must be an int >= 2"),
        (dict(cp=(2, 2)), r"cp.rank must be an int in \[0, 2\)"),
        (dict(cp=(2, 0, -1)), "cp.total must be an int >= 0"),
        (dict(cp="2/0"), "cp must be a ContextParallel"),
    ],
)
def test_option_validation(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        AttnOptions(causal=True, **kwargs)


@pytest.mark.parametrize("kwargs", [dict(causal=False), dict(causal=True, window=(8, 0)), dict(causal=True, chunk=16)])
def test_cp_lives_in_the_causal_mask_only(kwargs) -> None:
    with pytest.raises(ValueError, match="cp needs causal=True and no window or chunk"):
        AttnOptions(cp=(2, 0), **kwargs)


def test_call_validation() -> None:
    gen = torch.Generator().manual_seed(0)
    seqs = _shards(gen, 2)
    with pytest.raises(ValueError, match=r"cp_tot_seqused_k\[0\] = 36: rank 0 of 2 holds 18 of its keys .* has 19"):
        _rank_call(seqs, 2, 0, totals=[36] + [s[1].shape[0] for s in seqs[1:]])
    with pytest.raises(ValueError, match="must have 7 entries"):
        _rank_call(seqs, 2, 1, totals=[37])
    q, k = torch.randn(3, 2, 8), torch.randn(4, 2, 8)
    cu_q, cu_k = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="cp_tot_seqused_k must be given with options.cp"):
        attention_varlen(q, k, k, cu_q, cu_k, options=_cp(2, 0))
    with pytest.raises(ValueError, match="cp_tot_seqused_k is given but options.cp is None"):
        attention_varlen(q, k, k, cu_q, cu_k, options=AttnOptions(causal=True), cp_tot_seqused_k=[8])
    with pytest.raises(ValueError, match="either as options.cp.total or as cp_tot_seqused_k"):
        attention_varlen(q, k, k, cu_q, cu_k, options=_cp(2, 0, 8), cp_tot_seqused_k=[8])
    one = attention_varlen(q, k, k, cu_q, cu_k, options=_cp(2, 0, 8), numerics=FP64)  # a uniform total
    two = attention_varlen(q, k, k, cu_q, cu_k, options=_cp(2, 0), numerics=FP64, cp_tot_seqused_k=[8])
    assert torch.equal(one.out, two.out)
    with pytest.raises(ValueError, match="options.cp.total must be set for one sequence"):
        visible_mask(2, 2, _cp(2, 0))
