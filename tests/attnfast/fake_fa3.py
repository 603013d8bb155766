"""A fake ``flash_attn_interface`` (FA3) for CPU tests, and the helpers the adapter tests share.

FA3 cannot be installed on the machines these tests were written on, so :func:`make_fake_fa3`
builds a module with FA3's two entry points, their exact signatures (an adapter passing a keyword
FA3 does not have fails with ``TypeError``), a few of FA3's argument checks, and results computed by
:mod:`attnref` from the *arguments received* (not from the case), in FA3's conventions:

* outputs in q's layout (packed with ``cu_seqlens_q``, else padded); LSE ``(h, total_q)`` or
  ``(b, h, sq)``; ``-inf`` for a row that saw no key, ``+inf`` everywhere when ``total_k == 0``;
* ``flash_attn_with_kvcache`` writes ``k``/``v`` into the cache in place at ``cache_seqlens``
  (through ``page_table`` when paged) and attends to ``cache_seqlens + new`` keys; with ``cu_seqlens_k_new`` the
  new keys are packed ``(total_k_new, h_k, d)``, each sequence its own count (``hopper/flash_api.cpp``);
* every call is appended to ``module.calls`` as ``(name, arguments)``.

The sequence helpers (:func:`options_from_fa`, :func:`kvcache_sequences`, :func:`attend_sequences`,
:func:`fa2_convention_lse`) also back the FA2/FA4/torch-flash fakes in the other test files;
:func:`assert_matches_reference` is the one comparison every adapter test uses.
"""

from __future__ import annotations

import math
import types

import torch

from attnfast._fa_common import fa2_alibi_uses_causal_form
from attnfast.base import KernelOutput
from attnref import AttnOptions, AttnResult, Window, attention_varlen, window_from_fa2
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.verdict.reference import reference


def fa_case(requests, **kw) -> AttentionCase:
    """A small GQA case (4 query heads, 2 kv heads, d 64) for the FA-family adapter tests; ``kw`` overrides."""
    base = dict(num_heads=4, num_kv_heads=2, head_dim=64)
    base.update(kw)
    return AttentionCase(requests=tuple(requests), **base)


def options_from_fa(causal: bool, window_size, softcap: float, scale: float | None, chunk: int = 0) -> AttnOptions:
    """AttnOptions from FA2/FA3-spelled arguments (``-1`` = unbounded, 0 = off)."""
    window = window_from_fa2(*window_size)
    if causal:
        window = Window(window.left, None)
    return AttnOptions(causal=causal, window=window, softcap=softcap or None, scale=scale, chunk=chunk or None)


def attend_sequences(
    q, cu_q: list[int], keys: list, values: list, options: AttnOptions, alibi=None, sinks=None
) -> AttnResult:
    """Reference attention of packed queries against per-sequence key lists."""
    lens = [int(k.shape[0]) for k in keys]
    cu_k = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    k = torch.cat(keys) if keys else q.new_zeros(0, 1, q.shape[-1])
    v = torch.cat(values)
    cu_q_t = torch.tensor(cu_q, dtype=torch.int32)
    return attention_varlen(q, k, v, cu_q_t, cu_k, options=options, alibi_slopes=alibi, sinks=sinks)


def fa2_convention_lse(lse, cu_q: list[int], kv_lens: list[int], alibi, causal: bool, window, seqlen_k: int):
    """A reference LSE in FA2's convention: ``+inf`` for rows without keys, ALiBi in FA2's causal
    form (``+slope * j``, an LSE larger by ``slope * (i + sk - sq)``) when FA2 takes its causal path."""
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse.float())
    if alibi is not None and fa2_alibi_uses_causal_form(causal, tuple(window), seqlen_k):
        for b, sk in enumerate(kv_lens):
            sq = cu_q[b + 1] - cu_q[b]
            pos = torch.arange(sq, dtype=torch.float32) + (sk - sq)
            lse[:, cu_q[b] : cu_q[b + 1]] += alibi.float()[:, None] * pos[None, :]
    return lse


def _check_int32(name: str, t) -> None:
    if t is not None and t.dtype != torch.int32:
        raise RuntimeError(f"{name} must have dtype torch.int32, got {t.dtype}")


