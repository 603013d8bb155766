"""Suites of the kernels' own test grids, run through this harness's verdict (``peer-*``).

``peer-fa2-kvcache``: the parametrization of ``test_flash_attn_kvcache`` in flash-attention's
``tests/test_flash_attn.py`` at tag v2.8.3 (the FA2 the GPU kit installs): dtype fp16; ``num_splits`` 1 and 0 (the
kernel's heuristic: ``None`` here); ``mha_type`` mha / mqa / gqa at 6 query heads (6, 1, 3 KV heads); ``new_kv``
(an append: ``append=True``); ``alibi``; ``local`` (a window of ``torch.randint(0, seqlen_k, (2,))`` sides, drawn
here from a seeded generator per combination); ``causal``; ``paged_kv_block_size`` None and 256; ``d`` 32, 59, 64,
80, 128, 256; ``(seqlen_q, seqlen_k)`` from its list; batch 2 with ``cache_seqlens`` drawn as the test draws them
(``randint(0 if new_kv else 1, seqlen_k - seqlen_new + 1 if new_kv else seqlen_k + 1)``), seeded here; a causal
window keeps its left side and 0 on the right, as ``flash_attn_interface`` sets it.

Left out, each for a reason the suite cannot express or afford: ``rotary_fraction`` > 0 (rotary embedding is not
attention: the case model has no rotary), ``has_leftpad`` (no left padding of the cache), the random per-batch ALiBi
slopes (``alibi`` uses the standard slopes), and the two pairs with 128k keys (``(1, 131072)``, ``(16, 131072)``:
the inputs are drawn on the CPU so that a case has the same numbers on every device, 1.6 GB a tensor there).
Combinations the case model refuses are dropped (:func:`peer_fa2_kvcache` counts them).

``seqlen_new_eq_seqlen_q=False`` (an append of ``seqlen_new = randint(1, seqlen_q + 1)`` new keys, fewer than the
query tokens when it draws below ``seqlen_q``): the appending combinations again, after every case above (their ids
unchanged), each with ``seqlen_new`` and the cache lengths drawn from a generator of its own and made a short append
(``append_len = seqlen_new``, ``kv_len = cache_seqlens + seqlen_new``: the test's ``key_padding_mask``); a draw of
``seqlen_new == seqlen_q`` is the ``True`` case already there and is left out.
"""

from __future__ import annotations

import itertools
import random

from conformance.cases.case import AttentionCase

__all__ = ["FA2_KVCACHE_SOURCE", "PEER_SUITES", "peer_fa2_kvcache"]

#: Where the grid comes from.
FA2_KVCACHE_SOURCE = "Dao-AILab/flash-attention v2.8.3, tests/test_flash_attn.py, test_flash_attn_kvcache"

_SEQLENS = ((1, 128), (1, 339), (3, 1024), (64, 800), (64, 256), (3, 799), (64, 2048), (16, 20000), (128, 128))
_HEADS = {"mha": (6, 6), "mqa": (6, 1), "gqa": (6, 3)}


def _fa2_kvcache_case(
    sq: int, sk: int, d: int, paged: int | None, causal: bool, local: bool, alibi: bool, new_kv: bool, mha: str,
    splits: int, short: bool = False,
) -> AttentionCase | None:  # fmt: skip
    key = f"{sq}:{sk}:{d}:{paged}:{causal}:{local}:{alibi}:{new_kv}:{mha}:{splits}"
    rng = random.Random(f"peer-fa2-kvcache-short:{key}" if short else f"peer-fa2-kvcache:{key}")
    h, hk = _HEADS[mha]
    seqlen_new = rng.randint(1, sq) if short else sq  # seqlen_new_eq_seqlen_q: False / True
    if short and seqlen_new == sq:
        return None  # the seqlen_new_eq_seqlen_q=True case
    hi = (sk - seqlen_new + 1) if new_kv else (sk + 1)
    cache = [rng.randrange(0 if new_kv else 1, hi) for _ in range(2)]
    requests = tuple((sq, c + (seqlen_new if new_kv else 0)) for c in cache)
    window = (rng.randrange(sk), rng.randrange(sk)) if local else (None, None)
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
        num_splits=1 if splits == 1 else None,
        kv_layout="contiguous" if paged is None else "NHD",
        block_size=paged,
        batch_name="peerfa2kv",
    )


def peer_fa2_kvcache() -> list[AttentionCase]:
    """Every expressible combination of ``test_flash_attn_kvcache``'s grid (module docstring), in grid order."""
    out = []
    grid = itertools.product(
        _SEQLENS, (32, 59, 64, 80, 128, 256), (None, 256), (False, True), (False, True), (False, True),
        (False, True), ("mha", "mqa", "gqa"), (1, 0),
    )  # fmt: skip
    combos = [c for c in grid if not (c[0][0] > c[0][1] and c[6])]  # sq > sk with new_kv: the test's own skip
    for short in (False, True):  # seqlen_new_eq_seqlen_q True, then False (appended: earlier ids unchanged)
        for (sq, sk), d, paged, causal, local, alibi, new_kv, mha, splits in combos:
            if short and not new_kv:
                continue
            try:
                case = _fa2_kvcache_case(sq, sk, d, paged, causal, local, alibi, new_kv, mha, splits, short)
            except ValueError:
                continue  # a combination the case model refuses (counted by the tests)
            if case is not None:
                out.append(case)
    return out


#: The peer suites (``attnconf run --suite NAME``).
PEER_SUITES = {"peer-fa2-kvcache": peer_fa2_kvcache}
