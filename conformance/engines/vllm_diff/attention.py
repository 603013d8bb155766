"""Seed ``000``: vLLM V0's differential attention backend (``DifferentialFlashAttentionImpl``, arXiv 2410.05258).

The replay follows the seed's impl step by step (heads split into two groups, one ``(2, 2, num_blocks, block_size,
Hk/2, D)`` cache written before any call, four ``forward_generate_kv_cache`` calls, ``lambda_full``, ``subln``,
``(1 - lambda_init)``); each step is spelled out in ``docs/concepts/engines.md`` (*Seed 000: what the replay
follows*).  Both head counts are even and ``head_dim_v`` unset.

Output: ``(total_q, H, D)`` in the case dtype: head ``2i`` is ``attn[:, i, :D]``, head ``2i + 1`` is
``attn[:, i, D:]`` (the seed's ``view(-1, H * D)`` split back into heads); no LSE (the forward returns None, so
only the output is judged).  The layer's parameters (:func:`layer_params`: lambda vectors ``N(0, 0.1)`` of
size D in fp32, ``lambda_init = 0.8 - 0.6 exp(-0.3 depth)``, subln weight in the activation dtype) come from a
generator seeded from the case (run seed 0 in the formula: the protocol does not pass the run seed).

Oracle (:meth:`VllmDifferentialAttention.reference`): the two softmaxes ``softmax(q1 k1^T)`` and
``softmax(q2 k2^T)`` over every key of each request (:func:`attnref.attention_varlen`, fp32 / fp64 for fp32
inputs, the case's mask) times ``[v1 | v2]``, and the formula above in the same precision, without the four
calls or the cache.  Baseline: the same with :func:`conformance.verdict.baseline.baseline` for the two
softmaxes and the combination in the activation dtype, as the seed computes it.

Departures from the seed: the seed raises "prefix caching not supported" for a prompt with cached context
(and its builder asserts chunked prefill off); the ``prefix_cached`` scenario replays what vLLM V0's
FlashAttention backend (seed 002) does there, the same four calls with the prompts read through their block
tables (``cu_seqlens_q`` + ``seqused_k``).  The CUDA-graph decode (both graph block tables, padded slots,
``use_cuda_graph``; the KV-generating layer and the KV-sharing layer's ``forward_with_kv_cache_only``, consistent
only for decodes) is :mod:`conformance.engines.vllm_diff.graph`.  Not modelled: ALiBi (the seed passes H slopes to
calls of H/2 heads), fp8 caches, and V0's sliding-window slot padding / cyclic blocks (never read within one step).

Where it lives: this module is the engine, :class:`VllmDifferentialAttention` (the layer's parameters, the builder,
the calls, the combination, the oracle); :mod:`conformance.engines.vllm_diff.metadata` the builder's fields and
their checks, :mod:`conformance.engines.vllm_diff.scenarios` the :data:`SCENARIOS` table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

import attnref
from attnfast.base import KernelOutput
from attnref import AttnResult
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.cases.paged_kv import STALE, PagedKV, cu_seqlens, hand_out_blocks, token_slots

from ..base import Engine, Kernel
from ..calls import call_case, contiguous_call, paged_call
from ..v0_graph_common import V0GraphEngine
from .graph import DiffGraphRun, captured_call, check_graph_case, graph_case
from .metadata import DiffMetadata, diffs, validate_metadata
from .scenarios import GRAPH_SCENARIOS, INVARIANCE_SCENARIOS, NEIGHBOUR_SCENARIOS, SCENARIOS

__all__ = ["DiffParams", "VllmDifferentialAttention", "layer_params"]

SUPPORTED_HEAD_SIZES = (32, 64, 96, 128, 160, 192, 224, 256)  # FlashAttentionBackend.get_supported_head_sizes
RMS_EPS = 1e-5  # the model's subln = nn.RMSNorm(2 * head_dim, eps=1e-5)
PARAM_SEED = 0  # the run seed in the parameter generator's formula (see the module docstring)
#: the four calls: name -> (query group, key group, value group)
PAIRS = {"attn11": (0, 0, 0), "attn12": (0, 0, 1), "attn21": (1, 1, 0), "attn22": (1, 1, 1)}


@dataclass(frozen=True)
class DiffParams:
    """The layer's parameters: ``lambda_*`` (D,) fp32, ``subln_weight`` (2D,) in the activation dtype."""

    lambda_q1: torch.Tensor
    lambda_k1: torch.Tensor
    lambda_q2: torch.Tensor
    lambda_k2: torch.Tensor
    lambda_init: float
    subln_weight: torch.Tensor


