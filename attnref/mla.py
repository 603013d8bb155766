"""DeepSeek MLA absorbed attention in its 576-wide spelling, on top of the reference's ``qv`` rule.

Multi-head latent attention caches one compressed latent ``c_kv`` (``latent_dim = 512``) and one
decoupled rotary key ``k_rope`` (``rope_dim = 64``) per token, shared by every query head (a single
kv head).  After absorbing ``W_UK`` into the query (``q_nope_absorbed = q_nope @ W_UK``, 512 wide per
head), every score is::

    s = scale * (q_rope . k_rope + q_nope_absorbed . c_kv)

and the output is ``softmax(s) @ c_kv``: it stays in the latent space (``latent_dim`` wide); the
engine applies ``W_UV`` (and ``W_O``) afterwards.  Two spellings of the same computation:

* FA3's ``qv`` (upstream ``hopper/flash_attn_interface.py``; vLLM's fork calls it ``q_v``; SGLang's
  FlashAttention backend and the MLA backends of vLLM): ``q = q_rope`` (h heads, 64),
  ``k = k_rope`` (1 kv head, 64), ``v = c_kv`` (1 kv head, 512), ``qv = q_nope_absorbed`` (h heads,
  512).  The reference computes it as ``attnref.attention_varlen(..., qv=...)``,
  :func:`attnref.attention_paged` and :func:`attnref.attention_padded`
  (``../shared/SEMANTICS.md`` sections 1, 3 and 9).
* FlashMLA's ``flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v=512, ...)``
  (``../shared/SEMANTICS.md`` section 10): ``q = [q_nope_absorbed (512) | q_rope (64)]`` per head and
  one cache ``(num_blocks, block, 1, 576) = [c_kv (512) | k_rope (64)]`` whose first
  ``head_dim_v = 512`` channels are V.  SGLang splits its 576-wide cache the same way
  (``c_kv = kv_cache[..., :v_head_dim]``, ``k_rope = kv_cache[..., v_head_dim:]``), and vLLM's MLA
  backends (``vllm/v1/attention/backends/mla/``) cache the same ``[kv_c | k_pe]`` (head size 576) as
  ``(num_blocks, block_size, 576)`` without a head dim: ``kv_cache[:, :, None]`` is this module's NHD.

This module is the 576 spelling: :func:`split_latent` cuts a 576-wide tensor into its latent and rope
parts (latent first, in q and in the cache alike: swapping them changes the answer), and
:func:`attention_mla_varlen` / :func:`attention_mla_paged` validate the MLA geometry and delegate to
:func:`attnref.attention_varlen` / :func:`attnref.attention_paged` with ``qv = q[..., :latent_dim]``.

Default scale: with ``qv`` the reference's default is ``1/sqrt(d + dv)`` (upstream FA3's and
FlashMLA's rule).  Here ``d = rope_dim`` and ``dv = latent_dim``, so it is ``1/sqrt(rope_dim +
latent_dim) = 1/sqrt(576)``, FlashMLA's default for its 576-wide query; this module sets no scale of
its own.  It is not DeepSeek's scale: the engines pass ``softmax_scale = 1/sqrt(qk_nope_head_dim +
qk_rope_head_dim) = 1/sqrt(192)`` (times the YaRN ``mscale**2``) explicitly, which is the scale of the
unabsorbed attention the absorbed form must reproduce; pass it as ``AttnOptions(scale=...)``.  vLLM's
FA3 fork defaults to ``q.shape[-1] ** -0.5 = 1/sqrt(rope_dim)`` even with ``q_v`` (its wrapper; measured
on an H100, ``attnfast/fa3_vllm.py``): another reason to compare kernels at an explicit scale.
"""

from __future__ import annotations

import torch

from .options import AttnOptions, Numerics
from .paged import KVLayout, attention_paged, cache_geometry
from .result import AttnResult
from .varlen import attention_varlen

__all__ = ["split_latent", "join_latent", "attention_mla_varlen", "attention_mla_paged"]

#: DeepSeek-V2/V3's geometry: ``kv_lora_rank`` and ``qk_rope_head_dim``.
LATENT_DIM, ROPE_DIM = 512, 64


