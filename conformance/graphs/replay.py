"""Kernel-level CUDA-graph mode: capture a kernel call on a bucket's buffers, replay it for every batch of the case.

A graph case (``AttentionCase.graph``, :mod:`conformance.graphs.buffers`) is judged like an engine replay
(:mod:`conformance.engines.base`): its requests are the replay batches one after the other, the reference is
plain attention of every request (each request's output depends on its own keys only), and the backend's
"output" is what the replays produced for the real requests, batch after batch.  :class:`GraphRun` does what an
engine does:

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
  mode, SGLang's deterministic inference) they promise not to, and a difference is a failure (on a backend that
  takes a split count at all: :func:`pins_splits`).

On a CPU device nothing is captured: the replays run the graph-safe call eagerly on the buffers, which still
checks the buffer logic (padding, stale table entries, live key counts) with the CPU backends; the record's
notes say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnfast.base import Backend, KernelOutput, Support
from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from .bitwise import diff_rows
from .buffers import GraphBuffers
from .composed import ComposedRun

__all__ = ["GRAPH", "GraphReplay", "GraphRun", "capture", "live_rows", "pins_splits", "run_poisoned"]

#: Why nothing is captured off CUDA (the record's note).
NO_CAPTURE = "not captured: CUDA graphs need a CUDA device; each replay ran the graph-safe call eagerly on the buffers"


def _poison(res: KernelOutput) -> None:
    res.out.fill_(float("nan"))
    if res.lse is not None:
        res.lse.fill_(float("nan"))


def live_rows(res: KernelOutput, rows: int) -> KernelOutput:
    """Copies of the first ``rows`` query rows (the real requests; padded rows follow)."""
    return KernelOutput(res.out[:rows].clone(), None if res.lse is None else res.lse[:, :rows].clone())


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
        call = bucket.call_case(case)
        cuda = self.device.startswith("cuda")
        self.notes.append(
            f"bucket: {bucket.batch} requests x {bucket.q_len} queries, {bucket.width} pages of {bucket.block_size} "
            f"(capacity {bucket.capacity} keys), padded requests at seqused_k = {bucket.fill}"
        )
        replay: Callable[[], KernelOutput]
        if cuda:
            replay, captured = capture(lambda: backend.prepare_graph(call, buffers.inputs))
        else:
            self.notes.append(NO_CAPTURE)
            fn = backend.prepare_graph(call, buffers.inputs)
            replay, captured = fn, fn
        outs, lses, replays = [], [], []
        pinned = pins_splits(case, backend, self.device)
        for i, group in enumerate(groups):
            if i:
                buffers.write(case, self.inputs, group)
            rows = len(group) * bucket.q_len
            res = run_poisoned(replay, captured)
            got = live_rows(res, rows)
            # the same call, never captured, prepared afresh for this batch as an engine's eager step would be (a
            # plan kept from an earlier batch is the stale-metadata bug, e.g. FlashMLA's sched_meta reused)
            eager = backend.prepare_graph(call, buffers.inputs)
            same = live_rows(run_poisoned(eager, eager), rows)
            exact_case = buffers.exact(case, group)
            plain = backend.prepare(exact_case.case, exact_case)()
            vs_eager, vs_plain = diff_rows(got, same), diff_rows(got, plain)
            replays.append({"requests": len(group), "vs_eager": vs_eager.to_json(), "vs_plain": vs_plain.to_json()})
            if not vs_eager.equal:
                self.problems.append(
                    f"graph: replay {i} ({len(group)} requests) differs from the same call run eagerly on the same "
                    f"buffers: {vs_eager.describe()}"
                )
            if pinned and not vs_plain.equal:
                self.problems.append(
                    f"graph vs eager: replay {i} ({len(group)} requests) with num_splits pinned to {case.num_splits} "
                    f"differs from the batch's own eager call: {vs_plain.describe()}"
                )
            outs.append(got.out)
            if got.lse is not None:
                lses.append(got.lse)
        self.extra["graph"] = {
            "captured": cuda,
            "bucket": {"batch": bucket.batch, "q_len": bucket.q_len, "width": bucket.width, "fill": bucket.fill},
            "replays": replays,
            "graph_vs_eager_kept": all(r["vs_plain"]["equal"] for r in replays),
            "promised": pinned,
        }
        lse = torch.cat(lses, dim=1) if len(lses) == len(outs) else None
        return KernelOutput(torch.cat(outs), lse)


def pins_splits(case: AttentionCase, backend: Backend, device: str) -> bool:
    """Whether ``case`` pins the split count on ``backend``: ``num_splits`` set, and the backend takes a split
    count (it supports the same call with ``num_splits = 2``); a kernel without the argument has nothing pinned."""
    if case.num_splits is None:
        return False
    probe = case.replace(num_splits=2, graph=(), graph_fill=0, invariance="", requests=case.requests[:1])
    return bool(backend.supports(probe, device))


def run_poisoned(run: Callable[[], KernelOutput], outputs: Any) -> KernelOutput:
    """Poison the outputs the run writes (the captured result for a graph), refresh, run; the outputs."""
    target = getattr(outputs, "result", None)
    if isinstance(target, KernelOutput):
        _poison(target)
    refresh = getattr(run, "refresh", None)
    if refresh is not None:
        refresh()
    return run()


@dataclass
class _Captured:
    """A captured graph: ``refresh()`` runs the adapter's host-side update, ``()`` replays and returns the
    captured outputs (``result``)."""

    graph: Any
    kernel: Any
    result: KernelOutput

    def refresh(self) -> None:
        fn = getattr(self.kernel, "refresh", None)
        if fn is not None:
            fn()

    def __call__(self) -> KernelOutput:
        self.graph.replay()
        torch.cuda.synchronize()
        return self.result


def capture(make: Callable[[], Any]) -> tuple[Callable[[], KernelOutput], Any]:
    """Warm up one prepared call on a side stream, then capture a fresh one; returns (replay, captured)."""
    warm = make()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        if hasattr(warm, "refresh"):
            warm.refresh()
        warm()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    kernel = make()
    if hasattr(kernel, "refresh"):
        kernel.refresh()
    graph = torch.cuda.CUDAGraph()
    caller = torch.cuda.current_stream()
    try:
        with torch.cuda.graph(graph):
            result = kernel()
    except Exception:
        # torch.cuda.graph's __exit__ skips restoring the stream when capture_end raises (as perf/timing.py's
        # capture handles it): put the caller's stream back so the worker's next case does not run on it
        torch.cuda.set_stream(caller)
        raise
    if not isinstance(result, KernelOutput):
        raise TypeError(f"the graph-mode callable must return KernelOutput, got {type(result).__name__}")
    captured = _Captured(graph, kernel, result)
    return captured, captured


class GraphReplay:
    """The composition that judges a graph case (what :mod:`conformance.verdict.check` uses for ``case.graph``)."""

    name = "graph"

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
