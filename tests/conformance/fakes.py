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

import math
import os
import time
import zlib
from pathlib import Path
from collections.abc import Callable
from typing import ClassVar

import torch

from attnfast.base import OK, Backend, KernelOutput, Support
from attnref import AttnOptions, Numerics, Window, attention_paged, attention_varlen, row_bounds, write_kv_cache
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.verdict.reference import case_options, strict_fp32

__all__ = [
    "ALL_FAKES",
    "PLANTED_BUGS",
    "CrashSometimesBackend",
    "CrashingBackend",
    "DescaleDroppedBackend",
    "PerTensorDescaleBackend",
    "QvIgnoredBackend",
    "RopeNopeSwappedBackend",
    "StoredExactBackend",
    "VPadNotStrippedBackend",
    "WrongFp8FormatBackend",
    "ExactBackend",
    "HangingBackend",
    "LseSignBackend",
    "NoisyBackend",
    "RaisingBackend",
    "DeclaresNothingBackend",
    "NotInstalledBackend",
    "RefusesEverythingBackend",
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
    #: a kernel that takes a split count (and computes the same whatever it is): pinned, it promises batch invariance
    batch_invariance_via: ClassVar[str | None] = "num_splits"

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


#: :class:`CrashSometimesBackend` crashes on one case in this many (default 3)
CRASH_EVERY_ENV = "ATTNCONF_FAKE_CRASH_EVERY"


class CrashSometimesBackend(ExactBackend):
    """Exact, but the kernel call kills the process on about one case in ``$ATTNCONF_FAKE_CRASH_EVERY`` (3), chosen
    by the case id's CRC-32 (the same cases in every process and run): a kernel that crashes now and then."""

    name = "fake-crash-sometimes"
    description = "test fake: exact, os.abort() in the kernel on one case in N"

    @staticmethod
    def crashes(case: AttentionCase) -> bool:
        return zlib.crc32(case.id.encode()) % int(os.environ.get(CRASH_EVERY_ENV, "3")) == 0

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        run = super().prepare(case, inputs)

        def kernel() -> KernelOutput:
            if self.crashes(case):
                os.abort()
            return run()

        return kernel


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


class RefusesEverythingBackend(ExactBackend):
    """Exact, but declares no case supported: a run of it judges nothing (exit 4 unless --allow-unjudged)."""

    name = "fake-refuses-everything"
    description = "test fake: supports no case"

    def supports(self, case: AttentionCase, device: str) -> Support:
        return Support(False, "planted refusal: this fake supports no case")


class NotInstalledBackend(ExactBackend):
    """A backend for this machine's device whose package is not installed here (as fa2 on a GPU runner without
    flash-attn): named with ``--backend``, every pair is unsupported ("not available here")."""

    name = "fake-not-installed"
    description = "test fake: not available"
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    def is_available(self) -> Support:
        return Support(False, "planted: fake_kernel_pkg is not importable")


class LostDeviceBackend(ExactBackend):
    """Available when first asked in a process (the run's describe step), unavailable from then on: a GPU that
    faulted under the run and refuses new work.  Its pairs must not read as refusals."""

    name = "fake-lost-device"
    description = "test fake: device lost after the run began"
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    asked = 0

    def is_available(self) -> Support:
        type(self).asked += 1
        return OK if type(self).asked == 1 else Support(False, "planted: the device was lost")


class CudaOnlyBackend(ExactBackend):
    """Exact, but runs on CUDA only (as fa2): named with ``--device cpu`` it is refused before anything runs."""

    name = "fake-cuda-only"
    description = "test fake: cuda only"
    devices: ClassVar[tuple[str, ...]] = ("cuda",)


class DeclaresNothingBackend(ExactBackend):
    """Declares every feature refused: every case is refused by its declarations alone (a fuzz campaign's draws
    are all skipped without running)."""

    name = "fake-declares-nothing"
    description = "test fake: refuses every feature"

    @property
    def refused(self) -> dict[str, str]:  # type: ignore[override]
        from conformance.cases.case import FEATURES

        return {f: "planted: declares nothing" for f in FEATURES}


def _written(case: AttentionCase, inputs: CaseInputs, keys: torch.Tensor, new: torch.Tensor | None) -> torch.Tensor:
    """Packed ``keys`` (every request's kv_len rows) as an appending kernel reads them after its cache write: each
    request's last ``case.new_kv_lens[b]`` rows are the rows of ``new`` (``k_new`` / ``v_new``, or the stored fp8
    ``quant.k_new`` / ``v_new``), byte for byte; ``keys`` itself when the case does not append."""
    if not case.append:
        return keys
    assert new is not None, "an append case without its new keys"
    cu_k = inputs.cu_seqlens_k.tolist()
    idx = [t for b, n in enumerate(case.new_kv_lens) for t in range(cu_k[b + 1] - n, cu_k[b + 1])]
    out = keys.view(torch.uint8).clone() if keys.element_size() == 1 else keys.clone()  # fp8: no index_put
    out[torch.tensor(idx, dtype=torch.long)] = new.view(torch.uint8) if keys.element_size() == 1 else new.to(keys.dtype)
    return out.view(keys.dtype)


class StoredExactBackend(ExactBackend):
    """Computes from what a kernel is handed: the *stored* quantized tensors and their descales, MLA in
    FlashMLA's 576-wide spelling, V padded and stripped, an append's new keys (fp8 ones as stored, with the cache's
    descales) written over each request's last keys.  Must pass; its subclasses plant one mistake each in that
    plumbing (the bugs ``../shared/SEMANTICS.md`` section 8 lists for fp8, and MLA's)."""

    name = "fake-stored-exact"
    description = "test fake: dequantizes the stored tensors, MLA as [nope | rope], V padding"
    accepts: ClassVar[frozenset[str]] = frozenset(
        {"fp8_e4m3", "fp8_e5m2", "fp8_kv_only", "descale_head", "int8_t1", "int8_t2", "qv", "v_pad"}
        # an append's new keys written over the packed keys (_written)
        | {"append_short", "append_uneven", "append_quant"}
    )

    # -- the hooks the bug fakes override
    def stored(self, x: torch.Tensor) -> torch.Tensor:
        """A stored tensor as the kernel reads its bytes."""
        return x.float()

    def descale(self, scale: torch.Tensor, which: str) -> torch.Tensor:
        """The descale the kernel applies (``which`` is q, k or v)."""
        return scale

    def mla_parts(self, q, qv, k, v):
        """FlashMLA's spelling: the 576-wide query and cache, and V = the cache's first dv channels."""
        return torch.cat([qv, q], -1), torch.cat([v, k], -1), v.shape[-1]

    def pad_and_strip(self, out: torch.Tensor, dv: int) -> torch.Tensor:
        return out[..., :dv]

    # -- the computation
    def _per_token(self, scale: torch.Tensor, lens: list[int], heads: int, which: str, fmt: str) -> torch.Tensor:
        scale = self.descale(scale, which)
        if fmt == "int8":  # q, k per (token, head); v per (kv head, channel)
            return (scale[None] if which == "v" else scale[..., None]).float()
        if scale.numel() == 1:
            return scale.reshape(1, 1, 1).float()
        rows = torch.repeat_interleave(scale, torch.tensor(lens, device=scale.device), dim=0)  # (batch, hk)
        return rows.repeat_interleave(heads // scale.shape[1], dim=1)[..., None].float()

    def dequantized(self, case: AttentionCase, inputs: CaseInputs):
        quant = inputs.quant
        q, qv = inputs.q.float(), inputs.qv
        k = _written(case, inputs, inputs.k, inputs.k_new).float()
        v = _written(case, inputs, inputs.v, inputs.v_new).float()
        if quant is not None:
            h, hk = case.num_heads, case.num_kv_heads
            if quant.q is not None:
                f = self._per_token(quant.q_descale, case.q_lens, h, "q", quant.fmt)
                q = self.stored(quant.q) * f
                qv = None if quant.qv is None else self.stored(quant.qv) * f
            k_stored = _written(case, inputs, quant.k, quant.k_new)
            k = self.stored(k_stored) * self._per_token(quant.k_descale, case.kv_lens, hk, "k", quant.fmt)
            if quant.v is not None:
                v_stored = _written(case, inputs, quant.v, quant.v_new)
                v = self.stored(v_stored) * self._per_token(quant.v_descale, case.kv_lens, hk, "v", quant.fmt)
        return q, k, v, None if qv is None else qv.float()

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        options, sinks = self.options(case), self.sinks(inputs)

        def run() -> KernelOutput:
            q, k, v, qv = self.dequantized(case, inputs)
            dv = case.dv
            if case.v_padded:
                v = torch.cat([v, v.new_zeros(*v.shape[:-1], case.head_dim - dv)], -1)
            if qv is not None:
                q, k, dv_mla = self.mla_parts(q, qv, k, v)
                v = k[..., :dv_mla]
                opts = options if options.scale is not None else options.with_(scale=(case.head_dim + dv) ** -0.5)
            else:
                opts = options
            with strict_fp32():
                res = attention_varlen(
                    q, k, v, inputs.cu_seqlens_q, inputs.cu_seqlens_k, options=opts,
                    alibi_slopes=inputs.alibi_slopes, sinks=sinks, numerics=FP32,
                )  # fmt: skip
            out = self.pad_and_strip(res.out, dv) if case.v_padded else res.out
            return self.finish(case, out, res.lse)

        return run


class DescaleDroppedBackend(StoredExactBackend):
    """Reads fp8 K without its descale (vLLM 51363: descales dropped by the caller)."""

    name = "fake-descale-dropped"
    description = "test fake: k_descale ignored"

    def descale(self, scale: torch.Tensor, which: str) -> torch.Tensor:
        return torch.ones_like(scale) if which == "k" else scale


class PerTensorDescaleBackend(StoredExactBackend):
    """Applies the first (sequence, kv head)'s descale everywhere: per-tensor where per-head was given."""

    name = "fake-per-tensor-descale"
    description = "test fake: descale[0, 0] for every sequence and head"

    def descale(self, scale: torch.Tensor, which: str) -> torch.Tensor:
        return scale.flatten()[:1].expand_as(scale) if scale.dim() == 2 and which != "v" else scale


class WrongFp8FormatBackend(StoredExactBackend):
    """Reads e4m3 bytes as e5m2 (and the reverse): the cache dtype mixed up between writer and reader."""

    name = "fake-wrong-fp8-format"
    description = "test fake: fp8 bytes read in the other format"

    def stored(self, x: torch.Tensor) -> torch.Tensor:
        other = {torch.float8_e4m3fn: torch.float8_e5m2, torch.float8_e5m2: torch.float8_e4m3fn}.get(x.dtype)
        return (x.view(other) if other is not None else x).float()


class QvIgnoredBackend(StoredExactBackend):
    """Accepts qv and drops it: the score is q_rope . k_rope only (default scale kept)."""

    name = "fake-qv-ignored"
    description = "test fake: qv dropped"

    def mla_parts(self, q, qv, k, v):
        return torch.cat([torch.zeros_like(qv), q], -1), torch.cat([v, k], -1), v.shape[-1]


class RopeNopeSwappedBackend(StoredExactBackend):
    """Builds FlashMLA's query as [rope | nope] while the cache is [c_kv | k_rope]."""

    name = "fake-rope-nope-swapped"
    description = "test fake: 576-wide query assembled rope first"

    def mla_parts(self, q, qv, k, v):
        return torch.cat([q, qv], -1), torch.cat([v, k], -1), v.shape[-1]


class VPadNotStrippedBackend(StoredExactBackend):
    """Pads V to the qk head dim and returns the padded output (seed 004's strip forgotten)."""

    name = "fake-vpad-not-stripped"
    description = "test fake: padded output returned"

    def pad_and_strip(self, out: torch.Tensor, dv: int) -> torch.Tensor:
        return out


#: Bug backend -> the case feature that exposes its bug.
PLANTED_BUGS: dict[type[ExactBackend], str] = {
    WindowOffByOneBackend: "window",
    SinksIgnoredBackend: "sinks",
    SoftcapMissingBackend: "softcap",
    LseSignBackend: "lse",
    NoisyBackend: "any",
    DescaleDroppedBackend: "fp8_e4m3",
    PerTensorDescaleBackend: "descale_head",
    WrongFp8FormatBackend: "fp8_e4m3",
    QvIgnoredBackend: "qv",
    RopeNopeSwappedBackend: "qv",
    VPadNotStrippedBackend: "v_pad",
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
    StoredExactBackend,
    DescaleDroppedBackend,
    PerTensorDescaleBackend,
    WrongFp8FormatBackend,
    QvIgnoredBackend,
    RopeNopeSwappedBackend,
    VPadNotStrippedBackend,
)


# --------------------------------------------------------------------------------------------------------------
# Planted bugs for the modes the fakes above leave without one (issue 10: the fuzzer's detection power,
# scripts/detection_power.py).  Each differs from ExactBackend by one mistake, visible only where MODE_BUGS says.


def _replace(inputs: CaseInputs, **changes) -> CaseInputs:
    import dataclasses

    return dataclasses.replace(inputs, **changes)


class _InputsBugBackend(ExactBackend):
    """Exact, computed on inputs the bug has changed (:meth:`transform`)."""

    def transform(self, case: AttentionCase, inputs: CaseInputs) -> CaseInputs:
        return inputs

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        return super().prepare(case, self.transform(case, inputs))


class PagedBlockBoundaryBackend(ExactBackend):
    """Reads the first token of every cache block after the first from the previous token's slot (a page index
    computed from ``t - 1``): wrong only for paged requests longer than one block."""

    name = "fake-paged-block-boundary"
    description = "test fake: paged token t (t % block == 0, t > 0) read from slot of t - 1"

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        if not case.paged:
            return super().prepare(case, inputs)
        from attnref import gather_kv

        options, sinks = self.options(case), self.sinks(inputs)
        bs = case.block_size
        assert bs is not None and inputs.k_cache is not None and inputs.v_cache is not None
        assert inputs.block_table is not None

        def run() -> KernelOutput:
            if case.append:
                assert inputs.k_new is not None and inputs.v_new is not None
                slots = _append_slots(case, inputs.block_table)
                write_kv_cache(inputs.k_new, inputs.v_new, inputs.k_cache, inputs.v_cache, slots, case.kv_layout)
            k, cu_k = gather_kv(inputs.k_cache, inputs.block_table, inputs.seqlens_k, case.kv_layout)
            v, _ = gather_kv(inputs.v_cache, inputs.block_table, inputs.seqlens_k, case.kv_layout)
            src = torch.arange(k.shape[0])
            for b, n in enumerate(case.kv_lens):
                start = int(cu_k[b])
                for t in range(bs, n, bs):
                    src[start + t] = start + t - 1
            with strict_fp32():
                res = attention_varlen(
                    inputs.q, k[src], v[src], inputs.cu_seqlens_q, cu_k, options=options,
                    alibi_slopes=inputs.alibi_slopes, sinks=sinks, numerics=FP32,
                )  # fmt: skip
            return self.finish(case, res.out, res.lse)

        return run


class GqaHeadMappingBackend(_InputsBugBackend):
    """Query head ``i`` reads kv head ``i % hk`` instead of ``i // (h / hk)``: wrong for 1 < hk < h only."""

    name = "fake-gqa-head-mapping"
    description = "test fake: q head i -> kv head i % hk"

    def transform(self, case: AttentionCase, inputs: CaseInputs) -> CaseInputs:
        h, hk = case.num_heads, case.num_kv_heads
        idx = torch.tensor([i % hk for i in range(h)])  # every q head gets its own (wrong) kv head

        def expand(x: torch.Tensor | None, dim: int) -> torch.Tensor | None:
            return None if x is None else x.index_select(dim, idx.to(x.device))

        head_dim = 1 if case.kv_layout == "HND" else 2  # caches (blocks, block, hk, d) or (blocks, hk, block, d)
        return _replace(
            inputs,
            k=expand(inputs.k, 1),
            v=expand(inputs.v, 1),
            k_new=expand(inputs.k_new, 1),
            v_new=expand(inputs.v_new, 1),
            k_cache=expand(inputs.k_cache, head_dim),
            v_cache=expand(inputs.v_cache, head_dim),
        )


class ChunkOffByOneBackend(ExactBackend):
    """Chunked local attention with chunks of ``chunk + 1`` keys: wrong once a sequence passes one chunk."""

    name = "fake-chunk-off-by-one"
    description = "test fake: local chunk size + 1"

    def options(self, case: AttentionCase) -> AttnOptions:
        opts = case_options(case)
        return opts if opts.chunk is None else opts.with_(chunk=opts.chunk + 1)


class AlibiSignBackend(_InputsBugBackend):
    """ALiBi with the sign of the slopes flipped (distant keys favoured)."""

    name = "fake-alibi-sign"
    description = "test fake: ALiBi slopes negated"

    def transform(self, case: AttentionCase, inputs: CaseInputs) -> CaseInputs:
        slopes = inputs.alibi_slopes
        return inputs if slopes is None else _replace(inputs, alibi_slopes=-slopes)


class WrongScaleDvBackend(ExactBackend):
    """Default softmax scale from the value head dim, ``1/sqrt(dv)``: wrong when d != dv and no scale is given."""

    name = "fake-wrong-scale-dv"
    description = "test fake: default scale 1/sqrt(head_dim_v)"

    def options(self, case: AttentionCase) -> AttnOptions:
        opts = case_options(case)
        return opts if case.scale is not None or case.dv == case.head_dim else opts.with_(scale=case.dv**-0.5)


class HeadDim80Backend(_InputsBugBackend):
    """At head_dim 80 only (a 64-wide tile and a forgotten tail), q.k sums the first 64 channels."""

    name = "fake-head-dim-80"
    description = "test fake: head_dim 80 scores use channels 0-63 only"

    def transform(self, case: AttentionCase, inputs: CaseInputs) -> CaseInputs:
        if case.head_dim != 80:
            return inputs
        q = inputs.q.clone()
        q[..., 64:] = 0
        return _replace(inputs, q=q)


class CausalTopLeftBackend(_InputsBugBackend):
    """Causal mask aligned top-left when kv_len > q_len (row i sees keys 0..i; FA2 before 2.1): the keys after
    the first q_len of each such request are never seen."""

    name = "fake-causal-top-left"
    description = "test fake: causal diagonal top-left when kv_len > q_len"

    def transform(self, case: AttentionCase, inputs: CaseInputs) -> CaseInputs:
        if not case.causal or all(k <= q for q, k in case.requests):
            return inputs
        seen = [min(q, k) if k > q else k for q, k in case.requests]
        if case.paged:
            return _replace(inputs, seqlens_k=torch.tensor(seen, dtype=inputs.seqlens_k.dtype))
        keep = torch.cat(
            [torch.arange(int(inputs.cu_seqlens_k[b]), int(inputs.cu_seqlens_k[b]) + n) for b, n in enumerate(seen)]
        )
        cu = torch.tensor([0] + seen, dtype=torch.int64).cumsum(0).to(inputs.cu_seqlens_k.dtype)
        return _replace(inputs, k=inputs.k[keep], v=inputs.v[keep], cu_seqlens_k=cu)


class EmptyRowsNanBackend(ExactBackend):
    """Rows that see no key come out NaN (0 / 0 in the softmax) instead of 0, their LSE left at -inf."""

    name = "fake-empty-rows-nan"
    description = "test fake: fully masked rows -> NaN"

    def finish(self, case: AttentionCase, out: torch.Tensor, lse: torch.Tensor) -> KernelOutput:
        empty = torch.isneginf(lse).transpose(0, 1)[..., None]  # (total_q, h, 1)
        return KernelOutput(torch.where(empty, torch.nan, out).to(case.torch_dtype), lse.float())


class AppendNotWrittenBackend(ExactBackend):
    """Appends nothing: a paged append case reads the cache's stale slots where the new keys belong."""

    name = "fake-append-not-written"
    description = "test fake: kvcache append skipped"

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        if not (case.paged and case.append):
            return super().prepare(case, inputs)
        options, sinks = self.options(case), self.sinks(inputs)
        assert inputs.k_cache is not None and inputs.v_cache is not None and inputs.block_table is not None

        def run() -> KernelOutput:
            with strict_fp32():
                res = attention_paged(
                    inputs.q, inputs.k_cache, inputs.v_cache, inputs.block_table, inputs.seqlens_k,
                    inputs.cu_seqlens_q, layout=case.kv_layout, options=options,
                    alibi_slopes=inputs.alibi_slopes, sinks=sinks, numerics=FP32,
                )  # fmt: skip
            return self.finish(case, res.out, res.lse)

        return run


#: The bugs above -> the cases that expose them (words: several need a combination no single feature names).
MODE_BUGS: dict[type[ExactBackend], str] = {
    PagedBlockBoundaryBackend: "paged, some kv_len > block size",
    GqaHeadMappingBackend: "gqa (1 < kv heads < q heads)",
    ChunkOffByOneBackend: "local_chunk, some kv_len > chunk",
    AlibiSignBackend: "alibi",
    WrongScaleDvBackend: "dv != d without an explicit scale",
    HeadDim80Backend: "head_dim 80",
    CausalTopLeftBackend: "causal, some kv_len > q_len",
    EmptyRowsNanBackend: "a row that sees no key (empty kv, sq > sk under causal, narrow windows), no sinks",
    AppendNotWrittenBackend: "append into a paged cache",
}
ALL_FAKES = ALL_FAKES + tuple(MODE_BUGS)
__all__ += ["MODE_BUGS"] + [cls.__name__ for cls in MODE_BUGS]


# --------------------------------------------------------------------------------------------------------------
# Bugs of the size of a long decode's rounding (issue 31 item 8: is this verdict as strict as flash-attention's own
# test rule there?  scripts/peer_bounds.py).  FlashStyleBackend computes the way a flash kernel does: fp32 scores, an
# online softmax over 128-key tiles, P rounded to the case dtype before P @ V (fp32 accumulation), key splits combined
# through their fp32 LSEs.  Each bug below differs from it by one mistake, small enough to hide under a loose bound.


def kernel_kv(case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k, v, cu_seqlens_k) as the case's kernel reads them: the contiguous keys, or the paged cache gathered
    through the block table (an append's new keys written into it first)."""
    if not case.paged:
        return inputs.k, inputs.v, inputs.cu_seqlens_k
    from attnref import gather_kv

    assert inputs.k_cache is not None and inputs.v_cache is not None and inputs.block_table is not None
    if case.append:
        assert inputs.k_new is not None and inputs.v_new is not None
        slots = _append_slots(case, inputs.block_table)
        write_kv_cache(inputs.k_new, inputs.v_new, inputs.k_cache, inputs.v_cache, slots, case.kv_layout)
    k, cu_k = gather_kv(inputs.k_cache, inputs.block_table, inputs.seqlens_k, case.kv_layout)
    v, _ = gather_kv(inputs.v_cache, inputs.block_table, inputs.seqlens_k, case.kv_layout)
    return k, v, cu_k


def _split_ranges(sk: int, splits: int, tile: int) -> list[tuple[int, int]]:
    """``splits`` contiguous key ranges of whole tiles covering ``[0, sk)`` (fewer when there are fewer tiles)."""
    tiles = max(1, -(-sk // tile))
    per = -(-tiles // max(1, splits)) * tile
    return [(s, min(sk, s + per)) for s in range(0, max(sk, 1), per)]


class FlashStyleBackend(ExactBackend):
    """A flash kernel's rounding, no mistake: scores in fp32 from the case-dtype inputs, an online softmax over
    ``tile``-key tiles, P rounded to the case dtype for P @ V with an fp32 accumulator, the row sum from the fp32 P,
    ``num_splits`` key ranges (the case's, else 1) each normalised and combined through fp32 LSEs, sinks in the
    final denominator, the output rounded once.  Must pass.  The hooks are where its subclasses plant one mistake."""

    name = "fake-flash-style"
    description = "test fake: flash-style online softmax, P in the case dtype, fp32 accumulation"
    refused: ClassVar[dict[str, str]] = {
        "softcap": "this fake computes no soft-cap",
        "alibi": "this fake computes no ALiBi",
    }
    tile: ClassVar[int] = 128

    # -- the hooks the bug fakes override
    def softmax_scale(self, case: AttentionCase) -> float:
        return case.scale if case.scale is not None else case.head_dim**-0.5

    def keys_read(self, sk: int) -> torch.Tensor:
        """The keys of a request of ``sk`` keys that the kernel reads (bool, ``(sk,)``)."""
        return torch.ones(sk, dtype=torch.bool)

    def num_splits(self, case: AttentionCase) -> int:
        return case.num_splits or 1

    def exp_arg(self, x: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        """``s - max`` as the exponential reads it."""
        return x

    def round_p(self, p: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        """P as P @ V reads it."""
        return p.to(dt).float()

    def accumulate(self, o: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        """The P @ V accumulator after a tile."""
        return o

    def row_sum(self, l: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        """The softmax denominator as the normalisation reads it."""
        return l

    def split_lse(self, lse: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        """A split's LSE as the combine reads it."""
        return lse

    # -- the computation
    def _one_split(self, q, k, v, cols, lo, hi, scale, dt):
        """One key range of one request: q ``(hk, group * sq, d)`` (query head ``i`` in kv head ``i // group``'s
        group), k / v ``(hk, keys, d)``; returns (out (h, sq, dv) normalised, lse (h, sq)).  Each tile's P @ V is one
        batched matmul over every tile (the tiles' running maxima known first), then the online accumulation runs
        tile by tile as a kernel's loop does."""
        hk, rows, dv = q.shape[0], q.shape[1], v.shape[-1]
        sq = lo.shape[0]
        h, n, tile = hk * (rows // max(sq, 1)), k.shape[1], self.tile
        nt = -(-n // tile)
        pad = nt * tile - n
        s = (torch.matmul(q, k.transpose(-1, -2)) * scale).reshape(h, sq, n)
        visible = (cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None])
        s = torch.nn.functional.pad(s.masked_fill(~visible, -math.inf), (0, pad), value=-math.inf)
        s = s.reshape(h, sq, nt, tile)
        m_run = torch.cummax(s.amax(dim=-1), dim=-1).values if nt else s.new_zeros(h, sq, 0)  # (h, sq, nt)
        m_safe = torch.where(torch.isneginf(m_run), torch.zeros_like(m_run), m_run)
        p = torch.exp(self.exp_arg(s - m_safe[..., None], dt))
        p_tiles = self.round_p(p, dt).reshape(hk, rows, nt, tile).transpose(1, 2)
        v_tiles = torch.nn.functional.pad(v, (0, 0, 0, pad)).reshape(hk, nt, tile, dv)
        pv = torch.matmul(p_tiles, v_tiles).transpose(1, 2).reshape(h, sq, nt, dv)
        l_tiles = p.sum(dim=-1)  # (h, sq, nt): the row sum from the fp32 P
        m = torch.full((h, sq), -math.inf)
        l = torch.zeros(h, sq)
        o = torch.zeros(h, sq, dv)
        for t in range(nt):
            alpha = torch.exp(m - m_safe[..., t])
            l = l * alpha + l_tiles[..., t]
            o = self.accumulate(o * alpha[..., None] + pv[..., t, :], dt)
            m = m_safe[..., t]
        l = self.row_sum(l, dt)
        live = l > 0
        safe = torch.where(live, l, torch.ones_like(l))
        out = torch.where(live[..., None], o / safe[..., None], torch.zeros_like(o))
        lse = torch.where(live, m + torch.log(safe), torch.full_like(m, -math.inf))
        return out, lse

    def attend(self, case: AttentionCase, inputs: CaseInputs, sinks: torch.Tensor | None):
        dt = case.torch_dtype
        h, group = case.num_heads, case.num_heads // case.num_kv_heads
        k_all, v_all, cu_k = kernel_kv(case, inputs)
        cu_q = [int(x) for x in inputs.cu_seqlens_q.tolist()]
        cu_k = [int(x) for x in cu_k.tolist()]
        options, scale, splits = case_options(case), self.softmax_scale(case), self.num_splits(case)
        out = torch.zeros(case.total_q, h, case.dv)
        lse = torch.full((h, case.total_q), -math.inf)
        for b, (sq, sk) in enumerate(case.requests):
            if sq == 0:
                continue
            q0, k0 = cu_q[b], cu_k[b]
            read = self.keys_read(sk)
            cols = torch.arange(sk)[read]
            q = inputs.q[q0 : q0 + sq].float().permute(1, 0, 2).reshape(h // group, group * sq, -1)
            k = k_all[k0 : k0 + sk][read].float().permute(1, 0, 2).contiguous()
            v = v_all[k0 : k0 + sk][read].float().permute(1, 0, 2).contiguous()
            lo, hi = row_bounds(torch.arange(sq), sq, sk, options)
            parts = []
            for a, z in _split_ranges(sk, splits, self.tile):
                sel = (cols >= a) & (cols < z)
                a_i, z_i = int(sel.nonzero()[0]) if sel.any() else 0, int(sel.sum())
                kv = (k[:, a_i : a_i + z_i], v[:, a_i : a_i + z_i], cols[a_i : a_i + z_i])
                part_out, part_lse = self._one_split(q, *kv, lo, hi, scale, dt)
                parts.append((part_out, self.split_lse(part_lse, dt)))
            lses = torch.stack([p[1] for p in parts])
            total = torch.logsumexp(lses, dim=0)
            safe_total = torch.where(torch.isneginf(total), torch.zeros_like(total), total)
            o = sum(torch.exp(pl - safe_total)[..., None] * po for po, pl in parts)
            if sinks is not None:
                with_sink = torch.logaddexp(total, sinks.float().reshape(h, 1))
                o = o * torch.exp(total - with_sink)[..., None]
                total = with_sink
            out[q0 : q0 + sq] = o.permute(1, 0, 2)
            lse[:, q0 : q0 + sq] = total
        return out, lse

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        sinks = self.sinks(inputs)

        def run() -> KernelOutput:
            out, lse = self.attend(case, inputs, sinks)
            return self.finish(case, out, lse)

        return run


class FlashSplitsBackend(FlashStyleBackend):
    """:class:`FlashStyleBackend` with 4 key splits whatever the case says (split-KV decode).  Must pass."""

    name = "fake-flash-splits"
    description = "test fake: flash-style, 4 key splits combined through fp32 LSEs"

    def num_splits(self, case: AttentionCase) -> int:
        return 4


class DropFirstKeyBackend(FlashStyleBackend):
    """Never reads key 0 of a request (a loop that starts at 1)."""

    name = "fake-drop-first-key"
    description = "test fake: flash-style, key 0 of every request skipped"

    def keys_read(self, sk: int) -> torch.Tensor:
        read = torch.ones(sk, dtype=torch.bool)
        read[:1] = False
        return read


class DropMiddleKeyBackend(FlashStyleBackend):
    """Never reads key ``sk // 2`` of a request (the first key of the second half: a split boundary lost)."""

    name = "fake-drop-middle-key"
    description = "test fake: flash-style, key sk // 2 of every request skipped"

    def keys_read(self, sk: int) -> torch.Tensor:
        read = torch.ones(sk, dtype=torch.bool)
        read[sk // 2 : sk // 2 + 1] = False
        return read


class LastKeyIgnoredBackend(FlashStyleBackend):
    """Never reads the last key of a request (in decode the new token's own key: a length off by one)."""

    name = "fake-last-key-ignored"
    description = "test fake: flash-style, the last key of every request skipped"

    def keys_read(self, sk: int) -> torch.Tensor:
        read = torch.ones(sk, dtype=torch.bool)
        read[sk - 1 :] = False
        return read


class ScaleUlpBackend(FlashStyleBackend):
    """The softmax scale one fp32 ulp too large (the scale a kernel takes is an fp32 number)."""

    name = "fake-scale-ulp"
    description = "test fake: flash-style, softmax scale + 1 fp32 ulp"

    def softmax_scale(self, case: AttentionCase) -> float:
        s = torch.tensor(super().softmax_scale(case), dtype=torch.float32)
        return float(torch.nextafter(s, torch.tensor(math.inf)))


class ScaleBf16UlpBackend(FlashStyleBackend):
    """The softmax scale held in bf16 and one bf16 ulp too large (0.5-0.8 % at head dims 64-128)."""

    name = "fake-scale-bf16-ulp"
    description = "test fake: flash-style, softmax scale rounded to bf16 + 1 bf16 ulp"

    def softmax_scale(self, case: AttentionCase) -> float:
        bits = torch.tensor([super().softmax_scale(case)], dtype=torch.bfloat16).view(torch.int16)
        return float((bits + 1).view(torch.bfloat16)[0])


class ExpArgRoundedBackend(FlashStyleBackend):
    """Rounds ``s - max`` to the case dtype before the exponential (the rounding of P done before exp, not after)."""

    name = "fake-exp-arg-rounded"
    description = "test fake: flash-style, exp(round(s - max))"

    def exp_arg(self, x: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        return x.to(dt).float()


class RowSumRoundedBackend(FlashStyleBackend):
    """Rounds the softmax denominator (the row sum of P) to the case dtype before normalising."""

    name = "fake-row-sum-rounded"
    description = "test fake: flash-style, row sum of P in the case dtype"

    def row_sum(self, l: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        return l.to(dt).float()


class PvAccumRoundedBackend(FlashStyleBackend):
    """Keeps the P @ V accumulator in the case dtype: rounded after every tile of keys."""

    name = "fake-pv-accum-rounded"
    description = "test fake: flash-style, P @ V accumulator rounded to the case dtype per tile"

    def accumulate(self, o: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        return o.to(dt).float()


class SplitLseRoundedBackend(FlashSplitsBackend):
    """Split-KV decode whose combine reads each split's LSE rounded to the case dtype (an LSE buffer in bf16)."""

    name = "fake-split-lse-rounded"
    description = "test fake: flash-style, 4 splits, split LSEs rounded to the case dtype"

    def split_lse(self, lse: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
        return lse.to(dt).float()


class FlashSinksIgnoredBackend(FlashStyleBackend):
    """:class:`FlashStyleBackend` that accepts sinks and drops them."""

    name = "fake-flash-sinks-ignored"
    description = "test fake: flash-style, sinks dropped"

    def sinks(self, inputs: CaseInputs) -> torch.Tensor | None:
        return None


#: Bug-free controls with a kernel's rounding.
ROUNDING_CONTROLS: tuple[type[FlashStyleBackend], ...] = (FlashStyleBackend, FlashSplitsBackend)
#: Bugs of the size of a long decode's rounding -> the cases that expose them (if anything does).
ROUNDING_BUGS: dict[type[FlashStyleBackend], str] = {
    DropFirstKeyBackend: "any request with keys (effect ~ 1 / kv_len)",
    DropMiddleKeyBackend: "any request with keys (effect ~ 1 / kv_len)",
    LastKeyIgnoredBackend: "any request with keys (effect ~ 1 / kv_len)",
    ScaleUlpBackend: "none expected (1 fp32 ulp is below every dtype's rounding)",
    ScaleBf16UlpBackend: "any (0.5-0.8 % of the scores)",
    ExpArgRoundedBackend: "any",
    RowSumRoundedBackend: "any",
    PvAccumRoundedBackend: "requests longer than one tile of keys",
    SplitLseRoundedBackend: "requests longer than one split of keys",
    FlashSinksIgnoredBackend: "sinks",
}
ALL_FAKES = ALL_FAKES + ROUNDING_CONTROLS + tuple(ROUNDING_BUGS)
__all__ += ["ROUNDING_BUGS", "ROUNDING_CONTROLS", "kernel_kv"]
__all__ += [cls.__name__ for cls in ROUNDING_CONTROLS + tuple(ROUNDING_BUGS)]

# --------------------------------------------------------------------------------------------------------------
# Cost fakes for the runner's compile phase, profile and scheduling (tests/conformance/running): exact results,
# time spent where a real backend spends it.

#: folder of :class:`JitBackend`'s "disk cache" (one marker file per compiled key) and its log
JIT_CACHE_ENV = "ATTNCONF_FAKE_JIT_CACHE"
#: seconds a :class:`JitBackend` compile sleeps (default 0.5); a load from its cache sleeps 0.01
JIT_COMPILE_ENV = "ATTNCONF_FAKE_JIT_COMPILE_S"
#: seconds per multiply-add of :class:`SleepBySizeBackend` (``conformance.running.schedule.case_size``)
SLEEP_RATE_ENV = "ATTNCONF_FAKE_SLEEP_PER_MAC"


class JitBackend(ExactBackend):
    """Exact, but JIT-compiles like FA4: one kernel per compile key (the head dim), compiled on its first call in a
    process unless the "disk cache" (``$ATTNCONF_FAKE_JIT_CACHE``, one marker file per key) has it, then loaded.
    A compile sleeps ``$ATTNCONF_FAKE_JIT_COMPILE_S`` (0.5 s), a load 0.01 s; each appends ``compile KEY PID`` or
    ``load KEY PID`` to ``log`` in that folder.  Head dim 32 fails to compile (raises in the kernel call), head dim
    48 crashes the process, in the compile phase and in the checks alike."""

    name = "fake-jit"
    description = "test fake: exact, JIT-compiles one kernel per head dim (sleeps), with a disk cache"

    def __init__(self) -> None:
        self._loaded: set[int] = set()

    def compile_key(self, case: AttentionCase) -> tuple[str, int]:
        return ("fake-jit", case.head_dim)

    def _first_call(self, case: AttentionCase) -> None:
        key = case.head_dim
        if key in self._loaded:
            return
        if key == 32:
            raise RuntimeError("planted compile failure: head dim 32 does not compile")
        if key == 48:
            os.abort()
        folder = Path(os.environ[JIT_CACHE_ENV])
        marker = folder / f"kernel-{key}"
        if marker.exists():
            time.sleep(0.01)
            what = "load"
        else:
            time.sleep(float(os.environ.get(JIT_COMPILE_ENV, "0.5")))
            marker.touch()
            what = "compile"
        with open(folder / "log", "a", encoding="utf-8") as fh:
            fh.write(f"{what} {key} {os.getpid()}\n")
        self._loaded.add(key)

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        run = super().prepare(case, inputs)

        def kernel() -> KernelOutput:
            self._first_call(case)
            return run()

        return kernel


class SleepBySizeBackend(ExactBackend):
    """Exact; its kernel call sleeps in proportion to the case's size (``$ATTNCONF_FAKE_SLEEP_PER_MAC`` seconds per
    multiply-add of :func:`conformance.running.schedule.case_size`): a backend whose large cases take long."""

    name = "fake-sleep-size"
    description = "test fake: exact, sleeps in proportion to the case's size"

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        from conformance.running.schedule import case_size

        run = super().prepare(case, inputs)
        seconds = case_size(case) * float(os.environ.get(SLEEP_RATE_ENV, "0"))

        def kernel() -> KernelOutput:
            time.sleep(seconds)
            return run()

        return kernel


__all__ += ["JIT_CACHE_ENV", "JIT_COMPILE_ENV", "SLEEP_RATE_ENV", "JitBackend", "SleepBySizeBackend"]


# --------------------------------------------------------------------------------------------------------------
# A registered adapter's declarations with a stand-in kernel: the compositions' code paths of a GPU adapter, on CPU.


def contract_problems(case: AttentionCase, inputs: CaseInputs) -> list[str]:
    """What ``inputs`` lack that the kernel contract (:mod:`attnfast.base`, :class:`CaseInputs`) gives a kernel
    of ``case``: the tensors its fields say an adapter reads, in the shapes it reads them."""
    from conformance.cases.inputs import cp_totals

    out = []
    rows, h, d, dv = case.total_q, case.num_heads, case.head_dim, case.dv
    if tuple(inputs.q.shape) != (rows, h, d):
        out.append(f"q has shape {tuple(inputs.q.shape)}, the call's (total_q, h, d) is {(rows, h, d)}")
    if tuple(inputs.cu_seqlens_q.shape) != (case.batch + 1,) or tuple(inputs.seqlens_k.shape) != (case.batch,):
        out.append(f"cu_seqlens_q / seqlens_k do not hold the call's {case.batch} requests")
    if case.paged:
        table = inputs.block_table
        if inputs.k_cache is None or inputs.v_cache is None or table is None or table.shape[0] != case.batch:
            out.append("a paged call without its caches or a block table row per request")
    elif int(inputs.cu_seqlens_k[-1]) != inputs.k.shape[0] or inputs.k.shape[0] != inputs.v.shape[0]:
        out.append("contiguous k / v do not hold the keys cu_seqlens_k counts")
    wanted = [
        (case.append, ("k_new", "v_new"), "an append"),
        (case.qv, ("qv",), "qv"),
        (case.quant != "none", ("quant",), "a quantized case"),
        (case.alibi, ("alibi_slopes",), "alibi"),
        (case.sinks, ("sinks",), "sinks"),
        (case.backward, ("dout",), "a backward case"),
    ]
    for needed, names, what in wanted:
        if needed and any(getattr(inputs, n) is None for n in names):
            out.append(f"{what} without {' / '.join(names)}")
    if case.qv and inputs.qv is not None and tuple(inputs.qv.shape) != (rows, h, dv):
        out.append(f"qv has shape {tuple(inputs.qv.shape)}, the call's (total_q, h, dv) is {(rows, h, dv)}")
    try:
        cp_totals(inputs, case)
    except ValueError as exc:
        out.append(str(exc))
    return out


class DeclaredBackend(Backend):
    """``real``'s declarations (its ``supports`` as on its own device, its refusals, its ``batch_invariance_via``
    and ``pins_splits``) with a stand-in kernel that runs on CPU: every entry point (``prepare``, ``prepare_graph``,
    ``prepare_backward``) checks the kernel contract of what it is handed (:func:`contract_problems`,
    ``AssertionError`` naming the gap) and returns zeros of the reference's shapes.  So a composition reaches, on
    CPU, every code path it takes for a GPU adapter; an ERROR record of it is the composition's (or a contract it
    broke), never the kernel's.  FA3-family shape limits are those of an H100 (``compute_capability`` (9, 0): set
    ``cc`` to None for the adapter's no-device answer)."""

    family: ClassVar[str] = "fake"
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    description: ClassVar[str] = "test fake: a registered adapter's declarations, a zero kernel checking its inputs"

    def __init__(self, real: Backend, cc: tuple[int, int] | None = (9, 0)) -> None:
        self.real, self.cc = real, cc
        self.name = f"declared-{real.name}"  # type: ignore[misc]
        self.batch_invariance_via = real.batch_invariance_via  # type: ignore[misc]

    def refusals(self) -> dict[str, str]:
        return self.real.refusals()

    def supports(self, case: AttentionCase, device: str) -> Support:
        if device.split(":")[0] not in self.devices:
            return Support(False, f"runs on cpu, not {device}")
        import importlib
        from unittest import mock

        own = self.real.devices[0]
        patches = []
        for module in ("attnfast.fa3", "attnfast.fa3_vllm", "attnfast.fa4"):
            mod = importlib.import_module(module)
            patches.append(mock.patch.object(mod, "compute_capability", lambda device="cuda": self.cc))
        for p in patches:
            p.start()
        try:
            return self.real.supports(case, own)
        finally:
            for p in patches:
                p.stop()

    def pins_splits(self, case: AttentionCase) -> bool:
        return self.real.pins_splits(case)

    def _zeros(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        problems = contract_problems(case, inputs)

        def run() -> KernelOutput:
            if problems:
                raise AssertionError(f"kernel contract: {'; '.join(problems)}")
            dev = inputs.q.device
            out = torch.zeros(case.total_q, case.num_heads, case.dv, dtype=case.torch_dtype, device=dev)
            return KernelOutput(out, torch.zeros(case.num_heads, case.total_q, device=dev))

        return run

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        return self._zeros(case, inputs)

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        return self._zeros(case, inputs)

    def prepare_backward(self, case: AttentionCase, inputs: CaseInputs):
        from attnfast.base import GradOutput

        forward = self._zeros(case, inputs)

        def run() -> GradOutput:
            res = forward()
            zeros = torch.zeros_like
            return GradOutput(res.out, res.lse, zeros(inputs.q), zeros(inputs.k), zeros(inputs.v))

        run.backward_only = None  # type: ignore[attr-defined]
        return run


__all__ += ["DeclaredBackend", "contract_problems"]
