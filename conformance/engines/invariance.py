"""Engine-level invariances: a request's output through an engine's own metadata and calls, compared bit for bit.

An engine invariance case has ``engine``, ``scenario`` and ``invariance`` (``run``, ``batch`` or ``neighbour``)
set; its ``requests`` are the scenario's batch.  :class:`EngineInvariance` (what
:func:`conformance.verdict.check.composition_of` returns for it) runs the engine's whole forward (its metadata
builder, block tables, cache writes, kernel calls and merges, through :meth:`Engine.prepare`) once per variant
of :func:`conformance.graphs.invariance.variants`, each variant a batch assembled from the case's own tensors
(:func:`conformance.graphs.assemble.assemble`):

* ``run``: the same step twice;
* ``batch``: request 0 in its batch, alone, at the batch's last position, and beside the other requests cut to
  half their keys;
* ``neighbour``: request 0 beside its neighbour (request 1), alone, and beside the neighbour cut to 1, 9, 10, 64,
  65, 128 and 129 query tokens (a shorter prompt of the same tokens: it grows by one token and by one tile and
  turns from a decode into a prefill, so the engine's own decode/prefill split, reorder and call batching decide
  which calls request 0 shares with it).

Request 0's rows are compared bitwise (:func:`conformance.graphs.bitwise.diff_rows`) and recorded in
``extra["invariance"]`` in the kernel level's shape (the report's matrix shows them in the row ``engine <name>``,
``engine <name>, num_splits = 1`` for the batch-invariant / deterministic configurations).  A difference fails the
case when the engine promises it (:func:`promised`): always for ``run``; for ``batch`` and ``neighbour`` when the
case pins ``num_splits = 1`` (vLLM V1's batch-invariant mode, SGLang's deterministic inference) and the backend's
call takes the split count in every call the engine makes in every variant
(:meth:`attnfast.base.Backend.pins_splits`, the adapter's declared ``batch_invariance_via``); otherwise it is
reported, not failed.  Every variant is also judged numerically: the composition's output is the variants' layer
outputs one after the other, its reference the engine's reference of each variant (:meth:`Engine.reference`).

The engines replay an invariance scenario's batch from the case's ``requests`` (each ``(q_len, kv_len)`` a request
of ``q_len`` new tokens after ``kv_len - q_len`` cached ones) with the scenario's configuration, so every variant
is a step the engine builds from scratch (its own block hand-out, reorder and split into calls).
"""

from __future__ import annotations

from typing import Any

import torch

from attnfast.base import Backend, KernelOutput, Support
from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.graphs.assemble import assemble, assemble_refusal
from conformance.graphs.invariance import InvarianceRun, Variant, variants

from .base import Engine

__all__ = ["KINDS", "EngineInvariance", "EngineInvarianceRun"]

#: The invariances an engine case can ask for (``splits`` stays kernel level: an engine sets its own split count).
KINDS = ("run", "batch", "neighbour")


def _check_kind(case: AttentionCase) -> None:
    if case.invariance not in KINDS:
        raise ValueError(
            f"invariance must be one of {list(KINDS)} for an engine case (the engine sets its own split count), "
            f"got {case.invariance!r}"
        )


class EngineInvarianceRun(InvarianceRun):
    """The callable :meth:`EngineInvariance.prepare` returns: the engine's forward once per variant."""

    def __init__(self, case: AttentionCase, inputs: CaseInputs, backend: Backend, device: str, engine: Engine):
        super().__init__(case, inputs, backend, device)
        self.engine = engine

    def call(self, v: Variant, call: AttentionCase, inputs: CaseInputs) -> KernelOutput:
        fn = self.engine.prepare(call, inputs, self.backend, self.device)
        out = fn()
        calls = list(getattr(fn, "notes", None) or ())
        self.notes.append(f"{v.label}: {call.summary()}: {len(calls)} call(s)" + "".join(f"; {c}" for c in calls))
        self.problems.extend(f"{v.label}: {p}" for p in getattr(fn, "problems", None) or ())
        return out

    def promised(self) -> bool:
        return promised(self.engine, self.case, self.backend)


def promised(engine: Engine, case: AttentionCase, backend: Backend) -> bool:
    """``run``: always; ``batch`` and ``neighbour``: ``num_splits == 1`` and the backend's call takes it in every
    call every variant's step plans (the adapter's declaration, :meth:`~attnfast.base.Backend.pins_splits`); a
    variant that plans no call pins nothing."""
    if case.invariance == "run":
        return True
    if case.invariance not in ("batch", "neighbour") or case.num_splits != 1:
        return False
    plans = [engine.plan(v.case) for v in variants(case)]
    return all(plans) and all(backend.pins_splits(c) for calls in plans for _, c in calls)


class EngineInvariance:
    """The composition of an engine invariance case (see the module docstring); ``seed`` is the engine's."""

    name = "engine invariance"

    def __init__(self, engine: Engine):
        self.engine = engine
        self.seed = engine.seed

    def refuses(self, case: AttentionCase) -> str:
        """What no backend can run: a kind other than :data:`KINDS`, variants :func:`assemble` cannot build, or a
        variant the engine does not replay (:meth:`Engine.refuses`)."""
        if case.invariance not in KINDS:
            return (
                f"invariance must be one of {list(KINDS)} for an engine case (the engine sets its own split count), "
                f"got {case.invariance!r}"
            )
        refused = assemble_refusal(case)
        if refused:
            return refused
        for v in variants(case):
            refused = self.engine.refuses(v.case)
            if refused:
                return f"{v.label}: {refused}"
        return ""

    def supports(self, case: AttentionCase, backend: Backend, device: str) -> Support:
        _check_kind(case)
        for v in variants(case):
            support = self.engine.supports(v.case, backend, device)
            if not support:
                return Support(False, f"{v.label}: {support.reason}")
        return Support(True)

    def prepare(self, case: AttentionCase, inputs: CaseInputs, backend: Backend, device: str) -> EngineInvarianceRun:
        _check_kind(case)
        return EngineInvarianceRun(case, inputs, backend, device, self.engine)

    def _each(self, case: AttentionCase, inputs: CaseInputs, fn: Any) -> list[Any]:
        _check_kind(case)
        return [fn(*assemble(case, inputs, v.picks)) for v in variants(case)]

    def reference(self, case: AttentionCase, inputs: CaseInputs) -> AttnResult:
        parts = self._each(case, inputs, self.engine.reference)
        return AttnResult(torch.cat([p.out for p in parts]), torch.cat([p.lse for p in parts], dim=1))

    def baseline(self, case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        parts = self._each(case, inputs, self.engine.baseline)
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts], dim=1)
