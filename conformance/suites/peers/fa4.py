"""``peer-fa4``: the parametrizations of FA4's own tests, run through this harness's verdict.

Source: Dao-AILab/flash-attention, tag ``fa4-v4.0.0.beta27`` (commit ``0251105a2fb19d2957484b7f023cd8c115286ced``,
2026-08-15, the newest FA4 tag stored here; the GPU kit installs flash-attn-4 4.0.0b36, whose tag is not),
``tests/cute/test_flash_attn.py``.  The tests branch on the GPU; this suite is the grid as they run it on an H100
(sm90, the kit's GPU): ``IS_SM90`` skips every ``num_splits > 1`` call ("SplitKV not supported on SM90") and xfails
the backward at head dim > 192 and with ``d != dv`` under GQA/MQA (the test ends there); the sm100-only skips of
head dim 256 do not apply.  Three tests, one batch label each (``--case '*_peerfa4out_*'`` picks one):

``test_flash_attn_output`` (``peerfa4out``, ``flash_attn_func``), ``test_flash_attn_varlen_output`` (``peerfa4var``,
``flash_attn_varlen_func``), ``test_flash_attn_kvcache`` (``peerfa4kv``, ``flash_attn_varlen_func`` over the cache).
Each test's values (dtype, heads, sinks, windows, head dims, lengths, varlen modes, paging, which points run the
backward) are listed in ``docs/concepts/cases.md`` (*peer-fa4's values*); the grid below is the authority.

Left out, each with its reason: ``pack_gqa`` (the inner loop's False / True / None: not a case field, the adapter
lets the kernel choose); ``unpad_q`` / ``unpad_kv`` (lengths passed as ``cu_seqlens`` or ``seqused``: the adapter
chooses how it passes the case's lengths; each case stands for the four); the repeated call that tests metadata
reuse; the forward calls before the last of the backward's inner loop (the backward case's forward is the call with
``num_splits`` unset, the backward case model's only one); negative window sides (``local_enum`` 2, 3 of the output
test with a side drawn above 0: the case model's windows are ``>= 0``, kept as refused points); the kvcache test's
fixed values (``rotary_fraction`` 0, ``seqlen_new_eq_seqlen_q`` False, which has no effect without ``new_kv``,
``has_leftpad``, ``has_batch_idx`` False); every other test of the file (single calls, API checks, MLA-absorbed
and block-sparse paths, sm100-only tests).  Inputs are this harness's (its own sinks, stale cache slots), never the
test's numbers.

Backend: ``fa4``.  Its adapter declares no ``sched_meta`` (FA4's ``get_scheduler_metadata`` is not wired in): the
cases with ``scheduler_metadata`` (the ``precompute_metadata`` half of the varlen forward and kvcache calls, 24,876)
are ``unsupported`` there until it does.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from conformance.cases.case import AttentionCase
from conformance.suites.peers.grid import SAME_CALL, Dropped, PeerSuite, Point, walk

__all__ = ["FA4_SOURCE", "PEER_FA4"]

FA4_SOURCE = (
    "Dao-AILab/flash-attention fa4-v4.0.0.beta27 (0251105a2fb19d2957484b7f023cd8c115286ced), "
    "tests/cute/test_flash_attn.py: test_flash_attn_output, test_flash_attn_varlen_output, test_flash_attn_kvcache "
    "(as run on sm90)"
)

MHA_TYPES = ("mha", "mqa", "gqa")
OUTPUT_HEAD_DIMS = (64, 96, 128, 192, 256)
OUTPUT_SEQLENS = (
    (1, 1), (3, 3), (64, 32), (64, 128), (64, 1), (128, 128), (128, 192), (256, 256), (255, 256), (239, 1), (799, 3),
    (113, 203), (113, 128), (128, 217), (113, 211), (108, 256), (256, 512), (384, 256), (640, 128), (512, 256),
    (1024, 1024), (1023, 1024), (1024, 1023), (2048, 2048), (4096, 4096), (4224, 4224),
)  # fmt: skip
VARLEN_HEAD_DIMS = (64, 128, 192, 256)
VARLEN_SEQLENS = (
    (511, 1), (3, 513), (64, 128), (128, 128), (256, 256), (113, 203), (128, 217), (113, 211), (108, 256), (256, 512),
    (307, 256), (640, 128), (512, 256), (1024, 1024), (1023, 1024), (1024, 1023), (2048, 2048), (64, 1), (255, 256),
    (4096, 4096), (4224, 4224),
)  # fmt: skip
VARLEN_MODES = ("random", "third", "full")
ZERO_LENGTHS = ((False, False), (True, False), (False, True), (True, True))
KVCACHE_SEQLENS = ((1, 128), (1, 339), (3, 1024), (64, 800), (64, 256), (3, 799), (64, 2048), (16, 20000))
KVCACHE_PAGE_SIZES = (None, 1, 4, 128)


def _kv_heads(mha_type: str) -> int:
    return {"mha": 6, "gqa": 3, "mqa": 1}[mha_type]


def _output_dvs(d: int) -> tuple[int, ...]:
    return (128,) if d == 192 else ((64, d) if d == 128 else (d,))


def _varlen_dvs(d: int) -> tuple[int, ...]:
    return (128,) if d == 192 else ((64, d) if d == 128 else (d,))


def _runs_backward(d: int, dv: int, mha_type: str) -> bool:
    """The test's backward condition for bf16 without ``qv`` on sm90: ``dv == d <= 128`` or ``(192, 128)``, and not
    the sm90 xfails (head dim > 192; ``d != dv`` with GQA/MQA)."""
    eligible = (dv == d and d <= 128) or (d == 192 and dv == 128)
    return eligible and not d > 192 and not (d != dv and mha_type != "mha")


def _pass_fields(call: str, deterministic: bool) -> dict:
    """A forward call (``num_splits`` 1: sm90 runs no other) or the backward case (no pinned split count)."""
    if call == "bwd":
        return {"backward": True, "deterministic": deterministic}
    return {"num_splits": 1}


# --------------------------------------------------------------------------- test_flash_attn_output
def _output_case(
    seqlens: tuple[int, int], d: int, causal: bool, local_enum: int, softcap: float, deterministic: bool,
    has_learnable_sink: bool, mha_type: str, dv: int, call: str,
) -> AttentionCase | None:  # fmt: skip
    local = local_enum > 0
    if local and causal:
        return None  # the test's own skip
    if dv not in _output_dvs(d):
        return None  # not in this head dim's dv_vals
    sq, sk = seqlens
    if call == "bwd" and not (_runs_backward(d, dv, mha_type) and not ((causal or local) and sk < sq)):
        return None  # the test runs no backward here
    if call == "fwd" and deterministic:
        raise Dropped(SAME_CALL)  # the forward call does not read it
    # one draw per (pair, d, mask, dv): the test seeds Python's random with 0 and draws the window first
    rng = random.Random(f"peer-fa4-output:{seqlens}:{d}:{causal}:{local_enum}:{dv}")
    window: tuple[int | None, int | None] = (None, None)
    if local:
        left, right = rng.randrange(0, sk), rng.randrange(0, sk)
        window = {1: (left, right), 2: (None, -right), 3: (-left, None)}[local_enum]
    return AttentionCase(
        ((sq, sk),) * (9 if sk <= 2048 else 2),
        num_heads=6,
        num_kv_heads=_kv_heads(mha_type),
        head_dim=d,
        head_dim_v=None if dv == d else dv,
        causal=causal,
        window=window,
        softcap=softcap or None,
        sinks=has_learnable_sink,
        batch_name="peerfa4out",
        **_pass_fields(call, deterministic),
    )


def output_points() -> Iterator[Point]:
    axes = (
        ("seqlens", OUTPUT_SEQLENS),
        ("d", OUTPUT_HEAD_DIMS),
        ("causal", (False, True)),
        ("local_enum", (0, 1, 2, 3)),
        ("softcap", (0.0, 15.0)),
        ("deterministic", (False, True)),
        ("has_learnable_sink", (False, True)),
        ("mha_type", MHA_TYPES),
        ("dv", (64, 96, 128, 256)),  # the inner dv_vals loop: the make function keeps the head dim's values
        ("call", ("fwd", "bwd")),
    )
    yield from walk("test_flash_attn_output", axes, _output_case)


# --------------------------------------------------------------------------- test_flash_attn_varlen_output
def _lengths(rng: random.Random, s: int, batch: int, mode: str, zero_lengths: bool) -> list[int]:
    """``generate_random_padding_mask``'s lengths (``flash_attn/cute/testing.py``)."""
    low = 0 if zero_lengths else 1
    if mode == "full":
        lens = [s] * batch
    elif mode == "random":
        lens = [rng.randint(max(low, s - 20), s) for _ in range(batch)]
    else:
        lens = [rng.randint(max(low, s // 3), s) for _ in range(batch)]
    if zero_lengths:
        lens = [0 if b % 5 == 0 or b == batch - 1 else n for b, n in enumerate(lens)]
    return lens


def _varlen_case(
    seqlens: tuple[int, int], d: int, causal: bool, local_enum: int, softcap: float, deterministic: bool,
    mha_type: str, varlen_mode: str, zero_lengths: tuple[bool, bool], dv: int, call: str,
) -> AttentionCase | None:  # fmt: skip
    local = local_enum > 0
    if local and causal:
        return None  # the test's own skip
    if dv not in _varlen_dvs(d):
        return None
    if call == "bwd" and not _runs_backward(d, dv, mha_type):
        return None
    zq, zk = zero_lengths
    if call != "bwd" and deterministic:
        raise Dropped(SAME_CALL)  # the forward call does not read it
    if (causal or local) and zk:
        raise Dropped(SAME_CALL)  # the keys take the queries' padding mask: zero_lengths_k has no effect
    sq, sk = seqlens
    if causal or local:
        sk = sq  # the test's reference supports causal and local only with seqlen_k == seqlen_q
    batch = 49 if sq <= 512 else 7
    rng = random.Random(f"peer-fa4-varlen:{seqlens}:{d}:{causal}:{local_enum}:{dv}")
    window: tuple[int | None, int | None] = (None, None)
    if local:
        left, right = rng.randrange(0, sk), rng.randrange(0, sk)
        window = {1: (left, right), 2: (None, right), 3: (left, None)}[local_enum]
    q_lens = _lengths(random.Random(f"{rng.random()}:{varlen_mode}:{zq}"), sq, batch, varlen_mode, zq)
    if causal or local:
        k_lens = q_lens  # key_padding_mask = query_padding_mask
    else:
        k_lens = _lengths(random.Random(f"{rng.random()}:{varlen_mode}:{zq}:{zk}"), sk, batch, varlen_mode, zk)
    return AttentionCase(
        tuple(zip(q_lens, k_lens)),
        num_heads=6,
        num_kv_heads=_kv_heads(mha_type),
        head_dim=d,
        head_dim_v=None if dv == d else dv,
        causal=causal,
        window=window,
        softcap=softcap or None,
        batch_name="peerfa4var",
        **_pass_fields("bwd" if call == "bwd" else "fwd", deterministic),
        scheduler_metadata=call == "fwd_meta",
    )


def varlen_points() -> Iterator[Point]:
    axes = (
        ("seqlens", VARLEN_SEQLENS),
        ("d", VARLEN_HEAD_DIMS),
        ("causal", (False, True)),
        ("local_enum", (0, 1, 2, 3)),
        ("softcap", (0.0, 15.0)),
        ("deterministic", (False, True)),
        ("mha_type", MHA_TYPES),
        ("varlen_mode", VARLEN_MODES),
        ("zero_lengths", ZERO_LENGTHS),
        ("dv", (64, 128, 256)),
        ("call", ("fwd", "fwd_meta", "bwd")),  # precompute_metadata False / True, then the backward
    )
    yield from walk("test_flash_attn_varlen_output", axes, _varlen_case)


# --------------------------------------------------------------------------- test_flash_attn_kvcache
def _kvcache_case(
    seqlens: tuple[int, int], d: int, varlen_q: bool, page_size: int | None, causal: bool, local: bool,
    has_learnable_sink: bool, mha_type: str, precompute_metadata: bool,
) -> AttentionCase | None:  # fmt: skip
    sq, sk = seqlens
    if page_size is not None and sk % page_size != 0:
        return None  # the test's own skip
    rng = random.Random(f"peer-fa4-kvcache:{seqlens}:{d}:{varlen_q}:{page_size}:{causal}:{local}")
    batch = 5
    q_lens = [rng.randint(max(1, sq - 20), sq) for _ in range(batch)] if varlen_q else [sq] * batch
    window: tuple[int | None, int | None] = (None, None)
    if local:
        left, right = rng.randrange(sk), rng.randrange(sk)
        window = (left, 0) if causal else (left, right)
    cache = [rng.randint(1, sk) for _ in range(batch)]
    return AttentionCase(
        tuple(zip(q_lens, cache)),
        num_heads=6,
        num_kv_heads=_kv_heads(mha_type),
        head_dim=d,
        causal=causal,
        window=window,
        sinks=has_learnable_sink,
        num_splits=1,
        scheduler_metadata=precompute_metadata,
        kv_layout="contiguous" if page_size is None else "NHD",
        block_size=page_size,
        batch_name="peerfa4kv",
    )


def kvcache_points() -> Iterator[Point]:
    axes = (
        ("seqlens", KVCACHE_SEQLENS),
        ("d", (64, 128)),
        ("varlen_q", (False, True)),
        ("page_size", KVCACHE_PAGE_SIZES),
        ("causal", (False, True)),
        ("local", (False, True)),
        ("has_learnable_sink", (False, True)),
        ("mha_type", MHA_TYPES),
        ("precompute_metadata", (False, True)),
    )
    yield from walk("test_flash_attn_kvcache", axes, _kvcache_case)


def points() -> Iterator[Point]:
    yield from output_points()
    yield from varlen_points()
    yield from kvcache_points()


PEER_FA4 = PeerSuite("peer-fa4", FA4_SOURCE, ("fa4",), points)
