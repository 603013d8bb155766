"""``peer-fa3``: the parametrizations of FA3's own Hopper tests, run through this harness's verdict.

Source: ``hopper/test_flash_attn.py`` of vLLM's FA3 fork (vllm-project/flash-attention) at commit
``803020a8fa15407871341d41eba4919ade2ee1ee``, the ``GIT_TAG`` vLLM v0.24.0 pins
(``cmake/external_projects/vllm_flash_attn.cmake`` of the vllm-0.24.0 sdist) and so the kernel the ``fa3-vllm``
backend runs; the file is the one last changed at ``5824e6e2`` (2026-01-16) and unchanged up to the fork's
2026-08-06 head.  Upstream's copy (Dao-AILab/flash-attention, newest tag fa4-v4.0.0.beta27) lacks the fork's sinks
(``s_aux``) and context-parallel (``cp_*``) parameters.  The file's module flags fix ``DISABLE_BACKWARD = True``
(forward only: ``deterministic`` has no effect) and ``DISABLE_HDIMDIFF64 = True`` (``has_qv`` is never set, so
``COMPILED_HDIMS`` is 64, 96, 128, 192, 256 and head dim 64 runs ``dv`` 64 only); head dim 192 runs ``dv`` 128 and
192 (``DISABLE_HDIMDIFF192`` off) except with sinks.  Three tests, one batch label each (``--case '*_peerfa3out_*'``
picks one):

``test_flash_attn_output`` (``peerfa3out``, ``flash_attn_func``), ``test_flash_attn_varlen_output`` (``peerfa3var``,
``flash_attn_varlen_func``), ``test_flash_attn_kvcache`` (``peerfa3kv``, ``flash_attn_with_kvcache``).  Each test's
values (dtypes, heads, masks, head dims, lengths, splits, paging, appends) and how a case spells its new keys
(:func:`~conformance.cases.case.append_fields`) are listed in ``docs/concepts/cases.md`` (*peer-fa3's values*); the
grid below is the authority.  The appends the case model took later (:func:`_late_append`) come after every other
point, the uneven ones last, so the earlier cases keep their ids and their order.

Left out, each with its reason.  Every test: ``pack_gqa`` (the inner loop's False / True: not a case field, the
adapter lets the kernel choose; each case stands for both).  Output: the ``cp_tot_seqlen_k_offset`` (the harness
derives each sequence's total from its keys, ``max(0, kv_len * world + rank - b % world)``, so a batch meets every
remainder; the test's (8, 0, 1) gives rank 0 a total of ``8 * seqlen_k + 1``, whose shard holds one key more than
the call passes, a call the harness refuses as inconsistent); context parallelism without ``causal`` (the case
model refuses it: the kernel applies ``cp_*`` in its causal mask only; kept as refused points).  Varlen:
``add_unused_qkv=True`` (tokens inside ``cu_seqlens`` past ``seqused_q`` / ``seqused_k``: the case model has no
unused tokens).  Kvcache: ``rotary_fraction`` 0.5, 1 (rotary embedding is not attention; ``has_rotary_seqlens``
then only False, and ``rotary_interleaved`` has no effect: one case for both values); ``has_leftpad`` (no left
padding); ``has_batch_idx`` (no cache batch index: the cache rows read are the case's own sequences); the repeated
call that tests metadata reuse (one call here); ``seqlen_new_eq_seqlen_q=False`` without ``new_kv`` is the
call with True (:data:`~conformance.suites.peers.grid.SAME_CALL`; the test computes that call's scheduler metadata
with ``max_seqlen_k_new = seqlen_new``, the adapter from the call).  Inputs are this harness's (its own descales,
sinks and stale cache slots), never the test's numbers: the values are the grid's, not the data.

Backends: ``fa3-vllm`` (the fork itself: it refuses ``append``), ``fa3`` (upstream FA3: it runs the 16-bit appends,
short and uneven ones included, and declares no sinks, context parallelism, fp8, the fp8 appends included, nor scheduler
metadata); any adapter runs the cases it accepts (``sdpa-*`` and ``flex-cpu`` every append).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from conformance.cases.case import AttentionCase, CaseError, append_fields
from conformance.suites.peers.grid import SAME_CALL, Dropped, PeerSuite, Point, walk, walk_part

__all__ = ["FA3_SOURCE", "PEER_FA3"]

FA3_SOURCE = (
    "vllm-project/flash-attention 803020a8fa15407871341d41eba4919ade2ee1ee (vLLM v0.24.0's pin), "
    "hopper/test_flash_attn.py: test_flash_attn_output, test_flash_attn_varlen_output, test_flash_attn_kvcache"
)

DTYPES = ("bf16", "fp16", "fp8_e4m3")
HEAD_DIMS = (64, 96, 128, 192, 256)  # COMPILED_HDIMS
MHA_TYPES = ("mha", "mqa", "gqa")
OUTPUT_SEQLENS = (
    (1, 1), (64, 128), (128, 192), (256, 256), (239, 1), (799, 3), (113, 203), (113, 128), (128, 217), (113, 211),
    (108, 256), (256, 512), (384, 256), (640, 128), (512, 256), (1024, 1024), (1023, 1024), (1024, 1023),
    (4096, 4096), (4224, 4224),
)  # fmt: skip
#: ``(cp_world_size, cp_rank, cp_tot_seqlen_k_offset)``
OUTPUT_CP = ((8, 0, 1), (8, 7, 0), (4, 3, 2), (2, 0, 0), (1, 0, 0))
VARLEN_SEQLENS = (
    (1, 1), (1, 3), (2, 1), (511, 1), (3, 513), (64, 128), (128, 128), (256, 256), (113, 203), (128, 217),
    (113, 211), (108, 256), (256, 512), (307, 256), (640, 128), (512, 256), (1024, 1024), (1023, 1024),
    (1024, 1023), (2048, 2048),
)  # fmt: skip
KVCACHE_SEQLENS = (
    (1, 128), (1, 339), (3, 1024), (64, 800), (64, 256), (3, 799), (64, 2048), (16, 20000), (128, 128), (256, 512),
    (2048, 3577),
)  # fmt: skip
KVCACHE_PAGE_SIZES = (None, 1, 4, 128)
KVCACHE_CAUSAL_LOCAL = ((False, False), (True, False), (False, True))


def _kv_heads(mha_type: str, h: int, gqa: int) -> int:
    return h if mha_type == "mha" else (gqa if mha_type == "gqa" else 1)


def _dtype_fields(dtype: str, descale: str | None) -> dict:
    if dtype == "fp8_e4m3":
        return {"dtype": "bf16", "quant": "fp8_e4m3", "descale": descale}
    return {"dtype": dtype}


def _dv_runs(d: int, dv: int | None, sink: bool) -> bool:
    """Whether the inner ``dv_vals`` loop of the output and varlen tests runs value head dim ``dv`` (128, or None
    for ``d``): ``[128, d]`` at head dim 192 without sinks, else ``[d]`` (``DISABLE_HDIMDIFF64`` set)."""
    return dv is None or (d == 192 and not sink)


def _window(rng: random.Random, local: bool, causal: bool, span: int) -> tuple[int | None, int | None]:
    """``torch.randint(0, span, (2,))`` sides; causal keeps the left one and 0 (the kernel's and the test's rule)."""
    if not local:
        return (None, None)
    left, right = rng.randrange(span), rng.randrange(span)
    return (left, 0) if causal else (left, right)


def _splits(num_splits: int) -> int | None:
    return None if num_splits == 0 else num_splits


# --------------------------------------------------------------------------- test_flash_attn_output
def _output_case(
    cp: tuple[int, int, int], seqlens: tuple[int, int], test_sink: bool, d: int, causal: bool, local: bool,
    softcap: float, mha_type: str, dtype: str, dv: int | None, num_splits: int,
) -> AttentionCase | None:  # fmt: skip
    world, rank, offset = cp
    if world > 1 and local:
        return None  # the test's own skip
    if not _dv_runs(d, dv, test_sink):
        return None  # not in this head dim's dv_vals
    sq, sk = seqlens
    rng = random.Random(f"peer-fa3-output:{cp}:{seqlens}:{test_sink}:{d}:{causal}:{local}:{softcap}:{mha_type}:{dtype}")
    return AttentionCase(
        ((sq, sk),) * (9 if sk <= 2048 else 2),
        num_heads=16,
        num_kv_heads=_kv_heads(mha_type, 16, 2),
        head_dim=d,
        head_dim_v=dv,
        causal=causal,
        window=_window(rng, local, causal, sk * world + offset),
        softcap=softcap or None,
        sinks=test_sink,
        num_splits=_splits(num_splits),
        cp_world=world,
        cp_rank=rank,
        batch_name="peerfa3out",
        **_dtype_fields(dtype, "head"),
    )


def output_points() -> Iterator[Point]:
    axes = (
        ("cp", OUTPUT_CP),
        ("seqlens", OUTPUT_SEQLENS),
        ("test_sink", (False, True)),
        ("d", HEAD_DIMS),
        ("causal", (False, True)),
        ("local", (False, True)),
        ("softcap", (0.0, 15.0)),
        ("mha_type", MHA_TYPES),
        ("dtype", DTYPES),
        ("dv", (128, None)),  # the inner dv_vals loop: 128 at head dim 192 without sinks, None for d
        ("num_splits", (1, 3)),
    )
    yield from walk("test_flash_attn_output", axes, _output_case)


# --------------------------------------------------------------------------- test_flash_attn_varlen_output
def _varlen_case(
    seqlens: tuple[int, int], test_sink: bool, d: int, causal: bool, local: bool, softcap: float, mha_type: str,
    dtype: str, dv: int | None, num_splits: int,
) -> AttentionCase | None:  # fmt: skip
    if not _dv_runs(d, dv, test_sink):
        return None  # not in this head dim's dv_vals
    sq, sk = seqlens
    rng = random.Random(f"peer-fa3-varlen:{seqlens}:{test_sink}:{d}:{causal}:{local}:{softcap}:{mha_type}:{dtype}")
    window = _window(rng, local, causal, sk)
    batch = 9  # seqlen_q <= 2048 throughout
    q_lens = [rng.randint(max(1, sq - 20), sq) for _ in range(batch)]
    k_lens = [0 if b % 5 == 0 or b == batch - 1 else rng.randint(max(0, sk - 20), sk) for b in range(batch)]
    return AttentionCase(
        tuple(zip(q_lens, k_lens)),
        num_heads=6,
        num_kv_heads=_kv_heads(mha_type, 6, 2),
        head_dim=d,
        head_dim_v=dv,
        causal=causal,
        window=window,
        softcap=softcap or None,
        sinks=test_sink,
        num_splits=_splits(num_splits),
        batch_name="peerfa3var",
        **_dtype_fields(dtype, "head"),
    )


def varlen_points() -> Iterator[Point]:
    axes = (
        ("seqlens", VARLEN_SEQLENS),
        ("test_sink", (False, True)),
        ("d", HEAD_DIMS),
        ("causal", (False, True)),
        ("local", (False, True)),
        ("softcap", (0.0, 15.0)),
        ("mha_type", MHA_TYPES),
        ("dtype", DTYPES),
        ("dv", (128, None)),
        ("num_splits", (1, 3, 0)),
    )
    yield from walk("test_flash_attn_varlen_output", axes, _varlen_case)


# --------------------------------------------------------------------------- test_flash_attn_kvcache
def _late_append(varlen_q: bool, seqlen_new_eq_seqlen_q: bool, new_kv: bool, dtype: str, **_: object) -> bool:
    """Whether a point is one of the appends the case model took after this grid's first cases (``append_len``, the
    fp8 append): an append of other than ``seqlen_q`` new keys (``seqlen_new_eq_seqlen_q=False``, or ``varlen_q``
    with the new keys' own padding mask) or into an fp8 cache.  :func:`kvcache_points` walks them after every other
    point, so that the earlier cases keep their ids and their order (``--shard``)."""
    return new_kv and (not seqlen_new_eq_seqlen_q or varlen_q or dtype == "fp8_e4m3")


def _kvcache_case(
    seqlens: tuple[int, int], varlen_q: bool, page_size: int | None, seqlen_new_eq_seqlen_q: bool,
    causal_local: tuple[bool, bool], new_kv: bool, mha_type: str, dtype: str, num_splits: int,
    precompute_metadata: bool,
) -> AttentionCase | None:  # fmt: skip
    sq, sk = seqlens
    causal, local = causal_local
    if page_size is not None and sk % page_size != 0:
        return None  # the test's own skips
    if sq > sk and new_kv:
        return None
    short = not seqlen_new_eq_seqlen_q
    if short and not new_kv:
        raise Dropped(SAME_CALL)  # seqlen_new only sizes new keys, and there are none
    # the draws are the test's, per combination of its parameters (num_splits and precompute_metadata are its inner
    # loops over one set of inputs); seqlen_new_eq_seqlen_q=False draws from a generator of its own
    key = f"{seqlens}:{varlen_q}:{page_size}:{causal_local}:{new_kv}:{mha_type}:{dtype}"
    rng = random.Random(f"peer-fa3-kvcache-short:{key}" if short else f"peer-fa3-kvcache:{key}")
    window = _window(rng, local, causal, sk)
    batch = 5
    q_lens = [rng.randint(max(1, sq - 20), sq) for _ in range(batch)] if varlen_q else [sq] * batch
    # seqlen_new = seqlen_q if seqlen_new_eq_seqlen_q else torch.randint(1, seqlen_q + 1, (1,)).item()
    seqlen_new = rng.randint(1, sq) if short else sq
    if short and seqlen_new == sq:
        raise Dropped(SAME_CALL)  # that draw is the seqlen_new_eq_seqlen_q=True point's call
    new = [seqlen_new if new_kv else 0] * batch
    if new_kv and varlen_q:  # "k & v are also varlen": generate_random_padding_mask(seqlen_new, ..., mode="random")
        new = [rng.randint(max(1, seqlen_new - 20), seqlen_new) for _ in range(batch)]
    hi = (sk - seqlen_new + 1) if new_kv else (sk + 1)
    cache = [rng.randrange(0 if new_kv else 1, hi) for _ in range(batch)]
    return AttentionCase(
        tuple((q, c + n) for q, c, n in zip(q_lens, cache, new)),  # key_padding_mask: cache_seqlens + new keys
        num_heads=6,
        num_kv_heads=_kv_heads(mha_type, 6, 3),
        head_dim=128,
        causal=causal,
        window=window,
        append=new_kv,
        **(append_fields(q_lens, new) if new_kv else {}),
        num_splits=_splits(num_splits),
        scheduler_metadata=precompute_metadata,
        kv_layout="contiguous" if page_size is None else "NHD",
        block_size=page_size,
        batch_name="peerfa3kv",
        **_dtype_fields(dtype, None),
    )


def _even_case(**point: object) -> AttentionCase | None:
    """The point's case unless it is an uneven append (``append_lens``: the new keys the case model took last)."""
    case = _kvcache_case(**point)  # type: ignore[arg-type]
    return None if case is not None and case.append_lens else case


def _uneven_case(**point: object) -> AttentionCase | None:
    """The point's case if it is an uneven append, else None (the point is walked by :func:`_even_case`)."""
    try:
        case = _kvcache_case(**point)  # type: ignore[arg-type]
    except (Dropped, CaseError):
        return None
    return case if case is not None and case.append_lens else None


def kvcache_points() -> Iterator[Point]:
    """Every point of ``test_flash_attn_kvcache``'s grid, in three parts, each in grid order: those that are not
    :func:`_late_append`; those that are, but for the uneven appends (``append_lens``); the uneven appends (the
    case model took them last: every earlier case keeps its id and its place)."""
    axes = (
        ("seqlens", KVCACHE_SEQLENS),
        ("varlen_q", (False, True)),
        ("page_size", KVCACHE_PAGE_SIZES),
        ("seqlen_new_eq_seqlen_q", (True, False)),
        ("causal_local", KVCACHE_CAUSAL_LOCAL),
        ("new_kv", (False, True)),
        ("mha_type", MHA_TYPES),
        ("dtype", ("bf16", "fp8_e4m3")),
        ("num_splits", (1, 3, 0)),
        ("precompute_metadata", (False, True)),
    )
    yield from walk_part("test_flash_attn_kvcache", axes, _kvcache_case, lambda **p: not _late_append(**p))
    yield from walk_part("test_flash_attn_kvcache", axes, _even_case, _late_append)
    yield from walk_part("test_flash_attn_kvcache", axes, _uneven_case, _late_append)


def points() -> Iterator[Point]:
    yield from output_points()
    yield from varlen_points()
    yield from kvcache_points()


PEER_FA3 = PeerSuite("peer-fa3", FA3_SOURCE, ("fa3-vllm", "fa3"), points)