def _check_dim(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


# no mutate: ``what`` appears only in the rank message, and every caller passing ``rank`` passes ``what``
def _check_tensor(name: str, t: object, rank: int | None = None, what: str = "") -> torch.Tensor:  # pragma: no mutate
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if rank is None and t.dim() == 0:
        raise ValueError(f"{name} must have at least one dim, got a 0-dim tensor")
    if rank is not None and t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dims {what}, got shape {tuple(t.shape)}")
    return t


def split_latent(
    x: torch.Tensor, latent_dim: int, rope_dim: int | None = None, name: str = "x"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x[..., :latent_dim], x[..., latent_dim:])``: the latent (nope / c_kv) and rope parts, as views.

    Args:
        x: (..., latent_dim + rope_dim), latent part first (FlashMLA's and SGLang's order).
        latent_dim: width of the latent part (512 for DeepSeek).
        rope_dim: expected width of the rope part; None = whatever follows the latent part (at least 1).
        name: the argument name used in error messages.

    Raises:
        ValueError naming ``name`` when the last dim is not ``latent_dim + rope_dim``.
    """
    _check_tensor(name, x)
    _check_dim("latent_dim", latent_dim)
    width = x.shape[-1]
    if rope_dim is None:
        if width <= latent_dim:
            raise ValueError(
                f"{name} last dim must be > latent_dim = {latent_dim} (the rope part follows the latent part), "
                f"got {width}"
            )
    else:
        _check_dim("rope_dim", rope_dim)
        if width != latent_dim + rope_dim:
            raise ValueError(
                f"{name} last dim must be latent_dim + rope_dim = {latent_dim} + {rope_dim} = "
                f"{latent_dim + rope_dim}, got {width}"
            )
    return x[..., :latent_dim], x[..., latent_dim:]


def join_latent(latent: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """``torch.cat([latent, rope], -1)``: the 576-wide spelling of a (latent, rope) pair.

    Args:
        latent: (..., latent_dim), e.g. the absorbed ``q_nope`` or ``c_kv``.
        rope: (..., rope_dim), e.g. ``q_rope`` or ``k_rope``, with the same leading dims, dtype, device.
    """
    _check_tensor("latent", latent)
    _check_tensor("rope", rope)
    if latent.shape[:-1] != rope.shape[:-1]:
        raise ValueError(
            f"rope must have latent's leading dims {tuple(latent.shape[:-1])} (all but the last), "
            f"got shape {tuple(rope.shape)}"
        )
    if rope.dtype != latent.dtype:
        raise ValueError(f"rope must have latent's dtype {latent.dtype}, got {rope.dtype}")
    if rope.device != latent.device:
        raise ValueError(f"rope must be on latent's device {latent.device}, got {rope.device}")
    if latent.shape[-1] == 0 or rope.shape[-1] == 0:
        raise ValueError(f"latent and rope last dims must be positive, got {latent.shape[-1]} and {rope.shape[-1]}")
    return torch.cat([latent, rope], dim=-1)


def _check_q(q: torch.Tensor, latent_dim: int, rope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    _check_tensor("q", q, 3, f"(total_q, heads, latent_dim + rope_dim = {latent_dim + rope_dim})")
    q_nope, q_rope = split_latent(q, latent_dim, rope_dim, name="q")
    if q.shape[1] == 0:
        raise ValueError(f"q must have at least one head, got shape {tuple(q.shape)}")
    return q_nope, q_rope


def _check_like_q(name: str, t: torch.Tensor, q: torch.Tensor) -> None:
    if t.dtype != q.dtype:
        raise ValueError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    if t.device != q.device:
        raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")


def _check_one_head(name: str, heads: int, shape: tuple[int, ...], layout: str | None = None) -> None:
    if heads != 1:
        where = "" if layout is None else f" in layout {layout}"
        raise ValueError(
            f"{name} must have 1 kv head (MLA caches a single latent head shared by all query heads), "
            f"got {heads}{where}, shape {shape}"
        )


@torch.no_grad()
def attention_mla_varlen(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    latent_dim: int = LATENT_DIM,
    rope_dim: int = ROPE_DIM,
    options: AttnOptions = AttnOptions(),
    numerics: Numerics = Numerics(),
) -> AttnResult:
    """MLA absorbed attention over a contiguous varlen batch, 576-wide spelling.

    Equals ``attention_varlen(q_rope, k_rope, c_kv, cu_seqlens_q, cu_seqlens_k, qv=q_nope)`` with
    ``q_nope, q_rope = split_latent(q, latent_dim)`` and ``c_kv, k_rope = split_latent(kv, latent_dim)``.

    Args:
        q: (total_q, h, latent_dim + rope_dim) = ``[q_nope_absorbed | q_rope]``.
        kv: (total_k, 1, latent_dim + rope_dim) = ``[c_kv | k_rope]`` (one kv head).
        cu_seqlens_q, cu_seqlens_k: (b + 1,) integer offsets.
        options: causal (bottom-right aligned, for speculative decode and prefill) / window / softcap /
            scale (None = ``1/sqrt(latent_dim + rope_dim)``, see the module docstring) / chunk.
        numerics: accumulation dtype and tile budget.

    Returns:
        ``AttnResult(out (total_q, h, latent_dim), lse (h, total_q))``; ``out`` is in the latent space.
    """
    latent_dim = _check_dim("latent_dim", latent_dim)
    rope_dim = _check_dim("rope_dim", rope_dim)
    q_nope, q_rope = _check_q(q, latent_dim, rope_dim)
    _check_tensor("kv", kv, 3, f"(total_k, 1, latent_dim + rope_dim = {latent_dim + rope_dim})")
    c_kv, k_rope = split_latent(kv, latent_dim, rope_dim, name="kv")
    _check_one_head("kv", kv.shape[1], tuple(kv.shape))
    _check_like_q("kv", kv, q)
    return attention_varlen(
        q_rope, k_rope, c_kv, cu_seqlens_q, cu_seqlens_k, options=options, qv=q_nope, numerics=numerics
    )


@torch.no_grad()
def attention_mla_paged(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seqused_k: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    latent_dim: int = LATENT_DIM,
    rope_dim: int = ROPE_DIM,
    layout: KVLayout = "NHD",
    options: AttnOptions = AttnOptions(),
    numerics: Numerics = Numerics(),
) -> AttnResult:
    """MLA absorbed attention through a block table on one 576-wide cache (FlashMLA's spelling).

    V is the first ``latent_dim`` channels of the cache (FlashMLA's ``head_dim_v``) and the rope key the
    rest; equals ``attention_paged(q_rope, k_rope_cache, c_kv_cache, ..., qv=q_nope)`` on those views.

    Args:
        q: (total_q, h, latent_dim + rope_dim) = ``[q_nope_absorbed | q_rope]``, varlen queries
            delimited by ``cu_seqlens_q``.  FlashMLA's ``(b, s_q, h, 576)`` is ``q.reshape(b * s_q, h,
            576)`` with ``cu_seqlens_q = [0, s_q, 2 s_q, ...]``.
        kv_cache: ``"NHD"`` (num_blocks, block_size, 1, latent_dim + rope_dim) or ``"HND"``
            (num_blocks, 1, block_size, latent_dim + rope_dim) = ``[c_kv | k_rope]``.
        block_table: (b, max_blocks) integer block ids.
        seqused_k: (b,) keys of each sequence (FlashMLA's ``cache_seqlens``).
        cu_seqlens_q: (b + 1,) integer offsets of each sequence's queries.
        options: as in :func:`attention_mla_varlen` (FlashMLA's ``causal`` is bottom-right aligned).

    Returns:
        ``AttnResult(out (total_q, h, latent_dim), lse (h, total_q))``; ``out`` is in the latent space.
    """
    latent_dim = _check_dim("latent_dim", latent_dim)
    rope_dim = _check_dim("rope_dim", rope_dim)
    if layout not in ("NHD", "HND"):
        raise ValueError(f"layout must be 'NHD' or 'HND', got {layout!r}")
    q_nope, q_rope = _check_q(q, latent_dim, rope_dim)
    dims = "block_size, 1" if layout == "NHD" else "1, block_size"
    _check_tensor("kv_cache", kv_cache, 4, f"(num_blocks, {dims}, latent_dim + rope_dim) in layout {layout}")
    _, _, heads, _ = cache_geometry(kv_cache, layout)
    c_kv, k_rope = split_latent(kv_cache, latent_dim, rope_dim, name="kv_cache")
    _check_one_head("kv_cache", heads, tuple(kv_cache.shape), layout)
    _check_like_q("kv_cache", kv_cache, q)
    return attention_paged(
        q_rope,
        k_rope,
        c_kv,
        block_table,
        seqused_k,
        cu_seqlens_q,
        layout=layout,
        options=options,
        qv=q_nope,
        numerics=numerics,
    )
