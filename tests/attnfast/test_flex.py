"""FlexAttention (CPU, eager) adapter against the reference.

Cases, oracle and check are shared with the SDPA tests (``torch_cases.py``), plus the soft-cap
cases that only flex can express.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings

from attnfast.flex import FlexCpuBackend, make_mask_mod, make_score_mod
from conformance.cases.case import OPT_IN_FEATURES, AttentionCase
from conformance.cases.inputs import make_inputs
from torch_cases import CASES as SHARED_CASES
from torch_cases import C, check_backend, random_cases

CASES = {
    **SHARED_CASES,
    "softcap": C([(6, 6), (3, 9)], causal=True, softcap=30.0),
    "softcap_alibi_window": C([(7, 12)], h=4, hk=2, softcap=5.0, alibi=True, window=(4, 1)),
    "softcap_sinks_chunk_paged": C(
        [(5, 11), (2, 0)], causal=True, softcap=20.0, sinks=True, chunk=3, kv_layout="HND", block_size=4
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flex_cpu_matches_reference(name: str) -> None:
    backend = FlexCpuBackend()
    case = CASES[name]
    assert backend.supports(case, "cpu"), backend.supports(case, "cpu").reason
    check_backend(backend, case)


@settings(max_examples=25)
@given(random_cases(softcap=True))
def test_flex_cpu_random_cases(case: AttentionCase) -> None:
    check_backend(FlexCpuBackend(), case)


def test_flex_query_tiles_agree() -> None:
    """A tiny score budget splits requests into query tiles; the result must not change."""
    case = CASES["softcap_sinks_chunk_paged"]
    inputs = make_inputs(case, seed=2)
    whole = FlexCpuBackend().prepare(case, inputs)()
    tiled = FlexCpuBackend(max_score_elems=case.num_heads * 13).prepare(case, inputs)()
    torch.testing.assert_close(tiled.out, whole.out, atol=0, rtol=0)
    torch.testing.assert_close(tiled.lse, whole.lse, atol=1e-6, rtol=0)
    check_backend(FlexCpuBackend(max_score_elems=7), CASES["alibi"])


def test_flex_declares_everything_and_cpu_only() -> None:
    backend = FlexCpuBackend()
    refused = {f for f, s in backend.capabilities().items() if not s}
    assert refused == OPT_IN_FEATURES - backend.accepts == {"v_pad", "sched_meta", "backward", "bwd_deterministic"}
    # the backward is torch's refusal (flex_attention._validate_device), not an undeclared feature
    assert "does not support backward on CPU" in backend.capabilities()["backward"].reason
    assert not backend.supports(CASES["prefill_causal"], "cuda")
    with pytest.raises(ValueError, match="max_score_elems"):
        FlexCpuBackend(max_score_elems=0)


def test_mask_mod_bottom_right_chunk_and_sink() -> None:
    """The mask_mod on its own, against hand-written rows (sq = 3, sk = 6, chunk 4, causal)."""
    case = C([(3, 6)], causal=True, chunk=4, sinks=True)
    mm = make_mask_mod(case, 3, 6)
    q = torch.arange(3)[:, None]
    k = torch.arange(7)[None, :]
    got = mm(torch.tensor(0), torch.tensor(0), q, k).int().tolist()
    # p = i + 3: row 0 -> p 3 (chunk 0..3), row 1 -> p 4 (chunk 4..7), row 2 -> p 5; key 6 = sink.
    assert got == [[1, 1, 1, 1, 0, 0, 1], [0, 0, 0, 0, 1, 0, 1], [0, 0, 0, 0, 1, 1, 1]]


def test_score_mod_order_softcap_then_alibi_then_sink() -> None:
    case = C([(2, 3)], softcap=2.0, alibi=True, sinks=True)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    sinks = torch.tensor([1.0, 2.0, 3.0, 4.0])
    sm = make_score_mod(case, 2, 3, 0, slopes, sinks)
    assert make_score_mod(C([(2, 3)]), 2, 3) is None
    s = torch.tensor(10.0)
    h, qi = torch.tensor(1), torch.tensor(0)
    # row 0 sits at p = 1; key 0 is at distance 1: 2 * tanh(10 / 2) - 0.25 * 1
    assert math.isclose(float(sm(s, 0, h, qi, torch.tensor(0))), 2 * math.tanh(5.0) - 0.25, rel_tol=1e-6)
    assert float(sm(s, 0, h, qi, torch.tensor(3))) == 2.0  # the sink column carries the sink, untouched
