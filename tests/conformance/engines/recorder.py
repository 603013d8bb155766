"""Test helpers the engine-replay tests share.

* :class:`Recorder`: a :data:`~conformance.engines.base.Kernel` that records every call an engine makes and answers
  it with that call's reference (an exact kernel), so a test can compare the calls with ``Engine.plan`` and the
  composition with the layer's reference;
* :func:`engine_verdict`: the harness's verdict of a case with the engine replaced by another instance (a planted
  bug or a finding's fix), on a named backend.
"""

from __future__ import annotations

import pytest

from attnfast.base import Backend, KernelOutput
from attnfast.registry import get_backend
from conformance.engines.base import Call, Engine
from conformance.records import CheckResult
from conformance.verdict.check import CaseContext, check_backend

__all__ = ["Recorder", "engine_verdict"]


class Recorder:
    """A kernel that records every call and answers it with the reference of that call."""

    def __init__(self) -> None:
        self.calls: list[Call] = []

    def __call__(self, call: Call) -> KernelOutput:
        from conformance.verdict.reference import reference

        self.calls.append(call)
        res = reference(call.case, call.inputs)
        return KernelOutput(res.out.to(call.case.torch_dtype), res.lse.float())


def engine_verdict(
    ctx: CaseContext, engine: Engine, monkeypatch: pytest.MonkeyPatch, backend: str | Backend = "sdpa-cpu"
) -> CheckResult:
    """``check_backend`` of ``ctx`` with every engine lookup answered by ``engine`` (for the rest of the test)."""
    monkeypatch.setattr("conformance.engines.get_engine", lambda name: engine)
    return check_backend(ctx, get_backend(backend) if isinstance(backend, str) else backend)
