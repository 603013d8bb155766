"""Verdicts of cases on CPU for the test modules, each case's context prepared once per test process.

:func:`conformance.verdict.check.prepare_context` (seed 0, CPU) computes a case's inputs, reference and baseline,
the costly part of a verdict (a d128 engine neighbour case's: about 16 s of CPU on the 2-core machine); every
backend a test asks about the case is then judged against the same context, as the runner judges every backend of
a case.  The modules that judge the same engine cases (tests/conformance/engines/test_engine_invariance.py and
test_engine_neighbour.py) share one cache, so a pytest-xdist worker that runs both prepares each case once.
"""

from __future__ import annotations

import pytest

from attnfast.base import Backend
from conformance.cases.case import AttentionCase
from conformance.records import CheckResult
from conformance.verdict.check import CaseContext, check_backend, prepare_context

__all__ = ["context", "params", "verdict"]

_CONTEXTS: dict[str, CaseContext] = {}


def context(case: AttentionCase) -> CaseContext:
    """The case's context (seed 0, CPU), prepared on the first call in this process."""
    if case.id not in _CONTEXTS:
        _CONTEXTS[case.id] = prepare_context(case, 0, "cpu")
    return _CONTEXTS[case.id]


def verdict(case: AttentionCase, backend: Backend) -> CheckResult:
    """``backend``'s record on ``case`` (:func:`conformance.verdict.check.check_backend` on :func:`context`)."""
    return check_backend(context(case), backend)


def params(cases: list[AttentionCase]) -> list:
    """The cases as pytest parameters (the case id as the test id), an engine ``neighbour`` case at head dim 128
    marked ``slow``: its context costs about four times its d64 twin's (twice the heads at twice the head dim:
    vllm_diff's 56 heads took 16 s of CPU to prepare and 16 s to judge), so the README's test command judges the
    d64 twin of every such case and ``nox -s slow`` judges both."""
    return [
        pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.invariance == "neighbour" and c.head_dim == 128 else [])
        for c in cases
    ]
