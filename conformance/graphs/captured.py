"""One capture / replay / compare loop for every CUDA-graph path (kernel-level graph mode and the engines').

An engine captures its decode step once per bucket on static buffers (block table, sequence lengths, queries, the
cache) and refills them in place before every replay.  :class:`CapturedCall` is that step seen from the harness: a
*graph-safe* forward (a callable returning :class:`~attnfast.base.KernelOutput` that reads the batch from the
buffers only: one adapter's :meth:`~attnfast.base.Backend.prepare_graph`, or an engine's several calls and their
merge), built afresh by ``make()``:

* on CUDA it is warmed up once on a side stream and a fresh one is captured into a ``torch.cuda.CUDAGraph``
  (:func:`capture`); off CUDA nothing is captured and the replays run it eagerly on the buffers (the record's notes
  say so, :data:`NO_CAPTURE`), which still checks the buffer logic with the CPU backends;
* :meth:`CapturedCall.replay` (the buffers already hold the live batch): poison the captured outputs with NaN (a row
  the forward fails to write shows), ``refresh()`` the adapters' host-side state outside the graph (FA3's scheduler
  metadata into its buffer), replay, keep the live rows, and compare them **bitwise** with

  - the same forward prepared afresh and run eagerly on the same buffers (``vs_eager``): a replay must equal it (a
    difference is capture-time state in the replay, e.g. a plan computed for the capture batch);
  - the batch's own eager call (``vs_plain``: only the live requests, their exact key counts, ``own(requests)``),
    what an engine without graphs runs: the *graph vs eager* invariance.  A difference fails only where the split
    count is pinned (``pinned``: vLLM's batch-invariant mode, SGLang's deterministic inference).

  Every replay is recorded (``replays``: ``{"requests", "vs_eager", "vs_plain"}``, what the report's invariance
  matrix reads) and a broken comparison appended to ``problems`` (the composition's failures beyond the numbers).

:meth:`CapturedCall.kernel` builds one for a single adapter call over a bucket's buffers, with the own call
:func:`own_inputs`: the buffers' first rows as an ordinary call, every per-row input sliced to the live batch
(``q`` and MLA's ``qv``, ``k_new``/``v_new``, the ``cu_seqlens``, ``seqlens_k``, the block table,
``cp_tot_seqused_k``; contiguous ``k``/``v`` to the live keys).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from attnfast.base import Backend, KernelOutput
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from .bitwise import Diff, diff_rows

__all__ = ["NO_CAPTURE", "CapturedCall", "capture", "live_rows", "own_inputs", "run_poisoned"]

#: Why nothing is captured off CUDA (the record's note).
NO_CAPTURE = "not captured: CUDA graphs need a CUDA device; each replay ran the graph-safe call eagerly on the buffers"

Forward = Callable[[], KernelOutput]
Requests = Sequence[tuple[int, int]]


def _poison(res: KernelOutput) -> None:
    res.out.fill_(float("nan"))
    if res.lse is not None:
        res.lse.fill_(float("nan"))


def live_rows(res: KernelOutput, rows: int) -> KernelOutput:
    """Copies of the first ``rows`` query rows (the real requests; padded rows follow)."""
    return KernelOutput(res.out[:rows].clone(), None if res.lse is None else res.lse[:, :rows].clone())


def run_poisoned(run: Forward, outputs: Any) -> KernelOutput:
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
    """A captured graph: ``refresh()`` runs the forward's host-side update, ``()`` replays and returns the captured
    outputs (``result``)."""

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


def capture(make: Callable[[], Any]) -> tuple[Forward, Any]:
    """Warm up one prepared forward on a side stream, then capture a fresh one; returns (replay, captured)."""
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


def _cut(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if t is None else t[:n]


def own_inputs(call: AttentionCase, inputs: CaseInputs, requests: Requests) -> CaseInputs:
    """The live batch (the buffers' first ``len(requests)`` requests, ``(q_len, kv_len)`` each) as an ordinary
    call: ``call`` with the live requests, views of every per-row input cut to them."""
    n, rows = len(requests), sum(q for q, _ in requests)
    if inputs.quant is not None:
        raise ValueError("quant: a captured call's own eager call does not cut quantized inputs to the live batch")
    keys = int(inputs.cu_seqlens_k[n])
    contiguous = inputs.block_table is None
    return dataclasses.replace(
        inputs,
        case=call.replace(requests=tuple(requests)),
        q=inputs.q[:rows],
        qv=_cut(inputs.qv, rows),
        k=inputs.k[:keys] if contiguous else inputs.k,
        v=inputs.v[:keys] if contiguous else inputs.v,
        k_new=_cut(inputs.k_new, rows),
        v_new=_cut(inputs.v_new, rows),
        cu_seqlens_q=inputs.cu_seqlens_q[: n + 1],
        cu_seqlens_k=inputs.cu_seqlens_k[: n + 1],
        seqlens_k=inputs.seqlens_k[:n],
        block_table=_cut(inputs.block_table, n),
        cp_tot_seqused_k=_cut(inputs.cp_tot_seqused_k, n),
    )


@dataclass
class CapturedCall:
    """A graph-safe forward captured once (CUDA) or run eagerly (CPU), replayed and compared (module docstring).

    ``make``: a fresh graph-safe forward over the buffers; ``own``: the live batch's own eager call, given the live
    requests; ``notes`` / ``problems``: the composition's lists (appended to); ``pinned``: the pinned split count
    under which ``vs_plain`` must hold too (None: it is recorded only); ``what``: how the problems name the
    forward."""

    make: Callable[[], Forward]
    own: Callable[[Requests], KernelOutput]
    device: str
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    pinned: int | None = None
    what: str = "call"
    replays: list[dict[str, Any]] = field(default_factory=list)
    captured: bool = False

    def __post_init__(self) -> None:
        self._replay: Any
        if self.device.startswith("cuda"):
            self._replay, self._outputs = capture(self.make)
            self.captured = True
        else:
            self.notes.append(NO_CAPTURE)
            self._replay = self._outputs = self.make()

    @classmethod
    def kernel(
        cls,
        backend: Backend,
        device: str,
        call: AttentionCase,
        inputs: CaseInputs,
        notes: list[str] | None = None,
        problems: list[str] | None = None,
        pinned: int | None = None,
    ) -> CapturedCall:
        """``backend``'s graph-safe call of ``call`` (the bucket's) over the buffers ``inputs``; the own call is
        ``backend.prepare`` on :func:`own_inputs`."""

        def own(requests: Requests) -> KernelOutput:
            ins = own_inputs(call, inputs, requests)
            return backend.prepare(ins.case, ins)()

        return cls(
            lambda: backend.prepare_graph(call, inputs),
            own,
            device,
            [] if notes is None else notes,
            [] if problems is None else problems,
            pinned,
        )

    def replay(self, requests: Requests, where: str = "") -> tuple[KernelOutput, Diff, Diff]:
        """Replay on the buffers as they are now (``requests``: the live batch's ``(q_len, kv_len)``, in the first
        rows); the live rows, how they differ from the same forward prepared afresh and run eagerly on the same
        buffers (``vs_eager``), and from the batch's own eager call (``vs_plain``).  Records the replay, and a
        broken comparison in ``problems`` (``where`` describes the batch there, default its request count)."""
        rows = sum(q for q, _ in requests)
        got = live_rows(run_poisoned(self._replay, self._outputs), rows)
        eager = self.make()
        same = live_rows(run_poisoned(eager, eager), rows)
        plain = live_rows(self.own(requests), rows)
        vs_eager, vs_plain = diff_rows(got, same), diff_rows(got, plain)
        i, where = len(self.replays), where or f"{len(requests)} requests"
        self.replays.append({"requests": len(requests), "vs_eager": vs_eager.to_json(), "vs_plain": vs_plain.to_json()})
        if not vs_eager.equal:
            self.problems.append(
                f"graph: replay {i} ({where}) differs from the same {self.what} run eagerly on the same buffers: "
                f"{vs_eager.describe()}"
            )
        if self.pinned is not None and not vs_plain.equal:
            self.problems.append(
                f"graph vs eager: replay {i} ({where}) with num_splits pinned to {self.pinned} differs from the "
                f"batch's own eager {self.what}: {vs_plain.describe()}"
            )
        return got, vs_eager, vs_plain

    def summary(self, bucket: dict[str, Any], **more: Any) -> dict[str, Any]:
        """The record's ``extra["graph"]``: captured or not, the bucket, every replay, whether every replay equals
        its own eager call (``graph_vs_eager_kept``), whether that was promised (a pinned split count)."""
        return {
            "captured": self.captured,
            "bucket": bucket,
            **more,
            "replays": self.replays,
            "graph_vs_eager_kept": all(r["vs_plain"]["equal"] for r in self.replays),
            "promised": self.pinned is not None,
        }
