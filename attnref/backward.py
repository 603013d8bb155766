"""Reference gradients of attention: dQ, dK, dV and d(sinks) of a loss ``sum(out * dout)``.

The backward of the score pipeline of :mod:`attnref.core` (``../shared/SEMANTICS.md`` section 3), tiled like the
forward (query tiles x key tiles, at most ``numerics.max_tile_elems`` scores at once; key tiles no row of a query
tile sees are skipped), with the probabilities recomputed per tile from the saved LSE as flash kernels do::

    s_raw = scale * q.k;  t = tanh(s_raw / cap);  s = cap * t (soft-cap; s = s_raw without)
    s -> -inf where masked;  s -= slope * |i + sk - sq - j| (ALiBi, a constant in q and k)
    P = exp(s - lse)                        (lse includes the sink's exp when sinks are given)
    D_i = sum_c dO[i, c] * O[i, c]          (= sum_j P_ij dP_ij)
    dV = P^T dO;  dP = dO V^T;  dS = P * (dP - D)
    dS_raw = dS * (1 - t^2)                 (soft-cap derivative ds/ds_raw)
    dQ = scale * dS_raw K;  dK = scale * dS_raw^T Q (summed over the query heads of a GQA group, as dV)
    d sink_h = -sum_i P_sink[h, i] * D[h, i],  P_sink = exp(sink_h - lse)

A fully masked row (no visible key, ``sk == 0`` included) has ``O = 0``, so ``D = 0`` and it contributes nothing:
its dQ row is 0 and its sink gradient 0.

``operand_dtype`` (e.g. ``torch.bfloat16``) rounds P and dS_raw to that dtype before the matmuls that read them
(dV, dQ, dK), as a flash kernel's bf16/fp16 backward does, the accumulation staying in ``numerics.dtype``: the
same-precision baseline of the backward verdict.  ``softcap_arg_dtype`` (soft-cap only) forms the tanh's argument
in that dtype, ``t = tanh(r(r(s_raw) / cap))`` with ``r`` the rounding to it, the tanh and everything after it
staying in ``numerics.dtype`` (the baseline's model of a 16-bit kernel's approximate tanh).  ``alibi_dtype``
takes ALiBi as an adapter hands it to a kernel that reads a bias in that dtype (:func:`attnref.core.alibi_penalty`),
in the recomputed forward too.  Context parallelism
(``options.cp``) and MLA's ``qv`` have no backward here: they raise ``ValueError`` naming the argument.
"""

from __future__ import annotations

import math

import torch

from .core import alibi_penalty, attend_sequence, query_tiles, tile_shape
from .options import AttnOptions, Numerics
from .result import AttnGrads
from .validate import check_alibi, check_alibi_dtype, check_cu_seqlens, check_head_vector, check_qkv, check_seqlens
from .varlen import sequence_slopes, sequence_spans

__all__ = ["attend_sequence_backward", "attention_padded_backward", "attention_varlen_backward"]

_OPERAND_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_unsupported(
    options: AttnOptions, qv: object, operand_dtype: torch.dtype | None, softcap_arg_dtype: torch.dtype | None = None
) -> None:
    if options.cp is not None:
        raise ValueError("options.cp must be None: the backward reference has no context parallelism")
    if qv is not None:
        raise ValueError("qv must be None: the backward reference has no MLA-absorbed qv")
    if operand_dtype is not None and operand_dtype not in _OPERAND_DTYPES:
        raise ValueError(f"operand_dtype must be one of {_OPERAND_DTYPES} or None, got {operand_dtype!r}")
    if softcap_arg_dtype is not None and softcap_arg_dtype not in _OPERAND_DTYPES:
        raise ValueError(f"softcap_arg_dtype must be one of {_OPERAND_DTYPES} or None, got {softcap_arg_dtype!r}")


def _rounded(x: torch.Tensor, operand_dtype: torch.dtype | None) -> torch.Tensor:
    return x if operand_dtype is None else x.to(operand_dtype).to(x.dtype)


