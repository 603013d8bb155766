"""Seed ``000``'s scenarios: the V0 steps :class:`~conformance.engines.vllm_diff.attention.VllmDifferentialAttention`
replays, two ``engines``-suite cases each (case ids come from this table: keep names and fields stable)."""

from __future__ import annotations

from dataclasses import dataclass

from ..base import Request
from ..v0_graph_common import GraphScenario as V0GraphScenario
from ..v0_graph_common import decodes as _d

__all__ = ["GRAPH_SCENARIOS", "INVARIANCE_SCENARIOS", "NEIGHBOUR_SCENARIOS", "SCENARIOS", "GraphScenario"]

#: scenario -> (requests, prompts first as V0 packs them; heads (H, Hk); block size; window)
SCENARIOS: dict[str, tuple[tuple[Request, ...], tuple[int, int], int, tuple[int | None, int | None]]] = {
    "prefill": ((Request(37), Request(64), Request(5)), (8, 8), 16, (None, None)),
    # a prefix-cache hit (and a chunk of a longer prompt): every prompt read through its block table
    "prefix_cached": ((Request(24, cached=40), Request(16, cached=33), Request(9)), (8, 4), 16, (None, None)),
    # per call 4 query heads on 1 kv head; seq lens across block boundaries
    "decode": ((Request(1, cached=49), Request(1, cached=16), Request(1, cached=128)), (8, 2), 32, (None, None)),
    "mixed": ((Request(30), Request(12), Request(1, cached=39), Request(1, cached=76)), (8, 8), 16, (None, None)),
    # per call 8 query heads on 2 kv heads; sliding window 48 (FA window (47, 0))
    "gqa": ((Request(70), Request(1, cached=90), Request(1, cached=20)), (16, 4), 16, (47, 0)),
}

#: invariance scenarios (:mod:`conformance.engines.invariance`): name -> (invariance kind, batch, heads, block size,
#: window), request 0's rows through the whole layer compared bitwise, the batch the case's ``requests``.  V0 has
#: no batch-invariant mode: a ``batch`` difference is reported, not failed.  Batches of one kind, so every variant
#: keeps V0's prompts-first order; in ``inv_batch_prefill`` request 0 has no cached context, so alone it takes the
#: contiguous prefill call and beside the prefix-cache hits the paged one.
INVARIANCE_SCENARIOS: dict[
    str, tuple[str, tuple[Request, ...], tuple[int, int], int, tuple[int | None, int | None]]
] = {
    "inv_run_mixed": (
        "run",
        (Request(30), Request(12), Request(1, cached=39), Request(1, cached=76)),
        (8, 2),
        16,
        (None, None),
    ),
    "inv_batch_decode": ("batch", tuple(Request(1, cached=c) for c in (90, 49, 16, 128)), (8, 2), 32, (None, None)),
    "inv_batch_prefill": (
        "batch",
        (Request(9), Request(24, cached=40), Request(16, cached=33)),
        (8, 4),
        16,
        (None, None),
    ),
}

#: ``neighbour`` invariance scenarios: name -> (batch, heads (H, Hk), block size, head dim), no window.  Request 0
#: is a 5-token prompt chunk of 3,000 keys (long enough for a split heuristic to split; a prompt, since V0 lists
#: prompts before decodes and request 0 comes first) beside a 129-token prompt chunk after 971 cached tokens, which
#: the invariance cuts to 1 (a decode: its own kvcache call), 9, 10, 64, 65 and 128 new tokens (the prompts'
#: shared prefill call).  Heads as Qwen2.5-0.5B's (d64) and Qwen2.5-7B's (d128) doubled: each call sees GQA 7, as
#: vLLM #51902's 14 / 2 heads.
NEIGHBOUR_SCENARIOS: dict[str, tuple[tuple[Request, ...], tuple[int, int], int, int]] = {
    "inv_neighbour_chunk_d64": ((Request(5, cached=2995), Request(129, cached=971)), (28, 4), 16, 64),
    "inv_neighbour_chunk_d128": ((Request(5, cached=2995), Request(129, cached=971)), (56, 8), 16, 128),
}


@dataclass(frozen=True)
class GraphScenario(V0GraphScenario):
    """A CUDA-graph decode (:mod:`conformance.engines.vllm_diff.graph`): batches captured at a bucket (the first
    batch's size), replayed in order, ``layer`` the case fields; ``shared_kv`` the KV-sharing layer
    (``forward_with_kv_cache_only``) instead of the KV-generating one."""

    shared_kv: bool = False


def _layer(h: int, hk: int, block_size: int) -> dict:
    """A graph scenario's case fields: heads (H, Hk), the cache's ``block_size``; bf16, head_dim 64, causal NHD."""
    return dict(
        num_heads=h, num_kv_heads=hk, head_dim=64, dtype="bf16", kv_layout="NHD", block_size=block_size, causal=True
    )


#: graph scenarios: capture at the bucket, then every smaller batch size (stale rows past them) and the bucket again,
#: with sequences shorter and longer than the capture's; one case each (bf16, head_dim 64).
GRAPH_SCENARIOS: dict[str, GraphScenario] = {
    "graph_decode": GraphScenario(
        (_d(33, 7, 90, 15), _d(120), _d(2, 64), _d(49, 1, 17), _d(70, 8, 111, 30)), _layer(8, 2, 16)
    ),
    # pages of 256 (FA2's paged decode takes only multiples of 256), sequences across a page boundary
    "graph_decode_shared_kv": GraphScenario(
        (_d(300, 20, 130), _d(470, 5), _d(90), _d(260, 3, 64)), _layer(8, 4, 256), shared_kv=True
    ),
}
