"""Backward calls through autograd: the :class:`~attnfast.base.BackwardCall` of every adapter whose kernel has an
autograd rule (FA2's and FA4's ``autograd.Function``, torch's flash op, SDPA) and of a third-party kernel written in
differentiable PyTorch.

An adapter hands :class:`AutogradBackward` a forward closure over leaf tensors (:func:`grad_leaves`: detached copies
of the case's q, k, v in the case dtype with ``requires_grad``, and the sinks in fp32 where the kernel learns them)
that returns ``out (total_q, h, dv)`` and the LSE (``(h, total_q)`` fp32 in the reference's convention, or None).
Calling the object runs that forward, then ``torch.autograd.grad(out, leaves, dout, retain_graph=True)``: the
gradients of ``sum(out * dout)`` come back in the leaves' layouts, which are the reference's varlen layouts, so an
adapter that slices, pads, repeats or concatenates inside the closure needs no conversion afterwards (autograd
un-slices, un-pads and sums a GQA group itself).  ``backward_only`` reruns only the gradient call on the graph of
the last forward (kept by ``retain_graph``), which is what backward timing measures.  A leaf the forward never
reached (no query row at all) gets a zero gradient.

``lse_slack`` (the forward's per-row LSE allowance, :class:`attnfast.base.KernelOutput`) is handed on unchanged in
every :class:`~attnfast.base.GradOutput`.

``context`` wraps the forward and the backward: :func:`deterministic_algorithms` for kernels whose deterministic
mode is torch's global switch rather than an argument (torch's flash and memory-efficient backward kernels).

``variant`` names the kernel variant the call runs, forward and backward (:meth:`attnfast.base.Backend.prepare`'s
``variant``, for the backward record's ``extra["variant"]``): a dict of JSON scalars, or a zero-argument callable
returning one, which :attr:`AutogradBackward.variant` calls after the call under ``context`` with grad mode on (what
a dispatcher reads to pick a kernel: SDPA's reads ``requires_grad`` and the deterministic switch); a callable that
raises gives ``{"unread": "<error>"}`` (the variant judges nothing).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from conformance.cases.inputs import CaseInputs

from .base import GradOutput

__all__ = ["AutogradBackward", "GradLeaves", "deterministic_algorithms", "grad_leaves"]


@dataclass(frozen=True)
class GradLeaves:
    """The tensors the gradients are taken with respect to (leaves with ``requires_grad``)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    sinks: torch.Tensor | None = None

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.q, self.k, self.v) if self.sinks is None else (self.q, self.k, self.v, self.sinks)


def grad_leaves(inputs: CaseInputs, learn_sinks: bool = False) -> GradLeaves:
    """Leaf copies of ``inputs.q/k/v`` in the case dtype (and of the fp32 sinks when ``learn_sinks``)."""
    dt = inputs.case.torch_dtype

    def leaf(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return t.detach().to(dtype).clone().requires_grad_(True)

    sinks = None
    if learn_sinks:
        if inputs.sinks is None:
            raise ValueError("learn_sinks needs a case with sinks (inputs.sinks is None)")
        sinks = leaf(inputs.sinks, torch.float32)
    return GradLeaves(leaf(inputs.q, dt), leaf(inputs.k, dt), leaf(inputs.v, dt), sinks)


@contextlib.contextmanager
def deterministic_algorithms() -> Iterator[None]:
    """``torch.use_deterministic_algorithms(True)`` (not warn-only) for the block, the previous setting restored."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


ForwardFn = Callable[[GradLeaves], tuple[torch.Tensor, torch.Tensor | None]]


class AutogradBackward:
    """A :class:`~attnfast.base.BackwardCall` through autograd (see the module docstring)."""

    def __init__(
        self,
        forward: ForwardFn,
        leaves: GradLeaves,
        dout: torch.Tensor | None,
        *,
        context: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
        notes: tuple[str, ...] = (),
        lse_slack: torch.Tensor | None = None,
        variant: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        if dout is None:
            raise ValueError("a backward call needs the upstream gradient inputs.dout (set for a backward case)")
        self._forward = forward
        self.leaves = leaves
        self._dout = dout.detach()
        self._context = context
        self.notes = notes
        self._lse_slack = lse_slack
        self._variant = variant
        self._last: tuple[torch.Tensor, torch.Tensor | None] | None = None

    def __call__(self) -> GradOutput:
        with self._context(), torch.enable_grad():
            out, lse = self._forward(self.leaves)
            self._last = (out, lse)
            return self._grads(out, lse)

    @property
    def variant(self) -> dict[str, Any]:
        """The kernel variant of the call (see the module docstring); ``{}`` when the adapter names none."""
        v = self._variant
        if v is None:
            return {}
        if not callable(v):
            return dict(v)
        try:
            with self._context(), torch.enable_grad():
                return dict(v())
        except Exception as exc:  # noqa: BLE001 - any failure of an informational read is recorded as such
            return {"unread": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"}

    def backward_only(self) -> GradOutput:
        """The gradient call again on the last forward's graph (for timing the backward alone)."""
        if self._last is None:
            raise RuntimeError("backward_only reruns the backward of the last forward: call the backward call first")
        with self._context(), torch.enable_grad():
            return self._grads(*self._last)

    def _grads(self, out: torch.Tensor, lse: torch.Tensor | None) -> GradOutput:
        leaves = self.leaves.tensors()
        got: Sequence[torch.Tensor | None]  # allow_unused: None for a leaf the output does not depend on
        if out.requires_grad:
            dout = self._dout.to(out.dtype) if self._dout.dtype != out.dtype else self._dout
            got = torch.autograd.grad(out, leaves, dout, retain_graph=True, allow_unused=True)
        else:  # nothing reached the leaves (e.g. no query row): every gradient is 0
            got = (None,) * len(leaves)
        grads = [torch.zeros_like(t) if g is None else g for t, g in zip(leaves, got, strict=True)]
        dsinks = grads[3] if len(grads) == 4 else None
        lse = None if lse is None else lse.detach()
        return GradOutput(out.detach(), lse, grads[0], grads[1], grads[2], dsinks, self._lse_slack)
