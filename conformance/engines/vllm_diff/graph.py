"""Seed ``000``'s CUDA-graph decode: both graph block tables, padded slots and ``use_cuda_graph``, the four calls and
the differential combination captured at a bucket and replayed for every batch size up to it (the graph scenarios
of the engine ``vllm_diff``).

The replay writes what the seed's ``DifferentialFlashAttentionMetadataBuilder.build`` writes for a captured decode
batch (:meth:`DiffGraphRun.build`, literally) and pads and copies the batch as vLLM V0's runner does; the captured
forward is :class:`_DiffForward`.  Each field, step by step: ``docs/concepts/graphs.md`` (*Seed 000's CUDA-graph
decode: what the replay follows*).

Two layers are replayed.  ``graph_decode``: a KV-generating layer (``forward_generate_kv_cache``'s decode path,
``decode_meta.block_tables``).  ``graph_decode_shared_kv``: a KV-sharing layer (``kv_sharing_target_layer_name``
set: ``forward_with_kv_cache_only`` over the target layer's cache, ``q.unsqueeze(1)``, ``cache_seqlens =
attn_metadata.seq_lens_tensor``), whose table is ``cross_layer_shared_block_tables`` when the batch has no decode
metadata and ``block_tables`` otherwise (:meth:`DiffGraphRun.kv_only_table`): in a captured decode
``decode_metadata`` is set, so the captured call reads ``block_tables`` and the cross-layer table, refreshed in place
at every build, is never read by a decode step (the seed's rule, replayed; a prefill-only step reads it, and prefills
are not captured).  Its refresh is therefore checked directly: after every build each real row of
``cross_layer_shared_graph_block_tables`` must start with its request's blocks (``problems``).

Checks beyond the layer's numerical verdict: each replay equals the same forward run eagerly on the same buffers,
bitwise (:class:`conformance.graphs.captured.CapturedCall`), and is compared with the batch's own eager forward
(``vs_plain``, recorded); a stale ``graph_block_tables`` row where a real request's should be reads another batch's
pages and fails the numbers.  A batch larger than the bucket or a sequence longer than the tables' columns raises
``ValueError`` naming the field and the bucket.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnfast.base import KernelOutput
from attnref import write_kv_cache
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.cases.paged_kv import STALE, token_slots
from conformance.graphs.captured import CapturedCall, own_inputs
from conformance.graphs.composed import ComposedRun

from ..base import Request
from ..calls import call_case
from ..v0_graph_common import PAD_SEQ_LEN, PAD_SLOT_ID, bucket_width, decode_lists, graph_case, replay_batches
from ..v0_graph_common import check_graph_case as _check_graph_case
from ..v0_graph_common import get_graph_runner_block_tables as _graph_runner_block_tables
from .scenarios import GRAPH_SCENARIOS, GraphScenario

__all__ = [
    "GRAPH_SCENARIOS",
    "PAD_SLOT_ID",
    "DiffGraphRun",
    "GraphScenario",
    "captured_call",
    "check_graph_case",
    "graph_case",
]


def check_graph_case(case: AttentionCase, sc: GraphScenario) -> None:
    """``ValueError`` naming the field when ``case`` is not the graph scenario it names."""
    _check_graph_case(case, sc, "differential")
    if case.qv or case.chunk is not None or case.append or case.v_padded or case.scheduler_metadata:
        raise ValueError("differential graph scenarios make their own calls (no qv, chunk, append, V padding, ...)")
    if case.num_heads % 2 or case.num_kv_heads % 2 or case.head_dim % 32 or not 32 <= case.head_dim <= 256:
        raise ValueError(
            f"num_heads ({case.num_heads}) and num_kv_heads ({case.num_kv_heads}) must be even, head_dim "
            f"({case.head_dim}) one of FlashAttention's 32, 64, ..., 256"
        )
    if case.dv != case.head_dim:
        raise ValueError(f"head_dim_v must be unset, got {case.dv}")


def captured_call(case: AttentionCase) -> AttentionCase:
    """Each of the four captured calls: the bucket's requests of one query at ``max_blocks * block_size`` keys, on
    H/2 query heads and Hk/2 kv heads."""
    bs = case.block_size or 16
    return call_case(
        case,
        [(1, bucket_width(case) * bs)] * case.graph[0],
        num_heads=case.num_heads // 2,
        num_kv_heads=case.num_kv_heads // 2,
        graph=(),
        graph_fill=0,
    )


@dataclass
class GraphStep:
    """What :meth:`DiffGraphRun.build` hands the runner: the padded batch's ``seq_lens`` and ``slot_mapping``, both
    graph tables' rows ``[:num_seqs]``, and the live requests' block lists."""

    seq_lens: list[int]
    slot_mapping: list[int]
    block_tables: torch.Tensor
    cross_layer_shared_block_tables: torch.Tensor
    blocks: list[list[int]] = field(default_factory=list)


class _DiffForward:
    """The captured decode: ``split`` the query buffer into the call buffers, the four calls, ``combine``."""

    def __init__(self, kernels: dict[str, Callable[[], KernelOutput]], split, combine) -> None:
        self.kernels, self.split, self.combine = kernels, split, combine

    def refresh(self) -> None:
        for k in self.kernels.values():
            fn = getattr(k, "refresh", None)
            if fn is not None:
                fn()

    def __call__(self) -> KernelOutput:
        self.split()
        return self.combine({pair: k().out for pair, k in self.kernels.items()})


class DiffGraphRun(ComposedRun):
    """The callable the engine's ``prepare`` returns for a graph scenario: capture at the bucket, replay each batch.

    ``engine`` supplies the layer's steps (``split_heads``, ``read_caches``, ``layer_output``), ``params`` the
    layer's parameters, ``pairs`` the four calls (``name -> (query, key, value group)``)."""

    def __init__(self, case, inputs, backend, device, *, engine: Any, params: Any, pairs: dict, sc: GraphScenario):
        super().__init__(case, inputs, backend, device)
        self.engine, self.params, self.pairs, self.scenario = engine, params, pairs, sc
        self.call = captured_call(case)

    def _allocate(self) -> None:
        case, dev, dt = self.case, self.inputs.device, self.case.torch_dtype
        self.bucket, self.bs, self.width = case.graph[0], case.block_size or 16, bucket_width(case)
        b, h, hk, d = self.bucket, case.num_heads, case.num_kv_heads, case.head_dim
        self.num_blocks = b * self.width + 1
        # the runner's persistent host arrays (np.zeros((max_batch_size, max_blocks), dtype=np.int32) in V0)
        self.graph_block_tables = torch.zeros(b, self.width, dtype=torch.int32)
        self.cross_layer_shared_graph_block_tables = torch.zeros(b, self.width, dtype=torch.int32)
        shape = (2, 2, self.num_blocks, self.bs, hk // 2, d)  # get_kv_cache_shape: (group, K/V, NHD block)
        self.kv_cache = torch.full(shape, STALE, dtype=torch.float32, device=dev).to(dt)
        self.q = torch.full((b, h, d), STALE, dtype=dt, device=dev)  # CUDAGraphRunner's input buffers
        self.seq_lens = torch.zeros(b, dtype=torch.int32, device=dev)
        self.cu_seqlens_k = torch.zeros(b + 1, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(b, self.width, dtype=torch.int32, device=dev)
        self.q_split = (
            torch.empty(b, h // 2, d, dtype=dt, device=dev),
            torch.empty(b, h // 2, d, dtype=dt, device=dev),
        )
        kc1, vc1, kc2, vc2 = self.engine.read_caches(self.kv_cache)
        keys, values = (kc1, kc2), (vc1, vc2)
        table = self.kv_only_table(decode=True) if self.scenario.shared_kv else self.block_tables
        empty = torch.zeros(0, hk // 2, d, dtype=dt, device=dev)
        self.pair_inputs = {
            pair: CaseInputs(
                case=self.call,
                q=self.q_split[gq],
                k=empty,
                v=empty,
                cu_seqlens_q=torch.arange(0, b + 1, dtype=torch.int32, device=dev),
                cu_seqlens_k=self.cu_seqlens_k,
                seqlens_k=self.seq_lens,
                k_cache=keys[gk],
                v_cache=values[gv],
                block_table=table,
            )
            for pair, (gq, gk, gv) in self.pairs.items()
        }
        self.gen = torch.Generator().manual_seed(int(case.digest(), 16) + 5)

    # ------------------------------------------------------------------ the seed's build (planted bugs override)
    def kv_only_table(self, decode: bool) -> torch.Tensor:
        """``forward_with_kv_cache_only``'s ``block_tables_arg``: ``cross_layer_shared_block_tables`` without decode
        metadata, ``block_tables`` with it (a captured step is a decode)."""
        return self.block_tables if decode else self.cross_layer_shared_graph_block_tables.to(self.block_tables.device)

    def get_graph_runner_block_tables(self, num_seqs: int, lists: list[list[int]], graph: torch.Tensor) -> torch.Tensor:
        """The seed's ``_get_graph_runner_block_tables``: real rows' first entries written, the rest kept."""
        return _graph_runner_block_tables(num_seqs, lists, graph)

    def build(self, live: list[Request]) -> GraphStep:
        """The padded batch's step (block manager: shuffled ids) and both graph tables, as the seed builds them."""
        perm = torch.randperm(self.num_blocks - 1, generator=self.gen).tolist()
        seq_lens, slot_mapping, block_tables = decode_lists(live, perm, self.bucket, self.width, self.bs)
        cross = [list(t) for t in block_tables]  # a decode without a sliding window: block_tables[seq_id]
        n = len(seq_lens)
        tables = self.get_graph_runner_block_tables(n, block_tables, self.graph_block_tables)
        shared = self.get_graph_runner_block_tables(n, cross, self.cross_layer_shared_graph_block_tables)
        return GraphStep(seq_lens, slot_mapping, tables, shared, block_tables[: len(live)])

    def write_batch(self, group: list[int], live: list[Request], step: GraphStep) -> None:
        """The context earlier steps cached, the step's new tokens through ``slot_mapping`` (pads skipped) for both
        groups (``populate_kv_cache``), the queries into the query buffer."""
        bs, src, eng = self.bs, self.inputs, self.engine
        cu_q, cu_k = src.cu_seqlens_q.tolist(), src.cu_seqlens_k.tolist()
        ctx_rows: list[int] = []
        ctx_slots: list[int] = []
        new_rows: list[int] = []
        for slot, (r, req) in enumerate(zip(group, live)):
            ctx_slots += token_slots(step.blocks[slot], range(req.cached), bs)
            ctx_rows += range(cu_k[r], cu_k[r] + req.cached)
            new_rows.append(cu_k[r] + req.cached)
            self.q[slot] = src.q[cu_q[r]]
        dev = self.q.device
        pad = self.bucket - len(live)
        new = torch.tensor(new_rows, dtype=torch.long, device=dev)
        k_new = torch.cat([src.k[new], src.k.new_zeros(pad, *src.k.shape[1:])])
        v_new = torch.cat([src.v[new], src.v.new_zeros(pad, *src.v.shape[1:])])

        def write(k: torch.Tensor, v: torch.Tensor, slots: list[int]) -> None:
            sm = torch.tensor(slots, dtype=torch.int64, device=dev)
            for grp, (kg, vg) in enumerate(zip(eng.split_heads(k), eng.split_heads(v))):
                write_kv_cache(kg, vg, self.kv_cache[grp], None, sm)  # (k1, v1) -> kv_cache[0], (k2, v2) -> [1]

        if ctx_slots:
            rows = torch.tensor(ctx_rows, dtype=torch.long, device=dev)
            write(src.k[rows], src.v[rows], ctx_slots)
        write(k_new, v_new, step.slot_mapping)

    def copy_inputs(self, step: GraphStep) -> None:
        """``CUDAGraphRunner.forward``: ``seq_lens_tensor`` and ``block_tables`` into the graph's input buffers."""
        self.seq_lens.copy_(torch.tensor(step.seq_lens, dtype=torch.int32))
        self.cu_seqlens_k.copy_(torch.cumsum(torch.tensor([0] + step.seq_lens), 0).to(torch.int32))
        self.block_tables.copy_(step.block_tables)

    # ------------------------------------------------------------------ the forward and the replays
    def _split(self) -> None:
        q1, q2 = self.engine.split_heads(self.q)
        self.q_split[0].copy_(q1)
        self.q_split[1].copy_(q2)

    def _combine(self, outs: dict[str, torch.Tensor]) -> KernelOutput:
        return KernelOutput(self.engine.layer_output(outs, self.params, self.case.torch_dtype), None)

    def _make(self) -> _DiffForward:
        kernels = {pair: self.backend.prepare_graph(self.call, ins) for pair, ins in self.pair_inputs.items()}
        return _DiffForward(kernels, self._split, self._combine)

    def _own(self, requests) -> KernelOutput:
        """The batch's own eager forward: the live rows only, their exact key counts (``prepare``, no graph)."""
        self._split()
        outs = {}
        for pair, ins in self.pair_inputs.items():
            own = own_inputs(self.call, ins, requests)
            outs[pair] = self.backend.prepare(own.case, own)().out
        return self._combine(outs)

    def _check_cross_layer(self, i: int, step: GraphStep) -> None:
        for r, blocks in enumerate(step.blocks):
            row = self.cross_layer_shared_graph_block_tables[r, : len(blocks)].tolist()
            if row != blocks:
                self.problems.append(
                    f"cross_layer_shared_block_tables: replay {i} row {r} starts with {row}, not its request's "
                    f"blocks {blocks} (cross_layer_shared_graph_block_tables not refreshed)"
                )
                return

    def run(self) -> KernelOutput:
        self._allocate()
        case, captured, outs = self.case, None, []
        for i, n, group, live in replay_batches(case, self.bucket):
            step = self.build(live)
            self.write_batch(group, live, step)
            self.copy_inputs(step)
            self._check_cross_layer(i, step)
            if captured is None:
                captured = CapturedCall(self._make, self._own, self.device, self.notes, self.problems, what="calls")
            got, _, _ = captured.replay([(1, case.kv_lens[r]) for r in group], f"{n} of a bucket of {self.bucket}")
            outs.append(got.out)
        assert captured is not None
        bucket = {"batch": self.bucket, "q_len": 1, "width": self.width, "fill": PAD_SEQ_LEN}
        layer = "kv_sharing" if self.scenario.shared_kv else "kv_generating"
        self.extra["graph"] = captured.summary(bucket, engine_level=True, layer=layer)  # V0 pins no split count
        return KernelOutput(torch.cat(outs), None)  # the layer returns no LSE
