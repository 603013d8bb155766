"""``peer-vllm-flash`` and ``peer-vllm-flashmla``: the parametrizations of vLLM's own kernel tests of the attention
kernels it ships, run through this harness's verdict.

Source: vLLM v0.24.0, the release the GPU kit installs, read from its PyPI sdist ``vllm-0.24.0.tar.gz`` (sha256
``0862453adc1f3339f1a0c9dca1179c34d6ed6e118f87b6e5bddd120af614ac66``), ``tests/kernels/attention/``.

``peer-vllm-flash`` (backends ``fa3-vllm``; ``fa2`` runs the ``fa_version=2`` half of the same calls on upstream
FA2): ``test_flash_attn.py::test_varlen_with_paged_kv`` (``peervllmvar``) and
``test_cascade_flash_attn.py::test_cascade``, its reference call and the two calls ``cascade_attention`` makes
(``peervllmcasc``, ``peervllmcascpre``, ``peervllmcascsuf``).  ``peer-vllm-flashmla`` (backend ``flashmla``;
``fa3-vllm`` takes the same MLA call through ``q_v``): ``test_flashmla.py::test_flash_mla`` (``peervllmmla``).
Each test's values are listed in ``docs/concepts/cases.md`` (*peer-vllm's values*); the grids below are the
authority.

Left out, each with its reason: ``use_out`` (a preallocated output: no numerical difference); ``num_blocks``
(32768 and 2048: the size of the cache pool the test's block table draws from, ``randint`` with repeats; the case
model's cache holds each sequence's own blocks, randomly permuted, and no pool size); ``fa_version`` (which kernel
runs: a backend, not a case field: each case stands for both, run it on ``fa3-vllm`` and on ``fa2``); the test's
N(0, 1) inputs, unit descales and NaN-filled unused cache slots (the harness draws its own inputs, descales and
large finite stale slots); ``test_cascade_flash_attn.py::test_merge_kernel`` (merges two given outputs: no
attention).  No combination is refused by the case model (the tests check).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from conformance.cases.case import AttentionCase
from conformance.suites.peers.grid import PeerSuite, Point, walk

__all__ = ["PEER_VLLM_FLASH", "PEER_VLLM_FLASHMLA", "VLLM_SOURCE"]

VLLM_SOURCE = (
    "vLLM v0.24.0 (PyPI sdist vllm-0.24.0.tar.gz, "
    "sha256 0862453adc1f3339f1a0c9dca1179c34d6ed6e118f87b6e5bddd120af614ac66)"
)

VARLEN_SEQ_LENS = (((1, 1328), (5, 18), (129, 463)), ((1, 523), (1, 37), (1, 2011)))
VARLEN_NUM_HEADS = ((4, 4), (8, 2))
VARLEN_HEAD_SIZES = (40, 72, 80, 128, 256)
CASCADE_CASES = (
    (((129, 871), (18, 280), (37, 988), (1023, 2304), (1, 257)), 256),
    (((1, 1023), (1, 879), (1, 778), (1, 1777)) * 100, 512),
)
CASCADE_NUM_HEADS = ((4, 4), (8, 2), (16, 2))
CASCADE_HEAD_SIZES = (128, 192, 256)
CASCADE_CALLS = ("full", "prefix", "suffix")
MLA_S_Q = (1, 2)
MLA_MEAN_SK = (4096, 8192, 16384)
MLA_H_Q = (16, 32, 64, 128)
MLA_BATCH = 128


def _quant(q_dtype: str | None, descale: str | None) -> dict:
    return {} if q_dtype is None else {"quant": q_dtype, "descale": descale}


def _paged_case(
    requests: tuple[tuple[int, int], ...], num_heads: tuple[int, int], head_size: int, dtype: str, block_size: int,
    *, causal: bool, batch_name: str, **fields,
) -> AttentionCase:  # fmt: skip
    """A call of these tests as a case: ``num_heads`` (query, KV), the keys in vLLM's NHD paged cache."""
    return AttentionCase(
        requests,
        num_heads=num_heads[0],
        num_kv_heads=num_heads[1],
        head_dim=head_size,
        dtype=dtype,
        kv_layout="NHD",
        block_size=block_size,
        causal=causal,
        batch_name=batch_name,
        **fields,
    )


