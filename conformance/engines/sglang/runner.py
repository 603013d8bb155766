"""Seed ``003``'s forward side: ``forward_extend`` / ``forward_decode`` of SGLang's FlashAttention backend, as
:class:`SGLangForwardRunner`, the base of :class:`~conformance.engines.sglang.fa.SGLangFlashAttention`.

* **The calls** (:meth:`SGLangForwardRunner._plan_calls`): which metadata each ``flash_attn_with_kvcache`` call
  reads (the page table, the encoder table, the virtual batches, the top-k verify's prefix and expand halves or its
  sliding-window form) with its mask and window; MLA's chunked prefix as ``flash_attn_varlen_func`` calls over
  contiguous keys; fp8 calls' ``(batch_size, hk)`` descale shape checked against the call's sequences;
* **The pool write** (:meth:`~SGLangForwardRunner._pool`): ``set_kv_buffer`` / ``set_mla_kv_buffer`` through
  ``req_to_token`` into ``(num_pages, page_size, hk, d)`` buffers, unused slots stale;
* **The kernel calls** (:meth:`~SGLangForwardRunner._run`): each paged call's metadata checked, MLA's 576-wide cache
  split into its ``k_rope`` / ``c_kv`` views, fp8 descales expanded, then the call on the adapter under test;
* **The composition** (:meth:`~SGLangForwardRunner.forward`): one call, the top-k verify cascade merged with
  ``merge_state_v2``, or MLA's prefix chunks merged into the running result.

The layer's hooks (:meth:`~SGLangForwardRunner.window_size`, :meth:`~SGLangForwardRunner.split_mla_cache`,
:meth:`~SGLangForwardRunner.descales`, :meth:`~SGLangForwardRunner.merge_state`) are what planted bugs override.
"""

from __future__ import annotations

import torch

from attnfast.base import KernelOutput
from attnref import expand_descale, gather_kv, write_kv_cache
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs, QuantTensors

from ..base import Call, Kernel, call_inputs
from ..calls import STALE, call_case, contiguous_call, prefix_sums
from ..merge import merge_attn_states
from .local import check_call_metadata
from .metadata import (
    ENCODER_FIELDS,
    LOCAL_FIELDS,
    MAIN_FIELDS,
    KCall,
    SGLangMetadataBuilder,
    SGLMetadata,
    Step,
    prefixed_fields,
)

__all__ = ["SGLangForwardRunner"]


