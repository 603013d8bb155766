"""The reference and baseline gradients of a backward case, computed once per (case, inputs, device).

* reference: :func:`attnref.attention_varlen_backward` in the forward reference's precision (fp32 for bf16/fp16
  inputs, fp64 for fp32 inputs: :func:`conformance.verdict.reference.default_numerics`), from the forward
  reference's ``out`` and ``lse``;
* baseline: the same backward with ``operand_dtype`` the case dtype (P and dS rounded before the matmuls that read
  them, as a flash kernel's bf16/fp16 backward does; accumulation in fp32), reading the forward reference's
  ``out`` rounded to the case dtype (a kernel computes ``D = rowsum(dO * O)`` from the output it returned) and its
  fp32 LSE, and returning the gradients rounded to the case dtype, as a kernel returns them.  With a soft-cap on
  fp16 inputs the tanh's argument is also formed in fp16 (:func:`softcap_arg_dtype`): a flash kernel's tanh is an
  approximation of about fp16's precision (FA2: ``tanh.approx.f32``), and without it a correct kernel's
  soft-capped fp16 dK fails the mean rule (docs/concepts/backward.md, "The soft-capped fp16 baseline").
* for a backend that hands ALiBi to its kernel as an additive bias in a lower dtype (``alibi_dtype``:
  :meth:`attnfast.base.Backend.alibi_bias_dtype`; sdpa-cuda, whose fused SDPA backends take a bias only in the query
  dtype), the baseline's ALiBi is that bias, rounded as the adapter rounds it, in its forward and its backward: the
  kernel's input, not its arithmetic (docs/concepts/backward.md, "The ALiBi bias of an SDPA kernel").  The
  reference stays exact.

Every backend of a case is judged against the same two (a backend with an ``alibi_dtype`` on an ALiBi case against
its own baseline), so they are cached (:func:`gradients`): the cache keeps the last :data:`CACHE_SIZE` entries,
keyed by the case id, the device, the ALiBi dtype and a fingerprint of the input tensors (the harness gives each
backend clones of the same inputs, so clones hit the entry and another seed misses it).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import torch

from attnref import AttnGrads, AttnResult, Numerics, attention_varlen_backward
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.verdict.reference import case_options, default_numerics, reference, strict_fp32

__all__ = ["CACHE_SIZE", "CaseGrads", "baseline_grads", "gradients", "reference_grads", "softcap_arg_dtype"]

#: How many (case, inputs, ALiBi dtype) entries the cache keeps: a worker judges one case's backends one after the
#: other (the default pair and an ALiBi-bias backend's).
CACHE_SIZE = 3


class CaseGrads(NamedTuple):
    """The reference and the same-precision baseline gradients of one case's inputs."""

    ref: AttnGrads
    base: AttnGrads


_CACHE: OrderedDict[tuple, CaseGrads] = OrderedDict()


def softcap_arg_dtype(case: AttentionCase) -> torch.dtype | None:
    """The dtype the baseline forms the soft-cap's tanh argument in: fp16 for a soft-capped fp16 case, else None (no
    rounding; a bf16 baseline's own rounding of P and dS, 2^-8, already covers a tanh of fp16 precision)."""
    return torch.float16 if case.softcap is not None and case.torch_dtype == torch.float16 else None


def _backward(
    case: AttentionCase,
    inputs: CaseInputs,
    numerics: Numerics,
    fwd: AttnResult,
    operand,
    softcap_arg=None,
    alibi_dtype: torch.dtype | None = None,
) -> AttnGrads:
    if inputs.dout is None:
        raise ValueError(f"inputs.dout must be set for a backward case ({case.id}): make_inputs draws it")
    with strict_fp32():
        return attention_varlen_backward(
            inputs.q,
            inputs.k,
            inputs.v,
            inputs.dout,
            inputs.cu_seqlens_q,
            inputs.cu_seqlens_k,
            options=case_options(case),
            alibi_slopes=inputs.alibi_slopes,
            sinks=inputs.sinks,
            numerics=numerics,
            operand_dtype=operand,
            softcap_arg_dtype=softcap_arg,
            alibi_dtype=alibi_dtype,
            out=fwd.out,
            lse=fwd.lse,
        )


def reference_grads(case: AttentionCase, inputs: CaseInputs, fwd: AttnResult | None = None) -> AttnGrads:
    """The reference gradients (``fwd``: the forward reference, computed when None)."""
    fwd = reference(case, inputs) if fwd is None else fwd
    return _backward(case, inputs, default_numerics(case), fwd, None)


def baseline_grads(
    case: AttentionCase, inputs: CaseInputs, fwd: AttnResult | None = None, alibi_dtype: torch.dtype | None = None
) -> AttnGrads:
    """The same-precision baseline gradients, in the case dtype (see the module docstring); ``alibi_dtype``: the
    dtype of the backend's ALiBi bias (None: exact; ignored without ALiBi), ``fwd`` then recomputed with it."""
    alibi_dtype = alibi_dtype if case.alibi else None
    if alibi_dtype is not None:  # the forward the kernel computes: the same rounded bias
        fwd = reference(case, inputs, Numerics(dtype=torch.float32), alibi_dtype)
    fwd = reference(case, inputs) if fwd is None else fwd
    dt = case.torch_dtype
    kernel_like = AttnResult(fwd.out.to(dt).float(), fwd.lse.float())
    g = _backward(case, inputs, Numerics(dtype=torch.float32), kernel_like, dt, softcap_arg_dtype(case), alibi_dtype)
    return AttnGrads(g.dq.to(dt), g.dk.to(dt), g.dv.to(dt), None if g.dsinks is None else g.dsinks.to(dt))


def _fingerprint(inputs: CaseInputs) -> tuple:
    parts = (inputs.q, inputs.k, inputs.v, inputs.dout, inputs.sinks, inputs.alibi_slopes)
    return tuple(
        None
        if t is None
        else (tuple(t.shape), float(t.detach().double().sum()), float(t.detach().double().abs().sum()))
        for t in parts
    )


def gradients(
    case: AttentionCase, inputs: CaseInputs, fwd: AttnResult | None = None, alibi_dtype: torch.dtype | None = None
) -> CaseGrads:
    """Reference and baseline gradients of ``case`` on ``inputs``, from the cache when already computed;
    ``alibi_dtype``: the backend's ALiBi bias dtype (:func:`baseline_grads`), None for a kernel that forms ALiBi."""
    alibi_dtype = alibi_dtype if case.alibi else None
    key = (case.id, str(inputs.q.device), str(alibi_dtype), _fingerprint(inputs))
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    if alibi_dtype is not None:  # the reference is the exact one: the plain entry's
        grads = CaseGrads(gradients(case, inputs, fwd).ref, baseline_grads(case, inputs, alibi_dtype=alibi_dtype))
    else:
        fwd = reference(case, inputs) if fwd is None else fwd
        grads = CaseGrads(reference_grads(case, inputs, fwd), baseline_grads(case, inputs, fwd))
    _CACHE[key] = grads
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return grads
