"""Identities between entry points and spellings of one computation.

Where the same per-sequence tensors reach the same engine (paged vs contiguous, NHD vs HND, padded vs
varlen, stacked vs separate caches) the results must be bit-identical; where the arithmetic is
reordered (GQA broadcast, LSE merging, tile sizes, a sink spelled as a key) they must agree to
rounding.
"""

from __future__ import annotations

import pytest
import torch
from oracle import build_paged_cache
from refhelpers import cu, make_packed

from attnref import (
    AttnOptions,
    Numerics,
    Window,
    attention_padded,
    attention_paged,
    attention_varlen,
    gather_kv,
    merge_many,
    merge_states,
    to_layout,
    window_from_fa2,
    window_to_fa2,
    window_to_fa4,
    write_kv_cache,
)

FP64 = Numerics(dtype=torch.float64)
TIGHT = {"rtol": 1e-12, "atol": 1e-12}
BLOCK_SIZES = [1, 16, 32, 64, 128, 256]


def _assert_same(a, b) -> None:
    assert torch.equal(a.out, b.out), (a.out - b.out).abs().max()
    assert torch.equal(a.lse, b.lse)


def _lens(bs: int) -> list[tuple[int, int]]:
    return [(4, 2 * bs + 1), (1, bs), (3, 0), (2, max(bs - 1, 1))]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_paged_equals_contiguous(block_size: int, layout: str) -> None:
    gen = torch.Generator().manual_seed(block_size + 1000 * (layout == "HND"))
    lens = _lens(block_size)
    p = make_packed(gen, lens, 4, 2, 16)
    options = AttnOptions(causal=True, softcap=8.0)
    sinks = torch.randn(4, generator=gen)
    for trial in range(2):  # two random permutations of the block table
        kc, vc, table = build_paged_cache(p.ks, p.vs, block_size, layout, gen)
        paged = attention_paged(
            p.q,
            kc,
            vc,
            table,
            torch.tensor([sk for _, sk in lens]),
            p.cu_q,
            layout=layout,
            options=options,
            sinks=sinks,
        )
        contiguous = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=options, sinks=sinks)
        _assert_same(paged, contiguous)


def test_nhd_equals_hnd_via_to_layout() -> None:
    gen = torch.Generator().manual_seed(2)
    lens = _lens(16)
    p = make_packed(gen, lens, 6, 3, 8, 12)
    kc, vc, table = build_paged_cache(p.ks, p.vs, 16, "NHD", gen)
    k_hnd, v_hnd = to_layout(kc, "NHD", "HND"), to_layout(vc, "NHD", "HND")
    assert k_hnd.shape == (kc.shape[0], 3, 16, 8)
    assert torch.equal(k_hnd[3, 2, 5], kc[3, 5, 2])  # (block, head, token) == (block, token, head)
    assert torch.equal(to_layout(k_hnd, "HND", "NHD"), kc)
    assert to_layout(kc, "NHD", "NHD") is kc
    used = torch.tensor([sk for _, sk in lens])
    nhd = attention_paged(p.q, kc, vc, table, used, p.cu_q, layout="NHD")
    hnd = attention_paged(p.q, k_hnd, v_hnd, table, used, p.cu_q, layout="HND")
    _assert_same(nhd, hnd)
    # The stacked (2, ...) form of the same caches (needs d == dv).
    q8 = p.q[..., :8].contiguous()
    sep = attention_paged(q8, kc, vc[..., :8].contiguous(), table, used, p.cu_q)
    stacked = attention_paged(q8, torch.stack([kc, vc[..., :8]]), None, table, used, p.cu_q)
    _assert_same(sep, stacked)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("block_size", [1, 16, 256])
