"""The tiled online-softmax engine behind every reference entry point.

``attend_sequence`` computes one sequence (all heads) in fp32 or fp64, following the order of
operations of ``../shared/SEMANTICS.md`` section 3:

1. ``s = scale * q.k`` (plus ``scale * qv.v`` with an MLA-absorbed ``qv``, :mod:`attnref.mla`)
2. soft-cap ``s = cap * tanh(s / cap)``
3. mask (:mod:`attnref.mask`) to ``-inf``
4. ALiBi ``s += -slope * |i + sk - sq - j|`` (the symmetric form; FA2's causal kernel adds
   ``+slope * j`` instead, which changes only the LSE: adapters normalise that); ``alibi_dtype`` rounds it as
   an adapter's additive bias in that dtype (:func:`alibi_penalty`)
5. softmax; a sink (per head, unscaled logit) joins only the denominator.

Conventions (the package's, used by every entry point):

* ``lse`` is the natural-log sum of ``exp`` of the final scores of the visible keys, plus the
  sink's ``exp`` when sinks are given.
* A fully masked row (no visible key, including ``sk == 0``) has output 0 and LSE ``-inf``, or
  LSE equal to the sink when a sink is present (its output is still 0).

With ``qv`` the default scale is ``1/sqrt(d + dv)`` (upstream FA3's and FlashMLA's rule,
``../shared/SEMANTICS.md`` section 3); the score is computed as one dot product of the
concatenations ``[q | qv] . [k | v]``, which is exactly ``q.k + qv.v``.

Queries and keys are tiled so that at most ``numerics.max_tile_elems`` scores exist at once;
key tiles that no row of a query tile can see are never computed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from .mask import row_bounds
from .options import AttnOptions, Numerics

__all__ = ["alibi_penalty", "attend_sequence", "query_tiles", "tile_shape"]


def tile_shape(sq: int, sk: int, heads: int, budget: int) -> tuple[int, int]:
    """Query and key tile lengths with ``heads * tq * tk <= max(budget, heads)``."""
    tk = max(1, min(max(sk, 1), 1024, budget // max(heads, 1)))
    tq = max(1, min(max(sq, 1), budget // (max(heads, 1) * tk)))
    return tq, tk


def alibi_penalty(
    slopes: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    sq: int,
    sk: int,
    lo: torch.Tensor,
    hi: torch.Tensor,
    sinks: torch.Tensor | None = None,
    alibi_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """ALiBi's ``slope * |i + sk - sq - j|`` (subtracted from the scores) of query ``rows`` and key ``cols``.

    ``slopes`` is ``(..., 1, 1)`` (broadcast over rows and columns), in the computation dtype.  ``alibi_dtype`` models
    an adapter that passes ALiBi as an additive bias in that dtype, each row shifted by its largest entry first
    (``attnfast.sdpa.bias_for_kernel``): ``b = -penalty`` taken relative to ``top``, the row's largest bias over its
    visible keys ``[lo, hi)`` (``-slope * distance`` of the nearest one) or its sink logit where that is larger
    (``sinks``: broadcastable like ``slopes``), rounded to ``alibi_dtype``, ``top`` added back, so only the rounding
    differs from the exact penalty.  None = the exact penalty."""
    ct = slopes.dtype
    pos = rows[:, None] + (sk - sq)
    penalty = slopes * (pos - cols[None, :]).abs()  # the int64 distances promote to the slopes' dtype
    if alibi_dtype is None:
        return penalty
    pos = pos[:, 0]
    # the distance to the nearest visible key: lo - pos left of [lo, hi), pos - (hi - 1) right of it, else 0
    nearest = (lo - pos).clamp_min(0) + (pos - hi + 1).clamp_min(0)
    top = -slopes * nearest[:, None]  # (..., tq, 1); a row without keys: masked anyway
    if sinks is not None:
        top = torch.maximum(top, sinks.to(ct))
    return -((-penalty - top).to(alibi_dtype).to(ct) + top)


def query_tiles(
    sq: int, sk: int, tiles: tuple[int, int], options: AttnOptions, device: torch.device
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor, list[tuple[int, int, bool]]]]:
    """``(q0, q1, lo, hi, key_tiles)`` of each query tile ``q0:q1`` of ``tiles`` = ``(tq, tk)``: its rows' visible
    key bounds ``[lo, hi)`` (on ``device``) and the key tiles ``(k0, k1, partial)`` over the span the rows see,
    ``partial`` when some row of the tile does not see every key of it (the tile needs the mask); a tile whose rows
    are all fully masked is skipped (nothing to compute, no gradient to flow).  The spans and ``partial`` come from
    the same bounds computed on the host, so no decision waits for the device."""
    tq, tk = tiles
    lo_host, hi_host = row_bounds(torch.arange(sq), sq, sk, options)
    if torch.device(device).type == "cpu":
        lo_all, hi_all = lo_host, hi_host
    else:
        lo_all, hi_all = row_bounds(torch.arange(sq, device=device), sq, sk, options)
    lo_rows, hi_rows = lo_host.tolist(), hi_host.tolist()
    for q0 in range(0, sq, tq):
        q1 = min(sq, q0 + tq)
        los, his = lo_rows[q0:q1], hi_rows[q0:q1]
        span_lo, span_hi = min(los), max(his)
        if span_lo >= span_hi:
            continue  # every row of this tile is fully masked
        lo_max, hi_min = max(los), min(his)
        key_tiles = []
        for k0 in range(span_lo, span_hi, tk):
            k1 = min(span_hi, k0 + tk)
            key_tiles.append((k0, k1, not (lo_max <= k0 and hi_min >= k1)))
        yield q0, q1, lo_all[q0:q1], hi_all[q0:q1], key_tiles


@torch.no_grad()
def attend_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    options: AttnOptions = AttnOptions(),
    *,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
    numerics: Numerics = Numerics(),
    alibi_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one sequence, no validation (callers validate).

    Args:
        q: (sq, h, d); k: (sk, hk, d); v: (sk, hk, dv), with ``h % hk == 0``.
        alibi_slopes: (h,) or None.  sinks: (h,) or None.
        qv: (sq, h, dv) or None: MLA absorbed, adds ``qv . v`` to every score.
        alibi_dtype: ALiBi as a row-shifted bias rounded to this dtype (:func:`alibi_penalty`); None = exact.

    Returns:
        out (sq, h, dv) and lse (h, sq), both in ``numerics.dtype``.
    """
    sq, h, d = q.shape
    sk, hk, dv = v.shape
    group = h // hk
    ct = numerics.dtype
    dev = q.device
    out = torch.zeros(sq, h, dv, dtype=ct, device=dev)
    lse = torch.full((h, sq), -math.inf, dtype=ct, device=dev)
    if sq == 0:
        return out, lse
    scale = options.scale if options.scale is not None else 1.0 / math.sqrt(d + (0 if qv is None else dv))
    if qv is not None:  # [q | qv] . [k | v] = q.k + qv.v
        q, k = torch.cat([q.to(ct), qv.to(ct)], dim=-1), torch.cat([k.to(ct), v.to(ct)], dim=-1)
        d = d + dv
    qh = q.to(ct).permute(1, 0, 2).reshape(hk, group, sq, d)
    kh = k.to(ct).permute(1, 0, 2)  # (hk, sk, d)
    vh = v.to(ct).permute(1, 0, 2)  # (hk, sk, dv)
    slopes = None if alibi_slopes is None else alibi_slopes.to(dev, ct).reshape(hk, group, 1, 1)
    sink_top = None if sinks is None else sinks.to(dev, ct).reshape(hk, group, 1, 1)
    tiles = tile_shape(sq, sk, h, numerics.max_tile_elems)
    for q0, q1, lo, hi, key_tiles in query_tiles(sq, sk, tiles, options, dev):
        qt = qh[:, :, q0:q1]  # (hk, g, tq, d)
        m = torch.full((hk, group, q1 - q0), -math.inf, dtype=ct, device=dev)
        l = torch.zeros_like(m)
        acc = torch.zeros(hk, group, q1 - q0, dv, dtype=ct, device=dev)
        rows = torch.arange(q0, q1, device=dev) if slopes is not None else None
        for k0, k1, partial in key_tiles:
            s = torch.matmul(qt, kh[:, None, k0:k1].transpose(-1, -2)) * scale  # (hk, g, tq, tk)
            if options.softcap is not None:
                s = torch.tanh(s / options.softcap) * options.softcap
            if slopes is not None or partial:
                cols = torch.arange(k0, k1, device=dev)
            if slopes is not None:
                assert rows is not None
                s = s - alibi_penalty(slopes, rows, cols, sq, sk, lo, hi, sink_top, alibi_dtype)
            if partial:
                hidden = (cols[None, :] < lo[:, None]) | (cols[None, :] >= hi[:, None])
                s = s.masked_fill(hidden, -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_safe = torch.where(torch.isneginf(m_new), 0.0, m_new)
            p = torch.exp(s - m_safe[..., None])
            corr = torch.exp(m - m_safe)
            l = l * corr + p.sum(dim=-1)
            acc = acc * corr[..., None] + torch.matmul(p, vh[:, None, k0:k1])
            m = m_new
        has_keys = l > 0
        m_safe = torch.where(has_keys, m, 0.0)
        l_safe = torch.where(has_keys, l, 1.0)
        tile_out = torch.where(has_keys[..., None], acc / l_safe[..., None], 0.0)
        tile_lse = torch.where(has_keys, m_safe + torch.log(l_safe), -math.inf)
        out[q0:q1] = tile_out.reshape(h, q1 - q0, dv).permute(1, 0, 2)
        lse[:, q0:q1] = tile_lse.reshape(h, q1 - q0)

    if sinks is not None:
        sink = sinks.to(dev, ct).reshape(h, 1)
        total = torch.logaddexp(lse, sink.expand_as(lse))
        weight = torch.exp(lse - total)  # 0 where the row saw no key
        out = out * weight.transpose(0, 1)[..., None]
        lse = total
    return out, lse