# --------------------------------------------------------------------------- test_varlen_with_paged_kv
def _varlen_case(
    q_dtype: str | None, soft_cap: float | None, dtype: str, sliding_window: int | None, block_size: int,
    head_size: int, num_heads: tuple[int, int], seq_lens: tuple[tuple[int, int], ...],
) -> AttentionCase:  # fmt: skip
    window = (None, None) if sliding_window is None else (sliding_window - 1, 0)
    return _paged_case(
        seq_lens, num_heads, head_size, dtype, block_size, causal=True, batch_name="peervllmvar",
        window=window, softcap=soft_cap, **_quant(q_dtype, "head"),
    )  # fmt: skip


def varlen_points() -> Iterator[Point]:
    axes = (
        ("q_dtype", (None, "fp8_e4m3")),
        ("soft_cap", (None,)),
        ("dtype", ("bf16",)),
        ("sliding_window", (None, 256)),
        ("block_size", (16,)),
        ("head_size", VARLEN_HEAD_SIZES),
        ("num_heads", VARLEN_NUM_HEADS),
        ("seq_lens", VARLEN_SEQ_LENS),
    )
    yield from walk("test_varlen_with_paged_kv", axes, _varlen_case)


# --------------------------------------------------------------------------- test_cascade
def _cascade_case(
    soft_cap: float | None, block_size: int, dtype: str, head_size: int, num_heads: tuple[int, int],
    seq_lens_and_common_prefix: tuple[tuple[tuple[int, int], ...], int], call: str,
) -> AttentionCase:  # fmt: skip
    seq_lens, prefix = seq_lens_and_common_prefix
    if call == "full":  # the test's reference: flash_attn_varlen_func over every key
        requests, causal, label = seq_lens, True, "peervllmcasc"
    elif call == "prefix":  # all query tokens as one sequence against the shared prefix, no mask
        requests, causal, label = ((sum(q for q, _ in seq_lens), prefix),), False, "peervllmcascpre"
    else:  # each request against its own keys past the prefix, causal
        requests, causal, label = tuple((q, k - prefix) for q, k in seq_lens), True, "peervllmcascsuf"
    return _paged_case(
        requests, num_heads, head_size, dtype, block_size, causal=causal, batch_name=label, softcap=soft_cap
    )


def cascade_points() -> Iterator[Point]:
    axes = (
        ("soft_cap", (None, 50.0)),
        ("block_size", (16,)),
        ("dtype", ("fp16", "bf16")),
        ("head_size", CASCADE_HEAD_SIZES),
        ("num_heads", CASCADE_NUM_HEADS),
        ("seq_lens_and_common_prefix", CASCADE_CASES),
        ("call", CASCADE_CALLS),
    )
    yield from walk("test_cascade", axes, _cascade_case)


# --------------------------------------------------------------------------- test_flash_mla
def _mla_case(torch_dtype: str, varlen: bool, h_q: int, mean_sk: int, s_q: int) -> AttentionCase:
    if varlen:
        rng = random.Random(f"peer-vllm-flashmla:{torch_dtype}:{h_q}:{mean_sk}:{s_q}")
        lens = [int(max(rng.normalvariate(mean_sk, mean_sk / 2), s_q)) for _ in range(MLA_BATCH)]
    else:
        lens = [mean_sk] * MLA_BATCH
    fp8 = torch_dtype == "fp8_e4m3"
    dtype = "bf16" if fp8 else torch_dtype
    return _paged_case(
        tuple((s_q, k) for k in lens), (h_q, 1), 64, dtype, block_size=64, causal=True, batch_name="peervllmmla",
        head_dim_v=512, qv=True, **_quant("fp8_e4m3" if fp8 else None, None),
    )  # fmt: skip


def mla_points() -> Iterator[Point]:
    axes = (
        ("torch_dtype", ("bf16", "fp16", "fp8_e4m3")),
        ("varlen", (False, True)),
        ("h_q", MLA_H_Q),
        ("mean_sk", MLA_MEAN_SK),
        ("s_q", MLA_S_Q),
    )
    yield from walk("test_flash_mla", axes, _mla_case)


def flash_points() -> Iterator[Point]:
    yield from varlen_points()
    yield from cascade_points()


PEER_VLLM_FLASH = PeerSuite(
    "peer-vllm-flash",
    f"{VLLM_SOURCE}: tests/kernels/attention/test_flash_attn.py test_varlen_with_paged_kv, "
    "tests/kernels/attention/test_cascade_flash_attn.py test_cascade",
    ("fa3-vllm", "fa2"),
    flash_points,
)
PEER_VLLM_FLASHMLA = PeerSuite(
    "peer-vllm-flashmla",
    f"{VLLM_SOURCE}: tests/kernels/attention/test_flashmla.py test_flash_mla",
    ("flashmla", "fa3-vllm"),
    mla_points,
)
