"""Seed ``003``: SGLang's FlashAttention backend (``flashattention_backend.py``, 2025-09-22), replayed end to end.

The replay follows the seed's ``init_forward_metadata`` (eager path; the CUDA-graph path is
:mod:`conformance.engines.sglang.graph`, scenarios :data:`GRAPH_SCENARIOS`),
``forward_extend`` and ``forward_decode``, written here from the seed (no copied code), on an SGLang-style memory
pool: ``req_to_token`` (request x position -> token slot ``page * page_size + offset``, pages handed out in a
shuffled order, one spare) and one layer's K/V buffer ``(num_pages, page_size, hk, d)`` (``view(-1, page_size,
...)``), unused slots stale.  Every kernel call is ``flash_attn_with_kvcache`` without new keys (the cache is written
first, ``set_kv_buffer``), i.e. a paged call with ``cache_seqlens`` keys, or ``flash_attn_varlen_func`` for MLA's
chunked prefix; each runs on the adapter under test.  What it checks per scenario (:data:`SCENARIOS`: the metadata
builder, local attention, windows, speculative verify, cross attention, MLA absorbed and chunked prefix, fp8 KV,
``num_splits``), its findings (:data:`FINDINGS`, kept out of :meth:`~SGLangFlashAttention.cases`) and what it does
not model are in ``docs/concepts/engines.md`` (*Seed 003: what the replay follows*).

Every paged call's metadata is checked first (:func:`~conformance.engines.sglang.local.check_call_metadata`,
``ValueError`` naming the field).  The forward returns the layer output and the LSE the kernel (or the merge)
computed; SGLang asks for the LSE only where it merges, the replay checks it everywhere.

Where it lives: this module is the engine, :class:`SGLangFlashAttention` (cases and their checks, the top-k tree's
reference).  Its base classes hold the backend: :class:`~conformance.engines.sglang.runner.SGLangForwardRunner`
the forward (the calls, the pool write, the kernel calls, the merges, the layer's hooks) and
:class:`~conformance.engines.sglang.metadata.SGLangMetadataBuilder` the pool and ``init_forward_metadata``;
:mod:`conformance.engines.sglang.scenarios` the :data:`SCENARIOS` and :data:`FINDINGS` tables;
:mod:`conformance.engines.sglang.local` the virtual batches and the metadata checks.  Their public names are
re-exported here.
"""

from __future__ import annotations

import dataclasses

import torch

from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.cases.sweep import MLA_SCALE

from attnfast.base import Backend, KernelOutput, Support

from ..base import Kernel, Request
from ..calls import tree_sequences
from .graph import SGLangGraphRun
from .graph_cross import EncoderDecoderGraphState
from .graph_cases import check_graph_case, graph_case, graph_layer, graph_plan, graph_support
from .runner import SGLangForwardRunner
from .scenarios import (
    FINDINGS,
    GRAPH_FINDINGS,
    GRAPH_SCENARIOS,
    INVARIANCE_SCENARIOS,
    SCENARIOS,
    Scenario,
    forward_mode,
    tree_paths,
)

__all__ = ["SGLangFlashAttention"]

#: Case fields a scenario fixes (heads, head dims without qv, dtype and scale may vary).
_SCENARIO_FIELDS = (
    "requests",
    "kv_layout",
    "block_size",
    "causal",
    "window",
    "chunk",
    "qv",
    "head_dim",
    "head_dim_v",
    "quant",
    "descale",
    "sinks",
    "softcap",
    "num_splits",
    "append",
    "alibi",
    "v_padded",
)