@pytest.mark.parametrize("stacked", [False, True], ids=["separate", "stacked"])
def test_write_kv_cache_slot_mapping(block_size: int, layout: str, stacked: bool) -> None:
    """vLLM-style write (slot = block_table[b, t // bs] * bs + t % bs, -1 = padding) then read."""
    gen = torch.Generator().manual_seed(block_size + 7 * stacked)
    lens = _lens(block_size)
    hk, d = 2, 8
    p = make_packed(gen, lens, 4, hk, d)
    need = [-(-sk // block_size) for _, sk in lens]
    nb = sum(need) + 1
    perm = torch.randperm(nb, generator=gen)
    table = torch.full((len(lens), max(need)), nb - 1, dtype=torch.int32)
    slots, keys, values, c = [], [], [], 0
    for b, (_, sk) in enumerate(lens):
        table[b, : need[b]] = perm[c : c + need[b]].to(torch.int32)
        c += need[b]
        for t in range(sk):
            slots.append(int(table[b, t // block_size]) * block_size + t % block_size)
            keys.append(p.ks[b][t])
            values.append(p.vs[b][t])
        # A padding token: huge values that would poison any slot they were written to (a -1
        # taken as a Python index would land in the last slot of the last block).
        slots.append(-1)
        keys.append(torch.full((hk, d), 1e6))
        values.append(torch.full((hk, d), 1e6))
    shape = (nb, block_size, hk, d) if layout == "NHD" else (nb, hk, block_size, d)
    before = torch.randn((2,) + shape, generator=gen)
    cache = before.clone()
    args = (cache, None) if stacked else (cache[0], cache[1])
    write_kv_cache(torch.stack(keys), torch.stack(values), *args, torch.tensor(slots), layout=layout)
    assert cache.abs().max() < 1e5, "a -1 slot was written"
    token = cache if layout == "NHD" else cache.transpose(2, 3)
    untouched = torch.ones(nb, block_size, dtype=torch.bool)
    for s in slots:
        if s >= 0:
            untouched[s // block_size, s % block_size] = False
    before_tok = before if layout == "NHD" else before.transpose(2, 3)
    assert torch.equal(token[:, untouched], before_tok[:, untouched])
    used = torch.tensor([sk for _, sk in lens])
    got, cu_k = gather_kv(cache[0], table, used, layout)
    assert torch.equal(got, p.k) and torch.equal(cu_k, p.cu_k)
    options = AttnOptions(causal=True)
    paged = attention_paged(p.q, *args, table, used, p.cu_q, layout=layout, options=options)
    _assert_same(paged, attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=options))


def test_gqa_equals_repeated_heads() -> None:
    gen = torch.Generator().manual_seed(4)
    h, hk = 8, 2
    p = make_packed(gen, [(5, 9), (7, 3), (1, 1)], h, hk, 16, dtype=torch.float64)
    options = AttnOptions(causal=True, window=(3, 0))
    slopes = torch.rand(h, generator=gen)
    sinks = torch.randn(h, generator=gen)
    kw = {"options": options, "alibi_slopes": slopes, "sinks": sinks, "numerics": FP64}
    grouped = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, **kw)
    rep = attention_varlen(
        p.q, p.k.repeat_interleave(h // hk, 1), p.v.repeat_interleave(h // hk, 1), p.cu_q, p.cu_k, **kw
    )
    torch.testing.assert_close(grouped.out, rep.out, **TIGHT)
    torch.testing.assert_close(grouped.lse, rep.lse, **TIGHT)


@pytest.mark.parametrize("causal", [False, True])
def test_window_at_least_sequence_is_no_window(causal: bool) -> None:
    gen = torch.Generator().manual_seed(5)
    lens = [(5, 9), (9, 5), (1, 1), (12, 12)]
    p = make_packed(gen, lens, 2, 1, 8)
    big = max(max(sq, sk) for sq, sk in lens)
    plain = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=AttnOptions(causal=causal))
    for window in [(big, None if causal else big), (big + 50, 0 if causal else big + 50)]:
        windowed = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=AttnOptions(causal=causal, window=window))
        _assert_same(windowed, plain)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("split", [0, 1, 4, 9])
def test_split_keys_merge(split: int, causal: bool) -> None:
    """Attention over keys [0, m) and [m, sk) merged by LSE equals attention over all keys.

    Masks stay consistent because of bottom-right alignment: the suffix [m, sk) keeps its own
    sk - sq offset, so ``causal`` means the same there.  The prefix [0, m) is m - sk keys "shorter"
    at the bottom right, so the same limit j <= i + sk - sq is its window right = sk - m
    (non-causal, left unbounded).  Non-causal needs no mask at all.  Sinks go to one part only.
    """
    gen = torch.Generator().manual_seed(split + 10 * causal)
    sq, sk, h = 6, 9, 4
    p = make_packed(gen, [(sq, sk), (3, sk)], h, 2, 16, dtype=torch.float64)
    sinks = torch.randn(h, generator=gen)
    full_opts = AttnOptions(causal=causal)
    prefix_opts = AttnOptions(window=(None, sk - split)) if causal else AttnOptions()
    full = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=full_opts, sinks=sinks, numerics=FP64)
    pre_k = torch.cat([k[:split] for k in p.ks])
    pre_v = torch.cat([v[:split] for v in p.vs])
    suf_k = torch.cat([k[split:] for k in p.ks])
    suf_v = torch.cat([v[split:] for v in p.vs])
    a = attention_varlen(p.q, pre_k, pre_v, p.cu_q, cu([split, split]), options=prefix_opts, numerics=FP64)
    b = attention_varlen(p.q, suf_k, suf_v, p.cu_q, cu([sk - split] * 2), options=full_opts, sinks=sinks, numerics=FP64)
    merged = merge_states(a.out, a.lse, b.out, b.lse)
    torch.testing.assert_close(merged.out, full.out, **TIGHT)
    torch.testing.assert_close(merged.lse, full.lse, **TIGHT)


def test_merge_many_three_parts_and_empty_rows() -> None:
    gen = torch.Generator().manual_seed(6)
    p = make_packed(gen, [(4, 12)], 2, 2, 8, dtype=torch.float64)
    full = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, numerics=FP64)
    parts = [
        attention_varlen(p.q, p.k[a:b], p.v[a:b], p.cu_q, cu([b - a]), numerics=FP64)
        for a, b in [(0, 5), (5, 5), (5, 12)]
    ]
    merged = merge_many([r.out for r in parts], [r.lse for r in parts])
    torch.testing.assert_close(merged.out, full.out, **TIGHT)
    torch.testing.assert_close(merged.lse, full.lse, **TIGHT)
    # A row that saw nothing in every part stays 0 with LSE -inf (no NaN from -inf - -inf).
    empty = parts[1]
    merged = merge_states(empty.out, empty.lse, empty.out, empty.lse)
    assert torch.equal(merged.out, torch.zeros_like(merged.out)) and torch.isneginf(merged.lse).all()


@pytest.mark.parametrize("causal", [False, True])
def test_sink_equals_extra_key(causal: bool) -> None:
    """A sink is a key whose score is the sink logit and whose value is zero.

    Spelled with one extra head dimension: q' = [q, sink_h], k' = [k, 0], and a key [0, 1/scale]
    prepended at position 0 with value 0; its score is scale * sink_h / scale = sink_h (exact for
    scale = 1/4).  Prepending keeps every original key's bottom-right position (causal unchanged)
    and makes the extra key visible to every row when sq <= sk.
    """
    gen = torch.Generator().manual_seed(8 + causal)
    h, hk, d, scale = 4, 2, 16, 0.25
    lens = [(5, 9), (3, 3), (1, 6)]
    p = make_packed(gen, lens, h, hk, d, dtype=torch.float64)
    sinks = torch.randn(h, generator=gen, dtype=torch.float64) * 2
    options = AttnOptions(causal=causal, scale=scale)
    want = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, options=options, sinks=sinks, numerics=FP64)
    q2 = torch.cat([p.q, sinks[None, :, None].expand(p.q.shape[0], h, 1)], -1)
    ks, vs = [], []
    for k, v in zip(p.ks, p.vs):
        extra_k = torch.zeros(1, hk, d + 1, dtype=torch.float64)
        extra_k[..., d] = 1.0 / scale
        ks.append(torch.cat([extra_k, torch.cat([k, k.new_zeros(k.shape[0], hk, 1)], -1)]))
        vs.append(torch.cat([v.new_zeros(1, hk, d), v]))
    got = attention_varlen(
        q2,
        torch.cat(ks),
        torch.cat(vs),
        p.cu_q,
        cu([sk + 1 for _, sk in lens]),
        options=options,
        numerics=FP64,
    )
    torch.testing.assert_close(got.out, want.out, **TIGHT)
    torch.testing.assert_close(got.lse, want.lse, **TIGHT)


