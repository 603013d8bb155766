"""A case's inputs are the same bytes from one version to the next: committed runs' output digests and every
compare across versions rely on it.  Four digests (page1-nhd, page3-hnd-append, page16-int8, page256-empty) are of
the inputs as drawn before the paged cache was written with one indexed copy a request (the per-block loop's,
checked equal on 467 paged cases of smoke, default and peer-fa2-kvcache); the others are of the code before the
caches were built in their stored dtype and layout (issue 30's input speed-up): page sizes 1/16/256, NHD and HND,
fp8 (tensor and head descales, both formats), int8, appends (even, short, uneven), MLA, GQA, the data
distributions, soft-cap, sinks, ALiBi, context parallel and backward."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs

CASES = {
    "page1-nhd": AttentionCase(
        requests=((1, 37), (5, 12)), num_heads=4, num_kv_heads=2, head_dim=16, block_size=1, kv_layout="NHD"
    ),
    "page3-hnd-append": AttentionCase(
        requests=((3, 10), (2, 7)), num_heads=4, num_kv_heads=1, head_dim=32, block_size=3, kv_layout="HND", append=True
    ),
    "page16-int8": AttentionCase(
        requests=((1, 40), (4, 33)),
        num_heads=2,
        num_kv_heads=2,
        head_dim=64,
        block_size=16,
        kv_layout="NHD",
        quant="int8_t1",
    ),
    "page256-empty": AttentionCase(
        requests=((2, 0), (1, 300)), num_heads=2, num_kv_heads=1, head_dim=16, block_size=256, kv_layout="NHD"
    ),
    "page16-gqa-uneven-append": AttentionCase(
        requests=((3, 40), (1, 17), (2, 33)),
        num_heads=8,
        num_kv_heads=2,
        head_dim=32,
        block_size=16,
        kv_layout="NHD",
        append=True,
        append_lens=(2, 0, 1),
        causal=True,
    ),
    "page256-hnd-short-append-fp16": AttentionCase(
        requests=((4, 300), (3, 9)),
        num_heads=4,
        num_kv_heads=4,
        head_dim=16,
        dtype="fp16",
        block_size=256,
        kv_layout="HND",
        append=True,
        append_len=2,
    ),
    "page1-fp8-head-append-hnd": AttentionCase(
        requests=((2, 9), (1, 4)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=1,
        kv_layout="HND",
        append=True,
        quant="fp8_e4m3",
        descale="head",
    ),
    "page16-fp8e5m2-tensor": AttentionCase(
        requests=((1, 50), (3, 3)),
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        block_size=16,
        kv_layout="NHD",
        quant="fp8_e5m2",
    ),
    "page16-int8t2-hnd": AttentionCase(
        requests=((2, 21), (1, 16)),
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        block_size=16,
        kv_layout="HND",
        quant="int8_t2",
    ),
    "mla-page64-fp8": AttentionCase(
        requests=((1, 70), (2, 5)),
        num_heads=8,
        num_kv_heads=1,
        head_dim=16,
        head_dim_v=64,
        qv=True,
        block_size=64,
        kv_layout="NHD",
        quant="fp8_e4m3",
    ),
    "mla-page256": AttentionCase(
        requests=((1, 300),),
        num_heads=4,
        num_kv_heads=1,
        head_dim=16,
        head_dim_v=32,
        qv=True,
        block_size=256,
        kv_layout="NHD",
    ),
    "contig-outliers-gqa": AttentionCase(
        requests=((20, 40), (33, 33)), num_heads=6, num_kv_heads=2, head_dim=16, data="outliers"
    ),
    "contig-peaked-softcap-sinks": AttentionCase(
        requests=((5, 17),), num_heads=4, num_kv_heads=4, head_dim=32, data="peaked", softcap=30.0, sinks=True
    ),
    "page16-offset-v-alibi": AttentionCase(
        requests=((3, 20), (2, 2)),
        num_heads=6,
        num_kv_heads=3,
        head_dim=16,
        block_size=16,
        kv_layout="NHD",
        data="offset_v",
        alibi=True,
    ),
    "contig-backward": AttentionCase(
        requests=((8, 8), (5, 5)), num_heads=2, num_kv_heads=1, head_dim=16, backward=True, causal=True
    ),
    "page16-cp": AttentionCase(
        requests=((2, 20), (1, 7)),
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        block_size=16,
        kv_layout="NHD",
        cp_world=2,
        cp_rank=1,
        causal=True,
    ),
    "contig-fp8-qv": AttentionCase(
        requests=((3, 30),),
        num_heads=4,
        num_kv_heads=1,
        head_dim=16,
        head_dim_v=32,
        qv=True,
        quant="fp8_e4m3",
        descale="head",
    ),
}


def _digest(case: AttentionCase) -> str:
    x = make_inputs(case, seed=3)
    h = hashlib.sha256()
    tensors = [(f.name, getattr(x, f.name)) for f in dataclasses.fields(x)]
    if x.quant is not None:
        tensors += [(f"quant.{f.name}", getattr(x.quant, f.name)) for f in dataclasses.fields(x.quant)]
    for name, t in tensors:
        if isinstance(t, torch.Tensor):
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


GOLDEN = {
    "contig-backward": "b055a2ac0ca741f5",
    "contig-fp8-qv": "cd71b9c334c42138",
    "contig-outliers-gqa": "35c0018afb331f5c",
    "contig-peaked-softcap-sinks": "441c5232a46b0136",
    "mla-page256": "a3c112ec66bad7ca",
    "mla-page64-fp8": "9b0d596dc1fb9aec",
    "page1-fp8-head-append-hnd": "c65d65adaefca817",
    "page1-nhd": "879a9d9585d0eaa3",
    "page16-cp": "f1885b0e6348e57a",
    "page16-fp8e5m2-tensor": "df604029312a9bb5",
    "page16-gqa-uneven-append": "37b74f8a7396f260",
    "page16-int8": "a07c821ca6a415fa",
    "page16-int8t2-hnd": "74c0545176a48b18",
    "page16-offset-v-alibi": "05fe239bd6a26b51",
    "page256-empty": "cdf06d5790941dac",
    "page256-hnd-short-append-fp16": "3616b5692919d614",
    "page3-hnd-append": "45e657f51064dcc3",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_inputs_are_the_same_bytes(name: str) -> None:
    assert _digest(CASES[name]) == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.paged))
def test_paged_cache_strides_are_those_of_a_transposed_copy(name: str) -> None:
    """The caches' strides too (the digests read the values in logical order): an HND cache has the strides of
    ``.transpose(1, 2).contiguous()`` of its NHD tensor, which keeps the NHD buffer where a size-1 dim (one slot a
    block, one kv head) makes the transpose contiguous; the int8 K-scale cache likewise."""
    case = CASES[name]
    x = make_inputs(case, seed=3)
    assert x.k_cache is not None and x.v_cache is not None
    hnd = case.kv_layout == "HND"

    def want(t: torch.Tensor, hnd: bool) -> tuple[int, ...]:
        nhd = t.transpose(1, 2) if hnd else t
        ref = torch.empty(nhd.shape)
        return (ref.transpose(1, 2).contiguous() if hnd else ref).stride()

    assert x.k_cache.stride() == want(x.k_cache, hnd)
    assert x.v_cache.stride() == want(x.v_cache, hnd)
    if x.quant is not None and x.quant.k_scale_cache is not None:
        assert x.quant.k_scale_cache.stride() == want(x.quant.k_scale_cache, True)
