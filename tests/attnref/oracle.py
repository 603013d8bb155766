"""An independent float64 oracle for attention, written from ``../shared/SEMANTICS.md`` alone.

Deliberately naive and deliberately separate from :mod:`attnref`: it imports none of attnref's
mask, core or paging code, builds the full (sq, sk) boolean mask and bias matrix explicitly in
numpy, and computes one (sequence, head) at a time with a textbook softmax.  A bug in the tiled
reference therefore has to be reproduced independently here to go unnoticed.

Semantics (SEMANTICS.md sections 2-4):

* row ``i`` sees key ``j`` iff ``p - left <= j <= p + right`` with ``p = i + sk - sq``
  (``None`` = unbounded, causal = ``right 0``), and with a chunk ``C`` also
  ``c0 <= j < c0 + C``, ``c0 = p - (p mod C)`` (floor modulo);
* ``s = scale * q.k``; soft-cap ``cap * tanh(s / cap)``; mask; ALiBi ``-slope * |p - j|``;
* a sink enters the denominator only; a fully masked row gives output 0 and LSE ``-inf``
  (or the sink value when a sink is given);
* GQA: query head ``i`` reads kv head ``i // (h / hk)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "oracle_mask",
    "oracle_attention",
    "oracle_batch",
    "options_kwargs",
    "build_paged_cache",
]


def oracle_mask(
    sq: int,
    sk: int,
    *,
    left: int | None = None,
    right: int | None = None,
    causal: bool = False,
    chunk: int | None = None,
) -> np.ndarray:
    """Boolean (sq, sk) visibility, written as the inequality of SEMANTICS.md section 2."""
    if causal:
        right = 0
    mask = np.zeros((sq, sk), dtype=bool)
    for i in range(sq):
        p = i + sk - sq
        j = np.arange(sk)
        row = np.ones(sk, dtype=bool)
        if left is not None:
            row &= j >= p - left
        if right is not None:
            row &= j <= p + right
        if chunk is not None:
            c0 = p - (p % chunk)  # Python's % is floor modulo, also for negative p
            row &= (j >= c0) & (j < c0 + chunk)
        mask[i] = row
    return mask


def options_kwargs(options: object) -> dict:
    """Oracle keyword arguments from an ``AttnOptions`` read field by field (no attnref logic used)."""
    window = options.window
    return {
        "causal": bool(options.causal),
        "left": window.left,
        "right": window.right,
        "softcap": options.softcap,
        "scale": options.scale,
        "chunk": options.chunk,
    }


def _np64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def oracle_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    left: int | None = None,
    right: int | None = None,
    softcap: float | None = None,
    scale: float | None = None,
    chunk: int | None = None,
    alibi: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    mask: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one sequence in float64.

    Args:
        q: (sq, h, d); k: (sk, hk, d); v: (sk, hk, dv).  alibi, sinks: (h,) or None.
        mask: an explicit boolean (sq, sk) visibility that replaces the one of the mask arguments.

    Returns:
        out (sq, h, dv) and lse (h, sq), float64 CPU tensors.
    """
    qn, kn, vn = _np64(q), _np64(k), _np64(v)
    sq, h, d = qn.shape
    sk, hk, dv = vn.shape
    group = h // hk
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if mask is None:
        mask = oracle_mask(sq, sk, left=left, right=right, causal=causal, chunk=chunk)
    elif mask.shape != (sq, sk):
        raise ValueError(f"mask must have shape {(sq, sk)}, got {mask.shape}")
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    distance = np.abs(i + sk - sq - j).astype(np.float64)
    slopes = None if alibi is None else _np64(alibi)
    sink_vals = None if sinks is None else _np64(sinks)

    out = np.zeros((sq, h, dv))
    lse = np.full((h, sq), -np.inf)
    for head in range(h):
        kv = head // group
        s = sc * (qn[:, head, :] @ kn[:, kv, :].T)  # (sq, sk)
        if softcap is not None:
            s = softcap * np.tanh(s / softcap)
        if slopes is not None:
            s = s - slopes[head] * distance
        for row in range(sq):
            logits = s[row][mask[row]]
            values = vn[mask[row], kv, :]
            sink = None if sink_vals is None else sink_vals[head]
            if logits.size == 0:
                # Nothing visible: output stays 0; the sink alone makes up the LSE.
                lse[head, row] = -np.inf if sink is None else sink
                continue
            top = logits.max() if sink is None else max(logits.max(), sink)
            e = np.exp(logits - top)
            denom = e.sum() + (0.0 if sink is None else math.exp(sink - top))
            out[row, head] = (e / denom) @ values
            lse[head, row] = top + math.log(denom)
    return torch.from_numpy(out), torch.from_numpy(lse)


def oracle_batch(
    qs: Sequence[torch.Tensor],
    ks: Sequence[torch.Tensor],
    vs: Sequence[torch.Tensor],
    *,
    alibi: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Varlen layout of per-sequence oracles: out (total_q, h, dv), lse (h, total_q).

    ``alibi`` is (h,) for every sequence or (b, h), one row per sequence.
    """
    outs, lses = [], []
    for b, (q, k, v) in enumerate(zip(qs, ks, vs)):
        slopes = None if alibi is None else (alibi if alibi.dim() == 1 else alibi[b])
        out, lse = oracle_attention(q, k, v, alibi=slopes, sinks=sinks, **kwargs)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, 0), torch.cat(lses, 1)


def build_paged_cache(
    ks: Sequence[torch.Tensor],
    vs: Sequence[torch.Tensor],
    block_size: int,
    layout: str,
    generator: torch.Generator,
    *,
    spare_blocks: int = 2,
    extra_columns: int = 1,
    garbage: float = 1e3,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Place per-sequence keys/values (n_b, hk, d|dv) in paged caches with a random permuted table.

    Written with plain loops, independently of ``attnref.write_kv_cache``.  Unused slots and spare
    blocks hold large finite values, so reading past a sequence's length is a visible error.
    Block-table columns past what a sequence needs point at random blocks (never to be read).

    Returns:
        k_cache, v_cache in ``layout`` ("NHD": (nb, bs, hk, d); "HND": (nb, hk, bs, d)) and the
        int32 block table (b, max_blocks + extra_columns).
    """
    hk = ks[0].shape[1]
    need = [-(-kb.shape[0] // block_size) for kb in ks]
    num_blocks = sum(need) + spare_blocks
    perm = torch.randperm(num_blocks, generator=generator).tolist()
    width = max(need, default=0) + extra_columns
    table = torch.randint(0, num_blocks, (len(ks), width), generator=generator, dtype=torch.int32)
    cursor = 0
    for b in range(len(ks)):
        for c in range(need[b]):
            table[b, c] = perm[cursor]
            cursor += 1
    caches = []
    for seqs in (ks, vs):
        dim = seqs[0].shape[2]
        cache = torch.randn(num_blocks, block_size, hk, dim, generator=generator, dtype=torch.float64) * garbage
        for b, seq in enumerate(seqs):
            for t in range(seq.shape[0]):
                cache[int(table[b, t // block_size]), t % block_size] = seq[t].to(torch.float64)
        cache = cache.to(seqs[0].dtype)
        caches.append(cache.permute(0, 2, 1, 3).contiguous() if layout == "HND" else cache)
    return caches[0], caches[1], table
