"""The engines' support rule for a captured CUDA-graph call (shared by the engines' ``graph`` modules).

An engine captures its decode step once per bucket on its own static buffers and refills them in place before every
replay; the capture, the NaN-poisoned replays and the bitwise comparisons are
:class:`conformance.graphs.captured.CapturedCall`'s, the loop the kernel-level graph mode uses too.
:func:`graph_support` is the engines' support rule: the backend must declare the opt-in ``graph`` (else its reason)
and take the bucket's call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnfast.base import Backend, Support
from conformance.cases.case import AttentionCase

from .base import Request

__all__ = ["GraphScenario", "graph_support"]


def graph_support(backend: Backend, call: AttentionCase, device: str) -> Support:
    """Whether ``backend`` runs the engine's captured ``call``: ``graph`` declared, and the call itself taken."""
    refused = backend.refusals()
    if "graph" in refused:
        return Support(False, f"graph: {refused['graph']}")
    support = backend.supports(call, device)
    if not support:
        return Support(False, f"captured call ({call.summary()}): {support.reason}")
    return Support(True)


@dataclass(frozen=True)
class GraphScenario:
    """Decode batches captured at a bucket (the first batch's size), replayed in order; ``layer`` the case fields.
    The engines' graph scenarios are this or extend it (vLLM V1's adds spec tokens and its builder's modes)."""

    batches: tuple[tuple[Request, ...], ...]
    layer: dict[str, Any] = field(default_factory=dict)

    @property
    def requests(self) -> tuple[Request, ...]:
        return tuple(r for b in self.batches for r in b)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(b) for b in self.batches)
