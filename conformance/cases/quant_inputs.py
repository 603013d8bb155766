"""The stored (quantized) tensors of a quantized case and their descales.

A quantized case (``case.quant != "none"``) is generated in three steps by
:func:`conformance.cases.inputs.make_inputs`: draw q, k, v (and qv) in fp32; quantize them here;
set ``CaseInputs.q/k/v/qv`` to the *dequantized* values in fp32.  The reference and the baseline
read those dequantized values, so a kernel is judged on exactly the numbers it was given; a kernel
receives the stored tensors and descales of :class:`QuantTensors` (and the paged caches built from
them).  ``dequantized == stored.float() * descale`` holds exactly for every element.

Scales (``amax / format max``, no saturation of the case's own data):

* ``fp8`` ``tensor``: one scale per tensor, shape ``(1,)``; vLLM expands it to ``(batch, hk)``
  before the FA3 call (``expand_descale``).
* ``fp8`` ``head``: one scale per (sequence, kv head), shape ``(batch, hk)``, FA3's own granularity;
  a query head uses the scale of its kv head's group.
* ``int8`` (seed ``001``): q and k per (token, head), shapes ``(total_q, h)`` / ``(total_kv, hk)``;
  type 1 quantizes v per (kv head, channel) with a static ``(hk, dv)`` scale; type 2 leaves v alone.

With ``qv`` (MLA absorbed) the pair shares scales the way one 576-wide MLA cache does: k and v one
scale (the cache's), q and qv one scale.  FA3 applies ``q_descale * k_descale`` to the whole score
``q.k + qv.v``, which is right only under this sharing.

So that a descale bug cannot hide, the magnitudes of q, k, v differ per (sequence, kv head) by
factors ``2^u``, ``u ~ U(-1, 1)``: per-head scales then differ by up to 4x, and a kernel that reads
one tensor-wide scale where per-head ones were given is far off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import torch

from attnref.quant import amax_scale, dequantize, quant_format, quantize, quantize_int8_per_token_head

from conformance.cases.case import AttentionCase

__all__ = ["Dequantized", "QuantTensors", "quantize_case", "token_rows"]


@dataclass
class QuantTensors:
    """What a kernel of a quantized case is given (packed varlen layout, like ``CaseInputs``).

    ``q``/``qv``/``v`` are None where that tensor stays in the activation dtype (``quant_q`` False,
    or v of ``int8_t2``); the paged caches of the case live in ``CaseInputs.k_cache``/``v_cache``
    in the stored dtype, with ``k_scale_cache`` ``(num_blocks, hk, block_size)`` holding the int8
    per-token K scales slot by slot.  ``k_new``/``v_new`` (an fp8 append, ``CaseInputs.k_new``'s rows) are the
    new keys and values as stored: quantized with the cache's own descales, which the kernel copies into the cache.
    """

    fmt: str
    k: torch.Tensor
    k_descale: torch.Tensor
    q: torch.Tensor | None = None
    q_descale: torch.Tensor | None = None
    qv: torch.Tensor | None = None
    v: torch.Tensor | None = None
    v_descale: torch.Tensor | None = None
    k_scale_cache: torch.Tensor | None = None
    k_new: torch.Tensor | None = None
    v_new: torch.Tensor | None = None


class Dequantized(TypedDict):
    """The dequantized fp32 values of a quantized case (:func:`quantize_case`); ``qv`` None without one."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    qv: torch.Tensor | None


def token_rows(per_seq: torch.Tensor, lens: list[int]) -> torch.Tensor:
    """``(b, ...)`` per-sequence values repeated once per token: ``(sum(lens), ...)``."""
    return torch.repeat_interleave(per_seq, torch.tensor(lens, dtype=torch.long), dim=0)


def _group_view(x: torch.Tensor, hk: int) -> torch.Tensor:
    """``(n, h, d)`` as ``(n, hk, h // hk, d)``: the query heads of each kv head together."""
    n, h, d = x.shape
    return x.reshape(n, hk, h // hk, d)


def _per_seq_head_amax(x: torch.Tensor, lens: list[int], hk: int) -> torch.Tensor:
    """``(b, hk)`` absmax of each sequence's tokens per kv-head group."""
    g = _group_view(x.float().abs(), hk)
    out = torch.zeros(len(lens), hk)
    start = 0
    for b, n in enumerate(lens):
        if n:
            out[b] = g[start : start + n].amax(dim=(0, 2, 3))
        start += n
    return out


def _fp8_scale(amaxes: list[torch.Tensor], fmax: float, mode: str) -> torch.Tensor:
    """The shared descale of some tensors: ``(1,)`` per tensor or ``(b, hk)`` per head; 1.0 where all are 0."""
    amax = torch.stack(amaxes).amax(dim=0)
    if mode == "tensor":
        amax = amax.amax().reshape(1)
    return torch.where(amax > 0, amax / fmax, torch.ones_like(amax))


def _expand(scale: torch.Tensor, lens: list[int], h: int, hk: int) -> torch.Tensor:
    """A ``(1,)`` or ``(b, hk)`` descale as per-element ``(tokens, h, 1)`` factors."""
    if scale.numel() == 1:
        return scale.reshape(1, 1, 1)
    return token_rows(scale, lens).repeat_interleave(h // hk, dim=1)[..., None]


def vary_magnitudes(x: torch.Tensor, lens: list[int], hk: int, gen: torch.Generator) -> torch.Tensor:
    """``x (n, h, d)`` with each (sequence, kv-head group) scaled by ``2^u``, ``u ~ U(-1, 1)``."""
    factors = torch.exp2(torch.rand(len(lens), hk, generator=gen) * 2 - 1)
    return x * _expand(factors, lens, x.shape[1], hk)


def quantize_case(
    case: AttentionCase, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qv: torch.Tensor | None
) -> tuple[QuantTensors, Dequantized]:
    """Quantize fp32 ``q, k, v, qv`` as ``case`` says.

    Returns the stored tensors and the dequantized fp32 values (``{"q", "k", "v", "qv"}``; tensors the
    case leaves unquantized are rounded to the activation dtype and returned in fp32).
    """
    dt = case.torch_dtype
    h, hk = case.num_heads, case.num_kv_heads
    q_lens, kv_lens = case.q_lens, case.kv_lens
    if case.quant_family == "int8":
        return _quantize_int8(case, q, k, v, qv)
    fmt = quant_format(case.quant)
    mode = case.descale_mode
    assert mode is not None
    k_amax = [_per_seq_head_amax(k, kv_lens, hk)]
    v_amax = [_per_seq_head_amax(v, kv_lens, hk)]
    if case.qv:  # one MLA cache: k and v share one scale
        k_amax = v_amax = k_amax + v_amax
    k_scale = _fp8_scale(k_amax, fmt.max, mode)
    v_scale = k_scale if case.qv else _fp8_scale(v_amax, fmt.max, mode)
    kq = quantize(k, _expand(k_scale, kv_lens, hk, hk), fmt)
    vq = quantize(v, _expand(v_scale, kv_lens, hk, hk), fmt)
    out = QuantTensors(fmt.name, k=kq, k_descale=k_scale, v=vq, v_descale=v_scale)
    deq_k = dequantize(kq, _expand(k_scale, kv_lens, hk, hk))
    deq_v = dequantize(vq, _expand(v_scale, kv_lens, hk, hk))
    deq_qv = None
    if case.quant_q:
        q_amax = [_per_seq_head_amax(q, q_lens, hk)] + ([_per_seq_head_amax(qv, q_lens, hk)] if qv is not None else [])
        q_scale = _fp8_scale(q_amax, fmt.max, mode)
        factor = _expand(q_scale, q_lens, h, hk)
        out.q, out.q_descale = quantize(q, factor, fmt), q_scale
        deq_q = dequantize(out.q, factor)
        if qv is not None:
            out.qv = quantize(qv, factor, fmt)
            deq_qv = dequantize(out.qv, factor)
    else:
        deq_q = q.to(dt).float()
    if qv is not None and deq_qv is None:
        deq_qv = qv.to(dt).float()
    return out, Dequantized(q=deq_q, k=deq_k, v=deq_v, qv=deq_qv)


def _quantize_int8(
    case: AttentionCase, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qv: torch.Tensor | None
) -> tuple[QuantTensors, Dequantized]:
    if qv is not None:
        raise ValueError("qv with an int8 type: seed 001's int8 modes have no MLA path")
    qq, q_scale = quantize_int8_per_token_head(q)
    kq, k_scale = quantize_int8_per_token_head(k)
    out = QuantTensors("int8", k=kq, k_descale=k_scale, q=qq, q_descale=q_scale)
    deq_q, deq_k = dequantize(qq, q_scale[..., None]), dequantize(kq, k_scale[..., None])
    if case.quant == "int8_t1":
        v_scale = amax_scale(v, "int8", dims=0)[0]  # (hk, dv): static per channel
        out.v, out.v_descale = quantize(v, v_scale, "int8"), v_scale
        deq_v = dequantize(out.v, v_scale)
    else:
        deq_v = v.to(case.torch_dtype).float()
    return out, Dequantized(q=deq_q, k=deq_k, v=deq_v, qv=None)
