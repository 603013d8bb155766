"""Helpers shared by the torch-native adapters (``sdpa.py``, ``flex.py``).

These adapters are implementations *under test*, so nothing here calls :mod:`attnref` (not even
its mask rule): the visibility rule, the ALiBi bias, the paged gather and the kvcache-append
write are re-derived from ``../shared/SEMANTICS.md`` so that a bug in the reference is not shared.

Conventions of this module:

* one sequence at a time: ``q (sq, h, d)``, ``k (sk, hk, d)``, ``v (sk, hk, dv)``;
* quantized cases: the stored tensors (``CaseInputs.quant`` and the stored-dtype paged caches) are
  read and dequantized here (``stored.float() * descale``, the descale picked per sequence, kv
  head, token, slot or channel as the case's granularity says), then rounded to the activation
  dtype: the backend computes on what a quantized kernel is handed, not on the harness's copy;
* MLA ``qv``: ``[q | qv]`` against ``[k | v]`` (the same dot product), default scale ``1/sqrt(d + dv)``;
* context parallel (``case.cp_world > 1``, vLLM FA3's ``cp_world_size`` / ``cp_rank`` / ``cp_tot_seqused_k``):
  the ``sk`` keys are rank ``r``'s share of ``T`` keys, local key ``j`` is absolute key ``j * W + r``, and
  the causal test compares absolute positions (:func:`visibility` with ``cp_total``; ``T`` per sequence in
  :attr:`SeqTensors.cp_total`);
* a *sink column*: a sink is expressed as one extra key appended after the ``sk`` real keys, with
  ``k = 0`` (its raw score is exactly 0) and ``v = 0`` (it adds nothing to the output), whose
  score is set to the sink's logit by a bias or a score modifier.  It then enters only the
  softmax denominator, which is exactly the sink semantics (SEMANTICS section 3, step 5).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import CaseInputs, cp_totals, host_ints

from .base import KernelOutput

__all__ = [
    "SeqTensors",
    "alibi_bias",
    "derived_lse",
    "score_bias",
    "sequences",
    "softmax_scale",
    "visibility",
    "with_sink_column",
]


@dataclass
class SeqTensors:
    """One request's tensors, keys already gathered (paged) and appended (kvcache append)."""

    index: int
    q0: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cp_total: int | None = None  # context parallel: the sequence's keys over all ranks

    @property
    def sq(self) -> int:
        return int(self.q.shape[0])

    @property
    def sk(self) -> int:
        return int(self.k.shape[0])


def softmax_scale(case: AttentionCase) -> float:
    """The case's scale, or the kernels' default ``1/sqrt(d)`` (``1/sqrt(d + dv)`` with ``qv``)."""
    if case.scale is not None:
        return case.scale
    return 1.0 / math.sqrt(case.qk_dim)


def visibility(
    case: AttentionCase, sq: int, sk: int, device: torch.device | str = "cpu", cp_total: int | None = None
) -> torch.Tensor:
    """Boolean ``(sq, sk)``: may query row ``i`` see key ``j`` (bottom-right aligned).

    With ``p = i + sk - sq``: ``p - left <= j <= p + right`` (``right = 0`` under causal; ``None``
    unbounded) and, with a chunk ``C``, ``j`` in the chunk of ``p``: ``floor(p / C) == floor(j / C)``.
    The chunk test is written as an equality of chunk numbers (not FA3's ``c0 = p - p % C``
    spelling) on purpose: two spellings that agree are evidence both are right.

    Context parallel (``case.cp_world > 1``, causal only): key ``j`` is absolute key ``a = j * W + r`` of a
    sequence of ``cp_total`` keys, visible iff ``a <= i + cp_total - sq`` and ``a < cp_total``, the test of
    FA3's causal mask written per key (attnref bounds a prefix instead).
    """
    i = torch.arange(sq, device=device, dtype=torch.int64)[:, None]
    j = torch.arange(sk, device=device, dtype=torch.int64)[None, :]
    if case.cp_world > 1:
        if cp_total is None:
            raise ValueError("a context-parallel case needs the sequence's total keys (cp_total)")
        a = j * case.cp_world + case.cp_rank
        return (a <= i + (cp_total - sq)) & (a < cp_total)
    p = i + (sk - sq)
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    left, right = case.window
    if case.causal:
        right = 0
    if left is not None:
        ok &= j >= p - left
    if right is not None:
        ok &= j <= p + right
    if case.chunk is not None:
        ok &= torch.div(p, case.chunk, rounding_mode="floor") == torch.div(j, case.chunk, rounding_mode="floor")
    return ok


