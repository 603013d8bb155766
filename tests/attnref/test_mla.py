"""MLA absorbed attention (:mod:`attnref.mla`) against the unabsorbed multi-head attention it stands for.

The oracle here is DeepSeek MLA written the long way, in numpy float64 and without attnref: explicit
per-head up-projections ``W_UK`` (nope 128 <- latent 512) and ``W_UV`` (latent 512 -> v 128), keys
``k = [W_UK c_kv | k_rope]`` (192 per head), values ``W_UV^T c_kv``, scale ``1/sqrt(192)``, a textbook
softmax per (sequence, head, row) with the bottom-right causal mask built by hand.  The reference must
reproduce it from the absorbed form (``qv = q_nope @ W_UK``, one latent kv head, output ``@ W_UV``
afterwards) to 1e-10 in fp64, LSE included: that is the algebra the kernels (FA3 ``qv``, FlashMLA) rely on.

Then the spellings: the 576-wide ``attention_mla_varlen`` / ``attention_mla_paged`` equal
``attention_varlen(..., qv=...)``; the default scale is ``1/sqrt(576)``; the latent/rope order matters;
and every bad argument raises a ``ValueError`` naming it.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from oracle import build_paged_cache
from refhelpers import cu

from attnref import (
    AttnOptions,
    Numerics,
    attention_mla_paged,
    attention_mla_varlen,
    attention_padded,
    attention_paged,
    attention_varlen,
    join_latent,
    split_latent,
)

FP64 = Numerics(dtype=torch.float64)
FP32 = Numerics(dtype=torch.float32)
NOPE, ROPE, LATENT, VDIM = 128, 64, 512, 128  # DeepSeek-V2/V3: qk_nope, qk_rope, kv_lora_rank, v_head_dim
DEEPSEEK_SCALE = 1.0 / math.sqrt(NOPE + ROPE)  # softmax_scale = qk_head_dim ** -0.5 (mscale 1)
# (rtol, atol) of the absorbed reference against the unabsorbed oracle.  fp64: summation order only.
# fp32: inputs are rounded to fp32 before both sides see them; what is left is fp32 accumulation of
# 576-long dot products and <= 64-key softmaxes (measured worst 1.2e-6 on O(1) values): 15x margin.
TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (2e-5, 2e-5)}


# --- the unabsorbed oracle (numpy float64, no attnref) ----------------------------------------------


def unabsorbed_mla(
    q_nope: np.ndarray,
    q_rope: np.ndarray,
    c_kv: np.ndarray,
    k_rope: np.ndarray,
    w_uk: np.ndarray,
    w_uv: np.ndarray,
    lens: list[tuple[int, int]],
    *,
    scale: float,
    causal: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention with keys and values up-projected from the latent, one head at a time.

    Args:
        q_nope (n, h, 128), q_rope (n, h, 64); c_kv (s, 512), k_rope (s, 64) (one per token, all heads);
        w_uk (h, 128, 512): ``k_nope[t, h] = w_uk[h] @ c_kv[t]``; w_uv (h, 512, 128):
        ``v[t, h] = w_uv[h].T @ c_kv[t]``; lens: (sq, sk) per sequence, packed in order.
        causal: row i of a sequence sees key j iff ``j <= i + sk - sq`` (bottom-right aligned).

    Returns:
        out (n, h, 128) and lse (h, n), natural log, ``-inf`` for a row that sees no key.
    """
    n, h, _ = q_nope.shape
    out = np.zeros((n, h, w_uv.shape[2]))
    lse = np.full((h, n), -np.inf)
    q0 = k0 = 0
    for sq, sk in lens:
        ckv, kr = c_kv[k0 : k0 + sk], k_rope[k0 : k0 + sk]
        for head in range(h):
            k_nope = ckv @ w_uk[head].T  # (sk, 128): row t is W_UK[h] @ c_kv[t]
            k = np.concatenate([k_nope, kr], axis=1)  # (sk, 192)
            v = ckv @ w_uv[head]  # (sk, 128): row t is W_UV[h]^T @ c_kv[t]
            q = np.concatenate([q_nope[q0 : q0 + sq, head], q_rope[q0 : q0 + sq, head]], axis=1)
            scores = scale * (q @ k.T)  # (sq, sk)
            for i in range(sq):
                visible = np.arange(sk) <= i + sk - sq if causal else np.ones(sk, dtype=bool)
                if not visible.any():
                    continue
                logits = scores[i][visible]
                top = logits.max()
                e = np.exp(logits - top)
                out[q0 + i, head] = (e / e.sum()) @ v[visible]
                lse[head, q0 + i] = top + math.log(e.sum())
        q0, k0 = q0 + sq, k0 + sk
    return out, lse


