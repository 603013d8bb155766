"""Seed ``002``: vLLM V0's FlashAttention backend (``vllm/attention/backends/flash_attn.py``) replayed.

The replay checks that the layer V0's ``FlashAttentionImpl.forward`` composes from its kernel calls is the
attention the model means, for every path of that forward (prefill, prefix-cached and chunked prefill, speculative
and single-token decode, encoder, encoder-only, cross attention; ALiBi; fp8): the metadata is built as
``FlashAttentionMetadataBuilder`` builds it (:mod:`conformance.engines.vllm_v0.metadata`; bad input raises
``ValueError`` naming the field), the cache written through its slot mapping, each call described by its own case,
and the reference is the whole layer over the full KV.  What each step follows: ``docs/concepts/engines.md``
(*Seed 002: what the replay follows*).

Sliding window.  A scenario names the model's window ``w`` (a token sees ``w`` keys, itself included).  The
layer case states what the model means, in the harness's spelling: ``(w - 1, 0)`` causal for a decoder,
``(w - 1, w - 1)`` for an encoder-only model (a symmetric window).  The engine passes FA2's ``window_size`` from
``w`` as vLLM does, ``sliding_window - 1`` (:meth:`VllmV0FlashAttention.fa_window`); the call case carries it
converted with :func:`attnref.window_from_fa2`.  The seed's ``__init__`` spells ``(w - 1, 0)`` for *every*
attention type; the symmetric encoder-only spelling is vLLM V1's (``../shared/SEMANTICS.md`` section 2), so the
seed taken literally is the planted bug "encoder window spelled as decoder".

CUDA-graph decode (``graph_block_tables``, padded ``seq_lens`` and ``PAD_SLOT_ID`` slots, ``use_cuda_graph``): the
graph scenarios, :mod:`conformance.engines.vllm_v0.graph` (captured at a bucket, replayed for every batch size up to
it).  Not modelled: block-manager v1's sliding-window block reuse (``curr_sliding_window_blocks``), multi-step
``advance_step``, multi-modal placeholder maps, soft-cap scenarios (the field is passed through), FA2's ``out=``
buffer semantics.

Where it lives: this module is the engine, :class:`VllmV0FlashAttention` (cases and checks, the calls, the cache,
the forward); :mod:`conformance.engines.vllm_v0.metadata` the builder, :mod:`conformance.engines.vllm_v0.scenarios`
the :data:`SCENARIOS` table and layer configurations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from attnfast.base import KernelOutput
from attnref import dequantize, expand_descale, quantize, window_from_fa2, write_kv_cache, write_kv_cache_fp8
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.cases.paged_kv import STALE, PagedKV, allocate_cache, blocks_needed
from conformance.cases.quant_inputs import QuantTensors

from ..base import Call, Engine, Kernel
from ..calls import call_case, contiguous_call, paged_call
from ..v0_graph_common import V0GraphEngine
from .graph import GRAPH_SCENARIOS, V0GraphRun, captured_call, check_graph_case, graph_case
from .metadata import Seq, V0Metadata, build_metadata
from .scenarios import (
    CONFIGS,
    DECODER,
    ENCODER,
    ENCODER_DECODER,
    ENCODER_ONLY,
    INVARIANCE_SCENARIOS,
    NEIGHBOUR_CONFIGS,
    SCENARIOS,
    Scenario,
    invariance_batch,
)

__all__ = ["SCENARIOS", "Scenario", "VllmV0FlashAttention"]

#: ``FlashAttentionBackend.get_supported_head_sizes``.
HEAD_SIZES = (32, 64, 96, 128, 160, 192, 224, 256)
FP8 = "fp8_e4m3"


@dataclass(frozen=True)
class _Spec:
    """One kernel call: its case, which keys it reads, and where its rows sit in the step."""

    label: str
    case: AttentionCase
    paged: bool
    seqs: slice  # metadata rows (contiguous calls: whose keys it reads)
    tokens: slice  # query rows of the step
    tables: torch.Tensor | None = None


class VllmV0FlashAttention(V0GraphEngine, Engine):
    """Seed 002 replayed: V0's metadata builder, cache writes and ``FlashAttentionImpl.forward`` calls."""

    name = "vllm_v0_fa"
    seed = "002"
    description = "vLLM V0 FlashAttention: prefill/prefix/spec/decode paths, encoder, cross, ALiBi, fp8, windows"

    def cases(self) -> list[AttentionCase]:
        """Every scenario at each layer of :data:`CONFIGS`, then the graph scenarios, then the ``neighbour``
        invariance scenarios at each layer of :data:`NEIGHBOUR_CONFIGS`."""
        inv = {name: kind for name, (kind, _) in INVARIANCE_SCENARIOS.items()}
        tables = list(SCENARIOS.items()) + [
            (name, scn) for name, (kind, scn) in INVARIANCE_SCENARIOS.items() if kind != "neighbour"
        ]
        neighbour = [(name, scn) for name, (kind, scn) in INVARIANCE_SCENARIOS.items() if kind == "neighbour"]
        out = [self._case(name, scn, cfg, inv.get(name, "")) for name, scn in tables for cfg in CONFIGS]
        out += [graph_case(self.name, name, sc) for name, sc in GRAPH_SCENARIOS.items()]
        return out + [self._case(name, scn, cfg, "neighbour") for name, scn in neighbour for cfg in NEIGHBOUR_CONFIGS]

    def _case(self, scenario: str, scn: Scenario, config: tuple, invariance: str) -> AttentionCase:
        """A scenario's case at one layer configuration ``((h, hk), d, dtype, block_size)``."""
        (h, hk), d, dtype, bs = config
        return AttentionCase(
            requests=scn.requests(),
            num_heads=h,
            num_kv_heads=hk,
            head_dim=d,
            dtype="bf16" if scn.fp8 else dtype,
            kv_layout="NHD" if scn.uses_cache else "contiguous",
            block_size=bs if scn.uses_cache else None,
            causal=scn.attn_type == DECODER,
            window=scn.window(),
            alibi=scn.alibi,
            quant=FP8 if scn.fp8 else "none",
            descale="tensor" if scn.fp8 else None,
            engine=self.name,
            scenario=scenario,
            invariance=invariance,
        )

    def check(self, case: AttentionCase) -> None:
        if case.scenario in GRAPH_SCENARIOS:
            return check_graph_case(case, GRAPH_SCENARIOS[case.scenario])
        if case.scenario in INVARIANCE_SCENARIOS:  # the batch is the case's: one variant of the invariance
            if any(not 1 <= q <= kv for q, kv in case.requests):
                raise ValueError(f"requests: every request has 1 <= q_len <= kv_len, got {list(case.requests)}")
            scn = invariance_batch(INVARIANCE_SCENARIOS[case.scenario][1], case.requests)
        elif case.scenario not in SCENARIOS:
            raise ValueError(
                f"scenario must be one of {sorted(SCENARIOS)} for engine {self.name}, got {case.scenario!r}"
            )
        else:
            scn = SCENARIOS[case.scenario]
        want = {
            "requests": scn.requests(),
            "causal": scn.attn_type == DECODER,
            "window": scn.window(),
            "alibi": scn.alibi,
            "quant": FP8 if scn.fp8 else "none",
            "descale_mode": "tensor" if scn.fp8 else None,
            "quant_q": True,
            "paged": scn.uses_cache,
        }
        for field, value in want.items():
            if getattr(case, field) != value:
                raise ValueError(
                    f"{field} must be {value!r} for scenario {case.scenario!r}, got {getattr(case, field)!r}"
                )
        if scn.uses_cache and (case.kv_layout != "NHD" or (case.block_size or 0) % 16):
            raise ValueError(
                f"V0's cache is NHD with a block size multiple of 16, got {case.kv_layout} {case.block_size}"
            )
        if case.head_dim not in HEAD_SIZES or case.head_dim_v is not None:
            raise ValueError(
                f"head_dim must be one of {HEAD_SIZES} with head_dim_v None, got {case.head_dim}/{case.dv}"
            )
        if case.sinks or case.chunk or case.qv or case.append or case.v_padded or case.num_splits:
            raise ValueError(f"engine {self.name} has no sinks, chunk, qv, append, v_padded or num_splits")

    def _scenario(self, case: AttentionCase) -> Scenario:
        self.check(case)
        if case.scenario in INVARIANCE_SCENARIOS:
            return invariance_batch(INVARIANCE_SCENARIOS[case.scenario][1], case.requests)
        return SCENARIOS[case.scenario]

    # ------------------------------------------------------------------ the engine's decisions (bugs go here)
    def schedule(self, scn: Scenario) -> list[int]:
        """V0's scheduler order of the case's sequences: prefills first, then decodes (stable)."""
        return sorted(range(len(scn.seqs)), key=lambda i: not scn.seqs[i].prompt)

    def fa_window(self, scn: Scenario) -> tuple[int, int]:
        """FA2's ``window_size`` from the model's ``sliding_window`` w: ``(w - 1, 0)``, ``(w - 1, w - 1)`` for an
        encoder-only layer, ``(-1, -1)`` without a window."""
        w = scn.sliding_window
        if w is None:
            return (-1, -1)
        return (w - 1, w - 1) if scn.attn_type == ENCODER_ONLY else (w - 1, 0)

    def build_metadata(
        self,
        scn: Scenario,
        seqs: list[Seq],
        tables: list[list[int]] | None,
        cross: list[list[int]] | None,
        bs: int,
        dev,
    ) -> V0Metadata:
        """The step's metadata (:func:`~conformance.engines.vllm_v0.metadata.build_metadata`)."""
        return build_metadata(
            seqs,
            tables,
            block_size=bs,
            chunked_prefill=scn.chunked_prefill,
            sliding_window=scn.sliding_window,
            cross_block_tables=cross,
            device=dev,
        )

    def seq_len_block_table_args(self, meta: V0Metadata, attn_type: str) -> tuple[list[int], torch.Tensor]:
        """V0's ``get_seq_len_block_table_args(decode_meta, False, attn_type)``: the keys of a kvcache decode."""
        if attn_type == ENCODER_DECODER:
            assert meta.encoder_seq_lens is not None and meta.cross_block_tables is not None
            return list(meta.encoder_seq_lens), meta.cross_block_tables
        part = meta.decode_part()
        assert part is not None
        return part.seq_lens, part.block_tables

    def descale(self, scale: torch.Tensor, num_seqs: int, num_kv_heads: int) -> torch.Tensor:
        """``layer._x_scale.expand((num_seqs, num_kv_heads))``: what FA3 reads per (sequence, kv head)."""
        return expand_descale(scale, num_seqs, num_kv_heads)

    # ------------------------------------------------------------------ calls
    def _calls(self, case: AttentionCase, scn: Scenario, meta: V0Metadata) -> list[_Spec]:
        win = window_from_fa2(*self.fa_window(scn))
        opts: dict = {"window": (win.left, win.right)}
        if case.quant != "none":
            opts["descale"] = "head"
        contiguous = {"kv_layout": "contiguous", "block_size": None, **opts}
        paged = {"kv_layout": "NHD", "block_size": meta.block_size, **opts}
        t, decoder = scn.attn_type, scn.attn_type == DECODER
        if t == ENCODER:  # queries and keys are the encoder tokens (encoder_seq_start_loc for both)
            enc = meta.encoder_seq_lens or []
            c = call_case(case, [(e, e) for e in enc], causal=False, **contiguous)
            label = "encoder: flash_attn_varlen_func (encoder q/k/v)"
            return [_Spec(label, c, False, slice(0, len(enc)), slice(0, sum(enc)))]
        specs = []
        pre, dec = meta.prefill_part(), meta.decode_part()
        if pre is not None and pre.block_tables.numel() == 0:  # "normal attention": the prompt's own k/v
            if pre.query_lens != pre.seq_lens:
                raise ValueError(f"seq_lens {pre.seq_lens}: a prefill without block tables has no context")
            if t == ENCODER_DECODER:
                assert meta.encoder_seq_lens is not None
                reqs = list(zip(pre.seq_lens, meta.encoder_seq_lens[pre.seqs]))
            else:
                reqs = [(n, n) for n in pre.seq_lens]
            c = call_case(case, reqs, causal=decoder, **contiguous)
            what = "encoder k/v" if t == ENCODER_DECODER else "contiguous k/v"
            specs.append(_Spec(f"prefill: flash_attn_varlen_func ({what})", c, False, pre.seqs, pre.tokens))
        elif pre is not None:
            if not decoder:
                raise ValueError(f"block_tables: only decoder-only models support prefix caching, got {t}")
            c = call_case(case, list(zip(pre.query_lens, pre.seq_lens)), causal=True, **paged)
            label = "prefill: flash_attn_varlen_func (paged, seqused_k)"
            specs.append(_Spec(label, c, True, pre.seqs, pre.tokens, pre.block_tables))
        if dec is not None and meta.max_decode_query_len > 1:
            if not decoder:
                raise ValueError(f"max_decode_query_len: only decoder-only models decode more than one token, got {t}")
            c = call_case(case, list(zip(dec.query_lens, dec.seq_lens)), causal=True, **paged)
            label = "decode: flash_attn_varlen_func (paged, max_decode_query_len > 1)"
            specs.append(_Spec(label, c, True, dec.seqs, dec.tokens, dec.block_tables))
        elif dec is not None:
            lens, tables = self.seq_len_block_table_args(meta, t)
            c = call_case(case, [(1, n) for n in lens], causal=True, **paged)
            label = "decode: flash_attn_with_kvcache" + (" (cross cache)" if t == ENCODER_DECODER else "")
            specs.append(_Spec(label, c, True, dec.seqs, dec.tokens, tables))
        return specs

    def _tables(self, scn: Scenario, seqs: list[Seq], bs: int) -> tuple[list[list[int]] | None, list[list[int]] | None]:
        """Block ids 0, 1, 2, ... in order (for :meth:`plan`: the calls depend on lengths only)."""
        if not scn.uses_cache:
            return None, None
        nxt = iter(range(1 << 30))
        own = [[next(nxt) for _ in range(blocks_needed(s.request.kv, bs))] for s in seqs]
        if not any(s.request.encoder for s in seqs):
            return own, None
        return own, [[next(nxt) for _ in range(blocks_needed(s.request.encoder, bs))] for s in seqs]

    def plan(self, case: AttentionCase) -> list[tuple[str, AttentionCase]]:
        if case.scenario in GRAPH_SCENARIOS:
            self.check(case)
            return [("decode: flash_attn_with_kvcache (captured, use_cuda_graph)", captured_call(case))]
        scn = self._scenario(case)
        seqs = [scn.seqs[i] for i in self.schedule(scn)]
        bs = case.block_size or 16
        meta = self.build_metadata(scn, seqs, *self._tables(scn, seqs, bs), bs, "cpu")
        return [(s.label, s.case) for s in self._calls(case, scn, meta)]

    # ------------------------------------------------------------------ CUDA graphs (graph.py)
    #: the graph scenarios' run (planted bugs replace it).
    graph_run: ClassVar[type[V0GraphRun]] = V0GraphRun

    graph_scenarios = GRAPH_SCENARIOS
    graph_call = staticmethod(captured_call)

    def graph_prepare(self, case, inputs, backend, device):
        return self.graph_run(case, inputs, backend, device, captured_call(case))

    # ------------------------------------------------------------------ forward
    def forward(self, case: AttentionCase, inputs: CaseInputs, kernel: Kernel) -> KernelOutput:
        if case.scenario in GRAPH_SCENARIOS:
            raise ValueError(f"scenario {case.scenario!r} is a CUDA-graph replay: it runs through prepare()")
        scn = self._scenario(case)
        order = self.schedule(scn)
        seqs = [scn.seqs[i] for i in order]
        dev, bs = inputs.device, case.block_size or 16
        cu_q, cu_k = inputs.cu_seqlens_q.tolist(), inputs.cu_seqlens_k.tolist()
        perm = torch.cat([torch.arange(cu_q[i], cu_q[i + 1]) for i in order]).to(dev)
        q = inputs.q[perm]
        # The layer's key/value input: the new tokens' (decoder), else every key of the request.
        skip = [s.request.cached if scn.attn_type == DECODER else 0 for s in seqs]
        key_in = [inputs.k[cu_k[i] + c : cu_k[i + 1]] for i, c in zip(order, skip)]
        val_in = [inputs.v[cu_k[i] + c : cu_k[i + 1]] for i, c in zip(order, skip)]
        quant = inputs.quant  # the layer's per-tensor q/k/v scales (layer._q_scale, _k_scale, _v_scale)
        scales = None if quant is None else (quant.q_descale, quant.k_descale, quant.v_descale)
        pool, tables, cross = self._allocate(case, scn, inputs, order, skip) if scn.uses_cache else (None, None, None)
        meta = self.build_metadata(scn, seqs, tables, cross, bs, dev)

        def write(keys: list[torch.Tensor], values: list[torch.Tensor], slots: torch.Tensor) -> None:
            assert pool is not None
            k, v = torch.cat(keys), torch.cat(values)
            if scales is None:
                write_kv_cache(k, v, pool.k_cache, pool.v_cache, slots)
            else:
                assert scales[2] is not None  # fp8 (V0's only quantization) quantizes V
                write_kv_cache_fp8(k, v, pool.k_cache, pool.v_cache, slots, k_scale=scales[1], v_scale=scales[2])

        if scn.attn_type == DECODER:  # reshape_and_cache_flash(key, value, ..., slot_mapping)
            write(key_in, val_in, meta.slot_mapping)
        elif scn.attn_type == ENCODER_DECODER:  # the prompt step's write of the cross cache
            assert meta.cross_slot_mapping is not None
            write(key_in, val_in, meta.cross_slot_mapping)

        out = torch.zeros(case.total_q, case.num_heads, case.dv, dtype=case.torch_dtype, device=dev)
        slopes = inputs.alibi_slopes if case.alibi else None
        for spec in self._calls(case, scn, meta):
            qs = q[spec.tokens]
            if spec.paged:
                assert pool is not None and spec.tables is not None
                call = paged_call(spec.label, spec.case, qs, pool, spec.tables, alibi_slopes=slopes)
            else:
                ks, vs = torch.cat(key_in[spec.seqs]), torch.cat(val_in[spec.seqs])
                call = contiguous_call(spec.label, spec.case, qs, ks, vs, alibi_slopes=slopes)
            if scales is not None:
                self._quantized(call, scales)
            out[spec.tokens] = kernel(call).out.to(out.dtype)
        result = torch.empty_like(out)
        result[perm] = out
        return KernelOutput(result, None)  # V0's forward returns no LSE

    def _allocate(
        self, case: AttentionCase, scn: Scenario, inputs: CaseInputs, order: list[int], ctx: list[int]
    ) -> tuple[PagedKV, list[list[int]], list[list[int]] | None]:
        """The layer's paged cache before the step: the block manager's shuffled blocks, each sequence's first
        ``ctx`` keys (earlier steps' writes, quantized as an fp8 cache write does), stale slots elsewhere.
        An encoder-decoder layer's cache also holds the cross blocks (rows first).  Returns the cache and the
        block lists of the self and cross tables."""
        dev, hk, bs = inputs.device, case.num_kv_heads, case.block_size or 16
        quant = inputs.quant
        dt = case.torch_dtype if quant is None else torch.float8_e4m3fn
        cu_k = inputs.cu_seqlens_k.tolist()
        enc = [scn.seqs[i].request.encoder for i in order] if scn.attn_type != DECODER else []
        lens = enc + [scn.seqs[i].request.kv for i in order]
        ks, vs = [], []
        for j, n in enumerate(lens):
            c, i = (0, 0) if j < len(enc) else (ctx[j - len(enc)], order[j - len(enc)])
            k0, v0 = inputs.k[cu_k[i] : cu_k[i] + c], inputs.v[cu_k[i] : cu_k[i] + c]
            if quant is not None:
                assert quant.v_descale is not None  # fp8 (V0's only quantization) quantizes V
                k0, v0 = quantize(k0, quant.k_descale, FP8), quantize(v0, quant.v_descale, FP8)
            ks.append(torch.cat([k0.to(dt), torch.full((n - c, hk, case.head_dim), STALE).to(dev, dt)]))
            vs.append(torch.cat([v0.to(dt), torch.full((n - c, hk, case.dv), STALE).to(dev, dt)]))
        gen = torch.Generator().manual_seed(int(case.digest(), 16))
        pool = allocate_cache(lens, ks, vs, block_size=bs, generator=gen)
        rows = [pool.block_table[j, : blocks_needed(n, bs)].tolist() for j, n in enumerate(lens)]
        return pool, rows[len(enc) :], (rows[: len(enc)] or None)

    def _quantized(self, call: Call, scales: tuple) -> None:
        """Give an fp8 call its stored q/k/v and descales expanded to (num_seqs, hk), as the seed does."""
        qs, ks, vs = scales
        inp, n, hk = call.inputs, call.case.batch, call.case.num_kv_heads
        q8 = quantize(inp.q, qs, FP8)
        k8 = inp.k if inp.k.dtype == torch.float8_e4m3fn else quantize(inp.k, ks, FP8)  # paged: read from the cache
        v8 = inp.v if inp.v.dtype == torch.float8_e4m3fn else quantize(inp.v, vs, FP8)
        inp.quant = QuantTensors(
            FP8,
            k=k8,
            k_descale=self.descale(ks, n, hk),
            q=q8,
            q_descale=self.descale(qs, n, hk),
            v=v8,
            v_descale=self.descale(vs, n, hk),
        )
        inp.q, inp.k, inp.v = dequantize(q8, qs), dequantize(k8, ks), dequantize(v8, vs)
