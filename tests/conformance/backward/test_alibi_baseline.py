"""The ALiBi-bias backward baseline (issue 31 item 5): a backend that hands ALiBi to its kernel as a rounded additive
bias (``Backend.alibi_bias_dtype``: sdpa-cuda) is judged against a baseline with the same rounded bias.

A simulated fused SDPA kernel fed sdpa-cuda's bias (:mod:`tests.conformance.backward.alibi_sim`) passes on the two
worst of the H100's failing runs (``reports/h100-2026-11-27-bwd/``: sdpa-cuda d224, ALiBi, ``outliers``, GQA 16/2)
and fails them against the baseline with exact ALiBi, as the kernel did, with the kernel's own max errors; planted
ALiBi bugs fail under the new baseline; every other backend and case keeps the baseline it had.
"""

from __future__ import annotations

import pytest
import torch

import conformance.backward.gradients as grad_mod
from attnfast.base import Backend
from attnfast.registry import get_backend
from attnfast.sdpa import SdpaCudaBackend
from conformance.cases.case import AttentionCase
from conformance.cases.inputs import make_inputs
from conformance.records import Status
from conformance.verdict.check import check_backend, prepare_context
from tests.conformance.backward.alibi_sim import ALIBI_BUGS, SdpaBiasKernelSim

_D224 = dict(head_dim=224, alibi=True, data="outliers", backward=True, num_heads=16, num_kv_heads=2)
#: (case, seed) -> the H100 kernel's max |dQ - fp32 reference| (investigate-bwd-triage-sdpa-wide-h100.json.gz)
H100 = {
    "bf16_257x1031": ((AttentionCase(((257, 1031),), dtype="bf16", **_D224), 0), 1.9245),
    "fp16_64x2048": ((AttentionCase(((64, 2048), (3, 17)), dtype="fp16", **_D224), 0), 0.0771),
}
SMALL = {  # planted bugs: small GQA cases with ALiBi on outliers, long enough keys for the bias to round
    f"{dt}{'_causal' if causal else ''}": AttentionCase(
        ((48, 300), (30, 30)), 8, 2, 32, dtype=dt, causal=causal, alibi=True, data="outliers", backward=True
    )
    for dt in ("bf16", "fp16")
    for causal in (False, True)
}


class ExactAlibiBaselineSim(SdpaBiasKernelSim):
    """The same simulated kernel judged against the baseline with exact ALiBi (as before the change)."""

    def alibi_bias_dtype(self, case: AttentionCase) -> torch.dtype | None:
        return None


@pytest.fixture(scope="module")
def h100_contexts():
    grad_mod._CACHE.clear()
    return {name: prepare_context(case, seed=seed, device="cpu") for name, ((case, seed), _) in H100.items()}


@pytest.fixture(scope="module")
def small_contexts():
    return {name: prepare_context(case, seed=0, device="cpu") for name, case in SMALL.items()}


@pytest.mark.parametrize("name", list(H100))
def test_sdpa_kernel_fed_the_rounded_bias_passes(h100_contexts, name) -> None:
    r = check_backend(h100_contexts[name], SdpaBiasKernelSim())
    assert r.status is Status.PASS, r.reason
    assert r.extra["backward"]["baseline_alibi_dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[name[:4]]
    dq = r.extra["backward"]["tensors"]["dq"]
    assert dq["max_abs"] == pytest.approx(H100[name][1], rel=0.1)  # the H100 kernel's own error, and it passes


@pytest.mark.parametrize("name", list(H100))
def test_sdpa_kernel_fed_the_rounded_bias_failed_the_exact_alibi_baseline(h100_contexts, name) -> None:
    r = check_backend(h100_contexts[name], ExactAlibiBaselineSim())
    assert r.status is Status.FAIL and "backward dq: max error" in r.reason, r.reason
    assert "baseline_alibi_dtype" not in r.extra["backward"]


@pytest.mark.parametrize("bug", [cls for cls, must in ALIBI_BUGS.items() if must], ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", list(SMALL))
def test_planted_alibi_bugs_fail_under_the_alibi_baseline(small_contexts, name, bug) -> None:
    if bug.__name__ == "AlibiOneSidedBackend" and SMALL[name].causal:
        pytest.skip("causal: no key right of the diagonal, the one-sided ALiBi is the right one")
    r = check_backend(small_contexts[name], bug())
    assert r.status is Status.FAIL, (bug.__name__, r.reason)
    assert r.reason.startswith("backward d") and r.stats is not None and not r.stats.failed_checks


@pytest.mark.parametrize("name", list(SMALL))
def test_the_simulated_kernel_passes_the_small_cases(small_contexts, name) -> None:
    r = check_backend(small_contexts[name], SdpaBiasKernelSim())
    assert r.status is Status.PASS, r.reason


@pytest.mark.parametrize(
    "backend, dtype, want",
    [
        (SdpaCudaBackend(), "bf16", torch.bfloat16),
        (SdpaCudaBackend(), "fp16", torch.float16),
        (SdpaCudaBackend(), "fp32", None),  # an fp32 bias: not shifted, not rounded
        (SdpaCudaBackend(("EFFICIENT_ATTENTION",)), "bf16", torch.bfloat16),
        (get_backend("sdpa-cpu"), "bf16", None),  # MATH takes an fp32 bias
        (get_backend("fa2"), "bf16", None),  # ALiBi formed in the kernel from the slopes
    ],
)
def test_which_backends_round_the_alibi_bias(backend: Backend, dtype: str, want) -> None:
    case = AttentionCase(((5, 9),), 4, 2, 32, dtype=dtype, alibi=True, backward=True)
    assert backend.alibi_bias_dtype(case) == want


def test_the_alibi_baseline_only_for_alibi_cases_and_the_reference_stays_exact() -> None:
    grad_mod._CACHE.clear()
    plain_case = SMALL["bf16"].replace(alibi=False)
    inputs = make_inputs(plain_case, 0, "cpu")
    assert grad_mod.gradients(plain_case, inputs, alibi_dtype=torch.bfloat16) is grad_mod.gradients(plain_case, inputs)
    case = SMALL["bf16"]
    inputs = make_inputs(case, 0, "cpu")
    plain = grad_mod.gradients(case, inputs)
    rounded = grad_mod.gradients(case, inputs, alibi_dtype=torch.bfloat16)
    assert rounded is grad_mod.gradients(case, inputs, alibi_dtype=torch.bfloat16)  # cached
    assert all(a is b for a, b in zip(rounded.ref, plain.ref))
    for name in ("dq", "dk", "dv"):
        assert not torch.equal(getattr(rounded.base, name), getattr(plain.base, name)), name
    grad_mod._CACHE.clear()