def kvcache_sequences(k_cache, v_cache, cache_seqlens, page_table, k_new: list, v_new: list) -> tuple[list, list]:
    """Write each sequence's new keys at ``cache_seqlens[b]`` (in place), return its keys and values.

    ``k_cache`` is ``(num_pages, page, hk, d)`` with ``page_table``, else ``(b, width, hk, d)``.
    """
    _check_int32("cache_seqlens", cache_seqlens)
    _check_int32("page_table", page_table)
    keys, values = [], []
    for b, n_old in enumerate(cache_seqlens.tolist()):
        n_new = int(k_new[b].shape[0]) if k_new else 0
        pos = torch.arange(n_old + n_new)
        if page_table is not None:
            page = k_cache.shape[1]
            blocks, offs = page_table[b].long()[pos // page], pos % page
        else:
            blocks, offs = torch.full_like(pos, b), pos
        if n_new:
            k_cache[blocks[n_old:], offs[n_old:]] = k_new[b].to(k_cache.dtype)
            v_cache[blocks[n_old:], offs[n_old:]] = v_new[b].to(v_cache.dtype)
        keys.append(k_cache[blocks, offs])
        values.append(v_cache[blocks, offs])
    return keys, values


def _split(t, cu: list[int]) -> list:
    return [t[cu[i] : cu[i + 1]] for i in range(len(cu) - 1)]


def make_fake_fa3() -> types.ModuleType:
    """A fresh fake ``flash_attn_interface`` module (see the module docstring)."""
    mod = types.ModuleType("flash_attn_interface")
    mod.calls = []

    def flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        seqused_q=None,
        seqused_k=None,
        softmax_scale=None,
        causal=False,
        qv=None,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        window_size=(-1, -1),
        attention_chunk=0,
        softcap=0.0,
        num_splits=1,
        pack_gqa=None,
        deterministic=False,
        sm_margin=0,
        return_attn_probs=False,
    ):
        mod.calls.append(("flash_attn_varlen_func", dict(locals())))
        _check_int32("cu_seqlens_q", cu_seqlens_q)
        _check_int32("cu_seqlens_k", cu_seqlens_k)
        cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        if max(b - a for a, b in zip(cu_q, cu_q[1:])) > max_seqlen_q:
            raise RuntimeError("max_seqlen_q is smaller than a sequence")
        opts = options_from_fa(causal, window_size, softcap, softmax_scale, attention_chunk)
        res = attend_sequences(q, cu_q, _split(k, cu_k), _split(v, cu_k), opts)
        lse = res.lse.float()
        if k.shape[0] == 0 and q.shape[0] > 0:
            lse.fill_(math.inf)  # flash_api.cpp: no key in the whole batch
        out = res.out.to(q.dtype)
        return (out, lse) if return_attn_probs else out

    def flash_attn_with_kvcache(
        q,
        k_cache,
        v_cache,
        k=None,
        v=None,
        qv=None,
        rotary_cos=None,
        rotary_sin=None,
        cache_seqlens=None,
        cache_batch_idx=None,
        cache_leftpad=None,
        page_table=None,
        cu_seqlens_q=None,
        cu_seqlens_k_new=None,
        max_seqlen_q=None,
        rotary_seqlens=None,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        attention_chunk=0,
        softcap=0.0,
        rotary_interleaved=True,
        scheduler_metadata=None,
        num_splits=0,
        pack_gqa=None,
        sm_margin=0,
        return_softmax_lse=False,
    ):
        mod.calls.append(("flash_attn_with_kvcache", dict(locals())))
        if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
            raise AssertionError("k_cache must have contiguous last dimension")
        varlen = cu_seqlens_q is not None
        if varlen:
            _check_int32("cu_seqlens_q", cu_seqlens_q)
            if max_seqlen_q is None:
                raise RuntimeError("max_seqlen_q must be provided if cu_seqlens_q is provided")
            cu_q = cu_seqlens_q.tolist()
            q_packed = q
        else:
            b, sq = q.shape[:2]
            cu_q = [i * sq for i in range(b + 1)]
            q_packed = q.reshape(b * sq, *q.shape[2:])
        batch = len(cu_q) - 1
        if k is not None:
            seqlen_k = k_cache.shape[1] * (page_table.shape[1] if page_table is not None else 1)
            if (max_seqlen_q if varlen else q.shape[1]) > seqlen_k:  # flash_api.cpp: seqlen_q <= seqlen_k
                raise RuntimeError("If k_new is supplied, it must have seqlen <= the seqlen of the KV cache")
            if cu_seqlens_k_new is not None:  # k/v (total_k_new, h_k, d), each sequence its own count of new keys
                _check_int32("cu_seqlens_k_new", cu_seqlens_k_new)
                if tuple(cu_seqlens_k_new.shape) != (batch + 1,):  # flash_api.cpp: CHECK_SHAPE(cu_seqlens_k_new, b + 1)
                    raise RuntimeError("cu_seqlens_k_new must have shape (batch_size + 1)")
                total = int(cu_seqlens_k_new[-1])
                if k.dim() != 3 or v.dim() != 3 or not total == k.shape[0] == v.shape[0]:
                    raise RuntimeError("k_new must have shape (total_k_new, h_k, d) with cu_seqlens_k_new")
                k_new, v_new = _split(k, cu_seqlens_k_new.tolist()), _split(v, cu_seqlens_k_new.tolist())
            else:
                k_new, v_new = list(k), list(v)
        else:
            k_new, v_new = [], []
        if page_table is None and k_cache.shape[0] != batch:
            raise RuntimeError("batch_size must be equal to batch_size_k")
        keys, values = kvcache_sequences(k_cache, v_cache, cache_seqlens, page_table, k_new, v_new)
        opts = options_from_fa(causal, window_size, softcap, softmax_scale, attention_chunk)
        res = attend_sequences(q_packed, cu_q, keys, values, opts)
        out, lse = res.out.to(q.dtype), res.lse.float()
        if not varlen:
            out = out.reshape(q.shape[:-1] + (out.shape[-1],))
            lse = lse.reshape(lse.shape[0], batch, -1).permute(1, 0, 2).contiguous()
        return (out, lse, torch.empty(0), torch.empty(0)) if return_softmax_lse else out

    mod.flash_attn_varlen_func = flash_attn_varlen_func
    mod.flash_attn_with_kvcache = flash_attn_with_kvcache
    return mod


