"""torch ``scaled_dot_product_attention`` (SDPA) adapters: math on CPU, fused backends on CUDA.

Size: one kernel family's adapter: its call plans, limits table, refusals and the reading of which backend SDPA
dispatched each call to, all SDPA's quirks in one place.

SDPA has no varlen, paged or sink support, and its ``is_causal`` is aligned to the *top left*.
The translation, per request (one SDPA call each, ``(1, h, sq, d)`` views of the packed tensors):

* keys: paged caches are gathered through the block table, and a kvcache ``append`` first writes
  ``k_new``/``v_new`` into a clone of the cache (:func:`attnfast._torch_common.sequences`); both
  happen in ``prepare``, so the timed callable runs only SDPA;
* masks (causal, window, chunk; bottom-right aligned) are built from the case here; on CPU they
  go in as a boolean mask, on CUDA as ``is_causal`` / ``causal_lower_right`` where those match
  and otherwise as an additive bias (:func:`mask_kind`);
* ALiBi is an additive bias; a sink one extra zero key whose bias is the sink's logit (exact:
  the key's raw score is 0 and its value 0, so it joins only the denominator);
* GQA: ``enable_gqa=True`` where the SDPA backend takes it, else K/V heads repeated in ``prepare``;
* soft-cap: refused, SDPA has no score modifier;
* LSE: SDPA does not return it, so the adapter computes it separately in fp32 from the same
  inputs and bias (:func:`attnfast._torch_common.derived_lse`).  It checks the translation, not
  the kernel; the output is the kernel's;
* fully masked rows: NaN from SDPA is set to 0 (the kernels' convention); finite values are kept
  so that a kernel writing garbage there is still caught.

``sdpa-cpu`` pins the MATH backend.  ``sdpa-cuda`` allows only the fused backends (flash,
memory-efficient, cuDNN), so a fall-back to math raises instead of passing silently; which fused
backend can take which call is :func:`plan_cuda_call`, a pure function tested on CPU, from
limits measured on an H200 with torch 2.11.0+cu130 (see ``FUSED_LIMITS``).

Backward: through autograd over the same per-request calls (:mod:`attnfast.sdpa_backward`); a deterministic case
under ``torch.use_deterministic_algorithms(True)``, which takes cuDNN out of the CUDA plan.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from ._torch_common import (
    SeqTensors,
    derived_lse,
    host_graph_call,
    score_bias,
    sequences,
    softmax_scale,
    visibility,
    with_sink_column,
)
from .base import OK, Backend, KernelOutput, Support
from .sdpa_backward import SdpaArgs, sdpa_backward

__all__ = [
    "FUSED_LIMITS",
    "SdpaCall",
    "SdpaCpuBackend",
    "SdpaCudaBackend",
    "SdpaCudaCudnnBackend",
    "SdpaCudaEfficientBackend",
    "SdpaCudaFlashBackend",
    "bias_for_kernel",
    "mask_kind",
    "plan_cuda_call",
]

_SOFTCAP = "SDPA has no score modifier"
_CUDNN_NONDET = (
    "cuDNN SDPA is not deterministic: under torch.use_deterministic_algorithms(True) torch does not select it "
    "(sdp_utils.cpp, check_cudnn_deterministic)"
)


@dataclass(frozen=True)
class FusedLimits:
    """What one fused SDPA backend accepts (measured, see the module docstring)."""

    masks: frozenset[str]
    dtypes: frozenset[str]
    enable_gqa: bool
    dv_differs: bool
    max_head_dim: int | None
    min_keys: int = 1
    #: head dims (q/k and v) must be multiples of this, per dtype (absent: any; flash pads inside SDPA)
    head_dim_multiple: Mapping[str, int] = field(default_factory=dict)


#: Measured on an H200, torch 2.11.0+cu130, one call per property ("No available kernel" = no):
#: flash: no fp32, no d != dv, no d = 512, no attn_mask at all; GQA and causal_lower_right work.
#: efficient: fp32, d != dv, d = 512 and float bias (query dtype only: "invalid dtype for bias -
#: should match query's dtype") work; enable_gqa does not.  cuDNN: GQA, d != dv (192/128) and a
#: float bias in the query dtype work; no fp32, no d = 512, no request with a single key (sk = 1,
#: any sq).  None of them takes sk = 0.  Alignment (torch's sdp_utils, confirmed by the fuzzer on the H100:
#: "No available kernel" for d1/d39/d95 with a bias, d1/d187 fp32): efficient needs head dims that are
#: multiples of 8 (16-bit) or 4 (fp32), cuDNN multiples of 8; flash pads inside SDPA.
#: Wrong results seen there, which the plan routes around (and ``test_sdpa`` guards on a GPU):
#: * ``causal_lower_right`` with sq > sk under the efficient backend (``CausalBias`` calls
#:   ``_efficient_attention_forward(custom_mask_type=2)``) behaves as top-left causal: 9 x 5, rows
#:   0-7 off by up to 2.9, row 8 right.  Flash is right, so ``lower_right`` is flash-only here.
#: * cuDNN with a boolean mask returns non-zero garbage (error 1.7) on a fully masked row, and
#:   with an fp32 bias on bf16 inputs is wrong on rows that are not masked at all (error 2.0); a
#:   bias in the query dtype is right.  So the CUDA adapter passes masks as query-dtype biases.
FUSED_LIMITS: dict[str, FusedLimits] = {
    "FLASH_ATTENTION": FusedLimits(
        frozenset({"none", "is_causal", "lower_right"}), frozenset({"bf16", "fp16"}), True, False, 256
    ),
    "EFFICIENT_ATTENTION": FusedLimits(
        frozenset({"none", "is_causal", "bias"}),
        frozenset({"bf16", "fp16", "fp32"}),
        False,
        True,
        None,
        head_dim_multiple={"bf16": 8, "fp16": 8, "fp32": 4},
    ),
    "CUDNN_ATTENTION": FusedLimits(
        frozenset({"none", "is_causal", "bias"}),
        frozenset({"bf16", "fp16"}),
        True,
        True,
        256,
        min_keys=2,
        head_dim_multiple={"bf16": 8, "fp16": 8},
    ),
}


def mask_kind(case: AttentionCase, sq: int, sk: int) -> str:
    """How one request's mask reaches SDPA: ``none``, ``is_causal``, ``lower_right`` or ``bias``.

    Decided from the actual visibility pattern, so a window wider than the sequence costs no
    mask.  ``is_causal`` (top-left) equals the bottom-right rule only when ``sq == sk``.  A
    context-parallel case's pattern depends on each sequence's total keys, which the plan does not
    see: always a bias.
    """
    if case.alibi or case.sinks or case.cp_world > 1:
        return "bias"
    vis = visibility(case, sq, sk)
    if bool(vis.all()):
        return "none"
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    if torch.equal(vis, j <= i + (sk - sq)):
        return "is_causal" if sq == sk else "lower_right"
    return "bias"


@dataclass(frozen=True)
class SdpaCall:
    """The plan of one SDPA call: mask argument, allowed SDPA backends, K/V head expansion.

    ``mask`` is one of :func:`mask_kind`'s answers, or ``"bool"`` (CPU: an explicit boolean mask).
    """

    mask: str
    backends: tuple[str, ...]
    expand_kv: bool = False
    skip: bool = False


def plan_cuda_call(case: AttentionCase, sq: int, sk: int, allowed: tuple[str, ...]) -> SdpaCall | Support:
    """Which fused backends may run one request and with which mask argument; a refusal if none.

    ``sk`` counts real keys only (the sink column is added here).  A request with no query or,
    without sinks, no key needs no kernel (``skip``): its rows are 0 / ``-inf`` by convention, and
    every fused backend rejects ``sk = 0``.
    """
    sk_total = sk + (1 if case.sinks else 0)
    if sq == 0 or sk_total == 0:
        return SdpaCall("none", (), skip=True)
    kind = mask_kind(case, sq, sk)
    shape_ok = []
    reasons = []
    for name in allowed:
        lim = FUSED_LIMITS[name]
        if case.dtype not in lim.dtypes:
            reasons.append(f"{name}: no {case.dtype} kernel")
        elif case.dv != case.head_dim and not lim.dv_differs:
            reasons.append(f"{name}: needs head_dim_v == head_dim, got {case.head_dim}/{case.dv}")
        elif lim.max_head_dim is not None and max(case.head_dim, case.dv) > lim.max_head_dim:
            reasons.append(f"{name}: head dim {max(case.head_dim, case.dv)} > {lim.max_head_dim}")
        elif (m := lim.head_dim_multiple.get(case.dtype, 1)) > 1 and (case.head_dim % m or case.dv % m):
            reasons.append(f"{name}: {case.dtype} head dims must be multiples of {m}, got {case.head_dim}/{case.dv}")
        elif sk_total < lim.min_keys:
            reasons.append(f"{name}: needs at least {lim.min_keys} keys, got {sk_total}")
        else:
            shape_ok.append(name)
    if kind == "lower_right" and "FLASH_ATTENTION" not in shape_ok:
        kind = "bias"  # CausalBias would call a fused op directly, outside sdpa_kernel's choice
    takers = [n for n in shape_ok if kind in FUSED_LIMITS[n].masks]
    reasons += [f"{n}: takes no {kind} mask" for n in shape_ok if n not in takers]
    if not takers:
        return Support(False, f"no allowed SDPA backend takes sq={sq} sk={sk} ({'; '.join(reasons)})")
    if kind == "lower_right":
        return SdpaCall(kind, ("FLASH_ATTENTION",))
    grouped = case.num_heads != case.num_kv_heads
    gqa_takers = tuple(n for n in takers if FUSED_LIMITS[n].enable_gqa)
    if grouped and gqa_takers:
        return SdpaCall(kind, gqa_takers)
    return SdpaCall(kind, tuple(takers), expand_kv=grouped)


def bias_for_kernel(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``bias`` (fp32, ``(h, sq, sk)``) in the dtype the kernel takes.  Below fp32 each row is first shifted by
    its largest finite entry (a softmax does not change under a per-row constant; the LSE is derived apart, in
    fp32): ALiBi's ``-slope * distance`` reaches tens where a request has many more queries than keys, and bf16
    rounds 12 to a step of 0.0625, which the fuzzer saw as an error 4x the baseline's on (27, 2) with GQA 9/3
    (sdpa-cuda on the H100).  Shifted, the keys that carry the weight sit near 0, where bf16 is fine."""
    if dtype == torch.float32:
        return bias
    top = bias.amax(dim=-1, keepdim=True)
    return torch.where(torch.isfinite(top), bias - top, bias).to(dtype)


