"""The engine-replay protocol: an engine backend's attention layer rebuilt as a composition of kernel calls.

An engine case is an :class:`~conformance.cases.case.AttentionCase` with ``engine`` (a registry name of
:mod:`conformance.engines`) and ``scenario`` (one of that engine's named batches) set; its other fields
describe the layer (heads, head dims, dtype, KV layout and block size, window, soft-cap, sinks, ALiBi,
quantization) and ``requests`` the step's sequences as ``(q_len, kv_len)``.  The tensors are
``make_inputs(case, seed)``'s, as for any case: ``q`` holds the step's new tokens, ``k``/``v`` every key of
every request (cached context first, the new tokens last).

An :class:`Engine` then does what the engine's backend does, in the engine's own way:

* :meth:`Engine.forward` builds the metadata as the seed's builder does (query start locations, sequence
  lengths, block tables and slot mappings, decode/prefill split, cascade prefix, virtual batches, context
  chunks, ...), writes the cache as the engine does, and makes its kernel calls through a
  :data:`Kernel`: each call is described as an ``AttentionCase`` plus the engine's own tensors in a
  ``CaseInputs``, and runs on whatever adapter (:mod:`attnfast`) the run names, with that adapter's
  declarations and conventions (``fa2``, ``fa3-vllm``, ``fa4``, ``flashmla``, the CPU backends, ...);
* :meth:`Engine.plan` lists those calls without tensors, so a backend that refuses one of them makes the
  whole replay ``unsupported`` with the refused call's label and reason;
* :meth:`Engine.reference` is the whole layer computed directly over the full KV (by default
  :func:`conformance.verdict.reference.reference` on the case: plain attention of each request's new
  tokens over all its keys), without the engine's tricks; :meth:`Engine.baseline` its same-precision
  baseline.  The verdict is the harness's usual one, on the layer output (and the LSE where the engine
  produces one).

So a bug between the kernel calls (a metadata builder, a cascade heuristic, a merge that mishandles an
infinite LSE, a context-parallel interleave, V padding left in) shows as a failing layer on kernels that
pass every single call.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from attnfast.base import Backend, KernelOutput, Support
from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

__all__ = ["Call", "Engine", "EngineRun", "Kernel", "Request", "UnsupportedCall", "backend_kernel", "call_inputs"]


@dataclass(frozen=True)
class Request:
    """One sequence of an engine step (the batch description engines schedule).

    Attributes:
        new: tokens computed this step (a prompt or a prompt chunk; 1 for a decode; 1 + k for a speculative
            decode with k draft tokens).
        cached: tokens already in the KV cache before the step (prefix-cache hit, earlier chunks, context).
        encoder: encoder tokens (the keys of cross attention; the whole sequence of encoder-only attention).
    """

    new: int
    cached: int = 0
    encoder: int = 0

    @property
    def kv(self) -> int:
        """Keys the request's self-attention sees: its cached context and its new tokens."""
        return self.cached + self.new


@dataclass(frozen=True)
class Call:
    """One kernel call of an engine: ``case`` describes it as the adapters know calls, ``inputs`` carries the
    engine's tensors (``inputs.case is case``), ``label`` says which call of the composition it is."""

    label: str
    case: AttentionCase
    inputs: CaseInputs


#: Runs one call on the backend under test: ``kernel(call) -> KernelOutput`` (out ``(total_q, h, dv)``, LSE
#: ``(h, total_q)`` natural log, ``-inf`` on rows without keys, or None when the adapter has none).
Kernel = Callable[[Call], KernelOutput]


class UnsupportedCall(Exception):
    """A call of the composition that the backend refuses (raised by :func:`backend_kernel`)."""


def backend_kernel(backend: Backend, device: str, log: list[str] | None = None) -> Kernel:
    """A :data:`Kernel` running each call on ``backend`` (support checked, prepared, run); ``log`` collects
    one line per call for the record."""

    def run(call: Call) -> KernelOutput:
        support = backend.supports(call.case, device)
        if not support:
            raise UnsupportedCall(f"{call.label}: {support.reason}")
        fn = backend.prepare(call.case, call.inputs)
        if log is not None:
            log.append(f"{call.label}: {backend.name} {call.case.summary()}")
        return fn()

    return run


