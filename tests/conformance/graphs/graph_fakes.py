"""Graph-mode fakes: one exact, and one per planted bug of issue 18 (each must fail its graph or invariance case).

They build on :class:`tests.conformance.fakes.ExactBackend` (attnref in fp32 reading the live ``seqlens_k``,
block table and cache of whatever inputs it is given), so every difference from ``fake-graph-exact`` is the one
planted mistake, in the place an engine or kernel makes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import torch

from attnfast.base import KernelOutput
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from tests.conformance.fakes import ExactBackend

__all__ = [
    "GRAPH_BUGS",
    "CapacityLengthsGraph",
    "FrozenLengthsGraph",
    "GraphExact",
    "NonDeterministic",
    "PaddedRowLeakGraph",
    "SchedulerGraph",
    "SplitsChangedGraph",
    "StaleSchedulerGraph",
    "StaleTableGraph",
]


def _last_bit(res: KernelOutput) -> KernelOutput:
    """The output one ulp up: what another accumulation order (another split count, another merge order) gives."""
    return KernelOutput(torch.nextafter(res.out, torch.full_like(res.out, float("inf"))), res.lse)


class GraphExact(ExactBackend):
    """Declares ``graph``; its graph-mode call reads the bucket's live buffers.  Must pass every graph case."""

    name: ClassVar[str] = "fake-graph-exact"
    accepts: ClassVar[frozenset[str]] = frozenset({"graph"})

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        return self.prepare(case, inputs)


class StaleTableGraph(GraphExact):
    """Planted: the block table copied at capture (a replay reads the capture batch's pages)."""

    name: ClassVar[str] = "fake-graph-stale-table"

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        assert inputs.block_table is not None
        return self.prepare(case, dataclasses.replace(inputs, block_table=inputs.block_table.clone()))


class FrozenLengthsGraph(GraphExact):
    """Planted: ``seqused_k`` / ``cu_seqlens_k`` not refreshed at replay (copies taken at capture)."""

    name: ClassVar[str] = "fake-graph-frozen-lengths"

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        frozen = dataclasses.replace(
            inputs, seqlens_k=inputs.seqlens_k.clone(), cu_seqlens_k=inputs.cu_seqlens_k.clone()
        )
        return self.prepare(case, frozen)


class CapacityLengthsGraph(GraphExact):
    """Planted: every request read to the bucket's capacity (``max_seqlen_k`` taken for each request's length)."""

    name: ClassVar[str] = "fake-graph-capacity"

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        full = torch.full_like(inputs.seqlens_k, max(case.kv_lens))
        return self.prepare(case, dataclasses.replace(inputs, seqlens_k=full))


class SchedulerGraph(GraphExact):
    """A kernel that plans from scheduler metadata (here: the key counts it will read), refreshed before every
    replay as vLLM's builder does.  Must pass."""

    name: ClassVar[str] = "fake-graph-scheduler"
    refreshes: ClassVar[bool] = True

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        plan = inputs.seqlens_k.clone()  # the metadata buffer, computed for the capture batch
        run = self.prepare(case, dataclasses.replace(inputs, seqlens_k=plan))
        live, refreshes = inputs.seqlens_k, self.refreshes

        class Planned:
            def refresh(self) -> None:
                if refreshes:
                    plan.copy_(live)

            def __call__(self) -> KernelOutput:
                return run()

        return Planned()


class StaleSchedulerGraph(SchedulerGraph):
    """Planted: the scheduler metadata of the capture batch reused at every replay (no refresh)."""

    name: ClassVar[str] = "fake-graph-stale-scheduler"
    refreshes: ClassVar[bool] = False


class PaddedRowLeakGraph(GraphExact):
    """Planted: the bucket's last (padded) row written into the first request's output."""

    name: ClassVar[str] = "fake-graph-padded-leak"

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        run = self.prepare(case, inputs)

        def leaky() -> KernelOutput:
            res = run()
            res.out[0] = res.out[-1]
            return res

        return leaky


class SplitsChangedGraph(GraphExact):
    """Planted: the captured call runs another split count than the eager call (emulated by its effect: another
    accumulation order, the last bit of every output)."""

    name: ClassVar[str] = "fake-graph-splits-changed"

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        run = self.prepare(case, inputs)
        return lambda: _last_bit(run())


class NonDeterministic(ExactBackend):
    """Planted: a merge whose order changes from one call to the next (every other call one ulp off)."""

    name: ClassVar[str] = "fake-nondeterministic"

    def __init__(self) -> None:
        self.calls = 0

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        run = super().prepare(case, inputs)

        def flaky() -> KernelOutput:
            self.calls += 1
            res = run()
            return _last_bit(res) if self.calls % 2 == 0 else res

        return flaky


#: Each planted bug and the kind of case that catches it (a graph case, or an invariance kind).
GRAPH_BUGS: dict[type, str] = {
    StaleTableGraph: "graph",
    FrozenLengthsGraph: "graph",
    CapacityLengthsGraph: "graph",
    StaleSchedulerGraph: "graph",
    PaddedRowLeakGraph: "graph",
    SplitsChangedGraph: "graph pinned",
    NonDeterministic: "run",
}