@torch.no_grad()
def attend_sequence_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    options: AttnOptions = AttnOptions(),
    *,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    numerics: Numerics = Numerics(),
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    operand_dtype: torch.dtype | None = None,
    softcap_arg_dtype: torch.dtype | None = None,
    qv: None = None,
    alibi_dtype: torch.dtype | None = None,
) -> AttnGrads:
    """Gradients of one sequence (all heads), no validation of shapes (callers validate).

    Args:
        q: (sq, h, d); k: (sk, hk, d); v: (sk, hk, dv); dout: (sq, h, dv).
        alibi_slopes: (h,) or None.  sinks: (h,) or None.
        out, lse: the forward's (sq, h, dv) and (h, sq); None (both) = run :func:`attnref.core.attend_sequence`.
        operand_dtype: round P and dS to this dtype before the matmuls (None = no rounding).
        softcap_arg_dtype: with a soft-cap, round ``s_raw`` and ``s_raw / cap`` to this dtype before the tanh (None =
            no rounding; no effect without a soft-cap).
        alibi_dtype: ALiBi as an adapter's row-shifted additive bias rounded to this dtype
            (:func:`attnref.core.alibi_penalty`), in the recomputed forward too; None = exact.

    Returns:
        ``AttnGrads(dq (sq, h, d), dk (sk, hk, d), dv (sk, hk, dv), dsinks (h,) or None)`` in ``numerics.dtype``.
    """
    _check_unsupported(options, qv, operand_dtype, softcap_arg_dtype)
    check_alibi_dtype(alibi_dtype)
    sq, h, d = q.shape
    sk, hk, dv = v.shape
    group = h // hk
    ct = numerics.dtype
    dev = q.device
    if (out is None) != (lse is None):
        raise ValueError("out and lse must be given together (or both None: the forward is recomputed)")
    if out is None or lse is None:  # both None (checked above)
        out, lse = attend_sequence(
            q, k, v, options, alibi_slopes=alibi_slopes, sinks=sinks, numerics=numerics, alibi_dtype=alibi_dtype
        )
    dq = torch.zeros(sq, h, d, dtype=ct, device=dev)
    dk = torch.zeros(hk, sk, d, dtype=ct, device=dev)
    dvh = torch.zeros(hk, sk, dv, dtype=ct, device=dev)
    dsinks = None if sinks is None else torch.zeros(h, dtype=ct, device=dev)
    if sq == 0 or sk == 0:  # no visible key anywhere: O = 0, D = 0, every gradient 0
        return AttnGrads(dq, dk.permute(1, 0, 2).contiguous(), dvh.permute(1, 0, 2).contiguous(), dsinks)
    scale = options.scale if options.scale is not None else 1.0 / math.sqrt(d)
    cap = options.softcap
    qh = q.to(ct).permute(1, 0, 2).reshape(hk, group, sq, d)
    kh = k.to(ct).permute(1, 0, 2)  # (hk, sk, d)
    vh = v.to(ct).permute(1, 0, 2)  # (hk, sk, dv)
    doh = dout.to(ct).permute(1, 0, 2).reshape(hk, group, sq, dv)
    delta = (dout.to(ct) * out.to(ct)).sum(-1).transpose(0, 1).reshape(hk, group, sq)  # D = rowsum(dO * O)
    lse_h = lse.to(dev, ct).reshape(hk, group, sq)
    lse_safe = torch.where(torch.isneginf(lse_h), torch.zeros_like(lse_h), lse_h)  # such rows have P = 0
    slopes = None if alibi_slopes is None else alibi_slopes.to(dev, ct).reshape(hk, group, 1, 1)
    sink_top = None if sinks is None else sinks.to(dev, ct).reshape(hk, group, 1, 1)
    if sinks is not None:  # P_sink = exp(sink - lse); its value is 0, so dS_sink = P_sink * (0 - D)
        p_sink = torch.exp(sinks.to(dev, ct).reshape(hk, group, 1) - lse_h)
        dsinks = -(p_sink * delta).sum(-1).reshape(h)
    tiles = tile_shape(sq, sk, h, numerics.max_tile_elems)
    for q0, q1, lo, hi, key_tiles in query_tiles(sq, sk, tiles, options, dev):  # fully masked tiles: no gradient
        n = q1 - q0
        # rows of a tile are (query head of the group, query): (hk, g * tq, .), so a matmul over them sums the group
        qt = qh[:, :, q0:q1].reshape(hk, group * n, d)
        dot = doh[:, :, q0:q1].reshape(hk, group * n, dv)
        lse_t = lse_safe[:, :, q0:q1].reshape(hk, group * n, 1)
        delta_t = delta[:, :, q0:q1].reshape(hk, group * n, 1)
        dq_t = torch.zeros(hk, group * n, d, dtype=ct, device=dev)
        rows = torch.arange(q0, q1, device=dev)
        for k0, k1, _ in key_tiles:  # (its mask decision is read from the bounds below)
            kt, vt = kh[:, k0:k1], vh[:, k0:k1]  # (hk, tk, d|dv)
            s = torch.matmul(qt, kt.transpose(-1, -2)) * scale  # (hk, g * tq, tk)
            if cap is not None:  # the tanh's argument formed in softcap_arg_dtype when given (two roundings)
                t = torch.tanh(_rounded(_rounded(s, softcap_arg_dtype) / cap, softcap_arg_dtype))
                s = t * cap
            s = s.view(hk, group, n, k1 - k0)
            cols = torch.arange(k0, k1, device=dev)
            if slopes is not None:
                s = s - alibi_penalty(slopes, rows, cols, sq, sk, lo, hi, sink_top, alibi_dtype)
            if not (bool((lo <= k0).all()) and bool((hi >= k1).all())):
                visible = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
                s = s.masked_fill(~visible, -math.inf)
            p = torch.exp(s.reshape(hk, group * n, k1 - k0) - lse_t)  # masked entries: exp(-inf) = 0
            dp = torch.matmul(dot, vt.transpose(-1, -2))  # (hk, g * tq, tk)
            ds = p * (dp - delta_t)
            if cap is not None:
                ds = ds * (1.0 - t * t)
            p, ds = _rounded(p, operand_dtype), _rounded(ds, operand_dtype)
            dvh[:, k0:k1] += torch.matmul(p.transpose(-1, -2), dot)  # (hk, tk, g * tq) @ (hk, g * tq, dv)
            dk[:, k0:k1] += torch.matmul(ds.transpose(-1, -2), qt) * scale
            dq_t += torch.matmul(ds, kt) * scale
        dq[q0:q1] = dq_t.reshape(h, n, d).permute(1, 0, 2)
    return AttnGrads(dq, dk.permute(1, 0, 2).contiguous(), dvh.permute(1, 0, 2).contiguous(), dsinks)


