"""Validation of a case's CUDA-graph and invariance fields (``graph``, ``graph_fill``, ``invariance``).

Kept apart from :mod:`conformance.cases.case` so the case module stays about the call itself; what the fields
mean, and how such a case is run, is :mod:`conformance.graphs`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from conformance.cases.case_json import show

__all__ = ["INVARIANCES", "graph_problems"]

#: The invariance kinds a case can ask for (``AttentionCase.invariance``), what each compares bitwise.
INVARIANCES: dict[str, str] = {
    "run": "the same call twice",
    "batch": "a request alone, inside the batch, at another position, and beside requests of other lengths",
    "splits": "num_splits 1, pinned values (2, 3) and the kernel's own heuristic",
    "neighbour": "request 0 beside request 1, alone, and beside request 1 cut to 1, 9, 10, 64, 65, 128 and 129 "
    "query tokens (the neighbour grows by one token and by one tile, and turns from decode to prefill)",
}


def graph_problems(case: Any) -> Iterator[str]:
    """One message per violated constraint of the graph and invariance fields (naming the field)."""
    if case.graph:
        yield from _graph_problems(case)
    elif case.graph_fill:
        yield f"graph_fill applies only to a graph case (graph set), got graph_fill={case.graph_fill}"
    if not isinstance(case.invariance, str):  # "" is no invariance; None or another type is no kind at all
        yield f"invariance must be a string, '' or one of {sorted(INVARIANCES)}, got {show(case.invariance)}"
    elif case.invariance:
        if case.invariance not in INVARIANCES:
            yield f"invariance must be one of {sorted(INVARIANCES)}, got {show(case.invariance)}"
        if case.graph:
            yield "invariance cannot be combined with graph (each is a composition of its own)"
        if case.engine and case.invariance == "splits":
            yield (
                "invariance 'splits' is kernel level: an engine sets its own split count (engines: run, batch, "
                "neighbour)"
            )
        if case.invariance == "batch" and case.batch < 2:
            yield f"invariance 'batch' needs at least 2 requests, got {case.batch}"
        if case.invariance == "neighbour":
            if case.batch != 2:
                yield f"invariance 'neighbour' needs exactly 2 requests (target, then neighbour), got {case.batch}"
            elif case.requests[1][0] < 2:
                yield "invariance 'neighbour' needs a neighbour (requests[1]) of at least 2 query tokens to cut"
        if case.invariance == "splits" and case.num_splits is not None:
            yield "invariance 'splits' chooses num_splits itself: leave num_splits None"


def _graph_problems(case: Any) -> Iterator[str]:
    if any(n < 1 for n in case.graph):
        yield f"graph must list replay batch sizes >= 1 (capture batch first), got {show(case.graph)}"
        return
    if sum(case.graph) != case.batch:
        yield (
            f"graph sizes {show(case.graph)} must add up to the number of requests ({case.batch}): the requests are "
            "the replay batches one after the other"
        )
    if not case.paged:
        yield "graph needs a paged case (kv_layout NHD or HND): engines capture decode over their paged cache"
    q_lens = set(case.q_lens)
    if len(q_lens) != 1 or min(q_lens) < 1:
        yield f"graph needs one q_len >= 1 for every request (decode or verify buckets), got {show(sorted(q_lens))}"
    if any(kl < 1 for kl in case.kv_lens):
        yield "graph needs kv_len >= 1 for every request"
    if case.graph_fill not in (0, 1):
        yield f"graph_fill must be 0 (vLLM's padded seq_lens) or 1 (SGLang's fill value), got {case.graph_fill}"
    if case.append:  # an engine case (``engine`` set) replays its engine's own CUDA-graph path instead
        yield "graph cannot be combined with append (kernel-level graph mode replays plain decode calls)"
    if case.quant != "none":
        yield "graph cannot be combined with quant yet: the bucket buffers hold the activation dtype only"
    if case.cp_world > 1 or case.v_padded:
        yield "graph cannot be combined with cp or v_padded"
