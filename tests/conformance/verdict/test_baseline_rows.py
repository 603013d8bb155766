"""The baseline's promises on rows without keys (conformance/verdict/baseline.py docstring).

Fully masked rows (causal with sq > sk, and sk = 0) give output 0 and LSE ``-inf``, or the sink's value
with sinks, exactly as the reference does: the verdict compares both, so a baseline that disagreed on those
rows would either widen the LSE bound or report its own rows as the kernel's error.
"""

from __future__ import annotations

import math

import pytest
import torch

from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.verdict.baseline import baseline
from conformance.verdict.reference import reference

# (6, 3) causal: the top 3 rows see nothing; (2, 0): no keys at all; (4, 4): every row sees a key
CASE = AttentionCase(requests=((6, 3), (2, 0), (4, 4)), causal=True, num_heads=4, num_kv_heads=2, head_dim=16)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("sinks", [False, True], ids=["no_sink", "sink"])
def test_rows_without_keys(sinks: bool, dtype: str) -> None:
    case = CASE.replace(sinks=sinks, dtype=dtype)
    inputs = make_inputs(case)
    out, lse = baseline(case, inputs)
    ref = reference(case, inputs)
    empty = torch.zeros(case.num_heads, case.total_q, dtype=torch.bool)
    empty[:, [0, 1, 2, 6, 7]] = True  # (6, 3) rows 0-2 and both rows of (2, 0)
    assert (out.transpose(0, 1)[empty] == 0).all() and (ref.out.transpose(0, 1)[empty] == 0).all()
    if sinks:
        want = inputs.sinks.float().reshape(-1, 1).expand_as(lse)
        assert torch.equal(lse[empty], want[empty])
        assert torch.isfinite(lse).all() and torch.isfinite(ref.lse).all()
        torch.testing.assert_close(ref.lse[empty].float(), want[empty])
    else:
        assert torch.isneginf(lse[empty]).all() and torch.isneginf(ref.lse[empty]).all()
    assert torch.isfinite(lse[~empty]).all()
    tol = 1e-5 if dtype == "fp32" else 2e-2
    torch.testing.assert_close(lse.double(), ref.lse.double(), rtol=tol, atol=tol)
    torch.testing.assert_close(out.double(), ref.out.double(), rtol=tol, atol=tol)
    assert not math.isnan(float(out.double().sum()))
