"""A case's inputs are the same bytes from one version to the next: committed runs' output digests and every
compare across versions rely on it.  The digests below are of the inputs as drawn before the paged cache was
written with one indexed copy a request (they were the per-block loop's, checked equal on 467 paged cases of
smoke, default and peer-fa2-kvcache)."""

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
    "page1-nhd": "879a9d9585d0eaa3",
    "page16-int8": "a07c821ca6a415fa",
    "page256-empty": "cdf06d5790941dac",
    "page3-hnd-append": "45e657f51064dcc3",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_paged_inputs_are_the_same_bytes(name: str) -> None:
    assert _digest(CASES[name]) == GOLDEN[name]
