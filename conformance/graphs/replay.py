"""Kernel-level CUDA-graph mode: capture a kernel call on a bucket's buffers, replay it for every batch of the case.

A graph case (``AttentionCase.graph``, :mod:`conformance.graphs.buffers`) is judged like an engine replay
(:mod:`conformance.engines.base`): its requests are the replay batches one after the other, the reference is
plain attention of every request (each request's output depends on its own keys only), and the backend's
"output" is what the replays produced for the real requests, batch after batch.  :class:`GraphRun` does what an
engine does, through the capture / replay / compare loop every graph path shares
(:class:`~conformance.graphs.captured.CapturedCall`):

1. allocate the bucket's buffers and write the capture batch into them;
2. ``backend.prepare_graph(bucket call, buffers)`` (the adapter's graph-safe call, :mod:`attnfast.base`), run it
   once eagerly on a side stream (warm-up: JIT compilation, workspace allocation), then prepare a fresh one and
   capture it into a ``torch.cuda.CUDAGraph``;
3. for every batch, the capture batch included: write it into the buffers in place, poison the captured outputs
   with NaN (a row the kernel fails to write shows), call the adapter's ``refresh()`` (host-side metadata such as
   FA3's scheduler metadata into its buffer), replay, and keep the real requests' rows.

Beside the numerical verdict, each replay is compared **bitwise** with

* the same graph-safe call run eagerly on the same buffers: a graph replay must equal it (a difference is a
  failure: capture-time state in the replay, e.g. a plan computed for the capture batch);
* the batch's ordinary eager call (its own case: real key counts and ``max_seqlen_k``), what an engine without
  graphs runs: the *graph vs eager* invariance.  Kernels may legitimately differ here (a split heuristic that
  reads ``max_seqlen_k`` or the batch size); with ``num_splits`` pinned by the case (vLLM's batch-invariant
  mode, SGLang's deterministic inference) they promise not to, and a difference is a failure (on a backend whose
  call takes the split count: :meth:`~attnfast.base.Backend.pins_splits`, read from the adapter's
  ``batch_invariance_via``).

On a CPU device nothing is captured: the replays run the graph-safe call eagerly on the buffers, which still
checks the buffer logic (padding, stale table entries, live key counts) with the CPU backends; the record's
notes say so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnfast.base import Backend, KernelOutput, Support
from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from .buffers import GraphBuffers, bucket_refusal
from .captured import CapturedCall
from .composed import ComposedRun

__all__ = ["GRAPH", "GraphReplay", "GraphRun", "composition_for"]


@dataclass
class GraphRun(ComposedRun):
    """The callable :meth:`GraphReplay.prepare` returns (what the verdict calls): every replay of the case."""

    seed: int = 0

    def run(self) -> KernelOutput:
        case, backend = self.case, self.backend
        buffers = GraphBuffers.allocate(case, self.inputs, self.seed)
        bucket = buffers.bucket
        groups = bucket.groups(case)
        buffers.write(case, self.inputs, groups[0])
        self.notes.append(
            f"bucket: {bucket.batch} requests x {bucket.q_len} queries, {bucket.width} pages of {bucket.block_size} "
            f"(capacity {bucket.capacity} keys), padded requests at seqused_k = {bucket.fill}"
        )
        pinned = case.num_splits if backend.pins_splits(bucket.call_case(case)) else None
        # the eager forward is prepared afresh for every batch, as an engine's eager step would be (a plan kept from
        # an earlier batch is the stale-metadata bug, e.g. FlashMLA's sched_meta reused)
        captured = CapturedCall.kernel(
            backend, self.device, bucket.call_case(case), buffers.inputs, self.notes, self.problems, pinned
        )
        outs, lses = [], []
        for i, group in enumerate(groups):
            if i:
                buffers.write(case, self.inputs, group)
            got, _, _ = captured.replay([case.requests[r] for r in group])
            outs.append(got.out)
            if got.lse is not None:
                lses.append(got.lse)
        b = {"batch": bucket.batch, "q_len": bucket.q_len, "width": bucket.width, "fill": bucket.fill}
        self.extra["graph"] = captured.summary(b)
        lse = torch.cat(lses, dim=1) if len(lses) == len(outs) else None
        return KernelOutput(torch.cat(outs), lse)


class GraphReplay:
    """The composition that judges a graph case (what :mod:`conformance.verdict.check` uses for ``case.graph``)."""

    name = "graph"

    def refuses(self, case: AttentionCase) -> str:
        """What no backend can run through a bucket (:func:`~conformance.graphs.buffers.bucket_refusal`)."""
        return bucket_refusal(case)

    def supports(self, case: AttentionCase, backend: Backend, device: str) -> Support:
        """The backend must declare ``graph`` and take the bucket's call and every batch's own call."""
        support = backend.supports(case, device)
        if not support:
            return support
        from .buffers import Bucket

        bucket = Bucket.of(case)
        call = bucket.call_case(case)
        support = backend.supports(call, device)
        if not support:
            return Support(False, f"bucket call ({call.summary()}): {support.reason}")
        for i, group in enumerate(bucket.groups(case)):
            batch = call.replace(requests=tuple(case.requests[r] for r in group))
            support = backend.supports(batch, device)
            if not support:
                return Support(False, f"replay {i} eager call: {support.reason}")
        return Support(True)

    def prepare(
        self, case: AttentionCase, inputs: CaseInputs, backend: Backend, device: str, seed: int = 0
    ) -> GraphRun:
        return GraphRun(case, inputs, backend, device, seed=seed)

    def reference(self, case: AttentionCase, inputs: CaseInputs) -> AttnResult:
        from conformance.verdict.reference import reference

        return reference(case, inputs)

    def baseline(self, case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        from conformance.verdict.baseline import baseline

        return baseline(case, inputs)


GRAPH = GraphReplay()


def composition_for(case: AttentionCase) -> GraphReplay:
    """The composition of a ``graph`` case (:data:`conformance.verdict.composition.COMPOSITIONS`)."""
    return GRAPH
