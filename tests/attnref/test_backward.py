"""attnref.backward against the autograd oracle (grad_oracle.py) and against identities of attention gradients.

The grid covers every mode of the reference's backward (causal, windows, chunked local, soft-cap, custom scale,
ALiBi, sinks, GQA and MQA, d != dv, sq > sk, empty key and query sequences) at tile budgets that force one score
per head per tile, a few per tile, and one tile per sequence, so the tiled loops and their skips are exercised.
"""

from __future__ import annotations

import pytest
import torch
from grad_oracle import oracle_grads_batch
from hypothesis import given, settings
from hypothesis import strategies as st
from oracle import options_kwargs
from refhelpers import make_packed

from attnref import AttnOptions, Numerics, attention_padded_backward, attention_varlen, attention_varlen_backward

F64 = torch.float64
# (rtol, atol) of the gradients against the float64 oracle, per accumulation dtype (sums over <= 40 keys).
TOL = {F64: (1e-10, 1e-10), torch.float32: (2e-5, 5e-5)}
LENS = [(5, 7), (0, 3), (7, 4), (3, 0), (1, 1), (6, 6)]  # sq < sk, no queries, sq > sk, no keys, one, equal

MODES = {
    "full": AttnOptions(),
    "causal": AttnOptions(causal=True),
    "causal_left2": AttnOptions(causal=True, window=(2, None)),
    "window_2_1": AttnOptions(window=(2, 1)),
    "window_right1": AttnOptions(window=(None, 1)),
    "chunk3": AttnOptions(chunk=3),
    "chunk2_causal": AttnOptions(chunk=2, causal=True),
    "softcap": AttnOptions(softcap=0.8),
    "softcap_causal_scale": AttnOptions(causal=True, softcap=1.5, scale=0.9),
    "scale": AttnOptions(scale=0.37),
}
EXTRAS = {"plain": (False, False), "alibi": (True, False), "sinks": (False, True), "alibi_sinks": (True, True)}


def _inputs(lens, h, hk, d, dv, *, alibi: bool, sinks: bool, seed: int = 0, q_scale: float = 1.5):
    gen = torch.Generator().manual_seed(seed)
    packed = make_packed(gen, lens, h, hk, d, dv, dtype=F64, q_scale=q_scale)
    douts = [torch.randn(sq, h, dv, generator=gen, dtype=F64) for sq, _ in lens]
    slopes = torch.rand(len(lens), h, generator=gen, dtype=F64) if alibi else None
    sink = torch.randn(h, generator=gen, dtype=F64) if sinks else None
    return packed, douts, slopes, sink