def _check_dout(dout: torch.Tensor, want: tuple[int, ...], device: torch.device) -> None:
    if not isinstance(dout, torch.Tensor):
        raise ValueError(f"dout must be a torch.Tensor, got {type(dout).__name__}")
    if tuple(dout.shape) != want:
        raise ValueError(f"dout must have shape {want} (q's tokens and heads, V's head dim), got {tuple(dout.shape)}")
    if not dout.dtype.is_floating_point:
        raise ValueError(f"dout must be a floating tensor, got dtype {dout.dtype}")
    if dout.device != device:
        raise ValueError(f"dout must be on q's device {device}, got {dout.device}")


def _sequences_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    pieces: list[tuple[int | slice, slice | tuple[int, slice], int]],
    *,
    options: AttnOptions,
    alibi_slopes: torch.Tensor | None,
    sinks: torch.Tensor | None,
    numerics: Numerics,
    operand_dtype: torch.dtype | None,
    softcap_arg_dtype: torch.dtype | None,
    alibi_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
) -> AttnGrads:
    """A batch's gradients, one :func:`attend_sequence_backward` per ``(query index, key index, b)`` of ``pieces``.

    ``b`` picks a ``(b, h)`` ALiBi slope row; ``out`` is indexed like q and ``lse`` (h, tokens) along its tokens.
    Each sequence's dQ is written at its query index and its dK, dV added at its key index; dsinks is their sum.
    """
    ct = numerics.dtype
    grads = AttnGrads(
        q.new_zeros(q.shape, dtype=ct),
        q.new_zeros(k.shape, dtype=ct),
        q.new_zeros(v.shape, dtype=ct),
        None if sinks is None else q.new_zeros(q.shape[-2], dtype=ct),
    )
    for qi, ki, b in pieces:
        slopes = sequence_slopes(alibi_slopes, b)
        g = attend_sequence_backward(
            q[qi],
            k[ki],
            v[ki],
            dout[qi],
            options,
            alibi_slopes=slopes,
            sinks=sinks,
            numerics=numerics,
            out=None if out is None else out[qi],
            lse=None if lse is None else lse[:, qi],
            operand_dtype=operand_dtype,
            softcap_arg_dtype=softcap_arg_dtype,
            alibi_dtype=alibi_dtype,
        )
        grads.dq[qi] = g.dq
        grads.dk[ki] += g.dk
        grads.dv[ki] += g.dv
        if grads.dsinks is not None:
            assert g.dsinks is not None  # both are None exactly when sinks is
            grads.dsinks.add_(g.dsinks)
    return grads


