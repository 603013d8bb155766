"""Build a call from chosen requests of a case's inputs: the batches an invariance compares.

A batch-composition check runs one request alone, inside its batch, at another position, and beside requests of
other lengths; each of those batches is a new call whose tensors are the original request's very numbers.
:func:`assemble` builds such a call: requests picked from ``inputs`` by index, each with a key count (a prefix of
its keys when shorter), packed or paged as the case is (a paged call gets a fresh cache from the engines' block
manager, :func:`conformance.cases.paged_kv.allocate_cache`: shuffled block ids, stale unused slots).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.cases.paged_kv import allocate_cache, cu_seqlens

__all__ = ["assemble", "assemble_refusal"]


def assemble_refusal(case: AttentionCase) -> str:
    """Why :func:`assemble` cannot build batches of ``case`` (``""`` when it can): the inputs it does not cut per
    request.  What the invariance compositions refuse up front (kernel level and engines'), so such a case is
    unsupported, not an error."""
    carried = [
        (case.quant != "none", "quantized inputs (quant)"),
        (case.append, "the new keys of an append (k_new, v_new)"),
        (case.cp_world > 1, "context-parallel totals (cp_tot_seqused_k)"),
    ]
    missing = [what for cut, what in carried if cut]
    if missing:
        return f"invariance: its batches are assembled from q, k, v only; {', '.join(missing)} are not cut per request"
    return ""


def assemble(
    case: AttentionCase, inputs: CaseInputs, picks: Sequence[tuple[int, ...]], seed: int = 0
) -> tuple[AttentionCase, CaseInputs]:
    """The call of requests ``picks`` = ``[(index into case.requests, kv_len[, q_len]), ...]`` in that order.

    ``kv_len`` may be shorter than the request's own (its first keys are kept); ``q_len``, when given, may be
    shorter than the request's own (its first queries are kept; else all of them).  For a causal request
    ``kv_len`` must stay >= ``q_len``.  ``ValueError`` for a case
    :func:`assemble_refusal` refuses."""
    refused = assemble_refusal(case)
    if refused:
        raise ValueError(refused)
    cu_q, cu_k = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
    reqs, qs, qvs, ks, vs = [], [], [], [], []
    for r, kv, *rest in picks:
        own_q, own = case.requests[r]
        q_len = rest[0] if rest else own_q
        if not 0 <= kv <= own:
            raise ValueError(f"picks: kv_len {kv} of requests[{r}] must be in [0, {own}]")
        if not 0 <= q_len <= own_q:
            raise ValueError(f"picks: q_len {q_len} of requests[{r}] must be in [0, {own_q}]")
        reqs.append((q_len, kv))
        qs.append(inputs.q[cu_q[r] : cu_q[r] + q_len])
        if inputs.qv is not None:
            qvs.append(inputs.qv[cu_q[r] : cu_q[r] + q_len])
        ks.append(inputs.k[cu_k[r] : cu_k[r] + kv])
        vs.append(inputs.v[cu_k[r] : cu_k[r] + kv])
    call = case.replace(requests=tuple(reqs), invariance="", batch_name="")
    dev = inputs.q.device
    q = torch.cat(qs)
    k, v = torch.cat(ks), torch.cat(vs)
    built = CaseInputs(
        case=call,
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=cu_seqlens(call.q_lens, dev),
        cu_seqlens_k=cu_seqlens(call.kv_lens, dev),
        seqlens_k=torch.tensor(call.kv_lens, dtype=torch.int32, device=dev),
        alibi_slopes=inputs.alibi_slopes,
        sinks=inputs.sinks,
        qv=torch.cat(qvs) if qvs else None,
    )
    if call.paged:
        assert call.block_size is not None
        gen = torch.Generator().manual_seed(seed * 7919 + len(picks))
        paged = allocate_cache(call.kv_lens, ks, vs, block_size=call.block_size, layout=call.kv_layout, generator=gen)
        built.k_cache, built.v_cache, built.block_table = paged.k_cache, paged.v_cache, paged.block_table
        if call.qv:  # FlashMLA's single cache [c_kv | k_rope]
            built.mla_cache = torch.cat([paged.v_cache, paged.k_cache], dim=-1)
    return call, built