@functools.lru_cache(maxsize=4)
def _weights(h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W_UK (h, 128, 512) and W_UV (h, 512, 128), N(0, 1/fan-in) so k_nope, v ~ N(0, 1); drawn once per h
    (16.8M fp64 normals for 128 heads take ~0.5 s).  Shared read-only: never modify them in a test."""
    gen = torch.Generator().manual_seed(1000 + h)
    w_uk = torch.randn(h, NOPE, LATENT, generator=gen, dtype=torch.float64) / math.sqrt(LATENT)
    w_uv = torch.randn(h, LATENT, VDIM, generator=gen, dtype=torch.float64) / math.sqrt(LATENT)
    return w_uk, w_uv


def _draw(gen: torch.Generator, lens: list[tuple[int, int]], h: int) -> dict[str, torch.Tensor]:
    """fp64 MLA tensors: activations N(0, 1) from ``gen``, the projections of :func:`_weights`."""
    n, s = sum(sq for sq, _ in lens), sum(sk for _, sk in lens)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    w_uk, w_uv = _weights(h)
    return {
        "q_nope": randn(n, h, NOPE),
        "q_rope": randn(n, h, ROPE),
        "c_kv": randn(s, LATENT),
        "k_rope": randn(s, ROPE),
        "w_uk": w_uk,
        "w_uv": w_uv,
    }


def _oracle(t: dict[str, torch.Tensor], lens: list[tuple[int, int]], causal: bool, scale: float = DEEPSEEK_SCALE):
    arrays = {name: x.numpy() for name, x in t.items()}
    return unabsorbed_mla(**arrays, lens=lens, scale=scale, causal=causal)


def _absorb(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """qv[n, h] = q_nope[n, h] @ W_UK[h]: (n, h, 128) -> (n, h, 512), so qv . c_kv = q_nope . (W_UK c_kv)."""
    return torch.einsum("nhp,hpl->nhl", q_nope, w_uk)


def _unabsorb(latent_out: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """out[n, h] = latent_out[n, h] @ W_UV[h]: (n, h, 512) -> (n, h, 128), in fp64."""
    return torch.einsum("nhl,hlv->nhv", latent_out.to(torch.float64), w_uv)


def _rounded(t: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Activations rounded to ``dtype`` (kept fp64), so the oracle and the reference see equal inputs."""
    return {k: (x if k.startswith("w_") else x.to(dtype).to(torch.float64)) for k, x in t.items()}


def _assert_close(got: torch.Tensor, want: torch.Tensor | np.ndarray, dtype: torch.dtype, what: str) -> None:
    rtol, atol = TOL[dtype]
    want = torch.as_tensor(want, dtype=torch.float64)
    torch.testing.assert_close(got.to(torch.float64), want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


# --- the oracle pinned by hand ---------------------------------------------------------------------


def test_oracle_single_key_returns_its_up_projected_value() -> None:
    gen = torch.Generator().manual_seed(1)
    t = _draw(gen, [(1, 1)], 3)
    out, lse = _oracle(t, [(1, 1)], causal=False)
    c, w_uk, w_uv = t["c_kv"][0].numpy(), t["w_uk"].numpy(), t["w_uv"].numpy()
    for head in range(3):
        np.testing.assert_allclose(out[0, head], w_uv[head].T @ c, rtol=1e-13, atol=1e-13)
        score = t["q_nope"][0, head].numpy() @ (w_uk[head] @ c) + t["q_rope"][0, head].numpy() @ t["k_rope"][0].numpy()
        assert lse[head, 0] == pytest.approx(DEEPSEEK_SCALE * score, rel=1e-13, abs=1e-13)


def test_oracle_zero_query_averages_the_visible_values() -> None:
    """q = 0: uniform weights over the visible keys; causal bottom-right row i of (3, 5) sees i + 3 keys."""
    gen = torch.Generator().manual_seed(2)
    t = _draw(gen, [(3, 5)], 2)
    t["q_nope"].zero_()
    t["q_rope"].zero_()
    out, lse = _oracle(t, [(3, 5)], causal=True)
    for head in range(2):
        v = t["c_kv"].numpy() @ t["w_uv"][head].numpy()
        for i in range(3):
            np.testing.assert_allclose(out[i, head], v[: i + 3].mean(0), rtol=1e-13, atol=1e-13)
            assert lse[head, i] == pytest.approx(math.log(i + 3), rel=1e-14)


# --- absorbed (attnref) == unabsorbed (oracle) -----------------------------------------------------

CASES = [
    pytest.param([(1, 37), (1, 5), (1, 64)], 16, False, id="decode-h16"),
    pytest.param([(4, 9), (4, 40), (4, 4)], 16, True, id="spec-decode-h16"),
    pytest.param([(13, 13), (7, 7)], 16, True, id="prefill-h16"),
    pytest.param([(6, 20), (1, 11), (9, 9)], 16, True, id="mixed-varlen-h16"),
    pytest.param([(1, 33), (1, 12)], 128, False, id="decode-h128"),
    pytest.param([(4, 20), (4, 7)], 128, True, id="spec-decode-h128"),
]
NUMERICS = [pytest.param(FP64, id="fp64"), pytest.param(FP32, id="fp32")]


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("lens, h, causal", CASES)
def test_absorbed_qv_equals_unabsorbed_attention(lens, h, causal, numerics) -> None:
    dtype = numerics.dtype
    t = _rounded(_draw(torch.Generator().manual_seed(h + len(lens)), lens, h), dtype)
    want_out, want_lse = _oracle(t, lens, causal)

    qv = _absorb(t["q_nope"], t["w_uk"]).to(dtype)
    got = attention_varlen(
        t["q_rope"].to(dtype),
        t["k_rope"][:, None].to(dtype),  # one latent kv head
        t["c_kv"][:, None].to(dtype),
        cu([sq for sq, _ in lens]),
        cu([sk for _, sk in lens]),
        qv=qv,
        options=AttnOptions(scale=DEEPSEEK_SCALE, causal=causal),
        numerics=numerics,
    )
    assert got.out.shape == (qv.shape[0], h, LATENT) and got.lse.shape == (h, qv.shape[0])
    _assert_close(_unabsorb(got.out, t["w_uv"]), want_out, dtype, "out @ W_UV")
    _assert_close(got.lse, want_lse, dtype, "lse")


@pytest.mark.parametrize("numerics", NUMERICS)
def test_576_spellings_equal_unabsorbed_attention(numerics) -> None:
    """The whole chain: [q_nope @ W_UK | q_rope] against a [c_kv | k_rope] cache, contiguous and paged."""
    lens = [(4, 37), (1, 9), (4, 4)]
    h, dtype = 16, numerics.dtype
    t = _rounded(_draw(torch.Generator().manual_seed(7), lens, h), dtype)
    want_out, want_lse = _oracle(t, lens, causal=True)
    q = join_latent(_absorb(t["q_nope"], t["w_uk"]), t["q_rope"]).to(dtype)
    kv = join_latent(t["c_kv"], t["k_rope"])[:, None].to(dtype)
    cu_q, cu_k = cu([sq for sq, _ in lens]), cu([sk for _, sk in lens])
    opts = AttnOptions(scale=DEEPSEEK_SCALE, causal=True)

    contiguous = attention_mla_varlen(q, kv, cu_q, cu_k, options=opts, numerics=numerics)
    kv_seqs = [kv[cu_k[b] : cu_k[b + 1]] for b in range(len(lens))]
    cache, _, table = build_paged_cache(kv_seqs, [x[..., :1] for x in kv_seqs], 16, "NHD", torch.Generator())
    seqused = torch.tensor([sk for _, sk in lens], dtype=torch.int32)
    paged = attention_mla_paged(q, cache, table, seqused, cu_q, options=opts, numerics=numerics)
    for name, res in (("varlen", contiguous), ("paged", paged)):
        _assert_close(_unabsorb(res.out, t["w_uv"]), want_out, dtype, f"{name} out @ W_UV")
        _assert_close(res.lse, want_lse, dtype, f"{name} lse")


# --- spellings of the same computation -------------------------------------------------------------

SPELL_LENS = [(1, 37), (4, 64), (2, 1), (1, 130), (3, 0)]


def _spell_inputs(seed: int, lens: list[tuple[int, int]], h: int = 8, dtype: torch.dtype = torch.float64):
    gen = torch.Generator().manual_seed(seed)
    n, s = sum(sq for sq, _ in lens), sum(sk for _, sk in lens)
    q = torch.randn(n, h, LATENT + ROPE, generator=gen, dtype=torch.float64).to(dtype)
    kv = torch.randn(s, 1, LATENT + ROPE, generator=gen, dtype=torch.float64).to(dtype)
    return q, kv, cu([sq for sq, _ in lens]), cu([sk for _, sk in lens])


@pytest.mark.parametrize("numerics", NUMERICS)
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_mla_varlen_is_attention_varlen_with_qv(causal, numerics) -> None:
    q, kv, cu_q, cu_k = _spell_inputs(11, SPELL_LENS, dtype=numerics.dtype)
    opts = AttnOptions(causal=causal)
    got = attention_mla_varlen(q, kv, cu_q, cu_k, options=opts, numerics=numerics)
    want = attention_varlen(
        q[..., LATENT:].contiguous(),
        kv[..., LATENT:].contiguous(),
        kv[..., :LATENT].contiguous(),
        cu_q,
        cu_k,
        qv=q[..., :LATENT].contiguous(),
        options=opts,
        numerics=numerics,
    )
    assert torch.equal(got.out, want.out) and torch.equal(got.lse, want.lse)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_mla_paged_equals_mla_varlen(block_size, layout) -> None:
    """Permuted block table, garbage in unused slots and spare blocks, an empty sequence, causal."""
    q, kv, cu_q, cu_k = _spell_inputs(12, SPELL_LENS)
    kv_seqs = [kv[cu_k[b] : cu_k[b + 1]] for b in range(len(SPELL_LENS))]
    gen = torch.Generator().manual_seed(block_size)
    cache, _, table = build_paged_cache(kv_seqs, [x[..., :1] for x in kv_seqs], block_size, layout, gen)
    seqused = torch.tensor([sk for _, sk in SPELL_LENS], dtype=torch.int32)
    opts = AttnOptions(causal=True)
    got = attention_mla_paged(q, cache, table, seqused, cu_q, layout=layout, options=opts, numerics=FP64)
    want = attention_mla_varlen(q, kv, cu_q, cu_k, options=opts, numerics=FP64)
    torch.testing.assert_close(got.out, want.out, rtol=0, atol=1e-12)
    torch.testing.assert_close(got.lse, want.lse, rtol=0, atol=1e-12)
    assert torch.isneginf(got.lse[:, -3:]).all() and not got.out[-3:].any(), "the empty sequence sees nothing"


def test_flashmla_batch_layout_reshapes_to_varlen() -> None:
    """FlashMLA's q (b, s_q, h, 576) is varlen q with cu_seqlens_q = [0, s_q, 2 s_q, ...]."""
    b, s_q, h = 3, 2, 4
    gen = torch.Generator().manual_seed(5)
    q4 = torch.randn(b, s_q, h, LATENT + ROPE, generator=gen, dtype=torch.float64)
    lens = [17, 64, 3]
    kv_seqs = [torch.randn(n, 1, LATENT + ROPE, generator=gen, dtype=torch.float64) for n in lens]
    cache, _, table = build_paged_cache(kv_seqs, [x[..., :1] for x in kv_seqs], 64, "NHD", gen)
    got = attention_mla_paged(
        q4.reshape(b * s_q, h, -1),
        cache,
        table,
        torch.tensor(lens, dtype=torch.int32),
        torch.arange(b + 1, dtype=torch.int32) * s_q,
        options=AttnOptions(causal=True),
        numerics=FP64,
    )
    for i in range(b):
        one = attention_mla_varlen(
            q4[i], kv_seqs[i], cu([s_q]), cu([lens[i]]), options=AttnOptions(causal=True), numerics=FP64
        )
        torch.testing.assert_close(got.out[i * s_q : (i + 1) * s_q], one.out, rtol=0, atol=1e-12)


def test_default_scale_is_one_over_sqrt_latent_plus_rope() -> None:
    """1/sqrt(64 + 512) = 1/sqrt(576) falls out of the qv rule 1/sqrt(d + dv); not 1/sqrt(64), not 1/sqrt(192)."""
    q, kv, cu_q, cu_k = _spell_inputs(13, SPELL_LENS)
    seqused = torch.tensor([sk for _, sk in SPELL_LENS], dtype=torch.int32)
    kv_seqs = [kv[cu_k[b] : cu_k[b + 1]] for b in range(len(SPELL_LENS))]
    cache, _, table = build_paged_cache(kv_seqs, [x[..., :1] for x in kv_seqs], 16, "NHD", torch.Generator())

    def varlen(scale):
        return attention_mla_varlen(q, kv, cu_q, cu_k, options=AttnOptions(scale=scale), numerics=FP64)

    def paged(scale):
        return attention_mla_paged(q, cache, table, seqused, cu_q, options=AttnOptions(scale=scale), numerics=FP64)

    for run in (varlen, paged):
        default = run(None)
        explicit = run(1.0 / math.sqrt(576))
        assert torch.equal(default.out, explicit.out) and torch.equal(default.lse, explicit.lse), run.__name__
        for wrong in (1.0 / math.sqrt(64), 1.0 / math.sqrt(192), 1.0 / math.sqrt(512)):
            assert (run(wrong).out - default.out).abs().max() > 0.05, (run.__name__, wrong)


def test_default_scale_follows_other_widths() -> None:
    gen = torch.Generator().manual_seed(14)
    q = torch.randn(3, 2, 40, generator=gen, dtype=torch.float64)
    kv = torch.randn(9, 1, 40, generator=gen, dtype=torch.float64)
    cu_q, cu_k = cu([3]), cu([9])
    default = attention_mla_varlen(q, kv, cu_q, cu_k, latent_dim=32, rope_dim=8, numerics=FP64)
    explicit = attention_mla_varlen(
        q, kv, cu_q, cu_k, latent_dim=32, rope_dim=8, options=AttnOptions(scale=1 / math.sqrt(40)), numerics=FP64
    )
    assert default.out.shape == (3, 2, 32)
    assert torch.equal(default.out, explicit.out) and torch.equal(default.lse, explicit.lse)


# --- what goes wrong when the halves are mixed up --------------------------------------------------


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_rope_nope_order_matters() -> None:
    """[q_rope | q_nope] against a [c_kv | k_rope] cache (or the cache swapped) is a different attention."""
    lens = [(1, 37), (4, 64)]
    q, kv, cu_q, cu_k = _spell_inputs(21, lens)
    right = attention_mla_varlen(q, kv, cu_q, cu_k, options=AttnOptions(causal=True), numerics=FP64)
    q_nope, q_rope = split_latent(q, LATENT)
    c_kv, k_rope = split_latent(kv, LATENT)
    q_swapped = torch.cat([q_rope, q_nope], -1)
    kv_swapped = torch.cat([k_rope, c_kv], -1)
    wrong_q = attention_mla_varlen(q_swapped, kv, cu_q, cu_k, options=AttnOptions(causal=True), numerics=FP64)
    assert _rel(wrong_q.out, right.out) > 0.3 and (wrong_q.lse - right.lse).abs().max() > 0.5
    # the cache swapped as well: V is now [k_rope | c_kv[:448]], a different output altogether
    both = attention_mla_varlen(q_swapped, kv_swapped, cu_q, cu_k, options=AttnOptions(causal=True), numerics=FP64)
    assert _rel(both.out, right.out) > 0.3


def test_ignoring_qv_changes_the_answer() -> None:
    lens = [(1, 37), (4, 64)]
    q, kv, cu_q, cu_k = _spell_inputs(22, lens)
    c_kv, k_rope = split_latent(kv, LATENT)
    q_nope, q_rope = split_latent(q, LATENT)
    opts = AttnOptions(causal=True, scale=1 / math.sqrt(576))
    right = attention_varlen(q_rope, k_rope, c_kv, cu_q, cu_k, qv=q_nope, options=opts, numerics=FP64)
    zero_qv = attention_varlen(
        q_rope, k_rope, c_kv, cu_q, cu_k, qv=torch.zeros_like(q_nope), options=opts, numerics=FP64
    )
    no_qv = attention_varlen(q_rope, k_rope, c_kv, cu_q, cu_k, options=opts, numerics=FP64)
    zero_nope = attention_mla_varlen(
        join_latent(torch.zeros_like(q_nope), q_rope), kv, cu_q, cu_k, options=opts, numerics=FP64
    )
    # with an explicit scale a zero qv is no qv (up to the summation order of a 576- vs 64-long dot product)
    torch.testing.assert_close(zero_qv.out, no_qv.out, rtol=0, atol=1e-12)
    torch.testing.assert_close(zero_nope.out, no_qv.out, rtol=0, atol=1e-12)
    assert _rel(zero_qv.out, right.out) > 0.3 and (zero_qv.lse - right.lse).abs().max() > 0.5


# --- split_latent / join_latent ----------------------------------------------------------------------


def test_split_latent_returns_views_and_join_inverts_it() -> None:
    x = torch.randn(4, 2, 1, 576)
    latent, rope = split_latent(x, 512, 64, name="kv_cache")
    assert latent.shape == (4, 2, 1, 512) and rope.shape == (4, 2, 1, 64)
    assert latent.data_ptr() == x.data_ptr() and rope.data_ptr() == x[..., 512:].data_ptr()
    rope[0, 0, 0, 0] = 123.0
    assert x[0, 0, 0, 512] == 123.0, "split_latent must return views"
    assert torch.equal(join_latent(latent, rope), x)
    latent2, rope2 = split_latent(x, 500)  # rope_dim None: whatever follows
    assert latent2.shape[-1] == 500 and rope2.shape[-1] == 76


# --- every ValueError names its argument ---------------------------------------------------------------


def _mla_varlen(**over):
    args = {
        "q": torch.randn(5, 4, 576),
        "kv": torch.randn(7, 1, 576),
        "cu_seqlens_q": torch.tensor([0, 1, 5], dtype=torch.int32),
        "cu_seqlens_k": torch.tensor([0, 3, 7], dtype=torch.int32),
    }
    args.update(over)
    return attention_mla_varlen(**args)


def _mla_paged(**over):
    layout = over.get("layout", "NHD")
    cache = torch.randn(4, 16, 1, 576)
    args = {
        "q": torch.randn(3, 4, 576),
        "kv_cache": cache if layout == "NHD" else cache.transpose(1, 2),
        "block_table": torch.tensor([[2, 0], [1, 3]], dtype=torch.int32),
        "seqused_k": torch.tensor([20, 5], dtype=torch.int32),
        "cu_seqlens_q": torch.tensor([0, 1, 3], dtype=torch.int32),
    }
    args.update(over)
    return attention_mla_paged(**args)


def test_base_calls_are_valid() -> None:
    assert _mla_varlen().out.shape == (5, 4, 512)
    assert _mla_paged().out.shape == (3, 4, 512)
    assert _mla_paged(layout="HND").out.shape == (3, 4, 512)


WIDTH = r"latent_dim \+ rope_dim = 512 \+ 64 = 576, got"


@pytest.mark.parametrize(
    "over, match",
    [
        ({"kv": torch.randn(7, 1, 544)}, rf"^kv last dim must be {WIDTH} 544"),
        ({"q": torch.randn(5, 4, 640)}, rf"^q last dim must be {WIDTH} 640"),
        ({"q": torch.randn(5, 4, 512)}, rf"^q last dim must be {WIDTH} 512"),
        ({"latent_dim": 448}, r"^q last dim must be latent_dim \+ rope_dim = 448 \+ 64 = 512, got 576"),
        ({"kv": torch.randn(7, 2, 576)}, r"^kv must have 1 kv head \(MLA caches a single latent head"),
        ({"kv": torch.randn(7, 576)}, r"^kv must have 3 dims \(total_k, 1, latent_dim \+ rope_dim = 576\)"),
        ({"q": torch.randn(1, 5, 4, 576)}, r"^q must have 3 dims \(total_q, heads"),
        ({"q": torch.randn(5, 0, 576)}, r"^q must have at least one head"),
        ({"q": [[1.0]]}, r"^q must be a torch.Tensor"),
        ({"kv": torch.randn(7, 1, 576, dtype=torch.float64)}, r"^kv must have q's dtype torch.float32"),
        ({"latent_dim": 0}, r"^latent_dim must be a positive int, got 0"),
        ({"latent_dim": True}, r"^latent_dim must be a positive int, got True"),
        ({"rope_dim": -64}, r"^rope_dim must be a positive int, got -64"),
        ({"cu_seqlens_k": torch.tensor([0, 3, 8], dtype=torch.int32)}, r"^cu_seqlens_k\[-1\] must equal"),
    ],
)
def test_mla_varlen_errors(over, match) -> None:
    with pytest.raises(ValueError, match=match):
        _mla_varlen(**over)


@pytest.mark.parametrize(
    "over, match",
    [
        ({"kv_cache": torch.randn(4, 16, 1, 544)}, rf"^kv_cache last dim must be {WIDTH} 544"),
        ({"q": torch.randn(3, 4, 544)}, rf"^q last dim must be {WIDTH} 544"),
        ({"kv_cache": torch.randn(4, 16, 2, 576)}, r"^kv_cache must have 1 kv head .* got 2 in layout NHD"),
        (
            {"kv_cache": torch.randn(4, 2, 16, 576), "layout": "HND"},
            r"^kv_cache must have 1 kv head .* got 2 in layout HND",
        ),
        ({"kv_cache": torch.randn(4, 16, 576)}, r"^kv_cache must have 4 dims \(num_blocks, block_size, 1, "),
        ({"layout": "NDH"}, r"^layout must be 'NHD' or 'HND'"),
        ({"kv_cache": torch.randn(4, 16, 1, 576, dtype=torch.float64)}, r"^kv_cache must have q's dtype"),
        ({"rope_dim": 0}, r"^rope_dim must be a positive int, got 0"),
        ({"seqused_k": torch.tensor([20, 40], dtype=torch.int32)}, r"^seqused_k\[1\] = 40 needs 3 blocks"),
        ({"block_table": torch.tensor([[2, 9], [1, 3]], dtype=torch.int32)}, r"^block_table\[0, 1\] = 9 is outside"),
    ],
)
def test_mla_paged_errors(over, match) -> None:
    with pytest.raises(ValueError, match=match):
        _mla_paged(**over)


def _qv_varlen(qv):
    q = torch.randn(5, 4, 64)
    return attention_varlen(
        q,
        torch.randn(7, 1, 64),
        torch.randn(7, 1, 512),
        torch.tensor([0, 1, 5], dtype=torch.int32),
        torch.tensor([0, 3, 7], dtype=torch.int32),
        qv=qv,
    )


@pytest.mark.parametrize(
    "qv, match",
    [
        (torch.randn(5, 4, 511), r"^qv must have shape \(5, 4, 512\) \(q's tokens and heads, V's head dim 512\)"),
        (torch.randn(5, 4, 64), r"^qv must have shape \(5, 4, 512\)"),  # q's width, not V's
        (torch.randn(5, 2, 512), r"^qv must have shape \(5, 4, 512\)"),
        (torch.randn(4, 4, 512), r"^qv must have shape \(5, 4, 512\)"),
        (torch.randn(5, 4, 512, dtype=torch.float64), r"^qv must have q's dtype torch.float32, got torch.float64"),
        (torch.randn(5, 4, 512, device="meta"), r"^qv must be on q's device cpu, got meta"),
        (np.zeros((5, 4, 512), dtype=np.float32), r"^qv must be a torch.Tensor or None, got ndarray"),
    ],
)
def test_qv_errors_in_attention_varlen(qv, match) -> None:
    _qv_varlen(torch.randn(5, 4, 512))  # the base call is valid
    with pytest.raises(ValueError, match=match):
        _qv_varlen(qv)


def test_qv_errors_in_paged_and_padded() -> None:
    q = torch.randn(3, 4, 64)
    k_cache, v_cache = torch.randn(4, 16, 1, 64), torch.randn(4, 16, 1, 512)
    meta = (torch.tensor([[2, 0], [1, 3]], dtype=torch.int32), torch.tensor([20, 5]), torch.tensor([0, 1, 3]))
    attention_paged(q, k_cache, v_cache, *meta, qv=torch.randn(3, 4, 512))
    with pytest.raises(ValueError, match=r"^qv must have shape \(3, 4, 512\)"):
        attention_paged(q, k_cache, v_cache, *meta, qv=torch.randn(3, 4, 64))
    qp, kp, vp = torch.randn(2, 3, 4, 64), torch.randn(2, 9, 1, 64), torch.randn(2, 9, 1, 512)
    attention_padded(qp, kp, vp, qv=torch.randn(2, 3, 4, 512))
    with pytest.raises(ValueError, match=r"^qv must have q's dtype"):
        attention_padded(qp, kp, vp, qv=torch.randn(2, 3, 4, 512, dtype=torch.float64))


@pytest.mark.parametrize(
    "args, match",
    [
        ((torch.randn(3, 544), 512, 64, "kv_cache"), rf"^kv_cache last dim must be {WIDTH} 544"),
        ((torch.randn(3, 512), 512, None, "q"), r"^q last dim must be > latent_dim = 512 \(the rope part follows"),
        ((torch.randn(3, 100), 512, None, "x"), r"^x last dim must be > latent_dim = 512"),
        ((torch.randn(3, 576), 0, 64, "x"), r"^latent_dim must be a positive int, got 0"),
        ((torch.randn(3, 576), 512, 0, "x"), r"^rope_dim must be a positive int, got 0"),
        ((torch.tensor(1.0), 512, 64, "kv"), r"^kv must have at least one dim"),
        (([1.0] * 576, 512, 64, "kv"), r"^kv must be a torch.Tensor, got list"),
    ],
)
def test_split_latent_errors(args, match) -> None:
    with pytest.raises(ValueError, match=match):
        split_latent(*args)


@pytest.mark.parametrize(
    "latent, rope, match",
    [
        (torch.randn(3, 2, 512), torch.randn(3, 1, 64), r"^rope must have latent's leading dims \(3, 2\)"),
        (torch.randn(3, 512), torch.randn(3, 64, dtype=torch.float64), r"^rope must have latent's dtype"),
        (torch.randn(3, 512), torch.randn(3, 64, device="meta"), r"^rope must be on latent's device cpu"),
        (torch.randn(3, 0), torch.randn(3, 64), r"^latent and rope last dims must be positive, got 0 and 64"),
        ("c_kv", torch.randn(3, 64), r"^latent must be a torch.Tensor, got str"),
        (torch.randn(3, 512), None, r"^rope must be a torch.Tensor, got NoneType"),
    ],
)
def test_join_latent_errors(latent, rope, match) -> None:
    with pytest.raises(ValueError, match=match):
        join_latent(latent, rope)