@dataclass
class _Prepared:
    """Everything one SDPA call needs, built in ``prepare``."""

    q0: int
    sq: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict[str, Any]
    backends: list[Any]
    dead_rows: torch.Tensor


class _SdpaBase(Backend):
    """Shared translation; subclasses choose the SDPA backends and the mask argument."""

    refused: ClassVar[dict[str, str]] = {"softcap": _SOFTCAP}
    #: quantized inputs are dequantized and MLA's qv concatenated in ``_torch_common.sequences``; context
    #: parallel (``cp``) is the mask of ``_torch_common.visibility``.
    accepts: ClassVar[frozenset[str]] = frozenset(
        {"fp8_e4m3", "fp8_e5m2", "fp8_kv_only", "descale_head", "int8_t1", "int8_t2", "qv", "cp"}
        | {"append_short", "append_uneven", "append_quant"}  # the appends of _torch_common.sequences
        | {"backward", "bwd_deterministic"}  # attnfast.sdpa_backward
    )
    batch_invariance_via: ClassVar[str | None] = None  # aten::scaled_dot_product_attention has no split count
    #: whether the backward learns the sinks (an fp32, unshifted sink column: sdpa-cpu)
    _learns_sinks: ClassVar[bool] = False

    def version(self) -> str:
        return torch.__version__

    @abc.abstractmethod
    def _plan(self, case: AttentionCase, sq: int, sk: int) -> SdpaCall | Support:
        """The call of one request with ``sq`` queries and ``sk`` real keys, or a refusal."""

    @abc.abstractmethod
    def _bias_dtype(self, case: AttentionCase) -> torch.dtype:
        """dtype of a float ``attn_mask`` (ALiBi, sinks, masks the backend takes only as a bias)."""

    def supports(self, case: AttentionCase, device: str) -> Support:
        base = super().supports(case, device)
        if not base:
            return base
        for sq, sk in sorted(set(case.requests)):
            plan = self._plan(case, sq, sk)
            if isinstance(plan, Support):
                return plan
        return OK

    def _prepare_one(
        self, case: AttentionCase, inputs: CaseInputs, seq: SeqTensors, scale: float
    ) -> tuple[_Prepared | None, torch.Tensor]:
        """The call of one request (None when no kernel runs) and its derived LSE (h, sq)."""
        from torch.nn.attention import SDPBackend
        from torch.nn.attention.bias import causal_lower_right

        sq, sk = seq.sq, seq.sk
        plan = self._plan(case, sq, sk)
        if isinstance(plan, Support):
            raise ValueError(f"{self.name}: {plan.reason}")  # noqa: TRY004 - a refused case, not a wrong type
        k, v = with_sink_column(seq.k, seq.v) if case.sinks else (seq.k, seq.v)
        bias = score_bias(case, inputs, sq, sk, seq.cp_total)
        lse = derived_lse(seq.q, k, bias, scale)
        if plan.skip:
            return None, lse
        dead = ~visibility(case, sq, sk, seq.q.device, seq.cp_total).any(dim=1)
        if plan.expand_kv:
            group = case.num_heads // case.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        kwargs: dict[str, Any] = {"scale": scale, "enable_gqa": case.num_heads != k.shape[1]}
        if plan.mask == "is_causal":
            kwargs["is_causal"] = True
        elif plan.mask == "lower_right":
            kwargs["attn_mask"] = causal_lower_right(sq, sk)
        elif plan.mask == "bool":
            kwargs["attn_mask"] = bias[0] > -math.inf
        elif plan.mask == "bias":
            kwargs["attn_mask"] = bias_for_kernel(bias, self._bias_dtype(case))[None]
        call = _Prepared(
            seq.q0,
            sq,
            seq.q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            kwargs,
            [getattr(SDPBackend, n) for n in plan.backends],
            dead,
        )
        return call, lse

    def prepare_backward(self, case: AttentionCase, inputs: CaseInputs) -> Any:
        """SDPA through autograd, request by request (:func:`attnfast.sdpa_backward.sdpa_backward`)."""
        return sdpa_backward(self, case, inputs, learn_sinks=self._learns_sinks, choices=sdpa_choices)

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        from torch.nn.attention import sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        scale = softmax_scale(case)
        h, dv = case.num_heads, case.dv
        lse = torch.full((h, case.total_q), -math.inf, dtype=torch.float32, device=inputs.q.device)
        calls: list[_Prepared] = []
        for seq in sequences(case, inputs):
            call, seq_lse = self._prepare_one(case, inputs, seq, scale)
            lse[:, seq.q0 : seq.q0 + seq.sq] = seq_lse
            if call is not None:
                calls.append(call)
        total_q, dtype, device = case.total_q, case.torch_dtype, inputs.q.device
        chosen = sdpa_choices(calls)

        def run() -> KernelOutput:
            out = torch.zeros(total_q, h, dv, dtype=dtype, device=device)
            for c in calls:
                with sdpa_kernel(c.backends):
                    o = sdpa(c.q, c.k, c.v, **c.kwargs)[0].transpose(0, 1)  # (sq, h, dv)
                # SDPA's convention for a row with no visible key is NaN; the kernels' is 0.
                o = o.masked_fill(c.dead_rows[:, None, None] & o.isnan(), 0.0)
                out[c.q0 : c.q0 + c.sq] = o
            return KernelOutput(out, lse)

        setattr(run, "variant", {"sdpa": chosen})  # the record's extra["variant"], a function attribute
        return run


