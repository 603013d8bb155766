"""The composition that judges a backward case (``AttentionCase.backward``): the forward and the gradients.

:func:`conformance.verdict.check.composition_of` hands a backward case here.  :meth:`Backward.prepare` returns a
:class:`BackwardRun`, whose call runs the adapter's training call (:meth:`attnfast.base.Backend.prepare_backward`:
forward, then backward of ``sum(out * dout)``) and returns its forward ``KernelOutput(out, lse, lse_slack)``, which
:func:`~conformance.verdict.check.check_backend` judges like any forward (against :meth:`Backward.reference` and
:meth:`Backward.baseline`, the plain forward ones).  The gradients are judged in the call
(:mod:`conformance.backward.verdict`, against :mod:`conformance.backward.gradients`): each failed sub-check is one
of the run's ``problems`` (the case FAILS with them), and the numbers go to the record's ``extra["backward"]``::

    {"tensors": {"dq": {max_abs, allowed, error_ratio, baseline_max_abs, mean_abs, baseline_mean_abs,
                        nonfinite, cosine, baseline_cosine, cosine_judged, worst, failed}, "dk": ..., "dv": ...,
               "dsinks": ...},
     "worst_ratio": max error ratio over the tensors,
     "tolerance": the gradient tolerance's fields,
     "dsinks": "judged" | "not returned" (the kernel does not learn sinks) | absent without sinks,
     "baseline_alibi_dtype": "bfloat16" | "float16" (the backend hands ALiBi as a bias in that dtype and the
                             baseline rounds it so: conformance.backward.gradients) | absent otherwise,
     "deterministic": {"requested": case.deterministic, "equal": bool, "differs": [tensors]}}

The record's ``extra["variant"]`` is the training call's ``variant`` (:attr:`BackwardRun.variant`: the kernel variant
of forward and backward, as :meth:`attnfast.base.Backend.prepare_backward` says), read by
:func:`~conformance.verdict.check.check_backend` after the call like a forward's, so the report's *Kernel variants*
and ``attnconf compare``'s variant changes include backward records.

Run to run: the backward runs twice on the same inputs and the two sets of gradients are compared bit for bit.
With ``case.deterministic`` (the kernel's deterministic option asked for) a difference fails the case; without it
the record says whether the runs were equal.  The record's ``kernel_s`` is the two runs; the gradient verdict runs
when ``extra`` or ``problems`` is first read (harness time).  Later calls of the same :class:`BackwardRun` (the
timer's) run the training call once each and judge nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attnfast.base import Backend, GradOutput, KernelOutput, Support
from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from .gradients import CaseGrads, gradients
from .verdict import GRADS, judge, resolve_grad

__all__ = ["BACKWARD", "Backward", "BackwardRun", "bits_equal", "composition_for"]


def bits_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two tensors hold the same bits (NaN payloads included; None equals None only)."""
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


