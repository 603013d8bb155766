"""Merging partial attention results the way the engines do, and merging as a mode of its own.

:func:`merge_attn_states` is vLLM's ``merge_attn_states`` (``csrc/attention/merge_attn_states.cu``, the
Triton version in ``vllm/attention/ops/triton_merge_attn_states.py``; SGLang's ``merge_state_v2`` is the
same computation with the LSE transposed), written here in torch from those sources: an infinite LSE on
either side (FA2 writes ``+inf`` for a part with no key, FA3 ``-inf``) is read as ``-inf``, then

    max = max(lse_p, lse_s);  w_p = exp(lse_p - max);  w_s = exp(lse_s - max)
    out = out_p * w_p / (w_p + w_s) + out_s * w_s / (w_p + w_s);  lse = log(w_p + w_s) + max

in fp32.  A row with no key on *both* sides therefore gets ``-inf - -inf = NaN`` weights: the engine merge
outputs NaN where :func:`attnref.merge_states` (the reference merge) gives 0 and LSE ``-inf``.  Compositions
that can produce such rows must avoid them; the :class:`MergeStates` replay shows which kernels' LSE
conventions the engine merge handles.

:class:`MergeStates` (engine ``merge``) replays the simplest composition that depends on the merge: every
request's keys split at a point, the part before it attended without a mask (every row sees it), the part
after it with the causal mask, the two merged with :func:`merge_attn_states`; scenarios place the split so
that one side is empty for some or all rows (the ``-inf`` / ``+inf`` LSE cases).  The layer's reference is
plain causal attention over all keys.
"""

from __future__ import annotations

import math

import torch

from attnfast.base import KernelOutput
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs

from .base import Engine, Kernel, Request
from .calls import call_case, contiguous_call, scenario_cases

__all__ = ["MergeStates", "merge_attn_states", "merge_many_attn_states"]