def _locate(case: AttentionCase, token: int) -> str:
    cu = 0
    for b, (ql, kl) in enumerate(case.requests):
        if token < cu + ql:
            return f"request {b} (q_len {ql}, kv_len {kl}) row {token - cu}"
        cu += ql
    return f"token {token}"


def assert_matches_reference(
    case: AttentionCase,
    inputs: CaseInputs,
    got: KernelOutput,
    *,
    atol: float = 2e-2,
    rtol: float = 2e-2,
    lse_atol: float = 1e-2,
    lse_rtol: float = 1e-3,
    expect_lse: bool = True,
    label: str = "",
) -> None:
    """Assert ``got`` equals the fp32 reference of ``case`` (out by atol + rtol*|ref|, LSE likewise).

    The message names the worst element (request, row, head) and the case, so a GPU failure reads
    without a debugger.  Fully masked rows must carry the same ``-inf`` (or sink) LSE.
    """
    ref = reference(case, inputs)
    where = f"{label + ': ' if label else ''}{case.id} [{case.summary()}]"
    assert tuple(got.out.shape) == tuple(ref.out.shape), (
        f"out shape {tuple(got.out.shape)} != {tuple(ref.out.shape)}; {where}"
    )
    out = got.out.float().to(ref.out.device)
    assert torch.isfinite(out).all(), (
        f"out has non-finite values at {torch.nonzero(~torch.isfinite(out))[:3].tolist()}; {where}"
    )
    excess = (out - ref.out).abs() - (atol + rtol * ref.out.abs())
    if excess.numel() and excess.max() > 0:
        t, h, _ = divmod_index(int(excess.argmax()), out.shape)
        err = float((out - ref.out).abs().max())
        raise AssertionError(
            f"out: max abs err {err:.3g} (worst at {_locate(case, t)} head {h}) exceeds atol {atol} "
            f"+ rtol {rtol}; {where}"
        )
    if not expect_lse:
        return
    assert got.lse is not None, f"lse is None but the kernel was asked for it; {where}"
    assert tuple(got.lse.shape) == tuple(ref.lse.shape), (
        f"lse shape {tuple(got.lse.shape)} != {tuple(ref.lse.shape)}; {where}"
    )
    lse = got.lse.float().to(ref.lse.device)
    ref_inf, got_inf = torch.isinf(ref.lse), torch.isinf(lse)
    if not torch.equal(ref_inf, got_inf) or not torch.equal(lse[ref_inf], ref.lse[ref_inf]):
        bad = torch.nonzero((ref_inf != got_inf) | (ref_inf & (lse != ref.lse)))[0].tolist()
        raise AssertionError(
            f"lse of fully masked rows differs: head {bad[0]} at {_locate(case, bad[1])}: kernel "
            f"{float(lse[bad[0], bad[1]])}, reference {float(ref.lse[bad[0], bad[1]])}; {where}"
        )
    fin = ~ref_inf
    if torch.isnan(lse).any():
        raise AssertionError(f"lse has NaN at {torch.nonzero(torch.isnan(lse))[:3].tolist()}; {where}")
    lexcess = ((lse - ref.lse).abs() - (lse_atol + lse_rtol * ref.lse.abs()))[fin]
    if lexcess.numel() and lexcess.max() > 0:
        diff = torch.where(fin, (lse - ref.lse).abs(), torch.zeros_like(lse))
        h, t = divmod(int(diff.argmax()), lse.shape[1])
        raise AssertionError(
            f"lse: max abs err {float(diff.max()):.3g} at head {h} {_locate(case, t)} "
            f"(kernel {float(lse[h, t]):.5g}, "
            f"reference {float(ref.lse[h, t]):.5g}) exceeds atol {lse_atol} + rtol {lse_rtol}; {where}"
        )


def divmod_index(flat: int, shape) -> tuple[int, ...]:
    """Multi-index of a flat index into ``shape`` (row-major)."""
    idx = []
    for size in reversed(tuple(shape)):
        flat, r = divmod(flat, size)
        idx.append(r)
    return tuple(reversed(idx))


def available_or_skip(backend):
    """The backend, or a pytest skip naming why it cannot run here (for the GPU fixtures)."""
    import pytest

    avail = backend.is_available()
    if not avail:
        pytest.skip(f"{backend.name} unavailable: {avail.reason}")
    return backend


def check_declared_case(backend, name: str, case: AttentionCase) -> None:
    """A case the backend declares supported runs on CUDA and matches the reference."""
    from conformance.cases.inputs import make_inputs

    support = backend.supports(case, "cuda")
    assert support, f"{name}: declared supported but refused: {support.reason}"
    inputs = make_inputs(case, seed=0, device="cuda")
    assert_matches_reference(case, inputs, backend.prepare(case, inputs)(), label=f"{backend.name} {name}")
