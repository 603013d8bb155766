"""Seed ``004``: vLLM V1's FlashAttention backend for MLA prefill (``FlashAttnPrefillImpl``).

The layer: DeepSeek-style MLA prefill with qk head dim 192 (128 nope + 64 rope) and v head dim 128.  For a
batch of prefill requests, each with ``cached`` context tokens and ``new`` tokens:

1. ``run_prefill_new_tokens``: the new tokens attend to themselves, causal, with LSE
   (``cu_seqlens_q = cu_seqlens_k = query_start_loc``);
2. ``run_prefill_context_chunk``: the context is read in chunks of at most ``chunk`` tokens per request
   (vLLM's ``chunked_context``: chunk ``c`` of request ``b`` covers its context tokens
   ``[c * chunk, min((c + 1) * chunk, cached_b))``), each chunk attended without a mask, with LSE;
3. the chunk results are merged into one context result, and that with the new tokens' result, by
   ``merge_attn_states`` (:func:`conformance.engines.merge.merge_attn_states`).

``_flash_attn_varlen_diff_headdims``: when the kernel cannot take ``head_dim_v != head_dim`` (vLLM pads unless
it runs FA3 on Hopper or FA4), V is zero-padded to 192 before the call, and the caller keeps the first 128
output channels.  The replay decides the padding as vLLM does, from the kernel: if the backend refuses the
unpadded call but takes the padded one, it pads.  A request with no context in a chunk gets an empty
sequence in that chunk's call (LSE ``-inf``; vLLM's merge reads FA2's ``+inf`` the same way).

Reference: plain causal attention of the new tokens over ``[context | new]`` (192/128), the layer without the
chunking.
"""

from __future__ import annotations

import torch

from attnfast.base import Backend, KernelOutput, Support
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.cases.sweep import MLA_SCALE

from ..base import Engine, EngineRun, Kernel, Request
from ..calls import call_case, contiguous_call, scenario_cases
from ..merge import merge_attn_states

__all__ = ["VllmMLAPrefill"]

QK_DIM, V_DIM = 192, 128
#: DeepSeek's softmax scale 1/sqrt(qk_nope + qk_rope) (rounded), passed explicitly as vLLM does.
SCALE = MLA_SCALE

#: scenario -> (requests, context chunk size).
SCENARIOS: dict[str, tuple[tuple[Request, ...], int]] = {
    "no_context": ((Request(new=37), Request(new=128), Request(new=5)), 64),
    "context_one_chunk": ((Request(new=20, cached=50), Request(new=64, cached=40)), 64),
    "context_chunks": ((Request(new=16, cached=300), Request(new=33, cached=70), Request(new=8, cached=129)), 64),
    # request 1 has no context: an empty sequence in the (single) chunk call, LSE -inf merged with its new tokens.
    # With two or more chunks vLLM's pairwise merge would see -inf on both sides (NaN): tests/.../test_engines.py
    "mixed_context": ((Request(new=24, cached=200), Request(new=40), Request(new=3, cached=5)), 256),
    "long_chunks": ((Request(new=128, cached=1500), Request(new=1, cached=700)), 512),
}


