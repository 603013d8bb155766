"""The captured kernel call an engine's CUDA-graph path replays (shared by the engines' ``graph`` modules).

An engine captures its decode step once per bucket on its own static buffers (block table, sequence lengths,
queries, the cache) and refills them in place before every replay.  :class:`CapturedCall` is the kernel side of
that: the backend's graph-safe call (:meth:`attnfast.base.Backend.prepare_graph`) of the bucket's call case over
those buffers, captured on CUDA with :mod:`conformance.graphs.replay`'s warm-up-then-capture, or run eagerly on the
buffers off CUDA (the CPU backends).  :meth:`CapturedCall.replay` poisons the captured outputs with NaN, refreshes
the adapter's host-side state, replays, and compares the real rows bitwise with the same call prepared afresh and
run eagerly on the same buffers (a replay must equal it) and with the batch's own eager call (its real requests
and key counts, what the engine runs without graphs: the *graph vs own call* invariance, recorded as
``vs_plain`` in the record's ``extra["graph"]["replays"]``, the shape the report's invariance matrix reads).

:func:`graph_support` is the engines' support rule: the backend must declare the opt-in ``graph`` (else its reason)
and take the bucket's call.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from attnfast.base import Backend, KernelOutput, Support
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.graphs.bitwise import Diff, diff_rows
from conformance.graphs.replay import NO_CAPTURE, capture, live_rows, run_poisoned

__all__ = ["CapturedCall", "graph_support"]


def graph_support(backend: Backend, call: AttentionCase, device: str) -> Support:
    """Whether ``backend`` runs the engine's captured ``call``: ``graph`` declared, and the call itself taken."""
    refused = backend.refusals()
    if "graph" in refused:
        return Support(False, f"graph: {refused['graph']}")
    support = backend.supports(call, device)
    if not support:
        return Support(False, f"captured call ({call.summary()}): {support.reason}")
    return Support(True)


@dataclass
class CapturedCall:
    """``backend``'s graph-safe call of ``call`` over the buffers ``inputs``, captured once (CUDA) or run eagerly."""

    backend: Backend
    device: str
    call: AttentionCase
    inputs: CaseInputs
    notes: list[str] = field(default_factory=list)
    captured: bool = False

    def __post_init__(self) -> None:
        make = lambda: self.backend.prepare_graph(self.call, self.inputs)  # noqa: E731
        self._replay: Any
        if self.device.startswith("cuda"):
            self._replay, self._outputs = capture(make)
            self.captured = True
        else:
            self.notes.append(NO_CAPTURE)
            self._replay = self._outputs = make()

    def replay(self, requests: list[tuple[int, int]]) -> tuple[KernelOutput, Diff, Diff]:
        """Replay on the buffers as they are now (``requests``: the live batch's ``(q_len, kv_len)``, in the first
        rows); the live rows, how they differ from the same call prepared afresh and run eagerly on the same
        buffers, and from the batch's own eager call."""
        rows = sum(q for q, _ in requests)
        got = live_rows(run_poisoned(self._replay, self._outputs), rows)
        eager = self.backend.prepare_graph(self.call, self.inputs)
        same = live_rows(run_poisoned(eager, eager), rows)
        return got, diff_rows(got, same), diff_rows(got, self.own_call(requests))

    def own_call(self, requests: list[tuple[int, int]]) -> KernelOutput:
        """The batch's ordinary call: views of the buffers' first rows, the batch's own case."""
        buf, n = self.inputs, len(requests)
        rows = sum(q for q, _ in requests)
        case = self.call.replace(requests=tuple(requests))
        assert buf.block_table is not None
        inputs = dataclasses.replace(
            buf,
            case=case,
            q=buf.q[:rows],
            cu_seqlens_q=buf.cu_seqlens_q[: n + 1],
            cu_seqlens_k=buf.cu_seqlens_k[: n + 1],
            seqlens_k=buf.seqlens_k[:n],
            block_table=buf.block_table[:n],
        )
        return live_rows(self.backend.prepare(case, inputs)(), rows)