class BackwardRun:
    """The callable :meth:`Backward.prepare` returns (``notes``, ``problems``, ``extra`` as the contract says)."""

    def __init__(self, case: AttentionCase, inputs: CaseInputs, backend: Backend, device: str) -> None:
        self.case, self.inputs, self.backend, self.device = case, inputs, backend, device
        self.notes: list[str] = []
        self._problems: list[str] = []
        self._extra: dict[str, Any] = {}
        self._runs: tuple[GradOutput, GradOutput] | None = None
        self._judged = False
        self.call = backend.prepare_backward(case, inputs)
        #: reruns only the kernel's backward (for timing), when the adapter offers it
        self.backward_only: Callable[[], GradOutput] | None = getattr(self.call, "backward_only", None)

    def __call__(self) -> KernelOutput:
        first = self.call()
        _check_type(first)
        if self._runs is None:  # the verified call: a second run for the bitwise comparison
            # copies: an adapter that reuses its output buffers must not make the second run overwrite the first
            clones: dict[str, Any] = {k: None if t is None else t.clone() for k, t in vars(first).items()}
            first = GradOutput(**clones)
            second = self.call()
            _check_type(second)
            self._runs = (first, second)
            self.notes.extend(getattr(self.call, "notes", None) or ())
        return KernelOutput(first.out, first.lse, first.lse_slack)

    @property
    def variant(self) -> dict[str, Any]:
        """The training call's kernel variant (its ``variant``, read now: after the call), ``{}`` when it names
        none."""
        return dict(getattr(self.call, "variant", None) or {})

    # the gradient verdict runs when check_backend first reads it, after the timed call (harness time, not kernel's)
    @property
    def extra(self) -> dict[str, Any]:
        self._judge_once()
        return self._extra

    @property
    def problems(self) -> list[str]:
        self._judge_once()
        return self._problems

    def _judge_once(self) -> None:
        if self._runs is not None and not self._judged:
            self._judged = True
            try:
                self._extra["backward"] = self._judge(*self._runs)
            except Exception as exc:  # read outside check_backend's guard: a failure to judge fails the case
                lines = str(exc).strip().splitlines()
                self._problems.append(
                    f"backward: the gradients could not be judged: {type(exc).__name__}: {lines[0] if lines else ''}"
                )

    def _judge(self, first: GradOutput, second: GradOutput) -> dict[str, Any]:
        case = self.case
        alibi_dtype = self.backend.alibi_bias_dtype(case) if case.alibi else None
        grads: CaseGrads = gradients(case, self.inputs, alibi_dtype=alibi_dtype)
        tol = resolve_grad(case, self.backend.name)
        out: dict[str, Any] = {"tensors": {}, "tolerance": tol.fields()}
        if alibi_dtype is not None:  # the baseline's ALiBi is the backend's rounded bias
            out["baseline_alibi_dtype"] = str(alibi_dtype).removeprefix("torch.")
        for name in GRADS:
            ref = getattr(grads.ref, name)
            got = getattr(first, name)
            if name == "dsinks":
                if ref is None:
                    continue
                if got is None:  # the kernel does not learn sinks: nothing to judge, said in the record
                    out["dsinks"] = "not returned"
                    continue
                out["dsinks"] = "judged"
            stats, problems = judge(name, got, ref, getattr(grads.base, name), tol, case.torch_dtype)
            out["tensors"][name] = stats
            self._problems.extend(problems)
        ratios = [s["error_ratio"] for s in out["tensors"].values() if "error_ratio" in s]
        out["worst_ratio"] = max(ratios) if ratios else None
        differs = [n for n in GRADS if not bits_equal(getattr(first, n), getattr(second, n))]
        out["deterministic"] = {"requested": case.deterministic, "equal": not differs, "differs": differs}
        if case.deterministic and differs:
            detail = ", ".join(f"{n} {_diff(getattr(first, n), getattr(second, n))}" for n in differs)
            self._problems.append(
                f"backward deterministic: two runs of the deterministic backward differ bitwise in {detail}"
            )
        return out


def _diff(a: torch.Tensor | None, b: torch.Tensor | None) -> str:
    if a is None or b is None or a.shape != b.shape:
        return "(one run returned none or another shape)"
    d = (a.double() - b.double()).abs()
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    return f"({int((d != 0).sum())} elements, max |diff| {float(d.max()):.3g})"


def _check_type(result: Any) -> None:
    if not isinstance(result, GradOutput):
        raise TypeError(f"prepare_backward's callable must return GradOutput, got {type(result).__name__}")
    for name in ("out", "lse", "dq", "dk", "dv", "dsinks"):
        value = getattr(result, name)
        if not isinstance(value, torch.Tensor) and not (value is None and name in ("lse", "dsinks")):
            kind = "a torch.Tensor or None" if name in ("lse", "dsinks") else "a torch.Tensor"
            raise TypeError(f"GradOutput.{name} must be {kind}, got {type(value).__name__}")


class Backward:
    """The composition of a backward case (``conformance.verdict.check.composition_of``)."""

    name = "backward"

    def refuses(self, case: AttentionCase) -> str:
        """Nothing: the case model keeps a backward case to what the training call takes
        (:mod:`conformance.cases.backward_fields`)."""
        return ""

    def supports(self, case: AttentionCase, backend: Backend, device: str) -> Support:
        refused = backend.refusals()
        needed = ("backward", "bwd_deterministic") if case.deterministic else ("backward",)
        for feature in needed:
            if feature in refused:
                return Support(False, f"{feature}: {refused[feature]}")
        return backend.supports(case, device)

    def prepare(self, case: AttentionCase, inputs: CaseInputs, backend: Backend, device: str) -> BackwardRun:
        return BackwardRun(case, inputs, backend, device)

    def reference(self, case: AttentionCase, inputs: CaseInputs) -> AttnResult:
        """The forward reference; the gradients' reference and baseline are computed (and cached) with it."""
        from conformance.verdict.reference import reference

        fwd = reference(case, inputs)
        gradients(case, inputs, fwd)
        return fwd

    def baseline(self, case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        from conformance.verdict.baseline import baseline

        return baseline(case, inputs)


BACKWARD = Backward()


def composition_for(case: AttentionCase) -> Backward:
    """The composition of a ``backward`` case (:data:`conformance.verdict.composition.COMPOSITIONS`)."""
    return BACKWARD