def _check(packed, douts, options, *, alibi=None, sinks=None, numerics=Numerics(F64), tol=None, **kwargs):
    got = attention_varlen_backward(
        packed.q,
        packed.k,
        packed.v,
        torch.cat(douts, 0),
        packed.cu_q,
        packed.cu_k,
        options=options,
        alibi_slopes=alibi,
        sinks=sinks,
        numerics=numerics,
        **kwargs,
    )
    want = oracle_grads_batch(
        packed.qs, packed.ks, packed.vs, douts, alibi=alibi, sinks=sinks, **options_kwargs(options)
    )
    rtol, atol = TOL[numerics.dtype] if tol is None else tol
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        if w is None:
            assert g is None, name
            continue
        assert g.dtype == numerics.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.shape)
        torch.testing.assert_close(g.to(F64), w, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")
    return got


@pytest.mark.parametrize("budget", [1, 7, 1 << 20])
@pytest.mark.parametrize("extra", list(EXTRAS))
@pytest.mark.parametrize("mode", list(MODES))
def test_matches_autograd_oracle(mode: str, extra: str, budget: int) -> None:
    alibi, sinks = EXTRAS[extra]
    packed, douts, slopes, sink = _inputs(LENS, 4, 2, 3, 5, alibi=alibi, sinks=sinks)
    _check(packed, douts, MODES[mode], alibi=slopes, sinks=sink, numerics=Numerics(F64, budget))


@pytest.mark.parametrize("mode", ["causal", "window_2_1", "softcap_causal_scale", "chunk3"])
def test_mqa_and_fp32_accumulation(mode: str) -> None:
    packed, douts, slopes, sink = _inputs(LENS, 3, 1, 4, 2, alibi=True, sinks=True, seed=1)
    _check(packed, douts, MODES[mode], alibi=slopes[0], sinks=sink, numerics=Numerics(F64, 5))
    _, douts32, slopes32, sink32 = _inputs(LENS, 3, 1, 4, 2, alibi=True, sinks=True, seed=2)
    # fp32 inputs hold the same values as the oracle's fp64 copies; only the accumulation differs
    cast = make_packed(torch.Generator().manual_seed(2), LENS, 3, 1, 4, 2, dtype=torch.float32, q_scale=1.5)
    _check(cast, douts32, MODES[mode], alibi=slopes32, sinks=sink32, numerics=Numerics(torch.float32, 11))
    half = make_packed(torch.Generator().manual_seed(2), LENS, 3, 1, 4, 2, dtype=torch.bfloat16, q_scale=1.5)
    douts16 = [do.to(torch.bfloat16) for do in douts32]  # a kernel's case: bf16 tensors, fp32 accumulation
    _check(half, douts16, MODES[mode], alibi=slopes32, sinks=sink32, numerics=Numerics(torch.float32, 11))


@pytest.mark.parametrize("mode", ["full", "causal_left2", "softcap_causal_scale"])
def test_peaked_and_offset_inputs(mode: str) -> None:
    """Near-one-hot rows (scores in the hundreds) and values with a large common offset, where dS = P (dP - D)
    cancels: still the oracle's gradients in fp64.  Both sides round scores of ~100 (P to ~1e-14 relative) and
    multiply by dP ~ 1e3 and q ~ 40, so the fp64 agreement is ~1e-9 absolute here, not 1e-10."""
    packed, douts, slopes, sink = _inputs([(9, 12), (7, 7)], 4, 2, 4, 3, alibi=True, sinks=True, seed=11, q_scale=40)
    packed.v += 1e3
    packed.vs = [v + 1e3 for v in packed.vs]
    got = _check(packed, douts, MODES[mode], alibi=slopes, sinks=sink, numerics=Numerics(F64, 9), tol=(1e-10, 1e-8))
    assert all(torch.isfinite(g).all() for g in got)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the reference on the GPU equals the CPU one")
def test_cuda_equals_cpu() -> None:
    packed, douts, slopes, sink = _inputs([(33, 40), (17, 9)], 4, 2, 16, 8, alibi=True, sinks=True, seed=12)
    options, numerics = AttnOptions(causal=True, window=(20, None), softcap=5.0), Numerics(F64, 512)
    cpu = _grads(packed, douts, options, alibi_slopes=slopes, sinks=sink, numerics=numerics)
    dev = {name: getattr(packed, name).cuda() for name in ("q", "k", "v", "cu_q", "cu_k")}
    gpu = attention_varlen_backward(
        dev["q"],
        dev["k"],
        dev["v"],
        torch.cat(douts).cuda(),
        dev["cu_q"],
        dev["cu_k"],
        options=options,
        alibi_slopes=slopes.cuda(),
        sinks=sink.cuda(),
        numerics=numerics,
    )
    for g, c in zip(gpu, cpu):
        assert g.device.type == "cuda"
        torch.testing.assert_close(g.cpu(), c, rtol=1e-12, atol=1e-12)


@st.composite
def _drawn(draw):
    length = st.sampled_from([0, 1, 2, 3, 5, 8, 13])
    lens = [(draw(length), draw(length)) for _ in range(draw(st.integers(1, 3)))]
    hk = draw(st.sampled_from([1, 2]))
    h = hk * draw(st.sampled_from([1, 2, 3]))
    d, dv = draw(st.sampled_from([2, 4])), draw(st.sampled_from([2, 3, 4]))
    causal = draw(st.booleans())
    extent = st.one_of(st.none(), st.integers(0, 6))
    options = AttnOptions(
        causal=causal,
        window=(draw(extent), draw(st.sampled_from([None, 0])) if causal else draw(extent)),
        softcap=draw(st.one_of(st.none(), st.sampled_from([0.5, 3.0]))),
        scale=draw(st.one_of(st.none(), st.floats(0.1, 2.0))),
        chunk=draw(st.one_of(st.none(), st.integers(1, 5))),
    )
    flags = (draw(st.booleans()), draw(st.booleans()))
    return lens, h, hk, d, dv, options, flags, draw(st.sampled_from([1, 3, 16, 1 << 20])), draw(st.integers(0, 99))


@settings(max_examples=60)
@given(_drawn())
def test_random_modes_match_autograd_oracle(case) -> None:
    lens, h, hk, d, dv, options, (alibi, sinks), budget, seed = case
    packed, douts, slopes, sink = _inputs(lens, h, hk, d, dv, alibi=alibi, sinks=sinks, seed=seed)
    _check(packed, douts, options, alibi=slopes, sinks=sink, numerics=Numerics(F64, budget))


# ---- identities (no oracle involved) ----


def _grads(packed, douts, options, **kwargs):
    return attention_varlen_backward(
        packed.q, packed.k, packed.v, torch.cat(douts, 0), packed.cu_q, packed.cu_k, options=options, **kwargs
    )


@pytest.mark.parametrize("mode", list(MODES))
def test_identities_of_sums(mode: str) -> None:
    """Without sinks: sum_j dV_j = sum of dO over rows that see a key (P sums to 1) and sum_j dK_j = 0 when there is
    no soft-cap (shifting every key by c adds a constant to a row's scores); with sinks and soft-cap too:
    sum q.dQ = sum k.dK (both are sum s_raw * dS_raw) and sum v.dV = sum dO.O."""
    options = MODES[mode]
    packed, douts, slopes, _ = _inputs([(6, 6), (4, 9)], 4, 2, 3, 5, alibi=True, sinks=False, seed=3)
    grads = _grads(packed, douts, options, alibi_slopes=slopes, numerics=Numerics(F64, 5))
    dout = torch.cat(douts, 0)
    out, lse = attention_varlen(
        packed.q,
        packed.k,
        packed.v,
        packed.cu_q,
        packed.cu_k,
        options=options,
        alibi_slopes=slopes,
        numerics=Numerics(F64),
    )
    seen = torch.isfinite(lse).transpose(0, 1)[..., None]  # (total_q, h, 1)
    for b in range(2):
        q0, q1, k0, k1 = packed.cu_q[b], packed.cu_q[b + 1], packed.cu_k[b], packed.cu_k[b + 1]
        want_dv = (dout[q0:q1] * seen[q0:q1]).sum(0).reshape(2, 2, 5).sum(1)  # per kv head, summed over the group
        torch.testing.assert_close(grads.dv[k0:k1].sum(0), want_dv, rtol=1e-12, atol=1e-12)
        if options.softcap is None:
            torch.testing.assert_close(grads.dk[k0:k1].sum(0), torch.zeros(2, 3, dtype=F64), rtol=0, atol=1e-12)
    packed, douts, slopes, sink = _inputs([(6, 6), (4, 9), (5, 2)], 4, 2, 3, 5, alibi=True, sinks=True, seed=4)
    grads = _grads(packed, douts, options, alibi_slopes=slopes, sinks=sink, numerics=Numerics(F64, 5))
    out, _ = attention_varlen(
        packed.q,
        packed.k,
        packed.v,
        packed.cu_q,
        packed.cu_k,
        options=options,
        alibi_slopes=slopes,
        sinks=sink,
        numerics=Numerics(F64),
    )
    torch.testing.assert_close((packed.q * grads.dq).sum(), (packed.k * grads.dk).sum(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((packed.v * grads.dv).sum(), (torch.cat(douts) * out).sum(), rtol=1e-12, atol=1e-12)


def test_single_visible_key_has_no_score_gradient() -> None:
    """Window (0, 0) with sq == sk: each row sees one key, its softmax is the constant 1, so dQ = dK = 0, dV = dO."""
    packed, douts, slopes, _ = _inputs([(5, 5), (3, 3)], 4, 2, 3, 5, alibi=True, sinks=False, seed=5)
    for options in (AttnOptions(window=(0, 0)), AttnOptions(causal=True, window=(0, None), softcap=2.0)):
        grads = _grads(packed, douts, options, alibi_slopes=slopes, numerics=Numerics(F64, 3))
        assert grads.dq.abs().max() <= 1e-13 and grads.dk.abs().max() <= 1e-13  # rounding of P = exp(s - lse) ~ 1
        torch.testing.assert_close(grads.dv, torch.cat(douts).reshape(8, 2, 2, 5).sum(2), rtol=1e-15, atol=1e-15)


def test_fully_masked_rows_and_empty_sequences_give_zero() -> None:
    packed, douts, _, sink = _inputs([(7, 3), (2, 0), (0, 4)], 2, 1, 3, 4, alibi=False, sinks=True, seed=6)
    grads = _grads(packed, douts, AttnOptions(causal=True), sinks=sink, numerics=Numerics(F64, 2))
    assert torch.equal(grads.dq[:4], torch.zeros_like(grads.dq[:4]))  # causal, sq > sk: the top 4 rows see nothing
    assert grads.dq[4:7].abs().amin(dim=(1, 2)).gt(0).all()
    assert torch.equal(grads.dq[7:9], torch.zeros_like(grads.dq[7:9]))  # no keys
    assert torch.equal(grads.dk[3:], torch.zeros_like(grads.dk[3:])) and not grads.dv[3:].any()
    alone = _grads(
        make_packed(torch.Generator().manual_seed(6), [(2, 0)], 2, 1, 3, 4, dtype=F64),
        [torch.ones(2, 2, 4, dtype=F64)],
        AttnOptions(),
        sinks=sink,
    )
    assert torch.equal(alone.dsinks, torch.zeros(2, dtype=alone.dsinks.dtype))  # the sink alone: O = 0, D = 0


def test_tile_budget_invariance() -> None:
    packed, douts, slopes, sink = _inputs([(13, 17), (9, 5)], 4, 2, 3, 5, alibi=True, sinks=True, seed=7)
    options = AttnOptions(causal=True, window=(6, None), softcap=2.0, chunk=8)
    base = _grads(packed, douts, options, alibi_slopes=slopes, sinks=sink, numerics=Numerics(F64, 1 << 20))
    for budget in (1, 4, 9, 50, 300):
        got = _grads(packed, douts, options, alibi_slopes=slopes, sinks=sink, numerics=Numerics(F64, budget))
        for g, w in zip(got, base):
            torch.testing.assert_close(g, w, rtol=1e-13, atol=1e-13)


def test_given_forward_equals_recomputed_forward() -> None:
    packed, douts, slopes, sink = _inputs([(6, 8), (4, 3)], 4, 2, 3, 5, alibi=True, sinks=True, seed=8)
    options, numerics = AttnOptions(causal=True, softcap=1.0), Numerics(F64, 7)
    res = attention_varlen(
        packed.q,
        packed.k,
        packed.v,
        packed.cu_q,
        packed.cu_k,
        options=options,
        alibi_slopes=slopes,
        sinks=sink,
        numerics=numerics,
    )
    a = _grads(packed, douts, options, alibi_slopes=slopes, sinks=sink, numerics=numerics)
    b = _grads(packed, douts, options, alibi_slopes=slopes, sinks=sink, numerics=numerics, out=res.out, lse=res.lse)
    for g, w in zip(a, b):
        assert torch.equal(g, w)


@pytest.mark.parametrize("mode", ["causal_left2", "softcap_causal_scale", "chunk3"])
def test_padded_batch_matches_oracle_and_leaves_unused_keys_at_zero(mode: str) -> None:
    gen = torch.Generator().manual_seed(10)
    q = torch.randn(3, 5, 4, 3, generator=gen, dtype=F64)
    k = torch.randn(3, 6, 2, 3, generator=gen, dtype=F64)
    v = torch.randn(3, 6, 2, 2, generator=gen, dtype=F64)
    dout = torch.randn(3, 5, 4, 2, generator=gen, dtype=F64)
    slopes, sink = torch.rand(3, 4, generator=gen, dtype=F64), torch.randn(4, generator=gen, dtype=F64)
    lens = [6, 2, 0]
    got = attention_padded_backward(
        q,
        k,
        v,
        dout,
        seqlens_k=torch.tensor(lens),
        options=MODES[mode],
        alibi_slopes=slopes,
        sinks=sink,
        numerics=Numerics(F64, 5),
    )
    want = oracle_grads_batch(
        [q[b] for b in range(3)],
        [k[b, : lens[b]] for b in range(3)],
        [v[b, : lens[b]] for b in range(3)],
        list(dout),
        alibi=slopes,
        sinks=sink,
        **options_kwargs(MODES[mode]),
    )
    torch.testing.assert_close(got.dq.reshape(15, 4, 3), want[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.cat([got.dk[b, : lens[b]] for b in range(3)]), want[1], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.cat([got.dv[b, : lens[b]] for b in range(3)]), want[2], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got.dsinks, want[3], rtol=1e-10, atol=1e-10)
    assert not got.dk[1, 2:].any() and not got.dv[2].any()  # keys past seqlens_k
    with pytest.raises(ValueError, match="^dout must have shape"):
        attention_padded_backward(q, k, v, dout[:, :4])
    with pytest.raises(ValueError, match="^seqlens_k"):
        attention_padded_backward(q, k, v, dout, seqlens_k=torch.tensor([7, 0, 0]))


# ---- operand_dtype: the same-precision baseline ----


def test_operand_dtype_rounds_p_and_ds_only() -> None:
    packed, douts, slopes, sink = _inputs([(20, 24), (9, 9)], 4, 2, 8, 8, alibi=True, sinks=True, seed=9)
    options = AttnOptions(causal=True, softcap=3.0)
    exact = _grads(packed, douts, options, alibi_slopes=slopes, sinks=sink, numerics=Numerics(F64, 64))
    same = _grads(
        packed, douts, options, alibi_slopes=slopes, sinks=sink, numerics=Numerics(F64, 64), operand_dtype=F64
    )
    for g, w in zip(same, exact):
        assert torch.equal(g, w)
    for dtype, lo, hi in ((torch.bfloat16, 1e-4, 2e-2), (torch.float16, 1e-6, 3e-3), (torch.float32, 1e-10, 1e-6)):
        got = _grads(
            packed, douts, options, alibi_slopes=slopes, sinks=sink, numerics=Numerics(F64, 64), operand_dtype=dtype
        )
        for name, g, w in zip(("dq", "dk", "dv"), got[:3], exact[:3]):
            rel = float((g - w).abs().max() / w.abs().max())
            assert lo < rel < hi, (dtype, name, rel)
        assert torch.equal(got.dsinks, exact.dsinks)  # d sink reads neither P nor dS of the keys


def test_softcap_arg_dtype_rounds_the_tanh_argument_only_with_a_softcap() -> None:
    """``softcap_arg_dtype`` forms ``tanh(r(r(s_raw) / cap))``: no effect without a soft-cap (bit for bit, every
    mode), a change of the rounding's size with one, and none when the dtype is the accumulation dtype."""
    packed, douts, slopes, sink = _inputs([(20, 24), (9, 9)], 4, 2, 8, 8, alibi=True, sinks=True, seed=9)
    kw = dict(alibi_slopes=slopes, sinks=sink, numerics=Numerics(torch.float32), operand_dtype=torch.float16)
    for mode, options in MODES.items():
        plain = _grads(packed, douts, options, **kw)
        rounded = _grads(packed, douts, options, softcap_arg_dtype=torch.float16, **kw)
        same = _grads(packed, douts, options, softcap_arg_dtype=torch.float32, **kw)
        for name, g, w, w32 in zip(("dq", "dk", "dv", "dsinks"), rounded, plain, same):
            assert torch.equal(w32, w), (mode, name)
            if options.softcap is None or name == "dsinks":  # d sink reads neither P nor dS of the keys
                assert torch.equal(g, w), (mode, name)
            else:
                rel = float((g - w).abs().max() / w.abs().max())
                assert 1e-6 < rel < 1e-2, (mode, name, rel)


# ---- validation ----


def _valid():
    packed, douts, _, _ = _inputs([(3, 4)], 2, 1, 3, 5, alibi=False, sinks=False)
    return packed, torch.cat(douts)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda p, do: {"dout": do[:, :, :4]}, "^dout must have shape"),
        (lambda p, do: {"dout": do[:2]}, "^dout must have shape"),
        (lambda p, do: {"dout": do.to(torch.int32)}, "^dout must be a floating"),
        (lambda p, do: {"dout": do.tolist()}, "^dout must be a torch.Tensor, got list$"),
        (lambda p, do: {"dout": do.to("meta")}, "^dout must be on q's device cpu, got meta$"),
        (lambda p, do: {"options": AttnOptions(causal=True, cp=(2, 0, 8))}, "^options.cp must be None"),
        (lambda p, do: {"qv": torch.zeros(3, 2, 5)}, "^qv must be None"),
        (lambda p, do: {"operand_dtype": torch.int8}, "^operand_dtype must be"),
        (lambda p, do: {"softcap_arg_dtype": torch.int8}, "^softcap_arg_dtype must be"),
        (lambda p, do: {"cu_seqlens_q": torch.tensor([0, 2])}, "^cu_seqlens_q"),
        (lambda p, do: {"cu_seqlens_k": torch.tensor([0, 5])}, "^cu_seqlens_k"),
        (lambda p, do: {"sinks": torch.zeros(3)}, "^sinks must have shape"),
        (lambda p, do: {"alibi_slopes": torch.zeros(5)}, "^alibi_slopes must have shape"),
        (lambda p, do: {"out": torch.zeros(3, 2, 5)}, "^out and lse must be given together"),
        (lambda p, do: {"out": torch.zeros(3, 2, 4), "lse": torch.zeros(2, 3)}, "^out must have shape"),
        (lambda p, do: {"k": p.k[:, :, :2]}, "^k head_dim"),
    ],
)
def test_validation_names_the_argument(change, match: str) -> None:
    packed, dout = _valid()
    args = {
        "q": packed.q,
        "k": packed.k,
        "v": packed.v,
        "dout": dout,
        "cu_seqlens_q": packed.cu_q,
        "cu_seqlens_k": packed.cu_k,
    }
    args.update(change(packed, dout))
    with pytest.raises(ValueError, match=match):
        attention_varlen_backward(**args)