def alibi_bias(slopes: torch.Tensor, sq: int, sk: int) -> torch.Tensor:
    """fp32 ``(h, sq, sk)`` bias ``-slope * |i + sk - sq - j|`` (FA2's symmetric form)."""
    dev = slopes.device
    i = torch.arange(sq, device=dev, dtype=torch.float32)[:, None]
    j = torch.arange(sk, device=dev, dtype=torch.float32)[None, :]
    dist = (i + float(sk - sq) - j).abs()
    return -slopes.to(torch.float32)[:, None, None] * dist[None]


def score_bias(case: AttentionCase, inputs: CaseInputs, sq: int, sk: int, cp_total: int | None = None) -> torch.Tensor:
    """fp32 additive bias ``(h or 1, sq, sk [+ 1])``: ``-inf`` where masked, ALiBi, sink column.

    The last column is the sink column when ``case.sinks`` (see the module docstring); the sink
    is visible from every row, including rows that see no real key.  ``cp_total``: the sequence's
    total keys of a context-parallel case (:func:`visibility`).
    """
    dev = inputs.q.device
    vis = visibility(case, sq, sk, dev, cp_total)
    bias = torch.zeros(1, sq, sk, dtype=torch.float32, device=dev).masked_fill(~vis, -math.inf)
    if case.alibi:
        assert inputs.alibi_slopes is not None, "an ALiBi case must carry alibi_slopes"
        bias = bias + alibi_bias(inputs.alibi_slopes.to(dev), sq, sk)
    if case.sinks:
        assert inputs.sinks is not None, "a sinks case must carry sinks"
        h = case.num_heads
        sink_col = inputs.sinks.to(dev, torch.float32).reshape(h, 1, 1).expand(h, sq, 1)
        bias = torch.cat([bias.expand(h, sq, sk), sink_col], dim=-1)
    return bias


