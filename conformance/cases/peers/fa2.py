"""``peer-fa2-kvcache``: the parametrization of ``test_flash_attn_kvcache`` in flash-attention's
``tests/test_flash_attn.py`` at tag v2.8.3 (the FA2 the GPU kit installs), run through this harness's verdict.

Values: dtype fp16; ``num_splits`` 1 and 0 (the kernel's heuristic: ``None`` here); ``mha_type`` mha / mqa / gqa at 6
query heads (6, 1, 3 KV heads); ``new_kv`` (an append: ``append=True``); ``alibi``; ``local`` (a window of
``torch.randint(0, seqlen_k, (2,))`` sides, drawn here from a seeded generator per combination); ``causal``;
``paged_kv_block_size`` None and 256; ``d`` 32, 59, 64, 80, 128, 256; ``(seqlen_q, seqlen_k)`` from its list; batch 2
with ``cache_seqlens`` drawn as the test draws them (``randint(0 if new_kv else 1, seqlen_k - seqlen_new + 1 if
new_kv else seqlen_k + 1)``), seeded here; a causal window keeps its left side and 0 on the right, as
``flash_attn_interface`` sets it.  The test's own skip (``seqlen_q > seqlen_k`` with ``new_kv``) has no point.

Left out, each for a reason the suite cannot express or afford: ``rotary_fraction`` > 0 (rotary embedding is not
attention: the case model has no rotary), ``has_leftpad`` (no left padding of the cache), the random per-batch ALiBi
slopes (``alibi`` uses the standard slopes), and the two pairs with 128k keys (``(1, 131072)``, ``(16, 131072)``: the
inputs are drawn on the CPU so that a case has the same numbers on every device, 1.6 GB a tensor there).
Combinations the case model refuses would be kept as points without a case (:mod:`conformance.cases.peers.grid`);
this grid has none (the tests check).

``seqlen_new_eq_seqlen_q=False`` (an append of ``seqlen_new = randint(1, seqlen_q + 1)`` new keys, fewer than the
query tokens when it draws below ``seqlen_q``): the appending combinations again, after every case above (their ids
unchanged), each with ``seqlen_new`` and the cache lengths drawn from a generator of its own and made a short append
(``append_len = seqlen_new``, ``kv_len = cache_seqlens + seqlen_new``: the test's ``key_padding_mask``); a draw of
``seqlen_new == seqlen_q`` is the ``True`` case already there and has no point of its own.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from conformance.cases.case import AttentionCase
from conformance.cases.peers.grid import PeerSuite, Point, walk

__all__ = ["FA2_KVCACHE_SOURCE", "PEER_FA2_KVCACHE", "peer_fa2_kvcache"]

#: Where the grid comes from.
FA2_KVCACHE_SOURCE = "Dao-AILab/flash-attention v2.8.3, tests/test_flash_attn.py, test_flash_attn_kvcache"

SEQLENS = ((1, 128), (1, 339), (3, 1024), (64, 800), (64, 256), (3, 799), (64, 2048), (16, 20000), (128, 128))
HEAD_DIMS = (32, 59, 64, 80, 128, 256)
HEADS = {"mha": (6, 6), "mqa": (6, 1), "gqa": (6, 3)}


def _kvcache_case(
    seqlens: tuple[int, int], d: int, paged: int | None, causal: bool, local: bool, alibi: bool, new_kv: bool,
    mha_type: str, num_splits: int, seqlen_new_eq_seqlen_q: bool = True,
) -> AttentionCase | None:  # fmt: skip
    sq, sk = seqlens
    if sq > sk and new_kv:
        return None  # the test's own skip
    short = not seqlen_new_eq_seqlen_q
    if short and not new_kv:
        return None  # without an append the parameter changes nothing
    key = f"{sq}:{sk}:{d}:{paged}:{causal}:{local}:{alibi}:{new_kv}:{mha_type}:{num_splits}"
    rng = random.Random(f"peer-fa2-kvcache-short:{key}" if short else f"peer-fa2-kvcache:{key}")
    h, hk = HEADS[mha_type]
    seqlen_new = rng.randint(1, sq) if short else sq  # the test: randint(1, seqlen_q + 1) when False
    if short and seqlen_new == sq:
        return None  # that draw is the seqlen_new_eq_seqlen_q=True case, already in the grid
    hi = (sk - seqlen_new + 1) if new_kv else (sk + 1)
    cache = [rng.randrange(0 if new_kv else 1, hi) for _ in range(2)]
    requests = tuple((sq, c + (seqlen_new if new_kv else 0)) for c in cache)
    window: tuple[int | None, int | None] = (rng.randrange(sk), rng.randrange(sk)) if local else (None, None)
    if causal and local:  # flash_attn_interface: causal sets the right side to 0
        window = (window[0], 0)
    return AttentionCase(
        requests,
        num_heads=h,
        num_kv_heads=hk,
        head_dim=d,
        dtype="fp16",
        causal=causal,
        window=window,
        alibi=alibi,
        append=new_kv,
        append_len=seqlen_new if short else None,
        num_splits=1 if num_splits == 1 else None,
        kv_layout="contiguous" if paged is None else "NHD",
        block_size=paged,
        batch_name="peerfa2kv",
    )


def points() -> Iterator[Point]:
    """Every combination of ``test_flash_attn_kvcache``'s expressible values (module docstring), in grid order."""
    axes = (
        ("seqlens", SEQLENS),
        ("d", HEAD_DIMS),
        ("paged", (None, 256)),
        ("causal", (False, True)),
        ("local", (False, True)),
        ("alibi", (False, True)),
        ("new_kv", (False, True)),
        ("mha_type", tuple(HEADS)),
        ("num_splits", (1, 0)),
    )
    yield from walk("test_flash_attn_kvcache", axes, _kvcache_case)
    # seqlen_new_eq_seqlen_q=False after every case above (their ids and order unchanged): a short append
    yield from walk("test_flash_attn_kvcache", (*axes, ("seqlen_new_eq_seqlen_q", (False,))), _kvcache_case)


PEER_FA2_KVCACHE = PeerSuite("peer-fa2-kvcache", FA2_KVCACHE_SOURCE, ("fa2",), points)


def peer_fa2_kvcache() -> list[AttentionCase]:
    """The suite's cases, in grid order."""
    return PEER_FA2_KVCACHE.cases()