class SGLangFlashAttention(SGLangForwardRunner):
    """Seed 003 replayed: SGLang's FlashAttention backend (see the module docstring)."""

    name = "sglang_fa"
    #: the CUDA-graph state class (``init_cuda_graph_state`` and the capture / replay metadata; tests plant bugs)
    graph_state = EncoderDecoderGraphState
    seed = "003"
    description = (
        "SGLang FlashAttention backend: page table, virtual batches, windows, top-k verify cascade, cross, MLA, fp8"
    )

    # ------------------------------------------------------------------ scenarios as cases
    def _case(self, name: str, sc: Scenario) -> AttentionCase:
        reqs = tuple((r.new, r.encoder if sc.cross else r.kv) for r in sc.requests)
        h, hk, d = sc.heads or (8, 2, 64)
        layer: dict = dict(num_heads=h, num_kv_heads=hk, head_dim=d)
        if sc.mla and sc.mode == "mla_prefix":
            layer = dict(num_heads=8, num_kv_heads=8, head_dim=192, head_dim_v=128, scale=MLA_SCALE)
        elif sc.mla:
            layer = dict(num_heads=16, num_kv_heads=1, head_dim=64, head_dim_v=512, qv=True, scale=MLA_SCALE)
        paged = sc.mode != "mla_prefix"
        return AttentionCase(
            requests=reqs,
            **layer,
            dtype="bf16",
            kv_layout="NHD" if paged else "contiguous",
            block_size=sc.page_size if paged else None,
            causal=not sc.cross,
            window=(sc.window, 0) if sc.window is not None else (None, None),
            chunk=sc.chunk,
            softcap=sc.softcap,
            sinks=sc.sinks,
            num_splits=1 if sc.deterministic else None,
            quant="fp8_e4m3" if sc.fp8 else "none",
            engine=self.name,
            scenario=name,
        )

    def cases(self) -> list[AttentionCase]:
        eager = [self._case(name, sc) for name, sc in SCENARIOS.items()]
        graphs = [graph_case(self.name, name, sc) for name, sc in GRAPH_SCENARIOS.items()]
        inv = [self._case(name, sc).replace(invariance=kind) for name, (kind, sc) in INVARIANCE_SCENARIOS.items()]
        return eager + graphs + inv

    def scenario(self, case: AttentionCase) -> Scenario:
        if case.scenario in INVARIANCE_SCENARIOS:  # the batch is the case's: one variant of the invariance
            kind, sc = INVARIANCE_SCENARIOS[case.scenario]
            reqs = tuple(Request(new=q, cached=kv - q) for q, kv in case.requests)
            mode = forward_mode(reqs) if kind == "neighbour" else sc.mode  # the scheduler's mode of the variant
            return dataclasses.replace(sc, requests=reqs, mode=mode)
        found = SCENARIOS.get(case.scenario) or FINDINGS.get(case.scenario)
        if found is None:
            known = sorted(SCENARIOS) + sorted(FINDINGS) + sorted(GRAPH_SCENARIOS)
            raise ValueError(f"scenario must be one of {known} for engine {self.name}, got {case.scenario!r}")
        return found

    # ------------------------------------------------------------------ CUDA-graph scenarios (graph.py)
    @staticmethod
    def is_graph(case: AttentionCase) -> bool:
        return case.scenario in GRAPH_SCENARIOS or case.scenario in GRAPH_FINDINGS

    def plan(self, case: AttentionCase) -> list[tuple[str, AttentionCase]]:
        if self.is_graph(case):
            self.check(case)
            return graph_plan(case)
        return super().plan(case)

    def supports(self, case: AttentionCase, backend: Backend, device: str) -> Support:
        if not self.is_graph(case):
            return super().supports(case, backend, device)
        if device.split(":")[0] not in backend.devices:
            return Support(False, f"runs on {'/'.join(backend.devices)}, not {device}")
        return graph_support(case, backend, device, self.plan(case))

    def prepare(self, case: AttentionCase, inputs: CaseInputs, backend: Backend, device: str):
        if self.is_graph(case):
            return SGLangGraphRun(case, inputs, backend, device, engine=self)
        return super().prepare(case, inputs, backend, device)

    def forward(self, case: AttentionCase, inputs: CaseInputs, kernel: Kernel) -> KernelOutput:
        if self.is_graph(case):
            raise ValueError(f"scenario {case.scenario!r} replays the CUDA-graph path: run it through prepare()")
        return super().forward(case, inputs, kernel)

    def check(self, case: AttentionCase) -> None:
        if self.is_graph(case):
            check_graph_case(self.name, case)
            return
        if case.graph:
            raise ValueError(
                f"graph: scenario {case.scenario!r} is an eager step; the CUDA-graph replays are the scenarios "
                f"{sorted(GRAPH_SCENARIOS)}"
            )
        canon = self._case(case.scenario, self.scenario(case))
        for f in _SCENARIO_FIELDS:
            if getattr(case, f) != getattr(canon, f):
                raise ValueError(
                    f"{f} must be {getattr(canon, f)!r} for scenario {case.scenario!r}, got {getattr(case, f)!r}"
                )

    # ------------------------------------------------------------------ the layer's reference
    def _tree_layer(self, case: AttentionCase, inputs: CaseInputs) -> tuple[AttentionCase, CaseInputs]:
        """Top-k > 1 verify as plain attention: each draft token one sequence over the prefix and its ancestors."""
        sc = self.scenario(case)
        return tree_sequences(case, inputs, [r.cached for r in sc.requests], tree_paths(sc.tree))

    def reference(self, case: AttentionCase, inputs: CaseInputs) -> AttnResult:
        if self.is_graph(case):
            from conformance.verdict.reference import reference

            layer = graph_layer(case, inputs)
            return reference(*layer) if layer is not None else super().reference(case, inputs)
        if not self.scenario(case).tree:
            return super().reference(case, inputs)
        from conformance.verdict.reference import reference

        return reference(*self._tree_layer(case, inputs))

    def baseline(self, case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        if self.is_graph(case):
            from conformance.verdict.baseline import baseline

            layer = graph_layer(case, inputs)
            return baseline(*layer) if layer is not None else super().baseline(case, inputs)
        if not self.scenario(case).tree:
            return super().baseline(case, inputs)
        from conformance.verdict.baseline import baseline

        return baseline(*self._tree_layer(case, inputs))
