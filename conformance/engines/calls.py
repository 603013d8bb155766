"""Building blocks the engine replays share: describing a kernel call.

* :func:`scenario_cases`: an engine's cases, each scenario's requests under each variant's fields;
* :func:`call_case` turns the layer's case into the case of one call (its requests and options);
* :func:`contiguous_call` / :func:`paged_call` build a :class:`~conformance.engines.base.Call` from the
  engine's tensors (what an adapter's ``prepare`` reads: packed ``q``, packed or paged keys, block table);
* :func:`tree_sequences`: top-k > 1 tree attention as plain attention.

An engine's paged cache (block manager, slot mapping, ``reshape_and_cache``) is :mod:`conformance.cases.paged_kv`,
a layer below, which the invariance batches of :mod:`conformance.graphs` use too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from attnref import gather_kv
from attnref.paged import as_layout
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.cases.paged_kv import PagedKV, cu_seqlens, prefix_sums

from .base import Call, Request, call_inputs

__all__ = ["call_case", "contiguous_call", "paged_call", "scenario_cases", "tree_sequences"]


def scenario_cases(
    engine: str, scenarios: Mapping[str, Sequence[Request]], variants: Sequence[Mapping[str, Any]]
) -> list[AttentionCase]:
    """An engine's cases: each scenario's requests (new tokens, keys) under each variant's case fields (heads,
    dims, dtype, ...), in scenario order."""
    return [
        AttentionCase(requests=tuple((r.new, r.kv) for r in reqs), engine=engine, scenario=scenario, **variant)
        for scenario, reqs in scenarios.items()
        for variant in variants
    ]


def call_case(layer: AttentionCase, requests: Sequence[tuple[int, int]], **changes) -> AttentionCase:
    """The case of one kernel call: the layer's configuration with this call's ``(q_len, kv_len)`` requests and
    option changes (``causal``, ``window``, ``kv_layout``, ``block_size``, ...); a plain call, not a replay nor an
    invariance (an engine invariance case's calls are each variant's)."""
    fields = dict(engine="", scenario="", batch_name="", append=False, invariance="") | changes
    return layer.replace(requests=tuple((int(q), int(k)) for q, k in requests), **fields)


def _packed_inputs(
    case: AttentionCase, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **tensors: torch.Tensor | None
) -> CaseInputs:
    """A call's inputs over packed ``q``/``k``/``v``, the case's requests as their cumulative lengths."""
    dev = q.device
    cu_q, cu_k = cu_seqlens(case.q_lens, dev), cu_seqlens(case.kv_lens, dev)
    return call_inputs(case, q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **tensors)


def contiguous_call(
    label: str,
    case: AttentionCase,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
) -> Call:
    """A call over packed keys: request ``b``'s queries ``q[cu_q[b]:cu_q[b+1]]`` see ``k[cu_k[b]:cu_k[b+1]]``."""
    return Call(label, case, _packed_inputs(case, q, k, v, sinks=sinks, alibi_slopes=alibi_slopes, qv=qv))


def paged_call(
    label: str,
    case: AttentionCase,
    q: torch.Tensor,
    paged: PagedKV,
    block_table: torch.Tensor,
    *,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    qv: torch.Tensor | None = None,
) -> Call:
    """A call over a paged cache: request ``b`` sees the first ``case.kv_lens[b]`` keys of ``block_table[b]``.

    ``case`` must carry the cache's layout and block size.  The packed ``k``/``v`` of the inputs are the keys
    read back through the table (only reference-reading fakes use them)."""
    if not case.paged or case.block_size != paged.block_size or case.kv_layout != paged.layout:
        raise ValueError(
            f"case must describe the cache: layout {paged.layout}, block size {paged.block_size}; "
            f"got {case.kv_layout}, {case.block_size}"
        )
    k, _ = gather_kv(paged.k_cache, block_table, case.kv_lens, as_layout(paged.layout))
    v, _ = gather_kv(paged.v_cache, block_table, case.kv_lens, as_layout(paged.layout))
    cache = {"k_cache": paged.k_cache, "v_cache": paged.v_cache, "block_table": block_table}
    return Call(label, case, _packed_inputs(case, q, k, v, **cache, sinks=sinks, alibi_slopes=alibi_slopes, qv=qv))


def tree_sequences(
    layer: AttentionCase,
    inputs: CaseInputs,
    prefix_lens: Sequence[int],
    paths: Sequence[Sequence[int]],
    **changes,
) -> tuple[AttentionCase, CaseInputs]:
    """Top-k > 1 tree attention as plain attention (SGLang's verify and draft decode): for request ``b`` and each
    path, one sequence of one query over the request's first ``prefix_lens[b]`` keys and the draft tokens the path
    names (offsets past the prefix), packed from ``inputs``' contiguous keys; query rows in (request, path) order.
    ``changes`` go to the call's case (:func:`call_case`)."""
    cu = [int(x) for x in inputs.cu_seqlens_k.tolist()]
    idx, reqs = [], []
    for b, s in enumerate(prefix_lens):
        for path in paths:
            keys = list(range(cu[b], cu[b] + s)) + [cu[b] + s + j for j in path]
            idx += keys
            reqs.append((1, len(keys)))
    call = call_case(layer, reqs, kv_layout="contiguous", block_size=None, causal=True, **changes)
    dev = inputs.device
    sel = torch.tensor(idx, device=dev)
    ins = call_inputs(
        call,
        q=inputs.q,
        k=inputs.k[sel],
        v=inputs.v[sel],
        cu_seqlens_q=torch.arange(len(reqs) + 1, device=dev),
        cu_seqlens_k=torch.tensor(prefix_sums([n for _, n in reqs]), device=dev),
        sinks=inputs.sinks,
    )
    return call, ins
