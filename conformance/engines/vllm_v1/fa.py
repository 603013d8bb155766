"""Seed ``001``: vLLM V1's FlashAttention backend in a vendor fork (``FlashAttentionImpl``, ixformer kernels).

The replay rebuilds one decoder attention step of the fork from its metadata builder on, and judges the layer
output against plain attention of every new token over all its keys (the case's window and sinks; with a shared
prompt, see *cascade*).

What the replay follows in the seed (runner side, cache layout, builder, forward, cascade decision, int8), its
invariance scenarios and what it does not replay are in ``docs/concepts/engines.md`` (*Seed 001: what the replay
follows*); a case it does not replay is refused by :meth:`VllmV1FlashAttention.check` with the reason.  The output
is compared in the caller's token order (:meth:`VllmV1FlashAttention._restore`); bad metadata raises ``ValueError``
naming the field.
block size as ``key_cache.shape[-2]`` (right for its HND view; the replay reads it by layout).

Where it lives: this module is the engine, :class:`VllmV1FlashAttention` (cases and checks, the shared prompt,
the calls, the forward composition: two calls, cascade, encoder).  Its base class
:class:`~conformance.engines.vllm_v1.runner.VllmV1Runner` holds the runner side and the cache (layout and
allocation, the step, block tables, slot mapping, the cascade decision, the cache writes);
:mod:`conformance.engines.vllm_v1.metadata` the seed's functions (:func:`use_cascade_attention`,
:func:`reorder_batch`, :func:`split_decodes_and_prefills`) and :class:`FlashAttentionMetadataBuilder`;
:mod:`conformance.engines.vllm_v1.scenarios` the :data:`SCENARIOS` table; :mod:`conformance.engines.vllm_v1.dcp`
the DCP forward (its collectives in :mod:`~conformance.engines.vllm_v1.collectives`, the kernel-cp variant in
:mod:`~conformance.engines.vllm_v1.dcp_kernel`, the run across processes in
:mod:`~conformance.engines.vllm_v1.dcp_dist`).  The package's ``__init__`` lists them in import order and re-exports
their public names.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from attnfast.base import KernelOutput, Support
from attnref import AttnResult, gather_kv
from attnref.paged import as_layout
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.cases.paged_kv import PagedKV, cu_seqlens
from conformance.cases.quant_inputs import QuantTensors

from ..base import Call, Kernel, Request, call_inputs
from ..calls import call_case, contiguous_call, paged_call
from ..graph_call import graph_support
from ..merge import merge_attn_states
from .dcp import dcp_calls, dcp_forward
from .graph import GRAPH_SCENARIOS, V1GraphRun, captured_call, check_graph_case, graph_case
from .runner import (
    KVCache,
    Step,
    VllmV1Runner,
    kernel_block_size,
)
from .scenarios import INVARIANCE_SCENARIOS, SCENARIOS, Scenario, invariance_cases

__all__ = ["VllmV1FlashAttention"]


class VllmV1FlashAttention(VllmV1Runner):
    """Seed 001 replayed (see the module docstring); the runner side is the base class's."""

    name = "vllm_v1_fa"
    seed = "001"
    description = "vLLM V1 FlashAttention (vendor fork): reorder, decode/prefill, cascade, DCP, layouts, int8"

    #: False: the fork (``s_aux`` reaches neither cascade call); True: upstream vLLM (the prefix call takes it).
    cascade_sinks_on_prefix: ClassVar[bool] = False

    # ------------------------------------------------------------------ cases and checks
    def cases(self) -> list[AttentionCase]:
        return (
            [
                AttentionCase(
                    requests=tuple((r.new, r.kv) for r in sc.requests), engine=self.name, scenario=name, **sc.layer
                )
                for name, sc in SCENARIOS.items()
            ]
            + [graph_case(self.name, name, sc) for name, sc in GRAPH_SCENARIOS.items()]
            + invariance_cases(self.name)
        )

    def scenario(self, case: AttentionCase) -> Scenario:
        if case.scenario in INVARIANCE_SCENARIOS:  # the batch is the case's: one variant of the invariance
            sc = INVARIANCE_SCENARIOS[case.scenario][1]
            return dataclasses.replace(sc, requests=tuple(Request(new=q, cached=kv - q) for q, kv in case.requests))
        if case.scenario not in SCENARIOS:
            raise ValueError(
                f"scenario must be one of {sorted(SCENARIOS)} for engine {self.name}, got {case.scenario!r}"
            )
        return SCENARIOS[case.scenario]

    def check(self, case: AttentionCase) -> None:
        if case.scenario in GRAPH_SCENARIOS:
            return check_graph_case(case, GRAPH_SCENARIOS[case.scenario])
        sc = self.scenario(case)
        want = tuple((r.new, r.kv) for r in sc.requests)
        if case.requests != want:
            raise ValueError(f"requests must be scenario {case.scenario!r}'s {list(want)}, got {list(case.requests)}")
        problems = []
        if any(r.new < 1 or r.cached < 0 for r in sc.requests):
            problems.append("every request computes new tokens after its cached ones (1 <= q_len <= kv_len)")
        if case.num_splits != (1 if sc.batch_invariant else None):
            problems.append(
                f"num_splits must be {1 if sc.batch_invariant else None} (batch-invariant mode: "
                f"{sc.batch_invariant}), got {case.num_splits}"
            )
        if sc.encoder:
            if case.causal or case.paged:
                problems.append("encoder attention is bidirectional (causal=False) over contiguous q/k/v")
            if case.sinks or case.quant != "none":
                problems.append("the fork's encoder call passes no sinks and takes no quantized inputs")
        else:
            if not case.causal or not case.paged:
                problems.append("the fork's decoder calls are causal (hard-coded causal=True) over a paged cache")
            if case.block_size is not None and case.block_size % 16:  # set exactly when paged
                problems.append(f"block_size must be a multiple of 16 (get_kv_cache_shape), got {case.block_size}")
        if case.dv != case.head_dim or case.qv or case.v_padded or case.append:
            problems.append("K and V share one cache tensor (head_dim_v == head_dim); no qv, V padding or append")
        if case.quant_family == "fp8":
            problems.append("fp8: the fork's prefill/decode calls pass no q/k/v descales (scales read as 1)")
        if case.alibi or case.chunk is not None:
            problems.append("ALiBi (the fork's sqrt_alibi variant) and chunked local attention are not replayed")
        if case.quant_family == "int8":
            if sc.shared_prefix or sc.dcp > 1:
                problems.append("int8 with cascade or DCP: the fork's paths read key_cache, unbound for int8")
            if case.kv_layout != "HND" or sc.physical or sc.manager_block:
                problems.append("int8 caches are the fork's contiguous HND (num_blocks, num_kv_heads, block_size, d)")
            if case.sinks:
                problems.append("the fork's int8 kernels take no sinks")
        if sc.dcp > 1:
            if case.num_kv_heads != 1 or case.num_heads % sc.dcp:
                problems.append(
                    "DCP runs on kv heads replicated across the group: one kv head per rank, h % world == 0"
                )
            if case.sinks or case.has_window or case.alibi:
                problems.append("DCP drops sinks and applies windows/ALiBi to rank-local positions")
            if case.block_size is not None and case.block_size % sc.interleave:  # None: refused above (paged)
                problems.append("cp_kv_cache_interleave_size must divide block_size")
        if (
            sc.manager_block
            and case.block_size is not None  # None: refused above (paged)
            and (sc.manager_block % case.block_size or kernel_block_size(sc.manager_block) != case.block_size)
        ):
            problems.append(f"block_size must be the kernel block size of manager block {sc.manager_block}")
        for b in sc.sharers():
            if sc.requests[b].kv < sc.shared_prefix:
                problems.append(
                    f"request {b} shares a {sc.shared_prefix}-token prompt but holds {sc.requests[b].kv} keys"
                )
        if problems:
            raise ValueError(f"scenario {case.scenario}: " + "; ".join(problems))

    # ------------------------------------------------------------------ the shared prompt (reference and forward)
    def layer_inputs(self, case: AttentionCase, inputs: CaseInputs) -> CaseInputs:
        """The case's inputs with the shared prompt made real: every sharer's first ``shared_prefix`` keys and
        values are the first sharer's (the same tokens, hence the same K/V in the shared blocks)."""
        if case.scenario in GRAPH_SCENARIOS:
            return inputs
        sc = self.scenario(case)
        sharers = sc.sharers()
        if len(sharers) < 2:
            return inputs
        cu = [int(x) for x in inputs.cu_seqlens_k.tolist()]
        p, s0 = sc.shared_prefix, sharers[0]
        k, v = inputs.k.clone(), inputs.v.clone()
        for b in sharers[1:]:
            k[cu[b] : cu[b] + p] = k[cu[s0] : cu[s0] + p]
            v[cu[b] : cu[b] + p] = v[cu[s0] : cu[s0] + p]
        return dataclasses.replace(inputs, k=k, v=v)

    def reference(self, case: AttentionCase, inputs: CaseInputs) -> AttnResult:
        return super().reference(case, self.layer_inputs(case, inputs))

    def baseline(self, case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        return super().baseline(case, self.layer_inputs(case, inputs))

    # ------------------------------------------------------------------ calls
    def calls(self, case: AttentionCase, step: Step) -> list[tuple[str, AttentionCase]]:
        """Every kernel call of the step, ``(label, call case)``, in the order the forward makes them."""
        if self.scenario(case).encoder:
            return [("encoder (bidirectional varlen)", call_case(case, case.requests, causal=False))]
        if step.dcp > 1:
            return dcp_calls(case, step)
        reqs = list(zip(step.q_lens, step.kv_lens))
        if step.common_prefix_len:
            p = step.common_prefix_len
            sinks = case.sinks and self.cascade_sinks_on_prefix
            return [
                (
                    "cascade prefix (all tokens, unmasked)",
                    call_case(case, [(sum(step.q_lens), p)], causal=False, sinks=sinks),
                ),
                ("cascade suffix (causal)", call_case(case, [(q, k - p) for q, k in reqs], sinks=False)),
            ]
        nd = step.num_decodes
        out = []
        if nd < len(reqs):
            out.append(("prefill (varlen, paged)", call_case(case, reqs[nd:])))
        if nd:
            out.append(("decode (paged kvcache)", call_case(case, reqs[:nd])))
        return out

    def plan(self, case: AttentionCase) -> list[tuple[str, AttentionCase]]:
        if case.scenario in GRAPH_SCENARIOS:
            self.check(case)
            return [("decode (captured at the bucket)", captured_call(case, GRAPH_SCENARIOS[case.scenario]))]
        return self.calls(case, self.step(case))

    # ------------------------------------------------------------------ CUDA graphs (graph.py)
    #: the graph scenarios' run (planted bugs replace it).
    graph_run: ClassVar[type[V1GraphRun]] = V1GraphRun

    def _graph_call(self, case: AttentionCase, backend) -> AttentionCase:
        sched = "sched_meta" not in backend.refusals()  # vLLM V1 schedules AOT only for FA3
        return captured_call(case, GRAPH_SCENARIOS[case.scenario], sched)

    def supports(self, case, backend, device):
        if case.scenario not in GRAPH_SCENARIOS:
            return super().supports(case, backend, device)
        if device.split(":")[0] not in backend.devices:
            return Support(False, f"runs on {'/'.join(backend.devices)}, not {device}")
        self.check(case)
        return graph_support(backend, self._graph_call(case, backend), device)

    def prepare(self, case, inputs, backend, device):
        if case.scenario not in GRAPH_SCENARIOS:
            return super().prepare(case, inputs, backend, device)
        self.check(case)
        sc = GRAPH_SCENARIOS[case.scenario]
        return self.graph_run(case, inputs, backend, device, sc, self._graph_call(case, backend))

    def paged(
        self,
        label: str,
        ccase: AttentionCase,
        inputs: CaseInputs,
        q_rows: torch.Tensor,
        cache: KVCache,
        table: torch.Tensor,
        sinks: torch.Tensor | None = None,
    ) -> Call:
        """One call over the paged cache: ``q_rows`` indexes the layer's tokens (reordered) the call computes."""
        k_view, v_view = self._kernel_view(cache)
        quant = inputs.quant
        if quant is None:
            kv = PagedKV(k_view, v_view, table, [], cache.block_size, ccase.kv_layout)
            return paged_call(label, ccase, inputs.q[q_rows], kv, table, sinks=sinks)
        lens, layout, bs = ccase.kv_lens, ccase.kv_layout, cache.block_size
        k_st, _ = gather_kv(k_view, table, lens, as_layout(layout))
        v_st, _ = gather_kv(v_view, table, lens, as_layout(layout))
        scales = []
        assert cache.k_scale is not None and quant.q is not None and quant.q_descale is not None
        for b, n in enumerate(lens):
            pos = torch.arange(n, device=table.device)
            blocks = table[b].long()[pos // bs]
            scales.append(cache.k_scale[blocks, :, pos % bs])
        k_scales = torch.cat(scales) if scales else cache.k_scale.new_zeros(0, ccase.num_kv_heads)
        v_deq = v_st.float() if cache.v_scale is None else v_st.float() * cache.v_scale
        qt = QuantTensors(
            "int8",
            k=k_st,
            k_descale=k_scales,
            q=quant.q[q_rows],
            q_descale=quant.q_descale[q_rows],
            v=v_st if cache.v_scale is not None else None,
            v_descale=cache.v_scale,
            k_scale_cache=cache.k_scale,
        )
        dev = q_rows.device
        return Call(
            label,
            ccase,
            call_inputs(
                ccase,
                q=inputs.q[q_rows],
                k=k_st.float() * k_scales[..., None],
                v=v_deq,
                cu_seqlens_q=cu_seqlens(ccase.q_lens, dev),
                cu_seqlens_k=cu_seqlens(lens, dev),
                k_cache=k_view,
                v_cache=v_view,
                block_table=table,
                quant=qt,
            ),
        )

    # ------------------------------------------------------------------ forward
    def forward(self, case: AttentionCase, inputs: CaseInputs, kernel: Kernel) -> KernelOutput:
        if case.scenario in GRAPH_SCENARIOS:
            raise ValueError(f"scenario {case.scenario!r} is a CUDA-graph replay: it runs through prepare()")
        inputs = self.layer_inputs(case, inputs)
        step = self.step(case)
        if self.scenario(case).encoder:  # _forward_encoder_attention: q, k, v as given, no cache
            ((label, ccase),) = self.calls(case, step)
            return kernel(contiguous_call(label, ccase, inputs.q, inputs.k, inputs.v))
        lse: torch.Tensor | None
        if step.dcp > 1:
            out, lse = dcp_forward(self, case, inputs, step, kernel)
        else:
            out, lse = self._forward_step(case, inputs, step, kernel)
        return self._restore(step, out, lse)

    def _forward_step(self, case, inputs, step, kernel) -> tuple[torch.Tensor, torch.Tensor | None]:
        dev = inputs.q.device
        calls = dict(self.calls(case, step))
        cache = self.make_cache(case, inputs, step)
        meta = self.builder(step).build(step.common_prefix_len, self.common_metadata(case, step, 0, dev))
        self.write_cache(case, inputs, cache, self.new_token_rows(inputs, step), meta.slot_mapping.tolist())
        tok = torch.tensor(step.token_index, dtype=torch.long, device=dev)
        if meta.use_cascade:
            return self._cascade(case, inputs, tok, cache, meta, calls, kernel)
        ndt = meta.num_decode_tokens

        def run(label: str, rows: torch.Tensor, table: torch.Tensor) -> KernelOutput:
            return kernel(self.paged(label, calls[label], inputs, rows, cache, table, sinks=inputs.sinks))

        prefill = decode = None
        if meta.prefill is not None:  # flash_attn_varlen_func (int8: flash_attn_varlen_int8_func) -> output[ndt:]
            prefill = run("prefill (varlen, paged)", tok[ndt:], meta.prefill.block_table)
        if meta.decode is not None:  # flash_attn_with_kvcache (int8: vllm_paged_attention_int8 / _mix) -> output[:ndt]
            decode = run("decode (paged kvcache)", tok[:ndt], meta.decode.block_table)
        parts = [p for p in (decode, prefill) if p is not None]
        out = torch.cat([p.out for p in parts])
        lses = [p.lse for p in parts if p.lse is not None]
        lse = torch.cat(lses, dim=1) if len(lses) == len(parts) else None
        return out, lse

    def _merge(self, prefix_out, prefix_lse, suffix_out, suffix_lse) -> tuple[torch.Tensor, torch.Tensor]:
        """``merge_attn_states`` of the two cascade parts."""
        return merge_attn_states(prefix_out, prefix_lse, suffix_out, suffix_lse)

    def _cascade(self, case, inputs, tok, cache, meta, calls, kernel) -> tuple[torch.Tensor, torch.Tensor]:
        """``cascade_attention``: the shared prefix for all tokens at once, each request's suffix, merged by LSE."""
        k_view, _ = self._kernel_view(cache)
        block_size = k_view.shape[-2] if case.kv_layout == "HND" else k_view.shape[-3]
        if meta.common_prefix_len % block_size:
            raise ValueError(f"common_prefix_len {meta.common_prefix_len} is not a multiple of block_size {block_size}")
        blocks = meta.common_prefix_len // block_size
        label_p, label_s = "cascade prefix (all tokens, unmasked)", "cascade suffix (causal)"
        sinks = inputs.sinks if self.cascade_sinks_on_prefix else None
        prefix = kernel(self.paged(label_p, calls[label_p], inputs, tok, cache, meta.block_table[:1], sinks=sinks))
        suffix = kernel(self.paged(label_s, calls[label_s], inputs, tok, cache, meta.block_table[:, blocks:]))
        if prefix.lse is None or suffix.lse is None:
            raise ValueError("cascade attention needs both parts' LSE; this backend returned none")
        return self._merge(prefix.out, prefix.lse, suffix.out, suffix.lse)

    def _restore(self, step: Step, out: torch.Tensor, lse: torch.Tensor | None) -> KernelOutput:
        """The layer output back in the caller's token order (the replay's inverse of the runner's reorder)."""
        idx = torch.tensor(step.token_index, dtype=torch.long, device=out.device)
        restored = torch.empty_like(out)
        restored[idx] = out
        if lse is None:
            return KernelOutput(restored, None)
        lse_r = torch.empty_like(lse)
        lse_r[:, idx] = lse
        return KernelOutput(restored, lse_r)
