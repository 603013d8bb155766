"""The baseline computes the case's own attention, feature by feature (conformance/verdict/baseline.py
docstring): soft-cap, ALiBi and an MLA-absorbed ``qv`` enter its scores exactly as they enter the reference's.

The verdict scales every allowed error by the baseline's distance from the reference, so a baseline that
computed another function (a flipped ALiBi sign, a soft-cap divided instead of multiplied) would widen every
tolerance of those cases.  In fp32 the baseline must equal the fp64 reference to fp32 rounding; mutmut found
these features unchecked (docs "Mutation testing").
"""

from __future__ import annotations

import pytest
import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.verdict.baseline import baseline
from conformance.verdict.reference import default_numerics, reference

# sq != sk in the first request, so the ALiBi distance |i + sk - sq - j| differs from |i - j| and |i + sk + sq - j|
CASE = AttentionCase(requests=((5, 7), (3, 3)), num_heads=4, num_kv_heads=2, head_dim=16)

FEATURES = {
    "softcap": {"softcap": 5.0},
    "alibi": {"alibi": True},
    "alibi_causal": {"alibi": True, "causal": True},
    "qv": {"qv": True, "num_kv_heads": 1, "head_dim": 64, "head_dim_v": 32},
}


@pytest.mark.parametrize(("dtype", "tol"), [("fp32", 1e-5), ("bf16", 2e-2)])
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_baseline_computes_the_reference_function(feature: str, dtype: str, tol: float) -> None:
    case = CASE.replace(dtype=dtype, **FEATURES[feature])
    inputs = make_inputs(case)
    out, lse = baseline(case, inputs)
    ref = reference(case, inputs)
    torch.testing.assert_close(out.double(), ref.out.double(), rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), ref.lse.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize(("dtype", "want"), [("bf16", torch.float32), ("fp16", torch.float32), ("fp32", torch.float64)])
def test_reference_is_fp32_for_half_inputs_and_fp64_for_fp32(dtype: str, want: torch.dtype) -> None:
    case = CASE.replace(dtype=dtype)
    assert default_numerics(case).dtype == want
    assert reference(case, make_inputs(case)).out.dtype == want


def test_fp8_v_rounds_p_through_fp8_before_p_at_v() -> None:
    """Step 4 of the docstring: with an fp8 V the baseline's P goes bf16 -> fp8 -> bf16 before ``P @ V``, as an
    fp8 kernel's P does; computed here step by step for one non-causal request."""
    case = AttentionCase(requests=((4, 9),), num_heads=2, num_kv_heads=1, head_dim=16, quant="fp8_e4m3")
    inputs = make_inputs(case)
    assert inputs.quant.v.dtype == torch.float8_e4m3fn
    out, _ = baseline(case, inputs)

    dt = torch.bfloat16
    q = (inputs.q.to(dt) * 16**-0.5).permute(1, 0, 2)
    k, v = (x.to(dt).repeat_interleave(2, dim=1).permute(1, 0, 2) for x in (inputs.k, inputs.v))
    p = torch.softmax(torch.matmul(q, k.transpose(-1, -2)).float(), dim=-1).to(dt)
    want = torch.matmul(p.to(torch.float8_e4m3fn).to(dt), v).permute(1, 0, 2)
    without_fp8 = torch.matmul(p, v).permute(1, 0, 2)
    assert not torch.equal(want, without_fp8)  # the rounding shows in this case's output
    torch.testing.assert_close(out, want, rtol=0, atol=0)