def sdpa_choices(calls: Sequence[_Prepared | SdpaArgs]) -> str:
    """Which SDPA backend runs each call, as torch's own dispatcher picks it (``torch._fused_sdp_choice`` under
    the call's ``sdpa_kernel`` selection): ``"FLASH_ATTENTION"`` when every call takes one, else each name with
    its count (``"CUDNN_ATTENTION x2, FLASH_ATTENTION x1"``); ``""`` for no call, ``"unknown (...)"`` when torch
    cannot tell.  It reads the grad mode, the inputs' ``requires_grad`` and the deterministic switch in force, as
    the call does (the backward's variant reads it so: :mod:`attnfast.sdpa_backward`)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {int(m.value): n for n, m in SDPBackend.__members__.items()}
    counts: dict[str, int] = {}
    try:
        for c in calls:
            if _is_causal_bias(c.kwargs.get("attn_mask")):
                name = _lower_right_choice(c)
            else:
                with sdpa_kernel(c.backends):
                    idx = torch._fused_sdp_choice(c.q, c.k, c.v, **c.kwargs)
                name = names.get(int(idx), str(idx))
            counts[name] = counts.get(name, 0) + 1
    except Exception as exc:  # informational only: the call itself still runs and is judged
        return f"unknown ({type(exc).__name__}: {exc})"[:200]
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{n} x{k}" for n, k in sorted(counts.items()))


def _is_causal_bias(mask: Any) -> bool:
    from torch.nn.attention.bias import CausalBias

    return isinstance(mask, CausalBias)


def _lower_right_choice(c: _Prepared | SdpaArgs) -> str:
    """The kernel a ``causal_lower_right`` mask runs: ``CausalBias._dispatch`` (torch/nn/attention/bias.py) takes
    flash where ``can_use_flash_attention`` allows it, else the efficient kernel where it can, else math; it
    reads no ``sdpa_kernel`` selection."""
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention

    params = SDPAParams(c.q, c.k, c.v, None, 0.0, False, bool(c.kwargs.get("enable_gqa", False)))
    if can_use_flash_attention(params):
        return "FLASH_ATTENTION"
    return "EFFICIENT_ATTENTION" if can_use_efficient_attention(params) else "MATH"


class SdpaCpuBackend(_SdpaBase):
    """SDPA's MATH backend on CPU, case dtype, boolean mask or fp32 bias."""

    name: ClassVar[str] = "sdpa-cpu"
    family: ClassVar[str] = "torch-sdpa-math"
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    description: ClassVar[str] = "torch SDPA, MATH backend on CPU; per request, explicit mask; LSE derived in fp32"
    #: graph mode on CPU: the buffer logic with eager "replays" (:func:`attnfast._torch_common.host_graph_call`).
    accepts: ClassVar[frozenset[str]] = _SdpaBase.accepts | {"graph"}
    _learns_sinks: ClassVar[bool] = True

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        return host_graph_call(self.prepare, case, inputs)

    def _plan(self, case: AttentionCase, sq: int, sk: int) -> SdpaCall | Support:
        # MATH takes any mask; a boolean mask unless a float bias is needed (ALiBi, sink column).
        # Every request runs, sk = 0 included: its rows are fully masked and must come out 0.
        if sq == 0:
            return SdpaCall("none", (), skip=True)
        return SdpaCall("bias" if case.alibi or case.sinks else "bool", ("MATH",))

    def _bias_dtype(self, case: AttentionCase) -> torch.dtype:
        return torch.float32  # MATH accepts an fp32 bias with bf16/fp16 inputs: ALiBi and sinks stay exact


