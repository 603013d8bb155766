"""CPU fakes of vLLM 0.24.0's kernel entry points, for the translation tests of ``fa3-vllm`` and ``flashmla``.

They implement the conventions measured on an H100 with ``scripts/probe_vllm_kernels.py`` (the argument
checks and their messages, the fork's default scale ``q.shape[-1] ** -0.5``, per-(batch, kv head) fp8
descales, ``+inf`` LSE for a batch without keys, FlashMLA's 576-wide query and cache whose first 512
channels are V) and compute with :mod:`attnref` on the dequantized values.  An adapter that passes
through a fake hands the kernel what the kernel documents; whether the kernel then computes it is the
GPU tests' business.
"""

from __future__ import annotations

import math
import types

import torch

from attnref import AttnOptions, ContextParallel, Numerics, Window, attention_varlen, window_from_fa2

FP8 = torch.float8_e4m3fn


def _per_token(scale: torch.Tensor | None, lens: list[int], groups: int = 1) -> torch.Tensor | float:
    """A ``(batch, hk)`` descale as ``(tokens, heads, 1)`` factors (``groups`` query heads per kv head)."""
    if scale is None:
        return 1.0
    rows = torch.repeat_interleave(scale.float(), torch.tensor(lens, dtype=torch.long), dim=0)
    return rows.repeat_interleave(groups, dim=1)[..., None]