def layer_params(case: AttentionCase, device: torch.device | str = "cpu") -> DiffParams:
    """Deterministic parameters of the case's layer (SambaYAttention's shapes and initialisation ranges); an
    invariance scenario's variants share its case's (one layer, several batches)."""
    if case.scenario in INVARIANCE_SCENARIOS or case.scenario in NEIGHBOUR_SCENARIOS:
        if case.scenario in INVARIANCE_SCENARIOS:
            kind, reqs = INVARIANCE_SCENARIOS[case.scenario][:2]
        else:
            kind, reqs = "neighbour", NEIGHBOUR_SCENARIOS[case.scenario][0]
        case = case.replace(requests=tuple((r.new, r.kv) for r in reqs), invariance=kind)
    gen = torch.Generator().manual_seed(PARAM_SEED * 1_000_003 + int(case.digest(), 16) + 1)
    d = case.head_dim
    lq1, lk1, lq2, lk2 = (torch.randn(d, generator=gen) * 0.1 for _ in range(4))
    depth = int(torch.randint(1, 25, (1,), generator=gen))
    weight = (1.0 + 0.1 * torch.randn(2 * d, generator=gen)).to(case.torch_dtype)
    lq1, lk1, lq2, lk2 = (x.to(device) for x in (lq1, lk1, lq2, lk2))
    return DiffParams(
        lq1, lk1, lq2, lk2, lambda_init=0.8 - 0.6 * math.exp(-0.3 * depth), subln_weight=weight.to(device)
    )


def _lambda_full(p: DiffParams, dtype: torch.dtype) -> torch.Tensor:
    """The seed's ``lambda_full``: exp of fp32 sums, ``type_as(q)``, plus ``lambda_init``."""
    lambda_1 = torch.exp(torch.sum(p.lambda_q1 * p.lambda_k1, dim=-1).float()).to(dtype)
    lambda_2 = torch.exp(torch.sum(p.lambda_q2 * p.lambda_k2, dim=-1).float()).to(dtype)
    return lambda_1 - lambda_2 + p.lambda_init


def _subln(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps=RMS_EPS)


