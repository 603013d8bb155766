"""An fp32 model of FA2 2.8.3's forward LSE arithmetic on its causal ALiBi path (CPU, no kernel).

Read from ``csrc/flash_attn/src`` at tag v2.8.3 (``flash_fwd_kernel.h`` ``compute_attn_1rowblock_splitkv`` and
``combine_attn_seqk_parallel``, ``mask.h``, ``softmax.h``, ``flash_api.cpp``); every value the kernel holds in fp32 is
held here as an fp64 tensor rounded to fp32 (:func:`f32`) at each point where the kernel rounds:

* ``alibi_slope = slope / scale_softmax`` (in the kernel, before the scale multiplies the scores);
* the biased score ``s_j = q.k_j + alibi_slope * j`` (``mask.h``: ``+=``; one rounding when fused into an FMA, two
  when not), ``-inf`` past the causal diagonal ``j > i + sk - sq``;
* per key block of 256 (d <= 64), walked from the last block down: the running row max ``m``,
  ``max_scaled = m * scale_log2``, ``p_j = exp2(s_j * scale_log2 - max_scaled)``, the running sum rescaled by
  ``exp2((m_prev - m) * scale_log2)``;
* per split: ``lse = m * scale_softmax + log(sum)`` (``normalize_softmax_lse``);
* across splits (``num_splits > 1``): ``lse_max + log(sum exp(lse_s - lse_max))``.

The q.k products are exact (fp16 inputs, fp64 sums) and rounded once: the kernel's fp32 accumulation order changes
them by O(1e-7), far below what the ALiBi bias's magnitude costs.  ``exp2``/``log`` are correctly rounded here
(the kernel's fast-math versions are off by a few fp32 ulps of O(1) values, again far below).  A model, not the
kernel: it reproduces the size of the LSE's rounding error, and its bits only where the orders of summation the
model cannot know do not matter.
"""

from __future__ import annotations

import math

import torch

__all__ = ["KEY_BLOCK", "f32", "fa2_causal_alibi_lse", "num_splits_heuristic"]

#: FA2's split-KV key block for head dims <= 64 (``set_params_splitkv``: 256, 128 up to d128, else 64).
KEY_BLOCK = 256


