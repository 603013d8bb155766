"""Seed ``003``'s CUDA-graph path replayed at engine level: capture at a bucket, replay every batch of the case.

A graph case of the engine ``sglang_fa`` names a scenario of
:data:`~conformance.engines.sglang.scenarios.GRAPH_SCENARIOS` (decode, deterministic decode, local-attention
decode, target verify with top-k 1 and > 1, draft decode with top-k 1 and > 1, the cross- and self-attention
layers of an encoder-decoder decode, :mod:`conformance.engines.sglang.graph_cross`) and carries ``graph``: the size
of each replay batch, the capture bucket ``bs`` first (every later batch has at most ``bs`` requests), and
``graph_fill = 1`` (``get_cuda_graph_seq_len_fill_value()``).  Its requests are the batches one after the other,
``(q_len, kv_len)`` each (``q_len``: 1, the draft tokens of a verify, ``topk`` of a top-k draft step; ``kv_len``:
``seq_lens`` plus the draft tokens the step sees).  :class:`SGLangGraphRun` then does what the engine does:

1. one memory pool for every request of the case (``req_to_token`` rows in a shuffled order, an encoder-decoder
   request's row its encoder tokens then its decoder tokens, the layer's keys written at its own, pages handed out
   shuffled; entries past a request's tokens hold random valid slots, the pool's unused slots large values, so a
   read past ``cache_seqlens`` shows), the keys written through ``req_to_token``;
2. ``init_cuda_graph_state(bs)`` and the capture's metadata for the runner's capture batch (``seq_lens`` at the
   fill value, ``req_pool_indices`` 0), as SGLang's runner captures
   (:class:`~conformance.engines.sglang.graph_state.CudaGraphState`);
3. the forward's kernel calls on the metadata views, each through the adapter's ``prepare_graph`` (the bucket's
   call; the adapter must declare ``graph``, else the case is ``unsupported`` with its reason), merged with
   ``merge_state_v2`` for top-k > 1, captured together in one CUDA graph on a CUDA device
   (:class:`conformance.graphs.captured.CapturedCall`, the loop every graph path shares), run eagerly on the
   buffers on CPU;
4. per batch: the runner pads it to the bucket, its queries go into the static query buffer (padded rows stale),
   ``init_forward_metadata_replay_cuda_graph`` rewrites the metadata in place, the outputs are NaN-poisoned and
   the graph replayed; the real requests' rows are kept.

The verdict is the harness's: the replays' rows, one batch after the other, against
:meth:`~conformance.engines.base.Engine.reference` of the whole case (for top-k > 1 each query over the prefix and
the draft tokens it may see).  Beyond the numbers (``problems``, ``extra["graph"]``): each replay must equal,
bit for bit, the same calls prepared afresh and run eagerly on the same buffers; and it is compared with the
batch's own eager calls (only the real requests, exact key counts), a difference failing only where the case pins
``num_splits`` on a kernel that takes a split count (SGLang's deterministic inference).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnfast.base import KernelOutput
from attnref import write_kv_cache
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs
from conformance.graphs.buffers import DECOY_SCALE
from conformance.graphs.captured import CapturedCall, live_rows
from conformance.graphs.composed import ComposedRun

from ..base import call_inputs
from ..calls import hand_out_blocks, prefix_sums, token_slots
from .graph_cases import GraphCall, graph_calls, graph_scenario, seq_lens_of, visible_draft_tokens
from .graph_cross import EncoderDecoderGraphState, allocate_encoder_lens, cross_lengths
from .graph_state import FILL_VALUE, RunnerBuffers
from .scenarios import GraphScenario, tree_paths

__all__ = ["SGLangGraphRun"]


class _Forward:
    """The captured forward: the calls' prepared kernels, then (top-k > 1) ``merge_state_v2``; ``refresh`` runs
    every kernel's host-side update (outside the graph)."""

    def __init__(self, kernels: list[Callable[[], KernelOutput]], merge) -> None:
        self.kernels, self.merge = kernels, merge

    def refresh(self) -> None:
        for k in self.kernels:
            fn = getattr(k, "refresh", None)
            if fn is not None:
                fn()

    def __call__(self) -> KernelOutput:
        results = [k() for k in self.kernels]
        if len(results) == 1:
            return results[0]
        a, b = results
        if a.lse is None or b.lse is None:
            raise ValueError("merge_state_v2: the top-k > 1 merge needs both calls' LSE; this backend returned none")
        out, lse = self.merge(a.out, a.lse.transpose(0, 1), b.out, b.lse.transpose(0, 1))
        return KernelOutput(out, lse.transpose(0, 1))