def _gather(cache: torch.Tensor, table: torch.Tensor, lens: list[int]) -> tuple[torch.Tensor, list[int]]:
    """Keys of every sequence from an NHD-shaped (possibly strided) cache, packed; and their cu_seqlens."""
    page = cache.shape[1]
    parts = []
    for b, n in enumerate(lens):
        blocks = table[b, : -(-n // page)].long()
        parts.append(cache[blocks].reshape(-1, *cache.shape[2:])[:n])
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.cat(parts), cu


def make_fake_vllm_fa3() -> types.ModuleType:
    """A fake ``vllm.vllm_flash_attn`` (``flash_attn_varlen_func``, ``get_scheduler_metadata``)."""
    mod = types.ModuleType("vllm.vllm_flash_attn")
    mod.calls = []

    def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                               cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None,
                               cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                               causal=False, window_size=(-1, -1), has_softcap=False, num_splits=0, pack_gqa=None,
                               sm_margin=0):  # fmt: skip
        mod.calls.append(("get_scheduler_metadata", dict(locals())))
        return torch.zeros(batch_size + 1, dtype=torch.int32)

    def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None, seqused_k=None,
                               q_v=None, dropout_p=0.0, softmax_scale=None, causal=False, window_size=None,
                               softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                               block_table=None, return_softmax_lse=False, out=None, scheduler_metadata=None,
                               q_descale=None, k_descale=None, v_descale=None, num_splits=0, output_scale=None,
                               fa_version=2, s_aux=None, cp_world_size=1, cp_rank=0, cp_tot_seqused_k=None,
                               mask_mod=None, aux_tensors=None, dynamic_causal=None):  # fmt: skip
        mod.calls.append(("flash_attn_varlen_func", dict(locals())))
        assert (cu_seqlens_k is None) != (seqused_k is None), "exactly one of cu_seqlens_k and seqused_k"
        assert block_table is None or seqused_k is not None, "seqused_k must be provided if block_table is provided"
        assert fa_version == 3, "the kit has no FA2 library: fa_version=3"
        assert alibi_slopes is None, "Alibi is not supported in FA3"
        if q.dtype not in (torch.float16, torch.bfloat16, FP8):
            raise RuntimeError("FlashAttention only supports fp16, bf16, and fp8_e4m3 data type")
        if q.dtype != k.dtype:
            raise RuntimeError("query and key must have the same dtype")
        cu_q = [int(x) for x in cu_seqlens_q.tolist()]
        batch, h, hk = len(cu_q) - 1, q.shape[1], k.shape[-2]
        for name, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
            if d is not None and tuple(d.shape) != (batch, hk):
                raise RuntimeError(f"{name} must have shape (batch_size, num_heads_k)")
        if q.dtype == FP8 and v.shape[-1] > 256:
            raise RuntimeError("HeaddimV > 256 requires fp16 and bf16 data type")
        if s_aux is not None and s_aux.dtype != torch.bfloat16:
            raise RuntimeError("We only support bf16 dtype for S aux.")
        if block_table is not None:
            lens = [int(x) for x in seqused_k.tolist()]
            k, cu_k = _gather(k, block_table, lens)
            v, _ = _gather(v, block_table, lens)
        else:
            cu_k = [int(x) for x in cu_seqlens_k.tolist()]
            lens = [b - a for a, b in zip(cu_k, cu_k[1:])]
        q_lens = [b - a for a, b in zip(cu_q, cu_q[1:])]
        qd = q.float() * _per_token(q_descale, q_lens, h // hk)
        qvd = None if q_v is None else q_v.float() * _per_token(q_descale, q_lens, h // hk)
        kd, vd = k.float() * _per_token(k_descale, lens), v.float() * _per_token(v_descale, lens)
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** (-0.5)
        wl, wr = window_size if window_size is not None else (-1, -1)
        # context parallel, from the fork's source (flash_api.cpp's checks, mask.h's causal-only rule): not measured
        if cp_world_size <= 0 or (cp_world_size == 1 and cp_rank != 0):
            raise RuntimeError(
                "cp_world_size must be positive; when context parallelism is disabled, cp_rank must be zero"
            )
        if cp_world_size > 1 and cp_tot_seqused_k is None:
            raise RuntimeError("cp_tot_seqused_k_ must be provided when context parallelism is enabled.")
        if cp_world_size > 1 and wl >= 0:
            raise RuntimeError("Local attention (sliding window) is not currently supported with context parallelism")
        cp = ContextParallel(cp_world_size, cp_rank) if cp_world_size > 1 and causal else None
        tot = None if cp is None else cp_tot_seqused_k.cpu()
        opts = AttnOptions(causal=causal, window=window_from_fa2(wl, 0 if causal else wr), softcap=softcap or None,
                           scale=scale, cp=cp)  # fmt: skip
        res = attention_varlen(qd, kd, vd, torch.tensor(cu_q), torch.tensor(cu_k), options=opts,
                               sinks=None if s_aux is None else s_aux.float(), qv=qvd,
                               numerics=Numerics(torch.float32), cp_tot_seqused_k=tot)  # fmt: skip
        lse = res.lse.float()
        if sum(lens) == 0:
            lse.fill_(math.inf)  # measured: +inf when the batch has no key at all
        o = res.out.to(torch.bfloat16 if q.dtype == FP8 else q.dtype)
        return (o, lse) if return_softmax_lse else o

    mod.flash_attn_varlen_func = flash_attn_varlen_func
    mod.get_scheduler_metadata = get_scheduler_metadata
    return mod


def make_fake_flashmla() -> types.ModuleType:
    """A fake ``vllm.third_party.flashmla.flash_mla_interface`` (dense decode)."""
    mod = types.ModuleType("vllm.third_party.flashmla.flash_mla_interface")
    mod.calls = []

    class SchedMeta:
        have_initialized = False

    def get_mla_metadata(*args, **kwargs):
        return SchedMeta(), None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                               attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                               extra_topk_length=None, out=None):  # fmt: skip
        mod.calls.append(("flash_mla_with_kvcache", dict(locals())))
        assert isinstance(tile_scheduler_metadata, SchedMeta), (
            "tile_scheduler_metadata must be of type FlashMLASchedMeta"
        )
        assert num_splits is None, "num_splits must be None"
        if k_cache.shape[1] != 64:
            raise RuntimeError("Currently page_block_size must be 64")
        if q.dtype != k_cache.dtype:
            raise RuntimeError("query and key must have the same dtype")
        b, sq, h, width = q.shape
        lens = [int(x) for x in cache_seqlens.tolist()]
        kv, cu_k = _gather(k_cache, block_table, lens)
        scale = softmax_scale if softmax_scale is not None else width ** (-0.5)
        opts = AttnOptions(causal=causal, window=Window(), scale=scale)
        res = attention_varlen(q.reshape(b * sq, h, width).float(), kv.float(), kv[..., :head_dim_v].float(),
                               torch.arange(b + 1) * sq, torch.tensor(cu_k), options=opts,
                               numerics=Numerics(torch.float32))  # fmt: skip
        lse = res.lse.reshape(h, b, sq).permute(1, 0, 2).contiguous()
        lse = lse.masked_fill(lse == -math.inf, math.inf)  # measured: +inf for rows that see no key
        return res.out.reshape(b, sq, h, head_dim_v).to(q.dtype), lse

    mod.get_mla_metadata = get_mla_metadata
    mod.flash_mla_with_kvcache = flash_mla_with_kvcache
    return mod