@torch.no_grad()
def attention_varlen_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    options: AttnOptions = AttnOptions(),
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    numerics: Numerics = Numerics(),
    operand_dtype: torch.dtype | None = None,
    softcap_arg_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    qv: None = None,
    alibi_dtype: torch.dtype | None = None,
) -> AttnGrads:
    """Reference gradients over a varlen batch (the layouts of :func:`attnref.attention_varlen`).

    Args:
        q: (total_q, h, d).  k: (total_k, hk, d).  v: (total_k, hk, dv).  dout: (total_q, h, dv).
        cu_seqlens_q, cu_seqlens_k: (b + 1,) integer offsets of each sequence's queries and keys.
        options: causal / window / softcap / scale / chunk (no ``cp``).
        alibi_slopes: (h,) or (b, h).  sinks: (h,) per-head sink logits, shared by every sequence.
        operand_dtype: round P and dS to this dtype before the matmuls (the same-precision baseline).
        softcap_arg_dtype: with a soft-cap, form the tanh's argument in this dtype (see the module docstring).
        out, lse: the forward's (total_q, h, dv) and (h, total_q); None (both) = recomputed per sequence.
        alibi_dtype: ALiBi as an adapter's row-shifted additive bias rounded to this dtype
            (:func:`attnref.core.alibi_penalty`); None = exact.

    Returns:
        ``AttnGrads(dq (total_q, h, d), dk (total_k, hk, d), dv (total_k, hk, dv), dsinks (h,) or None)`` in
        ``numerics.dtype``; ``dsinks`` is summed over the sequences.
    """
    _check_unsupported(options, qv, operand_dtype, softcap_arg_dtype)
    check_alibi_dtype(alibi_dtype)
    h, hk, d, dv = check_qkv(q, k, v, token_dims=1)
    _check_dout(dout, (q.shape[0], h, dv), q.device)
    cu_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    batch = len(cu_q) - 1
    spans = sequence_spans(k.shape[0], batch, cu_seqlens_k, None)
    check_alibi(alibi_slopes, batch, h, q.device)
    check_head_vector("sinks", sinks, h, q.device)
    if (out is None) != (lse is None):
        raise ValueError("out and lse must be given together (or both None: the forward is recomputed)")
    if (
        out is not None
        and lse is not None
        and (tuple(out.shape) != (q.shape[0], h, dv) or tuple(lse.shape) != (h, q.shape[0]))
    ):
        raise ValueError(
            f"out must have shape {(q.shape[0], h, dv)} and lse {(h, q.shape[0])}, "
            f"got {tuple(out.shape)} and {tuple(lse.shape)}"
        )
    return _sequences_backward(
        q,
        k,
        v,
        dout,
        [(slice(cu_q[b], cu_q[b + 1]), slice(k0, k0 + n), b) for b, (k0, n) in enumerate(spans)],
        options=options,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        numerics=numerics,
        operand_dtype=operand_dtype,
        softcap_arg_dtype=softcap_arg_dtype,
        alibi_dtype=alibi_dtype,
        out=out,
        lse=lse,
    )


@torch.no_grad()
def attention_padded_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    *,
    seqlens_k: torch.Tensor | None = None,
    options: AttnOptions = AttnOptions(),
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    numerics: Numerics = Numerics(),
    operand_dtype: torch.dtype | None = None,
    softcap_arg_dtype: torch.dtype | None = None,
    qv: None = None,
) -> AttnGrads:
    """Reference gradients over a padded batch (the layouts of :func:`attnref.attention_padded`).

    Args:
        q: (b, sq, h, d).  k: (b, sk, hk, d).  v: (b, sk, hk, dv).  dout: (b, sq, h, dv).
        seqlens_k: (b,) keys used per sequence (<= sk); None = all ``sk``.  Keys past it get gradient 0.

    Returns:
        ``AttnGrads(dq (b, sq, h, d), dk (b, sk, hk, d), dv (b, sk, hk, dv), dsinks (h,) or None)`` in
        ``numerics.dtype``; ``dsinks`` is summed over the batch.
    """
    _check_unsupported(options, qv, operand_dtype, softcap_arg_dtype)
    h, hk, d, dv = check_qkv(q, k, v, token_dims=2)
    batch, sq, sk = q.shape[0], q.shape[1], k.shape[1]
    if k.shape[0] != batch:
        raise ValueError(f"k batch ({k.shape[0]}) must equal q batch ({batch})")
    _check_dout(dout, (batch, sq, h, dv), q.device)
    lens = [sk] * batch if seqlens_k is None else check_seqlens("seqlens_k", seqlens_k, batch, sk)
    check_alibi(alibi_slopes, batch, h, q.device)
    check_head_vector("sinks", sinks, h, q.device)
    return _sequences_backward(
        q,
        k,
        v,
        dout,
        [(b, (b, slice(None, lens[b])), b) for b in range(batch)],
        options=options,
        alibi_slopes=alibi_slopes,
        sinks=sinks,
        numerics=numerics,
        operand_dtype=operand_dtype,
        softcap_arg_dtype=softcap_arg_dtype,
    )