@dataclass
class _Pool:
    """The memory pool of every request of the case (see the module docstring)."""

    req_to_token: torch.Tensor
    rows: list[int]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    draft_slots: list[list[int]]  # per request: out_cache_loc of its draft steps, (topk, num_steps) row-major


def _pool(case: AttentionCase, inputs: CaseInputs, sc: GraphScenario, seed: int) -> _Pool:
    gen = torch.Generator().manual_seed(int(case.digest(), 16) % (1 << 62) + seed)
    seq = seq_lens_of(sc, case)
    enc = cross_lengths(sc)[0] if sc.layer else [0] * len(seq)  # a row holds [encoder | decoder] tokens
    tokens = [e + s + sc.allocated for e, s in zip(enc, seq)]
    ps, dev, dt = sc.page_size, inputs.device, case.torch_dtype
    perm, pages = hand_out_blocks(tokens, ps, gen)
    num_slots = len(perm) * ps
    width = math.ceil(max(sc.max_context_len, max(tokens)) / ps) * ps
    n = len(tokens)
    r2t = torch.randint(0, num_slots, (n + 1, width), generator=gen, dtype=torch.int32)  # stale: valid slots
    rows = torch.randperm(n + 1, generator=gen).tolist()[:n]
    hk = case.num_kv_heads
    k_cache = (torch.randn(len(perm), ps, hk, case.head_dim, generator=gen) * DECOY_SCALE).to(dev, dt)
    v_cache = (torch.randn(len(perm), ps, hk, case.dv, generator=gen) * DECOY_SCALE).to(dev, dt)
    cu_k = inputs.cu_seqlens_k.tolist()
    visible, slots_all, keys_all, drafts = visible_draft_tokens(sc), [], [], []
    for r, (s, t) in enumerate(zip(seq, tokens)):
        slots = token_slots(pages[r], range(t), ps)
        r2t[rows[r], :t] = torch.tensor(slots, dtype=torch.int32)
        if sc.mode == "draft_decode" and visible is not None:  # branch j step i at position s + j * num_steps + i
            n_step = sc.step_id + 1
            pos = list(range(s)) + [s + j * sc.num_steps + i for j in range(sc.topk) for i in range(n_step)]
            drafts.append(slots[s:])
        else:  # the cross layer's keys are the encoder's tokens, the self layer's the decoder's after them
            base = 0 if sc.layer == "cross" else enc[r]
            pos = list(range(base, base + case.kv_lens[r]))
            drafts.append([])
        slots_all += [slots[p] for p in pos]
        keys_all += list(range(cu_k[r], cu_k[r] + len(pos)))
    idx = torch.tensor(keys_all, device=dev)
    write_kv_cache(inputs.k[idx], inputs.v[idx], k_cache, v_cache, torch.tensor(slots_all, device=dev))
    return _Pool(r2t.to(dev), rows, k_cache, v_cache, drafts)


def _custom_mask(sc: GraphScenario, seq_lens: list[int]) -> torch.Tensor | None:
    """``spec_info.custom_mask`` of a top-k > 1 verify batch: per request ``(d, seq_len + d)`` row-major."""
    if sc.mode != "target_verify" or sc.topk <= 1:
        return None
    paths, d = tree_paths(sc.tree), sc.draft_tokens
    rows = [
        torch.tensor([[True] * s + [j in paths[i] for j in range(d)] for i in range(d)]).flatten() for s in seq_lens
    ]
    return torch.cat(rows)


