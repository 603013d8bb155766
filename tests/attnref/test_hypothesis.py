"""Random cases (Hypothesis) of every entry point against the float64 oracle.

Shapes stay small so that many feature combinations fit in a few seconds; the project's derandomized profile
(tests/conftest.py) keeps the suite reproducible (the same examples every run), so a failure here is a plain
regression.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import build_paged_cache, options_kwargs, oracle_attention
from refhelpers import assert_close_to, check_against_oracle, make_packed

from attnref import AttnOptions, Numerics, attention_padded, attention_paged, attention_varlen

SETTINGS = settings(max_examples=400)


@dataclass(frozen=True)
class Drawn:
    lens: list[tuple[int, int]]
    h: int
    hk: int
    d: int
    dv: int
    options: AttnOptions
    alibi: str | None
    sinks: bool
    dtype: torch.dtype
    seed: int


_maybe_extent = st.one_of(st.none(), st.integers(0, 12))


@st.composite
def drawn_cases(draw, same_sq: bool = False) -> Drawn:
    nseq = draw(st.integers(1, 3))
    length = st.sampled_from([0, 1, 2, 3, 5, 8, 13, 21, 40])
    if same_sq:
        sq = draw(length)
        lens = [(sq, draw(length)) for _ in range(nseq)]
    else:
        lens = [(draw(length), draw(length)) for _ in range(nseq)]
    hk = draw(st.sampled_from([1, 2]))
    h = hk * draw(st.sampled_from([1, 2, 3]))
    d = draw(st.sampled_from([4, 8, 32]))
    dv = draw(st.sampled_from([d, 8]))
    causal = draw(st.booleans())
    right = draw(st.sampled_from([None, 0])) if causal else draw(_maybe_extent)
    options = AttnOptions(
        causal=causal,
        window=(draw(_maybe_extent), right),
        softcap=draw(st.one_of(st.none(), st.sampled_from([0.5, 3.0, 30.0]))),
        scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0))),
        chunk=draw(st.one_of(st.none(), st.integers(1, 9))),
    )
    return Drawn(
        lens,
        h,
        hk,
        d,
        dv,
        options,
        draw(st.sampled_from([None, "h", "bh"])),
        draw(st.booleans()),
        draw(st.sampled_from([torch.float64, torch.float32])),
        draw(st.integers(0, 2**31 - 1)),
    )


def _extras(c: Drawn, gen: torch.Generator) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    alibi = None
    if c.alibi == "h":
        alibi = torch.rand(c.h, generator=gen)
    elif c.alibi == "bh":
        alibi = torch.rand(len(c.lens), c.h, generator=gen)
    sinks = torch.randn(c.h, generator=gen) * 2 if c.sinks else None
    return alibi, sinks


@SETTINGS
@given(drawn_cases())
def test_varlen_random(c: Drawn) -> None:
    gen = torch.Generator().manual_seed(c.seed)
    p = make_packed(gen, c.lens, c.h, c.hk, c.d, c.dv, q_scale=2.0 if c.options.softcap else 1.0)
    alibi, sinks = _extras(c, gen)
    res = attention_varlen(
        p.q,
        p.k,
        p.v,
        p.cu_q,
        p.cu_k,
        options=c.options,
        alibi_slopes=alibi,
        sinks=sinks,
        numerics=Numerics(c.dtype),
    )
    check_against_oracle(res, p, c.options, c.dtype, alibi=alibi, sinks=sinks)


@SETTINGS
@given(drawn_cases(), st.sampled_from([1, 2, 3, 16, 32]), st.sampled_from(["NHD", "HND"]), st.integers(1, 64))
def test_paged_random(c: Drawn, block_size: int, layout: str, budget: int) -> None:
    """Paged, with a tiny tile budget too: tiles then cut through blocks and masked regions."""
    gen = torch.Generator().manual_seed(c.seed)
    p = make_packed(gen, c.lens, c.h, c.hk, c.d, c.dv)
    alibi, sinks = _extras(c, gen)
    kc, vc, table = build_paged_cache(p.ks, p.vs, block_size, layout, gen)
    used = torch.tensor([sk for _, sk in c.lens], dtype=torch.int32)
    res = attention_paged(
        p.q,
        kc,
        vc,
        table,
        used,
        p.cu_q,
        layout=layout,
        options=c.options,
        alibi_slopes=alibi,
        sinks=sinks,
        numerics=Numerics(c.dtype, max_tile_elems=budget * c.h),
    )
    check_against_oracle(res, p, c.options, c.dtype, alibi=alibi, sinks=sinks)


@settings(max_examples=150)
@given(drawn_cases(same_sq=True))
def test_padded_random(c: Drawn) -> None:
    gen = torch.Generator().manual_seed(c.seed)
    b, sq = len(c.lens), c.lens[0][0]
    sk_max = max(sk for _, sk in c.lens)
    # Keys past seqlens_k hold large values: reading them would be a visible error.
    q = torch.randn(b, sq, c.h, c.d, generator=gen, dtype=c.dtype)
    k = torch.randn(b, sk_max, c.hk, c.d, generator=gen, dtype=c.dtype) * 50
    v = torch.randn(b, sk_max, c.hk, c.dv, generator=gen, dtype=c.dtype) * 50
    used = [sk for _, sk in c.lens]
    for i, n in enumerate(used):
        k[i, :n] /= 50
        v[i, :n] /= 50
    alibi, sinks = _extras(c, gen)
    res = attention_padded(
        q,
        k,
        v,
        seqlens_k=torch.tensor(used),
        options=c.options,
        alibi_slopes=alibi,
        sinks=sinks,
        numerics=Numerics(c.dtype),
    )
    for i, n in enumerate(used):
        slopes = None if alibi is None else (alibi if alibi.dim() == 1 else alibi[i])
        want_out, want_lse = oracle_attention(
            q[i], k[i, :n], v[i, :n], alibi=slopes, sinks=sinks, **options_kwargs(c.options)
        )
        assert_close_to(res.out[i], res.lse[i], want_out, want_lse, c.dtype)