def merge_attn_states(
    prefix_out: torch.Tensor, prefix_lse: torch.Tensor, suffix_out: torch.Tensor, suffix_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's merge of two partial results: ``out (n, h, d)`` in the parts' dtype, ``lse (h, n)`` fp32.

    See the module docstring for the formula and its ``+inf`` / ``-inf`` handling (both sides empty: NaN)."""
    p_lse, s_lse = prefix_lse.float(), suffix_lse.float()
    p_lse = torch.where(torch.isinf(p_lse), -math.inf, p_lse)
    s_lse = torch.where(torch.isinf(s_lse), -math.inf, s_lse)
    max_lse = torch.maximum(p_lse, s_lse)
    p_se, s_se = torch.exp(p_lse - max_lse), torch.exp(s_lse - max_lse)
    out_se = p_se + s_se
    p_scale = (p_se / out_se).transpose(0, 1)[..., None]
    s_scale = (s_se / out_se).transpose(0, 1)[..., None]
    out = prefix_out.float() * p_scale + suffix_out.float() * s_scale
    return out.to(prefix_out.dtype), torch.log(out_se) + max_lse


def merge_many_attn_states(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold :func:`merge_attn_states` over several parts, left to right (vLLM's context-chunk loop)."""
    out, lse = outs[0], lses[0]
    for o, ls in zip(outs[1:], lses[1:]):
        out, lse = merge_attn_states(out, lse, o, ls)
    return out, lse


#: scenario -> (requests, split of each request: keys before it go to the unmasked part).  ``split_fn(r)``.
_SCENARIOS: dict[str, tuple[tuple[Request, ...], str]] = {
    # both parts non-empty for every row
    "split_mid": ((Request(new=24, cached=40), Request(new=1, cached=300), Request(new=7, cached=9)), "cached"),
    # the unmasked part is empty for request 1 (no cached keys): its prefix LSE is -inf (FA3/FA4) or +inf (FA2)
    "empty_prefix": ((Request(new=24, cached=40), Request(new=16), Request(new=1, cached=77)), "cached"),
    # every request's unmasked part empty: the merge reads an infinite prefix LSE on every row
    "all_prefix_empty": ((Request(new=20), Request(new=3), Request(new=1)), "cached"),
    # split half-way into the new tokens' causal part is impossible; split at half the cached keys instead
    "split_half_cache": ((Request(new=5, cached=64), Request(new=2, cached=31)), "half"),
}


class MergeStates(Engine):
    """Two-part composition merged with vLLM's ``merge_attn_states`` (see the module docstring)."""

    name = "merge"
    seed = "001/003/004"
    description = "keys split in an unmasked and a causal part, merged by LSE as vLLM / SGLang merge_attn_states"

    def cases(self) -> list[AttentionCase]:
        variants = [
            {"num_heads": h, "num_kv_heads": hk, "head_dim": d, "dtype": dtype, "causal": True}
            for (h, hk), d, dtype in (((8, 2), 64, "bf16"), ((4, 4), 128, "fp16"))
        ]
        return scenario_cases(self.name, {name: reqs for name, (reqs, _) in _SCENARIOS.items()}, variants)

    def check(self, case: AttentionCase) -> None:
        if case.scenario not in _SCENARIOS:
            raise ValueError(f"scenario must be one of {sorted(_SCENARIOS)} for engine merge, got {case.scenario!r}")
        if not case.causal or case.paged or case.has_window or case.quant != "none" or case.qv:
            raise ValueError("engine merge replays causal contiguous attention without window, quantization or qv")
        if case.alibi or case.sinks:  # each part's positions start at 0, and each part would count the sink
            raise ValueError("engine merge replays attention without ALiBi or sinks (its parts pass neither)")

    def _split(self, case: AttentionCase) -> list[int]:
        """Keys of each request that go to the unmasked part (all before every row's diagonal)."""
        rule = _SCENARIOS[case.scenario][1]
        cached = [kl - ql for ql, kl in case.requests]
        return cached if rule == "cached" else [c // 2 for c in cached]

    def _parts(self, case: AttentionCase) -> tuple[AttentionCase, AttentionCase]:
        split = self._split(case)
        prefix = call_case(case, [(ql, p) for (ql, _), p in zip(case.requests, split)], causal=False)
        suffix = call_case(case, [(ql, kl - p) for (ql, kl), p in zip(case.requests, split)], causal=True)
        return prefix, suffix

    def plan(self, case: AttentionCase) -> list[tuple[str, AttentionCase]]:
        self.check(case)
        prefix, suffix = self._parts(case)
        return [("prefix (unmasked)", prefix), ("suffix (causal)", suffix)]

    def forward(self, case: AttentionCase, inputs: CaseInputs, kernel: Kernel) -> KernelOutput:
        self.check(case)
        prefix, suffix = self._parts(case)
        split = self._split(case)
        cu_k = [int(x) for x in inputs.cu_seqlens_k.tolist()]
        pk = torch.cat([inputs.k[cu_k[b] : cu_k[b] + p] for b, p in enumerate(split)])
        pv = torch.cat([inputs.v[cu_k[b] : cu_k[b] + p] for b, p in enumerate(split)])
        sk = torch.cat([inputs.k[cu_k[b] + p : cu_k[b + 1]] for b, p in enumerate(split)])
        sv = torch.cat([inputs.v[cu_k[b] + p : cu_k[b + 1]] for b, p in enumerate(split)])
        a = kernel(contiguous_call("prefix (unmasked)", prefix, inputs.q, pk, pv))
        b = kernel(contiguous_call("suffix (causal)", suffix, inputs.q, sk, sv))
        if a.lse is None or b.lse is None:
            raise ValueError("the merge needs both parts' LSE; this backend returned none")
        out, lse = merge_attn_states(a.out, a.lse, b.out, b.lse)
        return KernelOutput(out, lse)
