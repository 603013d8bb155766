"""Varlen batches: sequences packed along the token dimension, delimited by ``cu_seqlens``.

Keys of sequence ``b`` are ``k[cu_seqlens_k[b] : cu_seqlens_k[b] + n_b]`` where ``n_b`` is
``seqused_k[b]`` when given (FA3/FA4 ``seqused_k``, torch's vendored FA2) and otherwise
``cu_seqlens_k[b + 1] - cu_seqlens_k[b]``.  With ``seqused_k`` and no ``cu_seqlens_k`` the keys are
laid out as a padded ``(b, sk_max)`` batch flattened to ``(b * sk_max, hk, d)``.
"""

from __future__ import annotations
from collections.abc import Sequence


import torch

from .core import attend_sequence
from .options import AttnOptions, Numerics
from .result import AttnResult
from .validate import (
    as_int_list,
    check_alibi,
    check_alibi_dtype,
    check_cu_seqlens,
    check_head_vector,
    check_qkv,
    check_qv,
    check_seqlens,
)

__all__ = ["attention_varlen", "cp_sequence_options", "sequence_slopes", "sequence_spans"]


def sequence_slopes(alibi_slopes: torch.Tensor | None, b: int) -> torch.Tensor | None:
    """Sequence ``b``'s (h,) ALiBi slopes: the shared (h,) slopes, or row ``b`` of per-sequence (b, h) ones."""
    return None if alibi_slopes is None else (alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b])


def sequence_spans(
    total_k: int,
    batch: int,
    cu_seqlens_k: torch.Tensor | Sequence[int] | None,
    seqused_k: torch.Tensor | None,
) -> list[tuple[int, int]]:
    """Validated (start, length) of each sequence's keys in a packed key tensor."""
    if cu_seqlens_k is None and seqused_k is None:
        raise ValueError("cu_seqlens_k or seqused_k must be given")
    if cu_seqlens_k is not None:
        cu_k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, total_k, exact=seqused_k is None)
        if len(cu_k) != batch + 1:
            raise ValueError(f"cu_seqlens_k must have {batch + 1} entries (batch + 1), got {len(cu_k)}")
        starts = cu_k[:-1]
        caps = [cu_k[b + 1] - cu_k[b] for b in range(batch)]
        if seqused_k is not None:
            caps = [total_k - s for s in starts]  # FA3/FA4: seqused_k may exceed the cu_seqlens span
    else:
        if batch == 0 or total_k % batch != 0:
            raise ValueError(
                "k must hold batch * max_seqlen_k tokens when only seqused_k is given; "
                f"got {total_k} tokens for batch {batch}"
            )
        width = total_k // batch
        starts = [b * width for b in range(batch)]
        caps = [width] * batch
    lens = caps if seqused_k is None else check_seqlens("seqused_k", seqused_k, batch, caps)
    return list(zip(starts, lens))


def cp_sequence_options(
    options: AttnOptions, key_lens: list[int], cp_tot_seqused_k: torch.Tensor | list[int] | None
) -> list[AttnOptions]:
    """Per-sequence options: ``options`` itself without context parallelism; with ``options.cp``, its shard with
    sequence ``b``'s total ``cp_tot_seqused_k[b]``, checked against the ``key_lens[b]`` keys the call holds (the
    rank's interleave-1 share of the total, ``ContextParallel.local_len``)."""
    batch = len(key_lens)
    cp = options.cp
    if cp is None:
        if cp_tot_seqused_k is not None:
            raise ValueError("cp_tot_seqused_k is given but options.cp is None (no context parallelism)")
        return [options] * batch
    if cp_tot_seqused_k is None:
        if cp.total is None:
            raise ValueError("cp_tot_seqused_k must be given with options.cp (each sequence's keys over all ranks)")
        totals = [cp.total] * batch
    elif cp.total is not None:
        raise ValueError("give the totals either as options.cp.total or as cp_tot_seqused_k, not both")
    else:
        totals = as_int_list("cp_tot_seqused_k", cp_tot_seqused_k)
    if len(totals) != batch:
        raise ValueError(f"cp_tot_seqused_k must have {batch} entries (one per sequence), got {len(totals)}")
    out = []
    for b, (total, n) in enumerate(zip(totals, key_lens)):
        if total < 0:
            raise ValueError(f"cp_tot_seqused_k[{b}] must be >= 0, got {total}")
        want = cp.local_len(total)
        if n != want:
            raise ValueError(
                f"cp_tot_seqused_k[{b}] = {total}: rank {cp.rank} of {cp.world} holds {want} of its keys (key a on "
                f"rank a % {cp.world}, the kernel's interleave-1 shard), but sequence {b} has {n}"
            )
        out.append(options.with_(cp=cp.with_total(total)))
    return out