def _merge_heads(attn: torch.Tensor) -> torch.Tensor:
    """``... H (two D) -> ... (H two) D``."""
    t, h2, d2 = attn.shape
    return attn.reshape(t, h2, 2, d2 // 2).reshape(t, 2 * h2, d2 // 2)


def _combine_lowp(case: AttentionCase, p: DiffParams, attn1: torch.Tensor, attn2: torch.Tensor) -> torch.Tensor:
    """The seed's combination in the activation dtype (the baseline's; the engine runs it as overridable steps)."""
    attn = attn1 - _lambda_full(p, attn1.dtype) * attn2
    return _merge_heads(_subln(attn, p.subln_weight) * (1 - p.lambda_init))


def _is_decode(ql: int, kl: int) -> bool:
    return ql == 1 and kl > 1


class VllmDifferentialAttention(V0GraphEngine, Engine):
    """Seed 000 replayed: stripes, four attention calls per branch, lambda, subln (see the module docstring)."""

    name = "vllm_diff"
    seed = "000"
    description = "vLLM V0 differential attention: stripe head split, 4 calls, attn1 - lambda * attn2, subln"

    def _case(
        self, name: str, reqs, heads: tuple[int, int], block: int, window, head_dim: int = 64, **fields
    ) -> AttentionCase:
        """A scenario's case: causal over the NHD cache; ``fields`` the dtype (and invariance kind)."""
        return AttentionCase(
            requests=tuple((r.new, r.kv) for r in reqs),
            num_heads=heads[0],
            num_kv_heads=heads[1],
            head_dim=head_dim,
            kv_layout="NHD",
            block_size=block,
            causal=True,
            window=window,
            engine=self.name,
            scenario=name,
            **fields,
        )

    def cases(self) -> list[AttentionCase]:
        """Each scenario in bf16 and fp16, then the invariance scenarios (bf16), the graph scenarios and the
        ``neighbour`` invariance scenarios (bf16)."""
        out = [self._case(n, *row, dtype=dt) for n, row in SCENARIOS.items() for dt in ("bf16", "fp16")]
        out += [
            self._case(n, reqs, heads, block, window, dtype="bf16", invariance=kind)
            for n, (kind, reqs, heads, block, window) in INVARIANCE_SCENARIOS.items()
        ]
        out += [graph_case(self.name, name, sc) for name, sc in GRAPH_SCENARIOS.items()]
        return out + [
            self._case(n, reqs, heads, block, (None, None), d, dtype="bf16", invariance="neighbour")
            for n, (reqs, heads, block, d) in NEIGHBOUR_SCENARIOS.items()
        ]

    def check(self, case: AttentionCase) -> None:
        if case.scenario in GRAPH_SCENARIOS:
            return check_graph_case(case, GRAPH_SCENARIOS[case.scenario])
        if case.scenario not in SCENARIOS and case.scenario not in INVARIANCE_SCENARIOS | NEIGHBOUR_SCENARIOS:
            known = sorted(SCENARIOS) + sorted(INVARIANCE_SCENARIOS) + sorted(NEIGHBOUR_SCENARIOS)
            raise ValueError(f"scenario must be one of {known} for engine {self.name}, got {case.scenario!r}")
        if case.num_heads % 2 or case.num_kv_heads % 2:
            raise ValueError(f"num_heads ({case.num_heads}) and num_kv_heads ({case.num_kv_heads}) must be even")
        if case.head_dim not in SUPPORTED_HEAD_SIZES or case.dv != case.head_dim:
            raise ValueError(f"head_dim must be one of {SUPPORTED_HEAD_SIZES} with head_dim_v unset")
        if case.kv_layout != "NHD" or case.block_size is None or case.block_size % 16:
            raise ValueError("the cache must be NHD with a block size multiple of 16 (get_kv_cache_shape)")
        if not case.causal or case.alibi or case.sinks or case.quant != "none" or case.qv or case.chunk is not None:
            raise ValueError(f"engine {self.name} replays causal decoder attention (no alibi, sinks, quant, qv, chunk)")
        if case.append or case.num_splits is not None or case.v_padded or case.scheduler_metadata:
            raise ValueError(f"engine {self.name} makes its own cache writes and calls (no append, splits, ...)")
        kinds = [_is_decode(ql, kl) for ql, kl in case.requests]
        if any(ql < 1 for ql in case.q_lens) or kinds != sorted(kinds):
            raise ValueError("requests must each have new tokens, prompts listed before decodes (V0's batch)")
        if case.has_window and any(kl > ql > 1 for ql, kl in case.requests):
            raise ValueError("V0 disables prefix caching with a sliding window: no prompt with cached context")

    # ------------------------------------------------------------------ metadata (the V0 builder)
    def metadata(self, case: AttentionCase, device: torch.device | str = "cpu") -> DiffMetadata:
        """Block manager (shuffled blocks, one spare) and ``DifferentialFlashAttentionMetadataBuilder.build``."""
        bs = case.block_size
        assert bs is not None
        gen = torch.Generator().manual_seed(int(case.digest(), 16) + 2)
        perm, blocks = hand_out_blocks(case.kv_lens, bs, gen)
        num_blocks = len(perm)
        num_prefills = sum(not _is_decode(ql, kl) for ql, kl in case.requests)
        hit = any(kl > ql for ql, kl in case.requests[:num_prefills])
        rows = [blocks[b] if hit or b >= num_prefills else [] for b in range(case.batch)]
        table = torch.zeros(case.batch, max(len(r) for r in rows), dtype=torch.int32)
        for b, r in enumerate(rows):
            table[b, : len(r)] = torch.tensor(r, dtype=torch.int32)
        slots = [s for b, (ql, kl) in enumerate(case.requests) for s in token_slots(blocks[b], range(kl - ql, kl), bs)]
        qsl = cu_seqlens(case.q_lens, device)
        return DiffMetadata(
            num_prefills=num_prefills,
            num_prefill_tokens=int(qsl[num_prefills]),
            num_decode_tokens=case.total_q - int(qsl[num_prefills]),
            query_start_loc=qsl,
            seq_start_loc=cu_seqlens(case.kv_lens, device),
            seq_lens=torch.tensor(case.kv_lens, dtype=torch.int32, device=device),
            block_tables=table.to(device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            prefix_cache_hit=hit,
            blocks=blocks,
            num_blocks=num_blocks,
        )

    def _calls(self, case: AttentionCase, meta: DiffMetadata) -> list[tuple[str, AttentionCase]]:
        """The calls of the four pairs, in the seed's order, each call's requests read from the metadata."""
        np_ = meta.num_prefills
        qls, seq = diffs(meta.query_start_loc.tolist()), [int(x) for x in meta.seq_lens.tolist()]
        half = dict(num_heads=case.num_heads // 2, num_kv_heads=case.num_kv_heads // 2)
        parts = []
        if np_:
            if meta.prefix_cache_hit:  # V0 FlashAttention's prefix path: paged, seqused_k
                parts.append(("prefill", call_case(case, list(zip(qls[:np_], seq[:np_])), **half)))
            else:  # flash_attn_varlen_func over the new keys: cu_seqlens_k = seq_start_loc
                kls = diffs(meta.seq_start_loc.tolist()[: np_ + 1])
                contiguous = dict(kv_layout="contiguous", block_size=None, **half)
                parts.append(("prefill", call_case(case, list(zip(qls[:np_], kls)), **contiguous)))
        if meta.num_decode_tokens:  # flash_attn_with_kvcache: block_tables, cache_seqlens = seq_lens
            parts.append(("decode", call_case(case, list(zip(qls[np_:], seq[np_:])), **half)))
        return [(f"{pair} {kind}", c) for pair in PAIRS for kind, c in parts]

    def plan(self, case: AttentionCase) -> list[tuple[str, AttentionCase]]:
        self.check(case)
        if case.scenario in GRAPH_SCENARIOS:
            return [(f"{pair} decode: flash_attn_with_kvcache (captured)", captured_call(case)) for pair in PAIRS]
        meta = self.metadata(case)
        assert case.block_size is not None
        validate_metadata(meta, num_tokens=case.total_q, block_size=case.block_size)
        return self._calls(case, meta)

    # ------------------------------------------------------------------ CUDA graphs (graph.py)
    #: the graph scenarios' run (planted bugs replace it).
    graph_run: ClassVar[type[DiffGraphRun]] = DiffGraphRun

    graph_scenarios = GRAPH_SCENARIOS
    graph_call = staticmethod(captured_call)

    def graph_prepare(self, case, inputs, backend, device):
        sc, params = GRAPH_SCENARIOS[case.scenario], layer_params(case, inputs.device)
        return self.graph_run(case, inputs, backend, device, engine=self, params=params, pairs=PAIRS, sc=sc)

    # ------------------------------------------------------------------ the impl's steps (overridable)
    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``... (H two) D -> ... H two D``; stripes 0 and 1."""
        x = x.reshape(*x.shape[:-2], x.shape[-2] // 2, 2, x.shape[-1])
        return x[..., 0, :].contiguous(), x[..., 1, :].contiguous()

    def read_caches(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``split_kv_cache`` twice: ``(key_cache1, value_cache1, key_cache2, value_cache2)``."""
        kv_cache1, kv_cache2 = kv_cache[0], kv_cache[1]
        return kv_cache1[0], kv_cache1[1], kv_cache2[0], kv_cache2[1]

    def combine(self, attn1: torch.Tensor, attn2: torch.Tensor, lambda_full: torch.Tensor) -> torch.Tensor:
        return attn1 - lambda_full * attn2

    def subln(self, attn: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return _subln(attn, weight)

    def scale_output(self, attn: torch.Tensor, lambda_init: float) -> torch.Tensor:
        return attn * (1 - lambda_init)

    # ------------------------------------------------------------------ forward
    def forward(self, case: AttentionCase, inputs: CaseInputs, kernel: Kernel) -> KernelOutput:
        if case.scenario in GRAPH_SCENARIOS:
            raise ValueError(f"scenario {case.scenario!r} is a CUDA-graph replay: it runs through prepare()")
        self.check(case)
        dev, dt, bs = inputs.q.device, case.torch_dtype, case.block_size
        assert bs is not None
        meta = self.metadata(case, dev)
        validate_metadata(meta, num_tokens=inputs.q.shape[0], block_size=bs)
        calls = dict(self._calls(case, meta))
        params = layer_params(case, dev)
        cu_k = [int(x) for x in inputs.cu_seqlens_k.tolist()]
        ctx = [kl - ql for ql, kl in case.requests]
        shape = (2, 2, meta.num_blocks, bs, case.num_kv_heads // 2, case.head_dim)
        kv_cache = torch.full(shape, STALE, dtype=torch.float32, device=dev).to(dt)
        # the cache as earlier steps left it: every request's cached context, written the same way
        old = [(b, t) for b, c in enumerate(ctx) for t in range(c)]
        if old:
            rows = torch.tensor([cu_k[b] + t for b, t in old], device=dev)
            slots = torch.tensor([meta.blocks[b][t // bs] * bs + t % bs for b, t in old], device=dev)
            for g, (k, v) in enumerate(zip(self.split_heads(inputs.k[rows]), self.split_heads(inputs.v[rows]))):
                attnref.write_kv_cache(k, v, kv_cache[g], None, slots)
        new = torch.cat([torch.arange(cu_k[b] + ctx[b], cu_k[b + 1]) for b in range(case.batch)]).to(dev)
        qs, ks, vs = self.split_heads(inputs.q), self.split_heads(inputs.k[new]), self.split_heads(inputs.v[new])
        for g in (0, 1):  # populate_kv_cache: (k1, v1) -> kv_cache[0], (k2, v2) -> kv_cache[1]
            attnref.write_kv_cache(ks[g], vs[g], kv_cache[g], None, meta.slot_mapping)
        key_cache1, value_cache1, key_cache2, value_cache2 = self.read_caches(kv_cache)
        key_caches, value_caches = (key_cache1, key_cache2), (value_cache1, value_cache2)
        outs = {}
        for pair, (gq, gk, gv) in PAIRS.items():
            outs[pair] = self._generate(
                pair, calls, meta, kernel, qs[gq], ks[gk], vs[gv], key_caches[gk], value_caches[gv], bs
            )
        return KernelOutput(self.layer_output(outs, params, dt), None)

    def layer_output(self, outs: dict[str, torch.Tensor], params: DiffParams, dtype: torch.dtype) -> torch.Tensor:
        """The four calls' outputs combined: ``[attn11 | attn12] - lambda_full * [attn21 | attn22]``, ``subln``,
        ``* (1 - lambda_init)``, heads merged back (the eager forward's and the captured graph's)."""
        attn1 = torch.cat([outs["attn11"], outs["attn12"]], dim=-1)
        attn2 = torch.cat([outs["attn21"], outs["attn22"]], dim=-1)
        attn = self.combine(attn1, attn2, _lambda_full(params, dtype))
        attn = self.scale_output(self.subln(attn, params.subln_weight), params.lambda_init)
        return _merge_heads(attn)

    def _generate(self, pair, calls, meta, kernel, q, k, v, k_cache, v_cache, bs) -> torch.Tensor:
        """``forward_generate_kv_cache``: prompts first (new keys, or the cache on a prefix hit), then decodes."""
        npt, np_ = meta.num_prefill_tokens, meta.num_prefills
        out = torch.empty_like(q)
        if np_:
            label = f"{pair} prefill"
            if meta.prefix_cache_hit:
                table = meta.block_tables[:np_]
                call = paged_call(label, calls[label], q[:npt], PagedKV(k_cache, v_cache, table, [], bs, "NHD"), table)
            else:
                call = contiguous_call(label, calls[label], q[:npt], k[:npt], v[:npt])
            out[:npt] = kernel(call).out
        if meta.num_decode_tokens:
            label, table = f"{pair} decode", meta.block_tables[np_:]
            call = paged_call(label, calls[label], q[npt:], PagedKV(k_cache, v_cache, table, [], bs, "NHD"), table)
            out[npt:] = kernel(call).out
        return out

    # ------------------------------------------------------------------ oracle and baseline
    def _half_case(self, case: AttentionCase) -> AttentionCase:
        """One softmax group over all keys: H/2 query heads, Hk/2 kv heads, V = [v1 | v2] (2D wide)."""
        return call_case(
            case,
            case.requests,
            num_heads=case.num_heads // 2,
            num_kv_heads=case.num_kv_heads // 2,
            head_dim_v=2 * case.head_dim,
            kv_layout="contiguous",
            block_size=None,
            graph=(),
            graph_fill=0,
        )

    def _groups(self, inputs: CaseInputs, dtype: torch.dtype):
        q, k, v = inputs.q.to(dtype), inputs.k.to(dtype), inputs.v.to(dtype)
        v12 = torch.cat([v[:, 0::2], v[:, 1::2]], dim=-1)
        return [(q[:, g::2].contiguous(), k[:, g::2].contiguous(), v12) for g in (0, 1)]

    def reference(self, case: AttentionCase, inputs: CaseInputs) -> AttnResult:
        """The layer over every key in fp32 (fp64 for fp32 inputs); LSE NaN: the layer has none."""
        from conformance.verdict.reference import case_options, default_numerics, strict_fp32

        numerics = default_numerics(case)
        ct = numerics.dtype
        p = layer_params(case, inputs.q.device)
        with strict_fp32():
            attn1, attn2 = (
                attnref.attention_varlen(
                    q, k, v, inputs.cu_seqlens_q, inputs.cu_seqlens_k, options=case_options(case), numerics=numerics
                ).out.to(ct)
                for q, k, v in self._groups(inputs, ct)
            )
        l1 = math.exp(float(torch.sum(p.lambda_q1.double() * p.lambda_k1.double())))
        l2 = math.exp(float(torch.sum(p.lambda_q2.double() * p.lambda_k2.double())))
        attn = attn1 - (l1 - l2 + p.lambda_init) * attn2
        attn = attn * torch.rsqrt(attn.pow(2).mean(dim=-1, keepdim=True) + RMS_EPS) * p.subln_weight.to(ct)
        out = _merge_heads(attn * (1 - p.lambda_init))
        return AttnResult(out, torch.full((case.num_heads, case.total_q), math.nan, dtype=ct, device=out.device))

    def baseline(self, case: AttentionCase, inputs: CaseInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Same-dtype softmaxes (:func:`conformance.verdict.baseline.baseline`), combined in the activation dtype."""
        from conformance.verdict.baseline import baseline

        half = self._half_case(case)
        parts = []
        for q, k, v in self._groups(inputs, case.torch_dtype):
            sub = CaseInputs(half, q, k, v, inputs.cu_seqlens_q, inputs.cu_seqlens_k, inputs.seqlens_k)
            parts.append(baseline(half, sub)[0])
        out = _combine_lowp(case, layer_params(case, inputs.q.device), parts[0], parts[1])
        return out, torch.full((case.num_heads, case.total_q), math.nan, device=out.device)
