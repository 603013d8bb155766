"""Seed ``001``'s full-CUDA-graph path: the builder's graph fields and AOT scheduling, and decode steps captured at a
bucket and replayed for every batch size up to it (the graph scenarios of the engine ``vllm_v1_fa``).

What the seed's ``FlashAttentionMetadataBuilder`` writes (:class:`V1GraphBuilder`, literally):

* ``__init__``: with full CUDA graphs and ``aot_schedule``, a preallocated ``scheduler_metadata`` buffer of
  ``1 + round_up(max_batch_size, 4) * 4`` int32 zeros (``max_batch_size = max(max_num_seqs, max_cudagraph_size)``;
  the seed's comment: the tile-count semaphore plus four vectors per batch element) and ``max_num_splits =
  flash_attn_max_num_splits_for_cuda_graph`` (vLLM's ``AttentionConfig`` default 32);
* ``build``: ``max_num_splits`` = the graph bound when ``num_actual_tokens <= max_cudagraph_size``, 1 in
  batch-invariant mode (``vllm_is_batch_invariant()``); ``get_scheduler_metadata(..., num_splits=max_num_splits)``
  (AOT) copied into the buffer, the rest zeroed, the metadata a view of the buffer.  The fork then re-assigns
  ``max_num_splits = 0`` and, inside the copy branch, ``max_num_splits = self.max_num_splits`` when the batch fits
  the graph (old upstream code kept beside the new; the indentation is lost in the seed text, the nesting is old
  upstream's), so in batch-invariant mode the metadata is scheduled with 1 split and the call passes the graph
  bound (recorded in ``extra["graph"]``; :attr:`V1GraphBuilder.splits_as_fork` False replays upstream's single
  assignment).  The fork's ``__init__`` sets ``aot_schedule = False`` (its decode kernel takes no scheduler
  metadata); a scenario with ``aot`` replays the build with it on, as upstream FA3 sets it, and the decode call as
  upstream's forward makes it (``scheduler_metadata``, ``num_splits = max_num_splits``).

The runner side (vLLM's model runner, not in the seed): the bucket's persistent buffers (block table rows past a
request's pages and rows past the live batch keep what earlier batches wrote; ``seq_lens`` of padded requests 0;
queries at ``q_len`` per request), the cache written through shuffled blocks for every batch, the builder called
with the padded batch (``num_reqs`` = the bucket, as full-graph mode pads it).

Checks beyond the layer's numerical verdict (each replay; the callable's ``problems``):

* the graph's output equals the same call run eagerly on the same buffers, bitwise;
* ``num_splits``: the builder's ``max_num_splits`` at replay equals the value the graph captured (a captured call
  keeps its capture-time split count whatever the builder computes later);
* ``scheduler_metadata`` (AOT): the preallocated buffer holds exactly the metadata scheduled for the live batch
  (the live ``seq_lens`` and split count), zeros after it (a plan of the capture batch reused shows).

Off CUDA the AOT scheduler is :func:`host_scheduler_metadata`, a host model with the seed's size and inputs (its
values are not FA3's; what is checked is that the buffer holds the live batch's); on CUDA with vLLM's FA3 it is
``get_scheduler_metadata``.  Bad input raises ``ValueError`` naming the field and the bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from attnfast.base import KernelOutput
from attnref import write_kv_cache
from attnref.paged import as_layout
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.graphs.captured import CapturedCall
from conformance.graphs.composed import ComposedRun

from ..base import Request
from ..calls import STALE, call_case
from ..graph_call import GraphScenario as BaseGraphScenario
from .graph_builder import GraphMetadata, V1GraphBuilder, graph_scheduler, host_scheduler_metadata
from .metadata import cdiv
from .runner import allocate_kv_cache

__all__ = [
    "GRAPH_SCENARIOS",
    "GraphScenario",
    "V1GraphRun",
    "captured_call",
    "check_graph_case",
    "graph_case",
]


@dataclass(frozen=True)
class GraphScenario(BaseGraphScenario):
    """Decode steps captured at a bucket: ``batches`` the replay batches (capture first, the bucket's size),
    ``layer`` the case fields, ``spec_tokens`` draft tokens per request (``q_len = 1 + spec_tokens``), ``aot`` the
    builder's ``aot_schedule``, ``batch_invariant`` vLLM's batch-invariant mode."""

    spec_tokens: int = 0
    aot: bool = False
    batch_invariant: bool = False


def _decodes(q_len: int, *cached: int) -> tuple[Request, ...]:
    return tuple(Request(new=q_len, cached=c) for c in cached)


_L = dict(num_heads=8, num_kv_heads=2, head_dim=64, dtype="bf16", causal=True)

#: Capture at the bucket, replay shorter batches and the bucket again, with key counts shorter and longer than the
#: capture's; ``graph_decode_aot`` has a request of 3000 keys in a replay, long enough for FA3's scheduler metadata
#: to differ from the capture batch's (on an H100 it is the same for requests of up to 141 keys and differs for 3000 at
#: these shapes: ``reports/h100-2026-11-25-engine-graphs/sched-meta.txt``).
GRAPH_SCENARIOS: dict[str, GraphScenario] = {
    "graph_decode": GraphScenario(
        (
            _decodes(1, 40, 7, 95, 16),
            _decodes(1, 130),
            _decodes(1, 3, 61),
            _decodes(1, 77, 1, 20),
            _decodes(1, 12, 140, 33, 64),
        ),
        _L | dict(kv_layout="HND", block_size=16, sinks=True),
    ),
    "graph_decode_aot": GraphScenario(
        (
            _decodes(1, 40, 7, 95, 16),
            _decodes(1, 130),
            _decodes(1, 3, 61),
            _decodes(1, 77, 1, 2999),
            _decodes(1, 12, 140, 33, 64),
        ),
        _L | dict(kv_layout="NHD", block_size=16),
        aot=True,
    ),
    "graph_decode_batch_invariant": GraphScenario(
        (_decodes(1, 50, 9, 70), _decodes(1, 5, 88), _decodes(1, 120), _decodes(1, 31, 64, 2)),
        _L | dict(kv_layout="HND", block_size=32),
        aot=True,
        batch_invariant=True,
    ),
    "graph_spec_decode_aot": GraphScenario(
        (_decodes(3, 45, 8, 90), _decodes(3, 17), _decodes(3, 100, 30), _decodes(3, 2, 60, 75)),
        _L | dict(kv_layout="HND", block_size=16, window=(63, 0)),
        spec_tokens=2,
        aot=True,
    ),
}


class V1GraphRun(ComposedRun):
    """The callable the engine's ``prepare`` returns for a graph scenario: capture at the bucket, replay each batch."""

    builder_class: ClassVar[type[V1GraphBuilder]] = V1GraphBuilder

    def __init__(self, case, inputs, backend, device, scenario: GraphScenario, call: AttentionCase, seed: int = 0):
        super().__init__(case, inputs, backend, device)
        self.scenario, self.call, self.seed = scenario, call, seed

    # ------------------------------------------------------------------ the runner's buffers
    def _allocate(self) -> None:
        case, dev = self.case, self.inputs.device
        self.bucket, self.q_len, self.bs = self.case.graph[0], case.q_lens[0], case.block_size or 16
        self.width = cdiv(max(case.kv_lens), self.bs) + 1
        b, h, d = self.bucket, case.num_heads, case.head_dim
        self.cache = allocate_kv_cache(
            b * self.width + 1,
            self.bs,
            case.num_kv_heads,
            d,
            dtype=case.torch_dtype,
            layout=case.kv_layout,
            device=dev,
        )
        self.buffers = CaseInputs(
            case=self.call,
            q=torch.full((b * self.q_len, h, d), STALE, dtype=case.torch_dtype, device=dev),
            k=torch.zeros(0, case.num_kv_heads, d, dtype=case.torch_dtype, device=dev),
            v=torch.zeros(0, case.num_kv_heads, d, dtype=case.torch_dtype, device=dev),
            cu_seqlens_q=torch.arange(0, (b + 1) * self.q_len, self.q_len, dtype=torch.int32, device=dev),
            cu_seqlens_k=torch.zeros(b + 1, dtype=torch.int32, device=dev),
            seqlens_k=torch.zeros(b, dtype=torch.int32, device=dev),
            sinks=self.inputs.sinks,
            k_cache=self.cache.k,
            v_cache=self.cache.v,
            block_table=torch.zeros(b, self.width, dtype=torch.int32, device=dev),
        )
        self.gen = torch.Generator().manual_seed(int(case.digest(), 16) + self.seed)

    def write_batch(self, group: list[int]) -> None:
        """The runner's step: blocks handed out shuffled, pages written, table rows, queries, padded seq_lens."""
        case, buf, bs = self.case, self.buffers, self.bs
        perm = torch.randperm(self.bucket * self.width, generator=self.gen).tolist()
        cu_q, cu_k = self.inputs.cu_seqlens_q.tolist(), self.inputs.cu_seqlens_k.tolist()
        assert buf.block_table is not None
        lens = [0] * self.bucket  # vLLM's padded seq_lens
        for slot, r in enumerate(group):
            kv = case.kv_lens[r]
            pages = perm[slot * self.width : slot * self.width + cdiv(kv, bs)]
            buf.block_table[slot, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
            slots = torch.tensor([pages[t // bs] * bs + t % bs for t in range(kv)], device=buf.q.device)
            k, v = self.inputs.k[cu_k[r] : cu_k[r + 1]], self.inputs.v[cu_k[r] : cu_k[r + 1]]
            write_kv_cache(k, v, self.cache.k, self.cache.v, slots, layout=as_layout(case.kv_layout))
            buf.q[slot * self.q_len : (slot + 1) * self.q_len] = self.inputs.q[cu_q[r] : cu_q[r + 1]]
            lens[slot] = kv
        buf.seqlens_k.copy_(torch.tensor(lens, dtype=torch.int32))
        buf.cu_seqlens_k.copy_(torch.cumsum(torch.tensor([0] + lens), 0).to(torch.int32))

    # ------------------------------------------------------------------ the replays
    def make_builder(self) -> V1GraphBuilder:
        return self.builder_class(
            max_num_seqs=self.bucket,
            max_cudagraph_size=self.bucket * self.q_len,
            aot_schedule=self.scenario.aot,
            scheduler=graph_scheduler(self.case, self.buffers.cu_seqlens_q, self.device),
            device=self.inputs.device,
        )

    def build(self, builder: V1GraphBuilder, live: int) -> GraphMetadata:
        """The builder on the padded batch (``num_reqs`` = the bucket; ``live`` real requests)."""
        return builder.build(
            self.bucket, self.bucket * self.q_len, self.q_len, self.buffers.seqlens_k, self.scenario.batch_invariant
        )

    def run(self) -> KernelOutput:
        self._allocate()
        builder = self.make_builder()
        groups, start = [], 0
        for n in self.case.graph:
            if n > self.bucket:
                raise ValueError(f"graph: replay batch of {n} requests exceeds the captured bucket of {self.bucket}")
            groups.append(list(range(start, start + n)))
            start += n
        captured: CapturedCall | None = None
        outs, lses, captured_splits = [], [], 0
        for i, group in enumerate(groups):
            self.write_batch(group)
            meta = self.build(builder, len(group))
            if captured is None:
                captured_splits = meta.max_num_splits
                captured = CapturedCall.kernel(
                    self.backend, self.device, self.call, self.buffers, self.notes, self.problems
                )
            self._check(i, group, builder, meta, captured_splits)
            got, _, _ = captured.replay([(self.q_len, self.case.kv_lens[r]) for r in group])
            captured.replays[-1].update(
                max_num_splits=meta.max_num_splits,
                scheduled_splits=meta.scheduled_splits,
                metadata_entries=None if meta.scheduler_metadata is None else meta.scheduler_metadata.numel(),
            )
            outs.append(got.out)
            if got.lse is not None:
                lses.append(got.lse)
        assert captured is not None
        entries = None if builder.scheduler_metadata is None else builder.scheduler_metadata.numel()
        self.extra["graph"] = captured.summary(  # the engine's call pins no single split (the module docstring)
            {"batch": self.bucket, "q_len": self.q_len, "width": self.width, "fill": 0},
            scheduler_metadata_entries=entries,
            captured_num_splits=captured_splits,
        )
        lse = torch.cat(lses, dim=1) if len(lses) == len(outs) else None
        return KernelOutput(torch.cat(outs), lse)

    def _check(self, i: int, group: list[int], builder: V1GraphBuilder, meta: GraphMetadata, captured: int) -> None:
        where = f"replay {i} ({len(group)} requests, bucket of {self.bucket})"
        if meta.max_num_splits != captured:
            self.problems.append(
                f"num_splits: {where} built max_num_splits={meta.max_num_splits}, but the graph captured "
                f"num_splits={captured}"
            )
        if meta.scheduled_splits is not None and meta.scheduled_splits != meta.max_num_splits:
            note = (
                f"scheduler_metadata scheduled with num_splits={meta.scheduled_splits}, the call passes "
                f"max_num_splits={meta.max_num_splits} (the fork's re-assignment after scheduling)"
            )
            if note not in self.notes:
                self.notes.append(note)
        buf = builder.scheduler_metadata
        if meta.scheduled_splits is None or buf is None:
            return
        fresh = builder.schedule(self.bucket, self.q_len, self.buffers.seqlens_k, meta.scheduled_splits)
        n = fresh.numel()
        if not (torch.equal(buf[:n], fresh.to(buf)) and not buf[n:].any()):
            self.problems.append(
                f"scheduler_metadata: {where}: the preallocated buffer does not hold the metadata scheduled for this "
                f"batch's seq_lens (followed by zeros)"
            )


# ---------------------------------------------------------------------------------------------- the engine's side
def graph_case(engine: str, name: str, sc: GraphScenario) -> AttentionCase:
    """The ``engines``-suite case of a graph scenario: every replayed request in batch order, ``graph`` the sizes."""
    return AttentionCase(
        requests=tuple((r.new, r.kv) for r in sc.requests),
        graph=sc.sizes,
        graph_fill=0,
        engine=engine,
        scenario=name,
        **sc.layer,
    )


def check_graph_case(case: AttentionCase, sc: GraphScenario) -> None:
    """``ValueError`` naming the field when ``case`` is not the graph scenario it names."""
    want = tuple((r.new, r.kv) for r in sc.requests)
    if case.requests != want:
        raise ValueError(f"requests must be scenario {case.scenario!r}'s {list(want)}, got {list(case.requests)}")
    if case.graph != sc.sizes:
        raise ValueError(
            f"graph must be scenario {case.scenario!r}'s batch sizes {list(sc.sizes)}, got {list(case.graph)}"
        )
    if max(case.graph) > case.graph[0]:
        n = max(case.graph)
        raise ValueError(
            f"graph: replay batch of {n} requests exceeds the captured bucket of {case.graph[0]} (graph[0], the "
            "capture batch)"
        )
    if not case.causal or not case.paged or (case.block_size or 0) % 16 or case.graph_fill != 0:
        raise ValueError("graph decode is causal over a paged cache, block_size a multiple of 16, graph_fill 0")
    if case.quant != "none" or case.alibi or case.chunk is not None or case.dv != case.head_dim or case.qv:
        raise ValueError("graph scenarios replay 16-bit decode without ALiBi, chunking, qv or head_dim_v")
    if case.v_padded or case.append or case.num_splits is not None or case.scheduler_metadata:
        raise ValueError("num_splits and scheduler_metadata come from the builder; no append or V padding")


def captured_call(case: AttentionCase, sc: GraphScenario, sched_meta: bool = False) -> AttentionCase:
    """The decode call the graph captures: the bucket's requests at its capacity, ``num_splits`` the capture build's
    ``max_num_splits`` (AOT scenarios; 0 = the kernel's heuristic = None), ``scheduler_metadata`` when ``sched_meta``
    (a backend that takes it) and the scenario schedules AOT."""
    bucket, q_len, bs = case.graph[0], case.q_lens[0], case.block_size or 16
    capacity = (cdiv(max(case.kv_lens), bs) + 1) * bs
    splits = None
    if sc.aot:
        lens = torch.tensor([kv for kv in case.kv_lens[:bucket]], dtype=torch.int32)
        builder = V1GraphBuilder(
            max_num_seqs=bucket,
            max_cudagraph_size=bucket * q_len,
            aot_schedule=True,
            scheduler=host_scheduler_metadata,
            device="cpu",
        )
        splits = builder.build(bucket, bucket * q_len, q_len, lens, sc.batch_invariant).max_num_splits or None
    return call_case(
        case,
        [(q_len, capacity)] * bucket,
        graph=(),
        graph_fill=0,
        num_splits=splits,
        scheduler_metadata=sched_meta and sc.aot,
    )