@torch.no_grad()
def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | Sequence[int],
    cu_seqlens_k: torch.Tensor | Sequence[int] | None = None,
    *,
    seqused_k: torch.Tensor | None = None,
    options: AttnOptions = AttnOptions(),
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
    numerics: Numerics = Numerics(),
    cp_tot_seqused_k: torch.Tensor | list[int] | None = None,
    alibi_dtype: torch.dtype | None = None,
) -> AttnResult:
    """Reference attention over a varlen batch.

    Args:
        q: (total_q, h, d).  k: (total_k, hk, d).  v: (total_k, hk, dv).
        cu_seqlens_q: (b + 1,) integer offsets of each sequence's queries (a tensor, or the ints themselves: a
            caller that knows them on the host saves a read of a device tensor).
        cu_seqlens_k: (b + 1,) offsets of each sequence's keys, or None with ``seqused_k``.
        seqused_k: (b,) number of keys each sequence uses from its start.
        options: causal / window / softcap / scale / chunk.
        alibi_slopes: (h,) or (b, h).  sinks: (h,) per-head sink logits.
        qv: (total_q, h, dv) MLA-absorbed query part scored against V (:mod:`attnref.mla`).
        numerics: accumulation dtype and tile budget.
        cp_tot_seqused_k: (b,) with ``options.cp``: each sequence's keys over all ranks, the call's keys being
            the rank's interleave-1 shard of them (:func:`cp_sequence_options`).
        alibi_dtype: ALiBi as an adapter's row-shifted additive bias rounded to this dtype
            (:func:`attnref.core.alibi_penalty`); None = exact.

    Returns:
        ``AttnResult(out (total_q, h, dv), lse (h, total_q))``.
    """
    check_alibi_dtype(alibi_dtype)
    h, hk, d, dv = check_qkv(q, k, v, token_dims=1)
    cu_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    batch = len(cu_q) - 1
    spans = sequence_spans(k.shape[0], batch, cu_seqlens_k, seqused_k)
    check_alibi(alibi_slopes, batch, h, q.device)
    check_head_vector("sinks", sinks, h, q.device)
    check_qv(qv, q, dv)
    per_seq = cp_sequence_options(options, [n for _, n in spans], cp_tot_seqused_k)

    out = torch.zeros(q.shape[0], h, dv, dtype=numerics.dtype, device=q.device)
    lse = torch.full((h, q.shape[0]), float("-inf"), dtype=numerics.dtype, device=q.device)
    for b, (k0, n) in enumerate(spans):
        q0, q1 = cu_q[b], cu_q[b + 1]
        slopes = sequence_slopes(alibi_slopes, b)
        o, l = attend_sequence(
            q[q0:q1],
            k[k0 : k0 + n],
            v[k0 : k0 + n],
            per_seq[b],
            alibi_slopes=slopes,
            sinks=sinks,
            qv=None if qv is None else qv[q0:q1],
            numerics=numerics,
            alibi_dtype=alibi_dtype,
        )
        out[q0:q1] = o
        lse[:, q0:q1] = l
    return AttnResult(out, lse)