@dataclass
class SGLangGraphRun(ComposedRun):
    """The callable the engine's ``prepare`` returns for a graph case (what the verdict calls)."""

    engine: Any = None
    seed: int = 0

    def run(self) -> KernelOutput:
        case, inputs, backend, eng = self.case, self.inputs, self.backend, self.engine
        sc = graph_scenario(case.scenario)
        eng.check(case)
        dev = inputs.device
        bs, ql = case.graph[0], sc.q_len
        pool = _pool(case, inputs, sc, self.seed)
        state = getattr(eng, "graph_state", EncoderDecoderGraphState)(sc, dev)  # planted bugs override it
        state.init_cuda_graph_state(bs)
        runner = RunnerBuffers.allocate(bs, bs * sc.topk * sc.num_steps, dev)
        if sc.layer:
            allocate_encoder_lens(runner)
            md, mde = state.capture(bs, runner.seq_lens, runner.encoder_lens)
        else:
            md, mde = state.capture(bs, runner.seq_lens)
        local_cu_k = torch.zeros(bs + 1, dtype=torch.int32, device=dev)  # the harness's (the seed passes None)
        calls = graph_calls(case, sc, md, mde, local_cu_k)
        gen = torch.Generator().manual_seed(self.seed * 7919 + 3)
        qbuf = (torch.randn(bs * ql, case.num_heads, case.head_dim, generator=gen) * DECOY_SCALE).to(
            dev, inputs.q.dtype
        )
        empty_k = inputs.k[:0]
        empty_v = inputs.v[:0]

        def call_ins(c: GraphCall) -> CaseInputs:
            return call_inputs(
                c.case,
                q=qbuf,
                k=empty_k,
                v=empty_v,
                cu_seqlens_q=c.cu_q,
                cu_seqlens_k=c.cu_k,
                seqlens_k=c.lens,
                k_cache=pool.k_cache,
                v_cache=pool.v_cache,
                block_table=c.table,
            )

        ins = [call_ins(c) for c in calls]

        def make() -> _Forward:
            return _Forward([backend.prepare_graph(c.case, i) for c, i in zip(calls, ins)], eng.merge_state)

        self.notes.append(
            f"bucket bs={bs} ({sc.mode}, page_size {sc.page_size}, max_context_len {sc.max_context_len}); padded "
            f"requests at seq_lens = {FILL_VALUE} (get_cuda_graph_seq_len_fill_value)"
        )
        self.notes += [f"{c.label}: {backend.name} {c.case.summary()}" for c in calls]
        pinned = case.num_splits if all(backend.pins_splits(c.case) for c in calls) else None
        captured = CapturedCall(
            make,
            lambda requests: self._own(calls, ins, len(requests), len(requests) * ql, qbuf, pool),
            self.device,
            self.notes,
            self.problems,
            pinned,
            what="calls",
        )
        cu_q = inputs.cu_seqlens_q.tolist()
        seq_all = seq_lens_of(sc, case)
        enc_all = cross_lengths(sc)[0]
        outs, lses, start = [], [], 0
        for n in case.graph:
            group = list(range(start, start + n))
            start += n
            seq = [seq_all[r] for r in group]
            drafts = [slot for r in group for slot in pool.draft_slots[r]]
            enc = [enc_all[r] for r in group] if sc.layer else None
            runner.prepare([pool.rows[r] for r in group], seq, drafts or None, enc)
            qbuf[: n * ql].copy_(inputs.q[cu_q[group[0]] : cu_q[group[-1] + 1]])
            mask = _custom_mask(sc, seq)
            state.replay(bs, pool.req_to_token, runner, None if mask is None else mask.to(dev))
            if md.local_attn_metadata is not None:
                local_cu_k[1:].copy_(torch.cumsum(md.local_attn_metadata.local_seqused_k, 0, dtype=torch.int32))
            for c in calls:
                c.check_fits(bs)
            got, _, _ = captured.replay([(ql, s) for s in seq], f"{n} of bs={bs} requests")
            outs.append(got.out)
            if got.lse is not None:
                lses.append(got.lse)
        bucket = {"batch": bs, "q_len": ql, "page_size": sc.page_size, "fill": FILL_VALUE}
        self.extra["graph"] = captured.summary(bucket, engine_level=True)
        lse = torch.cat(lses, dim=1) if len(lses) == len(outs) else None
        return KernelOutput(torch.cat(outs), lse)

    def _own(self, calls: list[GraphCall], ins: list[CaseInputs], n: int, rows: int, qbuf, pool) -> KernelOutput:
        """The batch's own eager calls: only the real sequences, their exact key counts (``prepare``, no graph)."""
        kernels = []
        for c, i in zip(calls, ins):
            q_len = c.case.q_lens[0]
            seqs = rows // q_len
            lens = [int(x) for x in c.lens[:seqs].tolist()]
            cc = c.case.replace(requests=tuple((q_len, k) for k in lens))
            dev = qbuf.device
            own = call_inputs(
                cc,
                q=qbuf[:rows],
                k=i.k,
                v=i.v,
                cu_seqlens_q=c.cu_q[: seqs + 1].clone(),
                cu_seqlens_k=torch.tensor(prefix_sums(lens), dtype=torch.int32, device=dev),
                seqlens_k=c.lens[:seqs].clone(),
                k_cache=pool.k_cache,
                v_cache=pool.v_cache,
                block_table=c.table[:seqs].clone(),
            )
            kernels.append(self.backend.prepare(cc, own))
        return live_rows(_Forward(kernels, self.engine.merge_state)(), rows)