class SGLangForwardRunner(SGLangMetadataBuilder):
    """``forward_extend`` / ``forward_decode`` of seed 003 (see the module docstring); the engine subclasses it."""

    # ------------------------------------------------------------------ the layer's hooks (planted bugs override)
    def window_size(self, sliding_window_size: int | None) -> tuple[int, int]:
        """``(layer.sliding_window_size, 0)``: the model already subtracted one; ``(-1, -1)`` without a window."""
        return (sliding_window_size, 0) if sliding_window_size is not None and sliding_window_size > -1 else (-1, -1)

    def split_mla_cache(self, kv_cache: torch.Tensor, v_head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_rope, c_kv)`` views of the 576-wide ``[c_kv | k_rope]`` cache."""
        return kv_cache[..., v_head_dim:], kv_cache[..., :v_head_dim]

    def descales(self, scale: torch.Tensor, batch_size: int, num_kv_heads: int) -> torch.Tensor:
        """``layer.k_scale.expand((batch_size, tp_k_head_num))``."""
        return scale.reshape(1, 1).expand(batch_size, num_kv_heads)

    def merge_state(self, o_a, s_a, o_b, s_b) -> tuple[torch.Tensor, torch.Tensor]:
        """``merge_state_v2`` (LSE ``(n, h)``): vLLM's ``merge_attn_states`` with the LSE transposed."""
        out, lse = merge_attn_states(o_a, s_a.transpose(0, 1), o_b, s_b.transpose(0, 1))
        return out, lse.transpose(0, 1)

    # ------------------------------------------------------------------ forward_extend / forward_decode: the calls
    def _paged(self, case: AttentionCase, label: str, m: SGLMetadata, causal: bool, window, names) -> KCall:
        """One ``flash_attn_with_kvcache`` call reading ``m``'s table, lengths and offsets (``m.cu_seqlens_k`` is
        what the call passes as ``cu_seqlens_k_new``, None where it passes none).  MLA's absorbed calls pass no
        window (the seed's MLA path)."""
        cu_q, lens = m.cu_seqlens_q, m.cache_seqlens_int32
        reqs = [(b - a, n) for a, b, n in zip(cu_q, cu_q[1:], lens)]
        window = (None, None) if self.scenario(case).mla else window
        fp8 = dict(descale="head") if case.quant_family == "fp8" else {}  # FA3's (batch, hk) descales
        call = call_case(case, reqs, causal=causal, window=window, chunk=None, **fp8)
        return KCall(label, call, names, m.page_table, lens, cu_q, m.cu_seqlens_k)

    def _plan_calls(self, case: AttentionCase, st: Step) -> None:
        """The calls ``forward_extend`` / ``forward_decode`` make for this step, in order, and how they combine."""
        sc, md = st.scenario, st.metadata
        assert md is not None
        left, right = self.window_size(sc.window)  # FA3's spelling: -1 = unbounded
        win = (None if left < 0 else left, None if right < 0 else right)
        vb = md.local_attn_metadata
        if sc.cross:  # layer.is_cross_attention: the encoder's table and lengths, no causal mask, no window
            if md.encoder_page_table is None:  # as check_call_metadata refuses it
                raise ValueError("encoder_page_table: the call needs a page table, got None")
            m = SGLMetadata(
                md.encoder_lens_int32 or [], md.cu_seqlens_q, md.encoder_cu_seqlens_k or [], md.encoder_page_table
            )
            label = "cross attention (encoder page table)"
            st.calls = [self._paged(case, label, m, False, (None, None), ENCODER_FIELDS)]
        elif sc.chunk is not None and vb is not None:  # use_local_attn (decode passes no window)
            m = SGLMetadata(vb.seqlens_k_local, vb.cu_seqlens_q_local, None, vb.block_table_local)
            w = win if sc.mode != "decode" else (None, None)
            st.calls = [self._paged(case, "local attention (virtual batches)", m, True, w, LOCAL_FIELDS)]
        elif md.swa_spec_metadata is not None:  # sliding window with top-k > 1: no cascade
            label, names = "verify (sliding window, draft tokens expanded)", prefixed_fields("swa_spec_metadata.")
            st.calls = [self._paged(case, label, md.swa_spec_metadata, True, win, names)]
        elif sc.mode == "target_verify" and sc.tree:  # use_cascade_attn
            assert md.expand is not None
            st.calls = [
                self._paged(case, "verify prefix (committed cache, non-causal)", md, False, win, MAIN_FIELDS),
                self._paged(
                    case, "verify draft tree (expand, non-causal)", md.expand, False, win, prefixed_fields("expand.")
                ),
            ]
            st.combine = "cascade"
        elif sc.mode == "mla_prefix":
            lens = [r.new for r in sc.requests]
            kc = KCall("extend (new tokens, causal)", call_case(case, [(n, n) for n in lens], causal=True))
            kc.spans = [(r.cached, r.kv) for r in sc.requests]
            st.calls = [kc]
            size = sc.chunk_capacity // len(lens)
            for i in range(-(-max(r.cached for r in sc.requests) // size)):
                spans = [(min(i * size, r.cached), min((i + 1) * size, r.cached)) for r in sc.requests]
                reqs = [(n, e - s) for n, (s, e) in zip(lens, spans)]
                kc = KCall(f"prefix chunk {i} (non-causal)", call_case(case, reqs, causal=False))
                kc.spans = spans
                st.calls.append(kc)
            st.combine = "chunked_prefix"
        else:
            st.calls = [self._paged(case, f"{sc.mode} (page table)", md, True, win, MAIN_FIELDS)]
        if sc.fp8:
            for kc in st.calls:
                if kc.case.batch != len(sc.requests):
                    raise ValueError(
                        f"k_descale: expanded to (batch_size={len(sc.requests)}, hk) but call {kc.label!r} has "
                        f"{kc.case.batch} sequences (FA3: CHECK_SHAPE(k_descale, batch_size, num_heads_k))"
                    )

    def plan(self, case: AttentionCase) -> list[tuple[str, AttentionCase]]:
        return [(kc.label, kc.case) for kc in self._step(case).calls]

    # ------------------------------------------------------------------ forward
    def _pool(self, case: AttentionCase, inputs: CaseInputs, st: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K/V buffers with every key written through ``req_to_token`` (set_kv_buffer); MLA: one
        ``[c_kv | k_rope]`` buffer (set_mla_kv_buffer), returned twice; fp8: the stored fp8 values."""
        sc, page, dev = st.scenario, st.page_size, inputs.device
        quant = inputs.quant
        k_all = inputs.k if quant is None else quant.k
        v_all = inputs.v if quant is None else quant.v
        assert v_all is not None
        if sc.mla:
            k_all = v_all = torch.cat([v_all, k_all], dim=-1)
        hk, dt = k_all.shape[1], k_all.dtype
        kbuf = torch.full((st.num_pages, page, hk, k_all.shape[2]), STALE).to(dev, dt)
        vbuf = kbuf if sc.mla else torch.full((st.num_pages, page, hk, v_all.shape[2]), STALE).to(dev, dt)
        cu_k = [int(x) for x in inputs.cu_seqlens_k.tolist()]
        slots = torch.cat([st.req_to_token[b, :kl].long() for b, kl in enumerate(case.kv_lens)]).to(dev)
        written = torch.cat([torch.arange(cu_k[b], cu_k[b + 1]) for b in range(case.batch)]).to(dev)
        write_kv_cache(k_all[written], v_all[written], kbuf, vbuf, slots)
        return kbuf, vbuf

    def _run(self, kc: KCall, case: AttentionCase, inputs: CaseInputs, st: Step, pool, kernel: Kernel):
        sc = st.scenario
        if kc.spans is not None:  # MLA chunked prefix: flash_attn_varlen_func over contiguous k/v
            cu = [int(x) for x in inputs.cu_seqlens_k.tolist()]
            k = torch.cat([inputs.k[cu[b] + s : cu[b] + e] for b, (s, e) in enumerate(kc.spans)])
            v = torch.cat([inputs.v[cu[b] + s : cu[b] + e] for b, (s, e) in enumerate(kc.spans)])
            return kernel(contiguous_call(kc.label, kc.case, inputs.q, k, v, sinks=inputs.sinks))
        check_call_metadata(
            kc.names,
            kc.table,
            kc.lens,
            kc.cu_q,
            kc.cu_k,
            page_size=st.page_size,
            num_pages=st.num_pages,
            total_q=case.total_q,
        )
        assert kc.table is not None and kc.lens is not None  # check_call_metadata refused None
        dev = inputs.device
        table = kc.table.to(dev)
        k_cache, v_cache = pool
        mla_cache = None
        if sc.mla:
            k_cache, v_cache = self.split_mla_cache(k_cache, case.dv)
            mla_cache = torch.cat([v_cache, k_cache], dim=-1)  # the joint cache as the engine's views describe it
        k, _ = gather_kv(k_cache, table, kc.lens)
        v, _ = gather_kv(v_cache, table, kc.lens)
        quant = None
        if inputs.quant is not None:
            q8, hk, n = inputs.quant, case.num_kv_heads, len(sc.requests)
            assert q8.v_descale is not None and q8.q_descale is not None
            kd, vd = self.descales(q8.k_descale, n, hk), self.descales(q8.v_descale, n, hk)
            quant = QuantTensors(
                q8.fmt, k=k, k_descale=kd, q=q8.q, q_descale=expand_descale(q8.q_descale, n, hk), v=v, v_descale=vd
            )
            rows = torch.repeat_interleave(torch.arange(n, device=dev), torch.tensor(kc.lens, device=dev))
            k, v = k.float() * kd[rows][..., None], v.float() * vd[rows][..., None]  # dequantized, for fakes
        cal = call_inputs(
            kc.case,
            q=inputs.q,
            k=k,
            v=v,
            cu_seqlens_q=torch.tensor(kc.cu_q, dtype=torch.int32, device=dev),
            cu_seqlens_k=torch.tensor(prefix_sums(kc.lens), dtype=torch.int32, device=dev),
            k_cache=k_cache,
            v_cache=v_cache,
            block_table=table,
            sinks=inputs.sinks,
            qv=inputs.qv,
            quant=quant,
            mla_cache=mla_cache,
        )
        return kernel(Call(kc.label, kc.case, cal))

    def forward(self, case: AttentionCase, inputs: CaseInputs, kernel: Kernel) -> KernelOutput:
        st = self._step(case)
        pool = self._pool(case, inputs, st) if case.paged else None
        results = [self._run(kc, case, inputs, st, pool, kernel) for kc in st.calls]
        if st.combine == "single":
            return results[0]
        if any(r.lse is None for r in results):
            raise ValueError(f"{st.combine}: the merge needs every call's LSE; this backend returned none")
        if st.combine == "cascade":
            a, b = results
            out, lse = self.merge_state(a.out, a.lse.transpose(0, 1), b.out, b.lse.transpose(0, 1))
        else:  # chunked prefix: each chunk merged into the running result (new tokens first)
            out, lse = results[0].out, results[0].lse.transpose(0, 1)
            for r in results[1:]:
                out, lse = self.merge_state(r.out, r.lse.transpose(0, 1), out, lse)
        return KernelOutput(out, lse.transpose(0, 1))
