"""Seed ``000``'s scenarios: the V0 steps :class:`~conformance.engines.vllm_diff.attention.VllmDifferentialAttention`
replays, two ``engines``-suite cases each (case ids come from this table: keep names and fields stable)."""

from __future__ import annotations

from ..base import Request

__all__ = ["SCENARIOS"]

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