def f32(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to fp32 (to nearest), held as fp64."""
    return x.to(torch.float32).to(torch.float64)


def num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int = 128) -> int:
    """``flash_api.cpp``'s ``num_splits_heuristic`` (2.8.3), called with ``num_sms = 2 x`` the device's SMs."""
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)

    def eligible(n: int) -> bool:
        return n == 1 or -(-num_n_blocks // n) != -(-num_n_blocks // (n - 1))

    eff = []
    for n in range(1, max_splits + 1):
        waves = batch_nheads_mblocks * n / num_sms
        eff.append(waves / math.ceil(waves) if eligible(n) else 0.0)
    best = max(eff)
    return next((n for n in range(1, max_splits + 1) if eligible(n) and eff[n - 1] >= 0.85 * best), 1)


def fa2_causal_alibi_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    slopes: torch.Tensor,
    scale: float,
    seqlen_k_max: int,
    num_splits: int,
    *,
    fused: bool = True,
    slope_ulps: int = 0,
) -> torch.Tensor:
    """``(h, sq)`` LSE in FA2's causal ALiBi convention (fp32 values as fp64) of one request.

    ``q (sq, h, d)`` and ``k (sk, hk, d)`` are the kernel's fp16/bf16 inputs, ``slopes (h,)`` fp32, ``scale`` the
    softmax scale (rounded to fp32 as the kernel's ``params.scale_softmax``), ``seqlen_k_max`` the call's
    ``seqlen_k`` (the cache width for ``flash_attn_with_kvcache``: it sizes the splits), ``num_splits`` the split
    count.  ``fused``: each ``a * b + c`` the kernel writes is one rounding (an FMA, nvcc's default) or two.
    ``slope_ulps``: the slope division off by that many fp32 ulps (the fast-math division is within 2).
    """
    sq, h, _ = q.shape
    sk, hk = k.shape[0], k.shape[1]
    qd = q.to(torch.float64).permute(1, 0, 2)  # (h, sq, d)
    kd = k.to(torch.float64).repeat_interleave(h // hk, dim=1).permute(1, 0, 2)  # (h, sk, d)
    acc = f32(qd @ kd.transpose(1, 2))  # (h, sq, sk): the fp32 q.k accumulator
    scale32 = f32(torch.tensor(scale, dtype=torch.float64))
    scale_log2 = f32(scale32 * math.log2(math.e))  # params.scale_softmax_log2 = softmax_scale * M_LOG2E
    slope = f32(f32(slopes.to(torch.float64)) / scale32)
    if slope_ulps:
        slope = torch.nextafter(slope.float(), torch.full_like(slope.float(), math.copysign(math.inf, slope_ulps)))
        for _ in range(abs(slope_ulps) - 1):
            slope = torch.nextafter(slope, torch.full_like(slope, math.copysign(math.inf, slope_ulps)))
        slope = slope.double()
    cols = torch.arange(sk, dtype=torch.float64)
    bias = slope[:, None, None] * cols[None, None, :]
    s = f32(acc + bias) if fused else f32(acc + f32(bias))
    rows = torch.arange(sq)
    visible = cols[None, :] <= (rows[:, None] + sk - sq)  # (sq, sk)
    s = torch.where(visible[None], s, -math.inf)

    n_blocks = -(-seqlen_k_max // KEY_BLOCK)
    per_split = -(-n_blocks // num_splits)
    last_block = -(-sk // KEY_BLOCK)  # causal: sq <= 64 rows, so the diagonal never ends a request's blocks early
    split_lse = []
    for split in range(num_splits):
        lo, hi = split * per_split, min(last_block, (split + 1) * per_split)
        if lo >= hi:
            split_lse.append(torch.full((h, sq), -math.inf, dtype=torch.float64))
            continue
        m = torch.full((h, sq), -math.inf, dtype=torch.float64)
        total = torch.zeros((h, sq), dtype=torch.float64)
        for block in range(hi - 1, lo - 1, -1):
            sb = s[:, :, block * KEY_BLOCK : min(sk, (block + 1) * KEY_BLOCK)]
            m_new = torch.maximum(m, sb.amax(dim=-1))
            m_cur = torch.where(torch.isneginf(m_new), 0.0, m_new)  # Check_inf
            if block != hi - 1:  # softmax_rescale_o, not the first block
                rescale = torch.exp2(f32(f32(torch.where(torch.isneginf(m), -math.inf, m - m_cur)) * scale_log2))
                total = f32(total * f32(rescale))
            max_scaled = f32(m_cur * scale_log2)
            arg = (
                f32(sb * scale_log2 - max_scaled[..., None])
                if fused
                else f32(f32(sb * scale_log2) - max_scaled[..., None])
            )
            p = f32(torch.exp2(arg))
            total = f32(total + f32(p.sum(dim=-1)))
            m = m_new
        log_sum = f32(torch.log(total))
        m_scaled = m * scale32 if fused else f32(m * scale32)
        lse = torch.where(total > 0, f32(m_scaled + log_sum), -math.inf if num_splits > 1 else math.inf)
        split_lse.append(lse)
    if num_splits == 1:
        return split_lse[0]
    stack = torch.stack(split_lse)  # (splits, h, sq)
    lse_max = stack.amax(dim=0)
    lse_max = torch.where(torch.isneginf(lse_max), 0.0, lse_max)
    lse_sum = f32(f32(torch.exp(f32(stack - lse_max))).sum(dim=0))
    return torch.where(lse_sum > 0, f32(f32(torch.log(lse_sum)) + lse_max), math.inf)
