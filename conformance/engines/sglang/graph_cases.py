"""Seed ``003``'s CUDA-graph scenarios as cases: the case of a :class:`~conformance.engines.sglang.scenarios.
GraphScenario`, its checks, the captured forward's kernel calls, the adapter's support and the top-k > 1 layer's
reference (each query over its prefix and the draft tokens it may see).  The run itself is
:mod:`conformance.engines.sglang.graph`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnfast.base import Backend, Support
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from ..calls import call_case, tree_sequences
from .graph_cross import EncoderDecoderGraphState, allocate_encoder_lens, check_cross_case, cross_kv_lens, cross_lengths
from .graph_state import FILL_VALUE, GraphMetadata, RunnerBuffers
from .scenarios import GRAPH_FINDINGS, GRAPH_SCENARIOS, GraphScenario, tree_paths

__all__ = [
    "GRAPH_FIXED_FIELDS",
    "GraphCall",
    "check_graph_case",
    "graph_calls",
    "graph_case",
    "graph_layer",
    "graph_plan",
    "graph_scenario",
    "graph_support",
    "seq_lens_of",
    "visible_draft_tokens",
]


def graph_scenario(name: str) -> GraphScenario:
    """The graph scenario (or graph finding) called ``name``."""
    sc = GRAPH_SCENARIOS.get(name) or GRAPH_FINDINGS.get(name)
    if sc is None:
        raise ValueError(f"scenario must be one of {sorted(GRAPH_SCENARIOS) + sorted(GRAPH_FINDINGS)}, got {name!r}")
    return sc


def seq_lens_of(sc: GraphScenario, case: AttentionCase) -> list[int]:
    """``ForwardBatch.seq_lens`` of every request of ``case`` (its keys minus the draft tokens the step sees; an
    encoder-decoder scenario's decoder lengths)."""
    if sc.layer:
        return cross_lengths(sc)[1]
    return [kv - sc.new_keys for kv in case.kv_lens]


def visible_draft_tokens(sc: GraphScenario) -> list[list[int]] | None:
    """For top-k > 1, the draft tokens (index after the prefix) each query row of a request sees; else None.
    Verify: the tree's paths.  Draft decode: branch ``j``'s ``step_id + 1`` tokens, laid out branch by branch."""
    if sc.topk <= 1:
        return None
    if sc.mode == "target_verify":
        return tree_paths(sc.tree)
    n = sc.step_id + 1
    return [[j * n + t for t in range(n)] for j in range(sc.topk)]


@dataclass
class GraphCall:
    """One kernel call of the captured forward: label, the bucket's call case, the metadata tensors it reads and
    SGLang's names of its table and lengths (for :meth:`check_fits`)."""

    label: str
    case: AttentionCase
    table: torch.Tensor
    lens: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    names: tuple[str, str]
    page_size: int

    def check_fits(self, bs: int) -> None:
        """``ValueError`` naming the field and the bucket when the live lengths need more table columns than the
        captured view has (a kernel honouring the view's shape would read past it)."""
        need = -(-int(self.lens.max()) // self.page_size)
        if need > self.table.shape[1]:
            raise ValueError(
                f"{self.names[0]}: {self.names[1]} up to {int(self.lens.max())} needs {need} columns of "
                f"{self.page_size}, but the view captured for the bucket bs={bs} has {self.table.shape[1]}"
            )


def graph_calls(case: AttentionCase, sc: GraphScenario, md: GraphMetadata, mde: GraphMetadata | None, local_cu_k):
    """The calls ``forward_decode`` makes on the captured metadata (the bucket's call cases: every sequence at
    the captured table view's capacity)."""
    ps = sc.page_size

    def call(label: str, prefix: str, m: Any, cu_k, q_len: int, causal: bool) -> GraphCall:
        reqs = [(q_len, m.page_table.shape[1] * ps)] * m.page_table.shape[0]
        cc = call_case(case, reqs, causal=causal, window=(None, None), chunk=None, graph=(), graph_fill=0)
        names = (prefix + "page_table", prefix + "cache_seqlens_int32")
        return GraphCall(label, cc, m.page_table, m.cache_seqlens_int32, m.cu_seqlens_q, cu_k, names, ps)

    if sc.layer == "cross":  # layer.is_cross_attention: the encoder's table and lengths, non-causal, no window
        if md.encoder_page_table is None or md.encoder_lens_int32 is None or md.encoder_cu_seqlens_k is None:
            raise ValueError("encoder_page_table: the cross-attention layer's bucket was captured without encoder_lens")
        assert md.cu_seqlens_q is not None  # every capture sets it
        t = md.encoder_page_table
        cc = call_case(
            case,
            [(1, t.shape[1] * ps)] * t.shape[0],
            causal=False,
            window=(None, None),
            chunk=None,
            graph=(),
            graph_fill=0,
        )
        names = ("encoder_page_table", "encoder_lens_int32")
        label = "cross attention (encoder page table, graph buffers)"
        return [GraphCall(label, cc, t, md.encoder_lens_int32, md.cu_seqlens_q, md.encoder_cu_seqlens_k, names, ps)]
    lam = md.local_attn_metadata
    if lam is not None:  # use_local_attn: decode passes no window and no cu_seqlens_k_new
        reqs = [(1, lam.local_block_table.shape[1] * ps)] * lam.local_block_table.shape[0]
        cc = call_case(case, reqs, causal=True, window=(None, None), chunk=None, graph=(), graph_fill=0)
        names = ("local_block_table", "local_seqused_k")
        label = "local attention (virtual batches, graph buffers)"
        return [
            GraphCall(
                label, cc, lam.local_block_table, lam.local_seqused_k, lam.local_query_start_loc, local_cu_k, names, ps
            )
        ]
    if mde is None:
        return [call(f"{sc.mode} (graph page table)", "", md, md.cu_seqlens_k, sc.q_len, True)]
    return [
        call(f"{sc.mode} prefix (top-k > 1, non-causal, graph page table)", "", md, md.cu_seqlens_k, sc.q_len, False),
        call(f"{sc.mode} draft tokens (expand, graph buffers)", "expand.", mde, mde.cu_seqlens_k, 1, False),
    ]


def graph_layer(case: AttentionCase, inputs: CaseInputs) -> tuple[AttentionCase, CaseInputs] | None:
    """Top-k > 1 as plain attention: each query row one sequence over its request's prefix and the draft tokens it
    sees (None for the other scenarios, whose layer is the case itself)."""
    sc = graph_scenario(case.scenario)
    visible = visible_draft_tokens(sc)
    if visible is None:
        return None
    return tree_sequences(case, inputs, seq_lens_of(sc, case), visible, graph=(), graph_fill=0)


def graph_support(case: AttentionCase, backend: Backend, device: str, plan) -> Support:
    """The adapter must declare ``graph`` (its reason otherwise) and take every bucket call."""
    refused = backend.refusals().get("graph")
    if refused is not None:
        return Support(False, f"graph: {refused}")
    for label, call in plan:
        support = backend.supports(call, device)
        if not support:
            return Support(False, f"{label}: {support.reason}")
    return Support(True)


#: Case fields a graph scenario fixes (``requests`` and ``graph`` are the case's own: an engine author's batches).
GRAPH_FIXED_FIELDS = (
    "kv_layout",
    "block_size",
    "causal",
    "window",
    "chunk",
    "qv",
    "quant",
    "sinks",
    "softcap",
    "num_splits",
    "append",
    "alibi",
    "v_padded",
    "graph_fill",
)


def graph_case(engine: str, name: str, sc: GraphScenario) -> AttentionCase:
    """The scenario's case: its default batches (``graph`` their sizes, capture bucket first)."""
    reqs = tuple((sc.q_len, s + sc.new_keys) for batch in sc.batches for s in batch)
    if sc.layer:
        reqs = tuple((1, n) for n in cross_kv_lens(sc))
    return AttentionCase(
        requests=reqs,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        dtype="bf16",
        kv_layout="NHD",
        block_size=sc.page_size,
        causal=sc.layer != "cross",
        chunk=sc.chunk,
        num_splits=1 if sc.deterministic else None,
        engine=engine,
        scenario=name,
        graph=tuple(len(b) for b in sc.batches),
        graph_fill=FILL_VALUE,
    )


def check_graph_case(engine: str, case: AttentionCase) -> None:
    """``ValueError`` naming the field when ``case`` is not a replay of its graph scenario: the fixed fields, the
    batches (none larger than the captured bucket ``graph[0]``), each request's ``q_len`` and ``seq_lens >= 1``."""
    sc = graph_scenario(case.scenario)
    canon = graph_case(engine, case.scenario, sc)
    for f in GRAPH_FIXED_FIELDS:
        if getattr(case, f) != getattr(canon, f):
            raise ValueError(
                f"{f} must be {getattr(canon, f)!r} for scenario {case.scenario!r}, got {getattr(case, f)!r}"
            )
    if not case.graph:
        raise ValueError(
            f"graph: scenario {case.scenario!r} is a CUDA-graph replay: list the replay batch sizes, bucket first"
        )
    if sc.layer:
        check_cross_case(case, sc, canon)
    bs = case.graph[0]
    for i, n in enumerate(case.graph[1:], 1):
        if n > bs:
            raise ValueError(f"graph: replay batch {i} has {n} requests, more than the captured bucket bs={bs}")
    for r, (q, kv) in enumerate(case.requests):
        if q != sc.q_len:
            raise ValueError(f"requests[{r}]: q_len must be {sc.q_len} in scenario {case.scenario!r}, got {q}")
        if kv - sc.new_keys < 1:
            raise ValueError(
                f"requests[{r}]: kv_len {kv} leaves seq_lens {kv - sc.new_keys} < 1 after the step's {sc.new_keys} "
                "draft tokens"
            )


def graph_plan(case: AttentionCase) -> list[tuple[str, AttentionCase]]:
    """The bucket's calls (labels and call cases) of a graph case, from a capture on CPU."""
    sc = graph_scenario(case.scenario)
    bs = case.graph[0]
    state = EncoderDecoderGraphState(sc, "cpu")
    state.init_cuda_graph_state(bs)
    runner = RunnerBuffers.allocate(bs, bs * sc.topk * sc.num_steps, "cpu")
    if sc.layer:
        allocate_encoder_lens(runner)
        md, mde = state.capture(bs, runner.seq_lens, runner.encoder_lens)
    else:
        md, mde = state.capture(bs, runner.seq_lens)
    return [(c.label, c.case) for c in graph_calls(case, sc, md, mde, torch.zeros(bs + 1, dtype=torch.int32))]
