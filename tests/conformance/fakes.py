"""Fake backends for tests anywhere in the project: one exact, several with a planted bug.

Every fake computes with :mod:`attnref` in fp32 and returns the output cast to the case dtype, so
``ExactBackend`` is what a perfect low-precision kernel would return, and each bug backend differs
from it by exactly one planted mistake.  :data:`PLANTED_BUGS` maps each bug backend to the case
feature that exposes it (a case without that feature leaves the bug invisible).

The fakes honour the kernel contract of :mod:`attnfast.base`: paged cases read keys through the
block table of the (cloned) cache, and append cases write the new keys into that cache first,
rewriting the same slots on every call (idempotent).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import ClassVar

import torch

from attnfast.base import Backend, KernelOutput
from attnref import AttnOptions, Numerics, Window, attention_paged, attention_varlen, write_kv_cache
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.verdict.reference import case_options, strict_fp32

__all__ = [
    "ALL_FAKES",
    "PLANTED_BUGS",
    "CrashingBackend",
    "ExactBackend",
    "HangingBackend",
    "LseSignBackend",
    "NoisyBackend",
    "RaisingBackend",
    "RefusesSinksBackend",
    "SinksIgnoredBackend",
    "SoftcapMissingBackend",
    "WindowOffByOneBackend",
]

FP32 = Numerics(dtype=torch.float32)


def _append_slots(case: AttentionCase, block_table: torch.Tensor) -> torch.Tensor:
    """Cache slots of each request's new tokens (its last q_len keys), as a kvcache append writes them."""
    bs = case.block_size
    assert bs is not None
    table = block_table.tolist()
    slots = [table[b][t // bs] * bs + t % bs for b, (ql, kl) in enumerate(case.requests) for t in range(kl - ql, kl)]
    return torch.tensor(slots, dtype=torch.long)


def attend_fp32(
    case: AttentionCase, inputs: CaseInputs, options: AttnOptions, sinks: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """attnref in fp32 the way the case's kernel would be fed: (out (total_q, h, dv) fp32, lse (h, total_q) fp32)."""
    with strict_fp32():
        if not case.paged:
            res = attention_varlen(
                inputs.q,
                inputs.k,
                inputs.v,
                inputs.cu_seqlens_q,
                inputs.cu_seqlens_k,
                options=options,
                alibi_slopes=inputs.alibi_slopes,
                sinks=sinks,
                numerics=FP32,
            )
            return res.out, res.lse
        assert inputs.k_cache is not None and inputs.v_cache is not None and inputs.block_table is not None
        if case.append:
            assert inputs.k_new is not None and inputs.v_new is not None
            write_kv_cache(
                inputs.k_new,
                inputs.v_new,
                inputs.k_cache,
                inputs.v_cache,
                _append_slots(case, inputs.block_table),
                layout=case.kv_layout,
            )
        res = attention_paged(
            inputs.q,
            inputs.k_cache,
            inputs.v_cache,
            inputs.block_table,
            inputs.seqlens_k,
            inputs.cu_seqlens_q,
            layout=case.kv_layout,
            options=options,
            alibi_slopes=inputs.alibi_slopes,
            sinks=sinks,
            numerics=FP32,
        )
        return res.out, res.lse


class ExactBackend(Backend):
    """attnref in fp32, output cast to the case dtype: the best a low-precision kernel can do.  Must pass."""

    name: ClassVar[str] = "fake-exact"
    family: ClassVar[str] = "fake"
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    description: ClassVar[str] = "test fake: fp32 reference cast to the case dtype"

    def options(self, case: AttentionCase) -> AttnOptions:
        """The options the fake kernel computes with (bug backends change them)."""
        return case_options(case)

    def sinks(self, inputs: CaseInputs) -> torch.Tensor | None:
        return inputs.sinks

    def finish(self, case: AttentionCase, out: torch.Tensor, lse: torch.Tensor) -> KernelOutput:
        return KernelOutput(out.to(case.torch_dtype), lse.float())

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        options, sinks = self.options(case), self.sinks(inputs)

        def run() -> KernelOutput:
            out, lse = attend_fp32(case, inputs, options, sinks)
            return self.finish(case, out, lse)

        return run


class WindowOffByOneBackend(ExactBackend):
    """Sees one key too many on the left of a bounded window (the transformers 39408 kind of bug)."""

    name = "fake-window-off-by-one"
    description = "test fake: window left extent + 1"

    def options(self, case: AttentionCase) -> AttnOptions:
        opts = case_options(case)
        if opts.window.left is None:
            return opts
        return opts.with_(window=Window(opts.window.left + 1, opts.window.right))


class SinksIgnoredBackend(ExactBackend):
    """Accepts sinks and drops them (vLLM 28561 kind of bug)."""

    name = "fake-sinks-ignored"
    description = "test fake: sinks silently dropped"

    def sinks(self, inputs: CaseInputs) -> torch.Tensor | None:
        return None


class SoftcapMissingBackend(ExactBackend):
    """Accepts a soft-cap and never applies it."""

    name = "fake-softcap-missing"
    description = "test fake: softcap ignored"

    def options(self, case: AttentionCase) -> AttnOptions:
        return case_options(case).with_(softcap=None)


class LseSignBackend(ExactBackend):
    """Correct output, LSE with the wrong sign (an adapter that negates a log2-space value, say)."""

    name = "fake-lse-sign"
    description = "test fake: returns -lse"

    def finish(self, case: AttentionCase, out: torch.Tensor, lse: torch.Tensor) -> KernelOutput:
        return KernelOutput(out.to(case.torch_dtype), -lse.float())


class NoisyBackend(ExactBackend):
    """Adds Gaussian noise of 50 x the dtype's epsilon (deterministic): an imprecise kernel."""

    name = "fake-noisy"
    description = "test fake: output + noise of 50 eps"

    def finish(self, case: AttentionCase, out: torch.Tensor, lse: torch.Tensor) -> KernelOutput:
        gen = torch.Generator().manual_seed(1234)
        noise = torch.randn(out.shape, generator=gen).to(out.device) * (50 * torch.finfo(case.torch_dtype).eps)
        return KernelOutput((out + noise).to(case.torch_dtype), lse.float())


class CrashingBackend(ExactBackend):
    """The kernel call kills the process (as an illegal memory access or a failed assert would)."""

    name = "fake-crashing"
    description = "test fake: os.abort() in the kernel"

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        def run() -> KernelOutput:
            os.abort()

        return run


class HangingBackend(ExactBackend):
    """The kernel call never returns (a deadlocked kernel)."""

    name = "fake-hanging"
    description = "test fake: sleeps forever in the kernel"

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        def run() -> KernelOutput:
            while True:
                time.sleep(3600)

        return run


class RaisingBackend(ExactBackend):
    """The kernel call raises a Python exception."""

    name = "fake-raising"
    description = "test fake: raises RuntimeError in the kernel"

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        def run() -> KernelOutput:
            raise RuntimeError("planted failure: fake kernel raised\nsecond line that the record leaves out")

        return run


class RefusesSinksBackend(ExactBackend):
    """Exact, but declares sinks unsupported (for UNSUPPORTED paths)."""

    name = "fake-refuses-sinks"
    description = "test fake: refuses sinks"
    refused: ClassVar[dict[str, str]] = {"sinks": "planted refusal: this fake has no sink support"}


#: Bug backend -> the case feature that exposes its bug.
PLANTED_BUGS: dict[type[ExactBackend], str] = {
    WindowOffByOneBackend: "window",
    SinksIgnoredBackend: "sinks",
    SoftcapMissingBackend: "softcap",
    LseSignBackend: "lse",
    NoisyBackend: "any",
}

ALL_FAKES: tuple[type[ExactBackend], ...] = (
    ExactBackend,
    WindowOffByOneBackend,
    SinksIgnoredBackend,
    SoftcapMissingBackend,
    LseSignBackend,
    NoisyBackend,
    CrashingBackend,
    HangingBackend,
    RaisingBackend,
    RefusesSinksBackend,
)