def with_sink_column(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Append the sink key (zeros) to ``k (sk, hk, d)`` and ``v (sk, hk, dv)``."""
    return torch.cat([k, k.new_zeros(1, *k.shape[1:])]), torch.cat([v, v.new_zeros(1, *v.shape[1:])])


def derived_lse(
    q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, scale: float, max_score_elems: int = 1 << 24
) -> torch.Tensor:
    """fp32 ``(h, sq)`` natural-log LSE of ``scale * q.k + bias`` (GQA by head grouping).

    For backends whose kernel does not return the LSE (SDPA): a separate small fp32 computation
    from the same inputs and the same bias the kernel was given.  It checks the adapter's
    translation (mask, ALiBi, sink), not the kernel; a row whose bias is all ``-inf`` gets ``-inf``.
    """
    sq, h, _ = q.shape
    hk = k.shape[1]
    if sq == 0:
        return torch.empty(h, 0, dtype=torch.float32, device=q.device)
    if k.shape[0] == 0:
        return torch.full((h, sq), -math.inf, dtype=torch.float32, device=q.device)
    kf = k.to(torch.float32).repeat_interleave(h // hk, dim=1)  # (sk, h, d)
    qf = q.to(torch.float32)
    rows = max(1, max_score_elems // (h * k.shape[0]))  # query tiles bound the fp32 score block
    out = []
    for r0 in range(0, sq, rows):
        s = torch.einsum("qhd,khd->hqk", qf[r0 : r0 + rows], kf) * scale + bias[:, r0 : r0 + rows]
        out.append(torch.logsumexp(s, dim=-1))
    return torch.cat(out, dim=1)


def _token_slots(
    table_row: torch.Tensor, positions: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block id, offset) of token positions of one sequence through its block-table row."""
    blocks = table_row.to(torch.int64)[torch.div(positions, block_size, rounding_mode="floor")]
    return blocks, torch.remainder(positions, block_size)


def _read_paged(cache: torch.Tensor, blocks: torch.Tensor, offs: torch.Tensor, hnd: bool) -> torch.Tensor:
    # Advanced indexing on the two token axes; for HND the head axis sits between them, and
    # torch moves the broadcast index dimension to the front: (n, hk, d) either way.
    return cache[blocks, :, offs] if hnd else cache[blocks, offs]


def _write_paged(
    cache: torch.Tensor, blocks: torch.Tensor, offs: torch.Tensor, hnd: bool, values: torch.Tensor
) -> None:
    if hnd:
        cache[blocks, :, offs] = values.to(cache.dtype)
    else:
        cache[blocks, offs] = values.to(cache.dtype)


def _seq_scale(case: AttentionCase, scale: torch.Tensor, b: int, groups: int = 1) -> torch.Tensor:
    """A ``(1,)`` (``descale="tensor"``) or ``(batch, hk)`` (``"head"``) fp8 descale as a ``(1, heads, 1)`` factor for
    sequence ``b``; a per-head case whose descale has another shape raises, as FA3 does ("q_descale must have
    shape (batch_size, num_heads_k)"), so a caller that forgets vLLM's ``expand`` is caught here too."""
    if case.descale_mode == "head":
        want = (case.batch, case.num_kv_heads)
        if tuple(scale.shape) != want:
            raise ValueError(
                f"descale must have shape {want} (batch, kv heads) for descale='head', got {tuple(scale.shape)}"
            )
        return scale[b].repeat_interleave(groups)[None, :, None]
    if scale.numel() != 1:
        raise ValueError(f"descale must have one element for descale='tensor', got shape {tuple(scale.shape)}")
    return scale.reshape(1, 1, 1)


def _dequant_q(
    case: AttentionCase, inputs: CaseInputs, b: int, rows: slice
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sequence ``b``'s q and qv as the kernel is given them, dequantized (fp32)."""
    quant = inputs.quant
    assert quant is not None
    qv = None if inputs.qv is None else inputs.qv[rows].float()
    if quant.q is None:  # q (and qv) stayed in the activation dtype
        return inputs.q[rows].float(), qv
    assert quant.q_descale is not None
    if quant.fmt == "int8":
        return quant.q[rows].float() * quant.q_descale[rows][..., None], None
    factor = _seq_scale(case, quant.q_descale, b, case.num_heads // case.num_kv_heads)
    if quant.qv is not None:
        qv = quant.qv[rows].float() * factor
    return quant.q[rows].float() * factor, qv


def _dequant_kv(
    case: AttentionCase,
    inputs: CaseInputs,
    b: int,
    k: torch.Tensor,
    v: torch.Tensor,
    k_token_scale: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence ``b``'s stored keys and values dequantized (fp32); ``k_token_scale`` (n, hk) for int8 K."""
    quant = inputs.quant
    assert quant is not None
    if quant.fmt == "int8":
        assert k_token_scale is not None
        kd = k.float() * k_token_scale[..., None]
        vd = v.float() if quant.v_descale is None else v.float() * quant.v_descale[None]
        return kd, vd
    assert quant.v_descale is not None
    return k.float() * _seq_scale(case, quant.k_descale, b), v.float() * _seq_scale(case, quant.v_descale, b)


def sequences(case: AttentionCase, inputs: CaseInputs) -> list[SeqTensors]:
    """Per-request tensors as a kernel without paging or append support must be given them.

    * paged: with ``append``, ``k_new``/``v_new`` (``n`` per request, ``case.new_kv_lens``: ``q_len``,
      ``append_len`` for a short append, ``append_lens[b]`` for an uneven one) are first written into a *clone* of
      the cache at positions ``kv_len - n ..`` through the block table (the engine's write; the clone keeps the
      inputs untouched so the case can be rerun), then every request's keys are gathered.  An fp8 append writes the
      stored ``quant.k_new``/``v_new`` into the stored cache (the kernel's copy; the descales are the cache's).
    * contiguous with ``append``: the cache is the first ``kv_len - n`` keys of ``inputs.k``
      and the new tokens are written after them, so ``k_new`` (not ``k``'s copy of the new
      tokens) is what is attended.
    * quantized: the stored keys/values (packed, or gathered from the stored-dtype caches with the
      int8 K scales of the same slots) and q are dequantized, then rounded to the activation dtype.
    * ``qv``: ``q`` becomes ``[q | qv]`` and ``k`` becomes ``[k | v]``.
    * context parallel: each sequence's total keys (``inputs.cp_tot_seqused_k``, checked against its
      shard by :func:`conformance.cases.inputs.cp_totals`) in ``cp_total``.
    """
    out: list[SeqTensors] = []
    quant, dt = inputs.quant, case.torch_dtype
    cu_q = host_ints(inputs.cu_seqlens_q)
    dev = inputs.q.device
    hnd = case.kv_layout == "HND"
    k_cache, v_cache = inputs.k_cache, inputs.v_cache
    if case.paged and case.append:
        assert k_cache is not None and v_cache is not None
        k_cache, v_cache = k_cache.clone(), v_cache.clone()
    cu_k = host_ints(inputs.cu_seqlens_k)
    totals = cp_totals(inputs, case)
    new_lens = case.new_kv_lens
    cu_new = [0, *itertools.accumulate(new_lens)]
    for b, (ql, kl) in enumerate(case.requests):
        q = inputs.q[cu_q[b] : cu_q[b + 1]]
        qv = None if inputs.qv is None else inputs.qv[cu_q[b] : cu_q[b + 1]]
        new = slice(cu_q[b], cu_q[b + 1])
        n, new_kv = new_lens[b], slice(cu_new[b], cu_new[b + 1])
        k_token_scale = None
        if case.paged:
            assert k_cache is not None and v_cache is not None and inputs.block_table is not None
            bs = case.block_size
            assert bs is not None
            row = inputs.block_table[b].to(dev)
            if case.append and n:
                holder = inputs if quant is None else quant  # fp8: the new keys as stored, into the stored cache
                assert holder.k_new is not None and holder.v_new is not None
                blocks, offs = _token_slots(row, torch.arange(kl - n, kl, device=dev), bs)
                _write_paged(k_cache, blocks, offs, hnd, holder.k_new[new_kv])
                _write_paged(v_cache, blocks, offs, hnd, holder.v_new[new_kv])
            blocks, offs = _token_slots(row, torch.arange(kl, device=dev), bs)
            k = _read_paged(k_cache, blocks, offs, hnd)
            v = _read_paged(v_cache, blocks, offs, hnd)
            if quant is not None and quant.k_scale_cache is not None:  # (num_blocks, hk, block): slot scales
                k_token_scale = quant.k_scale_cache[blocks, :, offs]
        elif quant is not None:
            keys = slice(cu_k[b], cu_k[b + 1])
            k = quant.k[keys]
            v = quant.v[keys] if quant.v is not None else inputs.v[keys]
            if quant.fmt == "int8":
                k_token_scale = quant.k_descale[keys]
        else:
            k, v = inputs.k_of(b), inputs.v_of(b)
            if case.append and n:
                assert inputs.k_new is not None and inputs.v_new is not None
                k = torch.cat([k[: kl - n], inputs.k_new[new_kv].to(k.dtype)])
                v = torch.cat([v[: kl - n], inputs.v_new[new_kv].to(v.dtype)])
        if quant is not None:
            q, qv = _dequant_q(case, inputs, b, new)
            k, v = _dequant_kv(case, inputs, b, k, v, k_token_scale)
            q, k, v = q.to(dt), k.to(dt), v.to(dt)
            qv = None if qv is None else qv.to(dt)
        if qv is not None:  # MLA absorbed: [q | qv] . [k | v] = q.k + qv.v
            q, k = torch.cat([q, qv], dim=-1), torch.cat([k, v], dim=-1)
        total = None if totals is None else totals[b]
        out.append(SeqTensors(b, cu_q[b], q, k.contiguous(), v.contiguous(), total))
    return out


def host_graph_call(
    prepare: Callable[[AttentionCase, CaseInputs], Callable[[], KernelOutput]], case: AttentionCase, inputs: CaseInputs
) -> Callable[[], KernelOutput]:
    """Graph mode of the CPU adapters (:meth:`attnfast.base.Backend.prepare_graph`): each call reads the bucket's
    live key counts on the host and prepares the ordinary per-request call over the buffers.  A host read cannot
    be captured, which is why only the CPU adapters, which are never captured, take this path."""
    q_len = case.q_lens[0]

    def run() -> KernelOutput:
        lens = [int(n) for n in inputs.seqlens_k.tolist()]
        live = case.replace(requests=tuple((q_len, n) for n in lens))
        return prepare(live, dataclasses.replace(inputs, case=live))()

    return run