def call_inputs(case: AttentionCase, **tensors: Any) -> CaseInputs:
    """``CaseInputs`` of a call from the engine's tensors: ``q``, ``k``, ``v``, ``cu_seqlens_q``,
    ``cu_seqlens_k`` are required (for a paged call ``k``/``v`` are the keys each request sees, packed, which
    only reference-reading fakes use; the adapters read ``k_cache``/``v_cache``/``block_table``);
    ``seqlens_k`` defaults to the case's kv lengths."""
    dev = tensors["q"].device
    tensors.setdefault("seqlens_k", torch.tensor(case.kv_lens, dtype=torch.int32, device=dev))
    return CaseInputs(case=case, **tensors)


@dataclass
class EngineRun:
    """The callable :meth:`Engine.prepare` returns: one engine forward per call; ``notes`` lists the kernel
    calls of the last forward (the record's ``extra["notes"]``)."""

    forward: Callable[[Kernel], KernelOutput]
    backend: Backend
    device: str
    notes: list[str] = dataclasses.field(default_factory=list)

    def __call__(self) -> KernelOutput:
        self.notes.clear()
        return self.forward(backend_kernel(self.backend, self.device, self.notes))


class Engine(abc.ABC):
    """One seed backend's attention layer (one module per engine in :mod:`conformance.engines`)."""

    #: registry name, e.g. ``"vllm_v1_fa"``.
    name: ClassVar[str]
    #: the seed document it replays, e.g. ``"001"``.
    seed: ClassVar[str]
    #: one line for the report.
    description: ClassVar[str] = ""

    @abc.abstractmethod
    def cases(self) -> list[AttentionCase]:
        """The engine's scenarios as cases (``engine`` and ``scenario`` set), for the ``engines`` suite."""

    @abc.abstractmethod
    def plan(self, case: AttentionCase) -> list[tuple[str, AttentionCase]]:
        """Every kernel call the forward of ``case`` makes, as ``(label, call case)``, without tensors."""

    @abc.abstractmethod
    def forward(self, case: AttentionCase, inputs: CaseInputs, kernel: Kernel) -> KernelOutput:
        """The engine's layer: metadata, cache writes, kernel calls through ``kernel``, merges.  Returns the
        layer output ``(total_q, h, dv)`` and its LSE ``(h, total_q)``, or None where the engine has none."""

    def check(self, case: AttentionCase) -> None:
        """Raise ``ValueError`` if ``case`` is not one this engine can replay (unknown scenario, a field its
        scenario fixes set otherwise, ...): the engine's declaration of what it replays (:meth:`refuses`).
        Everything the engine's ``plan`` and ``forward`` would refuse for a case's fields belongs here."""

    def refuses(self, case: AttentionCase) -> str:
        """Why this engine does not replay ``case`` (``""`` when it does): :meth:`check`'s message.  Read up front,
        from the case alone (:func:`conformance.verdict.check.refusal`), so such a case is unsupported with that
        reason on every backend, not an error."""
        try:
            self.check(case)
        except ValueError as exc:
            return f"engine {self.name}: {exc}"
        return ""

    def reference(self, case: AttentionCase, inputs: CaseInputs) -> AttnResult:
        """The whole layer computed directly over the full KV (fp32; fp64 for fp32 inputs)."""
        from conformance.verdict.reference import reference

        return reference(case, inputs)

    def baseline(self, case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The same-precision baseline of the whole layer (the tolerance model's yardstick)."""
        from conformance.verdict.baseline import baseline

        return baseline(case, inputs)

    def supports(self, case: AttentionCase, backend: Backend, device: str) -> Support:
        """Supported when the backend takes every planned call; else the first refusal, with the call's label."""
        if device.split(":")[0] not in backend.devices:
            return Support(False, f"runs on {'/'.join(backend.devices)}, not {device}")
        for label, call in self.plan(case):
            support = backend.supports(call, device)
            if not support:
                return Support(False, f"{label}: {support.reason}")
        return Support(True)

    def prepare(self, case: AttentionCase, inputs: CaseInputs, backend: Backend, device: str) -> EngineRun:
        """A callable running the whole forward on ``backend`` (what the verdict and the timer call)."""
        return EngineRun(lambda kernel: self.forward(case, inputs, kernel), backend, device)
