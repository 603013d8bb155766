"""Tensors of a case, generated from (case, seed, device) and identical on every device.

Everything is drawn on the CPU with a seeded ``torch.Generator`` and then moved, so a CUDA run and
a CPU rerun of one case see the same numbers.  Choices that make bugs visible:

* with a soft-cap, queries are scaled so raw scores reach the cap (``q *= cap / 4``, as
  flash-attention's own tests do); a kernel that ignores the cap is then far off;
* sinks are drawn around ``log(kv_len)`` so they carry a share of the softmax mass comparable to
  the keys', and rounded to bf16 (model sinks are bf16 parameters, and vLLM's FA3 ``s_aux`` takes
  bf16 only, so every kernel is handed exactly the case's values);
* paged caches hold every sequence's keys in randomly permuted blocks, and the unused slots hold
  large finite values (stale data, as in a real engine) so a kernel that reads past
  ``seqused_k`` is caught rather than masked by zeros (in a quantized cache: values near the
  format's largest, and K scales of 1);
* quantized cases (:mod:`conformance.cases.quant_inputs`): q/k/v/qv hold the dequantized values in
  fp32, ``quant`` the stored tensors and descales the kernel is given;
* MLA (``qv``) paged caches also come as one ``(num_blocks, block, 1, dv + d)`` tensor
  ``[c_kv | k_rope]`` (``mla_cache``, FlashMLA's and SGLang's layout; ``k_cache``/``v_cache`` are
  contiguous copies of its two parts).
* ``data`` (:mod:`conformance.cases.data_inputs`) reshapes the draws (outlier rows, near-one-hot softmax, an
  offset V), and a backward case carries its upstream gradient ``dout``;
* context parallel (``cp_world > 1``): ``kv_len`` keys are rank ``cp_rank``'s share of a sequence of
  ``cp_tot_seqused_k[b]`` keys; the totals are derived as ``max(0, kv_len * world + rank - b % world)``
  (:func:`cp_case_totals`), the largest total of that share less ``b mod world``, so a batch meets every remainder
  of ``total mod world`` (engines pass their own, see :func:`cp_totals`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

from conformance.cases.case import AttentionCase
from conformance.cases.data_inputs import grad_out, shape_data
from conformance.cases.quant_inputs import QuantTensors, quantize_case, vary_magnitudes

__all__ = [
    "CaseInputs",
    "QuantTensors",
    "alibi_slopes",
    "clone_known",
    "cp_case_totals",
    "cp_local_len",
    "cp_totals",
    "host_ints",
    "make_inputs",
]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The ALiBi paper's geometric slopes (closest power of two, then interleaved), fp32 (h,)."""

    def pow2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        slopes = pow2(num_heads)
    else:
        closest = 2 ** math.floor(math.log2(num_heads))
        slopes = pow2(closest) + pow2(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


@dataclass
class CaseInputs:
    """Inputs of one case.  Layout is varlen: tokens packed, sequences delimited by cu_seqlens.

    ``k``/``v`` hold every key of every request (the new tokens last within each request); for a
    quantized case q/k/v/qv are the dequantized values in fp32 and ``quant`` holds what the kernel is
    given (the paged caches then have the stored dtype);
    the paged fields are set when ``case.paged``. With ``case.append`` the paged cache (or, for a contiguous case,
    ``k_cache_padded``) holds only the first ``kv_len - n`` keys of each request and the kernel is expected to write
    ``k_new``/``v_new`` itself: packed, ``n`` per request (``case.new_kv_lens``: ``q_len``, ``append_len`` for a
    short append, or ``append_lens[b]`` for an uneven one), delimited by ``cu_seqlens_k_new``. ``cp_tot_seqused_k``
    (int32 ``(batch,)``) is set exactly for a context-parallel case (``case.cp_world > 1``): each sequence's keys
    over all ranks, of which ``k``/``v`` hold the rank's share (:func:`cp_totals`). ``dout`` (``(total_q, h, dv)``,
    the case dtype) is set exactly for a backward case (``case.backward``): the upstream gradient of the output
    (:func:`conformance.cases.data_inputs.grad_out`).
    """

    case: AttentionCase
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    seqlens_k: torch.Tensor
    alibi_slopes: torch.Tensor | None = None
    sinks: torch.Tensor | None = None
    k_cache: torch.Tensor | None = None
    v_cache: torch.Tensor | None = None
    block_table: torch.Tensor | None = None
    k_new: torch.Tensor | None = None
    v_new: torch.Tensor | None = None
    cu_seqlens_k_new: torch.Tensor | None = None
    qv: torch.Tensor | None = None
    quant: QuantTensors | None = None
    mla_cache: torch.Tensor | None = None
    cp_tot_seqused_k: torch.Tensor | None = None
    dout: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.q.device

    def k_of(self, b: int) -> torch.Tensor:
        cu = host_ints(self.cu_seqlens_k)
        return self.k[cu[b] : cu[b + 1]]

    def v_of(self, b: int) -> torch.Tensor:
        cu = host_ints(self.cu_seqlens_k)
        return self.v[cu[b] : cu[b + 1]]


#: what :func:`host_ints` knows of a device tensor without reading it: (the tensor's version then, its values)
_HOST_INTS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def host_ints(t: torch.Tensor) -> list[int]:
    """The values of a 1-D integer tensor as Python ints, read from the device at most once while the tensor is not
    written.  A host tensor is read directly.  For a device tensor the values known on the host are used: those
    :func:`make_inputs` drew before moving it, or those of an earlier read; they are valid while the tensor's
    version counter (bumped by every in-place write, through any view: a CUDA-graph buffer's lengths written for
    the next replay) is the one they were taken at, and read again otherwise.  A read of a device tensor waits for
    the device, behind every process that shares it, which is why the lengths a check slices by come from here."""
    known = _known(t)
    if known is not None:
        return list(known)
    values = [int(x) for x in t.tolist()]
    if t.device.type != "cpu":
        _HOST_INTS[t] = (t._version, tuple(values))
    return values


def cp_local_len(total: int, world: int, rank: int) -> int:
    """Keys of a ``total``-key sequence that ``rank`` of ``world`` holds in the kernel's interleave-1 shard (absolute
    key ``a`` on rank ``a % world``)."""
    return max(0, -(-(total - rank) // world))


def cp_case_totals(case: AttentionCase) -> list[int]:
    """The per-sequence totals :func:`make_inputs` derives for a context-parallel case (``cp_tot_seqused_k``):
    ``max(0, kv_len * world + rank - b % world)``, whose rank's share is the case's ``kv_len``
    (:func:`cp_local_len`); every remainder of ``total mod world`` occurs in a batch."""
    w, r = case.cp_world, case.cp_rank
    return [max(0, kl * w + r - b % w) for b, kl in enumerate(case.kv_lens)]


def cp_totals(inputs: CaseInputs, case: AttentionCase | None = None) -> list[int] | None:
    """The per-sequence totals of a context-parallel call (None when ``case.cp_world == 1``), checked: one int per
    sequence, each consistent with the keys the call holds (``kv_len == cp_local_len(total, world, rank)``).
    ``case`` is the call being made (default ``inputs.case``).

    Raises ``ValueError`` naming ``cp_tot_seqused_k`` otherwise: a call whose keys are not the rank's interleave-1
    shard of its total is not a call the kernel's rule describes (it would mask stale slots or read past them)."""
    case = inputs.case if case is None else case
    tot = inputs.cp_tot_seqused_k
    if case.cp_world == 1:
        if tot is not None:
            raise ValueError("cp_tot_seqused_k is set but the case has cp_world == 1")
        return None
    if tot is None:
        raise ValueError(f"cp_tot_seqused_k must be set for a context-parallel case (cp_world={case.cp_world})")
    if tot.dim() != 1 or tot.shape[0] != case.batch or tot.dtype.is_floating_point:
        raise ValueError(
            f"cp_tot_seqused_k must be an integer tensor of shape ({case.batch},), got {tuple(tot.shape)} {tot.dtype}"
        )
    totals = host_ints(tot)
    for b, (t, n) in enumerate(zip(totals, case.kv_lens)):
        want = cp_local_len(t, case.cp_world, case.cp_rank) if t >= 0 else -1
        if n != want:
            raise ValueError(
                f"cp_tot_seqused_k[{b}] = {t}: rank {case.cp_rank} of {case.cp_world} holds {max(want, 0)} of its "
                f"keys in the kernel's interleave-1 shard (key a on rank a % {case.cp_world}), but the call gives "
                f"sequence {b} {n}"
            )
    return totals


def _stale_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache contents (real values exact, stale ones large) in the cache's stored ``dtype``."""
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        limit = torch.finfo(dtype).max
        return x.clamp(-limit, limit).to(dtype)
    if dtype == torch.int8:
        return x.round().clamp(-127, 127).to(dtype)
    return x.to(dtype)


def _paged_cache(
    case: AttentionCase,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_k: list[int],
    keep: list[int],
    gen: torch.Generator,
    k_scales: torch.Tensor | None = None,
):
    """Paged caches of ``k``/``v`` (in their stored dtype), the block table, and the int8 K-scale cache
    ``(num_blocks, hk, block_size)`` when per-token ``k_scales (total_kv, hk)`` are given."""
    bs = case.block_size
    assert bs is not None
    need = [max(1, -(-n // bs)) for n in case.kv_lens]
    num_blocks = sum(need) + 1  # one spare block that nobody owns
    perm = torch.randperm(num_blocks, generator=gen)
    hk = case.num_kv_heads
    kc = torch.randn(num_blocks, bs, hk, case.head_dim, generator=gen).mul_(100)
    vc = torch.randn(num_blocks, bs, hk, case.dv, generator=gen).mul_(100)
    sc = None if k_scales is None else torch.ones(num_blocks, bs, hk)
    table = torch.zeros(case.batch, max(need), dtype=torch.int32)
    cursor = 0
    for b, n in enumerate(case.kv_lens):
        blocks = perm[cursor : cursor + need[b]]
        cursor += need[b]
        table[b, : need[b]] = blocks.to(torch.int32)
        if need[b] < table.shape[1]:
            table[b, need[b] :] = int(perm[-1])  # padding entries point at the spare block
        written = keep[b]
        if written:  # token t of the request goes to slot t % bs of its block t // bs: one indexed copy a request
            t = torch.arange(written)
            slot = blocks[t // bs] * bs + t % bs
            kc.view(-1, *kc.shape[2:])[slot] = k[cu_k[b] : cu_k[b] + written].float()
            vc.view(-1, *vc.shape[2:])[slot] = v[cu_k[b] : cu_k[b] + written].float()
            if sc is not None and k_scales is not None:
                sc.view(-1, *sc.shape[2:])[slot] = k_scales[cu_k[b] : cu_k[b] + written]
    kc, vc = _stale_to(kc, k.dtype), _stale_to(vc, v.dtype)
    if case.kv_layout == "HND":
        kc, vc = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
    if sc is not None:
        sc = sc.transpose(1, 2).contiguous()  # (num_blocks, hk, block_size), seed 001's layout
    return kc, vc, table, sc


def make_inputs(case: AttentionCase, seed: int = 0, device: str | torch.device = "cpu") -> CaseInputs:
    """Build the inputs of ``case``; the same (case, seed) gives the same numbers on any device."""
    forward = case.replace(backward=False, deterministic=False) if case.backward else case  # same forward inputs
    gen = torch.Generator().manual_seed(seed * 1_000_003 + int(forward.digest(), 16))
    dt = case.torch_dtype
    h, hk, d, dv = case.num_heads, case.num_kv_heads, case.head_dim, case.dv
    q = torch.randn(case.total_q, h, d, generator=gen)
    if case.softcap is not None:
        q = q * (case.softcap / 4.0)
    k = torch.randn(case.total_kv, hk, d, generator=gen)
    v = torch.randn(case.total_kv, hk, dv, generator=gen)
    qv = torch.randn(case.total_q, h, dv, generator=gen) if case.qv else None
    q, k, v = shape_data(case.data, q, k, v, gen)
    quant = None
    if case.quant != "none":
        q = vary_magnitudes(q, case.q_lens, hk, gen)
        qv = None if qv is None else vary_magnitudes(qv, case.q_lens, hk, gen)
        k, v = vary_magnitudes(k, case.kv_lens, hk, gen), vary_magnitudes(v, case.kv_lens, hk, gen)
        quant, deq = quantize_case(case, q, k, v, qv)
        q, k, v, qv = deq["q"], deq["k"], deq["v"], deq["qv"]
    else:
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
        qv = None if qv is None else qv.to(dt)
    cu_q = [0]
    cu_k = [0]
    for ql, kl in case.requests:
        cu_q.append(cu_q[-1] + ql)
        cu_k.append(cu_k[-1] + kl)
    slopes = alibi_slopes(h) if case.alibi else None
    sinks = None
    if case.sinks:
        mean_kv = max(1.0, sum(case.kv_lens) / case.batch)
        sinks = (torch.rand(h, generator=gen) * 2.0 - 1.0 + math.log(mean_kv)).to(torch.bfloat16).float()
    inputs = CaseInputs(
        case=case,
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32),
        cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32),
        seqlens_k=torch.tensor(case.kv_lens, dtype=torch.int32),
        alibi_slopes=slopes,
        sinks=sinks,
        qv=qv,
        quant=quant,
    )
    if case.backward:
        inputs.dout = grad_out(case, seed)
    if case.cp_world > 1:
        inputs.cp_tot_seqused_k = torch.tensor(cp_case_totals(case), dtype=torch.int32)
    if case.append:
        new_lens = case.new_kv_lens
        idx = (
            torch.cat([torch.arange(cu_k[b + 1] - n, cu_k[b + 1]) for b, n in enumerate(new_lens)])
            if sum(new_lens)
            else torch.zeros(0, dtype=torch.long)
        )
        inputs.k_new, inputs.v_new = k[idx], v[idx]
        if quant is not None:  # an fp8 append: the new keys as stored, with the cache's descales
            assert quant.v is not None, "case validation allows an append with fp8 quant only"
            quant.k_new, quant.v_new = quant.k[idx], quant.v[idx]
        inputs.cu_seqlens_k_new = torch.tensor([0, *itertools.accumulate(new_lens)], dtype=torch.int32)
    if case.paged:
        stored_k = k if quant is None else quant.k
        stored_v = v if quant is None or quant.v is None else quant.v
        k_scales = quant.k_descale if quant is not None and quant.fmt == "int8" else None
        inputs.k_cache, inputs.v_cache, inputs.block_table, k_scale_cache = _paged_cache(
            case, stored_k, stored_v, cu_k, case.cached_kv_lens, gen, k_scales
        )
        if quant is not None:
            quant.k_scale_cache = k_scale_cache
        if case.qv:  # [c_kv | k_rope]: FlashMLA's single cache, SGLang's split of it
            inputs.mla_cache = torch.cat([inputs.v_cache, inputs.k_cache], dim=-1)
    return _to(inputs, torch.device(device))


#: a host tensor up to this size goes to a CUDA device through pinned memory without a wait of its own (pinned blocks
#: stay cached in the process, so a worker pins at most a few cases' worth); a larger one in a blocking copy
PINNED_MAX_BYTES = 16 << 20


def copies_async(value: torch.Tensor) -> bool:
    """Whether :func:`make_inputs` moves the host tensor ``value`` to a CUDA device without waiting for it alone."""
    return value.nbytes <= PINNED_MAX_BYTES


#: the lengths and offsets of :class:`CaseInputs` whose host values :func:`_to` keeps for :func:`host_ints`
_LENGTHS = frozenset({"cu_seqlens_q", "cu_seqlens_k", "seqlens_k", "cu_seqlens_k_new", "cp_tot_seqused_k"})


def clone_known(t: torch.Tensor) -> torch.Tensor:
    """``t.clone()``, whose values :func:`host_ints` knows when it knew ``t``'s (a check's fresh copy of the inputs
    slices by the same lengths without reading them)."""
    out = t.clone()
    known = _known(t)
    if known is not None:
        _HOST_INTS[out] = (out._version, known)
    return out


def _known(t: torch.Tensor) -> tuple[int, ...] | None:
    """``t``'s values as :func:`host_ints` knows them, or None when it does not or ``t`` was written since."""
    entry = _HOST_INTS.get(t)
    return entry[1] if entry is not None and entry[0] == t._version else None


def _host_values(t: torch.Tensor) -> tuple[int, ...] | None:
    """The values of a host 1-D integer tensor about to be moved, for :func:`host_ints`."""
    if t.device.type != "cpu" or t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        return None
    return tuple(int(x) for x in t.tolist())


def _to(inputs: CaseInputs, device: torch.device) -> CaseInputs:
    """Every tensor of ``inputs`` onto ``device``.  To a CUDA device the small ones are copied from pinned memory
    without a wait each (every wait queues behind the other processes sharing the GPU) and the stream is
    synchronised once at the end, so the tensors are complete when this returns, for any stream."""
    pending = False
    for holder in (inputs, inputs.quant) if inputs.quant is not None else (inputs,):
        for name, value in list(vars(holder).items()):
            if isinstance(value, torch.Tensor):
                known = _host_values(value) if name in _LENGTHS else None
                if device.type == "cuda" and value.device.type == "cpu" and copies_async(value):
                    value, pending = value.pin_memory().to(device, non_blocking=True), True
                else:
                    value = value.to(device)
                if known is not None:  # on the CPU too: a run that counts device reads there (scripts/count_ops.py)
                    _HOST_INTS[value] = (value._version, known)
                setattr(holder, name, value)
    if pending:
        torch.cuda.current_stream(device).synchronize()
    return inputs
