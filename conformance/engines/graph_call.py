"""The engines' support rule for a captured CUDA-graph call (shared by the engines' ``graph`` modules).

An engine captures its decode step once per bucket on its own static buffers and refills them in place before every
replay; the capture, the NaN-poisoned replays and the bitwise comparisons are
:class:`conformance.graphs.captured.CapturedCall`'s, the loop the kernel-level graph mode uses too.
:func:`graph_support` is the engines' support rule: the backend must declare the opt-in ``graph`` (else its reason)
and take the bucket's call.
"""

from __future__ import annotations

from attnfast.base import Backend, Support
from conformance.cases.case import AttentionCase

__all__ = ["graph_support"]


def graph_support(backend: Backend, call: AttentionCase, device: str) -> Support:
    """Whether ``backend`` runs the engine's captured ``call``: ``graph`` declared, and the call itself taken."""
    refused = backend.refusals()
    if "graph" in refused:
        return Support(False, f"graph: {refused['graph']}")
    support = backend.supports(call, device)
    if not support:
        return Support(False, f"captured call ({call.summary()}): {support.reason}")
    return Support(True)