@pytest.mark.parametrize("budget", [1, 7, 64, 1000])
def test_tile_budget_does_not_change_results(budget: int) -> None:
    gen = torch.Generator().manual_seed(budget)
    lens = [(37, 53), (50, 20), (1, 1), (0, 5), (9, 0)]
    p = make_packed(gen, lens, 4, 2, 16)
    options = AttnOptions(causal=True, window=(11, 0), chunk=16, softcap=6.0)
    kw = {
        "options": options,
        "alibi_slopes": torch.rand(4, generator=gen),
        "sinks": torch.randn(4, generator=gen),
    }
    for dtype, tol in [(torch.float32, {"rtol": 1e-5, "atol": 1e-6}), (torch.float64, TIGHT)]:
        big = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, numerics=Numerics(dtype, max_tile_elems=1 << 22), **kw)
        small = attention_varlen(p.q, p.k, p.v, p.cu_q, p.cu_k, numerics=Numerics(dtype, max_tile_elems=budget), **kw)
        torch.testing.assert_close(small.out, big.out, **tol)
        torch.testing.assert_close(small.lse, big.lse, **tol)


def test_padded_equals_varlen() -> None:
    gen = torch.Generator().manual_seed(9)
    b, sq, sk, h, hk, d = 3, 4, 10, 4, 2, 8
    q = torch.randn(b, sq, h, d, generator=gen)
    k = torch.randn(b, sk, hk, d, generator=gen)
    v = torch.randn(b, sk, hk, d, generator=gen)
    used = [10, 3, 0]
    options = AttnOptions(causal=True, window=(2, 0))
    alibi = torch.rand(b, h, generator=gen)
    padded = attention_padded(q, k, v, seqlens_k=torch.tensor(used), options=options, alibi_slopes=alibi)
    flat_q = q.reshape(b * sq, h, d)
    cu_q = cu([sq] * b)
    varlen = attention_varlen(
        flat_q,
        torch.cat([k[i, :n] for i, n in enumerate(used)]),
        torch.cat([v[i, :n] for i, n in enumerate(used)]),
        cu_q,
        cu(used),
        options=options,
        alibi_slopes=alibi,
    )
    assert torch.equal(padded.out.reshape(b * sq, h, d), varlen.out)
    assert torch.equal(padded.lse.permute(1, 0, 2).reshape(h, b * sq), varlen.lse)
    # The seqused_k-only varlen spelling reads the same padded keys flattened.
    flat = attention_varlen(
        flat_q,
        k.reshape(b * sk, hk, d),
        v.reshape(b * sk, hk, d),
        cu_q,
        seqused_k=torch.tensor(used),
        options=options,
        alibi_slopes=alibi,
    )
    _assert_same(flat, varlen)


@pytest.mark.parametrize(
    "fa2, window, causal",
    [
        ((-1, -1), Window(None, None), False),
        ((128, 0), Window(128, 0), False),
        ((-1, 0), Window(None, 0), False),
        ((0, -1), Window(0, None), False),
        ((64, -1), Window(64, None), True),
    ],
)
def test_window_spellings(fa2: tuple[int, int], window: Window, causal: bool) -> None:
    if not causal:
        assert window_from_fa2(*fa2) == window
    assert window_to_fa2(window) == fa2  # causal is the kernels' separate flag
    assert window_to_fa4(window, causal) == (window.left, 0 if causal else window.right)
    assert window_from_fa2(-5, -7) == Window(None, None)
