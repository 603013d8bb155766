"""The soft-capped fp16 backward baseline (issue 31 item 5): a correct FA2-like kernel passes, planted soft-cap bugs
fail, and every other case's baseline is the one computed before the change, bit for bit.

The FA2-like kernel and the bugs are :mod:`tests.conformance.backward.softcap_sim`; the cases are FA2 2.8.3's
failing class on the H100 (``scripts/investigate_bwd_triage.py``'s grid: fp16, soft-cap 50, ``peaked`` data).
"""

from __future__ import annotations

import pytest
import torch

import conformance.backward.gradients as grad_mod
from attnref import Numerics, attention_varlen_backward
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.records import Status
from conformance.suites.registry import get_suite
from conformance.verdict.check import check_backend, prepare_context
from conformance.verdict.reference import case_options, reference, strict_fp32
from tests.conformance.backward.softcap_sim import SOFTCAP_BUGS, SoftcapKernelSim

REQUESTS = ((128, 128), (77, 200), (5, 64))  # the triage grid's
GRID = {
    "d64": AttentionCase(REQUESTS, 4, 2, 64, dtype="fp16", softcap=50.0, data="peaked", backward=True),
    "d128_causal": AttentionCase(
        REQUESTS, 4, 2, 128, dtype="fp16", softcap=50.0, data="peaked", causal=True, backward=True
    ),
}


@pytest.fixture(scope="module")
def contexts():
    return {name: prepare_context(case, seed=0, device="cpu") for name, case in GRID.items()}


@pytest.fixture
def old_baseline(monkeypatch):
    """The baseline as computed before the change: the tanh's argument in fp32."""
    grad_mod._CACHE.clear()
    monkeypatch.setattr(grad_mod, "softcap_arg_dtype", lambda case: None)
    yield
    grad_mod._CACHE.clear()


@pytest.mark.parametrize("name", list(GRID))
def test_fa2_like_softcapped_fp16_backward_passes(contexts, name) -> None:
    r = check_backend(contexts[name], SoftcapKernelSim())
    assert r.status is Status.PASS, r.reason
    dk = r.extra["backward"]["tensors"]["dk"]
    assert dk["mean_abs"] > 3.5 * dk["baseline_mean_abs"] / 2.5  # the kernel's tanh error is there, and passes


@pytest.mark.parametrize("name", list(GRID))
def test_fa2_like_softcapped_fp16_backward_failed_the_old_baseline(contexts, name, old_baseline) -> None:
    r = check_backend(contexts[name], SoftcapKernelSim())
    assert r.status is Status.FAIL and "backward dk: mean error" in r.reason


@pytest.mark.parametrize("bug", [cls for cls, must in SOFTCAP_BUGS.items() if must], ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", list(GRID))
def test_planted_softcap_bugs_fail_under_the_new_baseline(contexts, name, bug) -> None:
    r = check_backend(contexts[name], bug())
    assert r.status is Status.FAIL, (bug.__name__, r.reason)
    assert r.reason.startswith("backward d") and r.stats is not None and not r.stats.failed_checks


def _old_baseline_call(case: AttentionCase, inputs) -> tuple[torch.Tensor | None, ...]:
    """The baseline gradients exactly as conformance/backward/gradients.py computed them before the change."""
    fwd = reference(case, inputs)
    dt = case.torch_dtype
    with strict_fp32():
        g = attention_varlen_backward(
            inputs.q,
            inputs.k,
            inputs.v,
            inputs.dout,
            inputs.cu_seqlens_q,
            inputs.cu_seqlens_k,
            options=case_options(case),
            alibi_slopes=inputs.alibi_slopes,
            sinks=inputs.sinks,
            numerics=Numerics(dtype=torch.float32),
            operand_dtype=dt,
            out=fwd.out.to(dt).float(),
            lse=fwd.lse.float(),
        )
    return tuple(None if x is None else x.to(dt) for x in g)


def _sample() -> list[AttentionCase]:
    """``default``'s backward cases: every 6th of those under 120k scores, the first soft-capped one of either dtype
    and the smallest fp16 one without a soft-cap (none is under 120k)."""
    cases = [c for c in get_suite("default") if c.backward]
    small = [c for c in cases if c.total_q * c.total_kv * c.num_heads <= 120_000]
    capped = {c.dtype: c for c in reversed(small) if c.softcap is not None}
    fp16 = min((c for c in cases if c.dtype == "fp16" and c.softcap is None), key=lambda c: c.total_q * c.total_kv)
    return list(dict.fromkeys(small[::6] + [capped[d] for d in sorted(capped)] + [fp16]))


@pytest.mark.parametrize("case", _sample(), ids=lambda c: c.id)
def test_every_other_baseline_is_unchanged_bit_for_bit(case: AttentionCase) -> None:
    inputs = make_inputs(case, 0, "cpu")
    new = grad_mod.baseline_grads(case, inputs)
    old = _old_baseline_call(case, inputs)
    changes = case.softcap is not None and case.dtype == "fp16"
    assert (grad_mod.softcap_arg_dtype(case) is not None) == changes
    for name, n, o in zip(("dq", "dk", "dv", "dsinks"), new, old):
        if n is None or o is None:
            assert n is None and o is None, name
        elif changes and name != "dsinks" and n.numel():
            assert not torch.equal(n, o), name
        else:
            assert torch.equal(n, o), name
