"""vLLM V0's CUDA-graph decode machinery, shared by the engines that replay a V0 seed's captured decode
(:mod:`conformance.engines.vllm_v0.graph`, seed ``002``; :mod:`conformance.engines.vllm_diff.graph`, seed ``000``,
which carries the same V0 machinery).

What both seeds' ``build(seq_lens, query_lens, cuda_graph_pad_size, batch_size)`` and V0's model runner share:
the batch padded to the captured bucket with ``seq_lens`` of 1 (:data:`PAD_SEQ_LEN`) and ``PAD_SLOT_ID`` slots
(:func:`decode_lists`); ``_get_graph_runner_block_tables`` into a persistent ``(max_batch_size, max_blocks)`` table
(:func:`get_graph_runner_block_tables`); the scenario (:class:`GraphScenario`), its ``engines``-suite case
(:func:`graph_case`) and the checks every V0 graph case passes (:func:`check_graph_case`); the engines'
``supports`` and ``prepare`` for a graph case (:class:`V0GraphEngine`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import torch

from attnfast.base import Support
from conformance.cases.case import AttentionCase

from .base import Engine, Request
from .calls import blocks_needed, token_slots
from .graph_call import GraphScenario, graph_support

__all__ = [
    "PAD_SEQ_LEN",
    "PAD_SLOT_ID",
    "GraphScenario",
    "V0GraphEngine",
    "bucket_width",
    "check_graph_case",
    "decode_lists",
    "get_graph_runner_block_tables",
    "graph_case",
    "replay_batches",
]

#: The padded requests' ``seq_lens`` (V0's model runner pads with 1) and slots (``PAD_SLOT_ID``, skipped by the write).
PAD_SEQ_LEN = 1
PAD_SLOT_ID = -1


def decodes(*cached: int) -> tuple[Request, ...]:
    """A decode batch: one new token after each ``cached`` context."""
    return tuple(Request(new=1, cached=c) for c in cached)


def graph_case(engine: str, name: str, sc: GraphScenario) -> AttentionCase:
    """The ``engines``-suite case of a graph scenario: every replayed request in batch order, ``graph`` the sizes,
    ``graph_fill`` 1 (V0's padded ``seq_lens``)."""
    return AttentionCase(
        requests=tuple((r.new, r.kv) for r in sc.requests),
        graph=sc.sizes,
        graph_fill=PAD_SEQ_LEN,
        engine=engine,
        scenario=name,
        **sc.layer,
    )


def check_graph_case(case: AttentionCase, sc: GraphScenario, label: str) -> None:
    """``ValueError`` naming the field when ``case`` is not the graph scenario it names (``label`` in messages)."""
    want = tuple((r.new, r.kv) for r in sc.requests)
    if case.requests != want:
        raise ValueError(f"requests must be scenario {case.scenario!r}'s {list(want)}, got {list(case.requests)}")
    if case.graph != sc.sizes:
        raise ValueError(f"graph must be scenario {case.scenario!r}'s sizes {list(sc.sizes)}, got {list(case.graph)}")
    if max(case.graph) > case.graph[0]:
        raise ValueError(
            f"graph_block_tables: replay batch of {max(case.graph)} requests exceeds the captured bucket of "
            f"{case.graph[0]} rows (graph[0], the capture batch)"
        )
    if case.kv_layout != "NHD" or (case.block_size or 0) % 16 or not case.causal or case.graph_fill != PAD_SEQ_LEN:
        raise ValueError(f"{label} graph decode: causal over the NHD cache, block_size a multiple of 16, graph_fill 1")
    if case.quant != "none" or case.alibi or case.has_window or case.sinks or case.num_splits is not None:
        raise ValueError(f"{label} graph scenarios replay plain 16-bit decode (no quant, ALiBi, window, sinks, splits)")
    if case.dv != case.head_dim or case.qv or case.chunk is not None:
        raise ValueError(f"{label} graph scenarios share one K/V head dim (head_dim_v unset), no qv or chunk")


def bucket_width(case: AttentionCase) -> int:
    """The graph tables' columns: the longest sequence's blocks plus one (entries past every request's pages)."""
    return blocks_needed(max(case.kv_lens), case.block_size or 16) + 1


class V0GraphEngine(Engine):
    """``supports`` and ``prepare`` of an engine with V0 graph scenarios (a base of the engine, before
    :class:`~conformance.engines.base.Engine`): a case of ``graph_scenarios`` is checked, its backend asked for the
    ``graph_call`` it captures, and it runs through ``graph_prepare``; any other case goes on to the engine's own."""

    graph_scenarios: ClassVar[Mapping[str, GraphScenario]]

    def graph_call(self, case: AttentionCase) -> AttentionCase:
        """The kernel call the graph captures (each engine's ``captured_call``)."""
        raise NotImplementedError(f"{type(self).__name__} must define graph_call")

    def graph_prepare(self, case: AttentionCase, inputs: Any, backend: Any, device: str) -> Any:
        """The engine's graph run of a checked graph case (capture at the bucket, replay each batch)."""
        raise NotImplementedError(f"{type(self).__name__} must define graph_prepare")

    def supports(self, case: AttentionCase, backend: Any, device: str) -> Support:
        if case.scenario not in self.graph_scenarios:
            return super().supports(case, backend, device)
        if device.split(":")[0] not in backend.devices:
            return Support(False, f"runs on {'/'.join(backend.devices)}, not {device}")
        self.check(case)
        return graph_support(backend, self.graph_call(case), device)

    def prepare(self, case: AttentionCase, inputs: Any, backend: Any, device: str) -> Any:
        if case.scenario not in self.graph_scenarios:
            return super().prepare(case, inputs, backend, device)
        self.check(case)
        return self.graph_prepare(case, inputs, backend, device)


def get_graph_runner_block_tables(num_seqs: int, block_tables: list[list[int]], graph: torch.Tensor) -> torch.Tensor:
    """The seeds' ``_get_graph_runner_block_tables``: rows ``[:num_seqs]`` of the persistent ``graph``, each real
    row's first entries written (a longer list cut at ``max_blocks``), the rest kept."""
    max_batch_size, max_blocks = graph.shape
    if num_seqs > max_batch_size:  # the seed asserts max_batch_size >= num_seqs
        raise ValueError(
            f"graph_block_tables: batch of {num_seqs} sequences exceeds the captured bucket of {max_batch_size}"
        )
    rows = graph[:num_seqs]
    for i, block_table in enumerate(block_tables):
        if block_table:
            rows[i, : min(len(block_table), max_blocks)] = torch.tensor(block_table[:max_blocks], dtype=torch.int32)
    return rows


def decode_lists(
    live: list[Request], perm: list[int], bucket: int, width: int, bs: int
) -> tuple[list[int], list[int], list[list[int]]]:
    """``(seq_lens, slot_mapping, block_tables)`` of the batch padded to ``bucket``: each live request's pages taken
    in order from ``perm`` (the block manager's shuffled ids), its new tokens' slots; padded ``seq_lens`` 1 and
    ``PAD_SLOT_ID`` slots; ``block_tables`` extended by ``[] * pad`` as the seed writes it (by nothing)."""
    pad = bucket - len(live)
    block_tables, slot_mapping, cursor = [], [], 0
    for i, r in enumerate(live):
        if r.kv > width * bs:
            raise ValueError(
                f"seq_lens[{i}] = {r.kv} exceeds graph_block_tables' {width} blocks of {bs} (the bucket's "
                "max_seq_len_to_capture)"
            )
        block_tables.append(perm[cursor : cursor + blocks_needed(r.kv, bs)])
        cursor += len(block_tables[-1])
        slot_mapping += token_slots(block_tables[-1], range(r.cached, r.kv), bs)
    seq_lens = [r.kv for r in live] + [PAD_SEQ_LEN] * pad  # the runner pads seq_lens with 1
    slot_mapping += [PAD_SLOT_ID] * pad
    block_tables.extend([] * pad)  # as the seed writes it: extends by nothing
    return seq_lens, slot_mapping, block_tables


def replay_batches(case: AttentionCase, bucket: int) -> Iterator[tuple[int, int, list[int], list[Request]]]:
    """``(i, n, group, live)`` per replayed batch: its size, its requests' indices in the case, the live decodes;
    ``ValueError`` for a batch larger than the bucket."""
    start = 0
    for i, n in enumerate(case.graph):
        if n > bucket:
            raise ValueError(
                f"graph_block_tables: replay batch of {n} requests exceeds the captured bucket of {bucket}"
            )
        group = list(range(start, start + n))
        start += n
        yield i, n, group, [Request(new=1, cached=case.kv_lens[r] - 1) for r in group]