class VllmMLAPrefill(Engine):
    """Seed 004 replayed: new tokens causal + context chunks unmasked, merged by LSE; V padded where needed."""

    name = "vllm_mla_prefill"
    seed = "004"
    description = "vLLM V1 MLA prefill (FlashAttnPrefillImpl): 192/128, context chunks merged by LSE, padded V"

    def cases(self) -> list[AttentionCase]:
        mla = {"head_dim": QK_DIM, "head_dim_v": V_DIM, "causal": True, "scale": SCALE}
        variants = [
            {"num_heads": h, "num_kv_heads": hk, "dtype": dtype, **mla}
            for (h, hk), dtype in (((16, 16), "bf16"), ((8, 8), "fp16"))
        ]
        return scenario_cases(self.name, {name: reqs for name, (reqs, _) in SCENARIOS.items()}, variants)

    def check(self, case: AttentionCase) -> None:
        if case.scenario not in SCENARIOS:
            raise ValueError(
                f"scenario must be one of {sorted(SCENARIOS)} for engine {self.name}, got {case.scenario!r}"
            )
        reqs = SCENARIOS[case.scenario][0]
        if case.requests != tuple((r.new, r.kv) for r in reqs):
            raise ValueError(f"requests must be scenario {case.scenario!r}'s {[(r.new, r.kv) for r in reqs]}")
        if not case.causal or case.paged or case.has_window or case.quant != "none" or case.qv:
            raise ValueError(f"engine {self.name} replays causal contiguous MLA prefill (no window, quant or qv)")
        if case.alibi or case.sinks:  # DeepSeek's MLA has neither, and the chunks' calls pass neither
            raise ValueError(f"engine {self.name} replays MLA prefill without ALiBi or sinks (its calls pass neither)")

    # ------------------------------------------------------------------ metadata (vLLM's chunked_context)
    def _chunks(self, case: AttentionCase) -> list[list[tuple[int, int]]]:
        """Per chunk, per request: the ``[start, end)`` of its context tokens read by that chunk."""
        chunk = SCENARIOS[case.scenario][1]
        cached = [kl - ql for ql, kl in case.requests]
        n_chunks = max((-(-c // chunk) for c in cached), default=0)
        return [[(min(i * chunk, c), min((i + 1) * chunk, c)) for c in cached] for i in range(n_chunks)]

    def _calls(self, case: AttentionCase, pad: bool) -> list[tuple[str, AttentionCase]]:
        dims = dict(head_dim_v=None) if pad else {}
        calls = [("new tokens (causal)", call_case(case, [(ql, ql) for ql, _ in case.requests], **dims))]
        for i, spans in enumerate(self._chunks(case)):
            reqs = [(ql, e - s) for (ql, _), (s, e) in zip(case.requests, spans)]
            calls.append((f"context chunk {i} (unmasked)", call_case(case, reqs, causal=False, **dims)))
        return calls

    def _pads(self, case: AttentionCase, supports) -> bool:
        """vLLM's ``requires_v_padding``: pad when the kernel refuses head_dim_v != head_dim."""
        return not all(supports(c) for _, c in self._calls(case, pad=False))

    def plan(self, case: AttentionCase) -> list[tuple[str, AttentionCase]]:
        self.check(case)
        return self._calls(case, pad=False)

    def supports(self, case: AttentionCase, backend: Backend, device: str) -> Support:
        """The unpadded calls, or else the padded ones (vLLM pads for kernels without 192/128)."""
        self.check(case)
        pad = self._pads(case, lambda c: backend.supports(c, device))
        for label, call in self._calls(case, pad):
            support = backend.supports(call, device)
            if not support:
                return Support(False, f"{label}{' (V padded)' if pad else ''}: {support.reason}")
        return Support(True)

    def prepare(self, case: AttentionCase, inputs: CaseInputs, backend: Backend, device: str) -> EngineRun:
        pad = self._pads(case, lambda c: backend.supports(c, device))
        return EngineRun(lambda kernel: self._forward(case, inputs, kernel, pad), backend, device)

    def forward(self, case: AttentionCase, inputs: CaseInputs, kernel: Kernel) -> KernelOutput:
        return self._forward(case, inputs, kernel, pad=False)

    def _forward(self, case: AttentionCase, inputs: CaseInputs, kernel: Kernel, pad: bool) -> KernelOutput:
        self.check(case)
        calls = dict(self._calls(case, pad))
        cu_k = [int(x) for x in inputs.cu_seqlens_k.tolist()]
        ctx = [kl - ql for ql, kl in case.requests]

        def v_of(x: torch.Tensor) -> torch.Tensor:  # _flash_attn_varlen_diff_headdims's padding
            return torch.nn.functional.pad(x, [0, QK_DIM - V_DIM], value=0) if pad else x

        def run(label: str, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            res = kernel(contiguous_call(label, calls[label], inputs.q, k, v_of(v)))
            if res.lse is None:
                raise ValueError(f"{label}: vLLM's MLA prefill needs the LSE; this backend returned none")
            return res.out[..., :V_DIM], res.lse  # (out, lse); the caller strips the padding

        new_k = torch.cat([inputs.k[cu_k[b] + c : cu_k[b + 1]] for b, c in enumerate(ctx)])
        new_v = torch.cat([inputs.v[cu_k[b] + c : cu_k[b + 1]] for b, c in enumerate(ctx)])
        result = run("new tokens (causal)", new_k, new_v)
        context: tuple[torch.Tensor, torch.Tensor] | None = None
        for i, spans in enumerate(self._chunks(case)):
            k = torch.cat([inputs.k[cu_k[b] + s : cu_k[b] + e] for b, (s, e) in enumerate(spans)])
            v = torch.cat([inputs.v[cu_k[b] + s : cu_k[b] + e] for b, (s, e) in enumerate(spans)])
            part = run(f"context chunk {i} (unmasked)", k, v)
            context = part if context is None else merge_attn_states(*context, *part)
        if context is None:
            return KernelOutput(*result)
        out, lse = merge_attn_states(*context, *result)
        return KernelOutput(out, lse)
