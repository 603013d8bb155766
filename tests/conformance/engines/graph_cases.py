"""Test helper the CUDA-graph engine tests share (``test_vllm_*_graph.py``).

:class:`GraphCases`: an engine's graph-scenario cases by scenario name, each case's prepared context built once per
test session, and :meth:`GraphCases.check_on_cpu`, the verdict on sdpa-cpu with the checks every graph replay
carries (a pass, one replay per batch of the case's ``graph``, each replay bitwise equal to its eager run).
"""

from __future__ import annotations

from collections.abc import Container

from attnfast.registry import get_backend
from conformance.cases.case import AttentionCase
from conformance.engines.base import Engine
from conformance.records import CheckResult, Status
from conformance.verdict.check import CaseContext, check_backend, prepare_context

__all__ = ["GraphCases"]


class GraphCases:
    """``engine``'s cases whose scenario is in ``scenarios``, and their contexts (seed 0, CPU), prepared once."""

    def __init__(self, engine: Engine, scenarios: Container[str]) -> None:
        self.cases: dict[str, AttentionCase] = {c.scenario: c for c in engine.cases() if c.scenario in scenarios}
        self._ctx: dict[str, CaseContext] = {}

    def ctx(self, name: str) -> CaseContext:
        if name not in self._ctx:
            self._ctx[name] = prepare_context(self.cases[name], 0, "cpu")
        return self._ctx[name]

    def check_on_cpu(self, name: str) -> CheckResult:
        """The verdict on sdpa-cpu, asserted a pass with every batch replayed and equal to its eager run."""
        res = check_backend(self.ctx(name), get_backend("sdpa-cpu"))
        assert res.status is Status.PASS, res.reason
        graph = res.extra["graph"]
        assert [r["requests"] for r in graph["replays"]] == list(self.cases[name].graph)
        assert all(r["vs_eager"]["equal"] for r in graph["replays"]) and graph["graph_vs_eager_kept"]
        return res