class SdpaCudaBackend(_SdpaBase):
    """SDPA's fused CUDA backends, selected with ``sdpa_kernel`` (no MATH fall-back).

    ``sdpa_backends`` (a constructor argument, default the class attribute) lists the
    ``SDPBackend`` member names SDPA may choose from.  Verified on one H200 (torch 2.11.0+cu130):
    ``tests/attnfast/test_sdpa.py`` passes there for this class and the three single-backend
    variants below (their refusals skip); rerun it on other GPUs and torch versions.
    """

    name: ClassVar[str] = "sdpa-cuda"
    family: ClassVar[str] = "torch-sdpa-cuda"
    devices: ClassVar[tuple[str, ...]] = ("cuda",)
    description: ClassVar[str] = (
        "torch SDPA fused CUDA backends (flash, efficient, cuDNN); per request; LSE derived in fp32"
    )
    default_backends: ClassVar[tuple[str, ...]] = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")
    refused: ClassVar[dict[str, str]] = {
        **_SdpaBase.refused,
        "graph": "SDPA takes no block table or per-request key counts: the adapter gathers each request's keys "
        "at lengths read on the host, which a CUDA graph cannot capture ('Cannot copy between CPU and CUDA tensors "
        "during CUDA graph capture unless the CPU tensor is pinned', measured on an H100 with "
        "scripts/probe_graph_capture.py)",
    }

    def __init__(self, sdpa_backends: tuple[str, ...] | None = None) -> None:
        backends = tuple(sdpa_backends) if sdpa_backends is not None else self.default_backends
        unknown = [b for b in backends if b not in FUSED_LIMITS]
        if unknown or not backends:
            raise ValueError(f"sdpa_backends must be a non-empty subset of {sorted(FUSED_LIMITS)}, got {backends!r}")
        self.sdpa_backends = backends

    def is_available(self) -> Support:
        if not torch.cuda.is_available():
            return Support(False, "torch.cuda.is_available() is False")
        return OK

    def _plan(self, case: AttentionCase, sq: int, sk: int) -> SdpaCall | Support:
        allowed = self.sdpa_backends
        if case.deterministic:  # torch's sdp_utils.cpp check_cudnn_deterministic: cuDNN is then not eligible
            allowed = tuple(b for b in allowed if b != "CUDNN_ATTENTION")
            if not allowed:
                return Support(False, f"bwd_deterministic: {_CUDNN_NONDET}")
        return plan_cuda_call(case, sq, sk, allowed)

    def _bias_dtype(self, case: AttentionCase) -> torch.dtype:
        # The efficient kernel rejects a bias of another dtype ("invalid dtype for bias - should
        # match query's dtype"), so ALiBi and sink logits are rounded to the case dtype here.
        return case.torch_dtype

    def alibi_bias_dtype(self, case: AttentionCase) -> torch.dtype | None:
        # ALiBi reaches the fused kernels as bias_for_kernel's row-shifted bias in the query dtype (fp32: unshifted)
        return None if case.torch_dtype == torch.float32 else self._bias_dtype(case)

    def describe(self) -> dict[str, str]:
        return {**super().describe(), "sdpa_backends": ",".join(self.sdpa_backends)}


