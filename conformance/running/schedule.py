"""The order a sweep hands its cases to the workers: longest first, by an estimate of each case's cost.

A case goes to one worker with all of its backends (a *unit*; its reference is computed once), and the pool
hands units out as workers free up.  In the selection's order (``--schedule fifo``) the large cases of a suite
(long prefills, many heads) may come last, and the run then waits for a few workers to finish them while the
others idle: the makespan is at least the last unit's start plus its cost.  Longest first (LPT, the default
``--schedule cost``) starts them while every other worker still has work, which bounds the makespan by
``sum / workers + the longest unit`` and in practice brings it near ``sum / workers``.

**The estimate** (:class:`CostModel`): a unit costs its context (inputs, reference, baseline) plus each pair's
check.  Measured seconds come first: ``--costs FILE`` (a results file of an earlier run of the same cases; the
file ``--resume`` continues is read too): a pair's ``extra["worker_s"]``, its context from ``extra["t"]``
(:mod:`conformance.running.profile`).  Otherwise a line in the case's size, :func:`case_size` = sum over its
requests of ``q_len x kv_len x heads x (d + dv)`` (the attention's multiply-adds), ``a + b x size``, fitted per
backend (and for the context) by least squares to the measured records when there are at least three, else
defaults whose ratio ``a / b`` was read off a CPU run of ``smoke`` (only the order matters).

The compile affinity of :class:`~conformance.running.pool.WorkFeed` is kept: its queues follow the order given
here, and it weighs a key's group by the cost of its units.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.records import CheckResult, Status

__all__ = ["CostModel", "case_size", "load_costs", "order_units", "schedule_units"]

#: a + b * size defaults (seconds, multiply-adds): a context and a check of a 64-token case are ~ms on CPU
_DEFAULT_CONTEXT = (5e-3, 2e-9)
_DEFAULT_PAIR = (5e-3, 1e-9)


def case_size(case: Any) -> float:
    """The attention's multiply-adds: sum over requests of ``q_len x kv_len x heads x (d + dv)``."""
    heads, width = case.num_heads, case.head_dim + case.dv
    return float(sum(q * k for q, k in case.requests) * heads * width)


def _fit(points: Sequence[tuple[float, float]], default: tuple[float, float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` with a, b >= 0 (the default with fewer than three points or a degenerate x)."""
    if len(points) < 3:
        return default
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        return (max(0.0, my), default[1])
    b = max(0.0, sum((x - mx) * (y - my) for x, y in points) / sxx)
    a = max(0.0, my - b * mx)
    return (a, b)


@dataclass
class CostModel:
    """Estimated seconds of a case's context and of each (case, backend) check (see the module docstring)."""

    #: (case id, backend name) -> measured check seconds (the worker's time less the context)
    pair_s: dict[tuple[str, str], float] = field(default_factory=dict)
    #: case id -> measured context seconds (inputs + reference + baseline)
    context_s: dict[str, float] = field(default_factory=dict)
    context_line: tuple[float, float] = _DEFAULT_CONTEXT
    pair_line: dict[str, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def from_records(cls, records: Iterable[CheckResult]) -> CostModel:
        """Measured costs from earlier records (the last record of a pair wins), and lines fitted to them."""
        model = cls()
        sizes: dict[str, float | None] = {}
        by_backend: dict[str, list[tuple[float, float]]] = defaultdict(list)
        contexts: list[tuple[float, float]] = []
        for r in records:
            extra = r.extra if isinstance(r.extra, dict) else {}
            if r.status in (Status.CRASH, Status.TIMEOUT):
                seconds, context = float(extra.get("roundtrip_s", r.elapsed_s) or 0.0), 0.0
            else:
                t = extra.get("t")
                t = t if isinstance(t, dict) else {}
                context = sum(float(t.get(k, 0.0)) for k in ("in", "ref", "base"))
                seconds = float(extra.get("worker_s", r.elapsed_s) or 0.0) - context
            if not math.isfinite(seconds) or seconds < 0:
                continue
            model.pair_s[r.case_id, r.backend] = seconds
            if context > 0:
                model.context_s[r.case_id] = context
            size = sizes.get(r.case_id)
            if size is None:
                size = sizes[r.case_id] = _size_of_json(r.case)
            if size is not None:
                by_backend[r.backend].append((size, seconds))
                if context > 0:
                    contexts.append((size, context))
        model.context_line = _fit(contexts, _DEFAULT_CONTEXT)
        model.pair_line = {b: _fit(points, _DEFAULT_PAIR) for b, points in by_backend.items()}
        return model

    def unit_cost(self, case: Any, backends: Sequence[str]) -> float:
        """Seconds of ``case`` with ``backends`` (names) on one worker: its context plus each check."""
        size = case_size(case)
        if case.id in self.context_s:
            context = self.context_s[case.id]
        else:
            a, b = self.context_line
            context = a + b * size
        total = context
        for name in backends:
            if (case.id, name) in self.pair_s:
                total += self.pair_s[case.id, name]
            else:
                a, b = self.pair_line.get(name, _DEFAULT_PAIR)
                total += a + b * size
        return total


def _size_of_json(case_json: Any) -> float | None:
    try:
        from conformance.cases.case import AttentionCase

        return case_size(AttentionCase.from_json(case_json))
    except (KeyError, TypeError, ValueError):
        return None


def order_units(units: list[list[Any]], cost: dict[str, float]) -> list[list[Any]]:
    """``units`` (lists of pairs with ``.case``) longest first by ``cost`` (case id -> seconds); ties keep their
    order, so the order is deterministic."""
    return sorted(units, key=lambda u: -cost.get(u[0].case.id, 0.0))


def load_costs(path: Any) -> list[CheckResult]:
    """The records of ``--costs FILE`` (a results file); :class:`~conformance.exits.UsageError` when it cannot be
    read or holds no result."""
    from conformance.exits import UsageError
    from conformance.results_file import load_results, ResultsFileError

    try:
        # timings are a scheduling hint, not a verdict: a pair recorded twice counts once (its last record)
        return list(load_results(path, allow_skipped=True, need_header=False, drop_duplicates=True).results)
    except ResultsFileError as exc:
        raise UsageError(f"--costs {exc}") from None


def schedule_units(
    units: list[list[Any]], names: dict[str, str], records: Iterable[CheckResult], mode: str
) -> tuple[list[list[Any]], dict[str, float]]:
    """The units in the order ``mode`` gives (``cost``: longest first; ``fifo``: as selected) and each case's
    estimated seconds, from ``records`` (measured) and the size model; ``names`` maps a spec to its backend name."""
    model = CostModel.from_records(records)
    cost = {u[0].case.id: model.unit_cost(u[0].case, [names[p.spec] for p in u]) for u in units}
    return (order_units(units, cost) if mode == "cost" else list(units)), cost
