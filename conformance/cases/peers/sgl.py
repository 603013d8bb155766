"""``peer-sgl``: the parametrizations of sgl-kernel's FA3 tests, run through this harness's verdict.

Source: sgl-project/sglang, ``sgl-kernel/tests/test_flash_attention.py`` at commit
``4be86d06503cea61e16b276c0e0611da82847c47`` (the version stored here that has the sinks parameters; sgl-kernel
publishes wheels only, so no release ties the file to a version, and the harness has no sgl-kernel adapter: its FA3
build is run through ``fa3-vllm`` and ``fa3``, the same kernel lineage).  The file adapts FA3's Hopper tests and fixes
its CI flags: ``DISABLE_BACKWARD``, ``DISABLE_PAGEDKV``, ``DISABLE_SOFTCAP``, ``DISABLE_FP16``, ``DISABLE_FP8`` set,
``DISABLE_SPLIT``, ``DISABLE_APPENDKV``, ``DISABLE_LOCAL``, ``DISABLE_PACKGQA`` clear; ``apply_rotary_emb = None``
(so ``rotary_fraction`` is 0).  Two tests, one batch label each (``--case '*_peersglkv_*'`` picks one):

``test_flash_attn_kvcache`` (``peersglkv``, ``flash_attn_with_kvcache``): dtype bf16; ``mha_type`` at 6 query heads
(6, 1, 3 KV heads); ``has_sink`` (``sinks``); ``new_kv`` (``append``); ``(causal, local)`` (False, False) only;
``page_size`` None (contiguous cache); ``d`` 64 with the inner ``dv_vals`` 256, 512, 64 on Hopper: ``dv >= 256`` is
an MLA-absorbed call (``qv``, ``head_dim_v=dv``); 11 ``(seqlen_q, seqlen_k)`` pairs; batch 5 with ``cache_seqlens``
drawn as the test draws them (``randint(0 if new_kv else 1, seqlen_k - seqlen_new + 1 if new_kv else seqlen_k +
1)``, seeded here); the inner ``num_splits`` 1, 0 (0: the heuristic, None here).

``test_flash_attn_varlen_output`` (``peersglvar``, ``flash_attn_varlen_func``): dtype bf16; heads at 6 (6, 1, 2 KV
heads); ``has_sink``; softcap 0; ``local`` False; causal; ``d`` 128 (``dv`` 128); 20 pairs; batch 9 with the
padding masks drawn as the test draws them: query lengths in ``[max(1, seqlen_q - 20), seqlen_q]``, key lengths in
``[max(0, seqlen_k - 20), seqlen_k]`` and 0 for sequences 0, 5 and the last.  Its inner ``pack_gqa`` x
``num_splits`` loop passes neither to the call: one call, four times.

Left out, each with its reason: ``add_unused_qkv=True`` (tokens inside ``cu_seqlens`` past ``seqused``: the case
model has no unused tokens); ``rotary_interleaved`` (no effect without rotary: one case for both values);
``seqlen_new_eq_seqlen_q=False`` without ``new_kv`` (the same call as True: there are no new keys,
:data:`~conformance.cases.peers.grid.SAME_CALL`); the test's own numbers (the harness draws its inputs and sinks).
No combination is refused by the case model (the tests check).

``seqlen_new_eq_seqlen_q=False`` with ``new_kv``: an append of ``seqlen_new = torch.randint(1, seqlen_q + 1, (1,))``
new keys (drawn here from a generator of its own) after ``cache_seqlens`` in ``[0, seqlen_k - seqlen_new]``, a
*short append* (``append_len = seqlen_new``, ``kv_len = cache_seqlens + seqlen_new``: the test's
``key_padding_mask``); these points come after every other point of the suite (:func:`_short_append`), so the
earlier cases keep their ids and their order; a draw of ``seqlen_new == seqlen_q`` (always at ``seqlen_q`` 1) is the
``True`` point's call (:data:`~conformance.cases.peers.grid.SAME_CALL`).

Backends: ``fa3-vllm`` (it refuses the appends), ``fa3`` (upstream: no sinks nor ``qv``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from conformance.cases.case import AttentionCase
from conformance.cases.peers.grid import SAME_CALL, Dropped, PeerSuite, Point, walk, walk_part

__all__ = ["PEER_SGL", "SGL_SOURCE"]

SGL_SOURCE = (
    "sgl-project/sglang 4be86d06503cea61e16b276c0e0611da82847c47, sgl-kernel/tests/test_flash_attention.py: "
    "test_flash_attn_kvcache, test_flash_attn_varlen_output"
)

MHA_TYPES = ("mha", "mqa", "gqa")
KVCACHE_SEQLENS = (
    (1, 128), (1, 339), (3, 1024), (64, 800), (64, 256), (3, 799), (64, 2048), (16, 20000), (128, 128), (256, 512),
    (2048, 3577),
)  # fmt: skip
VARLEN_SEQLENS = (
    (1, 1), (1, 3), (2, 1), (511, 1), (3, 513), (64, 128), (128, 128), (256, 256), (113, 203), (128, 217),
    (113, 211), (108, 256), (256, 512), (307, 256), (640, 128), (512, 256), (1024, 1024), (1023, 1024),
    (1024, 1023), (2048, 2048),
)  # fmt: skip


# --------------------------------------------------------------------------- test_flash_attn_kvcache
def _short_append(seqlen_new_eq_seqlen_q: bool, new_kv: bool, **_: object) -> bool:
    """Whether a point is an append of ``seqlen_new = randint(1, seqlen_q + 1)`` new keys
    (``seqlen_new_eq_seqlen_q=False``), a call the case model took after this grid's first cases (``append_len``):
    :func:`points` walks them after every other point, so that the earlier cases keep their ids and order."""
    return new_kv and not seqlen_new_eq_seqlen_q


def _kvcache_case(
    seqlens: tuple[int, int], seqlen_new_eq_seqlen_q: bool, new_kv: bool, has_sink: bool, mha_type: str, dv: int,
    num_splits: int,
) -> AttentionCase | None:  # fmt: skip
    sq, sk = seqlens
    if sq > sk and new_kv:
        return None  # the test's own skip
    short = not seqlen_new_eq_seqlen_q
    if short and not new_kv:
        raise Dropped(SAME_CALL)  # seqlen_new only sizes new keys, and there are none
    # the draws are the test's, per combination (num_splits is its inner loop over one set of inputs);
    # seqlen_new_eq_seqlen_q=False draws from a generator of its own
    key = f"{seqlens}:{new_kv}:{has_sink}:{mha_type}:{dv}"
    rng = random.Random(f"peer-sgl-kvcache-short:{key}" if short else f"peer-sgl-kvcache:{key}")
    # seqlen_new = seqlen_q if seqlen_new_eq_seqlen_q else torch.randint(1, seqlen_q + 1, (1,)).item()
    seqlen_new = rng.randint(1, sq) if short else sq
    if short and seqlen_new == sq:
        raise Dropped(SAME_CALL)  # that draw is the seqlen_new_eq_seqlen_q=True point's call
    batch = 5
    hi = (sk - seqlen_new + 1) if new_kv else (sk + 1)
    cache = [rng.randrange(0 if new_kv else 1, hi) for _ in range(batch)]
    d = 64
    return AttentionCase(
        tuple((sq, c + (seqlen_new if new_kv else 0)) for c in cache),  # key_padding_mask: cache_seqlens + new keys
        num_heads=6,
        num_kv_heads={"mha": 6, "mqa": 1, "gqa": 3}[mha_type],
        head_dim=d,
        head_dim_v=None if dv == d else dv,
        qv=dv >= 256,  # has_qv = d == 64 and dv >= 256
        sinks=has_sink,
        append=new_kv,
        append_len=seqlen_new if short else None,
        num_splits=None if num_splits == 0 else num_splits,
        batch_name="peersglkv",
    )


_KVCACHE_AXES = (
    ("seqlens", KVCACHE_SEQLENS),
    ("seqlen_new_eq_seqlen_q", (True, False)),
    ("new_kv", (False, True)),
    ("has_sink", (False, True)),
    ("mha_type", MHA_TYPES),
    ("dv", (256, 512, 64)),  # the inner dv_vals loop at head dim 64 on Hopper
    ("num_splits", (1, 0)),
)


def kvcache_points(short_appends: bool | None = None) -> Iterator[Point]:
    """The points of ``test_flash_attn_kvcache``'s grid, in grid order: those that are not :func:`_short_append`
    (``short_appends`` False), those that are (True), or every point, the former first (None)."""
    if short_appends is not True:
        yield from walk_part(
            "test_flash_attn_kvcache", _KVCACHE_AXES, _kvcache_case, lambda **p: not _short_append(**p)
        )
    if short_appends is not False:
        yield from walk_part("test_flash_attn_kvcache", _KVCACHE_AXES, _kvcache_case, _short_append)


# --------------------------------------------------------------------------- test_flash_attn_varlen_output
def _varlen_case(seqlens: tuple[int, int], causal: bool, mha_type: str, has_sink: bool) -> AttentionCase:
    sq, sk = seqlens
    rng = random.Random(f"peer-sgl-varlen:{seqlens}:{causal}:{mha_type}:{has_sink}")
    batch = 9
    q_lens = [rng.randint(max(1, sq - 20), sq) for _ in range(batch)]
    k_lens = [0 if b % 5 == 0 or b == batch - 1 else rng.randint(max(0, sk - 20), sk) for b in range(batch)]
    return AttentionCase(
        tuple(zip(q_lens, k_lens)),
        num_heads=6,
        num_kv_heads={"mha": 6, "mqa": 1, "gqa": 2}[mha_type],
        head_dim=128,
        causal=causal,
        sinks=has_sink,
        batch_name="peersglvar",
    )


def varlen_points() -> Iterator[Point]:
    axes = (
        ("seqlens", VARLEN_SEQLENS),
        ("causal", (False, True)),
        ("mha_type", MHA_TYPES),
        ("has_sink", (False, True)),
    )
    yield from walk("test_flash_attn_varlen_output", axes, _varlen_case)


def points() -> Iterator[Point]:
    """Both grids' points; the short appends last (:func:`_short_append`)."""
    yield from kvcache_points(short_appends=False)
    yield from varlen_points()
    yield from kvcache_points(short_appends=True)


PEER_SGL = PeerSuite("peer-sgl", SGL_SOURCE, ("fa3-vllm", "fa3"), points)