class SdpaCudaFlashBackend(SdpaCudaBackend):
    """Only SDPA's flash backend: no attn_mask, so no ALiBi, sinks, window or chunk."""

    name: ClassVar[str] = "sdpa-cuda-flash"
    default_backends: ClassVar[tuple[str, ...]] = ("FLASH_ATTENTION",)
    _no_mask = "SDPA's flash backend takes no attn_mask"
    refused: ClassVar[dict[str, str]] = {
        "softcap": _SOFTCAP,
        "alibi": _no_mask,
        "sinks": _no_mask,
        "window": _no_mask,
        "local_chunk": _no_mask,
        "dv": "SDPA's flash backend needs head_dim_v == head_dim",
        "fp32": "SDPA's flash backend has no fp32 kernel",
    }


class SdpaCudaEfficientBackend(SdpaCudaBackend):
    """Only SDPA's memory-efficient backend (GQA by repeated K/V heads)."""

    name: ClassVar[str] = "sdpa-cuda-efficient"
    default_backends: ClassVar[tuple[str, ...]] = ("EFFICIENT_ATTENTION",)


class SdpaCudaCudnnBackend(SdpaCudaBackend):
    """Only SDPA's cuDNN backend."""

    name: ClassVar[str] = "sdpa-cuda-cudnn"
    default_backends: ClassVar[tuple[str, ...]] = ("CUDNN_ATTENTION",)
    refused: ClassVar[dict[str, str]] = {
        "softcap": _SOFTCAP,
        "fp32": "SDPA's cuDNN backend has no fp32 kernel",
        "bwd_deterministic": _CUDNN_NONDET,
    }
