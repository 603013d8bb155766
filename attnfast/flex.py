"""torch FlexAttention adapter on CPU (``torch.nn.attention.flex_attention``), eager mode.

Translation, per request (one flex call each, ``(1, h, sq, d)`` views):

* keys: paged gather and kvcache append as in :func:`attnfast._torch_common.sequences`, in
  ``prepare``;
* ``mask_mod``: causal / window / chunk, bottom-right aligned, written here from the rule in
  ``../shared/SEMANTICS.md`` (not from :mod:`attnref`); a ``BlockMask`` is built in ``prepare``;
  context parallel (vLLM FA3's ``cp_world_size`` / ``cp_rank`` / ``cp_tot_seqused_k``): key ``j`` is
  absolute key ``j * W + r`` of the sequence's ``T`` keys, causal in absolute positions;
* ``score_mod``: soft-cap ``cap * tanh(s / cap)``, then ALiBi ``-slope * |i + sk - sq - j|``;
* sinks: flex has no sink argument, so one extra key (``k = 0``, ``v = 0``) is appended whose
  score the ``score_mod`` replaces by the sink's logit, visible from every row; it then joins only
  the softmax denominator and the LSE, exactly the sink semantics;
* a request with no key gets one zero key hidden by the mask (eager flex fails on an empty key
  axis), so its rows are flex's fully masked rows;
* GQA / MQA: ``enable_gqa=True``; ``d != dv`` and any head dim work in eager mode;
* LSE: flex's own, requested with ``AuxRequest(lse=True)`` (``return_lse=True`` on torch without
  it); measured to be the natural log (the op converts its internal log2), ``-inf`` for a fully
  masked row whose output flex already sets to 0.

Why eager (torch 2.13, CPU): eager flex (``math_attention``) computes scores and LSE in fp32 and
``P.V`` in the input dtype, materialising the scores of one call; it ignores the block mask's
sparsity and applies ``mask_mod`` densely.  ``torch.compile(flex_attention)`` on CPU compiles a
C++ kernel (14 s for the first shape, about 2.5 s per new shape) but refuses the LSE:
"LoweringException: NotImplementedError: torch.compile on CPU only supports inference and
`return_lse` is not supported yet."  The adapter trades the fused CPU kernel for the LSE check.
To bound the materialised scores, long requests are split into query tiles (``max_score_elems``).

No backward: ``flex_attention`` refuses any CPU input that requires grad ("FlexAttention does not support backward
on CPU", ``_validate_device`` in ``torch/nn/attention/flex_attention.py``, torch 2.13), so ``backward`` and
``bwd_deterministic`` are refused with that reason rather than rebuilt from other ops (that would test those ops).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from ._torch_common import SeqTensors, host_graph_call, sequences, softmax_scale, with_sink_column
from .base import Backend, KernelOutput

__all__ = ["FlexCpuBackend", "make_mask_mod", "make_score_mod"]

#: eager flex warns on every call that it is not compiled; that is the choice documented above.
_EAGER_WARNING = r"flex_attention called without torch.compile"
#: measured on torch 2.13 (CPU): flex_attention's _validate_device raises NotImplementedError with this message.
_NO_BACKWARD = (
    "torch's flex_attention raises 'FlexAttention does not support backward on CPU' for inputs that require grad "
    "(flex_attention._validate_device, torch 2.13)"
)


def make_mask_mod(
    case: AttentionCase, sq: int, sk: int, q_offset: int = 0, cp_total: int | None = None
) -> Callable[..., torch.Tensor]:
    """``mask_mod(b, h, q_idx, kv_idx)`` of one request.

    ``q_idx`` counts from ``q_offset`` (the first query row of a tile); key ``sk`` is the sink
    column when ``case.sinks`` and is visible from every row.  ``cp_total``: the request's keys over
    all ranks of a context-parallel case.
    """
    left, right = case.window
    if case.causal:
        right = 0
    chunk = case.chunk
    shift = sk - sq + q_offset
    sinks = case.sinks
    world, rank = case.cp_world, case.cp_rank
    if world > 1 and cp_total is None:
        raise ValueError("a context-parallel case needs the request's total keys (cp_total)")
    cp_shift = 0 if cp_total is None else cp_total - sq + q_offset

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        p = q_idx + shift
        ok = kv_idx < sk
        if world > 1:  # causal in absolute positions: key kv_idx is absolute key kv_idx * world + rank
            a = kv_idx * world + rank
            assert cp_total is not None  # checked above
            ok = ok & (a <= q_idx + cp_shift) & (a < cp_total)
            return ok | (kv_idx == sk) if sinks else ok
        if left is not None:
            ok = ok & (kv_idx >= p - left)
        if right is not None:
            ok = ok & (kv_idx <= p + right)
        if chunk is not None:
            ok = ok & (torch.div(p, chunk, rounding_mode="floor") == torch.div(kv_idx, chunk, rounding_mode="floor"))
        if sinks:
            ok = ok | (kv_idx == sk)
        return ok

    return mask_mod


def make_score_mod(
    case: AttentionCase,
    sq: int,
    sk: int,
    q_offset: int = 0,
    slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
) -> Callable[..., torch.Tensor] | None:
    """``score_mod(score, b, h, q_idx, kv_idx)``: soft-cap, ALiBi, sink logit; None when idle.

    ``score`` arrives already scaled (flex multiplies by ``scale`` first), as in the kernels.
    """
    cap = case.softcap
    if cap is None and slopes is None and sinks is None:
        return None
    shift = sk - sq + q_offset

    def score_mod(
        score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        s = score
        if cap is not None:
            s = torch.tanh(s / cap) * cap
        if slopes is not None:
            s = s - slopes[h] * (q_idx + shift - kv_idx).abs()
        if sinks is not None:
            s = torch.where(kv_idx == sk, sinks[h], s)
        return s

    return score_mod


def _flex_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """flex_attention returning (out, lse) on this torch, whichever LSE spelling it has."""
    from torch.nn.attention import flex_attention as fa

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_EAGER_WARNING)
        if hasattr(fa, "AuxRequest"):
            out, aux = fa.flex_attention(q, k, v, return_aux=fa.AuxRequest(lse=True), **kwargs)
            return out, aux.lse
        return fa.flex_attention(q, k, v, return_lse=True, **kwargs)


@dataclass
class _Tile:
    q0: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict[str, Any]


class FlexCpuBackend(Backend):
    """FlexAttention on CPU, eager, per request (query-tiled), LSE from flex itself."""

    name: ClassVar[str] = "flex-cpu"
    family: ClassVar[str] = "torch-flex"
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    description: ClassVar[str] = (
        "torch flex_attention on CPU (eager); mask_mod/score_mod per request; sinks as an extra key"
    )
    refused: ClassVar[dict[str, str]] = {
        "backward": _NO_BACKWARD,
        "bwd_deterministic": _NO_BACKWARD,
    }
    #: quantized inputs are dequantized and MLA's qv concatenated in ``_torch_common.sequences``; context
    #: parallel (``cp``) is a rule of the ``mask_mod``.
    accepts: ClassVar[frozenset[str]] = frozenset(
        {"fp8_e4m3", "fp8_e5m2", "fp8_kv_only", "descale_head", "int8_t1", "int8_t2", "qv", "cp", "graph"}
        | {"append_short", "append_uneven", "append_quant"}  # the appends of _torch_common.sequences
    )
    #: ``flex_attention`` takes no split count
    batch_invariance_via: ClassVar[str | None] = None

    def __init__(self, max_score_elems: int = 1 << 24) -> None:
        if max_score_elems < 1:
            raise ValueError(f"max_score_elems must be >= 1, got {max_score_elems}")
        self.max_score_elems = max_score_elems

    def version(self) -> str:
        return torch.__version__

    def prepare_graph(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        """Graph mode on CPU: eager "replays" over the bucket's buffers (:func:`host_graph_call`)."""
        return host_graph_call(self.prepare, case, inputs)

    def _tiles(self, case: AttentionCase, inputs: CaseInputs, seq: SeqTensors, scale: float) -> list[_Tile]:
        from torch.nn.attention.flex_attention import create_block_mask

        sq, sk = seq.sq, seq.sk
        if sq == 0:
            return []
        k, v = seq.k, seq.v
        if case.sinks or sk == 0:
            # With sinks: the sink column.  With no key at all: one zero key that the mask hides
            # from every row, because eager flex fails on an empty key axis ("IndexError: max():
            # Expected reduction dim 3 to have non-zero size."); the rows stay fully masked.
            k, v = with_sink_column(k, v)
        sk_total = k.shape[0]
        # Eager flex materialises (h, rows, keys) fp32 scores and a few same-size index tensors.
        rows = max(1, min(sq, self.max_score_elems // max(1, case.num_heads * max(sk_total, 1))))
        kh, vh = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
        slopes = sinks = None
        if case.alibi:
            assert inputs.alibi_slopes is not None  # the inputs of an ALiBi case hold its slopes
            slopes = inputs.alibi_slopes.to(k.device, torch.float32)
        if case.sinks:
            assert inputs.sinks is not None  # the inputs of a case with sinks hold them
            sinks = inputs.sinks.to(k.device, torch.float32)
        tiles = []
        for r0 in range(0, sq, rows):
            r1 = min(sq, r0 + rows)
            mask_mod = make_mask_mod(case, sq, sk, r0, seq.cp_total)
            kwargs: dict[str, Any] = {"scale": scale, "enable_gqa": case.num_heads != case.num_kv_heads}
            kwargs["block_mask"] = create_block_mask(mask_mod, None, None, r1 - r0, sk_total, device=str(k.device))
            kwargs["score_mod"] = make_score_mod(case, sq, sk, r0, slopes, sinks)
            tiles.append(_Tile(seq.q0 + r0, seq.q[r0:r1].transpose(0, 1)[None], kh, vh, kwargs))
        return tiles

    def prepare(self, case: AttentionCase, inputs: CaseInputs) -> Callable[[], KernelOutput]:
        scale = softmax_scale(case)
        tiles: list[_Tile] = []
        for seq in sequences(case, inputs):
            tiles += self._tiles(case, inputs, seq, scale)
        h, dv, total_q = case.num_heads, case.dv, case.total_q
        dtype, device = case.torch_dtype, inputs.q.device

        def run() -> KernelOutput:
            out = torch.zeros(total_q, h, dv, dtype=dtype, device=device)
            lse = torch.full((h, total_q), -math.inf, dtype=torch.float32, device=device)
            for t in tiles:
                n = t.q.shape[2]
                o, l = _flex_call(t.q, t.k, t.v, **t.kwargs)
                out[t.q0 : t.q0 + n] = o[0].transpose(0, 1)
                lse[:, t.q0 : t.q0 + n] = l[0].to(torch.float32)
            return KernelOutput(out, lse)

        return run
